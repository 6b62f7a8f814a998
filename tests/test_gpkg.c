/* test_gpkg.c - the GeoPackage of tile polygons: written by io/output/gpkg.c, read
 * back with OGR's C API and checked against footprints computed here from
 * the geotransform. */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <cpl_conv.h>
#include <gdal.h>
#include <ogr_api.h>
#include <ogr_srs_api.h>

#include "io/output/gpkg.h"
#include "tests/testutil.h"

/* "Water body" and "water-body" both sanitize to p_Water_body / p_water_body,
 * which SQLite treats as one column: the second must get another name. */
static const char k_names[4][TW_NAME_MAX] = {"Water body", "forest", "water-body", "urban/built"};
static const char *k_fields[4] = {"p_Water_body", "p_forest", "p_water_body_2", "p_urban_built"};

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlink(tw_test_path(dir, e->d_name));
    closedir(d);
    rmdir(dir);
}

static char *utm_wkt(void)
{
    OGRSpatialReferenceH srs = OSRNewSpatialReference(NULL);
    assert_int_equal(OSRImportFromEPSG(srs, 32632), OGRERR_NONE);
    char *wkt = NULL;
    assert_int_equal(OSRExportToWkt(srs, &wkt), OGRERR_NONE);
    OSRDestroySpatialReference(srs);
    return wkt;
}

static tw_gpkg_params base_params(const char *path, const double gt[6], const char *wkt)
{
    tw_gpkg_params p;
    memset(&p, 0, sizeof p);
    p.path = path;
    p.n_classes = 4;
    p.class_names = k_names;
    p.tile = 64;
    memcpy(p.geotransform, gt, sizeof p.geotransform);
    p.crs_wkt = wkt;
    return p;
}

/* Deterministic probabilities that sum to 1 with a known argmax. */
static void tile_probs(int i, float *pr)
{
    float sum = 0;
    for (int c = 0; c < 4; c++) {
        pr[c] = (float)(1 + ((i * 7 + c * 3) % 11));
        sum += pr[c];
    }
    for (int c = 0; c < 4; c++) pr[c] /= sum;
}

static int argmax4(const float *pr)
{
    int b = 0;
    for (int c = 1; c < 4; c++)
        if (pr[c] > pr[b]) b = c;
    return b;
}

/* Writes n tiles on a grid 100 tiles wide, appended in blocks of 1000 so
 * that a transaction boundary (4096 features) falls inside an append. */
static void write_tiles(tw_gpkg *g, int n)
{
    enum { blk = 1000 };
    int32_t rows[blk], cols[blk];
    float probs[blk * 4];
    tw_error err;
    tw_error_init(&err);
    for (int t = 0; t < n; t += blk) {
        int m = n - t < blk ? n - t : blk;
        for (int k = 0; k < m; k++) {
            rows[k] = ((t + k) / 100) * 64;
            cols[k] = ((t + k) % 100) * 64;
            tile_probs(t + k, probs + k * 4);
        }
        assert_int_equal(tw_gpkg_append(g, m, rows, cols, probs, &err), TW_OK);
    }
}

