/* test_blend.c - per-pixel blending of segmentation tiles (pipeline/engine/blend.c)
 * against an independent double-precision reference over the whole raster.
 *
 * The reference knows nothing of plan.c or blend.c: tile positions are laid
 * out from the edge modes' definitions (plan.h), and a tile's weight at an
 * absolute pixel coordinate is computed from KEYS.md's words in absolute
 * coordinates: the ramp between a tile and its neighbour runs over the
 * pixels of their common overlap less the margins, [lo, hi) = [start of the
 * later tile + m, end of the earlier tile - m), at t = (x + 0.5 - lo) /
 * (hi - lo) rising for the later tile and 1 - t for the earlier one. Every
 * tile's probabilities are a softmax of pseudo-random logits per pixel;
 * some tiles are left out (not classified) and some input pixels are
 * nodata, so some pixels are covered by no valid tile and must come out
 * nodata (has 0, probabilities 0).
 *
 * Error bound: out = sum(w p) / sum(w) with n <= 25 terms per pixel here
 * (T = 8, S >= 2: at most 5 x 5 tiles). Each sum of n positive float terms
 * (each a rounded product) errs relatively by at most (n + 1) 2^-24, the
 * division by one more 2^-24, and out <= 1, so |error| <= (2n + 3) 2^-24 ~
 * 3.2e-6 in the worst case; rounding errors of independent terms do not all
 * line up, and the largest seen here is ~2e-7. The tests allow 1e-6.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "pipeline/engine/blend.h"

#define TOL 1e-6
enum { C = 3, MAXP = 256, MAXW = 64, MAXH = 420 };

/* Tile positions along an axis of `size` pixels, from the edge modes'
 * definitions (plan.h), not from plan.c. */
static int positions(int size, int T, int S, tw_edge_mode e, int *pos)
{
    int n = 0;
    if (size <= T) {
        pos[n++] = 0;
        return n;
    }
    for (int p = 0;; p += S) {
        if (e == TW_EDGE_PAD) {
            pos[n++] = p;
            if (p + T >= size) break;
        } else {
            if (p + T > size) break;
            pos[n++] = p;
        }
    }
    if (e == TW_EDGE_SHIFT && pos[n - 1] + T < size) pos[n++] = size - T;
    return n;
}

static uint32_t hash(uint32_t a, uint32_t b, uint32_t c, uint32_t d)
{
    uint32_t h = a * 73856093u ^ b * 19349663u ^ c * 83492791u ^ d * 2654435761u;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    h *= 0x297a2d39u;
    h ^= h >> 15;
    return h;
}

/* Tile (tx, ty)'s probabilities at its pixel (i, j): a softmax of
 * pseudo-random logits in [-3, 3). */
static void tile_pixel(int tx, int ty, int i, int j, float *p)
{
    double v[C], s = 0;
    for (int c = 0; c < C; c++) {
        double logit = -3.0 + 6.0 *
                                  (double)(hash((uint32_t)tx, (uint32_t)ty, (uint32_t)(i * 64 + j),
                                                (uint32_t)c) >>
                                           8) /
                                  (double)(1u << 24);
        v[c] = exp(logit);
        s += v[c];
    }
    for (int c = 0; c < C; c++) p[c] = (float)(v[c] / s);
}

/* The tile's planar probs [C][T][T], as a network's NCHW output. */
static void tile_probs(int tx, int ty, int T, float *probs)
{
    for (int i = 0; i < T; i++)
        for (int j = 0; j < T; j++) {
            float p[C];
            tile_pixel(tx, ty, i, j, p);
            for (int c = 0; c < C; c++) probs[((size_t)c * T + i) * T + j] = p[c];
        }
}

/* Tiles left out (not classified): a deterministic sprinkle. */
static bool left_out(int tx, int ty, int sprinkle)
{
    return sprinkle && (tx * 7 + ty * 3) % sprinkle == 5 % sprinkle;
}

/* Input nodata: one raster column and a small block. */
static bool nodata_px(int x, int y, bool with_nodata)
{
    return with_nodata && (x == 5 || (x >= 20 && x < 23 && y >= 10 && y < 12));
}

typedef struct out_img {
    int w, h, row_offset, rows_seen;
    int calls;
    int rows_done_at_call[MAXH]; /* first row of each sink call */
    float probs[MAXH][MAXW][C];
    uint8_t has[MAXH][MAXW];
} out_img;

static tw_status sink(void *user, int row0, int n, const float *probs, const uint8_t *has,
                      tw_error *err)
{
    (void)err;
    out_img *g = user;
    assert_int_equal(row0, g->rows_seen); /* in order, no gap, nothing twice */
    g->rows_done_at_call[g->calls++ % MAXH] = row0;
    for (int r = 0; r < n; r++) {
        int row = g->row_offset + row0 + r;
        memcpy(g->probs[row], probs + (size_t)r * g->w * C, sizeof(float) * C * (size_t)g->w);
        memcpy(g->has[row], has + (size_t)r * g->w, (size_t)g->w);
    }
    g->rows_seen += n;
    return TW_OK;
}

typedef struct cfg {
    int w, h, T, S;
    tw_edge_mode edge;
    tw_blend_mode mode;
    int margin;
    int sprinkle; /* left_out's modulus, 0: every tile classified */
    bool nodata;
    int row_begin, row_end;
} cfg;

static tw_blend_params params_of(const cfg *c)
{
    tw_blend_params p = tw_blend_default_params();
    p.width = c->w;
    p.height = c->h;
    p.tile = c->T;
    p.stride = c->S;
    p.edge = c->edge;
    p.mode = c->mode;
    p.margin = c->margin;
    p.n_classes = C;
    p.row_begin = c->row_begin;
    p.row_end = c->row_end;
    return p;
}

