/* resnet.c - see resnet.h
 *
 * The graph is read off the tensor names: blocks per stage from
 * layer{1..4}.{i}.conv1.weight, bottleneck from layer1.0.conv3.weight,
 * the stem from conv1's kernel (7: standard, 3: small), a bottleneck's
 * groups from its conv2's dim 1 (width / groups).
 * Output channel counts are taken from each tensor's dim 0 (so any widths
 * work); every other dimension is checked against what the graph so far
 * implies, and a mismatch names the tensor with the found and expected shape.
 */
#include "model/resnet.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"

#define BN_EPS 1e-5

static const struct {
    int depth;
    bool bottleneck;
    int blocks[4];
} k_layouts[] = {
    {18, false, {2, 2, 2, 2}},  {34, false, {3, 4, 6, 3}},  {50, true, {3, 4, 6, 3}},
    {101, true, {3, 4, 23, 3}}, {152, true, {3, 8, 36, 3}},
};

int tw_resnet_out_size(int in, int k, int stride, int pad)
{
    return (in + 2 * pad - k) / stride + 1;
}

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t used = 0;
    used += (size_t)snprintf(buf + used, cap - used, "[");
    for (int d = 0; d < ndim && used < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, d ? ",%lld" : "%lld", (long long)shape[d]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

/* Look up name and check its shape against want[0..ndim). A negative entry
 * in want accepts any size (a free width); in the message it shows the found
 * size, so "expected" reads as the one shape that would have been accepted. */
tw_status tw_resnet_get_tensor(const tw_model_file *mf, const char *name, int ndim,
                               const int64_t *want, const tw_tensor **out, tw_error *err)
{
    const tw_tensor *t = tw_model_file_find(mf, name);
    if (!t)
        return tw_error_set(err, TW_ERR_MODEL, "model file %s: tensor '%s' is missing", mf->path,
                            name);
    bool ok = t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++)
        if (want[d] >= 0 && t->shape[d] != want[d]) ok = false;
    for (int d = 0; ok && d < ndim; d++)
        if (t->shape[d] <= 0) ok = false;
    if (!ok) {
        int64_t exp[4];
        for (int d = 0; d < ndim; d++)
            exp[d] = want[d] >= 0 ? want[d] : (d < t->ndim && t->shape[d] > 0 ? t->shape[d] : 1);
        char found_s[96], exp_s[96];
        format_shape(found_s, sizeof found_s, t->ndim, t->shape);
        format_shape(exp_s, sizeof exp_s, ndim, exp);
        return tw_error_set(err, TW_ERR_MODEL,
                            "model file %s: tensor '%s' has shape %s, expected %s", mf->path, name,
                            found_s, exp_s);
    }
    if (t->numel < 0 || !t->data)
        return tw_error_set(err, TW_ERR_MODEL, "model file %s: tensor '%s' has no data", mf->path,
                            name);
    *out = t;
    return TW_OK;
}

static bool has_tensor(const tw_model_file *mf, const char *name)
{
    return tw_model_file_find(mf, name) != NULL;
}

/* Read conv `prefix`.weight ([*][cin / groups][k][k]) and its batch norm
 * `bn_prefix`.*, fold them into c (allocating c->w and c->b). */
