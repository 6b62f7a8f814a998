/* polygons.c - see polygons.h: the writer (sieve, polygonize, label the
 * regions, simplify, write the layer atomically), its memory bound and the
 * summary `tilewise info` reads back; the labelling is polygons_label.c, the
 * simplification polygons_simplify.c (polygons_internal.h). */
#include "io/output/polygons.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cpl_conv.h>
#include <cpl_error.h>
#include <cpl_string.h>
#include <gdal.h>
#include <gdal_alg.h>
#include <ogr_api.h>
#include <ogr_srs_api.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "io/gdal_msgs.h"
#include "io/output/writer.h"
#include "io/output/polygons_internal.h"

enum { F_CLASS = 0, F_CLASS_NAME, F_AREA, F_CELLS, F_MEAN_CONF };

static const char *fmt_bytes(size_t n, char *buf, size_t size)
{
    if (n >= ((size_t)1 << 30))
        snprintf(buf, size, "%.2f GiB", n / (double)((size_t)1 << 30));
    else
        snprintf(buf, size, "%.1f MiB", n / (double)((size_t)1 << 20));
    return buf;
}

static const char *gdal_msg(const ctx *c)
{
    return tw_gdal_capture_text(&c->gdal, "unknown GDAL error");
}

static void remove_with_sidecars(const char *path)
{
    static const char *const sfx[] = {"", "-journal", "-wal", "-shm"};
    char side[TW_PATH_MAX + 128];
    for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++) {
        snprintf(side, sizeof side, "%s%s", path, sfx[i]);
        (void)unlink(side);
    }
}

/* GDALSieveFilter into a scratch GeoTIFF: regions of fewer than min_cells
 * cells merge into their largest neighbour; nodata (255, outside the mask)
 * is neither merged nor a neighbour. */
static tw_status sieve(ctx *c, GDALDatasetH src, int min_cells)
{
    const tw_polygons_params *p = c->p;
    snprintf(c->sieved, sizeof c->sieved, "%s/polygons-sieved.tif", p->scratch_dir);
    GDALDriverH gtiff = GDALGetDriverByName("GTiff");
    char **co = NULL;
    co = CSLSetNameValue(co, "TILED", "YES");
    co = CSLSetNameValue(co, "COMPRESS", "DEFLATE");
    co = CSLSetNameValue(co, "ZLEVEL", "1");
    co = CSLSetNameValue(co, "BIGTIFF", "IF_SAFER");
    GDALDatasetH d = gtiff ? GDALCreate(gtiff, c->sieved, c->W, c->H, 1, GDT_Byte, co) : NULL;
    CSLDestroy(co);
    if (!d)
        return tw_error_set(c->err, TW_ERR_OUTPUT, "cannot create %s: %s", c->sieved, gdal_msg(c));
    GDALSetGeoTransform(d, c->gt);
    const char *wkt = GDALGetProjectionRef(src);
    if (wkt && *wkt) GDALSetProjection(d, wkt);
    GDALRasterBandH db = GDALGetRasterBand(d, 1);
    GDALSetRasterNoDataValue(db, NODATA);
    GDALRasterBandH sb = GDALGetRasterBand(src, 1);
    CPLErr e = GDALSieveFilter(sb, GDALGetMaskBand(sb), db, min_cells, 4, NULL, NULL, NULL);
    if (e != CE_None) {
        GDALClose(d);
        return tw_error_set(c->err, TW_ERR_OUTPUT,
                            "%s: sieving the class map (output.min_area): %s", p->path,
                            gdal_msg(c));
    }
    GDALFlushCache(d);
    c->cls_ds = d;
    c->cls_b = db;
    return TW_OK;
}

