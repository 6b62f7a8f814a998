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

#endif
