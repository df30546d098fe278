/* test_head.c — loip_head_* (runtime/exec/head.c): the rows a step's tokens give, their outputs
 * against the sampler's own calls on the same rows (the same tokens, the same draws), the
 * protocol errors, and logprobs against a direct computation. Exit 0 pass, 1 fail. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loip.h"
#include "check.h"

enum { V = 16, S = LOIP_TOKF_SAMPLE, L = LOIP_TOKF_LOGITS, D = LOIP_TOKF_DRAFT, TR = LOIP_TOKF_TREE, PK = LOIP_TOKF_PEEK };

static loip_sampler_params params(float temperature) {
    return (loip_sampler_params){.temperature = temperature, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                                 .repetition_penalty = 1.1f, .penalty_last_n = 0};
}

static loip_head *new_head(int32_t seqs, int32_t tokens) {
    loip_head *h = NULL;
    if (loip_head_new(seqs, tokens, &h) != 0) {
        fprintf(stderr, "loip_head_new: %s\n", loip_last_error());
        exit(1);
    }
    return h;
}

static const int32_t PROMPT[3] = {1, 2, 3};

static void start(loip_head *h, int32_t seq, const loip_sampler_params *p, uint64_t seed) {
    int rc = loip_head_start(h, seq, p, seed, V, PROMPT, 3, 64);
    CHECK(rc == 0, "start slot %d: %s", seq, loip_last_error());
}

static void rows_order(void) {
    loip_step_token t[6] = {
        {.seq = 0, .flags = 0}, {.seq = 0, .flags = S}, {.seq = 1, .flags = L},
        {.seq = 2, .flags = LOIP_TOKF_RECOMPUTE}, {.seq = 0, .flags = S | D}, {.seq = 3, .flags = L},
    };
    int32_t rows[6], n = -1, nl = -1;
    CHECK(loip_head_rows(t, 6, 0, rows, &n, &nl) == 0, "rows");
    CHECK(n == 4 && nl == 2 && rows[0] == 1 && rows[1] == 2 && rows[2] == 4 && rows[3] == 5,
          "token order: %d rows (%d logits): %d %d %d %d", n, nl, rows[0], rows[1], rows[2], rows[3]);
    CHECK(loip_head_rows(t, 6, 1, rows, &n, &nl) == 0, "rows, logits first");
    CHECK(n == 4 && nl == 2 && rows[0] == 2 && rows[1] == 5 && rows[2] == 1 && rows[3] == 4,
          "logits first: %d rows (%d logits): %d %d %d %d", n, nl, rows[0], rows[1], rows[2], rows[3]);
}

/* A step of four slots: 0 a chain of 3 drafts, 1 a single token, 2 logits, 3 a tree of 3 nodes;
 * the outputs equal what the slots' samplers give called directly on the same rows. */
