/* AVX-512 kernels (F, BW, VL; F16C for half weights). Built with -mavx512f -mavx512bw
 * -mavx512vl ... for this file only; loip_kernels_avx512() checks the CPU before handing them out.
 *
 * Products: every (row, token) dot product keeps ONE 16-lane fp32 accumulator. Column c lands in
 * lane c % 16; full chunks of 16 columns are FMA'd in column order, a final partial chunk is
 * loaded under a mask (zeros in the missing lanes), and the 16 lanes are reduced in
 * _mm512_reduce_add_ps's order (reduce4: four sums at once). That order depends only on
 * `cols`, never on how many rows or tokens a pass handles, so matvec and matmul produce the
 * same bits (the determinism contract) while the two group rows and tokens differently.
 *
 * Weights are widened exactly to fp32 in registers: bf16 by zero-extension and a 16-bit shift
 * (vpmovzxwd + vpslld), f16 by vcvtph2ps. x stays fp32 throughout. */
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>

#include "cpu/kernels.h"
#include "cpu/quant.h"

#define AI static inline __attribute__((always_inline))
#define EXPORT __attribute__((visibility("default")))

/* matvec: rows per pass. Memory-bound: each weight is read once, so the aims are enough
 * independent FMA chains (one per row), one x load per chunk shared by the rows, and enough
 * cache misses in flight. Widening bf16 costs ~3 uops per 32 bytes, so the out-of-order window
 * reaches only a few KB ahead and the hardware prefetchers (which stop at 4 KB pages) leave the
 * core short of misses; a software prefetch PF_BYTES ahead in every row, once per cache line,
 * took bf16 4096x4096 from ~0.77 to ~0.93 of a plain streaming read on Sapphire Rapids (8 rows
 * vs 4: slightly ahead, within noise; L2 hint or 1.5 KB ahead: worse). */
#define MV_ROWS 8
#define PF_BYTES 512
/* matmul: a tile of MM_ROWS x MM_TOKENS accumulators (24 of the 32 zmm registers, plus the
 * tokens' x chunks and one widened weight). Each widened weight vector feeds MM_TOKENS FMAs and
 * each x chunk MM_ROWS, which spreads bf16's two widening uops over six FMAs. (4x6 measured
 * ahead of 4x4, 6x4, 5x4, 3x8 and 2x8 for bf16.) */
#define MM_ROWS 4
#define MM_TOKENS 6
/* matmul cache blocking (see matmul_impl): columns per block (a multiple of 16), and the bounds
 * of a sweep's rows (loip_kernels_sweep_rows sizes it to the L2; `keep` holds MAX of them).
 * 1024 columns of 6 tokens' x is 24 KB of L1 (512: each tile's accumulators paused twice as
 * often, ~3% slower on Emerald Rapids). */
#define MM_COLS 1024
#define MM_SWEEP_MIN 32
#define MM_SWEEP_MAX 256

