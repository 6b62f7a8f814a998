/* polygons.c - see polygons.h */
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

enum { TXN_FEATURES = 8192, NODATA = 255 };
enum { F_CLASS = 0, F_CLASS_NAME, F_AREA, F_CELLS, F_MEAN_CONF };

/* ---- growable arrays through the counting allocator ---- */

static bool grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return true;
    size_t nc = *cap ? *cap : (need > 1024 ? need : 1024);
    while (nc < need) nc *= 2;
    void *n = tw_alloc(TW_MEM_OTHER, nc * elem);
    if (!n) return false;
    if (*arr) memcpy(n, *arr, *cap * elem);
    tw_free(*arr);
    *arr = n;
    *cap = nc;
    return true;
}

/* ---- per-region statistics: a streaming 4-connected labelling ----
 *
 * Row by row, the runs of equal class of the current row join the
 * components of the runs of the row above that they share an edge with
 * (union-find over component ids). A component that no run of the current
 * row reaches is finished: its record (first cell in raster order, class,
 * cells, confidence sum) is kept and its id reused. Memory: the runs of two
 * rows and the components they reach, plus one record per region. */

typedef struct region {
    int64_t first; /* row * W + col of its first cell in raster order */
    int64_t cells;
    double conf_sum;
    int32_t cls;
    int32_t pad;
} region;

typedef struct run {
    int x0, x1; /* [x0, x1) */
    int cls;
    int comp;
} run;

typedef struct labeller {
    int W;
    int32_t *parent;
    int32_t *mark; /* row stamp: alive (root reached by the current row) / freed */
    region *acc;   /* per component id: the accumulating record */
    size_t cap;
    int32_t *free_ids;
    size_t n_free, free_cap;
    int32_t next_id;
    run *prev, *cur;
    int n_prev, n_cur;
    region *out; /* finished regions */
    size_t n_out, out_cap;
    bool count_only; /* count the finished regions, keep no record */
} labeller;

static int32_t lab_find(labeller *L, int32_t x)
{
    int32_t r = x;
    while (L->parent[r] != r) r = L->parent[r];
    while (L->parent[x] != r) {
        int32_t n = L->parent[x];
        L->parent[x] = r;
        x = n;
    }
    return r;
}

static int32_t lab_new(labeller *L, int32_t cls, int64_t first)
{
    int32_t id;
    if (L->n_free > 0) {
        id = L->free_ids[--L->n_free];
    } else {
        if (L->next_id == INT32_MAX) return -1;
        size_t need = (size_t)L->next_id + 1, c0 = L->cap, c1 = L->cap, c2 = L->cap;
        if (!grow((void **)&L->parent, &c0, need, sizeof *L->parent) ||
            !grow((void **)&L->mark, &c1, need, sizeof *L->mark) ||
            !grow((void **)&L->acc, &c2, need, sizeof *L->acc))
            return -1;
        L->cap = c0;
        id = L->next_id++;
    }
    L->parent[id] = id;
    L->mark[id] = -1;
    L->acc[id] = (region){.first = first, .cls = cls};
    return id;
}

static bool lab_free(labeller *L, int32_t id)
{
    if (!grow((void **)&L->free_ids, &L->free_cap, L->n_free + 1, sizeof *L->free_ids))
        return false;
    L->free_ids[L->n_free++] = id;
    return true;
}

/* Process row y (class values, confidence). Returns false when out of
 * memory. */
