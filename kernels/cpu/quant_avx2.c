/* AVX2 + FMA MXFP4 and F8 kernels (built with kernels_avx2.c's flags; loip_kernels_avx2()
 * checks the CPU before handing out its table, which holds these).
 *
 * As kernels_avx2.c: every (row, token) dot product is ONE 8-lane fp32 accumulator, column c in
 * lane c % 8, chunks of 8 columns FMA'd in column order, a partial last chunk (F8 only) zero in
 * the missing lanes, the lanes reduced by hsum8's fixed order. Weights are dequantized exactly
 * (quant.h) in registers:
 *  - MXFP4: the codes' nibbles look up the bfloat16 bytes of the E2M1 values times the block's
 *    scale (exact) with vpshufb, unpacked into f32 (mx_decode). In column order: low nibbles of
 *    bytes 0-7 and 8-15, then high nibbles of bytes 0-7 and 8-15.
 *  - F8: per 128-column block a sum of E4M3 x x, added times the block's scale (quant.h); each
 *    byte's sign, exponent and mantissa moved into an f16's (the value times 2^-8, exact) and
 *    widened by vcvtph2ps from a stack buffer, off the shuffle port (matvec: 32 bytes a step,
 *    f8_widen32); a row with a NaN code has a NaN result (f8_tile's poison). */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "cpu/quant.h"

#define AI static inline __attribute__((always_inline))

/* matvec: rows per pass (each its own FMA chain and memory stream: matvec_impl); the software
 * prefetch distance is a parameter (quant.h's loip_quant_prefetch). */
#define MV_ROWS 4
#define MM_ROWS 2
#define MM_TOKENS 4
/* matmul: the bounds of a sweep of rows whose weights stay in L2 while every token passes
 * (loip_kernels_sweep_rows: half the L2 within them). */
#define MM_SWEEP_MIN 32
#define MM_SWEEP_MAX 256

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

#include "cpu/quant_walk.h"

/* ---- MXFP4 --------------------------------------------------------------------------------- */

/* Every E2M1 code times each scale 2^(e-127) is exact in bfloat16 (two significant bits; f32's
 * exponent range, its subnormals 2^-128 and 3 * 2^-128 included; +-inf and NaN too): its f32 bits
 * end in 16 zeros. mx_bf[e] holds, for codes 0-15, the low bytes of those bf16 twice (one copy a
 * 128-bit lane, for vpshufb), then the high bytes twice. */
static uint8_t mx_bf[256][64] __attribute__((aligned(64)));
static pthread_once_t mx_once = PTHREAD_ONCE_INIT;
static void mx_init(void) {
    for (int e = 0; e < 256; e++)
        for (int n = 0; n < 16; n++) {
            uint32_t u;
            float f = loip_e2m1_values[n] * loip_e8m0_table[e];
            memcpy(&u, &f, 4); /* (u & 0xFFFF) == 0: see above */
            mx_bf[e][n] = mx_bf[e][16 + n] = (uint8_t)(u >> 16);
            mx_bf[e][32 + n] = mx_bf[e][48 + n] = (uint8_t)(u >> 24);
        }
}

/* The block at p's 32 weights as 4 vectors of 8, in column order, with byte shuffles (which
 * this core runs on two ports; vpermps has one): each lane's code bytes are put where the
 * unpacks below will want them (lane 0: codes 0-3, 8-11, lane 1: 4-7, 12-15; low nibbles, then
 * the same bytes' high nibbles), looked up in the scale's low- and high-byte tables, the two
 * interleaved into bf16 and those into f32's upper halves. 11 shuffles and ALU ops a block
 * instead of 16. */
AI void mx_decode(const uint8_t *p, __m256 w[4]) {
    const __m256i ctrl = _mm256_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6,
                                          7, 12, 13, 14, 15, 4, 5, 6, 7, 12, 13, 14, 15);
    const __m256i sh = _mm256_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4);
    __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p + 1)));
    __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(b, ctrl), sh),
                                   _mm256_set1_epi8(15));
    const __m256i *t = (const __m256i *)mx_bf[p[0]];
    __m256i lo = _mm256_shuffle_epi8(_mm256_load_si256(t), idx);
    __m256i hi = _mm256_shuffle_epi8(_mm256_load_si256(t + 1), idx);
    __m256i w1 = _mm256_unpacklo_epi8(lo, hi), w2 = _mm256_unpackhi_epi8(lo, hi);
    const __m256i z = _mm256_setzero_si256();
    w[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, w1)); /* columns 0-7 */
    w[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, w1)); /* 8-15 */
    w[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, w2)); /* 16-23 */
    w[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, w2)); /* 24-31 */
}
void loip_avx2_quant_init(void) { pthread_once(&mx_once, mx_init); }

