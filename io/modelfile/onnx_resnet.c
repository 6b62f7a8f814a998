/* onnx_resnet.c - the ONNX graph recognised as a ResNet by data flow: the
 * stem, the residual blocks and the head, each convolution (and its batch
 * norm, folded) checked against torchvision's layout for its place and
 * its tensors named as a torchvision state_dict names them (the passes are
 * described in onnx.c; see onnx_internal.h). */
#include "io/modelfile/onnx_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

/* ------------------------------------------------------------------------ */
/* Convolutions, batch norm                                                  */

void onnx_conv_free(onnx_conv *cv)
{
    tw_free(cv->w);
    tw_free(cv->b);
    cv->w = cv->b = NULL;
}

/* Node `node` as a Conv: its weights (a constant, 4-D, square kernel)
 * into cv->w, cv->wshape, cv->cout, cv->cin, cv->k. */
static tw_status conv_weights(octx *c, int node, onnx_conv *cv)
{
    const Onnx__NodeProto *n = c->g->node[node];
    if (!op_is(n, "Conv")) return onnx_node_error(c, node, "is where a ResNet has a convolution");
    if (n->n_input < 2 || n->n_input > 3)
        return onnx_node_error(c, node, "has %zu inputs", n->n_input);
    const Onnx__TensorProto *wt = onnx_constant(c, n->input[1]);
    if (!wt) return onnx_node_error(c, node, "has weights that are not a constant");
    int ndim = 0;
    tw_status st = onnx_tensor_floats(c, wt, "conv weight", &cv->w, cv->wshape, &ndim);
    if (st != TW_OK) return st;
    if (ndim != 4 || cv->wshape[2] != cv->wshape[3] || cv->wshape[0] > (1 << 20) ||
        cv->wshape[1] > (1 << 20))
        return onnx_node_error(c, node,
                               "has weights of %d dimensions or a kernel that is not square", ndim);
    cv->cout = (int)cv->wshape[0];
    cv->cin = (int)cv->wshape[1];
    cv->k = (int)cv->wshape[2];
    return TW_OK;
}

/* The Conv's attributes against its weights: kernel_shape, dilations,
 * strides, pads, auto_pad, group into cv->stride, cv->pad, cv->group. */
static tw_status conv_geometry(octx *c, int node, onnx_conv *cv)
{
    const Onnx__NodeProto *n = c->g->node[node];
    int64_t v[8];
    int cnt;
    char ab[128];
    cv->group = (int)onnx_attr_int(n, "group", 1);
    if (!onnx_attr_ints(n, "kernel_shape", v, 2, &cnt) ||
        (cnt && (cnt != 2 || v[0] != cv->k || v[1] != cv->k)))
        return onnx_node_error(c, node, "has attribute %s, which is not its weights' %dx%d",
                               onnx_attr_show(n, "kernel_shape", ab, sizeof ab), cv->k, cv->k);
    /* dilated (a segmentation graph's, checked against its place there) or not */
    if (!onnx_attr_ints(n, "dilations", v, 2, &cnt) ||
        (cnt && (cnt != 2 || v[0] != v[1] || v[0] < 1 || v[0] > 64 || (!c->seg && v[0] != 1))))
        return onnx_node_error(c, node, "has attribute %s (%s)",
                               onnx_attr_show(n, "dilations", ab, sizeof ab),
                               c->seg ? "dilations that differ by axis or are out of range"
                                      : "a ResNet's convolutions are not dilated");
    cv->dil = cnt ? (int)v[0] : 1;
    if (!onnx_attr_ints(n, "strides", v, 2, &cnt) || (cnt && (cnt != 2 || v[0] != v[1])))
        return onnx_node_error(c, node, "has attribute %s (strides that differ by axis)",
                               onnx_attr_show(n, "strides", ab, sizeof ab));
    cv->stride = cnt ? (int)v[0] : 1;
    if (!onnx_attr_ints(n, "pads", v, 4, &cnt) ||
        (cnt && (cnt != 4 || v[0] != v[1] || v[0] != v[2] || v[0] != v[3])))
        return onnx_node_error(c, node, "has attribute %s (padding that differs by side)",
                               onnx_attr_show(n, "pads", ab, sizeof ab));
    cv->pad = cnt ? (int)v[0] : 0;
    const Onnx__AttributeProto *ap = onnx_attr(n, "auto_pad");
    if (ap && ap->has_s && ap->s.len > 0) {
        char mode[16] = "";
        snprintf(mode, sizeof mode, "%.*s", (int)(ap->s.len < 15 ? ap->s.len : 15),
                 (const char *)ap->s.data);
        if (strcmp(mode, "SAME_UPPER") == 0 || strcmp(mode, "SAME_LOWER") == 0) {
            /* the same as symmetric padding k/2 only at stride 1 with an odd kernel
             */
            if (cv->stride != 1 || cv->k % 2 == 0)
                return onnx_node_error(
                    c, node,
                    "has attribute auto_pad = '%s' at stride %d with a %dx%d kernel "
                    "(asymmetric padding)",
                    mode, cv->stride, cv->k, cv->k);
            cv->pad = cv->dil * (cv->k / 2);
        } else if (strcmp(mode, "VALID") == 0) {
            cv->pad = 0;
        } else if (strcmp(mode, "NOTSET") != 0) {
            return onnx_node_error(c, node,
                                   "has attribute %s (NOTSET, SAME_UPPER, SAME_LOWER or VALID)",
                                   onnx_attr_show(n, "auto_pad", ab, sizeof ab));
        }
    }
    if (cv->stride < 1 || cv->stride > 2 || cv->pad < 0 || cv->pad > 3 * cv->dil)
        return onnx_node_error(c, node, "has stride %d and padding %d", cv->stride, cv->pad);
    return TW_OK;
}

