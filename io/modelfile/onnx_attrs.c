/* onnx_attrs.c - every attribute of every node checked against the ONNX
 * operator schemas (opsets 7 to 22) and against what tilewise runs (see
 * onnx_internal.h). */
#include "io/modelfile/onnx_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

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
 * onnx_recognise() and onnx_recognise_seg() accept and no others. Relu, Add,
 * GlobalAveragePool, MatMul, Slice (opset 10 and later) and Identity define
 * no attribute. */
static const attr_rule k_attr_rules[] = {
    {"Conv", "auto_pad", AT(STRING), 1, 0, A_MATCHED, NULL},
    /* dilations: 1 in a classifier, torchvision's at their place in a
     * segmentation graph (onnx_resnet.c conv_geometry, onnx_seg.c) */
    {"Conv", "dilations", AT(INTS), 1, 0, A_MATCHED, NULL},
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
    /* segmentation graphs (onnx_seg.c): the Resize's mode, coordinates,
     * axes and aspect policy are checked against its place; the size
     * arithmetic's attributes where it is evaluated */
    {"Resize", "mode", AT(STRING), 10, 0, A_MATCHED, NULL},
    {"Resize", "coordinate_transformation_mode", AT(STRING), 11, 0, A_MATCHED, NULL},
    {"Resize", "nearest_mode", AT(STRING), 11, 0, A_MATCHED, NULL},
    {"Resize", "cubic_coeff_a", AT(FLOAT), 11, 0, A_ANY, NULL},       /* cubic only */
    {"Resize", "extrapolation_value", AT(FLOAT), 11, 0, A_ANY, NULL}, /* crop only */
    {"Resize", "exclude_outside", AT(INT), 11, 0, A_ZERO, "0"},
    {"Resize", "antialias", AT(INT), 18, 0, A_ZERO, "0"},
    {"Resize", "axes", AT(INTS), 18, 0, A_MATCHED, NULL},
    {"Resize", "keep_aspect_ratio_policy", AT(STRING), 18, 0, A_MATCHED, NULL},
    {"Concat", "axis", AT(INT), 1, 0, A_MATCHED, NULL},
    {"Shape", "start", AT(INT), 15, 0, A_MATCHED, NULL},
    {"Shape", "end", AT(INT), 15, 0, A_MATCHED, NULL},
    {"Gather", "axis", AT(INT), 1, 0, A_ZERO, "0"},
    {"Unsqueeze", "axes", AT(INTS), 1, 12, A_MATCHED, NULL},
    {"Cast", "to", AT(INT), 1, 0, A_MATCHED, NULL},
    {"Cast", "saturate", AT(INT), 19, 0, A_ANY, NULL}, /* float8 only */
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
        snprintf(buf, cap, "'%s'", onnx_clean(s, sb, sizeof sb));
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
tw_status onnx_check_attrs(octx *c, int node)
{
    const Onnx__NodeProto *n = c->g->node[node];
    for (size_t i = 0; i < n->n_attribute; i++) {
        const Onnx__AttributeProto *a = n->attribute[i];
        char ab[96], vb[96];
        const char *name = onnx_clean(a->name, ab, sizeof ab);
        for (size_t j = 0; j < i; j++)
            if (strcmp(S(n->attribute[j]->name), S(a->name)) == 0)
                return onnx_node_error(c, node, "has attribute %s twice", name);
        if (a->ref_attr_name && *a->ref_attr_name)
            return onnx_node_error(c, node,
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
            return onnx_node_error(
                c, node, "has attribute %s = %s, which %s does not define at opset %lld", name,
                attr_text(a, vb, sizeof vb), S(n->op_type), (long long)c->opset);
        int t = attr_type_of(a);
        bool filled = (t == AT(FLOAT) && a->has_f) || (t == AT(INT) && a->has_i) ||
                      (t == AT(STRING) && a->has_s) || (t == AT(TENSOR) && a->t) ||
                      (t == AT(INTS) || t == AT(FLOATS) || t == AT(STRINGS)) ||
                      (t == AT(SPARSE_TENSOR) && a->sparse_tensor);
        if (t != r->type)
            return onnx_node_error(c, node,
                                   "has attribute %s = %s of type %s (%s's %s is of type %s)", name,
                                   attr_text(a, vb, sizeof vb), attr_type_name(t), r->op, r->name,
                                   attr_type_name(r->type));
        if (!filled)
            return onnx_node_error(c, node, "has attribute %s of type %s without its value", name,
                                   attr_type_name(t));
        if (r->rule == A_NEVER)
            return onnx_node_error(
                c, node,
                "has attribute %s = %s (tilewise reads a Constant's tensor 'value' "
                "only)",
                name, attr_text(a, vb, sizeof vb));
        if (!attr_value_ok(a, r->rule))
            return onnx_node_error(c, node, "has attribute %s = %s (tilewise runs %s = %s only)",
                                   name, attr_text(a, vb, sizeof vb), name, r->want);
    }
    return TW_OK;
}

/* Node n's attribute name as "name = value" for the matcher's messages. */
const char *onnx_attr_show(const Onnx__NodeProto *n, const char *name, char *buf, size_t cap)
{
    const Onnx__AttributeProto *a = onnx_attr(n, name);
    char vb[80];
    snprintf(buf, cap, "%s = %s", name, a ? attr_text(a, vb, sizeof vb) : "(absent)");
    return buf;
}
#undef AT
