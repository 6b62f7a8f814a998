/* tiff_roundtrip.h - the property behind fuzz/fuzz_tiff_direct.c, shared
 * with tests/test_fuzz_corpus.c (which replays the committed corpus).
 *
 * The input bytes describe a tiled TIFF: size, tile size, samples per pixel,
 * sample type, chunky or planar, codec, predictor, missing (sparse) tiles,
 * a nodata value, the window size and step to read it with, the decoded-tile
 * cache size, and its pixels (the rest of the bytes, repeated). libtiff
 * writes that file; io/input/tiff_direct.c must accept it and give back, window by
 * window, exactly the samples written (a missing tile: the nodata value, or
 * 0), leave the rest of the caller's buffer alone, and give back every byte
 * it allocated. With the corrupt flag some bytes of the tile data are
 * changed after writing: then reads may fail, with a message, but nothing
 * may crash or leak.
 */
#ifndef TW_TIFF_ROUNDTRIP_H
#define TW_TIFF_ROUNDTRIP_H

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tiffio.h>

#include "io/input/tiff_direct.h"
#include "core/alloc.h"

typedef struct rt_type {
    tw_dtype t;
    uint16_t bps, fmt;
} rt_type;

/* A missing tile's sample: v as the type holds it (clamped, rounded). */
static void rt_fill(const rt_type *ty, double v, uint8_t out[8])
{
    memset(out, 0, 8);
    double lo = 0, hi = 0;
    switch (ty->t) {
    case TW_DT_BYTE: lo = 0, hi = 255; break;
    case TW_DT_INT8: lo = -128, hi = 127; break;
    case TW_DT_UINT16: lo = 0, hi = 65535; break;
    case TW_DT_INT16: lo = -32768, hi = 32767; break;
    case TW_DT_UINT32: lo = 0, hi = 4294967295.0; break;
    case TW_DT_INT32: lo = -2147483648.0, hi = 2147483647.0; break;
    case TW_DT_FLOAT32: {
        float f = (float)v;
        memcpy(out, &f, 4);
        return;
    }
    case TW_DT_FLOAT64: memcpy(out, &v, 8); return;
    }
    double c = v < lo ? lo : v > hi ? hi : nearbyint(v);
    int64_t i = (int64_t)c;
    uint64_t u = (uint64_t)i;     /* two's complement: the low bytes are the type's */
    memcpy(out, &u, ty->bps / 8); /* little-endian host (x86-64) */
}

