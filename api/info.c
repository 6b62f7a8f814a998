/* info.c - `tilewise info` (info.h): the facts about a model file, a raster
 * or a polygons product gathered once into a jansson tree, then written
 * either as JSON (the tree as it is) or as text (one renderer per kind,
 * reading the same tree; info_internal.h). */
#include "api/info.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/info_internal.h"
#include "core/alloc.h"
#include "core/fileio.h"
#include "io/input/inspect.h"
#include "io/output/legend.h"
#include "io/modelfile/model_file.h"
#include "io/output/polygons.h"
#include "io/input/raster.h"
#include "io/url.h"
#include "model/resnet.h"
#include "model/segnet.h"
#include "pipeline/report/json.h"
#include "pipeline/resolved.h"

/* ---- the JSON form ---- */

/* The significant digits of a number, by the member that holds it (an
 * array's elements: the array's): exact for the doubles a program computes
 * with (17) and for the model's float normalization (9); 10 else. */
static int digits_of(const char *holder)
{
    static const struct {
        const char *key;
        int digits;
    } k_digits[] = {{"geotransform", 17}, {"extent", 17}, {"area", 17},
                    {"bbox", 17},         {"mean", 9},    {"std", 9}};
    for (size_t i = 0; holder && i < sizeof k_digits / sizeof k_digits[0]; i++)
        if (strcmp(holder, k_digits[i].key) == 0) return k_digits[i].digits;
    return 10;
}

/* v as member key (NULL: an element of holder's array), the "_" members
 * left out. */
static void write_json(tw_json *j, const char *key, const char *holder, const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *m;
        tw_json_open(j, key, '{');
        json_object_foreach((json_t *)v, k, m)
        {
            if (k[0] != '_') write_json(j, k, k, m);
        }
        tw_json_close(j, '}');
        break;
    }
    case JSON_ARRAY: {
        size_t i;
        json_t *e;
        tw_json_open(j, key, '[');
        json_array_foreach(v, i, e) write_json(j, NULL, holder, e);
        tw_json_close(j, ']');
        break;
    }
    case JSON_STRING: tw_json_str(j, key, json_string_value(v)); break;
    case JSON_INTEGER: tw_json_int(j, key, (long long)json_integer_value(v)); break;
    case JSON_REAL: tw_json_real(j, key, json_real_value(v), digits_of(holder)); break;
    case JSON_TRUE:
    case JSON_FALSE: tw_json_bool(j, key, json_is_true(v)); break;
    case JSON_NULL: tw_json_null(j, key); break;
    }
}

/* ---- a model file ---- */

static bool looks_like_model(const char *path)
{
    const char *dot = strrchr(path, '.');
    if (!dot) return false;
    return strcmp(dot, ".h5") == 0 || strcmp(dot, ".hdf5") == 0 ||
           strcmp(dot, ".safetensors") == 0 || strcmp(dot, ".onnx") == 0;
}

static json_t *int_array(const int *v, int n, bool *ok)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) tw_info_push(a, json_integer(v[i]), ok);
    return a;
}

static json_t *real_array(const float *v, int n, bool *ok)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) tw_info_push(a, tw_info_num(v[i]), ok);
    return a;
}

/* The ONNX graph's facts ("_softmax": the text's only). */
static json_t *onnx_facts(const tw_onnx_info *o, bool *ok)
{
    json_t *f = json_object();
    tw_info_put(f, "ir_version", json_integer(o->ir_version), ok);
    tw_info_put(f, "opset", json_integer(o->opset), ok);
    tw_info_put(f, "producer", tw_info_str(o->producer), ok);
    tw_info_put(f, "nodes", json_integer(o->n_nodes), ok);
    tw_info_put(f, "batchnorm_folded_at_load", json_integer(o->n_bn), ok);
    tw_info_put(f, "external_tensors", json_integer(o->n_external), ok);
    tw_info_put(f, "head", tw_info_str(o->head), ok);
    tw_info_put(f, "metadata", tw_info_str(o->metadata), ok);
    tw_info_put(f, "resolution_cm", tw_info_num(o->resolution), ok);
    tw_info_put(f, "model_type", tw_info_str(o->model_type), ok);
    tw_info_put(f, "_softmax", json_boolean(o->softmax), ok);
    return f;
}

