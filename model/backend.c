/* backend.c - the backend registry: runtime.device to a backend (see backend.h).
 * The only place outside cuda/ that knows whether CUDA was compiled in. */
#include "model/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static tw_status parse_cuda_index(const char *device, int *index, tw_error *err)
{
    *index = 0;
    if (strcmp(device, "cuda") == 0) return TW_OK;
    const char *num = device + 5; /* after "cuda:" */
    char *end = NULL;
    long v = strtol(num, &end, 10);
    if (*num == '\0' || *end != '\0' || v < 0 || v > 1024)
        return tw_error_set(err, TW_ERR_CONFIG,
                            "runtime.device: '%s' is not auto, cpu, cuda or cuda:N", device);
    *index = (int)v;
    return TW_OK;
}

#define MAX_REGISTERED 4

static struct {
    char device[16];
    tw_backend_create_fn create;
} g_registered[MAX_REGISTERED];
static int g_n_registered;

tw_status tw_backend_register(const char *device, tw_backend_create_fn create, tw_error *err)
{
    if (!device || !*device || strlen(device) >= sizeof g_registered[0].device || !create)
        return tw_error_set(err, TW_ERR_INTERNAL, "backend registration: bad device name");
    if (g_n_registered == MAX_REGISTERED)
        return tw_error_set(err, TW_ERR_INTERNAL, "backend registration: at most %d backends",
                            MAX_REGISTERED);
    snprintf(g_registered[g_n_registered].device, sizeof g_registered[0].device, "%s", device);
    g_registered[g_n_registered++].create = create;
    return TW_OK;
}

tw_backend_params tw_backend_default_params(void)
{
    return (tw_backend_params){.threads = 0,
                               .cpu_winograd = TW_CPU_WINOGRAD_AUTO,
                               .cpu_gemm = -1,
                               .cpu_nhwc = -1,
                               .cuda_fail_above = 0,
                               .log = NULL};
}

tw_status tw_backend_create(const char *device, int threads, bool quiet, tw_backend *out,
                            tw_error *err)
{
    (void)quiet; /* no log: nothing is said either way */
    tw_backend_params p = tw_backend_default_params();
    p.threads = threads;
    return tw_backend_create_ex(device, &p, out, err);
}

tw_status tw_backend_create_ex(const char *device, const tw_backend_params *params, tw_backend *out,
                               tw_error *err)
{
    memset(out, 0, sizeof *out);
    for (int i = 0; i < g_n_registered; i++)
        if (strcmp(device, g_registered[i].device) == 0)
            return g_registered[i].create(params, out, err);
    if (strcmp(device, "cpu") == 0) return tw_cpu_backend_create(params, out, err);
    if (strcmp(device, "auto") == 0) {
#ifdef TW_WITH_CUDA
        if (tw_cuda_device_count() > 0) return tw_cuda_backend_create(0, params, out, err);
        tw_log_printf(params->log, TW_LOG_NOTICE, "no CUDA device found; running on the CPU");
#else
        tw_log_printf(params->log, TW_LOG_NOTICE,
                      "built without the CUDA backend; running on the CPU");
#endif
        return tw_cpu_backend_create(params, out, err);
    }
    if (strcmp(device, "cuda") == 0 || strncmp(device, "cuda:", 5) == 0) {
        int index;
        tw_status st = parse_cuda_index(device, &index, err);
        if (st != TW_OK) return st;
#ifdef TW_WITH_CUDA
        int count = tw_cuda_device_count();
        if (count <= 0)
            return tw_error_set(err, TW_ERR_DEVICE,
                                "runtime.device %s: no CUDA device is available on this machine "
                                "(use device: auto or cpu)",
                                device);
        if (index >= count)
            return tw_error_set(err, TW_ERR_DEVICE,
                                "runtime.device %s: this machine has %d CUDA device%s (cuda:0..%d)",
                                device, count, count == 1 ? "" : "s", count - 1);
        return tw_cuda_backend_create(index, params, out, err);
#else
        return tw_error_set(err, TW_ERR_DEVICE,
                            "runtime.device %s: this tilewise was built without the CUDA backend",
                            device);
#endif
    }
    return tw_error_set(err, TW_ERR_CONFIG, "runtime.device: '%s' is not auto, cpu, cuda or cuda:N",
                        device);
}

/* What one reserve tries: a classifier's or a segmentation model's. */
typedef struct reserve_try {
    tw_resnet *net;       /* a classifier (reserve), or */
    const tw_segnet *seg; /* a segmentation model (seg_reserve) */
    tw_precision prec;
    bool consume;
} reserve_try;

/* The backend's reserve for *max_batch tiles, halving the batch after each
 * TW_ERR_NOMEM down to 1 (the halvings silent; a lowered batch one notice),
 * then b's reservation recorded with precision runs. */
static tw_status reserve_halving(tw_backend *b, const reserve_try *t, int tile, int *max_batch,
                                 tw_precision runs, const tw_log *log, tw_error *err)
{
    int batch = *max_batch;
    for (;;) {
        tw_error local;
        tw_error_init(&local);
        tw_status st =
            t->seg ? b->i->seg_reserve(b->ctx, t->seg, tile, batch, &local)
                   : b->i->reserve(b->ctx, t->net, tile, batch, t->prec, t->consume, &local);
        if (st == TW_OK) break;
        if (st != TW_ERR_NOMEM || batch == 1) {
            /* only now record what went wrong (the halvings stay silent) */
            return tw_error_set(err, local.set ? local.status : st, "%s",
                                local.set ? local.msg : "reserve failed");
        }
        batch /= 2;
        b->batch_halvings++;
    }
    if (batch != *max_batch)
        tw_log_printf(log, TW_LOG_NOTICE,
                      "%s backend: batch lowered from %d to %d tiles (they did not fit in memory)",
                      b->i->name, *max_batch, batch);
    *max_batch = batch;
    b->reserved = true;
    b->tile = tile;
    b->max_batch = batch;
    b->precision = runs;
    return TW_OK;
}

