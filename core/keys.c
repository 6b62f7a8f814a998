/* keys.c - the one table of workflow keys (see keys.h) */
#include "core/keys.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

const char *const tw_key_sections[TW_KEY_SECTIONS] = {"input", "model", "tiling", "runtime",
                                                      "output"};

static const char *const on_error_names[] = {"fail", "skip"};
static const char *const arch_names[] = {"resnet18",           "resnet34",
                                         "resnet50",           "resnet101",
                                         "resnet152",          "resnext50_32x4d",
                                         "resnext101_32x8d",   "resnext101_64x4d",
                                         "wide_resnet50_2",    "wide_resnet101_2",
                                         "fcn_resnet50",       "fcn_resnet101",
                                         "deeplabv3_resnet50", "deeplabv3_resnet101",
                                         "unet_resnet18",      "unet_resnet34",
                                         "unet_resnet50",      "unet_resnet101"};
static const char *const precision_names[] = {"fp32", "tf32", "fp16", "bf16", "int8"};
static const char *const resolution_names[] = {"cells", "input"};
#define NAMES(a) a, (int)(sizeof a / sizeof a[0])
#define EXECUTION "how the run computes, not what: "

/* Rows in tw_key_id order (checked by tests/test_keys.c). */
const tw_key tw_keys[TW_KEY_COUNT] = {
    [TW_KEY_INPUT_PATH] = {"input.path", TW_KT_PATHS, .range = "raster paths (1..64)",
                           .flags = TW_KEY_BYTES},
    [TW_KEY_INPUT_BANDS] = {"input.bands", TW_KT_INTS, .lo = 1, .hi = 2147483647,
                            .range = "band numbers (1-based)",
                            .flags = TW_KEY_BYTES | TW_KEY_RESOLVED},
    [TW_KEY_INPUT_SCALE] = {"input.scale", TW_KT_NUMBER, .lo = 4.9406564584124654e-324,
                            .hi = INFINITY, .range = "a number > 0",
                            .flags = TW_KEY_BYTES | TW_KEY_RESOLVED},
    [TW_KEY_INPUT_NODATA] = {"input.nodata", TW_KT_SPECIAL, .range = "auto, nan or a number",
                             .def = "auto", .flags = TW_KEY_BYTES},
    [TW_KEY_INPUT_ON_ERROR] = {"input.on_error", TW_KT_ENUM, NAMES(on_error_names), .def = "fail",
                               .why = "decides whether an unreadable tile fails the run or is "
                                      "written as nodata; every classified tile is the same"},
    [TW_KEY_INPUT_ASSETS] = {"input.assets", TW_KT_STRINGS, .range = "STAC asset names",
                             .flags = TW_KEY_BYTES},
    [TW_KEY_INPUT_RETRIES] = {"input.retries", TW_KT_INT, .lo = 0, .hi = 30, .range = "0..30",
                              .def = "8", .why = "how long a remote read is retried"},
    [TW_KEY_INPUT_RETRY_DELAY] = {"input.retry_delay", TW_KT_NUMBER, .lo = 0.01, .hi = 60,
                                  .range = "seconds, 0.01..60", .def = "0.5",
                                  .why = "how long a remote read is retried"},
    [TW_KEY_INPUT_TIMEOUT] = {"input.timeout", TW_KT_NUMBER, .lo = 1, .hi = 3600,
                              .range = "seconds, 1..3600", .def = "4",
                              .why = "how long a remote request may stay silent"},
    [TW_KEY_INPUT_AOI] = {"input.aoi", TW_KT_PATH,
                          .range = "a vector file path (GeoPackage, Shapefile, GeoJSON, ...)",
                          .flags = TW_KEY_BYTES},
    [TW_KEY_INPUT_DATETIME] = {"input.datetime", TW_KT_STRING,
                               .range = "an RFC 3339 date-time (2021-06-01T10:30:00Z)",
                               .why = "only the STAC item's datetime depends on it, and every "
                                      "run writes the item anew from the finished products"},
    [TW_KEY_MODEL_WEIGHTS] = {"model.weights", TW_KT_PATH, .range = "a model file path",
                              .flags = TW_KEY_BYTES},
    [TW_KEY_MODEL_ARCH] = {"model.arch", TW_KT_ENUM, NAMES(arch_names),
                           .flags = TW_KEY_BYTES | TW_KEY_RESOLVED},
    [TW_KEY_MODEL_MEAN] = {"model.mean", TW_KT_NUMBERS, .lo = -3.4028234663852886e38,
                           .hi = 3.4028234663852886e38, .range = "numbers, one per band",
                           .flags = TW_KEY_BYTES | TW_KEY_RESOLVED},
    [TW_KEY_MODEL_STD] = {"model.std", TW_KT_NUMBERS, .lo = 0, .hi = 3.4028234663852886e38,
                          .range = "numbers > 0, one per band",
                          .flags = TW_KEY_BYTES | TW_KEY_RESOLVED},
    [TW_KEY_MODEL_CLASSES] = {"model.classes", TW_KT_STRINGS, .range = "class names",
                              .flags = TW_KEY_BYTES | TW_KEY_RESOLVED},
    [TW_KEY_MODEL_COLORS] = {"model.colors", TW_KT_STRINGS, .range = "class colours ('#rrggbb')",
                             .flags = TW_KEY_BYTES},
    [TW_KEY_MODEL_STEM] = {"model.stem", TW_KT_ENUM, NAMES(tw_stem_names), .def = "auto",
                           .flags = TW_KEY_BYTES | TW_KEY_RESOLVED},
    [TW_KEY_TILING_TILE] = {"tiling.tile", TW_KT_INT, .lo = 32, .hi = 4096, .range = "32..4096",
                            .flags = TW_KEY_BYTES | TW_KEY_RESOLVED},
    [TW_KEY_TILING_STRIDE] = {"tiling.stride", TW_KT_INT, .lo = 1, .hi = 4096, .range = "1..4096",
                              .flags = TW_KEY_BYTES | TW_KEY_RESOLVED},
    [TW_KEY_TILING_BATCH] = {"tiling.batch", TW_KT_AUTO_INT, .lo = 1, .hi = 4096,
                             .range = "1..4096", .def = "auto",
                             .why = EXECUTION "a tile's probabilities do not depend on the "
                                              "batch, its size or the tile's place in it"},
    [TW_KEY_TILING_EDGE] = {"tiling.edge", TW_KT_ENUM, NAMES(tw_edge_names), .def = "pad",
                            .flags = TW_KEY_BYTES},
    [TW_KEY_TILING_MAX_NODATA_FRACTION] = {"tiling.max_nodata_fraction", TW_KT_NUMBER, .lo = 0,
                                           .hi = 1, .range = "0..1", .def = "0.5",
                                           .flags = TW_KEY_BYTES},
    [TW_KEY_TILING_BLEND] = {"tiling.blend", TW_KT_ENUM, NAMES(tw_blend_names),
                             .def = TW_BLEND_DEFAULT_NAME, .flags = TW_KEY_BYTES},
    [TW_KEY_TILING_MARGIN] = {"tiling.margin", TW_KT_INT, .lo = 0, .hi = 2048, .range = "0..2048",
                              .def = "0", .flags = TW_KEY_BYTES},
    [TW_KEY_RUNTIME_DEVICE] = {"runtime.device", TW_KT_SPECIAL,
                               .range = "auto | cpu | cuda | cuda:N", .def = "auto",
                               .why = EXECUTION "CPU and GPU agree to ~1e-6, not bit for bit, "
                                                "and shards may run on mixed nodes; run.json "
                                                "names the backend"},
    [TW_KEY_RUNTIME_PRECISION] = {"runtime.precision", TW_KT_ENUM, NAMES(precision_names),
                                  .def = "fp32", .flags = TW_KEY_BYTES},
    [TW_KEY_RUNTIME_MEMORY] = {"runtime.memory", TW_KT_SIZE,
                               .range = "a size such as 512MiB, 2GiB, 1.5GB or a number of bytes",
                               .def = "2GiB",
                               .why = EXECUTION "the budget sizes batches and buffers"},
    [TW_KEY_RUNTIME_THREADS] = {"runtime.threads", TW_KT_AUTO_INT, .lo = 1, .hi = 1024,
                                .range = "1..1024", .def = "auto",
                                .why = EXECUTION "another thread count may move a probability "
                                                 "in its last bit (~1e-7), never more"},
    [TW_KEY_RUNTIME_READERS] = {"runtime.readers", TW_KT_AUTO_INT, .lo = 1, .hi = 64,
                                .range = "1..64", .def = "auto",
                                .why = EXECUTION "outputs are identical for any number"},
    [TW_KEY_OUTPUT_DIR] = {"output.dir", TW_KT_PATH, .range = "a directory path", .def = "out",
                           .why = "where the outputs and their parts are: the parts are "
                                  "compared inside it"},
    [TW_KEY_OUTPUT_NAME] = {"output.name", TW_KT_STRING,
                            .range = "a name template with {stem}, {parent} and {index}",
                            .def = "\"{stem}\"",
                            .why = "it names the files, not their bytes (the parts of each name "
                                   "are compared on their own)"},
    [TW_KEY_OUTPUT_STAC] = {"output.stac", TW_KT_BOOL, .range = "true or false", .def = "false",
                            .why = "it adds the STAC items, written from the finished products; "
                                   "no product byte depends on it"},
    [TW_KEY_OUTPUT_PRODUCTS] = {"output.products", TW_KT_ENUMS, .n_names = TW_PRODUCT_COUNT,
                                .def = "[class, prob]", .flags = TW_KEY_BYTES},
    [TW_KEY_OUTPUT_PROB_TYPE] = {"output.prob_type", TW_KT_ENUM, NAMES(tw_prob_type_names),
                                 .def = "float32", .flags = TW_KEY_BYTES},
    [TW_KEY_OUTPUT_EMBEDDING_TYPE] = {"output.embedding_type", TW_KT_ENUM, NAMES(tw_emb_type_names),
                                      .def = "float32", .flags = TW_KEY_BYTES},
    [TW_KEY_OUTPUT_RESOLUTION] = {"output.resolution", TW_KT_ENUM, NAMES(resolution_names),
                                  .def = "cells", .flags = TW_KEY_BYTES},
    [TW_KEY_OUTPUT_FORMAT] = {"output.format", TW_KT_ENUM, NAMES(tw_format_names), .def = "GTiff",
                              .flags = TW_KEY_BYTES},
    [TW_KEY_OUTPUT_CREATION_OPTIONS] = {"output.creation_options", TW_KT_STRINGS,
                                        .range = "KEY=VALUE strings", .flags = TW_KEY_BYTES},
    [TW_KEY_OUTPUT_VECTOR_FORMAT] = {"output.vector_format", TW_KT_ENUM,
                                     NAMES(tw_vector_format_names), .def = "gpkg",
                                     .flags = TW_KEY_BYTES},
    [TW_KEY_OUTPUT_MIN_AREA] = {"output.min_area", TW_KT_NUMBER, .lo = 0, .hi = INFINITY,
                                .range = "CRS units squared, >= 0", .def = "0",
                                .flags = TW_KEY_BYTES},
    [TW_KEY_OUTPUT_SIMPLIFY] = {"output.simplify", TW_KT_NUMBER, .lo = 0, .hi = INFINITY,
                                .range = "CRS units, >= 0", .def = "0", .flags = TW_KEY_BYTES},
};