/* The groups against the outputs, and the Conv's optional bias (zeros
 * without one) into cv->b. */
static tw_status conv_bias(octx *c, int node, onnx_conv *cv)
{
    const Onnx__NodeProto *n = c->g->node[node];
    /* Grouped (ResNeXt): the weights are [cout, cin / group, k, k], as in a
     * torchvision state_dict, and model/resnet.c reads the groups from that
     * shape; the fold below works per output channel. */
    if (cv->group < 1 || cv->cout % cv->group != 0)
        return onnx_node_error(c, node, "has group %d for %d outputs", cv->group, cv->cout);
    cv->b = tw_calloc(TW_MEM_WEIGHTS, (size_t)cv->cout, sizeof(float));
    if (!cv->b) return tw_model_nomem(c->err, c->path, (size_t)cv->cout * sizeof(float));
    if (n->n_input == 3 && *S(n->input[2])) {
        const Onnx__TensorProto *bt = onnx_constant(c, n->input[2]);
        float *b = NULL;
        int64_t bs[4];
        int bd = 0;
        if (!bt) return onnx_node_error(c, node, "has a bias that is not a constant");
        tw_status st = onnx_tensor_floats(c, bt, "conv bias", &b, bs, &bd);
        if (st != TW_OK) return st;
        if (bd != 1 || bs[0] != cv->cout) {
            tw_free(b);
            return onnx_node_error(c, node, "has a bias of the wrong size (%d outputs)", cv->cout);
        }
        memcpy(cv->b, b, (size_t)cv->cout * sizeof(float));
        tw_free(b);
    }
    return TW_OK;
}

/* BatchNormalization node bn, which reads cv's output alone, folded into
 * cv->w and cv->b; cv->out and cv->last move past it. */
