/* stac_items.c - the STAC documents around a run's items (stac_out.h):
 * items.json, the items as one FeatureCollection kept as items are written
 * and removed (GDAL's STACIT input), and collection.json over several
 * inputs; the items themselves are stac_out.c's. */
#include "io/output/stac_out.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/output/stac_out_internal.h"

/* ------------------------------------------------------------------------ */
/* items.json: the items as one FeatureCollection (GDAL's STACIT input)      */

static void items_path(const char *dir, char *out, size_t size)
{
    snprintf(out, size, "%s/" TW_STAC_ITEMS, dir);
}

/* items.json's features, or a new empty array when there is none (or it is
 * not a FeatureCollection: it is rebuilt from the items written from now). */
static json_t *items_load(const char *dir)
{
    char path[TW_PATH_MAX + 64];
    items_path(dir, path, sizeof path);
    json_t *root = json_load_file(path, 0, NULL);
    json_t *f = json_object_get(root, "features");
    json_t *features = json_is_array(f) ? json_incref(f) : json_array();
    json_decref(root);
    return features;
}

/* The feature of id in features, -1 none. */
static int items_find(json_t *features, const char *id)
{
    size_t i;
    json_t *it;
    json_array_foreach(features, i, it)
    {
        const char *fid = json_string_value(json_object_get(it, "id"));
        if (fid && strcmp(fid, id) == 0) return (int)i;
    }
    return -1;
}

/* Write features as dir/items.json (atomically); none: remove it. Takes
 * features. */
