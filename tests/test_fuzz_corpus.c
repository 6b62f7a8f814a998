/* test_fuzz_corpus.c - replays the committed fuzz corpora (fuzz/corpus/) in
 * the ordinary test suite, with the checks of the fuzz harnesses: no crash,
 * an error leaves no result and one line naming the file, and every byte of
 * the counting allocator and every HDF5 object is given back. The crash and
 * leak reproducers found by fuzzing (fuzz/corpus/<harness>/regress-*) are
 * kept there, so each fixed bug stays tested here, in the release build and
 * under ASan+UBSan, without clang or libFuzzer. */
#include <dirent.h>
#include <hdf5.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "io/modelfile/model_file.h"
#include "core/alloc.h"
#include "pipeline/store/manifest.h"
#include "tests/testutil.h"
#include "tests/tiff_roundtrip.h"
#include "config/workflow.h"

/* Run directly from an ASan build (leak detection on), the raw HDF5 corpus
 * shows libhdf5 1.10's own leaks on corrupt files (see fuzz/README.md).
 * Leaks of tilewise's own buffers and HDF5 handles are caught below by the
 * allocator count and H5Fget_obj_count, so libhdf5's are suppressed here. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libhdf5_serial.so\nleak:libhdf5.so\n";
}

static const unsigned char HDF5_SIG[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

typedef struct blob {
    char name[256];
    unsigned char *data;
    size_t size;
} blob;

/* Every file of fuzz/corpus/<harness>/, sorted by name; count in *n. */
static blob *load_corpus(const char *harness, int *n)
{
    const char *src = getenv("TW_SOURCE_DIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/fuzz/corpus/%s", src ? src : TW_SOURCE_DIR, harness);
    struct dirent **ents = NULL;
    int m = scandir(dir, &ents, NULL, alphasort);
    assert_true(m > 0);
    blob *b = calloc((size_t)m, sizeof *b);
    assert_non_null(b);
    *n = 0;
    for (int i = 0; i < m; i++) {
        if (ents[i]->d_name[0] != '.') {
            blob *x = &b[*n];
            snprintf(x->name, sizeof x->name, "%s", ents[i]->d_name);
            FILE *f = fopen(tw_test_path(dir, x->name), "rb");
            assert_non_null(f);
            assert_int_equal(fseek(f, 0, SEEK_END), 0);
            long len = ftell(f);
            assert_true(len >= 0);
            rewind(f);
            x->size = (size_t)len;
            x->data = malloc(x->size + 1);
            assert_non_null(x->data);
            assert_int_equal(fread(x->data, 1, x->size, f), x->size);
            fclose(f);
            (*n)++;
        }
        free(ents[i]);
    }
    free(ents);
    assert_true(*n > 0);
    return b;
}

static void free_corpus(blob *b, int n)
{
    for (int i = 0; i < n; i++) free(b[i].data);
    free(b);
}

static void assert_one_line(const tw_error *err, const char *needle, const char *what)
{
    size_t len = strnlen(err->msg, sizeof err->msg);
    if (len == 0 || len == sizeof err->msg || memchr(err->msg, '\n', len) ||
        (needle && !strstr(err->msg, needle)))
        fail_msg("%s: bad error message '%s' (must be one line naming '%s')", what, err->msg,
                 needle ? needle : "");
}

/* As fuzz/fuzz_workflow.c: the text alone, then with its last line as --set. */
static void test_workflow_corpus(void **state)
{
    (void)state;
    int n = 0;
    blob *b = load_corpus("workflow", &n);
    tw_run_params *params = malloc(sizeof *params);
    assert_non_null(params);
    int n_ok = 0;
    for (int i = 0; i < n; i++) {
        for (int with_set = 0; with_set < 2; with_set++) {
            const char *sets[1];
            int n_sets = 0;
            char *set = NULL;
            const unsigned char *nl = b[i].size ? memrchr(b[i].data, '\n', b[i].size) : NULL;
            if (with_set && nl) {
                size_t off = (size_t)(nl - b[i].data) + 1;
                set = strndup((const char *)b[i].data + off, b[i].size - off);
                assert_non_null(set);
                sets[0] = set;
                n_sets = 1;
            }
            tw_error err;
            tw_error_init(&err);
            tw_status st = tw_workflow_parse(b[i].name, (const char *)b[i].data, b[i].size, sets,
                                             n_sets, params, &err);
            if (st == TW_OK)
                n_ok++;
            else
                assert_one_line(&err, NULL, b[i].name);
            free(set);
        }
    }
    /* The two workflow files of the repository are in the corpus and parse. */
    assert_true(n_ok >= 2);
    free(params);
    free_corpus(b, n);
}

