/* test_stitch.c - the stitcher (pipeline/engine/stitch.c): overlap averaging,
 * edges, nodata, chunk flushes and restarts, against an independent
 * double-precision reference.
 *
 * The reference knows nothing of plan.c's cell maths: tile positions are
 * laid out here from the edge modes' definitions (plan.h), and a tile feeds
 * the output cells whose first pixel lies inside it (c*S in [pos, pos+T)),
 * which is what "cell (i, j) covers input pixels [i*S, i*S+S)" and "a cell's
 * value is the mean of the probabilities of every tile covering it" mean
 * once the edge-flush tile of `shift` feeds only the cells that start
 * inside it. Every tile gets pseudo-random probabilities; some tiles are
 * left out (not classified: too much nodata), so some cells are covered by
 * no tile and must come out nodata (has 0, probabilities 0).
 *
 * Error bound: a cell's sum adds c <= k^2 float probabilities, each partial
 * sum <= c, so each addition errs by at most c * 2^-24 and the sum by
 * c^2 * 2^-24; the mean divides by c (one more rounding, and the 1/c
 * multiply another): |error| <= c * 2^-24 + 2 * 2^-24 <= 18 * 2^-24 ~ 1.1e-6
 * for k = 4. The tests allow 2e-6.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "pipeline/engine/plan.h"
#include "pipeline/engine/stitch.h"

#define TOL 2e-6
enum { C = 5, MAXP = 64, MAXCELLS = 64 };

/* Tile positions along an axis of `size` pixels, from the edge modes'
 * definitions (plan.h), not from plan.c. */
static int positions(int size, int T, int S, tw_edge_mode e, int *pos)
{
    int n = 0;
    if (size <= T) {
        pos[n++] = 0; /* one tile covers it all; shift falls back to pad */
        return n;
    }
    for (int p = 0;; p += S) {
        bool fits = p + T <= size;
        if (e == TW_EDGE_PAD) {
            pos[n++] = p;
            if (p + T >= size) break; /* the raster is covered */
        } else {
            if (!fits) break;
            pos[n++] = p;
        }
    }
    if (e == TW_EDGE_SHIFT && pos[n - 1] + T < size) pos[n++] = size - T;
    return n;
}

/* Pseudo-random probabilities of tile (tx, ty): positive, summing to 1. */
static void tile_probs(int tx, int ty, float *p)
{
    uint32_t h = (uint32_t)(tx * 73856093u) ^ (uint32_t)(ty * 19349663u);
    double v[C], sum = 0;
    for (int q = 0; q < C; q++) {
        h = h * 1664525u + 1013904223u;
        v[q] = 0.05 + (double)(h >> 8) / (double)(1u << 24);
        sum += v[q];
    }
    for (int q = 0; q < C; q++) p[q] = (float)(v[q] / sum);
}

/* Tiles left out (too much nodata): a deterministic sprinkle. */
static bool left_out(int tx, int ty)
{
    return (tx * 7 + ty * 3) % 11 == 5;
}

typedef struct grid {
    int w, h, row_offset, rows_seen;
    float probs[MAXCELLS][MAXCELLS][C];
    uint8_t has[MAXCELLS][MAXCELLS];
} grid;

static tw_status sink(void *user, int row0, int n, const float *probs, const uint8_t *has,
                      tw_error *err)
{
    (void)err;
    grid *g = user;
    assert_int_equal(row0, g->rows_seen); /* in order, no gap, nothing twice */
    for (int r = 0; r < n; r++)
        for (int j = 0; j < g->w; j++) {
            int row = g->row_offset + row0 + r;
            memcpy(g->probs[row][j], probs + ((size_t)r * g->w + j) * C, sizeof(float) * C);
            g->has[row][j] = has[(size_t)r * g->w + j];
        }
    g->rows_seen += n;
    return TW_OK;
}

/* The reference: per cell, the mean (double) of the tiles feeding it, and
 * how many there are. */
typedef struct ref {
    int gw, gh;
    double mean[MAXCELLS][MAXCELLS][C];
    int count[MAXCELLS][MAXCELLS];
} ref;

