/* stac_run.h - output.stac in a run and in `tilewise merge`: what each
 * input's STAC item says besides its files (its datetime, the STAC item it
 * came from), resolved before the first tile, and the items and the
 * collection written (io/output/stac_out.h) once the products they describe are
 * final.
 *
 * The datetime of an input, first found of: its STAC item's datetime
 * (input.assets), its raster's acquisition metadata (ACQUISITIONDATETIME,
 * TIFFTAG_DATETIME, ...: tw_stac_raster_datetime), input.datetime. None:
 * TW_ERR_CONFIG before the first tile, naming the input and the key.
 */
#ifndef TW_STAC_RUN_H
#define TW_STAC_RUN_H

#include <stdbool.h>

#include "io/input/raster.h"
#include "io/input/stac.h"
#include "io/output/stac_out.h"
#include "core/error.h"
#include "core/params.h"
#include "pipeline/report/report.h"
#include "pipeline/resolved.h"
#include "pipeline/result.h"

/* Resolve input i's STAC facts into *out. gdal_source: what the run opens
 * (a GDAL path; NULL: do not look at the raster's metadata); stac: its
 * STAC item, or NULL. TW_ERR_CONFIG naming the input and input.datetime
 * when no datetime is known. Thread-safe. */
tw_status tw_stac_run_input(const tw_run_params *p, int i, const char *gdal_source,
                            const tw_stac *stac, tw_stac_input *out, tw_error *err);

/* The collection's id for out_dir ("tilewise-<folder name>"). */
void tw_stac_run_collection_id(const char *out_dir, char *out, size_t size);

/* Before an input's products are (re)written: remove its item (and, with
 * collection, the directory's collection.json), so that none describes
 * files being replaced. */
tw_status tw_stac_run_forget(const tw_run_params *p, const char *stem, bool collection,
                             tw_error *err);

/* Write res's item into p->output.dir from the files res->outputs lists
 * (then appends the item's path to res->outputs). collection_id: NULL, or
 * the id of the collection the run writes. */
tw_status tw_stac_run_item(const tw_run_params *p, const tw_resolved *m, const tw_raster_info *info,
                           const tw_stac_input *si, const char *collection_id, tw_input_result *res,
                           tw_error *err);

/* collection.json in out_dir over the items of r's inputs that have one. */
tw_status tw_stac_run_collection(const char *out_dir, const tw_resolved *m, const tw_run_result *r,
                                 tw_error *err);

#endif
