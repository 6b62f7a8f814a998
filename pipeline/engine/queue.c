/* queue.c - see queue.h */
#include "pipeline/engine/queue.h"

#include <pthread.h>

#include "core/alloc.h"
#include "core/clock.h"

struct tw_queue {
    pthread_mutex_t mu;
    pthread_cond_t not_empty, not_full;
    void **items;
    int capacity, head, count;
    bool closed;
    bool ordered;     /* items[seq % capacity], popped in seq order */
    int64_t next_seq; /* ordered: the sequence number pop returns next */
};

tw_queue *tw_queue_create(int capacity)
{
    tw_queue *q = tw_calloc(TW_MEM_OTHER, 1, sizeof *q);
    if (!q) return NULL;
    q->items = tw_calloc(TW_MEM_OTHER, (size_t)capacity, sizeof(void *));
    if (!q->items) {
        tw_free(q);
        return NULL;
    }
    q->capacity = capacity;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->not_empty, NULL);
    pthread_cond_init(&q->not_full, NULL);
    return q;
}

tw_queue *tw_queue_create_ordered(int capacity)
{
    tw_queue *q = tw_queue_create(capacity);
    if (q) q->ordered = true;
    return q;
}

void tw_queue_destroy(tw_queue *q)
{
    if (!q) return;
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->not_empty);
    pthread_cond_destroy(&q->not_full);
    tw_free(q->items);
    tw_free(q);
}

bool tw_queue_push_seq(tw_queue *q, void *item, int64_t seq, double *wait_s)
{
    pthread_mutex_lock(&q->mu);
    if (seq >= q->next_seq + q->capacity && !q->closed) {
        double t0 = tw_clock_now();
        while (seq >= q->next_seq + q->capacity && !q->closed)
            pthread_cond_wait(&q->not_full, &q->mu);
        if (wait_s) *wait_s += tw_clock_now() - t0;
    }
    bool ok = !q->closed && seq >= q->next_seq && !q->items[seq % q->capacity];
    if (ok) {
        q->items[seq % q->capacity] = item;
        q->count++;
        /* several items may wait out of order: wake the consumer only
         * when the one it waits for has come */
        if (seq == q->next_seq) pthread_cond_broadcast(&q->not_empty);
    }
    pthread_mutex_unlock(&q->mu);
    return ok;
}

static void *pop_ordered(tw_queue *q, double *wait_s)
{
    void **slot = &q->items[q->next_seq % q->capacity];
    if (!*slot && !q->closed) {
        double t0 = tw_clock_now();
        while (!*slot && !q->closed) pthread_cond_wait(&q->not_empty, &q->mu);
        if (wait_s) *wait_s += tw_clock_now() - t0;
    }
    void *item = *slot;
    if (item) {
        *slot = NULL;
        q->next_seq++;
        q->count--;
        pthread_cond_broadcast(&q->not_full);
    }
    return item;
}

bool tw_queue_push(tw_queue *q, void *item, double *wait_s)
{
    pthread_mutex_lock(&q->mu);
    if (q->count == q->capacity && !q->closed) {
        double t0 = tw_clock_now();
        while (q->count == q->capacity && !q->closed) pthread_cond_wait(&q->not_full, &q->mu);
        if (wait_s) *wait_s += tw_clock_now() - t0;
    }
    bool ok = !q->closed;
    if (ok) {
        q->items[(q->head + q->count) % q->capacity] = item;
        q->count++;
        pthread_cond_signal(&q->not_empty);
    }
    pthread_mutex_unlock(&q->mu);
    return ok;
}

void *tw_queue_pop(tw_queue *q, double *wait_s)
{
    pthread_mutex_lock(&q->mu);
    if (q->ordered) {
        void *item = pop_ordered(q, wait_s);
        pthread_mutex_unlock(&q->mu);
        return item;
    }
    if (q->count == 0 && !q->closed) {
        double t0 = tw_clock_now();
        while (q->count == 0 && !q->closed) pthread_cond_wait(&q->not_empty, &q->mu);
        if (wait_s) *wait_s += tw_clock_now() - t0;
    }
    void *item = NULL;
    if (q->count > 0) {
        item = q->items[q->head];
        q->head = (q->head + 1) % q->capacity;
        q->count--;
        pthread_cond_signal(&q->not_full);
    }
    pthread_mutex_unlock(&q->mu);
    return item;
}

void tw_queue_close(tw_queue *q)
{
    pthread_mutex_lock(&q->mu);
    q->closed = true;
    pthread_cond_broadcast(&q->not_empty);
    pthread_cond_broadcast(&q->not_full);
    pthread_mutex_unlock(&q->mu);
}

int tw_queue_count(tw_queue *q)
{
    pthread_mutex_lock(&q->mu);
    int n = q->count;
    pthread_mutex_unlock(&q->mu);
    return n;
}
