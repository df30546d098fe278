/* head.c — what follows a step's last layer, for both engines (see loip.h, loip_head_*).
 *
 * The local engine (lua/loip/engine/local.lua, through the FFI) and a ring's last device
 * (runtime/worker/device.c) each run a step and hand its output rows here: which rows give an
 * output (loip_head_rows), then per row a logits output, a sampled token, or a run of drafts
 * verified as a chain or a tree (loip_head_outputs) with the slot's own sampler and history,
 * and after a run the argmax of each of its rows flagged PEEK off the accepted path (lookahead).
 * The head of a request that asks for logprobs or runs under a grammar gets its rows back as
 * logits and samples them here too (loip_head_sample), with a sampler of the same seed and
 * history, so that neither changes a request's tokens.
 *
 * A row's token is always drawn by loip_sampler_verify (no drafts: k = 0, one draw, the token
 * loip_sampler_sample gives), so every path consumes the sampler's stream the same way. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

/* A slot: its sampler (NULL: empty), parameters and history. */
typedef struct head_slot {
    loip_sampler *sampler;
    loip_sampler_params params;
    int32_t n_sample;
    int32_t *history;       /* (max_history) prompt and sampled ids, for the repetition penalty */
    int32_t n_history, max_history;
    float *masked;          /* (n_sample) a row under a grammar's mask; NULL until the first */
} head_slot;

struct loip_head {
    int32_t max_seqs, max_tokens;
    head_slot *slots;       /* (max_seqs) */
    int32_t *drafts;        /* (max_tokens) a run's draft ids */
    int32_t *parents;       /* (max_tokens) a tree's parents, as node numbers */
    int32_t *got;           /* (max_tokens) a run's tokens out */
};

static void slot_clear(head_slot *q) {
    loip_sampler_free(q->sampler);
    free(q->history);
    free(q->masked);
    memset(q, 0, sizeof *q);
}

LOIP_API void loip_head_free(loip_head *h) {
    if (!h) return;
    if (h->slots)
        for (int32_t i = 0; i < h->max_seqs; i++) slot_clear(&h->slots[i]);
    free(h->slots);
    free(h->drafts);
    free(h->parents);
    free(h->got);
    free(h);
}

LOIP_API int loip_head_new(int32_t max_seqs, int32_t max_tokens, loip_head **out) {
    if (!out) return loip_fail(LOIP_EINVAL, "head: out is NULL");
    *out = NULL;
    if (max_seqs <= 0 || max_tokens <= 0)
        return loip_fail(LOIP_EINVAL, "head: %d slots and %d tokens a step (both must be > 0)", max_seqs,
                         max_tokens);
    loip_head *h = calloc(1, sizeof *h);
    if (!h) return loip_fail(LOIP_ENOMEM, "head: out of memory");
    h->max_seqs = max_seqs, h->max_tokens = max_tokens;
    size_t T = (size_t)max_tokens;
    h->slots = calloc((size_t)max_seqs, sizeof *h->slots);
    h->drafts = malloc(T * sizeof(int32_t));
    h->parents = malloc(T * sizeof(int32_t));
    h->got = malloc(T * sizeof(int32_t));
    if (!h->slots || !h->drafts || !h->parents || !h->got) {
        loip_head_free(h);
        return loip_fail(LOIP_ENOMEM, "head: out of memory");
    }
    *out = h;
    return LOIP_OK;
}

static head_slot *slot_of(loip_head *h, int32_t seq) {
    return h && seq >= 0 && seq < h->max_seqs ? &h->slots[seq] : NULL;
}

