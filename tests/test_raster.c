/* test_raster.c - the GDAL raster reader against rasters whose pixels are
 * known by construction (tests/fixtures/fx_rasters.py documents the formula,
 * re-implemented here independently of the reader), against what GDAL Python
 * reported for the real rasters in ../shared/data, and for bad input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <gdal.h>

#include "io/input/raster.h"
#include "io/input/tiff_direct.h"
#include "tests/testutil.h"

#define FW 100 /* fixture width, height, bands */
#define FH 70
#define FB 3

typedef struct fx_dtype {
    const char *name; /* as in the file names */
    tw_dtype t;
    double nd; /* nodata value of the _nodata variants */
} fx_dtype;

static const fx_dtype k_dtypes[] = {
    {"byte", TW_DT_BYTE, 0},
    {"int8", TW_DT_INT8, -128},
    {"uint16", TW_DT_UINT16, 65535},
    {"int16", TW_DT_INT16, -32768},
    {"uint32", TW_DT_UINT32, 4294967295.0},
    {"int32", TW_DT_INT32, -2147483648.0},
    {"float32", TW_DT_FLOAT32, -9999},
    {"float64", TW_DT_FLOAT64, 32768},
};
#define N_DTYPES (int)(sizeof k_dtypes / sizeof k_dtypes[0])

/* ---- the fixture formula, re-implemented ---- */

/* Store the value of band b (1-based), row r, col c into buf[idx]; inject =
 * the _nodata variant's pattern. */
static void put_value(tw_dtype t, void *buf, size_t idx, int b, int r, int c, bool inject,
                      double nd)
{
    int64_t k = (int64_t)b * 7919 + (int64_t)r * 1021 + (int64_t)c * 17;
    bool is_nd = inject && (r * 100 + c) % 7 == 0 && (r + c) % 3 + 1 == b;
    switch (t) {
    case TW_DT_BYTE: ((uint8_t *)buf)[idx] = is_nd ? (uint8_t)nd : (uint8_t)(k % 256); break;
    case TW_DT_INT8: ((int8_t *)buf)[idx] = is_nd ? (int8_t)nd : (int8_t)(k % 256 - 128); break;
    case TW_DT_UINT16:
        ((uint16_t *)buf)[idx] = is_nd ? (uint16_t)nd : (uint16_t)((k * 31) % 65536);
        break;
    case TW_DT_INT16:
        ((int16_t *)buf)[idx] = is_nd ? (int16_t)nd : (int16_t)((k * 31) % 65536 - 32768);
        break;
    case TW_DT_UINT32:
        ((uint32_t *)buf)[idx] =
            is_nd ? (uint32_t)nd : (uint32_t)(((uint64_t)k * 2654435761ull) % 4294967296ull);
        break;
    case TW_DT_INT32:
        ((int32_t *)buf)[idx] =
            is_nd ? (int32_t)nd
                  : (int32_t)((int64_t)(((uint64_t)k * 2654435761ull) % 4294967296ull) -
                              2147483648ll);
        break;
    case TW_DT_FLOAT32:
        ((float *)buf)[idx] = is_nd ? (float)nd : (float)((double)(k % 10007) * 0.25 - 1000.0);
        break;
    case TW_DT_FLOAT64:
        ((double *)buf)[idx] = is_nd ? nd : (double)(k % 100003) * 0.125 - 5000.0;
        break;
    }
}

static bool equals_nd(tw_dtype t, const void *buf, size_t idx, double nd)
{
    switch (t) {
    case TW_DT_BYTE: return ((const uint8_t *)buf)[idx] == (uint8_t)nd;
    case TW_DT_INT8: return ((const int8_t *)buf)[idx] == (int8_t)nd;
    case TW_DT_UINT16: return ((const uint16_t *)buf)[idx] == (uint16_t)nd;
    case TW_DT_INT16: return ((const int16_t *)buf)[idx] == (int16_t)nd;
    case TW_DT_UINT32: return ((const uint32_t *)buf)[idx] == (uint32_t)nd;
    case TW_DT_INT32: return ((const int32_t *)buf)[idx] == (int32_t)nd;
    case TW_DT_FLOAT32: return ((const float *)buf)[idx] == (float)nd;
    case TW_DT_FLOAT64: return ((const double *)buf)[idx] == nd;
    }
    return false;
}

/* Expected raw/valid/counts of a window, from the formula. */
typedef struct expect {
    void *raw;
    uint8_t *valid;
    int64_t n_nodata, n_inside;
} expect;

static void make_expected(const fx_dtype *d, bool nodata, const int *bands, int nb, int x0, int y0,
                          int w, int h, expect *e)
{
    size_t plane = (size_t)w * h, esz = tw_dtype_size(d->t);
    e->raw = calloc((size_t)nb * plane, esz);
    e->valid = calloc(plane, 1);
    assert_non_null(e->raw);
    assert_non_null(e->valid);
    e->n_nodata = e->n_inside = 0;
    for (int y = 0; y < h; y++) {
        for (int x = 0; x < w; x++) {
            int r = y0 + y, c = x0 + x;
            if (r >= FH || c >= FW) continue;
            size_t p = (size_t)y * w + x;
            bool bad = false;
            for (int i = 0; i < nb; i++) {
                put_value(d->t, e->raw, (size_t)i * plane + p, bands[i], r, c, nodata, d->nd);
                if (nodata && equals_nd(d->t, e->raw, (size_t)i * plane + p, d->nd)) bad = true;
            }
            e->valid[p] = !bad;
            e->n_inside++;
            e->n_nodata += bad;
        }
    }
}

static void free_expected(expect *e)
{
    free(e->raw);
    free(e->valid);
}

/* Read one window and compare every byte with the formula. */
static void check_window(tw_raster *r, const fx_dtype *d, bool nodata, const int *bands, int nb,
                         int x0, int y0, int w, int h, const char *what)
{
    expect e;
    make_expected(d, nodata, bands, nb, x0, y0, w, h, &e);
    size_t plane = (size_t)w * h, esz = tw_dtype_size(d->t);
    uint8_t *raw = malloc((size_t)nb * plane * esz);
    uint8_t *valid = malloc(plane);
    assert_non_null(raw);
    assert_non_null(valid);
    memset(raw, 0xAB, (size_t)nb * plane * esz); /* the reader must overwrite the padding */
    memset(valid, 0xAB, plane);
    int64_t n_nodata = -1, n_inside = -1;
    tw_error err;
    tw_error_init(&err);
    tw_status st = tw_raster_read(r, x0, y0, w, h, raw, valid, &n_nodata, &n_inside, &err);
    if (st != TW_OK) fail_msg("%s: %s", what, err.msg);
    if (memcmp(raw, e.raw, (size_t)nb * plane * esz) != 0) fail_msg("%s: raw values differ", what);
    if (memcmp(valid, e.valid, plane) != 0) fail_msg("%s: valid flags differ", what);
    assert_int_equal(n_inside, e.n_inside);
    assert_int_equal(n_nodata, e.n_nodata);
    free(raw);
    free(valid);
    free_expected(&e);
}