tw_status tw_resnet_load_conv_bn(const tw_model_file *mf, const char *prefix, const char *bn_prefix,
                                 int cin, int groups, int k, int stride, int pad, tw_conv *c,
                                 size_t *bytes, tw_error *err)
{
    char name[160];
    const tw_tensor *w = NULL;
    snprintf(name, sizeof name, "%s.weight", prefix);
    tw_status st =
        tw_resnet_get_tensor(mf, name, 4, (const int64_t[]){-1, cin / groups, k, k}, &w, err);
    if (st != TW_OK) return st;
    if (w->shape[0] > (1 << 20))
        return tw_error_set(err, TW_ERR_MODEL, "model file %s: tensor '%s' has %lld outputs",
                            mf->path, name, (long long)w->shape[0]);
    int cout = (int)w->shape[0];
    if (cout % groups != 0)
        return tw_error_set(err, TW_ERR_MODEL,
                            "model file %s: tensor '%s' has %d outputs, not a multiple of its "
                            "%d groups",
                            mf->path, name, cout, groups);

    static const char *bn_names[4] = {"weight", "bias", "running_mean", "running_var"};
    const tw_tensor *bn[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "%s.%s", bn_prefix, bn_names[i]);
        st = tw_resnet_get_tensor(mf, name, 1, (const int64_t[]){cout}, &bn[i], err);
        if (st != TW_OK) return st;
    }
    for (int o = 0; o < cout; o++) {
        float v = bn[3]->data[o];
        if (!(v >= 0.0f) || !isfinite(v))
            return tw_error_set(err, TW_ERR_MODEL,
                                "model file %s: tensor '%s.running_var' has an invalid value "
                                "(%g) at index %d",
                                mf->path, bn_prefix, (double)v, o);
    }

    size_t per_out = (size_t)(cin / groups) * (size_t)k * (size_t)k;
    c->cin = cin;
    c->cout = cout;
    c->groups = groups;
    c->k = k;
    c->stride = stride;
    c->pad = pad;
    c->w = tw_alloc(TW_MEM_WEIGHTS, (size_t)cout * per_out * sizeof(float));
    c->b = tw_alloc(TW_MEM_WEIGHTS, (size_t)cout * sizeof(float));
    if (!c->w || !c->b)
        return tw_error_set(err, TW_ERR_NOMEM, "out of memory folding '%s' of %s", prefix,
                            mf->path);
    *bytes += ((size_t)cout * per_out + (size_t)cout) * sizeof(float);
    for (int o = 0; o < cout; o++) {
        /* double keeps the fold within float rounding of PyTorch's eval BN */
        double scale = (double)bn[0]->data[o] / sqrt((double)bn[3]->data[o] + BN_EPS);
        const float *src = w->data + (size_t)o * per_out;
        float *dst = c->w + (size_t)o * per_out;
        for (size_t j = 0; j < per_out; j++) dst[j] = (float)((double)src[j] * scale);
        c->b[o] = (float)((double)bn[1]->data[o] - (double)bn[2]->data[o] * scale);
    }
    return TW_OK;
}

static void free_conv(tw_conv *c)
{
    tw_free(c->w);
    tw_free(c->b);
    c->w = c->b = NULL;
}

void tw_resnet_release_conv(tw_resnet *net, const tw_conv *conv)
{
    if (conv == &net->stem) free_conv(&net->stem);
    for (int i = 0; i < net->n_blocks; i++) {
        tw_block *b = &net->blocks[i];
        tw_conv *cs[] = {&b->c1, &b->c2, &b->c3, &b->down};
        for (int j = 0; j < 4; j++)
            if (conv == cs[j]) free_conv(cs[j]);
    }
}

void tw_resnet_destroy(tw_resnet *net)
{
    if (!net) return;
    free_conv(&net->stem);
    if (net->blocks) {
        for (int i = 0; i < net->n_blocks; i++) {
            free_conv(&net->blocks[i].c1);
            free_conv(&net->blocks[i].c2);
            free_conv(&net->blocks[i].c3);
            free_conv(&net->blocks[i].down);
        }
        tw_free(net->blocks);
    }
    tw_free(net->fc_w);
    tw_free(net->fc_b);
    tw_free(net);
}

/* Depth from the counted layout; 0 when it matches no torchvision ResNet. */
int tw_resnet_layout_depth(const int blocks[4], bool bottleneck)
{
    for (size_t i = 0; i < sizeof k_layouts / sizeof k_layouts[0]; i++)
        if (k_layouts[i].bottleneck == bottleneck &&
            memcmp(k_layouts[i].blocks, blocks, sizeof k_layouts[i].blocks) == 0)
            return k_layouts[i].depth;
    return 0;
}

/* The groups of bottleneck conv `prefix` (conv2) on cin channels, from its
 * weight's dim 1 (cin / groups): 1 when the tensor is missing or its shape
 * divides nothing (load_conv_bn then names the shape). */
static int conv_groups(const tw_model_file *mf, const char *prefix, int cin)
{
    char name[128];
    snprintf(name, sizeof name, "%s.weight", prefix);
    const tw_tensor *t = tw_model_file_find(mf, name);
    if (!t || t->ndim != 4 || t->shape[1] <= 0 || t->shape[1] > cin) return 1;
    int per = (int)t->shape[1];
    return cin % per == 0 ? cin / per : 1;
}

