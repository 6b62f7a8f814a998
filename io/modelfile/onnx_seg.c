/* onnx_seg.c - an ONNX graph recognised as a segmentation network by data
 * flow, its tensors named as model/segnet.c reads them (see
 * onnx_internal.h, onnx_recognise_seg):
 *
 *  - the encoder: a torchvision ResNet (onnx_resnet.c's stem and blocks),
 *    every convolution checked against its place. Dilated as torchvision's
 *    replace_stride_with_dilation=[False, True, True] (layer3 and layer4
 *    keep stride 1: bottleneck conv2 dilations 1, 2, ... / 2, 4, ...): an
 *    FCN or DeepLabV3 backbone (backbone.*). Not dilated: a U-Net encoder
 *    (encoder.*), whose stem ReLU and layer1..3 outputs are also the skips.
 *  - FCN head (classifier.0 3x3 [+BN] ReLU, classifier.4 1x1 + bias) or
 *    DeepLabV3's (the ASPP: a 1x1 branch, 3x3 branches of rates 12/24/36
 *    and image pooling - GlobalAveragePool or ReduceMean over H, W, 1x1
 *    conv, ReLU, a bilinear Resize back - concatenated in that order, the
 *    1x1 projection, classifier.1 3x3, classifier.4 1x1 + bias), then a
 *    bilinear Resize (half_pixel: align_corners=False) to the input's size.
 *  - U-Net decoder: five blocks of a nearest x2 Resize, a Concat of
 *    [upsampled, skip] (none in the last), two 3x3 [+BN] ReLU; then
 *    segmentation_head.0 3x3 + bias.
 *  - an optional Softmax over the classes (axis 1), then the graph output.
 * Resize sizes are read from constants or from the Shape / Gather /
 * Unsqueeze / Slice / Concat / Cast arithmetic torch.onnx.export writes for
 * them (those Shape nodes read no data: they are not counted as readers).
 * Anything else is refused naming the first node that does not fit.
 */
#include "io/modelfile/onnx_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

/* ------------------------------------------------------------------------ */
/* Shape arithmetic: the sizes a Resize reads                                */

/* One element of a shape vector: a constant, or dimension `axis` of value v. */
typedef struct dim_sym {
    int v; /* -1: constant */
    int axis;
    int64_t k;
} dim_sym;

enum { SYM_MAX = 8, SYM_DEPTH = 12 };

static tw_status sym_eval(octx *c, int from, const char *name, dim_sym *out, int *n, int depth);

/* Constant int64 input i of node (a missing one: absent). */
static bool node_ints(octx *c, const Onnx__NodeProto *nd, size_t i, int64_t *v, int max, int *n)
{
    *n = 0;
    if (nd->n_input <= i || !*S(nd->input[i])) return false;
    return onnx_tensor_ints(onnx_constant(c, nd->input[i]), v, max, n);
}

static tw_status sym_node(octx *c, int node, dim_sym *out, int *n, int depth)
{
    const Onnx__NodeProto *nd = c->g->node[node];
    int64_t a[SYM_MAX], b[SYM_MAX];
    int na = 0, nb = 0;
    tw_status st;
    if (op_is(nd, "Shape") && nd->n_input == 1) {
        int64_t start = onnx_attr_int(nd, "start", 0), end = onnx_attr_int(nd, "end", 4);
        if (start < 0) start += 4;
        if (end < 0) end += 4;
        if (start < 0 || end > 4 || start > end)
            return onnx_node_error(c, node, "takes dimensions %lld..%lld of a 4-D map",
                                   (long long)start, (long long)end);
        *n = 0;
        for (int64_t i = start; i < end; i++)
            out[(*n)++] = (dim_sym){onnx_val(c, nd->input[0]), (int)i, 0};
    } else if (op_is(nd, "Gather") && nd->n_input == 2) {
        const Onnx__TensorProto *ix = onnx_constant(c, nd->input[1]);
        dim_sym d[SYM_MAX];
        int nd2 = 0;
        if (!ix || ix->n_dims != 0 || !onnx_tensor_ints(ix, a, 1, &na) || na != 1)
            return onnx_node_error(c, node, "gathers with an index that is not a constant scalar");
        if ((st = sym_eval(c, node, nd->input[0], d, &nd2, depth + 1)) != TW_OK) return st;
        if (a[0] < 0) a[0] += nd2;
        if (a[0] < 0 || a[0] >= nd2) return onnx_node_error(c, node, "gathers out of range");
        out[0] = d[a[0]];
        *n = 1;
    } else if (op_is(nd, "Unsqueeze") && nd->n_input >= 1) {
        bool ok = nd->n_input >= 2 ? node_ints(c, nd, 1, a, 2, &na)
                                   : onnx_attr_ints(nd, "axes", a, 2, &na);
        if (!ok || na != 1 || (a[0] != 0 && a[0] != -1))
            return onnx_node_error(c, node, "unsqueezes other than a scalar into a vector");
        if ((st = sym_eval(c, node, nd->input[0], out, n, depth + 1)) != TW_OK) return st;
        if (*n != 1) return onnx_node_error(c, node, "unsqueezes other than a scalar");
    } else if (op_is(nd, "Cast") && nd->n_input == 1) {
        if (onnx_attr_int(nd, "to", 0) != ONNX__TENSOR_PROTO__DATA_TYPE__INT64)
            return onnx_node_error(c, node, "casts a size to other than int64");
        if ((st = sym_eval(c, node, nd->input[0], out, n, depth + 1)) != TW_OK) return st;
    } else if (op_is(nd, "Concat") && onnx_attr_int(nd, "axis", 1) == 0) {
        *n = 0;
        for (size_t i = 0; i < nd->n_input; i++) {
            dim_sym d[SYM_MAX];
            int k = 0;
            if ((st = sym_eval(c, node, nd->input[i], d, &k, depth + 1)) != TW_OK) return st;
            if (*n + k > SYM_MAX) return onnx_node_error(c, node, "makes too long a shape");
            memcpy(out + *n, d, (size_t)k * sizeof *d);
            *n += k;
        }
    } else if (op_is(nd, "Slice") && nd->n_input >= 3) {
        dim_sym d[SYM_MAX];
        int k = 0;
        int64_t ax[1] = {0}, step[1] = {1};
        int nax = 0, nst = 0;
        bool ok =
            node_ints(c, nd, 1, a, 1, &na) && na == 1 && node_ints(c, nd, 2, b, 1, &nb) && nb == 1;
        if (ok && nd->n_input >= 4 && *S(nd->input[3]))
            ok = node_ints(c, nd, 3, ax, 1, &nax) && nax == 1 && (ax[0] == 0 || ax[0] == -1);
        if (ok && nd->n_input >= 5 && *S(nd->input[4]))
            ok = node_ints(c, nd, 4, step, 1, &nst) && nst == 1 && step[0] == 1;
        if (!ok)
            return onnx_node_error(c, node,
                                   "slices a shape other than by constant starts and ends with "
                                   "step 1");
        if ((st = sym_eval(c, node, nd->input[0], d, &k, depth + 1)) != TW_OK) return st;
        int64_t s0 = a[0] < 0 ? a[0] + k : a[0], e0 = b[0] < 0 ? b[0] + k : b[0];
        if (s0 < 0) s0 = 0;
        if (e0 > k) e0 = k;
        *n = 0;
        for (int64_t i = s0; i < e0; i++) out[(*n)++] = d[i];
    } else {
        return onnx_node_error(c, node, "is not the size arithmetic of a Resize");
    }
    c->used[node] = true;
    return TW_OK;
}

