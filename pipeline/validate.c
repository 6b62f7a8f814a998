/* validate.c - checks before any work: `tilewise validate` (tw_validate:
 * the plan, the memory estimate and the warnings, without running the
 * model) and `submit`'s machine-independent check (tw_check_inputs). Both
 * prepare a run as tw_run does (run_internal.h), so they refuse exactly
 * what a run would refuse, with the same messages. */
#include "pipeline/run.h"

#include <math.h>
#include <stdio.h>

#include <gdal.h>

#include "io/polygons.h"
#include "io/raster.h"
#include "io/stac.h"
#include "io/url.h"
#include "core/alloc.h"
#include "core/fileio.h"
#include "pipeline/plan.h"
#include "pipeline/run_internal.h"

/* validate's line on what reading a remote input costs for the plan: the
 * bytes of the blocks its tile rows touch and about how many range
 * requests (url.h), per object for a STAC item's VRT. */
static void remote_cost(const run_ctx *c, int i, const tw_plan *plan, FILE *out)
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
            bytes = -1;
            break;
        }
        bytes += b;
        reqs += r + 2; /* and the HEAD and header read of each object */
    }
    char b1[32];
    if (bytes < 0)
        fprintf(out, "reading   remote; its cost is unknown (not a tiled GeoTIFF/COG)\n");
    else
        fprintf(out,
                "reading   remote: at least %lld range requests, %s (the blocks of rows %d-%d, "
                "read once; input.retries %d)\n",
                (long long)reqs, tw_format_bytes((size_t)bytes, b1, sizeof b1), y0, (int)y1,
                c->p->input.retries);
}

/* validate's line on products: [polygons]: what its regions may take at
 * assembly (what runtime.memory leaves beside the process, the weights, the
 * backend's workspace and GDAL's cache: the slots are freed by then) and
 * the most regions the class map can have, with the file size that
 * makes (about TW_POLYGONS_FILE_BYTES per region). */
