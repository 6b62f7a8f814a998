/* polygons_internal.h - what io/output/polygons*.c share (private to
 * io/output/): the writer's state (ctx), the streaming labelling's regions
 * (polygons_label.c) and the simplification's buffers (polygons_simplify.c),
 * which polygons.c (the writer) drives. */
#ifndef TW_POLYGONS_INTERNAL_H
#define TW_POLYGONS_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <gdal.h>
#include <ogr_api.h>

#include "core/alloc.h"
#include "core/error.h"
#include "io/gdal_msgs.h"
#include "io/output/polygons.h"

enum { TXN_FEATURES = 8192, NODATA = 255 };

/* ---- growable arrays through the counting allocator ---- */

static inline bool grow(void **arr, size_t *cap, size_t need, size_t elem)
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

/* ---- per-region statistics (polygons_label.c) ---- */

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

/* Process row y (class values, confidence); after the last row, finish
 * the roots it reached; release. false when out of memory. Finished
 * regions sort by their first cell with tw_poly_cmp_region (qsort). */
bool tw_poly_lab_row(labeller *L, int y, const uint8_t *cls, const float *conf);
bool tw_poly_lab_end(labeller *L);
void tw_poly_lab_release(labeller *L);
int tw_poly_cmp_region(const void *a, const void *b);

/* ---- the writer's state (polygons.c) ---- */

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

/* ---- simplification that keeps shared boundaries shared
 * (polygons_simplify.c) ---- */

typedef struct pt {
    int64_t x, y; /* grid node: column, row */
} pt;

/* Boundary pieces kept exact: those of polygons that simplification made
 * invalid, by a 64-bit hash of the piece in its canonical direction (a
 * collision only keeps another piece exact too). Open addressing, 0 empty. */
typedef struct arcset {
    uint64_t *slot;
    size_t cap, n;
    uint64_t *cur; /* the pieces of the polygon being simplified */
    size_t n_cur, cur_cap;
} arcset;

typedef struct simp {
    pt *q, *tmp;
    uint8_t *keep, *ktmp, *junc;
    int *stack;
    size_t cap;
    arcset fz;
} simp;

void tw_poly_simp_release(simp *s);
/* A polygon of the grid simplified with tolerance tol. NULL when out of
 * memory. */
OGRGeometryH tw_poly_simplify_polygon(const ctx *c, OGRGeometryH poly, double tol, simp *s);
tw_status tw_poly_mark_exact_pieces(ctx *c, OGRLayerH raw, double tol, simp *s);

#endif
