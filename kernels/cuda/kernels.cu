// CUDA kernels of the decoder: the same operations as kernels/cpu and runtime/exec/forward.c,
// on device pointers (device memory, or host memory mapped into the device: a resident block on
// an integrated GPU, the loader's slot). Every kernel accumulates in fp32. Kernels at the top,
// launchers (cuda/kernels.h; runtime/cuda/launch.c checks their arguments and makes them
// loip.h's entry points) at the bottom.
//
//   matvec      one warp per output row, 16-byte loads, a shuffle reduction: the decode path,
//               bound by memory bandwidth (tests/gpu/run.sh measures the fraction reached)
//   matmul      64 x 64 tiles in shared memory, 16-bit weights widened as they are staged, fp32
//               sums in column order (prefill: many tokens). Not cuBLAS: linking it would cost
//               every loip process (a worker on a 8 GB board) over 100 MB of resident memory
//   rmsnorm     one block per token
//   rope        one thread per (token, head, pair), either layout; angles pos * inv_freq[i]
//   silu_gate, add, embed (a row gather, widened to fp32), argmax (one block per row)
//   attention   decode: one token per sequence over its paged KV cache, the context split in
//               parts whose softmax statistics are merged after (flash-decoding); prefill: one
//               prompt, causal, its own contiguous K/V
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

#include "cpu/kernels.h"
#include "cuda/kernels.h"

#define WARP 32
static_assert(LOIP_CUDA_MAX_HEAD_DIM == 8 * WARP, "attention keeps 8 values of a head a lane");

// ---- kernels --------------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = WARP / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float load_w(const float *w, size_t i) { return w[i]; }
__device__ __forceinline__ float load_w(const __nv_bfloat16 *w, size_t i) { return __bfloat162float(w[i]); }
__device__ __forceinline__ float load_w(const __half *w, size_t i) { return __half2float(w[i]); }

// The 8 weights of a 16-byte word of 16-bit weights, as floats.
__device__ __forceinline__ void widen8(const uint4 &u, const __nv_bfloat16 *, float *f) {
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
    for (int k = 0; k < 4; k++) {
        float2 v = __bfloat1622float2(h[k]);
        f[2 * k] = v.x, f[2 * k + 1] = v.y;
    }
}
__device__ __forceinline__ void widen8(const uint4 &u, const __half *, float *f) {
    const __half2 *h = reinterpret_cast<const __half2 *>(&u);
    for (int k = 0; k < 4; k++) {
        float2 v = __half22float2(h[k]);
        f[2 * k] = v.x, f[2 * k + 1] = v.y;
    }
}

// y[r] = W[r, :] . x for the rows of this warp. Vector loads where the row is 16-byte aligned
// (cols a multiple of 16 bytes' worth and W aligned), element loads otherwise.
template <typename T>
__global__ void matvec_rows(float *__restrict__ y, const T *__restrict__ W, const float *__restrict__ x,
                            size_t rows, size_t cols, int vec) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= rows) return;
    const T *w = W + row * cols;
    float s = 0.f;
    const int per = 16 / (int)sizeof(T); // elements per 16-byte word
    if (vec) {
        const uint4 *w4 = reinterpret_cast<const uint4 *>(w);
        size_t words = cols / per;
#pragma unroll 4
        for (size_t i = lane; i < words; i += WARP) {
            uint4 u = __ldg(w4 + i);
            const float *xs = x + i * per;
            if constexpr (sizeof(T) == 4) {
                const float *f = reinterpret_cast<const float *>(&u);
                s += f[0] * xs[0] + f[1] * xs[1] + f[2] * xs[2] + f[3] * xs[3];
            } else {
                float f[8];
                widen8(u, w, f);
                for (int k = 0; k < 8; k++) s += f[k] * xs[k];
            }
        }
    } else {
        for (size_t c = lane; c < cols; c += WARP) s += load_w(w, c) * x[c];
    }
    s = warp_sum(s);
    if (lane == 0) y[row] = s;
}

