/* gpkg.c - see gpkg.h
 *
 * The GeoPackage is written through OGR under a temporary name in the same
 * directory, ".<name>.part.gpkg": the GPKG driver insists on a .gpkg
 * extension, and the leading dot and ".part" keep it from looking finished.
 * Features go in through SQLite transactions of TW_GPKG_TXN features (one
 * transaction per feature would make a big scene take minutes). finish
 * commits, closes (which writes the R-tree spatial index), fsyncs, removes
 * any SQLite sidecar (-journal, -wal, -shm) and renames to the final name.
 *
 * OGR reports failures through the CPL error handler as well as through
 * return values, so each public function pushes a handler that keeps the
 * first failure's message for the tw_error.
 */
#include "io/output/gpkg.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cpl_error.h>
#include <cpl_string.h>
#include <gdal.h>
#include <ogr_api.h>
#include <ogr_srs_api.h>

#include "core/alloc.h"
#include "core/argmax.h"
#include "core/fileio.h"
#include "io/gdal_msgs.h"

enum { TW_GPKG_TXN = 4096 };

/* Field indexes in the layer definition. */
enum { F_ROW = 0, F_COL, F_CLASS, F_CLASS_NAME, F_CONFIDENCE, F_FIRST_PROB };

struct tw_gpkg {
    GDALDatasetH ds;
    OGRLayerH layer;
    OGRFeatureH feature; /* reused for every tile */
    int n_classes, tile;
    double gt[6];
    char (*class_names)[TW_NAME_MAX];
    int in_txn; /* features in the open transaction; -1: none open */
    bool finished;
    char path[TW_PATH_MAX];
    char part_path[TW_PATH_MAX + 32];
    char dir[TW_PATH_MAX];
    tw_gdal_msgs gdal; /* io/gdal_msgs.h */
};

/* ---- GDAL message routing ---- */

static void gdal_begin(tw_gpkg *g)
{
    tw_gdal_capture_begin(&g->gdal);
}

static void gdal_end(void)
{
    tw_gdal_capture_end();
}

static const char *gdal_msg(const tw_gpkg *g)
{
    return g->gdal.failure[0] ? g->gdal.failure : "unknown GDAL error";
}

/* ---- helpers ---- */

static void remove_with_sidecars(const char *path)
{
    static const char *const sfx[] = {"", "-journal", "-wal", "-shm"};
    char side[TW_PATH_MAX + 64];
    for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++) {
        snprintf(side, sizeof side, "%s%s", path, sfx[i]);
        (void)unlink(side);
    }
}

/* "p_" + the class name with everything outside [A-Za-z0-9_] made '_'.
 * SQLite column names compare without case, so a name that collides with
 * an earlier one (case-insensitively) gets the class index appended. */
static void prob_field_name(char (*names)[TW_NAME_MAX + 16], int c, const char *class_name)
{
    char *out = names[c];
    size_t k = (size_t)snprintf(out, TW_NAME_MAX + 16, "p_");
    for (const char *s = class_name; *s && k + 1 < TW_NAME_MAX + 2; s++)
        out[k++] = (isalnum((unsigned char)*s) || *s == '_') ? *s : '_';
    out[k] = '\0';
    for (int i = 0; i < c; i++) {
        if (strcasecmp(names[i], out) == 0) {
            snprintf(out + k, TW_NAME_MAX + 16 - k, "_%d", c);
            break;
        }
    }
}

static tw_status add_field(tw_gpkg *g, const char *name, OGRFieldType type, int width,
                           tw_error *err)
{
    OGRFieldDefnH fd = OGR_Fld_Create(name, type);
    if (!fd) return tw_error_set(err, TW_ERR_NOMEM, "out of memory creating field %s", name);
    if (width > 0) OGR_Fld_SetWidth(fd, width);
    OGRErr oe = OGR_L_CreateField(g->layer, fd, TRUE);
    OGR_Fld_Destroy(fd);
    if (oe != OGRERR_NONE)
        return tw_error_set(err, TW_ERR_OUTPUT, "%s: cannot create field %s: %s", g->path, name,
                            gdal_msg(g));
    return TW_OK;
}

