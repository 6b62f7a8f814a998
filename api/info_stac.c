/* info_stac.c - `tilewise info` of a STAC Item or Collection that a run
 * wrote (output.stac): its facts (id, datetime, bbox, the assets with their
 * sizes, the model) read with jansson into info's tree, and their text
 * (info_internal.h). */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "api/info_internal.h"
#include "core/fileio.h"

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

/* The facts of a STAC document already known to be an Item or Collection:
 * the JSON form's members in its order, then the item's CRS and grid for
 * the text ("_epsg", "_wkt2", "_shape"). */
static json_t *stac_facts(const char *path, json_t *root, bool item, bool *ok)
{
    json_t *f = json_object();
    json_t *props = json_object_get(root, "properties");
    json_t *assets = json_object_get(root, "assets");
    tw_info_put(f, "type", json_string(item ? "stac_item" : "stac_collection"), ok);
    tw_info_put(f, "path", tw_info_str(path), ok);
    tw_info_put(f, "id", tw_info_str(str(root, "id")), ok);
    tw_info_put(f, "stac_version", tw_info_str(str(root, "stac_version")), ok);
    json_t *extent = json_object_get(root, "extent");
    if (item) {
        tw_info_put(f, "datetime", tw_info_str(str(props, "datetime")), ok);
    } else {
        json_t *iv =
            json_array_get(json_object_get(json_object_get(extent, "temporal"), "interval"), 0);
        /* "": open */
        tw_info_put(f, "start", tw_info_str(json_string_value(json_array_get(iv, 0))), ok);
        tw_info_put(f, "end", tw_info_str(json_string_value(json_array_get(iv, 1))), ok);
    }
    json_t *bbox =
        item ? json_object_get(root, "bbox")
             : json_array_get(json_object_get(json_object_get(extent, "spatial"), "bbox"), 0);
    if (json_array_size(bbox) == 4) {
        json_t *b = json_array();
        for (size_t i = 0; i < 4; i++)
            tw_info_push(b, tw_info_num(json_number_value(json_array_get(bbox, i))), ok);
        tw_info_put(f, "bbox", b, ok);
    }
    json_t *list = json_array();
    const char *key;
    json_t *a;
    json_object_foreach(assets, key, a)
    {
        json_t *size = json_object_get(a, "file:size"), *e = json_object();
        tw_info_put(e, "key", tw_info_str(key), ok);
        tw_info_put(e, "href", tw_info_str(str(a, "href")), ok);
        tw_info_put(e, "type", tw_info_str(str(a, "type")), ok);
        tw_info_put(e, "size",
                    json_is_integer(size) ? json_integer(json_integer_value(size)) : json_null(),
                    ok);
        tw_info_put(e, "checksum", tw_info_str(str(a, "file:checksum")), ok);
        tw_info_push(list, e, ok);
    }
    tw_info_put(f, "assets", list, ok);
    if (item && json_object_get(props, "mlm:name")) {
        json_t *in = json_array_get(json_object_get(props, "mlm:input"), 0);
        json_t *o = json_array_get(json_object_get(props, "mlm:output"), 0);
        const char *sha = str(json_object_get(assets, "model"), "file:checksum");
        if (strncmp(sha, "1220", 4) == 0) sha += 4; /* the multihash's sha2-256 prefix */
        json_t *m = json_object();
        tw_info_put(m, "name", tw_info_str(str(props, "mlm:name")), ok);
        tw_info_put(m, "architecture", tw_info_str(str(props, "mlm:architecture")), ok);
        tw_info_put(m, "bands",
                    json_integer((json_int_t)json_array_size(json_object_get(in, "bands"))), ok);
        tw_info_put(
            m, "classes",
            json_integer((json_int_t)json_array_size(json_object_get(o, "classification:classes"))),
            ok);
        tw_info_put(m, "sha256", tw_info_str(sha), ok);
        tw_info_put(f, "model", m, ok);
    } else if (item && json_is_object(json_object_get(props, "tilewise:model"))) {
        /* a model without an asset (its weights lay outside the folder) */
        json_t *tm = json_object_get(props, "tilewise:model"), *m = json_object();
        tw_info_put(m, "name", tw_info_str(str(tm, "name")), ok);
        tw_info_put(m, "architecture", tw_info_str(str(tm, "architecture")), ok);
        tw_info_put(m, "bands",
                    json_integer((json_int_t)json_array_size(json_object_get(tm, "bands"))), ok);
        tw_info_put(m, "classes",
                    json_integer((json_int_t)json_array_size(json_object_get(tm, "classes"))), ok);
        tw_info_put(m, "sha256", tw_info_str(str(tm, "sha256")), ok);
        tw_info_put(f, "model", m, ok);
    }
    list = json_array();
    size_t li;
    json_t *l;
    json_array_foreach(json_object_get(root, "links"), li, l)
    {
        json_t *e = json_object();
        tw_info_put(e, "rel", tw_info_str(str(l, "rel")), ok);
        tw_info_put(e, "href", tw_info_str(str(l, "href")), ok);
        tw_info_push(list, e, ok);
    }
    tw_info_put(f, "links", list, ok);
    if (item) {
        json_t *epsg = json_object_get(props, "proj:epsg");
        json_t *shape = json_object_get(props, "proj:shape");
        if (json_is_integer(epsg))
            tw_info_put(f, "_epsg", json_integer(json_integer_value(epsg)), ok);
        if (json_object_get(props, "proj:wkt2")) tw_info_put(f, "_wkt2", json_true(), ok);
        if (json_array_size(shape) == 2) {
            json_t *s = json_array();
            for (size_t i = 0; i < 2; i++)
                tw_info_push(s, json_integer(json_integer_value(json_array_get(shape, i))), ok);
            tw_info_put(f, "_shape", s, ok);
        }
    }
    return f;
}

