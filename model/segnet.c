/* segnet.c - see segnet.h
 *
 * The layout is read off the tensor names (backbone.* + classifier.0.convs:
 * DeepLabV3; backbone.* + classifier.4 without convs: FCN; encoder.* +
 * decoder.blocks.*: U-Net), the encoder's depth from its blocks per stage.
 * Convs and their batch norms are read and folded by model/resnet.c's
 * readers; every tensor read is marked, and a tensor left unmarked at the
 * end (aux_classifier.* aside) is the foreign key the error names.
 */
#include "model/segnet.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"

typedef struct builder {
    const tw_model_file *mf;
    tw_segnet *net;
    bool *used; /* [mf->n_tensors]: read by the build */
} builder;

static void mark(builder *b, const char *name)
{
    const tw_tensor *t = tw_model_file_find(b->mf, name);
    if (t) b->used[t - b->mf->tensors] = true;
}

static int new_value(builder *b)
{
    return b->net->n_values++;
}

static tw_status push_op(builder *b, const tw_seg_op *op, tw_error *err)
{
    tw_segnet *n = b->net;
    if (n->n_ops == n->cap_ops) {
        int cap = n->cap_ops ? 2 * n->cap_ops : 64;
        tw_seg_op *ops = tw_alloc(TW_MEM_OTHER, (size_t)cap * sizeof *ops);
        if (!ops) return tw_error_set(err, TW_ERR_NOMEM, "out of memory loading %s", b->mf->path);
        if (n->n_ops) memcpy(ops, n->ops, (size_t)n->n_ops * sizeof *ops);
        tw_free(n->ops);
        n->ops = ops;
        n->cap_ops = cap;
    }
    n->ops[n->n_ops++] = *op;
    return TW_OK;
}

static tw_seg_op make_op(tw_seg_op_kind kind, int src, int dst, const char *name)
{
    tw_seg_op op;
    memset(&op, 0, sizeof op);
    op.kind = kind;
    op.src[0] = src;
    op.n_src = 1;
    op.dst = dst;
    op.add = -1;
    op.like = -1;
    op.dil = 1;
    snprintf(op.name, sizeof op.name, "%.63s", name);
    return op;
}

/* conv `prefix` with batch norm `bn` (folded) or, bn NULL, its own bias;
 * k x k, stride, dilation dil (padding dil * (k / 2)); src -> a new value
 * in *dst, plus `add` (or -1), then relu. */
static tw_status conv(builder *b, const char *prefix, const char *bn, int src, int cin, int k,
                      int stride, int dil, int add, bool relu, int *dst, tw_error *err)
{
    tw_seg_op op = make_op(TW_SEG_OP_CONV, src, -1, prefix);
    int pad = dil * (k / 2);
    char name[160];
    tw_status st;
    if (bn) {
        st = tw_resnet_load_conv_bn(b->mf, prefix, bn, cin, 1, k, stride, pad, &op.conv,
                                    &b->net->weight_bytes, err);
        static const char *bn_names[4] = {"weight", "bias", "running_mean", "running_var"};
        for (int i = 0; i < 4; i++) {
            snprintf(name, sizeof name, "%s.%s", bn, bn_names[i]);
            mark(b, name);
        }
    } else {
        const tw_tensor *w = NULL, *bias = NULL;
        snprintf(name, sizeof name, "%s.weight", prefix);
        st = tw_resnet_get_tensor(b->mf, name, 4, (const int64_t[]){-1, cin, k, k}, &w, err);
        if (st == TW_OK && w->shape[0] > TW_MAX_CLASSES)
            st = tw_error_set(err, TW_ERR_MODEL,
                              "model file %s: tensor '%s' has %lld classes (at most %d "
                              "supported)",
                              b->mf->path, name, (long long)w->shape[0], TW_MAX_CLASSES);
        if (st == TW_OK) {
            mark(b, name);
            snprintf(name, sizeof name, "%s.bias", prefix);
            st = tw_resnet_get_tensor(b->mf, name, 1, (const int64_t[]){w->shape[0]}, &bias, err);
        }
        if (st == TW_OK) {
            mark(b, name);
            int cout = (int)w->shape[0];
            size_t nw = (size_t)cout * (size_t)cin * (size_t)k * (size_t)k;
            op.conv = (tw_conv){
                .cin = cin, .cout = cout, .k = k, .stride = stride, .pad = pad, .groups = 1};
            op.conv.w = tw_alloc(TW_MEM_WEIGHTS, nw * sizeof(float));
            op.conv.b = tw_alloc(TW_MEM_WEIGHTS, (size_t)cout * sizeof(float));
            if (!op.conv.w || !op.conv.b)
                st = tw_error_set(err, TW_ERR_NOMEM, "out of memory loading %s", b->mf->path);
            else {
                memcpy(op.conv.w, w->data, nw * sizeof(float));
                memcpy(op.conv.b, bias->data, (size_t)cout * sizeof(float));
                b->net->weight_bytes += (nw + (size_t)cout) * sizeof(float);
            }
        }
    }
    snprintf(name, sizeof name, "%s.weight", prefix);
    mark(b, name);
    if (st == TW_OK) {
        op.dil = dil;
        op.add = add;
        op.relu = relu;
        op.dst = new_value(b);
        st = push_op(b, &op, err);
    }
    if (st != TW_OK) {
        tw_free(op.conv.w);
        tw_free(op.conv.b);
        return st;
    }
    *dst = op.dst;
    return TW_OK;
}

