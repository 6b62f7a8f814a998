/* resample.c - see resample.h */
#include "io/output/resample.h"

#include <stdio.h>
#include <string.h>

#include <cpl_error.h>
#include <cpl_string.h>
#include <gdal.h>
#include <gdal_utils.h>

#include "core/alloc.h"
#include "core/argmax.h"
#include "io/gdal_msgs.h"

/* The cell grid's probabilities (cells_prob) warped onto the input's grid,
 * as a VRT (*vrt, over *src): output pixel (x, y) samples the cell grid at
 * its own centre, bilinear. */
static tw_status warp_to_input(const char *cells_prob, const double *gt, int W, int H,
                               GDALDatasetH *src_out, GDALDatasetH *vrt_out, tw_error *err)
{
    tw_gdal_msgs msg;
    tw_gdal_capture_begin(&msg);
    GDALDatasetH src = GDALOpen(cells_prob, GA_ReadOnly);
    GDALDatasetH vrt = NULL;
    tw_status st = TW_OK;
    if (!src) {
        st = tw_error_set(err, TW_ERR_OUTPUT, "cannot reopen %s: %s", cells_prob, msg.failure);
    } else {
        /* The input's extent at its size: output pixel (x, y) samples the
         * cell grid at its own centre. */
        char te[4][40], ts[2][24];
        snprintf(te[0], sizeof te[0], "%.17g", gt[0]);
        snprintf(te[1], sizeof te[1], "%.17g", gt[3] + gt[5] * H);
        snprintf(te[2], sizeof te[2], "%.17g", gt[0] + gt[1] * W);
        snprintf(te[3], sizeof te[3], "%.17g", gt[3]);
        snprintf(ts[0], sizeof ts[0], "%d", W);
        snprintf(ts[1], sizeof ts[1], "%d", H);
        char *argv[] = {"-of", "VRT", "-r",  "bilinear", "-srcnodata", "-1",  "-dstnodata",
                        "-1",  "-te", te[0], te[1],      te[2],        te[3], "-ts",
                        ts[0], ts[1], "-ot", "Float32",  NULL};
        GDALWarpAppOptions *o = GDALWarpAppOptionsNew(argv, NULL);
        int usage = 0;
        vrt = o ? GDALWarp("", NULL, 1, &src, o, &usage) : NULL;
        GDALWarpAppOptionsFree(o);
        if (!vrt)
            st = tw_error_set(err, TW_ERR_OUTPUT, "cannot resample %s to the input's grid: %s",
                              cells_prob, msg.failure);
    }
    tw_gdal_capture_end();
    *src_out = src;
    *vrt_out = vrt;
    return st;
}

/* The input reopened (its nodata rule as the run's) for its nodata pixels,
 * with strips of rows rows for its values (*raw) and validity (*valid); it
 * must still be W x H. */
static tw_status open_input(const tw_resample_input *in, int W, int H, int rows, tw_raster **src_in,
                            void **raw, uint8_t **valid, tw_error *err)
{
    tw_raster_open_params op = {.tiff_direct = false};
    tw_status st = tw_raster_open_ex(in->path, in->bands, in->n_bands, &op, src_in, err);
    if (st != TW_OK) return st;
    const tw_raster_info *ri = tw_raster_get_info(*src_in);
    tw_raster_set_nodata_rule(*src_in, in->nodata_auto, in->nodata);
    if (ri->width != W || ri->height != H)
        st = tw_error_set(err, TW_ERR_INPUT, "%s is %d x %d now, the run read %d x %d", in->path,
                          ri->width, ri->height, W, H);
    *raw = tw_alloc(TW_MEM_STRIP, (size_t)rows * (size_t)W *
                                      (size_t)tw_raster_selected_bands(*src_in) *
                                      tw_dtype_size(ri->dtype));
    *valid = tw_alloc(TW_MEM_STRIP, (size_t)rows * (size_t)W);
    if (st == TW_OK && (!*raw || !*valid)) st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    return st;
}

