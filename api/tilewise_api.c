/* tilewise_api.c - the public C API (include/tilewise.h) over the internals.
 *
 * Runs go through the workflow parser (workflows/workflow.c) and tw_run
 * exactly as `tilewise run` does; models go through the model file reader,
 * tw_resolve_loaded (the same resolution of bands, scale, mean, std, classes
 * and tile as a run) and the backend registry, and tiles in memory through
 * tw_normalize (or the backend's own normalization when it wants raw pixels).
 */
#include "tilewise.h"

#include <math.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cpl_conv.h>

#include "io/model_file.h"
#include "model/backend.h"
#include "model/resnet.h"
#include "core/alloc.h"
#include "core/error.h"
#include "pipeline/normalize.h"
#include "pipeline/preflight.h"
#include "pipeline/run.h"
#include "api/info.h"
#include "api/validate.h"
#include "config/workflow.h"

/* The public values mirror the internal ones; keep them in step. */
_Static_assert(
    TILEWISE_OK == (int)TW_OK && TILEWISE_CANCELLED == (int)TW_CANCELLED &&
        TILEWISE_ERR_USAGE == (int)TW_ERR_USAGE && TILEWISE_ERR_CONFIG == (int)TW_ERR_CONFIG &&
        TILEWISE_ERR_INPUT == (int)TW_ERR_INPUT && TILEWISE_ERR_MODEL == (int)TW_ERR_MODEL &&
        TILEWISE_ERR_OUTPUT == (int)TW_ERR_OUTPUT && TILEWISE_ERR_NOMEM == (int)TW_ERR_NOMEM &&
        TILEWISE_ERR_DEVICE == (int)TW_ERR_DEVICE &&
        TILEWISE_ERR_INTERNAL == (int)TW_ERR_INTERNAL &&
        TILEWISE_ERR_REMOTE == (int)TW_ERR_REMOTE && TILEWISE_ERR_PARTS == (int)TW_ERR_PARTS &&
        TILEWISE_ERR_LOCKED == (int)TW_ERR_LOCKED,
    "tilewise_status and tw_status differ");
_Static_assert(TILEWISE_MESSAGE_MAX == TW_ERROR_MSG_MAX, "message sizes differ");

#define MAX_SETS 256

/* ---- status and errors ---- */

const char *tilewise_status_name(int status)
{
    return tw_status_name((tw_status)status);
}

int tilewise_exit_code(int status)
{
    return tw_status_exit_code((tw_status)status);
}

const char *tilewise_version(void)
{
    return TW_VERSION;
}

int tilewise_api_version(void)
{
    return TILEWISE_API_VERSION;
}

static const char *exit_class(int code)
{
    switch (code) {
    case TW_EXIT_OK: return "ok";
    case TW_EXIT_USAGE: return "usage";
    case TW_EXIT_INPUT: return "input";
    case TW_EXIT_RESOURCE: return "resource";
    case TW_EXIT_SKIPPED: return "skipped";
    case TW_EXIT_PARTS: return "parts";
    case TW_EXIT_LOCKED: return "locked";
    case TW_EXIT_INTERRUPTED: return "interrupted";
    default: return "internal";
    }
}

/* Copy an internal error into the caller's record; returns its status. */
static tilewise_status give(tilewise_error *out, tw_status st, const tw_error *e)
{
    if (out) {
        memset(out, 0, sizeof *out);
        out->status = st;
        out->exit_code = tw_status_exit_code(st);
        snprintf(out->exit_class, sizeof out->exit_class, "%s", exit_class(out->exit_code));
        if (st != TW_OK) snprintf(out->message, sizeof out->message, "%s", e->msg);
    }
    return (tilewise_status)st;
}

