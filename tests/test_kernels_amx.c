/* test_kernels_amx: the AMX BF16 products (kernels_amx.c) are exact up to fp32 summation order.
 *
 * For every shape (all tails: rows, tokens and columns off the 16 / 16 / 32 tile sizes, row ranges
 * that do not start on a tile, column and token counts past the cache panels) and every data
 * class (uniform, magnitudes spread over 2^-60..2^60, exact zeros, 1e30 and 1e-30, values whose
 * low split parts are denormal, denormal activations and weights), each Y[t][r] must satisfy
 *
 *   |got - exact| <= gamma(3c + 1) * sum|w x| + 2^-125 * sum|w| + 2^-126 * (sum|x| + 6c)
 *
 * with exact the fp64 sum of the same bf16 weights and fp32 activations, c = cols and
 * gamma(k) = k u / (1 - k u), u = 2^-24: the fp32 dot-product bound for 3c additions (three
 * bf16 parts per activation, every product exact), plus what AMX's denormal flushing can drop
 * (see kernels_amx.c). It is also compared with the avx512 variant within the sum of both
 * variants' bounds, and:
 *  - matvec on token t equals matmul's token t bit for bit (the determinism contract);
 *  - nothing outside rows [r0, r1) and the n tokens is written;
 *  - inf and NaN activations give non-finite results where the fp32 path gives them (same sign
 *    for infinities);
 *  - two threads computing halves of the rows at once (each configuring its own tiles) give the
 *    same bits as one call.
 * Exit 77 (skip) where the CPU, the OS or the compiler lacks AMX-BF16. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"

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

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint64_t next_u64(void) {
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return rng * 0x2545f4914f6cdd1dull;
}
static float uniform(void) { return (float)((next_u64() >> 40) * (2.0 / 16777216.0) - 1.0); }

enum { D_UNIFORM, D_SPREAD, D_ZEROS, D_HUGE, D_TINY, D_LOWPARTS, D_DENORMAL, D_COUNT };
static const char *d_name[D_COUNT] = {"uniform", "spread", "zeros", "huge",
                                      "tiny",    "lowparts", "denormal"};

static float act(int d, size_t i) {
    float v = uniform();
    switch (d) {
    case D_SPREAD: return ldexpf(v, (int)(next_u64() % 121) - 60);
    case D_ZEROS: return i % 3 == 0 ? 0.0f : (i % 5 == 0 ? -0.0f : v);
    case D_HUGE: return v * 1e30f;
    case D_TINY: return v * 1e-30f;
    case D_LOWPARTS: return ldexpf(v, -112 - (int)(next_u64() % 10)); /* m, l denormal */
    case D_DENORMAL: return i % 2 ? ldexpf(v, -130) : v;
    default: return v;
    }
}
static float wgt(int d, size_t i) {
    float v = uniform();
    if (d == D_ZEROS && i % 4 == 1) v = 0.0f;
    if (d == D_HUGE) v *= 1e-30f; /* keep products finite */
    if (d == D_DENORMAL && i % 7 == 3) v = ldexpf(v, -130);
    return v;
}

static double bound(const uint16_t *W, const float *x, size_t cols) {
    const double u = ldexp(1.0, -24);
    double k = 3.0 * (double)cols + 1.0, gamma = k * u / (1.0 - k * u);
    double swx = 0, sw = 0, sx = 0;
    for (size_t c = 0; c < cols; c++) {
        double w = loip_bf16_to_f32(W[c]);
        swx += fabs(w * x[c]), sw += fabs(w), sx += fabs((double)x[c]);
    }
    return gamma * swx + ldexp(1.0, -125) * sw + ldexp(1.0, -126) * (sx + 6.0 * (double)cols);
}

static const float SENTINEL = -12345.0f;

typedef struct {
    const loip_kernels *k;
    float *Y;
    size_t ldy;
    const uint16_t *W;
    const float *X;
    size_t n, r0, r1, cols;
} call;
static void *run_call(void *p) {
    call *c = p;
    c->k->matmul[LOIP_KDT_BF16](c->Y, c->ldy, c->W, c->X, c->n, c->r0, c->r1, c->cols);
    return NULL;
}

