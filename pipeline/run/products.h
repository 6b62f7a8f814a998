/* products.h - the end of every run that covers an input's whole grid, and
 * of `tilewise merge`: the input's committed chunks (pipeline/store/) into
 * its final products (io/output/: rasters on the cell grid or resampled
 * onto the input's, the tile table, the GeoPackages, the polygons), then
 * the parts removed. run.c and merge.c both call down into it; it calls
 * neither. */
#ifndef TW_RUN_PRODUCTS_H
#define TW_RUN_PRODUCTS_H

#include <stdbool.h>
#include <stddef.h>

#include "core/error.h"
#include "core/params.h"
#include "core/products.h"
#include "io/input/raster.h"
#include "pipeline/resolved.h"
#include "pipeline/result.h"
#include "pipeline/store/parts.h"

/* Embedding values per output cell the stitcher and the parts carry after
 * the probabilities: the features when embedding_raster is asked, else 0. */
static inline int tw_run_cell_emb(unsigned products, int feat_dim)
{
    return (products & TW_PRODUCT_EMB_RASTER) ? feat_dim : 0;
}

/* Whether chunks keep per-tile records: the tile table and the GeoPackage
 * are both made from them. */
static inline bool tw_run_keeps_tiles(unsigned products)
{
    return (products & (TW_PRODUCT_TILES | TW_PRODUCT_EMB | TW_PRODUCT_TILES_GPKG)) != 0;
}

/* Every row of parts is committed: write the input's final
 * products as p asks (rasters on the cell grid or resampled onto the
 * input's, the tile table, the GeoPackage) into p->output.dir as
 * res->stem.*, with config_json as their metadata, then remove the parts.
 * source: the raster as the run opened it (its own nodata stays nodata at
 * output.resolution: input; NULL: not read again).
 * room: what the polygons' regions may take (tw_budget_assembly_room, the
 * number validate shows). Fills res->hist, res->nodata_cells and
 * res->outputs. p, m, info and config_json are borrowed; parts stays the
 * caller's to close. */
tw_status tw_products_assemble(const tw_run_params *p, const tw_resolved *m,
                               const tw_raster_info *info, const char *source,
                               const char *config_json, size_t room, tw_parts *parts,
                               tw_input_result *res, tw_error *err);

/* After res's products are final: the files of res->stem in
 * p->output.dir that a run of some configuration writes (the rasters, the
 * tile table, the GeoPackages, the polygons, the STAC item) but this one did
 * not (not in res->outputs) into res->stale, and their count. They are left
 * where they are: a file of that name may be the user's, and removing it is
 * worse than naming it (the run logs them; run.json lists them). */
int tw_products_stale(const tw_run_params *p, tw_input_result *res);

/* Every file name a product (or, with stac, the STAC item) may have after
 * "<stem>", in core/products.h's file order; returns their count. */
#define TW_PRODUCT_SUFFIXES_MAX (TW_PRODUCT_COUNT * 2 + 1)
int tw_products_suffixes(const char **suffixes, bool stac);

#endif