tw_status tw_info_stac_facts(const char *path, json_t **facts, tw_error *err)
{
    *facts = NULL;
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    char jwhy[sizeof je.text]; /* without jansson's quote of the file's bytes */
    if (!root)
        return tw_error_set(err, TW_ERR_INPUT, "%s: not JSON (line %d, column %d: %s)", path,
                            je.line, je.column, tw_json_error_text(je.text, jwhy, sizeof jwhy));
    const char *type = str(root, "type");
    bool item = strcmp(type, "Feature") == 0, coll = strcmp(type, "Collection") == 0;
    if ((!item && !coll) || !json_is_string(json_object_get(root, "stac_version"))) {
        json_decref(root);
        return tw_error_set(err, TW_ERR_INPUT,
                            "%s: not a STAC Item or Collection (no stac_version, or type is "
                            "neither Feature nor Collection)",
                            path);
    }
    bool ok = true;
    json_t *f = stac_facts(path, root, item, &ok);
    json_decref(root);
    if (!ok) {
        json_decref(f);
        return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    *facts = f;
    return TW_OK;
}

void tw_info_stac_text(const json_t *f, FILE *out)
{
    bool item = strcmp(tw_info_get_str(f, "type"), "stac_item") == 0;
    /* "collection" fills the label column: a space always follows it */
    fprintf(out, "%-9s %s (STAC %s %s)\n", item ? "item" : "collection", tw_info_get_str(f, "id"),
            tw_info_get_str(f, "stac_version"), item ? "Item" : "Collection");
    if (item) {
        fprintf(out, "%-10s%s\n", "datetime", tw_info_get_str(f, "datetime"));
    } else {
        const char *t0 = tw_info_get_str(f, "start"), *t1 = tw_info_get_str(f, "end");
        fprintf(out, "%-10s%s .. %s\n", "time", t0[0] ? t0 : "open", t1[0] ? t1 : "open");
    }
    json_t *b = json_object_get(f, "bbox");
    if (b)
        fprintf(out, "%-10slon %.6f .. %.6f, lat %.6f .. %.6f (WGS84)\n", "bbox",
                json_number_value(json_array_get(b, 0)), json_number_value(json_array_get(b, 2)),
                json_number_value(json_array_get(b, 1)), json_number_value(json_array_get(b, 3)));
    json_t *epsg = json_object_get(f, "_epsg"), *shape = json_object_get(f, "_shape");
    if (epsg || shape) {
        fprintf(out, "%-10s", "crs");
        if (epsg)
            fprintf(out, "EPSG:%lld", (long long)json_integer_value(epsg));
        else
            fprintf(out, "%s", tw_info_get_bool(f, "_wkt2") ? "WKT2" : "none");
        if (shape)
            fprintf(out, "; grid %lld x %lld",
                    (long long)json_integer_value(json_array_get(shape, 1)),
                    (long long)json_integer_value(json_array_get(shape, 0)));
        fprintf(out, "\n");
    }
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(f, "assets"), i, a)
    {
        fprintf(out, "%-10s%s: %s", "asset", tw_info_get_str(a, "key"), tw_info_get_str(a, "href"));
        json_t *size = json_object_get(a, "size");
        if (json_is_integer(size))
            fprintf(out, ", %lld bytes", (long long)json_integer_value(size));
        fprintf(out, " (%s)\n", tw_info_get_str(a, "type"));
    }
    json_t *m = json_object_get(f, "model");
    if (m)
        fprintf(out, "%-10s%s: %s, %lld bands, %lld classes (sha256 %.12s)\n", "model",
                tw_info_get_str(m, "name"), tw_info_get_str(m, "architecture"),
                tw_info_get_int(m, "bands"), tw_info_get_int(m, "classes"),
                tw_info_get_str(m, "sha256"));
    json_t *l;
    json_array_foreach(json_object_get(f, "links"), i, l)
    {
        const char *rel = tw_info_get_str(l, "rel");
        if (strcmp(rel, "root") != 0 && strcmp(rel, "parent") != 0)
            fprintf(out, "%-10s%s: %s\n", "link", rel, tw_info_get_str(l, "href"));
    }
}
