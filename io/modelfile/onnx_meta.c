/* onnx_meta.c - Deepness's metadata_props of an ONNX model: model type,
 * class names, resolution, normalisation (see onnx_internal.h). */
#include "io/modelfile/onnx_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

/* ------------------------------------------------------------------------ */
/* Deepness's metadata_props                                                 */

static void meta_used(tw_onnx_info *oi, const char *key)
{
    size_t o = strlen(oi->metadata);
    snprintf(oi->metadata + o, sizeof oi->metadata - o, "%s%s", o ? ", " : "", key);
}

/* A JSON value of a metadata key; NULL (error set) when it is not JSON. */
static json_t *meta_json(octx *c, const char *key, const char *text)
{
    json_error_t je;
    json_t *j = json_loads(text, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!j) tw_model_error(c->err, c->path, "metadata '%s' is not JSON: %.80s", key, je.text);
    return j;
}

static tw_status meta_floats(octx *c, const char *key, const char *text, float *dst, int *n)
{
    json_t *j = meta_json(c, key, text);
    if (!j) return TW_ERR_MODEL;
    double v[TW_MAX_BANDS];
    size_t m = json_is_array(j) ? json_array_size(j) : 0;
    tw_status st = TW_OK;
    if (m < 1 || m > TW_MAX_BANDS)
        st = tw_model_error(c->err, c->path, "metadata '%s' is not a list of 1..%d numbers", key,
                            TW_MAX_BANDS);
    for (size_t i = 0; st == TW_OK && i < m; i++) {
        json_t *x = json_array_get(j, i);
        if (!json_is_number(x))
            st = tw_model_error(c->err, c->path, "metadata '%s'[%zu] is not a number", key, i);
        else
            v[i] = json_number_value(x);
    }
    json_decref(j);
    if (st != TW_OK) return st;
    return tw_model_set_floats(c->mf, key, v, (int64_t)m, dst, n, dst == c->mf->std, c->err);
}

/* Deepness also reads class names written as a Python dict, {0: 'water',
 * 1: "forest"} (it falls back to ast.literal_eval): that form, with integer
 * keys and quoted strings (backslash escapes the next character), as a JSON
 * object; NULL when text is not of it. */
static json_t *python_dict(const char *text)
{
    json_t *o = json_object();
    const char *p = text;
    char name[TW_NAME_MAX];
#define SKIP_WS()                                                                                  \
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++
    SKIP_WS();
    if (!o || *p++ != '{') goto bad;
    SKIP_WS();
    while (*p != '}') {
        char *end;
        long id = strtol(p, &end, 10);
        if (end == p || id < 0 || id >= TW_MAX_CLASSES) goto bad;
        p = end;
        SKIP_WS();
        if (*p++ != ':') goto bad;
        SKIP_WS();
        char q = *p++;
        if (q != '\'' && q != '"') goto bad;
        size_t n = 0;
        while (*p && *p != q) {
            if (*p == '\\' && p[1]) p++;
            if (n + 1 >= sizeof name) goto bad;
            name[n++] = *p++;
        }
        if (*p++ != q) goto bad;
        name[n] = '\0';
        char ids[24];
        snprintf(ids, sizeof ids, "%ld", id);
        if (json_object_get(o, ids) || json_object_set_new(o, ids, json_string(name)) != 0)
            goto bad;
        SKIP_WS();
        if (*p == ',') {
            p++;
            SKIP_WS();
        } else if (*p != '}') {
            goto bad;
        }
    }
    p++;
    SKIP_WS();
    if (*p) goto bad;
#undef SKIP_WS
    return o;
bad:
    json_decref(o);
    return NULL;
}

/* class_names: {"0": "water", "1": "forest"} (Deepness's, keys 0..K-1; or
 * as a Python dict) or ["water", "forest"]. */