int tw_key_find(const char *path)
{
    for (int k = 0; path && k < TW_KEY_COUNT; k++)
        if (strcmp(tw_keys[k].path, path) == 0) return k;
    return -1;
}

const char *tw_key_leaf(tw_key_id k)
{
    const char *dot = strchr(tw_keys[k].path, '.');
    return dot ? dot + 1 : tw_keys[k].path;
}

int tw_key_section(tw_key_id k)
{
    const char *path = tw_keys[k].path;
    size_t n = strcspn(path, ".");
    for (int s = 0; s < TW_KEY_SECTIONS; s++)
        if (strlen(tw_key_sections[s]) == n && strncmp(tw_key_sections[s], path, n) == 0) return s;
    return -1;
}

/* ------------------------------------------------------------------------ */
/* formatting                                                               */

/* An snprintf that appends to buf and counts what it needed. */
typedef struct kbuf {
    char *s;
    size_t size, len;
} kbuf;

__attribute__((format(printf, 2, 3))) static void add(kbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->len < b->size ? b->size - b->len : 0;
    int n = vsnprintf(room ? b->s + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0) b->len += (size_t)n;
}

/* A string as a YAML flow scalar: as it is when it is a plain word or path
 * (a colon inside, as in "sha256:..." or "cuda:0", is plain YAML), else in
 * double quotes with JSON's escapes (which YAML reads back). */