/* Which of n pixels have a class (has[]: not nodata in the cells, nor in the
 * input when valid says), counted into hist, nodata_pixels and
 * unclassified (each when not NULL). */
static void mark_pixels(const float *probs, uint8_t *has, const uint8_t *valid, size_t n, int C,
                        int64_t *hist, int64_t *nodata_pixels, int64_t *unclassified)
{
    for (size_t q = 0; q < n; q++) {
        const float *p = probs + q * (size_t)C;
        has[q] = p[0] >= 0.0f; /* nodata is -1 in every band */
        if (valid && !valid[q]) {
            has[q] = 0; /* nodata in the input: nodata in every product */
        } else if (valid && !has[q] && unclassified) {
            (*unclassified)++;
        }
        if (!has[q]) {
            if (nodata_pixels) (*nodata_pixels)++;
            continue;
        }
        if (hist) hist[tw_argmax(p, (size_t)C)]++;
    }
}

tw_status tw_resample_to_input(const char *cells_prob, const tw_writer_params *wp,
                               const tw_resample_input *in, int64_t *hist, int64_t *nodata_pixels,
                               int64_t *unclassified, tw_error *err)
{
    const double *gt = wp->geotransform;
    if (gt[2] != 0.0 || gt[4] != 0.0)
        return tw_error_set(err, TW_ERR_CONFIG,
                            "output.resolution: input needs a north-up raster (its geotransform "
                            "is rotated); use output.resolution: cells");
    const int W = wp->grid_w, H = wp->grid_h, C = wp->n_classes;
    GDALDatasetH src = NULL, vrt = NULL;
    tw_status st = warp_to_input(cells_prob, gt, W, H, &src, &vrt, err);

    /* Strips of about 8 MiB of probabilities. */
    int rows = (int)((8u << 20) / ((size_t)W * (size_t)C * sizeof(float) + 1));
    if (rows < 1) rows = 1;
    if (rows > H) rows = H;
    float *probs = NULL;
    uint8_t *has = NULL, *valid = NULL;
    void *raw = NULL;
    tw_writer *w = NULL;
    tw_raster *src_in = NULL;
    if (st == TW_OK && in && in->path) st = open_input(in, W, H, rows, &src_in, &raw, &valid, err);
    if (st == TW_OK) {
        probs = tw_alloc(TW_MEM_STRIP, (size_t)rows * (size_t)W * (size_t)C * sizeof(float));
        has = tw_alloc(TW_MEM_STRIP, (size_t)rows * (size_t)W);
        if (!probs || !has) st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    if (st == TW_OK) st = tw_writer_create(wp, &w, err);
    tw_gdal_msgs msg;
    for (int r = 0; st == TW_OK && r < H; r += rows) {
        int n = H - r < rows ? H - r : rows;
        tw_gdal_capture_begin(&msg);
        CPLErr e = GDALDatasetRasterIO(vrt, GF_Read, 0, r, W, n, probs, W, n, GDT_Float32, C, NULL,
                                       (int)(C * sizeof(float)), (GSpacing)W * C * sizeof(float),
                                       sizeof(float));
        tw_gdal_capture_end();
        if (e != CE_None) {
            st = tw_error_set(err, TW_ERR_OUTPUT, "cannot resample rows %d..%d of %s: %s", r,
                              r + n - 1, cells_prob, msg.failure);
            break;
        }
        if (src_in) {
            int64_t n_nodata = 0, n_inside = 0;
            st = tw_raster_read(src_in, 0, r, W, n, raw, valid, &n_nodata, &n_inside, err);
            if (st != TW_OK) break;
        }
        mark_pixels(probs, has, valid, (size_t)n * W, C, hist, nodata_pixels, unclassified);
        st = tw_writer_write_rows(w, r, n, probs, has, err);
    }
    if (st == TW_OK) st = tw_writer_finish(w, err);
    tw_writer_destroy(w);
    tw_free(probs);
    tw_free(has);
    tw_free(raw);
    tw_free(valid);
    tw_raster_close(src_in);
    if (vrt) GDALClose(vrt);
    if (src) GDALClose(src);
    return st;
}