/* The model's facts: what the file itself says in the facts' one shape
 * (pipeline/resolved.h, TW_FACTS_MODEL), then the rest as the file has them
 * (bands, classes, tile, scale, mean, std: the file's, null or empty when it
 * has none, not what a run would resolve). "features" is "feature_dim" under
 * its first name, kept for readers of earlier versions. ("_bottleneck",
 * "_stem_kernel", "_stem_stride": the text's only.) */
static json_t *model_facts(const char *path, const tw_model_file *mf, const tw_resnet *net,
                           bool *ok)
{
    long long params = 0;
    for (int i = 0; i < mf->n_tensors; i++)
        if (!strstr(mf->tensors[i].name, "running_") && !strstr(mf->tensors[i].name, "num_batches"))
            params += mf->tensors[i].numel;
    tw_resolved m = {.stem = net->stem_kind,
                     .in_bands = net->in_bands,
                     .feat_dim = net->feat_dim,
                     .headless = net->headless};
    tw_resnet_arch_name(net, m.arch, sizeof m.arch);
    memcpy(m.model_sha256, mf->sha256, sizeof m.model_sha256);
    json_t *f = json_object(), *classes = json_array();
    tw_info_put(f, "type", json_string("model"), ok);
    tw_info_put(f, "path", tw_info_str(path), ok);
    tw_model_facts_json(f, &m, TW_FACTS_MODEL, ok);
    tw_info_put(f, "family", tw_info_str(tw_resnet_family_name(net->family)), ok);
    tw_info_put(f, "groups", json_integer(net->groups), ok);
    tw_info_put(f, "base_width", json_integer(net->base_width), ok);
    tw_info_put(f, "blocks", int_array(net->stage_blocks, 4, ok), ok);
    tw_info_put(f, "bands", int_array(mf->bands, mf->n_bands, ok), ok);
    tw_info_put(f, "n_classes", json_integer(net->headless ? 0 : net->n_classes), ok);
    for (int i = 0; i < mf->n_classes; i++) tw_info_push(classes, tw_info_str(mf->classes[i]), ok);
    tw_info_put(f, "classes", classes, ok);
    tw_info_put(f, "features", json_integer(net->feat_dim), ok);
    tw_info_put(f, "parameters", json_integer(params), ok);
    tw_info_put(f, "scale", tw_info_num(mf->scale), ok);
    tw_info_put(f, "mean", real_array(mf->mean, mf->n_mean, ok), ok);
    tw_info_put(f, "std", real_array(mf->std, mf->n_std, ok), ok);
    tw_info_put(f, "tile", mf->tile ? json_integer(mf->tile) : json_null(), ok);
    tw_info_put(f, "checksum", tw_info_str(tw_model_checksum_name(mf->checksum)), ok);
    if (mf->format == TW_MODEL_FORMAT_ONNX) tw_info_put(f, "onnx", onnx_facts(&mf->onnx, ok), ok);
    tw_info_put(f, "_bottleneck", json_boolean(net->bottleneck), ok);
    tw_info_put(f, "_stem_kernel", json_integer(net->stem.k), ok);
    tw_info_put(f, "_stem_stride", json_integer(net->stem.stride), ok);
    return f;
}

