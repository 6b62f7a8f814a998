/* polygons_rss.c - peak memory and time of the polygons product (issue 30.1).
 *
 *   polygons_rss CLASS.tif CONF.tif OUT.gpkg|OUT.fgb SCRATCH_DIR [MIN_AREA [CACHE_MIB]]
 *
 * Runs tw_polygons_write (io/output/polygons.h: sieve, polygonize, labelling,
 * output) on a class map as a run's assembly does, with GDAL's block cache
 * set to CACHE_MIB (default 64), and prints the features, the seconds, the
 * process's peak RSS (VmHWM) before and after, the counting allocator's
 * peak and tw_polygons_memory's estimate for the regions found. The class
 * map is any Byte raster with nodata 255 (bench/polygons_rss.py makes a
 * synthetic one of any size).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gdal.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "io/output/polygons.h"
#include "pipeline/engine/budget.h"

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr,
                "usage: polygons_rss CLASS.tif CONF.tif OUT SCRATCH [MIN_AREA [CACHE_MIB]]\n");
        return 2;
    }
    double min_area = argc > 5 ? atof(argv[5]) : 0;
    long cache = argc > 6 ? atol(argv[6]) : 64;
    GDALAllRegister();
    GDALSetCacheMax64((GIntBig)cache << 20);
    static char names[TW_MAX_CLASSES][TW_NAME_MAX];
    for (int c = 0; c < TW_MAX_CLASSES; c++) snprintf(names[c], TW_NAME_MAX, "class_%d", c);
    size_t l = strlen(argv[3]);
    tw_polygons_params p = {
        .class_path = argv[1],
        .conf_path = argv[2],
        .path = argv[3],
        .scratch_dir = argv[4],
        .format = l > 4 && strcmp(argv[3] + l - 4, ".fgb") == 0 ? TW_VECTOR_FGB : TW_VECTOR_GPKG,
        .n_classes = TW_MAX_CLASSES,
        .class_names = (const char(*)[TW_NAME_MAX])names,
        .min_area = min_area,
        .max_bytes = (size_t)2 << 30, /* as a run with runtime.memory 2GiB: the counting pass */
    };
    size_t rss0 = tw_rss_peak();
    double t0 = tw_clock_now();
    tw_error err;
    tw_error_init(&err);
    int64_t n = 0;
    tw_status st = tw_polygons_write(&p, &n, &err);
    double t = tw_clock_now() - t0;
    if (st != TW_OK) {
        fprintf(stderr, "polygons_rss: %s\n", err.msg);
        return 1;
    }
    GDALDatasetH ds = GDALOpen(argv[1], GA_ReadOnly);
    int w = ds ? GDALGetRasterXSize(ds) : 0, h = ds ? GDALGetRasterYSize(ds) : 0;
    if (ds) GDALClose(ds);
    char a[32], b[32], c[32], e[32];
    printf("features %lld, %.1f s, peak RSS %s (before %s), tw_alloc peak %s, estimate %s "
           "(GDAL cache %ld MiB)\n",
           (long long)n, t, tw_format_bytes(tw_rss_peak(), a, sizeof a),
           tw_format_bytes(rss0, b, sizeof b),
           tw_format_bytes(tw_mem_peak(TW_MEM_TAG_COUNT), c, sizeof c),
           tw_format_bytes(tw_polygons_memory(w, h, n) + ((size_t)cache << 20), e, sizeof e),
           cache);
    return 0;
}
