/* stages.h - one input's pipeline: stage workers joined by queues of batch slots.
 *
 *   read (N workers) -> normalize -> infer -> write (stitch, commit chunks)
 *
 * A stage is a set of workers, each with start/work/stop (STYLE.md rule 10):
 * start takes what the worker owns (a reader: its own dataset and read
 * strip), work moves one batch slot along and takes no lock beyond its
 * queues, stop releases. tw_pipe_run starts every worker on its own thread,
 * closes a stage's output queue when its last worker has stopped, and joins
 * them all. An error or a cancel closes every queue: each worker then stops.
 *
 * Batches. The tiles still to run (the segments, in raster order) are
 * numbered 0..n_tiles-1 and cut into batches of `batch` consecutive tiles;
 * batch k has sequence number k. A reader claims the next batch, reads its
 * tile rows as strips (one read per row of tiles, tw_raster_read_tiles) into
 * the slot, and passes it on; readers finish in any order. The write stage
 * pops through an ordered queue (queue.h), so the stitcher sees tiles in
 * raster order. The reorder window is the slot pool itself: every batch in
 * flight holds a slot, so it is bounded and counted by the budget.
 *
 * Stopping (SIGTERM, SIGINT, SIGUSR1: hooks->stop). The bound is 10 s
 * whatever the model, tile or raster width, so nothing waits for a chunk
 * or a tile row to end (a row of a raster 10^7 pixels wide is 156,250
 * tiles). What a stop request still costs, in order:
 *   - the claims end at once; a reader drops the batch it is reading at
 *     its next strip (it would not be inferred);
 *   - the infer stage finishes the batch it is computing (one batch: with
 *     the CPU's auto batch a fraction of a second to ~1 s; a batch set by
 *     hand is that batch's time) and runs only batches that fill a gap
 *     before one already inferred (several readers end out of order); the
 *     rest pass through not run, as do queued batches;
 *   - the write stage stitches the batches inferred, in order, up to the
 *     first one not run, and takes a checkpoint there (parts.h): the
 *     finished rows are committed, the stitcher's held rows (its strip of
 *     the budget: k x grid_w x classes floats, 12 MB for a row 10^7 pixels
 *     wide at stride 32 and 4 classes) and the row's tile records saved,
 *     with a few fsyncs.
 * So every tile classified before the stop is kept (the exception: batches
 * inferred after one a reader dropped half read) and a rerun resumes at
 * the next tile, skipping the segment's tiles before it (tw_segment.skip).
 * Not bounded here: a remote read under way finishes its retries, and a
 * stop that comes once every tile is in waits for the final products.
 * The same checkpoint is taken every TW_CHECKPOINT_S seconds when no chunk
 * was committed meanwhile (a long row), so a kill -9 loses at most that;
 * never more often than keeps its cost under 2 % of the run. The outputs
 * are those of an uninterrupted run byte for byte: the checkpoint holds
 * the stitcher's sums as they are, and the tiles after it add to them in
 * the same order (stitch.h); shards checkpoint their own rows.
 *
 * Internal to pipeline/: run.c fills a tw_pipe and drives it.
 */
#ifndef TW_STAGES_H
#define TW_STAGES_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/alloc.h"
#include "io/input/aoi.h"
#include "io/input/raster.h"
#include "model/backend.h"
#include "pipeline/engine/budget.h"
#include "pipeline/store/parts.h"
#include "pipeline/engine/plan.h"
#include "pipeline/engine/queue.h"
#include "pipeline/resolved.h"
#include "pipeline/result.h"
#include "pipeline/engine/stitch.h"
#include "pipeline/engine/blend.h"

typedef struct tw_tile_ref {
    int32_t tx, ty;
    int32_t seg;  /* index of the row segment the tile was read for */
    int32_t kept; /* index into the slot's kept tiles, -1: not classified */
    uint8_t read_error;
    uint8_t outside_aoi; /* not read nor classified: outside input.aoi */
} tw_tile_ref;

/* One batch slot: everything a batch needs from its read to its write. */
typedef struct tw_slot {
    int64_t seq;   /* the batch's sequence number */
    int64_t first; /* its first tile's number (tw_segment.first) */
    int n_tiles;   /* tiles claimed: refs once read */
    bool dropped;  /* not read or not inferred after a stop request */
    int n_refs, n_kept;
    tw_tile_ref *refs;    /* [batch]: every tile of the batch, in raster order */
    void *raw;            /* [batch][bands][T][T] raw type: kept tiles only */
    bool raw_backend;     /* raw came from the backend's host_alloc (pinned) */
    uint8_t *valid;       /* [batch][T][T] */
    float *x;             /* [batch][bands][T][T], NULL when the backend normalizes */
    float *probs;         /* [batch][classes], or [batch][classes][T][T] (segmentation) */
    float *emb;           /* [batch][feat] or NULL */
    int32_t *orow, *ocol; /* [batch] tile origins, for the tile table */
} tw_slot;

