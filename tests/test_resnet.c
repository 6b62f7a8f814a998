/* test_resnet.c - the ResNet graph: depth inference, BN folding, error
 * messages for inconsistent weights, the walk every backend plans from, and
 * the C reference forward pass against PyTorch (fixtures from
 * tests/fixtures/fx_models.py). */
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
#include "model/backend.h"
#include "model/resnet.h"
#include "core/alloc.h"
#include "tests/synth_resnet.h"
#include "tests/testutil.h"

static const int k_r18[4] = {2, 2, 2, 2}, k_r34[4] = {3, 4, 6, 3}, k_r101[4] = {3, 4, 23, 3},
                 k_r152[4] = {3, 8, 36, 3};

/* Create from s and expect failure with status st and a message containing
 * every one of the given fragments. */
static void expect_error(synth *s, const char *arch, tw_status st, int n, ...)
{
    tw_error err;
    tw_error_init(&err);
    tw_resnet *net = (tw_resnet *)1;
    size_t before = tw_mem_current(TW_MEM_WEIGHTS);
    tw_status got = tw_resnet_create(&s->mf, arch, &net, &err);
    assert_int_equal(got, st);
    assert_null(net);
    /* a failed build gives back everything it took */
    assert_int_equal(tw_mem_current(TW_MEM_WEIGHTS), before);
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) {
        const char *frag = va_arg(ap, const char *);
        if (!strstr(err.msg, frag)) fail_msg("message '%s' lacks '%s'", err.msg, frag);
    }
    va_end(ap);
}

static void test_depth_inference(void **state)
{
    (void)state;
    static const struct {
        const int *blocks;
        int bottleneck, depth;
    } cases[] = {
        {k_r18, 0, 18}, {k_r34, 0, 34}, {k_r34, 1, 50}, {k_r101, 1, 101}, {k_r152, 1, 152}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        synth s;
        assert_int_equal(synth_resnet(&s, cases[i].blocks, cases[i].bottleneck, 5, 4, 3, 1 + i), 0);
        tw_error err;
        tw_error_init(&err);
        tw_resnet *net = NULL;
        char arch[16];
        snprintf(arch, sizeof arch, "resnet%d", cases[i].depth);
        /* inferred from the names alone, and again with the matching arch */
        for (int with_arch = 0; with_arch < 2; with_arch++) {
            assert_int_equal(tw_resnet_create(&s.mf, with_arch ? arch : "", &net, &err), TW_OK);
            assert_int_equal(net->depth, cases[i].depth);
            assert_int_equal(net->bottleneck, cases[i].bottleneck);
            assert_memory_equal(net->stage_blocks, cases[i].blocks, 4 * sizeof(int));
            assert_int_equal(net->n_blocks, cases[i].blocks[0] + cases[i].blocks[1] +
                                                cases[i].blocks[2] + cases[i].blocks[3]);
            assert_int_equal(net->in_bands, 5);
            assert_int_equal(net->n_classes, 3);
            assert_int_equal(net->feat_dim, cases[i].bottleneck ? 4 * 4 * 8 : 4 * 8);
            /* projections only where torchvision has them: first block of each stage
             * (layer1.0 only for bottlenecks, whose width grows 4x) */
            assert_int_equal(net->blocks[0].has_down, cases[i].bottleneck);
            assert_true(net->blocks[cases[i].blocks[0]].has_down);
            assert_false(net->blocks[1].has_down);
            tw_resnet_destroy(net);
        }
        synth_free(&s);
    }
}

static void test_unknown_layout(void **state)
{
    (void)state;
    synth s;
    assert_int_equal(synth_resnet(&s, k_r18, 0, 3, 4, 2, 5), 0);
    synth_remove(&s, "layer4.1.conv1.weight");
    expect_error(&s, "", TW_ERR_MODEL, 3, "synthetic.safetensors", "[2,2,2,1]", "match no ResNet");
    synth_free(&s);
}