/* 16 weights starting at element i, widened exactly to fp32. */
AI __m512 widen16(const void *W, size_t i, int dt) {
    if (dt == LOIP_KDT_F32) return _mm512_loadu_ps((const float *)W + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)W + i));
    if (dt == LOIP_KDT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Same for the lanes in m; the others read as +0 and their memory is not touched. */
AI __m512 widen16_mask(const void *W, size_t i, __mmask16 m, int dt) {
    if (dt == LOIP_KDT_F32) return _mm512_maskz_loadu_ps(m, (const float *)W + i);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)W + i);
    if (dt == LOIP_KDT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* matvec's software prefetch: PF_BYTES ahead of byte `off` in row `row`; past that row's end,
 * the same distance into the row `stride` rows on, which this stream reads next (the same row
 * slot of the next tile). Without the wrap the first PF_BYTES of every row start cold, which
 * cost short rows (bf16 8192x2048: 4 KB) ~6% of bandwidth. */
AI void prefetch_ahead(const void *W, size_t row, size_t stride, size_t rowb, size_t off) {
    const char *p = (const char *)W + row * rowb + off + PF_BYTES;
    if (off + PF_BYTES >= rowb) p += (stride - 1) * rowb;
    _mm_prefetch(p, _MM_HINT_T0);
}

/* Four 16-lane sums at once, each added in the order of GCC's _mm512_reduce_add_ps: lane i with
 * i + 8, then with i + 4, then with i + 2, then 0 with 1 (so the bits are the ones that
 * reduced them one at a time, whatever compiler builds this). 14 vector uops for the four,
 * against about 8 each one at a time: a matmul tile of 4 rows x 6 tokens ends its column run
 * with 24 of them, 7-14% of a 2048-column run's FMA time. Returns the sums of a, b, c, d. */
AI __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
    /* quarters [a.q0 + a.q2, a.q1 + a.q3, b.q0 + b.q2, b.q1 + b.q3]: lane i with i + 8 */
    __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
    /* quarters [a, b, c, d], each its 8 sums' lane i with i + 4 */
    __m512 q = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
    /* in each quarter lane 0 with 2 (and 1 with 3), then 0 with 1 */
    q = _mm512_add_ps(q, _mm512_permute_ps(q, _MM_SHUFFLE(1, 0, 3, 2)));
    q = _mm512_add_ps(q, _mm512_permute_ps(q, _MM_SHUFFLE(2, 3, 0, 1)));
    /* lane 0 of each quarter */
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), q));
}

/* One 16-lane sum in the same order. */
AI float reduce1(__m512 a) { return _mm_cvtss_f32(reduce4(a, a, a, a)); }

/* The one micro-kernel behind matvec and matmul: Y[j*ldy + r+i] = W[r+i,:] . X[j,:] for
 * i < R, j < T, over the columns [c0, c1). c0 is a multiple of 16; a tile that does not start at
 * column 0 resumes the accumulators kept in `keep` (R*MM_TOKENS vectors, row-major), one that
 * does not end at `cols` leaves them there instead of reducing, so splitting the columns into
 * blocks pauses each FMA chain without reordering it. R, T and dt are constants at every call
 * site, so after inlining the arrays below are registers and the dtype branches vanish. */
AI void tile(const int R, const int T, const int dt, float *Y, size_t ldy, const void *W,
             const float *X, size_t r, size_t cols, size_t c0, size_t c1, __m512 *keep) {
    __m512 acc[MM_ROWS > MV_ROWS ? MM_ROWS : MV_ROWS][MM_TOKENS];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++)
            acc[i][j] = c0 == 0 ? _mm512_setzero_ps() : keep[i * MM_TOKENS + j];

    const size_t esz = dt == LOIP_KDT_F32 ? 4 : 2;
    size_t c = c0;
    for (; c + 16 <= c1; c += 16) {
        if (T == 1 && ((c * esz) & 63) == 0) /* matvec only; matmul is not memory-bound */
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) prefetch_ahead(W, r + i, R, cols * esz, c * esz);
        __m512 xv[MM_TOKENS];
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) xv[j] = _mm512_loadu_ps(X + j * cols + c);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m512 w = widen16(W, (r + i) * cols + c, dt);
#pragma GCC unroll 8
            for (int j = 0; j < T; j++) acc[i][j] = _mm512_fmadd_ps(w, xv[j], acc[i][j]);
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
        __mmask16 m = (__mmask16)((1u << (cols - c)) - 1);
        __m512 xv[MM_TOKENS];
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) xv[j] = _mm512_maskz_loadu_ps(m, X + j * cols + c);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m512 w = widen16_mask(W, (r + i) * cols + c, m, dt);
#pragma GCC unroll 8
            for (int j = 0; j < T; j++) acc[i][j] = _mm512_fmadd_ps(w, xv[j], acc[i][j]);
        }
    }
    /* a token's rows four at a time (the sums stored together), any left one by one */
    int i = 0;
#pragma GCC unroll 8
    for (; i + 4 <= R; i += 4)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++)
            _mm_storeu_ps(Y + j * ldy + r + i, reduce4(acc[i][j], acc[i + 1][j], acc[i + 2][j], acc[i + 3][j]));
