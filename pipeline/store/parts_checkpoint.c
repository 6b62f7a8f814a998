/* parts_checkpoint.c - the parts store's checkpoints (parts.h,
 * "Checkpoints"): a shard's state (the stitcher's held rows and the open
 * chunk's tile records) written durably, read back and verified, restored
 * into a reopened chunk. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/fileio.h"
#include "pipeline/store/parts_internal.h"

#define STATE_MAGIC "TWSTATE1"

typedef struct state_header {
    char magic[8];
    int32_t r0, row_end, ty, tx, grid_w, n_classes, k, feat_dim;
    int64_t n_tiles;
    uint64_t fnv;
} state_header;

/* Remove the checkpoint states of every shard (state.*). */
void parts_remove_states(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[TW_PATH_MAX + 600];
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "state.", 6) != 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
}

static size_t tile_record_bytes(const tw_parts *pt)
{
    return 8 + ((size_t)pt->p.n_classes + (size_t)pt->p.feat_dim) * sizeof(float);
}

/* Bytes of a state's sums and counts. */
static size_t state_rows_bytes(const tw_parts *pt, int k)
{
    return (size_t)k * (size_t)pt->p.grid_w * (cell_values(&pt->p) * sizeof(float) + 4);
}

/* Read and verify this shard's state: it counts when it fits this grid and
 * its row r0 is not committed (see parts.h). */
void parts_load_state(tw_parts *pt)
{
    FILE *f = fopen(pt->state_path, "rb");
    if (!f) return;
    state_header h;
    const tw_parts_params *p = &pt->p;
    bool ok = fread(&h, sizeof h, 1, f) == 1 && memcmp(h.magic, STATE_MAGIC, 8) == 0 &&
              h.grid_w == p->grid_w && h.n_classes == (int32_t)cell_values(p) &&
              h.feat_dim == p->feat_dim && h.r0 >= 0 && h.r0 < h.row_end &&
              h.row_end <= p->grid_h && h.k >= 1 && h.k <= 65536 && h.ty >= 0 && h.tx >= 0 &&
              h.n_tiles >= 0 && (p->tiles || h.n_tiles == 0) && !pt->done[h.r0];
    uint64_t fnv = FNV_OFFSET;
    char buf[65536];
    size_t total = 0, n;
    while (ok && (n = fread(buf, 1, sizeof buf, f)) > 0) {
        fnv = parts_fnv1a(fnv, buf, n);
        total += n;
    }
    ok = ok && !ferror(f) && fnv == h.fnv &&
         total == state_rows_bytes(pt, h.k) + (size_t)h.n_tiles * tile_record_bytes(pt);
    fclose(f);
    if (!ok) return;
    pt->has_state = true;
    pt->state =
        (tw_parts_state){.r0 = h.r0, .row_end = h.row_end, .ty = h.ty, .tx = h.tx, .k = h.k};
    pt->state_tiles = h.n_tiles;
}

/* Copy n bytes at offset off of file src (read with pread) to of, or to
 * the plain file dst (fnv: its running checksum) when of is NULL. */
static tw_status copy_bytes(int src, const char *src_name, off_t off, size_t n, open_file *of,
                            FILE *dst, const char *dst_name, uint64_t *fnv, tw_error *err)
{
    char buf[65536];
    while (n > 0) {
        size_t m = n < sizeof buf ? n : sizeof buf;
        ssize_t got = pread(src, buf, m, off);
        if (got <= 0)
            return tw_error_set(err, TW_ERR_OUTPUT, "cannot read %s: %s", src_name,
                                got < 0 ? strerror(errno) : "file too short");
        if (of) {
            tw_status st = parts_write_payload(of, buf, (size_t)got, err);
            if (st != TW_OK) return st;
        } else {
            *fnv = parts_fnv1a(*fnv, buf, (size_t)got);
            if (fwrite(buf, 1, (size_t)got, dst) != (size_t)got)
                return tw_error_set(err, TW_ERR_OUTPUT, "cannot write %s: %s", dst_name,
                                    strerror(errno));
        }
        off += got;
        n -= (size_t)got;
    }
    return TW_OK;
}

