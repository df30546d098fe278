/* The forward pass of a Llama-style decoder over a session: KV cache plus scratch. Everything
 * here runs per token, so it allocates nothing and decides nothing; it follows llama2.c's run.c
 * step by step (so that its references apply) with batches of tokens for prefill. What differs
 * between families is switched by loip_model_config's fields, never by a family's name: q/k/v
 * biases (qkv_bias), per-head q/k RMSNorm (qk_norm), the RoPE layout and scaling, a mixture of
 * experts (n_experts, moe.c), and Gemma-style layers: (1 + w) norms (norm_add_one), normalised
 * block outputs (post_norms), a GELU gate (ffn_act), scaled embeddings and attention scores, a
 * second RoPE base for windowed layers (rope_local_theta) and capped logits (final_softcap).
 * Each family's description (lua/loip/model/families/) sets them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/pool.h"
#include "core/runtime.h"
#include "cpu/kernels.h"
#include "exec/model.h"
#include "exec/moe.h"
#include "exec/ops.h"
#include "exec/session.h"

/* The first of the kv_block rows (kv_dim floats each) of the group holding position pos of
 * sequence seq for layer, keys or values; the rows of one group are contiguous. The group is
 * mapped (loip_session_prepare made sure), or read in place where it is lent and attached.
 * Positions a sequence has evicted are recomputed in the batch: their rows are the batch's k/v
 * rows of the layer being run, from the row of position 0 on (kv_block rows per group too). */
static inline const float *kv_block_at(const loip_session *s, int value, int layer, int seq, int pos) {
    const loip_kv *kv = s->kv;
    if (pos < kv->evicted[seq]) return (value ? s->v : s->k) + (size_t)(s->recompute_row[seq] + pos) * s->kv_dim;
    int32_t g = kv->block_table[(size_t)seq * kv->blocks_per_seq + pos / kv->kv_block];
    int slot = kv->layer_slot[layer];
    const uint8_t *at = kv->lent_at[(size_t)g * kv->n_kv_layers + slot];
    if (at) return (const float *)(at + (value ? kv->chunk_bytes / 2 : 0));
    return chunk_at(kv, value ? kv->v_cache : kv->k_cache, slot, g);
}

/* The row of position p of seq for layer (keys or values) and in *n how many rows from it, up
 * to position hi, lie one after another: a block's rest in the pool, a ring's rest up to where it
 * wraps for a ringed window layer (kv_window.c), or the batch's recomputed rows. */
static inline const float *kv_rows(const loip_session *s, int value, int layer, int seq, int p, int hi, int *n) {
    const loip_kv *kv = s->kv;
    int w = kv->win_slot[layer], left = hi - p + 1, run;
    if (w >= 0 && p >= kv->evicted[seq]) {
        int row = p % kv->win_ring;
        run = kv->win_ring - row;
        *n = left < run ? left : run;
        return ring_at(kv, value ? kv->win_v : kv->win_k, w, seq) + (size_t)row * s->kv_dim;
    }
    int off = p % kv->kv_block;
    run = kv->kv_block - off;
    *n = left < run ? left : run;
    return kv_block_at(s, value, layer, seq, p - off) + (size_t)off * s->kv_dim;
}

/* ---- per-token pieces, each a pool task ------------------------------------------------ */

typedef struct {
    loip_session *s;
    const loip_tensor *w; /* norm weight */
    float *in;            /* (n, dim) */
    float *out;           /* (n, dim) */
    const float *add;     /* NULL, or (n, dim) added to in first: in += add (residual) */
    int n, layer, pos;
} step_job;

/* out = rmsnorm(x) * w over n floats; with norm_add_one, * (1 + w): the kernel's x * inv * 1
 * (exact), then times 1 + w in fp32: the floats the kernel gives with a weight of 1 + w, as
 * llama.cpp's converter stores it. o may be x. */
static void norm_row(const loip_model *m, const loip_kernels *k, float *o, const float *x, const loip_tensor *w,
                     int n) {
    const loip_model_config *c = &m->cfg;
    if (!c->norm_add_one) {
        k->rmsnorm(o, x, w->data, w->dtype, (size_t)n, c->norm_eps);
        return;
    }
    k->rmsnorm(o, x, m->ones, LOIP_F32, (size_t)n, c->norm_eps);
    for (int i = 0; i < n; i++) {
        float wi = w->dtype == LOIP_F32 ? ((const float *)w->data)[i]
                   : w->dtype == LOIP_BF16 ? loip_bf16_to_f32(((const uint16_t *)w->data)[i])
                                          : loip_f16_to_f32(((const uint16_t *)w->data)[i]);
        o[i] *= 1.0f + wi;
    }
}

