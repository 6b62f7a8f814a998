/* clock.h - the clocks stage timings and reports are measured with. */
#ifndef TW_CLOCK_H
#define TW_CLOCK_H

/* Seconds on the monotonic clock (for differences only). Thread-safe. */
double tw_clock_now(void);
/* CPU seconds the calling thread has used. Thread-safe. */
double tw_clock_thread_cpu(void);

#endif
