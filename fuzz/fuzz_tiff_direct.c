/* fuzz_tiff_direct.c - libFuzzer harness for the direct libtiff reader
 * (io/input/tiff_direct.c), structure-aware: the input describes a tiled TIFF
 * that libtiff writes to a scratch file in /dev/shm; the reader must give
 * back exactly the samples written, or with the input's corrupt flag fail
 * cleanly (tests/tiff_roundtrip.h says what is checked). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "tests/tiff_roundtrip.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char scratch[64];

static void remove_scratch(void)
{
    if (scratch[0]) unlink(scratch);
}

static void quiet(const char *module, const char *fmt, va_list ap)
{
    (void)module, (void)fmt, (void)ap;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!scratch[0]) {
        snprintf(scratch, sizeof scratch, "/dev/shm/tw_fuzz_tiff_%d.tif", (int)getpid());
        atexit(remove_scratch);
        /* libtiff's global handlers (the writer's) print to stderr */
        TIFFSetErrorHandler(quiet);
        TIFFSetWarningHandler(quiet);
    }
    char why[256];
    if (tw_tiff_roundtrip(data, size, scratch, why, sizeof why) != 0) {
        fprintf(stderr, "fuzz_tiff: %s\n", why);
        __builtin_trap();
    }
    return 0;
}
