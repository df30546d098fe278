/* test_quant_kernels: the MXFP4 and F8 (E4M3FN, 128x128 block scales) dtypes and their kernels,
 * every CPU variant (ref, avx2, avx512 where the CPU has them: the AVX2 kernels run on an
 * AVX-512 machine too, called directly).
 *
 * What is checked:
 *  - decoding, against formulas written here (ldexp): all 16 E2M1 codes, all 256 E8M0 scales
 *    (0xFF NaN, 0 = 2^-127), all 256 E4M3FN codes (0x7F and 0xFF NaN, subnormals), through
 *    loip_dequantize and loip_convert;
 *  - loip_dtype_bytes / loip_dtype_check / loip_f8_pack: sizes, and errors naming the tensor
 *    and the field (an MXFP4 row that is not whole blocks, a weight_scale_inv of the wrong
 *    shape);
 *  - matvec and matmul of each variant: for MXFP4 (and the reference's F8) bit for bit the
 *    variant's own f32 kernel on the dequantized matrix (quant.h; NaN where it is NaN); every
 *    one NaN where a weight is NaN (a NaN code, an E8M0 0xFF) and within TOL * sum|w*x| of an
 *    fp64 oracle, within 2 TOL of the reference; matmul's rows equal matvec's for n = 1..7; rows
 *    outside [r0, r1) untouched; shapes with rows not a multiple of the SIMD tiles, F8 columns
 *    not a multiple of 128 (or of 16 / 8), row ranges crossing F8's 128-row groups, unaligned
 *    operands; random codes incl. the NaN codes and E8M0 extremes.
 * Exit status: 0 all passed, 1 a failure. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "loip.h"

#define TOL 1e-5

static int n_pass, n_fail;

static void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int ok, const char *fmt, ...) {
    if (ok) {
        n_pass++;
        return;
    }
    if (++n_fail <= 40) {
        va_list ap;
        va_start(ap, fmt);
        fputs("FAIL: ", stdout);
        vprintf(fmt, ap);
        fputc('\n', stdout);
        va_end(ap);
    }
}

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint64_t next_u64(void) {
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return rng * 0x2545f4914f6cdd1dull;
}
static float uniform(void) { return (float)((next_u64() >> 40) * (2.0 / 16777216.0) - 1.0); }

static void *xalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test_quant_kernels: out of memory\n");
        exit(1);
    }
    return p;
}

/* ---- independent decoders ------------------------------------------------------------------ */

static double e2m1(int n) {
    int s = n >> 3, e = (n >> 1) & 3, m = n & 1;
    double v = e == 0 ? m * 0.5 : ldexp(1.0 + m * 0.5, e - 1);
    return s ? -v : v;
}
static double e8m0(int e) { return e == 255 ? NAN : ldexp(1.0, e - 127); }
static double e4m3(int b) {
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
    return s ? -v : v;
}

static int same(float a, float b) { /* bit for bit, any NaN equal to any NaN */
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return memcmp(&a, &b, 4) == 0;
}

/* ---- decoding, sizes, errors --------------------------------------------------------------- */

