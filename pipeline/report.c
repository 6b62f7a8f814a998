/* report.c - run.json and the resolved-config JSON (see run.h) */
#include <errno.h>
#include <gdal.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "io/tiff_direct.h"
#include "core/alloc.h"
#include "core/fileio.h"
#include "pipeline/json.h"
#include "io/url.h"
#include "pipeline/run.h"

static const char *edge_name(tw_edge_mode e)
{
    return (unsigned)e <= TW_EDGE_SKIP ? tw_edge_names[e] : "pad";
}

static void config_object(tw_json *j, const tw_run_params *p, const tw_resolved *m)
{
    tw_json_open(j, "input", '{');
    tw_json_open(j, "path", '[');
    for (int i = 0; i < p->input.n_paths; i++) {
        char shown[TW_URL_SHOWN_MAX]; /* no credentials in run.json or TILEWISE_RUN */
        tw_url_redact(p->input.paths[i], shown, sizeof shown);
        tw_json_str(j, NULL, shown);
    }
    tw_json_close(j, ']');
    if (p->input.n_assets > 0) {
        tw_json_open(j, "assets", '[');
        for (int i = 0; i < p->input.n_assets; i++) tw_json_str(j, NULL, p->input.assets[i]);
        tw_json_close(j, ']');
    }
    tw_json_int(j, "retries", p->input.retries);
    tw_json_num(j, "retry_delay", p->input.retry_delay);
    tw_json_open(j, "bands", '[');
    for (int i = 0; i < m->n_bands; i++) tw_json_int(j, NULL, m->bands[i]);
    tw_json_close(j, ']');
    tw_json_num(j, "scale", m->scale);
    if (p->input.nodata_auto)
        tw_json_str(j, "nodata", "auto");
    else
        tw_json_num(j, "nodata", p->input.nodata);
    tw_json_str(j, "on_error", p->input.on_error == TW_ON_ERROR_SKIP ? "skip" : "fail");
    if (p->input.aoi[0]) tw_json_str(j, "aoi", p->input.aoi);
    tw_json_close(j, '}');

    tw_json_open(j, "model", '{');
    tw_json_str(j, "weights", p->model.weights);
    tw_json_str(j, "sha256", m->model_sha256);
    tw_json_str(j, "arch", m->arch);
    tw_json_open(j, "mean", '[');
    for (int i = 0; i < m->n_norm; i++) tw_json_num(j, NULL, m->mean[i]);
    tw_json_close(j, ']');
    tw_json_open(j, "std", '[');
    for (int i = 0; i < m->n_norm; i++) tw_json_num(j, NULL, m->std[i]);
    tw_json_close(j, ']');
    tw_json_open(j, "classes", '[');
    for (int i = 0; i < m->n_classes; i++) tw_json_str(j, NULL, m->classes[i]);
    tw_json_close(j, ']');
    if (p->model.n_colors > 0) {
        tw_json_open(j, "colors", '[');
        for (int i = 0; i < p->model.n_colors; i++) {
            char hex[8];
            snprintf(hex, sizeof hex, "#%02x%02x%02x", p->model.colors[i][0], p->model.colors[i][1],
                     p->model.colors[i][2]);
            tw_json_str(j, NULL, hex);
        }
        tw_json_close(j, ']');
    }
    tw_json_close(j, '}');

    tw_json_open(j, "tiling", '{');
    tw_json_int(j, "tile", m->tile);
    tw_json_int(j, "stride", m->stride);
    if (p->tiling.batch > 0)
        tw_json_int(j, "batch", p->tiling.batch);
    else
        tw_json_str(j, "batch", "auto");
    tw_json_str(j, "edge", edge_name(p->tiling.edge));
    tw_json_num(j, "max_nodata_fraction", p->tiling.max_nodata_fraction);
    tw_json_close(j, '}');

    tw_json_open(j, "runtime", '{');
    tw_json_str(j, "device", p->runtime.device);
    tw_json_str(j, "precision", tw_precision_name(p->runtime.precision));
    tw_json_int(j, "memory", (long long)p->runtime.memory);
    tw_json_int(j, "threads", p->runtime.threads);
    tw_json_close(j, '}');

    tw_json_open(j, "output", '{');
    tw_json_str(j, "dir", p->output.dir);
    tw_json_open(j, "products", '[');
    for (int i = 0; i < TW_PRODUCT_COUNT; i++)
        if (p->output.products & tw_product_names[i].bit)
            tw_json_str(j, NULL, tw_product_names[i].name);
    tw_json_close(j, ']');
    tw_json_str(j, "prob_type", p->output.prob_type == TW_PROB_UINT8 ? "uint8" : "float32");
    tw_json_str(j, "resolution", p->output.resolution == TW_RESOLUTION_INPUT ? "input" : "cells");
    tw_json_str(j, "format", p->output.format == TW_FORMAT_COG ? "COG" : "GTiff");
    tw_json_open(j, "creation_options", '[');
    for (int i = 0; i < p->output.n_creation_options; i++)
        tw_json_str(j, NULL, p->output.creation_options[i]);
    tw_json_close(j, ']');
    tw_json_close(j, '}');
}

