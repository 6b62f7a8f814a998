/* validate.h - `tilewise validate`'s listing, one rendering of the plan and
 * the advice (pipeline/run/validate.h: tw_validation).
 *
 * The plan is tw_validate's (config, inputs and model checked against each
 * other; tiles, grid, batch, memory estimate), the advice every run also
 * gives (pipeline/run/advice.h): georeferencing, value ranges, padding, and
 * which reader decodes the pixels. Warning lines start with "warning"; they
 * are advice for a person, never errors. The C API hands the same data out
 * through its accessors; the library only writes text to a caller's stream.
 */
#ifndef TW_VALIDATE_H
#define TW_VALIDATE_H

#include <stdio.h>

#include "core/error.h"
#include "core/params.h"
#include "pipeline/run/validate.h"

/* tw_validate, with GDAL's process-wide block cache limit as the caller had
 * it afterwards (tw_validate sets the run's for the advice's reads). */
tw_status tw_validate_collect(const tw_run_params *p, tw_validation *v, tw_error *err);

/* Write v as the command prints it: the model, each input planned, batch,
 * readers and memory, the output checks' warnings, "ok", then the advice
 * and a last line "advice    N warning(s)" (N: every warning, the output
 * checks' included). A plan that failed is written as far as it got. */
void tw_validate_write(const tw_validation *v, FILE *out);

#endif
