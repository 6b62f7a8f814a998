/* parts.c - the chunk store of a run's parts under OUT/.tilewise/<stem>/:
 * locks, the fingerprint check, journals, chunks with their checksums,
 * checkpoints, listing and removal (see parts.h). The products are
 * assembled from it in assemble.c. */
#include "pipeline/store/parts.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "pipeline/store/parts_internal.h"

#define CHUNK_MAGIC "TWCHUNK1"
#define TILES_MAGIC "TWTILES1"
#define STATE_MAGIC "TWSTATE1"
#define FNV_OFFSET 1469598103934665603ULL
#define FNV_PRIME 1099511628211ULL

typedef struct state_header {
    char magic[8];
    int32_t r0, row_end, ty, tx, grid_w, n_classes, k, feat_dim;
    int64_t n_tiles;
    uint64_t fnv;
} state_header;

static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= FNV_PRIME;
    }
    return h;
}

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

static tw_status remove_files(const char *dir, bool only_temps, int r_begin, int r_end,
                              tw_error *err)
{
    return remove_files_ex(dir, only_temps, false, r_begin, r_end, err);
}

/* The refusal of a second run of a shard (tw_parts_open, tw_parts_probe). */
#define LOCKED_FMT                                                                                 \
    "%s: shard %d/%d of %s is being run by %s; not starting a second run of it (wait for it to "   \
    "finish, or stop it first)"

/* Remove the checkpoint states of every shard (state.*). */
static void remove_states(const char *dir)
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

/* ---- locks: open file description locks (F_OFD_SETLK), a record lock of
 * the whole file owned by one open() of it rather than by the process.
 * Like the classic POSIX record locks they go through the same kernel lock
 * code (NFS, Lustre), conflict with the classic locks of an older tilewise,
 * and die with their process, so a killed run never leaves a stale lock.
 * Unlike them they also exclude a second open() in the same process: two
 * threads running one output through the library (tilewise_run, the Python
 * package) exclude each other as two processes do, and closing another
 * descriptor of the file (other_lock_held, a second run's attempt) does not
 * drop the holder's lock. A kernel or file system without them (EINVAL)
 * gets the classic commands: processes still exclude each other. ---- */

/* fcntl(fd, one of the lock commands, fl), OFD first (see above). */
static int lock_fcntl(int fd, int ofd, int classic, struct flock *fl)
{
    static _Atomic int no_ofd = 0;
    if (!atomic_load(&no_ofd)) {
        fl->l_pid = 0; /* F_OFD_* require it */
        int r = fcntl(fd, ofd, fl);
        if (r == 0 || errno != EINVAL) return r;
        atomic_store(&no_ofd, 1);
    }
    return fcntl(fd, classic, fl);
}

/* What a lock file says about its holder: "pid 1234 on host node7", from
 * the file, else from F_GETLK. */
