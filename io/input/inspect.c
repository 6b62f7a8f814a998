/* inspect.c - see inspect.h */
#include "io/input/inspect.h"

#include <cpl_conv.h>
#include <gdal.h>
#include <math.h>
#include <stdint.h>
#include <ogr_srs_api.h>
#include <stdio.h>
#include <string.h>

#include "io/gdal_msgs.h"
#include "core/alloc.h"

/* Ground metres per CRS unit along x and y at the raster's centre, and the
 * unit's name; false when there is no usable CRS. */
static bool crs_metres(OGRSpatialReferenceH srs, const double gt[6], int w, int h, double *mx,
                       double *my, const char **unit)
{
    if (OSRIsGeographic(srs)) {
        char *name = NULL;
        double rad = OSRGetAngularUnits(srs, &name);
        *unit = name ? name : "degree";
        double deg = rad * 180.0 / M_PI;
        double lat = (gt[3] + gt[5] * h / 2.0 + gt[4] * w / 2.0) * deg;
        if (!(fabs(lat) <= 90)) lat = 0;
        *mx = deg * 111320.0 * cos(lat * M_PI / 180.0);
        *my = deg * 110574.0;
        return true;
    }
    if (OSRIsProjected(srs) || OSRIsLocal(srs)) {
        char *name = NULL;
        double f = OSRGetLinearUnits(srs, &name);
        *unit = name ? name : "metre";
        *mx = *my = f > 0 ? f : 1.0;
        return true;
    }
    return false;
}

/* A short name for a CRS: "EPSG:31985 (SIRGAS 2000 / UTM zone 25S)", or
 * its name alone when no authority code can be found. */
static void crs_short_name(OGRSpatialReferenceH srs, char *out, size_t size)
{
    const char *auth = OSRGetAuthorityName(srs, NULL);
    const char *code = OSRGetAuthorityCode(srs, NULL);
    OGRSpatialReferenceH guess = NULL;
    if (!auth || !code) {
        guess = OSRClone(srs);
        if (guess && OSRAutoIdentifyEPSG(guess) == OGRERR_NONE) {
            auth = OSRGetAuthorityName(guess, NULL);
            code = OSRGetAuthorityCode(guess, NULL);
        }
    }
    const char *name = OSRGetName(srs);
    if (auth && code)
        snprintf(out, size, "%s:%s (%s)", auth, code, name ? name : "unnamed");
    else
        snprintf(out, size, "%s", name ? name : "unnamed CRS");
    if (guess) OSRDestroySpatialReference(guess);
}

static GDALDatasetH open_raster(const char *path, const char *shown, tw_error *err)
{
    GDALAllRegister();
    tw_gdal_msgs m;
    tw_gdal_capture_begin(&m);
    GDALDatasetH ds = GDALOpenEx(path, GDAL_OF_RASTER | GDAL_OF_READONLY, NULL, NULL, NULL);
    tw_gdal_capture_end();
    if (!ds) {
        const char *why = tw_gdal_capture_text(&m, "");
        tw_error_set(err, TW_ERR_INPUT, "%s: not a raster GDAL can open%s%s", shown,
                     why[0] ? ": " : "", why);
    }
    return ds;
}

static void describe_crs(GDALDatasetH ds, tw_inspect *ri)
{
    snprintf(ri->crs, sizeof ri->crs, "none");
    const char *wkt = GDALGetProjectionRef(ds);
    if (!wkt || !wkt[0]) return;
    ri->has_crs = true;
    OGRSpatialReferenceH srs = OSRNewSpatialReference(NULL);
    if (srs && OSRImportFromWkt(srs, (char *[]){(char *)wkt}) == OGRERR_NONE) {
        ri->crs_understood = true;
        ri->crs_geographic = OSRIsGeographic(srs);
        crs_short_name(srs, ri->crs, sizeof ri->crs);
        snprintf(ri->crs_kind, sizeof ri->crs_kind, "%s",
                 OSRIsGeographic(srs)  ? "geographic"
                 : OSRIsProjected(srs) ? "projected"
                                       : "local");
        const char *unit = "";
        double mx = 1, my = 1;
        if (ri->has_geotransform &&
            crs_metres(srs, ri->geotransform, ri->width, ri->height, &mx, &my, &unit)) {
            ri->has_metres = true;
            snprintf(ri->crs_units, sizeof ri->crs_units, "%s", unit);
            ri->metres_x = mx;
            ri->metres_y = my;
        }
    } else {
        snprintf(ri->crs, sizeof ri->crs, "not understood");
    }
    if (srs) OSRDestroySpatialReference(srs);
}

