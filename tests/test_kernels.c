/* test_kernels: every CPU kernel variant against an fp64 oracle and against the reference.
 *
 * What is checked, and to what tolerance:
 *  - matvec/matmul (f32, bf16, f16 weights), dot_f32: |got - exact| <= TOL * sum|w*x| with the
 *    exact value summed in double from the same (already rounded) inputs. TOL = 1e-5, about 80
 *    fp32 ulps of the magnitude sum; fp32 summation of random data stays far below it, while a
 *    wrong lane, column or tail shows up as an error of the order of one whole term.
 *    Each SIMD variant is also checked against the reference within 2*TOL.
 *  - the determinism contract: for each variant, matmul's row t is bit-identical to matvec on
 *    X row t (for amx-auto: when n is below its AMX threshold), for n = 1..9 tokens, for row ranges [r0, r1) that do not start at 0, and for
 *    shapes that cross the SIMD variants' cache blocks (row sweeps, column blocks, token tiles).
 *  - no writes outside the rows [r0, r1) (and outside y's used elements for matmul's ldy).
 *  - dots_f32 / axpys_f32 (attention's batched forms, where a variant has them): bit for bit
 *    the dot_f32 / axpy_f32 calls they replace.
 *  - axpy: |got - exact| <= 1e-6 * (|y| + |a*x|); rmsnorm: relative 1e-5 per element (sum of
 *    squares accumulated in fp32 by every variant).
 *  - unaligned operands: W and x offset by 2 or 4 bytes from a 64-byte boundary.
 *  - conversions: all 65536 bf16 and f16 patterns survive 16 -> 32 -> 16 unchanged (NaN payloads
 *    included: see convert.c), f32 -> 16-bit rounds to the nearest value with ties to even
 *    (checked against neighbours for 2M random and hand-picked floats), and on x86 f32 -> f16
 *    agrees with the F16C instruction.
 *
 * Exit status: 0 all passed, 1 a failure. The reference is always available, so this test never
 * skips; SIMD variants the CPU lacks are reported as not tested. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#define TOL 1e-5

static int n_pass, n_fail;

static void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int ok, const char *fmt, ...) {
    if (ok) {
        n_pass++;
        return;
    }
    if (++n_fail <= 30) {
        va_list ap;
        va_start(ap, fmt);
        fputs("FAIL: ", stdout);
        vprintf(fmt, ap);
        fputc('\n', stdout);
        va_end(ap);
    }
}

/* ---- data ---------------------------------------------------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void) { /* xorshift64* */
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return rng * 0x2545f4914f6cdd1dull;
}
static float uniform(void) { return (float)((next_u64() >> 40) * (2.0 / 16777216.0) - 1.0); }

static const size_t elt_size[LOIP_KDT_COUNT] = {4, 2, 2};
static const char *dt_name[LOIP_KDT_COUNT] = {"f32", "bf16", "f16"};

/* Random weights of dtype dt; some are tiny so that f16 subnormals occur. */
static void fill_weights(void *W, int dt, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v = uniform();
        if (i % 37 == 5) v *= 1e-6f;
        if (dt == LOIP_KDT_F32) ((float *)W)[i] = v;
        else if (dt == LOIP_KDT_BF16) ((uint16_t *)W)[i] = loip_f32_to_bf16(v);
        else ((uint16_t *)W)[i] = loip_f32_to_f16(v);
    }
}

static double weight(const void *W, int dt, size_t i) {
    if (dt == LOIP_KDT_F32) return ((const float *)W)[i];
    if (dt == LOIP_KDT_BF16) return loip_bf16_to_f32(((const uint16_t *)W)[i]);
    return loip_f16_to_f32(((const uint16_t *)W)[i]);
}

/* A 64-byte aligned block with `off` bytes of offset: the operand starts unaligned. */
static void *offset_alloc(size_t bytes, size_t off, void **base) {
    *base = aligned_alloc(64, (bytes + off + 64 + 63) / 64 * 64);
    if (!*base) {
        fprintf(stderr, "test_kernels: out of memory\n");
        exit(1);
    }
    return (char *)*base + off;
}

