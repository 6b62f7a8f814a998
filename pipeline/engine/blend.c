/* blend.c - see blend.h */
#include "pipeline/engine/blend.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/argmax.h"

struct tw_blend {
    tw_blend_params p;
    tw_axis ax, ay;
    tw_rows_fn sink;
    void *sink_user;
    int ty_begin, ty_end;
    int next_row;        /* first row still held = first row of the buffers */
    int cur_ty, last_tx; /* the last tile added (order check); -1: none */
    int peak_rows;
    float *sum;     /* [tile][width][n_classes]: sum w p, then the output in place */
    float *wsum;    /* [tile][width]: sum w */
    uint8_t *has;   /* [tile][width] */
    float *wx, *wy; /* [tile]: the current tile's axis weights */
    int64_t *hist;  /* [n_classes] */
    int64_t nodata_pixels;
};

const char *tw_blend_mode_name(tw_blend_mode mode)
{
    return (unsigned)mode < sizeof tw_blend_names / sizeof *tw_blend_names ? tw_blend_names[mode]
                                                                           : NULL;
}

bool tw_blend_mode_from_name(const char *name, tw_blend_mode *mode)
{
    for (int i = 0; i < (int)(sizeof tw_blend_names / sizeof *tw_blend_names); i++)
        if (name && strcmp(name, tw_blend_names[i]) == 0) {
            *mode = (tw_blend_mode)i;
            return true;
        }
    return false;
}

tw_blend_params tw_blend_default_params(void)
{
    tw_blend_params p;
    memset(&p, 0, sizeof p);
    p.edge = TW_EDGE_PAD;
    p.mode = TW_BLEND_MEAN;
    return p;
}

int tw_blend_max_margin(int tile, int stride)
{
    return tile > stride ? (tile - stride) / 2 : 0;
}

tw_status tw_blend_check(const tw_blend_params *p, tw_error *err)
{
    if (p->tile <= 0 || p->stride < 1 || p->stride > p->tile)
        return tw_error_set(err, TW_ERR_CONFIG, "tiling.stride: %d is not in 1..tile (%d)",
                            p->stride, p->tile);
    if (!tw_blend_mode_name(p->mode))
        return tw_error_set(err, TW_ERR_CONFIG,
                            "tiling.blend: unknown mode %d (expected mean, linear or cosine)",
                            (int)p->mode);
    int mmax = tw_blend_max_margin(p->tile, p->stride);
    if (p->margin < 0 || p->margin > mmax)
        return tw_error_set(err, TW_ERR_CONFIG,
                            "tiling.margin: %d is out of range: at most %d for tile %d and "
                            "stride %d (floor((tile - stride) / 2): a larger margin leaves "
                            "pixels between two tiles that neither gives a weight)",
                            p->margin, mmax, p->tile, p->stride);
    if (p->width <= 0 || p->height <= 0)
        return tw_error_set(err, TW_ERR_INPUT, "raster has no pixels (%d x %d)", p->width,
                            p->height);
    if (p->edge == TW_EDGE_SKIP && (p->width < p->tile || p->height < p->tile))
        return tw_error_set(err, TW_ERR_INPUT,
                            "raster is %d x %d, smaller than one %d-pixel tile, and tiling.edge "
                            "is skip: no tile fits (use edge: pad)",
                            p->width, p->height, p->tile);
    if (p->n_classes < 1)
        return tw_error_set(err, TW_ERR_INTERNAL, "blend: %d values per pixel", p->n_classes);
    bool all = p->row_begin == 0 && p->row_end == 0;
    if (!all && (p->row_begin < 0 || p->row_end > p->height || p->row_begin > p->row_end))
        return tw_error_set(err, TW_ERR_INTERNAL, "blend: rows [%d, %d) outside the raster's %d",
                            p->row_begin, p->row_end, p->height);
    return TW_OK;
}

void tw_blend_axis_overlaps(const tw_axis *ax, int tile, int stride, int a, int *o_lo, int *o_hi)
{
    int pos = tw_axis_pos(ax, tile, stride, a);
    *o_lo = 0;
    *o_hi = 0;
    if (a > 0) {
        int o = tw_axis_pos(ax, tile, stride, a - 1) + tile - pos;
        *o_lo = o > 0 ? o : 0;
    }
    if (a + 1 < ax->n_pos) {
        int o = pos + tile - tw_axis_pos(ax, tile, stride, a + 1);
        *o_hi = o > 0 ? o : 0;
    }
}

