/* test_plan.c - tiling plan geometry, shards, stitcher averaging, queue. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <string.h>

#include "core/alloc.h"
#include "pipeline/engine/budget.h"
#include "pipeline/engine/plan.h"
#include "pipeline/engine/queue.h"
#include "pipeline/engine/stitch.h"

static void plan_ok(int w, int h, int t, int s, tw_edge_mode e, tw_plan *p)
{
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_plan_make(w, h, t, s, e, 0, 1, p, &err), TW_OK);
}

/* Every pixel of the raster must be inside some tile (pad, shift), and every
 * cell a tile feeds must overlap that tile's pixels. */
static void check_axis(const tw_axis *ax, int T, int S, tw_edge_mode e)
{
    int covered_to = 0;
    int prev_c0 = -1;
    for (int a = 0; a < ax->n_pos; a++) {
        int pos = tw_axis_pos(ax, T, S, a), c0, c1;
        tw_axis_cells(ax, T, S, a, &c0, &c1);
        assert_true(pos >= 0);
        assert_true(c0 >= prev_c0); /* raster order: first rows never go back */
        prev_c0 = c0;
        for (int c = c0; c < c1; c++) {
            assert_true(c * S < pos + T); /* cell starts inside the tile */
            assert_true(c * S + S > pos);
        }
        if (pos <= covered_to && pos + T > covered_to) covered_to = pos + T;
    }
    if (e != TW_EDGE_SKIP) assert_true(covered_to >= ax->size);
}

static void test_plan_pad(void **state)
{
    (void)state;
    tw_plan p;
    plan_ok(349, 352, 64, 64, TW_EDGE_PAD, &p);
    assert_int_equal(p.grid_w, 6);
    assert_int_equal(p.grid_h, 6);
    assert_int_equal(p.x.n_pos, 6);
    assert_int_equal(p.n_tiles, 36);
    check_axis(&p.x, 64, 64, TW_EDGE_PAD);

    plan_ok(349, 352, 64, 32, TW_EDGE_PAD, &p);
    assert_int_equal(p.k, 2);
    assert_int_equal(p.grid_w, 11);
    assert_int_equal(p.x.n_pos, 10);
    int c0, c1;
    tw_axis_cells(&p.x, 64, 32, 9, &c0, &c1);
    assert_int_equal(c0, 9);
    assert_int_equal(c1, 11);
    check_axis(&p.x, 64, 32, TW_EDGE_PAD);
    check_axis(&p.y, 64, 32, TW_EDGE_PAD);

    /* smaller than a tile: one padded tile */
    plan_ok(9, 8, 64, 64, TW_EDGE_PAD, &p);
    assert_int_equal(p.n_tiles, 1);
    assert_int_equal(p.grid_w, 1);
}

static void test_plan_shift_skip(void **state)
{
    (void)state;
    tw_plan p;
    plan_ok(349, 352, 64, 32, TW_EDGE_SHIFT, &p);
    assert_true(p.x.shifted);
    assert_int_equal(p.x.n_aligned, 9);
    assert_int_equal(tw_axis_pos(&p.x, 64, 32, 9), 349 - 64);
    int c0, c1;
    tw_axis_cells(&p.x, 64, 32, 9, &c0, &c1);
    assert_int_equal(c0, 9); /* ceil(285 / 32) */
    assert_int_equal(c1, 11);
    check_axis(&p.x, 64, 32, TW_EDGE_SHIFT);
    check_axis(&p.y, 64, 32, TW_EDGE_SHIFT);

    plan_ok(349, 352, 64, 32, TW_EDGE_SKIP, &p);
    assert_false(p.x.shifted);
    assert_int_equal(p.x.n_pos, 9);
    assert_int_equal(p.grid_w, 11); /* same grid; edge cells stay nodata */

    /* exact fit: no shifted tile */
    plan_ok(128, 128, 64, 64, TW_EDGE_SHIFT, &p);
    assert_false(p.x.shifted);
    assert_int_equal(p.n_tiles, 4);
}

static void test_plan_errors(void **state)
{
    (void)state;
    tw_plan p;
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_plan_make(100, 100, 64, 48, TW_EDGE_PAD, 0, 1, &p, &err), TW_ERR_CONFIG);
    assert_non_null(strstr(err.msg, "48"));
    tw_error_init(&err);
    assert_int_equal(tw_plan_make(9, 8, 64, 64, TW_EDGE_SKIP, 0, 1, &p, &err), TW_ERR_INPUT);
    assert_non_null(strstr(err.msg, "smaller than one"));
    tw_error_init(&err);
    assert_int_equal(tw_plan_make(100, 100, 64, 64, TW_EDGE_PAD, 3, 3, &p, &err), TW_ERR_USAGE);
}

/* A raster 2^31-1 pixels wide (GDAL's largest; a VRT makes one): the grid
 * and tile counts are exact (computed here in 64 bits), and nothing on the
 * way overflows (the ASan+UBSan build traps a signed overflow). The old
 * ceil_div computed size + S - 1 in an int: a negative grid. */
