/* cpu_backend.c - the CPU backend: the folded ResNet on oneDNN (v2.x C API).
 *
 * Plan, then build. plan_build() turns the net into a list of oneDNN
 * primitive descriptors (convolutions with bias and fused sum/relu post-ops,
 * max pooling, global average pooling, a reorder of the input when the stem
 * wants another layout and one of the pooled features back to plain [n][C]).
 * oneDNN chooses the activation and weight layouts (format_tag any); each
 * layer's source is the previous layer's chosen destination, so no reorders
 * appear between layers. The same plan
 * gives workspace_bytes() its number (sizes queried from oneDNN, nothing
 * allocated) and reserve() its primitives, so the two cannot drift apart.
 *
 * Memory: activations live in four buffers, each sized for the largest
 * thing it holds, reused along the graph (a bottleneck block with a
 * projection needs four at once: its input, two inner results and the
 * shortcut). The last conv of a
 * block writes into the shortcut's buffer with a sum post-op, which is the
 * residual add. Scratchpads are user-managed and share one buffer. Weights
 * are reordered once in reserve() into the layout each conv chose.
 *
 * Batches smaller than max_batch run on the full max_batch primitives: the
 * first n input tiles are copied into the backend's own input buffer and the
 * rest of it keeps older (finite) data whose results are ignored. Only the
 * last batch of a run is short, so the wasted work is at most one batch, and
 * one set of primitives keeps reserve() and the memory estimate simple.
 * A full batch is read in place from the caller's buffer (no copy).
 *
 * The classifier (fc) and softmax are a few thousand multiply-adds per tile
 * and run in plain C, in double, after the pooled features come back.
 *
 * Precision: fp32 (tf32 means fp32 on a CPU). bf16/fp16/int8 requests run in
 * fp32 with one notice: oneDNN 2.6 has bf16 convolutions only on AVX-512
 * CPUs, and int8 would need calibration data we do not have.
 *
 * One backend serves one thread at a time (the pipeline's infer stage).
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <dnnl.h>
#include <dnnl_debug.h>

#include "model/backend.h"
#include "pipeline/alloc.h"

enum { N_ACT = 4 };
/* storage ids: 0..N_ACT-1 are the activation buffers */
enum { BUF_IN_USER = N_ACT, BUF_IN_BLK, BUF_FEAT, BUF_COUNT };

typedef enum { L_CONV, L_POOL, L_REORDER } layer_kind;

typedef struct layer {
    layer_kind kind;
    dnnl_primitive_desc_t pd;
    int src, dst;         /* storage ids */
    const tw_conv *conv;  /* L_CONV: the folded weights to reorder */
} layer;

typedef struct plan {
    layer *layers;
    int n_layers, cap;
    int batch, tile, feat_dim;
    size_t buf_bytes[BUF_COUNT]; /* bytes of each storage: the most it ever holds */
    size_t scratch_bytes;        /* largest scratchpad of any primitive */
    size_t weight_bytes;         /* reordered conv weights and biases */
    dnnl_memory_desc_t in_md;    /* the caller's NCHW float input */
} plan;

typedef struct op {
    dnnl_primitive_t prim;
    int nargs;
    dnnl_exec_arg_t args[6];
} op;

typedef struct cpu_ctx {
    int threads;
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    /* after reserve */
    bool reserved;
    int max_batch, tile, in_bands, feat_dim, n_classes;
    op *ops;
    int n_ops;
    dnnl_memory_t *mems; /* every memory object, for destroy */
    int n_mems, cap_mems;
    void **allocs;       /* every tw_alloc'ed buffer, for destroy */
    int n_allocs, cap_allocs;
    void *buf[BUF_COUNT];
    void *scratch;
    dnnl_memory_t in_mem; /* the memory the first layer reads; its handle moves */
    float *fc_w, *fc_b;
    tw_backend_stats stats;
} cpu_ctx;

static tw_status dnnl_fail(tw_error *err, dnnl_status_t s, const char *what)
{
    tw_status st = s == dnnl_out_of_memory ? TW_ERR_NOMEM : TW_ERR_INTERNAL;
    return tw_error_set(err, st, "oneDNN: %s failed: %s", what, dnnl_status2str(s));
}

