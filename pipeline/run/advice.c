/* advice.c - advice before the first tile, as data (see advice.h) */
#include "pipeline/run/advice.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "io/input/inspect.h"
#include "io/input/raster.h"
#include "io/url.h"
#include "pipeline/engine/plan.h"
#include "pipeline/run/preflight.h"
#include "pipeline/resolved.h"

__attribute__((format(printf, 5, 6))) static void add(tw_advice *a, bool warning, const char *code,
                                                      int input, const char *fmt, ...)
{
    if (a->n >= TW_ADVICE_MAX) return;
    tw_advice_item *it = &a->items[a->n++];
    it->warning = warning;
    a->n_warnings += warning;
    snprintf(it->code, sizeof it->code, "%s", code);
    it->input = input;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(it->text, sizeof it->text, fmt, ap);
    va_end(ap);
}

#define WARN(code, ...) add(a, true, code, input, __VA_ARGS__)
#define NOTE(kind, ...) add(a, false, kind, input, __VA_ARGS__)

static void check_georef(tw_advice *a, int input, const char *path, const tw_inspect *ri, int tile)
{
    if (!ri->has_geotransform) {
        WARN("no_geotransform", "%s: no geotransform: the outputs will be in pixel coordinates",
             path);
        return;
    }
    if (!ri->has_crs) {
        WARN("no_crs",
             "%s: no CRS: the outputs will have none either (assign one with gdal_edit.py "
             "-a_srs)",
             path);
        return;
    }
    if (!ri->crs_understood) {
        WARN("crs_unknown", "%s: its CRS is not understood by GDAL", path);
        return;
    }
    double px, py;
    if (!tw_inspect_pixel_metres(ri, &px, &py)) {
        NOTE("crs", "%s: %s", path, ri->crs);
        return;
    }
    const double *gt = ri->geotransform;
    const char *unit = ri->crs_units;
    NOTE("crs", "%s: %s, units %s; pixel %.4g x %.4g m, a tile of %d px covers %.3g x %.3g km",
         path, ri->crs, unit, px, py, tile, tile * px / 1000, tile * py / 1000);
    bool geographic = ri->crs_geographic;
    if (gt[2] != 0 || gt[4] != 0)
        WARN("rotated",
             "%s: the raster is rotated (geotransform terms %g, %g): tiles follow its pixel "
             "grid, not north",
             path, gt[2], gt[4]);
    double ratio = px / py;
    if (ratio > 1.5 || ratio < 1 / 1.5)
        WARN("stretched",
             "%s: pixels are %.3g m wide but %.3g m high%s: the model sees stretched images "
             "(reproject with gdalwarp -t_srs to a projected CRS)",
             path, px, py, geographic ? " (degrees of longitude shrink with latitude)" : "");
    if (geographic && tile * fmax(px, py) > 10000)
        WARN("geographic_tile",
             "%s: in a geographic CRS (%s) a tile of %d px spans about %.0f km: is that the "
             "resolution the model was trained at?",
             path, unit, tile, tile * fmax(px, py) / 1000);
    if (fmin(px, py) < 0.05 || fmax(px, py) > 5000)
        WARN("pixel_size",
             "%s: a pixel size of %.3g m is unusual for satellite imagery: are the CRS units "
             "(%s) right?",
             path, fmin(px, py) < 0.05 ? fmin(px, py) : fmax(px, py), unit);
}

/* Tiles that are more padding than raster (tiling.edge pad at the edges,
 * any raster smaller than a tile): the model sees zeros it was not trained
 * on, and classifies such a tile from little data. */
static void check_padding(tw_advice *a, int input, const char *path, const tw_inspect *ri,
                          const tw_resolved *m, tw_edge_mode edge)
{
    double pad = tw_preflight_padding(ri->width, ri->height, m->tile, m->stride, edge);
    if (pad > 0.5)
        WARN("padding",
             "%s: %d x %d pixels in tiles of %d: %.0f %% of the pixels of its tiles are padding "
             "outside the raster (0 after normalization), which the model was not trained on: "
             "a smaller tiling.tile, if the model takes one, or a larger raster",
             path, ri->width, ri->height, m->tile, 100 * pad);
}

/* |mean after input.scale, mean and std| above this is warned (KEYS.md,
 * input.scale): a network trained on (x - mean) / std saw band means within
 * a few units of 0. */
#define Z_MAX 3.0

typedef struct band_fit {
    bool used;        /* statistics known and the model's mean/std apply */
    double mu, m, sd; /* the raster's sampled mean; the model's mean and std */
} band_fit;

