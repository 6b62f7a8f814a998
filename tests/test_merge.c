/* test_merge.c - `tilewise merge` (pipeline/run/merge.c) in process: two shards
 * of the sample raster merge to one run's bytes (class, prob, confidence);
 * a merge before the last shard has run refuses, naming the rows still
 * missing, and writes no product; a second merge of a merged folder is a
 * no-op; a folder without parts is refused, naming it. The CLI's merge is
 * the same function (e2e_parts, e2e_slurm run it through processes). */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/workflow.h"
#include "pipeline/run/merge.h"
#include "pipeline/run/run.h"
#include "testutil.h"

static const char *const k_products[] = {"class", "prob", "conf"};

/* The sample raster with the ResNet-18 fixture, tile 64 stride 32, into out,
 * as shard `shard` of `count` (count 1: one run). */
static void params(const char *out, int shard, int count, tw_run_params *p)
{
    const char *src = getenv("TW_SOURCE_DIR");
    char yaml[4096];
    snprintf(yaml, sizeof yaml,
             "input:\n  path: %s/sample_data/L7_ETMs.tif\n"
             "model:\n  weights: %s\n  mean: [79.0, 67.5, 64.4, 60.0, 80.0, 60.0]\n"
             "  std: [14.7, 16.4, 21.6, 15.0, 25.0, 20.0]\n"
             "tiling:\n  tile: 64\n  stride: 32\n"
             "runtime:\n  device: cpu\n  memory: 1GiB\n"
             "output:\n  dir: %s\n  products: [class, prob, confidence]\n",
             src, tw_test_path(tw_test_fixtures(), "resnet18_6b_7c.safetensors"), out);
    tw_error err;
    tw_error_init(&err);
    if (tw_workflow_parse("merge.yaml", yaml, strlen(yaml), NULL, 0, p, &err) != TW_OK)
        fail_msg("%s", err.msg);
    p->shard_index = shard;
    p->shard_count = count;
    p->quiet = true;
}

static void run(const char *out, int shard, int count)
{
    tw_run_params p;
    params(out, shard, count, &p);
    tw_error err;
    tw_error_init(&err);
    tw_run_result *r = NULL;
    if (tw_run(&p, NULL, &r, &err) != TW_OK) fail_msg("run %d/%d: %s", shard + 1, count, err.msg);
    tw_run_result_destroy(r);
}

static void skip_without_inputs(void)
{
    const char *src = getenv("TW_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/sample_data/L7_ETMs.tif", src ? src : "");
    if (!src || !tw_test_fixtures() ||
        !tw_test_file_exists(tw_test_path(tw_test_fixtures(), "resnet18_6b_7c.safetensors")) ||
        !tw_test_file_exists(path))
        skip();
}

static void test_shards_merge_to_one_run(void **state)
{
    (void)state;
    skip_without_inputs();
    char one[1024], shards[1024], path[1200];
    snprintf(one, sizeof one, "%s", tw_test_path(tw_test_tmpdir(), "one"));
    snprintf(shards, sizeof shards, "%s", tw_test_path(tw_test_tmpdir(), "shards"));
    run(one, 0, 1);

    /* shard 1 of 2 only: merge refuses, naming the missing rows, and
     * writes no product */
    run(shards, 0, 2);
    tw_error err;
    tw_error_init(&err);
    tw_run_result *r = NULL;
    tw_status st = tw_merge(shards, true, &r, &err);
    tw_run_result_destroy(r);
    r = NULL;
    print_message("merge of one shard: %s\n", err.msg);
    assert_int_equal(st, TW_ERR_INPUT);
    assert_non_null(strstr(err.msg, "L7_ETMs"));
    assert_non_null(strstr(err.msg, "row"));
    snprintf(path, sizeof path, "%s/L7_ETMs.class.tif", shards);
    assert_false(tw_test_file_exists(path));

    /* shard 2 of 2; a merge with its stop flag set (the CLI's SIGTERM)
     * stops, resumable (exit 75), and writes no product */
    run(shards, 1, 2);
    volatile sig_atomic_t stop = 1;
    tw_error_init(&err);
    st = tw_merge_ex(shards, true, &stop, &r, &err);
    tw_run_result_destroy(r);
    r = NULL;
    print_message("merge with stop set: %s\n", err.msg);
    assert_int_equal(st, TW_CANCELLED);
    assert_non_null(strstr(err.msg, "run the same command again"));
    assert_false(tw_test_file_exists(path));

    /* then merge: one run's bytes */
    tw_error_init(&err);
    if (tw_merge(shards, true, &r, &err) != TW_OK) fail_msg("merge: %s", err.msg);
    assert_non_null(r);
    assert_int_equal(r->n_inputs, 1);
    tw_run_result_destroy(r);
    r = NULL;
    for (size_t i = 0; i < sizeof k_products / sizeof *k_products; i++) {
        char a[1200], b[1200];
        snprintf(a, sizeof a, "%s/L7_ETMs.%s.tif", one, k_products[i]);
        snprintf(b, sizeof b, "%s/L7_ETMs.%s.tif", shards, k_products[i]);
        size_t la = 0, lb = 0;
        char *da = tw_test_read_file(a, &la), *db = tw_test_read_file(b, &lb);
        if (!da || !db) fail_msg("%s: missing (%s)", k_products[i], !da ? a : b);
        if (la != lb || memcmp(da, db, la) != 0)
            fail_msg("%s: the merged file differs from one run's (%zu vs %zu bytes)", k_products[i],
                     lb, la);
        free(da);
        free(db);
    }

    /* merged already: TW_OK, nothing to do */
    tw_error_init(&err);
    assert_int_equal(tw_merge(shards, true, &r, &err), TW_OK);
    assert_true(!r || r->n_inputs == 0);
    tw_run_result_destroy(r);
}

static void test_no_parts(void **state)
{
    (void)state;
    const char *dir = tw_test_path(tw_test_tmpdir(), "empty");
    char made[1024];
    snprintf(made, sizeof made, "mkdir -p '%s'", dir);
    assert_int_equal(system(made), 0);
    tw_error err;
    tw_error_init(&err);
    tw_run_result *r = NULL;
    tw_status st = tw_merge(dir, true, &r, &err);
    tw_run_result_destroy(r);
    print_message("merge of an empty folder: %s\n", err.msg);
    assert_int_not_equal(st, TW_OK);
    assert_non_null(strstr(err.msg, dir));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shards_merge_to_one_run),
        cmocka_unit_test(test_no_parts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
