/* test_segnet.c - the segmentation graphs (model/segnet.c) built from
 * in-memory state_dicts (tests/synth_resnet.h's ResNets under a prefix,
 * narrow widths): layout detection, the dilations torchvision gives layer3
 * and layer4, shapes per tile, the refusals and their messages; and the CPU
 * forward (model/seg_cpu.c) on them: probabilities that sum to 1, the same
 * bits for a tile whatever its batch, an arena that does not grow with the
 * batch. Parity with PyTorch is tests/e2e_seg_parity.py's. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "io/modelfile/model_file.h"
#include "model/seg_cpu.h"
#include "model/segnet.h"
#include "core/alloc.h"
#include "tests/synth_resnet.h"
#include "tests/testutil.h"

static const int k_r18[4] = {2, 2, 2, 2}, k_r34[4] = {3, 4, 6, 3}, k_r50[4] = {3, 4, 6, 3},
                 k_r101[4] = {3, 4, 23, 3};

/* Every tensor of s renamed to prefix + name; fc dropped. */
static void prefix_all(synth *s, const char *prefix)
{
    synth_remove(s, "fc.weight");
    synth_remove(s, "fc.bias");
    for (int i = 0; i < s->mf.n_tensors; i++) {
        char n[128];
        snprintf(n, sizeof n, "%s%s", prefix, s->mf.tensors[i].name);
        snprintf(s->mf.tensors[i].name, sizeof s->mf.tensors[i].name, "%s", n);
    }
}

static const int k_dec[5] = {32, 16, 16, 8, 8};

/* A U-Net (SMP layout) on a ResNet of `blocks` (bottleneck or basic) of
 * width w, decoder widths dec. */
static void make_unet_enc(synth *s, const int blocks[4], int bottleneck, int bands, int w,
                          int classes, const int dec[5])
{
    assert_int_equal(synth_resnet(s, blocks, bottleneck, bands, w, 1, 7), 0);
    prefix_all(s, "encoder.");
    int e = bottleneck ? 4 : 1; /* a stage's output: e x its planes */
    int skips[5] = {4 * e * w, 2 * e * w, e * w, w, 0}, in = 8 * e * w;
    char p[96], q[96];
    for (int i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "decoder.blocks.%d.conv1.0", i);
        snprintf(q, sizeof q, "decoder.blocks.%d.conv1.1", i);
        synth_conv_bn(s, p, q, dec[i], in + skips[i], 3);
        snprintf(p, sizeof p, "decoder.blocks.%d.conv2.0", i);
        snprintf(q, sizeof q, "decoder.blocks.%d.conv2.1", i);
        synth_conv_bn(s, p, q, dec[i], dec[i], 3);
        in = dec[i];
    }
    synth_add(s, "segmentation_head.0.weight", 4, (int64_t[]){classes, dec[4], 3, 3}, -0.3f, 0.3f);
    synth_add(s, "segmentation_head.0.bias", 1, (int64_t[]){classes}, -0.1f, 0.1f);
}

static void make_unet_dec(synth *s, int bands, int w, int classes, const int dec[5])
{
    make_unet_enc(s, k_r18, 0, bands, w, classes, dec);
}

static void make_unet(synth *s, int bands, int w, int classes)
{
    make_unet_dec(s, bands, w, classes, k_dec);
}

/* torchvision FCN / DeepLabV3 on a bottleneck ResNet of `blocks`, width 4
 * (layer4: 128 channels). */