static const double k_pi = 3.14159265358979323846;

/* r(i) of blend.h for one edge: i pixels from it, overlap o, margin m. */
static double edge_weight(tw_blend_mode mode, int i, int o, int m)
{
    if (o <= 0) return 1.0;
    if (2 * m > o) m = o / 2;
    if (i < m) return 0.0;
    int e = o - 2 * m;
    if (i >= m + e) return 1.0;
    double t = (i - m + 0.5) / e;
    switch (mode) {
    case TW_BLEND_LINEAR: return t;
    case TW_BLEND_COSINE: return 0.5 - 0.5 * cos(k_pi * t);
    case TW_BLEND_MEAN:
    default: return 1.0;
    }
}

void tw_blend_axis_weights(tw_blend_mode mode, int tile, int margin, int o_lo, int o_hi, float *w)
{
    for (int j = 0; j < tile; j++)
        w[j] = (float)(edge_weight(mode, j, o_lo, margin) *
                       edge_weight(mode, tile - 1 - j, o_hi, margin));
}

size_t tw_blend_bytes(int width, int tile, int n_classes)
{
    size_t px = (size_t)tile * (size_t)width;
    return px * ((size_t)n_classes * sizeof(float) + sizeof(float) + 1) +
           2 * (size_t)tile * sizeof(float) + (size_t)n_classes * sizeof(int64_t) +
           sizeof(tw_blend) + 7 * 128; /* 7 blocks: core/alloc.c's header, 64-byte rounding */
}

/* The tile rows touching the band [row_begin, row_end). */
static void set_band(tw_blend *b)
{
    const tw_blend_params *p = &b->p;
    b->ty_begin = b->ay.n_pos;
    b->ty_end = 0;
    for (int a = 0; a < b->ay.n_pos; a++) {
        int y0 = tw_axis_pos(&b->ay, p->tile, p->stride, a);
        if (y0 < p->row_end && y0 + p->tile > p->row_begin) {
            if (a < b->ty_begin) b->ty_begin = a;
            b->ty_end = a + 1;
        }
    }
    if (b->ty_end < b->ty_begin) b->ty_end = b->ty_begin;
}

tw_status tw_blend_create(tw_blend_params p, tw_rows_fn sink, void *sink_user, tw_blend **out,
                          tw_error *err)
{
    *out = NULL;
    tw_status st = tw_blend_check(&p, err);
    if (st != TW_OK) return st;
    if (p.row_begin == 0 && p.row_end == 0) p.row_end = p.height;
    tw_blend *b = tw_calloc(TW_MEM_STRIP, 1, sizeof *b);
    size_t px = (size_t)p.tile * (size_t)p.width;
    if (b) {
        b->sum = tw_calloc(TW_MEM_STRIP, px * (size_t)p.n_classes, sizeof(float));
        b->wsum = tw_calloc(TW_MEM_STRIP, px, sizeof(float));
        b->has = tw_calloc(TW_MEM_STRIP, px, 1);
        b->wx = tw_calloc(TW_MEM_STRIP, (size_t)p.tile, sizeof(float));
        b->wy = tw_calloc(TW_MEM_STRIP, (size_t)p.tile, sizeof(float));
        b->hist = tw_calloc(TW_MEM_STRIP, (size_t)p.n_classes, sizeof(int64_t));
    }
    if (!b || !b->sum || !b->wsum || !b->has || !b->wx || !b->wy || !b->hist) {
        tw_blend_destroy(b);
        return tw_error_set(err, TW_ERR_NOMEM,
                            "cannot allocate the blending window (%d rows of %d pixels, %zu bytes)",
                            p.tile, p.width, tw_blend_bytes(p.width, p.tile, p.n_classes));
    }
    b->p = p;
    tw_axis_make(p.width, p.tile, p.stride, p.edge, &b->ax);
    tw_axis_make(p.height, p.tile, p.stride, p.edge, &b->ay);
    b->sink = sink;
    b->sink_user = sink_user;
    b->cur_ty = -1;
    b->last_tx = -1;
    b->next_row = p.row_begin;
    set_band(b);
    *out = b;
    return TW_OK;
}

