/* plan.c - see plan.h */
#include "pipeline/engine/plan.h"

/* In 64 bits: a raster may be 2^31-1 pixels wide, and a + b - 1 must not
 * overflow (the quotient always fits an int again). */
static int ceil_div(int64_t a, int64_t b)
{
    return (int)((a + b - 1) / b);
}

void tw_axis_make(int size, int T, int S, tw_edge_mode edge, tw_axis *ax)
{
    ax->size = size;
    ax->cell = S;
    ax->cells = ceil_div(size, S);
    ax->shifted = false;
    if (size <= T) {
        /* One tile at 0 covers everything; skip mode with size < T was
         * rejected by the caller; shift falls back to pad. */
        ax->n_aligned = 1;
    } else if (edge == TW_EDGE_PAD) {
        ax->n_aligned = ceil_div(size - T, S) + 1;
    } else {
        ax->n_aligned = (size - T) / S + 1;
        if (edge == TW_EDGE_SHIFT && (int64_t)(ax->n_aligned - 1) * S + T < size)
            ax->shifted = true;
    }
    ax->n_pos = ax->n_aligned + (ax->shifted ? 1 : 0);
}

int tw_axis_pos(const tw_axis *ax, int tile, int stride, int a)
{
    return a < ax->n_aligned ? a * stride : ax->size - tile;
}

void tw_axis_cells(const tw_axis *ax, int tile, int stride, int a, int *c0, int *c1)
{
    if (ax->cell != stride) {
        /* cells of another side (per pixel): those starting inside the tile */
        int64_t pos = tw_axis_pos(ax, tile, stride, a);
        *c0 = ceil_div(pos, ax->cell);
        *c1 = ceil_div(pos + tile, ax->cell);
        if (*c1 > ax->cells) *c1 = ax->cells;
        return;
    }
    int k = tile / stride;
    if (a < ax->n_aligned) {
        *c0 = a;
        *c1 = a + k;
    } else {
        /* The edge-flush tile feeds only the cells that start inside it;
         * the aligned tiles before it already cover the others. */
        *c0 = ceil_div(ax->size - tile, stride);
        *c1 = ax->cells;
    }
    if (*c1 > ax->cells) *c1 = ax->cells;
}

tw_status tw_plan_make(int width, int height, int tile, int stride, tw_edge_mode edge,
                       int shard_index, int shard_count, tw_plan *out, tw_error *err)
{
    return tw_plan_make_cell(width, height, tile, stride, stride, edge, shard_index, shard_count,
                             out, err);
}

tw_status tw_plan_make_cell(int width, int height, int tile, int stride, int cell,
                            tw_edge_mode edge, int shard_index, int shard_count, tw_plan *out,
                            tw_error *err)
{
    if (cell == stride && (tile <= 0 || stride <= 0 || tile % stride != 0))
        return tw_error_set(err, TW_ERR_CONFIG, "tiling.stride: %d does not divide tiling.tile %d",
                            stride, tile);
    if (cell != stride && (cell != 1 || stride < 1 || stride > tile))
        return tw_error_set(err, TW_ERR_CONFIG, "tiling.stride: %d is not in 1..tile %d", stride,
                            tile);
    if (width <= 0 || height <= 0)
        return tw_error_set(err, TW_ERR_INPUT, "raster has no pixels (%d x %d)", width, height);
    if (edge == TW_EDGE_SKIP && (width < tile || height < tile))
        return tw_error_set(err, TW_ERR_INPUT,
                            "raster is %d x %d, smaller than one %d-pixel tile, and tiling.edge "
                            "is skip: no tile fits (use edge: pad)",
                            width, height, tile);
    if (shard_count < 1 || shard_index < 0 || shard_index >= shard_count)
        return tw_error_set(err, TW_ERR_USAGE, "shard %d/%d is out of range", shard_index + 1,
                            shard_count);
    tw_plan *p = out;
    p->tile = tile;
    p->stride = stride;
    p->cell = cell;
    p->k = ceil_div(tile, cell);
    p->edge = edge;
    tw_axis_make(width, tile, stride, edge, &p->x);
    tw_axis_make(height, tile, stride, edge, &p->y);
    if (cell != stride) {
        p->x.cell = p->y.cell = cell;
        p->x.cells = ceil_div(width, cell);
        p->y.cells = ceil_div(height, cell);
    }
    p->grid_w = p->x.cells;
    p->grid_h = p->y.cells;

    /* Contiguous bands of output rows, as even as possible. */
    int64_t rows = p->grid_h;
    tw_plan_restrict(p, (int)(rows * shard_index / shard_count),
                     (int)(rows * (shard_index + 1) / shard_count));
    return TW_OK;
}

void tw_plan_restrict(tw_plan *p, int row_begin, int row_end)
{
    p->row_begin = row_begin;
    p->row_end = row_end;
    p->ty_begin = p->y.n_pos;
    p->ty_end = 0;
    for (int a = 0; a < p->y.n_pos; a++) {
        int c0, c1;
        tw_axis_cells(&p->y, p->tile, p->stride, a, &c0, &c1);
        if (c0 < p->row_end && c1 > p->row_begin) {
            if (a < p->ty_begin) p->ty_begin = a;
            p->ty_end = a + 1;
        }
    }
    if (p->ty_end < p->ty_begin) p->ty_end = p->ty_begin;
    p->n_tiles = (int64_t)(p->ty_end - p->ty_begin) * p->x.n_pos;
}

bool tw_tile_classified(int64_t n_nodata, int64_t n_inside, double max_nodata_fraction)
{
    return n_inside > 0 && n_nodata < n_inside &&
           (double)n_nodata / (double)n_inside <= max_nodata_fraction;
}