static const int k_windows[][4] = {
    {10, 5, 32, 24},  /* inside */
    {80, 50, 32, 32}, /* crossing the right and bottom edges */
    {0, 0, 128, 96},  /* bigger than the raster */
    {96, 0, 16, 80},  /* a narrow column across the right edge, past the bottom */
    {99, 69, 1, 1},   /* the last pixel */
    {100, 70, 8, 8},  /* entirely outside */
    {0, 64, 100, 6},  /* the last rows exactly */
};

static void test_fixture_windows(void **state)
{
    (void)state;
    if (!tw_test_fixtures()) skip();
    static const char *layouts[] = {"striped", "tiled"};
    static const int all[] = {1, 2, 3}, sel[] = {3, 1};
    int checked = 0;
    for (int di = 0; di < N_DTYPES; di++) {
        for (int li = 0; li < 2; li++) {
            for (int nd = 0; nd < 2; nd++) {
                char name[128];
                snprintf(name, sizeof name, "rast_%s_%s%s.tif", k_dtypes[di].name, layouts[li],
                         nd ? "_nodata" : "");
                const char *path = tw_test_fixture(name);
                if (!path) fail_msg("fixture %s missing", name);
                tw_error err;
                tw_error_init(&err);
                tw_raster *r = NULL;
                /* all bands (n_bands 0), then the selection [3, 1] */
                for (int s = 0; s < 2; s++) {
                    tw_status st = s == 0 ? tw_raster_open(path, NULL, 0, &r, &err)
                                          : tw_raster_open(path, sel, 2, &r, &err);
                    if (st != TW_OK) fail_msg("%s: %s", name, err.msg);
                    const tw_raster_info *in = tw_raster_get_info(r);
                    /* tiled files are read through libtiff (io/input/tiff_direct.c) */
                    assert_string_equal(tw_raster_reader(r, NULL), li ? "libtiff" : "gdal");
                    assert_int_equal(in->dtype, k_dtypes[di].t);
                    assert_int_equal(in->width, FW);
                    assert_int_equal(in->height, FH);
                    assert_int_equal(in->band_count, FB);
                    assert_int_equal(tw_raster_selected_bands(r), s == 0 ? 3 : 2);
                    assert_int_equal(in->has_nodata, nd);
                    if (nd) assert_true(in->nodata == k_dtypes[di].nd);
                    for (size_t wi = 0; wi < sizeof k_windows / sizeof k_windows[0]; wi++) {
                        char what[192];
                        snprintf(what, sizeof what, "%s bands=%s window %d,%d %dx%d", name,
                                 s ? "[3,1]" : "all", k_windows[wi][0], k_windows[wi][1],
                                 k_windows[wi][2], k_windows[wi][3]);
                        check_window(r, &k_dtypes[di], nd, s ? sel : all, s ? 2 : 3,
                                     k_windows[wi][0], k_windows[wi][1], k_windows[wi][2],
                                     k_windows[wi][3], what);
                        checked++;
                    }
                    tw_raster_close(r);
                }
            }
        }
    }
    assert_int_equal(checked, 8 * 2 * 2 * 2 * 7);
}

/* ---- libtiff's direct reads against GDAL's ---- */

typedef struct direct_fx {
    const char *name; /* rast_direct_<name>.tif */
    const char *reader;
    tw_dtype t;
    int bands;
    int dtype_index; /* into k_dtypes: the formula holds (lossless, not sparse); -1 otherwise */
} direct_fx;

static const direct_fx k_direct[] = {
    {"uint16_deflate_pred2", "libtiff", TW_DT_UINT16, 3, 2},
    {"float32_lzw_pred3", "libtiff", TW_DT_FLOAT32, 3, 6},
    {"int16_band_zstd", "libtiff", TW_DT_INT16, 3, 3},
    {"float64_bigtiff_packbits", "libtiff", TW_DT_FLOAT64, 3, 7},
    {"uint32_lzma", "libtiff", TW_DT_UINT32, 3, 4},
    {"byte_jpeg_rgb", "libtiff", TW_DT_BYTE, 3, -1},
    {"byte_jpeg_ycbcr", "gdal", TW_DT_BYTE, 3, -1},
    {"uint16_sparse_nodata", "libtiff", TW_DT_UINT16, 3, -1},
    {"byte_sparse", "libtiff", TW_DT_BYTE, 3, -1},
    {"byte_1band", "libtiff", TW_DT_BYTE, 1, 0},
};

static tw_raster *open_reader(const char *path, const int *bands, int nb, bool gdal_only)
{
    tw_raster_open_params op = tw_raster_default_open_params();
    op.tiff_direct = !gdal_only;
    tw_error err;
    tw_error_init(&err);
    tw_raster *r = NULL;
    tw_status st = tw_raster_open_ex(path, bands, nb, &op, &r, &err);
    if (st != TW_OK) fail_msg("%s: %s", path, err.msg);
    return r;
}

/* The window (x0, y0, w, h) read by a and by b: the same bytes, flags, counts. */
static void same_window(tw_raster *a, tw_raster *b, size_t esz, int nb, int x0, int y0, int w,
                        int h, const char *name)
{
    size_t plane = (size_t)w * h, bytes = (size_t)nb * plane * esz;
    uint8_t *ra = malloc(bytes), *rb = malloc(bytes), *va = malloc(plane), *vb = malloc(plane);
    assert_true(ra && rb && va && vb);
    memset(ra, 0xAB, bytes);
    memset(rb, 0xCD, bytes);
    int64_t na = -1, ia = -1, nbd = -2, ib = -2;
    tw_error err;
    tw_error_init(&err);
    if (tw_raster_read(a, x0, y0, w, h, ra, va, &na, &ia, &err) != TW_OK ||
        tw_raster_read(b, x0, y0, w, h, rb, vb, &nbd, &ib, &err) != TW_OK)
        fail_msg("%s window %d,%d %dx%d: %s", name, x0, y0, w, h, err.msg);
    if (memcmp(ra, rb, bytes) != 0 || memcmp(va, vb, plane) != 0)
        fail_msg("%s window %d,%d %dx%d: libtiff and GDAL read different pixels", name, x0, y0, w,
                 h);
    assert_int_equal(na, nbd);
    assert_int_equal(ia, ib);
    free(ra);
    free(rb);
    free(va);
    free(vb);
}

/* Windows of every kind: the edge cases of k_windows, single whole tiles
 * (16 x 16 and the int16 file's 32 x 16: the direct-into-buffer case), and
 * a scan of 24 x 24 windows at stride 20 (crossing tile edges everywhere). */
