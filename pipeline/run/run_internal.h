/* run_internal.h - what the run driver (run.c) and `validate` (validate.c)
 * share: the prepared run and the steps that prepare it. (The assembly of
 * an input's chunks into its products, which merge.c shares too, is
 * products.h.)
 *
 * Private to pipeline/: it is not installed and nothing outside pipeline/
 * includes it (scripts/check_layers.sh refuses it). The public entry
 * points stay in run.h.
 */
#ifndef TW_RUN_INTERNAL_H
#define TW_RUN_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io/input/aoi.h"
#include "io/input/raster.h"
#include "io/input/stac.h"
#include "io/url.h"
#include "model/backend.h"
#include "model/resnet.h"
#include "model/segnet.h"
#include "core/error.h"
#include "core/params.h"
#include "pipeline/run/advice.h"
#include "pipeline/engine/budget.h"
#include "pipeline/store/parts.h"
#include "pipeline/run/preflight.h"
#include "pipeline/run/run.h"
#include "pipeline/report/stac_run.h"

/* What the checks found out about one input, before any work. */
#define TW_INPUT_STATE_MAX 5120

typedef struct input_info {
    tw_raster_info info;
    int bands;
    bool mask;             /* reads also read a mask band */
    bool skipped;          /* unopenable, input.on_error: skip */
    int64_t aoi_tiles;     /* tiles touching input.aoi (-1: no AOI) */
    int64_t all_tiles;     /* tiles of the full plan */
    char skip_reason[512]; /* why */
    tw_stac_input stac;    /* output.stac: its datetime and STAC item (stac_run.h) */
    /* A run's record of the input before its first tile: its geometry and
     * identity as "key value" lines (run.c, input_state), checked again
     * when its turn comes. "" in validate. */
    char state[TW_INPUT_STATE_MAX];
} input_info;

/* A prepared run: calloc it, set p (and hooks for a run), then prepare it;
 * tw_run_ctx_release frees what the steps opened (not the struct). */
typedef struct run_ctx {
    const tw_run_params *p;
    const tw_run_hooks *hooks;
    tw_resolved m;
    tw_resnet *net; /* a classifier, or */
    tw_segnet *seg; /* a segmentation model */
    tw_backend be;
    bool have_be;
    bool told_pinned; /* the pinned-memory fallback was said */
    tw_budget bud;
    input_info *infos;
    tw_stac **stacs;      /* [n_paths]: STAC items as VRTs (input.assets), else NULL */
    const char **sources; /* [n_paths]: what tw_raster_open opens */
    tw_url_saved *net_saved;
    tw_preflight_warnings warn;
    struct {
        int n;
        char msg[TW_PREFLIGHT_MAX_WARNINGS][TW_ADVICE_TEXT];
    } polygons; /* regions that may not fit (tw_run_polygons_fit) */
    char config_json[TW_CONFIG_JSON_MAX];
    char collection_id[300]; /* output.stac over several inputs: collection.json's id, else "" */
} run_ctx;

/* The model against the config and every input against the model: loads
 * the model file and builds c->net, resolves c->m, opens STAC items
 * (c->stacs, c->sources), applies GDAL's network settings for the run and
 * fills c->infos. What does not depend on the machine (tw_check_inputs).
 * On error the message is in err and c holds what was opened so far. */
tw_status tw_run_prepare_inputs(run_ctx *c, const tw_run_params *p, tw_error *err);

/* Everything up to (not including) the backend's reserve: the inputs as
 * above, the output checks (warnings in c->warn), the backend (c->be; its
 * notices go to the hooks' log unless quiet) and the memory budget (c->bud)
 * over the widest input. Shared by tw_run and tw_validate. */
tw_status tw_run_prepare(run_ctx *c, const tw_run_params *p, bool quiet, tw_error *err);

/* What the run would refuse about input idx's parts in output.dir over plan
 * (validate): another run holding its shard's lock (TW_ERR_LOCKED), committed
 * parts of another configuration or without their fingerprint (TW_ERR_PARTS),
 * in the run's words (parts.h tw_parts_probe). Reads only. */
tw_status tw_run_probe_parts(run_ctx *c, int idx, const tw_plan *plan, tw_error *err);

/* Free what the prepare steps opened (STAC items, the backend, the net,
 * the input infos) and restore GDAL's network settings. c itself is the
 * caller's. Cannot fail. */
void tw_run_ctx_release(run_ctx *c);

/* Append the output checks' warnings (c->warn, as prepare left them) to *a
 * as warnings with code "output", then prepare's polygons warnings with code
 * "polygons_memory", as far as TW_ADVICE_MAX allows: a run logs them first,
 * validate lists them with the plan. */
void tw_run_checks_advice(const run_ctx *c, tw_advice *a);

/* products: [polygons], input i (planned by tw_run_prepare): the class
 * map's grid (*grid_w x *grid_h cells) and the most regions its polygons
 * fit in what the budget leaves at assembly (tw_budget_assembly_room):
 * the run stops (exit 4) when the class map has more, counted before
 * output.min_area's sieve. Prepare warns when the worst case, a region per
 * cell, does not fit. */
int64_t tw_run_polygons_fit(const run_ctx *c, int i, int *grid_w, int *grid_h);

/* Where the run's notices and warnings go: the hooks' log, or nowhere. */
const tw_log *tw_run_log(const run_ctx *c);

/* input.aoi for one raster, on the tile grid of its full plan (tile
 * indices are the plan's, whatever the shard). NULL in *out without an
 * AOI. */
tw_status tw_run_aoi_for(const tw_run_params *p, const tw_resolved *m, const tw_raster_info *info,
                         tw_aoi **out, tw_error *err);

#endif