static void test_decoding(void) {
    /* MXFP4: one block per scale byte e; its 32 codes are 0..15 twice (low then high nibble). */
    uint8_t blk[256 * 17];
    for (int e = 0; e < 256; e++) {
        blk[e * 17] = (uint8_t)e;
        for (int j = 0; j < 16; j++) blk[e * 17 + 1 + j] = (uint8_t)(j | (15 - j) << 4);
    }
    float *f = xalloc(256 * 32 * 4), *g = xalloc(256 * 32 * 4);
    check(loip_dequantize(f, blk, LOIP_MXFP4, 256, 32) == LOIP_OK, "dequantize mxfp4");
    check(loip_convert(g, LOIP_F32, blk, LOIP_MXFP4, 256 * 32) == LOIP_OK, "convert mxfp4");
    int ok = 1, okc = 1;
    for (int e = 0; e < 256; e++)
        for (int j = 0; j < 32; j++) {
            int code = j < 16 ? j : 15 - (j - 16);
            double want = e2m1(code) * e8m0(e);
            float got = f[e * 32 + j];
            if (isnan(want)) ok &= isnan(got) != 0;
            else if (isinf((float)want)) ok &= isinf(got) && (got > 0) == (want > 0);
            else ok &= got == (float)want && (float)want == want && !signbit(got) == !signbit(want);
            okc &= same(got, g[e * 32 + j]);
        }
    check(ok, "MXFP4: all E2M1 codes under all E8M0 scales (0xFF NaN, 0 = 2^-127)");
    check(okc, "loip_convert(MXFP4 -> F32) equals loip_dequantize");
    check(loip_convert(g, LOIP_F32, blk, LOIP_MXFP4, 33) == LOIP_ESHAPE,
          "convert of 33 MXFP4 elements is refused");

    /* F8: one row of all 256 codes, scale 1 (exact), then a group with scale 0.375. */
    uint8_t w[2 * 256];
    for (int b = 0; b < 256; b++) w[b] = w[256 + b] = (uint8_t)b;
    float sc[2] = {1.0f, 0.375f};
    uint64_t nb = loip_dtype_bytes(LOIP_F8_E4M3, 1, 256);
    uint8_t *packed = xalloc(nb);
    check(loip_f8_pack(packed, w, sc, 1, 256, 1, 2, "t") == LOIP_OK, "f8_pack 1x256");
    /* the packed layout: the group's 2 scales, then the row */
    check(nb == 8 + 256 && !memcmp(packed, sc, 8) && !memcmp(packed + 8, w, 256),
          "F8 layout: [scales][rows] per group of 128 rows");
    check(loip_dequantize(f, packed, LOIP_F8_E4M3, 1, 256) == LOIP_OK, "dequantize f8");
    ok = 1;
    for (int b = 0; b < 256; b++) {
        double want = e4m3(b) * (b < 128 ? 1.0 : 0.375);
        if (isnan(want)) ok &= isnan(f[b]) != 0;
        else ok &= f[b] == (float)want && !signbit(f[b]) == !signbit(want);
    }
    check(ok, "F8: all 256 E4M3FN codes (0x7F, 0xFF NaN; subnormals; -0) times their scale");
    ok = isnan(f[0x7F]) && isnan(f[0xFF]) && f[0x7E] == 448.0f && f[1] == (float)ldexp(1, -9);
    check(ok, "F8: 0x7E = 448, 0x01 = 2^-9, 0x7F and 0xFF NaN");
    free(packed), free(f), free(g);
}