static int direct_windows(int out[][4], int cap)
{
    int n = 0;
    for (size_t i = 0; i < sizeof k_windows / sizeof k_windows[0]; i++)
        memcpy(out[n++], k_windows[i], sizeof out[0]);
    static const int tiles[][4] = {{0, 0, 16, 16},   {32, 48, 16, 16}, {96, 64, 16, 16},
                                   {32, 16, 32, 16}, {96, 0, 32, 16},  {64, 32, 32, 32}};
    for (size_t i = 0; i < sizeof tiles / sizeof tiles[0]; i++)
        memcpy(out[n++], tiles[i], sizeof out[0]);
    for (int y = 0; y < FH; y += 20)
        for (int x = 0; x < FW && n < cap; x += 20) {
            int win[4] = {x, y, 24, 24};
            memcpy(out[n++], win, sizeof win);
        }
    return n;
}

static void test_direct_matches_gdal(void **state)
{
    (void)state;
    if (!tw_test_fixtures()) skip();
    static const int all[] = {1, 2, 3}, sel[] = {3, 1}, one[] = {1};
    int wins[64][4];
    int n_win = direct_windows(wins, 64);
    int compared = 0;
    for (size_t fi = 0; fi < sizeof k_direct / sizeof k_direct[0]; fi++) {
        const direct_fx *d = &k_direct[fi];
        char name[128];
        snprintf(name, sizeof name, "rast_direct_%s.tif", d->name);
        const char *path = tw_test_fixture(name);
        if (!path) fail_msg("fixture %s missing", name);
        for (int s = 0; s < (d->bands == 3 ? 2 : 1); s++) {
            const int *bands = d->bands == 1 ? one : s ? sel : all;
            int nb = d->bands == 1 ? 1 : s ? 2 : 3;
            tw_raster *direct = open_reader(path, bands, nb, false);
            tw_raster *gdal = open_reader(path, bands, nb, true);
            const char *why = NULL;
            const char *got = tw_raster_reader(direct, &why);
            if (strcmp(got, d->reader) != 0)
                fail_msg("%s: read by %s (%s), expected %s", name, got, why, d->reader);
            assert_string_equal(tw_raster_reader(gdal, &why), "gdal");
            assert_string_equal(why, "the libtiff reader is turned off");
            for (int w = 0; w < n_win; w++) {
                same_window(direct, gdal, tw_dtype_size(d->t), nb, wins[w][0], wins[w][1],
                            wins[w][2], wins[w][3], name);
                if (d->dtype_index >= 0 && d->bands == 3) {
                    char what[192];
                    snprintf(what, sizeof what, "%s window %d", name, w);
                    check_window(direct, &k_dtypes[d->dtype_index], false, bands, nb, wins[w][0],
                                 wins[w][1], wins[w][2], wins[w][3], what);
                }
                compared++;
            }
            tw_raster_close(direct);
            tw_raster_close(gdal);
        }
    }
    assert_true(compared >= 19 * n_win);
}

/* A sparse file's missing tiles read as its nodata value (or 0), as GDAL
 * fills them: the test above shows libtiff = GDAL, this that both are right. */
static void test_direct_sparse(void **state)
{
    (void)state;
    const char *path = tw_test_fixture("rast_direct_uint16_sparse_nodata.tif");
    if (!path) skip();
    tw_raster *r = open_reader(path, NULL, 0, false);
    assert_string_equal(tw_raster_reader(r, NULL), "libtiff");
    uint16_t raw[3 * 16 * 16];
    uint8_t valid[16 * 16];
    int64_t nn, ni;
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_raster_read(r, 16, 48, 16, 16, raw, valid, &nn, &ni, &err), TW_OK);
    for (int i = 0; i < 3 * 16 * 16; i++) assert_int_equal(raw[i], 65535);
    assert_int_equal(nn, 256);
    tw_raster_close(r);
}

/* The decoded-tile cache, whose budget is GDAL's cache size. Row-major
 * windows, as the pipeline reads: with the default cache each of the 7 x 5
 * tiles (16 x 16) is decoded once; with GDAL's cache set to 1 byte (a cache
 * of one tile) tiles are evicted and decoded again, and every window still
 * equals GDAL's. */
static void test_direct_cache(void **state)
{
    (void)state;
    const char *path = tw_test_fixture("rast_direct_uint16_deflate_pred2.tif");
    if (!path) skip();
    GIntBig old = GDALGetCacheMax64();
    tw_raster *g = open_reader(path, NULL, 0, true);
    assert_int_equal(tw_raster_tiles_decoded(g), -1);
    int wins[64][4];
    int n_win = direct_windows(wins, 64);
    for (int tiny = 0; tiny < 2; tiny++) {
        GDALSetCacheMax64(tiny ? 1 : 64 << 20);
        tw_raster *r = open_reader(path, NULL, 0, false);
        GDALSetCacheMax64(old);
        assert_string_equal(tw_raster_reader(r, NULL), "libtiff");
        uint16_t raw[3 * 12 * 12];
        uint8_t valid[12 * 12];
        int64_t nn, ni;
        tw_error err;
        tw_error_init(&err);
        for (int y = 0; y < FH; y += 12)
            for (int x = 0; x < FW; x += 12)
                assert_int_equal(tw_raster_read(r, x, y, 12, 12, raw, valid, &nn, &ni, &err),
                                 TW_OK);
        long long n = tw_raster_tiles_decoded(r);
        print_message("cache %s: %lld tiles decoded\n", tiny ? "of one tile" : "default", n);
        if (tiny)
            assert_true(n > 35);
        else
            assert_int_equal(n, 35);
        for (int w = 0; w < n_win; w++)
            same_window(r, g, 2, 3, wins[w][0], wins[w][1], wins[w][2], wins[w][3],
                        tiny ? "one-tile cache" : "default cache");
        tw_raster_close(r);
    }
    tw_raster_close(g);
}

/* The nodata variants must actually contain nodata (else the test above
 * would pass with a reader that ignores nodata). Counts over the whole
 * raster, checked against counts made independently here. */
static void test_nodata_counts_nonzero(void **state)
{
    (void)state;
    if (!tw_test_fixtures()) skip();
    for (int di = 0; di < N_DTYPES; di++) {
        char name[128];
        snprintf(name, sizeof name, "rast_%s_tiled_nodata.tif", k_dtypes[di].name);
        const char *path = tw_test_fixture(name);
        assert_non_null(path);
        tw_error err;
        tw_error_init(&err);
        tw_raster *r = NULL;
        assert_int_equal(tw_raster_open(path, NULL, 0, &r, &err), TW_OK);
        size_t esz = tw_dtype_size(k_dtypes[di].t);
        void *raw = malloc((size_t)FB * FW * FH * esz);
        uint8_t *valid = malloc((size_t)FW * FH);
        int64_t nn, ni;
        assert_int_equal(tw_raster_read(r, 0, 0, FW, FH, raw, valid, &nn, &ni, &err), TW_OK);
        assert_int_equal(ni, FW * FH);
        /* (r*100 + c) % 7 == 0 hits exactly 1000 of the 7000 pixels */
        assert_true(nn >= 1000);
        /* with nodata off, every pixel is valid */
        tw_raster_set_nodata(r, false, 0);
        assert_int_equal(tw_raster_read(r, 0, 0, FW, FH, raw, valid, &nn, &ni, &err), TW_OK);
        assert_int_equal(nn, 0);
        free(raw);
        free(valid);
        tw_raster_close(r);
    }
}

