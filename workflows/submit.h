/* submit.h - `tilewise submit`: a workflow as a SLURM job array plus a merge job.
 *
 * The array job runs `tilewise run WORKFLOW` in N tasks; each task takes its
 * shard (band of output rows) from SLURM's array variables. A merge job,
 * queued with --dependency=afterok on the array, runs `tilewise merge` on the
 * output directory once every task has succeeded.
 *
 * Both scripts are bash. Every path and --set value in them is single-quoted
 * ('\'' for a quote), so any character (spaces, quotes, $, backticks,
 * newlines) reaches tilewise unchanged. Log paths in the #SBATCH lines are
 * relative (tilewise-%A_%a.out, ...): sbatch is run in the log directory
 * <output.dir>/.tilewise-slurm/, which is then the jobs' working directory,
 * so an output directory of any name needs no escaping in an #SBATCH line.
 * (Not under <output.dir>/.tilewise/: every directory there is an input's
 * parts, which merge would try to read.)
 * The scripts cd back to the directory submit was run from before starting
 * tilewise, so relative --set values mean what they meant on the command line.
 *
 * Time limits: the array asks for SIGUSR1 30 s before its limit on the batch
 * shell (--signal=B:USR1@30). The script forwards it to tilewise, which
 * keeps every tile classified and exits 75 within 10 s (pipeline/engine/stages.h);
 * the task then requeues itself
 * (scontrol requeue) and resumes from the committed rows. SIGTERM (scancel)
 * is forwarded too but never requeues.
 *
 * GPUs: runtime.device cuda or cuda:N asks for one GPU per task
 * (--gres=gpu:1); auto and cpu ask for none (a GPU partition is then the
 * user's --sbatch choice). SLURM shows a task only its granted GPU, as
 * cuda:0, so cuda:N with N > 0 runs as --set runtime.device=cuda.
 */
#ifndef TW_SUBMIT_H
#define TW_SUBMIT_H

#include <stdbool.h>
#include <stdio.h>

#include "tilewise.h"

#define TW_SUBMIT_MAX_ARRAY 10000

typedef struct tw_submit_params {
    const char *workflow;    /* WORKFLOW.yaml as given (relative to cwd) */
    const char *const *sets; /* "key.path=value" overrides, passed on to run */
    int n_sets;
    int array;                      /* number of array tasks, 1..TW_SUBMIT_MAX_ARRAY */
    int chunk_rows;                 /* passed to run as --chunk-rows; 0: run's default */
    bool dry_run;                   /* print the scripts, submit nothing */
    const char *tilewise;           /* absolute path of the tilewise binary to run */
    const char *sbatch;             /* sbatch program: a name looked up in PATH, or a path */
    const char *const *sbatch_opts; /* extra sbatch options for both jobs ("--time=2:00:00") */
    int n_sbatch_opts;
} tw_submit_params;

/* Defaults: array 0 (must be set), sbatch "sbatch", nothing else. Cannot fail. */
tw_submit_params tw_submit_default_params(void);

/* Write s into buf single-quoted for bash/sh ('it'\''s'). Returns the
 * length the quoted text needs (excluding the NUL), like snprintf: the
 * result is complete when that is < size. */
size_t tw_shell_quote(const char *s, char *buf, size_t size);

/* Build the two job scripts for job (tilewise_check of sp->workflow)
 * as submit would write them, with cwd the directory submit runs in (for
 * relative paths) and array_job_id the id the merge job waits on (dry runs
 * pass a placeholder). *array_script and *merge_script are malloc'ed; the
 * caller frees them. TILEWISE_ERR_USAGE for an array count out of range,
 * TILEWISE_ERR_NOMEM when memory runs out. */
tilewise_status tw_submit_scripts(const tw_submit_params *sp, const tilewise_job *job,
                                  const char *cwd, const char *array_job_id, char **array_script,
                                  char **merge_script, tilewise_error *err);

/* Submit (or, with sp->dry_run, print) the jobs for job. Messages and
 * job ids go to out. Errors: TILEWISE_ERR_USAGE for bad parameters, TILEWISE_ERR_OUTPUT
 * when the scripts cannot be written under <output.dir>/.tilewise-slurm/,
 * TILEWISE_ERR_DEVICE when the scheduler is missing or refuses a job (sbatch not
 * found, exits non-zero or prints no job id; its stderr is in the message). */
tilewise_status tw_submit(const tw_submit_params *sp, const tilewise_job *job, FILE *out,
                          tilewise_error *err);

/* The `tilewise submit` command: argv after "submit". Returns the process
 * exit code (README.md, "Exit codes"); a missing or failing sbatch is 4. */
int tw_cli_submit(int argc, char **argv);

#endif
