/* resnet.h - a torchvision ResNet as a list of convolutions, batch-norm folded.
 *
 * Built from the tensors of a tw_model_file: depth (18/34/50/101/152),
 * bottleneck or basic blocks, input bands (conv1.weight dim 1), widths and
 * classes (fc.weight dim 0) all come from the tensor shapes, so any band
 * count, width and class count works. The torchvision family too:
 *  - ResNeXt (resnext50_32x4d, resnext101_32x8d, resnext101_64x4d): the
 *    bottleneck's 3x3 conv2 is grouped, weight [width][width/groups][3][3];
 *    groups = width / that dim 1;
 *  - Wide ResNet (wide_resnet50_2, wide_resnet101_2): bottlenecks twice as
 *    wide (layer1's width 128 for 64 planes);
 *  - the small stem (tw_stem, model.stem): conv1 3x3 stride 1 padding 1 and
 *    no max pool, for small patches; any depth. conv1's kernel (7 or 3)
 *    says which stem a file has; a declared stem must agree. Every Conv+BN pair is folded into one
 * convolution with bias:  w' = w * gamma / sqrt(var + eps),
 * b' = beta - mean * gamma / sqrt(var + eps)   (eps = 1e-5, as torchvision).
 *
 * Forward semantics (what every backend must compute, fp32 reference):
 *   x = relu(stem(x)); x = maxpool3x3s2p1(x)   [standard stem only]
 *   for each block: y = relu(c1(x)); [bottleneck: y = relu(c2(y)); y = c3(y)]
 *                   [basic: y = c2(y)]; s = has_down ? down(x) : x; x = relu(y + s)
 *   f = global average pool(x) -> feat_dim features ("embeddings")
 *   logits = fc_w f + fc_b; probs = softmax(logits)
 * tw_resnet_walk hands these steps, with their shapes, to every backend and
 * to the reference, so the graph is written down once, here.
 */
#ifndef TW_RESNET_H
#define TW_RESNET_H

#include <stdbool.h>

#include "io/modelfile/model_file.h"
#include "core/error.h"

typedef struct tw_conv {
    int cin, cout, k, stride, pad;
    /* 1, or a grouped conv (ResNeXt's conv2): input and output channels in
     * `groups` equal parts, output part g reads input part g only */
    int groups;
    float *w; /* [cout][cin / groups][k][k] (OIHW, per group: GOIHW), BN folded */
    float *b; /* [cout] */
} tw_conv;

/* Which member of the torchvision ResNet family a net is (tw_resnet_create
 * names it from the shapes). */
typedef enum {
    TW_FAMILY_RESNET = 0, /* resnet18..152 (any widths) */
    TW_FAMILY_RESNEXT,    /* grouped bottlenecks */
    TW_FAMILY_WIDE,       /* wide_resnet: bottlenecks of a multiple of 64 wide, one group */
} tw_resnet_family;

typedef struct tw_block {
    tw_conv c1, c2, c3; /* c3 only in bottleneck blocks */
    bool has_down;
    tw_conv down; /* 1x1 projection of the shortcut */
} tw_block;

typedef struct tw_resnet {
    int depth; /* 18, 34, 50, 101, 152 */
    bool bottleneck;
    int in_bands;
    int n_classes;
    int feat_dim;  /* channels after the last stage (512 or 2048 for standard widths) */
    bool headless; /* no fc in the file: a stand-in one-class head of zeros (embeddings only) */
    tw_resnet_family family;
    int groups;        /* conv2's groups in every bottleneck (1: ResNet, Wide ResNet) */
    int base_width;    /* torchvision's width_per_group: layer1's conv2 width / groups
                          (64 ResNet, 128 Wide-50-2, 4 ResNeXt-50 32x4d) */
    tw_stem stem_kind; /* TW_STEM_STANDARD or TW_STEM_SMALL (never AUTO) */
    tw_conv stem;      /* conv1 + bn1: 7x7 s2 p3 (standard) or 3x3 s1 p1 (small) */
    tw_block *blocks;
    int n_blocks;
    int stage_blocks[4]; /* blocks per stage, e.g. 2,2,2,2 */
    float *fc_w;         /* [n_classes][feat_dim] */
    float *fc_b;         /* [n_classes] */
    size_t weight_bytes; /* bytes of all folded weights */
} tw_resnet;