static tw_status info_model(const char *path, json_t **facts, tw_error *err)
{
    tw_model_file *mf = NULL;
    tw_status st = tw_model_file_load(path, &mf, err);
    if (st != TW_OK) return st;
    if (tw_segnet_detect(mf)) {
        tw_segnet *seg = NULL;
        st = tw_segnet_create(mf, mf->arch, &seg, err);
        bool ok = true;
        if (st == TW_OK) *facts = tw_info_seg_facts(path, mf, seg, &ok);
        if (st == TW_OK && !ok) st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
        tw_segnet_destroy(seg);
        tw_model_file_destroy(mf);
        return st;
    }
    tw_resnet *net = NULL;
    st = tw_resnet_create(mf, mf->arch, &net, err);
    if (st == TW_OK) {
        bool ok = true;
        *facts = model_facts(path, mf, net, &ok);
        if (!ok) st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    tw_resnet_destroy(net);
    tw_model_file_destroy(mf);
    return st;
}

static void model_text(const json_t *f, FILE *out)
{
    if (strcmp(tw_info_get_str(f, "task"), "segmentation") == 0) {
        tw_info_seg_text(f, out);
        return;
    }
    const json_t *o = json_object_get(f, "onnx");
    json_t *mean = json_object_get(f, "mean");
    json_t *v;
    size_t i;
    fprintf(out, "model:      %s\n", tw_info_get_str(f, "path"));
    if (o) {
        const char *producer = tw_info_get_str(o, "producer");
        const char *metadata = tw_info_get_str(o, "metadata");
        fprintf(out, "format:     ONNX (IR %lld, opset %lld, from %s), %lld nodes\n",
                tw_info_get_int(o, "ir_version"), tw_info_get_int(o, "opset"),
                producer[0] ? producer : "an unnamed producer", tw_info_get_int(o, "nodes"));
        fprintf(out, "graph:      batch norm %s; head %s%s\n",
                tw_info_get_int(o, "batchnorm_folded_at_load")
                    ? "in BatchNormalization nodes (folded at load)"
                    : "folded into the convolutions by the exporter",
                tw_info_get_str(o, "head"),
                tw_info_get_bool(o, "_softmax") ? "" : " (tilewise applies the softmax)");
        if (tw_info_get_int(o, "external_tensors"))
            fprintf(out, "external:   %lld tensors in external data files\n",
                    tw_info_get_int(o, "external_tensors"));
        fprintf(out, "metadata:   %s%s\n", metadata[0] ? metadata : "none used",
                metadata[0] && !isnan(tw_info_get_num(f, "scale")) && json_array_size(mean)
                    ? " (Deepness: values / 255, then (x - mean) / std)"
                    : "");
        double resolution = tw_info_get_num(o, "resolution_cm");
        if (!isnan(resolution))
            fprintf(out,
                    "resolution: %g cm/px (Deepness's; not used: tilewise reads the "
                    "raster at its own)\n",
                    resolution);
        if (tw_info_get_str(o, "model_type")[0])
            fprintf(out, "model_type: %s\n", tw_info_get_str(o, "model_type"));
    }
    json_t *blocks = json_object_get(f, "blocks");
    fprintf(out, "arch:       %s (%s blocks %lld-%lld-%lld-%lld)\n", tw_info_get_str(f, "arch"),
            tw_info_get_bool(f, "_bottleneck") ? "bottleneck" : "basic",
            (long long)json_integer_value(json_array_get(blocks, 0)),
            (long long)json_integer_value(json_array_get(blocks, 1)),
            (long long)json_integer_value(json_array_get(blocks, 2)),
            (long long)json_integer_value(json_array_get(blocks, 3)));
    fprintf(out, "family:     %s (groups %lld, base width %lld)\n", tw_info_get_str(f, "family"),
            tw_info_get_int(f, "groups"), tw_info_get_int(f, "base_width"));
    const char *stem = tw_info_get_str(f, "stem");
    fprintf(out, "stem:       %s (conv1 %lldx%lld stride %lld%s)\n", stem,
            tw_info_get_int(f, "_stem_kernel"), tw_info_get_int(f, "_stem_kernel"),
            tw_info_get_int(f, "_stem_stride"),
            strcmp(stem, tw_stem_names[TW_STEM_SMALL]) == 0 ? ", no max pool" : ", 3x3 max pool");
    json_t *bands = json_object_get(f, "bands");
    fprintf(out, "bands:      %lld", tw_info_get_int(f, "in_bands"));
    if (json_array_size(bands)) {
        fprintf(out, " (raster bands");
        json_array_foreach(bands, i, v) fprintf(out, " %lld", (long long)json_integer_value(v));
        fprintf(out, ")");
    }
    if (!tw_info_get_bool(f, "head")) {
        fprintf(out, "\nhead:       none (a headless backbone: output.products "
                     "embedding_raster, embeddings)\n");
    } else {
        json_t *classes = json_object_get(f, "classes");
        long long n = tw_info_get_int(f, "n_classes");
        fprintf(out, "\nhead:       fc, %lld classes\n", n);
        fprintf(out, "classes:    %lld", n);
        json_array_foreach(classes, i, v)
            fprintf(out, "%s%s", i ? ", " : " (", json_string_value(v));
        fprintf(out, "%s\n", json_array_size(classes) ? ")" : "");
    }
    fprintf(out, "features:   %lld (the embedding width D)\n", tw_info_get_int(f, "features"));
    fprintf(out, "parameters: %lld\n", tw_info_get_int(f, "parameters"));
    tw_info_norm_text(f, out);
    const char *checksum = tw_info_get_str(f, "checksum");
    fprintf(out, "checksum:   %s\n",
            strcmp(checksum, "verified") == 0 ? "verified (the tensors match tensors_sha256)"
            : strcmp(checksum, "absent") == 0
                ? "absent (a bundle from before tools/export_model.py wrote one)"
            : o ? "none (ONNX carries none)"
                : "none (safetensors carries none)");
}

/* ---- a raster ---- */

/* One band's facts ("_nodata", "_min", "_max": the text's, when not
 * finite). */
static json_t *band_facts(int band, const tw_inspect_band *ib, bool *ok)
{
    json_t *f = json_object(), *block = json_array();
    tw_info_put(f, "band", json_integer(band), ok);
    tw_info_put(f, "type", tw_info_str(ib->type), ok);
    tw_info_push(block, json_integer(ib->block_w), ok);
    tw_info_push(block, json_integer(ib->block_h), ok);
    tw_info_put(f, "block", block, ok);
    if (ib->has_nodata)
        tw_info_put_shown(f, "nodata", ib->nodata, ok);
    else
        tw_info_put(f, "nodata", json_null(), ok);
    tw_info_put(f, "description", tw_info_str(ib->description), ok);
    tw_info_put(f, "color", tw_info_str(ib->color), ok);
    tw_info_put(f, "overviews", json_integer(ib->overviews), ok);
    if (ib->has_stats) {
        tw_info_put_shown(f, "min", ib->min, ok);
        tw_info_put_shown(f, "max", ib->max, ok);
    }
    return f;
}

/* The raster's facts; read_cost: also "_reading" (what reading all of a
 * remote raster takes: {requests, bytes}, null when unknown; it costs
 * requests, so only the text asks). */
static json_t *raster_facts(const char *user_path, const char *path, const char *gpath,
                            const tw_inspect *ri, const tw_error *rerr, bool usable, bool read_cost,
                            bool *ok)
{
    const double *gt = ri->geotransform;
    json_t *f = json_object(), *bands = json_array();
    tw_info_put(f, "type", json_string("raster"), ok);
    tw_info_put(f, "path", tw_info_str(path), ok);
    tw_info_put(f, "driver", tw_info_str(ri->driver), ok);
    tw_info_put(f, "width", json_integer(ri->width), ok);
    tw_info_put(f, "height", json_integer(ri->height), ok);
    tw_info_put(f, "band_count", json_integer(ri->band_count), ok);
    tw_info_put(f, "crs", tw_info_str(ri->crs), ok);
    tw_info_put(f, "crs_kind", tw_info_str(ri->crs_kind), ok);
    tw_info_put(f, "crs_units", tw_info_str(ri->crs_units), ok);
    json_t *g = ri->has_geotransform ? json_array() : json_null();
    for (int i = 0; ri->has_geotransform && i < 6; i++) tw_info_push(g, tw_info_num(gt[i]), ok);
    tw_info_put(f, "geotransform", g, ok);
    json_t *px = json_null();
    if (ri->has_geotransform && ri->crs_units[0]) {
        json_decref(px);
        px = json_array();
        tw_info_push(px, tw_info_num(hypot(gt[1], gt[4]) * ri->metres_x), ok);
        tw_info_push(px, tw_info_num(hypot(gt[2], gt[5]) * ri->metres_y), ok);
    }
    tw_info_put(f, "pixel_size_m", px, ok);
    tw_info_put(f, "layout", tw_info_str(ri->layout), ok);
    tw_info_put(f, "compression", tw_info_str(ri->compression), ok);
    tw_info_put(f, "usable", json_boolean(usable), ok);
    if (!usable) tw_info_put(f, "problem", tw_info_str(rerr->msg), ok);
    for (int i = 0; i < ri->band_count; i++)
        tw_info_push(bands, band_facts(i + 1, &ri->bands[i], ok), ok);
    tw_info_put(f, "bands", bands, ok);
    char legend[1536];
    if (tw_legend_note(path, legend, sizeof legend))
        tw_info_put(f, "legend", tw_info_str(legend), ok);
    if (read_cost && tw_url_is_remote(user_path)) {
        int64_t bytes = -1, reqs = -1;
        tw_error cerr;
        tw_error_init(&cerr);
        json_t *r = json_null();
        if (tw_url_read_cost(gpath, 0, ri->height, 0, &bytes, &reqs, &cerr) == TW_OK &&
            bytes >= 0) {
            json_decref(r);
            r = json_object();
            tw_info_put(r, "requests", json_integer(reqs), ok);
            tw_info_put(r, "bytes", json_integer(bytes), ok);
        }
        tw_info_put(f, "_reading", r, ok);
    }
    return f;
}

static tw_status info_raster(const char *user_path, bool read_cost, bool tiff_direct,
                             json_t **facts, tw_error *err)
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
    bool ok = true;
    *facts = raster_facts(user_path, path, gpath, ri, &rerr, usable, read_cost, &ok);
    tw_inspect_destroy(ri);
    return ok ? TW_OK : tw_error_set(err, TW_ERR_NOMEM, "out of memory");
}

