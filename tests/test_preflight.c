/* test_preflight.c - checks before the first tile (pipeline/run/preflight.c),
 * the parts' fingerprint comparison and lock (pipeline/store/parts.c), and the
 * memory breakdown that adds up (pipeline/engine/budget.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pipeline/engine/budget.h"
#include "pipeline/store/parts.h"
#include "pipeline/run/preflight.h"
#include "testutil.h"

static tw_status check_opts(tw_format f, const char *a, const char *b, tw_error *err)
{
    char opts[2][128];
    int n = 0;
    if (a) snprintf(opts[n++], 128, "%s", a);
    if (b) snprintf(opts[n++], 128, "%s", b);
    tw_error_init(err);
    return tw_preflight_creation_options(f, (const char(*)[128])opts, n, err);
}

static void creation_options(void **state)
{
    (void)state;
    tw_error err;
    assert_int_equal(check_opts(TW_FORMAT_GTIFF, "COMPRESS=ZSTD", "PREDICTOR=2", &err), TW_OK);
    assert_int_equal(check_opts(TW_FORMAT_GTIFF, "compress=deflate", NULL, &err), TW_OK);
    assert_int_equal(check_opts(TW_FORMAT_COG, "BLOCKSIZE=256", "COMPRESS=ZSTD", &err), TW_OK);

    assert_int_equal(check_opts(TW_FORMAT_GTIFF, "COMPRES=ZSTD", NULL, &err), TW_ERR_CONFIG);
    assert_non_null(strstr(err.msg, "COMPRES is not a creation option of GDAL's GTiff driver"));
    assert_non_null(strstr(err.msg, "did you mean COMPRESS?"));

    assert_int_equal(check_opts(TW_FORMAT_GTIFF, "BLOCKSIZE=256", NULL, &err), TW_ERR_CONFIG);
    assert_non_null(strstr(err.msg, "BLOCKSIZE"));

    assert_int_equal(check_opts(TW_FORMAT_GTIFF, "COMPRESS=ZSTDX", NULL, &err), TW_ERR_CONFIG);
    assert_non_null(strstr(err.msg, "COMPRESS=ZSTDX"));
    assert_non_null(strstr(err.msg, "DEFLATE"));

    assert_int_equal(check_opts(TW_FORMAT_COG, "COMPRESS=ZSTDX", NULL, &err), TW_ERR_CONFIG);
    assert_non_null(strstr(err.msg, "COG"));

    assert_int_equal(check_opts(TW_FORMAT_GTIFF, "ZLEVEL=abc", NULL, &err), TW_ERR_CONFIG);
    assert_non_null(strstr(err.msg, "ZLEVEL"));

    assert_int_equal(check_opts(TW_FORMAT_GTIFF, "COMPRESS", NULL, &err), TW_ERR_CONFIG);
    assert_non_null(strstr(err.msg, "not KEY=VALUE"));
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void weights_pickle(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    tw_error err;
    char zip[512], pkl[512], h5[512];
    snprintf(zip, sizeof zip, "%s/model.pth", dir);
    snprintf(pkl, sizeof pkl, "%s/model.pt", dir);
    snprintf(h5, sizeof h5, "%s/model.h5", dir);
    write_file(zip, "PK\x03\x04rest", 8);
    write_file(pkl, "\x80\x02}q\x00", 5);
    write_file(h5, "\x89HDF\r\n\x1a\n", 8);
    tw_error_init(&err);
    assert_int_equal(tw_preflight_weights(zip, &err), TW_ERR_MODEL);
    assert_non_null(strstr(err.msg, "tools/export_model.py"));
    assert_non_null(strstr(err.msg, "model.pth"));
    tw_error_init(&err);
    assert_int_equal(tw_preflight_weights(pkl, &err), TW_ERR_MODEL);
    assert_non_null(strstr(err.msg, "pickle"));
    tw_error_init(&err);
    assert_int_equal(tw_preflight_weights(h5, &err), TW_OK);
    /* the fixture torch.save wrote, when there */
    const char *fx = tw_test_fixtures();
    if (fx && tw_test_file_exists(tw_test_path(fx, "resnet18_6b_7c.pth"))) {
        tw_error_init(&err);
        assert_int_equal(tw_preflight_weights(tw_test_path(fx, "resnet18_6b_7c.pth"), &err),
                         TW_ERR_MODEL);
    }
}

