/* cuda_backend.c - the CUDA/cuDNN backend: tw_cuda_backend_create (model/backend.h).
 *
 * The network runs in NHWC with cuDNN's legacy convolution API. Every conv is
 * one cudnnConvolutionBiasActivationForward: bias and ReLU are fused, and the
 * last conv of each block takes the shortcut as z (alpha2 = 1), so the
 * residual add and its ReLU are fused too. Downsample convs have no ReLU and
 * use the identity activation, which cuDNN only offers with
 * IMPLICIT_PRECOMP_GEMM. Where cuDNN has no fused kernel for a layer (found
 * once, in reserve), that layer runs cudnnConvolutionForward plus our own
 * epilogue kernel instead.
 *
 * The graph (the order of the layers, their shapes, which of the three
 * activation buffers each reads, adds and writes) is tw_resnet_walk's
 * (model/resnet.h), as in the CPU backend and the reference.
 *
 * Memory: reserve() computes every buffer's size, allocates ONE device arena
 * (weights, three activation buffers, the input, two raw-pixel slots, outputs,
 * conv workspace) and never allocates again. On an allocation failure it
 * halves the batch and retries, down to 1.
 *
 * Transfers and overlap: raw pixels (uint8/uint16/...) and the validity mask
 * cross the bus, and a kernel normalizes them on the device. infer() must
 * return with its probabilities, so overlap is made inside one call: a batch
 * is split into two chunks, each with its own device raw slot; the H2D copy
 * of chunk 1 runs on the copy stream while chunk 0 computes on the compute
 * stream (ordered by events). Across calls, the pipeline's reader threads
 * fill other pinned slots (host_alloc) while the device computes. The host
 * waits only on the event after the final D2H copy, never on the whole device.
 */
#include "model/backend.h"

#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_check.h"
#include "cuda/half.h"
#include "cuda/kernels.h"
#include "core/alloc.h"

/* The raw type numbers are shared with kernels.cu, which cannot include raster.h's enum users. */
_Static_assert((int)TW_DT_BYTE == TW_CUDA_RAW_U8 && (int)TW_DT_UINT16 == TW_CUDA_RAW_U16 &&
                   (int)TW_DT_INT16 == TW_CUDA_RAW_I16 && (int)TW_DT_UINT32 == TW_CUDA_RAW_U32 &&
                   (int)TW_DT_INT32 == TW_CUDA_RAW_I32 && (int)TW_DT_FLOAT32 == TW_CUDA_RAW_F32 &&
                   (int)TW_DT_FLOAT64 == TW_CUDA_RAW_F64 && (int)TW_DT_INT8 == TW_CUDA_RAW_I8,
               "tw_dtype and TW_CUDA_RAW_* must agree");

enum {
    /* Chunks per batch = device raw slots: two is enough for the copy of one
     * chunk to hide behind the compute of the other. */
    CHUNKS = 2,
    /* Batches in flight across infer_begin/infer_end: the copy of one hides
     * behind the compute of the other. Each has its own host output buffers. */
    LANES = 2,
    /* Timing event sets kept: the two batches in flight and the one ended
     * before them, whose compute a later batch's copy may overlap. */
    EVSETS = 3,
    /* Below this batch, halves would be too small to keep the GPU busy. */
    SPLIT_MIN_BATCH = 8,
    /* Raw slots are sized for the widest pixel type (float64), so any raster
     * fits without reallocating: worst case reserved once (STYLE.md rule 9). */
    RAW_MAX_PIXEL_BYTES = 8,
    /* Tensor-core kernels want channel counts that are multiples of 8; the
     * stem's input (e.g. 6 bands) is zero-padded up to this. */
    CIN_ALIGN = 8,
    /* cudaMalloc's own alignment; every arena region starts on it. */
    ARENA_ALIGN = 256,
};

/* Largest conv workspace an algorithm may ask for. The NHWC implicit-GEMM
 * kernels cuDNN picks for ResNets need far less (kilobytes to a few MiB);
 * the cap only excludes FFT-style algorithms whose workspace would compete
 * with the batch for device memory. workspace_bytes() counts the full cap,
 * reserve() allocates what the chosen algorithms need. */
#define CONV_WORKSPACE_MAX ((size_t)64 << 20)

typedef struct cuda_layer {
    char name[48];
    const tw_conv *conv;
    int cin; /* input channels on the device (stem: padded) */
    int in_h, in_w, out_h, out_w;
    bool relu;
    int buf_src, buf_dst, buf_add; /* activation buffers (tw_resnet_op.buf_*): -1 for the
                                      input (x_dev) and for no shortcut */
    bool fused;                    /* run with cudnnConvolutionBiasActivationForward */
    cudnnTensorDescriptor_t x_desc, y_desc, b_desc;
    cudnnFilterDescriptor_t w_desc;
    cudnnConvolutionDescriptor_t conv_desc;
    cudnnConvolutionFwdAlgo_t algo;
    size_t ws_need;
    size_t w_off, b_off; /* offsets in the device arena */
    void *w, *b;
} cuda_layer;

/* The timing events of one batch. */
typedef struct batch_events {
    cudaEvent_t base, h2d_start[CHUNKS], h2d_end[CHUNKS];
    cudaEvent_t comp_start[CHUNKS], comp_end[CHUNKS], d2h_start, d2h_end;
} batch_events;

typedef struct cuda_ctx {
    int device;
    char device_name[256];
    size_t fail_above; /* test hook (tw_backend_params.cuda_fail_above); 0 = off */

    cudaStream_t copy_stream, compute_stream;
    cudnnHandle_t cudnn;
    cudnnActivationDescriptor_t act_relu, act_id;
    cudnnPoolingDescriptor_t pool_desc;
    cudnnTensorDescriptor_t pool_in_desc, pool_out_desc;
    batch_events ev[EVSETS];
    /* raw_dev[j] has been read by normalize: the next batch's copy into it
     * may start (it waits on this, not on the whole previous batch). */
    cudaEvent_t ev_norm_done[CHUNKS];

    /* Set by reserve. */
    const tw_resnet *net;
    bool reserved;
    int tile, max_batch, chunk;
    tw_precision prec;
    tw_cuda_dtype dtype;
    cudnnDataType_t cudnn_dtype;
    cudnnMathType_t math;
    size_t esize; /* bytes per activation/weight element */
    int cin_pad;
    cuda_layer *layers;
    int n_layers;
    int pool_h, pool_w, final_h, final_w;
    int pool_after, pool_src, pool_dst, final_buf; /* net_shape's */
    size_t max_act;                                /* largest activation of one tile, elements */
    void *arena;
    size_t arena_bytes;
    void *act[3], *x_dev, *raw_dev[CHUNKS], *ws;
    uint8_t *valid_dev[CHUNKS];
    float *fc_w, *fc_b, *emb_dev, *probs_dev;
    size_t ws_bytes;
    float *probs_host[LANES], *emb_host[LANES]; /* pinned when possible */
    /* Batches begun and not ended, per lane: their event set and chunks. */
    bool lane_busy[LANES];
    int lane_set[LANES], lane_chunks[LANES];
    long long n_begun;
    int prev_set, prev_chunks; /* the batch ended last (-1: none) */
    bool out_pinned;
    bool probing; /* reserve's trial run: unfused fallback allowed */
    int n_unfused;
    tw_backend_stats stats;
} cuda_ctx;

/* ---- error helpers (cuda_check.h) ---- */

/* Length of the function name at the start of a stringified call: the
 * argument list adds nothing to the message but length. */
static int call_name_len(const char *call)
{
    const char *paren = strchr(call, '(');
    return paren ? (int)(paren - call) : (int)strlen(call);
}

