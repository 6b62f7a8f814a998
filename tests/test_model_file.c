/* test_model_file.c - model-file readers against what PyTorch/h5py/hashlib wrote.
 *
 * References come from tests/fixtures/fx_models.py: a per-tensor listing
 * (shape, float64 sum, first and last value) of the state_dict, conv1 as
 * float32 and as PyTorch/numpy rounded it to F16/BF16, hashlib digests, and
 * a set of hostile files that must each fail with a message naming them.
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
#include "testutil.h"

static tw_model_file *load_ok(const char *path)
{
    tw_model_file *mf = tw_test_load_model(path);
    assert_non_null(mf);
    return mf;
}

/* Compare every tensor with the listing written by the fixture script. tol is
 * the relative error allowed on values (0: exact). */
static void check_listing(const tw_model_file *mf, const char *listing, double tol)
{
    FILE *f = fopen(listing, "r");
    assert_non_null(f);
    char name[160];
    int ndim, lines = 0;
    long long d[4];
    double sum, first, last;
    while (fscanf(f, "%159s %d %lld %lld %lld %lld %lf %lf %lf", name, &ndim, &d[0], &d[1], &d[2],
                  &d[3], &sum, &first, &last) == 9) {
        lines++;
        const tw_tensor *t = tw_model_file_find(mf, name);
        if (!t) print_error("tensor %s missing\n", name);
        assert_non_null(t);
        assert_int_equal(t->ndim, ndim);
        int64_t numel = 1;
        for (int i = 0; i < ndim; i++) {
            assert_int_equal(t->shape[i], d[i]);
            numel *= d[i];
        }
        assert_int_equal(t->numel, numel);
        double s = 0, abs_sum = 0;
        for (int64_t i = 0; i < t->numel; i++) {
            s += t->data[i];
            abs_sum += fabs(t->data[i]);
        }
        if (tol == 0) {
            assert_true(t->data[0] == (float)first);
            assert_true(t->data[t->numel - 1] == (float)last);
            /* float64 sums of identical values differ only by summation order */
            assert_true(fabs(s - sum) <= 1e-9 * (abs_sum + 1));
        } else {
            assert_true(fabs(t->data[0] - first) <= tol * fabs(first) + 1e-7);
            assert_true(fabs(s - sum) <= tol * abs_sum + 1e-6);
        }
    }
    fclose(f);
    assert_int_equal(lines, mf->n_tensors);
}

static void test_safetensors_f32(void **state)
{
    (void)state;
    TW_NEED_FIXTURE(path, "resnet18_6b_7c.safetensors");
    size_t before = tw_mem_current(TW_MEM_WEIGHTS);
    tw_model_file *mf = load_ok(path);
    assert_int_equal(mf->n_tensors, 102);
    /* all tensor data lives under the weights tag */
    int64_t numel = 0;
    for (int i = 0; i < mf->n_tensors; i++) numel += mf->tensors[i].numel;
    assert_true(tw_mem_current(TW_MEM_WEIGHTS) - before >= (size_t)numel * sizeof(float));
    check_listing(mf, tw_test_fixture("resnet18_6b_7c_tensors.txt"), 0);

    float *ref = NULL;
    long n = tw_test_read_f32(tw_test_fixture("resnet18_6b_7c_conv1.f32"), &ref);
    const tw_tensor *conv1 = tw_model_file_find(mf, "conv1.weight");
    assert_int_equal(n, 64 * 6 * 7 * 7);
    assert_int_equal(conv1->numel, n);
    assert_memory_equal(conv1->data, ref, (size_t)n * sizeof(float));
    free(ref);
    /* no metadata in a plain state_dict export */
    assert_string_equal(mf->arch, "");
    assert_int_equal(mf->n_bands, 0);
    assert_int_equal(mf->n_classes, 0);
    assert_true(isnan(mf->scale));
    assert_int_equal(mf->tile, 0);
    assert_null(tw_model_file_find(mf, "layer1.0.bn1.num_batches_tracked"));
    assert_null(tw_model_file_find(mf, "nope"));
    tw_model_file_destroy(mf);
    assert_int_equal(tw_mem_current(TW_MEM_WEIGHTS), before);
}

/* Reduced precisions: exactly the values numpy/PyTorch rounded to, and within
 * the dtype's half-ulp of the float32 original. */
