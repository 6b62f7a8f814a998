/* validate.c - checks before any work: `tilewise validate` (tw_validate:
 * the plan, the memory estimate and the warnings, without running the
 * model) and `submit`'s machine-independent check (tw_check_inputs). Both
 * prepare a run as tw_run does (run_internal.h), so they refuse exactly
 * what a run would refuse, with the same messages. */
#include "pipeline/run/validate.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <gdal.h>

#include "io/output/polygons.h"
#include "io/input/raster.h"
#include "io/input/stac.h"
#include "io/url.h"
#include "core/alloc.h"
#include "core/fileio.h"
#include "pipeline/run/advice.h"
#include "pipeline/engine/plan.h"
#include "pipeline/store/names.h"
#include "pipeline/run/preflight.h"
#include "pipeline/run/run_internal.h"

_Static_assert(sizeof(((tw_validation_input *)0)->shown) == TW_URL_SHOWN_MAX,
               "tw_validation_input.shown holds a redacted URL");

/* What reading a remote input costs for the plan: the bytes of the blocks
 * its tile rows touch and about how many range requests (url.h), per object
 * for a STAC item's VRT; -1 when unknown. */
static void remote_cost(const run_ctx *c, int i, const tw_plan *plan, tw_validation_input *in)
{
    int T = plan->tile, S = plan->stride;
    int y0 = tw_axis_pos(&plan->y, T, S, plan->ty_begin);
    /* a padded last tile may end past 2^31-1 */
    int64_t y1 = plan->ty_end > plan->ty_begin
                     ? (int64_t)tw_axis_pos(&plan->y, T, S, plan->ty_end - 1) + T
                     : y0;
    if (y1 > c->infos[i].info.height) y1 = c->infos[i].info.height;
    int64_t bytes = 0, reqs = 0;
    int n_obj = c->stacs[i] ? c->p->input.n_assets : 1;
    for (int k = 0; k < n_obj; k++) {
        char gpath[TW_PATH_MAX + 16];
        const char *src = c->stacs[i] ? tw_stac_asset(c->stacs[i], k) : c->p->input.paths[i];
        int64_t b = -1, r = -1;
        tw_error e;
        tw_error_init(&e);
        if (tw_url_to_gdal(src, gpath, sizeof gpath, &e) != TW_OK ||
            tw_url_read_cost(gpath, y0, (int)y1, 0, &b, &r, &e) != TW_OK || b < 0) {
            bytes = reqs = -1;
            break;
        }
        bytes += b;
        reqs += r + 2; /* and the HEAD and header read of each object */
    }
    in->remote_bytes = bytes;
    in->remote_requests = reqs;
    in->remote_row0 = y0;
    in->remote_row1 = (int)y1;
}

/* products: [polygons]: what its regions may take at assembly (what
 * runtime.memory leaves beside the base, the weights, the backend's
 * workspace, the margin and GDAL's cache: the slots are freed by then) and,
 * per input, the regions that fit (the run's own check: more stop it) and
 * the most the output can have after output.min_area's sieve. */
static void polygons_estimate(const run_ctx *c, tw_validation *v)
{
    const tw_run_params *p = c->p;
    v->polygons_room = tw_budget_assembly_room(&c->bud, p->runtime.memory);
    for (int i = 0; i < v->n_inputs; i++) {
        tw_validation_input *in = &v->inputs[i];
        if (in->skipped) continue;
        const tw_raster_info *info = &c->infos[i].info;
        bool in_res = p->output.resolution == TW_RESOLUTION_INPUT;
        in->polygons_fit = tw_run_polygons_fit(c, i, &in->polygons_grid_w, &in->polygons_grid_h);
        double px = in_res ? 1.0 : (double)in->stride;
        double cell = fabs(info->geotransform[1] * info->geotransform[5] -
                           info->geotransform[2] * info->geotransform[4]) *
                      px * px;
        double min_cells = p->output.min_area > 0 && cell > 0 ? ceil(p->output.min_area / cell) : 1;
        in->polygons_min_cells = min_cells > 1 ? min_cells : 1;
        in->polygons_most =
            (double)in->polygons_grid_w * in->polygons_grid_h / in->polygons_min_cells;
    }
}

tw_status tw_check_inputs(const tw_run_params *p, tw_error *err)
{
    run_ctx *c = tw_calloc(TW_MEM_OTHER, 1, sizeof *c);
    if (!c) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    c->p = p;
    tw_status st = tw_run_prepare_inputs(c, p, err);
    tw_run_ctx_release(c);
    tw_free(c);
    return st;
}

