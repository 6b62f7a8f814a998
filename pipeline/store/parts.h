/* parts.h - the chunk store: crash-safe output as committed chunks and a
 * journal per shard (the products are assembled from it: assemble.h).
 *
 * While a run works, finished output rows do not go straight into the
 * GeoTIFFs: they are committed in chunks (bands of output rows) under
 * OUT/.tilewise/<stem>/. A chunk is written to a temporary name, fsync'ed and
 * renamed, then recorded in the shard's journal (one line, fsync'ed). So after
 * a kill -9, or on a requeued SLURM job, running the same command again redoes
 * only the rows no journal line covers; a chunk without its line, or with a
 * bad checksum, is redone. When every row of the grid is committed (by one
 * run or by all shards), the chunks are assembled into the final products
 * (assemble.h) and the parts are removed (tw_parts_remove).
 *
 * Chunk file (native little-endian): "TWCHUNK1", int32 r0, r1, grid_w,
 * V; uint64 FNV-1a of the payload; payload per row: float32
 * probs[grid_w][V], uint8 has[grid_w]; V = n_classes + cell_emb (the
 * embedding raster's averaged features follow each cell's probabilities;
 * a state's sums likewise).
 * Tile chunk (when the tile table or the GeoPackage is asked): "TWTILES1", int32 r0, r1,
 * n_classes, feat_dim, int64 n_tiles, uint64 FNV-1a; payload per tile:
 * int32 row, col, float32 probs[n_classes], float32 emb[feat_dim].
 * A tile belongs to the chunk holding its first output row.
 *
 * Checkpoints. A chunk holds whole output rows, and with overlapping tiles
 * a row is finished only once the k tile rows over it are; on a raster
 * 10^7 pixels wide one tile row is 156,250 tiles, minutes of work. So the
 * work done since the last commit is also kept by a checkpoint, taken on a
 * stop request (SIGTERM, ...) and every few seconds of a long chunk
 * (stages.h): the open chunk's finished rows [r0', r0) are committed as a
 * shorter chunk (with the tile records whose first row lies in them), and
 * OUT/.tilewise/<stem>/state.I-of-N (temporary, fsync, rename, after that
 * commit) holds the rest: the stitcher's k held rows of running sums and
 * counts as they are, the next tile to run, and the tile records of row r0
 * classified so far. A resumed run puts the sums back and adds the tiles
 * from there on, in the same order as an uninterrupted run: the same bytes.
 * A state counts only while its row r0 is not committed (so an older state
 * left by a crash between the commit and the rename is ignored), and only
 * in a run of the same fingerprint (it lives in the parts directory); one
 * that is damaged or does not fit is ignored, and its rows are redone.
 * State file: "TWSTATE1", int32 r0, row_end, ty, tx, grid_w, n_classes, k,
 * feat_dim, int64 n_tiles, uint64 FNV-1a; payload: float32
 * sum[k][grid_w][n_classes], uint32 count[k][grid_w], then n_tiles tile
 * records as in a tile chunk.
 */
#ifndef TW_PARTS_H
#define TW_PARTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct tw_parts tw_parts;

/* The fingerprint's format (its first line, "tilewise-parts N") and its
 * largest size: 255 class names and colours fit with room to spare. N is
 * also raised when a tile's bits may change for the same keys (4: oneDNN's
 * Winograd convs run in groups of 4 tiles, which changes the last bits on
 * CPUs whose kernel summed otherwise for other batches): parts committed
 * before are refused, never merged with the new bits. */
#define TW_PARTS_FINGERPRINT_VERSION 5
#define TW_FINGERPRINT_MAX ((size_t)64 << 10)

typedef struct tw_parts_params {
    const char *out_dir;
    const char *stem;                        /* the input's stem (no shard suffix) */
    const char *fingerprint;                 /* what the outputs depend on; a mismatch restarts */
    int grid_w, grid_h, n_classes, feat_dim; /* feat_dim 0: no embeddings */
    int cell_emb; /* embedding_raster: features per output cell, after the n_classes
                     probabilities in row chunks and states (0: none) */
    bool tiles;   /* keep tile records (tile table, GeoPackage) */
    int shard_index, shard_count;
    bool merge_only;   /* read only: a different fingerprint is an error
                          and other shards' temporaries are left alone */
    bool restart;      /* discard parts of another fingerprint instead of refusing */
    const tw_log *log; /* the --restart notice (may be NULL) */
} tw_parts_params;

/* Open (create) the parts directory of an input: takes this shard's lock,
 * removes stale temporary files, reads every shard's journal and verifies
 * the chunks it lists.
 *
 * The fingerprint is "key value" lines. Parts of another fingerprint
 * (configuration, model or raster changed) are never deleted implicitly:
 * TW_ERR_PARTS naming the keys that differ and how to proceed, unless
 * p->restart (then they are discarded, with one notice on stderr unless
 * quiet) or nothing was committed under it and no other shard is running.
 *
 * A stored fingerprint that is missing, unreadable or damaged (empty, cut
 * short, not a fingerprint) beside committed rows is refused the same way
 * (TW_ERR_PARTS naming the file), never resumed; p->restart discards.
 *
 * Lock: one per (output dir, input, shard), an open file description lock
 * (parts.c, "locks") on OUT/.tilewise/<stem>/lock.<I>-of-<N> holding "pid
 * host"; held until tw_parts_close. TW_ERR_LOCKED naming the holder when
 * another run has it: another process, or another thread of this one. Not
 * taken with merge_only. */