static void test_strides_and_fold(void **state)
{
    (void)state;
    synth s;
    assert_int_equal(synth_resnet(&s, k_r34, 1, 4, 8, 6, 42), 0);
    tw_error err;
    tw_error_init(&err);
    tw_resnet *net = NULL;
    assert_int_equal(tw_resnet_create(&s.mf, "resnet50", &net, &err), TW_OK);

    /* torchvision v1.5: the stride sits on the 3x3 conv2 of a bottleneck */
    const tw_block *b = &net->blocks[3]; /* layer2.0 */
    assert_int_equal(b->c1.stride, 1);
    assert_int_equal(b->c1.k, 1);
    assert_int_equal(b->c2.stride, 2);
    assert_int_equal(b->c2.pad, 1);
    assert_int_equal(b->c3.stride, 1);
    assert_true(b->has_down);
    assert_int_equal(b->down.stride, 2);
    assert_int_equal(b->down.cin, 32);
    assert_int_equal(b->down.cout, 64);
    assert_int_equal(net->stem.stride, 2);
    assert_int_equal(net->stem.pad, 3);

    /* the fold, recomputed here in double from the raw tensors */
    struct {
        const char *conv, *bn;
        const tw_conv *c;
    } chk[] = {{"conv1", "bn1", &net->stem},
               {"layer2.0.downsample.0", "layer2.0.downsample.1", &b->down},
               {"layer4.2.conv3", "layer4.2.bn3", &net->blocks[15].c3}};
    for (size_t i = 0; i < 3; i++) {
        char n[160];
        snprintf(n, sizeof n, "%s.weight", chk[i].conv);
        const tw_tensor *w = synth_find(&s, n);
        const tw_tensor *bn[4];
        const char *field[4] = {"weight", "bias", "running_mean", "running_var"};
        for (int j = 0; j < 4; j++) {
            snprintf(n, sizeof n, "%s.%s", chk[i].bn, field[j]);
            bn[j] = synth_find(&s, n);
            assert_non_null(bn[j]);
        }
        int cout = (int)w->shape[0];
        size_t per = (size_t)(w->numel / cout);
        assert_int_equal(chk[i].c->cout, cout);
        for (int o = 0; o < cout; o++) {
            double g = bn[0]->data[o] / sqrt((double)bn[3]->data[o] + 1e-5);
            double bias = bn[1]->data[o] - bn[2]->data[o] * g;
            assert_true(fabs(chk[i].c->b[o] - bias) <= 1e-6 * (1 + fabs(bias)));
            for (size_t j = 0; j < per; j++) {
                double ref = w->data[o * per + j] * g;
                if (fabs(chk[i].c->w[o * per + j] - ref) > 1e-6 * (1 + fabs(ref)))
                    fail_msg("%s folded weight %d/%zu: %g vs %g", chk[i].conv, o, j,
                             (double)chk[i].c->w[o * per + j], ref);
            }
        }
    }
    /* every conv + bias + fc counted once */
    size_t want = 0;
    for (int i = 0; i < s.mf.n_tensors; i++) {
        const tw_tensor *t = &s.mf.tensors[i];
        if (t->ndim == 4) want += (size_t)t->numel + (size_t)t->shape[0]; /* w + folded bias */
        if (strncmp(t->name, "fc.", 3) == 0) want += (size_t)t->numel;
    }
    assert_int_equal(net->weight_bytes, want * sizeof(float));
    tw_resnet_destroy(net);
    synth_free(&s);
}

static void test_arch_mismatch(void **state)
{
    (void)state;
    synth s;
    assert_int_equal(synth_resnet(&s, k_r34, 1, 3, 4, 2, 7), 0);
    expect_error(&s, "resnet18", TW_ERR_MODEL, 2, "synthetic.safetensors",
                 "weights are resnet50 but model.arch says resnet18");
    expect_error(&s, "resnet19", TW_ERR_MODEL, 1, "'resnet19'");
    synth_free(&s);
    assert_int_equal(synth_resnet(&s, k_r34, 0, 3, 4, 2, 7), 0);
    expect_error(&s, "resnet50", TW_ERR_MODEL, 1,
                 "weights are resnet34 but model.arch says resnet50");
    synth_free(&s);
}

/* The torchvision family from the shapes alone (model/resnet.h), at
 * torchvision's own widths: names, groups, base width, the stem; a declared
 * arch or stem that disagrees is refused naming both. */
