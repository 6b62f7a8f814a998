/* report.c - the run's result, run.json and the resolved-config JSON (see
 * report.h) */
#include <errno.h>
#include <gdal.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>

#include "io/input/tiff_direct.h"
#include "core/alloc.h"
#include "core/fileio.h"
#include "core/keys.h"
#include "pipeline/report/json.h"
#include "io/url.h"
#include "pipeline/report/report.h"

/* One key's value in run.json's "config" (and the products' TILEWISE_RUN),
 * from the resolved params r: JSON types where core/keys.h's text is a
 * word or a list. Every key of the table has its case (-Wswitch). */
static void config_value(tw_json *j, tw_key_id k, const tw_run_params *r, const tw_resolved *m)
{
    const char *key = tw_key_leaf(k);
    const tw_input_params *in = &r->input;
    switch (k) {
    case TW_KEY_INPUT_PATH:
        tw_json_open(j, key, '[');
        for (int i = 0; i < in->n_paths; i++) {
            char shown[TW_URL_SHOWN_MAX]; /* no credentials in run.json or TILEWISE_RUN */
            tw_url_redact(in->paths[i], shown, sizeof shown);
            tw_json_str(j, NULL, shown);
        }
        tw_json_close(j, ']');
        break;
    case TW_KEY_INPUT_BANDS:
        tw_json_open(j, key, '[');
        for (int i = 0; i < in->n_bands; i++) tw_json_int(j, NULL, in->bands[i]);
        tw_json_close(j, ']');
        break;
    case TW_KEY_INPUT_ASSETS:
        if (in->n_assets == 0) break;
        tw_json_open(j, key, '[');
        for (int i = 0; i < in->n_assets; i++) tw_json_str(j, NULL, in->assets[i]);
        tw_json_close(j, ']');
        break;
    case TW_KEY_INPUT_NODATA:
        if (in->nodata_auto)
            tw_json_str(j, key, "auto");
        else
            tw_json_num(j, key, in->nodata);
        break;
    case TW_KEY_INPUT_AOI:
        if (in->aoi[0]) tw_json_str(j, key, in->aoi);
        break;
    case TW_KEY_INPUT_DATETIME:
        if (in->datetime[0]) tw_json_str(j, key, in->datetime);
        break;
    case TW_KEY_OUTPUT_STAC: tw_json_bool(j, key, r->output.stac); break;
    case TW_KEY_MODEL_WEIGHTS:
        tw_json_str(j, key, r->model.weights);
        tw_json_str(j, "sha256", m->model_sha256);
        break;
    case TW_KEY_MODEL_MEAN:
    case TW_KEY_MODEL_STD:
        tw_json_open(j, key, '[');
        for (int i = 0; i < r->model.n_mean; i++)
            tw_json_num(j, NULL, k == TW_KEY_MODEL_MEAN ? r->model.mean[i] : r->model.std[i]);
        tw_json_close(j, ']');
        break;
    case TW_KEY_MODEL_CLASSES:
        tw_json_open(j, key, '[');
        for (int i = 0; i < r->model.n_classes; i++) tw_json_str(j, NULL, r->model.classes[i]);
        tw_json_close(j, ']');
        break;
    case TW_KEY_MODEL_COLORS:
    case TW_KEY_OUTPUT_PRODUCTS:
    case TW_KEY_OUTPUT_CREATION_OPTIONS:
        if (k == TW_KEY_MODEL_COLORS && r->model.n_colors == 0) break;
        tw_json_open(j, key, '[');
        if (k == TW_KEY_MODEL_COLORS)
            for (int i = 0; i < r->model.n_colors; i++) {
                char hex[8];
                snprintf(hex, sizeof hex, "#%02x%02x%02x", r->model.colors[i][0],
                         r->model.colors[i][1], r->model.colors[i][2]);
                tw_json_str(j, NULL, hex);
            }
        else if (k == TW_KEY_OUTPUT_PRODUCTS)
            for (int i = 0; i < TW_PRODUCT_COUNT; i++) {
                if (r->output.products & tw_products[i].bit)
                    tw_json_str(j, NULL, tw_products[i].word);
            }
        else
            for (int i = 0; i < r->output.n_creation_options; i++)
                tw_json_str(j, NULL, r->output.creation_options[i]);
        tw_json_close(j, ']');
        break;
    case TW_KEY_INPUT_SCALE:
    case TW_KEY_INPUT_RETRY_DELAY:
    case TW_KEY_INPUT_TIMEOUT:
    case TW_KEY_TILING_MAX_NODATA_FRACTION:
    case TW_KEY_OUTPUT_MIN_AREA:
    case TW_KEY_OUTPUT_SIMPLIFY:
        tw_json_num(j, key,
                    k == TW_KEY_INPUT_SCALE         ? in->scale
                    : k == TW_KEY_INPUT_RETRY_DELAY ? in->retry_delay
                    : k == TW_KEY_INPUT_TIMEOUT     ? in->timeout
                    : k == TW_KEY_OUTPUT_MIN_AREA   ? r->output.min_area
                    : k == TW_KEY_OUTPUT_SIMPLIFY   ? r->output.simplify
                                                    : r->tiling.max_nodata_fraction);
        break;
    case TW_KEY_INPUT_RETRIES:
    case TW_KEY_TILING_TILE:
    case TW_KEY_TILING_STRIDE:
    case TW_KEY_TILING_MARGIN:
    case TW_KEY_TILING_BATCH:
    case TW_KEY_RUNTIME_THREADS:
    case TW_KEY_RUNTIME_READERS:
    case TW_KEY_RUNTIME_MEMORY: {
        /* integers; "auto" where the key allows it and it was left so */
        long long v = k == TW_KEY_INPUT_RETRIES     ? in->retries
                      : k == TW_KEY_TILING_TILE     ? r->tiling.tile
                      : k == TW_KEY_TILING_STRIDE   ? r->tiling.stride
                      : k == TW_KEY_TILING_MARGIN   ? r->tiling.margin
                      : k == TW_KEY_TILING_BATCH    ? r->tiling.batch
                      : k == TW_KEY_RUNTIME_THREADS ? r->runtime.threads
                      : k == TW_KEY_RUNTIME_READERS ? r->runtime.readers
                                                    : (long long)r->runtime.memory;
        if (tw_keys[k].type == TW_KT_AUTO_INT && v == 0)
            tw_json_str(j, key, "auto");
        else
            tw_json_int(j, key, v);
        break;
    }
    case TW_KEY_INPUT_ON_ERROR:
    case TW_KEY_MODEL_ARCH:
    case TW_KEY_MODEL_STEM:
    case TW_KEY_TILING_EDGE:
    case TW_KEY_TILING_BLEND:
    case TW_KEY_RUNTIME_DEVICE:
    case TW_KEY_RUNTIME_PRECISION:
    case TW_KEY_OUTPUT_DIR:
    case TW_KEY_OUTPUT_NAME:
    case TW_KEY_OUTPUT_PROB_TYPE:
    case TW_KEY_OUTPUT_EMBEDDING_TYPE:
    case TW_KEY_OUTPUT_RESOLUTION:
    case TW_KEY_OUTPUT_FORMAT:
    case TW_KEY_OUTPUT_VECTOR_FORMAT: {
        /* words and paths: the table's own text, without YAML's quotes */
        const char *v = k == TW_KEY_MODEL_ARCH       ? r->model.arch
                        : k == TW_KEY_RUNTIME_DEVICE ? r->runtime.device
                        : k == TW_KEY_OUTPUT_DIR     ? r->output.dir
                        : k == TW_KEY_OUTPUT_NAME    ? r->output.name
                                                     : NULL;
        char word[32];
        if (!v) {
            tw_key_format(k, r, word, sizeof word);
            v = word;
        }
        tw_json_str(j, key, v);
        break;
    }
    case TW_KEY_COUNT: break;
    }
}

