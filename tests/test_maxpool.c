/* test_maxpool.c - the stem's 3x3 stride-2 max pooling from nChw8c / nChw16c
 * into nhwc (model/maxpool.c) against a plain loop over the logical
 * [n][c][h][w] values: even and odd map sizes (a last window cut by the
 * map's edge), 1x1 and 2x2 maps, channel counts that do not fill a block or
 * an 8-channel step, negative values only (padding must not win as 0), and
 * one thread against two bit for bit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "model/maxpool.h"

static uint64_t g_rng = 11;
static float frand(void)
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Offset of logical (i, ch, y, x) in nChw{blk}c with nb blocks. */
static size_t blocked_at(int nb, int h, int blk, int i, int ch, int y, int x)
{
    return ((((size_t)i * nb + ch / blk) * h + y) * h + x) * blk + ch % blk;
}

static void check(int n, int c, int h, int blk, float shift)
{
    int nb = (c + blk - 1) / blk, oh = tw_maxpool_out(h);
    assert_int_equal(oh, (h + 2 - 3) / 2 + 1);
    size_t in_n = (size_t)n * nb * h * h * blk, out_n = (size_t)n * oh * oh * c;
    float *x = malloc(in_n * sizeof *x), *y = malloc(out_n * sizeof *y);
    float *y1 = malloc(out_n * sizeof *y1);
    assert_non_null(x);
    assert_non_null(y);
    assert_non_null(y1);
    /* the padded channels of the last block hold a value larger than any
     * real one: read by mistake, it would show */
    for (size_t k = 0; k < in_n; k++) x[k] = 100.0f;
    for (int i = 0; i < n; i++)
        for (int ch = 0; ch < c; ch++)
            for (int yy = 0; yy < h; yy++)
                for (int xx = 0; xx < h; xx++)
                    x[blocked_at(nb, h, blk, i, ch, yy, xx)] = frand() + shift;
    memset(y, 0xff, out_n * sizeof *y);
    omp_set_num_threads(2);
    tw_maxpool_blocked_to_nhwc(x, n, c, h, blk, y);
    for (int i = 0; i < n; i++)
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < oh; ox++)
                for (int ch = 0; ch < c; ch++) {
                    float want = -INFINITY;
                    for (int ky = 0; ky < 3; ky++)
                        for (int kx = 0; kx < 3; kx++) {
                            int yy = 2 * oy - 1 + ky, xx = 2 * ox - 1 + kx;
                            if (yy < 0 || yy >= h || xx < 0 || xx >= h) continue;
                            float v = x[blocked_at(nb, h, blk, i, ch, yy, xx)];
                            if (v > want) want = v;
                        }
                    float got = y[(((size_t)i * oh + oy) * oh + ox) * c + ch];
                    if (got != want)
                        fail_msg("n %d c %d h %d blk %d: (%d, %d, %d, %d) is %g, want %g", n, c, h,
                                 blk, i, ch, oy, ox, got, want);
                }
    omp_set_num_threads(1);
    tw_maxpool_blocked_to_nhwc(x, n, c, h, blk, y1);
    assert_memory_equal(y, y1, out_n * sizeof *y);
    free(x);
    free(y);
    free(y1);
}

static void test_shapes(void **state)
{
    (void)state;
    static const int hs[] = {1, 2, 3, 5, 8, 9, 16, 32, 57};
    for (size_t k = 0; k < sizeof hs / sizeof hs[0]; k++) {
        check(2, 64, hs[k], 8, 0.0f);
        check(1, 64, hs[k], 16, 0.0f);
    }
}

static void test_partial_blocks(void **state)
{
    (void)state;
    check(3, 6, 11, 8, 0.0f);   /* one block, 6 of its 8 channels */
    check(2, 12, 10, 8, 0.0f);  /* a full block and half of one */
    check(2, 20, 7, 16, 0.0f);  /* 16 + 4: a step of 4 in the second block */
    check(1, 40, 13, 16, 0.0f); /* 16 + 16 + 8 */
}

static void test_negative_values(void **state)
{
    (void)state;
    check(2, 24, 9, 8, -5.0f);
    check(1, 32, 4, 16, -5.0f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_partial_blocks),
        cmocka_unit_test(test_negative_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
