/* onnx.c - ONNX model files: a ResNet graph mapped onto torchvision's tensors
 * (see model_file.h, tw_onnx_info).
 *
 * The file is decoded by the C code protoc-c generates at build time from
 * Debian's onnx.proto (io/modelfile/onnx_proto.cmake), after a pass over the wire
 * format that bounds the nesting of messages (protobuf-c recurses once per
 * level). Every byte is distrusted: tensor sizes against their dims,
 * external data files against their size (and their path kept inside the
 * model's folder), every node's inputs defined before use.
 *
 * The graph is recognised by data flow, never by names, in two passes:
 *   1. the first node (in the file's order, which ONNX requires to be
 *      topological) whose operator is not one a ResNet is made of is
 *      refused, naming it: Conv, BatchNormalization, Relu, MaxPool, Add,
 *      GlobalAveragePool / ReduceMean, Flatten / Reshape / Squeeze,
 *      Gemm / MatMul + Add, Softmax (and Identity, Constant);
 *   2. from the graph's one input: the stem (Conv [BN] Relu MaxPool), then
 *      residual blocks (a main path of 2 or 3 Conv [BN] with Relu between,
 *      an Add with the block's input or its 1x1 projection, Relu) until the
 *      pooling, then the head (Gemm, or MatMul + Add, optional Softmax).
 *      Each convolution's size, stride and padding must be torchvision's
 *      for its place (model/resnet.c assumes them); a node that does not fit
 *      is refused, naming it.
 * Stages are counted from the stride-2 blocks, and the tensors get the
 * names a torchvision state_dict has (layer2.0.downsample.0.weight, ...), so
 * model/resnet.c builds the net as from safetensors.
 *
 * The family: grouped convolutions (ResNeXt) keep torchvision's weight
 * shapes, so the groups come from them; a small-patch stem (3x3 stride-1
 * conv1, no max-pool) is read from conv1's kernel; a graph that ends at its
 * pooled features is a headless backbone (embedding products only).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <nettle/sha2.h>
#include <onnx/onnx.pb-c.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/half.h"
#include "io/modelfile/model_file_impl.h"
#include "io/modelfile/readers.h"

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
/* Wire-format pre-pass: nesting depth and well-formedness, iteratively.     */

static bool read_varint(const uint8_t *p, size_t n, size_t *pos, uint64_t *v)
{
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*pos >= n) return false;
        uint8_t b = p[(*pos)++];
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = r;
            return true;
        }
    }
    return false;
}

/* true when buf[0..n) is a well-formed message of desc whose sub-messages
 * nest at most ONNX_MAX_DEPTH deep. */
static bool wire_ok(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t n)
{
    struct frame {
        const ProtobufCMessageDescriptor *d;
        size_t end;
    } stack[ONNX_MAX_DEPTH];
    int depth = 0;
    stack[0].d = desc;
    stack[0].end = n;
    size_t pos = 0;
    for (;;) {
        while (depth >= 0 && pos == stack[depth].end) depth--;
        if (depth < 0) return true;
        uint64_t key, v;
        if (!read_varint(buf, stack[depth].end, &pos, &key)) return false;
        unsigned wt = (unsigned)(key & 7);
        uint64_t tag = key >> 3;
        if (tag == 0 || tag > 0x1fffffff) return false;
        switch (wt) {
        case 0:
            if (!read_varint(buf, stack[depth].end, &pos, &v)) return false;
            break;
        case 1:
            if (stack[depth].end - pos < 8) return false;
            pos += 8;
            break;
        case 5:
            if (stack[depth].end - pos < 4) return false;
            pos += 4;
            break;
        case 2: {
            if (!read_varint(buf, stack[depth].end, &pos, &v)) return false;
            if (v > stack[depth].end - pos) return false;
            const ProtobufCFieldDescriptor *f =
                protobuf_c_message_descriptor_get_field(stack[depth].d, (unsigned)tag);
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
                if (depth + 1 >= ONNX_MAX_DEPTH) return false;
                depth++;
                stack[depth].d = f->descriptor;
                stack[depth].end = pos + (size_t)v;
            } else {
                pos += (size_t)v;
            }
            break;
        }
        default: return false; /* groups (3, 4) are not in onnx.proto */
        }
    }
}

/* protobuf-c's allocations through the counting allocator. */
static void *pb_alloc(void *data, size_t size)
{
    (void)data;
    return tw_alloc(TW_MEM_OTHER, size ? size : 1);
}

static void pb_free(void *data, void *p)
{
    (void)data;
    tw_free(p);
}

static ProtobufCAllocator k_pb_allocator = {pb_alloc, pb_free, NULL};

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

static const char *S(const char *s)
{
    return s ? s : "";
}

/* A name fit for a one-line message: printable ASCII, cut to fit buf. */
static const char *clean(const char *s, char *buf, size_t cap)
{
    size_t o = 0;
    s = S(s);
    for (; *s && o + 4 < cap; s++) buf[o++] = (*s >= 0x20 && *s < 0x7f) ? *s : '?';
    if (*s) {
        buf[o++] = '.';
        buf[o++] = '.';
        buf[o++] = '.';
    }
    buf[o] = '\0';
    return buf;
}

