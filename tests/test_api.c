/* test_api.c - the public C API (include/tilewise.h) from inside the build,
 * so that it also runs under ASan+UBSan (the installed-library test,
 * tests/e2e_capi.py, cannot).
 *
 * Reference for classify: the plain C forward pass (model/forward_ref.c) on
 * tiles normalized here in double precision, x = (v * scale - mean) / std with
 * the bundle's values, padding/nodata = 0. Both compute in float32 with
 * different summation orders; softmax outputs of this small net agree to
 * ~1e-6, so 1e-4 is a loose bound that still catches a wrong band order,
 * mean or std (those move probabilities by > 1e-2).
 *
 * Runs (version 1 and 2 entries) go through the sample workflow; the
 * summaries are checked against run.json as jansson reads it, the stop flag
 * is set from another thread and the resumed run's rasters are compared
 * byte for byte with an uninterrupted run's.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cmocka.h>
#include <cpl_conv.h>
#include <jansson.h>

#include "io/modelfile/model_file.h"
#include "io/input/raster.h"
#include "model/backend.h"
#include "model/resnet.h"
#include "tests/testutil.h"
#include "tilewise.h"

#define SRC TW_SOURCE_DIR
#define MODEL SRC "/sample_data/demo_resnet18.h5"
#define T 64
#define BANDS 6

/* n tiles of the sample raster (Byte, 6 bands) at spread positions. */
static void fill_tiles(uint8_t *pix, int n)
{
    static const int pos[][2] = {{0, 0}, {64, 64}, {128, 0}, {200, 96}, {256, 256}, {32, 160}};
    tw_raster *r = NULL;
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_raster_open(SRC "/sample_data/L7_ETMs.tif", NULL, 0, &r, &err), TW_OK);
    uint8_t valid[T * T];
    for (int i = 0; i < n; i++) {
        int64_t nd, in;
        assert_int_equal(tw_raster_read(r, pos[i % 6][0], pos[i % 6][1], T, T,
                                        pix + (size_t)i * BANDS * T * T, valid, &nd, &in, &err),
                         TW_OK);
    }
    tw_raster_close(r);
}

static void test_classify_matches_reference(void **state)
{
    (void)state;
    const char *sets[] = {"runtime.device=cpu", "runtime.memory=256MiB", "tiling.batch=2"};
    tilewise_model *m = NULL;
    tilewise_error e;
    assert_int_equal(tilewise_model_open(MODEL, sets, 3, &m, &e), TILEWISE_OK);
    assert_int_equal(e.exit_code, 0);
    assert_string_equal(e.exit_class, "ok");
    assert_int_equal(tilewise_model_bands(m), BANDS);
    assert_int_equal(tilewise_model_tile(m), T);
    const int K = tilewise_model_classes(m), F = tilewise_model_feature_dim(m);
    assert_int_equal(K, 4);
    assert_string_equal(tilewise_model_class_name(m, 0), "water");
    assert_null(tilewise_model_class_name(m, K));
    assert_non_null(strstr(tilewise_model_info_json(m), "\"classes\":[\"water\","));

    enum { N = 5 };
    uint8_t *pix = malloc((size_t)N * BANDS * T * T);
    uint16_t *pix16 = malloc((size_t)N * BANDS * T * T * 2);
    float *probs = malloc(sizeof(float) * N * K), *probs16 = malloc(sizeof(float) * N * K);
    float *emb = malloc(sizeof(float) * N * F);
    assert_non_null(pix && pix16 && probs && probs16 && emb);
    fill_tiles(pix, N);
    /* Tile 3: 70 % nodata (value 0): above max_nodata_fraction 0.5 -> NaN. */
    memset(pix + (size_t)3 * BANDS * T * T, 0, (size_t)T * 45);
    for (int b = 0; b < BANDS; b++)
        memset(pix + ((size_t)3 * BANDS + b) * T * T, 0, (size_t)T * 45);
    for (size_t i = 0; i < (size_t)N * BANDS * T * T; i++) pix16[i] = pix[i];
    tilewise_tiles tiles = {.pixels = pix,
                            .dtype = TILEWISE_DT_BYTE,
                            .n = N,
                            .bands = BANDS,
                            .size = T,
                            .use_nodata = 1,
                            .nodata = 0};
    assert_int_equal(tilewise_model_classify(m, &tiles, probs, emb, &e), TILEWISE_OK);
    assert_true(isnan(probs[3 * K]) && isnan(emb[3 * F]));
    tiles.pixels = pix16;
    tiles.dtype = TILEWISE_DT_UINT16;
    assert_int_equal(tilewise_model_classify(m, &tiles, probs16, NULL, &e), TILEWISE_OK);
    for (int i = 0; i < N * K; i++)
        if (!isnan(probs[i])) assert_true(probs[i] == probs16[i]); /* same values, any type */

    /* The reference: the bundle's normalization, forward_ref. */
    tw_error err;
    tw_error_init(&err);
    tw_model_file *mf = NULL;
    tw_resnet *net = NULL;
    assert_int_equal(tw_model_file_load(MODEL, &mf, &err), TW_OK);
    assert_int_equal(tw_resnet_create(mf, "", &net, &err), TW_OK);
    float *x = malloc(sizeof(float) * N * BANDS * T * T);
    float *rp = malloc(sizeof(float) * N * K);
    assert_non_null(x && rp);
    for (int i = 0; i < N; i++)
        for (int b = 0; b < BANDS; b++)
            for (int p = 0; p < T * T; p++) {
                size_t at = ((size_t)i * BANDS + b) * T * T + (size_t)p;
                bool valid = true;
                for (int bb = 0; bb < BANDS; bb++)
                    if (pix[((size_t)i * BANDS + bb) * T * T + (size_t)p] == 0) valid = false;
                double v = ((double)pix[at] * mf->scale - mf->mean[b]) / mf->std[b];
                x[at] = valid ? (float)v : 0.0f;
            }
    assert_int_equal(tw_resnet_forward_ref(net, x, N, T, rp, NULL, &err), TW_OK);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        if (i == 3) continue;
        for (int c = 0; c < K; c++) worst = fmax(worst, fabs(probs[i * K + c] - rp[i * K + c]));
    }
    printf("classify vs forward_ref: max abs diff %.2e\n", worst);
    assert_true(worst <= 1e-4);

    /* The comparison has power: band 1's mean moved by a tenth of its std
     * moves the probabilities by far more than the bound. */
    char mean_set[256];
    snprintf(mean_set, sizeof mean_set, "model.mean=[%g,%g,%g,%g,%g,%g]",
             mf->mean[0] + 0.1 * mf->std[0], mf->mean[1], mf->mean[2], mf->mean[3], mf->mean[4],
             mf->mean[5]);
    const char *moved_sets[] = {"runtime.device=cpu", mean_set};
    tilewise_model *moved = NULL;
    assert_int_equal(tilewise_model_open(MODEL, moved_sets, 2, &moved, &e), TILEWISE_OK);
    tiles.pixels = pix;
    tiles.dtype = TILEWISE_DT_BYTE;
    assert_int_equal(tilewise_model_classify(moved, &tiles, probs16, NULL, &e), TILEWISE_OK);
    double moved_by = 0;
    for (int i = 0; i < N * K; i++)
        if (!isnan(probs[i])) moved_by = fmax(moved_by, fabs(probs16[i] - probs[i]));
    printf("a mean moved by std/10 moves the probabilities by %.2e\n", moved_by);
    assert_true(moved_by > 1e-3);
    tilewise_model_close(moved);

    /* Another tile size: a new reservation, same API. */
    tiles.size = 32;
    tiles.n = 1;
    tiles.dtype = TILEWISE_DT_BYTE;
    tiles.pixels = pix;
    assert_int_equal(tilewise_model_classify(m, &tiles, probs, NULL, &e), TILEWISE_OK);
    assert_true(fabs(probs[0] + probs[1] + probs[2] + probs[3] - 1.0) < 1e-5);

    free(x);
    free(rp);
    tw_resnet_destroy(net);
    tw_model_file_destroy(mf);
    free(pix);
    free(pix16);
    free(probs);
    free(probs16);
    free(emb);
    tilewise_model_close(m);
}

