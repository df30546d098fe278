/* The CUDA kernels' entry points (loip.h, loip_cuda_*): the arguments checked, the kernels
 * launched (kernels/cuda/kernels.cu), a failed launch reported with CUDA's message. Built with
 * CUDA only (none.c otherwise). */
#include <cuda_runtime.h>

#include "core/core.h"
#include "cpu/kernels.h"
#include "cuda/kernels.h"

_Static_assert((int)LOIP_F32 == (int)LOIP_KDT_F32 && (int)LOIP_BF16 == (int)LOIP_KDT_BF16 && (int)LOIP_F16 == (int)LOIP_KDT_F16,
               "the kernels' dtypes are loip.h's");

static int launched(int e, const char *what) {
    if (e != cudaSuccess) return loip_fail(LOIP_EIO, "cuda: %s: %s", what, cudaGetErrorString((cudaError_t)e));
    return LOIP_OK;
}

static int dtype_ok(int32_t dtype) { return dtype == LOIP_F32 || dtype == LOIP_BF16 || dtype == LOIP_F16; }

/* The block-quantized weights (kernels/cuda/quant.cu): LOIP_OK, or the error naming what does
 * not fit. */
static int quant_ok(int32_t dtype, uint64_t cols, const char *what) {
    _Static_assert((int)LOIP_MXFP4 == (int)LOIP_KDT_MXFP4 && (int)LOIP_F8_E4M3 == (int)LOIP_KDT_F8_E4M3,
                   "the kernels' block dtypes are loip.h's");
    if (cols > INT64_MAX) return loip_fail(LOIP_EINVAL, "cuda %s: too many columns", what);
    return loip_dtype_check(dtype, 1, (int64_t)cols, what);
}
static int is_quant(int32_t dtype) { return dtype == LOIP_MXFP4 || dtype == LOIP_F8_E4M3; }

LOIP_API int loip_cuda_matvec(int32_t dtype, float *y, const void *W, const float *x, uint64_t rows, uint64_t cols) {
    if (rows == 0 || cols == 0) return LOIP_OK;
    if (is_quant(dtype)) {
        int rc = quant_ok(dtype, cols, "matvec: W");
        if (rc) return rc;
        return launched(loip_cuda_launch_matvec_quant(dtype, y, W, x, rows, cols), "matvec");
    }
    if (!dtype_ok(dtype)) return loip_fail(LOIP_EINVAL, "cuda matvec: dtype %d", dtype);
    return launched(loip_cuda_launch_matvec(dtype, y, W, x, rows, cols), "matvec");
}

LOIP_API int loip_cuda_matmul(int32_t dtype, float *Y, const void *W, const float *X, uint64_t n, uint64_t rows,
                              uint64_t cols) {
    if (n == 0 || rows == 0) return LOIP_OK;
    if (rows > INT32_MAX || n > INT32_MAX || cols > INT32_MAX) return loip_fail(LOIP_EINVAL, "cuda matmul: too large");
    if (is_quant(dtype)) {
        int rc = quant_ok(dtype, cols, "matmul: W");
        if (rc) return rc;
        return launched(loip_cuda_launch_matmul_quant(dtype, Y, W, X, (int)n, (int)rows, (int)cols), "matmul");
    }
    if (!dtype_ok(dtype)) return loip_fail(LOIP_EINVAL, "cuda matmul: dtype %d", dtype);
    return launched(loip_cuda_launch_matmul(dtype, Y, W, X, (int)n, (int)rows, (int)cols), "matmul");
}

LOIP_API int loip_cuda_rmsnorm(float *o, const float *x, const void *w, int32_t wdtype, uint64_t n_tokens,
                               uint64_t dim, float eps) {
    if (n_tokens == 0) return LOIP_OK;
    if (!dtype_ok(wdtype)) return loip_fail(LOIP_EINVAL, "cuda rmsnorm: dtype %d", wdtype);
    return launched(loip_cuda_launch_rmsnorm(o, x, w, wdtype, n_tokens, dim, eps), "rmsnorm");
}