/* GDALPolygonize into a scratch GeoPackage, layer "raw" with field class. */
static tw_status polygonize(ctx *c, GDALDatasetH *raw_ds, OGRLayerH *raw_l)
{
    snprintf(c->raw, sizeof c->raw, "%s/polygons-raw.gpkg", c->p->scratch_dir);
    remove_with_sidecars(c->raw);
    GDALDriverH gpkg = GDALGetDriverByName("GPKG");
    GDALDatasetH ds = gpkg ? GDALCreate(gpkg, c->raw, 0, 0, 0, GDT_Unknown, NULL) : NULL;
    if (!ds)
        return tw_error_set(c->err, TW_ERR_OUTPUT, "cannot create %s: %s", c->raw, gdal_msg(c));
    *raw_ds = ds;
    char **lo = CSLSetNameValue(NULL, "SPATIAL_INDEX", "NO");
    OGRLayerH l = GDALDatasetCreateLayer(ds, "raw", NULL, wkbPolygon, lo);
    CSLDestroy(lo);
    OGRFieldDefnH fd = OGR_Fld_Create("class", OFTInteger);
    if (!l || OGR_L_CreateField(l, fd, TRUE) != OGRERR_NONE) {
        OGR_Fld_Destroy(fd);
        return tw_error_set(c->err, TW_ERR_OUTPUT, "%s: cannot create a layer: %s", c->raw,
                            gdal_msg(c));
    }
    OGR_Fld_Destroy(fd);
    *raw_l = l;
    if (GDALDatasetStartTransaction(ds, FALSE) != OGRERR_NONE)
        return tw_error_set(c->err, TW_ERR_OUTPUT, "%s: cannot start a transaction: %s", c->raw,
                            gdal_msg(c));
    /* 4-connected (GDAL's default), as the sieve and the labelling */
    CPLErr e = GDALPolygonize(c->cls_b, GDALGetMaskBand(c->cls_b), l, 0, NULL, NULL, NULL);
    if (e != CE_None || GDALDatasetCommitTransaction(ds) != OGRERR_NONE)
        return tw_error_set(c->err, TW_ERR_OUTPUT, "%s: polygonizing the class map: %s", c->p->path,
                            gdal_msg(c));
    return TW_OK;
}

/* The statistics of every region of the class map polygonized, sorted by
 * first cell. */
static tw_status label(ctx *c, GDALDatasetH conf_ds, bool count_only, int64_t expect, labeller *L)
{
    memset(L, 0, sizeof *L);
    L->W = c->W;
    L->count_only = count_only;
    /* the polygons' count, known: one allocation of the records, not a
     * doubling array's 2.5x at its peak */
    if (!count_only && expect > 0 &&
        !grow((void **)&L->out, &L->out_cap, (size_t)expect, sizeof *L->out))
        return tw_error_set(c->err, TW_ERR_NOMEM, "out of memory for %lld regions",
                            (long long)expect);
    uint8_t *row = tw_alloc(TW_MEM_STRIP, (size_t)c->W);
    float *conf = tw_alloc(TW_MEM_STRIP, (size_t)c->W * sizeof(float));
    L->prev = tw_alloc(TW_MEM_STRIP, (size_t)c->W * sizeof(run));
    L->cur = tw_alloc(TW_MEM_STRIP, (size_t)c->W * sizeof(run));
    tw_status st = TW_OK;
    if (!row || !conf || !L->prev || !L->cur)
        st = tw_error_set(c->err, TW_ERR_NOMEM, "out of memory");
    GDALRasterBandH cb = conf_ds ? GDALGetRasterBand(conf_ds, 1) : NULL;
    for (int y = 0; st == TW_OK && y < c->H; y++) {
        if (GDALRasterIO(c->cls_b, GF_Read, 0, y, c->W, 1, row, c->W, 1, GDT_Byte, 0, 0) !=
                CE_None ||
            (cb && GDALRasterIO(cb, GF_Read, 0, y, c->W, 1, conf, c->W, 1, GDT_Float32, 0, 0) !=
                       CE_None)) {
            st = tw_error_set(c->err, TW_ERR_INPUT, "%s: cannot read row %d of the class map: %s",
                              c->p->path, y, gdal_msg(c));
            break;
        }
        if (!tw_poly_lab_row(L, y, row, cb ? conf : NULL))
            st = tw_error_set(c->err, TW_ERR_NOMEM, "out of memory labelling the class map");
    }
    if (st == TW_OK && !tw_poly_lab_end(L))
        st = tw_error_set(c->err, TW_ERR_NOMEM, "out of memory labelling the class map");
    tw_free(row);
    tw_free(conf);
    if (st == TW_OK && !count_only) qsort(L->out, L->n_out, sizeof *L->out, tw_poly_cmp_region);
    return st;
}

/* The region of a polygon: its exterior ring's top-left vertex in raster
 * order is its first cell's top-left corner. NULL when none matches. */
