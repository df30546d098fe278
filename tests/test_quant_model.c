/* test_quant_model: a model whose matrices are MXFP4 or F8 (E4M3 + 128x128 block scales) runs,
 * and computes what the same model with those matrices dequantized to F32 computes.
 *
 * A tiny llama-shaped model (2 layers, dim 256 so that F8's 128-column blocks are several, a
 * mixture of experts in the second case, its experts MXFP4 as gpt-oss ships them) is bound
 * twice: once with the quantized bytes, once with loip_dequantize's F32 of them. Under every
 * kernel variant (ref, avx2, avx512 where present) an MXFP4 product is bit for bit its F32
 * product of the dequantized weights (quant.h), so the logits of the two models, prefill and
 * decode, must be identical; so must F8's under the reference, while the SIMD F8 kernels
 * (block-scaled sums) must come within 1e-5 of the largest logit (the bound). Also: the weights' bytes counted (loip_model_weight_bytes)
 * as loip_dtype_bytes, and bad bindings (an MXFP4 row that is not whole blocks, a quantized
 * norm, a quantized embedding) refused naming the tensor. Exit status 0: all passed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loip.h"

enum { DIM = 256, HID = 384, HEADS = 4, KV = 2, HD = 64, VOCAB = 48, LAYERS = 2, E = 4, EDIM = 96, NTOK = 5 };

static int n_pass, n_fail;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) n_pass++;                                                                        \
        else {                                                                                     \
            n_fail++;                                                                              \
            printf("FAIL: " __VA_ARGS__);                                                          \
            printf(" (%s)\n", loip_last_error());                                                  \
        }                                                                                          \
    } while (0)

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void) {
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return rng * 0x2545f4914f6cdd1dull;
}
static float uniform(void) { return (float)((next_u64() >> 40) * (2.0 / 16777216.0) - 1.0); }

/* One matrix in both forms: q (dtype's bytes), f (its dequantized F32). */
typedef struct {
    void *q;
    float *f;
    int64_t rows, cols;
} mat;

static mat make_mat(int32_t dtype, int64_t rows, int64_t cols) {
    mat m = {.rows = rows, .cols = cols};
    uint64_t bytes = loip_dtype_bytes(dtype, rows, cols);
    m.q = malloc(bytes);
    m.f = malloc((size_t)(rows * cols) * 4);
    uint8_t *b = m.q;
    if (dtype == LOIP_MXFP4) {
        for (uint64_t i = 0; i < bytes; i++) b[i] = (uint8_t)next_u64();
        for (uint64_t k = 0; k < bytes / 17; k++) b[k * 17] = (uint8_t)(121 + next_u64() % 3); /* ~2^-5 */
    } else {
        int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
        uint8_t *w = malloc((size_t)(rows * cols));
        float *s = malloc((size_t)(sr * sc) * 4);
        for (int64_t i = 0; i < rows * cols; i++) {
            uint8_t v = (uint8_t)next_u64();
            w[i] = (v & 0x7F) == 0x7F ? v ^ 1 : v; /* no NaN codes: logits compared by value */
        }
        for (int64_t i = 0; i < sr * sc; i++) s[i] = 1e-3f * (1.0f + fabsf(uniform()));
        if (loip_f8_pack(m.q, w, s, rows, cols, sr, sc, "test")) printf("f8_pack: %s\n", loip_last_error());
        free(w), free(s);
    }
    if (loip_dequantize(m.f, m.q, dtype, rows, cols)) printf("dequantize: %s\n", loip_last_error());
    return m;
}

static float *rand_vec(size_t n, float scale, float bias) {
    float *v = malloc(n * 4);
    for (size_t i = 0; i < n; i++) v[i] = bias + scale * uniform();
    return v;
}

typedef struct {
    loip_model_config c;
    float *embed, *out_norm, *head, *norms[LAYERS][2], *router[LAYERS];
    mat w[LAYERS][LOIP_W_COUNT];
    mat ex[LAYERS][E][LOIP_EXPERT_PARTS];
} model_w;

static void shape_of(int which, int64_t *rows, int64_t *cols) {
    switch (which) {
    case LOIP_W_WQ: *rows = HEADS * HD, *cols = DIM; break;
    case LOIP_W_WK: case LOIP_W_WV: *rows = KV * HD, *cols = DIM; break;
    case LOIP_W_WO: *rows = DIM, *cols = HEADS * HD; break;
    case LOIP_W_GATE: case LOIP_W_UP: *rows = HID, *cols = DIM; break;
    default: *rows = DIM, *cols = HID; break; /* down */
    }
}

static const int MATS[] = {LOIP_W_WQ, LOIP_W_WK, LOIP_W_WV, LOIP_W_WO, LOIP_W_GATE, LOIP_W_UP, LOIP_W_DOWN};

