/* cuda_reserve.c - the CUDA backend's reserve: the device arena allocated
 * once and carved into its regions, the weights converted and uploaded, the
 * host output buffers (pinned when possible), the trial run; on a device
 * too small, the batch is refused with what it needs (see cuda_internal.h
 * for the other parts, cuda_backend.c for the memory design).
 */
#include <stdio.h>
#include <string.h>

#include "cuda/cuda_check.h"
#include "cuda/cuda_internal.h"
#include "cuda/half.h"
#include "core/alloc.h"

static void free_attempt(cuda_ctx *ctx);

/* Undo reserve(): the arena, the output buffers and the per-layer descriptors. */
void cuda_release_reservation(cuda_ctx *ctx)
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

/* The arena's regions (p: their sizes) in plan order: every layer's weights
 * and bias, fc, the activations, the input, the raw and mask slots, the
 * outputs, the conv workspace. */
static void carve_arena(cuda_ctx *ctx, arena_plan p)
{
    uint8_t *base = ctx->arena;
    size_t off = 0;
    for (int i = 0; i < ctx->n_layers; i++) {
        cuda_layer *L = &ctx->layers[i];
        L->w_off = off;
        L->w = base + off;
        off += cuda_align_up((size_t)L->conv->cout * L->conv->k * L->conv->k *
                             (size_t)(L->cin / L->conv->groups) * ctx->esize);
        L->b_off = off;
        L->b = base + off;
        off += cuda_align_up((size_t)L->conv->cout * ctx->esize);
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
}

/* The host buffers each lane's results are copied into: pinned, or
 * ordinary memory when pinned memory is refused. */
static tw_status alloc_outputs(cuda_ctx *ctx, int max_batch, tw_error *err)
{
    const tw_resnet *net = ctx->net;
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
    ctx->chunk = cuda_chunk_for(max_batch);
    tw_status st = cuda_setup_for_batch(ctx, ctx->chunk, err);
    if (st != TW_OK) return st;
    arena_plan p =
        cuda_plan_arena(net, ctx->tile, max_batch, ctx->chunk, ctx->esize, ctx->ws_bytes);
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

    carve_arena(ctx, p);

    st = upload_weights(ctx, p.weights, p.fc_w, p.fc_b, err);
    if (st != TW_OK) return st;

    if ((st = alloc_outputs(ctx, max_batch, err)) != TW_OK) return st;
    for (int l = 0; l < LANES; l++) ctx->lane_busy[l] = false;
    ctx->prev_set = -1;

    /* Trial run on the zeroed input: finds layers cuDNN cannot fuse, loads
     * cuDNN's kernels now rather than in the first timed batch, and turns
     * launch errors into a reserve failure instead of a failed tile. */
    ctx->probing = true;
    st = cuda_run_chunk(ctx, ctx->chunk, 0, err);
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
    ctx->esize = cuda_dtype_bytes(prec);
    return TW_OK;
}

/* consume is not used: the weights are uploaded after the arena is
 * allocated, and the host copy stays for a reserve with a smaller batch. */
tw_status cuda_reserve(void *vctx, tw_resnet *net, int tile, int batch, tw_precision prec,
                       bool consume, tw_error *err)
{
    (void)consume;
    cuda_ctx *ctx = vctx;
    cuda_release_reservation(ctx);
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
    if ((st = cuda_plan_layers(ctx, net, tile, err)) != TW_OK) return st;
    if ((st = cuda_create_layer_descriptors(ctx, err)) != TW_OK) {
        cuda_release_reservation(ctx);
        return st;
    }

    bool no_fit;
    st = try_reserve(ctx, batch, &no_fit, err);
    if (st != TW_OK) {
        free_attempt(ctx);
        if (!no_fit) {
            cuda_release_reservation(ctx);
            return st;
        }
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
        cuda_release_reservation(ctx);
        return tw_error_set(
            err, TW_ERR_NOMEM,
            "cuda:%d (%s): %d tiles of %dx%d do not fit in device memory (%zu "
            "bytes needed, %zu free)",
            ctx->device, ctx->device_name, batch, tile, tile,
            cuda_plan_arena(net, tile, batch, cuda_chunk_for(batch), ctx->esize, ctx->ws_bytes)
                .total,
            free_b);
    }
    ctx->stats.unfused_convs = ctx->n_unfused;
    cuda_describe_algorithms(ctx);
    if (ctx->arena_bytes > ctx->stats.device_peak_bytes)
        ctx->stats.device_peak_bytes = ctx->arena_bytes;
    ctx->reserved = true;
    return TW_OK;
}

size_t cuda_workspace_bytes(void *vctx, const tw_resnet *net, int tile, int max_batch,
                            tw_precision prec)
{
    (void)vctx;
    if (tile < 1 || max_batch < 1) return 0;
    return cuda_plan_arena(net, tile, max_batch, cuda_chunk_for(max_batch), cuda_dtype_bytes(prec),
                           CONV_WORKSPACE_MAX)
        .total;
}
