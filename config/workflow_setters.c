/* workflow_setters.c - the setter of each workflow key: it checks the
 * value fully and replaces the field it owns, so a key given in the file
 * and again with --set goes through the same checks (workflow.c calls it
 * through wf_setters). */
#include "config/workflow_internal.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/datetime.h"

/* ------------------------------------------------------------------------ */
/* setters, one per key                                                     */

/* ------------------------------------------------------------------------ */
/* setters of the table's plain kinds: words, ranges and messages come from
 * tw_keys[c->key] (core/keys.h) */

/* One of the key's words: the struct holds its index (every enum of
 * params.h counts from 0 in the table's order). */
static tw_status set_enum(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    const tw_key *k = &tw_keys[c->key];
    int i;
    tw_status st = wf_get_choice(c, v, k->names, k->n_names, &i);
    if (st) return st;
    switch ((tw_key_id)c->key) {
    case TW_KEY_INPUT_ON_ERROR: p->input.on_error = (tw_on_error)i; break;
    case TW_KEY_MODEL_ARCH: snprintf(p->model.arch, sizeof p->model.arch, "%s", k->names[i]); break;
    case TW_KEY_MODEL_STEM: p->model.stem = (tw_stem)i; break;
    case TW_KEY_TILING_EDGE: p->tiling.edge = (tw_edge_mode)i; break;
    case TW_KEY_TILING_BLEND: p->tiling.blend = (tw_blend_mode)i; break;
    case TW_KEY_RUNTIME_PRECISION: p->runtime.precision = (tw_precision)i; break;
    case TW_KEY_OUTPUT_PROB_TYPE: p->output.prob_type = (tw_prob_type)i; break;
    case TW_KEY_OUTPUT_EMBEDDING_TYPE: p->output.emb_type = (tw_emb_type)i; break;
    case TW_KEY_OUTPUT_RESOLUTION: p->output.resolution = (tw_resolution)i; break;
    case TW_KEY_OUTPUT_FORMAT: p->output.format = (tw_format)i; break;
    case TW_KEY_OUTPUT_VECTOR_FORMAT: p->output.vector_format = (tw_vector_format)i; break;
    default: TW_ASSERT(!"set_enum: a key of another kind");
    }
    return TW_OK;
}

/* The int field of an integer key. */
static int *int_field(int key, tw_run_params *p)
{
    switch ((tw_key_id)key) {
    case TW_KEY_INPUT_RETRIES: return &p->input.retries;
    case TW_KEY_TILING_TILE: return &p->tiling.tile;
    case TW_KEY_TILING_STRIDE: return &p->tiling.stride;
    case TW_KEY_TILING_MARGIN: return &p->tiling.margin;
    case TW_KEY_TILING_BATCH: return &p->tiling.batch;
    case TW_KEY_RUNTIME_THREADS: return &p->runtime.threads;
    case TW_KEY_RUNTIME_READERS: return &p->runtime.readers;
    default: TW_ASSERT(!"int_field: a key of another kind"); return NULL;
    }
}

static tw_status set_int(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    const tw_key *k = &tw_keys[c->key];
    return wf_get_int(c, v, (long long)k->lo, (long long)k->hi, int_field(c->key, p));
}

static tw_status set_auto_int(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    const tw_key *k = &tw_keys[c->key];
    return wf_get_auto_int(c, v, (long long)k->lo, (long long)k->hi, int_field(c->key, p));
}

/* A number in the key's closed range lo..hi (input.scale's lo is the
 * smallest double above 0: "a number > 0"). */
static tw_status set_number(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    const tw_key *k = &tw_keys[c->key];
    double x;
    tw_status st = wf_get_number(c, v, &x);
    if (st) return st;
    if (!(x >= k->lo && x <= k->hi))
        return wf_fail(c, v, "%g is out of range (expected %s)", x, k->range);
    switch ((tw_key_id)c->key) {
    case TW_KEY_INPUT_SCALE: p->input.scale = x; break;
    case TW_KEY_INPUT_RETRY_DELAY: p->input.retry_delay = x; break;
    case TW_KEY_INPUT_TIMEOUT: p->input.timeout = x; break;
    case TW_KEY_TILING_MAX_NODATA_FRACTION: p->tiling.max_nodata_fraction = x; break;
    case TW_KEY_OUTPUT_MIN_AREA: p->output.min_area = x; break;
    case TW_KEY_OUTPUT_SIMPLIFY: p->output.simplify = x; break;
    default: TW_ASSERT(!"set_number: a key of another kind");
    }
    return TW_OK;
}