static void make_weights(model_w *W, int32_t dtype, int moe) {
    memset(W, 0, sizeof *W);
    W->c = (loip_model_config){.dim = DIM, .hidden_dim = moe ? EDIM : HID, .n_layers = LAYERS, .n_heads = HEADS,
                               .n_kv_heads = KV, .head_dim = HD, .vocab_size = VOCAB, .max_seq = 64,
                               .norm_eps = 1e-5f, .rope_theta = 10000.0f, .rope_layout = LOIP_ROPE_HALF};
    if (moe) W->c.n_experts = E, W->c.n_experts_used = 2, W->c.expert_dim = EDIM, W->c.norm_topk_prob = 1;
    W->embed = rand_vec((size_t)VOCAB * DIM, 1.0f, 0);
    W->out_norm = rand_vec(DIM, 0.1f, 1.0f);
    W->head = rand_vec((size_t)VOCAB * DIM, 0.1f, 0);
    for (int l = 0; l < LAYERS; l++) {
        W->norms[l][0] = rand_vec(DIM, 0.1f, 1.0f);
        W->norms[l][1] = rand_vec(DIM, 0.1f, 1.0f);
        for (int k = 0; k < (moe ? 4 : 7); k++) {
            int64_t r, c;
            shape_of(MATS[k], &r, &c);
            W->w[l][MATS[k]] = make_mat(dtype, r, c);
        }
        if (!moe) continue;
        W->router[l] = rand_vec((size_t)E * DIM, 0.5f, 0);
        for (int e = 0; e < E; e++)
            for (int p = 0; p < LOIP_EXPERT_PARTS; p++)
                W->ex[l][e][p] = p == LOIP_EXPERT_DOWN ? make_mat(LOIP_MXFP4, DIM, EDIM)
                                                       : make_mat(LOIP_MXFP4, EDIM, DIM);
    }
}

static int bind(loip_model *m, int layer, int which, const void *data, int32_t dtype, int64_t rows, int64_t cols) {
    loip_tensor t = {.data = data, .dtype = dtype, .ndim = cols ? 2 : 1, .shape = {rows, cols}};
    return loip_model_bind(m, layer, which, &t);
}

/* The model with its matrices quantized (quant = 1: dtype's bytes) or dequantized (F32). */
static loip_model *make_model(const model_w *W, int32_t dtype, int quant) {
    loip_model *m = NULL;
    if (loip_model_new(&W->c, &m)) return NULL;
    int rc = bind(m, -1, LOIP_W_EMBED, W->embed, LOIP_F32, VOCAB, DIM) |
             bind(m, -1, LOIP_W_OUTPUT_NORM, W->out_norm, LOIP_F32, DIM, 0) |
             bind(m, -1, LOIP_W_LM_HEAD, W->head, LOIP_F32, VOCAB, DIM);
    for (int l = 0; l < LAYERS; l++) {
        rc |= bind(m, l, LOIP_W_ATTN_NORM, W->norms[l][0], LOIP_F32, DIM, 0);
        rc |= bind(m, l, LOIP_W_FFN_NORM, W->norms[l][1], LOIP_F32, DIM, 0);
        for (int k = 0; k < (W->c.n_experts ? 4 : 7); k++) {
            const mat *x = &W->w[l][MATS[k]];
            rc |= bind(m, l, MATS[k], quant ? x->q : (void *)x->f, quant ? dtype : LOIP_F32, x->rows, x->cols);
        }
        if (!W->c.n_experts) continue;
        rc |= bind(m, l, LOIP_W_ROUTER, W->router[l], LOIP_F32, E, DIM);
        for (int e = 0; e < E; e++)
            for (int p = 0; p < LOIP_EXPERT_PARTS; p++) {
                const mat *x = &W->ex[l][e][p];
                loip_tensor t = {.data = quant ? x->q : (void *)x->f, .dtype = quant ? LOIP_MXFP4 : LOIP_F32,
                                 .ndim = 2, .shape = {x->rows, x->cols}};
                rc |= loip_model_bind_expert(m, l, e, p, &t);
            }
    }
    if (rc || loip_model_check(m, 0, LAYERS)) {
        printf("make_model: %s\n", loip_last_error());
        loip_model_free(m);
        return NULL;
    }
    return m;
}

/* Prefill NTOK tokens (all logits), then one decode step; logits into out[(NTOK + 1) * VOCAB]. */
static int run(loip_model *m, loip_pool *pool, float *out) {
    loip_session *s = NULL;
    int rc = loip_session_new_layers(m, pool, 32, NTOK, NULL, NULL, &s);
    if (rc) return rc;
    int32_t toks[NTOK + 1] = {3, 17, 5, 40, 9, 22};
    rc = loip_session_forward(s, toks, NTOK, 0, out, LOIP_LOGITS_ALL);
    if (!rc) rc = loip_session_forward(s, toks + NTOK, 1, NTOK, out + NTOK * VOCAB, LOIP_LOGITS_LAST);
    loip_session_free(s);
    return rc;
}