static void lock_holder(int fd, char *buf, size_t size)
{
    char text[256];
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    long pid = 0;
    char host[200] = "";
    if (n > 0) {
        text[n] = '\0';
        if (sscanf(text, "%ld %199s", &pid, host) < 1) pid = 0;
    }
    if (pid <= 0) {
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
        if (lock_fcntl(fd, F_OFD_GETLK, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK)
            pid = fl.l_pid; /* -1 for an OFD lock */
    }
    if (pid > 0 && host[0])
        snprintf(buf, size, "process %ld on host %s", pid, host);
    else if (pid > 0)
        snprintf(buf, size, "process %ld", pid);
    else
        snprintf(buf, size, "another process");
}

/* Take the lock on path: returns the open descriptor (>= 0), -1 on an
 * error (errno), -2 when another run holds it (holder says who).
 * wait: block until it is free instead. */
static int lock_take(const char *path, bool wait, char *holder, size_t hsize)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) return -1;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    while (lock_fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, wait ? F_SETLKW : F_SETLK, &fl) != 0) {
        if (errno == EINTR && wait) continue;
        int e = errno;
        if (e == EACCES || e == EAGAIN) {
            lock_holder(fd, holder, hsize);
            close(fd);
            return -2;
        }
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* Write "pid host" into a lock we hold (for the message of the next one). */
static void lock_sign(int fd)
{
    char host[128] = "";
    if (gethostname(host, sizeof host - 1) != 0 || !host[0]) snprintf(host, sizeof host, "?");
    char line[200];
    int n = snprintf(line, sizeof line, "%ld %s\n", (long)getpid(), host);
    if (ftruncate(fd, 0) == 0 && pwrite(fd, line, (size_t)n, 0) == n) (void)fsync(fd);
}

/* Is another shard's lock of this directory held (by another run)?
 * Fills who (its file and holder) when it is. */
static bool other_lock_held(const tw_parts *pt, const char *own, char *who, size_t size)
{
    DIR *d = opendir(pt->dir);
    if (!d) return false;
    struct dirent *e;
    bool held = false;
    char path[TW_PATH_MAX + 600];
    while (!held && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "lock.", 5) != 0) continue;
        snprintf(path, sizeof path, "%s/%s", pt->dir, e->d_name);
        if (strcmp(path, own) == 0) continue;
        /* (Our own lock file is skipped: with the classic locks' fallback,
         * closing any descriptor of a file drops the process's locks on it.) */
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0) continue;
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
        if (lock_fcntl(fd, F_OFD_GETLK, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK) {
            char h[256];
            lock_holder(fd, h, sizeof h);
            int sh = 0, cnt = 0;
            if (sscanf(e->d_name, "lock.%d-of-%d", &sh, &cnt) == 2)
                snprintf(who, size, "shard %d/%d is running (%s)", sh, cnt, h);
            else
                snprintf(who, size, "%.200s is held by %s", e->d_name, h);
            held = true;
        }
        close(fd);
    }
    closedir(d);
    return held;
}

/* Has any run committed a chunk here (a journal line)? */
static int committed_rows_any(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int rows = 0;
    char path[TW_PATH_MAX + 600];
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "journal.", 8) != 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        char line[256];
        int r0, r1;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "rows %d %d", &r0, &r1) == 2 && r1 > r0) rows += r1 - r0;
        fclose(f);
    }
    closedir(d);
    return rows;
}

/* One "key value" line of a fingerprint: the value of key, or NULL. */
static const char *fp_value(const char *fp, const char *key, size_t key_len, size_t *len)
{
    for (const char *l = fp; l && *l;) {
        const char *nl = strchr(l, '\n');
        size_t n = nl ? (size_t)(nl - l) : strlen(l);
        if (n > key_len && strncmp(l, key, key_len) == 0 && l[key_len] == ' ') {
            *len = n - key_len - 1;
            return l + key_len + 1;
        }
        l = nl ? nl + 1 : NULL;
    }
    return NULL;
}

int tw_parts_fingerprint_diff(const char *now, const char *stored, char *buf, size_t size)
{
    return tw_fingerprint_diff_as(now, stored, "in the parts", buf, size);
}

