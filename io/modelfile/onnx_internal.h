/* onnx_internal.h - what the files of the ONNX reader (io/modelfile/onnx*.c)
 * share: the decoding context, the graph's values and their consumers, the
 * node and attribute helpers. onnx.c decodes the file, indexes the graph
 * and loads; onnx_attrs.c checks every attribute against the ONNX operator
 * schemas; onnx_tensors.c reads tensors (external data files too);
 * onnx_resnet.c recognises the ResNet; onnx_seg.c a segmentation network
 * (FCN, DeepLabV3, U-Net) from the same stem and blocks; onnx_meta.c reads
 * Deepness's metadata. Private to io/modelfile/ (scripts/check_layers.sh). */
#ifndef TW_IO_ONNX_INTERNAL_H
#define TW_IO_ONNX_INTERNAL_H

#include <nettle/sha2.h>
#include <onnx/onnx.pb-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "io/modelfile/model_file_impl.h"

/* Protobuf needs 2 GiB at most; a ResNet-152 is 240 MB. */
#define ONNX_MAX_FILE (2048ull << 20)
/* Nesting of messages the pre-pass allows (a model uses 6: model, graph,
 * node, attribute, tensor / type, shape, dim). */
#define ONNX_MAX_DEPTH 32
/* More nodes than any ResNet-152 export (about 1,000 with Identity and BN
 * nodes); keeps the linear lookups below cheap on hostile files. */
#define ONNX_MAX_NODES 20000
#define ONNX_MAX_VALUES (1 << 30)

/* ------------------------------------------------------------------------ */
/* Context, names, messages                                                  */

enum { V_NONE = 0, V_INIT, V_INPUT, V_NODE };

typedef struct value {
    const char *name;
    int kind;  /* V_INIT, V_INPUT, V_NODE */
    int index; /* initializer, graph input or producing node */
} value;

typedef struct octx {
    tw_model_file *mf;
    tw_error *err;
    const char *path;
    Onnx__ModelProto *model;
    Onnx__GraphProto *g;
    value *values; /* sorted by name */
    size_t n_values;
    int *canon;            /* per value: the value it aliases through Identity nodes, or itself */
    int *cons;             /* consumers (node indices), grouped by canonical value */
    int *cons_off;         /* [n_values + 1] offsets into cons */
    bool *used;            /* per node: matched */
    int cap;               /* capacity of mf->tensors */
    struct sha256_ctx sha; /* the file's digest, then external data */
    int64_t opset;
    bool seg; /* a segmentation graph (onnx_seg.c): dilated convolutions pass conv
                 geometry, the stem's ReLU may have skip readers, Shape reads no data */
} octx;

static inline const char *S(const char *s)
{
    return s ? s : "";
}

static inline bool op_is(const Onnx__NodeProto *n, const char *op)
{
    return strcmp(S(n->op_type), op) == 0;
}

/* ------------------------------------------------------------------------ */
/* onnx.c: names, messages, the graph's values and their consumers          */

/* A name fit for a one-line message: printable ASCII, cut to fit buf. */
const char *onnx_clean(const char *s, char *buf, size_t cap);

