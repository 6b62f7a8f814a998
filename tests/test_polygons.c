/* test_polygons.c - io/output/polygons.c on small class maps drawn here, read back
 * with OGR: regions counted by hand (4-connected: a diagonal touch is two
 * regions; an island makes a hole), nodata making no polygon, cells and
 * mean confidence per region, the sieve, the memory check naming
 * output.min_area, nothing left under a final or temporary name on failure,
 * and the summary `tilewise info` prints. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <gdal.h>
#include <ogr_api.h>

#include "io/output/polygons.h"
#include "tests/testutil.h"

static const char k_names[3][TW_NAME_MAX] = {"water", "forest", "town"};

/* 8 x 6 cells of 10 x 10 m (EPSG:32632):
 *   row 0: 0 0 0 0 1 1 1 1
 *   row 1: 0 2 2 0 1 1 1 1
 *   row 2: 0 2 2 0 1 . . 1      . = nodata (255)
 *   row 3: 0 0 0 0 1 . . 1
 *   row 4: 1 1 0 2 1 1 1 1
 *   row 5: 1 1 2 0 0 0 0 0
 * Regions (4-connected): water A (the 4 x 4 block around the town island,
 * and (4,2)) 13 cells, the town island 4, forest C (right, around the
 * nodata) 16, forest D (bottom left) 4, town E (4,3) 1, town F (5,2) 1
 * (E and F touch at a corner only), water G (5,3..7) 5 (touching A at a
 * corner only): 7 regions, 44 cells; water 18, forest 20, town 6. */
static const uint8_t k_map[6][8] = {
    {0, 0, 0, 0, 1, 1, 1, 1},     {0, 2, 2, 0, 1, 1, 1, 1}, {0, 2, 2, 0, 1, 255, 255, 1},
    {0, 0, 0, 0, 1, 255, 255, 1}, {1, 1, 0, 2, 1, 1, 1, 1}, {1, 1, 2, 0, 0, 0, 0, 0},
};

static void write_maps(const char *dir, char *cls, char *conf)
{
    snprintf(cls, 512, "%s", tw_test_path(dir, "c.tif"));
    snprintf(conf, 512, "%s", tw_test_path(dir, "f.tif"));
    GDALAllRegister();
    GDALDriverH drv = GDALGetDriverByName("GTiff");
    double gt[6] = {500000, 10, 0, 6000000, 0, -10};
    GDALDatasetH c = GDALCreate(drv, cls, 8, 6, 1, GDT_Byte, NULL);
    GDALDatasetH f = GDALCreate(drv, conf, 8, 6, 1, GDT_Float32, NULL);
    assert_non_null(c);
    assert_non_null(f);
    GDALSetGeoTransform(c, gt);
    GDALSetGeoTransform(f, gt);
    GDALSetProjection(c, "EPSG:32632");
    GDALSetProjection(f, "EPSG:32632");
    GDALSetRasterNoDataValue(GDALGetRasterBand(c, 1), 255);
    float v[6][8];
    for (int y = 0; y < 6; y++)
        for (int x = 0; x < 8; x++) v[y][x] = 0.5f + 0.01f * (float)(y * 8 + x);
    assert_int_equal(GDALRasterIO(GDALGetRasterBand(c, 1), GF_Write, 0, 0, 8, 6, (void *)k_map, 8,
                                  6, GDT_Byte, 0, 0),
                     CE_None);
    assert_int_equal(
        GDALRasterIO(GDALGetRasterBand(f, 1), GF_Write, 0, 0, 8, 6, v, 8, 6, GDT_Float32, 0, 0),
        CE_None);
    GDALClose(c);
    GDALClose(f);
}

static tw_polygons_params params(const char *cls, const char *conf, const char *out,
                                 const char *dir)
{
    tw_polygons_params p = {.class_path = cls,
                            .conf_path = conf,
                            .path = out,
                            .scratch_dir = dir,
                            .n_classes = 3,
                            .class_names = k_names};
    return p;
}

/* The reference: per region (by its first cell) its class, cells and mean
 * confidence, by a flood fill over k_map (4-connected). */
typedef struct ref_region {
    int first, cls, cells;
    double conf;
} ref_region;