#pragma GCC unroll 8
    for (; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) Y[j * ldy + r + i] = reduce1(acc[i][j]);
}

/* ---- matvec ------------------------------------------------------------------------------- */

/* Memory-bound (1 byte of bf16 weight per FLOP): MV_ROWS rows at a time share each x chunk;
 * leftover rows go one at a time. */
AI void matvec_impl(const int dt, float *y, const void *W, const float *x, size_t r0, size_t r1,
                    size_t cols) {
    size_t r = r0;
    for (; r + MV_ROWS <= r1; r += MV_ROWS)
        tile(MV_ROWS, 1, dt, y, 0, W, x, r, cols, 0, cols, NULL);
    for (; r < r1; r++) tile(1, 1, dt, y, 0, W, x, r, cols, 0, cols, NULL);
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
_Static_assert(MM_TOKENS == 6, "tile_any covers 1..6 tokens");
AI void tile_any(const int R, const int dt, size_t T, float *Y, size_t ldy, const void *W,
                 const float *X, size_t r, size_t cols, size_t c0, size_t c1, __m512 *keep) {
    switch (T) {
    case 1: tile(R, 1, dt, Y, ldy, W, X, r, cols, c0, c1, keep); break;
    case 2: tile(R, 2, dt, Y, ldy, W, X, r, cols, c0, c1, keep); break;
    case 3: tile(R, 3, dt, Y, ldy, W, X, r, cols, c0, c1, keep); break;
    case 4: tile(R, 4, dt, Y, ldy, W, X, r, cols, c0, c1, keep); break;
    case 5: tile(R, 5, dt, Y, ldy, W, X, r, cols, c0, c1, keep); break;
    default: tile(R, 6, dt, Y, ldy, W, X, r, cols, c0, c1, keep); break;
    }
}

/* Compute-bound: per 16 columns a 4x6 tile does 24 FMAs for 4 weight widenings (8 uops on the
 * FMA ports) and 10 loads, so its ceiling is ~75% of peak FMA throughput, provided its operands
 * come from L1. Blocking, innermost first:
 *  - MM_COLS columns of MM_TOKENS tokens' x (12 KB) stay in L1 while every row tile of a sweep
 *    passes over them; the tiles' accumulators wait in `keep` (384 B a row of the sweep) between column blocks;
 *  - a sweep of rows (half the L2: 256 rows of bf16 at 2048 columns on a 2 MB L2) stays in L2
 *    while all the tokens pass over them, so each weight is read from memory once per call and
 *    each token's x once per sweep (loip_kernels_sweep_rows; a fixed 32 rows re-read 512
 *    tokens' x 64 times in a 2048-row layer, and ran ~8% slower). */
AI void matmul_impl(const int dt, float *Y, size_t ldy, const void *W, const float *X, size_t n,
                    size_t r0, size_t r1, size_t cols) {
    const size_t sweep = loip_kernels_sweep_rows(cols * (dt == LOIP_KDT_F32 ? 4 : 2), MM_ROWS,
                                                 MM_SWEEP_MIN, MM_SWEEP_MAX);
    __m512 keep[MM_SWEEP_MAX * MM_TOKENS];
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

/* Half-precision weights against many tokens: each sweep's rows are widened to fp32 once, into
 * a buffer that stays in L2, and the fp32 tiles run on it. matmul_impl widens every weight
 * vector once per token group, and its two widening uops share ports 0 and 5 with the FMAs
 * (a ceiling of 24 FMAs in 16 cycles, 0.75 of the FMA peak, ~0.62 measured); once per sweep
 * they are 1/(tokens) of that, and the tile's loads go to the load ports. The fp32 copies
 * are exact and the tile does the same FMAs in the same order, so the bits are matmul_impl's
 * (and matvec's). From WIDE_TOKENS tokens: below, widening 16 weights into the buffer (a load,
 * two uops and a store) costs more than the once-per-group widenings it saves (2 uops per
 * MM_TOKENS tokens); also the path taken when the buffer cannot be had. */
#define WIDE_TOKENS (2 * MM_TOKENS)
AI void matmul_wide(const int dt, float *Y, size_t ldy, const void *W, const float *X, size_t n,
                    size_t r0, size_t r1, size_t cols) {
    const size_t sweep = loip_kernels_sweep_rows(cols * 4, MM_ROWS, MM_SWEEP_MIN, MM_SWEEP_MAX);
    float *wf = n < WIDE_TOKENS || !cols ? NULL
                                         : aligned_alloc(64, (sweep * cols * 4 + 63) / 64 * 64);
    if (!wf) {
        matmul_impl(dt, Y, ldy, W, X, n, r0, r1, cols);
        return;
    }
    for (size_t rs = r0; rs < r1; rs += sweep) {
        size_t re = rs + sweep < r1 ? rs + sweep : r1;
        const uint16_t *w = (const uint16_t *)W + rs * cols;
        size_t m = (re - rs) * cols, i = 0;
        for (; i + 16 <= m; i += 16) _mm512_store_ps(wf + i, widen16(w, i, dt));
        if (i < m) {
            __mmask16 k = (__mmask16)((1u << (m - i)) - 1);
            _mm512_mask_storeu_ps(wf + i, k, widen16_mask(w, i, k, dt));
        }
        matmul_impl(LOIP_KDT_F32, Y + rs, ldy, wf, X, n, 0, re - rs, cols);
    }
    free(wf);
}

static void matmul_f32(float *Y, size_t ldy, const void *W, const float *X, size_t n, size_t r0,
                       size_t r1, size_t cols) {
    matmul_impl(LOIP_KDT_F32, Y, ldy, W, X, n, r0, r1, cols);
}
static void matmul_bf16(float *Y, size_t ldy, const void *W, const float *X, size_t n, size_t r0,
                        size_t r1, size_t cols) {
    matmul_wide(LOIP_KDT_BF16, Y, ldy, W, X, n, r0, r1, cols);
}
static void matmul_f16(float *Y, size_t ldy, const void *W, const float *X, size_t n, size_t r0,
                       size_t r1, size_t cols) {
    matmul_wide(LOIP_KDT_F16, Y, ldy, W, X, n, r0, r1, cols);
}

/* ---- attention helpers, rmsnorm ----------------------------------------------------------- */

/* Attention scores: vectors are short (head_dim, 64..256), so latency matters more than
 * bandwidth; two accumulators hide half the FMA latency without a long reduction. */
static float dot_f32(const float *a, const float *b, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

/* y += a*x, one fused multiply-add per element; the tail is a masked load and store. */
static void axpy_f32(float *y, float a, const float *x, size_t n) {
    __m512 av = _mm512_set1_ps(a);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i,
                         _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i),
                                   _mm512_maskz_loadu_ps(m, y + i));
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

/* dot_f32 over m rows of K (row i at K + i*ldk): the same code per row, inlined, so each result
 * has dot_f32's bits; attention's scores of one query against a block of cached keys. */
static void dots_f32(float *out, const float *q, const float *K, size_t ldk, size_t m, size_t n) {
    for (size_t i = 0; i < m; i++) out[i] = dot_f32(q, K + i * ldk, n);
}

/* y += w[i] * V[i*ldv ..] for i = 0..m-1 in that order: each element gets the FMAs m axpy_f32
 * calls would give it, in the same order, but y stays in registers (64 floats at a time). */
static void axpys_f32(float *y, const float *w, const float *V, size_t ldv, size_t m, size_t n) {
    size_t c = 0;
    for (; c + 64 <= n; c += 64) {
        __m512 y0 = _mm512_loadu_ps(y + c), y1 = _mm512_loadu_ps(y + c + 16);
        __m512 y2 = _mm512_loadu_ps(y + c + 32), y3 = _mm512_loadu_ps(y + c + 48);
        for (size_t i = 0; i < m; i++) {
            const float *x = V + i * ldv + c;
            __m512 av = _mm512_set1_ps(w[i]);
            y0 = _mm512_fmadd_ps(av, _mm512_loadu_ps(x), y0);
            y1 = _mm512_fmadd_ps(av, _mm512_loadu_ps(x + 16), y1);
            y2 = _mm512_fmadd_ps(av, _mm512_loadu_ps(x + 32), y2);
            y3 = _mm512_fmadd_ps(av, _mm512_loadu_ps(x + 48), y3);
        }
        _mm512_storeu_ps(y + c, y0);
        _mm512_storeu_ps(y + c + 16, y1);
        _mm512_storeu_ps(y + c + 32, y2);
        _mm512_storeu_ps(y + c + 48, y3);
    }
    for (; c < n; c += 16) {
        __mmask16 mk = n - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - c)) - 1);
        __m512 acc = _mm512_maskz_loadu_ps(mk, y + c);
        for (size_t i = 0; i < m; i++)
            acc = _mm512_fmadd_ps(_mm512_set1_ps(w[i]), _mm512_maskz_loadu_ps(mk, V + i * ldv + c), acc);
        _mm512_mask_storeu_ps(y + c, mk, acc);
    }
}