LOIP_API int loip_cuda_rope(float *q, int32_t n_tokens, int32_t n_heads, int32_t head_dim, const int32_t *pos,
                            const float *inv_freq, int32_t layout) {
    size_t total = (size_t)n_tokens * n_heads * (head_dim / 2);
    if (total == 0) return LOIP_OK;
    return launched(loip_cuda_launch_rope(q, n_tokens, n_heads, head_dim, pos, inv_freq,
                                          layout == LOIP_ROPE_INTERLEAVED ? 0 : 1), "rope");
}

LOIP_API int loip_cuda_silu_gate(float *h, const float *u, uint64_t n) {
    if (n == 0) return LOIP_OK;
    return launched(loip_cuda_launch_silu_gate(h, u, n), "silu_gate");
}

LOIP_API int loip_cuda_add(float *x, const float *y, uint64_t n) {
    if (n == 0) return LOIP_OK;
    return launched(loip_cuda_launch_add(x, y, n), "add");
}

LOIP_API int loip_cuda_embed(float *x, const void *table, int32_t dtype, const int32_t *ids, int32_t n,
                             uint64_t dim) {
    if (n <= 0) return LOIP_OK;
    if (!dtype_ok(dtype)) return loip_fail(LOIP_EINVAL, "cuda embed: dtype %d", dtype);
    return launched(loip_cuda_launch_embed(x, table, dtype, ids, n, dim), "embed");
}

LOIP_API int loip_cuda_argmax(int32_t *out, const float *logits, int32_t n_rows, int32_t vocab) {
    if (n_rows <= 0) return LOIP_OK;
    return launched(loip_cuda_launch_argmax(out, logits, n_rows, vocab), "argmax");
}

static int heads_ok(int32_t n_heads, int32_t n_kv_heads, int32_t head_dim) {
    if (head_dim > LOIP_CUDA_MAX_HEAD_DIM)
        return loip_fail(LOIP_EINVAL, "cuda attention: head_dim %d > %d", head_dim, LOIP_CUDA_MAX_HEAD_DIM);
    if (n_kv_heads <= 0 || n_heads % n_kv_heads)
        return loip_fail(LOIP_EINVAL, "cuda attention: %d heads, %d kv heads", n_heads, n_kv_heads);
    return LOIP_OK;
}

LOIP_API int loip_cuda_attention_decode(float *out, const float *q, const float *k_pool, const float *v_pool,
                                        const int32_t *block_table, const int32_t *ctx_len, int32_t n_seqs,
                                        int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t block_tokens,
                                        int32_t max_blocks, float scale, float *scratch, int32_t splits) {
    int rc = heads_ok(n_heads, n_kv_heads, head_dim);
    if (rc) return rc;
    if (splits < 1) splits = 1;
    if (n_seqs <= 0) return LOIP_OK;
    rc = launched(loip_cuda_launch_attention_parts(scratch, q, k_pool, v_pool, block_table, ctx_len, n_seqs, n_heads,
                                                   n_kv_heads, head_dim, block_tokens, max_blocks, scale, splits),
                  "attention (parts)");
    if (rc) return rc;
    return launched(loip_cuda_launch_attention_merge(out, scratch, n_seqs, n_heads, head_dim, splits),
                    "attention (merge)");
}

LOIP_API int loip_cuda_attention_prefill(float *out, const float *q, const float *k, const float *v, int32_t n,
                                         int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, float scale) {
    int rc = heads_ok(n_heads, n_kv_heads, head_dim);
    if (rc) return rc;
    if (n <= 0) return LOIP_OK;
    return launched(loip_cuda_launch_attention_prefill(out, q, k, v, n, n_heads, n_kv_heads, head_dim, scale),
                    "attention (prefill)");
}
