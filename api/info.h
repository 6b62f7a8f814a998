/* info.h - `tilewise info`: a raster or a model file described for a person
 * (text) or a program (one JSON object).
 *
 * A raster (any GDAL path; https:// and s3:// as a run opens them, shown
 * with credentials redacted): driver, size, CRS (EPSG code, kind, units),
 * origin and pixel size (in metres too for degrees), layout and compression,
 * whether tilewise can read it and why not, per band type, block, nodata,
 * colour, description, overviews and statistics, the cost of reading a
 * remote one, and where a class map's legend lives. A model file (.h5,
 * .hdf5, .safetensors): architecture, bands, classes, parameters,
 * normalization, tile, sha256. The library only writes to the caller's
 * stream.
 */
#ifndef TW_INFO_H
#define TW_INFO_H

#include <stdbool.h>
#include <stdio.h>

#include "core/error.h"

/* Describe path onto out (text, or with json one JSON object and a
 * newline). tiff_direct: whether runs decode plain tiled GeoTIFFs with
 * libtiff (what "usable" checks). Errors (nothing written then): a local
 * file that cannot be opened, a raster GDAL cannot open (TW_ERR_INPUT, also
 * for a remote one that could not be reached), a model that cannot be read
 * (TW_ERR_MODEL), a URL that cannot be used (tw_url_to_gdal's status). */
tw_status tw_info_write(const char *path, bool json, bool tiff_direct, FILE *out, tw_error *err);

/* (info_stac.c) Whether path names a STAC item or collection a run writes
 * (*.stac.json, collection.json), and its summary onto out: id, datetime
 * (a collection's time span), bbox, CRS and grid, every asset with its
 * href, size and type, the model (mlm), the links. TW_ERR_INPUT for a file
 * that is not JSON or not a STAC Item/Collection. */
bool tw_info_is_stac(const char *path);
tw_status tw_info_stac(const char *path, bool json, FILE *out, tw_error *err);

#endif