tw_status tw_cuda_fail(tw_error *err, const char *call, cudaError_t e, const char *file, int line)
{
    return tw_error_set(err, TW_ERR_DEVICE, "CUDA call %.*s failed at %s:%d: %s (%s)",
                        call_name_len(call), call, file, line, cudaGetErrorString(e),
                        cudaGetErrorName(e));
}

tw_status tw_cudnn_fail(tw_error *err, const char *call, cudnnStatus_t s, const char *file,
                        int line)
{
    return tw_error_set(err, TW_ERR_DEVICE, "cuDNN call %.*s failed at %s:%d: %s (%d)",
                        call_name_len(call), call, file, line, cudnnGetErrorString(s), (int)s);
}

/* ---- shapes ---- */

static size_t align_up(size_t v)
{
    return (v + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
}

static int round_up_int(int v, int m)
{
    return (v + m - 1) / m * m;
}

typedef struct net_shape {
    int n_layers;
    int pool_after; /* conv layers before the max pool (the stem); 0: none (small stem) */
    int pool_h, pool_w, final_h, final_w;
    int pool_src, pool_dst, final_buf; /* activation buffers (tw_resnet_op.buf_*) */
    size_t max_act;                    /* elements per tile */
} net_shape;

static void bump_act(net_shape *s, int c, int h, int w)
{
    size_t e = (size_t)c * (size_t)h * (size_t)w;
    if (e > s->max_act) s->max_act = e;
}

static size_t layer_weight_bytes(const tw_conv *c, int cin, size_t esize)
{
    return align_up((size_t)c->cout * (size_t)c->k * (size_t)c->k * (size_t)cin * esize) +
           align_up((size_t)c->cout * esize);
}

/* What the device needs from the walk (tw_resnet_walk): the shapes, the
 * bytes of the weights and, when layers is given, every conv as a layer in
 * walk order (forward() runs them in that order). */
typedef struct shape_walk {
    int cin_pad; /* the stem's input channels on the device */
    size_t esize;
    cuda_layer *layers; /* NULL: count and measure only */
    net_shape s;
    size_t weight_bytes;
} shape_walk;

static tw_status shape_op(void *user, const tw_resnet_op *op, tw_error *err)
{
    (void)err;
    shape_walk *w = user;
    net_shape *s = &w->s;
    if (op->kind == TW_RESNET_OP_MAXPOOL) {
        s->pool_after = s->n_layers;
        s->pool_h = s->pool_w = op->h_out;
        s->pool_src = op->buf_src;
        s->pool_dst = op->buf_dst;
        bump_act(s, op->c_out, op->h_out, op->h_out);
    }
    if (op->kind == TW_RESNET_OP_AVGPOOL) {
        s->final_h = s->final_w = op->h_in;
        s->final_buf = op->buf_src;
    }
    if (!op->conv) return TW_OK;
    int cin = op->kind == TW_RESNET_OP_STEM ? w->cin_pad : op->c_in;
    bump_act(s, op->c_out, op->h_out, op->h_out);
    /* a grouped conv (ResNeXt) holds cin / groups weights per output */
    w->weight_bytes += layer_weight_bytes(op->conv, cin / op->conv->groups, w->esize);
    if (w->layers) {
        cuda_layer *L = &w->layers[s->n_layers];
        snprintf(L->name, sizeof L->name, "%s", op->name);
        L->conv = op->conv;
        L->cin = cin;
        L->in_h = L->in_w = op->h_in;
        L->out_h = L->out_w = op->h_out;
        L->relu = op->relu;
        L->buf_src = op->buf_src;
        L->buf_dst = op->buf_dst;
        L->buf_add = op->buf_add;
    }
    s->n_layers++;
    return TW_OK;
}

/* Byte sizes of the arena's regions for one (batch, chunk) choice. */
typedef struct arena_plan {
    size_t weights, fc_w, fc_b, act, x, raw, valid, emb, probs, ws, total;
} arena_plan;

static size_t dtype_bytes(tw_precision prec)
{
    return (prec == TW_PREC_FP16 || prec == TW_PREC_BF16) ? 2 : 4;
}

static int chunk_for(int max_batch)
{
    return max_batch >= SPLIT_MIN_BATCH ? (max_batch + CHUNKS - 1) / CHUNKS : max_batch;
}

static arena_plan plan_arena(const tw_resnet *net, int tile, int max_batch, int chunk, size_t esize,
                             size_t ws_bytes)
{
    arena_plan p;
    memset(&p, 0, sizeof p);
    int cin_pad = round_up_int(net->in_bands, CIN_ALIGN);
    shape_walk w = {.cin_pad = cin_pad, .esize = esize};
    (void)tw_resnet_walk(net, tile, shape_op, &w, NULL); /* shape_op cannot fail */
    const net_shape s = w.s;
    size_t hw = (size_t)tile * (size_t)tile;
    p.weights = w.weight_bytes;
    p.fc_w = align_up((size_t)net->n_classes * (size_t)net->feat_dim * sizeof(float));
    p.fc_b = align_up((size_t)net->n_classes * sizeof(float));
    p.act = align_up(s.max_act * (size_t)chunk * esize);
    p.x = align_up((size_t)chunk * hw * (size_t)cin_pad * esize);
    p.raw = align_up((size_t)chunk * (size_t)net->in_bands * hw * RAW_MAX_PIXEL_BYTES);
    p.valid = align_up((size_t)chunk * hw);
    p.emb = align_up((size_t)max_batch * (size_t)net->feat_dim * sizeof(float));
    p.probs = align_up((size_t)max_batch * (size_t)net->n_classes * sizeof(float));
    p.ws = align_up(ws_bytes);
    p.total = p.weights + p.fc_w + p.fc_b + 3 * p.act + p.x + CHUNKS * (p.raw + p.valid) + p.emb +
              p.probs + p.ws;
    return p;
}

/* ---- reserve ---- */

static void free_attempt(cuda_ctx *ctx);

/* Undo reserve(): the arena, the output buffers and the per-layer descriptors. */
static void release_reservation(cuda_ctx *ctx)
{
    free_attempt(ctx);
    for (int i = 0; ctx->layers && i < ctx->n_layers; i++) {
        cuda_layer *L = &ctx->layers[i];
        if (L->x_desc) cudnnDestroyTensorDescriptor(L->x_desc);
        if (L->y_desc) cudnnDestroyTensorDescriptor(L->y_desc);
        if (L->b_desc) cudnnDestroyTensorDescriptor(L->b_desc);
        if (L->w_desc) cudnnDestroyFilterDescriptor(L->w_desc);
        if (L->conv_desc) cudnnDestroyConvolutionDescriptor(L->conv_desc);
    }
    tw_free(ctx->layers);
    ctx->layers = NULL;
    ctx->n_layers = 0;
    ctx->reserved = false;
    ctx->net = NULL;
}

static tw_status create_layer_descriptors(cuda_ctx *ctx, tw_error *err)
{
    for (int i = 0; i < ctx->n_layers; i++) {
        cuda_layer *L = &ctx->layers[i];
        TW_CUDNN_CHECK(cudnnCreateTensorDescriptor(&L->x_desc));
        TW_CUDNN_CHECK(cudnnCreateTensorDescriptor(&L->y_desc));
        TW_CUDNN_CHECK(cudnnCreateTensorDescriptor(&L->b_desc));
        TW_CUDNN_CHECK(cudnnCreateFilterDescriptor(&L->w_desc));
        TW_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&L->conv_desc));
        const tw_conv *c = L->conv;
        TW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(L->b_desc, CUDNN_TENSOR_NCHW, ctx->cudnn_dtype, 1,
                                                  c->cout, 1, 1));
        /* grouped (ResNeXt's conv2): the filter holds cin / groups inputs */
        TW_CUDNN_CHECK(cudnnSetFilter4dDescriptor(L->w_desc, ctx->cudnn_dtype, CUDNN_TENSOR_NHWC,
                                                  c->cout, L->cin / c->groups, c->k, c->k));
        /* fp16/bf16 data accumulate in fp32 (cuDNN's "pseudo half" configs). */
        TW_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(L->conv_desc, c->pad, c->pad, c->stride,
                                                       c->stride, 1, 1, CUDNN_CROSS_CORRELATION,
                                                       CUDNN_DATA_FLOAT));
        TW_CUDNN_CHECK(cudnnSetConvolutionGroupCount(L->conv_desc, c->groups));
    }
    return TW_OK;
}

