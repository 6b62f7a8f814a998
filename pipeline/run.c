/* run.c - see run.h */
#include "pipeline/run.h"

#include <errno.h>
#include <gdal.h>
#include <libgen.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "io/model_file.h"
#include "io/raster.h"
#include "io/tiletable.h"
#include "io/writer.h"
#include "pipeline/alloc.h"
#include "pipeline/normalize.h"
#include "pipeline/plan.h"
#include "pipeline/queue.h"
#include "pipeline/stitch.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------------ */
/* Model and inputs: resolve config against the bundle, check before work.  */

static tw_status resolve_model(const tw_run_params *p, const tw_model_file *mf,
                               const tw_resnet *net, tw_resolved *m, tw_error *err)
{
    memset(m, 0, sizeof *m);
    const char *wpath = p->model.weights;
    snprintf(m->arch, sizeof m->arch, "resnet%d", net->depth);
    m->in_bands = net->in_bands;
    m->feat_dim = net->feat_dim;
    memcpy(m->model_sha256, mf->sha256, sizeof m->model_sha256);

    if (p->input.n_bands > 0) {
        m->n_bands = p->input.n_bands;
        memcpy(m->bands, p->input.bands, sizeof(int) * (size_t)m->n_bands);
    } else if (mf->n_bands > 0) {
        m->n_bands = mf->n_bands;
        memcpy(m->bands, mf->bands, sizeof(int) * (size_t)m->n_bands);
    }
    if (m->n_bands > 0 && m->n_bands != net->in_bands)
        return tw_error_set(err, TW_ERR_MODEL,
                            "%s expects %d input bands (conv1.weight) but %s selects %d",
                            wpath, net->in_bands,
                            p->input.n_bands > 0 ? "input.bands" : "the bundle's band list",
                            m->n_bands);

    m->scale = !isnan(p->input.scale) ? p->input.scale : (!isnan(mf->scale) && mf->scale > 0 ? mf->scale : 1.0);

    m->n_norm = net->in_bands;
    int n_mean = p->model.n_mean > 0 ? p->model.n_mean : mf->n_mean;
    int n_std = p->model.n_std > 0 ? p->model.n_std : mf->n_std;
    const float *mean = p->model.n_mean > 0 ? p->model.mean : mf->mean;
    const float *std = p->model.n_std > 0 ? p->model.std : mf->std;
    if (n_mean > 0 && n_mean != net->in_bands)
        return tw_error_set(err, TW_ERR_CONFIG,
                            "model.mean has %d values but %s expects %d input bands", n_mean,
                            wpath, net->in_bands);
    if (n_std > 0 && n_std != net->in_bands)
        return tw_error_set(err, TW_ERR_CONFIG,
                            "model.std has %d values but %s expects %d input bands", n_std, wpath,
                            net->in_bands);
    for (int c = 0; c < net->in_bands; c++) {
        m->mean[c] = n_mean > 0 ? mean[c] : 0.0f;
        m->std[c] = n_std > 0 ? std[c] : 1.0f;
        if (!(m->std[c] > 0.0f) || !isfinite(m->std[c]) || !isfinite(m->mean[c]))
            return tw_error_set(err, TW_ERR_CONFIG, "model.std[%d] must be a positive number", c);
    }

    m->n_classes = net->n_classes;
    if (net->n_classes > TW_MAX_CLASSES)
        return tw_error_set(err, TW_ERR_MODEL, "%s has %d classes; tilewise supports at most %d",
                            wpath, net->n_classes, TW_MAX_CLASSES);
    if (p->model.n_classes > 0 && p->model.n_classes != net->n_classes)
        return tw_error_set(err, TW_ERR_CONFIG,
                            "model.classes names %d classes but %s has %d (fc.weight)",
                            p->model.n_classes, wpath, net->n_classes);
    for (int c = 0; c < net->n_classes; c++) {
        if (p->model.n_classes > 0)
            snprintf(m->classes[c], TW_NAME_MAX, "%s", p->model.classes[c]);
        else if (mf->n_classes == net->n_classes)
            snprintf(m->classes[c], TW_NAME_MAX, "%s", mf->classes[c]);
        else
            snprintf(m->classes[c], TW_NAME_MAX, "class_%d", c);
    }

    m->tile = p->tiling.tile > 0 ? p->tiling.tile : (mf->tile > 0 ? mf->tile : 64);
    m->stride = p->tiling.stride > 0 ? p->tiling.stride : m->tile;
    if (m->stride > m->tile || m->tile % m->stride != 0)
        return tw_error_set(err, TW_ERR_CONFIG, "tiling.stride %d does not divide tiling.tile %d",
                            m->stride, m->tile);
    if (m->tile < 32)
        return tw_error_set(err, TW_ERR_CONFIG,
                            "tiling.tile %d is too small for a ResNet (32 pixels at least)", m->tile);
    return TW_OK;
}