tw_status tw_blend_reset(tw_blend *b, int row_begin, int row_end, tw_error *err)
{
    tw_blend_params p = b->p;
    p.row_begin = row_begin;
    p.row_end = row_end;
    tw_status st = tw_blend_check(&p, err);
    if (st != TW_OK) return st;
    if (p.row_begin == 0 && p.row_end == 0) p.row_end = p.height;
    b->p = p;
    size_t px = (size_t)p.tile * (size_t)p.width;
    memset(b->sum, 0, px * (size_t)p.n_classes * sizeof(float));
    memset(b->wsum, 0, px * sizeof(float));
    b->next_row = p.row_begin;
    b->cur_ty = -1;
    b->last_tx = -1;
    set_band(b);
    return TW_OK;
}

int tw_blend_held(const tw_blend *b, const float **sum, const float **wsum, int *rows)
{
    *sum = b->sum;
    *wsum = b->wsum;
    *rows = b->p.tile;
    return b->next_row;
}

void tw_blend_restore(tw_blend *b, int next_row, int tx, int ty, float **sum, float **wsum)
{
    TW_ASSERT(next_row >= b->p.row_begin && next_row <= b->p.row_end);
    TW_ASSERT(ty >= b->ty_begin && ty < b->ty_end && tx >= 0 && tx < b->ax.n_pos);
    b->next_row = next_row;
    /* tx 0: the row begins with the next add (and flushes above it) */
    b->cur_ty = tx > 0 ? ty : -1;
    b->last_tx = tx - 1;
    *sum = b->sum;
    *wsum = b->wsum;
}

void tw_blend_destroy(tw_blend *b)
{
    if (!b) return;
    tw_free(b->sum);
    tw_free(b->wsum);
    tw_free(b->has);
    tw_free(b->wx);
    tw_free(b->wy);
    tw_free(b->hist);
    tw_free(b);
}

void tw_blend_tiles(const tw_blend *b, int *nx, int *ty_begin, int *ty_end)
{
    if (nx) *nx = b->ax.n_pos;
    if (ty_begin) *ty_begin = b->ty_begin;
    if (ty_end) *ty_end = b->ty_end;
}

void tw_blend_tile_origin(const tw_blend *b, int tx, int ty, int *x0, int *y0)
{
    *x0 = tw_axis_pos(&b->ax, b->p.tile, b->p.stride, tx);
    *y0 = tw_axis_pos(&b->ay, b->p.tile, b->p.stride, ty);
}

/* Finish the first n held rows (n <= tile): normalise them in place, hand
 * them to the sink, slide the window down by n. */
static tw_status flush_rows(tw_blend *b, int n, tw_error *err)
{
    const int C = b->p.n_classes, W = b->p.width, T = b->p.tile;
    size_t npx = (size_t)n * (size_t)W;
    for (size_t q = 0; q < npx; q++) {
        float *o = b->sum + q * (size_t)C;
        float sw = b->wsum[q];
        b->has[q] = sw > 0.0f;
        if (!(sw > 0.0f)) {
            memset(o, 0, (size_t)C * sizeof(float));
            b->nodata_pixels++;
            continue;
        }
        /* a division, not a multiply by 1/sw: the formula's rounding */
        for (int c = 0; c < C; c++) o[c] /= sw;
        b->hist[tw_argmax(o, (size_t)C)]++;
    }
    if (b->sink) {
        tw_status st = b->sink(b->sink_user, b->next_row - b->p.row_begin, n, b->sum, b->has, err);
        if (st != TW_OK) return st;
    }
    size_t keep = (size_t)(T - n) * (size_t)W;
    memmove(b->sum, b->sum + npx * C, keep * C * sizeof(float));
    memmove(b->wsum, b->wsum + npx, keep * sizeof(float));
    memset(b->sum + keep * C, 0, npx * C * sizeof(float));
    memset(b->wsum + keep, 0, npx * sizeof(float));
    b->next_row += n;
    return TW_OK;
}

/* Finish rows [next_row, until), at most a window at a time; rows no tile
 * touched come out nodata. */
