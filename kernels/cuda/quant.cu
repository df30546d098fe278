// CUDA kernels of the block-quantized weights (loip.h's LOIP_MXFP4 and LOIP_F8_E4M3, layouts
// there and in kernels/cpu/quant.h): matvec and matmul, fp32 accumulation. Each weight is
// dequantized exactly as the CPU kernels do (MXFP4: E2M1 x 2^(e-127), exact; F8: E4M3 x scale,
// one rounding), so they compute with the same values; the sums' order is the GPU's own (a
// lane's share, then the warp's shuffle reduction), as for the other dtypes' kernels.
//
//   matvec  one warp per output row: MXFP4 a 17-byte block per lane per step (a warp reads 544
//           consecutive bytes), F8 four consecutive bytes per lane per step
//   matmul  one warp per output row and up to MM_T tokens at once, each weight decoded once
//           for them
#include <cuda_runtime.h>
#include <stdint.h>

#include "cpu/kernels.h"
#include "cuda/kernels.h"

#define WARP 32
#define MM_T 8

__device__ __forceinline__ float q_warp_sum(float v) {
    for (int o = WARP / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__constant__ float e2m1_values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

__device__ __forceinline__ float e8m0(uint8_t e) {
    if (e == 0xFF) return __uint_as_float(0x7FC00000u);
    if (e == 0) return __uint_as_float(0x00400000u);
    return __uint_as_float((uint32_t)e << 23);
}

__device__ __forceinline__ float e4m3(uint8_t b) {
    if ((b & 0x7F) == 0x7F) return __uint_as_float(0x7FC00000u);
    return __uint_as_float(((uint32_t)(b & 0x80) << 24) | ((uint32_t)(b & 0x7F) << 20)) * 0x1p120f;
}

// F8's layout (kernels/cpu/quant.h): groups of 128 rows, [ceil(cols/128) f32 scales][rows].
__device__ __forceinline__ size_t f8_group_bytes(size_t cols) { return 4 * ((cols + 127) / 128) + 128 * cols; }
__device__ __forceinline__ const uint8_t *f8_row(const uint8_t *W, size_t r, size_t cols) {
    return W + r / 128 * f8_group_bytes(cols) + 4 * ((cols + 127) / 128) + r % 128 * cols;
}
// (bytes: a row range's scales need not be 4-byte aligned; scale k is read a byte at a time)
__device__ __forceinline__ const uint8_t *f8_scales(const uint8_t *W, size_t r, size_t cols) {
    return W + r / 128 * f8_group_bytes(cols);
}
__device__ __forceinline__ float f8_scale(const uint8_t *sc, size_t k) {
    const uint8_t *p = sc + 4 * k;
    return __uint_as_float((unsigned)p[0] | (unsigned)p[1] << 8 | (unsigned)p[2] << 16 | (unsigned)p[3] << 24);
}

// The 32 weights of MXFP4 block p, dequantized, dotted with x[0..32) for each of T tokens
// (x of token j at x + j * ld).
template <int T>
__device__ __forceinline__ void mx_block(const uint8_t *p, const float *x, size_t ld, float *acc) {
    float s = e8m0(p[0]);
    for (int j = 0; j < 16; j++) {
        uint8_t q = p[1 + j];
        float lo = e2m1_values[q & 15] * s, hi = e2m1_values[q >> 4] * s;
#pragma unroll
        for (int t = 0; t < T; t++) acc[t] += lo * x[t * ld + j] + hi * x[t * ld + 16 + j];
    }
}

__global__ void mx_matvec(float *__restrict__ y, const uint8_t *__restrict__ W, const float *__restrict__ x,
                          size_t rows, size_t cols) {
    size_t r = (size_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (r >= rows) return;
    int lane = threadIdx.x % WARP;
    size_t nb = cols / 32;
    const uint8_t *row = W + r * nb * 17;
    float acc[1] = {0.0f};
    for (size_t b = lane; b < nb; b += WARP) mx_block<1>(row + b * 17, x + b * 32, 0, acc);
    float s = q_warp_sum(acc[0]);
    if (lane == 0) y[r] = s;
}

__global__ void mx_matmul(float *__restrict__ Y, const uint8_t *__restrict__ W, const float *__restrict__ X, int n,
                          size_t rows, size_t cols) {
    size_t r = (size_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (r >= rows) return;
    int lane = threadIdx.x % WARP;
    size_t nb = cols / 32;
    const uint8_t *row = W + r * nb * 17;
    for (int t0 = 0; t0 < n; t0 += MM_T) {
        float acc[MM_T] = {0};
        if (n - t0 >= MM_T) {
            for (size_t b = lane; b < nb; b += WARP) mx_block<MM_T>(row + b * 17, X + t0 * cols + b * 32, cols, acc);
        } else {
            for (int t = t0; t < n; t++)
                for (size_t b = lane; b < nb; b += WARP) mx_block<1>(row + b * 17, X + t * cols + b * 32, 0, acc + (t - t0));
        }
        for (int t = 0; t < MM_T && t0 + t < n; t++) {
            float s = q_warp_sum(acc[t]);
            if (lane == 0) Y[(size_t)(t0 + t) * rows + r] = s;
        }
    }
}

// Row r's columns [c, c + 4) (those < cols) dequantized into w (0 past the end).
__device__ __forceinline__ void f8_four(const uint8_t *row, const uint8_t *sc, size_t c, size_t cols, float *w) {
    for (int k = 0; k < 4; k++) w[k] = c + k < cols ? e4m3(row[c + k]) * f8_scale(sc, (c + k) / 128) : 0.0f;
}

__global__ void f8_matvec(float *__restrict__ y, const uint8_t *__restrict__ W, const float *__restrict__ x,
                          size_t rows, size_t cols) {
    size_t r = (size_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (r >= rows) return;
    int lane = threadIdx.x % WARP;
    const uint8_t *row = f8_row(W, r, cols);
    const uint8_t *sc = f8_scales(W, r, cols);
    float acc = 0.0f;
    for (size_t c = 4 * (size_t)lane; c < cols; c += 4 * WARP) {
        float w[4];
        f8_four(row, sc, c, cols, w);
        for (int k = 0; k < 4 && c + k < cols; k++) acc += w[k] * x[c + k];
    }
    float s = q_warp_sum(acc);
    if (lane == 0) y[r] = s;
}

__global__ void f8_matmul(float *__restrict__ Y, const uint8_t *__restrict__ W, const float *__restrict__ X, int n,
                          size_t rows, size_t cols) {
    size_t r = (size_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (r >= rows) return;
    int lane = threadIdx.x % WARP;
    const uint8_t *row = f8_row(W, r, cols);
    const uint8_t *sc = f8_scales(W, r, cols);
    for (int t0 = 0; t0 < n; t0 += MM_T) {
        int T = n - t0 < MM_T ? n - t0 : MM_T;
        float acc[MM_T] = {0};
        for (size_t c = 4 * (size_t)lane; c < cols; c += 4 * WARP) {
            float w[4];
            f8_four(row, sc, c, cols, w);
            for (int t = 0; t < T; t++)
                for (int k = 0; k < 4 && c + k < cols; k++) acc[t] += w[k] * X[(size_t)(t0 + t) * cols + c + k];
        }
        for (int t = 0; t < T; t++) {
            float s = q_warp_sum(acc[t]);
            if (lane == 0) Y[(size_t)(t0 + t) * rows + r] = s;
        }
    }
}

// ---- launchers ------------------------------------------------------------------------------

static unsigned q_blocks(size_t n, unsigned per) { return (unsigned)((n + per - 1) / per); }

extern "C" int loip_cuda_launch_matvec_quant(int32_t dtype, float *y, const void *W, const float *x, uint64_t rows,
                                             uint64_t cols) {
    const unsigned threads = 256, grid = q_blocks(rows, threads / WARP);
    const uint8_t *w = static_cast<const uint8_t *>(W);
    switch (dtype) {
    case LOIP_KDT_MXFP4: mx_matvec<<<grid, threads>>>(y, w, x, rows, cols); break;
    case LOIP_KDT_F8_E4M3: f8_matvec<<<grid, threads>>>(y, w, x, rows, cols); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}

extern "C" int loip_cuda_launch_matmul_quant(int32_t dtype, float *Y, const void *W, const float *X, int n,
                                             int rows, int cols) {
    const unsigned threads = 256, grid = q_blocks((size_t)rows, threads / WARP);
    const uint8_t *w = static_cast<const uint8_t *>(W);
    switch (dtype) {
    case LOIP_KDT_MXFP4: mx_matmul<<<grid, threads>>>(Y, w, X, n, (size_t)rows, (size_t)cols); break;
    case LOIP_KDT_F8_E4M3: f8_matmul<<<grid, threads>>>(Y, w, X, n, (size_t)rows, (size_t)cols); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}
