/* shard.h - which shard this process runs: `--shard I/N` or `--shard auto`
 * (the array index of the batch system that started it). Without --shard a
 * run is a whole run, inside an array task too (a job script that runs one
 * scene per task must not lose rows silently).
 *
 * The CLI reads the environment; this module only interprets what it is
 * given (get(name) returns a variable's value or NULL), so tests can hand it
 * any scheduler's variables. Array indices, as each system documents them:
 *   SLURM       SLURM_ARRAY_TASK_ID, _MIN (first id), _STEP, _COUNT
 *   AWS Batch   AWS_BATCH_JOB_ARRAY_INDEX (from 0), AWS_BATCH_JOB_ARRAY_SIZE
 *   Kubernetes  JOB_COMPLETION_INDEX (indexed Jobs, from 0): the count is the
 *               Job's completions, given as --shard auto/N
 *   PBS Pro     PBS_ARRAY_INDEX (qsub -J 1-N: from 1); count from auto/N
 *   LSF         LSB_JOBINDEX (bsub -J "name[1-N]": from 1; 0 outside an
 *               array); count from auto/N
 * The first of these that is set decides; any other that is set must name
 * the same shard; N, when given with auto, must agree with a count the
 * system states.
 */
#ifndef TW_SHARD_H
#define TW_SHARD_H

#include <stdbool.h>
#include <stddef.h>

typedef const char *(*tw_shard_getenv)(const char *name, void *user);

/* arg "I/N", "auto" or "auto/N" (arg NULL: no --shard given: shard 1 of 1,
 * whatever the environment holds). On success *index
 * (0-based) and *count are set, and *from names where they came from
 * ("--shard", "SLURM", "AWS Batch", ...). Returns 0, or -1 with one line in
 * msg naming the argument or the variable and what was expected. */
int tw_shard_resolve(const char *arg, tw_shard_getenv get, void *user, int *index, int *count,
                     const char **from, char *msg, size_t msg_size);

/* Whether this process is an array task of a batch system (its index
 * variable is set): true and "SLURM array task (SLURM_ARRAY_TASK_ID=3)" in
 * what, for the note a whole run gives there. */
bool tw_shard_array_task(tw_shard_getenv get, void *user, char *what, size_t what_size);

#endif
