/* stages.c - see stages.h */
#include "pipeline/engine/stages.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "io/input/tiff_direct.h"
#include "core/clock.h"
#include "model/calib.h"
#include "pipeline/engine/normalize.h"

static void pipe_abort(tw_pipe *pp)
{
    atomic_store(&pp->abort, 1);
    tw_queue_close(pp->q_free);
    tw_queue_close(pp->q_norm);
    tw_queue_close(pp->q_infer);
    tw_queue_close(pp->q_write);
}

static bool aborted(tw_pipe *pp)
{
    return atomic_load(&pp->abort) != 0;
}

static bool stop_requested(const tw_pipe *pp)
{
    return pp->hooks && pp->hooks->stop && __atomic_load_n(pp->hooks->stop, __ATOMIC_RELAXED) != 0;
}

/* The chunk of output rows holding `row`, inside segment seg: chunks lie on
 * a global grid of chunk_rows, cut by the segment's ends. */
static void chunk_of(const tw_pipe *pp, const tw_segment *seg, int row, int *r0, int *r1)
{
    int g0 = row / pp->chunk_rows * pp->chunk_rows;
    *r0 = g0 > seg->plan.row_begin ? g0 : seg->plan.row_begin;
    *r1 = g0 + pp->chunk_rows < seg->plan.row_end ? g0 + pp->chunk_rows : seg->plan.row_end;
}

/* Open the input with the nodata value the workflow asks for. */
static tw_status open_input(const tw_pipe *pp, tw_raster **r, tw_error *err)
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

/* Is a tile with n_nodata of its n_inside pixels (those inside the raster)
 * classified, or nodata in every output? (plan.h) */
static bool tile_classified(const tw_pipe *pp, int64_t n_nodata, int64_t n_inside)
{
    return tw_tile_classified(n_nodata, n_inside, pp->p->tiling.max_nodata_fraction);
}

static size_t raw_tile_bytes(const tw_pipe *pp, int tile)
{
    return (size_t)pp->norm.bands * (size_t)tile * (size_t)tile * tw_dtype_size(pp->dtype);
}

/* The one tw_infer_batch for slot s (n tiles). */
static tw_infer_batch slot_batch(const tw_pipe *pp, tw_slot *s, int n, int tile)
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
    size_t raw_bytes = nb * raw_tile_bytes(pp, tile);
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
    tw_status st = tw_plan_make(info->width, info->height, pp->m->tile, pp->m->stride,
                                p->tiling.edge, 0, 1, &full, err);
    if (st != TW_OK) return st;
    const int T = full.tile;
    const size_t px = (size_t)T * T;
    const size_t raw_tile = raw_tile_bytes(pp, T);
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
    if ((st = open_input(pp, &r, err)) != TW_OK) goto out;
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
            tile_classified(pp, n_nodata, n_inside))
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
static void locate(const tw_pipe *pp, int64_t t, int *si, int *ty, int *tx)
{
    *si = seg_of(pp, t);
    const tw_plan *pl = &pp->segs[*si].plan;
    int64_t off = t - pp->segs[*si].first + pp->segs[*si].skip;
    *ty = pl->ty_begin + (int)(off / pl->x.n_pos);
    *tx = (int)(off % pl->x.n_pos);
}

typedef struct batch_claim {
    int64_t seq, first;
    int n;
} batch_claim;

/* The next batch: up to `batch` tiles from next_tile on. A stop request
 * (SIGTERM, ...) ends the claims at once (stages.h, "Stopping"). false: no
 * more batches. */
