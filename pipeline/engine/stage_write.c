/* stage_write.c - the write stage (stages.h): stitch the batches in raster
 * order, commit the chunks of finished rows, take checkpoints, report
 * progress; one worker (see stages_internal.h for the parts). A classifier's
 * tiles go to the stitcher (stitch.h, a value per cell), a segmentation
 * model's to the blender (blend.h, per pixel): the same steps, the same
 * chunks and checkpoints. */
#include "core/clock.h"
#include "pipeline/engine/stages_internal.h"

/* -- the stitcher or the blender, whichever the run has -- */

static tw_status acc_begin_row(tw_pipe *pp, int ty, tw_error *err)
{
    return pp->blend ? tw_blend_begin_row(pp->blend, ty, err)
                     : tw_stitch_begin_row(pp->stitch, ty, err);
}

static tw_status acc_finish(tw_pipe *pp, tw_error *err)
{
    return pp->blend ? tw_blend_finish(pp->blend, err) : tw_stitch_finish(pp->stitch, err);
}

static tw_status acc_reset(tw_pipe *pp, const tw_plan *plan, tw_error *err)
{
    if (pp->blend) return tw_blend_reset(pp->blend, plan->row_begin, plan->row_end, err);
    tw_stitch_reset(pp->stitch, plan);
    return TW_OK;
}

static int acc_rows_done(const tw_pipe *pp)
{
    return pp->blend ? tw_blend_rows_done(pp->blend) : tw_stitch_rows_done(pp->stitch);
}

/* The held rows for a checkpoint: the first row held; *sum and *count
 * (the blender's sums of weights, floats of the same size) borrowed. */
static int acc_held(const tw_pipe *pp, const float **sum, const void **count, int *k)
{
    if (!pp->blend) {
        const uint32_t *c;
        int r0 = tw_stitch_held(pp->stitch, sum, &c, k);
        *count = c;
        return r0;
    }
    const float *w;
    int r0 = tw_blend_held(pp->blend, sum, &w, k);
    *count = w;
    return r0;
}

static void acc_restore(tw_pipe *pp, const tw_parts_state *ps, float **sum, void **count)
{
    if (!pp->blend) {
        uint32_t *c;
        tw_stitch_restore(pp->stitch, ps->r0, sum, &c);
        *count = c;
        return;
    }
    float *w;
    tw_blend_restore(pp->blend, ps->r0, ps->tx, ps->ty, sum, &w);
    *count = w;
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
            pipe_chunk_of(pp, seg, row, &r0, &r1);
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
    tw_status st = acc_begin_row(pp, ty, err);
    if (st != TW_OK) return st;
    int c0, c1;
    tw_axis_cells(&seg->plan.y, seg->plan.tile, seg->plan.stride, ty, &c0, &c1);
    if (c0 >= seg->plan.row_begin && c0 < seg->plan.row_end && tw_parts_chunk_end(pp->parts) < 0) {
        int r0, r1;
        pipe_chunk_of(pp, seg, c0, &r0, &r1);
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
    void *count;
    acc_restore(pp, ps, &sum, &count);
    int r0, r1;
    pipe_chunk_of(pp, seg, ps->r0, &r0, &r1);
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
        return ending ? acc_finish(pp, pp->err) : TW_OK;
    if (pp->written_end == pp->checkpoint_end) return TW_OK; /* kept already */
    int si, ty, tx;
    pipe_locate(pp, pp->written_end, &si, &ty, &tx);
    TW_ASSERT(si == pp->cur_seg);
    const float *sum;
    const void *count;
    tw_parts_state ps = {.row_end = seg->plan.row_end, .ty = ty, .tx = tx};
    ps.r0 = acc_held(pp, &sum, &count, &ps.k);
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
            if (pp->cur_seg >= 0 && acc_finish(pp, pp->err) != TW_OK) return pp->err->status;
            pp->cur_seg = ref->seg;
            if (acc_reset(pp, &pp->segs[ref->seg].plan, pp->err) != TW_OK) return pp->err->status;
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
        if (ref->kept >= 0 && pp->blend) {
            /* per pixel: the tile's [C][T][T] probabilities, its valid mask */
            const size_t px = (size_t)seg->plan.tile * (size_t)seg->plan.tile;
            if (tw_blend_add(pp->blend, ref->tx, ref->ty, s->probs + (size_t)ref->kept * C * px,
                             s->valid + (size_t)ref->kept * px, pp->err) != TW_OK)
                return pp->err->status;
            pp->res->tiles_classified++;
        } else if (ref->kept >= 0) {
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
    if (!pp->steady && acc_rows_done(pp) > 0) {
        pp->steady = true;
        pp->allocs_mark = tw_pipe_alloc_count(pp);
    }
    if (pp->hooks && pp->hooks->progress) {
        double f = pp->n_tiles > 0 ? (double)pp->tiles_done / (double)pp->n_tiles : 1.0;
        if (pp->hooks->tiles)
            pp->hooks->tiles(pp->tiles_done, pp->n_tiles, pp->display, pp->hooks->progress_user);
        if (!pp->hooks->progress(f > 1.0 ? 1.0 : f, pp->display, pp->hooks->progress_user) &&
            !pipe_stop_requested(pp)) {
            atomic_store(&pp->cancelled, 1);
            pipe_abort(pp);
            return W_FAIL;
        }
    }
    /* A long chunk (a wide raster's tile row) is kept every few seconds:
     * a kill -9 then loses no more than that. */
    if (tw_clock_now() - pp->t_commit >= checkpoint_interval(pp) && !pipe_stop_requested(pp) &&
        checkpoint(pp, false) != TW_OK) {
        pipe_abort(pp);
        return W_FAIL;
    }
    return W_PASS;
}

static tw_status write_stop(worker *w)
{
    tw_pipe *pp = w->pp;
    if (pipe_aborted(pp) || pp->cur_seg < 0) return TW_OK;
    /* every tile in: finish the rows; stopped early: keep what is in */
    tw_status st = pp->written_end >= pp->n_tiles ? acc_finish(pp, pp->err) : checkpoint(pp, true);
    if (st != TW_OK) pipe_abort(pp);
    return st;
}

const stage_def pipe_stage_write = {TW_STAGE_WRITE, write_start, write_work, NULL, write_stop};