/* Value `name` (read by node `from`) as a shape vector of at most SYM_MAX
 * elements. */
static tw_status sym_eval(octx *c, int from, const char *name, dim_sym *out, int *n, int depth)
{
    const Onnx__TensorProto *t = onnx_constant(c, name);
    *n = 0;
    if (depth > SYM_DEPTH) return onnx_node_error(c, from, "computes a size too deviously");
    if (t) {
        int64_t v[SYM_MAX];
        if (!onnx_tensor_ints(t, v, SYM_MAX, n))
            return onnx_node_error(c, from, "reads a size that is not an int64 vector");
        for (int i = 0; i < *n; i++) out[i] = (dim_sym){-1, 0, v[i]};
        return TW_OK;
    }
    int v = onnx_find_value(c, S(name));
    if (v < 0 || c->values[c->canon[v]].kind != V_NODE)
        return onnx_node_error(c, from, "reads a size that is neither a constant nor computed");
    return sym_node(c, c->values[c->canon[v]].index, out, n, depth);
}

/* ------------------------------------------------------------------------ */
/* Resize                                                                    */

/* Node's string attribute name into buf ("" when absent). */
static const char *attr_str(const Onnx__NodeProto *n, const char *name, char *buf, size_t cap)
{
    const Onnx__AttributeProto *a = onnx_attr(n, name);
    buf[0] = '\0';
    if (a && a->has_s)
        snprintf(buf, cap, "%.*s", (int)(a->s.len < cap - 1 ? a->s.len : cap - 1),
                 (const char *)a->s.data);
    return buf;
}

/* Whether nearest mode nm under transformation ctm maps output x to input
 * x / 2 (an exact x2 nearest upsampling, PyTorch's) for every x. */
static bool nearest_x2_exact(const char *ctm, const char *nm)
{
    for (int x = 0; x < 8; x++) {
        double xi;
        if (!strcmp(ctm, "asymmetric"))
            xi = x / 2.0;
        else if (!strcmp(ctm, "half_pixel") || !strcmp(ctm, "pytorch_half_pixel"))
            xi = (x + 0.5) / 2.0 - 0.5;
        else if (!strcmp(ctm, "tf_half_pixel_for_nn"))
            xi = (x + 0.5) / 2.0;
        else
            return false;
        double f = (double)(int64_t)(xi + 8.0) - 8.0, r; /* floor */
        if (!strcmp(nm, "floor"))
            r = f;
        else if (!strcmp(nm, "ceil"))
            r = xi == f ? f : f + 1;
        else if (!strcmp(nm, "round_prefer_floor"))
            r = xi - f <= 0.5 ? f : f + 1;
        else if (!strcmp(nm, "round_prefer_ceil"))
            r = xi - f < 0.5 ? f : f + 1;
        else
            return false;
        if (r < 0) r = 0;
        if ((int)r != x / 2) return false;
    }
    return true;
}

/* What a Resize must do at its place. */
typedef struct resize_want {
    bool nearest2; /* nearest x2 (U-Net) or bilinear, align_corners=False, to `like` */
    int like;      /* the value whose H, W the result takes (bilinear) */
    int like_side; /* its side when known (> 0) */
    int *got_side; /* out: the constant side the sizes say, 0 when symbolic */
} resize_want;

/* The Resize's mode and coordinates: nearest x2 as PyTorch's, or linear
 * half_pixel; refused naming the attribute otherwise. */
static tw_status resize_modes(octx *c, int node, bool nearest2)
{
    const Onnx__NodeProto *n = c->g->node[node];
    char mode[32], ctm[32], nm[32], kp[32], ab[128];
    attr_str(n, "mode", mode, sizeof mode);
    if (!*mode) snprintf(mode, sizeof mode, "nearest");
    attr_str(n, "coordinate_transformation_mode", ctm, sizeof ctm);
    if (!*ctm) snprintf(ctm, sizeof ctm, "half_pixel");
    attr_str(n, "nearest_mode", nm, sizeof nm);
    if (!*nm) snprintf(nm, sizeof nm, "round_prefer_floor");
    attr_str(n, "keep_aspect_ratio_policy", kp, sizeof kp);
    if (onnx_attr(n, "axes"))
        return onnx_node_error(c, node, "has attribute %s (tilewise resizes all four axes)",
                               onnx_attr_show(n, "axes", ab, sizeof ab));
    if (*kp && strcmp(kp, "stretch") != 0)
        return onnx_node_error(c, node, "has attribute %s (tilewise runs 'stretch')",
                               onnx_attr_show(n, "keep_aspect_ratio_policy", ab, sizeof ab));
    if (nearest2) {
        if (strcmp(mode, "nearest") != 0)
            return onnx_node_error(c, node,
                                   "has attribute mode = '%s' where a U-Net decoder upsamples "
                                   "nearest x2",
                                   mode);
        if (!nearest_x2_exact(ctm, nm))
            return onnx_node_error(c, node,
                                   "has coordinate_transformation_mode = '%s' with nearest_mode "
                                   "= '%s': not PyTorch's nearest x2",
                                   ctm, nm);
        return TW_OK;
    }
    if (strcmp(mode, "linear") != 0)
        return onnx_node_error(c, node,
                               "has attribute mode = '%s' where the network resizes bilinearly "
                               "(align_corners=False)",
                               mode);
    if (strcmp(ctm, "half_pixel") != 0 && strcmp(ctm, "pytorch_half_pixel") != 0)
        return onnx_node_error(c, node,
                               "has attribute coordinate_transformation_mode = '%s' where the "
                               "network resizes with align_corners=False (half_pixel)",
                               ctm);
    return TW_OK;
}

