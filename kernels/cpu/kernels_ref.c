/* Portable C reference of every CPU kernel: the oracle the SIMD variants are tested against,
 * and the variant used on CPUs without one (e.g. aarch64 hosts).
 *
 * Each dot product keeps LANES independent fp32 partial sums (column c goes to lane c % LANES)
 * and adds them pairwise at the end. The fixed lane structure is what compilers can vectorise
 * without -ffast-math (each lane is its own sum), and it keeps the rounding error near that of
 * the SIMD variants instead of growing with the length of one serial chain.
 *
 * Determinism contract: matmul calls matvec once per token, so each of its rows is matvec's
 * result bit for bit. That re-reads W per token; the reference is for correctness, the SIMD
 * variants for speed. */
#include <math.h>
#include <string.h>

#include "cpu/kernels.h"
#include "cpu/quant.h"

#define LANES 8
#define EXPORT __attribute__((visibility("default")))

static float reduce_lanes(float acc[LANES]) {
    /* Pairwise, fixed order: (0+4, 1+5, 2+6, 3+7), then (0+2, 1+3), then (0+1). */
    for (int h = LANES / 2; h > 0; h /= 2)
        for (int j = 0; j < h; j++) acc[j] += acc[j + h];
    return acc[0];
}

static inline float widen_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- one row · x, per weight dtype --------------------------------------------------------- */

static float dot_row_f32(const float *w, const float *x, size_t n) {
    float acc[LANES] = {0};
    size_t c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += w[c + j] * x[c + j];
    for (int j = 0; c + j < n; j++) acc[j] += w[c + j] * x[c + j];
    return reduce_lanes(acc);
}

static float dot_row_bf16(const uint16_t *w, const float *x, size_t n) {
    float acc[LANES] = {0};
    size_t c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += widen_bf16(w[c + j]) * x[c + j];
    for (int j = 0; c + j < n; j++) acc[j] += widen_bf16(w[c + j]) * x[c + j];
    return reduce_lanes(acc);
}

static float dot_row_f16(const uint16_t *w, const float *x, size_t n) {
    float acc[LANES] = {0};
    size_t c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += loip_f16_to_f32(w[c + j]) * x[c + j];
    for (int j = 0; c + j < n; j++) acc[j] += loip_f16_to_f32(w[c + j]) * x[c + j];
    return reduce_lanes(acc);
}

/* ---- matvec / matmul ------------------------------------------------------------------------ */

/* Memory-bound in principle (each weight is used once), but the reference makes no attempt at
 * bandwidth: one row at a time, one scalar (or auto-vectorised) chain per lane. */
static void matvec_f32(float *y, const void *W, const float *x, size_t r0, size_t r1,
                       size_t cols) {
    const float *w = W;
    for (size_t r = r0; r < r1; r++) y[r] = dot_row_f32(w + r * cols, x, cols);
}

static void matvec_bf16(float *y, const void *W, const float *x, size_t r0, size_t r1,
                        size_t cols) {
    const uint16_t *w = W;
    for (size_t r = r0; r < r1; r++) y[r] = dot_row_bf16(w + r * cols, x, cols);
}

static void matvec_f16(float *y, const void *W, const float *x, size_t r0, size_t r1,
                       size_t cols) {
    const uint16_t *w = W;
    for (size_t r = r0; r < r1; r++) y[r] = dot_row_f16(w + r * cols, x, cols);
}

static void matmul_f32(float *Y, size_t ldy, const void *W, const float *X, size_t n, size_t r0,
                       size_t r1, size_t cols) {
    for (size_t t = 0; t < n; t++) matvec_f32(Y + t * ldy, W, X + t * cols, r0, r1, cols);
}

static void matmul_bf16(float *Y, size_t ldy, const void *W, const float *X, size_t n, size_t r0,
                        size_t r1, size_t cols) {
    for (size_t t = 0; t < n; t++) matvec_bf16(Y + t * ldy, W, X + t * cols, r0, r1, cols);
}

static void matmul_f16(float *Y, size_t ldy, const void *W, const float *X, size_t n, size_t r0,
                       size_t r1, size_t cols) {
    for (size_t t = 0; t < n; t++) matvec_f16(Y + t * ldy, W, X + t * cols, r0, r1, cols);
}

/* ---- attention helpers, rmsnorm ----------------------------------------------------------- */

static float dot_f32(const float *a, const float *b, size_t n) { return dot_row_f32(a, b, n); }

static void axpy_f32(float *y, float a, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] += a * x[i];
}

/* Two passes over x: the fp32 sum of squares (lane-split like the dot products), then the
 * scaling. o may be x itself: each element is read before it is written. */
static void rmsnorm(float *o, const float *x, const void *w, int wdt, size_t n, float eps) {
    float ss = n ? dot_row_f32(x, x, n) : 0.0f;
    float inv = 1.0f / sqrtf(ss / (float)(n ? n : 1) + eps);
    for (size_t i = 0; i < n; i++) {
        float wi = wdt == LOIP_KDT_BF16  ? widen_bf16(((const uint16_t *)w)[i])
                   : wdt == LOIP_KDT_F16 ? loip_f16_to_f32(((const uint16_t *)w)[i])
                                         : ((const float *)w)[i];
        o[i] = x[i] * inv * wi;
    }
}

static const loip_kernels ref = {
    .name = "ref",
    .matvec = {[LOIP_KDT_F32] = matvec_f32, [LOIP_KDT_BF16] = matvec_bf16,
               [LOIP_KDT_F16] = matvec_f16, [LOIP_KDT_MXFP4] = loip_ref_matvec_mxfp4,
               [LOIP_KDT_F8_E4M3] = loip_ref_matvec_f8},
    .matmul = {[LOIP_KDT_F32] = matmul_f32, [LOIP_KDT_BF16] = matmul_bf16,
               [LOIP_KDT_F16] = matmul_f16, [LOIP_KDT_MXFP4] = loip_ref_matmul_mxfp4,
               [LOIP_KDT_F8_E4M3] = loip_ref_matmul_f8},
    .dot_f32 = dot_f32,
    .axpy_f32 = axpy_f32,
    .rmsnorm = rmsnorm,
};

EXPORT const loip_kernels *loip_kernels_ref(void) { return &ref; }