static tw_status node_error(octx *c, int node, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* "node 'NAME' (OP) WHAT" - the one message naming the node that does not fit. */
static tw_status node_error(octx *c, int node, const char *fmt, ...)
{
    char what[512], nb[96], ob[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const Onnx__NodeProto *n = c->g->node[node];
    char idx[32] = "";
    if (!n->name || !*n->name) snprintf(idx, sizeof idx, " #%d", node);
    return tw_model_error(c->err, c->path, "node '%s'%s (%s) %s", clean(n->name, nb, sizeof nb),
                          idx, clean(n->op_type, ob, sizeof ob), what);
}

static int cmp_value(const void *a, const void *b)
{
    return strcmp(((const value *)a)->name, ((const value *)b)->name);
}

static int find_value(const octx *c, const char *name)
{
    size_t lo = 0, hi = c->n_values;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int r = strcmp(c->values[mid].name, name);
        if (r == 0) return (int)mid;
        if (r < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

static bool op_is(const Onnx__NodeProto *n, const char *op)
{
    return strcmp(S(n->op_type), op) == 0;
}

static const Onnx__AttributeProto *attr(const Onnx__NodeProto *n, const char *name)
{
    for (size_t i = 0; i < n->n_attribute; i++)
        if (strcmp(S(n->attribute[i]->name), name) == 0) return n->attribute[i];
    return NULL;
}

static int64_t attr_int(const Onnx__NodeProto *n, const char *name, int64_t def)
{
    const Onnx__AttributeProto *a = attr(n, name);
    return a && a->has_i ? a->i : def;
}

/* The ints of attribute name into out[0..max); count in *n (0 when absent);
 * false when it has more than max. */
static bool attr_ints(const Onnx__NodeProto *n, const char *name, int64_t *out, int max, int *cnt)
{
    const Onnx__AttributeProto *a = attr(n, name);
    *cnt = 0;
    if (!a) return true;
    if (a->n_ints > (size_t)max) return false;
    for (size_t i = 0; i < a->n_ints; i++) out[i] = a->ints[i];
    *cnt = (int)a->n_ints;
    return true;
}

/* ------------------------------------------------------------------------ */
/* Attributes: every one the ONNX operators define, and what the plan runs   */

/* What tilewise does with an attribute's value. */
enum {
    A_MATCHED, /* geometry or layout: checked where the node is matched, against its place */
    A_ANY,     /* any value runs the same (momentum: training only; Constant's value) */
    A_ZERO,    /* 0 only (an int) */
    A_ONE,     /* 1 only (an int) */
    A_BOOL,    /* 0 or 1 (an int); the matcher honours both */
    A_ONES,    /* every int 1 (dilations) */
    A_FINITE,  /* a finite float, folded into the weights (Gemm's alpha and beta) */
    A_NOTSET,  /* auto_pad NOTSET only (explicit pads) */
    A_NEVER,   /* defined by ONNX, not run by tilewise (a Constant's other forms) */
};

typedef struct attr_rule {
    const char *op, *name;
    int type;         /* ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__* */
    int since, until; /* the opsets that define it (until 0: all since) */
    int rule;         /* A_* */
    const char *want; /* for messages: what tilewise runs */
} attr_rule;

#define AT(x) ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__##x
/* From the ONNX operator schemas (onnx.defs) for opsets 7 to 22; the ops
 * recognise() accepts and no others. Relu, Add, GlobalAveragePool, MatMul
 * and Identity define no attribute. */
static const attr_rule k_attr_rules[] = {
    {"Conv", "auto_pad", AT(STRING), 1, 0, A_MATCHED, NULL},
    {"Conv", "dilations", AT(INTS), 1, 0, A_ONES, "[1, 1]"},
    {"Conv", "group", AT(INT), 1, 0, A_MATCHED, NULL},
    {"Conv", "kernel_shape", AT(INTS), 1, 0, A_MATCHED, NULL},
    {"Conv", "pads", AT(INTS), 1, 0, A_MATCHED, NULL},
    {"Conv", "strides", AT(INTS), 1, 0, A_MATCHED, NULL},
    {"BatchNormalization", "epsilon", AT(FLOAT), 1, 0, A_MATCHED, NULL},
    {"BatchNormalization", "momentum", AT(FLOAT), 1, 0, A_ANY, NULL},
    {"BatchNormalization", "spatial", AT(INT), 1, 8, A_ONE, "1"},
    {"BatchNormalization", "training_mode", AT(INT), 14, 0, A_ZERO, "0"},
    {"MaxPool", "auto_pad", AT(STRING), 1, 0, A_NOTSET, "'NOTSET'"},
    {"MaxPool", "ceil_mode", AT(INT), 10, 0, A_ZERO, "0"},
    {"MaxPool", "dilations", AT(INTS), 10, 0, A_ONES, "[1, 1]"},
    {"MaxPool", "kernel_shape", AT(INTS), 1, 0, A_MATCHED, NULL},
    {"MaxPool", "pads", AT(INTS), 1, 0, A_MATCHED, NULL},
    {"MaxPool", "storage_order", AT(INT), 8, 0, A_ZERO, "0"},
    {"MaxPool", "strides", AT(INTS), 1, 0, A_MATCHED, NULL},
    {"ReduceMean", "axes", AT(INTS), 1, 17, A_MATCHED, NULL},
    {"ReduceMean", "keepdims", AT(INT), 1, 0, A_BOOL, "0 or 1"},
    {"ReduceMean", "noop_with_empty_axes", AT(INT), 18, 0, A_BOOL, "0 or 1"},
    {"Flatten", "axis", AT(INT), 1, 0, A_ONE, "1"},
    {"Reshape", "allowzero", AT(INT), 14, 0, A_BOOL, "0 or 1"},
    {"Squeeze", "axes", AT(INTS), 1, 12, A_MATCHED, NULL},
    {"Gemm", "alpha", AT(FLOAT), 1, 0, A_FINITE, "a finite number"},
    {"Gemm", "beta", AT(FLOAT), 1, 0, A_FINITE, "a finite number"},
    {"Gemm", "transA", AT(INT), 1, 0, A_ZERO, "0"},
    {"Gemm", "transB", AT(INT), 1, 0, A_BOOL, "0 or 1"},
    {"Softmax", "axis", AT(INT), 1, 0, A_MATCHED, NULL},
    {"Constant", "value", AT(TENSOR), 1, 0, A_ANY, NULL},
    {"Constant", "sparse_value", AT(SPARSE_TENSOR), 11, 0, A_NEVER, NULL},
    {"Constant", "value_float", AT(FLOAT), 12, 0, A_NEVER, NULL},
    {"Constant", "value_floats", AT(FLOATS), 12, 0, A_NEVER, NULL},
    {"Constant", "value_int", AT(INT), 12, 0, A_NEVER, NULL},
    {"Constant", "value_ints", AT(INTS), 12, 0, A_NEVER, NULL},
    {"Constant", "value_string", AT(STRING), 12, 0, A_NEVER, NULL},
    {"Constant", "value_strings", AT(STRINGS), 12, 0, A_NEVER, NULL},
};

static const char *attr_type_name(int t)
{
    switch (t) {
    case AT(FLOAT): return "FLOAT";
    case AT(INT): return "INT";
    case AT(STRING): return "STRING";
    case AT(TENSOR): return "TENSOR";
    case AT(GRAPH): return "GRAPH";
    case AT(SPARSE_TENSOR): return "SPARSE_TENSOR";
    case AT(TYPE_PROTO): return "TYPE_PROTO";
    case AT(FLOATS): return "FLOATS";
    case AT(INTS): return "INTS";
    case AT(STRINGS): return "STRINGS";
    case AT(TENSORS): return "TENSORS";
    case AT(GRAPHS): return "GRAPHS";
    case AT(SPARSE_TENSORS): return "SPARSE_TENSORS";
    case AT(TYPE_PROTOS): return "TYPE_PROTOS";
    default: return "UNDEFINED";
    }
}

/* a's type: its declared one, or (files that leave it out) the field it
 * fills; UNDEFINED when neither says. */
static int attr_type_of(const Onnx__AttributeProto *a)
{
    if (a->has_type && a->type != AT(UNDEFINED)) return a->type;
    if (a->has_f) return AT(FLOAT);
    if (a->has_i) return AT(INT);
    if (a->has_s) return AT(STRING);
    if (a->t) return AT(TENSOR);
    if (a->g) return AT(GRAPH);
    if (a->sparse_tensor) return AT(SPARSE_TENSOR);
    if (a->n_floats) return AT(FLOATS);
    if (a->n_ints) return AT(INTS);
    if (a->n_strings) return AT(STRINGS);
    return AT(UNDEFINED);
}

/* a's value for a one-line message: 3, 0.5, [1, 1, 2, 2], 'SAME_UPPER'. */
static const char *attr_text(const Onnx__AttributeProto *a, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = '\0';
    switch (attr_type_of(a)) {
    case AT(FLOAT): snprintf(buf, cap, "%g", (double)a->f); break;
    case AT(INT): snprintf(buf, cap, "%lld", (long long)a->i); break;
    case AT(STRING): {
        char s[48], sb[48];
        snprintf(s, sizeof s, "%.*s", (int)(a->s.len < 40 ? a->s.len : 40),
                 a->s.data ? (const char *)a->s.data : "");
        snprintf(buf, cap, "'%s'", clean(s, sb, sizeof sb));
        break;
    }
    case AT(INTS):
    case AT(FLOATS): {
        size_t n = a->n_ints ? a->n_ints : a->n_floats;
        o += (size_t)snprintf(buf, cap, "[");
        for (size_t i = 0; i < n && o + 24 < cap; i++) {
            if (i == 6) {
                o += (size_t)snprintf(buf + o, cap - o, ", ...");
                break;
            }
            if (a->n_ints)
                o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "",
                                      (long long)a->ints[i]);
            else
                o +=
                    (size_t)snprintf(buf + o, cap - o, "%s%g", i ? ", " : "", (double)a->floats[i]);
        }
        snprintf(buf + o, cap - o, "]");
        break;
    }
    default: snprintf(buf, cap, "a %s", attr_type_name(attr_type_of(a))); break;
    }
    return buf;
}

/* Whether value a passes rule r (A_MATCHED, A_ANY: always here). */
static bool attr_value_ok(const Onnx__AttributeProto *a, int rule)
{
    switch (rule) {
    case A_ZERO: return a->i == 0;
    case A_ONE: return a->i == 1;
    case A_BOOL: return a->i == 0 || a->i == 1;
    case A_ONES:
        for (size_t i = 0; i < a->n_ints; i++)
            if (a->ints[i] != 1) return false;
        return true;
    case A_FINITE: return isfinite(a->f);
    case A_NOTSET: return a->s.len == 0 || (a->s.len == 6 && memcmp(a->s.data, "NOTSET", 6) == 0);
    case A_NEVER: return false;
    default: return true;
    }
}

/* Every attribute of node `node` is one its operator defines at the
 * model's opset, of its type, given once, and a value tilewise runs (or
 * one the matcher checks against the node's place). The first that is not
 * is refused, naming the node, the attribute and its value. */
static tw_status check_attrs(octx *c, int node)
{
    const Onnx__NodeProto *n = c->g->node[node];
    for (size_t i = 0; i < n->n_attribute; i++) {
        const Onnx__AttributeProto *a = n->attribute[i];
        char ab[96], vb[96];
        const char *name = clean(a->name, ab, sizeof ab);
        for (size_t j = 0; j < i; j++)
            if (strcmp(S(n->attribute[j]->name), S(a->name)) == 0)
                return node_error(c, node, "has attribute %s twice", name);
        if (a->ref_attr_name && *a->ref_attr_name)
            return node_error(c, node,
                              "has attribute %s referring to a function's attribute (only "
                              "functions may)",
                              name);
        const attr_rule *r = NULL;
        for (size_t k = 0; k < sizeof k_attr_rules / sizeof k_attr_rules[0] && !r; k++) {
            const attr_rule *q = &k_attr_rules[k];
            if (op_is(n, q->op) && strcmp(q->name, S(a->name)) == 0 && c->opset >= q->since &&
                (q->until == 0 || c->opset <= q->until))
                r = q;
        }
        if (!r)
            return node_error(c, node,
                              "has attribute %s = %s, which %s does not define at opset %lld", name,
                              attr_text(a, vb, sizeof vb), S(n->op_type), (long long)c->opset);
        int t = attr_type_of(a);
        bool filled = (t == AT(FLOAT) && a->has_f) || (t == AT(INT) && a->has_i) ||
                      (t == AT(STRING) && a->has_s) || (t == AT(TENSOR) && a->t) ||
                      (t == AT(INTS) || t == AT(FLOATS) || t == AT(STRINGS)) ||
                      (t == AT(SPARSE_TENSOR) && a->sparse_tensor);
        if (t != r->type)
            return node_error(c, node, "has attribute %s = %s of type %s (%s's %s is of type %s)",
                              name, attr_text(a, vb, sizeof vb), attr_type_name(t), r->op, r->name,
                              attr_type_name(r->type));
        if (!filled)
            return node_error(c, node, "has attribute %s of type %s without its value", name,
                              attr_type_name(t));
        if (r->rule == A_NEVER)
            return node_error(c, node,
                              "has attribute %s = %s (tilewise reads a Constant's tensor 'value' "
                              "only)",
                              name, attr_text(a, vb, sizeof vb));
        if (!attr_value_ok(a, r->rule))
            return node_error(c, node, "has attribute %s = %s (tilewise runs %s = %s only)", name,
                              attr_text(a, vb, sizeof vb), name, r->want);
    }
    return TW_OK;
}

/* Node n's attribute name as "name = value" for the matcher's messages. */
static const char *attr_show(const Onnx__NodeProto *n, const char *name, char *buf, size_t cap)
{
    const Onnx__AttributeProto *a = attr(n, name);
    char vb[80];
    snprintf(buf, cap, "%s = %s", name, a ? attr_text(a, vb, sizeof vb) : "(absent)");
    return buf;
}
#undef AT

/* ------------------------------------------------------------------------ */
/* Tensors                                                                   */

/* The constant behind value name (an initializer, or a Constant node's
 * value, through Identity nodes), or NULL. */
static const Onnx__TensorProto *constant(const octx *c, const char *name)
{
    int v = find_value(c, name);
    if (v < 0) return NULL;
    v = c->canon[v];
    const value *x = &c->values[v];
    if (x->kind == V_INIT) return c->g->initializer[x->index];
    if (x->kind == V_NODE) {
        const Onnx__NodeProto *n = c->g->node[x->index];
        if (op_is(n, "Constant")) {
            const Onnx__AttributeProto *a = attr(n, "value");
            if (a && a->t) return a->t;
        }
    }
    return NULL;
}

static size_t elem_size(int32_t dt)
{
    switch (dt) {
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: return 4;
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16: return 2;
    case ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16: return 2;
    case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE: return 8;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: return 8;
    default: return 0;
    }
}

static void le_to_float(int32_t dt, const uint8_t *p, float *dst, int64_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT) { /* the common case: no per-value work */
        memcpy(dst, p, (size_t)n * sizeof(float));
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) {
        if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT) {
            const uint8_t *q = p + 4 * i;
            uint32_t u =
                (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
            memcpy(&dst[i], &u, 4);
        } else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE) {
            uint64_t u = 0;
            for (int b = 7; b >= 0; b--) u = u << 8 | p[8 * i + b];
            double d;
            memcpy(&d, &u, 8);
            dst[i] = (float)d;
        } else {
            uint16_t u = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
            if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16) {
                dst[i] = tw_half_to_float(u);
            } else {
                uint32_t w = (uint32_t)u << 16;
                memcpy(&dst[i], &w, 4);
            }
        }
    }
}

/* Open the external data file of tensor tname: location loc, relative to
 * the model's folder, must be a regular file inside that folder once every
 * link (in loc and in the folder's own path) is resolved. Its resolved path
 * into full, its size into *size. A location that leads outside is refused
 * with the same words whatever is there: nothing of the target (its size,
 * its kind, its bytes) reaches a message. */