static tw_status simple(builder *b, tw_seg_op_kind kind, int src, const char *name, int *dst,
                        tw_error *err)
{
    tw_seg_op op = make_op(kind, src, new_value(b), name);
    *dst = op.dst;
    return push_op(b, &op, err);
}

static int conv_cout(const builder *b)
{
    return b->net->ops[b->net->n_ops - 1].conv.cout;
}

/* A torchvision ResNet under `pre` ("backbone." / "encoder."): stem, max
 * pool, layer1..4. dilate: layer3 and layer4 as
 * replace_stride_with_dilation=[False, True, True]. feat[0] = the stem's
 * output (after its ReLU), feat[1..4] = layer1..4's; ch[] their channels. */
static tw_status build_resnet(builder *b, const char *pre, bool dilate, int feat[5], int ch[5],
                              tw_error *err)
{
    const tw_model_file *mf = b->mf;
    char p[160], q[192];
    int blocks[4] = {0, 0, 0, 0};
    for (int s = 0; s < 4; s++)
        for (;;) {
            snprintf(p, sizeof p, "%slayer%d.%d.conv1.weight", pre, s + 1, blocks[s]);
            if (!tw_model_file_find(mf, p) || blocks[s] >= 1000) break;
            blocks[s]++;
        }
    snprintf(p, sizeof p, "%slayer1.0.conv3.weight", pre);
    bool bottleneck = tw_model_file_find(mf, p) != NULL;
    int depth = tw_resnet_layout_depth(blocks, bottleneck);
    if (depth == 0 || depth == 152)
        return tw_error_set(err, TW_ERR_MODEL,
                            "model file %s: %s blocks per stage of %s* [%d,%d,%d,%d] match no "
                            "ResNet encoder (18/34/50/101)",
                            mf->path, bottleneck ? "bottleneck" : "basic", pre, blocks[0],
                            blocks[1], blocks[2], blocks[3]);
    if (dilate && !bottleneck)
        return tw_error_set(err, TW_ERR_MODEL,
                            "model file %s: %s is a ResNet-%d of basic blocks; torchvision's "
                            "dilated backbones (fcn, deeplabv3) are bottleneck ResNets (50/101)",
                            mf->path, pre, depth);
    b->net->depth = depth;

    snprintf(p, sizeof p, "%sconv1.weight", pre);
    const tw_tensor *c1 = tw_model_file_find(mf, p);
    const tw_tensor *dummy;
    if (!c1 || c1->ndim != 4 || c1->shape[2] != 7)
        return tw_resnet_get_tensor(mf, p, 4, (const int64_t[]){-1, -1, 7, 7}, &dummy, err);
    if (c1->shape[1] <= 0 || c1->shape[1] > TW_MAX_BANDS)
        return tw_error_set(err, TW_ERR_MODEL,
                            "model file %s: tensor '%s' has %lld input bands (1..%d supported)",
                            mf->path, p, (long long)c1->shape[1], TW_MAX_BANDS);
    b->net->in_bands = (int)c1->shape[1];
    snprintf(p, sizeof p, "%sconv1", pre);
    snprintf(q, sizeof q, "%sbn1", pre);
    int x;
    tw_status st = conv(b, p, q, TW_SEG_VAL_IN, b->net->in_bands, 7, 2, 1, -1, true, &x, err);
    if (st != TW_OK) return st;
    feat[0] = x;
    ch[0] = conv_cout(b);
    snprintf(p, sizeof p, "%smaxpool", pre);
    if ((st = simple(b, TW_SEG_OP_MAXPOOL, x, p, &x, err)) != TW_OK) return st;

    int c = ch[0], dilation = 1;
    for (int s = 0; s < 4; s++) {
        int stride = s > 0 ? 2 : 1, prev_dil = dilation;
        if (dilate && s >= 2) {
            dilation *= stride;
            stride = 1;
        }
        for (int i = 0; i < blocks[s]; i++) {
            int bstride = i == 0 ? stride : 1, bdil = i == 0 ? prev_dil : dilation;
            int sc = x, t, cin = c;
            snprintf(p, sizeof p, "%slayer%d.%d.downsample.0", pre, s + 1, i);
            snprintf(q, sizeof q, "%s.weight", p);
            bool down = tw_model_file_find(mf, q) != NULL;
            if (down) {
                snprintf(q, sizeof q, "%slayer%d.%d.downsample.1", pre, s + 1, i);
                if ((st = conv(b, p, q, x, cin, 1, bstride, 1, -1, false, &sc, err)) != TW_OK)
                    return st;
            }
            int sc_c = down ? conv_cout(b) : cin;
            snprintf(p, sizeof p, "%slayer%d.%d.conv1", pre, s + 1, i);
            snprintf(q, sizeof q, "%slayer%d.%d.bn1", pre, s + 1, i);
            /* v1.5: a bottleneck strides (and dilates) in conv2, a basic block in conv1 */
            if (bottleneck)
                st = conv(b, p, q, x, cin, 1, 1, 1, -1, true, &t, err);
            else
                st = conv(b, p, q, x, cin, 3, bstride, 1, -1, true, &t, err);
            if (st != TW_OK) return st;
            int tc = conv_cout(b);
            snprintf(p, sizeof p, "%slayer%d.%d.conv2", pre, s + 1, i);
            snprintf(q, sizeof q, "%slayer%d.%d.bn2", pre, s + 1, i);
            if (bottleneck) {
                if ((st = conv(b, p, q, t, tc, 3, bstride, bdil, -1, true, &t, err)) != TW_OK)
                    return st;
                tc = conv_cout(b);
                snprintf(p, sizeof p, "%slayer%d.%d.conv3", pre, s + 1, i);
                snprintf(q, sizeof q, "%slayer%d.%d.bn3", pre, s + 1, i);
            }
            if ((st = conv(b, p, q, t, tc, bottleneck ? 1 : 3, 1, 1, sc, true, &x, err)) != TW_OK)
                return st;
            c = conv_cout(b);
            if (c != sc_c || (!down && bstride != 1))
                return tw_error_set(err, TW_ERR_MODEL,
                                    "model file %s: block %slayer%d.%d outputs %d channels but "
                                    "its shortcut %d%s",
                                    mf->path, pre, s + 1, i, c, sc_c,
                                    down ? "" : " (no downsample.0 tensors)");
        }
        feat[s + 1] = x;
        ch[s + 1] = c;
    }
    return TW_OK;
}

