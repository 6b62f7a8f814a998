/* test_writer.c - output rasters: written by io/output/writer.c, read back with the
 * GDAL C API and compared with values computed here from the inputs. */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include <cpl_conv.h>
#include <cpl_string.h>
#include <gdal.h>
#include <ogr_srs_api.h>

#include "io/output/writer.h"
#include "core/alloc.h"
#include "tests/testutil.h"

#define K 3
#define GW 5
#define GH 7

static const char k_names[4][TW_NAME_MAX] = {"water", "forest", "urban", "bare"};
static const double k_gt[6] = {500000.0, 60.0, 0.0, 4200000.0, 0.0, -60.0};

/* ---- helpers ---- */

static char *utm18n_wkt(void)
{
    OGRSpatialReferenceH srs = OSRNewSpatialReference(NULL);
    assert_non_null(srs);
    assert_int_equal(OSRImportFromEPSG(srs, 32618), OGRERR_NONE);
    char *wkt = NULL;
    assert_int_equal(OSRExportToWkt(srs, &wkt), OGRERR_NONE);
    OSRDestroySpatialReference(srs);
    return wkt; /* CPLFree */
}

/* Deterministic probabilities for a w x h grid of k classes, with some
 * nodata cells and some exact ties (argmax must pick the lowest index). */
static void make_probs(int w, int h, int k, float *probs, uint8_t *has)
{
    for (int i = 0; i < w * h; i++) {
        has[i] = (i % 6 != 4);
        float *p = probs + (size_t)i * k;
        double sum = 0;
        for (int j = 0; j < k; j++) sum += (p[j] = (float)(1 + (i * 7 + j * 3) % 5));
        for (int j = 0; j < k; j++) p[j] = (float)(p[j] / sum);
    }
    if (k == 3 && w * h > 8) {
        const float ties[3][3] = {{0.4f, 0.4f, 0.2f}, {0.2f, 0.4f, 0.4f}, {0.3f, 0.3f, 0.3f}};
        for (int t = 0; t < 3; t++) {
            memcpy(probs + (size_t)(t + 1) * k, ties[t], sizeof ties[t]);
            has[t + 1] = 1;
        }
    }
}

static int ref_argmax(const float *p, int k)
{
    int best = 0;
    for (int j = 1; j < k; j++)
        if (p[j] > p[best]) best = j;
    return best;
}

static tw_writer_params base_params(const char *dir, const char *wkt)
{
    tw_writer_params p;
    memset(&p, 0, sizeof p);
    p.dir = dir;
    p.stem = "scene";
    p.grid_w = GW;
    p.grid_h = GH;
    memcpy(p.geotransform, k_gt, sizeof k_gt);
    p.crs_wkt = wkt;
    p.n_classes = K;
    p.class_names = k_names;
    p.products = TW_PRODUCT_CLASS | TW_PRODUCT_PROB | TW_PRODUCT_CONF;
    p.prob_type = TW_PROB_FLOAT32;
    p.format = TW_FORMAT_GTIFF;
    p.metadata_json = "{\"tile\": 64}";
    return p;
}

/* Names in dir (sorted, joined by ' '), into buf. Returns the count. */
static int list_dir(const char *dir, char *buf, size_t size)
{
    struct dirent **list = NULL;
    int n = scandir(dir, &list, NULL, alphasort);
    int count = 0;
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (strcmp(list[i]->d_name, ".") && strcmp(list[i]->d_name, "..")) {
            strncat(buf, list[i]->d_name, size - strlen(buf) - 1);
            strncat(buf, " ", size - strlen(buf) - 1);
            count++;
        }
        free(list[i]);
    }
    free(list);
    return count;
}

static void remove_dir(const char *dir)
{
    struct dirent **list = NULL;
    int n = scandir(dir, &list, NULL, alphasort);
    for (int i = 0; i < n; i++) {
        if (strcmp(list[i]->d_name, ".") && strcmp(list[i]->d_name, ".."))
            unlink(tw_test_path(dir, list[i]->d_name));
        free(list[i]);
    }
    free(list);
    rmdir(dir);
}

