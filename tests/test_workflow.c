/* test_workflow.c - the YAML workflow parser: every key into tw_run_params,
 * defaults, --set overrides, tw_parse_bytes, and one clear error (file, line,
 * key) for each kind of bad input, plus a mutation fuzz loop that must never
 * crash or leak. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/testutil.h"
#include "config/workflow.h"

/* Every key, one per line; line numbers below refer to this text. */
static const char k_good[] =
    "# a workflow with every key\n"                                   /* 1 */
    "input:\n"                                                        /* 2 */
    "  path: [a.tif, \"dir with space/b.vrt\"]\n"                     /* 3 */
    "  bands: [4, 3, 2]\n"                                            /* 4 */
    "  scale: 0.0001\n"                                               /* 5 */
    "  nodata: -9999\n"                                               /* 6 */
    "  on_error: skip\n"                                              /* 7 */
    "model:\n"                                                        /* 8 */
    "  weights: models/r50.safetensors\n"                             /* 9 */
    "  arch: ResNet50\n"                                              /* 10 */
    "  mean: [0.1, 0.2, 0.3]\n"                                       /* 11 */
    "  std: [1.5, 2, 2.5e-1]\n"                                       /* 12 */
    "  classes:\n"                                                    /* 13 */
    "    - water\n"                                                   /* 14 */
    "    - 'forest: dense'\n"                                         /* 15 */
    "    - urban\n"                                                   /* 16 */
    "tiling:\n"                                                       /* 17 */
    "  tile: 128\n"                                                   /* 18 */
    "  stride: 32\n"                                                  /* 19 */
    "  batch: 48\n"                                                   /* 20 */
    "  edge: shift\n"                                                 /* 21 */
    "  max_nodata_fraction: 0.25\n"                                   /* 22 */
    "runtime:\n"                                                      /* 23 */
    "  device: cuda:1\n"                                              /* 24 */
    "  precision: bf16\n"                                             /* 25 */
    "  memory: 1.5GiB\n"                                              /* 26 */
    "  threads: 12\n"                                                 /* 27 */
    "output:\n"                                                       /* 28 */
    "  dir: out/landcover\n"                                          /* 29 */
    "  products: [class, prob, confidence, embeddings, tiles_gpkg]\n" /* 30 */
    "  prob_type: uint8\n"                                            /* 31 */
    "  format: cog\n"                                                 /* 32 */
    "  creation_options: [COMPRESS=DEFLATE, \"PREDICTOR=2\"]\n";      /* 33 */

static tw_status parse(const char *text, const char *const *sets, int n_sets, tw_run_params *p,
                       tw_error *err)
{
    tw_error_init(err);
    return tw_workflow_parse("flow.yaml", text, strlen(text), sets, n_sets, p, err);
}

