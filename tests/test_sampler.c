/* test_sampler.c — loip_sampler_* against direct computations of the distributions it must
 * draw from. Statistical checks use fixed seeds (deterministic) and a 5-sigma band, so a
 * failure means a wrong distribution, not bad luck. Exit 0 pass, 1 fail. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loip.h"
#include "check.h"


static loip_sampler_params defaults(void) {
    loip_sampler_params p = {.temperature = 1.0f,
                             .top_k = 0,
                             .top_p = 1.0f,
                             .min_p = 0.0f,
                             .repetition_penalty = 1.0f,
                             .penalty_last_n = 0};
    return p;
}

static loip_sampler *new_sampler(int32_t vocab, uint64_t seed) {
    loip_sampler *s = NULL;
    int rc = loip_sampler_new(vocab, seed, &s);
    if (rc != 0 || s == NULL) {
        fprintf(stderr, "loip_sampler_new(%d): %d %s\n", vocab, rc, loip_last_error());
        exit(1);
    }
    return s;
}

static int32_t draw(loip_sampler *s, const float *logits, const loip_sampler_params *p,
                    const int32_t *hist, int32_t nh) {
    int32_t tok = -1;
    int rc = loip_sampler_sample(s, logits, p, hist, nh, &tok);
    if (rc != 0) {
        fprintf(stderr, "loip_sampler_sample: %d %s\n", rc, loip_last_error());
        exit(1);
    }
    return tok;
}

/* Softmax of logits/T in double, the oracle for the frequency checks. */
static void softmax(const float *l, int n, double T, double *p) {
    double m = -INFINITY, s = 0;
    for (int i = 0; i < n; i++) m = fmax(m, l[i]);
    for (int i = 0; i < n; i++) s += p[i] = exp((l[i] - m) / T);
    for (int i = 0; i < n; i++) p[i] /= s;
}

/* Draw `draws` tokens and compare the frequencies with want[] (which sums to 1): each within
 * 5 standard deviations of a binomial, and tokens with want 0 never drawn. */
static void check_freqs(const char *what, loip_sampler *s, const float *logits, int n,
                        const loip_sampler_params *p, const int32_t *hist, int32_t nh,
                        const double *want, int draws) {
    long *cnt = calloc((size_t)n, sizeof(long));
    for (int d = 0; d < draws; d++) {
        int32_t t = draw(s, logits, p, hist, nh);
        if (t < 0 || t >= n) {
            CHECK(0, "%s: token %d out of range", what, t);
            free(cnt);
            return;
        }
        cnt[t]++;
    }
    int ok = 1;
    for (int i = 0; i < n; i++) {
        double f = (double)cnt[i] / draws;
        double sd = sqrt(want[i] * (1 - want[i]) / draws);
        if (want[i] == 0 ? cnt[i] != 0 : fabs(f - want[i]) > 5 * sd + 1e-9) {
            fprintf(stderr, "  %s: token %d freq %.5f want %.5f (sd %.5f)\n", what, i, f,
                    want[i], sd);
            ok = 0;
        }
    }
    CHECK(ok, "%s: frequencies differ from the expected distribution", what);
    free(cnt);
}

static uint64_t lcg = 12345;
static float frand(void) { /* test-only logits: a fixed LCG, not the sampler's RNG */
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((lcg >> 40) / 16777216.0);
}

static void test_greedy(void) {
    loip_sampler *s = new_sampler(10, 1);
    loip_sampler_params p = defaults();
    p.temperature = 0.0f;
    float l[10] = {0, 1, 2, 5, 1, 0, -3, 5, 2, 1};
    CHECK(draw(s, l, &p, NULL, 0) == 3, "greedy tie: want the lowest index 3");
    float z[10] = {0};
    CHECK(draw(s, z, &p, NULL, 0) == 0, "greedy all equal: want 0");
    float neg[10] = {-9, -8, -1, -1, -7, -INFINITY, -2, -3, -4, -5};
    CHECK(draw(s, neg, &p, NULL, 0) == 2, "greedy negative tie: want 2");
    p.temperature = -1.0f;
    CHECK(draw(s, l, &p, NULL, 0) == 3, "negative temperature is greedy");
    loip_sampler_free(s);
}

