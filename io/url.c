/* url.c - remote paths, redaction, network settings: see url.h */
#include "io/url.h"

#include <cpl_conv.h>
#include <cpl_string.h>
#include <cpl_vsi.h>
#include <ctype.h>
#include <gdal.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/alloc.h"

static bool starts_with_ci(const char *s, const char *prefix)
{
    return strncasecmp(s, prefix, strlen(prefix)) == 0;
}

static const char *const k_remote_vsi[] = {
    "/vsicurl/",
    "/vsicurl_streaming/",
    "/vsis3/",
    "/vsis3_streaming/",
    "/vsigs/",
    "/vsiaz/",
    "/vsiadls/",
    "/vsioss/",
    "/vsiswift/",
    "/vsiwebhdfs/",
    "/vsihdfs/",
    "/vsigs_streaming/",
    "/vsiaz_streaming/",
    "/vsicurl?",
    "/vsicurl_streaming?",
};

bool tw_url_is_remote(const char *path)
{
    if (!path) return false;
    if (starts_with_ci(path, "http://") || starts_with_ci(path, "https://") ||
        starts_with_ci(path, "s3://"))
        return true;
    /* A remote object inside a chain (/vsizip//vsicurl/...) is remote too. */
    for (size_t i = 0; i < sizeof k_remote_vsi / sizeof k_remote_vsi[0]; i++)
        if (strstr(path, k_remote_vsi[i])) return true;
    return false;
}

/* How many '@' the authority of an http(s) URL holds (after "://", up to
 * the first '/', '?' or '#'): more than one is a user name or password
 * whose '@' was not written %40, which curl would send to another host. */
static int authority_ats(const char *rest)
{
    int n = 0;
    for (; *rest && *rest != '/' && *rest != '?' && *rest != '#'; rest++) n += *rest == '@';
    return n;
}

tw_status tw_url_to_gdal(const char *path, char *out, size_t size, tw_error *err)
{
    char shown[TW_URL_SHOWN_MAX];
    int n;
    if (starts_with_ci(path, "http://") || starts_with_ci(path, "https://")) {
        /* A scheme is case-insensitive (RFC 3986), GDAL's /vsicurl/ is not:
         * HTTP:// is written http:// for it, not retried into "Missing url
         * parameter". */
        size_t scheme = (size_t)(strchr(path, ':') - path);
        if (authority_ats(path + scheme + 3) > 1) {
            tw_url_redact(path, shown, sizeof shown);
            return tw_error_set(err, TW_ERR_INPUT,
                                "%s: the user name or password holds an '@': write it %%40 "
                                "(percent-encoded)",
                                shown);
        }
        n = snprintf(out, size, "/vsicurl/%.*s%s", (int)scheme, scheme == 4 ? "http" : "https",
                     path + scheme);
    } else if (starts_with_ci(path, "s3://")) {
        const char *rest = path + 5;
        const char *slash = strchr(rest, '/');
        if (!*rest || !slash || !slash[1]) {
            tw_url_redact(path, shown, sizeof shown);
            return tw_error_set(err, TW_ERR_INPUT, "%s: expected s3://BUCKET/KEY", shown);
        }
        n = snprintf(out, size, "/vsis3/%s", rest);
    } else {
        n = snprintf(out, size, "%s", path);
    }
    if (n < 0 || (size_t)n >= size) {
        tw_url_redact(path, shown, sizeof shown);
        return tw_error_set(err, TW_ERR_INPUT, "%s: path too long", shown);
    }
    return TW_OK;
}

/* ---- redaction -------------------------------------------------------------- */

/* Query parameters whose values are credentials (case-insensitive, matched
 * after percent-decoding): AWS SigV4 and SigV2 presigned URLs, Azure SAS,
 * Google signed URLs, CloudFront signed URLs, OAuth, and the generic names
 * services use. */
