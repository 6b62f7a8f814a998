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

#include "io/writer.h"
#include "core/error.h"

/* cells_prob: the cell grid's probabilities (n_classes bands). wp: the
 * products to write, its grid = the input's size and geotransform (north
 * up: TW_ERR_CONFIG naming output.resolution otherwise). hist [n_classes]
 * and nodata_cells (may be NULL) receive the argmax counts of the written
 * pixels. */
tw_status tw_resample_to_input(const char *cells_prob, const tw_writer_params *wp, int64_t *hist,
                               int64_t *nodata_pixels, tw_error *err);

#endif
