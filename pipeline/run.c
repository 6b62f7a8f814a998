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
#include "pipeline/fileio.h"
#include "pipeline/normalize.h"
#include "pipeline/parts.h"
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
        return tw_error_set(
            err, TW_ERR_MODEL, "%s expects %d input bands (conv1.weight) but %s selects %d", wpath,
            net->in_bands, p->input.n_bands > 0 ? "input.bands" : "the bundle's band list",
            m->n_bands);

    m->scale = !isnan(p->input.scale) ? p->input.scale
                                      : (!isnan(mf->scale) && mf->scale > 0 ? mf->scale : 1.0);

    m->n_norm = net->in_bands;
    int n_mean = p->model.n_mean > 0 ? p->model.n_mean : mf->n_mean;
    int n_std = p->model.n_std > 0 ? p->model.n_std : mf->n_std;
    const float *mean = p->model.n_mean > 0 ? p->model.mean : mf->mean;
    const float *std = p->model.n_std > 0 ? p->model.std : mf->std;
    if (n_mean > 0 && n_mean != net->in_bands)
        return tw_error_set(err, TW_ERR_CONFIG,
                            "model.mean has %d values but %s expects %d input bands", n_mean, wpath,
                            net->in_bands);
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
                            "tiling.tile %d is too small for a ResNet (32 pixels at least)",
                            m->tile);
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
        /* The plan's own message (e.g. smaller than a tile with edge: skip)
         * cannot name the raster: check each input here, where the path is known. */
        tw_plan plan;
        tw_error perr;
        tw_error_init(&perr);
        if (tw_plan_make(infos[i].info.width, infos[i].info.height, m->tile, m->stride,
                         p->tiling.edge, 0, 1, &plan, &perr) != TW_OK)
            return tw_error_set(err, perr.status, "%s: %s", p->input.paths[i], perr.msg);
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
    tw_error e;
    tw_error_init(&e);
    if (tw_mkdir_p(dir, &e) != TW_OK) return tw_error_set(err, e.status, "output.dir: %s", e.msg);
    if (access(dir, W_OK) != 0)
        return tw_error_set(err, TW_ERR_OUTPUT, "output.dir: %s is not writable: %s", dir,
                            strerror(errno));
    return TW_OK;
}

/* ------------------------------------------------------------------------ */
/* Batch slots and the stage workers.                                        */

typedef struct tile_ref {
    int32_t tx, ty;
    int32_t seg;  /* index of the row segment the tile was read for */
    int32_t kept; /* index into the slot's kept tiles, -1: not classified */
    uint8_t read_error;
} tile_ref;

typedef struct slot {
    int n_refs, n_kept;
    tile_ref *refs;       /* [ref_capacity] */
    void *raw;            /* [batch][bands][T][T] raw type */
    bool raw_backend;     /* raw came from the backend's host_alloc (pinned) */
    uint8_t *valid;       /* [batch][T][T] */
    float *x;             /* [batch][bands][T][T], NULL when the backend normalizes */
    float *probs;         /* [batch][classes] */
    float *emb;           /* [batch][feat] or NULL */
    int32_t *orow, *ocol; /* [batch] tile origins, for the tile table */
} slot;

/* A band of output rows still to do (rows not committed by an earlier run):
 * the reader runs the tile rows touching it, the stitcher averages them. */
typedef struct segment {
    tw_plan plan; /* restricted to the segment's rows */
} segment;

typedef struct run_pipe {
    const tw_run_params *p;
    const tw_resolved *m;
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
    segment *segs;
    int n_segs;
    int chunk_rows;
    int64_t n_tiles; /* over all segments */
    tw_queue *q_free, *q_norm, *q_infer, *q_write;
    atomic_int abort; /* an error or a cancel: every stage stops */
    atomic_int cancelled;
    atomic_int stop_row; /* on a stop request: rows up to here are finished */
    tw_error *err;
    tw_stitch *stitch;
    tw_parts *parts;
    int cur_seg;
    tw_input_result *res;
    int64_t tiles_done;
    uint64_t allocs_mark;
    bool steady;
} run_pipe;

static void pipe_abort(run_pipe *pp)
{
    atomic_store(&pp->abort, 1);
    tw_queue_close(pp->q_free);
    tw_queue_close(pp->q_norm);
    tw_queue_close(pp->q_infer);
    tw_queue_close(pp->q_write);
}

/* The chunk of output rows holding `row`, inside segment seg: chunks lie on
 * a global grid of chunk_rows, cut by the segment's ends. */
