/* stages.c - see stages.h. The driver: the slot pool, int8's calibration
 * sample, batch claims, and the threads that run the stages (the stages
 * themselves are in stage_read.c, stage_infer.c and stage_write.c; see
 * stages_internal.h). */
#include "pipeline/engine/stages.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "io/input/tiff_direct.h"
#include "core/clock.h"
#include "model/calib.h"
#include "pipeline/engine/normalize.h"
#include "pipeline/engine/stages_internal.h"

/* Open the input with the nodata value the workflow asks for. */
tw_status pipe_open_input(const tw_pipe *pp, tw_raster **r, tw_error *err)
{
    tw_raster_open_params op = {.tiff_direct = pp->p->input.tiff_direct,
                                .shared_tiles = pp->tiles,
                                .stop = pp->hooks ? pp->hooks->stop : NULL};
    tw_status st = tw_raster_open_ex(pp->path, pp->m->bands, pp->m->n_bands, &op, r, err);
    if (st != TW_OK) return st;
    const tw_raster_info *now = tw_raster_get_info(*r), *was = pp->info;
    if (was && (now->width != was->width || now->height != was->height ||
                now->dtype != was->dtype || tw_raster_selected_bands(*r) != pp->norm.bands)) {
        st = tw_error_set(err, TW_ERR_PARTS,
                          "%s: the input changed after the run began (raster[%s]: %dx%d %s x%d "
                          "now, %dx%d %s x%d when the run began); nothing more of it was read: "
                          "run the same command again to classify it as it is now",
                          pp->display, pp->display, now->width, now->height,
                          tw_dtype_name(now->dtype), tw_raster_selected_bands(*r), was->width,
                          was->height, tw_dtype_name(was->dtype), pp->norm.bands);
        tw_raster_close(*r);
        *r = NULL;
        return st;
    }
    tw_raster_set_nodata_rule(*r, pp->p->input.nodata_auto, pp->p->input.nodata);
    return TW_OK;
}

/* ---- the slot pool ------------------------------------------------------- */

