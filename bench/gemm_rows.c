/* gemm_rows.c - which row counts oneDNN's matmul computes alike for every row
 * (issue 20): the figures behind cpu_next_rows in model/cpu_lower.c.
 *
 *   gcc -O2 -std=c11 bench/gemm_rows.c -ldnnl -o gemm_rows
 *   ./gemm_rows P K N [ROWS...]     (default rows: 8 16 24 ... 128)
 *
 * For each row count M: the matmul [P][M][K] . [P][K][N] on fixed
 * pseudo-random data, then again with every row of the source moved down by
 * one (the last to the top), and the outputs compared bit for bit, as the
 * CPU backend's rows_independent() does at reserve. Prints per M the rows
 * whose bits changed (0: every row computed alike) and the best of 20 calls
 * in ms. Run it as the backend would (OMP_NUM_THREADS, and under
 * bench/isa_mask.c or ONEDNN_MAX_CPU_ISA=AVX2 for the AVX2 kernels).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dnnl.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Returns 0 and fills *differing and *best_ms, or -1 when oneDNN fails. */
static int probe(dnnl_engine_t eng, dnnl_stream_t strm, int p, int m, int k, int n, int *differing,
                 double *best_ms)
{
    dnnl_memory_desc_t a, w, d;
    dnnl_dims_t ad = {p, m, k}, wd = {p, k, n}, dd = {p, m, n};
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    if (dnnl_memory_desc_init_by_tag(&a, 3, ad, dnnl_f32, dnnl_abc) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&w, 3, wd, dnnl_f32, dnnl_abc) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&d, 3, dd, dnnl_f32, dnnl_abc) != dnnl_success ||
        dnnl_matmul_desc_init(&md, &a, &w, NULL, &d) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL) != dnnl_success)
        return -1;
    int ok = dnnl_primitive_create(&prim, pd) == dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    if (!ok) return -1;
    size_t na = (size_t)p * m * k, nw = (size_t)p * k * n, nd = (size_t)p * m * n;
    float *src = malloc(na * sizeof *src), *wei = malloc(nw * sizeof *wei);
    float *d0 = calloc(nd, sizeof *d0), *d1 = calloc(nd, sizeof *d1),
          *row = malloc(k * sizeof *row);
    dnnl_memory_t ma = NULL, mw = NULL, mdst = NULL;
    ok = src && wei && d0 && d1 && row && dnnl_memory_create(&ma, &a, eng, src) == dnnl_success &&
         dnnl_memory_create(&mw, &w, eng, wei) == dnnl_success &&
         dnnl_memory_create(&mdst, &d, eng, d0) == dnnl_success;
    unsigned r = 12345;
    for (size_t i = 0; ok && i < na; i++) {
        r = r * 1664525u + 1013904223u;
        src[i] = (float)(r >> 8) / 16777216.0f - 0.5f;
    }
    for (size_t i = 0; ok && i < nw; i++) {
        r = r * 1664525u + 1013904223u;
        wei[i] = (float)(r >> 8) / 16777216.0f - 0.5f;
    }
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, mdst}};
    ok = ok && dnnl_primitive_execute(prim, strm, 3, args) == dnnl_success &&
         dnnl_stream_wait(strm) == dnnl_success;
    for (int q = 0; ok && q < p; q++) {
        float *s = src + (size_t)q * m * k;
        memcpy(row, s + (size_t)(m - 1) * k, k * sizeof *row);
        memmove(s + k, s, (size_t)(m - 1) * k * sizeof *s);
        memcpy(s, row, k * sizeof *row);
    }
    ok = ok && dnnl_memory_set_data_handle(mdst, d1) == dnnl_success &&
         dnnl_primitive_execute(prim, strm, 3, args) == dnnl_success &&
         dnnl_stream_wait(strm) == dnnl_success;
    *differing = 0;
    for (int q = 0; ok && q < p; q++)
        for (int i = 0; i < m; i++)
            *differing += memcmp(d0 + ((size_t)q * m + i) * n,
                                 d1 + ((size_t)q * m + (i + 1) % m) * n, n * sizeof *d0) != 0;
    *best_ms = 1e30;
    for (int it = 0; ok && it < 20; it++) {
        double t0 = now();
        ok = dnnl_primitive_execute(prim, strm, 3, args) == dnnl_success &&
             dnnl_stream_wait(strm) == dnnl_success;
        double t = (now() - t0) * 1e3;
        if (t < *best_ms) *best_ms = t;
    }
    if (ma) dnnl_memory_destroy(ma);
    if (mw) dnnl_memory_destroy(mw);
    if (mdst) dnnl_memory_destroy(mdst);
    dnnl_primitive_destroy(prim);
    free(src);
    free(wei);
    free(d0);
    free(d1);
    free(row);
    return ok ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s P K N [ROWS...]\n", argv[0]);
        return 2;
    }
    int p = atoi(argv[1]), k = atoi(argv[2]), n = atoi(argv[3]);
    dnnl_engine_t eng;
    dnnl_stream_t strm;
    if (p < 1 || k < 1 || n < 1 || dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&strm, eng, dnnl_stream_default_flags) != dnnl_success)
        return 2;
    static const int dflt[] = {8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 128};
    int nrows = argc > 4 ? argc - 4 : (int)(sizeof dflt / sizeof *dflt);
    int status = 0;
    printf("P=%d K=%d N=%d:", p, k, n);
    for (int i = 0; i < nrows; i++) {
        int m = argc > 4 ? atoi(argv[4 + i]) : dflt[i], differing;
        double ms;
        if (m < 2 || probe(eng, strm, p, m, k, n, &differing, &ms) != 0) {
            printf(" %d=error", m);
            status = 1;
            continue;
        }
        printf(" %d=%d:%.3f", m, differing, ms);
    }
    printf("  (rows=rows that differ:best ms)\n");
    dnnl_stream_destroy(strm);
    dnnl_engine_destroy(eng);
    return status;
}
