/* cpu_internal.h - what the parts of the CPU backend share (the parts and
 * their jobs are listed at the top of model/cpu_backend.c): the plan and
 * its layers, the storage ids, the built ops, the backend's context, the
 * oneDNN error helpers, and the calls one part makes into another. Every
 * such call is named cpu_*; what one part uses alone stays static there.
 *
 * Private to the CPU backend: it is not installed, and nothing outside
 * model/cpu_*.c includes it (scripts/check_layers.sh refuses it outside
 * model/).
 *
 * Memory: activations live in four buffers, each sized for the largest
 * thing it holds, reused along the graph (a bottleneck block with a
 * projection needs four at once: its input, two inner results and the
 * shortcut). The last conv of a
 * block writes into the shortcut's buffer with a sum post-op, which is the
 * residual add. Scratchpads are user-managed and share one buffer. Weights
 * are reordered once in reserve() into the layout each conv chose.
 */
#ifndef TW_CPU_INTERNAL_H
#define TW_CPU_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include <dnnl.h>
#include <dnnl_debug.h>

#include "model/backend.h"
#include "model/resnet.h"
#include "model/seg_cpu.h"
#include "core/error.h"

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

/* How a convolution runs (fp32 only; see model/cpu_lower.c). */
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
    /* lowerings: the GEMM's rows, padding included (cpu_lowering_rows, cpu_next_rows) */
    size_t rows;
    dnnl_memory_desc_t in4, out4; /* LOWER_DENSE: the 4-d layouts the matrix maps between */
    /* oneDNN's Winograd convs: planned for CPU_WINO_GROUP tiles and run on
     * the batch that many at a time (groups > 1), each group's source and
     * destination src_step / dst_step bytes after the last's */
    int groups;
    size_t src_step, dst_step;
} layer;

/* The tiles oneDNN's AVX-512 Winograd convs are planned for. Its kernel
 * blocks the tiles of a batch by divisors of their count and sums a tile's
 * products in another order for other counts (measured on a Zen 4 EPYC:
 * batches of 1-12 and 31 differ from 32; on a Xeon 1-2), so a tile's bits
 * would depend on the batch the budget picks. Every batch runs through one
 * primitive of this many tiles instead, group after group (a plan's batch is
 * then a multiple of it: cpu_backend.c plan_batch). */
enum { CPU_WINO_GROUP = 4 };

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
    int w_levels; /* NUM_INT8: the weights' steps per side (cpu_int8_weight_levels) */
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
    int blk;       /* OP_MAXPOOL: the source's channel block (cpu_pool_blocked) */
    bool sum, relu;
    int nargs;
    dnnl_exec_arg_t args[6];
    bool conv;
    int levels;        /* conv: int8 steps of its output (255 after a ReLU, else 127) */
    void *dst;         /* the output storage, and its f32 element count */
    size_t dst_floats; /* (calibration reads the fp32 plan's outputs) */
    /* OP_PRIM planned for a group of tiles (layer.groups > 1): run groups
     * times, args[0] and args[1] (source, destination) moved on by src_step
     * and dst_step bytes from src0 / dst0 each time */
    int groups;
    size_t src_step, dst_step;
    char *src0, *dst0;
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
    int int8_levels;         /* int8 weights' steps per side (cpu_int8_weight_levels) */
    int n_conv;
    int n_refused;   /* lowerings refused at reserve (plan.n_refused) */
    gemm_memo memo;  /* rows_independent's answers, for every plan of this backend */
    tw_seg_cpu *seg; /* after seg_reserve: a segmentation model's forward (seg_cpu.h) */
    tw_backend_stats stats;
} cpu_ctx;

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

/* What cpu_run_ops records of each conv's output for int8 calibration (conv k,
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

static inline tw_status dnnl_fail(tw_error *err, dnnl_status_t s, const char *what)
{
    tw_status st = s == dnnl_out_of_memory ? TW_ERR_NOMEM : TW_ERR_INTERNAL;
    return tw_error_set(err, st, "oneDNN: %s failed: %s", what, dnnl_status2str(s));
}

#define DNNL_TRY(call, what)                                                                       \
    do {                                                                                           \
        dnnl_status_t s_ = (call);                                                                 \
        if (s_ != dnnl_success) return dnnl_fail(err, s_, what);                                   \
    } while (0)

/* A memory descriptor of pd; a missing one is a bug (never bad input). */
static inline tw_status query_md(const_dnnl_primitive_desc_t pd, dnnl_query_t what, int idx,
                                 const dnnl_memory_desc_t **out, tw_error *err)
{
    *out = dnnl_primitive_desc_query_md(pd, what, idx);
    if (!*out)
        return tw_error_set(err, TW_ERR_INTERNAL, "oneDNN: primitive lacks memory descriptor %d/%d",
                            (int)what, idx);
    return TW_OK;
}

/* ------------------------------------------------- model/cpu_plan.c */

