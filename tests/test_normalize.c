/* test_normalize.c - tw_normalize against a plain double-precision
 * (v * scale - mean) / std for every dtype, nodata -> 0, scale != 1, and many
 * tiles through the OpenMP path (also compared with a one-thread run). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/engine/normalize.h"

static uint64_t g_rng;
static uint64_t next_u64(void)
{
    /* splitmix64: deterministic, full 64-bit output */
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Fill raw[i] with a value spanning the type's range; return it as double.
 * Float types get a few NaN/Inf on invalid pixels only (is_valid false). */
static double fill_one(tw_dtype t, void *raw, size_t i, bool is_valid)
{
    uint64_t u = next_u64();
    switch (t) {
    case TW_DT_BYTE: return ((uint8_t *)raw)[i] = (uint8_t)u;
    case TW_DT_INT8: return ((int8_t *)raw)[i] = (int8_t)(uint8_t)u;
    case TW_DT_UINT16: return ((uint16_t *)raw)[i] = (uint16_t)u;
    case TW_DT_INT16: return ((int16_t *)raw)[i] = (int16_t)(uint16_t)u;
    case TW_DT_UINT32: return ((uint32_t *)raw)[i] = (uint32_t)u;
    case TW_DT_INT32: return ((int32_t *)raw)[i] = (int32_t)(uint32_t)u;
    case TW_DT_FLOAT32: {
        float v = (float)((double)(u >> 11) / 9007199254740992.0 * 20000.0 - 10000.0);
        if (!is_valid && u % 3 == 0) v = (u % 2) ? INFINITY : NAN;
        ((float *)raw)[i] = v;
        return v;
    }
    case TW_DT_FLOAT64: {
        double v = (double)(u >> 11) / 9007199254740992.0 * 2e6 - 1e6;
        if (!is_valid && u % 3 == 0) v = (u % 2) ? -INFINITY : NAN;
        ((double *)raw)[i] = v;
        return v;
    }
    }
    return 0;
}

typedef struct setup {
    int n, bands, h, w;
    tw_dtype t;
    void *raw;
    double *vals; /* the raw values as double, [n][bands][h][w] */
    uint8_t *valid;
    float *x;
    tw_norm norm;
} setup;

static void make_setup(setup *s, tw_dtype t, int n, int bands, int h, int w, double scale,
                       uint64_t seed)
{
    g_rng = seed;
    s->t = t;
    s->n = n;
    s->bands = bands;
    s->h = h;
    s->w = w;
    size_t npix = (size_t)h * w, total = (size_t)n * bands * npix;
    s->raw = malloc(total * tw_dtype_size(t));
    s->vals = malloc(total * sizeof(double));
    s->valid = malloc((size_t)n * npix);
    s->x = malloc(total * sizeof(float));
    assert_true(s->raw && s->vals && s->valid && s->x);
    for (size_t i = 0; i < (size_t)n * npix; i++) s->valid[i] = next_u64() % 5 != 0;
    for (int i = 0; i < n; i++)
        for (int c = 0; c < bands; c++)
            for (size_t p = 0; p < npix; p++) {
                size_t idx = ((size_t)i * bands + c) * npix + p;
                s->vals[idx] = fill_one(t, s->raw, idx, s->valid[(size_t)i * npix + p]);
            }
    memset(&s->norm, 0, sizeof s->norm);
    s->norm.bands = bands;
    s->norm.scale = scale;
    for (int c = 0; c < bands; c++) {
        /* means/stds of the scaled data's order of magnitude, different per band */
        s->norm.mean[c] = (float)(100.0 * (c + 1) - 37.5);
        s->norm.std[c] = (float)(3.0 + 11.0 * c);
    }
    memset(s->x, 0xFF, total * sizeof(float)); /* NaN everywhere: every output must be written */
}

static void free_setup(setup *s)
{
    free(s->raw);
    free(s->vals);
    free(s->valid);
    free(s->x);
}

/* Compare s->x with the double-precision reference. Float rounding of v, of
 * a = scale/std and of b = -mean/std bounds the error by a few ulps of
 * |v*a| + |b| (the terms cancel, so relative error of x itself is unbounded). */
static void check_against_reference(const setup *s)
{
    size_t npix = (size_t)s->h * s->w;
    size_t n_valid = 0, n_invalid = 0;
    for (int i = 0; i < s->n; i++) {
        for (int c = 0; c < s->bands; c++) {
            double mean = s->norm.mean[c], sd = s->norm.std[c];
            for (size_t p = 0; p < npix; p++) {
                size_t idx = ((size_t)i * s->bands + c) * npix + p;
                float got = s->x[idx];
                if (!s->valid[(size_t)i * npix + p]) {
                    /* exactly +0.0 (also for NaN/Inf raw values) */
                    uint32_t bits;
                    memcpy(&bits, &got, 4);
                    assert_int_equal(bits, 0);
                    n_invalid++;
                    continue;
                }
                double v = s->vals[idx];
                double ref = (v * s->norm.scale - mean) / sd;
                double tol = 4.0 * FLT_EPSILON * (fabs(v * s->norm.scale / sd) + fabs(mean / sd));
                if (!(fabs((double)got - ref) <= tol))
                    fail_msg("%s tile %d band %d pixel %zu: v=%.17g got %.9g want %.9g",
                             tw_dtype_name(s->t), i, c, p, v, got, ref);
                n_valid++;
            }
        }
    }
    assert_true(n_valid > 0);
    assert_true(n_invalid > 0);
}

