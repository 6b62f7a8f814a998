/* identity_cost.c - what fingerprinting a local input for resume costs
 * (io/input/identity.c, issue 27): seconds and bytes read of tw_identity_local on
 * each file given, with the file's pages evicted from the page cache first
 * (posix_fadvise DONTNEED: a cold read of this file only, nothing else's)
 * and then again warm. Built and run by bench/identity_cost.sh.
 *
 *   identity_cost FILE...
 */
#include <fcntl.h>
#include <gdal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "io/input/identity.h"

static void evict(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: identity_cost FILE...\n");
        return 2;
    }
    GDALAllRegister();
    printf("%-44s %14s %8s %12s %10s %10s\n", "file", "bytes", "files", "read_bytes", "cold_s",
           "warm_s");
    for (int i = 1; i < argc; i++) {
        static char out[4096];
        tw_identity_stats st;
        tw_error err;
        tw_error_init(&err);
        evict(argv[i]);
        double t0 = tw_clock_now();
        tw_status s = tw_identity_local(argv[i], out, sizeof out, &st, &err);
        double cold = tw_clock_now() - t0;
        if (s != TW_OK) {
            fprintf(stderr, "%s: %s\n", argv[i], err.msg);
            return 1;
        }
        t0 = tw_clock_now();
        tw_identity_local(argv[i], out, sizeof out, &st, &err);
        double warm = tw_clock_now() - t0;
        FILE *f = fopen(argv[i], "rb");
        long long size = -1;
        if (f && fseek(f, 0, SEEK_END) == 0) size = ftell(f);
        if (f) fclose(f);
        printf("%-44s %14lld %8d %12lld %10.4f %10.4f\n", argv[i], size, st.files,
               (long long)st.bytes_read, cold, warm);
    }
    return 0;
}
