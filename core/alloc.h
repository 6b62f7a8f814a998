/* alloc.h - the one counting allocator.
 *
 * All sizeable tilewise allocations (weights, batch slots, backend workspace,
 * strip buffers) go through tw_alloc with a tag saying which budget item they
 * belong to, so the run report can say where the bytes went and tests can
 * prove that nothing is allocated in the steady state. Counters are global to
 * the process (they describe the process's memory, like RSS does) and atomic.
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

#endif
