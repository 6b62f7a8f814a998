/* identity.c - what an input is, for the resume fingerprint: a local
 * dataset's files, a remote object's HEAD (see identity.h). It calls down
 * into url.c for paths (GDAL's, redacted); url.c knows nothing of it. */
#include "io/input/identity.h"

#include <cpl_conv.h>
#include <cpl_string.h>
#include <cpl_vsi.h>
#include <ctype.h>
#include <gdal.h>
#include <nettle/sha2.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <tiffio.h>
#include <time.h>

#include "core/alloc.h"
#include "io/url.h"

enum {
    HEAD_BYTES = 64 << 10,     /* first and last bytes of a file: headers, IFDs, trailers */
    BLOCK_BYTES = 16 << 10,    /* each block sampled in between */
    FILE_BYTES = 1 << 20,      /* at most this much sampled per file */
    MIN_FILE_BYTES = 16 << 10, /* at least this much, however long the list */
    HASH_HEX = 32,             /* 128 bits of the SHA-256 shown */
};

/* A path fit for a fingerprint key: no blanks or newlines, no ']'. */
static void key_path(const char *path, char *out, size_t size)
{
    char shown[TW_URL_SHOWN_MAX];
    tw_url_redact(path, shown, sizeof shown);
    size_t j = 0;
    for (const char *s = shown; *s && j + 4 < size; s++) {
        unsigned char c = (unsigned char)*s;
        if (c <= ' ' || c == '%' || c == ']' || c == 0x7f)
            j += (size_t)snprintf(out + j, size - j, "%%%02X", c);
        else
            out[j++] = (char)c;
    }
    out[j] = '\0';
}