int tw_fingerprint_diff_as(const char *now, const char *stored, const char *stored_as, char *buf,
                           size_t size)
{
    int count = 0;
    size_t used = 0;
    if (size) buf[0] = '\0';
    for (int pass = 0; pass < 2; pass++) {
        /* pass 0: keys of now (differing or absent from stored);
         * pass 1: keys only stored has */
        const char *a = pass == 0 ? now : stored, *b = pass == 0 ? stored : now;
        for (const char *l = a; l && *l;) {
            const char *nl = strchr(l, '\n');
            size_t n = nl ? (size_t)(nl - l) : strlen(l);
            const char *sp = memchr(l, ' ', n);
            size_t kl = sp ? (size_t)(sp - l) : n;
            const char *va = sp ? sp + 1 : l + n;
            size_t la = n - (size_t)(va - l);
            size_t lb = 0;
            const char *vb = kl ? fp_value(b, l, kl, &lb) : NULL;
            bool differs =
                kl > 0 && (pass == 0 ? (!vb || lb != la || memcmp(va, vb, la) != 0) : vb == NULL);
            if (differs) {
                count++;
                int w;
                const char *vn = pass == 0 ? va : vb, *vs = pass == 0 ? vb : va;
                int ln = (int)(pass == 0 ? la : lb), ls = (int)(pass == 0 ? lb : la);
                if (ln > 80) ln = 80;
                if (ls > 80) ls = 80;
                w = snprintf(buf + used, size - used, "%s%.*s: %.*s%s now, %.*s%s %s",
                             count > 1 ? "; " : "", (int)kl, l, vn ? ln : 4, vn ? vn : "none",
                             vn && (int)(pass == 0 ? la : lb) > 80 ? "..." : "", vs ? ls : 4,
                             vs ? vs : "none", vs && (int)(pass == 0 ? lb : la) > 80 ? "..." : "",
                             stored_as);
                if (w > 0 && (size_t)w < size - used) used += (size_t)w;
            }
            l = nl ? nl + 1 : NULL;
        }
    }
    return count;
}

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
        fnv = fnv1a(fnv, buf, n);
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
            fnv = fnv1a(fnv, buf, n);
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
static void load_state(tw_parts *pt)
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
        fnv = fnv1a(fnv, buf, n);
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

/* The fingerprint stored in the parts directory: TW_OK and *out (allocated,
 * '\0'-terminated, what the file holds) when it could be read; TW_OK and
 * NULL when there is none (ENOENT); TW_ERR_PARTS with why ("cannot be
 * read: ...") when it is there but cannot be read; TW_ERR_NOMEM. */
static tw_status fingerprint_read(const char *path, char **out, char *why, size_t why_size)
{
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT) return TW_OK;
        snprintf(why, why_size, "cannot be read: %s", strerror(errno));
        return TW_ERR_PARTS;
    }
    size_t cap = TW_FINGERPRINT_MAX;
    char *buf = tw_alloc(TW_MEM_OTHER, cap + 1);
    if (!buf) {
        fclose(f);
        snprintf(why, why_size, "out of memory");
        return TW_ERR_NOMEM;
    }
    size_t got = fread(buf, 1, cap, f);
    bool bad = ferror(f) != 0;
    int e = errno;
    fclose(f);
    if (bad) {
        tw_free(buf);
        snprintf(why, why_size, "cannot be read: %s", strerror(e));
        return TW_ERR_PARTS;
    }
    buf[got] = '\0';
    *out = buf;
    return TW_OK;
}

/* What is wrong with a stored fingerprint that is not this run's, as a
 * phrase into why: its own format broken (empty, cut short, not a
 * fingerprint, a NUL inside: a damaged file says nothing about which run
 * wrote the parts) or another version; else the keys that differ. Returns
 * whether the file itself is damaged. */
static bool fingerprint_damage(const char *now, const char *old, char *why, size_t size)
{
    char head[32];
    int hl = snprintf(head, sizeof head, "tilewise-parts ");
    size_t n = strlen(old);
    int version = 0;
    char *end = NULL;
    bool has_head = strncmp(old, head, (size_t)hl) == 0;
    if (has_head) version = (int)strtol(old + hl, &end, 10);
    if (n == 0) {
        snprintf(why, size, "is empty");
        return true;
    }
    if (!has_head || !end || *end != '\n' || version < 1) {
        /* (a caller's fingerprint without the header, as tests write them:
         * compared key by key) */
        if (strchr(now, '\n') && strncmp(now, head, (size_t)hl) != 0) {
            tw_parts_fingerprint_diff(now, old, why, size);
            return false;
        }
        snprintf(why, size, "is not a tilewise parts fingerprint");
        return true;
    }
    if (version != TW_PARTS_FINGERPRINT_VERSION) {
        snprintf(why, size, "was written by another version of tilewise (format %d, this one %d)",
                 version, TW_PARTS_FINGERPRINT_VERSION);
        return false;
    }
    if (old[n - 1] != '\n' || n >= TW_FINGERPRINT_MAX) {
        snprintf(why, size, "is cut short (%zu bytes, no final line end)", n);
        return true;
    }
    tw_parts_fingerprint_diff(now, old, why, size);
    return false;
}

