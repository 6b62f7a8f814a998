/* run.c - the run driver (run.h): after the prepare steps (prepare.c) the
 * backend reserved, then for each input: the shard's segments left to
 * compute, its parts and manifest (store/), the stage workers (engine/) and,
 * once the whole grid is committed, the final products
 * (tw_products_assemble, products.c). */
#include "pipeline/run/run.h"

#include <errno.h>
#include <gdal.h>
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/output/polygons.h"
#include "io/modelfile/model_file.h"
#include "io/input/identity.h"
#include "io/input/raster.h"
#include "io/input/stac.h"
#include "io/url.h"
#include "core/alloc.h"
#include "core/keys.h"
#include "core/clock.h"
#include "core/fileio.h"
#include "pipeline/store/parts.h"
#include "pipeline/engine/plan.h"
#include "pipeline/store/manifest.h"
#include "pipeline/store/names.h"
#include "pipeline/run/products.h"
#include "pipeline/run/preflight.h"
#include "pipeline/run/run_internal.h"
#include "pipeline/engine/stages.h"
#include "pipeline/engine/stitch.h"

static tw_status make_dirs(const char *dir, tw_error *err)
{
    tw_error e;
    tw_error_init(&e);
    if (tw_mkdir_p(dir, &e) != TW_OK) return tw_error_set(err, e.status, "output.dir: %s", e.msg);
    if (access(dir, W_OK) != 0)
        return tw_error_set(err, TW_ERR_OUTPUT, "output.dir: %s is not writable: %s", dir,
                            strerror(errno));
    return TW_OK;
}

/* Where the run's notices and warnings go: the hooks' log, or nowhere. */
const tw_log *tw_run_log(const run_ctx *c)
{
    return c->hooks ? &c->hooks->log : NULL;
}

/* What the outputs of an input depend on: if any of it changes between an
 * interrupted run and its rerun, or between the shards of one output, the
 * committed chunks are not reused (the run refuses, tw_parts_open, exit 6).
 * One "key value" line per key of the table that an output byte depends on
 * (TW_KEY_BYTES, core/keys.h), with the value the run resolved, so that a
 * refusal names the keys that differ and no key can be left out; then the
 * lines no key holds: the raster's size and type, the cell grid, the AOI
 * file's identity, and the input's (identity.h). The input is this one only,
 * as the reports show it; the model is its file's SHA-256, not its path.
 * TW_ERR_INTERNAL when it does not fit size (it cannot with the limits of
 * params.h and TW_FINGERPRINT_MAX). */
static tw_status fingerprint(const run_ctx *c, const tw_raster_info *info, const char *path,
                             const tw_plan *plan, const char *identity, char *buf, size_t size,
                             tw_error *err)
{
    tw_run_params *r = tw_alloc(TW_MEM_OTHER, sizeof *r);
    if (!r) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    tw_run_params_resolved(c->p, &c->m, r);
    snprintf(r->input.paths[0], sizeof r->input.paths[0], "%s", path);
    r->input.n_paths = 1;
    snprintf(r->model.weights, sizeof r->model.weights, "sha256:%s", c->m.model_sha256);
    size_t n = (size_t)snprintf(buf, size, "tilewise-parts %d\ninput.raster %dx%d %s\ngrid %dx%d\n",
                                TW_PARTS_FINGERPRINT_VERSION, info->width, info->height,
                                tw_dtype_name(info->dtype), plan->grid_w, plan->grid_h);
    n += tw_key_format_lines(r, TW_KEY_BYTES, buf + (n < size ? n : size), n < size ? size - n : 0);
    tw_free(r);
    if (c->p->input.aoi[0]) {
        /* The file's identity: a changed AOI changes which tiles exist. */
        struct stat sb;
        bool ok = stat(c->p->input.aoi, &sb) == 0;
        n +=
            (size_t)snprintf(buf + (n < size ? n : size), n < size ? size - n : 0,
                             "input.aoi_file size=%lld mtime=%lld\n",
                             ok ? (long long)sb.st_size : -1LL, ok ? (long long)sb.st_mtime : -1LL);
    }
    /* A remote object's version (url.h): chunks of another version refused. */
    n += (size_t)snprintf(buf + (n < size ? n : size), n < size ? size - n : 0, "%s", identity);
    if (n >= size)
        return tw_error_set(err, TW_ERR_INTERNAL,
                            "%s: the parts fingerprint needs %zu bytes, more than %zu", path, n,
                            size);
    return TW_OK;
}