static tw_status build_torchvision_head(builder *b, bool deeplab, int x, int cin, tw_error *err)
{
    const tw_model_file *mf = b->mf;
    tw_status st;
    int h;
    char p[96], q[96];
    if (deeplab) {
        for (int i = 5; i < 64; i++) {
            snprintf(p, sizeof p, "classifier.0.convs.%d.0.weight", i);
            snprintf(q, sizeof q, "classifier.0.convs.%d.1.weight", i);
            if (tw_model_file_find(mf, p) || tw_model_file_find(mf, q))
                return tw_error_set(err, TW_ERR_MODEL,
                                    "model file %s: tensor '%s' is foreign: torchvision's ASPP has "
                                    "5 branches (1x1, rates 12/24/36, image pooling)",
                                    mf->path, tw_model_file_find(mf, p) ? p : q);
        }
        tw_seg_op cat = make_op(TW_SEG_OP_CONCAT, -1, -1, "classifier.0 (concat)");
        cat.n_src = 5;
        static const int rates[3] = {12, 24, 36};
        if ((st = conv(b, "classifier.0.convs.0.0", "classifier.0.convs.0.1", x, cin, 1, 1, 1, -1,
                       true, &cat.src[0], err)) != TW_OK)
            return st;
        int width = conv_cout(b);
        for (int r = 0; r < 3; r++) {
            snprintf(p, sizeof p, "classifier.0.convs.%d.0", r + 1);
            snprintf(q, sizeof q, "classifier.0.convs.%d.1", r + 1);
            if ((st = conv(b, p, q, x, cin, 3, 1, rates[r], -1, true, &cat.src[r + 1], err)) !=
                TW_OK)
                return st;
            width += conv_cout(b);
        }
        int g;
        if ((st = simple(b, TW_SEG_OP_AVGPOOL, x, "classifier.0.convs.4.0", &g, err)) != TW_OK ||
            (st = conv(b, "classifier.0.convs.4.1", "classifier.0.convs.4.2", g, cin, 1, 1, 1, -1,
                       true, &g, err)) != TW_OK)
            return st;
        width += conv_cout(b);
        tw_seg_op up =
            make_op(TW_SEG_OP_BILINEAR, g, new_value(b), "classifier.0.convs.4 (resize)");
        up.like = x;
        if ((st = push_op(b, &up, err)) != TW_OK) return st;
        cat.src[4] = up.dst;
        cat.dst = new_value(b);
        if ((st = push_op(b, &cat, err)) != TW_OK) return st;
        if ((st = conv(b, "classifier.0.project.0", "classifier.0.project.1", cat.dst, width, 1, 1,
                       1, -1, true, &h, err)) != TW_OK)
            return st;
        if ((st = conv(b, "classifier.1", "classifier.2", h, conv_cout(b), 3, 1, 1, -1, true, &h,
                       err)) != TW_OK)
            return st;
    } else {
        if ((st = conv(b, "classifier.0", "classifier.1", x, cin, 3, 1, 1, -1, true, &h, err)) !=
            TW_OK)
            return st;
    }
    if ((st = conv(b, "classifier.4", NULL, h, conv_cout(b), 1, 1, 1, -1, false, &h, err)) != TW_OK)
        return st;
    b->net->n_classes = conv_cout(b);
    tw_seg_op up = make_op(TW_SEG_OP_BILINEAR, h, new_value(b), "interpolate (to the tile)");
    up.like = TW_SEG_VAL_IN;
    if ((st = push_op(b, &up, err)) != TW_OK) return st;
    return simple(b, TW_SEG_OP_SOFTMAX, up.dst, "softmax", &h, err);
}

