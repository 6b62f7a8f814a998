/* test_stages.c - the stage workers (pipeline/engine/stages.c) through tw_run.
 *
 * A backend with infer_begin/infer_end (as the CUDA backend has) makes the
 * infer stage keep two batches in flight, in alternating lanes, and pass
 * them on out of order. Here a CPU backend wrapped in such an interface
 * computes each batch at its begin into the lane's own buffers and hands
 * them over at its end, so a batch ended in the wrong lane, ended twice or
 * never, or a slot passed on before its end, gives wrong outputs or a
 * protocol error. Its outputs must equal the plain CPU backend's, value for
 * value, with several readers and a batch size that leaves a short last
 * batch.
 *
 * The infer stage runs on the thread that called tw_run, the one that
 * reserved the backend: the CPU backend's OpenMP team is then the one its
 * reserve started. Every call the wrapper gets says which thread made it.
 */
#include <gdal.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/backend.h"
#include "pipeline/run/run.h"
#include "tests/testutil.h"

enum { LANES = 2 };

typedef struct async_ctx {
    tw_backend inner;
    float *probs[LANES], *emb[LANES]; /* each lane's results, until its end */
    size_t cap_probs, cap_emb;
    int n_classes, feat_dim;
    bool busy[LANES];
    long long begun[LANES], order; /* begin order of the batch in each lane */
    long long next_end;            /* batches must end in the order begun */
    int in_flight, max_in_flight;
    long long n_begin, n_end;
    bool protocol_error;
    pthread_t caller;    /* the thread that created the backend (tw_run's) */
    int calls_elsewhere; /* reserve, infer, begin and end calls from another thread */
} async_ctx;

static async_ctx *g_last; /* the context of the last backend made, for the asserts */
/* The first begin of a run waits this long (microseconds): the readers fill
 * the queue meanwhile, so the infer stage must hold that batch and begin
 * the next one, whatever the core count (0: no wait). */
static unsigned g_first_begin_wait_us;

