/* validate.c - validation through the public API (tilewise_validate and
 * its accessors: the plan as data) and `tilewise validate`'s text, one
 * rendering of tw_validation (validate.h). */
#include "api/validate.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <stdio.h>

#include <gdal.h>

#include "io/output/polygons.h"
#include "io/input/raster.h"
#include "pipeline/run/preflight.h"
#include "api/api_internal.h"
#include "tilewise.h"

tw_status tw_validate_collect(const tw_run_params *p, tw_validation *v, tw_error *err)
{
    GIntBig cache = GDALGetCacheMax64();
    tw_status st = tw_validate(p, v, err);
    GDALSetCacheMax64(cache);
    return st;
}

static void write_input(const tw_validation *v, const tw_validation_input *in, FILE *out)
{
    if (in->skipped) {
        fprintf(out, "input     %s: skipped (input.on_error: skip): %s\n", in->shown,
                in->skip_reason);
        return;
    }
    if (v->model.segmentation)
        fprintf(out,
                "input     %s: %d x %d, %d bands %s; tiles %d x %d = %lld (tile %d, stride %d, "
                "blend %s, margin %d); output per pixel, %d x %d\n",
                in->shown, in->width, in->height, in->bands, tw_dtype_name(in->dtype), in->tiles_x,
                in->tiles_y, (long long)in->n_tiles, in->tile, in->stride, tw_blend_names[v->blend],
                v->margin, in->grid_w, in->grid_h);
    else
        fprintf(out,
                "input     %s: %d x %d, %d bands %s; tiles %d x %d = %lld (tile %d, stride "
                "%d); output grid %d x %d\n",
                in->shown, in->width, in->height, in->bands, tw_dtype_name(in->dtype), in->tiles_x,
                in->tiles_y, (long long)in->n_tiles, in->tile, in->stride, in->grid_w, in->grid_h);
    char b1[32];
    fprintf(out, "outputs   %s: at most %s on disk (uncompressed, parts included)%s\n", in->shown,
            tw_format_bytes(in->output_bytes, b1, sizeof b1),
            (v->products & TW_PRODUCT_EMB_RASTER)
                ? "; the embedding raster's bands are one per feature"
                : "");
    if (in->remote && in->remote_bytes < 0)
        fprintf(out, "reading   remote; its cost is unknown (not a tiled GeoTIFF/COG)\n");
    else if (in->remote)
        fprintf(out,
                "reading   remote: at least %lld range requests, %s (the blocks of rows %d-%d, "
                "read once; input.retries %d)\n",
                (long long)in->remote_requests,
                tw_format_bytes((size_t)in->remote_bytes, b1, sizeof b1), in->remote_row0,
                in->remote_row1, v->retries);
    if (in->aoi_tiles >= 0)
        fprintf(out,
                "aoi       %s: %lld of %lld tiles touch %s; the others are not "
                "computed (nodata)\n",
                in->shown, (long long)in->aoi_tiles, (long long)in->all_tiles, v->aoi);
    if (v->stac)
        fprintf(out, "stac      %s/%s.stac.json: datetime %s (%s)%s%s\n", v->out_dir, in->stem,
                in->stac_datetime, in->stac_source,
                in->stac_derived_from[0] ? ", derived from " : "", in->stac_derived_from);
}