static void test_nan_inf(void **state)
{
    (void)state;
    const char *path = tw_test_fixture("rast_float32_striped_naninf.tif");
    if (!path) skip();
    tw_error err;
    tw_error_init(&err);
    tw_raster *r = NULL;
    assert_int_equal(tw_raster_open(path, NULL, 0, &r, &err), TW_OK);
    assert_false(tw_raster_get_info(r)->has_nodata);
    float *raw = malloc(sizeof(float) * FB * FW * FH);
    uint8_t *valid = malloc((size_t)FW * FH);
    int64_t nn, ni;
    for (int pass = 0; pass < 2; pass++) {
        /* pass 1: a NaN nodata value must change nothing (NaN is invalid anyway) */
        if (pass == 1) tw_raster_set_nodata(r, true, NAN);
        assert_int_equal(tw_raster_read(r, 0, 0, FW, FH, raw, valid, &nn, &ni, &err), TW_OK);
        int64_t expect_bad = 0;
        for (int y = 0; y < FH; y++) {
            for (int x = 0; x < FW; x++) {
                int q = y * 100 + x;
                bool special = q % 11 == 0;
                expect_bad += special;
                assert_int_equal(valid[y * FW + x], !special);
                for (int b = 1; b <= FB; b++) {
                    float v = raw[(size_t)(b - 1) * FW * FH + (size_t)y * FW + x];
                    if (special && (x + y) % 3 + 1 == b) {
                        int kind = (q / 11) % 3;
                        if (kind == 0)
                            assert_true(isnan(v));
                        else
                            assert_true(isinf(v) && (v > 0) == (kind == 1));
                    } else {
                        float e;
                        put_value(TW_DT_FLOAT32, &e, 0, b, y, x, false, 0);
                        assert_true(v == e);
                    }
                }
            }
        }
        assert_int_equal(nn, expect_bad);
        assert_int_equal(ni, FW * FH);
    }
    free(raw);
    free(valid);
    tw_raster_close(r);
}

/* Nodata given by configuration for a file that has none. */
static void test_config_nodata(void **state)
{
    (void)state;
    const char *path = tw_test_fixture("rast_uint16_striped_fill.tif");
    if (!path) skip();
    tw_error err;
    tw_error_init(&err);
    tw_raster *r = NULL;
    assert_int_equal(tw_raster_open(path, NULL, 0, &r, &err), TW_OK);
    assert_false(tw_raster_get_info(r)->has_nodata);
    uint16_t *raw = malloc(sizeof(uint16_t) * FB * 64 * 64);
    uint8_t *valid = malloc(64 * 64);
    int64_t nn, ni;
    assert_int_equal(tw_raster_read(r, 0, 0, 64, 64, raw, valid, &nn, &ni, &err), TW_OK);
    assert_int_equal(nn, 0);

    tw_raster_set_nodata(r, true, 0.0);
    assert_int_equal(tw_raster_read(r, 0, 0, 64, 64, raw, valid, &nn, &ni, &err), TW_OK);
    int64_t expect_bad = 0;
    for (int y = 0; y < 64; y++) {
        for (int x = 0; x < 64; x++) {
            bool bad = y < 10 && x < 20;
            for (int b = 1; b <= FB && !bad; b++) {
                uint16_t v;
                put_value(TW_DT_UINT16, &v, 0, b, y, x, false, 0);
                bad = v == 0;
            }
            expect_bad += bad;
            assert_int_equal(valid[y * 64 + x], !bad);
        }
    }
    assert_true(expect_bad >= 200);
    assert_int_equal(nn, expect_bad);

    /* values that cannot occur in UInt16 match nothing (no wrap-around) */
    tw_raster_set_nodata(r, true, 65536.0 + 0.0);
    assert_int_equal(tw_raster_read(r, 0, 0, 64, 64, raw, valid, &nn, &ni, &err), TW_OK);
    assert_int_equal(nn, 0);
    tw_raster_set_nodata(r, true, 0.5);
    assert_int_equal(tw_raster_read(r, 0, 0, 64, 64, raw, valid, &nn, &ni, &err), TW_OK);
    assert_int_equal(nn, 0);
    tw_raster_set_nodata(r, true, -65536.0);
    assert_int_equal(tw_raster_read(r, 0, 0, 64, 64, raw, valid, &nn, &ni, &err), TW_OK);
    assert_int_equal(nn, 0);
    free(raw);
    free(valid);
    tw_raster_close(r);
}

static void test_mask_band(void **state)
{
    (void)state;
    const char *path = tw_test_fixture("rast_byte_tiled_mask.tif");
    if (!path) skip();
    tw_error err;
    tw_error_init(&err);
    tw_raster *r = NULL;
    assert_int_equal(tw_raster_open(path, NULL, 0, &r, &err), TW_OK);
    uint8_t *raw = malloc((size_t)FB * 64 * 64);
    uint8_t *valid = malloc(64 * 64);
    int64_t nn, ni;
    /* window x=60..123, y=0..63: columns 90.. and rows 0..4 are masked */
    assert_int_equal(tw_raster_read(r, 60, 0, 64, 64, raw, valid, &nn, &ni, &err), TW_OK);
    int64_t expect_bad = 0, expect_in = 0;
    for (int y = 0; y < 64; y++) {
        for (int x = 0; x < 64; x++) {
            int c = 60 + x;
            bool inside = c < FW && y < FH;
            bool ok = inside && c < 90 && y >= 5;
            expect_in += inside;
            expect_bad += inside && !ok;
            assert_int_equal(valid[y * 64 + x], ok);
        }
    }
    assert_int_equal(ni, expect_in);
    assert_int_equal(nn, expect_bad);
    free(raw);
    free(valid);
    tw_raster_close(r);
}

