/* raster.c - GDAL raster reader: see raster.h.
 *
 * Every GDAL call of a public function runs under a pushed error handler
 * (capture_handler) so GDAL never prints to stderr; the first failure message
 * (or, lacking one, the last warning) is copied into the caller's tw_error by
 * the code that notices the failure. Reads clip the window to the raster and
 * hand GDAL the caller's [bands][h][w] buffer with explicit pixel/line/band
 * spacing, so no intermediate copy is made.
 */
#include "io/input/raster.h"

#include <cpl_conv.h>
#include <cpl_error.h>
#include <cpl_vsi.h>
#include <gdal.h>
#include <math.h>
#include <ogr_srs_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/gdal_msgs.h"
#include "io/input/tiff_direct.h"
#include "core/alloc.h"
#include "io/url.h"
#include "core/clock.h"
#include "core/fileio.h"

struct tw_raster {
    GDALDatasetH ds;
    char *path;  /* for messages: the user's path, credentials redacted (url.h) */
    char *gpath; /* what GDAL opens (url.h: https:// -> /vsicurl/, s3:// -> /vsis3/) */
    bool remote;
    tw_url_settings net; /* retries of a remote input's reads */
    int *bands;          /* 1-based, n_bands entries (int, not const: GDAL 3.6 API) */
    int n_bands;
    tw_raster_info info;
    bool use_nodata;
    double nodata_value;
    GDALRasterBandH mask; /* per-dataset mask or alpha band, or NULL */
    uint8_t *mask_buf;    /* scratch for mask reads, mask_cap bytes */
    size_t mask_cap;
    tw_tiff *tiff; /* plain tiled GeoTIFF: pixels through libtiff (tiff_direct.h) */
    char why_gdal[160];
    bool allow_direct; /* tw_raster_open_params.tiff_direct */
    tw_tiff_cache *shared_tiles;
    const volatile sig_atomic_t *stop; /* tw_raster_open_params.stop */
    uint8_t *strip;     /* tw_raster_read_tiles' window: raw then valid, strip_bytes */
    size_t strip_bytes; /* 0 until tw_raster_reserve_strip */
    int strip_w, strip_h;
};

/* The GDAL type we ask RasterIO for. Int8 is read as raw bytes under GDAL
 * < 3.7 (where it is Byte + PIXELTYPE=SIGNEDBYTE) and as GDT_Int8 above. */
static GDALDataType gdal_type_of(tw_dtype t)
{
    switch (t) {
    case TW_DT_BYTE: return GDT_Byte;
#if GDAL_VERSION_NUM >= 3070000
    case TW_DT_INT8: return GDT_Int8;
#else
    case TW_DT_INT8: return GDT_Byte;
#endif
    case TW_DT_UINT16: return GDT_UInt16;
    case TW_DT_INT16: return GDT_Int16;
    case TW_DT_UINT32: return GDT_UInt32;
    case TW_DT_INT32: return GDT_Int32;
    case TW_DT_FLOAT32: return GDT_Float32;
    case TW_DT_FLOAT64: return GDT_Float64;
    }
    return GDT_Unknown;
}

/* Map a band's GDAL type to ours; false when unsupported. */
static bool band_dtype(GDALRasterBandH b, tw_dtype *out)
{
    switch (GDALGetRasterDataType(b)) {
    case GDT_Byte: {
        const char *pt = GDALGetMetadataItem(b, "PIXELTYPE", "IMAGE_STRUCTURE");
        *out = (pt && strcmp(pt, "SIGNEDBYTE") == 0) ? TW_DT_INT8 : TW_DT_BYTE;
        return true;
    }
#if GDAL_VERSION_NUM >= 3070000
    case GDT_Int8: *out = TW_DT_INT8; return true;
#endif
    case GDT_UInt16: *out = TW_DT_UINT16; return true;
    case GDT_Int16: *out = TW_DT_INT16; return true;
    case GDT_UInt32: *out = TW_DT_UINT32; return true;
    case GDT_Int32: *out = TW_DT_INT32; return true;
    case GDT_Float32: *out = TW_DT_FLOAT32; return true;
    case GDT_Float64: *out = TW_DT_FLOAT64; return true;
    default: return false;
    }
}

/* ---- GDAL message capture (io/gdal_msgs.c) -------------------------------- */

typedef tw_gdal_msgs gdal_msgs;

static void capture_begin(gdal_msgs *m)
{
    tw_gdal_capture_begin(m);
}

static void capture_end(void)
{
    tw_gdal_capture_end();
}

/* Forget what was captured, so that the next failure is recorded (the
 * capture keeps the first failure only). */
static void capture_clear(gdal_msgs *m, bool warnings)
{
    m->failures = 0;
    m->failure[0] = '\0';
    if (warnings) m->last_warning[0] = '\0';
}

static const char *capture_text(const gdal_msgs *m)
{
    return tw_gdal_capture_text(m, "no message from GDAL");
}