static void test_plan_huge(void **state)
{
    (void)state;
    const int64_t W = INT32_MAX;
    static const tw_edge_mode modes[] = {TW_EDGE_PAD, TW_EDGE_SHIFT, TW_EDGE_SKIP};
    static const int strides[] = {64, 32, 16};
    for (int m = 0; m < 3; m++)
        for (int si = 0; si < 3; si++) {
            int T = 64, S = strides[si], k = T / S;
            tw_plan p;
            plan_ok((int)W, 64, T, S, modes[m], &p);
            assert_int_equal(p.grid_w, (W + S - 1) / S);
            assert_int_equal(p.x.cells, p.grid_w);
            int64_t aligned = modes[m] == TW_EDGE_PAD ? (W - T + S - 1) / S + 1 : (W - T) / S + 1;
            assert_int_equal(p.x.n_aligned, aligned);
            assert_int_equal(p.x.shifted, modes[m] == TW_EDGE_SHIFT && (aligned - 1) * S + T < W);
            assert_int_equal(p.n_tiles, (int64_t)p.x.n_pos * (p.ty_end - p.ty_begin));
            /* The last tile: inside the raster or (pad) starting in it. */
            int last = p.x.n_pos - 1, c0, c1;
            int64_t pos = tw_axis_pos(&p.x, T, S, last);
            assert_true(pos >= 0 && pos < W);
            if (modes[m] != TW_EDGE_PAD) assert_true(pos + T <= W);
            tw_axis_cells(&p.x, T, S, last, &c0, &c1);
            assert_true(c0 >= 0 && c0 < c1 && c1 <= p.grid_w);
            if (modes[m] != TW_EDGE_SKIP) assert_int_equal(c1, p.grid_w);
            if (p.x.shifted)
                assert_int_equal(c0, (W - T + S - 1) / S);
            else {
                assert_int_equal(c0, last);
                assert_int_equal(c1, last + k < p.grid_w ? last + k : p.grid_w);
            }
        }
    /* 2^31-1 tall: shards split its rows in 64 bits too. */
    tw_plan p;
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_plan_make(64, INT32_MAX, 64, 32, TW_EDGE_PAD, 2, 3, &p, &err), TW_OK);
    int64_t H = (W + 31) / 32;
    assert_int_equal(p.grid_h, H);
    assert_int_equal(p.row_begin, H * 2 / 3);
    assert_int_equal(p.row_end, H);
}

static void test_plan_shards(void **state)
{
    (void)state;
    for (int n = 1; n <= 7; n++) {
        int next = 0;
        for (int i = 0; i < n; i++) {
            tw_plan p;
            tw_error err;
            tw_error_init(&err);
            assert_int_equal(tw_plan_make(349, 352, 64, 32, TW_EDGE_PAD, i, n, &p, &err), TW_OK);
            assert_int_equal(p.row_begin, next); /* contiguous, disjoint */
            next = p.row_end;
            /* every owned row is fed by a tile row of the shard */
            for (int r = p.row_begin; r < p.row_end; r++) {
                bool fed = false;
                for (int a = p.ty_begin; a < p.ty_end; a++) {
                    int c0, c1;
                    tw_axis_cells(&p.y, 64, 32, a, &c0, &c1);
                    if (r >= c0 && r < c1) fed = true;
                }
                assert_true(fed);
            }
        }
        assert_int_equal(next, 11);
    }
}

/* A sink that keeps the whole grid, to check averaging by construction. */
typedef struct grid_sink {
    int w, h, C, rows_seen;
    float probs[16][16][2];
    uint8_t has[16][16];
} grid_sink;

static tw_status grid_rows(void *user, int row0, int n, const float *probs, const uint8_t *has,
                           tw_error *err)
{
    (void)err;
    grid_sink *g = user;
    assert_int_equal(row0, g->rows_seen); /* raster order, no gaps */
    for (int r = 0; r < n; r++)
        for (int j = 0; j < g->w; j++) {
            g->probs[row0 + r][j][0] = probs[((size_t)r * g->w + j) * 2];
            g->probs[row0 + r][j][1] = probs[((size_t)r * g->w + j) * 2 + 1];
            g->has[row0 + r][j] = has[(size_t)r * g->w + j];
        }
    g->rows_seen += n;
    return TW_OK;
}

/* Tile (tx, ty) says p(class 1) = v(tx, ty) = 0.01 * (tx + 10 * ty). With
 * stride = tile/2 the cell (i, j) is covered by tiles tx in {j-1, j},
 * ty in {i-1, i} (those that exist), so its value is the mean of those v:
 * known in closed form. */
static float tile_v(int tx, int ty)
{
    return 0.01f * (float)(tx + 10 * ty);
}

