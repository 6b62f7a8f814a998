/* test_stac_out.c - STAC items and collections written by io/output/stac_out.c, on
 * files made here with GDAL:
 *   - RFC 3339 date-times: accepted and refused forms, calendar checks;
 *   - a raster's acquisition time from TIFFTAG_DATETIME, and from GDAL's
 *     IMAGERY domain before it; none;
 *   - relative hrefs between folders;
 *   - an item over a GeoTIFF in a UTM CRS and an HDF5-like other file:
 *     the bbox against the four corners reprojected by OSR here (the
 *     footprint's edges are densified, so its extent can only grow where
 *     an edge bends, by < 1e-7 degree for a few km in UTM), file:size and
 *     file:checksum against the file's bytes hashed by nettle here,
 *     raster:bands, proj fields, classification from the colour table,
 *     mlm's z-score with input.scale folded in, an unknown product suffix
 *     still getting an asset;
 *   - the collection's extents over two items; a missing item named;
 *   - class names that collide once made machine-readable ("a b"/"a_b",
 *     "é"/"ü", "nodata") made unique, the names as given in description;
 *   - the model: an asset (mlm) only with an href inside the folder (or a
 *     URL without a secret), else tilewise:model and no mlm;
 *   - items.json: added to as items are written, an input dropped when its
 *     item is removed, rewritten by the collection (which links it). */
#include <math.h>
#include <nettle/sha2.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cpl_conv.h>
#include <gdal.h>
#include <jansson.h>
#include <ogr_srs_api.h>

#include "io/output/stac_out.h"
#include "core/datetime.h"
#include "tests/testutil.h"

static void datetimes(void **state)
{
    (void)state;
    static const char *const good[] = {
        "2021-06-01T10:30:00Z",     "2021-06-01t10:30:00z",      "2020-02-29T23:59:60Z",
        "2021-06-01T10:30:00.125Z", "2021-06-01T10:30:00+02:00", "2000-02-29T00:00:00-11:30",
    };
    static const char *const bad[] = {
        "2021-06-01",
        "2021-06-01T10:30:00",
        "2021-06-01 10:30:00Z",
        "2021-13-01T00:00:00Z",
        "2021-02-29T00:00:00Z",
        "1900-02-29T00:00:00Z",
        "2021-04-31T00:00:00Z",
        "2021-06-01T24:00:00Z",
        "2021-06-01T10:30:00.Z",
        "2021-06-01T10:30:00+2:00",
        "2021-06-01T10:30:00+24:00",
        "21-06-01T10:30:00Z",
        "2021-06-01T10:30:00Zjunk",
    };
    char why[160];
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        if (!tw_rfc3339_check(good[i], why, sizeof why)) fail_msg("%s refused: %s", good[i], why);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why[0] = '\0';
        if (tw_rfc3339_check(bad[i], why, sizeof why)) fail_msg("%s accepted", bad[i]);
        assert_true(why[0] != '\0');
    }
    assert_false(tw_rfc3339_check("2021-02-29T00:00:00Z", why, sizeof why));
    assert_non_null(strstr(why, "day 29"));
}

/* A W x H Byte GeoTIFF in EPSG:32633 at (500000, 4650000), 30 m pixels,
 * with a two-entry colour table on band 1. */
