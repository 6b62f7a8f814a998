/* maxpool.c - see maxpool.h.
 *
 * One output pixel at a time, 8 channels per step in a vector register
 * (model/vec8.h): the up to nine window values of a step are contiguous
 * 8-float runs of the blocked source, and the pixel's channels land
 * contiguous in nhwc.
 */
#include "model/maxpool.h"

#include <math.h>

#include "model/vec8.h"

/* *m = the larger of *m and *v per lane; *v where either is NaN (vmaxps'
 * rule: the pipeline's tiles have none, normalize.c zeroes invalid pixels).
 */
static inline void vmax(tw_v8 *m, const tw_v8 *v)
{
    tw_v8i gt = *m > *v;
    *m = (tw_v8)(((tw_v8i)*m & gt) | ((tw_v8i)*v & ~gt));
}

/* Output row oy of image img. */
TW_CLONES
static void pool_row(const float *x, int c, int h, int blk, int img, int oy, float *y)
{
    const int oh = tw_maxpool_out(h), nb = (c + blk - 1) / blk;
    const int y0 = 2 * oy - 1, ky0 = y0 < 0 ? 1 : 0, ky1 = y0 + 3 > h ? h - y0 : 3;
    const tw_v8 lowest = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                          -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    for (int ox = 0; ox < oh; ox++) {
        const int x0 = 2 * ox - 1, kx0 = x0 < 0 ? 1 : 0, kx1 = x0 + 3 > h ? h - x0 : 3;
        float *dst = y + (((size_t)img * oh + oy) * oh + ox) * c;
        for (int b = 0; b < nb; b++) {
            const float *plane = x + ((size_t)img * nb + b) * h * h * blk;
            for (int s = 0; s < blk; s += TW_VW) {
                int c0 = b * blk + s, cw = c - c0 < TW_VW ? c - c0 : TW_VW;
                if (cw <= 0) break;
                tw_v8 m = lowest;
                for (int ky = ky0; ky < ky1; ky++)
                    for (int kx = kx0; kx < kx1; kx++) {
                        tw_v8 v;
                        tw_v8_load(&v, plane + ((size_t)(y0 + ky) * h + x0 + kx) * blk + s, TW_VW);
                        vmax(&m, &v);
                    }
                tw_v8_store(dst + c0, &m, cw);
            }
        }
    }
}

void tw_maxpool_blocked_to_nhwc(const float *x, int n, int c, int h, int blk, float *y)
{
    const int oh = tw_maxpool_out(h);
    const long rows = (long)n * oh;
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) pool_row(x, c, h, blk, (int)(r / oh), (int)(r % oh), y);
}
