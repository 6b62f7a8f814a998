/* test_keys.c - the one table of workflow keys (core/keys.h) against the
 * places that must agree with it:
 *   - the table itself: sections, words, a reason for every key that does
 *     not enter the fingerprint;
 *   - the parser: every key's value, written by tw_key_format, given back
 *     with --set, reads as the same value (so every key has a setter and the
 *     text the fingerprint and refusals show is what a user would type);
 *   - workflows/KEYS.md: one row per key, no row for a key the table lacks,
 *     every word of an enum key and the table's default in its row;
 *   - the fingerprint: a change of any TW_KEY_BYTES key changes it, names the
 *     key (tw_parts_fingerprint_diff), and a change of any other key does not.
 */
#include <math.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/keys.h"
#include "pipeline/store/parts.h"
#include "tests/testutil.h"
#include "config/workflow.h"

/* A workflow that gives every key a value other than its default. */
static const char k_every[] = "input:\n"
                              "  path: [a.tif, \"dir with space/b.vrt\"]\n"
                              "  bands: [4, 3, 2]\n"
                              "  scale: 0.0001\n"
                              "  nodata: -9999.5\n"
                              "  on_error: skip\n"
                              "  assets: [B04, B03, B02]\n"
                              "  retries: 3\n"
                              "  retry_delay: 0.25\n"
                              "  aoi: \"area #1.gpkg\"\n"
                              "  datetime: \"2021-06-01T10:30:00.25+02:00\"\n"
                              "model:\n"
                              "  weights: models/r50.safetensors\n"
                              "  arch: ResNet50\n"
                              "  mean: [0.1, 0.2, 0.3]\n"
                              "  std: [1.5, 2, 2.5e-1]\n"
                              "  classes: [water, 'forest: dense', \"say \\\"hi\\\"\"]\n"
                              "  colors: ['#0072bd', '#abc', '#ffffff']\n"
                              "tiling:\n"
                              "  tile: 128\n"
                              "  stride: 32\n"
                              "  batch: 48\n"
                              "  edge: shift\n"
                              "  max_nodata_fraction: 0.25\n"
                              "runtime:\n"
                              "  device: cuda:1\n"
                              "  precision: bf16\n"
                              "  memory: 1.5GiB\n"
                              "  threads: 12\n"
                              "  readers: 3\n"
                              "output:\n"
                              "  dir: out/land cover\n"
                              "  name: \"{stem}_{index}\"\n"
                              "  stac: yes\n"
                              "  products: [class, confidence, embeddings, tiles_gpkg]\n"
                              "  prob_type: uint8\n"
                              "  resolution: input\n"
                              "  format: cog\n"
                              "  creation_options: [COMPRESS=ZSTD, \"ZSTD_LEVEL=9\"]\n"
                              "  vector_format: fgb\n"
                              "  min_area: 900\n"
                              "  simplify: 12.5\n";

static tw_run_params parse_ok(const char *text, const char *const *sets, int n_sets)
{
    tw_run_params p;
    tw_error err;
    tw_error_init(&err);
    tw_status st = tw_workflow_parse("flow.yaml", text, strlen(text), sets, n_sets, &p, &err);
    if (st != TW_OK) fail_msg("parse: %s", err.msg);
    return p;
}