/* Rows per committed chunk: about 1024 tiles, at least one tile row's cells.
 * A stop does not wait for the chunk under way, and one that takes longer
 * than TW_CHECKPOINT_S (a row of a very wide raster) is checkpointed
 * meanwhile (stages.h, "Stopping"). */
static int chunk_rows_for(const tw_plan *plan)
{
    int per_row = plan->x.n_pos > 0 ? plan->x.n_pos : 1;
    int rows = 1024 / per_row * plan->k;
    if (rows < plan->k) rows = plan->k;
    return rows;
}

/* The pipeline of input idx over plan: what its stages read (the source,
 * its normalization, the backend's wishes), where they report. */
static void pipe_init(run_ctx *c, int idx, const tw_plan *plan, tw_input_result *res, tw_pipe *pp,
                      tw_error *err)
{
    const tw_run_params *p = c->p;
    memset(pp, 0, sizeof *pp);
    pp->scope = tw_mem_scope_current(); /* tw_run's */
    pp->p = p;
    pp->m = &c->m;
    pp->bud = &c->bud;
    pp->be = &c->be;
    pp->hooks = c->hooks;
    /* What the readers open (stages.c opens pp.path): the user's path (raster.c
     * maps https:// and s3:// and redacts its own messages) or a STAC item's
     * VRT. Messages of this file name res->path, redacted. */
    pp->path = c->sources[idx];
    pp->display = res->path;
    pp->dtype = c->infos[idx].info.dtype;
    pp->info = &c->infos[idx].info;
    pp->norm.bands = c->m.in_bands;
    pp->norm.scale = c->m.scale;
    memcpy(pp->norm.mean, c->m.mean, sizeof pp->norm.mean);
    memcpy(pp->norm.std, c->m.std, sizeof pp->norm.std);
    pp->wants_raw = c->be.i->wants_raw(c->be.ctx);
    pp->norm_threads = tw_run_normalize_threads(p, &c->be);
    pp->want_emb = (p->output.products & (TW_PRODUCT_EMB | TW_PRODUCT_EMB_RASTER)) != 0;
    pp->err = err;
    pp->res = res;
    pp->log = tw_run_log(c);
    pp->chunk_rows = p->chunk_rows > 0 ? p->chunk_rows : chunk_rows_for(plan);
}

/* The parts of an input of stem over plan, with fingerprint fp. */
static tw_parts_params parts_params(run_ctx *c, const tw_plan *plan, const char *stem,
                                    const char *fp)
{
    const tw_run_params *p = c->p;
    return (tw_parts_params){
        .out_dir = p->output.dir,
        .stem = stem,
        .fingerprint = fp,
        .grid_w = plan->grid_w,
        .grid_h = plan->grid_h,
        .n_classes = c->m.n_classes,
        .feat_dim = (p->output.products & TW_PRODUCT_EMB) ? c->m.feat_dim : 0,
        .cell_emb = tw_run_cell_emb(p->output.products, c->m.feat_dim),
        .tiles = tw_run_keeps_tiles(p->output.products),
        .shard_index = p->shard_index,
        .shard_count = p->shard_count,
        .restart = p->restart,
        .log = tw_run_log(c),
    };
}

static tw_status input_identity(const run_ctx *c, int idx, char *buf, size_t size, tw_error *err);

