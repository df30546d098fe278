/* AMX kernels: the BF16 weight products on Intel AMX tiles (AMX-TILE, AMX-BF16), exactly.
 * Built with -mamx-tile -mamx-bf16 and AVX-512 for this file only; loip_kernels_amx() checks
 * CPUID and asks Linux for the tile state (arch_prctl) before handing the variant out. Every
 * other entry of the variant (f32/f16 weights, attention helpers, rmsnorm) is avx512's.
 *
 * Exactness. TDPBF16PS multiplies bf16 pairs and accumulates in fp32. Activations are fp32, so
 * each x is split into three bf16 parts x = h + m + l exactly, by truncation: h = x with the low
 * 16 bits cleared, r = x - h (exact: r is a multiple of x's fp32 ulp below h's bf16 ulp, so it
 * has at most 16 significant bits), m = r truncated the same way, l = r - m (at most 8
 * significant bits left, so l is a bf16 exactly). Each bf16 x bf16 product has at most 16
 * significant bits, exact in fp32, so W.x = W.h + W.m + W.l differs from an fp32 FMA dot product
 * only in the order (and count, 3 per column) of its fp32 additions: the usual dot-product bound
 * |err| <= gamma(3n+1) * sum |w_i x_i| (gamma(k) = k u / (1 - k u), u = 2^-24).
 * The exceptions are AMX's flushing: TDPBF16PS treats denormal inputs as zero and flushes denormal
 * results. A part below 2^-126 (x itself, or m and l when |x| < 2^-110) is dropped, as is a
 * denormal weight, and partial sums below 2^-126 become zero: each costs at most 2^-126 per term,
 * so the bound gains 2^-126 * (3n + sum |w_i| + sum |x_i|) — nothing at the scale of any model's
 * activations (|x| ~ 1e-3..1e3) but stated here and tested. Inf and NaN in x give h = x (a NaN
 * kept quiet), m = l = 0, so they propagate as in the fp32 path.
 *
 * Layout (one worker's rows [r0, r1), all n tokens). C = tokens x rows, which is Y's own layout
 * (Y[t*ldy + r]), so the accumulators load from and store to Y with a stride and carry across
 * column blocks there. A = one part of 16 tokens x 32 columns: the split writes it row-major,
 * as the activations lie. B = 16 column pairs x 16 weight rows: the weights transposed as 32-bit
 * pairs (TDPBF16PS's pair-interleaved layout), packed once per 32-row sweep and column block and
 * reused by every token tile. Tiles: C 0..3 = 2 token tiles x 2 row tiles, B 4..5 = 2 row tiles,
 * A 6..7 = one part of 2 token tiles: per 32 columns, 2 B loads and 6 A loads feed 12 TDPBF16PS.
 * Each accumulator receives, per 32 columns in column order, the h, m and l products in that
 * order, whatever n, so matvec (n = 1, the same code) equals matmul bit for bit.
 *
 * Blocking (from the cache size and the traffic, not from measurements): the split parts of a
 * panel of NB tokens x KC columns (3 x 2 bytes each) take at most half of L2 (sysconf). Every
 * weight is read (and packed) once per NB tokens, 2 bytes each; every accumulator goes through
 * Y (4 bytes in, 4 out) once per KC columns: traffic 2/NB + 8/KC per multiply-add, smallest for
 * a fixed panel NB x KC at KC = 4 NB. Each sweep's packed weights (2 x KC x 32 bytes) sit in
 * L1/L2, and the next sweep's weights are prefetched while the current one computes. */
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cpu/kernels.h"

#define AI static inline __attribute__((always_inline))
#define EXPORT __attribute__((visibility("default")))

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

enum { TILE_ELTS = 512 }; /* bf16 elements in one 16 x 64-byte tile */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

/* ---- per-thread buffers ------------------------------------------------------------------- */

typedef struct {
    uint16_t *buf;
    size_t bytes;
} scratch;

static pthread_key_t buf_key;
static void buf_free(void *p) {
    scratch *s = p;
    free(s->buf);
    free(s);
}