static void raster_text(const json_t *f, FILE *out)
{
    long long nb = tw_info_get_int(f, "band_count");
    const char *kind = tw_info_get_str(f, "crs_kind"), *units = tw_info_get_str(f, "crs_units");
    fprintf(out, "raster:     %s (%s)\n", tw_info_get_str(f, "path"), tw_info_get_str(f, "driver"));
    fprintf(out, "size:       %lld x %lld pixels, %lld band%s\n", tw_info_get_int(f, "width"),
            tw_info_get_int(f, "height"), nb, nb == 1 ? "" : "s");
    if (kind[0])
        fprintf(out, "crs:        %s, %s%s%s\n", tw_info_get_str(f, "crs"), kind,
                units[0] ? ", units " : "", units);
    else
        fprintf(out, "crs:        %s\n", tw_info_get_str(f, "crs"));
    json_t *g = json_object_get(f, "geotransform");
    if (json_is_array(g)) {
        double gt[6];
        for (size_t i = 0; i < 6; i++) gt[i] = json_number_value(json_array_get(g, i));
        json_t *px = json_object_get(f, "pixel_size_m");
        fprintf(out, "origin:     %.10g, %.10g\n", gt[0], gt[3]);
        fprintf(out, "pixel:      %.10g x %.10g", gt[1], gt[5]);
        if (gt[2] != 0 || gt[4] != 0) fprintf(out, " (rotated: %g, %g)", gt[2], gt[4]);
        if (units[0] && strcmp(kind, "projected") != 0)
            fprintf(out, " %s (about %.4g x %.4g m)", units,
                    json_number_value(json_array_get(px, 0)),
                    json_number_value(json_array_get(px, 1)));
        else if (units[0])
            fprintf(out, " %s", units);
        fputc('\n', out);
    } else {
        fprintf(out, "pixel:      no geotransform (pixel coordinates)\n");
    }
    const char *layout = tw_info_get_str(f, "layout");
    const char *compression = tw_info_get_str(f, "compression");
    if (layout[0] || compression[0])
        fprintf(out, "layout:     %s%s%s\n", layout, layout[0] && compression[0] ? ", " : "",
                compression);
    if (tw_info_get_bool(f, "usable"))
        fprintf(out, "usable:     yes\n");
    else
        fprintf(out, "usable:     no: %s\n", tw_info_get_str(f, "problem"));
    size_t i;
    json_t *b;
    json_array_foreach(json_object_get(f, "bands"), i, b)
    {
        json_t *block = json_object_get(b, "block");
        char nodata[32], lo[32], hi[32];
        fprintf(out, "band %-5lld  %s, block %lld x %lld, nodata %s", tw_info_get_int(b, "band"),
                tw_info_get_str(b, "type"), (long long)json_integer_value(json_array_get(block, 0)),
                (long long)json_integer_value(json_array_get(block, 1)),
                tw_info_shown(b, "nodata", "%.17g", nodata, sizeof nodata) ? nodata : "none");
        fprintf(out, ", %s", tw_info_get_str(b, "color"));
        const char *desc = tw_info_get_str(b, "description");
        if (desc[0]) fprintf(out, ", \"%s\"", desc);
        long long n_ovr = tw_info_get_int(b, "overviews");
        if (n_ovr) fprintf(out, ", %lld overview%s", n_ovr, n_ovr == 1 ? "" : "s");
        if (tw_info_shown(b, "min", "%g", lo, sizeof lo) &&
            tw_info_shown(b, "max", "%g", hi, sizeof hi))
            fprintf(out, ", min %s max %s", lo, hi);
        fputc('\n', out);
    }
    json_t *r = json_object_get(f, "_reading");
    if (json_is_object(r))
        fprintf(out,
                "reading:    remote; all of it takes at least %lld range requests, %lld bytes\n",
                tw_info_get_int(r, "requests") + 2, tw_info_get_int(r, "bytes"));
    else if (r)
        fprintf(out, "reading:    remote; cost unknown (not a tiled GeoTIFF/COG)\n");
    if (json_object_get(f, "legend"))
        fprintf(out, "legend:     %s\n", tw_info_get_str(f, "legend"));
}