/* in += add (the residual), then out = rmsnorm(in) * w, for this thread's tokens. */
static void norm_task(void *p, int ith, int nth) {
    step_job *j = p;
    const loip_kernels *k = loip_kernels_current();
    int dim = j->s->m->cfg.dim;
    size_t b, e;
    loip_split((size_t)j->n, 1, ith, nth, &b, &e);
    for (size_t t = b; t < e; t++) {
        float *x = j->in + t * dim;
        if (j->add)
            for (int i = 0; i < dim; i++) x[i] += j->add[t * dim + i];
        if (j->out) norm_row(j->s->m, k, j->out + t * dim, x, j->w, dim);
    }
}

/* in = rmsnorm(in) * w in place, for this thread's tokens (post_norms: a block's output). */
static void post_norm_task(void *p, int ith, int nth) {
    step_job *j = p;
    const loip_kernels *k = loip_kernels_current();
    int dim = j->s->m->cfg.dim;
    size_t b, e;
    loip_split((size_t)j->n, 1, ith, nth, &b, &e);
    for (size_t t = b; t < e; t++) norm_row(j->s->m, k, j->in + t * dim, j->in + t * dim, j->w, dim);
}

static void rotate(float *v, int head_dim, int layout, const float *cs, const float *sn) {
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        int a = layout == LOIP_ROPE_INTERLEAVED ? 2 * i : i;
        int b = layout == LOIP_ROPE_INTERLEAVED ? 2 * i + 1 : i + half;
        float v0 = v[a], v1 = v[b];
        v[a] = v0 * cs[i] - v1 * sn[i];
        v[b] = v0 * sn[i] + v1 * cs[i];
    }
}

static void add_bias(float *y, const loip_tensor *b, size_t n) {
    if (!b->data) return;
    for (size_t i = 0; i < n; i++) y[i] += loip_tensor_elem(b, i);
}

/* After the q/k/v products: biases, q/k norms, RoPE, and the k/v rows into the cache. */
static void qkv_post_task(void *p, int ith, int nth) {
    step_job *j = p;
    loip_session *s = j->s;
    const loip_model *m = s->m;
    const loip_model_config *c = &m->cfg;
    const loip_kernels *k = loip_kernels_current();
    int hd = c->head_dim, half = hd / 2;
    size_t b, e;
    loip_split((size_t)j->n, 1, ith, nth, &b, &e);
    for (size_t t = b; t < e; t++) {
        float *q = s->q + t * s->q_dim, *kk = s->k + t * s->kv_dim, *vv = s->v + t * s->kv_dim;
        add_bias(q, loip_layer_w(m, j->layer, LOIP_W_BQ), s->q_dim);
        add_bias(kk, loip_layer_w(m, j->layer, LOIP_W_BK), s->kv_dim);
        add_bias(vv, loip_layer_w(m, j->layer, LOIP_W_BV), s->kv_dim);
        /* (a windowed layer's own base: the second table, rows past max_batch's) */
        size_t table = c->rope_local_theta > 0 && loip_kv_layer_windowed(c, j->layer) ? (size_t)s->max_batch * half : 0;
        const float *cs = s->rope_cos + table + t * half, *sn = s->rope_sin + table + t * half;
        const loip_tensor *qn = loip_layer_w(m, j->layer, LOIP_W_Q_NORM);
        const loip_tensor *kn = loip_layer_w(m, j->layer, LOIP_W_K_NORM);
        for (int h = 0; h < c->n_heads; h++) {
            float *v = q + (size_t)h * hd;
            if (c->qk_norm) norm_row(m, k, v, v, qn, hd);
            rotate(v, hd, c->rope_layout, cs, sn);
        }
        for (int h = 0; h < c->n_kv_heads; h++) {
            float *v = kk + (size_t)h * hd;
            if (c->qk_norm) norm_row(m, k, v, v, kn, hd);
            rotate(v, hd, c->rope_layout, cs, sn);
        }
        int pos = s->tok_pos[t], seq = s->tok_seq[t];
        loip_kv *kv = s->kv;
        if (pos < kv->evicted[seq]) continue; /* recomputed: its k/v rows serve this layer only */
        int w = kv->win_slot[j->layer];
        if (w >= 0) { /* a ringed window layer */
            size_t at = (size_t)(pos % kv->win_ring) * s->kv_dim;
            memcpy(ring_at(kv, kv->win_k, w, seq) + at, kk, s->kv_dim * sizeof(float));
            memcpy(ring_at(kv, kv->win_v, w, seq) + at, vv, s->kv_dim * sizeof(float));
            continue;
        }
        int32_t g = kv->block_table[(size_t)seq * kv->blocks_per_seq + pos / kv->kv_block];
        size_t row = (size_t)(pos % kv->kv_block) * s->kv_dim;
        memcpy(chunk_at(kv, kv->k_cache, kv->layer_slot[j->layer], g) + row, kk, s->kv_dim * sizeof(float));
        memcpy(chunk_at(kv, kv->v_cache, kv->layer_slot[j->layer], g) + row, vv, s->kv_dim * sizeof(float));
    }
}

/* Scores of q against positions lo..hi of seq into scores[at..], block by block (each block's
 * rows contiguous); *maxv their running max. */
