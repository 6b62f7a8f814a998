/* cpu_backend.c - the CPU backend: the folded ResNet on oneDNN (v2.x C API).
 *
 * Plan, then build. plan_build() turns the net into a list of oneDNN
 * primitive descriptors (convolutions with bias and fused sum/relu post-ops,
 * max pooling, global average pooling, a reorder of the input when the stem
 * wants another layout and one of the pooled features back to plain [n][C]).
 * oneDNN chooses the activation and weight layouts (format_tag any), except
 * in fp32 on AVX-512 CPUs: there the 3x3 stride-1 convs run as Winograd
 * F(4,3), which reads and writes only nChw16c, so every conv writes that
 * layout (oneDNN's direct kernels are as fast on it; see use_winograd); each
 * layer's source is the previous layer's chosen destination, so no reorders
 * appear between layers. Where oneDNN has no Winograd kernel (AVX2), fp32
 * keeps activations in nhwc and runs those convs as model/winograd.c's
 * F(4,3) transforms around one oneDNN batched matmul (LOWER_WINO); with the
 * GEMM lowerings below, each such lowering is kept only when its matrix
 * product gives a tile the same bits wherever it sits in the batch
 * (rows_independent: shards and resumed runs must write one run's bytes).
 * The same plan
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
 * Batches smaller than max_batch run on the full max_batch primitives (at
 * least CPU_MIN_PLAN_BATCH tiles: see plan_batch): the
 * first n input tiles are copied into the backend's own input buffer and the
 * rest of it keeps older (finite) data whose results are ignored. Only the
 * last batch of a run is short, so the wasted work is at most one batch, and
 * one set of primitives keeps reserve() and the memory estimate simple.
 * A full batch is read in place from the caller's buffer (no copy).
 *
 * The classifier (fc) and softmax are a few thousand multiply-adds per tile
 * and run in plain C, in double, after the pooled features come back.
 *
 * Precision (runtime.precision): fp32 (tf32 means fp32 on a CPU);
 *  - bf16: activations and weights in bf16, accumulation and bias in fp32.
 *    oneDNN 2.6 has bf16 convolutions only on AVX-512 CPUs (fastest with
 *    AVX512-BF16); elsewhere the plan cannot be built and the run goes on in
 *    fp32 with one notice.
 *  - int8: symmetric quantization, per-output-channel weight scales
 *    (127 / max|w|; 63 on CPUs without VNNI, whose 16-bit sums would
 *    saturate: int8_weight_levels), one scale per activation tensor: u8 after a ReLU, s8
 *    for the projection shortcuts. The stem stays in fp32 on the unquantized
 *    input, and its pooled map is quantized to u8 (on the demo rasters that
 *    divided int8's mean |p - p_fp32| by 2-3 on ResNet-18, for 1.3 % of int8
 *    ResNet-50's speed at 64 px). The activation ranges are
 *    measured by calibrate(): the pipeline hands it, before each raster, a
 *    batch of tiles spread over the whole raster (pipeline/run.c), which
 *    runs once in fp32 with every convolution's output recorded; each range
 *    is the clip with the least squared error (model/calib.h), and the int8
 *    plan replaces the fp32 one. Ranges thus depend on the raster, not on
 *    the shard or on what a resumed run has left. Without that call (no
 *    usable tile in the sample) the first batch of infer calibrates.
 *    Residual adds stay in int8 (a sum post-op rescaled from the shortcut's
 *    scale); the last activation is brought back to fp32 before the global
 *    average.
 *  - fp16 runs in fp32 with one notice (no fp16 convolutions in oneDNN 2.6).
 * workspace_bytes() for int8 is the fp32 plan's (calibration runs on it and
 * frees it before the smaller int8 plan is built).
 *
 * The family (model/resnet.h): ResNeXt's grouped 3x3 convs are oneDNN's
 * grouped convolutions (5-d goihw weights) in every mode, never lowered;
 * where oneDNN's kernels would run its reference loops on the plan's layout
 * (nChw16c with 4 or 8 channels per group) the conv takes the layouts
 * oneDNN picks, between two reorders (plan_conv). A small stem has no max
 * pool: its conv's output is the first block's input (first_block_input).
 *
 * One backend serves one thread at a time (the pipeline's infer stage).
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dnnl.h>
#include <dnnl_debug.h>

#include "model/backend.h"
#include "model/calib.h"
#include "model/maxpool.h"
#include "model/winograd.h"
#include "core/alloc.h"
#include "core/clock.h"

enum { N_ACT = 4 };
/* storage ids: 0..N_ACT-1 are the activation buffers */
/* BUF_WINO_V / _M: the Winograd domain's input and output (LOWER_WINO);
 * BUF_SUB: a strided LOWER_ROWS conv's source, every stride-th pixel;
 * BUF_GRP_IN / _OUT: a grouped conv's source and result in the layouts its
 * kernel wants, when they are not the plan's (see plan_conv) */
enum {
    BUF_IN_USER = N_ACT,
    BUF_IN_BLK,
    BUF_DEQ,
    BUF_FEAT,
    BUF_WINO_V,
    BUF_WINO_M,
    BUF_SUB,
    BUF_GRP_IN,
    BUF_GRP_OUT,
    BUF_COUNT
};

/* L_MAXPOOL_NHWC: model/maxpool.c's pooling from the stem's blocked layout
 * into nhwc, in place of oneDNN's pooling and a reorder (no pd) */
typedef enum { L_CONV, L_POOL, L_REORDER, L_MAXPOOL_NHWC } layer_kind;

/* How a plan computes: the numeric type of activations and weights. */
typedef enum { NUM_F32, NUM_BF16, NUM_INT8, NUM_MODES } num_mode;

/* How a convolution runs (fp32 only; see "GEMM lowerings" below). */
typedef enum {
    LOWER_NONE,  /* a oneDNN convolution */
    LOWER_DENSE, /* one inner product per tile: the whole map times its Toeplitz matrix */
    LOWER_ROWS,  /* 1x1, nhwc: one inner product, the batch's pixels as rows (stride 2:
                    of the pixels a reorder picked out first) */
    LOWER_WINO   /* 3x3 stride 1, nhwc: Winograd F(4,3), model/winograd.c's transforms
                    around one batched matmul (CPUs where oneDNN has no Winograd) */
} lowering;

typedef struct layer {
    layer_kind kind;
    dnnl_primitive_desc_t pd;
    int src, dst;        /* storage ids */
    const tw_conv *conv; /* L_CONV: the folded weights to reorder */
    /* NUM_INT8 convs: the source's scale (q = x * scale) and, per output
     * channel, the weights' scales (owned by the plan until build takes it) */
    float src_scale;
    float *w_scale;
    bool relu; /* convs: ends in a ReLU (its int8 output is u8) */
    bool sum;  /* convs: adds the old destination (the residual) */
    lowering lower;
    size_t rows; /* lowerings: the GEMM's rows, padding included (lowering_rows, next_rows) */
    dnnl_memory_desc_t in4, out4; /* LOWER_DENSE: the 4-d layouts the matrix maps between */
} layer;

/* rows_independent's answers by GEMM shape: a run plans the same shapes for
 * the budget's estimates and again for reserve, which must agree. */
enum { MEMO_MAX = 64 };
typedef struct gemm_shape {
    int lw;
    bool sum;
    dnnl_dim_t mats, rows, k, cols;
    bool ok;
} gemm_shape;
typedef struct gemm_memo {
    int n;
    gemm_shape e[MEMO_MAX];
} gemm_memo;

typedef struct plan {
    layer *layers;
    int n_layers, cap;
    int batch, tile, feat_dim;
    num_mode mode;
    /* NUM_F32 on a CPU with oneDNN's Winograd kernel: 3x3 stride-1 convs
     * run as Winograd F(4,3), every activation in the 16-channel blocked
     * layout that kernel reads (see use_winograd) */
    bool wino;
    /* NUM_F32: activations in nhwc (cpu_nhwc; AVX2-class CPUs by default) */
    bool nhwc;
    /* NUM_F32, nhwc, no oneDNN Winograd: 3x3 stride-1 convs on maps of at
     * least 4x4 run as LOWER_WINO (this tree's F(4,3)) */
    bool wino_own;
    int gemm;   /* the cpu_gemm knob: -1 measured rule, 0 never, 1 wherever it applies */
    int n_gemm; /* convolutions lowered to an inner product */
    int n_wino; /* convolutions lowered to LOWER_WINO */
    /* each lowering's GEMM is run on a probe first and kept only when a
     * tile's results do not depend on its place in the batch
     * (rows_independent, remembered in memo); n_refused counts those that did */
    gemm_memo *memo;
    int n_refused;
    /* NUM_INT8: the quantization range of each conv's output in plan order
     * ([1 + i]; [0], the input's, is unused: the stem runs in fp32); NULL:
     * every range is 1 (sizing only) */
    const float *amax;
    int w_levels; /* NUM_INT8: the weights' steps per side (int8_weight_levels) */
    int n_conv;
    size_t buf_bytes[BUF_COUNT]; /* bytes of each storage: the most it ever holds */
    size_t scratch_bytes;        /* largest scratchpad of any primitive */
    size_t weight_bytes;         /* reordered conv weights and biases */
    dnnl_memory_desc_t in_md;    /* the caller's NCHW float input */
} plan;

/* An op is a oneDNN primitive, one of LOWER_WINO's two transforms, or the
 * max pooling of L_MAXPOOL_NHWC. */
typedef enum { OP_PRIM, OP_WINO_IN, OP_WINO_OUT, OP_MAXPOOL } op_kind;

typedef struct op {
    op_kind kind;
    dnnl_primitive_t prim; /* OP_PRIM */
    /* OP_WINO_*: nhwc activations [n][h][h][ch] <-> the Winograd domain */
    const float *from;
    float *to;
    const float *bias; /* OP_WINO_OUT */
    int n, h, ch;
    size_t stride; /* rows of each Winograd plane (layer.rows) */
    int blk;       /* OP_MAXPOOL: the source's channel block (pool_blocked) */
    bool sum, relu;
    int nargs;
    dnnl_exec_arg_t args[6];
    bool conv;
    int levels;        /* conv: int8 steps of its output (255 after a ReLU, else 127) */
    void *dst;         /* the output storage, and its f32 element count */
    size_t dst_floats; /* (calibration reads the fp32 plan's outputs) */
} op;

/* Whether a mode's plan could be built for (net, tile), and why not. */
typedef struct probe {
    const tw_resnet *net;
    int tile;
    bool ok;
    tw_error why;
} probe;

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
    void **allocs; /* every tw_alloc'ed buffer, for destroy */
    int n_allocs, cap_allocs;
    void *buf[BUF_COUNT];
    void *scratch;
    dnnl_memory_t in_mem; /* the memory the first layer reads; its handle moves */
    float *fc_w, *fc_b;
    num_mode mode;           /* what the built plan computes in */
    bool int8;               /* int8 asked (and available) */
    bool calibrate;          /* int8, not calibrated yet: the fp32 plan is built */
    const tw_resnet *net;    /* kept for the int8 rebuild (the caller owns it) */
    probe probes[NUM_MODES]; /* can oneDNN run bf16 / int8 here (mode_supported) */
    bool wino;               /* fp32 plans use Winograd (use_winograd, asked once) */
    bool wino_own;           /* ... or, without it, LOWER_WINO (the cpu_winograd knob) */
    bool nhwc;               /* fp32 plans keep activations in nhwc (the cpu_nhwc knob) */
    int gemm;                /* the cpu_gemm knob */
    int int8_levels;         /* int8 weights' steps per side (int8_weight_levels) */
    int n_conv;
    int n_refused;  /* lowerings refused at reserve (plan.n_refused) */
    gemm_memo memo; /* rows_independent's answers, for every plan of this backend */
    tw_backend_stats stats;
} cpu_ctx;

static tw_status dnnl_fail(tw_error *err, dnnl_status_t s, const char *what)
{
    tw_status st = s == dnnl_out_of_memory ? TW_ERR_NOMEM : TW_ERR_INTERNAL;
    return tw_error_set(err, st, "oneDNN: %s failed: %s", what, dnnl_status2str(s));
}

#define DNNL_TRY(call, what)                                                                       \
    do {                                                                                           \
        dnnl_status_t s_ = (call);                                                                 \
        if (s_ != dnnl_success) return dnnl_fail(err, s_, what);                                   \
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
    for (int i = 0; i < p->n_layers; i++) {
        if (p->layers[i].pd) dnnl_primitive_desc_destroy(p->layers[i].pd);
        tw_free(p->layers[i].w_scale);
    }
    tw_free(p->layers);
    memset(p, 0, sizeof *p);
}

