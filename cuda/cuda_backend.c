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
 *
 * This file holds the vtable, the context's lifetime (streams, the cuDNN
 * handle, events), pinned host memory and the stats; the plan, reserve and
 * the batches are in cuda_plan.c, cuda_reserve.c and cuda_infer.c (their
 * jobs are listed in cuda_internal.h).
 */
#include "model/backend.h"

#include <stdio.h>
#include <string.h>

#include "cuda/cuda_check.h"
#include "cuda/cuda_internal.h"
#include "core/alloc.h"

/* ---- host memory, stats, lifetime ---- */

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
    cuda_release_reservation(ctx);
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
