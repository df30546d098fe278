/* CRC32C (Castagnoli, the iSCSI/ext4 polynomial 0x1EDC6F41, reflected 0x82F63B78): the checksum
 * of a slice store's block files, checked on every offloaded read with --verify-reads. The
 * SSE4.2 crc32 instruction where the CPU has it (chosen at run time), else a table, 8 bytes a
 * step; both give the same value. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "core/core.h"
#include "files/crc32c.h"

static uint32_t table[8][256];
static int have_table, have_hw = -1;

static void make_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
    have_table = 1;
}

static uint32_t crc_sw(uint32_t c, const uint8_t *p, uint64_t n) {
    if (!have_table) make_table();
    while (n && ((uintptr_t)p & 7)) c = table[0][(c ^ *p++) & 0xff] ^ (c >> 8), n--;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= c;
        c = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
            table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^ table[2][(w >> 40) & 0xff] ^
            table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
    }
    while (n--) c = table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

uint32_t loip_crc32c_shift(uint32_t crc, uint64_t n);

#if defined(__x86_64__)
#include <nmmintrin.h>
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t c, const uint8_t *p, uint64_t n) {
    while (n && ((uintptr_t)p & 7)) c = _mm_crc32_u8(c, *p++), n--;
    /* three lanes at once (the instruction's latency is three times its throughput), put
     * together with the zero-byte operators: raw(c, A B C) = shift(raw(c, A), |B C|) ^
     * shift(raw(0, B), |C|) ^ raw(0, C) */
    if (n >= 3 * 8192) {
        uint64_t lane = n / 24 * 8;
        const uint8_t *a = p, *b = p + lane, *d = p + 2 * lane;
        uint64_t ca = c, cb = 0, cd = 0;
        for (uint64_t i = 0; i < lane; i += 8) {
            uint64_t wa, wb, wd;
            memcpy(&wa, a + i, 8), memcpy(&wb, b + i, 8), memcpy(&wd, d + i, 8);
            ca = _mm_crc32_u64(ca, wa), cb = _mm_crc32_u64(cb, wb), cd = _mm_crc32_u64(cd, wd);
        }
        c = loip_crc32c_shift((uint32_t)ca, 2 * lane) ^ loip_crc32c_shift((uint32_t)cb, lane) ^ (uint32_t)cd;
        p += 3 * lane, n -= 3 * lane;
    }
    uint64_t c64 = c;
    for (; n >= 32; n -= 32, p += 32) {
        uint64_t w[4];
        memcpy(w, p, 32);
        c64 = _mm_crc32_u64(c64, w[0]);
        c64 = _mm_crc32_u64(c64, w[1]);
        c64 = _mm_crc32_u64(c64, w[2]);
        c64 = _mm_crc32_u64(c64, w[3]);
    }
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c64 = _mm_crc32_u64(c64, w);
    }
    c = (uint32_t)c64;
    while (n--) c = _mm_crc32_u8(c, *p++);
    return c;
}
#endif

static int crc32c_hardware(void) {
#if defined(__x86_64__)
    if (have_hw < 0) have_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    return have_hw;
#else
    return 0;
#endif
}

LOIP_API uint32_t loip_crc32c(uint32_t crc, const void *data, uint64_t n) {
    return ~loip_crc32c_raw(~crc, data, n);
}

/* The raw CRC (no inversions) of n bytes continuing c: what pieces read in any order give, to be
 * put together with loip_crc32c_shift. */
uint32_t loip_crc32c_raw(uint32_t c, const void *data, uint64_t n) {
#if defined(__x86_64__)
    if (crc32c_hardware()) return crc_hw(c, data, n);
#endif
    return crc_sw(c, data, n);
}

/* crc followed by n zero bytes (raw): multiplication by x^(8n) mod P, as a 32x32 matrix over
 * GF(2) per power of two of n, made once. With it the raw CRC of a whole is the XOR of its
 * pieces' raw CRCs each shifted by the bytes after it, in any order. */
static uint32_t zeros_op[64][32]; /* zeros_op[k]: the operator of 2^k zero bytes */
static pthread_once_t zeros_once = PTHREAD_ONCE_INIT;

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    for (int i = 0; vec; vec >>= 1, i++)
        if (vec & 1) sum ^= mat[i];
    return sum;
}

static void make_zeros(void) {
    uint32_t op[32], sq[32];
    op[0] = 0x82F63B78u; /* one zero bit */
    for (int i = 1; i < 32; i++) op[i] = 1u << (i - 1);
    for (int b = 0; b < 3; b++) { /* 2, 4, 8 zero bits: one zero byte */
        for (int i = 0; i < 32; i++) sq[i] = gf2_times(op, op[i]);
        memcpy(op, sq, sizeof op);
    }
    memcpy(zeros_op[0], op, sizeof op);
    for (int k = 1; k < 64; k++)
        for (int i = 0; i < 32; i++) zeros_op[k][i] = gf2_times(zeros_op[k - 1], zeros_op[k - 1][i]);
}

uint32_t loip_crc32c_shift(uint32_t crc, uint64_t n) {
    pthread_once(&zeros_once, make_zeros);
    for (int k = 0; n; k++, n >>= 1)
        if (n & 1) crc = gf2_times(zeros_op[k], crc);
    return crc;
}

/* The software path alone (the specs check the two agree). */
LOIP_API uint32_t loip_crc32c_portable(uint32_t crc, const void *data, uint64_t n) {
    return ~crc_sw(~crc, data, n);
}