static tw_status plan_push(plan *p, layer_kind kind, dnnl_primitive_desc_t pd, int src, int dst,
                           const tw_conv *conv, tw_error *err)
{
    if (!pd && kind != L_MAXPOOL_NHWC)
        return tw_error_set(err, TW_ERR_INTERNAL, "oneDNN: no primitive descriptor");
    if (p->n_layers == p->cap) {
        int cap = p->cap ? 2 * p->cap : 64;
        layer *l = tw_alloc(TW_MEM_OTHER, (size_t)cap * sizeof *l);
        if (!l) {
            if (pd) dnnl_primitive_desc_destroy(pd);
            return tw_error_set(err, TW_ERR_NOMEM, "out of memory planning the CPU backend");
        }
        if (p->n_layers) memcpy(l, p->layers, (size_t)p->n_layers * sizeof *l);
        tw_free(p->layers);
        p->layers = l;
        p->cap = cap;
    }
    p->layers[p->n_layers++] =
        (layer){.kind = kind, .pd = pd, .src = src, .dst = dst, .conv = conv, .src_scale = 1.0f};
    const dnnl_memory_desc_t *sp =
        pd ? dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0) : NULL;
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
    float scale; /* NUM_INT8: q = x * scale */
} act;

/* What a primitive's attributes say beyond the user scratchpad. */
typedef struct attr_spec {
    bool sum, relu;
    float sum_scale;         /* residual: old dst * sum_scale is added */
    dnnl_data_type_t sum_dt; /* the old dst's type (undef: the dst's) */
    int n_oscale, oscale_mask;
    const float *oscale; /* output scales (int8 convs, quantizing reorders) */
    bool own_scratch;    /* oneDNN allocates the scratchpad (one-off reorders) */
} attr_spec;

static tw_status make_attr(const attr_spec *a, dnnl_primitive_attr_t *attr, tw_error *err)
{
    DNNL_TRY(dnnl_primitive_attr_create(attr), "attr create");
    dnnl_status_t s = dnnl_primitive_attr_set_scratchpad_mode(
        *attr, a->own_scratch ? dnnl_scratchpad_mode_library : dnnl_scratchpad_mode_user);
    if (s == dnnl_success && a->n_oscale)
        s = dnnl_primitive_attr_set_output_scales(*attr, a->n_oscale, a->oscale_mask, a->oscale);
    if (s == dnnl_success && (a->sum || a->relu)) {
        dnnl_post_ops_t po;
        s = dnnl_post_ops_create(&po);
        if (s == dnnl_success) {
            if (a->sum) s = dnnl_post_ops_append_sum_v2(po, a->sum_scale, a->sum_dt);
            if (s == dnnl_success && a->relu)
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

/* The type of an activation in mode m (nonneg: it follows a ReLU). */
static dnnl_data_type_t act_dt(num_mode m, bool nonneg)
{
    if (m == NUM_BF16) return dnnl_bf16;
    if (m == NUM_INT8) return nonneg ? dnnl_u8 : dnnl_s8;
    return dnnl_f32;
}

/* Scale that maps [-amax, amax] (or [0, amax]) onto s8 (u8) for range idx. */
static float q_scale(const plan *p, int idx, bool nonneg)
{
    float m = p->amax ? p->amax[idx] : 1.0f;
    if (!(m > 1e-6f)) m = 1e-6f; /* a dead tensor: any scale is exact for zeros */
    return (nonneg ? 255.0f : 127.0f) / m;
}

/* The steps per side of int8 weights on isa: 127 where oneDNN's int8 kernels
 * multiply with VNNI (vpdpbusd: u8 x s8 summed straight into 32 bits),
 * else 63. Without VNNI (AVX2 and AVX-512 before Cascade Lake) they use
 * vpmaddubsw, which adds two u8 x s8 products into a 16-bit lane that
 * saturates at 32767: 255 x 127 x 2 = 64770 does, 255 x 63 x 2 = 32130 does
 * not (oneDNN's guide, "Nuances of int8 computations"). Measured on the demo
 * ResNet-50 (e2e_precision's 361 tiles): with 127, ONEDNN_MAX_CPU_ISA
 * AVX512_CORE against AVX512_CORE_VNNI, both on the same fp32 calibration,
 * moved 25 tiles by up to 0.07; with 63 the two gave the same bytes. */
static int int8_weight_levels(dnnl_cpu_isa_t isa)
{
    bool vnni = (isa & dnnl_cpu_isa_avx512_core_vnni) == dnnl_cpu_isa_avx512_core_vnni ||
                (isa & dnnl_cpu_isa_avx2_vnni) == dnnl_cpu_isa_avx2_vnni;
    return vnni ? 127 : 63;
}

/* Per-output-channel weight scales levels / max|w| of conv c. */
static float *weight_scales(const tw_conv *c, int levels)
{
    float *s = tw_alloc(TW_MEM_OTHER, (size_t)c->cout * sizeof *s);
    if (!s) return NULL;
    size_t per = (size_t)(c->cin / c->groups) * c->k * c->k;
    for (int o = 0; o < c->cout; o++) {
        float m = 0.0f;
        for (size_t i = 0; i < per; i++) m = fmaxf(m, fabsf(c->w[(size_t)o * per + i]));
        s[o] = m > 0.0f ? (float)levels / m : 1.0f;
    }
    return s;
}

/* ------------------------------------------------------ GEMM lowerings
 *
 * oneDNN's direct kernels block over the output width: on the last stage's
 * 2x2 maps (64-px tiles) they run at a third to a half of the machine's
 * SGEMM rate (bench/RESULTS.md, "CPU on AVX2 (issue 20)"). Two layers there
 * are GEMMs in another form, run as one oneDNN inner product:
 *  - LOWER_DENSE: a tile's whole input map times the conv's Toeplitz matrix
 *    ([Hout Wout Cout] x [H W Cin], built at reserve in the activations' own
 *    layouts, so no reorder appears), the tiles of the batch as rows; for a
 *    3x3 stride-1 conv on a 2x2 map it needs 16 / 36 of the direct
 *    multiply-adds (the padding taps vanish);
 *  - LOWER_ROWS: a 1x1 conv on nhwc activations, the batch's pixels as
 *    rows: [N H W] x [Cin] times [Cin] x [Cout]; for a stride-2 one (the
 *    last stage's projection) a oneDNN reorder first copies every other
 *    pixel of every other row into BUF_SUB (the source's bytes / 4).
 * The rule (cpu_gemm -1) is fixed, from the measurements: dense for 3x3
 * stride-1 convs on maps of at most 2x2, rows for 1x1 convs there (the
 * stride-2 projection from 4x4 to 2x2 ran at 44 % of the SGEMM peak direct,
 * 2x faster as its reorder and rows; bench/RESULTS.md).
 * A choice timed at reserve would vary with the machine's load from run to
 * run, and with it the last bits of the outputs (shards and resumed runs
 * must agree byte for byte). */

/* Whether md is a 4-d fp32 activation in plain nhwc order. */
static bool is_nhwc(const dnnl_memory_desc_t *md)
{
    const dnnl_blocking_desc_t *bd = &md->format_desc.blocking;
    return md->ndims == 4 && md->format_kind == dnnl_blocked && md->offset0 == 0 &&
           bd->inner_nblks == 0 && bd->strides[1] == 1 && bd->strides[3] == md->padded_dims[1] &&
           bd->strides[2] == md->dims[3] * bd->strides[3] &&
           bd->strides[0] == md->dims[2] * bd->strides[2];
}

/* Elements of one tile in activation layout md (the batch dimension outermost
 * and dense), or -1 for a layout the lowerings do not handle (two blocks on
 * one dimension, a blocked batch). */
static dnnl_dim_t tile_elems(const dnnl_memory_desc_t *md)
{
    const dnnl_blocking_desc_t *bd = &md->format_desc.blocking;
    if (md->ndims != 4 || md->format_kind != dnnl_blocked || md->offset0 != 0) return -1;
    int seen = 0;
    for (int i = 0; i < bd->inner_nblks; i++) {
        if (bd->inner_idxs[i] == 0 || (seen & (1 << bd->inner_idxs[i]))) return -1;
        seen |= 1 << bd->inner_idxs[i];
    }
    size_t esz = md->data_type == dnnl_f32 ? 4 : 0;
    if (!esz || dnnl_memory_desc_get_size(md) != (size_t)md->dims[0] * bd->strides[0] * esz)
        return -1;
    return bd->strides[0];
}

/* Offset of element (0, c, h, w) in layout md (tile_elems(md) > 0). */
static dnnl_dim_t act_offset(const dnnl_memory_desc_t *md, dnnl_dim_t c, dnnl_dim_t h, dnnl_dim_t w)
{
    const dnnl_blocking_desc_t *bd = &md->format_desc.blocking;
    dnnl_dim_t idx[4] = {0, c, h, w}, blk[4] = {1, 1, 1, 1}, off = 0, inner = 0;
    for (int i = 0; i < bd->inner_nblks; i++) blk[bd->inner_idxs[i]] *= bd->inner_blks[i];
    for (int d = 0; d < 4; d++) off += idx[d] / blk[d] * bd->strides[d];
    for (int i = 0; i < bd->inner_nblks; i++)
        inner = inner * bd->inner_blks[i] + idx[bd->inner_idxs[i]] % blk[bd->inner_idxs[i]];
    return off + inner;
}

/* The rows of lowering lw's GEMM before padding: a row per tile (dense),
 * per pixel (rows) or per 4x4 output tile (Winograd). */
static size_t lowering_rows(const plan *p, lowering lw, int h)
{
    return lw == LOWER_WINO   ? tw_wino_rows(p->batch, h)
           : lw == LOWER_ROWS ? (size_t)p->batch * h * h
                              : (size_t)p->batch;
}

/* The next row count to try after r: oneDNN 2.6's AVX2 GEMM computes the
 * last rows of some products (8, 32 or 56 rows with 2 threads) with another
 * kernel, whose sums differ in the last bit (see rows_independent), while
 * the multiples of 8 around them compute every row alike (measured at 16,
 * 24, 40, 48, 64-128 rows on six shapes). Padding rows are computed and
 * ignored: a GEMM row depends on its own source row only. */
static size_t next_rows(size_t r)
{
    return (r / 8 + 1) * 8;
}

/* The fewest rows a lowering's GEMM is planned with: a one-row product
 * (a dense layer at batch 1) is a matrix-vector product in oneDNN, whose
 * bits differ from the GEMM's, and rows_independent cannot probe it; the
 * batches of 1 and 2 then ran those convs unlowered, in other bits than
 * every larger batch. Padding rows are computed and ignored. */
enum { GEMM_MIN_ROWS = 8 };

/* Whether LOWER_WINO takes a 3x3 conv on oh x oh maps: from 4x4, except
 * the 5x5 to 7x7 maps its 4x4 output tiles fit badly (224 px tiles' last
 * stage: 1.1x the direct kernels' speed for 80 MB more of U, 36 Cin Cout
 * floats, at ResNet-50's widths). Never by batch size: a lowering chosen
 * by batch gave a tile other bits in a batch of 16 than in one of 32, and
 * the CLI's auto batch and the Python API's differed once their processes'
 * sizes did (CI saw it; tiling.batch changes no output byte). */
static bool wino_map(int oh)
{
    return oh % TW_WINO_OUT == 0 || oh >= 2 * TW_WINO_OUT;
}

/* The lowering of conv c (input `in`, output layout out4, oh x oh) in plan p. */
static lowering choose_lowering(const plan *p, const tw_conv *c, const act *in,
                                const dnnl_memory_desc_t *out4, int oh)
{
    /* grouped convs (ResNeXt) run as oneDNN's grouped convolutions only */
    if (p->mode != NUM_F32 || c->groups > 1) return LOWER_NONE;
    /* Winograd wherever it has a whole 4x4 output tile to fill: on AVX2,
     * 1.9-2.6x faster than oneDNN's direct kernels from 4x4 to 56x56 maps,
     * 1.1x on 7x7 (bench/RESULTS.md, issue 20); on 2x2 maps the dense
     * GEMM below does fewer multiply-adds */
    if (p->wino_own && c->k == 3 && c->stride == 1 && c->pad == 1 && wino_map(oh) && in->h == oh &&
        is_nhwc(&in->md) && is_nhwc(out4))
        return LOWER_WINO;
    if (p->gemm == 0) return LOWER_NONE;
    /* (a stride picks the pixels first, plan_conv: on maps it divides,
     * whose views of every other pixel oneDNN takes) */
    if (c->k == 1 && c->pad == 0 && (c->stride == 1 || in->h == c->stride * oh) &&
        is_nhwc(&in->md) && is_nhwc(out4) && (p->gemm == 1 || oh <= 2))
        return LOWER_ROWS;
    dnnl_dim_t ks = tile_elems(&in->md), kd = tile_elems(out4);
    if (ks < 0 || kd < 0) return LOWER_NONE;
    double elems = (double)ks * (double)kd; /* the Toeplitz matrix */
    if (p->gemm == 1) return elems <= (double)(1 << 22) ? LOWER_DENSE : LOWER_NONE;
    return c->k == 3 && c->stride == 1 && oh <= 2 && elems <= (double)(1 << 24) ? LOWER_DENSE
                                                                                : LOWER_NONE;
}

/* The matmul of lowering lw for conv c with `rows` rows (padding
 * included), writing layout out4 with the conv's attributes;
 * dnnl_unimplemented when oneDNN has none. */
static dnnl_status_t lowered_pd(dnnl_engine_t eng, const tw_conv *c, lowering lw, const act *in,
                                const dnnl_memory_desc_t *out4, const_dnnl_primitive_attr_t attr,
                                dnnl_dim_t rows, dnnl_primitive_desc_t *pd)
{
    if (lw == LOWER_WINO) {
        /* [36][rows][Cin] . [36][Cin][Cout], weights in the layout oneDNN
         * picks; bias, residual and ReLU are the output transform's */
        dnnl_memory_desc_t a, w, d;
        dnnl_dims_t ad = {TW_WINO_POINTS, rows, c->cin}, wd = {TW_WINO_POINTS, c->cin, c->cout},
                    dd = {TW_WINO_POINTS, rows, c->cout};
        dnnl_primitive_attr_t plain;
        dnnl_status_t s = dnnl_primitive_attr_create(&plain);
        if (s != dnnl_success) return s;
        s = dnnl_primitive_attr_set_scratchpad_mode(plain, dnnl_scratchpad_mode_user);
        if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&a, 3, ad, dnnl_f32, dnnl_abc);
        if (s == dnnl_success)
            s = dnnl_memory_desc_init_by_tag(&w, 3, wd, dnnl_f32, dnnl_format_tag_any);
        if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&d, 3, dd, dnnl_f32, dnnl_abc);
        dnnl_matmul_desc_t md;
        if (s == dnnl_success) s = dnnl_matmul_desc_init(&md, &a, &w, NULL, &d);
        if (s == dnnl_success) s = dnnl_primitive_desc_create(pd, &md, plain, eng, NULL);
        dnnl_primitive_attr_destroy(plain);
        return s;
    }
    dnnl_dim_t ks = tile_elems(&in->md), kd = tile_elems(out4);
    if (lw == LOWER_ROWS) {
        ks = c->cin;
        kd = c->cout;
    }
    /* a matmul [rows][ks] . [ks][kd] + bias[1][kd] (weights made from the
     * plain [kd][ks] matrix: the ba layout of [ks][kd]) */
    dnnl_memory_desc_t src, w, b, dst;
    dnnl_dims_t sd = {rows, ks}, wd = {ks, kd}, bd = {1, kd}, dd = {rows, kd};
    dnnl_status_t s = dnnl_memory_desc_init_by_tag(&src, 2, sd, dnnl_f32, dnnl_ab);
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_tag(&w, 2, wd, dnnl_f32, dnnl_format_tag_any);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&b, 2, bd, dnnl_f32, dnnl_ab);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&dst, 2, dd, dnnl_f32, dnnl_ab);
    dnnl_matmul_desc_t d;
    if (s == dnnl_success) s = dnnl_matmul_desc_init(&d, &src, &w, &b, &dst);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(pd, &d, attr, eng, NULL);
    return s;
}

