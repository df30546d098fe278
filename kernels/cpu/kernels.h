/* CPU kernels: the internal surface the executor calls (not part of loip.h).
 *
 * Every kernel exists as a portable C reference (kernels_ref.c) and, where it is on the hot
 * path, as SIMD variants (kernels_avx2.c, kernels_avx512.c) chosen at run time by
 * loip_kernels_select(). All variants accumulate in fp32. Row-range arguments [r0, r1) let the
 * thread pool split the output rows of one product among threads without any sharing.
 *
 * Determinism contract: for a given variant, matmul's result for token t equals, bit for bit,
 * matvec's result for the same x — prefill and decode then agree exactly. The one exception is a
 * variant that switches method by the number of tokens (amx-auto: AMX from a threshold of rows
 * up, avx512 below): there the contract holds for n below bitwise_below(), and at or above it
 * matmul agrees with matvec within the fp32 dot-product bound (kernels_amx.c). */
#ifndef LOIP_KERNELS_H
#define LOIP_KERNELS_H

#include <stddef.h>
#include <stdint.h>

enum { LOIP_KDT_F32 = 0, LOIP_KDT_BF16 = 1, LOIP_KDT_F16 = 2, LOIP_KDT_COUNT = 3 };
/* The block-quantized weights (loip.h's LOIP_MXFP4 and LOIP_F8_E4M3, same numbers; slot 3 is
 * LOIP_I32, which has no kernel): W is the dtype's packed layout (loip.h), `cols` the matrix's
 * columns (MXFP4: a multiple of 32). See cpu/quant.h. */
enum { LOIP_KDT_MXFP4 = 4, LOIP_KDT_F8_E4M3 = 5, LOIP_KDT_SLOTS = 6 };

/* y[r] = sum_c W[r*cols + c] * x[c] for r in [r0, r1). W holds `rows x cols` elements of
 * the variant's dtype, row-major (nn.Linear's [out, in]). */
typedef void (*loip_matvec_fn)(float *y, const void *W, const float *x,
                               size_t r0, size_t r1, size_t cols);

/* Y[t*ldy + r] = sum_c W[r*cols + c] * X[t*cols + c] for t in [0, n), r in [r0, r1). */
typedef void (*loip_matmul_fn)(float *Y, size_t ldy, const void *W, const float *X, size_t n,
                               size_t r0, size_t r1, size_t cols);

typedef struct loip_kernels {
    const char *name;                      /* "ref", "avx2", "avx512", "avx512bf16" */
    loip_matvec_fn matvec[LOIP_KDT_SLOTS]; /* indexed by LOIP_KDT_* */
    loip_matmul_fn matmul[LOIP_KDT_SLOTS];
    /* dot(a, b) over n floats; the attention score kernel. */
    float (*dot_f32)(const float *a, const float *b, size_t n);
    /* y += a * x over n floats; the attention value accumulation. */
    void (*axpy_f32)(float *y, float a, const float *x, size_t n);
    /* o[i] = x[i] * inv_rms * w[i] with inv_rms = 1/sqrt(mean(x^2) + eps); w of dtype wdt. */
    void (*rmsnorm)(float *o, const float *x, const void *w, int wdt, size_t n, float eps);
    /* NULL: matmul equals matvec bit for bit for every n. Else matmul with n tokens does so
     * for n < bitwise_below() (a run-time setting: loip_kernels_amx_rows). */
    size_t (*bitwise_below)(void);
    /* Optional (NULL: call dot_f32 / axpy_f32 per row). out[i] = dot_f32(q, K + i*ldk, n) for
     * i < m; and y += w[i] * (V + i*ldv) for i = 0..m-1 in order: bit for bit those calls. */
    void (*dots_f32)(float *out, const float *q, const float *K, size_t ldk, size_t m, size_t n);
    void (*axpys_f32)(float *y, const float *w, const float *V, size_t ldv, size_t m, size_t n);
} loip_kernels;

/* The portable reference, always available. */
const loip_kernels *loip_kernels_ref(void);
/* NULL when the CPU (or the compiler) lacks the instructions. */
const loip_kernels *loip_kernels_avx2(void);
const loip_kernels *loip_kernels_avx512(void);
/* avx512 with the BF16 products on AMX tiles (kernels_amx.c); NULL without AMX-BF16, without
 * the OS's tile permission, or when the compiler lacked AMX (then it is not built at all). */
const loip_kernels *loip_kernels_amx(void);
/* avx512 for matvec and for matmul of fewer than loip_kernels_amx_rows() tokens, amx's
 * matmul from that many up ("amx-auto"; NULL where amx is NULL). The best variant where it exists. */
const loip_kernels *loip_kernels_amx_auto(void);
/* amx-auto's threshold of tokens (activation rows) from which a BF16 matmul runs on AMX tiles:
 * rows > 0 sets it, 0 leaves it; returns the value in force. Default LOIP_AMX_ROWS_DEFAULT. */
size_t loip_kernels_amx_rows(size_t rows);
/* The AMX matmul's register block, 2 token tiles x 2 row tiles (kernels_amx.c): below 32 tokens
 * it runs one token tile, each packed weight tile feeding one product instead of two, and the
 * packing (weights read and transposed once per call) is shared by fewer tokens. A starting
 * point from the kernel's shape, not a measurement: recipes/bench/prefill.lua measures the
 * crossover on the machine at hand (--amx-rows measured; LOIP_AMX_ROWS sets it). */
#define LOIP_AMX_ROWS_DEFAULT 32
/* Best available for this CPU (amx-auto where AMX is, never all-amx: only when named), or the one named (ref, avx2, avx512, amx, amx-auto) when name != NULL;
 * NULL when that one is unavailable. Environment variable LOIP_KERNELS overrides at startup. */
const loip_kernels *loip_kernels_select(const char *name);

/* The SIMD matmuls' row sweep: how many weight rows of row_bytes each (within [min, max], then
 * down to a multiple of `tile` rows) stay in this core's L2 while every token passes over them.
 * Half the L2 the CPU reports (sysconf), read once: the rest holds the tokens' x blocks and the
 * paused accumulators. More rows per sweep means fewer passes of the tokens' x through the cache
 * (each x block is re-read once per sweep); with the old fixed 32 rows, 512 tokens of a
 * 2048-column layer were re-read 64 times per call. Only the grouping changes, never the order
 * of a dot product's FMAs: the bits stay matvec's. */
size_t loip_kernels_sweep_rows(size_t row_bytes, size_t tile, size_t min, size_t max);

/* Element conversions shared by all variants (exact: bf16/f16 -> f32 is lossless). */
float loip_bf16_to_f32(uint16_t h);
uint16_t loip_f32_to_bf16(float f); /* round to nearest even; NaN stays NaN */
float loip_f16_to_f32(uint16_t h);
uint16_t loip_f32_to_f16(float f);  /* round to nearest even */

#endif