static void table_is_whole(void **state)
{
    (void)state;
    for (int k = 0; k < TW_KEY_COUNT; k++) {
        const tw_key *key = &tw_keys[k];
        assert_non_null(key->path);
        assert_true(tw_key_section((tw_key_id)k) >= 0);
        assert_int_equal(tw_key_find(key->path), k);
        assert_true(strlen(tw_key_leaf((tw_key_id)k)) > 0);
        if (!(key->flags & TW_KEY_BYTES) && !(key->why && *key->why))
            fail_msg("%s: neither TW_KEY_BYTES nor a reason why no output byte depends on it",
                     key->path);
        if (key->type == TW_KT_ENUM) {
            assert_non_null(key->names);
            assert_true(key->n_names > 0);
        }
        /* sections in table order: each key's section is its predecessor's or the next */
        if (k > 0) assert_true(tw_key_section((tw_key_id)k) >= tw_key_section((tw_key_id)(k - 1)));
    }
    assert_int_equal(tw_key_find("tiling.strides"), -1);
    /* the product words are core/products.h's table: row i is bit i, each
     * word once, each file suffix once */
    const tw_key *prod = &tw_keys[TW_KEY_OUTPUT_PRODUCTS];
    assert_int_equal(prod->type, TW_KT_ENUMS);
    assert_int_equal(prod->n_names, TW_PRODUCT_COUNT);
    for (int i = 0; i < TW_PRODUCT_COUNT; i++) {
        const tw_product *r = &tw_products[i];
        assert_int_equal(r->bit, 1u << i);
        assert_ptr_equal(tw_product_of(r->bit), r);
        assert_int_equal(r->suffix == NULL, r->kind == TW_PRODUCT_IN_TABLE);
        for (int j = 0; j < i; j++) {
            assert_string_not_equal(r->word, tw_products[j].word);
            if (r->suffix && tw_products[j].suffix)
                assert_string_not_equal(r->suffix, tw_products[j].suffix);
        }
    }
    /* file order: the rasters (class, prob, conf, emb), the table, the vectors */
    const tw_product *files[TW_PRODUCT_COUNT];
    int nf = tw_product_files(files);
    assert_int_equal(nf, TW_PRODUCT_COUNT - 1);
    static const char *const order[] = {".class.tif", ".prob.tif",   ".conf.tif",  ".emb.tif",
                                        ".tiles.h5",  ".tiles.gpkg", ".class.gpkg"};
    for (int i = 0; i < nf; i++) assert_string_equal(files[i]->suffix, order[i]);
    assert_int_equal(tw_products_with_implied(TW_PRODUCT_EMB), TW_PRODUCT_EMB | TW_PRODUCT_TILES);
    assert_int_equal(tw_products_needing_head(), TW_PRODUCT_CLASS | TW_PRODUCT_PROB |
                                                     TW_PRODUCT_CONF | TW_PRODUCT_TILES |
                                                     TW_PRODUCT_TILES_GPKG | TW_PRODUCT_POLYGONS);
    assert_string_equal(tw_keys[TW_KEY_TILING_EDGE].names[TW_EDGE_SHIFT], "shift");
    assert_string_equal(tw_keys[TW_KEY_RUNTIME_PRECISION].names[TW_PREC_INT8], "int8");
    assert_string_equal(tw_keys[TW_KEY_OUTPUT_FORMAT].names[TW_FORMAT_COG], "COG");
    assert_string_equal(tw_keys[TW_KEY_OUTPUT_RESOLUTION].names[TW_RESOLUTION_INPUT], "input");
}

/* Every key's text, given back with --set onto the defaults, reads as the
 * same value: for the non-default workflow and for the defaults. */
static void format_round_trips(void **state)
{
    (void)state;
    static const char minimal[] = "input:\n  path: a.tif\nmodel:\n  weights: m.h5\n";
    const char *texts[2] = {k_every, minimal};
    for (int t = 0; t < 2; t++) {
        tw_run_params p = parse_ok(texts[t], NULL, 0);
        for (int k = 0; k < TW_KEY_COUNT; k++) {
            char text[8192], set[8400], back[8192];
            tw_key_format((tw_key_id)k, &p, text, sizeof text);
            /* values left to the bundle have no text of their own to --set */
            if (strcmp(text, "auto") == 0 && (tw_keys[k].flags & TW_KEY_RESOLVED)) continue;
            if (strcmp(text, "all") == 0 && k == TW_KEY_INPUT_BANDS) continue;
            if (strcmp(text, "nan") == 0 && k == TW_KEY_INPUT_SCALE) continue;
            if (strcmp(text, "[]") == 0 &&
                (k == TW_KEY_MODEL_MEAN || k == TW_KEY_MODEL_STD || k == TW_KEY_MODEL_CLASSES ||
                 k == TW_KEY_MODEL_COLORS || k == TW_KEY_INPUT_ASSETS))
                continue;
            if (strcmp(text, "\"\"") == 0 && (k == TW_KEY_INPUT_AOI || k == TW_KEY_INPUT_DATETIME))
                continue;
            snprintf(set, sizeof set, "%s=%s", tw_keys[k].path, text);
            const char *sets[1] = {set};
            /* mean and std must agree in length: give both */
            char other[8400];
            const char *sets2[2] = {set, other};
            int n = 1;
            if (k == TW_KEY_MODEL_MEAN || k == TW_KEY_MODEL_STD) {
                tw_key_id o = k == TW_KEY_MODEL_MEAN ? TW_KEY_MODEL_STD : TW_KEY_MODEL_MEAN;
                char ot[8192];
                tw_key_format(o, &p, ot, sizeof ot);
                snprintf(other, sizeof other, "%s=%s", tw_keys[o].path, ot);
                n = 2;
            }
            tw_run_params q = parse_ok(k_every, n == 1 ? sets : sets2, n);
            tw_key_format((tw_key_id)k, &q, back, sizeof back);
            if (strcmp(text, back) != 0)
                fail_msg("%s: '%s' read back as '%s'", tw_keys[k].path, text, back);
        }
    }
    /* the text is exact: 17 digits for doubles, 9 for floats */
    tw_run_params p = parse_ok(k_every, NULL, 0);
    char text[256];
    tw_key_format(TW_KEY_INPUT_SCALE, &p, text, sizeof text);
    assert_string_equal(text, "0.0001");
    tw_key_format(TW_KEY_MODEL_CLASSES, &p, text, sizeof text);
    assert_string_equal(text, "[water, \"forest: dense\", \"say \\\"hi\\\"\"]");
    tw_key_format(TW_KEY_OUTPUT_PRODUCTS, &p, text, sizeof text);
    assert_string_equal(text, "[class, confidence, embeddings, tiles, tiles_gpkg]");
    /* too small a buffer: cut, terminated, the needed length returned */
    char small[4];
    size_t n = tw_key_format(TW_KEY_MODEL_CLASSES, &p, small, sizeof small);
    assert_true(n > sizeof small);
    assert_int_equal(strlen(small), sizeof small - 1);
}

