/* assemble.c - product assembly: an input's committed chunks (the chunk
 * store, parts.c) read back in row order and written through io/writer,
 * io/tiletable and io/gpkg into the final products (see assemble.h). */
#include "pipeline/store/assemble.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/argmax.h"
#include "pipeline/store/parts_internal.h"

/* Chunks in row order, from the done map: a run of done rows can be made of
 * several chunks (from several runs or shards), so list the files. */
typedef struct chunk_span {
    int r0, r1;
} chunk_span;

static int span_cmp(const void *a, const void *b)
{
    const chunk_span *x = a, *y = b;
    return x->r0 != y->r0 ? (x->r0 < y->r0 ? -1 : 1) : (x->r1 > y->r1) - (x->r1 < y->r1);
}

static int list_chunks(const tw_parts *pt, chunk_span *spans, int max)
{
    DIR *d = opendir(pt->dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int r0, r1;
        /* exactly the names chunk_path gives (its rows take 8 digits from
         * row 10^7 on: a fixed name length dropped those chunks) */
        char want[64];
        if (sscanf(e->d_name, "rows-%d-%d.bin", &r0, &r1) == 2 &&
            snprintf(want, sizeof want, "rows-%07d-%07d.bin", r0, r1) < (int)sizeof want &&
            strcmp(want, e->d_name) == 0 && n < max) {
            spans[n].r0 = r0;
            spans[n].r1 = r1;
            n++;
        }
    }
    closedir(d);
    /* by r0: checkpoints (every few seconds of a slow run) can make
     * thousands of chunks */
    qsort(spans, (size_t)n, sizeof *spans, span_cmp);
    return n;
}

/* n rows of the grid from row r0 into the writer (w may be NULL), their
 * argmax counted into hist and nodata_cells. */
/* The rows chunk of span sp, positioned at its first row (path: its name,
 * for messages); NULL with TW_ERR_INPUT naming it when it cannot be read. */
static FILE *open_rows(const tw_parts *pt, const chunk_span *sp, char *path, size_t size,
                       tw_error *err)
{
    chunk_path(pt, "rows", sp->r0, sp->r1, path, size);
    FILE *f = fopen(path, "rb");
    if (f && fseek(f, (long)sizeof(chunk_header), SEEK_SET) == 0) return f;
    if (f) fclose(f);
    tw_error_set(err, TW_ERR_INPUT, "cannot read %s", path);
    return NULL;
}

static tw_status assemble_rows(tw_writer *w, int r0, int n, const float *probs, const uint8_t *has,
                               size_t W, size_t C, size_t K, int64_t *hist, int64_t *nodata_cells,
                               tw_error *err)
{
    for (size_t q = 0; q < (size_t)n * W; q++) {
        if (!has[q]) {
            (*nodata_cells)++;
            continue;
        }
        const float *pr = probs + q * C;
        if (K > 0) hist[tw_argmax(pr, K)]++;
    }
    return w ? tw_writer_write_rows(w, r0, n, probs, has, err) : TW_OK;
}

/* The int8 embedding raster's per-band scale and offset (writer.h): a
 * first pass over the chosen chunks finds each feature's min and max over
 * the classified cells; q = round((v - offset) / scale) then spans
 * -127..127, offset the middle of the range, so |v - (offset + scale q)| <=
 * scale / 2 = (max - min) / 508. *out [2][cell_emb]: scales, then offsets.
 * probs/has: the caller's buffers of one row at least. */
static tw_status int8_ranges(tw_parts *pt, const chunk_span *spans, int used, float *probs,
                             uint8_t *has, double **out, tw_error *err)
{
    const size_t W = (size_t)pt->p.grid_w, C = cell_values(&pt->p), K = (size_t)pt->p.n_classes;
    const size_t E = (size_t)pt->p.cell_emb;
    double *q = tw_alloc(TW_MEM_OTHER, sizeof(double) * 4 * E);
    if (!q) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    double *lo = q + 2 * E, *hi = q + 3 * E;
    for (size_t b = 0; b < E; b++) {
        lo[b] = INFINITY;
        hi[b] = -INFINITY;
    }
    tw_status st = TW_OK;
    char path[TW_PATH_MAX + 400];
    for (int i = 0; st == TW_OK && i < used; i++) {
        FILE *f = open_rows(pt, &spans[i], path, sizeof path, err);
        if (!f) {
            st = TW_ERR_INPUT;
            break;
        }
        for (int r = spans[i].r0; st == TW_OK && r < spans[i].r1; r++) {
            if (fread(probs, sizeof(float), W * C, f) != W * C || fread(has, 1, W, f) != W) {
                st = tw_error_set(err, TW_ERR_INPUT, "%s is truncated", path);
                break;
            }
            for (size_t c = 0; c < W; c++) {
                if (!has[c]) continue;
                const float *v = probs + c * C + K;
                for (size_t b = 0; b < E; b++) {
                    if (v[b] < lo[b]) lo[b] = v[b];
                    if (v[b] > hi[b]) hi[b] = v[b];
                }
            }
        }
        fclose(f);
    }
    for (size_t b = 0; b < E; b++) {
        if (!(hi[b] >= lo[b])) lo[b] = hi[b] = 0; /* no classified cell */
        double scale = (hi[b] - lo[b]) / 254.0;
        q[b] = scale > 0 ? scale : 1.0;
        q[E + b] = lo[b] + (hi[b] - lo[b]) / 2.0;
    }
    if (st != TW_OK) {
        tw_free(q);
        q = NULL;
    }
    *out = q;
    return st;
}