static pthread_once_t g_register_once = PTHREAD_ONCE_INIT;
static void register_drivers(void)
{
    GDALAllRegister();
}

/* ---- open / close ----------------------------------------------------------- */

/* Copy the CRS as WKT into info. WKT of exotic CRSs can exceed the fixed
 * buffer; then fall back to the compact WKT1 form rather than truncating
 * (a truncated WKT would be written into outputs as garbage). */
static tw_status fill_crs(tw_raster *r, tw_error *err)
{
    const char *wkt = GDALGetProjectionRef(r->ds);
    r->info.crs_wkt[0] = '\0';
    if (!wkt || !*wkt) return TW_OK;
    if (strlen(wkt) < sizeof r->info.crs_wkt) {
        memcpy(r->info.crs_wkt, wkt, strlen(wkt) + 1);
        return TW_OK;
    }
    OGRSpatialReferenceH srs = OSRNewSpatialReference(wkt);
    char *simple = NULL;
    const char *opts[] = {"FORMAT=WKT1_SIMPLE", NULL};
    bool ok = srs && OSRExportToWktEx(srs, &simple, opts) == OGRERR_NONE && simple &&
              strlen(simple) < sizeof r->info.crs_wkt;
    if (ok) memcpy(r->info.crs_wkt, simple, strlen(simple) + 1);
    CPLFree(simple);
    if (srs) OSRDestroySpatialReference(srs);
    if (!ok)
        return tw_error_set(err, TW_ERR_INPUT, "%s: CRS definition is too long (%zu chars)",
                            r->path, strlen(wkt));
    return TW_OK;
}

/* An explicit mask (internal/external .msk) or an alpha band marks pixels
 * invalid where it is 0. Nodata-derived and all-valid masks are skipped: the
 * nodata rule already covers them and reading them would cost a second pass. */
static void find_mask(tw_raster *r)
{
    GDALRasterBandH b1 = GDALGetRasterBand(r->ds, r->bands[0]);
    int flags = GDALGetMaskFlags(b1);
    if (flags & GMF_ALL_VALID) return;
    if (flags & GMF_NODATA) return;
    if ((flags & GMF_PER_DATASET) || (flags & GMF_ALPHA)) r->mask = GDALGetMaskBand(b1);
}

/* Read the pixels of a plain tiled GeoTIFF through libtiff, when it
 * qualifies (tiff_direct.h); its decoded tiles take the place of GDAL's
 * block cache, and the same budget (GDAL's cache size, which tw_run sets
 * from runtime.memory). TILEWISE_TIFF_DIRECT=0 keeps every file on GDAL. */
static void open_direct(tw_raster *r)
{
    if (!r->allow_direct) {
        snprintf(r->why_gdal, sizeof r->why_gdal, "the libtiff reader is turned off");
    } else if (r->remote) {
        snprintf(r->why_gdal, sizeof r->why_gdal, "a remote input (GDAL's range requests)");
    } else if (strcmp(r->info.driver, "GTiff") != 0) {
        snprintf(r->why_gdal, sizeof r->why_gdal, "driver %s", r->info.driver);
    } else if (r->mask) {
        snprintf(r->why_gdal, sizeof r->why_gdal, "a mask or alpha band");
    } else {
        r->tiff = tw_tiff_open(r->gpath, &r->info, r->bands, r->n_bands,
                               (size_t)GDALGetCacheMax64(), r->why_gdal, sizeof r->why_gdal);
        if (r->tiff && r->shared_tiles) tw_tiff_share(r->tiff, r->shared_tiles);
    }
}

static bool stopping(const tw_raster *r)
{
    return r->stop && __atomic_load_n(r->stop, __ATOMIC_RELAXED) != 0;
}

/* What to add to a message whose GDAL text says curl gave up on a silent
 * server (input.timeout, url.h). */
static const char *timeout_hint(const char *why)
{
    return why && strstr(why, "Operation too slow")
               ? " (the server sent nothing within input.timeout: raise it for a slow server)"
               : "";
}

/* Wait s seconds between retries, in steps of 0.1 s: a stop ends it. */
static void sleep_s(const tw_raster *r, double s)
{
    double end = tw_clock_now() + s;
    for (double left = s; left > 0 && !stopping(r); left = end - tw_clock_now()) {
        double step = left < 0.1 ? left : 0.1;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)(step * 1e9)};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
}

/* (Re)open the dataset; false on failure (message in msgs). */
static bool open_ds(tw_raster *r, gdal_msgs *msgs)
{
    (void)msgs;
    /* VERBOSE_ERROR: without it GDAL says nothing about an unrecognized file. */
    r->ds = GDALOpenEx(r->gpath, GDAL_OF_RASTER | GDAL_OF_READONLY | GDAL_OF_VERBOSE_ERROR, NULL,
                       NULL, NULL);
    return r->ds != NULL;
}

/* r->ds opened (open_ds), retried as a remote open deserves; a failure
 * named with GDAL's reason, as an outage (TW_ERR_REMOTE) when it is one. */