static size_t a_workspace(void *ctx, const tw_resnet *net, int tile, int max_batch,
                          tw_precision prec)
{
    async_ctx *a = ctx;
    return a->inner.i->workspace_bytes(a->inner.ctx, net, tile, max_batch, prec);
}
static int a_auto_batch(void *ctx, const tw_resnet *net, int tile)
{
    async_ctx *a = ctx;
    return a->inner.i->auto_batch(a->inner.ctx, net, tile);
}
static bool a_supports(void *ctx, const tw_resnet *net, int tile, tw_precision want,
                       tw_precision *runs_as, char *why, size_t why_size)
{
    async_ctx *a = ctx;
    return a->inner.i->supports(a->inner.ctx, net, tile, want, runs_as, why, why_size);
}
static tw_status a_reserve(void *ctx, tw_resnet *net, int tile, int batch, tw_precision prec,
                           bool consume, tw_error *err)
{
    async_ctx *a = ctx;
    if (!pthread_equal(pthread_self(), a->caller)) a->calls_elsewhere++;
    tw_status st = a->inner.i->reserve(a->inner.ctx, net, tile, batch, prec, consume, err);
    if (st != TW_OK) return st;
    /* the inner backend is driven directly: record its reservation as
     * tw_backend_reserve would */
    a->inner.reserved = true;
    a->inner.tile = tile;
    a->inner.max_batch = batch;
    a->n_classes = net->n_classes;
    a->feat_dim = net->feat_dim;
    a->cap_probs = (size_t)batch * (size_t)net->n_classes;
    a->cap_emb = (size_t)batch * (size_t)net->feat_dim;
    for (int l = 0; l < LANES; l++) {
        a->probs[l] = calloc(a->cap_probs, sizeof(float));
        a->emb[l] = calloc(a->cap_emb, sizeof(float));
        if (!a->probs[l] || !a->emb[l]) return tw_error_set(err, TW_ERR_NOMEM, "test: no memory");
    }
    return TW_OK;
}
static bool a_consumes(void *ctx, tw_precision prec)
{
    async_ctx *a = ctx;
    return a->inner.i->consumes_weights(a->inner.ctx, prec);
}
static tw_status a_infer(void *ctx, const tw_infer_batch *b, tw_error *err)
{
    async_ctx *a = ctx;
    if (!pthread_equal(pthread_self(), a->caller)) a->calls_elsewhere++;
    return a->inner.i->infer(a->inner.ctx, b, err);
}
static tw_status a_begin(void *ctx, const tw_infer_batch *b, int lane, tw_error *err)
{
    async_ctx *a = ctx;
    if (!pthread_equal(pthread_self(), a->caller)) a->calls_elsewhere++;
    if (lane < 0 || lane >= LANES || a->busy[lane]) {
        a->protocol_error = true;
        return tw_error_set(err, TW_ERR_INTERNAL, "test: begin in a busy lane %d", lane);
    }
    if (a->n_begin == 0 && g_first_begin_wait_us) usleep(g_first_begin_wait_us);
    /* compute now, into the lane's buffers: b's own outputs stay untouched */
    tw_infer_batch own = *b;
    own.probs = a->probs[lane];
    own.emb = b->emb ? a->emb[lane] : NULL;
    tw_status st = a->inner.i->infer(a->inner.ctx, &own, err);
    if (st != TW_OK) return st;
    a->busy[lane] = true;
    a->begun[lane] = a->order++;
    a->n_begin++;
    if (++a->in_flight > a->max_in_flight) a->max_in_flight = a->in_flight;
    return TW_OK;
}
static tw_status a_end(void *ctx, const tw_infer_batch *b, int lane, tw_error *err)
{
    async_ctx *a = ctx;
    if (!pthread_equal(pthread_self(), a->caller)) a->calls_elsewhere++;
    if (lane < 0 || lane >= LANES || !a->busy[lane] || a->begun[lane] != a->next_end) {
        a->protocol_error = true;
        return tw_error_set(err, TW_ERR_INTERNAL, "test: end of lane %d out of order", lane);
    }
    memcpy(b->probs, a->probs[lane], (size_t)b->n * (size_t)a->n_classes * sizeof(float));
    if (b->emb) memcpy(b->emb, a->emb[lane], (size_t)b->n * (size_t)a->feat_dim * sizeof(float));
    a->busy[lane] = false;
    a->next_end++;
    a->n_end++;
    a->in_flight--;
    return TW_OK;
}
static bool a_wants_raw(void *ctx)
{
    async_ctx *a = ctx;
    return a->inner.i->wants_raw(a->inner.ctx);
}
static void a_stats(void *ctx, tw_backend_stats *out)
{
    async_ctx *a = ctx;
    a->inner.i->get_stats(a->inner.ctx, out);
}
static void a_destroy(void *ctx)
{
    async_ctx *a = ctx;
    tw_backend_destroy(&a->inner);
    for (int l = 0; l < LANES; l++) {
        free(a->probs[l]);
        free(a->emb[l]);
        a->probs[l] = a->emb[l] = NULL;
    }
    /* kept (not freed) for the asserts: g_last */
}

static const struct tw_backend_i async_iface = {
    .name = "cpu-async",
    .workspace_bytes = a_workspace,
    .auto_batch = a_auto_batch,
    .supports = a_supports,
    .reserve = a_reserve,
    .consumes_weights = a_consumes,
    .infer = a_infer,
    .infer_begin = a_begin,
    .infer_end = a_end,
    .wants_raw = a_wants_raw,
    .get_stats = a_stats,
    .destroy = a_destroy,
};

/* "cpu-slow": the CPU backend, each batch g_slow_us late - a run as long as
 * the test needs on any machine. */
static int g_slow_us;

static tw_status slow_infer(void *ctx, const tw_infer_batch *b, tw_error *err)
{
    if (g_slow_us > 0) usleep((useconds_t)g_slow_us);
    return a_infer(ctx, b, err);
}

static const struct tw_backend_i slow_iface = {
    .name = "cpu-slow",
    .workspace_bytes = a_workspace,
    .auto_batch = a_auto_batch,
    .supports = a_supports,
    .reserve = a_reserve,
    .consumes_weights = a_consumes,
    .infer = slow_infer,
    .wants_raw = a_wants_raw,
    .get_stats = a_stats,
    .destroy = a_destroy,
};

