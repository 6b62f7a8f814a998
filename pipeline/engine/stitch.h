/* stitch.h - overlap averaging in a strip buffer, finished rows to the writer.
 *
 * Tiles arrive in raster order. Each classified tile adds its probabilities
 * to every output cell it covers (plan.h); a cell's value is the mean over
 * the tiles that covered it. Only k = tile/stride rows of cells are held:
 * when a new tile row starts, every row above its first cell row is final
 * and goes to the writer. Allocation happens in create only.
 *
 * A checkpoint (stages.h) saves what the stitcher holds - the running sums
 * and counts of its k rows, exactly as they are - and a resumed run puts
 * them back (tw_stitch_restore) before adding the tiles that follow: each
 * cell's sum then sees the same additions in the same order as in an
 * uninterrupted run, so its bytes are the same.
 */
#ifndef TW_STITCH_H
#define TW_STITCH_H

#include <stdint.h>

#include "pipeline/engine/plan.h"

typedef struct tw_stitch tw_stitch;

/* Where finished rows go: rows [row0, row0 + n) relative to the shard's
 * first row; probs [n][grid_w][n_classes] averaged, has [n][grid_w] 1 where
 * some tile covered the cell. tw_writer_write_rows has this shape. */
typedef tw_status (*tw_rows_fn)(void *user, int row0, int n, const float *probs, const uint8_t *has,
                                tw_error *err);

/* sink may be NULL (nothing written; the class histogram is still kept).
 * Borrowed: plan and sink_user must outlive the stitcher. */
tw_status tw_stitch_create(const tw_plan *plan, int n_classes, tw_rows_fn sink, void *sink_user,
                           tw_stitch **out, tw_error *err);
/* The same with n_emb embedding values after the n_probs probabilities of
 * each cell (embedding_raster): they are averaged alike, the sink gets
 * [n][grid_w][n_probs + n_emb], and the histogram counts the argmax of the
 * n_probs (none when 0). */
tw_status tw_stitch_create_ex(const tw_plan *plan, int n_probs, int n_emb, tw_rows_fn sink,
                              void *sink_user, tw_stitch **out, tw_error *err);
void tw_stitch_destroy(tw_stitch *s);

/* Announce that tiles of tile row ty follow: finishes the rows above it. */
tw_status tw_stitch_begin_row(tw_stitch *s, int ty, tw_error *err);
/* Add one classified tile (tx, ty) of the current row; probs [n_classes]. */
void tw_stitch_add(tw_stitch *s, int tx, int ty, const float *probs);
/* The same for a stitcher of tw_stitch_create_ex: probs [n_probs], emb
 * [n_emb] (may be NULL when n_emb is 0). */
void tw_stitch_add_emb(tw_stitch *s, int tx, int ty, const float *probs, const float *emb);
/* Finish every remaining row of the shard. */
tw_status tw_stitch_finish(tw_stitch *s, tw_error *err);

/* Finish the rows above `row` (absolute output row), e.g. to stop at a
 * chunk boundary. */
tw_status tw_stitch_flush_until(tw_stitch *s, int row, tw_error *err);
/* Start over on another plan with the same grid width and k (a new band of
 * rows); the histogram keeps counting. Allocates nothing. */
void tw_stitch_reset(tw_stitch *s, const tw_plan *plan);

/* The held rows, for a checkpoint: returns the first row still held
 * (absolute); *sum [k][grid_w][n_classes] and *count [k][grid_w] are
 * borrowed, valid until the next call that changes the stitcher; *k the
 * rows held (the plan's k, also past the plan's end, where they are 0). */
int tw_stitch_held(const tw_stitch *s, const float **sum, const uint32_t **count, int *k);
/* Put held rows back after tw_stitch_reset on the same plan: next_row
 * becomes the first row held and *sum, *count receive the k rows' buffers
 * to fill (borrowed, as above). next_row must lie in the plan's rows.
 * Cannot fail. */
void tw_stitch_restore(tw_stitch *s, int next_row, float **sum, uint32_t **count);

/* Output cells per class written so far (argmax), and nodata cells.
 * Borrowed: [n_classes] counts, valid until destroy. */
const int64_t *tw_stitch_histogram(const tw_stitch *s, int64_t *nodata_cells);
/* Output rows finished so far. */
int tw_stitch_rows_done(const tw_stitch *s);
/* Bytes the stitcher holds for a plan (for the memory budget); n_classes:
 * the values per cell (n_probs + n_emb). */
size_t tw_stitch_bytes(const tw_plan *plan, int n_classes);

#endif