/* Blend every tile of c into g in raster order. */
static void run_blend(const cfg *c, out_img *g)
{
    tw_error err;
    tw_error_init(&err);
    g->w = c->w;
    g->h = c->h;
    g->rows_seen = 0;
    g->calls = 0;
    g->row_offset = c->row_begin;
    tw_blend *b = NULL;
    assert_int_equal(tw_blend_create(params_of(c), sink, g, &b, &err), TW_OK);
    float *probs = malloc(sizeof(float) * C * (size_t)c->T * (size_t)c->T);
    uint8_t *valid = malloc((size_t)c->T * (size_t)c->T);
    int nx, ty0, ty1;
    tw_blend_tiles(b, &nx, &ty0, &ty1);
    uint64_t allocs = tw_mem_alloc_count();
    for (int ty = ty0; ty < ty1; ty++)
        for (int tx = 0; tx < nx; tx++) {
            if (left_out(tx, ty, c->sprinkle)) continue;
            int x0, y0;
            tw_blend_tile_origin(b, tx, ty, &x0, &y0);
            tile_probs(tx, ty, c->T, probs);
            for (int i = 0; i < c->T; i++)
                for (int j = 0; j < c->T; j++)
                    valid[i * c->T + j] = !nodata_px(x0 + j, y0 + i, c->nodata);
            assert_int_equal(tw_blend_add(b, tx, ty, probs, c->nodata ? valid : NULL, &err), TW_OK);
        }
    assert_int_equal(tw_blend_finish(b, &err), TW_OK);
    assert_int_equal(tw_mem_alloc_count(), allocs); /* allocates in create only */
    int rows = (c->row_end ? c->row_end : c->h) - c->row_begin;
    assert_int_equal(g->rows_seen, rows);
    assert_int_equal(tw_blend_rows_done(b), rows);
    assert_true(tw_blend_peak_rows(b) <= c->T);
    tw_blend_destroy(b);
    free(probs);
    free(valid);
}

/* KEYS.md's ramp in absolute coordinates: the weight the LATER tile gives
 * pixel x in the overlap [a0, a1) of two tiles (a0 = later tile's start,
 * a1 = earlier tile's end), margin m. The earlier tile's is 1 - that where
 * the ramp runs, 0 in its margin, 1 before the overlap. */
static double later_ramp(tw_blend_mode mode, int x, int a0, int a1, int m)
{
    int lo = a0 + m, hi = a1 - m;
    if (x < lo) return 0.0;
    if (x >= hi) return 1.0;
    double t = (x + 0.5 - lo) / (double)(hi - lo);
    if (mode == TW_BLEND_LINEAR) return t;
    if (mode == TW_BLEND_COSINE) return (1.0 - cos(3.14159265358979323846 * t)) / 2.0;
    return 1.0;
}

/* Weight along one axis of the tile at index a (positions pos[0..n)) for
 * absolute coordinate x inside it. */
static double ref_axis_weight(tw_blend_mode mode, const int *pos, int n, int a, int T, int x, int m)
{
    double w = 1.0;
    if (a > 0 && pos[a - 1] + T > pos[a]) /* overlap with the tile before */
        w *= later_ramp(mode, x, pos[a], pos[a - 1] + T, m);
    if (a + 1 < n && pos[a] + T > pos[a + 1]) { /* with the tile after: mirrored */
        int a0 = pos[a + 1], a1 = pos[a] + T;
        if (x >= a1 - m) {
            w *= 0.0;
        } else if (x >= a0 + m) {
            double t = (x + 0.5 - (a0 + m)) / (double)((a1 - m) - (a0 + m));
            w *= mode == TW_BLEND_LINEAR   ? 1.0 - t
                 : mode == TW_BLEND_COSINE ? (1.0 + cos(3.14159265358979323846 * t)) / 2.0
                                           : 1.0;
        }
    }
    return w;
}

typedef struct ref_img {
    double num[MAXH][MAXW][C];
    double den[MAXH][MAXW];
} ref_img;

static void reference(const cfg *c, ref_img *r)
{
    int xs[MAXP], ys[MAXP];
    int nx = positions(c->w, c->T, c->S, c->edge, xs),
        ny = positions(c->h, c->T, c->S, c->edge, ys);
    memset(r, 0, sizeof *r);
    for (int ty = 0; ty < ny; ty++)
        for (int tx = 0; tx < nx; tx++) {
            if (left_out(tx, ty, c->sprinkle)) continue;
            for (int y = ys[ty]; y < ys[ty] + c->T && y < c->h; y++)
                for (int x = xs[tx]; x < xs[tx] + c->T && x < c->w; x++) {
                    if (nodata_px(x, y, c->nodata)) continue;
                    double w = ref_axis_weight(c->mode, xs, nx, tx, c->T, x, c->margin) *
                               ref_axis_weight(c->mode, ys, ny, ty, c->T, y, c->margin);
                    float p[C];
                    tile_pixel(tx, ty, y - ys[ty], x - xs[tx], p);
                    for (int q = 0; q < C; q++) r->num[y][x][q] += w * p[q];
                    r->den[y][x] += w;
                }
        }
}

/* g's rows [r0, r1) against the reference: within TOL, nodata exactly where
 * the reference's sum of weights is 0. Returns the largest difference. */
static double compare(const cfg *c, const ref_img *r, const out_img *g, int r0, int r1)
{
    double worst = 0;
    for (int y = r0; y < r1; y++)
        for (int x = 0; x < c->w; x++) {
            if (r->den[y][x] == 0) {
                if (g->has[y][x])
                    fail_msg("%dx%d T%d S%d edge %d %s m%d: pixel (%d, %d): no weight, has = 1",
                             c->w, c->h, c->T, c->S, c->edge, tw_blend_mode_name(c->mode),
                             c->margin, x, y);
                for (int q = 0; q < C; q++) assert_true(g->probs[y][x][q] == 0.0f);
                continue;
            }
            if (!g->has[y][x])
                fail_msg("%dx%d T%d S%d edge %d %s m%d: pixel (%d, %d): weight %g, has = 0", c->w,
                         c->h, c->T, c->S, c->edge, tw_blend_mode_name(c->mode), c->margin, x, y,
                         r->den[y][x]);
            for (int q = 0; q < C; q++) {
                double want = r->num[y][x][q] / r->den[y][x];
                double d = fabs(g->probs[y][x][q] - want);
                if (d > worst) worst = d;
                if (d > TOL)
                    fail_msg("%dx%d T%d S%d edge %d %s m%d: pixel (%d, %d) class %d: %.9g, "
                             "reference %.9g",
                             c->w, c->h, c->T, c->S, c->edge, tw_blend_mode_name(c->mode),
                             c->margin, x, y, q, g->probs[y][x][q], want);
            }
        }
    return worst;
}