/* Whether the GEMM of lowering primitive pd ([batch][rows][k] . weights ->
 * [batch][rows][n], or the same without the batch dimension) gives each row
 * the same bits wherever it sits among the rows. A tile's place in a batch
 * differs between one run, its shards and a resumed run, which must all
 * write the same bytes; oneDNN's AVX2 GEMM (gemm:jit) computes some rows
 * with a kernel that orders the sums differently (e.g. the last 2 of 8 or
 * of 32 rows: seen with [36][8][256] . [36][256][256]). Checked once at
 * reserve on a probe: every row is moved down by one, which brings rows
 * across any boundary between such kernels, and the outputs are compared
 * bit for bit. False also when the probe cannot run (no memory). */
static bool rows_independent(dnnl_engine_t eng, const_dnnl_primitive_desc_t pd)
{
    /* src, weights, dst (both passes), scratchpad, bias (the inner
     * products have one; the matmul a zero-sized md) */
    const dnnl_query_t q[6] = {dnnl_query_src_md, dnnl_query_weights_md,    dnnl_query_dst_md,
                               dnnl_query_dst_md, dnnl_query_scratchpad_md, dnnl_query_weights_md};
    const int qi[6] = {0, 0, 0, 0, 0, 1};
    const int argk[6] = {DNNL_ARG_SRC,        DNNL_ARG_WEIGHTS, DNNL_ARG_DST, 0,
                         DNNL_ARG_SCRATCHPAD, DNNL_ARG_BIAS};
    const dnnl_memory_desc_t *md[6];
    size_t bytes[6];
    for (int i = 0; i < 6; i++) {
        md[i] = dnnl_primitive_desc_query_md(pd, q[i], qi[i]);
        bytes[i] = md[i] ? dnnl_memory_desc_get_size(md[i]) : 0;
    }
    if (!bytes[0] || !bytes[1] || !bytes[2] || md[0]->ndims < 2) return false;
    int nd = md[0]->ndims;
    size_t rows = (size_t)md[0]->dims[nd - 2], k = (size_t)md[0]->dims[nd - 1];
    size_t n = (size_t)md[2]->dims[nd - 1], mats = 1;
    for (int i = 0; i < nd - 2; i++) mats *= (size_t)md[0]->dims[i];
    float *buf[6] = {NULL}, *row = tw_alloc(TW_MEM_OTHER, k * sizeof(float));
    dnnl_memory_t mem[6] = {NULL};
    dnnl_primitive_t prim = NULL;
    dnnl_stream_t strm = NULL;
    bool same = false, ok = rows >= 2 && row;
    for (int i = 0; i < 6 && ok; i++) {
        if (!bytes[i]) continue;
        ok = (buf[i] = tw_alloc(TW_MEM_OTHER, bytes[i])) != NULL;
        /* dst zeroed (a residual lowering adds the old one), bias zero */
        if (ok) memset(buf[i], 0, bytes[i]);
        if (ok && i != 3) ok = dnnl_memory_create(&mem[i], md[i], eng, buf[i]) == dnnl_success;
    }
    if (ok) {
        uint32_t r = 12345;
        for (int i = 0; i < 2; i++)
            for (size_t j = 0; j < bytes[i] / sizeof(float); j++) {
                r = r * 1664525u + 1013904223u;
                buf[i][j] = (float)(r >> 8) * (1.0f / 16777216.0f) - 0.5f;
            }
        ok = dnnl_primitive_create(&prim, pd) == dnnl_success &&
             dnnl_stream_create(&strm, eng, dnnl_stream_default_flags) == dnnl_success;
    }
    dnnl_exec_arg_t args[6];
    int nargs = 0;
    for (int i = 0; i < 6 && ok; i++)
        if (mem[i]) args[nargs++] = (dnnl_exec_arg_t){argk[i], mem[i]};
    for (int pass = 0; pass < 2 && ok; pass++) {
        if (pass == 1) {
            /* rows down by one in each matrix: row i -> i + 1, the last -> 0 */
            for (size_t m = 0; m < mats; m++) {
                float *a = buf[0] + m * rows * k;
                memcpy(row, a + (rows - 1) * k, k * sizeof(float));
                memmove(a + k, a, (rows - 1) * k * sizeof(float));
                memcpy(a, row, k * sizeof(float));
            }
            ok = dnnl_memory_set_data_handle(mem[2], buf[3]) == dnnl_success;
        }
        ok = ok && dnnl_primitive_execute(prim, strm, nargs, args) == dnnl_success &&
             dnnl_stream_wait(strm) == dnnl_success;
    }
    if (ok) {
        same = true;
        for (size_t m = 0; m < mats && same; m++)
            for (size_t i = 0; i < rows && same; i++)
                same = memcmp(buf[2] + (m * rows + i) * n, buf[3] + (m * rows + (i + 1) % rows) * n,
                              n * sizeof(float)) == 0;
    }
    for (int i = 0; i < 6; i++) {
        if (mem[i]) dnnl_memory_destroy(mem[i]);
        tw_free(buf[i]);
    }
    if (prim) dnnl_primitive_destroy(prim);
    if (strm) dnnl_stream_destroy(strm);
    tw_free(row);
    return same;
}

/* rows_independent(pd), remembered by shape in memo (may be NULL). */
static bool gemm_kept(gemm_memo *memo, dnnl_engine_t eng, const_dnnl_primitive_desc_t pd, int lw,
                      bool sum)
{
    const dnnl_memory_desc_t *s = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
    const dnnl_memory_desc_t *d = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    if (!s || !d || s->ndims < 2) return false;
    int nd = s->ndims;
    dnnl_dim_t mats = nd == 3 ? s->dims[0] : 1, rows = s->dims[nd - 2], k = s->dims[nd - 1],
               cols = d->dims[nd - 1];
    for (int i = 0; memo && i < memo->n; i++)
        if (memo->e[i].lw == lw && memo->e[i].sum == sum && memo->e[i].mats == mats &&
            memo->e[i].rows == rows && memo->e[i].k == k && memo->e[i].cols == cols)
            return memo->e[i].ok;
    bool ok = rows_independent(eng, pd);
    if (memo && memo->n < MEMO_MAX)
        memo->e[memo->n++] = (gemm_shape){lw, sum, mats, rows, k, cols, ok};
    return ok;
}

/* The Toeplitz matrix [kd][ks] and bias [kd] of conv c between layouts in4
 * and out4 (LOWER_DENSE): row act_offset(out4, co, oy, ox) holds, at column
 * act_offset(in4, ci, iy, ix), the tap of w that joins them; rows and
 * columns of padded channels stay zero. */
static void dense_matrix(const tw_conv *c, const dnnl_memory_desc_t *in4,
                         const dnnl_memory_desc_t *out4, float *m, float *bias)
{
    dnnl_dim_t ks = tile_elems(in4), kd = tile_elems(out4);
    int ih = (int)in4->dims[2], oh = (int)out4->dims[2], k = c->k;
    memset(m, 0, (size_t)kd * ks * sizeof *m);
    memset(bias, 0, (size_t)kd * sizeof *bias);
    for (int co = 0; co < c->cout; co++)
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < oh; ox++) {
                dnnl_dim_t r = act_offset(out4, co, oy, ox);
                bias[r] = c->b[co];
                for (int ci = 0; ci < c->cin; ci++)
                    for (int ky = 0; ky < k; ky++) {
                        int iy = oy * c->stride - c->pad + ky;
                        if (iy < 0 || iy >= ih) continue;
                        for (int kx = 0; kx < k; kx++) {
                            int ix = ox * c->stride - c->pad + kx;
                            if (ix < 0 || ix >= ih) continue;
                            m[r * ks + act_offset(in4, ci, iy, ix)] =
                                c->w[(((size_t)co * c->cin + ci) * k + ky) * k + kx];
                        }
                    }
            }
}

static tw_status plan_reorder(plan *p, dnnl_engine_t eng, const dnnl_memory_desc_t *from, int src,
                              const dnnl_memory_desc_t *to, int dst, float scale, tw_error *err);

/* A 4-d activation descriptor of dims in the layout of `like` (nhwc,
 * nchw, or nChw4c/8c/16c), or nhwc for any other layout. */
static dnnl_status_t like_layout(const dnnl_memory_desc_t *like, const dnnl_dims_t dims,
                                 dnnl_data_type_t dt, dnnl_memory_desc_t *out)
{
    const dnnl_blocking_desc_t *bd = &like->format_desc.blocking;
    dnnl_format_tag_t tag = dnnl_nhwc;
    if (like->format_kind == dnnl_blocked && bd->inner_nblks == 1 && bd->inner_idxs[0] == 1)
        tag = bd->inner_blks[0] == 16  ? dnnl_aBcd16b
              : bd->inner_blks[0] == 8 ? dnnl_aBcd8b
              : bd->inner_blks[0] == 4 ? dnnl_aBcd4b
                                       : dnnl_nhwc;
    else if (like->format_kind == dnnl_blocked && bd->inner_nblks == 0 && bd->strides[3] == 1)
        tag = dnnl_nchw;
    return dnnl_memory_desc_init_by_tag(out, 4, dims, dt, tag);
}

/* Whether oneDNN picked its reference code (plain loops) for pd. */
static bool is_ref_impl(const_dnnl_primitive_desc_t pd)
{
    const char *impl = NULL;
    return dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
           impl && strncmp(impl, "ref", 3) == 0;
}

/* Add conv c reading `in`; dst: when `into` is given, write into it with a
 * sum post-op (residual), else into storage dst_buf with a layout oneDNN
 * picks. *out describes the result. `in_any`: let oneDNN choose the source
 * layout too (the stem; the caller reads the choice back from the pd). */