/* A 64-byte aligned buffer of at least `bytes`, kept for the thread's next calls. */
static uint16_t *thread_buf(size_t bytes) {
    scratch *s = pthread_getspecific(buf_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s) return NULL;
        pthread_setspecific(buf_key, s);
    }
    if (s->bytes < bytes) {
        free(s->buf);
        s->buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
        s->bytes = s->buf ? bytes : 0;
    }
    return s->buf;
}

/* ---- splitting activations ---------------------------------------------------------------- */

/* The three parts of 16 floats, as the high 16 bits of each 32-bit lane. */
AI void split16(__m512 x, __m512i *h, __m512i *m, __m512i *l) {
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    __m512i xb = _mm512_castps_si512(x);
    __mmask16 special = _mm512_fpclass_ps_mask(x, 0x01 | 0x08 | 0x10 | 0x80); /* NaN, inf */
    __mmask16 nan = _mm512_fpclass_ps_mask(x, 0x01 | 0x80);
    __m512i hb = _mm512_and_si512(xb, hi);
    hb = _mm512_mask_or_epi32(hb, nan, hb, _mm512_set1_epi32(0x7fc00000)); /* stay NaN */
    __m512 r = _mm512_maskz_sub_ps((__mmask16)~special, x, _mm512_castsi512_ps(hb));
    __m512i mb = _mm512_and_si512(_mm512_castps_si512(r), hi);
    __m512 lo = _mm512_sub_ps(r, _mm512_castsi512_ps(mb));
    *h = hb;
    *m = mb;
    *l = _mm512_castps_si512(lo);
}

/* The high halves of a (lanes 0..15) and b (16..31) as 32 bf16. */
AI __m512i pack_hi(__m512i a, __m512i b) {
    const __m512i odd = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37,
                                         35, 33, 31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7,
                                         5, 3, 1);
    return _mm512_permutex2var_epi16(a, odd, b);
}

/* Parts of tokens [t0, t0+nb) x columns [k0, k0+kc) into Xp: for token tile tt, column step s
 * (32 columns) and part p, one A tile at Xp + ((tt*ns + s)*3 + p)*TILE_ELTS, a token per 64-byte
 * row. Tokens past nb and columns past kc are zeros. */
static void split_panel(uint16_t *Xp, const float *X, size_t cols, size_t t0, size_t nb,
                        size_t ntt, size_t k0, size_t kc, size_t ns) {
    for (size_t tt = 0; tt < ntt; tt++)
        for (size_t i = 0; i < 16; i++) {
            size_t t = tt * 16 + i;
            const float *x = X + (t0 + t) * cols + k0;
            for (size_t s = 0; s < ns; s++) {
                uint16_t *dst = Xp + (tt * ns + s) * 3 * TILE_ELTS + i * 32;
                __m512i h, m, l;
                if (t >= nb) {
                    h = m = l = _mm512_setzero_si512();
                } else {
                    size_t c = s * 32, len = kc - c < 32 ? kc - c : 32;
                    __mmask16 m0 = len >= 16 ? 0xffff : (__mmask16)((1u << len) - 1);
                    __mmask16 m1 = len >= 32 ? 0xffff
                                   : len > 16 ? (__mmask16)((1u << (len - 16)) - 1)
                                              : 0;
                    __m512i h0, m0v, l0, h1, m1v, l1;
                    split16(_mm512_maskz_loadu_ps(m0, x + c), &h0, &m0v, &l0);
                    split16(_mm512_maskz_loadu_ps(m1, x + c + 16), &h1, &m1v, &l1);
                    h = pack_hi(h0, h1);
                    m = pack_hi(m0v, m1v);
                    l = pack_hi(l0, l1);
                }
                _mm512_store_si512(dst, h);
                _mm512_store_si512(dst + TILE_ELTS, m);
                _mm512_store_si512(dst + 2 * TILE_ELTS, l);
            }
        }
}

/* ---- packing weights ---------------------------------------------------------------------- */

