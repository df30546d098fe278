/* SHA-256 (FIPS 180-4), streaming, for the content hashes of slice stores and their sources.
 *
 * Slicing hashes every byte of a model twice (the source files, then the slices it writes) and
 * `loip slice --verify` once more, so the compression function is the cost: the portable C
 * one runs at ~250-400 MB/s on one core; x86's SHA extensions (SHA-NI: Intel since Ice Lake /
 * Goldmont, AMD since Zen) run ~1.5-2 GB/s, on a par with an NVMe drive. The choice is made
 * per call from the CPU and the kernel variant: "ref" (LOIP_KERNELS=ref) means the portable
 * code everywhere, so that the known-answer test covers both. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "core/runtime.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

struct loip_sha256 {
    uint32_t h[8];
    uint64_t bytes;    /* message length so far */
    uint8_t block[64]; /* the partial block */
    uint32_t fill;     /* bytes in block */
};

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

/* The reference compression: n blocks of 64 bytes, a 16-word rolling message schedule. */
static void compress_ref(uint32_t h[8], const uint8_t *p, size_t n) {
    for (; n > 0; n--, p += 64) {
        uint32_t w[16];
        for (int i = 0; i < 16; i++)
            w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
                   (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
        for (int i = 0; i < 64; i++) {
            uint32_t wi;
            if (i < 16) {
                wi = w[i];
            } else {
                uint32_t w15 = w[(i - 15) & 15], w2 = w[(i - 2) & 15];
                uint32_t s0 = ROR(w15, 7) ^ ROR(w15, 18) ^ (w15 >> 3);
                uint32_t s1 = ROR(w2, 17) ^ ROR(w2, 19) ^ (w2 >> 10);
                wi = w[i & 15] = w[i & 15] + s0 + w[(i - 7) & 15] + s1;
            }
            uint32_t t1 = k + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + wi;
            uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            k = g;
            g = f;
            f = e;
            e = d + t1;
            d = c;
            c = b;
            b = a;
            a = t1 + t2;
        }
        h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
    }
}

#if defined(__x86_64__)
/* SHA-NI: the state lives as ABEF/CDGH in two registers; each sha256rnds2 does two rounds,
 * sha256msg1/msg2 extend the schedule four words at a time (Intel's white paper "Intel SHA
 * Extensions", 2013, and the public-domain SHA-Intrinsics code follow the same plan). Group i
 * runs rounds 4i..4i+3 with schedule register W[i % 4]. */
__attribute__((target("sha,sse4.1,ssse3"))) static void compress_shani(uint32_t h[8],
                                                                      const uint8_t *p, size_t n) {
    const __m128i MASK = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i tmp = _mm_loadu_si128((const __m128i *)&h[0]);
    __m128i s1 = _mm_loadu_si128((const __m128i *)&h[4]);
    tmp = _mm_shuffle_epi32(tmp, 0xB1);          /* CDAB */
    s1 = _mm_shuffle_epi32(s1, 0x1B);            /* EFGH */
    __m128i s0 = _mm_alignr_epi8(tmp, s1, 8);    /* ABEF */
    s1 = _mm_blend_epi16(s1, tmp, 0xF0);         /* CDGH */
    for (; n > 0; n--, p += 64) {
        __m128i abef = s0, cdgh = s1, w[4];
        for (int i = 0; i < 4; i++)
            w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), MASK);
        for (int i = 0; i < 16; i++) {
            __m128i msg = _mm_add_epi32(w[i & 3], _mm_loadu_si128((const __m128i *)&K[4 * i]));
            s1 = _mm_sha256rnds2_epu32(s1, s0, msg);
            if (i >= 3 && i <= 14) { /* the schedule for group i + 1 */
                __m128i t = _mm_alignr_epi8(w[i & 3], w[(i - 1) & 3], 4);
                w[(i + 1) & 3] = _mm_sha256msg2_epu32(_mm_add_epi32(w[(i + 1) & 3], t), w[i & 3]);
            }
            msg = _mm_shuffle_epi32(msg, 0x0E);
            s0 = _mm_sha256rnds2_epu32(s0, s1, msg);
            if (i >= 1 && i <= 12) w[(i - 1) & 3] = _mm_sha256msg1_epu32(w[(i - 1) & 3], w[i & 3]);
        }
        s0 = _mm_add_epi32(s0, abef);
        s1 = _mm_add_epi32(s1, cdgh);
    }
    tmp = _mm_shuffle_epi32(s0, 0x1B);           /* FEBA */
    s1 = _mm_shuffle_epi32(s1, 0xB1);            /* DCHG */
    s0 = _mm_blend_epi16(tmp, s1, 0xF0);         /* DCBA */
    s1 = _mm_alignr_epi8(s1, tmp, 8);            /* HGFE */
    _mm_storeu_si128((__m128i *)&h[0], s0);
    _mm_storeu_si128((__m128i *)&h[4], s1);
}

