/* maxpool.h - ResNet's 3x3 stride-2 max pooling from the stem's blocked
 * layout straight into nhwc, for the CPU backend's nhwc plans (AVX2-class
 * CPUs).
 *
 * There the stem's 7x7 convolution on a few input bands writes oneDNN's
 * blocked layout nChw8c (or nChw16c), which oneDNN's pooling reads, and a
 * reorder then brought the pooled map to the nhwc the next layers read:
 * 1.5-1.9 ms and 0.27 ms per batch of four 224-px tiles on two AVX2 cores,
 * where this one pass takes 0.46-0.79 ms (bench/RESULTS.md). A maximum is
 * exact, so the values are oneDNN's to the bit; pixels outside the map are
 * left out of the window (padding counts as -infinity), as in PyTorch.
 *
 * Allocates nothing, takes no locks; splits its work over OpenMP threads by
 * output rows, each output value computed by one thread.
 */
#ifndef TW_MAXPOOL_H
#define TW_MAXPOOL_H

/* The output side for an h x h map: floor((h + 2 - 3) / 2) + 1. */
static inline int tw_maxpool_out(int h)
{
    return (h - 1) / 2 + 1;
}

/* y, nhwc [n][oh][oh][c], from x in nChw{blk}c ([n][ceil(c / blk)][h][h][blk],
 * the channels past c in the last block ignored); blk is 8 or 16. */
void tw_maxpool_blocked_to_nhwc(const float *x, int n, int c, int h, int blk, float *y);

#endif