static tw_status plan_conv(plan *p, dnnl_engine_t eng, const tw_conv *c, const act *in, bool in_any,
                           const act *into, int dst_buf, bool relu, act *out, tw_error *err)
{
    int n = p->batch;
    int ci = ++p->n_conv; /* this conv's output range in p->amax */
    /* int8 plans keep the stem (in_any) in fp32: its input is the normalized
     * raster, which 127 steps quantize coarsely (alone, that changed the class
     * of 3 of e2e_precision's 361 ResNet-50 tiles, half of int8's error); the
     * pooled map is quantized after the max pooling (plan_op) */
    num_mode mode = in_any && p->mode == NUM_INT8 ? NUM_F32 : p->mode;
    dnnl_data_type_t wdt = mode == NUM_INT8 ? dnnl_s8 : act_dt(mode, false);
    /* a residual conv always ends in a ReLU: its int8 output is u8 */
    dnnl_data_type_t ddt = act_dt(mode, relu);
    int oh = tw_resnet_out_size(in->h, c->k, c->stride, c->pad);
    if (oh < 1)
        return tw_error_set(err, TW_ERR_INPUT,
                            "tile %d is too small: a %dx%d convolution gets a %dx%d input", p->tile,
                            c->k, c->k, in->h, in->h);
    dnnl_memory_desc_t src_md, w_md, b_md, dst_md;
    /* grouped (ResNeXt's conv2): weights [groups][cout/g][cin/g][k][k] */
    int g = c->groups;
    dnnl_dims_t sd = {n, c->cin, in->h, in->h}, wd = {c->cout, c->cin, c->k, c->k};
    dnnl_dims_t gwd = {g, c->cout / g, c->cin / g, c->k, c->k};
    dnnl_dims_t bd = {c->cout}, dd = {n, c->cout, oh, oh};
    if (in_any)
        DNNL_TRY(
            dnnl_memory_desc_init_by_tag(&src_md, 4, sd, act_dt(mode, false), dnnl_format_tag_any),
            "src md");
    else
        src_md = in->md;
    if (g > 1)
        DNNL_TRY(dnnl_memory_desc_init_by_tag(&w_md, 5, gwd, wdt, dnnl_format_tag_any), "w md");
    else
        DNNL_TRY(dnnl_memory_desc_init_by_tag(&w_md, 4, wd, wdt, dnnl_format_tag_any), "w md");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&b_md, 1, bd, dnnl_f32, dnnl_x), "bias md");
    if (into) {
        /* the shortcut's storage and layout, read as the output's type: the
         * sum post-op reads the old values as the shortcut's type (s8 and u8
         * have one size, so the reinterpretation is exact) */
        dst_md = into->md;
        dst_md.data_type = ddt;
    } else if (g > 1) {
        /* a grouped conv writes its input's layout (same channels); see below
         * for when its kernel wants others */
        DNNL_TRY(like_layout(&in->md, dd, ddt, &dst_md), "dst md");
    } else {
        /* Winograd reads and writes only nChw16c: keep every activation there */
        dnnl_format_tag_t tag = p->wino && c->cout % 16 == 0 ? dnnl_aBcd16b
                                : p->nhwc && !in_any         ? dnnl_nhwc
                                                             : dnnl_format_tag_any;
        DNNL_TRY(dnnl_memory_desc_init_by_tag(&dst_md, 4, dd, ddt, tag), "dst md");
    }
    /* a lowering writes a layout fixed here: the shortcut's, else nhwc, or
     * nChw16c / nChw8c like its input where the channels fill the blocks */
    dnnl_memory_desc_t out4 = dst_md;
    lowering lw = LOWER_NONE;
    if (!in_any && p->mode == NUM_F32 && (p->gemm != 0 || p->wino_own)) {
        if (!into && dst_md.format_kind == dnnl_format_kind_any) {
            const dnnl_blocking_desc_t *ib = &in->md.format_desc.blocking;
            int blk = ib->inner_nblks == 1 && ib->inner_idxs[0] == 1 ? (int)ib->inner_blks[0] : 0;
            dnnl_format_tag_t t = blk == 16 && c->cout % 16 == 0 ? dnnl_aBcd16b
                                  : blk == 8 && c->cout % 8 == 0 ? dnnl_aBcd8b
                                                                 : dnnl_nhwc;
            DNNL_TRY(dnnl_memory_desc_init_by_tag(&out4, 4, dd, ddt, t), "dst md");
        }
        lw = choose_lowering(p, c, in, &out4, oh);
    }
    /* right padding so that oneDNN's output size is PyTorch's floor formula */
    dnnl_dim_t pr = (dnnl_dim_t)(oh - 1) * c->stride + c->k - in->h - c->pad;
    dnnl_dims_t strides = {c->stride, c->stride}, pl = {c->pad, c->pad}, prr = {pr, pr};
    /* Winograd F(4,3) computes 4x4 output tiles: on maps under 4x4 most of
     * each tile is padding and direct is faster (bench/RESULTS.md) */
    bool wino = p->wino && c->k == 3 && c->stride == 1 && oh >= 4 && g == 1;
    dnnl_convolution_desc_t cd;
    DNNL_TRY(dnnl_convolution_forward_desc_init(&cd, dnnl_forward_inference,
                                                wino ? dnnl_convolution_winograd
                                                     : dnnl_convolution_direct,
                                                &src_md, &w_md, &b_md, &dst_md, strides, pl, prr),
             "convolution desc");
    tw_status st;
    float src_scale = in->scale, dst_scale = 1.0f, *oscale = NULL, *w_scale = NULL;
    attr_spec as = {
        .sum = into != NULL, .relu = relu, .sum_scale = 1.0f, .sum_dt = dnnl_data_type_undef};
    if (mode == NUM_INT8) {
        dst_scale = q_scale(p, ci, relu);
        w_scale = weight_scales(c, p->w_levels);
        oscale = tw_alloc(TW_MEM_OTHER, (size_t)c->cout * sizeof *oscale);
        if (!w_scale || !oscale) {
            tw_free(oscale);
            st = tw_error_set(err, TW_ERR_NOMEM, "out of memory planning the CPU backend");
            goto fail;
        }
        /* oneDNN 2.x: dst = oscale * (acc + bias), acc in src*w units */
        for (int o = 0; o < c->cout; o++) oscale[o] = dst_scale / (src_scale * w_scale[o]);
        as.n_oscale = c->cout;
        as.oscale_mask = 1 << 1;
        as.oscale = oscale;
        if (into) {
            as.sum_scale = dst_scale / into->scale;
            as.sum_dt = into->md.data_type;
        }
    }
    dnnl_primitive_attr_t attr;
    st = make_attr(&as, &attr, err);
    tw_free(oscale); /* the attributes hold a copy */
    if (st != TW_OK) goto fail;
    dnnl_primitive_desc_t pd;
    dnnl_status_t s = dnnl_unimplemented;
    size_t rows = 0;
    /* a strided 1x1 conv as rows reads the pixels it keeps, copied out by a
     * reorder (pushed below, once the lowering is kept) into BUF_SUB */
    act picked;
    dnnl_memory_desc_t every;
    if (lw == LOWER_ROWS && c->stride != 1) {
        dnnl_dims_t pdims = {n, c->cin, oh, oh};
        dnnl_dims_t pstr = {(dnnl_dim_t)in->h * in->h * c->cin, 1,
                            (dnnl_dim_t)c->stride * in->h * c->cin, (dnnl_dim_t)c->stride * c->cin};
        if (dnnl_memory_desc_init_by_strides(&every, 4, pdims, dnnl_f32, pstr) != dnnl_success ||
            dnnl_memory_desc_init_by_tag(&picked.md, 4, pdims, dnnl_f32, dnnl_nhwc) != dnnl_success)
            lw = LOWER_NONE; /* a view oneDNN declines: the convolution */
        picked.buf = BUF_SUB;
        picked.c = c->cin;
        picked.h = oh;
        picked.scale = in->scale;
    }
    const act *src = lw == LOWER_ROWS && c->stride != 1 ? &picked : in;
    if (lw != LOWER_NONE) {
        /* the GEMM's rows: the first count from the lowering's own up to
         * twice it (more would cost what the lowering saves) whose rows all
         * compute alike (gemm_kept) */
        size_t need = lowering_rows(p, lw, oh);
        size_t first = need < GEMM_MIN_ROWS ? GEMM_MIN_ROWS : need;
        bool refused = false;
        for (size_t r = first; r <= 2 * first; r = next_rows(r)) {
            s = lowered_pd(eng, c, lw, src, &out4, attr, (dnnl_dim_t)r, &pd);
            if (s != dnnl_success) break;
            if (gemm_kept(p->memo, eng, pd, lw, into != NULL)) {
                rows = r;
                break;
            }
            dnnl_primitive_desc_destroy(pd);
            s = dnnl_unimplemented;
            refused = true;
        }
        if (s != dnnl_success) {
            p->n_refused += refused;
            lw = LOWER_NONE; /* none here: the convolution */
        }
    }
    if (lw == LOWER_NONE) s = dnnl_primitive_desc_create(&pd, &cd, attr, eng, NULL);
    if (s == dnnl_unimplemented && wino && lw == LOWER_NONE) {
        /* a shape the Winograd kernel declines: the same conv, direct */
        cd.alg_kind = dnnl_convolution_direct;
        s = dnnl_primitive_desc_create(&pd, &cd, attr, eng, NULL);
    }
    /* Grouped: oneDNN 2.6's AVX-512 kernels take nChw16c only when each
     * group has a multiple of 16 channels; for ResNeXt's 4 or 8 it runs its
     * reference loops there (1000x slower, measured). Then the conv is
     * planned in the layouts oneDNN picks (format any), between reorders
     * from and back to the plan's layout (BUF_GRP_IN / _OUT). */
    bool grp_in = false, grp_out = false;
    const dnnl_memory_desc_t *gq = NULL;
    dnnl_memory_desc_t plan_dst = dst_md;
    if (s == dnnl_success && g > 1 && !into && is_ref_impl(pd)) {
        dnnl_primitive_desc_destroy(pd);
        dnnl_memory_desc_t any_src, any_dst;
        s = dnnl_memory_desc_init_by_tag(&any_src, 4, sd, in->md.data_type, dnnl_format_tag_any);
        if (s == dnnl_success)
            s = dnnl_memory_desc_init_by_tag(&any_dst, 4, dd, ddt, dnnl_format_tag_any);
        if (s == dnnl_success)
            s = dnnl_convolution_forward_desc_init(&cd, dnnl_forward_inference,
                                                   dnnl_convolution_direct, &any_src, &w_md, &b_md,
                                                   &any_dst, strides, pl, prr);
        if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &cd, attr, eng, NULL);
        if (s == dnnl_success && (gq = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0)))
            grp_in = !dnnl_memory_desc_equal(gq, &in->md);
        const dnnl_memory_desc_t *dq0 =
            s == dnnl_success ? dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0) : NULL;
        grp_out = dq0 && !dnnl_memory_desc_equal(dq0, &plan_dst);
    }
    dnnl_primitive_attr_destroy(attr);
    if (s != dnnl_success) {
        st = dnnl_fail(err, s, "convolution primitive desc");
        goto fail;
    }

    int dst = into ? into->buf : grp_out ? BUF_GRP_OUT : dst_buf;
    if (lw != LOWER_ROWS) src = in; /* the lowering was refused: the convolution reads in */
    act grp_src;
    if (grp_in) {
        grp_src = *in;
        grp_src.md = *gq;
        grp_src.buf = BUF_GRP_IN;
        st = plan_reorder(p, eng, &in->md, in->buf, gq, BUF_GRP_IN, 1.0f, err);
        if (st != TW_OK) {
            dnnl_primitive_desc_destroy(pd);
            goto fail;
        }
        src = &grp_src;
    }
    if (src == &picked) {
        st = plan_reorder(p, eng, &every, in->buf, &picked.md, BUF_SUB, 1.0f, err);
        if (st != TW_OK) {
            dnnl_primitive_desc_destroy(pd);
            goto fail;
        }
    }
    st = plan_push(p, L_CONV, pd, src->buf, dst, c, err);
    if (st != TW_OK) goto fail;
    p->layers[p->n_layers - 1].src_scale = src_scale;
    p->layers[p->n_layers - 1].relu = relu;
    p->layers[p->n_layers - 1].sum = into != NULL;
    p->layers[p->n_layers - 1].w_scale = w_scale;
    p->layers[p->n_layers - 1].lower = lw;
    p->layers[p->n_layers - 1].rows = rows;
    p->layers[p->n_layers - 1].in4 = src->md;
    p->layers[p->n_layers - 1].out4 = out4;
    const dnnl_memory_desc_t *wq, *bq, *dq = NULL;
    if (lw == LOWER_WINO) {
        /* U, the bias (kept by the output transform), the two Winograd
         * domain buffers; U is made in activation buffer 0 (unused until
         * the first batch), then reordered, as the dense matrix below */
        if ((st = query_md(pd, dnnl_query_weights_md, 0, &wq, err)) != TW_OK) return st;
        size_t ub = dnnl_memory_desc_get_size(wq);
        p->weight_bytes += alloc_size(ub) + alloc_size((size_t)c->cout * sizeof(float));
        size_t vb = TW_WINO_POINTS * rows * (size_t)c->cin * sizeof(float);
        size_t mb = TW_WINO_POINTS * rows * (size_t)c->cout * sizeof(float);
        size_t plain = TW_WINO_POINTS * (size_t)c->cin * c->cout * sizeof(float);
        if (vb > p->buf_bytes[BUF_WINO_V]) p->buf_bytes[BUF_WINO_V] = vb;
        if (mb > p->buf_bytes[BUF_WINO_M]) p->buf_bytes[BUF_WINO_M] = mb;
        if (plain > p->buf_bytes[0]) p->buf_bytes[0] = plain;
        p->n_wino++;
    } else {
        if ((st = query_md(pd, dnnl_query_weights_md, 0, &wq, err)) != TW_OK ||
            (st = query_md(pd, dnnl_query_weights_md, 1, &bq, err)) != TW_OK ||
            (st = query_md(pd, dnnl_query_dst_md, 0, &dq, err)) != TW_OK)
            return st;
        p->weight_bytes += alloc_size(dnnl_memory_desc_get_size(wq));
        p->weight_bytes += alloc_size(dnnl_memory_desc_get_size(bq));
        if (lw != LOWER_NONE) {
            /* the padding rows live past the batch in the source's and the
             * destination's storage */
            size_t ks = lw == LOWER_ROWS ? (size_t)c->cin : (size_t)tile_elems(&in->md);
            size_t kd = lw == LOWER_ROWS ? (size_t)c->cout : (size_t)tile_elems(&out4);
            size_t sb = rows * ks * sizeof(float), db = rows * kd * sizeof(float);
            if (sb > p->buf_bytes[src->buf]) p->buf_bytes[src->buf] = sb;
            if (db > p->buf_bytes[dst]) p->buf_bytes[dst] = db;
        }
        if (lw == LOWER_DENSE) {
            /* reserve builds the Toeplitz matrix in plain [kd][ks] order in
             * activation buffer 0 (unused until the first batch), then
             * reorders it into the layout the matmul chose */
            size_t mb = (size_t)tile_elems(&in->md) * (size_t)tile_elems(&out4) * sizeof(float);
            if (mb > p->buf_bytes[0]) p->buf_bytes[0] = mb;
        }
        if (lw != LOWER_NONE) p->n_gemm++;
    }
    out->md = lw == LOWER_NONE ? *dq : out4;
    out->buf = dst;
    out->c = c->cout;
    out->h = oh;
    out->scale = dst_scale;
    note_size(p, dst, &out->md);
    if (grp_out) {
        /* back into the plan's layout, where the next conv reads it */
        st = plan_reorder(p, eng, &out->md, BUF_GRP_OUT, &plan_dst, dst_buf, 1.0f, err);
        if (st != TW_OK) return st;
        out->md = plan_dst;
        out->buf = dst_buf;
    }
    return TW_OK;
