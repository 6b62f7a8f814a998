/* test_budget.c - the memory budget (pipeline/engine/budget.c): batch: auto is the
 * largest batch that fits, refusals name the bytes needed, raster size
 * enters only through the strip and the (capped) GDAL cache, and the
 * weights a backend consumes are counted once. A fake backend with a known
 * workspace makes every figure predictable. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "pipeline/engine/budget.h"

#define MIB ((size_t)1 << 20)

/* Workspace: 1 MiB per tile of the batch, plus 8 MiB. */
static size_t fake_workspace(void *ctx, const tw_resnet *net, int tile, int max_batch,
                             tw_precision prec)
{
    (void)ctx, (void)net, (void)tile, (void)prec;
    return 8 * MIB + (size_t)max_batch * MIB;
}
static bool fake_wants_raw_false(void *ctx)
{
    (void)ctx;
    return false;
}
static bool fake_wants_raw_true(void *ctx)
{
    (void)ctx;
    return true;
}

static const struct tw_backend_i cpu_like = {
    .name = "fake", .workspace_bytes = fake_workspace, .wants_raw = fake_wants_raw_false};
static const struct tw_backend_i gpu_like = {
    .name = "fake-raw", .workspace_bytes = fake_workspace, .wants_raw = fake_wants_raw_true};
static tw_backend be_cpu = {.i = &cpu_like}, be_gpu = {.i = &gpu_like};

static tw_budget_in input(size_t total)
{
    return (tw_budget_in){
        .total = total,
        .base = 50 * MIB,
        .weights = 45 * MIB,
        .backend = &be_cpu,
        .precision = TW_PREC_FP32,
        .tile = 64,
        .stride = 64,
        .bands = 6,
        .dtype = TW_DT_UINT16,
        .n_classes = 7,
        .feat_dim = 512,
        .max_auto_batch = 64,
        .raster_w = 10000,
        .block_w = 256,
        .block_h = 256,
        .strip = 2 * MIB,
    };
}

static tw_status plan(const tw_budget_in *in, tw_budget *b, char *msg)
{
    tw_error err;
    tw_error_init(&err);
    tw_status st = tw_budget_plan(in, b, &err);
    if (msg) snprintf(msg, TW_ERROR_MSG_MAX, "%s", err.msg);
    return st;
}

/* The parts add up, and the estimate never exceeds the worst case. */
static void assert_consistent(const tw_budget_in *in, const tw_budget *b)
{
    assert_int_equal(b->slots, b->slot_bytes * (size_t)b->n_slots);
    assert_int_equal(b->workspace, 8 * MIB + (size_t)b->batch * MIB);
    assert_int_equal(b->slot_bytes, tw_budget_slot_bytes(in, b->batch, b->ref_capacity));
    assert_true(b->ref_capacity >= b->batch);
    assert_true(b->estimate <= b->total);
    assert_true(b->total <= in->total);
    assert_true(b->total >= b->base + b->strip + b->margin + b->slots + b->workspace);
}

static void test_auto_batch_is_largest_that_fits(void **state)
{
    (void)state;
    for (size_t mib = 260; mib <= 1200; mib += 47) {
        tw_budget_in in = input(mib * MIB);
        tw_budget b;
        char msg[TW_ERROR_MSG_MAX];
        if (plan(&in, &b, msg) != TW_OK) fail_msg("%zu MiB: %s", mib, msg);
        assert_consistent(&in, &b);
        assert_true(b.batch >= 1 && b.batch <= in.max_auto_batch);
        if (b.batch < in.max_auto_batch) {
            /* one more tile per batch must not fit: asked for explicitly, refused */
            tw_budget_in more = in;
            more.fixed_batch = b.batch + 1;
            tw_budget b2;
            assert_int_equal(plan(&more, &b2, msg), TW_ERR_NOMEM);
            assert_true(b2.total > in.total);
        }
    }
    /* Monotone: more memory never gives a smaller batch. */
    int prev = 0;
    for (size_t mib = 260; mib <= 4000; mib += 100) {
        tw_budget_in in = input(mib * MIB);
        tw_budget b;
        assert_int_equal(plan(&in, &b, NULL), TW_OK);
        assert_true(b.batch >= prev);
        prev = b.batch;
    }
    assert_int_equal(prev, 64); /* capped by the backend's auto_batch bound */
}

static void test_refusals_name_the_bytes(void **state)
{
    (void)state;
    char msg[TW_ERROR_MSG_MAX];
    tw_budget b;
    tw_budget_in in = input(100 * MIB); /* less than base + 2 x weights */
    assert_int_equal(plan(&in, &b, msg), TW_ERR_NOMEM);
    assert_non_null(strstr(msg, "runtime.memory 100.0 MiB is too small: even batch 1 needs about"));
    /* the breakdown names what the total is made of (here the model load, 2 x 45 MiB of
     * weights, is the peak), and its items add up to it (test_preflight checks the sum) */
    if (!strstr(msg, "model load (file + folded weights) 90.0 MiB")) fail_msg("breakdown: %s", msg);
    assert_true(b.total > in.total);

    in = input(300 * MIB);
    in.fixed_batch = 4000;
    assert_int_equal(plan(&in, &b, msg), TW_ERR_NOMEM);
    assert_non_null(strstr(msg, "too small for tiling.batch 4000"));
    assert_non_null(strstr(msg, "use batch: auto or a larger budget"));

    /* A fixed batch that fits is taken as it is, even when auto would pick more. */
    in.fixed_batch = 3;
    assert_int_equal(plan(&in, &b, msg), TW_OK);
    assert_int_equal(b.batch, 3);
    assert_consistent(&in, &b);
}