/* Every output row committed, or TW_ERR_INPUT naming the first rows that
 * are not and why: which shard owns them and whether it is running, has
 * not finished them or committed nothing; chunks that failed their
 * check. */
static tw_status check_finished(const tw_parts *pt, tw_error *err)
{
    const int H = pt->p.grid_h;
    for (int r = 0; r < H; r++) {
        if (!pt->done[r]) {
            int r1 = r;
            while (r1 < H && !pt->done[r1]) r1++;
            /* Say why: which shard owns the rows and what it left. */
            char why[400] = "";
            int N = pt->journal_shards;
            if (N > 0) {
                int k = (int)((int64_t)r * N / H);
                while (k + 1 < N && (int64_t)H * (k + 1) / N <= r) k++;
                while (k > 0 && (int64_t)H * k / N > r) k--;
                bool seen = k < 256 && (pt->journal_seen[k / 32] >> (k % 32) & 1u);
                char who[256];
                if (tw_parts_shard_running(pt, k, N, who, sizeof who))
                    snprintf(why, sizeof why,
                             ": they are shard %d/%d's, which is running now (%s): merge once it "
                             "has finished",
                             k + 1, N, who);
                else
                    snprintf(
                        why, sizeof why,
                        seen ? ": they are shard %d/%d's, which has not finished them (rerun it "
                               "with the same configuration: tilewise run WORKFLOW --shard %d/%d)"
                             : ": they are shard %d/%d's, which has committed nothing (it has "
                               "not run, failed before its first chunk, or was refused: run "
                               "tilewise run WORKFLOW --shard %d/%d)",
                        k + 1, N, k + 1, N);
            }
            if (pt->rejected > 0) {
                size_t u = strlen(why);
                snprintf(why + u, sizeof why - u,
                         "; %d committed chunk%s failed %s check (damaged, or not of this grid)",
                         pt->rejected, pt->rejected == 1 ? "" : "s",
                         pt->rejected == 1 ? "its" : "their");
            }
            return tw_error_set(err, TW_ERR_INPUT, "%s: output rows %d..%d are not finished yet%s",
                                pt->p.stem, r, r1 - 1, why);
        }
    }
    return TW_OK;
}

/* The tiles of the chunk span into the tile table tt and the GeoPackage gk
 * (either may be NULL), cap at a time through *tbuf (allocated on first
 * use, the caller's to free). path: a buffer for the chunk's path. */