static void test_sizes_and_errors(void) {
    check(loip_dtype_bytes(LOIP_MXFP4, 3, 64) == 3 * 34, "MXFP4 bytes 3x64");
    check(loip_dtype_bytes(LOIP_MXFP4, 3, 48) == 0, "MXFP4 bytes of 48 columns: 0");
    check(loip_dtype_bytes(LOIP_F8_E4M3, 300, 129) == 300 * 129 + 3 * 2 * 4, "F8 bytes 300x129");
    check(loip_dtype_bytes(LOIP_BF16, 3, 5) == 30, "BF16 bytes");
    check(loip_dtype_size(LOIP_MXFP4) == 0 && loip_dtype_size(LOIP_F8_E4M3) == 0,
          "block dtypes have no element size");
    check(loip_dtype_check(LOIP_MXFP4, 4, 2880, "blk.0.ffn_down_exps.weight") == LOIP_OK,
          "MXFP4 2880 columns fit");
    int rc = loip_dtype_check(LOIP_MXFP4, 4, 100, "blk.0.ffn_down_exps.weight");
    const char *msg = loip_last_error();
    check(rc == LOIP_ESHAPE && strstr(msg, "blk.0.ffn_down_exps.weight") &&
              strstr(msg, "row length") && strstr(msg, "100") && strstr(msg, "32"),
          "MXFP4 row of 100: an error naming the tensor and the row length (%s)", msg);

    uint8_t w[300];
    float s[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    uint8_t out[1024];
    memset(w, 0x38, sizeof w); /* 1.0 */
    rc = loip_f8_pack(out, w, s, 2, 150, 2, 2, "model.layers.0.mlp.up_proj.weight");
    msg = loip_last_error();
    check(rc == LOIP_ESHAPE && strstr(msg, "model.layers.0.mlp.up_proj.weight") &&
              strstr(msg, "weight_scale_inv") && strstr(msg, "[2, 2]") && strstr(msg, "[1, 2]"),
          "weight_scale_inv of the wrong shape: an error naming both (%s)", msg);
    check(loip_f8_pack(out, w, s, 2, 150, 1, 1, "x") == LOIP_ESHAPE, "scales [1, 1] for 150 cols");
    check(loip_f8_pack(out, w, s, 2, 150, 1, 2, "x") == LOIP_OK, "scales [1, 2] for [2, 150]");
    float y[2], x[150];
    for (int i = 0; i < 150; i++) x[i] = 1.0f;
    loip_pool *pool = NULL;
    check(loip_pool_new(1, &pool) == LOIP_OK, "pool");
    check(loip_op_matvec(pool, LOIP_F8_E4M3, out, x, y, 2, 150) == LOIP_OK && y[0] == 150.0f &&
              y[1] == 150.0f,
          "loip_op_matvec F8 of ones");
    rc = loip_op_matvec(pool, LOIP_MXFP4, out, x, y, 2, 150);
    msg = loip_last_error();
    check(rc == LOIP_ESHAPE && strstr(msg, "150") && strstr(msg, "MXFP4"),
          "loip_op_matvec MXFP4 with 150 columns refused (%s)", msg);
    loip_pool_free(pool);

    /* the matvec kernels' prefetch distance: a parameter, bounded, results independent of it */
    check(loip_kernels_prefetch() == 1024, "prefetch distance: the default is 1024 bytes");
    rc = loip_kernels_set_prefetch((int64_t)LOIP_KERNELS_PREFETCH_MAX + 1);
    msg = loip_last_error();
    check(rc == LOIP_EINVAL && strstr(msg, "prefetch") && loip_kernels_prefetch() == 1024,
          "prefetch distance above the maximum refused, naming it (%s)", msg);
    check(loip_kernels_set_prefetch(0) == LOIP_OK && loip_kernels_prefetch() == 0, "prefetch off");
    check(loip_kernels_set_prefetch(-1) == LOIP_OK && loip_kernels_prefetch() == 1024,
          "prefetch distance < 0: the default again");
}

/* ---- products ------------------------------------------------------------------------------ */

/* Random weights of dtype dt (LOIP_KDT_MXFP4 / _F8_E4M3) for [rows, cols] at W. extremes:
 * every code and scale byte may occur (NaN, inf, subnormal); else scales stay moderate and F8
 * bytes avoid the NaN codes, so that results are finite. */
static void fill_quant(uint8_t *W, int dt, size_t rows, size_t cols, int extremes) {
    if (dt == LOIP_KDT_MXFP4) {
        size_t n = rows * cols / 32;
        for (size_t b = 0; b < n; b++) {
            uint8_t *p = W + b * 17;
            p[0] = (uint8_t)(extremes ? next_u64() % 256 : 120 + next_u64() % 10);
            for (int j = 0; j < 16; j++) p[1 + j] = (uint8_t)next_u64();
        }
        return;
    }
    size_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
    uint8_t *w = xalloc(rows * cols);
    float *s = xalloc(sr * sc * 4);
    for (size_t i = 0; i < rows * cols; i++) {
        uint8_t b = (uint8_t)next_u64();
        if (!extremes && (b & 0x7F) == 0x7F) b ^= 1;
        w[i] = b;
    }
    for (size_t i = 0; i < sr * sc; i++) {
        float v = (float)ldexp(1.0 + fabs(uniform()), -(int)(next_u64() % 12));
        if (extremes && i % 5 == 3) v = (float)ldexp(1.3, 120); /* huge: products overflow */
        if (extremes && i % 7 == 2) v = (float)ldexp(1.7, -130); /* tiny: subnormals */
        s[i] = v;
    }
    if (loip_f8_pack(W, w, s, (int64_t)rows, (int64_t)cols, (int64_t)sr, (int64_t)sc, "w")) {
        fprintf(stderr, "test_quant_kernels: f8_pack: %s\n", loip_last_error());
        exit(1);
    }
    free(w), free(s);
}

static const float SENTINEL = -12345.0f;

static void test_products(const loip_kernels *k, const loip_kernels *ref, int dt, size_t rows,
                          size_t cols, size_t off, int extremes) {
    enum { NMAX = 7 };
    int32_t ldt = dt == LOIP_KDT_MXFP4 ? LOIP_MXFP4 : LOIP_F8_E4M3;
    const char *dn = dt == LOIP_KDT_MXFP4 ? "mxfp4" : "f8";
    size_t bytes = (size_t)loip_dtype_bytes(ldt, (int64_t)rows, (int64_t)cols);
    uint8_t *base = xalloc(bytes + off + 64), *W = base + off;
    float *D = xalloc(rows * cols * 4), *Xb = xalloc((NMAX * cols + 1) * 4), *X = Xb + (off & 1);
    size_t ldy = rows + 3;
    float *Y = xalloc(NMAX * ldy * 4), *y = xalloc(rows * 4), *yf = xalloc(rows * 4),
          *yr = xalloc(rows * 4);
    fill_quant(W, dt, rows, cols, extremes);
    if (loip_dequantize(D, W, ldt, (int64_t)rows, (int64_t)cols)) {
        printf("FAIL: dequantize: %s\n", loip_last_error());
        n_fail++;
        return;
    }
    for (size_t i = 0; i < NMAX * cols; i++) X[i] = uniform();

    size_t ranges[3][2] = {{0, rows}, {rows > 2 ? 1 : 0, rows > 2 ? rows - 1 : rows},
                           {rows > 130 ? 120 : 0, rows > 130 ? 131 : rows}};
    int ok_bits = 1, ok_exact = 1, ok_ref = 1, ok_untouched = 1, ok_mm = 1;
    /* MXFP4 everywhere and F8 in the reference: bit for bit the f32 kernel on the dequantized W;
     * the SIMD F8 kernels sum E4M3 * x over a 128-column block, then scale it (quant.h) */
    int bitwise = dt == LOIP_KDT_MXFP4 || k == ref;
    double worst = 0;
    for (int g = 0; g < 3; g++) {
        size_t r0 = ranges[g][0], r1 = ranges[g][1];
        for (size_t t = 0; t < NMAX; t++) {
            const float *x = X + t * cols;
            for (size_t r = 0; r < rows; r++) y[r] = yf[r] = yr[r] = SENTINEL;
            k->matvec[dt](y, W, x, r0, r1, cols);
            k->matvec[LOIP_KDT_F32](yf, D, x, r0, r1, cols);
            ref->matvec[dt](yr, W, x, r0, r1, cols);
            for (size_t r = 0; r < rows; r++) {
                if (r < r0 || r >= r1) {
                    ok_untouched &= y[r] == SENTINEL;
                    continue;
                }
                if (bitwise) ok_bits &= same(y[r], yf[r]);
                double e = 0, m = 0;
                int w_nan = 0, w_inf = 0;
                for (size_t c = 0; c < cols; c++) {
                    float w = D[r * cols + c];
                    w_nan |= isnan(w) != 0, w_inf |= isinf(w) != 0;
                    double p = (double)w * x[c];
                    e += p, m += fabs(p);
                }
                if (w_nan || w_inf || m > 1e36) { /* a NaN weight: NaN; else sums may overflow */
                    if (w_nan && !w_inf) ok_exact &= isnan(y[r]) != 0;
                    continue;
                }
                double tol = TOL * m + 1e-30, err = fabs(y[r] - e);
                if (err / tol > worst) worst = err / tol;
                ok_exact &= err <= tol;
                ok_ref &= fabs(y[r] - yr[r]) <= 2 * tol;
            }
        }
        /* matmul: every n up to NMAX, each token's row as matvec's, bit for bit */
        for (size_t n = 1; n <= NMAX; n++) {
            for (size_t i = 0; i < NMAX * ldy; i++) Y[i] = SENTINEL;
            k->matmul[dt](Y, ldy, W, X, n, r0, r1, cols);
            for (size_t t = 0; t < n; t++) {
                k->matvec[dt](y, W, X + t * cols, r0, r1, cols);
                for (size_t r = 0; r < ldy; r++) {
                    float v = Y[t * ldy + r];
                    if (r < r0 || r >= r1) ok_untouched &= v == SENTINEL;
                    else ok_mm &= same(v, y[r]);
                }
            }
        }
    }
    const char *what = extremes ? " (all codes and scales)" : "";
    if (bitwise)
        check(ok_bits, "%s %s %zux%zu off %zu%s: matvec equals its f32 kernel on the dequantized W",
              k->name, dn, rows, cols, off, what);
    check(ok_exact, "%s %s %zux%zu off %zu%s: within TOL of fp64 (worst %.2f TOL)", k->name, dn,
          rows, cols, off, what, worst);
    check(ok_ref, "%s %s %zux%zu%s: within 2 TOL of the reference", k->name, dn, rows, cols, what);
    check(ok_untouched, "%s %s %zux%zu: no writes outside [r0, r1)", k->name, dn, rows, cols);
    check(ok_mm, "%s %s %zux%zu%s: matmul rows equal matvec, bit for bit", k->name, dn, rows,
          cols, what);
    free(base), free(D), free(Xb), free(Y), free(y), free(yf), free(yr);
}

/* matvec of every variant gives the same bits whatever the prefetch distance (none, the default,
 * far past the matrix's end) */
static void test_prefetch(const loip_kernels *k) {
    for (int dt = LOIP_KDT_MXFP4; dt <= LOIP_KDT_F8_E4M3; dt++) {
        size_t rows = 37, cols = dt == LOIP_KDT_MXFP4 ? 1024 : 700;
        int32_t ldt = dt == LOIP_KDT_MXFP4 ? LOIP_MXFP4 : LOIP_F8_E4M3;
        uint8_t *W = xalloc((size_t)loip_dtype_bytes(ldt, (int64_t)rows, (int64_t)cols));
        float *x = xalloc(cols * 4), y0[37], y1[37];
        fill_quant(W, dt, rows, cols, 0);
        for (size_t c = 0; c < cols; c++) x[c] = uniform();
        int ok = 1;
        static const int64_t dist[] = {0, 64, 100000};
        k->matvec[dt](y0, W, x, 0, rows, cols);
        for (int d = 0; d < 3; d++) {
            loip_kernels_set_prefetch(dist[d]);
            k->matvec[dt](y1, W, x, 0, rows, cols);
            for (size_t r = 0; r < rows; r++) ok &= same(y0[r], y1[r]);
        }
        loip_kernels_set_prefetch(-1);
        check(ok, "%s %s: matvec the same at every prefetch distance", k->name,
              dt == LOIP_KDT_MXFP4 ? "mxfp4" : "f8");
        free(W), free(x);
    }
}

static void test_variant(const loip_kernels *k, const loip_kernels *ref) {
    test_prefetch(k);
    static const size_t mx_rows[] = {1, 7, 8, 9, 17, 33, 300}; /* (300: past a 256-row sweep) */
    static const size_t mx_cols[] = {32, 64, 96, 544, 2880};
    for (size_t i = 0; i < sizeof mx_rows / sizeof *mx_rows; i++)
        for (size_t j = 0; j < sizeof mx_cols / sizeof *mx_cols; j++)
            test_products(k, ref, LOIP_KDT_MXFP4, mx_rows[i], mx_cols[j], i % 3, 0);
    static const size_t f8_rows[] = {1, 7, 9, 127, 131, 260};
    static const size_t f8_cols[] = {1, 7, 15, 16, 17, 100, 128, 129, 300, 520};
    for (size_t i = 0; i < sizeof f8_rows / sizeof *f8_rows; i++)
        for (size_t j = 0; j < sizeof f8_cols / sizeof *f8_cols; j++)
            if (f8_rows[i] * f8_cols[j] <= 131 * 520)
                test_products(k, ref, LOIP_KDT_F8_E4M3, f8_rows[i], f8_cols[j], j % 3, 0);
    test_products(k, ref, LOIP_KDT_MXFP4, 9, 4096, 1, 1);
    test_products(k, ref, LOIP_KDT_MXFP4, 40, 256, 0, 1);
    test_products(k, ref, LOIP_KDT_F8_E4M3, 131, 300, 2, 1);
    test_products(k, ref, LOIP_KDT_F8_E4M3, 9, 1000, 0, 1);
}

int main(void) {
    test_decoding();
    test_sizes_and_errors();
    const loip_kernels *ref = loip_kernels_ref();
    const loip_kernels *variants[3] = {ref, NULL, NULL};
#if defined(__x86_64__)
    variants[1] = loip_kernels_avx2();
    variants[2] = loip_kernels_avx512();
#endif
    for (int v = 0; v < 3; v++) {
        if (!variants[v]) {
            printf("test_quant_kernels: %s not tested (this CPU lacks it)\n",
                   v == 1 ? "avx2" : "avx512");
            continue;
        }
        test_variant(variants[v], ref);
    }
    printf("test_quant_kernels: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
