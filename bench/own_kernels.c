/* own_kernels.c - the CPU backend's own code on the nhwc plans (AVX2-class
 * CPUs), timed alone at the shapes a batch meets (issue 20):
 *
 *   - model/maxpool.c's stem pooling (nChw8c in, nhwc out) against what it
 *     replaced in the same run: oneDNN's max pooling on nChw8c, then a
 *     oneDNN reorder to nhwc;
 *   - model/winograd.c's input and output transforms (bias, residual and
 *     ReLU on), with the bytes they move.
 *
 *   build/own_kernels [TILE=224] [BATCH=4] [REPS=30]     (OMP_NUM_THREADS=2)
 *
 * Run it as the backend would: under bench/isa_mask.c (LD_PRELOAD) or
 * ONEDNN_MAX_CPU_ISA=AVX2 for the AVX2 kernels. Prints the best and the
 * mean of REPS calls, in ms, and for the pooling the ratio oneDNN / ours.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dnnl.h>

#include "model/maxpool.h"
#include "model/winograd.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct timing {
    double best, mean;
} timing;

static void fill(float *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)(seed >> 8) * (1.0f / 16777216.0f) - 0.5f;
    }
}

static float *fresh(size_t n, unsigned seed)
{
    float *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    fill(p, n, seed);
    return p;
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        if ((call) != dnnl_success) {                                                              \
            fprintf(stderr, "oneDNN: %s failed\n", #call);                                         \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* oneDNN's pooling on nChw8c and the reorder to nhwc, as one step. */
typedef struct onednn_pool {
    dnnl_primitive_t pool, reorder;
    dnnl_memory_t src, mid, mid_r, dst;
} onednn_pool;

static void onednn_pool_make(dnnl_engine_t eng, int n, int c, int h, float *x, float *mid, float *y,
                             onednn_pool *o)
{
    int oh = tw_maxpool_out(h);
    dnnl_memory_desc_t s, m, d;
    dnnl_dims_t sd = {n, c, h, h}, dd = {n, c, oh, oh};
    CHECK(dnnl_memory_desc_init_by_tag(&s, 4, sd, dnnl_f32, dnnl_aBcd8b));
    CHECK(dnnl_memory_desc_init_by_tag(&m, 4, dd, dnnl_f32, dnnl_aBcd8b));
    CHECK(dnnl_memory_desc_init_by_tag(&d, 4, dd, dnnl_f32, dnnl_nhwc));
    dnnl_dims_t st = {2, 2}, k = {3, 3}, dil = {0, 0}, pl = {1, 1};
    dnnl_dims_t pr = {(oh - 1) * 2 + 3 - h - 1, (oh - 1) * 2 + 3 - h - 1};
    dnnl_pooling_v2_desc_t pd;
    CHECK(dnnl_pooling_v2_forward_desc_init(&pd, dnnl_forward_inference, dnnl_pooling_max, &s, &m,
                                            st, k, dil, pl, pr));
    dnnl_primitive_desc_t ppd, rpd;
    CHECK(dnnl_primitive_desc_create(&ppd, &pd, NULL, eng, NULL));
    CHECK(dnnl_primitive_create(&o->pool, ppd));
    CHECK(dnnl_reorder_primitive_desc_create(&rpd, &m, eng, &d, eng, NULL));
    CHECK(dnnl_primitive_create(&o->reorder, rpd));
    dnnl_primitive_desc_destroy(ppd);
    dnnl_primitive_desc_destroy(rpd);
    CHECK(dnnl_memory_create(&o->src, &s, eng, x));
    CHECK(dnnl_memory_create(&o->mid, &m, eng, mid));
    CHECK(dnnl_memory_create(&o->dst, &d, eng, y));
}

static void onednn_pool_run(dnnl_stream_t strm, onednn_pool *o)
{
    dnnl_exec_arg_t pa[2] = {{DNNL_ARG_SRC, o->src}, {DNNL_ARG_DST, o->mid}};
    dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, o->mid}, {DNNL_ARG_TO, o->dst}};
    CHECK(dnnl_primitive_execute(o->pool, strm, 2, pa));
    CHECK(dnnl_primitive_execute(o->reorder, strm, 2, ra));
    CHECK(dnnl_stream_wait(strm));
}