static tw_status load_block(const tw_model_file *mf, int stage, int idx, bool bottleneck, int *ch,
                            int *groups, tw_block *blk, size_t *bytes, tw_error *err)
{
    char p[96], bn[96];
    int stride = (stage > 0 && idx == 0) ? 2 : 1;
    int cin = *ch;
    tw_status st;

    snprintf(p, sizeof p, "layer%d.%d.conv1", stage + 1, idx);
    snprintf(bn, sizeof bn, "layer%d.%d.bn1", stage + 1, idx);
    /* torchvision v1.5: a bottleneck strides in its 3x3 conv2, a basic block in conv1 */
    if (bottleneck)
        st = tw_resnet_load_conv_bn(mf, p, bn, cin, 1, 1, 1, 0, &blk->c1, bytes, err);
    else
        st = tw_resnet_load_conv_bn(mf, p, bn, cin, 1, 3, stride, 1, &blk->c1, bytes, err);
    if (st != TW_OK) return st;

    snprintf(p, sizeof p, "layer%d.%d.conv2", stage + 1, idx);
    snprintf(bn, sizeof bn, "layer%d.%d.bn2", stage + 1, idx);
    /* ResNeXt: a bottleneck's conv2 is grouped, the same groups in every
     * block (the first block's; a later one that differs is named) */
    int g = bottleneck ? conv_groups(mf, p, blk->c1.cout) : 1;
    if (*groups == 0) *groups = g;
    if (g != *groups)
        return tw_error_set(err, TW_ERR_MODEL,
                            "model file %s: tensor '%s.weight' implies %d groups but "
                            "layer1.0.conv2 has %d",
                            mf->path, p, g, *groups);
    st = tw_resnet_load_conv_bn(mf, p, bn, blk->c1.cout, g, 3, bottleneck ? stride : 1, 1, &blk->c2,
                                bytes, err);
    if (st != TW_OK) return st;
    int cout = blk->c2.cout;

    if (bottleneck) {
        snprintf(p, sizeof p, "layer%d.%d.conv3", stage + 1, idx);
        snprintf(bn, sizeof bn, "layer%d.%d.bn3", stage + 1, idx);
        st = tw_resnet_load_conv_bn(mf, p, bn, blk->c2.cout, 1, 1, 1, 0, &blk->c3, bytes, err);
        if (st != TW_OK) return st;
        cout = blk->c3.cout;
    }

    snprintf(p, sizeof p, "layer%d.%d.downsample.0", stage + 1, idx);
    snprintf(bn, sizeof bn, "layer%d.%d.downsample.1", stage + 1, idx);
    char wname[128];
    snprintf(wname, sizeof wname, "%s.weight", p);
    blk->has_down = has_tensor(mf, wname);
    if (blk->has_down) {
        st = tw_resnet_load_conv_bn(mf, p, bn, cin, 1, 1, stride, 0, &blk->down, bytes, err);
        if (st != TW_OK) return st;
        if (blk->down.cout != cout)
            return tw_error_set(err, TW_ERR_MODEL,
                                "model file %s: tensor '%s' has %d outputs but the block "
                                "outputs %d channels",
                                mf->path, wname, blk->down.cout, cout);
    } else if (stride != 1 || cin != cout) {
        return tw_error_set(err, TW_ERR_MODEL,
                            "model file %s: tensor '%s' is missing (block layer%d.%d changes "
                            "%s from %d to %d)",
                            mf->path, wname, stage + 1, idx,
                            stride != 1 ? "the stride" : "channels", stride != 1 ? 1 : cin,
                            stride != 1 ? stride : cout);
    }
    *ch = cout;
    return TW_OK;
}

/* Blocks per stage: the layerS.B.conv1 weights present (at most 1000). */
static void count_blocks(const tw_model_file *mf, int blocks[4])
{
    char name[96];
    for (int s = 0; s < 4; s++) {
        for (;;) {
            snprintf(name, sizeof name, "layer%d.%d.conv1.weight", s + 1, blocks[s]);
            if (!has_tensor(mf, name) || blocks[s] >= 1000) break;
            blocks[s]++;
        }
    }
}

