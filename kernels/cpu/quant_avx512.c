/* AVX-512 MXFP4 and F8 kernels (built with kernels_avx512.c's flags; loip_kernels_avx512()
 * checks the CPU before handing out its table, which holds these).
 *
 * As kernels_avx512.c: every (row, token) dot product is ONE 16-lane fp32 accumulator, column c
 * in lane c % 16, chunks of 16 columns FMA'd in column order, a partial last chunk (F8 only)
 * masked to zeros, the lanes reduced by _mm512_reduce_add_ps. Weights are dequantized exactly
 * (quant.h) in registers:
 *  - MXFP4: a block's 16 code bytes zero-extended to 16 dwords index the 16 E2M1 values already
 *    multiplied by the block's scale (exact: a power of two; mx_tab), vpermps taking the
 *    low nibble as is (it reads 4 index bits) and the high one after a shift: two vectors, the
 *    block's columns 0-15 and 16-31.
 *  - F8: bytes sign-extended to words, shifted so that sign, exponent and mantissa land in an
 *    f16's, widened by vcvtph2ps (the value times 2^-8, exact, never an f32 subnormal), times
 *    the block's scale times 2^8 (the one rounding); a row with a NaN code has a NaN result,
 *    whatever else it holds (f8_tile's poison), so NaN codes cost no lane work. */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>

#include "cpu/quant.h"

#define AI static inline __attribute__((always_inline))

/* matvec: rows per pass (each its own FMA chain and memory stream: matvec_impl; x loads
 * shared). The software prefetch distance is a parameter (quant.h's loip_quant_prefetch). */
#define MV_ROWS 8
/* matmul: a tile of MM_ROWS x MM_TOKENS accumulators (16 zmm; the rows' decoded weights and
 * the x chunks take most of the rest), over a sweep of rows whose weights stay in L2 while every
 * token passes (loip_kernels_sweep_rows: half the L2, within these bounds). */
#define MM_ROWS 4
#define MM_TOKENS 4
#define MM_SWEEP_MIN 32
#define MM_SWEEP_MAX 256

/* matvec's software prefetch: pf bytes ahead of byte off of the row at p. A matvec tile's rows
 * are MV_ROWS streams through memory (matvec_impl), so once off + pf passes this row's end it
 * lands in the row the same stream reads next. (Integer arithmetic: the address may lie past
 * W's end, which a prefetch may name and C pointer arithmetic may not.) */
AI void prefetch_at(const uint8_t *p, size_t off, size_t pf) {
    _mm_prefetch((const char *)((uintptr_t)p + off + pf), _MM_HINT_T0);
}

/* ---- MXFP4 --------------------------------------------------------------------------------- */

/* The 16 E2M1 values times each scale 2^(e-127) (exact, or +-inf, or NaN for e = 0xFF): a
 * block's table is one aligned load, no broadcast or multiply. */
static float mx_tab[256][16] __attribute__((aligned(64)));
static pthread_once_t mx_once = PTHREAD_ONCE_INIT;
static void mx_init(void) {
    for (int e = 0; e < 256; e++)
        for (int i = 0; i < 16; i++) mx_tab[e][i] = loip_e2m1_values[i] * loip_e8m0_table[e];
}
void loip_avx512_quant_init(void) { pthread_once(&mx_once, mx_init); }

/* Y[j*ldy + r+i] = W[r+i,:] . X[j,:] for i < R, j < T, all columns. */
AI void mx_tile(const int R, const int T, float *Y, size_t ldy, const uint8_t *W,
                const float *X, size_t r, size_t S, size_t cols, size_t pf) {
    const size_t rowb = loip_mxfp4_row_bytes(cols), nb = cols / LOIP_MXFP4_BLOCK;
    __m512 acc[MV_ROWS > MM_ROWS ? MV_ROWS : MM_ROWS][MM_TOKENS];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) acc[i][j] = _mm512_setzero_ps();
    const uint8_t *row = W + r * rowb;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *q = row + b * LOIP_MXFP4_BLOCK_BYTES;
        if (T == 1 && pf && b % 3 == 0) /* matvec: ~one prefetch per cache line of each row */
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) prefetch_at(row + i * S * rowb, b * LOIP_MXFP4_BLOCK_BYTES, pf);
        __m512 lo[MV_ROWS > MM_ROWS ? MV_ROWS : MM_ROWS], hi[MV_ROWS > MM_ROWS ? MV_ROWS : MM_ROWS];
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            const uint8_t *p = q + i * S * rowb;
            __m512 ts = _mm512_load_ps(mx_tab[p[0]]);
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
        for (int j = 0; j < T; j++) Y[j * ldy + r + i * S] = _mm512_reduce_add_ps(acc[i][j]);
}

/* ---- F8 ------------------------------------------------------------------------------------ */

/* 16 E4M3 bytes as f32 times 2^-8, exactly and without f32 subnormals (which would cost an
 * assist each): the bytes' exponent and mantissa moved into f16's (bias 15, not 7: the 2^-8)
 * and converted by vcvtph2ps. */