tw_status tw_run_probe_parts(run_ctx *c, int idx, const tw_plan *plan, tw_error *err)
{
    const tw_run_params *p = c->p;
    char shown[TW_PATH_MAX], stem[256];
    tw_url_redact(p->input.paths[idx], shown, sizeof shown);
    tw_status st = tw_output_name(p, idx, stem, sizeof stem, err);
    char *ident = tw_alloc(TW_MEM_OTHER, 4096);
    char *fp = tw_alloc(TW_MEM_OTHER, TW_FINGERPRINT_MAX);
    if (st == TW_OK && (!ident || !fp)) st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    if (st == TW_OK) st = input_identity(c, idx, ident, 4096, err);
    if (st == TW_OK)
        st = fingerprint(c, &c->infos[idx].info, shown, plan, ident, fp, TW_FINGERPRINT_MAX, err);
    tw_parts_params pp = parts_params(c, plan, stem, fp);
    if (st == TW_OK) st = tw_parts_probe(&pp, err);
    tw_free(ident);
    tw_free(fp);
    return st;
}

/* The parts of input idx (pp->parts): its fingerprint (with the input's
 * identity) checked against what earlier runs committed, and the manifest a
 * merge reads written beside them. */
static tw_status open_parts(run_ctx *c, int idx, const tw_plan *plan, tw_input_result *res,
                            const char *ident, tw_pipe *pp, tw_error *err)
{
    const tw_run_params *p = c->p;
    const tw_raster_info *info = &c->infos[idx].info;
    tw_status st = TW_OK;
    char *fp = tw_alloc(TW_MEM_OTHER, TW_FINGERPRINT_MAX);
    if (!fp) st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    if (st == TW_OK) st = fingerprint(c, info, res->path, plan, ident, fp, TW_FINGERPRINT_MAX, err);
    tw_parts_params parts_p = parts_params(c, plan, res->stem, fp);
    if (st == TW_OK) st = tw_parts_open(&parts_p, p->quiet, &pp->parts, err);
    if (st == TW_OK) {
        tw_manifest *mf = tw_calloc(TW_MEM_OTHER, 1, sizeof *mf);
        char mpath[TW_PATH_MAX + 400];
        if (!mf) {
            st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
        } else {
            mf->p = *p;
            for (int k = 0; k < p->input.n_paths; k++) /* no credentials on disk */
                tw_url_redact(p->input.paths[k], mf->p.input.paths[k], TW_PATH_MAX);
            mf->m = c->m;
            mf->info = *info;
            mf->stac = c->infos[idx].stac;
            snprintf(mf->config_json, sizeof mf->config_json, "%s", c->config_json);
            snprintf(mf->fingerprint, sizeof mf->fingerprint, "%s", fp);
            st = tw_manifest_path(p->output.dir, res->stem, mpath, sizeof mpath, err);
            if (st == TW_OK) st = tw_manifest_write(mf, mpath, err);
            tw_free(mf);
        }
    }
    tw_free(fp); /* the parts have checked and stored it */
    return st;
}

/* The identity of input idx for resume (identity.h; a STAC item's, stac.h). */
static tw_status input_identity(const run_ctx *c, int idx, char *buf, size_t size, tw_error *err)
{
    return c->stacs[idx] ? tw_stac_identity(c->stacs[idx], buf, size, err)
                         : tw_identity(c->p->input.paths[idx], buf, size, err);
}

/* What input idx is, as "key value" lines that name it (shown): the
 * geometry the plan and the readers' buffers are cut to, then its identity
 * (io/input/identity.h). */
static void input_state(const tw_raster_info *info, int bands, const char *shown, const char *ident,
                        char *buf, size_t size)
{
    uint64_t crs = 1469598103934665603ULL; /* FNV-1a of the WKT */
    for (const char *q = info->crs_wkt; *q; q++) crs = (crs ^ (uint8_t)*q) * 1099511628211ULL;
    const double *g = info->geotransform;
    snprintf(buf, size,
             "raster[%s] %dx%d %s x%d\ngeotransform[%s] %.17g,%.17g,%.17g,%.17g,%.17g,%.17g\n"
             "crs[%s] %s%016llx\nnodata[%s] %s%.17g\n%s",
             shown, info->width, info->height, tw_dtype_name(info->dtype), bands, shown, g[0], g[1],
             g[2], g[3], g[4], g[5], shown, info->crs_wkt[0] ? "fnv64:" : "none ",
             (unsigned long long)crs, shown, info->has_nodata ? "" : "none ",
             info->has_nodata ? info->nodata : 0.0, ident);
}