/* Output file stem of an input: its file name without the extension. */
static void input_stem(const char *path, char *out, size_t size)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (snprintf(out, size, "%s", base) >= (int)size) out[size - 1] = '\0';
    char *dot = strrchr(out, '.');
    if (dot && dot != out) *dot = '\0';
}

typedef struct input_info {
    tw_raster_info info;
    int bands;
} input_info;

static tw_status check_inputs(const tw_run_params *p, const tw_resolved *m, input_info *infos,
                              tw_error *err)
{
    for (int i = 0; i < p->input.n_paths; i++) {
        tw_raster *r = NULL;
        tw_status st = tw_raster_open(p->input.paths[i], m->bands, m->n_bands, &r, err);
        if (st != TW_OK) return st;
        infos[i].info = *tw_raster_get_info(r);
        infos[i].bands = tw_raster_selected_bands(r);
        tw_raster_close(r);
        if (infos[i].bands != m->in_bands)
            return tw_error_set(err, TW_ERR_INPUT,
                                "%s: %d bands selected but the model %s expects %d (set "
                                "input.bands)",
                                p->input.paths[i], infos[i].bands, p->model.weights, m->in_bands);
        char si[256], sj[256];
        input_stem(p->input.paths[i], si, sizeof si);
        for (int j = 0; j < i; j++) {
            input_stem(p->input.paths[j], sj, sizeof sj);
            if (strcmp(si, sj) == 0)
                return tw_error_set(err, TW_ERR_CONFIG,
                                    "input.path: %s and %s would write the same outputs (%s.*)",
                                    p->input.paths[j], p->input.paths[i], si);
        }
    }
    return TW_OK;
}