/* Batch-dependent descriptors for n tiles, and each layer's algorithm. */
static tw_status setup_for_batch(cuda_ctx *ctx, int n, tw_error *err)
{
    const tw_resnet *net = ctx->net;
    if (ctx->pool_after > 0) { /* (a small stem has no max pool) */
        TW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(ctx->pool_in_desc, CUDNN_TENSOR_NHWC,
                                                  ctx->cudnn_dtype, n, net->stem.cout,
                                                  ctx->layers[0].out_h, ctx->layers[0].out_w));
        TW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(ctx->pool_out_desc, CUDNN_TENSOR_NHWC,
                                                  ctx->cudnn_dtype, n, net->stem.cout, ctx->pool_h,
                                                  ctx->pool_w));
        int pn, pc, ph, pw;
        TW_CUDNN_CHECK(cudnnGetPooling2dForwardOutputDim(ctx->pool_desc, ctx->pool_in_desc, &pn,
                                                         &pc, &ph, &pw));
        if (ph != ctx->pool_h || pw != ctx->pool_w)
            return tw_error_set(err, TW_ERR_INTERNAL,
                                "cuda backend: max pool output %dx%d, cuDNN says %dx%d",
                                ctx->pool_h, ctx->pool_w, ph, pw);
    }

    ctx->ws_bytes = 0;
    for (int i = 0; i < ctx->n_layers; i++) {
        cuda_layer *L = &ctx->layers[i];
        const tw_conv *c = L->conv;
        TW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(L->x_desc, CUDNN_TENSOR_NHWC, ctx->cudnn_dtype, n,
                                                  L->cin, L->in_h, L->in_w));
        TW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(L->y_desc, CUDNN_TENSOR_NHWC, ctx->cudnn_dtype, n,
                                                  c->cout, L->out_h, L->out_w));
        int on, oc, oh, ow;
        TW_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(L->conv_desc, L->x_desc, L->w_desc,
                                                             &on, &oc, &oh, &ow));
        if (on != n || oc != c->cout || oh != L->out_h || ow != L->out_w)
            return tw_error_set(err, TW_ERR_INTERNAL,
                                "cuda backend: %s output %dx%dx%d, cuDNN says %dx%dx%d", L->name,
                                c->cout, L->out_h, L->out_w, oc, oh, ow);

        TW_CUDNN_CHECK(cudnnSetConvolutionMathType(L->conv_desc, ctx->math));
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        int got = 0;
        TW_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
            ctx->cudnn, L->x_desc, L->w_desc, L->conv_desc, L->y_desc,
            CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf));
        /* The fused identity activation exists only with IMPLICIT_PRECOMP_GEMM;
         * without it the layer runs unfused with whatever algorithm is best. */
        L->fused = true;
        int pick = -1;
        for (int pass = 0; pass < 2 && pick < 0; pass++) {
            bool need_precomp = !L->relu && pass == 0;
            for (int k = 0; k < got; k++) {
                if (perf[k].status != CUDNN_STATUS_SUCCESS) continue;
                if (perf[k].memory > CONV_WORKSPACE_MAX) continue;
                if (need_precomp &&
                    perf[k].algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)
                    continue;
                /* fp32 means fp32: no TF32 tensor-core kernel sneaks in. */
                if (ctx->prec == TW_PREC_FP32 && perf[k].mathType != CUDNN_FMA_MATH &&
                    perf[k].mathType != CUDNN_DEFAULT_MATH)
                    continue;
                pick = k;
                break;
            }
            if (pick < 0 && !L->relu) L->fused = false;
        }
        if (pick < 0)
            return tw_error_set(err, TW_ERR_DEVICE,
                                "cuda:%d (%s): cuDNN offers no algorithm for %s (%dx%d, %d->%d "
                                "channels, batch %d) within %zu bytes of workspace",
                                ctx->device, ctx->device_name, L->name, L->in_h, L->in_w, L->cin,
                                c->cout, n, (size_t)CONV_WORKSPACE_MAX);
        L->algo = perf[pick].algo;
        L->ws_need = perf[pick].memory;
        if (ctx->prec != TW_PREC_FP32)
            TW_CUDNN_CHECK(cudnnSetConvolutionMathType(L->conv_desc, perf[pick].mathType));
        if (L->ws_need > ctx->ws_bytes) ctx->ws_bytes = L->ws_need;
    }
    return TW_OK;
}

static void put_elem(void *dst, size_t i, float v, tw_cuda_dtype t)
{
    switch (t) {
    case TW_CUDA_F32: ((float *)dst)[i] = v; break;
    case TW_CUDA_F16: ((uint16_t *)dst)[i] = tw_f32_to_f16_bits(v); break;
    case TW_CUDA_BF16: ((uint16_t *)dst)[i] = tw_f32_to_bf16_bits(v); break;
    }
}

/* Convert every conv to the device layout (OIHW -> OHWI = cuDNN's NHWC
 * filter, stem input channels zero-padded) and type, plus fc, into one host
 * staging buffer, then upload it with a single copy. */
