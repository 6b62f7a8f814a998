/* feed_rate.c - how fast the read stage feeds a backend, against GDAL's own
 * strip reads of the same file (bench/feed_rate runs it; see there).
 *
 *   feed_rate gdal FILE TILE
 *       GDAL alone: the file read in strips of TILE full-width rows, all
 *       bands, one GDALDatasetRasterIO call per strip (no tiles cut).
 *   feed_rate pipe FILE TILE READERS MODEL OUTDIR
 *       tw_run on FILE (tile = stride = TILE, products [class]) with a
 *       backend that consumes each batch without computing (it only writes
 *       uniform probabilities), so the pipeline runs as fast as it is fed.
 *
 * Each prints one JSON line: tile bytes (tiles x TILE^2 x bands x sample
 * size), wall seconds, and for pipe the read stage's busy and wait seconds
 * summed over its workers.
 */
#include <gdal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/backend.h"
#include "core/alloc.h"
#include "pipeline/run/run.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- a backend that does not compute ---- */

typedef struct null_ctx {
    int n_classes;
    int batches;
} null_ctx;

static size_t null_workspace(void *ctx, const tw_resnet *net, int tile, int max_batch,
                             tw_precision prec)
{
    (void)ctx, (void)net, (void)tile, (void)max_batch, (void)prec;
    return 0;
}
static int null_auto_batch(void *ctx, const tw_resnet *net, int tile)
{
    (void)ctx;
    (void)net;
    return tile >= 128 ? 256 : 1024; /* the CUDA backend's batches in the GPU benchmarks */
}
static bool null_supports(void *ctx, const tw_resnet *net, int tile, tw_precision want,
                          tw_precision *runs_as, char *why, size_t why_size)
{
    (void)ctx, (void)net, (void)tile, (void)why, (void)why_size;
    *runs_as = want;
    return true;
}
static tw_status null_reserve(void *vctx, tw_resnet *net, int tile, int batch, tw_precision prec,
                              bool consume, tw_error *err)
{
    (void)tile, (void)batch, (void)prec, (void)consume, (void)err;
    ((null_ctx *)vctx)->n_classes = net->n_classes;
    return TW_OK;
}
static bool null_consumes(void *ctx, tw_precision prec)
{
    (void)ctx, (void)prec;
    return false;
}
static tw_status null_infer(void *vctx, const tw_infer_batch *b, tw_error *err)
{
    (void)err;
    null_ctx *ctx = vctx;
    float p = 1.0f / (float)ctx->n_classes;
    for (size_t i = 0; i < (size_t)b->n * (size_t)ctx->n_classes; i++) b->probs[i] = p;
    ctx->batches++;
    return TW_OK;
}
static bool null_wants_raw(void *ctx)
{
    (void)ctx;
    return true; /* as a GPU backend: raw pixels in, no host normalization */
}
static void null_stats(void *ctx, tw_backend_stats *out)
{
    (void)ctx;
    memset(out, 0, sizeof *out);
}
static void null_destroy(void *ctx)
{
    free(ctx);
}

static const struct tw_backend_i null_iface = {
    .name = "null",
    .workspace_bytes = null_workspace,
    .auto_batch = null_auto_batch,
    .supports = null_supports,
    .reserve = null_reserve,
    .consumes_weights = null_consumes,
    .calibrate = NULL,
    .infer = null_infer,
    .wants_raw = null_wants_raw,
    .host_alloc = NULL,
    .host_free = NULL,
    .get_stats = null_stats,
    .destroy = null_destroy,
};

static tw_status null_create(const tw_backend_params *params, tw_backend *out, tw_error *err)
{
    (void)params;
    null_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    out->i = &null_iface;
    out->ctx = ctx;
    return TW_OK;
}

/* ---- GDAL's strip reads ---- */

