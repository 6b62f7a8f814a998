/* cpu_backend.c - the CPU backend: the folded ResNet on oneDNN (v2.x C API).
 * This file: the vtable (model/backend.h), the precision and instruction
 * set policy, create and destroy. The parts, one job each:
 *   model/cpu_plan.c    the plan: the net as oneDNN primitive descriptors,
 *                       sized without allocating
 *   model/cpu_lower.c   the GEMM and Winograd lowerings of fp32 convs and
 *                       the check that keeps them (rows_independent)
 *   model/cpu_build.c   the built plan: buffers, primitives, weights
 *                       reordered once; running the ops on a batch
 *   model/cpu_int8.c    int8: quantization scales and calibration
 *   model/cpu_internal.h  what they share (types, storage ids, memory)
 *
 * Batches smaller than max_batch run on the full max_batch primitives (at
 * least CPU_MIN_PLAN_BATCH tiles: see plan_batch): the
 * first n input tiles are copied into the backend's own input buffer and the
 * rest of it keeps older (finite) data whose results are ignored. Only the
 * last batch of a run is short, so the wasted work is at most one batch, and
 * one set of primitives keeps reserve() and the memory estimate simple.
 * A full batch is read in place from the caller's buffer (no copy).
 *
 * The classifier (fc) and softmax are a few thousand multiply-adds per tile
 * and run in plain C, in double, after the pooled features come back.
 *
 * Precision (runtime.precision): fp32 (tf32 means fp32 on a CPU);
 *  - bf16: activations and weights in bf16, accumulation and bias in fp32.
 *    oneDNN 2.6 has bf16 convolutions only on AVX-512 CPUs (fastest with
 *    AVX512-BF16); elsewhere the plan cannot be built and the run goes on in
 *    fp32 with one notice.
 *  - int8: see model/cpu_int8.c.
 *  - fp16 runs in fp32 with one notice (no fp16 convolutions in oneDNN 2.6).
 *
 * One backend serves one thread at a time (the pipeline's infer stage).
 */
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include <dnnl.h>

#include "model/calib.h"
#include "model/cpu_internal.h"
#include "core/alloc.h"
#include "core/clock.h"

static void set_threads(const cpu_ctx *c)
{
    /* an OpenMP setting belongs to the calling thread, and the pipeline
     * calls from its own worker thread: set it on every entry */
    if (c->threads > 0) omp_set_num_threads(c->threads);
}

static num_mode wanted_mode(tw_precision prec)
{
    return prec == TW_PREC_BF16 ? NUM_BF16 : prec == TW_PREC_INT8 ? NUM_INT8 : NUM_F32;
}

static const char *mode_name(num_mode m)
{
    return m == NUM_BF16 ? "bf16" : m == NUM_INT8 ? "int8" : "fp32";
}

/* Can oneDNN run this net in mode on this CPU? (It answers "unimplemented"
 * to a bf16 convolution without AVX-512, for instance.) */
static bool mode_supported(cpu_ctx *c, const tw_resnet *net, int tile, num_mode mode)
{
    if (mode == NUM_F32) return true;
    probe *pr = &c->probes[mode];
    if (pr->net != net || pr->tile != tile) {
        /* one batch-1 plan answers; the budget's bisection and reserve ask again */
        plan p;
        tw_error_init(&pr->why);
        pr->ok = cpu_plan_build(&p, c, net, tile, 1, mode, NULL, &pr->why) == TW_OK;
        cpu_plan_free(&p);
        pr->net = net;
        pr->tile = tile;
    }
    return pr->ok;
}

/* The fewest tiles a plan is built for. oneDNN 2.6's AVX-512 Winograd
 * kernel sums a tile's convolutions in another order in batches of 1 and 2
 * than in batches of 3 to 512 (measured at 64 and 224 px), and a tile must
 * get the same bits whatever batch the budget picks (tiling.batch and
 * runtime.memory change no output byte, core/keys.c). Smaller batches run
 * on these primitives as a short last batch does. */
enum { CPU_MIN_PLAN_BATCH = 4 };

static int plan_batch(int batch)
{
    if (batch < CPU_MIN_PLAN_BATCH) batch = CPU_MIN_PLAN_BATCH;
    /* whole groups of oneDNN's Winograd convs (cpu_internal.h) */
    return (batch + CPU_WINO_GROUP - 1) / CPU_WINO_GROUP * CPU_WINO_GROUP;
}

