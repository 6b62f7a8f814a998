/* test_resume.c - the shard/merge manifest: exact round trip, versions
 * refused with one message naming both, keys read by name (a reorder cannot
 * be misread), mistyped/unknown/duplicate keys and every truncation refused. */
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

#include "config/workflow.h"
#include "core/keys.h"
#include "pipeline/store/manifest.h"
#include "testutil.h"

static tw_manifest *sample(void)
{
    tw_manifest *mf = calloc(1, sizeof *mf);
    assert_non_null(mf);
    mf->p = tw_run_default_params();
    mf->p.input.n_paths = 3;
    snprintf(mf->p.input.paths[0], TW_PATH_MAX, "/data/scène \"one\".tif");
    snprintf(mf->p.input.paths[1], TW_PATH_MAX, "/data/latin1-\xe9\xff.tif"); /* not UTF-8 */
    snprintf(mf->p.input.paths[2], TW_PATH_MAX, "relative/b.vrt");
    mf->p.tiling.edge = TW_EDGE_SHIFT;
    snprintf(mf->p.output.dir, TW_PATH_MAX, "out/x");
    mf->p.output.products = TW_PRODUCT_CLASS | TW_PRODUCT_CONF | TW_PRODUCT_TILES_GPKG;
    mf->p.output.prob_type = TW_PROB_UINT8;
    mf->p.output.format = TW_FORMAT_COG;
    mf->p.output.n_creation_options = 2;
    snprintf(mf->p.output.creation_options[0], 128, "COMPRESS=DEFLATE");
    snprintf(mf->p.output.creation_options[1], 128, "PREDICTOR=2");
    mf->p.output.resolution = TW_RESOLUTION_INPUT;
    mf->p.model.n_colors = 2;
    memcpy(mf->p.model.colors[0], (unsigned char[3]){0x00, 0x72, 0xbd}, 3);
    memcpy(mf->p.model.colors[1], (unsigned char[3]){0xff, 0x00, 0x01}, 3);

    tw_resolved *m = &mf->m;
    snprintf(m->arch, sizeof m->arch, "resnet50");
    m->n_bands = 3;
    m->bands[0] = 4, m->bands[1] = 3, m->bands[2] = 2;
    m->scale = 1.0 / 3.0;
    m->n_norm = 3;
    for (int i = 0; i < 3; i++) {
        m->mean[i] = 0.1f * (float)(i + 1);
        m->std[i] = 1.0f / (float)(i + 7);
    }
    m->n_classes = 4;
    snprintf(m->classes[0], TW_NAME_MAX, "water");
    snprintf(m->classes[1], TW_NAME_MAX, "forêt");
    snprintf(m->classes[2], TW_NAME_MAX, "a\tb\\c\"d");
    snprintf(m->classes[3], TW_NAME_MAX, "urban");
    m->tile = 64;
    m->stride = 32;
    m->cell = 32;
    m->multiple = 1;
    m->in_bands = 3;
    m->feat_dim = 2048;
    snprintf(m->model_sha256, sizeof m->model_sha256, "%064d", 7);

    tw_raster_info *in = &mf->info;
    in->width = 70000;
    in->height = 3;
    in->band_count = 6;
    in->dtype = TW_DT_UINT16;
    in->block_w = 256;
    in->block_h = 1;
    in->has_nodata = true;
    in->nodata = NAN;
    const double gt[6] = {-123456.789012345678, 0.1, 1e-300, 5e6 + 1.0 / 3.0, -0.0, -0.1};
    memcpy(in->geotransform, gt, sizeof gt);
    in->has_geotransform = true;
    snprintf(in->crs_wkt, sizeof in->crs_wkt, "PROJCS[\"WGS 84 / UTM zone 32N\",GEOGCS[...]]");
    snprintf(in->driver, sizeof in->driver, "GTiff");
    snprintf(mf->config_json, sizeof mf->config_json, "{\"a\":[1,2],\"b\":\"\\u0001\"}");
    snprintf(mf->fingerprint, sizeof mf->fingerprint, "tilewise-parts 1\ninput x\nnorm 1 2\n");
    return mf;
}