static const region *region_of(const ctx *c, const labeller *L, OGRGeometryH poly)
{
    OGRGeometryH ring = OGR_G_GetGeometryRef(poly, 0);
    int n = ring ? OGR_G_GetPointCount(ring) : 0;
    int64_t best = INT64_MAX;
    for (int i = 0; i < n; i++) {
        double X = OGR_G_GetX(ring, i), Y = OGR_G_GetY(ring, i);
        double px = c->inv[0] + X * c->inv[1] + Y * c->inv[2];
        double py = c->inv[3] + X * c->inv[4] + Y * c->inv[5];
        int64_t col = llround(px), r = llround(py);
        if (col < 0 || r < 0 || col >= c->W || r >= c->H) continue;
        int64_t key = r * c->W + col;
        if (key < best) best = key;
    }
    size_t lo = 0, hi = L->n_out;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (L->out[mid].first < best)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < L->n_out && L->out[lo].first == best ? &L->out[lo] : NULL;
}

/* ---- the output ---- */

static tw_status add_field(ctx *c, OGRLayerH l, const char *name, OGRFieldType t)
{
    OGRFieldDefnH fd = OGR_Fld_Create(name, t);
    OGRErr e = fd ? OGR_L_CreateField(l, fd, TRUE) : OGRERR_NOT_ENOUGH_MEMORY;
    if (fd) OGR_Fld_Destroy(fd);
    if (e != OGRERR_NONE)
        return tw_error_set(c->err, TW_ERR_OUTPUT, "%s: cannot create field %s: %s", c->part, name,
                            gdal_msg(c));
    return TW_OK;
}

/* "square metre", "square US survey foot", "square degree" */
static void area_unit(OGRSpatialReferenceH srs, char *out, size_t size)
{
    char *name = NULL;
    if (!srs) {
        snprintf(out, size, "square unit of the raster's georeferencing (no CRS)");
        return;
    }
    if (OSRIsGeographic(srs))
        OSRGetAngularUnits(srs, &name);
    else
        OSRGetLinearUnits(srs, &name);
    snprintf(out, size, "square %s", name && *name ? name : "unit");
}

/* The layer 'classes' in ds: the class map's projection, the fields, the
 * area unit, the class colours and the run's metadata; into *layer (NULL
 * when it could not be created). */
static tw_status create_layer(ctx *c, GDALDatasetH ds, OGRLayerH *layer)
{
    const tw_polygons_params *p = c->p;
    OGRSpatialReferenceH srs = NULL;
    const char *wkt = GDALGetProjectionRef(c->cls_ds);
    if (wkt && *wkt) {
        srs = OSRNewSpatialReference(NULL);
        if (srs) {
            OSRSetAxisMappingStrategy(srs, OAMS_TRADITIONAL_GIS_ORDER);
            if (OSRSetFromUserInput(srs, wkt) != OGRERR_NONE) {
                OSRDestroySpatialReference(srs);
                srs = NULL;
            }
        }
    }
    char unit[128];
    area_unit(srs, unit, sizeof unit);
    char **lo = NULL;
    if (p->format == TW_VECTOR_GPKG) {
        lo = CSLSetNameValue(lo, "GEOMETRY_NAME", "geom");
        lo = CSLSetNameValue(lo, "FID", "fid");
        lo = CSLSetNameValue(lo, "DESCRIPTION",
                             "tilewise: one polygon per 4-connected region of a class");
    }
    OGRLayerH l = GDALDatasetCreateLayer(ds, "classes", srs, wkbPolygon, lo);
    *layer = l;
    CSLDestroy(lo);
    if (srs) OSRDestroySpatialReference(srs);
    tw_status st = TW_OK;
    if (!l)
        st = tw_error_set(c->err, TW_ERR_OUTPUT, "%s: cannot create layer 'classes': %s", c->part,
                          gdal_msg(c));
    if (st == TW_OK) st = add_field(c, l, "class", OFTInteger);
    if (st == TW_OK) st = add_field(c, l, "class_name", OFTString);
    if (st == TW_OK) st = add_field(c, l, "area", OFTReal);
    if (st == TW_OK) st = add_field(c, l, "cells", OFTInteger64);
    if (st == TW_OK) st = add_field(c, l, "mean_confidence", OFTReal);
    if (st == TW_OK) {
        GDALSetMetadataItem((GDALMajorObjectH)l, "AREA_UNIT", unit, NULL);
        char *colors = tw_alloc(TW_MEM_OTHER, (size_t)p->n_classes * 8 + 1);
        if (colors) {
            size_t at = 0;
            colors[0] = '\0';
            for (int k = 0; k < p->n_classes; k++) {
                unsigned char rgb[3];
                tw_writer_class_rgb(p->colors, p->n_colors, k, rgb);
                at += (size_t)snprintf(colors + at, 9, "%s#%02x%02x%02x", k ? "," : "", rgb[0],
                                       rgb[1], rgb[2]);
            }
            GDALSetMetadataItem((GDALMajorObjectH)l, "CLASS_COLORS", colors, NULL);
            tw_free(colors);
        }
        if (p->metadata_json)
            GDALSetMetadataItem((GDALMajorObjectH)l, "TILEWISE_RUN", p->metadata_json, NULL);
    }
    return st;
}