static int score_range(const loip_session *s, const loip_kernels *k, int layer, int seq, int kvh, const float *q,
                       int lo, int hi, float *scores, int at, float scale, float *maxv) {
    int hd = s->m->cfg.head_dim, n;
    for (int p = lo; p <= hi;) {
        const float *kc = kv_rows(s, 0, layer, seq, p, hi, &n) + (size_t)kvh * hd;
        if (k->dots_f32) k->dots_f32(scores + at, q, kc, s->kv_dim, (size_t)n, (size_t)hd);
        for (int i = 0; i < n; i++) {
            float d = k->dots_f32 ? scores[at] : k->dot_f32(q, kc + (size_t)i * s->kv_dim, (size_t)hd);
            float sc = s->m->cfg.attn_scale > 0 ? d * s->m->cfg.attn_scale : d / scale;
            scores[at++] = sc;
            if (sc > *maxv) *maxv = sc;
        }
        p += n;
    }
    return at;
}

/* o += the values of positions lo..hi of seq weighted by scores[at..] / sum (with axpys_f32,
 * scores[at..] is left divided by sum). */
static int mix_range(const loip_session *s, const loip_kernels *k, int layer, int seq, int kvh, float *o, int lo,
                     int hi, float *scores, int at, float sum) {
    int hd = s->m->cfg.head_dim, n;
    for (int p = lo; p <= hi;) {
        const float *vc = kv_rows(s, 1, layer, seq, p, hi, &n) + (size_t)kvh * hd;
        if (k->axpys_f32) { /* the weights in place (each read once), then one pass over o */
            for (int i = 0; i < n; i++) scores[at + i] /= sum;
            k->axpys_f32(o, scores + at, vc, s->kv_dim, (size_t)n, (size_t)hd);
            at += n;
        } else {
            for (int i = 0; i < n; i++) k->axpy_f32(o, scores[at++] / sum, vc + (size_t)i * s->kv_dim, (size_t)hd);
        }
        p += n;
    }
    return at;
}

/* A tree node's ancestors past its root and itself, in order of position (its mask: bit o - 1
 * of words for the node at root + o), into offs: those a window layer's token at position rope
 * sees (the ancestor at root + o sits at position root + its depth, the ancestors set up to it;
 * seen when past rope - window: the last ones, depth rising with position). Their count. */
static int tree_offsets(const uint64_t *mask, int words, int rope, int root, int window, int32_t *offs) {
    int n = 0;
    for (int w = 0; w < words; w++)
        for (uint64_t bits = mask[w]; bits; bits &= bits - 1) offs[n++] = w * 64 + __builtin_ctzll(bits) + 1;
    if (!window) return n;
    int skip = rope - window - root; /* the first `skip` ancestors (depths 1..skip) lie out of the window */
    if (skip <= 0) return n;
    if (skip >= n) return 0;
    memmove(offs, offs + skip, (size_t)(n - skip) * sizeof *offs);
    return n - skip;
}

/* Causal grouped-query attention over the paged cache: one work item per (token, head), dealt to
 * the threads in turn;
 * token t attends to positions 0..tok_pos[t] of its sequence (a tree node: 0..tok_base[t] and
 * the positions its mask names), read block by block. Softmax in fp32 as run.c does, positions
 * in the same order as an unpaged cache would give them, so the result does not depend on the
 * block size, and a tree node's equals the same path's run as a chain. */
static void attention_task(void *p, int ith, int nth) {
    step_job *j = p;
    loip_session *s = j->s;
    const loip_model_config *c = &s->m->cfg;
    const loip_kernels *k = loip_kernels_current();
    int hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
    float *scores = s->scores + (size_t)ith * s->max_ctx;
    const float scale = sqrtf((float)hd);
    int window = loip_kv_layer_windowed(c, j->layer) ? c->sliding_window : 0;
    int32_t seen[LOIP_TREE_MAX]; /* a tree node's positions past its root that it attends to */
    size_t seen_t = SIZE_MAX;    /* the token they are of: a thread's items run through a token's heads in turn */
    int n_seen = 0;
    /* items dealt round-robin: a prompt's later tokens read more positions, so contiguous shares
     * would leave the first thread a causal triangle's thin end (a quarter of the work of two) */
    for (size_t item = (size_t)ith; item < (size_t)j->n * c->n_heads; item += (size_t)nth) {
        size_t t = item / c->n_heads;
        int h = (int)(item % c->n_heads), kvh = h / group, seq = s->tok_seq[t];
        int32_t off = s->tok_off[t];
        int last = off ? s->tok_base[t] : s->tok_pos[t];
        /* a window layer: the positions past (the token's position - window) only, a tree node's
         * position being its root's plus its depth (tok_rope), an ancestor's likewise */
        int rope = s->tok_rope[t], first = window && rope - window + 1 > 0 ? rope - window + 1 : 0;
        /* a node: its ancestors' and its own positions past the root, in order (words up to its own) */
        if (t != seen_t) { /* (once per token, not per (token, head): the same for all its heads) */
            n_seen = off ? tree_offsets(s->tok_mask + (size_t)t * s->tree_words, (off - 1) / 64 + 1, rope, last,
                                        window, seen)
                         : 0;
            seen_t = t;
        }
        const float *q = s->q + t * s->q_dim + (size_t)h * hd;
        float maxv = -INFINITY;
        int n = first <= last ? score_range(s, k, j->layer, seq, kvh, q, first, last, scores, 0, scale, &maxv) : 0;
        for (int i = 0; i < n_seen; i++)
            n = score_range(s, k, j->layer, seq, kvh, q, last + seen[i], last + seen[i], scores, n, scale, &maxv);
        /* attention sinks: the head's learned logit joins the max and the denominator, after
         * the positions (transformers' eager_attention_forward: the sink is the last column) */
        float sink = c->attn_sinks ? loip_tensor_elem(loip_layer_w(s->m, j->layer, LOIP_W_SINKS), (size_t)h) : 0.0f;
        if (c->attn_sinks && sink > maxv) maxv = sink;
        float sum = 0.0f;
        for (int pp = 0; pp < n; pp++) {
            scores[pp] = expf(scores[pp] - maxv);
            sum += scores[pp];
        }
        if (c->attn_sinks) sum += expf(sink - maxv);
        float *o = s->att + t * s->q_dim + (size_t)h * hd;
        memset(o, 0, (size_t)hd * sizeof(float));
        int at = first <= last ? mix_range(s, k, j->layer, seq, kvh, o, first, last, scores, 0, sum) : 0;
        for (int i = 0; i < n_seen; i++)
            at = mix_range(s, k, j->layer, seq, kvh, o, last + seen[i], last + seen[i], scores, at, sum);
    }
}