static const tw_dtype k_all[] = {TW_DT_BYTE,   TW_DT_INT8,  TW_DT_UINT16,  TW_DT_INT16,
                                 TW_DT_UINT32, TW_DT_INT32, TW_DT_FLOAT32, TW_DT_FLOAT64};

static void test_every_dtype(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof k_all / sizeof k_all[0]; k++) {
        setup s;
        make_setup(&s, k_all[k], 3, 4, 9, 13, 1.0, 1000 + k);
        tw_normalize(s.raw, s.t, s.valid, s.n, s.h, s.w, &s.norm, 0, s.x);
        check_against_reference(&s);
        free_setup(&s);
    }
}

static void test_scale(void **state)
{
    (void)state;
    static const double scales[] = {0.0001, 0.5, 2.75, 10000.0};
    for (size_t k = 0; k < sizeof k_all / sizeof k_all[0]; k++) {
        for (size_t j = 0; j < sizeof scales / sizeof scales[0]; j++) {
            setup s;
            make_setup(&s, k_all[k], 2, 3, 8, 8, scales[j], 77 + 10 * k + j);
            tw_normalize(s.raw, s.t, s.valid, s.n, s.h, s.w, &s.norm, 0, s.x);
            check_against_reference(&s);
            free_setup(&s);
        }
    }
}

/* A hand-computed case: Byte, scale 1/255, mean 0.5, std 0.25:
 * x = (v/255 - 0.5) / 0.25 = 4v/255 - 2. */
static void test_known_values(void **state)
{
    (void)state;
    const uint8_t raw[2][1][2][2] = {{{{0, 255}, {51, 102}}}, {{{255, 0}, {0, 204}}}};
    const uint8_t valid[2][2][2] = {{{1, 1}, {1, 0}}, {{1, 0}, {1, 1}}};
    tw_norm norm = {.bands = 1, .scale = 1.0 / 255.0};
    norm.mean[0] = 0.5f;
    norm.std[0] = 0.25f;
    float x[8];
    tw_normalize(raw, TW_DT_BYTE, &valid[0][0][0], 2, 2, 2, &norm, 0, x);
    const float want[8] = {-2.0f, 2.0f, -1.2f, 0.0f, 2.0f, 0.0f, -2.0f, 1.2f};
    for (int i = 0; i < 8; i++) assert_float_equal(x[i], want[i], 1e-6);
}

/* Many tiles, 6 bands: the OpenMP path with 2+ threads must equal the
 * reference and be bit-identical to a run on one thread, whether OpenMP's
 * setting says one (threads 0) or the caller does (threads 1: no parallel
 * region at all), and to an explicit team of 3. */
static void test_many_tiles_openmp(void **state)
{
    (void)state;
    setup s;
    make_setup(&s, TW_DT_UINT16, 37, 6, 32, 32, 0.0001, 4242);
    for (int c = 0; c < 6; c++) {
        s.norm.mean[c] = (float)(0.1 + 0.05 * c);
        s.norm.std[c] = (float)(0.2 + 0.01 * c);
    }
    int saved = omp_get_max_threads();
    omp_set_num_threads(saved > 1 ? saved : 2);
    tw_normalize(s.raw, s.t, s.valid, s.n, s.h, s.w, &s.norm, 0, s.x);
    check_against_reference(&s);

    size_t total = (size_t)s.n * s.bands * s.h * s.w;
    float *other = malloc(total * sizeof(float));
    assert_non_null(other);
    omp_set_num_threads(1);
    tw_normalize(s.raw, s.t, s.valid, s.n, s.h, s.w, &s.norm, 0, other);
    omp_set_num_threads(saved);
    assert_memory_equal(other, s.x, total * sizeof(float));
    for (int threads = 1; threads <= 3; threads += 2) {
        memset(other, 0xff, total * sizeof(float));
        tw_normalize(s.raw, s.t, s.valid, s.n, s.h, s.w, &s.norm, threads, other);
        assert_memory_equal(other, s.x, total * sizeof(float));
    }
    free(other);
    free_setup(&s);
}

/* n == 0 writes nothing. */
static void test_empty(void **state)
{
    (void)state;
    tw_norm norm = {.bands = 3, .scale = 1.0};
    for (int c = 0; c < 3; c++) norm.std[c] = 1.0f;
    float x[4] = {7, 7, 7, 7};
    uint8_t raw[4] = {0}, valid[4] = {0};
    tw_normalize(raw, TW_DT_BYTE, valid, 0, 2, 2, &norm, 0, x);
    for (int i = 0; i < 4; i++) assert_true(x[i] == 7.0f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_values), cmocka_unit_test(test_every_dtype),
        cmocka_unit_test(test_scale),        cmocka_unit_test(test_many_tiles_openmp),
        cmocka_unit_test(test_empty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