static double z_of(const band_fit *f, double scale)
{
    return (f->mu * scale - f->m) / f->sd;
}

/* Whether scale puts every used band's normalized mean within +-Z_MAX. */
static bool fits_all(const band_fit *f, int n, double scale)
{
    for (int i = 0; i < n; i++)
        if (f[i].used && !(fabs(z_of(&f[i], scale)) <= Z_MAX)) return false;
    return true;
}

/* The value to suggest for scale s (bands f[0..n)): the power of ten
 * nearest s when it, too, puts them within +-Z_MAX, else s itself. */
static double suggest(const band_fit *f, int n, double s)
{
    double p = pow(10.0, round(log10(s)));
    return fits_all(f, n, p) ? p : s;
}

/* The scale hint, computed (KEYS.md, input.scale): the s that puts the
 * normalized band means nearest 0 (least squares over the bands,
 * sum((mu s - m) / sd)^2 least), suggested as suggest() when it puts every
 * band within +-Z_MAX; *common false when none does, and each band gets its
 * own m / mu into per[] (0: none). Returns the common s, 0 when none. */
static double scale_hint(const band_fit *f, int n, bool *common, double *per)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        per[i] = 0;
        if (!f[i].used || f[i].mu == 0) continue;
        num += f[i].mu * f[i].m / (f[i].sd * f[i].sd);
        den += f[i].mu * f[i].mu / (f[i].sd * f[i].sd);
        double s = f[i].m / f[i].mu;
        if (s > 0 && isfinite(s)) per[i] = suggest(&f[i], 1, s);
    }
    double s = den > 0 ? num / den : 0;
    *common = s > 0 && isfinite(s) && fits_all(f, n, s);
    return *common ? suggest(f, n, s) : 0;
}

static void check_values(tw_advice *a, int input, const char *path, const char *gdal_path,
                         const tw_resolved *m)
{
    int n = m->n_bands > 0 ? m->n_bands : m->in_bands;
    int bands[TW_MAX_BANDS];
    tw_band_stats st[TW_MAX_BANDS];
    band_fit fit[TW_MAX_BANDS];
    bool flagged[TW_MAX_BANDS];
    for (int i = 0; i < n; i++) bands[i] = m->n_bands > 0 ? m->bands[i] : i + 1;
    /* Without a mean/std (neither the workflow nor the bundle gave one: 0
     * and 1 throughout) nothing says what the model was trained on. */
    bool known = false;
    for (int i = 0; i < m->n_norm; i++) known |= m->mean[i] != 0.0f || m->std[i] != 1.0f;
    if (!known) {
        NOTE("values",
             "%s: the model's mean/std are not known (0 and 1): value ranges not "
             "checked",
             path);
        return;
    }
    tw_error err;
    tw_error_init(&err);
    if (tw_inspect_band_stats(gdal_path, bands, n, st, &err) != TW_OK) return;
    int fits = 0, n_flagged = 0;
    for (int i = 0; i < n; i++) {
        flagged[i] = false;
        fit[i] = (band_fit){.used = st[i].how && st[i].ok && m->std[i] > 0,
                            .mu = st[i].mean,
                            .m = m->mean[i],
                            .sd = m->std[i]};
        if (!fit[i].used) continue;
        double zlo = (st[i].min * m->scale - fit[i].m) / fit[i].sd;
        double zhi = (st[i].max * m->scale - fit[i].m) / fit[i].sd;
        /* A band mean outside +-Z_MAX, a range squeezed to nothing or
         * hundreds of units wide: the classic wrong-input.scale symptoms. */
        bool far = !(fabs(z_of(&fit[i], m->scale)) <= Z_MAX), wide = zhi - zlo > 200,
             flat = st[i].max > st[i].min && zhi - zlo < 0.05;
        flagged[i] = far || wide || flat;
        n_flagged += flagged[i];
        fits += !flagged[i];
    }
    bool common = false;
    double per[TW_MAX_BANDS];
    double hint = n_flagged > 0 ? scale_hint(fit, n, &common, per) : 0;
    for (int i = 0; i < n; i++) {
        if (!st[i].how) continue; /* no such band: the run's checks say so */
        if (!st[i].ok) {          /* the run's own reads say what is wrong, if anything */
            NOTE("values", "%s band %d: cannot compute its statistics (no valid pixels?)", path,
                 bands[i]);
            continue;
        }
        if (!flagged[i]) continue;
        const band_fit *f = &fit[i];
        double z = z_of(f, m->scale);
        double zlo = (st[i].min * m->scale - f->m) / f->sd;
        double zhi = (st[i].max * m->scale - f->m) / f->sd;
        char why[128] = "", tip[200] = "";
        if (!(fabs(z) <= Z_MAX))
            snprintf(why, sizeof why, "a mean outside +-%g: far from what it was trained on",
                     Z_MAX);
        if (zhi - zlo > 200 || (st[i].max > st[i].min && zhi - zlo < 0.05))
            snprintf(why + strlen(why), sizeof why - strlen(why), "%s%s", why[0] ? ", " : "",
                     zhi - zlo > 200 ? "a very wide range" : "almost constant");
        if (common && fabs(hint - m->scale) > 1e-9 * m->scale) /* pow(10, -4) vs 0.0001 */
            snprintf(tip, sizeof tip, "; is input.scale %g meant?", hint);
        else if (!common && per[i] > 0)
            snprintf(tip, sizeof tip,
                     "; this band alone would need input.scale %.3g, and no one scale puts "
                     "every band within +-%g (are input.bands in the model's order?)",
                     per[i], Z_MAX);
        WARN("values",
             "%s band %d: values %g..%g, mean %.4g (%s) x scale %g give %.3g..%.3g, mean %.3g "
             "after the model's mean %g / std %g: %s%s",
             path, bands[i], st[i].min, st[i].max, st[i].mean, st[i].how, m->scale, zlo, zhi, z,
             f->m, f->sd, why, tip);
    }
    NOTE("values",
         "%s: %d of %d bands with a mean within +-%g and a plausible range after the model's "
         "mean/std (scale %g)",
         path, fits, n, Z_MAX, m->scale);
}