static tw_status async_create(const tw_backend_params *params, tw_backend *out, tw_error *err)
{
    async_ctx *a = calloc(1, sizeof *a);
    if (!a) return tw_error_set(err, TW_ERR_NOMEM, "test: no memory");
    tw_status st = tw_cpu_backend_create(params, &a->inner, err);
    if (st != TW_OK) {
        free(a);
        return st;
    }
    free(g_last);
    g_last = a;
    a->caller = pthread_self();
    out->i = &async_iface;
    out->ctx = a;
    return TW_OK;
}

static tw_status slow_create(const tw_backend_params *params, tw_backend *out, tw_error *err)
{
    tw_status st = async_create(params, out, err);
    if (st == TW_OK) out->i = &slow_iface;
    return st;
}

/* Every band of a raster, as doubles. */
static double *read_raster(const char *path, int *n)
{
    GDALDatasetH ds = GDALOpen(path, GA_ReadOnly);
    if (!ds) fail_msg("cannot open %s", path);
    int w = GDALGetRasterXSize(ds), h = GDALGetRasterYSize(ds), c = GDALGetRasterCount(ds);
    *n = w * h * c;
    double *v = malloc(sizeof(double) * (size_t)*n);
    assert_non_null(v);
    assert_int_equal(
        GDALDatasetRasterIO(ds, GF_Read, 0, 0, w, h, v, w, h, GDT_Float64, c, NULL, 0, 0, 0),
        CE_None);
    GDALClose(ds);
    return v;
}

static void run_into(const char *device, int readers, int batch, const char *dir)
{
    const char *src = getenv("TW_SOURCE_DIR");
    tw_run_params p = tw_run_default_params();
    snprintf(p.input.paths[0], sizeof p.input.paths[0], "%s/sample_data/L7_ETMs.tif", src);
    p.input.n_paths = 1;
    snprintf(p.model.weights, sizeof p.model.weights, "%s/sample_data/demo_resnet18.h5", src);
    p.tiling.tile = 64;
    p.tiling.stride = 32;
    p.tiling.batch = batch;
    snprintf(p.runtime.device, sizeof p.runtime.device, "%s", device);
    p.runtime.readers = readers;
    p.runtime.threads = 1;
    snprintf(p.output.dir, sizeof p.output.dir, "%s", dir);
    p.output.products = TW_PRODUCT_CLASS | TW_PRODUCT_PROB;
    p.quiet = true;
    tw_error err;
    tw_error_init(&err);
    tw_run_result *r = NULL;
    if (tw_run(&p, NULL, &r, &err) != TW_OK) fail_msg("%s: %s", device, err.msg);
    if (strcmp(device, "cpu-async") == 0)
        assert_int_equal(r->budget.n_slots, readers + 4); /* the held batch has a slot */
    else
        assert_int_equal(r->budget.n_slots, readers + 3);
    tw_run_result_destroy(r);
}

