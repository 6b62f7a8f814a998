/* parts.c - the chunk store of a run's parts under OUT/.tilewise/<stem>/:
 * opening it (under the locks and the fingerprint check), journals, chunks
 * with their checksums, listing and removal (see parts.h). The locks, the
 * fingerprint and the checkpoints are in parts_lock.c, parts_fingerprint.c
 * and parts_checkpoint.c (parts_internal.h); the products are assembled
 * from the store in assemble.c. */
#include "pipeline/store/parts.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "pipeline/store/parts_internal.h"

#define CHUNK_MAGIC "TWCHUNK1"
#define TILES_MAGIC "TWTILES1"

static bool is_lock_name(const char *name)
{
    return strncmp(name, "lock.", 5) == 0 || strcmp(name, "openlock") == 0;
}

/* Remove files of the parts directory: all of them (but the lock files,
 * unless with_locks), or only the chunk temporaries whose first row lies in
 * [r_begin, r_end) (this shard's: other shards may be writing theirs right
 * now). */
static tw_status remove_files_ex(const char *dir, bool only_temps, bool with_locks, int r_begin,
                                 int r_end, tw_error *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT
                   ? TW_OK
                   : tw_error_set(err, TW_ERR_OUTPUT, "cannot read %s: %s", dir, strerror(errno));
    struct dirent *e;
    char path[TW_PATH_MAX + 600];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (!with_locks && is_lock_name(e->d_name)) continue;
        if (only_temps) {
            size_t n = strlen(e->d_name);
            int r0, r1;
            if (!(n > 5 && strcmp(e->d_name + n - 5, ".part") == 0)) continue;
            if (sscanf(e->d_name, "rows-%d-%d", &r0, &r1) != 2 &&
                sscanf(e->d_name, "tiles-%d-%d", &r0, &r1) != 2)
                continue;
            if (r0 < r_begin || r0 >= r_end) continue;
        }
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    return TW_OK;
}

tw_status parts_remove_files(const char *dir, bool only_temps, int r_begin, int r_end,
                             tw_error *err)
{
    return remove_files_ex(dir, only_temps, false, r_begin, r_end, err);
}

/* The refusal of a second run of a shard (tw_parts_open, tw_parts_probe). */
#define LOCKED_FMT                                                                                 \
    "%s: shard %d/%d of %s is being run by %s; not starting a second run of it (wait for it to "   \
    "finish, or stop it first)"

/* Verify a chunk file against its header and checksum; true when sound. */
bool tw_parts_chunk_verify(const tw_parts *pt, int r0, int r1)
{
    char path[TW_PATH_MAX + 400];
    chunk_path(pt, "rows", r0, r1, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    chunk_header h;
    bool ok = fread(&h, sizeof h, 1, f) == 1 && memcmp(h.magic, CHUNK_MAGIC, 8) == 0 &&
              h.r0 == r0 && h.r1 == r1 && h.grid_w == pt->p.grid_w &&
              h.n_classes == (int32_t)cell_values(&pt->p);
    size_t row_bytes = (size_t)pt->p.grid_w * (cell_values(&pt->p) * sizeof(float) + 1);
    uint64_t fnv = FNV_OFFSET;
    char buf[65536];
    size_t total = 0, n;
    while (ok && (n = fread(buf, 1, sizeof buf, f)) > 0) {
        fnv = parts_fnv1a(fnv, buf, n);
        total += n;
    }
    ok = ok && !ferror(f) && total == row_bytes * (size_t)(r1 - r0) && fnv == h.fnv;
    fclose(f);
    if (ok && pt->p.tiles) {
        chunk_path(pt, "tiles", r0, r1, path, sizeof path);
        f = fopen(path, "rb");
        if (!f) return false;
        tiles_header th;
        ok = fread(&th, sizeof th, 1, f) == 1 && memcmp(th.magic, TILES_MAGIC, 8) == 0 &&
             th.r0 == r0 && th.r1 == r1 && th.n_classes == pt->p.n_classes &&
             th.feat_dim == pt->p.feat_dim;
        fnv = FNV_OFFSET;
        total = 0;
        while (ok && (n = fread(buf, 1, sizeof buf, f)) > 0) {
            fnv = parts_fnv1a(fnv, buf, n);
            total += n;
        }
        size_t rec = 8 + ((size_t)th.n_classes + (size_t)th.feat_dim) * sizeof(float);
        ok = ok && !ferror(f) && total == rec * (size_t)th.n_tiles && fnv == th.fnv;
        fclose(f);
    }
    return ok;
}

/* Read every journal in the directory; mark rows of sound chunks done. */
static void load_journals(tw_parts *pt)
{
    DIR *d = opendir(pt->dir);
    if (!d) return;
    struct dirent *e;
    char path[TW_PATH_MAX + 600];
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "journal.", 8) != 0) continue;
        snprintf(path, sizeof path, "%s/%s", pt->dir, e->d_name);
        int si = 0, sn = 0;
        if (sscanf(e->d_name, "journal.%d-of-%d", &si, &sn) == 2 && si >= 1 && si <= sn) {
            pt->journal_shards = sn;
            if (si <= 256) pt->journal_seen[(si - 1) / 32] |= 1u << ((si - 1) % 32);
        }
        FILE *f = fopen(path, "r");
        if (!f) continue;
        char line[256];
        while (fgets(line, sizeof line, f)) {
            int r0, r1;
            size_t len = strlen(line);
            /* A line cut short by a crash has no newline: not committed. */
            if (len == 0 || line[len - 1] != '\n') break;
            if (sscanf(line, "rows %d %d", &r0, &r1) != 2) continue;
            if (r0 < 0 || r1 > pt->p.grid_h || r0 >= r1 || !tw_parts_chunk_verify(pt, r0, r1)) {
                pt->rejected++;
                continue;
            }
            memset(pt->done + r0, 1, (size_t)(r1 - r0));
        }
        fclose(f);
    }
    closedir(d);
}

