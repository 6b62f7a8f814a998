/* aoi.c - see aoi.h */
#include "io/aoi.h"

#include <stdio.h>
#include <string.h>

#include <cpl_error.h>
#include <cpl_string.h>
#include <gdal.h>
#include <gdal_alg.h>
#include <ogr_api.h>
#include <ogr_srs_api.h>

#include "core/alloc.h"
#include "io/gdal_msgs.h"

/* The cell grid's cap: its summed-area table (4 bytes a cell) is what an
 * AOI keeps through the run, 16 MiB at most, whatever the raster's size
 * (a byte per tile, as it was, took 97 GB for a 10^7 x 10^7 raster). */
#define AOI_MAX_CELLS ((int64_t)4 << 20)

struct tw_aoi {
    int n_x, n_y, tile, cell;
    int64_t gw, gh;
    int *x0, *y0;  /* [n_x], [n_y]: the tiles' origins (a copy) */
    uint32_t *sat; /* [gh + 1][gw + 1]: set cells above and left of each corner */
    int64_t count;
};

/* Cells [*c0, *c1) a tile at pos covers along an axis of n cells. */
static void cell_span(int64_t pos, int tile, int cell, int64_t n, int64_t *c0, int64_t *c1)
{
    *c0 = pos / cell;
    *c1 = (pos + tile + cell - 1) / cell;
    if (*c0 < 0) *c0 = 0;
    if (*c1 > n) *c1 = n;
}

static bool any_set(const tw_aoi *a, int64_t r0, int64_t r1, int64_t c0, int64_t c1)
{
    if (r1 <= r0 || c1 <= c0) return false;
    const int64_t w = a->gw + 1;
    return a->sat[r1 * w + c1] - a->sat[r0 * w + c1] - a->sat[r1 * w + c0] + a->sat[r0 * w + c0] >
           0;
}

/* Consecutive tiles of an axis that cover the same cells, as runs: a
 * huge raster's coarse grid gives about two runs a cell, so counting the
 * tiles inside takes runs_x x runs_y queries, not n_x x n_y. Returns the
 * number of runs (<= n); lo/hi/mult are [n]. */
static int64_t spans_of(const int *pos, int n, int tile, int cell, int64_t cells, int64_t *lo,
                        int64_t *hi, int64_t *mult)
{
    int64_t k = 0;
    for (int i = 0; i < n; i++) {
        int64_t c0, c1;
        cell_span(pos[i], tile, cell, cells, &c0, &c1);
        if (k > 0 && lo[k - 1] == c0 && hi[k - 1] == c1) {
            mult[k - 1]++;
            continue;
        }
        lo[k] = c0, hi[k] = c1, mult[k] = 1;
        k++;
    }
    return k;
}

/* Every geometry of every layer, cloned and reprojected into raster_srs
 * (NULL: no CRS; the geometries are taken as they are). */
static tw_status collect(GDALDatasetH ds, const char *path, OGRSpatialReferenceH raster_srs,
                         OGRGeometryH **geoms, int *n, tw_error *err)
{
    int cap = 0;
    *n = 0;
    *geoms = NULL;
    for (int l = 0; l < GDALDatasetGetLayerCount(ds); l++) {
        OGRLayerH layer = GDALDatasetGetLayer(ds, l);
        OGRSpatialReferenceH lsrs = OGR_L_GetSpatialRef(layer);
        OGRCoordinateTransformationH ct = NULL;
        if (lsrs && raster_srs && !OSRIsSame(lsrs, raster_srs)) {
            OGRSpatialReferenceH src = OSRClone(lsrs);
            OSRSetAxisMappingStrategy(src, OAMS_TRADITIONAL_GIS_ORDER);
            ct = OCTNewCoordinateTransformation(src, raster_srs);
            OSRDestroySpatialReference(src);
            if (!ct)
                return tw_error_set(err, TW_ERR_INPUT,
                                    "input.aoi: %s: cannot reproject layer %s to the raster's CRS",
                                    path, OGR_L_GetName(layer));
        } else if (lsrs && !raster_srs) {
            return tw_error_set(err, TW_ERR_INPUT,
                                "input.aoi: %s has a CRS but the raster has none: cannot place the "
                                "area of interest on it",
                                path);
        }
        OGR_L_ResetReading(layer);
        OGRFeatureH f;
        tw_status st = TW_OK;
        while (st == TW_OK && (f = OGR_L_GetNextFeature(layer)) != NULL) {
            OGRGeometryH g = OGR_F_GetGeometryRef(f);
            if (g && !OGR_G_IsEmpty(g)) {
                OGRGeometryH c = OGR_G_Clone(g);
                if (ct && OGR_G_Transform(c, ct) != OGRERR_NONE) {
                    OGR_G_DestroyGeometry(c);
                    st = tw_error_set(err, TW_ERR_INPUT,
                                      "input.aoi: %s: feature %lld cannot be reprojected to the "
                                      "raster's CRS",
                                      path, (long long)OGR_F_GetFID(f));
                } else {
                    if (*n == cap) {
                        int nc = cap ? 2 * cap : 64;
                        OGRGeometryH *ng = tw_alloc(TW_MEM_OTHER, sizeof *ng * (size_t)nc);
                        if (!ng) {
                            OGR_G_DestroyGeometry(c);
                            st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
                        } else {
                            if (*geoms) memcpy(ng, *geoms, sizeof *ng * (size_t)*n);
                            tw_free(*geoms);
                            *geoms = ng;
                            cap = nc;
                        }
                    }
                    if (st == TW_OK) (*geoms)[(*n)++] = c;
                }
            }
            OGR_F_Destroy(f);
        }
        if (ct) OCTDestroyCoordinateTransformation(ct);
        if (st != TW_OK) return st;
    }
    return TW_OK;
}