AI void mx_tile(const int R, const int T, float *Y, size_t ldy, const uint8_t *W,
                const float *X, size_t r, size_t S, size_t cols, size_t pf) {
    enum { RMAX = MV_ROWS > MM_ROWS ? MV_ROWS : MM_ROWS };
    const size_t rowb = loip_mxfp4_row_bytes(cols), nb = cols / LOIP_MXFP4_BLOCK;

    __m256 acc[RMAX][MM_TOKENS];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) acc[i][j] = _mm256_setzero_ps();
    const uint8_t *row = W + r * rowb;
    /* matvec: a prefetch every 3 blocks (~one a cache line of each row), at the block a counter
     * names: the loop is paced by its instruction count, and b % 3 took 6 of them a block */
    size_t next_pf = T == 1 && pf ? 0 : (size_t)-1;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *q = row + b * LOIP_MXFP4_BLOCK_BYTES;
        if (T == 1 && b == next_pf) {
            next_pf += 3;
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) prefetch_at(row + i * S * rowb, b * LOIP_MXFP4_BLOCK_BYTES, pf);
        }
        const float *xb = X + b * LOIP_MXFP4_BLOCK;
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            const uint8_t *p = q + i * S * rowb;
            __m256 w[4];
            mx_decode(p, w);
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
        for (int j = 0; j < T; j++) Y[j * ldy + r + i * S] = hsum8(acc[i][j]);
}

/* ---- F8 ------------------------------------------------------------------------------------ */

/* 8 E4M3 bytes (the low half of b) as f32 times 2^-8, exactly and without f32 subnormals: the
 * bytes' fields moved into f16's (bias 15, not 7: the 2^-8) and widened by vcvtph2ps. */
AI __m256 f8_widen8(__m128i b) {
    __m128i h = _mm_slli_epi16(_mm_cvtepi8_epi16(b), 7);
    return _mm256_cvtph_ps(_mm_and_si128(h, _mm_set1_epi16((short)0xBF80)));
}

/* 32 bytes the same way, as columns 0-7, 8-15, 16-23 and 24-31: each byte unpacked into the
 * high half of a word and shifted right (arithmetically) into f16's fields, two unpacks (which
 * run on two ports) where sign extension takes two uops on the one shuffle port; then the f16
 * stored to buf (64 bytes, aligned) and each 8 widened from there: vcvtph2ps from a register
 * takes a shuffle uop (and an extract another), from memory none. (asm: a compiler would forward
 * the store into register moves.) */
AI void f8_widen32(__m256i b, __m256 w[4], __m128i *buf) {
    const __m256i z = _mm256_setzero_si256(), mask = _mm256_set1_epi16((short)0xBF80);
    __m256i lo = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpacklo_epi8(z, b), 1), mask);
    __m256i hi = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpackhi_epi8(z, b), 1), mask);
    _mm256_store_si256((__m256i *)buf, lo);     /* columns 0-7 | 16-23 */
    _mm256_store_si256((__m256i *)buf + 1, hi); /* 8-15 | 24-31 */
    __asm__("vcvtph2ps %1, %0" : "=x"(w[0]) : "m"(buf[0]));
    __asm__("vcvtph2ps %1, %0" : "=x"(w[1]) : "m"(buf[2]));
    __asm__("vcvtph2ps %1, %0" : "=x"(w[2]) : "m"(buf[1]));
    __asm__("vcvtph2ps %1, %0" : "=x"(w[3]) : "m"(buf[3]));
}

/* 1 when one of the n (<= 128) bytes at p is a NaN code. */
AI int f8_has_nan(const uint8_t *p, size_t n) {
    const __m256i hi = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi8((char)0xFF);
    size_t k = 0;
    int any = 0;
    for (; k + 32 <= n; k += 32)
        any |= _mm256_movemask_epi8(
            _mm256_cmpeq_epi8(_mm256_or_si256(_mm256_loadu_si256((const __m256i *)(p + k)), hi), ones));
    for (; k < n; k++) any |= (p[k] & 0x7F) == 0x7F;
    return any != 0;
}

/* Columns [c0, c1) of the tile's rows, one 128-column scale block: the block's sums of E4M3 *
 * 2^-8 * x (each product exact), then times 2^8 (exact) and its scale. Returns the witness of
 * NaN codes among the bytes read, built as they are read (a second pass over a block's bytes
 * cost this kernel a tenth of its rate); f8_tile makes a row with one NaN. */