static int run_gdal(const char *path, int tile)
{
    GDALAllRegister();
    GDALDatasetH ds = GDALOpen(path, GA_ReadOnly);
    if (!ds) {
        fprintf(stderr, "%s: cannot open\n", path);
        return 1;
    }
    int w = GDALGetRasterXSize(ds), h = GDALGetRasterYSize(ds), nb = GDALGetRasterCount(ds);
    GDALDataType t = GDALGetRasterDataType(GDALGetRasterBand(ds, 1));
    size_t esz = (size_t)GDALGetDataTypeSizeBytes(t);
    size_t bytes = (size_t)w * tile * nb * esz;
    void *buf = malloc(bytes);
    double t0 = now_s(), c0 = thread_cpu_s();
    long long total = 0;
    for (int y = 0; y < h; y += tile) {
        int rows = y + tile <= h ? tile : h - y;
        if (GDALDatasetRasterIO(ds, GF_Read, 0, y, w, rows, buf, w, rows, t, nb, NULL, 0, 0, 0) !=
            CE_None) {
            fprintf(stderr, "%s: read failed at row %d\n", path, y);
            return 1;
        }
        total += (long long)w * rows * nb * (long long)esz;
    }
    double wall = now_s() - t0, cpu = thread_cpu_s() - c0;
    printf("{\"bytes\": %lld, \"wall_s\": %.6f, \"cpu_s\": %.6f}\n", total, wall, cpu);
    free(buf);
    GDALClose(ds);
    return 0;
}

/* ---- the pipeline ---- */

static int run_pipe(const char *path, int tile, int readers, const char *model, const char *out)
{
    tw_error err;
    tw_error_init(&err);
    if (tw_backend_register("null", null_create, &err) != TW_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    tw_run_params p = tw_run_default_params();
    snprintf(p.input.paths[0], sizeof p.input.paths[0], "%s", path);
    p.input.n_paths = 1;
    snprintf(p.model.weights, sizeof p.model.weights, "%s", model);
    p.tiling.tile = tile;
    p.tiling.stride = tile;
    snprintf(p.runtime.device, sizeof p.runtime.device, "null");
    p.runtime.readers = readers;
    p.runtime.memory = (size_t)4 << 30;
    snprintf(p.output.dir, sizeof p.output.dir, "%s", out);
    p.output.products = TW_PRODUCT_CLASS;
    p.quiet = true;
    tw_run_result *r = NULL;
    tw_status st = tw_run(&p, NULL, &r, &err);
    if (st != TW_OK) {
        fprintf(stderr, "tw_run: %s\n", err.msg);
        tw_run_result_destroy(r);
        return 1;
    }
    const tw_input_result *in = &r->inputs[0];
    GDALDatasetH ds = GDALOpen(path, GA_ReadOnly);
    int nb = GDALGetRasterCount(ds);
    size_t esz = (size_t)GDALGetDataTypeSizeBytes(GDALGetRasterDataType(GDALGetRasterBand(ds, 1)));
    GDALClose(ds);
    long long tile_bytes = (long long)in->tiles_total * tile * tile * nb * (long long)esz;
    printf("{\"bytes\": %lld, \"wall_s\": %.6f, \"read_busy_s\": %.6f, \"read_wait_s\": %.6f, "
           "\"read_cpu_s\": %.6f, \"read_bytes\": %lld, \"readers\": %d, \"batch\": %d, "
           "\"reader\": \"%s\", "
           "\"write_busy_s\": %.6f, \"tiff_tiles_decoded\": %lld}\n",
           tile_bytes, in->seconds, in->stage[TW_STAGE_READ].busy_s,
           in->stage[TW_STAGE_READ].wait_s, in->stage[TW_STAGE_READ].cpu_s,
           (long long)in->read_bytes, in->read_workers, r->budget.batch, in->reader,
           in->stage[TW_STAGE_WRITE].busy_s, (long long)in->tiff_tiles_decoded);
    tw_run_result_destroy(r);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "gdal") == 0) return run_gdal(argv[2], atoi(argv[3]));
    if (argc == 7 && strcmp(argv[1], "pipe") == 0)
        return run_pipe(argv[2], atoi(argv[3]), atoi(argv[4]), argv[5], argv[6]);
    fprintf(stderr, "usage: feed_rate gdal FILE TILE | pipe FILE TILE READERS MODEL OUTDIR\n");
    return 2;
}