static const char *const k_secret_params[] = {
    "X-Amz-Signature",
    "X-Amz-Credential",
    "X-Amz-Security-Token",
    "X-Goog-Signature",
    "X-Goog-Credential",
    "GoogleAccessId",
    "AWSAccessKeyId",
    "Signature",
    "Policy",
    "Key-Pair-Id",
    "sig",
    "token",
    "access_token",
    "id_token",
    "refresh_token",
    "key",
    "api_key",
    "apikey",
    "secret",
    "client_secret",
    "password",
    "passwd",
    "pwd",
    "code",
    "sas",
    "auth",
    "authorization",
    "credential",
    "credentials",
    "session_token",
};

static bool secret_name(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof k_secret_params / sizeof k_secret_params[0]; i++)
        if (strlen(k_secret_params[i]) == len && strncasecmp(name, k_secret_params[i], len) == 0)
            return true;
    return false;
}

static bool name_char(char c)
{
    return isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.';
}

/* A value ends at the next parameter, fragment, blank, quote or bracket. */
static bool value_end(char c)
{
    return c == '\0' || c == '&' || c == '#' || c == ';' || isspace((unsigned char)c) || c == '"' ||
           c == '\'' || c == '<' || c == '>' || c == ')' || c == ']' || c == ',';
}

static int hex_value(char c)
{
    return isdigit((unsigned char)c) ? c - '0' : tolower((unsigned char)c) - 'a' + 10;
}

/* The character s stands for after percent-decoding, as many times as it
 * was encoded ("%253A" is ':' at depth 2): *len raw bytes, *depth rounds.
 * A URL inside a parameter (GDAL's /vsicurl?url=https%3A%2F%2F...) is one
 * level deeper than the text around it; its separators are at its depth. */
static char decoded(const char *s, size_t *len, int *depth)
{
    char c = s[0];
    size_t n = 1;
    int d = 0;
    if (c == '\0') {
        *len = 0;
        *depth = 0;
        return c;
    }
    while (c == '%' && isxdigit((unsigned char)s[n]) && isxdigit((unsigned char)s[n + 1])) {
        c = (char)(hex_value(s[n]) * 16 + hex_value(s[n + 1]));
        n += 2;
        d++;
    }
    *len = n;
    *depth = d;
    return c;
}

typedef struct outbuf {
    char *p;
    size_t size, len;
} outbuf;

static void put(outbuf *o, const char *s, size_t n)
{
    if (o->size == 0) return;
    size_t room = o->size - 1 - o->len;
    if (n > room) n = room;
    memcpy(o->p + o->len, s, n);
    o->len += n;
    o->p[o->len] = '\0';
}

static const char k_redacted[] = "REDACTED";

/* At s, "://" (each character possibly encoded)? Returns its raw length
 * and its depth (the deepest of the three), or 0. */
static size_t scheme_sep(const char *s, int *depth)
{
    const char want[3] = {':', '/', '/'};
    size_t at = 0;
    *depth = 0;
    for (int k = 0; k < 3; k++) {
        size_t n;
        int d;
        if (decoded(s + at, &n, &d) != want[k]) return 0;
        if (d > *depth) *depth = d;
        at += n;
    }
    return at;
}

/* Raw length of the user-info part ("user:pass") of a URL authority
 * starting at s (just after "://" of the given depth), up to its last '@',
 * or 0 when there is none. The authority ends at a '/', '?', '#', blank or
 * quote no deeper than the URL itself: in a plain URL an encoded '/' is a
 * character of the password. */
static size_t userinfo_len(const char *s, int depth)
{
    size_t at = 0, i = 0, n;
    int d;
    for (char c; (c = decoded(s + i, &n, &d)) != '\0'; i += n) {
        if (d <= depth && (c == '/' || c == '?' || c == '#' || isspace((unsigned char)c) ||
                           c == '"' || c == '\''))
            break;
        if (c == '@' && d <= depth) at = i;
    }
    return at;
}