static void make_tv_depth(synth *s, const int blocks[4], bool deeplab, bool aux, int bands,
                          int classes)
{
    int w = 4, c4 = 32 * w, head = 16;
    assert_int_equal(synth_resnet(s, blocks, 1, bands, w, 1, 11), 0);
    prefix_all(s, "backbone.");
    if (deeplab) {
        synth_conv_bn(s, "classifier.0.convs.0.0", "classifier.0.convs.0.1", head, c4, 1);
        char p[64], q[64];
        for (int i = 1; i <= 3; i++) {
            snprintf(p, sizeof p, "classifier.0.convs.%d.0", i);
            snprintf(q, sizeof q, "classifier.0.convs.%d.1", i);
            synth_conv_bn(s, p, q, head, c4, 3);
        }
        synth_conv_bn(s, "classifier.0.convs.4.1", "classifier.0.convs.4.2", head, c4, 1);
        synth_conv_bn(s, "classifier.0.project.0", "classifier.0.project.1", head, 5 * head, 1);
        synth_conv_bn(s, "classifier.1", "classifier.2", head, head, 3);
    } else {
        synth_conv_bn(s, "classifier.0", "classifier.1", head, c4, 3);
    }
    synth_add(s, "classifier.4.weight", 4, (int64_t[]){classes, head, 1, 1}, -0.3f, 0.3f);
    synth_add(s, "classifier.4.bias", 1, (int64_t[]){classes}, -0.1f, 0.1f);
    if (aux) {
        synth_conv_bn(s, "aux_classifier.0", "aux_classifier.1", 8, 16 * w, 3);
        synth_add(s, "aux_classifier.4.weight", 4, (int64_t[]){classes, 8, 1, 1}, -0.3f, 0.3f);
        synth_add(s, "aux_classifier.4.bias", 1, (int64_t[]){classes}, -0.1f, 0.1f);
    }
}

static void make_tv(synth *s, bool deeplab, bool aux, int bands, int classes)
{
    make_tv_depth(s, k_r50, deeplab, aux, bands, classes);
}

static tw_segnet *build_ok(synth *s, const char *arch)
{
    tw_error err;
    tw_error_init(&err);
    tw_segnet *net = NULL;
    tw_status st = tw_segnet_create(&s->mf, arch, &net, &err);
    if (st != TW_OK) fail_msg("tw_segnet_create: %s", err.msg);
    return net;
}

/* Build from s and expect failure st with a message holding every fragment;
 * a failed build gives back every byte of weights it took. */
static void expect_error(synth *s, const char *arch, tw_status st, int n, ...)
{
    tw_error err;
    tw_error_init(&err);
    tw_segnet *net = (tw_segnet *)1;
    size_t before = tw_mem_current(TW_MEM_WEIGHTS);
    assert_int_equal(tw_segnet_create(&s->mf, arch, &net, &err), st);
    assert_null(net);
    assert_int_equal(tw_mem_current(TW_MEM_WEIGHTS), before);
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) {
        const char *frag = va_arg(ap, const char *);
        if (!strstr(err.msg, frag)) fail_msg("message '%s' lacks '%s'", err.msg, frag);
    }
    va_end(ap);
}

static const tw_seg_op *op_named(const tw_segnet *net, const char *name)
{
    for (int i = 0; i < net->n_ops; i++)
        if (!strcmp(net->ops[i].name, name)) return &net->ops[i];
    fail_msg("no op %s", name);
    return NULL;
}

static void test_unet_graph(void **state)
{
    (void)state;
    synth s;
    make_unet(&s, 4, 8, 3);
    tw_segnet *net = build_ok(&s, "");
    assert_string_equal(net->arch, "unet_resnet18");
    assert_int_equal(net->kind, TW_SEG_UNET);
    assert_int_equal(net->in_bands, 4);
    assert_int_equal(net->n_classes, 3);
    assert_int_equal(net->multiple, 32);
    int c[1024], h[1024];
    assert_true(net->n_values <= 1024);
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_segnet_shapes(net, 64, c, h, &err), TW_OK);
    assert_int_equal(c[net->out], 3);
    assert_int_equal(h[net->out], 64);
    /* block 0 concatenates the upsampled layer4 (64 ch) and layer3 (32 ch) at 4 px */
    const tw_seg_op *cat = op_named(net, "decoder.blocks.0 (concat)");
    assert_int_equal(cat->n_src, 2);
    assert_int_equal(c[cat->dst], 64 + 32);
    assert_int_equal(h[cat->dst], 4);
    /* the last block has no skip: no concat */
    for (int i = 0; i < net->n_ops; i++) assert_null(strstr(net->ops[i].name, "blocks.4 (concat)"));
    /* a tile that is no multiple of 32 is refused, naming it */
    assert_int_equal(tw_segnet_shapes(net, 80, c, h, &err), TW_ERR_CONFIG);
    assert_non_null(strstr(err.msg, "tile 80"));
    assert_non_null(strstr(err.msg, "multiple of 32"));
    tw_segnet_destroy(net);
    /* the arch named agrees, another is refused naming both */
    net = build_ok(&s, "unet_resnet18");
    tw_segnet_destroy(net);
    expect_error(&s, "unet_resnet34", TW_ERR_MODEL, 2, "unet_resnet18", "unet_resnet34");
    expect_error(&s, "unet_resnet152", TW_ERR_MODEL, 1, "'unet_resnet152' is not one of");
    synth_free(&s);
}