#define DNNL_TRY(call, what)                                                         \
    do {                                                                             \
        dnnl_status_t s_ = (call);                                                   \
        if (s_ != dnnl_success) return dnnl_fail(err, s_, what);                     \
    } while (0)

static size_t alloc_size(size_t bytes)
{
    /* what tw_alloc really takes: 64-byte header + size rounded up to 64 */
    return bytes ? 64 + ((bytes + 63) & ~(size_t)63) : 0;
}

/* A memory descriptor of pd; a missing one is a bug (never bad input). */
static tw_status query_md(const_dnnl_primitive_desc_t pd, dnnl_query_t what, int idx,
                          const dnnl_memory_desc_t **out, tw_error *err)
{
    *out = dnnl_primitive_desc_query_md(pd, what, idx);
    if (!*out)
        return tw_error_set(err, TW_ERR_INTERNAL, "oneDNN: primitive lacks memory descriptor %d/%d",
                            (int)what, idx);
    return TW_OK;
}

/* ---------------------------------------------------------------- plan */

static void plan_free(plan *p)
{
    for (int i = 0; i < p->n_layers; i++) dnnl_primitive_desc_destroy(p->layers[i].pd);
    tw_free(p->layers);
    memset(p, 0, sizeof *p);
}

static tw_status plan_push(plan *p, layer_kind kind, dnnl_primitive_desc_t pd, int src, int dst,
                           const tw_conv *conv, tw_error *err)
{
    if (p->n_layers == p->cap) {
        int cap = p->cap ? 2 * p->cap : 64;
        layer *l = tw_alloc(TW_MEM_OTHER, (size_t)cap * sizeof *l);
        if (!l) {
            dnnl_primitive_desc_destroy(pd);
            return tw_error_set(err, TW_ERR_NOMEM, "out of memory planning the CPU backend");
        }
        if (p->n_layers) memcpy(l, p->layers, (size_t)p->n_layers * sizeof *l);
        tw_free(p->layers);
        p->layers = l;
        p->cap = cap;
    }
    p->layers[p->n_layers++] = (layer){kind, pd, src, dst, conv};
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t sb = sp ? dnnl_memory_desc_get_size(sp) : 0;
    if (sb > p->scratch_bytes) p->scratch_bytes = sb;
    return TW_OK;
}

static void note_size(plan *p, int buf, const dnnl_memory_desc_t *md)
{
    /* each storage is sized for the largest thing it ever holds */
    size_t b = dnnl_memory_desc_get_size(md);
    if (b > p->buf_bytes[buf]) p->buf_bytes[buf] = b;
}

/* An activation on its way through the plan: its layout and its storage. */
typedef struct act {
    dnnl_memory_desc_t md;
    int buf;
    int c, h;
} act;

static tw_status make_attr(bool sum, bool relu, dnnl_primitive_attr_t *attr, tw_error *err)
{
    DNNL_TRY(dnnl_primitive_attr_create(attr), "attr create");
    dnnl_status_t s = dnnl_primitive_attr_set_scratchpad_mode(*attr, dnnl_scratchpad_mode_user);
    if (s == dnnl_success && (sum || relu)) {
        dnnl_post_ops_t po;
        s = dnnl_post_ops_create(&po);
        if (s == dnnl_success) {
            if (sum) s = dnnl_post_ops_append_sum(po, 1.0f);
            if (s == dnnl_success && relu)
                s = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f);
            if (s == dnnl_success) s = dnnl_primitive_attr_set_post_ops(*attr, po);
            dnnl_post_ops_destroy(po);
        }
    }
    if (s != dnnl_success) {
        dnnl_primitive_attr_destroy(*attr);
        return dnnl_fail(err, s, "attr setup");
    }
    return TW_OK;
}

/* Add conv c reading `in`; dst: when `into` is given, write into it with a
 * sum post-op (residual), else into storage dst_buf with a layout oneDNN
 * picks. *out describes the result. `in_any`: let oneDNN choose the source
 * layout too (the stem; the caller reads the choice back from the pd). */
