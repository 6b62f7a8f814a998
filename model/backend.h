/* backend.h - the one seam between tilewise and the hardware that runs the net.
 *
 * A backend is a vtable (struct tw_backend_i) plus an opaque context, as in
 * ggml. The CPU backend (model/cpu_backend.c, oneDNN) is always built; the
 * CUDA backend (cuda/) registers itself only when compiled in. No CUDA type
 * appears here, and no struct here changes layout with a build flag.
 *
 * Lifetime: create -> reserve (once, worst case: max batch) -> infer... -> destroy.
 * After reserve, infer allocates nothing.
 *
 * Policy lives above the seam, in backend.c, once for every backend: which
 * precision runs when the one asked for is not available (supports), the
 * halving of the batch when it does not fit (tw_backend_reserve), the checks
 * of every batch (tw_backend_infer), and the notices about all of them
 * (through the caller's tw_log). A backend answers questions, tries exactly
 * what it is asked, returns a status, and prints nothing.
 */
#ifndef TW_BACKEND_H
#define TW_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/params.h"
#include "model/resnet.h"
#include "model/segnet.h"

/* One batch as the backend sees it. All buffers belong to the batch slot.
 *   x      [n][bands][tile][tile] float32, already normalized (CPU path)
 *   raw    [n][bands][tile][tile] of raw_type, with valid [n][tile][tile]
 *          (1 = valid pixel): for backends with wants_raw (GPU path)
 *   probs  out: [n][n_classes] softmax probabilities; after seg_reserve
 *          (a segmentation model) [n][n_classes][tile][tile], per pixel
 *   emb    out: [n][feat_dim] pooled features, or NULL when not wanted
 *          (always NULL for a segmentation model) */
typedef struct tw_infer_batch {
    int n;
    int tile;
    const float *x;
    const void *raw;
    tw_dtype raw_type;
    const uint8_t *valid;
    const tw_norm *norm;
    float *probs;
    float *emb;
} tw_infer_batch;

/* Backend timings accumulated over a run, for run.json. Seconds. */
typedef struct tw_backend_stats {
    double compute_s;         /* device/CPU compute */
    double copy_in_s;         /* host->device copies (0 on CPU) */
    double copy_out_s;        /* device->host copies (0 on CPU) */
    double copy_hidden_s;     /* copy time overlapped with compute */
    size_t device_peak_bytes; /* device memory high-water mark (0 on CPU) */
    int batch_halvings;       /* times the batch was halved after an allocation failure */
    int unfused_convs;        /* convolutions the device runs without fused bias/ReLU (CUDA) */
    bool pinned_fallback;     /* host_alloc gave ordinary memory: no pinned memory left */
    char device[128];         /* what runs the net: "NVIDIA H100 80GB HBM3 (cuda:0)", or the
                                 CPU's instruction set as oneDNN uses it */
    char library[96];         /* "cuDNN 9.x.y, CUDA runtime 13.0", "oneDNN 2.7.3" */
    char algorithms[256];     /* the convolution algorithms chosen, per kind of layer */
    tw_precision precision;   /* what the backend really computes in (it may fall back) */
    int winograd_convs;       /* convolutions run as Winograd F(4,3) (CPU, fp32; 0 elsewhere) */
    int gemm_convs;           /* convolutions run as one inner product (CPU GEMM lowerings) */
    int lowerings_refused;    /* CPU lowerings (Winograd matmul, GEMM) left to direct kernels
                                 because their GEMM gave a tile other bits in another place
                                 of the batch (model/cpu_lower.c, rows_independent) */
    int int8_weight_bits;     /* int8 on the CPU: 8, or 7 where oneDNN's kernels have no VNNI
                                 and 8-bit weights could saturate their 16-bit sums; 0 when
                                 not int8 */
} tw_backend_stats;

