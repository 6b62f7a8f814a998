/* info.c - what `tilewise info` prints about a raster or a model file (info.h). */
#include "api/info.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "io/inspect.h"
#include "io/legend.h"
#include "io/model_file.h"
#include "io/polygons.h"
#include "io/raster.h"
#include "io/url.h"
#include "model/resnet.h"
#include "pipeline/json.h"

static bool looks_like_model(const char *path)
{
    const char *dot = strrchr(path, '.');
    if (!dot) return false;
    return strcmp(dot, ".h5") == 0 || strcmp(dot, ".hdf5") == 0 ||
           strcmp(dot, ".safetensors") == 0 || strcmp(dot, ".onnx") == 0;
}

static tw_status info_model(const char *path, bool json, FILE *out, tw_error *err)
{
    tw_model_file *mf = NULL;
    tw_status st = tw_model_file_load(path, &mf, err);
    if (st != TW_OK) return st;
    tw_resnet *net = NULL;
    st = tw_resnet_create(mf, mf->arch, &net, err);
    if (st != TW_OK) {
        tw_model_file_destroy(mf);
        return st;
    }
    long long params = 0;
    for (int i = 0; i < mf->n_tensors; i++)
        if (!strstr(mf->tensors[i].name, "running_") && !strstr(mf->tensors[i].name, "num_batches"))
            params += mf->tensors[i].numel;
    if (json) {
        char arch[32];
        tw_resnet_arch_name(net, arch, sizeof arch);
        tw_json j = tw_json_file(out);
        tw_json_open(&j, NULL, '{');
        tw_json_str(&j, "type", "model");
        tw_json_str(&j, "path", path);
        tw_json_str(&j, "arch", arch);
        tw_json_str(&j, "family", tw_resnet_family_name(net->family));
        tw_json_int(&j, "groups", net->groups);
        tw_json_int(&j, "base_width", net->base_width);
        tw_json_str(&j, "stem", tw_stem_names[net->stem_kind]);
        tw_json_open(&j, "blocks", '[');
        for (int i = 0; i < 4; i++) tw_json_int(&j, NULL, net->stage_blocks[i]);
        tw_json_close(&j, ']');
        tw_json_int(&j, "in_bands", net->in_bands);
        tw_json_open(&j, "bands", '[');
        for (int i = 0; i < mf->n_bands; i++) tw_json_int(&j, NULL, mf->bands[i]);
        tw_json_close(&j, ']');
        tw_json_bool(&j, "head", !net->headless);
        tw_json_int(&j, "n_classes", net->headless ? 0 : net->n_classes);
        tw_json_open(&j, "classes", '[');
        for (int i = 0; i < mf->n_classes; i++) tw_json_str(&j, NULL, mf->classes[i]);
        tw_json_close(&j, ']');
        tw_json_int(&j, "features", net->feat_dim);
        tw_json_int(&j, "parameters", params);
        tw_json_num(&j, "scale", mf->scale);
        tw_json_open(&j, "mean", '[');
        for (int i = 0; i < mf->n_mean; i++) tw_json_real(&j, NULL, mf->mean[i], 9);
        tw_json_close(&j, ']');
        tw_json_open(&j, "std", '[');
        for (int i = 0; i < mf->n_std; i++) tw_json_real(&j, NULL, mf->std[i], 9);
        tw_json_close(&j, ']');
        if (mf->tile)
            tw_json_int(&j, "tile", mf->tile);
        else
            tw_json_null(&j, "tile");
        tw_json_str(&j, "sha256", mf->sha256);
        tw_json_str(&j, "checksum", tw_model_checksum_name(mf->checksum));
        if (mf->format == TW_MODEL_FORMAT_ONNX) {
            const tw_onnx_info *o = &mf->onnx;
            tw_json_open(&j, "onnx", '{');
            tw_json_int(&j, "ir_version", o->ir_version);
            tw_json_int(&j, "opset", o->opset);
            tw_json_str(&j, "producer", o->producer);
            tw_json_int(&j, "nodes", o->n_nodes);
            tw_json_int(&j, "batchnorm_folded_at_load", o->n_bn);
            tw_json_int(&j, "external_tensors", o->n_external);
            tw_json_str(&j, "head", o->head);
            tw_json_str(&j, "metadata", o->metadata);
            tw_json_num(&j, "resolution_cm", o->resolution);
            tw_json_str(&j, "model_type", o->model_type);
            tw_json_close(&j, '}');
        }
        tw_json_close(&j, '}');
        fputc('\n', out);
    } else {
        fprintf(out, "model:      %s\n", path);
        if (mf->format == TW_MODEL_FORMAT_ONNX) {
            const tw_onnx_info *o = &mf->onnx;
            fprintf(out, "format:     ONNX (IR %lld, opset %lld, from %s), %d nodes\n",
                    (long long)o->ir_version, (long long)o->opset,
                    o->producer[0] ? o->producer : "an unnamed producer", o->n_nodes);
            fprintf(out, "graph:      batch norm %s; head %s%s\n",
                    o->n_bn ? "in BatchNormalization nodes (folded at load)"
                            : "folded into the convolutions by the exporter",
                    o->head, o->softmax ? "" : " (tilewise applies the softmax)");
            if (o->n_external)
                fprintf(out, "external:   %d tensors in external data files\n", o->n_external);
            fprintf(out, "metadata:   %s%s\n", o->metadata[0] ? o->metadata : "none used",
                    o->metadata[0] && !isnan(mf->scale) && mf->n_mean
                        ? " (Deepness: values / 255, then (x - mean) / std)"
                        : "");
            if (!isnan(o->resolution))
                fprintf(out,
                        "resolution: %g cm/px (Deepness's; not used: tilewise reads the "
                        "raster at its own)\n",
                        o->resolution);
            if (o->model_type[0]) fprintf(out, "model_type: %s\n", o->model_type);
        }
        char arch[32];
        tw_resnet_arch_name(net, arch, sizeof arch);
        fprintf(out, "arch:       %s (%s blocks %d-%d-%d-%d)\n", arch,
                net->bottleneck ? "bottleneck" : "basic", net->stage_blocks[0],
                net->stage_blocks[1], net->stage_blocks[2], net->stage_blocks[3]);
        fprintf(out, "family:     %s (groups %d, base width %d)\n",
                tw_resnet_family_name(net->family), net->groups, net->base_width);
        fprintf(out, "stem:       %s (conv1 %dx%d stride %d%s)\n", tw_stem_names[net->stem_kind],
                net->stem.k, net->stem.k, net->stem.stride,
                net->stem_kind == TW_STEM_SMALL ? ", no max pool" : ", 3x3 max pool");
        fprintf(out, "bands:      %d", net->in_bands);
        if (mf->n_bands) {
            fprintf(out, " (raster bands");
            for (int i = 0; i < mf->n_bands; i++) fprintf(out, " %d", mf->bands[i]);
            fprintf(out, ")");
        }
        if (net->headless) {
            fprintf(out, "\nhead:       none (a headless backbone: output.products "
                         "embedding_raster, embeddings)\n");
        } else {
            fprintf(out, "\nhead:       fc, %d classes\n", net->n_classes);
            fprintf(out, "classes:    %d", net->n_classes);
            for (int i = 0; i < mf->n_classes; i++)
                fprintf(out, "%s%s", i ? ", " : " (", mf->classes[i]);
            fprintf(out, "%s\n", mf->n_classes ? ")" : "");
        }
        fprintf(out, "features:   %d (the embedding width D)\n", net->feat_dim);
        fprintf(out, "parameters: %lld\n", params);
        if (!isnan(mf->scale)) fprintf(out, "scale:      %g\n", mf->scale);
        if (mf->n_mean) {
            fprintf(out, "mean:      ");
            for (int i = 0; i < mf->n_mean; i++) fprintf(out, " %g", mf->mean[i]);
            fputc('\n', out);
        }
        if (mf->n_std) {
            fprintf(out, "std:       ");
            for (int i = 0; i < mf->n_std; i++) fprintf(out, " %g", mf->std[i]);
            fputc('\n', out);
        }
        if (!mf->n_mean && !mf->n_std)
            fprintf(out, "normalize:  not in the file (give model.mean and model.std)\n");
        if (mf->tile) fprintf(out, "tile:       %d\n", mf->tile);
        fprintf(out, "sha256:     %s\n", mf->sha256);
        fprintf(out, "checksum:   %s\n",
                mf->checksum == TW_CHECKSUM_VERIFIED ? "verified (the tensors match tensors_sha256)"
                : mf->checksum == TW_CHECKSUM_ABSENT
                    ? "absent (a bundle from before tools/export_model.py wrote one)"
                : mf->format == TW_MODEL_FORMAT_ONNX ? "none (ONNX carries none)"
                                                     : "none (safetensors carries none)");
    }
    tw_resnet_destroy(net);
    tw_model_file_destroy(mf);
    return TW_OK;
}