static tw_status copy_tiles(tw_parts *pt, const chunk_span *span, tw_tiletable *tt, tw_gpkg *gk,
                            size_t K, float **tbuf, char *path, size_t path_size, tw_error *err)
{
    chunk_path(pt, "tiles", span->r0, span->r1, path, path_size);
    FILE *f = fopen(path, "rb");
    tiles_header th;
    if (!f || fread(&th, sizeof th, 1, f) != 1) {
        if (f) fclose(f);
        return tw_error_set(err, TW_ERR_INPUT, "cannot read %s", path);
    }
    const size_t F = (size_t)th.feat_dim;
    enum { cap = 256 };
    int32_t rc_rows[cap], rc_cols[cap];
    if (!*tbuf) *tbuf = tw_alloc(TW_MEM_STRIP, sizeof(float) * cap * (K + F));
    if (!*tbuf) {
        fclose(f);
        return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    float *tp_probs = *tbuf;
    float *tp_emb = *tbuf + (size_t)cap * K;
    tw_status st = TW_OK;
    for (int64_t t = 0; st == TW_OK && t < th.n_tiles;) {
        int m = th.n_tiles - t < cap ? (int)(th.n_tiles - t) : cap;
        for (int k = 0; k < m; k++) {
            int32_t rc[2];
            if (fread(rc, sizeof rc, 1, f) != 1 ||
                fread(tp_probs + (size_t)k * K, sizeof(float), K, f) != K ||
                (F && fread(tp_emb + (size_t)k * F, sizeof(float), F, f) != F)) {
                st = tw_error_set(err, TW_ERR_INPUT, "%s is truncated", path);
                break;
            }
            rc_rows[k] = rc[0];
            rc_cols[k] = rc[1];
        }
        if (st == TW_OK && tt)
            st = tw_tiletable_append(tt, m, rc_rows, rc_cols, tp_probs, F ? tp_emb : NULL, err);
        if (st == TW_OK && gk) st = tw_gpkg_append(gk, m, rc_rows, rc_cols, tp_probs, err);
        t += m;
    }
    fclose(f);
    return st;
}

tw_status tw_parts_assemble(tw_parts *pt, const tw_writer_params *wp, const tw_tiletable_params *tp,
                            const tw_gpkg_params *gp, int64_t *hist, int64_t *nodata_cells,
                            tw_error *err)
{
    const int H = pt->p.grid_h;
    tw_status st = check_finished(pt, err);
    if (st != TW_OK) return st;
    int max_spans = H + 1;
    chunk_span *spans = tw_alloc(TW_MEM_OTHER, sizeof(chunk_span) * (size_t)max_spans);
    if (!spans) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    int n = list_chunks(pt, spans, max_spans);
    /* Pick a chain of verified chunks covering 0..H in order (a journal may
     * list overlapping chunks after reruns; any sound one will do). */
    int used = 0, next = 0;
    for (int i = 0; i < n; i++) {
        if (spans[i].r0 != next) continue;
        if (!tw_parts_chunk_verify(pt, spans[i].r0, spans[i].r1)) continue;
        spans[used++] = spans[i];
        next = spans[i].r1;
    }
    if (next != H)
        st = tw_error_set(err, TW_ERR_INPUT, "%s: the committed chunks do not cover rows %d..%d",
                          pt->p.stem, next, H - 1);

    const size_t W = (size_t)pt->p.grid_w, C = cell_values(&pt->p), K = (size_t)pt->p.n_classes;
    const int batch_rows = 16;
    float *probs = NULL;
    uint8_t *has = NULL;
    tw_writer *w = NULL;
    tw_tiletable *tt = NULL;
    tw_gpkg *gk = NULL;
    float *tbuf = NULL;
    if (st == TW_OK) {
        probs = tw_alloc(TW_MEM_STRIP, W * C * sizeof(float) * batch_rows);
        has = tw_alloc(TW_MEM_STRIP, W * batch_rows);
        if (!probs || !has) st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    /* int8 embeddings: each band's range over the whole grid first (the
     * chunks are all on disk), for its scale and offset */
    tw_writer_params wq;
    double *q8 = NULL;
    if (st == TW_OK && wp && (wp->products & TW_PRODUCT_EMB_RASTER) &&
        wp->emb_type == TW_EMB_INT8) {
        wq = *wp;
        st = int8_ranges(pt, spans, used, probs, has, &q8, err);
        wq.emb_scale = q8;
        wq.emb_offset = q8 ? q8 + pt->p.cell_emb : NULL;
        wp = &wq;
    }
    if (st == TW_OK && wp) st = tw_writer_create(wp, &w, err);
    if (st == TW_OK && tp) st = tw_tiletable_create(tp, &tt, err);
    if (st == TW_OK && gp) st = tw_gpkg_create(gp, &gk, err);
    char path[TW_PATH_MAX + 400];
    int buf_r0 = 0, buf_n = 0; /* rows [buf_r0, buf_r0 + buf_n) read, not written */
    for (int i = 0; st == TW_OK && i < used; i++) {
        FILE *f = open_rows(pt, &spans[i], path, sizeof path, err);
        if (!f) {
            st = TW_ERR_INPUT;
            break;
        }
        /* Rows go to the writer in batches of batch_rows from row 0 on,
         * whatever the chunks: the GeoTIFF's bytes (where a block lands,
         * when it is compressed) then do not depend on where the chunks
         * were cut (checkpoints cut them at times, not rows). */
        for (int r = spans[i].r0; st == TW_OK && r < spans[i].r1; r++) {
            if (fread(probs + (size_t)buf_n * W * C, sizeof(float), W * C, f) != W * C ||
                fread(has + (size_t)buf_n * W, 1, W, f) != W) {
                st = tw_error_set(err, TW_ERR_INPUT, "%s is truncated", path);
                break;
            }
            if (++buf_n == batch_rows || r + 1 == H) {
                st = assemble_rows(w, buf_r0, buf_n, probs, has, W, C, K, hist, nodata_cells, err);
                buf_r0 += buf_n;
                buf_n = 0;
            }
        }
        fclose(f);
        if (st != TW_OK || (!tt && !gk)) continue;
        st = copy_tiles(pt, &spans[i], tt, gk, K, &tbuf, path, sizeof path, err);
    }
    if (st == TW_OK && w) st = tw_writer_finish(w, err);
    if (st == TW_OK && tt) st = tw_tiletable_finish(tt, err);
    if (st == TW_OK && gk) st = tw_gpkg_finish(gk, err);
    tw_writer_destroy(w);
    tw_tiletable_destroy(tt);
    tw_gpkg_destroy(gk);
    tw_free(probs);
    tw_free(has);
    tw_free(tbuf);
    tw_free(spans);
    tw_free(q8);
    return st;
}
