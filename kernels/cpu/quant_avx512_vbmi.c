/* AVX-512 F8 (E4M3, 128x128 block scales) kernels using VBMI's byte permutes (built with
 * -mavx512vbmi; loip_avx512_quant_init() hands them to the avx512 table only on a CPU that has
 * VBMI, and AVX2's F8 kernels elsewhere).
 *
 * As kernels_avx512.c: every (row, token) dot product is ONE 16-lane fp32 accumulator, column c
 * in lane c % 16, chunks of 16 columns FMA'd in column order, a partial last chunk masked to
 * zeros; per 128-column scale block a sum of E4M3 x x (every product exact), added times the
 * block's scale (quant.h), the lanes reduced by _mm512_reduce_add_ps.
 *
 * The weights are decoded 64 bytes at a time by table lookups, each E4M3 value exactly as a
 * bf16 (the top half of its f32): a vpermb puts the bytes in the order the unpacking below
 * undoes, two vpermi2b look each magnitude's bf16 bytes up in 128-entry tables, a ternlog puts
 * the sign in, the bytes are unpacked into words and each dword's two words made two f32s by a
 * shift and a mask: ~8 cycles of the two 512-bit ports per 64 weights with their 4 FMAs (a
 * vpermi2b takes 2 on the shuffle port), where widening through f16 (sign extension, shift, mask,
 * two vcvtph2ps of 2 uops and an extract a 32 bytes) and a NaN pass took ~11. Decode is paced by
 * those ports, not by memory: one thread ran 16.2 GB/s from L2 against 12.3, and 2880x2880 went
 * from ~0.71 to ~0.90 of the read probe (docs/benchmarks.md). NaN codes look up a NaN, so a row
 * with one sums to NaN with no check. Bit for bit the f16 widening's results (the same products,
 * exact either way, summed in the same order). */
#include <immintrin.h>
#include <pthread.h>

#include "cpu/quant.h"

#define AI static inline __attribute__((always_inline))

/* matvec: rows per pass (each its own FMA chain and memory stream); matmul: a tile of
 * MM_ROWS / 2 rows x MM_TOKENS tokens (F8 keeps a block sum beside each accumulator), over
 * sweeps of rows that stay in L2 while every token passes (quant_walk.h). */
#define MV_ROWS 8
#define MM_ROWS 4
#define MM_TOKENS 4
#define MM_SWEEP_MIN 32
#define MM_SWEEP_MAX 256

#include "cpu/quant_walk.h"

/* E4M3 magnitudes as bf16 (exact: 4 exponent and 3 mantissa bits fit bf16's 8 and 7,
 * subnormals included; 0x7F, the NaN code, a quiet NaN): the high bytes (f8_hi) and the low
 * bytes (f8_lo), 128 each, as the two 64-byte tables of a vpermi2b. */
static uint8_t f8_hi[128] __attribute__((aligned(64))), f8_lo[128] __attribute__((aligned(64)));

/* The byte order f8_widen64 looks bytes up in (a vpermb's indices): after the lookups, the
 * 128-bit lanes' unpacking of (lo, hi) into words and the split of each dword's two words, the
 * four vectors hold weights 0-15, 16-31, 32-47 and 48-63 in order. */
static uint8_t f8_order[64] __attribute__((aligned(64)));
static void f8_init(void) {
    for (int c = 0; c < 128; c++) {
        float v = loip_e4m3_to_f32((uint8_t)c);
        uint32_t u;
        memcpy(&u, &v, 4);
        f8_hi[c] = (uint8_t)(u >> 24), f8_lo[c] = (uint8_t)(u >> 16);
    }
    for (int l = 0; l < 4; l++)
        for (int t = 0; t < 4; t++) {
            f8_order[16 * l + 2 * t] = (uint8_t)(4 * l + t);
            f8_order[16 * l + 2 * t + 1] = (uint8_t)(16 + 4 * l + t);
            f8_order[16 * l + 8 + 2 * t] = (uint8_t)(32 + 4 * l + t);
            f8_order[16 * l + 9 + 2 * t] = (uint8_t)(48 + 4 * l + t);
        }
}

typedef struct {
    __m512i hi0, hi1, lo0, lo1, sign, order, low16;
} f8_consts;

AI f8_consts f8_load_consts(void) {
    f8_consts k;
    k.hi0 = _mm512_load_si512(f8_hi), k.hi1 = _mm512_load_si512(f8_hi + 64);
    k.lo0 = _mm512_load_si512(f8_lo), k.lo1 = _mm512_load_si512(f8_lo + 64);
    k.sign = _mm512_set1_epi8((char)0x80);
    k.order = _mm512_load_si512(f8_order);
    k.low16 = _mm512_set1_epi32((int)0xFFFF0000u);
    return k;
}