/* Node `node` as a Resize of value v (see resize_want); its output into *out. */
static tw_status take_resize(octx *c, int node, int v, const resize_want *w, int *out)
{
    const Onnx__NodeProto *n = c->g->node[node];
    if (!op_is(n, "Resize") || n->n_input < 3 || onnx_val(c, n->input[0]) != v)
        return onnx_node_error(c, node, "is where the network resizes its map (a Resize)");
    tw_status st = resize_modes(c, node, w->nearest2);
    if (st != TW_OK) return st;
    bool has_sizes = n->n_input >= 4 && *S(n->input[3]);
    if (w->got_side) *w->got_side = 0;
    /* scales: [1, 1, 2, 2] for nearest x2; empty where sizes are given (an
     * empty tensor, as opset 11 wants, or none) */
    const Onnx__TensorProto *t = *S(n->input[2]) ? onnx_constant(c, n->input[2]) : NULL;
    bool no_scales = !*S(n->input[2]) || (t && t->n_dims == 1 && t->dims[0] == 0);
    if (!no_scales) {
        float *s = NULL;
        int64_t sh[4];
        int nd = 0;
        if (!t) return onnx_node_error(c, node, "has scales that are not a constant");
        if ((st = onnx_tensor_floats(c, t, "Resize scales", &s, sh, &nd)) != TW_OK) return st;
        bool x2 =
            nd == 1 && sh[0] == 4 && s[0] == 1.0f && s[1] == 1.0f && s[2] == 2.0f && s[3] == 2.0f;
        tw_free(s);
        if (has_sizes || !(x2 && w->nearest2))
            return onnx_node_error(c, node, "has scales where %s",
                                   w->nearest2 ? "a U-Net decoder doubles its map ([1, 1, 2, 2])"
                                               : "the network resizes to a given size");
    } else if (!has_sizes) {
        return onnx_node_error(c, node, "gives neither scales nor sizes");
    }
    if (has_sizes) {
        dim_sym d[SYM_MAX];
        int k = 0;
        if ((st = sym_eval(c, node, n->input[3], d, &k, 0)) != TW_OK) return st;
        if (k != 4) return onnx_node_error(c, node, "gives %d sizes (4 expected)", k);
        /* N, C: the input's (or constants: a fixed batch runs the same) */
        for (int i = 0; i < 2; i++)
            if (d[i].v >= 0 && !(d[i].v == v && d[i].axis == i))
                return onnx_node_error(c, node, "changes dimension %d of its input", i);
        int side = 0;
        for (int i = 2; i < 4; i++) {
            bool ok;
            if (w->nearest2)
                ok = false; /* x2 from the map's own shape: not written by torch */
            else if (d[i].v >= 0)
                ok = d[i].v == w->like && d[i].axis == i;
            else
                ok = d[i].k > 0 && (w->like_side <= 0 || d[i].k == w->like_side) &&
                     (side == 0 || d[i].k == side);
            if (!ok)
                return onnx_node_error(
                    c, node, "resizes dimension %d to other than the %s's side", i,
                    w->like == onnx_val(c, c->g->input[0]->name) ? "network input"
                                                                 : "map it is concatenated with");
            if (d[i].v < 0) side = (int)d[i].k;
        }
        if (w->got_side) *w->got_side = side;
    }
    c->used[node] = true;
    return onnx_out0(c, node, out);
}

/* ------------------------------------------------------------------------ */
/* Convolutions at their places                                              */

/* What a convolution must be at its place. */
typedef struct conv_want {
    int k, stride, dil;
    const char *where; /* for messages */
} conv_want;

/* Node `node` as a conv (+BN) of geometry w reading value v, then (relu) a
 * ReLU; the result into cv (cv->out after the ReLU when relu). */
static tw_status take_conv_at(octx *c, int node, int v, conv_want w, bool relu, onnx_conv *cv)
{
    const Onnx__NodeProto *n = c->g->node[node];
    if (!op_is(n, "Conv") || n->n_input < 2 || onnx_val(c, n->input[0]) != v)
        return onnx_node_error(c, node, "is where %s has a convolution", w.where);
    tw_status st = onnx_take_conv(c, node, cv);
    if (st != TW_OK) return st;
    int pad = w.dil * (w.k / 2);
    if (cv->k != w.k || cv->stride != w.stride || cv->dil != w.dil || cv->pad != pad ||
        cv->group != 1)
        return onnx_node_error(c, node,
                               "is a %dx%d stride-%d convolution of dilation %d, padding %d "
                               "(group %d) where %s has %dx%d stride %d dilation %d padding %d",
                               cv->k, cv->k, cv->stride, cv->dil, cv->pad, cv->group, w.where, w.k,
                               w.k, w.stride, w.dil, pad);
    if (!relu) return TW_OK;
    int r = -1, y;
    if ((st = onnx_next_node(c, cv->out, cv->last, "a ReLU", &r)) != TW_OK) return st;
    if ((st = onnx_take_relu(c, r, cv->out, &y)) != TW_OK) return st;
    cv->out = y;
    cv->last = r;
    return TW_OK;
}

/* The one reader of value v (the output of node from), of operator op: no
 * reader, or another reader besides it, is refused naming that other one. */
static tw_status one_reader(octx *c, int v, int from, const char *op, const char *expect, int *out)
{
    int n = onnx_n_consumers(c, v);
    const int *cs = c->cons + c->cons_off[v];
    if (n == 1) {
        *out = cs[0];
        return TW_OK;
    }
    if (n == 0)
        return onnx_node_error(c, from, "has no successor where the network has %s", expect);
    int other = cs[1];
    for (int i = n - 1; i >= 0; i--)
        if (!op_is(c->g->node[cs[i]], op)) other = cs[i];
    return onnx_node_error(c, other,
                           "also reads the output of node #%d, where the network has %s alone",
                           from, expect);
}

/* Emit cv as NAME.weight + NAME.bias (a conv with its own bias, no BN). */
static tw_status emit_biased(octx *c, onnx_conv *cv, const char *name)
{
    char t[128];
    int64_t s1[1] = {cv->cout};
    snprintf(t, sizeof t, "%s.weight", name);
    tw_status st = onnx_add_tensor(c, t, cv->w, 4, cv->wshape);
    cv->w = NULL;
    snprintf(t, sizeof t, "%s.bias", name);
    if (st == TW_OK)
        st = onnx_add_tensor(c, t, cv->b, 1, s1);
    else
        tw_free(cv->b);
    cv->b = NULL;
    return st;
}