static void add_str(kbuf *b, const char *s)
{
    bool plain = *s != '\0';
    for (const unsigned char *c = (const unsigned char *)s; plain && *c; c++)
        plain = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                strchr("_./=+-", *c) ||
                (*c == ':' && c[1] != ' ' && c[1] != '\0' && c != (const unsigned char *)s);
    /* words YAML would read as something else */
    static const char *const special[] = {"true", "false", "null", "yes", "no", "on", "off", "~"};
    for (size_t i = 0; plain && i < sizeof special / sizeof special[0]; i++)
        if (strcasecmp(s, special[i]) == 0) plain = false;
    if (plain) {
        add(b, "%s", s);
        return;
    }
    add(b, "\"");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            add(b, "\\%c", *c);
        else if (*c < 0x20 || *c == 0x7f)
            add(b, "\\u%04x", *c);
        else
            add(b, "%c", *c);
    }
    add(b, "\"");
}

static void add_double(kbuf *b, double d)
{
    if (isnan(d))
        add(b, "nan");
    else if (isinf(d))
        add(b, d > 0 ? "inf" : "-inf");
    else
        add(b, "%.17g", d);
}

static void add_strings(kbuf *b, const char (*s)[TW_NAME_MAX], int n)
{
    add(b, "[");
    for (int i = 0; i < n; i++) {
        if (i) add(b, ", ");
        add_str(b, s[i]);
    }
    add(b, "]");
}

