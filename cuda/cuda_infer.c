/* cuda_infer.c - the CUDA backend's batches: raw pixels across the bus in
 * chunks on the copy stream, normalized on the device, the network (cuDNN)
 * and its head (kernels.cu) on the compute stream, the results copied back,
 * and the timings of the overlap (see cuda_internal.h for the other parts,
 * cuda_backend.c for the transfer design).
 */
#include <string.h>

#include "cuda/cuda_check.h"
#include "cuda/cuda_internal.h"
#include "cuda/kernels.h"

/* The raw type numbers are shared with kernels.cu, which cannot include raster.h's enum users. */
_Static_assert((int)TW_DT_BYTE == TW_CUDA_RAW_U8 && (int)TW_DT_UINT16 == TW_CUDA_RAW_U16 &&
                   (int)TW_DT_INT16 == TW_CUDA_RAW_I16 && (int)TW_DT_UINT32 == TW_CUDA_RAW_U32 &&
                   (int)TW_DT_INT32 == TW_CUDA_RAW_I32 && (int)TW_DT_FLOAT32 == TW_CUDA_RAW_F32 &&
                   (int)TW_DT_FLOAT64 == TW_CUDA_RAW_F64 && (int)TW_DT_INT8 == TW_CUDA_RAW_I8,
               "tw_dtype and TW_CUDA_RAW_* must agree");

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
tw_status cuda_run_chunk(cuda_ctx *ctx, int n, int row, tw_error *err)
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
tw_status cuda_infer_begin(void *vctx, const tw_infer_batch *b, int lane, tw_error *err)
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
        if ((st = cuda_run_chunk(ctx, nj, row, err)) != TW_OK) return st;
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
tw_status cuda_infer_end(void *vctx, const tw_infer_batch *b, int lane, tw_error *err)
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

tw_status cuda_infer(void *vctx, const tw_infer_batch *b, tw_error *err)
{
    tw_status st = cuda_infer_begin(vctx, b, 0, err);
    return st != TW_OK ? st : cuda_infer_end(vctx, b, 0, err);
}
