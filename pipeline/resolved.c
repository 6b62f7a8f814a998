/* resolved.c - see resolved.h */
#include "pipeline/resolved.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tw_run_params_resolved(const tw_run_params *p, const tw_resolved *m, tw_run_params *out)
{
    *out = *p;
    out->input.n_bands = m->n_bands;
    memcpy(out->input.bands, m->bands, sizeof out->input.bands);
    out->input.scale = m->scale;
    snprintf(out->model.arch, sizeof out->model.arch, "%s", m->arch);
    out->model.stem = m->stem;
    out->model.n_mean = out->model.n_std = m->n_norm;
    memcpy(out->model.mean, m->mean, sizeof out->model.mean);
    memcpy(out->model.std, m->std, sizeof out->model.std);
    out->model.n_classes = m->n_classes;
    memcpy(out->model.classes, m->classes, sizeof out->model.classes);
    out->tiling.tile = m->tile;
    out->tiling.stride = m->stride;
    /* a segmentation model's cells are the input's pixels: its products are
     * on the input's grid whatever output.resolution says */
    if (m->segmentation) out->output.resolution = TW_RESOLUTION_INPUT;
}

json_t *tw_json_exact_str(const char *s)
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

json_t *tw_json_exact_real(double d)
{
    if (isnan(d)) return json_string("nan");
    if (isinf(d)) return json_string(d > 0 ? "inf" : "-inf");
    return json_real(d);
}

static void put(json_t *o, const char *key, json_t *v, bool *ok)
{
    if (!v || json_object_set_new(o, key, v) != 0) *ok = false;
}

static void push(json_t *a, json_t *v, bool *ok)
{
    if (!a || !v || json_array_append_new(a, v) != 0) *ok = false;
}

void tw_model_facts_json(json_t *o, const tw_resolved *m, unsigned which, bool *ok)
{
    if (which & TW_FACTS_MODEL) {
        put(o, "task", json_string(m->segmentation ? "segmentation" : "classification"), ok);
        put(o, "arch", tw_json_exact_str(m->arch), ok);
        put(o, "stem", json_string(tw_stem_names[m->stem]), ok);
        put(o, "in_bands", json_integer(m->in_bands), ok);
        put(o, "feature_dim", json_integer(m->feat_dim), ok);
        put(o, "head", json_boolean(!m->headless), ok);
        put(o, "tile_multiple", json_integer(m->multiple > 0 ? m->multiple : 1), ok);
        put(o, "sha256", tw_json_exact_str(m->model_sha256), ok);
    }
    if (which & TW_FACTS_RESOLVED) {
        json_t *bands = json_array(), *classes = json_array();
        json_t *mean = json_array(), *std = json_array();
        for (int i = 0; i < m->n_bands; i++) push(bands, json_integer(m->bands[i]), ok);
        for (int i = 0; i < m->n_classes; i++) push(classes, tw_json_exact_str(m->classes[i]), ok);
        for (int i = 0; i < m->n_norm; i++) {
            push(mean, tw_json_exact_real(m->mean[i]), ok);
            push(std, tw_json_exact_real(m->std[i]), ok);
        }
        put(o, "bands", bands, ok);
        put(o, "classes", classes, ok);
        put(o, "n_classes", json_integer(m->n_classes), ok);
        put(o, "tile", json_integer(m->tile), ok);
        put(o, "stride", json_integer(m->stride), ok);
        put(o, "scale", tw_json_exact_real(m->scale), ok);
        put(o, "mean", mean, ok);
        put(o, "std", std, ok);
    }
}
