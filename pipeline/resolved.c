/* resolved.c - see resolved.h */
#include "pipeline/resolved.h"

#include <stdio.h>
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
