/* Weights made anew from the layout a file keeps them in (loip.h: loip_gather_elements,
 * loip_mxfp4_from_openai): gpt-oss's fused, transposed and interleaved experts, and its MXFP4
 * blocks in OpenAI's nibble order. Plain loops: run once, when a model is opened or sliced. */
#include <stdint.h>
#include <string.h>

#include "core/core.h"

LOIP_API int loip_gather_elements(void *dst, const void *src, int32_t elem_bytes, int64_t base, int64_t rows,
                                  int64_t rs, int64_t cols, int64_t cs) {
    if (rows < 0 || cols < 0 || base < 0)
        return loip_fail(LOIP_EINVAL, "gather: negative rows %lld, cols %lld or base %lld", (long long)rows,
                         (long long)cols, (long long)base);
    for (int64_t r = 0; r < rows; r++) {
        int64_t i = base + r * rs, o = r * cols;
        switch (elem_bytes) {
        case 4:
            for (int64_t c = 0; c < cols; c++) ((uint32_t *)dst)[o + c] = ((const uint32_t *)src)[i + c * cs];
            break;
        case 2:
            for (int64_t c = 0; c < cols; c++) ((uint16_t *)dst)[o + c] = ((const uint16_t *)src)[i + c * cs];
            break;
        case 1:
            for (int64_t c = 0; c < cols; c++) ((uint8_t *)dst)[o + c] = ((const uint8_t *)src)[i + c * cs];
            break;
        default: return loip_fail(LOIP_EINVAL, "gather: elements of %d bytes (1, 2 or 4)", elem_bytes);
        }
    }
    return LOIP_OK;
}

/* OpenAI's block holds value 2j in the low nibble of byte j and 2j+1 in its high; GGUF's
 * block_mxfp4 (LOIP_MXFP4) value j in the low nibble of byte j and j+16 in its high. */
static void repack_block(uint8_t out[16], const uint8_t in[16]) {
    for (int j = 0; j < 16; j++) {
        uint8_t lo = (uint8_t)((in[j >> 1] >> (4 * (j & 1))) & 15), hi = (uint8_t)((in[8 + (j >> 1)] >> (4 * (j & 1))) & 15);
        out[j] = (uint8_t)(lo | hi << 4);
    }
}

LOIP_API int loip_mxfp4_from_openai(void *dst, const uint8_t *blocks, const uint8_t *scales, int64_t first,
                                    int64_t step, int64_t rows, int64_t nb) {
    if (rows < 0 || nb < 0 || first < 0 || step < 0)
        return loip_fail(LOIP_EINVAL, "mxfp4 from OpenAI's layout: negative rows %lld, blocks %lld, first %lld or "
                         "step %lld", (long long)rows, (long long)nb, (long long)first, (long long)step);
    uint8_t *out = dst;
    for (int64_t r = 0; r < rows; r++) {
        int64_t row = first + r * step;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = out + (r * nb + b) * 17;
            o[0] = scales[row * nb + b];
            repack_block(o + 1, blocks + (row * nb + b) * 16);
        }
    }
    return LOIP_OK;
}