/* Population statistics of the valid values, as GDAL defines them. */
typedef struct {
    double min, max, mean, sd;
} ref_stats;

static ref_stats stats_of(const double *v, int n)
{
    ref_stats s = {INFINITY, -INFINITY, 0, 0};
    for (int i = 0; i < n; i++) {
        s.min = fmin(s.min, v[i]);
        s.max = fmax(s.max, v[i]);
        s.mean += v[i];
    }
    s.mean /= n;
    for (int i = 0; i < n; i++) s.sd += (v[i] - s.mean) * (v[i] - s.mean);
    s.sd = sqrt(s.sd / n);
    return s;
}

static void assert_stats(GDALRasterBandH band, ref_stats r)
{
    double mn, mx, mean, sd;
    /* bForce = FALSE: only succeeds if the file carries the statistics. */
    assert_int_equal(GDALGetRasterStatistics(band, FALSE, FALSE, &mn, &mx, &mean, &sd), CE_None);
    assert_true(fabs(mn - r.min) < 1e-6);
    assert_true(fabs(mx - r.max) < 1e-6);
    assert_true(fabs(mean - r.mean) < 1e-6);
    assert_true(fabs(sd - r.sd) < 1e-6);
}

static void write_strips(tw_writer *w, const float *probs, const uint8_t *has, int gw,
                         const int *strips, int n_strips, int k)
{
    tw_error err;
    tw_error_init(&err);
    int row = 0;
    for (int s = 0; s < n_strips; s++) {
        tw_status st = tw_writer_write_rows(w, row, strips[s], probs + (size_t)row * gw * k,
                                            has + (size_t)row * gw, &err);
        if (st != TW_OK) fail_msg("write_rows: %s", err.msg);
        row += strips[s];
    }
}

static void read_band_f32(GDALDatasetH ds, int b, float *out, int w, int h)
{
    assert_int_equal(
        GDALRasterIO(GDALGetRasterBand(ds, b), GF_Read, 0, 0, w, h, out, w, h, GDT_Float32, 0, 0),
        CE_None);
}

static void read_band_u8(GDALRasterBandH band, uint8_t *out, int w, int h)
{
    assert_int_equal(GDALRasterIO(band, GF_Read, 0, 0, w, h, out, w, h, GDT_Byte, 0, 0), CE_None);
}

static void assert_georef(GDALDatasetH ds, const char *wkt)
{
    double gt[6];
    assert_int_equal(GDALGetGeoTransform(ds, gt), CE_None);
    for (int i = 0; i < 6; i++) assert_true(gt[i] == k_gt[i]);
    OGRSpatialReferenceH a = OSRNewSpatialReference(wkt);
    OGRSpatialReferenceH b = OSRNewSpatialReference(GDALGetProjectionRef(ds));
    assert_non_null(b);
    assert_true(OSRIsSame(a, b));
    assert_string_equal(OSRGetAuthorityCode(b, NULL), "32618");
    OSRDestroySpatialReference(a);
    OSRDestroySpatialReference(b);
    assert_string_equal(GDALGetProjectionRef(ds), wkt);
}

/* ---- tests ---- */

static void test_product_path(void **state)
{
    (void)state;
    char buf[256];
    tw_writer_product_path("/out/x", "scene", "prob", buf, sizeof buf);
    assert_string_equal(buf, "/out/x/scene.prob.tif");
}

