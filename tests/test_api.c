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
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "io/model_file.h"
#include "io/raster.h"
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_classify_matches_reference),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_run_cancel_resume),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