static bool lab_row(labeller *L, int y, const uint8_t *cls, const float *conf)
{
    const int W = L->W;
    L->n_cur = 0;
    for (int x = 0; x < W;) {
        int x1 = x + 1;
        while (x1 < W && cls[x1] == cls[x]) x1++;
        if (cls[x] != NODATA) L->cur[L->n_cur++] = (run){x, x1, cls[x], -1};
        x = x1;
    }
    /* join the runs above that share an edge and a class */
    int j = 0;
    for (int i = 0; i < L->n_cur; i++) {
        run *c = &L->cur[i];
        while (j < L->n_prev && L->prev[j].x1 <= c->x0) j++;
        int32_t comp = -1;
        for (int k = j; k < L->n_prev && L->prev[k].x0 < c->x1; k++) {
            if (L->prev[k].cls != c->cls) continue;
            int32_t r = lab_find(L, L->prev[k].comp);
            if (comp < 0) {
                comp = r;
            } else if (r != comp) {
                region *a = &L->acc[comp], *b = &L->acc[r];
                a->cells += b->cells;
                a->conf_sum += b->conf_sum;
                if (b->first < a->first) a->first = b->first;
                L->parent[r] = comp;
            }
        }
        if (comp < 0) comp = lab_new(L, c->cls, (int64_t)y * W + c->x0);
        if (comp < 0) return false;
        double s = 0;
        for (int x = c->x0; x < c->x1; x++) s += conf ? conf[x] : 0.0;
        L->acc[comp].cells += c->x1 - c->x0;
        L->acc[comp].conf_sum += s;
        c->comp = comp;
    }
    /* the roots the current row reaches are alive */
    for (int i = 0; i < L->n_cur; i++) {
        L->cur[i].comp = lab_find(L, L->cur[i].comp);
        L->mark[L->cur[i].comp] = y;
    }
    /* every other id the row above held is merged away or finished */
    for (int k = 0; k < L->n_prev; k++) {
        int32_t x = L->prev[k].comp;
        for (;;) {
            int32_t up = L->parent[x];
            if (L->mark[x] == y) break; /* alive root */
            if (L->mark[x] != -2 - y) {
                if (up == x && !L->count_only) {
                    if (!grow((void **)&L->out, &L->out_cap, L->n_out + 1, sizeof *L->out))
                        return false;
                    L->out[L->n_out] = L->acc[x];
                }
                if (up == x) L->n_out++;
                L->mark[x] = -2 - y; /* freed in this row (reused from the next one) */
                if (!lab_free(L, x)) return false;
            }
            if (up == x) break;
            x = up;
        }
    }
    run *t = L->prev;
    L->prev = L->cur;
    L->cur = t;
    L->n_prev = L->n_cur;
    return true;
}

/* After the last row: the roots it reached are finished too. */
static bool lab_end(labeller *L)
{
    for (int k = 0; k < L->n_prev; k++) {
        int32_t x = L->prev[k].comp;
        if (L->mark[x] == INT32_MIN) continue;
        if (!L->count_only) {
            if (!grow((void **)&L->out, &L->out_cap, L->n_out + 1, sizeof *L->out)) return false;
            L->out[L->n_out] = L->acc[x];
        }
        L->n_out++;
        L->mark[x] = INT32_MIN;
    }
    L->n_prev = 0;
    return true;
}

static void lab_release(labeller *L)
{
    tw_free(L->parent);
    tw_free(L->mark);
    tw_free(L->acc);
    tw_free(L->free_ids);
    tw_free(L->prev);
    tw_free(L->cur);
    tw_free(L->out);
}

static int cmp_region(const void *a, const void *b)
{
    int64_t x = ((const region *)a)->first, y = ((const region *)b)->first;
    return (x > y) - (x < y);
}

static const char *fmt_bytes(size_t n, char *buf, size_t size)
{
    if (n >= ((size_t)1 << 30))
        snprintf(buf, size, "%.2f GiB", n / (double)((size_t)1 << 30));
    else
        snprintf(buf, size, "%.1f MiB", n / (double)((size_t)1 << 20));
    return buf;
}

/* ---- the writer's state ---- */

typedef struct ctx {
    const tw_polygons_params *p;
    tw_error *err;
    tw_gdal_msgs gdal;
    GDALDatasetH cls_ds;   /* the class map polygonized (sieved or the input) */
    GDALRasterBandH cls_b; /* its band 1 */
    int W, H;
    double gt[6], inv[6];
    double cell_area;
    char sieved[TW_PATH_MAX + 64];
    char raw[TW_PATH_MAX + 64];
    char part[TW_PATH_MAX + 64];
    char dir[TW_PATH_MAX];
} ctx;

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
        if (!lab_row(L, y, row, cb ? conf : NULL))
            st = tw_error_set(c->err, TW_ERR_NOMEM, "out of memory labelling the class map");
    }
    if (st == TW_OK && !lab_end(L))
        st = tw_error_set(c->err, TW_ERR_NOMEM, "out of memory labelling the class map");
    tw_free(row);
    tw_free(conf);
    if (st == TW_OK && !count_only) qsort(L->out, L->n_out, sizeof *L->out, cmp_region);
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