static void hex(const uint8_t *d, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static int on_tiff_msg(TIFF *tif, void *user, const char *module, const char *fmt, va_list ap)
{
    (void)tif, (void)user, (void)module, (void)fmt, (void)ap;
    return 1; /* handled: nothing on stderr (library code prints nothing) */
}

/* Every IFD's block offsets and byte counts into c (a TIFF's block index:
 * a compressed block rewritten anywhere changes a byte count). Adds the
 * bytes those arrays take to *bytes. Not a TIFF, or not one libtiff
 * reads: nothing (the sampled bytes still count). */
static void hash_tiff_index(const char *path, struct sha256_ctx *c, int64_t *bytes)
{
    TIFFOpenOptions *o = TIFFOpenOptionsAlloc();
    if (!o) return;
    TIFFOpenOptionsSetErrorHandlerExtR(o, on_tiff_msg, NULL);
    TIFFOpenOptionsSetWarningHandlerExtR(o, on_tiff_msg, NULL);
    TIFF *tif = TIFFOpenExt(path, "rm", o);
    TIFFOpenOptionsFree(o);
    if (!tif) return;
    int dirs = 0;
    do {
        bool tiled = TIFFIsTiled(tif);
        uint32_t n = tiled ? TIFFNumberOfTiles(tif) : TIFFNumberOfStrips(tif);
        uint64_t *off = NULL, *cnt = NULL;
        if (TIFFGetField(tif, tiled ? TIFFTAG_TILEOFFSETS : TIFFTAG_STRIPOFFSETS, &off) && off &&
            TIFFGetField(tif, tiled ? TIFFTAG_TILEBYTECOUNTS : TIFFTAG_STRIPBYTECOUNTS, &cnt) &&
            cnt) {
            sha256_update(c, (size_t)n * sizeof *off, (const uint8_t *)off);
            sha256_update(c, (size_t)n * sizeof *cnt, (const uint8_t *)cnt);
            *bytes += (int64_t)n * 16;
        }
        /* a damaged chain of IFDs must not loop: GDAL's overviews and
         * masks are a few dozen at most */
    } while (++dirs < 256 && TIFFReadDirectory(tif));
    TIFFClose(tif);
}

/* Read n bytes at off into buf and hash them; false on a read error. */
static bool hash_range(VSILFILE *f, uint64_t off, size_t n, uint8_t *buf, struct sha256_ctx *c,
                       int64_t *bytes)
{
    if (VSIFSeekL(f, off, SEEK_SET) != 0) return false;
    size_t got = VSIFReadL(buf, 1, n, f);
    if (got != n) return false;
    sha256_update(c, got, buf);
    *bytes += (int64_t)got;
    return true;
}

/* The sampled content hash of one local file of fsize bytes: the whole
 * file when it is no longer than budget; else its first and last
 * HEAD_BYTES and BLOCK_BYTES blocks spread evenly in between, budget bytes
 * in all; then a TIFF's block index. */
static tw_status hash_file(const char *path, uint64_t fsize, int64_t budget, char *hexout,
                           int64_t *bytes, tw_error *err)
{
    char shown[TW_URL_SHOWN_MAX];
    tw_url_redact(path, shown, sizeof shown);
    uint8_t *buf = tw_alloc(TW_MEM_OTHER, HEAD_BYTES);
    if (!buf) return tw_error_set(err, TW_ERR_NOMEM, "%s: out of memory", shown);
    VSILFILE *f = VSIFOpenL(path, "rb");
    if (!f) {
        tw_free(buf);
        return tw_error_set(err, TW_ERR_INPUT, "%s: cannot be read to identify it for resume",
                            shown);
    }
    struct sha256_ctx c;
    sha256_init(&c);
    char sz[32];
    int szn = snprintf(sz, sizeof sz, "%llu\n", (unsigned long long)fsize);
    sha256_update(&c, (size_t)szn, (const uint8_t *)sz);
    bool ok = true;
    if (fsize <= (uint64_t)budget) {
        for (uint64_t at = 0; ok && at < fsize; at += HEAD_BYTES) {
            size_t n = fsize - at < HEAD_BYTES ? (size_t)(fsize - at) : HEAD_BYTES;
            ok = hash_range(f, at, n, buf, &c, bytes);
        }
    } else {
        size_t head = budget >= 4 * HEAD_BYTES ? HEAD_BYTES : (size_t)(budget / 4);
        size_t blk = head < BLOCK_BYTES ? head : BLOCK_BYTES;
        int64_t nblk = (budget - 2 * (int64_t)head) / (int64_t)blk;
        uint64_t span = fsize - 2 * head; /* > 0: fsize > budget >= 2 head */
        ok = hash_range(f, 0, head, buf, &c, bytes);
        for (int64_t i = 0; ok && i < nblk; i++) {
            /* the middle of the i-th of nblk equal parts, 4 KiB aligned */
            uint64_t mid = head + (uint64_t)(((double)i + 0.5) * (double)span / (double)nblk);
            uint64_t at = (mid > blk / 2 ? mid - blk / 2 : 0) & ~(uint64_t)4095;
            if (at < head) at = head;
            if (at + blk > fsize - head) at = fsize - head - blk;
            ok = hash_range(f, at, blk, buf, &c, bytes);
        }
        if (ok) ok = hash_range(f, fsize - head, head, buf, &c, bytes);
    }
    VSIFCloseL(f);
    tw_free(buf);
    if (!ok)
        return tw_error_set(err, TW_ERR_INPUT, "%s: read failed while identifying it for resume",
                            shown);
    if (strncmp(path, "/vsi", 4) != 0) hash_tiff_index(path, &c, bytes);
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_digest(&c, sizeof d, d);
    hex(d, HASH_HEX / 2, hexout);
    return TW_OK;
}

/* "2026-11-27T10:01:02.123456789Z" */
static void mtime_text(const char *path, const VSIStatBufL *vs, char *out, size_t size)
{
    struct stat sb;
    time_t sec = vs->st_mtime;
    long nsec = 0;
    if (strncmp(path, "/vsi", 4) != 0 && stat(path, &sb) == 0) {
        sec = sb.st_mtim.tv_sec;
        nsec = sb.st_mtim.tv_nsec;
    }
    struct tm tm;
    char day[40];
    if (!gmtime_r(&sec, &tm) || strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm) == 0)
        snprintf(day, sizeof day, "%lld", (long long)sec);
    snprintf(out, size, "%s.%09ldZ", day, nsec);
}