static tw_status open_retrying(tw_raster *r, tw_error *err, gdal_msgs *msgs)
{
    const char *path = r->path;
    bool ok = open_ds(r, msgs);
    if (!ok && r->remote && !stopping(r) &&
        strstr(capture_text(msgs), "does not exist in the file system")) {
        /* GDAL remembers an object it could not stat for the life of the
         * process and then says only this: ask the server once more, at
         * once, so that its answer (404, 503, ...) decides below. */
        capture_clear(msgs, true);
        VSICurlPartialClearCache(r->gpath);
        ok = open_ds(r, msgs);
    }
    /* A remote open can fail on a dropped connection or a truncated header
     * read (GDAL 3.6 retries only 429/5xx answers, and then says "not
     * recognized as a supported file format"): retry on a fresh connection,
     * with backoff, within the span of GDAL's own retries - but not the
     * server's final answer (404, 403: the object is not there for us). */
    double t0 = tw_clock_now();
    for (int attempt = 1;
         !ok && r->remote && !stopping(r) && attempt <= r->net.retries &&
         !tw_url_definitive(capture_text(msgs)) &&
         tw_clock_now() - t0 < tw_url_retry_span(r->net.retries, r->net.retry_delay);
         attempt++) {
        sleep_s(r, tw_url_retry_delay(&r->net, attempt));
        if (stopping(r)) break;
        capture_clear(msgs, true);
        VSICurlPartialClearCache(r->gpath);
        ok = open_ds(r, msgs);
    }
    if (!ok && r->remote && stopping(r))
        return tw_error_set(err, TW_CANCELLED, "%s: stopped while opening", path);
    if (!ok) {
        /* GDAL often starts with the path itself; don't say it twice. */
        const char *why = capture_text(msgs);
        char gshown[TW_URL_SHOWN_MAX];
        tw_url_redact(r->gpath, gshown, sizeof gshown);
        const char *names[2] = {path, gshown};
        for (int k = 0; k < 2; k++) {
            size_t n = strlen(names[k]);
            if (strncmp(why, names[k], n) == 0 && why[n] == ':') why += n + 1 + (why[n + 1] == ' ');
        }
        /* A remote object that GDAL could not reach after its retries is
         * an outage (exit 4, resumable), not a bad input. */
        tw_status st = r->remote && (tw_url_transient(why) || tw_url_transient(msgs->last_warning))
                           ? TW_ERR_REMOTE
                           : TW_ERR_INPUT;
        return tw_error_set(
            err, st, "%s: cannot open as a raster%s: %s%s%s", path,
            st == TW_ERR_REMOTE ? " (network)" : "", why,
            r->remote && tw_url_definitive(why) ? " (the server's final answer: not retried)" : "",
            timeout_hint(why));
    }
    return TW_OK;
}

/* The raster's size, the selected bands (all without input.bands) into
 * r->bands and r->n_bands, and their one data type into r->info. */
static tw_status check_bands(tw_raster *r, const int *bands, int n_bands, tw_error *err,
                             gdal_msgs *msgs)
{
    const char *path = r->path;
    int count = GDALGetRasterCount(r->ds);
    int width = GDALGetRasterXSize(r->ds), height = GDALGetRasterYSize(r->ds);
    if (count <= 0) return tw_error_set(err, TW_ERR_INPUT, "%s has no raster bands", path);
    if (width <= 0 || height <= 0)
        return tw_error_set(err, TW_ERR_INPUT, "%s: empty raster (%dx%d)", path, width, height);
    if (n_bands < 0) return tw_error_set(err, TW_ERR_INPUT, "%s: negative band count", path);

    r->n_bands = n_bands > 0 ? n_bands : count;
    r->bands = tw_alloc(TW_MEM_OTHER, (size_t)r->n_bands * sizeof *r->bands);
    if (!r->bands) return tw_error_set(err, TW_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < r->n_bands; i++) {
        int b = n_bands > 0 ? bands[i] : i + 1;
        if (b < 1 || b > count)
            return tw_error_set(err, TW_ERR_INPUT, "%s has %d band%s, input.bands asks for band %d",
                                path, count, count == 1 ? "" : "s", b);
        r->bands[i] = b;
    }

    tw_raster_info *in = &r->info;
    in->width = width;
    in->height = height;
    in->band_count = count;
    for (int i = 0; i < r->n_bands; i++) {
        GDALRasterBandH bh = GDALGetRasterBand(r->ds, r->bands[i]);
        tw_dtype t;
        if (!bh)
            return tw_error_set(err, TW_ERR_INPUT, "%s: band %d: %s", path, r->bands[i],
                                capture_text(msgs));
        if (!band_dtype(bh, &t))
            return tw_error_set(err, TW_ERR_INPUT,
                                "%s: band %d has data type %s, which is not supported "
                                "(Byte, Int8, UInt16, Int16, UInt32, Int32, Float32, Float64)",
                                path, r->bands[i], GDALGetDataTypeName(GDALGetRasterDataType(bh)));
        if (i == 0) {
            in->dtype = t;
        } else if (t != in->dtype) {
            return tw_error_set(err, TW_ERR_INPUT,
                                "%s: band %d is %s but band %d is %s; selected bands must share "
                                "one data type",
                                path, r->bands[i], tw_dtype_name(t), r->bands[0],
                                tw_dtype_name(in->dtype));
        }
    }
    return TW_OK;
}