AI __m128i f8_block(const int R, const int T, __m256 acc[][MM_TOKENS],
                    const uint8_t *const *row, const float *s, const float *X, size_t cols,
                    size_t c0, size_t c1, size_t pf) {
    const __m128i top = _mm_set1_epi8((char)0x80);
    __m128i m = _mm_setzero_si128(); /* the bytes' largest | 0x80, bytewise: 0xFF a NaN code */
    enum { RMAX = MV_ROWS > MM_ROWS ? MV_ROWS : MM_ROWS };
    const __m256 k256 = _mm256_set1_ps(256.0f);
    __m256 blk[RMAX][MM_TOKENS];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) blk[i][j] = _mm256_setzero_ps();
    size_t c = c0;
    __m128i f16[RMAX][4] __attribute__((aligned(32))); /* (f8_widen32's, a row each) */
    /* matvec: 32 columns a step (the same FMAs in the same order as 8 a step, which the block's
     * last columns and matmul keep: its tokens' x chunks would not fit the registers four times) */
    if (T == 1) {
        const __m256i top32 = _mm256_set1_epi8((char)0x80);
        __m256i m32 = _mm256_setzero_si256();
        for (; c + 32 <= c1; c += 32) {
            if (pf && (c & 63) == 0)
#pragma GCC unroll 8
                for (int i = 0; i < R; i++) prefetch_at(row[i], c, pf);
            __m256 xv[4];
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) xv[k] = _mm256_loadu_ps(X + c + 8 * k);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) {
                __m256i b = _mm256_loadu_si256((const __m256i *)(row[i] + c));
                m32 = _mm256_max_epu8(m32, _mm256_or_si256(b, top32));
                __m256 w[4];
                f8_widen32(b, w, f16[i]);
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) blk[i][0] = _mm256_fmadd_ps(w[k], xv[k], blk[i][0]);
            }
        }
        m = _mm_max_epu8(m, _mm_max_epu8(_mm256_castsi256_si128(m32), _mm256_extracti128_si256(m32, 1)));
    }
    for (; c + 8 <= c1; c += 8) {
        if (T == 1 && pf && (c & 63) == 0)
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) prefetch_at(row[i], c, pf);
        __m256 xv[MM_TOKENS];
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) xv[j] = _mm256_loadu_ps(X + j * cols + c);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m128i b = _mm_loadl_epi64((const __m128i *)(row[i] + c));
            m = _mm_max_epu8(m, _mm_or_si128(b, top));
            __m256 w = f8_widen8(b);
#pragma GCC unroll 8
            for (int j = 0; j < T; j++) blk[i][j] = _mm256_fmadd_ps(w, xv[j], blk[i][j]);
        }
    }
    if (c < c1) { /* the matrix's last columns: a partial chunk, zeros in the missing lanes */
        size_t k = c1 - c;
        __m256i lanes = _mm256_loadu_si256((const __m256i *)lane_mask[k]);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            uint8_t buf[16] = {0};
            memcpy(buf, row[i] + c, k);
            __m128i b = _mm_loadu_si128((const __m128i *)buf);
            m = _mm_max_epu8(m, _mm_or_si128(b, top));
            __m256 w = _mm256_and_ps(f8_widen8(b), _mm256_castsi256_ps(lanes));
#pragma GCC unroll 8
            for (int j = 0; j < T; j++)
                blk[i][j] = _mm256_fmadd_ps(w, _mm256_maskload_ps(X + j * cols + c, lanes),
                                            blk[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        __m256 sv = _mm256_set1_ps(s[i]);
#pragma GCC unroll 8
        for (int j = 0; j < T; j++)
            acc[i][j] = _mm256_fmadd_ps(_mm256_mul_ps(blk[i][j], k256), sv, acc[i][j]);
    }
    return m;
}

AI void f8_tile(const int R, const int T, float *Y, size_t ldy, const uint8_t *W, const float *X,
                size_t r, size_t S, size_t cols, size_t pf) {
    enum { RMAX = MV_ROWS > MM_ROWS ? MV_ROWS : MM_ROWS };
    __m256 acc[RMAX][MM_TOKENS];
    const uint8_t *row[RMAX];
    const uint8_t *sc[RMAX];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        row[i] = loip_f8_row(W, r + i * S, cols);
        sc[i] = loip_f8_scales(W, r + i * S, cols);
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) acc[i][j] = _mm256_setzero_ps();
    }
    /* poison: the rows with a NaN code. Its weight is NaN, so is its product with any x and any
     * sum that takes it: the row's result is NaN whatever else it holds, and no lane need be. */
    unsigned poison = 0;
    for (size_t c0 = 0; c0 < cols; c0 += LOIP_F8_BLOCK) {
        size_t c1 = cols - c0 > LOIP_F8_BLOCK ? c0 + LOIP_F8_BLOCK : cols;
        float s[RMAX];
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) s[i] = loip_f8_scale(sc[i], c0 / LOIP_F8_BLOCK);
        __m128i nan = f8_block(R, T, acc, row, s, X, cols, c0, c1, pf);
        if (_mm_movemask_epi8(_mm_cmpeq_epi8(nan, _mm_set1_epi8((char)0xFF)))) /* which rows */
            for (int i = 0; i < R; i++) poison |= (unsigned)f8_has_nan(row[i] + c0, c1 - c0) << i;
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) Y[j * ldy + r + i * S] = poison >> i & 1 ? NAN : hsum8(acc[i][j]);
}

/* ---- the entry points ----------------------------------------------------------------------- */

AI void qtile(const int dt, const int R, const int T, float *Y, size_t ldy, const void *W,
              const float *X, size_t r, size_t S, size_t cols, size_t pf) {
    if (dt == LOIP_KDT_MXFP4) mx_tile(R, T, Y, ldy, W, X, r, S, cols, pf);
    else f8_tile(R, T, Y, ldy, W, X, r, S, cols, pf);
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