/* ---- simplification that keeps shared boundaries shared ---- */

typedef struct pt {
    int64_t x, y; /* grid node: column, row */
} pt;

static int pt_cmp(pt a, pt b)
{
    if (a.y != b.y) return a.y < b.y ? -1 : 1;
    if (a.x != b.x) return a.x < b.x ? -1 : 1;
    return 0;
}

/* The class of cell (x, y), NODATA outside. */
static int cell(const ctx *c, int64_t x, int64_t y)
{
    if (x < 0 || y < 0 || x >= c->W || y >= c->H) return NODATA;
    uint8_t v = NODATA;
    if (GDALRasterIO(c->cls_b, GF_Read, (int)x, (int)y, 1, 1, &v, 1, 1, GDT_Byte, 0, 0) != CE_None)
        return NODATA;
    return v;
}

/* Where three or more regions (nodata counting as one) meet, or two cells
 * of a class touch at the corner only, or a corner of the raster: every
 * polygon whose boundary passes the node breaks its boundary there. */
static bool junction(const ctx *c, pt n)
{
    /* the raster's corners stay, so a map without nodata keeps its extent */
    if ((n.x == 0 || n.x == c->W) && (n.y == 0 || n.y == c->H)) return true;
    int a = cell(c, n.x - 1, n.y - 1), b = cell(c, n.x, n.y - 1);
    int d = cell(c, n.x - 1, n.y), e = cell(c, n.x, n.y);
    int distinct = 1 + (b != a) + (d != a && d != b) + (e != a && e != b && e != d);
    return distinct >= 3 || (a == e && b == d && a != b);
}

/* Douglas-Peucker keep flags over q[i..j] (both kept), tolerance tol. */
static bool dp(const pt *q, int i, int j, double tol, uint8_t *keep, int *stack)
{
    int sp = 0;
    stack[sp++] = i;
    stack[sp++] = j;
    while (sp > 0) {
        int b = stack[--sp], a = stack[--sp];
        keep[a] = keep[b] = 1;
        if (b - a < 2) continue;
        double dx = (double)(q[b].x - q[a].x), dy = (double)(q[b].y - q[a].y);
        double len = sqrt(dx * dx + dy * dy);
        double best = -1;
        int bi = -1;
        for (int k = a + 1; k < b; k++) {
            double ex = (double)(q[k].x - q[a].x), ey = (double)(q[k].y - q[a].y);
            double dist = len > 0 ? fabs(dx * ey - dy * ex) / len : sqrt(ex * ex + ey * ey);
            if (dist > best) best = dist, bi = k;
        }
        if (best > tol) {
            stack[sp++] = a;
            stack[sp++] = bi;
            stack[sp++] = bi;
            stack[sp++] = b;
        }
    }
    return true;
}

/* Simplify arc q[0..n-1] (its ends kept) the same way from either end:
 * in its canonical direction, with its middle (a closed arc: its thirds)
 * kept so that no ring collapses. keep[] gets the flags in q's order. */
/* Boundary pieces kept exact: those of polygons that simplification made
 * invalid, by a 64-bit hash of the piece in its canonical direction (a
 * collision only keeps another piece exact too). Open addressing, 0 empty. */
typedef struct arcset {
    uint64_t *slot;
    size_t cap, n;
    uint64_t *cur; /* the pieces of the polygon being simplified */
    size_t n_cur, cur_cap;
} arcset;

static uint64_t mix(uint64_t h, int64_t v)
{
    h ^= (uint64_t)v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ULL;
    return h ^ (h >> 29);
}

