/* cuda_internal.h - what the parts of the CUDA backend share: the backend's
 * context and its layers, the sizes every part agrees on, and the calls one
 * part makes into another. Every such call is named cuda_*; what one part
 * uses alone stays static there. The parts and their jobs:
 *
 *   cuda/cuda_backend.c  the vtable, the context's lifetime (streams, cuDNN
 *                        handle, events), pinned host memory, stats
 *   cuda/cuda_plan.c     the plan: the net walked into layers, the arena's
 *                        byte sizes, cuDNN descriptors and algorithms
 *   cuda/cuda_reserve.c  reserve: the device arena carved into regions, the
 *                        weights converted and uploaded, the output buffers,
 *                        the trial run, the batch halving's single attempt
 *   cuda/cuda_infer.c    a batch: raw pixels across the bus, normalize, the
 *                        network and its head, the copies back, the timings
 *   cuda/cuda_check.c    the error helpers of cuda_check.h
 *
 * Private to cuda/: it is not installed, and nothing outside cuda/ includes
 * it (scripts/check_layers.sh refuses it elsewhere). The design (memory,
 * transfers and overlap) is described at the top of cuda_backend.c.
 */
#ifndef TW_CUDA_INTERNAL_H
#define TW_CUDA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "model/backend.h"
#include "cuda/kernels.h"

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

/* v rounded up to ARENA_ALIGN. */
static inline size_t cuda_align_up(size_t v)
{
    return (v + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
}

/* ---- the plan (cuda_plan.c) ---- */

/* Byte sizes of the arena's regions for one (batch, chunk) choice. */
typedef struct arena_plan {
    size_t weights, fc_w, fc_b, act, x, raw, valid, emb, probs, ws, total;
} arena_plan;

/* Bytes per activation/weight element in precision prec. */
size_t cuda_dtype_bytes(tw_precision prec);
/* Tiles per chunk for a batch of max_batch (the whole batch below SPLIT_MIN_BATCH). */
int cuda_chunk_for(int max_batch);
/* The arena's regions for net at (tile, max_batch, chunk), with ws_bytes of
 * conv workspace. Allocates nothing; cannot fail. */
arena_plan cuda_plan_arena(const tw_resnet *net, int tile, int max_batch, int chunk, size_t esize,
                           size_t ws_bytes);
/* The net's convs as ctx->layers (allocated; walk order) and its shapes into
 * ctx (cin_pad, pool and final sizes, max_act). ctx->esize is set. Records
 * TW_ERR_NOMEM when the layers cannot be allocated. */
tw_status cuda_plan_layers(cuda_ctx *ctx, const tw_resnet *net, int tile, tw_error *err);
/* Create and set every layer's batch-independent cuDNN descriptors. */
tw_status cuda_create_layer_descriptors(cuda_ctx *ctx, tw_error *err);
/* Batch-dependent descriptors for n tiles, and each layer's algorithm;
 * ctx->ws_bytes becomes the largest workspace they need. */
tw_status cuda_setup_for_batch(cuda_ctx *ctx, int n, tw_error *err);
/* ctx->stats.algorithms: the chosen algorithm of each kind of layer. */
void cuda_describe_algorithms(cuda_ctx *ctx);

/* ---- reserve (cuda_reserve.c) ---- */

/* Undo reserve(): the arena, the output buffers and the per-layer descriptors. */
void cuda_release_reservation(cuda_ctx *ctx);
/* The vtable's reserve and workspace_bytes (model/backend.h). */
tw_status cuda_reserve(void *vctx, tw_resnet *net, int tile, int batch, tw_precision prec,
                       bool consume, tw_error *err);
size_t cuda_workspace_bytes(void *vctx, const tw_resnet *net, int tile, int max_batch,
                            tw_precision prec);

/* ---- a batch (cuda_infer.c) ---- */

/* Network + head for one chunk already normalized in x_dev: features and
 * probabilities of its first n tiles land at row `row` of emb_dev/probs_dev. */
tw_status cuda_run_chunk(cuda_ctx *ctx, int n, int row, tw_error *err);
/* The vtable's infer, infer_begin and infer_end (model/backend.h). */
tw_status cuda_infer(void *vctx, const tw_infer_batch *b, tw_error *err);
tw_status cuda_infer_begin(void *vctx, const tw_infer_batch *b, int lane, tw_error *err);
tw_status cuda_infer_end(void *vctx, const tw_infer_batch *b, int lane, tw_error *err);

#endif
