/* onnx_internal.h - what the files of the ONNX reader (io/modelfile/onnx*.c)
 * share: the decoding context, the graph's values and their consumers, the
 * node and attribute helpers. onnx.c decodes the file, indexes the graph
 * and loads; onnx_attrs.c checks every attribute against the ONNX operator
 * schemas; onnx_tensors.c reads tensors (external data files too);
 * onnx_resnet.c recognises the ResNet; onnx_meta.c reads Deepness's
 * metadata. Private to io/modelfile/ (scripts/check_layers.sh). */
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
/* onnx_resnet.c, onnx_meta.c                                                */

/* The graph recognised as a ResNet (the two passes of onnx.c's comment):
 * its tensors into c->mf under torchvision's names. */
tw_status onnx_recognise(octx *c);

/* Deepness's metadata_props (model_type, class_names, resolution, ...)
 * into c->mf->onnx and the model file's fields. */
tw_status onnx_read_metadata(octx *c);

#endif
