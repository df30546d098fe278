/* Single operations on the thread pool: the building blocks the executor uses, exported for
 * tests, benchmarks and experiments. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "core/core.h"
#include "core/pool.h"
#include "core/runtime.h"
#include "exec/ops.h"

static void matvec_task(void *p, int ith, int nth) {
    loip_linear_job *jobs = p;
    const loip_kernels *k = loip_kernels_current();
    for (loip_linear_job *j = jobs; j->W; j++) {
        size_t b, e;
        loip_split(j->rows, 16, ith, nth, &b, &e);
        if (b >= e) continue;
        if (j->n == 1)
            k->matvec[j->dtype](j->y, j->W, j->x, b, e, j->cols);
        else
            k->matmul[j->dtype](j->y, j->ldy ? j->ldy : j->rows, j->W, j->x, j->n, b, e, j->cols);
    }
}

static _Atomic uint64_t phase_ns[LOIP_PHASE_COUNT];

void loip_phase_add(int phase, uint64_t ns) { phase_ns[phase] += ns; }

LOIP_API void loip_phase_ns(uint64_t out[2]) {
    for (int i = 0; i < LOIP_PHASE_COUNT; i++) out[i] = phase_ns[i];
}

void loip_linear_run(loip_pool *pool, loip_linear_job *jobs) {
    uint64_t t0 = loip_now_ns();
    loip_pool_run(pool, matvec_task, jobs);
    loip_phase_add(LOIP_PHASE_LINEAR, loip_now_ns() - t0);
}

typedef struct {
    float *h;
    const float *h2;
    const int32_t *start, *count;
    int n_ranges, width, act;
    int glu;
    float alpha, limit;
} swiglu_job;

static void swiglu_task(void *p, int ith, int nth) {
    swiglu_job *j = p;
    for (int r = 0; r < j->n_ranges; r++) {
        size_t total = (size_t)j->count[r] * j->width, b, e;
        loip_split(total, 16, ith, nth, &b, &e);
        float *h = j->h + (size_t)j->start[r] * j->width;
        const float *h2 = j->h2 + (size_t)j->start[r] * j->width;
        if (j->glu == LOIP_GLU_OAI_CLAMPED) { /* as ggml's swiglu_oai computes it */
            for (size_t i = b; i < e; i++) {
                float g = h[i] < j->limit ? h[i] : j->limit;
                float u = h2[i] < -j->limit ? -j->limit : h2[i] > j->limit ? j->limit : h2[i];
                h[i] = g / (1.0f + expf(j->alpha * -g)) * (u + 1.0f);
            }
            continue;
        }
        if (j->act == LOIP_ACT_GELU_TANH) {
            /* PyTorch's gelu(approximate="tanh") in fp32 */
            const float k0 = 0.7978845608028654f, k1 = 0.044715f;
            for (size_t i = b; i < e; i++) {
                float v = h[i];
                v = 0.5f * v * (1.0f + tanhf(k0 * (v + k1 * v * v * v)));
                h[i] = v * h2[i];
            }
            continue;
        }
        for (size_t i = b; i < e; i++) {
            float v = h[i];
            v *= 1.0f / (1.0f + expf(-v));
            h[i] = v * h2[i];
        }
    }
}

void loip_swiglu_run(loip_pool *pool, float *h, const float *h2, const int32_t *start, const int32_t *count,
                     int n_ranges, int width) {
    loip_gate_run(pool, LOIP_ACT_SILU, h, h2, start, count, n_ranges, width);
}

void loip_gate_run(loip_pool *pool, int act, float *h, const float *h2, const int32_t *start, const int32_t *count,
                   int n_ranges, int width) {
    swiglu_job j = {h, h2, start, count, n_ranges, width, act, LOIP_GLU_SILU, 0.0f, 0.0f};
    loip_pool_run(pool, swiglu_task, &j);
}

void loip_glu_run(loip_pool *pool, const loip_model_config *c, float *h, const float *h2, const int32_t *start,
                  const int32_t *count, int n_ranges, int width) {
    swiglu_job j = {h, h2, start, count, n_ranges, width, LOIP_ACT_SILU, c->glu, c->glu_alpha, c->glu_limit};
    loip_pool_run(pool, swiglu_task, &j);
}

static int check_dtype(int32_t dtype) {
    if (dtype != LOIP_F32 && dtype != LOIP_BF16 && dtype != LOIP_F16 && dtype != LOIP_MXFP4 &&
        dtype != LOIP_F8_E4M3)
        return loip_fail(LOIP_EINVAL, "matvec: unsupported weight dtype %d", dtype);
    return LOIP_OK;
}