static void outputs_match(float temperature) {
    enum { N = 10 };
    loip_sampler_params p = params(temperature);
    loip_head *h = new_head(4, N);
    loip_sampler *ref[4];
    int32_t hist[4][64], nh[4];
    for (int32_t s = 0; s < 4; s++) {
        if (s != 2) start(h, s, &p, 100 + s);
        loip_sampler_new(V, 100 + s, &ref[s]);
        memcpy(hist[s], PROMPT, sizeof PROMPT), nh[s] = 3;
    }
    /* slot 3's tree: nodes 1 (under the root), 2 (under 1), 3 (under the root); parents in rows back */
    loip_step_token t[N] = {
        {0, 5, 7, S, 4, 0}, {0, 6, 7, S | D, 9, 0}, {0, 7, 7, S | D, 2, 0}, {0, 8, 7, S | D, 11, 0},
        {1, 3, 8, S, 4, 0},
        {2, 9, 9, L, 1, 0},
        {3, 4, 10, S, 5, 0}, {3, 5, 10, S | D | TR, 6, 1}, {3, 6, 10, S | D | TR, 7, 1},
        {3, 7, 10, S | D | TR, 8, 3},
    };
    float logits[N * V];
    srand(7);
    for (int i = 0; i < N * V; i++) logits[i] = (float)(rand() % 1000) / 250.0f;
    /* greedy: make row 0's argmax draft 9 and row 1's draft 2 (accepted), row 2's not 11 */
    logits[0 * V + 9] = 10, logits[1 * V + 2] = 10, logits[2 * V + 11] = -10;
    int32_t rows[N], n_rows, n_logits;
    CHECK(loip_head_rows(t, N, 0, rows, &n_rows, &n_logits) == 0 && n_rows == N && n_logits == 1, "rows");
    loip_step_output outs[N];
    int32_t out_rows[N], n_outs = -1, drafted = -1, accepted = -1;
    int rc = loip_head_outputs(h, t, rows, n_rows, logits, V, outs, out_rows, &n_outs, &drafted, &accepted);
    CHECK(rc == 0, "outputs: %s", loip_last_error());
    /* the same by hand */
    int32_t got[8], n_got, w = 0, drafts0[3] = {9, 2, 11}, drafts3[3] = {6, 7, 8}, parents3[3] = {0, 1, 0};
    int32_t want_drafted = 0, want_accepted = 0;
    loip_step_output want[N];
    loip_sampler_verify(ref[0], logits, 3, drafts0, &p, hist[0], &nh[0], 64, got, &n_got);
    for (int32_t j = 0; j < n_got; j++) want[w++] = (loip_step_output){0, 7, got[j], j + 1 < n_got ? S | D : S};
    want_drafted += 3, want_accepted += n_got - 1;
    if (temperature <= 0) CHECK(n_got == 3 && got[0] == 9 && got[1] == 2, "greedy chain: %d tokens", n_got);
    loip_sampler_verify(ref[1], logits + 4 * V, 0, NULL, &p, hist[1], &nh[1], 64, got, &n_got);
    want[w++] = (loip_step_output){1, 8, got[0], S};
    want[w++] = (loip_step_output){2, 9, -1, L};
    loip_sampler_verify_tree(ref[3], logits + 6 * V, 3, drafts3, parents3, &p, hist[3], &nh[3], 64, got, &n_got);
    for (int32_t j = 0; j < n_got; j++) want[w++] = (loip_step_output){3, 10, got[j], j + 1 < n_got ? S | D : S};
    want_drafted += 3, want_accepted += n_got - 1;
    CHECK(n_outs == w, "%d outputs, %d by hand (T %g)", n_outs, w, temperature);
    for (int32_t j = 0; j < w && j < n_outs; j++)
        CHECK(outs[j].seq == want[j].seq && outs[j].request == want[j].request && outs[j].id == want[j].id &&
                  outs[j].flags == want[j].flags,
              "output %d: seq %d id %d flags %d, by hand seq %d id %d flags %d", j, outs[j].seq, outs[j].id,
              outs[j].flags, want[j].seq, want[j].id, want[j].flags);
    CHECK(drafted == want_drafted && accepted == want_accepted, "drafted %d accepted %d, by hand %d %d", drafted,
          accepted, want_drafted, want_accepted);
    for (int32_t j = 0; j < n_outs; j++)
        if (outs[j].id < 0) CHECK(out_rows[j] == 5, "the logits output's row: %d", out_rows[j]);
    /* the streams moved alike: the next draw of each slot equals its sampler's */
    for (int32_t s = 0; s < 4; s++) {
        if (s == 2) continue;
        loip_step_token one = {s, 20, 1, S, 0, 0};
        int32_t r0 = 0, n1, a = -1, b = -1;
        loip_head_outputs(h, &one, &r0, 1, logits, V, outs, NULL, &n1, NULL, NULL);
        a = outs[0].id;
        loip_sampler_verify(ref[s], logits, 0, NULL, &p, hist[s], &nh[s], 64, got, &n_got);
        b = got[0];
        CHECK(a == b, "slot %d's next token %d, its sampler's %d", s, a, b);
    }
    for (int32_t s = 0; s < 4; s++) loip_sampler_free(ref[s]);
    loip_head_free(h);
}