static int flood(int *lab, int y, int x, int id, int cls, double *sum)
{
    if (y < 0 || x < 0 || y >= 6 || x >= 8 || lab[y * 8 + x] || k_map[y][x] != cls) return 0;
    lab[y * 8 + x] = id;
    *sum += 0.5f + 0.01f * (float)(y * 8 + x);
    return 1 + flood(lab, y - 1, x, id, cls, sum) + flood(lab, y + 1, x, id, cls, sum) +
           flood(lab, y, x - 1, id, cls, sum) + flood(lab, y, x + 1, id, cls, sum);
}

static int reference(ref_region *r)
{
    int lab[48] = {0}, n = 0;
    for (int q = 0; q < 48; q++) {
        int y = q / 8, x = q % 8;
        if (lab[q] || k_map[y][x] == 255) continue;
        double sum = 0;
        int cells = flood(lab, y, x, n + 1, k_map[y][x], &sum);
        r[n] = (ref_region){q, k_map[y][x], cells, sum / cells};
        n++;
    }
    return n;
}

static void exact_regions(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    char cls[512], conf[512], out[512];
    write_maps(dir, cls, conf);
    snprintf(out, sizeof out, "%s", tw_test_path(dir, "m.class.gpkg"));
    tw_polygons_params p = params(cls, conf, out, dir);
    tw_error err;
    tw_error_init(&err);
    int64_t n = 0;
    assert_int_equal(tw_polygons_write(&p, &n, &err), TW_OK);
    ref_region ref[48];
    int nr = reference(ref);
    assert_int_equal(nr, 7);
    assert_int_equal(n, nr);
    assert_false(tw_test_file_exists(tw_test_path(dir, ".m.class.gpkg.part.gpkg")));
    assert_false(tw_test_file_exists(tw_test_path(dir, "polygons-raw.gpkg")));

    GDALDatasetH ds = GDALOpenEx(out, GDAL_OF_VECTOR, NULL, NULL, NULL);
    assert_non_null(ds);
    OGRLayerH l = GDALDatasetGetLayerByName(ds, "classes");
    assert_non_null(l);
    assert_string_equal(GDALGetMetadataItem((GDALMajorObjectH)l, "AREA_UNIT", NULL),
                        "square metre");
    assert_non_null(strstr(GDALGetMetadataItem((GDALMajorObjectH)l, "CLASS_COLORS", NULL),
                           "#0072bd,#228b22,#e69f00"));
    int seen = 0;
    double area_sum = 0;
    OGRFeatureH f;
    while ((f = OGR_L_GetNextFeature(l)) != NULL) {
        OGRGeometryH g = OGR_F_GetGeometryRef(f);
        assert_true(OGR_G_IsValid(g));
        /* the first cell: the exterior ring's smallest (row, col) vertex */
        OGRGeometryH ring = OGR_G_GetGeometryRef(g, 0);
        int best = 1 << 30;
        for (int i = 0; i < OGR_G_GetPointCount(ring); i++) {
            int col = (int)lround((OGR_G_GetX(ring, i) - 500000) / 10);
            int row = (int)lround((6000000 - OGR_G_GetY(ring, i)) / 10);
            if (col < 8 && row < 6 && row * 8 + col < best) best = row * 8 + col;
        }
        int k = 0;
        while (k < nr && ref[k].first != best) k++;
        assert_true(k < nr);
        assert_int_equal(OGR_F_GetFieldAsInteger(f, 0), ref[k].cls);
        assert_string_equal(OGR_F_GetFieldAsString(f, 1), k_names[ref[k].cls]);
        assert_int_equal(OGR_F_GetFieldAsInteger64(f, 3), ref[k].cells);
        assert_true(fabs(OGR_F_GetFieldAsDouble(f, 2) - 100.0 * ref[k].cells) < 1e-6);
        assert_true(fabs(OGR_F_GetFieldAsDouble(f, 4) - ref[k].conf) < 1e-6);
        area_sum += OGR_G_Area(g);
        seen++;
        OGR_F_Destroy(f);
    }
    assert_int_equal(seen, 7);
    assert_true(fabs(area_sum - 100.0 * 44) < 1e-6); /* 48 cells, 4 nodata */
    GDALClose(ds);

    tw_polygons_summary s;
    assert_int_equal(tw_polygons_summarize(out, &s, &err), TW_OK);
    assert_true(s.found);
    assert_int_equal(s.features, 7);
    assert_int_equal(s.n_classes, 3);
    assert_int_equal(s.classes[0].features, 2); /* water A, G */
    assert_int_equal(s.classes[0].cells, 18);
    assert_int_equal(s.classes[1].cells, 20);
    assert_true(fabs(s.classes[2].area - 600.0) < 1e-6);
    assert_string_equal(s.crs, "EPSG:32632");
}

