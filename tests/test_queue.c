/* test_queue.c - the bounded queues between stage workers (pipeline/engine/queue.h):
 * FIFO order, blocking when full, close; the ordered queue hands items out
 * by sequence number whatever order producers push them in. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "pipeline/engine/queue.h"

static void test_fifo(void **state)
{
    (void)state;
    tw_queue *q = tw_queue_create(3);
    assert_non_null(q);
    int v[3] = {1, 2, 3};
    for (int i = 0; i < 3; i++) assert_true(tw_queue_push(q, &v[i], NULL));
    for (int i = 0; i < 3; i++) assert_ptr_equal(tw_queue_pop(q, NULL), &v[i]);
    assert_true(tw_queue_push(q, &v[0], NULL));
    tw_queue_close(q);
    assert_false(tw_queue_push(q, &v[1], NULL));    /* closed: dropped */
    assert_ptr_equal(tw_queue_pop(q, NULL), &v[0]); /* drained after close */
    assert_null(tw_queue_pop(q, NULL));
    tw_queue_destroy(q);
}

#define N_ITEMS 2000
#define N_PRODUCERS 4
#define CAP 8

typedef struct producer {
    tw_queue *q, *free_q; /* free_q bounds the items in flight to CAP, like the slot pool */
    pthread_mutex_t *mu;
    int64_t *next; /* shared claim counter */
    int64_t items[N_ITEMS];
} producer;

static void *produce(void *arg)
{
    producer *p = arg;
    unsigned seed = (unsigned)(uintptr_t)pthread_self();
    for (;;) {
        void *token = tw_queue_pop(p->free_q, NULL); /* a slot */
        pthread_mutex_lock(p->mu);
        int64_t seq = (*p->next)++;
        pthread_mutex_unlock(p->mu);
        if (seq >= N_ITEMS) {
            tw_queue_push(p->free_q, token, NULL);
            return NULL;
        }
        /* finish in a scrambled order */
        for (volatile int spin = rand_r(&seed) % 20000; spin > 0; spin--) {
        }
        p->items[seq] = seq;
        assert_true(tw_queue_push_seq(p->q, &p->items[seq], seq, NULL));
    }
}

static void test_ordered(void **state)
{
    (void)state;
    tw_queue *q = tw_queue_create_ordered(CAP);
    tw_queue *free_q = tw_queue_create(CAP);
    assert_non_null(q);
    assert_non_null(free_q);
    static int tokens[CAP];
    for (int i = 0; i < CAP; i++) assert_true(tw_queue_push(free_q, &tokens[i], NULL));
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    int64_t next = 0;
    static producer p;
    p.q = q;
    p.free_q = free_q;
    p.mu = &mu;
    p.next = &next;
    pthread_t th[N_PRODUCERS];
    for (int i = 0; i < N_PRODUCERS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, produce, &p), 0);
    for (int64_t want = 0; want < N_ITEMS; want++) {
        int64_t *item = tw_queue_pop(q, NULL);
        assert_non_null(item);
        assert_int_equal(*item, want); /* raster order, whatever the producers did */
        assert_true(tw_queue_push(free_q, &tokens[want % CAP], NULL));
    }
    for (int i = 0; i < N_PRODUCERS; i++) pthread_join(th[i], NULL);
    tw_queue_close(q);
    assert_null(tw_queue_pop(q, NULL));
    tw_queue_destroy(q);
    tw_queue_destroy(free_q);
}

static void test_ordered_close(void **state)
{
    (void)state;
    tw_queue *q = tw_queue_create_ordered(4);
    int a = 1, b = 2;
    assert_true(tw_queue_push_seq(q, &b, 1, NULL));  /* 0 has not come */
    assert_false(tw_queue_push_seq(q, &b, 1, NULL)); /* each number once */
    tw_queue_close(q);
    assert_null(tw_queue_pop(q, NULL)); /* closed: 0 will not come; 1 is not handed out */
    assert_false(tw_queue_push_seq(q, &a, 0, NULL));
    tw_queue_destroy(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo),
        cmocka_unit_test(test_ordered),
        cmocka_unit_test(test_ordered_close),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