static const float SENTINEL = -12345.0f;

/* ---- matvec / matmul ---------------------------------------------------------------------- */

/* Tokens from which matmul need not equal matvec bit for bit (amx-auto's AMX threshold). */
static size_t bitwise_below(const loip_kernels *k) {
    return k->bitwise_below ? k->bitwise_below() : (size_t)-1;
}

static void test_products(const loip_kernels *k, const loip_kernels *ref, int dt, size_t rows,
                          size_t cols, size_t woff, size_t xoff) {
    enum { NMAX = 9 };
    void *wb, *xb;
    void *W = offset_alloc(rows * cols * elt_size[dt], woff, &wb);
    float *X = offset_alloc(NMAX * cols * sizeof(float), xoff, &xb);
    size_t ldy = rows + 3;
    float *Y = malloc(NMAX * ldy * sizeof(float)), *y = malloc(rows * sizeof(float));
    float *yr = malloc(rows * sizeof(float));
    double *exact = malloc(NMAX * rows * sizeof(double));
    double *mag = malloc(NMAX * rows * sizeof(double));
    fill_weights(W, dt, rows * cols);
    for (size_t i = 0; i < NMAX * cols; i++) X[i] = uniform();
    for (size_t t = 0; t < NMAX; t++)
        for (size_t r = 0; r < rows; r++) {
            double s = 0, m = 0;
            for (size_t c = 0; c < cols; c++) {
                double p = weight(W, dt, r * cols + c) * X[t * cols + c];
                s += p, m += fabs(p);
            }
            exact[t * rows + r] = s, mag[t * rows + r] = m;
        }

    /* Row ranges: all rows, and (when there are enough) a range that starts and ends inside. */
    size_t ranges[2][2] = {{0, rows}, {rows > 2 ? 1 : 0, rows > 2 ? rows - 1 : rows}};
    for (int g = 0; g < (rows > 2 ? 2 : 1); g++) {
        size_t r0 = ranges[g][0], r1 = ranges[g][1];
        for (size_t t = 0; t < NMAX; t++) {
            const float *x = X + t * cols;
            for (size_t r = 0; r < rows; r++) y[r] = yr[r] = SENTINEL;
            k->matvec[dt](y, W, x, r0, r1, cols);
            ref->matvec[dt](yr, W, x, r0, r1, cols);
            int ok = 1, ok_ref = 1, untouched = 1;
            double worst = 0;
            for (size_t r = 0; r < rows; r++) {
                if (r < r0 || r >= r1) {
                    untouched &= y[r] == SENTINEL;
                    continue;
                }
                double e = exact[t * rows + r], tol = TOL * mag[t * rows + r] + 1e-30;
                double err = fabs(y[r] - e);
                if (err / tol > worst) worst = err / tol;
                ok &= err <= tol;
                ok_ref &= fabs((double)y[r] - yr[r]) <= 2 * tol;
            }
            check(ok, "%s matvec %s %zux%zu [%zu,%zu) woff %zu xoff %zu tok %zu: err %.2f x tol",
                  k->name, dt_name[dt], rows, cols, r0, r1, woff, xoff, t, worst);
            check(ok_ref, "%s matvec %s %zux%zu: differs from ref", k->name, dt_name[dt], rows,
                  cols);
            check(untouched, "%s matvec %s %zux%zu: wrote outside [%zu,%zu)", k->name,
                  dt_name[dt], rows, cols, r0, r1);
        }
        for (size_t n = 1; n <= NMAX; n++) {
            for (size_t i = 0; i < NMAX * ldy; i++) Y[i] = SENTINEL;
            k->matmul[dt](Y, ldy, W, X, n, r0, r1, cols);
            int same = 1, ok = 1, untouched = 1;
            for (size_t t = 0; t < NMAX; t++) {
                if (t < n) k->matvec[dt](y, W, X + t * cols, r0, r1, cols);
                for (size_t r = 0; r < ldy; r++) {
                    float v = Y[t * ldy + r];
                    if (t >= n || r < r0 || r >= r1) {
                        untouched &= v == SENTINEL;
                        continue;
                    }
                    same &= n >= bitwise_below(k) || memcmp(&v, &y[r], sizeof v) == 0;
                    ok &= fabs(v - exact[t * rows + r]) <= TOL * mag[t * rows + r] + 1e-30;
                }
            }
            check(same, "%s matmul %s %zux%zu [%zu,%zu) n=%zu: not bit-identical to matvec",
                  k->name, dt_name[dt], rows, cols, r0, r1, n);
            check(ok, "%s matmul %s %zux%zu n=%zu: beyond tolerance", k->name, dt_name[dt], rows,
                  cols, n);
            check(untouched, "%s matmul %s %zux%zu n=%zu: wrote outside its rows/tokens",
                  k->name, dt_name[dt], rows, cols, n);
        }
    }
    free(wb), free(xb), free(Y), free(y), free(yr), free(exact), free(mag);
}