static tw_status upload_weights(cuda_ctx *ctx, size_t weights_bytes, size_t fc_w_bytes,
                                size_t fc_b_bytes, tw_error *err)
{
    const tw_resnet *net = ctx->net;
    size_t total = weights_bytes + fc_w_bytes + fc_b_bytes;
    uint8_t *stage = tw_calloc(TW_MEM_OTHER, 1, total);
    if (!stage)
        return tw_error_set(err, TW_ERR_NOMEM,
                            "cuda backend: no host memory to stage %zu bytes of weights", total);
    for (int li = 0; li < ctx->n_layers; li++) {
        cuda_layer *L = &ctx->layers[li];
        const tw_conv *c = L->conv;
        void *w = stage + L->w_off;
        void *b = stage + L->b_off;
        /* per output: its group's inputs (all of them but for ResNeXt's
         * grouped conv2), the stem's padded with zeros to L->cin */
        int dev_cin = L->cin / c->groups, host_cin = c->cin / c->groups;
        for (int o = 0; o < c->cout; o++) {
            for (int y = 0; y < c->k; y++)
                for (int x = 0; x < c->k; x++)
                    for (int i = 0; i < dev_cin; i++) {
                        float v = 0.0f;
                        if (i < host_cin)
                            v = c->w[(((size_t)o * host_cin + i) * c->k + y) * c->k + x];
                        put_elem(w, (((size_t)o * c->k + y) * c->k + x) * dev_cin + i, v,
                                 ctx->dtype);
                    }
            put_elem(b, (size_t)o, c->b[o], ctx->dtype);
        }
    }
    memcpy(stage + weights_bytes, net->fc_w,
           (size_t)net->n_classes * (size_t)net->feat_dim * sizeof(float));
    memcpy(stage + weights_bytes + fc_w_bytes, net->fc_b, (size_t)net->n_classes * sizeof(float));
    /* On the compute stream, after the arena's memset there: a legacy-stream
     * cudaMemcpy could still be in flight when the (non-blocking) compute
     * stream starts reading the weights. */
    cudaError_t e =
        cudaMemcpyAsync(ctx->arena, stage, total, cudaMemcpyHostToDevice, ctx->compute_stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(ctx->compute_stream);
    tw_free(stage);
    if (e != cudaSuccess) return tw_cuda_fail(err, "cudaMemcpyAsync", e, __FILE__, __LINE__);
    return TW_OK;
}

static bool cudnn_unsupported(cudnnStatus_t s)
{
    /* 2xxx: BAD_PARAM family, 3xxx: NOT_SUPPORTED family (cudnn_graph.h). */
    return (int)s / 1000 == 2 || (int)s / 1000 == 3;
}

/* y = act(conv(x) + bias [+ z]) for one layer on the compute stream. */
static tw_status run_conv(cuda_ctx *ctx, cuda_layer *L, const void *x, const void *z, void *y,
                          int n, tw_error *err)
{
    const float one = 1.0f, zero = 0.0f;
    if (L->fused) {
        /* Without a shortcut, alpha2 = 0 and z = y: cuDNN then ignores z. */
        const float alpha2 = z ? 1.0f : 0.0f;
        cudnnStatus_t s = cudnnConvolutionBiasActivationForward(
            ctx->cudnn, &one, L->x_desc, x, L->w_desc, L->w, L->conv_desc, L->algo, ctx->ws,
            ctx->ws_bytes, &alpha2, L->y_desc, z ? z : y, L->b_desc, L->b,
            L->relu ? ctx->act_relu : ctx->act_id, L->y_desc, y);
        if (s == CUDNN_STATUS_SUCCESS) return TW_OK;
        if (!ctx->probing || !cudnn_unsupported(s))
            return tw_cudnn_fail(err, "cudnnConvolutionBiasActivationForward", s, __FILE__,
                                 __LINE__);
        L->fused = false;
    }
    TW_CUDNN_CHECK(cudnnConvolutionForward(ctx->cudnn, &one, L->x_desc, x, L->w_desc, L->w,
                                           L->conv_desc, L->algo, ctx->ws, ctx->ws_bytes, &zero,
                                           L->y_desc, y));
    int64_t count = (int64_t)n * L->conv->cout * L->out_h * L->out_w;
    TW_CUDA_CHECK(tw_cuda_launch_epilogue(y, L->b, z, count, L->conv->cout, L->relu ? 1 : 0,
                                          ctx->dtype, ctx->compute_stream));
    return TW_OK;
}

/* The network from ctx->x_dev (n_pad tiles, NHWC) to the features of the
 * last stage; returns (in *out_buf) the activation buffer holding them.
 * Each layer reads, adds and writes the buffers the walk gave it (three
 * suffice: tw_resnet_op.buf_*); the max pool runs after the stem. */
static tw_status run_network(cuda_ctx *ctx, int n_pad, int *out_buf, tw_error *err)
{
    const float one = 1.0f, zero = 0.0f;
    for (int i = 0; i < ctx->n_layers; i++) {
        cuda_layer *L = &ctx->layers[i];
        const void *x = L->buf_src >= 0 ? ctx->act[L->buf_src] : ctx->x_dev;
        const void *z = L->buf_add >= 0 ? ctx->act[L->buf_add] : NULL;
        tw_status st = run_conv(ctx, L, x, z, ctx->act[L->buf_dst], n_pad, err);
        if (st != TW_OK) return st;
        if (i + 1 == ctx->pool_after)
            TW_CUDNN_CHECK(cudnnPoolingForward(ctx->cudnn, ctx->pool_desc, &one, ctx->pool_in_desc,
                                               ctx->act[ctx->pool_src], &zero, ctx->pool_out_desc,
                                               ctx->act[ctx->pool_dst]));
    }
    *out_buf = ctx->final_buf;
    return TW_OK;
}

/* Network + head for one chunk already normalized in x_dev: features and
 * probabilities of its first n tiles land at row `row` of emb_dev/probs_dev. */
static tw_status run_chunk(cuda_ctx *ctx, int n, int row, tw_error *err)
{
    const tw_resnet *net = ctx->net;
    int buf = 0;
    tw_status st = run_network(ctx, ctx->chunk, &buf, err);
    if (st != TW_OK) return st;
    float *emb = ctx->emb_dev + (size_t)row * net->feat_dim;
    TW_CUDA_CHECK(tw_cuda_launch_global_avg(ctx->act[buf], n, ctx->final_h * ctx->final_w,
                                            net->feat_dim, ctx->dtype, emb, ctx->compute_stream));
    TW_CUDA_CHECK(tw_cuda_launch_fc_softmax(
        emb, ctx->fc_w, ctx->fc_b, n, net->feat_dim, net->n_classes,
        ctx->probs_dev + (size_t)row * net->n_classes, ctx->compute_stream));
    return TW_OK;
}

/* One attempt at reserving for max_batch. When the device memory is too
 * small it returns TW_ERR_NOMEM with *no_fit set and records nothing, so the
 * caller can retry smaller; any other failure is final and recorded. */
static tw_status try_reserve(cuda_ctx *ctx, int max_batch, bool *no_fit, tw_error *err)
{
    *no_fit = false;
    const tw_resnet *net = ctx->net;
    ctx->max_batch = max_batch;
    ctx->chunk = chunk_for(max_batch);
    tw_status st = setup_for_batch(ctx, ctx->chunk, err);
    if (st != TW_OK) return st;
    arena_plan p = plan_arena(net, ctx->tile, max_batch, ctx->chunk, ctx->esize, ctx->ws_bytes);
    if (ctx->fail_above && p.total > ctx->fail_above) {
        *no_fit = true;
        return TW_ERR_NOMEM;
    }
    cudaError_t e = cudaMalloc(&ctx->arena, p.total);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* not sticky: clear it and let the caller retry */
        ctx->arena = NULL;
        *no_fit = true;
        return TW_ERR_NOMEM;
    }
    if (e != cudaSuccess) return tw_cuda_fail(err, "cudaMalloc(arena)", e, __FILE__, __LINE__);
    ctx->arena_bytes = p.total;
    /* Defined contents everywhere: z = y with alpha2 = 0 must never meet NaN garbage. */
    TW_CUDA_CHECK(cudaMemsetAsync(ctx->arena, 0, p.total, ctx->compute_stream));

    uint8_t *base = ctx->arena;
    size_t off = 0;
    for (int i = 0; i < ctx->n_layers; i++) {
        cuda_layer *L = &ctx->layers[i];
        L->w_off = off;
        L->w = base + off;
        off += align_up((size_t)L->conv->cout * L->conv->k * L->conv->k *
                        (size_t)(L->cin / L->conv->groups) * ctx->esize);
        L->b_off = off;
        L->b = base + off;
        off += align_up((size_t)L->conv->cout * ctx->esize);
    }
    TW_ASSERT(off == p.weights);
    ctx->fc_w = (float *)(base + off);
    off += p.fc_w;
    ctx->fc_b = (float *)(base + off);
    off += p.fc_b;
    for (int i = 0; i < 3; i++, off += p.act) ctx->act[i] = base + off;
    ctx->x_dev = base + off;
    off += p.x;
    for (int i = 0; i < CHUNKS; i++, off += p.raw) ctx->raw_dev[i] = base + off;
    for (int i = 0; i < CHUNKS; i++, off += p.valid) ctx->valid_dev[i] = base + off;
    ctx->emb_dev = (float *)(base + off);
    off += p.emb;
    ctx->probs_dev = (float *)(base + off);
    off += p.probs;
    ctx->ws = ctx->ws_bytes ? base + off : NULL;
    off += p.ws;
    TW_ASSERT(off == p.total);

    st = upload_weights(ctx, p.weights, p.fc_w, p.fc_b, err);
    if (st != TW_OK) return st;

    size_t probs_bytes = (size_t)max_batch * net->n_classes * sizeof(float);
    size_t emb_bytes = (size_t)max_batch * net->feat_dim * sizeof(float);
    ctx->out_pinned = true;
    for (int l = 0; l < LANES; l++)
        ctx->out_pinned = ctx->out_pinned &&
                          cudaHostAlloc((void **)&ctx->probs_host[l], probs_bytes,
                                        cudaHostAllocDefault) == cudaSuccess &&
                          cudaHostAlloc((void **)&ctx->emb_host[l], emb_bytes,
                                        cudaHostAllocDefault) == cudaSuccess;
    if (!ctx->out_pinned) {
        (void)cudaGetLastError();
        for (int l = 0; l < LANES; l++) {
            if (ctx->probs_host[l]) cudaFreeHost(ctx->probs_host[l]);
            if (ctx->emb_host[l]) cudaFreeHost(ctx->emb_host[l]);
            ctx->probs_host[l] = tw_alloc(TW_MEM_WORKSPACE, probs_bytes);
            ctx->emb_host[l] = tw_alloc(TW_MEM_WORKSPACE, emb_bytes);
            if (!ctx->probs_host[l] || !ctx->emb_host[l])
                return tw_error_set(err, TW_ERR_NOMEM,
                                    "cuda backend: no host memory for %zu bytes of outputs",
                                    LANES * (probs_bytes + emb_bytes));
        }
    }
    for (int l = 0; l < LANES; l++) ctx->lane_busy[l] = false;
    ctx->prev_set = -1;

    /* Trial run on the zeroed input: finds layers cuDNN cannot fuse, loads
     * cuDNN's kernels now rather than in the first timed batch, and turns
     * launch errors into a reserve failure instead of a failed tile. */
    ctx->probing = true;
    st = run_chunk(ctx, ctx->chunk, 0, err);
    ctx->probing = false;
    if (st != TW_OK) return st;
    TW_CUDA_CHECK(cudaStreamSynchronize(ctx->compute_stream));
    ctx->n_unfused = 0;
    for (int i = 0; i < ctx->n_layers; i++) ctx->n_unfused += !ctx->layers[i].fused;
    return TW_OK;
}

