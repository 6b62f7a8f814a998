/* clock.c - see clock.h */
#include "core/clock.h"

#include <time.h>

static double seconds(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double tw_clock_now(void)
{
    return seconds(CLOCK_MONOTONIC);
}

double tw_clock_thread_cpu(void)
{
    return seconds(CLOCK_THREAD_CPUTIME_ID);
}
