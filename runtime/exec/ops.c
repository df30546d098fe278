/* Single operations on the thread pool: the building blocks the executor uses, exported for
 * tests, benchmarks and experiments. */
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
            k->matmul[j->dtype](j->y, j->rows, j->W, j->x, j->n, b, e, j->cols);
    }
}

void loip_linear_run(loip_pool *pool, loip_linear_job *jobs) {
    loip_pool_run(pool, matvec_task, jobs);
}

static int check_dtype(int32_t dtype) {
    if (dtype != LOIP_F32 && dtype != LOIP_BF16 && dtype != LOIP_F16)
        return loip_fail(LOIP_EINVAL, "matvec: unsupported weight dtype %d", dtype);
    return LOIP_OK;
}

LOIP_API int loip_op_matvec(loip_pool *pool, int32_t dtype, const void *W, const float *x,
                            float *y, int64_t rows, int64_t cols) {
    return loip_op_matmul(pool, dtype, W, x, y, 1, rows, cols);
}

LOIP_API int loip_op_matmul(loip_pool *pool, int32_t dtype, const void *W, const float *X,
                            float *Y, int64_t n, int64_t rows, int64_t cols) {
    int rc = check_dtype(dtype);
    if (rc) return rc;
    if (n <= 0 || rows <= 0 || cols <= 0)
        return loip_fail(LOIP_EINVAL, "matmul: shape must be positive (n=%lld rows=%lld cols=%lld)",
                         (long long)n, (long long)rows, (long long)cols);
    loip_linear_job jobs[2] = {{.W = W, .dtype = dtype, .x = X, .y = Y, .n = (size_t)n,
                                .rows = (size_t)rows, .cols = (size_t)cols}};
    loip_linear_run(pool, jobs);
    return LOIP_OK;
}

typedef struct {
    const uint8_t *buf;
    size_t bytes;
    int reps;
    double sums[1024];
} probe_job;

/* A plain streaming read: each thread sums its contiguous share with the widest loads the
 * compiler vectorises; the result only defeats dead-code elimination. */
static void probe_task(void *p, int ith, int nth) {
    probe_job *j = p;
    size_t b, e;
    loip_split(j->bytes / 64, 1, ith, nth, &b, &e);
    const uint64_t *w = (const uint64_t *)(j->buf + b * 64);
    size_t n = (e - b) * 8;
    uint64_t acc[8] = {0};
    for (int r = 0; r < j->reps; r++)
        for (size_t i = 0; i < n; i += 8)
            for (int k = 0; k < 8; k++) acc[k] += w[i + k];
    uint64_t s = 0;
    for (int k = 0; k < 8; k++) s += acc[k];
    j->sums[ith] = (double)s;
}

LOIP_API int loip_op_read_probe(loip_pool *pool, const void *buf, uint64_t bytes, int32_t reps,
                                double *checksum) {
    if (loip_pool_size(pool) > 1024) return loip_fail(LOIP_EINVAL, "read probe: too many threads");
    if ((uintptr_t)buf % 64) return loip_fail(LOIP_EINVAL, "read probe: buffer not 64-byte aligned");
    static probe_job job; /* large; one probe at a time */
    memset(&job, 0, sizeof job);
    job.buf = buf;
    job.bytes = bytes;
    job.reps = reps;
    loip_pool_run(pool, probe_task, &job);
    double s = 0;
    for (int i = 0; i < loip_pool_size(pool); i++) s += job.sums[i];
    *checksum = s;
    return LOIP_OK;
}