static void test_async_backend_same_outputs(void **state)
{
    (void)state;
    const char *src = getenv("TW_SOURCE_DIR");
    if (!src) skip();
    const char *dir = tw_test_tmpdir();
    char a_dir[512], b_dir[512];
    snprintf(a_dir, sizeof a_dir, "%s/plain", dir);
    snprintf(b_dir, sizeof b_dir, "%s/async", dir);
    /* 100 tiles in batches of 7: a short last batch */
    run_into("cpu", 1, 7, a_dir);
    g_first_begin_wait_us = 300000;
    for (int readers = 1; readers <= 3; readers += 2) {
        run_into("cpu-async", readers, 7, b_dir);
        assert_non_null(g_last);
        assert_false(g_last->protocol_error);
        assert_int_equal(g_last->calls_elsewhere, 0);
        assert_int_equal(g_last->n_begin, 15); /* ceil(100 / 7) */
        assert_int_equal(g_last->n_end, g_last->n_begin);
        /* two in flight when the next batch was already queued, never more:
         * the first begin waits until the readers have queued more, so the
         * stage must overlap (it once passed with 1, which a stage that never
         * overlaps gives too, and with whatever the cores made happen) */
        print_message("readers %d: at most %d batches in flight\n", readers, g_last->max_in_flight);
        assert_int_equal(g_last->max_in_flight, 2);
        static const char *prods[] = {"class", "prob"};
        for (int i = 0; i < 2; i++) {
            char pa[600], pb[600];
            snprintf(pa, sizeof pa, "%s/L7_ETMs.%s.tif", a_dir, prods[i]);
            snprintf(pb, sizeof pb, "%s/L7_ETMs.%s.tif", b_dir, prods[i]);
            int na, nb;
            double *va = read_raster(pa, &na), *vb = read_raster(pb, &nb);
            assert_int_equal(na, nb);
            for (int k = 0; k < na; k++)
                if (va[k] != vb[k])
                    fail_msg("%s: value %d differs (%g vs %g), readers %d", prods[i], k, va[k],
                             vb[k], readers);
            free(va);
            free(vb);
        }
    }
    g_first_begin_wait_us = 0;
    free(g_last);
    g_last = NULL;
}

/* Readers finishing out of order while the infer stage holds a begun
 * batch: once, the batch the write stage waited for could be the held one,
 * with every other slot parked behind it in the ordered write queue and the
 * infer stage waiting for input that no reader could read (a hang). Many
 * small batches, several readers, a few runs: every run must finish, with
 * every batch ended. */
static void test_async_no_stall(void **state)
{
    (void)state;
    const char *src = getenv("TW_SOURCE_DIR");
    if (!src) skip();
    const char *dir = tw_test_tmpdir();
    char out[512];
    snprintf(out, sizeof out, "%s/stall", dir);
    for (int round = 0; round < 6; round++) {
        run_into("cpu-async", 2 + round % 4, 3, out);
        assert_false(g_last->protocol_error);
        assert_int_equal(g_last->calls_elsewhere, 0);
        assert_int_equal(g_last->n_begin, 34); /* ceil(100 / 3) */
        assert_int_equal(g_last->n_end, g_last->n_begin);
    }
    free(g_last);
    g_last = NULL;
}

/* A stop request from the run's own tiles hook once `at` tiles are done
 * (what the CLI's SIGTERM handler does, from another thread). */
typedef struct stopper {
    volatile sig_atomic_t flag;
    int64_t at;
} stopper;

static int keep_going(double f, const char *msg, void *user)
{
    (void)f;
    (void)msg;
    (void)user;
    return 1;
}

static void stop_at(int64_t done, int64_t total, const char *msg, void *user)
{
    (void)total;
    (void)msg;
    stopper *s = user;
    if (s->at >= 0 && done >= s->at) __atomic_store_n(&s->flag, 1, __ATOMIC_RELAXED);
}

/* One run of the sample raster (as run_into) that stops after `at` tiles
 * (at < 0: never). Returns its status; *classified: the tiles it stitched. */
static tw_status run_stopping(const char *device, int readers, int batch, const char *dir,
                              int64_t at, int64_t *classified)
{
    const char *src = getenv("TW_SOURCE_DIR");
    tw_run_params p = tw_run_default_params();
    snprintf(p.input.paths[0], sizeof p.input.paths[0], "%s/sample_data/L7_ETMs.tif", src);
    p.input.n_paths = 1;
    snprintf(p.model.weights, sizeof p.model.weights, "%s/sample_data/demo_resnet18.h5", src);
    p.tiling.tile = 64;
    p.tiling.stride = 32;
    p.tiling.batch = batch;
    snprintf(p.runtime.device, sizeof p.runtime.device, "%s", device);
    p.runtime.readers = readers;
    p.runtime.threads = 1;
    snprintf(p.output.dir, sizeof p.output.dir, "%s", dir);
    p.output.products = TW_PRODUCT_CLASS | TW_PRODUCT_PROB;
    p.quiet = true;
    p.chunk_rows = 4; /* chunks of 4 cell rows: stops land inside and between them */
    stopper st = {.flag = 0, .at = at};
    tw_run_hooks hooks = {.progress = keep_going, .tiles = stop_at, .progress_user = &st};
    hooks.stop = &st.flag;
    tw_error err;
    tw_error_init(&err);
    tw_run_result *r = NULL;
    tw_status status = tw_run(&p, &hooks, &r, &err);
    if (status != TW_OK && status != TW_CANCELLED) fail_msg("%s: %s", device, err.msg);
    *classified = r && r->n_inputs == 1 ? r->inputs[0].tiles_classified : -1;
    tw_run_result_destroy(r);
    return status;
}