/* Whether the tile at index (ax_i, ay_i) is classified: the run's rule
 * (plan.h, tw_tile_classified) on its pixels inside the raster. */
static bool tile_classified(tw_raster *r, const tw_plan *pl, int ax_i, int ay_i, double max_frac,
                            void *raw, uint8_t *valid)
{
    int x0 = tw_axis_pos(&pl->x, pl->tile, pl->stride, ax_i);
    int y0 = tw_axis_pos(&pl->y, pl->tile, pl->stride, ay_i);
    int64_t n_nodata = 0, n_inside = 0;
    tw_error e;
    tw_error_init(&e);
    if (tw_raster_read(r, x0 < 0 ? 0 : x0, y0 < 0 ? 0 : y0, pl->tile, pl->tile, raw, valid,
                       &n_nodata, &n_inside, &e) != TW_OK)
        return true; /* unreadable: the run's on_error decides, not this advice */
    return tw_tile_classified(n_nodata, n_inside, max_frac);
}

/* Valid pixels that no classified tile would cover (tiles above
 * tiling.max_nodata_fraction, or edge: skip), estimated on up to 128 output
 * cells spread evenly over the grid: each cell's valid pixels count as
 * unclassified when none of the tiles feeding it is classified. Warned when
 * above 1 % of the sampled valid pixels: at output.resolution: input they
 * are nodata in every product although the input has data there. */
