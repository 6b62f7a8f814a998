/* test_onnx.c - the ONNX reader's mapping (io/modelfile/onnx.c) against the same
 * weights in safetensors.
 *
 * Fixtures from tests/fixtures/fx_onnx.py: the ResNet-18 and ResNet-50 of
 * fx_models.py exported by torch.onnx.export (opsets 11 and 17, batch norm
 * folded by the exporter or kept as nodes, external data), the BN graph
 * rewritten as other converters write it (ReduceMean with axes as an
 * input, Reshape, MatMul + Add, Softmax, opset 18, Deepness metadata), and
 * graphs that must be refused naming a node or the file (those built from
 * a tiny ResNet-18 of fuzz/make_seeds.py: node names conv_N).
 *
 * What is compared: every folded convolution (weights and bias), fc.weight
 * and fc.bias of the tw_resnet built from the ONNX file against the one
 * built from the safetensors file. Where the graph keeps its
 * BatchNormalization nodes, io/modelfile/onnx.c folds them as model/resnet.c does:
 * the nets must be equal bit for bit. Where the exporter folded them (in
 * float32), within 1e-5 of the largest weight of each convolution.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/modelfile/model_file.h"
#include "core/alloc.h"
#include "model/resnet.h"
#include "testutil.h"

static tw_model_file *load_ok(const char *path)
{
    tw_model_file *mf = tw_test_load_model(path);
    assert_non_null(mf);
    return mf;
}

static tw_resnet *net_of(const tw_model_file *mf)
{
    tw_error err;
    tw_error_init(&err);
    tw_resnet *net = NULL;
    tw_status st = tw_resnet_create(mf, "", &net, &err);
    if (st != TW_OK) print_error("resnet %s: %s\n", mf->path, err.msg);
    assert_int_equal(st, TW_OK);
    return net;
}

/* max |a - b| / max |b| over n values (0 when b is all zero and a == b). */
static double rel_diff(const float *a, const float *b, size_t n)
{
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (e > d) d = e;
        if (fabs((double)b[i]) > m) m = fabs((double)b[i]);
    }
    return m > 0 ? d / m : d;
}

static void same_conv(const tw_conv *a, const tw_conv *b, double tol, const char *what)
{
    assert_int_equal(a->cin, b->cin);
    assert_int_equal(a->cout, b->cout);
    assert_int_equal(a->k, b->k);
    assert_int_equal(a->stride, b->stride);
    assert_int_equal(a->pad, b->pad);
    size_t nw = (size_t)a->cout * (size_t)a->cin * (size_t)a->k * (size_t)a->k;
    double dw = rel_diff(a->w, b->w, nw), db = rel_diff(a->b, b->b, (size_t)a->cout);
    if (tol == 0) {
        if (memcmp(a->w, b->w, nw * sizeof(float)) || memcmp(a->b, b->b, (size_t)a->cout * 4))
            print_error("%s: not bit-identical (weights %.3g, bias %.3g)\n", what, dw, db);
        assert_memory_equal(a->w, b->w, nw * sizeof(float));
        assert_memory_equal(a->b, b->b, (size_t)a->cout * sizeof(float));
    } else {
        if (dw > tol || db > tol) print_error("%s: weights %.3g bias %.3g\n", what, dw, db);
        assert_true(dw <= tol && db <= tol);
    }
}