static void test_temperature(void) {
    const int n = 8;
    float l[8] = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 2.5f, 0.0f, -INFINITY};
    double want[8];
    loip_sampler *s = new_sampler(n, 42);
    loip_sampler_params p = defaults();
    p.temperature = 0.7f;
    softmax(l, n, 0.7, want);
    check_freqs("T=0.7", s, l, n, &p, NULL, 0, want, 200000);
    p.temperature = 1.5f;
    softmax(l, n, 1.5, want);
    check_freqs("T=1.5", s, l, n, &p, NULL, 0, want, 200000);
    /* A tiny temperature must stay finite and pick the max. */
    p.temperature = 1e-30f;
    int ok = 1;
    for (int i = 0; i < 1000; i++) ok &= draw(s, l, &p, NULL, 0) == 4;
    CHECK(ok, "T=1e-30 should always give the argmax");
    loip_sampler_free(s);
}

static void test_top_k(void) {
    const int n = 8;
    float l[8] = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 2.5f, 0.0f, 2.5f};
    loip_sampler *s = new_sampler(n, 7);
    loip_sampler_params p = defaults();
    /* k = 3 keeps 4, 5, 7 (5 and 7 tie at 2.5; both fit). */
    p.top_k = 3;
    double want[8] = {0};
    double z = exp(3.0) + 2 * exp(2.5);
    want[4] = exp(3.0) / z;
    want[5] = want[7] = exp(2.5) / z;
    check_freqs("top_k=3", s, l, n, &p, NULL, 0, want, 100000);
    /* k = 2: of the tied 5 and 7, the lower id stays. */
    p.top_k = 2;
    memset(want, 0, sizeof want);
    want[4] = exp(3.0) / (exp(3.0) + exp(2.5));
    want[5] = 1 - want[4];
    check_freqs("top_k=2 tie", s, l, n, &p, NULL, 0, want, 100000);
    loip_sampler_free(s);

    /* top_k = 1 equals greedy, on a large vocabulary with random logits and ties. */
    const int V = 50000;
    float *big = malloc(V * sizeof(float));
    s = new_sampler(V, 99);
    loip_sampler_params g = defaults();
    g.temperature = 0.0f;
    p = defaults();
    p.top_k = 1;
    int ok = 1;
    for (int r = 0; r < 50; r++) {
        for (int i = 0; i < V; i++) big[i] = floorf(frand() * 1000.0f) / 10.0f; /* many ties */
        ok &= draw(s, big, &p, NULL, 0) == draw(s, big, &g, NULL, 0);
    }
    CHECK(ok, "top_k=1 differs from greedy");

    /* top_k = 40 of 128k: every draw is among the 40 largest (a naive full scan decides). */
    const int V2 = 128000;
    float *huge = malloc(V2 * sizeof(float));
    loip_sampler *s2 = new_sampler(V2, 5);
    for (int i = 0; i < V2; i++) huge[i] = 8.0f * frand();
    p.top_k = 40;
    ok = 1;
    for (int r = 0; r < 500; r++) {
        int32_t t = draw(s2, huge, &p, NULL, 0);
        int above = 0; /* tokens strictly better than t */
        for (int i = 0; i < V2; i++) above += huge[i] > huge[t] || (huge[i] == huge[t] && i < t);
        ok &= above < 40;
    }
    CHECK(ok, "top_k=40 on 128k drew a token outside the top 40");
    loip_sampler_free(s2);
    free(huge);
    loip_sampler_free(s);
    free(big);
}

static int desc(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x > y ? -1 : x < y ? 1 : 0;
}

