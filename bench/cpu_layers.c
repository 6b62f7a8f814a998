/* cpu_layers.c - the CPU backend on a standard-width ResNet, batch after
 * batch, with a marker line between batches: bench/cpu_layers.py runs it
 * under ONEDNN_VERBOSE=1 and turns oneDNN's per-primitive lines into a
 * per-layer table (issue 20). Weights are synthetic (tests/synth_resnet.h,
 * activations near unit scale): the time of a layer depends on its shape,
 * not on its values.
 *
 *   cpu_layers ARCH TILE BATCH ITERS [THREADS=2] [ab]
 *     ARCH resnet18 | resnet50; BATCH 0 = the backend's batch: auto
 *
 * With "ab": three backends in one process, batches alternating between
 * them (so that the machine's load hits each alike), and each one's best
 * batch printed: "before" (cpu_gemm 0, cpu_nhwc 0: the code before issue
 * 20), "dense" (GEMM lowerings by the rule, activations as before),
 * "nowino" (the defaults with cpu_winograd off) and "after" (the defaults). Lines: "tw_ab NAME
 * best_cpu_ms=.. best_wall_ms=.. tiles_per_s=..".
 *
 * Prints "tw_layers arch=.. tile=.. batch=.. isa=..", then per batch
 * "tw_iter I cpu_s=S wall_s=W" after oneDNN's lines for that batch, where
 * cpu_s is the process CPU time of the batch (the machine is shared: CPU
 * time is what load disturbs least).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/backend.h"
#include "model/resnet.h"
#include "tests/synth_resnet.h"

static double clk(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int ab(tw_resnet *net, tw_backend_params bp, int tile, int batch, int iters)
{
    enum { NV = 4 };
    const char *name[NV] = {"before", "dense", "nowino", "after"};
    const int gemm[NV] = {0, -1, -1, -1}, nhwc[NV] = {0, 0, -1, -1};
    /* nowino: the defaults without Winograd (oneDNN's or model/winograd.c's) */
    const int wino[NV] = {bp.cpu_winograd, bp.cpu_winograd, TW_CPU_WINOGRAD_OFF, bp.cpu_winograd};
    tw_backend be[NV];
    tw_error err;
    tw_error_init(&err);
    int mb = batch;
    for (int i = 0; i < NV; i++) {
        bp.cpu_gemm = gemm[i];
        bp.cpu_nhwc = nhwc[i];
        bp.cpu_winograd = wino[i];
        if (tw_backend_create_ex("cpu", &bp, &be[i], &err) != TW_OK) return 1;
        if (mb <= 0) mb = be[i].i->auto_batch(be[i].ctx, net, tile);
        int b = mb;
        if (tw_backend_reserve(&be[i], net, tile, &b, TW_PREC_FP32, false, NULL, &err) != TW_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
    }
    size_t n_in = (size_t)mb * net->in_bands * tile * tile;
    float *x = malloc(n_in * sizeof *x), *p = malloc((size_t)mb * net->n_classes * sizeof *p);
    for (size_t i = 0; i < n_in; i++) x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    double bc[NV], bw[NV];
    for (int i = 0; i < NV; i++) bc[i] = bw[i] = 1e30;
    tw_infer_batch b = {.n = mb, .tile = tile, .x = x, .probs = p};
    for (int it = 0; it <= iters; it++)
        for (int i = 0; i < NV; i++) {
            double c0 = clk(CLOCK_PROCESS_CPUTIME_ID), w0 = clk(CLOCK_MONOTONIC);
            if (tw_backend_infer(&be[i], &b, &err) != TW_OK) return 1;
            double c1 = clk(CLOCK_PROCESS_CPUTIME_ID), w1 = clk(CLOCK_MONOTONIC);
            if (it > 0 && c1 - c0 < bc[i]) bc[i] = c1 - c0; /* batch 0 warms up */
            if (it > 0 && w1 - w0 < bw[i]) bw[i] = w1 - w0;
        }
    for (int i = 0; i < NV; i++) {
        tw_backend_stats st;
        tw_backend_get_stats(&be[i], &st);
        size_t ws = be[i].i->workspace_bytes(be[i].ctx, net, tile, mb, TW_PREC_FP32);
        printf("tw_ab %-6s batch=%d best_cpu_ms=%.2f best_wall_ms=%.2f tiles_per_s=%.1f "
               "workspace_mib=%.1f (%s)\n",
               name[i], mb, bc[i] * 1e3, bw[i] * 1e3, mb / bw[i], ws / 1048576.0, st.algorithms);
        tw_backend_destroy(&be[i]);
    }
    free(x);
    free(p);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: cpu_layers resnet18|resnet50 TILE BATCH ITERS [THREADS]\n");
        return 2;
    }
    int r50 = strcmp(argv[1], "resnet50") == 0;
    int tile = atoi(argv[2]), batch = atoi(argv[3]), iters = atoi(argv[4]);
    int threads = argc > 5 ? atoi(argv[5]) : 2;
    synth s;
    const int b18[4] = {2, 2, 2, 2}, b50[4] = {3, 4, 6, 3};
    if (synth_resnet(&s, r50 ? b50 : b18, r50, 6, 64, 7, 7) != 0) return 1;
    tw_error err;
    tw_error_init(&err);
    tw_resnet *net = NULL;
    if (tw_resnet_create(&s.mf, argv[1], &net, &err) != TW_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    synth_free(&s);
    tw_backend_params bp = tw_backend_default_params();
    bp.threads = threads;
    const char *wino = getenv("TILEWISE_CPU_WINOGRAD");
    if (wino && strcmp(wino, "0") == 0) bp.cpu_winograd = TW_CPU_WINOGRAD_OFF;
    if (wino && strcmp(wino, "own") == 0) bp.cpu_winograd = TW_CPU_WINOGRAD_OWN;
    const char *v = getenv("TILEWISE_CPU_GEMM");
    if (v && *v) bp.cpu_gemm = atoi(v);
    v = getenv("TILEWISE_CPU_NHWC");
    if (v && *v) bp.cpu_nhwc = atoi(v);
    if (argc > 6 && strcmp(argv[6], "ab") == 0) return ab(net, bp, tile, batch, iters);
    tw_backend be;
    if (tw_backend_create_ex("cpu", &bp, &be, &err) != TW_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    if (batch <= 0) batch = be.i->auto_batch(be.ctx, net, tile);
    int mb = batch;
    /* TW_PRECISION=bf16|int8: that precision (int8 calibrates on the first batch) */
    const char *pv = getenv("TW_PRECISION");
    tw_precision prec = pv && strcmp(pv, "bf16") == 0   ? TW_PREC_BF16
                        : pv && strcmp(pv, "int8") == 0 ? TW_PREC_INT8
                                                        : TW_PREC_FP32;
    if (tw_backend_reserve(&be, net, tile, &mb, prec, true, NULL, &err) != TW_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    tw_backend_stats st;
    tw_backend_get_stats(&be, &st);
    size_t n_in = (size_t)mb * net->in_bands * tile * tile;
    float *x = malloc(n_in * sizeof *x), *p = malloc((size_t)mb * net->n_classes * sizeof *p);
    for (size_t i = 0; i < n_in; i++) x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    printf("tw_layers arch=%s tile=%d batch=%d threads=%d precision=%s device=\"%s\" "
           "algorithms=\"%s\"\n",
           argv[1], tile, mb, threads, tw_precision_name(st.precision), st.device, st.algorithms);
    fflush(stdout);
    tw_infer_batch b = {.n = mb, .tile = tile, .x = x, .probs = p};
    for (int it = 0; it < iters; it++) {
        double c0 = clk(CLOCK_PROCESS_CPUTIME_ID), w0 = clk(CLOCK_MONOTONIC);
        if (tw_backend_infer(&be, &b, &err) != TW_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        double c1 = clk(CLOCK_PROCESS_CPUTIME_ID), w1 = clk(CLOCK_MONOTONIC);
        fflush(stdout);
        printf("tw_iter %d cpu_s=%.6f wall_s=%.6f\n", it, c1 - c0, w1 - w0);
        fflush(stdout);
    }
    tw_backend_destroy(&be);
    tw_resnet_destroy(net);
    free(x);
    free(p);
    return 0;
}