/* Free what one try_reserve() allocated (the descriptors stay). */
static void free_attempt(cuda_ctx *ctx)
{
    if (ctx->arena) cudaFree(ctx->arena);
    ctx->arena = NULL;
    ctx->arena_bytes = 0;
    for (int l = 0; l < LANES; l++) {
        float *bufs[2] = {ctx->probs_host[l], ctx->emb_host[l]};
        for (int i = 0; i < 2; i++) {
            if (!bufs[i]) continue;
            if (ctx->out_pinned)
                cudaFreeHost(bufs[i]);
            else
                tw_free(bufs[i]);
        }
        ctx->probs_host[l] = ctx->emb_host[l] = NULL;
    }
}

static tw_status precision_setup(cuda_ctx *ctx, tw_precision prec, tw_error *err)
{
    ctx->prec = prec;
    switch (prec) {
    case TW_PREC_FP32:
        ctx->dtype = TW_CUDA_F32;
        ctx->cudnn_dtype = CUDNN_DATA_FLOAT;
        /* DEFAULT_MATH would allow TF32 on Ampere and later. */
        ctx->math = CUDNN_FMA_MATH;
        break;
    case TW_PREC_TF32:
        ctx->dtype = TW_CUDA_F32;
        ctx->cudnn_dtype = CUDNN_DATA_FLOAT;
        ctx->math = CUDNN_TENSOR_OP_MATH;
        break;
    case TW_PREC_FP16:
        ctx->dtype = TW_CUDA_F16;
        ctx->cudnn_dtype = CUDNN_DATA_HALF;
        ctx->math = CUDNN_TENSOR_OP_MATH;
        break;
    case TW_PREC_BF16:
        ctx->dtype = TW_CUDA_BF16;
        ctx->cudnn_dtype = CUDNN_DATA_BFLOAT16;
        ctx->math = CUDNN_TENSOR_OP_MATH;
        break;
    default:
        return tw_error_set(err, TW_ERR_CONFIG,
                            "runtime.precision: the cuda backend supports fp32, tf32, fp16 and "
                            "bf16, not int8");
    }
    ctx->esize = dtype_bytes(prec);
    return TW_OK;
}

static bool cuda_supports(void *vctx, const tw_resnet *net, int tile, tw_precision want,
                          tw_precision *runs_as, char *why, size_t why_size)
{
    (void)vctx, (void)net, (void)tile;
    *runs_as = want;
    if (want == TW_PREC_INT8) {
        snprintf(why, why_size, "supports fp32, tf32, fp16 and bf16, not int8");
        return false;
    }
    return true;
}

static const char *algo_name(cudnnConvolutionFwdAlgo_t a)
{
    switch (a) {
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM: return "implicit_gemm";
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM: return "implicit_precomp_gemm";
    case CUDNN_CONVOLUTION_FWD_ALGO_GEMM: return "gemm";
    case CUDNN_CONVOLUTION_FWD_ALGO_DIRECT: return "direct";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT: return "fft";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING: return "fft_tiling";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD: return "winograd";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED: return "winograd_nonfused";
    default: return "other";
    }
}

/* For run.json: the chosen algorithm of each kind of layer (kernel size),
 * with counts, e.g. "7x7: implicit_precomp_gemm x1; 3x3: ... x16; ...". */
static void describe_algorithms(cuda_ctx *ctx)
{
    char *out = ctx->stats.algorithms;
    size_t size = sizeof ctx->stats.algorithms, len = 0;
    out[0] = '\0';
    static const int ks[] = {7, 3, 1};
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
        for (int a = 0; a < CUDNN_CONVOLUTION_FWD_ALGO_COUNT; a++) {
            int n = 0;
            for (int i = 0; i < ctx->n_layers; i++)
                n += ctx->layers[i].conv->k == ks[ki] && (int)ctx->layers[i].algo == a;
            if (n == 0 || len >= size) continue;
            int w = snprintf(out + len, size - len, "%s%dx%d: %s x%d", len ? "; " : "", ks[ki],
                             ks[ki], algo_name((cudnnConvolutionFwdAlgo_t)a), n);
            if (w > 0) len += (size_t)w;
        }
}

/* consume is not used: the weights are uploaded after the arena is
 * allocated, and the host copy stays for a reserve with a smaller batch. */