static tw_status plan_conv(plan *p, dnnl_engine_t eng, const tw_conv *c, const act *in,
                           bool in_any, const act *into, int dst_buf, bool relu, act *out,
                           tw_error *err)
{
    int n = p->batch;
    int oh = tw_resnet_out_size(in->h, c->k, c->stride, c->pad);
    if (oh < 1)
        return tw_error_set(err, TW_ERR_INPUT,
                            "tile %d is too small: a %dx%d convolution gets a %dx%d input",
                            p->tile, c->k, c->k, in->h, in->h);
    dnnl_memory_desc_t src_md, w_md, b_md, dst_md;
    dnnl_dims_t sd = {n, c->cin, in->h, in->h}, wd = {c->cout, c->cin, c->k, c->k};
    dnnl_dims_t bd = {c->cout}, dd = {n, c->cout, oh, oh};
    if (in_any)
        DNNL_TRY(dnnl_memory_desc_init_by_tag(&src_md, 4, sd, dnnl_f32, dnnl_format_tag_any),
                 "src md");
    else
        src_md = in->md;
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&w_md, 4, wd, dnnl_f32, dnnl_format_tag_any), "w md");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&b_md, 1, bd, dnnl_f32, dnnl_x), "bias md");
    if (into)
        dst_md = into->md;
    else
        DNNL_TRY(dnnl_memory_desc_init_by_tag(&dst_md, 4, dd, dnnl_f32, dnnl_format_tag_any),
                 "dst md");
    /* right padding so that oneDNN's output size is PyTorch's floor formula */
    dnnl_dim_t pr = (dnnl_dim_t)(oh - 1) * c->stride + c->k - in->h - c->pad;
    dnnl_dims_t strides = {c->stride, c->stride}, pl = {c->pad, c->pad}, prr = {pr, pr};
    dnnl_convolution_desc_t cd;
    DNNL_TRY(dnnl_convolution_forward_desc_init(&cd, dnnl_forward_inference,
                                                dnnl_convolution_direct, &src_md, &w_md, &b_md,
                                                &dst_md, strides, pl, prr),
             "convolution desc");
    dnnl_primitive_attr_t attr;
    tw_status st = make_attr(into != NULL, relu, &attr, err);
    if (st != TW_OK) return st;
    dnnl_primitive_desc_t pd;
    dnnl_status_t s = dnnl_primitive_desc_create(&pd, &cd, attr, eng, NULL);
    dnnl_primitive_attr_destroy(attr);
    if (s != dnnl_success) return dnnl_fail(err, s, "convolution primitive desc");

    int dst = into ? into->buf : dst_buf;
    st = plan_push(p, L_CONV, pd, in->buf, dst, c, err);
    if (st != TW_OK) return st;
    const dnnl_memory_desc_t *wq, *dq;
    if ((st = query_md(pd, dnnl_query_weights_md, 0, &wq, err)) != TW_OK ||
        (st = query_md(pd, dnnl_query_dst_md, 0, &dq, err)) != TW_OK)
        return st;
    p->weight_bytes += alloc_size(dnnl_memory_desc_get_size(wq));
    p->weight_bytes += alloc_size((size_t)c->cout * sizeof(float));
    out->md = *dq;
    out->buf = dst;
    out->c = c->cout;
    out->h = oh;
    note_size(p, dst, &out->md);
    return TW_OK;
}

static tw_status plan_pool(plan *p, dnnl_engine_t eng, const act *in, bool global, int dst_buf,
                           act *out, tw_error *err)
{
    int k = global ? in->h : 3, stride = global ? 1 : 2, pad = global ? 0 : 1;
    int oh = tw_resnet_out_size(in->h, k, stride, pad);
    if (oh < 1)
        return tw_error_set(err, TW_ERR_INPUT, "tile %d is too small for the max pooling",
                            p->tile);
    dnnl_dims_t dd = {p->batch, in->c, oh, oh};
    dnnl_memory_desc_t dst_md;
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&dst_md, 4, dd, dnnl_f32, dnnl_format_tag_any),
             "pool dst md");
    dnnl_dim_t pr = (dnnl_dim_t)(oh - 1) * stride + k - in->h - pad;
    dnnl_dims_t strides = {stride, stride}, kernel = {k, k}, dil = {0, 0}, pl = {pad, pad},
                prr = {pr, pr};
    dnnl_pooling_v2_desc_t pdsc;
    DNNL_TRY(dnnl_pooling_v2_forward_desc_init(
                 &pdsc, dnnl_forward_inference,
                 global ? dnnl_pooling_avg_exclude_padding : dnnl_pooling_max, &in->md, &dst_md,
                 strides, kernel, dil, pl, prr),
             "pooling desc");
    dnnl_primitive_attr_t attr;
    tw_status st = make_attr(false, false, &attr, err);
    if (st != TW_OK) return st;
    dnnl_primitive_desc_t pd;
    dnnl_status_t s = dnnl_primitive_desc_create(&pd, &pdsc, attr, eng, NULL);
    dnnl_primitive_attr_destroy(attr);
    if (s != dnnl_success) return dnnl_fail(err, s, "pooling primitive desc");
    st = plan_push(p, L_POOL, pd, in->buf, dst_buf, NULL, err);
    if (st != TW_OK) return st;
    const dnnl_memory_desc_t *dq;
    if ((st = query_md(pd, dnnl_query_dst_md, 0, &dq, err)) != TW_OK) return st;
    out->md = *dq;
    out->buf = dst_buf;
    out->c = in->c;
    out->h = oh;
    note_size(p, dst_buf, &out->md);
    return TW_OK;
}