/* run.json's "config": one object per section, one member per key of the
 * table (core/keys.h) whose flags include `flags`, in its order, with the
 * values the run resolved. */
static void config_object(tw_json *j, const tw_run_params *r, const tw_resolved *m, unsigned flags)
{
    int section = -1;
    for (int k = 0; k < TW_KEY_COUNT; k++) {
        if ((tw_keys[k].flags & flags) != flags) continue;
        int s = tw_key_section((tw_key_id)k);
        if (s != section) {
            if (section >= 0) tw_json_close(j, '}');
            tw_json_open(j, tw_key_sections[s], '{');
            section = s;
        }
        config_value(j, (tw_key_id)k, r, m);
    }
    if (section >= 0) tw_json_close(j, '}');
}

size_t tw_report_config_json(const tw_run_params *p, const tw_resolved *m, char *buf, size_t size)
{
    tw_run_params *r = tw_alloc(TW_MEM_OTHER, sizeof *r);
    if (!r) return size; /* reads as cut: the caller refuses */
    tw_run_params_resolved(p, m, r);
    tw_json j = tw_json_buffer(buf, size);
    tw_json_open(&j, NULL, '{');
    tw_json_str(&j, "tilewise_version", TW_VERSION);
    /* GDAL decides overviews, compression and CRS output: part of what
     * makes a product reproducible. */
    tw_json_str(&j, "gdal_version", GDALVersionInfo("RELEASE_NAME"));
    /* The products' metadata: what made their bytes (TW_KEY_BYTES), not how
     * (threads, memory, readers, device): products written with another
     * thread count or reader count are the same bytes (shards, reruns). */
    config_object(&j, r, m, TW_KEY_BYTES);
    tw_json_close(&j, '}');
    tw_free(r);
    return j.cut ? size : j.len;
}

