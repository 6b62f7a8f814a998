/* report.h - what a run did, as data and as text: the run's result
 * (tw_run_result, which tw_run and tw_merge fill and the C API and Python
 * hand out), run.json (report.c), the attempts log, and the resolved
 * configuration's JSON that every product carries in its metadata.
 */
#ifndef TW_REPORT_H
#define TW_REPORT_H

#include <stddef.h>
#include <stdint.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/params.h"
#include "model/backend.h"
#include "pipeline/engine/budget.h"
#include "pipeline/resolved.h"
#include "pipeline/result.h"

typedef struct tw_run_result {
    tw_resolved model;
    char backend[16];
    tw_budget budget;
    tw_backend_stats backend_stats;
    int n_inputs;
    tw_input_result *inputs; /* [n_inputs] */
    double seconds;
    size_t peak_rss; /* the process's (VmHWM): in a process that runs other
                        things too, more than this run's */
    /* This run's allocator peaks per tag and in all ([TW_MEM_TAG_COUNT]):
     * its own blocks only (core/alloc.h, tw_mem_scope). */
    size_t mem_peak[TW_MEM_TAG_COUNT + 1];
    int64_t tiles_classified;
    int inputs_skipped; /* inputs not opened (input.on_error: skip); the CLI exits 5 */
    /* Every warning given before the first tile, in the order logged: the
     * output checks' (free disk space, skipped inputs) then advice.h's. */
    tw_advice advice;
} tw_run_result;

/* Release a result (tw_run, tw_merge); accepts NULL. */
void tw_run_result_destroy(tw_run_result *r);

/* run.json for params p and result r, as text: *json (NUL-terminated,
 * from tw_alloc: free it with tw_free) and its length. TW_ERR_NOMEM, or
 * TW_ERR_INTERNAL when it would be cut short; *json NULL then. */
tw_status tw_report_render(const tw_run_params *p, const tw_run_result *r, tw_status status,
                           const char *message, char **json, size_t *len, tw_error *err);
/* Write run.json for params p and result r to path (atomically: temp + rename). */
tw_status tw_report_write(const char *path, const tw_run_params *p, const tw_run_result *r,
                          tw_status status, const char *message, tw_error *err);
/* Append one line (a JSON object: UTC time, status, exit code, message,
 * shard, tiles classified, seconds, the report's path) for this attempt to
 * out_dir/.tilewise/attempts.jsonl, creating it. One write(2) with
 * O_APPEND, so that concurrent shards do not interleave lines. r may be
 * NULL (a run that failed before its result). TW_ERR_OUTPUT on failure. */
tw_status tw_report_log_attempt(const char *out_dir, const tw_run_params *p, const tw_run_result *r,
                                tw_status status, const char *message, const char *report_path,
                                tw_error *err);

/* The resolved configuration as a JSON object (for GDAL metadata: the keys
 * an output byte depends on, core/keys.h TW_KEY_BYTES, and the versions;
 * run.json's "config" has every key). Returns
 * the length it needed: size or more means it was cut (the run refuses to
 * go on with a cut one). TW_CONFIG_JSON_MAX (pipeline/resolved.h) holds any
 * configuration that params.h's limits allow. */
size_t tw_report_config_json(const tw_run_params *p, const tw_resolved *m, char *buf, size_t size);

#endif