/* Lowest activation buffer not in busy (a bit mask). */
static int free_buf(unsigned busy)
{
    for (int i = 0; i < N_ACT; i++)
        if (!(busy & (1u << i))) return i;
    return -1;
}

static tw_status plan_build(plan *p, dnnl_engine_t eng, const tw_resnet *net, int tile,
                            int batch, tw_error *err)
{
    memset(p, 0, sizeof *p);
    p->batch = batch;
    p->tile = tile;
    p->feat_dim = net->feat_dim;
    tw_status st;
    dnnl_dims_t id = {batch, net->in_bands, tile, tile};
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&p->in_md, 4, id, dnnl_f32, dnnl_nchw), "input md");
    p->buf_bytes[BUF_IN_USER] = dnnl_memory_desc_get_size(&p->in_md);

    act in = {.md = p->in_md, .buf = BUF_IN_USER, .c = net->in_bands, .h = tile}, x, y;
    st = plan_conv(p, eng, &net->stem, &in, true, NULL, 0, true, &y, err);
    if (st != TW_OK) return st;
    /* the stem chose its input layout; convert the caller's NCHW when it differs */
    layer *stem = &p->layers[p->n_layers - 1];
    const dnnl_memory_desc_t *want;
    if ((st = query_md(stem->pd, dnnl_query_src_md, 0, &want, err)) != TW_OK) return st;
    if (!dnnl_memory_desc_equal(want, &p->in_md)) {
        dnnl_primitive_desc_t rpd;
        DNNL_TRY(dnnl_reorder_primitive_desc_create(&rpd, &p->in_md, eng, want, eng, NULL),
                 "input reorder desc");
        note_size(p, BUF_IN_BLK, want);
        stem->src = BUF_IN_BLK;
        /* the reorder runs first: swap it in front of the stem */
        st = plan_push(p, L_REORDER, rpd, BUF_IN_USER, BUF_IN_BLK, NULL, err);
        if (st != TW_OK) return st;
        layer t = p->layers[p->n_layers - 1];
        p->layers[p->n_layers - 1] = p->layers[p->n_layers - 2];
        p->layers[p->n_layers - 2] = t;
    }
    st = plan_pool(p, eng, &y, false, 1, &x, err);
    if (st != TW_OK) return st;

    for (int bi = 0; bi < net->n_blocks; bi++) {
        const tw_block *b = &net->blocks[bi];
        unsigned busy = 1u << x.buf;
        act sc = x, t1, t2;
        if (b->has_down) {
            st = plan_conv(p, eng, &b->down, &x, false, NULL, free_buf(busy), false, &sc, err);
            if (st != TW_OK) return st;
            busy |= 1u << sc.buf;
        }
        st = plan_conv(p, eng, &b->c1, &x, false, NULL, free_buf(busy), true, &t1, err);
        if (st != TW_OK) return st;
        busy |= 1u << t1.buf;
        if (net->bottleneck) {
            st = plan_conv(p, eng, &b->c2, &t1, false, NULL, free_buf(busy), true, &t2, err);
            if (st != TW_OK) return st;
            st = plan_conv(p, eng, &b->c3, &t2, false, &sc, 0, true, &x, err);
        } else {
            st = plan_conv(p, eng, &b->c2, &t1, false, &sc, 0, true, &x, err);
        }
        if (st != TW_OK) return st;
    }
    /* global average pool in the blocked layout (a plain-layout destination
     * would send oneDNN to its slow reference pooling), then a small reorder
     * brings the features back as plain [n][C] (nchw with 1x1) */
    act pooled;
    st = plan_pool(p, eng, &x, true, free_buf(1u << x.buf), &pooled, err);
    if (st != TW_OK) return st;
    dnnl_memory_desc_t feat_md;
    dnnl_dims_t fdims = {batch, pooled.c, 1, 1};
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&feat_md, 4, fdims, dnnl_f32, dnnl_nchw), "feat md");
    dnnl_primitive_desc_t rpd;
    DNNL_TRY(dnnl_reorder_primitive_desc_create(&rpd, &pooled.md, eng, &feat_md, eng, NULL),
             "features reorder desc");
    note_size(p, BUF_FEAT, &feat_md);
    return plan_push(p, L_REORDER, rpd, pooled.buf, BUF_FEAT, NULL, err);
}