static void check_reduced(const char *file, const char *rounded_ref, double rel)
{
    TW_NEED_FIXTURE(path, file);
    tw_model_file *mf = load_ok(path);
    assert_int_equal(mf->n_tensors, 102);
    check_listing(mf, tw_test_fixture("resnet18_6b_7c_tensors.txt"), rel);
    float *exact = NULL, *rounded = NULL;
    long n = tw_test_read_f32(tw_test_fixture("resnet18_6b_7c_conv1.f32"), &exact);
    assert_int_equal(tw_test_read_f32(tw_test_fixture(rounded_ref), &rounded), n);
    const tw_tensor *conv1 = tw_model_file_find(mf, "conv1.weight");
    assert_int_equal(conv1->numel, n);
    int differ = 0;
    for (long i = 0; i < n; i++) {
        assert_true(conv1->data[i] == rounded[i]);
        assert_true(fabs(conv1->data[i] - exact[i]) <= rel * fabs(exact[i]) + 6e-8);
        differ += conv1->data[i] != exact[i];
    }
    assert_true(differ > n / 2); /* really reduced, not a float32 file by mistake */
    free(exact);
    free(rounded);
    tw_model_file_destroy(mf);
}

static void test_safetensors_f16(void **state)
{
    (void)state;
    check_reduced("resnet18_6b_7c_f16.safetensors", "resnet18_6b_7c_f16_conv1.f32", 1.0 / 2048);
}

static void test_safetensors_bf16(void **state)
{
    (void)state;
    check_reduced("resnet18_6b_7c_bf16.safetensors", "resnet18_6b_7c_bf16_conv1.f32", 1.0 / 256);
}

static void read_stats(float mean[6], float std[6])
{
    FILE *f = fopen(tw_test_fixture("raster_stats.txt"), "r");
    assert_non_null(f);
    double m[6], s[6];
    assert_int_equal(
        fscanf(f, "mean %lf %lf %lf %lf %lf %lf\n", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5]), 6);
    assert_int_equal(
        fscanf(f, "std %lf %lf %lf %lf %lf %lf", &s[0], &s[1], &s[2], &s[3], &s[4], &s[5]), 6);
    fclose(f);
    for (int i = 0; i < 6; i++) {
        mean[i] = (float)m[i];
        std[i] = (float)s[i];
    }
}

static void test_bundle_resnet18(void **state)
{
    (void)state;
    TW_NEED_FIXTURE(path, "resnet18_6b_7c.h5");
    tw_model_file *mf = load_ok(path);
    assert_int_equal(mf->n_tensors, 102);
    check_listing(mf, tw_test_fixture("resnet18_6b_7c_tensors.txt"), 0);
    assert_string_equal(mf->arch, "resnet18");
    assert_int_equal(mf->n_bands, 6);
    for (int i = 0; i < 6; i++) assert_int_equal(mf->bands[i], i + 1);
    assert_true(mf->scale == 1.0);
    float mean[6], std[6];
    read_stats(mean, std);
    assert_int_equal(mf->n_mean, 6);
    assert_int_equal(mf->n_std, 6);
    for (int i = 0; i < 6; i++) {
        assert_true(mf->mean[i] == mean[i]);
        assert_true(mf->std[i] == std[i]);
    }
    assert_int_equal(mf->n_classes, 7);
    for (int i = 0; i < 7; i++) {
        char want[16];
        snprintf(want, sizeof want, "c%d", i);
        assert_string_equal(mf->classes[i], want);
    }
    assert_int_equal(mf->tile, 64);
    tw_model_file_destroy(mf);
}

static void test_resnet50_both_formats(void **state)
{
    (void)state;
    TW_NEED_FIXTURE(st_path, "resnet50_6b_5c.safetensors");
    TW_NEED_FIXTURE(h5_path, "resnet50_6b_5c.h5");
    tw_model_file *a = load_ok(st_path);
    tw_model_file *b = load_ok(h5_path);
    assert_int_equal(a->n_tensors, 267);
    assert_int_equal(b->n_tensors, 267);
    check_listing(a, tw_test_fixture("resnet50_6b_5c_tensors.txt"), 0);
    check_listing(b, tw_test_fixture("resnet50_6b_5c_tensors.txt"), 0);
    const tw_tensor *fc = tw_model_file_find(b, "fc.weight");
    assert_int_equal(fc->shape[0], 5);
    assert_int_equal(fc->shape[1], 2048);
    const tw_tensor *c3 = tw_model_file_find(a, "layer4.2.conv3.weight");
    assert_non_null(c3);
    assert_int_equal(c3->shape[0], 2048);
    assert_memory_equal(c3->data, tw_model_file_find(b, "layer4.2.conv3.weight")->data,
                        (size_t)c3->numel * sizeof(float));
    assert_string_equal(b->arch, "resnet50");
    assert_int_equal(b->n_classes, 5);
    assert_string_equal(b->classes[4], "k4");
    tw_model_file_destroy(a);
    tw_model_file_destroy(b);
}

