/* Built when CUDA is off (-DLOIP_CUDA=OFF or no nvcc): no device, and every CUDA entry point
 * fails with LOIP_ENOSYS, saying so. */
#include "core/core.h"
#include "loip.h"

static int no_cuda(const char *what) {
    return loip_fail(LOIP_ENOSYS, "%s: loip was built without CUDA (configure with -DLOIP_CUDA=ON and nvcc)", what);
}

LOIP_API int32_t loip_cuda_device_count(void) { return 0; }

LOIP_API int loip_cuda_device_info(int32_t dev, char *name, size_t cap, int32_t *integrated, int32_t *sm_count,
                                   uint64_t *total_bytes, double *bandwidth_Bps) {
    (void)dev, (void)name, (void)cap, (void)integrated, (void)sm_count, (void)total_bytes, (void)bandwidth_Bps;
    return no_cuda("loip_cuda_device_info");
}

LOIP_API int loip_cuda_alloc(uint64_t bytes, int32_t kind, void **host, void **dev) {
    (void)bytes, (void)kind;
    if (host) *host = NULL;
    if (dev) *dev = NULL;
    return no_cuda("loip_cuda_alloc");
}

LOIP_API void loip_cuda_free(void *p, int32_t kind) { (void)p, (void)kind; }

LOIP_API int loip_cuda_register(void *host, uint64_t bytes, void **dev) {
    (void)host, (void)bytes;
    if (dev) *dev = NULL;
    return no_cuda("loip_cuda_register");
}

LOIP_API void loip_cuda_unregister(void *host) { (void)host; }

LOIP_API int loip_cuda_copy(void *dst, const void *src, uint64_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return no_cuda("loip_cuda_copy");
}

LOIP_API int loip_cuda_sync(void) { return no_cuda("loip_cuda_sync"); }

LOIP_API int loip_cuda_matvec(int32_t dtype, float *y, const void *W, const float *x, uint64_t rows, uint64_t cols) {
    (void)dtype, (void)y, (void)W, (void)x, (void)rows, (void)cols;
    return no_cuda("loip_cuda_matvec");
}

LOIP_API int loip_cuda_matmul(int32_t dtype, float *Y, const void *W, const float *X, uint64_t n, uint64_t rows,
                              uint64_t cols) {
    (void)dtype, (void)Y, (void)W, (void)X, (void)n, (void)rows, (void)cols;
    return no_cuda("loip_cuda_matmul");
}

LOIP_API int loip_cuda_rmsnorm(float *o, const float *x, const void *w, int32_t wdtype, uint64_t n_tokens,
                               uint64_t dim, float eps) {
    (void)o, (void)x, (void)w, (void)wdtype, (void)n_tokens, (void)dim, (void)eps;
    return no_cuda("loip_cuda_rmsnorm");
}

LOIP_API int loip_cuda_rope(float *q, int32_t n_tokens, int32_t n_heads, int32_t head_dim, const int32_t *pos,
                            const float *inv_freq, int32_t layout) {
    (void)q, (void)n_tokens, (void)n_heads, (void)head_dim, (void)pos, (void)inv_freq, (void)layout;
    return no_cuda("loip_cuda_rope");
}

LOIP_API int loip_cuda_silu_gate(float *h, const float *u, uint64_t n) {
    (void)h, (void)u, (void)n;
    return no_cuda("loip_cuda_silu_gate");
}

LOIP_API int loip_cuda_add(float *x, const float *y, uint64_t n) {
    (void)x, (void)y, (void)n;
    return no_cuda("loip_cuda_add");
}

LOIP_API int loip_cuda_embed(float *x, const void *table, int32_t dtype, const int32_t *ids, int32_t n, uint64_t dim) {
    (void)x, (void)table, (void)dtype, (void)ids, (void)n, (void)dim;
    return no_cuda("loip_cuda_embed");
}

LOIP_API int loip_cuda_argmax(int32_t *out, const float *logits, int32_t n_rows, int32_t vocab) {
    (void)out, (void)logits, (void)n_rows, (void)vocab;
    return no_cuda("loip_cuda_argmax");
}

LOIP_API int loip_cuda_attention_decode(float *out, const float *q, const float *k_pool, const float *v_pool,
                                        const int32_t *block_table, const int32_t *ctx_len, int32_t n_seqs,
                                        int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t block_tokens,
                                        int32_t max_blocks, float scale, float *scratch, int32_t splits) {
    (void)out, (void)q, (void)k_pool, (void)v_pool, (void)block_table, (void)ctx_len, (void)n_seqs, (void)n_heads;
    (void)n_kv_heads, (void)head_dim, (void)block_tokens, (void)max_blocks, (void)scale, (void)scratch, (void)splits;
    return no_cuda("loip_cuda_attention_decode");
}

LOIP_API int loip_cuda_attention_prefill(float *out, const float *q, const float *k, const float *v, int32_t n,
                                         int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, float scale) {
    (void)out, (void)q, (void)k, (void)v, (void)n, (void)n_heads, (void)n_kv_heads, (void)head_dim, (void)scale;
    return no_cuda("loip_cuda_attention_prefill");
}