static void sieve_and_memory(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    char cls[512], conf[512], out[512];
    write_maps(dir, cls, conf);
    snprintf(out, sizeof out, "%s", tw_test_path(dir, "m.class.fgb"));
    tw_polygons_params p = params(cls, conf, out, dir);
    p.format = TW_VECTOR_FGB;
    /* 2 cells: E and F (one cell each) merge into their largest neighbours,
     * C and A; F, now water, joins A and G into one region: 4 are left */
    p.min_area = 150;
    tw_error err;
    tw_error_init(&err);
    int64_t n = 0;
    assert_int_equal(tw_polygons_write(&p, &n, &err), TW_OK);
    assert_int_equal(n, 4);
    tw_polygons_summary s;
    assert_int_equal(tw_polygons_summarize(out, &s, &err), TW_OK);
    assert_string_equal(s.driver, "FlatGeobuf");
    int64_t cells = 0;
    for (int i = 0; i < s.n_classes; i++) cells += s.classes[i].cells;
    assert_int_equal(cells, 44);
    assert_int_equal(s.classes[0].cells, 19); /* A + F + G */
    assert_int_equal(s.classes[2].cells, 4);  /* the island */
    assert_false(tw_test_file_exists(tw_test_path(dir, "polygons-sieved.tif")));

    /* regions that do not fit: refused before the sieve, nothing written */
    char out2[512];
    snprintf(out2, sizeof out2, "%s", tw_test_path(dir, "n.class.gpkg"));
    p = params(cls, conf, out2, dir);
    p.max_bytes = tw_polygons_memory(8, 6, 7) - 1;
    assert_int_equal(tw_polygons_write(&p, NULL, &err), TW_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "7 regions"));
    assert_non_null(strstr(err.msg, "output.min_area"));
    assert_false(tw_test_file_exists(out2));
    assert_false(tw_test_file_exists(tw_test_path(dir, ".n.class.gpkg.part.gpkg")));
    p.max_bytes = tw_polygons_memory(8, 6, 7);
    tw_error_init(&err);
    assert_int_equal(tw_polygons_write(&p, NULL, &err), TW_OK);

    /* an unreadable class map: an input error naming it */
    p = params(tw_test_path(dir, "missing.tif"), conf, out2, dir);
    tw_error_init(&err);
    assert_int_equal(tw_polygons_write(&p, NULL, &err), TW_ERR_INPUT);
    assert_non_null(strstr(err.msg, "missing.tif"));

    /* a vector file without the layer is no polygons file */
    assert_int_equal(tw_polygons_summarize(cls, &s, &err), TW_ERR_INPUT);
}

/* simplify: shared boundaries stay shared, so the polygons neither overlap
 * nor leave a gap (the sum of their areas = their union's area = the map's
 * extent less the nodata it still excludes), and each is valid. */
static void simplify_shared(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    char cls[512], conf[512], out[512];
    write_maps(dir, cls, conf);
    snprintf(out, sizeof out, "%s", tw_test_path(dir, "s.class.gpkg"));
    tw_polygons_params p = params(cls, conf, out, dir);
    p.simplify = 15;
    tw_error err;
    tw_error_init(&err);
    int64_t n = 0;
    assert_int_equal(tw_polygons_write(&p, &n, &err), TW_OK);
    assert_int_equal(n, 7);
    GDALDatasetH ds = GDALOpenEx(out, GDAL_OF_VECTOR, NULL, NULL, NULL);
    OGRLayerH l = GDALDatasetGetLayerByName(ds, "classes");
    OGRGeometryH all = OGR_G_CreateGeometry(wkbMultiPolygon);
    double sum = 0;
    OGRFeatureH f;
    while ((f = OGR_L_GetNextFeature(l)) != NULL) {
        OGRGeometryH g = OGR_F_GetGeometryRef(f);
        assert_true(OGR_G_IsValid(g));
        assert_true(fabs(OGR_F_GetFieldAsDouble(f, 2) - OGR_G_Area(g)) < 1e-6);
        sum += OGR_G_Area(g);
        OGR_G_AddGeometry(all, g);
        OGR_F_Destroy(f);
    }
    OGRGeometryH u = OGR_G_UnionCascaded(all);
    assert_non_null(u);
    assert_true(fabs(OGR_G_Area(u) - sum) < 1e-6);
    /* no gap: the union is one polygon whose only hole is the nodata */
    assert_int_equal(wkbFlatten(OGR_G_GetGeometryType(u)), wkbPolygon);
    assert_int_equal(OGR_G_GetGeometryCount(u), 2);
    /* the outer extent's corners are kept: the union spans the map */
    OGREnvelope env;
    OGR_G_GetEnvelope(u, &env);
    assert_true(env.MinX == 500000 && env.MaxX == 500080 && env.MinY == 5999940 &&
                env.MaxY == 6000000);
    OGR_G_DestroyGeometry(u);
    OGR_G_DestroyGeometry(all);
    GDALClose(ds);
}

