/* resolved.h - what a run resolves before its first tile, which every floor
 * of pipeline/ passes along: the model's values after config overrides
 * (tw_resolved: the stages use it, the manifest stores it, the reports show
 * it), the params with them written in, and the bound of the resolved
 * configuration's JSON, the input's STAC facts. The lowest floor of
 * pipeline/: it includes core/ and io/ only and calls nothing of pipeline/.
 */
#ifndef TW_RESOLVED_H
#define TW_RESOLVED_H

#include <stdbool.h>
#include <stddef.h>

#include "core/params.h"
#include "io/output/stac_out.h"

/* What the model and the bundle resolve to, after config overrides. */
typedef struct tw_resolved {
    char arch[32];
    tw_stem stem; /* the net's: standard or small */
    int bands[TW_MAX_BANDS];
    int n_bands; /* 0: all bands of the raster */
    double scale;
    float mean[TW_MAX_BANDS];
    float std[TW_MAX_BANDS];
    int n_norm; /* = input bands of the model */
    char classes[TW_MAX_CLASSES][TW_NAME_MAX];
    int n_classes;
    int tile, stride;
    /* A segmentation model (model/segnet.h): per-pixel outputs (cells of
     * one pixel), tiles blended (tiling.blend, tiling.margin), any stride
     * in 1..tile; else a classifier, whose cell is its stride. */
    bool segmentation;
    int cell;     /* an output cell's side in pixels: stride, or 1 (segmentation) */
    int multiple; /* a tile side the network takes is a multiple of this (U-Net: 32) */
    int in_bands, feat_dim;
    bool headless; /* no fc: embedding products only (n_classes 1, a stand-in head) */
    char model_sha256[65];
} tw_resolved;

/* output.stac: what input i's STAC item says besides its files, resolved
 * before the first tile (pipeline/report/stac_run.h, tw_stac_run_input) and
 * carried by the manifest to `tilewise merge`. */
typedef struct tw_stac_input {
    char datetime[TW_STAC_DATETIME_MAX]; /* RFC 3339 */
    char source[48];                     /* where it came from: "STAC item", "TIFFTAG_DATETIME",
                                            "input.datetime" */
    char derived_from[TW_PATH_MAX * 2];  /* the input's STAC item (redacted), or "" */
} tw_stac_input;

/* The resolved configuration as JSON (report.c, tw_report_config_json) fits
 * in this many bytes: any configuration that params.h's limits allow. */
#define TW_CONFIG_JSON_MAX ((size_t)256 << 10)

/* p with what m resolved written in: input.bands, input.scale, model.arch,
 * model.mean, model.std, model.classes, tiling.tile and tiling.stride (the
 * keys core/keys.h marks TW_KEY_RESOLVED), as the parts fingerprint and
 * run.json show them. Cannot fail; *out may be large (a tw_run_params). */
void tw_run_params_resolved(const tw_run_params *p, const tw_resolved *m, tw_run_params *out);

#endif