LOIP_API int loip_head_start(loip_head *h, int32_t seq, const loip_sampler_params *p, uint64_t seed,
                             int32_t n_sample, const int32_t *prompt, int32_t n_prompt, int32_t max_history) {
    head_slot *q = slot_of(h, seq);
    if (!q) return loip_fail(LOIP_EINVAL, "head: sequence slot %d out of range (%d slots)", seq, h ? h->max_seqs : 0);
    if (!p) return loip_fail(LOIP_EINVAL, "head: params are NULL");
    if (n_prompt < 0 || (n_prompt > 0 && !prompt))
        return loip_fail(LOIP_EINVAL, "head: a prompt of %d ids (and NULL)", n_prompt);
    if (max_history < n_prompt) max_history = n_prompt;
    loip_sampler *smp;
    int rc = loip_sampler_new(n_sample, seed, &smp);
    if (rc) return rc;
    int32_t *hist = malloc((size_t)(max_history > 0 ? max_history : 1) * sizeof(int32_t));
    if (!hist) {
        loip_sampler_free(smp);
        return loip_fail(LOIP_ENOMEM, "head: out of memory");
    }
    if (n_prompt > 0) memcpy(hist, prompt, (size_t)n_prompt * sizeof(int32_t));
    slot_clear(q);
    q->sampler = smp, q->params = *p, q->n_sample = n_sample;
    q->history = hist, q->n_history = n_prompt, q->max_history = max_history;
    return LOIP_OK;
}

LOIP_API void loip_head_end(loip_head *h, int32_t seq) {
    head_slot *q = slot_of(h, seq);
    if (q) slot_clear(q);
}

LOIP_API int loip_head_skip(loip_head *h, int32_t seq, uint64_t n) {
    head_slot *q = slot_of(h, seq);
    if (!q || !q->sampler) return loip_fail(LOIP_EINVAL, "head: no sampler in sequence slot %d", seq);
    return loip_sampler_skip(q->sampler, n);
}

LOIP_API int loip_head_rows(const loip_step_token *toks, int32_t n, int32_t logits_first, int32_t *rows,
                            int32_t *n_rows, int32_t *n_logits) {
    if ((n > 0 && (!toks || !rows)) || !n_rows || !n_logits)
        return loip_fail(LOIP_EINVAL, "head rows: toks, rows, n_rows and n_logits are required");
    int32_t w = 0, nl = 0;
    /* with logits_first: the rows returned as logits, in order, then the rows only sampled */
    for (int pass = logits_first ? 0 : 1; pass < 2; pass++)
        for (int32_t t = 0; t < n; t++) {
            int32_t f = toks[t].flags;
            if (!(f & (LOIP_TOKF_SAMPLE | LOIP_TOKF_LOGITS))) continue;
            if (logits_first && !!(f & LOIP_TOKF_LOGITS) != (pass == 0)) continue;
            if (f & LOIP_TOKF_LOGITS) nl++;
            rows[w++] = t;
        }
    *n_rows = w, *n_logits = nl;
    return LOIP_OK;
}

/* The run of drafts after the SAMPLE row rows[i]: the rows flagged DRAFT of its sequence at the
 * positions after it, their ids into h->drafts; a tree's parents (node numbers, 0 the root)
 * into h->parents. Their count, or a negative LOIP_E* code. */
static int32_t draft_run(loip_head *h, const loip_step_token *toks, const int32_t *rows, int32_t n_rows, int32_t i,
                         int *tree) {
    const loip_step_token *t0 = &toks[rows[i]];
    int32_t k = 0;
    while (i + 1 + k < n_rows) {
        const loip_step_token *d = &toks[rows[i + 1 + k]];
        if (!(d->flags & LOIP_TOKF_DRAFT) || d->seq != t0->seq || d->pos != t0->pos + 1 + k) break;
        h->drafts[k++] = d->id;
    }
    *tree = k > 0 && (toks[rows[i + 1]].flags & LOIP_TOKF_TREE);
    if (*tree)
        for (int32_t j = 0; j < k; j++) {
            int32_t row = rows[i + 1 + j], up = toks[row].parent;
            h->parents[j] = row - up - rows[i];
            if (row != rows[i] + 1 + j || up <= 0 || h->parents[j] < 0 || h->parents[j] > j)
                return loip_fail(LOIP_EPROTO, "a tree node whose parent is not an earlier row of its tree");
        }
    return k;
}

