/* json.h - the one JSON emitter: run.json and the config JSON (report.c),
 * `info --json` and the JSON progress events (workflows/main.c).
 *
 * Writes into a caller's fixed buffer (no allocation; output that does not
 * fit is cut and the buffer stays NUL-terminated: callers size it so that
 * this does not happen) or onto a stdio stream. Commas between members are
 * placed by the emitter; keys are given with each value (NULL inside arrays
 * and at the top). Strings are escaped (quote, backslash, \n, \t, other
 * control characters as \u00XX; other bytes are copied as they are).
 * Numbers: %.10g, and null for NaN and infinities (JSON has neither).
 * Not thread-safe per tw_json; independent tw_json values are.
 */
#ifndef TW_JSON_H
#define TW_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef struct tw_json {
    FILE *f;   /* the sink when non-NULL, else buf */
    char *buf; /* [size]; len bytes written, NUL-terminated */
    size_t size, len;
    bool need_comma;
    bool cut; /* buf was too small: what it holds is cut short */
} tw_json;

/* An emitter into buf[size] (size >= 1; buf[0] is set to NUL). */
tw_json tw_json_buffer(char *buf, size_t size);
/* An emitter onto f. */
tw_json tw_json_file(FILE *f);

/* Text as it is (printf-style), no comma handling. */
void tw_json_raw(tw_json *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Open an object ('{') or array ('['), as member key (or an element: NULL). */
void tw_json_open(tw_json *j, const char *key, char c);
/* Close it ('}' or ']'). */
void tw_json_close(tw_json *j, char c);
/* Members or elements (key NULL). */
void tw_json_str(tw_json *j, const char *key, const char *v); /* v NULL: "" */
void tw_json_num(tw_json *j, const char *key, double v);      /* %.10g */
/* With `digits` significant digits (17: exact for a double, 9 for a float). */
void tw_json_real(tw_json *j, const char *key, double v, int digits);
/* With `decimals` digits after the point (%.*f: fractions, seconds). */
void tw_json_fixed(tw_json *j, const char *key, double v, int decimals);
void tw_json_null(tw_json *j, const char *key);
void tw_json_int(tw_json *j, const char *key, long long v);
void tw_json_bool(tw_json *j, const char *key, bool v);
/* Just the key (and colon) of a member whose value the caller writes raw. */
void tw_json_key(tw_json *j, const char *key);

#endif
