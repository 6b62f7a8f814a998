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
#include "io/url.h"
#include "pipeline/run.h"

/* A tiny JSON emitter into a fixed buffer: no allocation, truncates safely. */
typedef struct jbuf {
    char *buf;
    size_t size, len;
    int depth;
    bool need_comma;
} jbuf;

static void jraw(jbuf *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jraw(jbuf *j, const char *fmt, ...)
{
    if (j->len >= j->size) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(j->buf + j->len, j->size - j->len, fmt, ap);
    va_end(ap);
    if (n > 0) j->len += (size_t)n;
    if (j->len >= j->size) j->len = j->size - 1;
}

static void jsep(jbuf *j)
{
    if (j->need_comma) jraw(j, ",");
    j->need_comma = true;
}

static void jstr_raw(jbuf *j, const char *s)
{
    jraw(j, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            jraw(j, "\\%c", *p);
        else if (*p < 0x20)
            jraw(j, "\\u%04x", *p);
        else
            jraw(j, "%c", *p);
    }
    jraw(j, "\"");
}

static void jkey(jbuf *j, const char *k)
{
    jsep(j);
    jstr_raw(j, k);
    jraw(j, ":");
    j->need_comma = false;
}

static void jopen(jbuf *j, const char *key, char c)
{
    if (key)
        jkey(j, key);
    else
        jsep(j);
    jraw(j, "%c", c);
    j->need_comma = false;
}

static void jclose(jbuf *j, char c)
{
    jraw(j, "%c", c);
    j->need_comma = true;
}

static void jstr(jbuf *j, const char *key, const char *v)
{
    if (key)
        jkey(j, key);
    else
        jsep(j);
    jstr_raw(j, v);
    j->need_comma = true;
}

static void jnum(jbuf *j, const char *key, double v)
{
    if (key)
        jkey(j, key);
    else
        jsep(j);
    if (isfinite(v))
        jraw(j, "%.10g", v);
    else
        jraw(j, "null");
    j->need_comma = true;
}

static void jint(jbuf *j, const char *key, long long v)
{
    if (key)
        jkey(j, key);
    else
        jsep(j);
    jraw(j, "%lld", v);
    j->need_comma = true;
}

static const char *edge_name(tw_edge_mode e)
{
    return e == TW_EDGE_SHIFT ? "shift" : e == TW_EDGE_SKIP ? "skip" : "pad";
}

static void config_object(jbuf *j, const tw_run_params *p, const tw_resolved *m)
{
    jopen(j, "input", '{');
    jopen(j, "path", '[');
    for (int i = 0; i < p->input.n_paths; i++) {
        char shown[TW_URL_SHOWN_MAX]; /* no credentials in run.json or TILEWISE_RUN */
        tw_url_redact(p->input.paths[i], shown, sizeof shown);
        jstr(j, NULL, shown);
    }
    jclose(j, ']');
    if (p->input.n_assets > 0) {
        jopen(j, "assets", '[');
        for (int i = 0; i < p->input.n_assets; i++) jstr(j, NULL, p->input.assets[i]);
        jclose(j, ']');
    }
    jint(j, "retries", p->input.retries);
    jnum(j, "retry_delay", p->input.retry_delay);
    jopen(j, "bands", '[');
    for (int i = 0; i < m->n_bands; i++) jint(j, NULL, m->bands[i]);
    jclose(j, ']');
    jnum(j, "scale", m->scale);
    if (p->input.nodata_auto)
        jstr(j, "nodata", "auto");
    else
        jnum(j, "nodata", p->input.nodata);
    jstr(j, "on_error", p->input.on_error == TW_ON_ERROR_SKIP ? "skip" : "fail");
    jclose(j, '}');

    jopen(j, "model", '{');
    jstr(j, "weights", p->model.weights);
    jstr(j, "sha256", m->model_sha256);
    jstr(j, "arch", m->arch);
    jopen(j, "mean", '[');
    for (int i = 0; i < m->n_norm; i++) jnum(j, NULL, m->mean[i]);
    jclose(j, ']');
    jopen(j, "std", '[');
    for (int i = 0; i < m->n_norm; i++) jnum(j, NULL, m->std[i]);
    jclose(j, ']');
    jopen(j, "classes", '[');
    for (int i = 0; i < m->n_classes; i++) jstr(j, NULL, m->classes[i]);
    jclose(j, ']');
    jclose(j, '}');

    jopen(j, "tiling", '{');
    jint(j, "tile", m->tile);
    jint(j, "stride", m->stride);
    if (p->tiling.batch > 0)
        jint(j, "batch", p->tiling.batch);
    else
        jstr(j, "batch", "auto");
    jstr(j, "edge", edge_name(p->tiling.edge));
    jnum(j, "max_nodata_fraction", p->tiling.max_nodata_fraction);
    jclose(j, '}');

    jopen(j, "runtime", '{');
    jstr(j, "device", p->runtime.device);
    jstr(j, "precision", tw_precision_name(p->runtime.precision));
    jint(j, "memory", (long long)p->runtime.memory);
    jint(j, "threads", p->runtime.threads);
    jclose(j, '}');

    jopen(j, "output", '{');
    jstr(j, "dir", p->output.dir);
    jopen(j, "products", '[');
    static const struct {
        unsigned bit;
        const char *name;
    } prods[] = {{TW_PRODUCT_CLASS, "class"},     {TW_PRODUCT_PROB, "prob"},
                 {TW_PRODUCT_CONF, "confidence"}, {TW_PRODUCT_EMB, "embeddings"},
                 {TW_PRODUCT_TILES, "tiles"},     {TW_PRODUCT_TILES_GPKG, "tiles_gpkg"}};
    for (size_t i = 0; i < sizeof prods / sizeof prods[0]; i++)
        if (p->output.products & prods[i].bit) jstr(j, NULL, prods[i].name);
    jclose(j, ']');
    jstr(j, "prob_type", p->output.prob_type == TW_PROB_UINT8 ? "uint8" : "float32");
    jstr(j, "format", p->output.format == TW_FORMAT_COG ? "COG" : "GTiff");
    jopen(j, "creation_options", '[');
    for (int i = 0; i < p->output.n_creation_options; i++)
        jstr(j, NULL, p->output.creation_options[i]);
    jclose(j, ']');
    jclose(j, '}');
}

size_t tw_report_config_json(const tw_run_params *p, const tw_resolved *m, char *buf, size_t size)
{
    jbuf j = {.buf = buf, .size = size};
    buf[0] = '\0';
    jopen(&j, NULL, '{');
    jstr(&j, "tilewise_version", TW_VERSION);
    /* GDAL decides overviews, compression and CRS output: part of what
     * makes a product reproducible. */
    jstr(&j, "gdal_version", GDALVersionInfo("RELEASE_NAME"));
    config_object(&j, p, m);
    jclose(&j, '}');
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
    jbuf j = {.buf = buf, .size = size};
    buf[0] = '\0';
    jopen(&j, NULL, '{');
    jstr(&j, "status", status == TW_OK ? "ok" : tw_status_name(status));
    jint(&j, "exit_code", tw_status_exit_code(status));
    if (message && *message) jstr(&j, "message", message);
    jopen(&j, "versions", '{');
    jstr(&j, "tilewise", TW_VERSION);
    jstr(&j, "gdal", GDALVersionInfo("RELEASE_NAME"));
    char tiffv[32];
    jstr(&j, "libtiff", tw_tiff_version(tiffv, sizeof tiffv));
    jclose(&j, '}');
    jstr(&j, "workflow", p->workflow_path);
    if (p->shard_count > 1) {
        jopen(&j, "shard", '{');
        jint(&j, "index", p->shard_index + 1);
        jint(&j, "count", p->shard_count);
        jclose(&j, '}');
    }
    if (r) {
        jopen(&j, "config", '{');
        config_object(&j, p, &r->model);
        jclose(&j, '}');
        jstr(&j, "backend", r->backend);
        jnum(&j, "seconds", r->seconds);
        jint(&j, "tiles_classified", r->tiles_classified);
        jnum(&j, "tiles_per_s", r->seconds > 0 ? r->tiles_classified / r->seconds : 0);
        jint(&j, "peak_rss_bytes", (long long)r->peak_rss);

        jopen(&j, "memory", '{');
        jint(&j, "budget", (long long)p->runtime.memory);
        jint(&j, "estimate", (long long)r->budget.estimate);
        jint(&j, "worst_case", (long long)r->budget.total);
        jint(&j, "batch", r->budget.batch);
        jint(&j, "slots", r->budget.n_slots);
        jint(&j, "slot_bytes", (long long)r->budget.slot_bytes);
        jint(&j, "readers", r->budget.readers);
        jint(&j, "read_strip_width", r->budget.read_strip_w);
        jopen(&j, "items", '{');
        jint(&j, "base", (long long)r->budget.base);
        jint(&j, "weights", (long long)r->budget.weights);
        jint(&j, "slots", (long long)r->budget.slots);
        jint(&j, "read", (long long)r->budget.read);
        jint(&j, "workspace", (long long)r->budget.workspace);
        jint(&j, "strip", (long long)r->budget.strip);
        jint(&j, "gdal_cache", (long long)r->budget.gdal_cache);
        jint(&j, "margin", (long long)r->budget.margin);
        jclose(&j, '}');
        jopen(&j, "allocator_peak", '{');
        for (int t = 0; t <= TW_MEM_TAG_COUNT; t++)
            jint(&j, tw_mem_tag_name((tw_mem_tag)t), (long long)tw_mem_peak((tw_mem_tag)t));
        jclose(&j, '}');
        jclose(&j, '}');

        jopen(&j, "backend_stats", '{');
        jnum(&j, "compute_s", r->backend_stats.compute_s);
        jnum(&j, "copy_in_s", r->backend_stats.copy_in_s);
        jnum(&j, "copy_out_s", r->backend_stats.copy_out_s);
        jnum(&j, "copy_hidden_s", r->backend_stats.copy_hidden_s);
        jint(&j, "device_peak_bytes", (long long)r->backend_stats.device_peak_bytes);
        jint(&j, "batch_halvings", r->backend_stats.batch_halvings);
        jstr(&j, "precision", tw_precision_name(r->backend_stats.precision));
        jint(&j, "winograd_convs", r->backend_stats.winograd_convs);
        jint(&j, "unfused_convs", r->backend_stats.unfused_convs);
        jstr(&j, "device", r->backend_stats.device);
        jstr(&j, "library", r->backend_stats.library);
        jstr(&j, "algorithms", r->backend_stats.algorithms);
        jclose(&j, '}');

        jopen(&j, "inputs", '[');
        for (int i = 0; i < r->n_inputs; i++) {
            const tw_input_result *in = &r->inputs[i];
            jopen(&j, NULL, '{');
            jstr(&j, "path", in->path);
            jint(&j, "width", in->width);
            jint(&j, "height", in->height);
            jint(&j, "grid_width", in->grid_w);
            jint(&j, "grid_height", in->grid_h);
            jint(&j, "tiles_total", in->tiles_total);
            jint(&j, "tiles_classified", in->tiles_classified);
            jint(&j, "tiles_nodata", in->tiles_nodata);
            jint(&j, "tiles_read_errors", in->tiles_read_errors);
            jnum(&j, "seconds", in->seconds);
            jnum(&j, "tiles_per_s", in->seconds > 0 ? in->tiles_classified / in->seconds : 0);
            jint(&j, "steady_state_allocs", (long long)in->steady_state_allocs);
            jint(&j, "rows_resumed", in->rows_resumed);
            jstr(&j, "reader", in->reader);
            jopen(&j, "stages", '{');
            for (int s = 0; s < TW_STAGE_COUNT; s++) {
                jopen(&j, stage_names[s], '{');
                jnum(&j, "busy_s", in->stage[s].busy_s);
                jnum(&j, "wait_s", in->stage[s].wait_s);
                jnum(&j, "cpu_s", in->stage[s].cpu_s);
                if (s == TW_STAGE_READ) {
                    /* busy_s and wait_s are sums over the reader workers */
                    jint(&j, "workers", in->read_workers);
                    jint(&j, "bytes", in->read_bytes);
                    /* a TIFF tile decoded by several readers counts once per reader */
                    jint(&j, "tiff_tiles_decoded", in->tiff_tiles_decoded);
                }
                jclose(&j, '}');
            }
            jclose(&j, '}');
            jopen(&j, "class_cells", '{');
            for (int c = 0; c < r->model.n_classes; c++) jint(&j, r->model.classes[c], in->hist[c]);
            jclose(&j, '}');
            jint(&j, "nodata_cells", in->nodata_cells);
            jopen(&j, "outputs", '[');
            for (int o = 0; o < in->n_outputs; o++) jstr(&j, NULL, in->outputs[o]);
            jclose(&j, ']');
            jclose(&j, '}');
        }
        jclose(&j, ']');
    }
    jclose(&j, '}');
    jraw(&j, "\n");

    tw_status st = tw_write_file_atomic(path, buf, j.len, err);
    tw_free(buf);
    return st;
}
