/* Internal: the session (session.c: its making and its KV cache's exports; forward.c: the
 * forward pass) and what the runner (runner.c) and the worker need of it besides the public API. */
#ifndef LOIP_SESSION_H
#define LOIP_SESSION_H

#include <stddef.h>

#include "loip.h"
#include "exec/kv_cache.h"
#include "exec/moe.h"
#include "memory/budget.h"

/* A session: a model's forward pass over a KV cache (kv_cache.h) and scratch sized for a batch
 * of max_batch tokens, the mixture of experts' included (moe.c). */
struct loip_session {
    const loip_model *m;
    loip_pool *pool;
    int max_ctx, max_batch, n_threads;
    size_t q_dim, kv_dim;
    loip_budget *budget;    /* NULL, or charged scratch_bytes to "activations" */
    uint64_t scratch_bytes; /* the counted arrays below and the MoE scratch */
    loip_kv *kv;            /* the paged KV cache: its own charges ("kv", "prompt_cache") */
    loip_moe *moe;          /* the MoE layers' scratch and expert cache; NULL: a dense model */
    /* The prepared batch (loip_session_prepare) */
    int32_t *tok_seq;      /* (max_batch) each token's sequence */
    int32_t *tok_pos;      /* (max_batch) and position */
    /* Trees of drafts (loip_batch_token.parent): outside the budget's sizes, as the KV's tables */
    int32_t *tok_rope;     /* (max_batch) the position a token is rotated as (a node: root + depth) */
    int32_t *tok_base;     /* (max_batch) a node's root position: it reads 0..base whole */
    int32_t *tok_off;      /* (max_batch) a node's position past its root (1..tree_reach); 0: not a node */
    uint64_t *tok_mask;    /* (max_batch x tree_words) and base + o for each bit o - 1 set */
    int tree_words;        /* 64-bit words of a token's mask: tree_reach / 64 */
    /* (max_seqs) the batch row of each sequence's position 0 when it recomputes evicted positions
     * (their rows' K/V live in k/v for one layer at a time); -1: not in this batch */
    int32_t *recompute_row;
    int n_prepared;        /* tokens prepared (loip_session_prepare), 0: none */
    float *x;        /* (max_batch, dim) hidden state used by loip_session_forward */
    float *xb;       /* (max_batch, dim) normalised input of a sub-block */
    float *xb2;      /* (max_batch, dim) output of wo / down before the residual add */
    float *q;        /* (max_batch, q_dim) */
    float *k;        /* (max_batch, kv_dim) */
    float *v;        /* (max_batch, kv_dim) */
    float *att;      /* (max_batch, q_dim) attention output */
    float *hb;       /* (max_batch, hidden_dim) gate, then silu(gate) * up */
    float *hb2;      /* (max_batch, hidden_dim) up */
    float *scores;   /* (n_threads, max_ctx) attention weights, one row per thread */
    float *rope_cos; /* (max_batch, head_dim/2), then as many for the windowed layers (rope_local_theta) */
    float *rope_sin; /* (max_batch, head_dim/2), the same */
};

/* The 64-bit words of a tree node's ancestor mask in a session of max_batch rows: its tree reach
 * (positions past a root) is max_batch rounded up to 64, at least 64, at most LOIP_TREE_MAX. */
static inline int loip_session_tree_words(int64_t max_batch) {
    int64_t w = (max_batch + 63) / 64;
    return w < 1 ? 1 : w > LOIP_TREE_MAX / 64 ? LOIP_TREE_MAX / 64 : (int)w;
}

/* The session's own hidden state, (max_batch, dim) fp32, as loip_session_forward uses it. */
float *loip_session_hidden(loip_session *s);
int32_t loip_session_max_batch(const loip_session *s);
const loip_model *loip_session_model(const loip_session *s);

/* Make n tokens the session's batch: token t is of sequence toks[t].seq at position
 * toks[t].pos, or (toks NULL) of sequence 0 at pos + t. Checks them, maps the KV groups their
 * positions need (LOIP_ENOMEM when the pool has none left) and computes their RoPE angles. */
int loip_session_prepare(loip_session *s, int32_t n, const loip_batch_token *toks, int32_t pos);
/* Blocks [first, last) over hidden [n, dim] of the prepared batch. */
int loip_session_run(loip_session *s, int32_t first, int32_t last, float *hidden);

#endif