/* A raster 100 times wider changes the GDAL cache (capped at a quarter of
 * what is left) and nothing else; the strip is the caller's figure. */
static void test_raster_size_only_through_cache(void **state)
{
    (void)state;
    tw_budget_in narrow = input(1024 * MIB), wide = narrow;
    wide.raster_w = narrow.raster_w * 100;
    tw_budget a, b;
    assert_int_equal(plan(&narrow, &a, NULL), TW_OK);
    assert_int_equal(plan(&wide, &b, NULL), TW_OK);
    assert_true(b.gdal_cache > a.gdal_cache);
    size_t fixed = b.base + b.weights + b.strip + b.margin;
    assert_true(b.gdal_cache <= (wide.total - fixed) / 4);
    assert_int_equal(a.slot_bytes, tw_budget_slot_bytes(&narrow, a.batch, a.ref_capacity));
    assert_true(b.batch <= a.batch); /* the cache takes room from the slots */
    /* A VRT's own blocks never enter the cache: the estimate expects 4 MiB. */
    tw_budget_in vrt = wide;
    vrt.vrt = true;
    tw_budget c;
    assert_int_equal(plan(&vrt, &c, NULL), TW_OK);
    assert_int_equal(c.gdal_cache_expected, 4 * MIB);
    assert_true(c.estimate < c.total);
}

/* Weights the backend consumes at reserve count at the model load (twice:
 * file tensors and folded weights side by side), not through the run. */
static void test_consumed_weights_counted_once(void **state)
{
    (void)state;
    tw_budget_in kept = input(2048 * MIB), consumed = kept;
    kept.weights = consumed.weights = 50 * MIB;
    consumed.weights_consumed = true;
    kept.fixed_batch = consumed.fixed_batch = 32;
    tw_budget a, b;
    assert_int_equal(plan(&kept, &a, NULL), TW_OK);
    assert_int_equal(plan(&consumed, &b, NULL), TW_OK);
    assert_true(b.total < a.total);
    assert_true(a.total - b.total <= a.weights);
    /* The load (2 x weights) is a floor either way; with big weights it is
     * the peak, and consuming them then saves nothing. */
    assert_true(b.total >= b.base + b.strip + b.margin + 2 * b.weights);
    kept.weights = consumed.weights = 600 * MIB;
    kept.fixed_batch = consumed.fixed_batch = 8;
    assert_int_equal(plan(&kept, &a, NULL), TW_OK);
    assert_int_equal(plan(&consumed, &b, NULL), TW_OK);
    assert_int_equal(b.total, a.total);
    assert_int_equal(a.total, a.base + a.strip + a.margin + 2 * a.weights);
}

/* A backend that normalizes on the device (wants_raw) needs no float32
 * copy of the batch on the host: smaller slots, same batch or larger. */
static void test_raw_backend_smaller_slots(void **state)
{
    (void)state;
    tw_budget_in cpu = input(400 * MIB), gpu = cpu;
    gpu.backend = &be_gpu;
    size_t s_cpu = tw_budget_slot_bytes(&cpu, 16, 16 + 256);
    size_t s_gpu = tw_budget_slot_bytes(&gpu, 16, 16 + 256);
    assert_int_equal(s_cpu - s_gpu, (size_t)16 * 6 * 64 * 64 * sizeof(float));
    tw_budget a, b;
    assert_int_equal(plan(&cpu, &a, NULL), TW_OK);
    assert_int_equal(plan(&gpu, &b, NULL), TW_OK);
    assert_true(b.batch >= a.batch);
    /* embeddings asked for: the slot holds them too */
    tw_budget_in emb = cpu;
    emb.want_emb = true;
    assert_int_equal(tw_budget_slot_bytes(&emb, 16, 272) - s_cpu, (size_t)16 * 512 * 4);
}

static void test_rss_readings(void **state)
{
    (void)state;
    size_t now = tw_rss_now(), peak = tw_rss_peak();
    assert_true(now > 0);
    assert_true(peak >= now);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auto_batch_is_largest_that_fits),
        cmocka_unit_test(test_refusals_name_the_bytes),
        cmocka_unit_test(test_raster_size_only_through_cache),
        cmocka_unit_test(test_consumed_weights_counted_once),
        cmocka_unit_test(test_raw_backend_smaller_slots),
        cmocka_unit_test(test_rss_readings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