static void test_errors(void **state)
{
    (void)state;
    tilewise_model *m = NULL;
    tilewise_error e;
    assert_int_equal(tilewise_model_open(SRC "/nope.h5", NULL, 0, &m, &e), TILEWISE_ERR_MODEL);
    assert_null(m);
    assert_int_equal(e.exit_code, 3);
    assert_string_equal(e.exit_class, "input");
    assert_non_null(strstr(e.message, "nope.h5"));
    const char *bad[] = {"tiling.tiles=3"};
    assert_int_equal(tilewise_model_open(MODEL, bad, 1, &m, &e), TILEWISE_ERR_CONFIG);
    assert_non_null(strstr(e.message, "tiling.tiles"));
    assert_string_equal(e.exit_class, "usage");

    const char *cpu[] = {"runtime.device=cpu"};
    assert_int_equal(tilewise_model_open(MODEL, cpu, 1, &m, &e), TILEWISE_OK);
    uint8_t pix[BANDS * 32 * 32] = {0};
    float probs[8];
    tilewise_tiles t = {
        .pixels = pix, .dtype = 12 /* GDT_UInt64 */, .n = 1, .bands = BANDS, .size = 32};
    assert_int_equal(tilewise_model_classify(m, &t, probs, NULL, &e), TILEWISE_ERR_USAGE);
    assert_non_null(strstr(e.message, "not supported"));
    t.dtype = TILEWISE_DT_BYTE;
    t.bands = 3;
    assert_int_equal(tilewise_model_classify(m, &t, probs, NULL, &e), TILEWISE_ERR_USAGE);
    assert_non_null(strstr(e.message, "expects 6 input bands but the tiles have 3"));
    t.bands = BANDS;
    t.size = 16;
    assert_int_equal(tilewise_model_classify(m, &t, probs, NULL, &e), TILEWISE_ERR_USAGE);
    assert_non_null(strstr(e.message, "too small"));
    tilewise_model_close(m);
    tilewise_model_close(NULL);
    tilewise_report_free(NULL);
    assert_string_equal(tilewise_status_name(TILEWISE_CANCELLED), "interrupted");
    assert_int_equal(tilewise_exit_code(TILEWISE_ERR_NOMEM), 4);
}

/* Cancels once a third of the tiles are done: a few output rows are
 * committed by then (chunks of one row), none of the last ones. */
static int calls;
static int cancel_at_third(double complete, const char *message, void *user)
{
    (void)message;
    (void)user;
    calls++;
    return complete < 0.35;
}

static int no_cancel(double complete, const char *message, void *user)
{
    (void)complete;
    (void)message;
    (void)user;
    calls++;
    return 1;
}

static void test_run_cancel_resume(void **state)
{
    (void)state;
    char dir[2048], yaml[4096];
    snprintf(dir, sizeof dir, "%s/out", tw_test_tmpdir());
    snprintf(yaml, sizeof yaml,
             "input:\n  path: %s/sample_data/L7_ETMs.tif\nmodel:\n  weights: %s\n"
             "tiling:\n  stride: 32\n  batch: 4\nruntime:\n  device: cpu\n  memory: 1GiB\n"
             "output:\n  dir: %s\n  products: [class]\n",
             SRC, MODEL, dir);
    const char *sets[] = {"run.chunk_rows=1", "run.quiet=true"};
    tilewise_report *rep = NULL;
    tilewise_error e;
    tilewise_status st = tilewise_run_yaml("<test>", yaml, strlen(yaml), sets, 2, cancel_at_third,
                                           NULL, NULL, &rep, &e);
    assert_int_equal(st, TILEWISE_CANCELLED);
    assert_int_equal(e.exit_code, 75);
    assert_string_equal(e.exit_class, "interrupted");
    assert_non_null(strstr(e.message, "run the same command again"));
    assert_non_null(strstr(tilewise_report_json(rep), "\"status\":\"interrupted\""));
    tilewise_report_free(rep);

    st = tilewise_run_yaml("<test>", yaml, strlen(yaml), sets, 2, no_cancel, NULL, NULL, &rep, &e);
    assert_int_equal(st, TILEWISE_OK);
    const char *json = tilewise_report_json(rep);
    assert_non_null(strstr(json, "\"status\":\"ok\""));
    const char *rr = strstr(json, "\"rows_resumed\":");
    assert_non_null(rr);
    printf("rerun: %.20s\n", rr);
    assert_true(atoi(rr + strlen("\"rows_resumed\":")) > 0);
    char path[2100];
    snprintf(path, sizeof path, "%s/run.json", dir);
    assert_string_equal(tilewise_report_path(rep), path);
    tilewise_report_free(rep);

    const char *bad[] = {"run.shard=3/2"};
    st = tilewise_run_yaml("<test>", yaml, strlen(yaml), bad, 1, NULL, NULL, NULL, &rep, &e);
    assert_int_equal(st, TILEWISE_ERR_USAGE);
    assert_null(rep);
    assert_non_null(strstr(e.message, "run.shard"));
    const char *unknown[] = {"run.shards=1/2"};
    st = tilewise_run_yaml("<test>", yaml, strlen(yaml), unknown, 1, NULL, NULL, NULL, NULL, &e);
    assert_int_equal(st, TILEWISE_ERR_USAGE);
    assert_non_null(strstr(e.message, "run.shards"));
}

/* ---- version 2: tilewise_run with options ---- */

/* The sample workflow into dir: 100 tiles of 64 px at stride 32 on the
 * 6-band Landsat sample (CPU, a batch of 4, chunks of one output row). */