static tw_status info_raster(const char *user_path, bool json, bool tiff_direct, FILE *out,
                             tw_error *err)
{
    /* https:// and s3:// as the run opens them; shown with credentials
     * redacted (io/url.h). */
    char path[TW_URL_SHOWN_MAX], gpath[TW_PATH_MAX + 16];
    tw_url_redact(user_path, path, sizeof path);
    tw_status st = tw_url_to_gdal(user_path, gpath, sizeof gpath, err);
    if (st != TW_OK) return st;
    tw_error uerr;
    tw_error_init(&uerr);
    tw_inspect *ri = NULL;
    /* An input error; TW_ERR_REMOTE when a remote raster could not be
     * reached (a network outage, not a bad object: `tilewise info` says
     * "network error" then, and exits 3 as for any input it cannot read). */
    if (tw_inspect_raster(gpath, path, &ri, &uerr) != TW_OK)
        return tw_error_set(err,
                            tw_url_is_remote(user_path) && tw_url_transient(uerr.msg)
                                ? TW_ERR_REMOTE
                                : TW_ERR_INPUT,
                            "%s", uerr.msg);
    /* Whether tilewise itself accepts it (all bands one supported type). */
    tw_error rerr;
    tw_error_init(&rerr);
    tw_raster *tr = NULL;
    tw_raster_open_params op = {.tiff_direct = tiff_direct};
    bool usable = tw_raster_open_ex(user_path, NULL, 0, &op, &tr, &rerr) == TW_OK;
    tw_raster_close(tr);

    int w = ri->width, h = ri->height, nb = ri->band_count;
    const char *dname = ri->driver;
    const double *gt = ri->geotransform;
    bool has_gt = ri->has_geotransform;
    const char *crs = ri->crs, *kind = ri->crs_kind, *unit_buf = ri->crs_units;
    double mx = ri->metres_x, my = ri->metres_y;
    const char *ovr_layout = ri->layout[0] ? ri->layout : NULL;
    const char *compression = ri->compression[0] ? ri->compression : NULL;

    tw_json j = tw_json_file(out);
    if (json) {
        tw_json_open(&j, NULL, '{');
        tw_json_str(&j, "type", "raster");
        tw_json_str(&j, "path", path);
        tw_json_str(&j, "driver", dname);
        tw_json_int(&j, "width", w);
        tw_json_int(&j, "height", h);
        tw_json_int(&j, "band_count", nb);
        tw_json_str(&j, "crs", crs);
        tw_json_str(&j, "crs_kind", kind);
        tw_json_str(&j, "crs_units", unit_buf);
        if (has_gt) {
            tw_json_open(&j, "geotransform", '[');
            for (int i = 0; i < 6; i++) tw_json_real(&j, NULL, gt[i], 17);
            tw_json_close(&j, ']');
        } else {
            tw_json_null(&j, "geotransform");
        }
        if (has_gt && unit_buf[0]) {
            tw_json_open(&j, "pixel_size_m", '[');
            tw_json_num(&j, NULL, hypot(gt[1], gt[4]) * mx);
            tw_json_num(&j, NULL, hypot(gt[2], gt[5]) * my);
            tw_json_close(&j, ']');
        } else {
            tw_json_null(&j, "pixel_size_m");
        }
        tw_json_str(&j, "layout", ovr_layout ? ovr_layout : "");
        tw_json_str(&j, "compression", compression ? compression : "");
        tw_json_bool(&j, "usable", usable);
        if (!usable) tw_json_str(&j, "problem", rerr.msg);
        tw_json_open(&j, "bands", '[');
    } else {
        fprintf(out, "raster:     %s (%s)\n", path, dname);
        fprintf(out, "size:       %d x %d pixels, %d band%s\n", w, h, nb, nb == 1 ? "" : "s");
        if (kind[0])
            fprintf(out, "crs:        %s, %s%s%s\n", crs, kind, unit_buf[0] ? ", units " : "",
                    unit_buf);
        else
            fprintf(out, "crs:        %s\n", crs);
        if (has_gt) {
            fprintf(out, "origin:     %.10g, %.10g\n", gt[0], gt[3]);
            fprintf(out, "pixel:      %.10g x %.10g", gt[1], gt[5]);
            if (gt[2] != 0 || gt[4] != 0) fprintf(out, " (rotated: %g, %g)", gt[2], gt[4]);
            if (unit_buf[0] && strcmp(kind, "projected") != 0)
                fprintf(out, " %s (about %.4g x %.4g m)", unit_buf, hypot(gt[1], gt[4]) * mx,
                        hypot(gt[2], gt[5]) * my);
            else if (unit_buf[0])
                fprintf(out, " %s", unit_buf);
            fputc('\n', out);
        } else {
            fprintf(out, "pixel:      no geotransform (pixel coordinates)\n");
        }
        if (ovr_layout || compression)
            fprintf(out, "layout:     %s%s%s\n", ovr_layout ? ovr_layout : "",
                    ovr_layout && compression ? ", " : "", compression ? compression : "");
        if (usable)
            fprintf(out, "usable:     yes\n");
        else
            fprintf(out, "usable:     no: %s\n", rerr.msg);
    }
    for (int i = 1; i <= nb; i++) {
        const tw_inspect_band *ib = &ri->bands[i - 1];
        int bw = ib->block_w, bh = ib->block_h, has_nd = ib->has_nodata;
        double nd = ib->nodata;
        const char *type = ib->type, *desc = ib->description, *ci = ib->color;
        int n_ovr = ib->overviews;
        double lo = ib->min, hi = ib->max;
        bool stats = ib->has_stats;
        if (json) {
            tw_json_open(&j, NULL, '{');
            tw_json_int(&j, "band", i);
            tw_json_str(&j, "type", type);
            tw_json_open(&j, "block", '[');
            tw_json_int(&j, NULL, bw);
            tw_json_int(&j, NULL, bh);
            tw_json_close(&j, ']');
            if (has_nd)
                tw_json_num(&j, "nodata", nd);
            else
                tw_json_null(&j, "nodata");
            tw_json_str(&j, "description", desc);
            tw_json_str(&j, "color", ci);
            tw_json_int(&j, "overviews", n_ovr);
            if (stats) {
                tw_json_num(&j, "min", lo);
                tw_json_num(&j, "max", hi);
            }
            tw_json_close(&j, '}');
        } else {
            fprintf(out, "band %-5d  %s, block %d x %d, nodata ", i, type, bw, bh);
            if (has_nd)
                fprintf(out, "%.17g", nd);
            else
                fprintf(out, "none");
            fprintf(out, ", %s", ci);
            if (desc && desc[0]) fprintf(out, ", \"%s\"", desc);
            if (n_ovr) fprintf(out, ", %d overview%s", n_ovr, n_ovr == 1 ? "" : "s");
            if (stats) fprintf(out, ", min %g max %g", lo, hi);
            fputc('\n', out);
        }
    }
    if (!json && tw_url_is_remote(user_path)) {
        int64_t bytes = -1, reqs = -1;
        tw_error cerr;
        tw_error_init(&cerr);
        if (tw_url_read_cost(gpath, 0, h, 0, &bytes, &reqs, &cerr) == TW_OK && bytes >= 0)
            fprintf(
                out,
                "reading:    remote; all of it takes at least %lld range requests, %lld bytes\n",
                (long long)reqs + 2, (long long)bytes);
        else
            fprintf(out, "reading:    remote; cost unknown (not a tiled GeoTIFF/COG)\n");
    }
    char legend[1536];
    bool has_legend = tw_legend_note(path, legend, sizeof legend);
    if (json) {
        tw_json_close(&j, ']');
        if (has_legend) tw_json_str(&j, "legend", legend);
        tw_json_close(&j, '}');
        fputc('\n', out);
    } else if (has_legend) {
        fprintf(out, "legend:     %s\n", legend);
    }
    tw_inspect_destroy(ri);
    return TW_OK;
}