static out_img g_out, g_out2;
static ref_img g_ref;

/* ---- weights ------------------------------------------------------------------- */

static void weights_formulas(void **state)
{
    (void)state;
    float w[16];
    /* linear, overlap 4 both sides, no margin: (i + 0.5) / 4 up and down */
    tw_blend_axis_weights(TW_BLEND_LINEAR, 8, 0, 4, 4, w);
    const float lin[8] = {0.125f, 0.375f, 0.625f, 0.875f, 0.875f, 0.625f, 0.375f, 0.125f};
    for (int j = 0; j < 8; j++) assert_float_equal(w[j], lin[j], 1e-7);
    /* cosine, overlap 4 before, none after: 0.5 - 0.5 cos(pi (i + 0.5) / 4), then 1 */
    tw_blend_axis_weights(TW_BLEND_COSINE, 8, 0, 4, 0, w);
    for (int j = 0; j < 8; j++) {
        double want = j < 4 ? 0.5 - 0.5 * cos(3.14159265358979323846 * (j + 0.5) / 4) : 1.0;
        assert_float_equal(w[j], want, 1e-7);
    }
    /* margin 1 over overlap 4: 0 in the margin, a ramp over 2 pixels */
    tw_blend_axis_weights(TW_BLEND_LINEAR, 8, 1, 4, 0, w);
    const float mar[8] = {0.0f, 0.25f, 0.75f, 1, 1, 1, 1, 1};
    for (int j = 0; j < 8; j++) assert_float_equal(w[j], mar[j], 1e-7);
    /* margin (T - S) / 2 = 2: no ramp left, a hard cut after the margin */
    tw_blend_axis_weights(TW_BLEND_COSINE, 8, 2, 4, 4, w);
    const float cut[8] = {0, 0, 1, 1, 1, 1, 0, 0};
    for (int j = 0; j < 8; j++) assert_true(w[j] == cut[j]);
    /* mean: 1 everywhere but the margins */
    tw_blend_axis_weights(TW_BLEND_MEAN, 8, 1, 4, 5, w);
    const float mean[8] = {0, 1, 1, 1, 1, 1, 1, 0};
    for (int j = 0; j < 8; j++) assert_true(w[j] == mean[j]);
    /* no neighbour on either side: full weight, the margin ignored */
    for (int mode = 0; mode < 3; mode++) {
        tw_blend_axis_weights((tw_blend_mode)mode, 8, 3, 0, 0, w);
        for (int j = 0; j < 8; j++) assert_true(w[j] == 1.0f);
    }
    /* symmetric, > 0 outside the margins, and two overlapping tiles' ramps
     * add up to 1 on their common pixels (f(t) + f(1 - t) = 1) */
    for (int mode = 1; mode < 3; mode++)
        for (int m = 0; m <= 2; m++) {
            float a[16], b[16];
            tw_blend_axis_weights((tw_blend_mode)mode, 12, m, 5, 7, a);
            tw_blend_axis_weights((tw_blend_mode)mode, 12, m, 7, 5, b);
            for (int j = 0; j < 12; j++) {
                assert_true(a[j] == b[11 - j]);
                bool in_margin = j < m || 11 - j < m;
                assert_true(in_margin ? a[j] == 0.0f : a[j] > 0.0f);
            }
            /* earlier tile (overlap 6 after), later tile (6 before) at +6 */
            float e[12], l[12];
            tw_blend_axis_weights((tw_blend_mode)mode, 12, m, 0, 6, e);
            tw_blend_axis_weights((tw_blend_mode)mode, 12, m, 6, 0, l);
            for (int j = 0; j < 6; j++) assert_float_equal(e[6 + j] + l[j], 1.0, 1e-6);
        }
}

static void overlaps_of_axes(void **state)
{
    (void)state;
    int lo, hi;
    tw_axis ax;
    /* pad, 30 px, T 8 S 5: tiles at 0 5 10 15 20 25 (the last padded) */
    tw_axis_make(30, 8, 5, TW_EDGE_PAD, &ax);
    assert_int_equal(ax.n_pos, 6);
    tw_blend_axis_overlaps(&ax, 8, 5, 0, &lo, &hi);
    assert_int_equal(lo, 0);
    assert_int_equal(hi, 3);
    tw_blend_axis_overlaps(&ax, 8, 5, 5, &lo, &hi);
    assert_int_equal(lo, 3);
    assert_int_equal(hi, 0);
    /* shift, 30 px, T 8 S 5: 0 5 10 15 20, then 22 flush with the edge */
    tw_axis_make(30, 8, 5, TW_EDGE_SHIFT, &ax);
    assert_int_equal(ax.n_pos, 6);
    assert_int_equal(tw_axis_pos(&ax, 8, 5, 5), 22);
    tw_blend_axis_overlaps(&ax, 8, 5, 4, &lo, &hi);
    assert_int_equal(lo, 3);
    assert_int_equal(hi, 6);
    tw_blend_axis_overlaps(&ax, 8, 5, 5, &lo, &hi);
    assert_int_equal(lo, 6);
    assert_int_equal(hi, 0);
    /* stride = tile: neighbours but no overlap, so no ramp */
    tw_axis_make(30, 8, 8, TW_EDGE_SHIFT, &ax);
    tw_blend_axis_overlaps(&ax, 8, 8, 1, &lo, &hi);
    assert_int_equal(lo, 0);
    assert_int_equal(hi, 0);
    tw_blend_axis_overlaps(&ax, 8, 8, 2, &lo, &hi); /* 16, then 22 */
    assert_int_equal(hi, 2);
}

/* ---- checks and refusals ------------------------------------------------------- */

