/* resnet.h - a torchvision ResNet as a list of convolutions, batch-norm folded.
 *
 * Built from the tensors of a tw_model_file: depth (18/34/50/101/152),
 * bottleneck or basic blocks, input bands (conv1.weight dim 1), widths and
 * classes (fc.weight dim 0) all come from the tensor shapes, so any band
 * count, width and class count works. Every Conv+BN pair is folded into one
 * convolution with bias:  w' = w * gamma / sqrt(var + eps),
 * b' = beta - mean * gamma / sqrt(var + eps)   (eps = 1e-5, as torchvision).
 *
 * Forward semantics (what every backend must compute, fp32 reference):
 *   x = relu(stem(x)); x = maxpool3x3s2p1(x)
 *   for each block: y = relu(c1(x)); [bottleneck: y = relu(c2(y)); y = c3(y)]
 *                   [basic: y = c2(y)]; s = has_down ? down(x) : x; x = relu(y + s)
 *   f = global average pool(x) -> feat_dim features ("embeddings")
 *   logits = fc_w f + fc_b; probs = softmax(logits)
 */
#ifndef TW_RESNET_H
#define TW_RESNET_H

#include <stdbool.h>

#include "io/model_file.h"
#include "core/error.h"

typedef struct tw_conv {
    int cin, cout, k, stride, pad;
    float *w; /* [cout][cin][k][k] (OIHW), BN folded */
    float *b; /* [cout] */
} tw_conv;

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
    int feat_dim; /* channels after the last stage (512 or 2048 for standard widths) */
    tw_conv stem; /* conv1 7x7 s2 p3 + bn1 */
    tw_block *blocks;
    int n_blocks;
    int stage_blocks[4]; /* blocks per stage, e.g. 2,2,2,2 */
    float *fc_w;         /* [n_classes][feat_dim] */
    float *fc_b;         /* [n_classes] */
    size_t weight_bytes; /* bytes of all folded weights */
} tw_resnet;

/* Build a folded ResNet from mf. arch ("resnet18".. or "" to infer from the
 * tensor names/shapes) must agree with the tensors, else TW_ERR_MODEL naming
 * both sides. Missing tensors and wrong shapes are TW_ERR_MODEL naming the
 * tensor. The result owns copies of the weights (TW_MEM_WEIGHTS); mf may be
 * destroyed afterwards. */
tw_status tw_resnet_create(const tw_model_file *mf, const char *arch, tw_resnet **out,
                           tw_error *err);
void tw_resnet_destroy(tw_resnet *net);

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

#endif
