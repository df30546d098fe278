/* AVX2 + FMA MXFP4 and F8 kernels (built with kernels_avx2.c's flags; loip_kernels_avx2()
 * checks the CPU before handing out its table, which holds these).
 *
 * As kernels_avx2.c: every (row, token) dot product is ONE 8-lane fp32 accumulator, column c in
 * lane c % 8, chunks of 8 columns FMA'd in column order, a partial last chunk (F8 only) zero in
 * the missing lanes, the lanes reduced by hsum8's fixed order. Weights are dequantized exactly
 * (quant.h) in registers:
 *  - MXFP4: 8 code bytes zero-extended to dwords; vpermps reads 3 index bits, so it looks the
 *    magnitude (codes' low 3 bits) up in the 8 E2M1 magnitudes times the block's scale, and the
 *    code's top bit, shifted to bit 31, is xor'ed in as the sign. Per block, in column order:
 *    low nibbles of bytes 0-7 and 8-15, then high nibbles of bytes 0-7 and 8-15.
 *  - F8: as the AVX-512 variant, 8 bytes at a time; NaN codes or'ed to all-ones (a NaN). */
#include <immintrin.h>
#include <string.h>

#include "cpu/quant.h"

#define AI static inline __attribute__((always_inline))

#define MV_ROWS 4
#define PF_BYTES 512
#define MM_ROWS 2
#define MM_TOKENS 4
#define MM_SWEEP 32

static const int32_t lane_mask[9][8] = {
    {0}, {-1}, {-1, -1}, {-1, -1, -1}, {-1, -1, -1, -1}, {-1, -1, -1, -1, -1},
    {-1, -1, -1, -1, -1, -1}, {-1, -1, -1, -1, -1, -1, -1}, {-1, -1, -1, -1, -1, -1, -1, -1},
};

/* kernels_avx2.c's reduction: halves, then quarters, then the last pair. */
AI float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- MXFP4 --------------------------------------------------------------------------------- */

/* The block's 32 weights as 4 vectors of 8, in column order, from its 8-entry scaled table. */
AI void mx_decode(const uint8_t *p, __m256 ts, __m256 w[4]) {
    const __m256i sign = _mm256_set1_epi32((int)0x80000000);
    for (int h = 0; h < 2; h++) {
        __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 1 + 8 * h)));
        __m256 lo = _mm256_permutevar8x32_ps(ts, v);
        __m256i hv = _mm256_srli_epi32(v, 4);
        __m256 hi = _mm256_permutevar8x32_ps(ts, hv);
        w[h] = _mm256_xor_ps(lo, _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v, 28), sign)));
        w[2 + h] =
            _mm256_xor_ps(hi, _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(hv, 28), sign)));
    }
}

AI void mx_tile(const int R, const int T, float *Y, size_t ldy, const uint8_t *W,
                const float *X, size_t r, size_t cols) {
    enum { RMAX = MV_ROWS > MM_ROWS ? MV_ROWS : MM_ROWS };
    const size_t rowb = loip_mxfp4_row_bytes(cols), nb = cols / LOIP_MXFP4_BLOCK;
    const __m256 mag = _mm256_loadu_ps(loip_e2m1_values);
    __m256 acc[RMAX][MM_TOKENS];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) acc[i][j] = _mm256_setzero_ps();
    const uint8_t *row = W + r * rowb;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *q = row + b * LOIP_MXFP4_BLOCK_BYTES;
        if (T == 1 && b % 3 == 0)
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) _mm_prefetch((const char *)q + i * rowb + PF_BYTES, _MM_HINT_T0);
        const float *xb = X + b * LOIP_MXFP4_BLOCK;
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            const uint8_t *p = q + i * rowb;
            __m256 w[4];
            mx_decode(p, _mm256_mul_ps(mag, _mm256_set1_ps(loip_e8m0_table[p[0]])), w);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++)
#pragma GCC unroll 8
                for (int j = 0; j < T; j++)
                    acc[i][j] = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(xb + j * cols + 8 * k), acc[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) Y[j * ldy + r + i] = hsum8(acc[i][j]);
}

/* ---- F8 ------------------------------------------------------------------------------------ */

/* 8 E4M3 bytes (in the low half of b) times the scale s, as loip_e4m3_to_f32(byte) * s. */
AI __m256 f8_decode8(__m128i b, __m256 s) {
    __m256i t = _mm256_cvtepi8_epi32(b);
    __m256i u = _mm256_and_si256(_mm256_slli_epi32(t, 20), _mm256_set1_epi32((int)0x87F00000));
    __m256 f = _mm256_mul_ps(_mm256_mul_ps(_mm256_castsi256_ps(u), _mm256_set1_ps(0x1p120f)), s);
    __m256i nan = _mm256_cmpeq_epi32(_mm256_and_si256(t, _mm256_set1_epi32(0x7F)),
                                     _mm256_set1_epi32(0x7F));
    return _mm256_or_ps(f, _mm256_castsi256_ps(nan));
}