static void test_top_p(void) {
    const int n = 6;
    /* Probabilities 0.4, 0.3, 0.15, 0.1, 0.05, 0 (as logs), shuffled. */
    float l[6] = {logf(0.15f), logf(0.4f), logf(0.05f), logf(0.3f), logf(0.1f), -INFINITY};
    loip_sampler *s = new_sampler(n, 11);
    loip_sampler_params p = defaults();
    /* 0.4 + 0.3 = 0.7 >= 0.65: the nucleus is {1, 3}. */
    p.top_p = 0.65f;
    double want[6] = {0};
    want[1] = 0.4 / 0.7;
    want[3] = 0.3 / 0.7;
    check_freqs("top_p=0.65", s, l, n, &p, NULL, 0, want, 100000);
    /* 0.7 < 0.8 <= 0.85: {1, 3, 0}. */
    p.top_p = 0.8f;
    memset(want, 0, sizeof want);
    want[1] = 0.4 / 0.85;
    want[3] = 0.3 / 0.85;
    want[0] = 0.15 / 0.85;
    check_freqs("top_p=0.8", s, l, n, &p, NULL, 0, want, 100000);
    /* A tiny top_p is the argmax. */
    p.top_p = 1e-6f;
    int ok = 1;
    for (int i = 0; i < 1000; i++) ok &= draw(s, l, &p, NULL, 0) == 1;
    CHECK(ok, "tiny top_p should give the argmax");
    loip_sampler_free(s);

    /* top_p = 0.9 alone on 128k: every draw lies in the nucleus computed by a full sort. */
    const int V = 128000;
    float *big = malloc(V * sizeof(float));
    for (int i = 0; i < V; i++) big[i] = 12.0f * frand();
    double *pr = malloc(V * sizeof(double));
    softmax(big, V, 1.0, pr);
    /* The nucleus is every token with p >= p_m, p_m its smallest member (ties aside). */
    double *sorted = malloc(V * sizeof(double));
    memcpy(sorted, pr, V * sizeof(double));
    qsort(sorted, V, sizeof(double), desc);
    double cum = 0, pm = 0;
    int m = 0;
    while (m < V && cum < 0.9) cum += sorted[m++];
    pm = sorted[m - 1];
    loip_sampler *s2 = new_sampler(V, 17);
    p = defaults();
    p.top_p = 0.9f;
    ok = 1;
    for (int r = 0; r < 300; r++) {
        int32_t t = draw(s2, big, &p, NULL, 0);
        ok &= pr[t] >= pm * (1 - 1e-5);
    }
    CHECK(ok, "top_p=0.9 on 128k drew outside the nucleus (%d tokens)", m);
    loip_sampler_free(s2);

    /* Exact distribution on 2000 tokens: the nucleus from a full sort, renormalised. */
    const int V3 = 2000;
    double *w3 = calloc(V3, sizeof(double));
    softmax(big, V3, 0.5, pr);
    memcpy(sorted, pr, V3 * sizeof(double));
    qsort(sorted, V3, sizeof(double), desc);
    cum = 0;
    m = 0;
    while (m < V3 && cum < 0.5) cum += sorted[m++];
    for (int i = 0; i < V3; i++) w3[i] = pr[i] >= sorted[m - 1] ? pr[i] / cum : 0;
    s2 = new_sampler(V3, 29);
    p = defaults();
    p.temperature = 0.5f;
    p.top_p = 0.5f;
    check_freqs("top_p=0.5 on 2000", s2, big, V3, &p, NULL, 0, w3, 100000);
    loip_sampler_free(s2);

    /* A flat distribution: the nucleus (about 600 of 1000) goes through the quickselect. */
    const int V4 = 1000;
    for (int i = 0; i < V4; i++) big[i] = 0.5f * frand();
    double *w4 = calloc(V4, sizeof(double));
    softmax(big, V4, 1.0, pr);
    memcpy(sorted, pr, V4 * sizeof(double));
    qsort(sorted, V4, sizeof(double), desc);
    cum = 0;
    m = 0;
    while (m < V4 && cum < 0.6) cum += sorted[m++];
    for (int i = 0; i < V4; i++) w4[i] = pr[i] >= sorted[m - 1] ? pr[i] / cum : 0;
    s2 = new_sampler(V4, 37);
    p = defaults();
    p.top_p = 0.6f;
    check_freqs("top_p=0.6 flat on 1000", s2, big, V4, &p, NULL, 0, w4, 60000);
    /* Equal logits: ties enter the nucleus lowest id first (51 of 100 reach 0.505). */
    for (int i = 0; i < 100; i++) big[i] = 1.0f;
    for (int i = 0; i < 100; i++) w4[i] = i < 51 ? 1.0 / 51 : 0;
    p.top_p = 0.505f;
    loip_sampler_free(s2);
    s2 = new_sampler(100, 41);
    check_freqs("top_p ties", s2, big, 100, &p, NULL, 0, w4, 100000);
    loip_sampler_free(s2);
    free(w4);
    free(w3);
    free(sorted);
    free(pr);
    free(big);
}