static bool arcset_has(const arcset *a, uint64_t k)
{
    if (!a->cap) return false;
    for (size_t i = k & (a->cap - 1);; i = (i + 1) & (a->cap - 1)) {
        if (a->slot[i] == k) return true;
        if (a->slot[i] == 0) return false;
    }
}

/* Add k; false when out of memory. *added: it was new. */
static bool arcset_add(arcset *a, uint64_t k, bool *added)
{
    if (arcset_has(a, k)) return true;
    if (2 * (a->n + 1) > a->cap) {
        size_t nc = a->cap ? 2 * a->cap : 1024;
        uint64_t *ns = tw_calloc(TW_MEM_OTHER, nc, sizeof *ns);
        if (!ns) return false;
        for (size_t i = 0; i < a->cap; i++) {
            if (!a->slot[i]) continue;
            size_t j = a->slot[i] & (nc - 1);
            while (ns[j]) j = (j + 1) & (nc - 1);
            ns[j] = a->slot[i];
        }
        tw_free(a->slot);
        a->slot = ns;
        a->cap = nc;
    }
    size_t j = k & (a->cap - 1);
    while (a->slot[j]) j = (j + 1) & (a->cap - 1);
    a->slot[j] = k;
    a->n++;
    *added = true;
    return true;
}

static void arcset_release(arcset *a)
{
    tw_free(a->slot);
    tw_free(a->cur);
    memset(a, 0, sizeof *a);
}

static bool simplify_arc(pt *q, int n, double tol, uint8_t *keep, int *stack, pt *tmp,
                         uint8_t *ktmp, arcset *fz)
{
    if (n < 2) { /* a lone point stays (and GCC's -Wstringop-overflow knows n > 0 below) */
        if (n == 1) keep[0] = 1;
        return true;
    }
    bool closed = pt_cmp(q[0], q[n - 1]) == 0;
    int o = pt_cmp(q[0], q[n - 1]);
    if (o == 0 && n > 2) o = pt_cmp(q[1], q[n - 2]);
    bool rev = o > 0;
    for (int i = 0; i < n; i++) tmp[i] = rev ? q[n - 1 - i] : q[i];
    memset(ktmp, 0, (size_t)n);
    /* the piece's key: its ends and its second node, canonical */
    uint64_t key = mix(mix(mix(mix(mix(mix(1, tmp[0].x), tmp[0].y), tmp[n - 1].x), tmp[n - 1].y),
                           n > 1 ? tmp[1].x : 0),
                       n > 1 ? tmp[1].y : 0);
    if (!key) key = 1;
    if (!grow((void **)&fz->cur, &fz->cur_cap, fz->n_cur + 1, sizeof *fz->cur)) return false;
    fz->cur[fz->n_cur++] = key;
    if (arcset_has(fz, key)) {
        memset(keep, 1, (size_t)n);
        return true;
    }
    if (closed && n >= 4) {
        int a = (n - 1) / 3, b = 2 * (n - 1) / 3;
        dp(tmp, 0, a, tol, ktmp, stack);
        dp(tmp, a, b, tol, ktmp, stack);
        dp(tmp, b, n - 1, tol, ktmp, stack);
    } else if (n >= 3) {
        int m = (n - 1) / 2;
        dp(tmp, 0, m, tol, ktmp, stack);
        dp(tmp, m, n - 1, tol, ktmp, stack);
    } else {
        dp(tmp, 0, n - 1, tol, ktmp, stack);
    }
    for (int i = 0; i < n; i++) keep[i] = ktmp[rev ? n - 1 - i : i];
    return true;
}

typedef struct simp {
    pt *q, *tmp;
    uint8_t *keep, *ktmp, *junc;
    int *stack;
    size_t cap;
    arcset fz;
} simp;

static void simp_free_buffers(simp *s)
{
    tw_free(s->q);
    tw_free(s->tmp);
    tw_free(s->keep);
    tw_free(s->ktmp);
    tw_free(s->junc);
    tw_free(s->stack);
    s->q = s->tmp = NULL;
    s->keep = s->ktmp = s->junc = NULL;
    s->stack = NULL;
    s->cap = 0;
}