/* Stopped twice (after 23 tiles, then after 41 more), then run to the end:
 * the outputs are the uninterrupted run's, value for value, each stopped run
 * kept its tiles and went little further, and every one of the 100 tiles was
 * stitched exactly once over the three runs (none lost at a stop, none
 * redone) - with the plain CPU backend, and with two
 * batches in flight and readers ending out of order (cpu-async, 1 and 3
 * readers: the batches after a stop are dropped or, before one already
 * inferred, run to fill the gap). */
static void test_stop_resumes_exactly(void **state)
{
    (void)state;
    const char *src = getenv("TW_SOURCE_DIR");
    if (!src) skip();
    const char *dir = tw_test_tmpdir();
    char ref[512], out[512];
    snprintf(ref, sizeof ref, "%s/ref", dir);
    run_into("cpu", 1, 7, ref);
    const char *devices[] = {"cpu", "cpu-async", "cpu-async"};
    const int readers[] = {1, 1, 3};
    for (int v = 0; v < 3; v++) {
        snprintf(out, sizeof out, "%s/stop%d", dir, v);
        /* A run that the stop reaches once every tile is inferred (the
         * write stage lags) finishes instead: no third run then. */
        const int64_t at[3] = {23, 41, -1};
        int64_t n[3] = {0, 0, 0}, sum = 0;
        for (int k = 0; k < 3; k++) {
            tw_status st = run_stopping(devices[v], readers[v], 7, out, at[k], &n[k]);
            sum += n[k];
            if (st == TW_OK) break;
            assert_int_equal(st, TW_CANCELLED);
            assert_true(at[k] >= 0);
            /* kept what was stitched and inferred, little more: the batch
             * that crossed the mark and at most one per slot (those
             * inferred before the stop came, the one being inferred, gap
             * fillers); finishing the chunk under way went further */
            int slots = readers[v] + (v > 0 ? 4 : 3);
            assert_true(n[k] >= at[k] && n[k] <= at[k] + 7 * (1 + slots));
        }
        print_message("%s, %d readers: %lld + %lld + %lld tiles\n", devices[v], readers[v],
                      (long long)n[0], (long long)n[1], (long long)n[2]);
        assert_int_equal(sum, 100);
        static const char *prods[] = {"class", "prob"};
        for (int i = 0; i < 2; i++) {
            char pa[600], pb[600];
            snprintf(pa, sizeof pa, "%s/L7_ETMs.%s.tif", ref, prods[i]);
            snprintf(pb, sizeof pb, "%s/L7_ETMs.%s.tif", out, prods[i]);
            int na, nb;
            double *va = read_raster(pa, &na), *vb = read_raster(pb, &nb);
            assert_int_equal(na, nb);
            for (int k = 0; k < na; k++)
                if (va[k] != vb[k])
                    fail_msg("%s: value %d differs (%g vs %g), %s, %d readers", prods[i], k, va[k],
                             vb[k], devices[v], readers[v]);
            free(va);
            free(vb);
        }
    }
    free(g_last);
    g_last = NULL;
}

/* Cancel (what the progress hook's 0 does: no checkpoint at the end, the
 * open chunk's temporaries dropped - what a kill -9 leaves) once the
 * periodic checkpoint's state file exists. */
static const char *g_state_path;

static int cancel_after_checkpoint(double f, const char *msg, void *user)
{
    (void)f;
    (void)msg;
    (void)user;
    return access(g_state_path, F_OK) != 0;
}

