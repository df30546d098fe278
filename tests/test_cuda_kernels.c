/* test_cuda_kernels: every CUDA kernel (kernels/cuda/kernels.cu) against an fp64 oracle computed
 * here from the same inputs, and the UMA paths (mapped and registered host memory read in place)
 * against device memory. Skips (77) where there is no CUDA device, saying so.
 *
 * Tolerances, and why:
 *  - matvec, matmul: |got - exact| <= 1e-5 * sum|w*x| (about 80 fp32 ulps of the magnitude
 *    sum, as test_kernels for the CPU): a wrong row, lane or tail is off by a whole term. The
 *    same for MXFP4 and F8 (kernels/cuda/quant.cu), the oracle from loip_dequantize's weights.
 *  - rmsnorm, rope, silu-gate: relative 1e-5 per element (fp32 arithmetic and fp32
 *    transcendental functions). RoPE's angle is pos * inv_freq in fp32, as the CPU forward
 *    computes it (runtime/exec/forward.c), so the oracle takes that fp32 angle too.
 *  - add, embed: exact (one fp32 addition; widening 16-bit values is exact).
 *  - attention: |got - exact| <= 1e-5 * max|v| + 1e-6 (a convex combination of V rows).
 *  - argmax: exact, first index among equals, NaN never chosen.
 *  - mapped / registered memory: bit-identical to the same kernel on device memory. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu/kernels.h"
#include "loip.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.f - 1.f;
}

static size_t dsize(int dt) { return dt == LOIP_F32 ? 4 : 2; }
static const char *dname(int dt) { return dt == LOIP_F32 ? "f32" : dt == LOIP_BF16 ? "bf16" : "f16"; }

/* n random weights of dtype dt (host bytes) and their exact values as doubles. */
static void *weights(int dt, size_t n, double *exact) {
    void *w = malloc(n * dsize(dt));
    for (size_t i = 0; i < n; i++) {
        float f = frand();
        if (dt == LOIP_F32) ((float *)w)[i] = f, exact[i] = f;
        else if (dt == LOIP_BF16) {
            uint16_t h = loip_f32_to_bf16(f);
            ((uint16_t *)w)[i] = h, exact[i] = loip_bf16_to_f32(h);
        } else {
            uint16_t h = loip_f32_to_f16(f);
            ((uint16_t *)w)[i] = h, exact[i] = loip_f16_to_f32(h);
        }
    }
    return w;
}

/* Device copy of n bytes of host memory. */
static void *dev_copy(const void *h, size_t n) {
    void *d = NULL;
    if (loip_cuda_alloc(n, LOIP_CUDA_MEM_DEVICE, NULL, &d) != 0) {
        fprintf(stderr, "cuda alloc: %s\n", loip_last_error());
        exit(1);
    }
    if (h && loip_cuda_copy(d, h, n) != 0) {
        fprintf(stderr, "cuda copy: %s\n", loip_last_error());
        exit(1);
    }
    return d;
}
static void *dev_zero(size_t n) {
    void *z = calloc(1, n);
    void *d = dev_copy(z, n);
    free(z);
    return d;
}
static void back(void *h, const void *d, size_t n) {
    if (loip_cuda_copy(h, d, n) != 0) {
        fprintf(stderr, "cuda copy back: %s\n", loip_last_error());
        exit(1);
    }
}
static void ok(int rc, const char *what) {
    if (rc != 0) fprintf(stderr, "%s: %s\n", what, loip_last_error());
    CHECK(rc == 0, "%s returned %d", what, rc);
    int s = loip_cuda_sync();
    CHECK(s == 0, "%s: %s", what, loip_last_error());
}

