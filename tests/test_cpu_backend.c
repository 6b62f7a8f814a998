/* test_cpu_backend.c - the oneDNN CPU backend against PyTorch (fixtures from
 * tests/fixtures/fx_models.py) and against the C reference forward pass on
 * odd shapes; its memory estimate against what reserve really takes; and
 * that infer allocates nothing. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dnnl.h>

#include "io/modelfile/model_file.h"
#include "model/backend.h"
#include "model/calib.h"
#include "model/resnet.h"
#include "core/alloc.h"
#include "tests/synth_resnet.h"
#include "tests/testutil.h"

static int argmax(const float *p, int k)
{
    int best = 0;
    for (int j = 1; j < k; j++)
        if (p[j] > p[best]) best = j;
    return best;
}

/* Create a backend and reserve it for net, consuming the net's conv
 * weights as tw_run does (the results are then computed without them);
 * check the estimate made before against the workspace bytes reserve
 * really took (within 15%), and that the net's copy is gone. */
static void reserve_params(tw_resnet *net, int tile, int max_batch, const tw_backend_params *bp,
                           tw_backend *be)
{
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_backend_create_ex("cpu", bp, be, &err), TW_OK);
    assert_string_equal(be->i->name, "cpu");
    assert_false(be->i->wants_raw(be->ctx));
    assert_null(be->i->host_alloc(be->ctx, 64));
    size_t est = be->i->workspace_bytes(be->ctx, net, tile, max_batch, TW_PREC_FP32);
    size_t before = tw_mem_current(TW_MEM_WORKSPACE);
    size_t weights = tw_mem_current(TW_MEM_WEIGHTS);
    int mb = max_batch;
    if (tw_backend_reserve(be, net, tile, &mb, TW_PREC_FP32, true, NULL, &err) != TW_OK)
        fail_msg("reserve: %s", err.msg);
    assert_int_equal(mb, max_batch);
    size_t got = tw_mem_current(TW_MEM_WORKSPACE) - before;
    assert_null(net->stem.w);
    assert_null(net->blocks[net->n_blocks - 1].c2.b);
    assert_non_null(net->fc_w); /* the backend copies fc too, the net keeps it */
    assert_true(weights - tw_mem_current(TW_MEM_WEIGHTS) >= net->weight_bytes * 9 / 10);
    print_message("resnet%d tile %d batch %d: workspace estimate %zu bytes, reserved %zu\n",
                  net->depth, tile, max_batch, est, got);
    assert_true(got > 0);
    assert_true(fabs((double)est - (double)got) <= 0.15 * (double)got);
}

/* The ways the backend can compute fp32 (check_vs_pytorch's variants): as
 * it chooses; direct convolutions only; each GEMM lowering forced
 * wherever it applies (cpu_gemm 1), on nhwc activations (dense and rows)
 * and on the blocked ones with Winograd (dense); and this tree's Winograd
 * (model/winograd.c) on any CPU, which by default runs only where oneDNN
 * has none (AVX2). */
enum { V_DEFAULT, V_DIRECT, V_GEMM_NHWC, V_GEMM_BLOCKED, V_WINO_OWN, N_VARIANTS };

static tw_backend_params variant_params(int v)
{
    tw_backend_params bp = tw_backend_default_params();
    bp.threads = 2;
    bp.cpu_winograd = v != V_DIRECT && v != V_GEMM_NHWC;
    if (v == V_DIRECT) bp.cpu_gemm = 0;
    if (v == V_GEMM_NHWC || v == V_GEMM_BLOCKED) bp.cpu_gemm = 1;
    if (v == V_GEMM_NHWC) bp.cpu_nhwc = 1;
    if (v == V_GEMM_BLOCKED) bp.cpu_nhwc = 0;
    if (v == V_WINO_OWN) {
        bp.cpu_winograd = TW_CPU_WINOGRAD_OWN;
        bp.cpu_nhwc = 1;
    }
    return bp;
}

static const char *variant_name(int v)
{
    return v == V_DEFAULT     ? "default"
           : v == V_DIRECT    ? "cpu_winograd false, cpu_gemm 0"
           : v == V_GEMM_NHWC ? "cpu_gemm 1, cpu_nhwc 1, cpu_winograd false"
           : v == V_WINO_OWN  ? "cpu_winograd own, cpu_nhwc 1"
                              : "cpu_gemm 1, cpu_nhwc 0";
}

/* Run x ([n_total] tiles) through be in chunks of the given sizes; the
 * results go to probs/emb at the chunk's offset. No tw_alloc may happen. */
static void infer_chunks(tw_backend *be, const tw_resnet *net, const float *x, int tile,
                         const int *chunks, int n_chunks, float *probs, float *emb)
{
    tw_error err;
    tw_error_init(&err);
    size_t tile_elems = (size_t)net->in_bands * tile * tile;
    uint64_t allocs = tw_mem_alloc_count();
    int off = 0;
    for (int c = 0; c < n_chunks; c++) {
        tw_infer_batch b = {.n = chunks[c],
                            .tile = tile,
                            .x = x + off * tile_elems,
                            .probs = probs + (size_t)off * net->n_classes,
                            .emb = emb ? emb + (size_t)off * net->feat_dim : NULL};
        if (tw_backend_infer(be, &b, &err) != TW_OK) fail_msg("infer: %s", err.msg);
        off += chunks[c];
    }
    assert_int_equal(tw_mem_alloc_count(), allocs);
}

/* max |a-b| over probabilities; max |a-b| / max |b| over embeddings
 * (skipped when there is no reference ref_e). */