static tw_status open_checked(tw_raster *r, const int *bands, int n_bands, tw_error *err,
                              gdal_msgs *msgs)
{
    tw_status st = open_retrying(r, err, msgs);
    if (st != TW_OK) return st;
    capture_clear(msgs, false);
    st = check_bands(r, bands, n_bands, err, msgs);
    if (st != TW_OK) return st;

    tw_raster_info *in = &r->info;
    GDALRasterBandH b1 = GDALGetRasterBand(r->ds, 1);
    GDALGetBlockSize(b1, &in->block_w, &in->block_h);
    int has_nd = 0;
    double nd = GDALGetRasterNoDataValue(b1, &has_nd);
    in->has_nodata = has_nd != 0;
    in->nodata = has_nd ? nd : 0.0;
    if (GDALGetGeoTransform(r->ds, in->geotransform) == CE_None) {
        in->has_geotransform = true;
    } else {
        const double ident[6] = {0, 1, 0, 0, 0, 1};
        memcpy(in->geotransform, ident, sizeof ident);
        in->has_geotransform = false;
    }
    capture_clear(msgs, false); /* a missing geotransform is not an error */
    st = fill_crs(r, err);
    if (st != TW_OK) return st;
    GDALDriverH drv = GDALGetDatasetDriver(r->ds);
    snprintf(in->driver, sizeof in->driver, "%s", drv ? GDALGetDriverShortName(drv) : "");

    /* Default rule = "nodata: auto": the raster's own nodata, if any. */
    r->use_nodata = in->has_nodata;
    r->nodata_value = in->nodata;
    find_mask(r);
    open_direct(r);
    return TW_OK;
}

tw_raster_open_params tw_raster_default_open_params(void)
{
    return (tw_raster_open_params){.tiff_direct = true};
}

tw_status tw_raster_open(const char *path, const int *bands, int n_bands, tw_raster **out,
                         tw_error *err)
{
    tw_raster_open_params op = tw_raster_default_open_params();
    return tw_raster_open_ex(path, bands, n_bands, &op, out, err);
}

tw_status tw_raster_open_ex(const char *path, const int *bands, int n_bands,
                            const tw_raster_open_params *op, tw_raster **out, tw_error *err)
{
    *out = NULL;
    if (!path || !*path) return tw_error_set(err, TW_ERR_INPUT, "raster path is empty");
    if (n_bands > 0 && !bands)
        return tw_error_set(err, TW_ERR_INTERNAL, "%s: band list missing", path);
    pthread_once(&g_register_once, register_drivers);

    tw_raster *r = tw_calloc(TW_MEM_OTHER, 1, sizeof *r);
    if (!r) return tw_error_set(err, TW_ERR_NOMEM, "%s: out of memory", path);
    r->allow_direct = op->tiff_direct;
    r->shared_tiles = op->shared_tiles;
    r->stop = op->stop;
    char shown[TW_URL_SHOWN_MAX], gpath[8192];
    tw_url_redact(path, shown, sizeof shown);
    r->path = strdup(shown);
    r->remote = tw_url_is_remote(path);
    /* Tile-level retries follow GDAL's HTTP retry settings, which a run sets
     * from input.retries / input.retry_delay (url.h); set_retries overrides. */
    r->net = tw_url_default_settings(atoi(CPLGetConfigOption("GDAL_HTTP_MAX_RETRY", "0")),
                                     CPLAtof(CPLGetConfigOption("GDAL_HTTP_RETRY_DELAY", "0.5")));
    tw_status st = r->path ? tw_url_to_gdal(path, gpath, sizeof gpath, err)
                           : tw_error_set(err, TW_ERR_NOMEM, "%s: out of memory", shown);
    if (st == TW_OK) {
        r->gpath = strdup(gpath);
        if (!r->gpath) st = tw_error_set(err, TW_ERR_NOMEM, "%s: out of memory", shown);
    }
    /* a FIFO would block GDAL's open until a writer came; GDAL opens some
     * directories (a .SAFE, a Zarr store) as rasters */
    if (st == TW_OK && !r->remote && strncmp(path, "/vsi", 4) != 0)
        st = tw_path_check_regular(path, "raster", true, TW_ERR_INPUT, err);
    if (st != TW_OK) {
        tw_raster_close(r);
        return st;
    }
    gdal_msgs msgs;
    capture_begin(&msgs);
    st = open_checked(r, bands, n_bands, err, &msgs);
    capture_end();
    if (st != TW_OK) {
        tw_raster_close(r);
        return st;
    }
    *out = r;
    return TW_OK;
}