tw_status tw_parts_open(const tw_parts_params *p, bool quiet, tw_parts **out, tw_error *err);

/* What tw_parts_open would refuse, read only (validate): TW_ERR_LOCKED when
 * another run holds this shard's lock, TW_ERR_PARTS when committed parts of
 * another configuration (or without a readable fingerprint) are there, each
 * with tw_parts_open's words; TW_OK when it would open them (no folder yet,
 * the same fingerprint, nothing committed). Creates, locks and deletes
 * nothing; p->restart and p->merge_only are not read. */
tw_status tw_parts_probe(const tw_parts_params *p, tw_error *err);

/* Is shard k (0-based) of n of pt's input running now (its lock held by
 * another run)? Fills who ("process 12 on host n7") when it is. For merge's
 * message about the rows a shard has not committed. */
bool tw_parts_shard_running(const tw_parts *pt, int k, int n, char *who, size_t size);
void tw_parts_close(tw_parts *pt);

/* Rows [0, grid_h) already committed: a bitmap-like query. */
bool tw_parts_row_done(const tw_parts *pt, int row);
/* Number of committed rows over all shards. */
int tw_parts_rows_done(const tw_parts *pt);

/* Chunk writing, one chunk at a time, rows in order. */
tw_status tw_parts_chunk_begin(tw_parts *pt, int r0, int r1, tw_error *err);
/* Rows [row, row+n) of the open chunk: probs [n][grid_w][C], has [n][grid_w]. */
tw_status tw_parts_chunk_rows(tw_parts *pt, int row, int n, const float *probs, const uint8_t *has,
                              tw_error *err);
/* Tiles of the open chunk (only those whose first row lies in it). */
tw_status tw_parts_chunk_tiles(tw_parts *pt, int n, const int32_t *rows, const int32_t *cols,
                               const float *probs, const float *emb, tw_error *err);
/* Row the open chunk ends at (exclusive), or -1 when none is open. */
int tw_parts_chunk_end(const tw_parts *pt);
/* Make the chunk durable: fsync, rename, journal line, fsync. */
tw_status tw_parts_chunk_commit(tw_parts *pt, tw_error *err);
/* Drop the open chunk (its temporary files). Cannot fail. */
void tw_parts_chunk_abort(tw_parts *pt);

/* Where a checkpoint resumes: the stitcher's first held row r0 (not
 * finished) and the end of its segment's rows, the next tile to run
 * (absolute tile row and column), the rows the stitcher holds (its k). */
typedef struct tw_parts_state {
    int r0, row_end;
    int ty, tx;
    int k;
} tw_parts_state;

/* Say that the open chunk's tile records from here on have their first row
 * at the stitcher's next row (a tile row begins); those before it, in
 * finished rows. Call after opening the chunk for a tile row, before its
 * records. Cannot fail. */
void tw_parts_chunk_mark(tw_parts *pt);

/* Take a checkpoint (see the top): commit the open chunk's rows up to
 * s->r0 (the open chunk must have reached r0: its rows [c_r0, r0) are
 * written), reopen the chunk's rest from r0 with the records after the mark,
 * and replace the state with s, sum [k][grid_w][n_classes] and count
 * [k][grid_w] (4 bytes each: the stitcher's uint32 counts or the blender's
 * float sums of weights, kept as bytes). On an error the state on disk is
 * the previous one. */
tw_status tw_parts_checkpoint(tw_parts *pt, const tw_parts_state *s, const float *sum,
                              const void *count, tw_error *err);

/* The state this shard's last run left (read and verified at open), if it
 * counts (see the top): true and *out filled. */
bool tw_parts_state_get(const tw_parts *pt, tw_parts_state *out);

/* Read the state's sums and counts into sum [k][grid_w][n_classes] and
 * count [k][grid_w], and add its tile records to the open chunk (which the
 * caller has begun at its r0). The state is used up: tw_parts_state_get then
 * says false. TW_ERR_OUTPUT when the file can no longer be read. */
tw_status tw_parts_state_restore(tw_parts *pt, float *sum, void *count, tw_error *err);

/* Remove the parts directory (after a successful assembly). */
tw_status tw_parts_remove(tw_parts *pt, tw_error *err);

/* Compare two fingerprints key by key: writes "key: A here, B in the
 * parts; ..." for every line that differs into buf. Returns the number of
 * keys that differ. For messages and tests. */
int tw_parts_fingerprint_diff(const char *now, const char *stored, char *buf, size_t size);
/* The same, with stored_as in place of "in the parts" (e.g. "when the run
 * began": an input's identity at its turn against the run's start). */
int tw_fingerprint_diff_as(const char *now, const char *stored, const char *stored_as, char *buf,
                           size_t size);

/* Read the stems that have parts under out_dir (for `tilewise merge`):
 * fills up to max names of TW_NAME_MAX*4 chars, returns the count or -1. */
int tw_parts_list(const char *out_dir, char (*stems)[256], int max);

#endif