/* model.arch, when given, names an architecture this tree knows. */
static tw_status check_arch_known(const char *arch, tw_error *err)
{
    if (arch && *arch) {
        static const char *const known[] = {
            "resnet18",        "resnet34",        "resnet50",         "resnet101",
            "resnet152",       "resnext50_32x4d", "resnext101_32x8d", "resnext101_64x4d",
            "wide_resnet50_2", "wide_resnet101_2"};
        bool found = false;
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
            found |= !strcmp(arch, known[i]);
        if (!found)
            return tw_error_set(err, TW_ERR_MODEL,
                                "model.arch '%s' is not one of resnet18, resnet34, resnet50, "
                                "resnet101, resnet152, resnext50_32x4d, resnext101_32x8d, "
                                "resnext101_64x4d, wide_resnet50_2, wide_resnet101_2",
                                arch);
    }
    return TW_OK;
}

/* The stem (conv1, bn1): the input bands and the stem's kind from conv1's
 * shape. */
static tw_status load_stem(const tw_model_file *mf, tw_resnet *net, tw_error *err)
{
    tw_status st;
    const tw_tensor *c1 = tw_model_file_find(mf, "conv1.weight");
    if (!c1 || c1->ndim != 4 || (c1->shape[2] != 3 && c1->shape[2] != 7)) {
        /* let get_tensor phrase the message (missing, or shape [*,*,7,7]) */
        const tw_tensor *dummy;
        st = tw_resnet_get_tensor(mf, "conv1.weight", 4, (const int64_t[]){-1, -1, 7, 7}, &dummy,
                                  err);
        if (st == TW_OK) st = TW_ERR_INTERNAL;
        return st;
    }
    if (c1->shape[1] <= 0 || c1->shape[1] > TW_MAX_BANDS) {
        st = tw_error_set(err, TW_ERR_MODEL,
                          "model file %s: tensor 'conv1.weight' has %lld input bands (1..%d "
                          "supported)",
                          mf->path, (long long)c1->shape[1], TW_MAX_BANDS);
        return st;
    }
    net->in_bands = (int)c1->shape[1];
    /* the stem from conv1's kernel: 7x7 s2 p3 + max pool, or 3x3 s1 p1 */
    net->stem_kind = c1->shape[2] == 3 ? TW_STEM_SMALL : TW_STEM_STANDARD;
    bool small = net->stem_kind == TW_STEM_SMALL;
    st = tw_resnet_load_conv_bn(mf, "conv1", "bn1", net->in_bands, 1, small ? 3 : 7, small ? 1 : 2,
                                small ? 1 : 3, &net->stem, &net->weight_bytes, err);
    if (st != TW_OK) return st;
    return tw_resnet_check_stem(net, mf->stem, mf->path, "its metadata 'stem'", err);
}

/* The four stages' blocks, then the family and width they make (checked
 * against model.arch when given). */
static tw_status load_blocks(const tw_model_file *mf, const char *arch, tw_resnet *net,
                             tw_error *err)
{
    const int *blocks = net->stage_blocks;
    const bool bottleneck = net->bottleneck;
    tw_status st;
    int ch = net->stem.cout, groups = 0;
    int bi = 0;
    for (int s = 0; s < 4; s++)
        for (int i = 0; i < blocks[s]; i++) {
            st = load_block(mf, s, i, bottleneck, &ch, &groups, &net->blocks[bi++],
                            &net->weight_bytes, err);
            if (st != TW_OK) return st;
        }
    net->feat_dim = ch;
    net->groups = groups > 0 ? groups : 1;
    net->base_width = net->blocks[0].c1.cout / net->groups;
    net->family = !bottleneck                                         ? TW_FAMILY_RESNET
                  : net->groups > 1                                   ? TW_FAMILY_RESNEXT
                  : net->base_width > 64 && net->base_width % 64 == 0 ? TW_FAMILY_WIDE
                                                                      : TW_FAMILY_RESNET;
    if (arch && *arch) {
        char found[32];
        tw_resnet_arch_name(net, found, sizeof found);
        if (strcmp(found, arch) != 0) {
            st = tw_error_set(err, TW_ERR_MODEL,
                              "model file %s: weights are %s but model.arch says %s", mf->path,
                              found, arch);
            return st;
        }
    }
    return TW_OK;
}

/* The head (fc): its classes; a headless backbone gets a one-class head of
 * zeros. */