static void errors(void) {
    loip_sampler_params p = params(0.8f);
    loip_head *h = new_head(2, 4);
    start(h, 0, &p, 1);
    float logits[4 * V] = {0};
    loip_step_output outs[4];
    int32_t rows[4] = {0, 1, 2, 3}, n;
    loip_step_token draft_first[1] = {{0, 1, 1, S | D, 3, 0}};
    CHECK(loip_head_outputs(h, draft_first, rows, 1, logits, V, outs, NULL, &n, NULL, NULL) == LOIP_EPROTO &&
              strstr(loip_last_error(), "a draft token with no row of its sequence before it"),
          "a draft first: %s", loip_last_error());
    loip_step_token empty[1] = {{1, 1, 1, S, 3, 0}};
    CHECK(loip_head_outputs(h, empty, rows, 1, logits, V, outs, NULL, &n, NULL, NULL) == LOIP_ESTATE &&
              strstr(loip_last_error(), "a token to sample in a slot without a sampler"),
          "an empty slot: %s", loip_last_error());
    loip_step_token bad_tree[2] = {{0, 1, 1, S, 3, 0}, {0, 2, 1, S | D | TR, 4, 2}};
    CHECK(loip_head_outputs(h, bad_tree, rows, 2, logits, V, outs, NULL, &n, NULL, NULL) == LOIP_EPROTO &&
              strstr(loip_last_error(), "a tree node whose parent is not an earlier row of its tree"),
          "a tree node's parent before the root: %s", loip_last_error());
    CHECK(loip_head_outputs(h, bad_tree, rows, 5, logits, V, outs, NULL, &n, NULL, NULL) == LOIP_EINVAL,
          "more rows than the head takes");
    CHECK(loip_head_start(h, 2, &p, 1, V, NULL, 0, 0) == LOIP_EINVAL, "a slot out of range");
    CHECK(loip_head_skip(h, 1, 1) == LOIP_EINVAL, "skip in an empty slot");
    loip_head_end(h, 0);
    loip_head_end(h, 7); /* (out of range: nothing) */
    CHECK(loip_head_outputs(h, empty, rows, 1, logits, V, outs, NULL, &n, NULL, NULL) == LOIP_ESTATE, "ended");
    loip_head_free(h);
    loip_head_free(NULL);
}

static void logprobs(void) {
    loip_sampler_params p = params(0.0f);
    p.repetition_penalty = 1.0f;
    loip_head *h = new_head(1, 1);
    start(h, 0, &p, 5);
    float row[V];
    for (int i = 0; i < V; i++) row[i] = (float)((i * 7) % 5) - 1.5f; /* ties among equal logits */
    int32_t tok = -1, top[4], n_top = -1;
    double lp = 0, tlp[4];
    CHECK(loip_head_sample(h, 0, row, NULL, 4, &tok, &lp, top, tlp, &n_top) == 0, "sample: %s", loip_last_error());
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, row[i]);
    for (int i = 0; i < V; i++) sum += exp((double)row[i] - mx);
    double lse = mx + log(sum);
    /* greedy: the lowest id among the maxima; the top 4 by logit, ties lower id first */
    int32_t want[4], m = 0;
    for (int32_t v = 4; v >= -2 && m < 4; v--)
        for (int32_t i = 0; i < V && m < 4; i++)
            if (row[i] == (float)v - 1.5f) want[m++] = i;
    CHECK(tok == want[0], "greedy token %d, want %d", tok, want[0]);
    CHECK(fabs(lp - (row[tok] - lse)) < 1e-12, "logprob %g, want %g", lp, row[tok] - lse);
    CHECK(n_top == 4, "%d top", n_top);
    for (int j = 0; j < 4 && j < n_top; j++)
        CHECK(top[j] == want[j] && fabs(tlp[j] - (row[want[j]] - lse)) < 1e-12, "top %d: id %d (want %d)", j, top[j],
              want[j]);
    CHECK(loip_head_sample(h, 0, row, NULL, -1, &tok, NULL, NULL, NULL, NULL) == 0 && tok == want[0],
          "no logprobs asked for");
    loip_head_free(h);
}

/* PEEK rows: after a run's outputs, the argmax of each draft row flagged PEEK off the accepted
 * path, in row order; the run's tokens (and the sampler's draws) as without the flag. A tree in
 * slot 0: nodes 1 (under the root), 2 (under 1), 3 (under the root), 4 (under 1); a chain of 3
 * in slot 1, its last row not flagged PEEK. */
