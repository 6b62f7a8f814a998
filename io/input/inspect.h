/* inspect.h - what `tilewise info` and `validate` learn about a raster from
 * GDAL, as data. The CLI (workflows/main.c) prints it, as text or JSON, and
 * turns it into advice; this module prints nothing and decides nothing.
 * GDAL's messages go through io/gdal_msgs.h into the caller's tw_error.
 */
#ifndef TW_INSPECT_H
#define TW_INSPECT_H

#include <stdbool.h>

#include "core/error.h"

typedef struct tw_inspect_band {
    char type[32]; /* GDAL's name: "Byte", "UInt16", ... */
    int block_w, block_h;
    bool has_nodata;
    double nodata;
    char description[256];
    char color[32]; /* colour interpretation: "Red", "Gray", "Undefined", ... */
    int overviews;
    bool has_stats; /* GDAL already has statistics (no scan is made) */
    double min, max;
} tw_inspect_band;

typedef struct tw_inspect {
    char driver[32];
    int width, height, band_count;
    bool has_geotransform;
    double geotransform[6];
    bool has_crs;        /* the raster has a CRS at all */
    bool crs_understood; /* and GDAL/PROJ can read it */
    bool crs_geographic;
    char crs[256];      /* "EPSG:31985 (SIRGAS 2000 / UTM zone 25S)", "none", "not understood" */
    char crs_kind[16];  /* "geographic", "projected", "local"; "" without a CRS */
    bool has_metres;    /* the CRS and the geotransform give ground metres: */
    char crs_units[64]; /* the CRS's unit name ("" unless has_metres) */
    double metres_x, metres_y; /* ground metres per CRS unit at the centre (when crs_units) */
    char layout[64];           /* IMAGE_STRUCTURE LAYOUT ("COG"), "" when absent */
    char compression[64];      /* IMAGE_STRUCTURE COMPRESSION, "" when absent */
    tw_inspect_band *bands;    /* [band_count], owned */
} tw_inspect;

/* Open path (as GDAL names it: /vsicurl/... for a URL, io/url.h) read-only
 * and describe it. TW_ERR_INPUT "SHOWN: not a raster GDAL can open[: GDAL's
 * reason, redacted]" when it cannot; shown is what messages call the input
 * (its redacted form). On success *out is released with tw_inspect_destroy.
 * Thread-safe. */
tw_status tw_inspect_raster(const char *path, const char *shown, tw_inspect **out, tw_error *err);
void tw_inspect_destroy(tw_inspect *ri);

/* Pixel size in ground metres (x, y), or false without has_metres. */
bool tw_inspect_pixel_metres(const tw_inspect *ri, double *px, double *py);

/* What tw_inspect_band_stats learns of one band. */
typedef struct tw_band_stats {
    const char *how; /* "statistics" (GDAL's stored ones), "sampled" (read here);
                        "" when neither gives a finite value; NULL: no such band */
    bool ok;         /* min..max, mean and sd are finite */
    double min, max, mean, sd;
} tw_band_stats;

/* Approximate statistics of each of the n 1-based bands of path: GDAL's
 * stored statistics when it has them, else read here: the whole band when
 * it is TW_INSPECT_SAMPLES windows of 256 x 256 pixels or fewer, else that
 * many such windows (block-aligned when the blocks are that small) at the
 * centres of an 8 x 8 grid over the raster, leaving out the band's nodata value, masked and NaN
 * pixels. Reads a bounded number of pixels whatever the raster's size; writes nothing (no .aux.xml:
 * GDAL's ComputeStatistics would). TW_ERR_INPUT when the raster cannot be opened. Thread-safe. */
#define TW_INSPECT_SAMPLES 64
tw_status tw_inspect_band_stats(const char *path, const int *bands, int n, tw_band_stats *out,
                                tw_error *err);

#endif