/* A 16 x 16 checkerboard of two classes (10 m cells): 256 regions of one
 * cell each (issue 40.2). Too many for max_bytes: refused naming what can
 * help, and output.min_area not as a remedy (it cannot lower the count,
 * taken before its sieve: the same refusal with a large one). With room,
 * a min_area of 100 cells leaves every region: each is smaller, but so are
 * all its neighbours (GDALSieveFilter's rule, README). */
static void checkerboard(void **state)
{
    (void)state;
    char dir[512], cls[512], conf[512], out[512];
    snprintf(dir, sizeof dir, "%s", tw_test_tmpdir());
    snprintf(cls, sizeof cls, "%s", tw_test_path(dir, "board.tif"));
    snprintf(conf, sizeof conf, "%s", tw_test_path(dir, "board_conf.tif"));
    snprintf(out, sizeof out, "%s", tw_test_path(dir, "board.class.gpkg"));
    GDALAllRegister();
    GDALDriverH drv = GDALGetDriverByName("GTiff");
    double gt[6] = {500000, 10, 0, 6000000, 0, -10};
    GDALDatasetH c = GDALCreate(drv, cls, 16, 16, 1, GDT_Byte, NULL);
    GDALDatasetH f = GDALCreate(drv, conf, 16, 16, 1, GDT_Float32, NULL);
    assert_non_null(c);
    assert_non_null(f);
    GDALSetGeoTransform(c, gt);
    GDALSetGeoTransform(f, gt);
    GDALSetRasterNoDataValue(GDALGetRasterBand(c, 1), 255);
    uint8_t board[16][16];
    float v[16][16];
    for (int y = 0; y < 16; y++)
        for (int x = 0; x < 16; x++) board[y][x] = (uint8_t)((x + y) % 2), v[y][x] = 0.75f;
    assert_int_equal(GDALRasterIO(GDALGetRasterBand(c, 1), GF_Write, 0, 0, 16, 16, board, 16, 16,
                                  GDT_Byte, 0, 0),
                     CE_None);
    assert_int_equal(
        GDALRasterIO(GDALGetRasterBand(f, 1), GF_Write, 0, 0, 16, 16, v, 16, 16, GDT_Float32, 0, 0),
        CE_None);
    GDALClose(c);
    GDALClose(f);

    tw_polygons_params p = params(cls, conf, out, dir);
    p.max_bytes = tw_polygons_memory(16, 16, 256) - 1;
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_polygons_write(&p, NULL, &err), TW_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "the class map has 256 regions"));
    assert_non_null(strstr(err.msg, "give runtime.memory about"));
    assert_non_null(strstr(err.msg, "output.min_area cannot help"));
    assert_null(strstr(err.msg, "set output.min_area"));
    p.min_area = 100 * 100.0; /* 100 cells */
    tw_error_init(&err);
    assert_int_equal(tw_polygons_write(&p, NULL, &err), TW_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "256 regions"));
    assert_false(tw_test_file_exists(out));

    p.max_bytes = tw_polygons_memory(16, 16, 256);
    int64_t n = 0;
    tw_error_init(&err);
    assert_int_equal(tw_polygons_write(&p, &n, &err), TW_OK);
    assert_int_equal(n, 256);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(exact_regions),
        cmocka_unit_test(sieve_and_memory),
        cmocka_unit_test(checkerboard),
        cmocka_unit_test(simplify_shared),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