static tw_status load_head(const tw_model_file *mf, tw_resnet *net, tw_error *err)
{
    const int ch = net->feat_dim;
    tw_status st;
    const tw_tensor *fw = NULL, *fb = NULL;
    if (!tw_model_file_find(mf, "fc.weight") && !tw_model_file_find(mf, "fc.bias")) {
        /* A headless backbone: a one-class head of zeros stands in (its
         * probability is 1 everywhere), so both backends run it unchanged;
         * run.c lets it serve embedding products only. */
        net->headless = true;
        net->n_classes = 1;
        net->fc_w = tw_calloc(TW_MEM_WEIGHTS, (size_t)ch, sizeof(float));
        net->fc_b = tw_calloc(TW_MEM_WEIGHTS, 1, sizeof(float));
        if (!net->fc_w || !net->fc_b) {
            st = tw_error_set(err, TW_ERR_NOMEM, "out of memory loading %s", mf->path);
            return st;
        }
        net->weight_bytes += ((size_t)ch + 1) * sizeof(float);
        return TW_OK;
    }
    st = tw_resnet_get_tensor(mf, "fc.weight", 2, (const int64_t[]){-1, ch}, &fw, err);
    if (st != TW_OK) return st;
    if (fw->shape[0] > TW_MAX_CLASSES) {
        st = tw_error_set(err, TW_ERR_MODEL,
                          "model file %s: tensor 'fc.weight' has %lld classes (at most %d "
                          "supported)",
                          mf->path, (long long)fw->shape[0], TW_MAX_CLASSES);
        return st;
    }
    net->n_classes = (int)fw->shape[0];
    st = tw_resnet_get_tensor(mf, "fc.bias", 1, (const int64_t[]){net->n_classes}, &fb, err);
    if (st != TW_OK) return st;
    size_t fc_n = (size_t)net->n_classes * (size_t)ch;
    net->fc_w = tw_alloc(TW_MEM_WEIGHTS, fc_n * sizeof(float));
    net->fc_b = tw_alloc(TW_MEM_WEIGHTS, (size_t)net->n_classes * sizeof(float));
    if (!net->fc_w || !net->fc_b) {
        st = tw_error_set(err, TW_ERR_NOMEM, "out of memory loading %s", mf->path);
        return st;
    }
    memcpy(net->fc_w, fw->data, fc_n * sizeof(float));
    memcpy(net->fc_b, fb->data, (size_t)net->n_classes * sizeof(float));
    net->weight_bytes += (fc_n + (size_t)net->n_classes) * sizeof(float);
    return TW_OK;
}

tw_status tw_resnet_create(const tw_model_file *mf, const char *arch, tw_resnet **out,
                           tw_error *err)
{
    *out = NULL;
    int blocks[4] = {0, 0, 0, 0};
    count_blocks(mf, blocks);
    tw_status st = check_arch_known(arch, err);
    if (st != TW_OK) return st;
    bool bottleneck = has_tensor(mf, "layer1.0.conv3.weight");
    int depth = tw_resnet_layout_depth(blocks, bottleneck);
    if (depth == 0)
        return tw_error_set(err, TW_ERR_MODEL,
                            "model file %s: %s blocks per stage [%d,%d,%d,%d] match no ResNet "
                            "(18/34/50/101/152)",
                            mf->path, bottleneck ? "bottleneck" : "basic", blocks[0], blocks[1],
                            blocks[2], blocks[3]);
    tw_resnet *net = tw_calloc(TW_MEM_OTHER, 1, sizeof *net);
    if (!net) return tw_error_set(err, TW_ERR_NOMEM, "out of memory loading %s", mf->path);
    net->depth = depth;
    net->bottleneck = bottleneck;
    memcpy(net->stage_blocks, blocks, sizeof blocks);
    net->n_blocks = blocks[0] + blocks[1] + blocks[2] + blocks[3];
    net->blocks = tw_calloc(TW_MEM_OTHER, (size_t)net->n_blocks, sizeof *net->blocks);
    if (!net->blocks) {
        st = tw_error_set(err, TW_ERR_NOMEM, "out of memory loading %s", mf->path);
        goto fail;
    }

    if ((st = load_stem(mf, net, err)) != TW_OK ||
        (st = load_blocks(mf, arch, net, err)) != TW_OK || (st = load_head(mf, net, err)) != TW_OK)
        goto fail;
    *out = net;
    return TW_OK;

fail:
    tw_resnet_destroy(net);
    return st;
}