/* The argmax of row[0..n) (ties: the lower id). */
static int32_t argmax(const float *row, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (row[i] > row[best]) best = i;
    return best;
}

/* After a run of k drafts after rows[i] verified into h->got[0..n_got): for each draft row
 * flagged PEEK that is not on the accepted path, an output of its argmax (flags PEEK), in row
 * order. The path: a chain's first n_got - 1 drafts; a tree's, from the root the first child
 * whose id is the next token got (as loip_sampler_verify_tree follows it). The outputs written. */
static int32_t peeks(loip_head *h, const loip_step_token *toks, const int32_t *rows, int32_t i, int32_t k, int tree,
                     int32_t n_got, const float *logits, int32_t vocab, int32_t n_sample, loip_step_output *outs,
                     int32_t *out_rows) {
    int32_t w = 0, node = 0, depth = 0;
    for (int32_t j = 1; j <= k; j++) {
        const loip_step_token *d = &toks[rows[i + j]];
        /* node j on the path: its parent is the path's last node and its id the next token */
        int on_path = 0;
        if (depth < n_got - 1) {
            int32_t up = tree ? h->parents[j - 1] : j - 1;
            if (up == node && h->drafts[j - 1] == h->got[depth]) on_path = 1, node = j, depth++;
        }
        if (on_path || !(d->flags & LOIP_TOKF_PEEK)) continue;
        if (out_rows) out_rows[w] = i + j;
        outs[w++] = (loip_step_output){d->seq, d->request, argmax(logits + (size_t)(i + j) * (size_t)vocab, n_sample),
                                       LOIP_TOKF_PEEK};
    }
    return w;
}

LOIP_API int loip_head_outputs(loip_head *h, const loip_step_token *toks, const int32_t *rows, int32_t n_rows,
                               const float *logits, int32_t vocab, loip_step_output *outs, int32_t *out_rows,
                               int32_t *n_outs, int32_t *drafted, int32_t *accepted) {
    if (!h || (n_rows > 0 && (!toks || !rows || !logits || !outs)) || !n_outs)
        return loip_fail(LOIP_EINVAL, "head outputs: head, toks, rows, logits, outs and n_outs are required");
    if (n_rows < 0 || n_rows > h->max_tokens)
        return loip_fail(LOIP_EINVAL, "head outputs: %d rows (the head takes up to %d)", n_rows, h->max_tokens);
    int32_t w = 0, n_drafted = 0, n_accepted = 0;
    int rc = LOIP_OK;
    for (int32_t i = 0; i < n_rows;) {
        const loip_step_token *t = &toks[rows[i]];
        if (t->flags & LOIP_TOKF_LOGITS) {
            if (out_rows) out_rows[w] = i;
            outs[w++] = (loip_step_output){t->seq, t->request, -1, t->flags};
            i++;
            continue;
        }
        head_slot *q = slot_of(h, t->seq);
        if (!q || !q->sampler) {
            rc = loip_fail(LOIP_ESTATE, "a token to sample in a slot without a sampler");
            break;
        }
        if (t->flags & LOIP_TOKF_DRAFT) {
            rc = loip_fail(LOIP_EPROTO, "a draft token with no row of its sequence before it");
            break;
        }
        /* one token, or a run SAMPLE, SAMPLE|DRAFT... verified as one (its accepted drafts and
         * the next token) */
        int tree = 0;
        int32_t k = draft_run(h, toks, rows, n_rows, i, &tree), n_got = 0;
        if (k < 0) {
            rc = k;
            break;
        }
        const float *row = logits + (size_t)i * (size_t)vocab;
        rc = tree ? loip_sampler_verify_tree(q->sampler, row, k, h->drafts, h->parents, &q->params, q->history,
                                             &q->n_history, q->max_history, h->got, &n_got)
                  : loip_sampler_verify(q->sampler, row, k, h->drafts, &q->params, q->history, &q->n_history,
                                        q->max_history, h->got, &n_got);
        if (rc) break;
        for (int32_t j = 0; j < n_got; j++) {
            if (out_rows) out_rows[w] = i;
            outs[w++] = (loip_step_output){t->seq, t->request, h->got[j],
                                           j + 1 < n_got ? (t->flags | LOIP_TOKF_DRAFT) : t->flags};
        }
        if (k > 0)
            w += peeks(h, toks, rows, i, k, tree, n_got, logits, vocab, q->n_sample < vocab ? q->n_sample : vocab,
                       outs + w, out_rows ? out_rows + w : NULL);
        n_drafted += k, n_accepted += n_got - 1;
        i += 1 + k;
    }
    *n_outs = w;
    if (drafted) *drafted = n_drafted;
    if (accepted) *accepted = n_accepted;
    return rc;
}