static void test_matvec(int dt, size_t rows, size_t cols) {
    double *ew = malloc(rows * cols * sizeof(double));
    void *w = weights(dt, rows * cols, ew);
    float *x = malloc(cols * sizeof(float)), *y = malloc(rows * sizeof(float));
    for (size_t c = 0; c < cols; c++) x[c] = frand();
    void *dw = dev_copy(w, rows * cols * dsize(dt));
    float *dx = dev_copy(x, cols * 4), *dy = dev_zero(rows * 4);
    ok(loip_cuda_matvec(dt, dy, dw, dx, rows, cols), "matvec");
    back(y, dy, rows * 4);
    int bad = 0;
    for (size_t r = 0; r < rows; r++) {
        double s = 0, mag = 0;
        for (size_t c = 0; c < cols; c++) s += ew[r * cols + c] * x[c], mag += fabs(ew[r * cols + c] * x[c]);
        if (fabs(y[r] - s) > 1e-5 * mag + 1e-30) bad++;
    }
    CHECK(bad == 0, "matvec %s %zux%zu: %d rows off", dname(dt), rows, cols, bad);
    loip_cuda_free(dw, 0), loip_cuda_free(dx, 0), loip_cuda_free(dy, 0);
    free(ew), free(w), free(x), free(y);
}

static void test_matmul(int dt, size_t n, size_t rows, size_t cols) {
    double *ew = malloc(rows * cols * sizeof(double));
    void *w = weights(dt, rows * cols, ew);
    float *X = malloc(n * cols * 4), *Y = malloc(n * rows * 4);
    for (size_t i = 0; i < n * cols; i++) X[i] = frand();
    void *dw = dev_copy(w, rows * cols * dsize(dt));
    float *dX = dev_copy(X, n * cols * 4), *dY = dev_zero(n * rows * 4);
    ok(loip_cuda_matmul(dt, dY, dw, dX, n, rows, cols), "matmul");
    back(Y, dY, n * rows * 4);
    int bad = 0;
    for (size_t t = 0; t < n; t++)
        for (size_t r = 0; r < rows; r++) {
            double s = 0, mag = 0;
            for (size_t c = 0; c < cols; c++) s += ew[r * cols + c] * X[t * cols + c], mag += fabs(ew[r * cols + c] * X[t * cols + c]);
            if (fabs(Y[t * rows + r] - s) > 1e-5 * mag + 1e-30) bad++;
        }
    CHECK(bad == 0, "matmul %s n=%zu %zux%zu: %d values off", dname(dt), n, rows, cols, bad);
    loip_cuda_free(dw, 0), loip_cuda_free(dX, 0), loip_cuda_free(dY, 0);
    free(ew), free(w), free(X), free(Y);
}

/* MXFP4 and F8 (kernels/cuda/quant.cu): random codes under moderate scales, against the fp64
 * oracle of loip_dequantize's weights, matvec and matmul (n tokens; n > 8 crosses its token
 * groups); F8 with columns not a multiple of 128 (nor of 4) and rows across its 128-row groups. */