static void reference(int w, int h, int T, int S, tw_edge_mode e, ref *rf)
{
    int xs[MAXP], ys[MAXP];
    int nx = positions(w, T, S, e, xs), ny = positions(h, T, S, e, ys);
    memset(rf, 0, sizeof *rf);
    rf->gw = (w + S - 1) / S;
    rf->gh = (h + S - 1) / S;
    for (int ty = 0; ty < ny; ty++)
        for (int tx = 0; tx < nx; tx++) {
            if (left_out(tx, ty)) continue;
            float p[C];
            tile_probs(tx, ty, p);
            for (int i = 0; i < rf->gh; i++)
                for (int j = 0; j < rf->gw; j++) {
                    if (i * S < ys[ty] || i * S >= ys[ty] + T) continue;
                    if (j * S < xs[tx] || j * S >= xs[tx] + T) continue;
                    for (int q = 0; q < C; q++) rf->mean[i][j][q] += p[q];
                    rf->count[i][j]++;
                }
        }
    for (int i = 0; i < rf->gh; i++)
        for (int j = 0; j < rf->gw; j++)
            for (int q = 0; q < C && rf->count[i][j]; q++) rf->mean[i][j][q] /= rf->count[i][j];
}

/* Stitch plan p's tiles (all of its tile rows) into g, flushing at every
 * `chunk` output rows as the write stage does at chunk boundaries (0: no
 * flushes). Returns the stitcher's histogram and nodata count into hist. */
static void stitch(const tw_plan *p, int chunk, grid *g, int64_t hist[C + 1])
{
    tw_error err;
    tw_error_init(&err);
    g->w = p->grid_w;
    g->rows_seen = 0;
    g->row_offset = p->row_begin;
    tw_stitch *s = NULL;
    assert_int_equal(tw_stitch_create(p, C, sink, g, &s, &err), TW_OK);
    uint64_t allocs = tw_mem_alloc_count();
    for (int ty = p->ty_begin; ty < p->ty_end; ty++) {
        assert_int_equal(tw_stitch_begin_row(s, ty, &err), TW_OK);
        for (int tx = 0; tx < p->x.n_pos; tx++) {
            if (left_out(tx, ty)) continue;
            float pr[C];
            tile_probs(tx, ty, pr);
            tw_stitch_add(s, tx, ty, pr);
        }
        if (chunk > 0) {
            /* the rows no later tile row can touch, at chunk boundaries */
            int c0, c1;
            if (ty + 1 < p->ty_end) {
                tw_axis_cells(&p->y, p->tile, p->stride, ty + 1, &c0, &c1);
                int until = c0 / chunk * chunk;
                assert_int_equal(tw_stitch_flush_until(s, until, &err), TW_OK);
            }
        }
    }
    assert_int_equal(tw_stitch_finish(s, &err), TW_OK);
    assert_int_equal(tw_mem_alloc_count(), allocs); /* allocates in create only */
    assert_int_equal(g->rows_seen, p->row_end - p->row_begin);
    assert_int_equal(tw_stitch_rows_done(s), p->row_end - p->row_begin);
    int64_t nod = -1;
    const int64_t *h = tw_stitch_histogram(s, &nod);
    memcpy(hist, h, sizeof(int64_t) * C);
    hist[C] = nod;
    tw_stitch_destroy(s);
}

/* g's rows [r0, r1) against the reference: values within TOL, nodata
 * exactly where no tile feeds a cell; the histogram within the cells whose
 * two best classes are closer than the bound (none, in practice). */
