/* info.c - what `tilewise info` prints about a raster or a model file (info.h). */
#include "api/info.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "io/inspect.h"
#include "io/legend.h"
#include "io/model_file.h"
#include "io/raster.h"
#include "io/url.h"
#include "model/resnet.h"
#include "pipeline/json.h"

static bool looks_like_model(const char *path)
{
    const char *dot = strrchr(path, '.');
    if (!dot) return false;
    return strcmp(dot, ".h5") == 0 || strcmp(dot, ".hdf5") == 0 || strcmp(dot, ".safetensors") == 0;
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
        tw_json_int(&j, "n_classes", net->n_classes);
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
        tw_json_close(&j, '}');
        fputc('\n', out);
    } else {
        fprintf(out, "model:      %s\n", path);
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
        fprintf(out, "\nclasses:    %d", net->n_classes);
        for (int i = 0; i < mf->n_classes; i++)
            fprintf(out, "%s%s", i ? ", " : " (", mf->classes[i]);
        fprintf(out, "%s\n", mf->n_classes ? ")" : "");
        fprintf(out, "features:   %d\n", net->feat_dim);
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
    /* An input error, also when a remote raster could not be reached
     * (`tilewise info` says "network error" then, and exits 3). */
    if (tw_inspect_raster(gpath, path, &ri, &uerr) != TW_OK)
        return tw_error_set(err, TW_ERR_INPUT, "%s", uerr.msg);
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

tw_status tw_info_write(const char *path, bool json, bool tiff_direct, FILE *out, tw_error *err)
{
    /* GDAL opens /vsicurl/, https://, s3:// and other virtual paths that
     * fopen does not. */
    if (strncmp(path, "/vsi", 4) != 0 && !tw_url_is_remote(path)) {
        FILE *f = fopen(path, "rb");
        if (!f) return tw_error_set(err, TW_ERR_INPUT, "%s: cannot open", path);
        fclose(f);
    }
    return looks_like_model(path) ? info_model(path, json, out, err)
                                  : info_raster(path, json, tiff_direct, out, err);
}
