/* AVX-512 MXFP4 and F8 kernels (built with kernels_avx512.c's flags; loip_kernels_avx512()
 * checks the CPU before handing out its table, which holds these).
 *
 * As kernels_avx512.c: every (row, token) dot product is ONE 16-lane fp32 accumulator, column c
 * in lane c % 16, chunks of 16 columns FMA'd in column order, a partial last chunk (F8 only)
 * masked to zeros, the lanes reduced by _mm512_reduce_add_ps. Weights are dequantized exactly
 * (quant.h) in registers:
 *  - MXFP4: a block's 16 code bytes zero-extended to 16 dwords index a 16-entry table of E2M1
 *    values already multiplied by the block's scale (exact: a power of two), vpermps taking the
 *    low nibble as is (it reads 4 index bits) and the high one after a shift: two vectors, the
 *    block's columns 0-15 and 16-31.
 *  - F8: bytes sign-extended to dwords, shifted so that exponent and mantissa land in an f32's
 *    (the value times 2^-120, exact), masked, times 2^120 (exact), times the block's scale (the
 *    one rounding), NaN codes (S.1111.111) set to NaN. */
#include <immintrin.h>
#include <math.h>

#include "cpu/quant.h"

#define AI static inline __attribute__((always_inline))

/* matvec: rows per pass (each its own FMA chain; x loads shared) and the software prefetch
 * distance, as kernels_avx512.c. */
#define MV_ROWS 8
#define PF_BYTES 512
/* matmul: a tile of MM_ROWS x MM_TOKENS accumulators (16 zmm; the rows' decoded weights and
 * the x chunks take most of the rest), over MM_SWEEP rows whose weights stay in L2 while every
 * token passes. */
#define MM_ROWS 4
#define MM_TOKENS 4
#define MM_SWEEP 32

/* ---- MXFP4 --------------------------------------------------------------------------------- */

/* Y[j*ldy + r+i] = W[r+i,:] . X[j,:] for i < R, j < T, all columns. */
AI void mx_tile(const int R, const int T, float *Y, size_t ldy, const uint8_t *W,
                const float *X, size_t r, size_t cols) {
    const size_t rowb = loip_mxfp4_row_bytes(cols), nb = cols / LOIP_MXFP4_BLOCK;
    const __m512 tab = _mm512_loadu_ps(loip_e2m1_values);
    __m512 acc[MV_ROWS > MM_ROWS ? MV_ROWS : MM_ROWS][MM_TOKENS];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) acc[i][j] = _mm512_setzero_ps();
    const uint8_t *row = W + r * rowb;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *q = row + b * LOIP_MXFP4_BLOCK_BYTES;
        if (T == 1 && b % 3 == 0) /* matvec: ~one prefetch per cache line of each row */
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) _mm_prefetch((const char *)q + i * rowb + PF_BYTES, _MM_HINT_T0);
        __m512 lo[MV_ROWS > MM_ROWS ? MV_ROWS : MM_ROWS], hi[MV_ROWS > MM_ROWS ? MV_ROWS : MM_ROWS];
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            const uint8_t *p = q + i * rowb;
            __m512 ts = _mm512_mul_ps(tab, _mm512_set1_ps(loip_e8m0_table[p[0]]));
            __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 1)));
            lo[i] = _mm512_permutexvar_ps(v, ts);
            hi[i] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), ts);
        }
        const float *xb = X + b * LOIP_MXFP4_BLOCK;
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) {
            __m512 x0 = _mm512_loadu_ps(xb + j * cols), x1 = _mm512_loadu_ps(xb + j * cols + 16);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) {
                acc[i][j] = _mm512_fmadd_ps(lo[i], x0, acc[i][j]);
                acc[i][j] = _mm512_fmadd_ps(hi[i], x1, acc[i][j]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) Y[j * ldy + r + i] = _mm512_reduce_add_ps(acc[i][j]);
}

/* ---- F8 ------------------------------------------------------------------------------------ */