static void polygons_estimate(const run_ctx *c, FILE *out)
{
    const tw_run_params *p = c->p;
    const tw_budget *b = &c->bud;
    size_t fixed =
        b->base + b->weights_kept + b->workspace + b->margin + b->gdal_cache + b->polygons;
    size_t room = p->runtime.memory > fixed ? p->runtime.memory - fixed : 0;
    long long fit = (long long)(room / TW_POLYGONS_REGION_BYTES);
    char b1[32], b2[32];
    for (int i = 0; i < p->input.n_paths; i++) {
        if (c->infos[i].skipped) continue;
        const tw_raster_info *info = &c->infos[i].info;
        tw_plan plan;
        tw_error e;
        tw_error_init(&e);
        if (tw_plan_make(info->width, info->height, c->m.tile, c->m.stride, p->tiling.edge, 0, 1,
                         &plan, &e) != TW_OK)
            continue;
        bool in_res = p->output.resolution == TW_RESOLUTION_INPUT;
        double gw = in_res ? info->width : plan.grid_w, gh = in_res ? info->height : plan.grid_h;
        double px = in_res ? 1.0 : (double)plan.stride;
        double cell = fabs(info->geotransform[1] * info->geotransform[5] -
                           info->geotransform[2] * info->geotransform[4]) *
                      px * px;
        double min_cells = p->output.min_area > 0 && cell > 0 ? ceil(p->output.min_area / cell) : 1;
        double most = gw * gh / (min_cells > 1 ? min_cells : 1);
        char name[256] = "?", why[96] = "";
        tw_run_output_name(p, i, name, sizeof name, NULL);
        if (min_cells > 1)
            snprintf(why, sizeof why, " of %.0f cells or more (output.min_area)", min_cells);
        fprintf(out,
                "polygons  %s.class.%s: at most %.0f regions%s in %.0f x %.0f cells, about %s "
                "of file at that; at assembly %s left for them at %d bytes each: %lld regions\n",
                name, tw_vector_format_names[p->output.vector_format], most, why, gw, gh,
                tw_format_bytes((size_t)(most * TW_POLYGONS_FILE_BYTES), b1, sizeof b1),
                tw_format_bytes(room, b2, sizeof b2), TW_POLYGONS_REGION_BYTES, fit);
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

tw_status tw_validate(const tw_run_params *p, FILE *out, tw_error *err)
{
    run_ctx *c = tw_calloc(TW_MEM_OTHER, 1, sizeof *c);
    if (!c) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    c->p = p;
    tw_status st = tw_run_prepare(c, p, true, err);
    if (st == TW_OK) {
        char b1[32], b2[32], b3[32];
        const tw_budget *b = &c->bud;
        fprintf(out, "model     %s: %s, %d bands, %d classes, %d features (sha256 %.12s)\n",
                p->model.weights, c->m.arch, c->m.in_bands, c->m.n_classes, c->m.feat_dim,
                c->m.model_sha256);
        fprintf(out, "backend   %s, precision %s\n", c->be.i->name,
                tw_precision_name(p->runtime.precision));
        for (int i = 0; i < p->input.n_paths; i++) {
            const tw_raster_info *info = &c->infos[i].info;
            if (c->infos[i].skipped) {
                char shown[TW_URL_SHOWN_MAX];
                tw_url_redact(p->input.paths[i], shown, sizeof shown);
                fprintf(out, "input     %s: skipped (input.on_error: skip): %s\n", shown,
                        c->infos[i].skip_reason);
                continue;
            }
            tw_plan plan;
            st = tw_plan_make(info->width, info->height, c->m.tile, c->m.stride, p->tiling.edge,
                              p->shard_index, p->shard_count, &plan, err);
            if (st != TW_OK) break;
            char shown[TW_URL_SHOWN_MAX];
            tw_url_redact(p->input.paths[i], shown, sizeof shown);
            fprintf(out,
                    "input     %s: %d x %d, %d bands %s; tiles %d x %d = %lld (tile %d, stride "
                    "%d); output grid %d x %d\n",
                    shown, info->width, info->height, c->infos[i].bands, tw_dtype_name(info->dtype),
                    plan.x.n_pos, plan.ty_end - plan.ty_begin, (long long)plan.n_tiles, plan.tile,
                    plan.stride, plan.grid_w, plan.row_end - plan.row_begin);
            bool remote = tw_url_is_remote(p->input.paths[i]);
            for (int k = 0; c->stacs[i] && k < p->input.n_assets; k++)
                remote = remote || tw_url_is_remote(tw_stac_asset(c->stacs[i], k));
            if (remote) remote_cost(c, i, &plan, out);
            if (c->infos[i].aoi_tiles >= 0)
                fprintf(out,
                        "aoi       %s: %lld of %lld tiles touch %s; the others are not "
                        "computed (nodata)\n",
                        shown, (long long)c->infos[i].aoi_tiles, (long long)c->infos[i].all_tiles,
                        p->input.aoi);
        }
        if (st == TW_OK) {
            fprintf(out, "batch     %d tiles, %d slots of %s\n", b->batch, b->n_slots,
                    tw_format_bytes(b->slot_bytes, b1, sizeof b1));
            char b9[32], items[512];
            fprintf(out, "readers   %d, each with a read strip of %d x %d pixels (%s in all)\n",
                    b->readers, b->read_strip_w, c->m.tile,
                    tw_format_bytes(b->read, b9, sizeof b9));
            fprintf(out, "memory    estimate %s of %s: %s\n",
                    tw_format_bytes(b->estimate, b2, sizeof b2),
                    tw_format_bytes(p->runtime.memory, b3, sizeof b3),
                    tw_budget_breakdown(b, false, items, sizeof items));
            fprintf(out, "          worst case %s (GDAL cache limit %s)\n",
                    tw_format_bytes(b->total, b1, sizeof b1),
                    tw_format_bytes(b->gdal_cache, b2, sizeof b2));
            if (p->output.products & TW_PRODUCT_POLYGONS) polygons_estimate(c, out);
            for (int i = 0; i < c->warn.n; i++) fprintf(out, "warning   %s\n", c->warn.msg[i]);
            fprintf(out, "ok\n");
            /* GDAL's block cache as the run sets it (run.c): what validate
             * reads next (value ranges) stays within the budget too, where
             * GDAL's default (5 % of the machine's memory) took 1.3 GB on
             * a 10^7 x 10^7 VRT. */
            GDALSetCacheMax64((GIntBig)b->gdal_cache);
        }
    }
    tw_run_ctx_release(c);
    tw_free(c);
    return st;
}