/* KEYS.md's rows: "| `section.key` | value | default |" (the two-cell
 * rows of "Not compared" are not key rows). */
typedef struct md_row {
    char key[80];
    const char *line; /* into the file's text */
    size_t len;
} md_row;

static int md_rows(const char *text, md_row *rows, int max)
{
    int n = 0;
    for (const char *l = text; l && *l;) {
        const char *nl = strchr(l, '\n');
        size_t len = nl ? (size_t)(nl - l) : strlen(l);
        int cells = 0; /* key rows have three cells: key, value, default */
        for (size_t i = 0; i < len; i++) cells += l[i] == '|';
        if (strncmp(l, "| `", 3) == 0 && cells >= 4) {
            const char *e = memchr(l + 3, '`', len - 3);
            if (e && memchr(l + 3, '.', (size_t)(e - l - 3)) && n < max) {
                snprintf(rows[n].key, sizeof rows[n].key, "%.*s", (int)(e - l - 3), l + 3);
                rows[n].line = l;
                rows[n].len = len;
                n++;
            }
        }
        l = nl ? nl + 1 : NULL;
    }
    return n;
}

/* The row's last cell (its default). */
static void last_cell(const md_row *r, char *buf, size_t size)
{
    const char *end = r->line + r->len;
    while (end > r->line && (end[-1] == ' ' || end[-1] == '|')) end--;
    const char *start = end;
    while (start > r->line && start[-1] != '|') start--;
    snprintf(buf, size, "%.*s", (int)(end - start), start);
}