fail:
    tw_free(w_scale); /* not yet the plan's */
    return st;
}

static tw_status plan_pool(plan *p, dnnl_engine_t eng, const act *in, bool global, int dst_buf,
                           act *out, tw_error *err)
{
    int k = global ? in->h : 3, stride = global ? 1 : 2, pad = global ? 0 : 1;
    int oh = tw_resnet_out_size(in->h, k, stride, pad);
    if (oh < 1)
        return tw_error_set(err, TW_ERR_INPUT, "tile %d is too small for the max pooling", p->tile);
    dnnl_dims_t dd = {p->batch, in->c, oh, oh};
    dnnl_memory_desc_t dst_md;
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&dst_md, 4, dd, in->md.data_type, dnnl_format_tag_any),
             "pool dst md");
    dnnl_dim_t pr = (dnnl_dim_t)(oh - 1) * stride + k - in->h - pad;
    dnnl_dims_t strides = {stride, stride}, kernel = {k, k}, dil = {0, 0}, pl = {pad, pad},
                prr = {pr, pr};
    dnnl_pooling_v2_desc_t pdsc;
    DNNL_TRY(dnnl_pooling_v2_forward_desc_init(&pdsc, dnnl_forward_inference,
                                               global ? dnnl_pooling_avg_exclude_padding
                                                      : dnnl_pooling_max,
                                               &in->md, &dst_md, strides, kernel, dil, pl, prr),
             "pooling desc");
    dnnl_primitive_attr_t attr;
    tw_status st = make_attr(&(attr_spec){0}, &attr, err);
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
    out->scale = in->scale; /* max pooling keeps the scale; averages are fp32 */
    note_size(p, dst_buf, &out->md);
    return TW_OK;
}

/* The channel block of md when it is fp32 nChw8c or nChw16c (the layouts
 * the stem writes on nhwc plans), else 0. */
static int pool_blocked(const dnnl_memory_desc_t *md)
{
    const dnnl_blocking_desc_t *bd = &md->format_desc.blocking;
    if (md->ndims != 4 || md->format_kind != dnnl_blocked || md->data_type != dnnl_f32 ||
        md->offset0 != 0 || bd->inner_nblks != 1 || bd->inner_idxs[0] != 1 ||
        (bd->inner_blks[0] != 8 && bd->inner_blks[0] != 16))
        return 0;
    dnnl_dim_t blk = bd->inner_blks[0], h = md->dims[2];
    /* dense: [n][C / blk][h][w][blk] */
    if (md->dims[3] != h || bd->strides[3] != blk || bd->strides[2] != h * blk ||
        bd->strides[1] != h * h * blk || bd->strides[0] != md->padded_dims[1] * h * h)
        return 0;
    return (int)blk;
}

/* The stem's 3x3 stride-2 max pooling as model/maxpool.c's one pass from
 * its blocked layout into nhwc (storage dst_buf): oneDNN's pooling and the
 * reorder after it took 2.6-3.8x longer on AVX2 (bench/RESULTS.md). */
static tw_status plan_maxpool_nhwc(plan *p, const act *in, int dst_buf, act *out, tw_error *err)
{
    int oh = tw_maxpool_out(in->h);
    dnnl_dims_t dd = {p->batch, in->c, oh, oh};
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&out->md, 4, dd, dnnl_f32, dnnl_nhwc), "pool dst md");
    tw_status st = plan_push(p, L_MAXPOOL_NHWC, NULL, in->buf, dst_buf, NULL, err);
    if (st != TW_OK) return st;
    layer *l = &p->layers[p->n_layers - 1];
    l->in4 = in->md;
    l->out4 = out->md;
    out->buf = dst_buf;
    out->c = in->c;
    out->h = oh;
    out->scale = in->scale;
    note_size(p, dst_buf, &out->md);
    return TW_OK;
}

/* A reorder from `from` (storage src) to `to` (storage dst), multiplying
 * by scale when it is not 1 (quantizing or dequantizing). */
static tw_status plan_reorder(plan *p, dnnl_engine_t eng, const dnnl_memory_desc_t *from, int src,
                              const dnnl_memory_desc_t *to, int dst, float scale, tw_error *err)
{
    dnnl_primitive_attr_t attr;
    attr_spec as = {.n_oscale = scale != 1.0f, .oscale = &scale};
    tw_status st = make_attr(&as, &attr, err);
    if (st != TW_OK) return st;
    dnnl_primitive_desc_t rpd;
    dnnl_status_t s = dnnl_reorder_primitive_desc_create(&rpd, from, eng, to, eng, attr);
    dnnl_primitive_attr_destroy(attr);
    if (s != dnnl_success) return dnnl_fail(err, s, "reorder primitive desc");
    note_size(p, dst, to);
    return plan_push(p, L_REORDER, rpd, src, dst, NULL, err);
}

/* Lowest activation buffer not in busy (a bit mask). */
static int free_buf(unsigned busy)
{
    for (int i = 0; i < N_ACT; i++)
        if (!(busy & (1u << i))) return i;
    return -1;
}

/* Whether fp32 plans use Winograd: oneDNN 2.6 has it for AVX-512 CPUs
 * only, where it runs ResNet's 3x3 convolutions 1.4-2.6x faster than its
 * direct kernels (bench/RESULTS.md); params.cpu_winograd false (the CLI's
 * TILEWISE_CPU_WINOGRAD=0) turns it off (exactly PyTorch's arithmetic order
 * is not kept either way; Winograd's transforms add a rounding error of
 * about 1e-6 relative). */
static bool use_winograd(dnnl_engine_t eng)
{
    dnnl_memory_desc_t x, w;
    dnnl_dims_t xd = {1, 16, 8, 8}, wd = {16, 16, 3, 3}, one = {1, 1};
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t pd;
    if (dnnl_memory_desc_init_by_tag(&x, 4, xd, dnnl_f32, dnnl_aBcd16b) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&w, 4, wd, dnnl_f32, dnnl_format_tag_any) != dnnl_success ||
        dnnl_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_winograd,
                                           &x, &w, NULL, &x, one, one, one) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &cd, NULL, eng, NULL) != dnnl_success)
        return false;
    dnnl_primitive_desc_destroy(pd);
    return true;
}

/* plan_build's walk (tw_resnet_walk): the activations by value, and the
 * activation buffers a block's values hold so far. */
typedef struct plan_walk {
    plan *p;
    dnnl_engine_t eng;
    act v[TW_RESNET_VAL_COUNT];
    unsigned busy;
} plan_walk;

/* x, the stem's output (after the max pool, or a small stem's conv), as the
 * first block's input: reordered into storage to_buf when it must be. */
static tw_status first_block_input(plan_walk *w, act *x, int to_buf, tw_error *err)
{
    plan *p = w->p;
    if ((p->nhwc && !is_nhwc(&x->md)) || p->mode == NUM_INT8) {
        /* the stem has no nhwc kernel for a few input bands (oneDNN would
         * run its reference code): it writes its blocked layout, and the
         * pooled map is reordered once (counted in bench/RESULTS.md).
         * int8: the stem ran in fp32 (plan_conv), and this reorder
         * quantizes its pooled map to u8 by the stem's range (max pooling
         * keeps the largest values of that range) */
        bool q = p->mode == NUM_INT8;
        float scale = q ? q_scale(p, 1, true) : 1.0f;
        dnnl_memory_desc_t nhwc;
        dnnl_dims_t xd = {p->batch, x->c, x->h, x->h};
        DNNL_TRY(dnnl_memory_desc_init_by_tag(&nhwc, 4, xd, q ? dnnl_u8 : dnnl_f32, dnnl_nhwc),
                 "nhwc md");
        tw_status st = plan_reorder(p, w->eng, &x->md, x->buf, &nhwc, to_buf, scale, err);
        if (st != TW_OK) return st;
        x->md = nhwc;
        x->buf = to_buf;
        x->scale = scale;
    }
    w->busy = 1u << x->buf; /* the first block's input */
    return TW_OK;
}

static tw_status plan_op(void *user, const tw_resnet_op *op, tw_error *err)
{
    plan_walk *w = user;
    plan *p = w->p;
    dnnl_engine_t eng = w->eng;
    int batch = p->batch;
    act *x = &w->v[op->dst];
    tw_status st;
    switch (op->kind) {
    case TW_RESNET_OP_STEM: {
        st = plan_conv(p, eng, op->conv, &w->v[op->src], true, NULL, 0, op->relu, x, err);
        if (st != TW_OK) return st;
        /* the stem chose its input layout; convert the caller's NCHW when it differs */
        layer *stem = &p->layers[p->n_layers - 1];
        const dnnl_memory_desc_t *want;
        if ((st = query_md(stem->pd, dnnl_query_src_md, 0, &want, err)) != TW_OK) return st;
        if (!dnnl_memory_desc_equal(want, &p->in_md)) {
            stem->src = BUF_IN_BLK;
            /* the reorder runs first: swap it in front of the stem */
            st = plan_reorder(p, eng, &p->in_md, BUF_IN_USER, want, BUF_IN_BLK, 1.0f, err);
            if (st != TW_OK) return st;
            layer t = p->layers[p->n_layers - 1];
            p->layers[p->n_layers - 1] = p->layers[p->n_layers - 2];
            p->layers[p->n_layers - 2] = t;
        }
        /* a small stem (no max pool) writes the first block's input */
        if (op->dst == TW_RESNET_VAL_X) return first_block_input(w, x, 1, err);
        return TW_OK;
    }
    case TW_RESNET_OP_MAXPOOL:
        if (p->nhwc && pool_blocked(&w->v[op->src].md) > 0) { /* (nhwc: fp32 plans) */
            st = plan_maxpool_nhwc(p, &w->v[op->src], 1, x, err);
            if (st != TW_OK) return st;
            w->busy = 1u << x->buf; /* the first block's input */
            return TW_OK;
        }
        st = plan_pool(p, eng, &w->v[op->src], false, 1, x, err);
        if (st != TW_OK) return st;
        return first_block_input(w, x, 0, err);
    case TW_RESNET_OP_SHORTCUT:
    case TW_RESNET_OP_CONV:
        st = plan_conv(p, eng, op->conv, &w->v[op->src], false, NULL, free_buf(w->busy), op->relu,
                       x, err);
        if (st != TW_OK) return st;
        w->busy |= 1u << x->buf;
        return TW_OK;
    case TW_RESNET_OP_RESIDUAL: {
        /* the sum post-op adds into the shortcut's storage: the block's output */
        act into = w->v[op->add];
        st = plan_conv(p, eng, op->conv, &w->v[op->src], false, &into, 0, op->relu, x, err);
        if (st != TW_OK) return st;
        w->busy = 1u << x->buf; /* the next block's input */
        return TW_OK;
    }
    case TW_RESNET_OP_AVGPOOL: {
        act in = w->v[op->src];
        if (p->mode == NUM_INT8) {
            /* average in fp32: dequantize the last activation first (channels
             * last, which oneDNN's pooling handles without its reference code) */
            dnnl_memory_desc_t deq;
            dnnl_dims_t xd = {batch, in.c, in.h, in.h};
            DNNL_TRY(dnnl_memory_desc_init_by_tag(&deq, 4, xd, dnnl_f32, dnnl_nhwc), "deq md");
            st = plan_reorder(p, eng, &in.md, in.buf, &deq, BUF_DEQ, 1.0f / in.scale, err);
            if (st != TW_OK) return st;
            in.md = deq;
            in.buf = BUF_DEQ;
        }
        /* global average pool in the blocked layout (a plain-layout destination
         * would send oneDNN to its slow reference pooling), then a small reorder
         * brings the features back as plain fp32 [n][C] (nchw with 1x1) */
        act pooled;
        st =
            plan_pool(p, eng, &in, true, free_buf(in.buf < N_ACT ? 1u << in.buf : 0), &pooled, err);
        if (st != TW_OK) return st;
        dnnl_memory_desc_t feat_md;
        dnnl_dims_t fdims = {batch, pooled.c, 1, 1};
        DNNL_TRY(dnnl_memory_desc_init_by_tag(&feat_md, 4, fdims, dnnl_f32, dnnl_nchw), "feat md");
        return plan_reorder(p, eng, &pooled.md, pooled.buf, &feat_md, BUF_FEAT, 1.0f, err);
    }
    case TW_RESNET_OP_FC:
        return TW_OK; /* the head runs on the host after the plan (tw_resnet_head) */
    }
    return TW_OK;
}