static void write_file(const char *path, const char *text, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static void test_good_file(void **state)
{
    (void)state;
    tw_run_params p;
    tw_error err;
    assert_int_equal(parse(k_good, NULL, 0, &p, &err), TW_OK);
    assert_int_equal(p.input.n_paths, 2);
    assert_string_equal(p.input.paths[0], "a.tif");
    assert_string_equal(p.input.paths[1], "dir with space/b.vrt");
    assert_int_equal(p.input.n_bands, 3);
    assert_int_equal(p.input.bands[0], 4);
    assert_int_equal(p.input.bands[1], 3);
    assert_int_equal(p.input.bands[2], 2);
    assert_true(p.input.scale == 0.0001);
    assert_false(p.input.nodata_auto);
    assert_true(p.input.nodata == -9999.0);
    assert_int_equal(p.input.on_error, TW_ON_ERROR_SKIP);

    assert_string_equal(p.model.weights, "models/r50.safetensors");
    assert_string_equal(p.model.arch, "resnet50");
    assert_int_equal(p.model.n_mean, 3);
    assert_true(p.model.mean[0] == 0.1f && p.model.mean[1] == 0.2f && p.model.mean[2] == 0.3f);
    assert_int_equal(p.model.n_std, 3);
    assert_true(p.model.std[0] == 1.5f && p.model.std[1] == 2.0f && p.model.std[2] == 0.25f);
    assert_int_equal(p.model.n_classes, 3);
    assert_string_equal(p.model.classes[0], "water");
    assert_string_equal(p.model.classes[1], "forest: dense");
    assert_string_equal(p.model.classes[2], "urban");

    assert_int_equal(p.tiling.tile, 128);
    assert_int_equal(p.tiling.stride, 32);
    assert_int_equal(p.tiling.batch, 48);
    assert_int_equal(p.tiling.edge, TW_EDGE_SHIFT);
    assert_true(p.tiling.max_nodata_fraction == 0.25);

    assert_string_equal(p.runtime.device, "cuda:1");
    assert_int_equal(p.runtime.precision, TW_PREC_BF16);
    assert_int_equal(p.runtime.memory, (size_t)3 << 29);
    assert_int_equal(p.runtime.threads, 12);

    assert_string_equal(p.output.dir, "out/landcover");
    assert_int_equal(p.output.products, TW_PRODUCT_CLASS | TW_PRODUCT_PROB | TW_PRODUCT_CONF |
                                            TW_PRODUCT_EMB | TW_PRODUCT_TILES |
                                            TW_PRODUCT_TILES_GPKG);
    assert_int_equal(p.output.prob_type, TW_PROB_UINT8);
    assert_int_equal(p.output.format, TW_FORMAT_COG);
    assert_int_equal(p.output.n_creation_options, 2);
    assert_string_equal(p.output.creation_options[0], "COMPRESS=DEFLATE");
    assert_string_equal(p.output.creation_options[1], "PREDICTOR=2");
    assert_string_equal(p.workflow_path, "flow.yaml");
    assert_int_equal(p.shard_count, 1);
}

static void test_defaults(void **state)
{
    (void)state;
    tw_run_params p;
    tw_error err;
    const char *text = "input: {path: scene.tif}\nmodel:\n  weights: m.h5\ntiling:\nruntime: ~\n";
    assert_int_equal(parse(text, NULL, 0, &p, &err), TW_OK);
    tw_run_params d = tw_run_default_params();
    assert_int_equal(p.input.n_paths, 1);
    assert_string_equal(p.input.paths[0], "scene.tif");
    assert_string_equal(p.model.weights, "m.h5");
    assert_int_equal(p.input.n_bands, 0);
    assert_true(isnan(p.input.scale));
    assert_true(p.input.nodata_auto);
    assert_int_equal(p.input.on_error, d.input.on_error);
    assert_string_equal(p.model.arch, "");
    assert_int_equal(p.model.n_mean, 0);
    assert_int_equal(p.model.n_std, 0);
    assert_int_equal(p.model.n_classes, 0);
    assert_int_equal(p.tiling.tile, 0);
    assert_int_equal(p.tiling.stride, 0);
    assert_int_equal(p.tiling.batch, 0);
    assert_int_equal(p.tiling.edge, TW_EDGE_PAD);
    assert_true(p.tiling.max_nodata_fraction == 0.5);
    assert_string_equal(p.runtime.device, "auto");
    assert_int_equal(p.runtime.precision, TW_PREC_FP32);
    assert_int_equal(p.runtime.memory, (size_t)2 << 30);
    assert_int_equal(p.runtime.threads, 0);
    assert_string_equal(p.output.dir, d.output.dir);
    assert_int_equal(p.output.products, TW_PRODUCT_CLASS | TW_PRODUCT_PROB);
    assert_int_equal(p.output.prob_type, TW_PROB_FLOAT32);
    assert_int_equal(p.output.format, TW_FORMAT_GTIFF);
    assert_int_equal(p.output.n_creation_options, 0);

    /* "auto" spellings and the nan nodata map onto the documented values */
    const char *autos =
        "input: {path: a.tif, nodata: nan}\nmodel: {weights: m.h5}\n"
        "tiling: {batch: AUTO}\nruntime: {threads: auto, device: CPU, memory: 17179869184}\n";
    assert_int_equal(parse(autos, NULL, 0, &p, &err), TW_OK);
    assert_false(p.input.nodata_auto);
    assert_true(isnan(p.input.nodata));
    assert_int_equal(p.tiling.batch, 0);
    assert_int_equal(p.runtime.threads, 0);
    assert_string_equal(p.runtime.device, "cpu");
    assert_int_equal(p.runtime.memory, (size_t)16 << 30);
}

static void test_overrides(void **state)
{
    (void)state;
    tw_run_params p;
    tw_error err;
    const char *sets[] = {
        "tiling.tile=32",     /* scalar */
        "tiling.stride = 16", /* spaces around the key */
        "input.bands=[6, 5]", /* list replaces the file's */
        "model.mean=[1, 2]",
        "model.std=[3,4]",
        "output.products=[prob]",
        "input.path=[x.tif, y.tif, z.tif]", /* nested list of strings */
        "output.creation_options=[]",       /* empty list clears */
        "runtime.memory=64MiB",
        "model.classes=[a, b, c, d]",
        "input.nodata=auto",
        "tiling.stride=8", /* the last one wins */
    };
    assert_int_equal(parse(k_good, sets, (int)(sizeof sets / sizeof sets[0]), &p, &err), TW_OK);
    assert_int_equal(p.tiling.tile, 32);
    assert_int_equal(p.tiling.stride, 8);
    assert_int_equal(p.input.n_bands, 2);
    assert_int_equal(p.input.bands[0], 6);
    assert_int_equal(p.input.bands[1], 5);
    assert_true(p.model.mean[1] == 2.0f && p.model.std[1] == 4.0f);
    assert_int_equal(p.output.products, TW_PRODUCT_PROB);
    assert_int_equal(p.input.n_paths, 3);
    assert_string_equal(p.input.paths[2], "z.tif");
    assert_int_equal(p.output.n_creation_options, 0);
    assert_int_equal(p.runtime.memory, (size_t)64 << 20);
    assert_int_equal(p.model.n_classes, 4);
    assert_string_equal(p.model.classes[3], "d");
    assert_true(p.input.nodata_auto);
    /* keys not overridden keep the file's values */
    assert_int_equal(p.tiling.batch, 48);
    assert_string_equal(p.runtime.device, "cuda:1");

    /* an override can supply a required key */
    const char *w[] = {"model.weights=other.h5"};
    assert_int_equal(parse("input: {path: a.tif}\n", w, 1, &p, &err), TW_OK);
    assert_string_equal(p.model.weights, "other.h5");

    /* an override goes through the cross-key checks too, and the message says so */
    const char *bad[] = {"tiling.stride=48"};
    assert_int_equal(parse(k_good, bad, 1, &p, &err), TW_ERR_CONFIG);
    assert_string_equal(
        err.msg,
        "--set tiling.stride: 48 does not divide tile 128 (expected a divisor such as 32)");

    /* a failed parse leaves *out alone */
    memset(&p, 0x5A, sizeof p);
    tw_run_params before = p;
    const char *bad2[] = {"tiling.tile=7"};
    assert_int_equal(parse(k_good, bad2, 1, &p, &err), TW_ERR_CONFIG);
    assert_memory_equal(&p, &before, sizeof p);
}

/* One bad workflow: the status must be TW_ERR_CONFIG and the message must
 * contain every needle (file:line, key path, what is wrong). */
typedef struct bad_case {
    const char *yaml;
    const char *set; /* one --set, or NULL */
    const char *needles[4];
} bad_case;

#define BASE "input:\n  path: a.tif\nmodel:\n  weights: m.h5\n" /* lines 1-4 */

static const bad_case k_bad[] = {
    /* unknown key, closest known one suggested */
    {"input:\n  path: a.tif\n  bandz: [1, 2]\nmodel: {weights: m.h5}\n",
     NULL,
     {"flow.yaml:3: input.bandz: unknown key (did you mean input.bands?)"}},
    {BASE "modle:\n  arch: resnet18\n",
     NULL,
     {"flow.yaml:5: modle: unknown key (did you mean model?)"}},
    {"input:\n  path: a.tif\n  tile: 64\nmodel: {weights: m.h5}\n",
     NULL,
     {"flow.yaml:3: input.tile: unknown key (did you mean tiling.tile?)"}},
    {BASE "output:\n  xyzzy: 1\n",
     NULL,
     {"flow.yaml:6: output.xyzzy: unknown key (known keys of output: dir, name, stac, "
      "products, prob_type, embedding_type, resolution, format, creation_options, "
      "vector_format, min_area, simplify)"}},
    {BASE "tiling.tile: 64\n",
     NULL,
     {"flow.yaml:5: tiling.tile: unknown key (write it nested: 'tiling:' with 'tile:' indented "
      "under it)"}},
    {BASE "extras:\n  a: 1\n", NULL, {"flow.yaml:5: extras: unknown section"}},
    /* wrong types */
    {BASE "tiling:\n  tile: abc\n",
     NULL,
     {"flow.yaml:6: tiling.tile: expected an integer, got 'abc'"}},
    {BASE "tiling:\n  tile: 12.5\n",
     NULL,
     {"flow.yaml:6: tiling.tile: expected an integer, got '12.5'"}},
    {BASE "tiling:\n  tile: [64]\n",
     NULL,
     {"flow.yaml:6: tiling.tile: expected an integer, got a list"}},
    {BASE "tiling:\n  tile:\n",
     NULL,
     {"flow.yaml:", "tiling.tile: expected an integer, got nothing"}},
    {BASE "runtime: fast\n",
     NULL,
     {"flow.yaml:5: runtime: expected a mapping of keys, got 'fast'"}},
    {"- input\n- model\n", NULL, {"flow.yaml:1: expected a mapping of sections"}},
    {BASE "model:\n", NULL, {"flow.yaml:5: model: duplicate key (first given at line 3)"}},
    {"input:\n  path: a.tif\n  bands: [1, two, 3]\nmodel: {weights: m.h5}\n",
     NULL,
     {"flow.yaml:3: input.bands: expected an integer, got 'two'"}},
    {"input:\n  path: a.tif\n  bands:\n    - 1\n    - 0\nmodel: {weights: m.h5}\n",
     NULL,
     {"flow.yaml:5: input.bands: 0 is out of range (expected 1..2147483647)"}},
    {"input:\n  path: a.tif\n  scale: -2\nmodel: {weights: m.h5}\n",
     NULL,
     {"flow.yaml:3: input.scale: -2 is out of range (expected a number > 0)"}},
    {"input:\n  path: a.tif\n  scale: 0x10\nmodel: {weights: m.h5}\n",
     NULL,
     {"flow.yaml:3: input.scale: expected a number, got '0x10'"}},
    {"input:\n  path: a.tif\n  nodata: none\nmodel: {weights: m.h5}\n",
     NULL,
     {"flow.yaml:3: input.nodata: expected auto, nan or a number, got 'none'"}},
    {"input:\n  path: a.tif\n  on_error: retry\nmodel: {weights: m.h5}\n",
     NULL,
     {"flow.yaml:3: input.on_error: expected one of fail | skip, got 'retry'"}},
    {"input:\n  path: {a: 1}\nmodel: {weights: m.h5}\n",
     NULL,
     {"flow.yaml:2: input.path: expected a list of raster paths, got a mapping"}},
    {"input:\n  path: []\nmodel: {weights: m.h5}\n",
     NULL,
     {"flow.yaml:2: input.path: expected a list of raster paths, got an empty list"}},
    {"input:\n  path: \"\"\nmodel: {weights: m.h5}\n",
     NULL,
     {"flow.yaml:2: input.path: must not be empty"}},
    {"input:\n  path: \"a\\0b\"\nmodel: {weights: m.h5}\n",
     NULL,
     {"flow.yaml:2: input.path: contains a NUL byte"}},
    /* out of range */
    {BASE "tiling:\n  tile: 5000\n",
     NULL,
     {"flow.yaml:6: tiling.tile: 5000 is out of range (expected 32..4096)"}},
    {BASE "tiling:\n  tile: 99999999999999999999999\n",
     NULL,
     {"flow.yaml:6: tiling.tile: '99999999999999999999999' is out of range (expected 32..4096)"}},
    {BASE "tiling:\n  batch: 0\n",
     NULL,
     {"flow.yaml:6: tiling.batch: 0 is out of range (expected auto or an integer 1..4096)"}},
    {BASE "tiling:\n  max_nodata_fraction: 1.5\n",
     NULL,
     {"flow.yaml:6: tiling.max_nodata_fraction: 1.5 is out of range (expected 0..1)"}},
    {BASE "tiling:\n  edge: wrap\n",
     NULL,
     {"flow.yaml:6: tiling.edge: expected one of pad | shift | skip, got 'wrap'"}},
    {BASE "runtime:\n  threads: 5000\n",
     NULL,
     {"flow.yaml:6: runtime.threads: 5000 is out of range"}},
    {BASE "runtime:\n  device: gpu\n",
     NULL,
     {"flow.yaml:6: runtime.device: expected auto | cpu | cuda | cuda:N, got 'gpu'"}},
    {BASE "runtime:\n  device: cuda:x\n", NULL, {"flow.yaml:6: runtime.device:", "got 'cuda:x'"}},
    {BASE "runtime:\n  precision: fp8\n",
     NULL,
     {"flow.yaml:6: runtime.precision: expected one of fp32"}},
    /* stride and tile */
    {BASE "tiling:\n  tile: 64\n  stride: 48\n",
     NULL,
     {"flow.yaml:7: tiling.stride: 48 does not divide tile 64"}},
    {BASE "tiling:\n  stride: 96\n  tile: 64\n",
     NULL,
     {"flow.yaml:6: tiling.stride: 96 is larger than tile 64"}},
    /* the products against other keys (checked in the run driver before) */
    {BASE "output:\n  products: [embedding_raster]\n  resolution: input\n",
     NULL,
     {"flow.yaml:7: output.resolution: input is not available for embedding_raster"}},
    {BASE "output:\n  products: [embedding_raster]\n  format: COG\n  embedding_type: float16\n",
     NULL,
     {"flow.yaml:8: output.embedding_type: float16 cannot be written as a COG"}},
    /* mean/std lengths */
    {"input: {path: a.tif}\nmodel:\n  weights: m.h5\n  mean: [1, 2, 3]\n  std: [1, 2]\n",
     NULL,
     {"flow.yaml:5: model.std: 2 values but model.mean has 3"}},
    {"input: {path: a.tif, bands: [1, 2]}\nmodel:\n  weights: m.h5\n  mean: [1, 2, 3]\n",
     NULL,
     {"flow.yaml:4: model.mean: 3 values but input.bands selects 2 bands"}},
    {"input: {path: a.tif}\nmodel:\n  weights: m.h5\n  std: [1, 0]\n",
     NULL,
     {"flow.yaml:4: model.std: 0 is out of range (expected a number > 0)"}},
    {"input: {path: a.tif}\nmodel:\n  weights: m.h5\n  mean: [1, 1e39]\n",
     NULL,
     {"flow.yaml:4: model.mean: 1e+39 is too large for float32"}},
    /* sizes */
    {BASE "runtime:\n  memory: 2 GiBs\n",
     NULL,
     {"flow.yaml:6: runtime.memory: bad size '2 GiBs' (expected a size such as 512MiB"}},
    {BASE "runtime:\n  memory: 1MiB\n",
     NULL,
     {"flow.yaml:6: runtime.memory: 1MiB is too small (at least 16MiB)"}},
    /* products, classes, creation options */
    {BASE "output:\n  products: [class, probs]\n",
     NULL,
     {"flow.yaml:6: output.products: expected one of class | prob | confidence | embeddings | "
      "tiles | tiles_gpkg | polygons | embedding_raster, got 'probs'"}},
    {BASE "output:\n  min_area: -1\n",
     NULL,
     {"flow.yaml:6: output.min_area: -1 is out of range (expected CRS units squared, >= 0)"}},
    {BASE "output:\n  vector_format: shp\n",
     NULL,
     {"flow.yaml:6: output.vector_format: expected one of gpkg | fgb, got 'shp'"}},
    {BASE "output:\n  simplify: .nan\n", NULL, {"flow.yaml:6: output.simplify:"}},
    {BASE "output:\n  format: PNG\n",
     NULL,
     {"flow.yaml:6: output.format: expected one of GTiff | COG, got 'PNG'"}},
    {BASE "output:\n  prob_type: float64\n",
     NULL,
     {"flow.yaml:6: output.prob_type:", "got 'float64'"}},
    {BASE "output:\n  creation_options:\n    - COMPRESS=LZW\n    - TILED\n",
     NULL,
     {"flow.yaml:8: output.creation_options: expected KEY=VALUE, got 'TILED'"}},
    {"input: {path: a.tif}\nmodel:\n  weights: m.h5\n  classes: [water, land, water]\n",
     NULL,
     {"flow.yaml:4: model.classes: duplicate class name 'water' (items 1 and 3)"}},
    {BASE "output:\n  name: \"{stem}/{index}\"\n",
     NULL,
     {"flow.yaml:6: output.name: '{stem}/{index}' holds a '/' (output names are file names"}},
    {BASE "output:\n  name: \"{stem}_{date}\"\n",
     NULL,
     {"flow.yaml:6: output.name: '{date}' is not a placeholder (expected {stem}, {parent} or "
      "{index})"}},
    {BASE "output:\n  name: {stem}\n",
     NULL,
     {"flow.yaml:6: output.name: expected a name template in quotes"}},
    {"input: {path: a.tif}\nmodel:\n  weights: m.h5\n  classes: [water, \"\\e[2Jland\"]\n",
     NULL,
     {"flow.yaml:4: model.classes: class name 2 holds a control character (byte 0x1b)"}},
    {"input: {path: a.tif}\nmodel:\n  weights: m.h5\n  classes: "
     "[aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa]\n",
     NULL,
     {"flow.yaml:4: model.classes: too long (74 bytes, at most 63)"}},
    {"input: {path: a.tif}\nmodel:\n  weights: m.h5\n  arch: vgg16\n",
     NULL,
     {"flow.yaml:4: model.arch: expected one of resnet18 | resnet34 | resnet50 | resnet101 | "
      "resnet152 | resnext50_32x4d | resnext101_32x8d | resnext101_64x4d | wide_resnet50_2 | "
      "wide_resnet101_2 | fcn_resnet50 | fcn_resnet101 | deeplabv3_resnet50 | "
      "deeplabv3_resnet101 | unet_resnet18 | unet_resnet34 | unet_resnet50 | unet_resnet101, got "
      "'vgg16'"}},
    {"input: {path: a.tif}\nmodel:\n  weights: m.h5\n  stem: tiny\n",
     NULL,
     {"flow.yaml:4: model.stem: expected one of auto | standard | small, got 'tiny'"}},
    /* duplicate keys */
    {BASE "tiling:\n  tile: 64\n  stride: 32\n  tile: 32\n",
     NULL,
     {"flow.yaml:8: tiling.tile: duplicate key (first given at line 6)"}},
    /* YAML syntax */
    {"input:\n  path: a.tif\n  bands: [1, 2\nmodel:\n  weights: m.h5\n",
     NULL,
     {"flow.yaml:4:", "YAML syntax error", "flow sequence at line 3"}},
    {"input:\n  path: a.tif\n   bands: [1]\n",
     NULL,
     {"flow.yaml:3:", "YAML syntax error: mapping values are not allowed"}},
    {"input:\n  path: 'a.tif\n", NULL, {"flow.yaml:", "YAML syntax error", "quoted scalar"}},
    {"input:\n  path: *nowhere\n",
     NULL,
     {"flow.yaml:2:", "YAML syntax error: found undefined alias"}},
    {"input:\n  path: a.tif\nmodel: {weights: \"m\xff.h5\"}\n",
     NULL,
     {"flow.yaml:3:", "YAML syntax error", "UTF-8"}},
    {BASE "---\ninput: {path: b.tif}\n", NULL, {"flow.yaml:6: only one YAML document is allowed"}},
    {"input:\n\tpath: a.tif\n",
     NULL,
     {"flow.yaml:2:1: YAML syntax error:", "(indent YAML with spaces, not tabs)"}},
    {BASE,
     "model.classes=[a, \xff]",
     {"--set model.classes: YAML syntax error in value '[a, ?]': invalid leading UTF-8"}},
    {BASE, "input.scale=1e400", {"--set input.scale: '1e400' is out of range for a number"}},
    /* a message shows valid UTF-8 as it is and a broken sequence as '?' */
    {BASE,
     "output.dir=[\"a\", \"\xc3\xa9t\xc3\"]",
     {"--set output.dir: YAML syntax error in value '[\"a\", \"\xc3\xa9t?\"]': invalid trailing "
      "UTF-8"}},
    {BASE "model:\n", NULL, {"flow.yaml:5: model: duplicate key"}},
    /* nesting deep enough to make libyaml's scanner crawl is refused up front */
    {"input:\n  path: a.tif\n  bands: "
     "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n",
     NULL,
     {"flow.yaml:3: YAML nested deeper than 64 levels"}},
    {BASE,
     "input.bands={{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{"
     "{{{",
     {"--set input.bands: value nested deeper than 64 levels"}},
    /* an alias cycle is just a value of the wrong type */
    {"input: &a\n  path: *a\nmodel: {weights: m.h5}\n",
     NULL,
     {"flow.yaml:1: input.path: expected a list of raster paths, got a mapping"}},
    /* required keys and empty files */
    {"input:\n  path: a.tif\n", NULL, {"flow.yaml: model.weights is required"}},
    {"model:\n  weights: m.h5\n", NULL, {"flow.yaml: input.path is required"}},
    {"", NULL, {"flow.yaml: empty workflow file"}},
    {"# only a comment\n\n", NULL, {"flow.yaml: empty workflow file"}},
    {"---\n...\n", NULL, {"flow.yaml: empty workflow file"}},
    /* bad --set */
    {BASE, "tiling.tilee=32", {"--set tiling.tilee: unknown key (did you mean tiling.tile?)"}},
    {BASE, "tiling=32", {"--set tiling: unknown key"}},
    {BASE, "tiling.tile", {"--set tiling.tile: expected key.path=value"}},
    {BASE, "=3", {"--set =3: expected key.path=value"}},
    {BASE, "tiling.tile=abc", {"--set tiling.tile: expected an integer, got 'abc'"}},
    {BASE, "tiling.tile=", {"--set tiling.tile: expected an integer, got nothing"}},
    {BASE, "tiling.tile=4", {"--set tiling.tile: 4 is out of range (expected 32..4096)"}},
    {BASE, "input.bands=[1,2", {"--set input.bands: YAML syntax error in value '[1,2'"}},
    {BASE,
     "input.bands={a: 1}",
     {"--set input.bands: expected a list of band numbers (1-based), got a mapping"}},
    {BASE, "runtime.memory=lots", {"--set runtime.memory: bad size 'lots'"}},
    {BASE,
     "output.products=[class, maps]",
     {"--set output.products: expected one of", "got 'maps'"}},
    {"input: {path: a.tif}\nmodel:\n  weights: m.h5\n  mean: [1, 2]\n",
     "model.std=[1]",
     {"--set model.std: 1 values but model.mean has 2"}},
};

static void test_bad_configs(void **state)
{
    (void)state;
    int n = (int)(sizeof k_bad / sizeof k_bad[0]);
    assert_true(n >= 15);
    for (int i = 0; i < n; i++) {
        const bad_case *bc = &k_bad[i];
        tw_run_params p;
        tw_error err;
        const char *sets[1] = {bc->set};
        tw_status st = parse(bc->yaml, sets, bc->set ? 1 : 0, &p, &err);
        bool ok = st == TW_ERR_CONFIG && err.status == TW_ERR_CONFIG;
        for (int j = 0; ok && j < 4 && bc->needles[j]; j++)
            if (!strstr(err.msg, bc->needles[j])) ok = false;
        if (!ok) {
            print_error("case %d: status %d, message \"%s\"\n  yaml: %s\n  wanted:", i, (int)st,
                        err.msg, bc->yaml);
            for (int j = 0; j < 4 && bc->needles[j]; j++) print_error(" \"%s\"", bc->needles[j]);
            print_error("\n");
        }
        assert_true(ok);
    }
}

/* Limits of the fixed-size arrays in tw_run_params are errors, not overflows. */
static void test_limits(void **state)
{
    (void)state;
    size_t cap = 64 * 1024;
    char *text = malloc(cap);
    assert_non_null(text);
    tw_run_params p;
    tw_error err;

    /* 255 classes fit, 256 do not */
    for (int n = 255; n <= 256; n++) {
        int len =
            snprintf(text, cap, "input: {path: a.tif}\nmodel:\n  weights: m.h5\n  classes: [");
        for (int i = 0; i < n; i++)
            len += snprintf(text + len, cap - (size_t)len, "%sc%d", i ? ", " : "", i);
        snprintf(text + len, cap - (size_t)len, "]\n");
        tw_status st = parse(text, NULL, 0, &p, &err);
        if (n == 255) {
            assert_int_equal(st, TW_OK);
            assert_int_equal(p.model.n_classes, 255);
            assert_string_equal(p.model.classes[254], "c254");
        } else {
            assert_int_equal(st, TW_ERR_CONFIG);
            assert_string_equal(err.msg,
                                "flow.yaml:4: model.classes: too many items (256, at most 255)");
        }
    }
    /* 65 inputs */
    int len = snprintf(text, cap, "model: {weights: m.h5}\ninput:\n  path:\n");
    for (int i = 0; i < TW_MAX_INPUTS + 1; i++)
        len += snprintf(text + len, cap - (size_t)len, "    - f%d.tif\n", i);
    assert_int_equal(parse(text, NULL, 0, &p, &err), TW_ERR_CONFIG);
    assert_string_equal(err.msg, "flow.yaml:4: input.path: too many items (65, at most 64)");
    /* a path one byte too long for TW_PATH_MAX */
    len = snprintf(text, cap, "input: {path: a.tif}\nmodel:\n  weights: ");
    memset(text + len, 'w', TW_PATH_MAX);
    snprintf(text + len + TW_PATH_MAX, cap - (size_t)len - TW_PATH_MAX, "\n");
    assert_int_equal(parse(text, NULL, 0, &p, &err), TW_ERR_CONFIG);
    assert_string_equal(err.msg, "flow.yaml:3: model.weights: too long (1024 bytes, at most 1023)");
    /* 65 bands */
    len = snprintf(text, cap, "input:\n  path: a.tif\n  bands: [");
    for (int i = 0; i < TW_MAX_BANDS + 1; i++)
        len += snprintf(text + len, cap - (size_t)len, "%s1", i ? "," : "");
    snprintf(text + len, cap - (size_t)len, "]\nmodel: {weights: m.h5}\n");
    assert_int_equal(parse(text, NULL, 0, &p, &err), TW_ERR_CONFIG);
    assert_string_equal(err.msg, "flow.yaml:3: input.bands: too many items (65, at most 64)");
    free(text);
}

static void test_files(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    assert_non_null(dir);
    tw_run_params p;
    tw_error err;

    /* missing and unreadable files */
    tw_error_init(&err);
    const char *missing = tw_test_path(dir, "nope.yaml");
    assert_int_equal(tw_workflow_load(missing, NULL, 0, &p, &err), TW_ERR_CONFIG);
    assert_non_null(strstr(err.msg, missing));
    assert_non_null(strstr(err.msg, "No such file or directory"));
    tw_error_init(&err);
    assert_int_equal(tw_workflow_load(dir, NULL, 0, &p, &err), TW_ERR_CONFIG);
    assert_non_null(strstr(err.msg, dir));

    /* a real file: messages name its path; workflow_path is recorded */
    const char *good = tw_test_path(dir, "good.yaml");
    write_file(good, k_good, strlen(k_good));
    tw_error_init(&err);
    const char *sets[] = {"runtime.device=cuda"};
    assert_int_equal(tw_workflow_load(good, sets, 1, &p, &err), TW_OK);
    assert_string_equal(p.workflow_path, good);
    assert_string_equal(p.runtime.device, "cuda");
    assert_int_equal(p.tiling.tile, 128);

    const char *bad = tw_test_path(dir, "bad.yaml");
    const char bad_text[] =
        "input:\n  path: a.tif\nmodel:\n  weights: m.h5\ntiling:\n  stride: 3\n  tile: 64\n";
    write_file(bad, bad_text, sizeof bad_text - 1);
    tw_error_init(&err);
    assert_int_equal(tw_workflow_load(bad, NULL, 0, &p, &err), TW_ERR_CONFIG);
    char want[4200];
    snprintf(want, sizeof want, "%s:6: tiling.stride: 3 does not divide tile 64", bad);
    assert_non_null(strstr(err.msg, want));

    const char *empty = tw_test_path(dir, "empty.yaml");
    write_file(empty, "", 0);
    tw_error_init(&err);
    assert_int_equal(tw_workflow_load(empty, NULL, 0, &p, &err), TW_ERR_CONFIG);
    snprintf(want, sizeof want, "%s: empty workflow file", empty);
    assert_non_null(strstr(err.msg, want));

    /* a file bigger than the read buffer's first size (4 KiB), padded with comments */
    const char *big = tw_test_path(dir, "big.yaml");
    size_t big_len = 20000;
    char *big_text = malloc(big_len);
    assert_non_null(big_text);
    memset(big_text, '#', big_len);
    for (size_t i = 79; i < big_len; i += 80) big_text[i] = '\n';
    const char tail[] = "\ninput: {path: a.tif}\nmodel: {weights: m.h5}\n";
    memcpy(big_text + big_len - sizeof tail + 1, tail, sizeof tail - 1);
    write_file(big, big_text, big_len);
    free(big_text);
    tw_error_init(&err);
    assert_int_equal(tw_workflow_load(big, NULL, 0, &p, &err), TW_OK);
    assert_string_equal(p.model.weights, "m.h5");

    remove(good);
    remove(bad);
    remove(empty);
    remove(big);
    remove(dir);
}

/* The demo workflow shipped in the repository parses to what it documents. */
static void test_sample_workflow(void **state)
{
    (void)state;
    const char *src = getenv("TW_SOURCE_DIR");
    if (!src || !*src) skip();
    tw_run_params p;
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(
        tw_workflow_load(tw_test_path(src, "workflows/sample.yaml"), NULL, 0, &p, &err), TW_OK);
    assert_string_equal(p.input.paths[0], "sample_data/L7_ETMs.tif");
    assert_int_equal(p.input.n_bands, 6);
    for (int i = 0; i < 6; i++) assert_int_equal(p.input.bands[i], i + 1);
    assert_string_equal(p.model.weights, "sample_data/demo_resnet18.h5");
    assert_int_equal(p.tiling.tile, 64);
    assert_int_equal(p.tiling.stride, 32);
    assert_int_equal(p.tiling.batch, 0);
    assert_int_equal(p.tiling.edge, TW_EDGE_PAD);
    assert_string_equal(p.runtime.device, "auto");
    assert_int_equal(p.runtime.memory, (size_t)512 << 20);
    assert_string_equal(p.output.dir, "out/sample");
    assert_int_equal(p.output.products, TW_PRODUCT_CLASS | TW_PRODUCT_PROB | TW_PRODUCT_CONF);
}

/* The batch template: a list of inputs, explicit normalization, COG. */
static void test_batch_workflow(void **state)
{
    (void)state;
    const char *src = getenv("TW_SOURCE_DIR");
    if (!src || !*src) skip();
    tw_run_params p;
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(
        tw_workflow_load(tw_test_path(src, "workflows/batch_cog.yaml"), NULL, 0, &p, &err), TW_OK);
    assert_int_equal(p.input.n_paths, 3);
    assert_int_equal(p.input.n_bands, 4);
    assert_int_equal(p.model.n_mean, 4);
    assert_int_equal(p.model.n_classes, 6);
    assert_int_equal(p.tiling.edge, TW_EDGE_SHIFT);
    assert_int_equal(p.runtime.precision, TW_PREC_FP16);
    assert_int_equal(p.runtime.memory, (size_t)8 << 30);
    assert_int_equal(p.output.format, TW_FORMAT_COG);
    assert_int_equal(p.output.prob_type, TW_PROB_UINT8);
    assert_int_equal(p.output.products,
                     TW_PRODUCT_CLASS | TW_PRODUCT_PROB | TW_PRODUCT_EMB | TW_PRODUCT_TILES);
}

static void test_parse_bytes(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        size_t v;
    } good[] = {
        {"512MiB", (size_t)512 << 20},
        {"2GiB", (size_t)2 << 30},
        {"1.5GB", 1500000000},
        {"64KiB", 65536},
        {"1048576", 1048576},
        {"2 GiB", (size_t)2 << 30},
        {"1.5GiB", (size_t)3 << 29},
        {"10kb", 10000},
        {"3G", (size_t)3 << 30},
        {"16m", (size_t)16 << 20},
        {"1TiB", (size_t)1 << 40},
        {"0.5KiB", 512},
        {".5KiB", 512},
        {"7B", 7},
        {"18446744073709551615", SIZE_MAX},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        size_t v = 0;
        if (tw_parse_bytes(good[i].s, &v) != 0 || v != good[i].v)
            print_error("tw_parse_bytes(\"%s\") = %zu, want %zu\n", good[i].s, v, good[i].v);
        assert_int_equal(tw_parse_bytes(good[i].s, &v), 0);
        assert_int_equal(v, good[i].v);
    }
    static const char *const bad[] = {
        "",
        "abc",
        "-1",
        "0",
        "0GiB",
        "0.1",
        "1.5.5GB",
        "GiB",
        "12 XB",
        "0x10",
        "1e9",
        " 5",
        "5 ",
        "18446744073709551616",
        "20000000TiB",
        "1,5GB",
        "NaN",
        "inf",
        "2GiBs",
        "2  GiB",
        ".",
        "1.GiB x",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t v = 12345;
        if (tw_parse_bytes(bad[i], &v) != -1)
            print_error("tw_parse_bytes(\"%s\") accepted: %zu\n", bad[i], v);
        assert_int_equal(tw_parse_bytes(bad[i], &v), -1);
    }
    size_t v;
    assert_int_equal(tw_parse_bytes(NULL, &v), -1);
}