static tw_status txn_begin(tw_gpkg *g, tw_error *err)
{
    if (GDALDatasetStartTransaction(g->ds, FALSE) != OGRERR_NONE)
        return tw_error_set(err, TW_ERR_OUTPUT, "%s: cannot start a transaction: %s", g->path,
                            gdal_msg(g));
    g->in_txn = 0;
    return TW_OK;
}

static tw_status txn_commit(tw_gpkg *g, tw_error *err)
{
    if (g->in_txn < 0) return TW_OK;
    g->in_txn = -1;
    if (GDALDatasetCommitTransaction(g->ds) != OGRERR_NONE)
        return tw_error_set(err, TW_ERR_OUTPUT, "%s: cannot commit features: %s", g->path,
                            gdal_msg(g));
    return TW_OK;
}

static tw_status create_layer(tw_gpkg *g, const tw_gpkg_params *p, tw_error *err)
{
    /* Without a CRS the GPKG driver would record srs_id 0, "undefined
     * geographic", and QGIS would take pixel coordinates for degrees; the
     * undefined cartesian one (srs_id -1) says what is meant. */
    const bool has_crs = p->crs_wkt && p->crs_wkt[0];
    OGRSpatialReferenceH srs = OSRNewSpatialReference(NULL);
    if (!srs) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    OSRSetAxisMappingStrategy(srs, OAMS_TRADITIONAL_GIS_ORDER);
    {
        const char *def = has_crs ? p->crs_wkt : "LOCAL_CS[\"Undefined cartesian SRS\"]";
        if (OSRSetFromUserInput(srs, def) != OGRERR_NONE) {
            OSRDestroySpatialReference(srs);
            return tw_error_set(err, TW_ERR_INPUT, "%s: the input's CRS is not understood: %s",
                                g->path, gdal_msg(g));
        }
    }
    char **opts = NULL;
    opts = CSLSetNameValue(opts, "GEOMETRY_NAME", "geom");
    opts = CSLSetNameValue(opts, "FID", "fid");
    opts = CSLSetNameValue(opts, "SPATIAL_INDEX", "YES");
    opts = CSLSetNameValue(opts, "DESCRIPTION", "tilewise: one polygon per classified tile");
    g->layer = GDALDatasetCreateLayer(g->ds, "tiles", srs, wkbPolygon, opts);
    CSLDestroy(opts);
    OSRDestroySpatialReference(srs);
    if (!g->layer)
        return tw_error_set(err, TW_ERR_OUTPUT, "%s: cannot create layer 'tiles': %s", g->path,
                            gdal_msg(g));

    tw_status st = add_field(g, "row", OFTInteger, 0, err);
    if (st == TW_OK) st = add_field(g, "col", OFTInteger, 0, err);
    if (st == TW_OK) st = add_field(g, "class", OFTInteger, 0, err);
    if (st == TW_OK) st = add_field(g, "class_name", OFTString, TW_NAME_MAX, err);
    if (st == TW_OK) st = add_field(g, "confidence", OFTReal, 0, err);
    if (st != TW_OK) return st;
    char(*names)[TW_NAME_MAX + 16] = tw_alloc(TW_MEM_OTHER, sizeof *names * (size_t)p->n_classes);
    if (!names) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    for (int c = 0; st == TW_OK && c < p->n_classes; c++) {
        prob_field_name(names, c, p->class_names[c]);
        st = add_field(g, names[c], OFTReal, 0, err);
    }
    tw_free(names);
    if (st != TW_OK) return st;
    g->feature = OGR_F_Create(OGR_L_GetLayerDefn(g->layer));
    if (!g->feature) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    return TW_OK;
}

/* ---- public ---- */