static void test_alpha_band(void **state)
{
    (void)state;
    const char *path = tw_test_fixture("rast_byte_striped_alpha.tif");
    if (!path) skip();
    static const int rgb[] = {1, 2, 3};
    tw_error err;
    tw_error_init(&err);
    tw_raster *r = NULL;
    assert_int_equal(tw_raster_open(path, rgb, 3, &r, &err), TW_OK);
    assert_int_equal(tw_raster_get_info(r)->band_count, 4);
    uint8_t *raw = malloc((size_t)3 * 32 * 32);
    uint8_t *valid = malloc(32 * 32);
    int64_t nn, ni;
    /* rows 48..79: 48..59 valid, 60..69 alpha 0, 70.. outside */
    assert_int_equal(tw_raster_read(r, 70, 48, 32, 32, raw, valid, &nn, &ni, &err), TW_OK);
    for (int y = 0; y < 32; y++)
        for (int x = 0; x < 32; x++)
            assert_int_equal(valid[y * 32 + x], 70 + x < FW && 48 + y < 60);
    assert_int_equal(ni, 30 * 22);
    assert_int_equal(nn, 30 * 10);
    /* the pixel values themselves are the formula's */
    for (int b = 1; b <= 3; b++) {
        uint8_t e;
        put_value(TW_DT_BYTE, &e, 0, b, 48, 75, false, 0);
        assert_int_equal(raw[(size_t)(b - 1) * 32 * 32 + 5], e);
    }
    free(raw);
    free(valid);
    tw_raster_close(r);
}

/* One tw_raster per thread, as the pipeline's readers use them: concurrent
 * opens (driver registration) and reads give the formula's values. */
static void *reader_thread(void *arg)
{
    const char *path = arg;
    static const int all[] = {1, 2, 3};
    tw_error err;
    tw_error_init(&err);
    tw_raster *r = NULL;
    if (tw_raster_open(path, all, 3, &r, &err) != TW_OK) return (void *)1;
    uintptr_t bad = 0;
    uint16_t *raw = malloc(sizeof(uint16_t) * 3 * 16 * 16), e;
    uint8_t *valid = malloc(16 * 16);
    for (int y0 = 0; y0 < FH && !bad; y0 += 16) {
        for (int x0 = 0; x0 < FW && !bad; x0 += 16) {
            int64_t nn, ni;
            if (tw_raster_read(r, x0, y0, 16, 16, raw, valid, &nn, &ni, &err) != TW_OK) {
                bad = 2;
                break;
            }
            for (int b = 0; b < 3; b++)
                for (int y = 0; y < 16 && y0 + y < FH; y++)
                    for (int x = 0; x < 16 && x0 + x < FW; x++) {
                        put_value(TW_DT_UINT16, &e, 0, b + 1, y0 + y, x0 + x, false, 0);
                        if (raw[(b * 16 + y) * 16 + x] != e) bad = 3;
                    }
        }
    }
    free(raw);
    free(valid);
    tw_raster_close(r);
    return (void *)bad;
}

static void test_threads(void **state)
{
    (void)state;
    const char *path = tw_test_fixture("rast_uint16_tiled.tif");
    if (!path) skip();
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", path);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, reader_thread, copy), 0);
    for (int i = 0; i < 4; i++) {
        void *ret = NULL;
        assert_int_equal(pthread_join(th[i], &ret), 0);
        assert_int_equal((uintptr_t)ret, 0);
    }
}

/* Info against what GDAL Python wrote into rasters_info.txt. */
static void test_info_matches_gdal(void **state)
{
    (void)state;
    const char *p = tw_test_fixture("rasters_info.txt");
    if (!p) skip();
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        char file[256];
        int w, h, nb, bw, bh, has_nd, has_crs;
        double nd;
        int got = sscanf(line,
                         "file=%255s width=%d height=%d bands=%d block_w=%d block_h=%d "
                         "has_nodata=%d nodata=%lf has_crs=%d",
                         file, &w, &h, &nb, &bw, &bh, &has_nd, &nd, &has_crs);
        assert_int_equal(got, 9);
        tw_error err;
        tw_error_init(&err);
        tw_raster *r = NULL;
        if (tw_raster_open(tw_test_fixture(file), NULL, 0, &r, &err) != TW_OK)
            fail_msg("%s", err.msg);
        const tw_raster_info *in = tw_raster_get_info(r);
        assert_int_equal(in->width, w);
        assert_int_equal(in->height, h);
        assert_int_equal(in->band_count, nb);
        assert_int_equal(in->block_w, bw);
        assert_int_equal(in->block_h, bh);
        assert_int_equal(in->has_nodata, has_nd);
        if (has_nd) assert_true(in->nodata == nd);
        assert_int_equal(in->crs_wkt[0] != '\0', has_crs);
        assert_string_equal(in->driver, "GTiff");
        if (has_crs) {
            assert_true(in->has_geotransform);
            const double gt[6] = {500000.0, 30.0, 0.0, 4500000.0, 0.0, -30.0};
            for (int i = 0; i < 6; i++) assert_true(in->geotransform[i] == gt[i]);
            assert_non_null(strstr(in->crs_wkt, "UTM zone 18N"));
            assert_non_null(strstr(in->crs_wkt, "32618"));
        } else {
            assert_false(in->has_geotransform);
            const double id[6] = {0, 1, 0, 0, 0, 1};
            for (int i = 0; i < 6; i++) assert_true(in->geotransform[i] == id[i]);
        }
        tw_raster_close(r);
        n++;
    }
    fclose(f);
    assert_true(n >= 37);
}

/* ---- errors ---- */

/* Run an open that must fail, with stderr redirected: GDAL must not print. */
static void expect_open_error(const char *path, const int *bands, int nb, const char *needle1,
                              const char *needle2)
{
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    char tmpl[] = "/tmp/tw-raster-stderr-XXXXXX";
    int fd = mkstemp(tmpl);
    assert_true(saved >= 0 && fd >= 0);
    assert_true(dup2(fd, STDERR_FILENO) >= 0);

    tw_error err;
    tw_error_init(&err);
    tw_raster *r = (tw_raster *)&err; /* must be reset to NULL */
    tw_status st = tw_raster_open(path, bands, nb, &r, &err);

    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    off_t printed = lseek(fd, 0, SEEK_END);
    close(fd);
    unlink(tmpl);

    assert_int_equal(st, TW_ERR_INPUT);
    assert_null(r);
    assert_int_equal(err.status, TW_ERR_INPUT);
    if (!strstr(err.msg, needle1)) fail_msg("message '%s' lacks '%s'", err.msg, needle1);
    if (needle2 && !strstr(err.msg, needle2)) fail_msg("message '%s' lacks '%s'", err.msg, needle2);
    assert_int_equal(printed, 0);
}