static tw_status build_unet(builder *b, const int feat[5], const int ch[5], tw_error *err)
{
    const tw_model_file *mf = b->mf;
    char p[96], q[96];
    int n_blocks = 0;
    for (;; n_blocks++) {
        snprintf(p, sizeof p, "decoder.blocks.%d.conv1.0.weight", n_blocks);
        if (!tw_model_file_find(mf, p) || n_blocks >= 64) break;
    }
    if (n_blocks != 5)
        return tw_error_set(err, TW_ERR_MODEL,
                            "model file %s: %d U-Net decoder blocks (decoder.blocks.N.conv1.0."
                            "weight); an encoder of depth 5 has 5",
                            mf->path, n_blocks);
    int x = feat[4], c = ch[4];
    tw_status st;
    for (int i = 0; i < n_blocks; i++) {
        snprintf(p, sizeof p, "decoder.blocks.%d (upsample)", i);
        int u;
        if ((st = simple(b, TW_SEG_OP_NEAREST2, x, p, &u, err)) != TW_OK) return st;
        if (i < 4) {
            tw_seg_op cat = make_op(TW_SEG_OP_CONCAT, u, new_value(b), "");
            snprintf(cat.name, sizeof cat.name, "decoder.blocks.%d (concat)", i);
            cat.src[1] = feat[3 - i];
            cat.n_src = 2;
            if ((st = push_op(b, &cat, err)) != TW_OK) return st;
            u = cat.dst;
            c += ch[3 - i];
        }
        snprintf(p, sizeof p, "decoder.blocks.%d.conv1.0", i);
        snprintf(q, sizeof q, "decoder.blocks.%d.conv1.1", i);
        if ((st = conv(b, p, q, u, c, 3, 1, 1, -1, true, &x, err)) != TW_OK) return st;
        snprintf(p, sizeof p, "decoder.blocks.%d.conv2.0", i);
        snprintf(q, sizeof q, "decoder.blocks.%d.conv2.1", i);
        if ((st = conv(b, p, q, x, conv_cout(b), 3, 1, 1, -1, true, &x, err)) != TW_OK) return st;
        c = conv_cout(b);
    }
    if ((st = conv(b, "segmentation_head.0", NULL, x, c, 3, 1, 1, -1, false, &x, err)) != TW_OK)
        return st;
    b->net->n_classes = conv_cout(b);
    return simple(b, TW_SEG_OP_SOFTMAX, x, "softmax", &x, err);
}

