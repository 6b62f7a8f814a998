/* test_input_changed.c - an input of a list replaced while the run is on an
 * earlier one (issue 39): the run recorded every input's geometry and
 * identity before its first tile, and checks them again when the input's
 * turn comes. The progress callback of the C API replaces the second input
 * while the first one's tiles are reported.
 *
 * Before: the second input was read with the geometry recorded before the
 * first ran; a smaller raster in its place overflowed the reader's buffer
 * (ASan: heap-buffer-overflow in cut_tile), and one of the same geometry was
 * classified unchecked (exit 0). Now: exit 6 (TILEWISE_ERR_PARTS, as a resume
 * of a replaced raster), one message naming the second input and what
 * changed, now and when the run began; the first input's products are
 * written. Runs under ASan (make test's sanitizer pass).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <gdal.h>
#include <gdal_utils.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testutil.h"
#include "tilewise.h"

#define SRC TW_SOURCE_DIR

/* path: the sample raster resampled to w x h; scaled: its values reversed
 * (255 - v), so that the same geometry holds other pixels. */
static void make_raster(const char *path, int w, int h, bool reversed)
{
    GDALAllRegister();
    char ws[16], hs[16];
    snprintf(ws, sizeof ws, "%d", w);
    snprintf(hs, sizeof hs, "%d", h);
    char *argv[] = {"-q",
                    "-outsize",
                    ws,
                    hs,
                    "-r",
                    "bilinear",
                    "-scale",
                    "0",
                    "255",
                    reversed ? "255" : "0",
                    reversed ? "0" : "255",
                    NULL};
    GDALTranslateOptions *o = GDALTranslateOptionsNew(argv, NULL);
    assert_non_null(o);
    GDALDatasetH src = GDALOpen(SRC "/sample_data/L7_ETMs.tif", GA_ReadOnly);
    assert_non_null(src);
    GDALDatasetH dst = GDALTranslate(path, src, o, NULL);
    assert_non_null(dst);
    GDALClose(dst);
    GDALClose(src);
    GDALTranslateOptionsFree(o);
}

typedef struct swap {
    const char *first, *target, *replacement;
    int swapped;
} swap;

/* While the first input's tiles are reported (past 0, before its end),
 * replace the second input, once. */
static int on_progress(double complete, const char *message, void *user)
{
    swap *s = user;
    if (!s->swapped && complete > 0.0 && complete < 1.0 && strstr(message, s->first)) {
        assert_int_equal(rename(s->replacement, s->target), 0);
        s->swapped = 1;
    }
    return 1;
}

static void run_with_swap(int other_w, int other_h, bool reversed, const char *changed)
{
    const char *dir = tw_test_tmpdir();
    assert_non_null(dir);
    char first[4200], second[4200], other[4200], out[4200], yaml[16384];
    snprintf(first, sizeof first, "%s/first.tif", dir);
    snprintf(second, sizeof second, "%s/second.tif", dir);
    snprintf(other, sizeof other, "%s/other.tif", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    make_raster(first, 640, 640, false); /* 361 tiles: many progress reports */
    make_raster(second, 349, 352, false);
    make_raster(other, other_w, other_h, reversed);
    snprintf(yaml, sizeof yaml,
             "input:\n  path: [%s, %s]\nmodel:\n  weights: %s/sample_data/demo_resnet18.h5\n"
             "tiling:\n  stride: 32\n  batch: 4\nruntime:\n  device: cpu\n  memory: 1GiB\n"
             "output:\n  dir: %s\n  products: [class]\n",
             first, second, SRC, out);
    tilewise_run_options o;
    tilewise_run_options_init(&o);
    o.yaml = yaml;
    o.yaml_len = strlen(yaml);
    o.quiet = 1;
    swap s = {.first = "first.tif", .target = second, .replacement = other};
    o.progress = on_progress;
    o.user = &s;
    tilewise_error e;
    tilewise_status st = tilewise_run("<changed>", &o, NULL, &e);
    printf("%s -> %s: %s\n", other, second, e.message);
    assert_int_equal(s.swapped, 1);
    assert_int_equal(st, TILEWISE_ERR_PARTS);
    assert_int_equal(e.exit_code, 6);
    assert_non_null(strstr(e.message, second));
    assert_non_null(strstr(e.message, "changed after the run began"));
    assert_non_null(strstr(e.message, changed));
    assert_non_null(strstr(e.message, "when the run began"));
    /* the first input was finished before the second's turn */
    char cls[4300];
    snprintf(cls, sizeof cls, "%s/first.class.tif", out);
    assert_true(tw_test_file_exists(cls));
    snprintf(cls, sizeof cls, "%s/second.class.tif", out);
    assert_false(tw_test_file_exists(cls));
}

/* Another size: before, a heap-buffer-overflow in the reader. */
static void test_replaced_by_other_size(void **state)
{
    (void)state;
    run_with_swap(200, 180, false, "raster[");
}

/* The same size and type, other pixels: before, classified unchecked. */
static void test_replaced_same_geometry(void **state)
{
    (void)state;
    run_with_swap(349, 352, true, "content[");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replaced_by_other_size),
        cmocka_unit_test(test_replaced_same_geometry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