AI void f8_tile(const int R, const int T, float *Y, size_t ldy, const uint8_t *W, const float *X,
                size_t r, size_t cols) {
    enum { RMAX = MV_ROWS > MM_ROWS ? MV_ROWS : MM_ROWS };
    __m256 acc[RMAX][MM_TOKENS];
    const uint8_t *row[RMAX];
    const float *sc[RMAX];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        row[i] = loip_f8_row(W, r + i, cols);
        sc[i] = loip_f8_scales(W, r + i, cols);
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) acc[i][j] = _mm256_setzero_ps();
    }
    size_t c = 0;
    for (; c + 8 <= cols; c += 8) {
        if (T == 1 && (c & 63) == 0)
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) _mm_prefetch((const char *)row[i] + c + PF_BYTES, _MM_HINT_T0);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m256 w = f8_decode8(_mm_loadl_epi64((const __m128i *)(row[i] + c)),
                                  _mm256_set1_ps(sc[i][c / LOIP_F8_BLOCK]));
#pragma GCC unroll 8
            for (int j = 0; j < T; j++)
                acc[i][j] = _mm256_fmadd_ps(w, _mm256_loadu_ps(X + j * cols + c), acc[i][j]);
        }
    }
    if (c < cols) {
        size_t k = cols - c;
        __m256i m = _mm256_loadu_si256((const __m256i *)lane_mask[k]);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            uint8_t buf[16] = {0};
            memcpy(buf, row[i] + c, k);
            __m256 w = f8_decode8(_mm_loadu_si128((const __m128i *)buf),
                                  _mm256_set1_ps(sc[i][c / LOIP_F8_BLOCK]));
            w = _mm256_and_ps(w, _mm256_castsi256_ps(m));
#pragma GCC unroll 8
            for (int j = 0; j < T; j++)
                acc[i][j] = _mm256_fmadd_ps(w, _mm256_maskload_ps(X + j * cols + c, m), acc[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) Y[j * ldy + r + i] = hsum8(acc[i][j]);
}

/* ---- the entry points ----------------------------------------------------------------------- */

AI void qtile(const int dt, const int R, const int T, float *Y, size_t ldy, const void *W,
              const float *X, size_t r, size_t cols) {
    if (dt == LOIP_KDT_MXFP4) mx_tile(R, T, Y, ldy, W, X, r, cols);
    else f8_tile(R, T, Y, ldy, W, X, r, cols);
}

AI void matvec_impl(const int dt, float *y, const void *W, const float *x, size_t r0, size_t r1,
                    size_t cols) {
    size_t r = r0;
    for (; r + MV_ROWS <= r1; r += MV_ROWS) qtile(dt, MV_ROWS, 1, y, 0, W, x, r, cols);
    for (; r < r1; r++) qtile(dt, 1, 1, y, 0, W, x, r, cols);
}

_Static_assert(MM_TOKENS == 4, "tile_any covers 1..4 tokens");
AI void tile_any(const int dt, const int R, size_t T, float *Y, size_t ldy, const void *W,
                 const float *X, size_t r, size_t cols) {
    switch (T) {
    case 1: qtile(dt, R, 1, Y, ldy, W, X, r, cols); break;
    case 2: qtile(dt, R, 2, Y, ldy, W, X, r, cols); break;
    case 3: qtile(dt, R, 3, Y, ldy, W, X, r, cols); break;
    default: qtile(dt, R, 4, Y, ldy, W, X, r, cols); break;
    }
}

AI void matmul_impl(const int dt, float *Y, size_t ldy, const void *W, const float *X, size_t n,
                    size_t r0, size_t r1, size_t cols) {
    for (size_t rs = r0; rs < r1; rs += MM_SWEEP) {
        size_t re = rs + MM_SWEEP < r1 ? rs + MM_SWEEP : r1;
        for (size_t t = 0; t < n; t += MM_TOKENS) {
            size_t T = n - t < MM_TOKENS ? n - t : MM_TOKENS;
            size_t r = rs;
            for (; r + MM_ROWS <= re; r += MM_ROWS)
                tile_any(dt, MM_ROWS, T, Y + t * ldy, ldy, W, X + t * cols, r, cols);
            for (; r < re; r++) tile_any(dt, 1, T, Y + t * ldy, ldy, W, X + t * cols, r, cols);
        }
    }
}

void loip_avx2_matvec_mxfp4(float *y, const void *W, const float *x, size_t r0, size_t r1,
                            size_t cols) {
    matvec_impl(LOIP_KDT_MXFP4, y, W, x, r0, r1, cols);
}
void loip_avx2_matmul_mxfp4(float *Y, size_t ldy, const void *W, const float *X, size_t n,
                            size_t r0, size_t r1, size_t cols) {
    matmul_impl(LOIP_KDT_MXFP4, Y, ldy, W, X, n, r0, r1, cols);
}
void loip_avx2_matvec_f8(float *y, const void *W, const float *x, size_t r0, size_t r1,
                         size_t cols) {
    matvec_impl(LOIP_KDT_F8_E4M3, y, W, x, r0, r1, cols);
}
void loip_avx2_matmul_f8(float *Y, size_t ldy, const void *W, const float *X, size_t n,
                         size_t r0, size_t r1, size_t cols) {
    matmul_impl(LOIP_KDT_F8_E4M3, Y, ldy, W, X, n, r0, r1, cols);
}