static void compare(const float *p, const float *ref_p, const float *e, const float *ref_e, int n,
                    int k, int fd, const char *what)
{
    double dp = 0, de = 0, emax = 1;
    for (int i = 0; i < n * k; i++) dp = fmax(dp, fabs(p[i] - ref_p[i]));
    for (int i = 0; ref_e && i < n * fd; i++) {
        de = fmax(de, fabs(e[i] - ref_e[i]));
        emax = fmax(emax, fabs(ref_e[i]));
    }
    print_message("%s: max |dp| = %.3g, max |de| / max |e| = %.3g\n", what, dp, de / emax);
    assert_true(dp <= 1e-4);
    assert_true(de <= 1e-4 * emax);
    for (int t = 0; t < n; t++)
        if (argmax(p + t * k, k) != argmax(ref_p + t * k, k))
            fail_msg("%s: tile %d argmax %d, reference %d", what, t, argmax(p + t * k, k),
                     argmax(ref_p + t * k, k));
}

/* Does oneDNN 2.6 have its Winograd kernel here? It has it for AVX-512
 * (avx512_core: F, CD, BW, DQ, VL) only; asked of the CPU, not of oneDNN. */
static bool cpu_has_avx512_core(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl");
}

/* model against the references ref_<tag>_probs.f32 and, when there is one,
 * ref_<tag>_emb.f32: once as the backend chooses (Winograd for the 3x3
 * convolutions on AVX-512 CPUs), once with TILEWISE_CPU_WINOGRAD=0 (direct
 * convolutions only). */
static void check_vs_pytorch(const char *model, const char *tag, int n_variants)
{
    const char *fx = tw_test_fixtures();
    if (!fx || !tw_test_file_exists(tw_test_path(fx, model)) ||
        !tw_test_file_exists(tw_test_path(fx, "tiles_64.f32")))
        skip();
    char name[128];
    float *x, *ref_p, *ref_e;
    assert_int_equal(tw_test_read_f32(tw_test_path(fx, "tiles_64.f32"), &x), 8 * 6 * 64 * 64);
    snprintf(name, sizeof name, "ref_%s_probs.f32", tag);
    long np = tw_test_read_f32(tw_test_path(fx, name), &ref_p);
    snprintf(name, sizeof name, "ref_%s_emb.f32", tag);
    long ne = tw_test_read_f32(tw_test_path(fx, name), &ref_e);
    assert_true(np > 0);

    for (int v = 0; v < n_variants; v++) {
        tw_error err;
        tw_error_init(&err);
        tw_model_file *mf = NULL;
        tw_resnet *net = NULL;
        if (tw_model_file_load(tw_test_path(fx, model), &mf, &err) != TW_OK)
            fail_msg("%s", err.msg);
        if (tw_resnet_create(mf, "", &net, &err) != TW_OK) fail_msg("%s", err.msg);
        tw_model_file_destroy(mf);
        int k = net->n_classes, fd = net->feat_dim;
        assert_int_equal(np, 8 * k);
        if (ref_e) assert_int_equal(ne, 8 * fd);

        size_t ws0 = tw_mem_current(TW_MEM_WORKSPACE);
        tw_backend be;
        tw_backend_params bp = variant_params(v);
        reserve_params(net, 64, 8, &bp, &be);
        tw_backend_stats stats;
        be.i->get_stats(be.ctx, &stats);
        print_message("%s, %s: %d convolutions on Winograd, %d as one inner product\n", model,
                      variant_name(v), stats.winograd_convs, stats.gemm_convs);
        /* the last stage's 2x2 maps: its 3x3 stride-1 convs (and with nhwc
         * its 1x1 stride-1 ones) by the rule, more where forced */
        /* (a lowering whose GEMM gives a tile other bits in another place
         * of the batch is refused at reserve: oneDNN's AVX2 GEMM at this
         * batch of 8, for one) */
        bool onednn_wino = v == V_DEFAULT && cpu_has_avx512_core() &&
                           !getenv("ONEDNN_MAX_CPU_ISA") && !getenv("DNNL_MAX_CPU_ISA");
        if (v == V_DIRECT)
            assert_int_equal(stats.gemm_convs + stats.lowerings_refused, 0);
        else
            assert_true(stats.gemm_convs + stats.lowerings_refused >= (net->bottleneck ? 2 : 3));
        if (v == V_DIRECT)
            assert_int_equal(stats.winograd_convs, 0);
        else if (onednn_wino)
            /* every 3x3 stride-1 conv on a map of >= 4 x 4 (stages 1-3 at
             * 64 px: ResNet-18 4 + 3 + 3, ResNet-50 3 + 3 + 5) */
            assert_int_equal(stats.winograd_convs, net->bottleneck ? 11 : 10);
        else if (v == V_DEFAULT || v == V_WINO_OWN) {
            /* this tree's: the same convs whatever the batch (wino_map),
             * unless refused */
            int want = net->bottleneck ? 11 : 10;
            assert_true(stats.winograd_convs <= want);
            assert_true(stats.winograd_convs + stats.lowerings_refused >= want);
        }
        if (onednn_wino)
            assert_non_null(strstr(stats.algorithms, "Winograd F(4,3) (oneDNN's kernel)"));
        else if (v == V_DEFAULT || v == V_WINO_OWN)
            assert_non_null(strstr(stats.algorithms, "Winograd F(4,3) (model/winograd.c"));
        float *p = calloc((size_t)8 * k, sizeof(float)), *e = calloc((size_t)8 * fd, sizeof(float));
        /* short batches (1 and 3 < max_batch 8), then a full one read in place */
        infer_chunks(&be, net, x, 64, (const int[]){1, 3, 3, 1}, 4, p, e);
        compare(p, ref_p, e, ref_e, 8, k, fd, "batches 1,3,3,1");
        memset(p, 0, (size_t)8 * k * sizeof(float));
        memset(e, 0, (size_t)8 * fd * sizeof(float));
        infer_chunks(&be, net, x, 64, (const int[]){8}, 1, p, e);
        compare(p, ref_p, e, ref_e, 8, k, fd, "batch 8");
        /* embeddings are optional */
        memset(p, 0, (size_t)8 * k * sizeof(float));
        infer_chunks(&be, net, x, 64, (const int[]){5, 3}, 2, p, NULL);
        compare(p, ref_p, e, ref_e, 8, k, fd, "batches 5,3 without embeddings");

        be.i->get_stats(be.ctx, &stats);
        assert_true(stats.compute_s > 0.0);
        assert_int_equal(stats.copy_in_s, 0);
        be.i->destroy(be.ctx);
        assert_int_equal(tw_mem_current(TW_MEM_WORKSPACE), ws0);
        free(p);
        free(e);
        tw_resnet_destroy(net);
    }
    free(x);
    free(ref_p);
    free(ref_e);
}

