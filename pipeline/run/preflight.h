/* preflight.h - what can be known before the first tile is checked before it.
 *
 * A run that fails after hours of inference because of a typo in a creation
 * option, an output directory that is a file or a checkpoint in the wrong
 * format loses those hours. Everything here runs before any tile, in
 * tw_validate and tw_run alike (pipeline/run/run.c, prepare), and in any other
 * entry point that calls it (submit, the C API): the model file's format,
 * output.creation_options against the output driver's own option list and
 * a trial write of every product (16 x 16 cells with the run's format,
 * types, options and colours), output.dir (a writable directory, or
 * creatable in one), the final product paths, and the free disk space
 * against an estimate of the outputs (a warning); and for validate's advice,
 * how much of an input's tiles is padding. Model fit, inputs and the
 * memory budget are checked by prepare itself, right after.
 *
 * Nothing here leaves a file or a directory under output.dir: the trial
 * write goes to a temporary directory under /tmp, removed after, and the
 * output.dir check makes and removes one empty directory where the run
 * would make its first (access() alone says yes to root on /proc).
 */
#ifndef TW_PREFLIGHT_H
#define TW_PREFLIGHT_H

#include <stdint.h>

#include "core/error.h"
#include "core/params.h"

#define TW_PREFLIGHT_MAX_WARNINGS 8

/* Advice that does not stop a run (printed by validate, and by run unless
 * quiet). */
typedef struct tw_preflight_warnings {
    int n;
    char msg[TW_PREFLIGHT_MAX_WARNINGS][512];
} tw_preflight_warnings;

/* The sizes preflight needs: one entry per input (width 0: skipped). */
typedef struct tw_preflight_params {
    const tw_run_params *run;
    int n_classes, feat_dim, tile, stride;
    int cell; /* an output cell's side (tw_resolved.cell); 0: the stride */
    int n_inputs;
    const int *width, *height;  /* [n_inputs] input pixels */
    const char (*stems)[256];   /* [n_inputs] output file stems */
    const char *const *sources; /* [n_inputs] what GDAL opens for each input (NULL: paths) */
} tw_preflight_params;

/* The weights file: TW_ERR_MODEL naming it when it is a PyTorch checkpoint
 * (zip or pickle: torch.save's formats), with the command that converts it.
 * Other formats are left to the model file reader. Cannot allocate. */
tw_status tw_preflight_weights(const char *path, tw_error *err);

/* output.creation_options of format against the GDAL driver's own list
 * (GDAL_DMD_CREATIONOPTIONLIST): TW_ERR_CONFIG naming the option for a
 * malformed entry, an unknown name (with the nearest known one), a value
 * not among an enumeration's (listing them), or whatever else GDAL's own
 * validation refuses. Thread-safe. */
tw_status tw_preflight_creation_options(tw_format format, const char (*opts)[128], int n,
                                        tw_error *err);

/* What `tilewise submit` can check on a login node before it queues
 * anything (no model load, no GPU): the weights' format, the creation
 * options and output.dir, as above. */
tw_status tw_preflight_submit(const tw_run_params *p, tw_error *err);

/* Upper bound of the bytes a run writes (uncompressed products, tile table
 * and the committed chunks that exist until assembly). */
uint64_t tw_preflight_output_bytes(const tw_preflight_params *pp);

/* Everything about the outputs: creation options (and the trial write),
 * output.dir, product paths; free space into *warn.
 *
 * No output may be an input: every path the run writes (each input's
 * products, its STAC item, run.json and run.failed.json, collection.json,
 * anything under OUT/.tilewise/) against every file of every input of the
 * list (the raster, and what GDAL lists with it: .aux.xml, .ovr, .msk, world
 * files, a VRT's sources), by resolved path and by device and inode (hard
 * and symbolic links). TW_ERR_CONFIG naming both, before any file is
 * written: a product replacing an input destroys it, and a later input of
 * the list would be read from the product. Remote inputs (url.h) are left
 * out; a local input GDAL cannot open counts with its own path. */
tw_status tw_preflight_output(const tw_preflight_params *pp, tw_preflight_warnings *warn,
                              tw_error *err);

/* The share of the pixels of a width x height raster's tiles (tile, stride,
 * edge mode: the plan a run makes) that lie outside the raster: padding,
 * 0 after normalization (edge pad, and any raster smaller than a tile).
 * In [0, 1); -1 when no plan can be made (edge skip on a raster smaller
 * than a tile, a stride that does not divide the tile). Allocates nothing. */
double tw_preflight_padding(int width, int height, int tile, int stride, tw_edge_mode edge);

#endif
