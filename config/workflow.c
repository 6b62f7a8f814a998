/* workflow.c - the YAML workflow file into tw_run_params (see workflow.h).
 *
 * The file is loaded with libyaml's document API (nodes carry their line),
 * then walked with a fixed depth: sections -> keys -> list items. Nothing is
 * recursive, so anchors, aliases and cycles in hostile input cannot hurt us;
 * every node is checked for the type we expect before it is used.
 *
 * Each known key has one setter that fully validates its value and replaces
 * the field it owns, so a key given in the file and again with --set goes
 * through exactly the same checks. Checks that involve two keys (stride vs
 * tile, mean vs std vs bands) and the required keys run once at the end, after
 * the overrides, and name where the offending key came from.
 *
 * All work happens on a private copy of the params: *out is written only on
 * success, so a failed parse leaves the caller's struct as it was.
 */
#include "config/workflow.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <gdal.h>
#include <yaml.h>

#include "core/datetime.h"
#include "core/fileio.h"
#include "core/keys.h"

/* A workflow file is a few hundred bytes; anything this large is a mistake
 * (a raster passed instead of the YAML), not a config to read into memory. */
#define WF_FILE_MAX ((size_t)16 << 20)
#define WF_MEMORY_MIN ((size_t)16 << 20)
#define WF_SHOW_MAX 40

/* Where a key's current value came from, for messages about it. */
typedef struct wf_origin {
    int line;    /* 1-based line in the file; 0: not given */
    bool by_set; /* given (last) by --set */
} wf_origin;

typedef struct wf_ctx {
    const char *name; /* file name for messages */
    tw_error *err;
    yaml_document_t *doc; /* the document the current node belongs to */
    bool in_set;          /* the current value comes from --set */
    int key;              /* the key being set (tw_key_id) */
    wf_origin origin[TW_KEY_COUNT];
} wf_ctx;

typedef tw_status (*wf_setter)(wf_ctx *c, const yaml_node_t *v, tw_run_params *p);

#define N_SECTIONS TW_KEY_SECTIONS
#define k_sections tw_key_sections

/* ------------------------------------------------------------------------ */
/* messages                                                                 */

/* Copy at most WF_SHOW_MAX bytes of user text into buf for a message, with
 * control bytes replaced so that the message stays one readable line. */
static const char *show(const char *s, size_t len, char *buf, size_t cap)
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

static int node_line(const yaml_node_t *n)
{
    return n ? (int)n->start_mark.line + 1 : 0;
}