/* Plan net for batches of `batch` tiles of `tile` px in mode (amax: the
 * int8 ranges, or NULL); sizes come from oneDNN, nothing is built. On
 * failure *p may hold a part: cpu_plan_free it either way. */
tw_status cpu_plan_build(plan *p, cpu_ctx *c, const tw_resnet *net, int tile, int batch,
                         num_mode mode, const float *amax, tw_error *err);
/* Frees what p holds and zeroes it. */
void cpu_plan_free(plan *p);
/* Total bytes reserve() takes for this plan (all through tw_alloc). */
size_t cpu_plan_bytes(const plan *p, const tw_resnet *net);
/* The oneDNN attributes a asks for, in *attr (the caller destroys them
 * after TW_OK; nothing is left to destroy on failure). */
tw_status cpu_make_attr(const attr_spec *a, dnnl_primitive_attr_t *attr, tw_error *err);
/* The channel block of md when it is fp32 nChw8c or nChw16c, else 0. */
int cpu_pool_blocked(const dnnl_memory_desc_t *md);

/* ------------------------------------------------ model/cpu_lower.c */

/* The fewest rows a lowering's GEMM is planned with: a one-row product
 * (a dense layer at batch 1) is a matrix-vector product in oneDNN, whose
 * bits differ from the GEMM's, and rows_independent cannot probe it; the
 * batches of 1 and 2 then ran those convs unlowered, in other bits than
 * every larger batch. Padding rows are computed and ignored. */
enum { GEMM_MIN_ROWS = 8 };

/* Whether md is a 4-d fp32 activation in plain nhwc order. */
bool cpu_is_nhwc(const dnnl_memory_desc_t *md);
/* Elements of one tile in activation layout md, or -1. */
dnnl_dim_t cpu_tile_elems(const dnnl_memory_desc_t *md);
/* The rows of lowering lw's GEMM before padding. */
size_t cpu_lowering_rows(const plan *p, lowering lw, int h);
/* The next row count to try after r. */
size_t cpu_next_rows(size_t r);
/* The lowering of conv c (input `in`, output layout out4, oh x oh) in plan p. */
lowering cpu_choose_lowering(const plan *p, const tw_conv *c, const act *in,
                             const dnnl_memory_desc_t *out4, int oh);
/* The matmul of lowering lw for conv c with `rows` rows. */
dnnl_status_t cpu_lowered_pd(dnnl_engine_t eng, const tw_conv *c, lowering lw, const act *in,
                             const dnnl_memory_desc_t *out4, const_dnnl_primitive_attr_t attr,
                             dnnl_dim_t rows, dnnl_primitive_desc_t *pd);
/* Whether the GEMM of pd gives a row the same bits anywhere among the
 * rows (rows_independent), remembered by shape in memo (may be NULL). */
bool cpu_gemm_kept(gemm_memo *memo, dnnl_engine_t eng, const_dnnl_primitive_desc_t pd, int lw,
                   bool sum);
/* The Toeplitz matrix [kd][ks] and bias [kd] of conv c (LOWER_DENSE). */
void cpu_dense_matrix(const tw_conv *c, const dnnl_memory_desc_t *in4,
                      const dnnl_memory_desc_t *out4, float *m, float *bias);

/* ------------------------------------------------ model/cpu_build.c */

/* Frees everything reserve built (c stays usable). Cannot fail. */
void cpu_release(cpu_ctx *c);
/* Plan and build the net in mode for batches of `batch` tiles. On failure
 * nothing stays built. consume: see build() in model/cpu_build.c. */
tw_status cpu_build_mode(cpu_ctx *c, const tw_resnet *net, tw_resnet *consume, int tile, int batch,
                         num_mode mode, const float *amax, tw_error *err);
/* Run every op on batch b; rec (fp32 plans only): record each conv's output. */
tw_status cpu_run_ops(cpu_ctx *c, const tw_infer_batch *b, calib_rec *rec, tw_error *err);

/* ------------------------------------------------- model/cpu_int8.c */

/* Scale that maps [-amax, amax] (or [0, amax]) onto s8 (u8) for range idx. */
float cpu_q_scale(const plan *p, int idx, bool nonneg);
/* The steps per side of int8 weights on isa: 127 with VNNI, else 63. */
int cpu_int8_weight_levels(dnnl_cpu_isa_t isa);
/* Per-output-channel weight scales levels / max|w| of conv c (the caller
 * tw_frees them); NULL when out of memory. */
float *cpu_weight_scales(const tw_conv *c, int levels);
/* Adds conv k's output (op o) of the batch's first rec->n tiles to rec. */
void cpu_record(const cpu_ctx *c, const op *o, int k, calib_rec *rec);
/* int8: measure the activation ranges on sample b in fp32, then build the
 * int8 plan in place of the fp32 one. */
tw_status cpu_int8_calibrate(cpu_ctx *c, const tw_infer_batch *b, tw_error *err);

#endif