/* Mutated versions of a good file: each must give TW_OK or one config error
 * naming the file (never a crash, never another status); ASan checks the rest. */
static void test_fuzz_mutations(void **state)
{
    (void)state;
    static const char alphabet[] = ":-[]{},&*!|>'\"#\n \t?%@`\\0123456789.e";
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    size_t base_len = strlen(k_good);
    char *buf = malloc(base_len * 3 + 64);
    assert_non_null(buf);
    int n_ok = 0, n_err = 0;
    for (int iter = 0; iter < 20000; iter++) {
        memcpy(buf, k_good, base_len);
        size_t len = base_len;
        int n_mut = 1 + (int)((rng >> 33) % 3);
        for (int m = 0; m < n_mut; m++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            uint64_t r = rng >> 11;
            size_t pos = len ? (size_t)(r % len) : 0;
            /* raw bytes are mostly invalid UTF-8, which libyaml rejects up
             * front: keep them rare so the walk behind it gets exercised */
            switch ((r >> 20) % 16) {
            case 9:
            case 10:
            case 11:
            case 0: /* replace a byte with a YAML-significant one */
                if (len) buf[pos] = alphabet[(r >> 28) % (sizeof alphabet - 1)];
                break;
            case 1: /* any byte at all, NUL and invalid UTF-8 included */
            case 2:
                if (len) buf[pos] = (char)(r >> 30);
                break;
            case 3:
            case 4:
            case 5: { /* delete a run */
                size_t n = 1 + (size_t)((r >> 30) % 12);
                if (pos + n > len) n = len - pos;
                memmove(buf + pos, buf + pos + n, len - pos - n);
                len -= n;
                break;
            }
            case 6:
            case 7:
            case 8: /* insert a byte */
                if (len < base_len * 2) {
                    memmove(buf + pos + 1, buf + pos, len - pos);
                    buf[pos] = alphabet[(r >> 28) % (sizeof alphabet - 1)];
                    len++;
                }
                break;
            default: { /* duplicate a run (repeats keys and lines) */
                size_t n = 1 + (size_t)((r >> 30) % 40);
                if (pos + n > len) n = len - pos;
                if (len + n <= base_len * 3) {
                    memmove(buf + pos + n, buf + pos, len - pos);
                    len += n;
                }
                break;
            }
            }
        }
        tw_run_params p;
        tw_error err;
        tw_error_init(&err);
        tw_status st = tw_workflow_parse("fuzz.yaml", buf, len, NULL, 0, &p, &err);
        if (st == TW_OK) {
            n_ok++;
            assert_true(p.input.n_paths >= 1 && p.model.weights[0] != '\0');
        } else {
            n_err++;
            if (getenv("TW_FUZZ_VERBOSE")) fprintf(stderr, "%s\n", err.msg);
            if (st != TW_ERR_CONFIG || strncmp(err.msg, "fuzz.yaml", 9) != 0)
                print_error("iteration %d: status %d \"%s\"\n", iter, (int)st, err.msg);
            assert_int_equal(st, TW_ERR_CONFIG);
            assert_int_equal(strncmp(err.msg, "fuzz.yaml", 9), 0);
        }
    }
    free(buf);
    print_message("fuzz: %d parsed, %d rejected\n", n_ok, n_err);
    /* the mutations must exercise both outcomes, or the loop proves nothing */
    assert_true(n_ok > 100);
    assert_true(n_err > 1000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_file),       cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_overrides),       cmocka_unit_test(test_bad_configs),
        cmocka_unit_test(test_limits),          cmocka_unit_test(test_files),
        cmocka_unit_test(test_sample_workflow), cmocka_unit_test(test_batch_workflow),
        cmocka_unit_test(test_parse_bytes),     cmocka_unit_test(test_fuzz_mutations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