/* Record "WHERE: KEY: what" where WHERE is "file:line", "file" or "--set". */
static tw_status fail_v(const wf_ctx *c, bool by_set, int line, const char *key, const char *fmt,
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

/* An error about the value of the key being set, at node n. */
__attribute__((format(printf, 3, 4))) static tw_status fail(const wf_ctx *c, const yaml_node_t *n,
                                                            const char *fmt, ...);

/* An error at an explicit line with an explicit key label (may be NULL). */
__attribute__((format(printf, 4, 5))) static tw_status
fail_at(const wf_ctx *c, int line, const char *key, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tw_status st = fail_v(c, c->in_set, line, key, fmt, ap);
    va_end(ap);
    return st;
}

/* An error about key k as it stands after file and overrides. */
__attribute__((format(printf, 3, 4))) static tw_status fail_key(const wf_ctx *c, int k,
                                                                const char *fmt, ...);

/* ------------------------------------------------------------------------ */
/* scalars                                                                  */

static bool is_null(const yaml_node_t *n)
{
    if (!n) return true;
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *s = (const char *)n->data.scalar.value;
    return n->data.scalar.length == 0 || strcmp(s, "~") == 0 || strcmp(s, "null") == 0 ||
           strcmp(s, "Null") == 0 || strcmp(s, "NULL") == 0;
}

/* "a list", "a mapping", "nothing" or 'text', for "expected X, got Y". */
static const char *describe(const yaml_node_t *n, char *buf, size_t cap)
{
    if (is_null(n)) return "nothing";
    if (n->type == YAML_SEQUENCE_NODE) return "a list";
    if (n->type == YAML_MAPPING_NODE) return "a mapping";
    if (n->type != YAML_SCALAR_NODE) return "nothing";
    char tmp[WF_SHOW_MAX + 8];
    show((const char *)n->data.scalar.value, n->data.scalar.length, tmp, sizeof tmp);
    snprintf(buf, cap, "'%s'", tmp);
    return buf;
}

/* The text of a non-null scalar, or an error "expected <what>, got ...". */
static tw_status get_text(wf_ctx *c, const yaml_node_t *n, const char *what, const char **s,
                          size_t *len)
{
    char d[WF_SHOW_MAX + 16];
    if (!n || n->type != YAML_SCALAR_NODE || is_null(n))
        return fail(c, n, "expected %s, got %s", what, describe(n, d, sizeof d));
    *s = (const char *)n->data.scalar.value;
    *len = n->data.scalar.length;
    /* "\0" in a double-quoted scalar would silently truncate a C string */
    if (strlen(*s) != *len) return fail(c, n, "contains a NUL byte (expected %s)", what);
    return TW_OK;
}

/* A decimal integer with nothing else around it. */
static bool parse_int(const char *s, long long *v)
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

typedef enum { NUM_OK = 0, NUM_BAD, NUM_RANGE } wf_num;

/* A finite decimal number (no hex, no inf/nan) with nothing around it;
 * NUM_RANGE for a well-formed one that a double cannot hold ("1e400"). */
static wf_num parse_number(const char *s, double *v)
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
static tw_status fail_number(wf_ctx *c, const yaml_node_t *n, wf_num r, const char *what,
                             const char *s, size_t len)
{
    char d[WF_SHOW_MAX + 8];
    if (r == NUM_RANGE)
        return fail(c, n, "'%s' is out of range for a number (expected about 1e-300..1e300)",
                    show(s, len, d, sizeof d));
    return fail(c, n, "expected %s, got '%s'", what, show(s, len, d, sizeof d));
}

static tw_status get_int(wf_ctx *c, const yaml_node_t *n, long long lo, long long hi, int *out)
{
    const char *s = NULL;
    size_t len = 0;
    tw_status st = get_text(c, n, "an integer", &s, &len);
    if (st) return st;
    long long v;
    char d[WF_SHOW_MAX + 8];
    if (!parse_int(s, &v)) {
        double x;
        /* an integer-looking number that strtoll cannot hold */
        if (parse_number(s, &x) == NUM_OK && strpbrk(s, ".eE") == NULL)
            return fail(c, n, "'%s' is out of range (expected %lld..%lld)",
                        show(s, len, d, sizeof d), lo, hi);
        return fail(c, n, "expected an integer, got '%s'", show(s, len, d, sizeof d));
    }
    if (v < lo || v > hi)
        return fail(c, n, "%lld is out of range (expected %lld..%lld)", v, lo, hi);
    *out = (int)v;
    return TW_OK;
}

/* "auto" (-> 0) or an integer lo..hi. */
static tw_status get_auto_int(wf_ctx *c, const yaml_node_t *n, long long lo, long long hi, int *out)
{
    char what[64];
    snprintf(what, sizeof what, "auto or an integer %lld..%lld", lo, hi);
    const char *s = NULL;
    size_t len = 0;
    tw_status st = get_text(c, n, what, &s, &len);
    if (st) return st;
    if (strcasecmp(s, "auto") == 0) {
        *out = 0;
        return TW_OK;
    }
    long long v;
    char d[WF_SHOW_MAX + 8];
    if (!parse_int(s, &v))
        return fail(c, n, "expected %s, got '%s'", what, show(s, len, d, sizeof d));
    if (v < lo || v > hi) return fail(c, n, "%lld is out of range (expected %s)", v, what);
    *out = (int)v;
    return TW_OK;
}

static tw_status get_number(wf_ctx *c, const yaml_node_t *n, double *out)
{
    const char *s = NULL;
    size_t len = 0;
    tw_status st = get_text(c, n, "a number", &s, &len);
    if (st) return st;
    wf_num r = parse_number(s, out);
    return r == NUM_OK ? TW_OK : fail_number(c, n, r, "a number", s, len);
}

/* One of choices[] (case-insensitive); *idx is its index. */
static tw_status get_choice(wf_ctx *c, const yaml_node_t *n, const char *const *choices,
                            int n_choices, int *idx)
{
    char what[256] = "one of ";
    for (int i = 0; i < n_choices; i++) {
        if (i) strncat(what, " | ", sizeof what - strlen(what) - 1);
        strncat(what, choices[i], sizeof what - strlen(what) - 1);
    }
    const char *s = NULL;
    size_t len = 0;
    tw_status st = get_text(c, n, what, &s, &len);
    if (st) return st;
    for (int i = 0; i < n_choices; i++)
        if (strcasecmp(s, choices[i]) == 0) {
            *idx = i;
            return TW_OK;
        }
    char d[WF_SHOW_MAX + 8];
    return fail(c, n, "expected %s, got '%s'", what, show(s, len, d, sizeof d));
}

/* A non-empty string that fits dst[cap] with its terminator. */
static tw_status get_string(wf_ctx *c, const yaml_node_t *n, const char *what, char *dst,
                            size_t cap)
{
    const char *s = NULL;
    size_t len = 0;
    tw_status st = get_text(c, n, what, &s, &len);
    if (st) return st;
    if (len == 0) return fail(c, n, "must not be empty (expected %s)", what);
    if (len >= cap) return fail(c, n, "too long (%zu bytes, at most %zu)", len, cap - 1);
    memcpy(dst, s, len + 1);
    return TW_OK;
}

/* ------------------------------------------------------------------------ */
/* lists: a sequence of scalars, or one scalar standing for a list of one    */

static int list_len(const yaml_node_t *n)
{
    if (is_null(n)) return 0;
    if (n->type == YAML_SEQUENCE_NODE)
        return (int)(n->data.sequence.items.top - n->data.sequence.items.start);
    return 1;
}

static const yaml_node_t *list_item(const wf_ctx *c, const yaml_node_t *n, int i)
{
    if (n->type != YAML_SEQUENCE_NODE) return n;
    return yaml_document_get_node(c->doc, n->data.sequence.items.start[i]);
}

/* Checks that n is a list of 1..max items (or a single scalar). */
static tw_status check_list(wf_ctx *c, const yaml_node_t *n, const char *what, int max, int *count)
{
    if (n && n->type == YAML_MAPPING_NODE)
        return fail(c, n, "expected a list of %s, got a mapping", what);
    int len = list_len(n);
    if (len == 0)
        return fail(c, n, "expected a list of %s, got %s", what,
                    is_null(n) ? "nothing" : "an empty list");
    if (len > max) return fail(c, n, "too many items (%d, at most %d)", len, max);
    *count = len;
    return TW_OK;
}

/* ------------------------------------------------------------------------ */
/* setters, one per key                                                     */

/* ------------------------------------------------------------------------ */
/* setters of the table's plain kinds: words, ranges and messages come from
 * tw_keys[c->key] (core/keys.h) */

/* One of the key's words: the struct holds its index (every enum of
 * params.h counts from 0 in the table's order). */
static tw_status set_enum(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    const tw_key *k = &tw_keys[c->key];
    int i;
    tw_status st = get_choice(c, v, k->names, k->n_names, &i);
    if (st) return st;
    switch ((tw_key_id)c->key) {
    case TW_KEY_INPUT_ON_ERROR: p->input.on_error = (tw_on_error)i; break;
    case TW_KEY_MODEL_ARCH: snprintf(p->model.arch, sizeof p->model.arch, "%s", k->names[i]); break;
    case TW_KEY_MODEL_STEM: p->model.stem = (tw_stem)i; break;
    case TW_KEY_TILING_EDGE: p->tiling.edge = (tw_edge_mode)i; break;
    case TW_KEY_RUNTIME_PRECISION: p->runtime.precision = (tw_precision)i; break;
    case TW_KEY_OUTPUT_PROB_TYPE: p->output.prob_type = (tw_prob_type)i; break;
    case TW_KEY_OUTPUT_EMBEDDING_TYPE: p->output.emb_type = (tw_emb_type)i; break;
    case TW_KEY_OUTPUT_RESOLUTION: p->output.resolution = (tw_resolution)i; break;
    case TW_KEY_OUTPUT_FORMAT: p->output.format = (tw_format)i; break;
    case TW_KEY_OUTPUT_VECTOR_FORMAT: p->output.vector_format = (tw_vector_format)i; break;
    default: TW_ASSERT(!"set_enum: a key of another kind");
    }
    return TW_OK;
}

/* The int field of an integer key. */
static int *int_field(int key, tw_run_params *p)
{
    switch ((tw_key_id)key) {
    case TW_KEY_INPUT_RETRIES: return &p->input.retries;
    case TW_KEY_TILING_TILE: return &p->tiling.tile;
    case TW_KEY_TILING_STRIDE: return &p->tiling.stride;
    case TW_KEY_TILING_BATCH: return &p->tiling.batch;
    case TW_KEY_RUNTIME_THREADS: return &p->runtime.threads;
    case TW_KEY_RUNTIME_READERS: return &p->runtime.readers;
    default: TW_ASSERT(!"int_field: a key of another kind"); return NULL;
    }
}

static tw_status set_int(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    const tw_key *k = &tw_keys[c->key];
    return get_int(c, v, (long long)k->lo, (long long)k->hi, int_field(c->key, p));
}

static tw_status set_auto_int(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    const tw_key *k = &tw_keys[c->key];
    return get_auto_int(c, v, (long long)k->lo, (long long)k->hi, int_field(c->key, p));
}

/* A number in the key's closed range lo..hi (input.scale's lo is the
 * smallest double above 0: "a number > 0"). */
static tw_status set_number(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    const tw_key *k = &tw_keys[c->key];
    double x;
    tw_status st = get_number(c, v, &x);
    if (st) return st;
    if (!(x >= k->lo && x <= k->hi))
        return fail(c, v, "%g is out of range (expected %s)", x, k->range);
    switch ((tw_key_id)c->key) {
    case TW_KEY_INPUT_SCALE: p->input.scale = x; break;
    case TW_KEY_INPUT_RETRY_DELAY: p->input.retry_delay = x; break;
    case TW_KEY_INPUT_TIMEOUT: p->input.timeout = x; break;
    case TW_KEY_TILING_MAX_NODATA_FRACTION: p->tiling.max_nodata_fraction = x; break;
    case TW_KEY_OUTPUT_MIN_AREA: p->output.min_area = x; break;
    case TW_KEY_OUTPUT_SIMPLIFY: p->output.simplify = x; break;
    default: TW_ASSERT(!"set_number: a key of another kind");
    }
    return TW_OK;
}

/* ------------------------------------------------------------------------ */
/* setters of the keys with words and shapes of their own                   */

static tw_status set_input_path(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    int n;
    tw_status st = check_list(c, v, "raster paths", TW_MAX_INPUTS, &n);
    for (int i = 0; !st && i < n; i++)
        st = get_string(c, list_item(c, v, i), "a raster path", p->input.paths[i], TW_PATH_MAX);
    if (!st) p->input.n_paths = n;
    return st;
}

static tw_status set_input_bands(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    int n;
    tw_status st = check_list(c, v, "band numbers (1-based)", TW_MAX_BANDS, &n);
    for (int i = 0; !st && i < n; i++)
        st = get_int(c, list_item(c, v, i), 1, INT_MAX, &p->input.bands[i]);
    if (!st) p->input.n_bands = n;
    return st;
}

static tw_status set_input_nodata(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    static const char *what = "auto, nan or a number";
    const char *s = NULL;
    size_t len = 0;
    tw_status st = get_text(c, v, what, &s, &len);
    if (st) return st;
    if (strcasecmp(s, "auto") == 0) {
        p->input.nodata_auto = true;
        return TW_OK;
    }
    double x;
    if (strcasecmp(s, "nan") == 0 || strcasecmp(s, ".nan") == 0) {
        x = NAN;
    } else {
        wf_num r = parse_number(s, &x);
        if (r != NUM_OK) return fail_number(c, v, r, what, s, len);
    }
    p->input.nodata_auto = false;
    p->input.nodata = x;
    return TW_OK;
}

static tw_status set_input_assets(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    int n;
    tw_status st = check_list(c, v, "STAC asset names", TW_MAX_BANDS, &n);
    for (int i = 0; !st && i < n; i++)
        st = get_string(c, list_item(c, v, i), "an asset name", p->input.assets[i], TW_NAME_MAX);
    if (!st) p->input.n_assets = n;
    return st;
}

static tw_status set_input_aoi(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    return get_string(c, v, "a vector file path (GeoPackage, Shapefile, GeoJSON, ...)",
                      p->input.aoi, TW_PATH_MAX);
}

/* An RFC 3339 date-time (core/datetime.h), checked here so that a typo is a
 * config error naming the key, not a bad STAC item after the run. */
static tw_status set_input_datetime(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    static const char *what = "an RFC 3339 date-time such as 2021-06-01T10:30:00Z";
    char s[sizeof p->input.datetime], why[160];
    tw_status st = get_string(c, v, what, s, sizeof s);
    if (st) return st;
    if (!tw_rfc3339_check(s, why, sizeof why))
        return fail(c, v, "'%s' is not %s: %s", s, what, why);
    memcpy(p->input.datetime, s, sizeof s);
    return TW_OK;
}

/* true or false; YAML 1.1's yes/no and on/off too (what libyaml leaves as text). */
static tw_status set_bool(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    static const char *const words[] = {"false", "true", "no", "yes", "off", "on"};
    int i;
    tw_status st = get_choice(c, v, words, 6, &i);
    if (st) return st;
    switch ((tw_key_id)c->key) {
    case TW_KEY_OUTPUT_STAC: p->output.stac = (i % 2) == 1; break;
    default: TW_ASSERT(!"set_bool: a key of another kind");
    }
    return TW_OK;
}

static tw_status set_model_weights(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    return get_string(c, v, "a model file path", p->model.weights, TW_PATH_MAX);
}

/* mean or std: finite numbers that fit a float; std must be > 0. */
static tw_status set_norm(wf_ctx *c, const yaml_node_t *v, float *dst, int *n_dst, bool positive)
{
    int n;
    tw_status st = check_list(c, v, "numbers, one per band", TW_MAX_BANDS, &n);
    for (int i = 0; !st && i < n; i++) {
        const yaml_node_t *it = list_item(c, v, i);
        double x;
        st = get_number(c, it, &x);
        if (st) break;
        if (fabs(x) > FLT_MAX)
            st = fail(c, it, "%g is too large for float32", x);
        else if (positive && !(x > 0))
            st = fail(c, it, "%g is out of range (expected a number > 0)", x);
        else
            dst[i] = (float)x;
    }
    if (!st) *n_dst = n;
    return st;
}

static tw_status set_model_mean(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    return set_norm(c, v, p->model.mean, &p->model.n_mean, false);
}

static tw_status set_model_std(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    return set_norm(c, v, p->model.std, &p->model.n_std, true);
}

static tw_status set_model_classes(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    int n;
    tw_status st = check_list(c, v, "class names", TW_MAX_CLASSES, &n);
    for (int i = 0; !st && i < n; i++) {
        const yaml_node_t *it = list_item(c, v, i);
        st = get_string(c, it, "a class name", p->model.classes[i], TW_NAME_MAX);
        /* Names reach terminals, band descriptions and legends: a control
         * character there (ESC, CR, a newline) rewrites what a user sees. */
        for (const unsigned char *ch = (const unsigned char *)p->model.classes[i]; !st && *ch; ch++)
            if (*ch < 0x20 || *ch == 0x7f)
                st = fail(c, it, "class name %d holds a control character (byte 0x%02x)", i + 1,
                          *ch);
        for (int j = 0; !st && j < i; j++)
            if (strcmp(p->model.classes[i], p->model.classes[j]) == 0) {
                char d[WF_SHOW_MAX + 8];
                const char *s = p->model.classes[i];
                st = fail(c, it, "duplicate class name '%s' (items %d and %d)",
                          show(s, strlen(s), d, sizeof d), j + 1, i + 1);
            }
    }
    if (!st) p->model.n_classes = n;
    return st;
}

/* '#rrggbb' (or 'rrggbb', '#rgb') into RGB; false when it is not one. */
static bool parse_color(const char *s, unsigned char rgb[3])
{
    if (*s == '#') s++;
    size_t n = strlen(s);
    if (n != 6 && n != 3) return false;
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)s[i])) return false;
    for (int k = 0; k < 3; k++) {
        char h[3] = {s[n == 6 ? 2 * k : k], s[n == 6 ? 2 * k + 1 : k], 0};
        rgb[k] = (unsigned char)strtoul(h, NULL, 16);
    }
    return true;
}