/* 64 E4M3 bytes as four f32 vectors (weights 0-15, 16-31, 32-47, 48-63), exactly, NaN codes as
 * NaN: each byte's magnitude looked up in the bf16 tables, the sign put in, and the two bytes
 * spread into the top of each dword. */
AI void f8_widen64(const f8_consts *k, __m512i b, __m512 w[4]) {
    b = _mm512_permutexvar_epi8(k->order, b);
    __m512i hi = _mm512_permutex2var_epi8(k->hi0, b, k->hi1);
    __m512i lo = _mm512_permutex2var_epi8(k->lo0, b, k->lo1);
    hi = _mm512_ternarylogic_epi32(hi, b, k->sign, 0xF8); /* hi | (b & sign) */
    __m512i w0 = _mm512_unpacklo_epi8(lo, hi), w1 = _mm512_unpackhi_epi8(lo, hi);
    w[0] = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16));
    w[1] = _mm512_castsi512_ps(_mm512_and_si512(w0, k->low16));
    w[2] = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16));
    w[3] = _mm512_castsi512_ps(_mm512_and_si512(w1, k->low16));
}

/* Columns [c0, c1) of the tile's rows, one 128-column scale block (c0 a multiple of 128):
 * blk[i][j] = sum of E4M3 * x over the block (each product exact), 16 columns a chunk in
 * order, a partial last chunk's missing lanes zeros; then acc[i][j] += blk * scale, the block's
 * scale once. A NaN code is a NaN weight, so its row's sum is NaN. */
AI void f8_block(const int R, const int T, __m512 acc[][MM_TOKENS], const f8_consts *K,
                 const uint8_t *const *row, const float *s, const float *X, size_t cols, size_t c0,
                 size_t c1, size_t pf) {
    enum { RMAX = MV_ROWS > MM_ROWS ? MV_ROWS : MM_ROWS };
    __m512 blk[RMAX][MM_TOKENS];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) blk[i][j] = _mm512_setzero_ps();
    for (size_t c = c0; c < c1; c += 64) {
        const size_t n = c1 - c < 64 ? c1 - c : 64, chunks = (n + 15) / 16;
        if (T == 1 && pf)
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) prefetch_at(row[i], c, pf);
        if (n == 64) {
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) {
                __m512 w[4];
                f8_widen64(K, _mm512_loadu_si512(row[i] + c), w);
#pragma GCC unroll 8
                for (int j = 0; j < T; j++)
#pragma GCC unroll 4
                    for (int q = 0; q < 4; q++)
                        blk[i][j] = _mm512_fmadd_ps(w[q], _mm512_loadu_ps(X + j * cols + c + 16 * q), blk[i][j]);
            }
        } else { /* the matrix's last columns */
            const __mmask64 m = ((__mmask64)1 << n) - 1;
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) {
                __m512 w[4];
                f8_widen64(K, _mm512_maskz_loadu_epi8(m, row[i] + c), w);
#pragma GCC unroll 8
                for (int j = 0; j < T; j++)
                    for (size_t q = 0; q < chunks; q++) {
                        size_t left = n - 16 * q;
                        __mmask16 mq = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
                        blk[i][j] = _mm512_fmadd_ps(w[q], _mm512_maskz_loadu_ps(mq, X + j * cols + c + 16 * q), blk[i][j]);
                    }
            }
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
    const f8_consts K = f8_load_consts();
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
    for (size_t c0 = 0; c0 < cols; c0 += LOIP_F8_BLOCK) {
        size_t c1 = cols - c0 > LOIP_F8_BLOCK ? c0 + LOIP_F8_BLOCK : cols;
        float s[RMAX];
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) s[i] = loip_f8_scale(sc[i], c0 / LOIP_F8_BLOCK);
        f8_block(R, T, acc, &K, row, s, X, cols, c0, c1, pf);
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) Y[j * ldy + r + i * S] = _mm512_reduce_add_ps(acc[i][j]);
}

/* ---- the entry points ----------------------------------------------------------------------- */

AI void qtile(const int dt, const int R, const int T, float *Y, size_t ldy, const void *W,
              const float *X, size_t r, size_t S, size_t cols, size_t pf) {
    (void)dt; /* F8 only */
    f8_tile(R, T, Y, ldy, W, X, r, S, cols, pf);
}

static pthread_once_t f8_once = PTHREAD_ONCE_INIT;
void loip_avx512vbmi_quant_init(void) { pthread_once(&f8_once, f8_init); }

void loip_avx512vbmi_matvec_f8(float *y, const void *W, const float *x, size_t r0, size_t r1,
                               size_t cols) {
    matvec_impl(LOIP_KDT_F8_E4M3, y, W, x, r0, r1, cols);
}
void loip_avx512vbmi_matmul_f8(float *Y, size_t ldy, const void *W, const float *X, size_t n,
                               size_t r0, size_t r1, size_t cols) {
    matmul_impl(LOIP_KDT_F8_E4M3, Y, ldy, W, X, n, r0, r1, cols);
}
