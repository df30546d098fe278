/* sampler.c — choosing the next token from a row of logits.
 *
 * The chain, always in this order, on the sampler's scratch (the caller's logits are never
 * written):
 *   1. repetition penalty (CTRL / llama.cpp): each distinct token of the last penalty_last_n
 *      history entries gets logit / penalty when the logit is > 0, logit * penalty otherwise;
 *   2. temperature <= 0: greedy argmax, lowest index among equal maxima — llama2.c run.c's
 *      loop (`>` from index 0), so greedy runs reproduce its token sequences;
 *   3. top_k: keep the k largest logits (ties: lower id first), by a size-k min-heap,
 *      O(V log k) with an O(1) reject of most tokens, instead of sorting the vocabulary;
 *   4. softmax with temperature: w = expf((logit - max) / T). Subtracting the max before
 *      dividing keeps tiny temperatures finite (the max gets exactly 1, the rest underflow
 *      to 0 at worst). Exponentials are fp32, every sum is accumulated in double. The
 *      weights stay unnormalised: each later step only needs ratios and the running total;
 *   5. min_p: drop w < min_p * w_max, and w_max is exactly 1 after step 4;
 *   6. top_p: the smallest prefix, in descending probability order (ties: lower id first),
 *      whose mass reaches top_p of the total: a pruning pass, then a quickselect on mass
 *      (see nucleus()), no sort of the vocabulary;
 *   7. draw r uniform in [0, total) and walk the kept tokens' cumulative weights.
 *
 * RNG: xoshiro256** seeded by splitmix64(seed); one 53-bit double per non-greedy draw. Greedy
 * calls draw nothing, so switching temperature mid-stream does not shift later draws.
 *
 * Parameters are validated on every call, whatever the temperature, so a mistyped field is
 * reported even while greedy ignores it: top_p must be set > 0 (1 = off). Every history id
 * is checked, and a NaN logit is LOIP_EINVAL (a model bug is not sampled over); so is a +inf
 * logit or an all -inf row when sampling, where the distribution is undefined. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

/* A candidate token: v is its (penalised) logit until step 4, then its unnormalised weight. */
typedef struct cand {
    float v;
    int32_t id;
} cand;

struct loip_sampler {
    int32_t vocab;
    uint64_t rng[4]; /* xoshiro256** state */
    uint32_t stamp;  /* generation number for seen[]: avoids clearing it on every call */
    float *pen;      /* (vocab) logits after the repetition penalty */
    uint32_t *seen;  /* (vocab) == stamp when the token was penalised in the current call */
    cand *cand;      /* (vocab) candidates, steps 3-7 */
};

/* ---- RNG ---------------------------------------------------------------------------------- */