static tw_status make_dirs(const char *dir, tw_error *err)
{
    char buf[TW_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", dir);
    size_t n = strlen(buf);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return tw_error_set(err, TW_ERR_OUTPUT, "output.dir: cannot create %s: %s", buf,
                                strerror(errno));
        buf[i] = c;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return tw_error_set(err, TW_ERR_OUTPUT, "output.dir: %s is not a directory", dir);
    if (access(dir, W_OK) != 0)
        return tw_error_set(err, TW_ERR_OUTPUT, "output.dir: %s is not writable: %s", dir,
                            strerror(errno));
    return TW_OK;
}

/* ------------------------------------------------------------------------ */
/* Batch slots and the stage workers.                                        */

typedef struct tile_ref {
    int32_t tx, ty;
    int32_t kept;       /* index into the slot's kept tiles, -1: not classified */
    uint8_t read_error;
} tile_ref;

typedef struct slot {
    int n_refs, n_kept;
    tile_ref *refs;     /* [ref_capacity] */
    void *raw;          /* [batch][bands][T][T] raw type */
    bool raw_backend;   /* raw came from the backend's host_alloc (pinned) */
    uint8_t *valid;     /* [batch][T][T] */
    float *x;           /* [batch][bands][T][T], NULL when the backend normalizes */
    float *probs;       /* [batch][classes] */
    float *emb;         /* [batch][feat] or NULL */
    int32_t *orow, *ocol; /* [batch] tile origins, for the tile table */
} slot;

typedef struct run_pipe {
    const tw_run_params *p;
    const tw_resolved *m;
    const tw_plan *plan;
    const tw_budget *bud;
    tw_backend *be;
    const tw_run_hooks *hooks;
    const char *path;
    tw_dtype dtype;
    tw_norm norm;
    bool wants_raw;
    bool want_emb;
    slot *slots;
    int n_slots;
    tw_queue *q_free, *q_norm, *q_infer, *q_write;
    atomic_int abort;           /* an error or a cancel: every stage stops */
    atomic_int cancelled;
    tw_error *err;
    tw_stitch *stitch;
    tw_tiletable *table;
    tw_input_result *res;
    int64_t tiles_done;
    uint64_t allocs_after_first;
    bool first_written;
} run_pipe;

static void pipe_abort(run_pipe *pp)
{
    atomic_store(&pp->abort, 1);
    tw_queue_close(pp->q_free);
    tw_queue_close(pp->q_norm);
    tw_queue_close(pp->q_infer);
    tw_queue_close(pp->q_write);
}

static void slots_free(run_pipe *pp)
{
    if (!pp->slots) return;
    for (int i = 0; i < pp->n_slots; i++) {
        slot *s = &pp->slots[i];
        if (s->raw_backend && pp->be->i->host_free)
            pp->be->i->host_free(pp->be->ctx, s->raw);
        else
            tw_free(s->raw);
        tw_free(s->refs);
        tw_free(s->valid);
        tw_free(s->x);
        tw_free(s->probs);
        tw_free(s->emb);
        tw_free(s->orow);
        tw_free(s->ocol);
    }
    tw_free(pp->slots);
    pp->slots = NULL;
}

static tw_status slots_alloc(run_pipe *pp, tw_error *err)
{
    const tw_budget *b = pp->bud;
    size_t px = (size_t)pp->plan->tile * (size_t)pp->plan->tile;
    size_t nb = (size_t)b->batch;
    size_t raw_bytes = nb * (size_t)pp->norm.bands * px * tw_dtype_size(pp->dtype);
    pp->n_slots = b->n_slots;
    pp->slots = tw_calloc(TW_MEM_SLOTS, (size_t)pp->n_slots, sizeof(slot));
    if (!pp->slots) goto nomem;
    for (int i = 0; i < pp->n_slots; i++) {
        slot *s = &pp->slots[i];
        if (pp->be->i->host_alloc) {
            s->raw = pp->be->i->host_alloc(pp->be->ctx, raw_bytes);
            s->raw_backend = s->raw != NULL;
        }
        if (!s->raw) s->raw = tw_alloc(TW_MEM_SLOTS, raw_bytes);
        s->refs = tw_calloc(TW_MEM_SLOTS, (size_t)b->ref_capacity, sizeof(tile_ref));
        s->valid = tw_alloc(TW_MEM_SLOTS, nb * px);
        if (!pp->wants_raw) s->x = tw_alloc(TW_MEM_SLOTS, nb * (size_t)pp->norm.bands * px * sizeof(float));
        s->probs = tw_alloc(TW_MEM_SLOTS, nb * (size_t)pp->m->n_classes * sizeof(float));
        if (pp->want_emb) s->emb = tw_alloc(TW_MEM_SLOTS, nb * (size_t)pp->m->feat_dim * sizeof(float));
        s->orow = tw_alloc(TW_MEM_SLOTS, nb * sizeof(int32_t));
        s->ocol = tw_alloc(TW_MEM_SLOTS, nb * sizeof(int32_t));
        if (!s->raw || !s->refs || !s->valid || (!pp->wants_raw && !s->x) || !s->probs ||
            (pp->want_emb && !s->emb) || !s->orow || !s->ocol)
            goto nomem;
    }
    return TW_OK;
nomem:
    return tw_error_set(err, TW_ERR_NOMEM, "cannot allocate %d batch slots of %zu bytes",
                        b->n_slots, b->slot_bytes);
}

typedef struct stage_arg {
    run_pipe *pp;
    tw_stage_stats *stats;
} stage_arg;

static void *reader_main(void *arg)
{
    run_pipe *pp = arg;
    tw_stage_stats *stats = &pp->res->stage[TW_STAGE_READ];
    double t_start = now_s();
    const tw_plan *pl = pp->plan;
    const int T = pl->tile;
    const size_t px = (size_t)T * T;
    const size_t raw_tile = (size_t)pp->norm.bands * px * tw_dtype_size(pp->dtype);
    tw_raster *r = NULL;
    /* Each stage opens its own dataset: GDAL handles are not thread-safe. */
    if (tw_raster_open(pp->path, pp->m->bands, pp->m->n_bands, &r, pp->err) != TW_OK) {
        pipe_abort(pp);
        goto done;
    }
    tw_raster_set_nodata(r, !pp->p->input.nodata_auto || tw_raster_get_info(r)->has_nodata,
                         pp->p->input.nodata_auto ? tw_raster_get_info(r)->nodata
                                                  : pp->p->input.nodata);
    slot *s = NULL;
    for (int ty = pl->ty_begin; ty < pl->ty_end && !atomic_load(&pp->abort); ty++) {
        int y0 = tw_axis_pos(&pl->y, T, pl->stride, ty);
        for (int tx = 0; tx < pl->x.n_pos; tx++) {
            if (pp->hooks && pp->hooks->stop && *pp->hooks->stop) {
                atomic_store(&pp->cancelled, 1);
                pipe_abort(pp);
                goto done;
            }
            if (!s) {
                s = tw_queue_pop(pp->q_free, &stats->wait_s);
                if (!s) goto done;
                s->n_refs = s->n_kept = 0;
            }
            int x0 = tw_axis_pos(&pl->x, T, pl->stride, tx);
            tile_ref *ref = &s->refs[s->n_refs++];
            ref->tx = tx;
            ref->ty = ty;
            ref->kept = -1;
            ref->read_error = 0;
            int k = s->n_kept;
            int64_t n_nodata = 0, n_inside = 0;
            tw_error rerr;
            tw_error_init(&rerr);
            tw_status st = tw_raster_read(r, x0, y0, T, T, (char *)s->raw + (size_t)k * raw_tile,
                                          s->valid + (size_t)k * px, &n_nodata, &n_inside, &rerr);
            if (st != TW_OK) {
                if (pp->p->input.on_error != TW_ON_ERROR_SKIP) {
                    tw_error_set(pp->err, st, "%s", rerr.msg);
                    pipe_abort(pp);
                    goto done;
                }
                fprintf(stderr, "tilewise: warning: tile (row %d, col %d) at pixel x=%d y=%d unreadable, "
                        "written as nodata: %s\n", ty, tx, x0, y0, rerr.msg);
                ref->read_error = 1;
            } else if (n_inside > 0 &&
                       (double)n_nodata / (double)n_inside <= pp->p->tiling.max_nodata_fraction &&
                       n_nodata < n_inside) {
                ref->kept = k;
                s->orow[k] = y0;
                s->ocol[k] = x0;
                s->n_kept++;
            }
            if (s->n_kept == pp->bud->batch || s->n_refs == pp->bud->ref_capacity) {
                if (!tw_queue_push(pp->q_norm, s, &stats->wait_s)) goto done;
                s = NULL;
            }
        }
    }
    if (s && s->n_refs > 0 && !atomic_load(&pp->abort)) tw_queue_push(pp->q_norm, s, &stats->wait_s);
done:
    tw_raster_close(r);
    tw_queue_close(pp->q_norm);
    stats->busy_s = now_s() - t_start - stats->wait_s;
    return NULL;
}

static void *normalize_main(void *arg)
{
    run_pipe *pp = arg;
    tw_stage_stats *stats = &pp->res->stage[TW_STAGE_NORMALIZE];
    double t_start = now_s();
    const int T = pp->plan->tile;
    slot *s;
    while ((s = tw_queue_pop(pp->q_norm, &stats->wait_s)) != NULL) {
        if (atomic_load(&pp->abort)) break;
        if (!pp->wants_raw && s->n_kept > 0)
            tw_normalize(s->raw, pp->dtype, s->valid, s->n_kept, T, T, &pp->norm, s->x);
        if (!tw_queue_push(pp->q_infer, s, &stats->wait_s)) break;
    }
    tw_queue_close(pp->q_infer);
    stats->busy_s = now_s() - t_start - stats->wait_s;
    return NULL;
}

static void *infer_main(void *arg)
{
    run_pipe *pp = arg;
    tw_stage_stats *stats = &pp->res->stage[TW_STAGE_INFER];
    double t_start = now_s();
    slot *s;
    while ((s = tw_queue_pop(pp->q_infer, &stats->wait_s)) != NULL) {
        if (atomic_load(&pp->abort)) break;
        if (s->n_kept > 0) {
            tw_infer_batch b = {
                .n = s->n_kept,
                .tile = pp->plan->tile,
                .x = s->x,
                .raw = s->raw,
                .raw_type = pp->dtype,
                .valid = s->valid,
                .norm = &pp->norm,
                .probs = s->probs,
                .emb = s->emb,
            };
            if (pp->be->i->infer(pp->be->ctx, &b, pp->err) != TW_OK) {
                pipe_abort(pp);
                break;
            }
        }
        if (!tw_queue_push(pp->q_write, s, &stats->wait_s)) break;
    }
    tw_queue_close(pp->q_write);
    stats->busy_s = now_s() - t_start - stats->wait_s;
    return NULL;
}

static void *writer_main(void *arg)
{
    run_pipe *pp = arg;
    tw_stage_stats *stats = &pp->res->stage[TW_STAGE_WRITE];
    double t_start = now_s();
    const int C = pp->m->n_classes;
    int cur_ty = -1;
    slot *s;
    while ((s = tw_queue_pop(pp->q_write, &stats->wait_s)) != NULL) {
        if (atomic_load(&pp->abort)) break;
        for (int i = 0; i < s->n_refs; i++) {
            const tile_ref *ref = &s->refs[i];
            if (ref->ty != cur_ty) {
                if (tw_stitch_begin_row(pp->stitch, ref->ty, pp->err) != TW_OK) goto fail;
                cur_ty = ref->ty;
            }
            if (ref->kept >= 0) {
                tw_stitch_add(pp->stitch, ref->tx, ref->ty, s->probs + (size_t)ref->kept * C);
                pp->res->tiles_classified++;
            } else if (ref->read_error) {
                pp->res->tiles_read_errors++;
            } else {
                pp->res->tiles_nodata++;
            }
        }
        if (pp->table && s->n_kept > 0 &&
            tw_tiletable_append(pp->table, s->n_kept, s->orow, s->ocol, s->probs, s->emb,
                                pp->err) != TW_OK)
            goto fail;
        pp->tiles_done += s->n_refs;
        if (!pp->first_written && tw_stitch_rows_done(pp->stitch) > 0) {
            pp->first_written = true;
            pp->allocs_after_first = tw_mem_alloc_count();
        }
        if (pp->hooks && pp->hooks->progress) {
            double f = pp->plan->n_tiles > 0 ? (double)pp->tiles_done / (double)pp->plan->n_tiles : 1.0;
            if (!pp->hooks->progress(f, pp->path, pp->hooks->progress_user)) {
                atomic_store(&pp->cancelled, 1);
                pipe_abort(pp);
                break;
            }
        }
        if (!tw_queue_push(pp->q_free, s, &stats->wait_s)) break;
    }
    stats->busy_s = now_s() - t_start - stats->wait_s;
    return NULL;
fail:
    pipe_abort(pp);
    stats->busy_s = now_s() - t_start - stats->wait_s;
    return NULL;
}

/* ------------------------------------------------------------------------ */

typedef struct run_ctx {
    const tw_run_params *p;
    const tw_run_hooks *hooks;
    tw_resolved m;
    tw_resnet *net;
    tw_backend be;
    bool have_be;
    tw_budget bud;
    input_info *infos;
    char config_json[16384];
} run_ctx;

static void output_geotransform(const tw_raster_info *info, const tw_plan *pl, double gt[6])
{
    const double *g = info->geotransform;
    double S = pl->stride;
    double r0 = (double)pl->row_begin * S;
    gt[0] = g[0] + r0 * g[2];
    gt[1] = g[1] * S;
    gt[2] = g[2] * S;
    gt[3] = g[3] + r0 * g[5];
    gt[4] = g[4] * S;
    gt[5] = g[5] * S;
}

static tw_status write_rows_sink(void *user, int row0, int n, const float *probs,
                                 const uint8_t *has, tw_error *err)
{
    return tw_writer_write_rows(user, row0, n, probs, has, err);
}

static tw_status run_one(run_ctx *c, int idx, tw_input_result *res, tw_error *err)
{
    const tw_run_params *p = c->p;
    const tw_raster_info *info = &c->infos[idx].info;
    double t0 = now_s();
    snprintf(res->path, sizeof res->path, "%s", p->input.paths[idx]);
    input_stem(res->path, res->stem, sizeof res->stem);
    if (p->shard_count > 1) {
        size_t n = strlen(res->stem);
        snprintf(res->stem + n, sizeof res->stem - n, ".shard%04d-of-%04d", p->shard_index + 1,
                 p->shard_count);
    }
    res->width = info->width;
    res->height = info->height;

    tw_plan plan;
    tw_status st = tw_plan_make(info->width, info->height, c->m.tile, c->m.stride, p->tiling.edge,
                                p->shard_index, p->shard_count, &plan, err);
    if (st != TW_OK) return st;
    res->grid_w = plan.grid_w;
    res->grid_h = plan.grid_h;
    res->tiles_total = plan.n_tiles;

    run_pipe pp;
    memset(&pp, 0, sizeof pp);
    pp.p = p;
    pp.m = &c->m;
    pp.plan = &plan;
    pp.bud = &c->bud;
    pp.be = &c->be;
    pp.hooks = c->hooks;
    pp.path = res->path;
    pp.dtype = info->dtype;
    pp.norm.bands = c->m.in_bands;
    pp.norm.scale = c->m.scale;
    memcpy(pp.norm.mean, c->m.mean, sizeof pp.norm.mean);
    memcpy(pp.norm.std, c->m.std, sizeof pp.norm.std);
    pp.wants_raw = c->be.i->wants_raw(c->be.ctx);
    pp.want_emb = (p->output.products & TW_PRODUCT_EMB) != 0;
    pp.err = err;
    pp.res = res;

    tw_writer *writer = NULL;
    tw_writer_params wp = {
        .dir = p->output.dir,
        .stem = res->stem,
        .grid_w = plan.grid_w,
        .grid_h = plan.row_end - plan.row_begin,
        .crs_wkt = info->crs_wkt,
        .n_classes = c->m.n_classes,
        .class_names = (const char(*)[TW_NAME_MAX])c->m.classes,
        .products = p->output.products,
        .prob_type = p->output.prob_type,
        .format = p->output.format,
        .creation_options = (const char(*)[128])p->output.creation_options,
        .n_creation_options = p->output.n_creation_options,
        .metadata_json = c->config_json,
    };
    output_geotransform(info, &plan, wp.geotransform);

    st = slots_alloc(&pp, err);
    if (st == TW_OK && (p->output.products & (TW_PRODUCT_CLASS | TW_PRODUCT_PROB | TW_PRODUCT_CONF)))
        st = tw_writer_create(&wp, &writer, err);
    if (st == TW_OK && (p->output.products & (TW_PRODUCT_TILES | TW_PRODUCT_EMB))) {
        char tpath[TW_PATH_MAX + 300];
        snprintf(tpath, sizeof tpath, "%s/%s.tiles.h5", p->output.dir, res->stem);
        tw_tiletable_params tp = {
            .path = tpath,
            .n_classes = c->m.n_classes,
            .class_names = (const char(*)[TW_NAME_MAX])c->m.classes,
            .feat_dim = pp.want_emb ? c->m.feat_dim : 0,
            .tile = plan.tile,
            .stride = plan.stride,
            .crs_wkt = info->crs_wkt,
        };
        memcpy(tp.geotransform, info->geotransform, sizeof tp.geotransform);
        st = tw_tiletable_create(&tp, &pp.table, err);
        if (st == TW_OK) snprintf(res->outputs[res->n_outputs++], sizeof res->outputs[0], "%s", tpath);
    }
    if (st == TW_OK) st = tw_stitch_create(&plan, c->m.n_classes, writer ? write_rows_sink : NULL, writer,
                                         &pp.stitch, err);
    if (st == TW_OK) {
        pp.q_free = tw_queue_create(pp.n_slots);
        pp.q_norm = tw_queue_create(pp.n_slots);
        pp.q_infer = tw_queue_create(pp.n_slots);
        pp.q_write = tw_queue_create(pp.n_slots);
        if (!pp.q_free || !pp.q_norm || !pp.q_infer || !pp.q_write)
            st = tw_error_set(err, TW_ERR_NOMEM, "cannot allocate the stage queues");
    }
    if (st == TW_OK) {
        for (int i = 0; i < pp.n_slots; i++) tw_queue_push(pp.q_free, &pp.slots[i], NULL);
        pthread_t th[TW_STAGE_COUNT];
        void *(*fn[TW_STAGE_COUNT])(void *) = {reader_main, normalize_main, infer_main, writer_main};
        int started = 0;
        for (; started < TW_STAGE_COUNT; started++) {
            if (pthread_create(&th[started], NULL, fn[started], &pp) != 0) {
                st = tw_error_set(err, TW_ERR_NOMEM, "cannot start the %d-th stage thread", started);
                pipe_abort(&pp);
                break;
            }
        }
        for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
        if (st == TW_OK) {
            if (atomic_load(&pp.cancelled))
                st = tw_error_set(err, TW_CANCELLED, "%s: interrupted; run the same command again",
                                  res->path);
            else if (atomic_load(&pp.abort))
                st = err->status != TW_OK ? err->status
                                          : tw_error_set(err, TW_ERR_INTERNAL, "pipeline stopped");
        }
    }
    if (st == TW_OK) st = tw_stitch_finish(pp.stitch, err);
    if (st == TW_OK) {
        res->steady_state_allocs = tw_mem_alloc_count() - pp.allocs_after_first;
        int64_t nod = 0;
        const int64_t *h = tw_stitch_histogram(pp.stitch, &nod);
        memcpy(res->hist, h, sizeof(int64_t) * (size_t)c->m.n_classes);
        res->nodata_cells = nod;
    }
    if (st == TW_OK && writer) st = tw_writer_finish(writer, err);
    if (st == TW_OK && pp.table) st = tw_tiletable_finish(pp.table, err);
    if (st == TW_OK && writer) {
        static const struct { unsigned bit; const char *name; } prods[] = {
            {TW_PRODUCT_CLASS, "class"}, {TW_PRODUCT_PROB, "prob"}, {TW_PRODUCT_CONF, "conf"}};
        for (int i = 0; i < 3; i++)
            if (p->output.products & prods[i].bit)
                tw_writer_product_path(p->output.dir, res->stem, prods[i].name,
                                       res->outputs[res->n_outputs++], sizeof res->outputs[0]);
    }
    if (st != TW_OK) res->n_outputs = 0;
    tw_stitch_destroy(pp.stitch);
    tw_writer_destroy(writer);
    tw_tiletable_destroy(pp.table);
    tw_queue_destroy(pp.q_free);
    tw_queue_destroy(pp.q_norm);
    tw_queue_destroy(pp.q_infer);
    tw_queue_destroy(pp.q_write);
    slots_free(&pp);
    res->seconds = now_s() - t0;
    return st;
}

static void ctx_release(run_ctx *c)
{
    if (c->have_be) tw_backend_destroy(&c->be);
    tw_resnet_destroy(c->net);
    tw_free(c->infos);
}

/* Everything up to (not including) the backend's reserve: model, inputs,
 * backend, budget. Shared by run and validate. */
static tw_status prepare(run_ctx *c, const tw_run_params *p, bool quiet, tw_error *err)
{
    size_t base = tw_rss_now();
    if (p->input.n_paths <= 0)
        return tw_error_set(err, TW_ERR_CONFIG, "input.path: no input raster given");
    tw_model_file *mf = NULL;
    tw_status st = tw_model_file_load(p->model.weights, &mf, err);
    if (st != TW_OK) return st;
    st = tw_resnet_create(mf, p->model.arch, &c->net, err);
    if (st == TW_OK) st = resolve_model(p, mf, c->net, &c->m, err);
    tw_model_file_destroy(mf);
    if (st != TW_OK) return st;

    c->infos = tw_calloc(TW_MEM_OTHER, (size_t)p->input.n_paths, sizeof(input_info));
    if (!c->infos) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    st = check_inputs(p, &c->m, c->infos, err);
    if (st != TW_OK) return st;

    st = tw_backend_create(p->runtime.device, p->runtime.threads, quiet, &c->be, err);
    if (st != TW_OK) return st;
    c->have_be = true;

    /* Budget over the widest input: one plan for all of them. */
    int widest = 0;
    for (int i = 1; i < p->input.n_paths; i++)
        if (c->infos[i].info.width > c->infos[widest].info.width) widest = i;
    const tw_raster_info *wi = &c->infos[widest].info;
    tw_plan plan;
    st = tw_plan_make(wi->width, wi->height, c->m.tile, c->m.stride, p->tiling.edge, 0, 1, &plan,
                      err);
    if (st != TW_OK) return st;
    size_t strip = tw_stitch_bytes(&plan, c->m.n_classes) +
                   (size_t)plan.k * (size_t)plan.grid_w * ((size_t)c->m.n_classes * 4 + 8);
    tw_dtype widest_dtype = wi->dtype;
    size_t dsize = tw_dtype_size(widest_dtype);
    for (int i = 0; i < p->input.n_paths; i++)
        if (tw_dtype_size(c->infos[i].info.dtype) > dsize) {
            dsize = tw_dtype_size(c->infos[i].info.dtype);
            widest_dtype = c->infos[i].info.dtype;
        }
    tw_budget_in bin = {
        .total = p->runtime.memory,
        .base = base,
        .weights = c->net->weight_bytes,
        .backend = &c->be,
        .net = c->net,
        .precision = p->runtime.precision,
        .tile = c->m.tile,
        .stride = c->m.stride,
        .bands = c->m.in_bands,
        .dtype = widest_dtype,
        .n_classes = c->m.n_classes,
        .feat_dim = c->m.feat_dim,
        .want_emb = (p->output.products & TW_PRODUCT_EMB) != 0,
        .fixed_batch = p->tiling.batch,
        .max_auto_batch = strcmp(c->be.i->name, "cpu") == 0 ? 64 : 256,
        .raster_w = wi->width,
        .block_w = wi->block_w,
        .block_h = wi->block_h,
        .strip = strip,
        .vrt = strcmp(wi->driver, "VRT") == 0,
    };
    return tw_budget_plan(&bin, &c->bud, err);
}

tw_status tw_run(const tw_run_params *p, const tw_run_hooks *hooks, tw_run_result **result,
                 tw_error *err)
{
    double t0 = now_s();
    run_ctx *c = tw_calloc(TW_MEM_OTHER, 1, sizeof *c);
    tw_run_result *r = tw_calloc(TW_MEM_OTHER, 1, sizeof *r);
    if (result) *result = r;
    if (!c || !r) {
        tw_free(c);
        if (!result) tw_free(r);
        return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    c->p = p;
    c->hooks = hooks;
    tw_status st = prepare(c, p, p->quiet, err);
    if (st == TW_OK) {
        r->model = c->m;
        snprintf(r->backend, sizeof r->backend, "%s", c->be.i->name);
        tw_report_config_json(p, &c->m, c->config_json, sizeof c->config_json);
        int batch = c->bud.batch;
        st = c->be.i->reserve(c->be.ctx, c->net, c->m.tile, &batch, p->runtime.precision, err);
        if (st == TW_OK && batch < c->bud.batch) {
            c->bud.batch = batch; /* the backend halved it: fewer tiles per slot */
            c->bud.ref_capacity = batch + 256;
        }
        GDALSetCacheMax64((GIntBig)c->bud.gdal_cache);
        r->budget = c->bud;
    }
    if (st == TW_OK) st = make_dirs(p->output.dir, err);
    if (st == TW_OK) {
        r->inputs = tw_calloc(TW_MEM_OTHER, (size_t)p->input.n_paths, sizeof(tw_input_result));
        if (!r->inputs) st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; st == TW_OK && i < p->input.n_paths; i++) {
        r->n_inputs = i + 1;
        st = run_one(c, i, &r->inputs[i], err);
        r->tiles_classified += r->inputs[i].tiles_classified;
    }
    if (c->have_be && c->be.i->get_stats) c->be.i->get_stats(c->be.ctx, &r->backend_stats);
    ctx_release(c);
    tw_free(c);
    r->seconds = now_s() - t0;
    r->peak_rss = tw_rss_peak();
    if (!result) tw_run_result_destroy(r);
    return st;
}

void tw_run_result_destroy(tw_run_result *r)
{
    if (!r) return;
    tw_free(r->inputs);
    tw_free(r);
}

tw_status tw_validate(const tw_run_params *p, FILE *out, tw_error *err)
{
    run_ctx *c = tw_calloc(TW_MEM_OTHER, 1, sizeof *c);
    if (!c) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    c->p = p;
    tw_status st = prepare(c, p, true, err);
    if (st == TW_OK) {
        char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], b7[32];
        const tw_budget *b = &c->bud;
        fprintf(out, "model     %s: %s, %d bands, %d classes, %d features (sha256 %.12s)\n",
                p->model.weights, c->m.arch, c->m.in_bands, c->m.n_classes, c->m.feat_dim,
                c->m.model_sha256);
        fprintf(out, "backend   %s, precision %s\n", c->be.i->name,
                (const char *[]){"fp32", "tf32", "fp16", "bf16", "int8"}[p->runtime.precision]);
        for (int i = 0; i < p->input.n_paths; i++) {
            const tw_raster_info *info = &c->infos[i].info;
            tw_plan plan;
            st = tw_plan_make(info->width, info->height, c->m.tile, c->m.stride, p->tiling.edge,
                              p->shard_index, p->shard_count, &plan, err);
            if (st != TW_OK) break;
            fprintf(out,
                    "input     %s: %d x %d, %d bands %s; tiles %d x %d = %lld (tile %d, stride "
                    "%d); output grid %d x %d\n",
                    p->input.paths[i], info->width, info->height, c->infos[i].bands,
                    tw_dtype_name(info->dtype), plan.x.n_pos, plan.ty_end - plan.ty_begin,
                    (long long)plan.n_tiles, plan.tile, plan.stride, plan.grid_w,
                    plan.row_end - plan.row_begin);
        }
        if (st == TW_OK) {
            fprintf(out, "batch     %d tiles, %d slots of %s\n", b->batch, b->n_slots,
                    tw_format_bytes(b->slot_bytes, b1, sizeof b1));
            char b8[32];
            fprintf(out,
                    "memory    estimate %s of %s: base %s, weights %s, slots %s, workspace %s, "
                    "strip %s, GDAL cache %s\n",
                    tw_format_bytes(b->estimate, b2, sizeof b2),
                    tw_format_bytes(p->runtime.memory, b3, sizeof b3),
                    tw_format_bytes(b->base, b4, sizeof b4),
                    tw_format_bytes(b->weights, b5, sizeof b5),
                    tw_format_bytes(b->slots, b6, sizeof b6),
                    tw_format_bytes(b->workspace, b7, sizeof b7),
                    tw_format_bytes(b->strip, b1, sizeof b1),
                    tw_format_bytes(b->gdal_cache_expected, b8, sizeof b8));
            fprintf(out, "          worst case %s (GDAL cache limit %s)\n",
                    tw_format_bytes(b->total, b1, sizeof b1),
                    tw_format_bytes(b->gdal_cache, b2, sizeof b2));
            fprintf(out, "ok\n");
        }
    }
    ctx_release(c);
    tw_free(c);
    return st;
}
