/* cpu_int8.c - the CPU backend's int8: the quantization scales of weights
 * and activations, and the calibration that measures the activations'
 * ranges on the fp32 plan before the int8 plan is built.
 *
 *  - int8: symmetric quantization, per-output-channel weight scales
 *    (127 / max|w|; 63 on CPUs without VNNI, whose 16-bit sums would
 *    saturate: cpu_int8_weight_levels), one scale per activation tensor: u8 after a ReLU, s8
 *    for the projection shortcuts. The stem stays in fp32 on the unquantized
 *    input, and its pooled map is quantized to u8 (on the demo rasters that
 *    divided int8's mean |p - p_fp32| by 2-3 on ResNet-18, for 1.3 % of int8
 *    ResNet-50's speed at 64 px). The activation ranges are
 *    measured by cpu_int8_calibrate(): the pipeline hands it, before each raster, a
 *    batch of tiles spread over the whole raster (pipeline/run/run.c), which
 *    runs once in fp32 with every convolution's output recorded; each range
 *    is the clip with the least squared error (model/calib.h), and the int8
 *    plan replaces the fp32 one. Ranges thus depend on the raster, not on
 *    the shard or on what a resumed run has left. Without that call (no
 *    usable tile in the sample) the first batch of infer calibrates.
 *    Residual adds stay in int8 (a sum post-op rescaled from the shortcut's
 *    scale); the last activation is brought back to fp32 before the global
 *    average.
 * workspace_bytes() for int8 is the fp32 plan's (calibration runs on it and
 * frees it before the smaller int8 plan is built).
 */
#include <math.h>
#include <string.h>

#include <dnnl.h>

#include "model/calib.h"
#include "model/cpu_internal.h"
#include "core/alloc.h"

/* Scale that maps [-amax, amax] (or [0, amax]) onto s8 (u8) for range idx. */
float cpu_q_scale(const plan *p, int idx, bool nonneg)
{
    float m = p->amax ? p->amax[idx] : 1.0f;
    if (!(m > 1e-6f)) m = 1e-6f; /* a dead tensor: any scale is exact for zeros */
    return (nonneg ? 255.0f : 127.0f) / m;
}

/* The steps per side of int8 weights on isa: 127 where oneDNN's int8 kernels
 * multiply with VNNI (vpdpbusd: u8 x s8 summed straight into 32 bits),
 * else 63. Without VNNI (AVX2 and AVX-512 before Cascade Lake) they use
 * vpmaddubsw, which adds two u8 x s8 products into a 16-bit lane that
 * saturates at 32767: 255 x 127 x 2 = 64770 does, 255 x 63 x 2 = 32130 does
 * not (oneDNN's guide, "Nuances of int8 computations"). Measured on the demo
 * ResNet-50 (e2e_precision's 361 tiles): with 127, ONEDNN_MAX_CPU_ISA
 * AVX512_CORE against AVX512_CORE_VNNI, both on the same fp32 calibration,
 * moved 25 tiles by up to 0.07; with 63 the two gave the same bytes. */
int cpu_int8_weight_levels(dnnl_cpu_isa_t isa)
{
    bool vnni = (isa & dnnl_cpu_isa_avx512_core_vnni) == dnnl_cpu_isa_avx512_core_vnni ||
                (isa & dnnl_cpu_isa_avx2_vnni) == dnnl_cpu_isa_avx2_vnni;
    return vnni ? 127 : 63;
}

/* Per-output-channel weight scales levels / max|w| of conv c. */
float *cpu_weight_scales(const tw_conv *c, int levels)
{
    float *s = tw_alloc(TW_MEM_OTHER, (size_t)c->cout * sizeof *s);
    if (!s) return NULL;
    size_t per = (size_t)(c->cin / c->groups) * c->k * c->k;
    for (int o = 0; o < c->cout; o++) {
        float m = 0.0f;
        for (size_t i = 0; i < per; i++) m = fmaxf(m, fabsf(c->w[(size_t)o * per + i]));
        s[o] = m > 0.0f ? (float)levels / m : 1.0f;
    }
    return s;
}