template <typename T>
__global__ void rmsnorm_rows(float *o, const float *x, const T *w, size_t dim, float eps) {
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *orow = o + (size_t)blockIdx.x * dim;
    __shared__ float part[32];
    float ss = 0.f;
    for (size_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = warp_sum(ss);
    if (threadIdx.x % WARP == 0) part[threadIdx.x / WARP] = ss;
    __syncthreads();
    if (threadIdx.x < WARP) {
        float v = threadIdx.x < blockDim.x / WARP ? part[threadIdx.x] : 0.f;
        v = warp_sum(v);
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    float inv = rsqrtf(part[0] / (float)dim + eps);
    for (size_t i = threadIdx.x; i < dim; i += blockDim.x) orow[i] = xr[i] * inv * load_w(w, i);
}

// q is [n_tokens][n_heads][head_dim]; pair i of a head is (2i, 2i+1) interleaved, (i, i+hd/2) half.
__global__ void rope_pairs(float *q, int n_tokens, int n_heads, int head_dim, const int32_t *pos,
                           const float *inv_freq, int layout) {
    int half = head_dim / 2;
    size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t total = (size_t)n_tokens * n_heads * half;
    if (id >= total) return;
    int i = (int)(id % half);
    size_t th = id / half; // token * n_heads + head
    int t = (int)(th / n_heads);
    float *h = q + th * head_dim;
    float a = (float)pos[t] * inv_freq[i];
    float c, s;
    sincosf(a, &s, &c);
    int j0 = layout == 0 ? 2 * i : i; // (0: LOIP_ROPE_INTERLEAVED)
    int j1 = layout == 0 ? 2 * i + 1 : i + half;
    float x0 = h[j0], x1 = h[j1];
    h[j0] = x0 * c - x1 * s;
    h[j1] = x0 * s + x1 * c;
}

__global__ void silu_gate_k(float *h, const float *u, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float g = h[i];
        h[i] = g / (1.f + expf(-g)) * u[i];
    }
}

__global__ void add_k(float *x, const float *y, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

template <typename T>
__global__ void embed_rows(float *x, const T *table, const int32_t *ids, size_t dim) {
    const T *row = table + (size_t)ids[blockIdx.x] * dim;
    float *out = x + (size_t)blockIdx.x * dim;
    for (size_t i = threadIdx.x; i < dim; i += blockDim.x) out[i] = load_w(row, i);
}

// The first index of the largest value of each row (NaN never wins), one block per row.
__global__ void argmax_rows(int32_t *out, const float *logits, int vocab) {
    const float *r = logits + (size_t)blockIdx.x * vocab;
    float best = -FLT_MAX;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = r[i];
        if (v > best || (v == best && i < idx)) best = v, idx = i;
    }
    __shared__ float bv[1024];
    __shared__ int bi[1024];
    bv[threadIdx.x] = best, bi[threadIdx.x] = idx;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) {
            float v = bv[threadIdx.x + s];
            int j = bi[threadIdx.x + s];
            if (v > bv[threadIdx.x] || (v == bv[threadIdx.x] && j < bi[threadIdx.x])) bv[threadIdx.x] = v, bi[threadIdx.x] = j;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = bi[0] == 0x7fffffff ? 0 : bi[0];
}

// Decode attention, pass 1: block (split, head, seq) scores its share of the sequence's
// positions against q, keeping the running max m, the sum l of exp(score - m) and the
// exp-weighted sum of V rows. K/V rows of position p live in pool group
// block_table[seq * max_blocks + p / block_tokens], row p % block_tokens; a group is
// block_tokens x kv_dim floats. One warp per block; the head's dims over its lanes.
__global__ void attn_decode_part(float *part_acc, float *part_ml, const float *q, const float *k_pool,
                                 const float *v_pool, const int32_t *block_table, const int32_t *ctx_len,
                                 int n_heads, int n_kv_heads, int head_dim, int block_tokens, int max_blocks,
                                 float scale, int splits) {
    int split = blockIdx.x, head = blockIdx.y, seq = blockIdx.z, lane = threadIdx.x;
    int n = ctx_len[seq];
    int per = (n + splits - 1) / splits;
    int p0 = split * per, p1 = min(n, p0 + per);
    int kvh = head / (n_heads / n_kv_heads);
    size_t kv_dim = (size_t)n_kv_heads * head_dim;
    const float *qh = q + ((size_t)seq * n_heads + head) * head_dim;
    float m = -FLT_MAX, l = 0.f;
    float acc[8]; // head_dim <= 256: lane holds dims lane, lane + 32, ...
    for (int k = 0; k < 8; k++) acc[k] = 0.f;
    for (int p = p0; p < p1; p++) {
        size_t g = (size_t)block_table[(size_t)seq * max_blocks + p / block_tokens];
        size_t row = (g * block_tokens + p % block_tokens) * kv_dim + (size_t)kvh * head_dim;
        float s = 0.f;
        for (int d = lane; d < head_dim; d += WARP) s += qh[d] * k_pool[row + d];
        s = warp_sum(s) * scale;
        float m2 = fmaxf(m, s);
        float a = expf(m - m2), b = expf(s - m2);
        l = l * a + b;
        for (int k = 0, d = lane; d < head_dim; k++, d += WARP) acc[k] = acc[k] * a + b * v_pool[row + d];
        m = m2;
    }
    size_t at = (((size_t)seq * n_heads + head) * splits + split);
    for (int k = 0, d = lane; d < head_dim; k++, d += WARP) part_acc[at * head_dim + d] = acc[k];
    if (lane == 0) part_ml[2 * at] = m, part_ml[2 * at + 1] = l;
}

// Pass 2: merge the parts of (head, seq): out = sum_j e^(m_j - M) acc_j / sum_j e^(m_j - M) l_j.
__global__ void attn_decode_merge(float *out, const float *part_acc, const float *part_ml, int n_heads,
                                  int head_dim, int splits) {
    int head = blockIdx.x, seq = blockIdx.y;
    size_t base = ((size_t)seq * n_heads + head) * splits;
    float M = -FLT_MAX;
    for (int j = 0; j < splits; j++)
        if (part_ml[2 * (base + j) + 1] > 0.f) M = fmaxf(M, part_ml[2 * (base + j)]);
    float L = 0.f;
    for (int j = 0; j < splits; j++) {
        float l = part_ml[2 * (base + j) + 1];
        if (l > 0.f) L += expf(part_ml[2 * (base + j)] - M) * l;
    }
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float s = 0.f;
        for (int j = 0; j < splits; j++) {
            float l = part_ml[2 * (base + j) + 1];
            if (l > 0.f) s += expf(part_ml[2 * (base + j)] - M) * part_acc[(base + j) * head_dim + d];
        }
        out[((size_t)seq * n_heads + head) * head_dim + d] = s / L;
    }
}