static void make_raster(const char *path, int w, int h, int bands, const char *datetime,
                        bool imagery)
{
    GDALAllRegister();
    GDALDatasetH ds = GDALCreate(GDALGetDriverByName("GTiff"), path, w, h, bands, GDT_Byte, NULL);
    assert_non_null(ds);
    double gt[6] = {500000, 30, 0, 4650000, 0, -30};
    GDALSetGeoTransform(ds, gt);
    OGRSpatialReferenceH srs = OSRNewSpatialReference(NULL);
    OSRImportFromEPSG(srs, 32633);
    char *wkt = NULL;
    OSRExportToWkt(srs, &wkt);
    GDALSetProjection(ds, wkt);
    CPLFree(wkt);
    OSRDestroySpatialReference(srs);
    GDALRasterBandH b = GDALGetRasterBand(ds, 1);
    GDALSetRasterNoDataValue(b, 255);
    GDALSetDescription(b, "class");
    GDALColorTableH ct = GDALCreateColorTable(GPI_RGB);
    GDALColorEntry e[2] = {{0, 114, 189, 255}, {34, 139, 34, 255}};
    GDALSetColorEntry(ct, 0, &e[0]);
    GDALSetColorEntry(ct, 1, &e[1]);
    GDALSetRasterColorTable(b, ct);
    GDALDestroyColorTable(ct);
    if (datetime) GDALSetMetadataItem(ds, "TIFFTAG_DATETIME", datetime, NULL);
    if (imagery) GDALSetMetadataItem(ds, "ACQUISITIONDATETIME", "2019-03-04T05:06:07Z", "IMAGERY");
    unsigned char *px = calloc((size_t)w * h, 1);
    for (int i = 0; i < w * h; i++) px[i] = (unsigned char)(i % 2);
    for (int k = 1; k <= bands; k++)
        assert_int_equal(
            GDALRasterIO(GDALGetRasterBand(ds, k), GF_Write, 0, 0, w, h, px, w, h, GDT_Byte, 0, 0),
            CE_None);
    free(px);
    GDALClose(ds);
}

static void raster_datetimes(void **state)
{
    (void)state;
    char dir[512], a[600], b[600], c[600], out[64], src[64];
    snprintf(dir, sizeof dir, "%s/stac_dt", tw_test_tmpdir());
    mkdir(dir, 0755);
    snprintf(a, sizeof a, "%s/a.tif", dir);
    snprintf(b, sizeof b, "%s/b.tif", dir);
    snprintf(c, sizeof c, "%s/c.tif", dir);
    make_raster(a, 4, 4, 1, "2021:06:01 10:30:00", false);
    make_raster(b, 4, 4, 1, "2021:06:01 10:30:00", true);
    make_raster(c, 4, 4, 1, NULL, false);
    assert_true(tw_stac_raster_datetime(a, out, sizeof out, src, sizeof src));
    assert_string_equal(out, "2021-06-01T10:30:00Z");
    assert_string_equal(src, "TIFFTAG_DATETIME");
    assert_true(tw_stac_raster_datetime(b, out, sizeof out, src, sizeof src));
    assert_string_equal(out, "2019-03-04T05:06:07Z");
    assert_string_equal(src, "IMAGERY:ACQUISITIONDATETIME");
    assert_false(tw_stac_raster_datetime(c, out, sizeof out, src, sizeof src));
    assert_false(tw_stac_raster_datetime("/nonexistent.tif", out, sizeof out, src, sizeof src));
}

static void relative_hrefs(void **state)
{
    (void)state;
    char base[512], d1[600], d2[600], f[700], out[1200];
    snprintf(base, sizeof base, "%s/stac_rel", tw_test_tmpdir());
    snprintf(d1, sizeof d1, "%s/out/run", base);
    snprintf(d2, sizeof d2, "%s/models", base);
    mkdir(base, 0755);
    snprintf(f, sizeof f, "%s/out", base);
    mkdir(f, 0755);
    mkdir(d1, 0755);
    mkdir(d2, 0755);
    snprintf(f, sizeof f, "%s/m.h5", d2);
    FILE *fp = fopen(f, "w");
    fclose(fp);
    tw_stac_relative_href(d1, f, out, sizeof out);
    assert_string_equal(out, "../../models/m.h5");
    snprintf(f, sizeof f, "%s/x.json", d1);
    fp = fopen(f, "w");
    fclose(fp);
    tw_stac_relative_href(d1, f, out, sizeof out);
    assert_string_equal(out, "./x.json");
    tw_stac_relative_href(d1, "https://h/x.json", out, sizeof out);
    assert_string_equal(out, "https://h/x.json");
    tw_stac_relative_href(d1, "/nonexistent/y", out, sizeof out);
    assert_string_equal(out, "/nonexistent/y");
}

static void sha_hex(const char *path, char hex[65], long *size)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    struct sha256_ctx c;
    sha256_init(&c);
    unsigned char buf[4096];
    size_t n;
    *size = 0;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        sha256_update(&c, n, buf);
        *size += (long)n;
    }
    fclose(f);
    unsigned char d[32];
    sha256_digest(&c, 32, d);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
}

