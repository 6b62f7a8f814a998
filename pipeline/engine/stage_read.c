/* stage_read.c - the read stage (stages.h): claim a batch, read its tile
 * rows as strips, cut the tiles into the slot. One worker per reader
 * thread, each with its own dataset (see stages_internal.h for the parts). */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "pipeline/engine/stages_internal.h"

static tw_status read_start(worker *w)
{
    tw_pipe *pp = w->pp;
    const int B = pp->bud->batch, T = pp->segs[0].plan.tile;
    /* Each worker opens its own dataset: GDAL handles are not thread-safe. */
    tw_status st = pipe_open_input(pp, &w->r, pp->err);
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
    const size_t px = (size_t)T * T, raw_tile = pipe_raw_tile_bytes(pp, T);
    for (int i = 0; i < n; i++) {
        tw_tile_ref *ref = add_ref(s, si, ty, tx0 + i);
        int k = s->n_kept, x0 = w->xs[i];
        int64_t n_nodata = 0, n_inside = 0;
        tw_error rerr;
        tw_error_init(&rerr);
        tw_status st = tw_raster_read(w->r, x0, y0, T, T, (char *)s->raw + (size_t)k * raw_tile,
                                      s->valid + (size_t)k * px, &n_nodata, &n_inside, &rerr);
        w->bytes_read += (int64_t)raw_tile;
        if (st == TW_CANCELLED || (st != TW_OK && pipe_stop_requested(pp))) {
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
        } else if (pipe_tile_classified(pp, n_nodata, n_inside)) {
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
    const size_t px = (size_t)T * T, raw_tile = pipe_raw_tile_bytes(pp, T);
    const int k0 = s->n_kept;
    tw_error rerr;
    tw_error_init(&rerr);
    tw_status st =
        tw_raster_read_tiles(w->r, y0, w->xs, n, T, (char *)s->raw + (size_t)k0 * raw_tile,
                             s->valid + (size_t)k0 * px, w->nod, w->ins, &rerr);
    if (st == TW_CANCELLED || (st != TW_OK && pipe_stop_requested(pp))) {
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
        if (!pipe_tile_classified(pp, w->nod[i], w->ins[i])) continue;
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
    if (!pipe_claim_batch(pp, &c)) return W_END;
    s->seq = c.seq;
    s->first = c.first;
    s->n_tiles = c.n;
    s->dropped = false;
    s->n_refs = s->n_kept = 0;
    const int strip_w = pp->bud->read_strip_w;
    for (int64_t t = c.first, end = c.first + c.n; t < end && !pipe_aborted(pp);) {
        if (pipe_stop_requested(pp)) { /* a batch not read yet is not inferred either */
            s->dropped = true;
            break;
        }
        int si, ty, tx;
        pipe_locate(pp, t, &si, &ty, &tx);
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
            if (pipe_stop_requested(pp)) {
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
    return pipe_aborted(pp) ? W_FAIL : W_PASS;
}

const stage_def pipe_stage_read = {TW_STAGE_READ, read_start, read_work, NULL, read_stop};
