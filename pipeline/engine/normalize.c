/* normalize.c - raw pixels to model input: see normalize.h.
 *
 * x = (v * scale - mean) / std is evaluated as v * a + b with a = scale / std
 * and b = -mean / std precomputed per band (one multiply-add per pixel, no
 * division). The dtype switch sits outside the pixel loop so each loop body
 * is a plain convert + fma + select that the compiler vectorizes.
 */
#include "pipeline/engine/normalize.h"

#include <omp.h>
#include <stddef.h>

/* One band plane of one tile: n pixels. The select keeps invalid pixels at 0
 * even when their raw value is NaN/Inf (float rasters). */
#define NORM_PLANE(T)                                                                              \
    do {                                                                                           \
        const T *src = (const T *)raw + off;                                                       \
        for (size_t p = 0; p < npix; p++) {                                                        \
            float v = (float)src[p] * a + b;                                                       \
            dst[p] = vmask[p] ? v : 0.0f;                                                          \
        }                                                                                          \
    } while (0)

/* Plane c of tile i. */
static void normalize_plane(const void *raw, tw_dtype t, const uint8_t *valid, int i, int c,
                            int bands, size_t npix, float a, float b, float *x)
{
    const size_t off = ((size_t)i * (size_t)bands + (size_t)c) * npix;
    const uint8_t *vmask = valid + (size_t)i * npix;
    float *dst = x + off;
    switch (t) {
    case TW_DT_BYTE: NORM_PLANE(uint8_t); break;
    case TW_DT_INT8: NORM_PLANE(int8_t); break;
    case TW_DT_UINT16: NORM_PLANE(uint16_t); break;
    case TW_DT_INT16: NORM_PLANE(int16_t); break;
    case TW_DT_UINT32: NORM_PLANE(uint32_t); break;
    case TW_DT_INT32: NORM_PLANE(int32_t); break;
    case TW_DT_FLOAT32: NORM_PLANE(float); break;
    case TW_DT_FLOAT64: NORM_PLANE(double); break;
    }
}

void tw_normalize(const void *raw, tw_dtype t, const uint8_t *valid, int n, int h, int w,
                  const tw_norm *norm, int threads, float *x)
{
    /* mean/std hold TW_MAX_BANDS entries; more bands cannot be described. */
    const int bands = norm->bands < TW_MAX_BANDS ? norm->bands : TW_MAX_BANDS;
    const size_t npix = (size_t)h * (size_t)w;
    float a_of[TW_MAX_BANDS], b_of[TW_MAX_BANDS];
    for (int c = 0; c < bands; c++) {
        a_of[c] = (float)(norm->scale / (double)norm->std[c]);
        b_of[c] = (float)(-(double)norm->mean[c] / (double)norm->std[c]);
    }
    if (threads <= 0) threads = omp_get_max_threads();
    if (threads == 1) {
        /* No parallel region at all: a team of its own would add to the
         * threads libgomp manages, and with more of those than cores
         * libgomp cuts every team's spin-wait (the CPU backend's too) to a
         * few hundred iterations, so its threads sleep and wake at each
         * barrier (bench/RESULTS.md, "One OpenMP team"). */
        for (int i = 0; i < n; i++)
            for (int c = 0; c < bands; c++)
                normalize_plane(raw, t, valid, i, c, bands, npix, a_of[c], b_of[c], x);
        return;
    }
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
    for (int i = 0; i < n; i++)
        for (int c = 0; c < bands; c++)
            normalize_plane(raw, t, valid, i, c, bands, npix, a_of[c], b_of[c], x);
}
