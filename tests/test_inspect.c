/* test_inspect.c - io/input/inspect.c (what info and validate learn from GDAL)
 * on the sample raster, whose facts are known (sample_data/README.md), and
 * io/gdal_msgs.c (the one GDAL message capture): failures and warnings are
 * recorded per capture, and captures nest. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cpl_error.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/gdal_msgs.h"
#include "io/input/inspect.h"

static const char *sample(void)
{
    static char path[4096];
    const char *src = getenv("TW_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/sample_data/L7_ETMs.tif", src ? src : TW_SOURCE_DIR);
    return path;
}

static void test_sample_raster(void **state)
{
    (void)state;
    tw_error err;
    tw_error_init(&err);
    tw_inspect *ri = NULL;
    if (tw_inspect_raster(sample(), sample(), &ri, &err) != TW_OK) fail_msg("%s", err.msg);
    assert_string_equal(ri->driver, "GTiff");
    assert_int_equal(ri->width, 349);
    assert_int_equal(ri->height, 352);
    assert_int_equal(ri->band_count, 6);
    assert_true(ri->has_geotransform);
    assert_true(ri->has_crs && ri->crs_understood && !ri->crs_geographic);
    assert_string_equal(ri->crs, "EPSG:31985 (SIRGAS 2000 / UTM zone 25S)");
    assert_string_equal(ri->crs_kind, "projected");
    assert_true(ri->has_metres);
    assert_string_equal(ri->crs_units, "metre");
    double px, py;
    assert_true(tw_inspect_pixel_metres(ri, &px, &py));
    assert_true(fabs(px - 28.5) < 1e-6 && fabs(py - 28.5) < 1e-6);
    for (int i = 0; i < 6; i++) {
        assert_string_equal(ri->bands[i].type, "Byte");
        assert_false(ri->bands[i].has_nodata);
    }
    tw_inspect_destroy(ri);
    tw_inspect_destroy(NULL);

    int bands[3] = {1, 6, 99};
    tw_band_stats s[3];
    assert_int_equal(tw_inspect_band_stats(sample(), bands, 3, s, &err), TW_OK);
    assert_true(s[0].ok && s[1].ok);
    assert_true(s[0].min >= 0 && s[0].max <= 255 && s[0].min < s[0].max);
    assert_non_null(s[0].how);
    /* the whole 128 x 128 raster is sampled: numpy's mean/std of band 1 */
    assert_true(fabs(s[0].mean - 79.14771913258662) < 1e-9);
    assert_true(fabs(s[0].sd - 14.694064257216084) < 1e-9);
    assert_false(s[2].ok);
    assert_null(s[2].how); /* no band 99 */
}

static void test_not_a_raster(void **state)
{
    (void)state;
    tw_error err;
    tw_error_init(&err);
    tw_inspect *ri = (tw_inspect *)&err;
    assert_int_equal(tw_inspect_raster("/nonexistent/x.tif", "/nonexistent/x.tif", &ri, &err),
                     TW_ERR_INPUT);
    assert_null(ri);
    assert_non_null(strstr(err.msg, "/nonexistent/x.tif: not a raster GDAL can open"));
    int b = 1;
    tw_band_stats s;
    tw_error_init(&err);
    assert_int_equal(tw_inspect_band_stats("/nonexistent/x.tif", &b, 1, &s, &err), TW_ERR_INPUT);
}

static void test_capture(void **state)
{
    (void)state;
    tw_gdal_msgs outer, inner;
    tw_gdal_capture_begin(&outer);
    CPLError(CE_Warning, CPLE_AppDefined, "w1");
    tw_gdal_capture_begin(&inner);
    CPLError(CE_Failure, CPLE_AppDefined, "inner failure");
    tw_gdal_capture_end();
    CPLError(CE_Warning, CPLE_AppDefined, "w2");
    assert_string_equal(tw_gdal_capture_text(&outer, "none"), "w2"); /* last warning */
    CPLError(CE_Failure, CPLE_AppDefined, "first");
    CPLError(CE_Failure, CPLE_AppDefined, "second");
    tw_gdal_capture_end();
    assert_int_equal(inner.failures, 1);
    assert_string_equal(inner.failure, "inner failure");
    assert_int_equal(outer.failures, 2);
    assert_string_equal(tw_gdal_capture_text(&outer, "none"), "first");
    assert_string_equal(outer.first_warning, "w1");
    assert_string_equal(outer.last_warning, "w2");
    tw_gdal_msgs empty;
    tw_gdal_capture_begin(&empty);
    tw_gdal_capture_end();
    assert_string_equal(tw_gdal_capture_text(&empty, "fallback"), "fallback");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sample_raster),
        cmocka_unit_test(test_not_a_raster),
        cmocka_unit_test(test_capture),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