/* Total bytes reserve() takes for this plan (all through tw_alloc). */
static size_t plan_bytes(const plan *p, const tw_resnet *net)
{
    size_t total = 0;
    for (int b = 0; b < BUF_COUNT; b++) total += alloc_size(p->buf_bytes[b]);
    total += alloc_size(p->scratch_bytes) + p->weight_bytes;
    total += alloc_size((size_t)net->n_classes * net->feat_dim * sizeof(float));
    total += alloc_size((size_t)net->n_classes * sizeof(float));
    return total;
}

/* ------------------------------------------------------------- backend */

static void set_threads(const cpu_ctx *c)
{
    /* an OpenMP setting belongs to the calling thread, and the pipeline
     * calls from its own worker thread: set it on every entry */
    if (c->threads > 0) omp_set_num_threads(c->threads);
}

static void release(cpu_ctx *c)
{
    for (int i = 0; i < c->n_ops; i++) dnnl_primitive_destroy(c->ops[i].prim);
    for (int i = 0; i < c->n_mems; i++) dnnl_memory_destroy(c->mems[i]);
    for (int i = 0; i < c->n_allocs; i++) tw_free(c->allocs[i]);
    tw_free(c->ops);
    tw_free(c->mems);
    tw_free(c->allocs);
    c->ops = NULL;
    c->mems = NULL;
    c->allocs = NULL;
    c->n_ops = c->n_mems = c->n_allocs = c->cap_mems = c->cap_allocs = 0;
    memset(c->buf, 0, sizeof c->buf);
    c->scratch = NULL;
    c->in_mem = NULL;
    c->fc_w = c->fc_b = NULL;
    c->reserved = false;
}

static void *ws_alloc(cpu_ctx *c, size_t bytes)
{
    if (c->n_allocs == c->cap_allocs) return NULL;
    void *p = tw_alloc(TW_MEM_WORKSPACE, bytes);
    if (p) c->allocs[c->n_allocs++] = p;
    return p;
}

static tw_status new_mem(cpu_ctx *c, const dnnl_memory_desc_t *md, void *handle,
                         dnnl_memory_t *out, tw_error *err)
{
    if (c->n_mems == c->cap_mems)
        return tw_error_set(err, TW_ERR_INTERNAL, "CPU backend: memory table full");
    DNNL_TRY(dnnl_memory_create(out, md, c->eng, handle), "memory create");
    c->mems[c->n_mems++] = *out;
    return TW_OK;
}

/* Reorder the folded OIHW weights of conv into the layout of its primitive
 * and keep them; the bias is copied as is. */