static tw_status set_model_colors(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    int n;
    tw_status st = check_list(c, v, "class colours ('#rrggbb')", TW_MAX_CLASSES, &n);
    for (int i = 0; !st && i < n; i++) {
        const yaml_node_t *it = list_item(c, v, i);
        const char *s = NULL;
        size_t len = 0;
        st = get_text(c, it, "a colour in quotes, '#rrggbb' (unquoted, # starts a YAML comment)",
                      &s, &len);
        if (!st && !parse_color(s, p->model.colors[i])) {
            char d[WF_SHOW_MAX + 8];
            st = fail(c, it,
                      "'%s' is not a colour (expected '#rrggbb' in quotes, e.g. '#0072bd': "
                      "unquoted, YAML reads # as a comment)",
                      show(s, len, d, sizeof d));
        }
    }
    if (!st) p->model.n_colors = n;
    return st;
}

static tw_status set_runtime_device(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    static const char *what = "auto | cpu | cuda | cuda:N";
    const char *s = NULL;
    size_t len = 0;
    tw_status st = get_text(c, v, what, &s, &len);
    if (st) return st;
    char *dev = p->runtime.device;
    size_t cap = sizeof p->runtime.device;
    if (strcasecmp(s, "auto") == 0 || strcasecmp(s, "cpu") == 0 || strcasecmp(s, "cuda") == 0) {
        for (size_t i = 0; i <= len && i < cap; i++) dev[i] = (char)tolower((unsigned char)s[i]);
        return TW_OK;
    }
    long long n;
    if (strncasecmp(s, "cuda:", 5) == 0 && isdigit((unsigned char)s[5]) && parse_int(s + 5, &n)) {
        if (n > 1023) return fail(c, v, "GPU index %lld is out of range (expected 0..1023)", n);
        snprintf(dev, cap, "cuda:%d", (int)n);
        return TW_OK;
    }
    char d[WF_SHOW_MAX + 8];
    return fail(c, v, "expected %s, got '%s'", what, show(s, len, d, sizeof d));
}

