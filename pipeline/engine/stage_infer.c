/* stage_infer.c - the normalize and infer stages (stages.h): raw pixels to
 * the model's input (CPU backends), and the backend's batches, two in
 * flight on a backend that overlaps (see stages_internal.h for the parts). */
#include "pipeline/engine/normalize.h"
#include "pipeline/engine/stages_internal.h"

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
    if (!s->dropped && s->seq >= w->seq_end && pipe_stop_requested(pp)) s->dropped = true;
    if (s->dropped) {
        int n = 0;
        if (w->held) {
            tw_infer_batch hb = pipe_slot_batch(pp, w->held, w->held->n_kept, T);
            if (tw_backend_infer_end(pp->be, &hb, w->held_lane, pp->err) != TW_OK) goto fail;
            out[n++] = w->held;
            w->held = NULL;
        }
        out[n++] = s;
        if (n < 2) out[n] = NULL;
        return W_PASS;
    }
    if (s->seq >= w->seq_end) w->seq_end = s->seq + 1;
    tw_infer_batch b = pipe_slot_batch(pp, s, s->n_kept, T);
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
        tw_infer_batch hb = pipe_slot_batch(pp, w->held, w->held->n_kept, T);
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
    tw_infer_batch b = pipe_slot_batch(pp, s, s->n_kept, pp->segs[0].plan.tile);
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
        tw_infer_batch b = pipe_slot_batch(pp, w->held, w->held->n_kept, pp->segs[0].plan.tile);
        (void)tw_backend_infer_end(pp->be, &b, w->held_lane, &ignored);
        w->held = NULL;
    }
    return TW_OK;
}

const stage_def pipe_stage_normalize = {TW_STAGE_NORMALIZE, NULL, normalize_work, NULL, NULL};
const stage_def pipe_stage_infer = {TW_STAGE_INFER, NULL, infer_work, infer_drain, infer_stop};
