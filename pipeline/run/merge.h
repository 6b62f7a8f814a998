/* merge.h - `tilewise merge`: the final products of sharded runs from
 * their parts (merge.c).
 */
#ifndef TW_MERGE_H
#define TW_MERGE_H

#include <signal.h>
#include <stdbool.h>

#include "core/error.h"
#include "pipeline/report/report.h"

/* `tilewise merge`: after sharded runs into out_dir, check that every
 * output row of every input is committed, then write the final products
 * (as the workflow asked: GTiff or COG, tile table) and remove the parts.
 * TW_ERR_INPUT naming the missing rows when a shard has not finished.
 * Merged already (no parts left, final products there): TW_OK and no input
 * in *result. */
tw_status tw_merge(const char *out_dir, bool quiet, tw_run_result **result, tw_error *err);
/* The same with a stop flag (NULL: none; the CLI's SIGINT/SIGTERM): once it
 * is set, no further input is assembled (the one under way finishes, its
 * parts removed as usual) and the merge returns TW_CANCELLED, the inputs
 * left still in their parts: the same merge again finishes them. */
tw_status tw_merge_ex(const char *out_dir, bool quiet, const volatile sig_atomic_t *stop,
                      tw_run_result **result, tw_error *err);

#endif
