/* deflate_ab.c - libdeflate against zlib for the DEFLATE tiles the direct
 * libtiff reader (io/input/tiff_direct.c) decodes: every tile of FILE decoded
 * with TIFFReadEncodedTile, as that reader does, once with each of
 * libtiff's DEFLATE sub-codecs (TIFFTAG_DEFLATE_SUBCODEC), alternating,
 * best of ROUNDS; process CPU seconds.
 *
 *   cc -O2 bench/deflate_ab.c -o deflate_ab $(pkg-config --cflags --libs libtiff-4)
 *   ./deflate_ab FILE.tif [ROUNDS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <tiffio.h>

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Decode every tile with sub-codec `sub`; seconds, or -1 on failure. */
static double decode_all(const char *path, int sub, double *mb)
{
    TIFF *t = TIFFOpen(path, "r");
    if (!t) return -1;
    if (!TIFFIsTiled(t)) {
        TIFFClose(t);
        return -1;
    }
    if (TIFFSetField(t, TIFFTAG_DEFLATE_SUBCODEC, sub) != 1) {
        TIFFClose(t);
        return -1;
    }
    tmsize_t size = TIFFTileSize(t);
    void *buf = malloc((size_t)size);
    uint32_t n = TIFFNumberOfTiles(t);
    double t0 = cpu_s();
    for (uint32_t i = 0; i < n; i++)
        if (TIFFReadEncodedTile(t, i, buf, size) < 0) {
            free(buf);
            TIFFClose(t);
            return -1;
        }
    double s = cpu_s() - t0;
    *mb = (double)size * n / 1e6;
    free(buf);
    TIFFClose(t);
    return s;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: deflate_ab FILE.tif [ROUNDS]\n");
        return 2;
    }
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    double best[2] = {1e30, 1e30}, mb = 0;
    for (int r = 0; r < rounds; r++)
        for (int sub = 0; sub < 2; sub++) {
            double s = decode_all(argv[1], sub, &mb);
            if (s < 0) {
                fprintf(stderr, "%s: not a tiled DEFLATE TIFF, or sub-codec %d missing\n", argv[1],
                        sub);
                return 1;
            }
            if (s < best[sub]) best[sub] = s;
        }
    printf("%s: %.0f MB decoded; zlib %.3f s (%.0f MB/s), libdeflate %.3f s (%.0f MB/s): "
           "libdeflate %.2fx\n",
           argv[1], mb, best[0], mb / best[0], best[1], mb / best[1], best[0] / best[1]);
    return 0;
}