static void test_family(void **state)
{
    (void)state;
    static const struct {
        synth_family fam;
        int bottleneck;
        const int *blocks;
        const char *arch, *family;
        int groups, base_width;
    } cases[] = {
        {{32, 2, 0}, 1, k_r34, "resnext50_32x4d", "resnext", 32, 4},
        {{32, 4, 0}, 1, k_r101, "resnext101_32x8d", "resnext", 32, 8},
        {{64, 4, 0}, 1, k_r101, "resnext101_64x4d", "resnext", 64, 4},
        {{0, 2, 0}, 1, k_r34, "wide_resnet50_2", "wide_resnet", 1, 128},
        {{0, 0, 1}, 0, k_r18, "resnet18", "resnet", 1, 64},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        synth s;
        /* conv2 of 64 planes: 64 x mid_mult wide in `groups` groups */
        assert_int_equal(synth_resnet_ex(&s, cases[i].blocks, cases[i].bottleneck, 3, 64, 5, 11 + i,
                                         cases[i].fam),
                         0);
        tw_error err;
        tw_error_init(&err);
        tw_resnet *net = NULL;
        if (tw_resnet_create(&s.mf, cases[i].arch, &net, &err) != TW_OK) fail_msg("%s", err.msg);
        char name[32];
        tw_resnet_arch_name(net, name, sizeof name);
        assert_string_equal(name, cases[i].arch);
        assert_string_equal(tw_resnet_family_name(net->family), cases[i].family);
        assert_int_equal(net->groups, cases[i].groups);
        assert_int_equal(net->base_width, cases[i].base_width);
        assert_int_equal(net->blocks[0].c2.groups, cases[i].groups);
        assert_int_equal(net->stem_kind, cases[i].fam.small ? TW_STEM_SMALL : TW_STEM_STANDARD);
        assert_int_equal(net->stem.k, cases[i].fam.small ? 3 : 7);
        assert_int_equal(net->stem.stride, cases[i].fam.small ? 1 : 2);
        tw_resnet_destroy(net);
        char want[96];
        snprintf(want, sizeof want, "weights are %s but model.arch says resnet50", cases[i].arch);
        if (strcmp(cases[i].arch, "resnet50") != 0)
            expect_error(&s, "resnet50", TW_ERR_MODEL, 1, want);
        /* the file's own stem metadata must agree with conv1 */
        s.mf.stem = cases[i].fam.small ? TW_STEM_STANDARD : TW_STEM_SMALL;
        expect_error(&s, "", TW_ERR_MODEL, 2, "its metadata 'stem' says",
                     cases[i].fam.small ? "conv1 is 3x3 stride 1, a small stem"
                                        : "conv1 is 7x7 stride 2, a standard stem");
        s.mf.stem = TW_STEM_AUTO;
        synth_free(&s);
    }
    /* groups that differ between blocks name the block */
    synth s;
    assert_int_equal(synth_resnet_ex(&s, k_r34, 1, 3, 8, 2, 5, (synth_family){4, 2, 0}), 0);
    synth_reshape(&s, "layer2.1.conv2.weight", 4, (const int64_t[]){32, 16, 3, 3});
    expect_error(&s, "", TW_ERR_MODEL, 2, "layer2.1.conv2.weight' implies 2 groups",
                 "layer1.0.conv2 has 4");
    synth_free(&s);
}

static void test_missing_tensors(void **state)
{
    (void)state;
    static const char *names[] = {
        "layer3.1.bn2.running_var",     "fc.bias",     "fc.weight", "bn1.bias",
        "layer2.0.downsample.0.weight", "conv1.weight"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        synth s;
        assert_int_equal(synth_resnet(&s, k_r18, 0, 6, 8, 4, 9), 0);
        synth_remove(&s, names[i]);
        char frag[160];
        snprintf(frag, sizeof frag, "'%s' is missing", names[i]);
        expect_error(&s, "", TW_ERR_MODEL, 2, "synthetic.safetensors", frag);
        synth_free(&s);
    }
}

