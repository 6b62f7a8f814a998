/* cuda_plan.c - the CUDA backend's plan: the net walked (tw_resnet_walk)
 * into layers, the byte sizes of the device arena's regions (the estimate
 * and reserve use the one computation), and the cuDNN descriptors and
 * algorithms of every layer (see cuda_internal.h for the other parts).
 */
#include <stdio.h>
#include <string.h>

#include "cuda/cuda_check.h"
#include "cuda/cuda_internal.h"
#include "core/alloc.h"

/* ---- shapes ---- */

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
    return cuda_align_up((size_t)c->cout * (size_t)c->k * (size_t)c->k * (size_t)cin * esize) +
           cuda_align_up((size_t)c->cout * esize);
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

size_t cuda_dtype_bytes(tw_precision prec)
{
    return (prec == TW_PREC_FP16 || prec == TW_PREC_BF16) ? 2 : 4;
}

int cuda_chunk_for(int max_batch)
{
    return max_batch >= SPLIT_MIN_BATCH ? (max_batch + CHUNKS - 1) / CHUNKS : max_batch;
}

arena_plan cuda_plan_arena(const tw_resnet *net, int tile, int max_batch, int chunk, size_t esize,
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
    p.fc_w = cuda_align_up((size_t)net->n_classes * (size_t)net->feat_dim * sizeof(float));
    p.fc_b = cuda_align_up((size_t)net->n_classes * sizeof(float));
    p.act = cuda_align_up(s.max_act * (size_t)chunk * esize);
    p.x = cuda_align_up((size_t)chunk * hw * (size_t)cin_pad * esize);
    p.raw = cuda_align_up((size_t)chunk * (size_t)net->in_bands * hw * RAW_MAX_PIXEL_BYTES);
    p.valid = cuda_align_up((size_t)chunk * hw);
    p.emb = cuda_align_up((size_t)max_batch * (size_t)net->feat_dim * sizeof(float));
    p.probs = cuda_align_up((size_t)max_batch * (size_t)net->n_classes * sizeof(float));
    p.ws = cuda_align_up(ws_bytes);
    p.total = p.weights + p.fc_w + p.fc_b + 3 * p.act + p.x + CHUNKS * (p.raw + p.valid) + p.emb +
              p.probs + p.ws;
    return p;
}

tw_status cuda_plan_layers(cuda_ctx *ctx, const tw_resnet *net, int tile, tw_error *err)
{
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
    return TW_OK;
}

/* ---- cuDNN descriptors and algorithms ---- */

tw_status cuda_create_layer_descriptors(cuda_ctx *ctx, tw_error *err)
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
tw_status cuda_setup_for_batch(cuda_ctx *ctx, int n, tw_error *err)
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
void cuda_describe_algorithms(cuda_ctx *ctx)
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
