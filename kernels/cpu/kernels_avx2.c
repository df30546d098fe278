/* AVX2 + FMA + F16C kernels. Built with -mavx2 -mfma -mf16c for this file only;
 * loip_kernels_avx2() checks the CPU before handing them out.
 *
 * Products: every (row, token) dot product keeps ONE 8-lane fp32 accumulator. Column c lands in
 * lane c % 8; full chunks of 8 columns are FMA'd in column order, a final partial chunk is read
 * zero-padded (a masked load for fp32, a copy into a zeroed 8-element buffer for 16-bit
 * weights), and the lanes are reduced by hsum8 in a fixed order. That order depends only on
 * `cols`, never on how rows and tokens are grouped, so matvec and matmul agree bit for bit (the
 * determinism contract).
 *
 * Weights are widened exactly to fp32 in registers: bf16 by zero-extension and a 16-bit shift
 * (vpmovzxwd + vpslld), f16 by vcvtph2ps. x stays fp32 throughout. */
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu/kernels.h"
#include "cpu/quant.h"

#define AI static inline __attribute__((always_inline))
#define EXPORT __attribute__((visibility("default")))

/* matvec: rows per pass; memory-bound, one FMA chain per row and one x load shared by all.
 * As in the AVX-512 variant, a software prefetch PF_BYTES ahead in every row (once per cache
 * line) keeps enough misses in flight despite the widening uops; 8 rows beat 4 here (bf16
 * ~0.88 vs ~0.82 of a streaming read), the widening being twice as many uops per byte. */
#define MV_ROWS 8
#define PF_BYTES 512
/* matmul: a 3x4 tile holds 12 accumulators, the widened weight and the widening's shuffle
 * control (14 of the 16 ymm registers); the x chunks are FMA memory operands. Each widened weight
 * feeds 4 FMAs. Measured against 2x4 (the tile before the one-shuffle widening), 3x3, 4x3, 2x5,
 * 5x2, 4x2 and 6x2 on a Sapphire Rapids core with AVX2 forced (bf16, 512 tokens, fraction of the
 * FMA probe): 3x4 0.39-0.41, 4x3 and 6x2 alike, 3x3 0.38-0.41, 5x2 0.38-0.39, 4x2 0.33-0.36,
 * 2x5 0.32-0.34, 2x4 0.31-0.33. */
#define MM_ROWS 3
#define MM_TOKENS 4
/* matmul cache blocking (see matmul_impl): columns per block (a multiple of 8), and the bounds
 * of a sweep's rows (loip_kernels_sweep_rows sizes it to the L2; `keep` holds MAX of them). */
#define MM_COLS 1024
#define MM_SWEEP_MIN 32
#define MM_SWEEP_MAX 256

/* Lane masks for _mm256_maskload_ps: row k enables the first k lanes. */
static const int32_t lane_mask[9][8] = {
    {0}, {-1}, {-1, -1}, {-1, -1, -1}, {-1, -1, -1, -1}, {-1, -1, -1, -1, -1},
    {-1, -1, -1, -1, -1, -1}, {-1, -1, -1, -1, -1, -1, -1}, {-1, -1, -1, -1, -1, -1, -1, -1},
};