static void simp_release(simp *s)
{
    simp_free_buffers(s);
    arcset_release(&s->fz);
}

static bool simp_reserve(simp *s, size_t n)
{
    if (n <= s->cap) return true;
    size_t cap = s->cap ? s->cap : 1024;
    while (cap < n) cap *= 2;
    simp_free_buffers(s);
    s->q = tw_alloc(TW_MEM_OTHER, cap * sizeof(pt));
    s->tmp = tw_alloc(TW_MEM_OTHER, cap * sizeof(pt));
    s->keep = tw_alloc(TW_MEM_OTHER, cap);
    s->ktmp = tw_alloc(TW_MEM_OTHER, cap);
    s->junc = tw_alloc(TW_MEM_OTHER, cap);
    s->stack = tw_alloc(TW_MEM_OTHER, 4 * cap * sizeof(int));
    s->cap = cap;
    return s->q && s->tmp && s->keep && s->ktmp && s->junc && s->stack;
}

/* One ring, simplified. NULL when out of memory. */
static OGRGeometryH simplify_ring(const ctx *c, OGRGeometryH ring, double tol, simp *s)
{
    int n = OGR_G_GetPointCount(ring);
    /* every grid node along the ring (its edges are axis-parallel in cell
     * space), open (no repeated first point) */
    size_t total = 0;
    pt prev = {0, 0};
    for (int i = 0; i < n; i++) {
        double X = OGR_G_GetX(ring, i), Y = OGR_G_GetY(ring, i);
        pt v = {llround(c->inv[0] + X * c->inv[1] + Y * c->inv[2]),
                llround(c->inv[3] + X * c->inv[4] + Y * c->inv[5])};
        if (i > 0) total += (size_t)(llabs(v.x - prev.x) + llabs(v.y - prev.y));
        prev = v;
    }
    if (!simp_reserve(s, total + 2)) return NULL;
    size_t m = 0;
    for (int i = 0; i < n; i++) {
        double X = OGR_G_GetX(ring, i), Y = OGR_G_GetY(ring, i);
        pt v = {llround(c->inv[0] + X * c->inv[1] + Y * c->inv[2]),
                llround(c->inv[3] + X * c->inv[4] + Y * c->inv[5])};
        if (i == 0) {
            s->q[m++] = v;
        } else {
            pt u = s->q[m - 1];
            int64_t sx = (v.x > u.x) - (v.x < u.x), sy = (v.y > u.y) - (v.y < u.y);
            while (u.x != v.x || u.y != v.y) {
                u.x += sx;
                u.y += sy;
                s->q[m++] = u;
            }
        }
    }
    if (m > 1 && pt_cmp(s->q[0], s->q[m - 1]) == 0) m--; /* open */
    /* keep corners and junctions only: both neighbours see the same ones */
    size_t k = 0;
    int first_j = -1;
    for (size_t i = 0; i < m; i++) {
        pt a = s->q[(i + m - 1) % m], b = s->q[i], d = s->q[(i + 1) % m];
        bool corner = (a.x - b.x) * (d.y - b.y) - (a.y - b.y) * (d.x - b.x) != 0;
        bool j = junction(c, b);
        if (!corner && !j) continue;
        s->tmp[k] = b;
        s->junc[k] = j;
        if (j && first_j < 0) first_j = (int)k;
        k++;
    }
    /* rotate: start at a junction, or (none) at the smallest node; the ring
     * then closes on its start */
    int start = first_j;
    if (start < 0) {
        start = 0;
        for (size_t i = 1; i < k; i++)
            if (pt_cmp(s->tmp[i], s->tmp[start]) < 0) start = (int)i;
    }
    for (size_t i = 0; i <= k; i++) {
        s->q[i] = s->tmp[(start + i) % k];
        s->ktmp[i] = s->junc[(start + i) % k];
    }
    memcpy(s->junc, s->ktmp, k + 1);
    size_t len = k + 1; /* closed */
    memset(s->keep, 0, len);
    /* arcs between consecutive junctions (or the whole ring) */
    size_t a = 0;
    pt *q2 = tw_alloc(TW_MEM_OTHER, len * sizeof(pt));
    uint8_t *k2 = tw_alloc(TW_MEM_OTHER, len);
    uint8_t *kt = tw_alloc(TW_MEM_OTHER, len);
    if (!q2 || !k2 || !kt) {
        tw_free(q2);
        tw_free(k2);
        tw_free(kt);
        return NULL;
    }
    while (a < len - 1) {
        size_t b = a + 1;
        while (b < len - 1 && !s->junc[b]) b++;
        int an = (int)(b - a + 1);
        if (!simplify_arc(s->q + a, an, tol, k2, s->stack, q2, kt, &s->fz)) {
            tw_free(q2);
            tw_free(k2);
            tw_free(kt);
            return NULL;
        }
        for (int i = 0; i < an; i++) s->keep[a + (size_t)i] |= k2[i];
        a = b;
    }
    tw_free(q2);
    tw_free(k2);
    tw_free(kt);
    OGRGeometryH out = OGR_G_CreateGeometry(wkbLinearRing);
    if (!out) return NULL;
    for (size_t i = 0; i < len; i++) {
        if (!s->keep[i]) continue;
        double px = (double)s->q[i].x, py = (double)s->q[i].y;
        OGR_G_AddPoint_2D(out, c->gt[0] + px * c->gt[1] + py * c->gt[2],
                          c->gt[3] + px * c->gt[4] + py * c->gt[5]);
    }
    return out;
}