static const char *stage_names[TW_STAGE_COUNT] = {"read", "normalize", "infer", "write"};

tw_status tw_report_render(const tw_run_params *p, const tw_run_result *r, tw_status status,
                           const char *message, char **json, size_t *len, tw_error *err)
{
    *json = NULL;
    *len = 0;
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
    /* which it was: a plain run inside an array task is a whole run */
    tw_json_str(&j, "sharding", p->shard_from[0] ? p->shard_from : "none");
    tw_run_params *rp = r ? tw_alloc(TW_MEM_OTHER, sizeof *rp) : NULL;
    if (r && !rp) {
        tw_free(buf);
        return tw_error_set(err, TW_ERR_NOMEM, "cannot allocate the run report");
    }
    if (r) {
        tw_run_params_resolved(p, &r->model, rp);
        tw_json_open(&j, "config", '{');
        config_object(&j, rp, &r->model, 0);
        tw_json_close(&j, '}');
        tw_json_open(&j, "warnings", '[');
        for (int i = 0; i < r->advice.n; i++) {
            tw_json_open(&j, NULL, '{');
            tw_json_str(&j, "code", r->advice.items[i].code);
            tw_json_str(&j, "message", r->advice.items[i].text);
            tw_json_close(&j, '}');
        }
        tw_json_close(&j, ']');
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
        if (r->budget.polygons) tw_json_int(&j, "polygons", (long long)r->budget.polygons);
        tw_json_int(&j, "gdal_cache", (long long)r->budget.gdal_cache);
        tw_json_int(&j, "margin", (long long)r->budget.margin);
        tw_json_close(&j, '}');
        tw_json_open(&j, "allocator_peak", '{');
        for (int t = 0; t <= TW_MEM_TAG_COUNT; t++)
            tw_json_int(&j, tw_mem_tag_name((tw_mem_tag)t), (long long)r->mem_peak[t]);
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
            /* a headless backbone has no classes (its stand-in head's one is not shown) */
            for (int c = 0; !r->model.headless && c < r->model.n_classes; c++)
                tw_json_int(&j, r->model.classes[c], in->hist[c]);
            tw_json_close(&j, '}');
            tw_json_int(&j, "nodata_cells", in->nodata_cells);
            if (p->output.resolution == TW_RESOLUTION_INPUT)
                tw_json_int(&j, "valid_pixels_unclassified", in->valid_unclassified);
            tw_json_open(&j, "outputs", '[');
            for (int o = 0; o < in->n_outputs; o++) tw_json_str(&j, NULL, in->outputs[o]);
            tw_json_close(&j, ']');
            if (in->n_stale > 0) {
                /* product files of this name that this run did not write */
                tw_json_open(&j, "stale", '[');
                for (int o = 0; o < in->n_stale; o++) tw_json_str(&j, NULL, in->stale[o]);
                tw_json_close(&j, ']');
            }
            tw_json_close(&j, '}');
        }
        tw_json_close(&j, ']');
    }
    tw_json_close(&j, '}');
    tw_json_raw(&j, "\n");

    tw_free(rp);
    if (j.cut) {
        tw_free(buf);
        return tw_error_set(err, TW_ERR_INTERNAL, "the run report was cut short");
    }
    *json = buf;
    *len = j.len;
    return TW_OK;
}

