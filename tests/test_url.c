/* test_url.c - io/url.c: user paths to GDAL paths, credential redaction,
 * output stems, outage classification, settings apply/restore. The network
 * parts (identity, retries) are tested end to end by e2e_remote.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cpl_conv.h>
#include <fcntl.h>
#include <gdal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/input/identity.h"
#include "io/url.h"

static void to_gdal(const char *in, const char *want)
{
    char out[512];
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_url_to_gdal(in, out, sizeof out, &err), TW_OK);
    assert_string_equal(out, want);
}

static void test_paths(void **state)
{
    (void)state;
    to_gdal("https://host/a/b.tif", "/vsicurl/https://host/a/b.tif");
    /* a scheme is case-insensitive; GDAL's /vsicurl/ wants it lower case */
    to_gdal("HTTP://host/b.tif?x=1", "/vsicurl/http://host/b.tif?x=1");
    to_gdal("HttpS://u:p%40w@host/b.tif", "/vsicurl/https://u:p%40w@host/b.tif");
    to_gdal("s3://bucket/dir/key.tif", "/vsis3/bucket/dir/key.tif");
    to_gdal("/vsigs/bucket/key.tif", "/vsigs/bucket/key.tif");
    to_gdal("/vsizip//vsicurl/https://h/a.zip/x.tif", "/vsizip//vsicurl/https://h/a.zip/x.tif");
    to_gdal("local/file.tif", "local/file.tif");
    assert_true(tw_url_is_remote("https://h/x.tif"));
    assert_true(tw_url_is_remote("s3://b/k"));
    assert_true(tw_url_is_remote("/vsis3/b/k"));
    assert_true(tw_url_is_remote("/vsizip//vsicurl/http://h/a.zip"));
    assert_true(tw_url_is_remote("/vsicurl?url=http%3A%2F%2Fh%2Fx.tif"));
    assert_false(tw_url_is_remote("/vsimem/x.tif"));
    assert_false(tw_url_is_remote("data/https.tif"));

    char out[64];
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_url_to_gdal("s3://bucket", out, sizeof out, &err), TW_ERR_INPUT);
    assert_non_null(strstr(err.msg, "s3://BUCKET/KEY"));
    /* an '@' of a password not percent-encoded: refused at once, no secret shown */
    tw_error_init(&err);
    char big[256];
    assert_int_equal(tw_url_to_gdal("http://bob:hun@ter2@host/x.tif", big, sizeof big, &err),
                     TW_ERR_INPUT);
    assert_non_null(strstr(err.msg, "%40"));
    assert_null(strstr(err.msg, "hun"));
    assert_null(strstr(err.msg, "ter2"));
    tw_error_init(&err);
    assert_int_equal(tw_url_to_gdal("http://host/a@b/x.tif?q=c@d", big, sizeof big, &err), TW_OK);
    tw_error_init(&err);
    char small[16];
    assert_int_equal(tw_url_to_gdal("https://host/long/path.tif", small, sizeof small, &err),
                     TW_ERR_INPUT);
}

static void redacts(const char *in, const char *want)
{
    char out[1024];
    tw_url_redact(in, out, sizeof out);
    assert_string_equal(out, want);
    assert_int_equal(tw_url_has_secret(in), strcmp(in, want) != 0);
}

