/* workflow_values.c - one YAML value of a workflow file read and checked:
 * the messages about it (file:line: key: what), scalars and lists (see
 * workflow_internal.h). */
#include "config/workflow_internal.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ------------------------------------------------------------------------ */
/* messages                                                                 */

/* Copy at most WF_SHOW_MAX bytes of user text into buf for a message, with
 * control bytes replaced so that the message stays one readable line. */
const char *wf_show(const char *s, size_t len, char *buf, size_t cap)
{
    size_t n = len;
    bool cut = false;
    if (n > WF_SHOW_MAX) {
        n = WF_SHOW_MAX;
        /* do not split a UTF-8 sequence */
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
        cut = true;
    }
    if (n + 4 > cap) n = cap > 4 ? cap - 4 : 0;
    size_t j = 0;
    for (size_t i = 0; i < n;) {
        unsigned char ch = (unsigned char)s[i];
        /* copy whole, well-formed UTF-8 sequences; any other byte becomes '?' */
        size_t seq = ch < 0x80                  ? 1
                     : ch >= 0xC2 && ch <= 0xDF ? 2
                     : ch >= 0xE0 && ch <= 0xEF ? 3
                     : ch >= 0xF0 && ch <= 0xF4 ? 4
                                                : 0;
        bool ok = seq > 0 && i + seq <= n;
        for (size_t k = 1; ok && k < seq; k++) ok = ((unsigned char)s[i + k] & 0xC0) == 0x80;
        if (!ok || ch < 0x20 || ch == 0x7F) {
            buf[j++] = '?';
            i++;
            continue;
        }
        memcpy(buf + j, s + i, seq);
        j += seq;
        i += seq;
    }
    if (cut) {
        memcpy(buf + j, "...", 3);
        j += 3;
    }
    buf[j] = '\0';
    return buf;
}

int wf_node_line(const yaml_node_t *n)
{
    return n ? (int)n->start_mark.line + 1 : 0;
}

/* Record "WHERE: KEY: what" where WHERE is "file:line", "file" or "--set". */
tw_status wf_fail_v(const wf_ctx *c, bool by_set, int line, const char *key, const char *fmt,
                    va_list ap)
{
    char what[TW_ERROR_MSG_MAX];
    vsnprintf(what, sizeof what, fmt, ap);
    char where[TW_ERROR_MSG_MAX / 2];
    if (by_set && key) /* "--set tiling.tile: ..." */
        return tw_error_set(c->err, TW_ERR_CONFIG, "--set %s: %s", key, what);
    if (by_set)
        snprintf(where, sizeof where, "--set");
    else if (line > 0)
        snprintf(where, sizeof where, "%s:%d", c->name, line);
    else
        snprintf(where, sizeof where, "%s", c->name);
    if (key) return tw_error_set(c->err, TW_ERR_CONFIG, "%s: %s: %s", where, key, what);
    return tw_error_set(c->err, TW_ERR_CONFIG, "%s: %s", where, what);
}

tw_status wf_fail(const wf_ctx *c, const yaml_node_t *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tw_status st =
        wf_fail_v(c, c->in_set, c->in_set ? 0 : wf_node_line(n), tw_keys[c->key].path, fmt, ap);
    va_end(ap);
    return st;
}

/* ------------------------------------------------------------------------ */
/* scalars                                                                  */

bool wf_is_null(const yaml_node_t *n)
{
    if (!n) return true;
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *s = (const char *)n->data.scalar.value;
    return n->data.scalar.length == 0 || strcmp(s, "~") == 0 || strcmp(s, "null") == 0 ||
           strcmp(s, "Null") == 0 || strcmp(s, "NULL") == 0;
}

/* "a list", "a mapping", "nothing" or 'text', for "expected X, got Y". */
const char *wf_describe(const yaml_node_t *n, char *buf, size_t cap)
{
    if (wf_is_null(n)) return "nothing";
    if (n->type == YAML_SEQUENCE_NODE) return "a list";
    if (n->type == YAML_MAPPING_NODE) return "a mapping";
    if (n->type != YAML_SCALAR_NODE) return "nothing";
    char tmp[WF_SHOW_MAX + 8];
    wf_show((const char *)n->data.scalar.value, n->data.scalar.length, tmp, sizeof tmp);
    snprintf(buf, cap, "'%s'", tmp);
    return buf;
}

