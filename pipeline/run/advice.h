/* advice.h - what a person should look at before the first tile, as data.
 *
 * Advice is not an error: a run with advice is a valid run. But a wrong
 * input.scale, a raster without a CRS or tiles that are mostly padding give
 * a class map that looks fine and is wrong, so `tilewise validate` and every
 * run (CLI, C API, Python, QGIS) compute the same advice here, before the
 * first tile: run logs each warning, puts them in run.json and the returned
 * report, and under --strict (tw_run_params.strict) refuses to start.
 *
 * For raster inputs (not STAC items): georeferencing (no geotransform or
 * CRS, rotated, stretched or odd pixels, geographic tiles of many km), tiles
 * that are more padding than raster, and each band's mean and range after
 * input.scale and the model's mean/std (a mean outside +-3, very wide or flat
 * ranges are the classic wrong-input.scale symptoms; the scale hint is
 * computed from the band means, one per raster unless no one scale suits
 * every band (KEYS.md, input.scale); not for remote inputs). Notes are facts for validate's listing
 * (the CRS and pixel size, how many bands fit, which reader decodes), never warnings.
 * The list's types (tw_advice) are pipeline/result.h's: a run's result carries it.
 */
#ifndef TW_ADVICE_H
#define TW_ADVICE_H

#include <stdbool.h>

#include "core/error.h"
#include "core/params.h"
#include "pipeline/result.h"

/* The advice for p's inputs with the resolved model m into *a (cleared
 * first; beyond TW_ADVICE_MAX items the rest are dropped). An input that
 * cannot be inspected gets no advice (the run's own checks report it).
 * Reads each raster's header and approximate band statistics (GDAL's
 * stored ones, else a bounded sample: io/input/inspect.h); writes nothing. Cannot fail. */
struct tw_resolved;
void tw_advice_collect(const tw_run_params *p, const struct tw_resolved *m, tw_advice *a);

/* The share of the pixels of a width x height raster's tiles (tile, stride,
 * edge mode: the plan a run makes) that lie outside the raster: padding,
 * 0 after normalization (edge pad, and any raster smaller than a tile).
 * In [0, 1); -1 when no plan can be made (edge skip on a raster smaller
 * than a tile, a stride that does not divide the tile). Allocates nothing. */
double tw_advice_padding(int width, int height, int tile, int stride, tw_edge_mode edge);

#endif