static void test_deeplab_graph(void **state)
{
    (void)state;
    synth s;
    make_tv(&s, true, true, 4, 5);
    tw_segnet *net = build_ok(&s, "");
    assert_string_equal(net->arch, "deeplabv3_resnet50");
    assert_int_equal(net->n_classes, 5);
    assert_int_equal(net->multiple, 1);
    /* torchvision's replace_stride_with_dilation=[False, True, True]: a dilated
     * layer's first block keeps the previous dilation */
    static const struct {
        const char *name;
        int stride, dil, pad;
    } want[] = {
        {"backbone.layer2.0.conv2", 2, 1, 1},        {"backbone.layer3.0.conv2", 1, 1, 1},
        {"backbone.layer3.0.downsample.0", 1, 1, 0}, {"backbone.layer3.1.conv2", 1, 2, 2},
        {"backbone.layer3.5.conv2", 1, 2, 2},        {"backbone.layer4.0.conv2", 1, 2, 2},
        {"backbone.layer4.0.downsample.0", 1, 1, 0}, {"backbone.layer4.2.conv2", 1, 4, 4},
        {"classifier.0.convs.1.0", 1, 12, 12},       {"classifier.0.convs.2.0", 1, 24, 24},
        {"classifier.0.convs.3.0", 1, 36, 36},       {"classifier.1", 1, 1, 1},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const tw_seg_op *op = op_named(net, want[i].name);
        assert_int_equal(op->conv.stride, want[i].stride);
        assert_int_equal(op->dil, want[i].dil);
        assert_int_equal(op->conv.pad, want[i].pad);
    }
    int c[1024], h[1024];
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_segnet_shapes(net, 100, c, h, &err), TW_OK);
    const tw_seg_op *cat = op_named(net, "classifier.0 (concat)");
    assert_int_equal(cat->n_src, 5);
    assert_int_equal(c[cat->dst], 5 * 16);
    assert_int_equal(h[cat->dst], 13); /* output stride 8: 100 -> 50 -> 25 -> 13 */
    assert_int_equal(h[op_named(net, "classifier.0.convs.4.0")->dst], 1);
    assert_int_equal(h[net->out], 100);
    assert_int_equal(c[net->out], 5);
    tw_segnet_destroy(net);
    synth_free(&s);

    make_tv(&s, false, true, 3, 2);
    net = build_ok(&s, "fcn_resnet50");
    assert_int_equal(net->kind, TW_SEG_FCN);
    assert_int_equal(net->in_bands, 3);
    tw_segnet_destroy(net);
    synth_free(&s);
}