static tw_status output_check(const char *dir, unsigned products, tw_preflight_warnings *w,
                              tw_error *err)
{
    tw_run_params p = tw_run_default_params();
    snprintf(p.output.dir, sizeof p.output.dir, "%s", dir);
    p.output.products = products;
    int wd = 1000, ht = 800;
    char stems[1][256] = {"scene"};
    tw_preflight_params pp = {.run = &p,
                              .n_classes = 4,
                              .feat_dim = 512,
                              .tile = 64,
                              .stride = 32,
                              .n_inputs = 1,
                              .width = &wd,
                              .height = &ht,
                              .stems = (const char(*)[256])stems};
    tw_error_init(err);
    return tw_preflight_output(&pp, w, err);
}

static void output_dir(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    char path[512];
    tw_preflight_warnings w;
    tw_error err;
    /* missing but creatable: fine, and nothing is created */
    snprintf(path, sizeof path, "%s/a/b/c", dir);
    assert_int_equal(output_check(path, TW_PRODUCT_CLASS, &w, &err), TW_OK);
    snprintf(path, sizeof path, "%s/a", dir);
    assert_false(tw_test_file_exists(path));
    /* a file */
    snprintf(path, sizeof path, "%s/afile", dir);
    write_file(path, "x", 1);
    assert_int_equal(output_check(path, TW_PRODUCT_CLASS, &w, &err), TW_ERR_OUTPUT);
    assert_non_null(strstr(err.msg, "afile exists and is not a directory"));
    snprintf(path, sizeof path, "%s/afile/sub", dir);
    assert_int_equal(output_check(path, TW_PRODUCT_CLASS, &w, &err), TW_ERR_OUTPUT);
    assert_non_null(strstr(err.msg, "is a file, not a directory"));
    /* a product path taken by a directory */
    snprintf(path, sizeof path, "%s/scene.prob.tif", dir);
    assert_int_equal(mkdir(path, 0777), 0);
    assert_int_equal(output_check(dir, TW_PRODUCT_CLASS, &w, &err), TW_OK);
    assert_int_equal(output_check(dir, TW_PRODUCT_PROB, &w, &err), TW_ERR_OUTPUT);
    assert_non_null(strstr(err.msg, "scene.prob.tif exists and is a directory"));
}

/* A directory access() calls writable where nothing can be created: /proc
 * for root (the old check said ok and the run then exited 4 at its first
 * mkdir), and for anyone else too. The check leaves nothing behind. */
static void output_dir_unwritable(void **state)
{
    (void)state;
    struct stat sb;
    if (stat("/proc/self", &sb) != 0) skip(); /* no procfs here */
    tw_preflight_warnings w;
    tw_error err;
    assert_int_equal(output_check("/proc", TW_PRODUCT_CLASS, &w, &err), TW_ERR_OUTPUT);
    assert_non_null(strstr(err.msg, "output.dir: /proc"));
    assert_int_equal(output_check("/proc/tilewise-out", TW_PRODUCT_CLASS, &w, &err), TW_ERR_OUTPUT);
    assert_non_null(strstr(err.msg, "/proc/tilewise-out"));
    /* a writable one passes and keeps no probe */
    const char *dir = tw_test_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/probed", dir);
    assert_int_equal(mkdir(path, 0777), 0);
    assert_int_equal(output_check(path, TW_PRODUCT_CLASS, &w, &err), TW_OK);
    assert_int_equal(rmdir(path), 0); /* empty: nothing was left in it */
}