static void sample_yaml(char *yaml, size_t size, const char *dir)
{
    snprintf(yaml, size,
             "input:\n  path: %s/sample_data/L7_ETMs.tif\nmodel:\n  weights: %s\n"
             "tiling:\n  stride: 32\n  batch: 4\nruntime:\n  device: cpu\n  memory: 1GiB\n"
             "output:\n  dir: %s\n  products: [class, prob]\n",
             SRC, MODEL, dir);
}

/* Options for the sample workflow into a fresh DIR/out (dir[2048], yaml[4096]). */
static void sample_options(tilewise_run_options *o, char *dir, char *yaml)
{
    snprintf(dir, 2048, "%s/out", tw_test_tmpdir());
    sample_yaml(yaml, 4096, dir);
    tilewise_run_options_init(o);
    o->yaml = yaml;
    o->yaml_len = strlen(yaml);
    o->quiet = 1;
}

/* What the tiles callback saw, per input (the sample has one). */
typedef struct tiles_seen {
    int calls;
    int64_t done, total;
    bool done_decreased;
    char input[1024];
} tiles_seen;

static void on_tiles(int64_t done, int64_t total, const char *input, void *user)
{
    tiles_seen *t = user;
    if (t->calls && done < t->done) t->done_decreased = true;
    t->calls++;
    t->done = done;
    t->total = total;
    snprintf(t->input, sizeof t->input, "%s", input);
}

static json_t *report_json(const tilewise_report *rep)
{
    json_error_t jerr;
    json_t *j = json_loads(tilewise_report_json(rep), 0, &jerr);
    assert_non_null(j);
    return j;
}

static long long jint(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    assert_non_null(v);
    return json_integer_value(v);
}

/* A whole file, NUL-terminated (malloc'ed), or NULL. */
static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *s = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = 2 * cap + 8192;
            char *t = realloc(s, cap);
            if (!t) break;
            s = t;
        }
        size_t k = fread(s + n, 1, 4096, f);
        n += k;
        if (k < 4096) break;
    }
    fclose(f);
    if (s) s[n] = '\0';
    return s;
}

static void test_run_v2_tiles_and_summary(void **state)
{
    (void)state;
    assert_int_equal(tilewise_api_version(), 5);
    char dir[2048], yaml[4096];
    tiles_seen seen = {0};
    tilewise_run_options o;
    sample_options(&o, dir, yaml);
    assert_int_equal(o.size, sizeof o);
    assert_int_equal(o.shard_count, 1);
    assert_int_equal(o.cpu_gemm, -1);
    o.tiles = on_tiles; /* without progress: still called */
    o.user = &seen;
    char also[2100];
    snprintf(also, sizeof also, "%s.report.json", dir);
    o.report_path = also;
    tilewise_report *rep = NULL;
    tilewise_error e;
    assert_int_equal(tilewise_run("<v2>", &o, &rep, &e), TILEWISE_OK);
    json_t *j = report_json(rep);
    /* One rendering: run.json, the --report copy and the caller's text are
     * the same bytes (the API once wrote the file and read it back, and
     * rendered the copy again). */
    char in_dir[2100];
    snprintf(in_dir, sizeof in_dir, "%s/run.json", dir);
    char *bytes1 = read_all(in_dir), *bytes2 = read_all(also);
    assert_non_null(bytes1);
    assert_non_null(bytes2);
    assert_string_equal(bytes1, tilewise_report_json(rep));
    assert_string_equal(bytes2, tilewise_report_json(rep));
    free(bytes1);
    free(bytes2);
    unlink(also);

    /* The tiles callback: counted up to the input's tiles_total. */
    json_t *in0 = json_array_get(json_object_get(j, "inputs"), 0);
    assert_non_null(in0);
    printf("tiles callback: %d calls, last %lld/%lld; run.json tiles_total %lld\n", seen.calls,
           (long long)seen.done, (long long)seen.total, jint(in0, "tiles_total"));
    assert_true(seen.calls >= 2);
    assert_false(seen.done_decreased);
    assert_int_equal(seen.total, jint(in0, "tiles_total"));
    assert_int_equal(seen.done, seen.total);
    assert_int_equal(seen.total, 100);
    assert_non_null(strstr(seen.input, "L7_ETMs.tif"));

    /* The summaries hold run.json's numbers. */
    tilewise_run_summary s = {.size = sizeof s};
    assert_int_equal(tilewise_report_summary(rep, &s, &e), TILEWISE_OK);
    assert_int_equal(s.status, TILEWISE_OK);
    assert_int_equal(s.exit_code, jint(j, "exit_code"));
    assert_int_equal(s.n_inputs, json_array_size(json_object_get(j, "inputs")));
    assert_int_equal(s.inputs_skipped, jint(j, "inputs_skipped"));
    assert_int_equal(s.tiles_classified, jint(j, "tiles_classified"));
    assert_string_equal(s.backend, json_string_value(json_object_get(j, "backend")));
    assert_string_equal(s.output_dir, dir);
    char run_json[2100];
    snprintf(run_json, sizeof run_json, "%s/run.json", dir);
    assert_string_equal(s.run_json, run_json);
    assert_string_equal(tilewise_report_path(rep), run_json);
    assert_int_equal(s.shard_index, 0);
    assert_int_equal(s.shard_count, 1);
    json_t *classes =
        json_object_get(json_object_get(json_object_get(j, "config"), "model"), "classes");
    assert_int_equal(s.n_classes, json_array_size(classes));
    assert_int_equal(s.n_classes, 4);

    tilewise_input_summary in = {.size = sizeof in};
    assert_int_equal(tilewise_report_input(rep, 0, &in, &e), TILEWISE_OK);
    assert_string_equal(in.path, json_string_value(json_object_get(in0, "path")));
    assert_string_equal(in.skipped, "");
    assert_int_equal(in.width, jint(in0, "width"));
    assert_int_equal(in.height, jint(in0, "height"));
    assert_int_equal(in.grid_width, jint(in0, "grid_width"));
    assert_int_equal(in.grid_height, jint(in0, "grid_height"));
    assert_int_equal(in.tiles_total, jint(in0, "tiles_total"));
    assert_int_equal(in.tiles_classified, jint(in0, "tiles_classified"));
    assert_int_equal(in.tiles_nodata, jint(in0, "tiles_nodata"));
    assert_int_equal(in.tiles_read_errors, jint(in0, "tiles_read_errors"));
    assert_int_equal(in.rows_resumed, jint(in0, "rows_resumed"));
    assert_int_equal(in.nodata_cells, jint(in0, "nodata_cells"));
    int64_t cells = in.nodata_cells;
    for (int c = 0; c < s.n_classes; c++) {
        assert_string_equal(s.class_names[c], json_string_value(json_array_get(classes, c)));
        assert_int_equal(in.class_cells[c],
                         jint(json_object_get(in0, "class_cells"), s.class_names[c]));
        cells += in.class_cells[c];
    }
    assert_int_equal(cells, (int64_t)in.grid_width * in.grid_height);
    json_t *outs = json_object_get(in0, "outputs");
    assert_int_equal(in.n_outputs, json_array_size(outs));
    assert_int_equal(in.n_outputs, 2);
    for (int k = 0; k < in.n_outputs; k++) {
        assert_string_equal(in.outputs[k], json_string_value(json_array_get(outs, k)));
        assert_true(tw_test_file_exists(in.outputs[k]));
    }
    /* The knobs reach the backend: no Winograd and no GEMM convolutions
     * (TILEWISE_CPU_WINOGRAD=0, TILEWISE_CPU_GEMM=0) change what it ran. */
    char algorithms[512];
    json_t *bs = json_object_get(j, "backend_stats");
    snprintf(algorithms, sizeof algorithms, "%s",
             json_string_value(json_object_get(bs, "algorithms")));
    json_decref(j);
    tilewise_report_free(rep);
    o.cpu_winograd = 0;
    o.cpu_gemm = 0;
    o.tiles = NULL;
    assert_int_equal(tilewise_run("<v2>", &o, &rep, &e), TILEWISE_OK);
    j = report_json(rep);
    bs = json_object_get(j, "backend_stats");
    printf("default: %s\nno Winograd, no GEMM: %s\n", algorithms,
           json_string_value(json_object_get(bs, "algorithms")));
    assert_int_equal(jint(bs, "winograd_convs"), 0);
    assert_non_null(
        strstr(json_string_value(json_object_get(bs, "algorithms")), " 0 one inner product"));
    assert_string_not_equal(json_string_value(json_object_get(bs, "algorithms")), algorithms);
    json_decref(j);
    tilewise_report_free(rep);
}

