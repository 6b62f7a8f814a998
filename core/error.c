/* error.c - see error.h */
#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tw_error_init(tw_error *err)
{
    atomic_store(&err->set, 0);
    err->status = TW_OK;
    err->msg[0] = '\0';
}

tw_status tw_error_set(tw_error *err, tw_status st, const char *fmt, ...)
{
    if (!err) return st;
    int expected = 0;
    if (!atomic_compare_exchange_strong(&err->set, &expected, 1)) return st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    /* Keep the message on one line: GDAL and HDF5 texts sometimes end in '\n'. */
    for (char *p = err->msg; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    size_t n = strlen(err->msg);
    while (n > 0 && err->msg[n - 1] == ' ') err->msg[--n] = '\0';
    err->status = st;
    return st;
}

int tw_status_exit_code(tw_status st)
{
    switch (st) {
    case TW_OK: return TW_EXIT_OK;
    case TW_CANCELLED: return TW_EXIT_INTERRUPTED;
    case TW_ERR_USAGE:
    case TW_ERR_CONFIG: return TW_EXIT_USAGE;
    case TW_ERR_INPUT:
    case TW_ERR_MODEL: return TW_EXIT_INPUT;
    case TW_ERR_OUTPUT:
    case TW_ERR_NOMEM:
    case TW_ERR_DEVICE:
    case TW_ERR_REMOTE: return TW_EXIT_RESOURCE;
    case TW_ERR_PARTS: return TW_EXIT_PARTS;
    case TW_ERR_LOCKED: return TW_EXIT_LOCKED;
    case TW_ERR_INTERNAL: break;
    }
    return TW_EXIT_INTERNAL;
}

const char *tw_status_name(tw_status st)
{
    switch (st) {
    case TW_OK: return "ok";
    case TW_CANCELLED: return "interrupted";
    case TW_ERR_USAGE: return "usage error";
    case TW_ERR_CONFIG: return "config error";
    case TW_ERR_INPUT: return "input error";
    case TW_ERR_MODEL: return "model error";
    case TW_ERR_OUTPUT: return "output error";
    case TW_ERR_NOMEM: return "out of memory";
    case TW_ERR_DEVICE: return "device error";
    case TW_ERR_INTERNAL: return "internal error";
    case TW_ERR_REMOTE: return "network error";
    case TW_ERR_PARTS: return "parts of another run";
    case TW_ERR_LOCKED: return "locked";
    }
    return "unknown error";
}

_Noreturn void tw_assert_fail(const char *cond, const char *file, int line)
{
    fprintf(stderr, "tilewise: internal error: assertion '%s' failed at %s:%d\n", cond, file, line);
    abort();
}

void tw_log_printf(const tw_log *log, tw_log_level level, const char *fmt, ...)
{
    if (!log || !log->fn) return;
    char msg[TW_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log->fn(level, msg, log->user);
}