/* One chunk for the whole grid, batches made 0.4 s long: after
 * TW_CHECKPOINT_S (5 s) without a commit the write stage takes a
 * checkpoint; the run is then cut off as a kill -9 would (see above), and
 * the rerun resumes from the checkpoint - fewer than the 100 tiles - to the
 * uninterrupted run's outputs, value for value. */
static void test_periodic_checkpoint(void **state)
{
    (void)state;
    const char *src = getenv("TW_SOURCE_DIR");
    if (!src) skip();
    const char *dir = tw_test_tmpdir();
    char ref[512], out[512], st_path[700];
    snprintf(ref, sizeof ref, "%s/ref", dir);
    snprintf(out, sizeof out, "%s/cut", dir);
    snprintf(st_path, sizeof st_path, "%s/.tilewise/L7_ETMs/state.0001-of-0001", out);
    g_state_path = st_path;
    run_into("cpu", 1, 7, ref);

    tw_run_params p = tw_run_default_params();
    snprintf(p.input.paths[0], sizeof p.input.paths[0], "%s/sample_data/L7_ETMs.tif", src);
    p.input.n_paths = 1;
    snprintf(p.model.weights, sizeof p.model.weights, "%s/sample_data/demo_resnet18.h5", src);
    p.tiling.tile = 64;
    p.tiling.stride = 32;
    p.tiling.batch = 7;
    snprintf(p.runtime.device, sizeof p.runtime.device, "cpu-slow");
    p.runtime.readers = 1;
    p.runtime.threads = 1;
    snprintf(p.output.dir, sizeof p.output.dir, "%s", out);
    p.output.products = TW_PRODUCT_CLASS | TW_PRODUCT_PROB;
    p.quiet = true;
    p.chunk_rows = 1000; /* one chunk: no commit before the end */
    tw_run_hooks hooks = {.progress = cancel_after_checkpoint};
    tw_error err;
    tw_error_init(&err);
    tw_run_result *r = NULL;
    g_slow_us = 400000;
    tw_status st = tw_run(&p, &hooks, &r, &err);
    int64_t first = r ? r->inputs[0].tiles_classified : -1;
    tw_run_result_destroy(r);
    assert_int_equal(st, TW_CANCELLED);
    assert_int_equal(access(st_path, F_OK), 0);

    g_slow_us = 0;
    hooks.progress = keep_going;
    r = NULL;
    tw_error_init(&err);
    if (tw_run(&p, &hooks, &r, &err) != TW_OK) fail_msg("rerun: %s", err.msg);
    int64_t rest = r->inputs[0].tiles_classified;
    tw_run_result_destroy(r);
    print_message("cut after %lld tiles; the rerun classified %lld\n", (long long)first,
                  (long long)rest);
    assert_true(rest > 0 && rest < 100 && rest >= 100 - first);
    static const char *prods[] = {"class", "prob"};
    for (int i = 0; i < 2; i++) {
        char pa[600], pb[600];
        snprintf(pa, sizeof pa, "%s/L7_ETMs.%s.tif", ref, prods[i]);
        snprintf(pb, sizeof pb, "%s/L7_ETMs.%s.tif", out, prods[i]);
        int na, nb;
        double *va = read_raster(pa, &na), *vb = read_raster(pb, &nb);
        assert_int_equal(na, nb);
        for (int k = 0; k < na; k++)
            if (va[k] != vb[k])
                fail_msg("%s: value %d differs (%g vs %g)", prods[i], k, va[k], vb[k]);
        free(va);
        free(vb);
    }
    free(g_last);
    g_last = NULL;
}

/* The normalize stage beside a CPU backend takes the cores its inference
 * leaves, one at least (1: no OpenMP team of its own, the inference's team
 * the only one: tw_run_normalize_threads); the reader count too is counted
 * in the cores the process may use. */
static bool r_wants_raw(void *ctx)
{
    (void)ctx;
    return true;
}
/* Only what tw_run_readers and tw_run_normalize_threads ask: a backend that
 * reads raw pixels (a GPU's). */
static const struct tw_backend_i raw_iface = {.name = "raw", .wants_raw = r_wants_raw};