tw_status tw_report_write(const char *path, const tw_run_params *p, const tw_run_result *r,
                          tw_status status, const char *message, tw_error *err)
{
    char *json;
    size_t len;
    tw_status st = tw_report_render(p, r, status, message, &json, &len, err);
    if (st == TW_OK) st = tw_write_file_atomic(path, json, len, err);
    tw_free(json);
    return st;
}

tw_status tw_report_log_attempt(const char *out_dir, const tw_run_params *p, const tw_run_result *r,
                                tw_status status, const char *message, const char *report_path,
                                tw_error *err)
{
    char dir[TW_PATH_MAX + 32], path[TW_PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s/.tilewise", out_dir);
    snprintf(path, sizeof path, "%s/attempts.jsonl", dir);
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return tw_error_set(err, TW_ERR_OUTPUT, "%s: %s", dir, strerror(errno));
    char line[24576], when[32]; /* fits any message and two paths, escaped */
    time_t now = time(NULL);
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    tw_json j = tw_json_buffer(line, sizeof line - 1);
    tw_json_open(&j, NULL, '{');
    tw_json_str(&j, "time", when);
    tw_json_str(&j, "status", status == TW_OK ? "ok" : tw_status_name(status));
    tw_json_int(&j, "exit_code",
                status == TW_OK && r && r->inputs_skipped > 0 ? TW_EXIT_SKIPPED
                                                              : tw_status_exit_code(status));
    if (message && *message) tw_json_str(&j, "message", message);
    tw_json_str(&j, "workflow", p->workflow_path);
    if (p->shard_count > 1) {
        char shard[32];
        snprintf(shard, sizeof shard, "%d/%d", p->shard_index + 1, p->shard_count);
        tw_json_str(&j, "shard", shard);
    }
    tw_json_int(&j, "tiles_classified", r ? r->tiles_classified : 0);
    tw_json_num(&j, "seconds", r ? r->seconds : 0);
    tw_json_str(&j, "report", report_path);
    tw_json_close(&j, '}');
    size_t n = strlen(line); /* a cut line is still one line: the message is what was cut */
    line[n++] = '\n';
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (fd < 0) return tw_error_set(err, TW_ERR_OUTPUT, "%s: %s", path, strerror(errno));
    ssize_t w = write(fd, line, n);
    int e = errno;
    close(fd);
    if (w != (ssize_t)n)
        return tw_error_set(err, TW_ERR_OUTPUT, "%s: %s", path,
                            w < 0 ? strerror(e) : "short write");
    return TW_OK;
}

void tw_run_result_destroy(tw_run_result *r)
{
    if (!r) return;
    tw_free(r->inputs);
    tw_free(r);
}