static tw_status set_runtime_memory(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    static const char *what = "a size such as 512MiB, 2GiB, 1.5GB or a number of bytes";
    const char *s = NULL;
    size_t len = 0;
    tw_status st = get_text(c, v, what, &s, &len);
    if (st) return st;
    size_t bytes;
    char d[WF_SHOW_MAX + 8];
    if (tw_parse_bytes(s, &bytes) != 0)
        return fail(c, v, "bad size '%s' (expected %s)", show(s, len, d, sizeof d), what);
    if (bytes < WF_MEMORY_MIN)
        return fail(c, v, "%s is too small (at least 16MiB)", show(s, len, d, sizeof d));
    p->runtime.memory = bytes;
    return TW_OK;
}

static tw_status set_output_dir(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    return get_string(c, v, "a directory path", p->output.dir, TW_PATH_MAX);
}

static tw_status set_output_name(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    if (v && v->type == YAML_MAPPING_NODE) /* name: {stem}_x reads as a YAML mapping */
        return fail(c, v,
                    "expected a name template in quotes, e.g. \"{parent}_{stem}\" "
                    "(unquoted, YAML reads { as the start of a mapping)");
    char tmpl[TW_OUTPUT_NAME_MAX];
    tw_status st = get_string(c, v, "a name template such as \"{stem}\" or \"{parent}_{stem}\"",
                              tmpl, sizeof tmpl);
    if (st) return st;
    char name[TW_OUTPUT_NAME_MAX + 256], why[160];
    if (strchr(tmpl, '/'))
        return fail(c, v, "'%s' holds a '/' (output names are file names in output.dir)", tmpl);
    if (tw_output_name_expand(tmpl, "scene", "folder", 1, name, sizeof name, why, sizeof why) != 0)
        return fail(c, v, "%s", why);
    snprintf(p->output.name, sizeof p->output.name, "%s", tmpl);
    return TW_OK;
}

static tw_status set_output_products(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    const tw_key *key = &tw_keys[c->key];
    int n;
    tw_status st = check_list(c, v, "products", 16, &n);
    unsigned products = 0;
    const char *words[TW_PRODUCT_COUNT];
    for (int k = 0; k < key->n_names; k++) words[k] = tw_key_word(c->key, k);
    for (int i = 0; !st && i < n; i++) {
        int k;
        st = get_choice(c, list_item(c, v, i), words, key->n_names, &k);
        if (st) break;
        /* embeddings live in the HDF5 tile table, so they imply it */
        products |= tw_products[k].bit | tw_products[k].implies;
    }
    if (!st) p->output.products = products;
    return st;
}

static tw_status set_output_creation_options(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    /* An explicit empty list is allowed: it clears the options. */
    if (v && v->type == YAML_SEQUENCE_NODE && list_len(v) == 0) {
        p->output.n_creation_options = 0;
        return TW_OK;
    }
    int n;
    tw_status st = check_list(c, v, "KEY=VALUE strings", TW_MAX_CREATION_OPTIONS, &n);
    for (int i = 0; !st && i < n; i++) {
        const yaml_node_t *it = list_item(c, v, i);
        char *o = p->output.creation_options[i];
        st = get_string(c, it, "a KEY=VALUE string", o, sizeof p->output.creation_options[i]);
        if (!st) {
            const char *eq = strchr(o, '=');
            char d[WF_SHOW_MAX + 8];
            if (!eq || eq == o)
                st = fail(c, it, "expected KEY=VALUE, got '%s'", show(o, strlen(o), d, sizeof d));
        }
    }
    if (!st) p->output.n_creation_options = n;
    return st;
}

/* One setter per key of the table (core/keys.h); tests/test_keys.c checks
 * that none is missing through tw_workflow_key_parsed. */