typedef struct linebuf {
    char *p;
    size_t size, len;
    bool full;
} linebuf;

/* Append a formatted line if it fits whole; false (and nothing written)
 * when it does not. */
static bool add_line(linebuf *b, const char *fmt, ...)
{
    if (b->full) return false;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->len, b->size - b->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= b->size - b->len) {
        b->p[b->len] = '\0';
        b->full = true;
        return false;
    }
    b->len += (size_t)n;
    return true;
}

/* Room kept for the closing "files[+N]" line. */
enum { RESERVE = 120 };

tw_status tw_identity_local(const char *gdal_path, char *out, size_t size, tw_identity_stats *stats,
                            tw_error *err)
{
    tw_identity_stats st0 = {0};
    if (!stats) stats = &st0;
    memset(stats, 0, sizeof *stats);
    if (size) out[0] = '\0';
    if (size <= RESERVE) return tw_error_set(err, TW_ERR_INTERNAL, "identity buffer too small");

    /* GDAL's file list: the dataset's own file first, then what it read or
     * would read (sidecars, a VRT's sources). Without one: the path. */
    CPLPushErrorHandler(CPLQuietErrorHandler);
    GDALDatasetH ds = GDALOpenEx(gdal_path, GDAL_OF_RASTER | GDAL_OF_READONLY, NULL, NULL, NULL);
    char **list = ds ? GDALGetFileList(ds) : NULL;
    if (ds) GDALClose(ds);
    CPLPopErrorHandler();
    if (!list || !list[0]) {
        CSLDestroy(list);
        list = CSLAddString(NULL, gdal_path);
    }
    int n = CSLCount(list);
    stats->files = n;
    int looked = n < TW_IDENTITY_MAX_FILES ? n : TW_IDENTITY_MAX_FILES;
    int64_t per_file = TW_IDENTITY_MAX_BYTES / (looked > 0 ? looked : 1);
    if (per_file > FILE_BYTES) per_file = FILE_BYTES;
    if (per_file < MIN_FILE_BYTES) per_file = MIN_FILE_BYTES;

    linebuf b = {.p = out, .size = size - RESERVE};
    struct sha256_ctx rest; /* the files whose lines did not fit */
    sha256_init(&rest);
    int n_rest = 0, n_remote = 0;
    tw_status st = TW_OK;
    for (int i = 0; i < n && st == TW_OK; i++) {
        const char *f = list[i];
        char key[TW_URL_SHOWN_MAX], line[3 * TW_URL_SHOWN_MAX + 400];
        key_path(f, key, sizeof key);
        line[0] = '\0';
        if (i >= looked) {
            /* beyond the bound: named, not read */
            snprintf(line, sizeof line, "name[%s] unchecked\n", key);
        } else if (tw_url_is_remote(f)) {
            if (n_remote++ < TW_IDENTITY_MAX_REMOTE) {
                st = tw_identity(f, line, sizeof line, err);
            } else {
                snprintf(line, sizeof line, "name[%s] unchecked\n", key);
            }
        } else {
            VSIStatBufL vs;
            if (VSIStatExL(f, &vs, VSI_STAT_EXISTS_FLAG | VSI_STAT_SIZE_FLAG) != 0) {
                snprintf(line, sizeof line, "size[%s] none\n", key);
            } else if (VSI_ISDIR(vs.st_mode)) {
                snprintf(line, sizeof line, "size[%s] directory\n", key);
            } else {
                char when[64], h[HASH_HEX + 1];
                mtime_text(f, &vs, when, sizeof when);
                st = hash_file(f, (uint64_t)vs.st_size, per_file, h, &stats->bytes_read, err);
                if (st == TW_OK) {
                    stats->files_hashed++;
                    snprintf(line, sizeof line,
                             "size[%s] %lld\nmtime[%s] %s\ncontent[%s] sha256:%s\n", key,
                             (long long)vs.st_size, key, when, key, h);
                }
            }
        }
        if (st == TW_OK && line[0] && !add_line(&b, "%s", line)) {
            sha256_update(&rest, strlen(line), (const uint8_t *)line);
            n_rest++;
        }
    }
    CSLDestroy(list);
    if (st != TW_OK) {
        out[0] = '\0';
        return st;
    }
    if (n_rest > 0) {
        uint8_t d[SHA256_DIGEST_SIZE];
        char h[HASH_HEX + 1];
        sha256_digest(&rest, sizeof d, d);
        hex(d, HASH_HEX / 2, h);
        b.size = size;
        b.full = false;
        add_line(&b, "files[+%d] sha256:%s\n", n_rest, h);
    }
    return TW_OK;
}

