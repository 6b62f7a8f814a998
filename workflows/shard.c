/* shard.c - --shard I/N, --shard auto[/N] and SLURM's array (see shard.h) */
#include "workflows/shard.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A whole decimal number in lo..hi; false for anything else. */
static bool whole(const char *s, long lo, long hi, long *out)
{
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*end || errno || v < lo || v > hi) return false;
    *out = v;
    return true;
}

typedef struct source {
    const char *name;      /* for messages and *from */
    const char *index_var; /* the task's index */
    long first;            /* the index the first task gets, as documented */
    const char *count_var; /* the array's size, or NULL: from auto/N */
    const char *help;      /* how to give the count when the system does not */
} source;

static const source k_sources[] = {
    {"SLURM", "SLURM_ARRAY_TASK_ID", 0, "SLURM_ARRAY_TASK_COUNT", NULL},
    {"AWS Batch", "AWS_BATCH_JOB_ARRAY_INDEX", 0, "AWS_BATCH_JOB_ARRAY_SIZE", NULL},
    {"Kubernetes", "JOB_COMPLETION_INDEX", 0, NULL, "the Job's completions"},
    {"PBS", "PBS_ARRAY_INDEX", 1, NULL, "the N of qsub -J 1-N"},
    {"LSF", "LSB_JOBINDEX", 1, NULL, "the N of bsub -J \"name[1-N]\""},
};
#define N_SOURCES ((int)(sizeof k_sources / sizeof k_sources[0]))

/* The shard of one array task of source s; want_count > 0 from auto/N. */
static int from_source(const source *s, tw_shard_getenv get, void *user, long want_count,
                       int *index, int *count, char *msg, size_t msg_size)
{
    const char *iv = get(s->index_var, user);
    long i, n = want_count, first = s->first, step = 1;
    if (!whole(iv, 0, INT_MAX, &i)) {
        snprintf(msg, msg_size, "%s=%s is not an array index (expected a whole number)",
                 s->index_var, iv);
        return -1;
    }
    if (strcmp(s->name, "SLURM") == 0) {
        /* --array=3-9:2: ids 3, 5, 7, 9 are tasks 0..3 */
        const char *mv = get("SLURM_ARRAY_TASK_MIN", user);
        const char *sv = get("SLURM_ARRAY_TASK_STEP", user);
        if (mv && !whole(mv, 0, INT_MAX, &first)) {
            snprintf(msg, msg_size, "SLURM_ARRAY_TASK_MIN=%s is not a number", mv);
            return -1;
        }
        if (sv && !whole(sv, 1, INT_MAX, &step)) {
            snprintf(msg, msg_size, "SLURM_ARRAY_TASK_STEP=%s is not a step", sv);
            return -1;
        }
    }
    if (s->count_var) {
        const char *cv = get(s->count_var, user);
        long c;
        if (cv && !whole(cv, 1, INT_MAX, &c)) {
            snprintf(msg, msg_size, "%s=%s is not a count", s->count_var, cv);
            return -1;
        }
        if (cv && want_count > 0 && c != want_count) {
            snprintf(msg, msg_size, "--shard auto/%ld, but %s says the array has %ld tasks",
                     want_count, s->count_var, c);
            return -1;
        }
        if (cv) n = c;
    }
    if (n <= 0) {
        snprintf(msg, msg_size,
                 "--shard auto: %s sets %s but not the array's size: give it as --shard auto/N "
                 "(N = %s)",
                 s->name, s->index_var, s->help ? s->help : "the number of tasks");
        return -1;
    }
    if (i < first || (i - first) % step != 0 || (i - first) / step >= n) {
        snprintf(msg, msg_size,
                 "%s=%s is outside an array of %ld tasks numbered from %ld%s (--shard I/N "
                 "names a shard directly)",
                 s->index_var, iv, n, first, step > 1 ? " with a step" : "");
        return -1;
    }
    *index = (int)((i - first) / step);
    *count = (int)n;
    return 0;
}

/* Whether the LSF variable names an array task: LSF sets LSB_JOBINDEX=0 for
 * a job that is not one. */
static bool is_array_index(const source *s, const char *v)
{
    return v && !(strcmp(s->name, "LSF") == 0 && strcmp(v, "0") == 0);
}