/* Two passes: the fp32 sum of squares in two 16-lane accumulators, then o = x * inv * w with
 * w widened like the matrix weights. o may be x itself. */
AI void rmsnorm_impl(const int dt, float *o, const float *x, const void *w, size_t n, float eps) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
        s0 = _mm512_fmadd_ps(a, a, s0);
        s1 = _mm512_fmadd_ps(b, b, s1);
    }
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 a = _mm512_maskz_loadu_ps(m, x + i);
        s0 = _mm512_fmadd_ps(a, a, s0);
    }
    float ss = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    __m512 inv = _mm512_set1_ps(1.0f / sqrtf(ss / (float)(n ? n : 1) + eps));
    for (i = 0; i + 16 <= n; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), inv), widen16(w, i, dt));
        _mm512_storeu_ps(o + i, v);
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv),
                                 widen16_mask(w, i, m, dt));
        _mm512_mask_storeu_ps(o + i, m, v);
    }
}

static void rmsnorm(float *o, const float *x, const void *w, int wdt, size_t n, float eps) {
    if (wdt == LOIP_KDT_BF16) rmsnorm_impl(LOIP_KDT_BF16, o, x, w, n, eps);
    else if (wdt == LOIP_KDT_F16) rmsnorm_impl(LOIP_KDT_F16, o, x, w, n, eps);
    else rmsnorm_impl(LOIP_KDT_F32, o, x, w, n, eps);
}