static tilewise_status give_new(tilewise_error *out, tw_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static tilewise_status give_new(tilewise_error *out, tw_status st, const char *fmt, ...)
{
    tw_error e;
    tw_error_init(&e);
    va_list ap;
    va_start(ap, fmt);
    char msg[TW_ERROR_MSG_MAX];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tw_error_set(&e, st, "%s", msg);
    return give(out, st, &e);
}

tilewise_status tilewise_config_set(const char *key, const char *value, tilewise_error *out)
{
    if (!key || !*key) return give_new(out, TW_ERR_USAGE, "tilewise_config_set: no key");
    CPLSetConfigOption(key, value);
    return give(out, TW_OK, NULL);
}

/* ---- a small JSON writer into a growing string ---- */

typedef struct sbuf {
    char *s;
    size_t len, cap;
    bool failed;
} sbuf;

static void sb_add(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sbuf *b, const char *fmt, ...)
{
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = true;
            return;
        }
        if (b->s && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->failed = true;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
}

static void sb_str(sbuf *b, const char *s)
{
    sb_add(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            sb_add(b, "\\%c", *p);
        else if (*p < 0x20)
            sb_add(b, "\\u%04x", *p);
        else
            sb_add(b, "%c", *p);
    }
    sb_add(b, "\"");
}

/* ---- runs ---- */

/* Files an input writes at most (tw_input_result.outputs). */
#define OUTPUTS_MAX                                                                                \
    ((int)(sizeof((tw_input_result *)0)->outputs / sizeof((tw_input_result *)0)->outputs[0]))

/* The sizes of the version 2 structs: callers compiled against a later
 * header pass larger ones, and the library reads or fills what it knows. */
#define OPTIONS_V2_SIZE (offsetof(tilewise_run_options, cuda_fail_alloc_above) + sizeof(uint64_t))
#define RUN_SUMMARY_V2_SIZE (offsetof(tilewise_run_summary, shard_count) + sizeof(int))
#define INPUT_SUMMARY_V2_SIZE (offsetof(tilewise_input_summary, outputs) + sizeof(void *))

struct tilewise_report {
    char *json;                      /* run.json's bytes; NULL: none */
    char path[TW_PATH_MAX + 64];     /* where run.json was written; "" */
    char run_json[TW_PATH_MAX + 64]; /* where it goes ("" for a merge) */
    char output_dir[TW_PATH_MAX];
    int status;
    int shard_index, shard_count;
    tw_run_result *r; /* NULL: the run kept none */
    const char *class_names[TW_MAX_CLASSES];
    const char *(*outputs)[OUTPUTS_MAX]; /* [r->n_inputs], pointing into r */
};

/* A report over r (taken: freed with the report, also when this fails). */
static tilewise_report *report_new(tw_run_result *r, const char *output_dir, const char *run_json,
                                   int shard_index, int shard_count)
{
    tilewise_report *rep = calloc(1, sizeof *rep);
    if (rep && r && r->n_inputs > 0) {
        rep->outputs = calloc((size_t)r->n_inputs, sizeof *rep->outputs);
        if (!rep->outputs) {
            free(rep);
            rep = NULL;
        }
    }
    if (!rep) {
        tw_run_result_destroy(r);
        return NULL;
    }
    rep->r = r;
    snprintf(rep->output_dir, sizeof rep->output_dir, "%s", output_dir);
    snprintf(rep->run_json, sizeof rep->run_json, "%s", run_json);
    rep->shard_index = shard_index;
    rep->shard_count = shard_count;
    for (int c = 0; r && c < r->model.n_classes; c++) rep->class_names[c] = r->model.classes[c];
    for (int i = 0; r && i < r->n_inputs; i++)
        for (int o = 0; o < r->inputs[i].n_outputs; o++)
            rep->outputs[i][o] = r->inputs[i].outputs[o];
    return rep;
}

const char *tilewise_report_json(const tilewise_report *r)
{
    return r && r->json ? r->json : "";
}

const char *tilewise_report_path(const tilewise_report *r)
{
    return r ? r->path : "";
}

void tilewise_report_free(tilewise_report *r)
{
    if (!r) return;
    free(r->json);
    free(r->outputs);
    tw_run_result_destroy(r->r);
    free(r);
}

tilewise_status tilewise_report_summary(const tilewise_report *rep, tilewise_run_summary *s,
                                        tilewise_error *out)
{
    if (!rep || !s || s->size < RUN_SUMMARY_V2_SIZE)
        return give_new(out, TW_ERR_USAGE,
                        "tilewise_report_summary: no report, no summary or its size not set "
                        "(size = sizeof(tilewise_run_summary))");
    static const tw_run_result none; /* the run kept no result: zero counts */
    const tw_run_result *r = rep->r ? rep->r : &none;
    tilewise_run_summary f = {
        .size = s->size,
        .status = rep->status,
        .exit_code = rep->status != TW_OK    ? tw_status_exit_code((tw_status)rep->status)
                     : r->inputs_skipped > 0 ? TW_EXIT_SKIPPED
                                             : TW_EXIT_OK,
        .n_inputs = r->n_inputs,
        .inputs_skipped = r->inputs_skipped,
        .tiles_classified = r->tiles_classified,
        .seconds = r->seconds,
        .n_classes = r->model.n_classes,
        .class_names = rep->class_names,
        .backend = r->backend,
        .output_dir = rep->output_dir,
        .run_json = rep->run_json,
        .shard_index = rep->shard_index,
        .shard_count = rep->shard_count,
    };
    memcpy(s, &f, s->size < sizeof f ? s->size : sizeof f);
    return give(out, TW_OK, NULL);
}

tilewise_status tilewise_report_input(const tilewise_report *rep, int i, tilewise_input_summary *s,
                                      tilewise_error *out)
{
    if (!rep || !s || s->size < INPUT_SUMMARY_V2_SIZE)
        return give_new(out, TW_ERR_USAGE,
                        "tilewise_report_input: no report, no summary or its size not set "
                        "(size = sizeof(tilewise_input_summary))");
    const tw_run_result *r = rep->r;
    if (!r || i < 0 || i >= r->n_inputs)
        return give_new(out, TW_ERR_USAGE, "tilewise_report_input: input %d of %d", i,
                        r ? r->n_inputs : 0);
    const tw_input_result *in = &r->inputs[i];
    tilewise_input_summary f = {
        .size = s->size,
        .path = in->path,
        .skipped = in->skipped,
        .width = in->width,
        .height = in->height,
        .grid_width = in->grid_w,
        .grid_height = in->grid_h,
        .tiles_total = in->tiles_total,
        .tiles_classified = in->tiles_classified,
        .tiles_nodata = in->tiles_nodata,
        .tiles_read_errors = in->tiles_read_errors,
        .tiles_outside_aoi = in->tiles_outside_aoi,
        .rows_resumed = in->rows_resumed,
        .seconds = in->seconds,
        .class_cells = in->hist,
        .nodata_cells = in->nodata_cells,
        .n_outputs = in->n_outputs,
        .outputs = rep->outputs[i],
    };
    memcpy(s, &f, s->size < sizeof f ? s->size : sizeof f);
    return give(out, TW_OK, NULL);
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *s = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (s = malloc((size_t)n + 1)) != NULL) {
            if (fread(s, 1, (size_t)n, f) != (size_t)n) {
                free(s);
                s = NULL;
            } else {
                s[n] = '\0';
            }
        }
    }
    fclose(f);
    return s;
}