static tw_status cuda_reserve(void *vctx, tw_resnet *net, int tile, int batch, tw_precision prec,
                              bool consume, tw_error *err)
{
    (void)consume;
    cuda_ctx *ctx = vctx;
    release_reservation(ctx);
    if (net->in_bands < 1 || net->in_bands > TW_MAX_BANDS || net->n_classes < 1 ||
        net->n_classes > TW_MAX_CLASSES)
        return tw_error_set(err, TW_ERR_MODEL,
                            "cuda backend: model with %d bands and %d classes is outside 1..%d "
                            "bands, 1..%d classes",
                            net->in_bands, net->n_classes, TW_MAX_BANDS, TW_MAX_CLASSES);
    tw_status st = precision_setup(ctx, prec, err);
    ctx->stats.precision = prec;
    if (st != TW_OK) return st;
    TW_CUDA_CHECK(cudaSetDevice(ctx->device));

    ctx->net = net;
    ctx->tile = tile;
    ctx->cin_pad = round_up_int(net->in_bands, CIN_ALIGN);
    shape_walk w = {.cin_pad = ctx->cin_pad, .esize = ctx->esize};
    (void)tw_resnet_walk(net, tile, shape_op, &w, NULL); /* count the layers */
    ctx->layers = tw_calloc(TW_MEM_OTHER, (size_t)w.s.n_layers, sizeof *ctx->layers);
    if (!ctx->layers) {
        ctx->net = NULL;
        return tw_error_set(err, TW_ERR_NOMEM, "cuda backend: no memory for %d layers",
                            w.s.n_layers);
    }
    ctx->n_layers = w.s.n_layers;
    w = (shape_walk){.cin_pad = ctx->cin_pad, .esize = ctx->esize, .layers = ctx->layers};
    (void)tw_resnet_walk(net, tile, shape_op, &w, NULL); /* shape_op cannot fail */
    const net_shape s = w.s;
    ctx->pool_after = s.pool_after;
    ctx->pool_src = s.pool_src;
    ctx->pool_dst = s.pool_dst;
    ctx->final_buf = s.final_buf;
    ctx->pool_h = s.pool_h;
    ctx->pool_w = s.pool_w;
    ctx->final_h = s.final_h;
    ctx->final_w = s.final_w;
    ctx->max_act = s.max_act;
    if ((st = create_layer_descriptors(ctx, err)) != TW_OK) {
        release_reservation(ctx);
        return st;
    }

    bool no_fit;
    st = try_reserve(ctx, batch, &no_fit, err);
    if (st != TW_OK) {
        free_attempt(ctx);
        if (!no_fit) {
            release_reservation(ctx);
            return st;
        }
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
        release_reservation(ctx);
        return tw_error_set(
            err, TW_ERR_NOMEM,
            "cuda:%d (%s): %d tiles of %dx%d do not fit in device memory (%zu "
            "bytes needed, %zu free)",
            ctx->device, ctx->device_name, batch, tile, tile,
            plan_arena(net, tile, batch, chunk_for(batch), ctx->esize, ctx->ws_bytes).total,
            free_b);
    }
    ctx->stats.unfused_convs = ctx->n_unfused;
    describe_algorithms(ctx);
    if (ctx->arena_bytes > ctx->stats.device_peak_bytes)
        ctx->stats.device_peak_bytes = ctx->arena_bytes;
    ctx->reserved = true;
    return TW_OK;
}

static size_t cuda_workspace_bytes(void *vctx, const tw_resnet *net, int tile, int max_batch,
                                   tw_precision prec)
{
    (void)vctx;
    if (tile < 1 || max_batch < 1) return 0;
    return plan_arena(net, tile, max_batch, chunk_for(max_batch), dtype_bytes(prec),
                      CONV_WORKSPACE_MAX)
        .total;
}

/* ---- infer ---- */

static tw_status affine_from_norm(const tw_norm *norm, int bands, tw_cuda_affine *aff,
                                  tw_error *err)
{
    for (int c = 0; c < TW_MAX_BANDS; c++) {
        aff->a[c] = 1.0f;
        aff->b[c] = 0.0f;
    }
    if (!norm) return TW_OK;
    if (norm->bands != bands)
        return tw_error_set(err, TW_ERR_INTERNAL,
                            "cuda backend: normalization for %d bands, model has %d", norm->bands,
                            bands);
    for (int c = 0; c < bands; c++) {
        if (!(norm->std[c] != 0.0f))
            return tw_error_set(err, TW_ERR_CONFIG, "model.std of band %d is %g: must not be 0",
                                c + 1, (double)norm->std[c]);
        aff->a[c] = (float)(norm->scale / norm->std[c]);
        aff->b[c] = -norm->mean[c] / norm->std[c];
    }
    return TW_OK;
}

static double elapsed_s(cudaEvent_t a, cudaEvent_t b)
{
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
        (void)cudaGetLastError(); /* timing is best effort; never fail a batch over it */
        return 0.0;
    }
    return ms / 1000.0;
}

/* Queue batch b in `lane`: per chunk, the copy of its raw pixels (copy
 * stream; it waits only until the previous user of that device buffer has
 * normalized it), then normalize, network and head (compute stream); then
 * the results' copy to the lane's host buffers. Returns without waiting. */
static tw_status cuda_infer_begin(void *vctx, const tw_infer_batch *b, int lane, tw_error *err)
{
    cuda_ctx *ctx = vctx; /* tw_backend_infer_begin checked b against the reservation */
    if (lane < 0 || lane >= LANES || ctx->lane_busy[lane])
        return tw_error_set(err, TW_ERR_INTERNAL, "cuda backend: lane %d is not free", lane);
    const tw_resnet *net = ctx->net;
    const int bands = net->in_bands;
    const size_t hw = (size_t)ctx->tile * ctx->tile;

    /* Raw pixels are the GPU path; a normalized float batch (b->x) is
     * accepted too, as raw float32 with the identity map. */
    const void *raw;
    tw_dtype raw_type;
    const uint8_t *valid;
    tw_cuda_affine aff;
    tw_status st;
    if (b->raw) {
        raw = b->raw;
        raw_type = b->raw_type;
        valid = b->valid;
        st = affine_from_norm(b->norm, bands, &aff, err);
    } else if (b->x) {
        raw = b->x;
        raw_type = TW_DT_FLOAT32;
        valid = NULL;
        st = affine_from_norm(NULL, bands, &aff, err);
    } else {
        return tw_error_set(err, TW_ERR_INTERNAL, "cuda backend: batch has neither raw nor x");
    }
    if (st != TW_OK) return st;
    size_t px = tw_dtype_size(raw_type);
    if (px == 0 || px > RAW_MAX_PIXEL_BYTES)
        return tw_error_set(err, TW_ERR_INTERNAL, "cuda backend: raw pixel type %d", (int)raw_type);
    const size_t tile_raw = (size_t)bands * hw * px;

    TW_CUDA_CHECK(cudaSetDevice(ctx->device));
    const int n_chunks = (b->n + ctx->chunk - 1) / ctx->chunk;
    TW_ASSERT(n_chunks <= CHUNKS);
    const int set = (int)(ctx->n_begun++ % EVSETS);
    batch_events *ev = &ctx->ev[set];
    TW_CUDA_CHECK(cudaEventRecord(ev->base, ctx->copy_stream));
    for (int j = 0; j < n_chunks; j++) {
        const int row = j * ctx->chunk;
        const int nj = b->n - row < ctx->chunk ? b->n - row : ctx->chunk;
        /* Copy of chunk j into device buffer j once the batch before has
         * normalized what it held: that copy overlaps the rest of the
         * batch before (its network), and chunk j-1's compute here. */
        TW_CUDA_CHECK(cudaStreamWaitEvent(ctx->copy_stream, ctx->ev_norm_done[j], 0));
        TW_CUDA_CHECK(cudaEventRecord(ev->h2d_start[j], ctx->copy_stream));
        TW_CUDA_CHECK(cudaMemcpyAsync(ctx->raw_dev[j], (const uint8_t *)raw + row * tile_raw,
                                      nj * tile_raw, cudaMemcpyHostToDevice, ctx->copy_stream));
        if (valid)
            TW_CUDA_CHECK(cudaMemcpyAsync(ctx->valid_dev[j], valid + row * hw, nj * hw,
                                          cudaMemcpyHostToDevice, ctx->copy_stream));
        TW_CUDA_CHECK(cudaEventRecord(ev->h2d_end[j], ctx->copy_stream));

        TW_CUDA_CHECK(cudaStreamWaitEvent(ctx->compute_stream, ev->h2d_end[j], 0));
        TW_CUDA_CHECK(cudaEventRecord(ev->comp_start[j], ctx->compute_stream));
        TW_CUDA_CHECK(tw_cuda_launch_normalize(
            ctx->raw_dev[j], (int)raw_type, valid ? ctx->valid_dev[j] : NULL, nj, ctx->chunk, bands,
            (int)hw, ctx->cin_pad, &aff, ctx->x_dev, ctx->dtype, ctx->compute_stream));
        TW_CUDA_CHECK(cudaEventRecord(ctx->ev_norm_done[j], ctx->compute_stream));
        if ((st = run_chunk(ctx, nj, row, err)) != TW_OK) return st;
        TW_CUDA_CHECK(cudaEventRecord(ev->comp_end[j], ctx->compute_stream));
    }
    TW_CUDA_CHECK(cudaEventRecord(ev->d2h_start, ctx->compute_stream));
    size_t probs_bytes = (size_t)b->n * net->n_classes * sizeof(float);
    size_t emb_bytes = (size_t)b->n * net->feat_dim * sizeof(float);
    TW_CUDA_CHECK(cudaMemcpyAsync(ctx->probs_host[lane], ctx->probs_dev, probs_bytes,
                                  cudaMemcpyDeviceToHost, ctx->compute_stream));
    if (b->emb)
        TW_CUDA_CHECK(cudaMemcpyAsync(ctx->emb_host[lane], ctx->emb_dev, emb_bytes,
                                      cudaMemcpyDeviceToHost, ctx->compute_stream));
    TW_CUDA_CHECK(cudaEventRecord(ev->d2h_end, ctx->compute_stream));
    ctx->lane_busy[lane] = true;
    ctx->lane_set[lane] = set;
    ctx->lane_chunks[lane] = n_chunks;
    return TW_OK;
}

