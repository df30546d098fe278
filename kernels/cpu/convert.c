/* Element conversions between fp32 and the two 16-bit float formats, in portable C.
 *
 * Widening (bf16/f16 -> f32) is exact. Narrowing rounds to nearest, ties to even, as the
 * hardware instructions do, so a value written here reads back exactly like one converted by
 * F16C or PyTorch. NaN payloads are kept (their top bits); a NaN whose kept bits would all be
 * zero gets the quiet bit so that it cannot turn into an infinity. With that rule every 16-bit
 * pattern survives 16 -> 32 -> 16 unchanged, signalling NaNs included.
 *
 * These are per-element helpers for loading, converting and testing; the SIMD kernels widen in
 * registers and never call them in their inner loops. */
#include <string.h>

#include "cpu/kernels.h"

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

__attribute__((visibility("default"))) float loip_bf16_to_f32(uint16_t h) {
    /* bf16 is the top half of an fp32: widening is a shift. */
    return bits_f32((uint32_t)h << 16);
}

__attribute__((visibility("default"))) uint16_t loip_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        /* NaN: truncate the payload; force the quiet bit only if nothing of it would remain,
         * since an all-zero mantissa would read back as an infinity. */
        uint16_t h = (uint16_t)(u >> 16);
        return (h & 0x007f) ? h : (uint16_t)(h | 0x0040);
    }
    /* Round to nearest even by adding just under half an ulp plus the lowest kept bit; a carry
     * out of the mantissa bumps the exponent, which is also the right answer (up to inf). */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__attribute__((visibility("default"))) float loip_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13)); /* inf, NaN */
    if (exp == 0) {
        if (mant == 0) return bits_f32(sign); /* +-0 */
        /* Subnormal: mant * 2^-24, exact in fp32 (the product is a power-of-two scaling). */
        float v = (float)mant * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + (127 - 15)) << 23) | (mant << 13));
}

__attribute__((visibility("default"))) uint16_t loip_f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) {
        if (a == 0x7f800000u) return sign | 0x7c00; /* inf */
        uint16_t m = (uint16_t)((a >> 13) & 0x3ff);  /* NaN: keep the top payload bits */
        return sign | 0x7c00 | (m ? m : 0x200);
    }
    /* 65520 is halfway between 65504 (max f16, odd mantissa) and 2^16: ties go up to inf. */
    if (a >= 0x477ff000u) return sign | 0x7c00;
    if (a >= 0x38800000u) {
        /* Normal result: rebias the exponent and round the 13 dropped bits to nearest even;
         * a carry into the exponent is the correct rounding. */
        a += 0x0fffu + ((a >> 13) & 1u);
        return sign | (uint16_t)((a - ((uint32_t)(127 - 15) << 23)) >> 13);
    }
    /* Subnormal (or zero) result: the f16 value is round(|f| / 2^-24). With the implicit bit
     * restored, |f| = m * 2^(e-150), so the quotient is m >> (126 - e). Shifts past 24 leave
     * less than half of the smallest subnormal, which rounds to zero. */
    uint32_t e = a >> 23;
    if (e < 102) return sign;
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14..24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++; /* q == 0x400 is the smallest normal */
    return sign | (uint16_t)q;
}