/* Matmul with enough rows, columns and tokens to cross the variants' cache blocks (row sweeps,
 * column blocks, token tiles), on a row range that starts and ends off a tile boundary. Checked
 * bit for bit against matvec, and against fp64 with the same tolerance as above. */
static void test_matmul_blocked(const loip_kernels *k, int dt, size_t rows, size_t cols,
                                size_t n, size_t r0, size_t r1) {
    void *W = malloc(rows * cols * elt_size[dt]);
    size_t ldy = rows + 1;
    float *X = malloc(n * cols * sizeof(float)), *Y = malloc(n * ldy * sizeof(float));
    float *y = malloc(rows * sizeof(float));
    fill_weights(W, dt, rows * cols);
    for (size_t i = 0; i < n * cols; i++) X[i] = uniform();
    k->matmul[dt](Y, ldy, W, X, n, r0, r1, cols);
    int same = 1, ok = 1;
    for (size_t t = 0; t < n; t++) {
        k->matvec[dt](y, W, X + t * cols, r0, r1, cols);
        same &= n >= bitwise_below(k) || memcmp(Y + t * ldy + r0, y + r0, (r1 - r0) * sizeof(float)) == 0;
        for (size_t r = r0; r < r1; r += 7) { /* a sample of rows against fp64 */
            double e = 0, m = 0;
            for (size_t c = 0; c < cols; c++) {
                double p = weight(W, dt, r * cols + c) * X[t * cols + c];
                e += p, m += fabs(p);
            }
            ok &= fabs(Y[t * ldy + r] - e) <= TOL * m + 1e-30;
        }
    }
    check(same, "%s matmul %s %zux%zu n=%zu [%zu,%zu): not bit-identical to matvec", k->name,
          dt_name[dt], rows, cols, n, r0, r1);
    check(ok, "%s matmul %s %zux%zu n=%zu: beyond tolerance", k->name, dt_name[dt], rows, cols, n);
    free(W), free(X), free(Y), free(y);
}

/* ---- dot, axpy, rmsnorm ------------------------------------------------------------------- */

