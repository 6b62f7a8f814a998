/* workflow.h - the YAML workflow file (see DESIGN.md) into tw_run_params.
 *
 * YAML in, params out: nothing else in tilewise reads YAML. Unknown keys,
 * wrong types and out-of-range values are TW_ERR_CONFIG with a message naming
 * the file, the line and the key path ("flow.yaml:12: tiling.stride: ...").
 * Relative paths (input.path, model.weights, output.dir) are taken relative
 * to the current directory, as a shell user expects.
 */
#ifndef TW_WORKFLOW_H
#define TW_WORKFLOW_H

#include <stddef.h>

#include "core/error.h"
#include "core/params.h"

/* Parse path into *out (starting from tw_run_default_params()), then apply
 * the overrides sets[0..n_sets) of the form "key.path=value" (value in YAML
 * syntax: "tiling.tile=32", "input.bands=[1,2,3]", "output.products=[class]").
 * An override of an unknown key is an error naming "--set key.path". */
tw_status tw_workflow_load(const char *path, const char *const *sets, int n_sets,
                           tw_run_params *out, tw_error *err);

/* Same, from a string in memory (name is used in messages). For tests/fuzzing. */
tw_status tw_workflow_parse(const char *name, const char *text, size_t len, const char *const *sets,
                            int n_sets, tw_run_params *out, tw_error *err);

/* "512MiB", "2GiB", "1.5GB", "1048576" -> bytes. Returns 0 on success, -1 on
 * a malformed or non-positive size. */
int tw_parse_bytes(const char *s, size_t *out);

#endif