/* The text of a non-null scalar, or an error "expected <what>, got ...". */
tw_status wf_get_text(wf_ctx *c, const yaml_node_t *n, const char *what, const char **s,
                      size_t *len)
{
    char d[WF_SHOW_MAX + 16];
    if (!n || n->type != YAML_SCALAR_NODE || wf_is_null(n))
        return wf_fail(c, n, "expected %s, got %s", what, wf_describe(n, d, sizeof d));
    *s = (const char *)n->data.scalar.value;
    *len = n->data.scalar.length;
    /* "\0" in a double-quoted scalar would silently truncate a C string */
    if (strlen(*s) != *len) return wf_fail(c, n, "contains a NUL byte (expected %s)", what);
    return TW_OK;
}

/* A decimal integer with nothing else around it. */
bool wf_parse_int(const char *s, long long *v)
{
    const char *p = s;
    if (*p == '+' || *p == '-') p++;
    if (!isdigit((unsigned char)*p)) return false;
    for (const char *q = p; *q; q++)
        if (!isdigit((unsigned char)*q)) return false;
    errno = 0;
    char *end = NULL;
    long long x = strtoll(s, &end, 10);
    if (errno == ERANGE || *end) return false;
    *v = x;
    return true;
}

/* A finite decimal number (no hex, no inf/nan) with nothing around it;
 * NUM_RANGE for a well-formed one that a double cannot hold ("1e400"). */
wf_num wf_parse_number(const char *s, double *v)
{
    const char *p = s;
    if (*p == '+' || *p == '-') p++;
    if (!(isdigit((unsigned char)*p) || (*p == '.' && isdigit((unsigned char)p[1]))))
        return NUM_BAD;
    for (const char *q = p; *q; q++)
        if (!(isdigit((unsigned char)*q) || *q == '.' || *q == 'e' || *q == 'E' || *q == '+' ||
              *q == '-'))
            return NUM_BAD;
    errno = 0;
    char *end = NULL;
    double x = strtod(s, &end);
    if (*end) return NUM_BAD;
    if (errno == ERANGE || !isfinite(x)) return NUM_RANGE;
    *v = x;
    return NUM_OK;
}

/* The message for a failed parse_number. */
tw_status wf_fail_number(wf_ctx *c, const yaml_node_t *n, wf_num r, const char *what, const char *s,
                         size_t len)
{
    char d[WF_SHOW_MAX + 8];
    if (r == NUM_RANGE)
        return wf_fail(c, n, "'%s' is out of range for a number (expected about 1e-300..1e300)",
                       wf_show(s, len, d, sizeof d));
    return wf_fail(c, n, "expected %s, got '%s'", what, wf_show(s, len, d, sizeof d));
}

tw_status wf_get_int(wf_ctx *c, const yaml_node_t *n, long long lo, long long hi, int *out)
{
    const char *s = NULL;
    size_t len = 0;
    tw_status st = wf_get_text(c, n, "an integer", &s, &len);
    if (st) return st;
    long long v;
    char d[WF_SHOW_MAX + 8];
    if (!wf_parse_int(s, &v)) {
        double x;
        /* an integer-looking number that strtoll cannot hold */
        if (wf_parse_number(s, &x) == NUM_OK && strpbrk(s, ".eE") == NULL)
            return wf_fail(c, n, "'%s' is out of range (expected %lld..%lld)",
                           wf_show(s, len, d, sizeof d), lo, hi);
        return wf_fail(c, n, "expected an integer, got '%s'", wf_show(s, len, d, sizeof d));
    }
    if (v < lo || v > hi)
        return wf_fail(c, n, "%lld is out of range (expected %lld..%lld)", v, lo, hi);
    *out = (int)v;
    return TW_OK;
}