static void margin_refused(void **state)
{
    (void)state;
    tw_error err;
    cfg c = {.w = 40, .h = 30, .T = 16, .S = 6, .mode = TW_BLEND_LINEAR};
    assert_int_equal(tw_blend_max_margin(16, 6), 5);
    assert_int_equal(tw_blend_max_margin(16, 16), 0);
    assert_int_equal(tw_blend_max_margin(16, 15), 0);
    tw_blend_params p = params_of(&c);
    p.margin = 5;
    tw_error_init(&err);
    assert_int_equal(tw_blend_check(&p, &err), TW_OK);
    p.margin = 6;
    tw_blend *b = (tw_blend *)&p; /* not NULL: create must set it to NULL */
    assert_int_equal(tw_blend_create(p, NULL, NULL, &b, &err), TW_ERR_CONFIG);
    assert_null(b);
    assert_non_null(strstr(err.msg, "tiling.margin: 6"));
    assert_non_null(strstr(err.msg, "at most 5 for tile 16 and stride 6"));
    p.margin = -1;
    tw_error_init(&err);
    assert_int_equal(tw_blend_check(&p, &err), TW_ERR_CONFIG);
    assert_non_null(strstr(err.msg, "tiling.margin"));
    /* stride: 1..tile, need not divide it */
    p.margin = 0;
    p.stride = 17;
    tw_error_init(&err);
    assert_int_equal(tw_blend_check(&p, &err), TW_ERR_CONFIG);
    assert_non_null(strstr(err.msg, "tiling.stride: 17"));
    p.stride = 7;
    tw_error_init(&err);
    assert_int_equal(tw_blend_check(&p, &err), TW_OK);
    /* skip with a raster smaller than a tile */
    p.edge = TW_EDGE_SKIP;
    p.height = 10;
    tw_error_init(&err);
    assert_int_equal(tw_blend_check(&p, &err), TW_ERR_INPUT);
    assert_non_null(strstr(err.msg, "tiling.edge"));
    /* names */
    tw_blend_mode m;
    assert_true(tw_blend_mode_from_name("cosine", &m) && m == TW_BLEND_COSINE);
    assert_false(tw_blend_mode_from_name("gauss", &m));
    assert_string_equal(tw_blend_mode_name(TW_BLEND_LINEAR), "linear");
}

/* Tiles out of raster order are refused before anything changes. */
static void order_refused(void **state)
{
    (void)state;
    tw_error err;
    tw_error_init(&err);
    cfg c = {.w = 30, .h = 30, .T = 8, .S = 4};
    tw_blend *b = NULL;
    assert_int_equal(tw_blend_create(params_of(&c), NULL, NULL, &b, &err), TW_OK);
    float probs[C * 64] = {0};
    assert_int_equal(tw_blend_add(b, 1, 0, probs, NULL, &err), TW_OK);
    assert_int_equal(tw_blend_add(b, 0, 0, probs, NULL, &err), TW_ERR_INTERNAL);
    assert_non_null(strstr(err.msg, "tile (0, 0) added after (1, 0)"));
    tw_error_init(&err);
    assert_int_equal(tw_blend_add(b, 1, 0, probs, NULL, &err), TW_ERR_INTERNAL); /* twice */
    assert_int_equal(tw_blend_add(b, 0, 2, probs, NULL, &err), TW_OK);
    tw_error_init(&err);
    assert_int_equal(tw_blend_add(b, 5, 1, probs, NULL, &err), TW_ERR_INTERNAL);
    tw_error_init(&err);
    assert_int_equal(tw_blend_begin_row(b, 1, &err), TW_ERR_INTERNAL);
    tw_error_init(&err);
    assert_int_equal(tw_blend_add(b, 99, 3, probs, NULL, &err), TW_ERR_INTERNAL);
    tw_blend_destroy(b);
}

/* ---- results against the reference --------------------------------------------- */

static void check_cfg(const cfg *c)
{
    run_blend(c, &g_out);
    reference(c, &g_ref);
    int r1 = c->row_end ? c->row_end : c->h;
    compare(c, &g_ref, &g_out, c->row_begin, r1);
}

/* mean, no margin: PyTorch's per-tile softmax averaged with equal weights,
 * here a plain per-pixel mean over the covering valid tiles (no weights) */
static void mean_is_plain_average(void **state)
{
    (void)state;
    const tw_edge_mode edges[3] = {TW_EDGE_PAD, TW_EDGE_SHIFT, TW_EDGE_SKIP};
    const int strides[5] = {8, 6, 5, 4, 2};
    for (int e = 0; e < 3; e++)
        for (int s = 0; s < 5; s++) {
            cfg c = {.w = 37,
                     .h = 29,
                     .T = 8,
                     .S = strides[s],
                     .edge = edges[e],
                     .sprinkle = 11,
                     .nodata = true};
            run_blend(&c, &g_out);
            int xs[MAXP], ys[MAXP];
            int nx = positions(c.w, 8, c.S, c.edge, xs), ny = positions(c.h, 8, c.S, c.edge, ys);
            for (int y = 0; y < c.h; y++)
                for (int x = 0; x < c.w; x++) {
                    double sum[C] = {0};
                    int n = 0;
                    for (int ty = 0; ty < ny; ty++)
                        for (int tx = 0; tx < nx; tx++) {
                            if (left_out(tx, ty, c.sprinkle) || nodata_px(x, y, true)) continue;
                            if (x < xs[tx] || x >= xs[tx] + 8 || y < ys[ty] || y >= ys[ty] + 8)
                                continue;
                            float p[C];
                            tile_pixel(tx, ty, y - ys[ty], x - xs[tx], p);
                            for (int q = 0; q < C; q++) sum[q] += p[q];
                            n++;
                        }
                    assert_int_equal(g_out.has[y][x], n > 0);
                    for (int q = 0; q < C; q++) {
                        double want = n ? sum[q] / n : 0.0;
                        if (fabs(g_out.probs[y][x][q] - want) > TOL)
                            fail_msg("edge %d S %d pixel (%d, %d): %.9g, mean of %d tiles %.9g",
                                     c.edge, c.S, x, y, g_out.probs[y][x][q], n, want);
                    }
                }
        }
}

/* Every mode, margin, edge and stride (dividing the tile or not) on a
 * raster that is no multiple of the stride, with tiles left out and
 * nodata pixels. */