/* take_conv_at then emit under name / bn_name; the value after into *out. */
static tw_status conv_emit(octx *c, int node, int v, conv_want w, bool relu, const char *name,
                           const char *bn_name, int *out)
{
    onnx_conv cv;
    memset(&cv, 0, sizeof cv);
    tw_status st = take_conv_at(c, node, v, w, relu, &cv);
    if (st == TW_OK) {
        *out = cv.out;
        st = bn_name ? onnx_emit_conv(c, &cv, name, bn_name) : emit_biased(c, &cv, name);
    }
    onnx_conv_free(&cv);
    return st;
}

/* ------------------------------------------------------------------------ */
/* The encoder                                                               */

typedef struct encoder {
    int feat[5];  /* the stem's ReLU, layer1..4's outputs */
    bool dilated; /* layer3/4 dilated (torchvision's FCN / DeepLabV3) */
} encoder;

/* The readers of value x: a block's first conv and its projection (or the
 * Add of its identity shortcut), besides skip Concats; *done when x goes
 * to the head instead. */
static tw_status seg_block_start(octx *c, int x, int *main_node, int *down_node, bool *done)
{
    int nc = onnx_n_consumers(c, x), n_conv = 0, n_add = 0, n_other = 0;
    const int *cs = c->cons + c->cons_off[x];
    *main_node = *down_node = -1;
    for (int i = 0; i < nc; i++) {
        const Onnx__NodeProto *n = c->g->node[cs[i]];
        if (op_is(n, "Conv")) {
            if (n_conv == 0) *main_node = cs[i];
            if (n_conv == 1) *down_node = cs[i];
            n_conv++;
        } else if (op_is(n, "Add")) {
            n_add++;
        } else if (!op_is(n, "Concat")) {
            n_other++;
        }
    }
    *done = !(n_other == 0 && ((n_conv == 2 && n_add == 0) || (n_conv == 1 && n_add == 1)));
    return TW_OK;
}

/* The block's geometry at (stage, idx) as model/segnet.c builds it. */
static tw_status seg_block_geometry(octx *c, const onnx_blocks *bs, const encoder *e,
                                    const onnx_block *b)
{
    int s = bs->stage, i = bs->idx;
    bool bott = b->kind == 3;
    int stride = i == 0 && s > 0 && !(e->dilated && s >= 2) ? 2 : 1;
    int dil = 1;
    if (e->dilated && s == 2) dil = i == 0 ? 1 : 2;
    if (e->dilated && s == 3) dil = i == 0 ? 2 : 4;
    char where[96];
    snprintf(where, sizeof where, "%s's layer%d.%d", e->dilated ? "a dilated backbone" : "a U-Net",
             s + 1, i);
    for (int j = 0; j < b->np; j++) {
        const onnx_conv *cv = &b->path[j];
        int k = bott ? (j == 1 ? 3 : 1) : 3;
        int st_ = (bott && j == 1) || (!bott && j == 0) ? stride : 1;
        int d = bott && j == 1 ? dil : 1;
        int pad = d * (k / 2);
        if (cv->k != k || cv->stride != st_ || cv->dil != d || cv->pad != pad)
            return onnx_node_error(c, cv->node,
                                   "is a %dx%d stride-%d convolution of dilation %d, padding %d "
                                   "where %s has %dx%d stride %d dilation %d padding %d",
                                   cv->k, cv->k, cv->stride, cv->dil, cv->pad, where, k, k, st_, d,
                                   pad);
    }
    const onnx_conv *dn = &b->down;
    if (dn->w && (dn->k != 1 || dn->stride != stride || dn->dil != 1 || dn->pad != 0))
        return onnx_node_error(c, dn->node,
                               "is a %dx%d stride-%d projection (dilation %d) where %s has 1x1 "
                               "stride %d",
                               dn->k, dn->k, dn->stride, dn->dil, where, stride);
    return TW_OK;
}

/* One block reading x, its stage decided by its projection (every stage of
 * a torchvision ResNet but a basic layer1 starts with one). */
static tw_status seg_block(octx *c, onnx_blocks *bs, encoder *e, int x, int *out, bool *done)
{
    int main_node, down_node;
    tw_status st = seg_block_start(c, x, &main_node, &down_node, done);
    if (st != TW_OK || *done) return st;
    onnx_block b;
    memset(&b, 0, sizeof b);
    st = onnx_block_paths(c, main_node, down_node, &b);
    if (st == TW_OK) st = onnx_block_joins(c, bs, x, &b);
    if (st == TW_OK && b.down.w && bs->n > 0) {
        /* a new stage: x is the last one's output */
        e->feat[bs->stage + 1] = x;
        bs->stage++;
        bs->idx = 0;
        if (bs->stage > 3) st = onnx_node_error(c, b.path[0].node, "starts a fifth stage");
        /* layer3's first block keeps its stride in a dilated backbone */
        if (st == TW_OK && bs->stage == 2) {
            const onnx_conv *sc = b.kind == 3 ? &b.path[1] : &b.path[0];
            e->dilated = sc->stride == 1;
            if (e->dilated && b.kind != 3)
                st = onnx_node_error(c, sc->node,
                                     "keeps stride 1 in a basic block's layer3: torchvision's "
                                     "dilated backbones are bottleneck ResNets (50/101)");
        }
    }
    if (st == TW_OK) st = seg_block_geometry(c, bs, e, &b);
    if (st == TW_OK) st = onnx_block_emit(c, bs, &b, out);
    for (int i = 0; i < 3; i++) onnx_conv_free(&b.path[i]);
    onnx_conv_free(&b.down);
    if (st == TW_OK) {
        bs->kind = b.kind;
        bs->idx++;
        bs->n++;
    }
    return st;
}

/* Stem and blocks from the input x; e->feat filled. Tensors are named
 * without a prefix here (the head decides it). */
static tw_status match_encoder(octx *c, int x, encoder *e)
{
    int y;
    tw_status st = onnx_match_stem(c, x, &y);
    if (st != TW_OK) return st;
    /* the stem's ReLU: the max-pool's input */
    e->feat[0] = onnx_val(c, c->g->node[c->values[y].index]->input[0]);
    onnx_blocks bs = {0, 0, 0, 0};
    for (;;) {
        bool done;
        if ((st = seg_block(c, &bs, e, y, &y, &done)) != TW_OK) return st;
        if (done) break;
        if (bs.n > 1000) return tw_model_error(c->err, c->path, "more than 1000 blocks");
    }
    if (bs.stage != 3) {
        /* the head came early: name what reads the last block's output */
        int nc = onnx_n_consumers(c, y), bad = -1;
        for (int i = 0; i < nc && bad < 0; i++)
            if (!op_is(c->g->node[c->cons[c->cons_off[y] + i]], "Concat"))
                bad = c->cons[c->cons_off[y] + i];
        if (bad >= 0)
            return onnx_node_error(c, bad,
                                   "reads the output of layer%d.%d where a ResNet encoder (4 "
                                   "stages) goes on with its next block",
                                   bs.stage + 1, bs.idx - 1);
        return tw_model_error(c->err, c->path,
                              "the encoder has %d stages before its head (a ResNet has 4)",
                              bs.stage + 1);
    }
    e->feat[4] = y;
    return TW_OK;
}

