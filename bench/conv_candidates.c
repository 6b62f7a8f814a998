/* conv_candidates.c - every way oneDNN can run one ResNet layer, timed side
 * by side in one process (issue 20): the machine is shared, so candidates
 * alternate round by round and each keeps its best call; load then hits
 * them alike.
 *
 *   gcc -O3 -fopenmp -I. bench/conv_candidates.c model/winograd.c -ldnnl -o conv_candidates
 *   OMP_NUM_THREADS=2 ./conv_candidates N CIN COUT H K STRIDE [ROUNDS=30]
 *   (ONEDNN_MAX_CPU_ISA=AVX2 for the AVX2 stand-in on an AVX-512 machine)
 *
 * Candidates (fp32, bias, ReLU as in the backend):
 *   - a convolution with format any, and each further implementation of
 *     it that oneDNN's primitive-descriptor iterator offers (next_impl),
 *     reference kernels excluded;
 *   - the same with nhwc activations, and with nChw8c / nChw16c;
 *   - "dense": the conv as one inner product per tile, the whole input map
 *     of a tile times a [H W Cin] x [Hout Wout Cout] matrix (the conv's
 *     Toeplitz form; on a 2x2 map a 3x3 conv needs 16 / 36 of the direct
 *     multiply-adds, since its padding taps vanish);
 *   - "rows": a 1x1 stride-1 conv as an inner product with the batch's
 *     pixels as rows (nhwc activations: [N H W] x [Cin] times [Cin] x [Cout]);
 *   - "wino" (3x3 stride 1): Winograd F(4,3) with this tree's transforms
 *     (model/winograd.c) around one oneDNN batched matmul, nhwc in and out;
 *   - each inner product twice: weights in the layout oneDNN picks, and in
 *     plain [out][in] order ("w:ab", what the backend can fill in place).
 * Prints per candidate: name, oneDNN's implementation, best ms per call (wall
 * and process CPU time) and direct-equivalent GFLOP/s from the wall time.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dnnl.h>

#include "model/winograd.h"

#define MAXC 24

static double clk(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct cand {
    char name[48];
    char impl[64];
    dnnl_primitive_t prim;
    dnnl_memory_t m[5];
    int nargs;
    dnnl_exec_arg_t args[5];
    double best_wall, best_cpu;
    /* "wino": the two transforms around the matmul (model/winograd.c) */
    bool wino;
    int n, h, ci, co;
    float *x, *v, *mm, *y, *bias;
} cand;

static cand g_c[MAXC];
static int g_n;
static dnnl_engine_t eng;
static dnnl_stream_t strm;

static dnnl_primitive_attr_t relu_attr(void)
{
    dnnl_primitive_attr_t attr;
    dnnl_post_ops_t po;
    dnnl_primitive_attr_create(&attr);
    dnnl_post_ops_create(&po);
    dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f);
    dnnl_primitive_attr_set_post_ops(attr, po);
    dnnl_post_ops_destroy(po);
    return attr;
}

/* Make a candidate of pd (which it then owns), its memories allocated and
 * filled (an argument pd has no memory for, such as a matmul's bias, is left
 * out); `kind` prefixes oneDNN's implementation name. NULL when there is no
 * room or oneDNN fails. */
static cand *add(const char *name, dnnl_primitive_desc_t pd, const char *kind)
{
    if (g_n == MAXC) return NULL;
    cand *c = &g_c[g_n];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    const char *impl = "";
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    snprintf(c->impl, sizeof c->impl, "%s%s", kind, impl);
    const dnnl_query_t q[4] = {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_weights_md,
                               dnnl_query_dst_md};
    const int qi[4] = {0, 0, 1, 0},
              arg[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_BIAS, DNNL_ARG_DST};
    for (int i = 0; i < 4; i++) {
        const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, q[i], qi[i]);
        size_t n = md ? dnnl_memory_desc_get_size(md) / 4 : 0;
        if (n == 0) continue;
        dnnl_memory_create(&c->m[i], md, eng, DNNL_MEMORY_ALLOCATE);
        float *p;
        dnnl_memory_get_data_handle(c->m[i], (void **)&p);
        for (size_t j = 0; j < n; j++) p[j] = (float)(j % 13) * 0.01f;
        c->args[c->nargs++] = (dnnl_exec_arg_t){arg[i], c->m[i]};
    }
    if (dnnl_primitive_create(&c->prim, pd) != dnnl_success) return NULL;
    dnnl_primitive_desc_destroy(pd);
    c->best_wall = c->best_cpu = 1e30;
    g_n++;
    return c;
}

