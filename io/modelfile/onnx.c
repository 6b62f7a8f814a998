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
 *
 * This file decodes the file (the wire pre-pass, protobuf-c) and indexes
 * the graph's values; onnx_internal.h says what the other files do.
 */
#include "io/modelfile/onnx_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>

#include "core/alloc.h"
#include "io/modelfile/readers.h"

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
/* Names, messages, nodes' attributes                                        */

/* A name fit for a one-line message: printable ASCII, cut to fit buf. */
const char *onnx_clean(const char *s, char *buf, size_t cap)
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

/* "node 'NAME' (OP) WHAT" - the one message naming the node that does not fit. */
tw_status onnx_node_error(octx *c, int node, const char *fmt, ...)
{
    char what[512], nb[96], ob[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const Onnx__NodeProto *n = c->g->node[node];
    char idx[32] = "";
    if (!n->name || !*n->name) snprintf(idx, sizeof idx, " #%d", node);
    return tw_model_error(c->err, c->path, "node '%s'%s (%s) %s",
                          onnx_clean(n->name, nb, sizeof nb), idx,
                          onnx_clean(n->op_type, ob, sizeof ob), what);
}

static int cmp_value(const void *a, const void *b)
{
    return strcmp(((const value *)a)->name, ((const value *)b)->name);
}

int onnx_find_value(const octx *c, const char *name)
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

const Onnx__AttributeProto *onnx_attr(const Onnx__NodeProto *n, const char *name)
{
    for (size_t i = 0; i < n->n_attribute; i++)
        if (strcmp(S(n->attribute[i]->name), name) == 0) return n->attribute[i];
    return NULL;
}

int64_t onnx_attr_int(const Onnx__NodeProto *n, const char *name, int64_t def)
{
    const Onnx__AttributeProto *a = onnx_attr(n, name);
    return a && a->has_i ? a->i : def;
}

/* The ints of attribute name into out[0..max); count in *n (0 when absent);
 * false when it has more than max. */
bool onnx_attr_ints(const Onnx__NodeProto *n, const char *name, int64_t *out, int max, int *cnt)
{
    const Onnx__AttributeProto *a = onnx_attr(n, name);
    *cnt = 0;
    if (!a) return true;
    if (a->n_ints > (size_t)max) return false;
    for (size_t i = 0; i < a->n_ints; i++) out[i] = a->ints[i];
    *cnt = (int)a->n_ints;
    return true;
}

/* ------------------------------------------------------------------------ */
/* The graph's values and their consumers                                    */

/* c->values: initializers, graph inputs and node outputs, sorted by name;
 * each named once. Allocates c->values, c->canon, c->cons_off, c->used. */
static tw_status collect_values(octx *c)
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
                                  onnx_clean(c->values[i].name, nb, sizeof nb));
        }
    }

    return TW_OK;
}

static tw_status check_order(octx *c)
{
    const Onnx__GraphProto *g = c->g;
    /* Nodes in topological order, as ONNX requires: every input defined by
     * an initializer, the graph input or an earlier node. */
    for (size_t i = 0; i < g->n_node; i++) {
        const Onnx__NodeProto *nd = g->node[i];
        for (size_t j = 0; j < nd->n_input; j++) {
            if (!*S(nd->input[j])) continue; /* an omitted optional input */
            int v = onnx_find_value(c, nd->input[j]);
            char nb[96];
            if (v < 0)
                return onnx_node_error(c, (int)i, "reads '%s', which nothing defines",
                                       onnx_clean(nd->input[j], nb, sizeof nb));
            if (c->values[v].kind == V_NODE && (size_t)c->values[v].index >= i)
                return onnx_node_error(c, (int)i,
                                       "reads '%s' before it is computed (ONNX wants nodes in "
                                       "topological order)",
                                       onnx_clean(nd->input[j], nb, sizeof nb));
        }
    }
    return TW_OK;
}

static void resolve_aliases(octx *c)
{
    const Onnx__GraphProto *g = c->g;
    size_t k = c->n_values;
    /* Identity nodes alias their input: resolve in node order (inputs come
     * first), so one pass suffices. */
    for (size_t i = 0; i < k; i++) c->canon[i] = (int)i;
    for (size_t i = 0; i < g->n_node; i++) {
        const Onnx__NodeProto *nd = g->node[i];
        if (!op_is(nd, "Identity") || nd->n_input != 1 || nd->n_output != 1) continue;
        int in = onnx_find_value(c, nd->input[0]), out = onnx_find_value(c, nd->output[0]);
        if (in >= 0 && out >= 0) c->canon[out] = c->canon[in];
    }
}