/* Y[n, rows] = X[n, cols] . W[rows, cols]^T. */
static int op_matmul(loip_pool *pool, int32_t dtype, const void *W, const float *X, float *Y, int64_t n,
                     int64_t rows, int64_t cols) {
    int rc = check_dtype(dtype);
    if (rc) return rc;
    if (n <= 0 || rows <= 0 || cols <= 0)
        return loip_fail(LOIP_EINVAL, "matmul: shape must be positive (n=%lld rows=%lld cols=%lld)",
                         (long long)n, (long long)rows, (long long)cols);
    if ((rc = loip_dtype_check(dtype, rows, cols, "matvec: W"))) return rc;
    loip_linear_job jobs[2] = {{.W = W, .dtype = dtype, .x = X, .y = Y, .n = (size_t)n,
                                .rows = (size_t)rows, .cols = (size_t)cols}};
    loip_linear_run(pool, jobs);
    return LOIP_OK;
}

LOIP_API int loip_op_matmul(loip_pool *pool, int32_t dtype, const void *W, const float *X,
                            float *Y, int64_t n, int64_t rows, int64_t cols) {
    return op_matmul(pool, dtype, W, X, Y, n, rows, cols);
}

LOIP_API int loip_op_matvec(loip_pool *pool, int32_t dtype, const void *W, const float *x,
                            float *y, int64_t rows, int64_t cols) {
    return op_matmul(pool, dtype, W, x, y, 1, rows, cols);
}

typedef struct {
    const uint8_t *buf;
    size_t bytes;
    int reps;
    double sums[1024];
} probe_job;

/* The streaming read probe: each thread sums its contiguous share with the widest loads the
 * CPU has (eight independent accumulators, so that loads, not adds, set the pace). The sum
 * only defeats dead-code elimination. */
#if defined(__x86_64__)
#include <immintrin.h>
/* Eight streams at once, each prefetched 1 KiB ahead: the access pattern of the matvec
 * kernels (several weight rows in flight), and the fastest single-core read measured here. */
__attribute__((target("avx512f"))) static double read_avx512(const uint8_t *p, size_t n, int reps) {
    __m512i a[8];
    for (int k = 0; k < 8; k++) a[k] = _mm512_setzero_si512();
    size_t per = n / 8 / 128 * 128; /* bytes per stream, whole 128-byte steps */
    for (int r = 0; r < reps; r++) {
        for (size_t off = 0; off < per; off += 128)
            for (int k = 0; k < 8; k++) {
                const uint8_t *q = p + (size_t)k * per + off;
                _mm_prefetch((const char *)q + 1024, _MM_HINT_T0);
                _mm_prefetch((const char *)q + 1088, _MM_HINT_T0);
                a[k] = _mm512_xor_si512(a[k], _mm512_load_si512((const void *)q));
                a[k] = _mm512_xor_si512(a[k], _mm512_load_si512((const void *)(q + 64)));
            }
        for (size_t i = 8 * per; i + 64 <= n; i += 64) /* the remainder */
            a[0] = _mm512_xor_si512(a[0], _mm512_load_si512((const void *)(p + i)));
    }
    for (int k = 1; k < 8; k++) a[0] = _mm512_xor_si512(a[0], a[k]); /* (xor: no overflow) */
    return (double)_mm512_reduce_or_epi64(a[0]);
}
__attribute__((target("avx2"))) static double read_avx2(const uint8_t *p, size_t n, int reps) {
    __m256i a[8];
    for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_si256();
    for (int r = 0; r < reps; r++)
        for (size_t i = 0; i + 256 <= n; i += 256)
            for (int k = 0; k < 8; k++)
                a[k] = _mm256_add_epi64(a[k], _mm256_load_si256((const __m256i *)(p + i + 32 * k)));
    for (int k = 1; k < 8; k++) a[0] = _mm256_add_epi64(a[0], a[k]);
    int64_t v[4];
    _mm256_storeu_si256((__m256i *)v, a[0]);
    return (double)(v[0] + v[1] + v[2] + v[3]);
}
#endif

static double read_plain(const uint8_t *p, size_t n, int reps) {
    const uint64_t *w = (const uint64_t *)p;
    uint64_t acc[8] = {0};
    for (int r = 0; r < reps; r++)
        for (size_t i = 0; i + 8 <= n / 8; i += 8)
            for (int k = 0; k < 8; k++) acc[k] += w[i + k];
    uint64_t s = 0;
    for (int k = 0; k < 8; k++) s += acc[k];
    return (double)s;
}

static void probe_task(void *p, int ith, int nth) {
    probe_job *j = p;
    size_t b, e;
    loip_split(j->bytes / 512, 1, ith, nth, &b, &e);
    const uint8_t *start = j->buf + b * 512;
    size_t n = (e - b) * 512;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f")) { j->sums[ith] = read_avx512(start, n, j->reps); return; }
    if (__builtin_cpu_supports("avx2")) { j->sums[ith] = read_avx2(start, n, j->reps); return; }
#endif
    j->sums[ith] = read_plain(start, n, j->reps);
}

