/* advice.c - advice before the first tile, as data (see advice.h) */
#include "pipeline/advice.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/inspect.h"
#include "io/raster.h"
#include "io/url.h"
#include "pipeline/preflight.h"
#include "pipeline/run.h"

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

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static void check_values(tw_advice *a, int input, const char *path, const char *gdal_path,
                         const tw_resolved *m)
{
    int n = m->n_bands > 0 ? m->n_bands : m->in_bands;
    int bands[TW_MAX_BANDS];
    double los[TW_MAX_BANDS], his[TW_MAX_BANDS];
    const char *hows[TW_MAX_BANDS];
    bool oks[TW_MAX_BANDS], flagged[TW_MAX_BANDS];
    for (int i = 0; i < n; i++) bands[i] = m->n_bands > 0 ? m->bands[i] : i + 1;
    tw_error err;
    tw_error_init(&err);
    if (tw_inspect_band_ranges(gdal_path, bands, n, los, his, hows, oks, &err) != TW_OK) return;
    /* One scale hint for the raster: the bands of one sensor share a scale,
     * so the hint is the median over the bands of the order of magnitude
     * between the model's mean and the band's mid-range (before, each band
     * got its own and one raster was told both 1e-05 and 0.0001). */
    double mags[TW_MAX_BANDS];
    int n_mags = 0, fits = 0, n_flagged = 0;
    for (int i = 0; i < n; i++) {
        flagged[i] = false;
        if (!hows[i] || !oks[i]) continue;
        double lo = los[i], hi = his[i], mean = m->mean[i], sd = m->std[i];
        double zlo = (lo * m->scale - mean) / sd, zhi = (hi * m->scale - mean) / sd;
        /* A network trained on (x - mean) / std sees values within a few
         * units; ranges far outside, or squeezed to nothing, are the
         * classic wrong-input.scale symptoms. */
        bool far = zlo > 8 || zhi<-8, wide = zhi - zlo> 200, flat = hi > lo && zhi - zlo < 0.05;
        flagged[i] = far || wide || flat;
        n_flagged += flagged[i];
        fits += !flagged[i];
        double mid = (lo + hi) / 2;
        if (mid > 0 && mean > 0) mags[n_mags++] = log10(mean / mid);
    }
    char hint[96] = "";
    if (n_flagged > 0 && n_mags > 0) {
        qsort(mags, (size_t)n_mags, sizeof mags[0], cmp_double);
        double med = n_mags % 2 ? mags[n_mags / 2] : (mags[n_mags / 2 - 1] + mags[n_mags / 2]) / 2;
        /* Only the order of magnitude: a mid-range is not a mean. */
        snprintf(hint, sizeof hint, "; is input.scale %g meant?", pow(10.0, round(med)));
    }
    for (int i = 0; i < n; i++) {
        if (!hows[i]) continue; /* no such band: the run's checks say so */
        if (!oks[i]) {
            WARN("values", "%s band %d: cannot compute its range (no valid pixels?)", path,
                 bands[i]);
            continue;
        }
        if (!flagged[i]) continue;
        double lo = los[i], hi = his[i], mean = m->mean[i], sd = m->std[i];
        double zlo = (lo * m->scale - mean) / sd, zhi = (hi * m->scale - mean) / sd;
        WARN("values",
             "%s band %d: values %g..%g (%s) x scale %g give %.3g..%.3g after the model's mean "
             "%g / std %g, %s%s",
             path, bands[i], lo, hi, hows[i], m->scale, zlo, zhi, mean, sd,
             zlo > 8 || zhi < -8 ? "far from what it was trained on"
             : zhi - zlo > 200   ? "a very wide range"
                                 : "almost constant",
             hint);
    }
    NOTE("values", "%s: %d of %d bands within a plausible range of the model's mean/std (scale %g)",
         path, fits, n, m->scale);
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
        /* Statistics read every pixel: not over the network. */
        if (!tw_url_is_remote(p->input.paths[input])) check_values(a, input, shown, gpath, m);
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