/* ------------------------------------------------------------------------ */
/* setters of the keys with words and shapes of their own                   */

static tw_status set_input_path(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    int n;
    tw_status st = wf_check_list(c, v, "raster paths", TW_MAX_INPUTS, &n);
    for (int i = 0; !st && i < n; i++)
        st = wf_get_string(c, wf_list_item(c, v, i), "a raster path", p->input.paths[i],
                           TW_PATH_MAX);
    if (!st) p->input.n_paths = n;
    return st;
}

static tw_status set_input_bands(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    int n;
    tw_status st = wf_check_list(c, v, "band numbers (1-based)", TW_MAX_BANDS, &n);
    for (int i = 0; !st && i < n; i++)
        st = wf_get_int(c, wf_list_item(c, v, i), 1, INT_MAX, &p->input.bands[i]);
    if (!st) p->input.n_bands = n;
    return st;
}

static tw_status set_input_nodata(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    static const char *what = "auto, nan or a number";
    const char *s = NULL;
    size_t len = 0;
    tw_status st = wf_get_text(c, v, what, &s, &len);
    if (st) return st;
    if (strcasecmp(s, "auto") == 0) {
        p->input.nodata_auto = true;
        return TW_OK;
    }
    double x;
    if (strcasecmp(s, "nan") == 0 || strcasecmp(s, ".nan") == 0) {
        x = NAN;
    } else {
        wf_num r = wf_parse_number(s, &x);
        if (r != NUM_OK) return wf_fail_number(c, v, r, what, s, len);
    }
    p->input.nodata_auto = false;
    p->input.nodata = x;
    return TW_OK;
}

static tw_status set_input_assets(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    int n;
    tw_status st = wf_check_list(c, v, "STAC asset names", TW_MAX_BANDS, &n);
    for (int i = 0; !st && i < n; i++)
        st = wf_get_string(c, wf_list_item(c, v, i), "an asset name", p->input.assets[i],
                           TW_NAME_MAX);
    if (!st) p->input.n_assets = n;
    return st;
}

static tw_status set_input_aoi(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    return wf_get_string(c, v, "a vector file path (GeoPackage, Shapefile, GeoJSON, ...)",
                         p->input.aoi, TW_PATH_MAX);
}

/* An RFC 3339 date-time (core/datetime.h), checked here so that a typo is a
 * config error naming the key, not a bad STAC item after the run. */
static tw_status set_input_datetime(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    static const char *what = "an RFC 3339 date-time such as 2021-06-01T10:30:00Z";
    char s[sizeof p->input.datetime], why[160];
    tw_status st = wf_get_string(c, v, what, s, sizeof s);
    if (st) return st;
    if (!tw_rfc3339_check(s, why, sizeof why))
        return wf_fail(c, v, "'%s' is not %s: %s", s, what, why);
    memcpy(p->input.datetime, s, sizeof s);
    return TW_OK;
}

/* true or false; YAML 1.1's yes/no and on/off too (what libyaml leaves as text). */
static tw_status set_bool(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    static const char *const words[] = {"false", "true", "no", "yes", "off", "on"};
    int i;
    tw_status st = wf_get_choice(c, v, words, 6, &i);
    if (st) return st;
    switch ((tw_key_id)c->key) {
    case TW_KEY_OUTPUT_STAC: p->output.stac = (i % 2) == 1; break;
    default: TW_ASSERT(!"set_bool: a key of another kind");
    }
    return TW_OK;
}

static tw_status set_model_weights(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    return wf_get_string(c, v, "a model file path", p->model.weights, TW_PATH_MAX);
}

