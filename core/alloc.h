/* alloc.h - the one counting allocator.
 *
 * All sizeable tilewise allocations (weights, batch slots, backend workspace,
 * strip buffers) go through tw_alloc with a tag saying which budget item they
 * belong to, so the run report can say where the bytes went and tests can
 * prove that nothing is allocated in the steady state. The process-wide
 * counters describe the process's memory, like RSS does; a scope
 * (tw_mem_scope) counts one run's own blocks, so that two runs in one
 * process (two threads of a Python or QGIS session) each report their own
 * peaks. All counters are atomic.
 */
#ifndef TW_ALLOC_H
#define TW_ALLOC_H

#include <stddef.h>
#include <stdint.h>

typedef enum tw_mem_tag {
    TW_MEM_WEIGHTS = 0, /* model tensors, folded weights */
    TW_MEM_SLOTS,       /* batch slots (raw pixels, masks, normalized input, outputs) */
    TW_MEM_WORKSPACE,   /* backend activations and scratch */
    TW_MEM_STRIP,       /* stitcher's output strip buffer */
    TW_MEM_READ,        /* the readers' strips of input rows */
    TW_MEM_OTHER,       /* small things: plans, names, queues */
    TW_MEM_TAG_COUNT
} tw_mem_tag;

/* malloc/calloc/free with accounting. Sizes are 64-byte aligned. tw_alloc
 * returns NULL on failure (never aborts). tw_free accepts NULL. */
void *tw_alloc(tw_mem_tag tag, size_t bytes);
void *tw_calloc(tw_mem_tag tag, size_t n, size_t size);
void tw_free(void *p);

/* Current and peak bytes of one tag; total over all tags with TW_MEM_TAG_COUNT. */
size_t tw_mem_current(tw_mem_tag tag);
size_t tw_mem_peak(tw_mem_tag tag);
/* Number of tw_alloc calls so far (to prove none happen in the steady state). */
uint64_t tw_mem_alloc_count(void);
const char *tw_mem_tag_name(tw_mem_tag tag);

/* A run's own counters. A thread inside a scope (tw_mem_scope_enter) counts
 * each block it allocates there too, and the block remembers its scope, so
 * that freeing it on any thread, even after the scope was closed, counts it
 * down there. A scope lives until it is closed and its last block freed. */
typedef struct tw_mem_scope tw_mem_scope;

/* A new scope, or NULL when out of memory (then nothing is counted in it). */
tw_mem_scope *tw_mem_scope_open(void);
/* The caller's reference ends; the scope goes when its last block does.
 * Accepts NULL. */
void tw_mem_scope_close(tw_mem_scope *s);
/* Make s (may be NULL: none) the calling thread's scope; returns the one it
 * had, to give back to tw_mem_scope_enter when leaving. */
tw_mem_scope *tw_mem_scope_enter(tw_mem_scope *s);
/* The calling thread's scope, or NULL. */
tw_mem_scope *tw_mem_scope_current(void);
/* Peak bytes of one tag in s (TW_MEM_TAG_COUNT: all tags), and the blocks
 * allocated in it so far. 0 for NULL. */
size_t tw_mem_scope_peak(const tw_mem_scope *s, tw_mem_tag tag);
uint64_t tw_mem_scope_alloc_count(const tw_mem_scope *s);

#endif
