/* stac_run.c - output.stac in a run and a merge: see stac_run.h */
#include "pipeline/report/stac_run.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/datetime.h"
#include "io/url.h"
#include "core/alloc.h"

tw_status tw_stac_run_input(const tw_run_params *p, int i, const char *gdal_source,
                            const tw_stac *stac, tw_stac_input *out, tw_error *err)
{
    memset(out, 0, sizeof *out);
    char shown[TW_URL_SHOWN_MAX];
    tw_url_redact(p->input.paths[i], shown, sizeof shown);
    if (stac) snprintf(out->derived_from, sizeof out->derived_from, "%s", shown);
    const char *dt = stac ? tw_stac_datetime(stac) : "";
    char why[160] = "";
    if (dt[0] && tw_rfc3339_check(dt, why, sizeof why)) {
        snprintf(out->datetime, sizeof out->datetime, "%s", dt);
        snprintf(out->source, sizeof out->source, "STAC item");
        return TW_OK;
    }
    if (gdal_source && tw_stac_raster_datetime(gdal_source, out->datetime, sizeof out->datetime,
                                               out->source, sizeof out->source))
        return TW_OK;
    if (p->input.datetime[0]) {
        snprintf(out->datetime, sizeof out->datetime, "%s", p->input.datetime);
        snprintf(out->source, sizeof out->source, "input.datetime");
        return TW_OK;
    }
    /* the STAC item's own datetime, when it has one that is not RFC 3339 */
    char item_says[300];
    if (stac && dt[0])
        snprintf(item_says, sizeof item_says, "its STAC item's %s \"%.40s\" is not RFC 3339: %s",
                 tw_stac_datetime_key(stac), dt, why);
    else
        snprintf(item_says, sizeof item_says, "%s",
                 stac ? "its STAC item has no datetime" : "not a STAC item");
    return tw_error_set(err, TW_ERR_CONFIG,
                        "output.stac: %s: no acquisition time known (%s, no ACQUISITIONDATETIME "
                        "or TIFFTAG_DATETIME in its metadata); set input.datetime, e.g. "
                        "input.datetime: \"2021-06-01T10:30:00Z\"",
                        shown, item_says);
}

void tw_stac_run_collection_id(const char *out_dir, char *out, size_t size)
{
    char real[PATH_MAX];
    const char *d = realpath(out_dir, real) ? real : out_dir;
    const char *base = strrchr(d, '/');
    base = base && base[1] ? base + 1 : d;
    snprintf(out, size, "tilewise-%s", base);
}

tw_status tw_stac_run_forget(const tw_run_params *p, const char *stem, bool collection,
                             tw_error *err)
{
    return tw_stac_item_remove(p->output.dir, stem, collection, err);
}

static bool is_item(const char *path)
{
    size_t n = strlen(path);
    return n > 10 && strcmp(path + n - 10, ".stac.json") == 0;
}

tw_status tw_stac_run_item(const tw_run_params *p, const tw_resolved *m, const tw_raster_info *info,
                           const tw_stac_input *si, const char *collection_id, tw_input_result *res,
                           tw_error *err)
{
    /* the model: an asset only when its href survives publishing the
     * folder (inside it, or a URL); else described by name and SHA-256 */
    char href[TW_PATH_MAX * 2] = "", name[256];
    int64_t wsize = -1;
    struct stat sb;
    tw_stac_model_href(p->output.dir, p->model.weights, href, sizeof href);
    if (p->model.weights[0] && stat(p->model.weights, &sb) == 0) wsize = (int64_t)sb.st_size;
    const char *ext = strrchr(p->model.weights, '.');
    tw_url_stem(p->model.weights, name, sizeof name);
    bool named = p->input.n_assets == m->in_bands;
    tw_stac_model sm = {
        .name = name,
        .segmentation = m->segmentation,
        .arch = m->arch,
        .framework = ext && strcmp(ext, ".onnx") == 0 ? "ONNX" : "PyTorch",
        .weights_href = href,
        .weights_sha256 = m->model_sha256,
        .weights_size = wsize,
        .in_bands = m->in_bands,
        .bands = m->bands,
        .n_bands = m->n_bands,
        .band_names = named ? (const char(*)[TW_NAME_MAX])p->input.assets : NULL,
        .tile = m->tile,
        .scale = m->scale,
        .mean = m->mean,
        .std = m->std,
        .n_classes = m->n_classes,
        .classes = (const char(*)[TW_NAME_MAX])m->classes,
    };
    const char *files[sizeof res->outputs / sizeof res->outputs[0]];
    int n = 0;
    for (int i = 0; i < res->n_outputs; i++)
        if (!is_item(res->outputs[i])) files[n++] = res->outputs[i];
    char created[TW_STAC_DATETIME_MAX];
    time_t now = time(NULL);
    struct tm tm;
    strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    tw_stac_item_params ip = {
        .dir = p->output.dir,
        .id = res->stem,
        .datetime = si->datetime,
        .width = info->width,
        .height = info->height,
        .geotransform = info->geotransform,
        .crs_wkt = info->crs_wkt,
        .files = files,
        .n_files = n,
        .model = &sm,
        .derived_from = si->derived_from[0] ? si->derived_from : NULL,
        .collection = collection_id,
        .created = created,
    };
    /* a local input item: its href relative to this item */
    char rel[TW_PATH_MAX * 2];
    if (ip.derived_from && !tw_url_is_remote(ip.derived_from)) {
        tw_stac_relative_href(p->output.dir, ip.derived_from, rel, sizeof rel);
        ip.derived_from = rel;
    }
    tw_status st = tw_stac_item_write(&ip, err);
    if (st == TW_OK) st = tw_stac_items_add(p->output.dir, res->stem, err);
    int cap = (int)(sizeof res->outputs / sizeof res->outputs[0]);
    if (st == TW_OK && res->n_outputs < cap)
        tw_stac_item_path(p->output.dir, res->stem, res->outputs[res->n_outputs++],
                          sizeof res->outputs[0]);
    return st;
}

tw_status tw_stac_run_collection(const char *out_dir, const tw_resolved *m, const tw_run_result *r,
                                 tw_error *err)
{
    const char **ids = tw_calloc(TW_MEM_OTHER, (size_t)r->n_inputs + 1, sizeof *ids);
    if (!ids) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    int n = 0;
    for (int i = 0; i < r->n_inputs; i++)
        for (int o = 0; o < r->inputs[i].n_outputs; o++)
            if (is_item(r->inputs[i].outputs[o])) {
                ids[n++] = r->inputs[i].stem;
                break;
            }
    char id[300], desc[512];
    tw_stac_run_collection_id(out_dir, id, sizeof id);
    snprintf(desc, sizeof desc,
             "tilewise classifications of %d input%s with %s (%d classes), one item each", n,
             n == 1 ? "" : "s", m->arch, m->n_classes);
    tw_status st = tw_stac_collection_write(out_dir, id, desc, ids, n, err);
    tw_free(ids);
    return st;
}
