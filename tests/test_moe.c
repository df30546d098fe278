/* test_moe.c — the mixture-of-experts MLP and the expert cache. A layer's MoE MLP over random
 * weights equals a plain reference computed here (softmax over every expert, top-k with ties to
 * the lower index, renormalised or not, SwiGLU experts, a shared expert with or without its
 * sigmoid gate) within float noise; the same blocks with the experts not bound but read through
 * the expert cache (one slot, a few, all; LRU, LFU, static with pins; pre-gating on and off) give
 * bit-identical hidden states, read only routed experts (bytes = reads x an expert's extent; the
 * read-everything baseline reads every expert of every layer run), and
 * count what they did; an expert neither bound nor cached, a cache whose every slot is pinned and
 * a truncated expert file fail naming the expert or the file. Exit 0 pass, 1 fail, 77 skip. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loip.h"
#include "check.h"

enum { DIM = 32, HID = 24, LAYERS = 2, HEADS = 4, KV = 2, HD = 8, VOCAB = 64, E = 6, EDIM = 16, N = 5 };

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

typedef struct {
    loip_model_config c;
    float *w[LAYERS][LOIP_W_COUNT];
    float *ex[LAYERS][E][LOIP_EXPERT_PARTS];
} weights;

static float *rand_array(size_t n, float scale, float base) {
    float *a = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) a[i] = base + scale * frand();
    return a;
}

static void make_weights(weights *W, int k, int norm_topk, int shared, int gate) {
    memset(W, 0, sizeof *W);
    loip_model_config *c = &W->c;
    *c = (loip_model_config){.dim = DIM, .hidden_dim = shared ? HID : EDIM, .n_layers = LAYERS, .n_heads = HEADS,
                             .n_kv_heads = KV, .head_dim = HD, .vocab_size = VOCAB, .max_seq = 64, .norm_eps = 1e-5f,
                             .rope_theta = 10000.0f, .rope_layout = LOIP_ROPE_HALF, .n_experts = E,
                             .n_experts_used = k, .expert_dim = EDIM, .norm_topk_prob = norm_topk,
                             .shared_expert = shared, .shared_expert_gate = gate};
    size_t q = HEADS * HD, kv = KV * HD;
    for (int l = 0; l < LAYERS; l++) {
        W->w[l][LOIP_W_ATTN_NORM] = rand_array(DIM, 0.1f, 1.0f);
        W->w[l][LOIP_W_FFN_NORM] = rand_array(DIM, 0.1f, 1.0f);
        W->w[l][LOIP_W_WQ] = rand_array(q * DIM, 0.3f, 0);
        W->w[l][LOIP_W_WK] = rand_array(kv * DIM, 0.3f, 0);
        W->w[l][LOIP_W_WV] = rand_array(kv * DIM, 0.3f, 0);
        W->w[l][LOIP_W_WO] = rand_array(DIM * q, 0.3f, 0);
        W->w[l][LOIP_W_ROUTER] = rand_array((size_t)E * DIM, 0.5f, 0);
        if (shared) {
            W->w[l][LOIP_W_GATE] = rand_array((size_t)HID * DIM, 0.3f, 0);
            W->w[l][LOIP_W_UP] = rand_array((size_t)HID * DIM, 0.3f, 0);
            W->w[l][LOIP_W_DOWN] = rand_array((size_t)DIM * HID, 0.3f, 0);
        }
        if (gate) W->w[l][LOIP_W_SHARED_GATE] = rand_array(DIM, 0.5f, 0);
        for (int e = 0; e < E; e++)
            for (int p = 0; p < LOIP_EXPERT_PARTS; p++) W->ex[l][e][p] = rand_array((size_t)EDIM * DIM, 0.3f, 0);
    }
}

static void free_weights(weights *W) {
    for (int l = 0; l < LAYERS; l++) {
        for (int w = 0; w < LOIP_W_COUNT; w++) free(W->w[l][w]);
        for (int e = 0; e < E; e++)
            for (int p = 0; p < LOIP_EXPERT_PARTS; p++) free(W->ex[l][e][p]);
    }
}

static int64_t rows_of(const weights *W, int which) {
    switch (which) {
    case LOIP_W_WQ: return HEADS * HD;
    case LOIP_W_WK: case LOIP_W_WV: return KV * HD;
    case LOIP_W_WO: return DIM;
    case LOIP_W_ROUTER: return E;
    case LOIP_W_GATE: case LOIP_W_UP: return HID;
    case LOIP_W_DOWN: return DIM;
    case LOIP_W_SHARED_GATE: return 1;
    default: return DIM; /* norms */
    }
    (void)W;
}