static void compare(const ref *rf, const grid *g, int r0, int r1, const int64_t hist[C + 1])
{
    int64_t want[C + 1] = {0};
    int64_t ambiguous = 0;
    for (int i = r0; i < r1; i++)
        for (int j = 0; j < rf->gw; j++) {
            if (rf->count[i][j] == 0) {
                if (g->has[i][j]) fail_msg("cell (%d, %d): no tile feeds it, has = 1", i, j);
                for (int q = 0; q < C; q++) assert_true(g->probs[i][j][q] == 0.0f);
                want[C]++;
                continue;
            }
            if (!g->has[i][j]) fail_msg("cell (%d, %d): %d tiles, has = 0", i, j, rf->count[i][j]);
            int best = 0, second = -1;
            for (int q = 0; q < C; q++) {
                double d = fabs(g->probs[i][j][q] - rf->mean[i][j][q]);
                if (d > TOL)
                    fail_msg("cell (%d, %d) class %d: %.9g, reference %.9g (%d tiles)", i, j, q,
                             g->probs[i][j][q], rf->mean[i][j][q], rf->count[i][j]);
                if (rf->mean[i][j][q] > rf->mean[i][j][best]) best = q;
            }
            for (int q = 0; q < C; q++)
                if (q != best && (second < 0 || rf->mean[i][j][q] > rf->mean[i][j][second]))
                    second = q;
            if (rf->mean[i][j][best] - rf->mean[i][j][second] < 2 * TOL) ambiguous++;
            want[best]++;
        }
    assert_int_equal(hist[C], want[C]);
    for (int q = 0; q < C; q++)
        if (llabs(hist[q] - want[q]) > ambiguous)
            fail_msg("class %d: %lld cells, reference %lld (%lld ambiguous)", q, (long long)hist[q],
                     (long long)want[q], (long long)ambiguous);
}

static void one_case(int w, int h, int T, int S, tw_edge_mode e)
{
    ref *rf = test_malloc(sizeof *rf);
    grid *g = test_malloc(sizeof *g);
    reference(w, h, T, S, e, rf);
    tw_plan p;
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_plan_make(w, h, T, S, e, 0, 1, &p, &err), TW_OK);
    assert_int_equal(p.grid_w, rf->gw);
    assert_int_equal(p.grid_h, rf->gh);
    int64_t hist[C + 1];
    for (int chunk = 0; chunk <= 3; chunk += 3) {
        memset(g, 0, sizeof *g);
        stitch(&p, chunk, g, hist);
        compare(rf, g, 0, rf->gh, hist);
    }
    /* shards: each its band of rows, the same values */
    for (int n = 2; n <= 3; n++)
        for (int sh = 0; sh < n; sh++) {
            tw_plan ps;
            assert_int_equal(tw_plan_make(w, h, T, S, e, sh, n, &ps, &err), TW_OK);
            memset(g, 0, sizeof *g);
            stitch(&ps, 0, g, hist);
            compare(rf, g, ps.row_begin, ps.row_end, hist);
        }
    test_free(g);
    test_free(rf);
}

/* Overlap (k = 2 and 4) and none (k = 1), rasters that are and are not
 * multiples of the stride or the tile, in every edge mode. */
static void test_against_reference(void **state)
{
    (void)state;
    static const tw_edge_mode modes[] = {TW_EDGE_PAD, TW_EDGE_SHIFT, TW_EDGE_SKIP};
    static const int sizes[][2] = {{256, 192}, {250, 190}, {333, 129}, {64, 300}};
    static const int strides[] = {64, 32, 16};
    for (size_t m = 0; m < 3; m++)
        for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++)
            for (size_t k = 0; k < 3; k++)
                one_case(sizes[z][0], sizes[z][1], 64, strides[k], modes[m]);
}

/* A raster smaller than one tile (pad): one tile feeds every cell, and the
 * cells are its probabilities exactly (one addition of zero). */
static void test_small_raster(void **state)
{
    (void)state;
    grid *g = test_malloc(sizeof *g);
    memset(g, 0, sizeof *g);
    tw_plan p;
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_plan_make(40, 20, 64, 16, TW_EDGE_PAD, 0, 1, &p, &err), TW_OK);
    int64_t hist[C + 1];
    stitch(&p, 0, g, hist);
    float want[C];
    tile_probs(0, 0, want);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            assert_true(g->has[i][j]);
            assert_memory_equal(g->probs[i][j], want, sizeof want);
        }
    assert_int_equal(hist[C], 0);
    test_free(g);
}

/* A new band of rows on the same stitcher (tw_stitch_reset, as a run does
 * between segments of rows left by an interrupted run): the second band's
 * values equal a fresh stitcher's, and the histogram keeps counting. */
