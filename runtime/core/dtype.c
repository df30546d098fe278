/* Float dtypes over whole arrays: the size of an element, and conversion between F32, BF16 and
 * F16 (the per-element conversions are kernels/cpu/convert.c's). */
#include <string.h>

#include "core/core.h"
#include "cpu/kernels.h"

LOIP_API int32_t loip_dtype_size(int32_t dtype) {
    switch (dtype) {
    case LOIP_F32: return 4;
    case LOIP_BF16: return 2;
    case LOIP_F16: return 2;
    case LOIP_I32: return 4;
    default: return 0;
    }
}

static float load_elem(const void *src, int32_t dt, uint64_t i) {
    switch (dt) {
    case LOIP_F32: return ((const float *)src)[i];
    case LOIP_BF16: return loip_bf16_to_f32(((const uint16_t *)src)[i]);
    default: return loip_f16_to_f32(((const uint16_t *)src)[i]);
    }
}

LOIP_API int loip_convert(void *dst, int32_t ddt, const void *src, int32_t sdt, uint64_t n) {
    for (int k = 0; k < 2; k++) {
        int32_t dt = k ? sdt : ddt;
        if (dt != LOIP_F32 && dt != LOIP_BF16 && dt != LOIP_F16)
            return loip_fail(LOIP_EINVAL, "convert: unsupported %s dtype %d",
                             k ? "source" : "destination", dt);
    }
    if (ddt == sdt) {
        memmove(dst, src, n * (uint64_t)loip_dtype_size(ddt));
        return LOIP_OK;
    }
    for (uint64_t i = 0; i < n; i++) {
        float v = load_elem(src, sdt, i);
        switch (ddt) {
        case LOIP_F32: ((float *)dst)[i] = v; break;
        case LOIP_BF16: ((uint16_t *)dst)[i] = loip_f32_to_bf16(v); break;
        default: ((uint16_t *)dst)[i] = loip_f32_to_f16(v); break;
        }
    }
    return LOIP_OK;
}