struct tw_backend_i {
    const char *name; /* "cpu", "cuda" */
    /* Bytes of workspace (activations, scratch, device weights) infer needs
     * for batches of up to max_batch tiles of tile x tile pixels, without
     * allocating. Used by the budget to pick batch: auto. */
    size_t (*workspace_bytes)(void *ctx, const tw_resnet *net, int tile, int max_batch,
                              tw_precision prec);
    /* batch: auto's upper bound for net on tiles of tile x tile pixels:
     * the batch beyond which this backend gets no faster, only bigger (the
     * budget may lower it further). */
    int (*auto_batch)(void *ctx, const tw_resnet *net, int tile);
    /* What this backend computes in when runtime.precision is `want`, for
     * this net and tile: true with *runs_as (== want, or the precision it
     * falls back to, with the reason in why), or false when it refuses want
     * (why says why). May build a trial plan; allocates nothing lasting. */
    bool (*supports)(void *ctx, const tw_resnet *net, int tile, tw_precision want,
                     tw_precision *runs_as, char *why, size_t why_size);
    /* Allocate everything for batches of up to `batch` tiles in prec (a
     * precision supports() answered with). Exactly that batch: TW_ERR_NOMEM
     * (with a message) when it does not fit, and nothing is left allocated:
     * tw_backend_reserve then halves it. consume: the caller will not use
     * the net's convolution weights again, so a backend that keeps its own
     * copy may free each conv's w and b (tw_resnet_release_conv) as soon as
     * it is copied: the weights are then never in memory twice. A net
     * consumed by one reserve cannot be reserved again. */
    tw_status (*reserve)(void *ctx, tw_resnet *net, int tile, int batch, tw_precision prec,
                         bool consume, tw_error *err);
    /* Whether reserve(..., consume = true) frees the net's weights in prec:
     * then the budget counts them at the model load only, not in the run. */
    bool (*consumes_weights)(void *ctx, tw_precision prec);
    /* runtime.precision int8 (NULL where a backend has no int8): measure the
     * activation ranges on the b->n tiles of b (of the raster `path`; any
     * n >= 1, more than the reserved batch too: the sample's size is
     * TW_CALIB_TILES whatever the batch, so that the ranges do not depend
     * on the budget) and quantize with them from now on. Called before the
     * first infer of each raster; a backend not yet calibrated when infer
     * comes calibrates on that batch. May rebuild what reserve built (the
     * same memory), so it may allocate. Writes nothing into b. */
    tw_status (*calibrate)(void *ctx, const tw_infer_batch *b, const char *path, tw_error *err);
    /* Run one batch (b->n <= the reserved batch; tw_backend_infer checks).
     * Allocates nothing. */
    tw_status (*infer)(void *ctx, const tw_infer_batch *b, tw_error *err);
    /* Optional (NULL: infer only), for a device that runs beside the host:
     * infer_begin queues batch b in lane 0 or 1 and returns at once;
     * infer_end waits for it and writes its outputs. begin(b) then end(b)
     * is infer(b). Two batches may be begun and not ended, in different
     * lanes: the copy of the second overlaps the compute of the first. They
     * end in the order begun; b's buffers stay untouched until its end. */
    tw_status (*infer_begin)(void *ctx, const tw_infer_batch *b, int lane, tw_error *err);
    tw_status (*infer_end)(void *ctx, const tw_infer_batch *b, int lane, tw_error *err);
    /* true: infer reads b->raw/valid/norm and normalizes itself (x may be NULL);
     * false: infer reads b->x. */
    bool (*wants_raw)(void *ctx);
    /* Host memory for batch slots that this backend can copy from fast
     * (pinned on CUDA). NULL means "use tw_alloc". Freed with host_free. */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);
    void (*get_stats)(void *ctx, tw_backend_stats *out);
    void (*destroy)(void *ctx);
    /* Segmentation models (model/segnet.h), in fp32; both NULL where the
     * backend runs none. seg_workspace_bytes: what seg_reserve takes for
     * batches of max_batch tiles (activations, scratch, weights in its
     * layouts), without allocating. seg_reserve: as reserve, for net (which
     * must outlive the reservation); infer then writes per-pixel
     * probabilities. A later reserve of either kind replaces it. */
    size_t (*seg_workspace_bytes)(void *ctx, const tw_segnet *net, int tile, int max_batch);
    tw_status (*seg_reserve)(void *ctx, const tw_segnet *net, int tile, int batch, tw_error *err);
};

typedef struct tw_backend {
    const struct tw_backend_i *i;
    void *ctx;
    /* set by tw_backend_reserve */
    bool reserved;
    int tile, max_batch;
    tw_precision precision; /* what it computes in */
    int batch_halvings;     /* by tw_backend_reserve, over the backend's life */
} tw_backend;

enum { TW_CPU_WINOGRAD_OFF = 0, TW_CPU_WINOGRAD_AUTO = 1, TW_CPU_WINOGRAD_OWN = 2 };

/* Knobs of a backend, filled by the caller (the CLI from its command line
 * and environment); the library reads no environment variable. */
typedef struct tw_backend_params {
    int threads; /* CPU threads; 0 = all cores */
    /* fp32 3x3 stride-1 convolutions as Winograd F(4,3): TW_CPU_WINOGRAD_AUTO
     * (the default) oneDNN's kernel where it has one (AVX-512), else this
     * tree's (model/winograd.c, on nhwc activations); _OFF never; _OWN this
     * tree's everywhere (tests and benchmarks; needs cpu_nhwc 1 on AVX-512) */
    int cpu_winograd;
    /* fp32 convolutions lowered to one oneDNN inner product (GEMM) per layer
     * (model/cpu_lower.c, "GEMM lowerings"): -1 where bench/RESULTS.md
     * measured them faster (the default), 0 never, 1 wherever they apply
     * (tests: every lowering on every layer it can express) */
    int cpu_gemm;
    /* fp32 activations channels-last (nhwc): -1 on CPUs without AVX-512
     * (the default), 0 never, 1 always (where Winograd does not need nChw16c) */
    int cpu_nhwc;
    size_t cuda_fail_above; /* test hook: device arenas above this many bytes fail (0: off) */
    const tw_log *log;      /* where create's notices go (may be NULL) */
} tw_backend_params;

