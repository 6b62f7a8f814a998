/* parts_fingerprint.c - the parts store's fingerprint (parts.h): the
 * configuration, model and raster the committed rows are of, compared key
 * by key with this run's; what to do when it differs (resume, replace,
 * discard with --restart, or refuse). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "pipeline/store/parts_internal.h"

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
tw_status parts_fingerprint_check(tw_parts *pt, const char *mpath, bool quiet, bool *same,
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
    bool running = !p->merge_only && parts_other_lock_held(pt, pt->lock_path, who, sizeof who);
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
    return parts_remove_files(pt->dir, false, 0, 0, err);
}