/* ---- a polygons product ---- */

static bool looks_like_vector(const char *path)
{
    const char *dot = strrchr(path, '.');
    return dot && (strcmp(dot, ".gpkg") == 0 || strcmp(dot, ".fgb") == 0);
}

static json_t *polygons_facts(const char *path, const tw_polygons_summary *s, bool *ok)
{
    json_t *f = json_object(), *extent = json_array(), *classes = json_array();
    tw_info_put(f, "type", json_string("polygons"), ok);
    tw_info_put(f, "path", tw_info_str(path), ok);
    tw_info_put(f, "driver", tw_info_str(s->driver), ok);
    tw_info_put(f, "layer", json_string("classes"), ok);
    tw_info_put(f, "features", json_integer(s->features), ok);
    tw_info_put(f, "crs", tw_info_str(s->crs), ok);
    tw_info_put(f, "area_unit", tw_info_str(s->area_unit), ok);
    for (int i = 0; i < 4; i++) tw_info_push(extent, tw_info_num(s->extent[i]), ok);
    tw_info_put(f, "extent", extent, ok);
    for (int i = 0; i < s->n_classes; i++) {
        json_t *c = json_object();
        tw_info_put(c, "class", json_integer(s->classes[i].cls), ok);
        tw_info_put(c, "name", tw_info_str(s->classes[i].name), ok);
        tw_info_put(c, "features", json_integer(s->classes[i].features), ok);
        tw_info_put(c, "cells", json_integer(s->classes[i].cells), ok);
        tw_info_put(c, "area", tw_info_num(s->classes[i].area), ok);
        tw_info_push(classes, c, ok);
    }
    tw_info_put(f, "classes", classes, ok);
    return f;
}