static void test_quant(int32_t dt, size_t n, size_t rows, size_t cols) {
    uint64_t bytes = loip_dtype_bytes(dt, (int64_t)rows, (int64_t)cols);
    uint8_t *w = malloc(bytes);
    if (dt == LOIP_MXFP4) {
        for (uint64_t i = 0; i < bytes; i++) w[i] = (uint8_t)(frand() * 128 + 128);
        for (uint64_t b = 0; b < bytes / 17; b++) w[b * 17] = (uint8_t)(120 + b % 8);
    } else {
        size_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
        uint8_t *q = malloc(rows * cols);
        float *scale = malloc(sr * sc * 4);
        for (size_t i = 0; i < rows * cols; i++) {
            q[i] = (uint8_t)(frand() * 128 + 128);
            if ((q[i] & 0x7F) == 0x7F) q[i] ^= 1;
        }
        for (size_t i = 0; i < sr * sc; i++) scale[i] = 1e-2f * (1.5f + frand());
        CHECK(loip_f8_pack(w, q, scale, rows, cols, sr, sc, "w") == 0, "f8_pack: %s", loip_last_error());
        free(q), free(scale);
    }
    float *f = malloc(rows * cols * 4), *X = malloc(n * cols * 4), *Y = malloc(n * rows * 4);
    CHECK(loip_dequantize(f, w, dt, rows, cols) == 0, "dequantize: %s", loip_last_error());
    for (size_t i = 0; i < n * cols; i++) X[i] = frand();
    void *dw = dev_copy(w, bytes);
    float *dX = dev_copy(X, n * cols * 4), *dY = dev_zero(n * rows * 4);
    if (n == 1) ok(loip_cuda_matvec(dt, dY, dw, dX, rows, cols), "matvec (quant)");
    else ok(loip_cuda_matmul(dt, dY, dw, dX, n, rows, cols), "matmul (quant)");
    back(Y, dY, n * rows * 4);
    int bad = 0;
    for (size_t t = 0; t < n; t++)
        for (size_t r = 0; r < rows; r++) {
            double s = 0, mag = 0;
            for (size_t c = 0; c < cols; c++) {
                double p = (double)f[r * cols + c] * X[t * cols + c];
                s += p, mag += fabs(p);
            }
            if (fabs(Y[t * rows + r] - s) > 1e-5 * mag + 1e-30) bad++;
        }
    CHECK(bad == 0, "%s %s n=%zu %zux%zu: %d values off", n == 1 ? "matvec" : "matmul",
          dt == LOIP_MXFP4 ? "mxfp4" : "f8", n, rows, cols, bad);
    loip_cuda_free(dw, 0), loip_cuda_free(dX, 0), loip_cuda_free(dY, 0);
    free(w), free(f), free(X), free(Y);
}

static void test_rmsnorm(int dt) {
    size_t T = 5, D = 1000;
    double *ew = malloc(D * sizeof(double));
    void *w = weights(dt, D, ew);
    float *x = malloc(T * D * 4), *o = malloc(T * D * 4);
    for (size_t i = 0; i < T * D; i++) x[i] = frand() * 3;
    void *dw = dev_copy(w, D * dsize(dt));
    float *dx = dev_copy(x, T * D * 4), *dout = dev_zero(T * D * 4);
    ok(loip_cuda_rmsnorm(dout, dx, dw, dt, T, D, 1e-5f), "rmsnorm");
    back(o, dout, T * D * 4);
    int bad = 0;
    for (size_t t = 0; t < T; t++) {
        double ss = 0;
        for (size_t i = 0; i < D; i++) ss += (double)x[t * D + i] * x[t * D + i];
        double inv = 1 / sqrt(ss / D + 1e-5);
        for (size_t i = 0; i < D; i++) {
            double e = x[t * D + i] * inv * ew[i];
            if (fabs(o[t * D + i] - e) > 1e-5 * fabs(e) + 1e-6) bad++;
        }
    }
    CHECK(bad == 0, "rmsnorm %s: %d values off", dname(dt), bad);
    loip_cuda_free(dw, 0), loip_cuda_free(dx, 0), loip_cuda_free(dout, 0);
    free(ew), free(w), free(x), free(o);
}