void cpu_record(const cpu_ctx *c, const op *o, int k, calib_rec *rec)
{
    size_t n = o->dst_floats / (size_t)c->max_batch * (size_t)rec->n; /* batch-outer layouts */
    if (!rec->hist || rec->one_pass) {
        float v = tw_calib_max(o->dst, n);
        if (v > rec->m[1 + k]) rec->m[1 + k] = v;
    }
    if (rec->hist)
        tw_calib_hist_add(rec->hist + (size_t)k * TW_CALIB_BINS, rec->m[1 + k], o->dst, n);
}

/* The sample's tiles (idx, n of them) through the fp32 plan in batches of
 * max_batch, each copied into the backend's own input buffer. */
static tw_status calib_pass(cpu_ctx *c, const tw_infer_batch *b, const int *idx, int n,
                            calib_rec *rec, tw_error *err)
{
    size_t tile_floats = (size_t)c->in_bands * c->tile * c->tile;
    float *dst = c->buf[BUF_IN_USER];
    for (int first = 0; first < n; first += c->max_batch) {
        int cn = n - first < c->max_batch ? n - first : c->max_batch;
        for (int i = 0; i < cn; i++)
            memcpy(dst + (size_t)i * tile_floats, b->x + (size_t)idx[first + i] * tile_floats,
                   tile_floats * sizeof(float));
        tw_infer_batch part = *b;
        part.x = dst;
        part.n = cn;
        rec->n = cn;
        tw_status st = cpu_run_ops(c, &part, rec, err);
        if (st != TW_OK) return st;
    }
    return TW_OK;
}

/* int8: run the sample b in fp32 recording the activation ranges, then
 * build the int8 plan with them in place of the fp32 one (same batch size:
 * the caller's slots are sized for it). When an int8 plan is already built
 * (an earlier raster), an fp32 one is built for the measurement first.
 * Tiles of absurd input (model/calib.h) are left out (all are used when
 * none is kept). The sample may hold more tiles than a batch: then a first
 * pass takes each range's largest value and a second counts the values
 * (tw_calib_hist_add), so that the ranges are those of the whole sample
 * whatever the batch. */
tw_status cpu_int8_calibrate(cpu_ctx *c, const tw_infer_batch *b, tw_error *err)
{
    int batch = c->max_batch;
    tw_status st = TW_OK;
    if (c->mode != NUM_F32) {
        cpu_release(c);
        st = cpu_build_mode(c, c->net, NULL, c->tile, batch, NUM_F32, NULL, err);
        if (st != TW_OK) return st;
    }
    float *amax = tw_calloc(TW_MEM_OTHER, (size_t)c->n_conv + 1, sizeof *amax);
    double *hist = tw_calloc(TW_MEM_OTHER, (size_t)c->n_conv * TW_CALIB_BINS, sizeof *hist);
    bool *keep = tw_alloc(TW_MEM_OTHER, (size_t)b->n * sizeof *keep);
    int *idx = tw_alloc(TW_MEM_OTHER, (size_t)b->n * sizeof *idx);
    if (!amax || !hist || !keep || !idx) {
        st = tw_error_set(err, TW_ERR_NOMEM, "out of memory calibrating int8");
        goto out;
    }
    size_t tile_floats = (size_t)c->in_bands * c->tile * c->tile;
    int kept = tw_calib_keep(b->x, b->n, tile_floats, keep), n = 0;
    for (int j = 0; j < b->n; j++)
        if (keep[j] || kept == 0) idx[n++] = j;
    /* amax[0], the input's range, stays 0: the stem runs in fp32 */
    calib_rec rec = {.m = amax, .hist = NULL, .one_pass = n <= batch};
    if (!rec.one_pass) st = calib_pass(c, b, idx, n, &rec, err);
    rec.hist = hist;
    if (st == TW_OK) st = calib_pass(c, b, idx, n, &rec, err);
    for (int i = 0, k = 0; st == TW_OK && i < c->n_ops; i++)
        if (c->ops[i].conv) {
            amax[1 + k] = tw_calib_hist_range(hist + (size_t)k * TW_CALIB_BINS, amax[1 + k],
                                              c->ops[i].levels);
            k++;
        }
    if (st == TW_OK) {
        cpu_release(c);
        st = cpu_build_mode(c, c->net, NULL, c->tile, batch, NUM_INT8, amax, err);
    }
    if (st == TW_OK) c->calibrate = false;
out:
    tw_free(amax);
    tw_free(hist);
    tw_free(keep);
    tw_free(idx);
    return st;
}
