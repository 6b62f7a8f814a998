/* test_shard.c - which shard a process runs (workflows/shard.h): --shard I/N,
 * --shard auto[/N] under each batch system's array variables (with the first
 * index each documents), SLURM without --shard, and one clear message for
 * every malformed or inconsistent case. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "workflows/shard.h"

/* A fake environment: "NAME=value" strings, NULL-terminated. */
static const char *fake_env(const char *name, void *user)
{
    size_t n = strlen(name);
    for (const char *const *e = user; *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=') return *e + n + 1;
    return NULL;
}

typedef struct want {
    const char *arg;
    const char *env[6];
    int rc, index, count;
    const char *from_or_msg; /* from on success, a piece of the message on failure */
} want;

static const want k_cases[] = {
    /* --shard I/N */
    {"2/5", {NULL}, 0, 1, 5, "--shard"},
    {"1/1", {NULL}, 0, 0, 1, "--shard"},
    {"3/2", {NULL}, -1, 0, 1, "expects I/N with 1 <= I <= N, auto or auto/N, got '3/2'"},
    {"0/2", {NULL}, -1, 0, 1, "got '0/2'"},
    {"1/2x", {NULL}, -1, 0, 1, "got '1/2x'"},
    {"auto/0", {NULL}, -1, 0, 1, "auto/N expects a count N >= 1"},
    /* no --shard: a whole run, inside an array task too */
    {NULL, {NULL}, 0, 0, 1, "none"},
    {NULL,
     {"SLURM_ARRAY_TASK_ID=7", "SLURM_ARRAY_TASK_COUNT=4", "SLURM_ARRAY_TASK_MIN=5", NULL},
     0,
     0,
     1,
     "none"},
    {NULL, {"JOB_COMPLETION_INDEX=3", NULL}, 0, 0, 1, "none"},
    /* two systems' indices: the same shard is fine, another is refused */
    {"auto/3",
     {"SLURM_ARRAY_TASK_ID=1", "SLURM_ARRAY_TASK_COUNT=3", "JOB_COMPLETION_INDEX=1", NULL},
     0,
     1,
     3,
     "SLURM"},
    {"auto/3",
     {"SLURM_ARRAY_TASK_ID=1", "SLURM_ARRAY_TASK_COUNT=3", "JOB_COMPLETION_INDEX=2", NULL},
     -1,
     0,
     1,
     "SLURM says shard 2/3 (SLURM_ARRAY_TASK_ID=1) but Kubernetes says 3/3 "
     "(JOB_COMPLETION_INDEX=2)"},
    {"auto",
     {"SLURM_ARRAY_TASK_ID=1", "SLURM_ARRAY_TASK_COUNT=3", "JOB_COMPLETION_INDEX=1", NULL},
     -1,
     0,
     1,
     "SLURM and Kubernetes both set an array index, and Kubernetes's cannot be read"},
    /* SLURM: ids from MIN with STEP; its count must agree with auto/N */
    {"auto",
     {"SLURM_ARRAY_TASK_ID=9", "SLURM_ARRAY_TASK_COUNT=4", "SLURM_ARRAY_TASK_MIN=3",
      "SLURM_ARRAY_TASK_STEP=2", NULL},
     0,
     3,
     4,
     "SLURM"},
    {"auto/5",
     {"SLURM_ARRAY_TASK_ID=0", "SLURM_ARRAY_TASK_COUNT=4", NULL},
     -1,
     0,
     1,
     "auto/5, but SLURM_ARRAY_TASK_COUNT says the array has 4 tasks"},
    {"auto",
     {"SLURM_ARRAY_TASK_ID=4", "SLURM_ARRAY_TASK_COUNT=4", NULL},
     -1,
     0,
     1,
     "SLURM_ARRAY_TASK_ID=4 is outside an array of 4 tasks numbered from 0"},
    /* AWS Batch: from 0, with its size */
    {"auto",
     {"AWS_BATCH_JOB_ARRAY_INDEX=0", "AWS_BATCH_JOB_ARRAY_SIZE=10", NULL},
     0,
     0,
     10,
     "AWS Batch"},
    {"auto",
     {"AWS_BATCH_JOB_ARRAY_INDEX=x1", "AWS_BATCH_JOB_ARRAY_SIZE=10", NULL},
     -1,
     0,
     1,
     "AWS_BATCH_JOB_ARRAY_INDEX=x1 is not an array index"},
    /* Kubernetes indexed Job: from 0, the count from auto/N */
    {"auto/8", {"JOB_COMPLETION_INDEX=7", NULL}, 0, 7, 8, "Kubernetes"},
    {"auto",
     {"JOB_COMPLETION_INDEX=7", NULL},
     -1,
     0,
     1,
     "Kubernetes sets JOB_COMPLETION_INDEX but not the array's size: give it as --shard "
     "auto/N (N = the Job's completions)"},
    {"auto/7", {"JOB_COMPLETION_INDEX=7", NULL}, -1, 0, 1, "outside an array of 7 tasks"},
    /* PBS Pro and LSF: from 1 */
    {"auto/3", {"PBS_ARRAY_INDEX=1", NULL}, 0, 0, 3, "PBS"},
    {"auto/3", {"PBS_ARRAY_INDEX=3", NULL}, 0, 2, 3, "PBS"},
    {"auto/3", {"PBS_ARRAY_INDEX=0", NULL}, -1, 0, 1, "numbered from 1"},
    {"auto/4", {"LSB_JOBINDEX=4", NULL}, 0, 3, 4, "LSF"},
    /* LSF sets LSB_JOBINDEX=0 outside an array: not an array task */
    {"auto/4", {"LSB_JOBINDEX=0", NULL}, -1, 0, 1, "no array index in the environment"},
    {"auto", {NULL}, -1, 0, 1, "no array index in the environment (SLURM_ARRAY_TASK_ID"},
};

/* The note a whole run gives inside an array task. */
static void array_task_named(void **state)
{
    (void)state;
    char what[128];
    const char *slurm[] = {"SLURM_ARRAY_TASK_ID=3", NULL};
    assert_true(tw_shard_array_task(fake_env, (void *)slurm, what, sizeof what));
    assert_string_equal(what, "SLURM array task (SLURM_ARRAY_TASK_ID=3)");
    const char *lsf0[] = {"LSB_JOBINDEX=0", NULL}; /* LSF outside an array */
    assert_false(tw_shard_array_task(fake_env, (void *)lsf0, what, sizeof what));
    const char *none[] = {NULL};
    assert_false(tw_shard_array_task(fake_env, (void *)none, what, sizeof what));
}

static void shard_cases(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof k_cases / sizeof k_cases[0]; c++) {
        const want *w = &k_cases[c];
        int index = -9, count = -9;
        const char *from = NULL;
        char msg[512];
        int rc = tw_shard_resolve(w->arg, fake_env, (void *)w->env, &index, &count, &from, msg,
                                  sizeof msg);
        if (rc != w->rc)
            fail_msg("case %zu (%s): rc %d, expected %d (%s)", c, w->arg ? w->arg : "none", rc,
                     w->rc, msg);
        if (rc == 0) {
            if (index != w->index || count != w->count || strcmp(from, w->from_or_msg) != 0)
                fail_msg("case %zu (%s): shard %d/%d from %s, expected %d/%d from %s", c,
                         w->arg ? w->arg : "none", index, count, from, w->index, w->count,
                         w->from_or_msg);
        } else if (!strstr(msg, w->from_or_msg)) {
            fail_msg("case %zu (%s): message '%s' lacks '%s'", c, w->arg ? w->arg : "none", msg,
                     w->from_or_msg);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(shard_cases),
                                       cmocka_unit_test(array_task_named)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