static void test_resnet18_vs_pytorch(void **state)
{
    (void)state;
    check_vs_pytorch("resnet18_6b_7c.safetensors", "resnet18", N_VARIANTS);
}

static void test_resnet50_vs_pytorch(void **state)
{
    (void)state;
    check_vs_pytorch("resnet50_6b_5c.safetensors", "resnet50", N_VARIANTS);
}

/* the same net from the HDF5 bundle, and float16 weights (their own reference) */
static void test_bundle_and_f16_vs_pytorch(void **state)
{
    (void)state;
    check_vs_pytorch("resnet50_6b_5c.h5", "resnet50", 2);
    check_vs_pytorch("resnet18_6b_7c_f16.safetensors", "resnet18_f16", 2);
}

/* 32 tiles of 64 px: tiles_64.f32's 8, each copy scaled (x1, x1.05, ...). */
static float *tiles_32(const char *fx)
{
    float *x8;
    assert_int_equal(tw_test_read_f32(tw_test_path(fx, "tiles_64.f32"), &x8), 8 * 6 * 64 * 64);
    size_t te = (size_t)6 * 64 * 64;
    float *x = malloc(32 * te * sizeof(float));
    assert_non_null(x);
    for (int j = 0; j < 32; j++)
        for (size_t i = 0; i < te; i++)
            x[j * te + i] = x8[(j % 8) * te + i] * (1.0f + 0.05f * (j / 8));
    free(x8);
    return x;
}

/* A tile's results do not depend on its place in the batch: shards and
 * resumed runs put tiles in other places than one run does, and must write
 * its bytes. 32 tiles (the fixture's 8, each scaled per copy) go through a
 * batch of 32 in order, then rotated by 1 and by 5 places; every tile's
 * probabilities and embedding must come back bit for bit. At 64 px a batch
 * of 32 gives the GEMM lowerings 32 rows (the 2x2 stage's dense lowering,
 * the 4x4 stage's Winograd), a count whose last rows oneDNN's AVX2 GEMM
 * computes with another kernel: the lowerings pad their rows to a count it
 * computes alike (cpu_lower.c, cpu_next_rows), which this checks end to end,
 * under ONEDNN_MAX_CPU_ISA=AVX2 in test_cpu_backend_avx2. */
static void check_place_independent(const char *model)
{
    const char *fx = tw_test_fixtures();
    if (!fx || !tw_test_file_exists(tw_test_path(fx, model)) ||
        !tw_test_file_exists(tw_test_path(fx, "tiles_64.f32")))
        skip();
    enum { N = 32 };
    size_t te = (size_t)6 * 64 * 64;
    float *x = tiles_32(fx), *xr = malloc(N * te * sizeof(float));
    tw_error err;
    tw_error_init(&err);
    tw_model_file *mf = NULL;
    tw_resnet *net = NULL;
    if (tw_model_file_load(tw_test_path(fx, model), &mf, &err) != TW_OK) fail_msg("%s", err.msg);
    if (tw_resnet_create(mf, "", &net, &err) != TW_OK) fail_msg("%s", err.msg);
    tw_model_file_destroy(mf);
    int k = net->n_classes, fd = net->feat_dim;
    tw_backend be;
    tw_backend_params bp = variant_params(V_DEFAULT);
    reserve_params(net, 64, N, &bp, &be);
    tw_backend_stats stats;
    be.i->get_stats(be.ctx, &stats);
    print_message("%s, batch %d: %s\n", model, N, stats.algorithms);
    float *p0 = malloc((size_t)N * k * sizeof(float)), *e0 = malloc((size_t)N * fd * sizeof(float));
    float *p = malloc((size_t)N * k * sizeof(float)), *e = malloc((size_t)N * fd * sizeof(float));
    infer_chunks(&be, net, x, 64, (const int[]){N}, 1, p0, e0);
    const int shifts[] = {1, 5};
    for (int si = 0; si < 2; si++) {
        int sh = shifts[si];
        for (int j = 0; j < N; j++)
            memcpy(xr + (size_t)((j + sh) % N) * te, x + j * te, te * sizeof(float));
        infer_chunks(&be, net, xr, 64, (const int[]){N}, 1, p, e);
        for (int j = 0; j < N; j++) {
            int at = (j + sh) % N;
            if (memcmp(p + (size_t)at * k, p0 + (size_t)j * k, k * sizeof(float)) ||
                memcmp(e + (size_t)at * fd, e0 + (size_t)j * fd, fd * sizeof(float)))
                fail_msg("%s: tile %d gives other bits at place %d of the batch (was %d)", model, j,
                         at, j);
        }
    }
    be.i->destroy(be.ctx);
    tw_resnet_destroy(net);
    free(x);
    free(xr);
    free(p0);
    free(e0);
    free(p);
    free(e);
}

static void test_place_independent(void **state)
{
    (void)state;
    check_place_independent("resnet18_6b_7c.safetensors");
    check_place_independent("resnet50_6b_5c.safetensors");
}

/* The probabilities and embedding of tiles_64's 8 tiles (each copy scaled,
 * 32 in all) from a fresh backend planned for batches of `batch`, in batches
 * of it (the last one short). */