static void test_min_p(void) {
    const int n = 5;
    float l[5] = {logf(0.5f), logf(0.2f), logf(0.12f), logf(0.09f), logf(0.09f)};
    loip_sampler *s = new_sampler(n, 23);
    loip_sampler_params p = defaults();
    /* min_p 0.2: keep p >= 0.1, i.e. {0, 1, 2}. */
    p.min_p = 0.2f;
    double want[5] = {0.5 / 0.82, 0.2 / 0.82, 0.12 / 0.82, 0, 0};
    check_freqs("min_p=0.2", s, l, n, &p, NULL, 0, want, 100000);
    p.min_p = 1.0f;
    double only[5] = {1, 0, 0, 0, 0};
    check_freqs("min_p=1", s, l, n, &p, NULL, 0, only, 1000);
    loip_sampler_free(s);
}

/* The order top_k -> min_p -> top_p, each on the distribution the previous left. */
static void test_chain(void) {
    const int n = 6;
    float l[6] = {logf(0.08f), logf(0.25f), logf(0.10f), logf(0.30f), logf(0.07f), logf(0.20f)};
    loip_sampler *s = new_sampler(n, 31);
    loip_sampler_params p = defaults();
    /* top_k 4 drops 0.08, 0.07; min_p 0.35 drops 0.10 (0.10/0.30 < 0.35); top_p 0.7 of the
     * remaining 0.75 needs 0.30 + 0.25. Any other order keeps 0.20 as well. */
    p.top_k = 4;
    p.min_p = 0.35f;
    p.top_p = 0.7f;
    double want[6] = {0, 0.25 / 0.55, 0, 0.30 / 0.55, 0, 0};
    check_freqs("top_k+min_p+top_p", s, l, n, &p, NULL, 0, want, 100000);
    loip_sampler_free(s);
}

static void test_penalty(void) {
    loip_sampler *s = new_sampler(4, 3);
    loip_sampler_params p = defaults();
    p.temperature = 0.0f;
    p.repetition_penalty = 2.0f;
    float a[4] = {2.0f, 1.5f, -1.0f, 0.5f};
    int32_t h1[2] = {0, 2};
    CHECK(draw(s, a, &p, h1, 2) == 1, "penalty: 2.0/2 < 1.5, want 1");
    p.penalty_last_n = 1; /* only token 2 is recent */
    CHECK(draw(s, a, &p, h1, 2) == 0, "penalty_last_n=1: token 0 not penalised, want 0");
    p.penalty_last_n = 0;
    /* Once per distinct token: 2.0/2 = 1.0 > 0.8, where three times would give 0.25. */
    float b[4] = {2.0f, 0.8f, -5.0f, -5.0f};
    int32_t h3[3] = {0, 0, 0};
    CHECK(draw(s, b, &p, h3, 3) == 0, "penalty applied more than once per distinct token");
    /* Negative logits are multiplied: -1 * 2 = -2 < -1.5. */
    float c[4] = {-1.0f, -1.5f, -9.0f, -9.0f};
    int32_t h0[1] = {0};
    CHECK(draw(s, c, &p, h0, 1) == 1, "negative logit should be multiplied by the penalty");
    /* Off when 1 or <= 0. */
    p.repetition_penalty = 1.0f;
    CHECK(draw(s, a, &p, h1, 2) == 0, "penalty 1 must be off");
    p.repetition_penalty = 0.0f;
    CHECK(draw(s, a, &p, h1, 2) == 0, "penalty 0 must be off");
    /* Sampling sees the penalised distribution. */
    p = defaults();
    p.repetition_penalty = 1.5f;
    float d[4] = {1.2f, 1.0f, -0.3f, 0.4f};
    float dp[4] = {1.2f / 1.5f, 1.0f, -0.3f * 1.5f, 0.4f};
    int32_t h2[3] = {2, 0, 2};
    double want[4];
    softmax(dp, 4, 1.0, want);
    check_freqs("penalty sampling", s, d, 4, &p, h2, 3, want, 100000);
    /* The caller's logits are never written. */
    CHECK(d[0] == 1.2f && d[2] == -0.3f, "caller's logits were modified");
    loip_sampler_free(s);
}