void tw_pipe_slots_free(tw_pipe *pp)
{
    if (!pp->slots) return;
    for (int i = 0; i < pp->n_slots; i++) {
        tw_slot *s = &pp->slots[i];
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

tw_status tw_pipe_slots_alloc(tw_pipe *pp, int tile, tw_error *err)
{
    const tw_budget *b = pp->bud;
    size_t px = (size_t)tile * (size_t)tile;
    size_t nb = (size_t)b->batch;
    size_t raw_bytes = nb * pipe_raw_tile_bytes(pp, tile);
    pp->n_slots = b->n_slots;
    pp->slots = tw_calloc(TW_MEM_SLOTS, (size_t)pp->n_slots, sizeof(tw_slot));
    if (!pp->slots) goto nomem;
    for (int i = 0; i < pp->n_slots; i++) {
        tw_slot *s = &pp->slots[i];
        /* Readers cut tiles straight into the backend's (pinned) memory:
         * no host copy between the read and the device transfer. */
        if (pp->be->i->host_alloc) {
            s->raw = pp->be->i->host_alloc(pp->be->ctx, raw_bytes);
            s->raw_backend = s->raw != NULL;
        }
        if (!s->raw) s->raw = tw_alloc(TW_MEM_SLOTS, raw_bytes);
        s->refs = tw_calloc(TW_MEM_SLOTS, nb, sizeof(tw_tile_ref));
        s->valid = tw_alloc(TW_MEM_SLOTS, nb * px);
        if (!pp->wants_raw)
            s->x = tw_alloc(TW_MEM_SLOTS, nb * (size_t)pp->norm.bands * px * sizeof(float));
        /* per tile, or per pixel (a segmentation model: [batch][classes][T][T]) */
        size_t per = pp->m->segmentation ? (size_t)tile * (size_t)tile : 1;
        s->probs = tw_alloc(TW_MEM_SLOTS, nb * (size_t)pp->m->n_classes * per * sizeof(float));
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

/* ---- int8 calibration ------------------------------------------------------ */

/* Does the reserved backend compute in int8? (Not when runtime.precision
 * int8 fell back to fp32: no sample tiles are read then.) */
static bool backend_runs_int8(const tw_backend *be)
{
    if (!be->i->calibrate || !be->i->get_stats) return false;
    tw_backend_stats st;
    be->i->get_stats(be->ctx, &st);
    return st.precision == TW_PREC_INT8;
}

/* TW_CALIB_TILES tiles (fewer on a smaller raster) spread evenly over the
 * whole raster - not the shard's rows, nor what a resumed run has left, nor
 * as many as the batch the budget chose - so that every shard and every
 * rerun of a raster computes with the same ranges, and the ranges see the
 * whole scene rather than its first rows. Tiles that cannot be read or are
 * mostly nodata are left out; with none left the backend calibrates on its
 * first batch instead. The sample has buffers of its own (the slots hold a
 * batch), freed before the first tile is read. */
tw_status tw_pipe_calibrate(tw_pipe *pp, const tw_raster_info *info, tw_error *err)
{
    if (!backend_runs_int8(pp->be)) return TW_OK;
    const tw_run_params *p = pp->p;
    tw_plan full;
    tw_status st = tw_plan_make_cell(info->width, info->height, pp->m->tile, pp->m->stride,
                                     pp->m->cell, p->tiling.edge, 0, 1, &full, err);
    if (st != TW_OK) return st;
    const int T = full.tile;
    const size_t px = (size_t)T * T;
    const size_t raw_tile = pipe_raw_tile_bytes(pp, T);
    int64_t n_pos = (int64_t)full.x.n_pos * full.y.n_pos;
    int want = n_pos < TW_CALIB_TILES ? (int)n_pos : TW_CALIB_TILES;
    char *raw = tw_alloc(TW_MEM_OTHER, (size_t)want * raw_tile);
    uint8_t *valid = tw_alloc(TW_MEM_OTHER, (size_t)want * px);
    float *x = pp->wants_raw
                   ? NULL
                   : tw_alloc(TW_MEM_OTHER, (size_t)want * px * pp->m->in_bands * sizeof(float));
    tw_raster *r = NULL;
    if (!raw || !valid || (!pp->wants_raw && !x)) {
        st = tw_error_set(err, TW_ERR_NOMEM, "out of memory for int8's calibration sample");
        goto out;
    }
    if ((st = pipe_open_input(pp, &r, err)) != TW_OK) goto out;
    int n = 0;
    for (int i = 0; i < want; i++) {
        int64_t idx = (2 * (int64_t)i + 1) * n_pos / (2 * (int64_t)want); /* cell centres */
        int x0 = tw_axis_pos(&full.x, T, full.stride, (int)(idx % full.x.n_pos));
        int y0 = tw_axis_pos(&full.y, T, full.stride, (int)(idx / full.x.n_pos));
        int64_t n_nodata = 0, n_inside = 0;
        tw_error rerr;
        tw_error_init(&rerr);
        if (tw_raster_read(r, x0, y0, T, T, raw + (size_t)n * raw_tile, valid + (size_t)n * px,
                           &n_nodata, &n_inside, &rerr) == TW_OK &&
            pipe_tile_classified(pp, n_nodata, n_inside))
            n++;
    }
    tw_raster_close(r);
    if (n == 0) {
        tw_log_printf(pp->log, TW_LOG_NOTICE,
                      "int8: no tile of %s could be sampled; activation ranges are measured on "
                      "the first batch",
                      pp->display);
        goto out;
    }
    if (!pp->wants_raw) tw_normalize(raw, pp->dtype, valid, n, T, T, &pp->norm, 0, x);
    tw_infer_batch b = {.n = n,
                        .tile = T,
                        .x = x,
                        .raw = raw,
                        .raw_type = pp->dtype,
                        .valid = valid,
                        .norm = &pp->norm};
    st = pp->be->i->calibrate(pp->be->ctx, &b, pp->display, err);
    if (st == TW_OK)
        tw_log_printf(pp->log, TW_LOG_NOTICE,
                      "int8: activation ranges calibrated on %d tiles spread over %s", n,
                      pp->display);
out:
    tw_free(raw);
    tw_free(valid);
    tw_free(x);
    return st;
}

/* ---- claiming batches ------------------------------------------------------- */

/* Segment holding tile number t (segments are in order of `first`). */
static int seg_of(const tw_pipe *pp, int64_t t)
{
    int lo = 0, hi = pp->n_segs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (pp->segs[mid].first <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Where tile number t is: its segment, tile row and column. */
void pipe_locate(const tw_pipe *pp, int64_t t, int *si, int *ty, int *tx)
{
    *si = seg_of(pp, t);
    const tw_plan *pl = &pp->segs[*si].plan;
    int64_t off = t - pp->segs[*si].first + pp->segs[*si].skip;
    *ty = pl->ty_begin + (int)(off / pl->x.n_pos);
    *tx = (int)(off % pl->x.n_pos);
}

/* The next batch: up to `batch` tiles from next_tile on. A stop request
 * (SIGTERM, ...) ends the claims at once (stages.h, "Stopping"). false: no
 * more batches. */
bool pipe_claim_batch(tw_pipe *pp, batch_claim *c)
{
    pthread_mutex_lock(&pp->mu);
    const int B = pp->bud->batch;
    int64_t t = pp->next_tile;
    int n = 0;
    if (!pp->claims_done && pipe_stop_requested(pp)) pp->claims_done = true;
    while (!pp->claims_done && n < B && t + n < pp->n_tiles) {
        int si, ty, tx;
        pipe_locate(pp, t + n, &si, &ty, &tx);
        const tw_plan *pl = &pp->segs[si].plan;
        int left = pl->x.n_pos - tx; /* tiles left in this tile row */
        int take = B - n < left ? B - n : left;
        if (t + n + take > pp->n_tiles) take = (int)(pp->n_tiles - t - n);
        n += take;
    }
    bool ok = n > 0;
    if (ok) {
        c->seq = pp->next_seq++;
        c->first = t;
        c->n = n;
        pp->next_tile = t + n;
    } else {
        pp->claims_done = true;
    }
    pthread_mutex_unlock(&pp->mu);
    return ok;
}

/* ---- the driver ---------------------------------------------------------------- */

static const stage_def *const k_stages[TW_STAGE_COUNT] = {
    [TW_STAGE_READ] = &pipe_stage_read,
    [TW_STAGE_NORMALIZE] = &pipe_stage_normalize,
    [TW_STAGE_INFER] = &pipe_stage_infer,
    [TW_STAGE_WRITE] = &pipe_stage_write,
};

typedef struct thread_arg {
    worker w;
    const stage_def *def;
    tw_queue *in, *out;
    bool out_ordered;
    atomic_int *left; /* workers of this stage still running */
} thread_arg;

static bool pass_on(thread_arg *a, tw_slot *s)
{
    return a->out_ordered ? tw_queue_push_seq(a->out, s, s->seq, &a->w.wait_s)
                          : tw_queue_push(a->out, s, &a->w.wait_s);
}

uint64_t tw_pipe_alloc_count(const tw_pipe *pp)
{
    return pp->scope ? tw_mem_scope_alloc_count(pp->scope) : tw_mem_alloc_count();
}

static void *worker_main(void *arg)
{
    thread_arg *a = arg;
    worker *w = &a->w;
    tw_pipe *pp = w->pp;
    tw_mem_scope *outer = tw_mem_scope_enter(pp->scope);
    w->t_start = tw_clock_now();
    double cpu0 = tw_clock_thread_cpu();
    tw_status st = a->def->start ? a->def->start(w) : TW_OK;
    if (st != TW_OK) pipe_abort(pp);
    tw_slot *s;
    bool drained = st == TW_OK;
    w->in = a->in;
    while (st == TW_OK && (s = tw_queue_pop(a->in, &w->wait_s)) != NULL) {
        tw_slot *out[2] = {s, NULL};
        work_result r = pipe_aborted(pp) ? W_FAIL : a->def->work(w, s, out);
        if (r == W_END) {
            tw_queue_push(pp->q_free, s, NULL); /* never full: it holds every slot */
            drained = false;
            break;
        }
        if (r == W_FAIL || (out[0] && !pass_on(a, out[0])) || (out[1] && !pass_on(a, out[1]))) {
            drained = false;
            break;
        }
    }
    if (drained && !pipe_aborted(pp) && a->def->drain) {
        tw_slot *out = a->def->drain(w);
        if (out) (void)pass_on(a, out);
    }
    /* the last worker of a stage closes its output: the next stage drains it */
    bool last = atomic_fetch_sub(a->left, 1) == 1;
    if (last && a->out != pp->q_free) tw_queue_close(a->out);
    if (a->def->stop) (void)a->def->stop(w);
    double busy = tw_clock_now() - w->t_start - w->wait_s, cpu = tw_clock_thread_cpu() - cpu0;
    pthread_mutex_lock(&pp->mu);
    tw_stage_stats *ss = &pp->res->stage[a->def->id];
    ss->busy_s += busy;
    ss->cpu_s += cpu;
    ss->wait_s += w->wait_s;
    if (a->def->id == TW_STAGE_READ) pp->res->read_bytes += w->bytes_read;
    pthread_mutex_unlock(&pp->mu);
    tw_mem_scope_enter(outer);
    return NULL;
}

/* A checkpoint of an earlier run resumes the segment that starts at its
 * row (the rows above it are committed), at its tile: the tiles before are
 * skipped. One that fits no segment is ignored: its rows are redone. */
static void resume_checkpoint(tw_pipe *pp)
{
    pp->state_seg = -1;
    bool have = pp->parts && tw_parts_state_get(pp->parts, &pp->state);
    const tw_parts_state ps = pp->state;
    for (int i = 0; have && i < pp->n_segs; i++) {
        tw_segment *sg = &pp->segs[i];
        const tw_plan *pl = &sg->plan;
        int64_t off = (int64_t)(ps.ty - pl->ty_begin) * pl->x.n_pos + ps.tx;
        sg->skip = 0;
        if (pl->row_begin == ps.r0 && pl->row_end == ps.row_end && pl->k == ps.k &&
            ps.ty >= pl->ty_begin && ps.tx < pl->x.n_pos && off > 0 && off < pl->n_tiles) {
            sg->skip = off;
            pp->state_seg = i;
        }
    }
    pp->n_tiles = 0;
    for (int i = 0; i < pp->n_segs; i++) {
        pp->segs[i].first = pp->n_tiles;
        pp->n_tiles += pp->segs[i].plan.n_tiles - pp->segs[i].skip;
    }
    if (pp->res) pp->res->tiles_total = pp->n_tiles;
}

tw_status tw_pipe_run(tw_pipe *pp, bool *interrupted)
{
    *interrupted = false;
    tw_error *err = pp->err;
    atomic_store(&pp->abort, 0);
    atomic_store(&pp->cancelled, 0);
    pp->next_tile = pp->next_seq = 0;
    pp->claims_done = false;
    pp->tiles_done = 0;
    pp->cur_seg = -1;
    pp->written_end = 0;
    pp->write_halted = false;
    pp->checkpoint_end = -1;
    pp->checkpoint_cost = 0;
    pp->t_commit = tw_clock_now();
    resume_checkpoint(pp);
    const int readers = pp->bud->readers > 0 ? pp->bud->readers : 1;
    pp->res->read_workers = readers;
    pp->res->tiff_tiles_decoded = -1;

    tw_status st = TW_OK;
    pp->q_free = tw_queue_create(pp->n_slots);
    pp->q_norm = tw_queue_create(pp->n_slots);
    pp->q_infer = tw_queue_create(pp->n_slots);
    pp->q_write = tw_queue_create_ordered(pp->n_slots);
    /* one cache of decoded tiles for all readers (a file read through
     * libtiff), in place of one each: GDAL's block cache share, which
     * the budget already counts per reader */
    pp->tiles = tw_tiff_cache_create(pp->bud->gdal_cache, readers);
    const int n_threads = readers + TW_STAGE_COUNT - 1;
    thread_arg *args = tw_calloc(TW_MEM_OTHER, (size_t)n_threads, sizeof *args);
    pthread_t *th = tw_calloc(TW_MEM_OTHER, (size_t)n_threads, sizeof *th);
    if (!pp->q_free || !pp->q_norm || !pp->q_infer || !pp->q_write || !pp->tiles || !args || !th)
        st = tw_error_set(err, TW_ERR_NOMEM, "cannot allocate the stage queues");
    if (st == TW_OK && pthread_mutex_init(&pp->mu, NULL) != 0)
        st = tw_error_set(err, TW_ERR_NOMEM, "cannot create a mutex");
    if (st != TW_OK) goto out;

    for (int i = 0; i < pp->n_slots; i++) tw_queue_push(pp->q_free, &pp->slots[i], NULL);
    atomic_int left[TW_STAGE_COUNT];
    tw_queue *in[TW_STAGE_COUNT] = {pp->q_free, pp->q_norm, pp->q_infer, pp->q_write};
    tw_queue *out[TW_STAGE_COUNT] = {pp->q_norm, pp->q_infer, pp->q_write, pp->q_free};
    int t = 0, infer_arg = -1;
    for (int sid = 0; sid < TW_STAGE_COUNT; sid++) {
        int n = sid == TW_STAGE_READ ? readers : 1;
        atomic_init(&left[sid], n);
        if (sid == TW_STAGE_INFER) infer_arg = t; /* its one worker */
        for (int k = 0; k < n; k++, t++)
            args[t] = (thread_arg){.w = {.pp = pp, .index = k},
                                   .def = k_stages[sid],
                                   .in = in[sid],
                                   .out = out[sid],
                                   .out_ordered = out[sid] == pp->q_write,
                                   .left = &left[sid]};
    }
    /* The infer stage runs on this thread, the one that reserved the
     * backend: the CPU backend's OpenMP team is then the one its reserve
     * started, and the process has a single team (a second one, idle, would
     * count against the cores: see tw_run_normalize_threads). */
    int started = 0;
    for (; started < n_threads; started++) {
        if (started == infer_arg) continue;
        if (pthread_create(&th[started], NULL, worker_main, &args[started]) != 0) {
            st = tw_error_set(err, TW_ERR_NOMEM, "cannot start a stage thread");
            pipe_abort(pp);
            break;
        }
    }
    if (started == n_threads) worker_main(&args[infer_arg]);
    for (int i = 0; i < started; i++)
        if (i != infer_arg) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&pp->mu);
    if (st == TW_OK) {
        if (atomic_load(&pp->cancelled) ||
            (!atomic_load(&pp->abort) && pp->written_end < pp->n_tiles))
            *interrupted = true;
        else if (atomic_load(&pp->abort))
            st = err->status != TW_OK ? err->status
                                      : tw_error_set(err, TW_ERR_INTERNAL, "pipeline stopped");
    }
out:
    tw_free(args);
    tw_free(th);
    tw_queue_destroy(pp->q_free);
    tw_queue_destroy(pp->q_norm);
    tw_queue_destroy(pp->q_infer);
    tw_queue_destroy(pp->q_write);
    pp->q_free = pp->q_norm = pp->q_infer = pp->q_write = NULL;
    tw_tiff_cache_destroy(pp->tiles);
    pp->tiles = NULL;
    return st;
}
