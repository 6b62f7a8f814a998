/* info_tree.c - `tilewise info`'s facts tree (info_internal.h): building
 * its members and reading them back for the text. Its own file so that
 * info.c (the kinds, the JSON form) and info_stac.c (a STAC item's facts
 * and text) both build on it without calling each other. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>

#include "api/info_internal.h"

void tw_info_put(json_t *o, const char *key, json_t *v, bool *ok)
{
    if (json_object_set_new(o, key, v) != 0) *ok = false;
}

void tw_info_push(json_t *a, json_t *v, bool *ok)
{
    if (json_array_append_new(a, v) != 0) *ok = false;
}

json_t *tw_info_str(const char *s)
{
    return json_string_nocheck(s ? s : "");
}

json_t *tw_info_num(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

void tw_info_put_shown(json_t *o, const char *key, double v, bool *ok)
{
    tw_info_put(o, key, tw_info_num(v), ok);
    if (isfinite(v)) return;
    char k[64], text[16];
    snprintf(k, sizeof k, "_%s", key);
    snprintf(text, sizeof text, "%g", v);
    tw_info_put(o, k, json_string(text), ok);
}

const char *tw_info_get_str(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

long long tw_info_get_int(const json_t *o, const char *key)
{
    return (long long)json_integer_value(json_object_get(o, key));
}

double tw_info_get_num(const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

bool tw_info_get_bool(const json_t *o, const char *key)
{
    return json_is_true(json_object_get(o, key));
}

bool tw_info_shown(const json_t *o, const char *key, const char *fmt, char *buf, size_t size)
{
    json_t *v = json_object_get(o, key);
    if (json_is_number(v)) {
        snprintf(buf, size, fmt, json_number_value(v));
        return true;
    }
    char k[64];
    snprintf(k, sizeof k, "_%s", key);
    const char *s = json_string_value(json_object_get(o, k));
    if (s) snprintf(buf, size, "%s", s);
    return s != NULL;
}

void tw_info_norm_text(const json_t *f, FILE *out)
{
    json_t *v;
    size_t i;
    if (!isnan(tw_info_get_num(f, "scale")))
        fprintf(out, "scale:      %g\n", tw_info_get_num(f, "scale"));
    json_t *mean = json_object_get(f, "mean"), *std = json_object_get(f, "std");
    if (json_array_size(mean)) {
        fprintf(out, "mean:      ");
        json_array_foreach(mean, i, v) fprintf(out, " %g", json_number_value(v));
        fputc('\n', out);
    }
    if (json_array_size(std)) {
        fprintf(out, "std:       ");
        json_array_foreach(std, i, v) fprintf(out, " %g", json_number_value(v));
        fputc('\n', out);
    }
    if (!json_array_size(mean) && !json_array_size(std))
        fprintf(out, "normalize:  not in the file (give model.mean and model.std)\n");
    if (json_is_integer(json_object_get(f, "tile")))
        fprintf(out, "tile:       %lld\n", tw_info_get_int(f, "tile"));
    fprintf(out, "sha256:     %s\n", tw_info_get_str(f, "sha256"));
}