/* ---- public entry points ----------------------------------------------------------------- */

static int check_batch(const loip_session *s, int32_t n) {
    if (n <= 0 || n > s->max_batch)
        return loip_fail(LOIP_EINVAL, "forward: %d tokens at once (batch limit %d)", n, s->max_batch);
    return LOIP_OK;
}

/* Token t's rotation and what it reads (tok_seq/tok_pos of rows 0..t set): an ordinary row its
 * own position and 0..pos; a tree node (parent > 0) its parent's rotation + 1 and its root's
 * positions 0..base with its ancestors' and its own past the root (loip_batch_token). */
static int tree_node(loip_session *s, const loip_batch_token *toks, int32_t t) {
    int32_t parent = toks ? toks[t].parent : 0;
    s->tok_rope[t] = s->tok_pos[t], s->tok_base[t] = 0, s->tok_off[t] = 0;
    if (parent == 0) return LOIP_OK;
    int32_t a = t - parent;
    if (parent < 0 || a < 0 || s->tok_seq[a] != s->tok_seq[t] || s->tok_pos[a] >= s->tok_pos[t])
        return loip_fail(LOIP_EINVAL, "forward: token %d of the batch (sequence %d at %d) names as its parent the row "
                         "%d rows before it, not an earlier position of its sequence in the batch", t, s->tok_seq[t],
                         s->tok_pos[t], parent);
    int32_t base = s->tok_off[a] ? s->tok_base[a] : s->tok_pos[a], o = s->tok_pos[t] - base;
    int reach = s->tree_words * 64;
    if (o > reach)
        return loip_fail(LOIP_EINVAL, "forward: token %d of the batch (sequence %d) at position %d, %d past its tree's "
                         "root (parent: at most %d past it: the session's tree reach, its batch of %d rounded up to "
                         "64, at most LOIP_TREE_MAX %d)", t, s->tok_seq[t], s->tok_pos[t], o, reach, s->max_batch,
                         LOIP_TREE_MAX);
    s->tok_rope[t] = s->tok_rope[a] + 1, s->tok_base[t] = base, s->tok_off[t] = o;
    uint64_t *mask = s->tok_mask + (size_t)t * s->tree_words;
    int w = (o - 1) / 64, wa = s->tok_off[a] ? (s->tok_off[a] - 1) / 64 + 1 : 0; /* words: the node's, its parent's */
    if (wa) memcpy(mask, s->tok_mask + (size_t)a * s->tree_words, (size_t)wa * sizeof *mask);
    for (int i = wa; i <= w; i++) mask[i] = 0;
    mask[w] |= (uint64_t)1 << ((o - 1) % 64);
    return LOIP_OK;
}

/* The prepared tokens' recomputed rows: a sequence with evicted positions must bring all of
 * them, in order, as consecutive rows (recompute_row[seq] is the first), whenever it has a
 * token in the batch. */
