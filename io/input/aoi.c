/* aoi.c - see aoi.h */
#include "io/input/aoi.h"

#include <stdio.h>
#include <string.h>

#include <cpl_error.h>
#include <cpl_string.h>
#include <gdal.h>
#include <gdal_alg.h>
#include <ogr_api.h>
#include <ogr_srs_api.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "io/gdal_msgs.h"

/* The cell grid's cap: its summed-area table (4 bytes a cell) is what an
 * AOI keeps through the run, 16 MiB at most, whatever the raster's size
 * (a byte per tile, as it was, took 97 GB for a 10^7 x 10^7 raster). */
#define AOI_MAX_CELLS ((int64_t)4 << 20)

/* The tile origins along an axis: a*step for a < n - 1 and `last` for the
 * last one, as a plan lays them out (a few bytes whatever the raster's
 * size); an axis of another shape keeps a copy of its origins. */
typedef struct aoi_axis {
    int n, step, last;
    int *pos; /* [n], or NULL: regular */
} aoi_axis;

struct tw_aoi {
    int tile, cell;
    int64_t gw, gh;
    aoi_axis x, y;
    uint32_t *sat; /* [gh + 1][gw + 1]: set cells above and left of each corner */
    int64_t count;
};

static tw_status axis_init(aoi_axis *ax, const int *pos, int n, int step)
{
    ax->n = n;
    ax->step = step;
    ax->last = n > 0 ? pos[n - 1] : 0;
    ax->pos = NULL;
    bool regular = true;
    for (int i = 0; i + 1 < n && regular; i++) regular = pos[i] == (int64_t)i * step;
    if (regular) return TW_OK;
    ax->pos = tw_alloc(TW_MEM_OTHER, sizeof(int) * (size_t)n + 1);
    if (!ax->pos) return TW_ERR_NOMEM;
    memcpy(ax->pos, pos, sizeof(int) * (size_t)n);
    return TW_OK;
}

static int axis_pos(const aoi_axis *ax, int i)
{
    return ax->pos ? ax->pos[i] : i == ax->n - 1 ? ax->last : i * ax->step;
}

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

/* Consecutive tiles of an axis that cover the same cells form a run: a
 * huge raster's coarse grid gives about two runs a cell, so counting the
 * tiles inside takes runs_x x runs_y queries, not n_x x n_y. The next run
 * from tile *i on: false at the end. */
static bool next_run(const tw_aoi *a, const aoi_axis *ax, int64_t cells, int *i, int64_t *lo,
                     int64_t *hi, int64_t *mult)
{
    if (*i >= ax->n) return false;
    cell_span(axis_pos(ax, *i), a->tile, a->cell, cells, lo, hi);
    *mult = 0;
    for (; *i < ax->n; (*i)++) {
        int64_t c0, c1;
        cell_span(axis_pos(ax, *i), a->tile, a->cell, cells, &c0, &c1);
        if (c0 != *lo || c1 != *hi) break;
        (*mult)++;
    }
    return true;
}

/* Tiles inside: the runs of the axis with fewer of them held (24 bytes
 * each: a few thousand at most, as the cell grid is capped), the other's
 * streamed. */
