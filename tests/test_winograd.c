/* test_winograd.c - the F(4,3) transforms (model/winograd.c) around a plain
 * double-precision matrix product, against a direct 3x3 convolution in
 * double: odd map sizes (partial last tiles, 1x1 and 2x2 maps), channel
 * counts that do not fill a 16-channel step, bias, residual sum and ReLU,
 * and one thread against two bit for bit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "model/winograd.h"

static uint64_t g_rng = 7;
static float frand(void)
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

typedef struct conv_case {
    int n, h, cin, cout;
    bool sum, relu;
} conv_case;

/* y (nhwc) by Winograd: transforms in float, the 36 products in double. */
static void by_winograd(const conv_case *k, const float *x, const float *w, const float *bias,
                        float *y)
{
    /* planes 3 rows longer than needed: rows past `rows` stay untouched */
    size_t rows = tw_wino_rows(k->n, k->h), stride = rows + 3;
    float *u = malloc((size_t)TW_WINO_POINTS * k->cin * k->cout * sizeof *u);
    float *v = malloc((size_t)TW_WINO_POINTS * stride * k->cin * sizeof *v);
    float *m = malloc((size_t)TW_WINO_POINTS * stride * k->cout * sizeof *m);
    assert_non_null(u);
    assert_non_null(v);
    assert_non_null(m);
    tw_wino_weights(w, k->cout, k->cin, u);
    for (size_t i = 0; i < (size_t)TW_WINO_POINTS * stride * k->cin; i++) v[i] = NAN;
    for (size_t i = 0; i < (size_t)TW_WINO_POINTS * stride * k->cout; i++) m[i] = NAN;
    tw_wino_input(x, k->n, k->h, k->cin, stride, v);
    for (int p = 0; p < TW_WINO_POINTS; p++)
        for (size_t r = 0; r < stride; r++)
            for (int o = 0; o < k->cout; o++) {
                double s = 0;
                for (int i = 0; i < k->cin; i++)
                    s += (double)v[((size_t)p * stride + r) * k->cin + i] *
                         u[((size_t)p * k->cin + i) * k->cout + o];
                /* rows past `rows` were not written: still NaN */
                if (r >= rows) assert_true(isnan(s));
                if (r < rows) m[((size_t)p * stride + r) * k->cout + o] = (float)s;
            }
    tw_wino_output(m, k->n, k->h, k->cout, stride, bias, k->sum, k->relu, y);
    free(u);
    free(v);
    free(m);
}

static void check_case(const conv_case *k)
{
    size_t nx = (size_t)k->n * k->h * k->h * k->cin, ny = (size_t)k->n * k->h * k->h * k->cout;
    float *x = malloc(nx * sizeof *x), *w = malloc((size_t)k->cout * k->cin * 9 * sizeof *w);
    float *bias = malloc((size_t)k->cout * sizeof *bias), *y = malloc(ny * sizeof *y);
    float *y0 = malloc(ny * sizeof *y0);
    for (size_t i = 0; i < nx; i++) x[i] = frand();
    for (size_t i = 0; i < (size_t)k->cout * k->cin * 9; i++) w[i] = frand() * 0.2f;
    for (int i = 0; i < k->cout; i++) bias[i] = frand();
    for (size_t i = 0; i < ny; i++) y0[i] = y[i] = frand(); /* the residual */
    by_winograd(k, x, w, bias, y);

    /* F(4,3)'s transforms multiply rounding errors by up to ~100 (the
     * entries of B^T and A^T reach 5 and 8): bound the error by 2e-6 of
     * the sum of |terms| of each output, which is far above float's
     * 6e-8 per operation and far below any wrong tap (>= 1e-3 here). */
    double worst = 0;
    for (int b = 0; b < k->n; b++)
        for (int oy = 0; oy < k->h; oy++)
            for (int ox = 0; ox < k->h; ox++)
                for (int o = 0; o < k->cout; o++) {
                    double s = bias[o], mag = fabs(bias[o]);
                    for (int i = 0; i < k->cin; i++)
                        for (int ky = 0; ky < 3; ky++)
                            for (int kx = 0; kx < 3; kx++) {
                                int iy = oy - 1 + ky, ix = ox - 1 + kx;
                                if (iy < 0 || iy >= k->h || ix < 0 || ix >= k->h) continue;
                                double t = (double)w[(((size_t)o * k->cin + i) * 3 + ky) * 3 + kx] *
                                           x[(((size_t)b * k->h + iy) * k->h + ix) * k->cin + i];
                                s += t;
                                mag += fabs(t);
                            }
                    size_t at = (((size_t)b * k->h + oy) * k->h + ox) * k->cout + o;
                    if (k->sum) {
                        s += y0[at];
                        mag += fabs(y0[at]);
                    }
                    if (k->relu && s < 0) s = 0;
                    double e = fabs(y[at] - s) / (mag > 1 ? mag : 1);
                    if (e > worst) worst = e;
                    if (e > 2e-6)
                        fail_msg("n %d h %d %d->%d: y[%d][%d][%d][%d] = %.9g, direct %.9g", k->n,
                                 k->h, k->cin, k->cout, b, oy, ox, o, y[at], s);
                }
    print_message("h %2d, %3d -> %3d channels%s%s: worst relative error %.2e\n", k->h, k->cin,
                  k->cout, k->sum ? ", sum" : "", k->relu ? ", relu" : "", worst);
    free(x);
    free(w);
    free(bias);
    free(y);
    free(y0);
}