static void compare(const char *what, int32_t dtype, int moe, loip_pool *pool) {
    model_w W;
    make_weights(&W, dtype, moe);
    loip_model *mq = make_model(&W, dtype, 1), *mf = make_model(&W, dtype, 0);
    CHECK(mq && mf, "%s: both models bind", what);
    if (!mq || !mf) return;
    uint64_t want = 0;
    for (int l = 0; l < LAYERS; l++) {
        for (int k = 0; k < (moe ? 4 : 7); k++) want += loip_dtype_bytes(dtype, W.w[l][MATS[k]].rows, W.w[l][MATS[k]].cols);
        for (int e = 0; e < (moe ? E : 0); e++)
            for (int p = 0; p < LOIP_EXPERT_PARTS; p++)
                want += loip_dtype_bytes(LOIP_MXFP4, W.ex[l][e][p].rows, W.ex[l][e][p].cols);
    }
    uint64_t fl = (uint64_t)4 * (2 * VOCAB * DIM + DIM + LAYERS * 2 * DIM + (moe ? LAYERS * E * DIM : 0));
    CHECK(loip_model_weight_bytes(mq) == want + fl, "%s: weight bytes %llu, expected %llu", what,
          (unsigned long long)loip_model_weight_bytes(mq), (unsigned long long)(want + fl));
    static const char *names[] = {"ref", "avx2", "avx512"};
    float *a = malloc((NTOK + 1) * VOCAB * 4), *b = malloc((NTOK + 1) * VOCAB * 4);
    for (int v = 0; v < 3; v++) {
        if (loip_kernels_use(names[v])) continue; /* not on this CPU */
        int ok = run(mq, pool, a) == LOIP_OK && run(mf, pool, b) == LOIP_OK;
        int finite = 1;
        double top = 0, err = 0;
        for (int i = 0; ok && i < (NTOK + 1) * VOCAB; i++) {
            finite &= isfinite(a[i]) != 0;
            top = fabs(b[i]) > top ? fabs(b[i]) : top;
            err = fabs(a[i] - b[i]) > err ? fabs(a[i] - b[i]) : err;
        }
        if (dtype == LOIP_MXFP4 || v == 0) /* (quant.h: the SIMD F8 kernels scale per block) */
            CHECK(ok && finite && !memcmp(a, b, (NTOK + 1) * VOCAB * 4),
                  "%s, %s kernels: logits equal the dequantized F32 model's, bit for bit", what, names[v]);
        else
            CHECK(ok && finite && err <= 1e-5 * top,
                  "%s, %s kernels: logits within 1e-5 of the largest of the dequantized F32 model's (%.3g)",
                  what, names[v], err / top);
    }
    loip_kernels_use("auto");
    free(a), free(b);
    loip_model_free(mq), loip_model_free(mf);
    for (int l = 0; l < LAYERS; l++) {
        for (int k = 0; k < 7; k++) free(W.w[l][MATS[k]].q), free(W.w[l][MATS[k]].f);
        for (int e = 0; e < E; e++)
            for (int p = 0; p < LOIP_EXPERT_PARTS; p++) free(W.ex[l][e][p].q), free(W.ex[l][e][p].f);
        free(W.norms[l][0]), free(W.norms[l][1]), free(W.router[l]);
    }
    free(W.embed), free(W.out_norm), free(W.head);
}

static void bad_bindings(void) {
    loip_model_config c = {.dim = DIM, .hidden_dim = 100, .n_layers = 1, .n_heads = HEADS, .n_kv_heads = KV,
                           .head_dim = HD, .vocab_size = VOCAB, .max_seq = 64, .norm_eps = 1e-5f,
                           .rope_theta = 10000.0f};
    loip_model *m = NULL;
    CHECK(loip_model_new(&c, &m) == LOIP_OK, "model_new");
    if (!m) return;
    static uint8_t buf[1 << 20];
    int rc = bind(m, 0, LOIP_W_DOWN, buf, LOIP_MXFP4, DIM, 100);
    CHECK(rc == LOIP_ESHAPE && strstr(loip_last_error(), "down") && strstr(loip_last_error(), "100") &&
              strstr(loip_last_error(), "32"),
          "an MXFP4 down of 100 columns is refused naming it and the row length");
    CHECK(bind(m, 0, LOIP_W_GATE, buf, LOIP_MXFP4, 100, DIM) == LOIP_OK, "an MXFP4 gate of 256 columns binds");
    CHECK(bind(m, 0, LOIP_W_GATE, buf, LOIP_F8_E4M3, 100, DIM) == LOIP_OK, "an F8 gate binds");
    rc = bind(m, 0, LOIP_W_ATTN_NORM, buf, LOIP_F8_E4M3, DIM, 0);
    CHECK(rc == LOIP_ESHAPE && strstr(loip_last_error(), "matrices only"), "an F8 norm is refused");
    rc = bind(m, -1, LOIP_W_EMBED, buf, LOIP_MXFP4, VOCAB, DIM);
    CHECK(rc == LOIP_ESHAPE && strstr(loip_last_error(), "embedding"), "an MXFP4 embedding is refused");
    loip_model_free(m);
}

int main(void) {
    loip_pool *pool = NULL;
    if (loip_pool_new(2, &pool)) return 1;
    bad_bindings();
    compare("dense MXFP4", LOIP_MXFP4, 0, pool);
    compare("dense F8", LOIP_F8_E4M3, 0, pool);
    compare("MoE, F8 attention, MXFP4 experts", LOIP_F8_E4M3, 1, pool);
    loip_pool_free(pool);
    printf("test_quant_model: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