static void modes_against_reference(void **state)
{
    (void)state;
    const tw_edge_mode edges[3] = {TW_EDGE_PAD, TW_EDGE_SHIFT, TW_EDGE_SKIP};
    const int strides[6] = {8, 6, 5, 4, 3, 2};
    double worst = 0;
    int runs = 0;
    for (int e = 0; e < 3; e++)
        for (int s = 0; s < 6; s++)
            for (int mode = 0; mode < 3; mode++)
                for (int m = 0; m <= tw_blend_max_margin(8, strides[s]); m++)
                    for (int spr = 0; spr <= 11; spr += 11) {
                        cfg c = {.w = 37,
                                 .h = 29,
                                 .T = 8,
                                 .S = strides[s],
                                 .edge = edges[e],
                                 .mode = (tw_blend_mode)mode,
                                 .margin = m,
                                 .sprinkle = spr,
                                 .nodata = spr != 0};
                        run_blend(&c, &g_out);
                        reference(&c, &g_ref);
                        double d = compare(&c, &g_ref, &g_out, 0, c.h);
                        if (d > worst) worst = d;
                        runs++;
                    }
    /* a larger tile, a stride that does not divide it */
    cfg big = {.w = 61,
               .h = 47,
               .T = 24,
               .S = 7,
               .edge = TW_EDGE_SHIFT,
               .mode = TW_BLEND_COSINE,
               .margin = 3,
               .sprinkle = 11,
               .nodata = true};
    check_cfg(&big);
    big.mode = TW_BLEND_LINEAR;
    big.edge = TW_EDGE_PAD;
    check_cfg(&big);
    print_message("%d configurations, largest difference %.3g\n", runs, worst);
}

/* Where every tile is classified and the margin keeps its bound, no pixel
 * of the tiled area is nodata; where a single tile covers a pixel (the
 * raster's corners, a raster smaller than a tile) it weighs 1 and the
 * output is that tile's value, bit for bit. */
static void edges_full_weight(void **state)
{
    (void)state;
    for (int mode = 0; mode < 3; mode++) {
        cfg c = {.w = 37,
                 .h = 29,
                 .T = 8,
                 .S = 4,
                 .edge = TW_EDGE_SHIFT,
                 .mode = (tw_blend_mode)mode,
                 .margin = 2};
        run_blend(&c, &g_out);
        for (int y = 0; y < c.h; y++)
            for (int x = 0; x < c.w; x++) assert_true(g_out.has[y][x]);
        /* corners: the first tile's (0, 0), the last tile's (T-1, T-1) */
        float p[C];
        tile_pixel(0, 0, 0, 0, p);
        for (int q = 0; q < C; q++) assert_true(g_out.probs[0][0][q] == p[q]);
        int xs[MAXP], ys[MAXP];
        int nx = positions(c.w, 8, 4, c.edge, xs), ny = positions(c.h, 8, 4, c.edge, ys);
        tile_pixel(nx - 1, ny - 1, 7, 7, p);
        for (int q = 0; q < C; q++) assert_true(g_out.probs[c.h - 1][c.w - 1][q] == p[q]);
        /* a raster smaller than a tile: one tile, its values as they are */
        cfg one = {.w = 6, .h = 5, .T = 8, .S = 4, .mode = (tw_blend_mode)mode, .margin = 2};
        run_blend(&one, &g_out);
        for (int y = 0; y < one.h; y++)
            for (int x = 0; x < one.w; x++) {
                tile_pixel(0, 0, y, x, p);
                for (int q = 0; q < C; q++) assert_true(g_out.probs[y][x][q] == p[q]);
            }
    }
}

/* A margin takes the pixels near an inner tile edge from the neighbour;
 * where that neighbour was not classified they are nodata. */
static void margin_from_neighbour(void **state)
{
    (void)state;
    /* T 8, S 4, margin 2, mean: columns 6, 7 of tile 0 are tile 1's */
    cfg c = {.w = 16, .h = 8, .T = 8, .S = 4, .mode = TW_BLEND_MEAN, .margin = 2};
    run_blend(&c, &g_out);
    float p[C];
    for (int y = 0; y < 8; y++) {
        tile_pixel(1, 0, y, 2, p); /* x = 6: tile 1's column 2 */
        for (int q = 0; q < C; q++) assert_true(g_out.probs[y][6][q] == p[q]);
        tile_pixel(0, 0, y, 5, p); /* x = 5: tile 0 only (tile 1's margin) */
        for (int q = 0; q < C; q++) assert_true(g_out.probs[y][5][q] == p[q]);
    }
    /* tile 1 left out: columns 6, 7 (tile 0's margin) and 8, 9 (tile 2's)
     * have no weight: nodata; column 5 and 10 are there */
    tw_error err;
    tw_error_init(&err);
    tw_blend *b = NULL;
    g_out.w = 16;
    g_out.rows_seen = 0;
    g_out.calls = 0;
    g_out.row_offset = 0;
    assert_int_equal(
        tw_blend_create(params_of(&(cfg){
                            .w = 16, .h = 8, .T = 8, .S = 4, .mode = TW_BLEND_COSINE, .margin = 2}),
                        sink, &g_out, &b, &err),
        TW_OK);
    float probs[C * 64];
    tile_probs(0, 0, 8, probs);
    assert_int_equal(tw_blend_add(b, 0, 0, probs, NULL, &err), TW_OK);
    tile_probs(2, 0, 8, probs);
    assert_int_equal(tw_blend_add(b, 2, 0, probs, NULL, &err), TW_OK);
    assert_int_equal(tw_blend_finish(b, &err), TW_OK);
    int64_t nodata = -1;
    const int64_t *hist = tw_blend_histogram(b, &nodata);
    assert_int_equal(nodata, 4 * 8);
    int64_t total = nodata;
    for (int q = 0; q < C; q++) total += hist[q];
    assert_int_equal(total, 16 * 8);
    tw_blend_destroy(b);
    for (int y = 0; y < 8; y++)
        for (int x = 0; x < 16; x++) assert_int_equal(g_out.has[y][x], x < 6 || x >= 10);
}

/* The window holds at most a tile of rows whatever the raster's height;
 * rows go to the sink as tile rows pass, not at the end; the bytes do not
 * grow with the height. */
