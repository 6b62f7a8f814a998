/* normalize.h - raw pixels to model input, on the fly, with OpenMP.
 *
 * x = (v * scale - mean[c]) / std[c] per selected band; pixels whose valid
 * flag is 0 (nodata or outside the raster) become 0 after normalization.
 */
#ifndef TW_NORMALIZE_H
#define TW_NORMALIZE_H

#include <stdint.h>

#include "core/dtype.h"
#include "core/params.h"

/* Normalize n tiles: raw [n][bands][h][w] of type t, valid [n][h][w],
 * into x [n][bands][h][w]. Parallel over tiles and bands with `threads`
 * OpenMP threads (0: OpenMP's default; 1: no team at all, on the calling
 * thread). Cannot fail; thread-safe for distinct outputs. */
void tw_normalize(const void *raw, tw_dtype t, const uint8_t *valid, int n, int h, int w,
                  const tw_norm *norm, int threads, float *x);

#endif