static tw_status count_inside(tw_aoi *a)
{
    int64_t nx = 0, ny = 0, lo, hi, m;
    for (int i = 0; next_run(a, &a->x, a->gw, &i, &lo, &hi, &m);) nx++;
    for (int i = 0; next_run(a, &a->y, a->gh, &i, &lo, &hi, &m);) ny++;
    bool hold_x = nx <= ny;
    const aoi_axis *held = hold_x ? &a->x : &a->y, *streamed = hold_x ? &a->y : &a->x;
    int64_t held_cells = hold_x ? a->gw : a->gh, streamed_cells = hold_x ? a->gh : a->gw;
    int64_t n = hold_x ? nx : ny;
    int64_t *runs = tw_alloc(TW_MEM_OTHER, 3 * sizeof(int64_t) * (size_t)n + 1);
    if (!runs) return TW_ERR_NOMEM;
    int64_t *hl = runs, *hh = hl + n, *hm = hh + n, k = 0;
    for (int i = 0; next_run(a, held, held_cells, &i, &hl[k], &hh[k], &hm[k]);) k++;
    a->count = 0;
    for (int i = 0; next_run(a, streamed, streamed_cells, &i, &lo, &hi, &m);)
        for (int64_t r = 0; r < n; r++)
            if (hold_x ? any_set(a, lo, hi, hl[r], hh[r]) : any_set(a, hl[r], hh[r], lo, hi))
                a->count += m * hm[r];
    tw_free(runs);
    return TW_OK;
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

/* The geometries burnt (ALL_TOUCHED) into the gw x gh grid of cells of
 * `cell` pixels over the raster of info, read back into cells[gw * gh]. */
static tw_status rasterize_cells(const char *path, const tw_raster_info *info, int cell, int64_t gw,
                                 int64_t gh, OGRGeometryH *geoms, int n_geoms, uint8_t *cells,
                                 tw_error *err)
{
    tw_gdal_msgs msg;
    tw_status st = TW_OK;
    GDALDriverH drv = GDALGetDriverByName("MEM");
    GDALDatasetH mem = drv ? GDALCreate(drv, "", (int)gw, (int)gh, 1, GDT_Byte, NULL) : NULL;
    if (!mem) st = tw_error_set(err, TW_ERR_INTERNAL, "input.aoi: cannot make a MEM raster");
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
    return st;
}

tw_status tw_aoi_create(const char *path, const tw_raster_info *info, const tw_aoi_geometry *g,
                        tw_aoi **out, tw_error *err)
{
    *out = NULL;
    /* a FIFO would block the open until a writer came; OGR opens some
     * directories (a Shapefile folder, a FileGDB) as datasets */
    tw_status rst = tw_path_check_regular(path, "input.aoi:", true, TW_ERR_INPUT, err);
    if (rst != TW_OK) return rst;
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
    if (st == TW_OK) {
        a = tw_calloc(TW_MEM_OTHER, 1, sizeof *a);
        cells = tw_calloc(TW_MEM_OTHER, (size_t)(gw * gh), 1);
        sat = tw_calloc(TW_MEM_OTHER, (size_t)((gw + 1) * (gh + 1)), sizeof *sat);
        if (a && (axis_init(&a->x, g->x0, g->n_x, g->stride) != TW_OK ||
                  axis_init(&a->y, g->y0, g->n_y, g->stride) != TW_OK))
            st = tw_error_set(err, TW_ERR_NOMEM, "input.aoi: out of memory");
        if (st == TW_OK && (!a || !cells || !sat))
            st = tw_error_set(err, TW_ERR_NOMEM, "input.aoi: out of memory");
    }
    if (st == TW_OK) st = rasterize_cells(path, info, cell, gw, gh, geoms, n_geoms, cells, err);
    if (st == TW_OK) {
        /* Summed-area table: any cell set in a tile's rectangle, in O(1). */
        for (int64_t r = 0; r < gh; r++)
            for (int64_t c = 0; c < gw; c++)
                sat[(r + 1) * (gw + 1) + c + 1] =
                    (cells[r * gw + c] != 0) + sat[r * (gw + 1) + c + 1] +
                    sat[(r + 1) * (gw + 1) + c] - sat[r * (gw + 1) + c];
        a->tile = g->tile;
        a->cell = cell;
        a->gw = gw;
        a->gh = gh;
        a->sat = sat;
        sat = NULL;
        if (count_inside(a) != TW_OK)
            st = tw_error_set(err, TW_ERR_NOMEM, "input.aoi: out of memory");
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
    if (!a || tx < 0 || ty < 0 || tx >= a->x.n || ty >= a->y.n) return false;
    int64_t r0, r1, c0, c1;
    cell_span(axis_pos(&a->y, ty), a->tile, a->cell, a->gh, &r0, &r1);
    cell_span(axis_pos(&a->x, tx), a->tile, a->cell, a->gw, &c0, &c1);
    return any_set(a, r0, r1, c0, c1);
}

int64_t tw_aoi_count(const tw_aoi *a)
{
    return a ? a->count : 0;
}

void tw_aoi_destroy(tw_aoi *a)
{
    if (!a) return;
    tw_free(a->x.pos);
    tw_free(a->y.pos);
    tw_free(a->sat);
    tw_free(a);
}