/* ------------------------------------------------------------------------ */
/* Heads                                                                     */

/* The logits value v (after conv node `from`): a bilinear Resize to the
 * input, an optional Softmax over the classes, the graph's output. */
static tw_status match_tail(octx *c, int v, int from, int input, bool resize, int *side)
{
    tw_onnx_info *oi = &c->mf->onnx;
    int node, out = v;
    tw_status st = TW_OK;
    if (resize) {
        resize_want w = {false, input, oi->input_size, side};
        st = one_reader(c, v, from, "Resize", "the Resize to the input's size", &node);
        if (st == TW_OK) st = take_resize(c, node, v, &w, &out);
        if (st == TW_OK) from = node;
    }
    if (st == TW_OK && onnx_n_consumers(c, out) == 1) {
        int sm = c->cons[c->cons_off[out]];
        const Onnx__NodeProto *s = c->g->node[sm];
        int64_t axis = onnx_attr_int(s, "axis", c->opset >= 13 ? -1 : 1);
        if (!op_is(s, "Softmax"))
            return onnx_node_error(c, sm,
                                   "follows the logits (only a Softmax over the classes "
                                   "may)");
        if (c->opset < 13 || (axis != 1 && axis != -3))
            return onnx_node_error(c, sm,
                                   "has attribute axis = %lld at opset %lld (the classes are axis "
                                   "1 of a 4-D map, opset 13 and later)",
                                   (long long)axis, (long long)c->opset);
        c->used[sm] = true;
        oi->softmax = true;
        if ((st = onnx_out0(c, sm, &out)) != TW_OK) return st;
        from = sm;
    }
    if (st == TW_OK && (onnx_n_consumers(c, out) != 0 || !onnx_is_graph_output(c, out)))
        return onnx_node_error(c, from, "gives what is not the graph's output");
    return st;
}

/* torchvision's FCN head from layer4's output x. */
static tw_status match_fcn(octx *c, const encoder *e, int input, int *side)
{
    int x = e->feat[4], node = c->cons[c->cons_off[x]], h;
    conv_want w3 = {3, 1, 1, "an FCN head's classifier.0"};
    tw_status st = conv_emit(c, node, x, w3, true, "classifier.0", "classifier.1", &h);
    int nx = -1;
    onnx_conv cv;
    memset(&cv, 0, sizeof cv);
    if (st == TW_OK) st = one_reader(c, h, node, "Conv", "classifier.4 (a 1x1 convolution)", &nx);
    if (st == TW_OK) st = take_conv_at(c, nx, h, (conv_want){1, 1, 1, "classifier.4"}, false, &cv);
    int v = cv.out, last = cv.last;
    if (st == TW_OK) st = emit_biased(c, &cv, "classifier.4");
    onnx_conv_free(&cv);
    if (st == TW_OK) st = match_tail(c, v, last, input, true, side);
    snprintf(c->mf->onnx.head, sizeof c->mf->onnx.head, "FCN head, Resize (bilinear)%s",
             c->mf->onnx.softmax ? ", Softmax" : "");
    return st;
}

/* DeepLabV3's image-pooling branch from pooling node `node` reading x: the
 * conv, ReLU and the Resize back to x's size; its output into *out. */
static tw_status aspp_pool(octx *c, int node, int x, int *out, int *side)
{
    const Onnx__NodeProto *n = c->g->node[node];
    if (op_is(n, "ReduceMean")) {
        int64_t ax[4];
        int cnt = 0;
        bool ok = n->n_input >= 2 && *S(n->input[1]) ? node_ints(c, n, 1, ax, 4, &cnt)
                                                     : onnx_attr_ints(n, "axes", ax, 4, &cnt);
        for (int i = 0; i < cnt; i++)
            if (ax[i] < 0) ax[i] += 4;
        if (!ok || cnt != 2 || !((ax[0] == 2 && ax[1] == 3) || (ax[0] == 3 && ax[1] == 2)) ||
            onnx_attr_int(n, "keepdims", 1) != 1)
            return onnx_node_error(c, node, "does not average over height and width, keeping them");
    } else if (n->n_input != 1) {
        return onnx_node_error(c, node, "has %zu inputs", n->n_input);
    }
    c->used[node] = true;
    int p, cn, g;
    tw_status st = onnx_out0(c, node, &p);
    if (st == TW_OK)
        st = one_reader(c, p, node, "Conv", "the pooling branch's 1x1 convolution", &cn);
    if (st == TW_OK)
        st = conv_emit(c, cn, p, (conv_want){1, 1, 1, "the ASPP's pooling branch"}, true,
                       "classifier.0.convs.4.1", "classifier.0.convs.4.2", &g);
    int rz = -1;
    if (st == TW_OK) st = one_reader(c, g, cn, "Resize", "the pooling branch's Resize", &rz);
    resize_want w = {false, x, 0, side};
    if (st == TW_OK) st = take_resize(c, rz, g, &w, out);
    return st;
}

/* DeepLabV3's ASPP from layer4's output x to the Concat of its five
 * branches (their tensors emitted; the Concat node into *cat_out). */