static int cpu_has_shani(void) {
    static int known = -1; /* racing first calls compute the same answer */
    if (known < 0) {
        unsigned a, b, c, d, ok = 0;
        if (__get_cpuid(1, &a, &b, &c, &d) && (c & bit_SSE4_1) && (c & bit_SSSE3) &&
            __get_cpuid_count(7, 0, &a, &b, &c, &d))
            ok = (b >> 29) & 1; /* CPUID.(EAX=7,ECX=0):EBX.SHA[bit 29] */
        known = (int)ok;
    }
    return known;
}
#endif

static void compress(uint32_t h[8], const uint8_t *p, size_t n) {
#if defined(__x86_64__)
    if (cpu_has_shani() && strcmp(loip_kernels_current()->name, "ref") != 0) {
        compress_shani(h, p, n);
        return;
    }
#endif
    compress_ref(h, p, n);
}

static void reset(loip_sha256 *s) {
    memcpy(s->h, H0, sizeof H0);
    s->bytes = 0;
    s->fill = 0;
}

LOIP_API int loip_sha256_new(loip_sha256 **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return loip_fail(LOIP_ENOMEM, "sha256: out of memory");
    reset(*out);
    return LOIP_OK;
}

LOIP_API void loip_sha256_free(loip_sha256 *s) { free(s); }

LOIP_API int loip_sha256_update(loip_sha256 *s, const void *data, uint64_t len) {
    const uint8_t *p = data;
    s->bytes += len;
    if (s->fill > 0) {
        uint64_t k = 64 - s->fill < len ? 64 - s->fill : len;
        memcpy(s->block + s->fill, p, (size_t)k);
        s->fill += (uint32_t)k;
        p += k;
        len -= k;
        if (s->fill < 64) return LOIP_OK;
        compress(s->h, s->block, 1);
        s->fill = 0;
    }
    if (len >= 64) { /* whole blocks straight from the caller's memory */
        compress(s->h, p, (size_t)(len / 64));
        p += len & ~(uint64_t)63;
        len &= 63;
    }
    memcpy(s->block, p, (size_t)len);
    s->fill = (uint32_t)len;
    return LOIP_OK;
}

static void to_hex(const uint8_t d[32], char *hex) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[64] = '\0';
}

LOIP_API int loip_sha256_final(loip_sha256 *s, uint8_t *digest, char *hex) {
    uint64_t bits = s->bytes * 8;
    uint8_t pad[72] = {0x80};
    uint32_t padlen = (s->fill < 56 ? 56 : 120) - s->fill;
    for (int i = 0; i < 8; i++) pad[padlen + i] = (uint8_t)(bits >> (56 - 8 * i));
    loip_sha256_update(s, pad, padlen + 8);
    uint8_t d[32];
    for (int i = 0; i < 8; i++) {
        d[4 * i] = (uint8_t)(s->h[i] >> 24);
        d[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        d[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
        d[4 * i + 3] = (uint8_t)s->h[i];
    }
    if (digest) memcpy(digest, d, 32);
    if (hex) to_hex(d, hex);
    reset(s);
    return LOIP_OK;
}

LOIP_API int loip_sha256_file(const char *path, char *hex, uint64_t *bytes) {
    /* Large sequential reads: the kernel's readahead keeps the drive busy while we hash. */
    enum { CHUNK = 8 << 20 };
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return loip_fail(-errno, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return loip_fail(LOIP_EINVAL, "%s: not a regular file", path);
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    uint8_t *buf = malloc(CHUNK);
    loip_sha256 s;
    reset(&s);
    uint64_t total = 0;
    int rc = buf ? LOIP_OK : loip_fail(LOIP_ENOMEM, "%s: out of memory", path);
    while (rc == LOIP_OK) {
        ssize_t k = read(fd, buf, CHUNK);
        if (k < 0) {
            if (errno == EINTR) continue;
            rc = loip_fail(-errno, "%s: read failed: %s", path, strerror(errno));
        } else if (k == 0) {
            break;
        } else {
            loip_sha256_update(&s, buf, (uint64_t)k);
            total += (uint64_t)k;
        }
    }
    free(buf);
    close(fd);
    if (rc != LOIP_OK) return rc;
    loip_sha256_final(&s, NULL, hex);
    if (bytes) *bytes = total;
    return LOIP_OK;
}

/* HMAC-SHA256 (RFC 2104): a key longer than a block is hashed first, as the RFC says. The
 * proof a discovery beacon carries (lua/loip/cluster/discovery.lua). */
LOIP_API int loip_hmac_sha256(const void *key, uint64_t key_len, const void *msg, uint64_t msg_len,
                              uint8_t *mac) {
    uint8_t k[64] = {0}, pad[64], inner[32];
    loip_sha256 s;
    reset(&s);
    if (key_len > 64) {
        loip_sha256_update(&s, key, key_len);
        loip_sha256_final(&s, k, NULL);
    } else if (key_len > 0) {
        memcpy(k, key, (size_t)key_len);
    }
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
    loip_sha256_update(&s, pad, 64);
    loip_sha256_update(&s, msg, msg_len);
    loip_sha256_final(&s, inner, NULL);
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
    loip_sha256_update(&s, pad, 64);
    loip_sha256_update(&s, inner, 32);
    loip_sha256_final(&s, mac, NULL);
    return LOIP_OK;
}