static void run_stitch_case(tw_edge_mode edge, int w, int h, int shard, int nshard, grid_sink *g)
{
    tw_plan p;
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_plan_make(w, h, 64, 32, edge, shard, nshard, &p, &err), TW_OK);
    memset(g, 0, sizeof *g);
    g->w = p.grid_w;
    tw_stitch *s = NULL;
    assert_int_equal(tw_stitch_create(&p, 2, grid_rows, g, &s, &err), TW_OK);
    uint64_t allocs = tw_mem_alloc_count();
    for (int ty = p.ty_begin; ty < p.ty_end; ty++) {
        assert_int_equal(tw_stitch_begin_row(s, ty, &err), TW_OK);
        for (int tx = 0; tx < p.x.n_pos; tx++) {
            float pr[2] = {1.0f - tile_v(tx, ty), tile_v(tx, ty)};
            tw_stitch_add(s, tx, ty, pr);
        }
    }
    assert_int_equal(tw_stitch_finish(s, &err), TW_OK);
    assert_int_equal(tw_mem_alloc_count(), allocs); /* no allocation while stitching */
    assert_int_equal(g->rows_seen, p.row_end - p.row_begin);
    tw_stitch_destroy(s);
}

static void test_stitch_average(void **state)
{
    (void)state;
    grid_sink *g = test_malloc(sizeof *g);
    /* 256 x 192, tile 64 stride 32, pad: grid 8 x 6, tiles 7 x 5 */
    run_stitch_case(TW_EDGE_PAD, 256, 192, 0, 1, g);
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 8; j++) {
            double sum = 0;
            int n = 0;
            for (int ty = i - 1; ty <= i; ty++)
                for (int tx = j - 1; tx <= j; tx++)
                    if (ty >= 0 && ty < 5 && tx >= 0 && tx < 7) {
                        sum += tile_v(tx, ty);
                        n++;
                    }
            assert_true(g->has[i][j]);
            assert_float_equal(g->probs[i][j][1], sum / n, 1e-6);
            assert_float_equal(g->probs[i][j][0] + g->probs[i][j][1], 1.0, 1e-6);
        }

    /* skip mode on 250 x 192: tiles at x 0..160 (6 columns); cell column 7
     * (pixels 224..255) is covered by no tile -> nodata */
    run_stitch_case(TW_EDGE_SKIP, 250, 192, 0, 1, g);
    for (int i = 0; i < 6; i++) {
        assert_false(g->has[i][7]);
        assert_true(g->has[i][6]);
    }

    /* A shard sees exactly the rows of the whole run. */
    grid_sink *whole = test_malloc(sizeof *whole);
    run_stitch_case(TW_EDGE_PAD, 256, 192, 0, 1, whole);
    for (int sh = 0; sh < 3; sh++) {
        tw_plan p;
        tw_error err;
        tw_error_init(&err);
        tw_plan_make(256, 192, 64, 32, TW_EDGE_PAD, sh, 3, &p, &err);
        run_stitch_case(TW_EDGE_PAD, 256, 192, sh, 3, g);
        for (int r = p.row_begin; r < p.row_end; r++)
            assert_memory_equal(g->probs[r - p.row_begin], whole->probs[r], sizeof whole->probs[r]);
    }
    test_free(whole);
    test_free(g);
}

typedef struct qarg {
    tw_queue *q;
    long sum;
} qarg;

static void *consumer(void *arg)
{
    qarg *a = arg;
    void *item;
    while ((item = tw_queue_pop(a->q, NULL)) != NULL) a->sum += (long)(intptr_t)item;
    return NULL;
}

static void test_queue(void **state)
{
    (void)state;
    tw_queue *q = tw_queue_create(3);
    assert_non_null(q);
    qarg a = {.q = q};
    pthread_t th;
    pthread_create(&th, NULL, consumer, &a);
    long expect = 0;
    for (long i = 1; i <= 1000; i++) {
        assert_true(tw_queue_push(q, (void *)(intptr_t)i, NULL));
        expect += i;
    }
    tw_queue_close(q);
    pthread_join(th, NULL);
    assert_int_equal(a.sum, expect);
    assert_false(tw_queue_push(q, (void *)1, NULL));
    tw_queue_destroy(q);
}

static void test_format_bytes(void **state)
{
    (void)state;
    char b[32];
    assert_string_equal(tw_format_bytes((size_t)3 << 30, b, sizeof b), "3.00 GiB");
    assert_string_equal(tw_format_bytes((size_t)512 << 20, b, sizeof b), "512.0 MiB");
    /* Small sizes in KiB or bytes, never "0.0 MiB" (issue 40). */
    assert_string_equal(tw_format_bytes((size_t)1 << 20, b, sizeof b), "1.0 MiB");
    assert_string_equal(tw_format_bytes(40960, b, sizeof b), "40.0 KiB");
    assert_string_equal(tw_format_bytes(1000, b, sizeof b), "1000 bytes");
    assert_string_equal(tw_format_bytes(0, b, sizeof b), "0 bytes");
    size_t now = tw_rss_now();
    assert_true(now > 0);
    assert_true(tw_rss_peak() >= now);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_pad),    cmocka_unit_test(test_plan_shift_skip),
        cmocka_unit_test(test_plan_errors), cmocka_unit_test(test_plan_huge),
        cmocka_unit_test(test_plan_shards), cmocka_unit_test(test_stitch_average),
        cmocka_unit_test(test_queue),       cmocka_unit_test(test_format_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