static void test_reset(void **state)
{
    (void)state;
    ref *rf = test_malloc(sizeof *rf);
    grid *g = test_malloc(sizeof *g);
    memset(g, 0, sizeof *g);
    reference(250, 190, 64, 16, TW_EDGE_PAD, rf);
    tw_plan whole, a, b;
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_plan_make(250, 190, 64, 16, TW_EDGE_PAD, 0, 1, &whole, &err), TW_OK);
    a = whole;
    b = whole;
    tw_plan_restrict(&a, 0, 5);
    tw_plan_restrict(&b, 5, whole.grid_h);
    tw_stitch *s = NULL;
    g->w = whole.grid_w;
    assert_int_equal(tw_stitch_create(&a, C, sink, g, &s, &err), TW_OK);
    const tw_plan *seg[2] = {&a, &b};
    for (int k = 0; k < 2; k++) {
        if (k == 1) {
            tw_stitch_reset(s, &b);
            g->rows_seen = 0;
            g->row_offset = b.row_begin;
        }
        for (int ty = seg[k]->ty_begin; ty < seg[k]->ty_end; ty++) {
            assert_int_equal(tw_stitch_begin_row(s, ty, &err), TW_OK);
            for (int tx = 0; tx < seg[k]->x.n_pos; tx++) {
                if (left_out(tx, ty)) continue;
                float pr[C];
                tile_probs(tx, ty, pr);
                tw_stitch_add(s, tx, ty, pr);
            }
        }
        assert_int_equal(tw_stitch_finish(s, &err), TW_OK);
    }
    int64_t nod = 0, hist[C + 1];
    memcpy(hist, tw_stitch_histogram(s, &nod), sizeof(int64_t) * C);
    hist[C] = nod;
    compare(rf, g, 0, whole.grid_h, hist); /* both bands, one histogram */
    tw_stitch_destroy(s);
    test_free(g);
    test_free(rf);
}

/* embedding_raster: 2 probabilities and 3 features per tile (the features
 * 100x the reference's values, so an argmax over all five would pick a
 * feature): every value averaged as the reference says (TOL scaled by 100
 * for the features), the histogram over the 2 probabilities only. */
static void test_embeddings(void **state)
{
    (void)state;
    const int w = 200, h = 150, T = 64, S = 16;
    ref *rf = test_malloc(sizeof *rf);
    grid *g = test_calloc(1, sizeof *g);
    reference(w, h, T, S, TW_EDGE_PAD, rf);
    tw_plan p;
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_plan_make(w, h, T, S, TW_EDGE_PAD, 0, 1, &p, &err), TW_OK);
    g->w = p.grid_w;
    tw_stitch *s = NULL;
    assert_int_equal(tw_stitch_create_ex(&p, 2, 3, sink, g, &s, &err), TW_OK);
    for (int ty = 0; ty < p.y.n_pos; ty++) {
        assert_int_equal(tw_stitch_begin_row(s, ty, &err), TW_OK);
        for (int tx = 0; tx < p.x.n_pos; tx++) {
            if (left_out(tx, ty)) continue;
            float pr[C], emb[3];
            tile_probs(tx, ty, pr);
            for (int q = 0; q < 3; q++) emb[q] = 100.0f * pr[2 + q];
            tw_stitch_add_emb(s, tx, ty, pr, emb);
        }
    }
    assert_int_equal(tw_stitch_finish(s, &err), TW_OK);
    assert_int_equal(g->rows_seen, rf->gh);
    int64_t want[2] = {0, 0}, nodata = 0;
    for (int i = 0; i < rf->gh; i++)
        for (int j = 0; j < rf->gw; j++) {
            assert_int_equal(g->has[i][j], rf->count[i][j] > 0);
            if (!rf->count[i][j]) {
                nodata++;
                continue;
            }
            for (int q = 0; q < C; q++) {
                double k = q < 2 ? 1.0 : 100.0;
                assert_true(fabs(g->probs[i][j][q] - k * rf->mean[i][j][q]) <= k * TOL);
            }
            want[rf->mean[i][j][1] > rf->mean[i][j][0]]++;
        }
    int64_t nod = -1;
    const int64_t *hist = tw_stitch_histogram(s, &nod);
    assert_int_equal(nod, nodata);
    assert_int_equal(hist[0], want[0]);
    assert_int_equal(hist[1], want[1]);
    assert_true(want[0] > 0 && want[1] > 0); /* both classes win somewhere */
    tw_stitch_destroy(s);
    test_free(g);
    test_free(rf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_reference),
        cmocka_unit_test(test_small_raster),
        cmocka_unit_test(test_reset),
        cmocka_unit_test(test_embeddings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