static void test_errors(void **state)
{
    (void)state;
    const char *dir = tw_test_fixtures();
    if (!dir) skip();
    const char *missing = tw_test_path(dir, "no_such_scene.tif");
    expect_open_error(missing, NULL, 0, "no_such_scene.tif", NULL);
    expect_open_error(tw_test_fixture("not_a_raster.txt"), NULL, 0, "not_a_raster.txt",
                      "not recognized");
    const int b7[] = {1, 7};
    expect_open_error(tw_test_fixture("rast_byte_striped.tif"), b7, 2, "rast_byte_striped.tif",
                      "has 3 bands, input.bands asks for band 7");
    const int b0[] = {0};
    expect_open_error(tw_test_fixture("rast_byte_striped.tif"), b0, 1, "rast_byte_striped.tif",
                      "asks for band 0");
    expect_open_error(tw_test_fixture("rast_cfloat32.tif"), NULL, 0, "rast_cfloat32.tif",
                      "CFloat32");
    expect_open_error(tw_test_fixture("rast_mixed.vrt"), NULL, 0, "rast_mixed.vrt",
                      "one data type");
    expect_open_error("", NULL, 0, "empty", NULL);

    /* a single band of the mixed VRT is fine */
    tw_error err;
    tw_error_init(&err);
    tw_raster *r = NULL;
    const int b2[] = {2};
    assert_int_equal(tw_raster_open(tw_test_fixture("rast_mixed.vrt"), b2, 1, &r, &err), TW_OK);
    assert_int_equal(tw_raster_get_info(r)->dtype, TW_DT_UINT16);
    assert_string_equal(tw_raster_get_info(r)->driver, "VRT");
    tw_raster_close(r);
    tw_raster_close(NULL);
}

static void test_read_errors(void **state)
{
    (void)state;
    const char *path = tw_test_fixture("rast_truncated.tif");
    if (!path) skip();
    tw_error err;
    tw_error_init(&err);
    tw_raster *r = NULL;
    assert_int_equal(tw_raster_open(path, NULL, 0, &r, &err), TW_OK);
    uint16_t *raw = malloc(sizeof(uint16_t) * FB * 128 * 128);
    uint8_t *valid = malloc(128 * 128);
    int64_t nn, ni;

    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    char tmpl[] = "/tmp/tw-raster-stderr-XXXXXX";
    int fd = mkstemp(tmpl);
    assert_true(saved >= 0 && fd >= 0);
    assert_true(dup2(fd, STDERR_FILENO) >= 0);
    tw_status st = tw_raster_read(r, 64, 48, 64, 64, raw, valid, &nn, &ni, &err);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    off_t printed = lseek(fd, 0, SEEK_END);
    close(fd);
    unlink(tmpl);

    assert_int_equal(st, TW_ERR_INPUT);
    if (!strstr(err.msg, "rast_truncated.tif: read failed at window x=64 y=48 64x64: "))
        fail_msg("unexpected message '%s'", err.msg);
    assert_true(strlen(err.msg) > strlen(path) + 40); /* GDAL's reason follows */
    assert_int_equal(printed, 0);

    /* bad window arguments */
    tw_error_init(&err);
    assert_int_equal(tw_raster_read(r, -1, 0, 8, 8, raw, valid, &nn, &ni, &err), TW_ERR_INPUT);
    assert_non_null(strstr(err.msg, "rast_truncated.tif"));
    tw_error_init(&err);
    assert_int_equal(tw_raster_read(r, 0, 0, 0, 8, raw, valid, &nn, &ni, &err), TW_ERR_INPUT);
    free(raw);
    free(valid);
    tw_raster_close(r);
}

/* ---- real rasters in ../shared/data ---- */

static bool read_file(const char *path, void *buf, size_t n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    bool ok = fread(buf, 1, n, f) == n && fgetc(f) == EOF;
    fclose(f);
    return ok;
}

static tw_dtype dtype_from_name(const char *s)
{
    static const tw_dtype all[] = {TW_DT_BYTE,  TW_DT_UINT16,  TW_DT_INT16,   TW_DT_UINT32,
                                   TW_DT_INT32, TW_DT_FLOAT32, TW_DT_FLOAT64, TW_DT_INT8};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(tw_dtype_name(all[i]), s) == 0) return all[i];
    fail_msg("unknown dtype %s", s);
    return TW_DT_BYTE;
}

static void test_shared_rasters(void **state)
{
    (void)state;
    const char *sdir = tw_test_shared_rasters();
    const char *info = tw_test_fixture("shared_rasters_info.txt");
    if (!sdir || !info) skip();
    FILE *f = fopen(info, "r");
    assert_non_null(f);
    char line[2048];
    int n = 0;
    bool seen_hls = false, seen_le07 = false, seen_s2b = false, seen_rgb = false;
    while (fgets(line, sizeof line, f)) {
        char file[256], stem[256], dtype[32], gts[512], driver[32];
        int w, h, nb, bw, bh, has_nd, has_crs, x0, y0, ws;
        double nd;
        long long n_in, n_nd, n_nd_full;
        int got = sscanf(line,
                         "file=%255s stem=%255s width=%d height=%d bands=%d dtype=%31s "
                         "block_w=%d block_h=%d has_nodata=%d nodata=%lf gt=%511s has_crs=%d "
                         "driver=%31s x0=%d y0=%d win=%d n_inside=%lld n_nodata=%lld "
                         "n_nodata_full=%lld",
                         file, stem, &w, &h, &nb, dtype, &bw, &bh, &has_nd, &nd, gts, &has_crs,
                         driver, &x0, &y0, &ws, &n_in, &n_nd, &n_nd_full);
        assert_int_equal(got, 19);
        const char *path = tw_test_path(sdir, file);
        tw_error err;
        tw_error_init(&err);
        tw_raster *r = NULL;
        if (tw_raster_open(path, NULL, 0, &r, &err) != TW_OK) fail_msg("%s", err.msg);
        const tw_raster_info *in = tw_raster_get_info(r);
        assert_int_equal(in->width, w);
        assert_int_equal(in->height, h);
        assert_int_equal(in->band_count, nb);
        assert_int_equal(in->dtype, dtype_from_name(dtype));
        assert_int_equal(in->block_w, bw);
        assert_int_equal(in->block_h, bh);
        assert_int_equal(in->has_nodata, has_nd);
        if (has_nd) assert_true(in->nodata == nd);
        assert_int_equal(in->crs_wkt[0] != '\0', has_crs);
        assert_string_equal(in->driver, driver);
        if (strcmp(gts, "none") != 0) {
            double gt[6];
            assert_int_equal(sscanf(gts, "%lf,%lf,%lf,%lf,%lf,%lf", &gt[0], &gt[1], &gt[2], &gt[3],
                                    &gt[4], &gt[5]),
                             6);
            assert_true(in->has_geotransform);
            for (int i = 0; i < 6; i++) assert_true(in->geotransform[i] == gt[i]);
        }

        /* the edge window, byte for byte against GDAL Python */
        size_t esz = tw_dtype_size(in->dtype), plane = (size_t)ws * ws;
        size_t nraw = (size_t)nb * plane * esz;
        uint8_t *want = malloc(nraw), *got_raw = malloc(nraw);
        uint8_t *want_v = malloc(plane), *got_v = malloc(plane);
        char name[320];
        snprintf(name, sizeof name, "shared_%s.win.bin", stem);
        assert_true(read_file(tw_test_fixture(name), want, nraw));
        snprintf(name, sizeof name, "shared_%s.valid.bin", stem);
        assert_true(read_file(tw_test_fixture(name), want_v, plane));
        int64_t nn, ni;
        if (tw_raster_read(r, x0, y0, ws, ws, got_raw, got_v, &nn, &ni, &err) != TW_OK)
            fail_msg("%s", err.msg);
        if (memcmp(want, got_raw, nraw) != 0) fail_msg("%s: window raw values differ", file);
        if (memcmp(want_v, got_v, plane) != 0) fail_msg("%s: window valid flags differ", file);
        assert_int_equal(ni, n_in);
        assert_int_equal(nn, n_nd);
        free(want);
        free(got_raw);
        free(want_v);
        free(got_v);

        /* nodata over the whole raster, in 256x256 windows (edge windows clipped) */
        const int T = 256;
        void *buf = malloc((size_t)nb * T * T * esz);
        uint8_t *v = malloc((size_t)T * T);
        int64_t total_nd = 0, total_in = 0;
        for (int y = 0; y < h; y += T) {
            for (int x = 0; x < w; x += T) {
                if (tw_raster_read(r, x, y, T, T, buf, v, &nn, &ni, &err) != TW_OK)
                    fail_msg("%s", err.msg);
                total_nd += nn;
                total_in += ni;
            }
        }
        assert_int_equal(total_in, (int64_t)w * h);
        assert_int_equal(total_nd, n_nd_full);
        free(buf);
        free(v);

        if (strstr(file, "hls_10band_float32")) {
            seen_hls = true;
            assert_true(in->has_nodata && in->nodata == -9999.0);
        }
        if (strstr(file, "LE07_")) {
            seen_le07 = true;
            assert_true(in->has_nodata && in->nodata == 32768.0 && n_nd_full > 0);
        }
        if (strstr(file, "S2B_")) {
            seen_s2b = true;
            assert_true(in->has_nodata && in->nodata == 65535.0 && w == 9 && h == 8);
        }
        if (strcmp(file, "RGB.byte.tif") == 0) {
            seen_rgb = true;
            assert_true(in->has_nodata && in->nodata == 0.0 && n_nd_full > 0);
        }
        tw_raster_close(r);
        n++;
    }
    fclose(f);
    assert_true(n >= 4);
    assert_true(seen_hls && seen_le07 && seen_s2b && seen_rgb);
}