/* Each polygon of raw (simplified when asked) with its region's class,
 * name, area, cells and mean confidence, through feature f into layer l;
 * a GeoPackage commits every TXN_FEATURES. The count into *n_out. */
static tw_status write_features(ctx *c, GDALDatasetH ds, OGRLayerH raw, const labeller *L,
                                OGRLayerH l, OGRFeatureH f, double tol, simp *s, int64_t *n_out)
{
    const tw_polygons_params *p = c->p;
    bool txn = p->format == TW_VECTOR_GPKG;
    int in_txn = 0;
    tw_status st = TW_OK;
    int64_t n = 0;
    OGR_L_ResetReading(raw);
    OGRFeatureH rf;
    while (st == TW_OK && (rf = OGR_L_GetNextFeature(raw)) != NULL) {
        OGRGeometryH g = OGR_F_StealGeometry(rf);
        int cls = OGR_F_GetFieldAsInteger(rf, 0);
        OGR_F_Destroy(rf);
        const region *r = g ? region_of(c, L, g) : NULL;
        if (!r || r->cls != cls || cls < 0 || cls >= p->n_classes) {
            if (g) OGR_G_DestroyGeometry(g);
            st = tw_error_set(c->err, TW_ERR_INTERNAL,
                              "%s: a polygon of class %d matches no region of the class map",
                              p->path, cls);
            break;
        }
        if (p->simplify > 0) {
            s->fz.n_cur = 0;
            OGRGeometryH sg = tw_poly_simplify_polygon(c, g, tol, s);
            OGR_G_DestroyGeometry(g);
            g = sg;
            if (!g) {
                st = tw_error_set(c->err, TW_ERR_NOMEM, "out of memory simplifying polygons");
                break;
            }
        }
        OGR_F_SetFID(f, OGRNullFID);
        OGR_F_SetFieldInteger(f, F_CLASS, cls);
        OGR_F_SetFieldString(f, F_CLASS_NAME, p->class_names[cls]);
        OGR_F_SetFieldDouble(f, F_AREA, OGR_G_Area(g));
        OGR_F_SetFieldInteger64(f, F_CELLS, r->cells);
        OGR_F_SetFieldDouble(f, F_MEAN_CONF, r->conf_sum / (double)r->cells);
        OGR_F_SetGeometryDirectly(f, g);
        if (OGR_L_CreateFeature(l, f) != OGRERR_NONE) {
            st = tw_error_set(c->err, TW_ERR_OUTPUT, "%s: cannot write a polygon: %s", c->part,
                              gdal_msg(c));
            break;
        }
        n++;
        if (txn && ++in_txn >= TXN_FEATURES) {
            in_txn = 0;
            if (GDALDatasetCommitTransaction(ds) != OGRERR_NONE ||
                GDALDatasetStartTransaction(ds, FALSE) != OGRERR_NONE)
                st = tw_error_set(c->err, TW_ERR_OUTPUT, "%s: cannot commit polygons: %s", c->part,
                                  gdal_msg(c));
        }
    }
    *n_out = n;
    return st;
}