static tw_status fold_bn(octx *c, int bn, onnx_conv *cv)
{
    const Onnx__NodeProto *bnn = c->g->node[bn];
    int o = cv->out;
    tw_status st = TW_OK;
    if (bnn->n_input != 5 || onnx_val(c, bnn->input[0]) != o)
        return onnx_node_error(c, bn, "does not normalize its convolution's output alone");
    if (onnx_attr_int(bnn, "training_mode", 0) != 0 || onnx_attr_int(bnn, "spatial", 1) != 1)
        return onnx_node_error(c, bn, "is in training mode or not spatial");
    float *p[4] = {NULL, NULL, NULL, NULL};
    static const char *const what[4] = {"scale", "bias", "mean", "variance"};
    for (int i = 0; i < 4 && st == TW_OK; i++) {
        const Onnx__TensorProto *t = onnx_constant(c, bnn->input[i + 1]);
        int64_t s[4];
        int d = 0;
        if (!t) {
            st = onnx_node_error(c, bn, "has a %s that is not a constant", what[i]);
            break;
        }
        st = onnx_tensor_floats(c, t, what[i], &p[i], s, &d);
        if (st == TW_OK && (d != 1 || s[0] != cv->cout))
            st = onnx_node_error(c, bn, "has a %s of the wrong size (%d channels)", what[i],
                                 cv->cout);
    }
    const Onnx__AttributeProto *ea = onnx_attr(bnn, "epsilon");
    float epsf = ea && ea->has_f ? ea->f : 1e-5f;
    /* torchvision's 1e-5 as model/resnet.c folds it: bit for bit the same
     * weights as from safetensors */
    double eps = epsf == 1e-5f ? 1e-5 : (double)epsf;
    if (st == TW_OK && !(eps >= 0 && isfinite(eps)))
        st = onnx_node_error(c, bn, "has attribute epsilon = %g (a number >= 0 expected)",
                             (double)epsf);
    for (int o2 = 0; st == TW_OK && o2 < cv->cout; o2++) {
        float var = p[3][o2];
        if (!(var >= 0.0f) || !isfinite(var)) {
            st = onnx_node_error(c, bn, "has an invalid variance (%g) at channel %d", (double)var,
                                 o2);
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
    if ((st = onnx_out0(c, bn, &o)) != TW_OK) return st;
    cv->out = o;
    cv->last = bn;
    return TW_OK;
}

/* Node `node` as a Conv (weight constant, optional bias) followed by an
 * optional BatchNormalization, folded into cv->w, cv->b. */
tw_status onnx_take_conv(octx *c, int node, onnx_conv *cv)
{
    memset(cv, 0, sizeof *cv);
    cv->node = node;
    tw_status st = conv_weights(c, node, cv);
    if (st == TW_OK) st = conv_geometry(c, node, cv);
    if (st == TW_OK) st = conv_bias(c, node, cv);
    if (st != TW_OK) return st;
    c->used[node] = true;
    int o;
    if ((st = onnx_out0(c, node, &o)) != TW_OK) return st;
    cv->out = o;
    cv->last = node;

    /* an optional BatchNormalization right after */
    if (onnx_n_consumers(c, o) != 1) return TW_OK;
    int bn = c->cons[c->cons_off[o]];
    if (!op_is(c->g->node[bn], "BatchNormalization")) return TW_OK;
    return fold_bn(c, bn, cv);
}

/* Emit cv as NAME.weight and BN_NAME.{weight,bias,running_mean,running_var},
 * the batch norm an exact identity around the folded bias (model_file.h). */
tw_status onnx_emit_conv(octx *c, onnx_conv *cv, const char *name, const char *bn_name)
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
    st = onnx_add_tensor(c, t, cv->w, 4, cv->wshape);
    cv->w = NULL;
    snprintf(t, sizeof t, "%s.weight", bn_name);
    if (st == TW_OK)
        st = onnx_add_tensor(c, t, g, 1, shape1);
    else
        tw_free(g);
    snprintf(t, sizeof t, "%s.bias", bn_name);
    if (st == TW_OK)
        st = onnx_add_tensor(c, t, cv->b, 1, shape1);
    else
        tw_free(cv->b);
    cv->b = NULL;
    snprintf(t, sizeof t, "%s.running_mean", bn_name);
    if (st == TW_OK)
        st = onnx_add_tensor(c, t, m, 1, shape1);
    else
        tw_free(m);
    snprintf(t, sizeof t, "%s.running_var", bn_name);
    if (st == TW_OK)
        st = onnx_add_tensor(c, t, v, 1, shape1);
    else
        tw_free(v);
    return st;
}

/* Node `node` must be a Relu reading value v; its output into *out. */
tw_status onnx_take_relu(octx *c, int node, int v, int *out)
{
    const Onnx__NodeProto *n = c->g->node[node];
    if (!op_is(n, "Relu") || n->n_input != 1 || onnx_val(c, n->input[0]) != v)
        return onnx_node_error(c, node, "is where a ResNet has a ReLU");
    c->used[node] = true;
    return onnx_out0(c, node, out);
}

/* ------------------------------------------------------------------------ */
/* Stem, blocks, head                                                        */

tw_status onnx_match_stem(octx *c, int x, int *out)
{
    int node = c->cons[c->cons_off[x]]; /* the input's one reader (onnx_recognise) */
    onnx_conv cv;
    tw_status st = onnx_take_conv(c, node, &cv);
    if (st != TW_OK) {
        onnx_conv_free(&cv);
        return st;
    }
    int r = -1, y;
    if (st == TW_OK) st = onnx_next_node(c, cv.out, cv.last, "a ReLU", &r);
    if (st == TW_OK) st = onnx_take_relu(c, r, cv.out, &y);
    int mp = -1;
    if (st == TW_OK && onnx_n_consumers(c, y) == 1) mp = c->cons[c->cons_off[y]];
    /* a U-Net's stem ReLU is also its first skip: the max-pool among its
     * readers (the decoder matches the others) */
    for (int i = 0; st == TW_OK && c->seg && mp < 0 && i < onnx_n_consumers(c, y); i++)
        if (op_is(c->g->node[c->cons[c->cons_off[y] + i]], "MaxPool"))
            mp = c->cons[c->cons_off[y] + i];
    bool has_pool = mp >= 0 && op_is(c->g->node[mp], "MaxPool");
    /* The small-patch stem (3x3 stride-1 conv1, no max-pool): model/resnet.c
     * reads it from conv1's kernel. */
    if (st == TW_OK && cv.group != 1)
        st = onnx_node_error(c, node, "is a grouped stem convolution (group %d)", cv.group);
    bool small = st == TW_OK && !c->seg && cv.k == 3 && cv.stride == 1 && cv.pad == 1 && !has_pool;
    if (st == TW_OK && cv.dil != 1)
        st = onnx_node_error(c, node, "is a dilated stem convolution (dilation %d)", cv.dil);
    if (st == TW_OK && small) {
        *out = y;
    } else if (st == TW_OK) {
        if (cv.k != 7 || cv.stride != 2 || cv.pad != 3)
            st = onnx_node_error(
                c, node,
                "is a %dx%d stride-%d stem (padding %d): a ResNet's is 7x7 stride 2 "
                "(padding 3)",
                cv.k, cv.k, cv.stride, cv.pad);
        else if (!has_pool && mp >= 0)
            st = onnx_node_error(c, mp, "is where a ResNet has its stem's max-pool");
        else if (!has_pool)
            st = onnx_node_error(c, r, "is not followed by the stem's max-pool alone");
    }
    if (st == TW_OK && !small) {
        const Onnx__NodeProto *p = c->g->node[mp];
        int64_t v[4];
        int cnt;
        const char *bad = NULL; /* the first attribute that is not the stem's */
        if (!onnx_attr_ints(p, "kernel_shape", v, 2, &cnt) || cnt != 2 || v[0] != 3 || v[1] != 3)
            bad = "kernel_shape";
        else if (!onnx_attr_ints(p, "strides", v, 2, &cnt) || cnt != 2 || v[0] != 2 || v[1] != 2)
            bad = "strides";
        else if (!onnx_attr_ints(p, "pads", v, 4, &cnt) || cnt != 4 || v[0] != 1 || v[1] != 1 ||
                 v[2] != 1 || v[3] != 1)
            bad = "pads";
        else if (!onnx_attr_ints(p, "dilations", v, 2, &cnt) || (cnt != 0 && cnt != 2))
            bad = "dilations";
        char ab[128];
        if (p->n_input != 1)
            st = onnx_node_error(c, mp, "has %zu inputs", p->n_input);
        else if (bad)
            st = onnx_node_error(c, mp,
                                 "has attribute %s: the stem's max-pool is 3x3 stride 2 with "
                                 "padding 1",
                                 onnx_attr_show(p, bad, ab, sizeof ab));
    }
    if (st == TW_OK && !small) {
        c->used[mp] = true;
        st = onnx_out0(c, mp, out);
    }
    if (st == TW_OK) st = onnx_emit_conv(c, &cv, "conv1", "bn1");
    onnx_conv_free(&cv);
    return st;
}

/* Follow conv -> [BN] -> what comes next: Relu or Add (or other). */
int onnx_after(const octx *c, const onnx_conv *cv)
{
    return onnx_n_consumers(c, cv->out) == 1 ? c->cons[c->cons_off[cv->out]] : -1;
}

/* The readers of value x: the block's first convolution into *main_node, and
 * its projection (or -1) into *down_node. *done set when x goes to the
 * pooling instead. */
static tw_status block_start(octx *c, int x, int *main_node, int *down_node, bool *done)
{
    *done = false;
    int nc = onnx_n_consumers(c, x);
    const int *cs = c->cons + c->cons_off[x];
    if (nc == 1 &&
        (op_is(c->g->node[cs[0]], "GlobalAveragePool") || op_is(c->g->node[cs[0]], "ReduceMean"))) {
        *done = true;
        return TW_OK;
    }
    int add_node = -1;
    *main_node = *down_node = -1;
    for (int i = 0; i < nc; i++) {
        const Onnx__NodeProto *n = c->g->node[cs[i]];
        if (op_is(n, "Conv") && *main_node < 0)
            *main_node = cs[i];
        else if (op_is(n, "Conv") && *down_node < 0)
            *down_node = cs[i];
        else if (op_is(n, "Add") && add_node < 0)
            add_node = cs[i];
        else
            return onnx_node_error(c, cs[i],
                                   "reads a block's input: a ResNet block has a main path "
                                   "of convolutions and a shortcut only");
    }
    if (*main_node < 0 || (*down_node < 0 && add_node < 0) || (*down_node >= 0 && add_node >= 0))
        return onnx_node_error(c, cs[0],
                               "starts what is not a residual block (%d readers of its input)", nc);
    return TW_OK;
}

/* The block's convolutions: the projection (the conv whose output goes to
 * an Add) and the main path, conv (relu conv)* until the Add. */
tw_status onnx_block_paths(octx *c, int main_node, int down_node, onnx_block *b)
{
    onnx_conv *path = b->path;
    tw_status st = TW_OK;
    if (down_node >= 0) {
        /* the projection is the conv whose output goes to an Add */
        st = onnx_take_conv(c, main_node, &path[0]);
        int a = st == TW_OK ? onnx_after(c, &path[0]) : -1;
        if (st == TW_OK && a >= 0 && op_is(c->g->node[a], "Add")) {
            b->down = path[0];
            memset(&path[0], 0, sizeof path[0]);
            st = onnx_take_conv(c, down_node, &path[0]);
        } else if (st == TW_OK) {
            st = onnx_take_conv(c, down_node, &b->down);
        }
    } else {
        st = onnx_take_conv(c, main_node, &path[0]);
    }
    int np = 0;
    if (st == TW_OK) np = 1;
    /* the main path: conv (relu conv)* until the Add */
    int add = -1;
    while (st == TW_OK) {
        int nx = onnx_after(c, &path[np - 1]);
        if (nx < 0) {
            st = onnx_next_node(c, path[np - 1].out, path[np - 1].last,
                                "a ReLU or the residual Add", &nx);
            if (st == TW_OK) st = onnx_node_error(c, nx, "is where a ResNet block goes on");
            break;
        }
        if (op_is(c->g->node[nx], "Add")) {
            add = nx;
            break;
        }
        int y, nc2 = -1;
        st = onnx_take_relu(c, nx, path[np - 1].out, &y);
        if (st == TW_OK && np == 3)
            st = onnx_node_error(c, nx, "continues a main path past 3 convolutions");
        if (st == TW_OK) st = onnx_next_node(c, y, nx, "a convolution", &nc2);
        if (st == TW_OK) st = onnx_take_conv(c, nc2, &path[np]);
        if (st == TW_OK) np++;
    }
    b->np = np;
    b->kind = np;
    b->add = add;
    return st;
}

/* The block's shape: two or three convolutions, of the kind of the blocks
 * before it, an Add of the main path and the shortcut (x or the
 * projection), and groups where a ResNeXt has them. */
tw_status onnx_block_joins(octx *c, const onnx_blocks *bs, int x, const onnx_block *b)
{
    const onnx_conv *path = b->path;
    int np = b->np, kind = b->kind, add = b->add;
    tw_status st = TW_OK;
    if (np < 2) st = onnx_node_error(c, add, "ends a main path of one convolution");
    if (st == TW_OK && bs->kind && bs->kind != kind)
        st = onnx_node_error(c, path[0].node, "starts a %s block after %s blocks",
                             kind == 3 ? "bottleneck" : "basic",
                             bs->kind == 3 ? "bottleneck" : "basic");
    int sc = b->down.w ? b->down.out : x;
    if (st == TW_OK) {
        const Onnx__NodeProto *a = c->g->node[add];
        int i0 = a->n_input == 2 ? onnx_val(c, a->input[0]) : -2;
        int i1 = a->n_input == 2 ? onnx_val(c, a->input[1]) : -2;
        int m = path[np - 1].out;
        if (!((i0 == m && i1 == sc) || (i0 == sc && i1 == m)))
            st = onnx_node_error(c, add, "does not add the block's main path and its shortcut");
    }
    if (st == TW_OK && b->down.w && onnx_after(c, &b->down) != add)
        st =
            onnx_node_error(c, b->down.last, "is a projection that does not go to the block's Add");
    /* Groups: only a bottleneck's 3x3 may be grouped (ResNeXt), and each
     * convolution takes what the one before it gives: [cout, cin / group]
     * weights agree with the group attribute, or the graph is not what its
     * weights say (model/resnet.c reads the groups from the shapes). */
    for (int i = 0; st == TW_OK && i < np; i++) {
        if (path[i].group != 1 && !(kind == 3 && i == 1))
            st =
                onnx_node_error(c, path[i].node,
                                "is grouped (group %d) where a ResNet block is not", path[i].group);
        else if (i > 0 && path[i].cin * path[i].group != path[i - 1].cout)
            st = onnx_node_error(
                c, path[i].node,
                "takes %d x %d channels (group %d) from a convolution of %d outputs", path[i].cin,
                path[i].group, path[i].group, path[i - 1].cout);
    }
    if (st == TW_OK && b->down.w && b->down.group != 1)
        st = onnx_node_error(c, b->down.node, "is a grouped projection (group %d)", b->down.group);
    return st;
}

/* Geometry: torchvision's v1.5 blocks (what model/resnet.c assumes); a
 * stride-2 block starts the next stage. */
static tw_status block_geometry(octx *c, onnx_blocks *bs, onnx_block *b)
{
    const onnx_conv *path = b->path;
    const onnx_conv *down = &b->down;
    int np = b->np, kind = b->kind;
    tw_status st = TW_OK;
    int stride = kind == 3 ? path[1].stride : path[0].stride;
    static const int want3[3][2] = {{1, 0}, {3, 1}, {1, 0}}; /* k, pad */
    static const int want2[2][2] = {{3, 1}, {3, 1}};
    for (int i = 0; i < np && st == TW_OK; i++) {
        int k = kind == 3 ? want3[i][0] : want2[i][0];
        int p = kind == 3 ? want3[i][1] : want2[i][1];
        int s = (kind == 3 && i == 1) || (kind == 2 && i == 0) ? stride : 1;
        if (path[i].k != k || path[i].pad != p || path[i].stride != s) {
            if (kind == 3 && i == 0 && path[i].stride == 2)
                st = onnx_node_error(c, path[i].node,
                                     "strides in a bottleneck's first 1x1 convolution (ResNet v1, "
                                     "as in Caffe): tilewise runs torchvision's layout (v1.5, "
                                     "stride in the 3x3)");
            else
                st = onnx_node_error(c, path[i].node,
                                     "is a %dx%d stride-%d convolution with padding %d where a "
                                     "ResNet %s block has %dx%d stride %d padding %d",
                                     path[i].k, path[i].k, path[i].stride, path[i].pad,
                                     kind == 3 ? "bottleneck" : "basic", k, k, s, p);
        }
    }
    if (st == TW_OK && down->w && (down->k != 1 || down->pad != 0 || down->stride != stride))
        st = onnx_node_error(c, down->node,
                             "is a projection %dx%d stride %d where the block needs 1x1 stride %d",
                             down->k, down->k, down->stride, stride);
    if (st == TW_OK && stride == 2 && bs->n == 0)
        st = onnx_node_error(c, path[0].node,
                             "halves the map in the first block (stage 1 does not)");
    b->stride = stride;
    if (st == TW_OK && stride == 2) {
        bs->stage++;
        bs->idx = 0;
        if (bs->stage > 3) st = onnx_node_error(c, path[0].node, "starts a fifth stage");
    }
    return st;
}

/* The Add's ReLU (its output into *out), then the block's tensors under
 * torchvision's names (layerS.I.convN, layerS.I.downsample). */
tw_status onnx_block_emit(octx *c, const onnx_blocks *bs, onnx_block *b, int *out)
{
    c->used[b->add] = true;
    int a_out, r = -1;
    tw_status st = onnx_out0(c, b->add, &a_out);
    if (st == TW_OK) st = onnx_next_node(c, a_out, b->add, "the block's ReLU", &r);
    if (st == TW_OK) st = onnx_take_relu(c, r, a_out, out);
    char nm[64], bn[64];
    for (int i = 0; i < b->np && st == TW_OK; i++) {
        snprintf(nm, sizeof nm, "layer%d.%d.conv%d", bs->stage + 1, bs->idx, i + 1);
        snprintf(bn, sizeof bn, "layer%d.%d.bn%d", bs->stage + 1, bs->idx, i + 1);
        st = onnx_emit_conv(c, &b->path[i], nm, bn);
    }
    if (st == TW_OK && b->down.w) {
        snprintf(nm, sizeof nm, "layer%d.%d.downsample.0", bs->stage + 1, bs->idx);
        snprintf(bn, sizeof bn, "layer%d.%d.downsample.1", bs->stage + 1, bs->idx);
        st = onnx_emit_conv(c, &b->down, nm, bn);
    }
    return st;
}

/* One residual block reading value x; its output into *out. Returns
 * TW_OK with *done set when x goes to the pooling instead. */
static tw_status match_block(octx *c, onnx_blocks *bs, int x, int *out, bool *done)
{
    int main_node = -1, down_node = -1;
    tw_status st = block_start(c, x, &main_node, &down_node, done);
    if (st != TW_OK || *done) return st;
    onnx_block b;
    memset(&b, 0, sizeof b);
    st = onnx_block_paths(c, main_node, down_node, &b);
    if (st == TW_OK) st = onnx_block_joins(c, bs, x, &b);
    if (st == TW_OK) st = block_geometry(c, bs, &b);
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

/* The pooling from x on and the flattening after it: the pooling node into
 * *node, the pooled (and flattened) features into *v. */
static tw_status head_features(octx *c, int x, int channels, int *node, int *v)
{
    tw_onnx_info *oi = &c->mf->onnx;
    *node = c->cons[c->cons_off[x]];
    const Onnx__NodeProto *n = c->g->node[*node];
    int64_t ax[4];
    int cnt = 0;
    bool keep = true;
    if (op_is(n, "ReduceMean")) {
        keep = onnx_attr_int(n, "keepdims", 1) != 0;
        bool ok;
        if (n->n_input >= 2 && *S(n->input[1])) /* opset 18: axes as an input */
            ok = onnx_tensor_ints(onnx_constant(c, n->input[1]), ax, 4, &cnt);
        else
            ok = onnx_attr_ints(n, "axes", ax, 4, &cnt);
        if (!ok || !spatial_axes(ax, cnt))
            return onnx_node_error(c, *node, "does not average over height and width alone");
    } else if (n->n_input != 1) {
        return onnx_node_error(c, *node, "has %zu inputs", n->n_input);
    }
    head_add(oi, S(n->op_type));
    c->used[*node] = true;
    int nx = -1;
    tw_status st = onnx_out0(c, *node, v);
    if (st != TW_OK) return st;
    if (keep && onnx_n_consumers(c, *v) == 1) {
        /* [N, C, 1, 1] to [N, C] */
        nx = c->cons[c->cons_off[*v]];
        const Onnx__NodeProto *f = c->g->node[nx];
        bool flat = false;
        if (op_is(f, "Flatten")) {
            flat = onnx_attr_int(f, "axis", 1) == 1;
        } else if (op_is(f, "Reshape") && f->n_input == 2) {
            int64_t s[4];
            int ns = 0;
            flat = onnx_tensor_ints(onnx_constant(c, f->input[1]), s, 4, &ns) && ns == 2 &&
                   (s[0] == 0 || s[0] == -1 || s[0] > 0) && (s[1] == channels || s[1] == -1) &&
                   !(s[0] == -1 && s[1] == -1);
            /* allowzero 1 makes a 0 in the shape a dimension of 0, not "keep N" */
            if (flat && s[0] == 0 && onnx_attr_int(f, "allowzero", 0) != 0)
                return onnx_node_error(
                    c, nx,
                    "has attribute allowzero = 1 with shape [0, %lld]: its output "
                    "would be empty",
                    (long long)s[1]);
        } else if (op_is(f, "Squeeze")) {
            bool ok = f->n_input >= 2 && *S(f->input[1])
                          ? onnx_tensor_ints(onnx_constant(c, f->input[1]), ax, 4, &cnt)
                          : onnx_attr_ints(f, "axes", ax, 4, &cnt);
            flat = ok && spatial_axes(ax, cnt);
        } else if (op_is(f, "Gemm") || op_is(f, "MatMul")) {
            return onnx_node_error(c, nx, "reads the pooled features before they are flattened");
        } else {
            flat = false;
        }
        if (!flat) return onnx_node_error(c, nx, "is where a ResNet flattens its pooled features");
        head_add(oi, S(f->op_type));
        c->used[nx] = true;
        if ((st = onnx_out0(c, nx, v)) != TW_OK) return st;
    }
    return TW_OK;
}

/* The classifier as it is read: weights and bias as the file has them,
 * Gemm's transB, alpha and beta. */
typedef struct head_fc {
    int node; /* the Gemm or MatMul */
    float *w, *b;
    int64_t ws[4], bsh[4];
    int wd, bd;
    bool trans_b;
    double alpha, beta;
    int out; /* the value after the classifier and its bias */
} head_fc;

/* Gemm node fc->node reading the features v. */
static tw_status head_gemm(octx *c, int v, head_fc *fc)
{
    int nx = fc->node;
    const Onnx__NodeProto *h = c->g->node[nx];
    if (h->n_input < 2 || onnx_val(c, h->input[0]) != v || onnx_attr_int(h, "transA", 0) != 0)
        return onnx_node_error(c, nx, "is not features x weights");
    const Onnx__TensorProto *wt = onnx_constant(c, h->input[1]);
    if (!wt) return onnx_node_error(c, nx, "has weights that are not a constant");
    fc->trans_b = onnx_attr_int(h, "transB", 0) != 0;
    const Onnx__AttributeProto *a = onnx_attr(h, "alpha");
    if (a && a->has_f) fc->alpha = a->f;
    a = onnx_attr(h, "beta");
    if (a && a->has_f) fc->beta = a->f;
    tw_status st = onnx_tensor_floats(c, wt, "fc weight", &fc->w, fc->ws, &fc->wd);
    if (st == TW_OK && h->n_input >= 3 && *S(h->input[2])) {
        const Onnx__TensorProto *bt = onnx_constant(c, h->input[2]);
        st = bt ? onnx_tensor_floats(c, bt, "fc bias", &fc->b, fc->bsh, &fc->bd)
                : onnx_node_error(c, nx, "has a bias that is not a constant");
    }
    head_add(&c->mf->onnx, "Gemm");
    c->used[nx] = true;
    if (st == TW_OK) st = onnx_out0(c, nx, &fc->out);
    return st;
}

/* MatMul node fc->node reading the features v, and the Add of its bias. */
static tw_status head_matmul(octx *c, int v, head_fc *fc)
{
    int nx = fc->node;
    const Onnx__NodeProto *h = c->g->node[nx];
    if (h->n_input != 2 || onnx_val(c, h->input[0]) != v)
        return onnx_node_error(c, nx, "is not features x weights");
    const Onnx__TensorProto *wt = onnx_constant(c, h->input[1]);
    if (!wt) return onnx_node_error(c, nx, "has weights that are not a constant");
    tw_status st = onnx_tensor_floats(c, wt, "fc weight", &fc->w, fc->ws, &fc->wd);
    c->used[nx] = true;
    int mo = -1, ad = -1;
    if (st == TW_OK) st = onnx_out0(c, nx, &mo);
    if (st == TW_OK) st = onnx_next_node(c, mo, nx, "the classifier's bias (Add)", &ad);
    if (st == TW_OK) {
        const Onnx__NodeProto *an = c->g->node[ad];
        int i_mo = an->n_input != 2                  ? -1
                   : onnx_val(c, an->input[0]) == mo ? 0
                   : onnx_val(c, an->input[1]) == mo ? 1
                                                     : -1;
        const Onnx__TensorProto *bt = i_mo >= 0 ? onnx_constant(c, an->input[1 - i_mo]) : NULL;
        if (!op_is(an, "Add") || !bt)
            st = onnx_node_error(c, ad, "is not the classifier's bias (an Add of a constant)");
        else
            st = onnx_tensor_floats(c, bt, "fc bias", &fc->b, fc->bsh, &fc->bd);
        c->used[ad] = true;
        if (st == TW_OK) st = onnx_out0(c, ad, &fc->out);
    }
    head_add(&c->mf->onnx, "MatMul, Add");
    return st;
}

/* fc's weights as [K, channels] and its bias as [K] (zeros without one),
 * alpha and beta folded in, into new buffers *fw, *fb; K into *k. */
static tw_status head_fold(octx *c, int channels, head_fc *fc, float **fw, float **fb, int64_t *k)
{
    int nx = fc->node;
    const float *w = fc->w, *b = fc->b;
    bool trans_b = fc->trans_b;
    double alpha = fc->alpha, beta = fc->beta;
    tw_status st = TW_OK;
    /* a [1, K] bias broadcasts like [K] */
    if (b && fc->bd == 2 && fc->bsh[0] == 1) {
        fc->bd = 1;
        fc->bsh[0] = fc->bsh[1];
    }
    /* W as [K, C] */
    if (fc->wd != 2 || (trans_b ? fc->ws[1] : fc->ws[0]) != channels)
        st =
            onnx_node_error(c, nx, "has weights that do not take the %d pooled features", channels);
    else
        *k = trans_b ? fc->ws[0] : fc->ws[1];
    if (st == TW_OK && b && (fc->bd != 1 || fc->bsh[0] != *k))
        st = onnx_node_error(c, nx, "has a bias of the wrong size (%lld classes)", (long long)*k);
    if (st == TW_OK) {
        *fw = tw_alloc(TW_MEM_WEIGHTS, (size_t)*k * (size_t)channels * sizeof(float));
        *fb = tw_calloc(TW_MEM_WEIGHTS, (size_t)*k, sizeof(float));
        if (!*fw || !*fb) st = tw_model_nomem(c->err, c->path, (size_t)*k * sizeof(float));
    }
    if (st == TW_OK) {
        for (int64_t j = 0; j < *k; j++)
            for (int64_t i = 0; i < channels; i++) {
                float x0 = trans_b ? w[j * channels + i] : w[i * *k + j];
                (*fw)[j * channels + i] = alpha == 1.0 ? x0 : (float)(alpha * x0);
            }
        for (int64_t j = 0; b && j < *k; j++) (*fb)[j] = beta == 1.0 ? b[j] : (float)(beta * b[j]);
    }
    return st;
}

/* An optional Softmax over the classes after value *out, then the graph's
 * output; *out moves past the Softmax. */
static tw_status head_softmax(octx *c, int *out)
{
    tw_onnx_info *oi = &c->mf->onnx;
    tw_status st = TW_OK;
    if (onnx_n_consumers(c, *out) == 1) {
        int sm = c->cons[c->cons_off[*out]];
        const Onnx__NodeProto *s = c->g->node[sm];
        int64_t axis = onnx_attr_int(s, "axis", c->opset >= 13 ? -1 : 1);
        if (!op_is(s, "Softmax"))
            st = onnx_node_error(c, sm,
                                 "follows the classifier (only a Softmax over the classes may)");
        else if (axis != 1 && axis != -1)
            st = onnx_node_error(c, sm, "has attribute axis = %lld (the classes are axis 1 or -1)",
                                 (long long)axis);
        if (st == TW_OK) {
            c->used[sm] = true;
            oi->softmax = true;
            head_add(oi, "Softmax");
            st = onnx_out0(c, sm, out);
        }
    }
    if (st == TW_OK && (onnx_n_consumers(c, *out) != 0 || !onnx_is_graph_output(c, *out)))
        st = tw_model_error(c->err, c->path, "the classifier's result is not the graph's output");
    return st;
}

/* The pooling, flattening and classifier from x on, into fc.weight, fc.bias. */
static tw_status match_head(octx *c, int x, int channels)
{
    int node, v, nx = -1;
    tw_status st = head_features(c, x, channels, &node, &v);
    if (st != TW_OK) return st;
    if (onnx_n_consumers(c, v) == 0) {
        /* A headless backbone: the pooled features are the graph's output and
         * there is no fc (model/resnet.c gives it a stand-in head; embedding
         * products only). */
        if (!onnx_is_graph_output(c, v))
            return tw_model_error(c->err, c->path,
                                  "the pooled features are not the graph's output");
        head_add(&c->mf->onnx, "(no classifier: headless)");
        return TW_OK;
    }
    if ((st = onnx_next_node(c, v, node, "the classifier (Gemm or MatMul)", &nx)) != TW_OK)
        return st;
    const Onnx__NodeProto *h = c->g->node[nx];
    head_fc fc = {.node = nx, .alpha = 1.0, .beta = 1.0, .out = -1};
    if (op_is(h, "Gemm"))
        st = head_gemm(c, v, &fc);
    else if (op_is(h, "MatMul"))
        st = head_matmul(c, v, &fc);
    else
        return onnx_node_error(c, nx, "is where a ResNet has its classifier (Gemm or MatMul)");
    float *fw = NULL, *fb = NULL;
    int64_t k = 0;
    if (st == TW_OK) st = head_fold(c, channels, &fc, &fw, &fb, &k);
    tw_free(fc.w);
    tw_free(fc.b);
    int out = fc.out;
    if (st == TW_OK) st = head_softmax(c, &out);
    int64_t s2[2] = {k, channels}, s1[1] = {k};
    if (st == TW_OK) {
        st = onnx_add_tensor(c, "fc.weight", fw, 2, s2);
        fw = NULL;
    }
    if (st == TW_OK) {
        st = onnx_add_tensor(c, "fc.bias", fb, 1, s1);
        fb = NULL;
    }
    tw_free(fw);
    tw_free(fb);
    return st;
}

/* ------------------------------------------------------------------------ */
/* The whole graph                                                           */

/* The graph's one image input (see onnx_internal.h). */
tw_status onnx_graph_input(octx *c, int *x, int64_t *in_c)
{
    const Onnx__GraphProto *g = c->g;
    tw_onnx_info *oi = &c->mf->onnx;
    int n_in = 0;
    *x = -1;
    for (size_t v = 0; v < c->n_values; v++)
        if (c->values[v].kind == V_INPUT) {
            *x = (int)v;
            n_in++;
        }
    if (n_in != 1)
        return tw_model_error(c->err, c->path, "graph has %d inputs (a ResNet has one image)",
                              n_in);
    const Onnx__ValueInfoProto *in = g->input[c->values[*x].index];
    *in_c = 0;
    if (in->type && in->type->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE &&
        in->type->tensor_type && in->type->tensor_type->shape) {
        const Onnx__TensorShapeProto *sh = in->type->tensor_type->shape;
        char nb[96];
        if (sh->n_dim != 4)
            return tw_model_error(c->err, c->path,
                                  "graph input '%s' has %zu dimensions (N, C, H, W expected)",
                                  onnx_clean(in->name, nb, sizeof nb), sh->n_dim);
        int64_t d[4];
        for (int i = 0; i < 4; i++)
            d[i] = sh->dim[i]->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE
                       ? sh->dim[i]->dim_value
                       : 0;
        *in_c = d[1];
        if (d[2] > 0 && d[2] == d[3] && d[2] <= 65536) oi->input_size = (int)d[2];
    }
    if (onnx_n_consumers(c, *x) != 1)
        return tw_model_error(c->err, c->path,
                              "graph input is read by %d nodes (a ResNet's by its "
                              "stem convolution alone)",
                              onnx_n_consumers(c, *x));

    /* mf->tensors: five per convolution at most, plus fc */
    size_t n_conv = 0;
    for (size_t i = 0; i < g->n_node; i++) n_conv += op_is(g->node[i], "Conv");
    c->cap = (int)(5 * n_conv + 2);
    c->mf->tensors = tw_calloc(TW_MEM_OTHER, (size_t)c->cap, sizeof *c->mf->tensors);
    if (!c->mf->tensors) return tw_model_nomem(c->err, c->path, (size_t)c->cap);

    return TW_OK;
}

tw_status onnx_recognise(octx *c)
{
    const Onnx__GraphProto *g = c->g;
    tw_onnx_info *oi = &c->mf->onnx;
    oi->n_nodes = (int)g->n_node;
    /* resizing or concatenating: a segmentation network (onnx_seg.c) */
    for (size_t i = 0; i < g->n_node; i++)
        if (op_is(g->node[i], "Resize") || op_is(g->node[i], "Concat"))
            return onnx_recognise_seg(c);
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
            return onnx_node_error(c, (int)i,
                                   "is not part of a ResNet (the first such node of the "
                                   "graph)");
        /* a ResNet's ops take 5 inputs at most (BatchNormalization) */
        if (n->n_input > 8 || n->n_output > 8)
            return onnx_node_error(c, (int)i, "has %zu inputs and %zu outputs", n->n_input,
                                   n->n_output);
        tw_status st = onnx_check_attrs(c, (int)i);
        if (st != TW_OK) return st;
    }
    tw_status st = onnx_index_graph(c);
    int x = -1;
    int64_t in_c = 0;
    if (st == TW_OK) st = onnx_graph_input(c, &x, &in_c);
    if (st != TW_OK) return st;

    int y;
    if ((st = onnx_match_stem(c, x, &y)) != TW_OK) return st;
    const tw_tensor *c1 = tw_model_file_find(c->mf, "conv1.weight");
    if (in_c > 0 && c1 && c1->shape[1] != in_c)
        return tw_model_error(c->err, c->path,
                              "graph input has %lld channels but its stem convolution takes %lld",
                              (long long)in_c, (long long)c1->shape[1]);
    onnx_blocks bs = {0, 0, 0, 0};
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
            return onnx_node_error(c, (int)i, "is off the ResNet's path (not part of a ResNet)");
    return TW_OK;
}
