// CUDA devices and memory: discovery, the device's facts a profile starts from, and the three
// kinds of memory the UMA-aware loading path uses (DESIGN §3; the paper's Sec. III-C):
//   device  cudaMalloc: a resident block on a discrete GPU;
//   mapped  cudaHostAlloc(Mapped): host memory the kernels read in place through a device
//           pointer (an integrated GPU's resident blocks: one memory, no copy);
//   registered  cudaHostRegister(Mapped) of memory someone else allocated: the loader's slot,
//           which io_uring fills with O_DIRECT reads and the kernels then read where it landed.
// The runtime's side of CUDA, with launch.c (the kernels themselves: kernels/cuda); this file
// has no kernel.
#include <cuda_runtime.h>
#include <string.h>

extern "C" {
#include "core/core.h"
}
#include "loip.h"

static int cuda_fail(cudaError_t e, const char *what) {
    return loip_fail(LOIP_EIO, "cuda: %s: %s", what, cudaGetErrorString(e));
}

extern "C" LOIP_API int32_t loip_cuda_device_count(void) {
    int n = 0;
    // No driver or no device is not an error for the runtime: the CPU path is used.
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" LOIP_API int loip_cuda_device_info(int32_t dev, char *name, size_t cap, int32_t *integrated,
                                             int32_t *sm_count, uint64_t *total_bytes,
                                             double *bandwidth_Bps) {
    int n = loip_cuda_device_count();
    if (dev < 0 || dev >= n) return loip_fail(LOIP_EINVAL, "cuda: device %d of %d", dev, n);
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, dev);
    if (e != cudaSuccess) return cuda_fail(e, "cudaGetDeviceProperties");
    if (name && cap > 0) {
        strncpy(name, p.name, cap - 1);
        name[cap - 1] = 0;
    }
    if (integrated) *integrated = p.integrated;
    if (sm_count) *sm_count = p.multiProcessorCount;
    if (total_bytes) *total_bytes = (uint64_t)p.totalGlobalMem;
    if (bandwidth_Bps) {
        // peak: memory clock (kHz) x 2 (double data rate) x bus width (bytes)
        int clock_khz = 0, bus_bits = 0;
        cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev);
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev);
        *bandwidth_Bps = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0);
    }
    return LOIP_OK;
}

extern "C" LOIP_API int loip_cuda_alloc(uint64_t bytes, int32_t kind, void **host, void **dev) {
    if (host) *host = NULL;
    *dev = NULL;
    if (bytes == 0) return loip_fail(LOIP_EINVAL, "cuda: an allocation of 0 bytes");
    cudaError_t e;
    if (kind == LOIP_CUDA_MEM_DEVICE) {
        e = cudaMalloc(dev, bytes);
        if (e != cudaSuccess) return cuda_fail(e, "cudaMalloc");
        return LOIP_OK;
    }
    if (kind != LOIP_CUDA_MEM_MAPPED) return loip_fail(LOIP_EINVAL, "cuda: memory kind %d", kind);
    void *h = NULL;
    e = cudaHostAlloc(&h, bytes, cudaHostAllocMapped);
    if (e != cudaSuccess) return cuda_fail(e, "cudaHostAlloc");
    e = cudaHostGetDevicePointer(dev, h, 0);
    if (e != cudaSuccess) {
        cudaFreeHost(h);
        return cuda_fail(e, "cudaHostGetDevicePointer");
    }
    if (host) *host = h;
    return LOIP_OK;
}

extern "C" LOIP_API void loip_cuda_free(void *p, int32_t kind) {
    if (!p) return;
    if (kind == LOIP_CUDA_MEM_DEVICE) cudaFree(p);
    else cudaFreeHost(p);
}

extern "C" LOIP_API int loip_cuda_register(void *host, uint64_t bytes, void **dev) {
    *dev = NULL;
    cudaError_t e = cudaHostRegister(host, bytes, cudaHostRegisterMapped);
    if (e != cudaSuccess) return cuda_fail(e, "cudaHostRegister");
    e = cudaHostGetDevicePointer(dev, host, 0);
    if (e != cudaSuccess) {
        cudaHostUnregister(host);
        return cuda_fail(e, "cudaHostGetDevicePointer");
    }
    return LOIP_OK;
}

extern "C" LOIP_API void loip_cuda_unregister(void *host) {
    if (host) cudaHostUnregister(host);
}

extern "C" LOIP_API int loip_cuda_copy(void *dst, const void *src, uint64_t bytes) {
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
    if (e != cudaSuccess) return cuda_fail(e, "cudaMemcpy");
    return LOIP_OK;
}

extern "C" LOIP_API int loip_cuda_sync(void) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) return cuda_fail(e, "a kernel (cudaDeviceSynchronize)");
    return LOIP_OK;
}