static void output_bytes(void **state)
{
    (void)state;
    tw_run_params p = tw_run_default_params();
    p.output.products = TW_PRODUCT_CLASS | TW_PRODUCT_PROB;
    int wd = 640, ht = 320;
    tw_preflight_params pp = {.run = &p,
                              .n_classes = 4,
                              .tile = 64,
                              .stride = 32,
                              .n_inputs = 1,
                              .width = &wd,
                              .height = &ht};
    /* 20 x 10 cells: class 1 + prob 4*4 + mask 1 + chunks 4*4 + 1 bytes each */
    assert_int_equal(tw_preflight_output_bytes(&pp), 200 * (1 + 17 + 17));
    /* output.resolution: input: the rasters on the 640 x 320 input pixels
     * (class 1 + prob 17 each), the cells' float32 probabilities (4*4) and
     * the chunks (17) per cell. The old estimate counted cells only: 32x
     * too small at stride 32, so a full disk went unwarned. */
    p.output.resolution = TW_RESOLUTION_INPUT;
    assert_int_equal(tw_preflight_output_bytes(&pp), 640 * 320 * (1 + 17) + 200 * (16 + 17));
    p.output.prob_type = TW_PROB_UINT8;
    p.output.products = TW_PRODUCT_CLASS | TW_PRODUCT_PROB | TW_PRODUCT_CONF;
    assert_int_equal(tw_preflight_output_bytes(&pp), 640 * 320 * (1 + 5 + 4) + 200 * (16 + 17));
    wd = 0; /* a skipped input writes nothing */
    assert_int_equal(tw_preflight_output_bytes(&pp), 0);
}

/* The padded share of an input's tiles, which validate warns about above
 * one half (issue 29: a 41 x 41 raster in tiles of 64 is 59 % padding).
 * Exact fractions of pixel counts, compared to 1e-12. */
static void padding_share(void **state)
{
    (void)state;
    /* 41 x 41 in one 64 px tile */
    assert_float_equal(tw_preflight_padding(41, 41, 64, 64, TW_EDGE_PAD), 1 - 41.0 * 41 / 4096,
                       1e-12);
    /* the sample, 349 x 352: at tile 64 stride 64, 6 x 6 tiles with 349 and
     * 352 of 384 px inside: 17 %; at stride 32, 10 x 10 tiles, x inside
     * 9 * 64 + 61, y all: 0.5 % */
    assert_float_equal(tw_preflight_padding(349, 352, 64, 64, TW_EDGE_PAD),
                       1 - (349.0 * 352) / (384.0 * 384), 1e-12);
    assert_float_equal(tw_preflight_padding(349, 352, 64, 32, TW_EDGE_PAD), 1 - 637.0 / 640, 1e-12);
    /* 65 x 65: two tiles per axis, 65 of 128 px inside */
    assert_float_equal(tw_preflight_padding(65, 65, 64, 64, TW_EDGE_PAD),
                       1 - (65.0 * 65) / (128.0 * 128), 1e-12);
    /* edge shift: the last tile flush with the edge, no padding */
    assert_float_equal(tw_preflight_padding(65, 65, 64, 64, TW_EDGE_SHIFT), 0, 1e-12);
    /* shift falls back to pad when the raster is smaller than a tile */
    assert_float_equal(tw_preflight_padding(41, 41, 64, 64, TW_EDGE_SHIFT), 1 - 41.0 * 41 / 4096,
                       1e-12);
    /* exactly half: 32 of 64 columns, every row */
    assert_float_equal(tw_preflight_padding(32, 640, 64, 64, TW_EDGE_PAD), 0.5, 1e-12);
    /* no plan: edge skip on a raster smaller than a tile */
    assert_float_equal(tw_preflight_padding(41, 41, 64, 64, TW_EDGE_SKIP), -1, 0);
}

static void fingerprint_diff(void **state)
{
    (void)state;
    char buf[512];
    const char *a = "tilewise-parts 5\ntiling.tile 64\ntiling.stride 32\nmodel.mean 1 2\n";
    const char *b = "tilewise-parts 5\ntiling.tile 64\ntiling.stride 16\nmodel.mean 1 2\n"
                    "extra 1\n";
    assert_int_equal(tw_parts_fingerprint_diff(a, a, buf, sizeof buf), 0);
    assert_string_equal(buf, "");
    assert_int_equal(tw_parts_fingerprint_diff(a, b, buf, sizeof buf), 2);
    assert_string_equal(buf,
                        "tiling.stride: 32 now, 16 in the parts; extra: none now, 1 in the parts");
    /* a small buffer truncates, never overflows */
    char small[16];
    assert_int_equal(tw_parts_fingerprint_diff(a, b, small, sizeof small), 2);
    assert_true(strlen(small) < sizeof small);
}

