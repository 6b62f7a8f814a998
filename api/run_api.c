/* run_api.c - runs and merges through the public API (tilewise.h):
 * tilewise_run, tilewise_merge, the version 1 calls, and the report a run
 * hands back (its summaries, run.json's text). A run goes through the
 * workflow parser and tw_run exactly as `tilewise run` does.
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

#include "io/modelfile/model_file.h"
#include "io/url.h"
#include "model/backend.h"
#include "model/resnet.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "pipeline/engine/normalize.h"
#include "pipeline/engine/plan.h"
#include "pipeline/run/preflight.h"
#include "pipeline/run/merge.h"
#include "pipeline/run/run.h"
#include "pipeline/engine/stitch.h"
#include "api/api_internal.h"
#include "api/info.h"
#include "api/validate.h"
#include "config/workflow.h"

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
    tw_free(r->json);
    free(r->outputs);
    tw_run_result_destroy(r->r);
    free(r);
}

tilewise_status tilewise_report_summary(const tilewise_report *rep, tilewise_run_summary *s,
                                        tilewise_error *out)
{
    if (!rep || !s || s->size < RUN_SUMMARY_V2_SIZE)
        return tw_api_give_new(out, TW_ERR_USAGE,
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
        .n_classes = r->model.headless ? 0 : r->model.n_classes, /* no stand-in class_0 */
        .class_names = rep->class_names,
        .backend = r->backend,
        .output_dir = rep->output_dir,
        .run_json = rep->run_json,
        .shard_index = rep->shard_index,
        .shard_count = rep->shard_count,
    };
    memcpy(s, &f, s->size < sizeof f ? s->size : sizeof f);
    return tw_api_give(out, TW_OK, NULL);
}

tilewise_status tilewise_report_input(const tilewise_report *rep, int i, tilewise_input_summary *s,
                                      tilewise_error *out)
{
    if (!rep || !s || s->size < INPUT_SUMMARY_V2_SIZE)
        return tw_api_give_new(out, TW_ERR_USAGE,
                               "tilewise_report_input: no report, no summary or its size not set "
                               "(size = sizeof(tilewise_input_summary))");
    const tw_run_result *r = rep->r;
    if (!r || i < 0 || i >= r->n_inputs)
        return tw_api_give_new(out, TW_ERR_USAGE, "tilewise_report_input: input %d of %d", i,
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
    return tw_api_give(out, TW_OK, NULL);
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

/* The backend a run of p would create (the same knobs as pipeline/run/run.c). */
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
    return tw_api_give(out, st, err);
}

/* Is path (when it exists) one of the run's local inputs, by device and
 * inode? The run refuses such a configuration before its first tile
 * (preflight.h); its report must not then replace the input either. */
static bool is_an_input(const tw_run_params *p, const char *path)
{
    struct stat out, in;
    if (stat(path, &out) != 0) return false;
    for (int i = 0; i < p->input.n_paths; i++)
        if (!tw_url_is_remote(p->input.paths[i]) && stat(p->input.paths[i], &in) == 0 &&
            in.st_dev == out.st_dev && in.st_ino == out.st_ino)
            return true;
    return false;
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
    /* run.json rendered once: the same bytes go to the output folder, to
     * run.report_path and back to the caller. */
    char path[TW_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s", run_json);
    struct stat sb;
    bool in_dir = st != TW_ERR_LOCKED && stat(p->output.dir, &sb) == 0 && S_ISDIR(sb.st_mode) &&
                  !is_an_input(p, path);
    char *json = NULL;
    size_t json_len = 0;
    tw_error rerr;
    tw_error_init(&rerr);
    tw_status rs =
        tw_report_render(p, r, st, st == TW_OK ? NULL : err.msg, &json, &json_len, &rerr);
    if (rs == TW_OK && in_dir) rs = tw_write_file_atomic(path, json, json_len, &rerr);
    if (rs == TW_OK && p->report_path[0])
        rs = tw_write_file_atomic(p->report_path, json, json_len, &rerr);
    if (rs != TW_OK && st == TW_OK) st = tw_error_set(&err, rs, "%s", rerr.msg);
    if (rep && json) {
        rep->json = json;
        if (in_dir && rs == TW_OK) snprintf(rep->path, sizeof rep->path, "%s", path);
    } else {
        tw_free(json);
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
    if (o->log_summary && st == TW_OK && r) log_summary(r, o->log, o->user);
    if (o->log_summary && st == TW_CANCELLED)
        logf_(o->log, o->user, TILEWISE_LOG_WARNING, "%s", err.msg);
    return hand_over(rep, report, st, &err, out);
}

tilewise_status tilewise_run(const char *workflow, const tilewise_run_options *opts,
                             tilewise_report **report, tilewise_error *out)
{
    if (report) *report = NULL;
    tw_error err;
    tilewise_run_options o;
    tw_run_params *p = NULL;
    tw_status st = tw_api_load_workflow(workflow, opts, &o, &p, &err);
    tilewise_status ret = st == TW_OK ? run_params(p, &o, report, out) : tw_api_give(out, st, &err);
    free(p);
    return ret;
}

tilewise_status tilewise_merge(const char *output_dir, const tilewise_run_options *opts,
                               tilewise_report **report, tilewise_error *out)
{
    if (report) *report = NULL;
    tw_error err;
    tilewise_run_options o;
    tw_status st = tw_api_take_options(opts, &o, &err);
    if (st == TW_OK && !output_dir)
        st = tw_error_set(&err, TW_ERR_USAGE, "tilewise_merge: no output folder");
    if (st != TW_OK) return tw_api_give(out, st, &err);
    tw_run_result *r = NULL;
    st = tw_merge_ex(output_dir, o.quiet != 0, o.stop, &r, &err);
    return hand_over(report_new(r, output_dir, "", 0, 1), report, st, &err, out);
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
            st = tw_api_set_run_option(&o, s, &err);
        else if (o.n_sets == MAX_SETS)
            st = tw_error_set(&err, TW_ERR_USAGE, "too many overrides");
        else
            kept[o.n_sets++] = s;
    }
    if (st != TW_OK) return tw_api_give(out, st, &err);
    o.sets = kept;
    return tilewise_run(w->path ? w->path : w->name, &o, report, out);
}

tilewise_status tilewise_run_file(const char *path, const char *const *sets, int n_sets,
                                  tilewise_progress_fn progress, tilewise_log_fn log, void *user,
                                  tilewise_report **report, tilewise_error *out)
{
    if (report) *report = NULL;
    if (!path || n_sets < 0 || (n_sets > 0 && !sets))
        return tw_api_give_new(out, TW_ERR_USAGE,
                               "tilewise_run_file: no workflow path or bad overrides");
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
        return tw_api_give_new(out, TW_ERR_USAGE,
                               "tilewise_run_yaml: no YAML text or bad overrides");
    workflow_src w = {.name = name, .yaml = yaml, .len = len};
    return run_v1(&w, sets, n_sets, progress, log, user, report, out);
}