static void bounded_rows(void **state)
{
    (void)state;
    int peak[2];
    size_t strip[2];
    const int heights[2] = {40, 400};
    for (int k = 0; k < 2; k++) {
        cfg c = {.w = 30,
                 .h = heights[k],
                 .T = 8,
                 .S = 3,
                 .edge = TW_EDGE_SHIFT,
                 .mode = TW_BLEND_LINEAR,
                 .margin = 1};
        tw_error err;
        tw_error_init(&err);
        tw_blend *b = NULL;
        g_out.w = c.w;
        g_out.rows_seen = 0;
        g_out.calls = 0;
        g_out.row_offset = 0;
        size_t before = tw_mem_current(TW_MEM_STRIP);
        assert_int_equal(tw_blend_create(params_of(&c), sink, &g_out, &b, &err), TW_OK);
        strip[k] = tw_mem_current(TW_MEM_STRIP) - before; /* what it holds */
        if (strip[k] > tw_blend_bytes(c.w, c.T, C))
            fail_msg("holds %zu bytes, tw_blend_bytes says %zu", strip[k],
                     tw_blend_bytes(c.w, c.T, C));
        int nx, ty0, ty1;
        tw_blend_tiles(b, &nx, &ty0, &ty1);
        float probs[C * 64];
        for (int ty = ty0; ty < ty1; ty++) {
            int x0, y0;
            tw_blend_tile_origin(b, 0, ty, &x0, &y0);
            for (int tx = 0; tx < nx; tx++) {
                tile_probs(tx, ty, 8, probs);
                assert_int_equal(tw_blend_add(b, tx, ty, probs, NULL, &err), TW_OK);
                /* every row above the tile row is out already */
                assert_int_equal(tw_blend_rows_done(b), y0);
            }
        }
        assert_int_equal(tw_blend_finish(b, &err), TW_OK);
        peak[k] = tw_blend_peak_rows(b);
        assert_int_equal(peak[k], 8);
        tw_blend_destroy(b);
    }
    assert_int_equal(peak[0], peak[1]);
    assert_true(strip[0] == strip[1]);
    assert_true(tw_blend_bytes(30, 8, C) < 30 * 8 * (C + 2) * 4 + 4096);
    assert_true(tw_blend_bytes(30, 8, C) >= (size_t)30 * 8 * (C * 4 + 5));
    /* and the big raster's output equals the reference */
    cfg c = {.w = 30,
             .h = 400,
             .T = 8,
             .S = 3,
             .edge = TW_EDGE_SHIFT,
             .mode = TW_BLEND_LINEAR,
             .margin = 1};
    check_cfg(&c);
}

/* Bands of rows (shards, resumed segments) give the whole raster's bytes:
 * each pixel adds the same tiles in the same order. Two runs, and runs
 * that announce rows again in between (a batch ending mid-row), likewise. */
static void bands_and_reruns_identical(void **state)
{
    (void)state;
    for (int mode = 0; mode < 3; mode++) {
        cfg whole = {.w = 37,
                     .h = 29,
                     .T = 8,
                     .S = 3,
                     .edge = TW_EDGE_PAD,
                     .mode = (tw_blend_mode)mode,
                     .margin = 1,
                     .sprinkle = 11,
                     .nodata = true};
        memset(&g_out, 0, sizeof g_out); /* earlier tests' wider rasters */
        run_blend(&whole, &g_out);
        const int cuts[4] = {0, 7, 8, 29};
        memset(&g_out2, 0, sizeof g_out2);
        for (int k = 0; k < 3; k++) {
            cfg band = whole;
            band.row_begin = cuts[k];
            band.row_end = cuts[k + 1];
            run_blend(&band, &g_out2);
        }
        assert_memory_equal(g_out.probs, g_out2.probs, sizeof g_out.probs);
        assert_memory_equal(g_out.has, g_out2.has, sizeof g_out.has);

        /* begin_row called again for the current row (a new batch) changes
         * nothing */
        tw_error err;
        tw_error_init(&err);
        tw_blend *b = NULL;
        memset(&g_out2, 0, sizeof g_out2);
        g_out2.w = whole.w;
        assert_int_equal(tw_blend_create(params_of(&whole), sink, &g_out2, &b, &err), TW_OK);
        int nx, ty0, ty1;
        tw_blend_tiles(b, &nx, &ty0, &ty1);
        float probs[C * 64];
        uint8_t valid[64];
        for (int ty = ty0; ty < ty1; ty++) {
            assert_int_equal(tw_blend_begin_row(b, ty, &err), TW_OK);
            for (int tx = 0; tx < nx; tx++) {
                if (left_out(tx, ty, whole.sprinkle)) continue;
                int x0, y0;
                tw_blend_tile_origin(b, tx, ty, &x0, &y0);
                tile_probs(tx, ty, 8, probs);
                for (int i = 0; i < 64; i++) valid[i] = !nodata_px(x0 + i % 8, y0 + i / 8, true);
                assert_int_equal(tw_blend_add(b, tx, ty, probs, valid, &err), TW_OK);
                if (tx % 3 == 1) assert_int_equal(tw_blend_begin_row(b, ty, &err), TW_OK);
            }
        }
        assert_int_equal(tw_blend_finish(b, &err), TW_OK);
        tw_blend_destroy(b);
        assert_memory_equal(g_out.probs, g_out2.probs, sizeof g_out.probs);
        assert_memory_equal(g_out.has, g_out2.has, sizeof g_out.has);
    }
}

/* Feed tiles [k0, k1) (raster order, over every tile row) of c to b. */
static void feed(tw_blend *b, const cfg *c, int k0, int k1)
{
    tw_error err;
    tw_error_init(&err);
    int nx, ty0, ty1;
    tw_blend_tiles(b, &nx, &ty0, &ty1);
    float *probs = malloc(sizeof(float) * C * (size_t)c->T * (size_t)c->T);
    uint8_t *valid = malloc((size_t)c->T * (size_t)c->T);
    for (int k = k0; k < k1; k++) {
        int tx = k % nx, ty = ty0 + k / nx;
        if (left_out(tx, ty, c->sprinkle)) continue;
        int x0, y0;
        tw_blend_tile_origin(b, tx, ty, &x0, &y0);
        tile_probs(tx, ty, c->T, probs);
        for (int i = 0; i < c->T; i++)
            for (int j = 0; j < c->T; j++)
                valid[i * c->T + j] = !nodata_px(x0 + j, y0 + i, c->nodata);
        assert_int_equal(tw_blend_add(b, tx, ty, probs, valid, &err), TW_OK);
    }
    free(probs);
    free(valid);
}

/* A checkpoint after any tile (tw_blend_held, a new blender,
 * tw_blend_restore, the tiles after it) and a reset to the next band give
 * an uninterrupted run's bytes. */