/* Every depth each layout names: the arch read off the blocks per stage. */
static void test_depths(void **state)
{
    (void)state;
    synth s;
    const struct {
        const int *blocks;
        int bottleneck;
        const char *arch;
    } unets[] = {{k_r18, 0, "unet_resnet18"},
                 {k_r34, 0, "unet_resnet34"},
                 {k_r50, 1, "unet_resnet50"},
                 {k_r101, 1, "unet_resnet101"}};
    for (size_t i = 0; i < sizeof unets / sizeof unets[0]; i++) {
        make_unet_enc(&s, unets[i].blocks, unets[i].bottleneck, 3, 2, 2, k_dec);
        tw_segnet *net = build_ok(&s, unets[i].arch);
        assert_string_equal(net->arch, unets[i].arch);
        tw_segnet_destroy(net);
        synth_free(&s);
    }
    make_tv_depth(&s, k_r101, true, false, 3, 2);
    tw_segnet *net = build_ok(&s, "deeplabv3_resnet101");
    /* layer3's 23 blocks: all but the first dilated by 2 */
    assert_int_equal(op_named(net, "backbone.layer3.22.conv2")->dil, 2);
    tw_segnet_destroy(net);
    synth_free(&s);
    make_tv_depth(&s, k_r101, false, true, 3, 2);
    net = build_ok(&s, "");
    assert_string_equal(net->arch, "fcn_resnet101");
    tw_segnet_destroy(net);
    synth_free(&s);
}

static void test_refusals(void **state)
{
    (void)state;
    synth s;
    make_unet(&s, 4, 8, 3);
    /* outside the layout's modules: named before anything is read */
    synth_add(&s, "decoder.center.0.0.weight", 4, (int64_t[]){8, 8, 3, 3}, 0, 1);
    expect_error(&s, "", TW_ERR_MODEL, 3, "'decoder.center.0.0.weight'", "foreign",
                 "synthetic.safetensors");
    synth_remove(&s, "decoder.center.0.0.weight");
    /* inside them but never read */
    synth_add(&s, "encoder.layer2.1.conv7.weight", 4, (int64_t[]){8, 8, 3, 3}, 0, 1);
    expect_error(&s, "", TW_ERR_MODEL, 2, "'encoder.layer2.1.conv7.weight'", "foreign");
    synth_remove(&s, "encoder.layer2.1.conv7.weight");
    /* a missing or misshapen tensor is named */
    synth_remove(&s, "decoder.blocks.2.conv2.1.running_var");
    expect_error(&s, "", TW_ERR_MODEL, 2, "'decoder.blocks.2.conv2.1.running_var'", "missing");
    synth_add(&s, "decoder.blocks.2.conv2.1.running_var", 1, (int64_t[]){16}, 0.5f, 1.5f);
    synth_reshape(&s, "decoder.blocks.1.conv1.0.weight", 4, (int64_t[]){16, 40, 3, 3});
    expect_error(&s, "", TW_ERR_MODEL, 2, "'decoder.blocks.1.conv1.0.weight'", "[16,48,3,3]");
    synth_free(&s);

    /* no segmentation layout at all: a classifier ResNet */
    assert_int_equal(synth_resnet(&s, k_r18, 0, 3, 8, 2, 3), 0);
    expect_error(&s, "", TW_ERR_MODEL, 2, "'conv1.weight'", "no segmentation layout");
    synth_free(&s);

    /* torchvision's dilated backbones are bottleneck ResNets */
    assert_int_equal(synth_resnet(&s, k_r18, 0, 3, 8, 2, 3), 0);
    prefix_all(&s, "backbone.");
    synth_conv_bn(&s, "classifier.0", "classifier.1", 8, 64, 3);
    synth_add(&s, "classifier.4.weight", 4, (int64_t[]){2, 8, 1, 1}, 0, 1);
    synth_add(&s, "classifier.4.bias", 1, (int64_t[]){2}, 0, 1);
    expect_error(&s, "", TW_ERR_MODEL, 2, "basic blocks", "bottleneck");
    synth_free(&s);

    /* a sixth ASPP branch is foreign */
    make_tv(&s, true, false, 4, 5);
    synth_conv_bn(&s, "classifier.0.convs.5.0", "classifier.0.convs.5.1", 16, 128, 3);
    expect_error(&s, "", TW_ERR_MODEL, 2, "'classifier.0.convs.5.0.weight'", "5 branches");
    synth_free(&s);
}

