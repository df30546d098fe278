/* Seeded synthetic weights and dtype conversion for whole arrays. */
#include <math.h>
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

static inline uint64_t mix64(uint64_t z) { /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Counter-based: value i depends only on (seed, i), so chunked fills equal one fill. The
 * normal is Irwin-Hall (sum of four 16-bit uniforms, rescaled to unit variance): one hash per
 * element, good enough for synthetic benchmark weights. */
LOIP_API int loip_fill_random(void *dst, uint64_t n, int32_t dtype, uint64_t seed, uint64_t first,
                              float mean, float std) {
    if (dtype != LOIP_F32 && dtype != LOIP_BF16 && dtype != LOIP_F16)
        return loip_fail(LOIP_EINVAL, "fill_random: unsupported dtype %d", dtype);
    const double scale = std / (65535.0 * sqrt(4.0 / 12.0));
    const uint64_t key = mix64(seed + 0x9e3779b97f4a7c15ull);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t h = mix64(key ^ ((first + i) * 0x9e3779b97f4a7c15ull));
        double s = (double)(h & 0xffff) + (double)((h >> 16) & 0xffff) +
                   (double)((h >> 32) & 0xffff) + (double)(h >> 48) - 2.0 * 65535.0;
        float v = (float)(mean + s * scale);
        switch (dtype) {
        case LOIP_F32: ((float *)dst)[i] = v; break;
        case LOIP_BF16: ((uint16_t *)dst)[i] = loip_f32_to_bf16(v); break;
        default: ((uint16_t *)dst)[i] = loip_f32_to_f16(v); break;
        }
    }
    return LOIP_OK;
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