static const wf_setter k_setters[TW_KEY_COUNT] = {
    [TW_KEY_INPUT_PATH] = set_input_path,
    [TW_KEY_INPUT_BANDS] = set_input_bands,
    [TW_KEY_INPUT_SCALE] = set_number,
    [TW_KEY_INPUT_NODATA] = set_input_nodata,
    [TW_KEY_INPUT_ON_ERROR] = set_enum,
    [TW_KEY_INPUT_ASSETS] = set_input_assets,
    [TW_KEY_INPUT_RETRIES] = set_int,
    [TW_KEY_INPUT_RETRY_DELAY] = set_number,
    [TW_KEY_INPUT_TIMEOUT] = set_number,
    [TW_KEY_INPUT_AOI] = set_input_aoi,
    [TW_KEY_INPUT_DATETIME] = set_input_datetime,
    [TW_KEY_MODEL_WEIGHTS] = set_model_weights,
    [TW_KEY_MODEL_ARCH] = set_enum,
    [TW_KEY_MODEL_MEAN] = set_model_mean,
    [TW_KEY_MODEL_STD] = set_model_std,
    [TW_KEY_MODEL_CLASSES] = set_model_classes,
    [TW_KEY_MODEL_COLORS] = set_model_colors,
    [TW_KEY_MODEL_STEM] = set_enum,
    [TW_KEY_TILING_TILE] = set_int,
    [TW_KEY_TILING_STRIDE] = set_int,
    [TW_KEY_TILING_BATCH] = set_auto_int,
    [TW_KEY_TILING_EDGE] = set_enum,
    [TW_KEY_TILING_MAX_NODATA_FRACTION] = set_number,
    [TW_KEY_RUNTIME_DEVICE] = set_runtime_device,
    [TW_KEY_RUNTIME_PRECISION] = set_enum,
    [TW_KEY_RUNTIME_MEMORY] = set_runtime_memory,
    [TW_KEY_RUNTIME_THREADS] = set_auto_int,
    [TW_KEY_RUNTIME_READERS] = set_auto_int,
    [TW_KEY_OUTPUT_DIR] = set_output_dir,
    [TW_KEY_OUTPUT_NAME] = set_output_name,
    [TW_KEY_OUTPUT_STAC] = set_bool,
    [TW_KEY_OUTPUT_PRODUCTS] = set_output_products,
    [TW_KEY_OUTPUT_PROB_TYPE] = set_enum,
    [TW_KEY_OUTPUT_EMBEDDING_TYPE] = set_enum,
    [TW_KEY_OUTPUT_RESOLUTION] = set_enum,
    [TW_KEY_OUTPUT_FORMAT] = set_enum,
    [TW_KEY_OUTPUT_CREATION_OPTIONS] = set_output_creation_options,
    [TW_KEY_OUTPUT_VECTOR_FORMAT] = set_enum,
    [TW_KEY_OUTPUT_MIN_AREA] = set_number,
    [TW_KEY_OUTPUT_SIMPLIFY] = set_number,
};

static tw_status fail(const wf_ctx *c, const yaml_node_t *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tw_status st =
        fail_v(c, c->in_set, c->in_set ? 0 : node_line(n), tw_keys[c->key].path, fmt, ap);
    va_end(ap);
    return st;
}

static tw_status fail_key(const wf_ctx *c, int k, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tw_status st = fail_v(c, c->origin[k].by_set, c->origin[k].line, tw_keys[k].path, fmt, ap);
    va_end(ap);
    return st;
}

/* ------------------------------------------------------------------------ */
/* key lookup and "did you mean"                                            */

/* Edit distance, capped: names are short (< 64 bytes) in every caller. */
static int edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return INT_MAX;
    int row[64];
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* The known key closest to path ("input.bandz" -> "input.bands"; a known
 * leaf in the wrong section, "input.tile" -> "tiling.tile"), or NULL. */
static const char *suggest_key(const char *path)
{
    const char *dot = strchr(path, '.');
    const char *leaf = dot ? dot + 1 : path;
    const char *best = NULL;
    int best_d = INT_MAX;
    for (int k = 0; k < TW_KEY_COUNT; k++) {
        int d = edit_distance(path, tw_keys[k].path);
        const char *kl = strchr(tw_keys[k].path, '.') + 1;
        if (*leaf && strcmp(kl, leaf) == 0) d = d < 1 ? d : 1;
        if (d < best_d) {
            best_d = d;
            best = tw_keys[k].path;
        }
    }
    int limit = (int)strlen(path) / 3;
    if (limit < 2) limit = 2;
    return best_d <= limit ? best : NULL;
}

static const char *suggest_section(const char *name)
{
    const char *best = NULL;
    int best_d = INT_MAX;
    for (int i = 0; i < N_SECTIONS; i++) {
        int d = edit_distance(name, k_sections[i]);
        if (d < best_d) {
            best_d = d;
            best = k_sections[i];
        }
    }
    return best_d <= 2 ? best : NULL;
}

/* "path, bands, scale" for the keys of one section. */
static void section_keys(const char *section, char *buf, size_t cap)
{
    size_t sl = strlen(section);
    buf[0] = '\0';
    for (int k = 0; k < TW_KEY_COUNT; k++) {
        const char *kp = tw_keys[k].path;
        if (strncmp(kp, section, sl) != 0 || kp[sl] != '.') continue;
        if (buf[0]) strncat(buf, ", ", cap - strlen(buf) - 1);
        strncat(buf, kp + sl + 1, cap - strlen(buf) - 1);
    }
}

/* ------------------------------------------------------------------------ */
/* the document walk                                                        */

/* A mapping key: a non-null scalar without NUL bytes and of sane length. */
static tw_status key_name(wf_ctx *c, const yaml_node_t *k, const char *where, const char **name)
{
    char d[WF_SHOW_MAX + 16];
    if (!k || k->type != YAML_SCALAR_NODE || is_null(k))
        return fail_at(c, node_line(k), where, "expected a key name, got %s",
                       describe(k, d, sizeof d));
    const char *s = (const char *)k->data.scalar.value;
    if (strlen(s) != k->data.scalar.length || k->data.scalar.length > 63) {
        char lbl[TW_ERROR_MSG_MAX / 4];
        snprintf(lbl, sizeof lbl, "%s%s%s", where ? where : "", where ? "." : "",
                 show(s, k->data.scalar.length, d, sizeof d));
        return fail_at(c, node_line(k), lbl, "unknown key");
    }
    *name = s;
    return TW_OK;
}

