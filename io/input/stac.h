/* stac.h - a STAC item as one input raster: the assets named in
 * input.assets become the bands, in that order.
 *
 * GDAL 3.6's STACIT driver mosaics one asset over the items of a
 * collection; it does not stack several assets of one item as bands, which
 * is what a classifier needs (B04, B03, B02, ...). So tilewise reads the
 * item's JSON itself (a file or a URL, through GDAL's virtual file system),
 * resolves each asset's href (relative hrefs against the item's location;
 * https:// and s3:// as url.h maps them) and builds an in-memory VRT with
 * GDALBuildVRT -separate semantics: one band per asset. The assets must be
 * single-band and share one grid (size, geotransform and CRS): assets at
 * another resolution are an error naming them.
 *
 * Not thread-safe per object; the VRT lives under /vsimem/ until destroy,
 * and any thread may open tw_stac_path() meanwhile (each its own dataset).
 */
#ifndef TW_STAC_H
#define TW_STAC_H

#include <stddef.h>

#include "core/error.h"
#include "core/params.h"

typedef struct tw_stac tw_stac;

/* Build the VRT of item's assets (n >= 1 names). Errors (TW_ERR_INPUT,
 * TW_ERR_REMOTE for an unreachable item) name the item (redacted), the
 * asset and what is wrong; the list of the item's assets when a name is not
 * among them. *out is owned by the caller: tw_stac_destroy. */
tw_status tw_stac_open(const char *item, const char (*assets)[TW_NAME_MAX], int n, tw_stac **out,
                       tw_error *err);

/* The GDAL path of the VRT (a /vsimem/ name). Borrowed; valid until destroy. */
const char *tw_stac_path(const tw_stac *s);

/* The item's properties.datetime (else its start_datetime) as the item
 * gives it, "" when it has neither. Borrowed; valid until destroy. */
const char *tw_stac_datetime(const tw_stac *s);

/* Where tw_stac_datetime came from: "properties.datetime",
 * "properties.start_datetime", "" none. Static. */
const char *tw_stac_datetime_key(const tw_stac *s);

/* The GDAL path of asset k (0-based, in input.assets order). Borrowed;
 * valid until destroy. */
const char *tw_stac_asset(const tw_stac *s, int k);

/* The identity lines (identity.h) of the remote item and of each remote asset,
 * for the resume fingerprint; "" when all are local. */
tw_status tw_stac_identity(const tw_stac *s, char *out, size_t size, tw_error *err);

/* Unlinks the VRT. Accepts NULL. */
void tw_stac_destroy(tw_stac *s);

#endif