/* As fuzz/fuzz_manifest.c: an error is one line naming the file; an accepted
 * manifest formats to text that reads back and formats to the same bytes.
 * The corpus holds a real manifest and one with every variant (NaN nodata,
 * a non-UTF-8 path, COG, ...), which must be accepted, and the old binary
 * and a future version, which must be refused naming both versions. */
static void test_manifest_corpus(void **state)
{
    (void)state;
    int n = 0;
    blob *b = load_corpus("manifest", &n);
    tw_manifest *a = malloc(sizeof *a), *c = malloc(sizeof *c);
    assert_non_null(a);
    assert_non_null(c);
    int n_ok = 0;
    for (int i = 0; i < n; i++) {
        tw_error err;
        tw_error_init(&err);
        tw_status st = tw_manifest_parse((const char *)b[i].data, b[i].size, b[i].name, a, &err);
        if (st != TW_OK) {
            assert_one_line(&err, b[i].name, b[i].name);
            if (strcmp(b[i].name, "v3") == 0 || strcmp(b[i].name, "v1-binary-head") == 0)
                assert_non_null(strstr(err.msg, "reads version 2 only"));
            continue;
        }
        n_ok++;
        char *t1 = NULL, *t2 = NULL;
        size_t n1 = 0, n2 = 0;
        assert_int_equal(tw_manifest_format(a, &t1, &n1, &err), TW_OK);
        assert_int_equal(tw_manifest_parse(t1, n1, b[i].name, c, &err), TW_OK);
        assert_int_equal(tw_manifest_format(c, &t2, &n2, &err), TW_OK);
        assert_int_equal(n1, n2);
        assert_memory_equal(t1, t2, n1);
        free(t1);
        free(t2);
    }
    assert_true(n_ok >= 2);
    free(a);
    free(c);
    free_corpus(b, n);
}

/* fuzz_tiff's corpus: each input's TIFF, written by libtiff, read back by
 * the direct reader sample for sample (tests/tiff_roundtrip.h). */
static void test_tiff_corpus(void **state)
{
    (void)state;
    int n = 0;
    blob *b = load_corpus("tiff", &n);
    assert_true(n >= 13);
    char scratch[] = "/tmp/tw-fuzz-tiff-XXXXXX";
    int fd = mkstemp(scratch);
    assert_true(fd >= 0);
    close(fd);
    for (int i = 0; i < n; i++) {
        char why[256];
        if (tw_tiff_roundtrip(b[i].data, b[i].size, scratch, why, sizeof why) != 0)
            fail_msg("%s: %s", b[i].name, why);
    }
    unlink(scratch);
    free_corpus(b, n);
}

/* Load one model-file corpus; returns the number of inputs that loaded.
 * suffix ends each file's name (".onnx": the ONNX reader, as in fuzz_onnx). */
static int replay_models(const char *harness, bool force_hdf5, const char *suffix)
{
    int n = 0;
    blob *b = load_corpus(harness, &n);
    const char *tmp = tw_test_tmpdir();
    int n_ok = 0;
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s%s", tmp, b[i].name, suffix);
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        if (force_hdf5 && (b[i].size < 8 || memcmp(b[i].data, HDF5_SIG, 8) != 0))
            assert_int_equal(fwrite(HDF5_SIG, 1, 8, f), 8);
        assert_int_equal(fwrite(b[i].data, 1, b[i].size, f), b[i].size);
        assert_int_equal(fclose(f), 0);

        tw_error err;
        tw_error_init(&err);
        tw_model_file *mf = NULL;
        tw_status st = tw_model_file_load(path, &mf, &err);
        if (st == TW_OK) {
            assert_non_null(mf);
            n_ok++;
            tw_model_file_destroy(mf);
        } else {
            assert_null(mf);
            assert_one_line(&err, path, b[i].name);
        }
        if (tw_mem_current(TW_MEM_TAG_COUNT) != 0)
            fail_msg("%s/%s: %zu bytes still allocated after status %d", harness, b[i].name,
                     tw_mem_current(TW_MEM_TAG_COUNT), (int)st);
        ssize_t open_objs = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
        if (open_objs != 0)
            fail_msg("%s/%s: %zd HDF5 objects left open", harness, b[i].name, open_objs);
        remove(path);
    }
    free_corpus(b, n);
    return n_ok;
}