static tw_status walk_section(wf_ctx *c, const char *section, const yaml_node_t *map,
                              tw_run_params *p, int *seen_line)
{
    char d[WF_SHOW_MAX + 16];
    if (is_null(map)) return TW_OK; /* "runtime:" with nothing under it */
    if (map->type != YAML_MAPPING_NODE)
        return fail_at(c, node_line(map), section, "expected a mapping of keys, got %s",
                       describe(map, d, sizeof d));
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top;
         pr++) {
        const yaml_node_t *kn = yaml_document_get_node(c->doc, pr->key);
        const yaml_node_t *vn = yaml_document_get_node(c->doc, pr->value);
        const char *name;
        tw_status st = key_name(c, kn, section, &name);
        if (st) return st;
        char path[160];
        snprintf(path, sizeof path, "%s.%s", section, name);
        int line = node_line(kn);
        int k = tw_key_find(path);
        if (k < 0) {
            char shown[WF_SHOW_MAX + 80];
            snprintf(shown, sizeof shown, "%s.%s", section, show(name, strlen(name), d, sizeof d));
            const char *s = suggest_key(path);
            if (s) return fail_at(c, line, shown, "unknown key (did you mean %s?)", s);
            char known[256];
            section_keys(section, known, sizeof known);
            return fail_at(c, line, shown, "unknown key (known keys of %s: %s)", section, known);
        }
        if (seen_line[k])
            return fail_at(c, line, path, "duplicate key (first given at line %d)", seen_line[k]);
        seen_line[k] = line;
        c->key = k;
        c->origin[k].line = line;
        c->origin[k].by_set = false;
        st = k_setters[k](c, vn, p);
        if (st) return st;
    }
    return TW_OK;
}

static tw_status walk_document(wf_ctx *c, tw_run_params *p)
{
    char d[WF_SHOW_MAX + 16];
    const yaml_node_t *root = yaml_document_get_root_node(c->doc);
    if (is_null(root))
        return fail_at(
            c, 0, NULL,
            "empty workflow file (expected sections input, model, tiling, runtime, output)");
    /* A file that is one scalar is not a workflow at all (a .netrc, a
     * raster's bytes): say what it is, never its content. */
    if (root->type == YAML_SCALAR_NODE)
        return fail_at(c, node_line(root), NULL,
                       "expected a mapping of sections (input, model, tiling, runtime, output), "
                       "got a plain text of %zu bytes: not a workflow file",
                       root->data.scalar.length);
    if (root->type != YAML_MAPPING_NODE)
        return fail_at(
            c, node_line(root), NULL,
            "expected a mapping of sections (input, model, tiling, runtime, output), got %s",
            describe(root, d, sizeof d));
    int seen_section[N_SECTIONS] = {0};
    int seen_key[TW_KEY_COUNT] = {0};
    for (yaml_node_pair_t *pr = root->data.mapping.pairs.start; pr < root->data.mapping.pairs.top;
         pr++) {
        const yaml_node_t *kn = yaml_document_get_node(c->doc, pr->key);
        const char *name;
        tw_status st = key_name(c, kn, NULL, &name);
        if (st) return st;
        int line = node_line(kn);
        int s = -1;
        for (int i = 0; i < N_SECTIONS; i++)
            if (strcmp(name, k_sections[i]) == 0) s = i;
        if (s < 0) {
            show(name, strlen(name), d, sizeof d);
            const char *dot = strchr(name, '.');
            if (dot && tw_key_find(name) >= 0) /* "tiling.tile: 64" written flat */
                return fail_at(
                    c, line, d,
                    "unknown key (write it nested: '%.*s:' with '%s:' indented under it)",
                    (int)(dot - name), name, dot + 1);
            const char *sug = suggest_section(name);
            if (!sug && dot) sug = suggest_key(name);
            if (sug) return fail_at(c, line, d, "unknown key (did you mean %s?)", sug);
            return fail_at(c, line, d,
                           "unknown section (expected input, model, tiling, runtime, output)");
        }
        if (seen_section[s])
            return fail_at(c, line, name, "duplicate key (first given at line %d)",
                           seen_section[s]);
        seen_section[s] = line;
        st = walk_section(c, k_sections[s], yaml_document_get_node(c->doc, pr->value), p, seen_key);
        if (st) return st;
    }
    return TW_OK;
}

/* libyaml's own error, with the line and column it points at. */
static tw_status yaml_failure(wf_ctx *c, const yaml_parser_t *y, const char *text, size_t len,
                              const char *set_key, const char *set_value)
{
    if (y->error == YAML_MEMORY_ERROR)
        return tw_error_set(c->err, TW_ERR_NOMEM, "%s: out of memory while reading YAML", c->name);
    size_t line, col;
    if (y->error == YAML_READER_ERROR) {
        /* reader errors carry a byte offset, not a mark */
        size_t off = y->problem_offset < len ? y->problem_offset : len;
        line = 0;
        col = 0;
        for (size_t i = 0; i < off; i++) {
            if (text[i] == '\n') {
                line++;
                col = 0;
            } else {
                col++;
            }
        }
    } else {
        line = y->problem_mark.line;
        col = y->problem_mark.column;
    }
    const char *problem = y->problem ? y->problem : "unknown error";
    /* the commonest YAML mistake deserves a plain hint */
    const char *hint = "";
    size_t at = y->error == YAML_READER_ERROR ? y->problem_offset : y->problem_mark.index;
    if (at < len && text[at] == '\t') hint = " (indent YAML with spaces, not tabs)";
    /* {parent}_{stem} unquoted starts a YAML flow mapping: the line of the
     * problem has a value that starts with '{' */
    if (!*hint && y->error != YAML_READER_ERROR && at <= len) {
        size_t b = at, e = at;
        while (b > 0 && text[b - 1] != '\n') b--;
        while (e < len && text[e] != '\n') e++;
        for (size_t i = b; i + 2 < e; i++)
            if (text[i] == ':' && text[i + 1] == ' ' && text[i + 2] == '{') {
                hint = " (a value that starts with '{' is a YAML mapping: quote it, e.g. "
                       "name: \"{parent}_{stem}\")";
                break;
            }
    }
    char ctxbuf[160] = "";
    if (y->context && y->error != YAML_READER_ERROR)
        snprintf(ctxbuf, sizeof ctxbuf, " (%s at line %zu)", y->context,
                 (size_t)y->context_mark.line + 1);
    if (set_key) {
        char d[WF_SHOW_MAX + 8];
        return tw_error_set(c->err, TW_ERR_CONFIG,
                            "--set %s: YAML syntax error in value '%s': %s%s%s", set_key,
                            show(set_value, strlen(set_value), d, sizeof d), problem, ctxbuf, hint);
    }
    return tw_error_set(c->err, TW_ERR_CONFIG, "%s:%zu:%zu: YAML syntax error: %s%s%s", c->name,
                        line + 1, col + 1, problem, ctxbuf, hint);
}

/* libyaml's scanner does work proportional to the flow nesting depth for
 * every token, so 100k '[' take minutes. No workflow nests more than a few
 * levels: refuse deep nesting before libyaml sees it. Brackets are counted
 * everywhere, quotes and comments included, so that no quoting trick can hide
 * nesting from this check; only absurd files can be refused by it. */