static int rt_fail(char *why, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int rt_fail(char *why, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
    return 1;
}

/* 0: every check held (or nothing to check); 1: why says what failed. */
static int tw_tiff_roundtrip(const uint8_t *d, size_t n, const char *scratch, char *why,
                             size_t why_len)
{
    static const rt_type types[8] = {
        {TW_DT_BYTE, 8, SAMPLEFORMAT_UINT},       {TW_DT_INT8, 8, SAMPLEFORMAT_INT},
        {TW_DT_UINT16, 16, SAMPLEFORMAT_UINT},    {TW_DT_INT16, 16, SAMPLEFORMAT_INT},
        {TW_DT_UINT32, 32, SAMPLEFORMAT_UINT},    {TW_DT_INT32, 32, SAMPLEFORMAT_INT},
        {TW_DT_FLOAT32, 32, SAMPLEFORMAT_IEEEFP}, {TW_DT_FLOAT64, 64, SAMPLEFORMAT_IEEEFP}};
    static const uint16_t codecs[6] = {COMPRESSION_NONE,          COMPRESSION_LZW,
                                       COMPRESSION_ADOBE_DEFLATE, COMPRESSION_PACKBITS,
                                       COMPRESSION_ZSTD,          COMPRESSION_LZMA};
    why[0] = '\0';
    if (n < 16) return 0;
    const int W = 1 + d[0] % 72, H = 1 + d[1] % 72;
    const uint32_t tw = 16u * (1u + d[2] % 3u), th = 16u * (1u + d[3] % 3u);
    const int spp = 1 + d[4] % 4;
    const rt_type *ty = &types[d[5] % 8];
    const bool separate = d[6] & 1, reversed = d[6] & 2;
    uint16_t comp = codecs[d[7] % 6];
    if (!TIFFIsCODECConfigured(comp)) comp = COMPRESSION_NONE;
    uint16_t pred = PREDICTOR_NONE;
    if (comp != COMPRESSION_NONE && comp != COMPRESSION_PACKBITS) {
        if (d[8] % 3 == 1 && ty->fmt != SAMPLEFORMAT_IEEEFP) pred = PREDICTOR_HORIZONTAL;
        if (d[8] % 3 == 2 && ty->fmt == SAMPLEFORMAT_IEEEFP) pred = PREDICTOR_FLOATINGPOINT;
    }
    /* tile i is missing when bit i % 16 is set; tile 0 never is (with no tile
     * at all libtiff writes no TileOffsets, which makes no TIFF) */
    const unsigned sparse_bits = ((unsigned)d[9] | (unsigned)d[10] << 8) & ~1u;
    const bool sparse = d[11] & 1, has_nd = d[11] & 2, corrupt = d[15] & 4;
    const double nd = (double)d[12] - 100.0;
    const int win = 1 + d[13] % 40, step = 1 + d[14] % 40;
    const size_t cache = (d[15] & 1) ? 1 : (d[15] & 2) ? 4096 : (size_t)1 << 20;
    const uint8_t *px = d + 16;
    const size_t npx = n - 16, esz = ty->bps / 8u;
    const size_t plane = (size_t)W * H * esz;

    uint8_t *img = malloc((size_t)spp * plane);
    size_t tile_bytes = (size_t)tw * th * esz * (separate ? 1 : (size_t)spp);
    uint8_t *tile = malloc(tile_bytes);
    if (!img || !tile) {
        free(img);
        free(tile);
        return 0;
    }
    for (size_t i = 0; i < (size_t)spp * plane; i++) img[i] = npx ? px[i % npx] : 0;

    /* write it */
    TIFF *t = TIFFOpen(scratch, "w");
    if (!t) {
        free(img);
        free(tile);
        return rt_fail(why, why_len, "libtiff cannot write %s", scratch);
    }
    TIFFSetField(t, TIFFTAG_IMAGEWIDTH, (uint32_t)W);
    TIFFSetField(t, TIFFTAG_IMAGELENGTH, (uint32_t)H);
    TIFFSetField(t, TIFFTAG_TILEWIDTH, tw);
    TIFFSetField(t, TIFFTAG_TILELENGTH, th);
    TIFFSetField(t, TIFFTAG_SAMPLESPERPIXEL, (uint16_t)spp);
    TIFFSetField(t, TIFFTAG_BITSPERSAMPLE, ty->bps);
    TIFFSetField(t, TIFFTAG_SAMPLEFORMAT, ty->fmt);
    TIFFSetField(t, TIFFTAG_PLANARCONFIG, separate ? PLANARCONFIG_SEPARATE : PLANARCONFIG_CONTIG);
    TIFFSetField(t, TIFFTAG_PHOTOMETRIC, PHOTOMETRIC_MINISBLACK);
    TIFFSetField(t, TIFFTAG_COMPRESSION, comp);
    if (pred != PREDICTOR_NONE) TIFFSetField(t, TIFFTAG_PREDICTOR, pred);
    if (spp > 1) {
        uint16_t extra[3] = {EXTRASAMPLE_UNSPECIFIED, EXTRASAMPLE_UNSPECIFIED,
                             EXTRASAMPLE_UNSPECIFIED};
        TIFFSetField(t, TIFFTAG_EXTRASAMPLES, (uint16_t)(spp - 1), extra);
    }
    const int planes = separate ? spp : 1, per = separate ? 1 : spp;
    for (int p = 0; p < planes; p++)
        for (uint32_t y0 = 0; y0 < (uint32_t)H; y0 += th)
            for (uint32_t x0 = 0; x0 < (uint32_t)W; x0 += tw) {
                uint32_t idx = TIFFComputeTile(t, x0, y0, 0, (uint16_t)p);
                if (sparse && (sparse_bits >> (idx % 16)) & 1) continue;
                memset(tile, 0, tile_bytes);
                for (uint32_t y = 0; y < th && y0 + y < (uint32_t)H; y++)
                    for (uint32_t x = 0; x < tw && x0 + x < (uint32_t)W; x++)
                        for (int s = 0; s < per; s++)
                            memcpy(tile + (((size_t)y * tw + x) * per + s) * esz,
                                   img + (size_t)(p + s) * plane +
                                       ((size_t)(y0 + y) * W + x0 + x) * esz,
                                   esz);
                TIFFWriteEncodedTile(t, idx, tile, (tmsize_t)tile_bytes);
            }
    TIFFClose(t);
    free(tile);

    if (corrupt && npx) {
        /* change bytes between the 8-byte header and the first IFD (libtiff
         * writes the tile data there): the decoders' error paths */
        FILE *f = fopen(scratch, "r+b");
        uint8_t hdr[8];
        if (f && fread(hdr, 1, 8, f) == 8 && hdr[0] == 'I') {
            uint32_t ifd = (uint32_t)hdr[4] | (uint32_t)hdr[5] << 8 | (uint32_t)hdr[6] << 16 |
                           (uint32_t)hdr[7] << 24;
            for (size_t k = 0; ifd > 8 && k < 4 && k < npx; k++) {
                long off = 8 + (long)((px[k] * 2654435761u) % (ifd - 8));
                uint8_t b = 0;
                if (fseek(f, off, SEEK_SET) == 0 && fread(&b, 1, 1, f) == 1) {
                    b ^= (uint8_t)(px[k] | 1);
                    if (fseek(f, off, SEEK_SET) == 0) fwrite(&b, 1, 1, f);
                }
            }
        }
        if (f) fclose(f);
    }

    /* read it back */
    int rc = 0;
    size_t mem0 = tw_mem_current(TW_MEM_OTHER);
    tw_raster_info info;
    memset(&info, 0, sizeof info);
    info.width = W;
    info.height = H;
    info.band_count = spp;
    info.dtype = ty->t;
    info.has_nodata = has_nd;
    info.nodata = nd;
    int bands[4];
    for (int b = 0; b < spp; b++) bands[b] = reversed ? spp - b : b + 1;
    char reason[160];
    tw_tiff *r = tw_tiff_open(scratch, &info, bands, spp, cache, reason, sizeof reason);
    if (!r) {
        if (!corrupt) rc = rt_fail(why, why_len, "a valid file was refused: %s", reason);
        free(img);
        return rc;
    }
    uint8_t fill[8];
    rt_fill(ty, has_nd ? nd : 0.0, fill);
    const size_t wplane = (size_t)win * win * esz;
    uint8_t *raw = malloc((size_t)spp * wplane);
    for (int y0 = 0; raw && y0 < H && !rc; y0 += step)
        for (int x0 = 0; x0 < W && !rc; x0 += step) {
            int xr = W - x0 < win ? W - x0 : win, yr = H - y0 < win ? H - y0 : win;
            memset(raw, 0xEE, (size_t)spp * wplane);
            tw_error err;
            tw_error_init(&err);
            if (tw_tiff_read(r, x0, y0, xr, yr, raw, win, win, &err) != TW_OK) {
                if (!corrupt)
                    rc = rt_fail(why, why_len, "read failed: %s at %d,%d", err.msg, x0, y0);
                else if (!err.msg[0])
                    rc = rt_fail(why, why_len, "a failed read without a message at %d,%d", x0, y0);
                continue;
            }
            if (corrupt) continue; /* decoded garbage is still garbage written */
            for (int b = 0; b < spp && !rc; b++)
                for (int y = 0; y < win && !rc; y++)
                    for (int x = 0; x < win && !rc; x++) {
                        const uint8_t *got = raw + (size_t)b * wplane + ((size_t)y * win + x) * esz;
                        uint8_t want[8];
                        if (x >= xr || y >= yr) {
                            memset(want, 0xEE, esz); /* outside the part read: untouched */
                        } else {
                            int gx = x0 + x, gy = y0 + y, s = bands[b] - 1;
                            /* the tile index as libtiff numbers them */
                            uint32_t across = ((uint32_t)W + tw - 1) / tw,
                                     down = ((uint32_t)H + th - 1) / th;
                            uint32_t ti = (uint32_t)gy / th * across + (uint32_t)gx / tw +
                                          (separate ? (uint32_t)s * across * down : 0);
                            if (sparse && (sparse_bits >> (ti % 16)) & 1)
                                memcpy(want, fill, esz);
                            else
                                memcpy(want, img + (size_t)s * plane + ((size_t)gy * W + gx) * esz,
                                       esz);
                        }
                        if (memcmp(got, want, esz) != 0)
                            rc = rt_fail(why, why_len, "band %d: wrong sample at x=%d y=%d", b,
                                         x0 + x, y0 + y);
                    }
        }
    free(raw);
    tw_tiff_close(r);
    if (!rc && tw_mem_current(TW_MEM_OTHER) != mem0)
        rc =
            rt_fail(why, why_len, "the reader kept %zu bytes", tw_mem_current(TW_MEM_OTHER) - mem0);
    free(img);
    return rc;
}

#endif