/* The process's CPUs cut to the first n of the allowed (false when it has
 * fewer); omp_get_num_procs follows the calling thread's affinity. */
static bool pin_to(int n, const cpu_set_t *all)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    int got = 0;
    for (int c = 0; c < CPU_SETSIZE && got < n; c++)
        if (CPU_ISSET(c, all)) {
            CPU_SET(c, &s);
            got++;
        }
    if (got < n) return false;
    assert_int_equal(pthread_setaffinity_np(pthread_self(), sizeof s, &s), 0);
    assert_int_equal(omp_get_num_procs(), n);
    return true;
}

/* The stage sizes on 1 and 2 cores (a 2-core CI machine, a SLURM job of
 * one CPU), whatever this machine has: exact numbers, the same on every
 * machine, for the CPU backend and for a raw-pixel (GPU) backend. */
static void test_threads_on_few_cores(void **state)
{
    (void)state;
    cpu_set_t all;
    assert_int_equal(pthread_getaffinity_np(pthread_self(), sizeof all, &all), 0);
    tw_error err;
    tw_error_init(&err);
    tw_backend cpu, raw = {.i = &raw_iface};
    assert_int_equal(tw_backend_create("cpu", 0, true, &cpu, &err), TW_OK);
    tw_run_params p = tw_run_default_params();
    /* {cores, runtime.threads, normalize threads beside the CPU backend} */
    static const int cases[][3] = {{1, 0, 1}, {1, 1, 1}, {1, 4, 1}, {2, 0, 1},
                                   {2, 1, 1}, {2, 2, 1}, {2, 3, 1}};
    int ran = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (!pin_to(cases[i][0], &all)) continue;
        ran++;
        p.runtime.threads = cases[i][1];
        p.runtime.readers = 0;
        assert_int_equal(tw_run_normalize_threads(&p, &cpu), cases[i][2]);
        assert_int_equal(tw_run_readers(&p, &cpu), 1);
        /* a raw-pixel backend normalizes on its device (0: OpenMP's
         * default) and gets cores - 2 readers, one at least */
        assert_int_equal(tw_run_normalize_threads(&p, &raw), 0);
        assert_int_equal(tw_run_readers(&p, &raw), 1);
        p.runtime.readers = 3; /* asked for: as asked */
        assert_int_equal(tw_run_readers(&p, &raw), 3);
        assert_int_equal(tw_run_readers(&p, &cpu), 3);
    }
    assert_int_equal(pthread_setaffinity_np(pthread_self(), sizeof all, &all), 0);
    tw_backend_destroy(&cpu);
    if (!ran) skip();
}

static void test_normalize_threads(void **state)
{
    (void)state;
    tw_error err;
    tw_error_init(&err);
    tw_backend be;
    assert_int_equal(tw_backend_create("cpu", 0, true, &be, &err), TW_OK);
    tw_run_params p = tw_run_default_params();
    int procs = omp_get_num_procs();
    p.runtime.threads = 0; /* all cores */
    assert_int_equal(tw_run_normalize_threads(&p, &be), 1);
    p.runtime.threads = procs + 3;
    assert_int_equal(tw_run_normalize_threads(&p, &be), 1);
    p.runtime.threads = 1;
    assert_int_equal(tw_run_normalize_threads(&p, &be), procs > 2 ? procs - 1 : 1);
    assert_int_equal(tw_run_readers(&p, &be), 1); /* the CPU's inference owns the cores */
    be.i->destroy(be.ctx);
}

int main(void)
{
    tw_error err;
    tw_error_init(&err);
    if (tw_backend_register("cpu-async", async_create, &err) != TW_OK ||
        tw_backend_register("cpu-slow", slow_create, &err) != TW_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    GDALAllRegister();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_async_backend_same_outputs),
        cmocka_unit_test(test_async_no_stall),
        cmocka_unit_test(test_stop_resumes_exactly),
        cmocka_unit_test(test_periodic_checkpoint),
        cmocka_unit_test(test_normalize_threads),
        cmocka_unit_test(test_threads_on_few_cores),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