static int64_t cols_of(int which) {
    switch (which) {
    case LOIP_W_WQ: case LOIP_W_WK: case LOIP_W_WV: case LOIP_W_ROUTER: case LOIP_W_GATE: case LOIP_W_UP:
    case LOIP_W_SHARED_GATE: return DIM;
    case LOIP_W_WO: return HEADS * HD;
    case LOIP_W_DOWN: return HID;
    default: return 0;
    }
}

static loip_model *make_model(const weights *W, int bind_experts) {
    loip_model *m = NULL;
    if (loip_model_new(&W->c, &m)) return NULL;
    for (int l = 0; l < LAYERS; l++) {
        for (int w = LOIP_W_ATTN_NORM; w < LOIP_W_COUNT; w++) {
            if (!W->w[l][w]) continue;
            int64_t cols = cols_of(w);
            loip_tensor t = {.data = W->w[l][w], .dtype = LOIP_F32, .ndim = cols ? 2 : 1, .shape = {rows_of(W, w), cols}};
            if (loip_model_bind(m, l, w, &t)) fprintf(stderr, "bind %d/%d: %s\n", l, w, loip_last_error());
        }
        for (int e = 0; bind_experts && e < E; e++)
            for (int p = 0; p < LOIP_EXPERT_PARTS; p++) {
                loip_tensor t = {.data = W->ex[l][e][p], .dtype = LOIP_F32, .ndim = 2,
                                 .shape = {p == LOIP_EXPERT_DOWN ? DIM : EDIM, p == LOIP_EXPERT_DOWN ? EDIM : DIM}};
                if (loip_model_bind_expert(m, l, e, p, &t)) fprintf(stderr, "bind expert: %s\n", loip_last_error());
            }
    }
    return m;
}

/* ---- the reference MoE MLP, written out plainly ---------------------------------------- */

static void rmsnorm(float *o, const float *x, const float *w) {
    double ss = 0;
    for (int i = 0; i < DIM; i++) ss += (double)x[i] * x[i];
    float r = 1.0f / sqrtf((float)(ss / DIM) + 1e-5f);
    for (int i = 0; i < DIM; i++) o[i] = x[i] * r * w[i];
}

static void swiglu_mlp(const float *x, const float *g, const float *u, const float *d, int hid, float *out) {
    float h[64];
    for (int j = 0; j < hid; j++) {
        double a = 0, b = 0;
        for (int i = 0; i < DIM; i++) a += (double)g[j * DIM + i] * x[i], b += (double)u[j * DIM + i] * x[i];
        h[j] = (float)(a / (1.0 + exp(-a)) * b);
    }
    for (int i = 0; i < DIM; i++) {
        double s = 0;
        for (int j = 0; j < hid; j++) s += (double)d[i * hid + j] * h[j];
        out[i] = (float)s;
    }
}

/* hidden += MoE(ffn_norm(hidden)) for one row of layer l. */
static void reference_moe(const weights *W, int l, float *hidden) {
    const loip_model_config *c = &W->c;
    float x[DIM], z[E], p[E], y[DIM], out[DIM] = {0};
    rmsnorm(x, hidden, W->w[l][LOIP_W_FFN_NORM]);
    double zmax = -1e30, sum = 0;
    for (int e = 0; e < E; e++) {
        double s = 0;
        for (int i = 0; i < DIM; i++) s += (double)W->w[l][LOIP_W_ROUTER][e * DIM + i] * x[i];
        z[e] = (float)s;
        if (s > zmax) zmax = s;
    }
    for (int e = 0; e < E; e++) sum += exp(z[e] - zmax);
    for (int e = 0; e < E; e++) p[e] = (float)(exp(z[e] - zmax) / sum);
    int chosen[E] = {0};
    double wsum = 0;
    int ids[E];
    for (int j = 0; j < c->n_experts_used; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!chosen[e] && (best < 0 || p[e] > p[best])) best = e;
        chosen[best] = 1, ids[j] = best, wsum += p[best];
    }
    for (int j = 0; j < c->n_experts_used; j++) {
        int e = ids[j];
        float w = c->norm_topk_prob ? (float)(p[e] / wsum) : p[e];
        swiglu_mlp(x, W->ex[l][e][0], W->ex[l][e][1], W->ex[l][e][2], EDIM, y);
        for (int i = 0; i < DIM; i++) out[i] += w * y[i];
    }
    if (c->shared_expert) {
        swiglu_mlp(x, W->w[l][LOIP_W_GATE], W->w[l][LOIP_W_UP], W->w[l][LOIP_W_DOWN], HID, y);
        float g = 1.0f;
        if (c->shared_expert_gate) {
            double s = 0;
            for (int i = 0; i < DIM; i++) s += (double)W->w[l][LOIP_W_SHARED_GATE][i] * x[i];
            g = (float)(1.0 / (1.0 + exp(-s)));
        }
        for (int i = 0; i < DIM; i++) out[i] += g * y[i];
    }
    for (int i = 0; i < DIM; i++) hidden[i] += out[i];
}