static void test_shape(const loip_kernels *amx, const loip_kernels *base, int d, size_t rows,
                       size_t cols, size_t n, size_t r0, size_t r1) {
    uint16_t *W = malloc(rows * cols * 2 + 2);
    float *X = malloc(n * cols * 4 + 4), *Y = malloc(n * rows * 4), *Yb = malloc(n * rows * 4);
    float *y = malloc(rows * 4), *Y2 = malloc(n * rows * 4);
    if (!W || !X || !Y || !Yb || !y || !Y2) abort();
    for (size_t i = 0; i < rows * cols; i++) W[i] = loip_f32_to_bf16(wgt(d, i));
    for (size_t i = 0; i < n * cols; i++) X[i] = act(d, i);
    for (size_t i = 0; i < n * rows; i++) Y[i] = Yb[i] = Y2[i] = SENTINEL;
    amx->matmul[LOIP_KDT_BF16](Y, rows, W, X, n, r0, r1, cols);
    base->matmul[LOIP_KDT_BF16](Yb, rows, W, X, n, r0, r1, cols);
    int bad_bound = 0, bad_base = 0, bad_bits = 0, bad_outside = 0;
    double worst = 0;
    for (size_t t = 0; t < n; t++) {
        for (size_t r = 0; r < rows; r++) {
            float got = Y[t * rows + r];
            if (r < r0 || r >= r1) {
                bad_outside += got != SENTINEL;
                continue;
            }
            const uint16_t *w = W + r * cols;
            const float *x = X + t * cols;
            double exact = 0;
            for (size_t c = 0; c < cols; c++) exact += (double)loip_bf16_to_f32(w[c]) * x[c];
            double b = bound(w, x, cols), e = fabs((double)got - exact);
            if (!(e <= b)) bad_bound++;
            if (b > 0 && e / b > worst) worst = e / b;
            if (!(fabs((double)got - Yb[t * rows + r]) <= 2 * b)) bad_base++;
        }
        for (size_t r = 0; r < rows; r++) y[r] = SENTINEL;
        amx->matvec[LOIP_KDT_BF16](y, W, X + t * cols, r0, r1, cols);
        bad_bits += memcmp(y + r0, Y + t * rows + r0, (r1 - r0) * 4) != 0;
        for (size_t r = 0; r < rows; r++) bad_outside += (r < r0 || r >= r1) && y[r] != SENTINEL;
    }
    /* two threads at once, each on half of the rows (split on a 16-row grain, as the pool does) */
    size_t mid = r0 + ((r1 - r0) / 2 + 15) / 16 * 16;
    if (mid > r1) mid = r1;
    call c1 = {amx, Y2, rows, W, X, n, r0, mid, cols}, c2 = {amx, Y2, rows, W, X, n, mid, r1, cols};
    pthread_t th;
    if (pthread_create(&th, NULL, run_call, &c2) != 0) abort();
    run_call(&c1);
    pthread_join(th, NULL);
    int bad_threads = memcmp(Y2, Y, n * rows * 4) != 0;
    const char *what = d_name[d];
    check(!bad_bound, "%s rows=%zu cols=%zu n=%zu [%zu,%zu): %d outside the bound (worst %.2f)",
          what, rows, cols, n, r0, r1, bad_bound, worst);
    check(!bad_base, "%s rows=%zu cols=%zu n=%zu: %d differ from avx512 beyond 2 bounds", what,
          rows, cols, n, bad_base);
    check(!bad_bits, "%s rows=%zu cols=%zu n=%zu: matvec != matmul on %d tokens", what, rows, cols,
          n, bad_bits);
    check(!bad_outside, "%s rows=%zu cols=%zu n=%zu: %d writes outside", what, rows, cols, n,
          bad_outside);
    check(!bad_threads, "%s rows=%zu cols=%zu n=%zu: two threads differ from one call", what,
          rows, cols, n);
    free(W), free(X), free(Y), free(Yb), free(y), free(Y2);
}

/* inf / NaN activations: where the fp32 path gives a non-finite value, so does AMX. */
static void test_special(const loip_kernels *amx, const loip_kernels *base) {
    enum { R = 20, C = 70, N = 5 };
    static uint16_t W[R * C];
    static float X[N * C], Y[N * R], Yb[N * R];
    for (size_t i = 0; i < R * C; i++) W[i] = loip_f32_to_bf16(uniform());
    for (size_t i = 0; i < N * C; i++) X[i] = uniform();
    X[0 * C + 3] = INFINITY;
    X[1 * C + 40] = -INFINITY;
    X[2 * C + 65] = NAN;
    X[3 * C + 7] = INFINITY, X[3 * C + 8] = -INFINITY;
    W[5 * C + 3] = 0; /* row 5 of token 0: 0 * inf = NaN */
    W[4 * C + 3] = loip_f32_to_bf16(0.5f);
    W[1 * C + 7] = W[1 * C + 8] = loip_f32_to_bf16(1.0f); /* row 1 of token 3: inf - inf */
    amx->matmul[LOIP_KDT_BF16](Y, R, W, X, N, 0, R, C);
    base->matmul[LOIP_KDT_BF16](Yb, R, W, X, N, 0, R, C);
    int bad = 0;
    for (size_t i = 0; i < N * R; i++) {
        if (isfinite(Yb[i])) bad += !isfinite(Y[i]);
        else if (isnan(Yb[i])) bad += !isnan(Y[i]);
        else bad += Y[i] != Yb[i];
    }
    check(!bad, "inf/NaN activations: %d results classified unlike avx512", bad);
    check(isnan(Y[0 * R + 5]) && Y[0 * R + 4] == INFINITY && isnan(Y[2 * R + 0]) && isnan(Y[3 * R + 1]),
          "inf/NaN activations: 0*inf, inf, NaN and inf-inf as expected");
}