static void test_wrong_shapes(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        int ndim;
        int64_t shape[4];
        const char *msg;
    } cases[] = {
        {"layer1.0.conv2.weight", 4, {8, 4, 3, 3}, "has shape [8,4,3,3], expected [8,8,3,3]"},
        {"layer3.0.conv1.weight", 4, {32, 16, 1, 1}, "has shape [32,16,1,1], expected [32,16,3,3]"},
        {"fc.weight", 2, {4, 100}, "has shape [4,100], expected [4,64]"},
        {"fc.bias", 1, {5}, "'fc.bias' has shape [5], expected [4]"},
        {"layer1.1.bn1.weight", 1, {5}, "has shape [5], expected [8]"},
        {"conv1.weight", 3, {8, 6, 7}, "has shape [8,6,7], expected"},
        /* (3x3 is the small stem's conv1: test_small_stem) */
        {"conv1.weight", 4, {8, 6, 5, 5}, "has shape [8,6,5,5], expected [8,6,7,7]"},
        {"layer2.0.downsample.0.weight",
         4,
         {16, 8, 3, 3},
         "has shape [16,8,3,3], expected [16,8,1,1]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        synth s;
        assert_int_equal(synth_resnet(&s, k_r18, 0, 6, 8, 4, 11), 0);
        synth_reshape(&s, cases[i].name, cases[i].ndim, cases[i].shape);
        expect_error(&s, "", TW_ERR_MODEL, 3, "synthetic.safetensors", cases[i].name, cases[i].msg);
        synth_free(&s);
    }
}

static void test_bad_values(void **state)
{
    (void)state;
    synth s;
    assert_int_equal(synth_resnet(&s, k_r18, 0, 6, 8, 4, 13), 0);
    synth_find(&s, "layer2.1.bn2.running_var")->data[3] = -2.0f;
    expect_error(&s, "", TW_ERR_MODEL, 2, "'layer2.1.bn2.running_var'", "index 3");
    synth_find(&s, "layer2.1.bn2.running_var")->data[3] = NAN;
    expect_error(&s, "", TW_ERR_MODEL, 1, "'layer2.1.bn2.running_var'");
    synth_free(&s);
}

/* ---- reference forward vs PyTorch ---- */

/* ---- tw_resnet_walk ---- */

enum { MAX_OPS = 256 };

typedef struct walk_log {
    tw_resnet_op ops[MAX_OPS];
    int n;
    int stop_at; /* fail at this op (-1: never) */
} walk_log;

static tw_status log_op(void *user, const tw_resnet_op *op, tw_error *err)
{
    walk_log *l = user;
    if (l->n < MAX_OPS) l->ops[l->n] = *op;
    if (l->n++ == l->stop_at) return tw_error_set(err, TW_ERR_INTERNAL, "stopped at %s", op->name);
    return TW_OK;
}

static void expect_op(const walk_log *l, int i, tw_resnet_op_kind kind, const char *name,
                      const tw_conv *conv)
{
    if (i >= l->n) fail_msg("op %d (%s): the walk stopped after %d ops", i, name, l->n);
    const tw_resnet_op *op = &l->ops[i];
    if (op->kind != kind || strcmp(op->name, name) != 0 || op->conv != conv)
        fail_msg("op %d: kind %d '%s', expected kind %d '%s' (or another conv)", i, op->kind,
                 op->name, kind, name);
}

/* The walk of a synthetic net against what its tensors say, in the order
 * the CPU plan needs (a block's projection first); then its dataflow: each
 * op reads the value last written, of the shape it says, and in the three
 * buffers no op overwrites a value a later op still reads. */