/* ---- the experts on disk: one file, each expert's three parts 4 KiB-aligned --------------- */

static char dir[256], path[300];
#define EXPERT_BYTES (3 * 4096ull) /* gate, up, down: 16 x 32 floats = 2 KiB each, padded */

static uint64_t expert_offset(int l, int e) { return ((uint64_t)l * E + (uint64_t)e) * EXPERT_BYTES; }

static void write_experts(const weights *W) {
    FILE *f = fopen(path, "wb");
    uint8_t page[4096];
    for (int l = 0; l < LAYERS; l++)
        for (int e = 0; e < E; e++)
            for (int p = 0; p < LOIP_EXPERT_PARTS; p++) {
                memset(page, 0, sizeof page);
                memcpy(page, W->ex[l][e][p], EDIM * DIM * sizeof(float));
                fwrite(page, 1, sizeof page, f);
            }
    fclose(f);
}

static loip_experts *make_cache(loip_model *m, int slots, int policy, int prefetch, const weights *W) {
    loip_loader_config lc = {.slot_bytes = EXPERT_BYTES, .n_slots = slots};
    loip_experts_config xc = {.policy = policy, .prefetch = prefetch, .event_capacity = 256};
    loip_experts *x = NULL;
    if (loip_experts_new(m, &lc, &xc, &x)) return NULL;
    for (int l = 0; l < LAYERS; l++) {
        for (int e = 0; e < E; e++) {
            loip_load_extent ext = {.path = path, .fd = -1, .file_offset = expert_offset(l, e), .length = EXPERT_BYTES};
            uint64_t off[3] = {0, 4096, 8192};
            if (loip_experts_set_source(x, l, e, &ext, off, LOIP_F32)) fprintf(stderr, "source: %s\n", loip_last_error());
        }
        loip_tensor norm = {.data = W->w[l][LOIP_W_FFN_NORM], .dtype = LOIP_F32, .ndim = 1, .shape = {DIM}};
        loip_tensor router = {.data = W->w[l][LOIP_W_ROUTER], .dtype = LOIP_F32, .ndim = 2, .shape = {E, DIM}};
        if (prefetch) loip_experts_set_gating(x, l, &norm, &router);
    }
    return x;
}

/* Blocks [first, last) of a model over a copy of x0 (n rows). */
static int run_rows(loip_model *m, loip_pool *pool, loip_experts *x, int first, int last, const float *x0, float *out,
                    int n) {
    loip_session *s = NULL;
    int rc = loip_session_new_layers(m, pool, 64, N, NULL, NULL, &s);
    if (rc) return rc;
    if (x) loip_session_set_experts(s, x);
    memcpy(out, x0, sizeof(float) * (size_t)n * DIM);
    rc = loip_session_blocks(s, first, last, out, n, 0);
    loip_session_free(s);
    return rc;
}

static int run_blocks(loip_model *m, loip_pool *pool, loip_experts *x, int first, int last, const float *x0,
                      float *out) {
    return run_rows(m, pool, x, first, last, x0, out, N);
}