static size_t mode_bytes(cpu_ctx *c, const tw_resnet *net, int tile, int max_batch, num_mode mode)
{
    plan p;
    tw_error err;
    tw_error_init(&err);
    size_t bytes;
    if (cpu_plan_build(&p, c, net, tile, max_batch, mode, NULL, &err) == TW_OK) {
        bytes = cpu_plan_bytes(&p, net);
    } else {
        /* reserve() will report the real problem; until then assume the
         * weights plus five copies of the stem output per tile */
        int h = tw_resnet_out_size(tile, net->stem.k, net->stem.stride, net->stem.pad);
        bytes = net->weight_bytes +
                5 * (size_t)max_batch * (size_t)net->stem.cout * h * h * 4 * sizeof(float);
    }
    cpu_plan_free(&p);
    return bytes;
}

static size_t cpu_workspace_bytes(void *ctx, const tw_resnet *net, int tile, int max_batch,
                                  tw_precision prec)
{
    cpu_ctx *c = ctx;
    set_threads(c);
    num_mode mode = wanted_mode(prec);
    /* int8 calibrates with the fp32 plan, frees it, then builds the int8
     * one: a quarter of its buffers and weights plus an fp32 copy of the
     * last activation (which the fp32 plan holds too), so the fp32 plan is
     * the peak */
    size_t sample = 0;
    if (mode == NUM_INT8) {
        /* and the calibration sample beside it (pipeline/engine/stages.c): its
         * TW_CALIB_TILES tiles as floats and raw (4 bytes a value at most
         * counted: 64-bit rasters exceed it), their masks, the histograms */
        size_t px = (size_t)tile * tile;
        sample = TW_CALIB_TILES * (px * net->in_bands * (4 + 4) + px) +
                 (size_t)(net->n_blocks * 4 + 2) * TW_CALIB_BINS * sizeof(double);
    }
    if (mode == NUM_INT8 || !mode_supported(c, net, tile, mode)) mode = NUM_F32;
    return mode_bytes(c, net, tile, plan_batch(max_batch), mode) + sample;
}

static bool cpu_consumes_weights(void *ctx, tw_precision prec)
{
    (void)ctx;
    return wanted_mode(prec) != NUM_INT8; /* int8 quantizes them again per raster */
}

/* Whether oneDNN's bf16 convolutions would run slower than fp32 here (then
 * bf16 falls back to fp32 with a notice saying why). Measured, ResNet-18 on
 * 64-px tiles, bench/RESULTS.md (issue 20): without AVX512-BF16 oneDNN
 * emulates it, 4.4x slower than fp32; with AVX512-BF16 but no AMX, Intel
 * Xeons ran it at 0.52-0.80x fp32's rate (AMD Zen 4 at 1.8-2x: it keeps
 * bf16); with AMX it is 1.5x faster. ONEDNN_MAX_CPU_ISA counts (oneDNN's
 * effective ISA). */
static const char *isa_name(dnnl_cpu_isa_t isa);