static void run_at_batch(const char *model, const float *x, int batch, float *p, float *e)
{
    enum { N = 32 };
    tw_error err;
    tw_error_init(&err);
    tw_model_file *mf = NULL;
    tw_resnet *net = NULL;
    const char *fx = tw_test_fixtures();
    if (tw_model_file_load(tw_test_path(fx, model), &mf, &err) != TW_OK) fail_msg("%s", err.msg);
    if (tw_resnet_create(mf, "", &net, &err) != TW_OK) fail_msg("%s", err.msg);
    tw_model_file_destroy(mf);
    tw_backend be;
    tw_backend_params bp = variant_params(V_DEFAULT);
    reserve_params(net, 64, batch, &bp, &be);
    int chunks[N], n = 0;
    for (int left = N; left > 0; left -= batch) chunks[n++] = left < batch ? left : batch;
    infer_chunks(&be, net, x, 64, chunks, n, p, e);
    be.i->destroy(be.ctx);
    tw_resnet_destroy(net);
}

/* A tile's results do not depend on the batch size either: the budget picks
 * it from runtime.memory and the process's size, so a shard, a resumed run,
 * the CLI and the Python API in a larger process may run another batch than
 * one run, and must write its bytes (tiling.batch and runtime.memory change
 * no output byte, core/keys.c). Batches of 1, 2, 3 and 16 (ResNet-50: 1
 * and 16) must give the bits of a batch of 32. Failed before the plan stopped choosing by batch
 * size: with AVX-512, oneDNN's Winograd in batches of 1-2; with AVX2
 * (test_cpu_backend_avx2), the Winograd lowering of 4x4 maps taken only from
 * 32 rows (batches of 8 and 16 differed from 32) and the one-row dense GEMM
 * of a batch of 1. */
static void check_batch_independent(const char *model, const int *batches, int n_batches)
{
    const char *fx = tw_test_fixtures();
    if (!fx || !tw_test_file_exists(tw_test_path(fx, model)) ||
        !tw_test_file_exists(tw_test_path(fx, "tiles_64.f32")))
        skip();
    enum { N = 32 };
    float *x = tiles_32(fx);
    enum { MAX_K = 64, MAX_FD = 2048 };
    float *p0 = malloc(N * MAX_K * sizeof(float)), *e0 = malloc(N * MAX_FD * sizeof(float));
    float *p = malloc(N * MAX_K * sizeof(float)), *e = malloc(N * MAX_FD * sizeof(float));
    run_at_batch(model, x, N, p0, e0);
    tw_model_file *mf = NULL;
    tw_error err;
    tw_error_init(&err);
    if (tw_model_file_load(tw_test_path(fx, model), &mf, &err) != TW_OK) fail_msg("%s", err.msg);
    tw_resnet *net = NULL;
    if (tw_resnet_create(mf, "", &net, &err) != TW_OK) fail_msg("%s", err.msg);
    tw_model_file_destroy(mf);
    int k = net->n_classes, fd = net->feat_dim;
    tw_resnet_destroy(net);
    assert_true(k <= MAX_K && fd <= MAX_FD);
    for (int bi = 0; bi < n_batches; bi++) {
        run_at_batch(model, x, batches[bi], p, e);
        for (int j = 0; j < N; j++)
            if (memcmp(p + (size_t)j * k, p0 + (size_t)j * k, k * sizeof(float)) ||
                memcmp(e + (size_t)j * fd, e0 + (size_t)j * fd, fd * sizeof(float)))
                fail_msg("%s: tile %d gives other bits in batches of %d than of %d", model, j,
                         batches[bi], N);
    }
    free(x);
    free(p0);
    free(e0);
    free(p);
    free(e);
}

static void test_batch_independent(void **state)
{
    (void)state;
    /* oneDNN's arithmetic, not memory safety: the release pass runs it on
     * both ISAs; under the sanitizers (make test's second pass) it would
     * cost CI's 20 minutes half a minute for nothing they could find */
    if (getenv("TW_SANITIZED")) skip();
    /* (each batch size is a backend of its own: two sizes for ResNet-50,
     * whose bottleneck lowerings the 16 checks, keep make test's time) */
    check_batch_independent("resnet18_6b_7c.safetensors", (const int[]){1, 2, 3, 12, 31}, 5);
    check_batch_independent("resnet50_6b_5c.safetensors", (const int[]){1, 8}, 2);
}

/* Widths that are no multiple of oneDNN's channel blocks, one input band,
 * tiles whose sizes go odd along the way: the fast path must still match
 * the reference. */