static void test_rope(int layout) {
    int T = 4, H = 3, hd = 64, half = hd / 2;
    int32_t pos[4] = {0, 1, 77, 511};
    float inv[32], *q = malloc((size_t)T * H * hd * 4), *got = malloc((size_t)T * H * hd * 4);
    for (int i = 0; i < half; i++) inv[i] = (float)pow(10000.0, -2.0 * i / hd);
    for (int i = 0; i < T * H * hd; i++) q[i] = frand();
    float *dq = dev_copy(q, (size_t)T * H * hd * 4), *dinv = dev_copy(inv, sizeof inv);
    int32_t *dpos = dev_copy(pos, sizeof pos);
    ok(loip_cuda_rope(dq, T, H, hd, dpos, dinv, layout), "rope");
    back(got, dq, (size_t)T * H * hd * 4);
    int bad = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < half; i++) {
                const float *x = q + ((size_t)t * H + h) * hd;
                const float *g = got + ((size_t)t * H + h) * hd;
                int j0 = layout == LOIP_ROPE_INTERLEAVED ? 2 * i : i, j1 = layout == LOIP_ROPE_INTERLEAVED ? 2 * i + 1 : i + half;
                float af = (float)pos[t] * inv[i];
                double a = af, c = cos(a), s = sin(a);
                double e0 = x[j0] * c - x[j1] * s, e1 = x[j0] * s + x[j1] * c;
                if (fabs(g[j0] - e0) > 1e-5 * (fabs(x[j0]) + fabs(x[j1])) + 1e-6) bad++;
                if (fabs(g[j1] - e1) > 1e-5 * (fabs(x[j0]) + fabs(x[j1])) + 1e-6) bad++;
            }
    CHECK(bad == 0, "rope layout %d: %d values off", layout, bad);
    loip_cuda_free(dq, 0), loip_cuda_free(dinv, 0), loip_cuda_free(dpos, 0);
    free(q), free(got);
}

static void test_pointwise(void) {
    size_t n = 10007;
    float *h = malloc(n * 4), *u = malloc(n * 4), *g = malloc(n * 4);
    for (size_t i = 0; i < n; i++) h[i] = frand() * 6, u[i] = frand();
    float *dh = dev_copy(h, n * 4), *du = dev_copy(u, n * 4);
    ok(loip_cuda_silu_gate(dh, du, n), "silu_gate");
    back(g, dh, n * 4);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double e = h[i] / (1 + exp(-(double)h[i])) * u[i];
        if (fabs(g[i] - e) > 1e-5 * fabs(e) + 1e-7) bad++;
    }
    CHECK(bad == 0, "silu_gate: %d values off", bad);
    float *dx = dev_copy(h, n * 4);
    ok(loip_cuda_add(dx, du, n), "add");
    back(g, dx, n * 4);
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += g[i] != h[i] + u[i];
    CHECK(bad == 0, "add: %d values differ", bad);
    loip_cuda_free(dh, 0), loip_cuda_free(du, 0), loip_cuda_free(dx, 0);
    free(h), free(u), free(g);
}

static void test_embed_argmax(void) {
    size_t V = 300, D = 96;
    double *e = malloc(V * D * sizeof(double));
    void *tab = weights(LOIP_BF16, V * D, e);
    int32_t ids[4] = {0, 299, 17, 17};
    float *x = malloc(4 * D * 4);
    void *dt = dev_copy(tab, V * D * 2);
    int32_t *di = dev_copy(ids, sizeof ids);
    float *dx = dev_zero(4 * D * 4);
    ok(loip_cuda_embed(dx, dt, LOIP_BF16, di, 4, D), "embed");
    back(x, dx, 4 * D * 4);
    int bad = 0;
    for (int t = 0; t < 4; t++)
        for (size_t i = 0; i < D; i++) bad += x[t * D + i] != (float)e[(size_t)ids[t] * D + i];
    CHECK(bad == 0, "embed: %d values differ", bad);
    /* argmax: a tie (first wins), a NaN (never wins), a row all -inf (0) */
    int vocab = 5000;
    float *l = malloc(3 * (size_t)vocab * 4);
    for (int i = 0; i < 3 * vocab; i++) l[i] = frand();
    l[1234] = 5, l[4321] = 5, l[vocab + 10] = NAN, l[vocab + 4999] = 2;
    for (int i = 0; i < vocab; i++) l[2 * vocab + i] = -INFINITY;
    float *dl = dev_copy(l, 3 * (size_t)vocab * 4);
    int32_t *dout = dev_zero(3 * 4), out[3];
    ok(loip_cuda_argmax(dout, dl, 3, vocab), "argmax");
    back(out, dout, sizeof out);
    CHECK(out[0] == 1234 && out[1] == 4999 && out[2] == 0, "argmax: %d %d %d (want 1234 4999 0)", out[0], out[1], out[2]);
    loip_cuda_free(dt, 0), loip_cuda_free(di, 0), loip_cuda_free(dx, 0), loip_cuda_free(dl, 0), loip_cuda_free(dout, 0);
    free(e), free(tab), free(x), free(l);
}