static json_t *load(const char *path)
{
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) fail_msg("%s: %s", path, je.text);
    return j;
}

static void item_and_collection(void **state)
{
    (void)state;
    char dir[512], cls[600], odd[600];
    snprintf(dir, sizeof dir, "%s/stac_item", tw_test_tmpdir());
    mkdir(dir, 0755);
    snprintf(cls, sizeof cls, "%s/s.class.tif", dir);
    snprintf(odd, sizeof odd, "%s/s.extra.bin", dir);
    const int W = 200, H = 150;
    make_raster(cls, W, H, 1, NULL, false);
    FILE *f = fopen(odd, "wb");
    fputs("not a raster", f);
    fclose(f);

    double gt[6] = {500000, 30, 0, 4650000, 0, -30};
    OGRSpatialReferenceH srs = OSRNewSpatialReference(NULL);
    OSRImportFromEPSG(srs, 32633);
    char *wkt = NULL;
    OSRExportToWkt(srs, &wkt);
    const char *files[2] = {cls, odd};
    const char classes[2][TW_NAME_MAX] = {"open water", "forest"};
    const float mean[2] = {10, 20}, stdv[2] = {2, 4};
    tw_stac_model m = {.name = "m",
                       .arch = "resnet50",
                       .weights_href = "./s.extra.bin",
                       .weights_sha256 = "00",
                       .weights_size = -1,
                       .in_bands = 2,
                       .tile = 64,
                       .scale = 0.5,
                       .mean = mean,
                       .std = stdv,
                       .n_classes = 2,
                       .classes = classes};
    tw_stac_item_params ip = {.dir = dir,
                              .id = "s",
                              .datetime = "2021-06-01T10:30:00Z",
                              .width = W,
                              .height = H,
                              .geotransform = gt,
                              .crs_wkt = wkt,
                              .files = files,
                              .n_files = 2,
                              .model = &m,
                              .derived_from = "../in/item.json"};
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_stac_item_write(&ip, &err), TW_OK);
    char path[700];
    assert_true(tw_stac_item_path(dir, "s", path, sizeof path));
    json_t *it = load(path);

    /* bbox: the corners through OSR, here */
    OGRSpatialReferenceH wgs = OSRNewSpatialReference(NULL);
    OSRImportFromEPSG(wgs, 4326);
    OSRSetAxisMappingStrategy(wgs, OAMS_TRADITIONAL_GIS_ORDER);
    OSRSetAxisMappingStrategy(srs, OAMS_TRADITIONAL_GIS_ORDER);
    OGRCoordinateTransformationH ct = OCTNewCoordinateTransformation(srs, wgs);
    double x[4] = {gt[0], gt[0] + W * gt[1], gt[0], gt[0] + W * gt[1]};
    double y[4] = {gt[3], gt[3], gt[3] + H * gt[5], gt[3] + H * gt[5]};
    assert_true(OCTTransform(ct, 4, x, y, NULL));
    double want[4] = {
        fmin(fmin(x[0], x[1]), fmin(x[2], x[3])), fmin(fmin(y[0], y[1]), fmin(y[2], y[3])),
        fmax(fmax(x[0], x[1]), fmax(x[2], x[3])), fmax(fmax(y[0], y[1]), fmax(y[2], y[3]))};
    json_t *bbox = json_object_get(it, "bbox");
    for (int i = 0; i < 4; i++)
        assert_true(fabs(json_real_value(json_array_get(bbox, (size_t)i)) - want[i]) < 1e-7);
    json_t *ring =
        json_array_get(json_object_get(json_object_get(it, "geometry"), "coordinates"), 0);
    assert_int_equal(json_array_size(ring), 4 * 32 + 1);
    OCTDestroyCoordinateTransformation(ct);
    OSRDestroySpatialReference(wgs);
    OSRDestroySpatialReference(srs);
    CPLFree(wkt);

    json_t *props = json_object_get(it, "properties");
    assert_string_equal(json_string_value(json_object_get(props, "datetime")),
                        "2021-06-01T10:30:00Z");
    assert_int_equal(json_integer_value(json_object_get(props, "proj:epsg")), 32633);
    /* the item's grid is the class map's */
    json_t *shape = json_object_get(props, "proj:shape");
    assert_int_equal(json_integer_value(json_array_get(shape, 0)), H);
    assert_int_equal(json_integer_value(json_array_get(shape, 1)), W);
    json_t *tr = json_object_get(props, "proj:transform");
    const double want_tr[6] = {30, 0, 500000, 0, -30, 4650000};
    for (int i = 0; i < 6; i++)
        assert_true(json_number_value(json_array_get(tr, (size_t)i)) == want_tr[i]);
    /* mlm: (v * 0.5 - mean) / std = (v - 2 mean) / (2 std) */
    json_t *vs =
        json_object_get(json_array_get(json_object_get(props, "mlm:input"), 0), "value_scaling");
    assert_true(json_number_value(json_object_get(json_array_get(vs, 1), "mean")) == 40.0);
    assert_true(json_number_value(json_object_get(json_array_get(vs, 1), "stddev")) == 8.0);
    assert_string_equal(json_string_value(json_object_get(props, "mlm:architecture")), "ResNet-50");

    json_t *assets = json_object_get(it, "assets");
    json_t *a = json_object_get(assets, "class");
    assert_non_null(a);
    assert_string_equal(json_string_value(json_object_get(a, "href")), "./s.class.tif");
    char hex[65], want_sum[80];
    long size;
    sha_hex(cls, hex, &size);
    snprintf(want_sum, sizeof want_sum, "1220%s", hex);
    assert_string_equal(json_string_value(json_object_get(a, "file:checksum")), want_sum);
    assert_int_equal(json_integer_value(json_object_get(a, "file:size")), size);
    json_t *band = json_array_get(json_object_get(a, "raster:bands"), 0);
    assert_string_equal(json_string_value(json_object_get(band, "data_type")), "uint8");
    assert_int_equal(json_integer_value(json_object_get(band, "nodata")), 255);
    json_t *cl = json_object_get(a, "classification:classes");
    assert_int_equal(json_array_size(cl), 3); /* two classes and nodata */
    assert_string_equal(json_string_value(json_object_get(json_array_get(cl, 0), "name")),
                        "open_water");
    assert_string_equal(json_string_value(json_object_get(json_array_get(cl, 0), "title")),
                        "open water");
    assert_string_equal(json_string_value(json_object_get(json_array_get(cl, 0), "color_hint")),
                        "0072BD");
    assert_string_equal(json_string_value(json_object_get(json_array_get(cl, 1), "color_hint")),
                        "228B22");
    assert_true(json_is_true(json_object_get(json_array_get(cl, 2), "nodata")));
    /* a product the table does not know: an asset of its own, no raster fields */
    json_t *x2 = json_object_get(assets, "extra");
    assert_non_null(x2);
    assert_string_equal(json_string_value(json_object_get(x2, "type")), "application/octet-stream");
    assert_null(json_object_get(x2, "raster:bands"));
    sha_hex(odd, hex, &size);
    assert_int_equal(json_integer_value(json_object_get(x2, "file:size")), size);
    json_t *link = json_array_get(json_object_get(it, "links"), 0);
    assert_string_equal(json_string_value(json_object_get(link, "rel")), "derived_from");
    json_decref(it);

    /* the collection: a second item elsewhere in time and space */
    double gt2[6] = {510000, 30, 0, 4640000, 0, -30};
    ip.id = "t";
    ip.geotransform = gt2;
    ip.datetime = "2020-01-02T03:04:05Z";
    ip.files = files;
    ip.n_files = 1;
    ip.derived_from = NULL;
    srs = OSRNewSpatialReference(NULL);
    OSRImportFromEPSG(srs, 32633);
    OSRExportToWkt(srs, &wkt);
    ip.crs_wkt = wkt;
    assert_int_equal(tw_stac_item_write(&ip, &err), TW_OK);
    const char *ids[2] = {"s", "t"};
    assert_int_equal(tw_stac_collection_write(dir, "c", "two", ids, 2, &err), TW_OK);
    char cpath[700];
    snprintf(cpath, sizeof cpath, "%s/collection.json", dir);
    json_t *c = load(cpath);
    json_t *ext = json_object_get(c, "extent");
    json_t *iv = json_array_get(json_object_get(json_object_get(ext, "temporal"), "interval"), 0);
    assert_string_equal(json_string_value(json_array_get(iv, 0)), "2020-01-02T03:04:05Z");
    assert_string_equal(json_string_value(json_array_get(iv, 1)), "2021-06-01T10:30:00Z");
    json_t *cb = json_array_get(json_object_get(json_object_get(ext, "spatial"), "bbox"), 0);
    json_t *s_item = load(path);
    assert_true(json_number_value(json_array_get(cb, 3)) ==
                json_number_value(json_array_get(json_object_get(s_item, "bbox"), 3)));
    json_decref(s_item);
    json_decref(c);
    CPLFree(wkt);
    OSRDestroySpatialReference(srs);

    /* a missing item is named; removing items and the collection */
    const char *missing[1] = {"nope"};
    assert_int_equal(tw_stac_collection_write(dir, "c", "x", missing, 1, &err), TW_ERR_OUTPUT);
    assert_non_null(strstr(err.msg, "nope.stac.json"));
    tw_error_init(&err);
    assert_int_equal(tw_stac_item_remove(dir, "s", true, &err), TW_OK);
    assert_false(tw_test_file_exists(path));
    assert_false(tw_test_file_exists(cpath));
    assert_int_equal(tw_stac_item_remove(dir, "s", true, &err), TW_OK); /* gone: fine */
}