void tw_raster_close(tw_raster *r)
{
    if (!r) return;
    if (r->ds) {
        gdal_msgs msgs;
        capture_begin(&msgs); /* read-only close: nothing to report, but keep stderr quiet */
        GDALClose(r->ds);
        capture_end();
    }
    tw_tiff_close(r->tiff);
    tw_free(r->strip);
    tw_free(r->mask_buf);
    tw_free(r->bands);
    free(r->path);
    free(r->gpath);
    tw_free(r);
}

const tw_raster_info *tw_raster_get_info(const tw_raster *r)
{
    return &r->info;
}

int tw_raster_selected_bands(const tw_raster *r)
{
    return r->n_bands;
}

long long tw_raster_tiles_decoded(const tw_raster *r)
{
    return r->tiff ? tw_tiff_tiles_decoded(r->tiff) : -1;
}

const char *tw_raster_reader(const tw_raster *r, const char **why)
{
    if (why) *why = r->tiff ? "" : r->why_gdal;
    return r->tiff ? "libtiff" : "gdal";
}

void tw_raster_set_retries(tw_raster *r, int retries, double retry_delay)
{
    r->net = tw_url_default_settings(retries, retry_delay);
}

bool tw_raster_is_remote(const tw_raster *r)
{
    return r->remote;
}

void tw_raster_set_nodata_rule(tw_raster *r, bool nodata_auto, double nodata)
{
    const tw_raster_info *info = tw_raster_get_info(r);
    tw_raster_set_nodata(r, !nodata_auto || info->has_nodata, nodata_auto ? info->nodata : nodata);
}

void tw_raster_set_nodata(tw_raster *r, bool use_nodata, double nodata_value)
{
    r->use_nodata = use_nodata;
    r->nodata_value = nodata_value;
}

/* ---- validity ----------------------------------------------------------------- */

/* The nodata value as an integer of a type spanning [lo, hi]; false when it
 * cannot occur in that type (fractional, out of range, NaN), so no pixel
 * matches. */
static bool nodata_as_int(double v, double lo, double hi, int64_t *out)
{
    if (!(v >= lo && v <= hi) || v != floor(v)) return false;
    *out = (int64_t)v;
    return true;
}

/* Clear valid[] where band plane p (clipped region xr x yr, row stride w)
 * equals the nodata value. One loop per type so the compare stays a plain
 * integer/float compare. */
#define MARK_INT(T, LO, HI)                                                                        \
    do {                                                                                           \
        int64_t ndi;                                                                               \
        if (!nodata_as_int(nd, (LO), (HI), &ndi)) break;                                           \
        const T ndv = (T)ndi;                                                                      \
        const T *p = plane;                                                                        \
        for (int y = 0; y < yr; y++) {                                                             \
            const T *row = p + (size_t)y * (size_t)w;                                              \
            uint8_t *vrow = valid + (size_t)y * (size_t)w;                                         \
            for (int x = 0; x < xr; x++) vrow[x] &= (uint8_t)(row[x] != ndv);                      \
        }                                                                                          \
    } while (0)

#define MARK_FLOAT(T)                                                                              \
    do {                                                                                           \
        const T *p = plane;                                                                        \
        const bool has = use_nd && !isnan(nd);                                                     \
        const T ndv = has ? (T)nd : (T)0;                                                          \
        for (int y = 0; y < yr; y++) {                                                             \
            const T *row = p + (size_t)y * (size_t)w;                                              \
            uint8_t *vrow = valid + (size_t)y * (size_t)w;                                         \
            for (int x = 0; x < xr; x++) {                                                         \
                T v = row[x];                                                                      \
                bool bad = !isfinite(v) || (has && v == ndv);                                      \
                vrow[x] &= (uint8_t)!bad;                                                          \
            }                                                                                      \
        }                                                                                          \
    } while (0)

void tw_mark_nodata(tw_dtype t, const void *plane, int w, int xr, int yr, bool use_nd, double nd,
                    uint8_t *valid)
{
    switch (t) {
    case TW_DT_BYTE:
        if (use_nd) MARK_INT(uint8_t, 0, 255);
        break;
    case TW_DT_INT8:
        if (use_nd) MARK_INT(int8_t, -128, 127);
        break;
    case TW_DT_UINT16:
        if (use_nd) MARK_INT(uint16_t, 0, 65535);
        break;
    case TW_DT_INT16:
        if (use_nd) MARK_INT(int16_t, -32768, 32767);
        break;
    case TW_DT_UINT32:
        if (use_nd) MARK_INT(uint32_t, 0, 4294967295.0);
        break;
    case TW_DT_INT32:
        if (use_nd) MARK_INT(int32_t, -2147483648.0, 2147483647.0);
        break;
    case TW_DT_FLOAT32:
        /* A nodata value beyond float range cannot be stored in the file. */
        if (use_nd && !isnan(nd) && fabs(nd) > 3.4028234663852886e38) use_nd = false;
        MARK_FLOAT(float);
        break;
    case TW_DT_FLOAT64: MARK_FLOAT(double); break;
    }
}

