/* plan.h - the tiling plan: where tiles go and which output cells they feed.
 *
 * Output cell (i, j) covers input rows [i*C, i*C+C) and cols [j*C, j*C+C),
 * C the cell's side; the grid is ceil(H/C) x ceil(W/C) whatever the edge
 * mode. A classifier's cell is its stride S (C = S): T = tile must be a
 * multiple of S (k = T/S), and an aligned tile at position a covers cells
 * [a, a+k). A segmentation model's cell is one pixel (C = 1, any S in
 * 1..T): a tile at position p covers cells [p, p+T). In general a tile
 * feeds the cells that start inside it. Per axis, edge mode decides the
 * last tiles:
 *   pad   aligned tiles until the raster is covered; the last ones read past
 *         the edge (padding is 0 after normalization, not counted as nodata)
 *   shift aligned tiles that fit, plus one tile flush with the edge
 *         (position size-T) feeding the cells that start inside it
 *         (falls back to pad when the raster is smaller than a tile)
 *   skip  only tiles that fit; the uncovered cells at the edge are nodata
 * Tiles are produced row by row (raster order). A shard owns a contiguous
 * band of output rows and runs every tile row that touches it.
 */
#ifndef TW_PLAN_H
#define TW_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"
#include "core/params.h"

typedef struct tw_axis {
    int size;      /* raster pixels along this axis */
    int cell;      /* an output cell's side: S (a classifier) or 1 (per pixel) */
    int cells;     /* output cells: ceil(size / cell) */
    int n_aligned; /* aligned tile positions a = 0..n_aligned-1 at a*S */
    bool shifted;  /* one more tile at size - T */
    int n_pos;     /* n_aligned + shifted */
} tw_axis;

typedef struct tw_plan {
    int tile, stride, k; /* k: cell rows a tile covers, ceil(T / cell) */
    int cell;            /* 1: per pixel (segmentation), else = stride */
    tw_edge_mode edge;
    tw_axis x, y;
    int grid_w, grid_h; /* = x.cells, y.cells */
    /* this shard */
    int row_begin, row_end; /* output cell rows owned, [begin, end) */
    int ty_begin, ty_end;   /* tile rows to run, [begin, end) */
    int64_t n_tiles;        /* tiles this shard runs */
} tw_plan;

/* Make the plan for a width x height raster. shard_index/shard_count split
 * the output rows in contiguous bands (count 1 = whole raster). Errors:
 * TW_ERR_CONFIG when tile % stride != 0, TW_ERR_INPUT when edge=skip and
 * the raster is smaller than one tile. */
tw_status tw_plan_make(int width, int height, int tile, int stride, tw_edge_mode edge,
                       int shard_index, int shard_count, tw_plan *out, tw_error *err);
/* The same with cells of `cell` pixels: cell == stride is tw_plan_make;
 * cell 1 is a segmentation model's per-pixel grid, for any stride in
 * 1..tile (TW_ERR_CONFIG outside it). */
tw_status tw_plan_make_cell(int width, int height, int tile, int stride, int cell,
                            tw_edge_mode edge, int shard_index, int shard_count, tw_plan *out,
                            tw_error *err);

/* Narrow a plan to output rows [row_begin, row_end) (within the grid): the
 * tile rows to run become those touching them. Cannot fail. */
void tw_plan_restrict(tw_plan *p, int row_begin, int row_end);

/* The tile positions along one axis of `size` pixels for tile T, stride S
 * and an edge mode (the rules above; cells = ceil(size / S)). Any S in
 * 1..T works here (blend.h's per-pixel tiling); tw_plan_make alone asks
 * that S divide T. Cannot fail. */
void tw_axis_make(int size, int T, int S, tw_edge_mode edge, tw_axis *ax);
/* Pixel position of tile index a along an axis. */
int tw_axis_pos(const tw_axis *ax, int tile, int stride, int a);
/* Cells [*c0, *c1) fed by tile index a along an axis (clipped to the grid):
 * those that start inside the tile. */
void tw_axis_cells(const tw_axis *ax, int tile, int stride, int a, int *c0, int *c1);

/* Is a tile with n_nodata nodata pixels of its n_inside pixels inside the
 * raster classified, or nodata in every output? Classified when some
 * inside pixel is valid and the nodata share is at most
 * max_nodata_fraction (tiling.max_nodata_fraction). The one rule of the
 * run's readers, validate's advice and the C API's in-memory tiles. */
bool tw_tile_classified(int64_t n_nodata, int64_t n_inside, double max_nodata_fraction);

#endif
