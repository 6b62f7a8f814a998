/* tiff_direct.h - windows of plain tiled GeoTIFFs read through libtiff alone.
 *
 * GDAL's GTiff driver decodes with libtiff too, then keeps the decoded
 * blocks in its block cache and copies windows out of them through its
 * RasterIO machinery. For the files where libtiff's own output is exactly
 * what GDAL would return, this reader skips GDAL: it decodes whole TIFF tiles
 * with TIFFReadEncodedTile, straight into the caller's buffer when a window
 * is exactly one tile whose bands lie in separate planes (or a one-band
 * file), else into a small cache of decoded tiles from which the window's
 * pixels are copied band by band. io/input/raster.c uses it when tw_tiff_open
 * accepts a file; GDAL still provides the metadata, the nodata value and
 * every other file.
 *
 * Accepted: a tiled TIFF whose first image is the raster GDAL opened (same
 * size, one sample per GDAL band, samples of the raster's type), top-left
 * orientation, a codec this libtiff has (not old-style JPEG, not YCbCr),
 * with no mask or alpha band (the caller checks that). Missing (sparse)
 * tiles read as GDAL reads them: the nodata value, or 0.
 */
#ifndef TW_TIFF_DIRECT_H
#define TW_TIFF_DIRECT_H

#include <stddef.h>

#include "io/input/raster.h"
#include "core/error.h"

typedef struct tw_tiff tw_tiff;

/* Open path for direct reads of the bands (1-based, n_bands of them) that
 * GDAL described in info. NULL when the file does not qualify (or cannot be
 * opened by libtiff), with the reason in why. cache_bytes bounds the cache of
 * decoded tiles (at least one tile is always kept); it is allocated at the
 * first read that needs it, at most one tile row's worth. */
tw_tiff *tw_tiff_open(const char *path, const tw_raster_info *info, const int *bands, int n_bands,
                      size_t cache_bytes, char *why, size_t why_len);
void tw_tiff_close(tw_tiff *t);

/* Read the part xr x yr at (x0, y0), which lies inside the raster, into
 * raw [n_bands][h][w] (row stride w, plane stride w * h, in the raster's
 * type); the rest of raw is left alone. TW_ERR_INPUT with libtiff's message
 * when a tile cannot be decoded; TW_ERR_NOMEM when the cache cannot be
 * allocated. err's message starts with libtiff's text, the caller adds the
 * file and the window. */
tw_status tw_tiff_read(tw_tiff *t, int x0, int y0, int xr, int yr, void *raw, int w, int h,
                       tw_error *err);

/* A cache of decoded tiles shared by several handles of one file (the
 * pipeline's reader workers, one handle each), so that a tile two readers'
 * windows touch is decoded once: by the first reader that needs it, while
 * the other waits for it rather than decoding it too. Its tiles are pinned
 * while a reader copies out of them; when every entry is pinned or being
 * decoded, a reader decodes into a tile buffer of its own instead of
 * waiting. bytes bounds it (at least one tile); it is laid out at the first
 * read, for `users` handles each straddling two rows of tiles. Thread-safe.
 * NULL on allocation failure. */
typedef struct tw_tiff_cache tw_tiff_cache;
tw_tiff_cache *tw_tiff_cache_create(size_t bytes, int users);
void tw_tiff_cache_destroy(tw_tiff_cache *c);
/* Read t's tiles through c (before t's first read; c must outlive t, and
 * every handle sharing c must read the same file with the same bands). */
void tw_tiff_share(tw_tiff *t, tw_tiff_cache *c);

/* libtiff's version number ("4.5.0") into buf; returns buf. */
const char *tw_tiff_version(char *buf, size_t size);

/* Tiles decoded so far (cache hits not counted), for tests and reports. */
long long tw_tiff_tiles_decoded(const tw_tiff *t);

#endif