static void test_redact(void **state)
{
    (void)state;
    redacts("https://b.s3.amazonaws.com/k.tif?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential="
            "AKIA%2F2026&X-Amz-Date=20261124T000000Z&X-Amz-Signature=abc123&X-Amz-Security-Token="
            "tok#frag",
            "https://b.s3.amazonaws.com/k.tif?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential="
            "REDACTED&X-Amz-Date=20261124T000000Z&X-Amz-Signature=REDACTED&X-Amz-Security-Token="
            "REDACTED#frag");
    /* Azure SAS: only sig is secret; names are case-insensitive. */
    redacts("https://a.blob.core.windows.net/c/x.tif?sv=2021&se=2026&SIG=xyz%3D",
            "https://a.blob.core.windows.net/c/x.tif?sv=2021&se=2026&SIG=REDACTED");
    redacts("https://h/x.tif?token=t&key=k&signature=s&Signature=S&other=keep",
            "https://h/x.tif?token=REDACTED&key=REDACTED&signature=REDACTED&Signature=REDACTED"
            "&other=keep");
    redacts("https://user:pa55@host/x.tif", "https://REDACTED@host/x.tif");
    /* a fragment's parameters (OAuth's implicit flow) like a query's */
    redacts("http://host/x.tif#access_token=s3cr3t&token_type=bearer",
            "http://host/x.tif#access_token=REDACTED&token_type=bearer");
    redacts("http://host/x.tif?a=1#frag&sig=abc", "http://host/x.tif?a=1#frag&sig=REDACTED");
    /* Inside a GDAL message: the value ends at a blank, a quote, a bracket. */
    redacts("HTTP error code: 503 - https://h/x.tif?sig=abc. Retrying",
            "HTTP error code: 503 - https://h/x.tif?sig=REDACTED Retrying");
    redacts("'/vsicurl/https://h/x.tif?token=abc' not recognized",
            "'/vsicurl/https://h/x.tif?token=REDACTED' not recognized");
    /* Nothing to do: local paths, lookalike names, prose with '?'. */
    redacts("/data/scene.tif", "/data/scene.tif");
    redacts("https://h/x.tif?keyword=1&tokens=2&monkey=3",
            "https://h/x.tif?keyword=1&tokens=2&monkey=3");
    redacts("is this a raster? key: value", "is this a raster? key: value");
    /* Percent-encoded names, separators and URLs (GDAL's /vsicurl?url=...):
     * matched after decoding, the raw text kept around the secret. */
    redacts("/vsicurl?url=http%3A%2F%2Fuser%3Apw%40host/x.tif",
            "/vsicurl?url=http%3A%2F%2FREDACTED%40host/x.tif");
    redacts("/vsicurl?max_retry=3&url=https%3a%2f%2fme%3As3cr%2540t%40h%2Fk.tif",
            "/vsicurl?max_retry=3&url=https%3a%2f%2fREDACTED%40h%2Fk.tif");
    redacts("https://h/x.tif?X%2DAmz%2DSignature=abc&X-Amz%2dCredential=AKIA%2F1&a=b",
            "https://h/x.tif?X%2DAmz%2DSignature=REDACTED&X-Amz%2dCredential=REDACTED&a=b");
    redacts("/vsicurl?url=https%3A%2F%2Fh%2Fk.tif%3FX-Amz-Signature%3Dabc%26X-Amz-Date%3D1",
            "/vsicurl?url=https%3A%2F%2Fh%2Fk.tif%3FX-Amz-Signature%3DREDACTED%26X-Amz-Date%3D1");
    /* Twice encoded (%25 of %3D ...) still found. */
    redacts("/vsicurl?url=https%3A%2F%2Fh%2Fk.tif%253Fsig%253Dabc%2526se%253D2",
            "/vsicurl?url=https%3A%2F%2Fh%2Fk.tif%253Fsig%253DREDACTED%2526se%253D2");
    /* A value of a plain parameter ends at a plain '&' only: its encoded
     * '&' is part of the secret. */
    redacts("https://h/x.tif?sig=ab%26cd&se=1", "https://h/x.tif?sig=REDACTED&se=1");
    /* CloudFront signed URLs. */
    redacts("https://d1.cloudfront.net/x.tif?Expires=1700000000&Policy=eyJTdGF0&Signature=a~b_"
            "&Key-Pair-Id=K2JCJMDEHXQW5F",
            "https://d1.cloudfront.net/x.tif?Expires=1700000000&Policy=REDACTED&Signature="
            "REDACTED&Key-Pair-Id=REDACTED");
    redacts("50%off/scene%20a.tif", "50%off/scene%20a.tif");
    /* Truncation keeps the buffer terminated and never leaks a tail. */
    char out[24];
    tw_url_redact("https://h/x.tif?sig=0123456789abcdef", out, sizeof out);
    assert_int_equal(strlen(out), sizeof out - 1);
    assert_null(strstr(out, "0123"));
}