static tw_status write_output(ctx *c, OGRLayerH raw, const labeller *L, int64_t *n_out)
{
    const tw_polygons_params *p = c->p;
    GDALDriverH drv = GDALGetDriverByName(p->format == TW_VECTOR_FGB ? "FlatGeobuf" : "GPKG");
    if (!drv)
        return tw_error_set(c->err, TW_ERR_INTERNAL, "GDAL was built without the %s driver",
                            p->format == TW_VECTOR_FGB ? "FlatGeobuf" : "GPKG");
    remove_with_sidecars(c->part);
    GDALDatasetH ds = GDALCreate(drv, c->part, 0, 0, 0, GDT_Unknown, NULL);
    if (!ds)
        return tw_error_set(c->err, TW_ERR_OUTPUT, "cannot create %s: %s", c->part, gdal_msg(c));
    OGRLayerH l = NULL;
    tw_status st = create_layer(c, ds, &l);
    bool txn = p->format == TW_VECTOR_GPKG;
    if (st == TW_OK && txn && GDALDatasetStartTransaction(ds, FALSE) != OGRERR_NONE)
        st = tw_error_set(c->err, TW_ERR_OUTPUT, "%s: cannot start a transaction: %s", c->part,
                          gdal_msg(c));
    OGRFeatureH f = st == TW_OK ? OGR_F_Create(OGR_L_GetLayerDefn(l)) : NULL;
    if (st == TW_OK && !f) st = tw_error_set(c->err, TW_ERR_NOMEM, "out of memory");
    simp s = {0};
    double tol = p->simplify / sqrt(c->cell_area); /* in cells */
    if (st == TW_OK && p->simplify > 0) st = tw_poly_mark_exact_pieces(c, raw, tol, &s);
    int64_t n = 0;
    if (st == TW_OK) st = write_features(c, ds, raw, L, l, f, tol, &s, &n);
    tw_poly_simp_release(&s);
    if (f) OGR_F_Destroy(f);
    if (st == TW_OK && txn && GDALDatasetCommitTransaction(ds) != OGRERR_NONE)
        st = tw_error_set(c->err, TW_ERR_OUTPUT, "%s: cannot commit polygons: %s", c->part,
                          gdal_msg(c));
    if (st == TW_OK && (size_t)n != L->n_out)
        st = tw_error_set(c->err, TW_ERR_INTERNAL,
                          "%s: %lld polygons for %zu regions of the class map", p->path,
                          (long long)n, L->n_out);
    int fails = c->gdal.failures;
    GDALClose(ds); /* writes the spatial index */
    if (st == TW_OK && c->gdal.failures > fails)
        st = tw_error_set(c->err, TW_ERR_OUTPUT, "cannot close %s: %s", c->part, gdal_msg(c));
    *n_out = n;
    return st;
}