AI __m256 widen8_h(__m128i h, int dt) {
    if (dt == LOIP_KDT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 weights starting at element i, widened exactly to fp32. bf16 in one shuffle uop, not two:
 * the 16 bytes are broadcast to both 128-bit lanes by the load itself (vbroadcasti128 from
 * memory has no ALU uop; asm, since compilers emit a load and a vinserti128), then vpshufb puts
 * each lane's four weights in the upper halves of its dwords and zeros the lower ones: the
 * same fp32 values as vpmovzxwd + vpslld, without the shift on the FMA ports. */
AI __m256 widen8(const void *W, size_t i, int dt) {
    if (dt == LOIP_KDT_F32) return _mm256_loadu_ps((const float *)W + i);
    const uint16_t *p = (const uint16_t *)W + i;
    if (dt == LOIP_KDT_BF16) {
        const __m256i up = _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7,
                                            -1, -1, 8, 9, -1, -1, 10, 11, -1, -1, 12, 13, -1, -1,
                                            14, 15);
        __m256i b;
        __asm__("vbroadcasti128 %1, %0" : "=x"(b) : "m"(*(const __m128i *)p));
        return _mm256_castsi256_ps(_mm256_shuffle_epi8(b, up));
    }
    return widen8_h(_mm_loadu_si128((const __m128i *)p), dt);
}

/* The first k (< 8) weights at element i, zero-padded; memory past them is not read. */
AI __m256 widen8_part(const void *W, size_t i, size_t k, int dt) {
    if (dt == LOIP_KDT_F32)
        return _mm256_maskload_ps((const float *)W + i,
                                  _mm256_loadu_si256((const __m256i *)lane_mask[k]));
    uint16_t buf[8] = {0};
    memcpy(buf, (const uint16_t *)W + i, k * sizeof(uint16_t));
    return widen8_h(_mm_loadu_si128((const __m128i *)buf), dt);
}

/* Fixed reduction order: halves, then quarters, then the last pair. */
AI float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* matvec's software prefetch: PF_BYTES ahead of byte `off` in row `row`, past that row's end
 * into the next row, which the same stream reads next (matvec_impl). Without it the first
 * PF_BYTES of every row would start cold. (Integer arithmetic: the address may lie past W's
 * end, which a prefetch may name and C pointer arithmetic may not.) */
AI void prefetch_ahead(const void *W, size_t row, size_t rowb, size_t off) {
    _mm_prefetch((const char *)((uintptr_t)W + row * rowb + off + PF_BYTES), _MM_HINT_T0);
}

/* The one micro-kernel behind matvec and matmul: Y[j*ldy + r+i*S] = W[r+i*S,:] . X[j,:] for
 * i < R, j < T, over the columns [c0, c1) (S: 1 in matmul; in matvec the rows between the
 * tile's streams). c0 is a multiple of 8; a tile that does not start at column 0 resumes the
 * accumulators kept in `keep` (R*MM_TOKENS vectors, row-major), one that does not end at `cols`
 * leaves them there instead of reducing, so splitting the columns into blocks pauses each FMA
 * chain without reordering it. R, T and dt are constants at every call site, so after inlining
 * the arrays below are registers and the dtype branches vanish. */
AI void tile(const int R, const int T, const int dt, float *Y, size_t ldy, const void *W,
             const float *X, size_t r, size_t S, size_t cols, size_t c0, size_t c1, __m256 *keep) {
    __m256 acc[MM_ROWS > MV_ROWS ? MM_ROWS : MV_ROWS][MM_TOKENS];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++)
            acc[i][j] = c0 == 0 ? _mm256_setzero_ps() : keep[i * MM_TOKENS + j];

    const size_t esz = dt == LOIP_KDT_F32 ? 4 : 2;
    size_t c = c0;
    for (; c + 8 <= c1; c += 8) {
        if (T == 1 && ((c * esz) & 63) == 0) /* matvec only; matmul is not memory-bound */
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) prefetch_ahead(W, r + i * S, cols * esz, c * esz);
        __m256 xv[MM_TOKENS];
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) xv[j] = _mm256_loadu_ps(X + j * cols + c);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m256 w = widen8(W, (r + i * S) * cols + c, dt);
#pragma GCC unroll 8
            for (int j = 0; j < T; j++) acc[i][j] = _mm256_fmadd_ps(w, xv[j], acc[i][j]);
        }
    }
    if (c1 < cols) {
#pragma GCC unroll 8
        for (int i = 0; i < R; i++)
#pragma GCC unroll 8
            for (int j = 0; j < T; j++) keep[i * MM_TOKENS + j] = acc[i][j];
        return;
    }
    if (c < cols) {
        size_t k = cols - c;
        __m256i m = _mm256_loadu_si256((const __m256i *)lane_mask[k]);
        __m256 xv[MM_TOKENS];
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) xv[j] = _mm256_maskload_ps(X + j * cols + c, m);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m256 w = widen8_part(W, (r + i * S) * cols + c, k, dt);
#pragma GCC unroll 8
            for (int j = 0; j < T; j++) acc[i][j] = _mm256_fmadd_ps(w, xv[j], acc[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) Y[j * ldy + r + i * S] = hsum8(acc[i][j]);
}

/* ---- matvec ------------------------------------------------------------------------------- */

/* Memory-bound: MV_ROWS rows at once, each x chunk loaded once for all of them. The thread's
 * rows [r0, r1) are cut into MV_ROWS runs of q consecutive rows, and tile i takes row i of every
 * run: each of its rows is a stream that goes on into the next row of its run, so each stream
 * walks memory in order (as quant_avx512.c's matvec does), and the prefetch past a row's end
 * lands where that stream reads next. Each row is computed as before; only which rows share a
 * tile changed. Against adjacent rows in a tile (each stream jumping MV_ROWS rows at a row's
 * end), three alternated rounds on an Emerald Rapids VM, 2 threads: bf16 4096x4096 0.89 ->
 * 0.91-0.92 of the read probe, the synthetic llama-3.2-1b's decode 0.88-0.90 -> 0.90-0.91. (The
 * AVX-512 matvec, given the same order in the same run, was no faster and kept its own.) */
