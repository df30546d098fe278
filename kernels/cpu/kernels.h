/* CPU kernels: the internal surface the executor calls (not part of loip.h).
 *
 * Every kernel exists as a portable C reference (kernels_ref.c) and, where it is on the hot
 * path, as SIMD variants (kernels_avx2.c, kernels_avx512.c) chosen at run time by
 * loip_kernels_select(). All variants accumulate in fp32. Row-range arguments [r0, r1) let the
 * thread pool split the output rows of one product among threads without any sharing.
 *
 * Determinism contract: for a given variant, matmul's result for token t equals, bit for bit,
 * matvec's result for the same x — prefill and decode then agree exactly. */
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
} loip_kernels;

/* The portable reference, always available. */
const loip_kernels *loip_kernels_ref(void);
/* NULL when the CPU (or the compiler) lacks the instructions. */
const loip_kernels *loip_kernels_avx2(void);
const loip_kernels *loip_kernels_avx512(void);
/* avx512 with the BF16 products on AMX tiles (kernels_amx.c); NULL without AMX-BF16, without
 * the OS's tile permission, or when the compiler lacked AMX (then it is not built at all). */
const loip_kernels *loip_kernels_amx(void);
/* Best available for this CPU (never amx: only when named), or the one named (ref, avx2, avx512, amx) when name != NULL;
 * NULL when that one is unavailable. Environment variable LOIP_KERNELS overrides at startup. */
const loip_kernels *loip_kernels_select(const char *name);

/* Element conversions shared by all variants (exact: bf16/f16 -> f32 is lossless). */
float loip_bf16_to_f32(uint16_t h);
uint16_t loip_f32_to_bf16(float f); /* round to nearest even; NaN stays NaN */
float loip_f16_to_f32(uint16_t h);
uint16_t loip_f32_to_f16(float f);  /* round to nearest even */

#endif
