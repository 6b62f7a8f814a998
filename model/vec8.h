/* vec8.h - eight floats as one vector, for the CPU backend's own loops
 * (model/winograd.c, model/maxpool.c).
 *
 * GCC's vector extension: each build of a function marked TW_CLONES
 * (AVX-512, AVX2, plain x86-64; the loader picks one for the CPU) lowers the
 * same source to its own instructions, two SSE registers for the plain one.
 * No FMA contraction (C11 mode: -ffp-contract=off), so the builds compute the
 * same bits. The helpers take and fill vectors through pointers: a 32-byte
 * vector passed by value would draw GCC's ABI note for the plain build.
 * Activations are 4-byte aligned only: loads and stores go through memcpy,
 * with a fixed size for a whole vector (one vector move, not a call or
 * rep movs) and a plain copy for a partial one.
 */
#ifndef TW_VEC8_H
#define TW_VEC8_H

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                             \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define TW_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TW_CLONES
#endif

enum { TW_VW = 8 };
typedef float tw_v8 __attribute__((vector_size(TW_VW * sizeof(float))));
typedef int tw_v8i __attribute__((vector_size(TW_VW * sizeof(int))));

/* *r = p[0 .. cw - 1], zeros past cw (cw <= 8). */
static inline void tw_v8_load(tw_v8 *r, const float *p, int cw)
{
    if (cw == TW_VW) {
        memcpy(r, p, sizeof *r);
    } else {
        *r = (tw_v8){0};
        memcpy(r, p, (size_t)cw * sizeof(float));
    }
}

/* p[0 .. cw - 1] = the first cw lanes of *a (cw <= 8). */
static inline void tw_v8_store(float *p, const tw_v8 *a, int cw)
{
    if (cw == TW_VW)
        memcpy(p, a, sizeof *a);
    else
        memcpy(p, a, (size_t)cw * sizeof(float));
}

#endif