/* 16 E4M3 bytes (b) times the scale s, exactly as loip_e4m3_to_f32(byte) * s. */
AI __m512 f8_decode16(__m128i b, __m512 s) {
    __m512i t = _mm512_cvtepi8_epi32(b);
    __m512i u = _mm512_and_si512(_mm512_slli_epi32(t, 20), _mm512_set1_epi32((int)0x87F00000));
    __m512 f = _mm512_mul_ps(_mm512_mul_ps(_mm512_castsi512_ps(u), _mm512_set1_ps(0x1p120f)), s);
    __mmask16 nan = _mm512_cmpeq_epi32_mask(_mm512_and_si512(t, _mm512_set1_epi32(0x7F)),
                                            _mm512_set1_epi32(0x7F));
    return _mm512_mask_mov_ps(f, nan, _mm512_set1_ps(NAN));
}

AI void f8_tile(const int R, const int T, float *Y, size_t ldy, const uint8_t *W, const float *X,
                size_t r, size_t cols) {
    enum { RMAX = MV_ROWS > MM_ROWS ? MV_ROWS : MM_ROWS };
    __m512 acc[RMAX][MM_TOKENS];
    const uint8_t *row[RMAX];
    const float *sc[RMAX];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        row[i] = loip_f8_row(W, r + i, cols);
        sc[i] = loip_f8_scales(W, r + i, cols);
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) acc[i][j] = _mm512_setzero_ps();
    }
    size_t c = 0;
    for (; c + 16 <= cols; c += 16) {
        if (T == 1 && (c & 63) == 0)
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) _mm_prefetch((const char *)row[i] + c + PF_BYTES, _MM_HINT_T0);
        __m512 w[RMAX];
#pragma GCC unroll 8
        for (int i = 0; i < R; i++)
            w[i] = f8_decode16(_mm_loadu_si128((const __m128i *)(row[i] + c)),
                               _mm512_set1_ps(sc[i][c / LOIP_F8_BLOCK]));
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) {
            __m512 xv = _mm512_loadu_ps(X + j * cols + c);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) acc[i][j] = _mm512_fmadd_ps(w[i], xv, acc[i][j]);
        }
    }
    if (c < cols) {
        __mmask16 m = (__mmask16)((1u << (cols - c)) - 1);
        __m512 w[RMAX];
#pragma GCC unroll 8
        for (int i = 0; i < R; i++)
            w[i] = _mm512_maskz_mov_ps(m, f8_decode16(_mm_maskz_loadu_epi8(m, row[i] + c),
                                                      _mm512_set1_ps(sc[i][c / LOIP_F8_BLOCK])));
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, X + j * cols + c);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) acc[i][j] = _mm512_fmadd_ps(w[i], xv, acc[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) Y[j * ldy + r + i] = _mm512_reduce_add_ps(acc[i][j]);
}

/* ---- the entry points ----------------------------------------------------------------------- */

/* One tile of either dtype (dt a constant at each call site). */
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

void loip_avx512_matvec_mxfp4(float *y, const void *W, const float *x, size_t r0, size_t r1,
                              size_t cols) {
    matvec_impl(LOIP_KDT_MXFP4, y, W, x, r0, r1, cols);
}
void loip_avx512_matmul_mxfp4(float *Y, size_t ldy, const void *W, const float *X, size_t n,
                              size_t r0, size_t r1, size_t cols) {
    matmul_impl(LOIP_KDT_MXFP4, Y, ldy, W, X, n, r0, r1, cols);
}
void loip_avx512_matvec_f8(float *y, const void *W, const float *x, size_t r0, size_t r1,
                           size_t cols) {
    matvec_impl(LOIP_KDT_F8_E4M3, y, W, x, r0, r1, cols);
}
void loip_avx512_matmul_f8(float *Y, size_t ldy, const void *W, const float *X, size_t n,
                           size_t r0, size_t r1, size_t cols) {
    matmul_impl(LOIP_KDT_F8_E4M3, Y, ldy, W, X, n, r0, r1, cols);
}