static tw_status plan_build(plan *p, cpu_ctx *c, const tw_resnet *net, int tile, int batch,
                            num_mode mode, const float *amax, tw_error *err)
{
    memset(p, 0, sizeof *p);
    p->mode = mode;
    p->memo = &c->memo;
    p->wino = mode == NUM_F32 && c->wino;
    p->nhwc = mode == NUM_F32 && !p->wino && c->nhwc;
    p->wino_own = p->nhwc && c->wino_own;
    p->gemm = mode == NUM_F32 ? c->gemm : 0;
    p->amax = amax;
    p->w_levels = c->int8_levels;
    p->batch = batch;
    p->tile = tile;
    p->feat_dim = net->feat_dim;
    dnnl_dims_t id = {batch, net->in_bands, tile, tile};
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&p->in_md, 4, id, dnnl_f32, dnnl_nchw), "input md");
    p->buf_bytes[BUF_IN_USER] = dnnl_memory_desc_get_size(&p->in_md);

    plan_walk w = {.p = p, .eng = c->eng};
    w.v[TW_RESNET_VAL_IN] =
        (act){.md = p->in_md, .buf = BUF_IN_USER, .c = net->in_bands, .h = tile, .scale = 1};
    return tw_resnet_walk(net, tile, plan_op, &w, err);
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
    for (int i = 0; i < c->n_ops; i++)
        if (c->ops[i].prim) dnnl_primitive_destroy(c->ops[i].prim);
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

static tw_status new_mem(cpu_ctx *c, const dnnl_memory_desc_t *md, void *handle, dnnl_memory_t *out,
                         tw_error *err)
{
    if (c->n_mems == c->cap_mems)
        return tw_error_set(err, TW_ERR_INTERNAL, "CPU backend: memory table full");
    DNNL_TRY(dnnl_memory_create(out, md, c->eng, handle), "memory create");
    c->mems[c->n_mems++] = *out;
    return TW_OK;
}

/* A conv whose weights the net no longer holds: an earlier reserve
 * consumed them (see build) and a retry cannot make them again. */
static tw_status weights_gone(tw_error *err)
{
    return tw_error_set(err, TW_ERR_NOMEM,
                        "out of memory for the CPU weights (the model's own copy was "
                        "already released: give the run a smaller tiling.batch)");
}

/* Reorder memory `from` (layout from_md) into `to` (to_md) now, scaling
 * output channel o by oscale[o] when n_oscale > 0 (int8 weights). */
static tw_status reorder_once(cpu_ctx *c, dnnl_memory_t from, const dnnl_memory_desc_t *from_md,
                              dnnl_memory_t to, const dnnl_memory_desc_t *to_md,
                              const float *oscale, int n_oscale, int oscale_mask, tw_error *err)
{
    dnnl_primitive_desc_t rpd = NULL;
    dnnl_primitive_t r = NULL;
    dnnl_primitive_attr_t attr;
    attr_spec as = {
        .n_oscale = n_oscale, .oscale_mask = oscale_mask, .oscale = oscale, .own_scratch = true};
    tw_status st = make_attr(&as, &attr, err);
    if (st != TW_OK) return st;
    dnnl_status_t s =
        dnnl_reorder_primitive_desc_create(&rpd, from_md, c->eng, to_md, c->eng, attr);
    dnnl_primitive_attr_destroy(attr);
    if (s == dnnl_success) s = dnnl_primitive_create(&r, rpd);
    if (s == dnnl_success) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
        s = dnnl_primitive_execute(r, c->stream, 2, args);
    }
    if (s == dnnl_success) s = dnnl_stream_wait(c->stream);
    if (r) dnnl_primitive_destroy(r);
    if (rpd) dnnl_primitive_desc_destroy(rpd);
    if (s != dnnl_success) return dnnl_fail(err, s, "weights reorder");
    return TW_OK;
}

/* Reorder the folded OIHW weights of conv into the layout of its primitive
 * and keep them; the bias is copied as is. */
static tw_status prepare_weights(cpu_ctx *c, const layer *l, dnnl_memory_t *wm, dnnl_memory_t *bm,
                                 tw_error *err)
{
    /* the weights as the net holds them: OIHW, or for the lowerings a plain
     * [kd][ks] matrix ([Cout][Cin] for LOWER_ROWS: OIHW with k = 1) */
    const tw_conv *cv0 = l->conv;
    dnnl_dims_t wd = {cv0->cout, cv0->cin, cv0->k, cv0->k};
    int wnd = 4;
    dnnl_format_tag_t wtag = dnnl_oihw;
    if (cv0->groups > 1) {
        /* grouped: [g][cout/g][cin/g][k][k], the OIHW bytes as they are */
        int g = cv0->groups;
        dnnl_dims_t gd = {g, cv0->cout / g, cv0->cin / g, cv0->k, cv0->k};
        memcpy(wd, gd, sizeof gd);
        wnd = 5;
        wtag = dnnl_goihw;
    }
    const float *wsrc = cv0->w;
    if (l->lower != LOWER_NONE) {
        /* [kd][ks] in memory: the matmul's [ks][kd] weights in layout ba */
        wnd = 2;
        wtag = dnnl_ba;
        wd[1] = l->lower == LOWER_ROWS ? cv0->cout : tile_elems(&l->out4);
        wd[0] = l->lower == LOWER_ROWS ? cv0->cin : tile_elems(&l->in4);
        if (l->lower == LOWER_DENSE) wsrc = c->buf[0]; /* filled below, sized by the plan */
    }
    const tw_conv *cv = l->conv;
    if (!cv->w || !cv->b) return weights_gone(err);
    const dnnl_memory_desc_t *wmd, *bmd;
    tw_status st;
    if ((st = query_md(l->pd, dnnl_query_weights_md, 0, &wmd, err)) != TW_OK ||
        (st = query_md(l->pd, dnnl_query_weights_md, 1, &bmd, err)) != TW_OK)
        return st;
    void *w = ws_alloc(c, dnnl_memory_desc_get_size(wmd));
    float *b = ws_alloc(c, dnnl_memory_desc_get_size(bmd));
    if (!w || !b) return tw_error_set(err, TW_ERR_NOMEM, "out of memory for the CPU weights");
    if (l->lower == LOWER_DENSE)
        dense_matrix(cv, &l->in4, &l->out4, c->buf[0], b);
    else
        memcpy(b, cv->b, (size_t)cv->cout * sizeof(float));
    /* int8: the bias joins the accumulator, which counts in src*w units */
    if (l->w_scale)
        for (int o = 0; o < cv->cout; o++) b[o] *= l->src_scale * l->w_scale[o];
    st = new_mem(c, wmd, w, wm, err);
    if (st == TW_OK) st = new_mem(c, bmd, b, bm, err);
    if (st != TW_OK) return st;

    dnnl_memory_desc_t umd;
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&umd, wnd, wd, dnnl_f32, wtag), "weights md");
    dnnl_memory_t um;
    /* the reorder only reads the source: the cast drops const for the C API */
    DNNL_TRY(dnnl_memory_create(&um, &umd, c->eng, (void *)wsrc), "weights memory");
    st = reorder_once(c, um, &umd, *wm, wmd, l->w_scale, l->w_scale ? cv->cout : 0,
                      cv->groups > 1 ? 3 : 1, err);
    dnnl_memory_destroy(um);
    return st;
}

/* The scratchpad argument of pd's primitive, when it has one. */
static tw_status scratch_arg(cpu_ctx *c, const_dnnl_primitive_desc_t pd, op *o, tw_error *err)
{
    const dnnl_memory_desc_t *spmd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (!spmd || dnnl_memory_desc_get_size(spmd) == 0) return TW_OK;
    dnnl_memory_t spm;
    tw_status st = new_mem(c, spmd, c->scratch, &spm, err);
    if (st == TW_OK) o->args[o->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, spm};
    return st;
}

/* The three ops of LOWER_WINO layer l: V from the source activation, the
 * matmul with U (made here: plain [36][Cin][Cout] in buffer 0, reordered
 * into the layout the matmul chose), y from M with bias, sum and ReLU. */
static tw_status build_wino(cpu_ctx *c, const layer *l, tw_resnet *consume, tw_error *err)
{
    const tw_conv *cv = l->conv;
    if (!cv->w || !cv->b) return weights_gone(err);
    int n = (int)l->in4.dims[0], h = (int)l->in4.dims[2];
    size_t stride = l->rows;
    const dnnl_memory_desc_t *vmd, *wmd, *mmd;
    tw_status st;
    if ((st = query_md(l->pd, dnnl_query_src_md, 0, &vmd, err)) != TW_OK ||
        (st = query_md(l->pd, dnnl_query_weights_md, 0, &wmd, err)) != TW_OK ||
        (st = query_md(l->pd, dnnl_query_dst_md, 0, &mmd, err)) != TW_OK)
        return st;
    float *bias = ws_alloc(c, (size_t)cv->cout * sizeof *bias);
    void *w = ws_alloc(c, dnnl_memory_desc_get_size(wmd));
    if (!bias || !w) return tw_error_set(err, TW_ERR_NOMEM, "out of memory for the CPU weights");
    memcpy(bias, cv->b, (size_t)cv->cout * sizeof *bias);
    tw_wino_weights(cv->w, cv->cout, cv->cin, c->buf[0]);
    dnnl_memory_t um, wm, vm, mm;
    dnnl_memory_desc_t umd;
    dnnl_dims_t ud = {TW_WINO_POINTS, cv->cin, cv->cout};
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&umd, 3, ud, dnnl_f32, dnnl_abc), "U md");
    if ((st = new_mem(c, &umd, c->buf[0], &um, err)) != TW_OK ||
        (st = new_mem(c, wmd, w, &wm, err)) != TW_OK ||
        (st = reorder_once(c, um, &umd, wm, wmd, NULL, 0, 1, err)) != TW_OK)
        return st;
    if (consume) tw_resnet_release_conv(consume, cv);
    if ((st = new_mem(c, vmd, c->buf[BUF_WINO_V], &vm, err)) != TW_OK ||
        (st = new_mem(c, mmd, c->buf[BUF_WINO_M], &mm, err)) != TW_OK)
        return st;

    op *in = &c->ops[c->n_ops++];
    *in = (op){.kind = OP_WINO_IN,
               .from = c->buf[l->src],
               .to = c->buf[BUF_WINO_V],
               .n = n,
               .stride = stride,
               .h = h,
               .ch = cv->cin};
    op *mul = &c->ops[c->n_ops];
    DNNL_TRY(dnnl_primitive_create(&mul->prim, l->pd), "primitive create");
    c->n_ops++;
    mul->args[mul->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, vm};
    mul->args[mul->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, wm};
    mul->args[mul->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_DST, mm};
    if ((st = scratch_arg(c, l->pd, mul, err)) != TW_OK) return st;
    op *out = &c->ops[c->n_ops++];
    *out = (op){.kind = OP_WINO_OUT,
                .from = c->buf[BUF_WINO_M],
                .to = c->buf[l->dst],
                .bias = bias,
                .n = n,
                .stride = stride,
                .h = h,
                .ch = cv->cout,
                .sum = l->sum,
                .relu = l->relu,
                .conv = true,
                .levels = l->relu ? 255 : 127,
                .dst = c->buf[l->dst],
                .dst_floats = (size_t)n * h * h * cv->cout};
    return TW_OK;
}