tw_status tw_backend_reserve(tw_backend *b, tw_resnet *net, int tile, int *max_batch,
                             tw_precision prec, bool consume, const tw_log *log, tw_error *err)
{
    b->reserved = false;
    if (tile < 1 || *max_batch < 1)
        return tw_error_set(err, TW_ERR_INTERNAL, "%s backend: reserve for %d tiles of %d px",
                            b->i->name, *max_batch, tile);
    char why[512] = "";
    tw_precision runs = prec;
    if (!b->i->supports(b->ctx, net, tile, prec, &runs, why, sizeof why))
        return tw_error_set(err, TW_ERR_CONFIG, "runtime.precision %s: the %s backend %s",
                            tw_precision_name(prec), b->i->name, why);
    if (runs != prec)
        tw_log_printf(log, TW_LOG_NOTICE, "runtime.precision %s: %s; computing in %s",
                      tw_precision_name(prec), why, tw_precision_name(runs));
    reserve_try t = {.net = net, .prec = runs, .consume = consume};
    return reserve_halving(b, &t, tile, max_batch, runs, log, err);
}

bool tw_backend_segments(const tw_backend *b)
{
    return b->i->seg_reserve && b->i->seg_workspace_bytes;
}

bool tw_backend_device_segments(const char *device)
{
    for (int i = 0; i < g_n_registered; i++)
        if (strcmp(device, g_registered[i].device) == 0) return true; /* created, then asked */
    return strcmp(device, "cuda") != 0 && strncmp(device, "cuda:", 5) != 0;
}

tw_status tw_backend_reserve_seg(tw_backend *b, const tw_segnet *net, int tile, int *max_batch,
                                 tw_precision prec, const tw_log *log, tw_error *err)
{
    b->reserved = false;
    if (!tw_backend_segments(b))
        return tw_error_set(err, TW_ERR_CONFIG,
                            "runtime.device: the %s backend runs no segmentation model yet (%s); "
                            "use runtime.device: cpu",
                            b->i->name, net->arch);
    if (tile < 1 || *max_batch < 1)
        return tw_error_set(err, TW_ERR_INTERNAL, "%s backend: reserve for %d tiles of %d px",
                            b->i->name, *max_batch, tile);
    if (prec != TW_PREC_FP32)
        tw_log_printf(log, TW_LOG_NOTICE,
                      "runtime.precision %s: segmentation models run in fp32 on the %s backend; "
                      "computing in fp32",
                      tw_precision_name(prec), b->i->name);
    reserve_try t = {.seg = net, .prec = TW_PREC_FP32};
    return reserve_halving(b, &t, tile, max_batch, TW_PREC_FP32, log, err);
}

static tw_status check_batch(const tw_backend *b, const tw_infer_batch *x, tw_error *err)
{
    if (!b->reserved)
        return tw_error_set(err, TW_ERR_INTERNAL, "%s backend: infer before reserve", b->i->name);
    bool has_input = b->i->wants_raw(b->ctx) ? (x->raw || x->x) : x->x != NULL;
    if (x->n < 1 || x->n > b->max_batch || x->tile != b->tile || !has_input || !x->probs)
        return tw_error_set(err, TW_ERR_INTERNAL,
                            "%s backend: a batch of %d tiles of %d px%s does not fit the reserved "
                            "%d tiles of %d px",
                            b->i->name, x->n, x->tile,
                            !has_input || !x->probs ? " without its buffers" : "", b->max_batch,
                            b->tile);
    return TW_OK;
}

tw_status tw_backend_infer(tw_backend *b, const tw_infer_batch *batch, tw_error *err)
{
    tw_status st = check_batch(b, batch, err);
    return st != TW_OK ? st : b->i->infer(b->ctx, batch, err);
}

void tw_backend_get_stats(const tw_backend *b, tw_backend_stats *out)
{
    memset(out, 0, sizeof *out);
    if (b->i->get_stats) b->i->get_stats(b->ctx, out);
    out->batch_halvings = b->batch_halvings;
}

bool tw_backend_overlaps(const tw_backend *b)
{
    return b->i->infer_begin && b->i->infer_end;
}

tw_status tw_backend_infer_begin(tw_backend *b, const tw_infer_batch *batch, int lane,
                                 tw_error *err)
{
    tw_status st = check_batch(b, batch, err);
    if (st != TW_OK) return st;
    return tw_backend_overlaps(b) ? b->i->infer_begin(b->ctx, batch, lane, err)
                                  : b->i->infer(b->ctx, batch, err);
}

tw_status tw_backend_infer_end(tw_backend *b, const tw_infer_batch *batch, int lane, tw_error *err)
{
    return tw_backend_overlaps(b) ? b->i->infer_end(b->ctx, batch, lane, err) : TW_OK;
}

void tw_backend_destroy(tw_backend *b)
{
    if (!b || !b->i) return;
    b->i->destroy(b->ctx);
    b->i = NULL;
    b->ctx = NULL;
}