static const char *class_field(json_t *cl, size_t i, const char *key)
{
    return json_string_value(json_object_get(json_array_get(cl, i), key));
}

static void class_names_and_model(void **state)
{
    (void)state;
    char dir[512], cls[600], models[600], inner[700], outer[600];
    snprintf(dir, sizeof dir, "%s/stac_names", tw_test_tmpdir());
    mkdir(dir, 0755);
    snprintf(cls, sizeof cls, "%s/n.class.tif", dir);
    snprintf(models, sizeof models, "%s/models", dir);
    mkdir(models, 0755);
    snprintf(inner, sizeof inner, "%s/m.h5", models);
    snprintf(outer, sizeof outer, "%s/stac_names_outside.h5", tw_test_tmpdir());
    make_raster(cls, 20, 10, 1, NULL, false);
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(i ? outer : inner, "wb");
        fputs("weights", f);
        fclose(f);
    }

    /* the model's href: inside the folder, a URL; none for a file outside */
    char href[700];
    assert_true(tw_stac_model_href(dir, inner, href, sizeof href));
    assert_string_equal(href, "./models/m.h5");
    assert_false(tw_stac_model_href(dir, outer, href, sizeof href));
    assert_string_equal(href, "");
    assert_true(tw_stac_model_href(dir, "https://example.com/m.h5", href, sizeof href));
    assert_string_equal(href, "https://example.com/m.h5");
    assert_false(
        tw_stac_model_href(dir, "https://example.com/m.h5?X-Amz-Signature=abc", href, sizeof href));
    assert_false(tw_stac_model_href(dir, "/vsis3/b/m.h5", href, sizeof href));

    double gt[6] = {500000, 30, 0, 4650000, 0, -30};
    const char *files[1] = {cls};
    const char classes[7][TW_NAME_MAX] = {"a b",    "a_b",   "\xc3\xa9", "\xc3\xbc",
                                          "nodata", "water", "a b"};
    const float mean[1] = {0}, stdv[1] = {1};
    tw_stac_model m = {.name = "m",
                       .arch = "resnet18",
                       .weights_href = "",
                       .weights_sha256 = "ab",
                       .weights_size = 7,
                       .in_bands = 1,
                       .tile = 64,
                       .scale = 1,
                       .mean = mean,
                       .std = stdv,
                       .n_classes = 7,
                       .classes = classes};
    tw_stac_item_params ip = {.dir = dir,
                              .id = "n",
                              .datetime = "2021-06-01T10:30:00Z",
                              .width = 20,
                              .height = 10,
                              .geotransform = gt,
                              .crs_wkt = "EPSG:32633",
                              .files = files,
                              .n_files = 1,
                              .model = &m};
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_stac_item_write(&ip, &err), TW_OK);
    char path[700];
    tw_stac_item_path(dir, "n", path, sizeof path);
    json_t *it = load(path);
    json_t *cl = json_object_get(json_object_get(json_object_get(it, "assets"), "class"),
                                 "classification:classes");
    static const char *const want[8] = {"a_b",      "a_b_1", "class_2", "class_3",
                                        "nodata_4", "water", "a_b_6",   "nodata"};
    for (size_t i = 0; i < 8; i++) assert_string_equal(class_field(cl, i, "name"), want[i]);
    for (size_t i = 0; i < 7; i++) {
        assert_string_equal(class_field(cl, i, "description"), classes[i]);
        assert_string_equal(class_field(cl, i, "title"), classes[i]);
    }
    assert_non_null(class_field(cl, 7, "description")); /* v1.1.0 requires it */
    /* weights outside the folder: no model asset, no mlm; name and SHA-256 */
    json_t *props = json_object_get(it, "properties");
    assert_null(json_object_get(json_object_get(it, "assets"), "model"));
    assert_null(json_object_get(props, "mlm:name"));
    json_t *ext = json_object_get(it, "stac_extensions");
    for (size_t i = 0; i < json_array_size(ext); i++)
        assert_null(strstr(json_string_value(json_array_get(ext, i)), "/mlm/"));
    json_t *tm = json_object_get(props, "tilewise:model");
    assert_string_equal(json_string_value(json_object_get(tm, "sha256")), "ab");
    assert_string_equal(json_string_value(json_object_get(tm, "architecture")), "ResNet-18");
    assert_int_equal(json_integer_value(json_object_get(tm, "size")), 7);
    json_decref(it);

    /* inside: the model asset with its relative href, and mlm */
    m.weights_href = "./models/m.h5";
    assert_int_equal(tw_stac_item_write(&ip, &err), TW_OK);
    it = load(path);
    json_t *ma = json_object_get(json_object_get(it, "assets"), "model");
    assert_string_equal(json_string_value(json_object_get(ma, "href")), "./models/m.h5");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(it, "properties"), "mlm:name")), "m");
    json_t *tasks = json_object_get(json_object_get(it, "properties"), "mlm:tasks");
    assert_string_equal(json_string_value(json_array_get(tasks, 0)), "classification");
    json_decref(it);

    /* a segmentation model: its task, and a probability per class and pixel */
    m.segmentation = true;
    m.arch = "unet_resnet34";
    assert_int_equal(tw_stac_item_write(&ip, &err), TW_OK);
    it = load(path);
    props = json_object_get(it, "properties");
    tasks = json_object_get(props, "mlm:tasks");
    assert_int_equal(json_array_size(tasks), 1);
    assert_string_equal(json_string_value(json_array_get(tasks, 0)), "semantic-segmentation");
    assert_string_equal(json_string_value(json_object_get(props, "mlm:architecture")),
                        "U-Net (ResNet-34 encoder)");
    json_t *res =
        json_object_get(json_array_get(json_object_get(props, "mlm:output"), 0), "result");
    json_t *shape = json_object_get(res, "shape");
    assert_int_equal(json_array_size(shape), 4);
    assert_int_equal(json_integer_value(json_array_get(shape, 1)), 7);
    assert_int_equal(json_integer_value(json_array_get(shape, 3)), 64);
    assert_string_equal(json_string_value(json_array_get(json_object_get(res, "dim_order"), 3)),
                        "width");
    json_decref(it);
}