static void test_vector_ops(const loip_kernels *k, size_t n, size_t off) {
    void *ab, *bb, *yb;
    float *a = offset_alloc(n * 4, off, &ab), *b = offset_alloc(n * 4, 4, &bb);
    float *y = offset_alloc((n + 1) * 4, off, &yb), *y0 = malloc((n + 1) * 4);
    double s = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        a[i] = uniform(), b[i] = uniform();
        s += (double)a[i] * b[i], m += fabs((double)a[i] * b[i]);
    }
    float d = k->dot_f32(a, b, n);
    check(fabs(d - s) <= TOL * m + 1e-30, "%s dot n=%zu off %zu: %g vs %g", k->name, n, off, d, s);

    for (size_t i = 0; i <= n; i++) y[i] = y0[i] = uniform();
    float alpha = uniform();
    k->axpy_f32(y, alpha, a, n);
    int ok = y[n] == y0[n]; /* one past the end stays */
    for (size_t i = 0; i < n; i++) {
        double e = y0[i] + (double)alpha * a[i];
        ok &= fabs(y[i] - e) <= 1e-6 * (fabs(y0[i]) + fabs((double)alpha * a[i])) + 1e-30;
    }
    check(ok, "%s axpy n=%zu off %zu", k->name, n, off);

    for (int dt = 0; dt < LOIP_KDT_COUNT; dt++) {
        void *wb;
        void *w = offset_alloc(n * elt_size[dt], off, &wb);
        fill_weights(w, dt, n);
        double ss = 0;
        for (size_t i = 0; i < n; i++) ss += (double)a[i] * a[i];
        const float eps = 1e-5f;
        double inv = 1.0 / sqrt(ss / (double)n + eps);
        y[n] = SENTINEL;
        k->rmsnorm(y, a, w, dt, n, eps);
        ok = y[n] == SENTINEL;
        for (size_t i = 0; i < n; i++) {
            double e = a[i] * inv * weight(w, dt, i);
            ok &= fabs(y[i] - e) <= 1e-5 * fabs(e) + 1e-30;
        }
        /* In place (o == x), as the executor may call it. */
        memcpy(y, a, n * 4);
        k->rmsnorm(y, y, w, dt, n, eps);
        for (size_t i = 0; i < n; i++) {
            double e = a[i] * inv * weight(w, dt, i);
            ok &= fabs(y[i] - e) <= 1e-5 * fabs(e) + 1e-30;
        }
        check(ok, "%s rmsnorm w %s n=%zu off %zu", k->name, dt_name[dt], n, off);
        free(wb);
    }
    free(ab), free(bb), free(yb), free(y0);
}

/* ---- conversions -------------------------------------------------------------------------- */

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* h = narrow(f) must be the representable value nearest f, ties to the even pattern: its
 * neighbours one pattern up and down (same sign) must not be closer. */
static int nearest_ok(float f, uint16_t h, float (*widen)(uint16_t), uint16_t inf_bits) {
    double v = f, got = widen(h);
    if (!(h & 0x8000) != !signbit(f)) return 0;
    if (isinf(got)) { /* overflow: f must be at least halfway past the largest finite */
        double max = widen((uint16_t)((h & 0x8000) | (inf_bits - 1)));
        double next = 2 * max - widen((uint16_t)((h & 0x8000) | (inf_bits - 2)));
        return fabs(v) >= (fabs(max) + fabs(next)) / 2 && (v < 0) == (got < 0);
    }
    double d = fabs(got - v);
    for (int s = -1; s <= 1; s += 2) {
        uint16_t mag = h & 0x7fff;
        if ((s < 0 && mag == 0) || (s > 0 && mag >= inf_bits)) continue;
        double nb = widen((uint16_t)((h & 0x8000) | (mag + s)));
        if (isinf(nb)) continue;
        double dn = fabs(nb - v);
        if (dn < d || (dn == d && (h & 1))) return 0;
    }
    return 1;
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f) {
    return (uint16_t)_cvtss_sh(f, 0); /* round to nearest even */
}
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

static void test_convert(void) {
    int rt_bf16 = 1, rt_f16 = 1;
    for (uint32_t h = 0; h < 65536; h++) {
        rt_bf16 &= loip_f32_to_bf16(loip_bf16_to_f32((uint16_t)h)) == h;
        rt_f16 &= loip_f32_to_f16(loip_f16_to_f32((uint16_t)h)) == h;
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) rt_f16 &= isnan(loip_f16_to_f32((uint16_t)h));
    }
    check(rt_bf16, "bf16 -> f32 -> bf16 round trip");
    check(rt_f16, "f16 -> f32 -> f16 round trip");

    /* f16 widening agrees with direct arithmetic: subnormals are mant * 2^-24. */
    check(loip_f16_to_f32(0x0001) == ldexpf(1, -24) && loip_f16_to_f32(0x8001) == -ldexpf(1, -24),
          "f16 smallest subnormal");
    check(loip_f16_to_f32(0x7bff) == 65504.0f && loip_f16_to_f32(0x0400) == ldexpf(1, -14),
          "f16 largest finite / smallest normal");

    static const float edge[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f,
                                 65536.0f, 1e10f, -1e10f, 5.96046448e-8f, 2.98023224e-8f,
                                 2.98023259e-8f, 2.98023188e-8f, 6.09755516e-5f, 6.10351562e-5f,
                                 1.0009765625f, 1.00048828125f, 1.00146484375f, 3.4028235e38f,
                                 1.17549435e-38f, 1e-45f, 1.00390625f, 1.01171875f};
    int near_bf16 = 1, near_f16 = 1, hw = 1, use_hw = 0;