static void conv_all(const int s[6], dnnl_format_tag_t tag, const char *label)
{
    int n = s[0], ci = s[1], co = s[2], h = s[3], k = s[4], st = s[5];
    int pad = k / 2, oh = (h + 2 * pad - k) / st + 1;
    dnnl_memory_desc_t src, w, b, dst;
    dnnl_dims_t sd = {n, ci, h, h}, wd = {co, ci, k, k}, bd = {co}, dd = {n, co, oh, oh};
    dnnl_memory_desc_init_by_tag(&src, 4, sd, dnnl_f32, tag);
    dnnl_memory_desc_init_by_tag(&w, 4, wd, dnnl_f32, dnnl_format_tag_any);
    dnnl_memory_desc_init_by_tag(&b, 1, bd, dnnl_f32, dnnl_x);
    dnnl_memory_desc_init_by_tag(&dst, 4, dd, dnnl_f32, tag);
    dnnl_dim_t pr = (dnnl_dim_t)(oh - 1) * st + k - h - pad;
    dnnl_dims_t strides = {st, st}, pl = {pad, pad}, prr = {pr, pr};
    for (int alg = 0; alg < 2; alg++) {
        dnnl_convolution_desc_t cd;
        if (dnnl_convolution_forward_desc_init(
                &cd, dnnl_forward_inference,
                alg ? dnnl_convolution_winograd : dnnl_convolution_direct, &src, &w, &b, &dst,
                strides, pl, prr) != dnnl_success)
            continue;
        dnnl_primitive_attr_t attr = relu_attr();
        dnnl_primitive_desc_iterator_t it;
        if (dnnl_primitive_desc_iterator_create(&it, &cd, attr, eng, NULL) == dnnl_success) {
            do {
                dnnl_primitive_desc_t pd = dnnl_primitive_desc_iterator_fetch(it);
                const char *impl = "";
                dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
                if (strstr(impl, "ref")) {
                    dnnl_primitive_desc_destroy(pd);
                    continue;
                }
                char name[48];
                snprintf(name, sizeof name, "%s %s", alg ? "winograd" : "conv", label);
                add(name, pd, "");
            } while (dnnl_primitive_desc_iterator_next(it) == dnnl_success);
            dnnl_primitive_desc_iterator_destroy(it);
        }
        dnnl_primitive_attr_destroy(attr);
    }
}

/* An inner product [rows x k] . [k x nout] + bias, ReLU. */
static void ip(const char *name, long rows, long k, long nout, dnnl_format_tag_t wtag)
{
    dnnl_memory_desc_t src, w, b, dst;
    dnnl_dims_t sd = {rows, k}, wd = {nout, k}, bd = {nout}, dd = {rows, nout};
    dnnl_memory_desc_init_by_tag(&src, 2, sd, dnnl_f32, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&w, 2, wd, dnnl_f32, wtag);
    dnnl_memory_desc_init_by_tag(&b, 1, bd, dnnl_f32, dnnl_x);
    dnnl_memory_desc_init_by_tag(&dst, 2, dd, dnnl_f32, dnnl_ab);
    dnnl_inner_product_desc_t d;
    if (dnnl_inner_product_forward_desc_init(&d, dnnl_forward_inference, &src, &w, &b, &dst) !=
        dnnl_success)
        return;
    dnnl_primitive_attr_t attr = relu_attr();
    dnnl_primitive_desc_t pd;
    if (dnnl_primitive_desc_create(&pd, &d, attr, eng, NULL) == dnnl_success) add(name, pd, "");
    dnnl_primitive_attr_destroy(attr);
}

static float *filled(size_t n)
{
    float *p = malloc(n * sizeof *p);
    for (size_t j = 0; j < n; j++) p[j] = (float)(j % 13) * 0.01f;
    return p;
}

/* Winograd F(4,3) of our own transforms around one oneDNN batched matmul
 * [36][rows][cin] . [36][cin][cout] (weights in the layout oneDNN picks). */