/* Wait for the batch begun in `lane` and hand its results to b. Timings:
 * every copy's seconds inside a compute interval - of this batch's earlier
 * chunks, or of the batch ended before it - count as hidden. */
static tw_status cuda_infer_end(void *vctx, const tw_infer_batch *b, int lane, tw_error *err)
{
    cuda_ctx *ctx = vctx;
    if (lane < 0 || lane >= LANES || !ctx->lane_busy[lane])
        return tw_error_set(err, TW_ERR_INTERNAL, "cuda backend: no batch in lane %d", lane);
    ctx->lane_busy[lane] = false;
    const tw_resnet *net = ctx->net;
    const int set = ctx->lane_set[lane], n_chunks = ctx->lane_chunks[lane];
    batch_events *ev = &ctx->ev[set];
    TW_CUDA_CHECK(cudaSetDevice(ctx->device));
    /* The only host wait: this batch's results (kernel faults surface here). */
    TW_CUDA_CHECK(cudaEventSynchronize(ev->d2h_end));
    size_t probs_bytes = (size_t)b->n * net->n_classes * sizeof(float);
    size_t emb_bytes = (size_t)b->n * net->feat_dim * sizeof(float);
    memcpy(b->probs, ctx->probs_host[lane], probs_bytes);
    if (b->emb) memcpy(b->emb, ctx->emb_host[lane], emb_bytes);

    /* Times relative to the earlier batch's base, so both batches' intervals
     * are on one clock (its events are intact: EVSETS > LANES). */
    const batch_events *pe = ctx->prev_set >= 0 ? &ctx->ev[ctx->prev_set] : NULL;
    cudaEvent_t ref = pe ? pe->base : ev->base;
    double cs[CHUNKS], ce[CHUNKS], ks[2 * CHUNKS], ke[2 * CHUNKS];
    int n_k = 0;
    for (int i = 0; pe && i < ctx->prev_chunks; i++, n_k++) {
        ks[n_k] = elapsed_s(ref, pe->comp_start[i]);
        ke[n_k] = elapsed_s(ref, pe->comp_end[i]);
    }
    const int own = n_k; /* this batch's compute intervals start here */
    for (int j = 0; j < n_chunks; j++) {
        cs[j] = elapsed_s(ref, ev->h2d_start[j]);
        ce[j] = elapsed_s(ref, ev->h2d_end[j]);
        ks[own + j] = elapsed_s(ref, ev->comp_start[j]);
        ke[own + j] = elapsed_s(ref, ev->comp_end[j]);
        ctx->stats.copy_in_s += ce[j] - cs[j];
        ctx->stats.compute_s += ke[own + j] - ks[own + j];
    }
    for (int j = 0; j < n_chunks; j++)
        for (int i = 0; i < own + j; i++) {
            double lo = cs[j] > ks[i] ? cs[j] : ks[i];
            double hi = ce[j] < ke[i] ? ce[j] : ke[i];
            if (hi > lo) ctx->stats.copy_hidden_s += hi - lo;
        }
    ctx->stats.copy_out_s += elapsed_s(ev->d2h_start, ev->d2h_end);
    ctx->prev_set = set;
    ctx->prev_chunks = n_chunks;
    return TW_OK;
}

static tw_status cuda_infer(void *vctx, const tw_infer_batch *b, tw_error *err)
{
    tw_status st = cuda_infer_begin(vctx, b, 0, err);
    return st != TW_OK ? st : cuda_infer_end(vctx, b, 0, err);
}

/* ---- host memory, stats, lifetime ---- */

/* A small header in front of each host block says how to free it. */
typedef struct host_header {
    uint32_t magic;
    uint32_t pinned;
    char pad[ARENA_ALIGN - 2 * sizeof(uint32_t)];
} host_header;

#define HOST_MAGIC 0x74776831u /* "twh1" */

static void *cuda_host_alloc(void *vctx, size_t bytes)
{
    cuda_ctx *ctx = vctx;
    if (bytes > SIZE_MAX - sizeof(host_header)) return NULL;
    host_header *h = NULL;
    cudaError_t e = cudaSetDevice(ctx->device);
    if (e == cudaSuccess) e = cudaHostAlloc((void **)&h, sizeof *h + bytes, cudaHostAllocPortable);
    if (e == cudaSuccess) {
        h->pinned = 1;
    } else {
        (void)cudaGetLastError();
        /* the pipeline says so once (backend_stats.pinned_fallback) */
        ctx->stats.pinned_fallback = true;
        h = tw_alloc(TW_MEM_SLOTS, sizeof *h + bytes);
        if (!h) return NULL;
        h->pinned = 0;
    }
    h->magic = HOST_MAGIC;
    return h + 1;
}

static void cuda_host_free(void *vctx, void *p)
{
    (void)vctx;
    if (!p) return;
    host_header *h = (host_header *)p - 1;
    TW_ASSERT(h->magic == HOST_MAGIC);
    h->magic = 0;
    if (h->pinned) {
        if (cudaFreeHost(h) != cudaSuccess) (void)cudaGetLastError();
    } else {
        tw_free(h);
    }
}

/* Large batches keep the GPU busy; the budget bounds them by memory. */
static int cuda_auto_batch(void *vctx, const tw_resnet *net, int tile)
{
    (void)vctx;
    (void)net;
    (void)tile;
    return 256;
}

static bool cuda_consumes_weights(void *vctx, tw_precision prec)
{
    (void)vctx, (void)prec;
    return false; /* the host copy stays: batch halving rebuilds from it */
}

static bool cuda_wants_raw(void *vctx)
{
    (void)vctx;
    return true;
}

static void cuda_get_stats(void *vctx, tw_backend_stats *out)
{
    *out = ((cuda_ctx *)vctx)->stats;
}

