/* queue.h - a bounded, blocking FIFO of pointers between two stage workers.
 *
 * Capacity is fixed at creation (no allocation afterwards). push blocks while
 * full, pop while empty. close() wakes everybody: pop then drains what is
 * left and returns NULL; push on a closed queue drops the item and returns
 * false. Thread-safe for any number of producers and consumers.
 */
#ifndef TW_QUEUE_H
#define TW_QUEUE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"

typedef struct tw_queue tw_queue;

/* NULL on allocation failure. */
tw_queue *tw_queue_create(int capacity);
/* A queue that hands items out in the order of their sequence numbers
 * (0, 1, 2, ..., each pushed once with tw_queue_push_seq), whatever order
 * the producers push them in: the reorder window in front of a stage that
 * must see batches in raster order. It holds at most `capacity` consecutive
 * numbers: a push of seq >= (next to pop) + capacity blocks. pop on a closed
 * queue returns the next item only if it is there. */
tw_queue *tw_queue_create_ordered(int capacity);
void tw_queue_destroy(tw_queue *q);

/* Blocks while full. false if the queue is closed. wait_s (may be NULL)
 * accumulates the seconds spent blocked. */
bool tw_queue_push(tw_queue *q, void *item, double *wait_s);
/* Ordered queues only. false if the queue is closed (or seq was already
 * pushed). */
bool tw_queue_push_seq(tw_queue *q, void *item, int64_t seq, double *wait_s);
/* Blocks while empty. NULL once closed and drained. */
void *tw_queue_pop(tw_queue *q, double *wait_s);
void tw_queue_close(tw_queue *q);
/* Items in the queue now. For the queue's only consumer, a count > 0 means
 * its next pop returns at once. */
int tw_queue_count(tw_queue *q);

#endif