/* One pass over text; with o NULL it only says whether it would redact. */
static bool redact(const char *text, outbuf *o)
{
    bool found = false;
    const char *s = text;
    while (*s) {
        int depth;
        size_t sep = scheme_sep(s, &depth);
        if (sep > 0) {
            size_t u = userinfo_len(s + sep, depth);
            if (u > 0) {
                found = true;
                if (o) {
                    put(o, s, sep);
                    put(o, k_redacted, sizeof k_redacted - 1);
                }
                s += sep + u; /* at the '@' */
                continue;
            }
        }
        size_t n;
        char c = decoded(s, &n, &depth);
        if (c == '?' || c == '&' || c == ';' || c == '#') {
            /* The name, decoded ("X%2DAmz%2DSignature"), then '='. */
            char name[64];
            size_t len = 0, at = n, m;
            int d;
            char nc;
            while ((nc = decoded(s + at, &m, &d)) != '\0' && name_char(nc) && len < sizeof name) {
                name[len++] = nc;
                at += m;
            }
            if (len > 0 && decoded(s + at, &m, &d) == '=' && secret_name(name, len)) {
                found = true;
                at += m;
                if (o) {
                    put(o, s, at);
                    put(o, k_redacted, sizeof k_redacted - 1);
                }
                /* The value ends where a parameter of its own depth (or a
                 * shallower one) would: an encoded '&' inside a plain
                 * value is part of the secret. */
                s += at;
                while (*s) {
                    char vc = decoded(s, &m, &d);
                    if (d <= depth && value_end(vc)) break;
                    s += m;
                }
                continue;
            }
        }
        if (o) put(o, s, 1);
        s++;
    }
    return found;
}

void tw_url_redact(const char *text, char *out, size_t size)
{
    if (!out || size == 0) return;
    out[0] = '\0';
    if (!text) return;
    outbuf o = {.p = out, .size = size};
    redact(text, &o);
}

bool tw_url_has_secret(const char *text)
{
    return text && redact(text, NULL);
}

/* GDAL's /vsicurl?...&url=ENCODED form: the URL decoded into out, or false. */
static bool vsicurl_query_url(const char *path, char *out, size_t size)
{
    const char *q = strchr(path, '?');
    if (!q || !starts_with_ci(path, "/vsicurl")) return false;
    for (const char *p = q; p; p = strchr(p + 1, '&')) {
        if (strncmp(p + 1, "url=", 4) != 0) continue;
        size_t j = 0;
        for (const char *c = p + 5; *c && *c != '&' && j + 1 < size; j++) {
            size_t n;
            int d;
            out[j] = decoded(c, &n, &d);
            c += n;
        }
        out[j] = '\0';
        return true;
    }
    return false;
}

void tw_url_stem(const char *path, char *out, size_t size)
{
    char buf[TW_URL_SHOWN_MAX];
    if (!vsicurl_query_url(path, buf, sizeof buf)) snprintf(buf, sizeof buf, "%s", path);
    if (tw_url_is_remote(buf)) buf[strcspn(buf, "?#")] = '\0';
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
    const char *base = strrchr(buf, '/');
    base = base ? base + 1 : buf;
    if (snprintf(out, size, "%s", base) >= (int)size) out[size - 1] = '\0';
    char *dot = strrchr(out, '.');
    if (dot && dot != out) *dot = '\0';
}

/* The status in GDAL's /vsicurl/ open failure, "HTTP response code on
 * URL: 503" (the URL may hold ": " itself: the code follows the last one);
 * -1 when msg has no such phrase. */
static int http_code_on(const char *msg)
{
    const char *p = strstr(msg, "HTTP response code on ");
    if (!p) return -1;
    const char *c = NULL;
    for (const char *q = strstr(p, ": "); q; q = strstr(q + 1, ": ")) c = q + 2;
    return c && *c >= '0' && *c <= '9' ? atoi(c) : -1;
}

bool tw_url_transient(const char *msg)
{
    if (!msg) return false;
    static const char *const needles[] = {
        "HTTP error code: 5",
        "HTTP error code : 5",
        "HTTP response code: 5",
        "HTTP error code: 429",
        "HTTP response code: 429",
        "response code 5",
        "Connection refused",
        "Couldn't connect",
        "Could not connect",
        "Connection reset",
        "Connection was reset",
        "timed out",
        /* curl's low-speed limit (input.timeout): a silent server */
        "Operation too slow",
        "Empty reply",
        "Recv failure",
        "transfer closed",
        "Failed sending",
        "SSL connection",
        "Couldn't resolve",
        "Could not resolve",
        "SlowDown",
        "ServiceUnavailable",
        "InternalError",
        "Partial file",
        "partial file",
        /* libtiff on a short read: the connection dropped mid-body */
        "Read error at",
    };
    for (size_t i = 0; i < sizeof needles / sizeof needles[0]; i++)
        if (strstr(msg, needles[i])) return true;
    return http_code_on(msg) >= 500 || http_code_on(msg) == 429;
}