void tw_validate_write(const tw_validation *v, FILE *out)
{
    if (!v->resolved) return;
    const tw_resolved *m = &v->model;
    if (m->segmentation)
        fprintf(out,
                "model     %s: %s (segmentation: a class per pixel), %d bands, %d classes, tiles "
                "a multiple of %d px (sha256 %.12s)\n",
                v->weights, m->arch, m->in_bands, m->n_classes, m->multiple, m->model_sha256);
    else if (m->headless)
        fprintf(out,
                "model     %s: %s, %d bands, no head (embedding products only), %d features "
                "(sha256 %.12s)\n",
                v->weights, m->arch, m->in_bands, m->feat_dim, m->model_sha256);
    else
        fprintf(out, "model     %s: %s, %d bands, %d classes, %d features (sha256 %.12s)\n",
                v->weights, m->arch, m->in_bands, m->n_classes, m->feat_dim, m->model_sha256);
    fprintf(out, "backend   %s, precision %s\n", v->backend, tw_precision_name(v->precision));
    for (int i = 0; i < v->n_inputs; i++) write_input(v, &v->inputs[i], out);
    if (!v->planned) return;
    if (v->stac && v->stac_items > 1 && v->shard_count == 1)
        fprintf(out, "stac      %s/collection.json: a collection of the %d items\n", v->out_dir,
                v->stac_items);
    if (v->stac && v->stac_items > 0 && v->shard_count == 1)
        fprintf(out,
                "stac      %s/items.json: the items as one FeatureCollection (GDAL: "
                "STACIT:\"items.json\":asset=class)\n",
                v->out_dir);
    if (v->stac && v->shard_count > 1)
        fprintf(out, "stac      written by `tilewise merge %s` with the merged products\n",
                v->out_dir);
    const tw_budget *b = &v->budget;
    char b1[32], b2[32], b3[32], items[512];
    fprintf(out, "batch     %d tiles, %d slots of %s\n", b->batch, b->n_slots,
            tw_format_bytes(b->slot_bytes, b1, sizeof b1));
    fprintf(out, "readers   %d, each with a read strip of %d x %d pixels (%s in all)\n", b->readers,
            b->read_strip_w, m->tile, tw_format_bytes(b->read, b1, sizeof b1));
    fprintf(out, "memory    estimate %s of %s: %s\n", tw_format_bytes(b->estimate, b2, sizeof b2),
            tw_format_bytes(v->memory, b3, sizeof b3),
            tw_budget_breakdown(b, false, items, sizeof items));
    fprintf(out, "          worst case %s (GDAL cache limit %s)\n",
            tw_format_bytes(b->total, b1, sizeof b1),
            tw_format_bytes(b->gdal_cache, b2, sizeof b2));
    for (int i = 0; (v->products & TW_PRODUCT_POLYGONS) && i < v->n_inputs; i++) {
        const tw_validation_input *in = &v->inputs[i];
        if (in->skipped) continue;
        char why[96] = "";
        if (in->polygons_min_cells > 1)
            snprintf(why, sizeof why, " of %.0f cells or more (output.min_area)",
                     in->polygons_min_cells);
        fprintf(
            out,
            "polygons  %s.class.%s: at most %.0f regions%s in %d x %d cells, about %s "
            "of file at that; at assembly %s left for them at %d bytes each (beside their "
            "rows): %lld regions before the sieve\n",
            in->stem, tw_vector_format_names[v->vector_format], in->polygons_most, why,
            in->polygons_grid_w, in->polygons_grid_h,
            tw_format_bytes((size_t)(in->polygons_most * TW_POLYGONS_FILE_BYTES), b1, sizeof b1),
            tw_format_bytes(v->polygons_room, b2, sizeof b2), TW_POLYGONS_REGION_BYTES,
            (long long)in->polygons_fit);
    }
    const tw_advice *a = &v->advice;
    for (int i = 0; i < v->n_checks; i++) fprintf(out, "warning   %s\n", a->items[i].text);
    fprintf(out, "ok\n");
    for (int i = v->n_checks; i < a->n; i++)
        fprintf(out, "%-9s %s\n", a->items[i].warning ? "warning" : a->items[i].code,
                a->items[i].text);
    fprintf(out, "advice    %d warning%s\n", a->n_warnings, a->n_warnings == 1 ? "" : "s");
}

/* ---- validate ---- */

struct tilewise_validation {
    tw_validation data;
    char *text; /* tw_validate_write's rendering */
    size_t len;
    int n_warnings;
    int *warnings; /* [n_warnings]: indexes of data.advice's warnings */
};

tilewise_status tilewise_validate(const char *workflow, const tilewise_run_options *opts,
                                  tilewise_validation **v, tilewise_error *out)
{
    if (v) *v = NULL;
    tw_error err;
    tilewise_run_options o;
    tw_run_params *p = NULL;
    tw_status st = tw_api_load_workflow(workflow, opts, &o, &p, &err);
    if (st != TW_OK) return tw_api_give(out, st, &err);
    tilewise_validation *va = calloc(1, sizeof *va);
    if (!va) {
        free(p);
        return tw_api_give_new(out, TW_ERR_NOMEM, "out of memory");
    }
    st = tw_validate_collect(p, &va->data, &err);
    free(p);
    const tw_advice *a = &va->data.advice;
    va->warnings = calloc((size_t)a->n + 1, sizeof *va->warnings);
    FILE *f = open_memstream(&va->text, &va->len);
    if (!f || !va->warnings) {
        if (f) fclose(f);
        tilewise_validation_free(va);
        return tw_api_give_new(out, TW_ERR_NOMEM, "out of memory");
    }
    tw_validate_write(&va->data, f);
    if (fclose(f) != 0 && st == TW_OK) st = tw_error_set(&err, TW_ERR_NOMEM, "out of memory");
    for (int i = 0; i < a->n; i++)
        if (a->items[i].warning) va->warnings[va->n_warnings++] = i;
    if (v)
        *v = va;
    else
        tilewise_validation_free(va);
    return tw_api_give(out, st, &err);
}

const char *tilewise_validation_text(const tilewise_validation *v)
{
    return v && v->text ? v->text : "";
}

int tilewise_validation_warnings(const tilewise_validation *v)
{
    return v ? v->n_warnings : 0;
}

const char *tilewise_validation_warning(const tilewise_validation *v, int i)
{
    return v && i >= 0 && i < v->n_warnings ? v->data.advice.items[v->warnings[i]].text : NULL;
}