/* Allocate the plan's buffers, then reorder each conv's weights; with
 * consume (the net's owner will not need its conv weights again), free
 * each one from the net right after its copy is made, so that the two
 * copies never coexist in full. */
static tw_status build(cpu_ctx *c, const tw_resnet *net, tw_resnet *consume, const plan *p,
                       tw_error *err)
{
    /* a LOWER_WINO layer is three ops: transform, matmul, transform */
    c->ops = tw_calloc(TW_MEM_OTHER, (size_t)p->n_layers * 3, sizeof *c->ops);
    c->stats.winograd_convs = 0;
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
        if (l->lower == LOWER_WINO) {
            if ((st = build_wino(c, l, consume, err)) != TW_OK) return st;
            continue;
        }
        if (l->kind == L_MAXPOOL_NHWC) {
            c->ops[c->n_ops++] = (op){.kind = OP_MAXPOOL,
                                      .from = c->buf[l->src],
                                      .to = c->buf[l->dst],
                                      .n = (int)l->in4.dims[0],
                                      .h = (int)l->in4.dims[2],
                                      .ch = (int)l->in4.dims[1],
                                      .blk = pool_blocked(&l->in4)};
            continue;
        }
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
        o->conv = l->kind == L_CONV;
        o->levels = l->relu ? 255 : 127;
        o->dst = c->buf[l->dst];
        /* (a lowering's padding rows are not the output's) */
        o->dst_floats =
            dnnl_memory_desc_get_size(l->lower != LOWER_NONE ? &l->out4 : dmd) / sizeof(float);
        o->args[o->nargs++] = (dnnl_exec_arg_t){reorder ? DNNL_ARG_FROM : DNNL_ARG_SRC, sm};
        o->args[o->nargs++] = (dnnl_exec_arg_t){reorder ? DNNL_ARG_TO : DNNL_ARG_DST, dm};
        if (l->kind == L_CONV) {
            const dnnl_convolution_desc_t *cd = NULL;
            if (dnnl_primitive_desc_query(l->pd, dnnl_query_convolution_d, 0, &cd) ==
                    dnnl_success &&
                cd->alg_kind == dnnl_convolution_winograd)
                c->stats.winograd_convs++;
            dnnl_memory_t wm, bm;
            st = prepare_weights(c, l, &wm, &bm, err);
            if (st != TW_OK) return st;
            if (consume) tw_resnet_release_conv(consume, l->conv);
            o->args[o->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, wm};
            o->args[o->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, bm};
        }
        if ((st = scratch_arg(c, l->pd, o, err)) != TW_OK) return st;
    }
    if (!c->in_mem) return tw_error_set(err, TW_ERR_INTERNAL, "CPU backend: no input layer");
    /* buffer 0 held the dense matrices or U: zero again */
    if ((p->n_gemm || p->n_wino) && c->buf[0]) memset(c->buf[0], 0, p->buf_bytes[0]);
    c->stats.gemm_convs = p->n_gemm;
    c->stats.winograd_convs += p->n_wino;
    return TW_OK;
nomem:
    return tw_error_set(err, TW_ERR_NOMEM, "out of memory for the CPU backend workspace");
}

static num_mode wanted_mode(tw_precision prec)
{
    return prec == TW_PREC_BF16 ? NUM_BF16 : prec == TW_PREC_INT8 ? NUM_INT8 : NUM_F32;
}

static const char *mode_name(num_mode m)
{
    return m == NUM_BF16 ? "bf16" : m == NUM_INT8 ? "int8" : "fp32";
}

/* Can oneDNN run this net in mode on this CPU? (It answers "unimplemented"
 * to a bf16 convolution without AVX-512, for instance.) */
static bool mode_supported(cpu_ctx *c, const tw_resnet *net, int tile, num_mode mode)
{
    if (mode == NUM_F32) return true;
    probe *pr = &c->probes[mode];
    if (pr->net != net || pr->tile != tile) {
        /* one batch-1 plan answers; the budget's bisection and reserve ask again */
        plan p;
        tw_error_init(&pr->why);
        pr->ok = plan_build(&p, c, net, tile, 1, mode, NULL, &pr->why) == TW_OK;
        plan_free(&p);
        pr->net = net;
        pr->tile = tile;
    }
    return pr->ok;
}

/* The fewest tiles a plan is built for. oneDNN 2.6's AVX-512 Winograd
 * kernel sums a tile's convolutions in another order in batches of 1 and 2
 * than in batches of 3 to 512 (measured at 64 and 224 px), and a tile must
 * get the same bits whatever batch the budget picks (tiling.batch and
 * runtime.memory change no output byte, core/keys.c). Smaller batches run
 * on these primitives as a short last batch does. */
enum { CPU_MIN_PLAN_BATCH = 4 };

static int plan_batch(int batch)
{
    return batch < CPU_MIN_PLAN_BATCH ? CPU_MIN_PLAN_BATCH : batch;
}

static size_t mode_bytes(cpu_ctx *c, const tw_resnet *net, int tile, int max_batch, num_mode mode)
{
    plan p;
    tw_error err;
    tw_error_init(&err);
    size_t bytes;
    if (plan_build(&p, c, net, tile, max_batch, mode, NULL, &err) == TW_OK) {
        bytes = plan_bytes(&p, net);
    } else {
        /* reserve() will report the real problem; until then assume the
         * weights plus five copies of the stem output per tile */
        int h = tw_resnet_out_size(tile, net->stem.k, net->stem.stride, net->stem.pad);
        bytes = net->weight_bytes +
                5 * (size_t)max_batch * (size_t)net->stem.cout * h * h * 4 * sizeof(float);
    }
    plan_free(&p);
    return bytes;
}

static size_t cpu_workspace_bytes(void *ctx, const tw_resnet *net, int tile, int max_batch,
                                  tw_precision prec)
{
    cpu_ctx *c = ctx;
    set_threads(c);
    num_mode mode = wanted_mode(prec);
    /* int8 calibrates with the fp32 plan, frees it, then builds the int8
     * one: a quarter of its buffers and weights plus an fp32 copy of the
     * last activation (which the fp32 plan holds too), so the fp32 plan is
     * the peak */
    size_t sample = 0;
    if (mode == NUM_INT8) {
        /* and the calibration sample beside it (pipeline/stages.c): its
         * TW_CALIB_TILES tiles as floats and raw (4 bytes a value at most
         * counted: 64-bit rasters exceed it), their masks, the histograms */
        size_t px = (size_t)tile * tile;
        sample = TW_CALIB_TILES * (px * net->in_bands * (4 + 4) + px) +
                 (size_t)(net->n_blocks * 4 + 2) * TW_CALIB_BINS * sizeof(double);
    }
    if (mode == NUM_INT8 || !mode_supported(c, net, tile, mode)) mode = NUM_F32;
    return mode_bytes(c, net, tile, plan_batch(max_batch), mode) + sample;
}

/* Plan and build the net in mode for batches of `batch` tiles. On failure
 * nothing stays built. consume: see build(). */
static tw_status build_mode(cpu_ctx *c, const tw_resnet *net, tw_resnet *consume, int tile,
                            int batch, num_mode mode, const float *amax, tw_error *err)
{
    plan p;
    tw_status st = plan_build(&p, c, net, tile, batch, mode, amax, err);
    if (st == TW_OK) st = build(c, net, consume, &p, err);
    int n_conv = p.n_conv, n_refused = p.n_refused;
    plan_free(&p);
    if (st != TW_OK) {
        release(c);
        return st;
    }
    c->mode = mode;
    c->n_conv = n_conv;
    c->n_refused = n_refused;
    c->stats.lowerings_refused = n_refused;
    c->reserved = true;
    return TW_OK;
}

static bool cpu_consumes_weights(void *ctx, tw_precision prec)
{
    (void)ctx;
    return wanted_mode(prec) != NUM_INT8; /* int8 quantizes them again per raster */
}

/* Whether oneDNN's bf16 convolutions would run slower than fp32 here (then
 * bf16 falls back to fp32 with a notice saying why). Measured, ResNet-18 on
 * 64-px tiles, bench/RESULTS.md (issue 20): without AVX512-BF16 oneDNN
 * emulates it, 4.4x slower than fp32; with AVX512-BF16 but no AMX, Intel
 * Xeons ran it at 0.52-0.80x fp32's rate (AMD Zen 4 at 1.8-2x: it keeps
 * bf16); with AMX it is 1.5x faster. ONEDNN_MAX_CPU_ISA counts (oneDNN's
 * effective ISA). */
static const char *isa_name(dnnl_cpu_isa_t isa);