static OGRGeometryH simplify_polygon(const ctx *c, OGRGeometryH poly, double tol, simp *s)
{
    OGRGeometryH out = OGR_G_CreateGeometry(wkbPolygon);
    if (!out) return NULL;
    for (int r = 0; r < OGR_G_GetGeometryCount(poly); r++) {
        OGRGeometryH ring = simplify_ring(c, OGR_G_GetGeometryRef(poly, r), tol, s);
        if (!ring || OGR_G_AddGeometryDirectly(out, ring) != OGRERR_NONE) {
            if (ring) OGR_G_DestroyGeometry(ring);
            OGR_G_DestroyGeometry(out);
            return NULL;
        }
    }
    return out;
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

/* The boundary pieces whose simplification leaves a polygon invalid
 * (Douglas-Peucker moved one across another) are kept exact, in both
 * polygons that share them; again until no polygon adds a piece (a
 * polygon with every piece exact is the valid original). */
static tw_status mark_exact_pieces(ctx *c, OGRLayerH raw, double tol, simp *s)
{
    tw_status st = TW_OK;
    for (int pass = 0; st == TW_OK && pass < 32; pass++) {
        bool added_any = false;
        OGR_L_ResetReading(raw);
        OGRFeatureH pf;
        while (st == TW_OK && (pf = OGR_L_GetNextFeature(raw)) != NULL) {
            OGRGeometryH g = OGR_F_GetGeometryRef(pf);
            s->fz.n_cur = 0;
            OGRGeometryH sg = g ? simplify_polygon(c, g, tol, s) : NULL;
            if (!sg) st = tw_error_set(c->err, TW_ERR_NOMEM, "out of memory simplifying polygons");
            if (sg && !OGR_G_IsValid(sg))
                for (size_t k = 0; st == TW_OK && k < s->fz.n_cur; k++) {
                    bool added = false;
                    if (!arcset_add(&s->fz, s->fz.cur[k], &added))
                        st = tw_error_set(c->err, TW_ERR_NOMEM, "out of memory");
                    added_any = added_any || added;
                }
            if (sg) OGR_G_DestroyGeometry(sg);
            OGR_F_Destroy(pf);
        }
        if (!added_any) break;
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
            OGRGeometryH sg = simplify_polygon(c, g, tol, s);
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
    if (st == TW_OK && p->simplify > 0) st = mark_exact_pieces(c, raw, tol, &s);
    int64_t n = 0;
    if (st == TW_OK) st = write_features(c, ds, raw, L, l, f, tol, &s, &n);
    simp_release(&s);
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
        lab_release(&L0);
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
    lab_release(&L);
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