static void check_vs_reference(const int blocks[4], int bottleneck, int bands, int width,
                               int classes, int tile, synth_family fam)
{
    synth s;
    assert_int_equal(synth_resnet_ex(&s, blocks, bottleneck, bands, width, classes, 99, fam), 0);
    tw_error err;
    tw_error_init(&err);
    tw_resnet *net = NULL;
    if (tw_resnet_create(&s.mf, "", &net, &err) != TW_OK) fail_msg("%s", err.msg);
    int n = 4, k = net->n_classes, fd = net->feat_dim;
    size_t elems = (size_t)n * bands * tile * tile;
    float *x = malloc(elems * sizeof(float));
    uint64_t r = 12345;
    for (size_t i = 0; i < elems; i++) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 4.0 - 2.0);
    }
    float *rp = malloc((size_t)n * k * sizeof(float)), *re = malloc((size_t)n * fd * sizeof(float));
    float *p = malloc((size_t)n * k * sizeof(float)), *e = malloc((size_t)n * fd * sizeof(float));
    assert_int_equal(tw_resnet_forward_ref(net, x, n, tile, rp, re, &err), TW_OK);

    for (int v = 0; v < N_VARIANTS; v++) {
        /* each reserve consumes its net's weights: a fresh net for each */
        tw_resnet_destroy(net);
        if (tw_resnet_create(&s.mf, "", &net, &err) != TW_OK) fail_msg("%s", err.msg);
        tw_backend be;
        tw_backend_params bp = variant_params(v);
        reserve_params(net, tile, n, &bp, &be);
        tw_backend_stats stats;
        be.i->get_stats(be.ctx, &stats);
        /* (a small stem at 32 px leaves no map of 2x2 or less, where the
         * measured rule lowers convs; the layers it has are too big for
         * cpu_gemm 1's dense matrices) */
        if (v >= V_GEMM_NHWC && !fam.small) assert_true(stats.gemm_convs > 0);
        infer_chunks(&be, net, x, tile, (const int[]){2, 1, 1}, 3, p, e);
        char what[160];
        snprintf(what, sizeof what,
                 "resnet%d width %d groups %d %s stem bands %d tile %d vs reference, %s (%d GEMM)",
                 net->depth, width, net->groups, tw_stem_names[net->stem_kind], bands, tile,
                 variant_name(v), stats.gemm_convs);
        compare(p, rp, e, re, n, k, fd, what);
        be.i->destroy(be.ctx);
        /* the same tiles on 1 thread, and in a backend reserved for 1 tile:
         * the same classes, probabilities within 1e-6. The direct kernels
         * give the same bits; Winograd (before issue 20 too) and the GEMM
         * lowerings' inner products need not: oneDNN orders their sums by
         * the batch's shape and (rows, AVX2 dense) the threads. A run's
         * tiles always see one reserved batch, its short last one included,
         * so a run repeated with the same batch and threads is bit-exact. */
        float *p1 = malloc((size_t)n * k * sizeof(float));
        bp.threads = 1;
        for (int b1 = n; b1 >= 1; b1 -= n - 1) {
            tw_resnet_destroy(net);
            if (tw_resnet_create(&s.mf, "", &net, &err) != TW_OK) fail_msg("%s", err.msg);
            reserve_params(net, tile, b1, &bp, &be);
            if (b1 == n)
                infer_chunks(&be, net, x, tile, (const int[]){n}, 1, p1, NULL);
            else
                infer_chunks(&be, net, x, tile, (const int[]){1, 1, 1, 1}, 4, p1, NULL);
            be.i->destroy(be.ctx);
            bool same = memcmp(p, p1, (size_t)n * k * sizeof(float)) == 0;
            double d = 0;
            for (int i = 0; i < n * k; i++) d = fmax(d, fabs(p[i] - p1[i]));
            print_message("%s: batch %d on 1 thread vs batch %d on 2: %s (max |dp| %.3g)\n", what,
                          b1, n, same ? "identical" : "differs", d);
            if (v == V_DIRECT && !same) fail_msg("%s: direct kernels differ by %.3g", what, d);
            assert_true(d <= 1e-6);
            for (int t = 0; t < n; t++)
                assert_int_equal(argmax(p + t * k, k), argmax(p1 + t * k, k));
        }
        free(p1);
    }
    tw_resnet_destroy(net);
    synth_free(&s);
    free(x);
    free(rp);
    free(re);
    free(p);
    free(e);
}

static void test_odd_shapes_basic(void **state)
{
    (void)state;
    check_vs_reference((const int[]){3, 4, 6, 3}, 0, 3, 12, 3, 40, (synth_family){0, 0, 0});
}

static void test_odd_shapes_bottleneck(void **state)
{
    (void)state;
    check_vs_reference((const int[]){3, 4, 6, 3}, 1, 1, 6, 2, 37, (synth_family){0, 0, 0});
}

/* The torchvision family (model/resnet.h) against the plain-loop reference
 * (model/forward_ref.c: each group's outputs a dot product over its own
 * inputs), on every variant: grouped 3x3 convs of 4, 8, 16 and 32 channels
 * per group (oneDNN's AVX-512 kernels decline the blocked layout below 16:
 * the plan reorders around them), a Wide-style 2x inner width, and the
 * small stem (no max pool: 32-px tiles reach layer1 at full size). */
static void test_family_resnext(void **state)
{
    (void)state;
    /* width 4, inner 4 x planes in 4 groups: 4..32 channels per group */
    check_vs_reference((const int[]){3, 4, 6, 3}, 1, 3, 4, 3, 64, (synth_family){4, 4, 0});
}

static void test_family_small_stem(void **state)
{
    (void)state;
    check_vs_reference((const int[]){2, 2, 2, 2}, 0, 3, 8, 4, 32, (synth_family){0, 0, 1});
    /* a wide, grouped bottleneck on the small stem, an odd tile */
    check_vs_reference((const int[]){3, 4, 6, 3}, 1, 2, 4, 3, 33, (synth_family){2, 2, 1});
}

/* bf16 and int8 plans of a grouped net: the same classes as fp32 on
 * most tiles, probabilities near (bf16 and int8 are approximations; this
 * checks the grouped weights' layout and per-channel scales, which a wrong
 * one would scramble far beyond these bounds). */
