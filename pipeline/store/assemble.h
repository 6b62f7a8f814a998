/* assemble.h - product assembly: the final products of an input from its
 * committed chunks (the chunk store, parts.h), which merge.c drives at the
 * end of a run that covers the whole grid and in `tilewise merge`.
 *
 * When every row of the grid is committed (by one run or by all shards),
 * tw_parts_assemble streams the chunks, in row order, through the ordinary
 * writer into the final products; the caller then removes the parts
 * (tw_parts_remove). Because chunks hold the averaged float probabilities, a
 * sharded and merged result is identical to a single run.
 */
#ifndef TW_ASSEMBLE_H
#define TW_ASSEMBLE_H

#include <stdint.h>

#include "io/output/gpkg.h"
#include "io/output/tiletable.h"
#include "io/output/writer.h"
#include "core/error.h"
#include "pipeline/store/parts.h"

/* Stream all chunks into the final products: wp describes the full grid
 * (rows 0..grid_h), may be NULL; tp (may be NULL) the tile table; gp (may be
 * NULL) the GeoPackage of tile polygons (gets the same tiles). hist
 * [n_classes] and nodata_cells receive the argmax counts of the grid. Fails with TW_ERR_INPUT
 * naming the missing rows when the grid is not complete. */
tw_status tw_parts_assemble(tw_parts *pt, const tw_writer_params *wp, const tw_tiletable_params *tp,
                            const tw_gpkg_params *gp, int64_t *hist, int64_t *nodata_cells,
                            tw_error *err);

#endif