static tw_status open_external(octx *c, const char *tname, const char *loc, char *full,
                               size_t full_cap, FILE **out, uint64_t *size)
{
    char lb[400], dir[TW_PATH_MAX], base[PATH_MAX], joined[TW_PATH_MAX + PATH_MAX];
    *out = NULL;
    /* ONNX's own rule first: relative, no ".." component */
    bool escapes = loc[0] == '/';
    for (const char *p = loc; *p && !escapes; p = strchr(p, '/') ? strchr(p, '/') + 1 : "")
        escapes = p[0] == '.' && p[1] == '.' && (p[2] == '/' || p[2] == '\0');
    if (escapes)
        return tw_model_error(c->err, c->path,
                              "tensor '%s': external data location '%s' is outside the model's "
                              "folder",
                              tname, clean(loc, lb, sizeof lb));
    const char *slash = strrchr(c->path, '/');
    if (slash)
        snprintf(dir, sizeof dir, "%.*s", slash == c->path ? 1 : (int)(slash - c->path), c->path);
    else
        snprintf(dir, sizeof dir, ".");
    if (!realpath(dir, base))
        return tw_model_error(c->err, c->path, "cannot resolve the model's folder: %s",
                              strerror(errno));
    size_t bl = strlen(base);
    if (snprintf(joined, sizeof joined, "%s/%s", base, loc) >= (int)sizeof joined)
        return tw_model_error(c->err, c->path, "tensor '%s': external data path is too long",
                              tname);
    char resolved[PATH_MAX];
    if (!realpath(joined, resolved))
        return tw_model_error(c->err, c->path, "tensor '%s': cannot open external data '%s': %s",
                              tname, clean(loc, lb, sizeof lb), strerror(errno));
    /* inside: base itself is a folder, so the file is below it ("/" holds all) */
    bool inside = strncmp(resolved, base, bl) == 0 &&
                  (resolved[bl] == '/' || (bl == 1 && base[0] == '/')) && resolved[bl] != '\0';
    if (!inside)
        return tw_model_error(c->err, c->path,
                              "tensor '%s': external data location '%s' is outside the model's "
                              "folder (through a link)",
                              tname, clean(loc, lb, sizeof lb));
    if (snprintf(full, full_cap, "%s", resolved) >= (int)full_cap)
        return tw_model_error(c->err, c->path, "tensor '%s': external data path is too long",
                              tname);
    /* a FIFO or a device is not opened at all (opening one may block or act) */
    struct stat sb;
    if (stat(resolved, &sb) != 0 || !S_ISREG(sb.st_mode))
        return tw_model_error(c->err, c->path,
                              "tensor '%s': external data %s is not a regular file", tname,
                              clean(full, lb, sizeof lb));
    /* resolved has no link left: O_NOFOLLOW refuses one put there since,
     * O_NONBLOCK a FIFO swapped in, and fstat checks what was opened */
    int fd = open(resolved, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return tw_model_error(c->err, c->path, "tensor '%s': cannot open external data %s: %s",
                              tname, clean(full, lb, sizeof lb), strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return tw_model_error(c->err, c->path,
                              "tensor '%s': external data %s is not a regular file", tname,
                              clean(full, lb, sizeof lb));
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return tw_model_error(c->err, c->path, "tensor '%s': cannot open external data %s: %s",
                              tname, clean(full, lb, sizeof lb), strerror(errno));
    }
    *size = (uint64_t)sb.st_size;
    *out = f;
    return TW_OK;
}

/* Read the bytes of an external tensor (location relative to the model's
 * folder, offset, length) into a new buffer of want bytes. */
static tw_status read_external(octx *c, const Onnx__TensorProto *tp, const char *tname, size_t want,
                               uint8_t **out)
{
    const char *loc = NULL;
    int64_t offset = 0, length = -1;
    for (size_t i = 0; i < tp->n_external_data; i++) {
        const char *k = S(tp->external_data[i]->key), *v = S(tp->external_data[i]->value);
        char *end = NULL, vb[48];
        if (strcmp(k, "location") == 0) {
            loc = v;
        } else if (strcmp(k, "offset") == 0 || strcmp(k, "length") == 0) {
            errno = 0;
            long long x = strtoll(v, &end, 10);
            if (errno || end == v || *end || x < 0)
                return tw_model_error(c->err, c->path,
                                      "tensor '%s': external data %s '%s' is not a byte count",
                                      tname, k, clean(v, vb, sizeof vb));
            if (k[0] == 'o')
                offset = x;
            else
                length = x;
        }
    }
    if (!loc || !*loc)
        return tw_model_error(c->err, c->path, "tensor '%s': external data without a location",
                              tname);
    if (length >= 0 && (uint64_t)length != want)
        return tw_model_error(c->err, c->path,
                              "tensor '%s': external data length %lld but its dims need %zu bytes",
                              tname, (long long)length, want);
    char full[PATH_MAX], lb[400];
    FILE *f = NULL;
    uint64_t size = 0;
    tw_status st = open_external(c, tname, loc, full, sizeof full, &f, &size);
    if (st != TW_OK) return st;
    if ((uint64_t)offset > size || want > size - (uint64_t)offset) {
        fclose(f);
        return tw_model_error(c->err, c->path,
                              "tensor '%s': external data %s holds %llu bytes, the tensor needs "
                              "%zu at offset %lld",
                              tname, clean(full, lb, sizeof lb), (unsigned long long)size, want,
                              (long long)offset);
    }
    uint8_t *buf = tw_alloc(TW_MEM_OTHER, want ? want : 1);
    if (!buf) {
        fclose(f);
        return tw_model_nomem(c->err, c->path, want);
    }
    bool ok = fseeko(f, (off_t)offset, SEEK_SET) == 0 && fread(buf, 1, want, f) == want;
    fclose(f);
    if (!ok) {
        tw_free(buf);
        return tw_model_error(c->err, c->path, "tensor '%s': cannot read external data %s", tname,
                              clean(full, lb, sizeof lb));
    }
    sha256_update(&c->sha, want, buf);
    c->mf->onnx.n_external++;
    *out = buf;
    return TW_OK;
}

/* tp's values as float32 in a new buffer (TW_MEM_WEIGHTS); its dims into
 * shape (at most 4), count into *ndim. what names it in messages. */
static tw_status tensor_floats(octx *c, const Onnx__TensorProto *tp, const char *what, float **out,
                               int64_t shape[4], int *ndim)
{
    char nb[96];
    const char *tname = tp->name && *tp->name ? clean(tp->name, nb, sizeof nb) : what;
    *out = NULL;
    if (tp->n_dims > 4)
        return tw_model_error(c->err, c->path, "tensor '%s' has %zu dimensions (at most 4)", tname,
                              tp->n_dims);
    int64_t numel = 1;
    for (size_t d = 0; d < tp->n_dims; d++) {
        if (tp->dims[d] <= 0 || tp->dims[d] > ONNX_MAX_VALUES ||
            numel * tp->dims[d] > ONNX_MAX_VALUES)
            return tw_model_error(c->err, c->path, "tensor '%s' has dimension %lld = %lld", tname,
                                  (long long)d, (long long)tp->dims[d]);
        numel *= tp->dims[d];
        shape[d] = tp->dims[d];
    }
    *ndim = (int)tp->n_dims;
    int32_t dt = tp->data_type;
    size_t es = elem_size(dt);
    if (!es || dt == ONNX__TENSOR_PROTO__DATA_TYPE__INT64)
        return tw_model_error(c->err, c->path,
                              "tensor '%s' has data type %d (float, float16, bfloat16 or double "
                              "expected)",
                              tname, (int)dt);
    size_t bytes = (size_t)numel * es;
    float *dst = tw_alloc(TW_MEM_WEIGHTS, (size_t)numel * sizeof(float));
    if (!dst) return tw_model_nomem(c->err, c->path, (size_t)numel * sizeof(float));
    tw_status st = TW_OK;
    if (tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
        uint8_t *raw = NULL;
        st = read_external(c, tp, tname, bytes, &raw);
        if (st == TW_OK) le_to_float(dt, raw, dst, numel);
        tw_free(raw);
    } else if (tp->has_raw_data && tp->raw_data.len > 0) {
        if (tp->raw_data.len != bytes)
            st =
                tw_model_error(c->err, c->path, "tensor '%s' holds %zu bytes but its dims need %zu",
                               tname, tp->raw_data.len, bytes);
        else
            le_to_float(dt, tp->raw_data.data, dst, numel);
    } else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT && tp->n_float_data == (size_t)numel) {
        memcpy(dst, tp->float_data, bytes);
    } else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE && tp->n_double_data == (size_t)numel) {
        for (int64_t i = 0; i < numel; i++) dst[i] = (float)tp->double_data[i];
    } else if ((dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16 ||
                dt == ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16) &&
               tp->n_int32_data == (size_t)numel) {
        for (int64_t i = 0; i < numel; i++) {
            uint16_t u = (uint16_t)(tp->int32_data[i] & 0xffff);
            uint8_t b[2] = {(uint8_t)(u & 0xff), (uint8_t)(u >> 8)};
            le_to_float(dt, b, &dst[i], 1);
        }
    } else {
        st = tw_model_error(c->err, c->path,
                            "tensor '%s' holds no data of the %lld values its "
                            "dims say",
                            tname, (long long)numel);
    }
    if (st != TW_OK) {
        tw_free(dst);
        return st;
    }
    *out = dst;
    return TW_OK;
}

/* Up to max int64 values of a constant (shapes, axes). */
static bool tensor_ints(const Onnx__TensorProto *tp, int64_t *out, int max, int *n)
{
    if (!tp || tp->data_type != ONNX__TENSOR_PROTO__DATA_TYPE__INT64 || tp->n_dims > 1)
        return false;
    if (tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)
        return false;
    if (tp->has_raw_data && tp->raw_data.len > 0) {
        if (tp->raw_data.len % 8 || tp->raw_data.len / 8 > (size_t)max) return false;
        *n = (int)(tp->raw_data.len / 8);
        for (int i = 0; i < *n; i++) {
            uint64_t u = 0;
            for (int b = 7; b >= 0; b--) u = u << 8 | tp->raw_data.data[8 * i + b];
            out[i] = (int64_t)u;
        }
        return true;
    }
    if (tp->n_int64_data > (size_t)max) return false;
    *n = (int)tp->n_int64_data;
    for (int i = 0; i < *n; i++) out[i] = tp->int64_data[i];
    return true;
}