static void test_family_low_precision(void **state)
{
    (void)state;
    synth s;
    assert_int_equal(
        synth_resnet_ex(&s, (const int[]){3, 4, 6, 3}, 1, 3, 4, 3, 7, (synth_family){4, 4, 0}), 0);
    tw_error err;
    tw_error_init(&err);
    tw_resnet *net = NULL;
    if (tw_resnet_create(&s.mf, "", &net, &err) != TW_OK) fail_msg("%s", err.msg);
    int n = 8, tile = 64, k = net->n_classes;
    size_t elems = (size_t)n * 3 * tile * tile;
    float *x = malloc(elems * sizeof(float)), *rp = malloc((size_t)n * k * sizeof(float));
    float *p = malloc((size_t)n * k * sizeof(float));
    uint64_t r = 777;
    for (size_t i = 0; i < elems; i++) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 4.0 - 2.0);
    }
    assert_int_equal(tw_resnet_forward_ref(net, x, n, tile, rp, NULL, &err), TW_OK);
    const tw_precision precs[2] = {TW_PREC_BF16, TW_PREC_INT8};
    for (int pi = 0; pi < 2; pi++) {
        tw_backend be;
        tw_backend_params bp = tw_backend_default_params();
        bp.threads = 2;
        assert_int_equal(tw_backend_create_ex("cpu", &bp, &be, &err), TW_OK);
        int mb = n;
        if (tw_backend_reserve(&be, net, tile, &mb, precs[pi], false, NULL, &err) != TW_OK)
            fail_msg("reserve: %s", err.msg);
        tw_backend_stats stats;
        be.i->get_stats(be.ctx, &stats);
        tw_infer_batch b = {.n = n, .tile = tile, .x = x, .probs = p};
        if (tw_backend_infer(&be, &b, &err) != TW_OK) fail_msg("infer: %s", err.msg);
        double d = 0;
        int agree = 0;
        for (int i = 0; i < n * k; i++) d = fmax(d, fabs(p[i] - rp[i]));
        for (int t = 0; t < n; t++) agree += argmax(p + t * k, k) == argmax(rp + t * k, k);
        print_message("grouped resnet50 in %s (runs as %d): max |dp| %.3g, %d of %d classes\n",
                      pi ? "int8" : "bf16", (int)stats.precision, d, agree, n);
        assert_true(d <= 0.1);
        assert_true(agree >= n - 1);
        be.i->destroy(be.ctx);
    }
    tw_resnet_destroy(net);
    synth_free(&s);
    free(x);
    free(rp);
    free(p);
}

static void test_bad_calls(void **state)
{
    (void)state;
    synth s;
    assert_int_equal(synth_resnet(&s, (const int[]){2, 2, 2, 2}, 0, 2, 8, 3, 5), 0);
    tw_error err;
    tw_error_init(&err);
    tw_resnet *net = NULL;
    assert_int_equal(tw_resnet_create(&s.mf, "", &net, &err), TW_OK);
    synth_free(&s);
    tw_backend be;
    assert_int_equal(tw_backend_create("cpu", 1, true, &be, &err), TW_OK);
    float x[4 * 2 * 32 * 32] = {0}, p[4 * 3];
    tw_infer_batch b = {.n = 1, .tile = 32, .x = x, .probs = p};
    assert_int_equal(tw_backend_infer(&be, &b, &err), TW_ERR_INTERNAL);
    assert_non_null(strstr(err.msg, "before reserve"));

    int mb = 2;
    assert_int_equal(tw_backend_reserve(&be, net, 32, &mb, TW_PREC_FP32, false, NULL, &err), TW_OK);
    b.n = 3;
    tw_error_init(&err);
    assert_int_equal(tw_backend_infer(&be, &b, &err), TW_ERR_INTERNAL);
    assert_non_null(strstr(err.msg, "3 tiles"));
    b.n = 1;
    b.tile = 16;
    tw_error_init(&err);
    assert_int_equal(tw_backend_infer(&be, &b, &err), TW_ERR_INTERNAL);
    b.tile = 32;
    assert_int_equal(tw_backend_infer(&be, &b, &err), TW_OK);
    assert_true(fabs(p[0] + p[1] + p[2] - 1.0) < 1e-5);

    /* reserving again (another tile size) replaces the first reservation */
    size_t ws = tw_mem_current(TW_MEM_WORKSPACE);
    mb = 2;
    assert_int_equal(tw_backend_reserve(&be, net, 64, &mb, TW_PREC_FP32, false, NULL, &err), TW_OK);
    assert_true(tw_mem_current(TW_MEM_WORKSPACE) > ws);

    /* int8 quantizes the net's weights again for every raster: even a
     * consuming reserve keeps them (unless this CPU has no int8 and it
     * runs in fp32) */
    mb = 2;
    assert_int_equal(tw_backend_reserve(&be, net, 32, &mb, TW_PREC_INT8, true, NULL, &err), TW_OK);
    tw_backend_stats stats;
    be.i->get_stats(be.ctx, &stats);
    if (stats.precision == TW_PREC_INT8) {
        assert_non_null(net->stem.w);
        assert_non_null(net->blocks[0].c1.b);
        /* 8-bit weights only where oneDNN's int8 kernels have VNNI: without
         * it (test_cpu_backend_avx2's ONEDNN_MAX_CPU_ISA=AVX2 on any CPU)
         * two u8 x s8 products share a saturating 16-bit sum */
        dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
        bool vnni = (isa & dnnl_cpu_isa_avx512_core_vnni) == dnnl_cpu_isa_avx512_core_vnni ||
                    (isa & dnnl_cpu_isa_avx2_vnni) == dnnl_cpu_isa_avx2_vnni;
        print_message("int8 on %s: %d-bit weights\n", stats.device, stats.int8_weight_bits);
        assert_int_equal(stats.int8_weight_bits, vnni ? 8 : 7);
        const char *cap = getenv("ONEDNN_MAX_CPU_ISA");
        if (cap && strcmp(cap, "AVX2") == 0) assert_int_equal(stats.int8_weight_bits, 7);
    } else {
        assert_int_equal(stats.int8_weight_bits, 0);
    }
    /* a consuming fp32 reserve frees them; reserving that net again is a
     * clear error, not a crash */
    assert_int_equal(tw_backend_reserve(&be, net, 32, &mb, TW_PREC_FP32, true, NULL, &err), TW_OK);
    assert_null(net->stem.w);
    tw_error_init(&err);
    assert_int_equal(tw_backend_reserve(&be, net, 32, &mb, TW_PREC_FP32, false, NULL, &err),
                     TW_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "already released"));
    be.i->destroy(be.ctx);
    tw_resnet_destroy(net);
}

