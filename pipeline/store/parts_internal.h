/* parts_internal.h - what the chunk store (parts.c) shares with the product
 * assembly (assemble.c): the store's state, the chunk files' headers and
 * names, and the check of a committed chunk. The formats are in parts.h.
 *
 * Private to pipeline/: it is not installed and nothing outside pipeline/
 * includes it (scripts/check_layers.sh refuses it). The public calls stay
 * in parts.h and assemble.h.
 */
#ifndef TW_PARTS_INTERNAL_H
#define TW_PARTS_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/params.h"
#include "pipeline/store/parts.h"

/* A row chunk's header and a tile chunk's ("TWCHUNK1", "TWTILES1": parts.h). */
typedef struct chunk_header {
    char magic[8];
    int32_t r0, r1, grid_w, n_classes;
    uint64_t fnv;
} chunk_header;

typedef struct tiles_header {
    char magic[8];
    int32_t r0, r1, n_classes, feat_dim;
    int64_t n_tiles;
    uint64_t fnv;
} tiles_header;

/* A chunk being written: its temporary and final names, its running FNV-1a. */
typedef struct open_file {
    FILE *f;
    char tmp[TW_PATH_MAX + 420];
    char final[TW_PATH_MAX + 400];
    uint64_t fnv;
} open_file;

/* The store of one input's parts (tw_parts_open). */
struct tw_parts {
    tw_parts_params p;
    int lock_fd; /* this shard's lock, -1: none */
    char lock_path[TW_PATH_MAX + 400];
    char dir[TW_PATH_MAX + 300];
    char journal[TW_PATH_MAX + 400];
    uint8_t *done;            /* [grid_h] */
    int rejected;             /* journal lines whose chunk failed its check */
    int journal_shards;       /* N of the journal.I-of-N files seen, 0: none */
    uint32_t journal_seen[8]; /* bit per shard index (first 256) that has a journal */
    /* open chunk */
    int c_r0, c_r1, c_next;
    int64_t c_tiles;
    open_file rows, tiles;
    int64_t mark_tiles; /* tile records before the mark (tw_parts_chunk_mark) */
    uint64_t mark_fnv;  /* the tile file's checksum at the mark */
    /* checkpoint state */
    char state_path[TW_PATH_MAX + 400];
    bool has_state; /* read, verified and still counting */
    tw_parts_state state;
    int64_t state_tiles;
};

/* A chunk's file: DIR/<kind>-<r0>-<r1>.bin, kind "rows" or "tiles". */
static inline void chunk_path(const tw_parts *pt, const char *kind, int r0, int r1, char *out,
                              size_t size)
{
    if (snprintf(out, size, "%s/%s-%07d-%07d.bin", pt->dir, kind, r0, r1) >= (int)size)
        out[size - 1] = '\0';
}

/* Values per output cell in row chunks and states: the probabilities, then
 * the embedding raster's features. */
static inline size_t cell_values(const tw_parts_params *p)
{
    return (size_t)p->n_classes + (size_t)p->cell_emb;
}

/* Verify a committed chunk (rows [r0, r1), and its tile records when
 * pt->p.tiles) against its header and checksum; true when sound. Reads
 * the files, changes nothing. */
bool tw_parts_chunk_verify(const tw_parts *pt, int r0, int r1);

/* ---- between the store's own files ----
 * parts.c (opening, journals, chunks, listing, removal), parts_lock.c,
 * parts_fingerprint.c and parts_checkpoint.c; their calls into each other
 * are named parts_*. */

#define FNV_OFFSET 1469598103934665603ULL
#define FNV_PRIME 1099511628211ULL

/* FNV-1a of n bytes, continuing from h (FNV_OFFSET to start). */
static inline uint64_t parts_fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= FNV_PRIME;
    }
    return h;
}

/* Append n bytes to an open chunk file, counting them into its checksum. */
tw_status parts_write_payload(open_file *of, const void *data, size_t n, tw_error *err);

/* Remove files of the parts directory: all of them but the lock files, or
 * only the chunk temporaries whose first row lies in [r_begin, r_end). */
tw_status parts_remove_files(const char *dir, bool only_temps, int r_begin, int r_end,
                             tw_error *err);

struct flock;

/* Locks (parts_lock.c). fcntl with the OFD lock command ofd, or the classic
 * one where the kernel has none. */
int parts_lock_fcntl(int fd, int ofd, int classic, struct flock *fl);
/* Who holds the lock on fd, as "process 1234 on host node7", into buf. */
void parts_lock_holder(int fd, char *buf, size_t size);
/* Take the lock on path: its descriptor (>= 0), -1 on an error (errno), -2
 * when another run holds it (holder says who); wait: block until free. */
int parts_lock_take(const char *path, bool wait, char *holder, size_t hsize);
/* Write "pid host" into a lock we hold. */
void parts_lock_sign(int fd);
/* Is another shard's lock of pt's directory held? Fills who when it is. */
bool parts_other_lock_held(const tw_parts *pt, const char *own, char *who, size_t size);

/* The fingerprint at mpath against pt->p.fingerprint (parts_fingerprint.c):
 * *same when equal; TW_OK also when replacing it loses nothing (or
 * --restart discarded the rows); otherwise the refusal, recorded. Called
 * under the open lock. */
tw_status parts_fingerprint_check(tw_parts *pt, const char *mpath, bool quiet, bool *same,
                                  tw_error *err);

/* Checkpoints (parts_checkpoint.c): read and verify this shard's state into
 * pt (has_state); remove every shard's state in dir. */
void parts_load_state(tw_parts *pt);
void parts_remove_states(const char *dir);

#endif