/* Build a folded ResNet from mf. arch ("resnet18".., "resnext50_32x4d",
 * "wide_resnet50_2", ... or "" to infer from the tensor names/shapes) must
 * agree with the tensors, else TW_ERR_MODEL naming both sides; so must the
 * stem mf declares (mf->stem, unless AUTO) with conv1's kernel. Missing tensors and wrong shapes
 * are TW_ERR_MODEL naming the tensor. The result owns copies of the weights (TW_MEM_WEIGHTS); mf
 * may be destroyed afterwards. */
tw_status tw_resnet_create(const tw_model_file *mf, const char *arch, tw_resnet **out,
                           tw_error *err);
void tw_resnet_destroy(tw_resnet *net);

/* The torchvision name of net's architecture: "resnet50", "resnext50_32x4d"
 * (depth, groups x base width), "wide_resnet50_2" (base width / 64). Writes
 * at most size bytes. Cannot fail. */
void tw_resnet_arch_name(const tw_resnet *net, char *buf, size_t size);

/* "resnet", "resnext" or "wide_resnet". */
const char *tw_resnet_family_name(tw_resnet_family f);

/* TW_OK when the stem `want` (AUTO accepts any) is net's, else TW_ERR_MODEL
 * naming conv1's kernel and `who` declared otherwise ("model.stem"; path:
 * the model file, for the message). Cannot fail otherwise. */
tw_status tw_resnet_check_stem(const tw_resnet *net, tw_stem want, const char *path,
                               const char *who, tw_error *err);

/* Free the weights and bias of conv, one of net's convolutions (its w and b
 * become NULL; shapes, the other convs and fc stay), once a backend holds
 * its own copy. weight_bytes keeps its value (what the net needed). */
void tw_resnet_release_conv(tw_resnet *net, const tw_conv *conv);

/* The classifier head, the same for every backend that computes it on the
 * host and for the reference: logits = fc_w . feat + fc_b accumulated in
 * double, softmax with the maximum subtracted. feat [n][feat_dim] pooled
 * features, fc_w [n_classes][feat_dim], fc_b [n_classes] -> probs
 * [n][n_classes]. Cannot fail; allocates nothing. */
void tw_resnet_head(const float *fc_w, const float *fc_b, int n_classes, int feat_dim,
                    const float *feat, int n, float *probs);

/* Spatial size after the stem+maxpool and each stage, for an input of tile
 * pixels (used for workspace estimates). */
int tw_resnet_out_size(int in, int k, int stride, int pad);

/* ---- Tensor readers shared with model/segnet.c ---- */

/* The tensor called name in mf, checked against shape want[0..ndim) (a
 * negative entry accepts any positive size): TW_ERR_MODEL naming the tensor
 * when missing, of another shape or without data. *out is borrowed from mf. */
tw_status tw_resnet_get_tensor(const tw_model_file *mf, const char *name, int ndim,
                               const int64_t *want, const tw_tensor **out, tw_error *err);

/* Read conv `prefix`.weight ([*][cin / groups][k][k]) and its batch norm
 * `bn_prefix`.{weight,bias,running_mean,running_var}, fold them into c
 * (allocating c->w and c->b, TW_MEM_WEIGHTS; *bytes grows by their size).
 * Errors name the tensor (TW_ERR_MODEL) or are TW_ERR_NOMEM; c may then
 * hold allocations the caller frees. */
tw_status tw_resnet_load_conv_bn(const tw_model_file *mf, const char *prefix, const char *bn_prefix,
                                 int cin, int groups, int k, int stride, int pad, tw_conv *c,
                                 size_t *bytes, tw_error *err);

/* The depth (18/34/50/101/152) of a torchvision layout of blocks[s] blocks
 * per stage, basic or bottleneck; 0 when it matches none. */
int tw_resnet_layout_depth(const int blocks[4], bool bottleneck);

/* ---- The forward graph, walked once for every backend ---- */