static void test_gtiff_float(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    assert_non_null(dir);
    char *wkt = utm18n_wkt();
    float probs[GW * GH * K];
    uint8_t has[GW * GH];
    make_probs(GW, GH, K, probs, has);

    tw_writer_params p = base_params(dir, wkt);
    const char opts[2][128] = {"COMPRESS=LZW", "PREDICTOR=2"};
    p.creation_options = opts;
    p.n_creation_options = 2;
    tw_error err;
    tw_error_init(&err);
    tw_writer *w = NULL;
    if (tw_writer_create(&p, &w, &err) != TW_OK) fail_msg("create: %s", err.msg);

    /* Strips of 3, 2, 2 rows; the smaller strips must reuse the buffers. */
    assert_int_equal(tw_writer_write_rows(w, 0, 3, probs, has, &err), TW_OK);
    uint64_t allocs = tw_mem_alloc_count();
    assert_false(tw_test_file_exists(tw_test_path(dir, "scene.class.tif")));
    assert_false(tw_test_file_exists(tw_test_path(dir, "scene.prob.tif")));
    assert_false(tw_test_file_exists(tw_test_path(dir, "scene.conf.tif")));
    assert_true(tw_test_file_exists(tw_test_path(dir, ".scene.class.tif.part")));
    assert_true(tw_test_file_exists(tw_test_path(dir, ".scene.prob.tif.part")));
    assert_int_equal(tw_writer_write_rows(w, 3, 2, probs + 3 * GW * K, has + 3 * GW, &err), TW_OK);
    assert_int_equal(tw_writer_write_rows(w, 5, 2, probs + 5 * GW * K, has + 5 * GW, &err), TW_OK);
    assert_true(tw_mem_alloc_count() == allocs);
    if (tw_writer_finish(w, &err) != TW_OK) fail_msg("finish: %s", err.msg);
    tw_writer_destroy(w);

    char names[1024];
    list_dir(dir, names, sizeof names);
    assert_null(strstr(names, ".part"));
    assert_non_null(strstr(names, "scene.class.tif "));

    /* class map */
    GDALDatasetH ds = GDALOpen(tw_test_path(dir, "scene.class.tif"), GA_ReadOnly);
    assert_non_null(ds);
    assert_int_equal(GDALGetRasterCount(ds), 1);
    assert_georef(ds, wkt);
    assert_string_equal(GDALGetMetadataItem(ds, "TILEWISE_RUN", NULL), "{\"tile\": 64}");
    assert_string_equal(GDALGetMetadataItem(ds, "COMPRESSION", "IMAGE_STRUCTURE"), "LZW");
    GDALRasterBandH band = GDALGetRasterBand(ds, 1);
    int bx, by;
    GDALGetBlockSize(band, &bx, &by);
    assert_int_equal(bx, 256); /* TILED=YES: square tiles, not strips of rows */
    assert_int_equal(by, 256);
    assert_int_equal(GDALGetRasterDataType(band), GDT_Byte);
    assert_string_equal(GDALGetDescription(band), "class");
    int ok = 0;
    assert_true(GDALGetRasterNoDataValue(band, &ok) == 255.0 && ok);
    GDALColorTableH ct = GDALGetRasterColorTable(band);
    assert_non_null(ct);
    assert_true(GDALGetColorEntryCount(ct) >= K);
    /* Distinct colours for the classes. */
    const GDALColorEntry *c0 = GDALGetColorEntry(ct, 0), *c1 = GDALGetColorEntry(ct, 1);
    assert_true(c0->c1 != c1->c1 || c0->c2 != c1->c2 || c0->c3 != c1->c3);
    char **cats = GDALGetRasterCategoryNames(band);
    assert_int_equal(CSLCount(cats), K);
    for (int j = 0; j < K; j++) assert_string_equal(cats[j], k_names[j]);
    uint8_t cls[GW * GH];
    read_band_u8(band, cls, GW, GH);
    double vals[GW * GH];
    int nv = 0;
    for (int i = 0; i < GW * GH; i++) {
        int expect = has[i] ? ref_argmax(probs + i * K, K) : 255;
        assert_int_equal(cls[i], expect);
        if (has[i]) vals[nv++] = expect;
    }
    assert_int_equal(cls[1], 0); /* ties: lowest class index */
    assert_int_equal(cls[2], 1);
    assert_int_equal(cls[3], 0);
    assert_stats(band, stats_of(vals, nv));
    GDALClose(ds);

    /* probabilities */
    ds = GDALOpen(tw_test_path(dir, "scene.prob.tif"), GA_ReadOnly);
    assert_non_null(ds);
    assert_int_equal(GDALGetRasterCount(ds), K);
    assert_georef(ds, wkt);
    for (int j = 0; j < K; j++) {
        band = GDALGetRasterBand(ds, j + 1);
        assert_int_equal(GDALGetRasterDataType(band), GDT_Float32);
        assert_string_equal(GDALGetDescription(band), k_names[j]);
        assert_true(GDALGetRasterNoDataValue(band, &ok) == -1.0 && ok);
        float v[GW * GH];
        read_band_f32(ds, j + 1, v, GW, GH);
        nv = 0;
        for (int i = 0; i < GW * GH; i++) {
            float expect = has[i] ? probs[i * K + j] : -1.0f;
            assert_true(v[i] == expect);
            if (has[i]) vals[nv++] = expect;
        }
        assert_stats(band, stats_of(vals, nv));
    }
    GDALClose(ds);

    /* confidence */
    ds = GDALOpen(tw_test_path(dir, "scene.conf.tif"), GA_ReadOnly);
    assert_non_null(ds);
    assert_georef(ds, wkt);
    band = GDALGetRasterBand(ds, 1);
    assert_int_equal(GDALGetRasterDataType(band), GDT_Float32);
    assert_true(GDALGetRasterNoDataValue(band, &ok) == -1.0 && ok);
    float conf[GW * GH];
    read_band_f32(ds, 1, conf, GW, GH);
    nv = 0;
    for (int i = 0; i < GW * GH; i++) {
        float m = probs[i * K];
        for (int j = 1; j < K; j++) m = fmaxf(m, probs[i * K + j]);
        assert_true(conf[i] == (has[i] ? m : -1.0f));
        if (has[i]) vals[nv++] = m;
    }
    assert_stats(band, stats_of(vals, nv));
    GDALClose(ds);

    CPLFree(wkt);
    remove_dir(dir);
}