/* Another thread sets the stop flag once a third of the tiles are done. */
typedef struct stopper {
    volatile sig_atomic_t *flag;
    int64_t done; /* written by the tiles callback (__atomic) */
    int64_t at;
} stopper;

static void count_tiles(int64_t done, int64_t total, const char *input, void *user)
{
    (void)total;
    (void)input;
    stopper *s = user;
    __atomic_store_n(&s->done, done, __ATOMIC_RELAXED);
}

static void *stop_thread(void *arg)
{
    stopper *s = arg;
    while (__atomic_load_n(&s->done, __ATOMIC_RELAXED) < s->at) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    __atomic_store_n(s->flag, 1, __ATOMIC_RELAXED);
    return NULL;
}

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n ? *n : 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static void test_run_v2_stop_flag_resumes(void **state)
{
    (void)state;
    char dir[2048], ref[2100], yaml[4096];
    tilewise_run_options o;
    sample_options(&o, dir, yaml);
    snprintf(ref, sizeof ref, "%s.ref", dir);
    o.chunk_rows = 1;
    tilewise_error e;
    /* The reference: uninterrupted, moved aside (the rasters name the
     * output folder in their metadata, so the runs share it). */
    assert_int_equal(tilewise_run(NULL, &o, NULL, &e), TILEWISE_OK);
    assert_int_equal(rename(dir, ref), 0);

    volatile sig_atomic_t stop = 0;
    stopper s = {.flag = &stop, .at = 34};
    o.stop = &stop;
    o.tiles = count_tiles;
    o.user = &s;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, stop_thread, &s), 0);
    tilewise_report *rep = NULL;
    tilewise_status st = tilewise_run(NULL, &o, &rep, &e);
    pthread_join(th, NULL);
    assert_int_equal(st, TILEWISE_CANCELLED);
    assert_int_equal(e.exit_code, 75);
    assert_string_equal(e.exit_class, "interrupted");
    tilewise_run_summary sum = {.size = sizeof sum};
    assert_int_equal(tilewise_report_summary(rep, &sum, &e), TILEWISE_OK);
    assert_int_equal(sum.status, TILEWISE_CANCELLED);
    assert_int_equal(sum.exit_code, 75);
    assert_non_null(strstr(tilewise_report_json(rep), "\"status\":\"interrupted\""));
    tilewise_report_free(rep);
    printf("stopped after %lld of 100 tiles\n", (long long)s.done);
    assert_true(s.done < 100);

    /* The flag stays set: the library never resets it; a rerun with it
     * cleared resumes and ends with the reference's bytes. */
    assert_int_equal(stop, 1);
    stop = 0;
    assert_int_equal(tilewise_run(NULL, &o, &rep, &e), TILEWISE_OK);
    tilewise_input_summary in = {.size = sizeof in};
    assert_int_equal(tilewise_report_input(rep, 0, &in, &e), TILEWISE_OK);
    printf("rerun: %d rows resumed\n", in.rows_resumed);
    assert_true(in.rows_resumed > 0);
    assert_int_equal(in.n_outputs, 2);
    for (int k = 0; k < in.n_outputs; k++) {
        const char *base = strrchr(in.outputs[k], '/') + 1;
        char rpath[2200];
        snprintf(rpath, sizeof rpath, "%s/%s", ref, base);
        size_t na, nb;
        unsigned char *a = slurp(in.outputs[k], &na), *b = slurp(rpath, &nb);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, na);
        printf("%s: the resumed run's %zu bytes equal the uninterrupted run's\n", base, na);
        free(a);
        free(b);
    }
    tilewise_report_free(rep);
}

static void test_run_v2_shards_and_merge(void **state)
{
    (void)state;
    char dir[2048], yaml[4096];
    tilewise_run_options o;
    sample_options(&o, dir, yaml);
    o.shard_count = 2;
    tilewise_error e;
    tilewise_report *rep = NULL;
    /* Merging before the second shard ran names what is missing. */
    assert_int_equal(tilewise_run(NULL, &o, &rep, &e), TILEWISE_OK);
    tilewise_run_summary s = {.size = sizeof s};
    assert_int_equal(tilewise_report_summary(rep, &s, &e), TILEWISE_OK);
    char path[2100];
    snprintf(path, sizeof path, "%s/run.shard0001-of-0002.json", dir);
    assert_string_equal(s.run_json, path);
    assert_int_equal(s.shard_count, 2);
    tilewise_input_summary in = {.size = sizeof in};
    assert_int_equal(tilewise_report_input(rep, 0, &in, &e), TILEWISE_OK);
    assert_int_equal(in.n_outputs, 0); /* parts only */
    tilewise_report_free(rep);
    assert_int_equal(tilewise_merge(dir, NULL, &rep, &e), TILEWISE_ERR_INPUT);
    assert_non_null(strstr(e.message, "rows"));
    tilewise_report_free(rep);

    o.shard_index = 1;
    assert_int_equal(tilewise_run(NULL, &o, NULL, &e), TILEWISE_OK);
    assert_int_equal(tilewise_merge(dir, NULL, &rep, &e), TILEWISE_OK);
    assert_string_equal(tilewise_report_json(rep), "");
    assert_int_equal(tilewise_report_summary(rep, &s, &e), TILEWISE_OK);
    assert_int_equal(s.n_inputs, 1);
    assert_string_equal(s.backend, "merge");
    assert_int_equal(tilewise_report_input(rep, 0, &in, &e), TILEWISE_OK);
    assert_int_equal(in.n_outputs, 2);
    assert_non_null(strstr(in.outputs[0], ".class.tif"));
    assert_true(tw_test_file_exists(in.outputs[0]));
    tilewise_report_free(rep);
}