static int find_recomputed(loip_session *s, int32_t n) {
    for (int32_t t = 0; t < n; t++) s->recompute_row[s->tok_seq[t]] = -1;
    for (int32_t t = 0; t < n; t++) {
        int32_t q = s->tok_seq[t], e = s->kv->evicted[q];
        if (e == 0 || s->recompute_row[q] >= 0 || s->tok_pos[t] != 0) continue;
        if (t + e > n)
            return loip_fail(LOIP_EINVAL, "forward: sequence %d recomputes its %d evicted positions but the batch "
                             "holds %d rows from its position 0", q, e, n - t);
        for (int32_t i = 0; i < e; i++)
            if (s->tok_seq[t + i] != q || s->tok_pos[t + i] != i)
                return loip_fail(LOIP_EINVAL, "forward: sequence %d's evicted positions 0..%d must be rows %d..%d "
                                 "in order (row %d is sequence %d at %d)", q, e - 1, t, t + e - 1, t + i,
                                 s->tok_seq[t + i], s->tok_pos[t + i]);
        s->recompute_row[q] = t;
    }
    for (int32_t t = 0; t < n; t++) {
        int32_t q = s->tok_seq[t], e = s->kv->evicted[q];
        if (e == 0) continue;
        if (s->recompute_row[q] < 0)
            return loip_fail(LOIP_EINVAL, "forward: sequence %d's positions 0..%d are evicted and the batch does not "
                             "recompute them", q, e - 1);
        if (s->tok_pos[t] < e && t != s->recompute_row[q] + s->tok_pos[t])
            return loip_fail(LOIP_EINVAL, "forward: sequence %d's evicted position %d twice in one batch", q,
                             s->tok_pos[t]);
    }
    return LOIP_OK;
}

/* A sequence's groups wholly past its last position in the prepared batch back to the pool:
 * a step that verified drafts (LOIP_TOKF_DRAFT) and rejected some moved the sequence back, and
 * the KV of those positions is dropped, as a sequence holds groups up to its last position only.
 * (Groups lent away are left alone: lending moves a sequence's oldest groups, never these.) */
static void drop_past(loip_session *s, int32_t n) {
    for (int32_t t = 0; t < n; t++) {
        if (t + 1 < n && s->tok_seq[t + 1] == s->tok_seq[t]) continue; /* the end of a run of the sequence */
        int32_t seq = s->tok_seq[t], last = -1;
        for (int32_t u = 0; u < n; u++)
            if (s->tok_seq[u] == seq && s->tok_pos[u] > last) last = s->tok_pos[u];
        loip_kv_trim(s->kv, seq, last);
    }
}

int loip_session_prepare(loip_session *s, int32_t n, const loip_batch_token *toks, int32_t pos) {
    s->n_prepared = 0;
    int rc = check_batch(s, n);
    if (rc) return rc;
    if (!toks && (pos < 0 || pos + n > s->max_ctx))
        return loip_fail(LOIP_ERANGE, "forward: positions %d..%d past the context of %d tokens",
                         pos, pos + n - 1, s->max_ctx);
    for (int32_t t = 0; t < n; t++) {
        int32_t seq = toks ? toks[t].seq : 0, p = toks ? toks[t].pos : pos + t;
        if (seq < 0 || seq >= s->kv->max_seqs)
            return loip_fail(LOIP_EINVAL, "forward: token %d of the batch is of sequence %d (the session has %d)",
                             t, seq, s->kv->max_seqs);
        if (p < 0 || p >= s->max_ctx)
            return loip_fail(LOIP_ERANGE, "forward: token %d of the batch (sequence %d) at position %d, past "
                             "the context of %d tokens", t, seq, p, s->max_ctx);
        s->tok_seq[t] = seq, s->tok_pos[t] = p;
        if ((rc = tree_node(s, toks, t))) return rc;
    }
    if ((rc = find_recomputed(s, n))) return rc;
    for (int32_t t = 0; t < n; t++) /* (attention never reads an unmapped group) */
        if (s->tok_pos[t] >= s->kv->evicted[s->tok_seq[t]] && (rc = loip_kv_prepare(s->kv, s->tok_seq[t], s->tok_pos[t])))
            return rc;
    loip_kv_take_wants(s->kv); /* (the rings as the last batch left them: the prompt cache's snapshots) */
    for (int32_t t = 0; t < n; t++) /* (what a ring holds: kv_window.c) */
        if (s->tok_pos[t] >= s->kv->win_len[s->tok_seq[t]]) s->kv->win_len[s->tok_seq[t]] = s->tok_pos[t] + 1;
    drop_past(s, n);
    /* cos/sin of each token's position for RoPE, once per batch */
    const loip_model *m = s->m;
    int half = m->cfg.head_dim / 2;
    for (int table = 0; table < (m->cfg.rope_local_theta > 0 ? 2 : 1); table++) {
        const float *inv = m->inv_freq + table * half;
        size_t at = (size_t)table * s->max_batch * half;
        float *cs = s->rope_cos + at, *sn = s->rope_sin + at;
        float scale = table ? 1.0f : m->rope_mscale; /* YaRN's factor: the scaled table's */
        for (int t = 0; t < n; t++)
            for (int i = 0; i < half; i++) {
                float val = (float)s->tok_rope[t] * inv[i];
                cs[t * half + i] = cosf(val) * scale;
                sn[t * half + i] = sinf(val) * scale;
            }
    }
    s->n_prepared = n;
    return LOIP_OK;
}

