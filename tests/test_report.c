/* test_report.c - run.json and the config JSON (pipeline/report/report.c) and the
 * one JSON emitter under them (pipeline/report/json.c): the output is JSON that a
 * real parser (jansson) reads back to the values given, hostile strings
 * included; NaN becomes null; a buffer too small is cut, never overrun. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/report/json.h"
#include "pipeline/report/report.h"
#include "testutil.h"

static const char *nasty = "a \"quoted\" back\\slash\nnew\tline \x01 caf\xc3\xa9";

static void test_emitter(void **state)
{
    (void)state;
    char buf[512];
    tw_json j = tw_json_buffer(buf, sizeof buf);
    tw_json_open(&j, NULL, '{');
    tw_json_str(&j, "s", nasty);
    tw_json_num(&j, "x", 0.1);
    tw_json_num(&j, "nan", NAN);
    tw_json_num(&j, "inf", -INFINITY);
    tw_json_int(&j, "big", 9007199254740993LL);
    tw_json_bool(&j, "t", true);
    tw_json_real(&j, "exact", 0.1, 17);
    tw_json_null(&j, "none");
    tw_json_fixed(&j, "frac", 0.5, 6);
    tw_json_fixed(&j, "fnan", NAN, 3);
    tw_json_open(&j, "arr", '[');
    tw_json_int(&j, NULL, 1);
    tw_json_str(&j, NULL, NULL);
    tw_json_open(&j, NULL, '{');
    tw_json_close(&j, '}');
    tw_json_close(&j, ']');
    tw_json_key(&j, "raw");
    tw_json_raw(&j, "[%d,%d]", 3, 4);
    j.need_comma = true;
    tw_json_str(&j, "after", "z");
    tw_json_close(&j, '}');
    assert_int_equal(strlen(buf), j.len);
    json_error_t e;
    json_t *root = json_loads(buf, JSON_REJECT_DUPLICATES, &e);
    if (!root) fail_msg("not JSON (%s): %s", e.text, buf);
    assert_string_equal(json_string_value(json_object_get(root, "s")), nasty);
    assert_true(json_real_value(json_object_get(root, "x")) == 0.1);
    assert_true(json_is_null(json_object_get(root, "nan")));
    assert_true(json_is_null(json_object_get(root, "inf")));
    assert_int_equal(json_integer_value(json_object_get(root, "big")), 9007199254740993LL);
    assert_true(json_is_true(json_object_get(root, "t")));
    assert_true(json_real_value(json_object_get(root, "exact")) == 0.1);
    assert_non_null(strstr(buf, "\"exact\":0.10000000000000001"));
    assert_true(json_is_null(json_object_get(root, "none")));
    assert_non_null(strstr(buf, "\"frac\":0.500000,"));
    assert_true(json_is_null(json_object_get(root, "fnan")));
    json_t *arr = json_object_get(root, "arr");
    assert_int_equal(json_array_size(arr), 3);
    assert_string_equal(json_string_value(json_array_get(arr, 1)), "");
    assert_int_equal(json_array_size(json_object_get(root, "raw")), 2);
    assert_string_equal(json_string_value(json_object_get(root, "after")), "z");
    json_decref(root);
    assert_non_null(strstr(buf, "\\n"));     /* short escapes for newline */
    assert_non_null(strstr(buf, "\\u0001")); /* and \u00XX for the rest */

    /* Too small: cut, NUL-terminated, nothing written past the end. */
    char small[24];
    memset(small, '#', sizeof small);
    tw_json t = tw_json_buffer(small, 16);
    tw_json_open(&t, NULL, '{');
    for (int i = 0; i < 10; i++) tw_json_str(&t, "key", nasty);
    tw_json_close(&t, '}');
    assert_int_equal(t.len, 15);
    assert_int_equal(strlen(small), 15);
    for (size_t i = 16; i < sizeof small; i++) assert_int_equal(small[i], '#');

    /* Onto a stream: the same bytes. */
    FILE *f = tmpfile();
    tw_json fj = tw_json_file(f);
    tw_json_open(&fj, NULL, '[');
    tw_json_str(&fj, NULL, nasty);
    tw_json_num(&fj, NULL, 2.5);
    tw_json_close(&fj, ']');
    rewind(f);
    char fb[256] = "";
    size_t n = fread(fb, 1, sizeof fb - 1, f);
    fclose(f);
    char bb[256];
    tw_json bj = tw_json_buffer(bb, sizeof bb);
    tw_json_open(&bj, NULL, '[');
    tw_json_str(&bj, NULL, nasty);
    tw_json_num(&bj, NULL, 2.5);
    tw_json_close(&bj, ']');
    assert_int_equal(n, bj.len);
    assert_memory_equal(fb, bb, n);
}

