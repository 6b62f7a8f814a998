/* blend.h - per-pixel blending of overlapping segmentation tiles in a window
 * of output rows; finished rows to the writer.
 *
 * A segmentation model gives every pixel of a T x T tile a probability per
 * class. Tiles overlap when the stride S is below T (any S in 1..T: the
 * output is per pixel, so S need not divide T). Each pixel of the raster
 * gets the weighted mean of the tiles covering it (tiling.blend and
 * tiling.margin in workflows/KEYS.md):
 *
 *   out(x, y, c) = sum_t w_t(x, y) p_t(x, y, c) / sum_t w_t(x, y)
 *
 * over the tiles t added (classified) whose pixel (x, y) is valid input.
 * A pixel where that sum of weights is 0 - no classified tile covers it,
 * its input is nodata in every tile, or (margin > 0) only tiles whose
 * margin it lies in were classified - is nodata: has 0, probabilities 0.
 *
 * Geometry. Tile positions per axis are plan.c's (tw_axis_make): aligned
 * tiles at a*S; by tiling.edge the last ones read past the raster's edge
 * (pad), one more tile sits flush with the edge (shift), or the pixels no
 * tile fits are left out (skip: nodata). Tile pixels outside the raster
 * are dropped.
 *
 * Weights. Along one axis, tile a has overlaps o_lo = pos(a-1) + T - pos(a)
 * with the tile before it and o_hi = pos(a) + T - pos(a+1) with the tile
 * after it; o = 0 where there is no such tile (the raster's first and last
 * tiles) or the two do not overlap (S = T). With m = tiling.margin, the
 * edge's ramp over e = o - 2m pixels, i the pixel's distance from that edge
 * (0 = the edge pixel) and t = (i - m + 0.5) / e:
 *
 *   r(i) = 1            o = 0 (no neighbour: full weight, no margin)
 *        = 0            i < m            (the margin: taken from the neighbour)
 *        = f(t)         m <= i < m + e   (the ramp)
 *        = 1            i >= m + e
 *
 *   f(t) = 1 (mean), t (linear), 0.5 - 0.5 cos(pi t) (cosine)
 *
 * The tile's pixel j (0..T-1) along the axis weighs w(j) = r_lo(j) *
 * r_hi(T-1-j), and its pixel (row i, column j) w = w_y(i) * w_x(j). f(t) +
 * f(1-t) = 1, so where two tiles overlap their ramps add up to 1 (their
 * common overlap puts t and 1-t on the same pixel); with S < T/2 more tiles
 * overlap and the division by sum w normalises. The weights are symmetric
 * (a mirrored tile gets mirrored weights), > 0 outside the margins, and
 * every pixel some tile covers has a tile of weight > 0 when
 * m <= tw_blend_max_margin(T, S) = floor((T - S) / 2): each neighbour pair
 * overlaps by o >= T - S >= 2m pixels, so their unmargined parts touch.
 *
 * Memory and order. The blender holds T output rows (tw_blend_bytes), never
 * a number that grows with the raster's height: when tile row ty starts,
 * every row above its first pixel row is final, is normalised and goes to
 * the sink. Tiles come in the plan's raster order - tile rows in order and,
 * within a row, tx ascending (tiles not classified are left out) - which is
 * the order the pipeline's write stage sees them whatever the batch size
 * or the readers' order (stages.h). Each pixel's sums therefore add the
 * same terms in the same order on every run: the result is bit-identical
 * for any batch. A tile out of that order is refused (TW_ERR_INTERNAL), as
 * summing it anyway would make the bytes depend on the arrival order.
 *
 * Not thread-safe: one write stage owns a blender. Allocation happens in
 * create only.
 */
#ifndef TW_BLEND_H
#define TW_BLEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/params.h"
#include "pipeline/engine/plan.h"
#include "pipeline/engine/stitch.h"

/* "mean", "linear", "cosine"; NULL for a value out of range. */
const char *tw_blend_mode_name(tw_blend_mode mode);
/* The mode of a name (as tiling.blend spells it); false when unknown. */
bool tw_blend_mode_from_name(const char *name, tw_blend_mode *mode);

typedef struct tw_blend_params {
    int width, height; /* raster pixels */
    int tile, stride;  /* tiling.tile, tiling.stride (1..tile) */
    tw_edge_mode edge; /* tiling.edge */
    tw_blend_mode mode;
    int margin;    /* tiling.margin, 0..tw_blend_max_margin(tile, stride) */
    int n_classes; /* values per pixel */
    /* Output rows this blender emits, [row_begin, row_end) (a shard's or a
     * resumed segment's band); both 0: every row of the raster. */
    int row_begin, row_end;
} tw_blend_params;

/* mean, margin 0, edge pad, every row; the geometry and n_classes are 0
 * (to be set). */
tw_blend_params tw_blend_default_params(void);

/* The largest tiling.margin for a tile and stride: floor((tile - stride) / 2). */
int tw_blend_max_margin(int tile, int stride);

/* Check params without allocating: TW_ERR_CONFIG naming tiling.stride (not
 * in 1..tile), tiling.margin (negative, or above the largest allowed,
 * which the message gives), tiling.blend (unknown mode); TW_ERR_INPUT for
 * a raster without pixels or smaller than a tile with edge skip;
 * TW_ERR_INTERNAL for bad n_classes or rows. */
