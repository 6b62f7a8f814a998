/* merge.c - `tilewise merge` (tw_merge, run.h) after sharded runs: each
 * input's manifest read, its parts opened and assembled into its final
 * products (products.h, as the last step of a whole-grid run does). */
#include "pipeline/run/merge.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gdal.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "pipeline/engine/budget.h"
#include "pipeline/store/parts.h"
#include "pipeline/engine/plan.h"
#include "pipeline/store/manifest.h"
#include "pipeline/store/names.h"
#include "pipeline/run/products.h"
#include "pipeline/report/stac_run.h"

/* Whether out_dir holds a final product (a merge, or a whole-grid run,
 * wrote it: products are renamed to their final names only when complete). */
static bool has_products(const char *out_dir)
{
    const char *suffixes[TW_PRODUCT_SUFFIXES_MAX];
    int n_suffixes = tw_products_suffixes(suffixes, false);
    DIR *d = opendir(out_dir);
    if (!d) return false;
    bool found = false;
    const struct dirent *e;
    while (!found && (e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (e->d_name[0] == '.') continue; /* temporaries: .scene.class.tif.part */
        for (int k = 0; k < n_suffixes && !found; k++) {
            size_t ls = strlen(suffixes[k]);
            found = n > ls && strcmp(e->d_name + n - ls, suffixes[k]) == 0;
        }
    }
    closedir(d);
    return found;
}

tw_status tw_merge(const char *out_dir, bool quiet, tw_run_result **result, tw_error *err)
{
    return tw_merge_ex(out_dir, quiet, NULL, result, err);
}

tw_status tw_merge_ex(const char *out_dir, bool quiet, const volatile sig_atomic_t *stop,
                      tw_run_result **result, tw_error *err)
{
    double t0 = tw_clock_now();
    tw_run_result *r = tw_calloc(TW_MEM_OTHER, 1, sizeof *r);
    char(*stems)[256] = tw_calloc(TW_MEM_OTHER, TW_MAX_INPUTS, 256);
    tw_manifest *mf = tw_calloc(TW_MEM_OTHER, 1, sizeof *mf);
    if (result) *result = r;
    tw_status st = TW_OK;
    char collection_id[300] = ""; /* output.stac over several inputs */
    int n_items = 0;
    if (!r || !stems || !mf) st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    int n = st == TW_OK ? tw_parts_list(out_dir, stems, TW_MAX_INPUTS) : 0;
    if (st == TW_OK && n <= 0) {
        /* Nothing to merge. An empty .tilewise/ (a run stopped before its
         * first chunk) goes; rmdir leaves one that holds anything. */
        char dir[TW_PATH_MAX + 64];
        snprintf(dir, sizeof dir, "%s/.tilewise", out_dir);
        rmdir(dir);
        /* Merged already (parts are removed only after the products are
         * written): a second merge has no work and succeeds, with no input
         * in the result. */
        if (!has_products(out_dir))
            st = tw_error_set(err, TW_ERR_INPUT,
                              "%s: no shard outputs to merge (no %s/.tilewise/ parts)", out_dir,
                              out_dir);
    }
    if (st == TW_OK && n > 0) {
        r->inputs = tw_calloc(TW_MEM_OTHER, (size_t)n, sizeof(tw_input_result));
        if (!r->inputs) st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; st == TW_OK && i < n; i++) {
        if (stop && __atomic_load_n(stop, __ATOMIC_RELAXED)) {
            st = tw_error_set(err, TW_CANCELLED,
                              "%s: merge interrupted with %d of %d inputs merged; run the same "
                              "command again to finish",
                              out_dir, i, n);
            break;
        }
        char mpath[TW_PATH_MAX + 400];
        st = tw_manifest_path(out_dir, stems[i], mpath, sizeof mpath, err);
        if (st == TW_OK) st = tw_manifest_read(mpath, stems[i], mf, err);
        if (st != TW_OK) break;
        /* The parts live where the shards wrote them: this directory. */
        snprintf(mf->p.output.dir, sizeof mf->p.output.dir, "%s", out_dir);
        if (i == 0) {
            r->model = mf->m;
            snprintf(r->backend, sizeof r->backend, "merge");
        }
        tw_input_result *res = &r->inputs[r->n_inputs++];
        snprintf(res->path, sizeof res->path, "%s", mf->p.input.paths[0]);
        for (int k = 0; k < mf->p.input.n_paths; k++) {
            char stem[256];
            if (tw_output_name(&mf->p, k, stem, sizeof stem, NULL) == TW_OK &&
                strcmp(stem, stems[i]) == 0)
                snprintf(res->path, sizeof res->path, "%s", mf->p.input.paths[k]);
        }
        snprintf(res->stem, sizeof res->stem, "%s", stems[i]);
        tw_plan plan;
        st = tw_plan_make_cell(mf->info.width, mf->info.height, mf->m.tile, mf->m.stride,
                               mf->m.cell, mf->p.tiling.edge, 0, 1, &plan, err);
        if (st != TW_OK) break;
        res->width = mf->info.width;
        res->height = mf->info.height;
        res->grid_w = plan.grid_w;
        res->grid_h = plan.grid_h;
        bool emb = (mf->p.output.products & TW_PRODUCT_EMB) != 0;
        tw_parts_params pp = {
            .out_dir = out_dir,
            .stem = stems[i],
            .fingerprint = mf->fingerprint,
            .grid_w = plan.grid_w,
            .grid_h = plan.grid_h,
            .n_classes = mf->m.n_classes,
            .feat_dim = emb ? mf->m.feat_dim : 0,
            .cell_emb = tw_run_cell_emb(mf->p.output.products, mf->m.feat_dim),
            .tiles = tw_run_keeps_tiles(mf->p.output.products),
            .shard_index = 0,
            .shard_count = 1,
            .merge_only = true,
        };
        tw_parts *parts = NULL;
        st = tw_parts_open(&pp, quiet, &parts, err);
        /* output.stac: the merged products' item, written once they are final */
        bool stac = mf->p.output.stac;
        if (stac && i == 0 && n > 1)
            tw_stac_run_collection_id(out_dir, collection_id, sizeof collection_id);
        if (st == TW_OK && stac)
            st = tw_stac_run_forget(&mf->p, stems[i], collection_id[0] != '\0', err);
        if (st == TW_OK) {
            /* merge runs no model: its budget is the base, the margin and
             * GDAL's block cache */
            tw_budget mb = {.base = TW_BUDGET_BASE,
                            .margin = TW_BUDGET_MARGIN,
                            .gdal_cache = (size_t)GDALGetCacheMax64()};
            st = tw_products_assemble(&mf->p, &mf->m, &mf->info, res->path, mf->config_json,
                                      tw_budget_assembly_room(&mb, mf->p.runtime.memory), parts,
                                      res, err);
        }
        if (st == TW_OK && stac)
            st = tw_stac_run_item(&mf->p, &mf->m, &mf->info, &mf->stac,
                                  collection_id[0] ? collection_id : NULL, res, err);
        n_items += st == TW_OK && stac;
        if (st == TW_OK) tw_products_stale(&mf->p, res);
        tw_parts_close(parts);
    }
    if (st == TW_OK && n_items > 1) st = tw_stac_run_collection(out_dir, &r->model, r, err);
    tw_free(stems);
    tw_free(mf);
    if (r) {
        r->seconds = tw_clock_now() - t0;
        r->peak_rss = tw_rss_peak();
    }
    if (!result) tw_run_result_destroy(r);
    return st;
}
