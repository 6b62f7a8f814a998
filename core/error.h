/* error.h - status codes and the per-run error record.
 *
 * Every fallible tilewise call returns a tw_status. The message is written
 * once, where the error is detected, into the caller's tw_error; callers above
 * only pass the status up. There is no global error state: each run (or test)
 * owns its tw_error. The first error recorded wins, so a failure seen by one
 * stage is not overwritten by the knock-on failures of the others.
 */
#ifndef TW_ERROR_H
#define TW_ERROR_H

#include <stdatomic.h>

typedef enum tw_status {
    TW_OK = 0,
    TW_CANCELLED = 1,     /* stopped on request (signal, progress callback); resumable */
    TW_ERR_USAGE = -1,    /* bad command line */
    TW_ERR_CONFIG = -2,   /* workflow file: syntax, unknown key, type, range */
    TW_ERR_INPUT = -3,    /* raster cannot be opened/read or does not fit the model */
    TW_ERR_MODEL = -4,    /* model file unreadable, inconsistent or unsupported */
    TW_ERR_OUTPUT = -5,   /* output cannot be created/written (permissions, disk full) */
    TW_ERR_NOMEM = -6,    /* memory budget too small, allocation failed */
    TW_ERR_DEVICE = -7,   /* GPU missing or failing */
    TW_ERR_INTERNAL = -8, /* a bug: please report */
    TW_ERR_REMOTE = -9,   /* a remote input unreachable after its retries (outage) */
    TW_ERR_PARTS = -10,   /* the output directory holds parts of a run with another
                             configuration, model or raster: refused, nothing deleted */
    TW_ERR_LOCKED = -11, /* another run (process or thread) has the same shard of the same output */
} tw_status;

/* Process exit codes (documented in README.md). Only main() uses them. */
enum {
    TW_EXIT_OK = 0,
    TW_EXIT_INTERNAL = 1,
    TW_EXIT_USAGE = 2,    /* command line or workflow file */
    TW_EXIT_INPUT = 3,    /* bad raster or model */
    TW_EXIT_RESOURCE = 4, /* memory, disk, device, output not writable, network outage */
    TW_EXIT_SKIPPED = 5,  /* finished, but inputs were skipped (input.on_error: skip) */
    TW_EXIT_PARTS = 6,    /* parts of another configuration in output.dir: refused */
    TW_EXIT_LOCKED = 7, /* another run (process or thread) has the same shard of the same output */
    TW_EXIT_INTERRUPTED = 75, /* interrupted, resumable: run the same command again */
};

#define TW_ERROR_MSG_MAX 1024

typedef struct tw_error {
    atomic_int set; /* 0 until the first error is recorded */
    tw_status status;
    char msg[TW_ERROR_MSG_MAX]; /* one line, no trailing newline */
} tw_error;

/* Reset to "no error". */
void tw_error_init(tw_error *err);

/* Record an error (printf-style message) unless one is already recorded.
 * Returns st so that callers can write `return tw_error_set(err, ...)`.
 * err may be NULL (the message is dropped). Thread-safe. */
tw_status tw_error_set(tw_error *err, tw_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Map a status to the process exit code above. */
int tw_status_exit_code(tw_status st);

/* Short name of a status ("config error", ...). Never NULL. */
const char *tw_status_name(tw_status st);

/* Messages for the user that are not errors. The library never prints:
 * it hands notices (what it chose for the user: a fallback, a lowered
 * batch) and warnings (something the user should look at: an unreadable
 * tile skipped) to the caller's log, which decides where they go. */
typedef enum tw_log_level { TW_LOG_NOTICE = 0, TW_LOG_WARNING } tw_log_level;
typedef void (*tw_log_fn)(tw_log_level level, const char *msg, void *user);
typedef struct tw_log {
    tw_log_fn fn; /* NULL: messages are dropped */
    void *user;
} tw_log;

/* Format one message (one line, no newline) and hand it to log; log may be
 * NULL. Thread-safe when log->fn is. */
void tw_log_printf(const tw_log *log, tw_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Programmer mistakes only: never for bad input or failed I/O. */
#define TW_ASSERT(c)                                                                               \
    do {                                                                                           \
        if (!(c)) tw_assert_fail(#c, __FILE__, __LINE__);                                          \
    } while (0)
_Noreturn void tw_assert_fail(const char *cond, const char *file, int line);

#endif
