/* segnet.h - segmentation networks with a ResNet encoder, as a small op
 * graph over numbered values, batch norm folded.
 *
 * Built from the tensors of a tw_model_file (the names say which network):
 *  - torchvision fcn_resnet50/101 and deeplabv3_resnet50/101: backbone.* (a
 *    bottleneck ResNet whose layer3 and layer4 trade their stride for
 *    dilation, as replace_stride_with_dilation=[False, True, True]: output
 *    stride 8) and classifier.*; aux_classifier.* is read and ignored.
 *      FCN head:  classifier.0 conv3x3 (+ .1 BN, ReLU), .4 conv1x1 + bias.
 *      DeepLabV3: classifier.0 = ASPP: convs.0 1x1, convs.1..3 3x3 dilated
 *        12/24/36, convs.4 image pooling (global average, 1x1 conv, then a
 *        bilinear resize of the 1x1 map, i.e. a broadcast), each + BN + ReLU,
 *        concatenated (5 x 256) and projected (project.0 1x1 + .1 BN + ReLU);
 *        classifier.1 conv3x3 + .2 BN + ReLU; .4 conv1x1 + bias.
 *      Then the logits are resized to the tile, bilinear, align_corners=False.
 *  - U-Net with a ResNet-18/34/50/101 encoder as segmentation_models_pytorch
 *    writes it (unet_resnet34 ...): encoder.* (a torchvision ResNet without
 *    fc), decoder.blocks.N.conv1.{0,1}.* and conv2.{0,1}.* (conv3x3 without
 *    bias + BN + ReLU), segmentation_head.0.* (conv3x3 + bias). Features at
 *    strides 2 (conv1/bn1/relu), 4 (layer1), 8, 16, 32 (layer4); each of the
 *    five decoder blocks doubles the map (nearest), concatenates the skip
 *    [upsampled, skip] (none for the last) and runs conv1, conv2. Widths come
 *    from the tensors.
 * Every network ends in a softmax over the classes: the graph's output is
 * per-pixel probabilities [classes][tile][tile] per tile.
 * Input bands (conv1's dim 1) and classes (the last conv's dim 0) are free.
 * Dropout is the identity (eval).
 */
#ifndef TW_SEGNET_H
#define TW_SEGNET_H

#include <stdbool.h>
#include <stddef.h>

#include "io/modelfile/model_file.h"
#include "model/resnet.h"
#include "core/error.h"

typedef enum {
    TW_SEG_FCN = 0,   /* torchvision FCN */
    TW_SEG_DEEPLABV3, /* torchvision DeepLabV3 */
    TW_SEG_UNET,      /* segmentation_models_pytorch Unet */
} tw_seg_kind;

typedef enum {
    TW_SEG_OP_CONV,     /* conv (+ bias) [+ the value `add`] [+ ReLU]: src[0] -> dst */
    TW_SEG_OP_MAXPOOL,  /* 3x3 max pool, stride 2, padding 1 */
    TW_SEG_OP_AVGPOOL,  /* global average pool: h x h -> 1 x 1 */
    TW_SEG_OP_BILINEAR, /* bilinear resize (align_corners=False) to the side of `like` */
    TW_SEG_OP_NEAREST2, /* nearest-neighbour x2 */
    TW_SEG_OP_CONCAT,   /* channel concatenation of src[0..n_src) in that order */
    TW_SEG_OP_SOFTMAX,  /* softmax over channels at every pixel */
} tw_seg_op_kind;

enum { TW_SEG_MAX_SRC = 5, TW_SEG_VAL_IN = 0 };

typedef struct tw_seg_op {
    tw_seg_op_kind kind;
    int src[TW_SEG_MAX_SRC];
    int n_src;
    int dst;
    int add;       /* CONV: the value added before the ReLU (a residual), else -1 */
    bool relu;     /* CONV: ends in a ReLU */
    tw_conv conv;  /* CONV: folded weights and bias; cin, cout, k, stride, pad */
    int dil;       /* CONV: dilation (1: none); pad already includes it */
    int like;      /* BILINEAR: the value whose side the result takes */
    char name[64]; /* the PyTorch module, e.g. "backbone.layer3.1.conv2", "classifier.0.convs.4" */
} tw_seg_op;

typedef struct tw_segnet {
    tw_seg_kind kind;
    char arch[32]; /* "fcn_resnet50", "deeplabv3_resnet101", "unet_resnet34", ... */
    int depth;     /* of the ResNet encoder */
    int in_bands, n_classes;
    tw_seg_op *ops; /* in execution order; op i defines value ops[i].dst */
    int n_ops, cap_ops;
    int n_values; /* value 0 is the input (TW_SEG_VAL_IN) */
    int out;      /* the probabilities' value (the last op's dst) */
    int multiple; /* a tile side must be a multiple of this (32 for U-Net, else 1) */
    size_t weight_bytes;
} tw_segnet;

/* Build a folded network from mf. arch: "" (the tensors say) or one of
 * fcn_resnet50, fcn_resnet101, deeplabv3_resnet50, deeplabv3_resnet101,
 * unet_resnet18, unet_resnet34, unet_resnet50, unet_resnet101, which must
 * agree with the tensors. TW_ERR_MODEL naming the tensor when one is missing
 * or has the wrong shape, naming the first foreign key (a tensor that is no
 * part of the detected layout; aux_classifier.* aside), or naming both sides
 * of a disagreement. The result owns copies of the weights; mf may be
 * destroyed afterwards. Thread-safe (mf is only read). */
tw_status tw_segnet_create(const tw_model_file *mf, const char *arch, tw_segnet **out,
                           tw_error *err);

/* Release; accepts NULL. */
void tw_segnet_destroy(tw_segnet *net);

/* Whether mf's tensors are a segmentation layout (backbone.* with
 * classifier.*, or encoder.* with decoder.blocks.*): tw_segnet_create then
 * builds it or says what is wrong. Cannot fail. */
bool tw_segnet_detect(const tw_model_file *mf);

/* The channels c[v] and side h[v] of every value v (n_values entries each)
 * for tiles of tile x tile pixels. TW_ERR_CONFIG naming the tile when a map
 * would vanish or the concatenated maps of a U-Net disagree (the tile is not
 * a multiple of net->multiple). Allocates nothing. */
tw_status tw_segnet_shapes(const tw_segnet *net, int tile, int *c, int *h, tw_error *err);

/* The index of the op that last reads each value (last[v]; -1: never read;
 * the output counts as read by a virtual op n_ops). Allocates nothing. */
void tw_segnet_last_use(const tw_segnet *net, int *last);

#endif