/* Every carried field equal, bit for bit for the doubles. */
static void assert_same(const tw_manifest *a, const tw_manifest *b)
{
    assert_int_equal(a->p.input.n_paths, b->p.input.n_paths);
    for (int i = 0; i < a->p.input.n_paths; i++)
        assert_string_equal(a->p.input.paths[i], b->p.input.paths[i]);
    assert_int_equal(a->p.tiling.edge, b->p.tiling.edge);
    assert_int_equal(a->p.tiling.blend, b->p.tiling.blend);
    assert_int_equal(a->p.tiling.margin, b->p.tiling.margin);
    assert_string_equal(a->p.output.dir, b->p.output.dir);
    assert_int_equal(a->p.output.products, b->p.output.products);
    assert_int_equal(a->p.output.prob_type, b->p.output.prob_type);
    assert_int_equal(a->p.output.format, b->p.output.format);
    assert_int_equal(a->p.output.n_creation_options, b->p.output.n_creation_options);
    for (int i = 0; i < a->p.output.n_creation_options; i++)
        assert_string_equal(a->p.output.creation_options[i], b->p.output.creation_options[i]);
    assert_int_equal(a->p.output.resolution, b->p.output.resolution);
    assert_int_equal(a->p.model.n_colors, b->p.model.n_colors);
    assert_memory_equal(a->p.model.colors, b->p.model.colors, sizeof a->p.model.colors);
    /* tw_resolved has no padding holes that calloc did not zero in both */
    assert_memory_equal(&a->m, &b->m, sizeof a->m);
    assert_int_equal(a->info.width, b->info.width);
    assert_int_equal(a->info.height, b->info.height);
    assert_int_equal(a->info.band_count, b->info.band_count);
    assert_int_equal(a->info.dtype, b->info.dtype);
    assert_int_equal(a->info.block_w, b->info.block_w);
    assert_int_equal(a->info.block_h, b->info.block_h);
    assert_int_equal(a->info.has_nodata, b->info.has_nodata);
    assert_true(isnan(a->info.nodata) ? isnan(b->info.nodata) : a->info.nodata == b->info.nodata);
    assert_memory_equal(a->info.geotransform, b->info.geotransform, sizeof a->info.geotransform);
    assert_int_equal(a->info.has_geotransform, b->info.has_geotransform);
    assert_string_equal(a->info.crs_wkt, b->info.crs_wkt);
    assert_string_equal(a->info.driver, b->info.driver);
    assert_string_equal(a->config_json, b->config_json);
    assert_string_equal(a->fingerprint, b->fingerprint);
}

/* noinline: gcc 12 takes the result for a pointer to the local it was
 * returned through (-Wdangling-pointer). */
__attribute__((noinline)) static char *format(const tw_manifest *mf, size_t *len)
{
    tw_error err;
    tw_error_init(&err);
    char *text = NULL;
    assert_int_equal(tw_manifest_format(mf, &text, len, &err), TW_OK);
    assert_int_equal(strlen(text), *len);
    return text;
}

/* Parse text; returns the status, the message in msg. */
static tw_status parse(const char *text, size_t len, tw_manifest *out, char *msg)
{
    tw_error err;
    tw_error_init(&err);
    tw_status st = tw_manifest_parse(text, len, "M", out, &err);
    snprintf(msg, TW_ERROR_MSG_MAX, "%s", err.msg);
    return st;
}

