/* winograd.c - Winograd F(4,3) transforms (see winograd.h).
 *
 * Each transform works on one row (one 4 x 4 output tile of one image) at a
 * time, 8 channels at once: the channels are contiguous in nhwc, so every
 * step below is one elementwise operation on a vector of 8 floats
 * (model/vec8.h), kept in registers from the activation's load to the
 * store. A partial step (the last channels of a width that is no multiple
 * of 8) is padded with zeros on load and cut on store. The row functions are
 * built for AVX-512, AVX2 and plain x86-64 (TW_CLONES), which compute the
 * same bits.
 */
#include "model/winograd.h"

#include <string.h>

#include "model/vec8.h"

void tw_wino_weights(const float *w, int cout, int cin, float *u)
{
    /* G (6 x 3) */
    static const double G[6][3] = {{1.0 / 4, 0, 0},
                                   {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                   {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                   {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                   {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                   {0, 0, 1}};
    for (int o = 0; o < cout; o++)
        for (int i = 0; i < cin; i++) {
            const float *g = w + ((size_t)o * cin + i) * 9;
            double t[6][3];
            for (int a = 0; a < 6; a++)
                for (int b = 0; b < 3; b++)
                    t[a][b] =
                        G[a][0] * g[0 * 3 + b] + G[a][1] * g[1 * 3 + b] + G[a][2] * g[2 * 3 + b];
            for (int a = 0; a < 6; a++)
                for (int b = 0; b < 6; b++) {
                    double s = t[a][0] * G[b][0] + t[a][1] * G[b][1] + t[a][2] * G[b][2];
                    u[((size_t)(a * 6 + b) * cin + i) * cout + o] = (float)s;
                }
        }
}

/* B^T of F(4,3), applied to six vectors (one column or row of the patch). */
static inline void bt6(const tw_v8 a[6], tw_v8 o[6])
{
    o[0] = 4.0f * a[0] - 5.0f * a[2] + a[4];
    o[1] = -4.0f * (a[1] + a[2]) + (a[3] + a[4]);
    o[2] = 4.0f * (a[1] - a[2]) + (a[4] - a[3]);
    o[3] = 2.0f * (a[3] - a[1]) + (a[4] - a[2]);
    o[4] = 2.0f * (a[1] - a[3]) + (a[4] - a[2]);
    o[5] = 4.0f * a[1] - 5.0f * a[3] + a[5];
}

/* A^T of F(4,3): six vectors in, four out. */
static inline void at6(const tw_v8 a[6], tw_v8 o[4])
{
    tw_v8 s12 = a[1] + a[2], d12 = a[1] - a[2], s34 = a[3] + a[4], d34 = a[3] - a[4];
    o[0] = a[0] + s12 + s34;
    o[1] = d12 + 2.0f * d34;
    o[2] = s12 + 4.0f * s34;
    o[3] = d12 + 8.0f * d34 + a[5];
}

/* One row of V: the 6 x 6 patch at (4 ty - 1, 4 tx - 1) of image img. The
 * patches inside the map (most of them) load without checks. */
TW_CLONES
static void input_row(const float *x, int h, int c, int img, int ty, int tx, size_t rows, size_t r,
                      float *v)
{
    const int y0 = TW_WINO_OUT * ty - 1, x0 = TW_WINO_OUT * tx - 1;
    const bool inside = y0 >= 0 && y0 + TW_WINO_IN <= h && x0 >= 0 && x0 + TW_WINO_IN <= h;
    const float *base = x + (size_t)img * h * h * c;
    const size_t ps = rows * (size_t)c; /* from one plane of V to the next */
    float *vr = v + r * (size_t)c;
    for (int c0 = 0; c0 < c; c0 += TW_VW) {
        int cw = c - c0 < TW_VW ? c - c0 : TW_VW;
        tw_v8 t[6][6];
        /* columns: t[.][j] = B^T d[.][j], d read straight from x */
#pragma GCC unroll 6
        for (int j = 0; j < 6; j++) {
            tw_v8 d[6], b[6];
            if (inside && cw == TW_VW) {
                const float *p = base + ((size_t)y0 * h + x0 + j) * c + c0;
#pragma GCC unroll 6
                for (int i = 0; i < 6; i++) tw_v8_load(&d[i], p + (size_t)i * h * c, TW_VW);
            } else {
                int ix = x0 + j;
                for (int i = 0; i < 6; i++) {
                    int iy = y0 + i;
                    bool in = iy >= 0 && iy < h && ix >= 0 && ix < h;
                    if (in)
                        tw_v8_load(&d[i], base + ((size_t)iy * h + ix) * c + c0, cw);
                    else
                        d[i] = (tw_v8){0};
                }
            }
            bt6(d, b);
#pragma GCC unroll 6
            for (int i = 0; i < 6; i++) t[i][j] = b[i];
        }
        /* rows: V[i][.] = B^T t[i][.] */
#pragma GCC unroll 6
        for (int i = 0; i < 6; i++) {
            tw_v8 o[6];
            bt6(t[i], o);
            float *q = vr + (size_t)(i * 6) * ps + c0;
            if (cw == TW_VW) { /* (the whole-vector loop apart: 4-6 % faster, own_kernels) */
#pragma GCC unroll 6
                for (int j = 0; j < 6; j++) tw_v8_store(q + j * ps, &o[j], TW_VW);
            } else {
                for (int j = 0; j < 6; j++) tw_v8_store(q + j * ps, &o[j], cw);
            }
        }
    }
}

void tw_wino_input(const float *x, int n, int h, int c, size_t stride, float *v)
{
    int t = tw_wino_tiles(h);
    long rows = (long)tw_wino_rows(n, h);
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        int img = (int)(r / ((long)t * t)), rest = (int)(r % ((long)t * t));
        input_row(x, h, c, img, rest / t, rest % t, stride, (size_t)r, v);
    }
}

/* One row of y: the 4 x 4 output tile (ty, tx) of image img. */
TW_CLONES
static void output_row(const float *m, int h, int c, int img, int ty, int tx, size_t rows, size_t r,
                       const float *bias, bool sum, bool relu, float *y)
{
    const size_t ps = rows * (size_t)c; /* from one plane of M to the next */
    const float *mr = m + r * (size_t)c;
    for (int c0 = 0; c0 < c; c0 += TW_VW) {
        int cw = c - c0 < TW_VW ? c - c0 : TW_VW;
        tw_v8 t[4][6];
        /* columns: t[.][j] = A^T m[.][j] */
#pragma GCC unroll 6
        for (int j = 0; j < 6; j++) {
            tw_v8 col[6], o[4];
#pragma GCC unroll 6
            for (int i = 0; i < 6; i++) tw_v8_load(&col[i], mr + (size_t)(i * 6 + j) * ps + c0, cw);
            at6(col, o);
            for (int i = 0; i < 4; i++) t[i][j] = o[i];
        }
        const tw_v8 zero = {0};
        tw_v8 bb;
        tw_v8_load(&bb, bias + c0, cw);
        /* rows: y[i][.] = A^T t[i][.], plus the bias, the residual, the ReLU */
        for (int i = 0; i < 4; i++) {
            int oy = TW_WINO_OUT * ty + i;
            if (oy >= h) break;
            tw_v8 o[4];
            at6(t[i], o);
            for (int j = 0; j < 4; j++) {
                int ox = TW_WINO_OUT * tx + j;
                if (ox >= h) break;
                float *dst = y + (((size_t)img * h + oy) * h + ox) * c + c0;
                tw_v8 res = o[j] + bb;
                if (sum) {
                    tw_v8 old;
                    tw_v8_load(&old, dst, cw);
                    res += old;
                }
                if (relu) res = (tw_v8)((tw_v8i)res & (res > zero)); /* NaN and -0 to +0 */
                tw_v8_store(dst, &res, cw);
            }
        }
    }
}

void tw_wino_output(const float *m, int n, int h, int c, size_t stride, const float *bias, bool sum,
                    bool relu, float *y)
{
    int t = tw_wino_tiles(h);
    long rows = (long)tw_wino_rows(n, h);
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        int img = (int)(r / ((long)t * t)), rest = (int)(r % ((long)t * t));
        output_row(m, h, c, img, rest / t, rest % t, stride, (size_t)r, bias, sum, relu, y);
    }
}