static void keep_msg(tw_log_level level, const char *msg, void *user)
{
    (void)level;
    snprintf(user, 512, "%s", msg);
}

/* runtime.precision bf16 where oneDNN would run it slower than fp32 (no
 * AVX512-BF16: emulated; an Intel CPU without AMX): fp32 with a notice
 * saying why. Run under ONEDNN_MAX_CPU_ISA=AVX512_CORE (or AVX2) to see
 * the refusal on any AVX-512 machine. */
static void test_bf16_refused_where_slower(void **state)
{
    (void)state;
    synth s;
    assert_int_equal(synth_resnet(&s, (const int[]){2, 2, 2, 2}, 0, 2, 16, 3, 5), 0);
    tw_error err;
    tw_error_init(&err);
    tw_resnet *net = NULL;
    assert_int_equal(tw_resnet_create(&s.mf, "", &net, &err), TW_OK);
    synth_free(&s);
    tw_backend be;
    assert_int_equal(tw_backend_create("cpu", 1, true, &be, &err), TW_OK);
    char msg[512] = "";
    tw_log log = {keep_msg, msg};
    int mb = 2;
    assert_int_equal(tw_backend_reserve(&be, net, 32, &mb, TW_PREC_BF16, false, &log, &err), TW_OK);
    tw_backend_stats st;
    tw_backend_get_stats(&be, &st);
    print_message("bf16 on %s: computes in %s; notice: %s\n", st.device,
                  tw_precision_name(st.precision), msg[0] ? msg : "(none)");
    __builtin_cpu_init();
    bool bf16 = __builtin_cpu_supports("avx512bf16") && cpu_has_avx512_core();
    const char *isa = getenv("ONEDNN_MAX_CPU_ISA");
    if (isa && (strcmp(isa, "AVX512_CORE") == 0 || strcmp(isa, "AVX512_CORE_VNNI") == 0))
        bf16 = false;
    if (!bf16) { /* emulated, or no bf16 convolutions at all: fp32, said */
        assert_int_equal(st.precision, TW_PREC_FP32);
        assert_non_null(strstr(msg, "computing in fp32"));
    }
    if (st.precision == TW_PREC_FP32) assert_non_null(strstr(msg, "bf16"));
    be.i->destroy(be.ctx);
    tw_resnet_destroy(net);
}

/* batch: auto's bound: the smallest power of two with >= 128 pixels in
 * the last stage's maps (tile/32 wide), at most 64; on the nhwc plans with
 * this tree's Winograd (AVX2 CPUs), 64 where those maps are 2x2 or less, for
 * basic-block nets */
static void test_auto_batch(void **state)
{
    (void)state;
    const int blocked[][2] = {{16, 64}, {32, 64}, {33, 32}, {64, 32}, {65, 16}, {128, 8},
                              {224, 4}, {256, 2}, {257, 2}, {352, 2}, {353, 1}, {2048, 1}};
    const int nhwc[][2] = {{16, 64}, {32, 64}, {33, 64}, {64, 64}, {65, 16}, {224, 4}};
    for (int own = 0; own < 2; own++) {
        tw_backend be;
        tw_error err;
        tw_error_init(&err);
        tw_backend_params bp = tw_backend_default_params();
        bp.threads = 1;
        bp.cpu_winograd = own ? TW_CPU_WINOGRAD_OWN : TW_CPU_WINOGRAD_OFF;
        bp.cpu_nhwc = own;
        assert_int_equal(tw_backend_create_ex("cpu", &bp, &be, &err), TW_OK);
        const int(*t)[2] = own ? nhwc : blocked;
        size_t n = own ? sizeof nhwc / sizeof *nhwc : sizeof blocked / sizeof *blocked;
        for (size_t i = 0; i < n; i++)
            assert_int_equal(be.i->auto_batch(be.ctx, NULL, t[i][0]), t[i][1]);
        /* bottleneck nets keep the first rule (memory: bench/RESULTS.md) */
        tw_resnet r50 = {.bottleneck = true};
        assert_int_equal(be.i->auto_batch(be.ctx, &r50, 64), 32);
        /* a small stem keeps the rule (measured: bench/RESULTS.md, issue 31) */
        tw_resnet small = {.bottleneck = true, .stem_kind = TW_STEM_SMALL};
        assert_int_equal(be.i->auto_batch(be.ctx, &small, 64), 32);
        assert_int_equal(be.i->auto_batch(be.ctx, &small, 32), 64);
        be.i->destroy(be.ctx);
    }
}

/* int8 calibration's range (issue 27: a Float32 raster holding +-3e38 made
 * an activation overflow, and the histogram was indexed with Inf/NaN:
 * SIGSEGV, exit 139). Non-finite values are ignored; huge finite ones
 * neither index out of range nor yield a non-finite range. */
static void test_calib_range_nonfinite(void **state)
{
    (void)state;
    enum { N = 4096 };
    float *v = malloc(N * sizeof *v);
    assert_non_null(v);
    /* all ones: the clip is exactly 1 (any lower one clips every value) */
    for (int i = 0; i < N; i++) v[i] = (i & 1) ? 1.0f : -1.0f;
    assert_true(tw_calib_range(v, N, 255) == 1.0f);
    /* ... and stays 1 with NaN and +-Inf among them */
    v[7] = NAN;
    v[100] = INFINITY;
    v[N - 1] = -INFINITY;
    v[2000] = -NAN;
    assert_true(tw_calib_range(v, N, 255) == 1.0f);
    assert_true(tw_calib_range(v, N, 127) == 1.0f);
    /* huge finite values: a finite range within (0, max] */
    v[5] = 3e38f;
    v[6] = -FLT_MAX;
    float r = tw_calib_range(v, N, 255);
    assert_true(isfinite(r) && r > 0.0f && r <= FLT_MAX);
    /* subnormal maximum: per-bin factor ~1e48 in double, still in range */
    for (int i = 0; i < N; i++) v[i] = (float)(i % 5) * 1e-45f;
    r = tw_calib_range(v, N, 255);
    assert_true(isfinite(r) && r > 0.0f && r <= 5e-45f);
    /* nothing finite and non-zero: 0 (q_scale treats it as a dead tensor) */
    for (int i = 0; i < N; i++) v[i] = (i % 3) ? NAN : (i % 2 ? INFINITY : 0.0f);
    assert_true(tw_calib_range(v, N, 255) == 0.0f);
    assert_true(tw_calib_range(v, 0, 255) == 0.0f);
    free(v);
}