/* Record every input's state before the first tile (input_unchanged
 * checks it at the input's turn). */
static tw_status record_inputs(run_ctx *c, tw_error *err)
{
    char ident[4096], shown[TW_URL_SHOWN_MAX];
    for (int i = 0; i < c->p->input.n_paths; i++) {
        if (c->infos[i].skipped) continue;
        tw_status st = input_identity(c, i, ident, sizeof ident, err);
        if (st != TW_OK) return st;
        tw_url_redact(c->p->input.paths[i], shown, sizeof shown);
        input_state(&c->infos[i].info, c->infos[i].bands, shown, ident, c->infos[i].state,
                    sizeof c->infos[i].state);
    }
    return TW_OK;
}

/* Input idx at its turn against what the run recorded before its first
 * tile: a raster replaced meanwhile (while the inputs before it ran) would
 * be cut with the old geometry, or classified unchecked. Refused as a
 * resume of a replaced raster is (parts.c: exit 6, what changed, now and
 * then); ident gets its identity now (the parts fingerprint's). */
static tw_status input_unchanged(run_ctx *c, int idx, const char *shown, char *ident,
                                 size_t ident_size, tw_error *err)
{
    const tw_run_params *p = c->p;
    tw_raster *r = NULL;
    tw_raster_open_params op = {.tiff_direct = p->input.tiff_direct};
    tw_status st = tw_raster_open_ex(c->sources[idx], c->m.bands, c->m.n_bands, &op, &r, err);
    if (st != TW_OK) return st;
    tw_raster_info now = *tw_raster_get_info(r);
    int bands = tw_raster_selected_bands(r);
    tw_raster_close(r);
    st = input_identity(c, idx, ident, ident_size, err);
    if (st != TW_OK || !c->infos[idx].state[0]) return st;
    char *state = tw_alloc(TW_MEM_OTHER, 2 * (size_t)TW_INPUT_STATE_MAX);
    if (!state) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    char *was = state + TW_INPUT_STATE_MAX;
    /* another geometry: that alone is said (the file's identity changed too) */
    input_state(&now, bands, shown, "", state, TW_INPUT_STATE_MAX);
    input_state(&c->infos[idx].info, c->infos[idx].bands, shown, "", was, TW_INPUT_STATE_MAX);
    char diff[700];
    int n = tw_fingerprint_diff_as(state, was, "when the run began", diff, sizeof diff);
    if (n == 0) {
        input_state(&now, bands, shown, ident, state, TW_INPUT_STATE_MAX);
        n = tw_fingerprint_diff_as(state, c->infos[idx].state, "when the run began", diff,
                                   sizeof diff);
    }
    if (n > 0)
        st = tw_error_set(err, TW_ERR_PARTS,
                          "%s: the input changed after the run began (%s); nothing of it was "
                          "classified: run the same command again to classify it as it is now",
                          shown, diff);
    tw_free(state);
    return st;
}

/* Segments: the shard's rows that no earlier run has committed, one per
 * run of them (counted first: one per row took 96 bytes a row, 3.2 GB for
 * a 64 x 2^31-1 raster). */
static tw_status plan_segments(const tw_plan *plan, tw_pipe *pp, tw_input_result *res,
                               tw_error *err)
{
    int n_runs = 0;
    for (int r = plan->row_begin; r < plan->row_end; r++)
        n_runs += !tw_parts_row_done(pp->parts, r) &&
                  (r == plan->row_begin || tw_parts_row_done(pp->parts, r - 1));
    pp->segs = tw_calloc(TW_MEM_OTHER, (size_t)n_runs + 1, sizeof(tw_segment));
    if (!pp->segs) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    for (int r = plan->row_begin; r < plan->row_end;) {
        if (tw_parts_row_done(pp->parts, r)) {
            r++;
            continue;
        }
        int r1 = r;
        while (r1 < plan->row_end && !tw_parts_row_done(pp->parts, r1)) r1++;
        tw_segment *sg = &pp->segs[pp->n_segs++];
        sg->plan = *plan;
        tw_plan_restrict(&sg->plan, r, r1);
        sg->first = pp->n_tiles;
        pp->n_tiles += sg->plan.n_tiles;
        r = r1;
    }
    res->tiles_total = pp->n_tiles;
    res->rows_resumed = (plan->row_end - plan->row_begin);
    for (int i = 0; i < pp->n_segs; i++)
        res->rows_resumed -= pp->segs[i].plan.row_end - pp->segs[i].plan.row_begin;
    return TW_OK;
}

