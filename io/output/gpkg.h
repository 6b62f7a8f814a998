/* gpkg.h - the GeoPackage of tile polygons (scene.tiles.gpkg).
 *
 * One polygon feature per classified tile (the tile's footprint in the
 * input's CRS, from its pixel origin, the tile size and the input's
 * geotransform), with fields: row, col (input pixel origin, integers),
 * class (integer, argmax), class_name (string), confidence (max probability,
 * real), and one real field per class named p_<class name> (sanitized to
 * [A-Za-z0-9_]). Layer name "tiles". Written through OGR to ".<name>.part.gpkg"
 * (the driver wants a .gpkg extension) and renamed by finish, like the
 * rasters; destroy without finish removes it.
 */
#ifndef TW_GPKG_H
#define TW_GPKG_H

#include <stdint.h>

#include "core/error.h"
#include "core/params.h"

typedef struct tw_gpkg tw_gpkg;

typedef struct tw_gpkg_params {
    const char *path; /* final path, e.g. out/scene.tiles.gpkg */
    int n_classes;
    const char (*class_names)[TW_NAME_MAX];
    int tile;               /* tile size in input pixels */
    double geotransform[6]; /* of the input raster */
    const char *crs_wkt;    /* "" or NULL: no CRS */
} tw_gpkg_params;

tw_status tw_gpkg_create(const tw_gpkg_params *p, tw_gpkg **out, tw_error *err);
/* Append n tiles: rows/cols [n] input pixel origins, probs [n][n_classes].
 * Features are written in transactions of a few thousand. */
tw_status tw_gpkg_append(tw_gpkg *g, int n, const int32_t *rows, const int32_t *cols,
                         const float *probs, tw_error *err);
tw_status tw_gpkg_finish(tw_gpkg *g, tw_error *err);
/* Removes the temporary file unless finished. Accepts NULL. */
void tw_gpkg_destroy(tw_gpkg *g);

#endif