/* ---- read ------------------------------------------------------------------------ */

/* Every pixel inside the raster is valid: no mask, no nodata rule, no
 * float type (whose NaN and infinities are always invalid). */
static bool validity_trivial(const tw_raster *r)
{
    return !r->mask && !r->use_nodata && r->info.dtype != TW_DT_FLOAT32 &&
           r->info.dtype != TW_DT_FLOAT64;
}

/* GDAL's read of the clipped window, then of its mask: false on failure
 * (the message is in the pushed handler's record; *what says which). */
static bool gdal_read(tw_raster *r, int x0, int y0, int xr, int yr, void *raw, int w, size_t plane,
                      const char **what)
{
    const size_t esz = tw_dtype_size(r->info.dtype);
    GDALRasterIOExtraArg extra;
    INIT_RASTERIO_EXTRA_ARG(extra);
    *what = "read";
    if (!r->ds || (r->mask && !r->mask_buf)) return false; /* a failed reopen */
    if (GDALDatasetRasterIOEx(r->ds, GF_Read, x0, y0, xr, yr, raw, xr, yr,
                              gdal_type_of(r->info.dtype), r->n_bands, r->bands, (GSpacing)esz,
                              (GSpacing)(esz * (size_t)w), (GSpacing)(esz * plane),
                              &extra) != CE_None)
        return false;
    *what = "mask read";
    return !r->mask || GDALRasterIO(r->mask, GF_Read, x0, y0, xr, yr, r->mask_buf, xr, yr, GDT_Byte,
                                    0, 0) == CE_None;
}

/* A fresh dataset on a remote input after a failed read: GDAL's cached
 * ranges and file state of the object are dropped first. */
static bool reopen(tw_raster *r, gdal_msgs *msgs)
{
    if (r->ds) GDALClose(r->ds);
    r->ds = NULL;
    r->mask = NULL;
    VSICurlPartialClearCache(r->gpath);
    if (!open_ds(r, msgs)) return false;
    find_mask(r);
    return true;
}

/* Can the object still be reached (a fresh HEAD)? Tells an outage from a
 * tile that cannot be read. */
static bool reachable(tw_raster *r)
{
    VSIStatBufL sb;
    VSICurlPartialClearCache(r->gpath);
    return VSIStatExL(r->gpath, &sb, VSI_STAT_EXISTS_FLAG) == 0;
}

/* Window x0, y0 of w x h (xr x yr of it inside the raster) through GDAL
 * into raw, a remote read retried on a fresh dataset as read_window says;
 * GDAL's messages gathered in msgs. */
static tw_status gdal_read_retrying(tw_raster *r, int x0, int y0, int w, int h, int xr, int yr,
                                    void *raw, gdal_msgs *msgs, tw_error *err)
{
    const size_t plane = (size_t)w * (size_t)h;
    tw_status st = TW_OK;
    const char *what = NULL;
    double t0 = tw_clock_now();
    bool ok = gdal_read(r, x0, y0, xr, yr, raw, w, plane, &what);
    int attempt = 0;
    /* GDAL 3.6 retries 429 and 5xx answers itself (GDAL_HTTP_MAX_RETRY),
     * but not a dropped connection or a truncated body, and a dataset
     * that saw one can keep failing. Retry those on a fresh dataset,
     * with backoff, within the span GDAL's own retries would wait; not
     * a decoding error (a damaged block stays damaged). */
    while (!ok && r->remote && !stopping(r) && attempt < r->net.retries &&
           (tw_url_transient(msgs->failure) || tw_url_transient(msgs->last_warning)) &&
           tw_clock_now() - t0 < tw_url_retry_span(r->net.retries, r->net.retry_delay)) {
        attempt++;
        sleep_s(r, tw_url_retry_delay(&r->net, attempt));
        if (stopping(r)) break;
        capture_clear(msgs, true);
        if (!reopen(r, msgs)) continue;
        ok = gdal_read(r, x0, y0, xr, yr, raw, w, plane, &what);
    }
    if (!ok && r->remote && stopping(r)) {
        /* a stop: not an error of the tile, and no HEAD to wait for */
        st = tw_error_set(err, TW_CANCELLED, "%s: stopped while reading window x=%d y=%d", r->path,
                          x0, y0);
    } else if (!ok) {
        bool outage = r->remote && !reachable(r);
        st = tw_error_set(err, outage ? TW_ERR_REMOTE : TW_ERR_INPUT,
                          "%s: %s failed at window x=%d y=%d %dx%d%s: %s%s", r->path, what, x0, y0,
                          w, h,
                          outage ? " and the object is unreachable (network outage; run the "
                                   "same command again to resume)"
                                 : "",
                          capture_text(msgs), timeout_hint(capture_text(msgs)));
    }
    return st;
}

/* tw_raster_read; valid may be NULL when validity_trivial(r): then no
 * validity is computed (*n_nodata = 0). */