static void test_gtiff_uint8(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    assert_non_null(dir);
    float probs[GW * GH * K];
    uint8_t has[GW * GH];
    make_probs(GW, GH, K, probs, has);
    tw_writer_params p = base_params(dir, "");
    p.products = TW_PRODUCT_PROB;
    p.prob_type = TW_PROB_UINT8;
    tw_error err;
    tw_error_init(&err);
    tw_writer *w = NULL;
    if (tw_writer_create(&p, &w, &err) != TW_OK) fail_msg("create: %s", err.msg);
    const int strips[] = {2, 2, 3};
    write_strips(w, probs, has, GW, strips, 3, K);
    if (tw_writer_finish(w, &err) != TW_OK) fail_msg("finish: %s", err.msg);
    tw_writer_destroy(w);

    char names[1024];
    /* Only the product (and maybe its .aux.xml): no class/conf, no .msk sidecar. */
    list_dir(dir, names, sizeof names);
    assert_non_null(strstr(names, "scene.prob.tif "));
    assert_null(strstr(names, ".msk"));
    assert_null(strstr(names, "class"));
    assert_null(strstr(names, "conf"));

    GDALDatasetH ds = GDALOpen(tw_test_path(dir, "scene.prob.tif"), GA_ReadOnly);
    assert_non_null(ds);
    assert_string_equal(GDALGetProjectionRef(ds), "");
    for (int j = 0; j < K; j++) {
        GDALRasterBandH band = GDALGetRasterBand(ds, j + 1);
        assert_int_equal(GDALGetRasterDataType(band), GDT_Byte);
        assert_string_equal(GDALGetDescription(band), k_names[j]);
        assert_int_equal(GDALGetMaskFlags(band), GMF_PER_DATASET);
        uint8_t v[GW * GH], m[GW * GH];
        read_band_u8(band, v, GW, GH);
        read_band_u8(GDALGetMaskBand(band), m, GW, GH);
        double vals[GW * GH];
        int nv = 0;
        for (int i = 0; i < GW * GH; i++) {
            if (!has[i]) {
                assert_int_equal(v[i], 0);
                assert_int_equal(m[i], 0);
                continue;
            }
            assert_int_equal(m[i], 255);
            /* round(255 p): never more than half a step away. */
            double exact = 255.0 * probs[i * K + j];
            assert_true(fabs(v[i] - exact) <= 0.5 + 1e-4);
            vals[nv++] = v[i];
        }
        assert_stats(band, stats_of(vals, nv));
    }
    GDALClose(ds);
    remove_dir(dir);
}

