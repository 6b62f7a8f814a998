/* info.h - `tilewise info`: a raster or a model file described for a person
 * (text) or a program (one JSON object).
 *
 * A raster (any GDAL path; https:// and s3:// as a run opens them, shown
 * with credentials redacted): driver, size, CRS (EPSG code, kind, units),
 * origin and pixel size (in metres too for degrees), layout and compression,
 * whether tilewise can read it and why not, per band type, block, nodata,
 * colour, description, overviews and statistics, the cost of reading a
 * remote one, and where a class map's legend lives. A model file (.h5,
 * .hdf5, .safetensors, .onnx): architecture, bands, classes, parameters,
 * normalization, tile, sha256. A polygons product (.gpkg, .fgb): its layer
 * and each class's features, cells and area. A STAC item or collection a
 * run wrote (*.stac.json, collection.json): id, time, bbox, assets, model,
 * links. The facts are gathered once into one tree, which both forms render
 * (api/info_internal.h). The library only writes to the caller's stream.
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
 * for a remote one that could not be reached; a .stac.json that is not
 * JSON or not STAC), a model that cannot be read (TW_ERR_MODEL), a URL that
 * cannot be used (tw_url_to_gdal's status), TW_ERR_NOMEM. */
tw_status tw_info_write(const char *path, bool json, bool tiff_direct, FILE *out, tw_error *err);

#endif