static tw_status read_window(tw_raster *r, int x0, int y0, int w, int h, void *raw, uint8_t *valid,
                             int64_t *n_nodata, int64_t *n_inside, tw_error *err)
{
    *n_nodata = 0;
    *n_inside = 0;
    if (x0 < 0 || y0 < 0 || w <= 0 || h <= 0)
        return tw_error_set(err, TW_ERR_INPUT, "%s: invalid window x=%d y=%d %dx%d", r->path, x0,
                            y0, w, h);

    const size_t esz = tw_dtype_size(r->info.dtype);
    const size_t plane = (size_t)w * (size_t)h;
    const int xr =
        x0 < r->info.width ? (int)((int64_t)x0 + w > r->info.width ? r->info.width - x0 : w) : 0;
    const int yr =
        y0 < r->info.height ? (int)((int64_t)y0 + h > r->info.height ? r->info.height - y0 : h) : 0;

    /* Zero the padding: the right part of the clipped rows and the rows below. */
    uint8_t *rb = raw;
    for (int b = 0; b < r->n_bands; b++) {
        uint8_t *pl = rb + (size_t)b * plane * esz;
        if (xr < w)
            for (int y = 0; y < yr; y++)
                memset(pl + ((size_t)y * w + xr) * esz, 0, (size_t)(w - xr) * esz);
        memset(pl + (size_t)yr * w * esz, 0, (size_t)(h - yr) * w * esz);
    }
    if (valid) memset(valid, 0, plane);
    if (xr == 0 || yr == 0) return TW_OK;

    gdal_msgs msgs;
    capture_begin(&msgs);
    tw_status st = TW_OK;
    size_t need = (size_t)xr * (size_t)yr;
    if (r->mask && need > r->mask_cap) {
        tw_free(r->mask_buf);
        r->mask_buf = tw_alloc(TW_MEM_OTHER, need);
        r->mask_cap = r->mask_buf ? need : 0;
        if (!r->mask_buf)
            st = tw_error_set(err, TW_ERR_NOMEM,
                              "%s: out of memory for the mask of window x=%d y=%d %dx%d", r->path,
                              x0, y0, w, h);
    }
    if (st != TW_OK) {
        /* reported above */
    } else if (r->tiff) {
        tw_error terr;
        tw_error_init(&terr);
        st = tw_tiff_read(r->tiff, x0, y0, xr, yr, raw, w, h, &terr);
        if (st != TW_OK)
            tw_error_set(err, st, "%s: read failed at window x=%d y=%d %dx%d: %s", r->path, x0, y0,
                         w, h, terr.msg);
    } else {
        st = gdal_read_retrying(r, x0, y0, w, h, xr, yr, raw, &msgs, err);
    }
    capture_end();
    if (st != TW_OK) return st;
    if (!valid) {
        *n_inside = (int64_t)xr * yr;
        return TW_OK;
    }

    for (int y = 0; y < yr; y++) {
        uint8_t *vrow = valid + (size_t)y * w;
        if (r->mask) {
            const uint8_t *mrow = r->mask_buf + (size_t)y * xr;
            for (int x = 0; x < xr; x++) vrow[x] = mrow[x] != 0;
        } else {
            memset(vrow, 1, (size_t)xr);
        }
    }
    for (int b = 0; b < r->n_bands; b++)
        tw_mark_nodata(r->info.dtype, rb + (size_t)b * plane * esz, w, xr, yr, r->use_nodata,
                       r->nodata_value, valid);

    int64_t inside = (int64_t)xr * yr, good = 0;
    for (int y = 0; y < yr; y++) {
        const uint8_t *vrow = valid + (size_t)y * w;
        for (int x = 0; x < xr; x++) good += vrow[x];
    }
    *n_inside = inside;
    *n_nodata = inside - good;
    return TW_OK;
}

tw_status tw_raster_read(tw_raster *r, int x0, int y0, int w, int h, void *raw, uint8_t *valid,
                         int64_t *n_nodata, int64_t *n_inside, tw_error *err)
{
    return read_window(r, x0, y0, w, h, raw, valid, n_nodata, n_inside, err);
}

/* ---- strips of tiles --------------------------------------------------------- */

size_t tw_raster_strip_bytes(int w, int h, int bands, tw_dtype dtype, bool mask)
{
    size_t px = (size_t)w * (size_t)h;
    /* raw planes, the validity plane, and the mask scratch when the raster has a mask */
    return px * ((size_t)bands * tw_dtype_size(dtype) + 1 + (mask ? 1 : 0));
}

bool tw_raster_has_mask(const tw_raster *r)
{
    return r->mask != NULL;
}

