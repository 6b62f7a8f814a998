/* keys.h - the one table of workflow keys.
 *
 * Every key a workflow file or `--set` may give is one row of tw_keys[]:
 * its path, its kind of value, its words (enum names), range and default,
 * and whether an output byte depends on it. Everything that walks keys walks
 * this table, so a key added here is parsed, echoed, fingerprinted and
 * documented everywhere at once:
 *   - config/workflow.c: the parser, `--set`, "did you mean", the ranges
 *     and enum words in messages (one setter per key, checked complete);
 *   - pipeline/run/run.c: the parts fingerprint is one line per TW_KEY_BYTES key
 *     (tw_key_format), so resumed runs, shards and merges are refused when
 *     any of them differs, naming the keys;
 *   - pipeline/report/report.c: run.json's "config" and the products' TILEWISE_RUN
 *     metadata, one entry per key in table order;
 *   - tests/test_keys.c: workflows/KEYS.md has one row per key, with every
 *     enum word and the default shown here.
 * tw_key_format and the per-key switches around the tree are exhaustive
 * switches over tw_key_id without a default, so -Wswitch (-Werror in CI)
 * names any place a new key was forgotten.
 *
 * Why core/ and not config/ (DESIGN.md gives the key table to config/):
 * pipeline/ walks it too - the parts fingerprint (pipeline/run/run.c), the
 * merge manifest's reader and writer (pipeline/store/manifest.c) and
 * run.json's config (pipeline/report/report.c) - and pipeline/ sits below
 * config/ (scripts/check_layers.sh: config/ may include pipeline/, not the
 * reverse). The table describes core/params.h's struct, which every layer
 * reads, and holds no parsing: the YAML parser that walks it stays in
 * config/, as do the checks of keys against each other (check_all), except
 * those that need the model (the bundle's tile: tw_key_check_stride, used
 * by both). The same holds for core/products.h's table.
 */
#ifndef TW_KEYS_H
#define TW_KEYS_H

#include <stdbool.h>
#include <stddef.h>

#include "core/params.h"

/* In table order: the order of KEYS.md's sections, of run.json's config
 * and of the fingerprint's lines. */
typedef enum tw_key_id {
    TW_KEY_INPUT_PATH,
    TW_KEY_INPUT_BANDS,
    TW_KEY_INPUT_SCALE,
    TW_KEY_INPUT_NODATA,
    TW_KEY_INPUT_ON_ERROR,
    TW_KEY_INPUT_ASSETS,
    TW_KEY_INPUT_RETRIES,
    TW_KEY_INPUT_RETRY_DELAY,
    TW_KEY_INPUT_TIMEOUT,
    TW_KEY_INPUT_AOI,
    TW_KEY_INPUT_DATETIME,
    TW_KEY_MODEL_WEIGHTS,
    TW_KEY_MODEL_ARCH,
    TW_KEY_MODEL_MEAN,
    TW_KEY_MODEL_STD,
    TW_KEY_MODEL_CLASSES,
    TW_KEY_MODEL_COLORS,
    TW_KEY_MODEL_STEM,
    TW_KEY_TILING_TILE,
    TW_KEY_TILING_STRIDE,
    TW_KEY_TILING_BATCH,
    TW_KEY_TILING_EDGE,
    TW_KEY_TILING_MAX_NODATA_FRACTION,
    TW_KEY_TILING_BLEND,
    TW_KEY_TILING_MARGIN,
    TW_KEY_RUNTIME_DEVICE,
    TW_KEY_RUNTIME_PRECISION,
    TW_KEY_RUNTIME_MEMORY,
    TW_KEY_RUNTIME_THREADS,
    TW_KEY_RUNTIME_READERS,
    TW_KEY_OUTPUT_DIR,
    TW_KEY_OUTPUT_NAME,
    TW_KEY_OUTPUT_STAC,
    TW_KEY_OUTPUT_PRODUCTS,
    TW_KEY_OUTPUT_PROB_TYPE,
    TW_KEY_OUTPUT_EMBEDDING_TYPE,
    TW_KEY_OUTPUT_RESOLUTION,
    TW_KEY_OUTPUT_FORMAT,
    TW_KEY_OUTPUT_CREATION_OPTIONS,
    TW_KEY_OUTPUT_VECTOR_FORMAT,
    TW_KEY_OUTPUT_MIN_AREA,
    TW_KEY_OUTPUT_SIMPLIFY,
    TW_KEY_COUNT
} tw_key_id;