static tw_status match_aspp(octx *c, const encoder *e, int *cat_out, int *aspp_side, int *aspp_node)
{
    int x = e->feat[4], nc = onnx_n_consumers(c, x);
    const int *cs = c->cons + c->cons_off[x];
    static const int rates[4] = {1, 12, 24, 36};
    int branch_out[5] = {-1, -1, -1, -1, -1}, branch_node[5] = {-1, -1, -1, -1, -1};
    onnx_conv br[4];
    memset(br, 0, sizeof br);
    int n_br = 0, pool = -1;
    tw_status st = TW_OK;
    for (int i = 0; i < nc && st == TW_OK; i++) {
        const Onnx__NodeProto *n = c->g->node[cs[i]];
        if (op_is(n, "GlobalAveragePool") || op_is(n, "ReduceMean")) {
            if (pool >= 0) st = onnx_node_error(c, cs[i], "is a second pooling branch");
            pool = cs[i];
        } else if (op_is(n, "Conv") && n_br < 4) {
            onnx_conv *cv = &br[n_br++];
            st = onnx_take_conv(c, cs[i], cv);
            int r = -1, y;
            if (st == TW_OK) st = onnx_next_node(c, cv->out, cv->last, "a ReLU", &r);
            if (st == TW_OK) st = onnx_take_relu(c, r, cv->out, &y);
            if (st == TW_OK) cv->out = y;
        } else {
            st = onnx_node_error(c, cs[i],
                                 "reads layer4's output where DeepLabV3's ASPP has 4 "
                                 "convolutions and an image pooling");
        }
    }
    if (st == TW_OK && (pool < 0 || n_br != 4))
        st = onnx_node_error(c, cs[0],
                             "starts a head of %d convolutions and %d pooling (DeepLabV3's ASPP: "
                             "4 and 1)",
                             n_br, pool >= 0);
    if (st == TW_OK) {
        st = aspp_pool(c, pool, x, &branch_out[4], aspp_side);
        *aspp_node = c->values[branch_out[4]].index;
    }
    /* the Concat of the five, in torchvision's order */
    int cat = -1;
    if (st == TW_OK) st = one_reader(c, br[0].out, br[0].last, "Concat", "the ASPP's Concat", &cat);
    const Onnx__NodeProto *cn = st == TW_OK ? c->g->node[cat] : NULL;
    if (st == TW_OK &&
        (!op_is(cn, "Concat") || cn->n_input != 5 || onnx_attr_int(cn, "axis", 0) != 1))
        st = onnx_node_error(c, cat,
                             "is where DeepLabV3 concatenates its 5 ASPP branches "
                             "(axis 1)");
    /* every branch of a rate torchvision has, in another order: the Concat
     * is what differs */
    int slot_seen = 0;
    bool reordered = false;
    for (int i = 0; st == TW_OK && i < 4; i++) {
        int v = onnx_val(c, cn->input[i]), slot = -1;
        for (int j = 0; j < 4; j++)
            if (br[j].out == v)
                for (int r = 0; r < 4; r++)
                    if (br[j].dil == rates[r] && br[j].k == (r == 0 ? 1 : 3)) slot = r;
        if (slot >= 0) slot_seen |= 1 << slot;
        reordered |= slot >= 0 && slot != i;
    }
    if (st == TW_OK && reordered && slot_seen == 15)
        st = onnx_node_error(c, cat,
                             "concatenates the ASPP's branches in another order than "
                             "torchvision's (1x1, rates 12, 24, 36, pooling)");
    for (int i = 0; st == TW_OK && i < 5; i++) {
        int v = onnx_val(c, cn->input[i]), which = -1;
        for (int j = 0; j < 4; j++)
            if (br[j].out == v) which = j;
        if (i == 4 ? v != branch_out[4] : which < 0) {
            st = onnx_node_error(c, cat,
                                 "takes input %d from other than %s (torchvision's order: 1x1, "
                                 "rates 12, 24, 36, pooling)",
                                 i, i == 4 ? "the pooling branch" : "a convolution branch");
            break;
        }
        if (i == 4) break;
        onnx_conv *cv = &br[which];
        if (onnx_n_consumers(c, v) != 1)
            st = onnx_node_error(c, cv->node, "feeds more than the ASPP's Concat");
        int k = i == 0 ? 1 : 3;
        if (st == TW_OK && (cv->k != k || cv->stride != 1 || cv->dil != rates[i] ||
                            cv->pad != rates[i] * (k / 2) || cv->group != 1))
            st = onnx_node_error(c, cv->node,
                                 "is a %dx%d convolution of dilation %d, padding %d at the ASPP's "
                                 "input %d, where torchvision has %dx%d rate %d",
                                 cv->k, cv->k, cv->dil, cv->pad, i, k, k, rates[i]);
        branch_node[i] = which;
    }
    char nm[64], bn[64];
    for (int i = 0; st == TW_OK && i < 4; i++) {
        snprintf(nm, sizeof nm, "classifier.0.convs.%d.0", i);
        snprintf(bn, sizeof bn, "classifier.0.convs.%d.1", i);
        st = onnx_emit_conv(c, &br[branch_node[i]], nm, bn);
    }
    for (int i = 0; i < 4; i++) onnx_conv_free(&br[i]);
    *cat_out = cat;
    return st;
}

/* DeepLabV3's head from layer4's output x (see the file's comment). */
static tw_status match_deeplab(octx *c, const encoder *e, int input, int *side, int *aspp_side,
                               int *aspp_node)
{
    int cat = -1;
    tw_status st = match_aspp(c, e, &cat, aspp_side, aspp_node);
    if (st != TW_OK) return st;
    c->used[cat] = true;
    int v, p = -1, h, q = -1, r = -1;
    st = onnx_out0(c, cat, &v);
    if (st == TW_OK) st = one_reader(c, v, cat, "Conv", "the ASPP's projection", &p);
    if (st == TW_OK)
        st = conv_emit(c, p, v, (conv_want){1, 1, 1, "the ASPP's projection"}, true,
                       "classifier.0.project.0", "classifier.0.project.1", &h);
    if (st == TW_OK) st = one_reader(c, h, p, "Conv", "classifier.1 (a 3x3 convolution)", &q);
    if (st == TW_OK)
        st = conv_emit(c, q, h, (conv_want){3, 1, 1, "DeepLabV3's classifier.1"}, true,
                       "classifier.1", "classifier.2", &h);
    onnx_conv cv;
    memset(&cv, 0, sizeof cv);
    if (st == TW_OK) st = one_reader(c, h, q, "Conv", "classifier.4 (a 1x1 convolution)", &r);
    if (st == TW_OK) st = take_conv_at(c, r, h, (conv_want){1, 1, 1, "classifier.4"}, false, &cv);
    int lv = cv.out, last = cv.last;
    if (st == TW_OK) st = emit_biased(c, &cv, "classifier.4");
    onnx_conv_free(&cv);
    if (st == TW_OK) st = match_tail(c, lv, last, input, true, side);
    snprintf(c->mf->onnx.head, sizeof c->mf->onnx.head,
             "DeepLabV3 ASPP 12/24/36, Resize (bilinear)%s",
             c->mf->onnx.softmax ? ", Softmax" : "");
    return st;
}