static void stem(const char *in, const char *want)
{
    char out[256];
    tw_url_stem(in, out, sizeof out);
    assert_string_equal(out, want);
}

static void test_stem(void **state)
{
    (void)state;
    stem("data/scene.tif", "scene");
    stem("https://h/a/LC08_B4.TIF?X-Amz-Signature=s&token=t", "LC08_B4");
    stem("s3://bucket/dir/scene.tif#frag", "scene");
    stem("/vsicurl/https://h/item.json?sig=x", "item");
    stem("/vsicurl?max_retry=2&url=https%3A%2F%2Fh%2Fd%2FB04.tif%3Fsig%3Dx", "B04");
    stem("noext", "noext");
    stem(".hidden", ".hidden");
}

static void test_transient(void **state)
{
    (void)state;
    assert_true(tw_url_transient("HTTP response code: 503"));
    assert_true(tw_url_transient("HTTP error code: 429 - https://h/x"));
    assert_true(tw_url_transient("Connection reset by peer"));
    assert_true(tw_url_transient("Couldn't connect to server"));
    assert_true(tw_url_transient("transfer closed with 100 bytes remaining to read"));
    assert_true(tw_url_transient("TIFFFillStrip:Read error at scanline 4294967295; got 0 bytes, "
                                 "expected 5085"));
    assert_false(tw_url_transient("ZIPDecode:Decoding error at scanline 0"));
    assert_false(tw_url_transient("HTTP response code: 404"));
    assert_false(tw_url_transient("HTTP response code: 403"));
    assert_false(tw_url_transient("not recognized as a supported file format"));
    /* GDAL 3.6's /vsicurl/ open failure: the code after the URL, which may
     * hold ": " itself */
    assert_true(tw_url_transient("HTTP response code on http://h:80/a.tif: 503"));
    assert_true(tw_url_transient("HTTP response code on http://h/a: b.tif: 429"));
    assert_false(tw_url_transient("HTTP response code on http://h/a.tif: 404"));
    assert_false(tw_url_transient("HTTP response code on http://h/a.tif: 0"));
    assert_false(tw_url_transient(NULL));
}

static void test_definitive(void **state)
{
    (void)state;
    assert_true(tw_url_definitive("HTTP response code: 404"));
    assert_true(tw_url_definitive("HTTP response code: 403"));
    assert_true(tw_url_definitive("HTTP error code: 401 - https://h/x"));
    assert_true(tw_url_definitive("<Error><Code>NoSuchKey</Code></Error>"));
    assert_false(tw_url_definitive("HTTP response code: 429"));
    assert_false(tw_url_definitive("HTTP response code: 408"));
    assert_false(tw_url_definitive("HTTP response code: 503"));
    assert_false(tw_url_definitive("Connection reset by peer"));
    assert_true(tw_url_definitive("HTTP response code on http://h:80/a.tif: 404"));
    assert_false(tw_url_definitive("HTTP response code on http://h:80/a.tif: 503"));
    assert_false(tw_url_definitive(NULL));
}

