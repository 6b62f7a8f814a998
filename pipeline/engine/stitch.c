/* stitch.c - see stitch.h */
#include "pipeline/engine/stitch.h"

#include <string.h>

#include "core/alloc.h"
#include "core/argmax.h"

struct tw_stitch {
    const tw_plan *plan;
    tw_rows_fn sink;
    void *sink_user;
    int n_classes, k, grid_w;
    int n_hist;      /* the classes among the n_classes values (argmax, histogram) */
    int next_row;    /* first row still held = first row of the buffer */
    float *sum;      /* [k][grid_w][n_classes] */
    uint32_t *count; /* [k][grid_w] */
    float *out;      /* [k][grid_w][n_classes] averaged, handed to the writer */
    uint8_t *has;    /* [k][grid_w] */
    int64_t *hist;   /* [n_classes] */
    int64_t nodata_cells;
};

size_t tw_stitch_bytes(const tw_plan *plan, int n_classes)
{
    size_t cells = (size_t)plan->k * (size_t)plan->grid_w;
    return cells * (2 * (size_t)n_classes * sizeof(float) + sizeof(uint32_t) + 1) +
           (size_t)n_classes * sizeof(int64_t) + 5 * 64;
}

tw_status tw_stitch_create(const tw_plan *plan, int n_classes, tw_rows_fn sink, void *sink_user,
                           tw_stitch **out, tw_error *err)
{
    return tw_stitch_create_ex(plan, n_classes, 0, sink, sink_user, out, err);
}

tw_status tw_stitch_create_ex(const tw_plan *plan, int n_probs, int n_emb, tw_rows_fn sink,
                              void *sink_user, tw_stitch **out, tw_error *err)
{
    const int n_classes = n_probs + n_emb; /* values per cell */
    *out = NULL;
    tw_stitch *s = tw_calloc(TW_MEM_STRIP, 1, sizeof *s);
    size_t cells = (size_t)plan->k * (size_t)plan->grid_w;
    if (s) {
        s->sum = tw_calloc(TW_MEM_STRIP, cells * (size_t)n_classes, sizeof(float));
        s->out = tw_calloc(TW_MEM_STRIP, cells * (size_t)n_classes, sizeof(float));
        s->count = tw_calloc(TW_MEM_STRIP, cells, sizeof(uint32_t));
        s->has = tw_calloc(TW_MEM_STRIP, cells, 1);
        s->hist = tw_calloc(TW_MEM_STRIP, (size_t)(n_probs > 0 ? n_probs : 1), sizeof(int64_t));
    }
    if (!s || !s->sum || !s->out || !s->count || !s->has || !s->hist) {
        tw_stitch_destroy(s);
        return tw_error_set(err, TW_ERR_NOMEM,
                            "cannot allocate the output strip buffer (%zu cells)", cells);
    }
    s->plan = plan;
    s->sink = sink;
    s->sink_user = sink_user;
    s->n_classes = n_classes;
    s->n_hist = n_probs;
    s->k = plan->k;
    s->grid_w = plan->grid_w;
    s->next_row = plan->row_begin;
    *out = s;
    return TW_OK;
}

void tw_stitch_destroy(tw_stitch *s)
{
    if (!s) return;
    tw_free(s->sum);
    tw_free(s->out);
    tw_free(s->count);
    tw_free(s->has);
    tw_free(s->hist);
    tw_free(s);
}

/* Write the first n held rows and slide the window down by n. */
static tw_status flush_rows(tw_stitch *s, int n, tw_error *err)
{
    if (n <= 0) return TW_OK;
    const int C = s->n_classes, W = s->grid_w;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < W; j++) {
            size_t cell = (size_t)i * W + j;
            uint32_t c = s->count[cell];
            float *o = s->out + cell * C;
            const float *sm = s->sum + cell * C;
            s->has[cell] = c > 0;
            if (c == 0) {
                memset(o, 0, (size_t)C * sizeof(float));
                s->nodata_cells++;
                continue;
            }
            float inv = 1.0f / (float)c;
            for (int q = 0; q < C; q++) o[q] = c == 1 ? sm[q] : sm[q] * inv;
            if (s->n_hist > 0) s->hist[tw_argmax(o, (size_t)s->n_hist)]++;
        }
    }
    if (s->sink) {
        tw_status st =
            s->sink(s->sink_user, s->next_row - s->plan->row_begin, n, s->out, s->has, err);
        if (st != TW_OK) return st;
    }
    size_t row_cells = (size_t)W;
    size_t keep = (size_t)(s->k - n) * row_cells;
    memmove(s->sum, s->sum + (size_t)n * row_cells * C, keep * C * sizeof(float));
    memmove(s->count, s->count + (size_t)n * row_cells, keep * sizeof(uint32_t));
    memset(s->sum + keep * C, 0, (size_t)n * row_cells * C * sizeof(float));
    memset(s->count + keep, 0, (size_t)n * row_cells * sizeof(uint32_t));
    s->next_row += n;
    return TW_OK;
}