LOIP_API int loip_op_read_probe(loip_pool *pool, const void *buf, uint64_t bytes, int32_t reps,
                                double *checksum) {
    if (loip_pool_size(pool) > 1024) return loip_fail(LOIP_EINVAL, "read probe: too many threads");
    if ((uintptr_t)buf % 64) return loip_fail(LOIP_EINVAL, "read probe: buffer not 64-byte aligned");
    probe_job job = {.buf = buf, .bytes = bytes, .reps = reps};
    loip_pool_run(pool, probe_task, &job);
    double s = 0;
    for (int i = 0; i < loip_pool_size(pool); i++) s += job.sums[i];
    *checksum = s;
    return LOIP_OK;
}

/* ---- the FMA roof ------------------------------------------------------------------------ */

typedef struct {
    int64_t iters;
    double flops[1024];
    float sink[1024];
} fma_job;

/* FMA_CHAINS independent accumulators: enough to cover the FMA latency on every port (4 cycles
 * x 2 ports needs 8; 16 leaves room on any current core). Multiplier and addend are chosen so
 * that the values stay finite and normal for any iteration count. */
#define FMA_CHAINS 16
#if defined(__x86_64__)
__attribute__((target("avx512f"))) static float fma_avx512(int64_t iters) {
    __m512 a[FMA_CHAINS], m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
#pragma GCC unroll 16
    for (int k = 0; k < FMA_CHAINS; k++) a[k] = _mm512_set1_ps((float)k);
    for (int64_t i = 0; i < iters; i++)
#pragma GCC unroll 16
        for (int k = 0; k < FMA_CHAINS; k++) a[k] = _mm512_fmadd_ps(a[k], m, c);
#pragma GCC unroll 16
    for (int k = 1; k < FMA_CHAINS; k++) a[0] = _mm512_add_ps(a[0], a[k]);
    return _mm512_reduce_add_ps(a[0]);
}
__attribute__((target("avx2,fma"))) static float fma_avx2(int64_t iters) {
    __m256 a[FMA_CHAINS], m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
#pragma GCC unroll 16
    for (int k = 0; k < FMA_CHAINS; k++) a[k] = _mm256_set1_ps((float)k);
    for (int64_t i = 0; i < iters; i++)
#pragma GCC unroll 16
        for (int k = 0; k < FMA_CHAINS; k++) a[k] = _mm256_fmadd_ps(a[k], m, c);
#pragma GCC unroll 16
    for (int k = 1; k < FMA_CHAINS; k++) a[0] = _mm256_add_ps(a[0], a[k]);
    float v[8];
    _mm256_storeu_ps(v, a[0]);
    return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
}
#endif
static float fma_plain(int64_t iters) {
    float a[FMA_CHAINS];
    for (int k = 0; k < FMA_CHAINS; k++) a[k] = (float)k;
    for (int64_t i = 0; i < iters; i++)
#pragma GCC unroll 16
        for (int k = 0; k < FMA_CHAINS; k++) a[k] = fmaf(a[k], 0.999999f, 1e-6f);
    float s = 0;
    for (int k = 0; k < FMA_CHAINS; k++) s += a[k];
    return s;
}

static void fma_task(void *p, int ith, int nth) {
    (void)nth;
    fma_job *j = p;
    double per = 2.0 * FMA_CHAINS * (double)j->iters;
#if defined(__x86_64__)
    /* avx2's kernels are measured against 256-bit FMAs even where the CPU has 512-bit ones */
    int avx2_kernels = !strcmp(loip_kernels_current()->name, "avx2");
    if (!avx2_kernels && __builtin_cpu_supports("avx512f")) {
        j->sink[ith] = fma_avx512(j->iters), j->flops[ith] = 16 * per;
        return;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        j->sink[ith] = fma_avx2(j->iters), j->flops[ith] = 8 * per;
        return;
    }
#endif
    j->sink[ith] = fma_plain(j->iters), j->flops[ith] = per;
}

LOIP_API int loip_op_fma_probe(loip_pool *pool, int64_t iters, double *flops) {
    if (loip_pool_size(pool) > 1024) return loip_fail(LOIP_EINVAL, "fma probe: too many threads");
    if (iters <= 0) return loip_fail(LOIP_EINVAL, "fma probe: iters must be positive (got %lld)", (long long)iters);
    fma_job job = {.iters = iters};
    loip_pool_run(pool, fma_task, &job);
    double s = 0;
    for (int i = 0; i < loip_pool_size(pool); i++) s += job.flops[i];
    *flops = s;
    return LOIP_OK;
}