static void add_floats(kbuf *b, const float *v, int n)
{
    add(b, "[");
    for (int i = 0; i < n; i++) add(b, "%s%.9g", i ? ", " : "", v[i]);
    add(b, "]");
}

static void add_auto_int(kbuf *b, int v)
{
    if (v > 0)
        add(b, "%d", v);
    else
        add(b, "auto");
}

static void add_products(kbuf *b, unsigned products)
{
    add(b, "[");
    int n = 0;
    for (int i = 0; i < TW_PRODUCT_COUNT; i++)
        if (products & tw_products[i].bit) add(b, "%s%s", n++ ? ", " : "", tw_products[i].word);
    add(b, "]");
}

bool tw_key_arch_segments(const char *arch)
{
    return arch && (strncmp(arch, "fcn_", 4) == 0 || strncmp(arch, "deeplabv3_", 10) == 0 ||
                    strncmp(arch, "unet_", 5) == 0);
}

int tw_key_check_stride(int tile, int stride, const char *tile_from, char *msg, size_t size)
{
    if (stride >= 1 && stride <= tile && tile % stride == 0) return 0;
    char from[TW_PATH_MAX + 4] = "";
    if (tile_from) snprintf(from, sizeof from, " (%s)", tile_from);
    if (stride > tile) {
        snprintf(msg, size, "%d is larger than tile %d%s (expected 1..tile)", stride, tile, from);
        return -1;
    }
    /* a divisor of tile at most stride: tile halved until at most stride, then
     * down to the next divisor */
    int sug = tile / 2 >= 1 ? tile / 2 : 1;
    while (sug > 1 && sug > stride) sug /= 2;
    while (sug > 1 && tile % sug != 0) sug--;
    snprintf(msg, size, "%d does not divide tile %d%s (expected a divisor such as %d)", stride,
             tile, from, sug);
    return -1;
}

const char *tw_key_word(tw_key_id k, int i)
{
    if (i < 0 || i >= tw_keys[k].n_names) return "?"; /* a damaged struct */
    return tw_keys[k].type == TW_KT_ENUMS ? tw_products[i].word : tw_keys[k].names[i];
}