static void variant(loip_pool *pool, int k, int norm_topk, int shared, int gate) {
    weights W;
    make_weights(&W, k, norm_topk, shared, gate);
    write_experts(&W);
    float x0[N * DIM], want[N * DIM], got[N * DIM], ref[N * DIM];
    for (int i = 0; i < N * DIM; i++) x0[i] = frand();
    loip_model *m = make_model(&W, 1);
    CHECK(m != NULL, "model: %s", loip_last_error());
    if (!m) return;
    /* layer 0's MLP block alone against the reference */
    CHECK(run_blocks(m, pool, NULL, 1, 2, x0, got) == 0, "mlp block: %s", loip_last_error());
    memcpy(ref, x0, sizeof ref);
    for (int t = 0; t < N; t++) reference_moe(&W, 0, ref + t * DIM);
    float maxerr = 0, maxv = 0;
    for (int i = 0; i < N * DIM; i++) {
        maxerr = fmaxf(maxerr, fabsf(got[i] - ref[i]));
        maxv = fmaxf(maxv, fabsf(ref[i]));
    }
    CHECK(maxerr <= 1e-5f * fmaxf(1.0f, maxv), "k=%d norm=%d shared=%d gate=%d: MoE MLP differs from the reference "
          "by %g", k, norm_topk, shared, gate, maxerr);
    /* the whole two layers, every expert bound: the hidden state the cached runs must give */
    CHECK(run_blocks(m, pool, NULL, 0, 2 * LAYERS, x0, want) == 0, "blocks: %s", loip_last_error());

    loip_model *mc = make_model(&W, 0); /* no expert bound */
    int rc = run_blocks(mc, pool, NULL, 0, 2 * LAYERS, x0, got);
    CHECK(rc == LOIP_ESTATE && strstr(loip_last_error(), "of layer 0 is not in memory"),
          "an unbound expert without a cache: %d %s", rc, loip_last_error());
    int slot_counts[] = {1, 2, E, LAYERS * E};
    for (int si = 0; si < 4; si++)
        for (int policy = LOIP_EXPERTS_LRU; policy <= LOIP_EXPERTS_ALL; policy++)
            for (int prefetch = 0; prefetch <= 2; prefetch++) {
                loip_experts *x = make_cache(mc, slot_counts[si], policy, prefetch, &W);
                CHECK(x != NULL, "cache: %s", loip_last_error());
                if (!x) continue;
                if (policy == LOIP_EXPERTS_STATIC && slot_counts[si] > 1)
                    CHECK(loip_experts_pin(x, 1, 0) == 0, "pin: %s", loip_last_error());
                for (int rep = 0; rep < 2; rep++) { /* the second run finds experts kept */
                    rc = run_blocks(mc, pool, x, 0, 2 * LAYERS, x0, got);
                    CHECK(rc == 0, "cached run (%d slots, policy %d, prefetch %d): %s", slot_counts[si], policy,
                          prefetch, loip_last_error());
                    CHECK(memcmp(got, want, sizeof got) == 0, "cached run (%d slots, policy %d, prefetch %d, run %d) "
                          "differs from the bound one", slot_counts[si], policy, prefetch, rep);
                }
                loip_experts_stats_t st;
                loip_experts_stats(x, &st);
                CHECK(st.bound == 0 && st.routed > 0 && st.cache_hits + st.read == st.routed,
                      "counts: routed %llu = hits %llu + reads %llu", (unsigned long long)st.routed,
                      (unsigned long long)st.cache_hits, (unsigned long long)st.read);
                CHECK(st.routed <= 2ull * LAYERS * E, "routed %llu", (unsigned long long)st.routed);
                CHECK(st.bytes_read == (st.read + st.prefetched) * EXPERT_BYTES, "bytes read %llu for %llu reads",
                      (unsigned long long)st.bytes_read, (unsigned long long)(st.read + st.prefetched));
                if (slot_counts[si] == LAYERS * E && policy != LOIP_EXPERTS_ALL)
                    CHECK(st.read + st.prefetched <= LAYERS * E, "a cache of every expert read some twice: %llu reads",
                          (unsigned long long)(st.read + st.prefetched));
                if (prefetch) CHECK(st.prefetched > 0 || st.cache_hits > 0, "pre-gating read nothing");
                if (policy == LOIP_EXPERTS_ALL) /* 2 runs, every expert each, whatever the slots */
                    CHECK(st.read + st.prefetched == 2ull * LAYERS * E, "the baseline read %llu experts, not %d",
                          (unsigned long long)(st.read + st.prefetched), 2 * LAYERS * E);
                loip_runner_event ev[256];
                int n_ev = loip_experts_events(x, ev, 256);
                CHECK(n_ev > 0 && ev[0].kind == LOIP_EVENT_LOAD && ev[0].bytes == EXPERT_BYTES, "events: %d", n_ev);
                loip_experts_free(x);
            }
    /* a cache of exactly top-k slots with pre-gating: an expert already in a slot (a guess the
     * router confirmed) is never read again in the same layer run to make room for another */
    {
        loip_experts *x = make_cache(mc, k, LOIP_EXPERTS_LRU, 1, &W);
        int twice = 0;
        for (int trial = 0; trial < 60; trial++) {
            float one[DIM], out[DIM];
            for (int i = 0; i < DIM; i++) one[i] = frand();
            CHECK(run_rows(mc, pool, x, 0, 2 * LAYERS, one, out, 1) == 0, "one row: %s", loip_last_error());
            loip_runner_event ev[64];
            int n_ev = loip_experts_events(x, ev, 64);
            for (int i = 0; i < n_ev; i++)
                for (int j = i + 1; j < n_ev; j++)
                    twice += ev[i].stage == ev[j].stage && ev[i].first_block == ev[j].first_block;
        }
        CHECK(twice == 0, "%d experts read twice in one layer run (k = %d slots)", twice, k);
        loip_experts_free(x);
    }
    /* pre-gating that the router does not confirm often enough stops (but for probes) */
    {
        loip_loader_config lc = {.slot_bytes = EXPERT_BYTES, .n_slots = E};
        loip_experts_config xc = {.policy = LOIP_EXPERTS_LRU, .prefetch = 1, .prefetch_min_accuracy = 1.0f,
                                  .prefetch_probe_every = 4};
        loip_experts *x = NULL;
        CHECK(loip_experts_new(mc, &lc, &xc, &x) == 0, "cache: %s", loip_last_error());
        for (int l = 0; l < LAYERS; l++) {
            for (int e = 0; e < E; e++) {
                loip_load_extent ext = {.path = path, .fd = -1, .file_offset = expert_offset(l, e), .length = EXPERT_BYTES};
                uint64_t off[3] = {0, 4096, 8192};
                loip_experts_set_source(x, l, e, &ext, off, LOIP_F32);
            }
            loip_tensor norm = {.data = W.w[l][LOIP_W_FFN_NORM], .dtype = LOIP_F32, .ndim = 1, .shape = {DIM}};
            loip_tensor router = {.data = W.w[l][LOIP_W_ROUTER], .dtype = LOIP_F32, .ndim = 2, .shape = {E, DIM}};
            loip_experts_set_gating(x, l, &norm, &router);
        }
        for (int rep = 0; rep < 12; rep++) {
            CHECK(run_blocks(mc, pool, x, 0, 2 * LAYERS, x0, got) == 0, "run: %s", loip_last_error());
            CHECK(memcmp(got, want, sizeof got) == 0, "with pre-gating stopping, run %d differs", rep);
        }
        loip_experts_stats_t st;
        loip_experts_stats(x, &st);
        /* (an accuracy of 1 is never reached once a guess was wrong: most runs skip, every 4th probes) */
        CHECK(st.prefetch_hits == st.prefetched || st.prefetch_skipped > 0, "skipped %llu of a wrong predictor",
              (unsigned long long)st.prefetch_skipped);
        loip_experts_free(x);
        xc.prefetch_min_accuracy = 1.5f;
        CHECK(loip_experts_new(mc, &lc, &xc, &x) == LOIP_EINVAL, "min accuracy 1.5 accepted");
    }
    /* every slot pinned: a layer needing another expert says so */
    {
        loip_experts *x = make_cache(mc, 1, LOIP_EXPERTS_STATIC, 0, &W);
        CHECK(loip_experts_pin(x, 1, 5) == 0, "pin: %s", loip_last_error());
        rc = loip_experts_pin(x, 1, 4);
        CHECK(rc == LOIP_ENOMEM && strstr(loip_last_error(), "pinned"), "a second pin in one slot: %d %s", rc,
              loip_last_error());
        rc = run_blocks(mc, pool, x, 0, 2 * LAYERS, x0, got);
        CHECK(rc == LOIP_ESTATE && strstr(loip_last_error(), "pinned"), "all pinned: %d %s", rc, loip_last_error());
        loip_experts_free(x);
    }
    loip_model_free(mc);
    loip_model_free(m);
    free_weights(&W);
}