static void test_destroy_removes_parts(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    assert_non_null(dir);
    float probs[GW * GH * K];
    uint8_t has[GW * GH];
    make_probs(GW, GH, K, probs, has);
    tw_writer_params p = base_params(dir, "");
    p.prob_type = TW_PROB_UINT8; /* with a mask band too */
    tw_error err;
    tw_error_init(&err);
    tw_writer *w = NULL;
    assert_int_equal(tw_writer_create(&p, &w, &err), TW_OK);
    assert_int_equal(tw_writer_write_rows(w, 0, 4, probs, has, &err), TW_OK);
    char names[1024];
    assert_int_equal(list_dir(dir, names, sizeof names) > 0, 1);
    /* Finishing early is refused and leaves no final name. */
    assert_int_equal(tw_writer_finish(w, &err), TW_ERR_INTERNAL);
    assert_false(tw_test_file_exists(tw_test_path(dir, "scene.class.tif")));
    tw_writer_destroy(w);
    assert_int_equal(list_dir(dir, names, sizeof names), 0);

    /* Same for COG. */
    tw_error_init(&err);
    p.format = TW_FORMAT_COG;
    assert_int_equal(tw_writer_create(&p, &w, &err), TW_OK);
    assert_int_equal(tw_writer_write_rows(w, 0, GH, probs, has, &err), TW_OK);
    tw_writer_destroy(w);
    assert_int_equal(list_dir(dir, names, sizeof names), 0);
    tw_writer_destroy(NULL);
    remove_dir(dir);
}

static void test_rows_out_of_order(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    float probs[GW * GH * K];
    uint8_t has[GW * GH];
    make_probs(GW, GH, K, probs, has);
    tw_writer_params p = base_params(dir, "");
    tw_error err;
    tw_error_init(&err);
    tw_writer *w = NULL;
    assert_int_equal(tw_writer_create(&p, &w, &err), TW_OK);
    assert_int_equal(tw_writer_write_rows(w, 1, 2, probs, has, &err), TW_ERR_INTERNAL);
    tw_error_init(&err);
    assert_int_equal(tw_writer_write_rows(w, 0, GH + 1, probs, has, &err), TW_ERR_INTERNAL);
    tw_writer_destroy(w);
    remove_dir(dir);
}

static void expect_output_error(const tw_writer_params *p, const char *needle)
{
    tw_error err;
    tw_error_init(&err);
    tw_writer *w = (tw_writer *)&err; /* must be reset to NULL */
    assert_int_equal(tw_writer_create(p, &w, &err), TW_ERR_OUTPUT);
    assert_null(w);
    assert_int_equal(err.status, TW_ERR_OUTPUT);
    if (!strstr(err.msg, needle)) fail_msg("message '%s' does not name '%s'", err.msg, needle);
}

static void test_bad_output_dir(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    assert_non_null(dir);

    /* A regular file where the directory should be (root ignores chmod). */
    char afile[4096];
    snprintf(afile, sizeof afile, "%s/afile", dir);
    FILE *f = fopen(afile, "w");
    assert_non_null(f);
    fclose(f);
    tw_writer_params p = base_params(afile, "");
    expect_output_error(&p, afile);

    char sub[4096];
    snprintf(sub, sizeof sub, "%s/afile/sub", dir);
    p.dir = sub;
    expect_output_error(&p, sub);

    char missing[4096];
    snprintf(missing, sizeof missing, "%s/does-not-exist", dir);
    p.dir = missing;
    expect_output_error(&p, missing);

    /* The final name is taken by a directory: rename could never succeed. */
    char taken[4096];
    snprintf(taken, sizeof taken, "%s/scene.conf.tif", dir);
    assert_int_equal(mkdir(taken, 0755), 0);
    p.dir = dir;
    expect_output_error(&p, taken);
    rmdir(taken);

    /* Nothing was left behind by the failed creates. */
    char names[1024];
    assert_int_equal(list_dir(dir, names, sizeof names), 1);
    assert_string_equal(names, "afile ");
    remove_dir(dir);
}