tw_status tw_gpkg_create(const tw_gpkg_params *p, tw_gpkg **out, tw_error *err)
{
    *out = NULL;
    if (!p->path || !p->path[0] || p->n_classes < 1 || p->n_classes > TW_MAX_CLASSES ||
        !p->class_names || p->tile < 1)
        return tw_error_set(err, TW_ERR_INTERNAL, "tw_gpkg_create: bad parameters");
    tw_gpkg *g = tw_calloc(TW_MEM_OTHER, 1, sizeof *g);
    if (!g) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    g->in_txn = -1;
    g->n_classes = p->n_classes;
    g->tile = p->tile;
    memcpy(g->gt, p->geotransform, sizeof g->gt);
    size_t plen = strlen(p->path);
    const char *slash = strrchr(p->path, '/');
    const char *base = slash ? slash + 1 : p->path;
    int dlen = slash ? (int)(slash - p->path) : 0;
    int n = snprintf(g->part_path, sizeof g->part_path, "%.*s%s.%s.part.gpkg", dlen, p->path,
                     slash ? "/" : "", base);
    if (plen >= sizeof g->path || n < 0 || (size_t)n >= sizeof g->part_path) {
        tw_free(g);
        return tw_error_set(err, TW_ERR_OUTPUT, "output path too long: %s", p->path);
    }
    memcpy(g->path, p->path, plen + 1);
    /* Found now rather than by the rename after the whole run. */
    struct stat sb;
    if (stat(g->path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        tw_free(g);
        return tw_error_set(err, TW_ERR_OUTPUT, "GeoPackage %s exists and is a directory", p->path);
    }
    snprintf(g->dir, sizeof g->dir, "%.*s", slash ? dlen : 1, slash ? p->path : ".");
    if (slash && dlen == 0) snprintf(g->dir, sizeof g->dir, "/");
    g->class_names = tw_alloc(TW_MEM_OTHER, sizeof *g->class_names * (size_t)p->n_classes);
    if (!g->class_names) {
        tw_free(g);
        return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    for (int c = 0; c < p->n_classes; c++)
        snprintf(g->class_names[c], TW_NAME_MAX, "%s", p->class_names[c]);

    gdal_begin(g);
    tw_status st = TW_OK;
    if (!GDALGetDriverByName("GPKG")) GDALAllRegister();
    GDALDriverH drv = GDALGetDriverByName("GPKG");
    if (!drv) st = tw_error_set(err, TW_ERR_INTERNAL, "GDAL was built without the GPKG driver");
    if (st == TW_OK) {
        /* A stale temporary from a killed run would make Create fail. */
        remove_with_sidecars(g->part_path);
        g->ds = GDALCreate(drv, g->part_path, 0, 0, 0, GDT_Unknown, NULL);
        if (!g->ds)
            st =
                tw_error_set(err, TW_ERR_OUTPUT, "cannot create %s: %s", g->part_path, gdal_msg(g));
    }
    if (st == TW_OK) st = create_layer(g, p, err);
    if (st == TW_OK) st = txn_begin(g, err);
    gdal_end();
    if (st != TW_OK) {
        tw_gpkg_destroy(g);
        return st;
    }
    *out = g;
    return TW_OK;
}

/* The tile's footprint: its four corners through the geotransform (which
 * may be rotated, so all four are computed), closed ring. */
static OGRGeometryH tile_polygon(const tw_gpkg *g, int32_t row, int32_t col)
{
    OGRGeometryH ring = OGR_G_CreateGeometry(wkbLinearRing);
    OGRGeometryH poly = OGR_G_CreateGeometry(wkbPolygon);
    if (!ring || !poly) {
        if (ring) OGR_G_DestroyGeometry(ring);
        if (poly) OGR_G_DestroyGeometry(poly);
        return NULL;
    }
    static const int dc[5] = {0, 1, 1, 0, 0}, dr[5] = {0, 0, 1, 1, 0};
    const double *gt = g->gt;
    for (int k = 0; k < 5; k++) {
        double px = (double)col + dc[k] * g->tile, py = (double)row + dr[k] * g->tile;
        OGR_G_AddPoint_2D(ring, gt[0] + px * gt[1] + py * gt[2], gt[3] + px * gt[4] + py * gt[5]);
    }
    if (OGR_G_AddGeometryDirectly(poly, ring) != OGRERR_NONE) {
        OGR_G_DestroyGeometry(poly);
        OGR_G_DestroyGeometry(ring);
        return NULL;
    }
    return poly;
}

tw_status tw_gpkg_append(tw_gpkg *g, int n, const int32_t *rows, const int32_t *cols,
                         const float *probs, tw_error *err)
{
    const int C = g->n_classes;
    tw_status st = TW_OK;
    gdal_begin(g);
    for (int i = 0; st == TW_OK && i < n; i++) {
        const float *pr = probs + (size_t)i * C;
        int best = tw_argmax(pr, (size_t)C);
        OGRFeatureH f = g->feature;
        OGR_F_SetFID(f, OGRNullFID);
        OGR_F_SetFieldInteger(f, F_ROW, rows[i]);
        OGR_F_SetFieldInteger(f, F_COL, cols[i]);
        OGR_F_SetFieldInteger(f, F_CLASS, best);
        OGR_F_SetFieldString(f, F_CLASS_NAME, g->class_names[best]);
        OGR_F_SetFieldDouble(f, F_CONFIDENCE, pr[best]);
        for (int c = 0; c < C; c++) OGR_F_SetFieldDouble(f, F_FIRST_PROB + c, pr[c]);
        OGRGeometryH poly = tile_polygon(g, rows[i], cols[i]);
        if (!poly) {
            st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
            break;
        }
        if (OGR_F_SetGeometryDirectly(f, poly) != OGRERR_NONE) {
            st = tw_error_set(err, TW_ERR_OUTPUT, "%s: cannot set the geometry of tile (%d, %d)",
                              g->path, (int)rows[i], (int)cols[i]);
            break;
        }
        if (OGR_L_CreateFeature(g->layer, f) != OGRERR_NONE) {
            st = tw_error_set(err, TW_ERR_OUTPUT, "%s: cannot write tile (%d, %d): %s", g->path,
                              (int)rows[i], (int)cols[i], gdal_msg(g));
            break;
        }
        if (++g->in_txn >= TW_GPKG_TXN) {
            st = txn_commit(g, err);
            if (st == TW_OK) st = txn_begin(g, err);
        }
    }
    gdal_end();
    return st;
}

tw_status tw_gpkg_finish(tw_gpkg *g, tw_error *err)
{
    gdal_begin(g);
    tw_status st = txn_commit(g, err);
    if (g->feature) {
        OGR_F_Destroy(g->feature);
        g->feature = NULL;
    }
    if (g->ds) {
        /* Close writes the spatial index and may fail on a full disk. */
        GDALClose(g->ds);
        g->ds = NULL;
        g->layer = NULL;
        if (st == TW_OK && g->gdal.failures)
            st = tw_error_set(err, TW_ERR_OUTPUT, "cannot close %s: %s", g->part_path, gdal_msg(g));
    }
    gdal_end();
    if (st != TW_OK) return st;
    char side[TW_PATH_MAX + 64];
    static const char *const sfx[] = {"-journal", "-wal", "-shm"};
    for (int i = 0; i < 3; i++) {
        snprintf(side, sizeof side, "%s%s", g->part_path, sfx[i]);
        (void)unlink(side);
    }
    st = tw_fsync_path(g->part_path, false, err);
    if (st != TW_OK) return st;
    if (rename(g->part_path, g->path) != 0)
        return tw_error_set(err, TW_ERR_OUTPUT, "cannot rename %s to %s: %s", g->part_path, g->path,
                            strerror(errno));
    g->finished = true;
    return tw_fsync_dir(g->dir, err);
}

void tw_gpkg_destroy(tw_gpkg *g)
{
    if (!g) return;
    CPLPushErrorHandler(CPLQuietErrorHandler);
    if (g->feature) OGR_F_Destroy(g->feature);
    if (g->ds) {
        if (g->in_txn >= 0) (void)GDALDatasetRollbackTransaction(g->ds);
        GDALClose(g->ds);
    }
    CPLPopErrorHandler();
    if (!g->finished) remove_with_sidecars(g->part_path);
    tw_free(g->class_names);
    tw_free(g);
}
