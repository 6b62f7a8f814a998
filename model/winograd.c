/* winograd.c - Winograd F(4,3) transforms (see winograd.h).
 *
 * Each transform works on one row (one 4 x 4 output tile of one image) at a
 * time, CH channels at once: the channels are contiguous in nhwc, so every
 * step below is one elementwise operation over CH floats, which the
 * compiler turns into vector instructions. The row functions are built
 * for AVX-512, AVX2 and plain x86-64 (target_clones: the loader picks one
 * for the CPU); none uses FMA contraction (C11 mode: -ffp-contract=off), so
 * the three compute the same bits.
 */
#include "model/winograd.h"

#include <string.h>

enum { CH = 16 }; /* channels per step */

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                             \
    !defined(__SANITIZE_ADDRESS__)
#define TW_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TW_CLONES
#endif

/* Copy cw <= CH floats: a whole step as one fixed-size copy (vector moves;
 * a variable-length memcpy of 64 bytes becomes `rep movs`, which costs
 * more than the transform), a partial one as a plain loop. */
static inline void copy_ch(float *restrict dst, const float *restrict src, int cw)
{
    if (cw == CH)
        memcpy(dst, src, CH * sizeof(float));
    else
        for (int k = 0; k < cw; k++) dst[k] = src[k];
}

/* B^T of F(4,3), applied to the six values a[0..5] (one column or row). */
#define BT_ROW(o, a, k)                                                                            \
    do {                                                                                           \
        float a0 = (a)[0][k], a1 = (a)[1][k], a2 = (a)[2][k], a3 = (a)[3][k], a4 = (a)[4][k],      \
              a5 = (a)[5][k];                                                                      \
        (o)[0][k] = 4.0f * a0 - 5.0f * a2 + a4;                                                    \
        (o)[1][k] = -4.0f * (a1 + a2) + (a3 + a4);                                                 \
        (o)[2][k] = 4.0f * (a1 - a2) + (a4 - a3);                                                  \
        (o)[3][k] = 2.0f * (a3 - a1) + (a4 - a2);                                                  \
        (o)[4][k] = 2.0f * (a1 - a3) + (a4 - a2);                                                  \
        (o)[5][k] = 4.0f * a1 - 5.0f * a3 + a5;                                                    \
    } while (0)

/* A^T of F(4,3): six values in, four out. */
#define AT_ROW(o, a, k)                                                                            \
    do {                                                                                           \
        float a0 = (a)[0][k], a1 = (a)[1][k], a2 = (a)[2][k], a3 = (a)[3][k], a4 = (a)[4][k],      \
              a5 = (a)[5][k];                                                                      \
        float s12 = a1 + a2, d12 = a1 - a2, s34 = a3 + a4, d34 = a3 - a4;                          \
        (o)[0][k] = a0 + s12 + s34;                                                                \
        (o)[1][k] = d12 + 2.0f * d34;                                                              \
        (o)[2][k] = s12 + 4.0f * s34;                                                              \
        (o)[3][k] = d12 + 8.0f * d34 + a5;                                                         \
    } while (0)

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

/* One row of V: the 6 x 6 patch at (4 ty - 1, 4 tx - 1) of image img. */
TW_CLONES
static void input_row(const float *x, int h, int c, int img, int ty, int tx, size_t rows, size_t r,
                      float *v)
{
    for (int c0 = 0; c0 < c; c0 += CH) {
        int cw = c - c0 < CH ? c - c0 : CH;
        float d[6][6][CH], t[6][6][CH], o[6][CH];
        for (int i = 0; i < 6; i++) {
            int iy = TW_WINO_OUT * ty - 1 + i;
            for (int j = 0; j < 6; j++) {
                int ix = TW_WINO_OUT * tx - 1 + j;
                if (iy < 0 || iy >= h || ix < 0 || ix >= h || cw < CH)
                    memset(d[i][j], 0, sizeof d[i][j]);
                if (iy >= 0 && iy < h && ix >= 0 && ix < h)
                    copy_ch(d[i][j], x + (((size_t)img * h + iy) * h + ix) * c + c0, cw);
            }
        }
        /* columns: t[.][j] = B^T d[.][j] */
        for (int j = 0; j < 6; j++) {
            float a[6][CH], b[6][CH];
            for (int i = 0; i < 6; i++) memcpy(a[i], d[i][j], sizeof a[i]);
            for (int k = 0; k < CH; k++) BT_ROW(b, a, k);
            for (int i = 0; i < 6; i++) memcpy(t[i][j], b[i], sizeof b[i]);
        }
        /* rows: V[i][.] = B^T t[i][.] */
        for (int i = 0; i < 6; i++) {
            for (int k = 0; k < CH; k++) BT_ROW(o, t[i], k);
            for (int j = 0; j < 6; j++)
                copy_ch(v + ((size_t)(i * 6 + j) * rows + r) * c + c0, o[j], cw);
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
    for (int c0 = 0; c0 < c; c0 += CH) {
        int cw = c - c0 < CH ? c - c0 : CH;
        float a[6][6][CH], t[4][6][CH], col[6][CH], o[4][CH], row[6][CH], bb[CH];
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 6; j++) {
                if (cw < CH) memset(a[i][j], 0, sizeof a[i][j]);
                copy_ch(a[i][j], m + ((size_t)(i * 6 + j) * rows + r) * c + c0, cw);
            }
        memset(bb, 0, sizeof bb);
        copy_ch(bb, bias + c0, cw);
        /* columns: t[.][j] = A^T a[.][j] */
        for (int j = 0; j < 6; j++) {
            for (int i = 0; i < 6; i++) memcpy(col[i], a[i][j], sizeof col[i]);
            for (int k = 0; k < CH; k++) AT_ROW(o, col, k);
            for (int i = 0; i < 4; i++) memcpy(t[i][j], o[i], sizeof o[i]);
        }
        /* rows: y[i][.] = A^T t[i][.] */
        for (int i = 0; i < 4; i++) {
            int oy = TW_WINO_OUT * ty + i;
            for (int j = 0; j < 6; j++) memcpy(row[j], t[i][j], sizeof row[j]);
            for (int k = 0; k < CH; k++) AT_ROW(o, row, k);
            if (oy >= h) continue;
            for (int j = 0; j < 4; j++) {
                int ox = TW_WINO_OUT * tx + j;
                if (ox >= h) continue;
                float *dst = y + (((size_t)img * h + oy) * h + ox) * c + c0;
                float res[CH];
                for (int k = 0; k < CH; k++) res[k] = o[j][k] + bb[k];
                if (sum)
                    for (int k = 0; k < cw; k++) res[k] += dst[k];
                if (relu)
                    for (int k = 0; k < CH; k++) res[k] = res[k] > 0.0f ? res[k] : 0.0f;
                copy_ch(dst, res, cw);
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