#define WF_FLOW_DEPTH_MAX 64

static tw_status check_nesting(wf_ctx *c, const char *text, size_t len, const char *set_key)
{
    int depth = 0, line = 1;
    for (size_t i = 0; i < len; i++) {
        char ch = text[i];
        if (ch == '\n')
            line++;
        else if (ch == '[' || ch == '{')
            depth++;
        else if ((ch == ']' || ch == '}') && depth > 0)
            depth--;
        if (depth > WF_FLOW_DEPTH_MAX) {
            if (set_key)
                return tw_error_set(c->err, TW_ERR_CONFIG,
                                    "--set %s: value nested deeper than %d levels", set_key,
                                    WF_FLOW_DEPTH_MAX);
            return fail_at(c, line, NULL, "YAML nested deeper than %d levels of [ ] or { }",
                           WF_FLOW_DEPTH_MAX);
        }
    }
    return TW_OK;
}

/* Load text as one YAML document into *doc (deleted by the caller on
 * success only: libyaml frees it itself when loading fails). */
static tw_status load_document(wf_ctx *c, yaml_document_t *doc, const char *text, size_t len,
                               const char *set_key)
{
    tw_status st = check_nesting(c, text, len, set_key);
    if (st) return st;
    yaml_parser_t y;
    if (!yaml_parser_initialize(&y))
        return tw_error_set(c->err, TW_ERR_NOMEM, "%s: out of memory while reading YAML", c->name);
    yaml_parser_set_input_string(&y, (const unsigned char *)text, len);
    if (!yaml_parser_load(&y, doc)) {
        st = yaml_failure(c, &y, text, len, set_key, text);
        yaml_parser_delete(&y);
        return st;
    }
    /* A second document would be silently ignored: say so instead. */
    if (yaml_document_get_root_node(doc)) {
        yaml_document_t extra;
        if (!yaml_parser_load(&y, &extra)) {
            st = yaml_failure(c, &y, text, len, set_key, text);
        } else {
            const yaml_node_t *r = yaml_document_get_root_node(&extra);
            if (r) {
                if (set_key)
                    st =
                        tw_error_set(c->err, TW_ERR_CONFIG,
                                     "--set %s: more than one YAML document in the value", set_key);
                else
                    st = fail_at(c, node_line(r), NULL,
                                 "only one YAML document is allowed in a workflow file");
            }
            yaml_document_delete(&extra);
        }
    }
    yaml_parser_delete(&y);
    if (st) yaml_document_delete(doc);
    return st;
}

static tw_status apply_set(wf_ctx *c, const char *set, tw_run_params *p)
{
    char d[WF_SHOW_MAX + 16];
    if (!set) return tw_error_set(c->err, TW_ERR_CONFIG, "--set: missing key.path=value");
    const char *eq = strchr(set, '=');
    const char *kb = set, *ke = eq ? eq : set + strlen(set);
    while (kb < ke && isspace((unsigned char)*kb)) kb++;
    while (ke > kb && isspace((unsigned char)ke[-1])) ke--;
    char key[64];
    size_t kl = (size_t)(ke - kb);
    if (!eq || kl == 0)
        return tw_error_set(c->err, TW_ERR_CONFIG,
                            "--set %s: expected key.path=value (e.g. tiling.tile=32)",
                            show(set, strlen(set), d, sizeof d));
    int k = -1;
    if (kl < sizeof key) {
        memcpy(key, kb, kl);
        key[kl] = '\0';
        k = tw_key_find(key);
    }
    if (k < 0) {
        show(kb, kl, d, sizeof d);
        const char *s = kl < sizeof key ? suggest_key(key) : NULL;
        if (s)
            return tw_error_set(c->err, TW_ERR_CONFIG, "--set %s: unknown key (did you mean %s?)",
                                d, s);
        return tw_error_set(c->err, TW_ERR_CONFIG, "--set %s: unknown key", d);
    }
    const char *value = eq + 1;
    /* A string key's value that starts with '{' is a name template such as
     * {parent}_{stem}, never a YAML flow mapping (no string key takes one):
     * it is read as written, double-quoted for the parser. */
    char *quoted = NULL;
    const char *v0 = value;
    while (*v0 == ' ') v0++;
    if (*v0 == '{' && (tw_keys[k].type == TW_KT_STRING || tw_keys[k].type == TW_KT_PATH)) {
        size_t n = strlen(value);
        quoted = malloc(2 * n + 3);
        if (!quoted) return tw_error_set(c->err, TW_ERR_NOMEM, "out of memory");
        size_t o = 0;
        quoted[o++] = '"';
        for (size_t i = 0; i < n; i++) {
            if (value[i] == '"' || value[i] == '\\') quoted[o++] = '\\';
            quoted[o++] = value[i];
        }
        quoted[o++] = '"';
        quoted[o] = '\0';
        value = quoted;
    }
    yaml_document_t doc;
    tw_status st = load_document(c, &doc, value, strlen(value), tw_keys[k].path);
    free(quoted);
    if (st) return st;
    yaml_document_t *saved = c->doc;
    c->doc = &doc;
    c->in_set = true;
    c->key = k;
    st = k_setters[k](c, yaml_document_get_root_node(&doc), p);
    c->in_set = false;
    c->doc = saved;
    yaml_document_delete(&doc);
    if (!st) {
        c->origin[k].by_set = true;
        c->origin[k].line = 0;
    }
    return st;
}

static bool given(const wf_ctx *c, int k)
{
    return c->origin[k].by_set || c->origin[k].line > 0;
}