#if defined(__x86_64__)
    use_hw = has_f16c();
#endif
    size_t n_edge = sizeof edge / sizeof edge[0];
    for (size_t i = 0; i < n_edge + 2000000; i++) {
        float f = i < n_edge ? edge[i] : from_bits((uint32_t)next_u64());
        if (i >= n_edge && (i & 1)) /* half of them near f16's range, subnormals included */
            f = ldexpf(uniform(), (int)(next_u64() % 40) - 28);
        if (isnan(f)) {
            near_bf16 &= isnan(loip_bf16_to_f32(loip_f32_to_bf16(f)));
            near_f16 &= isnan(loip_f16_to_f32(loip_f32_to_f16(f)));
            continue;
        }
        if (isinf(f)) continue;
        near_bf16 &= nearest_ok(f, loip_f32_to_bf16(f), loip_bf16_to_f32, 0x7f80);
        near_f16 &= nearest_ok(f, loip_f32_to_f16(f), loip_f16_to_f32, 0x7c00);
#if defined(__x86_64__)
        if (use_hw) hw &= hw_f32_to_f16(f) == loip_f32_to_f16(f);
#endif
    }
    check(near_bf16, "f32 -> bf16 rounds to nearest even");
    check(near_f16, "f32 -> f16 rounds to nearest even");
    if (use_hw) check(hw, "f32 -> f16 agrees with F16C");
    else printf("test_kernels: no F16C: f32 -> f16 not compared with hardware\n");
    check(loip_f32_to_bf16(INFINITY) == 0x7f80 && loip_f32_to_bf16(-INFINITY) == 0xff80 &&
              loip_f32_to_f16(INFINITY) == 0x7c00 && loip_f32_to_f16(-INFINITY) == 0xfc00,
          "infinities");
    check(isnan(loip_bf16_to_f32(loip_f32_to_bf16(from_bits(0x7f800001)))) &&
              isnan(loip_f16_to_f32(loip_f32_to_f16(from_bits(0x7f800001)))),
          "NaN with only low payload bits stays NaN");
}

/* dots_f32 / axpys_f32 (where a variant has them): bit for bit the dot_f32 / axpy_f32 calls
 * they stand for, for head sizes with and without tails, rows with a stride (a cache block). */
static void test_batched(const loip_kernels *k) {
    if (!k->dots_f32 && !k->axpys_f32) return;
    check(k->dots_f32 && k->axpys_f32, "%s has both dots_f32 and axpys_f32", k->name);
    static const size_t ns[] = {1, 15, 16, 17, 63, 64, 65, 128, 200};
    enum { M = 37 };
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) {
        size_t n = ns[a], ld = n + 5;
        float *q = malloc(n * 4), *K = malloc(M * ld * 4), *w = malloc(M * 4);
        float *out = malloc(M * 4), *y0 = malloc(n * 4), *y1 = malloc(n * 4);
        for (size_t i = 0; i < n; i++) q[i] = uniform(), y0[i] = y1[i] = uniform();
        for (size_t i = 0; i < M * ld; i++) K[i] = uniform();
        for (size_t i = 0; i < M; i++) w[i] = uniform();
        for (size_t m = 0; m <= M; m += 12) {
            k->dots_f32(out, q, K, ld, m, n);
            int same = 1;
            for (size_t i = 0; i < m; i++) {
                float d = k->dot_f32(q, K + i * ld, n);
                same &= memcmp(&d, &out[i], 4) == 0;
            }
            check(same, "%s dots_f32 n=%zu m=%zu: not dot_f32's bits", k->name, n, m);
            k->axpys_f32(y0, w, K, ld, m, n);
            for (size_t i = 0; i < m; i++) k->axpy_f32(y1, w[i], K + i * ld, n);
            check(memcmp(y0, y1, n * 4) == 0, "%s axpys_f32 n=%zu m=%zu: not axpy_f32's bits", k->name,
                  n, m);
        }
        free(q), free(K), free(w), free(out), free(y0), free(y1);
    }
}