/* ---- any input: remote objects here, local datasets above ---------------------- */

/* A header value fit for one line of the fingerprint: no blanks or quotes. */
static void header_field(const char *v, char *out, size_t size)
{
    size_t j = 0;
    for (const char *s = v ? v : ""; *s && j + 1 < size; s++)
        if (!isspace((unsigned char)*s) && *s != '"') out[j++] = *s;
    if (j == 0 && size > 1) out[j++] = '-';
    out[j] = '\0';
}

tw_status tw_identity(const char *path, char *out, size_t size, tw_error *err)
{
    if (size) out[0] = '\0';
    char gpath[4096], shown[TW_URL_SHOWN_MAX];
    tw_status st = tw_url_to_gdal(path, gpath, sizeof gpath, err);
    if (st != TW_OK) return st;
    if (!tw_url_is_remote(path)) return tw_identity_local(gpath, out, size, NULL, err);
    tw_url_redact(gpath, shown, sizeof shown);
    VSIStatBufL sb;
    /* A fresh HEAD: GDAL caches what it learnt of the object for the life of
     * the process, and a library caller may run twice in one. */
    VSICurlPartialClearCache(gpath);
    CPLPushErrorHandler(CPLQuietErrorHandler);
    int rc = VSIStatExL(gpath, &sb, VSI_STAT_EXISTS_FLAG | VSI_STAT_SIZE_FLAG);
    char **headers = rc == 0 ? VSIGetFileMetadata(gpath, "HEADERS", NULL) : NULL;
    CPLPopErrorHandler();
    if (rc != 0)
        return tw_error_set(err, TW_ERR_REMOTE, "%s: cannot reach the object to identify it",
                            shown);
    char etag[160], modified[96];
    header_field(CSLFetchNameValue(headers, "ETag"), etag, sizeof etag);
    const char *lm = CSLFetchNameValue(headers, "Last-Modified");
    snprintf(modified, sizeof modified, "%s", lm ? lm : "-");
    for (char *c = modified; *c; c++)
        if (*c == ' ') *c = '_';
    CSLDestroy(headers);
    /* One line, its key naming the object (a refusal says which), the
     * fields most likely to change first (a refusal shows 80 characters of
     * a value); one line, not three, so a STAC item's many assets fit. */
    char key[TW_URL_SHOWN_MAX];
    size_t j = 0;
    for (const char *s = shown; *s && j + 4 < sizeof key; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch <= ' ' || ch == ']' || ch == 0x7f)
            j += (size_t)snprintf(key + j, sizeof key - j, "%%%02X", ch);
        else
            key[j++] = (char)ch;
    }
    key[j] = '\0';
    snprintf(out, size, "object[%s] etag=%s size=%lld modified=%s\n", key, etag,
             (long long)sb.st_size, modified);
    return TW_OK;
}