/* x *= scale over n floats in the embedding's dtype: for BF16/F16 the scale and each product
 * rounded to it, as Hugging Face multiplies a BF16 row by its scale cast to BF16 (Gemma); in
 * fp32 for F32 (and llama.cpp, which scales the F32 row by sqrtf(dim)). */
static void scale_embedding(float *x, int n, float scale, int32_t dtype) {
    if (dtype == LOIP_BF16) {
        float sc = loip_bf16_to_f32(loip_f32_to_bf16(scale));
        for (int i = 0; i < n; i++) x[i] = loip_bf16_to_f32(loip_f32_to_bf16(x[i] * sc));
    } else if (dtype == LOIP_F16) {
        float sc = loip_f16_to_f32(loip_f32_to_f16(scale));
        for (int i = 0; i < n; i++) x[i] = loip_f16_to_f32(loip_f32_to_f16(x[i] * sc));
    } else {
        for (int i = 0; i < n; i++) x[i] *= scale;
    }
}

LOIP_API int loip_session_embed(loip_session *s, const int32_t *tokens, int32_t n, float *hidden) {
    const loip_model_config *c = &s->m->cfg;
    const loip_tensor *E = &s->m->global[LOIP_W_EMBED];
    loip_rows *R = s->m->rows[LOIP_W_EMBED];
    if (!E->data && R) { /* the table stays on disk: each token's row read (or found in its cache) */
        for (int32_t t = 0; t < n; t++) {
            int rc = loip_rows_get(R, tokens[t], hidden + (size_t)t * c->dim);
            if (rc) return rc;
            if (c->embed_scale > 0)
                scale_embedding(hidden + (size_t)t * c->dim, c->dim, c->embed_scale, loip_rows_dtype(R));
        }
        return LOIP_OK;
    }
    if (!E->data) return loip_fail(LOIP_ESTATE, "weight embed is not bound");
    for (int32_t t = 0; t < n; t++) {
        if (tokens[t] < 0 || tokens[t] >= c->vocab_size)
            return loip_fail(LOIP_EINVAL, "embed: token id %d out of range [0, %d)", tokens[t], c->vocab_size);
        size_t off = (size_t)tokens[t] * c->dim;
        size_t es = (size_t)loip_dtype_size(E->dtype);
        int rc = loip_convert(hidden + (size_t)t * c->dim, LOIP_F32, (const char *)E->data + off * es,
                              E->dtype, (uint64_t)c->dim);
        if (rc) return rc;
        if (c->embed_scale > 0) scale_embedding(hidden + (size_t)t * c->dim, c->dim, c->embed_scale, E->dtype);
    }
    return LOIP_OK;
}

/* post_norms: a block's output xb2 = rmsnorm(xb2) * its norm (which), before the residual add. */
static void post_norm(loip_session *s, int l, int which, int n) {
    if (!s->m->cfg.post_norms) return;
    step_job j = {.s = s, .n = n, .layer = l, .w = loip_layer_w(s->m, l, which), .in = s->xb2};
    loip_pool_run(s->pool, post_norm_task, &j);
}

/* Attention block of layer l: xb = norm(x); q, k, v; rope; cache; attend; x += wo . att. */
static void mha_block(loip_session *s, int l, float *hidden, int n) {
    const loip_model *m = s->m;
    if (s->moe) loip_moe_predict(s, l, hidden, n); /* the layer's experts start loading now */
    step_job j = {.s = s, .n = n, .layer = l};
    j.w = loip_layer_w(m, l, LOIP_W_ATTN_NORM);
    j.in = hidden, j.out = s->xb, j.add = NULL;
    loip_pool_run(s->pool, norm_task, &j);
    loip_linear_job qkv[4] = {loip_linear_of(loip_layer_w(m, l, LOIP_W_WQ), s->xb, s->q, n),
                              loip_linear_of(loip_layer_w(m, l, LOIP_W_WK), s->xb, s->k, n),
                              loip_linear_of(loip_layer_w(m, l, LOIP_W_WV), s->xb, s->v, n), {0}};
    loip_linear_run(s->pool, qkv);
    loip_pool_run(s->pool, qkv_post_task, &j);
    uint64_t t_att = loip_now_ns();
    loip_pool_run(s->pool, attention_task, &j);
    loip_phase_add(LOIP_PHASE_ATTENTION, loip_now_ns() - t_att);
    loip_linear_job wo[2] = {loip_linear_of(loip_layer_w(m, l, LOIP_W_WO), s->att, s->xb2, n), {0}};
    loip_linear_run(s->pool, wo);
    if (m->cfg.attn_out_bias)
        for (int t = 0; t < n; t++) add_bias(s->xb2 + (size_t)t * m->cfg.dim, loip_layer_w(m, l, LOIP_W_BO), (size_t)m->cfg.dim);
    post_norm(s, l, LOIP_W_POST_ATTN_NORM, n);
    j.out = NULL, j.add = s->xb2;
    loip_pool_run(s->pool, norm_task, &j); /* residual add only */
}