static bool starts(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static bool any_prefix(const tw_model_file *mf, const char *prefix)
{
    for (int i = 0; i < mf->n_tensors; i++)
        if (starts(mf->tensors[i].name, prefix)) return true;
    return false;
}

bool tw_segnet_detect(const tw_model_file *mf)
{
    return (any_prefix(mf, "backbone.") && any_prefix(mf, "classifier.")) ||
           (any_prefix(mf, "encoder.") && any_prefix(mf, "decoder.blocks."));
}

static const char *const k_archs[] = {
    "fcn_resnet50",  "fcn_resnet101", "deeplabv3_resnet50", "deeplabv3_resnet101",
    "unet_resnet18", "unet_resnet34", "unet_resnet50",      "unet_resnet101",
};

tw_status tw_segnet_create(const tw_model_file *mf, const char *arch, tw_segnet **out,
                           tw_error *err)
{
    *out = NULL;
    if (arch && *arch) {
        bool known = false;
        for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0]; i++)
            known |= !strcmp(arch, k_archs[i]);
        if (!known)
            return tw_error_set(err, TW_ERR_MODEL,
                                "model.arch '%s' is not one of fcn_resnet50, fcn_resnet101, "
                                "deeplabv3_resnet50, deeplabv3_resnet101, unet_resnet18, "
                                "unet_resnet34, unet_resnet50, unet_resnet101",
                                arch);
    }
    tw_seg_kind kind;
    const char *const *allowed;
    static const char *const tv_allowed[] = {"backbone.conv1.", "backbone.bn1.",   "backbone.layer",
                                             "classifier.",     "aux_classifier.", NULL};
    static const char *const unet_allowed[] = {"encoder.conv1.",     "encoder.bn1.",
                                               "encoder.layer",      "decoder.blocks.",
                                               "segmentation_head.", NULL};
    if (any_prefix(mf, "backbone.") && any_prefix(mf, "classifier.")) {
        kind = any_prefix(mf, "classifier.0.convs.") ? TW_SEG_DEEPLABV3 : TW_SEG_FCN;
        allowed = tv_allowed;
    } else if (any_prefix(mf, "encoder.") && any_prefix(mf, "decoder.blocks.")) {
        kind = TW_SEG_UNET;
        allowed = unet_allowed;
    } else {
        return tw_error_set(err, TW_ERR_MODEL,
                            "model file %s: tensor '%s' belongs to no segmentation layout "
                            "(fcn/deeplabv3: backbone.* + classifier.*; unet: encoder.* + "
                            "decoder.blocks.* + segmentation_head.*)",
                            mf->path, mf->n_tensors ? mf->tensors[0].name : "(none)");
    }
    /* a foreign module is named before anything is read from the rest */
    for (int i = 0; i < mf->n_tensors; i++) {
        bool ok = false;
        for (int j = 0; allowed[j]; j++) ok |= starts(mf->tensors[i].name, allowed[j]);
        if (!ok)
            return tw_error_set(err, TW_ERR_MODEL,
                                "model file %s: tensor '%s' is foreign to a %s layout (the first "
                                "such key)",
                                mf->path, mf->tensors[i].name,
                                kind == TW_SEG_UNET ? "U-Net (segmentation_models_pytorch)"
                                                    : "torchvision segmentation");
    }

    builder b = {.mf = mf};
    b.net = tw_calloc(TW_MEM_OTHER, 1, sizeof *b.net);
    b.used = tw_calloc(TW_MEM_OTHER, (size_t)(mf->n_tensors ? mf->n_tensors : 1), sizeof *b.used);
    tw_status st = TW_OK;
    if (!b.net || !b.used) {
        st = tw_error_set(err, TW_ERR_NOMEM, "out of memory loading %s", mf->path);
        goto done;
    }
    b.net->kind = kind;
    b.net->n_values = 1; /* the input */
    b.net->multiple = kind == TW_SEG_UNET ? 32 : 1;
    int feat[5], ch[5];
    st = build_resnet(&b, kind == TW_SEG_UNET ? "encoder." : "backbone.", kind != TW_SEG_UNET, feat,
                      ch, err);
    if (st == TW_OK)
        st = kind == TW_SEG_UNET
                 ? build_unet(&b, feat, ch, err)
                 : build_torchvision_head(&b, kind == TW_SEG_DEEPLABV3, feat[4], ch[4], err);
    if (st != TW_OK) goto done;
    b.net->out = b.net->ops[b.net->n_ops - 1].dst;
    snprintf(b.net->arch, sizeof b.net->arch, "%s_resnet%d",
             kind == TW_SEG_UNET  ? "unet"
             : kind == TW_SEG_FCN ? "fcn"
                                  : "deeplabv3",
             b.net->depth);
    for (int i = 0; i < mf->n_tensors; i++)
        if (!b.used[i] && !starts(mf->tensors[i].name, "aux_classifier.")) {
            st = tw_error_set(err, TW_ERR_MODEL,
                              "model file %s: tensor '%s' is foreign to %s (the first such key)",
                              mf->path, mf->tensors[i].name, b.net->arch);
            goto done;
        }
    if (arch && *arch && strcmp(arch, b.net->arch) != 0) {
        st = tw_error_set(err, TW_ERR_MODEL, "model file %s: weights are %s but model.arch says %s",
                          mf->path, b.net->arch, arch);
        goto done;
    }
    *out = b.net;
    b.net = NULL;