static tw_status meta_classes(octx *c, const char *key, const char *text)
{
    json_t *j = json_loads(text, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
    if (!j) j = python_dict(text);
    if (!j) j = meta_json(c, key, text); /* the JSON error, for the message */
    if (!j) return TW_ERR_MODEL;
    tw_model_file *mf = c->mf;
    tw_status st = TW_OK;
    size_t n = json_is_array(j) ? json_array_size(j) : json_is_object(j) ? json_object_size(j) : 0;
    if (n < 1 || n > TW_MAX_CLASSES)
        st = tw_model_error(c->err, c->path,
                            "metadata '%s' is not a list or an object of 1..%d class names", key,
                            TW_MAX_CLASSES);
    for (size_t i = 0; st == TW_OK && i < n; i++) {
        json_t *x;
        if (json_is_array(j)) {
            x = json_array_get(j, i);
        } else {
            char id[24];
            snprintf(id, sizeof id, "%zu", i);
            x = json_object_get(j, id);
            if (!x) {
                st = tw_model_error(c->err, c->path,
                                    "metadata '%s' has no class %zu (ids must be 0..%zu)", key, i,
                                    n - 1);
                break;
            }
        }
        if (!json_is_string(x))
            st =
                tw_model_error(c->err, c->path, "metadata '%s': class %zu is not a string", key, i);
        else
            st = tw_model_set_class(mf, (int)i, json_string_value(x), c->err);
    }
    json_decref(j);
    if (st == TW_OK) mf->n_classes = (int)n;
    return st;
}

tw_status onnx_read_metadata(octx *c)
{
    tw_onnx_info *oi = &c->mf->onnx;
    const Onnx__ModelProto *m = c->model;
    const char *mean = NULL, *std = NULL, *classes = NULL, *ckey = NULL, *tile = NULL, *tkey = NULL;
    for (size_t i = 0; i < m->n_metadata_props; i++) {
        const char *k = S(m->metadata_props[i]->key), *v = S(m->metadata_props[i]->value);
        if (strcmp(k, "class_names") == 0 || (strcmp(k, "names") == 0 && !classes)) {
            classes = v;
            ckey = k;
        } else if (strcmp(k, "standardization_mean") == 0) {
            mean = v;
        } else if (strcmp(k, "standardization_std") == 0) {
            std = v;
        } else if (strcmp(k, "tiles_size") == 0 || strcmp(k, "tile_size") == 0) {
            if (tile && strcmp(tile, v) != 0)
                return tw_model_error(c->err, c->path,
                                      "metadata 'tiles_size' and 'tile_size' differ");
            tile = v;
            tkey = k;
        } else if (strcmp(k, "resolution") == 0) {
            json_t *j = meta_json(c, k, v);
            if (!j) return TW_ERR_MODEL;
            bool ok = json_is_number(j) && json_number_value(j) > 0;
            if (ok) oi->resolution = json_number_value(j);
            json_decref(j);
            if (!ok)
                return tw_model_error(c->err, c->path,
                                      "metadata 'resolution' is not a positive number");
        } else if (strcmp(k, "tiles_overlap") == 0) {
            /* Deepness: percent of the tile that neighbours share. The model
             * file has no stride fact, so it is read, checked and shown
             * (tw_onnx_info), not applied: tiling.stride says the stride. */
            json_t *j = meta_json(c, k, v);
            if (!j) return TW_ERR_MODEL;
            bool ok =
                json_is_integer(j) && json_integer_value(j) >= 0 && json_integer_value(j) <= 99;
            if (ok) oi->tiles_overlap = (int)json_integer_value(j);
            json_decref(j);
            if (!ok)
                return tw_model_error(c->err, c->path,
                                      "metadata 'tiles_overlap' is not an integer percent 0..99");
        } else if (strcmp(k, "model_type") == 0) {
            json_t *j = json_loads(v, JSON_DECODE_ANY, NULL);
            char tb[32];
            snprintf(oi->model_type, sizeof oi->model_type, "%s",
                     onnx_clean(j && json_is_string(j) ? json_string_value(j) : v, tb, sizeof tb));
            json_decref(j);
        }
    }
    tw_status st = TW_OK;
    if (classes) {
        st = meta_classes(c, ckey, classes);
        if (st != TW_OK) return st;
        meta_used(oi, ckey);
    }
    if ((mean != NULL) != (std != NULL))
        return tw_model_error(c->err, c->path, "metadata '%s' comes without '%s'",
                              mean ? "standardization_mean" : "standardization_std",
                              mean ? "standardization_std" : "standardization_mean");
    if (mean) {
        /* Deepness scales pixels to 0..1 (x / 255) before standardizing */
        st = meta_floats(c, "standardization_mean", mean, c->mf->mean, &c->mf->n_mean);
        if (st == TW_OK) st = meta_floats(c, "standardization_std", std, c->mf->std, &c->mf->n_std);
        if (st == TW_OK) st = tw_model_set_scale(c->mf, 1.0 / 255.0, c->err);
        if (st != TW_OK) return st;
        meta_used(oi, "standardization_mean");
        meta_used(oi, "standardization_std");
    }
    if (tile) {
        json_t *j = meta_json(c, tkey, tile);
        if (!j) return TW_ERR_MODEL;
        bool ok = json_is_integer(j);
        json_int_t t = ok ? json_integer_value(j) : 0;
        json_decref(j);
        if (!ok) return tw_model_error(c->err, c->path, "metadata '%s' is not an integer", tkey);
        if ((st = tw_model_set_tile(c->mf, (int64_t)t, c->err)) != TW_OK) return st;
        meta_used(oi, tkey);
    }
    if (!isnan(oi->resolution)) meta_used(oi, "resolution");
    if (oi->tiles_overlap >= 0) meta_used(oi, "tiles_overlap");
    return TW_OK;
}