static void test_run_v2_bad_arguments(void **state)
{
    (void)state;
    tilewise_run_options o;
    tilewise_run_options_init(&o);
    tilewise_error e;
    tilewise_report *rep = (tilewise_report *)&o; /* must come back NULL */
    assert_int_equal(tilewise_run(NULL, &o, &rep, &e), TILEWISE_ERR_USAGE);
    assert_null(rep);
    assert_int_equal(e.exit_code, 2);
    assert_non_null(strstr(e.message, "no workflow"));
    const char *wf = SRC "/workflows/sample.yaml";

    tilewise_run_options bad = o;
    bad.size = 0; /* not initialized */
    assert_int_equal(tilewise_run(wf, &bad, &rep, &e), TILEWISE_ERR_USAGE);
    assert_non_null(strstr(e.message, "tilewise_run_options_init"));
    bad = o;
    bad.n_sets = 1; /* sets NULL */
    assert_int_equal(tilewise_run(wf, &bad, &rep, &e), TILEWISE_ERR_USAGE);
    bad = o;
    bad.shard_index = 2;
    bad.shard_count = 2;
    assert_int_equal(tilewise_run(wf, &bad, &rep, &e), TILEWISE_ERR_USAGE);
    assert_non_null(strstr(e.message, "shard_index 2"));
    bad = o;
    bad.chunk_rows = -1;
    assert_int_equal(tilewise_run(wf, &bad, &rep, &e), TILEWISE_ERR_USAGE);
    bad = o;
    bad.cpu_nhwc = 2;
    assert_int_equal(tilewise_run(wf, &bad, &rep, &e), TILEWISE_ERR_USAGE);
    assert_non_null(strstr(e.message, "cpu_nhwc 2"));
    assert_null(rep);
    /* run.* keys are options, not overrides, in version 2. */
    const char *sets[] = {"run.quiet=true"};
    bad = o;
    bad.sets = sets;
    bad.n_sets = 1;
    assert_int_equal(tilewise_run(wf, &bad, &rep, &e), TILEWISE_ERR_CONFIG);
    assert_null(rep);

    assert_int_equal(tilewise_run_options_set(&o, "run.shard=2/3", &e), TILEWISE_OK);
    assert_int_equal(o.shard_index, 1);
    assert_int_equal(o.shard_count, 3);
    assert_int_equal(tilewise_run_options_set(&o, "run.restart=true", &e), TILEWISE_OK);
    assert_int_equal(o.restart, 1);
    assert_int_equal(tilewise_run_options_set(&o, "run.report=/tmp/r.json", &e), TILEWISE_OK);
    assert_string_equal(o.report_path, "/tmp/r.json");
    assert_int_equal(tilewise_run_options_set(&o, "run.restart=yes", &e), TILEWISE_ERR_USAGE);
    assert_non_null(strstr(e.message, "run.restart expects true or false"));
    assert_int_equal(tilewise_run_options_set(&o, "run.shard=0/3", &e), TILEWISE_ERR_USAGE);
    assert_int_equal(tilewise_run_options_set(&o, "tiling.stride=3", &e), TILEWISE_ERR_USAGE);
    assert_int_equal(tilewise_run_options_set(&o, "run.nope=1", &e), TILEWISE_ERR_USAGE);
    assert_non_null(strstr(e.message, "unknown key 'run.nope'"));
    assert_int_equal(tilewise_run_options_set(NULL, "run.quiet=true", &e), TILEWISE_ERR_USAGE);
    assert_int_equal(tilewise_run_options_set(&o, NULL, &e), TILEWISE_ERR_USAGE);
    tilewise_run_options_init(NULL); /* harmless */

    assert_int_equal(tilewise_merge(NULL, NULL, &rep, &e), TILEWISE_ERR_USAGE);
    assert_null(rep);
    assert_int_equal(tilewise_merge(SRC "/nope-dir", NULL, &rep, &e), TILEWISE_ERR_INPUT);
    assert_non_null(strstr(e.message, "no shard outputs"));
    tilewise_report_free(rep);

    /* Summaries: NULL arguments, a size not set, an input out of range. */
    tilewise_run_summary s = {.size = sizeof s};
    assert_int_equal(tilewise_report_summary(NULL, &s, &e), TILEWISE_ERR_USAGE);
    char dir[2048], yaml[4096];
    sample_options(&o, dir, yaml);
    assert_int_equal(tilewise_run(NULL, &o, &rep, &e), TILEWISE_OK);
    assert_int_equal(tilewise_report_summary(rep, NULL, &e), TILEWISE_ERR_USAGE);
    s.size = 0;
    assert_int_equal(tilewise_report_summary(rep, &s, &e), TILEWISE_ERR_USAGE);
    assert_non_null(strstr(e.message, "size"));
    tilewise_input_summary in = {.size = sizeof in};
    assert_int_equal(tilewise_report_input(rep, 1, &in, &e), TILEWISE_ERR_USAGE);
    assert_non_null(strstr(e.message, "input 1 of 1"));
    assert_int_equal(tilewise_report_input(rep, -1, &in, &e), TILEWISE_ERR_USAGE);
    in.size = sizeof in - 1;
    assert_int_equal(tilewise_report_input(rep, 0, &in, &e), TILEWISE_ERR_USAGE);
    in.size = sizeof in;
    assert_int_equal(tilewise_report_input(rep, 0, &in, &e), TILEWISE_OK);
    assert_int_equal(tilewise_report_input(NULL, 0, &in, &e), TILEWISE_ERR_USAGE);
    tilewise_report_free(rep);
}