/* splitmix64 spreads any seed (0 included) over the whole xoshiro state, which must not be
 * all zero; this is the seeding its authors recommend. */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4]) {
    const uint64_t result = rotl64(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits: a float's 24 bits would make tokens with
 * probability below 2^-24 of a 128k vocabulary unreachable. */
static double uniform01(uint64_t s[4]) { return (double)(xoshiro_next(s) >> 11) * 0x1.0p-53; }

/* ---- new / free --------------------------------------------------------------------------- */

LOIP_API int loip_sampler_new(int32_t vocab_size, uint64_t seed, loip_sampler **out) {
    if (out == NULL) return loip_fail(LOIP_EINVAL, "loip_sampler_new: out is NULL");
    *out = NULL;
    if (vocab_size <= 0)
        return loip_fail(LOIP_EINVAL, "loip_sampler_new: vocab_size must be > 0, got %d",
                         (int)vocab_size);
    /* One block: the struct, then the three scratch arrays (all 4-byte aligned at least). */
    size_t v = (size_t)vocab_size;
    size_t bytes = sizeof(loip_sampler) + v * sizeof(cand) + v * sizeof(float) +
                   v * sizeof(uint32_t);
    loip_sampler *s = malloc(bytes);
    if (s == NULL)
        return loip_fail(LOIP_ENOMEM, "loip_sampler_new: cannot allocate %zu bytes for a "
                                      "vocabulary of %d", bytes, (int)vocab_size);
    s->vocab = vocab_size;
    s->cand = (cand *)(s + 1);
    s->pen = (float *)(s->cand + v);
    s->seen = (uint32_t *)(s->pen + v);
    memset(s->seen, 0, v * sizeof(uint32_t));
    s->stamp = 0;
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    *out = s;
    return 0;
}

LOIP_API void loip_sampler_free(loip_sampler *s) { free(s); }

/* ---- steps -------------------------------------------------------------------------------- */

static int check_params(const loip_sampler_params *p) {
    const char *fn = "loip_sampler_sample";
    if (isnan(p->temperature) || isinf(p->temperature))
        return loip_fail(LOIP_EINVAL, "%s: temperature must be finite, got %g", fn,
                         (double)p->temperature);
    if (isnan(p->top_p) || p->top_p <= 0.0f)
        return loip_fail(LOIP_EINVAL, "%s: top_p must be > 0 (>= 1 turns it off), got %g", fn,
                         (double)p->top_p);
    if (isnan(p->min_p) || p->min_p > 1.0f)
        return loip_fail(LOIP_EINVAL, "%s: min_p must be <= 1 (<= 0 turns it off), got %g", fn,
                         (double)p->min_p);
    if (isnan(p->repetition_penalty) || isinf(p->repetition_penalty))
        return loip_fail(LOIP_EINVAL, "%s: repetition_penalty must be finite (1 or <= 0 turns "
                                      "it off), got %g", fn, (double)p->repetition_penalty);
    return 0;
}

/* Step 1 into s->pen. Each distinct token is penalised once, however often it recurs. */
static void apply_penalty(loip_sampler *s, const float *logits, const loip_sampler_params *p,
                         const int32_t *history, int32_t n_history) {
    int32_t first = 0;
    if (p->penalty_last_n > 0 && p->penalty_last_n < n_history)
        first = n_history - p->penalty_last_n;
    memcpy(s->pen, logits, (size_t)s->vocab * sizeof(float));
    if (++s->stamp == 0) { /* wrapped: old marks could alias the new stamp */
        memset(s->seen, 0, (size_t)s->vocab * sizeof(uint32_t));
        s->stamp = 1;
    }
    const float penalty = p->repetition_penalty;
    for (int32_t i = first; i < n_history; i++) {
        int32_t id = history[i];
        if (s->seen[id] == s->stamp) continue;
        s->seen[id] = s->stamp;
        float l = s->pen[id];
        s->pen[id] = l > 0.0f ? l / penalty : l * penalty;
    }
}

/* "a is a worse candidate than b": smaller value, or equal value and higher id. A total order
 * (no NaN reaches here), so top-k and the top-p sort have a single answer. */
static int worse(const cand *a, const cand *b) {
    return a->v < b->v || (a->v == b->v && a->id > b->id);
}

static void sift_down(cand *h, int32_t n, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, m = i;
        if (l < n && worse(&h[l], &h[m])) m = l;
        if (l + 1 < n && worse(&h[l + 1], &h[m])) m = l + 1;
        if (m == i) return;
        cand t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* Step 3: the k best of x[0..n) into c[0..k), in heap order. The heap root is the worst kept
 * candidate; ids arrive in increasing order, so a later token equal to the root is worse and
 * a plain `>` on the value is the whole test for most of the vocabulary. */
static void select_top_k(const float *x, int32_t n, cand *c, int32_t k) {
    for (int32_t i = 0; i < k; i++) c[i] = (cand){x[i], i};
    for (int32_t i = k / 2 - 1; i >= 0; i--) sift_down(c, k, i);
    for (int32_t i = k; i < n; i++) {
        if (x[i] > c[0].v) {
            c[0] = (cand){x[i], i};
            sift_down(c, k, 0);
        }
    }
}

static int by_weight_desc(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    if (worse(b, a)) return -1;
    if (worse(a, b)) return 1;
    return 0;
}

/* Step 6 over c[0..n) with total weight sum: moves the nucleus to c[0..m), returns m and
 * its weight in *kept. The nucleus is the sorted prefix, but it need not come out sorted: the
 * draw only needs the set and its mass.
 *
 * Pruning first: sort the probabilities p_1 >= ... >= p_n; the nucleus ends at the first m
 * with p_1 + ... + p_m >= top_p. Before m the mass still missing exceeds 1 - top_p, and it
 * lies in n - m + 1 tokens, none above p_m, so p_m > (1 - top_p) / n: tokens below that bound
 * cannot be in the nucleus (llama2.c's cutoff trick, with n rather than its n - 1, which fails
 * for m = 1). The bound is taken 0.1% low so that rounding never prunes a member. A peaked
 * distribution keeps a few hundred tokens; a flat one keeps most of them, so the rest is a
 * quickselect on mass, O(n) expected, rather than a sort. */
static int32_t nucleus(cand *c, int32_t n, double sum, float top_p, double *kept) {
    const double bound = (1.0 - (double)top_p) / (double)n * sum * 0.999;
    int32_t hi = 0;
    for (int32_t j = 0; j < n; j++)
        if ((double)c[j].v >= bound) c[hi++] = c[j];
    const double target = (double)top_p * sum;
    /* Invariant: c[0..lo) is in the nucleus, better than all of c[lo..hi), with weight acc;
     * the nucleus ends inside c[lo..hi) (or takes all of it, by rounding). */
    int32_t lo = 0, rounds = 0;
    double acc = 0.0;
    while (hi - lo > 32 && rounds++ < 64) {
        /* Median of three as pivot, swapped to c[hi-1]. */
        int32_t mid = lo + (hi - lo) / 2, a = lo, b = mid, d = hi - 1;
        if (worse(&c[b], &c[a])) { int32_t t = a; a = b; b = t; }
        if (worse(&c[d], &c[b])) { b = d; if (worse(&c[b], &c[a])) b = a; }
        cand pv = c[b];
        c[b] = c[hi - 1];
        c[hi - 1] = pv;
        /* Better than the pivot to the front, summing their mass. */
        int32_t k = lo;
        double better = 0.0;
        for (int32_t j = lo; j < hi - 1; j++)
            if (worse(&pv, &c[j])) {
                better += c[j].v;
                cand t = c[k];
                c[k] = c[j];
                c[j] = t;
                k++;
            }
        c[hi - 1] = c[k];
        c[k] = pv;
        if (acc + better >= target) {
            hi = k; /* ends among the better ones */
        } else if (acc + better + pv.v >= target) {
            *kept = acc + better + pv.v;
            return k + 1; /* ends at the pivot */
        } else {
            acc += better + pv.v;
            lo = k + 1;
        }
    }
    /* A short range (or a pathological one after 64 rounds): sort it and walk. */
    qsort(c + lo, (size_t)(hi - lo), sizeof(cand), by_weight_desc);
    for (int32_t j = lo; j < hi; j++) {
        acc += c[j].v;
        if (acc >= target) {
            *kept = acc;
            return j + 1;
        }
    }
    *kept = acc; /* only by rounding: everything that survived the pruning */
    return hi;
}

LOIP_API int loip_sampler_skip(loip_sampler *s, uint64_t n) {
    if (s == NULL) return loip_fail(LOIP_EINVAL, "loip_sampler_skip: sampler is NULL");
    while (n--) (void)xoshiro_next(s->rng);
    return 0;
}

/* ---- sample ------------------------------------------------------------------------------- */

/* The distribution a draw is made from (steps 1-6), after the argument checks: *best the greedy
 * token (step 2); for temperature > 0 the kept candidates s->cand[0..*n) with their
 * unnormalised weights and *sum their total. The caller's logits are never written. */
static int distribution(loip_sampler *s, const float *logits, const loip_sampler_params *p,
                        const int32_t *history, int32_t n_history, int32_t *best_out, int32_t *n_out,
                        double *sum_out) {
    const char *fn = "loip_sampler_sample";
    const int32_t V = s->vocab;
    const float *x = logits;
    const float penalty = p->repetition_penalty;
    if (penalty > 0.0f && penalty != 1.0f && n_history > 0) {
        apply_penalty(s, logits, p, history, n_history);
        x = s->pen;
    }

    /* One pass: NaN check and run.c's argmax (first strict maximum). */
    int32_t best = 0;
    float maxv = x[0];
    for (int32_t i = 0; i < V; i++) {
        if (isnan(x[i])) return loip_fail(LOIP_EINVAL, "%s: logits[%d] is NaN", fn, (int)i);
        if (x[i] > maxv) {
            maxv = x[i];
            best = i;
        }
    }
    *best_out = best;
    if (p->temperature <= 0.0f) return 0;
    if (isinf(maxv))
        return loip_fail(LOIP_EINVAL, "%s: %s", fn,
                         maxv > 0 ? "a logit is +inf, the distribution is undefined"
                                  : "every logit is -inf, there is nothing to sample");

    /* Steps 3-4. */
    cand *c = s->cand;
    int32_t n = V;
    if (p->top_k > 0 && p->top_k < V) {
        n = p->top_k;
        select_top_k(x, V, c, n);
    } else {
        for (int32_t i = 0; i < V; i++) c[i] = (cand){x[i], i};
    }
    const float T = p->temperature;
    double sum = 0.0;
    for (int32_t j = 0; j < n; j++) {
        c[j].v = expf((c[j].v - maxv) / T);
        sum += c[j].v;
    }

    /* Step 5. The max (weight 1) always survives, since min_p <= 1. */
    if (p->min_p > 0.0f) {
        int32_t m = 0;
        sum = 0.0;
        for (int32_t j = 0; j < n; j++)
            if (c[j].v >= p->min_p) {
                sum += c[j].v;
                c[m++] = c[j];
            }
        n = m;
    }

    /* Step 6. */
    if (p->top_p < 1.0f) n = nucleus(c, n, sum, p->top_p, &sum);
    *n_out = n, *sum_out = sum;
    return 0;
}

/* Step 7 over c[0..n) of total sum, leaving out token `skip` (-1: none; its weight is not in
 * sum then): renormalising is scaling r by the kept total. */
static int32_t draw(loip_sampler *s, const cand *c, int32_t n, double sum, int32_t skip) {
    const double r = uniform01(s->rng) * sum;
    double cdf = 0.0;
    int32_t last = -1;
    for (int32_t j = 0; j < n; j++) {
        if (c[j].v <= 0.0f || c[j].id == skip) continue; /* underflowed: never drawn */
        cdf += c[j].v;
        last = j;
        if (r < cdf) return c[j].id;
    }
    /* r rounded onto the total: the last token with any weight (there is one: the max's
     * weight is exactly 1 and never dropped; with a token skipped, the caller saw weight left) */
    return last >= 0 ? c[last].id : skip;
}

/* The checks every call makes (see the file's header). */
static int check_call(const loip_sampler *s, const float *logits, const loip_sampler_params *p,
                      const int32_t *history, int32_t n_history, const void *out) {
    const char *fn = "loip_sampler_sample";
    if (s == NULL || logits == NULL || p == NULL || out == NULL)
        return loip_fail(LOIP_EINVAL, "%s: %s is NULL", fn,
                         s == NULL ? "sampler" : logits == NULL ? "logits"
                                             : p == NULL        ? "params" : "token");
    if (n_history < 0 || (n_history > 0 && history == NULL))
        return loip_fail(LOIP_EINVAL, "%s: history is NULL or n_history (%d) is negative", fn,
                         (int)n_history);
    int rc = check_params(p);
    if (rc != 0) return rc;
    /* All of it, whether or not the penalty reads it: a bad id is a caller's bug either way. */
    for (int32_t i = 0; i < n_history; i++)
        if (history[i] < 0 || history[i] >= s->vocab)
            return loip_fail(LOIP_EINVAL, "%s: history[%d] = %d is outside the vocabulary "
                                          "[0, %d)", fn, (int)i, (int)history[i], (int)s->vocab);
    return 0;
}

LOIP_API int loip_sampler_sample(loip_sampler *s, const float *logits,
                                 const loip_sampler_params *p, const int32_t *history,
                                 int32_t n_history, int32_t *token) {
    int rc = check_call(s, logits, p, history, n_history, token);
    if (rc != 0) return rc;
    int32_t best, n = 0;
    double sum = 0.0;
    if ((rc = distribution(s, logits, p, history, n_history, &best, &n, &sum))) return rc;
    *token = p->temperature <= 0.0f ? best : draw(s, s->cand, n, sum, -1);
    return 0;
}

/* Speculative sampling (Leviathan et al. 2023; Chen et al. 2023) with a deterministic draft (q
 * = 1 on its token) accepts draft j with probability p_j(d_j) and, at the first rejection, draws
 * from norm(max(0, p_j - q)): p_j without d_j. Drawing t from p_j as a plain sample would
 * (one uniform), accepting when t == d_j and emitting t otherwise is that same rule, coupled:
 * acceptance has probability p_j(d_j), and a rejected draft's replacement is p_j given t != d_j.
 * So every token is exactly the one loip_sampler_sample would draw at that point of the
 * stream: a seeded request gives the same tokens with or without drafts, whatever their length,
 * and a sampler draws once per token out, as without them. Greedy is the same rule with the
 * argmax.
 *
 * Over a tree of drafts (SpecInfer's and SpecExec's multi-candidate verification with q = 1 on
 * each candidate: at a node, child c accepted with probability p'(c), p' the row's p with the
 * children rejected before it removed and renormalised; none accepted, a token drawn from what
 * is left) the coupled rule is the same walk: draw t at a node as a plain sample, follow the
 * first child whose token is t, or emit t when none is. A set of distinct children is left with
 * probability p(the set), and the token emitted then is p given t outside it. A chain is the
 * tree whose node j + 1 is node j's only child (parents NULL).
 *
 * Both entry points: the checks (drafts in the vocabulary; a tree's parents earlier nodes), then
 * the walk from the root (row 0), row j + 1 the distribution after node j. */
static int verify_walk(const char *fn, loip_sampler *s, const float *logits, int32_t m, const int32_t *drafts,
                       const int32_t *parents, const loip_sampler_params *p, int32_t *history,
                       int32_t *n_history, int32_t max_history, int32_t *out, int32_t *n_out) {
    if (n_history == NULL || n_out == NULL || (m > 0 && drafts == NULL))
        return loip_fail(LOIP_EINVAL, "%s: %s is NULL", fn,
                         n_history == NULL ? "n_history" : n_out == NULL ? "n_out" : "drafts");
    if (m < 0) return loip_fail(LOIP_EINVAL, "%s: %d drafts", fn, (int)m);
    int rc = check_call(s, logits, p, history, *n_history, out);
    if (rc != 0) return rc;
    for (int32_t i = 0; i < m; i++) {
        if (drafts[i] < 0 || drafts[i] >= s->vocab)
            return parents ? loip_fail(LOIP_EINVAL, "%s: node %d is token %d, outside the vocabulary [0, %d)", fn,
                                       (int)i + 1, (int)drafts[i], (int)s->vocab)
                           : loip_fail(LOIP_EINVAL, "%s: draft %d is token %d, outside the vocabulary [0, %d)", fn,
                                       (int)i, (int)drafts[i], (int)s->vocab);
        if (parents && (parents[i] < 0 || parents[i] > i))
            return loip_fail(LOIP_EINVAL, "%s: node %d's parent is %d (the root 0, or a node before it)", fn,
                             (int)i + 1, (int)parents[i]);
    }
    const int32_t V = s->vocab;
    *n_out = 0;
    for (int32_t node = 0; node >= 0;) {
        int32_t best, n = 0, next = -1;
        double sum = 0.0;
        if ((rc = distribution(s, logits + (size_t)node * V, p, history, *n_history, &best, &n, &sum))) return rc;
        int32_t id = p->temperature <= 0.0f ? best : draw(s, s->cand, n, sum, -1);
        for (int32_t c = node; c < m && next < 0; c++) /* (a node's children come after it) */
            if ((parents ? parents[c] : c) == node && drafts[c] == id) next = c + 1;
        out[(*n_out)++] = id;
        if (*n_history < max_history) history[(*n_history)++] = id;
        node = next;
    }
    return 0;
}

LOIP_API int loip_sampler_verify(loip_sampler *s, const float *logits, int32_t k,
                                 const int32_t *drafts, const loip_sampler_params *p,
                                 int32_t *history, int32_t *n_history, int32_t max_history,
                                 int32_t *out, int32_t *n_out) {
    return verify_walk("loip_sampler_verify", s, logits, k, drafts, NULL, p, history, n_history, max_history, out,
                       n_out);
}

LOIP_API int loip_sampler_verify_tree(loip_sampler *s, const float *logits, int32_t m,
                                      const int32_t *drafts, const int32_t *parents,
                                      const loip_sampler_params *p, int32_t *history,
                                      int32_t *n_history, int32_t max_history, int32_t *out,
                                      int32_t *n_out) {
    if (m > 0 && parents == NULL) return loip_fail(LOIP_EINVAL, "loip_sampler_verify_tree: parents is NULL");
    return verify_walk("loip_sampler_verify_tree", s, logits, m, drafts, parents, p, history, n_history, max_history,
                       out, n_out);
}
