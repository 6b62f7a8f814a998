/* manifest.c - the shard/merge manifest as versioned JSON text (see manifest.h) */
#include "pipeline/store/manifest.h"

#include <errno.h>
#include <jansson.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/datetime.h"
#include "core/fileio.h"

#define FORMAT_NAME "tilewise-manifest"

#define N_DTYPES (TW_DT_INT8 + 1)

tw_status tw_manifest_path(const char *out_dir, const char *stem, char *buf, size_t size,
                           tw_error *err)
{
    if (snprintf(buf, size, "%s/.tilewise/%s/manifest", out_dir, stem) >= (int)size)
        return tw_error_set(err, TW_ERR_OUTPUT, "output path too long: %s", out_dir);
    return TW_OK;
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                  */

/* A string as JSON: itself when it is valid UTF-8 (the usual case), else
 * {"hex": "..."} of its bytes, so that any path the file system allows
 * survives the round trip exactly. */
static json_t *put_str(const char *s)
{
    json_t *v = json_string(s);
    if (v) return v;
    size_t n = strlen(s);
    char *hex = malloc(2 * n + 1);
    if (!hex) return NULL;
    for (size_t i = 0; i < n; i++) snprintf(hex + 2 * i, 3, "%02x", (unsigned char)s[i]);
    v = json_pack("{s:s}", "hex", hex);
    free(hex);
    return v;
}

/* Doubles as JSON numbers written with 17 significant digits (exact round
 * trip); non-finite ones (a NaN nodata) as the strings "nan", "inf", "-inf". */
static json_t *put_real(double d)
{
    if (isnan(d)) return json_string("nan");
    if (isinf(d)) return json_string(d > 0 ? "inf" : "-inf");
    return json_real(d);
}

/* json_object_set_new that remembers a failed allocation in *ok. */
static void set(json_t *obj, const char *key, json_t *v, bool *ok)
{
    if (!v || json_object_set_new(obj, key, v) != 0) *ok = false;
}

static void append(json_t *arr, json_t *v, bool *ok)
{
    if (!v || json_array_append_new(arr, v) != 0) *ok = false;
}

/* output: where, what and how the products are written (merge writes them
 * as the run would). */
static void format_output(json_t *root, const tw_run_params *p, bool *ok)
{
    json_t *out = json_object();
    if (out) {
        set(out, "dir", put_str(p->output.dir), ok);
        set(out, "name", put_str(p->output.name), ok);
        json_t *prods = json_array();
        for (size_t i = 0; prods && i < TW_PRODUCT_COUNT; i++)
            if (p->output.products & tw_products[i].bit)
                append(prods, json_string(tw_products[i].word), ok);
        set(out, "products", prods, ok);
        set(out, "prob_type", json_string(tw_prob_type_names[p->output.prob_type]), ok);
        set(out, "embedding_type", json_string(tw_emb_type_names[p->output.emb_type]), ok);
        set(out, "format", json_string(tw_format_names[p->output.format]), ok);
        json_t *co = json_array();
        for (int i = 0; co && i < p->output.n_creation_options; i++)
            append(co, put_str(p->output.creation_options[i]), ok);
        set(out, "creation_options", co, ok);
        /* merge writes the products as the run would: their grid and colours */
        set(out, "resolution",
            json_string(p->output.resolution == TW_RESOLUTION_INPUT ? "input" : "cells"), ok);
        json_t *colors = json_array();
        for (int i = 0; colors && i < p->model.n_colors; i++) {
            char hex[8];
            snprintf(hex, sizeof hex, "#%02x%02x%02x", p->model.colors[i][0], p->model.colors[i][1],
                     p->model.colors[i][2]);
            append(colors, json_string(hex), ok);
        }
        set(out, "colors", colors, ok);
        /* the polygons merge writes */
        set(out, "vector_format", json_string(tw_vector_format_names[p->output.vector_format]), ok);
        set(out, "min_area", put_real(p->output.min_area), ok);
        set(out, "simplify", put_real(p->output.simplify), ok);
    }
    set(root, "output", out, ok);
}

/* stac: the merged products' STAC item, when the run writes one. */
static void format_stac(json_t *root, const tw_manifest *mf, bool *ok)
{
    const tw_run_params *p = &mf->p;
    if (p->output.stac) { /* merge writes the merged products' STAC item */
        json_t *stac = json_object();
        set(stac, "datetime", json_string(mf->stac.datetime), ok);
        set(stac, "source", put_str(mf->stac.source), ok);
        set(stac, "derived_from", put_str(mf->stac.derived_from), ok);
        set(stac, "weights", put_str(p->model.weights), ok);
        json_t *names = json_array();
        for (int i = 0; names && i < p->input.n_assets; i++)
            append(names, put_str(p->input.assets[i]), ok);
        set(stac, "assets", names, ok);
        set(root, "stac", stac, ok);
    }
}

/* model: what the shards run (the resolved model). */
static void format_model(json_t *root, const tw_resolved *m, bool *ok)
{
    json_t *model = json_object();
    if (model) {
        set(model, "arch", put_str(m->arch), ok);
        set(model, "stem", put_str(tw_stem_names[m->stem]), ok);
        json_t *bands = json_array();
        for (int i = 0; bands && i < m->n_bands; i++) append(bands, json_integer(m->bands[i]), ok);
        set(model, "bands", bands, ok);
        set(model, "scale", put_real(m->scale), ok);
        json_t *mean = json_array(), *std = json_array();
        for (int i = 0; mean && std && i < m->n_norm; i++) {
            append(mean, put_real(m->mean[i]), ok);
            append(std, put_real(m->std[i]), ok);
        }
        set(model, "mean", mean, ok);
        set(model, "std", std, ok);
        json_t *classes = json_array();
        for (int i = 0; classes && i < m->n_classes; i++)
            append(classes, put_str(m->classes[i]), ok);
        set(model, "classes", classes, ok);
        set(model, "tile", json_integer(m->tile), ok);
        set(model, "stride", json_integer(m->stride), ok);
        set(model, "in_bands", json_integer(m->in_bands), ok);
        set(model, "feat_dim", json_integer(m->feat_dim), ok);
        if (m->headless) set(model, "headless", json_true(), ok); /* absent: a head */
        /* absent: a classifier (manifests before segmentation) */
        if (m->segmentation) {
            set(model, "segmentation", json_true(), ok);
            set(model, "multiple", json_integer(m->multiple), ok);
        }
        set(model, "sha256", put_str(m->model_sha256), ok);
    }
    set(root, "model", model, ok);
}

/* raster: the input's geometry, type and nodata as the shards read it. */
static void format_raster(json_t *root, const tw_raster_info *info, bool *ok)
{
    json_t *ras = json_object();
    if (ras) {
        set(ras, "width", json_integer(info->width), ok);
        set(ras, "height", json_integer(info->height), ok);
        set(ras, "band_count", json_integer(info->band_count), ok);
        set(ras, "dtype", json_string(tw_dtype_name(info->dtype)), ok);
        set(ras, "block_w", json_integer(info->block_w), ok);
        set(ras, "block_h", json_integer(info->block_h), ok);
        set(ras, "has_nodata", json_boolean(info->has_nodata), ok);
        set(ras, "nodata", put_real(info->nodata), ok);
        json_t *gt = json_array();
        for (int i = 0; gt && i < 6; i++) append(gt, put_real(info->geotransform[i]), ok);
        set(ras, "geotransform", gt, ok);
        set(ras, "has_geotransform", json_boolean(info->has_geotransform), ok);
        set(ras, "crs_wkt", put_str(info->crs_wkt), ok);
        set(ras, "driver", put_str(info->driver), ok);
    }
    set(root, "raster", ras, ok);
}

static json_t *format_object(const tw_manifest *mf, bool *ok)
{
    const tw_run_params *p = &mf->p;
    json_t *root = json_object();
    if (!root) {
        *ok = false;
        return NULL;
    }
    set(root, "format", json_string(FORMAT_NAME), ok);
    set(root, "version", json_integer(TW_MANIFEST_VERSION), ok);
    set(root, "tilewise", json_string(TW_VERSION), ok);

    json_t *inputs = json_array();
    for (int i = 0; inputs && i < p->input.n_paths; i++)
        append(inputs, put_str(p->input.paths[i]), ok);
    set(root, "inputs", inputs, ok);
    /* merge reads the inputs' own nodata again at output.resolution: input */
    set(root, "nodata", p->input.nodata_auto ? json_string("auto") : put_real(p->input.nodata), ok);

    json_t *tiling = json_object();
    if (tiling) {
        set(tiling, "edge", json_string(tw_edge_names[p->tiling.edge]), ok);
        set(tiling, "blend", json_string(tw_blend_names[p->tiling.blend]), ok);
        set(tiling, "margin", json_integer(p->tiling.margin), ok);
    }
    set(root, "tiling", tiling, ok);

    format_output(root, p, ok);
    format_stac(root, mf, ok);
    format_model(root, &mf->m, ok);
    format_raster(root, &mf->info, ok);
    set(root, "config_json", put_str(mf->config_json), ok);
    set(root, "fingerprint", put_str(mf->fingerprint), ok);
    return root;
}

tw_status tw_manifest_format(const tw_manifest *mf, char **out, size_t *len, tw_error *err)
{
    *out = NULL;
    *len = 0;
    if ((unsigned)mf->p.tiling.edge > TW_EDGE_SKIP ||
        (unsigned)mf->p.output.prob_type > TW_PROB_UINT8 ||
        (unsigned)mf->p.output.emb_type > TW_EMB_INT8 ||
        (unsigned)mf->p.output.format > TW_FORMAT_COG || (unsigned)mf->info.dtype >= N_DTYPES)
        return tw_error_set(err, TW_ERR_INTERNAL, "manifest: an enum value out of range");
    bool ok = true;
    json_t *root = format_object(mf, &ok);
    char *text = NULL;
    if (ok) text = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(root);
    if (!text) return tw_error_set(err, TW_ERR_NOMEM, "cannot format the run manifest");
    /* A trailing newline, as text files have. */
    size_t n = strlen(text);
    char *t2 = realloc(text, n + 2);
    if (!t2) {
        free(text);
        return tw_error_set(err, TW_ERR_NOMEM, "cannot format the run manifest");
    }
    t2[n] = '\n';
    t2[n + 1] = '\0';
    *out = t2;
    *len = n + 1;
    return TW_OK;
}

tw_status tw_manifest_write(const tw_manifest *mf, const char *path, tw_error *err)
{
    char *text = NULL;
    size_t len = 0;
    tw_status st = tw_manifest_format(mf, &text, &len, err);
    if (st == TW_OK) st = tw_write_file_atomic(path, text, len, err);
    free(text);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Reading: every key named, typed and range-checked; unknown keys refused. */

typedef struct rd {
    const char *name; /* the file, for messages */
    tw_error *err;
    tw_status st;
} rd;

static bool fail(rd *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(rd *r, const char *fmt, ...)
{
    if (r->st != TW_OK) return false;
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    r->st = tw_error_set(r->err, TW_ERR_INPUT, "%s: damaged run manifest: %s", r->name, what);
    return false;
}

/* Refuse keys that this version does not know: a manifest with more in it
 * was written by something else, and dropping what we do not understand
 * would assemble different products than the shards were run for. */
static bool only_keys(rd *r, json_t *obj, const char *sect, const char *const *keys, int n)
{
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v)
    {
        int i = 0;
        while (i < n && strcmp(k, keys[i]) != 0) i++;
        if (i == n) return fail(r, "unknown key %s%s%s", sect, *sect ? "." : "", k);
    }
    return true;
}

static json_t *need(rd *r, json_t *obj, const char *sect, const char *key)
{
    if (r->st != TW_OK) return NULL;
    json_t *v = json_object_get(obj, key);
    if (!v) fail(r, "key %s%s%s missing", sect, *sect ? "." : "", key);
    return v;
}

static json_t *need_obj(rd *r, json_t *obj, const char *key)
{
    json_t *v = need(r, obj, "", key);
    if (v && !json_is_object(v)) {
        fail(r, "key %s is not an object", key);
        return NULL;
    }
    return v;
}

static json_t *need_arr(rd *r, json_t *obj, const char *sect, const char *key, size_t max)
{
    json_t *v = need(r, obj, sect, key);
    if (!v) return NULL;
    if (!json_is_array(v)) {
        fail(r, "key %s.%s is not a list", sect, key);
        return NULL;
    }
    if (json_array_size(v) > max) {
        fail(r, "key %s.%s has %zu entries (at most %zu)", sect, key, json_array_size(v), max);
        return NULL;
    }
    return v;
}

static bool int_value(rd *r, json_t *v, const char *sect, const char *key, long long lo,
                      long long hi, int *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return fail(r, "key %s.%s is not an integer in %lld..%lld", sect, key, lo, hi);
    *out = (int)json_integer_value(v);
    return true;
}

static bool get_int(rd *r, json_t *obj, const char *sect, const char *key, long long lo,
                    long long hi, int *out)
{
    json_t *v = need(r, obj, sect, key);
    return v && int_value(r, v, sect, key, lo, hi, out);
}

static bool real_value(rd *r, json_t *v, const char *sect, const char *key, bool finite,
                       double *out)
{
    if (json_is_number(v)) {
        *out = json_number_value(v);
        return true;
    }
    if (!finite && json_is_string(v)) {
        const char *s = json_string_value(v);
        if (strcmp(s, "nan") == 0) *out = NAN;
        if (strcmp(s, "inf") == 0) *out = INFINITY;
        if (strcmp(s, "-inf") == 0) *out = -INFINITY;
        if (!strcmp(s, "nan") || !strcmp(s, "inf") || !strcmp(s, "-inf")) return true;
    }
    return fail(r, "key %s.%s is not a %snumber", sect, key, finite ? "finite " : "");
}

static bool get_real(rd *r, json_t *obj, const char *sect, const char *key, bool finite,
                     double *out)
{
    json_t *v = need(r, obj, sect, key);
    return v && real_value(r, v, sect, key, finite, out);
}

static bool get_bool(rd *r, json_t *obj, const char *sect, const char *key, bool *out)
{
    json_t *v = need(r, obj, sect, key);
    if (!v) return false;
    if (!json_is_boolean(v)) return fail(r, "key %s.%s is not true or false", sect, key);
    *out = json_is_true(v);
    return true;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* A string, or {"hex": ...} (see put_str), into buf: never truncated (a
 * value that does not fit is refused), no embedded NUL. */
static bool str_value(rd *r, json_t *v, const char *sect, const char *key, char *buf, size_t size)
{
    const char *what = *sect ? sect : key;
    const char *k2 = *sect ? key : "";
    if (json_is_string(v)) {
        size_t n = json_string_length(v);
        if (n >= size || strlen(json_string_value(v)) != n)
            return fail(r, "key %s%s%s: a string of %zu bytes (at most %zu, no NUL)", what,
                        *k2 ? "." : "", k2, n, size - 1);
        memcpy(buf, json_string_value(v), n + 1);
        return true;
    }
    json_t *hex = json_is_object(v) && json_object_size(v) == 1 ? json_object_get(v, "hex") : NULL;
    if (!json_is_string(hex))
        return fail(r, "key %s%s%s is not a string", what, *k2 ? "." : "", k2);
    const char *h = json_string_value(hex);
    size_t n = json_string_length(hex);
    if (n % 2 != 0 || n / 2 >= size)
        return fail(r, "key %s%s%s: bad or too long hex string", what, *k2 ? "." : "", k2);
    for (size_t i = 0; i < n / 2; i++) {
        int a = hexval(h[2 * i]), b = hexval(h[2 * i + 1]);
        if (a < 0 || b < 0 || (a == 0 && b == 0))
            return fail(r, "key %s%s%s: bad hex string", what, *k2 ? "." : "", k2);
        buf[i] = (char)(a * 16 + b);
    }
    buf[n / 2] = '\0';
    return true;
}

static bool get_str(rd *r, json_t *obj, const char *sect, const char *key, char *buf, size_t size)
{
    json_t *v = need(r, obj, sect, key);
    return v && str_value(r, v, sect, key, buf, size);
}

static bool get_enum(rd *r, json_t *obj, const char *sect, const char *key,
                     const char *const *names, int n, int *out)
{
    json_t *v = need(r, obj, sect, key);
    if (!v) return false;
    for (int i = 0; json_is_string(v) && i < n; i++)
        if (strcmp(json_string_value(v), names[i]) == 0) {
            *out = i;
            return true;
        }
    return fail(r, "key %s.%s is not one of the known names", sect, key);
}

/* inputs: the paths, and input.nodata ("auto" or a number). */
static void parse_inputs(rd *r, json_t *root, tw_run_params *p)
{
    json_t *in = need_arr(r, root, "", "inputs", TW_MAX_INPUTS);
    if (in && json_array_size(in) == 0) fail(r, "key inputs is empty");
    for (size_t i = 0; in && r->st == TW_OK && i < json_array_size(in); i++)
        str_value(r, json_array_get(in, i), "inputs", "[]", p->input.paths[i],
                  sizeof p->input.paths[i]);
    if (in) p->input.n_paths = (int)json_array_size(in);
    /* "auto" or a number (absent in a manifest written before it was carried: auto) */
    json_t *nd = json_object_get(root, "nodata");
    if (nd && !(json_is_string(nd) && strcmp(json_string_value(nd), "auto") == 0)) {
        p->input.nodata_auto = false;
        get_real(r, root, "", "nodata", false, &p->input.nodata);
    }
}

static void parse_tiling(rd *r, json_t *root, tw_run_params *p)
{
    json_t *tiling = need_obj(r, root, "tiling");
    static const char *const tiling_keys[] = {"edge", "blend", "margin"};
    if (tiling) only_keys(r, tiling, "tiling", tiling_keys, 3);
    int e = 0;
    if (tiling && get_enum(r, tiling, "tiling", "edge", tw_edge_names, 3, &e))
        p->tiling.edge = (tw_edge_mode)e;
    /* blend and margin: absent in manifests before segmentation (defaults) */
    if (tiling && json_object_get(tiling, "blend") &&
        get_enum(r, tiling, "tiling", "blend", tw_blend_names, 3, &e))
        p->tiling.blend = (tw_blend_mode)e;
    if (tiling && json_object_get(tiling, "margin"))
        get_int(r, tiling, "tiling", "margin", 0, 1 << 16, &p->tiling.margin);
}

/* output: where, what and how the products are written (merge writes them
 * as the run would). */
static void parse_output(rd *r, json_t *root, tw_run_params *p)
{
    int e = 0;
    json_t *out = need_obj(r, root, "output");
    if (out) {
        static const char *const out_keys[] = {
            "dir",        "name",   "products",      "prob_type", "format",   "creation_options",
            "resolution", "colors", "vector_format", "min_area",  "simplify", "embedding_type"};
        only_keys(r, out, "output", out_keys, 12);
        /* absent in a manifest written before polygons: gpkg, 0, 0 */
        if (json_object_get(out, "vector_format") &&
            get_enum(r, out, "output", "vector_format", tw_vector_format_names, 2, &e))
            p->output.vector_format = (tw_vector_format)e;
        if (json_object_get(out, "min_area"))
            get_real(r, out, "output", "min_area", false, &p->output.min_area);
        if (json_object_get(out, "simplify"))
            get_real(r, out, "output", "simplify", false, &p->output.simplify);
        get_str(r, out, "output", "dir", p->output.dir, sizeof p->output.dir);
        json_t *prods = need_arr(r, out, "output", "products", TW_PRODUCT_COUNT);
        p->output.products = 0;
        for (size_t i = 0; prods && r->st == TW_OK && i < json_array_size(prods); i++) {
            json_t *v = json_array_get(prods, i);
            size_t k = 0;
            while (k < TW_PRODUCT_COUNT &&
                   !(json_is_string(v) && strcmp(json_string_value(v), tw_products[k].word) == 0))
                k++;
            if (k == TW_PRODUCT_COUNT)
                fail(r, "key output.products: entry %zu is not a product name", i + 1);
            else
                p->output.products |= tw_products[k].bit;
        }
        if (prods && r->st == TW_OK && p->output.products == 0)
            fail(r, "key output.products is empty");
        if (get_enum(r, out, "output", "prob_type", tw_prob_type_names, 2, &e))
            p->output.prob_type = (tw_prob_type)e;
        if (get_enum(r, out, "output", "format", tw_format_names, 2, &e))
            p->output.format = (tw_format)e;
        /* absent in a manifest written before embedding rasters: float32 */
        if (json_object_get(out, "embedding_type") &&
            get_enum(r, out, "output", "embedding_type", tw_emb_type_names, 3, &e))
            p->output.emb_type = (tw_emb_type)e;
        json_t *co = need_arr(r, out, "output", "creation_options", TW_MAX_CREATION_OPTIONS);
        for (size_t i = 0; co && r->st == TW_OK && i < json_array_size(co); i++)
            str_value(r, json_array_get(co, i), "output", "creation_options",
                      p->output.creation_options[i], sizeof p->output.creation_options[i]);
        if (co) p->output.n_creation_options = (int)json_array_size(co);
        /* name, resolution and colors may be absent (a manifest written before
         * they were carried): "{stem}", cells, the built-in palette */
        if (json_object_get(out, "name"))
            get_str(r, out, "output", "name", p->output.name, sizeof p->output.name);
        /* resolution and colors may be absent (a manifest written before
         * they were carried): cells, the built-in palette */
        static const char *const res_names[] = {"cells", "input"};
        if (json_object_get(out, "resolution") &&
            get_enum(r, out, "output", "resolution", res_names, 2, &e))
            p->output.resolution = e == 1 ? TW_RESOLUTION_INPUT : TW_RESOLUTION_CELLS;
        json_t *colors = json_object_get(out, "colors")
                             ? need_arr(r, out, "output", "colors", TW_MAX_CLASSES)
                             : NULL;
        for (size_t i = 0; colors && r->st == TW_OK && i < json_array_size(colors); i++) {
            const char *h = json_string_value(json_array_get(colors, i));
            unsigned rr, gg, bb;
            char tail;
            if (!h || strlen(h) != 7 || sscanf(h, "#%2x%2x%2x%c", &rr, &gg, &bb, &tail) != 3)
                fail(r, "key output.colors: entry %zu is not #rrggbb", i + 1);
            else {
                p->model.colors[i][0] = (unsigned char)rr;
                p->model.colors[i][1] = (unsigned char)gg;
                p->model.colors[i][2] = (unsigned char)bb;
            }
        }
        if (colors && r->st == TW_OK) p->model.n_colors = (int)json_array_size(colors);
    }
}

/* model: what the shards ran (the resolved model). */
static void parse_model(rd *r, json_t *root, tw_resolved *m)
{
    json_t *model = need_obj(r, root, "model");
    if (model) {
        static const char *const model_keys[] = {"arch",     "stem",         "bands",    "scale",
                                                 "mean",     "std",          "classes",  "tile",
                                                 "stride",   "in_bands",     "feat_dim", "sha256",
                                                 "headless", "segmentation", "multiple"};
        only_keys(r, model, "model", model_keys, 15);
        get_str(r, model, "model", "arch", m->arch, sizeof m->arch);
        /* stem: absent in manifests written before the small stem (standard) */
        const char *stem = json_string_value(json_object_get(model, "stem"));
        m->stem = TW_STEM_STANDARD;
        for (int i = 0; stem && i < 3; i++)
            if (strcmp(stem, tw_stem_names[i]) == 0) m->stem = (tw_stem)i;
        json_t *bands = need_arr(r, model, "model", "bands", TW_MAX_BANDS);
        for (size_t i = 0; bands && r->st == TW_OK && i < json_array_size(bands); i++)
            int_value(r, json_array_get(bands, i), "model", "bands", 1, 1 << 20, &m->bands[i]);
        if (bands) m->n_bands = (int)json_array_size(bands);
        get_real(r, model, "model", "scale", true, &m->scale);
        json_t *mean = need_arr(r, model, "model", "mean", TW_MAX_BANDS);
        json_t *std = need_arr(r, model, "model", "std", TW_MAX_BANDS);
        if (mean && std && json_array_size(mean) != json_array_size(std))
            fail(r, "keys model.mean and model.std differ in length (%zu, %zu)",
                 json_array_size(mean), json_array_size(std));
        for (size_t i = 0; mean && std && r->st == TW_OK && i < json_array_size(mean); i++) {
            double a = 0, b = 0;
            real_value(r, json_array_get(mean, i), "model", "mean", true, &a);
            real_value(r, json_array_get(std, i), "model", "std", true, &b);
            /* stored as float: a finite double beyond float's range would come
             * back as an infinity (found by fuzz_manifest) */
            if (r->st == TW_OK && (fabs(a) > FLT_MAX || fabs(b) > FLT_MAX))
                fail(r, "key model.%s is beyond a float's range",
                     fabs(a) > FLT_MAX ? "mean" : "std");
            m->mean[i] = (float)a;
            m->std[i] = (float)b;
        }
        if (mean) m->n_norm = (int)json_array_size(mean);
        json_t *classes = need_arr(r, model, "model", "classes", TW_MAX_CLASSES);
        if (classes && json_array_size(classes) == 0) fail(r, "key model.classes is empty");
        for (size_t i = 0; classes && r->st == TW_OK && i < json_array_size(classes); i++)
            str_value(r, json_array_get(classes, i), "model", "classes", m->classes[i],
                      sizeof m->classes[i]);
        if (classes) m->n_classes = (int)json_array_size(classes);
        get_int(r, model, "model", "tile", 1, 1 << 16, &m->tile);
        get_int(r, model, "model", "stride", 1, 1 << 16, &m->stride);
        json_t *sg = json_object_get(model, "segmentation");
        if (sg && !json_is_boolean(sg)) fail(r, "key model.segmentation is not true or false");
        m->segmentation = sg && json_is_true(sg);
        m->multiple = 1;
        if (m->segmentation) get_int(r, model, "model", "multiple", 1, 1 << 16, &m->multiple);
        m->cell = m->segmentation ? 1 : m->stride;
        if (r->st == TW_OK && m->segmentation && m->stride > m->tile)
            fail(r, "model.stride %d is larger than model.tile %d", m->stride, m->tile);
        if (r->st == TW_OK && !m->segmentation && m->tile % m->stride != 0)
            fail(r, "model.stride %d does not divide model.tile %d", m->stride, m->tile);
        get_int(r, model, "model", "in_bands", 1, TW_MAX_BANDS, &m->in_bands);
        get_int(r, model, "model", "feat_dim", 0, 1 << 20, &m->feat_dim);
        get_str(r, model, "model", "sha256", m->model_sha256, sizeof m->model_sha256);
        json_t *hl = json_object_get(model, "headless");
        if (hl && !json_is_boolean(hl)) fail(r, "key model.headless is not true or false");
        m->headless = hl && json_is_true(hl);
    }
}

/* raster: the input's geometry, type and nodata as the shards read it. */
static void parse_raster(rd *r, json_t *root, tw_raster_info *info)
{
    json_t *ras = need_obj(r, root, "raster");
    if (ras) {
        static const char *const ras_keys[] = {
            "width",        "height",           "band_count", "dtype",
            "block_w",      "block_h",          "has_nodata", "nodata",
            "geotransform", "has_geotransform", "crs_wkt",    "driver"};
        only_keys(r, ras, "raster", ras_keys, 12);
        get_int(r, ras, "raster", "width", 1, 1 << 30, &info->width);
        get_int(r, ras, "raster", "height", 1, 1 << 30, &info->height);
        get_int(r, ras, "raster", "band_count", 1, 1 << 20, &info->band_count);
        const char *dnames[N_DTYPES];
        for (int i = 0; i < (int)N_DTYPES; i++) dnames[i] = tw_dtype_name((tw_dtype)i);
        int d = 0;
        if (get_enum(r, ras, "raster", "dtype", dnames, (int)N_DTYPES, &d))
            info->dtype = (tw_dtype)d;
        get_int(r, ras, "raster", "block_w", 0, 1 << 30, &info->block_w);
        get_int(r, ras, "raster", "block_h", 0, 1 << 30, &info->block_h);
        get_bool(r, ras, "raster", "has_nodata", &info->has_nodata);
        get_real(r, ras, "raster", "nodata", false, &info->nodata);
        json_t *gt = need_arr(r, ras, "raster", "geotransform", 6);
        if (gt && json_array_size(gt) != 6) fail(r, "key raster.geotransform has not 6 numbers");
        for (size_t i = 0; gt && r->st == TW_OK && i < 6; i++)
            real_value(r, json_array_get(gt, i), "raster", "geotransform", true,
                       &info->geotransform[i]);
        get_bool(r, ras, "raster", "has_geotransform", &info->has_geotransform);
        get_str(r, ras, "raster", "crs_wkt", info->crs_wkt, sizeof info->crs_wkt);
        get_str(r, ras, "raster", "driver", info->driver, sizeof info->driver);
    }
}

/* stac: the merged products' STAC item, when the run wrote one. */
static void parse_stac(rd *r, json_t *root, tw_manifest *mf)
{
    tw_run_params *p = &mf->p;
    /* output.stac: absent in a manifest of a run without it (or before it) */
    json_t *stac = json_object_get(root, "stac");
    if (stac) {
        static const char *const stac_keys[] = {"datetime", "source", "derived_from", "weights",
                                                "assets"};
        json_t *so = need_obj(r, root, "stac");
        if (so) only_keys(r, so, "stac", stac_keys, 5);
        p->output.stac = so != NULL;
        get_str(r, so, "stac", "datetime", mf->stac.datetime, sizeof mf->stac.datetime);
        get_str(r, so, "stac", "source", mf->stac.source, sizeof mf->stac.source);
        get_str(r, so, "stac", "derived_from", mf->stac.derived_from, sizeof mf->stac.derived_from);
        get_str(r, so, "stac", "weights", p->model.weights, sizeof p->model.weights);
        json_t *names = so ? need_arr(r, so, "stac", "assets", TW_MAX_BANDS) : NULL;
        for (size_t i = 0; names && r->st == TW_OK && i < json_array_size(names); i++)
            str_value(r, json_array_get(names, i), "stac", "assets", p->input.assets[i],
                      sizeof p->input.assets[i]);
        if (names) p->input.n_assets = (int)json_array_size(names);
        if (r->st == TW_OK && !tw_rfc3339_check(mf->stac.datetime, NULL, 0))
            fail(r, "key stac.datetime is not an RFC 3339 date-time");
    }
}

static void parse_object(rd *r, json_t *root, tw_manifest *mf)
{
    static const char *const top_keys[] = {"format",      "version",     "tilewise", "inputs",
                                           "tiling",      "output",      "model",    "raster",
                                           "config_json", "fingerprint", "nodata",   "stac"};
    only_keys(r, root, "", top_keys, 12);
    char ver[64];
    get_str(r, root, "", "tilewise", ver, sizeof ver);

    parse_inputs(r, root, &mf->p);
    parse_tiling(r, root, &mf->p);
    parse_output(r, root, &mf->p);
    parse_model(r, root, &mf->m);
    parse_raster(r, root, &mf->info);
    parse_stac(r, root, mf);
    get_str(r, root, "", "config_json", mf->config_json, sizeof mf->config_json);
    get_str(r, root, "", "fingerprint", mf->fingerprint, sizeof mf->fingerprint);
}

static tw_status refuse_version(const char *name, const char *theirs, tw_error *err)
{
    return tw_error_set(err, TW_ERR_INPUT,
                        "%s: run manifest format version %s, but this tilewise (%s) reads "
                        "version %d only: merge with the tilewise that ran the shards, or run "
                        "the shards again with this one",
                        name, theirs, TW_VERSION, TW_MANIFEST_VERSION);
}

tw_status tw_manifest_parse(const char *text, size_t len, const char *name, tw_manifest *mf,
                            tw_error *err)
{
    /* Version 1 was the structs' bytes behind the magic "TWMANIF1". */
    if (len >= 8 && memcmp(text, "TWMANIF", 7) == 0) {
        char v[48];
        snprintf(v, sizeof v, "%c (binary, \"TWMANIF%c\")", text[7] == '1' ? '1' : '?',
                 (unsigned char)text[7] >= 0x20 && (unsigned char)text[7] < 0x7f ? text[7] : '?');
        return refuse_version(name, v, err);
    }
    if (len > TW_MANIFEST_MAX_BYTES)
        return tw_error_set(err, TW_ERR_INPUT, "%s: damaged run manifest: %zu bytes", name, len);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return tw_error_set(err, TW_ERR_INPUT, "%s: damaged run manifest: line %d column %d: %s",
                            name, jerr.line, jerr.column, jerr.text);
    rd r = {.name = name, .err = err, .st = TW_OK};
    json_t *fmt = json_is_object(root) ? json_object_get(root, "format") : NULL;
    json_t *ver = json_is_object(root) ? json_object_get(root, "version") : NULL;
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), FORMAT_NAME) != 0) {
        fail(&r, "not a tilewise manifest (no \"format\": \"" FORMAT_NAME "\")");
    } else if (!json_is_integer(ver)) {
        fail(&r, "key version is not an integer");
    } else if (json_integer_value(ver) != TW_MANIFEST_VERSION) {
        char v[32];
        snprintf(v, sizeof v, "%lld", (long long)json_integer_value(ver));
        r.st = refuse_version(name, v, err);
    } else {
        memset(mf, 0, sizeof *mf);
        mf->p = tw_run_default_params();
        parse_object(&r, root, mf);
    }
    json_decref(root);
    return r.st;
}

tw_status tw_manifest_read(const char *path, const char *stem, tw_manifest *mf, tw_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return tw_error_set(err, TW_ERR_INPUT,
                            "%s: no run manifest (%s): was this input run by "
                            "this version of tilewise?",
                            stem, strerror(errno));
    char *buf = malloc(TW_MANIFEST_MAX_BYTES + 1);
    if (!buf) {
        fclose(f);
        return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    size_t n = fread(buf, 1, TW_MANIFEST_MAX_BYTES + 1, f);
    bool bad = ferror(f) != 0;
    int e = errno;
    fclose(f);
    tw_status st = bad ? tw_error_set(err, TW_ERR_INPUT, "%s: cannot read: %s", path, strerror(e))
                       : tw_manifest_parse(buf, n, path, mf, err);
    free(buf);
    return st;
}