/* amx-auto: n below the threshold is avx512's matmul bit for bit (and equals its own matvec,
 * which is avx512's), n at or above it amx's; the threshold is the run-time setting; the
 * variant is never the default (its bits depend on the number of tokens in a step). */
static void test_auto(const loip_kernels *amx, const loip_kernels *base) {
    const loip_kernels *au = loip_kernels_select("amx-auto");
    check(au && strcmp(au->name, "amx-auto") == 0, "amx-auto is selectable and names itself");
    if (!au) return;
    check(loip_kernels_select("auto") != au && loip_kernels_select("auto") != amx,
          "auto never chooses a variant whose bits depend on the token count (amx-auto, amx)");
    check(au->matvec[LOIP_KDT_BF16] == base->matvec[LOIP_KDT_BF16], "amx-auto's matvec is avx512's");
    size_t was = loip_kernels_amx_rows(0);
    check(was == LOIP_AMX_ROWS_DEFAULT, "threshold defaults to %d (got %zu)", LOIP_AMX_ROWS_DEFAULT, was);
    enum { R = 40, C = 300, N = 12 };
    uint16_t *W = malloc(R * C * 2);
    float *X = malloc(N * C * 4), *Ya = malloc(N * R * 4), *Yb = malloc(N * R * 4);
    for (size_t i = 0; i < R * C; i++) W[i] = loip_f32_to_bf16(uniform());
    for (size_t i = 0; i < N * C; i++) X[i] = uniform();
    size_t last = 0;
    for (size_t th = 1; th <= N + 1; th += 5) {
        last = th;
        check(loip_kernels_amx_rows(th) == th, "threshold set to %zu", th);
        check(au->bitwise_below() == th, "bitwise_below follows the threshold");
        for (size_t n = 1; n <= N; n++) {
            const loip_kernels *want = n >= th ? amx : base;
            au->matmul[LOIP_KDT_BF16](Ya, R, W, X, n, 0, R, C);
            want->matmul[LOIP_KDT_BF16](Yb, R, W, X, n, 0, R, C);
            check(memcmp(Ya, Yb, n * R * 4) == 0, "amx-auto n=%zu threshold %zu: %s's bits", n,
                  th, want->name);
        }
    }
    check(loip_kernels_amx_rows(0) == last, "0 leaves the threshold");
    loip_kernels_amx_rows(was);
    free(W), free(X), free(Ya), free(Yb);
}

int main(void) {
    const loip_kernels *amx = loip_kernels_select("amx");
    const loip_kernels *base = loip_kernels_select("avx512");
    if (!amx || !base) {
        printf("test_kernels_amx: no AMX-BF16 here (CPU, OS permission or compiler): skipped\n");
        return 77;
    }
    check(strcmp(amx->name, "amx") == 0, "the variant names itself amx");
    /* rows, cols, n, r0, r1 */
    static const size_t shapes[][5] = {
        {16, 32, 16, 0, 16},   {1, 1, 1, 0, 1},       {17, 33, 17, 0, 17},
        {31, 31, 15, 0, 31},   {48, 64, 33, 16, 48},  {50, 97, 47, 3, 45},
        {40, 17, 2, 5, 40},    {35, 1000, 20, 0, 35}, {70, 160, 64, 0, 70},
        {3, 9000, 5, 0, 3},    {33, 200, 500, 1, 33}, {18, 96, 1100, 2, 18},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int d = 0; d < D_COUNT; d++)
            test_shape(amx, base, d, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3],
                       shapes[s][4]);
    test_special(amx, base);
    test_auto(amx, base);
    printf("test_kernels_amx: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