tw_status tw_inspect_raster(const char *path, const char *shown, tw_inspect **out, tw_error *err)
{
    *out = NULL;
    GDALDatasetH ds = open_raster(path, shown, err);
    if (!ds) return TW_ERR_INPUT;
    int nb = GDALGetRasterCount(ds);
    tw_inspect *ri = tw_calloc(TW_MEM_OTHER, 1, sizeof *ri);
    tw_inspect_band *bands = tw_calloc(TW_MEM_OTHER, (size_t)(nb > 0 ? nb : 1), sizeof *bands);
    if (!ri || !bands) {
        tw_free(ri);
        tw_free(bands);
        GDALClose(ds);
        return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    /* Quiet: what GDAL says while describing is not an error of info's. */
    tw_gdal_msgs m;
    tw_gdal_capture_begin(&m);
    ri->bands = bands;
    ri->width = GDALGetRasterXSize(ds);
    ri->height = GDALGetRasterYSize(ds);
    ri->band_count = nb;
    GDALDriverH drv = GDALGetDatasetDriver(ds);
    snprintf(ri->driver, sizeof ri->driver, "%s", drv ? GDALGetDriverShortName(drv) : "?");
    ri->has_geotransform = GDALGetGeoTransform(ds, ri->geotransform) == CE_None;
    ri->metres_x = ri->metres_y = 1;
    describe_crs(ds, ri);
    const char *layout = GDALGetMetadataItem(ds, "LAYOUT", "IMAGE_STRUCTURE");
    const char *compression = GDALGetMetadataItem(ds, "COMPRESSION", "IMAGE_STRUCTURE");
    snprintf(ri->layout, sizeof ri->layout, "%s", layout ? layout : "");
    snprintf(ri->compression, sizeof ri->compression, "%s", compression ? compression : "");
    for (int i = 0; i < nb; i++) {
        tw_inspect_band *ib = &bands[i];
        GDALRasterBandH b = GDALGetRasterBand(ds, i + 1);
        int has_nd = 0;
        GDALGetBlockSize(b, &ib->block_w, &ib->block_h);
        ib->nodata = GDALGetRasterNoDataValue(b, &has_nd);
        ib->has_nodata = has_nd != 0;
        snprintf(ib->type, sizeof ib->type, "%s", GDALGetDataTypeName(GDALGetRasterDataType(b)));
        const char *desc = GDALGetDescription(b);
        snprintf(ib->description, sizeof ib->description, "%s", desc ? desc : "");
        snprintf(ib->color, sizeof ib->color, "%s",
                 GDALGetColorInterpretationName(GDALGetRasterColorInterpretation(b)));
        ib->overviews = GDALGetOverviewCount(b);
        double mean, sd;
        ib->min = ib->max = NAN;
        ib->has_stats =
            GDALGetRasterStatistics(b, TRUE, FALSE, &ib->min, &ib->max, &mean, &sd) == CE_None;
    }
    tw_gdal_capture_end();
    GDALClose(ds);
    *out = ri;
    return TW_OK;
}

void tw_inspect_destroy(tw_inspect *ri)
{
    if (!ri) return;
    tw_free(ri->bands);
    tw_free(ri);
}

bool tw_inspect_pixel_metres(const tw_inspect *ri, double *px, double *py)
{
    if (!ri->has_metres) return false;
    const double *gt = ri->geotransform;
    *px = hypot(gt[1], gt[4]) * ri->metres_x;
    *py = hypot(gt[2], gt[5]) * ri->metres_y;
    return true;
}

/* Mean, sd, min and max of band b from up to TW_INSPECT_SAMPLES windows
 * (see tw_inspect_band_stats); false when no valid pixel was read. */
static bool sample_band(GDALRasterBandH b, tw_band_stats *s)
{
    int W = GDALGetRasterBandXSize(b), H = GDALGetRasterBandYSize(b), bw = 0, bh = 0;
    GDALGetBlockSize(b, &bw, &bh);
    int ww = W < 256 ? W : 256, wh = H < 256 ? H : 256;
    int has_nodata = 0;
    double nodata = GDALGetRasterNoDataValue(b, &has_nodata);
    int mflags = GDALGetMaskFlags(b);
    GDALRasterBandH mask = (mflags & (GMF_ALL_VALID | GMF_NODATA))
                               ? NULL
                               : GDALGetMaskBand(b); /* alpha, per dataset */
    double *px = tw_alloc(TW_MEM_OTHER, (size_t)ww * (size_t)wh * sizeof(double));
    uint8_t *valid = mask ? tw_alloc(TW_MEM_OTHER, (size_t)ww * (size_t)wh) : NULL;
    double sum = 0, sum2 = 0, lo = INFINITY, hi = -INFINITY, shift = NAN;
    long long n = 0;
    /* a raster of TW_INSPECT_SAMPLES windows or fewer is read whole */
    int nx = (int)(((long long)W + 255) / 256), ny = (int)(((long long)H + 255) / 256);
    bool whole = (long long)nx * ny <= TW_INSPECT_SAMPLES;
    int n_win = whole ? nx * ny : TW_INSPECT_SAMPLES;
    for (int g = 0; px && (!mask || valid) && g < n_win; g++) {
        int x0, y0, cw = ww, ch = wh;
        if (whole) {
            x0 = g % nx * 256;
            y0 = g / nx * 256;
            cw = W - x0 < 256 ? W - x0 : 256;
            ch = H - y0 < 256 ? H - y0 : 256;
        } else {
            /* the centre of cell g of an 8 x 8 grid; its window
             * block-aligned when blocks are no larger than the window */
            int cx = (int)(((double)(g % 8) + 0.5) * W / 8);
            int cy = (int)(((double)(g / 8) + 0.5) * H / 8);
            x0 = cx - ww / 2;
            y0 = cy - wh / 2;
            if (bw > 0 && bw <= ww) x0 = cx / bw * bw;
            if (bh > 0 && bh <= wh) y0 = cy / bh * bh;
            x0 = x0 < 0 ? 0 : x0 > W - ww ? W - ww : x0;
            y0 = y0 < 0 ? 0 : y0 > H - wh ? H - wh : y0;
            if ((ww == W && g % 8) || (wh == H && g / 8)) continue; /* the same window again */
        }
        if (GDALRasterIO(b, GF_Read, x0, y0, cw, ch, px, cw, ch, GDT_Float64, 0, 0) != CE_None)
            continue;
        if (mask &&
            GDALRasterIO(mask, GF_Read, x0, y0, cw, ch, valid, cw, ch, GDT_Byte, 0, 0) != CE_None)
            continue;
        for (size_t k = 0; k < (size_t)cw * (size_t)ch; k++) {
            double v = px[k];
            if (!isfinite(v) || (has_nodata && v == nodata) || (mask && !valid[k])) continue;
            if (isnan(shift)) shift = v; /* sums about the first value: no cancellation */
            double d = v - shift;
            sum += d;
            sum2 += d * d;
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
            n++;
        }
    }
    tw_free(px);
    tw_free(valid);
    if (n == 0) return false;
    double m = sum / (double)n, var = sum2 / (double)n - m * m;
    s->mean = shift + m;
    s->sd = var > 0 ? sqrt(var) : 0;
    s->min = lo;
    s->max = hi;
    return true;
}

tw_status tw_inspect_band_stats(const char *path, const int *bands, int n, tw_band_stats *out,
                                tw_error *err)
{
    GDALDatasetH ds = open_raster(path, path, err);
    if (!ds) return TW_ERR_INPUT;
    for (int i = 0; i < n; i++) {
        tw_band_stats *s = &out[i];
        memset(s, 0, sizeof *s);
        GDALRasterBandH b = bands[i] >= 1 && bands[i] <= GDALGetRasterCount(ds)
                                ? GDALGetRasterBand(ds, bands[i])
                                : NULL;
        if (!b) continue;
        s->how = "";
        tw_gdal_msgs m;
        tw_gdal_capture_begin(&m);
        CPLErr e = GDALGetRasterStatistics(b, TRUE, FALSE, &s->min, &s->max, &s->mean, &s->sd);
        tw_gdal_capture_end();
        if (e == CE_None && isfinite(s->min) && isfinite(s->max) && isfinite(s->mean) &&
            isfinite(s->sd)) {
            s->how = "statistics";
            s->ok = true;
            continue;
        }
        tw_gdal_capture_begin(&m);
        bool got = sample_band(b, s);
        tw_gdal_capture_end();
        if (got) {
            s->how = "sampled";
            s->ok = true;
        }
    }
    GDALClose(ds);
    return TW_OK;
}