static void test_seed(void) {
    const int V = 1000;
    float *l = malloc(V * sizeof(float));
    for (int i = 0; i < V; i++) l[i] = 3.0f * frand();
    loip_sampler_params p = defaults();
    p.top_p = 0.95f;
    p.top_k = 200;
    loip_sampler *a = new_sampler(V, 1234), *b = new_sampler(V, 1234), *c = new_sampler(V, 1235);
    int same = 1, diff = 0;
    for (int i = 0; i < 200; i++) {
        int32_t ta = draw(a, l, &p, NULL, 0), tb = draw(b, l, &p, NULL, 0);
        int32_t tc = draw(c, l, &p, NULL, 0);
        same &= ta == tb;
        diff += ta != tc;
    }
    CHECK(same, "same seed gave different sequences");
    CHECK(diff > 100, "seeds 1234 and 1235 agree on %d of 200 draws", 200 - diff);
    /* Seed 0 works (splitmix64 seeding) and greedy calls draw nothing. */
    loip_sampler *z1 = new_sampler(V, 0), *z2 = new_sampler(V, 0);
    loip_sampler_params g = defaults();
    g.temperature = 0;
    same = 1;
    for (int i = 0; i < 50; i++) {
        (void)draw(z1, l, &g, NULL, 0);
        same &= draw(z1, l, &p, NULL, 0) == draw(z2, l, &p, NULL, 0);
    }
    CHECK(same, "greedy calls advanced the RNG");
    loip_sampler_free(z1);
    loip_sampler_free(z2);
    loip_sampler_free(a);
    loip_sampler_free(b);
    loip_sampler_free(c);
    free(l);
}

/* Counts against want[] (sums to 1): each within 5 standard deviations of a binomial. */
static int freqs_ok(const char *what, const long *cnt, const double *want, int n, long draws) {
    int ok = 1;
    for (int i = 0; i < n; i++) {
        double f = (double)cnt[i] / (double)draws, sd = sqrt(want[i] * (1 - want[i]) / (double)draws);
        if (want[i] == 0 ? cnt[i] != 0 : fabs(f - want[i]) > 5 * sd + 1e-9) {
            fprintf(stderr, "  %s: token %d freq %.5f want %.5f (sd %.5f)\n", what, i, f, want[i], sd);
            ok = 0;
        }
    }
    return ok;
}

/* loip_sampler_verify_tree: greedy follows the argmax through the tree; sampling gives every
 * token the distribution of sampling it alone, whichever children the tree offers. */