/* 16 x 16 transpose of 32-bit elements (here bf16 pairs). */
AI void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* u[4g + j] holds, in each 128-bit lane L, element (row 4g + ·, column 4L + j). */
    for (int g = 0; g < 4; g += 2)
        for (int j = 0; j < 4; j++) {
            t[g * 4 + j] = _mm512_shuffle_i32x4(u[g * 4 + j], u[(g + 1) * 4 + j], 0x88);
            t[(g + 1) * 4 + j] = _mm512_shuffle_i32x4(u[g * 4 + j], u[(g + 1) * 4 + j], 0xdd);
        }
    /* t[0..3]: rows 0..7 lanes L=0,2 | t[4..7]: rows 0..7 lanes 1,3; likewise t[8..15] for
     * rows 8..15. Combine the halves. */
    for (int j = 0; j < 4; j++) {
        r[j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0x88);
        r[4 + j] = _mm512_shuffle_i32x4(t[4 + j], t[12 + j], 0x88);
        r[8 + j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0xdd);
        r[12 + j] = _mm512_shuffle_i32x4(t[4 + j], t[12 + j], 0xdd);
    }
}

/* Weight rows [r, r + nr) (nr <= 32) x columns [k0, k0+kc) into Wp: for row tile i and column
 * step s, one B tile at Wp + (i*ns + s)*TILE_ELTS whose row q holds, for each of 16 weight
 * rows, the pair of columns (2q, 2q+1). Rows past nr and columns past kc are zeros. */
static void pack_weights(uint16_t *Wp, const uint16_t *W, size_t cols, size_t r, size_t nr,
                         size_t k0, size_t kc, size_t ns) {
    for (size_t i = 0; i < 2; i++)
        for (size_t s = 0; s < ns; s++) {
            size_t c = k0 + s * 32, len = kc - s * 32 < 32 ? kc - s * 32 : 32;
            __mmask32 mk = len >= 32 ? 0xffffffffu : (__mmask32)((1u << len) - 1);
            __m512i v[16];
            for (size_t j = 0; j < 16; j++) {
                size_t row = i * 16 + j;
                v[j] = row < nr ? _mm512_maskz_loadu_epi16(mk, W + (r + row) * cols + c)
                                : _mm512_setzero_si512();
            }
            transpose16(v);
            uint16_t *dst = Wp + (i * ns + s) * TILE_ELTS;
            for (int q = 0; q < 16; q++) _mm512_store_si512(dst + q * 32, v[q]);
        }
}

/* ---- the tile loop ------------------------------------------------------------------------ */

/* The next weight block (the next sweep's rows, or the next column block's first sweep), fetched
 * into L2 a few lines per column step while the current block computes: packing reads the
 * weights from memory, and without this the packing loads wait on every miss. */
typedef struct {
    const char *base; /* first byte of the block's first row */
    size_t rowb, lines_per_row, next, total, per_step;
} prefetcher;

AI void prefetch_some(prefetcher *p) {
    for (size_t k = 0; k < p->per_step && p->next < p->total; k++, p->next++) {
        size_t row = p->next / p->lines_per_row, line = p->next % p->lines_per_row;
        _mm_prefetch(p->base + row * p->rowb + line * 64, _MM_HINT_T1);
    }
}

typedef struct {
    float *Y;
    size_t ldy;
    size_t nt[2], nr[2]; /* valid tokens of each token tile, rows of each row tile (0..16) */
    float tmp[16 * 16] __attribute__((aligned(64)));
} ctx_c;

/* Accumulator tile `ti` (a constant) for token tile j, row tile i: Y directly when whole, else
 * through tmp with zeros outside. */
#define C_LOAD(ti, j, i, fresh)                                                                 \
    do {                                                                                       \
        float *y_ = cc->Y + (j) * 16 * cc->ldy + (i) * 16;                                     \
        if (fresh) _tile_zero(ti);                                                             \
        else if (cc->nt[j] == 16 && cc->nr[i] == 16) _tile_loadd(ti, y_, cc->ldy * 4);         \
        else {                                                                                 \
            memset(cc->tmp, 0, sizeof cc->tmp);                                                \
            for (size_t a_ = 0; a_ < cc->nt[j]; a_++)                                          \
                memcpy(cc->tmp + a_ * 16, y_ + a_ * cc->ldy, cc->nr[i] * 4);                   \
            _tile_loadd(ti, cc->tmp, 64);                                                      \
        }                                                                                      \
    } while (0)
