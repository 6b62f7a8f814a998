/* resample.h - output.resolution: input. The products at the input's pixel
 * grid, made from the cell grid's probabilities.
 *
 * The cell-grid probabilities (a float32 GeoTIFF, one band per class, nodata
 * -1, its geotransform the input's scaled by the stride) are warped by GDAL
 * with bilinear resampling onto the input's grid (its size and geotransform
 * exactly; nodata cells are left out of the interpolation, and the pixels
 * inside a nodata cell stay nodata), read strip by strip and handed to the
 * ordinary writer, which makes every product from them: the class map is the
 * argmax of the resampled probabilities, so at a cell's centre it is that
 * cell's class. Memory: one strip of rows of the input's width.
 */
#ifndef TW_RESAMPLE_H
#define TW_RESAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include "io/input/raster.h"
#include "io/output/writer.h"
#include "core/error.h"

/* The input itself, read again strip by strip beside the resampled rows:
 * a pixel that is nodata in the input (the run's rule: raster.h,
 * tw_raster_set_nodata) is nodata in every product, whatever the cells
 * around it say. */
typedef struct tw_resample_input {
    const char *path; /* the raster as the run opened it; NULL: no input mask */
    const int *bands; /* the run's bands (n_bands 0: all) */
    int n_bands;
    bool nodata_auto; /* input.nodata: auto (the raster's own), else nodata */
    double nodata;
} tw_resample_input;

/* cells_prob: the cell grid's probabilities (n_classes bands). wp: the
 * products to write, its grid = the input's size and geotransform (north
 * up: TW_ERR_CONFIG naming output.resolution otherwise). in (may be NULL):
 * the input's own nodata, as above; TW_ERR_INPUT naming it when it cannot
 * be read. hist [n_classes] and nodata_pixels (may be NULL) receive the
 * argmax counts and the nodata count of the written pixels; unclassified
 * (may be NULL) the pixels valid in the input that no classified tile
 * covers (their tiles had too much nodata, or were unreadable or outside
 * input.aoi): nodata in the products. Memory: a strip of the input's rows
 * beside the probabilities'. */
tw_status tw_resample_to_input(const char *cells_prob, const tw_writer_params *wp,
                               const tw_resample_input *in, int64_t *hist, int64_t *nodata_pixels,
                               int64_t *unclassified, tw_error *err);

#endif
