/* Internal: the session (forward.c, session_kv.c) and what the runner (runner.c) needs of it
 * besides the public API. */
#ifndef LOIP_SESSION_H
#define LOIP_SESSION_H

#include <stddef.h>

#include "loip.h"
#include "memory/budget.h"

struct loip_session {
    const loip_model *m;
    loip_pool *pool;
    int max_ctx, max_batch, n_threads;
    size_t q_dim, kv_dim;
    loip_budget *budget;    /* NULL, or charged kv_bytes to "kv", scratch_bytes to "activations" */
    uint64_t kv_bytes, scratch_bytes;
    /* KV growth (loip_session_set_kv_growth): the pool is charged group by group as sequences
     * take groups, not all at once; kv_charged is what "kv" holds of this session now */
    int kv_grows;
    uint64_t group_bytes, kv_charged;
    size_t pool_bytes;      /* each of k_cache and v_cache: anonymous mappings, zero and not
                               resident until written */
    /* The KV cache is paged and shared by up to max_seqs sequences (requests): a sequence's
     * positions live in groups of kv_block tokens, one group holding those positions of every
     * layer kept here, found through the sequence's block table; a group is taken from the free
     * list when a sequence first writes into it and returned when the sequence ends, so that
     * sequences of any lengths share the pool. The pool is layer-major: a (layer, group) chunk
     * of kv_block rows is contiguous, so that a stage's layers of a group can be lent to
     * another device and their pages given back (loip_session_kv_lend) without the rest. */
    int kv_block;          /* tokens per group */
    int blocks_per_seq;    /* ceil(max_ctx / kv_block): a sequence's block table */
    int max_seqs;
    int n_groups;          /* groups in the pool: ceil(kv_tokens / kv_block) */
    int n_kv_layers;       /* layers whose cache is kept here */
    int32_t *layer_slot;   /* (n_layers) index of a layer among the kept ones, -1: not kept */
    int32_t *block_table;  /* (max_seqs, blocks_per_seq) group holding each logical block, -1 */
    int32_t *free_groups;  /* stack of n_free unused groups */
    int n_free;
    float *k_cache;        /* (n_kv_layers, n_groups, kv_block, kv_dim) the pool's keys */
    float *v_cache;        /* (n_kv_layers, n_groups, kv_block, kv_dim) the pool's values */
    /* Lending (loip_session_kv_lend/_return): lent[g * n_kv_layers + slot] marks a chunk whose
     * rows live on another device now; seq_lent[seq * n_kv_layers + slot] counts those away
     * (not attached) per sequence and layer: a stage must not run over a layer with any away. */
    uint8_t *lent;
    int32_t *seq_lent;
    /* a lent chunk's rows while its blob is back for a stage (loip_session_kv_attach): K then
     * V in the lender's buffer, read in place; NULL: away (seq_lent counts those) */
    const uint8_t **lent_at;
    uint64_t chunk_bytes;  /* K and V of one (layer, group) chunk */
    /* Sharing (session_share.c): refs[g] counts the block tables and the prompt cache's holds
     * naming group g (0: free), holds[g] the holds alone; a group named more than once is
     * never written (a write copies it first: copy-on-write). A group only the cache holds
     * (refs == holds > 0) is charged to the "prompt_cache" account rather than "kv" (growing
     * sessions: cache_charged) and is evicted, least recently held or adopted first (tick),
     * when a sequence needs a group and none is free or the budget refuses one; gen[g] counts
     * g's returns to the free list (a hold is still there while its gen is unchanged). */
    int32_t *refs;
    int32_t *holds;
    uint64_t *tick;
    uint32_t *gen;
    uint64_t ticks, cache_charged, cache_evictions, cow_copies;
    /* Eviction (loip_session_kv_evict): a sequence's first evicted[seq] positions keep no KV
     * here; a batch recomputes them (their rows' K/V live in k/v for one layer at a time) and
     * recompute_row[seq] is the batch row of its position 0 (-1: not in this batch). */
    int32_t *evicted;
    int32_t *recompute_row;
    int32_t *tok_seq;      /* (max_batch) the prepared batch: each token's sequence */
    int32_t *tok_pos;      /* (max_batch) and position */
    /* Trees of drafts (loip_batch_token.parent): outside the budget's sizes, as the tables above */
    int32_t *tok_rope;     /* (max_batch) the position a token is rotated as (a node: root + depth) */
    int32_t *tok_base;     /* (max_batch) a node's root position: it reads 0..base whole */
    uint64_t *tok_mask;    /* (max_batch) and base + o for each bit o - 1 set; 0: not a node */
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
    float *rope_cos; /* (max_batch, head_dim/2) */
    float *rope_sin; /* (max_batch, head_dim/2) */
    /* Mixture of experts (n_experts E > 0, k = n_experts_used; moe.c); all empty otherwise */
    loip_experts *experts;  /* unbound experts are read through it; NULL: none */
    float *moe_logits;      /* (max_batch, E) router logits */
    float *moe_w;           /* (max_batch, k) each row's chosen experts' weights, by rank */
    float *moe_x;           /* (max_batch * k, dim) xb rows gathered by expert; the shared expert's output */
    float *moe_y;           /* (max_batch * k, dim) the experts' outputs, in the same places */
    float *moe_h;           /* (max_batch * k, expert_dim) gate, then silu(gate) * up */
    float *moe_h2;          /* (max_batch * k, expert_dim) up */
    float *moe_sgate;       /* (max_batch) the shared expert's gate logits */
    int32_t *moe_sel;       /* (max_batch, k) each row's chosen experts, by rank */
    int32_t *moe_place;     /* (max_batch, k) where (row, rank) was gathered */
    int32_t *moe_count, *moe_start, *moe_fill; /* (E) rows per expert, their first gathered row */
    int32_t *moe_list, *moe_now, *moe_slot, *moe_done; /* (E) the chosen experts and their progress */
    int32_t *moe_range_start, *moe_range_count;        /* (E) row ranges computed at once */
    /* outside the budget's sizes, as the tables above */
    loip_tensor (*moe_views)[LOIP_EXPERT_PARTS]; /* (E) the tensors of experts computed at once */
    uint64_t *moe_routed;   /* (n_layers, E) tokens routed to each expert (loip_session_take_routing) */
    struct loip_linear_job_s *moe_jobs;          /* (2E + 1) their linear jobs */
};