static void keys_md_agrees(void **state)
{
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s/workflows/KEYS.md", TW_SOURCE_DIR);
    char *text = tw_test_read_file(path, NULL);
    assert_non_null(text);
    static md_row rows[256];
    int n = md_rows(text, rows, 256);
    for (int i = 0; i < n; i++)
        if (tw_key_find(rows[i].key) < 0)
            fail_msg("KEYS.md documents %s, which core/keys.h does not know", rows[i].key);
    for (int k = 0; k < TW_KEY_COUNT; k++) {
        const tw_key *key = &tw_keys[k];
        const md_row *r = NULL;
        for (int i = 0; i < n; i++)
            if (strcmp(rows[i].key, key->path) == 0) {
                if (r) fail_msg("KEYS.md has two rows for %s", key->path);
                r = &rows[i];
            }
        if (!r) fail_msg("KEYS.md has no row for %s (core/keys.h)", key->path);
        char row[4096];
        snprintf(row, sizeof row, "%.*s", (int)r->len, r->line);
        for (int w = 0; w < key->n_names; w++) {
            char word[80];
            snprintf(word, sizeof word, "`%s`", tw_key_word((tw_key_id)k, w));
            if (!strstr(row, word))
                fail_msg("KEYS.md's row for %s does not name %s", key->path, word);
        }
        if (key->def) {
            char cell[1024], want[128];
            last_cell(r, cell, sizeof cell);
            snprintf(want, sizeof want, "`%s`", key->def);
            if (!strstr(cell, want))
                fail_msg("KEYS.md's default for %s is '%s', core/keys.h says %s", key->path, cell,
                         want);
            /* and the table's default is what the parser starts from */
            static const char minimal[] = "input:\n  path: a.tif\nmodel:\n  weights: m.h5\n";
            char set[256], a[1024], b[1024];
            snprintf(set, sizeof set, "%s=%s", key->path, key->def);
            const char *sets[1] = {set};
            tw_run_params d = parse_ok(minimal, NULL, 0), q = parse_ok(minimal, sets, 1);
            tw_key_format((tw_key_id)k, &d, a, sizeof a);
            tw_key_format((tw_key_id)k, &q, b, sizeof b);
            if (strcmp(a, b) != 0)
                fail_msg("%s: the default is %s but core/keys.h says %s", key->path, a, key->def);
        }
    }
    /* "What resumed runs ... compare": the compared list is exactly the
     * TW_KEY_BYTES keys, the "Not compared" table exactly the others */
    const char *cmp = strstr(text, "\nCompared: ");
    const char *notc = cmp ? strstr(cmp, "\nNot compared:") : NULL;
    assert_non_null(cmp);
    assert_non_null(notc);
    const char *end = strstr(notc, "\n## ");
    if (!end) end = notc + strlen(notc);
    for (int k = 0; k < TW_KEY_COUNT; k++) {
        char word[80];
        snprintf(word, sizeof word, "`%s`", tw_keys[k].path);
        const char *at = strstr(cmp, word);
        bool in_cmp = at && at < notc;
        bool in_not = at && at > notc && at < end;
        if (!in_cmp && !in_not) {
            at = strstr(notc, word);
            in_not = at && at < end;
        }
        if ((tw_keys[k].flags & TW_KEY_BYTES) && !in_cmp)
            fail_msg("KEYS.md does not list %s as compared", tw_keys[k].path);
        if (!(tw_keys[k].flags & TW_KEY_BYTES) && (in_cmp || !in_not))
            fail_msg("KEYS.md should list %s under Not compared", tw_keys[k].path);
    }
    free(text);
}

/* Changing any key by --set of another valid value: the fingerprint differs
 * exactly when the key is TW_KEY_BYTES, and the diff names it. */
