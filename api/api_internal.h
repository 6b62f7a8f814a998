/* api_internal.h - what the files of the public API (api/) share:
 * handing a status and message to the caller, the caller's run options,
 * and the workflow as a run reads it. Not installed; nothing outside api/
 * includes it.
 */
#ifndef TW_API_INTERNAL_H
#define TW_API_INTERNAL_H

#include <stddef.h>

#include "tilewise.h"
#include "core/error.h"
#include "core/params.h"
#include "model/backend.h"

#define MAX_SETS 256

/* Files an input writes at most (tw_input_result.outputs). */
#define OUTPUTS_MAX                                                                                \
    ((int)(sizeof((tw_input_result *)0)->outputs / sizeof((tw_input_result *)0)->outputs[0]))

/* The sizes of the version 2 structs: callers compiled against a later
 * header pass larger ones, and the library reads or fills what it knows. */
#define OPTIONS_V2_SIZE (offsetof(tilewise_run_options, reserved_v2) + sizeof(uint64_t))
#define RUN_SUMMARY_V2_SIZE (offsetof(tilewise_run_summary, shard_count) + sizeof(int))
#define INPUT_SUMMARY_V2_SIZE (offsetof(tilewise_input_summary, outputs) + sizeof(void *))

/* Fill *out (may be NULL) from st and e (e NULL or st TW_OK: "ok");
 * returns st. */
tilewise_status tw_api_give(tilewise_error *out, tw_status st, const tw_error *e);
/* The same with a message made here. */
tilewise_status tw_api_give_new(tilewise_error *out, tw_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The caller's options (NULL: defaults) into *o, their size checked. */
tw_status tw_api_take_options(const tilewise_run_options *in, tilewise_run_options *o,
                              tw_error *err);
/* One "run.KEY=VALUE" option (run.shard, run.quiet, ...; tilewise.h's
 * tilewise_run_options_set) into *o. TW_ERR_USAGE naming it otherwise. */
tw_status tw_api_set_run_option(tilewise_run_options *o, const char *s, tw_error *err);
/* The run options and tuning knobs of o into the run's parameters. */
void tw_api_apply_options(tw_run_params *p, const tilewise_run_options *o);
/* The caller's options into *o, then the workflow (a file, or o->yaml
 * named `workflow`) with o's overrides and options into *p (malloc'ed;
 * free it). */
tw_status tw_api_load_workflow(const char *workflow, const tilewise_run_options *opts,
                               tilewise_run_options *o, tw_run_params **p, tw_error *err);
/* The backend p asks for (runtime.device, threads, the CPU knobs). */
tw_status tw_api_backend_for(const tw_run_params *p, tw_backend *be, tw_error *err);

#endif