static tw_status items_store(const char *dir, json_t *features, tw_error *err)
{
    char path[TW_PATH_MAX + 64];
    items_path(dir, path, sizeof path);
    if (!features) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    if (json_array_size(features) == 0) {
        json_decref(features);
        if (unlink(path) != 0 && errno != ENOENT)
            return tw_error_set(err, TW_ERR_OUTPUT, "output.stac: cannot remove %s: %s", path,
                                strerror(errno));
        return TW_OK;
    }
    bool ok = true;
    json_t *fc = json_object();
    set(fc, "type", json_string("FeatureCollection"), &ok);
    set(fc, "features", features, &ok);
    set(fc, "links", json_array(), &ok);
    if (!ok) {
        json_decref(fc);
        return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    tw_status st = tw_stac_write_json(path, fc, err);
    json_decref(fc);
    return st;
}

/* dir/<id>.stac.json as written; NULL with err set. */
static json_t *item_load(const char *dir, const char *id, tw_error *err)
{
    char path[TW_PATH_MAX + 300];
    tw_stac_item_path(dir, id, path, sizeof path);
    json_error_t je;
    json_t *it = json_load_file(path, 0, &je);
    if (!it)
        tw_error_set(err, TW_ERR_OUTPUT, "output.stac: cannot read the item %s: %s", path, je.text);
    return it;
}

tw_status tw_stac_items_add(const char *dir, const char *id, tw_error *err)
{
    json_t *it = item_load(dir, id, err);
    if (!it) return err->status;
    json_t *features = items_load(dir);
    int at = items_find(features, id);
    int bad = at >= 0 ? json_array_set_new(features, (size_t)at, it)
                      : json_array_append_new(features, it);
    if (bad || !features) {
        json_decref(features);
        return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    return items_store(dir, features, err);
}

static tw_status items_drop(const char *dir, const char *id, tw_error *err)
{
    char path[TW_PATH_MAX + 64];
    items_path(dir, path, sizeof path);
    if (access(path, F_OK) != 0) return TW_OK;
    json_t *features = items_load(dir);
    int at = items_find(features, id);
    if (at < 0) {
        json_decref(features);
        return TW_OK;
    }
    json_array_remove(features, (size_t)at);
    return items_store(dir, features, err);
}

tw_status tw_stac_item_remove(const char *dir, const char *id, bool collection, tw_error *err)
{
    tw_status dst = items_drop(dir, id, err);
    if (dst != TW_OK) return dst;
    char path[TW_PATH_MAX + 300];
    if (tw_stac_item_path(dir, id, path, sizeof path) && unlink(path) != 0 && errno != ENOENT)
        return tw_error_set(err, TW_ERR_OUTPUT, "output.stac: cannot remove %s: %s", path,
                            strerror(errno));
    snprintf(path, sizeof path, "%s/collection.json", dir);
    if (collection && unlink(path) != 0 && errno != ENOENT)
        return tw_error_set(err, TW_ERR_OUTPUT, "output.stac: cannot remove %s: %s", path,
                            strerror(errno));
    return TW_OK;
}

tw_status tw_stac_collection_write(const char *dir, const char *id, const char *description,
                                   const char *const *item_ids, int n, tw_error *err)
{
    bool ok = true;
    double bb[4] = {INFINITY, INFINITY, -INFINITY, -INFINITY};
    char t0[TW_STAC_DATETIME_MAX] = "", t1[TW_STAC_DATETIME_MAX] = "";
    json_t *links = json_array();
    json_t *root = json_object();
    set(root, "rel", json_string("root"), &ok);
    set(root, "href", json_string("./collection.json"), &ok);
    set(root, "type", json_string("application/json"), &ok);
    push(links, root, &ok);
    json_t *il = json_object();
    set(il, "rel", json_string("items"), &ok);
    set(il, "href", json_string("./" TW_STAC_ITEMS), &ok);
    set(il, "type", json_string("application/geo+json"), &ok);
    set(il, "title", json_string("the items as one FeatureCollection (GDAL's STACIT opens it)"),
        &ok);
    push(links, il, &ok);
    json_t *features = json_array();
    tw_status st = TW_OK;
    bool any_bbox = false;
    for (int i = 0; st == TW_OK && i < n; i++) {
        json_t *it = item_load(dir, item_ids[i], err);
        if (!it) {
            st = err->status;
            break;
        }
        push(features, json_incref(it), &ok);
        json_t *b = json_object_get(it, "bbox");
        for (int k = 0; json_array_size(b) == 4 && k < 4; k++) {
            double v = json_number_value(json_array_get(b, (size_t)k));
            bb[k] = k < 2 ? fmin(bb[k], v) : fmax(bb[k], v);
            any_bbox = true;
        }
        /* RFC 3339 texts of one form sort as times only in UTC; items keep
         * what the inputs say, so the extent compares them as given */
        const char *dt =
            json_string_value(json_object_get(json_object_get(it, "properties"), "datetime"));
        if (dt && (!t0[0] || strcmp(dt, t0) < 0)) snprintf(t0, sizeof t0, "%s", dt);
        if (dt && (!t1[0] || strcmp(dt, t1) > 0)) snprintf(t1, sizeof t1, "%s", dt);
        json_decref(it);
        json_t *l = json_object();
        char href[TW_PATH_MAX + 300];
        snprintf(href, sizeof href, "./%s.stac.json", item_ids[i]);
        set(l, "rel", json_string("item"), &ok);
        set(l, "href", json_string(href), &ok);
        set(l, "type", json_string("application/geo+json"), &ok);
        push(links, l, &ok);
    }
    if (st != TW_OK) {
        json_decref(links);
        json_decref(features);
        return st;
    }
    /* items.json: exactly the collection's items */
    st = items_store(dir, features, err);
    if (st != TW_OK) {
        json_decref(links);
        return st;
    }
    json_t *c = json_object();
    set(c, "type", json_string("Collection"), &ok);
    set(c, "stac_version", json_string("1.0.0"), &ok);
    set(c, "stac_extensions", json_array(), &ok);
    set(c, "id", json_string(id), &ok);
    set(c, "description", json_string(description), &ok);
    set(c, "license", json_string("proprietary"), &ok);
    json_t *extent = json_object(), *spatial = json_object(), *temporal = json_object();
    json_t *bboxes = json_array(), *bbox = json_array();
    double whole[4] = {-180, -90, 180, 90};
    for (int k = 0; k < 4; k++) push(bbox, json_real(any_bbox ? bb[k] : whole[k]), &ok);
    push(bboxes, bbox, &ok);
    set(spatial, "bbox", bboxes, &ok);
    json_t *intervals = json_array(), *iv = json_array();
    push(iv, t0[0] ? json_string(t0) : json_null(), &ok);
    push(iv, t1[0] ? json_string(t1) : json_null(), &ok);
    push(intervals, iv, &ok);
    set(temporal, "interval", intervals, &ok);
    set(extent, "spatial", spatial, &ok);
    set(extent, "temporal", temporal, &ok);
    set(c, "extent", extent, &ok);
    set(c, "links", links, &ok);
    if (!ok) {
        json_decref(c);
        return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    char path[TW_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/collection.json", dir);
    st = tw_stac_write_json(path, c, err);
    json_decref(c);
    return st;
}