/* Append a tensor called name (owning data) to mf. */
static tw_status add_tensor(octx *c, const char *name, float *data, int ndim, const int64_t *shape)
{
    tw_model_file *mf = c->mf;
    if (mf->n_tensors >= c->cap) {
        tw_free(data);
        return tw_error_set(c->err, TW_ERR_INTERNAL, "model file %s: tensor table full", c->path);
    }
    tw_tensor *t = &mf->tensors[mf->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->numel = 1;
    for (int d = 0; d < ndim; d++) {
        t->shape[d] = shape[d];
        t->numel *= shape[d];
    }
    t->data = data;
    return TW_OK;
}

/* ------------------------------------------------------------------------ */
/* The graph's values and their consumers                                    */

static tw_status index_graph(octx *c)
{
    const Onnx__GraphProto *g = c->g;
    if (g->n_node > ONNX_MAX_NODES || g->n_initializer > ONNX_MAX_NODES)
        return tw_model_error(c->err, c->path,
                              "graph has %zu nodes and %zu initializers: more than a ResNet's",
                              g->n_node, g->n_initializer);
    size_t n = g->n_initializer + g->n_input;
    for (size_t i = 0; i < g->n_node; i++) n += g->node[i]->n_output;
    c->values = tw_calloc(TW_MEM_OTHER, n + 1, sizeof *c->values);
    c->canon = tw_calloc(TW_MEM_OTHER, n + 1, sizeof *c->canon);
    c->cons_off = tw_calloc(TW_MEM_OTHER, n + 2, sizeof *c->cons_off);
    c->used = tw_calloc(TW_MEM_OTHER, g->n_node + 1, sizeof *c->used);
    if (!c->values || !c->canon || !c->cons_off || !c->used)
        return tw_model_nomem(c->err, c->path, n * sizeof *c->values);
    size_t k = 0;
    for (size_t i = 0; i < g->n_initializer; i++)
        c->values[k++] = (value){S(g->initializer[i]->name), V_INIT, (int)i};
    size_t n_inits = k;
    for (size_t i = 0; i < g->n_input; i++) {
        /* IR < 4 lists initializers among the inputs too */
        bool is_init = false;
        for (size_t j = 0; j < n_inits && !is_init; j++)
            is_init = strcmp(c->values[j].name, S(g->input[i]->name)) == 0;
        if (!is_init) c->values[k++] = (value){S(g->input[i]->name), V_INPUT, (int)i};
    }
    for (size_t i = 0; i < g->n_node; i++)
        for (size_t o = 0; o < g->node[i]->n_output; o++)
            if (*S(g->node[i]->output[o]))
                c->values[k++] = (value){S(g->node[i]->output[o]), V_NODE, (int)i};
    c->n_values = k;
    qsort(c->values, k, sizeof *c->values, cmp_value);
    for (size_t i = 0; i < k; i++) {
        if (!*c->values[i].name)
            return tw_model_error(c->err, c->path, "graph has a value without a name");
        if (i > 0 && strcmp(c->values[i].name, c->values[i - 1].name) == 0) {
            char nb[96];
            return tw_model_error(c->err, c->path, "value '%s' is defined twice",
                                  clean(c->values[i].name, nb, sizeof nb));
        }
    }

    /* Nodes in topological order, as ONNX requires: every input defined by
     * an initializer, the graph input or an earlier node. */
    for (size_t i = 0; i < g->n_node; i++) {
        const Onnx__NodeProto *nd = g->node[i];
        for (size_t j = 0; j < nd->n_input; j++) {
            if (!*S(nd->input[j])) continue; /* an omitted optional input */
            int v = find_value(c, nd->input[j]);
            char nb[96];
            if (v < 0)
                return node_error(c, (int)i, "reads '%s', which nothing defines",
                                  clean(nd->input[j], nb, sizeof nb));
            if (c->values[v].kind == V_NODE && (size_t)c->values[v].index >= i)
                return node_error(c, (int)i,
                                  "reads '%s' before it is computed (ONNX wants nodes in "
                                  "topological order)",
                                  clean(nd->input[j], nb, sizeof nb));
        }
    }
    /* Identity nodes alias their input: resolve in node order (inputs come
     * first), so one pass suffices. */
    for (size_t i = 0; i < k; i++) c->canon[i] = (int)i;
    for (size_t i = 0; i < g->n_node; i++) {
        const Onnx__NodeProto *nd = g->node[i];
        if (!op_is(nd, "Identity") || nd->n_input != 1 || nd->n_output != 1) continue;
        int in = find_value(c, nd->input[0]), out = find_value(c, nd->output[0]);
        if (in >= 0 && out >= 0) c->canon[out] = c->canon[in];
    }
    /* consumers per canonical value (Identity nodes are not consumers) */
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        int *fill = NULL;
        if (pass == 1) {
            for (size_t i = 0; i < k; i++) c->cons_off[i + 1] += c->cons_off[i];
            total = (size_t)c->cons_off[k];
            c->cons = tw_calloc(TW_MEM_OTHER, total + 1, sizeof *c->cons);
            fill = tw_calloc(TW_MEM_OTHER, k + 1, sizeof *fill);
            if (!c->cons || !fill) {
                tw_free(fill);
                return tw_model_nomem(c->err, c->path, total * sizeof *c->cons);
            }
        }
        for (size_t i = 0; i < g->n_node; i++) {
            const Onnx__NodeProto *nd = g->node[i];
            if (op_is(nd, "Identity")) continue;
            for (size_t j = 0; j < nd->n_input; j++) {
                if (!*S(nd->input[j])) continue;
                int v = c->canon[find_value(c, nd->input[j])];
                /* a node reading the same value twice counts once */
                bool dup = false;
                for (size_t q = 0; q < j && !dup; q++)
                    dup = *S(nd->input[q]) && c->canon[find_value(c, nd->input[q])] == v;
                if (dup) continue;
                if (pass == 0)
                    c->cons_off[v + 1]++;
                else
                    c->cons[c->cons_off[v] + fill[v]++] = (int)i;
            }
        }
        tw_free(fill);
    }
    return TW_OK;
}

/* Canonical value index of name; -1 when undefined. */
static int val(const octx *c, const char *name)
{
    int v = find_value(c, S(name));
    return v < 0 ? -1 : c->canon[v];
}

static int n_consumers(const octx *c, int v)
{
    return c->cons_off[v + 1] - c->cons_off[v];
}

static bool is_graph_output(const octx *c, int v)
{
    for (size_t i = 0; i < c->g->n_output; i++)
        if (val(c, c->g->output[i]->name) == v) return true;
    return false;
}

/* The one node reading value v (output of node `from`, for messages).
 * Anything else - no reader, two readers - is refused. */
static tw_status next_node(octx *c, int v, int from, const char *expect, int *out)
{
    int n = n_consumers(c, v);
    if (n == 1) {
        *out = c->cons[c->cons_off[v]];
        return TW_OK;
    }
    if (n == 0) return node_error(c, from, "has no successor where a ResNet has %s", expect);
    return node_error(c, c->cons[c->cons_off[v] + 1],
                      "also reads the output of node #%d: a ResNet has a single path there "
                      "(expected %s)",
                      from, expect);
}

/* The canonical value of node n's output 0; others must be unused. */
static tw_status out0(octx *c, int node, int *v)
{
    const Onnx__NodeProto *n = c->g->node[node];
    if (n->n_output < 1) return node_error(c, node, "has no output");
    for (size_t o = 1; o < n->n_output; o++) {
        int w = val(c, n->output[o]);
        if (w >= 0 && (n_consumers(c, w) > 0 || is_graph_output(c, w)))
            return node_error(c, node, "has its output %zu in use (a ResNet uses only its first)",
                              o);
    }
    *v = val(c, n->output[0]);
    if (*v < 0) return node_error(c, node, "has no named output");
    return TW_OK;
}

/* ------------------------------------------------------------------------ */
/* Convolutions, batch norm                                                  */

typedef struct conv {
    int node;
    int k, stride, pad, group, cin, cout;
    float *w, *b; /* folded; owned until emitted */
    int64_t wshape[4];
    int out;  /* canonical value after the conv (and its BN) */
    int last; /* the node that produced out (conv or BN) */
} conv;

static void conv_free(conv *cv)
{
    tw_free(cv->w);
    tw_free(cv->b);
    cv->w = cv->b = NULL;
}

/* Node `node` as a Conv (weight constant, optional bias) followed by an
 * optional BatchNormalization, folded into cv->w, cv->b. */
static tw_status take_conv(octx *c, int node, conv *cv)
{
    memset(cv, 0, sizeof *cv);
    cv->node = node;
    const Onnx__NodeProto *n = c->g->node[node];
    if (!op_is(n, "Conv")) return node_error(c, node, "is where a ResNet has a convolution");
    if (n->n_input < 2 || n->n_input > 3) return node_error(c, node, "has %zu inputs", n->n_input);
    const Onnx__TensorProto *wt = constant(c, n->input[1]);
    if (!wt) return node_error(c, node, "has weights that are not a constant");
    int ndim = 0;
    tw_status st = tensor_floats(c, wt, "conv weight", &cv->w, cv->wshape, &ndim);
    if (st != TW_OK) return st;
    if (ndim != 4 || cv->wshape[2] != cv->wshape[3] || cv->wshape[0] > (1 << 20) ||
        cv->wshape[1] > (1 << 20))
        return node_error(c, node, "has weights of %d dimensions or a kernel that is not square",
                          ndim);
    cv->cout = (int)cv->wshape[0];
    cv->cin = (int)cv->wshape[1];
    cv->k = (int)cv->wshape[2];
    int64_t v[8];
    int cnt;
    char ab[128];
    cv->group = (int)attr_int(n, "group", 1);
    if (!attr_ints(n, "kernel_shape", v, 2, &cnt) ||
        (cnt && (cnt != 2 || v[0] != cv->k || v[1] != cv->k)))
        return node_error(c, node, "has attribute %s, which is not its weights' %dx%d",
                          attr_show(n, "kernel_shape", ab, sizeof ab), cv->k, cv->k);
    if (!attr_ints(n, "dilations", v, 2, &cnt) || (cnt && (cnt != 2 || v[0] != 1 || v[1] != 1)))
        return node_error(c, node, "has attribute %s (a ResNet's convolutions are not dilated)",
                          attr_show(n, "dilations", ab, sizeof ab));
    if (!attr_ints(n, "strides", v, 2, &cnt) || (cnt && (cnt != 2 || v[0] != v[1])))
        return node_error(c, node, "has attribute %s (strides that differ by axis)",
                          attr_show(n, "strides", ab, sizeof ab));
    cv->stride = cnt ? (int)v[0] : 1;
    if (!attr_ints(n, "pads", v, 4, &cnt) ||
        (cnt && (cnt != 4 || v[0] != v[1] || v[0] != v[2] || v[0] != v[3])))
        return node_error(c, node, "has attribute %s (padding that differs by side)",
                          attr_show(n, "pads", ab, sizeof ab));
    cv->pad = cnt ? (int)v[0] : 0;
    const Onnx__AttributeProto *ap = attr(n, "auto_pad");
    if (ap && ap->has_s && ap->s.len > 0) {
        char mode[16] = "";
        snprintf(mode, sizeof mode, "%.*s", (int)(ap->s.len < 15 ? ap->s.len : 15),
                 (const char *)ap->s.data);
        if (strcmp(mode, "SAME_UPPER") == 0 || strcmp(mode, "SAME_LOWER") == 0) {
            /* the same as symmetric padding k/2 only at stride 1 with an odd kernel */
            if (cv->stride != 1 || cv->k % 2 == 0)
                return node_error(c, node,
                                  "has attribute auto_pad = '%s' at stride %d with a %dx%d kernel "
                                  "(asymmetric padding)",
                                  mode, cv->stride, cv->k, cv->k);
            cv->pad = cv->k / 2;
        } else if (strcmp(mode, "VALID") == 0) {
            cv->pad = 0;
        } else if (strcmp(mode, "NOTSET") != 0) {
            return node_error(c, node, "has attribute %s (NOTSET, SAME_UPPER, SAME_LOWER or VALID)",
                              attr_show(n, "auto_pad", ab, sizeof ab));
        }
    }
    if (cv->stride < 1 || cv->stride > 2 || cv->pad < 0 || cv->pad > 3)
        return node_error(c, node, "has stride %d and padding %d", cv->stride, cv->pad);
    /* Grouped (ResNeXt): the weights are [cout, cin / group, k, k], as in a
     * torchvision state_dict, and model/resnet.c reads the groups from that
     * shape; the fold below works per output channel. */
    if (cv->group < 1 || cv->cout % cv->group != 0)
        return node_error(c, node, "has group %d for %d outputs", cv->group, cv->cout);
    cv->b = tw_calloc(TW_MEM_WEIGHTS, (size_t)cv->cout, sizeof(float));
    if (!cv->b) return tw_model_nomem(c->err, c->path, (size_t)cv->cout * sizeof(float));
    if (n->n_input == 3 && *S(n->input[2])) {
        const Onnx__TensorProto *bt = constant(c, n->input[2]);
        float *b = NULL;
        int64_t bs[4];
        int bd = 0;
        if (!bt) return node_error(c, node, "has a bias that is not a constant");
        st = tensor_floats(c, bt, "conv bias", &b, bs, &bd);
        if (st != TW_OK) return st;
        if (bd != 1 || bs[0] != cv->cout) {
            tw_free(b);
            return node_error(c, node, "has a bias of the wrong size (%d outputs)", cv->cout);
        }
        memcpy(cv->b, b, (size_t)cv->cout * sizeof(float));
        tw_free(b);
    }
    c->used[node] = true;
    int o;
    if ((st = out0(c, node, &o)) != TW_OK) return st;
    cv->out = o;
    cv->last = node;

    /* an optional BatchNormalization right after */
    if (n_consumers(c, o) != 1) return TW_OK;
    int bn = c->cons[c->cons_off[o]];
    const Onnx__NodeProto *bnn = c->g->node[bn];
    if (!op_is(bnn, "BatchNormalization")) return TW_OK;
    if (bnn->n_input != 5 || val(c, bnn->input[0]) != o)
        return node_error(c, bn, "does not normalize its convolution's output alone");
    if (attr_int(bnn, "training_mode", 0) != 0 || attr_int(bnn, "spatial", 1) != 1)
        return node_error(c, bn, "is in training mode or not spatial");
    float *p[4] = {NULL, NULL, NULL, NULL};
    static const char *const what[4] = {"scale", "bias", "mean", "variance"};
    for (int i = 0; i < 4 && st == TW_OK; i++) {
        const Onnx__TensorProto *t = constant(c, bnn->input[i + 1]);
        int64_t s[4];
        int d = 0;
        if (!t) {
            st = node_error(c, bn, "has a %s that is not a constant", what[i]);
            break;
        }
        st = tensor_floats(c, t, what[i], &p[i], s, &d);
        if (st == TW_OK && (d != 1 || s[0] != cv->cout))
            st = node_error(c, bn, "has a %s of the wrong size (%d channels)", what[i], cv->cout);
    }
    const Onnx__AttributeProto *ea = attr(bnn, "epsilon");
    float epsf = ea && ea->has_f ? ea->f : 1e-5f;
    /* torchvision's 1e-5 as model/resnet.c folds it: bit for bit the same
     * weights as from safetensors */
    double eps = epsf == 1e-5f ? 1e-5 : (double)epsf;
    if (st == TW_OK && !(eps >= 0 && isfinite(eps)))
        st = node_error(c, bn, "has attribute epsilon = %g (a number >= 0 expected)", (double)epsf);
    for (int o2 = 0; st == TW_OK && o2 < cv->cout; o2++) {
        float var = p[3][o2];
        if (!(var >= 0.0f) || !isfinite(var)) {
            st = node_error(c, bn, "has an invalid variance (%g) at channel %d", (double)var, o2);
            break;
        }
        double scale = (double)p[0][o2] / sqrt((double)var + eps);
        size_t per = (size_t)cv->cin * (size_t)cv->k * (size_t)cv->k;
        float *w = cv->w + (size_t)o2 * per;
        for (size_t j = 0; j < per; j++) w[j] = (float)((double)w[j] * scale);
        cv->b[o2] = (float)((double)p[1][o2] + ((double)cv->b[o2] - (double)p[2][o2]) * scale);
    }
    for (int i = 0; i < 4; i++) tw_free(p[i]);
    if (st != TW_OK) return st;
    c->used[bn] = true;
    c->mf->onnx.n_bn++;
    if ((st = out0(c, bn, &o)) != TW_OK) return st;
    cv->out = o;
    cv->last = bn;
    return TW_OK;
}