/* mean or std: finite numbers that fit a float; std must be > 0. */
static tw_status set_norm(wf_ctx *c, const yaml_node_t *v, float *dst, int *n_dst, bool positive)
{
    int n;
    tw_status st = wf_check_list(c, v, "numbers, one per band", TW_MAX_BANDS, &n);
    for (int i = 0; !st && i < n; i++) {
        const yaml_node_t *it = wf_list_item(c, v, i);
        double x;
        st = wf_get_number(c, it, &x);
        if (st) break;
        if (fabs(x) > FLT_MAX)
            st = wf_fail(c, it, "%g is too large for float32", x);
        else if (positive && !(x > 0))
            st = wf_fail(c, it, "%g is out of range (expected a number > 0)", x);
        else
            dst[i] = (float)x;
    }
    if (!st) *n_dst = n;
    return st;
}

static tw_status set_model_mean(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    return set_norm(c, v, p->model.mean, &p->model.n_mean, false);
}

static tw_status set_model_std(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    return set_norm(c, v, p->model.std, &p->model.n_std, true);
}

static tw_status set_model_classes(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    int n;
    tw_status st = wf_check_list(c, v, "class names", TW_MAX_CLASSES, &n);
    for (int i = 0; !st && i < n; i++) {
        const yaml_node_t *it = wf_list_item(c, v, i);
        st = wf_get_string(c, it, "a class name", p->model.classes[i], TW_NAME_MAX);
        /* Names reach terminals, band descriptions and legends: a control
         * character there (ESC, CR, a newline) rewrites what a user sees. */
        for (const unsigned char *ch = (const unsigned char *)p->model.classes[i]; !st && *ch; ch++)
            if (*ch < 0x20 || *ch == 0x7f)
                st = wf_fail(c, it, "class name %d holds a control character (byte 0x%02x)", i + 1,
                             *ch);
        for (int j = 0; !st && j < i; j++)
            if (strcmp(p->model.classes[i], p->model.classes[j]) == 0) {
                char d[WF_SHOW_MAX + 8];
                const char *s = p->model.classes[i];
                st = wf_fail(c, it, "duplicate class name '%s' (items %d and %d)",
                             wf_show(s, strlen(s), d, sizeof d), j + 1, i + 1);
            }
    }
    if (!st) p->model.n_classes = n;
    return st;
}

/* '#rrggbb' (or 'rrggbb', '#rgb') into RGB; false when it is not one. */
static bool parse_color(const char *s, unsigned char rgb[3])
{
    if (*s == '#') s++;
    size_t n = strlen(s);
    if (n != 6 && n != 3) return false;
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)s[i])) return false;
    for (int k = 0; k < 3; k++) {
        char h[3] = {s[n == 6 ? 2 * k : k], s[n == 6 ? 2 * k + 1 : k], 0};
        rgb[k] = (unsigned char)strtoul(h, NULL, 16);
    }
    return true;
}

static tw_status set_model_colors(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    int n;
    tw_status st = wf_check_list(c, v, "class colours ('#rrggbb')", TW_MAX_CLASSES, &n);
    for (int i = 0; !st && i < n; i++) {
        const yaml_node_t *it = wf_list_item(c, v, i);
        const char *s = NULL;
        size_t len = 0;
        st = wf_get_text(c, it, "a colour in quotes, '#rrggbb' (unquoted, # starts a YAML comment)",
                         &s, &len);
        if (!st && !parse_color(s, p->model.colors[i])) {
            char d[WF_SHOW_MAX + 8];
            st = wf_fail(c, it,
                         "'%s' is not a colour (expected '#rrggbb' in quotes, e.g. '#0072bd': "
                         "unquoted, YAML reads # as a comment)",
                         wf_show(s, len, d, sizeof d));
        }
    }
    if (!st) p->model.n_colors = n;
    return st;
}