/* The segments' tiles through the stages (stages.h), committed as chunks. */
static tw_status compute(run_ctx *c, int idx, const tw_plan *plan, tw_input_result *res,
                         tw_pipe *pp, tw_error *err)
{
    const tw_run_params *p = c->p;
    /* Progress 0 first, as GDAL does: the CLI starts its clock (tiles/s,
     * time left) here rather than after the first batch. */
    if (c->hooks && c->hooks->progress) {
        if (c->hooks->tiles) c->hooks->tiles(0, pp->n_tiles, res->path, c->hooks->progress_user);
        (void)c->hooks->progress(0.0, res->path, c->hooks->progress_user);
    }
    tw_status st = tw_pipe_slots_alloc(pp, plan->tile, err);
    tw_backend_stats bs;
    tw_backend_get_stats(&c->be, &bs);
    if (st == TW_OK && bs.pinned_fallback && !c->told_pinned) {
        c->told_pinned = true;
        tw_log_printf(tw_run_log(c), TW_LOG_NOTICE,
                      "%s backend: no pinned host memory left; batch slots use ordinary "
                      "memory, host-to-device copies will be slower",
                      c->be.i->name);
    }
    if (st == TW_OK) st = tw_pipe_calibrate(pp, &c->infos[idx].info, err);
    if (st == TW_OK && c->seg) {
        const tw_plan *sp = &pp->segs[0].plan;
        tw_blend_params bp = tw_blend_default_params();
        bp.width = c->infos[idx].info.width;
        bp.height = c->infos[idx].info.height;
        bp.tile = sp->tile;
        bp.stride = sp->stride;
        bp.edge = sp->edge;
        bp.mode = p->tiling.blend;
        bp.margin = p->tiling.margin;
        bp.n_classes = c->m.n_classes;
        bp.row_begin = sp->row_begin;
        bp.row_end = sp->row_end;
        st = tw_blend_create(bp, tw_pipe_parts_sink, pp, &pp->blend, err);
    } else if (st == TW_OK) {
        st = tw_stitch_create_ex(&pp->segs[0].plan, c->m.n_classes,
                                 tw_run_cell_emb(p->output.products, c->m.feat_dim),
                                 tw_pipe_parts_sink, pp, &pp->stitch, err);
    }
    bool interrupted = false;
    if (st == TW_OK) st = tw_pipe_run(pp, &interrupted);
    if (st == TW_OK && interrupted)
        st = tw_error_set(err, TW_CANCELLED,
                          "%s: interrupted after committing %d of %d output rows; "
                          "run the same command again to finish",
                          res->path, tw_parts_rows_done(pp->parts), plan->grid_h);
    if (st == TW_OK && pp->steady)
        res->steady_state_allocs = tw_pipe_alloc_count(pp) - pp->allocs_mark;
    if (pp->stitch || pp->blend) {
        int64_t nod = 0;
        const int64_t *h =
            pp->blend ? tw_blend_histogram(pp->blend, &nod) : tw_stitch_histogram(pp->stitch, &nod);
        memcpy(res->hist, h, sizeof(int64_t) * (size_t)c->m.n_classes);
        res->nodata_cells = nod;
    }
    return st;
}

/* Whole grid committed (one run, or the last of the shards): assemble,
 * then (output.stac) the item of the finished files. */