int main(int argc, char **argv)
{
    int tile = argc > 1 ? atoi(argv[1]) : 224, n = argc > 2 ? atoi(argv[2]) : 4;
    int reps = argc > 3 ? atoi(argv[3]) : 30;
    if (tile < 32 || n < 1 || reps < 1) {
        fprintf(stderr, "usage: %s [TILE>=32] [BATCH] [REPS]\n", argv[0]);
        return 2;
    }
    dnnl_engine_t eng;
    dnnl_stream_t strm;
    CHECK(dnnl_engine_create(&eng, dnnl_cpu, 0));
    CHECK(dnnl_stream_create(&strm, eng, dnnl_stream_default_flags));

    /* the stem's output: 64 channels at tile / 2 */
    int c = 64, h = (tile - 1) / 2 + 1, oh = tw_maxpool_out(h);
    float *x = fresh((size_t)n * c * h * h, 1), *mid = fresh((size_t)n * c * oh * oh, 2);
    float *ya = fresh((size_t)n * c * oh * oh, 3), *yb = fresh((size_t)n * c * oh * oh, 4);
    onednn_pool op;
    onednn_pool_make(eng, n, c, h, x, mid, ya, &op);
    timing t_dnnl = {1e9, 0}, t_own = {1e9, 0};
    for (int r = 0; r < reps; r++) { /* alternating, so that the machine's load hits both alike */
        double t0 = now();
        onednn_pool_run(strm, &op);
        double t1 = now();
        tw_maxpool_blocked_to_nhwc(x, n, c, h, 8, yb);
        double t2 = now();
        if (t1 - t0 < t_dnnl.best) t_dnnl.best = t1 - t0;
        if (t2 - t1 < t_own.best) t_own.best = t2 - t1;
        t_dnnl.mean += (t1 - t0) / reps;
        t_own.mean += (t2 - t1) / reps;
    }
    int same = memcmp(ya, yb, (size_t)n * c * oh * oh * sizeof(float)) == 0;
    printf("stem pooling, %d x %d x %d^2 nChw8c -> nhwc %d^2:\n", n, c, h, oh);
    printf("  oneDNN pooling + reorder  best %.3f ms  mean %.3f ms\n", 1e3 * t_dnnl.best,
           1e3 * t_dnnl.mean);
    printf("  model/maxpool.c           best %.3f ms  mean %.3f ms  (oneDNN / ours: %.2fx best, "
           "%.2fx mean; outputs %s)\n",
           1e3 * t_own.best, 1e3 * t_own.mean, t_dnnl.best / t_own.best, t_dnnl.mean / t_own.mean,
           same ? "identical" : "DIFFER");

    /* the Winograd stages: maps of tile/4, /8, /16 with 64, 128, 256 channels */
    for (int s = 0; s < 3; s++) {
        int hh = tile / (4 << s), ch = 64 << s;
        if (hh < TW_WINO_OUT) break;
        size_t rows = tw_wino_rows(n, hh), act = (size_t)n * hh * hh * ch;
        float *xa = fresh(act, 5), *v = fresh((size_t)TW_WINO_POINTS * rows * ch, 6);
        float *y = fresh(act, 7), *bias = fresh((size_t)ch, 8);
        timing ti = {1e9, 0}, to = {1e9, 0};
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            tw_wino_input(xa, n, hh, ch, rows, v);
            double t1 = now();
            tw_wino_output(v, n, hh, ch, rows, bias, true, true, y);
            double t2 = now();
            if (t1 - t0 < ti.best) ti.best = t1 - t0;
            if (t2 - t1 < to.best) to.best = t2 - t1;
            ti.mean += (t1 - t0) / reps;
            to.mean += (t2 - t1) / reps;
        }
        double vb = (double)TW_WINO_POINTS * rows * ch * sizeof(float), ab = (double)act * 4;
        printf("Winograd %d x %d^2 x %d (%zu rows): input best %.3f mean %.3f ms (%.1f GB/s), "
               "output best %.3f mean %.3f ms (%.1f GB/s)\n",
               n, hh, ch, rows, 1e3 * ti.best, 1e3 * ti.mean, (ab + vb) / ti.best * 1e-9,
               1e3 * to.best, 1e3 * to.mean, (vb + 2 * ab) / to.best * 1e-9);
        free(xa);
        free(v);
        free(y);
        free(bias);
    }
    free(x);
    free(mid);
    free(ya);
    free(yb);
    return 0;
}
