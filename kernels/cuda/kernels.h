/* CUDA kernels: the launchers the runtime calls (runtime/cuda/launch.c, which checks the
 * arguments and reports failures; not part of loip.h). Pure compute on device pointers: each
 * launches its kernel on the default stream and returns cudaGetLastError()'s code (0: launched),
 * an int so that C callers need no CUDA header. dtype: LOIP_KDT_* (cpu/kernels.h: f32, bf16,
 * f16; the runtime passes only these); layout: 0 the interleaved rotary pairs (Meta,
 * llama2.c), else the halves (Hugging Face). */
#ifndef LOIP_KERNELS_CUDA_H
#define LOIP_KERNELS_CUDA_H

#include <stddef.h>
#include <stdint.h>

/* attention's head_dim limit (8 values a lane of a warp) */
enum { LOIP_CUDA_MAX_HEAD_DIM = 256 };

#ifdef __cplusplus
extern "C" {
#endif

int loip_cuda_launch_matvec(int32_t dtype, float *y, const void *W, const float *x, uint64_t rows, uint64_t cols);
int loip_cuda_launch_matmul(int32_t dtype, float *Y, const void *W, const float *X, int n, int rows, int cols);
/* (quant.cu) the same for the block-quantized dtypes LOIP_KDT_MXFP4 and LOIP_KDT_F8_E4M3 (W in
 * loip.h's layouts; MXFP4 cols a multiple of 32) */
int loip_cuda_launch_matvec_quant(int32_t dtype, float *y, const void *W, const float *x, uint64_t rows,
                                  uint64_t cols);
int loip_cuda_launch_matmul_quant(int32_t dtype, float *Y, const void *W, const float *X, int n, int rows,
                                  int cols);
int loip_cuda_launch_rmsnorm(float *o, const float *x, const void *w, int32_t wdtype, uint64_t n_tokens, uint64_t dim,
                             float eps);
int loip_cuda_launch_rope(float *q, int32_t n_tokens, int32_t n_heads, int32_t head_dim, const int32_t *pos,
                          const float *inv_freq, int32_t layout);
int loip_cuda_launch_silu_gate(float *h, const float *u, uint64_t n);
int loip_cuda_launch_add(float *x, const float *y, uint64_t n);
int loip_cuda_launch_embed(float *x, const void *table, int32_t dtype, const int32_t *ids, int32_t n, uint64_t dim);
int loip_cuda_launch_argmax(int32_t *out, const float *logits, int32_t n_rows, int32_t vocab);
/* decode attention in two launches: the parts of each sequence's context (flash-decoding's
 * split, into scratch: the parts' accumulators, then their (max, sum) pairs), then their merge */
int loip_cuda_launch_attention_parts(float *scratch, const float *q, const float *k_pool, const float *v_pool,
                                     const int32_t *block_table, const int32_t *ctx_len, int32_t n_seqs,
                                     int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t block_tokens,
                                     int32_t max_blocks, float scale, int32_t splits);
int loip_cuda_launch_attention_merge(float *out, const float *scratch, int32_t n_seqs, int32_t n_heads,
                                     int32_t head_dim, int32_t splits);
int loip_cuda_launch_attention_prefill(float *out, const float *q, const float *k, const float *v, int32_t n,
                                       int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, float scale);

#ifdef __cplusplus
}
#endif

#endif