/* "auto" (-> 0) or an integer lo..hi. */
tw_status wf_get_auto_int(wf_ctx *c, const yaml_node_t *n, long long lo, long long hi, int *out)
{
    char what[64];
    snprintf(what, sizeof what, "auto or an integer %lld..%lld", lo, hi);
    const char *s = NULL;
    size_t len = 0;
    tw_status st = wf_get_text(c, n, what, &s, &len);
    if (st) return st;
    if (strcasecmp(s, "auto") == 0) {
        *out = 0;
        return TW_OK;
    }
    long long v;
    char d[WF_SHOW_MAX + 8];
    if (!wf_parse_int(s, &v))
        return wf_fail(c, n, "expected %s, got '%s'", what, wf_show(s, len, d, sizeof d));
    if (v < lo || v > hi) return wf_fail(c, n, "%lld is out of range (expected %s)", v, what);
    *out = (int)v;
    return TW_OK;
}

tw_status wf_get_number(wf_ctx *c, const yaml_node_t *n, double *out)
{
    const char *s = NULL;
    size_t len = 0;
    tw_status st = wf_get_text(c, n, "a number", &s, &len);
    if (st) return st;
    wf_num r = wf_parse_number(s, out);
    return r == NUM_OK ? TW_OK : wf_fail_number(c, n, r, "a number", s, len);
}

/* One of choices[] (case-insensitive); *idx is its index. */
tw_status wf_get_choice(wf_ctx *c, const yaml_node_t *n, const char *const *choices, int n_choices,
                        int *idx)
{
    char what[512] = "one of ";
    for (int i = 0; i < n_choices; i++) {
        if (i) strncat(what, " | ", sizeof what - strlen(what) - 1);
        strncat(what, choices[i], sizeof what - strlen(what) - 1);
    }
    const char *s = NULL;
    size_t len = 0;
    tw_status st = wf_get_text(c, n, what, &s, &len);
    if (st) return st;
    for (int i = 0; i < n_choices; i++)
        if (strcasecmp(s, choices[i]) == 0) {
            *idx = i;
            return TW_OK;
        }
    char d[WF_SHOW_MAX + 8];
    return wf_fail(c, n, "expected %s, got '%s'", what, wf_show(s, len, d, sizeof d));
}

/* A non-empty string that fits dst[cap] with its terminator. */
tw_status wf_get_string(wf_ctx *c, const yaml_node_t *n, const char *what, char *dst, size_t cap)
{
    const char *s = NULL;
    size_t len = 0;
    tw_status st = wf_get_text(c, n, what, &s, &len);
    if (st) return st;
    if (len == 0) return wf_fail(c, n, "must not be empty (expected %s)", what);
    if (len >= cap) return wf_fail(c, n, "too long (%zu bytes, at most %zu)", len, cap - 1);
    memcpy(dst, s, len + 1);
    return TW_OK;
}

/* ------------------------------------------------------------------------ */
/* lists: a sequence of scalars, or one scalar standing for a list of one    */

int wf_list_len(const yaml_node_t *n)
{
    if (wf_is_null(n)) return 0;
    if (n->type == YAML_SEQUENCE_NODE)
        return (int)(n->data.sequence.items.top - n->data.sequence.items.start);
    return 1;
}

const yaml_node_t *wf_list_item(const wf_ctx *c, const yaml_node_t *n, int i)
{
    if (n->type != YAML_SEQUENCE_NODE) return n;
    return yaml_document_get_node(c->doc, n->data.sequence.items.start[i]);
}

/* Checks that n is a list of 1..max items (or a single scalar). */
tw_status wf_check_list(wf_ctx *c, const yaml_node_t *n, const char *what, int max, int *count)
{
    if (n && n->type == YAML_MAPPING_NODE)
        return wf_fail(c, n, "expected a list of %s, got a mapping", what);
    int len = wf_list_len(n);
    if (len == 0)
        return wf_fail(c, n, "expected a list of %s, got %s", what,
                       wf_is_null(n) ? "nothing" : "an empty list");
    if (len > max) return wf_fail(c, n, "too many items (%d, at most %d)", len, max);
    *count = len;
    return TW_OK;
}
