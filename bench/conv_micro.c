/* conv_micro.c - one oneDNN convolution (fp32, bias, ReLU) timed alone: how
 * fast each algorithm and activation layout runs a ResNet layer shape. The
 * evidence behind the CPU backend's choices (model/cpu_backend.c): Winograd
 * for 3x3 stride-1 convolutions on maps of >= 4 x 4, nChw16c activations.
 *
 *   gcc -O2 bench/conv_micro.c -ldnnl -o conv_micro
 *   OMP_NUM_THREADS=2 ./conv_micro N CIN COUT H K STRIDE
 *
 * Prints, for direct convolution with oneDNN's preferred layout (any), direct
 * on nChw16c, and Winograd on nChw16c (3x3 stride 1 only): the kernel oneDNN
 * picked, milliseconds per call (best second of calls after 3 warm-ups) and
 * direct-equivalent GFLOP/s (2 N Cin Cout K^2 Hout Wout / time).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <dnnl.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        dnnl_status_t s_ = (call);                                                                 \
        if (s_ != dnnl_success) {                                                                  \
            fprintf(stderr, "%s: status %d\n", #call, (int)s_);                                    \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

static int fill(dnnl_memory_t m, int mod, float step)
{
    float *p;
    CHECK(dnnl_memory_get_data_handle(m, (void **)&p));
    const dnnl_memory_desc_t *md;
    CHECK(dnnl_memory_get_memory_desc(m, &md));
    size_t n = dnnl_memory_desc_get_size(md) / sizeof(float);
    for (size_t i = 0; i < n; i++) p[i] = (float)(i % (size_t)mod) * step;
    return 0;
}

/* One configuration; 0 on success, 1 when oneDNN has no kernel for it. */
static int run(dnnl_engine_t eng, dnnl_stream_t strm, const int s[6], bool wino,
               dnnl_format_tag_t tag)
{
    int n = s[0], ci = s[1], co = s[2], h = s[3], k = s[4], st = s[5];
    int pad = k / 2, oh = (h + 2 * pad - k) / st + 1;
    dnnl_memory_desc_t src, w, b, dst;
    dnnl_dims_t sd = {n, ci, h, h}, wd = {co, ci, k, k}, bd = {co}, dd = {n, co, oh, oh};
    CHECK(dnnl_memory_desc_init_by_tag(&src, 4, sd, dnnl_f32, tag));
    CHECK(dnnl_memory_desc_init_by_tag(&w, 4, wd, dnnl_f32, dnnl_format_tag_any));
    CHECK(dnnl_memory_desc_init_by_tag(&b, 1, bd, dnnl_f32, dnnl_x));
    CHECK(dnnl_memory_desc_init_by_tag(&dst, 4, dd, dnnl_f32, tag));
    dnnl_dim_t pr = (dnnl_dim_t)(oh - 1) * st + k - h - pad;
    dnnl_dims_t strides = {st, st}, pl = {pad, pad}, prr = {pr, pr};
    dnnl_convolution_desc_t cd;
    CHECK(dnnl_convolution_forward_desc_init(
        &cd, dnnl_forward_inference, wino ? dnnl_convolution_winograd : dnnl_convolution_direct,
        &src, &w, &b, &dst, strides, pl, prr));
    dnnl_primitive_attr_t attr;
    dnnl_post_ops_t po;
    CHECK(dnnl_primitive_attr_create(&attr));
    CHECK(dnnl_post_ops_create(&po));
    CHECK(dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f));
    CHECK(dnnl_primitive_attr_set_post_ops(attr, po));
    dnnl_primitive_desc_t pd;
    dnnl_status_t ps = dnnl_primitive_desc_create(&pd, &cd, attr, eng, NULL);
    dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    if (ps != dnnl_success) return 1;
    const char *impl = "";
    CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    dnnl_memory_t m[4];
    const dnnl_query_t q[4] = {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_weights_md,
                               dnnl_query_dst_md};
    const int qi[4] = {0, 0, 1, 0};
    for (int i = 0; i < 4; i++)
        CHECK(dnnl_memory_create(&m[i], dnnl_primitive_desc_query_md(pd, q[i], qi[i]), eng,
                                 DNNL_MEMORY_ALLOCATE));
    if (fill(m[0], 17, 0.1f) || fill(m[1], 13, 0.01f) || fill(m[2], 7, 0.5f)) return -1;
    dnnl_primitive_t prim;
    CHECK(dnnl_primitive_create(&prim, pd));
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, m[0]},
                               {DNNL_ARG_WEIGHTS, m[1]},
                               {DNNL_ARG_BIAS, m[2]},
                               {DNNL_ARG_DST, m[3]}};
    for (int i = 0; i < 3; i++) CHECK(dnnl_primitive_execute(prim, strm, 4, args));
    CHECK(dnnl_stream_wait(strm));
    int calls = 0;
    double t0 = now_s();
    while (now_s() - t0 < 1.0) {
        CHECK(dnnl_primitive_execute(prim, strm, 4, args));
        CHECK(dnnl_stream_wait(strm));
        calls++;
    }
    double dt = (now_s() - t0) / calls;
    double flops = 2.0 * n * ci * co * k * k * oh * oh;
    printf("  %-9s %-8s %-26s %8.3f ms  %6.1f GFLOP/s\n", wino ? "winograd" : "direct",
           tag == dnnl_format_tag_any ? "any" : "nChw16c", impl, dt * 1e3, flops / dt * 1e-9);
    dnnl_primitive_destroy(prim);
    for (int i = 0; i < 4; i++) dnnl_memory_destroy(m[i]);
    dnnl_primitive_desc_destroy(pd);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: conv_micro N CIN COUT H K STRIDE\n");
        return 2;
    }
    int s[6];
    for (int i = 0; i < 6; i++) s[i] = atoi(argv[i + 1]);
    dnnl_engine_t eng;
    dnnl_stream_t strm;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&strm, eng, dnnl_stream_default_flags) != dnnl_success)
        return 1;
    printf("batch %d, %d -> %d channels, %dx%d map, %dx%d kernel, stride %d\n", s[0], s[1], s[2],
           s[3], s[3], s[4], s[4], s[5]);
    int rc = run(eng, strm, s, false, dnnl_format_tag_any);
    if (rc == 0) rc = run(eng, strm, s, false, dnnl_aBcd16b);
    if (rc == 0 && s[4] == 3 && s[5] == 1 && run(eng, strm, s, true, dnnl_aBcd16b) == 1)
        printf("  winograd: no kernel on this CPU (oneDNN 2.6 has it for AVX-512 only)\n");
    dnnl_stream_destroy(strm);
    dnnl_engine_destroy(eng);
    return rc < 0 ? 1 : 0;
}