static void check_walk(const int blocks[4], int bottleneck, int tile, int last_h)
{
    synth s;
    assert_int_equal(synth_resnet(&s, blocks, bottleneck, 3, 8, 4, 21), 0);
    tw_error err;
    tw_error_init(&err);
    tw_resnet *net = NULL;
    assert_int_equal(tw_resnet_create(&s.mf, "", &net, &err), TW_OK);
    walk_log *l = calloc(1, sizeof *l);
    assert_non_null(l);
    l->stop_at = -1;
    assert_int_equal(tw_resnet_walk(net, tile, log_op, l, &err), TW_OK);

    int i = 0, bi = 0;
    expect_op(l, i++, TW_RESNET_OP_STEM, "conv1", &net->stem);
    expect_op(l, i++, TW_RESNET_OP_MAXPOOL, "maxpool", NULL);
    for (int st = 0; st < 4; st++)
        for (int k = 0; k < blocks[st]; k++, bi++) {
            const tw_block *b = &net->blocks[bi];
            char n[96];
            snprintf(n, sizeof n, "layer%d.%d.downsample.0.weight", st + 1, k);
            if (synth_find(&s, n)) {
                n[strlen(n) - strlen(".weight")] = '\0';
                expect_op(l, i++, TW_RESNET_OP_SHORTCUT, n, &b->down);
            }
            snprintf(n, sizeof n, "layer%d.%d.conv1", st + 1, k);
            expect_op(l, i++, TW_RESNET_OP_CONV, n, &b->c1);
            snprintf(n, sizeof n, "layer%d.%d.conv2", st + 1, k);
            expect_op(l, i++, bottleneck ? TW_RESNET_OP_CONV : TW_RESNET_OP_RESIDUAL, n, &b->c2);
            if (bottleneck) {
                snprintf(n, sizeof n, "layer%d.%d.conv3", st + 1, k);
                expect_op(l, i++, TW_RESNET_OP_RESIDUAL, n, &b->c3);
            }
        }
    expect_op(l, i++, TW_RESNET_OP_AVGPOOL, "avgpool", NULL);
    expect_op(l, i++, TW_RESNET_OP_FC, "fc", NULL);
    assert_int_equal(l->n, i);

    int c[TW_RESNET_VAL_COUNT], h[TW_RESNET_VAL_COUNT], where[TW_RESNET_VAL_COUNT];
    int held[3] = {-1, -1, -1};
    bool have[TW_RESNET_VAL_COUNT] = {false};
    have[TW_RESNET_VAL_IN] = true;
    c[TW_RESNET_VAL_IN] = net->in_bands;
    h[TW_RESNET_VAL_IN] = tile;
    where[TW_RESNET_VAL_IN] = -1;
    for (int j = 0; j < l->n; j++) {
        const tw_resnet_op *op = &l->ops[j];
        const char *nm = op->name;
        if (!have[op->src] || c[op->src] != op->c_in || h[op->src] != op->h_in)
            fail_msg("%s reads value %d as %dx%d", nm, op->src, op->c_in, op->h_in);
        if (op->buf_src != where[op->src] || (op->buf_src >= 0 && held[op->buf_src] != op->src))
            fail_msg("%s reads buffer %d, which no longer holds value %d", nm, op->buf_src,
                     op->src);
        if (op->conv) {
            const tw_conv *cv = op->conv;
            assert_int_equal(op->c_in, cv->cin);
            assert_int_equal(op->c_out, cv->cout);
            assert_int_equal(op->h_out, (op->h_in + 2 * cv->pad - cv->k) / cv->stride + 1);
            assert_int_equal(op->relu, op->kind != TW_RESNET_OP_SHORTCUT);
        }
        if ((op->kind == TW_RESNET_OP_RESIDUAL) != (op->add != TW_RESNET_VAL_NONE))
            fail_msg("%s: add %d", nm, op->add);
        if (op->add != TW_RESNET_VAL_NONE) {
            if (!have[op->add] || c[op->add] != op->c_out || h[op->add] != op->h_out)
                fail_msg("%s adds value %d of another shape", nm, op->add);
            if (op->buf_add != where[op->add] || held[op->buf_add] != op->add)
                fail_msg("%s adds buffer %d, which no longer holds value %d", nm, op->buf_add,
                         op->add);
            assert_int_equal(op->add,
                             net->blocks[op->block].has_down ? TW_RESNET_VAL_SC : TW_RESNET_VAL_X);
        } else {
            assert_int_equal(op->buf_add, -1);
        }
        bool outside = op->dst == TW_RESNET_VAL_FEAT || op->dst == TW_RESNET_VAL_PROBS;
        if (outside) {
            assert_int_equal(op->buf_dst, -1);
        } else {
            if (op->buf_dst < 0 || op->buf_dst > 2 || op->buf_dst == op->buf_src ||
                op->buf_dst == op->buf_add)
                fail_msg("%s writes buffer %d (reads %d, adds %d)", nm, op->buf_dst, op->buf_src,
                         op->buf_add);
            held[op->buf_dst] = op->dst;
        }
        where[op->dst] = op->buf_dst;
        have[op->dst] = true;
        c[op->dst] = op->c_out;
        h[op->dst] = op->h_out;
    }
    const tw_resnet_op *avg = &l->ops[l->n - 2], *fc = &l->ops[l->n - 1];
    assert_int_equal(avg->c_in, net->feat_dim);
    assert_int_equal(avg->h_in, last_h);
    assert_int_equal(fc->c_in, net->feat_dim);
    assert_int_equal(fc->c_out, net->n_classes);

    /* a visitor's failure stops the walk and is its result */
    memset(l, 0, sizeof *l);
    l->stop_at = 3;
    tw_error_init(&err);
    assert_int_equal(tw_resnet_walk(net, tile, log_op, l, &err), TW_ERR_INTERNAL);
    assert_int_equal(l->n, 4);
    assert_non_null(strstr(err.msg, l->ops[3].name));
    free(l);
    tw_resnet_destroy(net);
    synth_free(&s);
}