static void cuda_destroy(void *vctx)
{
    cuda_ctx *ctx = vctx;
    if (!ctx) return;
    if (cudaSetDevice(ctx->device) != cudaSuccess) (void)cudaGetLastError();
    /* Nothing may still run on our buffers when they are freed. */
    if (ctx->compute_stream) (void)cudaStreamSynchronize(ctx->compute_stream);
    if (ctx->copy_stream) (void)cudaStreamSynchronize(ctx->copy_stream);
    release_reservation(ctx);
    if (ctx->pool_in_desc) cudnnDestroyTensorDescriptor(ctx->pool_in_desc);
    if (ctx->pool_out_desc) cudnnDestroyTensorDescriptor(ctx->pool_out_desc);
    if (ctx->pool_desc) cudnnDestroyPoolingDescriptor(ctx->pool_desc);
    if (ctx->act_relu) cudnnDestroyActivationDescriptor(ctx->act_relu);
    if (ctx->act_id) cudnnDestroyActivationDescriptor(ctx->act_id);
    if (ctx->cudnn) cudnnDestroy(ctx->cudnn);
    for (int k = 0; k < EVSETS; k++) {
        batch_events *e = &ctx->ev[k];
        cudaEvent_t *evs[] = {&e->base, &e->d2h_start, &e->d2h_end};
        for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
            if (*evs[i]) cudaEventDestroy(*evs[i]);
        for (int j = 0; j < CHUNKS; j++) {
            if (e->h2d_start[j]) cudaEventDestroy(e->h2d_start[j]);
            if (e->h2d_end[j]) cudaEventDestroy(e->h2d_end[j]);
            if (e->comp_start[j]) cudaEventDestroy(e->comp_start[j]);
            if (e->comp_end[j]) cudaEventDestroy(e->comp_end[j]);
        }
    }
    for (int j = 0; j < CHUNKS; j++)
        if (ctx->ev_norm_done[j]) cudaEventDestroy(ctx->ev_norm_done[j]);
    if (ctx->copy_stream) cudaStreamDestroy(ctx->copy_stream);
    if (ctx->compute_stream) cudaStreamDestroy(ctx->compute_stream);
    (void)cudaGetLastError();
    tw_free(ctx);
}

static const struct tw_backend_i cuda_iface = {
    .name = "cuda",
    .workspace_bytes = cuda_workspace_bytes,
    .supports = cuda_supports,
    .reserve = cuda_reserve,
    .infer = cuda_infer,
    .infer_begin = cuda_infer_begin,
    .infer_end = cuda_infer_end,
    .auto_batch = cuda_auto_batch,
    .consumes_weights = cuda_consumes_weights,
    .wants_raw = cuda_wants_raw,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .get_stats = cuda_get_stats,
    .destroy = cuda_destroy,
};

static tw_status ctx_init(cuda_ctx *ctx, tw_error *err)
{
    TW_CUDA_CHECK(cudaSetDevice(ctx->device));
    struct cudaDeviceProp prop;
    TW_CUDA_CHECK(cudaGetDeviceProperties(&prop, ctx->device));
    snprintf(ctx->device_name, sizeof ctx->device_name, "%s", prop.name);
    snprintf(ctx->stats.device, sizeof ctx->stats.device,
             "%.80s (cuda:%d, compute capability %d.%d)", prop.name, ctx->device, prop.major,
             prop.minor);
    int rt = 0;
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess) (void)cudaGetLastError();
    size_t dnn = cudnnGetVersion();
    snprintf(ctx->stats.library, sizeof ctx->stats.library, "cuDNN %zu.%zu.%zu, CUDA runtime %d.%d",
             dnn / 10000, dnn / 100 % 100, dnn % 100, rt / 1000, rt % 1000 / 10);
    /* Non-blocking: neither stream may serialize with the legacy default stream. */
    TW_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx->copy_stream, cudaStreamNonBlocking));
    TW_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx->compute_stream, cudaStreamNonBlocking));
    TW_CUDNN_CHECK(cudnnCreate(&ctx->cudnn));
    TW_CUDNN_CHECK(cudnnSetStream(ctx->cudnn, ctx->compute_stream));
    TW_CUDNN_CHECK(cudnnCreateActivationDescriptor(&ctx->act_relu));
    TW_CUDNN_CHECK(cudnnSetActivationDescriptor(ctx->act_relu, CUDNN_ACTIVATION_RELU,
                                                CUDNN_NOT_PROPAGATE_NAN, 0.0));
    TW_CUDNN_CHECK(cudnnCreateActivationDescriptor(&ctx->act_id));
    TW_CUDNN_CHECK(cudnnSetActivationDescriptor(ctx->act_id, CUDNN_ACTIVATION_IDENTITY,
                                                CUDNN_NOT_PROPAGATE_NAN, 0.0));
    TW_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&ctx->pool_desc));
    /* Inputs are post-ReLU (>= 0), so how padding enters the max is moot. */
    TW_CUDNN_CHECK(cudnnSetPooling2dDescriptor(ctx->pool_desc, CUDNN_POOLING_MAX,
                                               CUDNN_NOT_PROPAGATE_NAN, 3, 3, 1, 1, 2, 2));
    TW_CUDNN_CHECK(cudnnCreateTensorDescriptor(&ctx->pool_in_desc));
    TW_CUDNN_CHECK(cudnnCreateTensorDescriptor(&ctx->pool_out_desc));
    for (int k = 0; k < EVSETS; k++) {
        batch_events *e = &ctx->ev[k];
        TW_CUDA_CHECK(cudaEventCreate(&e->base));
        TW_CUDA_CHECK(cudaEventCreate(&e->d2h_start));
        TW_CUDA_CHECK(cudaEventCreate(&e->d2h_end));
        for (int j = 0; j < CHUNKS; j++) {
            TW_CUDA_CHECK(cudaEventCreate(&e->h2d_start[j]));
            TW_CUDA_CHECK(cudaEventCreate(&e->h2d_end[j]));
            TW_CUDA_CHECK(cudaEventCreate(&e->comp_start[j]));
            TW_CUDA_CHECK(cudaEventCreate(&e->comp_end[j]));
        }
    }
    /* only ordering, never timed */
    for (int j = 0; j < CHUNKS; j++)
        TW_CUDA_CHECK(cudaEventCreateWithFlags(&ctx->ev_norm_done[j], cudaEventDisableTiming));
    ctx->prev_set = -1;
    return TW_OK;
}

int tw_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver or no device: not an error, just none */
        return 0;
    }
    return n;
}

tw_status tw_cuda_backend_create(int device_index, const tw_backend_params *params, tw_backend *out,
                                 tw_error *err)
{
    memset(out, 0, sizeof *out);
    int count = tw_cuda_device_count();
    if (device_index < 0 || device_index >= count)
        return tw_error_set(err, TW_ERR_DEVICE, "cuda:%d: no such CUDA device (%d available)",
                            device_index, count);
    cuda_ctx *ctx = tw_calloc(TW_MEM_OTHER, 1, sizeof *ctx);
    if (!ctx) return tw_error_set(err, TW_ERR_NOMEM, "cuda backend: no memory for its context");
    ctx->device = device_index;
    /* Test hook (documented in cuda/README.md): pretend totals above this
     * many bytes fail to allocate, to exercise the batch halving. */
    ctx->fail_above = params->cuda_fail_above;
    tw_status st = ctx_init(ctx, err);
    if (st != TW_OK) {
        cuda_destroy(ctx);
        return st;
    }
    out->i = &cuda_iface;
    out->ctx = ctx;
    return TW_OK;
}