size_t tw_key_format(tw_key_id k, const tw_run_params *p, char *buf, size_t size)
{
    kbuf b = {buf, size, 0};
    if (size) buf[0] = '\0';
    const tw_input_params *in = &p->input;
    const tw_model_params *m = &p->model;
    switch (k) {
    case TW_KEY_INPUT_PATH:
        if (in->n_paths == 1) {
            add_str(&b, in->paths[0]);
            break;
        }
        add(&b, "[");
        for (int i = 0; i < in->n_paths; i++) {
            if (i) add(&b, ", ");
            add_str(&b, in->paths[i]);
        }
        add(&b, "]");
        break;
    case TW_KEY_INPUT_BANDS:
        if (in->n_bands == 0) {
            add(&b, "all");
            break;
        }
        add(&b, "[");
        for (int i = 0; i < in->n_bands; i++) add(&b, "%s%d", i ? ", " : "", in->bands[i]);
        add(&b, "]");
        break;
    case TW_KEY_INPUT_SCALE: add_double(&b, in->scale); break;
    case TW_KEY_INPUT_NODATA:
        if (in->nodata_auto)
            add(&b, "auto");
        else
            add_double(&b, in->nodata);
        break;
    case TW_KEY_INPUT_ON_ERROR: add(&b, "%s", tw_key_word(k, (int)in->on_error)); break;
    case TW_KEY_INPUT_ASSETS: add_strings(&b, in->assets, in->n_assets); break;
    case TW_KEY_INPUT_RETRIES: add(&b, "%d", in->retries); break;
    case TW_KEY_INPUT_RETRY_DELAY: add_double(&b, in->retry_delay); break;
    case TW_KEY_INPUT_TIMEOUT: add_double(&b, in->timeout); break;
    case TW_KEY_INPUT_AOI: add_str(&b, in->aoi); break;
    case TW_KEY_INPUT_DATETIME: add_str(&b, in->datetime); break;
    case TW_KEY_MODEL_WEIGHTS: add_str(&b, m->weights); break;
    case TW_KEY_MODEL_ARCH: add_str(&b, m->arch[0] ? m->arch : "auto"); break;
    case TW_KEY_MODEL_MEAN: add_floats(&b, m->mean, m->n_mean); break;
    case TW_KEY_MODEL_STD: add_floats(&b, m->std, m->n_std); break;
    case TW_KEY_MODEL_CLASSES: add_strings(&b, m->classes, m->n_classes); break;
    case TW_KEY_MODEL_COLORS:
        add(&b, "[");
        for (int i = 0; i < m->n_colors; i++)
            add(&b, "%s'#%02x%02x%02x'", i ? ", " : "", m->colors[i][0], m->colors[i][1],
                m->colors[i][2]);
        add(&b, "]");
        break;
    case TW_KEY_MODEL_STEM: add(&b, "%s", tw_key_word(k, (int)m->stem)); break;
    case TW_KEY_TILING_TILE: add_auto_int(&b, p->tiling.tile); break;
    case TW_KEY_TILING_STRIDE: add_auto_int(&b, p->tiling.stride); break;
    case TW_KEY_TILING_BATCH: add_auto_int(&b, p->tiling.batch); break;
    case TW_KEY_TILING_EDGE: add(&b, "%s", tw_key_word(k, (int)p->tiling.edge)); break;
    case TW_KEY_TILING_MAX_NODATA_FRACTION: add_double(&b, p->tiling.max_nodata_fraction); break;
    case TW_KEY_TILING_BLEND: add(&b, "%s", tw_key_word(k, (int)p->tiling.blend)); break;
    case TW_KEY_TILING_MARGIN: add(&b, "%d", p->tiling.margin); break;
    case TW_KEY_RUNTIME_DEVICE: add_str(&b, p->runtime.device); break;
    case TW_KEY_RUNTIME_PRECISION: add(&b, "%s", tw_key_word(k, (int)p->runtime.precision)); break;
    case TW_KEY_RUNTIME_MEMORY: add(&b, "%zu", p->runtime.memory); break;
    case TW_KEY_RUNTIME_THREADS: add_auto_int(&b, p->runtime.threads); break;
    case TW_KEY_RUNTIME_READERS: add_auto_int(&b, p->runtime.readers); break;
    case TW_KEY_OUTPUT_DIR: add_str(&b, p->output.dir); break;
    case TW_KEY_OUTPUT_NAME: add_str(&b, p->output.name); break;
    case TW_KEY_OUTPUT_STAC: add(&b, "%s", p->output.stac ? "true" : "false"); break;
    case TW_KEY_OUTPUT_PRODUCTS: add_products(&b, p->output.products); break;
    case TW_KEY_OUTPUT_PROB_TYPE: add(&b, "%s", tw_key_word(k, (int)p->output.prob_type)); break;
    case TW_KEY_OUTPUT_EMBEDDING_TYPE:
        add(&b, "%s", tw_key_word(k, (int)p->output.emb_type));
        break;
    case TW_KEY_OUTPUT_RESOLUTION: add(&b, "%s", tw_key_word(k, (int)p->output.resolution)); break;
    case TW_KEY_OUTPUT_FORMAT: add(&b, "%s", tw_key_word(k, (int)p->output.format)); break;
    case TW_KEY_OUTPUT_CREATION_OPTIONS:
        add(&b, "[");
        for (int i = 0; i < p->output.n_creation_options; i++) {
            if (i) add(&b, ", ");
            add_str(&b, p->output.creation_options[i]);
        }
        add(&b, "]");
        break;
    case TW_KEY_OUTPUT_VECTOR_FORMAT:
        add(&b, "%s", tw_key_word(k, (int)p->output.vector_format));
        break;
    case TW_KEY_OUTPUT_MIN_AREA: add_double(&b, p->output.min_area); break;
    case TW_KEY_OUTPUT_SIMPLIFY: add_double(&b, p->output.simplify); break;
    case TW_KEY_COUNT: break;
    }
    return b.len;
}