// Prefill attention of one prompt: token t (block x), head h (block y) over positions 0..t of
// its own K/V ([n][kv_dim], contiguous); one warp per block, two passes (max, then sums).
__global__ void attn_prefill_k(float *out, const float *q, const float *k, const float *v, int n_heads,
                               int n_kv_heads, int head_dim, float scale) {
    int t = blockIdx.x, head = blockIdx.y, lane = threadIdx.x;
    int kvh = head / (n_heads / n_kv_heads);
    size_t kv_dim = (size_t)n_kv_heads * head_dim;
    const float *qh = q + ((size_t)t * n_heads + head) * head_dim;
    float m = -FLT_MAX, l = 0.f;
    float acc[8];
    for (int j = 0; j < 8; j++) acc[j] = 0.f;
    for (int p = 0; p <= t; p++) {
        const float *kr = k + (size_t)p * kv_dim + (size_t)kvh * head_dim;
        const float *vr = v + (size_t)p * kv_dim + (size_t)kvh * head_dim;
        float s = 0.f;
        for (int d = lane; d < head_dim; d += WARP) s += qh[d] * kr[d];
        s = warp_sum(s) * scale;
        float m2 = fmaxf(m, s);
        float a = expf(m - m2), b = expf(s - m2);
        l = l * a + b;
        for (int j = 0, d = lane; d < head_dim; j++, d += WARP) acc[j] = acc[j] * a + b * vr[d];
        m = m2;
    }
    float *o = out + ((size_t)t * n_heads + head) * head_dim;
    for (int j = 0, d = lane; d < head_dim; j++, d += WARP) o[d] = acc[j] / l;
}