static void test_validate(void **state)
{
    (void)state;
    char dir[2048], yaml[4096];
    tilewise_run_options o;
    sample_options(&o, dir, yaml);
    const char *sets[] = {"input.scale=0.001"};
    o.sets = sets;
    o.n_sets = 1;
    tilewise_validation *v = NULL;
    tilewise_error e;
    assert_int_equal(tilewise_validate(NULL, &o, &v, &e), TILEWISE_OK);
    const char *text = tilewise_validation_text(v);
    printf("%s", text);
    assert_non_null(strstr(text, "tiles 10 x 10 = 100 (tile 64, stride 32)"));
    assert_non_null(strstr(text, "\nadvice    6 warnings\n"));
    assert_int_equal(tilewise_validation_warnings(v), 6);
    for (int i = 0; i < 6; i++) {
        const char *w = tilewise_validation_warning(v, i);
        char band[32];
        snprintf(band, sizeof band, "L7_ETMs.tif band %d: values", i + 1);
        assert_non_null(strstr(w, band));
        assert_true(strncmp(w, "warning", 7) != 0 && w[0] != ' ');
        assert_non_null(strstr(w, "is input.scale 1 meant?"));
        assert_null(strchr(w, '\n'));
    }
    assert_null(tilewise_validation_warning(v, 6));
    assert_null(tilewise_validation_warning(v, -1));
    /* The same plan as data (API version 4): codes, numbers, the input. */
    for (int i = 0; i < 6; i++)
        assert_string_equal(tilewise_validation_warning_code(v, i), "values");
    assert_null(tilewise_validation_warning_code(v, 6));
    tilewise_plan_summary ps = {.size = 8};
    assert_int_equal(tilewise_validation_plan(v, &ps, &e), TILEWISE_ERR_USAGE);
    ps.size = sizeof ps;
    assert_int_equal(tilewise_validation_plan(v, &ps, &e), TILEWISE_OK);
    assert_true(ps.resolved && ps.planned);
    assert_int_equal(ps.n_inputs, 1);
    assert_int_equal(ps.bands, 6);
    assert_int_equal(ps.tile, 64);
    assert_int_equal(ps.stride, 32);
    assert_string_equal(ps.backend, "cpu");
    assert_int_equal(strlen(ps.model_sha256), 64);
    char line[128];
    snprintf(line, sizeof line, "\nbatch     %d tiles, %d slots of ", ps.batch, ps.slots);
    assert_non_null(strstr(text, line));
    snprintf(line, sizeof line, "\nreaders   %d, each", ps.readers);
    assert_non_null(strstr(text, line));
    assert_true(ps.batch >= 1 && ps.estimate_bytes > 0);
    assert_true(ps.estimate_bytes <= ps.worst_bytes && ps.worst_bytes <= ps.memory_bytes);
    assert_true(ps.weights_bytes > 0 && ps.slots_bytes > 0 && ps.base_bytes > 0);
    tilewise_plan_input pi = {.size = sizeof pi};
    assert_int_equal(tilewise_validation_input(v, 1, &pi, &e), TILEWISE_ERR_USAGE);
    assert_int_equal(tilewise_validation_input(v, 0, &pi, &e), TILEWISE_OK);
    assert_non_null(strstr(pi.path, "L7_ETMs.tif"));
    assert_string_equal(pi.skipped, "");
    assert_string_equal(pi.dtype, "Byte");
    assert_int_equal(pi.tiles_x, 10);
    assert_int_equal(pi.tiles_y, 10);
    assert_int_equal(pi.tiles, 100);
    assert_int_equal(pi.aoi_tiles, -1);
    assert_false(pi.remote);
    snprintf(line, sizeof line, "%d x %d, %d bands Byte;", pi.width, pi.height, pi.bands);
    assert_non_null(strstr(text, line));
    snprintf(line, sizeof line, "output grid %d x %d\n", pi.grid_width, pi.grid_height);
    assert_non_null(strstr(text, line));
    tilewise_validation_free(v);
    /* Without the scale: no warnings. Not writing the output folder. */
    o.n_sets = 0;
    assert_int_equal(tilewise_validate(NULL, &o, &v, &e), TILEWISE_OK);
    assert_int_equal(tilewise_validation_warnings(v), 0);
    assert_non_null(strstr(tilewise_validation_text(v), "\nadvice    0 warnings\n"));
    tilewise_validation_free(v);
    assert_false(tw_test_file_exists(dir));

    /* Errors: the workflow unreadable (no text), a stride the model's tile
     * refuses, an input missing (a text as far as the plan got). */
    const char *bad[] = {"tiling.strides=32"};
    o.sets = bad;
    o.n_sets = 1;
    assert_int_equal(tilewise_validate(NULL, &o, &v, &e), TILEWISE_ERR_CONFIG);
    assert_null(v);
    assert_non_null(strstr(e.message, "tiling.strides"));
    const char *stride[] = {"tiling.stride=33"};
    o.sets = stride;
    assert_int_equal(tilewise_validate(NULL, &o, &v, &e), TILEWISE_ERR_CONFIG);
    assert_non_null(strstr(e.message, "does not divide tile 64"));
    assert_null(strstr(tilewise_validation_text(v), "advice"));
    tilewise_validation_free(v);
    const char *nope[] = {"input.path=nope.tif"};
    o.sets = nope;
    assert_int_equal(tilewise_validate(NULL, &o, &v, &e), TILEWISE_ERR_INPUT);
    assert_non_null(strstr(e.message, "nope.tif"));
    assert_int_equal(tilewise_validation_warnings(v), 0);
    tilewise_validation_free(v);
    assert_int_equal(tilewise_validate(NULL, NULL, &v, &e), TILEWISE_ERR_USAGE);
    assert_null(v);
    assert_string_equal(tilewise_validation_text(NULL), "");
    assert_int_equal(tilewise_validation_warnings(NULL), 0);
    tilewise_validation_free(NULL);
}

static void test_info_and_config(void **state)
{
    (void)state;
    tilewise_error e;
    char *text = NULL;
    assert_int_equal(tilewise_info(SRC "/sample_data/L7_ETMs.tif", NULL, 1, &text, &e),
                     TILEWISE_OK);
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "type")), "raster");
    assert_int_equal(jint(j, "width"), 349);
    assert_int_equal(jint(j, "height"), 352);
    assert_int_equal(jint(j, "band_count"), 6);
    assert_true(json_is_true(json_object_get(j, "usable")));
    json_decref(j);
    tilewise_string_free(text);
    assert_int_equal(tilewise_info(MODEL, NULL, 0, &text, &e), TILEWISE_OK);
    assert_non_null(strstr(text, "arch:       resnet18"));
    assert_non_null(strstr(text, "water, dense_vegetation"));
    tilewise_string_free(text);

    assert_int_equal(tilewise_info(SRC "/nope.tif", NULL, 0, &text, &e), TILEWISE_ERR_INPUT);
    assert_null(text);
    assert_non_null(strstr(e.message, "nope.tif: cannot open"));
    assert_int_equal(tilewise_info(SRC "/sample_data/README.md", NULL, 0, &text, &e),
                     TILEWISE_ERR_INPUT);
    assert_non_null(strstr(e.message, "not a raster GDAL can open"));
    assert_int_equal(tilewise_info(NULL, NULL, 0, &text, &e), TILEWISE_ERR_USAGE);
    assert_int_equal(tilewise_info(MODEL, NULL, 0, NULL, &e), TILEWISE_ERR_USAGE);
    tilewise_string_free(NULL);

    assert_int_equal(tilewise_config_set("TILEWISE_TEST_OPTION", "42", &e), TILEWISE_OK);
    assert_string_equal(CPLGetConfigOption("TILEWISE_TEST_OPTION", ""), "42");
    assert_int_equal(tilewise_config_set("TILEWISE_TEST_OPTION", NULL, &e), TILEWISE_OK);
    assert_null(CPLGetConfigOption("TILEWISE_TEST_OPTION", NULL));
    assert_int_equal(tilewise_config_set("", "1", &e), TILEWISE_ERR_USAGE);
    assert_int_equal(tilewise_config_set(NULL, "1", &e), TILEWISE_ERR_USAGE);
}