/* SMP's U-Net decoder from layer4's output and the skips. */
static tw_status match_unet(octx *c, const encoder *e, int input)
{
    int x = e->feat[4], from = c->values[x].kind == V_NODE ? c->values[x].index : 0;
    tw_status st = TW_OK;
    char nm[64], bn[64];
    for (int i = 0; i < 5 && st == TW_OK; i++) {
        int rz = -1, u, cat = -1, cv1 = -1, cv2 = -1, h;
        resize_want w = {true, -1, 0, NULL};
        st = one_reader(c, x, from, "Resize", "the decoder's nearest x2 Resize", &rz);
        if (st == TW_OK) st = take_resize(c, rz, x, &w, &u);
        from = rz;
        if (st == TW_OK && i < 4) {
            st = one_reader(c, u, rz, "Concat", "the decoder's Concat with its skip", &cat);
            const Onnx__NodeProto *cn = st == TW_OK ? c->g->node[cat] : NULL;
            if (st == TW_OK &&
                (!op_is(cn, "Concat") || cn->n_input != 2 || onnx_attr_int(cn, "axis", 0) != 1 ||
                 onnx_val(c, cn->input[0]) != u || onnx_val(c, cn->input[1]) != e->feat[3 - i]))
                st = onnx_node_error(c, cat,
                                     "is where a U-Net decoder concatenates [upsampled, %s] "
                                     "on axis 1",
                                     i == 3 ? "the stem's ReLU" : "the encoder stage's output");
            if (st == TW_OK) {
                c->used[cat] = true;
                st = onnx_out0(c, cat, &u);
                from = cat;
            }
        }
        snprintf(nm, sizeof nm, "decoder.blocks.%d.conv1.0", i);
        snprintf(bn, sizeof bn, "decoder.blocks.%d.conv1.1", i);
        if (st == TW_OK) st = one_reader(c, u, from, "Conv", "the decoder block's conv1", &cv1);
        if (st == TW_OK)
            st = conv_emit(c, cv1, u, (conv_want){3, 1, 1, "a U-Net decoder block"}, true, nm, bn,
                           &h);
        snprintf(nm, sizeof nm, "decoder.blocks.%d.conv2.0", i);
        snprintf(bn, sizeof bn, "decoder.blocks.%d.conv2.1", i);
        if (st == TW_OK) st = one_reader(c, h, cv1, "Conv", "the decoder block's conv2", &cv2);
        if (st == TW_OK)
            st = conv_emit(c, cv2, h, (conv_want){3, 1, 1, "a U-Net decoder block"}, true, nm, bn,
                           &x);
        /* the node that gave x: conv2's ReLU */
        if (st == TW_OK) from = c->values[x].index;
    }
    int hd = -1;
    onnx_conv cv;
    memset(&cv, 0, sizeof cv);
    if (st == TW_OK)
        st = one_reader(c, x, from, "Conv", "segmentation_head.0 (a 3x3 convolution)", &hd);
    if (st == TW_OK)
        st = take_conv_at(c, hd, x, (conv_want){3, 1, 1, "segmentation_head.0"}, false, &cv);
    int v = cv.out, last = cv.last;
    if (st == TW_OK) st = emit_biased(c, &cv, "segmentation_head.0");
    onnx_conv_free(&cv);
    if (st == TW_OK) st = match_tail(c, v, last, input, false, NULL);
    snprintf(c->mf->onnx.head, sizeof c->mf->onnx.head, "U-Net decoder (nearest x2, Concat)%s",
             c->mf->onnx.softmax ? ", Softmax" : "");
    return st;
}

/* ------------------------------------------------------------------------ */
/* torchvision's aux_classifier as a second output                           */

/* The node producing value `name` (through Identity), or -1. */
static int producer(const octx *c, const char *name)
{
    int v = onnx_val(c, name);
    return v >= 0 && c->values[v].kind == V_NODE ? c->values[v].index : -1;
}

/* Mark node n and the size arithmetic behind it (down to Shape nodes and
 * constants) as the aux head's. */
static void mark_sizes(octx *c, bool *aux, int n, int depth)
{
    if (n < 0 || aux[n] || depth > SYM_DEPTH) return;
    aux[n] = true;
    const Onnx__NodeProto *nd = c->g->node[n];
    if (op_is(nd, "Shape")) return;
    for (size_t i = 0; i < nd->n_input; i++) {
        int p = *S(nd->input[i]) ? producer(c, nd->input[i]) : -1;
        if (p >= 0 && !op_is(c->g->node[p], "Conv") && !op_is(c->g->node[p], "Relu") &&
            !op_is(c->g->node[p], "BatchNormalization"))
            mark_sizes(c, aux, p, depth + 1);
    }
}

/* A graph output besides the first: torchvision's aux_classifier (read and
 * ignored, as its state_dict keys are): Conv 3x3 [BN] ReLU, Conv 1x1, a
 * bilinear Resize to the input. Its nodes are marked used and leave the
 * readers' lists; the value it reads into *aux_in (-1 without one). */
static tw_status drop_aux(octx *c, int *aux_in)
{
    const Onnx__GraphProto *g = c->g;
    *aux_in = -1;
    if (g->n_output == 1) return TW_OK;
    if (g->n_output > 2)
        return tw_model_error(c->err, c->path,
                              "graph has %zu outputs (a segmentation network has its map and at "
                              "most torchvision's aux_classifier's)",
                              g->n_output);
    bool *aux = tw_calloc(TW_MEM_OTHER, g->n_node + 1, sizeof *aux);
    if (!aux) return tw_model_nomem(c->err, c->path, g->n_node);
    int rz = producer(c, g->output[1]->name), c2 = -1, r = -1, c1 = -1;
    tw_status st = TW_OK;
    if (rz < 0 || !op_is(g->node[rz], "Resize"))
        st = tw_model_error(c->err, c->path,
                            "graph output 2 is not torchvision's aux_classifier (a Resize)");
    if (st == TW_OK) c2 = producer(c, g->node[rz]->input[0]);
    if (st == TW_OK && (c2 < 0 || !op_is(g->node[c2], "Conv")))
        st = onnx_node_error(c, rz, "resizes what is not aux_classifier.4 (a Conv)");
    if (st == TW_OK) r = producer(c, g->node[c2]->input[0]);
    if (st == TW_OK && (r < 0 || !op_is(g->node[r], "Relu")))
        st = onnx_node_error(c, c2, "reads what is not aux_classifier's ReLU");
    if (st == TW_OK) c1 = producer(c, g->node[r]->input[0]);
    if (st == TW_OK && c1 >= 0 && op_is(g->node[c1], "BatchNormalization")) {
        aux[c1] = true;
        c1 = producer(c, g->node[c1]->input[0]);
    }
    if (st == TW_OK && (c1 < 0 || !op_is(g->node[c1], "Conv")))
        st = onnx_node_error(c, r, "reads what is not aux_classifier.0 (a Conv)");
    if (st == TW_OK) {
        aux[c2] = aux[r] = aux[c1] = true;
        mark_sizes(c, aux, rz, 0);
        *aux_in = onnx_val(c, g->node[c1]->input[0]);
        /* the aux head's nodes leave the readers' lists */
        int k = 0;
        for (size_t v = 0; v < c->n_values; v++) {
            int start = c->cons_off[v];
            c->cons_off[v] = k;
            for (int i = start; i < c->cons_off[v + 1]; i++)
                if (!aux[c->cons[i]]) c->cons[k++] = c->cons[i];
        }
        c->cons_off[c->n_values] = k;
        for (size_t i = 0; i < g->n_node; i++)
            if (aux[i]) c->used[i] = true;
    }
    tw_free(aux);
    return st;
}

