/* polygons.h - the class map as vector features (products: [polygons]).
 *
 * From a class raster (Byte, nodata 255: the writer's class map) and its
 * confidence raster, write NAME.class.gpkg (GeoPackage) or NAME.class.fgb
 * (FlatGeobuf): layer "classes", one polygon per 4-connected region of a
 * class (cells sharing an edge; cells meeting at a corner only are separate
 * regions), with fields
 *   class (integer), class_name (string), area (real, CRS units squared,
 *   the polygon's own area), cells (integer64, cells of the region),
 *   mean_confidence (real, the mean of the region's confidence)
 * in the raster's CRS. Nodata cells make no polygon. The layer's metadata
 * holds AREA_UNIT ("square metre", ...), CLASS_COLORS ("#0072bd,#228b22,...",
 * the class map's colours in class order, for styling) and TILEWISE_RUN
 * (the run's config).
 *
 * The work is GDAL's: GDALSieveFilter merges regions of fewer than
 * ceil(min_area / cell area) cells into their largest neighbour first
 * (4-connected; a region with no classified neighbour stays), and
 * GDALPolygonize traces the regions into a scratch GeoPackage. The
 * per-region statistics (cells, mean confidence) come from one streaming
 * pass of 4-connected labelling over the same raster, matched to the
 * polygons by the region's first cell in raster order (the exterior ring's
 * top-left vertex). simplify > 0: Douglas-Peucker on the boundaries, split
 * at the vertices where three or more regions (or nodata) meet, each
 * boundary piece in one canonical direction, so the two polygons sharing it
 * get the same vertices (no gap, no overlap; GEOS 3.11 has no coverage
 * simplifier); a piece whose simplification leaves a polygon invalid is
 * kept exact in every polygon that has it (repeated until all are valid).
 *
 * Memory: rows of the raster (about 105 bytes a column), GDAL's block cache
 * (the caller sets it), and what grows with the map: GDAL 3.6's sieve and
 * polygonize keep arrays over every region id of the whole raster and the
 * vertices of the regions still open, and the statistics here are 32 bytes
 * a region after the sieve. Measured, all of it stays under
 * tw_polygons_memory (TW_POLYGONS_REGION_BYTES a region before the sieve);
 * the regions are counted first, so a map with too many for max_bytes is
 * refused before the sieve. output.min_area does not lower the sieve's
 * share (it works on the regions before it), only the output's: a region
 * smaller than min_area merges into its largest neighbour, but one whose
 * neighbours are all smaller than min_area stays (GDALSieveFilter's rule:
 * a checkerboard is left as it is).
 *
 * The output is written under ".<name>.part.gpkg" (".part.fgb") in the
 * same directory and renamed when complete, as the rasters are; on failure
 * the temporary is removed.
 */
#ifndef TW_POLYGONS_H
#define TW_POLYGONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/params.h"

/* What one region costs in memory through the product (see above). */
#define TW_POLYGONS_REGION_BYTES 80
/* About what one region takes in the file (GeoPackage with its R-tree, a
 * blocky boundary: bench/RESULTS.md), for validate's size estimate. */
#define TW_POLYGONS_FILE_BYTES 300

typedef struct tw_polygons_params {
    const char *class_path;  /* Byte class map, nodata 255 */
    const char *conf_path;   /* float32 confidence on the same grid */
    const char *path;        /* final path (.class.gpkg or .class.fgb) */
    const char *scratch_dir; /* an existing directory for the sieved raster and raw polygons */
    tw_vector_format format;
    int n_classes;
    const char (*class_names)[TW_NAME_MAX];
    const unsigned char (
        *colors)[3]; /* the class map's colours (io/output/writer.h); NULL: built-in */
    int n_colors;
    double min_area;           /* CRS units squared; 0: no sieve */
    double simplify;           /* CRS units; 0: exact cell edges */
    const char *metadata_json; /* the layer's TILEWISE_RUN metadata (may be NULL) */
    size_t max_bytes;          /* what the regions may take (tw_polygons_memory), checked by a
                                  counting pass before the sieve; 0: not checked */
} tw_polygons_params;

/* The refusal when the regions need more than max_bytes, with what can
 * help (validate's warning uses the same words): printf arguments path,
 * regions (size_t), need, max_bytes, the difference (formatted sizes). */
#define TW_POLYGONS_HELP                                                                           \
    "or make fewer regions (fewer cells: output.resolution: cells or a larger tiling.stride; "     \
    "fewer classes); output.min_area cannot help (the regions are counted before its sieve)"
#define TW_POLYGONS_TOO_MANY                                                                       \
    "%s: the class map has %zu regions; their polygons need about %s and runtime.memory "          \
    "leaves %s for them at assembly: give runtime.memory about %s more, " TW_POLYGONS_HELP

/* Write the polygons of p->class_path to p->path (see above). Returns the
 * number of features in *n_features (may be NULL). TW_ERR_INPUT when a
 * raster cannot be read, TW_ERR_OUTPUT when the file cannot be written,
 * TW_ERR_NOMEM (also when the regions need more than max_bytes:
 * TW_POLYGONS_TOO_MANY). Thread-safe for different files (GDAL's
 * message capture is per thread). */
tw_status tw_polygons_write(const tw_polygons_params *p, int64_t *n_features, tw_error *err);

/* Bytes the product needs besides GDAL's block cache for a class map of
 * grid_w x grid_h cells with `regions` regions (the budget's item with 0,
 * validate's estimate and the check against max_bytes): measured on
 * 4096^2-32768^2 maps of up to 2.2 million regions (bench/RESULTS.md). */
size_t tw_polygons_memory(int grid_w, int grid_h, int64_t regions);

/* What `tilewise info` says about a polygons file. */
typedef struct tw_polygons_class_sum {
    int cls;
    char name[TW_NAME_MAX];
    int64_t features, cells;
    double area; /* sum of the features' area field */
} tw_polygons_class_sum;

typedef struct tw_polygons_summary {
    bool found; /* the file has a layer "classes" with the fields above */
    char driver[32];
    int64_t features;
    char area_unit[128];
    char crs[128];    /* "EPSG:32725", else the CRS's name, else "" */
    double extent[4]; /* min x, max x, min y, max y */
    int n_classes;    /* classes with features, in class order */
    tw_polygons_class_sum classes[TW_MAX_CLASSES];
} tw_polygons_summary;

/* Read path (any OGR vector file) into *out: found false (and TW_OK) when
 * GDAL opens it as a vector file without a tilewise "classes" layer.
 * TW_ERR_INPUT when it cannot be opened as a vector file. */
tw_status tw_polygons_summarize(const char *path, tw_polygons_summary *out, tw_error *err);

/* "NAME.class.gpkg" or "NAME.class.fgb" in dir. */
void tw_polygons_path(const char *dir, const char *stem, tw_vector_format f, char *out,
                      size_t size);

#endif