static const loip_kernels avx512 = {
    .name = "avx512",
    .matvec = {[LOIP_KDT_F32] = matvec_f32, [LOIP_KDT_BF16] = matvec_bf16,
               [LOIP_KDT_F16] = matvec_f16, [LOIP_KDT_MXFP4] = loip_avx512_matvec_mxfp4,
               [LOIP_KDT_F8_E4M3] = loip_avx512_matvec_f8},
    .matmul = {[LOIP_KDT_F32] = matmul_f32, [LOIP_KDT_BF16] = matmul_bf16,
               [LOIP_KDT_F16] = matmul_f16, [LOIP_KDT_MXFP4] = loip_avx512_matmul_mxfp4,
               [LOIP_KDT_F8_E4M3] = loip_avx512_matmul_f8},
    .dot_f32 = dot_f32,
    .axpy_f32 = axpy_f32,
    .rmsnorm = rmsnorm,
    .dots_f32 = dots_f32,
    .axpys_f32 = axpys_f32,
};

/* CPUID.1:ECX.F16C; asked directly because not every compiler's __builtin_cpu_supports
 * knows "f16c". */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

/* Called on any x86-64 CPU, so it (and has_f16c) must compile to no vector instructions even
 * though this file is built for AVX-512; objdump shows none with gcc 12 -O2. */
EXPORT const loip_kernels *loip_kernels_avx512(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("fma") ||
        !has_f16c())
        return NULL;
    loip_avx512_quant_init();
    return &avx512;
}