static bool bf16_slower(char *why, size_t why_size)
{
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    bool has = (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
    bool amx = (isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx;
    if ((isa & dnnl_cpu_isa_avx512_core) != dnnl_cpu_isa_avx512_core) {
        snprintf(why, why_size,
                 "oneDNN 2.6 has bf16 convolutions for AVX-512 CPUs only (this one: %s)",
                 isa_name(isa));
        return true;
    }
    if (!has) {
        snprintf(why, why_size,
                 "bf16 would run about 4x slower than fp32 on this CPU (no AVX512-BF16 "
                 "instructions: oneDNN emulates them)");
        return true;
    }
    __builtin_cpu_init();
    if (!amx && __builtin_cpu_is("intel")) {
        snprintf(why, why_size,
                 "bf16 would run slower than fp32 on this CPU (an Intel CPU with AVX512-BF16 "
                 "but no AMX: measured 0.5-0.8x fp32's speed)");
        return true;
    }
    return false;
}

static bool cpu_supports(void *ctx, const tw_resnet *net, int tile, tw_precision want,
                         tw_precision *runs_as, char *why, size_t why_size)
{
    cpu_ctx *c = ctx;
    set_threads(c);
    *runs_as = want;
    if (want == TW_PREC_TF32) {
        *runs_as = TW_PREC_FP32; /* fp32 is what tf32 rounds from: no notice */
        return true;
    }
    if (want == TW_PREC_FP16) {
        *runs_as = TW_PREC_FP32;
        snprintf(why, why_size, "the CPU backend has no fp16 convolutions");
        return true;
    }
    num_mode mode = wanted_mode(want);
    if (mode == NUM_BF16 && bf16_slower(why, why_size)) {
        *runs_as = TW_PREC_FP32;
        return true;
    }
    if (!mode_supported(c, net, tile, mode)) {
        *runs_as = TW_PREC_FP32;
        snprintf(why, why_size, "%s convolutions are not available on this CPU (%s)",
                 mode_name(mode), c->probes[mode].why.msg);
    }
    return true;
}

static tw_status cpu_reserve(void *ctx, tw_resnet *net, int tile, int batch, tw_precision prec,
                             bool consume, tw_error *err)
{
    cpu_ctx *c = ctx;
    cpu_release(c);
    c->int8 = c->calibrate = false;
    set_threads(c);
    num_mode mode = wanted_mode(prec);
    /* int8 starts in fp32: cpu_int8_calibrate() measures the activation ranges with
     * it, then quantizes the net's weights (for every raster): it keeps them */
    tw_resnet *consumed = consume && cpu_consumes_weights(c, prec) ? net : NULL;
    batch = plan_batch(batch);
    tw_status st =
        cpu_build_mode(c, net, consumed, tile, batch, mode == NUM_INT8 ? NUM_F32 : mode, NULL, err);
    if (st != TW_OK) return st;
    c->int8 = c->calibrate = mode == NUM_INT8;
    c->net = net;
    c->max_batch = batch;
    c->tile = tile;
    c->in_bands = net->in_bands;
    c->feat_dim = net->feat_dim;
    c->n_classes = net->n_classes;
    snprintf(c->stats.algorithms, sizeof c->stats.algorithms,
             "%d of %d convolutions Winograd F(4,3)%s, %d one inner product (GEMM), the rest "
             "oneDNN's direct kernels%s; %d lowerings refused (tile place-dependent)",
             c->stats.winograd_convs, c->n_conv,
             c->stats.winograd_convs == 0 ? ""
             : c->wino                    ? " (oneDNN's kernel)"
                                          : " (model/winograd.c around a oneDNN matmul)",
             c->stats.gemm_convs, c->mode == NUM_F32 && !c->wino && c->nhwc ? " (nhwc)" : "",
             c->n_refused);
    c->stats.precision = mode == NUM_BF16   ? TW_PREC_BF16
                         : mode == NUM_INT8 ? TW_PREC_INT8
                                            : TW_PREC_FP32;
    c->stats.int8_weight_bits = mode != NUM_INT8 ? 0 : c->int8_levels == 127 ? 8 : 7;
    return TW_OK;
}

static tw_status cpu_calibrate(void *ctx, const tw_infer_batch *b, const char *path, tw_error *err)
{
    cpu_ctx *c = ctx;
    if (!c->reserved || !c->int8) return TW_OK; /* not asked, or fell back to fp32 */
    if (b->n < 1 || b->tile != c->tile || !b->x)
        return tw_error_set(err, TW_ERR_INTERNAL, "CPU backend: calibration batch of %d tiles",
                            b->n);
    (void)path;
    set_threads(c);
    return cpu_int8_calibrate(c, b, err);
}

/* -- segmentation models (seg_cpu.h: one tile at a time, fp32) -- */

/* oneDNN's scratchpad for the largest convolution, which the estimate
 * cannot know before the primitives exist: measured at most 3 MiB for
 * U-Net-ResNet34 and DeepLabV3-ResNet50 at 512 px (tw_seg_cpu_bytes less
 * the arena and the weights); counted generously. */
#define CPU_SEG_SCRATCH ((size_t)8 << 20)
/* What each op's primitive holds outside tw_alloc (its JIT-compiled kernel
 * and descriptors): a segmentation net has one per op, twice a ResNet's
 * convolutions, which the budget's margin was measured on. The demo U-Net
 * peaked 1.4-2.1 MiB above the budget's worst case without it
 * (bench/seg_memory.sh). */
#define CPU_SEG_PER_OP ((size_t)128 << 10)

static size_t cpu_seg_workspace_bytes(void *ctx, const tw_segnet *net, int tile, int max_batch)
{
    (void)ctx;
    (void)max_batch; /* tiles run one at a time through one arena */
    size_t arena = 0, all = 0;
    tw_error e;
    tw_error_init(&e);
    if (tw_seg_cpu_batch_bytes(net, tile, 1, &all, &arena, &e) != TW_OK) return SIZE_MAX / 4;
    return arena + net->weight_bytes + CPU_SEG_SCRATCH + (size_t)net->n_ops * CPU_SEG_PER_OP;
}

static tw_status cpu_seg_reserve(void *ctx, const tw_segnet *net, int tile, int batch,
                                 tw_error *err)
{
    cpu_ctx *c = ctx;
    cpu_release(c);
    set_threads(c);
    tw_status st = tw_seg_cpu_create(net, tile, &c->seg, err);
    if (st != TW_OK) return st;
    c->max_batch = batch;
    c->tile = tile;
    c->in_bands = net->in_bands;
    c->n_classes = net->n_classes;
    c->feat_dim = 0;
    c->int8 = c->calibrate = false;
    c->stats.precision = TW_PREC_FP32;
    c->stats.winograd_convs = c->stats.gemm_convs = 0;
    int concat, residual;
    tw_seg_cpu_copies(c->seg, &concat, &residual);
    snprintf(c->stats.algorithms, sizeof c->stats.algorithms,
             "%s: oneDNN's direct kernels, one tile at a time; %d concatenation inputs and %d "
             "shortcuts copied per tile",
             net->arch, concat, residual);
    c->reserved = true;
    return TW_OK;
}

static tw_status cpu_infer(void *ctx, const tw_infer_batch *b, tw_error *err)
{
    cpu_ctx *c = ctx; /* tw_backend_infer checked b against the reservation */
    double t0 = tw_clock_now();
    set_threads(c);
    if (c->seg) {
        tw_status st = tw_seg_cpu_run(c->seg, b->x, b->n, b->probs, err);
        c->stats.compute_s += tw_clock_now() - t0;
        return st;
    }
    tw_status st = c->calibrate ? cpu_int8_calibrate(c, b, err) : TW_OK;
    if (st == TW_OK) st = cpu_run_ops(c, b, NULL, err);
    if (st != TW_OK) return st;

    const float *feat = c->buf[BUF_FEAT];
    int fd = c->feat_dim, k = c->n_classes;
    if (b->emb) memcpy(b->emb, feat, (size_t)b->n * fd * sizeof(float));
    tw_resnet_head(c->fc_w, c->fc_b, k, fd, feat, b->n, b->probs);
    c->stats.compute_s += tw_clock_now() - t0;
    return TW_OK;
}

/* The smallest power of two (even splits over the threads) that gives the
 * last stage, whose maps are tile/32 wide, at least 128 pixels per
 * convolution: below that its GEMMs are too thin, above it a bigger batch
 * only costs memory (activations, slots). 32 tiles of 64 px, 4 of 224 px,
 * at most 64. Measured with 2 threads (bench/RESULTS.md): ResNet-18 and -50
 * on 64-px tiles as fast in batches of 32 as of 64 (40 MiB less peak RSS
 * for ResNet-50), ~10 % slower in 16; ResNet-50 on 224-px tiles as fast in
 * batches of 4 to 8 as of 32, or faster, for 300 MiB less. */
enum { CPU_LAST_STAGE_PIXELS = 128, CPU_MAX_BATCH = 64 };

static int cpu_auto_batch(void *ctx, const tw_resnet *net, int tile)
{
    const cpu_ctx *c = ctx;
    /* (after a small stem the last stage is tile/8 wide, not tile/32; the
     * rule is kept: ResNet-18 small stem at 32 px ran 1.9-4.3x faster in
     * batches of 32-64 than in the 8 the last stage's 128 pixels would give,
     * bench/RESULTS.md, issue 31; the budget lowers it where it must) */
    long side = (tile + 31) / 32, b = 1;
    /* Without oneDNN's AVX-512 kernels (the nhwc plans, model/winograd.c)
     * the last stage's 3x3 convs on maps of 2x2 or less are one GEMM with
     * a row per tile (LOWER_DENSE), too thin at 32 rows: batches of 64 ran
     * ResNet-18 12 % faster at 64 px (AVX2, 2 threads, bench/RESULTS.md)
     * for 15 MiB more workspace. ResNet-50 ran 10 % faster end to end (296
     * vs 268 tiles/s) but its peak RSS went from 257 to 322 MiB, over half
     * the PyTorch loop's (issue 5): it keeps 32 (tiling.batch: 64 for speed). */
    if (c->wino_own && c->nhwc && side <= 2 && !(net && net->bottleneck)) return CPU_MAX_BATCH;
    while (b < CPU_MAX_BATCH && b * side * side < CPU_LAST_STAGE_PIXELS) b *= 2;
    return (int)b;
}

static bool cpu_wants_raw(void *ctx)
{
    (void)ctx;
    return false;
}

static void *cpu_host_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    (void)bytes;
    return NULL;
}

static void cpu_host_free(void *ctx, void *p)
{
    (void)ctx;
    (void)p;
}

static void cpu_get_stats(void *ctx, tw_backend_stats *out)
{
    *out = ((cpu_ctx *)ctx)->stats;
}

static void cpu_destroy(void *ctx)
{
    cpu_ctx *c = ctx;
    if (!c) return;
    cpu_release(c);
    if (c->stream) dnnl_stream_destroy(c->stream);
    if (c->eng) dnnl_engine_destroy(c->eng);
    tw_free(c);
}

static const struct tw_backend_i k_cpu_iface = {
    .name = "cpu",
    .workspace_bytes = cpu_workspace_bytes,
    .supports = cpu_supports,
    .reserve = cpu_reserve,
    .calibrate = cpu_calibrate,
    .infer = cpu_infer,
    .auto_batch = cpu_auto_batch,
    .consumes_weights = cpu_consumes_weights,
    .wants_raw = cpu_wants_raw,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .get_stats = cpu_get_stats,
    .destroy = cpu_destroy,
    .seg_workspace_bytes = cpu_seg_workspace_bytes,
    .seg_reserve = cpu_seg_reserve,
};

static const char *isa_name(dnnl_cpu_isa_t isa)
{
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
    }
}