/* landsat_2020.tif makes libtiff warn on open: the warning must not reach stderr. */
static void test_shared_warning_quiet(void **state)
{
    (void)state;
    const char *sdir = tw_test_shared_rasters();
    if (!sdir) skip();
    const char *path = tw_test_path(sdir, "landsat_2020.tif");
    if (!tw_test_file_exists(path)) skip();
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    char tmpl[] = "/tmp/tw-raster-stderr-XXXXXX";
    int fd = mkstemp(tmpl);
    assert_true(saved >= 0 && fd >= 0);
    assert_true(dup2(fd, STDERR_FILENO) >= 0);
    tw_error err;
    tw_error_init(&err);
    tw_raster *r = NULL;
    tw_status st = tw_raster_open(path, NULL, 0, &r, &err);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    off_t printed = lseek(fd, 0, SEEK_END);
    close(fd);
    unlink(tmpl);
    assert_int_equal(st, TW_OK);
    assert_int_equal(printed, 0);
    tw_raster_close(r);
}

static void test_dtype_helpers(void **state)
{
    (void)state;
    assert_int_equal(tw_dtype_size(TW_DT_BYTE), 1);
    assert_int_equal(tw_dtype_size(TW_DT_INT8), 1);
    assert_int_equal(tw_dtype_size(TW_DT_UINT16), 2);
    assert_int_equal(tw_dtype_size(TW_DT_INT16), 2);
    assert_int_equal(tw_dtype_size(TW_DT_UINT32), 4);
    assert_int_equal(tw_dtype_size(TW_DT_INT32), 4);
    assert_int_equal(tw_dtype_size(TW_DT_FLOAT32), 4);
    assert_int_equal(tw_dtype_size(TW_DT_FLOAT64), 8);
    assert_string_equal(tw_dtype_name(TW_DT_UINT16), "UInt16");
    assert_string_equal(tw_dtype_name(TW_DT_INT8), "Int8");
    assert_string_equal(tw_dtype_name(TW_DT_FLOAT64), "Float64");
}

/* tw_raster_read_tiles (one window read per row of tiles, cut in memory)
 * gives every tile's pixels, validity and counts exactly as one
 * tw_raster_read per tile: every dtype and layout, nodata, a mask band,
 * the libtiff path, tiles overlapping (stride < tile), rows and columns
 * past the right and bottom edges, strips narrower than the row. */
static void check_read_tiles(const char *path, const int *bands, int nb, int T, int S, int strip_w)
{
    tw_error err;
    tw_error_init(&err);
    tw_raster *a = NULL, *b = NULL;
    if (tw_raster_open(path, bands, nb, &a, &err) != TW_OK ||
        tw_raster_open(path, bands, nb, &b, &err) != TW_OK)
        fail_msg("%s: %s", path, err.msg);
    const tw_raster_info *info = tw_raster_get_info(a);
    const int n_b = tw_raster_selected_bands(a);
    const size_t esz = tw_dtype_size(info->dtype), px = (size_t)T * T;
    const size_t tile_raw = (size_t)n_b * px * esz;
    assert_int_equal(tw_raster_reserve_strip(b, strip_w, T, &err), TW_OK);
    assert_int_equal(tw_raster_strip_width(b), strip_w);
    int n_x = (info->width + S - 1) / S; /* pad: the last tiles read past the edge */
    int *xs = calloc((size_t)n_x, sizeof *xs);
    int64_t *nod = calloc((size_t)n_x, sizeof *nod), *ins = calloc((size_t)n_x, sizeof *ins);
    uint8_t *raw = malloc((size_t)n_x * tile_raw), *valid = malloc((size_t)n_x * px);
    uint8_t *one = malloc(tile_raw), *one_v = malloc(px);
    assert_true(xs && nod && ins && raw && valid && one && one_v);
    for (int y0 = 0; y0 < info->height + S; y0 += S) {
        for (int i0 = 0; i0 < n_x;) {
            int n = 0; /* as many tiles as the strip holds */
            while (i0 + n < n_x && (n == 0 || (i0 + n) * S + T - i0 * S <= strip_w)) {
                xs[n] = (i0 + n) * S;
                n++;
            }
            memset(raw, 0xEE, (size_t)n * tile_raw);
            memset(valid, 0xEE, (size_t)n * px);
            if (tw_raster_read_tiles(b, y0, xs, n, T, raw, valid, nod, ins, &err) != TW_OK)
                fail_msg("%s: read_tiles y=%d: %s", path, y0, err.msg);
            for (int i = 0; i < n; i++) {
                int64_t n1 = -1, i1 = -1;
                assert_int_equal(tw_raster_read(a, xs[i], y0, T, T, one, one_v, &n1, &i1, &err),
                                 TW_OK);
                if (memcmp(one, raw + (size_t)i * tile_raw, tile_raw) != 0 ||
                    memcmp(one_v, valid + (size_t)i * px, px) != 0)
                    fail_msg("%s: tile x=%d y=%d (T %d, S %d, strip %d) differs from a tile read",
                             path, xs[i], y0, T, S, strip_w);
                assert_int_equal(nod[i], n1);
                assert_int_equal(ins[i], i1);
            }
            i0 += n;
        }
    }
    /* a window wider than the strip is refused, not overrun */
    int wide[2] = {0, strip_w};
    assert_int_equal(tw_raster_read_tiles(b, 0, wide, 2, T, raw, valid, nod, ins, &err),
                     TW_ERR_INTERNAL);
    free(xs);
    free(nod);
    free(ins);
    free(raw);
    free(valid);
    free(one);
    free(one_v);
    tw_raster_close(a);
    tw_raster_close(b);
}