static void test_verify_tree(void) {
    enum { V = 4, M = 4 };
    /* rows: root, then nodes 1..4; node 1 (token 0) and 2 (token 1) children of the root, node
     * 3 (token 2) of node 1, node 4 (token 3) of node 2 */
    const float l[(M + 1) * V] = {0.5f, 1.0f, -0.2f, 0.3f, /* root: argmax 1 */
                                  2.0f, 0.1f, 1.0f, -1.0f, /* node 1 */
                                  0.0f, 0.2f, 0.4f, 1.5f,  /* node 2: argmax 3 */
                                  1.0f, 1.0f, 1.0f, 1.0f,  /* node 3 */
                                  0.3f, 0.2f, 2.5f, 0.1f}; /* node 4: argmax 2 */
    const int32_t drafts[M] = {0, 1, 2, 3}, parents[M] = {0, 0, 1, 2};
    loip_sampler_params p = defaults();
    p.temperature = 0.0f;
    loip_sampler *s = new_sampler(V, 7);
    int32_t hist[16] = {2}, nh = 1, out[M + 1], n_out = 0;
    int rc = loip_sampler_verify_tree(s, l, M, drafts, parents, &p, hist, &nh, 16, out, &n_out);
    CHECK(rc == 0 && n_out == 3 && out[0] == 1 && out[1] == 3 && out[2] == 2,
          "greedy tree: want 1 3 2 (node 2, node 4, then node 4's argmax), got %d tokens %d %d %d", (int)n_out,
          out[0], out[1], out[2]);
    CHECK(nh == 4 && hist[1] == 1 && hist[3] == 2, "greedy tree: the tokens go onto the history");
    const int32_t bad_parent[M] = {0, 0, 3, 2};
    nh = 1;
    CHECK(loip_sampler_verify_tree(s, l, M, drafts, bad_parent, &p, hist, &nh, 16, out, &n_out) == LOIP_EINVAL &&
              strstr(loip_last_error(), "node 3's parent") != NULL,
          "a parent after its node is refused, naming the node");

    /* sampling: the first token is distributed as the root's row, the second (after token 0,
     * node 1) as node 1's, whether node 1's child (token 2) is accepted or drawn */
    p = defaults();
    double p0[V], p1[V];
    softmax(l, V, 1.0, p0);
    softmax(l + V, V, 1.0, p1);
    long c0[V] = {0}, c1[V] = {0}, after0 = 0, draws = 200000;
    for (long d = 0; d < draws; d++) {
        nh = 1;
        if ((rc = loip_sampler_verify_tree(s, l, M, drafts, parents, &p, hist, &nh, 16, out, &n_out)) != 0) {
            CHECK(0, "sampled tree: %d %s", rc, loip_last_error());
            break;
        }
        c0[out[0]]++;
        if (out[0] == 0) c1[out[1]]++, after0++;
    }
    CHECK(freqs_ok("tree first token", c0, p0, V, draws), "sampled tree: the first token is not the root row's distribution");
    CHECK(freqs_ok("tree after node 1", c1, p1, V, after0), "sampled tree: the token after node 1 is not its row's distribution");
    /* coupled to the stream: the tokens are those sampling each row of the path in turn draws
     * with the same seed, one draw each (then the streams go on together) */
    int same = 1;
    for (uint64_t seed = 1; seed <= 300; seed++) {
        loip_sampler *a = new_sampler(V, seed), *b = new_sampler(V, seed);
        nh = 1;
        loip_sampler_verify_tree(a, l, M, drafts, parents, &p, hist, &nh, 16, out, &n_out);
        int32_t node = 0;
        for (int32_t j = 0; j < n_out; j++) {
            same &= draw(b, l + (size_t)node * V, &p, NULL, 0) == out[j];
            int32_t next = -1;
            for (int32_t c = 0; c < M && next < 0; c++)
                if (parents[c] == node && drafts[c] == out[j]) next = c + 1;
            node = next;
        }
        same &= node < 0 && draw(a, l, &p, NULL, 0) == draw(b, l, &p, NULL, 0);
        loip_sampler_free(a), loip_sampler_free(b);
    }
    CHECK(same, "a sampled tree's tokens are not those sampling its path draws, one draw each");
    loip_sampler_free(s);
}


static void expect_einval(const char *what, loip_sampler *s, const float *l,
                          const loip_sampler_params *p, const int32_t *h, int32_t nh,
                          const char *needle) {
    int32_t tok = -7;
    int rc = loip_sampler_sample(s, l, p, h, nh, &tok);
    CHECK(rc == LOIP_EINVAL && strstr(loip_last_error(), needle) != NULL,
          "%s: rc %d, message \"%s\" (want EINVAL naming \"%s\")", what, rc, loip_last_error(),
          needle);
}