static void test_roundtrip(void **state)
{
    (void)state;
    tw_manifest *a = sample(), *b = calloc(1, sizeof *b);
    size_t len;
    char *text = format(a, &len);
    char msg[TW_ERROR_MSG_MAX];
    assert_int_equal(parse(text, len, b, msg), TW_OK);
    assert_same(a, b);
    /* It is text, and says what it is. */
    assert_non_null(strstr(text, "\"format\": \"tilewise-manifest\""));
    assert_non_null(strstr(text, "\"version\": 2"));
    assert_non_null(strstr(text, "\"nodata\": \"nan\""));
    assert_non_null(strstr(text, "\"hex\"")); /* the latin-1 path */
    assert_null(memchr(text, '\0', len));

    /* Through the file system, atomically written and read back. */
    const char *dir = tw_test_tmpdir();
    const char *path = tw_test_path(dir, "manifest");
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_manifest_write(a, path, &err), TW_OK);
    memset(b, 0, sizeof *b);
    assert_int_equal(tw_manifest_read(path, "scene", b, &err), TW_OK);
    assert_same(a, b);

    /* A missing manifest names the input. */
    tw_error_init(&err);
    assert_int_equal(tw_manifest_read(tw_test_path(dir, "none"), "scene", b, &err), TW_ERR_INPUT);
    assert_non_null(strstr(err.msg, "scene: no run manifest"));
    free(text);
    free(a);
    free(b);
}

/* Keys are read by name: the same manifest with its keys in another order
 * (sorted, which moves "width"/"height", "mean"/"std", ...) reads the same,
 * and a manifest that swaps the VALUES of two same-typed fields says so in
 * its keys — unlike the old binary layout, where a build that swapped two
 * same-sized struct members read width as height without noticing. */
static void test_key_order(void **state)
{
    (void)state;
    tw_manifest *a = sample(), *b = calloc(1, sizeof *b);
    size_t len;
    char *text = format(a, &len);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    assert_non_null(root);
    char *sorted = json_dumps(root, JSON_SORT_KEYS | JSON_COMPACT | JSON_REAL_PRECISION(17));
    assert_non_null(sorted);
    assert_true(strcmp(sorted, text) != 0);
    assert_true(strstr(sorted, "\"height\"") < strstr(sorted, "\"width\""));
    assert_true(strstr(text, "\"width\"") < strstr(text, "\"height\""));
    char msg[TW_ERROR_MSG_MAX];
    assert_int_equal(parse(sorted, strlen(sorted), b, msg), TW_OK);
    assert_same(a, b);

    /* Swap the two keys' names in the text: the values follow the names. */
    json_t *ras = json_object_get(root, "raster");
    json_object_set_new(ras, "width", json_integer(a->info.height));
    json_object_set_new(ras, "height", json_integer(a->info.width));
    char *swapped = json_dumps(root, JSON_REAL_PRECISION(17));
    assert_int_equal(parse(swapped, strlen(swapped), b, msg), TW_OK);
    assert_int_equal(b->info.width, a->info.height);
    assert_int_equal(b->info.height, a->info.width);
    free(swapped);
    free(sorted);
    json_decref(root);
    free(text);
    free(a);
    free(b);
}

static void test_other_versions(void **state)
{
    (void)state;
    tw_manifest *a = sample(), *b = calloc(1, sizeof *b);
    char msg[TW_ERROR_MSG_MAX];

    /* Version 1: the old binary layout, whatever bytes follow the magic. */
    size_t n1 = 200000;
    char *v1 = calloc(1, n1);
    memcpy(v1, "TWMANIF1", 8);
    memcpy(v1 + 20, a, sizeof *a < n1 - 20 ? sizeof *a : n1 - 20);
    assert_int_equal(parse(v1, n1, b, msg), TW_ERR_INPUT);
    assert_int_equal(tw_status_exit_code(TW_ERR_INPUT), 3);
    assert_non_null(strstr(msg, "M: run manifest format version 1 (binary, \"TWMANIF1\")"));
    assert_non_null(strstr(msg, "reads version 2 only"));
    assert_null(strchr(msg, '\n'));
    free(v1);

    /* Version 3 (a future tilewise), otherwise valid. */
    size_t len;
    char *text = format(a, &len);
    assert_non_null(strstr(text, "\"version\": 2"));
    size_t at = (size_t)(strstr(text, "\"version\": 2") - text);
    text[at + 11] = '3';
    assert_int_equal(parse(text, len, b, msg), TW_ERR_INPUT);
    assert_non_null(strstr(msg, "format version 3, but this tilewise"));
    assert_non_null(strstr(msg, "reads version 2 only"));
    /* Version 0 and a non-integer version. */
    text[at + 11] = '0';
    assert_int_equal(parse(text, len, b, msg), TW_ERR_INPUT);
    assert_non_null(strstr(msg, "format version 0,"));
    text[at + 10] = '"';
    text[at + 11] = '"';
    assert_int_equal(parse(text, len, b, msg), TW_ERR_INPUT);
    assert_non_null(strstr(msg, "damaged run manifest: key version is not an integer"));
    free(text);
    free(a);
    free(b);
}

