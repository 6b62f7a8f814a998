/* run_hooked.c - `tilewise run WORKFLOW -q` with the CUDA backend's
 * allocation-failure test hook, which the public API does not carry
 * (issue 28: test hooks leave tilewise.h; it was a field of
 * tilewise_run_options, set by the CLI from TW_CUDA_FAIL_ALLOC_ABOVE).
 * bench/gpu_memory_sweep.py part 2 runs it.
 *
 *   run_hooked WORKFLOW BYTES
 *
 * Runs the workflow through the library's own run (pipeline/run/run.h) with
 * every device arena larger than BYTES failing as if the device were full
 * (cuda/README.md, "Test hook"), notices on stderr as the CLI prints them,
 * and writes run.json into output.dir as the CLI does. On a CPU run the
 * hook has nothing to act on. Exit 0, 1 (the run failed: the message on
 * stderr) or 2 (usage).
 */
#include <stdio.h>
#include <stdlib.h>

#include "config/workflow.h"
#include "pipeline/run/run.h"

static void to_stderr(tw_log_level level, const char *msg, void *user)
{
    (void)user;
    fprintf(stderr, "tilewise: %s%s\n", level == TW_LOG_WARNING ? "warning: " : "", msg);
}

int main(int argc, char **argv)
{
    char *end = NULL;
    unsigned long long bytes = argc == 3 ? strtoull(argv[2], &end, 10) : 0;
    if (argc != 3 || !end || *end || bytes == 0) {
        fprintf(stderr, "usage: run_hooked WORKFLOW BYTES (device arenas above BYTES fail)\n");
        return 2;
    }
    tw_error err;
    tw_error_init(&err);
    tw_run_params p;
    if (tw_workflow_load(argv[1], NULL, 0, &p, &err) != TW_OK) {
        fprintf(stderr, "tilewise: %s\n", err.msg);
        return 1;
    }
    p.runtime.cuda_fail_above = (size_t)bytes;
    tw_run_hooks hooks = {.log = {.fn = to_stderr}};
    tw_run_result *r = NULL;
    tw_status st = tw_run(&p, &hooks, &r, &err);
    char path[TW_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/run.json", p.output.dir);
    tw_error werr;
    tw_error_init(&werr);
    if (tw_report_write(path, &p, r, st, st == TW_OK ? NULL : err.msg, &werr) != TW_OK)
        fprintf(stderr, "tilewise: %s\n", werr.msg);
    if (st != TW_OK) fprintf(stderr, "tilewise: %s\n", err.msg);
    tw_run_result_destroy(r);
    return st == TW_OK ? 0 : 1;
}
