/* CPU facts and the process-wide choice of kernel variant. */
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "core/runtime.h"
#include "cpu/quant.h"

static _Atomic(const loip_kernels *) current;

const loip_kernels *loip_kernels_current(void) {
    const loip_kernels *k = atomic_load_explicit(&current, memory_order_acquire);
    if (!k) {
        /* LOIP_KERNELS if it names a usable variant, else the best; the Lua side checks the
         * variable at require time and reports a bad value. */
        k = loip_kernels_select(NULL);
        if (!k) k = loip_kernels_select("auto");
        atomic_store(&current, k);
    }
    return k;
}

LOIP_API int loip_kernels_use(const char *name) {
    const loip_kernels *k = loip_kernels_select(name ? name : "auto");
    if (!k)
        return loip_fail(LOIP_EINVAL,
                         "kernels: '%s' is unknown or not supported by this CPU "
                         "(choose ref, avx2, avx512, amx, amx-auto or auto)", name);
    atomic_store(&current, k);
    return LOIP_OK;
}

LOIP_API const char *loip_kernels_name(void) { return loip_kernels_current()->name; }

LOIP_API int loip_kernels_set_prefetch(int64_t bytes) {
    if (bytes > LOIP_KERNELS_PREFETCH_MAX)
        return loip_fail(LOIP_EINVAL, "kernels: prefetch distance %lld bytes is above %d",
                         (long long)bytes, LOIP_KERNELS_PREFETCH_MAX);
    atomic_store(&loip_quant_prefetch_bytes,
                 bytes < 0 ? (size_t)LOIP_QUANT_PREFETCH_DEFAULT : (size_t)bytes);
    return LOIP_OK;
}

LOIP_API int64_t loip_kernels_prefetch(void) { return (int64_t)loip_quant_prefetch(); }

LOIP_API int64_t loip_kernels_amx_threshold(int64_t rows) {
    return (int64_t)loip_kernels_amx_rows(rows > 0 ? (size_t)rows : 0);
}

LOIP_API int loip_cpu_info_get(loip_cpu_info *out) {
    memset(out, 0, sizeof *out);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    out->n_cpus = n > 0 ? (int32_t)n : 1;
#if defined(__x86_64__)
    __builtin_cpu_init();
    out->has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    out->has_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl");
    out->has_avx512_bf16 = out->has_avx512 && __builtin_cpu_supports("avx512bf16");
#elif defined(__aarch64__)
    out->has_neon = 1;
#endif
    out->has_cuda = loip_cuda_device_count() > 0;
    return LOIP_OK;
}
