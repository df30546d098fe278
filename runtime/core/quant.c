/* The block-quantized dtypes (loip.h's LOIP_MXFP4, LOIP_F8_E4M3) outside the kernels: shape
 * checks, dequantization to f32, and packing a Hugging Face FP8 weight and its
 * weight_scale_inv into loip's F8 layout. The element decoding is kernels/cpu/quant.h's, so
 * what is dequantized here is what every kernel computes with. */
#include <string.h>

#include "core/core.h"
#include "cpu/quant.h"

static const char *or_tensor(const char *name) { return name && *name ? name : "tensor"; }

LOIP_API int loip_dtype_check(int32_t dtype, int64_t rows, int64_t cols, const char *name) {
    if (rows < 0 || cols < 0)
        return loip_fail(LOIP_ESHAPE, "%s: shape [%lld, %lld] is negative", or_tensor(name),
                         (long long)rows, (long long)cols);
    if (dtype < 0 || dtype >= LOIP_DTYPE_COUNT)
        return loip_fail(LOIP_ESHAPE, "%s: unknown dtype %d", or_tensor(name), dtype);
    if (dtype == LOIP_MXFP4 && cols % LOIP_MXFP4_BLOCK)
        return loip_fail(LOIP_ESHAPE,
                         "%s: MXFP4 row length (columns) %lld is not a multiple of the block "
                         "size 32",
                         or_tensor(name), (long long)cols);
    return LOIP_OK;
}

LOIP_API int loip_dequantize(float *dst, const void *src, int32_t dtype, int64_t rows,
                             int64_t cols) {
    int rc = loip_dtype_check(dtype, rows, cols, "dequantize");
    if (rc) return rc;
    if (dtype == LOIP_I32) return loip_fail(LOIP_EINVAL, "dequantize: I32 is not a float dtype");
    size_t R = (size_t)rows, C = (size_t)cols;
    if (dtype != LOIP_F8_E4M3) return loip_convert(dst, LOIP_F32, src, dtype, (uint64_t)R * C);
    for (size_t r = 0; r < R; r++) {
        const uint8_t *w = loip_f8_row(src, r, C);
        const uint8_t *s = loip_f8_scales(src, r, C);
        for (size_t c = 0; c < C; c++)
            dst[r * C + c] = loip_e4m3_to_f32(w[c]) * loip_f8_scale(s, c / LOIP_F8_BLOCK);
    }
    return LOIP_OK;
}

LOIP_API int loip_f8_pack(void *dst, const uint8_t *w, const float *scale_inv, int64_t rows,
                          int64_t cols, int64_t scale_rows, int64_t scale_cols,
                          const char *name) {
    int rc = loip_dtype_check(LOIP_F8_E4M3, rows, cols, name);
    if (rc) return rc;
    int64_t want_r = (rows + LOIP_F8_BLOCK - 1) / LOIP_F8_BLOCK;
    int64_t want_c = (cols + LOIP_F8_BLOCK - 1) / LOIP_F8_BLOCK;
    if (scale_rows != want_r || scale_cols != want_c)
        return loip_fail(LOIP_ESHAPE,
                         "%s: weight_scale_inv has shape [%lld, %lld], expected [%lld, %lld] "
                         "(one scale per 128x128 block of the weight's [%lld, %lld])",
                         or_tensor(name), (long long)scale_rows, (long long)scale_cols,
                         (long long)want_r, (long long)want_c, (long long)rows,
                         (long long)cols);
    size_t R = (size_t)rows, C = (size_t)cols, ns = (size_t)want_c;
    uint8_t *out = dst;
    for (size_t g = 0; g * LOIP_F8_BLOCK < R; g++) {
        size_t n = R - g * LOIP_F8_BLOCK < LOIP_F8_BLOCK ? R - g * LOIP_F8_BLOCK : LOIP_F8_BLOCK;
        memcpy(out, scale_inv + g * ns, 4 * ns);
        memcpy(out + 4 * ns, w + g * LOIP_F8_BLOCK * C, n * C);
        out += 4 * ns + n * C;
    }
    return LOIP_OK;
}