/* tilewise_model_classify_image (API version 4): the run's plan and
 * stitcher over an image in memory, against a reference written here: the
 * edge-pad tiles cut by hand (padding marked 2), classified as tiles, each
 * cell the float mean of the classified tiles covering it, in raster
 * order. W x H not multiples of the stride; a nodata block makes NaN cells. */
static void test_classify_image(void **state)
{
    (void)state;
    enum { W = 75, H = 90, S = 32, C = T / S };
    const char *sets[] = {"runtime.device=cpu", "runtime.memory=256MiB", "tiling.batch=3"};
    tilewise_model *m = NULL;
    tilewise_error e;
    assert_int_equal(tilewise_model_open(MODEL, sets, 3, &m, &e), TILEWISE_OK);
    const int K = tilewise_model_classes(m);
    uint8_t *img = malloc((size_t)BANDS * W * H), valid[W * H];
    tw_raster *r = NULL;
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_raster_open(SRC "/sample_data/L7_ETMs.tif", NULL, 0, &r, &err), TW_OK);
    int64_t nd, in;
    assert_int_equal(tw_raster_read(r, 40, 50, W, H, img, valid, &nd, &in, &err), TW_OK);
    tw_raster_close(r);
    for (int b = 0; b < BANDS; b++) /* nodata rows 0..59, columns 0..39 */
        for (int y = 0; y < 60; y++) memset(img + ((size_t)b * H + y) * W, 0, 40);
    const int gw = (W + S - 1) / S, gh = (H + S - 1) / S;
    float *got = malloc(sizeof(float) * K * gw * gh);
    tilewise_image im = {.pixels = img,
                         .dtype = TILEWISE_DT_BYTE,
                         .bands = BANDS,
                         .width = W,
                         .height = H,
                         .use_nodata = 1,
                         .nodata = 0};
    assert_int_equal(tilewise_model_classify_image(m, &im, S, got, &e), TILEWISE_OK);

    /* The reference: tiles at 0, S, ... while the previous did not reach
     * the edge (tiling.edge pad). */
    const int nx = W <= T ? 1 : (W - T + S - 1) / S + 1, ny = H <= T ? 1 : (H - T + S - 1) / S + 1;
    uint8_t *tiles = calloc((size_t)nx * ny, (size_t)BANDS * T * T);
    uint8_t *tv = malloc((size_t)nx * ny * T * T);
    for (int ty = 0; ty < ny; ty++)
        for (int tx = 0; tx < nx; tx++) {
            size_t i = (size_t)ty * nx + tx;
            for (int y = 0; y < T; y++)
                for (int x = 0; x < T; x++) {
                    int px = tx * S + x, py = ty * S + y;
                    bool inside = px < W && py < H;
                    tv[(i * T + y) * T + x] = inside ? 1 : 2;
                    for (int b = 0; b < BANDS && inside; b++)
                        tiles[((i * BANDS + b) * T + y) * T + x] =
                            img[((size_t)b * H + py) * W + px];
                }
        }
    float *tp = malloc(sizeof(float) * K * nx * ny);
    tilewise_tiles ts = {.pixels = tiles,
                         .dtype = TILEWISE_DT_BYTE,
                         .n = nx * ny,
                         .bands = BANDS,
                         .size = T,
                         .valid = tv,
                         .use_nodata = 1,
                         .nodata = 0};
    assert_int_equal(tilewise_model_classify(m, &ts, tp, NULL, &e), TILEWISE_OK);
    int nan_cells = 0;
    for (int cy = 0; cy < gh; cy++)
        for (int cx = 0; cx < gw; cx++) {
            float sum[16] = {0};
            int n = 0;
            for (int ty = 0; ty < ny; ty++)
                for (int tx = 0; tx < nx; tx++) {
                    const float *p = tp + ((size_t)ty * nx + tx) * K;
                    /* the tile at pixel t * S covers cells [t, t + C) */
                    if (isnan(p[0]) || cy < ty || cy >= ty + C || cx < tx || cx >= tx + C) continue;
                    for (int c = 0; c < K; c++) sum[c] += p[c];
                    n++;
                }
            for (int c = 0; c < K; c++) {
                float g = got[((size_t)c * gh + cy) * gw + cx];
                if (n == 0) {
                    assert_true(isnan(g));
                } else {
                    float want = n == 1 ? sum[c] : sum[c] * (1.0f / (float)n);
                    assert_float_equal(g, want, 1e-6);
                }
            }
            nan_cells += n == 0;
        }
    assert_true(nan_cells > 0 && nan_cells < gw * gh);
    /* A stride that does not divide the tile: a usage error. */
    assert_int_equal(tilewise_model_classify_image(m, &im, 24, got, &e), TILEWISE_ERR_USAGE);
    assert_non_null(strstr(e.message, "24"));
    /* A negative stride: a usage error too, never the tile (issue 40). */
    assert_int_equal(tilewise_model_classify_image(m, &im, -1, got, &e), TILEWISE_ERR_USAGE);
    assert_non_null(strstr(e.message, "stride -1"));
    im.width = 0;
    assert_int_equal(tilewise_model_classify_image(m, &im, S, got, &e), TILEWISE_ERR_USAGE);
    free(img);
    free(got);
    free(tiles);
    free(tv);
    free(tp);
    tilewise_model_close(m);
}

/* ---- two runs on two threads of one process (issue 28.5) ---- */

typedef struct thread_run {
    char yaml[4096];
    char dir[2048];
    tilewise_status st;
    tilewise_report *rep;
} thread_run;

static void thread_run_init(thread_run *t, const char *name, int stride, int batch,
                            const char *products)
{
    snprintf(t->dir, sizeof t->dir, "%s/%s", tw_test_tmpdir(), name);
    snprintf(t->yaml, sizeof t->yaml,
             "input:\n  path: %s/sample_data/L7_ETMs.tif\nmodel:\n  weights: %s\n"
             "tiling:\n  stride: %d\n  batch: %d\nruntime:\n  device: cpu\n  threads: 1\n"
             "  memory: 1GiB\noutput:\n  dir: %s\n  products: %s\n",
             SRC, MODEL, stride, batch, t->dir, products);
    t->rep = NULL;
}