static void logf_(tilewise_log_fn log, void *user, int level, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void logf_(tilewise_log_fn log, void *user, int level, const char *fmt, ...)
{
    if (!log) return;
    char line[TW_PATH_MAX + 512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    log(level, line, user);
}

/* The per-input lines tilewise_run_file logs after a run (log_summary). */
static void log_summary(const tw_run_result *r, tilewise_log_fn log, void *user)
{
    for (int i = 0; log && i < r->n_inputs; i++) {
        const tw_input_result *in = &r->inputs[i];
        logf_(log, user, TILEWISE_LOG_INFO,
              "%s: %lld tiles classified, %lld nodata (%lld unreadable), in %.2f s (%.1f tiles/s)",
              in->path, (long long)in->tiles_classified,
              (long long)(in->tiles_nodata + in->tiles_read_errors),
              (long long)in->tiles_read_errors, in->seconds,
              in->seconds > 0 ? in->tiles_classified / in->seconds : 0.0);
        for (int o = 0; o < in->n_outputs; o++)
            logf_(log, user, TILEWISE_LOG_INFO, "wrote %s", in->outputs[o]);
    }
}

void tilewise_run_options_init(tilewise_run_options *o)
{
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
    o->shard_count = 1;
    o->tiff_direct = o->cpu_winograd = o->cpu_gemm = o->cpu_nhwc = -1;
}

/* run.KEY=VALUE into o (tilewise_run_options_set, and tilewise_run_file's
 * overrides). */
static tw_status set_run_option(tilewise_run_options *o, const char *s, tw_error *err)
{
    const char *v = strchr(s, '=');
    char extra;
    int a, b;
    if (!v) return tw_error_set(err, TW_ERR_USAGE, "%s: expected key=value", s);
    v++;
    if (strncmp(s, "run.shard=", 10) == 0) {
        if (sscanf(v, "%d/%d%c", &a, &b, &extra) != 2 || b < 1 || a < 1 || a > b)
            return tw_error_set(err, TW_ERR_USAGE,
                                "run.shard expects I/N with 1 <= I <= N, got '%s'", v);
        o->shard_index = a - 1;
        o->shard_count = b;
    } else if (strncmp(s, "run.chunk_rows=", 15) == 0) {
        if (sscanf(v, "%d%c", &a, &extra) != 1 || a < 1 || a > 1000000)
            return tw_error_set(err, TW_ERR_USAGE,
                                "run.chunk_rows expects a positive number of rows, got '%s'", v);
        o->chunk_rows = a;
    } else if (strncmp(s, "run.report=", 11) == 0) {
        o->report_path = v;
    } else if (strncmp(s, "run.quiet=", 10) == 0 || strncmp(s, "run.restart=", 12) == 0 ||
               strncmp(s, "run.strict=", 11) == 0) {
        int *flag = s[4] == 'q' ? &o->quiet : s[5] == 'e' ? &o->restart : &o->strict;
        if (strcmp(v, "true") && strcmp(v, "false"))
            return tw_error_set(err, TW_ERR_USAGE, "%.*s expects true or false, got '%s'",
                                (int)(v - 1 - s), s, v);
        *flag = strcmp(v, "true") == 0;
    } else {
        return tw_error_set(err, TW_ERR_USAGE,
                            "unknown key '%.*s' (run.shard, run.chunk_rows, run.report, "
                            "run.quiet, run.restart, run.strict)",
                            (int)(v - 1 - s), s);
    }
    return TW_OK;
}

tilewise_status tilewise_run_options_set(tilewise_run_options *o, const char *kv,
                                         tilewise_error *out)
{
    if (!o || !kv || o->size < OPTIONS_V2_SIZE)
        return give_new(out, TW_ERR_USAGE,
                        "tilewise_run_options_set: no options (or not initialized) or no text");
    tw_error err;
    tw_error_init(&err);
    if (strncmp(kv, "run.", 4) != 0)
        return give_new(out, TW_ERR_USAGE, "'%s' is not a run option (run.KEY=VALUE)", kv);
    return give(out, set_run_option(o, kv, &err), &err);
}

/* The first step of every entry point that takes options: *err initialized,
 * and the caller's options, checked, into *o (defaults where the caller's
 * struct is shorter). */
static tw_status take_options(const tilewise_run_options *in, tilewise_run_options *o,
                              tw_error *err)
{
    tw_error_init(err);
    tilewise_run_options_init(o);
    if (!in) return TW_OK;
    if (in->size < OPTIONS_V2_SIZE)
        return tw_error_set(err, TW_ERR_USAGE,
                            "tilewise_run_options.size is %zu: fill the options with "
                            "tilewise_run_options_init",
                            in->size);
    memcpy(o, in, in->size < sizeof *o ? in->size : sizeof *o);
    o->size = sizeof *o;
    if (o->n_sets < 0 || (o->n_sets > 0 && !o->sets))
        return tw_error_set(err, TW_ERR_USAGE, "tilewise_run_options: %d overrides, sets %s",
                            o->n_sets, o->sets ? "given" : "NULL");
    for (int i = 0; i < o->n_sets; i++)
        if (!o->sets[i]) return tw_error_set(err, TW_ERR_USAGE, "override %d is NULL", i);
    if (o->shard_count < 1 || o->shard_index < 0 || o->shard_index >= o->shard_count)
        return tw_error_set(err, TW_ERR_USAGE,
                            "tilewise_run_options: shard_index %d of shard_count %d (0 <= index "
                            "< count)",
                            o->shard_index, o->shard_count);
    if (o->chunk_rows < 0 || o->chunk_rows > 1000000)
        return tw_error_set(err, TW_ERR_USAGE,
                            "tilewise_run_options: chunk_rows %d (0 for the default, or 1 to "
                            "1000000)",
                            o->chunk_rows);
    const int knobs[] = {o->tiff_direct, o->cpu_winograd, o->cpu_gemm, o->cpu_nhwc};
    static const char *const names[] = {"tiff_direct", "cpu_winograd", "cpu_gemm", "cpu_nhwc"};
    for (int k = 0; k < 4; k++)
        if (knobs[k] < -1 || knobs[k] > (k == 1 ? 2 : 1))
            return tw_error_set(err, TW_ERR_USAGE, "tilewise_run_options: %s %d (-1 default, %s)",
                                names[k], knobs[k], k == 1 ? "0, 1 or 2" : "0 or 1");
    return TW_OK;
}

/* The options the workflow does not hold, onto the parsed params. */
static void apply_options(tw_run_params *p, const tilewise_run_options *o)
{
    p->shard_index = o->shard_index;
    p->shard_count = o->shard_count;
    p->chunk_rows = o->chunk_rows;
    p->quiet = o->quiet != 0;
    p->restart = o->restart != 0;
    p->strict = o->strict != 0;
    if (o->report_path) snprintf(p->report_path, sizeof p->report_path, "%s", o->report_path);
    if (o->tiff_direct >= 0) p->input.tiff_direct = o->tiff_direct != 0;
    if (o->cpu_winograd >= 0) p->runtime.cpu_winograd = o->cpu_winograd;
    if (o->cpu_gemm >= 0) p->runtime.cpu_gemm = o->cpu_gemm;
    if (o->cpu_nhwc >= 0) p->runtime.cpu_nhwc = o->cpu_nhwc;
    if (o->cuda_fail_alloc_above) p->runtime.cuda_fail_above = (size_t)o->cuda_fail_alloc_above;
}

/* The run's hooks to the caller's callbacks (user: the options). */
static int progress_hook(double complete, const char *message, void *user)
{
    const tilewise_run_options *o = user;
    return o->progress ? o->progress(complete, message, o->user) : 1;
}

static void tiles_hook(int64_t done, int64_t total, const char *message, void *user)
{
    const tilewise_run_options *o = user;
    o->tiles(done, total, message, o->user);
}

static void log_hook(tw_log_level level, const char *msg, void *user)
{
    const tilewise_run_options *o = user;
    o->log(level == TW_LOG_WARNING ? TILEWISE_LOG_WARNING : TILEWISE_LOG_INFO, msg, o->user);
}

/* The backend a run of p would create (the same knobs as pipeline/run.c). */
static tw_status backend_for(const tw_run_params *p, tw_backend *be, tw_error *err)
{
    tw_backend_params bp = tw_backend_default_params();
    bp.threads = p->runtime.threads;
    bp.cpu_winograd = p->runtime.cpu_winograd;
    return tw_backend_create_ex(p->runtime.device, &bp, be, err);
}

/* The end of a run or merge: rep (may be NULL: out of memory) with the
 * final status to the caller's *report (or freed), the status returned. */
static tilewise_status hand_over(tilewise_report *rep, tilewise_report **report, tw_status st,
                                 tw_error *err, tilewise_error *out)
{
    if (!rep && report && st == TW_OK)
        st = tw_error_set(err, TW_ERR_NOMEM, "out of memory for the report");
    if (rep) rep->status = st;
    if (report)
        *report = rep;
    else
        tilewise_report_free(rep);
    return give(out, st, err);
}

/* Run parsed params; write run.json as the CLI does: in the output folder
 * when it exists (not over the report of the process holding the lock),
 * else to a temporary file only to return it. */
static tilewise_status run_params(tw_run_params *p, tilewise_run_options *o,
                                  tilewise_report **report, tilewise_error *out)
{
    tw_error err;
    tw_error_init(&err);
    tw_run_hooks hooks = {.progress = o->progress || o->tiles ? progress_hook : NULL,
                          .progress_user = o,
                          .tiles = o->tiles ? tiles_hook : NULL,
                          .stop = o->stop,
                          .log = {.fn = o->log ? log_hook : NULL, .user = o}};
    tw_run_result *r = NULL;
    tw_status st = tw_run(p, &hooks, &r, &err);

    /* run.json belongs to the last run that finished: a failed or stopped
     * attempt writes run.failed.json beside it (shards: their own pair), and
     * every attempt is one line of OUTPUT_DIR/.tilewise/attempts.jsonl. */
    char run_json[TW_PATH_MAX + 64], shard[32] = "";
    if (p->shard_count > 1)
        snprintf(shard, sizeof shard, ".shard%04d-of-%04d", p->shard_index + 1, p->shard_count);
    snprintf(run_json, sizeof run_json, "%s/run%s%s.json", p->output.dir, shard,
             st == TW_OK ? "" : ".failed");
    tilewise_report *rep = report_new(r, p->output.dir, run_json, p->shard_index, p->shard_count);
    if (!rep) r = NULL; /* freed by report_new */
    char path[TW_PATH_MAX + 64];
    struct stat sb;
    bool in_dir = st != TW_ERR_LOCKED && stat(p->output.dir, &sb) == 0 && S_ISDIR(sb.st_mode);
    int tmp_fd = -1;
    if (in_dir) {
        snprintf(path, sizeof path, "%s", run_json);
    } else {
        snprintf(path, sizeof path, "%s/tilewise-report-XXXXXX", P_tmpdir);
        tmp_fd = mkstemp(path);
        if (tmp_fd >= 0) close(tmp_fd);
    }
    if (in_dir || tmp_fd >= 0) {
        tw_error rerr;
        tw_error_init(&rerr);
        tw_status rs = tw_report_write(path, p, r, st, st == TW_OK ? NULL : err.msg, &rerr);
        if (rs != TW_OK && st == TW_OK) st = tw_error_set(&err, rs, "%s", rerr.msg);
        if (rs == TW_OK && rep) {
            rep->json = read_text(path);
            if (in_dir) snprintf(rep->path, sizeof rep->path, "%s", path);
        }
        if (!in_dir) unlink(path);
    }
    if (in_dir) {
        /* the log is best effort: a run's outcome does not depend on it */
        tw_error lerr;
        tw_error_init(&lerr);
        (void)tw_report_log_attempt(p->output.dir, p, r, st, st == TW_OK ? NULL : err.msg, path,
                                    &lerr);
        if (st == TW_OK) {
            /* this run finished: an earlier attempt's failure report is history */
            char failed[TW_PATH_MAX + 64];
            snprintf(failed, sizeof failed, "%s/run%s.failed.json", p->output.dir, shard);
            unlink(failed);
        }
    }
    if (p->report_path[0]) {
        tw_error rerr;
        tw_error_init(&rerr);
        tw_status rs =
            tw_report_write(p->report_path, p, r, st, st == TW_OK ? NULL : err.msg, &rerr);
        if (rs != TW_OK && st == TW_OK) st = tw_error_set(&err, rs, "%s", rerr.msg);
    }
    if (o->log_summary && st == TW_OK && r) log_summary(r, o->log, o->user);
    if (o->log_summary && st == TW_CANCELLED)
        logf_(o->log, o->user, TILEWISE_LOG_WARNING, "%s", err.msg);
    return hand_over(rep, report, st, &err, out);
}

/* The caller's options into *o (take_options), then the workflow (a file,
 * or o->yaml named `workflow`) with o's overrides and options into *p
 * (malloc'ed; free it). */
static tw_status load_workflow(const char *workflow, const tilewise_run_options *opts,
                               tilewise_run_options *o, tw_run_params **p, tw_error *err)
{
    *p = NULL;
    tw_status st = take_options(opts, o, err);
    if (st != TW_OK) return st;
    if (!workflow && !o->yaml)
        return tw_error_set(err, TW_ERR_USAGE, "no workflow: a path, or options.yaml");
    tw_run_params *q = malloc(sizeof *q);
    if (!q) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    st = o->yaml ? tw_workflow_parse(workflow ? workflow : "<memory>", o->yaml, o->yaml_len,
                                     o->sets, o->n_sets, q, err)
                 : tw_workflow_load(workflow, o->sets, o->n_sets, q, err);
    if (st != TW_OK) {
        free(q);
        return st;
    }
    apply_options(q, o);
    *p = q;
    return TW_OK;
}

tilewise_status tilewise_run(const char *workflow, const tilewise_run_options *opts,
                             tilewise_report **report, tilewise_error *out)
{
    if (report) *report = NULL;
    tw_error err;
    tilewise_run_options o;
    tw_run_params *p = NULL;
    tw_status st = load_workflow(workflow, opts, &o, &p, &err);
    tilewise_status ret = st == TW_OK ? run_params(p, &o, report, out) : give(out, st, &err);
    free(p);
    return ret;
}

tilewise_status tilewise_merge(const char *output_dir, const tilewise_run_options *opts,
                               tilewise_report **report, tilewise_error *out)
{
    if (report) *report = NULL;
    tw_error err;
    tilewise_run_options o;
    tw_status st = take_options(opts, &o, &err);
    if (st == TW_OK && !output_dir)
        st = tw_error_set(&err, TW_ERR_USAGE, "tilewise_merge: no output folder");
    if (st != TW_OK) return give(out, st, &err);
    tw_run_result *r = NULL;
    st = tw_merge(output_dir, o.quiet != 0, &r, &err);
    return hand_over(report_new(r, output_dir, "", 0, 1), report, st, &err, out);
}

/* ---- validate ---- */

struct tilewise_validation {
    char *text;
    size_t len;
    int n_warnings;
    const char **warnings; /* [n_warnings], into text (the lines cut at their '\n') */
    char *lines;           /* a copy of text, cut into lines */
};

tilewise_status tilewise_validate(const char *workflow, const tilewise_run_options *opts,
                                  tilewise_validation **v, tilewise_error *out)
{
    if (v) *v = NULL;
    tw_error err;
    tilewise_run_options o;
    tw_run_params *p = NULL;
    tw_status st = load_workflow(workflow, opts, &o, &p, &err);
    if (st != TW_OK) return give(out, st, &err);
    tilewise_validation *va = calloc(1, sizeof *va);
    FILE *f = va ? open_memstream(&va->text, &va->len) : NULL;
    if (!f) {
        free(va);
        free(p);
        return give_new(out, TW_ERR_NOMEM, "out of memory");
    }
    st = tw_validate_report(p, f, NULL, &err);
    free(p);
    if (fclose(f) != 0 && st == TW_OK) st = tw_error_set(&err, TW_ERR_NOMEM, "out of memory");
    /* The warning lines, as data. */
    va->lines = va->text ? strdup(va->text) : NULL;
    int n = 0;
    for (const char *c = va->text; c && *c; c++) n += *c == '\n';
    va->warnings = calloc((size_t)n + 1, sizeof *va->warnings);
    if (!va->lines || !va->warnings) {
        tilewise_validation_free(va);
        return give_new(out, TW_ERR_NOMEM, "out of memory");
    }
    for (char *line = va->lines, *next; *line; line = next) {
        char *nl = strchr(line, '\n');
        next = nl ? nl + 1 : line + strlen(line);
        if (nl) *nl = '\0';
        if (strncmp(line, "warning", 7) == 0) {
            const char *w = line + 7;
            while (*w == ' ') w++;
            va->warnings[va->n_warnings++] = w;
        }
    }
    if (v)
        *v = va;
    else
        tilewise_validation_free(va);
    return give(out, st, &err);
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
    return v && i >= 0 && i < v->n_warnings ? v->warnings[i] : NULL;
}

void tilewise_validation_free(tilewise_validation *v)
{
    if (!v) return;
    free(v->text);
    free(v->lines);
    free(v->warnings);
    free(v);
}

/* ---- info ---- */

tilewise_status tilewise_info(const char *path, const tilewise_run_options *opts, int json,
                              char **text, tilewise_error *out)
{
    if (text) *text = NULL;
    tw_error err;
    tilewise_run_options o;
    tw_status st = take_options(opts, &o, &err);
    if (st == TW_OK && (!path || !text))
        st = tw_error_set(&err, TW_ERR_USAGE, "tilewise_info: no path or no place for the text");
    /* A PyTorch checkpoint gets the export hint a run gives. */
    if (st == TW_OK) st = tw_preflight_weights(path, &err);
    if (st != TW_OK) return give(out, st, &err);
    tw_run_params d = tw_run_default_params();
    apply_options(&d, &o);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return give_new(out, TW_ERR_NOMEM, "out of memory");
    st = tw_info_write(path, json != 0, d.input.tiff_direct, f, &err);
    if (fclose(f) != 0 && st == TW_OK) st = tw_error_set(&err, TW_ERR_NOMEM, "out of memory");
    if (st == TW_OK)
        *text = buf;
    else
        free(buf);
    return give(out, st, &err);
}

void tilewise_string_free(char *s)
{
    free(s);
}

/* ---- version 1 runs: tilewise_run with the run.* overrides split off ---- */

/* The workflow a run reads: a file (path), or YAML text (name, yaml, len). */
typedef struct workflow_src {
    const char *path;
    const char *name, *yaml;
    size_t len;
} workflow_src;

static tilewise_status run_v1(const workflow_src *w, const char *const *sets, int n_sets,
                              tilewise_progress_fn progress, tilewise_log_fn log, void *user,
                              tilewise_report **report, tilewise_error *out)
{
    tilewise_run_options o;
    tilewise_run_options_init(&o);
    o.progress = progress;
    o.log = log;
    o.user = user;
    o.log_summary = 1;
    o.yaml = w->yaml;
    o.yaml_len = w->len;
    const char *kept[MAX_SETS];
    tw_error err;
    tw_error_init(&err);
    tw_status st = TW_OK;
    for (int i = 0; st == TW_OK && i < n_sets; i++) {
        const char *s = sets[i];
        if (!s)
            st = tw_error_set(&err, TW_ERR_USAGE, "override %d is NULL", i);
        else if (strncmp(s, "run.", 4) == 0)
            st = set_run_option(&o, s, &err);
        else if (o.n_sets == MAX_SETS)
            st = tw_error_set(&err, TW_ERR_USAGE, "too many overrides");
        else
            kept[o.n_sets++] = s;
    }
    if (st != TW_OK) return give(out, st, &err);
    o.sets = kept;
    return tilewise_run(w->path ? w->path : w->name, &o, report, out);
}

tilewise_status tilewise_run_file(const char *path, const char *const *sets, int n_sets,
                                  tilewise_progress_fn progress, tilewise_log_fn log, void *user,
                                  tilewise_report **report, tilewise_error *out)
{
    if (report) *report = NULL;
    if (!path || n_sets < 0 || (n_sets > 0 && !sets))
        return give_new(out, TW_ERR_USAGE, "tilewise_run_file: no workflow path or bad overrides");
    workflow_src w = {.path = path};
    return run_v1(&w, sets, n_sets, progress, log, user, report, out);
}

tilewise_status tilewise_run_yaml(const char *name, const char *yaml, size_t len,
                                  const char *const *sets, int n_sets,
                                  tilewise_progress_fn progress, tilewise_log_fn log, void *user,
                                  tilewise_report **report, tilewise_error *out)
{
    if (report) *report = NULL;
    if (!yaml || n_sets < 0 || (n_sets > 0 && !sets))
        return give_new(out, TW_ERR_USAGE, "tilewise_run_yaml: no YAML text or bad overrides");
    workflow_src w = {.name = name, .yaml = yaml, .len = len};
    return run_v1(&w, sets, n_sets, progress, log, user, report, out);
}

/* ---- models ---- */

struct tilewise_model {
    tw_run_params p;
    tw_resolved m;
    tw_resnet *net;
    tw_backend be;
    bool have_be;
    tw_norm norm;
    /* What reserve fixed, and the batch buffers it was sized for. */
    int tile;  /* 0: not reserved yet */
    int batch; /* tiles per backend call */
    void *raw; /* [batch][bands][tile][tile], 8 bytes per sample (widest dtype) */
    uint8_t *valid;
    float *x, *probs, *emb;
    char *info;
};

static tw_dtype to_internal(int t, bool *ok)
{
    *ok = true;
    switch (t) {
    case TILEWISE_DT_BYTE: return TW_DT_BYTE;
    case TILEWISE_DT_UINT16: return TW_DT_UINT16;
    case TILEWISE_DT_INT16: return TW_DT_INT16;
    case TILEWISE_DT_UINT32: return TW_DT_UINT32;
    case TILEWISE_DT_INT32: return TW_DT_INT32;
    case TILEWISE_DT_FLOAT32: return TW_DT_FLOAT32;
    case TILEWISE_DT_FLOAT64: return TW_DT_FLOAT64;
    case TILEWISE_DT_INT8: return TW_DT_INT8;
    }
    *ok = false;
    return TW_DT_BYTE;
}

static void model_info_json(tilewise_model *mo)
{
    const tw_resolved *m = &mo->m;
    sbuf b = {0};
    sb_add(&b, "{\"path\":");
    sb_str(&b, mo->p.model.weights);
    sb_add(&b, ",\"arch\":");
    sb_str(&b, m->arch);
    sb_add(&b, ",\"bands\":[");
    for (int i = 0; i < m->n_bands; i++) sb_add(&b, "%s%d", i ? "," : "", m->bands[i]);
    sb_add(&b, "],\"in_bands\":%d,\"classes\":[", m->in_bands);
    for (int c = 0; c < m->n_classes; c++) {
        if (c) sb_add(&b, ",");
        sb_str(&b, m->classes[c]);
    }
    sb_add(&b, "],\"n_classes\":%d,\"feature_dim\":%d,\"tile\":%d,\"stride\":%d,\"scale\":%.17g",
           m->n_classes, m->feat_dim, m->tile, m->stride, m->scale);
    /* a headless backbone: its probabilities are a stand-in head's (all 1) */
    sb_add(&b, ",\"head\":%s", m->headless ? "false" : "true");
    sb_add(&b, ",\"mean\":[");
    for (int c = 0; c < m->n_norm; c++) sb_add(&b, "%s%.9g", c ? "," : "", (double)m->mean[c]);
    sb_add(&b, "],\"std\":[");
    for (int c = 0; c < m->n_norm; c++) sb_add(&b, "%s%.9g", c ? "," : "", (double)m->std[c]);
    sb_add(&b, "],\"sha256\":");
    sb_str(&b, m->model_sha256);
    sb_add(&b, ",\"backend\":");
    sb_str(&b, mo->have_be ? mo->be.i->name : "");
    sb_add(&b, ",\"batch\":%d,\"memory\":%zu}", mo->batch, mo->p.runtime.memory);
    if (b.failed) {
        free(b.s);
        b.s = NULL;
    }
    free(mo->info);
    mo->info = b.s;
}

tilewise_status tilewise_model_open(const char *path, const char *const *sets, int n_sets,
                                    tilewise_model **out, tilewise_error *oerr)
{
    if (out) *out = NULL;
    if (!path || !out || n_sets < 0 || (n_sets > 0 && !sets) || n_sets > MAX_SETS - 2)
        return give_new(oerr, TW_ERR_USAGE, "tilewise_model_open: bad arguments");
    tilewise_model *mo = calloc(1, sizeof *mo);
    if (!mo) return give_new(oerr, TW_ERR_NOMEM, "out of memory");
    tw_error err;
    tw_error_init(&err);
    /* The workflow parser checks the overrides (names, types, ranges) as for
     * a run; the two required keys get placeholders, replaced below. */
    const char *all[MAX_SETS];
    all[0] = "input.path=unused.tif";
    all[1] = "model.weights=unused.h5";
    for (int i = 0; i < n_sets; i++) all[2 + i] = sets[i];
    static const char empty[] = "{}\n";
    tw_status st = tw_workflow_parse("<model options>", empty, sizeof empty - 1, all, n_sets + 2,
                                     &mo->p, &err);
    tw_model_file *mf = NULL;
    if (st == TW_OK) {
        snprintf(mo->p.model.weights, sizeof mo->p.model.weights, "%s", path);
        mo->p.input.n_paths = 0;
        st = tw_preflight_weights(path, &err); /* a .pth: the export hint a run gives */
        if (st == TW_OK) st = tw_model_file_load(path, &mf, &err);
    }
    if (st == TW_OK) st = tw_resnet_create(mf, mo->p.model.arch, &mo->net, &err);
    if (st == TW_OK) st = tw_resolve_loaded(&mo->p, mf, mo->net, &mo->m, &err);
    tw_model_file_destroy(mf);
    if (st == TW_OK) st = backend_for(&mo->p, &mo->be, &err);
    if (st == TW_OK) {
        mo->have_be = true;
        mo->norm.bands = mo->m.in_bands;
        mo->norm.scale = mo->m.scale;
        memcpy(mo->norm.mean, mo->m.mean, sizeof mo->norm.mean);
        memcpy(mo->norm.std, mo->m.std, sizeof mo->norm.std);
        model_info_json(mo);
        if (!mo->info) st = tw_error_set(&err, TW_ERR_NOMEM, "out of memory");
    }
    if (st != TW_OK) {
        tilewise_model_close(mo);
        return give(oerr, st, &err);
    }
    *out = mo;
    return give(oerr, TW_OK, &err);
}

static void free_buffers(tilewise_model *mo)
{
    tw_free(mo->raw);
    tw_free(mo->valid);
    tw_free(mo->x);
    tw_free(mo->probs);
    tw_free(mo->emb);
    mo->raw = mo->valid = NULL;
    mo->x = mo->probs = mo->emb = NULL;
}

void tilewise_model_close(tilewise_model *mo)
{
    if (!mo) return;
    free_buffers(mo);
    if (mo->have_be) tw_backend_destroy(&mo->be);
    tw_resnet_destroy(mo->net);
    free(mo->info);
    free(mo);
}

const char *tilewise_model_info_json(const tilewise_model *m)
{
    return m && m->info ? m->info : "{}";
}
int tilewise_model_bands(const tilewise_model *m)
{
    return m ? m->m.in_bands : 0;
}
int tilewise_model_classes(const tilewise_model *m)
{
    return m ? m->m.n_classes : 0;
}
int tilewise_model_feature_dim(const tilewise_model *m)
{
    return m ? m->m.feat_dim : 0;
}
int tilewise_model_tile(const tilewise_model *m)
{
    return m ? m->m.tile : 0;
}
const char *tilewise_model_class_name(const tilewise_model *m, int c)
{
    return m && c >= 0 && c < m->m.n_classes ? m->m.classes[c] : NULL;
}

/* Bytes one tile needs in the batch buffers. */
static size_t tile_bytes(const tilewise_model *mo, int T)
{
    size_t px = (size_t)T * (size_t)T;
    return px * (size_t)mo->m.in_bands * (8 + sizeof(float)) + px +
           (size_t)(mo->m.n_classes + mo->m.feat_dim) * sizeof(float);
}

/* Fix the batch from runtime.memory and reserve the backend for tiles of T
 * pixels. A second tile size makes a new backend (reserve runs once per
 * backend), so the net's weights are never handed over (consume = false). */
static tw_status reserve(tilewise_model *mo, int T, tw_error *err)
{
    if (mo->tile == T) return TW_OK;
    free_buffers(mo);
    if (mo->tile) {
        tw_backend_destroy(&mo->be);
        mo->have_be = false;
        tw_status st = backend_for(&mo->p, &mo->be, err);
        if (st != TW_OK) return st;
        mo->have_be = true;
        mo->tile = 0;
    }
    const tw_backend *be = &mo->be;
    tw_precision prec = mo->p.runtime.precision;
    size_t weights = mo->net->weight_bytes;
    if (be->i->consumes_weights(be->ctx, prec)) weights *= 2; /* the net's and the backend's */
    int batch =
        mo->p.tiling.batch > 0 ? mo->p.tiling.batch : be->i->auto_batch(be->ctx, mo->net, T);
    if (batch < 1) batch = 1;
    size_t total = mo->p.runtime.memory;
    for (;;) {
        size_t need = weights + be->i->workspace_bytes(be->ctx, mo->net, T, batch, prec) +
                      (size_t)batch * tile_bytes(mo, T);
        if (need <= total) break;
        if (batch == 1)
            return tw_error_set(err, TW_ERR_NOMEM,
                                "runtime.memory %zu bytes cannot hold one %dx%d tile of %s "
                                "(%zu bytes needed)",
                                total, T, T, mo->m.arch, need);
        batch /= 2;
    }
    tw_status st = tw_backend_reserve(&mo->be, mo->net, T, &batch, prec, false, NULL, err);
    if (st != TW_OK) return st;
    size_t px = (size_t)T * (size_t)T, nb = (size_t)batch;
    size_t band_px = px * (size_t)mo->m.in_bands;
    mo->raw = tw_alloc(TW_MEM_SLOTS, nb * band_px * 8);
    mo->valid = tw_alloc(TW_MEM_SLOTS, nb * px);
    mo->x = tw_alloc(TW_MEM_SLOTS, nb * band_px * sizeof(float));
    mo->probs = tw_alloc(TW_MEM_SLOTS, nb * (size_t)mo->m.n_classes * sizeof(float));
    mo->emb = tw_alloc(TW_MEM_SLOTS, nb * (size_t)mo->m.feat_dim * sizeof(float));
    if (!mo->raw || !mo->valid || !mo->x || !mo->probs || !mo->emb) {
        free_buffers(mo);
        return tw_error_set(err, TW_ERR_NOMEM, "cannot allocate buffers for %d tiles", batch);
    }
    mo->tile = T;
    mo->batch = batch;
    model_info_json(mo);
    return TW_OK;
}

/* Sample i of a raw buffer as a double. */
static double sample(const void *p, tw_dtype t, size_t i)
{
    switch (t) {
    case TW_DT_BYTE: return ((const uint8_t *)p)[i];
    case TW_DT_INT8: return ((const int8_t *)p)[i];
    case TW_DT_UINT16: return ((const uint16_t *)p)[i];
    case TW_DT_INT16: return ((const int16_t *)p)[i];
    case TW_DT_UINT32: return ((const uint32_t *)p)[i];
    case TW_DT_INT32: return ((const int32_t *)p)[i];
    case TW_DT_FLOAT32: return ((const float *)p)[i];
    case TW_DT_FLOAT64: return ((const double *)p)[i];
    }
    return 0;
}

/* The raster reader's nodata rule (io/raster.h, tw_raster_set_nodata): a
 * pixel is invalid when any band equals the nodata value as the band's type
 * holds it, or (float types) is not finite. Returns the invalid count. */
static int64_t mark_valid(const void *tile, tw_dtype t, int bands, size_t px, bool use_nd,
                          double nd, uint8_t *valid)
{
    bool is_float = t == TW_DT_FLOAT32 || t == TW_DT_FLOAT64;
    /* The value nodata takes in the type, or none: integers only match an
     * integral in-range nodata; float32 compares after rounding to float. */
    bool match = use_nd && !isnan(nd);
    double ndv = nd;
    if (match && !is_float) {
        static const double lo[] = {0, 0, -32768, 0, -2147483648.0, 0, 0, -128};
        static const double hi[] = {255, 65535, 32767, 4294967295.0, 2147483647.0, 0, 0, 127};
        if (!(nd >= lo[t] && nd <= hi[t]) || nd != floor(nd)) match = false;
    } else if (match && t == TW_DT_FLOAT32) {
        if (fabs(nd) > 3.4028234663852886e38)
            match = false;
        else
            ndv = (double)(float)nd;
    }
    for (int b = 0; b < bands; b++) {
        size_t off = (size_t)b * px;
        for (size_t i = 0; i < px; i++) {
            double v = sample(tile, t, off + i);
            bool bad = (is_float && !isfinite(v)) || (match && v == ndv);
            if (bad) valid[i] = 0;
        }
    }
    int64_t n = 0;
    for (size_t i = 0; i < px; i++) n += valid[i] == 0;
    return n;
}

tilewise_status tilewise_model_classify(tilewise_model *mo, const tilewise_tiles *in, float *probs,
                                        float *emb, tilewise_error *oerr)
{
    if (!mo || !in || !probs)
        return give_new(oerr, TW_ERR_USAGE, "tilewise_model_classify: no model, tiles or output");
    bool ok;
    tw_dtype t = to_internal(in->dtype, &ok);
    if (!ok)
        return give_new(oerr, TW_ERR_USAGE,
                        "pixel data type %d is not supported (Byte, Int8, UInt16, Int16, UInt32, "
                        "Int32, Float32, Float64)",
                        in->dtype);
    if (in->bands != mo->m.in_bands)
        return give_new(oerr, TW_ERR_USAGE, "%s expects %d input bands but the tiles have %d",
                        mo->p.model.weights, mo->m.in_bands, in->bands);
    if (in->size < 32)
        return give_new(oerr, TW_ERR_USAGE,
                        "tiles of %d pixels are too small for a ResNet (32 pixels at least)",
                        in->size);
    if (in->n < 0 || (in->n > 0 && !in->pixels))
        return give_new(oerr, TW_ERR_USAGE, "tilewise_model_classify: %d tiles, pixels %s", in->n,
                        in->pixels ? "given" : "missing");
    if (in->n == 0) return give_new(oerr, TW_OK, "ok");
    tw_error err;
    tw_error_init(&err);
    const int T = in->size;
    tw_status st = reserve(mo, T, &err);
    if (st != TW_OK) return give(oerr, st, &err);

    const int K = mo->m.n_classes, F = mo->m.feat_dim;
    const size_t px = (size_t)T * (size_t)T, esz = tw_dtype_size(t);
    const size_t tile_raw = px * (size_t)in->bands * esz;
    const bool wants_raw = mo->be.i->wants_raw(mo->be.ctx);
    const double max_frac = mo->p.tiling.max_nodata_fraction;
    int64_t next = 0;
    while (next < in->n) {
        /* Gather up to batch classifiable tiles; the others get NaN. */
        int64_t idx[4096];
        int k = 0;
        int cap = mo->batch < 4096 ? mo->batch : 4096;
        for (; next < in->n && k < cap; next++) {
            const char *src = (const char *)in->pixels + (size_t)next * tile_raw;
            uint8_t *v = mo->valid + (size_t)k * px;
            int64_t outside = 0;
            if (in->valid) {
                const uint8_t *iv = in->valid + (size_t)next * px;
                for (size_t i = 0; i < px; i++) {
                    v[i] = iv[i] != 0 && iv[i] != 2;
                    outside += iv[i] == 2;
                }
            } else {
                memset(v, 1, px);
            }
            /* As the run's tile_classified: nodata counted over the pixels
             * inside the image. */
            int64_t inside = (int64_t)px - outside;
            int64_t bad =
                mark_valid(src, t, in->bands, px, in->use_nodata != 0, in->nodata, v) - outside;
            if (inside <= 0 || bad >= inside || (double)bad / (double)inside > max_frac) {
                for (int c = 0; c < K; c++) probs[(size_t)next * K + c] = NAN;
                if (emb)
                    for (int f = 0; f < F; f++) emb[(size_t)next * F + f] = NAN;
                continue;
            }
            memcpy((char *)mo->raw + (size_t)k * tile_raw, src, tile_raw);
            idx[k++] = next;
        }
        if (k == 0) continue;
        if (!wants_raw) tw_normalize(mo->raw, t, mo->valid, k, T, T, &mo->norm, 0, mo->x);
        tw_infer_batch b = {.n = k,
                            .tile = T,
                            .x = mo->x,
                            .raw = mo->raw,
                            .raw_type = t,
                            .valid = mo->valid,
                            .norm = &mo->norm,
                            .probs = mo->probs,
                            .emb = emb ? mo->emb : NULL};
        st = tw_backend_infer(&mo->be, &b, &err);
        if (st != TW_OK) return give(oerr, st, &err);
        for (int j = 0; j < k; j++) {
            memcpy(probs + (size_t)idx[j] * K, mo->probs + (size_t)j * K, sizeof(float) * K);
            if (emb) memcpy(emb + (size_t)idx[j] * F, mo->emb + (size_t)j * F, sizeof(float) * F);
        }
    }
    return give(oerr, TW_OK, &err);
}