AI __m512 f8_widen16(__m128i b) {
    __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7);
    return _mm512_cvtph_ps(_mm256_and_si256(h, _mm256_set1_epi16((short)0xBF80)));
}

/* 32 bytes the same way, as columns 0-15 (lo) and 16-31 (hi): one widening and mask for both
 * halves (5 uops a 16 bytes instead of 6). */
AI void f8_widen32(__m256i b, __m512 *lo, __m512 *hi) {
    __m512i h = _mm512_slli_epi16(_mm512_cvtepi8_epi16(b), 7);
    h = _mm512_and_si512(h, _mm512_set1_epi16((short)0xBF80));
    *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

/* The largest of the n (<= 128) bytes at p with their top bit set, folded into m: 0xFF when one
 * of them is a NaN code (S.1111.111). */
AI __m512i f8_nan_max(__m512i m, const uint8_t *p, size_t n) {
    for (size_t k = 0; k < n; k += 64) {
        __mmask64 l = n - k >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (n - k)) - 1;
        __m512i v = _mm512_maskz_loadu_epi8(l, p + k); /* (missing bytes: 0, never 0xFF) */
        m = _mm512_max_epu8(m, _mm512_or_si512(v, _mm512_set1_epi8((char)0x80)));
    }
    return m;
}

/* Columns [c0, c1) of the tile's rows, one 128-column scale block (c0 a multiple of 128):
 * blk[i][j] = sum of E4M3 * x over the block (f = E4M3 * 2^-8 against x * 2^8, each product
 * exact), then acc[i][j] += blk * scale, the block's scale once. (A NaN code widens to a
 * number: f8_tile makes its row's results NaN.) */
AI void f8_block(const int R, const int T, __m512 acc[][MM_TOKENS],
                 const uint8_t *const *row, const float *s, const float *X, size_t cols, size_t c0,
                 size_t c1, size_t pf) {
    enum { RMAX = MV_ROWS > MM_ROWS ? MV_ROWS : MM_ROWS };
    const __m512 k256 = _mm512_set1_ps(256.0f);
    __m512 blk[RMAX][MM_TOKENS];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) blk[i][j] = _mm512_setzero_ps();
    size_t c = c0;
    /* 32 columns a step (the same FMAs in the same order as 16 a step) */
    for (; c + 32 <= c1; c += 32) {
            if (T == 1 && pf && (c & 63) == 0)
#pragma GCC unroll 8
                for (int i = 0; i < R; i++) prefetch_at(row[i], c, pf);
            __m512 wl[RMAX], wh[RMAX];
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) f8_widen32(_mm256_loadu_si256((const __m256i *)(row[i] + c)), &wl[i], &wh[i]);
#pragma GCC unroll 8
            for (int j = 0; j < T; j++) {
                __m512 x0 = _mm512_mul_ps(_mm512_loadu_ps(X + j * cols + c), k256);
                __m512 x1 = _mm512_mul_ps(_mm512_loadu_ps(X + j * cols + c + 16), k256);
#pragma GCC unroll 8
                for (int i = 0; i < R; i++) {
                    blk[i][j] = _mm512_fmadd_ps(wl[i], x0, blk[i][j]);
                    blk[i][j] = _mm512_fmadd_ps(wh[i], x1, blk[i][j]);
                }
            }
        }
    for (; c + 16 <= c1; c += 16) {
        if (T == 1 && pf && (c & 63) == 0)
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) prefetch_at(row[i], c, pf);
        __m512 w[RMAX];
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m128i b = _mm_loadu_si128((const __m128i *)(row[i] + c));
            w[i] = f8_widen16(b);
        }
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) {
            __m512 xv = _mm512_mul_ps(_mm512_loadu_ps(X + j * cols + c), k256);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) blk[i][j] = _mm512_fmadd_ps(w[i], xv, blk[i][j]);
        }
    }
    if (c < c1) { /* the matrix's last columns: a partial chunk, zeros in the missing lanes */
        __mmask16 m = (__mmask16)((1u << (c1 - c)) - 1);
        __m512 w[RMAX];
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m128i b = _mm_maskz_loadu_epi8(m, row[i] + c);
            w[i] = f8_widen16(b);
        }
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) {
            __m512 xv = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, X + j * cols + c), k256);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) blk[i][j] = _mm512_fmadd_ps(w[i], xv, blk[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        __m512 sv = _mm512_set1_ps(s[i]);
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) acc[i][j] = _mm512_fmadd_ps(blk[i][j], sv, acc[i][j]);
    }
}