/* ---- main ----------------------------------------------------------------------------------- */

int main(void) {
    test_convert();

    const loip_kernels *ref = loip_kernels_select("ref");
    check(ref && ref == loip_kernels_ref(), "select(\"ref\")");
    check(loip_kernels_select("no-such-variant") == NULL, "select of an unknown name is NULL");
    /* NULL means the environment's choice (LOIP_KERNELS), else the best variant. */
    const char *env = getenv("LOIP_KERNELS");
    const loip_kernels *chosen = loip_kernels_select(env && *env ? env : "auto");
    check(loip_kernels_select("auto") != NULL, "select(\"auto\")");
    check(loip_kernels_select(NULL) == chosen, "select(NULL) follows LOIP_KERNELS");
    printf("test_kernels: select(NULL) -> %s\n", chosen ? chosen->name : "NULL");
    const char *names[] = {"ref", "avx2", "avx512", "amx", "amx-auto"};
    const loip_kernels *variants[5];
    int nv = 0;
    for (int i = 0; i < 5; i++) {
        const loip_kernels *k = loip_kernels_select(names[i]);
        if (k) {
            variants[nv++] = k;
            check(strcmp(k->name, names[i]) == 0, "variant %s names itself %s", names[i], k->name);
        } else {
            printf("test_kernels: %s not available on this CPU/build: not tested\n", names[i]);
        }
    }

    static const size_t rows_list[] = {1, 3, 7, 17, 33};
    static const size_t cols_list[] = {1, 5, 15, 16, 17, 31, 33, 63, 65, 127, 257, 4096};
    for (int v = 0; v < nv; v++) {
        const loip_kernels *k = variants[v];
        int fail0 = n_fail;
        for (int dt = 0; dt < LOIP_KDT_COUNT; dt++) {
            for (size_t ri = 0; ri < sizeof rows_list / sizeof *rows_list; ri++)
                for (size_t ci = 0; ci < sizeof cols_list / sizeof *cols_list; ci++) {
                    size_t rows = rows_list[ri], cols = cols_list[ci];
                    if (rows * cols > 17 * 4096) continue; /* keep the fp64 oracle quick */
                    test_products(k, ref, dt, rows, cols, 0, 0);
                    test_products(k, ref, dt, rows, cols, elt_size[dt] == 2 ? 2 : 4, 4);
                }
            test_products(k, ref, dt, 3, 8192 + 7, 2 * (dt != 0) + 4 * (dt == 0), 4);
            test_matmul_blocked(k, dt, 9, 4096 + 3, 97, 0, 9);
            test_matmul_blocked(k, dt, 75, 1000, 14, 3, 73);
            test_matmul_blocked(k, dt, 5, 70000 + 9, 13, 0, 5);
            /* more rows than a sweep holds (loip_kernels_sweep_rows: at most 256; at least 32
             * for rows this long), a partial last sweep, a range not aligned to the tiles */
            test_matmul_blocked(k, dt, 600, 200, 13, 5, 597);
            test_matmul_blocked(k, dt, 90, 20000 + 5, 7, 1, 89);
        }
        static const size_t vec_n[] = {1,  2,   7,   8,   15,  16,   17,  31,
                                       32, 33, 64, 100, 128, 255, 4096, 4099};
        for (size_t i = 0; i < sizeof vec_n / sizeof *vec_n; i++) {
            test_vector_ops(k, vec_n[i], 0);
            test_vector_ops(k, vec_n[i], 4);
        }
        test_batched(k);
        printf("test_kernels: variant %-6s %s\n", k->name, n_fail == fail0 ? "ok" : "FAILED");
    }
    printf("test_kernels: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
