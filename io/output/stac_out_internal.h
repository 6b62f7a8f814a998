/* stac_out_internal.h - what io/output/stac_out.c (the Item) and
 * stac_items.c (items.json, the collection) share (private to io/output/):
 * the JSON helpers, every one remembering a failed allocation in *ok, and
 * the writing of a STAC document. */
#ifndef TW_STAC_OUT_INTERNAL_H
#define TW_STAC_OUT_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>

#include "core/error.h"

static inline void set(json_t *o, const char *k, json_t *v, bool *ok)
{
    if (!o || !v || json_object_set_new(o, k, v) != 0) *ok = false;
}

static inline void push(json_t *a, json_t *v, bool *ok)
{
    if (!a || !v || json_array_append_new(a, v) != 0) *ok = false;
}

/* j as indented JSON text and a newline (17 digits: doubles read back
 * exactly), written atomically to path. */
tw_status tw_stac_write_json(const char *path, json_t *j, tw_error *err);

#endif
