/* raster.h - GDAL raster reader: tiles of raw pixels plus a validity mask.
 *
 * One tw_raster per thread (GDAL datasets are not thread-safe): each stage
 * worker opens its own. Reads are windowed RasterIO calls in the raster's own
 * data type, band-interleaved into the caller's buffer; pixels of a window
 * that fall outside the raster are filled with 0 and marked invalid-and-
 * outside (padding). GDAL's messages are routed into the tw_error of the call.
 */
#ifndef TW_RASTER_H
#define TW_RASTER_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"

typedef struct tw_raster_info {
    int width, height, band_count;
    tw_dtype dtype;       /* of the first selected band (all must agree) */
    int block_w, block_h; /* natural block size of band 1 */
    bool has_nodata;      /* raster's own nodata on band 1 */
    double nodata;
    double geotransform[6]; /* GDAL order; identity-like when absent */
    bool has_geotransform;
    char crs_wkt[4096]; /* "" when absent */
    char driver[32];
} tw_raster_info;

typedef struct tw_raster tw_raster;

/* Open path read-only: a file, a GDAL path, https://... or s3://bucket/key
 * (url.h). Messages name the path with credentials redacted. bands: 1-based band list in model
 * order (n_bands == 0: all bands). Every listed band must exist and all must share one data type
 * (else TW_ERR_INPUT naming the file and band). Unsupported types (complex)
 * are TW_ERR_INPUT. */
tw_status tw_raster_open(const char *path, const int *bands, int n_bands, tw_raster **out,
                         tw_error *err);

/* Knobs of a reader (the CLI fills them; the library reads no environment). */
typedef struct tw_tiff_cache tw_tiff_cache; /* io/input/tiff_direct.h */
typedef struct tw_raster_open_params {
    bool tiff_direct; /* plain tiled GeoTIFFs through libtiff directly (default true) */
    /* NULL, or a cache of decoded tiles that every reader of this raster
     * shares (tw_tiff_cache_create): a file read through libtiff then
     * decodes each tile once whatever the number of readers. Borrowed: it
     * must outlive the raster. */
    tw_tiff_cache *shared_tiles;
    /* NULL, or the run's stop flag (tw_run_hooks.stop), borrowed for the
     * raster's life: once non-zero, a remote open or read that failed is
     * not retried nor waited for, and returns TW_CANCELLED. A request under
     * way is not interrupted: it ends within input.timeout (url.h). */
    const volatile sig_atomic_t *stop;
} tw_raster_open_params;
tw_raster_open_params tw_raster_default_open_params(void);
/* tw_raster_open with params (tw_raster_open uses the defaults). */
tw_status tw_raster_open_ex(const char *path, const int *bands, int n_bands,
                            const tw_raster_open_params *op, tw_raster **out, tw_error *err);
void tw_raster_close(tw_raster *r);

/* Borrowed; valid until close. */
const tw_raster_info *tw_raster_get_info(const tw_raster *r);
/* Number of bands selected (= n_bands given to open, or band_count). */
int tw_raster_selected_bands(const tw_raster *r);

/* Which library reads the pixels: "libtiff" (a plain tiled GeoTIFF, read
 * by io/input/tiff_direct.c) or "gdal"; *why (when why is given) says why not
 * libtiff ("" when it is). Borrowed; valid until close. */
const char *tw_raster_reader(const tw_raster *r, const char **why);

/* TIFF tiles the libtiff reader has decoded so far (-1 when GDAL reads):
 * shows that its cache decodes each tile once on a row-major walk. */
long long tw_raster_tiles_decoded(const tw_raster *r);

/* Remote inputs (url.h): a read that fails after GDAL's own HTTP retries
 * is retried up to `retries` times on a fresh dataset, waiting retry_delay
 * seconds doubled after each, within the span GDAL's retries would wait.
 * Still failing: TW_ERR_REMOTE when the object is then unreachable (an
 * outage: the run stops, resumable), else TW_ERR_INPUT (the tile follows
 * input.on_error). Default, at open: GDAL's GDAL_HTTP_MAX_RETRY and
 * GDAL_HTTP_RETRY_DELAY (a run sets them from input.retries and
 * input.retry_delay, url.h). Local inputs: no effect. */