/* Emit cv as NAME.weight and BN_NAME.{weight,bias,running_mean,running_var},
 * the batch norm an exact identity around the folded bias (model_file.h). */
static tw_status emit_conv(octx *c, conv *cv, const char *name, const char *bn_name)
{
    char t[128];
    size_t n = (size_t)cv->cout;
    float *g = tw_alloc(TW_MEM_WEIGHTS, n * sizeof(float));
    float *m = tw_calloc(TW_MEM_WEIGHTS, n, sizeof(float));
    float *v = tw_alloc(TW_MEM_WEIGHTS, n * sizeof(float));
    if (!g || !m || !v) {
        tw_free(g);
        tw_free(m);
        tw_free(v);
        return tw_model_nomem(c->err, c->path, n * sizeof(float));
    }
    /* 2^40 + 1e-5 rounds to 2^40 in double, so gamma / sqrt(var + eps) is
     * exactly 1 and the fold leaves w and b untouched */
    for (size_t i = 0; i < n; i++) {
        g[i] = 1048576.0f;
        v[i] = 1099511627776.0f;
    }
    int64_t shape1[1] = {cv->cout};
    tw_status st;
    snprintf(t, sizeof t, "%s.weight", name);
    st = add_tensor(c, t, cv->w, 4, cv->wshape);
    cv->w = NULL;
    snprintf(t, sizeof t, "%s.weight", bn_name);
    if (st == TW_OK)
        st = add_tensor(c, t, g, 1, shape1);
    else
        tw_free(g);
    snprintf(t, sizeof t, "%s.bias", bn_name);
    if (st == TW_OK)
        st = add_tensor(c, t, cv->b, 1, shape1);
    else
        tw_free(cv->b);
    cv->b = NULL;
    snprintf(t, sizeof t, "%s.running_mean", bn_name);
    if (st == TW_OK)
        st = add_tensor(c, t, m, 1, shape1);
    else
        tw_free(m);
    snprintf(t, sizeof t, "%s.running_var", bn_name);
    if (st == TW_OK)
        st = add_tensor(c, t, v, 1, shape1);
    else
        tw_free(v);
    return st;
}

/* Node `node` must be a Relu reading value v; its output into *out. */
static tw_status take_relu(octx *c, int node, int v, int *out)
{
    const Onnx__NodeProto *n = c->g->node[node];
    if (!op_is(n, "Relu") || n->n_input != 1 || val(c, n->input[0]) != v)
        return node_error(c, node, "is where a ResNet has a ReLU");
    c->used[node] = true;
    return out0(c, node, out);
}

/* ------------------------------------------------------------------------ */
/* Stem, blocks, head                                                        */

static tw_status match_stem(octx *c, int x, int *out)
{
    int node = c->cons[c->cons_off[x]]; /* the input's one reader (recognise) */
    conv cv;
    tw_status st = take_conv(c, node, &cv);
    if (st != TW_OK) {
        conv_free(&cv);
        return st;
    }
    int r = -1, y;
    if (st == TW_OK) st = next_node(c, cv.out, cv.last, "a ReLU", &r);
    if (st == TW_OK) st = take_relu(c, r, cv.out, &y);
    int mp = -1;
    if (st == TW_OK && n_consumers(c, y) == 1) mp = c->cons[c->cons_off[y]];
    bool has_pool = mp >= 0 && op_is(c->g->node[mp], "MaxPool");
    /* The small-patch stem (3x3 stride-1 conv1, no max-pool): model/resnet.c
     * reads it from conv1's kernel. */
    if (st == TW_OK && cv.group != 1)
        st = node_error(c, node, "is a grouped stem convolution (group %d)", cv.group);
    bool small = st == TW_OK && cv.k == 3 && cv.stride == 1 && cv.pad == 1 && !has_pool;
    if (st == TW_OK && small) {
        *out = y;
    } else if (st == TW_OK) {
        if (cv.k != 7 || cv.stride != 2 || cv.pad != 3)
            st = node_error(c, node,
                            "is a %dx%d stride-%d stem (padding %d): a ResNet's is 7x7 stride 2 "
                            "(padding 3)",
                            cv.k, cv.k, cv.stride, cv.pad);
        else if (!has_pool && mp >= 0)
            st = node_error(c, mp, "is where a ResNet has its stem's max-pool");
        else if (!has_pool)
            st = node_error(c, r, "is not followed by the stem's max-pool alone");
    }
    if (st == TW_OK && !small) {
        const Onnx__NodeProto *p = c->g->node[mp];
        int64_t v[4];
        int cnt;
        const char *bad = NULL; /* the first attribute that is not the stem's */
        if (!attr_ints(p, "kernel_shape", v, 2, &cnt) || cnt != 2 || v[0] != 3 || v[1] != 3)
            bad = "kernel_shape";
        else if (!attr_ints(p, "strides", v, 2, &cnt) || cnt != 2 || v[0] != 2 || v[1] != 2)
            bad = "strides";
        else if (!attr_ints(p, "pads", v, 4, &cnt) || cnt != 4 || v[0] != 1 || v[1] != 1 ||
                 v[2] != 1 || v[3] != 1)
            bad = "pads";
        else if (!attr_ints(p, "dilations", v, 2, &cnt) || (cnt != 0 && cnt != 2))
            bad = "dilations";
        char ab[128];
        if (p->n_input != 1)
            st = node_error(c, mp, "has %zu inputs", p->n_input);
        else if (bad)
            st = node_error(c, mp,
                            "has attribute %s: the stem's max-pool is 3x3 stride 2 with "
                            "padding 1",
                            attr_show(p, bad, ab, sizeof ab));
    }
    if (st == TW_OK && !small) {
        c->used[mp] = true;
        st = out0(c, mp, out);
    }
    if (st == TW_OK) st = emit_conv(c, &cv, "conv1", "bn1");
    conv_free(&cv);
    return st;
}

/* The kind of block seen so far: 0 unknown, 2 basic, 3 bottleneck. */
typedef struct blocks {
    int kind;
    int stage, idx; /* where the next block goes */
    int n;
} blocks;

/* Follow conv -> [BN] -> what comes next: Relu or Add (or other). */
static int after(const octx *c, const conv *cv)
{
    return n_consumers(c, cv->out) == 1 ? c->cons[c->cons_off[cv->out]] : -1;
}

/* One residual block reading value x; its output into *out. Returns
 * TW_OK with *done set when x goes to the pooling instead. */