static void test_bad_creation_option(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    tw_writer_params p = base_params(dir, "");
    const char opts[1][128] = {"COMPRESS"};
    p.creation_options = opts;
    p.n_creation_options = 1;
    tw_error err;
    tw_error_init(&err);
    tw_writer *w = NULL;
    assert_int_equal(tw_writer_create(&p, &w, &err), TW_ERR_CONFIG);
    assert_non_null(strstr(err.msg, "COMPRESS"));
    assert_null(w);

    /* Well-formed but unknown to the driver: GDAL alone would only warn. */
    const char bad[2][128] = {"COMPRESS=DEFLATE", "COMPRESS=NOSUCHCODEC"};
    p.creation_options = bad;
    p.n_creation_options = 2;
    for (int fmt = 0; fmt < 2; fmt++) {
        p.format = fmt ? TW_FORMAT_COG : TW_FORMAT_GTIFF;
        tw_error_init(&err);
        assert_int_equal(tw_writer_create(&p, &w, &err), TW_ERR_CONFIG);
        if (!strstr(err.msg, "NOSUCHCODEC")) fail_msg("message '%s'", err.msg);
        assert_null(w);
    }
    /* GTiff-only options are refused for COG (it has BLOCKSIZE instead). */
    const char tiled[1][128] = {"BLOCKXSIZE=512"};
    p.creation_options = tiled;
    p.n_creation_options = 1;
    tw_error_init(&err);
    assert_int_equal(tw_writer_create(&p, &w, &err), TW_ERR_CONFIG);
    if (!strstr(err.msg, "BLOCKXSIZE")) fail_msg("message '%s'", err.msg);
    char names[256];
    assert_int_equal(list_dir(dir, names, sizeof names), 0);
    remove_dir(dir);
}

/* A 600x600 COG with 4 classes. Class ids form 2x2 blocks {0 at the top
 * left, 3 elsewhere}: the first overview is 2x2 averaging, where MODE gives
 * 3, NEAREST 0 and AVERAGE 2.25 -- so it shows which resampling was used. */