static tw_status finish(run_ctx *c, int idx, tw_input_result *res, tw_parts *parts, tw_error *err)
{
    const tw_run_params *p = c->p;
    const tw_raster_info *info = &c->infos[idx].info;
    bool stac = p->output.stac && p->shard_count == 1;
    tw_status st = TW_OK;
    if (stac) st = tw_stac_run_forget(p, res->stem, c->collection_id[0] != '\0', err);
    if (st == TW_OK && p->shard_count == 1)
        st = tw_products_assemble(c->p, &c->m, info, c->sources[idx], c->config_json,
                                  tw_budget_assembly_room(&c->bud, p->runtime.memory), parts, res,
                                  err);
    if (st == TW_OK && stac)
        st = tw_stac_run_item(p, &c->m, info, &c->infos[idx].stac,
                              c->collection_id[0] ? c->collection_id : NULL, res, err);
    return st;
}

/* Input idx: its plan, parts and segments, the tiles it has left, then its
 * products. */
static tw_status run_one(run_ctx *c, int idx, tw_input_result *res, tw_error *err)
{
    const tw_run_params *p = c->p;
    const tw_raster_info *info = &c->infos[idx].info;
    double t0 = tw_clock_now();
    tw_url_redact(p->input.paths[idx], res->path, sizeof res->path);
    tw_status st = tw_output_name(p, idx, res->stem, sizeof res->stem, err);
    if (st != TW_OK) return st;
    res->width = info->width;
    res->height = info->height;

    tw_plan plan;
    st = tw_plan_make_cell(info->width, info->height, c->m.tile, c->m.stride, c->m.cell,
                           p->tiling.edge, p->shard_index, p->shard_count, &plan, err);
    if (st != TW_OK) return st;
    res->grid_w = plan.grid_w;
    res->grid_h = plan.grid_h;

    tw_pipe pp;
    pipe_init(c, idx, &plan, res, &pp, err);
    tw_aoi *aoi = NULL;
    st = tw_run_aoi_for(p, &c->m, info, &aoi, err);
    if (st != TW_OK) return st;
    pp.aoi = aoi;

    char *ident = tw_alloc(TW_MEM_OTHER, 4096);
    st = ident ? input_unchanged(c, idx, res->path, ident, 4096, err)
               : tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    if (st == TW_OK) st = open_parts(c, idx, &plan, res, ident, &pp, err);
    tw_free(ident);
    if (st == TW_OK) st = plan_segments(&plan, &pp, res, err);
    if (st == TW_OK && pp.n_segs > 0) st = compute(c, idx, &plan, res, &pp, err);
    tw_stitch_destroy(pp.stitch);
    tw_blend_destroy(pp.blend);
    tw_pipe_slots_free(&pp);
    tw_free(pp.segs);
    if (st == TW_OK) st = finish(c, idx, res, pp.parts, err);
    tw_parts_close(pp.parts);
    if (st == TW_OK && p->shard_count == 1 && tw_products_stale(p, res) > 0) {
        char names[1200] = "";
        size_t used = 0;
        for (int k = 0; k < res->n_stale; k++) {
            const char *base = strrchr(res->stale[k], '/');
            int w = snprintf(names + used, sizeof names - used, "%s%s", k ? ", " : "",
                             base ? base + 1 : res->stale[k]);
            if (w > 0 && (size_t)w < sizeof names - used) used += (size_t)w;
        }
        tw_log_printf(tw_run_log(c), TW_LOG_WARNING,
                      "%s: %s in %s %s not written by this run (left by an earlier run with "
                      "other output.products, or not tilewise's): kept, listed as stale in "
                      "run.json; remove %s if %s not wanted",
                      res->stem, names, p->output.dir, res->n_stale == 1 ? "was" : "were",
                      res->n_stale == 1 ? "it" : "them", res->n_stale == 1 ? "it is" : "they are");
    }
    tw_aoi_destroy(aoi);
    res->seconds = tw_clock_now() - t0;
    return st;
}