/* Decide what to do with the fingerprint on disk: same, replace (nothing
 * to lose), discard (--restart), or refuse. A fingerprint that is missing,
 * unreadable or damaged beside committed rows is refused like one of
 * another configuration: nothing says which run those rows are of. Called
 * under the open lock. */
static tw_status fingerprint_check(tw_parts *pt, const char *mpath, bool quiet, bool *same,
                                   tw_error *err)
{
    const tw_parts_params *p = &pt->p;
    char *old = NULL;
    char why[700] = "";
    tw_status rst = fingerprint_read(mpath, &old, why, sizeof why);
    if (rst == TW_ERR_NOMEM) return tw_error_set(err, rst, "%s: %s", mpath, why);
    *same = old && strcmp(old, p->fingerprint) == 0;
    if (*same) {
        tw_free(old);
        return TW_OK;
    }
    const bool had = old != NULL;
    int rows = committed_rows_any(pt->dir);
    bool damaged = true;
    if (rst == TW_OK && !old)
        snprintf(why, sizeof why, "is missing");
    else if (old)
        damaged = fingerprint_damage(p->fingerprint, old, why, sizeof why);
    tw_free(old);
    if (!had && rows == 0 && rst == TW_OK) return TW_OK; /* a new parts directory */
    char who[512] = "";
    bool running = !p->merge_only && other_lock_held(pt, pt->lock_path, who, sizeof who);
    char diff[1400];
    if (damaged)
        snprintf(diff, sizeof diff, "its fingerprint %.600s %.700s", mpath, why);
    else
        snprintf(diff, sizeof diff, "%s", why);
    if (p->merge_only)
        return tw_error_set(err, TW_ERR_PARTS,
                            "%s: the shards' parts do not match their manifest (%s); rerun the "
                            "shards with one configuration",
                            p->stem, diff);
    if (running)
        return tw_error_set(err, TW_ERR_PARTS,
                            "%s: %s/.tilewise/%s: %s with another configuration (%s); nothing "
                            "was deleted: run with the same configuration as the other shards",
                            p->stem, p->out_dir, p->stem, who, diff);
    if (rows == 0) return TW_OK; /* nothing committed, nobody running: nothing to lose */
    if (!p->restart && damaged)
        return tw_error_set(err, TW_ERR_PARTS,
                            "%s: %s/.tilewise/%s holds %d committed output rows, but %s: "
                            "nothing says which configuration, model and raster they are of, so "
                            "they are not resumed; nothing was deleted: add --restart to discard "
                            "them",
                            p->stem, p->out_dir, p->stem, rows, diff);
    if (!p->restart)
        return tw_error_set(err, TW_ERR_PARTS,
                            "%s: %s/.tilewise/%s holds %d committed output rows of a run with "
                            "another configuration (%s); nothing was deleted: run with the "
                            "original configuration to resume them, or add --restart to discard "
                            "them",
                            p->stem, p->out_dir, p->stem, rows, diff);
    (void)quiet; /* the log decides (the CLI drops notices with -q) */
    tw_log_printf(p->log, TW_LOG_NOTICE,
                  "%s: --restart: discarding %d committed output rows of %s (%s)", p->stem, rows,
                  damaged ? "an unknown run" : "a run with another configuration", diff);
    return remove_files(pt->dir, false, 0, 0, err);
}