void tw_raster_set_retries(tw_raster *r, int retries, double retry_delay);
bool tw_raster_is_remote(const tw_raster *r);

/* Nodata rule for reads: use_nodata false = no nodata value; else pixels
 * equal to nodata_value (after conversion to the raster's type; NaN matches
 * NaN) are invalid. Non-finite values of float rasters (NaN, +-Inf) are
 * always invalid. A pixel is invalid when any selected band is invalid. */
void tw_raster_set_nodata(tw_raster *r, bool use_nodata, double nodata_value);

/* input.nodata's rule: nodata_auto, the raster's own nodata value (none
 * when it has none); else nodata. The one place the run's readers, the
 * resampling at output.resolution: input and the advice agree on it. */
void tw_raster_set_nodata_rule(tw_raster *r, bool nodata_auto, double nodata);

/* Read the window with top-left (x0, y0) and size w x h (may extend past the
 * right/bottom edge and start at x0 >= 0, y0 >= 0). Output:
 *   raw   [bands][h][w] in the raster's dtype (pixels outside: 0)
 *   valid [h][w]: 1 valid, 0 nodata or outside
 * *n_nodata receives the count of invalid pixels inside the raster (outside
 * pixels are not counted); *n_inside the count of pixels inside.
 * Errors: TW_ERR_INPUT naming the file and the window. */
tw_status tw_raster_read(tw_raster *r, int x0, int y0, int w, int h, void *raw, uint8_t *valid,
                         int64_t *n_nodata, int64_t *n_inside, tw_error *err);

/* Strips of tiles: a row of tiles read with one window (one RasterIO call
 * over all bands, or one gather from libtiff's decoded tiles) and cut into
 * tiles in memory, instead of one read per tile.
 *
 * Bytes of the strip of a w x h window (raw planes and validity, plus the
 * mask scratch when mask): for the memory budget. */
size_t tw_raster_strip_bytes(int w, int h, int bands, tw_dtype dtype, bool mask);
/* Whether reads also read a mask or alpha band (it needs strip scratch). */
bool tw_raster_has_mask(const tw_raster *r);
/* Allocate the strip for windows up to max_w x h pixels (TW_MEM_READ),
 * replacing an earlier one. Call before the steady state: reads allocate
 * nothing afterwards. TW_ERR_NOMEM when it cannot. */
tw_status tw_raster_reserve_strip(tw_raster *r, int max_w, int h, tw_error *err);
/* Width of the reserved strip (0: none). */
int tw_raster_strip_width(const tw_raster *r);
/* Read n tiles of T x T pixels whose top-left corners are (xs[i], y0), xs
 * ascending, with one read of the window spanning them (xs[n-1] + T - xs[0]
 * pixels wide; it must fit the reserved strip, whose height must be T).
 * Tile i goes to raw + i * bands*T*T*dtype_size as [bands][T][T] and to
 * valid + i*T*T; n_nodata[i] and n_inside[i] as tw_raster_read gives them.
 * Same pixels, bit for bit, as n tw_raster_read calls. On a failed read the
 * error names the whole window: callers that skip unreadable tiles read
 * that strip's tiles one by one to find which fail. */
tw_status tw_raster_read_tiles(tw_raster *r, int y0, const int *xs, int n, int T, void *raw,
                               uint8_t *valid, int64_t *n_nodata, int64_t *n_inside, tw_error *err);

/* The reader's nodata rule on one band plane: clear valid[] (row stride w,
 * the clipped xr x yr region) where the pixel equals nd as type t holds it
 * (use_nd; an integer type only matches an integral in-range nd, float32
 * compares with nd rounded to float) or, for float types, is not finite.
 * Call once per band: a pixel is nodata when any band says so. The one
 * place the rule is written: the readers and the C API's in-memory tiles
 * (api/tilewise_api.c) both call it. Cannot fail. */
void tw_mark_nodata(tw_dtype t, const void *plane, int w, int xr, int yr, bool use_nd, double nd,
                    uint8_t *valid);

#endif