static void test_walk(void **state)
{
    (void)state;
    check_walk(k_r18, 0, 64, 2);  /* basic blocks, projections in stages 2-4 */
    check_walk(k_r34, 1, 64, 2);  /* ResNet-50: a projection in every stage */
    check_walk(k_r34, 0, 224, 7); /* ResNet-34 at ImageNet's size */
}

static int argmax(const float *p, int k)
{
    int best = 0;
    for (int j = 1; j < k; j++)
        if (p[j] > p[best]) best = j;
    return best;
}

static void check_vs_pytorch(const char *model, const char *arch, const char *tag, int depth)
{
    const char *fx = tw_test_fixtures();
    if (!fx || !tw_test_file_exists(tw_test_path(fx, model)) ||
        !tw_test_file_exists(tw_test_path(fx, "tiles_64.f32")))
        skip();
    char name[128];
    float *x, *ref_p, *ref_e;
    assert_int_equal(tw_test_read_f32(tw_test_path(fx, "tiles_64.f32"), &x), 8 * 6 * 64 * 64);
    snprintf(name, sizeof name, "ref_%s_probs.f32", tag);
    long np = tw_test_read_f32(tw_test_path(fx, name), &ref_p);
    snprintf(name, sizeof name, "ref_%s_emb.f32", tag);
    long ne = tw_test_read_f32(tw_test_path(fx, name), &ref_e);
    assert_true(np > 0 && ne > 0);

    tw_error err;
    tw_error_init(&err);
    tw_model_file *mf = NULL;
    tw_resnet *net = NULL;
    if (tw_model_file_load(tw_test_path(fx, model), &mf, &err) != TW_OK) fail_msg("%s", err.msg);
    if (tw_resnet_create(mf, arch, &net, &err) != TW_OK) fail_msg("%s", err.msg);
    tw_model_file_destroy(mf);
    assert_int_equal(net->depth, depth);
    assert_int_equal(net->in_bands, 6);
    assert_int_equal(np, 8 * net->n_classes);
    assert_int_equal(ne, 8 * net->feat_dim);

    int k = net->n_classes, fd = net->feat_dim;
    float *p = malloc((size_t)8 * k * sizeof(float)), *e = malloc((size_t)8 * fd * sizeof(float));
    assert_int_equal(tw_resnet_forward_ref(net, x, 8, 64, p, e, &err), TW_OK);
    double dp = 0, de = 0, emax = 0;
    for (int i = 0; i < 8 * k; i++) dp = fmax(dp, fabs(p[i] - ref_p[i]));
    for (int i = 0; i < 8 * fd; i++) {
        de = fmax(de, fabs(e[i] - ref_e[i]));
        emax = fmax(emax, fabs(ref_e[i]));
    }
    print_message("%s reference forward vs PyTorch: max |dp| = %.3g, max |de| / max |e| = %.3g\n",
                  model, dp, de / emax);
    assert_true(dp <= 1e-4);
    assert_true(de <= 1e-4 * emax);
    for (int t = 0; t < 8; t++) assert_int_equal(argmax(p + t * k, k), argmax(ref_p + t * k, k));
    /* the tiles' features differ, or agreeing on them would mean little (the
     * ResNet-50 fixture's probabilities are saturated, so its embeddings carry
     * the comparison) */
    double spread = 0;
    for (int t = 1; t < 8; t++)
        for (int c = 0; c < fd; c++) spread = fmax(spread, fabs(ref_e[t * fd + c] - ref_e[c]));
    assert_true(spread > 1e-2 * emax);
    free(p);
    free(e);
    free(x);
    free(ref_p);
    free(ref_e);
    tw_resnet_destroy(net);
}