static tw_run_params sample_params(void)
{
    tw_run_params p = tw_run_default_params();
    p.input.n_paths = 2;
    snprintf(p.input.paths[0], TW_PATH_MAX, "/data/%s.tif", "one");
    snprintf(p.input.paths[1], TW_PATH_MAX, "%s", nasty);
    snprintf(p.model.weights, TW_PATH_MAX, "m.safetensors");
    snprintf(p.output.dir, TW_PATH_MAX, "out");
    p.output.products = TW_PRODUCT_CLASS | TW_PRODUCT_TILES_GPKG;
    p.tiling.batch = 0;
    p.runtime.memory = (size_t)3 << 30;
    p.shard_index = 1;
    p.shard_count = 4;
    snprintf(p.workflow_path, TW_PATH_MAX, "flow.yaml");
    return p;
}

static tw_resolved sample_model(void)
{
    tw_resolved m;
    memset(&m, 0, sizeof m);
    snprintf(m.arch, sizeof m.arch, "resnet50");
    m.n_bands = 2;
    m.bands[0] = 3, m.bands[1] = 1;
    m.scale = 0.5;
    m.n_norm = 2;
    m.mean[0] = 1.5f, m.mean[1] = -2.0f;
    m.std[0] = 3.0f, m.std[1] = 0.25f;
    m.n_classes = 3;
    snprintf(m.classes[0], TW_NAME_MAX, "water");
    snprintf(m.classes[1], TW_NAME_MAX, "for\"est");
    snprintf(m.classes[2], TW_NAME_MAX, "urban");
    m.tile = 64;
    m.stride = 32;
    snprintf(m.model_sha256, sizeof m.model_sha256, "%064d", 42);
    return m;
}

static void test_config_json(void **state)
{
    (void)state;
    tw_run_params p = sample_params();
    tw_resolved m = sample_model();
    char buf[16384];
    size_t n = tw_report_config_json(&p, &m, buf, sizeof buf);
    assert_int_equal(n, strlen(buf));
    json_error_t e;
    json_t *root = json_loads(buf, JSON_REJECT_DUPLICATES, &e);
    if (!root) fail_msg("not JSON (%s): %s", e.text, buf);
    json_t *in = json_object_get(root, "input");
    assert_string_equal(json_string_value(json_array_get(json_object_get(in, "path"), 1)), nasty);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(in, "bands"), 0)), 3);
    assert_true(json_number_value(json_object_get(in, "scale")) == 0.5);
    json_t *model = json_object_get(root, "model");
    assert_string_equal(json_string_value(json_object_get(model, "arch")), "resnet50");
    assert_string_equal(json_string_value(json_array_get(json_object_get(model, "classes"), 1)),
                        "for\"est");
    assert_true(json_number_value(json_array_get(json_object_get(model, "std"), 1)) == 0.25);
    json_t *tiling = json_object_get(root, "tiling");
    /* the products' metadata holds what made their bytes, not how the run
     * computed them (core/keys.h TW_KEY_BYTES): no batch, memory or threads */
    assert_null(json_object_get(tiling, "batch"));
    assert_int_equal(json_integer_value(json_object_get(tiling, "stride")), 32);
    json_t *prods = json_object_get(json_object_get(root, "output"), "products");
    assert_int_equal(json_array_size(prods), 2);
    assert_string_equal(json_string_value(json_array_get(prods, 1)), "tiles_gpkg");
    json_t *rt = json_object_get(root, "runtime");
    assert_null(json_object_get(rt, "memory"));
    assert_null(json_object_get(rt, "threads"));
    assert_string_equal(json_string_value(json_object_get(rt, "precision")), "fp32");
    json_decref(root);
    /* A buffer too small: cut and terminated, and the length says so (>= size),
     * so that no caller keeps a cut configuration without knowing. */
    char small[100];
    n = tw_report_config_json(&p, &m, small, sizeof small);
    assert_true(n >= sizeof small);
    assert_true(strlen(small) < sizeof small);
}

