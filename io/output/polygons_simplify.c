/* polygons_simplify.c - the polygons product's simplification: Douglas-
 * Peucker on the boundary pieces between junctions, the same from either
 * side, so that shared boundaries stay shared; pieces that would leave a
 * polygon invalid kept exact (polygons_internal.h; polygons.c, the writer,
 * calls it when output.simplify is set). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <gdal.h>
#include <ogr_api.h>

#include "core/alloc.h"
#include "io/output/polygons_internal.h"

/* ---- simplification that keeps shared boundaries shared ---- */

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

void tw_poly_simp_release(simp *s)
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

OGRGeometryH tw_poly_simplify_polygon(const ctx *c, OGRGeometryH poly, double tol, simp *s)
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

/* The boundary pieces whose simplification leaves a polygon invalid
 * (Douglas-Peucker moved one across another) are kept exact, in both
 * polygons that share them; again until no polygon adds a piece (a
 * polygon with every piece exact is the valid original). */
tw_status tw_poly_mark_exact_pieces(ctx *c, OGRLayerH raw, double tol, simp *s)
{
    tw_status st = TW_OK;
    for (int pass = 0; st == TW_OK && pass < 32; pass++) {
        bool added_any = false;
        OGR_L_ResetReading(raw);
        OGRFeatureH pf;
        while (st == TW_OK && (pf = OGR_L_GetNextFeature(raw)) != NULL) {
            OGRGeometryH g = OGR_F_GetGeometryRef(pf);
            s->fz.n_cur = 0;
            OGRGeometryH sg = g ? tw_poly_simplify_polygon(c, g, tol, s) : NULL;
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