static void checkpoint_and_reset_identical(void **state)
{
    (void)state;
    cfg c = {.w = 37,
             .h = 29,
             .T = 8,
             .S = 3,
             .edge = TW_EDGE_SHIFT,
             .mode = TW_BLEND_COSINE,
             .margin = 2,
             .sprinkle = 11,
             .nodata = true};
    memset(&g_out, 0, sizeof g_out);
    run_blend(&c, &g_out);
    tw_error err;
    tw_error_init(&err);
    const size_t px = (size_t)c.T * (size_t)c.w;
    float *sum = malloc(sizeof(float) * px * C), *wsum = malloc(sizeof(float) * px);
    int nx, ty0, ty1;
    {
        tw_blend *b = NULL;
        assert_int_equal(tw_blend_create(params_of(&c), NULL, NULL, &b, &err), TW_OK);
        tw_blend_tiles(b, &nx, &ty0, &ty1);
        tw_blend_destroy(b);
    }
    const int n = nx * (ty1 - ty0);
    const int ks[6] = {1, nx - 1, nx, nx + 2, 3 * nx + 4, n - 1};
    for (int q = 0; q < 6; q++) {
        int k = ks[q];
        memset(&g_out2, 0, sizeof g_out2);
        g_out2.w = c.w;
        tw_blend *b = NULL;
        assert_int_equal(tw_blend_create(params_of(&c), sink, &g_out2, &b, &err), TW_OK);
        feed(b, &c, 0, k);
        const float *hs, *hw;
        int rows;
        int next_row = tw_blend_held(b, &hs, &hw, &rows);
        assert_int_equal(rows, c.T);
        assert_int_equal(next_row, g_out2.rows_seen);
        memcpy(sum, hs, sizeof(float) * px * C);
        memcpy(wsum, hw, sizeof(float) * px);
        tw_blend_destroy(b); /* the process ends */

        assert_int_equal(tw_blend_create(params_of(&c), sink, &g_out2, &b, &err), TW_OK);
        float *ps, *pw;
        tw_blend_restore(b, next_row, k % nx, ty0 + k / nx, &ps, &pw);
        memcpy(ps, sum, sizeof(float) * px * C);
        memcpy(pw, wsum, sizeof(float) * px);
        feed(b, &c, k, n);
        assert_int_equal(tw_blend_finish(b, &err), TW_OK);
        tw_blend_destroy(b);
        assert_int_equal(g_out2.rows_seen, c.h);
        assert_memory_equal(g_out.probs, g_out2.probs, sizeof g_out.probs);
        assert_memory_equal(g_out.has, g_out2.has, sizeof g_out.has);
    }

    /* one blender, two bands: [0, 11) then reset to [11, h) */
    memset(&g_out2, 0, sizeof g_out2);
    g_out2.w = c.w;
    cfg band = c;
    band.row_end = 11;
    tw_blend *b = NULL;
    assert_int_equal(tw_blend_create(params_of(&band), sink, &g_out2, &b, &err), TW_OK);
    tw_blend_tiles(b, &nx, &ty0, &ty1);
    feed(b, &band, 0, nx * (ty1 - ty0));
    assert_int_equal(tw_blend_finish(b, &err), TW_OK);
    assert_int_equal(tw_blend_reset(b, 11, 30, &err), TW_ERR_INTERNAL); /* past the raster */
    tw_error_init(&err);
    assert_int_equal(tw_blend_reset(b, 11, c.h, &err), TW_OK);
    g_out2.rows_seen = 0;
    g_out2.row_offset = 11;
    band.row_begin = 11;
    band.row_end = c.h;
    tw_blend_tiles(b, &nx, &ty0, &ty1);
    assert_true(ty0 > 0);
    feed(b, &band, 0, nx * (ty1 - ty0));
    assert_int_equal(tw_blend_finish(b, &err), TW_OK);
    int64_t nodata = -1;
    const int64_t *hist = tw_blend_histogram(b, &nodata);
    int64_t total = nodata;
    for (int q = 0; q < C; q++) total += hist[q];
    assert_int_equal(total, (int64_t)c.w * c.h); /* the histogram counts both bands */
    tw_blend_destroy(b);
    assert_memory_equal(g_out.probs, g_out2.probs, sizeof g_out.probs);
    assert_memory_equal(g_out.has, g_out2.has, sizeof g_out.has);
    free(sum);
    free(wsum);
}

/* plan.c's placement of the last tiles, as blend uses it: the test's own
 * positions from the edge modes' words. */
static void origins_follow_plan(void **state)
{
    (void)state;
    const tw_edge_mode edges[3] = {TW_EDGE_PAD, TW_EDGE_SHIFT, TW_EDGE_SKIP};
    for (int e = 0; e < 3; e++)
        for (int S = 1; S <= 8; S++)
            for (int size = 8; size <= 40; size += 3) {
                cfg c = {.w = size, .h = size + 1, .T = 8, .S = S, .edge = edges[e]};
                tw_error err;
                tw_error_init(&err);
                tw_blend *b = NULL;
                assert_int_equal(tw_blend_create(params_of(&c), NULL, NULL, &b, &err), TW_OK);
                int xs[MAXP], ys[MAXP];
                int nx = positions(c.w, 8, S, c.edge, xs), ny = positions(c.h, 8, S, c.edge, ys);
                int bnx, ty0, ty1;
                tw_blend_tiles(b, &bnx, &ty0, &ty1);
                assert_int_equal(bnx, nx);
                assert_int_equal(ty0, 0);
                assert_int_equal(ty1, ny);
                for (int t = 0; t < nx && t < ny; t++) {
                    int x0, y0;
                    tw_blend_tile_origin(b, t, t, &x0, &y0);
                    assert_int_equal(x0, xs[t]);
                    assert_int_equal(y0, ys[t]);
                }
                tw_blend_destroy(b);
            }
}

/* ---- dumps for tests/e2e_blend_ref.py ------------------------------------------ */

