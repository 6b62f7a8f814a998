/* calib.h - what int8 calibration decides from fp32 numbers, apart from any
 * backend: the range of each activation tensor, and which tiles of the
 * calibration sample may set those ranges. Pure functions on host arrays,
 * so that their edge cases (NaN, Inf, +-3e38) are tested directly
 * (tests/test_cpu_backend.c). Used by model/cpu_int8.c (and
 * model/cpu_backend.c's memory estimate). */
#ifndef TW_CALIB_H
#define TW_CALIB_H

#include <stdbool.h>
#include <stddef.h>

/* The range to quantize v[0..n) to `levels` steps (255 for u8, 127 for s8
 * per side): the clip c in (0, max|v|] with the least squared error,
 * counting rounding (step^2 / 12 per value below c) and clipping
 * ((|x| - c)^2 above it), from a histogram of |v|. Non-finite values are
 * ignored; no value, however large, can index outside the histogram.
 * Returns a finite value >= 0 (0 when v holds no finite non-zero value).
 * Allocates nothing; thread-safe. */
float tw_calib_range(const float *v, size_t n, int levels);

/* The same over values seen in parts (a sample larger than a batch): the
 * largest finite |v| of every part first (tw_calib_max), then each part
 * counted into one histogram of TW_CALIB_BINS bins over [0, m]
 * (tw_calib_hist_add; values over m or non-finite are left out), then the
 * clip from it (tw_calib_hist_range, 0 when m is not > 0). Counting is
 * exact, so the parts give tw_calib_range's answer on their union. */
enum { TW_CALIB_BINS = 2048 };
float tw_calib_max(const float *v, size_t n);
void tw_calib_hist_add(double *hist, float m, const float *v, size_t n);
float tw_calib_hist_range(const double *hist, float m, int levels);

/* Tiles in the calibration sample (pipeline/engine/stages.c): a count of its own,
 * not the batch's, so that the ranges do not depend on runtime.memory. */
enum { TW_CALIB_TILES = 32 };

/* Which of the n tiles of x (tile_floats values each, normalized input)
 * may set the ranges: keep[i] is false for a tile holding a non-finite
 * value, or whose largest |x| exceeds TW_CALIB_OUTLIER times the (lower) median
 * tile's (TW_CALIB_OUTLIER when that median is below 1). Returns how many
 * are kept. Thread-safe. */
#define TW_CALIB_OUTLIER 1000.0f
int tw_calib_keep(const float *x, int n, size_t tile_floats, bool *keep);

#endif