static tw_status prepare_weights(cpu_ctx *c, const layer *l, dnnl_memory_t *wm,
                                 dnnl_memory_t *bm, tw_error *err)
{
    const tw_conv *cv = l->conv;
    const dnnl_memory_desc_t *wmd, *bmd;
    tw_status st;
    if ((st = query_md(l->pd, dnnl_query_weights_md, 0, &wmd, err)) != TW_OK ||
        (st = query_md(l->pd, dnnl_query_weights_md, 1, &bmd, err)) != TW_OK)
        return st;
    void *w = ws_alloc(c, dnnl_memory_desc_get_size(wmd));
    void *b = ws_alloc(c, (size_t)cv->cout * sizeof(float));
    if (!w || !b) return tw_error_set(err, TW_ERR_NOMEM, "out of memory for the CPU weights");
    memcpy(b, cv->b, (size_t)cv->cout * sizeof(float));
    st = new_mem(c, wmd, w, wm, err);
    if (st == TW_OK) st = new_mem(c, bmd, b, bm, err);
    if (st != TW_OK) return st;

    dnnl_memory_desc_t umd;
    dnnl_dims_t wd = {cv->cout, cv->cin, cv->k, cv->k};
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&umd, 4, wd, dnnl_f32, dnnl_oihw), "weights md");
    dnnl_memory_t um;
    /* the reorder only reads the source: the cast drops const for the C API */
    DNNL_TRY(dnnl_memory_create(&um, &umd, c->eng, (void *)cv->w), "weights memory");
    dnnl_primitive_desc_t rpd = NULL;
    dnnl_primitive_t r = NULL;
    dnnl_status_t s = dnnl_reorder_primitive_desc_create(&rpd, &umd, c->eng, wmd, c->eng, NULL);
    if (s == dnnl_success) s = dnnl_primitive_create(&r, rpd);
    if (s == dnnl_success) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, um}, {DNNL_ARG_TO, *wm}};
        s = dnnl_primitive_execute(r, c->stream, 2, args);
    }
    if (s == dnnl_success) s = dnnl_stream_wait(c->stream);
    if (r) dnnl_primitive_destroy(r);
    if (rpd) dnnl_primitive_desc_destroy(rpd);
    dnnl_memory_destroy(um);
    if (s != dnnl_success) return dnnl_fail(err, s, "weights reorder");
    return TW_OK;
}

static tw_status build(cpu_ctx *c, const tw_resnet *net, const plan *p, tw_error *err)
{
    c->ops = tw_calloc(TW_MEM_OTHER, (size_t)p->n_layers, sizeof *c->ops);
    c->cap_mems = p->n_layers * 6 + 4;
    c->mems = tw_calloc(TW_MEM_OTHER, (size_t)c->cap_mems, sizeof *c->mems);
    c->cap_allocs = 2 * p->n_layers + BUF_COUNT + 4;
    c->allocs = tw_calloc(TW_MEM_OTHER, (size_t)c->cap_allocs, sizeof *c->allocs);
    if (!c->ops || !c->mems || !c->allocs)
        return tw_error_set(err, TW_ERR_NOMEM, "out of memory for the CPU backend");

    for (int b = 0; b < BUF_COUNT; b++) {
        size_t bytes = p->buf_bytes[b];
        if (bytes == 0) continue;
        /* zeroed once, so that the unused tail of a short batch is finite */
        c->buf[b] = ws_alloc(c, bytes);
        if (!c->buf[b]) goto nomem;
        memset(c->buf[b], 0, bytes);
    }
    if (p->scratch_bytes && !(c->scratch = ws_alloc(c, p->scratch_bytes))) goto nomem;
    size_t fc_n = (size_t)net->n_classes * net->feat_dim;
    c->fc_w = ws_alloc(c, fc_n * sizeof(float));
    c->fc_b = ws_alloc(c, (size_t)net->n_classes * sizeof(float));
    if (!c->fc_w || !c->fc_b) goto nomem;
    memcpy(c->fc_w, net->fc_w, fc_n * sizeof(float));
    memcpy(c->fc_b, net->fc_b, (size_t)net->n_classes * sizeof(float));

    tw_status st;
    for (int i = 0; i < p->n_layers; i++) {
        const layer *l = &p->layers[i];
        op *o = &c->ops[c->n_ops];
        DNNL_TRY(dnnl_primitive_create(&o->prim, l->pd), "primitive create");
        c->n_ops++;
        bool reorder = l->kind == L_REORDER;
        const dnnl_memory_desc_t *smd, *dmd;
        dnnl_memory_t sm, dm;
        if ((st = query_md(l->pd, dnnl_query_src_md, 0, &smd, err)) != TW_OK ||
            (st = query_md(l->pd, dnnl_query_dst_md, 0, &dmd, err)) != TW_OK)
            return st;
        st = new_mem(c, smd, c->buf[l->src], &sm, err);
        if (st == TW_OK) st = new_mem(c, dmd, c->buf[l->dst], &dm, err);
        if (st != TW_OK) return st;
        if (l->src == BUF_IN_USER) c->in_mem = sm;
        o->args[o->nargs++] = (dnnl_exec_arg_t){reorder ? DNNL_ARG_FROM : DNNL_ARG_SRC, sm};
        o->args[o->nargs++] = (dnnl_exec_arg_t){reorder ? DNNL_ARG_TO : DNNL_ARG_DST, dm};
        if (l->kind == L_CONV) {
            dnnl_memory_t wm, bm;
            st = prepare_weights(c, l, &wm, &bm, err);
            if (st != TW_OK) return st;
            o->args[o->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, wm};
            o->args[o->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, bm};
        }
        const dnnl_memory_desc_t *spmd =
            dnnl_primitive_desc_query_md(l->pd, dnnl_query_scratchpad_md, 0);
        if (spmd && dnnl_memory_desc_get_size(spmd) > 0) {
            dnnl_memory_t spm;
            st = new_mem(c, spmd, c->scratch, &spm, err);
            if (st != TW_OK) return st;
            o->args[o->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, spm};
        }
    }
    if (!c->in_mem) return tw_error_set(err, TW_ERR_INTERNAL, "CPU backend: no input layer");
    return TW_OK;
nomem:
    return tw_error_set(err, TW_ERR_NOMEM, "out of memory for the CPU backend workspace");
}