static tw_parts_params parts_params(const char *dir, const char *fp, int shard, int count)
{
    return (tw_parts_params){.out_dir = dir,
                             .stem = "scene",
                             .fingerprint = fp,
                             .grid_w = 4,
                             .grid_h = 8,
                             .n_classes = 2,
                             .shard_index = shard,
                             .shard_count = count};
}

static void commit_rows(tw_parts *pt, int r0, int r1)
{
    tw_error err;
    tw_error_init(&err);
    float probs[8 * 4 * 2] = {0};
    uint8_t has[8 * 4];
    memset(has, 1, sizeof has);
    assert_int_equal(tw_parts_chunk_begin(pt, r0, r1, &err), TW_OK);
    assert_int_equal(tw_parts_chunk_rows(pt, r0, r1 - r0, probs, has, &err), TW_OK);
    assert_int_equal(tw_parts_chunk_commit(pt, &err), TW_OK);
}

static void parts_refuse_and_lock(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    const char *fp1 = "tilewise-parts 5\ntiling.stride 32\n";
    const char *fp2 = "tilewise-parts 5\ntiling.stride 16\n";
    tw_error err;
    tw_parts *pt = NULL;
    tw_parts_params pp = parts_params(dir, fp1, 0, 2);
    tw_error_init(&err);
    assert_int_equal(tw_parts_open(&pp, true, &pt, &err), TW_OK);
    commit_rows(pt, 0, 4);

    /* the same shard from another process: locked, naming our pid */
    pid_t child = fork();
    if (child == 0) {
        tw_parts *p2 = NULL;
        tw_error e2;
        tw_error_init(&e2);
        tw_status st = tw_parts_open(&pp, true, &p2, &e2);
        char want[64];
        snprintf(want, sizeof want, "process %ld on host", (long)getppid());
        _exit(st == TW_ERR_LOCKED && strstr(e2.msg, want) ? 0 : 1);
    }
    int wst = 0;
    waitpid(child, &wst, 0);
    assert_true(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);

    /* shard 2 with another configuration while shard 1 runs: refused */
    tw_parts_params pp2 = parts_params(dir, fp2, 1, 2);
    child = fork();
    if (child == 0) {
        tw_parts *p2 = NULL;
        tw_error e2;
        tw_error_init(&e2);
        tw_status st = tw_parts_open(&pp2, true, &p2, &e2);
        _exit(st == TW_ERR_PARTS && strstr(e2.msg, "shard 1/2 is running") ? 0 : 1);
    }
    waitpid(child, &wst, 0);
    assert_true(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
    tw_parts_close(pt);

    /* shard 1 finished: the other configuration is still refused, with the
     * rows it would lose; --restart discards them */
    tw_error_init(&err);
    assert_int_equal(tw_parts_open(&pp2, true, &pt, &err), TW_ERR_PARTS);
    assert_non_null(strstr(err.msg, "holds 4 committed output rows"));
    assert_non_null(strstr(err.msg, "tiling.stride: 16 now, 32 in the parts"));
    char chunk[512];
    snprintf(chunk, sizeof chunk, "%s/.tilewise/scene/rows-0000000-0000004.bin", dir);
    assert_true(tw_test_file_exists(chunk));
    pp2.restart = true;
    tw_error_init(&err);
    assert_int_equal(tw_parts_open(&pp2, true, &pt, &err), TW_OK);
    assert_false(tw_test_file_exists(chunk));
    assert_int_equal(tw_parts_rows_done(pt), 0);
    tw_parts_close(pt);

    /* the same configuration resumes */
    tw_error_init(&err);
    assert_int_equal(tw_parts_open(&pp2, true, &pt, &err), TW_OK);
    commit_rows(pt, 4, 8);
    tw_parts_close(pt);
    pp2.restart = false;
    tw_error_init(&err);
    assert_int_equal(tw_parts_open(&pp2, true, &pt, &err), TW_OK);
    assert_int_equal(tw_parts_rows_done(pt), 4);
    tw_parts_close(pt);
}

/* A parts folder whose fingerprint is gone or damaged beside committed
 * rows (issue 39.6): refused naming the file and why, never resumed
 * (before: a missing or unreadable one read as "no fingerprint", and the
 * rows of whatever run wrote them were resumed into another run's
 * products); --restart discards them. Damaged: missing, empty, cut short,
 * garbage, unreadable (a directory in its place). Nothing committed: a
 * missing fingerprint is a new folder, as before. */
static void parts_fingerprint_damaged(void **state)
{
    (void)state;
    const char *fp1 = "tilewise-parts 5\ntiling.stride 32\ninput.raster 64x64 uint8\n";
    static const struct {
        const char *name, *bytes, *says;
    } cases[] = {
        {"missing", NULL, "is missing"},
        {"empty", "", "is empty"},
        {"cut", "tilewise-parts 5\ntiling.str", "is cut short"},
        {"garbage", "\x89PNG\r\n\x1a\nnot a fingerprint\n", "is not a tilewise parts fingerprint"},
        {"unreadable", NULL, "cannot be read"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const char *dir = tw_test_tmpdir();
        tw_parts_params pp = parts_params(dir, fp1, 0, 1);
        tw_error err;
        tw_error_init(&err);
        tw_parts *pt = NULL;
        assert_int_equal(tw_parts_open(&pp, true, &pt, &err), TW_OK);
        commit_rows(pt, 0, 4);
        tw_parts_close(pt);
        char fp[512], chunk[512];
        snprintf(fp, sizeof fp, "%s/.tilewise/scene/fingerprint", dir);
        snprintf(chunk, sizeof chunk, "%s/.tilewise/scene/rows-0000000-0000004.bin", dir);
        assert_int_equal(unlink(fp), 0);
        if (cases[k].bytes) {
            FILE *f = fopen(fp, "wb");
            assert_non_null(f);
            fputs(cases[k].bytes, f);
            fclose(f);
        } else if (strcmp(cases[k].name, "unreadable") == 0) {
            assert_int_equal(mkdir(fp, 0755), 0);
        }
        /* the same configuration is refused too: nothing says the rows are its */
        for (int again = 0; again < 2; again++) {
            tw_error_init(&err);
            pt = NULL;
            tw_status st = tw_parts_open(&pp, true, &pt, &err);
            printf("%s: %s\n", cases[k].name, err.msg);
            assert_int_equal(st, TW_ERR_PARTS);
            assert_null(pt);
            assert_non_null(strstr(err.msg, fp));
            assert_non_null(strstr(err.msg, cases[k].says));
            assert_non_null(strstr(err.msg, "holds 4 committed output rows"));
            assert_non_null(strstr(err.msg, "--restart"));
            assert_true(tw_test_file_exists(chunk));
        }
        if (strcmp(cases[k].name, "unreadable") == 0) assert_int_equal(rmdir(fp), 0);
        pp.restart = true;
        tw_error_init(&err);
        assert_int_equal(tw_parts_open(&pp, true, &pt, &err), TW_OK);
        assert_int_equal(tw_parts_rows_done(pt), 0);
        assert_false(tw_test_file_exists(chunk));
        tw_parts_close(pt);
    }
    /* nothing committed: a missing fingerprint is a new folder */
    const char *dir = tw_test_tmpdir();
    tw_parts_params pp = parts_params(dir, fp1, 0, 1);
    tw_error err;
    tw_error_init(&err);
    tw_parts *pt = NULL;
    assert_int_equal(tw_parts_open(&pp, true, &pt, &err), TW_OK);
    tw_parts_close(pt);
    char fp[512];
    snprintf(fp, sizeof fp, "%s/.tilewise/scene/fingerprint", dir);
    assert_int_equal(unlink(fp), 0);
    assert_int_equal(tw_parts_open(&pp, true, &pt, &err), TW_OK);
    tw_parts_close(pt);
}

typedef struct open_try {
    tw_parts_params pp;
    tw_status st;
    char msg[TW_ERROR_MSG_MAX];
} open_try;

static void *open_on_thread(void *arg)
{
    open_try *t = arg;
    tw_error err;
    tw_error_init(&err);
    tw_parts *pt = NULL;
    t->st = tw_parts_open(&t->pp, true, &pt, &err);
    snprintf(t->msg, sizeof t->msg, "%s", err.msg);
    tw_parts_close(pt);
    return NULL;
}

/* The shard's lock excludes another thread of the same process as it does
 * another process (issue 39.2: it was a classic POSIX record lock, owned by
 * the process: a second thread took it again, and its close dropped the
 * first's); the failed attempt leaves the holder's lock in place. */
static void parts_lock_in_process(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    const char *fp = "tilewise-parts 5\ntiling.stride 32\n";
    tw_parts_params pp = parts_params(dir, fp, 0, 1);
    tw_error err;
    tw_error_init(&err);
    tw_parts *pt = NULL;
    assert_int_equal(tw_parts_open(&pp, true, &pt, &err), TW_OK);
    open_try t = {.pp = pp};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, open_on_thread, &t), 0);
    pthread_join(th, NULL);
    printf("second thread: %s\n", t.msg);
    assert_int_equal(t.st, TW_ERR_LOCKED);
    char want[64];
    snprintf(want, sizeof want, "process %ld on host", (long)getpid());
    assert_non_null(strstr(t.msg, want));
    /* another process is still refused: the attempt did not drop the lock */
    pid_t child = fork();
    if (child == 0) {
        tw_parts *p2 = NULL;
        tw_error e2;
        tw_error_init(&e2);
        _exit(tw_parts_open(&pp, true, &p2, &e2) == TW_ERR_LOCKED ? 0 : 1);
    }
    int wst = 0;
    waitpid(child, &wst, 0);
    assert_true(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
    tw_parts_close(pt);
    /* released: the next thread gets it */
    assert_int_equal(pthread_create(&th, NULL, open_on_thread, &t), 0);
    pthread_join(th, NULL);
    assert_int_equal(t.st, TW_OK);
}

static void budget_adds_up(void **state)
{
    (void)state;
    const size_t MiB = (size_t)1 << 20;
    tw_budget b = {.base = 42 * MiB + 123456,
                   .weights = 43 * MiB + 654321,
                   .weights_kept = 0,
                   .slots = 36 * MiB + 99999,
                   .workspace = 20 * MiB + 1,
                   .strip = 700,
                   .gdal_cache = 4 * MiB,
                   .gdal_cache_expected = 4 * MiB,
                   .margin = 16 * MiB};
    char buf[512];
    for (int kept = 0; kept < 2; kept++) {
        b.weights_kept = kept ? b.weights : 0;
        tw_budget_breakdown(&b, true, buf, sizeof buf);
        /* parse "name X MiB + ... = T MiB" and add up the tenths */
        long sum = 0, total = -1;
        for (const char *s = buf; *s;) {
            const char *mib = strstr(s, " MiB");
            if (!mib) break;
            const char *num = mib;
            while (num > buf && (num[-1] == '.' || (num[-1] >= '0' && num[-1] <= '9'))) num--;
            long whole = 0, tenth = 0;
            sscanf(num, "%ld.%ld", &whole, &tenth);
            if (num >= buf + 2 && num[-2] == '=')
                total = whole * 10 + tenth;
            else
                sum += whole * 10 + tenth;
            s = mib + 4;
        }
        assert_int_equal(sum, total);
        assert_true(total > 0);
        /* kept: the run (weights + slots + ...) is the peak; consumed: the
         * model load (twice the weights) is larger than what the run holds */
        assert_true((strstr(buf, "+ weights ") != NULL) == (kept == 1));
        assert_true((strstr(buf, "model load") != NULL) == (kept == 0));
        assert_non_null(strstr(buf, "margin"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(creation_options),
        cmocka_unit_test(weights_pickle),
        cmocka_unit_test(output_dir),
        cmocka_unit_test(output_dir_unwritable),
        cmocka_unit_test(output_bytes),
        cmocka_unit_test(padding_share),
        cmocka_unit_test(fingerprint_diff),
        cmocka_unit_test(parts_refuse_and_lock),
        cmocka_unit_test(budget_adds_up),
        cmocka_unit_test(parts_fingerprint_damaged),
        cmocka_unit_test(parts_lock_in_process),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