/* A band of output rows still to do (rows not committed by an earlier run):
 * the readers run the tile rows touching it, the stitcher averages them. */
typedef struct tw_segment {
    tw_plan plan;  /* restricted to the segment's rows */
    int64_t first; /* number of its first tile run among all segments' tiles */
    int64_t skip;  /* its first tiles, stitched by an earlier run (a checkpoint) */
} tw_segment;

/* Seconds between checkpoints of a long chunk (tw_pipe.checkpoint_s = 0). */
#define TW_CHECKPOINT_S 5.0

typedef struct tw_pipe {
    /* Set by the driver before tw_pipe_slots_alloc / tw_pipe_run. */
    const tw_run_params *p;
    const tw_resolved *m;
    const tw_budget *bud; /* batch, slots, readers, read strip width */
    tw_backend *be;
    const tw_run_hooks *hooks;
    const char *path;    /* what the readers open (a URL, a STAC item's VRT, a file) */
    const char *display; /* how messages and progress name the input (redacted) */
    tw_dtype dtype;
    /* The input as the run recorded it before its first tile (the plan's
     * and the slots' geometry), or NULL: a reader that opens a raster of
     * another size or type (replaced since) stops the run (exit 6). */
    const tw_raster_info *info;
    tw_norm norm;
    bool wants_raw;
    int norm_threads; /* the normalize stage's OpenMP threads (tw_run_normalize_threads) */
    bool want_emb;
    tw_segment *segs; /* in raster order, `first` filled */
    int n_segs;
    int chunk_rows;
    double checkpoint_s; /* 0: TW_CHECKPOINT_S */
    int64_t n_tiles;     /* over all segments (tw_pipe_run deducts the skipped ones) */
    tw_stitch *stitch;   /* a classifier's cells, or */
    tw_blend *blend;     /* a segmentation model's pixels (m->segmentation) */
    tw_parts *parts;
    tw_input_result *res; /* stage seconds, tile counts, reader, bytes read */
    const tw_aoi *aoi;    /* input.aoi, or NULL: every tile */
    tw_error *err;
    const tw_log *log; /* warnings (unreadable tiles) and notices; may be NULL */

    /* Private to the stage files (stages.c, stage_*.c: stages_internal.h). */
    tw_slot *slots;
    int n_slots;
    tw_queue *q_free, *q_norm, *q_infer, *q_write;
    tw_tiff_cache *tiles; /* decoded TIFF tiles, shared by the readers */
    atomic_int abort;     /* an error or a cancel: every stage stops */
    atomic_int cancelled;
    pthread_mutex_t mu; /* claims and the stage totals */
    int64_t next_tile;  /* first tile of the next batch to claim */
    int64_t next_seq;
    bool claims_done;
    int cur_seg, cur_ty; /* the write stage's (one worker) */
    int64_t written_end; /* tiles before it are stitched */
    bool write_halted;   /* a batch not run came: nothing after it is kept */
    double t_commit;     /* when the last chunk or checkpoint was committed */
    double checkpoint_cost;
    int64_t checkpoint_end; /* written_end at the last checkpoint */
    int state_seg;          /* the segment a checkpoint resumes, or -1 */
    tw_parts_state state;
    int64_t tiles_done;
    uint64_t allocs_mark;
    bool steady;
    /* The run's allocator scope (core/alloc.h): every stage thread counts
     * its blocks there, so steady_state_allocs and the report's peaks are
     * this run's alone. NULL: the process's counters. */
    tw_mem_scope *scope;
} tw_pipe;

/* Blocks allocated so far in pp's scope (or the process's without one). */
uint64_t tw_pipe_alloc_count(const tw_pipe *pp);

/* The slot pool: bud->n_slots slots of bud->batch tiles, raw pixels in the
 * backend's host memory (pinned on CUDA) where it has some. Free with
 * tw_pipe_slots_free (accepts a pipe whose alloc failed half way). */
tw_status tw_pipe_slots_alloc(tw_pipe *pp, int tile, tw_error *err);
void tw_pipe_slots_free(tw_pipe *pp);

/* runtime.precision int8: hand the backend one batch of tiles spread evenly
 * over the whole raster (info) to measure its activation ranges on. Uses
 * slot 0; call before tw_pipe_run. */
tw_status tw_pipe_calibrate(tw_pipe *pp, const tw_raster_info *info, tw_error *err);

/* The stitcher's sink (tw_rows_fn, user = the pipe): finished rows into
 * the committed chunks of pp->parts. */
tw_status tw_pipe_parts_sink(void *user, int row0, int n, const float *probs, const uint8_t *has,
                             tw_error *err);

/* Run every stage to the end. TW_OK also when stopped early: *interrupted
 * then says so (a stop request, after a checkpoint of every tile stitched;
 * or the progress hook returned 0). Errors: the first stage error (in
 * pp->err). Resumes this shard's checkpoint when one fits (pp->n_tiles and
 * pp->res->tiles_total then count only the tiles still to run). */
tw_status tw_pipe_run(tw_pipe *pp, bool *interrupted);

#endif