static tw_status index_consumers(octx *c)
{
    const Onnx__GraphProto *g = c->g;
    size_t k = c->n_values;
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
            /* Identity aliases; a segmentation graph's Shape reads no data (its
             * sizes are matched where a Resize reads them) */
            if (op_is(nd, "Identity") || (c->seg && op_is(nd, "Shape"))) continue;
            for (size_t j = 0; j < nd->n_input; j++) {
                if (!*S(nd->input[j])) continue;
                int v = c->canon[onnx_find_value(c, nd->input[j])];
                /* a node reading the same value twice counts once */
                bool dup = false;
                for (size_t q = 0; q < j && !dup; q++)
                    dup = *S(nd->input[q]) && c->canon[onnx_find_value(c, nd->input[q])] == v;
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

tw_status onnx_index_graph(octx *c)
{
    tw_status st = collect_values(c);
    if (st == TW_OK) st = check_order(c);
    if (st != TW_OK) return st;
    resolve_aliases(c);
    return index_consumers(c);
}

/* Canonical value index of name; -1 when undefined. */
int onnx_val(const octx *c, const char *name)
{
    int v = onnx_find_value(c, S(name));
    return v < 0 ? -1 : c->canon[v];
}

int onnx_n_consumers(const octx *c, int v)
{
    return c->cons_off[v + 1] - c->cons_off[v];
}

bool onnx_is_graph_output(const octx *c, int v)
{
    for (size_t i = 0; i < c->g->n_output; i++)
        if (onnx_val(c, c->g->output[i]->name) == v) return true;
    return false;
}

/* The one node reading value v (output of node `from`, for messages).
 * Anything else - no reader, two readers - is refused. */
tw_status onnx_next_node(octx *c, int v, int from, const char *expect, int *out)
{
    int n = onnx_n_consumers(c, v);
    if (n == 1) {
        *out = c->cons[c->cons_off[v]];
        return TW_OK;
    }
    if (n == 0) return onnx_node_error(c, from, "has no successor where a ResNet has %s", expect);
    return onnx_node_error(c, c->cons[c->cons_off[v] + 1],
                           "also reads the output of node #%d: a ResNet has a single path there "
                           "(expected %s)",
                           from, expect);
}

/* The canonical value of node n's output 0; others must be unused. */
tw_status onnx_out0(octx *c, int node, int *v)
{
    const Onnx__NodeProto *n = c->g->node[node];
    if (n->n_output < 1) return onnx_node_error(c, node, "has no output");
    for (size_t o = 1; o < n->n_output; o++) {
        int w = onnx_val(c, n->output[o]);
        if (w >= 0 && (onnx_n_consumers(c, w) > 0 || onnx_is_graph_output(c, w)))
            return onnx_node_error(c, node,
                                   "has its output %zu in use (a ResNet uses only its first)", o);
    }
    *v = onnx_val(c, n->output[0]);
    if (*v < 0) return onnx_node_error(c, node, "has no named output");
    return TW_OK;
}

/* ------------------------------------------------------------------------ */
/* The file                                                                  */

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
    oi->tiles_overlap = -1;
    oi->ir_version = model->has_ir_version ? model->ir_version : 0;
    for (size_t i = 0; i < model->n_opset_import; i++) {
        const char *d = S(model->opset_import[i]->domain);
        if (!*d || strcmp(d, "ai.onnx") == 0) oi->opset = model->opset_import[i]->version;
    }
    c.opset = oi->opset;
    char pb[64], vb[64];
    snprintf(oi->producer, sizeof oi->producer, "%.40s%s%.20s",
             onnx_clean(model->producer_name, pb, sizeof pb),
             model->producer_version && *model->producer_version ? " " : "",
             onnx_clean(model->producer_version, vb, sizeof vb));
    /* the identity of the weights: the file's digest, then external data */
    sha256_init(&c.sha);
    sha256_update(&c.sha, 64, (const uint8_t *)mf->sha256);
    tw_status st = TW_OK;
    if (oi->opset < 7)
        st = tw_model_error(err, path, "ONNX opset %lld (tilewise reads opset 7 and later)",
                            (long long)oi->opset);
    if (st == TW_OK) st = onnx_read_metadata(&c);
    if (st == TW_OK) st = onnx_recognise(&c);
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
