/* test_resample.c - output.resolution: input (io/output/resample.c): the cell
 * grid's probabilities resampled bilinearly onto the input's pixel grid,
 * against an independent double-precision reference.
 *
 * The reference: output pixel (x, y) has its centre at input pixel
 * coordinates (x + 0.5, y + 0.5), which is (x + 0.5) / S - 0.5 cells from
 * the centre of cell column 0 (S input pixels a cell). Bilinear weights
 * over the four cells around it; cells outside the grid or nodata (-1) are
 * left out and the others' weights renormalized (resample.h: "nodata cells
 * are left out of the interpolation"), and a pixel whose own cell is nodata
 * stays nodata (GDAL's warper samples only where the source pixel under the
 * point is valid). The class map is the argmax of the
 * resampled probabilities, so at a cell's centre it is that cell's class.
 *
 * Tolerance: GDAL interpolates in double and stores float32, and its
 * weights at pixel centres are exact multiples of 1/(2S): 1e-6 on values
 * in [0, 1].
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gdal.h>

#include "io/output/resample.h"
#include "io/output/writer.h"
#include "tests/testutil.h"

#define TOL 1e-6
enum { C = 3, GW = 7, GH = 5, S = 4, W = GW * S - 2, H = GH * S - 1 };

/* Cell (i, j)'s probabilities, or nodata (-1 in every band) for a few. */
static bool cell_nodata(int i, int j)
{
    return (i == 2 && j == 3) || (i == 0 && j == 6);
}
static void cell_probs(int i, int j, double *p)
{
    double v[C] = {1.0 + i + 0.5 * j, 2.0 + ((i * 3 + j) % 4), 0.5 + j * j * 0.25}, sum = 0;
    for (int q = 0; q < C; q++) sum += v[q];
    for (int q = 0; q < C; q++) p[q] = v[q] / sum;
}

/* The cell grid as the run writes it: float32, C bands, nodata -1, its
 * geotransform the input's scaled by S. */
static void write_cells(const char *path, const double gt_in[6])
{
    GDALDriverH drv = GDALGetDriverByName("GTiff");
    GDALDatasetH ds = GDALCreate(drv, path, GW, GH, C, GDT_Float32, NULL);
    assert_non_null(ds);
    double gt[6] = {gt_in[0], gt_in[1] * S, 0, gt_in[3], 0, gt_in[5] * S};
    GDALSetGeoTransform(ds, gt);
    float band[GH][GW];
    for (int q = 0; q < C; q++) {
        for (int i = 0; i < GH; i++)
            for (int j = 0; j < GW; j++) {
                double p[C];
                cell_probs(i, j, p);
                band[i][j] = cell_nodata(i, j) ? -1.0f : (float)p[q];
            }
        GDALRasterBandH b = GDALGetRasterBand(ds, q + 1);
        GDALSetRasterNoDataValue(b, -1);
        assert_int_equal(GDALRasterIO(b, GF_Write, 0, 0, GW, GH, band, GW, GH, GDT_Float32, 0, 0),
                         CE_None);
    }
    GDALClose(ds);
}

/* The reference value of output pixel (x, y): false when nodata. */
static bool reference(int x, int y, double *out)
{
    if (cell_nodata(y / S, x / S)) return false; /* the pixel's own cell */
    double u = (x + 0.5) / S - 0.5, v = (y + 0.5) / S - 0.5;
    int j0 = (int)floor(u), i0 = (int)floor(v);
    double fu = u - j0, fv = v - i0, wsum = 0;
    for (int q = 0; q < C; q++) out[q] = 0;
    for (int di = 0; di <= 1; di++)
        for (int dj = 0; dj <= 1; dj++) {
            int i = i0 + di, j = j0 + dj;
            double w = (di ? fv : 1 - fv) * (dj ? fu : 1 - fu);
            if (i < 0 || i >= GH || j < 0 || j >= GW || cell_nodata(i, j) || w == 0) continue;
            double p[C];
            cell_probs(i, j, p);
            for (int q = 0; q < C; q++) out[q] += w * p[q];
            wsum += w;
        }
    if (wsum == 0) return false;
    for (int q = 0; q < C; q++) out[q] /= wsum;
    return true;
}

static float *read_all(const char *path, int *bands)
{
    GDALDatasetH ds = GDALOpen(path, GA_ReadOnly);
    if (!ds) fail_msg("cannot open %s", path);
    assert_int_equal(GDALGetRasterXSize(ds), W);
    assert_int_equal(GDALGetRasterYSize(ds), H);
    *bands = GDALGetRasterCount(ds);
    float *v = malloc(sizeof(float) * (size_t)W * H * (size_t)*bands);
    assert_non_null(v);
    assert_int_equal(
        GDALDatasetRasterIO(ds, GF_Read, 0, 0, W, H, v, W, H, GDT_Float32, *bands, NULL, 0, 0, 0),
        CE_None);
    GDALClose(ds);
    return v;
}