static void test_settings(void **state)
{
    (void)state;
    CPLSetConfigOption("GDAL_HTTP_MAX_RETRY", "1");
    CPLSetConfigOption("VSI_CACHE", "TRUE"); /* the user's: kept */
    CPLSetConfigOption("CPL_VSIL_CURL_CHUNK_SIZE", NULL);
    tw_url_settings s = tw_url_default_settings(5, 0.25);
    tw_url_saved *sv = NULL;
    tw_url_settings_apply(&s, &sv);
    assert_non_null(sv);
    assert_string_equal(CPLGetConfigOption("GDAL_HTTP_MAX_RETRY", ""), "5");
    assert_string_equal(CPLGetConfigOption("GDAL_HTTP_RETRY_DELAY", ""), "0.25");
    assert_string_equal(CPLGetConfigOption("VSI_CACHE", ""), "TRUE");
    assert_string_equal(CPLGetConfigOption("CPL_VSIL_CURL_CHUNK_SIZE", ""), "262144");
    assert_null(CPLGetConfigOption("GDAL_HTTP_MERGE_CONSECUTIVE_RANGES", NULL));
    /* input.timeout (default 4 s): a silent server fails the request */
    assert_string_equal(CPLGetConfigOption("GDAL_HTTP_CONNECTTIMEOUT", ""), "4");
    assert_string_equal(CPLGetConfigOption("GDAL_HTTP_LOW_SPEED_TIME", ""), "4");
    assert_string_equal(CPLGetConfigOption("GDAL_HTTP_LOW_SPEED_LIMIT", ""), "1024");
    tw_url_settings_restore(sv);
    assert_null(CPLGetConfigOption("GDAL_HTTP_LOW_SPEED_TIME", NULL));
    assert_string_equal(CPLGetConfigOption("GDAL_HTTP_MAX_RETRY", ""), "1");
    assert_null(CPLGetConfigOption("GDAL_HTTP_RETRY_DELAY", NULL));
    assert_null(CPLGetConfigOption("CPL_VSIL_CURL_CHUNK_SIZE", NULL));
    assert_string_equal(CPLGetConfigOption("VSI_CACHE", ""), "TRUE");
    tw_url_settings_restore(NULL);

    /* Two runs at once: the second's retries on top of the first's; the
     * first to finish leaves the options to the one still reading, the last
     * puts back what was there before either (the first to finish used to
     * restore under the other, which then left the first's values set). */
    tw_url_settings s2 = tw_url_default_settings(9, 0.5);
    tw_url_saved *a = NULL, *b = NULL;
    tw_url_settings_apply(&s, &a);
    tw_url_settings_apply(&s2, &b);
    assert_string_equal(CPLGetConfigOption("GDAL_HTTP_MAX_RETRY", ""), "9");
    tw_url_settings_restore(a);
    assert_string_equal(CPLGetConfigOption("GDAL_HTTP_MAX_RETRY", ""), "9");
    assert_string_equal(CPLGetConfigOption("CPL_VSIL_CURL_CHUNK_SIZE", ""), "262144");
    tw_url_settings_restore(b);
    assert_string_equal(CPLGetConfigOption("GDAL_HTTP_MAX_RETRY", ""), "1");
    assert_null(CPLGetConfigOption("GDAL_HTTP_RETRY_DELAY", NULL));
    assert_null(CPLGetConfigOption("CPL_VSIL_CURL_CHUNK_SIZE", NULL));
    /* ... and in the other order of finishing */
    tw_url_settings_apply(&s, &a);
    tw_url_settings_apply(&s2, &b);
    tw_url_settings_restore(b);
    assert_string_equal(CPLGetConfigOption("GDAL_HTTP_MAX_RETRY", ""), "9");
    tw_url_settings_restore(a);
    assert_string_equal(CPLGetConfigOption("GDAL_HTTP_MAX_RETRY", ""), "1");
    assert_null(CPLGetConfigOption("CPL_VSIL_CURL_CHUNK_SIZE", NULL));
    CPLSetConfigOption("GDAL_HTTP_MAX_RETRY", NULL);
    CPLSetConfigOption("VSI_CACHE", NULL);

    /* The tile-level schedule doubles from retry_delay, capped at 60 s. */
    assert_true(tw_url_retry_delay(&s, 1) == 0.25);
    assert_true(tw_url_retry_delay(&s, 3) == 1.0);
    assert_true(tw_url_retry_delay(&s, 20) == 60.0);
    assert_true(tw_url_retry_span(3, 0.5) == 3.5);
}