static void fingerprint_covers_bytes_keys(void **state)
{
    (void)state;
    static const char *const changes[TW_KEY_COUNT] = {
        [TW_KEY_INPUT_PATH] = "c.tif",
        [TW_KEY_INPUT_BANDS] = "[1, 2, 3]",
        [TW_KEY_INPUT_SCALE] = "0.001",
        [TW_KEY_INPUT_NODATA] = "auto",
        [TW_KEY_INPUT_ON_ERROR] = "fail",
        [TW_KEY_INPUT_ASSETS] = "[B08, B03, B02]",
        [TW_KEY_INPUT_RETRIES] = "4",
        [TW_KEY_INPUT_RETRY_DELAY] = "1",
        [TW_KEY_INPUT_TIMEOUT] = "60",
        [TW_KEY_INPUT_AOI] = "other.gpkg",
        [TW_KEY_INPUT_DATETIME] = "2020-01-01T00:00:00Z",
        [TW_KEY_MODEL_WEIGHTS] = "other.h5",
        [TW_KEY_MODEL_ARCH] = "resnet101",
        [TW_KEY_MODEL_MEAN] = "[0.1, 0.2, 0.4]",
        [TW_KEY_MODEL_STD] = "[1.5, 2, 0.5]",
        [TW_KEY_MODEL_CLASSES] = "[water, forest, town]",
        [TW_KEY_MODEL_COLORS] = "['#0072bd', '#abc', '#fffffe']",
        [TW_KEY_MODEL_STEM] = "small",
        [TW_KEY_TILING_TILE] = "64",
        [TW_KEY_TILING_STRIDE] = "16",
        [TW_KEY_TILING_BATCH] = "auto",
        [TW_KEY_TILING_EDGE] = "skip",
        [TW_KEY_TILING_MAX_NODATA_FRACTION] = "0.5",
        [TW_KEY_TILING_BLEND] = "cosine",
        [TW_KEY_TILING_MARGIN] = "4",
        [TW_KEY_RUNTIME_DEVICE] = "cpu",
        [TW_KEY_RUNTIME_PRECISION] = "fp32",
        [TW_KEY_RUNTIME_MEMORY] = "1GiB",
        [TW_KEY_RUNTIME_THREADS] = "2",
        [TW_KEY_RUNTIME_READERS] = "auto",
        [TW_KEY_OUTPUT_DIR] = "elsewhere",
        [TW_KEY_OUTPUT_NAME] = "\"{parent}-{stem}\"",
        [TW_KEY_OUTPUT_STAC] = "false",
        [TW_KEY_OUTPUT_PRODUCTS] = "[class, prob]",
        [TW_KEY_OUTPUT_PROB_TYPE] = "float32",
        [TW_KEY_OUTPUT_EMBEDDING_TYPE] = "int8",
        [TW_KEY_OUTPUT_RESOLUTION] = "cells",
        [TW_KEY_OUTPUT_FORMAT] = "GTiff",
        [TW_KEY_OUTPUT_CREATION_OPTIONS] = "[COMPRESS=LZW]",
        [TW_KEY_OUTPUT_VECTOR_FORMAT] = "gpkg",
        [TW_KEY_OUTPUT_MIN_AREA] = "0",
        [TW_KEY_OUTPUT_SIMPLIFY] = "30",
    };
    tw_run_params p = parse_ok(k_every, NULL, 0);
    static char a[TW_FINGERPRINT_MAX], b[TW_FINGERPRINT_MAX];
    tw_key_format_lines(&p, TW_KEY_BYTES, a, sizeof a);
    for (int k = 0; k < TW_KEY_COUNT; k++) {
        if (!changes[k]) fail_msg("%s: no other value to try (add one)", tw_keys[k].path);
        char set[256];
        snprintf(set, sizeof set, "%s=%s", tw_keys[k].path, changes[k]);
        const char *sets[1] = {set};
        tw_run_params q = parse_ok(k_every, sets, 1);
        char before[1024], after[1024];
        tw_key_format((tw_key_id)k, &p, before, sizeof before);
        tw_key_format((tw_key_id)k, &q, after, sizeof after);
        if (strcmp(before, after) == 0) fail_msg("%s: '%s' changes nothing", tw_keys[k].path, set);
        tw_key_format_lines(&q, TW_KEY_BYTES, b, sizeof b);
        char diff[2048];
        int nd = tw_parts_fingerprint_diff(b, a, diff, sizeof diff);
        if (tw_keys[k].flags & TW_KEY_BYTES) {
            assert_int_equal(nd, 1);
            char want[1200];
            snprintf(want, sizeof want, "%s: %.80s", tw_keys[k].path, after);
            if (!strstr(diff, want))
                fail_msg("%s: diff '%s' lacks '%s'", tw_keys[k].path, diff, want);
        } else {
            assert_int_equal(nd, 0);
        }
    }
}

/* The one stride message: the parser's (given tile) and the run's (the
 * bundle's tile) are this text. */
static void stride_message(void **state)
{
    (void)state;
    char msg[256] = "untouched";
    assert_int_equal(tw_key_check_stride(64, 32, NULL, msg, sizeof msg), 0);
    assert_int_equal(tw_key_check_stride(64, 64, NULL, msg, sizeof msg), 0);
    assert_int_equal(tw_key_check_stride(64, 1, NULL, msg, sizeof msg), 0);
    assert_string_equal(msg, "untouched");
    assert_int_equal(tw_key_check_stride(64, 48, NULL, msg, sizeof msg), -1);
    assert_string_equal(msg, "48 does not divide tile 64 (expected a divisor such as 32)");
    /* the divisor offered is at most the stride asked */
    assert_int_equal(tw_key_check_stride(64, 24, "the model bundle's tile size", msg, sizeof msg),
                     -1);
    assert_string_equal(msg, "24 does not divide tile 64 (the model bundle's tile size) (expected "
                             "a divisor such as 16)");
    assert_int_equal(tw_key_check_stride(96, 40, NULL, msg, sizeof msg), -1);
    assert_string_equal(msg, "40 does not divide tile 96 (expected a divisor such as 24)");
    assert_int_equal(tw_key_check_stride(64, 96, "tiling.tile", msg, sizeof msg), -1);
    assert_string_equal(msg, "96 is larger than tile 64 (tiling.tile) (expected 1..tile)");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(table_is_whole), cmocka_unit_test(format_round_trips),
        cmocka_unit_test(keys_md_agrees), cmocka_unit_test(fingerprint_covers_bytes_keys),
        cmocka_unit_test(stride_message),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