/* Bundle written with h5py's defaults: variable-length strings, int64 and
 * float64 attributes, a float16 dataset. */
static void test_bundle_other_types(void **state)
{
    (void)state;
    TW_NEED_FIXTURE(path, "tiny.h5");
    tw_model_file *mf = load_ok(path);
    assert_int_equal(mf->n_tensors, 3);
    assert_string_equal(mf->arch, "resnet18");
    assert_int_equal(mf->n_bands, 3);
    assert_int_equal(mf->bands[0], 3);
    assert_int_equal(mf->bands[2], 1);
    assert_true(mf->scale == 0.25);
    assert_int_equal(mf->n_mean, 3);
    assert_true(mf->mean[2] == 3.0f);
    assert_true(mf->std[1] == 5.0f);
    assert_int_equal(mf->n_classes, 5);
    assert_string_equal(mf->classes[0], "water");
    assert_string_equal(mf->classes[4], "crop");
    assert_int_equal(mf->tile, 128);
    float *ref = NULL;
    long n = tw_test_read_f32(tw_test_fixture("tiny_fc_weight.f32"), &ref);
    const tw_tensor *fc = tw_model_file_find(mf, "fc.weight");
    assert_int_equal(fc->numel, n);
    for (long i = 0; i < n; i++) assert_true(fabs(fc->data[i] - ref[i]) <= fabs(ref[i]) / 2048);
    free(ref);
    n = tw_test_read_f32(tw_test_fixture("tiny_conv1.f32"), &ref);
    assert_memory_equal(tw_model_file_find(mf, "conv1.weight")->data, ref, (size_t)n * 4);
    free(ref);
    tw_model_file_destroy(mf);
}

static void test_safetensors_metadata(void **state)
{
    (void)state;
    TW_NEED_FIXTURE(path, "tiny_meta.safetensors");
    tw_model_file *mf = load_ok(path);
    assert_string_equal(mf->arch, "resnet18");
    assert_int_equal(mf->n_bands, 3);
    assert_int_equal(mf->bands[0], 3);
    assert_int_equal(mf->bands[1], 2);
    assert_true(mf->scale == 0.5);
    assert_int_equal(mf->n_mean, 3);
    assert_true(mf->mean[1] == 2.5f);
    assert_int_equal(mf->n_std, 3);
    assert_true(mf->std[2] == 2.0f);
    assert_int_equal(mf->n_classes, 5);
    assert_string_equal(mf->classes[1], "b b");
    assert_int_equal(mf->tile, 96);
    tw_model_file_destroy(mf);

    mf = load_ok(tw_test_fixture("tiny_meta_plain.safetensors"));
    assert_string_equal(mf->arch, "resnet34");
    assert_int_equal(mf->n_bands, 0);
    assert_true(isnan(mf->scale));
    tw_model_file_destroy(mf);
}

/* The committed demo model: what the sample workflow relies on. */
static void test_demo_model(void **state)
{
    (void)state;
    const char *src = getenv("TW_SOURCE_DIR");
    if (!src) skip();
    const char *path = tw_test_path(src, "sample_data/demo_resnet18.h5");
    if (!tw_test_file_exists(path)) skip();
    tw_model_file *mf = load_ok(path);
    assert_int_equal(mf->n_tensors, 102); /* the same names as torchvision's resnet18 */
    assert_string_equal(mf->arch, "resnet18");
    assert_int_equal(mf->n_bands, 6);
    assert_int_equal(mf->bands[5], 6);
    assert_true(mf->scale == 1.0);
    assert_int_equal(mf->tile, 64);
    assert_int_equal(mf->n_classes, 4);
    assert_string_equal(mf->classes[0], "water");
    const tw_tensor *conv1 = tw_model_file_find(mf, "conv1.weight");
    assert_int_equal(conv1->shape[0], 16);
    assert_int_equal(conv1->shape[1], 6);
    const tw_tensor *fc = tw_model_file_find(mf, "fc.weight");
    assert_int_equal(fc->shape[0], 4);
    assert_int_equal(fc->shape[1], 128);
    assert_non_null(tw_model_file_find(mf, "layer4.0.downsample.1.running_var"));
    /* the committed bundles carry the checksum: the demo prints no notice */
    assert_int_equal(mf->checksum, TW_CHECKSUM_VERIFIED);
    const char *stats = tw_test_fixture("raster_stats.txt");
    if (stats) { /* the bundle's mean/std are the raster's, as the fixtures compute them */
        float mean[6], std[6];
        read_stats(mean, std);
        for (int i = 0; i < 6; i++) {
            assert_true(fabsf(mf->mean[i] - mean[i]) <= 1e-5f * mean[i]);
            assert_true(fabsf(mf->std[i] - std[i]) <= 1e-5f * std[i]);
        }
    }
    tw_model_file_destroy(mf);
    mf = load_ok(tw_test_path(src, "sample_data/demo_resnet50.h5"));
    assert_int_equal(mf->checksum, TW_CHECKSUM_VERIFIED);
    tw_model_file_destroy(mf);
}

