/* tiletable.h - the HDF5 tile table (scene.tiles.h5).
 *
 * Layout (all datasets chunked along the tile axis, deflate level 4):
 *   /origin         int32 [n_tiles][2]   input pixel (row, col) of each tile's top-left
 *   /probabilities  float32 [n_tiles][n_classes]   not when n_classes is 0 (a
 *                   headless backbone's table: embeddings only, no classes attribute)
 *   /embeddings     float32 [n_tiles][feat_dim]   only when feat_dim > 0
 *   root attributes: crs_wkt (string), geotransform (double[6], of the input),
 *                    tile, stride (int), classes (string array)
 * Only classified tiles are listed. Written to "<path>.part" and renamed by
 * finish, like the rasters.
 */
#ifndef TW_TILETABLE_H
#define TW_TILETABLE_H

#include <stdint.h>

#include "core/error.h"
#include "core/params.h"

typedef struct tw_tiletable tw_tiletable;

typedef struct tw_tiletable_params {
    const char *path; /* final path */
    int n_classes;
    const char (*class_names)[TW_NAME_MAX];
    int feat_dim; /* 0: no embeddings */
    int tile, stride;
    double geotransform[6]; /* of the input raster */
    const char *crs_wkt;
} tw_tiletable_params;

tw_status tw_tiletable_create(const tw_tiletable_params *p, tw_tiletable **out, tw_error *err);
/* Append n tiles. rows/cols [n], probs [n][n_classes], emb [n][feat_dim] or NULL. */
tw_status tw_tiletable_append(tw_tiletable *t, int n, const int32_t *rows, const int32_t *cols,
                              const float *probs, const float *emb, tw_error *err);
tw_status tw_tiletable_finish(tw_tiletable *t, tw_error *err);
/* Removes the temporary file unless finished. Accepts NULL. */
void tw_tiletable_destroy(tw_tiletable *t);

#endif