static void test_read_tiles(void **state)
{
    (void)state;
    if (!tw_test_fixtures()) skip();
    static const int sel[] = {3, 1};
    int checked = 0;
    for (int di = 0; di < N_DTYPES; di++) {
        for (int nd = 0; nd < 2; nd++) {
            char name[128];
            snprintf(name, sizeof name, "rast_%s_tiled%s.tif", k_dtypes[di].name,
                     nd ? "_nodata" : "");
            const char *path = tw_test_fixture(name);
            if (!path) fail_msg("fixture %s missing", name);
            check_read_tiles(path, NULL, 0, 32, 32, 200);
            check_read_tiles(path, sel, 2, 24, 8, 64);
            checked++;
        }
    }
    static const char *others[] = {
        "rast_byte_striped_nodata.tif",    "rast_byte_tiled_mask.tif",
        "rast_byte_striped_alpha.tif",     "rast_direct_uint16_deflate_pred2.tif",
        "rast_direct_int16_band_zstd.tif", "rast_direct_uint16_sparse_nodata.tif"};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        const char *path = tw_test_fixture(others[i]);
        if (!path) fail_msg("fixture %s missing", others[i]);
        check_read_tiles(path, NULL, 0, 16, 16, 40);
        check_read_tiles(path, NULL, 0, 32, 16, 132);
        checked++;
    }
    assert_int_equal(checked, 2 * N_DTYPES + 6);
}

/* Readers sharing one cache of decoded tiles (tw_tiff_cache, as the
 * pipeline's reader workers do): four threads, each with its own handle,
 * read every 12 x 12 window of a tiled DEFLATE file; each thread's pixels
 * equal GDAL's, and the 35 TIFF tiles are decoded 35 times in all (not 4 x
 * 35). With a cache of one tile (every entry busy now and then) they still
 * read GDAL's pixels. */
typedef struct shared_arg {
    const char *path;
    tw_tiff_cache *cache;
    tw_raster *gdal;
    long long decoded;
    int bad;
} shared_arg;

static void *shared_reader(void *varg)
{
    shared_arg *a = varg;
    tw_raster_open_params op = {.tiff_direct = true, .shared_tiles = a->cache};
    tw_raster_open_params gop = {.tiff_direct = false};
    tw_error err;
    tw_error_init(&err);
    tw_raster *r = NULL, *g = NULL;
    if (tw_raster_open_ex(a->path, NULL, 0, &op, &r, &err) != TW_OK ||
        tw_raster_open_ex(a->path, NULL, 0, &gop, &g, &err) != TW_OK) {
        a->bad = 1;
        tw_raster_close(r);
        return NULL;
    }
    uint16_t raw[3 * 12 * 12], ref[3 * 12 * 12];
    uint8_t valid[12 * 12], ref_v[12 * 12];
    for (int y = 0; y < FH && !a->bad; y += 12)
        for (int x = 0; x < FW && !a->bad; x += 12) {
            int64_t nn, ni, rn, ri;
            if (tw_raster_read(r, x, y, 12, 12, raw, valid, &nn, &ni, &err) != TW_OK ||
                tw_raster_read(g, x, y, 12, 12, ref, ref_v, &rn, &ri, &err) != TW_OK)
                a->bad = 2;
            else if (memcmp(raw, ref, sizeof raw) != 0 || memcmp(valid, ref_v, sizeof valid) != 0 ||
                     nn != rn || ni != ri)
                a->bad = 3;
        }
    a->decoded = tw_raster_tiles_decoded(r);
    tw_raster_close(r);
    tw_raster_close(g);
    return NULL;
}

static void test_shared_tile_cache(void **state)
{
    (void)state;
    const char *path = tw_test_fixture("rast_direct_uint16_deflate_pred2.tif");
    if (!path) skip();
    for (int tiny = 0; tiny < 2; tiny++) {
        tw_tiff_cache *c = tw_tiff_cache_create(tiny ? 1 : (size_t)64 << 20, 4);
        assert_non_null(c);
        shared_arg args[4];
        pthread_t th[4];
        for (int i = 0; i < 4; i++) {
            args[i] = (shared_arg){.path = path, .cache = c};
            assert_int_equal(pthread_create(&th[i], NULL, shared_reader, &args[i]), 0);
        }
        long long decoded = 0;
        for (int i = 0; i < 4; i++) {
            assert_int_equal(pthread_join(th[i], NULL), 0);
            assert_int_equal(args[i].bad, 0);
            decoded += args[i].decoded;
        }
        print_message("shared cache %s: %lld tiles decoded by 4 readers\n",
                      tiny ? "of one tile" : "default", decoded);
        if (tiny)
            assert_true(decoded >= 35);
        else
            assert_int_equal(decoded, 35);
        tw_tiff_cache_destroy(c);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads), /* first: concurrent driver registration */
        cmocka_unit_test(test_dtype_helpers),
        cmocka_unit_test(test_fixture_windows),
        cmocka_unit_test(test_nodata_counts_nonzero),
        cmocka_unit_test(test_nan_inf),
        cmocka_unit_test(test_config_nodata),
        cmocka_unit_test(test_mask_band),
        cmocka_unit_test(test_alpha_band),
        cmocka_unit_test(test_info_matches_gdal),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_read_errors),
        cmocka_unit_test(test_direct_matches_gdal),
        cmocka_unit_test(test_direct_sparse),
        cmocka_unit_test(test_direct_cache),
        cmocka_unit_test(test_read_tiles),
        cmocka_unit_test(test_shared_tile_cache),
        cmocka_unit_test(test_shared_rasters),
        cmocka_unit_test(test_shared_warning_quiet),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