static void *thread_run_main(void *arg)
{
    thread_run *t = arg;
    tilewise_run_options o;
    tilewise_run_options_init(&o);
    o.yaml = t->yaml;
    o.yaml_len = strlen(t->yaml);
    o.quiet = 1;
    tilewise_error e;
    t->st = tilewise_run("<thread>", &o, &t->rep, &e);
    return NULL;
}

/* Whether two files hold the same bytes. */
static bool same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        same = ca == cb;
        if (ca == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

static json_int_t peak_of(const tilewise_report *rep, const char *tag)
{
    json_error_t jerr;
    json_t *j = json_loads(tilewise_report_json(rep), 0, &jerr);
    assert_non_null(j);
    json_t *v =
        json_object_get(json_object_get(json_object_get(j, "memory"), "allocator_peak"), tag);
    assert_non_null(v);
    json_int_t n = json_integer_value(v);
    json_decref(j);
    return n;
}

/* Two different workflows, first one after the other, then at the same
 * time on two threads: each concurrent run writes its sequential run's
 * bytes, and its report's allocator figures are its own (the peaks of its
 * weights, batch slots, workspace, strip and read buffers as when it ran
 * alone, no allocation in its steady state), where the counters were once
 * the process's. */
static void test_two_runs_two_threads(void **state)
{
    (void)state;
    thread_run seq[2], par[2];
    thread_run_init(&seq[0], "seq_a", 32, 4, "[class, prob]");
    thread_run_init(&seq[1], "seq_b", 64, 2, "[class, confidence]");
    thread_run_init(&par[0], "par_a", 32, 4, "[class, prob]");
    thread_run_init(&par[1], "par_b", 64, 2, "[class, confidence]");
    for (int i = 0; i < 2; i++) {
        thread_run_main(&seq[i]);
        assert_int_equal(seq[i].st, TILEWISE_OK);
    }
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, thread_run_main, &par[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    static const char *const products[2][2] = {{"class", "prob"}, {"class", "conf"}};
    static const char *const tags[] = {"weights", "slots", "workspace", "strip", "read"};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(par[i].st, TILEWISE_OK);
        for (int k = 0; k < 2; k++) {
            char a[2200], b[2200];
            snprintf(a, sizeof a, "%s/L7_ETMs.%s.tif", seq[i].dir, products[i][k]);
            snprintf(b, sizeof b, "%s/L7_ETMs.%s.tif", par[i].dir, products[i][k]);
            printf("run %c: %s equal: %d\n", 'a' + i, products[i][k], same_file(a, b));
            assert_true(same_file(a, b));
        }
        for (size_t t = 0; t < sizeof tags / sizeof tags[0]; t++) {
            json_int_t alone = peak_of(seq[i].rep, tags[t]),
                       together = peak_of(par[i].rep, tags[t]);
            printf("run %c: allocator peak %s alone %lld, beside the other %lld\n", 'a' + i,
                   tags[t], (long long)alone, (long long)together);
            assert_int_equal(alone, together);
        }
        json_error_t jerr;
        json_t *j = json_loads(tilewise_report_json(par[i].rep), 0, &jerr);
        json_t *in0 = json_array_get(json_object_get(j, "inputs"), 0);
        assert_int_equal(json_integer_value(json_object_get(in0, "steady_state_allocs")), 0);
        json_decref(j);
    }
    /* The two runs' figures differ (batch 4 vs 2): each report is its own. */
    assert_true(peak_of(par[0].rep, "slots") != peak_of(par[1].rep, "slots"));
    for (int i = 0; i < 2; i++) {
        tilewise_report_free(seq[i].rep);
        tilewise_report_free(par[i].rep);
    }
}

/* ---- two runs into one output folder on two threads (issue 39.2) ---- */

/* Run A holds the folder: its first tiles callback (after its lock is
 * taken) says so and waits until run B has returned. */
typedef struct holder {
    int running, b_done; /* __atomic */
} holder;

static void hold_until_b(int64_t done, int64_t total, const char *input, void *user)
{
    (void)done;
    (void)total;
    (void)input;
    holder *h = user;
    __atomic_store_n(&h->running, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&h->b_done, __ATOMIC_ACQUIRE)) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

typedef struct run_a {
    tilewise_run_options o;
    tilewise_status st;
} run_a;

static void *run_a_main(void *arg)
{
    run_a *a = arg;
    tilewise_error e;
    a->st = tilewise_run(NULL, &a->o, NULL, &e);
    return NULL;
}

/* Before: the parts lock was a classic POSIX record lock, which another
 * thread of the same process takes again, so B ran into A's folder (one
 * failed renaming A's chunk, the other's products mixed both). Now B is
 * refused as another process is: exit 7, the holder named, nothing written
 * over A's report; A finishes. */
static void test_two_runs_one_folder_locked(void **state)
{
    (void)state;
    char dir[2048], yaml[4096];
    run_a a;
    sample_options(&a.o, dir, yaml);
    a.o.chunk_rows = 1;
    holder h = {0, 0};
    a.o.tiles = hold_until_b;
    a.o.user = &h;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, run_a_main, &a), 0);
    while (!__atomic_load_n(&h.running, __ATOMIC_ACQUIRE)) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    tilewise_run_options ob;
    char yaml_b[4096];
    sample_yaml(yaml_b, sizeof yaml_b, dir);
    tilewise_run_options_init(&ob);
    ob.yaml = yaml_b;
    ob.yaml_len = strlen(yaml_b);
    ob.quiet = 1;
    ob.chunk_rows = 1;
    tilewise_error e;
    tilewise_status st = tilewise_run(NULL, &ob, NULL, &e);
    __atomic_store_n(&h.b_done, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    printf("second run: %d (exit %d): %s\n", (int)st, e.exit_code, e.message);
    assert_int_equal(st, TILEWISE_ERR_LOCKED);
    assert_int_equal(e.exit_code, 7);
    assert_string_equal(e.exit_class, "locked");
    char want[64];
    snprintf(want, sizeof want, "is being run by process %ld on host", (long)getpid());
    assert_non_null(strstr(e.message, want));
    assert_int_equal(a.st, TILEWISE_OK);
    /* A's products and its report only: B wrote no run.json of its own */
    char path[2200];
    snprintf(path, sizeof path, "%s/run.failed.json", dir);
    assert_false(tw_test_file_exists(path));
    snprintf(path, sizeof path, "%s/run.json", dir);
    assert_true(tw_test_file_exists(path));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_classify_matches_reference),
        cmocka_unit_test(test_classify_image),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_run_cancel_resume),
        cmocka_unit_test(test_run_v2_tiles_and_summary),
        cmocka_unit_test(test_run_v2_stop_flag_resumes),
        cmocka_unit_test(test_run_v2_shards_and_merge),
        cmocka_unit_test(test_run_v2_bad_arguments),
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_info_and_config),
        cmocka_unit_test(test_two_runs_two_threads),
        cmocka_unit_test(test_two_runs_one_folder_locked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
