/* half.h - private to cuda/ (and its test): float32 -> IEEE half / bfloat16 bits on the host.
 *
 * reserve() converts the folded weights once on the host before the single
 * upload, so the device never holds an fp32 copy in fp16/bf16 runs. Both
 * conversions round to nearest, ties to even, like __float2half_rn and
 * __float2bfloat16_rn, so weights and activations round the same way.
 * Plain C with no CUDA dependency: tests/test_cuda_backend.c checks it on
 * machines without a GPU. Cannot fail; thread-safe.
 */
#ifndef TW_CUDA_HALF_H
#define TW_CUDA_HALF_H

#include <stdint.h>
#include <string.h>

/* IEEE 754 binary16 bits of f: overflow gives +-inf, tiny values become
 * subnormals or +-0, NaN stays a (quiet) NaN. */
static inline uint16_t tw_f32_to_f16_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    int exp = (int)((x >> 23) & 0xffu);
    uint32_t man = x & 0x7fffffu;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x0200u : 0u));
    int e = exp - 127 + 15; /* rebias */
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        /* Subnormal half: value in units of 2^-24 is m24 >> (14 - e). Below
         * e = -10 even the largest mantissa is under half a unit. */
        if (e < -10) return sign;
        uint32_t m24 = man | 0x800000u;
        int shift = 14 - e;
        uint32_t q = m24 >> shift;
        uint32_t rem = m24 & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (q & 1u))) q++;
        return (uint16_t)(sign | q); /* q may reach 0x400: the smallest normal, encoded right */
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    /* A carry out of the mantissa bumps the exponent, up to inf: both correct. */
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

/* bfloat16 bits of f (the upper half of float32, rounded). */
static inline uint16_t tw_f32_to_bf16_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu))
        return (uint16_t)((x >> 16) | 0x0040u); /* keep NaN a NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

#endif