static bool looks_like_vector(const char *path)
{
    const char *dot = strrchr(path, '.');
    return dot && (strcmp(dot, ".gpkg") == 0 || strcmp(dot, ".fgb") == 0);
}

/* A polygons product (io/polygons.h): the layer, its features and each
 * class's regions, cells and area. *done false: not one (a raster
 * GeoPackage, say), nothing written. */
static tw_status info_polygons(const char *path, bool json, FILE *out, bool *done, tw_error *err)
{
    tw_polygons_summary *s = tw_calloc(TW_MEM_OTHER, 1, sizeof *s);
    if (!s) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    tw_status st = tw_polygons_summarize(path, s, err);
    *done = st == TW_OK && s->found;
    if (*done && json) {
        tw_json j = tw_json_file(out);
        tw_json_open(&j, NULL, '{');
        tw_json_str(&j, "type", "polygons");
        tw_json_str(&j, "path", path);
        tw_json_str(&j, "driver", s->driver);
        tw_json_str(&j, "layer", "classes");
        tw_json_int(&j, "features", s->features);
        tw_json_str(&j, "crs", s->crs);
        tw_json_str(&j, "area_unit", s->area_unit);
        tw_json_open(&j, "extent", '[');
        for (int i = 0; i < 4; i++) tw_json_real(&j, NULL, s->extent[i], 17);
        tw_json_close(&j, ']');
        tw_json_open(&j, "classes", '[');
        for (int i = 0; i < s->n_classes; i++) {
            tw_json_open(&j, NULL, '{');
            tw_json_int(&j, "class", s->classes[i].cls);
            tw_json_str(&j, "name", s->classes[i].name);
            tw_json_int(&j, "features", s->classes[i].features);
            tw_json_int(&j, "cells", s->classes[i].cells);
            tw_json_real(&j, "area", s->classes[i].area, 17);
            tw_json_close(&j, '}');
        }
        tw_json_close(&j, ']');
        tw_json_close(&j, '}');
        fputc('\n', out);
    } else if (*done) {
        double total = 0;
        for (int i = 0; i < s->n_classes; i++) total += s->classes[i].area;
        fprintf(out, "polygons:   %s (%s)\n", path, s->driver);
        fprintf(out, "layer:      classes, %lld features, CRS %s\n", (long long)s->features,
                s->crs[0] ? s->crs : "none");
        fprintf(out, "extent:     %.6f, %.6f - %.6f, %.6f\n", s->extent[0], s->extent[2],
                s->extent[1], s->extent[3]);
        fprintf(out, "area unit:  %s\n", s->area_unit[0] ? s->area_unit : "unknown");
        fprintf(out, "classes:\n");
        for (int i = 0; i < s->n_classes; i++)
            fprintf(out, "  %3d %-20s %8lld features %12lld cells %18.3f (%5.1f%%)\n",
                    s->classes[i].cls, s->classes[i].name, (long long)s->classes[i].features,
                    (long long)s->classes[i].cells, s->classes[i].area,
                    total > 0 ? 100.0 * s->classes[i].area / total : 0.0);
    }
    tw_free(s);
    return st;
}

tw_status tw_info_write(const char *path, bool json, bool tiff_direct, FILE *out, tw_error *err)
{
    /* GDAL opens /vsicurl/, https://, s3:// and other virtual paths that
     * fopen does not. */
    if (strncmp(path, "/vsi", 4) != 0 && !tw_url_is_remote(path)) {
        FILE *f = fopen(path, "rb");
        if (!f) return tw_error_set(err, TW_ERR_INPUT, "%s: cannot open", path);
        fclose(f);
    }
    if (tw_info_is_stac(path)) return tw_info_stac(path, json, out, err);
    if (looks_like_vector(path)) {
        bool done = false;
        tw_status st = info_polygons(path, json, out, &done, err);
        if (st != TW_OK || done) return st;
    }
    return looks_like_model(path) ? info_model(path, json, out, err)
                                  : info_raster(path, json, tiff_direct, out, err);
}