static void test_cog(void **state)
{
    (void)state;
    enum { N = 600, K4 = 4 };
    const char *dir = tw_test_tmpdir();
    assert_non_null(dir);
    char *wkt = utm18n_wkt();
    float *probs = malloc(sizeof(float) * N * N * K4);
    uint8_t *has = malloc(N * N);
    assert_non_null(probs);
    assert_non_null(has);
    for (int r = 0; r < N; r++) {
        for (int c = 0; c < N; c++) {
            size_t i = (size_t)r * N + c;
            int cls = (r % 2 == 0 && c % 2 == 0) ? 0 : 3;
            float *p = probs + i * K4;
            for (int j = 0; j < K4; j++) p[j] = 0.1f + 0.001f * (float)((r + c + j) % 7);
            p[cls] = 0.7f;
            has[i] = !(r >= 300 && r < 302 && c < 2); /* one nodata 2x2 block */
        }
    }
    tw_writer_params p = base_params(dir, wkt);
    p.grid_w = p.grid_h = N;
    p.n_classes = K4;
    const char opts[2][128] = {"COMPRESS=DEFLATE", "BLOCKSIZE=256"};
    p.creation_options = opts;
    p.n_creation_options = 2;
    p.format = TW_FORMAT_COG;
    tw_error err;
    tw_error_init(&err);
    tw_writer *w = NULL;
    if (tw_writer_create(&p, &w, &err) != TW_OK) fail_msg("create: %s", err.msg);
    const int strips[] = {64, 64, 64, 64, 64, 64, 64, 64, 64, 24};
    write_strips(w, probs, has, N, strips, 10, K4);
    assert_false(tw_test_file_exists(tw_test_path(dir, "scene.class.tif")));
    if (tw_writer_finish(w, &err) != TW_OK) fail_msg("finish: %s", err.msg);
    tw_writer_destroy(w);

    char names[1024];
    list_dir(dir, names, sizeof names);
    assert_null(strstr(names, ".part"));

    const char *prods[3] = {"scene.class.tif", "scene.prob.tif", "scene.conf.tif"};
    for (int k = 0; k < 3; k++) {
        GDALDatasetH ds = GDALOpen(tw_test_path(dir, prods[k]), GA_ReadOnly);
        assert_non_null(ds);
        assert_string_equal(GDALGetMetadataItem(ds, "LAYOUT", "IMAGE_STRUCTURE"), "COG");
        assert_string_equal(GDALGetMetadataItem(ds, "COMPRESSION", "IMAGE_STRUCTURE"), "DEFLATE");
        assert_string_equal(GDALGetMetadataItem(ds, "TILEWISE_RUN", NULL), "{\"tile\": 64}");
        assert_georef(ds, wkt);
        GDALRasterBandH band = GDALGetRasterBand(ds, 1);
        int bx, by;
        GDALGetBlockSize(band, &bx, &by);
        assert_int_equal(bx, 256);
        assert_true(GDALGetOverviewCount(band) >= 1);
        GDALRasterBandH ov = GDALGetOverview(band, 0);
        assert_int_equal(GDALGetRasterBandXSize(ov), N / 2);
        double mn, mx, mean, sd;
        assert_int_equal(GDALGetRasterStatistics(band, FALSE, FALSE, &mn, &mx, &mean, &sd),
                         CE_None);

        if (k == 0) {
            char **cats = GDALGetRasterCategoryNames(band);
            assert_int_equal(CSLCount(cats), K4);
            assert_string_equal(cats[3], "bare");
            assert_non_null(GDALGetRasterColorTable(band));
            uint8_t row[N];
            assert_int_equal(GDALRasterIO(band, GF_Read, 0, 300, N, 1, row, N, 1, GDT_Byte, 0, 0),
                             CE_None);
            assert_int_equal(row[0], 255);
            assert_int_equal(row[2], 0);
            assert_int_equal(row[3], 3);
            uint8_t o[N / 2];
            assert_int_equal(
                GDALRasterIO(ov, GF_Read, 0, 10, N / 2, 1, o, N / 2, 1, GDT_Byte, 0, 0), CE_None);
            for (int c = 0; c < N / 2; c++) assert_int_equal(o[c], 3); /* MODE */
        } else if (k == 1) {
            /* AVERAGE: overview cell = mean of its four cells. */
            float o[N / 2];
            assert_int_equal(GDALRasterIO(GDALGetOverview(GDALGetRasterBand(ds, 2), 0), GF_Read, 0,
                                          10, N / 2, 1, o, N / 2, 1, GDT_Float32, 0, 0),
                             CE_None);
            for (int c = 0; c < N / 2; c += 37) {
                double sum = 0;
                for (int dr = 0; dr < 2; dr++)
                    for (int dc = 0; dc < 2; dc++)
                        sum += probs[((size_t)(20 + dr) * N + 2 * c + dc) * K4 + 1];
                assert_true(fabs(o[c] - sum / 4) < 1e-6);
            }
        }
        GDALClose(ds);
    }
    free(probs);
    free(has);
    CPLFree(wkt);
    remove_dir(dir);
}