#define C_STORE(ti, j, i)                                                                      \
    do {                                                                                       \
        float *y_ = cc->Y + (j) * 16 * cc->ldy + (i) * 16;                                     \
        if (cc->nt[j] == 16 && cc->nr[i] == 16) _tile_stored(ti, y_, cc->ldy * 4);             \
        else {                                                                                 \
            _tile_stored(ti, cc->tmp, 64);                                                     \
            for (size_t a_ = 0; a_ < cc->nt[j]; a_++)                                          \
                memcpy(y_ + a_ * cc->ldy, cc->tmp + a_ * 16, cc->nr[i] * 4);                   \
        }                                                                                      \
    } while (0)

/* TT token tiles x TR row tiles (each 1 or 2, constants at every call site) over ns column
 * steps. a: the first token tile's parts (the second follows at a + a_next); b: the packed
 * weights of row tile 0 (row tile 1 at b + b_next). */
AI void tiles(const int TT, const int TR, ctx_c *cc, int fresh, const uint16_t *a, size_t a_next,
              const uint16_t *b, size_t b_next, size_t ns, prefetcher *pf) {
    C_LOAD(0, 0, 0, fresh);
    if (TR > 1) C_LOAD(1, 0, 1, fresh);
    if (TT > 1) C_LOAD(2, 1, 0, fresh);
    if (TT > 1 && TR > 1) C_LOAD(3, 1, 1, fresh);
    for (size_t s = 0; s < ns; s++) {
        prefetch_some(pf);
        _tile_loadd(4, b + s * TILE_ELTS, 64);
        if (TR > 1) _tile_loadd(5, b + b_next + s * TILE_ELTS, 64);
        const uint16_t *ap = a + s * 3 * TILE_ELTS;
        for (int p = 0; p < 3; p++) {
            _tile_loadd(6, ap + p * TILE_ELTS, 64);
            if (TT > 1) _tile_loadd(7, ap + a_next + p * TILE_ELTS, 64);
            _tile_dpbf16ps(0, 6, 4);
            if (TR > 1) _tile_dpbf16ps(1, 6, 5);
            if (TT > 1) _tile_dpbf16ps(2, 7, 4);
            if (TT > 1 && TR > 1) _tile_dpbf16ps(3, 7, 5);
        }
    }
    C_STORE(0, 0, 0);
    if (TR > 1) C_STORE(1, 0, 1);
    if (TT > 1) C_STORE(2, 1, 0);
    if (TT > 1 && TR > 1) C_STORE(3, 1, 1);
}

static size_t panel_nb, panel_kc; /* NB, KC: multiples of 32, KC = 4 NB; set once by amx_build */