/* items.json's feature ids, joined by ',' ("" when there is no file) */
static void item_ids(const char *dir, char *out, size_t size)
{
    char path[700];
    snprintf(path, sizeof path, "%s/items.json", dir);
    out[0] = '\0';
    json_t *fc = json_load_file(path, 0, NULL);
    if (!fc) return;
    assert_string_equal(json_string_value(json_object_get(fc, "type")), "FeatureCollection");
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(fc, "features"), i, f)
    {
        size_t n = strlen(out);
        snprintf(out + n, size - n, "%s%s", n ? "," : "",
                 json_string_value(json_object_get(f, "id")));
    }
    json_decref(fc);
}

static void items_file(void **state)
{
    (void)state;
    char dir[512], a[600], b[600], ids[256];
    snprintf(dir, sizeof dir, "%s/stac_items", tw_test_tmpdir());
    mkdir(dir, 0755);
    snprintf(a, sizeof a, "%s/a.class.tif", dir);
    snprintf(b, sizeof b, "%s/b.class.tif", dir);
    make_raster(a, 20, 10, 1, NULL, false);
    make_raster(b, 20, 10, 1, NULL, false);
    double gt[6] = {500000, 30, 0, 4650000, 0, -30};
    const char *fa[1] = {a}, *fb[1] = {b};
    tw_stac_item_params ip = {.dir = dir,
                              .id = "a",
                              .datetime = "2021-06-01T10:30:00Z",
                              .width = 20,
                              .height = 10,
                              .geotransform = gt,
                              .crs_wkt = "EPSG:32633",
                              .files = fa,
                              .n_files = 1};
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_stac_item_write(&ip, &err), TW_OK);
    assert_int_equal(tw_stac_items_add(dir, "a", &err), TW_OK);
    item_ids(dir, ids, sizeof ids);
    assert_string_equal(ids, "a");
    ip.id = "b";
    ip.files = fb;
    assert_int_equal(tw_stac_item_write(&ip, &err), TW_OK);
    assert_int_equal(tw_stac_items_add(dir, "b", &err), TW_OK);
    assert_int_equal(tw_stac_items_add(dir, "a", &err), TW_OK); /* again: replaced in place */
    item_ids(dir, ids, sizeof ids);
    assert_string_equal(ids, "a,b");
    /* GDAL's STACIT: the features' grid (proj:epsg, proj:transform, proj:shape) */
    char fpath[700];
    snprintf(fpath, sizeof fpath, "%s/items.json", dir);
    json_t *fc = load(fpath);
    json_t *p0 = json_object_get(json_array_get(json_object_get(fc, "features"), 0), "properties");
    assert_int_equal(json_integer_value(json_object_get(p0, "proj:epsg")), 32633);
    assert_int_equal(json_array_size(json_object_get(p0, "proj:transform")), 6);
    assert_int_equal(json_array_size(json_object_get(p0, "proj:shape")), 2);
    json_decref(fc);
    /* a's products about to be replaced: its feature goes with its item */
    assert_int_equal(tw_stac_item_remove(dir, "a", false, &err), TW_OK);
    item_ids(dir, ids, sizeof ids);
    assert_string_equal(ids, "b");
    assert_int_equal(tw_stac_item_remove(dir, "b", false, &err), TW_OK);
    assert_false(tw_test_file_exists(fpath)); /* none left: no file */
    /* the collection rewrites it with exactly its items, and links it */
    ip.id = "a";
    ip.files = fa;
    assert_int_equal(tw_stac_item_write(&ip, &err), TW_OK);
    ip.id = "b";
    ip.files = fb;
    assert_int_equal(tw_stac_item_write(&ip, &err), TW_OK);
    const char *both[2] = {"b", "a"};
    assert_int_equal(tw_stac_collection_write(dir, "c", "two", both, 2, &err), TW_OK);
    item_ids(dir, ids, sizeof ids);
    assert_string_equal(ids, "b,a");
    char cpath[700];
    snprintf(cpath, sizeof cpath, "%s/collection.json", dir);
    json_t *c = load(cpath);
    bool linked = false;
    size_t i;
    json_t *l;
    json_array_foreach(json_object_get(c, "links"), i, l) linked =
        linked || (strcmp(json_string_value(json_object_get(l, "rel")), "items") == 0 &&
                   strcmp(json_string_value(json_object_get(l, "href")), "./items.json") == 0);
    assert_true(linked);
    json_decref(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(datetimes),
        cmocka_unit_test(raster_datetimes),
        cmocka_unit_test(relative_hrefs),
        cmocka_unit_test(item_and_collection),
        cmocka_unit_test(class_names_and_model),
        cmocka_unit_test(items_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