/* fp64 attention of query qh over positions 0..n-1 of K/V rows given by row(p). */
static void attend(double *out, const float *qh, int n, int hd, float scale, const float *(*krow)(int, void *),
                   const float *(*vrow)(int, void *), void *ctx) {
    double *s = malloc((size_t)n * sizeof(double)), m = -INFINITY, l = 0;
    for (int p = 0; p < n; p++) {
        const float *k = krow(p, ctx);
        double d = 0;
        for (int i = 0; i < hd; i++) d += (double)qh[i] * k[i];
        s[p] = d * scale;
        if (s[p] > m) m = s[p];
    }
    for (int i = 0; i < hd; i++) out[i] = 0;
    for (int p = 0; p < n; p++) {
        double w = exp(s[p] - m);
        l += w;
        const float *v = vrow(p, ctx);
        for (int i = 0; i < hd; i++) out[i] += w * v[i];
    }
    for (int i = 0; i < hd; i++) out[i] /= l;
    free(s);
}

typedef struct { const float *k, *v; const int32_t *table; int bt, kv_dim, kvh, hd; } paged;
static const float *pk(int p, void *c) {
    paged *x = c;
    return x->k + ((size_t)x->table[p / x->bt] * x->bt + p % x->bt) * x->kv_dim + (size_t)x->kvh * x->hd;
}
static const float *pv(int p, void *c) {
    paged *x = c;
    return x->v + ((size_t)x->table[p / x->bt] * x->bt + p % x->bt) * x->kv_dim + (size_t)x->kvh * x->hd;
}

static void test_attention_decode(int splits) {
    int S = 3, H = 8, KVH = 2, hd = 64, bt = 16, max_blocks = 20, kv_dim = KVH * hd;
    int32_t ctx[3] = {1, 50, 300};
    int groups = S * max_blocks;
    size_t pool = (size_t)groups * bt * kv_dim;
    float *k = malloc(pool * 4), *v = malloc(pool * 4), *q = malloc((size_t)S * H * hd * 4), *o = malloc((size_t)S * H * hd * 4);
    for (size_t i = 0; i < pool; i++) k[i] = frand(), v[i] = frand();
    for (int i = 0; i < S * H * hd; i++) q[i] = frand();
    /* groups handed out in a scrambled order, as a paged cache's free list would */
    int32_t *table = malloc((size_t)S * max_blocks * 4);
    for (int i = 0; i < S * max_blocks; i++) table[i] = (int32_t)((i * 37 + 11) % groups);
    float scale = 1 / sqrtf((float)hd);
    float *dk = dev_copy(k, pool * 4), *dv = dev_copy(v, pool * 4), *dq = dev_copy(q, (size_t)S * H * hd * 4);
    float *dout = dev_zero((size_t)S * H * hd * 4);
    int32_t *dtab = dev_copy(table, (size_t)S * max_blocks * 4), *dctx = dev_copy(ctx, sizeof ctx);
    float *scr = dev_zero(loip_cuda_attention_scratch(S, H, hd, splits));
    ok(loip_cuda_attention_decode(dout, dq, dk, dv, dtab, dctx, S, H, KVH, hd, bt, max_blocks, scale, scr, splits),
       "attention decode");
    back(o, dout, (size_t)S * H * hd * 4);
    int bad = 0;
    double e[64];
    for (int s = 0; s < S; s++)
        for (int h = 0; h < H; h++) {
            paged c = {k, v, table + (size_t)s * max_blocks, bt, kv_dim, h / (H / KVH), hd};
            attend(e, q + ((size_t)s * H + h) * hd, ctx[s], hd, scale, pk, pv, &c);
            for (int i = 0; i < hd; i++) bad += fabs(o[((size_t)s * H + h) * hd + i] - e[i]) > 1e-5 + 1e-6;
        }
    CHECK(bad == 0, "attention decode (%d splits): %d values off", splits, bad);
    loip_cuda_free(dk, 0), loip_cuda_free(dv, 0), loip_cuda_free(dq, 0), loip_cuda_free(dout, 0);
    loip_cuda_free(dtab, 0), loip_cuda_free(dctx, 0), loip_cuda_free(scr, 0);
    free(k), free(v), free(q), free(o), free(table);
}