/* Finish rows [next_row, until), at most k at a time (the buffer height);
 * rows beyond the held window were never touched and come out as nodata. */
static tw_status flush_until(tw_stitch *s, int until, tw_error *err)
{
    if (until > s->plan->row_end) until = s->plan->row_end;
    while (s->next_row < until) {
        int n = until - s->next_row;
        if (n > s->k) n = s->k;
        tw_status st = flush_rows(s, n, err);
        if (st != TW_OK) return st;
    }
    return TW_OK;
}

tw_status tw_stitch_begin_row(tw_stitch *s, int ty, tw_error *err)
{
    int c0, c1;
    tw_axis_cells(&s->plan->y, s->plan->tile, s->plan->stride, ty, &c0, &c1);
    return flush_until(s, c0, err);
}

void tw_stitch_add(tw_stitch *s, int tx, int ty, const float *probs)
{
    TW_ASSERT(s->n_hist == s->n_classes);
    tw_stitch_add_emb(s, tx, ty, probs, NULL);
}

void tw_stitch_add_emb(tw_stitch *s, int tx, int ty, const float *probs, const float *emb)
{
    const tw_plan *p = s->plan;
    int r0, r1, c0, c1;
    tw_axis_cells(&p->y, p->tile, p->stride, ty, &r0, &r1);
    tw_axis_cells(&p->x, p->tile, p->stride, tx, &c0, &c1);
    if (r0 < s->next_row) r0 = s->next_row;
    if (r1 > p->row_end) r1 = p->row_end;
    TW_ASSERT(r1 <= s->next_row + s->k);
    const int C = s->n_classes, K = s->n_hist, E = C - K;
    for (int r = r0; r < r1; r++) {
        size_t base = (size_t)(r - s->next_row) * s->grid_w;
        for (int c = c0; c < c1; c++) {
            float *sm = s->sum + (base + c) * C;
            for (int q = 0; q < K; q++) sm[q] += probs[q];
            for (int q = 0; q < E; q++) sm[K + q] += emb[q];
            s->count[base + c]++;
        }
    }
}

tw_status tw_stitch_finish(tw_stitch *s, tw_error *err)
{
    return flush_until(s, s->plan->row_end, err);
}

const int64_t *tw_stitch_histogram(const tw_stitch *s, int64_t *nodata_cells)
{
    if (nodata_cells) *nodata_cells = s->nodata_cells;
    return s->hist;
}

int tw_stitch_rows_done(const tw_stitch *s)
{
    return s->next_row - s->plan->row_begin;
}

tw_status tw_stitch_flush_until(tw_stitch *s, int row, tw_error *err)
{
    return flush_until(s, row, err);
}

void tw_stitch_reset(tw_stitch *s, const tw_plan *plan)
{
    TW_ASSERT(plan->grid_w == s->grid_w && plan->k == s->k);
    size_t cells = (size_t)s->k * (size_t)s->grid_w;
    memset(s->sum, 0, cells * (size_t)s->n_classes * sizeof(float));
    memset(s->count, 0, cells * sizeof(uint32_t));
    s->plan = plan;
    s->next_row = plan->row_begin;
}

int tw_stitch_held(const tw_stitch *s, const float **sum, const uint32_t **count, int *k)
{
    *sum = s->sum;
    *count = s->count;
    *k = s->k;
    return s->next_row;
}

void tw_stitch_restore(tw_stitch *s, int next_row, float **sum, uint32_t **count)
{
    TW_ASSERT(next_row >= s->plan->row_begin && next_row <= s->plan->row_end);
    s->next_row = next_row;
    *sum = s->sum;
    *count = s->count;
}