/* The first row of chunk (layer slot, group g) of pool (k_cache or v_cache). */
static inline float *chunk_at(const loip_session *s, float *pool, int slot, int32_t g) {
    return pool + ((size_t)slot * s->n_groups + (size_t)g) * s->kv_block * s->kv_dim;
}

/* The "kv" account of a growing session (loip_session_set_kv_growth) follows what it holds: bytes
 * charged (the budget may refuse: its code, its message) or released. No-ops otherwise. */
static inline int loip_session_kv_charge(loip_session *s, uint64_t bytes) {
    if (!s->kv_grows || !s->budget) return LOIP_OK;
    int rc = loip_budget_charge(s->budget, "kv", bytes);
    if (rc == 0) s->kv_charged += bytes;
    return rc;
}
static inline void loip_session_kv_release(loip_session *s, uint64_t bytes) {
    if (!s->kv_grows || !s->budget) return;
    loip_budget_release(s->budget, "kv", bytes);
    s->kv_charged -= bytes;
}

/* A group for sequence seq at position pos (a free one, else the prompt cache's least recent
 * evicted for it; charged to "kv"): LOIP_ENOMEM naming them when none can be had. */
int loip_session_take_group(loip_session *s, int32_t seq, int32_t pos, int32_t *out);
/* Sequence seq's group holding pos made its own before it is written: a shared one is copied
 * (every kept layer's rows) into a fresh group (copy-on-write). */
int loip_session_own_group(loip_session *s, int32_t seq, int32_t pos);

/* One reference to shared group g (refs > 1) gone: left to the cache alone, its charge moves
 * from "kv" to "prompt_cache". */
void loip_session_unref_group(loip_session *s, int32_t g);

/* Group g of seq back to the free list: its charge released, less its chunks lent away (their
 * charge went with them), and their lending forgotten. */
void loip_session_release_group(loip_session *s, int32_t seq, int32_t g);

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