static bool bf16_slower(char *why, size_t why_size)
{
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    bool has = (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
    bool amx = (isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx;
    if ((isa & dnnl_cpu_isa_avx512_core) != dnnl_cpu_isa_avx512_core) {
        snprintf(why, why_size,
                 "oneDNN 2.6 has bf16 convolutions for AVX-512 CPUs only (this one: %s)",
                 isa_name(isa));
        return true;
    }
    if (!has) {
        snprintf(why, why_size,
                 "bf16 would run about 4x slower than fp32 on this CPU (no AVX512-BF16 "
                 "instructions: oneDNN emulates them)");
        return true;
    }
    __builtin_cpu_init();
    if (!amx && __builtin_cpu_is("intel")) {
        snprintf(why, why_size,
                 "bf16 would run slower than fp32 on this CPU (an Intel CPU with AVX512-BF16 "
                 "but no AMX: measured 0.5-0.8x fp32's speed)");
        return true;
    }
    return false;
}

static bool cpu_supports(void *ctx, const tw_resnet *net, int tile, tw_precision want,
                         tw_precision *runs_as, char *why, size_t why_size)
{
    cpu_ctx *c = ctx;
    set_threads(c);
    *runs_as = want;
    if (want == TW_PREC_TF32) {
        *runs_as = TW_PREC_FP32; /* fp32 is what tf32 rounds from: no notice */
        return true;
    }
    if (want == TW_PREC_FP16) {
        *runs_as = TW_PREC_FP32;
        snprintf(why, why_size, "the CPU backend has no fp16 convolutions");
        return true;
    }
    num_mode mode = wanted_mode(want);
    if (mode == NUM_BF16 && bf16_slower(why, why_size)) {
        *runs_as = TW_PREC_FP32;
        return true;
    }
    if (!mode_supported(c, net, tile, mode)) {
        *runs_as = TW_PREC_FP32;
        snprintf(why, why_size, "%s convolutions are not available on this CPU (%s)",
                 mode_name(mode), c->probes[mode].why.msg);
    }
    return true;
}

static tw_status cpu_reserve(void *ctx, tw_resnet *net, int tile, int batch, tw_precision prec,
                             bool consume, tw_error *err)
{
    cpu_ctx *c = ctx;
    release(c);
    c->int8 = c->calibrate = false;
    set_threads(c);
    num_mode mode = wanted_mode(prec);
    /* int8 starts in fp32: calibrate() measures the activation ranges with
     * it, then quantizes the net's weights (for every raster): it keeps them */
    tw_resnet *consumed = consume && cpu_consumes_weights(c, prec) ? net : NULL;
    batch = plan_batch(batch);
    tw_status st =
        build_mode(c, net, consumed, tile, batch, mode == NUM_INT8 ? NUM_F32 : mode, NULL, err);
    if (st != TW_OK) return st;
    c->int8 = c->calibrate = mode == NUM_INT8;
    c->net = net;
    c->max_batch = batch;
    c->tile = tile;
    c->in_bands = net->in_bands;
    c->feat_dim = net->feat_dim;
    c->n_classes = net->n_classes;
    snprintf(c->stats.algorithms, sizeof c->stats.algorithms,
             "%d of %d convolutions Winograd F(4,3)%s, %d one inner product (GEMM), the rest "
             "oneDNN's direct kernels%s; %d lowerings refused (tile place-dependent)",
             c->stats.winograd_convs, c->n_conv,
             c->stats.winograd_convs == 0 ? ""
             : c->wino                    ? " (oneDNN's kernel)"
                                          : " (model/winograd.c around a oneDNN matmul)",
             c->stats.gemm_convs, c->mode == NUM_F32 && !c->wino && c->nhwc ? " (nhwc)" : "",
             c->n_refused);
    c->stats.precision = mode == NUM_BF16   ? TW_PREC_BF16
                         : mode == NUM_INT8 ? TW_PREC_INT8
                                            : TW_PREC_FP32;
    c->stats.int8_weight_bits = mode != NUM_INT8 ? 0 : c->int8_levels == 127 ? 8 : 7;
    return TW_OK;
}

/* Point the first layer at this batch's input: in place for a full batch
 * (oneDNN never writes its source), else copied into the backend's own. */
static tw_status set_input(cpu_ctx *c, const tw_infer_batch *b, tw_error *err)
{
    void *src = c->buf[BUF_IN_USER];
    if (b->n == c->max_batch)
        src = (void *)b->x;
    else if (b->x != src)
        memcpy(src, b->x, (size_t)b->n * c->in_bands * c->tile * c->tile * sizeof(float));
    DNNL_TRY(dnnl_memory_set_data_handle(c->in_mem, src), "set input");
    return TW_OK;
}

/* What run_ops records of each conv's output for int8 calibration (conv k,
 * in plan order, at [1 + k]), from the batch's first n tiles only (the
 * rest of the buffers hold older tiles): the largest finite |v| so far in
 * m, and with hist, the values counted into hist[k] over [0, m[1 + k]]
 * (one_pass: m is this batch's alone, taken first). */
typedef struct calib_rec {
    int n;
    float *m;
    double *hist;
    bool one_pass;
} calib_rec;

static void record(const cpu_ctx *c, const op *o, int k, calib_rec *rec)
{
    size_t n = o->dst_floats / (size_t)c->max_batch * (size_t)rec->n; /* batch-outer layouts */
    if (!rec->hist || rec->one_pass) {
        float v = tw_calib_max(o->dst, n);
        if (v > rec->m[1 + k]) rec->m[1 + k] = v;
    }
    if (rec->hist)
        tw_calib_hist_add(rec->hist + (size_t)k * TW_CALIB_BINS, rec->m[1 + k], o->dst, n);
}

/* Run every op on batch b; rec (fp32 plans only): record each conv's output. */
static tw_status run_ops(cpu_ctx *c, const tw_infer_batch *b, calib_rec *rec, tw_error *err)
{
    tw_status st = set_input(c, b, err);
    if (st != TW_OK) return st;
    for (int i = 0, k = 0; i < c->n_ops; i++) {
        const op *o = &c->ops[i];
        if (o->kind == OP_PRIM) {
            DNNL_TRY(dnnl_primitive_execute(o->prim, c->stream, o->nargs, o->args), "execute");
        } else {
            DNNL_TRY(dnnl_stream_wait(c->stream), "stream wait");
            if (o->kind == OP_WINO_IN)
                tw_wino_input(o->from, o->n, o->h, o->ch, o->stride, o->to);
            else if (o->kind == OP_MAXPOOL)
                tw_maxpool_blocked_to_nhwc(o->from, o->n, o->ch, o->h, o->blk, o->to);
            else
                tw_wino_output(o->from, o->n, o->h, o->ch, o->stride, o->bias, o->sum, o->relu,
                               o->to);
        }
        if (rec && o->conv) {
            DNNL_TRY(dnnl_stream_wait(c->stream), "stream wait");
            record(c, o, k++, rec);
        }
    }
    DNNL_TRY(dnnl_stream_wait(c->stream), "stream wait");
    return TW_OK;
}

/* The sample's tiles (idx, n of them) through the fp32 plan in batches of
 * max_batch, each copied into the backend's own input buffer. */
static tw_status calib_pass(cpu_ctx *c, const tw_infer_batch *b, const int *idx, int n,
                            calib_rec *rec, tw_error *err)
{
    size_t tile_floats = (size_t)c->in_bands * c->tile * c->tile;
    float *dst = c->buf[BUF_IN_USER];
    for (int first = 0; first < n; first += c->max_batch) {
        int cn = n - first < c->max_batch ? n - first : c->max_batch;
        for (int i = 0; i < cn; i++)
            memcpy(dst + (size_t)i * tile_floats, b->x + (size_t)idx[first + i] * tile_floats,
                   tile_floats * sizeof(float));
        tw_infer_batch part = *b;
        part.x = dst;
        part.n = cn;
        rec->n = cn;
        tw_status st = run_ops(c, &part, rec, err);
        if (st != TW_OK) return st;
    }
    return TW_OK;
}

/* int8: run the sample b in fp32 recording the activation ranges, then
 * build the int8 plan with them in place of the fp32 one (same batch size:
 * the caller's slots are sized for it). When an int8 plan is already built
 * (an earlier raster), an fp32 one is built for the measurement first.
 * Tiles of absurd input (model/calib.h) are left out (all are used when
 * none is kept). The sample may hold more tiles than a batch: then a first
 * pass takes each range's largest value and a second counts the values
 * (tw_calib_hist_add), so that the ranges are those of the whole sample
 * whatever the batch. */
static tw_status calibrate(cpu_ctx *c, const tw_infer_batch *b, tw_error *err)
{
    int batch = c->max_batch;
    tw_status st = TW_OK;
    if (c->mode != NUM_F32) {
        release(c);
        st = build_mode(c, c->net, NULL, c->tile, batch, NUM_F32, NULL, err);
        if (st != TW_OK) return st;
    }
    float *amax = tw_calloc(TW_MEM_OTHER, (size_t)c->n_conv + 1, sizeof *amax);
    double *hist = tw_calloc(TW_MEM_OTHER, (size_t)c->n_conv * TW_CALIB_BINS, sizeof *hist);
    bool *keep = tw_alloc(TW_MEM_OTHER, (size_t)b->n * sizeof *keep);
    int *idx = tw_alloc(TW_MEM_OTHER, (size_t)b->n * sizeof *idx);
    if (!amax || !hist || !keep || !idx) {
        st = tw_error_set(err, TW_ERR_NOMEM, "out of memory calibrating int8");
        goto out;
    }
    size_t tile_floats = (size_t)c->in_bands * c->tile * c->tile;
    int kept = tw_calib_keep(b->x, b->n, tile_floats, keep), n = 0;
    for (int j = 0; j < b->n; j++)
        if (keep[j] || kept == 0) idx[n++] = j;
    /* amax[0], the input's range, stays 0: the stem runs in fp32 */
    calib_rec rec = {.m = amax, .hist = NULL, .one_pass = n <= batch};
    if (!rec.one_pass) st = calib_pass(c, b, idx, n, &rec, err);
    rec.hist = hist;
    if (st == TW_OK) st = calib_pass(c, b, idx, n, &rec, err);
    for (int i = 0, k = 0; st == TW_OK && i < c->n_ops; i++)
        if (c->ops[i].conv) {
            amax[1 + k] = tw_calib_hist_range(hist + (size_t)k * TW_CALIB_BINS, amax[1 + k],
                                              c->ops[i].levels);
            k++;
        }
    if (st == TW_OK) {
        release(c);
        st = build_mode(c, c->net, NULL, c->tile, batch, NUM_INT8, amax, err);
    }
    if (st == TW_OK) c->calibrate = false;
out:
    tw_free(amax);
    tw_free(hist);
    tw_free(keep);
    tw_free(idx);
    return st;
}

static tw_status cpu_calibrate(void *ctx, const tw_infer_batch *b, const char *path, tw_error *err)
{
    cpu_ctx *c = ctx;
    if (!c->reserved || !c->int8) return TW_OK; /* not asked, or fell back to fp32 */
    if (b->n < 1 || b->tile != c->tile || !b->x)
        return tw_error_set(err, TW_ERR_INTERNAL, "CPU backend: calibration batch of %d tiles",
                            b->n);
    (void)path;
    set_threads(c);
    return calibrate(c, b, err);
}

static tw_status cpu_infer(void *ctx, const tw_infer_batch *b, tw_error *err)
{
    cpu_ctx *c = ctx; /* tw_backend_infer checked b against the reservation */
    double t0 = tw_clock_now();
    set_threads(c);
    tw_status st = c->calibrate ? calibrate(c, b, err) : TW_OK;
    if (st == TW_OK) st = run_ops(c, b, NULL, err);
    if (st != TW_OK) return st;

    const float *feat = c->buf[BUF_FEAT];
    int fd = c->feat_dim, k = c->n_classes;
    if (b->emb) memcpy(b->emb, feat, (size_t)b->n * fd * sizeof(float));
    tw_resnet_head(c->fc_w, c->fc_b, k, fd, feat, b->n, b->probs);
    c->stats.compute_s += tw_clock_now() - t0;
    return TW_OK;
}

/* The smallest power of two (even splits over the threads) that gives the
 * last stage, whose maps are tile/32 wide, at least 128 pixels per
 * convolution: below that its GEMMs are too thin, above it a bigger batch
 * only costs memory (activations, slots). 32 tiles of 64 px, 4 of 224 px,
 * at most 64. Measured with 2 threads (bench/RESULTS.md): ResNet-18 and -50
 * on 64-px tiles as fast in batches of 32 as of 64 (40 MiB less peak RSS
 * for ResNet-50), ~10 % slower in 16; ResNet-50 on 224-px tiles as fast in
 * batches of 4 to 8 as of 32, or faster, for 300 MiB less. */
enum { CPU_LAST_STAGE_PIXELS = 128, CPU_MAX_BATCH = 64 };

static int cpu_auto_batch(void *ctx, const tw_resnet *net, int tile)
{
    const cpu_ctx *c = ctx;
    /* (after a small stem the last stage is tile/8 wide, not tile/32; the
     * rule is kept: ResNet-18 small stem at 32 px ran 1.9-4.3x faster in
     * batches of 32-64 than in the 8 the last stage's 128 pixels would give,
     * bench/RESULTS.md, issue 31; the budget lowers it where it must) */
    long side = (tile + 31) / 32, b = 1;
    /* Without oneDNN's AVX-512 kernels (the nhwc plans, model/winograd.c)
     * the last stage's 3x3 convs on maps of 2x2 or less are one GEMM with
     * a row per tile (LOWER_DENSE), too thin at 32 rows: batches of 64 ran
     * ResNet-18 12 % faster at 64 px (AVX2, 2 threads, bench/RESULTS.md)
     * for 15 MiB more workspace. ResNet-50 ran 10 % faster end to end (296
     * vs 268 tiles/s) but its peak RSS went from 257 to 322 MiB, over half
     * the PyTorch loop's (issue 5): it keeps 32 (tiling.batch: 64 for speed). */
    if (c->wino_own && c->nhwc && side <= 2 && !(net && net->bottleneck)) return CPU_MAX_BATCH;
    while (b < CPU_MAX_BATCH && b * side * side < CPU_LAST_STAGE_PIXELS) b *= 2;
    return (int)b;
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
    .supports = cpu_supports,
    .reserve = cpu_reserve,
    .calibrate = cpu_calibrate,
    .infer = cpu_infer,
    .auto_batch = cpu_auto_batch,
    .consumes_weights = cpu_consumes_weights,
    .wants_raw = cpu_wants_raw,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .get_stats = cpu_get_stats,
    .destroy = cpu_destroy,
};

static const char *isa_name(dnnl_cpu_isa_t isa)
{
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
    }
}

tw_status tw_cpu_backend_create(const tw_backend_params *params, tw_backend *out, tw_error *err)
{
    out->i = NULL;
    out->ctx = NULL;
    cpu_ctx *c = tw_calloc(TW_MEM_OTHER, 1, sizeof *c);
    if (!c) return tw_error_set(err, TW_ERR_NOMEM, "out of memory creating the CPU backend");
    c->threads = params->threads > 0 ? params->threads : 0;
    dnnl_status_t s = dnnl_engine_create(&c->eng, dnnl_cpu, 0);
    if (s == dnnl_success) s = dnnl_stream_create(&c->stream, c->eng, dnnl_stream_default_flags);
    if (s != dnnl_success) {
        cpu_destroy(c);
        return dnnl_fail(err, s, "CPU engine/stream create");
    }
    c->wino = params->cpu_winograd == TW_CPU_WINOGRAD_AUTO && use_winograd(c->eng);
    c->wino_own = params->cpu_winograd == TW_CPU_WINOGRAD_OWN ||
                  (params->cpu_winograd == TW_CPU_WINOGRAD_AUTO && !c->wino);
    /* nhwc where oneDNN has no AVX-512 kernels: its AVX2 kernels run it as
     * fast as nChw8c, and it lets the last stage's 1x1 convs run as GEMMs
     * (LOWER_ROWS; bench/RESULTS.md, issue 20) */
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    bool avx512 = (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
    c->nhwc = params->cpu_nhwc > 0 || (params->cpu_nhwc < 0 && !avx512);
    c->gemm = params->cpu_gemm < 0 ? -1 : params->cpu_gemm > 0 ? 1 : 0;
    c->int8_levels = int8_weight_levels(isa);
    const dnnl_version_t *v = dnnl_version();
    snprintf(c->stats.library, sizeof c->stats.library, "oneDNN %d.%d.%d", v->major, v->minor,
             v->patch);
    snprintf(c->stats.device, sizeof c->stats.device, "CPU, oneDNN instruction set %s",
             isa_name(isa));
    out->i = &k_cpu_iface;
    out->ctx = c;
    return TW_OK;
}
