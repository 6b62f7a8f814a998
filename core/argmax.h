/* argmax.h - a cell's class from its probabilities: the first highest,
 * compared with a strict '>' (the lowest class index wins a tie; a NaN never
 * wins). The one rule the class raster, the histograms, the tile tables and
 * the resampled products share. */
#ifndef TW_ARGMAX_H
#define TW_ARGMAX_H

#include <stddef.h>

/* The class of p[0..n); 0 when n < 1. Cannot fail. */
static inline int tw_argmax(const float *p, size_t n)
{
    size_t best = 0;
    for (size_t c = 1; c < n; c++)
        if (p[c] > p[best]) best = c;
    return (int)best;
}

#endif