static void test_bilinear_against_reference(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    char cells[600], prob[600], cls[600];
    snprintf(cells, sizeof cells, "%s/cells.prob.tif", dir);
    const double gt[6] = {500000.0, 30.0, 0, 4000000.0, 0, -30.0};
    write_cells(cells, gt);
    tw_writer_params wp = {
        .dir = dir,
        .stem = "scene",
        .grid_w = W,
        .grid_h = H,
        .geotransform = {gt[0], gt[1], gt[2], gt[3], gt[4], gt[5]},
        .n_classes = C,
        .products = TW_PRODUCT_CLASS | TW_PRODUCT_PROB,
        .prob_type = TW_PROB_FLOAT32,
        .format = TW_FORMAT_GTIFF,
    };
    int64_t hist[C] = {0}, nodata = 0;
    tw_error err;
    tw_error_init(&err);
    if (tw_resample_to_input(cells, &wp, NULL, hist, &nodata, NULL, &err) != TW_OK)
        fail_msg("%s", err.msg);
    tw_writer_product_path(dir, "scene", "prob", prob, sizeof prob);
    tw_writer_product_path(dir, "scene", "class", cls, sizeof cls);
    int nb = 0, nc = 0;
    float *p = read_all(prob, &nb), *k = read_all(cls, &nc);
    assert_int_equal(nb, C);
    assert_int_equal(nc, 1);
    int64_t want_hist[C] = {0}, want_nodata = 0, ambiguous = 0;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            double r[C];
            bool valid = reference(x, y, r);
            size_t px = (size_t)y * W + x;
            if (!valid) {
                want_nodata++;
                for (int q = 0; q < C; q++) assert_true(p[(size_t)q * W * H + px] == -1.0f);
                assert_int_equal((int)k[px], 255);
                continue;
            }
            int best = 0;
            for (int q = 0; q < C; q++) {
                double got = p[(size_t)q * W * H + px];
                if (fabs(got - r[q]) > TOL)
                    fail_msg("pixel (%d, %d) class %d: %.9g, reference %.9g", x, y, q, got, r[q]);
                if (r[q] > r[best]) best = q;
            }
            bool tie = false;
            for (int q = 0; q < C; q++) tie = tie || (q != best && r[best] - r[q] < 2 * TOL);
            if (tie) {
                ambiguous++;
            } else if ((int)k[px] != best) {
                fail_msg("pixel (%d, %d): class %d, argmax of the reference %d", x, y, (int)k[px],
                         best);
            }
            want_hist[best]++;
        }
    assert_true(want_nodata > 0); /* the case has nodata pixels (around cell (0, 6)) */
    assert_int_equal(nodata, want_nodata);
    for (int q = 0; q < C; q++) assert_true(llabs(hist[q] - want_hist[q]) <= ambiguous);
    /* at each cell centre (x = j*S + S/2 - 0.5 is not a pixel centre for
     * even S: the four pixels around it average to it) the class map is
     * the cell's class: checked through the reference above */
    free(p);
    free(k);
}

/* A rotated input is refused, naming output.resolution. */
static void test_rotated_refused(void **state)
{
    (void)state;
    tw_writer_params wp = {.dir = tw_test_tmpdir(),
                           .stem = "rot",
                           .grid_w = 8,
                           .grid_h = 8,
                           .geotransform = {0, 1, 0.2, 0, 0.1, -1},
                           .n_classes = C,
                           .products = TW_PRODUCT_CLASS};
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_resample_to_input("/nonexistent.tif", &wp, NULL, NULL, NULL, NULL, &err),
                     TW_ERR_CONFIG);
    assert_non_null(strstr(err.msg, "output.resolution"));
}

/* A cell grid that cannot be opened: an output error naming it. */
static void test_missing_cells(void **state)
{
    (void)state;
    tw_writer_params wp = {.dir = tw_test_tmpdir(),
                           .stem = "gone",
                           .grid_w = 8,
                           .grid_h = 8,
                           .geotransform = {0, 1, 0, 0, 0, -1},
                           .n_classes = C,
                           .products = TW_PRODUCT_CLASS};
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(
        tw_resample_to_input("/nonexistent/cells.tif", &wp, NULL, NULL, NULL, NULL, &err),
        TW_ERR_OUTPUT);
    assert_non_null(strstr(err.msg, "/nonexistent/cells.tif"));
}

int main(void)
{
    GDALAllRegister();
    CPLSetErrorHandler(CPLQuietErrorHandler);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bilinear_against_reference),
        cmocka_unit_test(test_rotated_refused),
        cmocka_unit_test(test_missing_cells),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