static tw_status match_block(octx *c, blocks *bs, int x, int *out, bool *done)
{
    *done = false;
    int nc = n_consumers(c, x);
    const int *cs = c->cons + c->cons_off[x];
    if (nc == 1 &&
        (op_is(c->g->node[cs[0]], "GlobalAveragePool") || op_is(c->g->node[cs[0]], "ReduceMean"))) {
        *done = true;
        return TW_OK;
    }
    int main_node = -1, down_node = -1, add_node = -1;
    for (int i = 0; i < nc; i++) {
        const Onnx__NodeProto *n = c->g->node[cs[i]];
        if (op_is(n, "Conv") && main_node < 0)
            main_node = cs[i];
        else if (op_is(n, "Conv") && down_node < 0)
            down_node = cs[i];
        else if (op_is(n, "Add") && add_node < 0)
            add_node = cs[i];
        else
            return node_error(c, cs[i],
                              "reads a block's input: a ResNet block has a main path "
                              "of convolutions and a shortcut only");
    }
    if (main_node < 0 || (down_node < 0 && add_node < 0) || (down_node >= 0 && add_node >= 0))
        return node_error(c, cs[0], "starts what is not a residual block (%d readers of its input)",
                          nc);
    conv path[3], down;
    int np = 0;
    memset(path, 0, sizeof path);
    memset(&down, 0, sizeof down);
    tw_status st = TW_OK;
    if (down_node >= 0) {
        /* the projection is the conv whose output goes to an Add */
        st = take_conv(c, main_node, &path[0]);
        int a = st == TW_OK ? after(c, &path[0]) : -1;
        if (st == TW_OK && a >= 0 && op_is(c->g->node[a], "Add")) {
            down = path[0];
            memset(&path[0], 0, sizeof path[0]);
            st = take_conv(c, down_node, &path[0]);
        } else if (st == TW_OK) {
            st = take_conv(c, down_node, &down);
        }
    } else {
        st = take_conv(c, main_node, &path[0]);
    }
    if (st == TW_OK) np = 1;
    /* the main path: conv (relu conv)* until the Add */
    int add = -1;
    while (st == TW_OK) {
        int nx = after(c, &path[np - 1]);
        if (nx < 0) {
            st = next_node(c, path[np - 1].out, path[np - 1].last, "a ReLU or the residual Add",
                           &nx);
            if (st == TW_OK) st = node_error(c, nx, "is where a ResNet block goes on");
            break;
        }
        if (op_is(c->g->node[nx], "Add")) {
            add = nx;
            break;
        }
        int y, nc2 = -1;
        st = take_relu(c, nx, path[np - 1].out, &y);
        if (st == TW_OK && np == 3)
            st = node_error(c, nx, "continues a main path past 3 convolutions");
        if (st == TW_OK) st = next_node(c, y, nx, "a convolution", &nc2);
        if (st == TW_OK) st = take_conv(c, nc2, &path[np]);
        if (st == TW_OK) np++;
    }
    int kind = np;
    if (st == TW_OK && np < 2) st = node_error(c, add, "ends a main path of one convolution");
    if (st == TW_OK && bs->kind && bs->kind != kind)
        st = node_error(c, path[0].node, "starts a %s block after %s blocks",
                        kind == 3 ? "bottleneck" : "basic", bs->kind == 3 ? "bottleneck" : "basic");
    int sc = down.w ? down.out : x;
    if (st == TW_OK) {
        const Onnx__NodeProto *a = c->g->node[add];
        int i0 = a->n_input == 2 ? val(c, a->input[0]) : -2;
        int i1 = a->n_input == 2 ? val(c, a->input[1]) : -2;
        int m = path[np - 1].out;
        if (!((i0 == m && i1 == sc) || (i0 == sc && i1 == m)))
            st = node_error(c, add, "does not add the block's main path and its shortcut");
    }
    if (st == TW_OK && down.w && after(c, &down) != add)
        st = node_error(c, down.last, "is a projection that does not go to the block's Add");
    /* Groups: only a bottleneck's 3x3 may be grouped (ResNeXt), and each
     * convolution takes what the one before it gives: [cout, cin / group]
     * weights agree with the group attribute, or the graph is not what its
     * weights say (model/resnet.c reads the groups from the shapes). */
    for (int i = 0; st == TW_OK && i < np; i++) {
        if (path[i].group != 1 && !(kind == 3 && i == 1))
            st = node_error(c, path[i].node, "is grouped (group %d) where a ResNet block is not",
                            path[i].group);
        else if (i > 0 && path[i].cin * path[i].group != path[i - 1].cout)
            st = node_error(c, path[i].node,
                            "takes %d x %d channels (group %d) from a convolution of %d outputs",
                            path[i].cin, path[i].group, path[i].group, path[i - 1].cout);
    }
    if (st == TW_OK && down.w && down.group != 1)
        st = node_error(c, down.node, "is a grouped projection (group %d)", down.group);
    /* geometry: torchvision's v1.5 blocks (what model/resnet.c assumes) */
    int stride = 1;
    if (st == TW_OK) {
        stride = kind == 3 ? path[1].stride : path[0].stride;
        static const int want3[3][2] = {{1, 0}, {3, 1}, {1, 0}}; /* k, pad */
        static const int want2[2][2] = {{3, 1}, {3, 1}};
        for (int i = 0; i < np && st == TW_OK; i++) {
            int k = kind == 3 ? want3[i][0] : want2[i][0];
            int p = kind == 3 ? want3[i][1] : want2[i][1];
            int s = (kind == 3 && i == 1) || (kind == 2 && i == 0) ? stride : 1;
            if (path[i].k != k || path[i].pad != p || path[i].stride != s) {
                if (kind == 3 && i == 0 && path[i].stride == 2)
                    st = node_error(c, path[i].node,
                                    "strides in a bottleneck's first 1x1 convolution (ResNet v1, "
                                    "as in Caffe): tilewise runs torchvision's layout (v1.5, "
                                    "stride in the 3x3)");
                else
                    st = node_error(c, path[i].node,
                                    "is a %dx%d stride-%d convolution with padding %d where a "
                                    "ResNet %s block has %dx%d stride %d padding %d",
                                    path[i].k, path[i].k, path[i].stride, path[i].pad,
                                    kind == 3 ? "bottleneck" : "basic", k, k, s, p);
            }
        }
        if (st == TW_OK && down.w && (down.k != 1 || down.pad != 0 || down.stride != stride))
            st = node_error(c, down.node,
                            "is a projection %dx%d stride %d where the block needs 1x1 stride %d",
                            down.k, down.k, down.stride, stride);
        if (st == TW_OK && stride == 2 && bs->n == 0)
            st =
                node_error(c, path[0].node, "halves the map in the first block (stage 1 does not)");
    }
    if (st == TW_OK && stride == 2) {
        bs->stage++;
        bs->idx = 0;
        if (bs->stage > 3) st = node_error(c, path[0].node, "starts a fifth stage");
    }
    if (st == TW_OK) {
        c->used[add] = true;
        int a_out, r = -1;
        st = out0(c, add, &a_out);
        if (st == TW_OK) st = next_node(c, a_out, add, "the block's ReLU", &r);
        if (st == TW_OK) st = take_relu(c, r, a_out, out);
    }
    char nm[64], bn[64];
    for (int i = 0; i < np && st == TW_OK; i++) {
        snprintf(nm, sizeof nm, "layer%d.%d.conv%d", bs->stage + 1, bs->idx, i + 1);
        snprintf(bn, sizeof bn, "layer%d.%d.bn%d", bs->stage + 1, bs->idx, i + 1);
        st = emit_conv(c, &path[i], nm, bn);
    }
    if (st == TW_OK && down.w) {
        snprintf(nm, sizeof nm, "layer%d.%d.downsample.0", bs->stage + 1, bs->idx);
        snprintf(bn, sizeof bn, "layer%d.%d.downsample.1", bs->stage + 1, bs->idx);
        st = emit_conv(c, &down, nm, bn);
    }
    for (int i = 0; i < 3; i++) conv_free(&path[i]);
    conv_free(&down);
    if (st == TW_OK) {
        bs->kind = kind;
        bs->idx++;
        bs->n++;
    }
    return st;
}

static void head_add(tw_onnx_info *oi, const char *op)
{
    size_t o = strlen(oi->head);
    snprintf(oi->head + o, sizeof oi->head - o, "%s%s", o ? ", " : "", op);
}

/* Axes {2,3} (or {-2,-1}) in any order. */
static bool spatial_axes(const int64_t *a, int n)
{
    if (n != 2) return false;
    int64_t x = a[0] < 0 ? a[0] + 4 : a[0], y = a[1] < 0 ? a[1] + 4 : a[1];
    return (x == 2 && y == 3) || (x == 3 && y == 2);
}