tw_status tw_polygons_write(const tw_polygons_params *p, int64_t *n_features, tw_error *err)
{
    if (n_features) *n_features = 0;
    if (!p->class_path || !p->path || !p->scratch_dir || p->n_classes < 1 ||
        p->n_classes > TW_MAX_CLASSES || !p->class_names || !(p->min_area >= 0) ||
        !(p->simplify >= 0))
        return tw_error_set(err, TW_ERR_INTERNAL, "tw_polygons_write: bad parameters");
    ctx c = {.p = p, .err = err};
    const char *slash = strrchr(p->path, '/');
    int dlen = slash ? (int)(slash - p->path) : 0;
    const char *base = slash ? slash + 1 : p->path;
    int n = snprintf(c.part, sizeof c.part, "%.*s%s.%s.part.%s", dlen, p->path, slash ? "/" : "",
                     base, p->format == TW_VECTOR_FGB ? "fgb" : "gpkg");
    if (n < 0 || (size_t)n >= sizeof c.part || strlen(p->path) >= sizeof c.dir)
        return tw_error_set(err, TW_ERR_OUTPUT, "output path too long: %s", p->path);
    snprintf(c.dir, sizeof c.dir, "%.*s", slash ? (dlen ? dlen : 1) : 1, slash ? p->path : ".");
    struct stat sb;
    if (stat(p->path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return tw_error_set(err, TW_ERR_OUTPUT, "%s exists and is a directory", p->path);

    tw_gdal_capture_begin(&c.gdal);
    if (!GDALGetDriverByName("GPKG")) GDALAllRegister();
    tw_status st = TW_OK;
    GDALDatasetH src = GDALOpen(p->class_path, GA_ReadOnly);
    GDALDatasetH conf = p->conf_path ? GDALOpen(p->conf_path, GA_ReadOnly) : NULL;
    if (!src || (p->conf_path && !conf))
        st = tw_error_set(err, TW_ERR_INPUT, "cannot open %s: %s",
                          src ? p->conf_path : p->class_path, gdal_msg(&c));
    if (st == TW_OK) {
        c.W = GDALGetRasterXSize(src);
        c.H = GDALGetRasterYSize(src);
        if (GDALGetGeoTransform(src, c.gt) != CE_None) {
            double id[6] = {0, 1, 0, 0, 0, 1};
            memcpy(c.gt, id, sizeof id);
        }
        c.cell_area = fabs(c.gt[1] * c.gt[5] - c.gt[2] * c.gt[4]);
        if (!GDALInvGeoTransform(c.gt, c.inv) || !(c.cell_area > 0))
            st = tw_error_set(err, TW_ERR_INPUT, "%s: its geotransform cannot be inverted",
                              p->class_path);
        if (conf && (GDALGetRasterXSize(conf) != c.W || GDALGetRasterYSize(conf) != c.H))
            st = tw_error_set(err, TW_ERR_INTERNAL, "%s and %s differ in size", p->class_path,
                              p->conf_path);
        c.cls_ds = src;
        c.cls_b = GDALGetRasterBand(src, 1);
    }
    /* What the regions will take (the sieve's and polygonize's arrays grow
     * with the regions before the sieve), checked before any of it. */
    if (st == TW_OK && p->max_bytes > 0) {
        labeller L0;
        st = label(&c, NULL, true, 0, &L0);
        size_t need = tw_polygons_memory(c.W, c.H, (int64_t)L0.n_out);
        tw_poly_lab_release(&L0);
        if (st == TW_OK && need > p->max_bytes) {
            /* output.min_area cannot help: these are the regions before
             * its sieve, whose arrays GDAL holds over all of them */
            char a[32], b[32], d[32];
            st = tw_error_set(err, TW_ERR_NOMEM, TW_POLYGONS_TOO_MANY, p->path, L0.n_out,
                              fmt_bytes(need, a, sizeof a), fmt_bytes(p->max_bytes, b, sizeof b),
                              fmt_bytes(need - p->max_bytes, d, sizeof d));
        }
    }
    /* regions of fewer cells than this are sieved (1: none is) */
    double mc = p->min_area > 0 ? ceil(p->min_area / c.cell_area * (1 - 1e-12)) : 1;
    int min_cells = mc > (double)INT_MAX ? INT_MAX : mc < 1 ? 1 : (int)mc;
    if (st == TW_OK && min_cells > 1) st = sieve(&c, src, min_cells);
    GDALDatasetH raw_ds = NULL;
    OGRLayerH raw_l = NULL;
    labeller L;
    memset(&L, 0, sizeof L);
    if (st == TW_OK) st = polygonize(&c, &raw_ds, &raw_l);
    if (st == TW_OK) st = label(&c, conf, false, OGR_L_GetFeatureCount(raw_l, TRUE), &L);
    int64_t nf = 0;
    if (st == TW_OK) st = write_output(&c, raw_l, &L, &nf);
    tw_poly_lab_release(&L);
    if (raw_ds) GDALClose(raw_ds);
    if (c.cls_ds && c.cls_ds != src) GDALClose(c.cls_ds);
    if (src) GDALClose(src);
    if (conf) GDALClose(conf);
    tw_gdal_capture_end();
    if (c.raw[0]) remove_with_sidecars(c.raw);
    if (c.sieved[0]) (void)unlink(c.sieved);
    if (st == TW_OK) st = tw_fsync_path(c.part, false, err);
    if (st == TW_OK && rename(c.part, p->path) != 0)
        st = tw_error_set(err, TW_ERR_OUTPUT, "cannot rename %s to %s: %s", c.part, p->path,
                          strerror(errno));
    if (st == TW_OK) st = tw_fsync_dir(c.dir, err);
    if (st != TW_OK) {
        remove_with_sidecars(c.part);
        return st;
    }
    if (n_features) *n_features = nf;
    return TW_OK;
}

size_t tw_polygons_memory(int grid_w, int grid_h, int64_t regions)
{
    /* Fitted to bench/polygons_rss (bench/RESULTS.md, "Class polygons"),
     * above GDAL's block cache: 24 MiB of GDAL and SQLite state (16
     * measured, and a 4096^2 map came within 1 MiB of that), the rows
     * (runs and labels of two rows, the class and confidence rows, GDAL's
     * line buffers: ~105 bytes a column), what GDAL 3.6's polygonize holds
     * of the regions still open (measured ~0.05 bytes a cell: 1/16 here),
     * and the regions (GDAL's sieve and polygonize arrays over every region
     * id, the records kept here: measured ~67 bytes, 80 here). */
    size_t w = (size_t)(grid_w > 0 ? grid_w : 1), h = (size_t)(grid_h > 0 ? grid_h : 1);
    return ((size_t)24 << 20) + w * 105 + w * h / 16 +
           (size_t)(regions > 0 ? regions : 0) * TW_POLYGONS_REGION_BYTES;
}

void tw_polygons_path(const char *dir, const char *stem, tw_vector_format f, char *out, size_t size)
{
    snprintf(out, size, "%s/%s.class.%s", dir, stem, f == TW_VECTOR_FGB ? "fgb" : "gpkg");
}

tw_status tw_polygons_summarize(const char *path, tw_polygons_summary *out, tw_error *err)
{
    memset(out, 0, sizeof *out);
    tw_gdal_msgs msgs;
    tw_gdal_capture_begin(&msgs);
    if (!GDALGetDriverByName("GPKG")) GDALAllRegister();
    GDALDatasetH ds = GDALOpenEx(path, GDAL_OF_VECTOR | GDAL_OF_READONLY, NULL, NULL, NULL);
    tw_status st = TW_OK;
    if (!ds)
        st = tw_error_set(err, TW_ERR_INPUT, "%s: not a vector file GDAL opens: %s", path,
                          tw_gdal_capture_text(&msgs, "unknown format"));
    OGRLayerH l = ds ? GDALDatasetGetLayerByName(ds, "classes") : NULL;
    OGRFeatureDefnH d = l ? OGR_L_GetLayerDefn(l) : NULL;
    int fc = d ? OGR_FD_GetFieldIndex(d, "class") : -1;
    int fn = d ? OGR_FD_GetFieldIndex(d, "class_name") : -1;
    int fa = d ? OGR_FD_GetFieldIndex(d, "area") : -1;
    int fk = d ? OGR_FD_GetFieldIndex(d, "cells") : -1;
    if (st == TW_OK && fc >= 0 && fn >= 0 && fa >= 0 && fk >= 0) {
        out->found = true;
        snprintf(out->driver, sizeof out->driver, "%s",
                 GDALGetDriverShortName(GDALGetDatasetDriver(ds)));
        const char *u = GDALGetMetadataItem((GDALMajorObjectH)l, "AREA_UNIT", NULL);
        snprintf(out->area_unit, sizeof out->area_unit, "%s", u ? u : "");
        OGRSpatialReferenceH srs = OGR_L_GetSpatialRef(l);
        if (srs) {
            const char *auth = OSRGetAuthorityName(srs, NULL);
            const char *code = OSRGetAuthorityCode(srs, NULL);
            if (auth && code)
                snprintf(out->crs, sizeof out->crs, "%s:%s", auth, code);
            else
                snprintf(out->crs, sizeof out->crs, "%s", OSRGetName(srs) ? OSRGetName(srs) : "");
        }
        OGREnvelope env;
        if (OGR_L_GetExtent(l, &env, TRUE) == OGRERR_NONE) {
            out->extent[0] = env.MinX;
            out->extent[1] = env.MaxX;
            out->extent[2] = env.MinY;
            out->extent[3] = env.MaxY;
        }
        tw_polygons_class_sum *by = tw_calloc(TW_MEM_OTHER, TW_MAX_CLASSES, sizeof *by);
        if (!by) st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
        OGRFeatureH f;
        OGR_L_ResetReading(l);
        while (st == TW_OK && (f = OGR_L_GetNextFeature(l)) != NULL) {
            int c = OGR_F_GetFieldAsInteger(f, fc);
            if (c >= 0 && c < TW_MAX_CLASSES) {
                tw_polygons_class_sum *s = &by[c];
                if (!s->features)
                    snprintf(s->name, sizeof s->name, "%s", OGR_F_GetFieldAsString(f, fn));
                s->cls = c;
                s->features++;
                s->cells += OGR_F_GetFieldAsInteger64(f, fk);
                s->area += OGR_F_GetFieldAsDouble(f, fa);
            }
            out->features++;
            OGR_F_Destroy(f);
        }
        for (int c = 0; by && c < TW_MAX_CLASSES; c++)
            if (by[c].features) out->classes[out->n_classes++] = by[c];
        tw_free(by);
    }
    if (ds) GDALClose(ds);
    tw_gdal_capture_end();
    return st;
}