static bool claim_batch(tw_pipe *pp, batch_claim *c)
{
    pthread_mutex_lock(&pp->mu);
    const int B = pp->bud->batch;
    int64_t t = pp->next_tile;
    int n = 0;
    if (!pp->claims_done && stop_requested(pp)) pp->claims_done = true;
    while (!pp->claims_done && n < B && t + n < pp->n_tiles) {
        int si, ty, tx;
        locate(pp, t + n, &si, &ty, &tx);
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

/* ---- the stages ------------------------------------------------------------- */

typedef enum work_result {
    W_PASS, /* pass the slot on */
    W_END,  /* this worker is done: the slot goes back to the free queue */
    W_FAIL, /* the pipe was aborted (error or cancel) */
} work_result;

typedef struct worker {
    tw_pipe *pp;
    int index;
    double wait_s, t_start;
    /* infer stage */
    int64_t seq_end; /* 1 + the highest batch number inferred */
    /* with a backend that has infer_begin/infer_end */
    tw_slot *held; /* begun, not ended */
    int held_lane, lane;
    tw_queue *in; /* the stage's input queue */
    /* read stage */
    tw_raster *r;
    int *xs;
    int64_t *nod, *ins;
    int64_t bytes_read;
} worker;

typedef struct stage_def {
    int id; /* TW_STAGE_* */
    tw_status (*start)(worker *w);
    /* One slot in; out[0], out[1]: the slots to pass on, in that order (NULL:
     * none; out[0] is s on entry, out[1] NULL). A stage may hold s for later
     * and pass on one it held before. */
    work_result (*work)(worker *w, tw_slot *s, tw_slot **out);
    /* The input is drained (not after an abort): a slot still held, to pass
     * on, or NULL. NULL when the stage holds none. */
    tw_slot *(*drain)(worker *w);
    tw_status (*stop)(worker *w); /* after the last work, also after an abort */
} stage_def;

/* -- read: claim a batch, read its tile rows as strips, cut the tiles -- */

static tw_status read_start(worker *w)
{
    tw_pipe *pp = w->pp;
    const int B = pp->bud->batch, T = pp->segs[0].plan.tile;
    /* Each worker opens its own dataset: GDAL handles are not thread-safe. */
    tw_status st = open_input(pp, &w->r, pp->err);
    if (st == TW_OK) st = tw_raster_reserve_strip(w->r, pp->bud->read_strip_w, T, pp->err);
    if (st != TW_OK) return st;
    w->xs = tw_calloc(TW_MEM_READ, (size_t)B, sizeof(int));
    w->nod = tw_calloc(TW_MEM_READ, (size_t)B, sizeof(int64_t));
    w->ins = tw_calloc(TW_MEM_READ, (size_t)B, sizeof(int64_t));
    if (!w->xs || !w->nod || !w->ins)
        return tw_error_set(pp->err, TW_ERR_NOMEM, "out of memory for a reader");
    if (w->index == 0)
        snprintf(pp->res->reader, sizeof pp->res->reader, "%s", tw_raster_reader(w->r, NULL));
    return TW_OK;
}

static tw_status read_stop(worker *w)
{
    long long n = w->r ? tw_raster_tiles_decoded(w->r) : -1;
    pthread_mutex_lock(&w->pp->mu);
    tw_input_result *res = w->pp->res;
    if (n >= 0)
        res->tiff_tiles_decoded = (res->tiff_tiles_decoded > 0 ? res->tiff_tiles_decoded : 0) + n;
    pthread_mutex_unlock(&w->pp->mu);
    tw_raster_close(w->r);
    tw_free(w->xs);
    tw_free(w->nod);
    tw_free(w->ins);
    return TW_OK;
}

static tw_tile_ref *add_ref(tw_slot *s, int si, int ty, int tx)
{
    tw_tile_ref *ref = &s->refs[s->n_refs++];
    *ref = (tw_tile_ref){.tx = tx, .ty = ty, .seg = si, .kept = -1, .read_error = 0};
    return ref;
}

/* The tile at kept position k is classified: record it. */
static void keep(tw_slot *s, tw_tile_ref *ref, int x0, int y0)
{
    int k = s->n_kept++;
    ref->kept = k;
    s->orow[k] = y0;
    s->ocol[k] = x0;
}

/* A strip that could not be read: read its tiles one by one, so that the
 * message (and, with on_error: skip, the nodata) names the tile that fails,
 * exactly as a tile-by-tile reader would. */
static work_result read_tiles_one_by_one(worker *w, tw_slot *s, int si, int ty, int tx0, int n,
                                         int y0)
{
    tw_pipe *pp = w->pp;
    const int T = pp->segs[si].plan.tile;
    const size_t px = (size_t)T * T, raw_tile = raw_tile_bytes(pp, T);
    for (int i = 0; i < n; i++) {
        tw_tile_ref *ref = add_ref(s, si, ty, tx0 + i);
        int k = s->n_kept, x0 = w->xs[i];
        int64_t n_nodata = 0, n_inside = 0;
        tw_error rerr;
        tw_error_init(&rerr);
        tw_status st = tw_raster_read(w->r, x0, y0, T, T, (char *)s->raw + (size_t)k * raw_tile,
                                      s->valid + (size_t)k * px, &n_nodata, &n_inside, &rerr);
        w->bytes_read += (int64_t)raw_tile;
        if (st == TW_CANCELLED || (st != TW_OK && stop_requested(pp))) {
            /* a remote read cut short by a stop: the batch is dropped */
            s->dropped = true;
            return W_PASS;
        }
        if (st != TW_OK) {
            /* an outage that outlasted the retries ends the run (resumable),
             * whatever on_error says: skipping would make nodata of it all */
            if (pp->p->input.on_error != TW_ON_ERROR_SKIP || st == TW_ERR_REMOTE) {
                tw_error_set(pp->err, st, "%s", rerr.msg);
                pipe_abort(pp);
                return W_FAIL;
            }
            tw_log_printf(pp->log, TW_LOG_WARNING,
                          "%s: tile at pixel x=%d y=%d (tile row %d, col %d) is unreadable and "
                          "written as nodata: %s",
                          pp->display, x0, y0, ty, tx0 + i, rerr.msg);
            ref->read_error = 1;
        } else if (tile_classified(pp, n_nodata, n_inside)) {
            keep(s, ref, x0, y0);
        }
    }
    return W_PASS;
}

/* Tiles tx0..tx0+n-1 of tile row ty (w->xs holds their x positions): one
 * window read, cut into the slot after its kept tiles; tiles that are not
 * classified are overwritten by the next one. */
static work_result read_run(worker *w, tw_slot *s, int si, int ty, int tx0, int n, int y0)
{
    tw_pipe *pp = w->pp;
    const int T = pp->segs[si].plan.tile;
    const size_t px = (size_t)T * T, raw_tile = raw_tile_bytes(pp, T);
    const int k0 = s->n_kept;
    tw_error rerr;
    tw_error_init(&rerr);
    tw_status st =
        tw_raster_read_tiles(w->r, y0, w->xs, n, T, (char *)s->raw + (size_t)k0 * raw_tile,
                             s->valid + (size_t)k0 * px, w->nod, w->ins, &rerr);
    if (st == TW_CANCELLED || (st != TW_OK && stop_requested(pp))) {
        /* a remote read cut short by a stop (its request ended within
         * input.timeout): the batch is dropped, not failed */
        s->dropped = true;
        return W_PASS;
    }
    if (st == TW_ERR_REMOTE) {
        /* the retries are spent: reading the strip's tiles one by one would
         * wait them out once per tile */
        tw_error_set(pp->err, st, "%s", rerr.msg);
        pipe_abort(pp);
        return W_FAIL;
    }
    if (st != TW_OK) return read_tiles_one_by_one(w, s, si, ty, tx0, n, y0);
    w->bytes_read += (int64_t)(w->xs[n - 1] - w->xs[0] + T) * T * (int64_t)pp->norm.bands *
                     (int64_t)tw_dtype_size(pp->dtype);
    for (int i = 0; i < n; i++) {
        tw_tile_ref *ref = add_ref(s, si, ty, tx0 + i);
        if (!tile_classified(pp, w->nod[i], w->ins[i])) continue;
        int k = s->n_kept;
        if (k != k0 + i) {
            memcpy((char *)s->raw + (size_t)k * raw_tile,
                   (const char *)s->raw + (size_t)(k0 + i) * raw_tile, raw_tile);
            memcpy(s->valid + (size_t)k * px, s->valid + (size_t)(k0 + i) * px, px);
        }
        keep(s, ref, w->xs[i], y0);
    }
    return W_PASS;
}

static work_result read_work(worker *w, tw_slot *s, tw_slot **out)
{
    *out = s;
    tw_pipe *pp = w->pp;
    batch_claim c;
    if (!claim_batch(pp, &c)) return W_END;
    s->seq = c.seq;
    s->first = c.first;
    s->n_tiles = c.n;
    s->dropped = false;
    s->n_refs = s->n_kept = 0;
    const int strip_w = pp->bud->read_strip_w;
    for (int64_t t = c.first, end = c.first + c.n; t < end && !aborted(pp);) {
        if (stop_requested(pp)) { /* a batch not read yet is not inferred either */
            s->dropped = true;
            break;
        }
        int si, ty, tx;
        locate(pp, t, &si, &ty, &tx);
        const tw_plan *pl = &pp->segs[si].plan;
        const int T = pl->tile;
        int run = pl->x.n_pos - tx;
        if (run > end - t) run = (int)(end - t);
        int y0 = tw_axis_pos(&pl->y, T, pl->stride, ty);
        /* The row's tiles in windows no wider than the read strip; tiles
         * outside input.aoi are neither read nor classified. */
        for (int i = 0; i < run;) {
            if (pp->aoi && !tw_aoi_tile(pp->aoi, tx + i, ty)) {
                add_ref(s, si, ty, tx + i)->outside_aoi = 1;
                i++;
                continue;
            }
            if (stop_requested(pp)) {
                s->dropped = true;
                return W_PASS;
            }
            int n = 0;
            while (i + n < run && (!pp->aoi || tw_aoi_tile(pp->aoi, tx + i + n, ty))) {
                int x = tw_axis_pos(&pl->x, T, pl->stride, tx + i + n);
                if (n > 0 && x - w->xs[0] + T > strip_w) break; /* x + T may pass 2^31-1 */
                w->xs[n++] = x;
            }
            if (read_run(w, s, si, ty, tx + i, n, y0) != W_PASS) return W_FAIL;
            i += n;
        }
        t += run;
    }
    return aborted(pp) ? W_FAIL : W_PASS;
}

/* -- normalize: raw pixels to the model's input (CPU backends) -- */

static work_result normalize_work(worker *w, tw_slot *s, tw_slot **out)
{
    *out = s;
    tw_pipe *pp = w->pp;
    const int T = pp->segs[0].plan.tile;
    if (!pp->wants_raw && s->n_kept > 0 && !s->dropped)
        tw_normalize(s->raw, pp->dtype, s->valid, s->n_kept, T, T, &pp->norm, pp->norm_threads,
                     s->x);
    return W_PASS;
}

/* -- infer -- */

/* With a backend that has infer_begin/infer_end (a GPU), two batches are in
 * flight when the device is what limits the run: batch k+1 is begun (its
 * copy starts) before batch k is ended, so the copy hides behind k's
 * compute. The stage holds the batch it began only while the next one is
 * already queued: ending it then waits for no input. (A held batch may be
 * the one the write stage waits for, with every other slot parked behind it
 * in the ordered write queue: waiting for input then would never end.) When
 * nothing is queued the device is not the bottleneck, and the batch is
 * ended at once. Slots leave in the order they came; the write stage
 * reorders them. */
static work_result infer_work(worker *w, tw_slot *s, tw_slot **out)
{
    tw_pipe *pp = w->pp;
    out[0] = s;
    const int T = pp->segs[0].plan.tile;
    /* After a stop request only the batches that fill a gap before one
     * already inferred are run (several readers finish out of order): the
     * write stage keeps the tiles up to the first batch not run. */
    if (!s->dropped && s->seq >= w->seq_end && stop_requested(pp)) s->dropped = true;
    if (s->dropped) {
        int n = 0;
        if (w->held) {
            tw_infer_batch hb = slot_batch(pp, w->held, w->held->n_kept, T);
            if (tw_backend_infer_end(pp->be, &hb, w->held_lane, pp->err) != TW_OK) goto fail;
            out[n++] = w->held;
            w->held = NULL;
        }
        out[n++] = s;
        if (n < 2) out[n] = NULL;
        return W_PASS;
    }
    if (s->seq >= w->seq_end) w->seq_end = s->seq + 1;
    tw_infer_batch b = slot_batch(pp, s, s->n_kept, T);
    if (!tw_backend_overlaps(pp->be)) {
        if (s->n_kept == 0 || tw_backend_infer(pp->be, &b, pp->err) == TW_OK) return W_PASS;
        pipe_abort(pp);
        return W_FAIL;
    }
    int lane = w->lane;
    if (s->n_kept > 0) {
        if (tw_backend_infer_begin(pp->be, &b, lane, pp->err) != TW_OK) goto fail;
        w->lane ^= 1;
    }
    int n = 0;
    if (w->held) {
        tw_infer_batch hb = slot_batch(pp, w->held, w->held->n_kept, T);
        if (tw_backend_infer_end(pp->be, &hb, w->held_lane, pp->err) != TW_OK) goto fail;
        out[n++] = w->held;
        w->held = NULL;
    }
    if (s->n_kept > 0 && tw_queue_count(w->in) > 0) {
        w->held = s;
        w->held_lane = lane;
    } else {
        if (s->n_kept > 0 && tw_backend_infer_end(pp->be, &b, lane, pp->err) != TW_OK) goto fail;
        out[n++] = s;
    }
    if (n < 2) out[n] = NULL;
    return W_PASS;
fail:
    pipe_abort(pp);
    return W_FAIL;
}

static tw_slot *infer_drain(worker *w)
{
    tw_pipe *pp = w->pp;
    tw_slot *s = w->held;
    if (!s) return NULL;
    w->held = NULL;
    tw_infer_batch b = slot_batch(pp, s, s->n_kept, pp->segs[0].plan.tile);
    if (tw_backend_infer_end(pp->be, &b, w->held_lane, pp->err) != TW_OK) {
        pipe_abort(pp);
        return NULL;
    }
    return s;
}

static tw_status infer_stop(worker *w)
{
    /* After an abort: the batch still on the device must finish before its
     * slot's (pinned) memory can be freed; its outputs are not wanted. */
    if (w->held) {
        tw_pipe *pp = w->pp;
        tw_error ignored;
        tw_error_init(&ignored);
        tw_infer_batch b = slot_batch(pp, w->held, w->held->n_kept, pp->segs[0].plan.tile);
        (void)tw_backend_infer_end(pp->be, &b, w->held_lane, &ignored);
        w->held = NULL;
    }
    return TW_OK;
}

/* -- write: stitch in raster order, commit chunks, report progress -- */

/* Rows finished by the stitcher go into the committed chunks. */
tw_status tw_pipe_parts_sink(void *user, int row0, int n, const float *probs, const uint8_t *has,
                             tw_error *err)
{
    tw_pipe *pp = user;
    const tw_segment *seg = &pp->segs[pp->cur_seg];
    /* values per cell: the probabilities, then embedding_raster's features */
    const size_t W = (size_t)seg->plan.grid_w,
                 C = (size_t)pp->m->n_classes + ((pp->p->output.products & TW_PRODUCT_EMB_RASTER)
                                                     ? (size_t)pp->m->feat_dim
                                                     : 0);
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
        if (st == TW_OK && row + m == end) {
            st = tw_parts_chunk_commit(pp->parts, err);
            pp->t_commit = tw_clock_now();
        }
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
static tw_status writer_begin_row(tw_pipe *pp, const tw_segment *seg, int ty, tw_error *err)
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
    /* the tile records that follow are the unfinished row's (checkpoint) */
    if (st == TW_OK && tw_parts_chunk_end(pp->parts) >= 0) tw_parts_chunk_mark(pp->parts);
    return st;
}

/* The first tile of the segment a checkpoint resumes is about to be added:
 * put the stitcher's rows back and reopen the chunk of the unfinished row
 * with its tile records (parts.h, "Checkpoints"). */
static tw_status restore_state(tw_pipe *pp, const tw_segment *seg, int *cur_ty)
{
    const tw_parts_state *ps = &pp->state;
    float *sum;
    uint32_t *count;
    tw_stitch_restore(pp->stitch, ps->r0, &sum, &count);
    int r0, r1;
    chunk_of(pp, seg, ps->r0, &r0, &r1);
    tw_status st = tw_parts_chunk_begin(pp->parts, ps->r0, r1, pp->err);
    if (st == TW_OK) st = tw_parts_state_restore(pp->parts, sum, count, pp->err);
    /* mid-row: the row has begun (its rows above are flushed, its records
     * are those just restored) */
    if (ps->tx > 0) *cur_ty = ps->ty;
    pp->state_seg = -1;
    return st;
}

/* Seconds between checkpoints of a long chunk (hooks may not set it). */
static double checkpoint_interval(const tw_pipe *pp)
{
    double s = pp->checkpoint_s > 0 ? pp->checkpoint_s : TW_CHECKPOINT_S;
    /* what a checkpoint costs stays under 2 % of the run */
    return s > 50.0 * pp->checkpoint_cost ? s : 50.0 * pp->checkpoint_cost;
}

/* Keep what the write stage has stitched: every tile before written_end.
 * At the end of the current segment (its last tile is in) that is its
 * remaining rows, finished and committed (when `ending`; otherwise the next
 * segment's first tile finishes them); inside it, a checkpoint. */
static tw_status checkpoint(tw_pipe *pp, bool ending)
{
    if (pp->cur_seg < 0) return TW_OK; /* nothing stitched by this run */
    const tw_segment *seg = &pp->segs[pp->cur_seg];
    if (pp->written_end >= seg->first + seg->plan.n_tiles - seg->skip)
        return ending ? tw_stitch_finish(pp->stitch, pp->err) : TW_OK;
    if (pp->written_end == pp->checkpoint_end) return TW_OK; /* kept already */
    int si, ty, tx;
    locate(pp, pp->written_end, &si, &ty, &tx);
    TW_ASSERT(si == pp->cur_seg);
    const float *sum;
    const uint32_t *count;
    tw_parts_state ps = {.row_end = seg->plan.row_end, .ty = ty, .tx = tx};
    ps.r0 = tw_stitch_held(pp->stitch, &sum, &count, &ps.k);
    double t0 = tw_clock_now();
    tw_status st = tw_parts_checkpoint(pp->parts, &ps, sum, count, pp->err);
    pp->t_commit = tw_clock_now();
    pp->checkpoint_cost = pp->t_commit - t0;
    pp->checkpoint_end = pp->written_end;
    return st;
}

static tw_status write_start(worker *w)
{
    w->pp->cur_seg = -1;
    w->pp->cur_ty = -1;
    return TW_OK;
}

static tw_status write_tiles(tw_pipe *pp, tw_slot *s)
{
    int *cur_ty = &pp->cur_ty;
    const int C = pp->m->n_classes;
    /* the tile records' features (embeddings); the stitcher's (embedding_raster) */
    const int F = (pp->p->output.products & TW_PRODUCT_EMB) ? pp->m->feat_dim : 0;
    const int FE = (pp->p->output.products & TW_PRODUCT_EMB_RASTER) ? pp->m->feat_dim : 0;
    for (int i = 0; i < s->n_refs; i++) {
        const tw_tile_ref *ref = &s->refs[i];
        if (ref->seg != pp->cur_seg) {
            if (pp->cur_seg >= 0 && tw_stitch_finish(pp->stitch, pp->err) != TW_OK)
                return pp->err->status;
            pp->cur_seg = ref->seg;
            tw_stitch_reset(pp->stitch, &pp->segs[ref->seg].plan);
            *cur_ty = -1;
            if (ref->seg == pp->state_seg &&
                restore_state(pp, &pp->segs[ref->seg], cur_ty) != TW_OK)
                return pp->err->status;
        }
        const tw_segment *seg = &pp->segs[pp->cur_seg];
        if (ref->ty != *cur_ty) {
            if (writer_begin_row(pp, seg, ref->ty, pp->err) != TW_OK) return pp->err->status;
            *cur_ty = ref->ty;
        }
        if (ref->kept >= 0) {
            const float *pr = s->probs + (size_t)ref->kept * C;
            tw_stitch_add_emb(pp->stitch, ref->tx, ref->ty, pr,
                              FE ? s->emb + (size_t)ref->kept * pp->m->feat_dim : NULL);
            pp->res->tiles_classified++;
            int c0, c1;
            tw_axis_cells(&seg->plan.y, seg->plan.tile, seg->plan.stride, ref->ty, &c0, &c1);
            /* A tile belongs to the chunk of its first row: recorded once,
             * whatever the shards or reruns. */
            if (c0 >= seg->plan.row_begin && c0 < seg->plan.row_end &&
                tw_parts_chunk_tiles(pp->parts, 1, &s->orow[ref->kept], &s->ocol[ref->kept], pr,
                                     F ? s->emb + (size_t)ref->kept * F : NULL, pp->err) != TW_OK)
                return pp->err->status;
        } else if (ref->read_error) {
            pp->res->tiles_read_errors++;
        } else if (ref->outside_aoi) {
            pp->res->tiles_outside_aoi++;
        } else {
            pp->res->tiles_nodata++;
        }
    }
    return TW_OK;
}

static work_result write_work(worker *w, tw_slot *s, tw_slot **out)
{
    *out = s;
    tw_pipe *pp = w->pp;
    /* Batches come in order: the first one not run (a stop) ends the tiles
     * kept; the rest only go back to the pool. */
    if (s->dropped) pp->write_halted = true;
    if (pp->write_halted) return W_PASS;
    if (write_tiles(pp, s) != TW_OK) {
        pipe_abort(pp);
        return W_FAIL;
    }
    pp->written_end = s->first + s->n_tiles;
    pp->tiles_done += s->n_refs;
    if (!pp->steady && tw_stitch_rows_done(pp->stitch) > 0) {
        pp->steady = true;
        pp->allocs_mark = tw_pipe_alloc_count(pp);
    }
    if (pp->hooks && pp->hooks->progress) {
        double f = pp->n_tiles > 0 ? (double)pp->tiles_done / (double)pp->n_tiles : 1.0;
        if (pp->hooks->tiles)
            pp->hooks->tiles(pp->tiles_done, pp->n_tiles, pp->display, pp->hooks->progress_user);
        if (!pp->hooks->progress(f > 1.0 ? 1.0 : f, pp->display, pp->hooks->progress_user) &&
            !stop_requested(pp)) {
            atomic_store(&pp->cancelled, 1);
            pipe_abort(pp);
            return W_FAIL;
        }
    }
    /* A long chunk (a wide raster's tile row) is kept every few seconds:
     * a kill -9 then loses no more than that. */
    if (tw_clock_now() - pp->t_commit >= checkpoint_interval(pp) && !stop_requested(pp) &&
        checkpoint(pp, false) != TW_OK) {
        pipe_abort(pp);
        return W_FAIL;
    }
    return W_PASS;
}

static tw_status write_stop(worker *w)
{
    tw_pipe *pp = w->pp;
    if (aborted(pp) || pp->cur_seg < 0) return TW_OK;
    /* every tile in: finish the rows; stopped early: keep what is in */
    tw_status st = pp->written_end >= pp->n_tiles ? tw_stitch_finish(pp->stitch, pp->err)
                                                  : checkpoint(pp, true);
    if (st != TW_OK) pipe_abort(pp);
    return st;
}

/* ---- the driver ---------------------------------------------------------------- */

static const stage_def k_stages[TW_STAGE_COUNT] = {
    [TW_STAGE_READ] = {TW_STAGE_READ, read_start, read_work, NULL, read_stop},
    [TW_STAGE_NORMALIZE] = {TW_STAGE_NORMALIZE, NULL, normalize_work, NULL, NULL},
    [TW_STAGE_INFER] = {TW_STAGE_INFER, NULL, infer_work, infer_drain, infer_stop},
    [TW_STAGE_WRITE] = {TW_STAGE_WRITE, write_start, write_work, NULL, write_stop},
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
        work_result r = aborted(pp) ? W_FAIL : a->def->work(w, s, out);
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
    if (drained && !aborted(pp) && a->def->drain) {
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
                                   .def = &k_stages[sid],
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
