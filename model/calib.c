/* calib.c - int8 calibration's ranges and sample (calib.h). */
#include "model/calib.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "core/alloc.h"

/* The largest finite |v| (0 when there is none): a NaN or an Inf must not
 * become a range. */
static float max_abs_finite(const float *v, size_t n)
{
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(v[i]);
        if (a <= FLT_MAX && a > m) m = a;
    }
    return m;
}

float tw_calib_max(const float *v, size_t n)
{
    return max_abs_finite(v, n);
}

/* Activations have long tails: spending the steps on the bulk of the values
 * beats covering the rare largest one. The bin of a finite value is
 * computed in double and clamped before the cast: |v| * BINS / max can
 * round up to BINS, and a NaN or an Inf there was a wild index (issue 27:
 * SIGSEGV on a raster holding +-3e38). */
void tw_calib_hist_add(double *hist, float m, const float *v, size_t n)
{
    if (!(m > 0.0f)) return;
    double per_bin = TW_CALIB_BINS / (double)m;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(v[i]);
        if (!(a <= m)) continue; /* NaN, Inf, and values over m */
        double f = a * per_bin;
        hist[f < TW_CALIB_BINS - 1 ? (int)f : TW_CALIB_BINS - 1] += 1.0;
    }
}

float tw_calib_hist_range(const double *hist, float m, int levels)
{
    enum { CANDIDATES = 64 };
    if (!(m > 0.0f)) return 0.0f;
    double per_bin = TW_CALIB_BINS / (double)m;
    float best = m;
    double best_err = INFINITY;
    for (int k = CANDIDATES; k >= 1; k--) {
        double c = m * k / CANDIDATES, step = c / levels, err = 0.0;
        for (int b = 0; b < TW_CALIB_BINS; b++) {
            if (hist[b] == 0.0) continue;
            double x = (b + 0.5) / per_bin;
            err += hist[b] * (x > c ? (x - c) * (x - c) : step * step / 12.0);
        }
        if (err < best_err) {
            best_err = err;
            best = (float)c;
        }
    }
    return best;
}

float tw_calib_range(const float *v, size_t n, int levels)
{
    float m = max_abs_finite(v, n);
    if (!(m > 0.0f)) return 0.0f;
    double hist[TW_CALIB_BINS] = {0};
    tw_calib_hist_add(hist, m, v, n);
    return tw_calib_hist_range(hist, m, levels);
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Why the outlier guard: a Float32 raster may hold +-3e38 in a valid pixel.
 * Its tiles overflow to Inf in fp32 whatever the ranges are; left in the
 * sample, their finite activations (~1e37) would stretch every range so far
 * that every other tile quantizes to zero. The bound is relative (to the
 * median tile) so that a raster normalized to large numbers throughout keeps
 * its whole sample. */
int tw_calib_keep(const float *x, int n, size_t tile_floats, bool *keep)
{
    float *tmax = tw_alloc(TW_MEM_OTHER, 2 * (size_t)n * sizeof *tmax);
    if (!tmax) { /* keep them all: only the outlier guard is lost */
        for (int i = 0; i < n; i++) keep[i] = true;
        return n;
    }
    float *sorted = tmax + n;
    int n_finite = 0;
    for (int i = 0; i < n; i++) {
        const float *t = x + (size_t)i * tile_floats;
        float m = 0.0f;
        for (size_t k = 0; k < tile_floats; k++) {
            float a = fabsf(t[k]);
            m = a > m || a != a ? a : m; /* a NaN sticks */
        }
        tmax[i] = m;
        if (m <= FLT_MAX) sorted[n_finite++] = m;
    }
    float bound = 0.0f;
    if (n_finite > 0) {
        qsort(sorted, (size_t)n_finite, sizeof *sorted, cmp_float);
        float median = sorted[(n_finite - 1) / 2]; /* the lower one: outliers pull less */
        bound = TW_CALIB_OUTLIER * (median > 1.0f ? median : 1.0f);
    }
    int kept = 0;
    for (int i = 0; i < n; i++) {
        keep[i] = tmax[i] <= bound; /* false for NaN and Inf */
        kept += keep[i];
    }
    tw_free(tmax);
    return kept;
}
