/* validate.c - `tilewise validate`'s text: one rendering of tw_validation
 * (validate.h). */
#include "api/validate.h"

#include <stdio.h>

#include <gdal.h>

#include "io/raster.h"

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
    fprintf(out,
            "input     %s: %d x %d, %d bands %s; tiles %d x %d = %lld (tile %d, stride "
            "%d); output grid %d x %d\n",
            in->shown, in->width, in->height, in->bands, tw_dtype_name(in->dtype), in->tiles_x,
            in->tiles_y, (long long)in->n_tiles, in->tile, in->stride, in->grid_w, in->grid_h);
    char b1[32];
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
    fprintf(out, "model     %s: %s, %d bands, %d classes, %d features (sha256 %.12s)\n", v->weights,
            m->arch, m->in_bands, m->n_classes, m->feat_dim, m->model_sha256);
    fprintf(out, "backend   %s, precision %s\n", v->backend, tw_precision_name(v->precision));
    for (int i = 0; i < v->n_inputs; i++) write_input(v, &v->inputs[i], out);
    if (!v->planned) return;
    if (v->stac && v->stac_items > 1 && v->shard_count == 1)
        fprintf(out, "stac      %s/collection.json: a collection of the %d items\n", v->out_dir,
                v->stac_items);
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
    const tw_advice *a = &v->advice;
    for (int i = 0; i < v->n_checks; i++) fprintf(out, "warning   %s\n", a->items[i].text);
    fprintf(out, "ok\n");
    for (int i = v->n_checks; i < a->n; i++)
        fprintf(out, "%-9s %s\n", a->items[i].warning ? "warning" : a->items[i].code,
                a->items[i].text);
    fprintf(out, "advice    %d warning%s\n", a->n_warnings, a->n_warnings == 1 ? "" : "s");
}
