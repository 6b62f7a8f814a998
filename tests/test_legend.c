/* test_legend.c - where a class map's legend lives (io/output/legend.c), on files
 * made here with GDAL: the four cases tw_legend_note tells apart (names in
 * the .aux.xml sidecar, names inside the file, the sidecar lost with the
 * names left in TILEWISE_RUN, colours only), what is not a class map, and
 * TILEWISE_RUN's class names as report.c escapes them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <gdal.h>

#include "io/output/legend.h"
#include "tests/testutil.h"

/* A 4 x 4 Byte raster at path (driver GTiff): bands, and for one band a
 * colour table when colours, category names when names, TILEWISE_RUN when
 * run is not NULL. */
static void make(const char *path, int bands, bool colours, const char *const *names,
                 const char *run)
{
    GDALDriverH drv = GDALGetDriverByName("GTiff");
    GDALDatasetH ds = GDALCreate(drv, path, 4, 4, bands, GDT_Byte, NULL);
    assert_non_null(ds);
    GDALRasterBandH b = GDALGetRasterBand(ds, 1);
    if (colours) {
        GDALColorTableH ct = GDALCreateColorTable(GPI_RGB);
        GDALColorEntry e[2] = {{0, 114, 189, 255}, {34, 139, 34, 255}};
        GDALSetColorEntry(ct, 0, &e[0]);
        GDALSetColorEntry(ct, 1, &e[1]);
        assert_int_equal(GDALSetRasterColorTable(b, ct), CE_None);
        GDALDestroyColorTable(ct);
    }
    if (names) assert_int_equal(GDALSetRasterCategoryNames(b, (char **)names), CE_None);
    if (run) assert_int_equal(GDALSetMetadataItem(ds, "TILEWISE_RUN", run, NULL), CE_None);
    GDALClose(ds);
}

static const char *path_in(const char *name)
{
    static char buf[4][600];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tw_test_tmpdir(), name);
    return buf[k];
}

static const char *const NAMES[] = {"water", "forest", NULL};
static const char *RUN = "{\"model\":{\"arch\":\"resnet18\",\"classes\":[\"water\",\"forest\"]},"
                         "\"tiling\":{\"tile\":64}}";

static void test_sidecar(void **state)
{
    (void)state;
    const char *p = path_in("scene.class.tif");
    make(p, 1, true, NAMES, RUN);
    char side[700];
    snprintf(side, sizeof side, "%s.aux.xml", p);
    assert_true(tw_test_file_exists(side)); /* GDAL 3.6 keeps the names there */
    char buf[512];
    assert_true(tw_legend_note(p, buf, sizeof buf));
    assert_non_null(
        strstr(buf, "class names from scene.class.tif.aux.xml: keep it next to the .tif"));
    assert_non_null(strstr(buf, "TILEWISE_RUN (class names too)"));

    /* moved alone: the sidecar is gone, the names are read from TILEWISE_RUN */
    assert_int_equal(unlink(side), 0);
    assert_true(tw_legend_note(p, buf, sizeof buf));
    assert_non_null(strstr(buf, "scene.class.tif.aux.xml did not come along"));
    assert_non_null(strstr(buf, "TILEWISE_RUN metadata inside the file: water, forest"));
}

static void test_colours_only(void **state)
{
    (void)state;
    const char *p = path_in("plain.tif");
    make(p, 1, true, NULL, NULL);
    char buf[256];
    assert_true(tw_legend_note(p, buf, sizeof buf));
    assert_string_equal(buf, "colour table only, no class names");
    /* a TILEWISE_RUN without classes says nothing more */
    p = path_in("noclasses.tif");
    make(p, 1, true, NULL, "{\"tiling\":{\"tile\":64}}");
    assert_true(tw_legend_note(p, buf, sizeof buf));
    assert_string_equal(buf, "colour table only, no class names");
}