/* Checks that involve more than one key, after the file and the overrides. */
static tw_status check_all(wf_ctx *c, const tw_run_params *p)
{
    if (!given(c, TW_KEY_INPUT_PATH))
        return fail_at(c, 0, NULL, "input.path is required (the raster(s) to classify)");
    if (!given(c, TW_KEY_MODEL_WEIGHTS))
        return fail_at(
            c, 0, NULL,
            "model.weights is required (an HDF5 bundle, a safetensors file or an ONNX model)");
    const tw_tiling_params *t = &p->tiling;
    char why[TW_ERROR_MSG_MAX / 2];
    if (t->tile > 0 && t->stride > 0 &&
        tw_key_check_stride(t->tile, t->stride, NULL, why, sizeof why) != 0)
        return fail_key(c, TW_KEY_TILING_STRIDE, "%s", why);
    const tw_model_params *m = &p->model;
    if (m->n_mean > 0 && m->n_std > 0 && m->n_mean != m->n_std)
        return fail_key(c, TW_KEY_MODEL_STD,
                        "%d values but model.mean has %d (expected one per band)", m->n_std,
                        m->n_mean);
    if (p->input.n_bands > 0) {
        if (m->n_mean > 0 && m->n_mean != p->input.n_bands)
            return fail_key(c, TW_KEY_MODEL_MEAN,
                            "%d values but input.bands selects %d bands (expected one per band)",
                            m->n_mean, p->input.n_bands);
        if (m->n_std > 0 && m->n_std != p->input.n_bands)
            return fail_key(c, TW_KEY_MODEL_STD,
                            "%d values but input.bands selects %d bands (expected one per band)",
                            m->n_std, p->input.n_bands);
    }
    /* the products against other keys (the C API's runs are parsed too) */
    const tw_output_params *o = &p->output;
    if ((o->products & TW_PRODUCT_EMB_RASTER) && o->resolution == TW_RESOLUTION_INPUT)
        return fail_key(c, TW_KEY_OUTPUT_RESOLUTION,
                        "input is not available for embedding_raster (a raster of output cells); "
                        "use resolution: cells");
    if ((o->products & TW_PRODUCT_EMB_RASTER) && o->emb_type == TW_EMB_FLOAT16 &&
        o->format == TW_FORMAT_COG)
        return fail_key(c, TW_KEY_OUTPUT_EMBEDDING_TYPE,
                        "float16 cannot be written as a COG with GDAL %s (its COG driver fills "
                        "half-float overviews with garbage); use float32 or int8, or "
                        "output.format: GTiff",
                        GDALVersionInfo("RELEASE_NAME"));
    return TW_OK;
}

tw_status tw_workflow_parse(const char *name, const char *text, size_t len, const char *const *sets,
                            int n_sets, tw_run_params *out, tw_error *err)
{
    TW_ASSERT(out != NULL);
    TW_ASSERT(text != NULL || len == 0);
    if (!name) name = "<workflow>";
    wf_ctx c;
    memset(&c, 0, sizeof c);
    c.name = name;
    c.err = err;
    if (strlen(name) >= TW_PATH_MAX)
        return fail_at(&c, 0, NULL, "workflow path too long (at most %d bytes)", TW_PATH_MAX - 1);
    /* ~100 KiB: on the heap, so that threads with small stacks can call us */
    tw_run_params *p = malloc(sizeof *p);
    if (!p) return tw_error_set(err, TW_ERR_NOMEM, "%s: out of memory", name);
    *p = tw_run_default_params();

    yaml_document_t doc;
    tw_status st = load_document(&c, &doc, text ? text : "", len, NULL);
    if (!st) {
        c.doc = &doc;
        st = walk_document(&c, p);
        c.doc = NULL;
        yaml_document_delete(&doc);
    }
    for (int i = 0; !st && i < n_sets; i++) st = apply_set(&c, sets[i], p);
    if (!st) st = check_all(&c, p);
    if (!st) {
        snprintf(p->workflow_path, sizeof p->workflow_path, "%s", name);
        *out = *p;
    }
    free(p);
    return st;
}

tw_status tw_workflow_load(const char *path, const char *const *sets, int n_sets,
                           tw_run_params *out, tw_error *err)
{
    if (!path || !*path) return tw_error_set(err, TW_ERR_CONFIG, "no workflow file given");
    /* a FIFO would block the open until a writer came */
    tw_status rst = tw_path_check_regular(path, "workflow file", false, TW_ERR_CONFIG, err);
    if (rst != TW_OK) return rst;
    FILE *f = fopen(path, "rb");
    if (!f)
        return tw_error_set(err, TW_ERR_CONFIG, "%s: cannot open workflow file: %s", path,
                            strerror(errno));
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    tw_status st = TW_OK;
    if (!buf) st = tw_error_set(err, TW_ERR_NOMEM, "%s: out of memory", path);
    while (!st) {
        if (len == cap) {
            if (cap >= WF_FILE_MAX) {
                st = tw_error_set(err, TW_ERR_CONFIG,
                                  "%s: workflow file larger than %zu MiB: is it a YAML file?", path,
                                  WF_FILE_MAX >> 20);
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                st = tw_error_set(err, TW_ERR_NOMEM, "%s: out of memory", path);
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f))
                st = tw_error_set(err, TW_ERR_CONFIG, "%s: cannot read workflow file: %s", path,
                                  strerror(errno));
            break;
        }
    }
    fclose(f);
    if (!st) st = tw_workflow_parse(path, buf, len, sets, n_sets, out, err);
    free(buf);
    return st;
}

int tw_parse_bytes(const char *s, size_t *out)
{
    static const struct {
        const char *unit;
        size_t mult;
    } units[] = {
        {"", 1},
        {"b", 1},
        /* single letters as SLURM and sort(1) read them: powers of 1024 */
        {"k", (size_t)1 << 10},
        {"m", (size_t)1 << 20},
        {"g", (size_t)1 << 30},
        {"t", (size_t)1 << 40},
        {"kib", (size_t)1 << 10},
        {"mib", (size_t)1 << 20},
        {"gib", (size_t)1 << 30},
        {"tib", (size_t)1 << 40},
        {"kb", 1000},
        {"mb", 1000000},
        {"gb", 1000000000},
        {"tb", (size_t)1000000000000ULL},
    };
    if (!s || !out) return -1;
    const char *p = s;
    while (isdigit((unsigned char)*p)) p++;
    const char *int_end = p;
    bool frac = false;
    if (*p == '.') {
        frac = true;
        p++;
        while (isdigit((unsigned char)*p)) p++;
    }
    const char *num_end = p;
    size_t ndigits = (size_t)(num_end - s) - (frac ? 1 : 0);
    if (ndigits == 0 || num_end - s > 40) return -1;
    /* "2 GiB" is fine, a lone trailing space is not */
    if (*p == ' ' && p[1] != '\0') p++;
    size_t mult = 0;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcasecmp(p, units[i].unit) == 0) {
            mult = units[i].mult;
            break;
        }
    if (mult == 0) return -1;
    if (!frac) {
        if (int_end == s) return -1;
        char buf[48];
        memcpy(buf, s, (size_t)(int_end - s));
        buf[int_end - s] = '\0';
        errno = 0;
        unsigned long long v = strtoull(buf, NULL, 10);
        if (errno == ERANGE || v > SIZE_MAX / mult || v == 0) return -1;
        *out = (size_t)v * mult;
        return 0;
    }
    char buf[48];
    memcpy(buf, s, (size_t)(num_end - s));
    buf[num_end - s] = '\0';
    double v = strtod(buf, NULL) * (double)mult;
    /* (double)SIZE_MAX rounds up to 2^64, which itself does not fit */
    if (!(v >= 1.0) || !(v < (double)SIZE_MAX)) return -1;
    *out = (size_t)v;
    return 0;
}