typedef struct { const float *k, *v; int kv_dim, kvh, hd; } flat;
static const float *fk(int p, void *c) { flat *x = c; return x->k + (size_t)p * x->kv_dim + (size_t)x->kvh * x->hd; }
static const float *fv(int p, void *c) { flat *x = c; return x->v + (size_t)p * x->kv_dim + (size_t)x->kvh * x->hd; }

static void test_attention_prefill(void) {
    int n = 40, H = 4, KVH = 2, hd = 48, kv_dim = KVH * hd;
    float *q = malloc((size_t)n * H * hd * 4), *k = malloc((size_t)n * kv_dim * 4), *v = malloc((size_t)n * kv_dim * 4);
    float *o = malloc((size_t)n * H * hd * 4);
    for (int i = 0; i < n * H * hd; i++) q[i] = frand();
    for (int i = 0; i < n * kv_dim; i++) k[i] = frand(), v[i] = frand();
    float scale = 1 / sqrtf((float)hd);
    float *dq = dev_copy(q, (size_t)n * H * hd * 4), *dk = dev_copy(k, (size_t)n * kv_dim * 4);
    float *dv = dev_copy(v, (size_t)n * kv_dim * 4), *dout = dev_zero((size_t)n * H * hd * 4);
    ok(loip_cuda_attention_prefill(dout, dq, dk, dv, n, H, KVH, hd, scale), "attention prefill");
    back(o, dout, (size_t)n * H * hd * 4);
    int bad = 0;
    double e[48];
    for (int t = 0; t < n; t++)
        for (int h = 0; h < H; h++) {
            flat c = {k, v, kv_dim, h / (H / KVH), hd};
            attend(e, q + ((size_t)t * H + h) * hd, t + 1, hd, scale, fk, fv, &c);
            for (int i = 0; i < hd; i++) bad += fabs(o[((size_t)t * H + h) * hd + i] - e[i]) > 1e-5 + 1e-6;
        }
    CHECK(bad == 0, "attention prefill: %d values off", bad);
    loip_cuda_free(dq, 0), loip_cuda_free(dk, 0), loip_cuda_free(dv, 0), loip_cuda_free(dout, 0);
    free(q), free(k), free(v), free(o);
}

/* UMA: the same weights read in place from mapped host memory and from a registered buffer (as
 * the loader's slot is) give the device-memory result, bit for bit. */