const char *tilewise_validation_warning_code(const tilewise_validation *v, int i)
{
    return v && i >= 0 && i < v->n_warnings ? v->data.advice.items[v->warnings[i]].code : NULL;
}

tilewise_status tilewise_validation_plan(const tilewise_validation *v, tilewise_plan_summary *s,
                                         tilewise_error *out)
{
    if (!v || !s || s->size < offsetof(tilewise_plan_summary, margin_bytes) + sizeof(uint64_t))
        return tw_api_give_new(
            out, TW_ERR_USAGE,
            "tilewise_validation_plan: no validation, no summary or its size not "
            "set (size = sizeof(tilewise_plan_summary))");
    const tw_validation *d = &v->data;
    const tw_budget *b = &d->budget;
    tilewise_plan_summary f = {
        .size = s->size,
        .resolved = d->resolved,
        .planned = d->planned,
        .arch = d->model.arch,
        .model_sha256 = d->model.model_sha256,
        .bands = d->model.in_bands,
        .n_classes = d->model.n_classes,
        .features = d->model.feat_dim,
        .tile = d->model.tile,
        .stride = d->model.stride,
        .backend = d->backend,
        .precision = d->resolved ? tw_precision_name(d->precision) : "",
        .n_inputs = d->n_inputs,
        .batch = b->batch,
        .slots = b->n_slots,
        .readers = b->readers,
        .memory_bytes = d->memory,
        .estimate_bytes = b->estimate,
        .worst_bytes = b->total,
        .base_bytes = b->base,
        .weights_bytes = b->weights,
        .slots_bytes = b->slots,
        .read_bytes = b->read,
        .workspace_bytes = b->workspace,
        .strip_bytes = b->strip,
        .gdal_cache_bytes = b->gdal_cache,
        .margin_bytes = b->margin,
        .task = d->model.segmentation ? "segmentation" : "classification",
        .blend = tw_blend_names[d->blend],
        .margin = d->margin,
    };
    memcpy(s, &f, s->size < sizeof f ? s->size : sizeof f);
    return tw_api_give(out, TW_OK, NULL);
}

tilewise_status tilewise_validation_input(const tilewise_validation *v, int i,
                                          tilewise_plan_input *s, tilewise_error *out)
{
    if (!v || !s || i < 0 || i >= v->data.n_inputs ||
        s->size < offsetof(tilewise_plan_input, remote_bytes) + sizeof(int64_t))
        return tw_api_give_new(out, TW_ERR_USAGE,
                               "tilewise_validation_input: no validation, input %d not planned, or "
                               "the summary's size not set (size = sizeof(tilewise_plan_input))",
                               i);
    const tw_validation_input *in = &v->data.inputs[i];
    tilewise_plan_input f = {
        .size = s->size,
        .path = in->shown,
        .skipped = in->skipped ? in->skip_reason : "",
        .width = in->width,
        .height = in->height,
        .bands = in->bands,
        .dtype = in->skipped ? "" : tw_dtype_name(in->dtype),
        .tiles_x = in->tiles_x,
        .tiles_y = in->tiles_y,
        .tiles = in->n_tiles,
        .grid_width = in->grid_w,
        .grid_height = in->grid_h,
        .aoi_tiles = in->aoi_tiles,
        .remote = in->remote,
        .remote_bytes = in->remote ? in->remote_bytes : -1,
    };
    memcpy(s, &f, s->size < sizeof f ? s->size : sizeof f);
    return tw_api_give(out, TW_OK, NULL);
}

void tilewise_validation_free(tilewise_validation *v)
{
    if (!v) return;
    free(v->text);
    free(v->warnings);
    free(v);
}

tilewise_status tilewise_check(const char *workflow, const tilewise_run_options *opts,
                               tilewise_job *job, tilewise_error *out)
{
    if (!job || job->size < offsetof(tilewise_job, threads) + sizeof(int))
        return tw_api_give_new(out, TW_ERR_USAGE,
                               "tilewise_check: no job, or its size not set "
                               "(size = sizeof(tilewise_job))");
    tw_error err;
    tilewise_run_options o;
    tw_run_params *p = NULL;
    tw_status st = tw_api_load_workflow(workflow, opts, &o, &p, &err);
    /* A bad workflow fails here, once, rather than in every array task. */
    if (st == TW_OK) st = tw_check_inputs(p, &err);
    if (st == TW_OK) st = tw_preflight_submit(p, &err);
    if (st == TW_OK) {
        tilewise_job f = {
            .size = job->size, .memory_bytes = p->runtime.memory, .threads = p->runtime.threads};
        snprintf(f.output_dir, sizeof f.output_dir, "%s", p->output.dir);
        snprintf(f.device, sizeof f.device, "%s", p->runtime.device);
        memcpy(job, &f, job->size < sizeof f ? job->size : sizeof f);
    }
    free(p);
    return tw_api_give(out, st, &err);
}