static void errors(loip_pool *pool) {
    weights W;
    make_weights(&W, 2, 1, 0, 0);
    write_experts(&W);
    loip_model *mc = make_model(&W, 0);
    /* the expert file cut short: the read fails naming the file and the expert */
    loip_experts *x = make_cache(mc, 2, LOIP_EXPERTS_LRU, 0, &W);
    float x0[N * DIM], got[N * DIM], want[N * DIM];
    for (int i = 0; i < N * DIM; i++) x0[i] = frand();
    loip_model *mb = make_model(&W, 1);
    CHECK(run_blocks(mb, pool, NULL, 0, 2 * LAYERS, x0, want) == 0, "bound: %s", loip_last_error());
    loip_model_free(mb);
    CHECK(truncate(path, 4096) == 0, "truncate");
    int rc = run_blocks(mc, pool, x, 0, 2 * LAYERS, x0, got);
    CHECK(rc != 0 && strstr(loip_last_error(), path) && strstr(loip_last_error(), "expert"),
          "a truncated expert file: %d %s", rc, loip_last_error());
    /* the file back: the next run reads again and gives the bound model's state (nothing left
     * loading, held or failed from the run that failed) */
    write_experts(&W);
    for (int cache = 2; cache <= 3; cache++) {
        loip_experts *y = make_cache(mc, cache, LOIP_EXPERTS_LRU, 1, &W);
        CHECK(truncate(path, 4096) == 0, "truncate");
        CHECK(run_blocks(mc, pool, y, 0, 2 * LAYERS, x0, got) != 0, "a truncated file read");
        write_experts(&W);
        rc = run_blocks(mc, pool, y, 0, 2 * LAYERS, x0, got);
        CHECK(rc == 0 && memcmp(got, want, sizeof got) == 0, "after the file came back (%d slots): %d %s", cache, rc,
              loip_last_error());
        loip_experts_free(y);
    }
    loip_model_free(mc); /* the model may go before its cache */
    loip_experts_free(x);
    mc = make_model(&W, 0);
    /* bad configs and bindings */
    loip_model_config c = W.c;
    loip_model *bad = NULL;
    c.n_experts_used = E + 1;
    CHECK(loip_model_new(&c, &bad) == LOIP_EINVAL && strstr(loip_last_error(), "n_experts_used"), "top-k > experts");
    c = W.c, c.shared_expert_gate = 1, c.shared_expert = 0;
    CHECK(loip_model_new(&c, &bad) == LOIP_EINVAL && strstr(loip_last_error(), "shared_expert_gate"), "gate alone");
    loip_tensor t = {.data = W.ex[0][0][0], .dtype = LOIP_F32, .ndim = 2, .shape = {DIM, EDIM}};
    rc = loip_model_bind_expert(mc, 0, 0, LOIP_EXPERT_GATE, &t);
    CHECK(rc == LOIP_ESHAPE && strstr(loip_last_error(), "expert 0's gate of layer 0"), "a transposed gate: %s",
          loip_last_error());
    CHECK(loip_model_bind_expert(mc, 0, E, 0, &t) == LOIP_EINVAL, "expert out of range");
    loip_model_free(mc);
    free_weights(&W);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/loip-moe-XXXXXX");
    if (!mkdtemp(dir)) {
        printf("test_moe: cannot make a temp dir; skipped\n");
        return 77;
    }
    snprintf(path, sizeof path, "%s/experts.bin", dir);
    loip_pool *pool = NULL;
    loip_pool_new(2, &pool);
    variant(pool, 2, 1, 0, 0); /* Mixtral: top-2, renormalised */
    variant(pool, 4, 1, 0, 0); /* Qwen3-MoE */
    variant(pool, 3, 0, 1, 1); /* Qwen2-MoE: not renormalised, shared expert with its gate */
    variant(pool, 2, 0, 1, 0); /* a shared expert without a gate */
    errors(pool);
    loip_pool_free(pool);
    unlink(path);
    rmdir(dir);
    printf("test_moe: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
