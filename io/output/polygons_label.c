/* polygons_label.c - the polygons product's per-region statistics: a
 * streaming 4-connected labelling of the class map, row by row, in bounded
 * memory (polygons_internal.h; polygons.c, the writer, drives it). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "io/output/polygons_internal.h"

/* ---- per-region statistics: a streaming 4-connected labelling ----
 *
 * Row by row, the runs of equal class of the current row join the
 * components of the runs of the row above that they share an edge with
 * (union-find over component ids). A component that no run of the current
 * row reaches is finished: its record (first cell in raster order, class,
 * cells, confidence sum) is kept and its id reused. Memory: the runs of two
 * rows and the components they reach, plus one record per region. */

static int32_t lab_find(labeller *L, int32_t x)
{
    int32_t r = x;
    while (L->parent[r] != r) r = L->parent[r];
    while (L->parent[x] != r) {
        int32_t n = L->parent[x];
        L->parent[x] = r;
        x = n;
    }
    return r;
}

static int32_t lab_new(labeller *L, int32_t cls, int64_t first)
{
    int32_t id;
    if (L->n_free > 0) {
        id = L->free_ids[--L->n_free];
    } else {
        if (L->next_id == INT32_MAX) return -1;
        size_t need = (size_t)L->next_id + 1, c0 = L->cap, c1 = L->cap, c2 = L->cap;
        if (!grow((void **)&L->parent, &c0, need, sizeof *L->parent) ||
            !grow((void **)&L->mark, &c1, need, sizeof *L->mark) ||
            !grow((void **)&L->acc, &c2, need, sizeof *L->acc))
            return -1;
        L->cap = c0;
        id = L->next_id++;
    }
    L->parent[id] = id;
    L->mark[id] = -1;
    L->acc[id] = (region){.first = first, .cls = cls};
    return id;
}

static bool lab_free(labeller *L, int32_t id)
{
    if (!grow((void **)&L->free_ids, &L->free_cap, L->n_free + 1, sizeof *L->free_ids))
        return false;
    L->free_ids[L->n_free++] = id;
    return true;
}

/* Process row y (class values, confidence). Returns false when out of
 * memory. */
bool tw_poly_lab_row(labeller *L, int y, const uint8_t *cls, const float *conf)
{
    const int W = L->W;
    L->n_cur = 0;
    for (int x = 0; x < W;) {
        int x1 = x + 1;
        while (x1 < W && cls[x1] == cls[x]) x1++;
        if (cls[x] != NODATA) L->cur[L->n_cur++] = (run){x, x1, cls[x], -1};
        x = x1;
    }
    /* join the runs above that share an edge and a class */
    int j = 0;
    for (int i = 0; i < L->n_cur; i++) {
        run *c = &L->cur[i];
        while (j < L->n_prev && L->prev[j].x1 <= c->x0) j++;
        int32_t comp = -1;
        for (int k = j; k < L->n_prev && L->prev[k].x0 < c->x1; k++) {
            if (L->prev[k].cls != c->cls) continue;
            int32_t r = lab_find(L, L->prev[k].comp);
            if (comp < 0) {
                comp = r;
            } else if (r != comp) {
                region *a = &L->acc[comp], *b = &L->acc[r];
                a->cells += b->cells;
                a->conf_sum += b->conf_sum;
                if (b->first < a->first) a->first = b->first;
                L->parent[r] = comp;
            }
        }
        if (comp < 0) comp = lab_new(L, c->cls, (int64_t)y * W + c->x0);
        if (comp < 0) return false;
        double s = 0;
        for (int x = c->x0; x < c->x1; x++) s += conf ? conf[x] : 0.0;
        L->acc[comp].cells += c->x1 - c->x0;
        L->acc[comp].conf_sum += s;
        c->comp = comp;
    }
    /* the roots the current row reaches are alive */
    for (int i = 0; i < L->n_cur; i++) {
        L->cur[i].comp = lab_find(L, L->cur[i].comp);
        L->mark[L->cur[i].comp] = y;
    }
    /* every other id the row above held is merged away or finished */
    for (int k = 0; k < L->n_prev; k++) {
        int32_t x = L->prev[k].comp;
        for (;;) {
            int32_t up = L->parent[x];
            if (L->mark[x] == y) break; /* alive root */
            if (L->mark[x] != -2 - y) {
                if (up == x && !L->count_only) {
                    if (!grow((void **)&L->out, &L->out_cap, L->n_out + 1, sizeof *L->out))
                        return false;
                    L->out[L->n_out] = L->acc[x];
                }
                if (up == x) L->n_out++;
                L->mark[x] = -2 - y; /* freed in this row (reused from the next one) */
                if (!lab_free(L, x)) return false;
            }
            if (up == x) break;
            x = up;
        }
    }
    run *t = L->prev;
    L->prev = L->cur;
    L->cur = t;
    L->n_prev = L->n_cur;
    return true;
}

/* After the last row: the roots it reached are finished too. */
bool tw_poly_lab_end(labeller *L)
{
    for (int k = 0; k < L->n_prev; k++) {
        int32_t x = L->prev[k].comp;
        if (L->mark[x] == INT32_MIN) continue;
        if (!L->count_only) {
            if (!grow((void **)&L->out, &L->out_cap, L->n_out + 1, sizeof *L->out)) return false;
            L->out[L->n_out] = L->acc[x];
        }
        L->n_out++;
        L->mark[x] = INT32_MIN;
    }
    L->n_prev = 0;
    return true;
}

void tw_poly_lab_release(labeller *L)
{
    tw_free(L->parent);
    tw_free(L->mark);
    tw_free(L->acc);
    tw_free(L->free_ids);
    tw_free(L->prev);
    tw_free(L->cur);
    tw_free(L->out);
}

int tw_poly_cmp_region(const void *a, const void *b)
{
    int64_t x = ((const region *)a)->first, y = ((const region *)b)->first;
    return (x > y) - (x < y);
}