/* ------------------------------------------------------------------------ */
/* The whole graph                                                           */

/* The side of the output-stride-8 map for a tile of side t (conv1, the
 * max-pool and layer2 each halve it, rounding up). */
static int side8(int t)
{
    for (int i = 0; i < 3; i++) t = (t - 1) / 2 + 1;
    return t;
}

/* Every node's operator one a segmentation graph is made of, and its
 * attributes (onnx_attrs.c). */
static tw_status seg_ops(octx *c)
{
    static const char *const k_ops[] = {"Conv",       "BatchNormalization",
                                        "Relu",       "MaxPool",
                                        "Add",        "GlobalAveragePool",
                                        "ReduceMean", "Resize",
                                        "Concat",     "Softmax",
                                        "Identity",   "Constant",
                                        "Shape",      "Gather",
                                        "Unsqueeze",  "Slice",
                                        "Cast"};
    const Onnx__GraphProto *g = c->g;
    for (size_t i = 0; i < g->n_node; i++) {
        const Onnx__NodeProto *n = g->node[i];
        bool known = false;
        for (size_t k = 0; k < sizeof k_ops / sizeof k_ops[0] && !known; k++)
            known = op_is(n, k_ops[k]);
        const char *dom = S(n->domain);
        if (!known || (*dom && strcmp(dom, "ai.onnx") != 0))
            return onnx_node_error(c, (int)i,
                                   "is not part of an FCN, DeepLabV3 or U-Net (the first such "
                                   "node of the graph)");
        if (n->n_input > 8 || n->n_output > 8)
            return onnx_node_error(c, (int)i, "has %zu inputs and %zu outputs", n->n_input,
                                   n->n_output);
        tw_status st = onnx_check_attrs(c, (int)i);
        if (st != TW_OK) return st;
    }
    return TW_OK;
}

/* Prefix every tensor's name (the encoder's, emitted before the head said
 * which network it is) with pre. */
static tw_status prefix_names(octx *c, int n, const char *pre)
{
    for (int i = 0; i < n; i++) {
        tw_tensor *t = &c->mf->tensors[i];
        char buf[sizeof t->name];
        if ((size_t)snprintf(buf, sizeof buf, "%s%s", pre, t->name) >= sizeof buf)
            return tw_model_error(c->err, c->path, "tensor name %s too long", t->name);
        memcpy(t->name, buf, sizeof buf);
    }
    return TW_OK;
}

tw_status onnx_recognise_seg(octx *c)
{
    const Onnx__GraphProto *g = c->g;
    tw_onnx_info *oi = &c->mf->onnx;
    oi->n_nodes = (int)g->n_node;
    c->seg = true;
    tw_status st = seg_ops(c);
    if (st == TW_OK && c->opset < 11)
        st = tw_model_error(c->err, c->path,
                            "ONNX opset %lld: a segmentation graph's Resize needs opset 11 or "
                            "later",
                            (long long)c->opset);
    if (st == TW_OK) st = onnx_index_graph(c);
    int x = -1;
    int64_t in_c = 0;
    if (st == TW_OK) st = onnx_graph_input(c, &x, &in_c);
    int aux_in = -1;
    if (st == TW_OK) st = drop_aux(c, &aux_in);
    encoder e;
    memset(&e, 0, sizeof e);
    if (st == TW_OK) st = match_encoder(c, x, &e);
    if (st != TW_OK) return st;
    if (aux_in >= 0 && (!e.dilated || aux_in != e.feat[3]))
        return tw_model_error(c->err, c->path,
                              "graph output 2 reads other than layer3 of a dilated backbone "
                              "(torchvision's aux_classifier)");
    const tw_tensor *c1 = tw_model_file_find(c->mf, "conv1.weight");
    if (in_c > 0 && c1 && c1->shape[1] != in_c)
        return tw_model_error(c->err, c->path,
                              "graph input has %lld channels but its stem convolution takes %lld",
                              (long long)in_c, (long long)c1->shape[1]);
    int n_enc = c->mf->n_tensors, side = 0, aspp_side = 0, aspp_node = -1;
    int x4 = e.feat[4], first = onnx_n_consumers(c, x4) > 0 ? c->cons[c->cons_off[x4]] : -1;
    if (first < 0) return tw_model_error(c->err, c->path, "the encoder's output is not read");
    if (e.dilated) {
        if ((st = prefix_names(c, n_enc, "backbone.")) != TW_OK) return st;
        if (onnx_n_consumers(c, x4) == 1 && op_is(g->node[first], "Conv"))
            st = match_fcn(c, &e, x, &side);
        else
            st = match_deeplab(c, &e, x, &side, &aspp_side, &aspp_node);
    } else {
        if ((st = prefix_names(c, n_enc, "encoder.")) != TW_OK) return st;
        st = match_unet(c, &e, x);
    }
    if (st != TW_OK) return st;
    size_t hl = strlen(oi->head);
    if (aux_in >= 0) snprintf(oi->head + hl, sizeof oi->head - hl, "; aux output ignored");
    /* sizes fixed at export: the tile the graph was exported for (the
     * default tile; model/segnet.c resizes to whatever tile it runs, as the
     * PyTorch module does) */
    if (side > 0 && oi->input_size == 0) oi->input_size = side;
    int t = oi->input_size;
    if (t > 0 && c->mf->tile > 0 && c->mf->tile != t)
        return tw_model_error(c->err, c->path,
                              "metadata 'tiles_size' is %d but the graph was exported for %d px "
                              "tiles",
                              c->mf->tile, t);
    if (aspp_side > 0 && (t == 0 || aspp_side != side8(t)))
        return onnx_node_error(c, aspp_node,
                               "resizes the pooled map to %d px, not the %s (%d px at a %d px "
                               "tile)",
                               aspp_side, "map it is concatenated with", side8(t), t);
    for (size_t i = 0; i < g->n_node; i++)
        if (!c->used[i] && !op_is(g->node[i], "Identity") && !op_is(g->node[i], "Constant"))
            return onnx_node_error(c, (int)i,
                                   "is off the network's path (not part of an FCN, DeepLabV3 or "
                                   "U-Net)");
    return TW_OK;
}
