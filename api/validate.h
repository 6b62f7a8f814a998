/* validate.h - `tilewise validate`'s report: the plan and the advice.
 *
 * The plan is tw_validate's (config, inputs and model checked against each
 * other; tiles, grid, batch, memory estimate). The advice follows, for
 * raster inputs (not STAC items): georeferencing (CRS, pixel size and a
 * tile's ground size; rotated, stretched or odd pixels, no CRS), value
 * ranges (each band's range after input.scale and the model's mean/std: far
 * off, very wide or flat ranges usually mean a wrong input.scale; not for
 * remote inputs, whose statistics would read every pixel), and which reader
 * decodes the pixels. Advice lines start with "warning"; they are advice for
 * a person, never errors. The text is what the command prints on stdout;
 * the library only writes it to the caller's stream.
 */
#ifndef TW_VALIDATE_H
#define TW_VALIDATE_H

#include <stdio.h>

#include "core/error.h"
#include "core/params.h"

/* Write the plan, then (when it passed) the advice and a last line
 * "advice    N warning(s)" to out; *warnings (may be NULL) receives N. On
 * error out holds the plan as far as it got; the status and message are
 * tw_validate's. */
tw_status tw_validate_report(const tw_run_params *p, FILE *out, int *warnings, tw_error *err);

#endif