static void chunk_of(const run_pipe *pp, const segment *seg, int row, int *r0, int *r1)
{
    int g0 = row / pp->chunk_rows * pp->chunk_rows;
    *r0 = g0 > seg->plan.row_begin ? g0 : seg->plan.row_begin;
    *r1 = g0 + pp->chunk_rows < seg->plan.row_end ? g0 + pp->chunk_rows : seg->plan.row_end;
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

static tw_status slots_alloc(run_pipe *pp, int tile, tw_error *err)
{
    const tw_budget *b = pp->bud;
    size_t px = (size_t)tile * (size_t)tile;
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
        if (!pp->wants_raw)
            s->x = tw_alloc(TW_MEM_SLOTS, nb * (size_t)pp->norm.bands * px * sizeof(float));
        s->probs = tw_alloc(TW_MEM_SLOTS, nb * (size_t)pp->m->n_classes * sizeof(float));
        if (pp->want_emb)
            s->emb = tw_alloc(TW_MEM_SLOTS, nb * (size_t)pp->m->feat_dim * sizeof(float));
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

static bool stop_requested(const run_pipe *pp)
{
    return pp->hooks && pp->hooks->stop && *pp->hooks->stop;
}

/* Open the input with the nodata value the workflow asks for. */
static tw_status open_input(const run_pipe *pp, tw_raster **r, tw_error *err)
{
    tw_status st = tw_raster_open(pp->path, pp->m->bands, pp->m->n_bands, r, err);
    if (st != TW_OK) return st;
    const tw_raster_info *info = tw_raster_get_info(*r);
    tw_raster_set_nodata(*r, !pp->p->input.nodata_auto || info->has_nodata,
                         pp->p->input.nodata_auto ? info->nodata : pp->p->input.nodata);
    return TW_OK;
}

/* Is a tile with n_nodata of its n_inside pixels (those inside the raster)
 * nodata classified, or nodata in every output? */
static bool tile_classified(const run_pipe *pp, int64_t n_nodata, int64_t n_inside)
{
    return n_inside > 0 && n_nodata < n_inside &&
           (double)n_nodata / (double)n_inside <= pp->p->tiling.max_nodata_fraction;
}

/* The one batch of tw_infer_batch for slot s (n tiles). */
static tw_infer_batch slot_batch(const run_pipe *pp, slot *s, int n, int tile)
{
    return (tw_infer_batch){
        .n = n,
        .tile = tile,
        .x = s->x,
        .raw = s->raw,
        .raw_type = pp->dtype,
        .valid = s->valid,
        .norm = &pp->norm,
        .probs = s->probs,
        .emb = s->emb,
    };
}

/* Does the reserved backend compute in int8, and so want its activation
 * ranges measured? (Not when runtime.precision int8 fell back to fp32 on a
 * CPU without int8 convolutions: no sample tiles are read then.) */
static bool backend_runs_int8(const tw_backend *be)
{
    if (!be->i->calibrate || !be->i->get_stats) return false;
    tw_backend_stats st;
    be->i->get_stats(be->ctx, &st);
    return st.precision == TW_PREC_INT8;
}

/* runtime.precision int8: the backend quantizes activations to ranges it
 * measures on real tiles. Give it one batch of tiles spread evenly over the
 * whole raster - not the shard's rows, nor what a resumed run has left - so
 * that every shard and every rerun of a raster computes with the same
 * ranges, and the ranges see the whole scene rather than its first rows.
 * Runs before the stages start, in slot 0. Tiles that cannot be read or
 * are mostly nodata are left out; with none left the backend calibrates on
 * its first batch instead. */
static tw_status calibrate_backend(run_pipe *pp, const tw_raster_info *info, tw_error *err)
{
    const tw_run_params *p = pp->p;
    tw_plan full;
    tw_status st = tw_plan_make(info->width, info->height, pp->m->tile, pp->m->stride,
                                p->tiling.edge, 0, 1, &full, err);
    if (st != TW_OK) return st;
    const int T = full.tile;
    const size_t px = (size_t)T * T;
    const size_t raw_tile = (size_t)pp->norm.bands * px * tw_dtype_size(pp->dtype);
    int64_t n_pos = (int64_t)full.x.n_pos * full.y.n_pos;
    int want = n_pos < pp->bud->batch ? (int)n_pos : pp->bud->batch;
    tw_raster *r = NULL;
    if ((st = open_input(pp, &r, err)) != TW_OK) return st;
    slot *s = &pp->slots[0];
    int n = 0;
    for (int i = 0; i < want; i++) {
        int64_t idx = (2 * (int64_t)i + 1) * n_pos / (2 * (int64_t)want); /* cell centres */
        int x0 = tw_axis_pos(&full.x, T, full.stride, (int)(idx % full.x.n_pos));
        int y0 = tw_axis_pos(&full.y, T, full.stride, (int)(idx / full.x.n_pos));
        int64_t n_nodata = 0, n_inside = 0;
        tw_error rerr;
        tw_error_init(&rerr);
        if (tw_raster_read(r, x0, y0, T, T, (char *)s->raw + (size_t)n * raw_tile,
                           s->valid + (size_t)n * px, &n_nodata, &n_inside, &rerr) == TW_OK &&
            tile_classified(pp, n_nodata, n_inside))
            n++;
    }
    tw_raster_close(r);
    if (n == 0) return TW_OK;
    if (!pp->wants_raw) tw_normalize(s->raw, pp->dtype, s->valid, n, T, T, &pp->norm, s->x);
    tw_infer_batch b = slot_batch(pp, s, n, T);
    return pp->be->i->calibrate(pp->be->ctx, &b, pp->path, err);
}

static void *reader_main(void *arg)
{
    run_pipe *pp = arg;
    tw_stage_stats *stats = &pp->res->stage[TW_STAGE_READ];
    double t_start = now_s();
    const int T = pp->segs[0].plan.tile;
    const size_t px = (size_t)T * T;
    const size_t raw_tile = (size_t)pp->norm.bands * px * tw_dtype_size(pp->dtype);
    int stop_row = -1;
    tw_raster *r = NULL;
    /* Each stage opens its own dataset: GDAL handles are not thread-safe. */
    if (open_input(pp, &r, pp->err) != TW_OK) {
        pipe_abort(pp);
        goto done;
    }
    snprintf(pp->res->reader, sizeof pp->res->reader, "%s", tw_raster_reader(r, NULL));
    slot *s = NULL;
    for (int si = 0; si < pp->n_segs && !atomic_load(&pp->abort); si++) {
        const tw_plan *pl = &pp->segs[si].plan;
        for (int ty = pl->ty_begin; ty < pl->ty_end && !atomic_load(&pp->abort); ty++) {
            int c0, c1;
            tw_axis_cells(&pl->y, T, pl->stride, ty, &c0, &c1);
            if (stop_row >= 0 && c0 >= stop_row) goto stopped;
            if (stop_row < 0 && stop_requested(pp)) {
                /* Finish the chunk under way, then stop: the tile rows that
                 * touch it are all that is still needed. */
                int r0, r1;
                chunk_of(pp, &pp->segs[si], c0 > pl->row_begin ? c0 : pl->row_begin, &r0, &r1);
                stop_row = r1;
                atomic_store(&pp->stop_row, stop_row);
                if (c0 >= stop_row) goto stopped;
            }
            int y0 = tw_axis_pos(&pl->y, T, pl->stride, ty);
            for (int tx = 0; tx < pl->x.n_pos; tx++) {
                if (!s) {
                    s = tw_queue_pop(pp->q_free, &stats->wait_s);
                    if (!s) goto done;
                    s->n_refs = s->n_kept = 0;
                }
                int x0 = tw_axis_pos(&pl->x, T, pl->stride, tx);
                tile_ref *ref = &s->refs[s->n_refs++];
                ref->tx = tx;
                ref->ty = ty;
                ref->seg = si;
                ref->kept = -1;
                ref->read_error = 0;
                int k = s->n_kept;
                int64_t n_nodata = 0, n_inside = 0;
                tw_error rerr;
                tw_error_init(&rerr);
                tw_status st =
                    tw_raster_read(r, x0, y0, T, T, (char *)s->raw + (size_t)k * raw_tile,
                                   s->valid + (size_t)k * px, &n_nodata, &n_inside, &rerr);
                if (st != TW_OK) {
                    if (pp->p->input.on_error != TW_ON_ERROR_SKIP) {
                        tw_error_set(pp->err, st, "%s", rerr.msg);
                        pipe_abort(pp);
                        goto done;
                    }
                    fprintf(stderr,
                            "tilewise: warning: %s: tile at pixel x=%d y=%d (tile row %d, col %d) "
                            "is unreadable and written as nodata: %s\n",
                            pp->path, x0, y0, ty, tx, rerr.msg);
                    ref->read_error = 1;
                } else if (tile_classified(pp, n_nodata, n_inside)) {
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
    }
stopped:
    if (s && s->n_refs > 0 && !atomic_load(&pp->abort))
        tw_queue_push(pp->q_norm, s, &stats->wait_s);
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
    const int T = pp->segs[0].plan.tile;
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
            tw_infer_batch b = slot_batch(pp, s, s->n_kept, pp->segs[0].plan.tile);
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

/* Rows finished by the stitcher go into the committed chunks. */
static tw_status parts_sink(void *user, int row0, int n, const float *probs, const uint8_t *has,
                            tw_error *err)
{
    run_pipe *pp = user;
    const segment *seg = &pp->segs[pp->cur_seg];
    const size_t W = (size_t)seg->plan.grid_w, C = (size_t)pp->m->n_classes;
    int row = seg->plan.row_begin + row0;
    while (n > 0) {
        if (tw_parts_chunk_end(pp->parts) < 0) {
            int r0, r1;
            chunk_of(pp, seg, row, &r0, &r1);
            tw_status st = tw_parts_chunk_begin(pp->parts, row, r1, err);
            if (st != TW_OK) return st;
        }
        int end = tw_parts_chunk_end(pp->parts);
        int m = end - row < n ? end - row : n;
        tw_status st = tw_parts_chunk_rows(pp->parts, row, m, probs, has, err);
        if (st == TW_OK && row + m == end) st = tw_parts_chunk_commit(pp->parts, err);
        if (st != TW_OK) return st;
        row += m;
        n -= m;
        probs += (size_t)m * W * C;
        has += (size_t)m * W;
    }
    return TW_OK;
}

/* Before tiles of tile row ty are added: finish the rows above it and make
 * sure the chunk holding its first row is open, so its tiles land there. */
static tw_status writer_begin_row(run_pipe *pp, const segment *seg, int ty, tw_error *err)
{
    tw_status st = tw_stitch_begin_row(pp->stitch, ty, err);
    if (st != TW_OK) return st;
    int c0, c1;
    tw_axis_cells(&seg->plan.y, seg->plan.tile, seg->plan.stride, ty, &c0, &c1);
    if (c0 >= seg->plan.row_begin && c0 < seg->plan.row_end && tw_parts_chunk_end(pp->parts) < 0) {
        int r0, r1;
        chunk_of(pp, seg, c0, &r0, &r1);
        st = tw_parts_chunk_begin(pp->parts, r0, r1, err);
    }
    return st;
}

static void *writer_main(void *arg)
{
    run_pipe *pp = arg;
    tw_stage_stats *stats = &pp->res->stage[TW_STAGE_WRITE];
    double t_start = now_s();
    const int C = pp->m->n_classes;
    const int F = pp->want_emb ? pp->m->feat_dim : 0;
    int cur_ty = -1;
    pp->cur_seg = -1;
    slot *s;
    while ((s = tw_queue_pop(pp->q_write, &stats->wait_s)) != NULL) {
        if (atomic_load(&pp->abort)) break;
        for (int i = 0; i < s->n_refs; i++) {
            const tile_ref *ref = &s->refs[i];
            if (ref->seg != pp->cur_seg) {
                if (pp->cur_seg >= 0 && tw_stitch_finish(pp->stitch, pp->err) != TW_OK) goto fail;
                pp->cur_seg = ref->seg;
                tw_stitch_reset(pp->stitch, &pp->segs[ref->seg].plan);
                cur_ty = -1;
            }
            const segment *seg = &pp->segs[pp->cur_seg];
            if (ref->ty != cur_ty) {
                if (writer_begin_row(pp, seg, ref->ty, pp->err) != TW_OK) goto fail;
                cur_ty = ref->ty;
            }
            if (ref->kept >= 0) {
                const float *pr = s->probs + (size_t)ref->kept * C;
                tw_stitch_add(pp->stitch, ref->tx, ref->ty, pr);
                pp->res->tiles_classified++;
                int c0, c1;
                tw_axis_cells(&seg->plan.y, seg->plan.tile, seg->plan.stride, ref->ty, &c0, &c1);
                /* A tile belongs to the chunk of its first row: recorded once,
                 * whatever the shards or reruns. */
                if (c0 >= seg->plan.row_begin && c0 < seg->plan.row_end &&
                    tw_parts_chunk_tiles(pp->parts, 1, &s->orow[ref->kept], &s->ocol[ref->kept], pr,
                                         F ? s->emb + (size_t)ref->kept * F : NULL,
                                         pp->err) != TW_OK)
                    goto fail;
            } else if (ref->read_error) {
                pp->res->tiles_read_errors++;
            } else {
                pp->res->tiles_nodata++;
            }
        }
        pp->tiles_done += s->n_refs;
        if (!pp->steady && tw_stitch_rows_done(pp->stitch) > 0) {
            pp->steady = true;
            pp->allocs_mark = tw_mem_alloc_count();
        }
        if (pp->hooks && pp->hooks->progress) {
            double f = pp->n_tiles > 0 ? (double)pp->tiles_done / (double)pp->n_tiles : 1.0;
            if (pp->hooks->tiles)
                pp->hooks->tiles(pp->tiles_done, pp->n_tiles, pp->path, pp->hooks->progress_user);
            if (!pp->hooks->progress(f > 1.0 ? 1.0 : f, pp->path, pp->hooks->progress_user) &&
                !stop_requested(pp)) {
                atomic_store(&pp->cancelled, 1);
                pipe_abort(pp);
                break;
            }
        }
        if (!tw_queue_push(pp->q_free, s, &stats->wait_s)) break;
    }
    if (!atomic_load(&pp->abort) && pp->cur_seg >= 0) {
        int stop_row = atomic_load(&pp->stop_row);
        tw_status st = stop_row >= 0 ? tw_stitch_flush_until(pp->stitch, stop_row, pp->err)
                                     : tw_stitch_finish(pp->stitch, pp->err);
        if (st != TW_OK) goto fail;
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
    gt[0] = g[0];
    gt[1] = g[1] * S;
    gt[2] = g[2] * S;
    gt[3] = g[3];
    gt[4] = g[4] * S;
    gt[5] = g[5] * S;
}

/* Whether chunks keep per-tile records: the tile table and the GeoPackage
 * are both made from them. */
static bool keeps_tiles(unsigned products)
{
    return (products & (TW_PRODUCT_TILES | TW_PRODUCT_EMB | TW_PRODUCT_TILES_GPKG)) != 0;
}

/* What the outputs of an input depend on: if any of it changes between an
 * interrupted run and its rerun, the committed chunks are not reused. */
static void fingerprint(const run_ctx *c, const tw_raster_info *info, const char *path,
                        const tw_plan *plan, char *buf, size_t size)
{
    const tw_run_params *p = c->p;
    const tw_resolved *m = &c->m;
    int n = snprintf(buf, size,
                     "tilewise-parts 1\ninput %s %dx%d %s\nmodel %s\ntile %d stride %d edge %d "
                     "grid %dx%d\nscale %.17g nodata %d %.17g max_nodata %.17g\nprecision %d "
                     "emb %d tiles %d\nbands",
                     path, info->width, info->height, tw_dtype_name(info->dtype), m->model_sha256,
                     m->tile, m->stride, (int)p->tiling.edge, plan->grid_w, plan->grid_h, m->scale,
                     (int)p->input.nodata_auto, p->input.nodata, p->tiling.max_nodata_fraction,
                     (int)p->runtime.precision, (p->output.products & TW_PRODUCT_EMB) != 0,
                     keeps_tiles(p->output.products));
    for (int i = 0; i < m->n_bands && n > 0 && (size_t)n < size; i++)
        n += snprintf(buf + n, size - (size_t)n, " %d", m->bands[i]);
    for (int i = 0; i < m->n_norm && n > 0 && (size_t)n < size; i++)
        n += snprintf(buf + n, size - (size_t)n, "\nnorm %.9g %.9g", m->mean[i], m->std[i]);
    if (n > 0 && (size_t)n < size) snprintf(buf + n, size - (size_t)n, "\n");
}

/* Rows per committed chunk: about 1024 tiles, at least one tile row's cells,
 * so that finishing the chunk under way after a stop request takes seconds. */
static int chunk_rows_for(const tw_plan *plan)
{
    int per_row = plan->x.n_pos > 0 ? plan->x.n_pos : 1;
    int rows = 1024 / per_row * plan->k;
    if (rows < plan->k) rows = plan->k;
    return rows;
}

static void writer_params_for(const run_ctx *c, const tw_raster_info *info, const tw_plan *plan,
                              const char *stem, tw_writer_params *wp)
{
    const tw_run_params *p = c->p;
    memset(wp, 0, sizeof *wp);
    wp->dir = p->output.dir;
    wp->stem = stem;
    wp->grid_w = plan->grid_w;
    wp->grid_h = plan->grid_h;
    wp->crs_wkt = info->crs_wkt;
    wp->n_classes = c->m.n_classes;
    wp->class_names = (const char(*)[TW_NAME_MAX])c->m.classes;
    wp->products = p->output.products;
    wp->prob_type = p->output.prob_type;
    wp->format = p->output.format;
    wp->creation_options = (const char(*)[128])p->output.creation_options;
    wp->n_creation_options = p->output.n_creation_options;
    wp->metadata_json = c->config_json;
    output_geotransform(info, plan, wp->geotransform);
}

/* ------------------------------------------------------------------------ */
/* Assembly: committed chunks into the final products (run and merge).      */

#define MANIFEST_MAGIC "TWMANIF1"

typedef struct manifest {
    char magic[8];
    uint32_t size_params, size_resolved, size_info;
    tw_run_params p;
    tw_resolved m;
    tw_raster_info info;
    char config_json[16384];
    char fingerprint[8192];
} manifest;

static tw_status manifest_path(const char *out_dir, const char *stem, char *buf, size_t size,
                               tw_error *err)
{
    if (snprintf(buf, size, "%s/.tilewise/%s/manifest", out_dir, stem) >= (int)size)
        return tw_error_set(err, TW_ERR_OUTPUT, "output path too long: %s", out_dir);
    return TW_OK;
}

/* What `tilewise merge` needs to assemble without the workflow: written by
 * every shard (same content), atomically. */
/* What `tilewise merge` needs to assemble without the workflow: written by
 * every shard (same content), atomically. */
static tw_status manifest_write(const manifest *mf, const char *out_dir, const char *stem,
                                tw_error *err)
{
    char path[TW_PATH_MAX + 400];
    tw_status st = manifest_path(out_dir, stem, path, sizeof path, err);
    return st != TW_OK ? st : tw_write_file_atomic(path, mf, sizeof *mf, err);
}

static tw_status manifest_read(const char *out_dir, const char *stem, manifest *mf, tw_error *err)
{
    char path[TW_PATH_MAX + 400];
    tw_status st = manifest_path(out_dir, stem, path, sizeof path, err);
    if (st != TW_OK) return st;
    FILE *f = fopen(path, "rb");
    if (!f)
        return tw_error_set(err, TW_ERR_INPUT,
                            "%s: no run manifest (%s): was this input run by "
                            "this version of tilewise?",
                            stem, strerror(errno));
    bool ok = fread(mf, sizeof *mf, 1, f) == 1;
    fclose(f);
    if (!ok || memcmp(mf->magic, MANIFEST_MAGIC, 8) != 0 ||
        mf->size_params != sizeof(tw_run_params) || mf->size_resolved != sizeof(tw_resolved) ||
        mf->size_info != sizeof(tw_raster_info))
        return tw_error_set(err, TW_ERR_INPUT,
                            "%s is damaged or was written by another version of tilewise", path);
    mf->config_json[sizeof mf->config_json - 1] = '\0';
    mf->fingerprint[sizeof mf->fingerprint - 1] = '\0';
    return TW_OK;
}

static tw_status assemble(const tw_run_params *p, const tw_resolved *m, const tw_raster_info *info,
                          const char *config_json, tw_parts *parts, tw_input_result *res,
                          tw_error *err)
{
    tw_plan plan;
    tw_status st = tw_plan_make(info->width, info->height, m->tile, m->stride, p->tiling.edge, 0, 1,
                                &plan, err);
    if (st != TW_OK) return st;
    run_ctx tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.p = p;
    tmp.m = *m;
    snprintf(tmp.config_json, sizeof tmp.config_json, "%s", config_json);
    tw_writer_params wp;
    writer_params_for(&tmp, info, &plan, res->stem, &wp);
    bool rasters =
        (p->output.products & (TW_PRODUCT_CLASS | TW_PRODUCT_PROB | TW_PRODUCT_CONF)) != 0;
    bool table = (p->output.products & (TW_PRODUCT_TILES | TW_PRODUCT_EMB)) != 0;
    char tpath[TW_PATH_MAX + 300];
    snprintf(tpath, sizeof tpath, "%s/%s.tiles.h5", p->output.dir, res->stem);
    tw_tiletable_params tp = {
        .path = tpath,
        .n_classes = m->n_classes,
        .class_names = (const char(*)[TW_NAME_MAX])m->classes,
        .feat_dim = (p->output.products & TW_PRODUCT_EMB) ? m->feat_dim : 0,
        .tile = m->tile,
        .stride = m->stride,
        .crs_wkt = info->crs_wkt,
    };
    memcpy(tp.geotransform, info->geotransform, sizeof tp.geotransform);
    bool gpkg = (p->output.products & TW_PRODUCT_TILES_GPKG) != 0;
    char gpath[TW_PATH_MAX + 300];
    snprintf(gpath, sizeof gpath, "%s/%s.tiles.gpkg", p->output.dir, res->stem);
    tw_gpkg_params gp = {
        .path = gpath,
        .n_classes = m->n_classes,
        .class_names = (const char(*)[TW_NAME_MAX])m->classes,
        .tile = m->tile,
        .crs_wkt = info->crs_wkt,
    };
    memcpy(gp.geotransform, info->geotransform, sizeof gp.geotransform);
    memset(res->hist, 0, sizeof res->hist);
    res->nodata_cells = 0; /* assembly counts every cell again; the stitcher already did */
    st = tw_parts_assemble(parts, rasters ? &wp : NULL, table ? &tp : NULL, gpkg ? &gp : NULL,
                           res->hist, &res->nodata_cells, err);
    if (st == TW_OK) st = tw_parts_remove(parts, err);
    if (st != TW_OK) return st;
    res->n_outputs = 0;
    static const struct {
        unsigned bit;
        const char *name;
    } prods[] = {{TW_PRODUCT_CLASS, "class"}, {TW_PRODUCT_PROB, "prob"}, {TW_PRODUCT_CONF, "conf"}};
    for (int i = 0; i < 3; i++)
        if (p->output.products & prods[i].bit)
            tw_writer_product_path(p->output.dir, res->stem, prods[i].name,
                                   res->outputs[res->n_outputs++], sizeof res->outputs[0]);
    if (table) snprintf(res->outputs[res->n_outputs++], sizeof res->outputs[0], "%s", tpath);
    if (gpkg) snprintf(res->outputs[res->n_outputs++], sizeof res->outputs[0], "%s", gpath);
    return TW_OK;
}

static tw_status run_one(run_ctx *c, int idx, tw_input_result *res, tw_error *err)
{
    const tw_run_params *p = c->p;
    const tw_raster_info *info = &c->infos[idx].info;
    double t0 = now_s();
    snprintf(res->path, sizeof res->path, "%s", p->input.paths[idx]);
    input_stem(res->path, res->stem, sizeof res->stem);
    res->width = info->width;
    res->height = info->height;

    tw_plan plan;
    tw_status st = tw_plan_make(info->width, info->height, c->m.tile, c->m.stride, p->tiling.edge,
                                p->shard_index, p->shard_count, &plan, err);
    if (st != TW_OK) return st;
    res->grid_w = plan.grid_w;
    res->grid_h = plan.grid_h;
    bool want_table = keeps_tiles(p->output.products);

    run_pipe pp;
    memset(&pp, 0, sizeof pp);
    pp.p = p;
    pp.m = &c->m;
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
    pp.chunk_rows = p->chunk_rows > 0 ? p->chunk_rows : chunk_rows_for(&plan);
    atomic_store(&pp.stop_row, -1);

    char fp[8192];
    fingerprint(c, info, res->path, &plan, fp, sizeof fp);
    tw_parts_params parts_p = {
        .out_dir = p->output.dir,
        .stem = res->stem,
        .fingerprint = fp,
        .grid_w = plan.grid_w,
        .grid_h = plan.grid_h,
        .n_classes = c->m.n_classes,
        .feat_dim = pp.want_emb ? c->m.feat_dim : 0,
        .tiles = want_table,
        .shard_index = p->shard_index,
        .shard_count = p->shard_count,
    };
    st = tw_parts_open(&parts_p, p->quiet, &pp.parts, err);
    if (st == TW_OK) {
        manifest *mf = tw_calloc(TW_MEM_OTHER, 1, sizeof *mf);
        if (!mf) {
            st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
        } else {
            memcpy(mf->magic, MANIFEST_MAGIC, 8);
            mf->size_params = sizeof(tw_run_params);
            mf->size_resolved = sizeof(tw_resolved);
            mf->size_info = sizeof(tw_raster_info);
            mf->p = *p;
            mf->m = c->m;
            mf->info = *info;
            snprintf(mf->config_json, sizeof mf->config_json, "%s", c->config_json);
            snprintf(mf->fingerprint, sizeof mf->fingerprint, "%s", fp);
            st = manifest_write(mf, p->output.dir, res->stem, err);
            tw_free(mf);
        }
    }

    /* Segments: the shard's rows that no earlier run has committed. */
    if (st == TW_OK) {
        pp.segs =
            tw_calloc(TW_MEM_OTHER, (size_t)(plan.row_end - plan.row_begin) + 1, sizeof(segment));
        if (!pp.segs) st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    for (int r = plan.row_begin; st == TW_OK && r < plan.row_end;) {
        if (tw_parts_row_done(pp.parts, r)) {
            r++;
            continue;
        }
        int r1 = r;
        while (r1 < plan.row_end && !tw_parts_row_done(pp.parts, r1)) r1++;
        segment *sg = &pp.segs[pp.n_segs++];
        sg->plan = plan;
        tw_plan_restrict(&sg->plan, r, r1);
        pp.n_tiles += sg->plan.n_tiles;
        r = r1;
    }
    res->tiles_total = pp.n_tiles;
    res->rows_resumed = (plan.row_end - plan.row_begin);
    for (int i = 0; i < pp.n_segs; i++)
        res->rows_resumed -= pp.segs[i].plan.row_end - pp.segs[i].plan.row_begin;

    if (st == TW_OK && pp.n_segs > 0) {
        /* Progress 0 first, as GDAL does: the CLI starts its clock (tiles/s,
         * time left) here rather than after the first batch. */
        if (c->hooks && c->hooks->progress) {
            if (c->hooks->tiles) c->hooks->tiles(0, pp.n_tiles, res->path, c->hooks->progress_user);
            (void)c->hooks->progress(0.0, res->path, c->hooks->progress_user);
        }
        st = slots_alloc(&pp, plan.tile, err);
        if (st == TW_OK && backend_runs_int8(&c->be)) st = calibrate_backend(&pp, info, err);
        if (st == TW_OK)
            st = tw_stitch_create(&pp.segs[0].plan, c->m.n_classes, parts_sink, &pp, &pp.stitch,
                                  err);
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
            void *(*fn[TW_STAGE_COUNT])(void *) = {reader_main, normalize_main, infer_main,
                                                   writer_main};
            int started = 0;
            for (; started < TW_STAGE_COUNT; started++) {
                if (pthread_create(&th[started], NULL, fn[started], &pp) != 0) {
                    st = tw_error_set(err, TW_ERR_NOMEM, "cannot start a stage thread");
                    pipe_abort(&pp);
                    break;
                }
            }
            for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
            if (st == TW_OK) {
                if (atomic_load(&pp.cancelled) || atomic_load(&pp.stop_row) >= 0)
                    st = tw_error_set(err, TW_CANCELLED,
                                      "%s: interrupted after committing %d of %d output rows; "
                                      "run the same command again to finish",
                                      res->path, tw_parts_rows_done(pp.parts), plan.grid_h);
                else if (atomic_load(&pp.abort))
                    st = err->status != TW_OK
                             ? err->status
                             : tw_error_set(err, TW_ERR_INTERNAL, "pipeline stopped");
            }
        }
        if (st == TW_OK && pp.steady)
            res->steady_state_allocs = tw_mem_alloc_count() - pp.allocs_mark;
        if (pp.stitch) {
            int64_t nod = 0;
            const int64_t *h = tw_stitch_histogram(pp.stitch, &nod);
            memcpy(res->hist, h, sizeof(int64_t) * (size_t)c->m.n_classes);
            res->nodata_cells = nod;
        }
    }
    tw_stitch_destroy(pp.stitch);
    tw_queue_destroy(pp.q_free);
    tw_queue_destroy(pp.q_norm);
    tw_queue_destroy(pp.q_infer);
    tw_queue_destroy(pp.q_write);
    slots_free(&pp);
    tw_free(pp.segs);

    /* Whole grid committed (one run, or the last of the shards): assemble. */
    if (st == TW_OK && p->shard_count == 1)
        st = assemble(c->p, &c->m, info, c->config_json, pp.parts, res, err);
    tw_parts_close(pp.parts);
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
        .weights_consumed = c->be.i->consumes_weights(c->be.ctx, p->runtime.precision),
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
        .max_auto_batch = c->be.i->auto_batch(c->be.ctx, c->m.tile),
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
        /* An allocation that fails although the budget said it fits (the
         * machine has less free memory than runtime.memory): the backend
         * halves the batch itself, down to 1, and says so (backend.h). */
        int batch = c->bud.batch;
        st =
            c->be.i->reserve(c->be.ctx, c->net, c->m.tile, &batch, p->runtime.precision, true, err);
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

tw_status tw_resolve(const tw_run_params *p, tw_resolved *m, tw_error *err)
{
    tw_model_file *mf = NULL;
    tw_resnet *net = NULL;
    tw_status st = tw_model_file_load(p->model.weights, &mf, err);
    if (st == TW_OK) st = tw_resnet_create(mf, p->model.arch, &net, err);
    if (st == TW_OK) st = resolve_model(p, mf, net, m, err);
    tw_resnet_destroy(net);
    tw_model_file_destroy(mf);
    return st;
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

tw_status tw_merge(const char *out_dir, bool quiet, tw_run_result **result, tw_error *err)
{
    double t0 = now_s();
    tw_run_result *r = tw_calloc(TW_MEM_OTHER, 1, sizeof *r);
    char(*stems)[256] = tw_calloc(TW_MEM_OTHER, TW_MAX_INPUTS, 256);
    manifest *mf = tw_calloc(TW_MEM_OTHER, 1, sizeof *mf);
    if (result) *result = r;
    tw_status st = TW_OK;
    if (!r || !stems || !mf) st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    int n = st == TW_OK ? tw_parts_list(out_dir, stems, TW_MAX_INPUTS) : 0;
    if (st == TW_OK && n <= 0)
        st = tw_error_set(err, TW_ERR_INPUT,
                          "%s: no shard outputs to merge (no %s/.tilewise/ parts)", out_dir,
                          out_dir);
    if (st == TW_OK) {
        r->inputs = tw_calloc(TW_MEM_OTHER, (size_t)n, sizeof(tw_input_result));
        if (!r->inputs) st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; st == TW_OK && i < n; i++) {
        st = manifest_read(out_dir, stems[i], mf, err);
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
            input_stem(mf->p.input.paths[k], stem, sizeof stem);
            if (strcmp(stem, stems[i]) == 0)
                snprintf(res->path, sizeof res->path, "%s", mf->p.input.paths[k]);
        }
        snprintf(res->stem, sizeof res->stem, "%s", stems[i]);
        tw_plan plan;
        st = tw_plan_make(mf->info.width, mf->info.height, mf->m.tile, mf->m.stride,
                          mf->p.tiling.edge, 0, 1, &plan, err);
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
            .tiles = keeps_tiles(mf->p.output.products),
            .shard_index = 0,
            .shard_count = 1,
            .merge_only = true,
        };
        tw_parts *parts = NULL;
        st = tw_parts_open(&pp, quiet, &parts, err);
        if (st == TW_OK) st = assemble(&mf->p, &mf->m, &mf->info, mf->config_json, parts, res, err);
        tw_parts_close(parts);
    }
    tw_free(stems);
    tw_free(mf);
    if (r) {
        r->seconds = now_s() - t0;
        r->peak_rss = tw_rss_peak();
    }
    if (!result) tw_run_result_destroy(r);
    return st;
}