static void test_run_json(void **state)
{
    (void)state;
    tw_run_params p = sample_params();
    tw_run_result *r = calloc(1, sizeof *r);
    r->model = sample_model();
    snprintf(r->backend, sizeof r->backend, "cpu");
    r->n_inputs = 1;
    r->inputs = calloc(1, sizeof *r->inputs);
    tw_input_result *in = &r->inputs[0];
    snprintf(in->path, sizeof in->path, "%s", p.input.paths[0]);
    in->width = 349;
    in->tiles_classified = 36;
    in->seconds = 2.0;
    in->hist[0] = 10, in->hist[1] = 20, in->hist[2] = 6;
    in->n_outputs = 1;
    snprintf(in->outputs[0], sizeof in->outputs[0], "out/one.class.tif");
    r->tiles_classified = 36;
    r->seconds = 4.0;
    const char *path = tw_test_path(tw_test_tmpdir(), "run.json");
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_report_write(path, &p, r, TW_ERR_INPUT, nasty, &err), TW_OK);
    json_error_t e;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
    if (!root) fail_msg("run.json is not JSON: %s", e.text);
    assert_string_equal(json_string_value(json_object_get(root, "status")),
                        tw_status_name(TW_ERR_INPUT));
    assert_int_equal(json_integer_value(json_object_get(root, "exit_code")), 3);
    assert_string_equal(json_string_value(json_object_get(root, "message")), nasty);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(root, "shard"), "index")),
                     2);
    assert_true(json_number_value(json_object_get(root, "tiles_per_s")) == 9.0);
    json_t *in0 = json_array_get(json_object_get(root, "inputs"), 0);
    assert_true(json_number_value(json_object_get(in0, "tiles_per_s")) == 18.0);
    json_t *cells = json_object_get(in0, "class_cells");
    assert_int_equal(json_integer_value(json_object_get(cells, "for\"est")), 20);
    assert_string_equal(json_string_value(json_array_get(json_object_get(in0, "outputs"), 0)),
                        "out/one.class.tif");
    json_t *cfg_model = json_object_get(json_object_get(root, "config"), "model");
    assert_string_equal(json_string_value(json_object_get(cfg_model, "arch")), "resnet50");
    /* run.json's config has every key of the table, execution keys included */
    json_t *cfg = json_object_get(root, "config");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(cfg, "runtime"), "memory")),
                     (long long)3 << 30);
    assert_string_equal(json_string_value(json_object_get(json_object_get(cfg, "tiling"), "batch")),
                        "auto");
    assert_non_null(json_object_get(json_object_get(cfg, "runtime"), "readers"));
    assert_non_null(json_object_get(json_object_get(cfg, "output"), "name"));
    assert_int_equal(json_array_size(json_object_get(root, "warnings")), 0);
    json_decref(root);

    /* Without a result (failed before any work): status and message only. */
    tw_error_init(&err);
    assert_int_equal(tw_report_write(path, &p, NULL, TW_ERR_CONFIG, "bad key", &err), TW_OK);
    root = json_load_file(path, 0, &e);
    assert_non_null(root);
    assert_int_equal(json_integer_value(json_object_get(root, "exit_code")), 2);
    assert_null(json_object_get(root, "inputs"));
    json_decref(root);
    /* An unwritable path: TW_ERR_OUTPUT naming it. */
    tw_error_init(&err);
    assert_int_equal(tw_report_write("/nonexistent/dir/run.json", &p, r, TW_OK, NULL, &err),
                     TW_ERR_OUTPUT);
    assert_non_null(strstr(err.msg, "/nonexistent/dir/run.json"));
    free(r->inputs);
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_emitter),
        cmocka_unit_test(test_config_json),
        cmocka_unit_test(test_run_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