static void test_against_direct(void **state)
{
    (void)state;
    const conv_case cases[] = {
        {2, 16, 16, 16, false, false}, /* whole tiles */
        {1, 7, 5, 3, false, false},    /* partial tiles, channels < one step */
        {3, 9, 17, 33, true, true},    /* partial tiles and steps, residual, ReLU */
        {2, 4, 64, 32, false, true},   /* one tile, padding all round */
        {1, 2, 8, 8, true, false},     /* a map smaller than a tile */
        {1, 1, 3, 4, false, false},
        {2, 14, 32, 16, true, true}, /* ResNet-50 at 224 px: 14 and 7 */
        {1, 5, 48, 20, false, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i]);
}

/* One tap of one weight moves one pixel to exactly one place (the
 * orientation of cross-correlation, as PyTorch and oneDNN compute it). */
static void test_one_tap(void **state)
{
    (void)state;
    conv_case k = {1, 8, 4, 4, false, false};
    size_t nx = (size_t)k.h * k.h * k.cin, nw = (size_t)k.cout * k.cin * 9;
    float *x = calloc(nx, sizeof *x), *w = calloc(nw, sizeof *w);
    float bias[4] = {0}, *y = calloc((size_t)k.h * k.h * k.cout, sizeof *y);
    x[(3 * k.h + 3) * k.cin + 1] = 1.0f;         /* one pixel, channel 1 */
    w[((2 * k.cin + 1) * 3 + 0) * 3 + 2] = 1.0f; /* out 2, in 1, tap (0, 2) */
    by_winograd(&k, x, w, bias, y);
    /* tap (ky 0, kx 2) carries x(3, 3) to y(4, 2) only */
    for (int oy = 0; oy < k.h; oy++)
        for (int ox = 0; ox < k.h; ox++)
            for (int o = 0; o < k.cout; o++) {
                float want = oy == 4 && ox == 2 && o == 2 ? 1.0f : 0.0f;
                assert_true(fabsf(y[(oy * k.h + ox) * k.cout + o] - want) < 1e-6f);
            }
    free(x);
    free(w);
    free(y);
}

static void test_threads_equal(void **state)
{
    (void)state;
    int n = 4, h = 13, c = 40;
    size_t rows = tw_wino_rows(n, h), nx = (size_t)n * h * h * c;
    float *x = malloc(nx * sizeof *x), *bias = malloc((size_t)c * sizeof *bias);
    float *v1 = malloc((size_t)TW_WINO_POINTS * rows * c * sizeof *v1);
    float *v2 = malloc((size_t)TW_WINO_POINTS * rows * c * sizeof *v2);
    float *y1 = malloc(nx * sizeof *y1), *y2 = malloc(nx * sizeof *y2);
    for (size_t i = 0; i < nx; i++) y1[i] = y2[i] = x[i] = frand();
    for (int i = 0; i < c; i++) bias[i] = frand();
    omp_set_num_threads(1);
    tw_wino_input(x, n, h, c, rows, v1);
    tw_wino_output(v1, n, h, c, rows, bias, true, true, y1);
    omp_set_num_threads(2);
    tw_wino_input(x, n, h, c, rows, v2);
    tw_wino_output(v2, n, h, c, rows, bias, true, true, y2);
    assert_memory_equal(v1, v2, (size_t)TW_WINO_POINTS * rows * c * sizeof *v1);
    assert_memory_equal(y1, y2, nx * sizeof *y1);
    free(x);
    free(bias);
    free(v1);
    free(v2);
    free(y1);
    free(y2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_direct),
        cmocka_unit_test(test_one_tap),
        cmocka_unit_test(test_threads_equal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