/* uint8 probabilities through the COG driver keep their validity mask. */
static void test_cog_uint8_mask(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    assert_non_null(dir);
    float probs[GW * GH * K];
    uint8_t has[GW * GH];
    make_probs(GW, GH, K, probs, has);
    tw_writer_params p = base_params(dir, "");
    p.products = TW_PRODUCT_PROB;
    p.prob_type = TW_PROB_UINT8;
    p.format = TW_FORMAT_COG;
    tw_error err;
    tw_error_init(&err);
    tw_writer *w = NULL;
    if (tw_writer_create(&p, &w, &err) != TW_OK) fail_msg("create: %s", err.msg);
    const int strips[] = {GH};
    write_strips(w, probs, has, GW, strips, 1, K);
    if (tw_writer_finish(w, &err) != TW_OK) fail_msg("finish: %s", err.msg);
    tw_writer_destroy(w);
    char names[1024];
    list_dir(dir, names, sizeof names);
    assert_null(strstr(names, ".part"));
    assert_null(strstr(names, ".msk"));

    GDALDatasetH ds = GDALOpen(tw_test_path(dir, "scene.prob.tif"), GA_ReadOnly);
    assert_non_null(ds);
    assert_string_equal(GDALGetMetadataItem(ds, "LAYOUT", "IMAGE_STRUCTURE"), "COG");
    GDALRasterBandH band = GDALGetRasterBand(ds, 2);
    assert_string_equal(GDALGetDescription(band), k_names[1]);
    assert_int_equal(GDALGetMaskFlags(band), GMF_PER_DATASET);
    uint8_t v[GW * GH], m[GW * GH];
    read_band_u8(band, v, GW, GH);
    read_band_u8(GDALGetMaskBand(band), m, GW, GH);
    for (int i = 0; i < GW * GH; i++) {
        assert_int_equal(m[i], has[i] ? 255 : 0);
        if (has[i]) assert_true(fabs(v[i] - 255.0 * probs[i * K + 1]) <= 0.5 + 1e-4);
    }
    GDALClose(ds);
    remove_dir(dir);
}

/* A full disk, simulated with RLIMIT_FSIZE: writes past the limit fail with
 * EFBIG (SIGXFSZ ignored) exactly where ENOSPC would. */
static void test_write_failure(void **state)
{
    (void)state;
    enum { N = 400 };
    const char *dir = tw_test_tmpdir();
    assert_non_null(dir);
    float *probs = malloc(sizeof(float) * N * N * K);
    uint8_t *has = malloc(N * N);
    assert_non_null(probs);
    assert_non_null(has);
    make_probs(N, N, K, probs, has);
    for (int fmt = 0; fmt < 2; fmt++) {
        tw_writer_params p = base_params(dir, "");
        p.grid_w = p.grid_h = N;
        p.format = fmt ? TW_FORMAT_COG : TW_FORMAT_GTIFF;
        /* Compressed (the default), these smooth probabilities would fit
         * under the limit: write them raw so the limit is reached. */
        static const char raw[1][128] = {"COMPRESS=NONE"};
        p.creation_options = raw;
        p.n_creation_options = 1;
        tw_error err;
        tw_error_init(&err);
        tw_writer *w = NULL;
        assert_int_equal(tw_writer_create(&p, &w, &err), TW_OK);

        struct rlimit old, lim;
        assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
        lim = old;
        lim.rlim_cur = 64 * 1024; /* the prob raster needs ~1.9 MB */
        void (*old_sig)(int) = signal(SIGXFSZ, SIG_IGN);
        assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
        tw_status st = tw_writer_write_rows(w, 0, N, probs, has, &err);
        if (st == TW_OK) st = tw_writer_finish(w, &err);
        assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
        signal(SIGXFSZ, old_sig);

        assert_int_equal(st, TW_ERR_OUTPUT);
        if (!strstr(err.msg, dir)) fail_msg("message '%s' does not name %s", err.msg, dir);
        assert_false(tw_test_file_exists(tw_test_path(dir, "scene.class.tif")));
        assert_false(tw_test_file_exists(tw_test_path(dir, "scene.prob.tif")));
        tw_writer_destroy(w);
        char names[1024];
        if (list_dir(dir, names, sizeof names) != 0) fail_msg("left behind: %s", names);
    }
    free(probs);
    free(has);
    remove_dir(dir);
}

int main(void)
{
    GDALAllRegister();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_product_path),        cmocka_unit_test(test_gtiff_float),
        cmocka_unit_test(test_gtiff_uint8),         cmocka_unit_test(test_destroy_removes_parts),
        cmocka_unit_test(test_rows_out_of_order),   cmocka_unit_test(test_bad_output_dir),
        cmocka_unit_test(test_bad_creation_option), cmocka_unit_test(test_cog),
        cmocka_unit_test(test_cog_uint8_mask),      cmocka_unit_test(test_write_failure),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    GDALDestroyDriverManager();
    return rc;
}