static void test_uma(void) {
    size_t rows = 512, cols = 1024, bytes = rows * cols * 2;
    double *ew = malloc(rows * cols * sizeof(double));
    void *w = weights(LOIP_BF16, rows * cols, ew);
    float *x = malloc(cols * 4), *y0 = malloc(rows * 4), *y1 = malloc(rows * 4);
    for (size_t c = 0; c < cols; c++) x[c] = frand();
    float *dx = dev_copy(x, cols * 4), *dy = dev_zero(rows * 4);
    void *dw = dev_copy(w, bytes);
    ok(loip_cuda_matvec(LOIP_BF16, dy, dw, dx, rows, cols), "matvec (device memory)");
    back(y0, dy, rows * 4);
    void *host = NULL, *mapped = NULL;
    int rc = loip_cuda_alloc(bytes, LOIP_CUDA_MEM_MAPPED, &host, &mapped);
    CHECK(rc == 0, "mapped alloc: %s", loip_last_error());
    if (rc == 0) {
        memcpy(host, w, bytes);
        ok(loip_cuda_matvec(LOIP_BF16, dy, mapped, dx, rows, cols), "matvec (mapped)");
        back(y1, dy, rows * 4);
        CHECK(memcmp(y0, y1, rows * 4) == 0, "matvec on mapped memory differs from device memory");
        loip_cuda_free(host, LOIP_CUDA_MEM_MAPPED);
    }
    void *slot = NULL, *dslot = NULL;
    CHECK(posix_memalign(&slot, 4096, bytes) == 0, "posix_memalign");
    memcpy(slot, w, bytes);
    rc = loip_cuda_register(slot, bytes, &dslot);
    CHECK(rc == 0, "register: %s", loip_last_error());
    if (rc == 0) {
        ok(loip_cuda_matvec(LOIP_BF16, dy, dslot, dx, rows, cols), "matvec (registered)");
        back(y1, dy, rows * 4);
        CHECK(memcmp(y0, y1, rows * 4) == 0, "matvec on registered memory differs from device memory");
        loip_cuda_unregister(slot);
    }
    free(slot);
    loip_cuda_free(dx, 0), loip_cuda_free(dy, 0), loip_cuda_free(dw, 0);
    free(ew), free(w), free(x), free(y0), free(y1);
}

int main(void) {
    int n = loip_cuda_device_count();
    if (n == 0) {
        void *d = NULL;
        int rc = loip_cuda_alloc(16, LOIP_CUDA_MEM_DEVICE, NULL, &d);
        printf("test_cuda_kernels: skipped: no CUDA device (%s)\n",
               rc == LOIP_ENOSYS ? loip_last_error() : "built with CUDA; no device or driver on this machine");
        return 77;
    }
    char name[256];
    int32_t integrated = 0, sms = 0;
    uint64_t total = 0;
    double bw = 0;
    loip_cuda_device_info(0, name, sizeof name, &integrated, &sms, &total, &bw);
    printf("device 0: %s, %s, %d SMs, %.1f GiB, %.0f GB/s peak\n", name, integrated ? "integrated" : "discrete", sms,
           total / 1073741824.0, bw / 1e9);
    int dts[3] = {LOIP_F32, LOIP_BF16, LOIP_F16};
    for (int i = 0; i < 3; i++) {
        test_matvec(dts[i], 1000, 4096); /* vector loads */
        test_matvec(dts[i], 37, 1001);   /* a row not a multiple of 16 bytes: element loads */
        test_matmul(dts[i], 17, 300, 256);  /* partial tiles of rows and tokens */
        test_matmul(dts[i], 128, 128, 250); /* whole tiles; a partial slice of columns */
        test_rmsnorm(dts[i]);
    }
    test_quant(LOIP_MXFP4, 1, 1000, 2880);
    test_quant(LOIP_MXFP4, 11, 37, 4096);
    test_quant(LOIP_F8_E4M3, 1, 300, 1001);
    test_quant(LOIP_F8_E4M3, 9, 130, 300);
    /* an MXFP4 row that is not whole blocks: refused, naming it */
    CHECK(loip_cuda_matvec(LOIP_MXFP4, NULL, NULL, NULL, 4, 100) == LOIP_ESHAPE &&
              strstr(loip_last_error(), "MXFP4 row length"),
          "cuda matvec of an MXFP4 row of 100: %s", loip_last_error());
    test_rope(LOIP_ROPE_INTERLEAVED);
    test_rope(LOIP_ROPE_HALF);
    test_pointwise();
    test_embed_argmax();
    test_attention_decode(1);
    test_attention_decode(4);
    test_attention_decode(64); /* more parts than positions: empty parts merge away */
    test_attention_prefill();
    test_uma();
    printf("test_cuda_kernels: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