size_t tw_report_config_json(const tw_run_params *p, const tw_resolved *m, char *buf, size_t size)
{
    tw_json j = tw_json_buffer(buf, size);
    tw_json_open(&j, NULL, '{');
    tw_json_str(&j, "tilewise_version", TW_VERSION);
    /* GDAL decides overviews, compression and CRS output: part of what
     * makes a product reproducible. */
    tw_json_str(&j, "gdal_version", GDALVersionInfo("RELEASE_NAME"));
    config_object(&j, p, m);
    tw_json_close(&j, '}');
    return j.len;
}

static const char *stage_names[TW_STAGE_COUNT] = {"read", "normalize", "infer", "write"};

tw_status tw_report_write(const char *path, const tw_run_params *p, const tw_run_result *r,
                          tw_status status, const char *message, tw_error *err)
{
    size_t size = (size_t)1 << 20;
    if (r) size += (size_t)r->n_inputs * ((size_t)r->model.n_classes * 48 + 4096);
    char *buf = tw_alloc(TW_MEM_OTHER, size);
    if (!buf) return tw_error_set(err, TW_ERR_NOMEM, "cannot allocate the run report");
    tw_json j = tw_json_buffer(buf, size);
    tw_json_open(&j, NULL, '{');
    tw_json_str(&j, "status", status == TW_OK ? "ok" : tw_status_name(status));
    tw_json_int(&j, "exit_code",
                status == TW_OK && r && r->inputs_skipped > 0 ? TW_EXIT_SKIPPED
                                                              : tw_status_exit_code(status));
    if (message && *message) tw_json_str(&j, "message", message);
    tw_json_open(&j, "versions", '{');
    tw_json_str(&j, "tilewise", TW_VERSION);
    tw_json_str(&j, "gdal", GDALVersionInfo("RELEASE_NAME"));
    char tiffv[32];
    tw_json_str(&j, "libtiff", tw_tiff_version(tiffv, sizeof tiffv));
    tw_json_close(&j, '}');
    tw_json_str(&j, "workflow", p->workflow_path);
    if (p->shard_count > 1) {
        tw_json_open(&j, "shard", '{');
        tw_json_int(&j, "index", p->shard_index + 1);
        tw_json_int(&j, "count", p->shard_count);
        tw_json_close(&j, '}');
    }
    if (r) {
        tw_json_open(&j, "config", '{');
        config_object(&j, p, &r->model);
        tw_json_close(&j, '}');
        tw_json_str(&j, "backend", r->backend);
        tw_json_num(&j, "seconds", r->seconds);
        tw_json_int(&j, "tiles_classified", r->tiles_classified);
        tw_json_int(&j, "inputs_skipped", r->inputs_skipped);
        tw_json_num(&j, "tiles_per_s", r->seconds > 0 ? r->tiles_classified / r->seconds : 0);
        tw_json_int(&j, "peak_rss_bytes", (long long)r->peak_rss);

        tw_json_open(&j, "memory", '{');
        tw_json_int(&j, "budget", (long long)p->runtime.memory);
        tw_json_int(&j, "estimate", (long long)r->budget.estimate);
        tw_json_int(&j, "worst_case", (long long)r->budget.total);
        tw_json_int(&j, "batch", r->budget.batch);
        tw_json_int(&j, "slots", r->budget.n_slots);
        tw_json_int(&j, "slot_bytes", (long long)r->budget.slot_bytes);
        tw_json_int(&j, "readers", r->budget.readers);
        tw_json_int(&j, "read_strip_width", r->budget.read_strip_w);
        tw_json_open(&j, "items", '{');
        tw_json_int(&j, "base", (long long)r->budget.base);
        tw_json_int(&j, "weights", (long long)r->budget.weights);
        tw_json_int(&j, "slots", (long long)r->budget.slots);
        tw_json_int(&j, "read", (long long)r->budget.read);
        tw_json_int(&j, "workspace", (long long)r->budget.workspace);
        tw_json_int(&j, "strip", (long long)r->budget.strip);
        tw_json_int(&j, "gdal_cache", (long long)r->budget.gdal_cache);
        tw_json_int(&j, "margin", (long long)r->budget.margin);
        tw_json_close(&j, '}');
        tw_json_open(&j, "allocator_peak", '{');
        for (int t = 0; t <= TW_MEM_TAG_COUNT; t++)
            tw_json_int(&j, tw_mem_tag_name((tw_mem_tag)t), (long long)tw_mem_peak((tw_mem_tag)t));
        tw_json_close(&j, '}');
        tw_json_close(&j, '}');

        tw_json_open(&j, "backend_stats", '{');
        tw_json_num(&j, "compute_s", r->backend_stats.compute_s);
        tw_json_num(&j, "copy_in_s", r->backend_stats.copy_in_s);
        tw_json_num(&j, "copy_out_s", r->backend_stats.copy_out_s);
        tw_json_num(&j, "copy_hidden_s", r->backend_stats.copy_hidden_s);
        tw_json_int(&j, "device_peak_bytes", (long long)r->backend_stats.device_peak_bytes);
        tw_json_int(&j, "batch_halvings", r->backend_stats.batch_halvings);
        tw_json_str(&j, "precision", tw_precision_name(r->backend_stats.precision));
        tw_json_int(&j, "winograd_convs", r->backend_stats.winograd_convs);
        tw_json_int(&j, "lowerings_refused", r->backend_stats.lowerings_refused);
        tw_json_int(&j, "unfused_convs", r->backend_stats.unfused_convs);
        if (r->backend_stats.int8_weight_bits > 0)
            tw_json_int(&j, "int8_weight_bits", r->backend_stats.int8_weight_bits);
        tw_json_str(&j, "device", r->backend_stats.device);
        tw_json_str(&j, "library", r->backend_stats.library);
        tw_json_str(&j, "algorithms", r->backend_stats.algorithms);
        tw_json_close(&j, '}');

        tw_json_open(&j, "inputs", '[');
        for (int i = 0; i < r->n_inputs; i++) {
            const tw_input_result *in = &r->inputs[i];
            tw_json_open(&j, NULL, '{');
            tw_json_str(&j, "path", in->path);
            if (in->skipped[0]) tw_json_str(&j, "skipped", in->skipped);
            tw_json_int(&j, "width", in->width);
            tw_json_int(&j, "height", in->height);
            tw_json_int(&j, "grid_width", in->grid_w);
            tw_json_int(&j, "grid_height", in->grid_h);
            tw_json_int(&j, "tiles_total", in->tiles_total);
            tw_json_int(&j, "tiles_classified", in->tiles_classified);
            tw_json_int(&j, "tiles_nodata", in->tiles_nodata);
            tw_json_int(&j, "tiles_read_errors", in->tiles_read_errors);
            if (p->input.aoi[0]) tw_json_int(&j, "tiles_outside_aoi", in->tiles_outside_aoi);
            tw_json_num(&j, "seconds", in->seconds);
            tw_json_num(&j, "tiles_per_s",
                        in->seconds > 0 ? in->tiles_classified / in->seconds : 0);
            tw_json_int(&j, "steady_state_allocs", (long long)in->steady_state_allocs);
            tw_json_int(&j, "rows_resumed", in->rows_resumed);
            tw_json_str(&j, "reader", in->reader);
            tw_json_open(&j, "stages", '{');
            for (int s = 0; s < TW_STAGE_COUNT; s++) {
                tw_json_open(&j, stage_names[s], '{');
                tw_json_num(&j, "busy_s", in->stage[s].busy_s);
                tw_json_num(&j, "wait_s", in->stage[s].wait_s);
                tw_json_num(&j, "cpu_s", in->stage[s].cpu_s);
                if (s == TW_STAGE_READ) {
                    /* busy_s and wait_s are sums over the reader workers */
                    tw_json_int(&j, "workers", in->read_workers);
                    tw_json_int(&j, "bytes", in->read_bytes);
                    /* a TIFF tile decoded by several readers counts once per reader */
                    tw_json_int(&j, "tiff_tiles_decoded", in->tiff_tiles_decoded);
                }
                tw_json_close(&j, '}');
            }
            tw_json_close(&j, '}');
            tw_json_open(&j, "class_cells", '{');
            for (int c = 0; c < r->model.n_classes; c++)
                tw_json_int(&j, r->model.classes[c], in->hist[c]);
            tw_json_close(&j, '}');
            tw_json_int(&j, "nodata_cells", in->nodata_cells);
            tw_json_open(&j, "outputs", '[');
            for (int o = 0; o < in->n_outputs; o++) tw_json_str(&j, NULL, in->outputs[o]);
            tw_json_close(&j, ']');
            tw_json_close(&j, '}');
        }
        tw_json_close(&j, ']');
    }
    tw_json_close(&j, '}');
    tw_json_raw(&j, "\n");

    tw_status st = tw_write_file_atomic(path, buf, j.len, err);
    tw_free(buf);
    return st;
}
