/* json.c - the one JSON emitter (see json.h) */
#include "pipeline/report/json.h"

#include <math.h>
#include <stdarg.h>

tw_json tw_json_buffer(char *buf, size_t size)
{
    buf[0] = '\0';
    return (tw_json){.buf = buf, .size = size};
}

tw_json tw_json_file(FILE *f)
{
    return (tw_json){.f = f};
}

void tw_json_raw(tw_json *j, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (j->f) {
        vfprintf(j->f, fmt, ap);
    } else if (j->len < j->size) {
        int n = vsnprintf(j->buf + j->len, j->size - j->len, fmt, ap);
        if (n > 0) j->len += (size_t)n;
        if (j->len >= j->size) {
            j->len = j->size - 1;
            j->cut = true;
        }
    }
    va_end(ap);
}

static void sep(tw_json *j)
{
    if (j->need_comma) tw_json_raw(j, ",");
    j->need_comma = true;
}

static void quoted(tw_json *j, const char *s)
{
    tw_json_raw(j, "\"");
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\')
            tw_json_raw(j, "\\%c", *p);
        else if (*p == '\n')
            tw_json_raw(j, "\\n");
        else if (*p == '\t')
            tw_json_raw(j, "\\t");
        else if (*p < 0x20)
            tw_json_raw(j, "\\u%04x", *p);
        else
            tw_json_raw(j, "%c", *p);
    }
    tw_json_raw(j, "\"");
}

void tw_json_key(tw_json *j, const char *key)
{
    sep(j);
    quoted(j, key);
    tw_json_raw(j, ":");
    j->need_comma = false;
}

/* The key, or the separator of an element. */
static void member(tw_json *j, const char *key)
{
    if (key)
        tw_json_key(j, key);
    else
        sep(j);
}

void tw_json_open(tw_json *j, const char *key, char c)
{
    member(j, key);
    tw_json_raw(j, "%c", c);
    j->need_comma = false;
}

void tw_json_close(tw_json *j, char c)
{
    tw_json_raw(j, "%c", c);
    j->need_comma = true;
}

void tw_json_str(tw_json *j, const char *key, const char *v)
{
    member(j, key);
    quoted(j, v);
    j->need_comma = true;
}

/* A finite number printed with fmt ("%.*g" or "%.*f") at precision prec,
 * else null. */
static void number(tw_json *j, const char *key, const char *fmt, int prec, double v)
{
    member(j, key);
    if (isfinite(v))
        tw_json_raw(j, fmt, prec, v);
    else
        tw_json_raw(j, "null");
    j->need_comma = true;
}

void tw_json_real(tw_json *j, const char *key, double v, int digits)
{
    number(j, key, "%.*g", digits, v);
}

void tw_json_num(tw_json *j, const char *key, double v)
{
    tw_json_real(j, key, v, 10);
}

void tw_json_fixed(tw_json *j, const char *key, double v, int decimals)
{
    number(j, key, "%.*f", decimals, v);
}

void tw_json_null(tw_json *j, const char *key)
{
    member(j, key);
    tw_json_raw(j, "null");
    j->need_comma = true;
}

void tw_json_int(tw_json *j, const char *key, long long v)
{
    member(j, key);
    tw_json_raw(j, "%lld", v);
    j->need_comma = true;
}

void tw_json_bool(tw_json *j, const char *key, bool v)
{
    member(j, key);
    tw_json_raw(j, v ? "true" : "false");
    j->need_comma = true;
}