done:
    tw_free(b.used);
    tw_segnet_destroy(b.net);
    return st;
}

void tw_segnet_destroy(tw_segnet *net)
{
    if (!net) return;
    for (int i = 0; i < net->n_ops; i++) {
        tw_free(net->ops[i].conv.w);
        tw_free(net->ops[i].conv.b);
    }
    tw_free(net->ops);
    tw_free(net);
}

tw_status tw_segnet_shapes(const tw_segnet *net, int tile, int *c, int *h, tw_error *err)
{
    c[TW_SEG_VAL_IN] = net->in_bands;
    h[TW_SEG_VAL_IN] = tile;
    if (tile <= 0 || tile % net->multiple != 0)
        return tw_error_set(err, TW_ERR_CONFIG,
                            "tile %d: %s needs a tile side that is a positive "
                            "multiple of %d",
                            tile, net->arch, net->multiple);
    for (int i = 0; i < net->n_ops; i++) {
        const tw_seg_op *op = &net->ops[i];
        int s = op->src[0], oc = c[s], oh = h[s];
        switch (op->kind) {
        case TW_SEG_OP_CONV:
            oc = op->conv.cout;
            oh = (oh + 2 * op->conv.pad - op->dil * (op->conv.k - 1) - 1) / op->conv.stride + 1;
            break;
        case TW_SEG_OP_MAXPOOL: oh = (oh + 2 - 3) / 2 + 1; break;
        case TW_SEG_OP_AVGPOOL: oh = 1; break;
        case TW_SEG_OP_BILINEAR: oh = h[op->like]; break;
        case TW_SEG_OP_NEAREST2: oh *= 2; break;
        case TW_SEG_OP_CONCAT:
            oc = 0;
            for (int j = 0; j < op->n_src; j++) {
                oc += c[op->src[j]];
                if (h[op->src[j]] != oh)
                    return tw_error_set(err, TW_ERR_CONFIG,
                                        "tile %d: %s concatenates maps of %d and %d px at %s "
                                        "(the tile side must be a multiple of %d)",
                                        tile, net->arch, oh, h[op->src[j]], op->name,
                                        net->multiple);
            }
            break;
        case TW_SEG_OP_SOFTMAX: break;
        }
        if (oh <= 0 || (op->kind == TW_SEG_OP_CONV && op->add >= 0 && h[op->add] != oh))
            return tw_error_set(err, TW_ERR_CONFIG, "tile %d: too small for %s (at %s)", tile,
                                net->arch, op->name);
        c[op->dst] = oc;
        h[op->dst] = oh;
    }
    return TW_OK;
}

void tw_segnet_last_use(const tw_segnet *net, int *last)
{
    for (int v = 0; v < net->n_values; v++) last[v] = -1;
    for (int i = 0; i < net->n_ops; i++) {
        const tw_seg_op *op = &net->ops[i];
        for (int j = 0; j < op->n_src; j++) last[op->src[j]] = i;
        if (op->add >= 0) last[op->add] = i;
    }
    last[net->out] = net->n_ops;
}