/* ---- local identity ---------------------------------------------------- */

/* A w x h one-band Byte GeoTIFF whose pixel (x, y) is (x * 7 + y * 13 +
 * seed) & 255, with creation options opts (NULL-terminated). */
static void make_tif(const char *path, int w, int h, int seed, const char *const *opts)
{
    GDALAllRegister();
    GDALDriverH drv = GDALGetDriverByName("GTiff");
    GDALDatasetH ds = GDALCreate(drv, path, w, h, 1, GDT_Byte, (char **)opts);
    assert_non_null(ds);
    unsigned char *row = malloc((size_t)w);
    for (int y = 0; y < h; y++) {
        for (int x = 0; x < w; x++) row[x] = (unsigned char)((x * 7 + y * 13 + seed) & 255);
        assert_int_equal(
            GDALRasterIO(GDALGetRasterBand(ds, 1), GF_Write, 0, y, w, 1, row, w, 1, GDT_Byte, 0, 0),
            CE_None);
    }
    free(row);
    GDALClose(ds);
}

static void identity_of(const char *path, char *out, size_t size, tw_identity_stats *stats)
{
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_identity_local(path, out, size, stats, &err), TW_OK);
}

/* The value of the line whose key is key (a copy), or "" */
static const char *line_value(const char *id, const char *key, char *buf, size_t size)
{
    buf[0] = '\0';
    size_t kl = strlen(key);
    for (const char *l = id; l && *l;) {
        const char *nl = strchr(l, '\n');
        if (strncmp(l, key, kl) == 0 && l[kl] == ' ') {
            size_t n = (size_t)((nl ? nl : l + strlen(l)) - (l + kl + 1));
            snprintf(buf, size, "%.*s", (int)(n < size - 1 ? n : size - 1), l + kl + 1);
            return buf;
        }
        l = nl ? nl + 1 : NULL;
    }
    return buf;
}

static void set_mtime(const char *path, const struct timespec *t)
{
    struct timespec ts[2] = {*t, *t};
    assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
}