tw_status tw_parts_checkpoint(tw_parts *pt, const tw_parts_state *s, const float *sum,
                              const void *count, tw_error *err)
{
    const bool open = pt->c_r0 >= 0;
    TW_ASSERT(!open || (pt->c_next == s->r0 && pt->c_r0 <= s->r0 && s->r0 < pt->c_r1));
    const size_t rec = tile_record_bytes(pt);
    const off_t mark_off = (off_t)sizeof(tiles_header) + (off_t)pt->mark_tiles * (off_t)rec;
    const int64_t pending = open && pt->p.tiles ? pt->c_tiles - pt->mark_tiles : 0;
    const size_t cells = (size_t)s->k * (size_t)pt->p.grid_w;

    /* 1. The new state, durable under its temporary name. */
    char tmp[TW_PATH_MAX + 420];
    snprintf(tmp, sizeof tmp, "%s.part", pt->state_path);
    FILE *f = fopen(tmp, "w+b");
    if (!f) return tw_error_set(err, TW_ERR_OUTPUT, "cannot create %s: %s", tmp, strerror(errno));
    state_header h = {.r0 = s->r0,
                      .row_end = s->row_end,
                      .ty = s->ty,
                      .tx = s->tx,
                      .grid_w = pt->p.grid_w,
                      .n_classes = (int32_t)cell_values(&pt->p),
                      .k = s->k,
                      .feat_dim = pt->p.feat_dim,
                      .n_tiles = pending,
                      .fnv = FNV_OFFSET};
    memcpy(h.magic, STATE_MAGIC, 8);
    tw_status st = TW_OK;
    size_t sum_bytes = cells * cell_values(&pt->p) * sizeof(float);
    if (fwrite(&h, sizeof h, 1, f) != 1 || fwrite(sum, 1, sum_bytes, f) != sum_bytes ||
        fwrite(count, sizeof(uint32_t), cells, f) != cells)
        st = tw_error_set(err, TW_ERR_OUTPUT, "cannot write %s: %s", tmp, strerror(errno));
    h.fnv = parts_fnv1a(parts_fnv1a(h.fnv, sum, sum_bytes), count, cells * sizeof(uint32_t));
    if (st == TW_OK && pending > 0) {
        if (fflush(pt->tiles.f) != 0)
            st = tw_error_set(err, TW_ERR_OUTPUT, "cannot write %s: %s", pt->tiles.tmp,
                              strerror(errno));
        else
            st = copy_bytes(fileno(pt->tiles.f), pt->tiles.tmp, mark_off, (size_t)pending * rec,
                            NULL, f, tmp, &h.fnv, err);
    }
    if (st == TW_OK) {
        bool ok = fseek(f, 0, SEEK_SET) == 0 && fwrite(&h, sizeof h, 1, f) == 1;
        ok = fflush(f) == 0 && ok;
        ok = fsync(fileno(f)) == 0 && ok;
        if (!ok) st = tw_error_set(err, TW_ERR_OUTPUT, "cannot write %s: %s", tmp, strerror(errno));
    }

    /* 2. The open chunk's finished rows, committed as a shorter chunk; its
     * rest reopened from r0 with the records of row r0. */
    if (st == TW_OK && open && pt->c_next > pt->c_r0) {
        int old_r1 = pt->c_r1;
        if (pt->p.tiles) {
            bool ok = fflush(pt->tiles.f) == 0 && ftruncate(fileno(pt->tiles.f), mark_off) == 0 &&
                      fseek(pt->tiles.f, 0, SEEK_END) == 0;
            if (!ok)
                st = tw_error_set(err, TW_ERR_OUTPUT, "cannot write %s: %s", pt->tiles.tmp,
                                  strerror(errno));
            pt->tiles.fnv = pt->mark_fnv;
            pt->c_tiles = pt->mark_tiles;
        }
        pt->c_r1 = pt->c_next;
        chunk_path(pt, "rows", pt->c_r0, pt->c_r1, pt->rows.final, sizeof pt->rows.final);
        chunk_path(pt, "tiles", pt->c_r0, pt->c_r1, pt->tiles.final, sizeof pt->tiles.final);
        if (st == TW_OK) st = tw_parts_chunk_commit(pt, err);
        if (st == TW_OK) st = tw_parts_chunk_begin(pt, s->r0, old_r1, err);
        if (st == TW_OK && pending > 0)
            st = copy_bytes(fileno(f), tmp, (off_t)(sizeof h + sum_bytes + cells * 4),
                            (size_t)pending * rec, &pt->tiles, NULL, NULL, NULL, err);
        if (st == TW_OK) pt->c_tiles = pending;
    }
    bool closed = fclose(f) == 0;
    if (st == TW_OK && !closed)
        st = tw_error_set(err, TW_ERR_OUTPUT, "cannot write %s: %s", tmp, strerror(errno));

    /* 3. The state counts from its rename on. */
    if (st == TW_OK && rename(tmp, pt->state_path) != 0)
        st = tw_error_set(err, TW_ERR_OUTPUT, "cannot rename %s: %s", tmp, strerror(errno));
    if (st == TW_OK) st = tw_fsync_dir(pt->dir, err);
    if (st != TW_OK) unlink(tmp);
    return st;
}

bool tw_parts_state_get(const tw_parts *pt, tw_parts_state *out)
{
    if (pt->has_state) *out = pt->state;
    return pt->has_state;
}

tw_status tw_parts_state_restore(tw_parts *pt, float *sum, void *count, tw_error *err)
{
    TW_ASSERT(pt->has_state && (pt->state_tiles == 0 || pt->c_r0 == pt->state.r0));
    pt->has_state = false;
    FILE *f = fopen(pt->state_path, "rb");
    const size_t cells = (size_t)pt->state.k * (size_t)pt->p.grid_w;
    const size_t C = cell_values(&pt->p);
    tw_status st = TW_OK;
    if (!f || fseek(f, (long)sizeof(state_header), SEEK_SET) != 0 ||
        fread(sum, sizeof(float), cells * C, f) != cells * C ||
        fread(count, sizeof(uint32_t), cells, f) != cells)
        st = tw_error_set(err, TW_ERR_OUTPUT, "cannot read %s", pt->state_path);
    if (st == TW_OK && pt->state_tiles > 0)
        st = copy_bytes(fileno(f), pt->state_path,
                        (off_t)(sizeof(state_header) + cells * (C * sizeof(float) + 4)),
                        (size_t)pt->state_tiles * tile_record_bytes(pt), &pt->tiles, NULL, NULL,
                        NULL, err);
    if (st == TW_OK) pt->c_tiles += pt->state_tiles;
    if (f) fclose(f);
    return st;
}