// Y[t][r] = W[r, :] . X[t, :]: a block computes a tile of MM_TILE rows x MM_TILE tokens, each
// thread 4 x 4 of them, over slices of MM_K columns staged in shared memory (weights widened to
// fp32 as they are staged: exact). Every output sums its columns in order, in fp32.
#define MM_TILE 64
#define MM_K 16
template <typename T>
__global__ void matmul_tiles(float *Y, const T *W, const float *X, int n, int rows, int cols) {
    __shared__ float ws[MM_K][MM_TILE + 1], xs[MM_K][MM_TILE + 1];
    int tx = threadIdx.x, ty = threadIdx.y, tid = ty * (MM_TILE / 4) + tx;
    int r0 = blockIdx.x * MM_TILE, t0 = blockIdx.y * MM_TILE;
    float acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = 0.f;
    for (int k0 = 0; k0 < cols; k0 += MM_K) {
        for (int e = tid; e < MM_TILE * MM_K; e += (MM_TILE / 4) * (MM_TILE / 4)) {
            int a = e / MM_K, k = e % MM_K, c = k0 + k;
            int r = r0 + a, t = t0 + a;
            ws[k][a] = r < rows && c < cols ? load_w(W, (size_t)r * cols + c) : 0.f;
            xs[k][a] = t < n && c < cols ? X[(size_t)t * cols + c] : 0.f;
        }
        __syncthreads();
        for (int k = 0; k < MM_K; k++) {
            float wv[4], xv[4];
            for (int i = 0; i < 4; i++) wv[i] = ws[k][tx * 4 + i], xv[i] = xs[k][ty * 4 + i];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] += wv[i] * xv[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            int r = r0 + tx * 4 + i, t = t0 + ty * 4 + j;
            if (r < rows && t < n) Y[(size_t)t * rows + r] = acc[i][j];
        }
}

// ---- launchers ------------------------------------------------------------------------------

static unsigned blocks_for(size_t n, unsigned per) { return (unsigned)((n + per - 1) / per); }

extern "C" int loip_cuda_launch_matvec(int32_t dtype, float *y, const void *W, const float *x, uint64_t rows,
                                       uint64_t cols) {
    const unsigned threads = 256, rows_per_block = threads / WARP;
    size_t es = dtype == LOIP_KDT_F32 ? 4 : 2;
    int vec = ((uintptr_t)W % 16 == 0) && ((cols * es) % 16 == 0);
    unsigned grid = blocks_for(rows, rows_per_block);
    switch (dtype) {
    case LOIP_KDT_F32: matvec_rows<<<grid, threads>>>(y, (const float *)W, x, rows, cols, vec); break;
    case LOIP_KDT_BF16: matvec_rows<<<grid, threads>>>(y, (const __nv_bfloat16 *)W, x, rows, cols, vec); break;
    case LOIP_KDT_F16: matvec_rows<<<grid, threads>>>(y, (const __half *)W, x, rows, cols, vec); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}

extern "C" int loip_cuda_launch_matmul(int32_t dtype, float *Y, const void *W, const float *X, int n, int rows,
                                       int cols) {
    dim3 grid(blocks_for(rows, MM_TILE), blocks_for(n, MM_TILE)), block(MM_TILE / 4, MM_TILE / 4);
    switch (dtype) {
    case LOIP_KDT_F32: matmul_tiles<<<grid, block>>>(Y, (const float *)W, X, n, rows, cols); break;
    case LOIP_KDT_BF16: matmul_tiles<<<grid, block>>>(Y, (const __nv_bfloat16 *)W, X, n, rows, cols); break;
    case LOIP_KDT_F16: matmul_tiles<<<grid, block>>>(Y, (const __half *)W, X, n, rows, cols); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}

extern "C" int loip_cuda_launch_rmsnorm(float *o, const float *x, const void *w, int32_t wdtype, uint64_t n_tokens,
                                        uint64_t dim, float eps) {
    switch (wdtype) {
    case LOIP_KDT_F32: rmsnorm_rows<<<(unsigned)n_tokens, 256>>>(o, x, (const float *)w, dim, eps); break;
    case LOIP_KDT_BF16: rmsnorm_rows<<<(unsigned)n_tokens, 256>>>(o, x, (const __nv_bfloat16 *)w, dim, eps); break;
    case LOIP_KDT_F16: rmsnorm_rows<<<(unsigned)n_tokens, 256>>>(o, x, (const __half *)w, dim, eps); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}

extern "C" int loip_cuda_launch_rope(float *q, int32_t n_tokens, int32_t n_heads, int32_t head_dim,
                                     const int32_t *pos, const float *inv_freq, int32_t layout) {
    size_t total = (size_t)n_tokens * n_heads * (head_dim / 2);
    rope_pairs<<<blocks_for(total, 256), 256>>>(q, n_tokens, n_heads, head_dim, pos, inv_freq, layout);
    return (int)cudaGetLastError();
}

extern "C" int loip_cuda_launch_silu_gate(float *h, const float *u, uint64_t n) {
    silu_gate_k<<<blocks_for(n, 256), 256>>>(h, u, n);
    return (int)cudaGetLastError();
}

extern "C" int loip_cuda_launch_add(float *x, const float *y, uint64_t n) {
    add_k<<<blocks_for(n, 256), 256>>>(x, y, n);
    return (int)cudaGetLastError();
}

extern "C" int loip_cuda_launch_embed(float *x, const void *table, int32_t dtype, const int32_t *ids, int32_t n,
                                      uint64_t dim) {
    switch (dtype) {
    case LOIP_KDT_F32: embed_rows<<<n, 256>>>(x, (const float *)table, ids, dim); break;
    case LOIP_KDT_BF16: embed_rows<<<n, 256>>>(x, (const __nv_bfloat16 *)table, ids, dim); break;
    case LOIP_KDT_F16: embed_rows<<<n, 256>>>(x, (const __half *)table, ids, dim); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}

extern "C" int loip_cuda_launch_argmax(int32_t *out, const float *logits, int32_t n_rows, int32_t vocab) {
    argmax_rows<<<n_rows, 1024>>>(out, logits, vocab);
    return (int)cudaGetLastError();
}

extern "C" int loip_cuda_launch_attention_parts(float *scratch, const float *q, const float *k_pool,
                                                const float *v_pool, const int32_t *block_table,
                                                const int32_t *ctx_len, int32_t n_seqs, int32_t n_heads,
                                                int32_t n_kv_heads, int32_t head_dim, int32_t block_tokens,
                                                int32_t max_blocks, float scale, int32_t splits) {
    // scratch: parts' accumulators (n_seqs x n_heads x splits x head_dim) then (m, l) pairs
    float *acc = scratch, *ml = scratch + (size_t)n_seqs * n_heads * splits * head_dim;
    attn_decode_part<<<dim3(splits, n_heads, n_seqs), WARP>>>(acc, ml, q, k_pool, v_pool, block_table, ctx_len,
                                                             n_heads, n_kv_heads, head_dim, block_tokens, max_blocks,
                                                             scale, splits);
    return (int)cudaGetLastError();
}

extern "C" int loip_cuda_launch_attention_merge(float *out, const float *scratch, int32_t n_seqs, int32_t n_heads,
                                                int32_t head_dim, int32_t splits) {
    const float *acc = scratch, *ml = scratch + (size_t)n_seqs * n_heads * splits * head_dim;
    attn_decode_merge<<<dim3(n_heads, n_seqs), 128>>>(out, acc, ml, n_heads, head_dim, splits);
    return (int)cudaGetLastError();
}

extern "C" int loip_cuda_launch_attention_prefill(float *out, const float *q, const float *k, const float *v,
                                                  int32_t n, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                                  float scale) {
    attn_prefill_k<<<dim3(n, n_heads), WARP>>>(out, q, k, v, n_heads, n_kv_heads, head_dim, scale);
    return (int)cudaGetLastError();
}