/* What one step of the forward pass computes. */
typedef enum {
    TW_RESNET_OP_STEM,     /* conv1 (bn1 folded) + ReLU: IN -> STEM (small stem: IN -> X) */
    TW_RESNET_OP_MAXPOOL,  /* 3x3 max pool, stride 2, padding 1: STEM -> X (standard stem) */
    TW_RESNET_OP_SHORTCUT, /* a block's projection (downsample.0, bn folded), no ReLU: X -> SC */
    TW_RESNET_OP_CONV,     /* a block's inner conv + ReLU: conv1 X -> T1; a bottleneck's
                              conv2 T1 -> T2 */
    TW_RESNET_OP_RESIDUAL, /* a block's last conv (basic conv2, bottleneck conv3), plus the
                              shortcut (add), then ReLU: T1 or T2 -> X */
    TW_RESNET_OP_AVGPOOL,  /* global average pool: X -> FEAT (feat_dim, the embeddings) */
    TW_RESNET_OP_FC        /* the head, fc + softmax (tw_resnet_head): FEAT -> PROBS */
} tw_resnet_op_kind;

/* The values the steps pass on (an op's src, dst, add). X is a block's
 * input and, once its RESIDUAL has run, its output. */
typedef enum {
    TW_RESNET_VAL_NONE = -1,
    TW_RESNET_VAL_IN,    /* the input tiles: in_bands x tile x tile */
    TW_RESNET_VAL_STEM,  /* the stem's output */
    TW_RESNET_VAL_X,     /* the running activation */
    TW_RESNET_VAL_SC,    /* a block's projected shortcut */
    TW_RESNET_VAL_T1,    /* a block's conv1 output */
    TW_RESNET_VAL_T2,    /* a bottleneck's conv2 output */
    TW_RESNET_VAL_FEAT,  /* pooled features, feat_dim per tile */
    TW_RESNET_VAL_PROBS, /* class probabilities, n_classes per tile */
    TW_RESNET_VAL_COUNT
} tw_resnet_val;

typedef struct tw_resnet_op {
    tw_resnet_op_kind kind;
    const tw_conv *conv; /* STEM, SHORTCUT, CONV, RESIDUAL: the folded conv; else NULL */
    tw_resnet_val src;   /* what the op reads */
    tw_resnet_val dst;   /* what it writes */
    tw_resnet_val add;   /* RESIDUAL: the shortcut added before the ReLU (SC with a
                            projection, else X itself); else TW_RESNET_VAL_NONE */
    bool relu;           /* a ReLU ends the op (for RESIDUAL: after the add) */
    int block;           /* index into net->blocks; -1 outside the blocks */
    int c_in, h_in;      /* input channels and side: maps are square, as tiles are */
    int c_out, h_out;    /* output channels and side (AVGPOOL: 1x1; FC: n_classes) */
    /* The same dataflow in three activation buffers 0..2, chosen so that no
     * op writes over its own input or over a shortcut still to be added
     * (for a backend that keeps activations that way: CUDA, the reference);
     * -1 for a value outside them (IN, FEAT, PROBS, no add). */
    int buf_src, buf_dst, buf_add;
    char name[48]; /* torchvision's module: "conv1", "maxpool", "layer2.0.conv1",
                      "layer2.0.downsample.0", "avgpool", "fc" */
} tw_resnet_op;

/* Called once per op; a status other than TW_OK stops the walk. */
typedef tw_status (*tw_resnet_visit_fn)(void *user, const tw_resnet_op *op, tw_error *err);

/* Walk the forward pass of net for tiles of tile x tile pixels, calling
 * visit(user, op, err) for each op in the order every backend computes
 * them:
 *   STEM, MAXPOOL (standard stem only: a small stem's STEM writes X),
 *   per block: [SHORTCUT (a projection)], CONV (conv1), [CONV (conv2 of a
 *              bottleneck)], RESIDUAL,
 *   AVGPOOL, FC.
 * The projection comes first so that a backend can add the residual into
 * the shortcut's storage (oneDNN's sum post-op): the CPU plan's primitives
 * are in this order. Shapes follow tw_resnet_out_size; for a tile too small
 * they can reach 0 or below: the walk does not fail on them, a visitor that
 * needs a real map checks. Returns TW_OK, or the first status visit
 * returned that was not TW_OK. op is valid during the call only. Allocates
 * nothing; thread-safe (net is only read). */
tw_status tw_resnet_walk(const tw_resnet *net, int tile, tw_resnet_visit_fn visit, void *user,
                         tw_error *err);

#endif