/* MLP block of layer l: xb = norm(x); hb = silu(gate . xb) * (up . xb); x += down . hb.
 * (The residual add of the attention output happens at the end of mha_block rather than
 * fused into this norm: the same float operations in the same order, so the results are
 * bit-identical either way, and a block can start a stage on its own.) */
static int mlp_block(loip_session *s, int l, float *hidden, int n) {
    const loip_model *m = s->m;
    step_job j = {.s = s, .n = n, .layer = l};
    j.w = loip_layer_w(m, l, LOIP_W_FFN_NORM);
    j.in = hidden, j.out = s->xb, j.add = NULL;
    loip_pool_run(s->pool, norm_task, &j);
    if (m->cfg.n_experts) {
        int rc = loip_moe_ffn(s, l, n);
        if (rc) return rc;
        post_norm(s, l, LOIP_W_POST_FFN_NORM, n);
        j.out = NULL, j.add = s->xb2;
        loip_pool_run(s->pool, norm_task, &j); /* residual add only */
        return LOIP_OK;
    }
    loip_linear_job gu[3] = {loip_linear_of(loip_layer_w(m, l, LOIP_W_GATE), s->xb, s->hb, n),
                             loip_linear_of(loip_layer_w(m, l, LOIP_W_UP), s->xb, s->hb2, n), {0}};
    loip_linear_run(s->pool, gu);
    int32_t start = 0, count = n;
    loip_gate_run(s->pool, m->cfg.ffn_act, s->hb, s->hb2, &start, &count, 1, m->cfg.hidden_dim);
    loip_linear_job down[2] = {loip_linear_of(loip_layer_w(m, l, LOIP_W_DOWN), s->hb, s->xb2, n), {0}};
    loip_linear_run(s->pool, down);
    post_norm(s, l, LOIP_W_POST_FFN_NORM, n);
    j.out = NULL, j.add = s->xb2;
    loip_pool_run(s->pool, norm_task, &j); /* residual add only */
    return LOIP_OK;
}

int loip_session_run(loip_session *s, int32_t first, int32_t last, float *hidden) {
    const loip_model *m = s->m;
    int n = s->n_prepared, rc;
    if (n <= 0) return loip_fail(LOIP_ESTATE, "forward: no batch prepared");
    if (first < 0 || last > 2 * m->cfg.n_layers || first > last)
        return loip_fail(LOIP_EINVAL, "blocks [%d, %d) out of range for %d layers (%d blocks)",
                         first, last, m->cfg.n_layers, 2 * m->cfg.n_layers);
    if (first == last) return LOIP_OK;
    if ((rc = loip_model_check_blocks(m, first, last))) return rc;
    const loip_kv *kv = s->kv;
    for (int b = first; b < last; b += 2 - b % 2) {
        if (b % 2 != LOIP_BLOCK_MHA) continue;
        int slot = kv->layer_slot[b / 2];
        if (slot < 0 && kv->win_slot[b / 2] >= 0) continue; /* a ringed window layer: never lent */
        if (slot < 0) return loip_fail(LOIP_ESTATE, "layer %d's KV cache is not kept by this session", b / 2);
        for (int t = 0; t < n; t++)
            if (kv->seq_lent[(size_t)s->tok_seq[t] * kv->n_kv_layers + slot])
                return loip_fail(LOIP_ESTATE, "layer %d's KV cache of sequence %d is lent out (%d groups): fetch it "
                                 "back before the layer runs", b / 2, s->tok_seq[t],
                                 kv->seq_lent[(size_t)s->tok_seq[t] * kv->n_kv_layers + slot]);
    }
    for (int b = first; b < last; b++) {
        if (b % 2 == LOIP_BLOCK_MHA) mha_block(s, b / 2, hidden, n);
        else if ((rc = mlp_block(s, b / 2, hidden, n))) return rc;
    }
    return LOIP_OK;
}

LOIP_API int loip_session_blocks(loip_session *s, int32_t first, int32_t last, float *hidden,
                                 int32_t n, int32_t pos) {
    int rc = loip_session_prepare(s, n, NULL, pos);
    return rc ? rc : loip_session_run(s, first, last, hidden);
}

/* final_softcap: logits = tanh(logits / cap) * cap in fp32, as transformers divides, takes the
 * tanh and multiplies (llama.cpp scales by 1/cap: within an ulp of the quotient). */
static void softcap(const loip_model_config *c, float *logits, size_t n) {
    if (!(c->final_softcap > 0)) return;
    for (size_t i = 0; i < n; i++) logits[i] = tanhf(logits[i] / c->final_softcap) * c->final_softcap;
}

/* The head's weights: the final norm, and its table in memory (*W) or read from its file (*R). */
static int head_weights(const loip_session *s, const loip_tensor **W, loip_rows **R, const loip_tensor **norm) {
    const loip_model *m = s->m;
    const loip_model_config *c = &m->cfg;
    int which = c->tied_embeddings ? LOIP_W_EMBED : LOIP_W_LM_HEAD;
    *W = &m->global[which];
    *R = (*W)->data ? NULL : m->rows[which];
    *norm = &m->global[LOIP_W_OUTPUT_NORM];
    if ((!(*W)->data && !*R) || !(*norm)->data)
        return loip_fail(LOIP_ESTATE, "weight %s is not bound", !(*norm)->data ? "output_norm" :
                         c->tied_embeddings ? "embed" : "lm_head");
    return LOIP_OK;
}

