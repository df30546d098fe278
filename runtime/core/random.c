/* Seeded synthetic weights: reproducible pseudo-normal values in a float dtype, for synthetic
 * models (loip synth) and the profiler's test tensors. */
#include <math.h>

#include "core/core.h"
#include "cpu/kernels.h"

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