static void wino(int n, int ci, int co, int h, dnnl_format_tag_t wtag, const char *name)
{
    long rows = (long)tw_wino_rows(n, h);
    dnnl_memory_desc_t a, w, d;
    dnnl_dims_t ad = {TW_WINO_POINTS, rows, ci}, wd = {TW_WINO_POINTS, ci, co},
                dd = {TW_WINO_POINTS, rows, co};
    dnnl_memory_desc_init_by_tag(&a, 3, ad, dnnl_f32, dnnl_abc);
    dnnl_memory_desc_init_by_tag(&w, 3, wd, dnnl_f32, wtag);
    dnnl_memory_desc_init_by_tag(&d, 3, dd, dnnl_f32, dnnl_abc);
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd;
    if (dnnl_matmul_desc_init(&md, &a, &w, NULL, &d) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL) != dnnl_success)
        return;
    cand *c = add(name, pd, "matmul ");
    if (!c) return;
    c->x = filled((size_t)n * h * h * ci);
    c->y = filled((size_t)n * h * h * co);
    c->bias = filled((size_t)co);
    dnnl_memory_get_data_handle(c->m[0], (void **)&c->v);
    dnnl_memory_get_data_handle(c->m[3], (void **)&c->mm);
    c->wino = true;
    c->n = n;
    c->h = h;
    c->ci = ci;
    c->co = co;
}

static void run(cand *c)
{
    if (c->wino) tw_wino_input(c->x, c->n, c->h, c->ci, tw_wino_rows(c->n, c->h), c->v);
    dnnl_primitive_execute(c->prim, strm, c->nargs, c->args);
    dnnl_stream_wait(strm);
    if (c->wino)
        tw_wino_output(c->mm, c->n, c->h, c->co, tw_wino_rows(c->n, c->h), c->bias, false, true,
                       c->y);
}

int main(int argc, char **argv)
{
    if (argc < 7) {
        fprintf(stderr, "usage: conv_candidates N CIN COUT H K STRIDE [ROUNDS]\n");
        return 2;
    }
    int s[6];
    for (int i = 0; i < 6; i++) s[i] = atoi(argv[i + 1]);
    int rounds = argc > 7 ? atoi(argv[7]) : 30;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&strm, eng, dnnl_stream_default_flags) != dnnl_success)
        return 1;
    int n = s[0], ci = s[1], co = s[2], h = s[3], k = s[4], st = s[5];
    int oh = (h + 2 * (k / 2) - k) / st + 1;
    conv_all(s, dnnl_format_tag_any, "any");
    conv_all(s, dnnl_nhwc, "nhwc");
    conv_all(s, dnnl_aBcd8b, "nChw8c");
    conv_all(s, dnnl_aBcd16b, "nChw16c");
    if (oh <= 2 || (k == 3 && st == 1 && h <= 2)) {
        ip("dense", n, (long)h * h * ci, (long)oh * oh * co, dnnl_format_tag_any);
        ip("dense w:ab", n, (long)h * h * ci, (long)oh * oh * co, dnnl_ab);
    }
    if (k == 1 && st == 1) {
        ip("rows nhwc", (long)n * h * h, ci, co, dnnl_format_tag_any);
        ip("rows nhwc w:ab", (long)n * h * h, ci, co, dnnl_ab);
    }
    if (k == 3 && st == 1) {
        wino(n, ci, co, h, dnnl_format_tag_any, "wino F(4,3)");
        wino(n, ci, co, h, dnnl_abc, "wino F(4,3) w:abc");
    }
    double flops = 2.0 * n * ci * co * k * k * oh * oh;
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < g_n; i++) {
            cand *c = &g_c[i];
            int calls = r == 0 ? 1 : 3;
            for (int j = 0; j < calls; j++) {
                double w0 = clk(CLOCK_MONOTONIC), c0 = clk(CLOCK_PROCESS_CPUTIME_ID);
                run(c);
                double w1 = clk(CLOCK_MONOTONIC), c1 = clk(CLOCK_PROCESS_CPUTIME_ID);
                if (r > 0 && w1 - w0 < c->best_wall) c->best_wall = w1 - w0;
                if (r > 0 && c1 - c0 < c->best_cpu) c->best_cpu = c1 - c0;
            }
        }
    printf("batch %d, %d -> %d channels, %dx%d map -> %dx%d, %dx%d kernel, stride %d (%d rounds)\n",
           n, ci, co, h, h, oh, oh, k, k, st, rounds);
    for (int i = 0; i < g_n; i++)
        printf("  %-18s %-34s %8.3f ms wall %8.3f ms cpu %7.1f GFLOP/s\n", g_c[i].name, g_c[i].impl,
               g_c[i].best_wall * 1e3, g_c[i].best_cpu * 1e3, flops / g_c[i].best_wall * 1e-9);
    return 0;
}