static void test_sha256(void **state)
{
    (void)state;
    TW_NEED_FIXTURE(list, "sha256.txt");
    FILE *f = fopen(list, "r");
    assert_non_null(f);
    char hex[80], name[256];
    int n = 0;
    while (fscanf(f, "%79s %255s", hex, name) == 2) {
        tw_model_file *mf = load_ok(tw_test_fixture(name));
        assert_string_equal(mf->sha256, hex);
        tw_model_file_destroy(mf);
        n++;
    }
    fclose(f);
    assert_int_equal(n, 3);
}

static void expect_model_error(const char *path, const char *name, const char *needle)
{
    tw_error err;
    tw_error_init(&err);
    tw_model_file *mf = (tw_model_file *)&err; /* must be reset to NULL */
    tw_status st = tw_model_file_load(path, &mf, &err);
    if (st != TW_ERR_MODEL || !strstr(err.msg, name) || (needle && !strstr(err.msg, needle)))
        print_error("%s: status %d, message '%s' (want '%s')\n", name, st, err.msg,
                    needle ? needle : "");
    assert_int_equal(st, TW_ERR_MODEL);
    assert_null(mf);
    assert_non_null(strstr(err.msg, name));
    if (needle) assert_non_null(strstr(err.msg, needle));
}

static void test_bad_files(void **state)
{
    (void)state;
    static const struct {
        const char *file, *needle;
    } cases[] = {
        {"bad_truncated.safetensors", "past the end of the data"},
        {"bad_tiny.safetensors", "neither an HDF5 bundle"},
        {"bad_header_len.safetensors", "absurd"},
        {"bad_header_past_file.safetensors", "exceeds the file size"},
        {"bad_offsets.safetensors", "'fc.bias': data_offsets"},
        {"bad_overlap.safetensors", "overlap"},
        {"bad_json.safetensors", "not valid JSON"},
        {"bad_json_garbage.safetensors", "not valid JSON"},
        {"bad_span.safetensors", "'conv1.weight': shape holds"},
        {"bad_dtype.safetensors", "unknown dtype 'F7'"},
        {"bad_dims.safetensors", "5 dimensions"},
        {"bad_duplicate.safetensors", "'fc.bias' appears twice"},
        {"bad_missing_fc.safetensors", "no tensor 'fc.weight'"},
        {"bad_wrong_shape.safetensors", "fc.bias"},
        {"bad_truncated.h5", "cannot open as HDF5"},
        {"bad_notensors.h5", "no /tensors"},
        {"bad_noformat.h5", "not a tilewise bundle"},
        {"bad_int_tensor.h5", "/tensors/fc.bias is not a float"},
        {"bad_text.h5", "neither an HDF5 bundle"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TW_NEED_FIXTURE(path, cases[i].file);
        expect_model_error(path, cases[i].file, cases[i].needle);
    }
    expect_model_error("/nonexistent/dir/model.h5", "/nonexistent/dir/model.h5", "cannot open");
}

/* Every truncation and many single-byte corruptions of a small good file:
 * each must load or fail with TW_ERR_MODEL naming the file (ASan checks the
 * "never a crash" part). */
/* A minimal safetensors file (conv1 [1,1,1,1], fc [2,1] + [2]) whose
 * __metadata__ is the JSON object body meta; returns its path. */
static const char *write_meta_safetensors(const char *name, const char *meta)
{
    char header[1024];
    int n =
        snprintf(header, sizeof header,
                 "{\"__metadata__\":{%s},"
                 "\"conv1.weight\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1],\"data_offsets\":[0,4]},"
                 "\"fc.weight\":{\"dtype\":\"F32\",\"shape\":[2,1],\"data_offsets\":[4,12]},"
                 "\"fc.bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
                 meta);
    assert_true(n > 0 && n < (int)sizeof header);
    const char *path = tw_test_path(tw_test_tmpdir(), name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(((uint64_t)n >> (8 * i)) & 0xff);
    const float data[5] = {1.0f, 0.5f, -0.5f, 0.25f, -0.25f};
    assert_int_equal(fwrite(len, 1, 8, f), 8);
    assert_int_equal(fwrite(header, 1, (size_t)n, f), (size_t)n);
    assert_int_equal(fwrite(data, sizeof data[0], 5, f), 5);
    assert_int_equal(fclose(f), 0);
    return path;
}

/* Issue 36: segmentation archs and the default stride are metadata both
 * formats carry (tools/export_model.py writes them into the bundle). */
static void test_stride_and_seg_arch(void **state)
{
    (void)state;
    tw_model_file *mf = load_ok(write_meta_safetensors(
        "seg_meta.safetensors", "\"arch\":\"unet_resnet18\",\"tile\":\"64\",\"stride\":\"32\""));
    assert_string_equal(mf->arch, "unet_resnet18");
    assert_int_equal(mf->tile, 64);
    assert_int_equal(mf->stride, 32);
    tw_model_file_destroy(mf);
    mf = load_ok(
        write_meta_safetensors("seg_nostride.safetensors", "\"arch\":\"deeplabv3_resnet101\""));
    assert_string_equal(mf->arch, "deeplabv3_resnet101");
    assert_int_equal(mf->stride, 0); /* not in the file */
    tw_model_file_destroy(mf);
    expect_model_error(write_meta_safetensors("st0.safetensors", "\"stride\":\"0\""),
                       "st0.safetensors", "metadata 'stride' = 0 is out of range");
    expect_model_error(write_meta_safetensors("stx.safetensors", "\"stride\":\"\\\"x\\\"\""),
                       "stx.safetensors", "metadata 'stride' is not an integer");
    expect_model_error(
        write_meta_safetensors("stbig.safetensors", "\"tile\":\"64\",\"stride\":\"96\""),
        "stbig.safetensors", "metadata 'stride' = 96 is larger than metadata 'tile' = 64");
    expect_model_error(write_meta_safetensors("archx.safetensors", "\"arch\":\"unet_resnet152\""),
                       "archx.safetensors", "unet_resnet18/34/50/101");

    /* the committed demo U-Net (tools/make_demo_model.py --arch unet_resnet18) */
    const char *src = getenv("TW_SOURCE_DIR");
    if (!src) return;
    const char *demo = tw_test_path(src, "sample_data/demo_unet_resnet18.h5");
    if (!tw_test_file_exists(demo)) return;
    mf = load_ok(demo);
    assert_string_equal(mf->arch, "unet_resnet18");
    assert_int_equal(mf->tile, 64);
    assert_int_equal(mf->stride, 32);
    assert_int_equal(mf->n_bands, 6);
    assert_int_equal(mf->n_classes, 4);
    assert_string_equal(mf->classes[0], "water");
    assert_int_equal(mf->checksum, TW_CHECKSUM_VERIFIED);
    assert_non_null(tw_model_file_find(mf, "segmentation_head.0.bias"));
    tw_model_file_destroy(mf);
}

static void test_hostile_mutations(void **state)
{
    (void)state;
    TW_NEED_FIXTURE(src, "tiny_meta.safetensors");
    FILE *f = fopen(src, "rb");
    assert_non_null(f);
    unsigned char good[4096];
    size_t n = fread(good, 1, sizeof good, f);
    fclose(f);
    assert_true(n > 100 && n < sizeof good);
    const char *tmp = tw_test_path(tw_test_tmpdir(), "mut.safetensors");
    unsigned char buf[4096];
    uint32_t rng = 12345;
    int ok = 0, failed = 0;
    for (size_t trial = 0; trial < n + 1500; trial++) {
        size_t len = n;
        memcpy(buf, good, n);
        if (trial <= n) {
            len = trial; /* truncated at every length, including the full file */
        } else {
            rng = rng * 1103515245u + 12345u;
            size_t pos = (rng >> 8) % n;
            rng = rng * 1103515245u + 12345u;
            buf[pos] = (unsigned char)(rng >> 16);
        }
        f = fopen(tmp, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(buf, 1, len, f), len);
        assert_int_equal(fclose(f), 0);
        tw_error err;
        tw_error_init(&err);
        tw_model_file *mf = NULL;
        tw_status st = tw_model_file_load(tmp, &mf, &err);
        if (st == TW_OK) {
            assert_non_null(mf);
            ok++;
            tw_model_file_destroy(mf);
        } else {
            if (st != TW_ERR_MODEL) print_error("trial %zu: %d %s\n", trial, st, err.msg);
            assert_int_equal(st, TW_ERR_MODEL);
            assert_null(mf);
            assert_non_null(strstr(err.msg, "mut.safetensors"));
            failed++;
        }
    }
    assert_true(ok >= 1);          /* the untouched file */
    assert_true(failed >= (int)n); /* every strict truncation */
    remove(tmp);
}

/* Issue 27: a NaN in fc.weight gave a map of class 0 with exit 0. Every
 * non-finite value, in every format and dtype, is refused naming the file,
 * the tensor and the (row-major) index of the first one. */
static void test_nonfinite(void **state)
{
    (void)state;
    static const struct {
        const char *file, *needle;
    } cases[] = {
        {"nan_fc.safetensors", "tensor fc.weight[3, 5] is NaN"},
        {"inf_conv.safetensors", "tensor conv1.weight[2, 1, 0, 2] is -Inf"},
        {"nan_f16.safetensors", "tensor fc.weight[1, 2] is NaN"},
        {"inf_bf16.safetensors", "tensor fc.bias[4] is +Inf"},
        /* past the scan's first block of 4096 values */
        {"nan_deep.safetensors", "tensor conv1.weight[50, 2, 6, 1] is NaN"},
        /* a bundle whose checksum is right: the value check stands alone */
        {"nan_fc.h5", "tensor fc.weight[4, 7] is NaN"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TW_NEED_FIXTURE(path, cases[i].file);
        expect_model_error(path, cases[i].file, cases[i].needle);
    }
}

/* The bundle's tensors_sha256: verified when present (also over float16
 * and big-endian float64 datasets, hashed as stored), a mismatch refused
 * naming the bundle and "checksum", its absence a notice, not an error. */
static void test_checksum(void **state)
{
    (void)state;
    TW_NEED_FIXTURE(good, "ck_good.h5");
    char note[TW_ERROR_MSG_MAX];
    tw_model_file *mf = load_ok(good);
    assert_int_equal(mf->checksum, TW_CHECKSUM_VERIFIED);
    assert_string_equal(tw_model_checksum_name(mf->checksum), "verified");
    assert_false(tw_model_file_notice(mf, note, sizeof note));
    tw_model_file_destroy(mf);

    mf = load_ok(tw_test_fixture("ck_mixed.h5"));
    assert_int_equal(mf->checksum, TW_CHECKSUM_VERIFIED);
    tw_model_file_destroy(mf);

    /* written without one (as every bundle before the checksum was) */
    mf = load_ok(tw_test_fixture("tiny.h5"));
    assert_int_equal(mf->checksum, TW_CHECKSUM_ABSENT);
    assert_true(tw_model_file_notice(mf, note, sizeof note));
    assert_non_null(strstr(note, "tiny.h5"));
    assert_non_null(strstr(note, "no tensors checksum"));
    tw_model_file_destroy(mf);

    /* safetensors has no checksum to verify, and nothing to say about it */
    mf = load_ok(tw_test_fixture("tiny_meta.safetensors"));
    assert_int_equal(mf->checksum, TW_CHECKSUM_NONE);
    assert_false(tw_model_file_notice(mf, note, sizeof note));
    tw_model_file_destroy(mf);

    expect_model_error(tw_test_fixture("ck_flipped.h5"), "ck_flipped.h5", "checksum mismatch");
    expect_model_error(tw_test_fixture("ck_extra.h5"), "ck_extra.h5", "checksum mismatch");
    expect_model_error(tw_test_fixture("ck_badattr.h5"), "ck_badattr.h5",
                       "attribute 'tensors_sha256' is not a checksum");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safetensors_f32),
        cmocka_unit_test(test_safetensors_f16),
        cmocka_unit_test(test_safetensors_bf16),
        cmocka_unit_test(test_bundle_resnet18),
        cmocka_unit_test(test_resnet50_both_formats),
        cmocka_unit_test(test_bundle_other_types),
        cmocka_unit_test(test_safetensors_metadata),
        cmocka_unit_test(test_demo_model),
        cmocka_unit_test(test_sha256),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_stride_and_seg_arch),
        cmocka_unit_test(test_hostile_mutations),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_checksum),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