AI void f8_tile(const int R, const int T, float *Y, size_t ldy, const uint8_t *W, const float *X,
                size_t r, size_t S, size_t cols, size_t pf) {
    enum { RMAX = MV_ROWS > MM_ROWS ? MV_ROWS : MM_ROWS };
    __m512 acc[RMAX][MM_TOKENS];
    const uint8_t *row[RMAX];
    const uint8_t *sc[RMAX];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        row[i] = loip_f8_row(W, r + i * S, cols);
        sc[i] = loip_f8_scales(W, r + i * S, cols);
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) acc[i][j] = _mm512_setzero_ps();
    }
    /* poison: the rows with a NaN code. Its weight is NaN, so is its product with any x and any
     * sum that takes it: the row's result is NaN whatever else it holds, and no lane need be. */
    unsigned poison = 0;
    const __m512i ff = _mm512_set1_epi8((char)0xFF);
    for (size_t c0 = 0; c0 < cols; c0 += LOIP_F8_BLOCK) {
        size_t c1 = cols - c0 > LOIP_F8_BLOCK ? c0 + LOIP_F8_BLOCK : cols;
        float s[RMAX];
        __m512i m = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            s[i] = loip_f8_scale(sc[i], c0 / LOIP_F8_BLOCK);
            m = f8_nan_max(m, row[i] + c0, c1 - c0);
        }
        if (_mm512_cmpeq_epi8_mask(m, ff)) /* one of the rows has a NaN code here: which */
            for (int i = 0; i < R; i++)
                if (_mm512_cmpeq_epi8_mask(f8_nan_max(_mm512_setzero_si512(), row[i] + c0, c1 - c0), ff))
                    poison |= 1u << i;
        f8_block(R, T, acc, row, s, X, cols, c0, c1, pf);
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++)
            Y[j * ldy + r + i * S] = poison >> i & 1 ? NAN : _mm512_reduce_add_ps(acc[i][j]);
}

/* ---- the entry points ----------------------------------------------------------------------- */

/* Rows r, r + S, ..., r + (R-1) S of either dtype (dt a constant at each call site); pf: matvec's
 * prefetch distance (0: none). */
AI void qtile(const int dt, const int R, const int T, float *Y, size_t ldy, const void *W,
              const float *X, size_t r, size_t S, size_t cols, size_t pf) {
    if (dt == LOIP_KDT_MXFP4) mx_tile(R, T, Y, ldy, W, X, r, S, cols, pf);
    else f8_tile(R, T, Y, ldy, W, X, r, S, cols, pf);
}

/* The thread's rows [r0, r1) as MV_ROWS runs of q consecutive rows: tile i takes row i of every
 * run, so its rows are MV_ROWS streams, each walking its run's bytes in order as the probe's
 * streams do (adjacent rows in one tile would put several streams in each 4 KB page, which
 * the hardware prefetchers do not follow; this took MXFP4 2880x2880 from ~0.65 to ~0.95 of the
 * probe). Each row is computed as before: the order changes only which rows share a tile. */
AI void matvec_impl(const int dt, float *y, const void *W, const float *x, size_t r0, size_t r1,
                    size_t cols) {
    const size_t pf = loip_quant_prefetch(), q = (r1 - r0) / MV_ROWS;
    for (size_t i = 0; i < q; i++) qtile(dt, MV_ROWS, 1, y, 0, W, x, r0 + i, q, cols, pf);
    for (size_t r = r0 + q * MV_ROWS; r < r1; r++) qtile(dt, 1, 1, y, 0, W, x, r, 1, cols, pf);
}

_Static_assert(MM_TOKENS == 4, "tile_any covers 1..4 tokens");
AI void tile_any(const int dt, const int R, size_t T, float *Y, size_t ldy, const void *W,
                 const float *X, size_t r, size_t cols) {
    switch (T) {
    case 1: qtile(dt, R, 1, Y, ldy, W, X, r, 1, cols, 0); break;
    case 2: qtile(dt, R, 2, Y, ldy, W, X, r, 1, cols, 0); break;
    case 3: qtile(dt, R, 3, Y, ldy, W, X, r, 1, cols, 0); break;
    default: qtile(dt, R, 4, Y, ldy, W, X, r, 1, cols, 0); break;
    }
}

AI void matmul_impl(const int dt, float *Y, size_t ldy, const void *W, const float *X, size_t n,
                    size_t r0, size_t r1, size_t cols) {
    const int TR = dt == LOIP_KDT_F8_E4M3 ? MM_ROWS / 2 : MM_ROWS; /* (F8: twice the accumulators) */
    const size_t sweep = loip_kernels_sweep_rows(
        dt == LOIP_KDT_MXFP4 ? loip_mxfp4_row_bytes(cols) : cols, TR, MM_SWEEP_MIN, MM_SWEEP_MAX);
    for (size_t rs = r0; rs < r1; rs += sweep) {
        size_t re = rs + sweep < r1 ? rs + sweep : r1;
        for (size_t t = 0; t < n; t += MM_TOKENS) {
            size_t T = n - t < MM_TOKENS ? n - t : MM_TOKENS;
            size_t r = rs;
            for (; r + TR <= re; r += TR) tile_any(dt, TR, T, Y + t * ldy, ldy, W, X + t * cols, r, cols);
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