/* Probabilities sum to 1, a tile's bits do not depend on its batch, and the
 * arena does not grow with the batch. */
static void run_net(synth *s, int tile, int want_concat_copies, int want_res_copies)
{
    tw_segnet *net = build_ok(s, "");
    tw_error err;
    tw_error_init(&err);
    tw_seg_cpu *cpu = NULL;
    if (tw_seg_cpu_create(net, tile, &cpu, &err) != TW_OK) fail_msg("create: %s", err.msg);
    size_t b1, b3, a1, a3;
    assert_int_equal(tw_seg_cpu_batch_bytes(net, tile, 1, &b1, &a1, &err), TW_OK);
    assert_int_equal(tw_seg_cpu_batch_bytes(net, tile, 3, &b3, &a3, &err), TW_OK);
    size_t px = (size_t)tile * (size_t)tile;
    assert_true(a1 > 0 && a1 == a3);
    assert_int_equal(b3 - b1, 2 * px * (size_t)(net->in_bands + net->n_classes) * sizeof(float));
    assert_true(tw_seg_cpu_bytes(cpu) >= a1);
    int cc, rc;
    tw_seg_cpu_copies(cpu, &cc, &rc);
    assert_int_equal(cc, want_concat_copies);
    assert_int_equal(rc, want_res_copies);
    int n = 3;
    size_t nin = px * (size_t)net->in_bands, nout = px * (size_t)net->n_classes;
    float *in = malloc((size_t)n * nin * sizeof *in);
    float *out = malloc((size_t)n * nout * sizeof *out), *one = malloc(nout * sizeof *one);
    assert_non_null(in);
    assert_non_null(out);
    assert_non_null(one);
    for (size_t i = 0; i < (size_t)n * nin; i++) in[i] = sinf((float)i * 0.37f);
    for (size_t i = 0; i < (size_t)n * nout; i++) out[i] = NAN;
    assert_int_equal(tw_seg_cpu_run(cpu, in, n, out, &err), TW_OK);
    for (int t = 0; t < n; t++)
        for (size_t p = 0; p < px; p++) {
            double sum = 0;
            for (int k = 0; k < net->n_classes; k++) {
                float v = out[(size_t)t * nout + (size_t)k * px + p];
                assert_true(v >= 0.0f && v <= 1.0f);
                sum += v;
            }
            assert_true(fabs(sum - 1.0) < 1e-5);
        }
    for (int t = 0; t < n; t++) {
        assert_int_equal(tw_seg_cpu_run(cpu, in + (size_t)t * nin, 1, one, &err), TW_OK);
        assert_memory_equal(one, out + (size_t)t * nout, nout * sizeof *one);
    }
    /* the tiles differ, so the maps do too (nothing constant slipped through) */
    assert_true(memcmp(out, out + nout, nout * sizeof *out) != 0);
    free(in);
    free(out);
    free(one);
    tw_seg_cpu_destroy(cpu);
    tw_segnet_destroy(net);
}

static void test_cpu_unet(void **state)
{
    (void)state;
    synth s;
    make_unet(&s, 4, 8, 3);
    /* every skip written where its concat needs it, every shortcut summed in place */
    run_net(&s, 64, 0, 0);
    synth_free(&s);
    /* decoder widths no multiple of 16: blocks 1-3 copy both their inputs in */
    make_unet_dec(&s, 3, 8, 2, (const int[5]){24, 20, 12, 8, 8});
    run_net(&s, 32, 6, 0);
    synth_free(&s);
}

static void test_cpu_deeplab(void **state)
{
    (void)state;
    synth s;
    make_tv(&s, true, true, 4, 5);
    run_net(&s, 40, 0, 0);
    synth_free(&s);
    make_tv(&s, false, false, 2, 3);
    run_net(&s, 33, 0, 0);
    synth_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unet_graph), cmocka_unit_test(test_deeplab_graph),
        cmocka_unit_test(test_depths),     cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_cpu_unet),   cmocka_unit_test(test_cpu_deeplab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
