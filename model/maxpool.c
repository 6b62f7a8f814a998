/* maxpool.c - see maxpool.h.
 *
 * One output pixel at a time, 8 channels per step in a vector register
 * (GCC's vector extension, lowered by each target_clones build to its own
 * instructions, as in winograd.c): the up to nine window values of a step
 * are contiguous 8-float runs of the blocked source, and the pixel's
 * channels land contiguous in nhwc.
 */
#include "model/maxpool.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                             \
    !defined(__SANITIZE_ADDRESS__)
#define TW_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TW_CLONES
#endif

enum { VW = 8 };
typedef float v8 __attribute__((vector_size(VW * sizeof(float))));
typedef int v8i __attribute__((vector_size(VW * sizeof(int))));

/* *m = the larger of *m and *v per lane; *v where either is NaN (vmaxps'
 * rule: the pipeline's tiles have none, normalize.c zeroes invalid pixels).
 * By pointer: a 32-byte vector argument would draw GCC's ABI note. */
static inline void vmax(v8 *m, const v8 *v)
{
    v8i gt = *m > *v;
    *m = (v8)(((v8i)*m & gt) | ((v8i)*v & ~gt));
}

/* Output row oy of image img. */
TW_CLONES
static void pool_row(const float *x, int c, int h, int blk, int img, int oy, float *y)
{
    const int oh = tw_maxpool_out(h), nb = (c + blk - 1) / blk;
    const int y0 = 2 * oy - 1, ky0 = y0 < 0 ? 1 : 0, ky1 = y0 + 3 > h ? h - y0 : 3;
    const v8 lowest = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                       -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    for (int ox = 0; ox < oh; ox++) {
        const int x0 = 2 * ox - 1, kx0 = x0 < 0 ? 1 : 0, kx1 = x0 + 3 > h ? h - x0 : 3;
        float *dst = y + (((size_t)img * oh + oy) * oh + ox) * c;
        for (int b = 0; b < nb; b++) {
            const float *plane = x + ((size_t)img * nb + b) * h * h * blk;
            for (int s = 0; s < blk; s += VW) {
                int c0 = b * blk + s, cw = c - c0 < VW ? c - c0 : VW;
                if (cw <= 0) break;
                v8 m = lowest;
                for (int ky = ky0; ky < ky1; ky++)
                    for (int kx = kx0; kx < kx1; kx++) {
                        v8 v;
                        memcpy(&v, plane + ((size_t)(y0 + ky) * h + x0 + kx) * blk + s, sizeof v);
                        vmax(&m, &v);
                    }
                if (cw == VW)
                    memcpy(dst + c0, &m, sizeof m);
                else
                    memcpy(dst + c0, &m, (size_t)cw * sizeof(float));
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