/* Whether fp32 plans use Winograd: oneDNN 2.6 has it for AVX-512 CPUs
 * only, where it runs ResNet's 3x3 convolutions 1.4-2.6x faster than its
 * direct kernels (bench/RESULTS.md); params.cpu_winograd false (the CLI's
 * TILEWISE_CPU_WINOGRAD=0) turns it off (exactly PyTorch's arithmetic order
 * is not kept either way; Winograd's transforms add a rounding error of
 * about 1e-6 relative). */
static bool use_winograd(dnnl_engine_t eng)
{
    dnnl_memory_desc_t x, w;
    dnnl_dims_t xd = {1, 16, 8, 8}, wd = {16, 16, 3, 3}, one = {1, 1};
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t pd;
    if (dnnl_memory_desc_init_by_tag(&x, 4, xd, dnnl_f32, dnnl_aBcd16b) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&w, 4, wd, dnnl_f32, dnnl_format_tag_any) != dnnl_success ||
        dnnl_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_winograd,
                                           &x, &w, NULL, &x, one, one, one) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &cd, NULL, eng, NULL) != dnnl_success)
        return false;
    dnnl_primitive_desc_destroy(pd);
    return true;
}

tw_status tw_cpu_backend_create(const tw_backend_params *params, tw_backend *out, tw_error *err)
{
    out->i = NULL;
    out->ctx = NULL;
    cpu_ctx *c = tw_calloc(TW_MEM_OTHER, 1, sizeof *c);
    if (!c) return tw_error_set(err, TW_ERR_NOMEM, "out of memory creating the CPU backend");
    c->threads = params->threads > 0 ? params->threads : 0;
    dnnl_status_t s = dnnl_engine_create(&c->eng, dnnl_cpu, 0);
    if (s == dnnl_success) s = dnnl_stream_create(&c->stream, c->eng, dnnl_stream_default_flags);
    if (s != dnnl_success) {
        cpu_destroy(c);
        return dnnl_fail(err, s, "CPU engine/stream create");
    }
    c->wino = params->cpu_winograd == TW_CPU_WINOGRAD_AUTO && use_winograd(c->eng);
    c->wino_own = params->cpu_winograd == TW_CPU_WINOGRAD_OWN ||
                  (params->cpu_winograd == TW_CPU_WINOGRAD_AUTO && !c->wino);
    /* nhwc where oneDNN has no AVX-512 kernels: its AVX2 kernels run it as
     * fast as nChw8c, and it lets the last stage's 1x1 convs run as GEMMs
     * (LOWER_ROWS; bench/RESULTS.md, issue 20) */
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    bool avx512 = (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
    c->nhwc = params->cpu_nhwc > 0 || (params->cpu_nhwc < 0 && !avx512);
    c->gemm = params->cpu_gemm < 0 ? -1 : params->cpu_gemm > 0 ? 1 : 0;
    c->int8_levels = cpu_int8_weight_levels(isa);
    const dnnl_version_t *v = dnnl_version();
    snprintf(c->stats.library, sizeof c->stats.library, "oneDNN %d.%d.%d", v->major, v->minor,
             v->patch);
    snprintf(c->stats.device, sizeof c->stats.device, "CPU, oneDNN instruction set %s",
             isa_name(isa));
    out->i = &k_cpu_iface;
    out->ctx = c;
    return TW_OK;
}