static tw_status set_runtime_device(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    static const char *what = "auto | cpu | cuda | cuda:N";
    const char *s = NULL;
    size_t len = 0;
    tw_status st = wf_get_text(c, v, what, &s, &len);
    if (st) return st;
    char *dev = p->runtime.device;
    size_t cap = sizeof p->runtime.device;
    if (strcasecmp(s, "auto") == 0 || strcasecmp(s, "cpu") == 0 || strcasecmp(s, "cuda") == 0) {
        for (size_t i = 0; i <= len && i < cap; i++) dev[i] = (char)tolower((unsigned char)s[i]);
        return TW_OK;
    }
    long long n;
    if (strncasecmp(s, "cuda:", 5) == 0 && isdigit((unsigned char)s[5]) &&
        wf_parse_int(s + 5, &n)) {
        if (n > 1023) return wf_fail(c, v, "GPU index %lld is out of range (expected 0..1023)", n);
        snprintf(dev, cap, "cuda:%d", (int)n);
        return TW_OK;
    }
    char d[WF_SHOW_MAX + 8];
    return wf_fail(c, v, "expected %s, got '%s'", what, wf_show(s, len, d, sizeof d));
}

static tw_status set_runtime_memory(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    static const char *what = "a size such as 512MiB, 2GiB, 1.5GB or a number of bytes";
    const char *s = NULL;
    size_t len = 0;
    tw_status st = wf_get_text(c, v, what, &s, &len);
    if (st) return st;
    size_t bytes;
    char d[WF_SHOW_MAX + 8];
    if (tw_parse_bytes(s, &bytes) != 0)
        return wf_fail(c, v, "bad size '%s' (expected %s)", wf_show(s, len, d, sizeof d), what);
    if (bytes < WF_MEMORY_MIN)
        return wf_fail(c, v, "%s is too small (at least 16MiB)", wf_show(s, len, d, sizeof d));
    p->runtime.memory = bytes;
    return TW_OK;
}

static tw_status set_output_dir(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    return wf_get_string(c, v, "a directory path", p->output.dir, TW_PATH_MAX);
}

static tw_status set_output_name(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    if (v && v->type == YAML_MAPPING_NODE) /* name: {stem}_x reads as a YAML mapping */
        return wf_fail(c, v,
                       "expected a name template in quotes, e.g. \"{parent}_{stem}\" "
                       "(unquoted, YAML reads { as the start of a mapping)");
    char tmpl[TW_OUTPUT_NAME_MAX];
    tw_status st = wf_get_string(c, v, "a name template such as \"{stem}\" or \"{parent}_{stem}\"",
                                 tmpl, sizeof tmpl);
    if (st) return st;
    char name[TW_OUTPUT_NAME_MAX + 256], why[160];
    if (strchr(tmpl, '/'))
        return wf_fail(c, v, "'%s' holds a '/' (output names are file names in output.dir)", tmpl);
    if (tw_output_name_expand(tmpl, "scene", "folder", 1, name, sizeof name, why, sizeof why) != 0)
        return wf_fail(c, v, "%s", why);
    snprintf(p->output.name, sizeof p->output.name, "%s", tmpl);
    return TW_OK;
}

static tw_status set_output_products(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    const tw_key *key = &tw_keys[c->key];
    int n;
    tw_status st = wf_check_list(c, v, "products", 16, &n);
    unsigned products = 0;
    const char *words[TW_PRODUCT_COUNT];
    for (int k = 0; k < key->n_names; k++) words[k] = tw_key_word(c->key, k);
    for (int i = 0; !st && i < n; i++) {
        int k;
        st = wf_get_choice(c, wf_list_item(c, v, i), words, key->n_names, &k);
        if (st) break;
        /* embeddings live in the HDF5 tile table, so they imply it */
        products |= tw_products[k].bit | tw_products[k].implies;
    }
    if (!st) p->output.products = products;
    return st;
}