/* The net of the ONNX file equals the net of the safetensors file. */
static void same_net(const char *onnx_name, const char *st_name, double tol)
{
    TW_NEED_FIXTURE(po, onnx_name);
    char pst[4096];
    snprintf(pst, sizeof pst, "%s", po);
    TW_NEED_FIXTURE(ps, st_name);
    tw_model_file *mo = load_ok(pst), *ms = load_ok(ps);
    assert_int_equal(mo->format, TW_MODEL_FORMAT_ONNX);
    tw_resnet *a = net_of(mo), *b = net_of(ms);
    assert_int_equal(a->depth, b->depth);
    assert_int_equal(a->bottleneck, b->bottleneck);
    assert_int_equal(a->n_blocks, b->n_blocks);
    assert_int_equal(a->n_classes, b->n_classes);
    assert_int_equal(a->feat_dim, b->feat_dim);
    same_conv(&a->stem, &b->stem, tol, "conv1");
    for (int i = 0; i < a->n_blocks; i++) {
        char w[64];
        snprintf(w, sizeof w, "%s block %d", onnx_name, i);
        assert_int_equal(a->blocks[i].has_down, b->blocks[i].has_down);
        same_conv(&a->blocks[i].c1, &b->blocks[i].c1, tol, w);
        same_conv(&a->blocks[i].c2, &b->blocks[i].c2, tol, w);
        if (a->bottleneck) same_conv(&a->blocks[i].c3, &b->blocks[i].c3, tol, w);
        if (a->blocks[i].has_down) same_conv(&a->blocks[i].down, &b->blocks[i].down, tol, w);
    }
    size_t nfc = (size_t)a->n_classes * (size_t)a->feat_dim;
    /* fc is never folded: its values are the state_dict's */
    assert_memory_equal(a->fc_w, b->fc_w, nfc * sizeof(float));
    assert_memory_equal(a->fc_b, b->fc_b, (size_t)a->n_classes * sizeof(float));
    tw_resnet_destroy(a);
    tw_resnet_destroy(b);
    tw_model_file_destroy(mo);
    tw_model_file_destroy(ms);
    assert_int_equal(tw_mem_current(TW_MEM_TAG_COUNT), 0);
}

static void test_bn_nodes_exact(void **state)
{
    (void)state;
    same_net("onnx_r18_o17_bn.onnx", "resnet18_6b_7c.safetensors", 0);
    same_net("onnx_r18_o11_bn.onnx", "resnet18_6b_7c.safetensors", 0);
    /* ReduceMean(axes input) + Reshape, MatMul by W^T + Add of a [1, K] bias, Softmax */
    same_net("onnx_r18_other.onnx", "resnet18_6b_7c.safetensors", 0);
}

static void test_exporter_folded(void **state)
{
    (void)state;
    same_net("onnx_r18_o11_fold.onnx", "resnet18_6b_7c.safetensors", 1e-5);
    same_net("onnx_r18_ext.onnx", "resnet18_6b_7c.safetensors", 1e-5);
    same_net("onnx_r50_o17.onnx", "onnx_r50.safetensors", 1e-5);
}

static void test_info(void **state)
{
    (void)state;
    TW_NEED_FIXTURE(p, "onnx_r18_other.onnx");
    tw_model_file *mf = load_ok(p);
    const tw_onnx_info *o = &mf->onnx;
    assert_int_equal(o->opset, 18);
    assert_string_equal(o->producer, "some-converter 2.0");
    assert_int_equal(o->n_bn, 20);
    assert_true(o->softmax);
    assert_string_equal(o->head, "ReduceMean, Reshape, MatMul, Add, Softmax");
    /* Deepness's metadata: what the bundle would carry */
    assert_int_equal(mf->n_classes, 7);
    assert_string_equal(mf->classes[0], "water");
    assert_string_equal(mf->classes[6], "shadow");
    assert_int_equal(mf->n_mean, 6);
    assert_int_equal(mf->n_std, 6);
    assert_true(mf->mean[0] == 0.31f && mf->std[5] == 0.078f);
    assert_true(mf->scale == 1.0 / 255.0); /* Deepness standardizes x / 255 */
    assert_int_equal(mf->tile, 64);
    assert_true(o->resolution == 3000.0);
    assert_string_equal(o->model_type, "Recognition");
    assert_string_equal(o->metadata,
                        "class_names, standardization_mean, standardization_std, tiles_size, "
                        "resolution");
    tw_model_file_destroy(mf);

    TW_NEED_FIXTURE(pf, "onnx_r18_o11_fold.onnx");
    mf = load_ok(pf);
    assert_int_equal(mf->onnx.opset, 11);
    assert_int_equal(mf->onnx.n_bn, 0);
    assert_false(mf->onnx.softmax);
    assert_int_equal(mf->onnx.input_size, 64);
    assert_int_equal(mf->tile, 64); /* the graph's fixed input size */
    assert_int_equal(mf->n_classes, 0);
    assert_true(isnan(mf->scale));
    tw_model_file_destroy(mf);

    /* external data: counted, and part of the model's identity */
    TW_NEED_FIXTURE(pe, "onnx_r18_ext.onnx");
    mf = load_ok(pe);
    assert_int_equal(mf->onnx.n_external, 42);
    assert_int_equal(strlen(mf->sha256), 64);
    tw_model_file_destroy(mf);
    assert_int_equal(tw_mem_current(TW_MEM_TAG_COUNT), 0);
}