bool tw_url_definitive(const char *msg)
{
    if (!msg) return false;
    static const char *const codes[] = {
        "HTTP response code: ", "HTTP error code: ", "HTTP error code : ", "response code "};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        for (const char *p = strstr(msg, codes[i]); p; p = strstr(p + 1, codes[i])) {
            int code = atoi(p + strlen(codes[i]));
            if (code >= 400 && code < 500 && code != 408 && code != 429) return true;
        }
    int code = http_code_on(msg);
    if (code >= 400 && code < 500 && code != 408 && code != 429) return true;
    static const char *const s3[] = {"NoSuchKey", "NoSuchBucket", "AccessDenied",
                                     "InvalidAccessKeyId", "SignatureDoesNotMatch"};
    for (size_t i = 0; i < sizeof s3 / sizeof s3[0]; i++)
        if (strstr(msg, s3[i])) return true;
    return false;
}

/* ---- settings ------------------------------------------------------------------- */

tw_url_settings tw_url_default_settings(int retries, double retry_delay)
{
    /* Measured against tests/httpfault.py with 50 ms latency (bench/RESULTS.md,
     * "Remote inputs"): 256 KiB chunks cut the requests of a band-interleaved
     * 128-px-tiled file 3.7x (the reader's time 4.9x) and cost nothing on a
     * COG. Merged ranges, multi-range mode, VSI_CACHE and the bytes ingested
     * at open changed neither requests nor times: GDAL's defaults stay. No
     * directory listing is off (see tw_url_settings_apply). */
    return (tw_url_settings){
        .retries = retries,
        .retry_delay = retry_delay,
        .vsi_cache = 0,
        .chunk_size = (size_t)256 << 10,
        .ingested_bytes = 0,
        .merge_ranges = -1,
        .multirange = NULL,
        .no_listing = false,
        .timeout = TW_URL_TIMEOUT_DEFAULT,
    };
}

tw_url_settings tw_url_gdal_settings(void)
{
    return tw_url_default_settings(atoi(CPLGetConfigOption("GDAL_HTTP_MAX_RETRY", "0")),
                                   CPLAtof(CPLGetConfigOption("GDAL_HTTP_RETRY_DELAY", "0.5")));
}

double tw_url_retry_delay(const tw_url_settings *s, int attempt)
{
    double d = s->retry_delay > 0 ? s->retry_delay : 0.5;
    for (int k = 1; k < attempt && d < 60.0; k++) d *= 2.0;
    return d < 60.0 ? d : 60.0;
}

double tw_url_retry_span(int retries, double retry_delay)
{
    /* GDAL 3.6 multiplies the delay by 2..2.5 after each retry. */
    double d = retry_delay, total = 0;
    for (int k = 0; k < retries; k++, d *= 2.0) total += d;
    return total;
}

/* Keys 0..1 and K_TIMEOUT.. follow the workflow always; the read-ahead
 * knobs between them leave a user's own setting alone. */
enum { N_KEYS = 12, K_TIMEOUT = 9 };
static const char *const k_keys[N_KEYS] = {
    "GDAL_HTTP_MAX_RETRY",
    "GDAL_HTTP_RETRY_DELAY",
    "VSI_CACHE",
    "VSI_CACHE_SIZE",
    "CPL_VSIL_CURL_CHUNK_SIZE",
    "GDAL_INGESTED_BYTES_AT_OPEN",
    "GDAL_HTTP_MERGE_CONSECUTIVE_RANGES",
    "GDAL_HTTP_MULTIRANGE",
    "GDAL_DISABLE_READDIR_ON_OPEN",
    "GDAL_HTTP_CONNECTTIMEOUT",
    "GDAL_HTTP_LOW_SPEED_TIME",
    "GDAL_HTTP_LOW_SPEED_LIMIT",
};