static void matmul_bf16(float *Y, size_t ldy, const void *Wv, const float *X, size_t n, size_t r0,
                        size_t r1, size_t cols) {
    if (r0 >= r1 || n == 0) return;
    if (cols == 0) { /* the empty sum, as the other variants write it */
        for (size_t t = 0; t < n; t++)
            for (size_t r = r0; r < r1; r++) Y[t * ldy + r] = 0.0f;
        return;
    }
    const uint16_t *W = Wv;
    size_t cols32 = (cols + 31) / 32 * 32, n16 = (n + 15) / 16 * 16;
    /* Panels of at most panel_kc x panel_nb, equal-sized (a last sliver would waste packing). */
    size_t nkb = (cols32 + panel_kc - 1) / panel_kc, ntb = (n16 + panel_nb - 1) / panel_nb;
    size_t KC = ((cols + nkb - 1) / nkb + 31) / 32 * 32;
    size_t NB = ((n + ntb - 1) / ntb + 15) / 16 * 16;
    size_t xp_elts = (NB / 16) * (KC / 32) * 3 * TILE_ELTS, wp_elts = 2 * (KC / 32) * TILE_ELTS;
    uint16_t *Xp = thread_buf((xp_elts + wp_elts) * 2);
    if (!Xp) abort(); /* no error path in the kernel interface; out of memory for a few MB */
    uint16_t *Wp = Xp + xp_elts;

    tilecfg cfg = {.palette = 1};
    for (int i = 0; i < 8; i++) cfg.colsb[i] = 64, cfg.rows[i] = 16;
    _tile_loadconfig(&cfg);
    ctx_c cc = {.ldy = ldy};

    for (size_t t0 = 0; t0 < n; t0 += NB) {
        size_t nb = n - t0 < NB ? n - t0 : NB, ntt = (nb + 15) / 16;
        for (size_t k0 = 0; k0 < cols; k0 += KC) {
            size_t kc = cols - k0 < KC ? cols - k0 : KC, ns = (kc + 31) / 32;
            split_panel(Xp, X, cols, t0, nb, ntt, k0, kc, ns);
            for (size_t r = r0; r < r1; r += 32) {
                size_t nr = r1 - r < 32 ? r1 - r : 32;
                pack_weights(Wp, W, cols, r, nr, k0, kc, ns);
                prefetcher pf = {.rowb = cols * 2};
                size_t nk0 = k0, nkc = kc, nrow = r + 32;
                if (nrow >= r1) nrow = r0, nk0 = k0 + KC, nkc = cols - nk0 < KC ? cols - nk0 : KC;
                if (nk0 < cols) {
                    size_t nnr = r1 - nrow < 32 ? r1 - nrow : 32;
                    pf.base = (const char *)(W + nrow * cols + nk0);
                    pf.lines_per_row = (nkc * 2 + 63) / 64 + 1;
                    pf.total = nnr * pf.lines_per_row;
                    size_t steps = (ntt + 1) / 2 * ns;
                    pf.per_step = (pf.total + steps - 1) / steps;
                }
                cc.nr[0] = nr < 16 ? nr : 16;
                cc.nr[1] = nr - cc.nr[0];
                for (size_t tt = 0; tt < ntt; tt += 2) {
                    size_t tb = tt * 16;
                    cc.Y = Y + (t0 + tb) * ldy + r;
                    cc.nt[0] = nb - tb < 16 ? nb - tb : 16;
                    cc.nt[1] = nb - tb > 16 ? (nb - tb - 16 < 16 ? nb - tb - 16 : 16) : 0;
                    const uint16_t *a = Xp + tt * ns * 3 * TILE_ELTS;
                    size_t an = ns * 3 * TILE_ELTS, bn = ns * TILE_ELTS;
                    int fresh = k0 == 0;
                    if (cc.nt[1] && cc.nr[1]) tiles(2, 2, &cc, fresh, a, an, Wp, bn, ns, &pf);
                    else if (cc.nt[1]) tiles(2, 1, &cc, fresh, a, an, Wp, bn, ns, &pf);
                    else if (cc.nr[1]) tiles(1, 2, &cc, fresh, a, an, Wp, bn, ns, &pf);
                    else tiles(1, 1, &cc, fresh, a, an, Wp, bn, ns, &pf);
                }
            }
        }
    }
    _tile_release();
}

/* ---- one token ---------------------------------------------------------------------------- */

/* Decode is memory-bound: packing weights would cost more than reading them. So here the tiles
 * take the other orientation: A = 16 weight rows x 32 columns loaded straight from W (row
 * stride), B = the token's parts as 16 column pairs x 1 (4-byte rows: exactly the split's
 * output), C = 16 rows x 1, contiguous in y. Per accumulator the sequence of TDPBF16PS updates
 * is the one matmul_bf16 makes (per 32 columns in order, h then m then l), and each update adds
 * the same products (the pairs' operands merely swap sides; bf16 x bf16 products are exact and
 * commute), so matvec still equals matmul bit for bit. Tiles: C 0..1 (32 rows), A 2..3, B 4..6.
 * Weight rows are prefetched PF_BYTES ahead, the avx512 matvec's distance (kernels_avx512.c),
 * since the tile loads alone leave the core with too few misses in flight. */
