/* read_speed.c - tilewise's raster reader alone: windows/s and MB/s of raw
 * pixels for one file, read the way the pipeline reads it (row-major
 * windows of tile x tile at stride tile), through GDAL and through the
 * direct libtiff path (io/input/tiff_direct.c), alternating, best of REPEAT
 * passes, in the process's CPU seconds.
 *
 *   read_speed FILE TILE [REPEAT]
 *
 * Built by bench/read_speed.sh against build/libtilewise_core.a. Prints one
 * line per reader and the ratio direct / GDAL. The file should be in the
 * page cache (the first pass of each reader warms it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <gdal.h>

#include "io/input/raster.h"

static double now_s(void)
{
    struct timespec ts;
    /* CPU time, not wall time: on a shared VM the time other guests take
     * (steal) would otherwise swamp differences of a few per cent */
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One pass over the raster; seconds, or a negative value on error. */
static double pass(const char *path, int tile, bool gdal_only, long long *windows, double *bytes,
                   const char **reader)
{
    tw_raster_open_params op = {.tiff_direct = !gdal_only};
    tw_error err;
    tw_error_init(&err);
    tw_raster *r = NULL;
    double t0 = now_s();
    if (tw_raster_open_ex(path, NULL, 0, &op, &r, &err) != TW_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    *reader = tw_raster_reader(r, NULL);
    const tw_raster_info *in = tw_raster_get_info(r);
    size_t esz = tw_dtype_size(in->dtype), plane = (size_t)tile * tile;
    int nb = tw_raster_selected_bands(r);
    void *raw = malloc((size_t)nb * plane * esz);
    unsigned char *valid = malloc(plane);
    *windows = 0;
    for (int y = 0; y < in->height; y += tile)
        for (int x = 0; x < in->width; x += tile) {
            int64_t nn, ni;
            if (tw_raster_read(r, x, y, tile, tile, raw, valid, &nn, &ni, &err) != TW_OK) {
                fprintf(stderr, "%s\n", err.msg);
                return -1;
            }
            (*windows)++;
        }
    double dt = now_s() - t0;
    *bytes = (double)in->width * in->height * nb * esz;
    free(raw);
    free(valid);
    tw_raster_close(r);
    return dt;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: read_speed FILE TILE [REPEAT]\n");
        return 2;
    }
    const char *path = argv[1];
    int tile = atoi(argv[2]), repeat = argc > 3 ? atoi(argv[3]) : 3;
    GDALAllRegister();
    /* what tw_run gives a small budget: enough for one tile row of blocks */
    GDALSetCacheMax64(64 << 20);
    double best[2] = {1e30, 1e30}, bytes = 0;
    long long windows = 0;
    const char *reader[2] = {"", ""};
    for (int i = 0; i < repeat + 1; i++)
        for (int g = 0; g < 2; g++) {
            double dt = pass(path, tile, g == 1, &windows, &bytes, &reader[g]);
            if (dt < 0) return 1;
            if (i > 0 && dt < best[g]) best[g] = dt; /* pass 0 warms the page cache */
        }
    for (int g = 0; g < 2; g++)
        printf("%-8s %s tile %d: %lld windows in %.3f s: %.0f windows/s, %.0f MB/s\n",
               g ? "GDAL" : "direct", reader[g], tile, windows, best[g], windows / best[g],
               bytes / best[g] / 1e6);
    printf("direct / GDAL speed: %.2fx\n", best[1] / best[0]);
    return 0;
}