/* GDAL's options are process-wide and two runs may read at once (two
 * threads of one process: tilewise.h). The first run to apply saves the
 * values it replaces; a run that starts while another reads sets its own
 * on top (retries follow the last to start, as GDAL's cache limit does);
 * the last run to finish restores what the first saved. One mutex around
 * both, and a count of the runs between them: before, a run that finished
 * first put the options back under the other, and the other then "restored"
 * the first's values for good. */
struct tw_url_saved {
    char *old[N_KEYS]; /* CPLStrdup'ed values before the first run; NULL: unset */
    bool set[N_KEYS];  /* whether a run changed it */
    int users;         /* runs between apply and restore */
};
static tw_url_saved g_saved;
static pthread_mutex_t g_saved_lock = PTHREAD_MUTEX_INITIALIZER;

void tw_url_settings_apply(const tw_url_settings *s, tw_url_saved **saved)
{
    char v[N_KEYS][32] = {{0}};
    snprintf(v[0], sizeof v[0], "%d", s->retries);
    snprintf(v[1], sizeof v[1], "%g", s->retry_delay);
    if (s->vsi_cache) {
        snprintf(v[2], sizeof v[2], "TRUE");
        snprintf(v[3], sizeof v[3], "%zu", s->vsi_cache);
    }
    if (s->chunk_size) snprintf(v[4], sizeof v[4], "%zu", s->chunk_size);
    if (s->ingested_bytes) snprintf(v[5], sizeof v[5], "%zu", s->ingested_bytes);
    if (s->merge_ranges >= 0) snprintf(v[6], sizeof v[6], "%s", s->merge_ranges ? "YES" : "NO");
    if (s->multirange) snprintf(v[7], sizeof v[7], "%s", s->multirange);
    /* GDAL_DISABLE_READDIR_ON_OPEN=EMPTY_DIR would save the directory
     * listing of each remote open (8 of 18 requests of a COG run), but it is
     * process-wide: GDAL would then miss sidecar files (an ENVI .hdr, a .msk,
     * the .aux.xml of outputs), local ones included. Left to the user. */
    if (s->no_listing) snprintf(v[8], sizeof v[8], "EMPTY_DIR");
    /* No answer, or a drip, for timeout seconds: the request fails and is
     * retried (a server that accepts and never answers hung runs before).
     * curl takes whole seconds. */
    if (s->timeout > 0) {
        long t = (long)ceil(s->timeout);
        snprintf(v[K_TIMEOUT], sizeof v[K_TIMEOUT], "%ld", t);
        snprintf(v[K_TIMEOUT + 1], sizeof v[K_TIMEOUT + 1], "%ld", t);
        snprintf(v[K_TIMEOUT + 2], sizeof v[K_TIMEOUT + 2], "%d", TW_URL_LOW_SPEED);
    }
    pthread_mutex_lock(&g_saved_lock);
    tw_url_saved *sv = &g_saved;
    for (int i = 0; i < N_KEYS; i++) {
        if (!v[i][0]) continue;
        if (sv->users > 0 && sv->set[i]) {
            /* a run reads: its value gives way to this one's */
            CPLSetConfigOption(k_keys[i], v[i]);
            continue;
        }
        const char *old = CPLGetConfigOption(k_keys[i], NULL);
        /* The read-ahead knobs: the user's own setting wins. Retries and
         * timeouts follow the workflow (input.retries, input.timeout) always. */
        if (old && i >= 2 && i < K_TIMEOUT) continue;
        sv->old[i] = old ? CPLStrdup(old) : NULL;
        sv->set[i] = true;
        CPLSetConfigOption(k_keys[i], v[i]);
    }
    sv->users++;
    pthread_mutex_unlock(&g_saved_lock);
    *saved = sv;
}

void tw_url_settings_restore(tw_url_saved *sv)
{
    if (!sv) return;
    pthread_mutex_lock(&g_saved_lock);
    if (sv->users > 0 && --sv->users == 0)
        for (int i = 0; i < N_KEYS; i++) {
            if (sv->set[i]) CPLSetConfigOption(k_keys[i], sv->old[i]);
            CPLFree(sv->old[i]);
            sv->old[i] = NULL;
            sv->set[i] = false;
        }
    pthread_mutex_unlock(&g_saved_lock);
}