static void check_unclassified(tw_advice *a, int input, const char *path, const char *src,
                               const tw_run_params *p, const struct tw_resolved *m)
{
    tw_raster *r = NULL;
    tw_error e;
    tw_error_init(&e);
    tw_raster_open_params op = {.tiff_direct = p->input.tiff_direct};
    if (tw_raster_open_ex(src, m->bands, m->n_bands, &op, &r, &e) != TW_OK) return;
    const tw_raster_info *ri = tw_raster_get_info(r);
    tw_raster_set_nodata_rule(r, p->input.nodata_auto, p->input.nodata);
    tw_plan pl;
    size_t px = (size_t)m->tile * (size_t)m->tile;
    void *raw =
        tw_alloc(TW_MEM_OTHER, px * (size_t)tw_raster_selected_bands(r) * tw_dtype_size(ri->dtype));
    uint8_t *valid = tw_alloc(TW_MEM_OTHER, px);
    /* k = tile / stride tiles feed a cell on each axis: up to 64 are looked at */
    if (raw && valid && m->tile / m->stride <= 64 &&
        tw_plan_make_cell(ri->width, ri->height, m->tile, m->stride, m->cell, p->tiling.edge, 0, 1,
                          &pl, &e) == TW_OK) {
        int64_t cells = (int64_t)pl.grid_w * pl.grid_h, n_s = cells < 128 ? cells : 128;
        int64_t valid_px = 0, lost_px = 0;
        for (int64_t s = 0; s < n_s; s++) {
            int64_t c = s * cells / n_s;
            int cx = (int)(c % pl.grid_w), cy = (int)(c / pl.grid_w);
            /* the cell's own pixels */
            int bx = cx * m->stride, by = cy * m->stride;
            int bw = m->stride < ri->width - bx ? m->stride : ri->width - bx;
            int bh = m->stride < ri->height - by ? m->stride : ri->height - by;
            int64_t nod = 0, ins = 0;
            if (tw_raster_read(r, bx, by, bw, bh, raw, valid, &nod, &ins, &e) != TW_OK) continue;
            int64_t v = ins - nod;
            if (v <= 0) continue;
            valid_px += v;
            /* the tiles feeding the cell: aligned ones at cx-k+1..cx, and the
             * edge-flush one (plan.h), on each axis */
            int cand_x[65], cand_y[65], nx = 0, ny = 0;
            for (int t = cx - pl.k + 1; t <= cx; t++)
                if (t >= 0 && t < pl.x.n_aligned) cand_x[nx++] = t;
            if (pl.x.shifted) cand_x[nx++] = pl.x.n_pos - 1;
            for (int t = cy - pl.k + 1; t <= cy; t++)
                if (t >= 0 && t < pl.y.n_aligned) cand_y[ny++] = t;
            if (pl.y.shifted) cand_y[ny++] = pl.y.n_pos - 1;
            bool covered = false;
            for (int iy = 0; !covered && iy < ny; iy++) {
                int r0, r1;
                tw_axis_cells(&pl.y, m->tile, m->stride, cand_y[iy], &r0, &r1);
                if (cy < r0 || cy >= r1) continue;
                for (int ix = 0; !covered && ix < nx; ix++) {
                    int c0, c1;
                    tw_axis_cells(&pl.x, m->tile, m->stride, cand_x[ix], &c0, &c1);
                    if (cx >= c0 && cx < c1)
                        covered = tile_classified(r, &pl, cand_x[ix], cand_y[iy],
                                                  p->tiling.max_nodata_fraction, raw, valid);
                }
            }
            if (!covered) lost_px += v;
        }
        if (valid_px > 0 && lost_px * 100 > valid_px)
            WARN("unclassified",
                 "%s: about %.1f %% of its valid pixels (estimated on %lld output cells) lie "
                 "where every tile has more than tiling.max_nodata_fraction %g nodata%s: they "
                 "stay unclassified (nodata in every product); a larger max_nodata_fraction "
                 "classifies them",
                 path, 100.0 * (double)lost_px / (double)valid_px, (long long)n_s,
                 p->tiling.max_nodata_fraction,
                 p->tiling.edge == TW_EDGE_SKIP ? " or no tile reaches (edge: skip)" : "");
    }
    tw_free(raw);
    tw_free(valid);
    tw_raster_close(r);
}

void tw_advice_collect(const tw_run_params *p, const struct tw_resolved *m, tw_advice *a)
{
    memset(a, 0, sizeof *a);
    tw_error err;
    tw_error_init(&err);
    /* STAC items (input.assets) are checked by the run's own steps; this
     * advice is for raster paths. */
    for (int input = 0; input < p->input.n_paths && p->input.n_assets == 0; input++) {
        char shown[TW_URL_SHOWN_MAX], gpath[TW_PATH_MAX + 16];
        tw_url_redact(p->input.paths[input], shown, sizeof shown);
        if (tw_url_to_gdal(p->input.paths[input], gpath, sizeof gpath, &err) != TW_OK) continue;
        tw_inspect *ri = NULL;
        if (tw_inspect_raster(gpath, shown, &ri, &err) != TW_OK) continue;
        check_georef(a, input, shown, ri, m->tile);
        check_padding(a, input, shown, ri, m, p->tiling.edge);
        tw_inspect_destroy(ri);
        /* Statistics and tile samples read pixels: not over the network. */
        if (!tw_url_is_remote(p->input.paths[input])) {
            check_values(a, input, shown, gpath, m);
            if (!p->input.aoi[0]) check_unclassified(a, input, shown, p->input.paths[input], p, m);
        }
        tw_raster *r = NULL;
        tw_raster_open_params op = {.tiff_direct = p->input.tiff_direct};
        if (tw_raster_open_ex(p->input.paths[input], m->bands, m->n_bands, &op, &r, &err) ==
            TW_OK) {
            const char *why = "";
            tw_raster_reader(r, &why);
            if (why[0])
                NOTE("reader", "%s: GDAL (%s)", shown, why);
            else
                NOTE("reader", "%s: libtiff, whole tiles decoded directly", shown);
            tw_raster_close(r);
        }
    }
}