/* TW_BLEND_DUMP=dir: instead of the tests, blend a few rasters of float
 * logits (softmax taken here in double, as a network's head would) and
 * write per configuration dir/blend_N.bin, little endian: int32 w, h, T, S,
 * edge, mode, margin, C, nx, ny; float32 logits [ny][nx][C][T][T]; uint8
 * classified [ny][nx]; uint8 nodata [h][w]; float32 out [h][w][C]; uint8
 * has [h][w]. e2e_blend_ref.py recomputes the output from the logits with
 * PyTorch's softmax and KEYS.md's formulas in numpy. */
static int dump_one(const char *dir, int n, cfg c)
{
    tw_error err;
    tw_error_init(&err);
    static out_img g;
    memset(&g, 0, sizeof g);
    g.w = c.w;
    tw_blend *b = NULL;
    if (tw_blend_create(params_of(&c), sink, &g, &b, &err) != TW_OK) return 1;
    int nx, ty0, ty1;
    tw_blend_tiles(b, &nx, &ty0, &ty1);
    const size_t TT = (size_t)c.T * (size_t)c.T, per = TT * C;
    float *logits = malloc(sizeof(float) * per * (size_t)nx * (size_t)ty1);
    float *probs = malloc(sizeof(float) * per);
    uint8_t *valid = malloc(TT), *cls = malloc((size_t)nx * (size_t)ty1);
    uint8_t nod[MAXH][MAXW];
    for (int y = 0; y < c.h; y++)
        for (int x = 0; x < c.w; x++) nod[y][x] = nodata_px(x, y, c.nodata);
    for (int ty = 0; ty < ty1; ty++)
        for (int tx = 0; tx < nx; tx++) {
            float *l = logits + ((size_t)ty * nx + tx) * per;
            for (size_t q = 0; q < per; q++)
                l[q] =
                    (float)(-4.0 +
                            8.0 * (double)(hash((uint32_t)tx, (uint32_t)ty, (uint32_t)q, 7u) >> 8) /
                                (double)(1u << 24));
            cls[ty * nx + tx] = !left_out(tx, ty, c.sprinkle);
            if (!cls[ty * nx + tx]) continue;
            for (size_t px = 0; px < TT; px++) {
                double mx = -1e30, e[C], sum = 0;
                for (int k = 0; k < C; k++) mx = fmax(mx, l[k * TT + px]);
                for (int k = 0; k < C; k++) sum += e[k] = exp((double)l[k * TT + px] - mx);
                for (int k = 0; k < C; k++) probs[k * TT + px] = (float)(e[k] / sum);
            }
            int x0, y0;
            tw_blend_tile_origin(b, tx, ty, &x0, &y0);
            for (int i = 0; i < c.T; i++)
                for (int j = 0; j < c.T; j++)
                    valid[i * c.T + j] = !nodata_px(x0 + j, y0 + i, c.nodata);
            if (tw_blend_add(b, tx, ty, probs, valid, &err) != TW_OK) return 1;
        }
    if (tw_blend_finish(b, &err) != TW_OK) return 1;
    tw_blend_destroy(b);
    char path[4096];
    snprintf(path, sizeof path, "%s/blend_%d.bin", dir, n);
    FILE *f = fopen(path, "wb");
    if (!f) return 1;
    int32_t hdr[10] = {c.w, c.h, c.T, c.S, (int32_t)c.edge, (int32_t)c.mode, c.margin, C, nx, ty1};
    bool ok = fwrite(hdr, sizeof hdr, 1, f) == 1 &&
              fwrite(logits, sizeof(float) * per, (size_t)nx * ty1, f) == (size_t)nx * ty1 &&
              fwrite(cls, 1, (size_t)nx * ty1, f) == (size_t)nx * ty1;
    for (int y = 0; ok && y < c.h; y++) ok = fwrite(nod[y], 1, (size_t)c.w, f) == (size_t)c.w;
    for (int y = 0; ok && y < c.h; y++)
        ok = fwrite(g.probs[y], sizeof(float) * C, (size_t)c.w, f) == (size_t)c.w;
    for (int y = 0; ok && y < c.h; y++) ok = fwrite(g.has[y], 1, (size_t)c.w, f) == (size_t)c.w;
    ok = fclose(f) == 0 && ok;
    free(logits);
    free(probs);
    free(valid);
    free(cls);
    return ok ? 0 : 1;
}

static int dump_all(const char *dir)
{
    const cfg cs[] = {
        {.w = 53,
         .h = 41,
         .T = 16,
         .S = 5,
         .edge = TW_EDGE_SHIFT,
         .mode = TW_BLEND_COSINE,
         .margin = 2,
         .sprinkle = 11,
         .nodata = true},
        {.w = 50, .h = 37, .T = 16, .S = 8, .edge = TW_EDGE_PAD, .mode = TW_BLEND_LINEAR},
        {.w = 45,
         .h = 40,
         .T = 16,
         .S = 6,
         .edge = TW_EDGE_SKIP,
         .mode = TW_BLEND_MEAN,
         .margin = 3,
         .nodata = true},
        {.w = 47,
         .h = 33,
         .T = 16,
         .S = 11,
         .edge = TW_EDGE_PAD,
         .mode = TW_BLEND_MEAN,
         .sprinkle = 11},
        {.w = 60,
         .h = 35,
         .T = 16,
         .S = 3,
         .edge = TW_EDGE_SHIFT,
         .mode = TW_BLEND_LINEAR,
         .margin = 6,
         .sprinkle = 11,
         .nodata = true},
    };
    for (int i = 0; i < (int)(sizeof cs / sizeof *cs); i++)
        if (dump_one(dir, i, cs[i]) != 0) {
            fprintf(stderr, "test_blend: cannot dump configuration %d into %s\n", i, dir);
            return 1;
        }
    return 0;
}

int main(void)
{
    const char *dump = getenv("TW_BLEND_DUMP");
    if (dump) return dump_all(dump);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(weights_formulas),
        cmocka_unit_test(overlaps_of_axes),
        cmocka_unit_test(margin_refused),
        cmocka_unit_test(order_refused),
        cmocka_unit_test(mean_is_plain_average),
        cmocka_unit_test(modes_against_reference),
        cmocka_unit_test(edges_full_weight),
        cmocka_unit_test(margin_from_neighbour),
        cmocka_unit_test(bounded_rows),
        cmocka_unit_test(bands_and_reruns_identical),
        cmocka_unit_test(checkpoint_and_reset_identical),
        cmocka_unit_test(origins_follow_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