AI void matvec_impl(const int dt, float *y, const void *W, const float *x, size_t r0, size_t r1,
                    size_t cols) {
    const size_t q = (r1 - r0) / MV_ROWS;
    for (size_t i = 0; i < q; i++)
        tile(MV_ROWS, 1, dt, y, 0, W, x, r0 + i, q, cols, 0, cols, NULL);
    for (size_t r = r0 + q * MV_ROWS; r < r1; r++)
        tile(1, 1, dt, y, 0, W, x, r, 1, cols, 0, cols, NULL);
}

static void matvec_f32(float *y, const void *W, const float *x, size_t r0, size_t r1,
                       size_t cols) {
    matvec_impl(LOIP_KDT_F32, y, W, x, r0, r1, cols);
}
static void matvec_bf16(float *y, const void *W, const float *x, size_t r0, size_t r1,
                        size_t cols) {
    matvec_impl(LOIP_KDT_BF16, y, W, x, r0, r1, cols);
}
static void matvec_f16(float *y, const void *W, const float *x, size_t r0, size_t r1,
                       size_t cols) {
    matvec_impl(LOIP_KDT_F16, y, W, x, r0, r1, cols);
}

/* ---- matmul ------------------------------------------------------------------------------- */

/* A row tile against T (<= MM_TOKENS) tokens; the switch turns T back into a constant. */
_Static_assert(MM_TOKENS <= 5, "tile_any covers 1..5 tokens");
AI void tile_any(const int R, const int dt, size_t T, float *Y, size_t ldy, const void *W,
                 const float *X, size_t r, size_t cols, size_t c0, size_t c1, __m256 *keep) {
    switch (T) {
    case 1: tile(R, 1, dt, Y, ldy, W, X, r, 1, cols, c0, c1, keep); break;
    case 2: tile(R, 2, dt, Y, ldy, W, X, r, 1, cols, c0, c1, keep); break;
    case 3: tile(R, 3, dt, Y, ldy, W, X, r, 1, cols, c0, c1, keep); break;
    case 4:
        tile(R, MM_TOKENS < 4 ? MM_TOKENS : 4, dt, Y, ldy, W, X, r, 1, cols, c0, c1, keep);
        break;
    default: tile(R, MM_TOKENS, dt, Y, ldy, W, X, r, 1, cols, c0, c1, keep); break;
    }
}

/* Compute-bound: a 3x4 tile does 12 FMAs per 8 columns for 3 weight widenings (a shuffle each,
 * off the FMA ports on Intel) and 15 loads, provided its operands come from L1. Blocking,
 * innermost first:
 *  - MM_COLS columns of MM_TOKENS tokens' x (16 KB; 512 columns ran 0.39-0.41 of the probe,
 *    1024 0.41-0.43) stay in L1 while every row tile of a sweep passes over them; the tiles'
 *    accumulators wait in `keep` (128 B a row of the sweep) between column blocks;
 *  - a sweep of rows (half the L2: 256 rows of bf16 at 2048 columns on a 2 MB L2) stays in L2
 *    while all the tokens pass over them, so each weight is read from memory once per call and
 *    each token's x once per sweep (loip_kernels_sweep_rows; a fixed 32 rows re-read 512
 *    tokens' x 64 times in a 2048-row layer, and ran ~8% slower). */
AI void matmul_impl(const int dt, float *Y, size_t ldy, const void *W, const float *X, size_t n,
                    size_t r0, size_t r1, size_t cols) {
    const size_t sweep = loip_kernels_sweep_rows(cols * (dt == LOIP_KDT_F32 ? 4 : 2), MM_ROWS,
                                                 MM_SWEEP_MIN, MM_SWEEP_MAX);
    __m256 keep[MM_SWEEP_MAX * MM_TOKENS];
    for (size_t rs = r0; rs < r1; rs += sweep) {
        size_t re = rs + sweep < r1 ? rs + sweep : r1;
        for (size_t t = 0; t < n; t += MM_TOKENS) {
            size_t T = n - t < MM_TOKENS ? n - t : MM_TOKENS;
            float *Yt = Y + t * ldy;
            const float *Xt = X + t * cols;
            size_t c0 = 0;
            do { /* at least once: cols == 0 still writes the zero sums, as matvec does */
                size_t c1 = cols - c0 > MM_COLS ? c0 + MM_COLS : cols;
                size_t r = rs;
                for (; r + MM_ROWS <= re; r += MM_ROWS)
                    tile_any(MM_ROWS, dt, T, Yt, ldy, W, Xt, r, cols, c0, c1,
                             keep + (r - rs) * MM_TOKENS);
                for (; r < re; r++)
                    tile_any(1, dt, T, Yt, ldy, W, Xt, r, cols, c0, c1,
                             keep + (r - rs) * MM_TOKENS);
                c0 = c1;
            } while (c0 < cols);
        }
    }
}