/* A sample seen in parts (more tiles than a batch, model/cpu_int8.c's
 * two passes): each part's largest |v|, then each part counted into one
 * histogram, gives tw_calib_range's clip on the whole, for several splits
 * of long-tailed values with a NaN and an Inf among them. */
static void test_calib_parts(void **state)
{
    (void)state;
    enum { N = 10000 };
    float *v = malloc(N * sizeof *v);
    double *hist = malloc(TW_CALIB_BINS * sizeof *hist);
    assert_non_null(v);
    assert_non_null(hist);
    uint32_t r = 7;
    for (int i = 0; i < N; i++) {
        r = r * 1664525u + 1013904223u;
        float u = (float)(r >> 8) / 16777216.0f;
        v[i] = (i & 1 ? 1.0f : -1.0f) * u * u * u * 40.0f; /* a long tail */
    }
    v[123] = NAN;
    v[4567] = INFINITY;
    for (int levels = 127; levels <= 255; levels += 128) {
        float whole = tw_calib_range(v, N, levels);
        assert_true(whole > 0.0f);
        const int cuts[][3] = {{0, N, N}, {0, 3333, N}, {0, 17, 9000}};
        for (int s = 0; s < 3; s++) {
            int from[4] = {cuts[s][0], cuts[s][1], cuts[s][2], N};
            float m = 0.0f;
            for (int k = 0; k < 3; k++) {
                float pm = tw_calib_max(v + from[k], (size_t)(from[k + 1] - from[k]));
                if (pm > m) m = pm;
            }
            memset(hist, 0, TW_CALIB_BINS * sizeof *hist);
            for (int k = 0; k < 3; k++)
                tw_calib_hist_add(hist, m, v + from[k], (size_t)(from[k + 1] - from[k]));
            assert_true(tw_calib_hist_range(hist, m, levels) == whole);
        }
    }
    assert_true(tw_calib_hist_range(hist, 0.0f, 255) == 0.0f);
    free(v);
    free(hist);
}

/* Which calibration tiles may set the ranges: those with a non-finite or
 * an absurd input (over TW_CALIB_OUTLIER x the median tile's max |x|) are
 * left out; a raster normalized to large values throughout keeps them all. */
static void test_calib_keep(void **state)
{
    (void)state;
    enum { T = 6, F = 3 * 8 * 8 };
    float *x = malloc((size_t)T * F * sizeof *x);
    bool keep[T];
    assert_non_null(x);
    for (int i = 0; i < T * F; i++) x[i] = (float)((i * 7919) % 601 - 300) / 100.0f; /* +-3 */
    assert_int_equal(tw_calib_keep(x, T, F, keep), T);
    x[1 * F + 17] = 3e38f / 14.7f; /* a +3e38 pixel, normalized */
    x[2 * F + 0] = NAN;
    x[3 * F + F - 1] = -INFINITY;
    x[4 * F + 5] = -2000.0f; /* 667x the median tile's 3: kept */
    assert_int_equal(tw_calib_keep(x, T, F, keep), 3);
    assert_true(keep[0] && !keep[1] && !keep[2] && !keep[3] && keep[4] && keep[5]);
    x[4 * F + 5] = -4000.0f; /* 1333x: left out */
    assert_int_equal(tw_calib_keep(x, T, F, keep), 2);
    assert_false(keep[4]);
    /* every tile around 1e5 (a scale left out of the workflow): all kept */
    for (int i = 0; i < T * F; i++) x[i] = 1e5f + (float)(i % 13);
    assert_int_equal(tw_calib_keep(x, T, F, keep), T);
    /* all zero (nodata-filled): the bound is 1000 normalized units */
    for (int i = 0; i < T * F; i++) x[i] = 0.0f;
    x[5 * F] = 999.0f;
    assert_int_equal(tw_calib_keep(x, T, F, keep), T);
    x[5 * F] = 1001.0f;
    assert_int_equal(tw_calib_keep(x, T, F, keep), T - 1);
    /* nothing finite: none kept (the backend then measures the batch as it is) */
    for (int i = 0; i < T * F; i++) x[i] = NAN;
    assert_int_equal(tw_calib_keep(x, T, F, keep), 0);
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auto_batch),
        cmocka_unit_test(test_bad_calls),
        cmocka_unit_test(test_bf16_refused_where_slower),
        cmocka_unit_test(test_odd_shapes_basic),
        cmocka_unit_test(test_odd_shapes_bottleneck),
        cmocka_unit_test(test_family_resnext),
        cmocka_unit_test(test_family_small_stem),
        cmocka_unit_test(test_family_low_precision),
        cmocka_unit_test(test_resnet18_vs_pytorch),
        cmocka_unit_test(test_resnet50_vs_pytorch),
        cmocka_unit_test(test_bundle_and_f16_vs_pytorch),
        cmocka_unit_test(test_place_independent),
        cmocka_unit_test(test_batch_independent),
        cmocka_unit_test(test_calib_range_nonfinite),
        cmocka_unit_test(test_calib_keep),
        cmocka_unit_test(test_calib_parts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