/* From the fuzz seeds (fuzz/make_seeds.py): Deepness's class names as a
 * Python dict (what it reads with ast.literal_eval); weights among the
 * graph's inputs. */
static void test_seed_models(void **state)
{
    (void)state;
    const char *src = getenv("TW_SOURCE_DIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/fuzz/corpus/onnx", src ? src : TW_SOURCE_DIR);
    tw_model_file *mf = load_ok(tw_test_path(dir, "resnet18_pydict"));
    assert_int_equal(mf->n_classes, 4);
    assert_string_equal(mf->classes[0], "water");
    assert_string_equal(mf->classes[1], "it's");
    assert_string_equal(mf->onnx.metadata, "class_names");
    tw_model_file_destroy(mf);

    /* the weights listed among the graph's inputs too (IR < 4,
     * keep_initializers_as_inputs): still one image input */
    mf = load_ok(tw_test_path(dir, "resnet18_inits_as_inputs"));
    assert_int_equal(mf->onnx.opset, 9);
    assert_int_equal(mf->onnx.input_size, 32);
    assert_non_null(tw_model_file_find(mf, "layer4.1.conv2.weight"));
    tw_model_file_destroy(mf);
    assert_int_equal(tw_mem_current(TW_MEM_TAG_COUNT), 0);
}

static void expect_refused(const char *name, const char *what)
{
    TW_NEED_FIXTURE(p, name);
    tw_error err;
    tw_error_init(&err);
    tw_model_file *mf = NULL;
    tw_status st = tw_model_file_load(p, &mf, &err);
    if (st == TW_OK || !strstr(err.msg, what) || !strstr(err.msg, name))
        print_error("%s: status %d, message '%s' (expected '%s')\n", name, (int)st, err.msg, what);
    assert_int_equal(st, TW_ERR_MODEL);
    assert_null(mf);
    assert_non_null(strstr(err.msg, name));
    assert_non_null(strstr(err.msg, what));
    assert_null(strchr(err.msg, '\n'));
    assert_int_equal(tw_mem_current(TW_MEM_TAG_COUNT), 0);
}

static void test_refused(void **state)
{
    (void)state;
    expect_refused("onnx_mobilenet_v2.onnx",
                   "node '/features/features.0/features.0.2/Clip' (Clip) is not part of a ResNet");
    expect_refused("onnx_bad_truncated.onnx", "not an ONNX model (truncated or corrupt");
    /* group 32 on a 3x3 whose weights take all the channels: the graph and
     * its weights disagree (a basic block is never grouped either) */
    expect_refused("onnx_bad_group.onnx", "node 'conv_14' (Conv) has group 32 for 2 outputs");
    expect_refused("onnx_bad_stride.onnx", "node 'conv_16' (Conv) is a 3x3 stride-2 convolution");
    expect_refused("onnx_bad_ext_escape.onnx", "is outside the model's folder");
    expect_refused("onnx_bad_ext_short.onnx",
                   "onnx_bad_ext_short.data holds 7832 bytes, the tensor needs");
}

/* The family from a graph: a small-patch stem (3x3 stride-1 conv1, no
 * max-pool) and a headless backbone (the graph ends at the pooled
 * features) load as model/resnet.c builds them from safetensors. */
static void test_family_graphs(void **state)
{
    (void)state;
    TW_NEED_FIXTURE(small, "onnx_small_stem.onnx");
    tw_model_file *mf = load_ok(small);
    tw_resnet *net = net_of(mf);
    assert_int_equal(net->stem_kind, TW_STEM_SMALL);
    assert_int_equal(net->stem.k, 3);
    assert_int_equal(net->stem.stride, 1);
    assert_false(net->headless);
    tw_resnet_destroy(net);
    tw_model_file_destroy(mf);
    TW_NEED_FIXTURE(headless, "onnx_headless.onnx");
    mf = load_ok(headless);
    assert_null(tw_model_file_find(mf, "fc.weight"));
    net = net_of(mf);
    assert_true(net->headless);
    assert_int_equal(net->stem_kind, TW_STEM_STANDARD);
    tw_resnet_destroy(net);
    tw_model_file_destroy(mf);
    assert_int_equal(tw_mem_current(TW_MEM_TAG_COUNT), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bn_nodes_exact), cmocka_unit_test(test_exporter_folded),
        cmocka_unit_test(test_info),           cmocka_unit_test(test_refused),
        cmocka_unit_test(test_seed_models),    cmocka_unit_test(test_family_graphs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