/* A polygons product (io/output/polygons.h): the layer, its features and each
 * class's regions, cells and area. *facts NULL: not one (a raster
 * GeoPackage, say). */
static tw_status info_polygons(const char *path, json_t **facts, tw_error *err)
{
    tw_polygons_summary *s = tw_calloc(TW_MEM_OTHER, 1, sizeof *s);
    if (!s) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    tw_status st = tw_polygons_summarize(path, s, err);
    if (st == TW_OK && s->found) {
        bool ok = true;
        *facts = polygons_facts(path, s, &ok);
        if (!ok) st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    tw_free(s);
    return st;
}

static void polygons_text(const json_t *f, FILE *out)
{
    json_t *classes = json_object_get(f, "classes"), *extent = json_object_get(f, "extent");
    json_t *c;
    size_t i;
    double total = 0;
    json_array_foreach(classes, i, c) total += tw_info_get_num(c, "area");
    const char *crs = tw_info_get_str(f, "crs"), *unit = tw_info_get_str(f, "area_unit");
    fprintf(out, "polygons:   %s (%s)\n", tw_info_get_str(f, "path"), tw_info_get_str(f, "driver"));
    fprintf(out, "layer:      classes, %lld features, CRS %s\n", tw_info_get_int(f, "features"),
            crs[0] ? crs : "none");
    fprintf(
        out, "extent:     %.6f, %.6f - %.6f, %.6f\n", json_number_value(json_array_get(extent, 0)),
        json_number_value(json_array_get(extent, 2)), json_number_value(json_array_get(extent, 1)),
        json_number_value(json_array_get(extent, 3)));
    fprintf(out, "area unit:  %s\n", unit[0] ? unit : "unknown");
    fprintf(out, "classes:\n");
    json_array_foreach(classes, i, c)
    {
        double area = tw_info_get_num(c, "area");
        fprintf(out, "  %3lld %-20s %8lld features %12lld cells %18.3f (%5.1f%%)\n",
                tw_info_get_int(c, "class"), tw_info_get_str(c, "name"),
                tw_info_get_int(c, "features"), tw_info_get_int(c, "cells"), area,
                total > 0 ? 100.0 * area / total : 0.0);
    }
}

/* ---- one file ---- */

/* The facts about path (*facts the caller's) and the text renderer of their
 * kind. */
static tw_status gather(const char *path, bool json, bool tiff_direct, json_t **facts,
                        void (**text)(const json_t *, FILE *), tw_error *err)
{
    *facts = NULL;
    if (tw_info_is_stac(path)) {
        *text = tw_info_stac_text;
        return tw_info_stac_facts(path, facts, err);
    }
    if (looks_like_vector(path)) {
        *text = polygons_text;
        tw_status st = info_polygons(path, facts, err);
        if (st != TW_OK || *facts) return st;
    }
    if (looks_like_model(path)) {
        *text = model_text;
        return info_model(path, facts, err);
    }
    *text = raster_text;
    return info_raster(path, !json, tiff_direct, facts, err);
}

tw_status tw_info_write(const char *path, bool json, bool tiff_direct, FILE *out, tw_error *err)
{
    /* GDAL opens /vsicurl/, https://, s3:// and other virtual paths that
     * fopen does not. */
    if (strncmp(path, "/vsi", 4) != 0 && !tw_url_is_remote(path)) {
        /* a FIFO would block the open until a writer came; GDAL opens
         * some directories as rasters */
        tw_status rst = tw_path_check_regular(path, "file", true, TW_ERR_INPUT, err);
        if (rst != TW_OK) return rst;
        FILE *f = fopen(path, "rb");
        if (!f) return tw_error_set(err, TW_ERR_INPUT, "%s: cannot open", path);
        fclose(f);
    }
    json_t *facts = NULL;
    void (*text)(const json_t *, FILE *) = NULL;
    /* A remote input: GDAL's HTTP settings of a run with the default
     * input.* keys (url.h), input.timeout above all: a silent server hung
     * info before. GDAL's own retry options (environment) are kept. */
    tw_url_saved *net_saved = NULL;
    if (tw_url_is_remote(path)) {
        tw_url_settings net = tw_url_gdal_settings();
        tw_url_settings_apply(&net, &net_saved);
    }
    tw_status st = gather(path, json, tiff_direct, &facts, &text, err);
    tw_url_settings_restore(net_saved);
    if (st != TW_OK) {
        json_decref(facts); /* what was built before memory ran out */
        return st;
    }
    if (json) {
        tw_json j = tw_json_file(out);
        write_json(&j, NULL, NULL, facts);
        fputc('\n', out);
    } else {
        text(facts, out);
    }
    json_decref(facts);
    return TW_OK;
}