/* The pooling, flattening and classifier from x on, into fc.weight, fc.bias. */
static tw_status match_head(octx *c, int x, int channels)
{
    tw_onnx_info *oi = &c->mf->onnx;
    int node = c->cons[c->cons_off[x]];
    const Onnx__NodeProto *n = c->g->node[node];
    int64_t ax[4];
    int cnt = 0;
    bool keep = true;
    if (op_is(n, "ReduceMean")) {
        keep = attr_int(n, "keepdims", 1) != 0;
        bool ok;
        if (n->n_input >= 2 && *S(n->input[1])) /* opset 18: axes as an input */
            ok = tensor_ints(constant(c, n->input[1]), ax, 4, &cnt);
        else
            ok = attr_ints(n, "axes", ax, 4, &cnt);
        if (!ok || !spatial_axes(ax, cnt))
            return node_error(c, node, "does not average over height and width alone");
    } else if (n->n_input != 1) {
        return node_error(c, node, "has %zu inputs", n->n_input);
    }
    head_add(oi, S(n->op_type));
    c->used[node] = true;
    int v, nx = -1;
    tw_status st = out0(c, node, &v);
    if (st != TW_OK) return st;
    if (keep && n_consumers(c, v) == 1) {
        /* [N, C, 1, 1] to [N, C] */
        nx = c->cons[c->cons_off[v]];
        const Onnx__NodeProto *f = c->g->node[nx];
        bool flat = false;
        if (op_is(f, "Flatten")) {
            flat = attr_int(f, "axis", 1) == 1;
        } else if (op_is(f, "Reshape") && f->n_input == 2) {
            int64_t s[4];
            int ns = 0;
            flat = tensor_ints(constant(c, f->input[1]), s, 4, &ns) && ns == 2 &&
                   (s[0] == 0 || s[0] == -1 || s[0] > 0) && (s[1] == channels || s[1] == -1) &&
                   !(s[0] == -1 && s[1] == -1);
            /* allowzero 1 makes a 0 in the shape a dimension of 0, not "keep N" */
            if (flat && s[0] == 0 && attr_int(f, "allowzero", 0) != 0)
                return node_error(c, nx,
                                  "has attribute allowzero = 1 with shape [0, %lld]: its output "
                                  "would be empty",
                                  (long long)s[1]);
        } else if (op_is(f, "Squeeze")) {
            bool ok = f->n_input >= 2 && *S(f->input[1])
                          ? tensor_ints(constant(c, f->input[1]), ax, 4, &cnt)
                          : attr_ints(f, "axes", ax, 4, &cnt);
            flat = ok && spatial_axes(ax, cnt);
        } else if (op_is(f, "Gemm") || op_is(f, "MatMul")) {
            return node_error(c, nx, "reads the pooled features before they are flattened");
        } else {
            flat = false;
        }
        if (!flat) return node_error(c, nx, "is where a ResNet flattens its pooled features");
        head_add(oi, S(f->op_type));
        c->used[nx] = true;
        if ((st = out0(c, nx, &v)) != TW_OK) return st;
    }
    if (n_consumers(c, v) == 0) {
        /* A headless backbone: the pooled features are the graph's output and
         * there is no fc (model/resnet.c gives it a stand-in head; embedding
         * products only). */
        if (!is_graph_output(c, v))
            return tw_model_error(c->err, c->path,
                                  "the pooled features are not the graph's output");
        head_add(oi, "(no classifier: headless)");
        return TW_OK;
    }
    if ((st = next_node(c, v, node, "the classifier (Gemm or MatMul)", &nx)) != TW_OK) return st;
    const Onnx__NodeProto *h = c->g->node[nx];
    float *w = NULL, *b = NULL;
    int64_t ws[4] = {0}, bsh[4] = {0};
    int wd = 0, bd = 0;
    bool trans_b = false;
    double alpha = 1.0, beta = 1.0;
    int out = -1;
    if (op_is(h, "Gemm")) {
        if (h->n_input < 2 || val(c, h->input[0]) != v || attr_int(h, "transA", 0) != 0)
            return node_error(c, nx, "is not features x weights");
        const Onnx__TensorProto *wt = constant(c, h->input[1]);
        if (!wt) return node_error(c, nx, "has weights that are not a constant");
        trans_b = attr_int(h, "transB", 0) != 0;
        const Onnx__AttributeProto *a = attr(h, "alpha");
        if (a && a->has_f) alpha = a->f;
        a = attr(h, "beta");
        if (a && a->has_f) beta = a->f;
        st = tensor_floats(c, wt, "fc weight", &w, ws, &wd);
        if (st == TW_OK && h->n_input >= 3 && *S(h->input[2])) {
            const Onnx__TensorProto *bt = constant(c, h->input[2]);
            st = bt ? tensor_floats(c, bt, "fc bias", &b, bsh, &bd)
                    : node_error(c, nx, "has a bias that is not a constant");
        }
        head_add(oi, "Gemm");
        c->used[nx] = true;
        if (st == TW_OK) st = out0(c, nx, &out);
    } else if (op_is(h, "MatMul")) {
        if (h->n_input != 2 || val(c, h->input[0]) != v)
            return node_error(c, nx, "is not features x weights");
        const Onnx__TensorProto *wt = constant(c, h->input[1]);
        if (!wt) return node_error(c, nx, "has weights that are not a constant");
        st = tensor_floats(c, wt, "fc weight", &w, ws, &wd);
        c->used[nx] = true;
        int mo = -1, ad = -1;
        if (st == TW_OK) st = out0(c, nx, &mo);
        if (st == TW_OK) st = next_node(c, mo, nx, "the classifier's bias (Add)", &ad);
        if (st == TW_OK) {
            const Onnx__NodeProto *an = c->g->node[ad];
            int i_mo = an->n_input != 2             ? -1
                       : val(c, an->input[0]) == mo ? 0
                       : val(c, an->input[1]) == mo ? 1
                                                    : -1;
            const Onnx__TensorProto *bt = i_mo >= 0 ? constant(c, an->input[1 - i_mo]) : NULL;
            if (!op_is(an, "Add") || !bt)
                st = node_error(c, ad, "is not the classifier's bias (an Add of a constant)");
            else
                st = tensor_floats(c, bt, "fc bias", &b, bsh, &bd);
            c->used[ad] = true;
            if (st == TW_OK) st = out0(c, ad, &out);
        }
        head_add(oi, "MatMul, Add");
    } else {
        return node_error(c, nx, "is where a ResNet has its classifier (Gemm or MatMul)");
    }
    /* a [1, K] bias broadcasts like [K] */
    if (st == TW_OK && b && bd == 2 && bsh[0] == 1) {
        bd = 1;
        bsh[0] = bsh[1];
    }
    /* W as [K, C] */
    int64_t k = 0;
    if (st == TW_OK) {
        if (wd != 2 || (trans_b ? ws[1] : ws[0]) != channels)
            st = node_error(c, nx, "has weights that do not take the %d pooled features", channels);
        else
            k = trans_b ? ws[0] : ws[1];
    }
    if (st == TW_OK && b && (bd != 1 || bsh[0] != k))
        st = node_error(c, nx, "has a bias of the wrong size (%lld classes)", (long long)k);
    float *fw = NULL, *fb = NULL;
    if (st == TW_OK) {
        fw = tw_alloc(TW_MEM_WEIGHTS, (size_t)k * (size_t)channels * sizeof(float));
        fb = tw_calloc(TW_MEM_WEIGHTS, (size_t)k, sizeof(float));
        if (!fw || !fb) st = tw_model_nomem(c->err, c->path, (size_t)k * sizeof(float));
    }
    if (st == TW_OK) {
        for (int64_t j = 0; j < k; j++)
            for (int64_t i = 0; i < channels; i++) {
                float x0 = trans_b ? w[j * channels + i] : w[i * k + j];
                fw[j * channels + i] = alpha == 1.0 ? x0 : (float)(alpha * x0);
            }
        for (int64_t j = 0; b && j < k; j++) fb[j] = beta == 1.0 ? b[j] : (float)(beta * b[j]);
    }
    tw_free(w);
    tw_free(b);
    /* an optional Softmax, then the graph's output */
    if (st == TW_OK && n_consumers(c, out) == 1) {
        int sm = c->cons[c->cons_off[out]];
        const Onnx__NodeProto *s = c->g->node[sm];
        int64_t axis = attr_int(s, "axis", c->opset >= 13 ? -1 : 1);
        if (!op_is(s, "Softmax"))
            st = node_error(c, sm, "follows the classifier (only a Softmax over the classes may)");
        else if (axis != 1 && axis != -1)
            st = node_error(c, sm, "has attribute axis = %lld (the classes are axis 1 or -1)",
                            (long long)axis);
        if (st == TW_OK) {
            c->used[sm] = true;
            oi->softmax = true;
            head_add(oi, "Softmax");
            st = out0(c, sm, &out);
        }
    }
    if (st == TW_OK && (n_consumers(c, out) != 0 || !is_graph_output(c, out)))
        st = tw_model_error(c->err, c->path, "the classifier's result is not the graph's output");
    int64_t s2[2] = {k, channels}, s1[1] = {k};
    if (st == TW_OK) {
        st = add_tensor(c, "fc.weight", fw, 2, s2);
        fw = NULL;
    }
    if (st == TW_OK) {
        st = add_tensor(c, "fc.bias", fb, 1, s1);
        fb = NULL;
    }
    tw_free(fw);
    tw_free(fb);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Deepness's metadata_props                                                 */

static void meta_used(tw_onnx_info *oi, const char *key)
{
    size_t o = strlen(oi->metadata);
    snprintf(oi->metadata + o, sizeof oi->metadata - o, "%s%s", o ? ", " : "", key);
}

/* A JSON value of a metadata key; NULL (error set) when it is not JSON. */
static json_t *meta_json(octx *c, const char *key, const char *text)
{
    json_error_t je;
    json_t *j = json_loads(text, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!j) tw_model_error(c->err, c->path, "metadata '%s' is not JSON: %.80s", key, je.text);
    return j;
}

static tw_status meta_floats(octx *c, const char *key, const char *text, float *dst, int *n)
{
    json_t *j = meta_json(c, key, text);
    if (!j) return TW_ERR_MODEL;
    double v[TW_MAX_BANDS];
    size_t m = json_is_array(j) ? json_array_size(j) : 0;
    tw_status st = TW_OK;
    if (m < 1 || m > TW_MAX_BANDS)
        st = tw_model_error(c->err, c->path, "metadata '%s' is not a list of 1..%d numbers", key,
                            TW_MAX_BANDS);
    for (size_t i = 0; st == TW_OK && i < m; i++) {
        json_t *x = json_array_get(j, i);
        if (!json_is_number(x))
            st = tw_model_error(c->err, c->path, "metadata '%s'[%zu] is not a number", key, i);
        else
            v[i] = json_number_value(x);
    }
    json_decref(j);
    if (st != TW_OK) return st;
    return tw_model_set_floats(c->mf, key, v, (int64_t)m, dst, n, dst == c->mf->std, c->err);
}

/* Deepness also reads class names written as a Python dict, {0: 'water',
 * 1: "forest"} (it falls back to ast.literal_eval): that form, with integer
 * keys and quoted strings (backslash escapes the next character), as a JSON
 * object; NULL when text is not of it. */
static json_t *python_dict(const char *text)
{
    json_t *o = json_object();
    const char *p = text;
    char name[TW_NAME_MAX];
#define SKIP_WS()                                                                                  \
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++
    SKIP_WS();
    if (!o || *p++ != '{') goto bad;
    SKIP_WS();
    while (*p != '}') {
        char *end;
        long id = strtol(p, &end, 10);
        if (end == p || id < 0 || id >= TW_MAX_CLASSES) goto bad;
        p = end;
        SKIP_WS();
        if (*p++ != ':') goto bad;
        SKIP_WS();
        char q = *p++;
        if (q != '\'' && q != '"') goto bad;
        size_t n = 0;
        while (*p && *p != q) {
            if (*p == '\\' && p[1]) p++;
            if (n + 1 >= sizeof name) goto bad;
            name[n++] = *p++;
        }
        if (*p++ != q) goto bad;
        name[n] = '\0';
        char ids[24];
        snprintf(ids, sizeof ids, "%ld", id);
        if (json_object_get(o, ids) || json_object_set_new(o, ids, json_string(name)) != 0)
            goto bad;
        SKIP_WS();
        if (*p == ',') {
            p++;
            SKIP_WS();
        } else if (*p != '}') {
            goto bad;
        }
    }
    p++;
    SKIP_WS();
    if (*p) goto bad;
#undef SKIP_WS
    return o;
bad:
    json_decref(o);
    return NULL;
}

/* class_names: {"0": "water", "1": "forest"} (Deepness's, keys 0..K-1; or
 * as a Python dict) or ["water", "forest"]. */
static tw_status meta_classes(octx *c, const char *key, const char *text)
{
    json_t *j = json_loads(text, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
    if (!j) j = python_dict(text);
    if (!j) j = meta_json(c, key, text); /* the JSON error, for the message */
    if (!j) return TW_ERR_MODEL;
    tw_model_file *mf = c->mf;
    tw_status st = TW_OK;
    size_t n = json_is_array(j) ? json_array_size(j) : json_is_object(j) ? json_object_size(j) : 0;
    if (n < 1 || n > TW_MAX_CLASSES)
        st = tw_model_error(c->err, c->path,
                            "metadata '%s' is not a list or an object of 1..%d class names", key,
                            TW_MAX_CLASSES);
    for (size_t i = 0; st == TW_OK && i < n; i++) {
        json_t *x;
        if (json_is_array(j)) {
            x = json_array_get(j, i);
        } else {
            char id[24];
            snprintf(id, sizeof id, "%zu", i);
            x = json_object_get(j, id);
            if (!x) {
                st = tw_model_error(c->err, c->path,
                                    "metadata '%s' has no class %zu (ids must be 0..%zu)", key, i,
                                    n - 1);
                break;
            }
        }
        if (!json_is_string(x))
            st =
                tw_model_error(c->err, c->path, "metadata '%s': class %zu is not a string", key, i);
        else
            st = tw_model_set_class(mf, (int)i, json_string_value(x), c->err);
    }
    json_decref(j);
    if (st == TW_OK) mf->n_classes = (int)n;
    return st;
}

static tw_status read_metadata(octx *c)
{
    tw_onnx_info *oi = &c->mf->onnx;
    const Onnx__ModelProto *m = c->model;
    const char *mean = NULL, *std = NULL, *classes = NULL, *ckey = NULL, *tile = NULL, *tkey = NULL;
    for (size_t i = 0; i < m->n_metadata_props; i++) {
        const char *k = S(m->metadata_props[i]->key), *v = S(m->metadata_props[i]->value);
        if (strcmp(k, "class_names") == 0 || (strcmp(k, "names") == 0 && !classes)) {
            classes = v;
            ckey = k;
        } else if (strcmp(k, "standardization_mean") == 0) {
            mean = v;
        } else if (strcmp(k, "standardization_std") == 0) {
            std = v;
        } else if (strcmp(k, "tiles_size") == 0 || strcmp(k, "tile_size") == 0) {
            if (tile && strcmp(tile, v) != 0)
                return tw_model_error(c->err, c->path,
                                      "metadata 'tiles_size' and 'tile_size' differ");
            tile = v;
            tkey = k;
        } else if (strcmp(k, "resolution") == 0) {
            json_t *j = meta_json(c, k, v);
            if (!j) return TW_ERR_MODEL;
            bool ok = json_is_number(j) && json_number_value(j) > 0;
            if (ok) oi->resolution = json_number_value(j);
            json_decref(j);
            if (!ok)
                return tw_model_error(c->err, c->path,
                                      "metadata 'resolution' is not a positive number");
        } else if (strcmp(k, "model_type") == 0) {
            json_t *j = json_loads(v, JSON_DECODE_ANY, NULL);
            char tb[32];
            snprintf(oi->model_type, sizeof oi->model_type, "%s",
                     clean(j && json_is_string(j) ? json_string_value(j) : v, tb, sizeof tb));
            json_decref(j);
        }
    }
    tw_status st = TW_OK;
    if (classes) {
        st = meta_classes(c, ckey, classes);
        if (st != TW_OK) return st;
        meta_used(oi, ckey);
    }
    if ((mean != NULL) != (std != NULL))
        return tw_model_error(c->err, c->path, "metadata '%s' comes without '%s'",
                              mean ? "standardization_mean" : "standardization_std",
                              mean ? "standardization_std" : "standardization_mean");
    if (mean) {
        /* Deepness scales pixels to 0..1 (x / 255) before standardizing */
        st = meta_floats(c, "standardization_mean", mean, c->mf->mean, &c->mf->n_mean);
        if (st == TW_OK) st = meta_floats(c, "standardization_std", std, c->mf->std, &c->mf->n_std);
        if (st == TW_OK) st = tw_model_set_scale(c->mf, 1.0 / 255.0, c->err);
        if (st != TW_OK) return st;
        meta_used(oi, "standardization_mean");
        meta_used(oi, "standardization_std");
    }
    if (tile) {
        json_t *j = meta_json(c, tkey, tile);
        if (!j) return TW_ERR_MODEL;
        bool ok = json_is_integer(j);
        json_int_t t = ok ? json_integer_value(j) : 0;
        json_decref(j);
        if (!ok) return tw_model_error(c->err, c->path, "metadata '%s' is not an integer", tkey);
        if ((st = tw_model_set_tile(c->mf, (int64_t)t, c->err)) != TW_OK) return st;
        meta_used(oi, tkey);
    }
    if (!isnan(oi->resolution)) meta_used(oi, "resolution");
    return TW_OK;
}

/* ------------------------------------------------------------------------ */

static tw_status recognise(octx *c)
{
    const Onnx__GraphProto *g = c->g;
    tw_onnx_info *oi = &c->mf->onnx;
    oi->n_nodes = (int)g->n_node;
    static const char *const k_ops[] = {"Conv",       "BatchNormalization",
                                        "Relu",       "MaxPool",
                                        "Add",        "GlobalAveragePool",
                                        "ReduceMean", "Flatten",
                                        "Reshape",    "Squeeze",
                                        "Gemm",       "MatMul",
                                        "Softmax",    "Identity",
                                        "Constant"};
    for (size_t i = 0; i < g->n_node; i++) {
        const Onnx__NodeProto *n = g->node[i];
        bool known = false;
        for (size_t k = 0; k < sizeof k_ops / sizeof k_ops[0] && !known; k++)
            known = op_is(n, k_ops[k]);
        const char *dom = S(n->domain);
        if (!known || (*dom && strcmp(dom, "ai.onnx") != 0))
            return node_error(c, (int)i,
                              "is not part of a ResNet (the first such node of the "
                              "graph)");
        /* a ResNet's ops take 5 inputs at most (BatchNormalization) */
        if (n->n_input > 8 || n->n_output > 8)
            return node_error(c, (int)i, "has %zu inputs and %zu outputs", n->n_input, n->n_output);
        tw_status st = check_attrs(c, (int)i);
        if (st != TW_OK) return st;
    }
    tw_status st = index_graph(c);
    if (st != TW_OK) return st;

    int x = -1, n_in = 0;
    for (size_t v = 0; v < c->n_values; v++)
        if (c->values[v].kind == V_INPUT) {
            x = (int)v;
            n_in++;
        }
    if (n_in != 1)
        return tw_model_error(c->err, c->path, "graph has %d inputs (a ResNet has one image)",
                              n_in);
    const Onnx__ValueInfoProto *in = g->input[c->values[x].index];
    int64_t in_c = 0;
    if (in->type && in->type->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE &&
        in->type->tensor_type && in->type->tensor_type->shape) {
        const Onnx__TensorShapeProto *sh = in->type->tensor_type->shape;
        char nb[96];
        if (sh->n_dim != 4)
            return tw_model_error(c->err, c->path,
                                  "graph input '%s' has %zu dimensions (N, C, H, W expected)",
                                  clean(in->name, nb, sizeof nb), sh->n_dim);
        int64_t d[4];
        for (int i = 0; i < 4; i++)
            d[i] = sh->dim[i]->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE
                       ? sh->dim[i]->dim_value
                       : 0;
        in_c = d[1];
        if (d[2] > 0 && d[2] == d[3] && d[2] <= 65536) oi->input_size = (int)d[2];
    }
    if (n_consumers(c, x) != 1)
        return tw_model_error(c->err, c->path,
                              "graph input is read by %d nodes (a ResNet's by its "
                              "stem convolution alone)",
                              n_consumers(c, x));

    /* mf->tensors: five per convolution at most, plus fc */
    size_t n_conv = 0;
    for (size_t i = 0; i < g->n_node; i++) n_conv += op_is(g->node[i], "Conv");
    c->cap = (int)(5 * n_conv + 2);
    c->mf->tensors = tw_calloc(TW_MEM_OTHER, (size_t)c->cap, sizeof *c->mf->tensors);
    if (!c->mf->tensors) return tw_model_nomem(c->err, c->path, (size_t)c->cap);

    int y;
    if ((st = match_stem(c, x, &y)) != TW_OK) return st;
    const tw_tensor *c1 = tw_model_file_find(c->mf, "conv1.weight");
    if (in_c > 0 && c1 && c1->shape[1] != in_c)
        return tw_model_error(c->err, c->path,
                              "graph input has %lld channels but its stem convolution takes %lld",
                              (long long)in_c, (long long)c1->shape[1]);
    blocks bs = {0, 0, 0, 0};
    int channels = c1 ? (int)c1->shape[0] : 0;
    for (;;) {
        bool done;
        int before = c->mf->n_tensors;
        if ((st = match_block(c, &bs, y, &y, &done)) != TW_OK) return st;
        if (done) break;
        /* the block's output channels: its last conv's (before the projection) */
        const tw_tensor *last = &c->mf->tensors[before + 5 * (bs.kind - 1)];
        channels = (int)last->shape[0];
        if (bs.n > 1000) return tw_model_error(c->err, c->path, "more than 1000 blocks");
    }
    if (bs.n == 0)
        return tw_model_error(c->err, c->path, "graph has no residual block after its stem");
    if ((st = match_head(c, y, channels)) != TW_OK) return st;
    for (size_t i = 0; i < g->n_node; i++)
        if (!c->used[i] && !op_is(g->node[i], "Identity") && !op_is(g->node[i], "Constant"))
            return node_error(c, (int)i, "is off the ResNet's path (not part of a ResNet)");
    return TW_OK;
}

tw_status tw_onnx_load(tw_model_file *mf, uint64_t file_size, tw_error *err)
{
    const char *path = mf->path;
    if (file_size > ONNX_MAX_FILE)
        return tw_model_error(err, path, "ONNX file of %llu bytes (protobuf reads 2 GiB at most)",
                              (unsigned long long)file_size);
    if (file_size == 0) return tw_model_error(err, path, "empty file");
    uint8_t *buf = tw_alloc(TW_MEM_OTHER, (size_t)file_size);
    if (!buf) return tw_model_nomem(err, path, (size_t)file_size);
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(buf, 1, (size_t)file_size, f) : 0;
    if (f) fclose(f);
    if (got != file_size) {
        tw_free(buf);
        return tw_model_error(err, path, "cannot read %llu bytes", (unsigned long long)file_size);
    }
    Onnx__ModelProto *model = NULL;
    if (wire_ok(&onnx__model_proto__descriptor, buf, (size_t)file_size))
        model = onnx__model_proto__unpack(&k_pb_allocator, (size_t)file_size, buf);
    tw_free(buf);
    if (!model || !model->graph) {
        bool decoded = model != NULL;
        if (model) onnx__model_proto__free_unpacked(model, &k_pb_allocator);
        return tw_model_error(err, path, "not an ONNX model (%s)",
                              decoded ? "it has no graph"
                                      : "truncated or corrupt: its protobuf does not decode");
    }

    octx c = {.mf = mf, .err = err, .path = path, .model = model, .g = model->graph};
    tw_onnx_info *oi = &mf->onnx;
    oi->resolution = NAN;
    oi->ir_version = model->has_ir_version ? model->ir_version : 0;
    for (size_t i = 0; i < model->n_opset_import; i++) {
        const char *d = S(model->opset_import[i]->domain);
        if (!*d || strcmp(d, "ai.onnx") == 0) oi->opset = model->opset_import[i]->version;
    }
    c.opset = oi->opset;
    char pb[64], vb[64];
    snprintf(oi->producer, sizeof oi->producer, "%.40s%s%.20s",
             clean(model->producer_name, pb, sizeof pb),
             model->producer_version && *model->producer_version ? " " : "",
             clean(model->producer_version, vb, sizeof vb));
    /* the identity of the weights: the file's digest, then external data */
    sha256_init(&c.sha);
    sha256_update(&c.sha, 64, (const uint8_t *)mf->sha256);
    tw_status st = TW_OK;
    if (oi->opset < 7)
        st = tw_model_error(err, path, "ONNX opset %lld (tilewise reads opset 7 and later)",
                            (long long)oi->opset);
    if (st == TW_OK) st = read_metadata(&c);
    if (st == TW_OK) st = recognise(&c);
    if (st == TW_OK && oi->n_external > 0) {
        uint8_t d[SHA256_DIGEST_SIZE];
        sha256_digest(&c.sha, SHA256_DIGEST_SIZE, d);
        for (int i = 0; i < SHA256_DIGEST_SIZE; i++) snprintf(mf->sha256 + 2 * i, 3, "%02x", d[i]);
    }
    if (st == TW_OK && mf->tile == 0 && oi->input_size > 0) mf->tile = oi->input_size;
    tw_free(c.values);
    tw_free(c.canon);
    tw_free(c.cons);
    tw_free(c.cons_off);
    tw_free(c.used);
    onnx__model_proto__free_unpacked(model, &k_pb_allocator);
    return st;
}