tw_status tw_validate(const tw_run_params *p, tw_validation *v, tw_error *err)
{
    memset(v, 0, sizeof *v);
    snprintf(v->weights, sizeof v->weights, "%s", p->model.weights);
    snprintf(v->aoi, sizeof v->aoi, "%s", p->input.aoi);
    v->retries = p->input.retries;
    v->stac = p->output.stac;
    v->blend = p->tiling.blend;
    v->margin = p->tiling.margin;
    v->products = p->output.products;
    v->vector_format = p->output.vector_format;
    v->shard_count = p->shard_count;
    snprintf(v->out_dir, sizeof v->out_dir, "%s", p->output.dir);
    v->memory = p->runtime.memory;
    run_ctx *c = tw_calloc(TW_MEM_OTHER, 1, sizeof *c);
    if (!c) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    c->p = p;
    tw_status st = tw_run_prepare(c, p, true, err);
    if (st == TW_OK) {
        v->resolved = true;
        v->model = c->m;
        snprintf(v->backend, sizeof v->backend, "%s", c->be.i->name);
        v->precision = p->runtime.precision;
        for (int i = 0; i < p->input.n_paths; i++) {
            const tw_raster_info *info = &c->infos[i].info;
            tw_validation_input *in = &v->inputs[i];
            tw_url_redact(p->input.paths[i], in->shown, sizeof in->shown);
            in->aoi_tiles = -1;
            if (c->infos[i].skipped) {
                in->skipped = true;
                snprintf(in->skip_reason, sizeof in->skip_reason, "%s", c->infos[i].skip_reason);
                v->n_inputs = i + 1;
                continue;
            }
            tw_plan plan;
            st = tw_plan_make_cell(info->width, info->height, c->m.tile, c->m.stride, c->m.cell,
                                   p->tiling.edge, p->shard_index, p->shard_count, &plan, err);
            /* what the run would refuse in output.dir, with its words */
            if (st == TW_OK) st = tw_run_probe_parts(c, i, &plan, err);
            if (st != TW_OK) break;
            v->n_inputs = i + 1;
            in->width = info->width;
            in->height = info->height;
            in->bands = c->infos[i].bands;
            in->dtype = info->dtype;
            in->tiles_x = plan.x.n_pos;
            in->tiles_y = plan.ty_end - plan.ty_begin;
            in->n_tiles = plan.n_tiles;
            in->tile = plan.tile;
            in->stride = plan.stride;
            in->grid_w = plan.grid_w;
            in->grid_h = plan.row_end - plan.row_begin;
            {
                /* what it writes (preflight's upper bound), D bands of the
                 * embedding raster included */
                int w1 = info->width, h1 = info->height;
                tw_preflight_params pf = {.run = p,
                                          .n_classes = c->m.n_classes,
                                          .feat_dim = c->m.feat_dim,
                                          .tile = c->m.tile,
                                          .stride = c->m.stride,
                                          .cell = c->m.cell,
                                          .n_inputs = 1,
                                          .width = &w1,
                                          .height = &h1};
                in->output_bytes = tw_preflight_output_bytes(&pf);
            }
            in->remote = tw_url_is_remote(p->input.paths[i]);
            for (int k = 0; c->stacs[i] && k < p->input.n_assets; k++)
                in->remote = in->remote || tw_url_is_remote(tw_stac_asset(c->stacs[i], k));
            if (in->remote) remote_cost(c, i, &plan, in);
            in->aoi_tiles = c->infos[i].aoi_tiles;
            in->all_tiles = c->infos[i].all_tiles;
            tw_output_name(p, i, in->stem, sizeof in->stem, NULL);
            if (p->output.stac) {
                const tw_stac_input *si = &c->infos[i].stac;
                snprintf(in->stac_datetime, sizeof in->stac_datetime, "%s", si->datetime);
                snprintf(in->stac_source, sizeof in->stac_source, "%s", si->source);
                snprintf(in->stac_derived_from, sizeof in->stac_derived_from, "%s",
                         si->derived_from);
            }
        }
        for (int i = 0; st == TW_OK && p->output.stac && i < p->input.n_paths; i++)
            v->stac_items += !c->infos[i].skipped;
        if (st == TW_OK) {
            v->planned = true;
            v->budget = c->bud;
            if (p->output.products & TW_PRODUCT_POLYGONS) polygons_estimate(c, v);
            tw_run_checks_advice(c, &v->advice);
            v->n_checks = v->advice.n;
            /* GDAL's block cache as the run sets it (run.c): what validate
             * reads next (value ranges) stays within the budget too, where
             * GDAL's default (5 % of the machine's memory) took 1.3 GB on
             * a 10^7 x 10^7 VRT. */
            GDALSetCacheMax64((GIntBig)c->bud.gdal_cache);
        }
    }
    if (v->planned) {
        tw_advice *a = tw_alloc(TW_MEM_OTHER, sizeof *a);
        if (a) {
            tw_advice_collect(p, &c->m, a);
            for (int i = 0; i < a->n && v->advice.n < TW_ADVICE_MAX; i++) {
                v->advice.items[v->advice.n++] = a->items[i];
                v->advice.n_warnings += a->items[i].warning;
            }
            tw_free(a);
        } else {
            st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
        }
    }
    tw_run_ctx_release(c);
    tw_free(c);
    return st;
}
