/* test_aoi.c - io/input/aoi.c: which tiles an area of interest touches, in the
 * raster's CRS and in another one, and its errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include <cpl_conv.h>
#include <gdal.h>
#include <ogr_srs_api.h>

#include "io/input/aoi.h"
#include "testutil.h"

/* A 640 x 640 raster of 10 m pixels in UTM 33N, tiles of 64 px, stride 64:
 * 10 x 10 tiles. */
enum { W = 640, H = 640, T = 64, N = 10 };
static const double X0 = 500000.0, Y0 = 4000000.0, PX = 10.0;

static tw_raster_info raster(bool with_crs)
{
    tw_raster_info info;
    memset(&info, 0, sizeof info);
    info.width = W;
    info.height = H;
    double gt[6] = {X0, PX, 0, Y0, 0, -PX};
    memcpy(info.geotransform, gt, sizeof gt);
    info.has_geotransform = true;
    if (with_crs) {
        OGRSpatialReferenceH s = OSRNewSpatialReference(NULL);
        OSRImportFromEPSG(s, 32633);
        char *wkt = NULL;
        OSRExportToWkt(s, &wkt);
        snprintf(info.crs_wkt, sizeof info.crs_wkt, "%s", wkt);
        CPLFree(wkt);
        OSRDestroySpatialReference(s);
    }
    return info;
}

static int xs[N], ys[N];

static tw_aoi_geometry geometry(void)
{
    for (int i = 0; i < N; i++) xs[i] = ys[i] = i * T;
    return (tw_aoi_geometry){.tile = T, .stride = T, .n_x = N, .n_y = N, .x0 = xs, .y0 = ys};
}

/* Map coordinates of input pixel (px, py). */
static void map_xy(double px, double py, double *x, double *y)
{
    *x = X0 + px * PX;
    *y = Y0 - py * PX;
}

/* A GeoJSON polygon of the pixel rectangle [px0, px1) x [py0, py1), in UTM
 * 33N (epsg 32633) or reprojected to WGS84 (epsg 4326). */
static const char *write_rect(const char *dir, const char *name, int epsg, double px0, double py0,
                              double px1, double py1)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    double xy[5][2];
    double corners[5][2] = {{px0, py0}, {px1, py0}, {px1, py1}, {px0, py1}, {px0, py0}};
    for (int i = 0; i < 5; i++) map_xy(corners[i][0], corners[i][1], &xy[i][0], &xy[i][1]);
    if (epsg == 4326) {
        OGRSpatialReferenceH a = OSRNewSpatialReference(NULL), b = OSRNewSpatialReference(NULL);
        OSRImportFromEPSG(a, 32633);
        OSRImportFromEPSG(b, 4326);
        OSRSetAxisMappingStrategy(a, OAMS_TRADITIONAL_GIS_ORDER);
        OSRSetAxisMappingStrategy(b, OAMS_TRADITIONAL_GIS_ORDER);
        OGRCoordinateTransformationH ct = OCTNewCoordinateTransformation(a, b);
        assert_non_null(ct);
        for (int i = 0; i < 5; i++) assert_true(OCTTransform(ct, 1, &xy[i][0], &xy[i][1], NULL));
        OCTDestroyCoordinateTransformation(ct);
        OSRDestroySpatialReference(a);
        OSRDestroySpatialReference(b);
    }
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"type\": \"FeatureCollection\",");
    if (epsg != 4326)
        fprintf(f,
                "\"crs\": {\"type\": \"name\", \"properties\": {\"name\": "
                "\"urn:ogc:def:crs:EPSG::%d\"}},",
                epsg);
    fprintf(f, "\"features\": [{\"type\": \"Feature\", \"properties\": {}, \"geometry\": "
               "{\"type\": \"Polygon\", \"coordinates\": [[");
    for (int i = 0; i < 5; i++) fprintf(f, "%s[%.10f, %.10f]", i ? ", " : "", xy[i][0], xy[i][1]);
    fprintf(f, "]]}}]}\n");
    fclose(f);
    return path;
}

/* Tiles touched by [px0, px1) x [py0, py1), counted independently. */
static void expect_rect(const tw_aoi *a, double px0, double py0, double px1, double py1)
{
    int64_t n = 0;
    for (int ty = 0; ty < N; ty++)
        for (int tx = 0; tx < N; tx++) {
            bool want = tx * T < px1 && tx * T + T > px0 && ty * T < py1 && ty * T + T > py0;
            if (tw_aoi_tile(a, tx, ty) != want)
                fail_msg("tile (%d, %d): %d, expected %d", tx, ty, tw_aoi_tile(a, tx, ty), want);
            n += want;
        }
    assert_int_equal(tw_aoi_count(a), n);
}

/* The AOI of a rectangle in pixels (written in EPSG:epsg as name) on the
 * test raster, checked tile by tile. The caller destroys it. */
static tw_aoi *rect_aoi(const char *name, int epsg, double px0, double py0, double px1, double py1)
{
    tw_raster_info info = raster(true);
    tw_aoi_geometry g = geometry();
    tw_error err;
    tw_error_init(&err);
    tw_aoi *a = NULL;
    const char *p = write_rect(tw_test_tmpdir(), name, epsg, px0, py0, px1, py1);
    if (tw_aoi_create(p, &info, &g, &a, &err) != TW_OK) fail_msg("%s: %s", name, err.msg);
    expect_rect(a, px0, py0, px1, py1);
    return a;
}

static void same_crs(void **state)
{
    (void)state;
    GDALAllRegister();
    tw_aoi *a = rect_aoi("utm.geojson", 32633, 100, 50, 300, 130);
    assert_int_equal(tw_aoi_count(a), 4 * 3);
    assert_false(tw_aoi_tile(a, -1, 0));
    assert_false(tw_aoi_tile(a, 0, N));
    tw_aoi_destroy(a);
}

static void other_crs(void **state)
{
    (void)state;
    tw_aoi_destroy(rect_aoi("wgs84.geojson", 4326, 100, 50, 300, 130));
    /* partly outside the raster: only the tiles inside count */
    tw_aoi_destroy(rect_aoi("edge.geojson", 4326, 500, 600, 900, 900));
}

static void errors(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    tw_raster_info info = raster(true);
    tw_aoi_geometry g = geometry();
    tw_error err;
    tw_aoi *a = NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/nothere.gpkg", dir);
    tw_error_init(&err);
    assert_int_equal(tw_aoi_create(path, &info, &g, &a, &err), TW_ERR_INPUT);
    assert_null(a);
    assert_non_null(strstr(err.msg, "input.aoi: cannot open"));
    assert_non_null(strstr(err.msg, "nothere.gpkg"));

    snprintf(path, sizeof path, "%s/empty.geojson", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"type\": \"FeatureCollection\", \"features\": []}\n", f);
    fclose(f);
    tw_error_init(&err);
    assert_int_equal(tw_aoi_create(path, &info, &g, &a, &err), TW_ERR_INPUT);
    assert_non_null(strstr(err.msg, "holds no geometry"));

    /* an AOI with a CRS on a raster without one */
    tw_raster_info bare = raster(false);
    const char *p = write_rect(dir, "w.geojson", 4326, 0, 0, 10, 10);
    tw_error_init(&err);
    assert_int_equal(tw_aoi_create(p, &bare, &g, &a, &err), TW_ERR_INPUT);
    assert_non_null(strstr(err.msg, "the raster has none"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(same_crs),
        cmocka_unit_test(other_crs),
        cmocka_unit_test(errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
