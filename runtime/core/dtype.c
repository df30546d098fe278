/* Float dtypes over whole arrays: the size of an element, and conversion between F32, BF16 and
 * F16 (the per-element conversions are kernels/cpu/convert.c's); MXFP4 blocks convert from
 * (their other operations, and F8's, are quant.c's). */
#include <string.h>

#include "core/core.h"
#include "cpu/kernels.h"
#include "cpu/quant.h"

LOIP_API int32_t loip_dtype_size(int32_t dtype) {
    switch (dtype) {
    case LOIP_F32: return 4;
    case LOIP_BF16: return 2;
    case LOIP_F16: return 2;
    case LOIP_I32: return 4;
    default: return 0; /* (the block dtypes too: loip_dtype_bytes) */
    }
}

LOIP_API uint64_t loip_dtype_bytes(int32_t dtype, int64_t rows, int64_t cols) {
    if (rows < 0 || cols < 0) return 0;
    uint64_t r = (uint64_t)rows, c = (uint64_t)cols;
    switch (dtype) {
    case LOIP_MXFP4:
        return c % LOIP_MXFP4_BLOCK ? 0 : r * loip_mxfp4_row_bytes(c);
    case LOIP_F8_E4M3:
        return r * c + 4 * loip_f8_scales_per_row(c) * ((r + LOIP_F8_BLOCK - 1) / LOIP_F8_BLOCK);
    default:
        return r * c * (uint64_t)loip_dtype_size(dtype);
    }
}

static float load_elem(const void *src, int32_t dt, uint64_t i) {
    switch (dt) {
    case LOIP_MXFP4: {
        const uint8_t *b = (const uint8_t *)src + i / 32 * LOIP_MXFP4_BLOCK_BYTES;
        uint8_t q = b[1 + i % 16];
        return loip_e2m1_values[i % 32 < 16 ? q & 15 : q >> 4] * loip_e8m0_to_f32(b[0]);
    }
    case LOIP_F32: return ((const float *)src)[i];
    case LOIP_BF16: return loip_bf16_to_f32(((const uint16_t *)src)[i]);
    default: return loip_f16_to_f32(((const uint16_t *)src)[i]);
    }
}

LOIP_API int loip_convert(void *dst, int32_t ddt, const void *src, int32_t sdt, uint64_t n) {
    for (int k = 0; k < 2; k++) {
        int32_t dt = k ? sdt : ddt;
        if (dt != LOIP_F32 && dt != LOIP_BF16 && dt != LOIP_F16 && !(k && dt == LOIP_MXFP4))
            return loip_fail(LOIP_EINVAL, "convert: unsupported %s dtype %d%s",
                             k ? "source" : "destination", dt,
                             dt == LOIP_F8_E4M3 ? " (F8 needs its rows and columns: loip_dequantize)"
                                                : "");
    }
    if (sdt == LOIP_MXFP4 && n % LOIP_MXFP4_BLOCK)
        return loip_fail(LOIP_ESHAPE, "convert: %llu MXFP4 elements are not whole blocks of 32",
                         (unsigned long long)n);
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
