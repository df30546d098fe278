/* AVX-512 MXFP4 kernels (built with kernels_avx512.c's flags; loip_kernels_avx512() checks the
 * CPU before handing out its table, which holds these), and the table's F8 entries, which are
 * quant_avx512_vbmi.c's kernels on a CPU with VBMI and quant_avx2.c's elsewhere.
 *
 * As kernels_avx512.c: every (row, token) dot product is ONE 16-lane fp32 accumulator, column c
 * in lane c % 16, chunks of 16 columns FMA'd in column order, the lanes reduced by
 * _mm512_reduce_add_ps. Weights are dequantized exactly (quant.h) in registers: a block's 16
 * code bytes zero-extended to 16 dwords index the 16 E2M1 values already multiplied by the
 * block's scale (exact: a power of two; mx_tab), vpermps taking the low nibble as is (it reads 4
 * index bits) and the high one after a shift: two vectors, the block's columns 0-15 and 16-31. */
#include <immintrin.h>
#include <pthread.h>

#include "cpu/quant.h"

#define AI static inline __attribute__((always_inline))

/* matvec: rows per pass (each its own FMA chain and memory stream; x loads shared); matmul: a
 * tile of MM_ROWS x MM_TOKENS accumulators (16 zmm; the rows' decoded weights and the x chunks
 * take most of the rest), over sweeps of rows that stay in L2 while every token passes
 * (quant_walk.h). */
#define MV_ROWS 8
#define MM_ROWS 4
#define MM_TOKENS 4
#define MM_SWEEP_MIN 32
#define MM_SWEEP_MAX 256

#include "cpu/quant_walk.h"

/* ---- MXFP4 --------------------------------------------------------------------------------- */

/* The 16 E2M1 values times each scale 2^(e-127) (exact, or +-inf, or NaN for e = 0xFF): a
 * block's table is one aligned load, no broadcast or multiply. */
static float mx_tab[256][16] __attribute__((aligned(64)));
static pthread_once_t quant_once = PTHREAD_ONCE_INIT;
static void mx_init(void) {
    for (int e = 0; e < 256; e++)
        for (int i = 0; i < 16; i++) mx_tab[e][i] = loip_e2m1_values[i] * loip_e8m0_table[e];
}

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
    /* matvec: a prefetch every 3 blocks (~one a cache line of each row), at the block a counter
     * names (b % 3 costs a multiply and compares a block) */
    size_t next_pf = T == 1 && pf ? 0 : (size_t)-1;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *q = row + b * LOIP_MXFP4_BLOCK_BYTES;
        if (T == 1 && b == next_pf) {
            next_pf += 3;
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) prefetch_at(row + i * S * rowb, b * LOIP_MXFP4_BLOCK_BYTES, pf);
        }
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

/* ---- the entry points ----------------------------------------------------------------------- */

AI void qtile(const int dt, const int R, const int T, float *Y, size_t ldy, const void *W,
              const float *X, size_t r, size_t S, size_t cols, size_t pf) {
    (void)dt; /* MXFP4 only */
    mx_tile(R, T, Y, ldy, W, X, r, S, cols, pf);
}

void loip_avx512_matvec_mxfp4(float *y, const void *W, const float *x, size_t r0, size_t r1,
                              size_t cols) {
    matvec_impl(LOIP_KDT_MXFP4, y, W, x, r0, r1, cols);
}
void loip_avx512_matmul_mxfp4(float *Y, size_t ldy, const void *W, const float *X, size_t n,
                              size_t r0, size_t r1, size_t cols) {
    matmul_impl(LOIP_KDT_MXFP4, Y, ldy, W, X, n, r0, r1, cols);
}

/* F8: VBMI's kernels where the CPU has VBMI, else AVX2's (quant_avx512_vbmi.c's header says
 * why: its byte permutes are what keep F8's decode at memory speed). Chosen once, by
 * loip_avx512_quant_init; both kernels of the table come from the same variant, so its matmul
 * still equals its matvec bit for bit. */
static loip_matvec_fn f8_matvec;
static loip_matmul_fn f8_matmul;

void loip_avx512_matvec_f8(float *y, const void *W, const float *x, size_t r0, size_t r1,
                           size_t cols) {
    f8_matvec(y, W, x, r0, r1, cols);
}
void loip_avx512_matmul_f8(float *Y, size_t ldy, const void *W, const float *X, size_t n,
                           size_t r0, size_t r1, size_t cols) {
    f8_matmul(Y, ldy, W, X, n, r0, r1, cols);
}

/* Called by loip_kernels_avx512() once the CPU has passed its checks (AVX2 and FMA among them). */
static void quant_init(void) {
    mx_init();
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vbmi")) {
        loip_avx512vbmi_quant_init();
        f8_matvec = loip_avx512vbmi_matvec_f8, f8_matmul = loip_avx512vbmi_matmul_f8;
    } else {
        loip_avx2_quant_init();
        f8_matvec = loip_avx2_matvec_f8, f8_matmul = loip_avx2_matmul_f8;
    }
}
void loip_avx512_quant_init(void) { pthread_once(&quant_once, quant_init); }