int tw_run_readers(const tw_run_params *p, const tw_backend *be)
{
    if (p->runtime.readers > 0) return p->runtime.readers;
    /* The CPU backend's inference owns every core: one reader keeps it fed
     * (bench/RESULTS.md, "Reader workers"). A backend that normalizes on
     * its device leaves the host's cores to the readers, less the infer
     * and write threads. */
    if (!be->i->wants_raw(be->ctx)) return 1;
    long cores = omp_get_num_procs(); /* the CPUs this process may use (a job's, under SLURM) */
    long n = cores - 2;
    return n < 1 ? 1 : (n > 8 ? 8 : (int)n);
}

int tw_run_normalize_threads(const tw_run_params *p, const tw_backend *be)
{
    /* A backend that computes on the host's cores (runtime.threads of
     * them, 0: all) leaves the normalize stage the cores it does not use,
     * one at least: one runs without an OpenMP team of its own, so that
     * the inference's team is the only one and keeps libgomp's full
     * spin-wait (normalize.c). A backend with a device of its own leaves
     * OpenMP its default, all the cores. */
    if (be->i->wants_raw(be->ctx)) return 0;
    long cores = omp_get_num_procs();
    long used = p->runtime.threads > 0 && p->runtime.threads < cores ? p->runtime.threads : cores;
    return cores - used > 1 ? (int)(cores - used) : 1;
}

/* What a run says before its first tile: the skipped inputs, then the
 * output checks' warnings and the advice validate gives (advice.h), logged
 * and kept for run.json and the report; under --strict a warning refuses
 * the run (TW_ERR_CONFIG). */
static tw_status warn_before_first_tile(run_ctx *c, tw_run_result *r, tw_error *err)
{
    const tw_run_params *p = c->p;
    for (int i = 0; i < p->input.n_paths; i++)
        if (c->infos[i].skipped) {
            char shown[TW_URL_SHOWN_MAX];
            tw_url_redact(p->input.paths[i], shown, sizeof shown);
            tw_log_printf(tw_run_log(c), TW_LOG_WARNING,
                          "skipping input %s (input.on_error: skip): %s", shown,
                          c->infos[i].skip_reason);
        }
    tw_run_checks_advice(c, &r->advice);
    tw_advice *a = tw_alloc(TW_MEM_OTHER, sizeof *a);
    if (!a) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    tw_advice_collect(p, &c->m, a);
    for (int i = 0; i < a->n && r->advice.n < TW_ADVICE_MAX; i++)
        if (a->items[i].warning) {
            r->advice.items[r->advice.n++] = a->items[i];
            r->advice.n_warnings++;
        }
    tw_free(a);
    for (int i = 0; i < r->advice.n; i++)
        tw_log_printf(tw_run_log(c), TW_LOG_WARNING, "%s", r->advice.items[i].text);
    if (p->strict && r->advice.n_warnings > 0)
        return tw_error_set(
            err, TW_ERR_CONFIG, "--strict: %d warning%s before the first tile, the first: %s",
            r->advice.n_warnings, r->advice.n_warnings == 1 ? "" : "s", r->advice.items[0].text);
    return TW_OK;
}

/* The run proper: tw_run inside the run's allocator scope. */
static tw_status run_scoped(const tw_run_params *p, const tw_run_hooks *hooks,
                            tw_run_result **result, tw_error *err);

tw_status tw_run(const tw_run_params *p, const tw_run_hooks *hooks, tw_run_result **result,
                 tw_error *err)
{
    /* The run's own allocator counters (core/alloc.h): its report's peaks
     * and steady-state count are its own, whatever else the process runs. */
    tw_mem_scope *scope = tw_mem_scope_open();
    tw_mem_scope *outer = tw_mem_scope_enter(scope);
    tw_run_result *r = NULL;
    tw_status st = run_scoped(p, hooks, &r, err);
    if (r)
        for (int t = 0; t <= TW_MEM_TAG_COUNT; t++)
            r->mem_peak[t] =
                scope ? tw_mem_scope_peak(scope, (tw_mem_tag)t) : tw_mem_peak((tw_mem_tag)t);
    tw_mem_scope_enter(outer);
    tw_mem_scope_close(scope);
    if (result)
        *result = r;
    else
        tw_run_result_destroy(r);
    return st;
}