/* "node 'NAME' (OP) WHAT" - the one message naming the node that does not fit. */
tw_status onnx_node_error(octx *c, int node, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Index of value name in c->values (sorted by name); -1 when undefined. */
int onnx_find_value(const octx *c, const char *name);

/* Node n's attribute name, or NULL. */
const Onnx__AttributeProto *onnx_attr(const Onnx__NodeProto *n, const char *name);

/* The int of attribute name, def when absent. */
int64_t onnx_attr_int(const Onnx__NodeProto *n, const char *name, int64_t def);

/* The ints of attribute name into out[0..max); count in *n (0 when absent);
 * false when it has more than max. */
bool onnx_attr_ints(const Onnx__NodeProto *n, const char *name, int64_t *out, int max, int *cnt);

/* c->values (sorted by name), c->canon (through Identity nodes), the
 * consumers of each canonical value, c->used; every node input defined
 * before use. */
tw_status onnx_index_graph(octx *c);

/* Canonical value index of name; -1 when undefined. */
int onnx_val(const octx *c, const char *name);

/* How many nodes read canonical value v. */
int onnx_n_consumers(const octx *c, int v);

/* Whether canonical value v is an output of the graph. */
bool onnx_is_graph_output(const octx *c, int v);

/* The one node reading value v (output of node `from`, for messages).
 * Anything else - no reader, two readers - is refused. */
tw_status onnx_next_node(octx *c, int v, int from, const char *expect, int *out);

/* The canonical value of node n's output 0; others must be unused. */
tw_status onnx_out0(octx *c, int node, int *v);

/* ------------------------------------------------------------------------ */
/* onnx_attrs.c: attributes                                                  */

/* Every attribute of node `node` is one its operator defines at the
 * model's opset, of its type, given once, and a value tilewise runs (or
 * one the matcher checks against the node's place). The first that is not
 * is refused, naming the node, the attribute and its value. */
tw_status onnx_check_attrs(octx *c, int node);

/* Node n's attribute name as "name = value" for the matcher's messages. */
const char *onnx_attr_show(const Onnx__NodeProto *n, const char *name, char *buf, size_t cap);

/* ------------------------------------------------------------------------ */
/* onnx_tensors.c: tensors                                                   */

/* The constant behind value name (an initializer, or a Constant node's
 * value, through Identity nodes), or NULL. */
const Onnx__TensorProto *onnx_constant(const octx *c, const char *name);

/* tp's values as float32 in a new buffer (TW_MEM_WEIGHTS); its dims into
 * shape (at most 4), count into *ndim. what names it in messages. */
tw_status onnx_tensor_floats(octx *c, const Onnx__TensorProto *tp, const char *what, float **out,
                             int64_t shape[4], int *ndim);

/* Up to max int64 values of a constant (shapes, axes). */
bool onnx_tensor_ints(const Onnx__TensorProto *tp, int64_t *out, int max, int *n);

/* Append a tensor called name (owning data) to mf. */
tw_status onnx_add_tensor(octx *c, const char *name, float *data, int ndim, const int64_t *shape);

/* ------------------------------------------------------------------------ */
/* onnx_resnet.c: the ResNet's pieces, shared with onnx_seg.c                */

/* A convolution as it is taken, its batch norm folded. */
typedef struct onnx_conv {
    int node;
    int k, stride, pad, dil, group, cin, cout;
    float *w, *b; /* folded; owned until emitted */
    int64_t wshape[4];
    int out;  /* canonical value after the conv (and its BN) */
    int last; /* the node that produced out (conv or BN) */
} onnx_conv;

/* The kind of block seen so far: 0 unknown, 2 basic, 3 bottleneck. */
typedef struct onnx_blocks {
    int kind;
    int stage, idx; /* where the next block goes */
    int n;
} onnx_blocks;

/* One residual block as it is taken: its main path, its projection (down.w
 * NULL without one) and the Add that joins them. */
typedef struct onnx_block {
    onnx_conv path[3], down;
    int np;     /* convolutions on the main path */
    int kind;   /* 2: basic, 3: bottleneck */
    int add;    /* the Add node */
    int stride; /* the block's stride */
} onnx_block;

void onnx_conv_free(onnx_conv *cv);

/* Node `node` as a Conv (weight constant, optional bias) followed by an
 * optional BatchNormalization, folded into cv->w, cv->b. Dilations other
 * than 1 only when c->seg (the caller checks them against the place). */
tw_status onnx_take_conv(octx *c, int node, onnx_conv *cv);

/* Emit cv as NAME.weight and BN_NAME.{weight,bias,running_mean,running_var}
 * (model_file.h: the batch norm an exact identity around the folded bias);
 * cv's buffers move into the model file. */
tw_status onnx_emit_conv(octx *c, onnx_conv *cv, const char *name, const char *bn_name);

/* Node `node` must be a Relu reading value v; its output into *out. */
tw_status onnx_take_relu(octx *c, int node, int v, int *out);

/* The single reader of cv's output, or -1. */
int onnx_after(const octx *c, const onnx_conv *cv);

/* The stem from the graph input x (conv1, bn1, ReLU, max-pool); the
 * max-pool's output into *out. With c->seg the stem's ReLU
 * may have other readers (a U-Net's skip) and the stem must be 7x7. */
tw_status onnx_match_stem(octx *c, int x, int *out);

/* A block's convolutions from its first conv main_node and its projection
 * down_node (-1: none), then its shape against the blocks before it. */
tw_status onnx_block_paths(octx *c, int main_node, int down_node, onnx_block *b);
tw_status onnx_block_joins(octx *c, const onnx_blocks *bs, int x, const onnx_block *b);

/* The block's Add and ReLU (output into *out), then its tensors under
 * torchvision's names (layerS.I.convN, layerS.I.downsample). */
tw_status onnx_block_emit(octx *c, const onnx_blocks *bs, onnx_block *b, int *out);

/* The graph's one image input: its value into *x, its channels (0 when not
 * fixed) into *in_c; sets c->mf->onnx.input_size when fixed and square;
 * mf->tensors allocated for five tensors per convolution. */
tw_status onnx_graph_input(octx *c, int *x, int64_t *in_c);

/* ------------------------------------------------------------------------ */
/* onnx_resnet.c, onnx_seg.c, onnx_meta.c                                   */

/* The graph recognised as a ResNet (the two passes of onnx.c's comment):
 * its tensors into c->mf under torchvision's names. */
tw_status onnx_recognise(octx *c);

/* The graph recognised as a segmentation network (onnx_seg.c; called by
 * onnx_recognise for a graph with Resize or Concat nodes): torchvision's
 * FCN / DeepLabV3 (backbone.*, classifier.*) or SMP's U-Net (encoder.*,
 * decoder.blocks.*, segmentation_head.*), the tensors model/segnet.c reads. */
tw_status onnx_recognise_seg(octx *c);

/* Deepness's metadata_props (model_type, class_names, resolution, ...)
 * into c->mf->onnx and the model file's fields. */
tw_status onnx_read_metadata(octx *c);

#endif
