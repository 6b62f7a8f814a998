/* model_file.c - safetensors and HDF5-bundle readers (see model_file.h).
 *
 * Model files come from users and the internet, so every byte of a
 * safetensors header is distrusted: the header length is bounded, the JSON is
 * parsed by a small strict parser with a depth limit, and every tensor's
 * dtype, shape and byte range are checked (inside the data, no overlap, size
 * matching the shape) before anything is read. The HDF5 side relies on the
 * library's own checks but turns each failure into one message naming the
 * file and the dataset or attribute.
 */
#include "io/model_file.h"

#include <errno.h>
#include <hdf5.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"

/* A safetensors header larger than this is not a model we could use anyway
 * (a ResNet-152 header is ~100 KiB); refusing early avoids huge allocations. */
#define ST_MAX_HEADER (100u * 1024u * 1024u)
#define JSON_MAX_DEPTH 16
#define SHA_CHUNK (1u << 20)

static const unsigned char HDF5_SIGNATURE[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

/* Record a TW_ERR_MODEL message prefixed with the file name. */
static tw_status model_error(tw_error *err, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static tw_status model_error(tw_error *err, const char *path, const char *fmt, ...)
{
    char buf[TW_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return tw_error_set(err, TW_ERR_MODEL, "model file %s: %s", path, buf);
}

static tw_status nomem_error(tw_error *err, const char *path, size_t bytes)
{
    return tw_error_set(err, TW_ERR_NOMEM, "model file %s: cannot allocate %zu bytes", path, bytes);
}

/* ------------------------------------------------------------------------ */
/* SHA-256 (FIPS 180-4)                                                      */

typedef struct sha256_ctx {
    uint32_t h[8];
    uint64_t total;
    unsigned char block[64];
    size_t fill;
} sha256_ctx;

static const uint32_t SHA_K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

/* A macro, not a function: debug/sanitizer builds do not inline, and hashing
 * a 100 MB model there would take several times longer. */
#define ROTR32(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_init(sha256_ctx *c)
{
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, h0, sizeof h0);
    c->total = 0;
    c->fill = 0;
}

/* Fixed-size loops over a 64-byte block and local arrays only; sanitizer
 * instrumentation here made hashing a 100 MB model ~10x slower in the
 * sanitizer test run without checking anything that can go wrong. */
__attribute__((no_sanitize("address", "undefined"))) static void
sha256_block(sha256_ctx *c, const unsigned char *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROTR32(w[i - 15], 7) ^ ROTR32(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROTR32(w[i - 2], 17) ^ ROTR32(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = c->h[0], b = c->h[1], cc = c->h[2], d = c->h[3];
    uint32_t e = c->h[4], f = c->h[5], g = c->h[6], h = c->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ROTR32(e, 6) ^ ROTR32(e, 11) ^ ROTR32(e, 25)) + ((e & f) ^ (~e & g)) +
                      SHA_K[i] + w[i];
        uint32_t t2 =
            (ROTR32(a, 2) ^ ROTR32(a, 13) ^ ROTR32(a, 22)) + ((a & b) ^ (a & cc) ^ (b & cc));
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = cc;
        cc = b;
        b = a;
        a = t1 + t2;
    }
    c->h[0] += a;
    c->h[1] += b;
    c->h[2] += cc;
    c->h[3] += d;
    c->h[4] += e;
    c->h[5] += f;
    c->h[6] += g;
    c->h[7] += h;
}

static void sha256_update(sha256_ctx *c, const unsigned char *p, size_t n)
{
    c->total += n;
    while (n > 0) {
        if (c->fill == 0 && n >= 64) {
            sha256_block(c, p);
            p += 64;
            n -= 64;
            continue;
        }
        size_t take = 64 - c->fill < n ? 64 - c->fill : n;
        memcpy(c->block + c->fill, p, take);
        c->fill += take;
        p += take;
        n -= take;
        if (c->fill == 64) {
            sha256_block(c, c->block);
            c->fill = 0;
        }
    }
}

static void sha256_final_hex(sha256_ctx *c, char hex[65])
{
    uint64_t bits = c->total * 8;
    unsigned char pad[72] = {0x80};
    size_t padlen = (c->fill < 56 ? 56 : 120) - c->fill;
    for (int i = 0; i < 8; i++) pad[padlen + i] = (unsigned char)(bits >> (56 - 8 * i));
    uint64_t keep = c->total;
    sha256_update(c, pad, padlen + 8);
    c->total = keep;
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", (unsigned)(c->h[i / 4] >> (24 - 8 * (i % 4))) & 0xffu);
    hex[64] = '\0';
}

/* Hash the whole file and report its size. */
static tw_status hash_file(const char *path, char hex[65], uint64_t *size, tw_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return model_error(err, path, "cannot open: %s", strerror(errno));
    unsigned char *buf = tw_alloc(TW_MEM_OTHER, SHA_CHUNK);
    if (!buf) {
        fclose(f);
        return nomem_error(err, path, SHA_CHUNK);
    }
    sha256_ctx c;
    sha256_init(&c);
    size_t n;
    while ((n = fread(buf, 1, SHA_CHUNK, f)) > 0) sha256_update(&c, buf, n);
    int failed = ferror(f);
    tw_free(buf);
    fclose(f);
    if (failed) return model_error(err, path, "read error while hashing");
    sha256_final_hex(&c, hex);
    *size = c.total;
    return TW_OK;
}

/* ------------------------------------------------------------------------ */
/* A strict JSON parser producing a flat token array (no allocation per
 * value). Objects and arrays record their member count and the index just
 * past their subtree so that callers can walk siblings without recursion. */

typedef enum json_type { J_OBJ, J_ARR, J_STR, J_NUM, J_TRUE, J_FALSE, J_NULL } json_type;

typedef struct json_tok {
    json_type type;
    size_t start, end; /* text span; for strings without the quotes */
    int size;          /* pairs of an object, items of an array */
    int next;          /* index of the token after this subtree */
} json_tok;

typedef struct json_doc {
    const char *text;
    size_t len, pos;
    json_tok *toks;
    int n, cap;
    char why[160]; /* what went wrong, with the byte offset */
} json_doc;

static void json_skip_ws(json_doc *d)
{
    while (d->pos < d->len) {
        char ch = d->text[d->pos];
        if (ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r') break;
        d->pos++;
    }
}

static int json_fail(json_doc *d, const char *what)
{
    snprintf(d->why, sizeof d->why, "%s at byte %zu", what, d->pos);
    return -1;
}

static int json_new_tok(json_doc *d, json_type t)
{
    if (d->n == d->cap) {
        /* the token count is bounded by the text length, so this cannot run away */
        int cap = d->cap ? d->cap * 2 : 256;
        json_tok *nt = realloc(d->toks, (size_t)cap * sizeof *nt);
        if (!nt) return json_fail(d, "out of memory");
        d->toks = nt;
        d->cap = cap;
    }
    json_tok *k = &d->toks[d->n];
    k->type = t;
    k->start = k->end = d->pos;
    k->size = 0;
    k->next = d->n + 1;
    return d->n++;
}

static bool is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static int json_parse_string(json_doc *d)
{
    d->pos++; /* opening quote */
    int t = json_new_tok(d, J_STR);
    if (t < 0) return -1;
    d->toks[t].start = d->pos;
    while (d->pos < d->len) {
        unsigned char ch = (unsigned char)d->text[d->pos];
        if (ch == '"') {
            d->toks[t].end = d->pos++;
            return t;
        }
        if (ch < 0x20) return json_fail(d, "control character in a string");
        if (ch == '\\') {
            d->pos++;
            if (d->pos >= d->len) break;
            char e = d->text[d->pos];
            if (e == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (d->pos + i >= d->len || !is_hex(d->text[d->pos + i]))
                        return json_fail(d, "bad \\u escape");
                d->pos += 4;
            } else if (!strchr("\"\\/bfnrt", e) || e == '\0') {
                return json_fail(d, "bad escape in a string");
            }
        }
        d->pos++;
    }
    return json_fail(d, "unterminated string");
}

static int json_parse_number(json_doc *d)
{
    int t = json_new_tok(d, J_NUM);
    if (t < 0) return -1;
    const char *s = d->text;
    size_t p = d->pos;
    if (p < d->len && s[p] == '-') p++;
    if (p >= d->len || s[p] < '0' || s[p] > '9') return json_fail(d, "bad number");
    if (s[p] == '0') {
        p++;
    } else {
        while (p < d->len && s[p] >= '0' && s[p] <= '9') p++;
    }
    if (p < d->len && s[p] == '.') {
        p++;
        if (p >= d->len || s[p] < '0' || s[p] > '9') return json_fail(d, "bad number");
        while (p < d->len && s[p] >= '0' && s[p] <= '9') p++;
    }
    if (p < d->len && (s[p] == 'e' || s[p] == 'E')) {
        p++;
        if (p < d->len && (s[p] == '+' || s[p] == '-')) p++;
        if (p >= d->len || s[p] < '0' || s[p] > '9') return json_fail(d, "bad number");
        while (p < d->len && s[p] >= '0' && s[p] <= '9') p++;
    }
    d->toks[t].end = p;
    d->pos = p;
    return t;
}

static int json_parse_value(json_doc *d, int depth);

static int json_parse_container(json_doc *d, int depth, bool is_obj)
{
    if (depth >= JSON_MAX_DEPTH) return json_fail(d, "nesting too deep");
    int t = json_new_tok(d, is_obj ? J_OBJ : J_ARR);
    if (t < 0) return -1;
    char close = is_obj ? '}' : ']';
    d->pos++;
    json_skip_ws(d);
    if (d->pos < d->len && d->text[d->pos] == close) {
        d->pos++;
        d->toks[t].end = d->pos;
        d->toks[t].next = d->n;
        return t;
    }
    for (;;) {
        json_skip_ws(d);
        if (is_obj) {
            if (d->pos >= d->len || d->text[d->pos] != '"') return json_fail(d, "expected a key");
            if (json_parse_string(d) < 0) return -1;
            json_skip_ws(d);
            if (d->pos >= d->len || d->text[d->pos] != ':') return json_fail(d, "expected ':'");
            d->pos++;
        }
        if (json_parse_value(d, depth + 1) < 0) return -1;
        d->toks[t].size++;
        json_skip_ws(d);
        if (d->pos >= d->len) return json_fail(d, "unexpected end");
        char ch = d->text[d->pos];
        if (ch == ',') {
            d->pos++;
            continue;
        }
        if (ch == close) {
            d->pos++;
            break;
        }
        return json_fail(d, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
    d->toks[t].end = d->pos;
    d->toks[t].next = d->n;
    return t;
}

static int json_parse_value(json_doc *d, int depth)
{
    json_skip_ws(d);
    if (d->pos >= d->len) return json_fail(d, "unexpected end");
    char ch = d->text[d->pos];
    if (ch == '{') return json_parse_container(d, depth, true);
    if (ch == '[') return json_parse_container(d, depth, false);
    if (ch == '"') return json_parse_string(d);
    if (ch == '-' || (ch >= '0' && ch <= '9')) return json_parse_number(d);
    static const struct {
        const char *word;
        json_type type;
    } lits[] = {{"true", J_TRUE}, {"false", J_FALSE}, {"null", J_NULL}};
    for (size_t i = 0; i < sizeof lits / sizeof lits[0]; i++) {
        size_t n = strlen(lits[i].word);
        if (d->len - d->pos >= n && memcmp(d->text + d->pos, lits[i].word, n) == 0) {
            int t = json_new_tok(d, lits[i].type);
            if (t < 0) return -1;
            d->pos += n;
            d->toks[t].end = d->pos;
            return t;
        }
    }
    return json_fail(d, "unexpected character");
}

/* Parse text[0..len) as one JSON value followed only by whitespace. Returns 0
 * or -1 with d->why set; d->toks must be freed by the caller either way. */
static int json_parse(json_doc *d, const char *text, size_t len)
{
    memset(d, 0, sizeof *d);
    d->text = text;
    d->len = len;
    if (json_parse_value(d, 0) < 0) return -1;
    json_skip_ws(d);
    if (d->pos != d->len) return json_fail(d, "trailing characters");
    return 0;
}

static void json_free(json_doc *d)
{
    free(d->toks);
    d->toks = NULL;
}

static int hex_val(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return c - 'A' + 10;
}

static size_t utf8_put(char *out, uint32_t cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Decode a string token into out (NUL-terminated). Returns false if it does
 * not fit in cap bytes or decodes to an embedded NUL (a name we cannot keep). */
static bool json_str(const json_doc *d, int t, char *out, size_t cap)
{
    const json_tok *k = &d->toks[t];
    size_t o = 0;
    for (size_t p = k->start; p < k->end;) {
        char buf[8];
        size_t n;
        char ch = d->text[p];
        if (ch != '\\') {
            buf[0] = ch;
            n = 1;
            p++;
        } else {
            char e = d->text[p + 1];
            p += 2;
            if (e == 'u') {
                uint32_t cp = 0;
                for (int i = 0; i < 4; i++) cp = cp * 16 + (uint32_t)hex_val(d->text[p + i]);
                p += 4;
                /* a high surrogate followed by an escaped low one is one code point */
                if (cp >= 0xd800 && cp < 0xdc00 && p + 6 <= k->end && d->text[p] == '\\' &&
                    d->text[p + 1] == 'u') {
                    uint32_t lo = 0;
                    for (int i = 0; i < 4; i++)
                        lo = lo * 16 + (uint32_t)hex_val(d->text[p + 2 + i]);
                    if (lo >= 0xdc00 && lo < 0xe000) {
                        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                        p += 6;
                    }
                }
                if (cp == 0) return false;
                n = utf8_put(buf, cp);
            } else {
                static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
                buf[0] = to[strchr(from, e) - from];
                n = 1;
            }
        }
        if (o + n >= cap) return false;
        memcpy(out + o, buf, n);
        o += n;
    }
    out[o] = '\0';
    return true;
}

/* Is token t a string equal to s? */
static bool json_str_eq(const json_doc *d, int t, const char *s)
{
    char buf[256];
    return d->toks[t].type == J_STR && json_str(d, t, buf, sizeof buf) && strcmp(buf, s) == 0;
}

/* Integer value of a number token (no fraction or exponent). */
static bool json_int(const json_doc *d, int t, int64_t *v)
{
    const json_tok *k = &d->toks[t];
    size_t n = k->end - k->start;
    if (k->type != J_NUM || n == 0 || n > 20) return false;
    char buf[24];
    memcpy(buf, d->text + k->start, n);
    buf[n] = '\0';
    if (strpbrk(buf, ".eE")) return false;
    errno = 0;
    char *end;
    long long x = strtoll(buf, &end, 10);
    if (errno || *end) return false;
    *v = x;
    return true;
}

static bool json_num(const json_doc *d, int t, double *v)
{
    const json_tok *k = &d->toks[t];
    size_t n = k->end - k->start;
    if (k->type != J_NUM || n == 0 || n > 63) return false;
    char buf[64];
    memcpy(buf, d->text + k->start, n);
    buf[n] = '\0';
    char *end;
    *v = strtod(buf, &end);
    return *end == '\0' && isfinite(*v);
}

/* ------------------------------------------------------------------------ */
/* Metadata shared by both formats. Values arrive as JSON (safetensors) or as
 * HDF5 attributes (bundle); both end in these checks. */

static const char *const KNOWN_ARCHS[] = {"resnet18", "resnet34", "resnet50", "resnet101",
                                          "resnet152"};

static tw_status set_arch(tw_model_file *mf, const char *arch, tw_error *err)
{
    for (size_t i = 0; i < sizeof KNOWN_ARCHS / sizeof KNOWN_ARCHS[0]; i++) {
        if (strcmp(arch, KNOWN_ARCHS[i]) == 0) {
            snprintf(mf->arch, sizeof mf->arch, "%s", arch);
            return TW_OK;
        }
    }
    return model_error(err, mf->path,
                       "metadata 'arch' is '%.40s' (expected resnet18/34/50/101/152)", arch);
}

static tw_status set_bands(tw_model_file *mf, const int64_t *v, int64_t n, tw_error *err)
{
    if (n < 1 || n > TW_MAX_BANDS)
        return model_error(err, mf->path, "metadata 'bands' has %lld entries (1..%d allowed)",
                           (long long)n, TW_MAX_BANDS);
    for (int64_t i = 0; i < n; i++) {
        if (v[i] < 1 || v[i] > 65535)
            return model_error(err, mf->path, "metadata 'bands'[%lld] = %lld is not a 1-based band",
                               (long long)i, (long long)v[i]);
        mf->bands[i] = (int)v[i];
    }
    mf->n_bands = (int)n;
    return TW_OK;
}

static tw_status set_floats(tw_model_file *mf, const char *key, const double *v, int64_t n,
                            float *dst, int *n_dst, bool positive, tw_error *err)
{
    if (n < 1 || n > TW_MAX_BANDS)
        return model_error(err, mf->path, "metadata '%s' has %lld entries (1..%d allowed)", key,
                           (long long)n, TW_MAX_BANDS);
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(v[i]) || (positive && !(v[i] > 0)))
            return model_error(err, mf->path, "metadata '%s'[%lld] = %g is not %s", key,
                               (long long)i, v[i], positive ? "a positive number" : "finite");
        dst[i] = (float)v[i];
    }
    *n_dst = (int)n;
    return TW_OK;
}

static tw_status set_scale(tw_model_file *mf, double v, tw_error *err)
{
    if (!isfinite(v) || v == 0)
        return model_error(err, mf->path, "metadata 'scale' = %g must be finite and non-zero", v);
    mf->scale = v;
    return TW_OK;
}

static tw_status set_tile(tw_model_file *mf, int64_t v, tw_error *err)
{
    if (v < 1 || v > 65536)
        return model_error(err, mf->path, "metadata 'tile' = %lld is out of range 1..65536",
                           (long long)v);
    mf->tile = (int)v;
    return TW_OK;
}

static tw_status set_class(tw_model_file *mf, int i, const char *name, tw_error *err)
{
    if (strlen(name) >= TW_NAME_MAX || name[0] == '\0')
        return model_error(err, mf->path, "metadata 'classes'[%d] is empty or longer than %d bytes",
                           i, TW_NAME_MAX - 1);
    snprintf(mf->classes[i], TW_NAME_MAX, "%s", name);
    return TW_OK;
}

/* ------------------------------------------------------------------------ */
/* Tensor conversion                                                         */

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        /* subnormal half: exact in float as man * 2^-24 */
        float f = (float)man * 5.9604644775390625e-08f;
        return sign ? -f : f;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

typedef enum st_dtype { ST_F32, ST_F16, ST_BF16, ST_SKIP } st_dtype;

/* Little-endian bytes to float, whatever the host's endianness. */
static void convert_le(st_dtype dt, const unsigned char *src, float *dst, int64_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (dt == ST_F32) { /* the common case needs no per-element work */
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) {
        if (dt == ST_F32) {
            const unsigned char *p = src + 4 * i;
            uint32_t u =
                (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            memcpy(&dst[i], &u, 4);
        } else {
            const unsigned char *p = src + 2 * i;
            uint16_t u = (uint16_t)(p[0] | p[1] << 8);
            if (dt == ST_F16) {
                dst[i] = half_to_float(u);
            } else {
                uint32_t w = (uint32_t)u << 16;
                memcpy(&dst[i], &w, 4);
            }
        }
    }
}

static tw_model_file *model_file_new(const char *path)
{
    tw_model_file *mf = tw_calloc(TW_MEM_OTHER, 1, sizeof *mf);
    if (!mf) return NULL;
    snprintf(mf->path, sizeof mf->path, "%s", path);
    mf->scale = NAN;
    return mf;
}

void tw_model_file_destroy(tw_model_file *mf)
{
    if (!mf) return;
    for (int i = 0; i < mf->n_tensors; i++) tw_free(mf->tensors[i].data);
    tw_free(mf->tensors);
    tw_free(mf);
}

const tw_tensor *tw_model_file_find(const tw_model_file *mf, const char *name)
{
    if (!mf || !name) return NULL;
    for (int i = 0; i < mf->n_tensors; i++)
        if (strcmp(mf->tensors[i].name, name) == 0) return &mf->tensors[i];
    return NULL;
}

static void shape_str(const tw_tensor *t, char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, i ? ",%lld" : "%lld", (long long)t->shape[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* The loader promises a ResNet state_dict, so check the few tensors every
 * consumer relies on, and that the metadata agrees with them. The rest of
 * the graph is checked by model/resnet.c against the architecture. */
static tw_status check_resnet(tw_model_file *mf, tw_error *err)
{
    const tw_tensor *conv1 = tw_model_file_find(mf, "conv1.weight");
    const tw_tensor *fcw = tw_model_file_find(mf, "fc.weight");
    const tw_tensor *fcb = tw_model_file_find(mf, "fc.bias");
    const char *missing = !conv1 ? "conv1.weight" : !fcw ? "fc.weight" : !fcb ? "fc.bias" : NULL;
    if (missing)
        return model_error(err, mf->path,
                           "no tensor '%s': not a torchvision-layout ResNet state_dict", missing);
    char s1[64], s2[64];
    if (conv1->ndim != 4) {
        shape_str(conv1, s1, sizeof s1);
        return model_error(err, mf->path, "tensor 'conv1.weight' has shape %s (expected 4-D)", s1);
    }
    if (fcw->ndim != 2 || fcb->ndim != 1 || fcb->shape[0] != fcw->shape[0]) {
        shape_str(fcw, s1, sizeof s1);
        shape_str(fcb, s2, sizeof s2);
        return model_error(
            err, mf->path,
            "tensor 'fc.weight' %s and 'fc.bias' %s do not fit (expected [K,C] and [K])", s1, s2);
    }
    int64_t in_bands = conv1->shape[1], k = fcw->shape[0];
    if (mf->n_bands && mf->n_bands != in_bands)
        return model_error(err, mf->path,
                           "metadata 'bands' lists %d bands but conv1.weight takes %lld",
                           mf->n_bands, (long long)in_bands);
    if (mf->n_mean && mf->n_mean != in_bands)
        return model_error(err, mf->path,
                           "metadata 'mean' has %d values but conv1.weight takes %lld bands",
                           mf->n_mean, (long long)in_bands);
    if (mf->n_std && mf->n_std != in_bands)
        return model_error(err, mf->path,
                           "metadata 'std' has %d values but conv1.weight takes %lld bands",
                           mf->n_std, (long long)in_bands);
    if (mf->n_classes && mf->n_classes != k)
        return model_error(err, mf->path,
                           "metadata 'classes' names %d classes but fc.weight has %lld",
                           mf->n_classes, (long long)k);
    return TW_OK;
}

/* ------------------------------------------------------------------------ */
/* safetensors                                                               */

typedef struct st_entry {
    int tensor; /* index into mf->tensors */
    st_dtype dtype;
    uint64_t begin, end; /* relative to the data start */
} st_entry;

static int cmp_entry_begin(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

typedef struct name_ref {
    const char *name;
} name_ref;

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const name_ref *)a)->name, ((const name_ref *)b)->name);
}

/* Parse one tensor entry {"dtype", "shape", "data_offsets"}. */
static tw_status st_parse_entry(tw_model_file *mf, const json_doc *d, int v, tw_tensor *t,
                                st_entry *e, uint64_t data_len, tw_error *err)
{
    const char *path = mf->path, *name = t->name;
    if (d->toks[v].type != J_OBJ)
        return model_error(err, path, "header entry for tensor '%s' is not an object", name);
    int dtype_t = -1, shape_t = -1, offs_t = -1;
    int k = v + 1;
    for (int i = 0; i < d->toks[v].size; i++) {
        int val = k + 1;
        if (json_str_eq(d, k, "dtype"))
            dtype_t = val;
        else if (json_str_eq(d, k, "shape"))
            shape_t = val;
        else if (json_str_eq(d, k, "data_offsets"))
            offs_t = val;
        k = d->toks[val].next;
    }
    const char *missing = dtype_t < 0   ? "dtype"
                          : shape_t < 0 ? "shape"
                          : offs_t < 0  ? "data_offsets"
                                        : NULL;
    if (missing) return model_error(err, path, "tensor '%s': no '%s' field", name, missing);

    char dtype[16];
    if (d->toks[dtype_t].type != J_STR || !json_str(d, dtype_t, dtype, sizeof dtype))
        return model_error(err, path, "tensor '%s': 'dtype' is not a short string", name);
    size_t esize;
    if (strcmp(dtype, "F32") == 0) {
        e->dtype = ST_F32;
        esize = 4;
    } else if (strcmp(dtype, "F16") == 0) {
        e->dtype = ST_F16;
        esize = 2;
    } else if (strcmp(dtype, "BF16") == 0) {
        e->dtype = ST_BF16;
        esize = 2;
    } else {
        static const struct {
            const char *name;
            size_t size;
        } ints[] = {{"I64", 8}, {"U64", 8}, {"I32", 4}, {"U32", 4},  {"I16", 2},
                    {"U16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F64", 8}};
        esize = 0;
        for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
            if (strcmp(dtype, ints[i].name) == 0) esize = ints[i].size;
        if (!esize)
            return model_error(err, path,
                               "tensor '%s': unknown dtype '%s' (F32, F16, BF16 expected)", name,
                               dtype);
        /* BN's step counter is stored as an integer and is not a weight */
        size_t nl = strlen(name), sl = strlen("num_batches_tracked");
        if (nl < sl || strcmp(name + nl - sl, "num_batches_tracked") != 0)
            return model_error(err, path, "tensor '%s': dtype %s is not supported (F32, F16, BF16)",
                               name, dtype);
        e->dtype = ST_SKIP;
    }

    if (d->toks[shape_t].type != J_ARR)
        return model_error(err, path, "tensor '%s': 'shape' is not an array", name);
    int ndim = d->toks[shape_t].size;
    if (ndim > 4)
        return model_error(err, path, "tensor '%s': %d dimensions (at most 4 supported)", name,
                           ndim);
    uint64_t numel = 1;
    for (int i = 0, s = shape_t + 1; i < ndim; i++, s = d->toks[s].next) {
        int64_t dim;
        if (!json_int(d, s, &dim) || dim < 0)
            return model_error(err, path, "tensor '%s': shape[%d] is not a non-negative integer",
                               name, i);
        /* bounded by the data size, so the product cannot overflow */
        if (dim > 0 && (uint64_t)dim > data_len)
            return model_error(err, path, "tensor '%s': shape[%d] = %lld exceeds the data size",
                               name, i, (long long)dim);
        t->shape[i] = dim;
        numel *= (uint64_t)dim;
        if (numel > data_len)
            return model_error(err, path, "tensor '%s': shape is larger than the file's data",
                               name);
    }
    if (ndim == 0) { /* a scalar is kept as a 1-element vector */
        t->shape[0] = 1;
        ndim = 1;
    }
    t->ndim = ndim;
    t->numel = (int64_t)numel;

    int64_t off[2];
    int o0 = offs_t + 1;
    if (d->toks[offs_t].type != J_ARR || d->toks[offs_t].size != 2 || !json_int(d, o0, &off[0]) ||
        !json_int(d, d->toks[o0].next, &off[1]))
        return model_error(err, path, "tensor '%s': 'data_offsets' is not [begin, end]", name);
    if (off[0] < 0 || off[1] < off[0] || (uint64_t)off[1] > data_len)
        return model_error(
            err, path,
            "tensor '%s': data_offsets [%lld, %lld] past the end of the data (%llu bytes)", name,
            (long long)off[0], (long long)off[1], (unsigned long long)data_len);
    e->begin = (uint64_t)off[0];
    e->end = (uint64_t)off[1];
    if (numel * esize != e->end - e->begin)
        return model_error(
            err, path, "tensor '%s': shape holds %llu bytes of %s but data_offsets span %llu", name,
            (unsigned long long)(numel * esize), dtype, (unsigned long long)(e->end - e->begin));
    return TW_OK;
}

/* Metadata values are strings holding JSON; a plain string is accepted for
 * 'arch' too, since writers disagree on whether to quote it. */
static tw_status st_parse_meta_value(tw_model_file *mf, const char *key, const char *val,
                                     tw_error *err)
{
    bool want = strcmp(key, "arch") == 0 || strcmp(key, "bands") == 0 ||
                strcmp(key, "scale") == 0 || strcmp(key, "mean") == 0 || strcmp(key, "std") == 0 ||
                strcmp(key, "classes") == 0 || strcmp(key, "tile") == 0;
    if (!want) return TW_OK;
    json_doc d;
    bool ok = json_parse(&d, val, strlen(val)) == 0;
    tw_status st = TW_OK;
    if (strcmp(key, "arch") == 0) {
        char arch[64];
        if (ok && d.toks[0].type == J_STR) {
            if (!json_str(&d, 0, arch, sizeof arch)) arch[0] = '\0';
        } else {
            snprintf(arch, sizeof arch, "%s", val);
        }
        st = set_arch(mf, arch, err);
        json_free(&d);
        return st;
    }
    if (!ok) {
        st = model_error(err, mf->path, "metadata '%s' is not valid JSON (%s)", key, d.why);
        json_free(&d);
        return st;
    }
    const json_tok *root = &d.toks[0];
    bool is_arr = root->type == J_ARR;
    int n = is_arr ? root->size : 0;
    if (strcmp(key, "scale") == 0 || strcmp(key, "tile") == 0) {
        double x;
        int64_t i;
        if (strcmp(key, "scale") == 0)
            st = json_num(&d, 0, &x)
                     ? set_scale(mf, x, err)
                     : model_error(err, mf->path, "metadata 'scale' is not a number");
        else
            st = json_int(&d, 0, &i)
                     ? set_tile(mf, i, err)
                     : model_error(err, mf->path, "metadata 'tile' is not an integer");
    } else if (!is_arr || n > TW_MAX_CLASSES) {
        st = model_error(err, mf->path, "metadata '%s' is not an array (or too long)", key);
    } else if (strcmp(key, "classes") == 0) {
        if (n < 1) st = model_error(err, mf->path, "metadata 'classes' is empty");
        for (int i = 0, t = 1; i < n && st == TW_OK; i++, t = d.toks[t].next) {
            char name[TW_NAME_MAX];
            if (d.toks[t].type != J_STR || !json_str(&d, t, name, sizeof name))
                st = model_error(err, mf->path,
                                 "metadata 'classes'[%d] is not a string of at most %d bytes", i,
                                 TW_NAME_MAX - 1);
            else
                st = set_class(mf, i, name, err);
        }
        if (st == TW_OK) mf->n_classes = n;
    } else {
        int64_t iv[TW_MAX_CLASSES];
        double dv[TW_MAX_CLASSES];
        bool ints = strcmp(key, "bands") == 0;
        for (int i = 0, t = 1; i < n && st == TW_OK; i++, t = d.toks[t].next) {
            if (ints ? !json_int(&d, t, &iv[i]) : !json_num(&d, t, &dv[i]))
                st = model_error(err, mf->path, "metadata '%s'[%d] is not %s", key, i,
                                 ints ? "an integer" : "a number");
        }
        if (st == TW_OK) {
            if (ints)
                st = set_bands(mf, iv, n, err);
            else if (strcmp(key, "mean") == 0)
                st = set_floats(mf, "mean", dv, n, mf->mean, &mf->n_mean, false, err);
            else
                st = set_floats(mf, "std", dv, n, mf->std, &mf->n_std, true, err);
        }
    }
    json_free(&d);
    return st;
}

static tw_status st_parse_metadata(tw_model_file *mf, const json_doc *d, int v, tw_error *err)
{
    if (d->toks[v].type != J_OBJ)
        return model_error(err, mf->path, "header '__metadata__' is not an object");
    int k = v + 1;
    for (int i = 0; i < d->toks[v].size; i++) {
        int val = k + 1;
        char key[64];
        if (!json_str(d, k, key, sizeof key)) {
            k = d->toks[val].next;
            continue; /* a long key is none of ours */
        }
        if (d->toks[val].type != J_STR)
            return model_error(err, mf->path, "metadata '%s' is not a string", key);
        size_t cap = d->toks[val].end - d->toks[val].start + 1;
        char *s = malloc(cap);
        if (!s) return nomem_error(err, mf->path, cap);
        tw_status st = TW_OK;
        if (!json_str(d, val, s, cap))
            st = model_error(err, mf->path, "metadata '%s' holds a NUL character", key);
        else
            st = st_parse_meta_value(mf, key, s, err);
        free(s);
        if (st != TW_OK) return st;
        k = d->toks[val].next;
    }
    return TW_OK;
}

static tw_status st_read_tensors(tw_model_file *mf, FILE *f, uint64_t data_start,
                                 const st_entry *ents, int n, tw_error *err)
{
    unsigned char *scratch = NULL;
    size_t scratch_cap = 0;
    tw_status st = TW_OK;
    for (int i = 0; i < n && st == TW_OK; i++) {
        const st_entry *e = &ents[i];
        tw_tensor *t = &mf->tensors[e->tensor];
        size_t bytes = (size_t)(e->end - e->begin);
        size_t out_bytes = (size_t)t->numel * sizeof(float);
        t->data = tw_alloc(TW_MEM_WEIGHTS, out_bytes ? out_bytes : sizeof(float));
        if (!t->data) {
            st = nomem_error(err, mf->path, out_bytes);
            break;
        }
        if (bytes > scratch_cap) {
            tw_free(scratch);
            scratch = tw_alloc(TW_MEM_OTHER, bytes);
            scratch_cap = scratch ? bytes : 0;
            if (!scratch) {
                st = nomem_error(err, mf->path, bytes);
                break;
            }
        }
        if (bytes == 0) continue;
        if (fseeko(f, (off_t)(data_start + e->begin), SEEK_SET) != 0 ||
            fread(scratch, 1, bytes, f) != bytes) {
            st = model_error(err, mf->path, "tensor '%s': cannot read %zu bytes at offset %llu",
                             t->name, bytes, (unsigned long long)(data_start + e->begin));
            break;
        }
        convert_le(e->dtype, scratch, t->data, t->numel);
    }
    tw_free(scratch);
    return st;
}

static tw_status load_safetensors(tw_model_file *mf, uint64_t file_size, tw_error *err)
{
    const char *path = mf->path;
    if (file_size < 8)
        return model_error(err, path,
                           "neither an HDF5 bundle nor a safetensors file (only %llu bytes)",
                           (unsigned long long)file_size);
    FILE *f = fopen(path, "rb");
    if (!f) return model_error(err, path, "cannot open: %s", strerror(errno));
    unsigned char lenb[8];
    char *header = NULL;
    json_doc d = {0};
    st_entry *ents = NULL;
    name_ref *names = NULL;
    tw_status st = TW_OK;

    if (fread(lenb, 1, 8, f) != 8) {
        st = model_error(err, path, "cannot read the safetensors header length");
        goto done;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | lenb[i];
    int first = fgetc(f);
    if (first != '{') {
        /* not even the start of a JSON header: most likely some other format */
        st = model_error(err, path,
                         "neither an HDF5 bundle (no HDF5 signature) nor a safetensors file "
                         "(no JSON header)");
        goto done;
    }
    if (ungetc(first, f) == EOF) {
        st = model_error(err, path, "cannot read the safetensors header");
        goto done;
    }
    if (hlen > ST_MAX_HEADER) {
        st = model_error(err, path,
                         "safetensors header length %llu is absurd (limit %u): not a safetensors "
                         "file, or corrupt",
                         (unsigned long long)hlen, ST_MAX_HEADER);
        goto done;
    }
    if (hlen > file_size - 8) {
        st = model_error(err, path,
                         "safetensors header length %llu exceeds the file size %llu (truncated?)",
                         (unsigned long long)hlen, (unsigned long long)file_size);
        goto done;
    }
    header = tw_alloc(TW_MEM_OTHER, hlen + 1);
    if (!header) {
        st = nomem_error(err, path, hlen + 1);
        goto done;
    }
    if (fread(header, 1, hlen, f) != hlen) {
        st = model_error(err, path, "cannot read the %llu-byte safetensors header",
                         (unsigned long long)hlen);
        goto done;
    }
    header[hlen] = '\0';
    if (memchr(header, '\0', hlen)) {
        st = model_error(err, path, "safetensors header contains a NUL byte");
        goto done;
    }
    if (json_parse(&d, header, hlen) != 0) {
        st = model_error(err, path, "safetensors header is not valid JSON: %s", d.why);
        goto done;
    }
    if (d.toks[0].type != J_OBJ) {
        st = model_error(err, path, "safetensors header is not a JSON object");
        goto done;
    }
    uint64_t data_len = file_size - 8 - hlen;

    int n_pairs = d.toks[0].size, n_tensors = 0, meta_tok = -1;
    for (int i = 0, k = 1; i < n_pairs; i++) {
        if (!json_str_eq(&d, k, "__metadata__")) {
            n_tensors++;
        } else if (meta_tok >= 0) {
            /* found by fuzzing: the second one was taken for a tensor */
            st = model_error(err, path, "safetensors header has two '__metadata__' entries");
            goto done;
        } else {
            meta_tok = k + 1;
        }
        k = d.toks[k + 1].next;
    }
    mf->tensors = tw_calloc(TW_MEM_OTHER, (size_t)(n_tensors ? n_tensors : 1), sizeof(tw_tensor));
    ents = calloc((size_t)(n_tensors ? n_tensors : 1), sizeof *ents);
    names = calloc((size_t)(n_tensors ? n_tensors : 1), sizeof *names);
    if (!mf->tensors || !ents || !names) {
        st = nomem_error(err, path, (size_t)n_tensors * sizeof(tw_tensor));
        goto done;
    }
    int n_ents = 0;
    for (int i = 0, k = 1; i < n_pairs && st == TW_OK; i++) {
        int v = k + 1;
        k = d.toks[v].next;
        if (v == meta_tok) continue;
        /* Integer entries (BN step counters) get a slot too, so that they take
         * part in the duplicate and overlap checks; they are dropped below. */
        tw_tensor *t = &mf->tensors[mf->n_tensors];
        if (!json_str(&d, v - 1, t->name, sizeof t->name)) {
            st = model_error(err, path, "tensor #%d: name is longer than %zu bytes", i,
                             sizeof t->name - 1);
            break;
        }
        st_entry e = {.tensor = mf->n_tensors};
        st = st_parse_entry(mf, &d, v, t, &e, data_len, err);
        if (st != TW_OK) break;
        names[n_ents].name = t->name;
        mf->n_tensors++;
        ents[n_ents++] = e;
    }
    if (st != TW_OK) goto done;

    /* Duplicate names: JSON allows them, safetensors does not. Sorting keeps
     * this O(n log n) even for a hostile header with millions of entries. */
    qsort(names, (size_t)n_ents, sizeof *names, cmp_name);
    for (int i = 1; i < n_ents; i++) {
        if (strcmp(names[i].name, names[i - 1].name) == 0) {
            st = model_error(err, path, "tensor '%s' appears twice in the header", names[i].name);
            goto done;
        }
    }
    qsort(ents, (size_t)n_ents, sizeof *ents, cmp_entry_begin);
    uint64_t prev_end = 0;
    int prev = -1;
    for (int i = 0; i < n_ents; i++) {
        if (ents[i].begin == ents[i].end) continue;
        if (prev >= 0 && ents[i].begin < prev_end) {
            st = model_error(err, path, "tensors '%s' and '%s' overlap in the data",
                             mf->tensors[ents[prev].tensor].name, mf->tensors[ents[i].tensor].name);
            goto done;
        }
        prev = i;
        prev_end = ents[i].end;
    }
    if (meta_tok >= 0) {
        st = st_parse_metadata(mf, &d, meta_tok, err);
        if (st != TW_OK) goto done;
    }
    int w = 0;
    for (int i = 0; i < n_ents; i++)
        if (ents[i].dtype != ST_SKIP) ents[w++] = ents[i];
    st = st_read_tensors(mf, f, 8 + hlen, ents, w, err);
    if (st == TW_OK) { /* compact away the skipped slots (they have no data) */
        int kept = 0;
        for (int i = 0; i < mf->n_tensors; i++)
            if (mf->tensors[i].data) mf->tensors[kept++] = mf->tensors[i];
        mf->n_tensors = kept;
    }

done:
    json_free(&d);
    free(ents);
    free(names);
    tw_free(header);
    fclose(f);
    return st;
}

/* ------------------------------------------------------------------------ */
/* HDF5 bundle                                                               */

typedef struct h5_ctx {
    tw_model_file *mf;
    tw_error *err;
    hid_t file, group;
} h5_ctx;

/* Read a whole attribute as strings; *names gets n malloc'ed strings. */
static tw_status h5_attr_strings(h5_ctx *c, const char *key, char ***names, int *n_out, int max_n)
{
    const char *path = c->mf->path;
    tw_status st = TW_OK;
    hid_t a = -1, ftype = -1, space = -1, mtype = -1;
    char **out = NULL;
    char *fixed = NULL;
    int n = 0;
    a = H5Aopen(c->file, key, H5P_DEFAULT);
    if (a < 0) return model_error(c->err, path, "cannot open attribute '%s'", key);
    ftype = H5Aget_type(a);
    space = H5Aget_space(a);
    if (ftype < 0 || space < 0) {
        st = model_error(c->err, path, "cannot read attribute '%s'", key);
        goto done;
    }
    if (H5Tget_class(ftype) != H5T_STRING) {
        st = model_error(c->err, path, "attribute '%s' is not a string", key);
        goto done;
    }
    hssize_t np = H5Sget_simple_extent_npoints(space);
    if (np < 1 || np > max_n) {
        st = model_error(c->err, path, "attribute '%s' has %lld strings (1..%d allowed)", key,
                         (long long)np, max_n);
        goto done;
    }
    n = (int)np;
    out = calloc((size_t)n, sizeof *out);
    if (!out) {
        st = nomem_error(c->err, path, (size_t)n * sizeof *out);
        goto done;
    }
    htri_t vlen = H5Tis_variable_str(ftype);
    mtype = H5Tcopy(H5T_C_S1);
    if (vlen < 0 || mtype < 0) {
        st = model_error(c->err, path, "cannot inspect the type of attribute '%s'", key);
        goto done;
    }
    if (vlen) {
        char **raw = calloc((size_t)n, sizeof *raw);
        if (!raw) {
            st = nomem_error(c->err, path, (size_t)n * sizeof *raw);
            goto done;
        }
        if (H5Tset_size(mtype, H5T_VARIABLE) < 0 || H5Tset_cset(mtype, H5Tget_cset(ftype)) < 0 ||
            H5Aread(a, mtype, raw) < 0) {
            free(raw);
            st = model_error(c->err, path, "cannot read string attribute '%s'", key);
            goto done;
        }
        for (int i = 0; i < n && st == TW_OK; i++) {
            out[i] = strdup(raw[i] ? raw[i] : "");
            if (!out[i]) st = nomem_error(c->err, path, 64);
        }
#if H5_VERSION_GE(1, 12, 0)
        H5Treclaim(mtype, space, H5P_DEFAULT, raw);
#else
        H5Dvlen_reclaim(mtype, space, H5P_DEFAULT, raw);
#endif
        free(raw);
    } else {
        size_t sz = H5Tget_size(ftype);
        if (sz == 0 || sz > 4096) {
            st = model_error(c->err, path, "attribute '%s' has strings of %zu bytes", key, sz);
            goto done;
        }
        /* one more byte than stored: a NULLPAD string of exactly sz bytes
         * would otherwise lose its last character to the terminator */
        sz += 1;
        fixed = calloc((size_t)n, sz);
        if (!fixed || H5Tset_size(mtype, sz) < 0 || H5Tset_cset(mtype, H5Tget_cset(ftype)) < 0) {
            st = fixed ? model_error(c->err, path, "cannot read string attribute '%s'", key)
                       : nomem_error(c->err, path, (size_t)n * sz);
            goto done;
        }
        if (H5Aread(a, mtype, fixed) < 0) {
            st = model_error(c->err, path, "cannot read string attribute '%s'", key);
            goto done;
        }
        for (int i = 0; i < n && st == TW_OK; i++) {
            const char *s = fixed + (size_t)i * sz;
            out[i] = strndup(s, strnlen(s, sz));
            if (!out[i]) st = nomem_error(c->err, path, sz);
        }
    }
done:
    if (st != TW_OK && out) {
        for (int i = 0; i < n; i++) free(out[i]);
        free(out);
        out = NULL;
    }
    free(fixed);
    if (mtype >= 0) H5Tclose(mtype);
    if (space >= 0) H5Sclose(space);
    if (ftype >= 0) H5Tclose(ftype);
    H5Aclose(a);
    *names = out;
    *n_out = st == TW_OK ? n : 0;
    return st;
}

static void free_strings(char **s, int n)
{
    if (!s) return;
    for (int i = 0; i < n; i++) free(s[i]);
    free(s);
}

/* Read a numeric attribute as int64 (want_int) or double, 1..max_n values. */
static tw_status h5_attr_numbers(h5_ctx *c, const char *key, bool want_int, int64_t *iv, double *dv,
                                 int *n_out, int max_n)
{
    const char *path = c->mf->path;
    tw_status st = TW_OK;
    hid_t a = H5Aopen(c->file, key, H5P_DEFAULT);
    if (a < 0) return model_error(c->err, path, "cannot open attribute '%s'", key);
    hid_t ftype = H5Aget_type(a), space = H5Aget_space(a);
    if (ftype < 0 || space < 0) {
        st = model_error(c->err, path, "cannot read attribute '%s'", key);
        goto done;
    }
    H5T_class_t cls = H5Tget_class(ftype);
    if (cls != H5T_INTEGER && (want_int || cls != H5T_FLOAT)) {
        st = model_error(c->err, path, "attribute '%s' is not %s", key,
                         want_int ? "an integer" : "a number");
        goto done;
    }
    hssize_t np = H5Sget_simple_extent_npoints(space);
    if (np < 1 || np > max_n) {
        st = model_error(c->err, path, "attribute '%s' has %lld values (1..%d allowed)", key,
                         (long long)np, max_n);
        goto done;
    }
    herr_t r = want_int ? H5Aread(a, H5T_NATIVE_INT64, iv) : H5Aread(a, H5T_NATIVE_DOUBLE, dv);
    if (r < 0) {
        st = model_error(c->err, path, "cannot read attribute '%s'", key);
        goto done;
    }
    *n_out = (int)np;
done:
    if (space >= 0) H5Sclose(space);
    if (ftype >= 0) H5Tclose(ftype);
    H5Aclose(a);
    return st;
}

static tw_status h5_read_metadata(h5_ctx *c)
{
    tw_model_file *mf = c->mf;
    const char *path = mf->path;
    char **s = NULL;
    int n = 0;
    tw_status st;
    htri_t has = H5Aexists(c->file, "format");
    if (has <= 0)
        return model_error(c->err, path,
                           "no 'format' attribute: not a tilewise bundle (write one with "
                           "tools/export_model.py)");
    if ((st = h5_attr_strings(c, "format", &s, &n, 1)) != TW_OK) return st;
    bool ok = strcmp(s[0], "tilewise-resnet") == 0;
    if (!ok)
        st =
            model_error(c->err, path, "attribute 'format' is '%.60s', not 'tilewise-resnet'", s[0]);
    free_strings(s, n);
    if (st != TW_OK) return st;

    int64_t iv[TW_MAX_CLASSES];
    double dv[TW_MAX_CLASSES];
    if (H5Aexists(c->file, "format_version") <= 0)
        return model_error(c->err, path, "no 'format_version' attribute");
    if ((st = h5_attr_numbers(c, "format_version", true, iv, NULL, &n, 1)) != TW_OK) return st;
    if (iv[0] != 1)
        return model_error(c->err, path,
                           "format_version %lld is not supported (this tilewise reads 1)",
                           (long long)iv[0]);

    static const char *const keys[] = {"arch", "bands", "scale", "mean", "std", "classes", "tile"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const char *key = keys[k];
        htri_t e = H5Aexists(c->file, key);
        if (e < 0) return model_error(c->err, path, "cannot query attribute '%s'", key);
        if (e == 0) continue;
        if (strcmp(key, "arch") == 0) {
            if ((st = h5_attr_strings(c, key, &s, &n, 1)) != TW_OK) return st;
            st = set_arch(mf, s[0], c->err);
            free_strings(s, n);
        } else if (strcmp(key, "classes") == 0) {
            if ((st = h5_attr_strings(c, key, &s, &n, TW_MAX_CLASSES)) != TW_OK) return st;
            for (int i = 0; i < n && st == TW_OK; i++) st = set_class(mf, i, s[i], c->err);
            if (st == TW_OK) mf->n_classes = n;
            free_strings(s, n);
        } else if (strcmp(key, "bands") == 0 || strcmp(key, "tile") == 0) {
            bool bands = key[0] == 'b';
            st = h5_attr_numbers(c, key, true, iv, NULL, &n, bands ? TW_MAX_BANDS : 1);
            if (st == TW_OK)
                st = bands ? set_bands(mf, iv, n, c->err) : set_tile(mf, iv[0], c->err);
        } else {
            bool scale = strcmp(key, "scale") == 0;
            st = h5_attr_numbers(c, key, false, NULL, dv, &n, scale ? 1 : TW_MAX_BANDS);
            if (st == TW_OK) {
                if (scale)
                    st = set_scale(mf, dv[0], c->err);
                else if (key[0] == 'm')
                    st = set_floats(mf, "mean", dv, n, mf->mean, &mf->n_mean, false, c->err);
                else
                    st = set_floats(mf, "std", dv, n, mf->std, &mf->n_std, true, c->err);
            }
        }
        if (st != TW_OK) return st;
    }
    return TW_OK;
}

static tw_status h5_read_tensor(h5_ctx *c, const char *name, tw_tensor *t, bool *skipped)
{
    const char *path = c->mf->path;
    tw_status st = TW_OK;
    *skipped = false;
    hid_t ds = H5Dopen2(c->group, name, H5P_DEFAULT);
    if (ds < 0) return model_error(c->err, path, "/tensors/%s is not a readable dataset", name);
    hid_t type = H5Dget_type(ds), space = H5Dget_space(ds);
    if (type < 0 || space < 0) {
        st = model_error(c->err, path, "cannot read the type of /tensors/%s", name);
        goto done;
    }
    H5T_class_t cls = H5Tget_class(type);
    if (cls != H5T_FLOAT) {
        size_t nl = strlen(name), sl = strlen("num_batches_tracked");
        if (cls == H5T_INTEGER && nl >= sl && strcmp(name + nl - sl, "num_batches_tracked") == 0) {
            *skipped = true;
            goto done;
        }
        st = model_error(c->err, path, "/tensors/%s is not a float dataset", name);
        goto done;
    }
    int ndim = H5Sget_simple_extent_ndims(space);
    if (ndim < 0 || ndim > 4) {
        st = model_error(c->err, path, "/tensors/%s has %d dimensions (at most 4 supported)", name,
                         ndim);
        goto done;
    }
    hsize_t dims[4] = {1, 1, 1, 1};
    if (ndim > 0 && H5Sget_simple_extent_dims(space, dims, NULL) < 0) {
        st = model_error(c->err, path, "cannot read the shape of /tensors/%s", name);
        goto done;
    }
    uint64_t numel = 1;
    for (int i = 0; i < (ndim ? ndim : 1); i++) {
        t->shape[i] = (int64_t)dims[i];
        if (dims[i] > ((uint64_t)1 << 34) || (numel *= dims[i]) > ((uint64_t)1 << 34)) {
            st = model_error(c->err, path, "/tensors/%s is implausibly large", name);
            goto done;
        }
    }
    t->ndim = ndim ? ndim : 1;
    t->numel = (int64_t)numel;
    snprintf(t->name, sizeof t->name, "%s", name);
    size_t bytes = (size_t)numel * sizeof(float);
    t->data = tw_alloc(TW_MEM_WEIGHTS, bytes ? bytes : sizeof(float));
    if (!t->data) {
        st = nomem_error(c->err, path, bytes);
        goto done;
    }
    if (numel && H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, t->data) < 0) {
        st =
            model_error(c->err, path, "cannot read /tensors/%s (truncated or corrupt file?)", name);
        /* Not counted in n_tensors, so destroy would not free it. */
        tw_free(t->data);
        t->data = NULL;
    }
done:
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    H5Dclose(ds);
    return st;
}

typedef struct h5_iter {
    h5_ctx *c;
    int cap;      /* entries the tensor array has room for */
    tw_status st; /* the error that stopped the iteration */
} h5_iter;

#if H5_VERSION_GE(1, 12, 0)
typedef H5L_info2_t h5_link_info;
#else
typedef H5L_info_t h5_link_info;
#endif

/* H5Literate callback: read the tensor called name. Returns 0 to go on,
 * -1 (with it->st set) to stop on an error. */
static herr_t h5_tensor_cb(hid_t group, const char *name, const h5_link_info *info, void *user)
{
    (void)group;
    (void)info;
    h5_iter *it = user;
    tw_model_file *mf = it->c->mf;
    if (mf->n_tensors >= it->cap) {
        it->st = model_error(it->c->err, mf->path, "/tensors lists more entries than it holds");
        return -1;
    }
    if (strlen(name) >= sizeof mf->tensors[0].name) {
        it->st = model_error(it->c->err, mf->path,
                             "/tensors entry '%.40s...': name longer than %zu bytes", name,
                             sizeof mf->tensors[0].name - 1);
        return -1;
    }
    bool skipped;
    it->st = h5_read_tensor(it->c, name, &mf->tensors[mf->n_tensors], &skipped);
    if (it->st != TW_OK) return -1;
    if (!skipped) mf->n_tensors++;
    return 0;
}

static tw_status load_hdf5(tw_model_file *mf, tw_error *err)
{
    const char *path = mf->path;
    /* HDF5 prints its error stack to stderr by default; our message says it. */
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    h5_ctx c = {.mf = mf, .err = err, .file = -1, .group = -1};
    tw_status st = TW_OK;
    c.file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (c.file < 0)
        return model_error(err, path, "cannot open as HDF5 (truncated or corrupt file?)");
    if ((st = h5_read_metadata(&c)) != TW_OK) goto done;
    htri_t has = H5Lexists(c.file, "tensors", H5P_DEFAULT);
    if (has <= 0) {
        st = model_error(err, path, "no /tensors group");
        goto done;
    }
    c.group = H5Gopen2(c.file, "tensors", H5P_DEFAULT);
    H5G_info_t info;
    if (c.group < 0 || H5Gget_info(c.group, &info) < 0) {
        st = model_error(err, path, "/tensors is not a readable group");
        goto done;
    }
    if (info.nlinks > 100000) {
        st = model_error(err, path, "/tensors holds %llu entries: implausible",
                         (unsigned long long)info.nlinks);
        goto done;
    }
    int n = (int)info.nlinks;
    mf->tensors = tw_calloc(TW_MEM_OTHER, (size_t)(n ? n : 1), sizeof(tw_tensor));
    if (!mf->tensors) {
        st = nomem_error(err, path, (size_t)n * sizeof(tw_tensor));
        goto done;
    }
    /* One pass in the name index's native order: H5Lget_name_by_idx would
     * rebuild a sorted table of every link for each call (quadratic), and
     * libhdf5 1.10 frees uninitialised pointers when building that table
     * fails on corrupt dense link storage (found by fuzz_hdf5). */
    h5_iter it = {.c = &c, .cap = n, .st = TW_OK};
    hsize_t idx = 0;
    if (H5Literate(c.group, H5_INDEX_NAME, H5_ITER_NATIVE, &idx, h5_tensor_cb, &it) < 0)
        st =
            it.st != TW_OK ? it.st : model_error(err, path, "cannot list /tensors (corrupt file?)");
done:
    if (c.group >= 0) H5Gclose(c.group);
    if (H5Fclose(c.file) < 0 && st == TW_OK) st = model_error(err, path, "error closing the file");
    return st;
}

/* ------------------------------------------------------------------------ */

tw_status tw_model_file_load(const char *path, tw_model_file **out, tw_error *err)
{
    *out = NULL;
    if (!path || !*path) return tw_error_set(err, TW_ERR_MODEL, "model file: no path given");
    if (strlen(path) >= TW_PATH_MAX)
        return tw_error_set(err, TW_ERR_MODEL, "model file path is longer than %d bytes",
                            TW_PATH_MAX - 1);
    struct stat sb;
    if (stat(path, &sb) != 0) return model_error(err, path, "cannot open: %s", strerror(errno));
    if (!S_ISREG(sb.st_mode)) return model_error(err, path, "not a regular file");

    tw_model_file *mf = model_file_new(path);
    if (!mf) return nomem_error(err, path, sizeof *mf);
    uint64_t size = 0;
    tw_status st = hash_file(path, mf->sha256, &size, err);
    if (st == TW_OK) {
        unsigned char sig[8] = {0};
        FILE *f = fopen(path, "rb");
        if (!f) {
            st = model_error(err, path, "cannot open: %s", strerror(errno));
        } else {
            size_t got = fread(sig, 1, sizeof sig, f);
            fclose(f);
            if (got == sizeof sig && memcmp(sig, HDF5_SIGNATURE, sizeof sig) == 0)
                st = load_hdf5(mf, err);
            else
                st = load_safetensors(mf, size, err);
        }
    }
    if (st == TW_OK) st = check_resnet(mf, err);
    if (st != TW_OK) {
        tw_model_file_destroy(mf);
        return st;
    }
    *out = mf;
    return TW_OK;
}