#define PF_BYTES 512

/* Rows [r, r + nv) (nv <= 16) x columns [c, c + len) (len <= 32) into a zeroed 16 x 32 tile. */
static void pad_rows(uint16_t *dst, const uint16_t *W, size_t cols, size_t r, size_t nv, size_t c,
                     size_t len) {
    __mmask32 mk = len >= 32 ? 0xffffffffu : (__mmask32)((1u << len) - 1);
    for (size_t i = 0; i < 16; i++)
        _mm512_store_si512(dst + i * 32, i < nv ? _mm512_maskz_loadu_epi16(mk, W + (r + i) * cols + c)
                                                : _mm512_setzero_si512());
}

static void matvec_bf16(float *y, const void *Wv, const float *x, size_t r0, size_t r1,
                        size_t cols) {
    if (r0 >= r1) return;
    if (cols == 0) {
        for (size_t r = r0; r < r1; r++) y[r] = 0.0f;
        return;
    }
    const uint16_t *W = Wv;
    size_t ns = (cols + 31) / 32, nfull = cols / 32;
    uint16_t *xp = thread_buf(ns * 3 * 64 + 2 * 1024);
    if (!xp) abort();
    uint16_t *pad0 = xp + ns * 3 * 32, *pad1 = pad0 + TILE_ELTS;
    for (size_t s = 0; s < ns; s++) {
        size_t c = s * 32, len = cols - c < 32 ? cols - c : 32;
        __mmask16 m0 = len >= 16 ? 0xffff : (__mmask16)((1u << len) - 1);
        __mmask16 m1 = len >= 32 ? 0xffff : len > 16 ? (__mmask16)((1u << (len - 16)) - 1) : 0;
        __m512i h0, mm0, l0, h1, mm1, l1;
        split16(_mm512_maskz_loadu_ps(m0, x + c), &h0, &mm0, &l0);
        split16(_mm512_maskz_loadu_ps(m1, x + c + 16), &h1, &mm1, &l1);
        _mm512_store_si512(xp + (s * 3 + 0) * 32, pack_hi(h0, h1));
        _mm512_store_si512(xp + (s * 3 + 1) * 32, pack_hi(mm0, mm1));
        _mm512_store_si512(xp + (s * 3 + 2) * 32, pack_hi(l0, l1));
    }
    tilecfg cfg = {.palette = 1};
    for (int i = 0; i < 7; i++) cfg.rows[i] = 16, cfg.colsb[i] = (i == 2 || i == 3) ? 64 : 4;
    _tile_loadconfig(&cfg);
    float tmp[16];
    const size_t rowb = cols * 2;
    for (size_t r = r0; r < r1; r += 32) {
        size_t nr = r1 - r < 32 ? r1 - r : 32, v0 = nr < 16 ? nr : 16, v1 = nr - v0;
        _tile_zero(0);
        _tile_zero(1);
        for (size_t s = 0; s < ns; s++) {
            int direct = s < nfull;
            if (direct && v0 == 16) {
                const char *w0 = (const char *)(W + r * cols + s * 32);
                /* past a row's end, the same distance into the next sweep's row */
                size_t ahead = s * 64 + PF_BYTES < rowb ? PF_BYTES : PF_BYTES + 31 * rowb;
                for (size_t i = 0; i < 32; i++) _mm_prefetch(w0 + i * rowb + ahead, _MM_HINT_T0);
                _tile_loadd(2, w0, rowb);
            } else {
                pad_rows(pad0, W, cols, r, v0, s * 32, cols - s * 32 < 32 ? cols - s * 32 : 32);
                _tile_loadd(2, pad0, 64);
            }
            if (v1) {
                if (direct && v1 == 16) _tile_loadd(3, W + (r + 16) * cols + s * 32, rowb);
                else {
                    pad_rows(pad1, W, cols, r + 16, v1, s * 32,
                             cols - s * 32 < 32 ? cols - s * 32 : 32);
                    _tile_loadd(3, pad1, 64);
                }
            }
            const uint16_t *b = xp + s * 3 * 32;
            _tile_loadd(4, b, 4);
            _tile_loadd(5, b + 32, 4);
            _tile_loadd(6, b + 64, 4);
            _tile_dpbf16ps(0, 2, 4);
            if (v1) _tile_dpbf16ps(1, 3, 4);
            _tile_dpbf16ps(0, 2, 5);
            if (v1) _tile_dpbf16ps(1, 3, 5);
            _tile_dpbf16ps(0, 2, 6);
            if (v1) _tile_dpbf16ps(1, 3, 6);
        }
        if (v0 == 16) _tile_stored(0, y + r, 4);
        else {
            _tile_stored(0, tmp, 4);
            memcpy(y + r, tmp, v0 * 4);
        }
        if (v1 == 16) _tile_stored(1, y + r + 16, 4);
        else if (v1) {
            _tile_stored(1, tmp, 4);
            memcpy(y + r + 16, tmp, v1 * 4);
        }
    }
    _tile_release();
}

