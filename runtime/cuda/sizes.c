/* Sizes of the CUDA kernels' scratch, for planning: built with or without CUDA (a plan for a GPU
 * device can be made on a machine without one). */
#include "loip.h"

/* loip_cuda_attention_decode's scratch: per sequence, head and part, head_dim accumulators and
 * the part's (max, sum) pair. */
LOIP_API uint64_t loip_cuda_attention_scratch(int32_t n_seqs, int32_t n_heads, int32_t head_dim, int32_t splits) {
    if (splits < 1) splits = 1;
    return (uint64_t)n_seqs * n_heads * splits * ((uint64_t)head_dim + 2) * sizeof(float);
}
