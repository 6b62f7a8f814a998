/* validate.h - `tilewise validate`: config, inputs and the model checked
 * against each other and the run planned, as data (validate.c), without
 * running the model.
 */
#ifndef TW_RUN_VALIDATE_H
#define TW_RUN_VALIDATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/params.h"
#include "pipeline/engine/budget.h"
#include "pipeline/resolved.h"
#include "pipeline/result.h"

/* One input as tw_validate planned it. */
typedef struct tw_validation_input {
    char shown[2048];      /* the path, credentials redacted (url.h) */
    bool skipped;          /* not opened (input.on_error: skip) */
    char skip_reason[512]; /* why */
    int width, height, bands;
    tw_dtype dtype;
    int tiles_x, tiles_y; /* this shard's tile columns and rows */
    int64_t n_tiles;
    int tile, stride;
    int grid_w, grid_h;                    /* this shard's output cells */
    bool remote;                           /* some object is read over the network */
    int64_t remote_bytes, remote_requests; /* at least; -1: unknown (not a tiled COG) */
    int remote_row0, remote_row1;          /* the rows whose blocks are read */
    int64_t aoi_tiles, all_tiles;          /* tiles touching input.aoi (-1: no AOI) of all */
    uint64_t output_bytes;                 /* at most, on disk (uncompressed, parts included) */
    /* products: [polygons]: the class map's grid, the smallest region
     * output.min_area leaves (cells) and so the most regions it can hold */
    int polygons_grid_w, polygons_grid_h;
    double polygons_min_cells, polygons_most;
    int64_t polygons_fit; /* the regions (before the sieve) that fit at assembly */
    /* output.stac: the item's name and datetime (pipeline/report/stac_run.h) */
    char stem[256];
    char stac_datetime[64];
    char stac_source[48];                    /* where the datetime came from */
    char stac_derived_from[TW_PATH_MAX * 2]; /* the input's own STAC item, or "" */
} tw_validation_input;

/* What tw_validate found, as data: validate's listing is one rendering of
 * it (api/validate.c), the C API's accessors and Python's dict others. */
typedef struct tw_validation {
    char weights[TW_PATH_MAX]; /* model.weights */
    char aoi[TW_PATH_MAX];     /* input.aoi */
    int retries;               /* input.retries */
    char out_dir[TW_PATH_MAX]; /* output.dir */
    bool stac;                 /* output.stac */
    unsigned products;         /* output.products */
    tw_vector_format vector_format;
    size_t polygons_room; /* products: [polygons]: memory left at assembly (its rows and
                             the regions: tw_budget_assembly_room) */
    int stac_items;       /* items a run writes (inputs not skipped) */
    tw_blend_mode blend;  /* tiling.blend, tiling.margin (a segmentation model's) */
    int margin;
    int shard_count;
    bool resolved; /* model, backend and precision below are set */
    tw_resolved model;
    char backend[16];
    tw_precision precision;
    int n_inputs; /* planned so far: all of them when planned */
    tw_validation_input inputs[TW_MAX_INPUTS];
    bool planned; /* every input planned: budget and checks hold */
    tw_budget budget;
    size_t memory; /* runtime.memory */
    /* Every warning a run would give before the first tile, in its order:
     * the output checks' (code "output": free disk space, an AOI that
     * touches no tile), then advice.h's warnings and notes. */
    tw_advice advice;
    int n_checks; /* the first n_checks items are the output checks' */
} tw_validation;

/* Check config, inputs and the model against each other and plan the run
 * (tile grid, batch, slots, memory estimate) into *v (cleared first; filled
 * as far as it got on error), without running the model; when planned, the
 * advice for its inputs (advice.h) too. Sets GDAL's block cache limit
 * (process-wide) to the budget's, as tw_run does, for the advice's reads:
 * callers that share the process restore it (api/validate.c). */
tw_status tw_validate(const tw_run_params *p, tw_validation *v, tw_error *err);

/* What validate checks that does not depend on the machine: the model file
 * against the config, and every input against the model (opens, bands,
 * size). Not the device or the memory budget: `submit` calls it on a login
 * node for jobs that run elsewhere. Same errors and messages as tw_run. */
tw_status tw_check_inputs(const tw_run_params *p, tw_error *err);

#endif
