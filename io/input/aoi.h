/* aoi.h - an area of interest: which tiles of a plan touch its polygons.
 *
 * input.aoi names a vector file (any OGR format: GeoPackage, Shapefile,
 * GeoJSON, ...; any CRS). Its geometries are reprojected to the raster's CRS
 * and rasterized (ALL_TOUCHED) onto a grid of cells of `stride` input pixels
 * over the raster (coarser when that grid would exceed 4 M cells), and a
 * tile is inside when any cell it covers is set: every tile whose footprint
 * touches a polygon is inside; a tile that is inside may miss a polygon by
 * less than one cell only when its edges do not fall on cell edges
 * (tiling.edge: shift, or a coarsened grid). Tiles outside are not read nor
 * classified: nodata in every output, counted in run.json.
 *
 * The tile grid comes from the caller as per-axis tile origins, so this
 * module does not depend on the tiling plan.
 */
#ifndef TW_AOI_H
#define TW_AOI_H

#include <stdbool.h>
#include <stdint.h>

#include "io/input/raster.h"
#include "core/error.h"

typedef struct tw_aoi tw_aoi;

/* Where the tiles are: tile (tx, ty) covers input pixels
 * [x0[tx], x0[tx] + tile) x [y0[ty], y0[ty] + tile). */
typedef struct tw_aoi_geometry {
    int tile, stride;
    int n_x, n_y;
    const int *x0; /* [n_x] */
    const int *y0; /* [n_y] */
} tw_aoi_geometry;

/* Read path and compute which tiles are inside. info: the raster (size,
 * geotransform, CRS). TW_ERR_INPUT naming input.aoi and the path when the
 * file cannot be opened as a vector file, holds no geometry, or cannot be
 * reprojected (for instance a raster without a CRS and an AOI with one);
 * TW_ERR_NOMEM. *out owned by the caller (tw_aoi_destroy). */
tw_status tw_aoi_create(const char *path, const tw_raster_info *info, const tw_aoi_geometry *g,
                        tw_aoi **out, tw_error *err);

/* Is tile (tx, ty) inside? Out-of-range tiles are outside. Thread-safe
 * (read only), allocates nothing. */
bool tw_aoi_tile(const tw_aoi *a, int tx, int ty);

/* Number of tiles inside. */
int64_t tw_aoi_count(const tw_aoi *a);

/* Accepts NULL. */
void tw_aoi_destroy(tw_aoi *a);

#endif