static tw_status run_scoped(const tw_run_params *p, const tw_run_hooks *hooks,
                            tw_run_result **result, tw_error *err)
{
    double t0 = tw_clock_now();
    run_ctx *c = tw_calloc(TW_MEM_OTHER, 1, sizeof *c);
    tw_run_result *r = tw_calloc(TW_MEM_OTHER, 1, sizeof *r);
    *result = r;
    if (!c || !r) {
        tw_free(c);
        return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    c->p = p;
    c->hooks = hooks;
    tw_status st = tw_run_prepare(c, p, p->quiet, err);
    if (st == TW_OK) st = warn_before_first_tile(c, r, err);
    if (st == TW_OK) {
        r->model = c->m;
        snprintf(r->backend, sizeof r->backend, "%s", c->be.i->name);
        if (tw_report_config_json(p, &c->m, c->config_json, sizeof c->config_json) >=
            sizeof c->config_json)
            st = tw_error_set(err, TW_ERR_INTERNAL,
                              "the run's configuration needs more than %zu bytes of JSON",
                              sizeof c->config_json);
    }
    if (st == TW_OK) {
        /* An allocation that fails although the budget said it fits (the
         * machine has less free memory than runtime.memory): the backend
         * halves the batch itself, down to 1, and says so (backend.h). */
        int batch = c->bud.batch;
        st = c->seg ? tw_backend_reserve_seg(&c->be, c->seg, c->m.tile, &batch,
                                             p->runtime.precision, tw_run_log(c), err)
                    : tw_backend_reserve(&c->be, c->net, c->m.tile, &batch, p->runtime.precision,
                                         true, tw_run_log(c), err);
        tw_backend_stats bs;
        tw_backend_get_stats(&c->be, &bs);
        if (st == TW_OK && bs.unfused_convs > 0)
            tw_log_printf(tw_run_log(c), TW_LOG_NOTICE,
                          "%s backend: no fused kernel for %d convolutions; they run unfused",
                          c->be.i->name, bs.unfused_convs);
        if (st == TW_OK && batch < c->bud.batch) {
            c->bud.batch = batch; /* the backend halved it: fewer tiles per slot */
            c->bud.ref_capacity = tw_budget_ref_capacity(batch);
        }
        GDALSetCacheMax64((GIntBig)c->bud.gdal_cache);
        r->budget = c->bud;
    }
    if (st == TW_OK) st = make_dirs(p->output.dir, err);
    if (st == TW_OK) st = record_inputs(c, err);
    int n_items = 0; /* output.stac: inputs that get an item; several make a collection */
    for (int i = 0; st == TW_OK && p->output.stac && p->shard_count == 1 && i < p->input.n_paths;
         i++)
        n_items += !c->infos[i].skipped;
    if (st == TW_OK && n_items > 1)
        tw_stac_run_collection_id(p->output.dir, c->collection_id, sizeof c->collection_id);
    if (st == TW_OK) {
        r->inputs = tw_calloc(TW_MEM_OTHER, (size_t)p->input.n_paths, sizeof(tw_input_result));
        if (!r->inputs) st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; st == TW_OK && i < p->input.n_paths; i++) {
        r->n_inputs = i + 1;
        if (c->infos[i].skipped) {
            tw_input_result *in = &r->inputs[i];
            tw_url_redact(p->input.paths[i], in->path, sizeof in->path);
            tw_output_name(p, i, in->stem, sizeof in->stem, NULL);
            snprintf(in->skipped, sizeof in->skipped, "%.500s", c->infos[i].skip_reason);
            r->inputs_skipped++;
            continue;
        }
        st = run_one(c, i, &r->inputs[i], err);
        r->tiles_classified += r->inputs[i].tiles_classified;
    }
    if (st == TW_OK && n_items > 1) st = tw_stac_run_collection(p->output.dir, &c->m, r, err);
    if (c->have_be) tw_backend_get_stats(&c->be, &r->backend_stats);
    tw_run_ctx_release(c);
    tw_free(c);
    r->seconds = tw_clock_now() - t0;
    r->peak_rss = tw_rss_peak();
    return st;
}
