/* writer.h - output rasters written strip by strip, in raster order.
 *
 * For an input stem "scene" the writer makes, in dir, the products asked for:
 *   scene.class.tif  Byte, argmax class, nodata 255, color table, category names
 *   scene.prob.tif   one band per class (description = class name);
 *                    float32 (nodata -1) or uint8 = round(255 p) (0 where no data,
 *                    with a per-dataset mask band marking the valid cells)
 *   scene.conf.tif   float32 max probability, nodata -1
 *   scene.emb.tif    embedding_raster: emb_dim bands (emb_0..), the averaged
 *                    pooled features; float32 or float16 (GTiff NBITS=16;
 *                    beyond +-65504 clamped) with nodata NaN, or int8 (PIXELTYPE=SIGNEDBYTE, nodata
 *                    -128) with a per-band scale and offset (GDAL's
 *                    GetScale/GetOffset: value = offset + scale * q).
 *                    Band-interleaved, 256 x 16 blocks unless the creation
 *                    options say otherwise: a block is one feature, so its
 *                    bytes do not grow with emb_dim (2048 bands pixel-
 *                    interleaved would make each block 32 MiB), and every
 *                    16-row strip completes its blocks, which are flushed
 *                    at once (memory flat in the raster's height).
 * Georeferencing: the input's CRS and origin; pixel size = stride x input's.
 * Compression: unless creation_options name COMPRESS, every file is
 * TW_WRITER_DEFAULT_COMPRESS with a predictor (2 for Byte, 3 for float32;
 * COG: PREDICTOR=YES). Probability bands are never tagged as colours
 * (PHOTOMETRIC=MINISBLACK), so three classes do not look like an RGB image.
 * Files are written under temporary names (".<name>.part") and renamed only
 * by tw_writer_finish, so nothing half-written looks finished; destroy
 * without finish removes them. format COG: written as tiled GTiff first, then
 * copied by GDAL's COG driver (overviews: MODE for class, AVERAGE for
 * probabilities) at finish.
 */
#ifndef TW_WRITER_H
#define TW_WRITER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"
#include "core/params.h"

typedef struct tw_writer_params {
    const char *dir;        /* existing directory */
    const char *stem;       /* e.g. "scene" */
    int grid_w, grid_h;     /* output cells */
    double geotransform[6]; /* of the output grid */
    const char *crs_wkt;    /* "" or NULL: none */
    int n_classes;
    const char (*class_names)[TW_NAME_MAX]; /* n_classes names */
    unsigned products;                      /* TW_PRODUCT_CLASS|PROB|CONF|EMB_RASTER (others
                                               ignored) */
    int emb_dim;          /* EMB_RASTER: features per cell; they follow each cell's n_classes
                             probabilities in write_rows (0 when not asked) */
    tw_emb_type emb_type; /* float32, float16 or int8 */
    const double *emb_scale, *emb_offset; /* int8: [emb_dim] value = offset + scale * q
                                             (q in -127..127; -128 nodata); borrowed */
    tw_prob_type prob_type;
    tw_format format;
    const char (*creation_options)[128]; /* "KEY=VALUE" */
    int n_creation_options;
    const char *metadata_json;        /* resolved config etc., stored as GDAL metadata
                                         item TILEWISE_RUN (may be NULL) */
    const unsigned char (*colors)[3]; /* class colours (RGB) for the class map's colour
                                         table; NULL: the built-in palette */
    int n_colors;                     /* = n_classes when colors is set */
} tw_writer_params;

typedef struct tw_writer tw_writer;

/* The default compression (measured on the sample outputs: see the commit
 * that chose it and README, Outputs). */
#define TW_WRITER_DEFAULT_COMPRESS "DEFLATE"

/* Create the (temporary) output files. TW_ERR_OUTPUT naming the path when
 * the directory is not writable or the path is taken by a directory. */
tw_status tw_writer_create(const tw_writer_params *p, tw_writer **out, tw_error *err);

/* Write output rows [row0, row0 + n_rows) (must follow the previous call's
 * rows: raster order). probs [n_rows][grid_w][n_classes + emb_dim] averaged
 * probabilities; has [n_rows][grid_w] 1 where the cell was classified, 0 for
 * nodata. Allocates nothing after the first call. */
tw_status tw_writer_write_rows(tw_writer *w, int row0, int n_rows, const float *probs,
                               const uint8_t *has, tw_error *err);

/* Flush, compute statistics, (COG) convert, rename to the final names.
 * All rows must have been written. */
tw_status tw_writer_finish(tw_writer *w, tw_error *err);

/* Release; removes the temporary files if finish did not succeed. Accepts NULL. */
void tw_writer_destroy(tw_writer *w);

/* The colour of class i in the class map's colour table: colors[i] when
 * i < n_colors, else the built-in palette's. Cannot fail; thread-safe. */
void tw_writer_class_rgb(const unsigned char (*colors)[3], int n_colors, int i,
                         unsigned char rgb[3]);

/* Final path of a product file ("<dir>/<stem>.class.tif", ...). */
void tw_writer_product_path(const char *dir, const char *stem, const char *product, char *out,
                            size_t out_size);

#endif