static size_t cpu_workspace_bytes(void *ctx, const tw_resnet *net, int tile, int max_batch,
                                  tw_precision prec)
{
    (void)prec;
    cpu_ctx *c = ctx;
    set_threads(c);
    plan p;
    tw_error err;
    tw_error_init(&err);
    size_t bytes;
    if (plan_build(&p, c->eng, net, tile, max_batch, &err) == TW_OK) {
        bytes = plan_bytes(&p, net);
    } else {
        /* reserve() will report the real problem; until then assume the
         * weights plus five copies of the stem output per tile */
        int h = tw_resnet_out_size(tile, 7, 2, 3);
        bytes = net->weight_bytes +
                5 * (size_t)max_batch * (size_t)net->stem.cout * h * h * 4 * sizeof(float);
    }
    plan_free(&p);
    return bytes;
}

static tw_status cpu_reserve(void *ctx, const tw_resnet *net, int tile, int *max_batch,
                             tw_precision prec, tw_error *err)
{
    cpu_ctx *c = ctx;
    if (*max_batch < 1)
        return tw_error_set(err, TW_ERR_INTERNAL, "CPU backend: max_batch %d", *max_batch);
    if (prec != TW_PREC_FP32 && prec != TW_PREC_TF32)
        fprintf(stderr, "tilewise: the CPU backend computes in fp32 (precision %s not "
                        "supported on this backend)\n",
                prec == TW_PREC_BF16 ? "bf16" : prec == TW_PREC_FP16 ? "fp16" : "int8");
    release(c);
    set_threads(c);
    int batch = *max_batch;
    for (;;) {
        plan p;
        tw_error local;
        tw_error_init(&local);
        tw_status st = plan_build(&p, c->eng, net, tile, batch, &local);
        if (st == TW_OK) st = build(c, net, &p, &local);
        plan_free(&p);
        if (st == TW_OK) break;
        release(c);
        if (st != TW_ERR_NOMEM || batch == 1) {
            /* only now record what went wrong (the retries stay silent) */
            if (local.set) tw_error_set(err, local.status, "%s", local.msg);
            return st;
        }
        batch /= 2;
    }
    if (batch != *max_batch) {
        fprintf(stderr, "tilewise: CPU backend: batch lowered from %d to %d (out of memory)\n",
                *max_batch, batch);
        *max_batch = batch;
    }
    c->max_batch = batch;
    c->tile = tile;
    c->in_bands = net->in_bands;
    c->feat_dim = net->feat_dim;
    c->n_classes = net->n_classes;
    c->reserved = true;
    return TW_OK;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static tw_status cpu_infer(void *ctx, const tw_infer_batch *b, tw_error *err)
{
    cpu_ctx *c = ctx;
    if (!c->reserved)
        return tw_error_set(err, TW_ERR_INTERNAL, "CPU backend: infer before reserve");
    if (b->n < 1 || b->n > c->max_batch || b->tile != c->tile || !b->x || !b->probs)
        return tw_error_set(err, TW_ERR_INTERNAL,
                            "CPU backend: batch of %d tiles of %d px does not fit the reserved "
                            "%d x %d px",
                            b->n, b->tile, c->max_batch, c->tile);
    double t0 = now_s();
    set_threads(c);
    void *src = c->buf[BUF_IN_USER];
    if (b->n == c->max_batch)
        src = (void *)b->x; /* read in place; oneDNN never writes its source */
    else
        memcpy(src, b->x, (size_t)b->n * c->in_bands * c->tile * c->tile * sizeof(float));
    DNNL_TRY(dnnl_memory_set_data_handle(c->in_mem, src), "set input");
    for (int i = 0; i < c->n_ops; i++)
        DNNL_TRY(dnnl_primitive_execute(c->ops[i].prim, c->stream, c->ops[i].nargs,
                                        c->ops[i].args),
                 "execute");
    DNNL_TRY(dnnl_stream_wait(c->stream), "stream wait");

    const float *feat = c->buf[BUF_FEAT];
    int fd = c->feat_dim, k = c->n_classes;
    if (b->emb) memcpy(b->emb, feat, (size_t)b->n * fd * sizeof(float));
    for (int t = 0; t < b->n; t++) {
        const float *f = feat + (size_t)t * fd;
        double logit[TW_MAX_CLASSES], mx = -INFINITY, sum = 0.0;
        for (int j = 0; j < k; j++) {
            const float *w = c->fc_w + (size_t)j * fd;
            double acc = c->fc_b[j];
            for (int i = 0; i < fd; i++) acc += (double)w[i] * f[i];
            logit[j] = acc;
            if (acc > mx) mx = acc;
        }
        for (int j = 0; j < k; j++) sum += (logit[j] = exp(logit[j] - mx));
        for (int j = 0; j < k; j++) b->probs[(size_t)t * k + j] = (float)(logit[j] / sum);
    }
    c->stats.compute_s += now_s() - t0;
    return TW_OK;
}

static bool cpu_wants_raw(void *ctx)
{
    (void)ctx;
    return false;
}

static void *cpu_host_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    (void)bytes;
    return NULL;
}