/* The log of row[0..n)'s softmax normaliser, in double: the max, then the sum of exp(x - max)
 * in index order. */
static double log_sum_exp(const float *row, int32_t n) {
    double mx = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if ((double)row[i] > mx) mx = row[i];
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) sum += exp((double)row[i] - mx);
    return mx + log(sum);
}

/* The k largest logits of row[0..n) in descending order (ties: lower id first) into ids[0..*m),
 * by insertion into a sorted list: k is a handful (OpenAI's top_logprobs is at most 20). */
static int32_t top_logits(const float *row, int32_t n, int32_t k, int32_t *ids) {
    int32_t m = 0;
    for (int32_t i = 0; i < n && k > 0; i++) {
        float v = row[i];
        if (m == k && !(v > row[ids[m - 1]])) continue;
        int32_t at = m < k ? m : k - 1; /* (a full list drops its last) */
        while (at > 0 && row[ids[at - 1]] < v) {
            ids[at] = ids[at - 1];
            at--;
        }
        ids[at] = i;
        if (m < k) m++;
    }
    return m;
}

LOIP_API int loip_head_sample(loip_head *h, int32_t seq, const float *row, struct loip_grammar_matcher *mask,
                              int32_t n_top, int32_t *token, double *logprob, int32_t *top_ids,
                              double *top_logprobs, int32_t *n_top_out) {
    head_slot *q = slot_of(h, seq);
    if (!q || !q->sampler) return loip_fail(LOIP_ESTATE, "head: no sampler in sequence slot %d", seq);
    if (!row || !token) return loip_fail(LOIP_EINVAL, "head sample: row and token are required");
    if (n_top >= 0 && (!logprob || !n_top_out || (n_top > 0 && (!top_ids || !top_logprobs))))
        return loip_fail(LOIP_EINVAL, "head sample: logprobs asked for without logprob, n_top_out, top_ids and "
                                      "top_logprobs");
    const int32_t n = q->n_sample;
    double lse = 0.0;
    if (n_top >= 0) {
        lse = log_sum_exp(row, n);
        *n_top_out = top_logits(row, n, n_top, top_ids);
        for (int32_t j = 0; j < *n_top_out; j++) top_logprobs[j] = (double)row[top_ids[j]] - lse;
    }
    const float *from = row;
    if (mask) {
        if (!q->masked && !(q->masked = malloc((size_t)n * sizeof(float))))
            return loip_fail(LOIP_ENOMEM, "head: out of memory");
        memcpy(q->masked, row, (size_t)n * sizeof(float));
        int rc = loip_grammar_matcher_apply(mask, q->masked, n);
        if (rc) return rc;
        from = q->masked;
    }
    int32_t n_got = 0;
    int rc = loip_sampler_verify(q->sampler, from, 0, NULL, &q->params, q->history, &q->n_history, q->max_history,
                                 token, &n_got);
    if (rc) return rc;
    if (n_top >= 0) *logprob = (double)row[*token] - lse;
    return LOIP_OK;
}