static void test_write_read(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    const char *path = tw_test_path(dir, "scene.tiles.gpkg");
    const double gt[6] = {600000.0, 30.0, 0.0, 5100000.0, 0.0, -30.0};
    char *wkt = utm_wkt();
    tw_gpkg_params p = base_params(path, gt, wkt);
    tw_gpkg *g = NULL;
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_gpkg_create(&p, &g, &err), TW_OK);
    const int n = 5000;
    write_tiles(g, n);
    /* Nothing under the final name before finish. */
    assert_false(tw_test_file_exists(path));
    assert_int_equal(tw_gpkg_finish(g, &err), TW_OK);
    tw_gpkg_destroy(g);
    /* Only the product is left: no .part, no -journal/-wal. */
    assert_int_equal(count_entries(dir), 1);
    assert_true(tw_test_file_exists(path));

    GDALAllRegister();
    const char *drivers[] = {"GPKG", NULL};
    GDALDatasetH ds = GDALOpenEx(path, GDAL_OF_VECTOR | GDAL_OF_READONLY, drivers, NULL, NULL);
    assert_non_null(ds);
    assert_int_equal(GDALDatasetGetLayerCount(ds), 1);
    OGRLayerH layer = GDALDatasetGetLayerByName(ds, "tiles");
    assert_non_null(layer);
    assert_int_equal(OGR_L_GetFeatureCount(layer, TRUE), n);
    assert_int_equal(wkbFlatten(OGR_L_GetGeomType(layer)), wkbPolygon);

    OGRSpatialReferenceH srs = OGR_L_GetSpatialRef(layer);
    assert_non_null(srs);
    const char *code = OSRGetAuthorityCode(srs, NULL);
    assert_non_null(code);
    assert_string_equal(code, "32632");

    OGRFeatureDefnH defn = OGR_L_GetLayerDefn(layer);
    assert_int_equal(OGR_FD_GetFieldCount(defn), 5 + 4);
    const char *fixed[5] = {"row", "col", "class", "class_name", "confidence"};
    const OGRFieldType types[5] = {OFTInteger, OFTInteger, OFTInteger, OFTString, OFTReal};
    for (int i = 0; i < 5; i++) {
        OGRFieldDefnH fd = OGR_FD_GetFieldDefn(defn, i);
        assert_string_equal(OGR_Fld_GetNameRef(fd), fixed[i]);
        assert_int_equal(OGR_Fld_GetType(fd), types[i]);
    }
    for (int c = 0; c < 4; c++)
        assert_string_equal(OGR_Fld_GetNameRef(OGR_FD_GetFieldDefn(defn, 5 + c)), k_fields[c]);

    /* Every feature: its fields and its footprint. */
    OGR_L_ResetReading(layer);
    int seen = 0;
    for (OGRFeatureH f; (f = OGR_L_GetNextFeature(layer)) != NULL; OGR_F_Destroy(f)) {
        int row = OGR_F_GetFieldAsInteger(f, 0), col = OGR_F_GetFieldAsInteger(f, 1);
        int i = (row / 64) * 100 + col / 64;
        assert_int_equal(i, seen); /* written order */
        float pr[4];
        tile_probs(i, pr);
        int best = argmax4(pr);
        assert_int_equal(OGR_F_GetFieldAsInteger(f, 2), best);
        assert_string_equal(OGR_F_GetFieldAsString(f, 3), k_names[best]);
        assert_float_equal(OGR_F_GetFieldAsDouble(f, 4), pr[best], 1e-7);
        for (int c = 0; c < 4; c++)
            assert_float_equal(OGR_F_GetFieldAsDouble(f, 5 + c), pr[c], 1e-7);
        OGRGeometryH geom = OGR_F_GetGeometryRef(f);
        assert_non_null(geom);
        OGREnvelope env;
        OGR_G_GetEnvelope(geom, &env);
        assert_float_equal(env.MinX, 600000.0 + col * 30.0, 1e-6);
        assert_float_equal(env.MaxX, 600000.0 + (col + 64) * 30.0, 1e-6);
        assert_float_equal(env.MaxY, 5100000.0 - row * 30.0, 1e-6);
        assert_float_equal(env.MinY, 5100000.0 - (row + 64) * 30.0, 1e-6);
        assert_float_equal(OGR_G_Area(geom), (64 * 30.0) * (64 * 30.0), 1e-3);
        seen++;
    }
    assert_int_equal(seen, n);

    /* The spatial index answers a window query: tiles 0 and 1 of row 0
     * (their interiors; a shared edge would also match the neighbours). */
    OGR_L_SetSpatialFilterRect(layer, 600000.0 + 10, 5100000.0 - 64 * 30.0 + 10,
                               600000.0 + 2 * 64 * 30.0 - 10, 5100000.0 - 10);
    assert_int_equal(OGR_L_GetFeatureCount(layer, TRUE), 2);
    GDALClose(ds);
    CPLFree(wkt);
    remove_dir(dir);
}

/* A rotated geotransform and no CRS: the footprint's corners follow both
 * axes of the transform. */