static void cpu_host_free(void *ctx, void *p)
{
    (void)ctx;
    (void)p;
}

static void cpu_get_stats(void *ctx, tw_backend_stats *out)
{
    *out = ((cpu_ctx *)ctx)->stats;
}

static void cpu_destroy(void *ctx)
{
    cpu_ctx *c = ctx;
    if (!c) return;
    release(c);
    if (c->stream) dnnl_stream_destroy(c->stream);
    if (c->eng) dnnl_engine_destroy(c->eng);
    tw_free(c);
}

static const struct tw_backend_i k_cpu_iface = {
    .name = "cpu",
    .workspace_bytes = cpu_workspace_bytes,
    .reserve = cpu_reserve,
    .infer = cpu_infer,
    .wants_raw = cpu_wants_raw,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .get_stats = cpu_get_stats,
    .destroy = cpu_destroy,
};

tw_status tw_cpu_backend_create(int threads, tw_backend *out, tw_error *err)
{
    out->i = NULL;
    out->ctx = NULL;
    cpu_ctx *c = tw_calloc(TW_MEM_OTHER, 1, sizeof *c);
    if (!c) return tw_error_set(err, TW_ERR_NOMEM, "out of memory creating the CPU backend");
    c->threads = threads > 0 ? threads : 0;
    dnnl_status_t s = dnnl_engine_create(&c->eng, dnnl_cpu, 0);
    if (s == dnnl_success) s = dnnl_stream_create(&c->stream, c->eng, dnnl_stream_default_flags);
    if (s != dnnl_success) {
        cpu_destroy(c);
        return dnnl_fail(err, s, "CPU engine/stream create");
    }
    out->i = &k_cpu_iface;
    out->ctx = c;
    return TW_OK;
}