static tw_status set_output_creation_options(wf_ctx *c, const yaml_node_t *v, tw_run_params *p)
{
    /* An explicit empty list is allowed: it clears the options. */
    if (v && v->type == YAML_SEQUENCE_NODE && wf_list_len(v) == 0) {
        p->output.n_creation_options = 0;
        return TW_OK;
    }
    int n;
    tw_status st = wf_check_list(c, v, "KEY=VALUE strings", TW_MAX_CREATION_OPTIONS, &n);
    for (int i = 0; !st && i < n; i++) {
        const yaml_node_t *it = wf_list_item(c, v, i);
        char *o = p->output.creation_options[i];
        st = wf_get_string(c, it, "a KEY=VALUE string", o, sizeof p->output.creation_options[i]);
        if (!st) {
            const char *eq = strchr(o, '=');
            char d[WF_SHOW_MAX + 8];
            if (!eq || eq == o)
                st = wf_fail(c, it, "expected KEY=VALUE, got '%s'",
                             wf_show(o, strlen(o), d, sizeof d));
        }
    }
    if (!st) p->output.n_creation_options = n;
    return st;
}

/* One setter per key of the table (core/keys.h); tests/test_keys.c checks
 * that none is missing through tw_workflow_key_parsed. */
const wf_setter wf_setters[TW_KEY_COUNT] = {
    [TW_KEY_INPUT_PATH] = set_input_path,
    [TW_KEY_INPUT_BANDS] = set_input_bands,
    [TW_KEY_INPUT_SCALE] = set_number,
    [TW_KEY_INPUT_NODATA] = set_input_nodata,
    [TW_KEY_INPUT_ON_ERROR] = set_enum,
    [TW_KEY_INPUT_ASSETS] = set_input_assets,
    [TW_KEY_INPUT_RETRIES] = set_int,
    [TW_KEY_INPUT_RETRY_DELAY] = set_number,
    [TW_KEY_INPUT_TIMEOUT] = set_number,
    [TW_KEY_INPUT_AOI] = set_input_aoi,
    [TW_KEY_INPUT_DATETIME] = set_input_datetime,
    [TW_KEY_MODEL_WEIGHTS] = set_model_weights,
    [TW_KEY_MODEL_ARCH] = set_enum,
    [TW_KEY_MODEL_MEAN] = set_model_mean,
    [TW_KEY_MODEL_STD] = set_model_std,
    [TW_KEY_MODEL_CLASSES] = set_model_classes,
    [TW_KEY_MODEL_COLORS] = set_model_colors,
    [TW_KEY_MODEL_STEM] = set_enum,
    [TW_KEY_TILING_TILE] = set_int,
    [TW_KEY_TILING_STRIDE] = set_int,
    [TW_KEY_TILING_BATCH] = set_auto_int,
    [TW_KEY_TILING_EDGE] = set_enum,
    [TW_KEY_TILING_MAX_NODATA_FRACTION] = set_number,
    [TW_KEY_TILING_BLEND] = set_enum,
    [TW_KEY_TILING_MARGIN] = set_int,
    [TW_KEY_RUNTIME_DEVICE] = set_runtime_device,
    [TW_KEY_RUNTIME_PRECISION] = set_enum,
    [TW_KEY_RUNTIME_MEMORY] = set_runtime_memory,
    [TW_KEY_RUNTIME_THREADS] = set_auto_int,
    [TW_KEY_RUNTIME_READERS] = set_auto_int,
    [TW_KEY_OUTPUT_DIR] = set_output_dir,
    [TW_KEY_OUTPUT_NAME] = set_output_name,
    [TW_KEY_OUTPUT_STAC] = set_bool,
    [TW_KEY_OUTPUT_PRODUCTS] = set_output_products,
    [TW_KEY_OUTPUT_PROB_TYPE] = set_enum,
    [TW_KEY_OUTPUT_EMBEDDING_TYPE] = set_enum,
    [TW_KEY_OUTPUT_RESOLUTION] = set_enum,
    [TW_KEY_OUTPUT_FORMAT] = set_enum,
    [TW_KEY_OUTPUT_CREATION_OPTIONS] = set_output_creation_options,
    [TW_KEY_OUTPUT_VECTOR_FORMAT] = set_enum,
    [TW_KEY_OUTPUT_MIN_AREA] = set_number,
    [TW_KEY_OUTPUT_SIMPLIFY] = set_number,
};