static void test_invalid(void) {
    loip_sampler *s = NULL;
    CHECK(loip_sampler_new(0, 1, &s) == LOIP_EINVAL && s == NULL, "vocab 0 accepted");
    CHECK(loip_sampler_new(-5, 1, &s) == LOIP_EINVAL, "vocab -5 accepted");
    CHECK(loip_sampler_new(5, 1, NULL) == LOIP_EINVAL, "NULL out accepted");
    loip_sampler_free(NULL);
    s = new_sampler(4, 1);
    float l[4] = {1, 2, 3, 4};
    loip_sampler_params p;
    p = defaults(); p.temperature = NAN;
    expect_einval("NaN temperature", s, l, &p, NULL, 0, "temperature");
    p = defaults(); p.temperature = INFINITY;
    expect_einval("inf temperature", s, l, &p, NULL, 0, "temperature");
    p = defaults(); p.top_p = 0.0f;
    expect_einval("top_p 0", s, l, &p, NULL, 0, "top_p");
    p = defaults(); p.top_p = -0.5f;
    expect_einval("top_p < 0", s, l, &p, NULL, 0, "top_p");
    p = defaults(); p.top_p = NAN;
    expect_einval("NaN top_p", s, l, &p, NULL, 0, "top_p");
    p = defaults(); p.min_p = NAN;
    expect_einval("NaN min_p", s, l, &p, NULL, 0, "min_p");
    p = defaults(); p.min_p = 1.5f;
    expect_einval("min_p > 1", s, l, &p, NULL, 0, "min_p");
    p = defaults(); p.repetition_penalty = NAN;
    expect_einval("NaN penalty", s, l, &p, NULL, 0, "repetition_penalty");
    p = defaults(); p.repetition_penalty = 1.3f;
    int32_t bad[2] = {1, 4}, neg[2] = {-1, 0};
    expect_einval("history id = vocab", s, l, &p, bad, 2, "history[1]");
    expect_einval("history id < 0", s, l, &p, neg, 2, "history[0]");
    expect_einval("n_history < 0", s, l, &p, bad, -1, "n_history");
    expect_einval("NULL history", s, l, &p, NULL, 3, "history");
    p.repetition_penalty = 1.0f; /* checked even when the penalty is off */
    expect_einval("history id, penalty off", s, l, &p, bad, 2, "history[1]");
    p = defaults();
    expect_einval("NULL logits", s, NULL, &p, NULL, 0, "logits");
    float nan_l[4] = {1, NAN, 3, 4};
    expect_einval("NaN logit", s, nan_l, &p, NULL, 0, "logits[1]");
    float inf_l[4] = {1, INFINITY, 3, 4};
    expect_einval("+inf logit", s, inf_l, &p, NULL, 0, "+inf");
    float ninf[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    expect_einval("all -inf", s, ninf, &p, NULL, 0, "-inf");
    int32_t tok = -1;
    CHECK(loip_sampler_sample(s, l, &p, NULL, 0, NULL) == LOIP_EINVAL, "NULL token accepted");
    CHECK(loip_sampler_sample(NULL, l, &p, NULL, 0, &tok) == LOIP_EINVAL, "NULL sampler");
    CHECK(loip_sampler_sample(s, l, NULL, NULL, 0, &tok) == LOIP_EINVAL, "NULL params");
    loip_sampler_free(s);
}


/* loip_sampler_verify: drafts checked against their rows (greedy: the argmax; sampling: the
 * first output distributed as a plain draw, whatever the draft), tokens appended to the
 * history, and the draws it made as documented (a sampler skipped that many continues alike). */
static int32_t verify(loip_sampler *s, const float *rows, int32_t k, const int32_t *drafts,
                      const loip_sampler_params *p, int32_t *hist, int32_t *nh, int32_t cap, int32_t *out) {
    int32_t n_out = -1;
    int rc = loip_sampler_verify(s, rows, k, drafts, p, hist, nh, cap, out, &n_out);
    if (rc != 0) {
        fprintf(stderr, "loip_sampler_verify: %d %s\n", rc, loip_last_error());
        exit(1);
    }
    return n_out;
}

static void test_verify(void) {
    enum { V = 6 };
    /* row j's argmax: 3, 5, 1 */
    const float rows[3 * V] = {0, 1, 2, 9, 0, 0, /**/ 0, 0, 0, 0, 1, 7, /**/ 0, 4, 0, 0, 0, 0};
    loip_sampler_params g = defaults();
    g.temperature = 0;
    loip_sampler *s = new_sampler(V, 1);
    int32_t hist[16] = {2}, nh = 1, out[3];
    int32_t all[2] = {3, 5}, half[2] = {3, 4}, none[2] = {0, 5};
    int32_t n = verify(s, rows, 2, all, &g, hist, &nh, 16, out);
    CHECK(n == 3 && out[0] == 3 && out[1] == 5 && out[2] == 1, "greedy: both drafts and the next (got %d)", n);
    CHECK(nh == 4 && hist[1] == 3 && hist[2] == 5 && hist[3] == 1, "greedy: the history grows by the tokens");
    n = verify(s, rows, 2, half, &g, hist, &nh, 16, out);
    CHECK(n == 2 && out[0] == 3 && out[1] == 5, "greedy: the second draft is replaced by the argmax");
    n = verify(s, rows, 2, none, &g, hist, &nh, 16, out);
    CHECK(n == 1 && out[0] == 3, "greedy: the first draft rejected");
    nh = 15;
    n = verify(s, rows, 2, all, &g, hist, &nh, 16, out);
    CHECK(n == 3 && nh == 16, "greedy: the history stops at its capacity");
    int32_t bad[1] = {V};
    nh = 1;
    int32_t n_out;
    CHECK(loip_sampler_verify(s, rows, 1, bad, &g, hist, &nh, 16, out, &n_out) == LOIP_EINVAL &&
              strstr(loip_last_error(), "draft 0 is token 6") != NULL,
          "a draft outside the vocabulary is refused, named");
    loip_sampler_free(s);

    /* sampling with top_k = 3 over row 0: the first token is distributed as a plain draw's,
     * the draft accepted with its probability; a second token after an accepted draft follows
     * row 1's distribution */
    loip_sampler_params p = defaults();
    p.top_k = 3;
    const float l0[V] = {0.5f, 1.0f, 0.2f, 1.5f, -1.0f, 0.0f};
    const float l1[V] = {0.0f, 0.3f, 1.1f, 0.0f, 0.7f, -0.4f};
    float two[2 * V];
    memcpy(two, l0, sizeof l0);
    memcpy(two + V, l1, sizeof l1);
    double want0[V] = {0}, want1[V] = {0}, p0[V], p1[V];
    softmax(l0, V, 1.0, p0);
    softmax(l1, V, 1.0, p1);
    /* top-3 of l0: ids 3, 1, 0; of l1: 2, 4, 1 */
    double z0 = p0[3] + p0[1] + p0[0], z1 = p1[2] + p1[4] + p1[1];
    want0[3] = p0[3] / z0, want0[1] = p0[1] / z0, want0[0] = p0[0] / z0;
    want1[2] = p1[2] / z1, want1[4] = p1[4] / z1, want1[1] = p1[1] / z1;
    for (int32_t d = 0; d < V; d++) { /* every draft: a likely one, an unlikely one, one filtered out */
        s = new_sampler(V, 100 + (uint64_t)d);
        long c0[V] = {0}, c1[V] = {0}, acc = 0;
        const int draws = 200000;
        for (int i = 0; i < draws; i++) {
            nh = 0;
            int32_t dr[1] = {d};
            n = verify(s, two, 1, dr, &p, hist, &nh, 16, out);
            c0[out[0]]++;
            if (n == 2) {
                acc++;
                c1[out[1]]++;
            }
        }
        int ok = 1;
        for (int t = 0; t < V; t++) {
            double sd = sqrt(draws * want0[t] * (1 - want0[t])) + 1e-9;
            if (fabs(c0[t] - draws * want0[t]) > 5 * sd + (want0[t] == 0 ? 0 : 1)) ok = 0;
            if (acc > 0) {
                double sd1 = sqrt(acc * want1[t] * (1 - want1[t])) + 1e-9;
                if (fabs(c1[t] - acc * want1[t]) > 5 * sd1 + (want1[t] == 0 ? 0 : 1)) ok = 0;
            }
        }
        double sda = sqrt(draws * want0[d] * (1 - want0[d])) + 1e-9;
        CHECK(ok && fabs(acc - draws * want0[d]) <= 5 * sda + 1,
              "sampling with draft %d: the first token as a plain draw, acceptance p(d) (%ld of %d)", d, acc, draws);
        loip_sampler_free(s);
    }

    /* draws: one per token out; a sampler that skips as many goes on alike, and the tokens are
     * those plain draws give from the same seed */
    const float flat[3 * V] = {0};
    int same = 1;
    for (uint64_t seed = 1; seed <= 50; seed++) {
        loip_sampler *a = new_sampler(V, seed), *b = new_sampler(V, seed);
        int32_t dr[2] = {1, 2};
        nh = 0;
        n = verify(a, flat, 2, dr, &p, hist, &nh, 16, out);
        for (int32_t j = 0; j < n; j++) same = same && draw(b, flat, &p, NULL, 0) == out[j];
        for (int i = 0; i < 8; i++) same = same && draw(a, flat, &p, NULL, 0) == draw(b, flat, &p, NULL, 0);
        loip_sampler_free(a);
        loip_sampler_free(b);
    }
    CHECK(same, "verify draws once per token, the tokens of plain draws");
}

int main(void) {
    test_greedy();
    test_verify_tree();
    test_temperature();
    test_top_k();
    test_top_p();
    test_min_p();
    test_chain();
    test_penalty();
    test_seed();
    test_invalid();
    test_verify();
    printf("test_sampler: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail == 0 ? 0 : 1;
}