const char *tw_resnet_family_name(tw_resnet_family f)
{
    return f == TW_FAMILY_RESNEXT ? "resnext" : f == TW_FAMILY_WIDE ? "wide_resnet" : "resnet";
}

void tw_resnet_arch_name(const tw_resnet *net, char *buf, size_t size)
{
    if (net->family == TW_FAMILY_RESNEXT)
        snprintf(buf, size, "resnext%d_%dx%dd", net->depth, net->groups, net->base_width);
    else if (net->family == TW_FAMILY_WIDE)
        snprintf(buf, size, "wide_resnet%d_%d", net->depth, net->base_width / 64);
    else
        snprintf(buf, size, "resnet%d", net->depth);
}

tw_status tw_resnet_check_stem(const tw_resnet *net, tw_stem want, const char *path,
                               const char *who, tw_error *err)
{
    if (want == TW_STEM_AUTO || want == net->stem_kind) return TW_OK;
    return tw_error_set(err, TW_ERR_MODEL,
                        "model file %s: its conv1 is %dx%d stride %d, a %s stem, but %s says %s",
                        path, net->stem.k, net->stem.k, net->stem.stride,
                        tw_stem_names[net->stem_kind], who, tw_stem_names[want]);
}

void tw_resnet_head(const float *fc_w, const float *fc_b, int n_classes, int feat_dim,
                    const float *feat, int n, float *probs)
{
    for (int t = 0; t < n; t++) {
        const float *f = feat + (size_t)t * feat_dim;
        double logit[TW_MAX_CLASSES], mx = -INFINITY, sum = 0.0;
        for (int j = 0; j < n_classes; j++) {
            const float *w = fc_w + (size_t)j * feat_dim;
            double acc = fc_b[j];
            for (int i = 0; i < feat_dim; i++) acc += (double)w[i] * f[i];
            logit[j] = acc;
            if (acc > mx) mx = acc;
        }
        for (int j = 0; j < n_classes; j++) sum += (logit[j] = exp(logit[j] - mx));
        for (int j = 0; j < n_classes; j++)
            probs[(size_t)t * n_classes + j] = (float)(logit[j] / sum);
    }
}

/* ---- the walk ---- */

/* The lowest of three buffers that is neither a nor b. */
static int third_buffer(int a, int b)
{
    for (int i = 0; i < 3; i++)
        if (i != a && i != b) return i;
    return -1; /* unreachable: a and b exclude at most two */
}

typedef struct walk {
    tw_resnet_visit_fn visit;
    void *user;
    tw_error *err;
    int buf[TW_RESNET_VAL_COUNT]; /* value -> activation buffer 0..2; -1 outside them */
} walk;

/* op as convolution c of a map c->cin x h_in x h_in. */
static void conv_op(tw_resnet_op *op, tw_resnet_op_kind kind, const tw_conv *c, tw_resnet_val src,
                    tw_resnet_val dst, int block, int h_in)
{
    memset(op, 0, sizeof *op);
    op->kind = kind;
    op->conv = c;
    op->src = src;
    op->dst = dst;
    op->add = TW_RESNET_VAL_NONE;
    op->relu = kind != TW_RESNET_OP_SHORTCUT;
    op->block = block;
    op->c_in = c->cin;
    op->h_in = h_in;
    op->c_out = c->cout;
    op->h_out = tw_resnet_out_size(h_in, c->k, c->stride, c->pad);
}

/* op as a step without weights (pools, head). */
static void plain_op(tw_resnet_op *op, tw_resnet_op_kind kind, tw_resnet_val src, tw_resnet_val dst,
                     int c_in, int h_in, int c_out, int h_out, const char *name)
{
    memset(op, 0, sizeof *op);
    op->kind = kind;
    op->src = src;
    op->dst = dst;
    op->add = TW_RESNET_VAL_NONE;
    op->block = -1;
    op->c_in = c_in;
    op->h_in = h_in;
    op->c_out = c_out;
    op->h_out = h_out;
    snprintf(op->name, sizeof op->name, "%s", name);
}

/* Give op its buffers and visit it. keep: a buffer op must not write (the
 * shortcut a later RESIDUAL adds), or -1. */