/* ---- read cost -------------------------------------------------------------------- */

typedef struct block_ref {
    long long off, size;
} block_ref;

static int cmp_block(const void *a, const void *b)
{
    const block_ref *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

tw_status tw_url_read_cost(const char *gdal_path, int row0, int row1, size_t chunk_size,
                           int64_t *bytes, int64_t *requests, tw_error *err)
{
    *bytes = *requests = -1;
    char shown[TW_URL_SHOWN_MAX];
    tw_url_redact(gdal_path, shown, sizeof shown);
    CPLPushErrorHandler(CPLQuietErrorHandler);
    GDALDatasetH ds = GDALOpenEx(gdal_path, GDAL_OF_RASTER | GDAL_OF_READONLY, NULL, NULL, NULL);
    CPLPopErrorHandler();
    if (!ds) return tw_error_set(err, TW_ERR_INPUT, "%s: cannot open as a raster", shown);
    GDALDriverH drv = GDALGetDatasetDriver(ds);
    tw_status st = TW_OK;
    if (drv && strcmp(GDALGetDriverShortName(drv), "GTiff") == 0) {
        const char *il = GDALGetMetadataItem(ds, "INTERLEAVE", "IMAGE_STRUCTURE");
        int nb = il && strcmp(il, "BAND") == 0 ? GDALGetRasterCount(ds) : 1;
        int bw, bh;
        GDALGetBlockSize(GDALGetRasterBand(ds, 1), &bw, &bh);
        int W = GDALGetRasterXSize(ds), H = GDALGetRasterYSize(ds);
        if (row1 > H) row1 = H;
        if (row0 < 0) row0 = 0;
        int bx = (W + bw - 1) / bw, by0 = row0 / bh, by1 = (row1 + bh - 1) / bh;
        size_t n = (size_t)nb * (size_t)bx * (size_t)(by1 > by0 ? by1 - by0 : 0);
        block_ref *blk = n ? tw_alloc(TW_MEM_OTHER, n * sizeof *blk) : NULL;
        if (n && !blk) {
            st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
        } else {
            size_t k = 0;
            long long total = 0;
            CPLPushErrorHandler(CPLQuietErrorHandler);
            for (int b = 1; b <= nb; b++) {
                GDALRasterBandH band = GDALGetRasterBand(ds, b);
                for (int y = by0; y < by1; y++)
                    for (int x = 0; x < bx; x++) {
                        char key[64];
                        snprintf(key, sizeof key, "BLOCK_OFFSET_%d_%d", x, y);
                        const char *o = GDALGetMetadataItem(band, key, "TIFF");
                        snprintf(key, sizeof key, "BLOCK_SIZE_%d_%d", x, y);
                        const char *s = GDALGetMetadataItem(band, key, "TIFF");
                        if (!o || !s) continue;
                        blk[k].off = atoll(o);
                        blk[k].size = atoll(s);
                        total += blk[k].size;
                        k++;
                    }
            }
            CPLPopErrorHandler();
            qsort(blk, k, sizeof *blk, cmp_block);
            long long reqs = 0, run = 0, end = -1;
            for (size_t i = 0; i < k; i++) {
                if (blk[i].size == 0) continue;
                /* GDAL downloads whole chunks (16 KiB by default): blocks a
                 * few bytes apart (a COG's block leaders) share a request. */
                if (run > 0 && (blk[i].off < end || blk[i].off - end > 16384)) {
                    reqs +=
                        chunk_size ? (run + (long long)chunk_size - 1) / (long long)chunk_size : 1;
                    run = 0;
                }
                run += blk[i].size;
                end = blk[i].off + blk[i].size;
            }
            if (run > 0)
                reqs += chunk_size ? (run + (long long)chunk_size - 1) / (long long)chunk_size : 1;
            *bytes = total;
            *requests = reqs;
            tw_free(blk);
        }
    }
    GDALClose(ds);
    return st;
}