bool tw_parts_shard_running(const tw_parts *pt, int k, int n, char *who, size_t size)
{
    char path[TW_PATH_MAX + 600];
    snprintf(path, sizeof path, "%s/lock.%04d-of-%04d", pt->dir, k + 1, n);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    bool held = lock_fcntl(fd, F_OFD_GETLK, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
    if (held) lock_holder(fd, who, size);
    close(fd);
    return held;
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
        if (lock_fcntl(fd, F_OFD_GETLK, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK) {
            char holder[256];
            lock_holder(fd, holder, sizeof holder);
            st = tw_error_set(err, TW_ERR_LOCKED, LOCKED_FMT, p->stem, p->shard_index + 1,
                              p->shard_count, p->out_dir, holder);
        }
        close(fd);
    }
    char mpath[TW_PATH_MAX + 400];
    snprintf(mpath, sizeof mpath, "%s/fingerprint", pt->dir);
    bool same = false;
    if (st == TW_OK) st = fingerprint_check(pt, mpath, true, &same, err);
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
        pt->lock_fd = lock_take(pt->lock_path, false, holder, sizeof holder);
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
        lock_sign(pt->lock_fd);
    }
    /* Check and write the fingerprint under a directory-wide lock, so that
     * two shards started at once with different configurations cannot both
     * find no fingerprint and write their own. */
    char opath[TW_PATH_MAX + 400];
    snprintf(opath, sizeof opath, "%s/openlock", pt->dir);
    int ofd = p->merge_only ? -1 : lock_take(opath, true, holder, sizeof holder);
    if (!p->merge_only && ofd < 0) {
        st = tw_error_set(err, TW_ERR_OUTPUT, "cannot lock %s: %s", opath, strerror(errno));
        tw_parts_close(pt);
        return st;
    }
    char mpath[TW_PATH_MAX + 400];
    snprintf(mpath, sizeof mpath, "%s/fingerprint", pt->dir);
    bool same = false;
    st = fingerprint_check(pt, mpath, quiet, &same, err);
    if (st == TW_OK && !same && p->merge_only)
        st = tw_error_set(err, TW_ERR_INPUT, "%s: the shards' parts have no fingerprint (%s)",
                          p->stem, mpath);
    if (st == TW_OK && !same) {
        /* A checkpoint counts only under the fingerprint it was taken with:
         * one left beside a replaced (or missing) fingerprint goes. */
        remove_states(pt->dir);
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
        remove_files(pt->dir, true, (int)(H * p->shard_index / p->shard_count),
                     (int)(H * (p->shard_index + 1) / p->shard_count), err);
    }
    load_journals(pt);
    if (!p->merge_only) load_state(pt);
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

static tw_status write_payload(open_file *of, const void *data, size_t n, tw_error *err)
{
    of->fnv = fnv1a(of->fnv, data, n);
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
            write_payload(&pt->rows, probs + (size_t)i * W * C, W * C * sizeof(float), err);
        if (st == TW_OK) st = write_payload(&pt->rows, has + (size_t)i * W, W, err);
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
        tw_status st = write_payload(&pt->tiles, rc, sizeof rc, err);
        if (st == TW_OK)
            st = write_payload(&pt->tiles, probs + (size_t)i * C, C * sizeof(float), err);
        if (st == TW_OK && F)
            st = write_payload(&pt->tiles, emb + (size_t)i * F, F * sizeof(float), err);
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
            tw_status st = write_payload(of, buf, (size_t)got, err);
            if (st != TW_OK) return st;
        } else {
            *fnv = fnv1a(*fnv, buf, (size_t)got);
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
                              const uint32_t *count, tw_error *err)
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
    h.fnv = fnv1a(fnv1a(h.fnv, sum, sum_bytes), count, cells * sizeof(uint32_t));
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

tw_status tw_parts_state_restore(tw_parts *pt, float *sum, uint32_t *count, tw_error *err)
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
