/* test_url.c - io/url.c: user paths to GDAL paths, credential redaction,
 * output stems, outage classification, settings apply/restore. The network
 * parts (identity, retries) are tested end to end by e2e_remote.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cpl_conv.h>
#include <string.h>

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
    to_gdal("HTTP://host/b.tif?x=1", "/vsicurl/HTTP://host/b.tif?x=1");
    to_gdal("s3://bucket/dir/key.tif", "/vsis3/bucket/dir/key.tif");
    to_gdal("/vsigs/bucket/key.tif", "/vsigs/bucket/key.tif");
    to_gdal("/vsizip//vsicurl/https://h/a.zip/x.tif", "/vsizip//vsicurl/https://h/a.zip/x.tif");
    to_gdal("local/file.tif", "local/file.tif");
    assert_true(tw_url_is_remote("https://h/x.tif"));
    assert_true(tw_url_is_remote("s3://b/k"));
    assert_true(tw_url_is_remote("/vsis3/b/k"));
    assert_true(tw_url_is_remote("/vsizip//vsicurl/http://h/a.zip"));
    assert_false(tw_url_is_remote("/vsimem/x.tif"));
    assert_false(tw_url_is_remote("data/https.tif"));

    char out[64];
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_url_to_gdal("s3://bucket", out, sizeof out, &err), TW_ERR_INPUT);
    assert_non_null(strstr(err.msg, "s3://BUCKET/KEY"));
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
    assert_false(tw_url_transient(NULL));
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
    tw_url_settings_restore(sv);
    assert_string_equal(CPLGetConfigOption("GDAL_HTTP_MAX_RETRY", ""), "1");
    assert_null(CPLGetConfigOption("GDAL_HTTP_RETRY_DELAY", NULL));
    assert_null(CPLGetConfigOption("CPL_VSIL_CURL_CHUNK_SIZE", NULL));
    assert_string_equal(CPLGetConfigOption("VSI_CACHE", ""), "TRUE");
    tw_url_settings_restore(NULL);
    CPLSetConfigOption("GDAL_HTTP_MAX_RETRY", NULL);
    CPLSetConfigOption("VSI_CACHE", NULL);

    /* The tile-level schedule doubles from retry_delay, capped at 60 s. */
    assert_true(tw_url_retry_delay(&s, 1) == 0.25);
    assert_true(tw_url_retry_delay(&s, 3) == 1.0);
    assert_true(tw_url_retry_delay(&s, 20) == 60.0);
    assert_true(tw_url_retry_span(3, 0.5) == 3.5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paths),    cmocka_unit_test(test_redact),
        cmocka_unit_test(test_stem),     cmocka_unit_test(test_transient),
        cmocka_unit_test(test_settings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