bool tw_shard_array_task(tw_shard_getenv get, void *user, char *what, size_t what_size)
{
    for (int s = 0; s < N_SOURCES; s++) {
        const char *v = get(k_sources[s].index_var, user);
        if (!is_array_index(&k_sources[s], v)) continue;
        snprintf(what, what_size, "%s array task (%s=%s)", k_sources[s].name,
                 k_sources[s].index_var, v);
        return true;
    }
    if (what_size) what[0] = '\0';
    return false;
}

/* --shard auto[/N]: the first batch system whose array index is set decides;
 * any other that also sets one must name the same shard, or the task would
 * run a shard that one of them does not mean. */
static int from_auto(long want, tw_shard_getenv get, void *user, int *index, int *count,
                     const char **from, char *msg, size_t msg_size)
{
    int first = -1;
    for (int s = 0; s < N_SOURCES; s++) {
        if (!is_array_index(&k_sources[s], get(k_sources[s].index_var, user))) continue;
        int i, n;
        char why[256];
        if (from_source(&k_sources[s], get, user, want, &i, &n, why, sizeof why) != 0) {
            if (first < 0) {
                snprintf(msg, msg_size, "%s", why);
                return -1;
            }
            snprintf(msg, msg_size,
                     "--shard auto: %s and %s both set an array index, and %s's cannot be "
                     "read (%s); unset one, or give --shard I/N",
                     k_sources[first].name, k_sources[s].name, k_sources[s].name, why);
            return -1;
        }
        if (first < 0) {
            first = s;
            *index = i;
            *count = n;
            *from = k_sources[s].name;
            continue;
        }
        if (i != *index || n != *count) {
            snprintf(msg, msg_size,
                     "--shard auto: %s says shard %d/%d (%s=%s) but %s says %d/%d (%s=%s); "
                     "unset one, or give --shard I/N",
                     k_sources[first].name, *index + 1, *count, k_sources[first].index_var,
                     get(k_sources[first].index_var, user), k_sources[s].name, i + 1, n,
                     k_sources[s].index_var, get(k_sources[s].index_var, user));
            *index = 0;
            *count = 1;
            *from = "none";
            return -1;
        }
    }
    if (first >= 0) return 0;
    snprintf(msg, msg_size,
             "--shard auto: no array index in the environment (SLURM_ARRAY_TASK_ID, "
             "AWS_BATCH_JOB_ARRAY_INDEX, JOB_COMPLETION_INDEX, PBS_ARRAY_INDEX, "
             "LSB_JOBINDEX); run it as an array task, or give --shard I/N");
    return -1;
}

int tw_shard_resolve(const char *arg, tw_shard_getenv get, void *user, int *index, int *count,
                     const char **from, char *msg, size_t msg_size)
{
    *index = 0;
    *count = 1;
    *from = "none";
    if (msg_size) msg[0] = '\0';
    /* no --shard: a whole run, also inside an array task (one scene per
     * task is the common job script; tw_shard_array_task lets the caller
     * say so) */
    if (!arg) return 0;
    long want = 0;
    if (strncmp(arg, "auto", 4) == 0 && (arg[4] == '\0' || arg[4] == '/')) {
        if (arg[4] == '/' && !whole(arg + 5, 1, INT_MAX, &want)) {
            snprintf(msg, msg_size, "--shard auto/N expects a count N >= 1, got '%s'", arg);
            return -1;
        }
        int rc = from_auto(want, get, user, index, count, from, msg, msg_size);
        if (rc != 0) {
            *index = 0;
            *count = 1;
            *from = "none";
        }
        return rc;
    }
    long i, n;
    const char *slash = strchr(arg, '/');
    char ibuf[32];
    if (slash && (size_t)(slash - arg) < sizeof ibuf) {
        snprintf(ibuf, sizeof ibuf, "%.*s", (int)(slash - arg), arg);
        if (whole(ibuf, 1, INT_MAX, &i) && whole(slash + 1, 1, INT_MAX, &n) && i <= n) {
            *index = (int)(i - 1);
            *count = (int)n;
            *from = "--shard";
            return 0;
        }
    }
    snprintf(msg, msg_size, "--shard expects I/N with 1 <= I <= N, auto or auto/N, got '%s'", arg);
    return -1;
}