static void test_identity_local(void **state)
{
    (void)state;
    char dir[] = "/tmp/tw_ident_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char tif[256], vrt[256], key[300], a[8192], b[8192], v1[128], v2[128];
    snprintf(tif, sizeof tif, "%s/a scene.tif", dir); /* a blank: %20 in keys */
    const char *plain[] = {"TILED=YES", "BLOCKXSIZE=256", "BLOCKYSIZE=256", NULL};
    make_tif(tif, 2048, 2048, 0, plain); /* 4 MiB: sampled, not read whole */
    tw_identity_stats st;
    identity_of(tif, a, sizeof a, &st);
    snprintf(key, sizeof key, "size[%s/a%%20scene.tif]", dir);
    assert_non_null(strstr(a, key));
    assert_int_equal(st.files, 1);
    assert_int_equal(st.files_hashed, 1);
    /* 1 MiB sampled plus the block index (64 tiles x 16 bytes), not 4 MiB */
    assert_int_equal(st.bytes_read, (1 << 20) + 64 * 16);
    identity_of(tif, b, sizeof b, NULL);
    assert_string_equal(a, b); /* deterministic */

    /* Same size and layout, other pixels, the old mtime put back: only the
     * content line tells them apart (this is the replaced-raster case). */
    struct stat sb;
    assert_int_equal(stat(tif, &sb), 0);
    make_tif(tif, 2048, 2048, 1, plain);
    set_mtime(tif, &sb.st_mtim);
    identity_of(tif, b, sizeof b, NULL);
    snprintf(key, sizeof key, "content[%s/a%%20scene.tif]", dir);
    assert_string_not_equal(line_value(a, key, v1, sizeof v1), line_value(b, key, v2, sizeof v2));
    assert_true(strncmp(v1, "sha256:", 7) == 0 && strlen(v1) == 7 + 32);
    snprintf(key, sizeof key, "size[%s/a%%20scene.tif]", dir);
    assert_string_equal(line_value(a, key, v1, sizeof v1), line_value(b, key, v2, sizeof v2));
    snprintf(key, sizeof key, "mtime[%s/a%%20scene.tif]", dir);
    assert_string_equal(line_value(a, key, v1, sizeof v1), line_value(b, key, v2, sizeof v2));

    /* Same bytes, a new mtime (cp without -p): the mtime line differs. */
    make_tif(tif, 2048, 2048, 0, plain);
    struct timespec later = {.tv_sec = sb.st_mtim.tv_sec + 60, .tv_nsec = 5};
    set_mtime(tif, &later);
    identity_of(tif, b, sizeof b, NULL);
    assert_string_not_equal(line_value(a, key, v1, sizeof v1), line_value(b, key, v2, sizeof v2));
    snprintf(key, sizeof key, "content[%s/a%%20scene.tif]", dir);
    assert_string_equal(line_value(a, key, v1, sizeof v1), line_value(b, key, v2, sizeof v2));

    /* A compressed file with one block rewritten in place: the content
     * hash changes (the block index, 4096 tiles x 16 bytes, is read). */
    char z[256];
    snprintf(z, sizeof z, "%s/z.tif", dir);
    const char *deflate[] = {"TILED=YES", "BLOCKXSIZE=64", "BLOCKYSIZE=64", "COMPRESS=DEFLATE",
                             NULL};
    make_tif(z, 4096, 4096, 0, deflate);
    identity_of(z, a, sizeof a, &st);
    assert_int_equal(st.bytes_read, (1 << 20) + 4096 * 16);
    GDALDatasetH ds = GDALOpen(z, GA_Update);
    assert_non_null(ds);
    /* Block (31, 31): constant pixels compress to fewer bytes. GDAL writes
     * the smaller block in place of the old one (same offset). */
    unsigned char flat[64 * 64];
    memset(flat, 9, sizeof flat);
    assert_int_equal(GDALRasterIO(GDALGetRasterBand(ds, 1), GF_Write, 31 * 64, 31 * 64, 64, 64,
                                  flat, 64, 64, GDT_Byte, 0, 0),
                     CE_None);
    GDALClose(ds);
    identity_of(z, b, sizeof b, NULL);
    snprintf(key, sizeof key, "content[%s/z.tif]", dir);
    assert_string_not_equal(line_value(a, key, v1, sizeof v1), line_value(b, key, v2, sizeof v2));

    /* A VRT: its source is a file of the identity, named in its keys. */
    snprintf(vrt, sizeof vrt, "%s/m.vrt", dir);
    GDALDatasetH src = GDALOpen(tif, GA_ReadOnly);
    GDALDatasetH v = GDALCreateCopy(GDALGetDriverByName("VRT"), vrt, src, 0, NULL, NULL, NULL);
    GDALClose(v);
    GDALClose(src);
    identity_of(vrt, a, sizeof a, &st);
    assert_int_equal(st.files, 2);
    snprintf(key, sizeof key, "content[%s/a%%20scene.tif]", dir);
    assert_non_null(strstr(a, key));
    snprintf(key, sizeof key, "content[%s]", vrt);
    assert_non_null(strstr(a, key));

    /* A buffer too small for every file's lines: one closing line over
     * the files that did not fit, still telling versions apart. */
    char small[300];
    identity_of(vrt, small, sizeof small, NULL);
    assert_non_null(strstr(small, "files[+"));
    assert_true(strlen(small) < sizeof small);

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paths),          cmocka_unit_test(test_redact),
        cmocka_unit_test(test_stem),           cmocka_unit_test(test_transient),
        cmocka_unit_test(test_settings),       cmocka_unit_test(test_definitive),
        cmocka_unit_test(test_identity_local),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