static void test_ref_resnet18_safetensors(void **state)
{
    (void)state;
    check_vs_pytorch("resnet18_6b_7c.safetensors", "", "resnet18", 18);
}

static void test_ref_resnet18_bundle(void **state)
{
    (void)state;
    check_vs_pytorch("resnet18_6b_7c.h5", "resnet18", "resnet18", 18);
}

static void test_ref_resnet50(void **state)
{
    (void)state;
    check_vs_pytorch("resnet50_6b_5c.safetensors", "resnet50", "resnet50", 50);
}

static void test_ref_tiny_tile(void **state)
{
    (void)state;
    synth s;
    assert_int_equal(synth_resnet(&s, k_r18, 0, 2, 4, 2, 3), 0);
    tw_error err;
    tw_error_init(&err);
    tw_resnet *net = NULL;
    assert_int_equal(tw_resnet_create(&s.mf, "", &net, &err), TW_OK);
    float x[2] = {0}, p[2];
    /* a 1x1 tile still has a defined output (every stage shrinks to 1x1) */
    assert_int_equal(tw_resnet_forward_ref(net, x, 1, 1, p, NULL, &err), TW_OK);
    assert_true(fabs(p[0] + p[1] - 1.0) < 1e-6);
    assert_int_equal(tw_resnet_forward_ref(net, x, 1, 0, p, NULL, &err), TW_ERR_INPUT);
    assert_non_null(strstr(err.msg, "tile size 0"));
    tw_resnet_destroy(net);
    synth_free(&s);
}

/* A headless backbone (no fc at all) loads with a stand-in one-class head
 * (probability 1) and the same features as the headed model it came from;
 * only one of fc.weight/fc.bias is a damaged file, named. */
static void test_headless(void **state)
{
    (void)state;
    synth s;
    assert_int_equal(synth_resnet(&s, k_r18, 0, 3, 8, 4, 7), 0);
    tw_error err;
    tw_error_init(&err);
    tw_resnet *headed = NULL, *headless = NULL;
    assert_int_equal(tw_resnet_create(&s.mf, "", &headed, &err), TW_OK);
    assert_false(headed->headless);
    synth_remove(&s, "fc.weight");
    synth_remove(&s, "fc.bias");
    assert_int_equal(tw_resnet_create(&s.mf, "", &headless, &err), TW_OK);
    assert_true(headless->headless);
    assert_int_equal(headless->n_classes, 1);
    assert_int_equal(headless->feat_dim, 64);
    enum { N = 2, TS = 32 };
    float *x = calloc((size_t)N * 3 * TS * TS, sizeof(float));
    float *e1 = calloc((size_t)N * 64, sizeof(float)), *e2 = calloc((size_t)N * 64, sizeof(float));
    float p1[N * 4], p2[N];
    assert_non_null(x);
    for (int i = 0; i < N * 3 * TS * TS; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    assert_int_equal(tw_resnet_forward_ref(headed, x, N, TS, p1, e1, &err), TW_OK);
    assert_int_equal(tw_resnet_forward_ref(headless, x, N, TS, p2, e2, &err), TW_OK);
    assert_memory_equal(e1, e2, sizeof(float) * N * 64);
    for (int i = 0; i < N; i++) assert_true(p2[i] == 1.0f);
    tw_resnet_destroy(headed);
    tw_resnet_destroy(headless);
    free(x);
    free(e1);
    free(e2);
    synth_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_headless),
        cmocka_unit_test(test_family),
        cmocka_unit_test(test_depth_inference),
        cmocka_unit_test(test_unknown_layout),
        cmocka_unit_test(test_strides_and_fold),
        cmocka_unit_test(test_arch_mismatch),
        cmocka_unit_test(test_missing_tensors),
        cmocka_unit_test(test_wrong_shapes),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_walk),
        cmocka_unit_test(test_ref_tiny_tile),
        cmocka_unit_test(test_ref_resnet18_safetensors),
        cmocka_unit_test(test_ref_resnet18_bundle),
        cmocka_unit_test(test_ref_resnet50),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