tw_backend_params tw_backend_default_params(void);

/* Reserve b for batches of up to *max_batch tiles of tile x tile pixels
 * in precision prec: asks supports() what runs (a fallback is a notice on
 * log; a refusal is TW_ERR_CONFIG naming the backend and the reason), then
 * reserve() with *max_batch, halving it after each TW_ERR_NOMEM down to 1
 * (a lowered batch is a notice; batch 1 failing is the backend's error).
 * *max_batch receives the batch reserved. consume: see reserve(). */
tw_status tw_backend_reserve(tw_backend *b, tw_resnet *net, int tile, int *max_batch,
                             tw_precision prec, bool consume, const tw_log *log, tw_error *err);
/* tw_backend_reserve for a segmentation model: fp32 whatever prec asks (a
 * notice on log when it asks another), the batch halved after each
 * TW_ERR_NOMEM down to 1. TW_ERR_CONFIG naming the backend when it runs
 * no segmentation model (seg_reserve NULL). */
tw_status tw_backend_reserve_seg(tw_backend *b, const tw_segnet *net, int tile, int *max_batch,
                                 tw_precision prec, const tw_log *log, tw_error *err);
/* Whether b runs segmentation models. */
bool tw_backend_segments(const tw_backend *b);
/* Run one batch after checking it against the reservation (size, tile,
 * buffers): a mismatch is TW_ERR_INTERNAL naming both. */
tw_status tw_backend_infer(tw_backend *b, const tw_infer_batch *batch, tw_error *err);
/* infer_begin / infer_end with the same checks; a backend without them
 * runs the whole batch in begin (end then only returns). */
tw_status tw_backend_infer_begin(tw_backend *b, const tw_infer_batch *batch, int lane,
                                 tw_error *err);
tw_status tw_backend_infer_end(tw_backend *b, const tw_infer_batch *batch, int lane, tw_error *err);
/* The backend's statistics, with the seam's own (batch_halvings). */
void tw_backend_get_stats(const tw_backend *b, tw_backend_stats *out);
/* Whether infer_begin/infer_end overlap two batches (the pipeline then
 * keeps one more slot in the infer stage). */
bool tw_backend_overlaps(const tw_backend *b);

/* Create a backend for runtime.device ("auto", "cpu", "cuda", "cuda:N").
 * "auto" picks CUDA when compiled in and a device is present, else the CPU
 * with one notice on params->log. "cuda"/"cuda:N" without a usable device
 * is TW_ERR_DEVICE. On success *out must be released with
 * tw_backend_destroy. */
tw_status tw_backend_create_ex(const char *device, const tw_backend_params *params, tw_backend *out,
                               tw_error *err);
/* tw_backend_create_ex with default params but threads, and no log. */
tw_status tw_backend_create(const char *device, int threads, bool quiet, tw_backend *out,
                            tw_error *err);
void tw_backend_destroy(tw_backend *b);

/* A backend from outside the library (a benchmark's or a test's), created
 * by tw_backend_create when runtime.device equals `device` (at most 15
 * characters; at most 4 registrations). Not thread-safe: register at start-up,
 * before any run. */
typedef tw_status (*tw_backend_create_fn)(const tw_backend_params *params, tw_backend *out,
                                          tw_error *err);
tw_status tw_backend_register(const char *device, tw_backend_create_fn create, tw_error *err);

/* Constructors of the individual backends (used by tw_backend_create). */
tw_status tw_cpu_backend_create(const tw_backend_params *params, tw_backend *out, tw_error *err);
#ifdef TW_WITH_CUDA
tw_status tw_cuda_backend_create(int device_index, const tw_backend_params *params, tw_backend *out,
                                 tw_error *err);
int tw_cuda_device_count(void);
#endif

/* Reference forward pass in plain C (slow, used by tests and as the
 * definition of the semantics in resnet.h): x [n][bands][tile][tile] ->
 * probs [n][classes], emb [n][feat_dim] (may be NULL). Allocates its own
 * scratch with tw_alloc; TW_ERR_NOMEM when it cannot. */
tw_status tw_resnet_forward_ref(const tw_resnet *net, const float *x, int n, int tile, float *probs,
                                float *emb, tw_error *err);

#endif