tw_status tw_blend_check(const tw_blend_params *p, tw_error *err);

/* The overlaps of tile a along an axis with the tile before and after it
 * (0: none); ax from tw_axis_make with the same tile and stride. Cannot
 * fail. */
void tw_blend_axis_overlaps(const tw_axis *ax, int tile, int stride, int a, int *o_lo, int *o_hi);

/* The weights w[0..tile) of a tile's pixels along one axis (the formula
 * above) for overlaps o_lo, o_hi (0: no neighbour). A margin above o/2 is
 * taken as o/2 (no ramp). Cannot fail; allocates nothing. */
void tw_blend_axis_weights(tw_blend_mode mode, int tile, int margin, int o_lo, int o_hi, float *w);

typedef struct tw_blend tw_blend;

/* Make a blender (after tw_blend_check's checks: the same errors, or
 * TW_ERR_NOMEM). Finished rows go to sink (may be NULL: nothing written;
 * the histogram still counts) as tw_rows_fn says: rows [row0, row0 + n)
 * relative to row_begin, probs [n][width][n_classes], has [n][width];
 * both borrowed for the call. sink_user is borrowed and must outlive the
 * blender. */
tw_status tw_blend_create(tw_blend_params p, tw_rows_fn sink, void *sink_user, tw_blend **out,
                          tw_error *err);
/* Accepts NULL. */
void tw_blend_destroy(tw_blend *b);

/* The tiles to add: tx in [0, *nx), tile rows [*ty_begin, *ty_end) (those
 * touching the rows emitted). Any pointer may be NULL. */
void tw_blend_tiles(const tw_blend *b, int *nx, int *ty_begin, int *ty_end);
/* Pixel position of tile (tx, ty)'s first column and row. */
void tw_blend_tile_origin(const tw_blend *b, int tx, int ty, int *x0, int *y0);

/* Tiles of tile row ty follow: finishes (sinks) every row above its first
 * pixel row. Called by tw_blend_add when a tile starts a new row; call it
 * directly for a row whose tiles were all left out, to write rows earlier.
 * Errors: the sink's; TW_ERR_INTERNAL for a row before the current one. */
tw_status tw_blend_begin_row(tw_blend *b, int ty, tw_error *err);

/* Add tile (tx, ty)'s probabilities: probs [n_classes][tile][tile] (one
 * tile of a network's NCHW output), valid [tile][tile] (0: the input pixel
 * is nodata, it adds nothing) or NULL (all valid). Both borrowed for the
 * call. Errors: TW_ERR_INTERNAL for a tile outside the plan or out of
 * raster order (see above), before changing anything; the sink's. */
tw_status tw_blend_add(tw_blend *b, int tx, int ty, const float *probs, const uint8_t *valid,
                       tw_error *err);

/* Finish every remaining row. Errors: the sink's. */
tw_status tw_blend_finish(tw_blend *b, tw_error *err);

/* Start over on another band of rows [row_begin, row_end) of the same
 * raster and tiling (a resumed run's next segment; both 0: every row): the
 * held rows are cleared, the histogram keeps counting. Allocates nothing.
 * Errors: TW_ERR_INTERNAL for rows outside the raster (nothing changed). */
tw_status tw_blend_reset(tw_blend *b, int row_begin, int row_end, tw_error *err);

/* The held rows, for a checkpoint: returns the first row still held
 * (absolute); *sum [tile][width][n_classes] (sum w p) and *wsum
 * [tile][width] (sum w) are borrowed, valid until the next call that
 * changes the blender; *rows the rows held (tile, also past the raster's
 * end, where they are 0). */
int tw_blend_held(const tw_blend *b, const float **sum, const float **wsum, int *rows);
/* Put held rows back (after create or reset on the same band): next_row
 * becomes the first row held, tile (tx, ty) the next to add (tiles before
 * it in its row were added when the rows were saved; tx 0: the row has not
 * begun), and *sum, *wsum receive the buffers to fill with what
 * tw_blend_held gave (borrowed, as above). The tiles that follow then add
 * to each pixel's sums in the same order as in an uninterrupted run: the
 * same bytes. next_row must lie in [row_begin, row_end] and ty among the
 * tile rows. Cannot fail. */
void tw_blend_restore(tw_blend *b, int next_row, int tx, int ty, float **sum, float **wsum);

/* Rows finished so far (relative to row_begin). */
int tw_blend_rows_done(const tw_blend *b);
/* The most rows held at once so far: the rows between the first unfinished
 * one and the lowest one a tile touched (at most tile, whatever the raster's
 * height). */
int tw_blend_peak_rows(const tw_blend *b);
/* Pixels per class written so far (argmax of the probabilities) and nodata
 * pixels. Borrowed: [n_classes] counts, valid until destroy. */
const int64_t *tw_blend_histogram(const tw_blend *b, int64_t *nodata_pixels);

/* Bytes a blender holds for a raster width, tile and classes (for the
 * memory budget): tile rows of width pixels, each n_classes float sums,
 * a float sum of weights and a has byte, plus the weights and histogram. */
size_t tw_blend_bytes(int width, int tile, int n_classes);

#endif