static void peek_rows(float temperature) {
    loip_sampler_params p = params(temperature);
    enum { N = 9 };
    loip_step_token t[N] = {
        {0, 10, 1, S, 5, 0},           {0, 11, 1, S | D | TR | PK, 6, 1}, {0, 12, 1, S | D | TR | PK, 7, 1},
        {0, 13, 1, S | D | TR | PK, 8, 3}, {0, 14, 1, S | D | TR | PK, 9, 1},
        {1, 20, 2, S, 5, 0},           {1, 21, 2, S | D | PK, 6, 0},      {1, 22, 2, S | D | PK, 7, 0},
        {1, 23, 2, S | D, 8, 0}};
    float logits[N * V];
    for (int r = 0; r < N; r++)
        for (int v = 0; v < V; v++) logits[r * V + v] = (float)((r * 7 + v * 5) % 11) * 0.1f;
    /* greedy: the root's argmax is 6 (node 1 accepted), node 1's 12 (node 2, 7, rejected); the
     * chain: 6 accepted, then 7 accepted, then 8's row says 13 */
    int amax[N] = {6, 12, 14, 4, 11, 6, 7, 13, 15};
    for (int r = 0; r < N; r++) logits[r * V + amax[r]] = 9.0f;
    loip_head *h = new_head(2, N), *ref = new_head(2, N);
    start(h, 0, &p, 7), start(h, 1, &p, 8), start(ref, 0, &p, 7), start(ref, 1, &p, 8);
    loip_step_token plain[N];
    for (int r = 0; r < N; r++) plain[r] = t[r], plain[r].flags &= ~PK;
    int32_t rows[N], n_rows, n_logits, n, n_ref, out_rows[N];
    loip_step_output outs[N], want[N];
    CHECK(loip_head_rows(t, N, 0, rows, &n_rows, &n_logits) == 0 && n_rows == N, "rows");
    CHECK(loip_head_outputs(h, t, rows, N, logits, V, outs, out_rows, &n, NULL, NULL) == 0, "peek: %s", loip_last_error());
    CHECK(loip_head_outputs(ref, plain, rows, N, logits, V, want, NULL, &n_ref, NULL, NULL) == 0, "plain");
    /* the tokens: the plain run's, in order, once the PEEK outputs are set aside */
    int32_t j = 0, w = 0, np = 0;
    for (; j < n; j++) {
        if (outs[j].flags & PK) {
            np++;
            CHECK(outs[j].id == amax[out_rows[j]] && outs[j].seq == t[out_rows[j]].seq, "peek of row %d: %d, its argmax %d",
                  out_rows[j], outs[j].id, amax[out_rows[j]]);
            continue;
        }
        CHECK(w < n_ref && outs[j].id == want[w].id && outs[j].seq == want[w].seq && outs[j].flags == want[w].flags,
              "token output %d (T %g)", w, temperature);
        w++;
    }
    CHECK(w == n_ref, "%d token outputs, %d without PEEK (T %g)", w, n_ref, temperature);
    CHECK(n <= n_rows, "%d outputs for %d rows", n, n_rows);
    if (temperature <= 0) {
        /* tree: tokens 6, 12; peeks of nodes 2, 3, 4 (rows 2, 3, 4). chain: 6, 7, 13; no peek
         * (row 8 is on the path, and not flagged) */
        CHECK(n == 2 + 3 + 3 && np == 3, "greedy: %d outputs, %d peeks", n, np);
        CHECK(outs[2].id == 14 && out_rows[2] == 2 && outs[3].id == 4 && outs[4].id == 11, "greedy peeks %d %d %d",
              outs[2].id, outs[3].id, outs[4].id);
    }
    loip_head_free(h);
    loip_head_free(ref);
}

int main(void) {
    rows_order();
    outputs_match(0.0f);
    outputs_match(0.9f);
    peek_rows(0.0f);
    peek_rows(0.9f);
    errors();
    logprobs();
    printf("test_head: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail == 0 ? 0 : 1;
}