tw_status tw_parts_probe(const tw_parts_params *p, tw_error *err)
{
    tw_parts *pt = tw_calloc(TW_MEM_OTHER, 1, sizeof *pt);
    if (!pt) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    pt->p = *p;
    pt->p.restart = false; /* a probe never discards */
    pt->p.merge_only = false;
    pt->lock_fd = -1;
    pt->c_r0 = pt->c_r1 = -1;
    tw_status st = TW_OK;
    struct stat sb;
    if (snprintf(pt->dir, sizeof pt->dir, "%s/.tilewise/%s", p->out_dir, p->stem) >=
        (int)sizeof pt->dir)
        st = tw_error_set(err, TW_ERR_OUTPUT, "output path too long: %s", p->out_dir);
    if (st != TW_OK || stat(pt->dir, &sb) != 0) { /* no parts: nothing to refuse */
        tw_free(pt);
        return st;
    }
    snprintf(pt->lock_path, sizeof pt->lock_path, "%s/lock.%04d-of-%04d", pt->dir,
             p->shard_index + 1, p->shard_count);
    /* this shard's lock, as tw_parts_open would find it (read only: the
     * file is not created, the lock not taken) */
    int fd = open(pt->lock_path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
        if (parts_lock_fcntl(fd, F_OFD_GETLK, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK) {
            char holder[256];
            parts_lock_holder(fd, holder, sizeof holder);
            st = tw_error_set(err, TW_ERR_LOCKED, LOCKED_FMT, p->stem, p->shard_index + 1,
                              p->shard_count, p->out_dir, holder);
        }
        close(fd);
    }
    char mpath[TW_PATH_MAX + 400];
    snprintf(mpath, sizeof mpath, "%s/fingerprint", pt->dir);
    bool same = false;
    if (st == TW_OK) st = parts_fingerprint_check(pt, mpath, true, &same, err);
    tw_free(pt);
    return st;
}

tw_status tw_parts_open(const tw_parts_params *p, bool quiet, tw_parts **out, tw_error *err)
{
    *out = NULL;
    tw_parts *pt = tw_calloc(TW_MEM_OTHER, 1, sizeof *pt);
    if (!pt) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    pt->p = *p;
    pt->lock_fd = -1;
    pt->c_r0 = pt->c_r1 = -1;
    pt->done = tw_calloc(TW_MEM_OTHER, (size_t)p->grid_h + 1, 1);
    if (!pt->done) {
        tw_parts_close(pt);
        return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    if (snprintf(pt->dir, sizeof pt->dir, "%s/.tilewise/%s", p->out_dir, p->stem) >=
        (int)sizeof pt->dir) {
        tw_parts_close(pt);
        return tw_error_set(err, TW_ERR_OUTPUT, "output path too long: %s", p->out_dir);
    }
    snprintf(pt->journal, sizeof pt->journal, "%s/journal.%04d-of-%04d", pt->dir,
             p->shard_index + 1, p->shard_count);
    snprintf(pt->lock_path, sizeof pt->lock_path, "%s/lock.%04d-of-%04d", pt->dir,
             p->shard_index + 1, p->shard_count);
    snprintf(pt->state_path, sizeof pt->state_path, "%s/state.%04d-of-%04d", pt->dir,
             p->shard_index + 1, p->shard_count);
    tw_status st = tw_mkdir_p(pt->dir, err);
    if (st != TW_OK) {
        tw_parts_close(pt);
        return st;
    }
    char holder[256];
    if (!p->merge_only) {
        pt->lock_fd = parts_lock_take(pt->lock_path, false, holder, sizeof holder);
        if (pt->lock_fd == -2) {
            pt->lock_fd = -1;
            tw_parts_close(pt);
            return tw_error_set(err, TW_ERR_LOCKED, LOCKED_FMT, p->stem, p->shard_index + 1,
                                p->shard_count, p->out_dir, holder);
        }
        if (pt->lock_fd < 0) {
            st = tw_error_set(err, TW_ERR_OUTPUT, "cannot lock %s: %s", pt->lock_path,
                              strerror(errno));
            tw_parts_close(pt);
            return st;
        }
        parts_lock_sign(pt->lock_fd);
    }
    /* Check and write the fingerprint under a directory-wide lock, so that
     * two shards started at once with different configurations cannot both
     * find no fingerprint and write their own. */
    char opath[TW_PATH_MAX + 400];
    snprintf(opath, sizeof opath, "%s/openlock", pt->dir);
    int ofd = p->merge_only ? -1 : parts_lock_take(opath, true, holder, sizeof holder);
    if (!p->merge_only && ofd < 0) {
        st = tw_error_set(err, TW_ERR_OUTPUT, "cannot lock %s: %s", opath, strerror(errno));
        tw_parts_close(pt);
        return st;
    }
    char mpath[TW_PATH_MAX + 400];
    snprintf(mpath, sizeof mpath, "%s/fingerprint", pt->dir);
    bool same = false;
    st = parts_fingerprint_check(pt, mpath, quiet, &same, err);
    if (st == TW_OK && !same && p->merge_only)
        st = tw_error_set(err, TW_ERR_INPUT, "%s: the shards' parts have no fingerprint (%s)",
                          p->stem, mpath);
    if (st == TW_OK && !same) {
        /* A checkpoint counts only under the fingerprint it was taken with:
         * one left beside a replaced (or missing) fingerprint goes. */
        parts_remove_states(pt->dir);
        st = tw_write_file_atomic(mpath, p->fingerprint, strlen(p->fingerprint), err);
    }
    if (ofd >= 0) close(ofd);
    if (st != TW_OK) {
        tw_parts_close(pt);
        return st;
    }
    if (!p->merge_only) {
        /* Temporaries of a killed run of this shard. */
        int64_t H = p->grid_h;
        parts_remove_files(pt->dir, true, (int)(H * p->shard_index / p->shard_count),
                           (int)(H * (p->shard_index + 1) / p->shard_count), err);
    }
    load_journals(pt);
    if (!p->merge_only) parts_load_state(pt);
    *out = pt;
    return TW_OK;
}

void tw_parts_close(tw_parts *pt)
{
    if (!pt) return;
    tw_parts_chunk_abort(pt);
    if (pt->lock_fd >= 0) close(pt->lock_fd);
    tw_free(pt->done);
    tw_free(pt);
}

bool tw_parts_row_done(const tw_parts *pt, int row)
{
    return row >= 0 && row < pt->p.grid_h && pt->done[row];
}

int tw_parts_rows_done(const tw_parts *pt)
{
    int n = 0;
    for (int r = 0; r < pt->p.grid_h; r++) n += pt->done[r];
    return n;
}

static tw_status open_temp(tw_parts *pt, open_file *of, const char *kind, size_t header_bytes,
                           tw_error *err)
{
    chunk_path(pt, kind, pt->c_r0, pt->c_r1, of->final, sizeof of->final);
    if (snprintf(of->tmp, sizeof of->tmp, "%s.part", of->final) >= (int)sizeof of->tmp)
        return tw_error_set(err, TW_ERR_OUTPUT, "output path too long: %s", of->final);
    of->f = fopen(of->tmp, "w+b"); /* read back by a checkpoint */
    if (!of->f)
        return tw_error_set(err, TW_ERR_OUTPUT, "cannot create %s: %s", of->tmp, strerror(errno));
    of->fnv = FNV_OFFSET;
    char zero[64] = {0};
    if (fwrite(zero, 1, header_bytes, of->f) != header_bytes)
        return tw_error_set(err, TW_ERR_OUTPUT, "cannot write %s: %s", of->tmp, strerror(errno));
    return TW_OK;
}

tw_status parts_write_payload(open_file *of, const void *data, size_t n, tw_error *err)
{
    of->fnv = parts_fnv1a(of->fnv, data, n);
    if (fwrite(data, 1, n, of->f) != n)
        return tw_error_set(err, TW_ERR_OUTPUT, "cannot write %s: %s", of->tmp, strerror(errno));
    return TW_OK;
}

tw_status tw_parts_chunk_begin(tw_parts *pt, int r0, int r1, tw_error *err)
{
    TW_ASSERT(pt->c_r0 < 0);
    pt->c_r0 = r0;
    pt->c_r1 = r1;
    pt->c_next = r0;
    pt->c_tiles = 0;
    pt->mark_tiles = 0;
    pt->mark_fnv = FNV_OFFSET;
    tw_status st = open_temp(pt, &pt->rows, "rows", sizeof(chunk_header), err);
    if (st == TW_OK && pt->p.tiles)
        st = open_temp(pt, &pt->tiles, "tiles", sizeof(tiles_header), err);
    if (st != TW_OK) tw_parts_chunk_abort(pt);
    return st;
}

int tw_parts_chunk_end(const tw_parts *pt)
{
    return pt->c_r0 < 0 ? -1 : pt->c_r1;
}

tw_status tw_parts_chunk_rows(tw_parts *pt, int row, int n, const float *probs, const uint8_t *has,
                              tw_error *err)
{
    TW_ASSERT(pt->c_r0 >= 0 && row == pt->c_next && row + n <= pt->c_r1);
    const size_t W = (size_t)pt->p.grid_w, C = cell_values(&pt->p);
    for (int i = 0; i < n; i++) {
        tw_status st =
            parts_write_payload(&pt->rows, probs + (size_t)i * W * C, W * C * sizeof(float), err);
        if (st == TW_OK) st = parts_write_payload(&pt->rows, has + (size_t)i * W, W, err);
        if (st != TW_OK) return st;
    }
    pt->c_next += n;
    return TW_OK;
}

tw_status tw_parts_chunk_tiles(tw_parts *pt, int n, const int32_t *rows, const int32_t *cols,
                               const float *probs, const float *emb, tw_error *err)
{
    if (!pt->p.tiles) return TW_OK;
    const size_t C = (size_t)pt->p.n_classes, F = (size_t)pt->p.feat_dim;
    for (int i = 0; i < n; i++) {
        int32_t rc[2] = {rows[i], cols[i]};
        tw_status st = parts_write_payload(&pt->tiles, rc, sizeof rc, err);
        if (st == TW_OK)
            st = parts_write_payload(&pt->tiles, probs + (size_t)i * C, C * sizeof(float), err);
        if (st == TW_OK && F)
            st = parts_write_payload(&pt->tiles, emb + (size_t)i * F, F * sizeof(float), err);
        if (st != TW_OK) return st;
    }
    pt->c_tiles += n;
    return TW_OK;
}

static tw_status close_durable(open_file *of, const void *header, size_t header_bytes,
                               tw_error *err)
{
    bool ok =
        fseek(of->f, 0, SEEK_SET) == 0 && fwrite(header, 1, header_bytes, of->f) == header_bytes;
    ok = fflush(of->f) == 0 && ok;
    ok = fsync(fileno(of->f)) == 0 && ok;
    int e = errno;
    ok = fclose(of->f) == 0 && ok;
    of->f = NULL;
    if (!ok) return tw_error_set(err, TW_ERR_OUTPUT, "cannot write %s: %s", of->tmp, strerror(e));
    if (rename(of->tmp, of->final) != 0)
        return tw_error_set(err, TW_ERR_OUTPUT, "cannot rename %s: %s", of->tmp, strerror(errno));
    return TW_OK;
}

tw_status tw_parts_chunk_commit(tw_parts *pt, tw_error *err)
{
    TW_ASSERT(pt->c_r0 >= 0 && pt->c_next == pt->c_r1);
    chunk_header h;
    memcpy(h.magic, CHUNK_MAGIC, 8);
    h.r0 = pt->c_r0;
    h.r1 = pt->c_r1;
    h.grid_w = pt->p.grid_w;
    h.n_classes = (int32_t)cell_values(&pt->p);
    h.fnv = pt->rows.fnv;
    tw_status st = close_durable(&pt->rows, &h, sizeof h, err);
    if (st == TW_OK && pt->p.tiles) {
        tiles_header th;
        memcpy(th.magic, TILES_MAGIC, 8);
        th.r0 = pt->c_r0;
        th.r1 = pt->c_r1;
        th.n_classes = pt->p.n_classes;
        th.feat_dim = pt->p.feat_dim;
        th.n_tiles = pt->c_tiles;
        th.fnv = pt->tiles.fnv;
        st = close_durable(&pt->tiles, &th, sizeof th, err);
    }
    if (st == TW_OK) st = tw_fsync_dir(pt->dir, err);
    if (st == TW_OK) {
        /* The journal line is what makes the chunk count: written last. */
        int fd = open(pt->journal, O_WRONLY | O_CREAT | O_APPEND, 0666);
        char line[64];
        int n = snprintf(line, sizeof line, "rows %d %d\n", pt->c_r0, pt->c_r1);
        if (fd < 0 || write(fd, line, (size_t)n) != n || fsync(fd) != 0)
            st = tw_error_set(err, TW_ERR_OUTPUT, "cannot append to %s: %s", pt->journal,
                              strerror(errno));
        if (fd >= 0) close(fd);
    }
    if (st == TW_OK) {
        memset(pt->done + pt->c_r0, 1, (size_t)(pt->c_r1 - pt->c_r0));
        pt->c_r0 = pt->c_r1 = -1;
    } else {
        tw_parts_chunk_abort(pt);
    }
    return st;
}

void tw_parts_chunk_mark(tw_parts *pt)
{
    pt->mark_tiles = pt->c_tiles;
    pt->mark_fnv = pt->tiles.fnv;
}

void tw_parts_chunk_abort(tw_parts *pt)
{
    open_file *ofs[2] = {&pt->rows, &pt->tiles};
    for (int i = 0; i < 2; i++) {
        if (ofs[i]->f) {
            fclose(ofs[i]->f);
            ofs[i]->f = NULL;
            unlink(ofs[i]->tmp);
        }
    }
    pt->c_r0 = pt->c_r1 = -1;
}

tw_status tw_parts_remove(tw_parts *pt, tw_error *err)
{
    /* Everything, our lock file included (we still hold it: a run that
     * opened it meanwhile gets the lock only once we exit). */
    tw_status st = remove_files_ex(pt->dir, false, true, 0, 0, err);
    if (st != TW_OK) return st;
    rmdir(pt->dir);
    char parent[TW_PATH_MAX + 300];
    snprintf(parent, sizeof parent, "%s/.tilewise", pt->p.out_dir);
    rmdir(parent); /* only when empty: other inputs may still have parts */
    return TW_OK;
}

int tw_parts_list(const char *out_dir, char (*stems)[256], int max)
{
    char dir[TW_PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s/.tilewise", out_dir);
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < max) {
        if (e->d_name[0] == '.') continue;
        /* inputs are directories; files beside them (attempts.jsonl) are not */
        char sub[TW_PATH_MAX + 400];
        struct stat sb;
        snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
        if (stat(sub, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
        snprintf(stems[n++], 256, "%s", e->d_name);
    }
    closedir(d);
    return n;
}