static tw_status flush_until(tw_blend *b, int until, tw_error *err)
{
    if (until > b->p.row_end) until = b->p.row_end;
    while (b->next_row < until) {
        int n = until - b->next_row;
        if (n > b->p.tile) n = b->p.tile;
        tw_status st = flush_rows(b, n, err);
        if (st != TW_OK) return st;
    }
    return TW_OK;
}

tw_status tw_blend_begin_row(tw_blend *b, int ty, tw_error *err)
{
    if (ty < b->ty_begin || ty >= b->ty_end || ty < b->cur_ty)
        return tw_error_set(err, TW_ERR_INTERNAL,
                            "blend: tile row %d begun after row %d (rows %d..%d, in order)", ty,
                            b->cur_ty, b->ty_begin, b->ty_end - 1);
    if (ty == b->cur_ty) return TW_OK;
    b->cur_ty = ty;
    b->last_tx = -1;
    return flush_until(b, tw_axis_pos(&b->ay, b->p.tile, b->p.stride, ty), err);
}

tw_status tw_blend_add(tw_blend *b, int tx, int ty, const float *probs, const uint8_t *valid,
                       tw_error *err)
{
    const tw_blend_params *p = &b->p;
    if (tx < 0 || tx >= b->ax.n_pos || ty < b->ty_begin || ty >= b->ty_end || ty < b->cur_ty ||
        (ty == b->cur_ty && tx <= b->last_tx))
        return tw_error_set(err, TW_ERR_INTERNAL,
                            "blend: tile (%d, %d) added after (%d, %d): tiles come in raster "
                            "order, tx in 0..%d, ty in %d..%d",
                            tx, ty, b->last_tx, b->cur_ty, b->ax.n_pos - 1, b->ty_begin,
                            b->ty_end - 1);
    tw_status st = tw_blend_begin_row(b, ty, err);
    if (st != TW_OK) return st;
    b->last_tx = tx;

    const int T = p->tile, C = p->n_classes, W = p->width;
    int x0, y0, olo, ohi;
    tw_blend_tile_origin(b, tx, ty, &x0, &y0);
    tw_blend_axis_overlaps(&b->ax, T, p->stride, tx, &olo, &ohi);
    tw_blend_axis_weights(p->mode, T, p->margin, olo, ohi, b->wx);
    tw_blend_axis_overlaps(&b->ay, T, p->stride, ty, &olo, &ohi);
    tw_blend_axis_weights(p->mode, T, p->margin, olo, ohi, b->wy);

    /* rows held and emitted, columns inside the raster */
    int i0 = b->next_row - y0 > 0 ? b->next_row - y0 : 0;
    int i1 = p->row_end - y0 < T ? p->row_end - y0 : T;
    int j1 = W - x0 < T ? W - x0 : T;
    if (i1 <= i0) return TW_OK;
    TW_ASSERT(y0 + i1 <= b->next_row + T);
    if (y0 + i1 - b->next_row > b->peak_rows) b->peak_rows = y0 + i1 - b->next_row;
    const size_t TT = (size_t)T * (size_t)T;
    for (int i = i0; i < i1; i++) {
        float wyi = b->wy[i];
        if (wyi == 0.0f) continue;
        size_t row = (size_t)(y0 + i - b->next_row) * (size_t)W + (size_t)x0;
        const uint8_t *v = valid ? valid + (size_t)i * T : NULL;
        const float *pr = probs + (size_t)i * T;
        for (int j = 0; j < j1; j++) {
            float w = wyi * b->wx[j];
            if (w == 0.0f || (v && !v[j])) continue;
            float *s = b->sum + (row + (size_t)j) * C;
            for (int c = 0; c < C; c++) s[c] += w * pr[(size_t)c * TT + (size_t)j];
            b->wsum[row + (size_t)j] += w;
        }
    }
    return TW_OK;
}

tw_status tw_blend_finish(tw_blend *b, tw_error *err)
{
    return flush_until(b, b->p.row_end, err);
}

int tw_blend_rows_done(const tw_blend *b)
{
    return b->next_row - b->p.row_begin;
}

int tw_blend_peak_rows(const tw_blend *b)
{
    return b->peak_rows;
}

const int64_t *tw_blend_histogram(const tw_blend *b, int64_t *nodata_pixels)
{
    if (nodata_pixels) *nodata_pixels = b->nodata_pixels;
    return b->hist;
}
