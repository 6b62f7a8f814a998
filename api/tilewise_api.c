/* tilewise_api.c - the public C API's door (include/tilewise.h): statuses
 * and errors, the run options, the workflow as a run reads it, GDAL
 * configuration and `tilewise info`. The rest of the API: runs, merges and
 * their reports (run_api.c), validation (validate.c), models and tiles in
 * memory (model_api.c); api_internal.h is what they share.
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
#include "pipeline/engine/stitch.h"
#include "api/api_internal.h"
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

/* ---- status and errors ---- */

const char *tilewise_status_name(int status)
{
    return tw_status_name((tw_status)status);
}

int tilewise_exit_code(int status)
{
    return tw_status_exit_code((tw_status)status);
}

/* The public exit codes are the internal ones (core/error.h). */
_Static_assert((int)TILEWISE_EXIT_OK == (int)TW_EXIT_OK &&
                   (int)TILEWISE_EXIT_INTERNAL == (int)TW_EXIT_INTERNAL &&
                   (int)TILEWISE_EXIT_USAGE == (int)TW_EXIT_USAGE &&
                   (int)TILEWISE_EXIT_INPUT == (int)TW_EXIT_INPUT &&
                   (int)TILEWISE_EXIT_RESOURCE == (int)TW_EXIT_RESOURCE &&
                   (int)TILEWISE_EXIT_SKIPPED == (int)TW_EXIT_SKIPPED &&
                   (int)TILEWISE_EXIT_PARTS == (int)TW_EXIT_PARTS &&
                   (int)TILEWISE_EXIT_LOCKED == (int)TW_EXIT_LOCKED &&
                   (int)TILEWISE_EXIT_INTERRUPTED == (int)TW_EXIT_INTERRUPTED,
               "tilewise.h's exit codes are core/error.h's");

void tilewise_redact(const char *text, char *out, size_t size)
{
    if (!out || size == 0) return;
    tw_url_redact(text ? text : "", out, size);
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
tilewise_status tw_api_give(tilewise_error *out, tw_status st, const tw_error *e)
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

tilewise_status tw_api_give_new(tilewise_error *out, tw_status st, const char *fmt, ...)
{
    tw_error e;
    tw_error_init(&e);
    va_list ap;
    va_start(ap, fmt);
    char msg[TW_ERROR_MSG_MAX];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tw_error_set(&e, st, "%s", msg);
    return tw_api_give(out, st, &e);
}

tilewise_status tilewise_config_set(const char *key, const char *value, tilewise_error *out)
{
    if (!key || !*key) return tw_api_give_new(out, TW_ERR_USAGE, "tilewise_config_set: no key");
    CPLSetConfigOption(key, value);
    return tw_api_give(out, TW_OK, NULL);
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
tw_status tw_api_set_run_option(tilewise_run_options *o, const char *s, tw_error *err)
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
        if (sscanf(v, "%d%c", &a, &extra) != 1 || a < 1 || a > TILEWISE_CHUNK_ROWS_MAX)
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
        return tw_api_give_new(
            out, TW_ERR_USAGE,
            "tilewise_run_options_set: no options (or not initialized) or no text");
    tw_error err;
    tw_error_init(&err);
    if (strncmp(kv, "run.", 4) != 0)
        return tw_api_give_new(out, TW_ERR_USAGE, "'%s' is not a run option (run.KEY=VALUE)", kv);
    return tw_api_give(out, tw_api_set_run_option(o, kv, &err), &err);
}

/* The first step of every entry point that takes options: *err initialized,
 * and the caller's options, checked, into *o (defaults where the caller's
 * struct is shorter). */
tw_status tw_api_take_options(const tilewise_run_options *in, tilewise_run_options *o,
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
    if (o->chunk_rows < 0 || o->chunk_rows > TILEWISE_CHUNK_ROWS_MAX)
        return tw_error_set(err, TW_ERR_USAGE,
                            "tilewise_run_options: chunk_rows %d (0 for the default, or 1 to %d)",
                            o->chunk_rows, TILEWISE_CHUNK_ROWS_MAX);
    const int knobs[] = {o->tiff_direct, o->cpu_winograd, o->cpu_gemm, o->cpu_nhwc};
    static const char *const names[] = {"tiff_direct", "cpu_winograd", "cpu_gemm", "cpu_nhwc"};
    for (int k = 0; k < 4; k++)
        if (knobs[k] < -1 || knobs[k] > (k == 1 ? 2 : 1))
            return tw_error_set(err, TW_ERR_USAGE, "tilewise_run_options: %s %d (-1 default, %s)",
                                names[k], knobs[k], k == 1 ? "0, 1 or 2" : "0 or 1");
    return TW_OK;
}

/* The options the workflow does not hold, onto the parsed params. */
void tw_api_apply_options(tw_run_params *p, const tilewise_run_options *o)
{
    p->shard_index = o->shard_index;
    p->shard_count = o->shard_count;
    snprintf(p->shard_from, sizeof p->shard_from, "%s",
             o->shard_from        ? o->shard_from
             : o->shard_count > 1 ? "run.shard"
                                  : "none");
    p->chunk_rows = o->chunk_rows;
    p->quiet = o->quiet != 0;
    p->restart = o->restart != 0;
    p->strict = o->strict != 0;
    if (o->report_path) snprintf(p->report_path, sizeof p->report_path, "%s", o->report_path);
    if (o->tiff_direct >= 0) p->input.tiff_direct = o->tiff_direct != 0;
    if (o->cpu_winograd >= 0) p->runtime.cpu_winograd = o->cpu_winograd;
    if (o->cpu_gemm >= 0) p->runtime.cpu_gemm = o->cpu_gemm;
    if (o->cpu_nhwc >= 0) p->runtime.cpu_nhwc = o->cpu_nhwc;
}

/* The run's hooks to the caller's callbacks (user: the options). */
/* The caller's options into *o (take_options), then the workflow (a file,
 * or o->yaml named `workflow`) with o's overrides and options into *p
 * (malloc'ed; free it). */
tw_status tw_api_load_workflow(const char *workflow, const tilewise_run_options *opts,
                               tilewise_run_options *o, tw_run_params **p, tw_error *err)
{
    *p = NULL;
    tw_status st = tw_api_take_options(opts, o, err);
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
    tw_api_apply_options(q, o);
    *p = q;
    return TW_OK;
}

/* ---- info ---- */

tilewise_status tilewise_info(const char *path, const tilewise_run_options *opts, int json,
                              char **text, tilewise_error *out)
{
    if (text) *text = NULL;
    tw_error err;
    tilewise_run_options o;
    tw_status st = tw_api_take_options(opts, &o, &err);
    if (st == TW_OK && (!path || !text))
        st = tw_error_set(&err, TW_ERR_USAGE, "tilewise_info: no path or no place for the text");
    /* A PyTorch checkpoint gets the export hint a run gives. */
    if (st == TW_OK) st = tw_preflight_weights(path, &err);
    if (st != TW_OK) return tw_api_give(out, st, &err);
    tw_run_params d = tw_run_default_params();
    tw_api_apply_options(&d, &o);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return tw_api_give_new(out, TW_ERR_NOMEM, "out of memory");
    st = tw_info_write(path, json != 0, d.input.tiff_direct, f, &err);
    if (fclose(f) != 0 && st == TW_OK) st = tw_error_set(&err, TW_ERR_NOMEM, "out of memory");
    if (st == TW_OK)
        *text = buf;
    else
        free(buf);
    return tw_api_give(out, st, &err);
}

void tilewise_string_free(char *s)
{
    free(s);
}
