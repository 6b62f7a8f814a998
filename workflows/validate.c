/* validate.c - what `tilewise validate` prints: the plan (tw_validate) and
 * advice on value ranges and georeferencing (validate.h). */
#include "workflows/validate.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include <gdal.h>

#include "io/inspect.h"
#include "io/raster.h"
#include "io/url.h"
#include "pipeline/run.h"

/* Where the advice goes, and how many warnings it gave. */
typedef struct advice {
    FILE *out;
    int warnings;
} advice;

static void advise(advice *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void advise(advice *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(a->out, "warning   ");
    vfprintf(a->out, fmt, ap);
    fprintf(a->out, "\n");
    va_end(ap);
    a->warnings++;
}

static void check_georef(advice *a, const char *path, const tw_inspect *ri, int tile)
{
    if (!ri->has_geotransform) {
        advise(a, "%s: no geotransform: the outputs will be in pixel coordinates", path);
        return;
    }
    if (!ri->has_crs) {
        advise(a,
               "%s: no CRS: the outputs will have none either (assign one with "
               "gdal_edit.py -a_srs)",
               path);
        return;
    }
    if (!ri->crs_understood) {
        advise(a, "%s: its CRS is not understood by GDAL", path);
        return;
    }
    double px, py;
    if (!tw_inspect_pixel_metres(ri, &px, &py)) {
        fprintf(a->out, "crs       %s: %s\n", path, ri->crs);
        return;
    }
    const double *gt = ri->geotransform;
    const char *unit = ri->crs_units;
    fprintf(a->out,
            "crs       %s: %s, units %s; pixel %.4g x %.4g m, a tile of %d px covers %.3g x %.3g "
            "km\n",
            path, ri->crs, unit, px, py, tile, tile * px / 1000, tile * py / 1000);
    bool geographic = ri->crs_geographic;
    if (gt[2] != 0 || gt[4] != 0)
        advise(a,
               "%s: the raster is rotated (geotransform terms %g, %g): tiles follow its pixel "
               "grid, not north",
               path, gt[2], gt[4]);
    double ratio = px / py;
    if (ratio > 1.5 || ratio < 1 / 1.5)
        advise(a,
               "%s: pixels are %.3g m wide but %.3g m high%s: the model sees stretched images "
               "(reproject with gdalwarp -t_srs to a projected CRS)",
               path, px, py, geographic ? " (degrees of longitude shrink with latitude)" : "");
    if (geographic && tile * fmax(px, py) > 10000)
        advise(a,
               "%s: in a geographic CRS (%s) a tile of %d px spans about %.0f km: is that the "
               "resolution the model was trained at?",
               path, unit, tile, tile * fmax(px, py) / 1000);
    if (fmin(px, py) < 0.05 || fmax(px, py) > 5000)
        advise(a,
               "%s: a pixel size of %.3g m is unusual for satellite imagery: are the CRS units "
               "(%s) right?",
               path, fmin(px, py) < 0.05 ? fmin(px, py) : fmax(px, py), unit);
}

static void check_values(advice *a, const char *path, const char *gdal_path, const tw_resolved *m)
{
    int n = m->n_bands > 0 ? m->n_bands : m->in_bands;
    int fits = 0;
    int bands[TW_MAX_BANDS];
    double los[TW_MAX_BANDS], his[TW_MAX_BANDS];
    const char *hows[TW_MAX_BANDS];
    bool oks[TW_MAX_BANDS];
    for (int i = 0; i < n; i++) bands[i] = m->n_bands > 0 ? m->bands[i] : i + 1;
    tw_error err;
    tw_error_init(&err);
    if (tw_inspect_band_ranges(gdal_path, bands, n, los, his, hows, oks, &err) != TW_OK) return;
    for (int i = 0; i < n; i++) {
        int band = bands[i];
        double lo = los[i], hi = his[i];
        const char *how = hows[i];
        if (!hows[i]) continue; /* no such band: the run's checks say so */
        if (!oks[i]) {
            advise(a, "%s band %d: cannot compute its range (no valid pixels?)", path, band);
            continue;
        }
        double mean = m->mean[i], sd = m->std[i];
        double zlo = (lo * m->scale - mean) / sd, zhi = (hi * m->scale - mean) / sd;
        /* A network trained on (x - mean) / std sees values within a few
         * units; ranges far outside, or squeezed to nothing, are the
         * classic wrong-input.scale symptoms. */
        bool far = zlo > 8 || zhi < -8;
        bool wide = zhi - zlo > 200;
        bool flat = hi > lo && zhi - zlo < 0.05;
        if (!far && !wide && !flat) {
            fits++;
            continue;
        }
        char hint[96] = "";
        double mid = (lo + hi) / 2;
        /* Only the order of magnitude: a mid-range is not a mean. */
        if (mid > 0 && mean > 0)
            snprintf(hint, sizeof hint, "; is input.scale %g meant?",
                     pow(10.0, round(log10(mean / mid))));
        advise(a,
               "%s band %d: values %g..%g (%s) x scale %g give %.3g..%.3g after the model's "
               "mean %g / std %g, %s%s",
               path, band, lo, hi, how, m->scale, zlo, zhi, mean, sd,
               far    ? "far from what it was trained on"
               : wide ? "a very wide range"
                      : "almost constant",
               hint);
    }
    fprintf(a->out,
            "values    %s: %d of %d bands within a plausible range of the model's mean/std "
            "(scale %g)\n",
            path, fits, n, m->scale);
}

static void validate_advice(advice *a, const tw_run_params *p)
{
    tw_error err;
    tw_error_init(&err);
    tw_resolved m;
    if (tw_resolve(p, &m, &err) != TW_OK) return; /* tw_validate already accepted it */
    /* STAC items (input.assets) are checked by tw_validate; these hints are
     * for raster paths. */
    for (int i = 0; i < p->input.n_paths && p->input.n_assets == 0; i++) {
        char shown[TW_URL_SHOWN_MAX], gpath[TW_PATH_MAX + 16];
        tw_url_redact(p->input.paths[i], shown, sizeof shown);
        if (tw_url_to_gdal(p->input.paths[i], gpath, sizeof gpath, &err) != TW_OK) continue;
        tw_inspect *ri = NULL;
        if (tw_inspect_raster(gpath, shown, &ri, &err) != TW_OK) continue;
        check_georef(a, shown, ri, m.tile);
        tw_inspect_destroy(ri);
        /* Statistics read every pixel: not over the network. */
        if (!tw_url_is_remote(p->input.paths[i])) check_values(a, shown, gpath, &m);
        tw_raster *r = NULL;
        tw_raster_open_params op = {.tiff_direct = p->input.tiff_direct};
        if (tw_raster_open_ex(p->input.paths[i], m.bands, m.n_bands, &op, &r, &err) == TW_OK) {
            const char *why = "";
            tw_raster_reader(r, &why);
            if (why[0])
                fprintf(a->out, "reader    %s: GDAL (%s)\n", shown, why);
            else
                fprintf(a->out, "reader    %s: libtiff, whole tiles decoded directly\n", shown);
            tw_raster_close(r);
        }
    }
}

tw_status tw_validate_report(const tw_run_params *p, FILE *out, int *warnings, tw_error *err)
{
    advice a = {.out = out};
    /* tw_validate sets GDAL's block cache to the run's budget for the
     * advice's reads; the caller's (process-wide) setting comes back after. */
    GIntBig cache = GDALGetCacheMax64();
    tw_status st = tw_validate(p, out, err);
    if (st == TW_OK) {
        validate_advice(&a, p);
        fprintf(out, "advice    %d warning%s\n", a.warnings, a.warnings == 1 ? "" : "s");
    }
    GDALSetCacheMax64(cache);
    if (warnings) *warnings = a.warnings;
    return st;
}