size_t tw_key_format_lines(const tw_run_params *p, unsigned flags, char *buf, size_t size)
{
    kbuf b = {buf, size, 0};
    if (size) buf[0] = '\0';
    for (int k = 0; k < TW_KEY_COUNT; k++) {
        if ((tw_keys[k].flags & flags) != flags) continue;
        add(&b, "%s ", tw_keys[k].path);
        size_t room = b.len < b.size ? b.size - b.len : 0;
        b.len += tw_key_format((tw_key_id)k, p, room ? b.s + b.len : NULL, room);
        add(&b, "\n");
    }
    return b.len;
}

size_t tw_key_format_products(unsigned products, char *buf, size_t size)
{
    kbuf b = {buf, size, 0};
    if (size) buf[0] = '\0';
    add_products(&b, products);
    return b.len;
}

int tw_output_name_expand(const char *tmpl, const char *stem, const char *parent, int index,
                          char *out, size_t size, char *why, size_t why_size)
{
    kbuf b = {out, size, 0};
    if (size) out[0] = '\0';
    if (why_size) why[0] = '\0';
    for (const char *t = tmpl; *t;) {
        if (*t != '{') {
            size_t n = strcspn(t, "{");
            add(&b, "%.*s", (int)n, t);
            t += n;
            continue;
        }
        const char *close = strchr(t, '}');
        size_t n = close ? (size_t)(close - t) + 1 : strlen(t);
        if (close && n == 6 && strncmp(t, "{stem}", 6) == 0)
            add(&b, "%s", stem);
        else if (close && n == 8 && strncmp(t, "{parent}", 8) == 0)
            add(&b, "%s", parent);
        else if (close && n == 7 && strncmp(t, "{index}", 7) == 0)
            add(&b, "%d", index);
        else {
            snprintf(why, why_size,
                     "'%.*s' is not a placeholder (expected {stem}, {parent} or {index})",
                     (int)(n > 40 ? 40 : n), t);
            return -1;
        }
        t += n;
    }
    if (b.len >= size || b.len > 255) {
        snprintf(why, why_size, "the name is too long (%zu bytes)", b.len);
        return -1;
    }
    if (b.len == 0 || strcmp(out, ".") == 0 || strcmp(out, "..") == 0 || strchr(out, '/')) {
        snprintf(why, why_size, "'%s' is not a file name (empty, '.', '..' or with a '/')", out);
        return -1;
    }
    return 0;
}