/* ---- selection ---------------------------------------------------------------------------- */

static loip_kernels amx, amx_auto;
static const loip_kernels *amx_ok;
static loip_matmul_fn base_matmul_bf16; /* avx512's */

/* amx-auto: many tokens on AMX tiles (weights packed once, shared by every token tile), few
 * (decode, a short draft's verification) through avx512, which reads the weights as they lie. */
static void matmul_bf16_auto(float *Y, size_t ldy, const void *W, const float *X, size_t n,
                             size_t r0, size_t r1, size_t cols) {
    if (n >= loip_kernels_amx_rows(0)) matmul_bf16(Y, ldy, W, X, n, r0, r1, cols);
    else base_matmul_bf16(Y, ldy, W, X, n, r0, r1, cols);
}
static size_t auto_bitwise_below(void) { return loip_kernels_amx_rows(0); }
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

/* CPUID.(EAX=7,ECX=0):EDX bit 24 AMX-TILE, bit 22 AMX-BF16; then Linux must grant this process
 * the tile data state (ARCH_REQ_XCOMP_PERM, Linux >= 5.16), or the first tile instruction
 * faults. Runs once per process; the permission covers all its threads. */
__attribute__((noinline)) static void amx_build(const loip_kernels *base) {
    if (pthread_key_create(&buf_key, buf_free) != 0) return;
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (l2 <= 0) l2 = 1 << 20; /* unknown: assume a 1 MiB L2 */
    /* 3 parts x 2 bytes x NB x KC <= l2 / 2 with KC = 4 NB, NB a multiple of 32 (at least 32). */
    size_t nb = 32;
    while (6 * (nb + 32) * 4 * (nb + 32) <= (size_t)l2 / 2) nb += 32;
    panel_nb = nb, panel_kc = 4 * nb;
    amx = *base;
    amx.name = "amx";
    amx.matmul[LOIP_KDT_BF16] = matmul_bf16;
    amx.matvec[LOIP_KDT_BF16] = matvec_bf16;
    amx_auto = *base;
    amx_auto.name = "amx-auto";
    base_matmul_bf16 = base->matmul[LOIP_KDT_BF16];
    amx_auto.matmul[LOIP_KDT_BF16] = matmul_bf16_auto;
    amx_auto.bitwise_below = auto_bitwise_below;
    amx_ok = &amx;
}

/* Only scalar code until the checks pass; the table is built (with whatever vector moves the
 * compiler picks) in amx_build, on a CPU known to have AVX-512 and AMX. */
static void amx_init(void) {
    const loip_kernels *base = loip_kernels_avx512();
    if (!base) return;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    if (!(d & (1u << 24)) || !(d & (1u << 22))) return;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return;
    amx_build(base);
}

/* Called on any x86-64 CPU: it and amx_init must compile to no AVX-512 or AMX instructions. */
EXPORT const loip_kernels *loip_kernels_amx(void) {
    pthread_once(&amx_once, amx_init);
    return amx_ok;
}

EXPORT const loip_kernels *loip_kernels_amx_auto(void) {
    return loip_kernels_amx() ? &amx_auto : NULL;
}
