// CUDA device discovery. Kernels go at the top of each .cu file, launchers at the bottom
// (CONVENTIONS.md); this file has no kernel, only the runtime query the C side needs.
#include <cuda_runtime.h>

#include "loip.h"

extern "C" LOIP_API int32_t loip_cuda_device_count(void) {
    int n = 0;
    // No driver or no device is not an error for the runtime: the CPU path is used.
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}
