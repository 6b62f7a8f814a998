/* inspect.c - see inspect.h */
#include "io/inspect.h"

#include <cpl_conv.h>
#include <gdal.h>
#include <math.h>
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

tw_status tw_inspect_band_ranges(const char *path, const int *bands, int n, double *lo, double *hi,
                                 const char **how, bool *ok, tw_error *err)
{
    GDALDatasetH ds = open_raster(path, path, err);
    if (!ds) return TW_ERR_INPUT;
    for (int i = 0; i < n; i++) {
        ok[i] = false;
        how[i] = NULL;
        GDALRasterBandH b = GDALGetRasterBand(ds, bands[i]);
        if (!b) continue;
        how[i] = "";
        tw_gdal_msgs m;
        tw_gdal_capture_begin(&m);
        double mean, sd;
        CPLErr e = GDALGetRasterStatistics(b, TRUE, FALSE, &lo[i], &hi[i], &mean, &sd);
        tw_gdal_capture_end();
        if (e == CE_None) {
            how[i] = "statistics";
            ok[i] = true;
            continue;
        }
        double mm[2] = {NAN, NAN};
        tw_gdal_capture_begin(&m);
        GDALComputeRasterMinMax(b, TRUE, mm);
        tw_gdal_capture_end();
        if (m.failures || !isfinite(mm[0]) || !isfinite(mm[1])) continue;
        lo[i] = mm[0];
        hi[i] = mm[1];
        how[i] = "approximate scan";
        ok[i] = true;
    }
    GDALClose(ds);
    return TW_OK;
}