static void test_safetensors_corpus(void **state)
{
    (void)state;
    /* resnet18_f32_meta, resnet18_f16 and resnet18_bf16 are whole models. */
    assert_true(replay_models("safetensors", false, "") >= 3);
}

static void test_hdf5_corpus(void **state)
{
    (void)state;
    /* bundle_full is a whole model. */
    assert_true(replay_models("hdf5_raw", true, "") >= 1);
}

static void test_onnx_corpus(void **state)
{
    (void)state;
    /* resnet18_bn, resnet18_folded_o11 and resnet18_matmul_meta are whole models. */
    assert_true(replay_models("onnx", false, ".onnx") >= 3);
}

/* The reproducers of fixed bugs, one by one, with the message they must give. */
static void test_hdf5_regressions(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        const char *needle;
    } cases[] = {
        /* H5Dread of a tensor fails: its buffer leaked (io/modelfile/model_file.c). */
        {"regress-tensor-read-fails", "cannot read /tensors/"},
        /* Corrupt dense link storage: H5Lget_name_by_idx made libhdf5 free
         * an uninitialised pointer (io/modelfile/model_file.c now uses H5Literate). */
        {"regress-dense-links-corrupt", "/tensors"},
    };
    const char *src = getenv("TW_SOURCE_DIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/fuzz/corpus/hdf5_raw", src ? src : TW_SOURCE_DIR);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tw_error err;
        tw_error_init(&err);
        tw_model_file *mf = NULL;
        const char *path = tw_test_path(dir, cases[i].name);
        assert_int_equal(tw_model_file_load(path, &mf, &err), TW_ERR_MODEL);
        assert_null(mf);
        assert_one_line(&err, cases[i].needle, cases[i].name);
        assert_int_equal(tw_mem_current(TW_MEM_TAG_COUNT), 0);
    }
}

/* fuzz_safetensors: two "__metadata__" keys; the first was taken for a
 * tensor and written past the tensor table (io/modelfile/model_file.c). */
static void test_safetensors_regressions(void **state)
{
    (void)state;
    const char *src = getenv("TW_SOURCE_DIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/fuzz/corpus/safetensors", src ? src : TW_SOURCE_DIR);
    tw_error err;
    tw_error_init(&err);
    tw_model_file *mf = NULL;
    const char *path = tw_test_path(dir, "regress-duplicate-metadata");
    assert_int_equal(tw_model_file_load(path, &mf, &err), TW_ERR_MODEL);
    assert_null(mf);
    assert_one_line(&err, "two '__metadata__' entries", "regress-duplicate-metadata");
    assert_int_equal(tw_mem_current(TW_MEM_TAG_COUNT), 0);
}

/* fuzz_onnx: a ModelProto that decodes but has no graph; the decoded
 * message leaked (io/modelfile/onnx.c). */
static void test_onnx_regressions(void **state)
{
    (void)state;
    const char *src = getenv("TW_SOURCE_DIR");
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/fuzz/corpus/onnx", src ? src : TW_SOURCE_DIR);
    /* as fuzz_onnx saw it: a .onnx file */
    FILE *in = fopen(tw_test_path(dir, "regress-no-graph-leak"), "rb");
    assert_non_null(in);
    snprintf(path, sizeof path, "%s/regress-no-graph-leak.onnx", tw_test_tmpdir());
    FILE *out = fopen(path, "wb");
    assert_non_null(out);
    int ch;
    while ((ch = fgetc(in)) != EOF) fputc(ch, out);
    fclose(in);
    assert_int_equal(fclose(out), 0);
    tw_error err;
    tw_error_init(&err);
    tw_model_file *mf = NULL;
    assert_int_equal(tw_model_file_load(path, &mf, &err), TW_ERR_MODEL);
    assert_null(mf);
    assert_one_line(&err, "not an ONNX model (it has no graph)", "regress-no-graph-leak");
    assert_int_equal(tw_mem_current(TW_MEM_TAG_COUNT), 0);
    remove(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_workflow_corpus),  cmocka_unit_test(test_safetensors_corpus),
        cmocka_unit_test(test_onnx_corpus),      cmocka_unit_test(test_hdf5_corpus),
        cmocka_unit_test(test_hdf5_regressions), cmocka_unit_test(test_safetensors_regressions),
        cmocka_unit_test(test_onnx_regressions), cmocka_unit_test(test_tiff_corpus),
        cmocka_unit_test(test_manifest_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