LOIP_API int loip_session_head(loip_session *s, const float *hidden, int32_t n, float *logits,
                               int32_t mode) {
    const loip_model_config *c = &s->m->cfg;
    if (mode == LOIP_LOGITS_NONE) return LOIP_OK;
    if (mode != LOIP_LOGITS_LAST && mode != LOIP_LOGITS_ALL)
        return loip_fail(LOIP_EINVAL, "head: unknown logits mode %d", mode);
    if (n <= 0 || n > s->max_batch)
        return loip_fail(LOIP_EINVAL, "head: %d tokens at once (batch limit %d)", n, s->max_batch);
    const loip_tensor *W, *norm;
    loip_rows *R;
    int rc = head_weights(s, &W, &R, &norm);
    if (rc) return rc;
    int first = mode == LOIP_LOGITS_LAST ? n - 1 : 0, count = n - first;
    /* The norm only reads its input here (no residual add), so the cast is safe. */
    step_job j = {.s = s, .n = count, .w = norm, .in = (float *)hidden + (size_t)first * c->dim, .out = s->xb};
    loip_pool_run(s->pool, norm_task, &j);
    if (R) {
        if ((rc = loip_rows_head(R, s->pool, s->xb, count, logits))) return rc;
    } else {
        loip_linear_job head[2] = {loip_linear_of(W, s->xb, logits, count), {0}};
        loip_linear_run(s->pool, head);
    }
    softcap(c, logits, (size_t)count * c->vocab_size);
    return LOIP_OK;
}

LOIP_API int loip_session_head_norm(loip_session *s, const float *hidden, int32_t n, const int32_t *rows,
                                    int32_t n_rows, float *out) {
    const loip_model_config *c = &s->m->cfg;
    if (n_rows <= 0) return LOIP_OK;
    if (n_rows > s->max_batch)
        return loip_fail(LOIP_EINVAL, "head: %d rows at once (batch limit %d)", n_rows, s->max_batch);
    const loip_tensor *norm = &s->m->global[LOIP_W_OUTPUT_NORM];
    if (!norm->data) return loip_fail(LOIP_ESTATE, "weight output_norm is not bound");
    for (int32_t i = 0; i < n_rows; i++) {
        if (rows[i] < 0 || rows[i] >= n)
            return loip_fail(LOIP_EINVAL, "head: row %d of a batch of %d", rows[i], n);
        /* the rows side by side in xb2, normalised into out below: the same operations as
         * loip_session_head on each row alone */
        memcpy(s->xb2 + (size_t)i * c->dim, hidden + (size_t)rows[i] * c->dim, (size_t)c->dim * sizeof(float));
    }
    step_job j = {.s = s, .n = n_rows, .w = norm, .in = s->xb2, .out = out};
    loip_pool_run(s->pool, norm_task, &j);
    return LOIP_OK;
}

LOIP_API int loip_session_head_rows(loip_session *s, const float *hidden, int32_t n,
                                    const int32_t *rows, int32_t n_rows, float *logits) {
    if (n_rows <= 0) return LOIP_OK;
    const loip_tensor *W, *norm;
    loip_rows *R;
    int rc = head_weights(s, &W, &R, &norm);
    if (rc || (rc = loip_session_head_norm(s, hidden, n, rows, n_rows, s->xb))) return rc;
    return loip_session_head_share(s, s->xb, n_rows, 0, s->m->cfg.vocab_size, logits);
}

LOIP_API int loip_session_forward(loip_session *s, const int32_t *tokens, int32_t n, int32_t pos,
                                  float *logits, int32_t mode) {
    int rc = loip_session_prepare(s, n, NULL, pos);
    if (rc) return rc;
    if ((rc = loip_session_embed(s, tokens, n, s->x))) return rc;
    if ((rc = loip_session_run(s, 0, 2 * s->m->cfg.n_layers, s->x))) return rc;
    return loip_session_head(s, s->x, n, logits, mode);
}

LOIP_API int loip_session_forward_batch(loip_session *s, const int32_t *tokens, int32_t n,
                                        const loip_batch_token *toks, const int32_t *rows,
                                        int32_t n_rows, float *logits) {
    if (!toks) return loip_fail(LOIP_EINVAL, "forward: a batch without its tokens' sequences and positions");
    int rc = loip_session_prepare(s, n, toks, 0);
    if (rc) return rc;
    if ((rc = loip_session_embed(s, tokens, n, s->x))) return rc;
    if ((rc = loip_session_run(s, 0, 2 * s->m->cfg.n_layers, s->x))) return rc;
    return loip_session_head_rows(s, s->x, n, rows, n_rows, logits);
}