/* Edit one key of the formatted sample with fn, expect a refusal whose
 * message contains want. */
static void expect_refused(void (*fn)(json_t *root), const char *want)
{
    tw_manifest *a = sample(), *b = calloc(1, sizeof *b);
    size_t len;
    char *text = format(a, &len);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    fn(root);
    char *bad = json_dumps(root, JSON_REAL_PRECISION(17));
    char msg[TW_ERROR_MSG_MAX];
    tw_status st = parse(bad, strlen(bad), b, msg);
    if (st != TW_ERR_INPUT || !strstr(msg, want))
        fail_msg("wanted a refusal with '%s', got status %d '%s'", want, st, msg);
    free(bad);
    json_decref(root);
    free(text);
    free(a);
    free(b);
}

static void tile_as_string(json_t *r)
{
    json_object_set_new(json_object_get(r, "model"), "tile", json_string("64"));
}
static void tile_zero(json_t *r)
{
    json_object_set_new(json_object_get(r, "model"), "tile", json_integer(0));
}
static void stride_not_divisor(json_t *r)
{
    json_object_set_new(json_object_get(r, "model"), "stride", json_integer(48));
}
static void unknown_key(json_t *r)
{
    json_object_set_new(json_object_get(r, "output"), "pyramids", json_string("input"));
}
static void missing_key(json_t *r)
{
    json_object_del(json_object_get(r, "raster"), "crs_wkt");
}
static void long_class(json_t *r)
{
    char name[200];
    memset(name, 'x', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    json_array_set_new(json_object_get(json_object_get(r, "model"), "classes"), 1,
                       json_string(name));
}
static void too_many_classes(json_t *r)
{
    json_t *c = json_object_get(json_object_get(r, "model"), "classes");
    while (json_array_size(c) <= TW_MAX_CLASSES) json_array_append_new(c, json_string("k"));
}
static void bad_product(json_t *r)
{
    json_array_append_new(json_object_get(json_object_get(r, "output"), "products"),
                          json_string("everything"));
}
static void bad_edge(json_t *r)
{
    json_object_set_new(json_object_get(r, "tiling"), "edge", json_integer(1));
}
static void short_geotransform(json_t *r)
{
    json_array_remove(json_object_get(json_object_get(r, "raster"), "geotransform"), 5);
}
static void nan_scale(json_t *r)
{
    json_object_set_new(json_object_get(r, "model"), "scale", json_string("nan"));
}
static void mean_std_lengths(json_t *r)
{
    json_array_remove(json_object_get(json_object_get(r, "model"), "std"), 0);
}
static void nul_in_string(json_t *r)
{
    json_object_set_new(r, "fingerprint", json_stringn("a\0b", 3));
}
static void bad_hex(json_t *r)
{
    json_array_set_new(json_object_get(r, "inputs"), 0, json_pack("{s:s}", "hex", "4g"));
}
static void not_a_manifest(json_t *r)
{
    json_object_set_new(r, "format", json_string("geojson"));
}

static void test_garbage(void **state)
{
    (void)state;
    expect_refused(tile_as_string, "M: damaged run manifest: key model.tile is not an integer");
    expect_refused(tile_zero, "key model.tile is not an integer in 1..65536");
    expect_refused(stride_not_divisor, "model.stride 48 does not divide model.tile 64");
    expect_refused(unknown_key, "unknown key output.pyramids");
    expect_refused(missing_key, "key raster.crs_wkt missing");
    expect_refused(long_class, "key model.classes: a string of 199 bytes (at most 63");
    expect_refused(too_many_classes, "key model.classes has 256 entries (at most 255)");
    expect_refused(bad_product, "output.products: entry 4 is not a product name");
    expect_refused(bad_edge, "key tiling.edge is not one of the known names");
    expect_refused(short_geotransform, "raster.geotransform has not 6 numbers");
    expect_refused(nan_scale, "key model.scale is not a finite number");
    expect_refused(mean_std_lengths, "model.mean and model.std differ in length (3, 2)");
    expect_refused(nul_in_string, "M: damaged run manifest: line");
    expect_refused(bad_hex, "key inputs.[]: bad hex string");
    expect_refused(not_a_manifest, "not a tilewise manifest");

    char msg[TW_ERROR_MSG_MAX];
    tw_manifest *b = calloc(1, sizeof *b);
    /* Duplicate keys: which one would win is not something to guess. */
    const char *dup = "{\"format\":\"tilewise-manifest\",\"version\":2,\"version\":2}";
    assert_int_equal(parse(dup, strlen(dup), b, msg), TW_ERR_INPUT);
    assert_non_null(strstr(msg, "duplicate object key"));
    /* Not JSON at all, and empty. */
    assert_int_equal(parse("\x89HDF\r\n", 6, b, msg), TW_ERR_INPUT);
    assert_non_null(strstr(msg, "M: damaged run manifest: line 1"));
    assert_int_equal(parse("", 0, b, msg), TW_ERR_INPUT);
    assert_int_equal(parse("[2]", 3, b, msg), TW_ERR_INPUT);
    assert_non_null(strstr(msg, "not a tilewise manifest"));
    free(b);
}

/* Every truncation of a valid manifest (a disk that filled up, a copy cut
 * short) is refused, never read as a shorter valid one. */
static void test_truncated(void **state)
{
    (void)state;
    tw_manifest *a = sample(), *b = calloc(1, sizeof *b);
    size_t len;
    char *text = format(a, &len);
    size_t end = len;
    while (end > 0 && text[end - 1] != '}') end--;
    char msg[TW_ERROR_MSG_MAX];
    for (size_t n = 0; n < end; n++) {
        tw_status st = parse(text, n, b, msg);
        if (st != TW_ERR_INPUT) fail_msg("a prefix of %zu of %zu bytes was accepted", n, len);
    }
    assert_int_equal(parse(text, end, b, msg), TW_OK);
    free(text);
    free(a);
    free(b);
}

/* The TW_KEY_BYTES keys a merge takes from elsewhere than the manifest's
 * run parameters, and where (core/keys.c's table decides which keys change
 * a byte; this list, which of them merge does not need from p). */
static const struct {
    const char *path, *where;
} k_not_in_p[] = {
    {"input.bands", "model.bands, resolved"},
    {"input.scale", "model.scale, resolved"},
    {"input.aoi", "the chunks (tiles outside it are nodata there) and the fingerprint"},
    {"input.assets", "the chunks and the fingerprint (with output.stac the manifest's stac)"},
    {"runtime.precision", "the chunks (the probabilities) and the fingerprint"},
    {"model.weights", "model.sha256 (and the fingerprint)"},
    {"model.arch", "model.arch, resolved"},
    {"model.mean", "model.mean, resolved"},
    {"model.std", "model.std, resolved"},
    {"model.classes", "model.classes, resolved"},
    {"model.stem", "model.stem, resolved"},
    {"tiling.tile", "model.tile, resolved"},
    {"tiling.stride", "model.stride, resolved"},
    {"tiling.max_nodata_fraction", "the chunks (which tiles were classified) and the fingerprint"},
};

/* A value for key k unlike its default, as `--set` takes it. */
static const char *other_value(const tw_key *k, char *buf, size_t size)
{
    static const struct {
        const char *path, *value;
    } special[] = {
        {"input.nodata", "-9999"},
        {"input.path", "[a.tif, b/c.vrt]"},
        {"output.products", "[class, prob, confidence, polygons]"},
        {"output.creation_options", "[COMPRESS=LZW, PREDICTOR=2]"},
        {"model.colors", "['#102030', '#a0b0c0']"},
        {"tiling.margin", "4"},
    };
    for (size_t i = 0; i < sizeof special / sizeof *special; i++)
        if (strcmp(k->path, special[i].path) == 0) return special[i].value;
    switch (k->type) {
    case TW_KT_ENUM:
        /* the last word, or the first when the last is the default */
        snprintf(buf, size, "%s",
                 k->def && strcmp(k->def, k->names[k->n_names - 1]) == 0
                     ? k->names[0]
                     : k->names[k->n_names - 1]);
        return buf;
    case TW_KT_NUMBER: snprintf(buf, size, "%.17g", k->lo + 0.375); return buf;
    case TW_KT_STRING:
    case TW_KT_PATH: return "x/y";
    default: return NULL; /* a new kind of key: give it a value above */
    }
}

/* Every key an output byte depends on (TW_KEY_BYTES in core/keys.c's table)
 * reaches a merge: through the manifest's run parameters, where a value
 * unlike the default comes back as the same text (tw_key_format), or from
 * what k_not_in_p names. A byte key added to the table and forgotten in
 * resume.c fails here (a merge would write that product with the default:
 * resume.h's list of carried fields had already fallen behind six keys). */
static void test_every_byte_key_carried(void **state)
{
    (void)state;
    const char *yaml = "input:\n  path: a.tif\nmodel:\n  weights: m.h5\n";
    int carried = 0;
    for (int k = 0; k < TW_KEY_COUNT; k++) {
        const tw_key *key = &tw_keys[k];
        if (!(key->flags & TW_KEY_BYTES)) continue;
        bool elsewhere = false;
        for (size_t i = 0; i < sizeof k_not_in_p / sizeof *k_not_in_p; i++)
            elsewhere = elsewhere || strcmp(key->path, k_not_in_p[i].path) == 0;
        if (elsewhere) continue;
        char vbuf[64], set[256];
        const char *v = other_value(key, vbuf, sizeof vbuf);
        if (!v) fail_msg("%s: no value to try (test_resume.c, other_value)", key->path);
        snprintf(set, sizeof set, "%s=%s", key->path, v);
        const char *sets[] = {set};
        tw_manifest *a = sample(), *b = calloc(1, sizeof *b);
        tw_error err;
        tw_error_init(&err);
        tw_run_params def;
        if (tw_workflow_parse("w", yaml, strlen(yaml), NULL, 0, &def, &err) != TW_OK ||
            tw_workflow_parse("w", yaml, strlen(yaml), sets, 1, &a->p, &err) != TW_OK)
            fail_msg("%s: %s", set, err.msg);
        char want[1024], got[1024], dflt[1024];
        tw_key_format((tw_key_id)k, &a->p, want, sizeof want);
        tw_key_format((tw_key_id)k, &def, dflt, sizeof dflt);
        if (strcmp(want, dflt) == 0) fail_msg("%s: %s is its default", key->path, v);
        size_t len;
        char *text = format(a, &len);
        char msg[TW_ERROR_MSG_MAX];
        if (parse(text, len, b, msg) != TW_OK) fail_msg("%s: %s", set, msg);
        tw_key_format((tw_key_id)k, &b->p, got, sizeof got);
        if (strcmp(want, got) != 0)
            fail_msg("%s: the manifest gave back %s for %s: a merge would write the products "
                     "with it",
                     key->path, got, want);
        carried++;
        free(text);
        free(a);
        free(b);
    }
    print_message("%d byte keys carried by the manifest\n", carried);
    assert_true(carried >= 12);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),      cmocka_unit_test(test_key_order),
        cmocka_unit_test(test_other_versions), cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_truncated),      cmocka_unit_test(test_every_byte_key_carried),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