static tw_status emit(walk *w, tw_resnet_op *op, int keep)
{
    op->buf_src = w->buf[op->src];
    op->buf_add = op->add == TW_RESNET_VAL_NONE ? -1 : w->buf[op->add];
    if (op->dst == TW_RESNET_VAL_FEAT || op->dst == TW_RESNET_VAL_PROBS) {
        op->buf_dst = -1;
    } else {
        op->buf_dst = third_buffer(op->buf_src, keep);
        w->buf[op->dst] = op->buf_dst;
    }
    return w->visit(w->user, op, w->err);
}

tw_status tw_resnet_walk(const tw_resnet *net, int tile, tw_resnet_visit_fn visit, void *user,
                         tw_error *err)
{
    walk w = {.visit = visit, .user = user, .err = err};
    for (int v = 0; v < TW_RESNET_VAL_COUNT; v++) w.buf[v] = -1;
    tw_resnet_op op;
    /* a small stem has no max pool: its conv writes the first block's input */
    conv_op(&op, TW_RESNET_OP_STEM, &net->stem, TW_RESNET_VAL_IN,
            net->stem_kind == TW_STEM_SMALL ? TW_RESNET_VAL_X : TW_RESNET_VAL_STEM, -1, tile);
    snprintf(op.name, sizeof op.name, "conv1");
    tw_status st = emit(&w, &op, -1);
    if (st != TW_OK) return st;
    int ch = op.c_out, h = op.h_out;
    if (net->stem_kind != TW_STEM_SMALL) {
        plain_op(&op, TW_RESNET_OP_MAXPOOL, TW_RESNET_VAL_STEM, TW_RESNET_VAL_X, ch, h, ch,
                 tw_resnet_out_size(h, 3, 2, 1), "maxpool");
        if ((st = emit(&w, &op, -1)) != TW_OK) return st;
        h = op.h_out;
    }

    int stage = 0, in_stage = 0;
    for (int bi = 0; bi < net->n_blocks; bi++, in_stage++) {
        while (stage < 3 && in_stage >= net->stage_blocks[stage]) {
            stage++;
            in_stage = 0;
        }
        const tw_block *b = &net->blocks[bi];
        tw_resnet_val sc = b->has_down ? TW_RESNET_VAL_SC : TW_RESNET_VAL_X;
        if (b->has_down) {
            conv_op(&op, TW_RESNET_OP_SHORTCUT, &b->down, TW_RESNET_VAL_X, TW_RESNET_VAL_SC, bi, h);
            snprintf(op.name, sizeof op.name, "layer%d.%d.downsample.0", stage + 1, in_stage);
            if ((st = emit(&w, &op, -1)) != TW_OK) return st;
        }
        const tw_conv *path[3] = {&b->c1, &b->c2, net->bottleneck ? &b->c3 : NULL};
        int n_path = net->bottleneck ? 3 : 2;
        static const tw_resnet_val outs[2] = {TW_RESNET_VAL_T1, TW_RESNET_VAL_T2};
        tw_resnet_val y = TW_RESNET_VAL_X;
        int hy = h;
        for (int k = 0; k < n_path; k++) {
            bool last = k == n_path - 1;
            conv_op(&op, last ? TW_RESNET_OP_RESIDUAL : TW_RESNET_OP_CONV, path[k], y,
                    last ? TW_RESNET_VAL_X : outs[k], bi, hy);
            if (last) op.add = sc;
            snprintf(op.name, sizeof op.name, "layer%d.%d.conv%d", stage + 1, in_stage, k + 1);
            if ((st = emit(&w, &op, w.buf[sc])) != TW_OK) return st;
            y = op.dst;
            hy = op.h_out;
            ch = op.c_out;
        }
        h = hy;
    }
    plain_op(&op, TW_RESNET_OP_AVGPOOL, TW_RESNET_VAL_X, TW_RESNET_VAL_FEAT, ch, h, ch, 1,
             "avgpool");
    if ((st = emit(&w, &op, -1)) != TW_OK) return st;
    plain_op(&op, TW_RESNET_OP_FC, TW_RESNET_VAL_FEAT, TW_RESNET_VAL_PROBS, ch, 1, net->n_classes,
             1, "fc");
    return emit(&w, &op, -1);
}