static void test_rotated_no_crs(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    const char *path = tw_test_path(dir, "rot.tiles.gpkg");
    const double gt[6] = {1000.0, 2.0, 0.5, 2000.0, 0.25, -3.0};
    tw_gpkg_params p = base_params(path, gt, "");
    p.tile = 10;
    tw_gpkg *g = NULL;
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_gpkg_create(&p, &g, &err), TW_OK);
    int32_t row = 20, col = 30;
    float pr[4] = {0.1f, 0.2f, 0.3f, 0.4f};
    assert_int_equal(tw_gpkg_append(g, 1, &row, &col, pr, &err), TW_OK);
    assert_int_equal(tw_gpkg_finish(g, &err), TW_OK);
    tw_gpkg_destroy(g);

    GDALAllRegister();
    GDALDatasetH ds = GDALOpenEx(path, GDAL_OF_VECTOR, NULL, NULL, NULL);
    assert_non_null(ds);
    OGRLayerH layer = GDALDatasetGetLayer(ds, 0);
    /* No CRS: the undefined cartesian SRS (srs_id -1), not a geographic one. */
    OGRSpatialReferenceH srs = OGR_L_GetSpatialRef(layer);
    assert_true(srs == NULL || OSRIsLocal(srs));
    OGRFeatureH f = OGR_L_GetNextFeature(layer);
    assert_non_null(f);
    assert_int_equal(OGR_F_GetFieldAsInteger(f, 2), 3);
    OGRGeometryH ring = OGR_G_GetGeometryRef(OGR_F_GetGeometryRef(f), 0);
    assert_int_equal(OGR_G_GetPointCount(ring), 5);
    const int dc[4] = {0, 1, 1, 0}, dr[4] = {0, 0, 1, 1};
    for (int k = 0; k < 4; k++) {
        double px = col + dc[k] * 10.0, py = row + dr[k] * 10.0;
        assert_float_equal(OGR_G_GetX(ring, k), gt[0] + px * gt[1] + py * gt[2], 1e-9);
        assert_float_equal(OGR_G_GetY(ring, k), gt[3] + px * gt[4] + py * gt[5], 1e-9);
    }
    assert_float_equal(OGR_G_GetX(ring, 4), OGR_G_GetX(ring, 0), 0);
    OGR_F_Destroy(f);
    GDALClose(ds);
    remove_dir(dir);
}

static void test_destroy_removes_part(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    const char *path = tw_test_path(dir, "scene.tiles.gpkg");
    const double gt[6] = {0, 1, 0, 0, 0, -1};
    tw_gpkg_params p = base_params(path, gt, NULL);
    tw_gpkg *g = NULL;
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_gpkg_create(&p, &g, &err), TW_OK);
    write_tiles(g, 300);
    assert_true(count_entries(dir) >= 1); /* the temporary exists meanwhile */
    assert_false(tw_test_file_exists(path));
    tw_gpkg_destroy(g);
    assert_int_equal(count_entries(dir), 0);
    tw_gpkg_destroy(NULL);
    remove_dir(dir);
}

static void test_bad_path(void **state)
{
    (void)state;
    const double gt[6] = {0, 1, 0, 0, 0, -1};
    tw_gpkg_params p = base_params("/nonexistent-tilewise-dir/x.tiles.gpkg", gt, NULL);
    tw_gpkg *g = NULL;
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_gpkg_create(&p, &g, &err), TW_ERR_OUTPUT);
    assert_null(g);
    assert_non_null(strstr(err.msg, "/nonexistent-tilewise-dir/.x.tiles.gpkg.part.gpkg"));
}

static void test_path_is_directory(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    const char *path = tw_test_path(dir, "s.tiles.gpkg");
    assert_int_equal(mkdir(path, 0755), 0);
    const double gt[6] = {0, 1, 0, 0, 0, -1};
    tw_gpkg_params p = base_params(path, gt, NULL);
    tw_gpkg *g = NULL;
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_gpkg_create(&p, &g, &err), TW_ERR_OUTPUT);
    assert_null(g);
    assert_non_null(strstr(err.msg, "s.tiles.gpkg exists and is a directory"));
    assert_int_equal(count_entries(dir), 1); /* no temporary left behind */
    rmdir(path);
    remove_dir(dir);
}

static void test_bad_crs(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    const double gt[6] = {0, 1, 0, 0, 0, -1};
    tw_gpkg_params p = base_params(tw_test_path(dir, "c.tiles.gpkg"), gt, "NOT A CRS AT ALL");
    tw_gpkg *g = NULL;
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_gpkg_create(&p, &g, &err), TW_ERR_INPUT);
    assert_null(g);
    assert_non_null(strstr(err.msg, "CRS"));
    assert_int_equal(count_entries(dir), 0);
    remove_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_read),           cmocka_unit_test(test_rotated_no_crs),
        cmocka_unit_test(test_destroy_removes_part), cmocka_unit_test(test_bad_path),
        cmocka_unit_test(test_path_is_directory),    cmocka_unit_test(test_bad_crs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