tw_status tw_aoi_create(const char *path, const tw_raster_info *info, const tw_aoi_geometry *g,
                        tw_aoi **out, tw_error *err)
{
    *out = NULL;
    if (!GDALGetDriverByName("MEM")) GDALAllRegister();
    tw_gdal_msgs msg;
    tw_gdal_capture_begin(&msg);
    GDALDatasetH ds = GDALOpenEx(path, GDAL_OF_VECTOR | GDAL_OF_READONLY, NULL, NULL, NULL);
    tw_gdal_capture_end();
    if (!ds)
        return tw_error_set(err, TW_ERR_INPUT, "input.aoi: cannot open %s as a vector file%s%s",
                            path, msg.failure[0] ? ": " : "", msg.failure);

    OGRSpatialReferenceH rsrs = NULL;
    if (info->crs_wkt[0]) {
        rsrs = OSRNewSpatialReference(NULL);
        if (OSRImportFromWkt(rsrs, (char *[]){(char *)info->crs_wkt}) != OGRERR_NONE) {
            OSRDestroySpatialReference(rsrs);
            rsrs = NULL;
        } else {
            OSRSetAxisMappingStrategy(rsrs, OAMS_TRADITIONAL_GIS_ORDER);
        }
    }
    OGRGeometryH *geoms = NULL;
    int n_geoms = 0;
    tw_status st = collect(ds, path, rsrs, &geoms, &n_geoms, err);
    if (st == TW_OK && n_geoms == 0)
        st = tw_error_set(err, TW_ERR_INPUT, "input.aoi: %s holds no geometry", path);

    /* The cell grid: stride pixels per cell, coarser for huge rasters. */
    int cell = g->stride > 0 ? g->stride : g->tile;
    int64_t gw = 0, gh = 0;
    for (;;) {
        gw = ((int64_t)info->width + cell - 1) / cell;
        gh = ((int64_t)info->height + cell - 1) / cell;
        if (gw * gh <= AOI_MAX_CELLS) break;
        cell *= 2;
    }
    tw_aoi *a = NULL;
    uint8_t *cells = NULL;
    uint32_t *sat = NULL;
    GDALDatasetH mem = NULL;
    if (st == TW_OK) {
        a = tw_calloc(TW_MEM_OTHER, 1, sizeof *a);
        cells = tw_calloc(TW_MEM_OTHER, (size_t)(gw * gh), 1);
        sat = tw_calloc(TW_MEM_OTHER, (size_t)((gw + 1) * (gh + 1)), sizeof *sat);
        if (a) {
            a->x0 = tw_alloc(TW_MEM_OTHER, sizeof(int) * ((size_t)g->n_x + (size_t)g->n_y + 1));
            a->y0 = a->x0 ? a->x0 + g->n_x : NULL;
        }
        if (!a || !cells || !sat || !a->x0)
            st = tw_error_set(err, TW_ERR_NOMEM, "input.aoi: out of memory");
    }
    if (st == TW_OK) {
        GDALDriverH drv = GDALGetDriverByName("MEM");
        mem = drv ? GDALCreate(drv, "", (int)gw, (int)gh, 1, GDT_Byte, NULL) : NULL;
        if (!mem) st = tw_error_set(err, TW_ERR_INTERNAL, "input.aoi: cannot make a MEM raster");
    }
    if (st == TW_OK) {
        const double *t = info->geotransform;
        double gt[6] = {t[0], t[1] * cell, t[2] * cell, t[3], t[4] * cell, t[5] * cell};
        GDALSetGeoTransform(mem, gt);
        if (info->crs_wkt[0]) GDALSetProjection(mem, info->crs_wkt);
        int band = 1;
        double *burn = tw_alloc(TW_MEM_OTHER, sizeof(double) * (size_t)n_geoms);
        if (!burn) {
            st = tw_error_set(err, TW_ERR_NOMEM, "input.aoi: out of memory");
        } else {
            for (int i = 0; i < n_geoms; i++) burn[i] = 1.0;
            char **ropts = CSLSetNameValue(NULL, "ALL_TOUCHED", "TRUE");
            tw_gdal_capture_begin(&msg);
            CPLErr e = GDALRasterizeGeometries(mem, 1, &band, n_geoms, geoms, NULL, NULL, burn,
                                               ropts, NULL, NULL);
            tw_gdal_capture_end();
            CSLDestroy(ropts);
            tw_free(burn);
            if (e != CE_None)
                st = tw_error_set(err, TW_ERR_INPUT, "input.aoi: %s: cannot rasterize: %s", path,
                                  msg.failure);
        }
    }
    if (st == TW_OK && GDALRasterIO(GDALGetRasterBand(mem, 1), GF_Read, 0, 0, (int)gw, (int)gh,
                                    cells, (int)gw, (int)gh, GDT_Byte, 0, 0) != CE_None)
        st = tw_error_set(err, TW_ERR_INTERNAL, "input.aoi: cannot read the rasterized cells");
    if (mem) GDALClose(mem);
    if (st == TW_OK) {
        /* Summed-area table: any cell set in a tile's rectangle, in O(1). */
        for (int64_t r = 0; r < gh; r++)
            for (int64_t c = 0; c < gw; c++)
                sat[(r + 1) * (gw + 1) + c + 1] =
                    (cells[r * gw + c] != 0) + sat[r * (gw + 1) + c + 1] +
                    sat[(r + 1) * (gw + 1) + c] - sat[r * (gw + 1) + c];
        a->n_x = g->n_x;
        a->n_y = g->n_y;
        a->tile = g->tile;
        a->cell = cell;
        a->gw = gw;
        a->gh = gh;
        a->sat = sat;
        sat = NULL;
        memcpy(a->x0, g->x0, sizeof(int) * (size_t)g->n_x);
        memcpy(a->y0, g->y0, sizeof(int) * (size_t)g->n_y);
        int64_t *runs =
            tw_alloc(TW_MEM_OTHER, 3 * sizeof(int64_t) * ((size_t)g->n_x + (size_t)g->n_y));
        if (!runs) {
            st = tw_error_set(err, TW_ERR_NOMEM, "input.aoi: out of memory");
        } else {
            int64_t *xl = runs, *xh = xl + g->n_x, *xm = xh + g->n_x;
            int64_t *yl = xm + g->n_x, *yh = yl + g->n_y, *ym = yh + g->n_y;
            int64_t nx = spans_of(g->x0, g->n_x, g->tile, cell, gw, xl, xh, xm);
            int64_t ny = spans_of(g->y0, g->n_y, g->tile, cell, gh, yl, yh, ym);
            for (int64_t r = 0; r < ny; r++)
                for (int64_t c = 0; c < nx; c++)
                    if (any_set(a, yl[r], yh[r], xl[c], xh[c])) a->count += ym[r] * xm[c];
            tw_free(runs);
        }
    }
    for (int i = 0; i < n_geoms; i++) OGR_G_DestroyGeometry(geoms[i]);
    tw_free(geoms);
    tw_free(cells);
    tw_free(sat);
    if (rsrs) OSRDestroySpatialReference(rsrs);
    GDALClose(ds);
    if (st != TW_OK) {
        tw_aoi_destroy(a);
        return st;
    }
    *out = a;
    return TW_OK;
}

bool tw_aoi_tile(const tw_aoi *a, int tx, int ty)
{
    if (!a || tx < 0 || ty < 0 || tx >= a->n_x || ty >= a->n_y) return false;
    int64_t r0, r1, c0, c1;
    cell_span(a->y0[ty], a->tile, a->cell, a->gh, &r0, &r1);
    cell_span(a->x0[tx], a->tile, a->cell, a->gw, &c0, &c1);
    return any_set(a, r0, r1, c0, c1);
}

int64_t tw_aoi_count(const tw_aoi *a)
{
    return a ? a->count : 0;
}

void tw_aoi_destroy(tw_aoi *a)
{
    if (!a) return;
    tw_free(a->x0);
    tw_free(a->sat);
    tw_free(a);
}
