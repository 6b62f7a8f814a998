/* stac_out.h - STAC 1.0.0 Items and Collections that describe a run's
 * finished products (output.stac). Reading input items is io/input/stac.h's job;
 * this module only writes.
 *
 * An Item describes one input's products: its footprint in WGS84 (the
 * input raster's outline, each edge densified, reprojected with OGR/OSR),
 * its datetime, and one asset per product file the run wrote. Each asset's
 * fields come from the finished file itself, so a product added later gets
 * its asset without edits here beyond a row of the media type/role table in
 * stac_out.c: href (relative to the item), type, roles, file:size and
 * file:checksum (SHA-256 multihash, read back from the file), and for
 * rasters raster:bands (data type, nodata, scale), proj:shape and
 * proj:transform as GDAL reads them. The class asset carries the
 * classification extension (value, a unique machine-readable name, the
 * class name as given in description and title, color_hint from the class
 * map's own colour table). The model: the mlm extension and a model asset
 * when the weights have an href that stays valid where the folder is
 * published (tw_stac_model_href); else tilewise:model (name, SHA-256,
 * size, architecture, bands, classes), no asset, no mlm (whose Items must
 * have a model asset).
 *
 * Extension versions written (their schema URLs in stac_extensions):
 * projection v1.1.0 (proj:epsg, proj:wkt2, proj:shape, proj:transform,
 * proj:bbox: GDAL 3.6's STACIT driver needs proj:epsg, which projection
 * v2.0.0 renamed proj:code), raster v1.1.0, file v2.1.0, classification
 * v1.1.0, mlm v1.3.0.
 *
 * Files are written atomically (core/fileio.h): an item with its final
 * name describes finished products. Nothing here is thread-safe across
 * calls on the same directory; separate directories are independent.
 */
#ifndef TW_STAC_OUT_H
#define TW_STAC_OUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/params.h"

#define TW_STAC_DATETIME_MAX 40

/* RFC 3339 checks: core/datetime.h (tw_rfc3339_check). */

/* The acquisition time a raster's metadata gives, as RFC 3339 (UTC 'Z'
 * appended when the metadata has no zone): ACQUISITIONDATETIME (GDAL's
 * IMAGERY domain, then the default one), ACQUISITION_DATETIME, DATETIME,
 * then TIFFTAG_DATETIME ("YYYY:MM:DD HH:MM:SS"). source receives the item's
 * name. false when none is there or none parses. gdal_path is opened and
 * closed here. Thread-safe (its own dataset). */
bool tw_stac_raster_datetime(const char *gdal_path, char *out, size_t size, char *source,
                             size_t source_size);

/* The model, for the mlm extension. All pointers borrowed. */
typedef struct tw_stac_model {
    const char *name;           /* mlm:name: the weights file's stem */
    const char *arch;           /* "resnet18" */
    const char *framework;      /* mlm:framework: "PyTorch" (torchvision layout), "ONNX" */
    const char *weights_href;   /* the model asset's href (tw_stac_model_href), "" none */
    const char *weights_sha256; /* hex SHA-256 of the weights file (64 chars) */
    int64_t weights_size;       /* bytes; -1 unknown */
    int in_bands;
    const int *bands; /* [n_bands] 1-based raster bands, or NULL (all) */
    int n_bands;
    const char (*band_names)[TW_NAME_MAX]; /* [in_bands] STAC asset names, or NULL */
    int tile;
    double scale;      /* x = (v * scale - mean) / std */
    const float *mean; /* [in_bands] */
    const float *std;  /* [in_bands] */
    int n_classes;
    const char (*classes)[TW_NAME_MAX]; /* [n_classes] */
    /* a segmentation model (mlm:tasks semantic-segmentation, a probability
     * per class and pixel), else a classifier (classification, per tile) */
    bool segmentation;
} tw_stac_model;

typedef struct tw_stac_item_params {
    const char *dir;      /* the output directory: the item is dir/id.stac.json */
    const char *id;       /* the input's output name (its stem) */
    const char *datetime; /* RFC 3339 */
    /* The footprint's grid: the input raster (its size, geotransform and
     * CRS; an empty CRS: geometry null, no proj:epsg). */
    int width, height;
    const double *geotransform; /* [6] */
    const char *crs_wkt;
    /* The product files written (paths as the run wrote them, inside dir):
     * one asset each, in this order. */
    const char *const *files;
    int n_files;
    const tw_stac_model *model;
    const char *derived_from; /* href of the input's STAC item, or NULL */
    const char *collection;   /* the collection's id when dir has collection.json, or NULL */
    const char *created;      /* RFC 3339 time of writing (the `created` property), or NULL */
} tw_stac_item_params;

/* "<dir>/<id>.stac.json" into out. false when it does not fit. */
bool tw_stac_item_path(const char *dir, const char *id, char *out, size_t size);

/* Write the item (atomically). Reads every product file back (size,
 * SHA-256, GDAL's view of a raster). TW_ERR_OUTPUT naming the file for a
 * product that cannot be read or an item that cannot be written;
 * TW_ERR_NOMEM. */
tw_status tw_stac_item_write(const tw_stac_item_params *ip, tw_error *err);

/* The items of a directory as one GeoJSON FeatureCollection (a STAC API
 * ItemCollection), the file GDAL's STACIT driver opens: dir/items.json. */
#define TW_STAC_ITEMS "items.json"

/* Add dir/<id>.stac.json, as written, to dir/items.json (replacing a
 * feature of the same id; a missing or unreadable items.json is started
 * anew), atomically. TW_ERR_OUTPUT naming the item or items.json. */
tw_status tw_stac_items_add(const char *dir, const char *id, tw_error *err);

/* Write dir/collection.json (atomically): a STAC Collection whose extents
 * are the union of the items' bboxes and datetimes, with an `item` link to
 * each, read back from dir/<id>.stac.json, and an `items` link to
 * dir/items.json, rewritten first to hold exactly these items. description
 * and id as given. TW_ERR_OUTPUT naming an item that cannot be read, or
 * the collection. */
tw_status tw_stac_collection_write(const char *dir, const char *id, const char *description,
                                   const char *const *item_ids, int n, tw_error *err);

/* Remove dir/<id>.stac.json and its feature in dir/items.json (and with
 * collection, dir/collection.json) before the products they describe are
 * replaced, so that none describes files that are no longer there. A
 * missing file is fine. TW_ERR_OUTPUT when one stays. */
tw_status tw_stac_item_remove(const char *dir, const char *id, bool collection, tw_error *err);

/* An href to target (a local path) relative to the directory dir, both
 * resolved with realpath ("../models/m.h5"); target as given when it is not
 * local (a URL, /vsi...) or cannot be resolved. */
void tw_stac_relative_href(const char *dir, const char *target, char *out, size_t size);

/* The href of the model asset: a weights file inside dir as "./sub/m.h5"
 * (relative to an item in dir), a URL as given (file:// taken as a local
 * path). false (out "") for a file outside dir, a /vsi path or a URL that
 * carries a secret: nothing that would still resolve once dir is
 * published. */
bool tw_stac_model_href(const char *dir, const char *target, char *out, size_t size);

#endif
