/* winograd.h - Winograd F(4,3) transforms for 3x3 stride-1 convolutions on
 * channels-last (nhwc) fp32 activations, for CPUs where oneDNN has no
 * Winograd kernel (oneDNN 2.6 has one for AVX-512 only).
 *
 * A 3x3 convolution with padding 1 on an h x h map is cut into t x t output
 * tiles of 4 x 4 (t = ceil(h / 4)); each reads a 6 x 6 input patch. In the
 * Winograd domain the convolution becomes 36 independent matrix products,
 * one per point xi of the 6 x 6 transform:
 *
 *     M[xi] (rows x Cout) = V[xi] (rows x Cin) . U[xi] (Cin x Cout)
 *
 * with rows = n t^2 (every tile of every image of the batch). The products
 * are left to a GEMM library (the CPU backend uses one oneDNN batched
 * matmul); this module does the three transforms around them:
 *
 *   weights  U = G g G^T  (once, at reserve; in double, rounded once)
 *   input    V = B^T d B  (per batch)
 *   output   y = A^T m A + bias, then + the old y (residual), then ReLU
 *
 * with the usual interpolation points 0, 1, -1, 2, -2 and infinity. The
 * multiplies drop from 9 per output pixel to 36 / 16 = 2.25. The transforms
 * add a rounding error of about 1e-6 relative (as oneDNN's own Winograd).
 *
 * Layouts (row r = (image * t + tile_y) * t + tile_x):
 *   x, y: nhwc [n][h][h][C] fp32
 *   V:    [36][stride][Cin],  U: [36][Cin][Cout],  M: [36][stride][Cout]
 * where stride >= rows is the caller's: rows past `rows` are not touched
 * (the CPU backend pads the products to a row count that oneDNN's GEMM
 * computes alike for every row; see cpu_next_rows in model/cpu_lower.c).
 *
 * The transforms allocate nothing, take no locks and split their work over
 * OpenMP threads by rows; each output element is computed by one thread in a
 * fixed order, so results do not depend on the thread count.
 */
#ifndef TW_WINOGRAD_H
#define TW_WINOGRAD_H

#include <stdbool.h>
#include <stddef.h>

enum { TW_WINO_POINTS = 36 /* 6 x 6 */, TW_WINO_OUT = 4, TW_WINO_IN = 6 };

/* Tiles per side of an h x h map. */
static inline int tw_wino_tiles(int h)
{
    return (h + TW_WINO_OUT - 1) / TW_WINO_OUT;
}

/* Rows of the matrix products for n images of h x h. */
static inline size_t tw_wino_rows(int n, int h)
{
    size_t t = (size_t)tw_wino_tiles(h);
    return (size_t)n * t * t;
}

/* U [36][cin][cout] from w [cout][cin][3][3] (OIHW). Cannot fail. */
void tw_wino_weights(const float *w, int cout, int cin, float *u);

/* V [36][stride][c] from x, nhwc [n][h][h][c]: rows 0 .. tw_wino_rows(n, h)
 * - 1 of each plane; pixels outside the map (padding, and the part of the
 * last tiles beyond it) read as 0. Cannot fail. */
void tw_wino_input(const float *x, int n, int h, int c, size_t stride, float *v);

/* y, nhwc [n][h][h][c], from M [36][stride][c]: y = A^T m A + bias[c], plus
 * the old y where `sum` (a residual add), then max(0, .) where `relu`. Only
 * the h x h pixels are written. Cannot fail. */
void tw_wino_output(const float *m, int n, int h, int c, size_t stride, const float *bias, bool sum,
                    bool relu, float *y);

#endif
