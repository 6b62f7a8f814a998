/* stages_internal.h - what the stage files share: the workers and the
 * stage definitions (start/work/drain/stop), the pipe's small helpers, and
 * the calls the stages make into the driver. The parts and their jobs:
 *
 *   pipeline/engine/stages.c       the driver: the slot pool, int8's
 *                                  calibration sample, opening the input,
 *                                  batch claims, the threads and queues
 *   pipeline/engine/stage_read.c   read: a claimed batch's tile rows as
 *                                  strips, cut into the slot
 *   pipeline/engine/stage_infer.c  normalize and infer (two batches in
 *                                  flight on a backend that overlaps)
 *   pipeline/engine/stage_write.c  write: stitch in raster order, commit
 *                                  chunks, checkpoints, progress
 *
 * Private to pipeline/engine/: it is not installed and nothing outside it
 * includes it (scripts/check_layers.sh refuses it elsewhere). The public
 * calls stay in stages.h.
 */
#ifndef TW_STAGES_INTERNAL_H
#define TW_STAGES_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "pipeline/engine/stages.h"

/* ---- the pipe's helpers ---- */

static inline void pipe_abort(tw_pipe *pp)
{
    atomic_store(&pp->abort, 1);
    tw_queue_close(pp->q_free);
    tw_queue_close(pp->q_norm);
    tw_queue_close(pp->q_infer);
    tw_queue_close(pp->q_write);
}

static inline bool pipe_aborted(tw_pipe *pp)
{
    return atomic_load(&pp->abort) != 0;
}

static inline bool pipe_stop_requested(const tw_pipe *pp)
{
    return pp->hooks && pp->hooks->stop && __atomic_load_n(pp->hooks->stop, __ATOMIC_RELAXED) != 0;
}

/* The chunk of output rows holding `row`, inside segment seg: chunks lie on
 * a global grid of chunk_rows, cut by the segment's ends. */
static inline void pipe_chunk_of(const tw_pipe *pp, const tw_segment *seg, int row, int *r0,
                                 int *r1)
{
    int g0 = row / pp->chunk_rows * pp->chunk_rows;
    *r0 = g0 > seg->plan.row_begin ? g0 : seg->plan.row_begin;
    *r1 = g0 + pp->chunk_rows < seg->plan.row_end ? g0 + pp->chunk_rows : seg->plan.row_end;
}

/* Is a tile with n_nodata of its n_inside pixels (those inside the raster)
 * classified, or nodata in every output? (plan.h) */
static inline bool pipe_tile_classified(const tw_pipe *pp, int64_t n_nodata, int64_t n_inside)
{
    return tw_tile_classified(n_nodata, n_inside, pp->p->tiling.max_nodata_fraction);
}

static inline size_t pipe_raw_tile_bytes(const tw_pipe *pp, int tile)
{
    return (size_t)pp->norm.bands * (size_t)tile * (size_t)tile * tw_dtype_size(pp->dtype);
}

/* The one tw_infer_batch for slot s (n tiles). */
static inline tw_infer_batch pipe_slot_batch(const tw_pipe *pp, tw_slot *s, int n, int tile)
{
    return (tw_infer_batch){
        .n = n,
        .tile = tile,
        .x = s->x,
        .raw = s->raw,
        .raw_type = pp->dtype,
        .valid = s->valid,
        .norm = &pp->norm,
        .probs = s->probs,
        .emb = s->emb,
    };
}

/* Open the input with the nodata value the workflow asks for; a raster
 * replaced since the run began (another size, type or band count) is
 * refused (TW_ERR_PARTS). Each worker opens its own. */
tw_status pipe_open_input(const tw_pipe *pp, tw_raster **r, tw_error *err);

/* Where tile number t is: its segment, tile row and column. */
void pipe_locate(const tw_pipe *pp, int64_t t, int *si, int *ty, int *tx);

typedef struct batch_claim {
    int64_t seq, first;
    int n;
} batch_claim;

/* The next batch: up to `batch` tiles from next_tile on. A stop request
 * (SIGTERM, ...) ends the claims at once (stages.h, "Stopping"). false: no
 * more batches. */
bool pipe_claim_batch(tw_pipe *pp, batch_claim *c);

/* ---- the stages ---- */

typedef enum work_result {
    W_PASS, /* pass the slot on */
    W_END,  /* this worker is done: the slot goes back to the free queue */
    W_FAIL, /* the pipe was aborted (error or cancel) */
} work_result;

typedef struct worker {
    tw_pipe *pp;
    int index;
    double wait_s, t_start;
    /* infer stage */
    int64_t seq_end; /* 1 + the highest batch number inferred */
    /* with a backend that has infer_begin/infer_end */
    tw_slot *held; /* begun, not ended */
    int held_lane, lane;
    tw_queue *in; /* the stage's input queue */
    /* read stage */
    tw_raster *r;
    int *xs;
    int64_t *nod, *ins;
    int64_t bytes_read;
} worker;

typedef struct stage_def {
    int id; /* TW_STAGE_* */
    tw_status (*start)(worker *w);
    /* One slot in; out[0], out[1]: the slots to pass on, in that order (NULL:
     * none; out[0] is s on entry, out[1] NULL). A stage may hold s for later
     * and pass on one it held before. */
    work_result (*work)(worker *w, tw_slot *s, tw_slot **out);
    /* The input is drained (not after an abort): a slot still held, to pass
     * on, or NULL. NULL when the stage holds none. */
    tw_slot *(*drain)(worker *w);
    tw_status (*stop)(worker *w); /* after the last work, also after an abort */
} stage_def;

/* The four stages (stage_read.c, stage_infer.c, stage_write.c). */
extern const stage_def pipe_stage_read, pipe_stage_normalize, pipe_stage_infer, pipe_stage_write;

#endif
