/* info_stac.c - `tilewise info` of a STAC Item or Collection that a run
 * wrote (output.stac): id, datetime, bbox, the assets with their sizes, the
 * model (info.h). Read with jansson; nothing is written but to the caller's
 * stream. */
#include "api/info.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "pipeline/json.h"

bool tw_info_is_stac(const char *path)
{
    size_t n = strlen(path);
    return (n > 10 && strcmp(path + n - 10, ".stac.json") == 0) ||
           (n >= 15 && strcmp(path + n - 15, "collection.json") == 0);
}

static const char *str(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

tw_status tw_info_stac(const char *path, bool json, FILE *out, tw_error *err)
{
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        return tw_error_set(err, TW_ERR_INPUT, "%s: not JSON (line %d: %s)", path, je.line,
                            je.text);
    const char *type = str(root, "type");
    bool item = strcmp(type, "Feature") == 0, coll = strcmp(type, "Collection") == 0;
    if ((!item && !coll) || !json_is_string(json_object_get(root, "stac_version"))) {
        json_decref(root);
        return tw_error_set(err, TW_ERR_INPUT,
                            "%s: not a STAC Item or Collection (no stac_version, or type is "
                            "neither Feature nor Collection)",
                            path);
    }
    json_t *props = json_object_get(root, "properties");
    json_t *bbox =
        item ? json_object_get(root, "bbox")
             : json_array_get(
                   json_object_get(json_object_get(json_object_get(root, "extent"), "spatial"),
                                   "bbox"),
                   0);
    json_t *assets = json_object_get(root, "assets");
    tw_json j = tw_json_file(out);
    if (json) {
        tw_json_open(&j, NULL, '{');
        tw_json_str(&j, "type", item ? "stac_item" : "stac_collection");
        tw_json_str(&j, "path", path);
        tw_json_str(&j, "id", str(root, "id"));
        tw_json_str(&j, "stac_version", str(root, "stac_version"));
    } else {
        fprintf(out, "%-10s%s (STAC %s %s)\n", item ? "item" : "collection", str(root, "id"),
                str(root, "stac_version"), item ? "Item" : "Collection");
    }
    if (item) {
        if (json)
            tw_json_str(&j, "datetime", str(props, "datetime"));
        else
            fprintf(out, "%-10s%s\n", "datetime", str(props, "datetime"));
    } else {
        json_t *iv = json_array_get(
            json_object_get(json_object_get(json_object_get(root, "extent"), "temporal"),
                            "interval"),
            0);
        const char *t0 = json_string_value(json_array_get(iv, 0)),
                   *t1 = json_string_value(json_array_get(iv, 1));
        if (json) {
            tw_json_str(&j, "start", t0 ? t0 : "");
            tw_json_str(&j, "end", t1 ? t1 : "");
        } else {
            fprintf(out, "%-10s%s .. %s\n", "time", t0 ? t0 : "open", t1 ? t1 : "open");
        }
    }
    if (json_array_size(bbox) == 4) {
        double b[4];
        for (int i = 0; i < 4; i++) b[i] = json_number_value(json_array_get(bbox, (size_t)i));
        if (json) {
            tw_json_open(&j, "bbox", '[');
            for (int i = 0; i < 4; i++) tw_json_real(&j, NULL, b[i], 17);
            tw_json_close(&j, ']');
        } else {
            fprintf(out, "%-10slon %.6f .. %.6f, lat %.6f .. %.6f (WGS84)\n", "bbox", b[0], b[2],
                    b[1], b[3]);
        }
    }
    if (item && !json) {
        json_t *epsg = json_object_get(props, "proj:epsg");
        json_t *shape = json_object_get(props, "proj:shape");
        if (json_is_integer(epsg) || json_array_size(shape) == 2) {
            fprintf(out, "%-10s", "crs");
            if (json_is_integer(epsg))
                fprintf(out, "EPSG:%lld", (long long)json_integer_value(epsg));
            else
                fprintf(out, "%s", json_object_get(props, "proj:wkt2") ? "WKT2" : "none");
            if (json_array_size(shape) == 2)
                fprintf(out, "; grid %lld x %lld",
                        (long long)json_integer_value(json_array_get(shape, 1)),
                        (long long)json_integer_value(json_array_get(shape, 0)));
            fprintf(out, "\n");
        }
    }
    const char *key;
    json_t *a;
    if (json) tw_json_open(&j, "assets", '[');
    json_object_foreach(assets, key, a)
    {
        json_t *size = json_object_get(a, "file:size");
        if (json) {
            tw_json_open(&j, NULL, '{');
            tw_json_str(&j, "key", key);
            tw_json_str(&j, "href", str(a, "href"));
            tw_json_str(&j, "type", str(a, "type"));
            if (json_is_integer(size))
                tw_json_int(&j, "size", (long long)json_integer_value(size));
            else
                tw_json_null(&j, "size");
            tw_json_str(&j, "checksum", str(a, "file:checksum"));
            tw_json_close(&j, '}');
        } else {
            fprintf(out, "%-10s%s: %s", "asset", key, str(a, "href"));
            if (json_is_integer(size))
                fprintf(out, ", %lld bytes", (long long)json_integer_value(size));
            fprintf(out, " (%s)\n", str(a, "type"));
        }
    }
    if (json) tw_json_close(&j, ']');
    if (item && json_object_get(props, "mlm:name")) {
        json_t *in = json_array_get(json_object_get(props, "mlm:input"), 0);
        json_t *o = json_array_get(json_object_get(props, "mlm:output"), 0);
        size_t bands = json_array_size(json_object_get(in, "bands"));
        size_t classes = json_array_size(json_object_get(o, "classification:classes"));
        const char *sha = str(json_object_get(assets, "model"), "file:checksum");
        if (strncmp(sha, "1220", 4) == 0) sha += 4;
        if (json) {
            tw_json_open(&j, "model", '{');
            tw_json_str(&j, "name", str(props, "mlm:name"));
            tw_json_str(&j, "architecture", str(props, "mlm:architecture"));
            tw_json_int(&j, "bands", (long long)bands);
            tw_json_int(&j, "classes", (long long)classes);
            tw_json_str(&j, "sha256", sha);
            tw_json_close(&j, '}');
        } else {
            fprintf(out, "%-10s%s: %s, %zu bands, %zu classes (sha256 %.12s)\n", "model",
                    str(props, "mlm:name"), str(props, "mlm:architecture"), bands, classes, sha);
        }
    }
    json_t *links = json_object_get(root, "links");
    size_t li;
    json_t *l;
    if (json) tw_json_open(&j, "links", '[');
    json_array_foreach(links, li, l)
    {
        if (json) {
            tw_json_open(&j, NULL, '{');
            tw_json_str(&j, "rel", str(l, "rel"));
            tw_json_str(&j, "href", str(l, "href"));
            tw_json_close(&j, '}');
        } else if (strcmp(str(l, "rel"), "root") != 0 && strcmp(str(l, "rel"), "parent") != 0) {
            fprintf(out, "%-10s%s: %s\n", "link", str(l, "rel"), str(l, "href"));
        }
    }
    if (json) {
        tw_json_close(&j, ']');
        tw_json_close(&j, '}');
        fprintf(out, "\n");
    }
    json_decref(root);
    return TW_OK;
}