/* The kind of value a key takes (KEYS.md, "Values"). */
typedef enum tw_key_type {
    TW_KT_PATH,     /* one path */
    TW_KT_PATHS,    /* a path or a list of paths */
    TW_KT_INT,      /* an integer in lo..hi */
    TW_KT_AUTO_INT, /* auto, or an integer in lo..hi (0 in the struct: auto) */
    TW_KT_NUMBER,   /* a number in the range `range` says (lo..hi, bounds per the setter) */
    TW_KT_ENUM,     /* one of names[], case-insensitive; the struct holds its index */
    TW_KT_ENUMS,    /* a list of output.products words (core/products.h's table) */
    TW_KT_SIZE,     /* bytes: 512MiB, 2GiB, ... */
    TW_KT_INTS,     /* a list of integers */
    TW_KT_NUMBERS,  /* a list of numbers */
    TW_KT_STRINGS,  /* a list of strings */
    TW_KT_STRING,   /* one string */
    TW_KT_SPECIAL,  /* words and numbers, as the key's row says (nodata, device) */
    TW_KT_BOOL,     /* true or false (YAML's yes/no, on/off too) */
} tw_key_type;

/* tw_key.flags */
enum {
    /* An output byte depends on it (a product's pixels, its names, colours,
     * format or layout): it is a line of the parts fingerprint, and a resumed
     * run, a shard or a merge whose value differs is refused (exit 6). Keys
     * without it say why in tw_key.why. */
    TW_KEY_BYTES = 1u << 0,
    /* Its value is resolved from the model bundle when not given: the
     * fingerprint and run.json show the resolved value. */
    TW_KEY_RESOLVED = 1u << 1,
};

typedef struct tw_key {
    const char *path;         /* "tiling.stride" */
    tw_key_type type;         /* what the parser accepts */
    const char *const *names; /* TW_KT_ENUM's words in enum order; read with tw_key_word */
    int n_names;
    double lo, hi;     /* TW_KT_INT/AUTO_INT/NUMBER(S)/INTS: the range */
    const char *range; /* the range or shape in words, for messages ("0..1") */
    const char *def;   /* the default as KEYS.md shows it (`...` in its default column) or
                          NULL when the default is prose (the bundle's, else ...) */
    unsigned flags;    /* TW_KEY_* */
    const char *why;   /* without TW_KEY_BYTES: why no output byte depends on it */
} tw_key;

extern const tw_key tw_keys[TW_KEY_COUNT];

/* The sections, in table order: input, model, tiling, runtime, output. */
#define TW_KEY_SECTIONS 5
extern const char *const tw_key_sections[TW_KEY_SECTIONS];

/* The key named path ("tiling.stride"), or -1. */
int tw_key_find(const char *path);

/* The key's name within its section ("stride" for "tiling.stride"). */
const char *tw_key_leaf(tw_key_id k);

/* The key's section index in tw_key_sections. */
int tw_key_section(tw_key_id k);

/* tiling.stride against the tile it strides: 0 when stride divides tile
 * (1 <= stride <= tile); else writes why into msg (without the key's name:
 * "48 does not divide tile 64 (expected a divisor such as 32)"), naming
 * tile_from after the tile when not NULL ("the model bundle's tile size"),
 * and returns -1. The one message for the parser's check of the given keys
 * (config/workflow.c) and the run's of the bundle's tile (pipeline/run/
 * run.c): the run's needs the model, which config/ comes after. Cannot
 * fail; thread-safe. */
int tw_key_check_stride(int tile, int stride, const char *tile_from, char *msg, size_t size);

/* Whether model.arch names a segmentation network (fcn_*, deeplabv3_*,
 * unet_*): its stride need not divide its tile. NULL or "": false. */
bool tw_key_arch_segments(const char *arch);

/* Word i of an enum key (names[i]; output.products, whose names is NULL:
 * tw_products[i].word), or "?" outside 0..n_names-1. Cannot fail. */
const char *tw_key_word(tw_key_id k, int i);

/* The value of key k in p as one line of text, written so that
 * `--set PATH=TEXT` gives the same value back: words as the table spells
 * them, integers in decimal, doubles with 17 significant digits and floats
 * with 9 (exact round trips), lists as [a, b], strings quoted ("...",
 * JSON escapes) unless they are plain words and paths; a value left to
 * the bundle (tile 0, arch "") shows as auto. Writes at most size
 * bytes (NUL included); returns the length it needed, as snprintf does.
 * Cannot fail; thread-safe. */
size_t tw_key_format(tw_key_id k, const tw_run_params *p, char *buf, size_t size);

/* One "path value" line (tw_key_format) for every key whose flags include
 * all of `flags`, in table order: the parts fingerprint's key lines with
 * TW_KEY_BYTES. Returns the length it needed, as snprintf does. */
size_t tw_key_format_lines(const tw_run_params *p, unsigned flags, char *buf, size_t size);

/* The output name of an input from output.name's template: {stem} is the
 * input's file name without its extension (url.h: without a URL's query),
 * {parent} the name of the folder holding it, {index} its 1-based place in
 * input.path. Writes at most size bytes. Returns 0, or -1 with a reason in
 * why (a placeholder it does not know, a name that is empty, "." or "..",
 * or holds a '/'; or that does not fit). Cannot fail otherwise. */
int tw_output_name_expand(const char *tmpl, const char *stem, const char *parent, int index,
                          char *out, size_t size, char *why, size_t why_size);

/* The product names of a TW_PRODUCT_* set, "[class, prob]", as above. */
size_t tw_key_format_products(unsigned products, char *buf, size_t size);

#endif