/* A format that keeps category names in the file itself (a VRT's XML). */
static void test_names_inside(void **state)
{
    (void)state;
    const char *tif = path_in("src.tif"), *vrt = path_in("inside.vrt");
    make(tif, 1, true, NULL, NULL);
    GDALDatasetH src = GDALOpen(tif, GA_ReadOnly);
    GDALDatasetH ds = GDALCreateCopy(GDALGetDriverByName("VRT"), vrt, src, FALSE, NULL, NULL, NULL);
    assert_non_null(ds);
    GDALSetRasterCategoryNames(GDALGetRasterBand(ds, 1), (char **)NAMES);
    GDALClose(ds);
    GDALClose(src);
    char side[700];
    snprintf(side, sizeof side, "%s.aux.xml", vrt);
    assert_false(tw_test_file_exists(side));
    char buf[256];
    assert_true(tw_legend_note(vrt, buf, sizeof buf));
    assert_string_equal(buf, "class names and colours inside the file");
}

/* Not a class map, or no file: false and buf untouched. */
static void test_not_a_class_map(void **state)
{
    (void)state;
    const char *tif3 = path_in("prob.tif"), *multi = path_in("prob3.vrt"),
               *grey = path_in("grey.tif");
    make(tif3, 3, false, NULL, RUN);
    /* three bands, a colour table on the first (a VRT holds one anywhere) */
    GDALDatasetH src = GDALOpen(tif3, GA_ReadOnly);
    GDALDatasetH ds =
        GDALCreateCopy(GDALGetDriverByName("VRT"), multi, src, FALSE, NULL, NULL, NULL);
    assert_non_null(ds);
    GDALColorTableH ct = GDALCreateColorTable(GPI_RGB);
    GDALColorEntry e = {0, 114, 189, 255};
    GDALSetColorEntry(ct, 0, &e);
    assert_int_equal(GDALSetRasterColorTable(GDALGetRasterBand(ds, 1), ct), CE_None);
    GDALDestroyColorTable(ct);
    GDALClose(ds);
    GDALClose(src);
    make(grey, 1, false, NAMES, RUN);
    const char *paths[] = {multi, grey, "/nonexistent/x.class.tif", tw_test_tmpdir()};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        char buf[64];
        memset(buf, 'Z', sizeof buf);
        if (tw_legend_note(paths[i], buf, sizeof buf))
            fail_msg("%s: taken for a class map", paths[i]);
        for (size_t k = 0; k < sizeof buf; k++) assert_int_equal(buf[k], 'Z');
    }
}

/* TILEWISE_RUN's names as report.c writes them (\" and \\ escaped): shown
 * unescaped; very many long names are cut, never overflow; a short buffer
 * gets a cut, terminated line. */
static void test_run_names(void **state)
{
    (void)state;
    const char *p = path_in("escaped.class.tif");
    make(p, 1, true, NULL,
         "{\"model\":{\"classes\":[\"open \\\"water\\\"\",\"back\\\\slash\",\"c\"]}}");
    char buf[512];
    assert_true(tw_legend_note(p, buf, sizeof buf));
    assert_non_null(strstr(buf, ": open \"water\", back\\slash, c"));

    size_t n = 40000;
    char *run = malloc(n);
    assert_non_null(run);
    size_t used = (size_t)snprintf(run, n, "{\"classes\":[");
    for (int c = 0; c < 255; c++)
        used += (size_t)snprintf(run + used, n - used, "%s\"class_%03d_%s\"", c ? "," : "", c,
                                 "with_a_long_name_of_some_fifty_characters_xxxxx");
    snprintf(run + used, n - used, "]}");
    p = path_in("many.class.tif");
    make(p, 1, true, NULL, run);
    free(run);
    char big[4096];
    assert_true(tw_legend_note(p, big, sizeof big));
    assert_non_null(strstr(big, "TILEWISE_RUN metadata inside the file: class_000_with"));
    assert_true(strlen(big) < sizeof big);
    char small[24];
    assert_true(tw_legend_note(p, small, sizeof small));
    assert_int_equal(strlen(small), sizeof small - 1);
}

int main(void)
{
    GDALAllRegister();
    CPLSetErrorHandler(CPLQuietErrorHandler);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sidecar),      cmocka_unit_test(test_colours_only),
        cmocka_unit_test(test_names_inside), cmocka_unit_test(test_not_a_class_map),
        cmocka_unit_test(test_run_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