static void matmul_f32(float *Y, size_t ldy, const void *W, const float *X, size_t n, size_t r0,
                       size_t r1, size_t cols) {
    matmul_impl(LOIP_KDT_F32, Y, ldy, W, X, n, r0, r1, cols);
}
static void matmul_bf16(float *Y, size_t ldy, const void *W, const float *X, size_t n, size_t r0,
                        size_t r1, size_t cols) {
    matmul_impl(LOIP_KDT_BF16, Y, ldy, W, X, n, r0, r1, cols);
}
static void matmul_f16(float *Y, size_t ldy, const void *W, const float *X, size_t n, size_t r0,
                       size_t r1, size_t cols) {
    matmul_impl(LOIP_KDT_F16, Y, ldy, W, X, n, r0, r1, cols);
}

/* ---- attention helpers, rmsnorm ----------------------------------------------------------- */

/* Attention scores: short vectors (head_dim), so two accumulators to halve the FMA chain. */
static float dot_f32(const float *a, const float *b, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i < n; i += 8) {
        __m256i m = _mm256_loadu_si256((const __m256i *)lane_mask[n - i >= 8 ? 8 : n - i]);
        s0 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), s0);
    }
    return hsum8(_mm256_add_ps(s0, s1));
}

/* y += a*x, one fused multiply-add per element; the tail is a masked load and store. */
static void axpy_f32(float *y, float a, const float *x, size_t n) {
    __m256 av = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    if (i < n) {
        __m256i m = _mm256_loadu_si256((const __m256i *)lane_mask[n - i]);
        __m256 v = _mm256_fmadd_ps(av, _mm256_maskload_ps(x + i, m), _mm256_maskload_ps(y + i, m));
        _mm256_maskstore_ps(y + i, m, v);
    }
}

/* Two passes: the fp32 sum of squares in two 8-lane accumulators, then o = x * inv * w with w
 * widened like the matrix weights. o may be x itself. */
AI void rmsnorm_impl(const int dt, float *o, const float *x, const void *w, size_t n, float eps) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        s0 = _mm256_fmadd_ps(a, a, s0);
        s1 = _mm256_fmadd_ps(b, b, s1);
    }
    for (; i < n; i += 8) {
        __m256i m = _mm256_loadu_si256((const __m256i *)lane_mask[n - i >= 8 ? 8 : n - i]);
        __m256 a = _mm256_maskload_ps(x + i, m);
        s0 = _mm256_fmadd_ps(a, a, s0);
    }
    float ss = hsum8(_mm256_add_ps(s0, s1));
    __m256 inv = _mm256_set1_ps(1.0f / sqrtf(ss / (float)(n ? n : 1) + eps));
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv),
                                              widen8(w, i, dt)));
    if (i < n) {
        __m256i m = _mm256_loadu_si256((const __m256i *)lane_mask[n - i]);
        __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_maskload_ps(x + i, m), inv),
                                 widen8_part(w, i, n - i, dt));
        _mm256_maskstore_ps(o + i, m, v);
    }
}

static void rmsnorm(float *o, const float *x, const void *w, int wdt, size_t n, float eps) {
    if (wdt == LOIP_KDT_BF16) rmsnorm_impl(LOIP_KDT_BF16, o, x, w, n, eps);
    else if (wdt == LOIP_KDT_F16) rmsnorm_impl(LOIP_KDT_F16, o, x, w, n, eps);
    else rmsnorm_impl(LOIP_KDT_F32, o, x, w, n, eps);
}

static const loip_kernels avx2 = {
    .name = "avx2",
    .matvec = {[LOIP_KDT_F32] = matvec_f32, [LOIP_KDT_BF16] = matvec_bf16,
               [LOIP_KDT_F16] = matvec_f16, [LOIP_KDT_MXFP4] = loip_avx2_matvec_mxfp4,
               [LOIP_KDT_F8_E4M3] = loip_avx2_matvec_f8},
    .matmul = {[LOIP_KDT_F32] = matmul_f32, [LOIP_KDT_BF16] = matmul_bf16,
               [LOIP_KDT_F16] = matmul_f16, [LOIP_KDT_MXFP4] = loip_avx2_matmul_mxfp4,
               [LOIP_KDT_F8_E4M3] = loip_avx2_matmul_f8},
    .dot_f32 = dot_f32,
    .axpy_f32 = axpy_f32,
    .rmsnorm = rmsnorm,
};

/* CPUID.1:ECX.F16C; asked directly because not every compiler's __builtin_cpu_supports
 * knows "f16c". */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

/* Called on any x86-64 CPU, so it (and has_f16c) must compile to no vector instructions even
 * though this file is built for AVX2; objdump shows none with gcc 12 -O2. */
EXPORT const loip_kernels *loip_kernels_avx2(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
        !has_f16c())
        return NULL;
    loip_avx2_quant_init();
    return &avx2;
}