tw_status tw_raster_reserve_strip(tw_raster *r, int max_w, int h, tw_error *err)
{
    if (max_w <= 0 || h <= 0)
        return tw_error_set(err, TW_ERR_INTERNAL, "%s: strip of %d x %d pixels", r->path, max_w, h);
    size_t bytes = tw_raster_strip_bytes(max_w, h, r->n_bands, r->info.dtype, false);
    uint8_t *buf = tw_alloc(TW_MEM_READ, bytes);
    if (!buf)
        return tw_error_set(err, TW_ERR_NOMEM, "%s: cannot allocate a read strip of %d x %d pixels",
                            r->path, max_w, h);
    size_t px = (size_t)max_w * (size_t)h;
    if (r->mask && r->mask_cap < px) {
        tw_free(r->mask_buf);
        r->mask_buf = tw_alloc(TW_MEM_READ, px);
        r->mask_cap = r->mask_buf ? px : 0;
        if (!r->mask_buf) {
            tw_free(buf);
            return tw_error_set(err, TW_ERR_NOMEM,
                                "%s: cannot allocate the mask of a read strip of %d x %d pixels",
                                r->path, max_w, h);
        }
    }
    tw_free(r->strip);
    r->strip = buf;
    r->strip_bytes = bytes;
    r->strip_w = max_w;
    r->strip_h = h;
    return TW_OK;
}

int tw_raster_strip_width(const tw_raster *r)
{
    return r->strip_w;
}

/* Copy the T x T tile at column ox of a [bands][T][w] window into
 * [bands][T][T]. */
static void cut_tile(const uint8_t *win, int w, int T, int ox, int bands, size_t esz, uint8_t *raw)
{
    const size_t wplane = (size_t)w * (size_t)T * esz, tplane = (size_t)T * (size_t)T * esz;
    const size_t row = (size_t)T * esz;
    for (int b = 0; b < bands; b++) {
        const uint8_t *src = win + (size_t)b * wplane + (size_t)ox * esz;
        uint8_t *dst = raw + (size_t)b * tplane;
        for (int y = 0; y < T; y++) memcpy(dst + (size_t)y * row, src + (size_t)y * w * esz, row);
    }
}

/* The validity of the tile at column ox of a window's [T][w] validity;
 * returns its valid pixels. */
static int64_t cut_valid(const uint8_t *wvalid, int w, int T, int ox, uint8_t *valid)
{
    int64_t good = 0;
    for (int y = 0; y < T; y++) {
        const uint8_t *v = wvalid + (size_t)y * w + ox;
        uint8_t *d = valid + (size_t)y * T;
        memcpy(d, v, (size_t)T);
        for (int x = 0; x < T; x++) good += d[x];
    }
    return good;
}

/* Trivial validity: 1 inside the raster (cols_in x rows_in), 0 outside. */
static void fill_valid(int T, int64_t cols_in, int64_t rows_in, uint8_t *valid)
{
    for (int y = 0; y < T; y++) {
        uint8_t *d = valid + (size_t)y * T;
        int64_t in = y < rows_in ? cols_in : 0;
        memset(d, 1, (size_t)in);
        memset(d + in, 0, (size_t)(T - in));
    }
}

tw_status tw_raster_read_tiles(tw_raster *r, int y0, const int *xs, int n, int T, void *raw,
                               uint8_t *valid, int64_t *n_nodata, int64_t *n_inside, tw_error *err)
{
    if (n <= 0) return TW_OK;
    const int x0 = xs[0], w = xs[n - 1] - x0 + T;
    if (!r->strip || T != r->strip_h || w > r->strip_w)
        return tw_error_set(err, TW_ERR_INTERNAL,
                            "%s: a window of %d x %d pixels does not fit the read strip (%d x %d)",
                            r->path, w, T, r->strip_w, r->strip_h);
    const size_t esz = tw_dtype_size(r->info.dtype);
    const bool trivial = validity_trivial(r);
    uint8_t *win = r->strip, *wvalid = r->strip + (size_t)r->n_bands * (size_t)w * T * esz;
    int64_t nod = 0, ins = 0;
    tw_status st = read_window(r, x0, y0, w, T, win, trivial ? NULL : wvalid, &nod, &ins, err);
    if (st != TW_OK) return st;
    const size_t tile_raw = (size_t)r->n_bands * (size_t)T * T * esz, tile_px = (size_t)T * T;
    const int64_t rows_in =
        y0 < r->info.height ? ((int64_t)y0 + T > r->info.height ? r->info.height - y0 : T) : 0;
    for (int i = 0; i < n; i++) {
        cut_tile(win, w, T, xs[i] - x0, r->n_bands, esz, (uint8_t *)raw + (size_t)i * tile_raw);
        int64_t cols_in = xs[i] < r->info.width
                              ? ((int64_t)xs[i] + T > r->info.width ? r->info.width - xs[i] : T)
                              : 0;
        n_inside[i] = cols_in * rows_in;
        uint8_t *v = valid + (size_t)i * tile_px;
        if (trivial) {
            fill_valid(T, cols_in, rows_in, v);
            n_nodata[i] = 0;
        } else {
            /* outside pixels are invalid, so the valid ones are all inside */
            n_nodata[i] = n_inside[i] - cut_valid(wvalid, w, T, xs[i] - x0, v);
        }
    }
    return TW_OK;
}
