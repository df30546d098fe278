/* A session: its KV cache (kv_cache.h), its scratch from one table (sized for the budget,
 * allocated and freed from it) and the MoE layers' scratch (moe.c); the exported operations on
 * its KV cache (loip_session_kv_*, loip.h). The forward pass over it is forward.c's. */
#include <stddef.h>
#include <stdlib.h>

#include "core/core.h"
#include "core/pool.h"
#include "exec/arrays.h"
#include "exec/model.h"
#include "exec/moe.h"
#include "exec/session.h"
#include "memory/budget.h"

enum { COUNTED = LOIP_ARRAY_COUNTED, TABLE = LOIP_ARRAY_ZERO, SESSION_MAX_ARRAYS = 20 };

/* The session's arrays for a batch of B tokens, n_threads attention rows of max_ctx and
 * max_seqs sequences: the activations charged to "activations" (with the MoE scratch), the
 * batch's tree and recompute tables outside the budget's sizes (as the object itself). */
static size_t session_arrays(const loip_model_config *c, uint64_t B, uint64_t n_threads, uint64_t max_ctx,
                             uint64_t max_seqs, loip_array *t) {
    uint64_t q_dim = (uint64_t)c->n_heads * c->head_dim, kv_dim = (uint64_t)c->n_kv_heads * c->head_dim;
    size_t n = 0;
#define SESSION_ARRAY(field, count, flags) \
    t[n++] = (loip_array){offsetof(loip_session, field), sizeof *((loip_session *)0)->field, (count), (flags)}
    SESSION_ARRAY(x, B * c->dim, COUNTED);
    SESSION_ARRAY(xb, B * c->dim, COUNTED);
    SESSION_ARRAY(xb2, B * c->dim, COUNTED);
    SESSION_ARRAY(q, B * q_dim, COUNTED);
    SESSION_ARRAY(k, B * kv_dim, COUNTED);
    SESSION_ARRAY(v, B * kv_dim, COUNTED);
    SESSION_ARRAY(att, B * q_dim, COUNTED);
    SESSION_ARRAY(hb, B * c->hidden_dim, COUNTED);
    SESSION_ARRAY(hb2, B * c->hidden_dim, COUNTED);
    SESSION_ARRAY(scores, n_threads * max_ctx, COUNTED);
    /* (a second table for the windowed layers' own base: rope_local_theta) */
    uint64_t rope_tables = c->rope_local_theta > 0 ? 2 : 1;
    SESSION_ARRAY(rope_cos, rope_tables * B * (c->head_dim / 2), COUNTED);
    SESSION_ARRAY(rope_sin, rope_tables * B * (c->head_dim / 2), COUNTED);
    SESSION_ARRAY(tok_seq, B, COUNTED);
    SESSION_ARRAY(tok_pos, B, COUNTED);
    SESSION_ARRAY(tok_rope, B, TABLE);
    SESSION_ARRAY(tok_base, B, TABLE);
    SESSION_ARRAY(tok_off, B, TABLE);
    SESSION_ARRAY(tok_mask, B * (uint64_t)loip_session_tree_words((int64_t)B), TABLE);
    SESSION_ARRAY(recompute_row, max_seqs, TABLE);
#undef SESSION_ARRAY
    return n;
}

/* Bytes charged to "activations": the session's counted arrays and the MoE scratch. */
static uint64_t scratch_bytes(const loip_model_config *c, int32_t max_batch, int32_t n_threads, int32_t max_ctx) {
    loip_array t[SESSION_MAX_ARRAYS];
    size_t n = session_arrays(c, (uint64_t)max_batch, (uint64_t)n_threads, (uint64_t)max_ctx, 1, t);
    return loip_arrays_bytes(t, n) + loip_moe_scratch_bytes(c, max_batch);
}

LOIP_API int loip_session_size(const loip_model_config *cfg, int32_t max_ctx, int32_t max_batch,
                               int32_t n_threads, int32_t kv_layers, int32_t kv_tokens,
                               int32_t max_seqs, uint64_t *kv_bytes, uint64_t *scratch) {
    if (max_ctx <= 0 || max_batch <= 0 || n_threads <= 0)
        return loip_fail(LOIP_EINVAL, "session: context (%d), batch (%d) and threads (%d) must be positive",
                         max_ctx, max_batch, n_threads);
    if (max_batch > max_ctx) max_batch = max_ctx;
    *kv_bytes = loip_kv_size(cfg, max_ctx, max_batch, NULL, kv_layers, kv_tokens, max_seqs);
    *scratch = scratch_bytes(cfg, max_batch, n_threads, max_ctx);
    return LOIP_OK;
}

LOIP_API uint64_t loip_session_kv_size(const loip_model_config *cfg, int32_t max_ctx, int32_t max_batch,
                                       const uint8_t *kv_layers, int32_t kv_tokens, int32_t max_seqs) {
    if (max_ctx <= 0 || max_batch <= 0) return 0;
    return loip_kv_size(cfg, max_ctx, max_batch, kv_layers, -1, kv_tokens, max_seqs);
}

LOIP_API int loip_session_new_layers(const loip_model *m, loip_pool *pool, int32_t max_ctx,
                                     int32_t max_batch, loip_budget *budget,
                                     const uint8_t *kv_layers, loip_session **out) {
    return loip_session_new_seqs(m, pool, max_ctx, max_batch, 0, 1, budget, kv_layers, 0, out);
}

/* The session's scratch (its arrays and the MoE layers') allocated, the batch emptied. */
static int alloc_scratch(loip_session *s, int32_t max_seqs, int32_t kv_tokens) {
    const loip_model_config *c = &s->m->cfg;
    loip_array t[SESSION_MAX_ARRAYS];
    size_t n = session_arrays(c, (uint64_t)s->max_batch, (uint64_t)s->n_threads, (uint64_t)s->max_ctx,
                              (uint64_t)max_seqs, t);
    uint64_t failed;
    if (loip_arrays_alloc(s, t, n, &failed))
        return loip_fail(LOIP_ENOMEM, "session: cannot allocate %llu bytes (context %d, batch %d, %d KV tokens)",
                         (unsigned long long)failed, s->max_ctx, s->max_batch, kv_tokens);
    for (int32_t q = 0; q < max_seqs; q++) s->recompute_row[q] = -1;
    return loip_moe_new(c, s->max_batch, &s->moe);
}

LOIP_API int loip_session_new_seqs(const loip_model *m, loip_pool *pool, int32_t max_ctx,
                                   int32_t max_batch, int32_t kv_tokens, int32_t max_seqs,
                                   loip_budget *budget, const uint8_t *kv_layers, uint32_t flags,
                                   loip_session **out) {
    *out = NULL;
    const loip_model_config *c = &m->cfg;
    if (max_ctx <= 0 || max_batch <= 0)
        return loip_fail(LOIP_EINVAL, "session: context (%d) and batch (%d) must be positive",
                         max_ctx, max_batch);
    if (kv_tokens < 0 || max_seqs < 0)
        return loip_fail(LOIP_EINVAL, "session: kv_tokens (%d) and max_seqs (%d) must not be negative",
                         kv_tokens, max_seqs);
    if (kv_tokens == 0) kv_tokens = max_ctx;
    if (max_seqs == 0) max_seqs = 1;
    if (max_batch > max_ctx) max_batch = max_ctx;
    loip_session *s = calloc(1, sizeof *s);
    if (!s) return loip_fail(LOIP_ENOMEM, "session: out of memory");
    s->m = m, s->pool = pool;
    s->max_ctx = max_ctx, s->max_batch = max_batch, s->n_threads = loip_pool_size(pool);
    s->tree_words = loip_session_tree_words(max_batch);
    s->q_dim = (size_t)c->n_heads * c->head_dim;
    s->kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    /* charged whole ("kv", then "activations") before the pool and the scratch are allocated */
    int rc = loip_kv_new(c, max_ctx, max_batch, kv_tokens, max_seqs, kv_layers, (flags & LOIP_SESSION_KV_GROWS) != 0, budget,
                         &s->kv);
    if (rc) goto fail;
    s->scratch_bytes = scratch_bytes(c, max_batch, s->n_threads, max_ctx);
    if (budget) {
        if ((rc = loip_budget_charge(budget, "activations", s->scratch_bytes))) goto fail;
        s->budget = loip_budget_retain(budget);
    }
    if ((rc = loip_kv_map_pool(s->kv)) || (rc = loip_kv_map_rings(s->kv)) || (rc = alloc_scratch(s, max_seqs, kv_tokens))) goto fail;
    *out = s;
    return LOIP_OK;
fail:
    loip_session_free(s);
    return rc;
}

LOIP_API void loip_session_free(loip_session *s) {
    if (!s) return;
    loip_kv_free(s->kv);
    loip_moe_free(s->moe);
    loip_array t[SESSION_MAX_ARRAYS];
    const loip_model_config none = {0}; /* (freeing needs only where the pointers are) */
    loip_arrays_free(s, t, session_arrays(&none, 0, 0, 0, 0, t));
    if (s->budget) {
        loip_budget_release(s->budget, "activations", s->scratch_bytes);
        loip_budget_free(s->budget);
    }
    free(s);
}

LOIP_API uint64_t loip_session_scratch_bytes(const loip_session *s) { return s->scratch_bytes; }
LOIP_API int32_t loip_session_max_seqs(const loip_session *s) { return s->kv->max_seqs; }
float *loip_session_hidden(loip_session *s) { return s->x; }
int32_t loip_session_max_batch(const loip_session *s) { return s->max_batch; }
const loip_model *loip_session_model(const loip_session *s) { return s->m; }

/* ---- its KV cache (kv_cache.c, kv_lend.c, kv_share.c) -------------------------------------- */

LOIP_API uint64_t loip_session_kv_bytes(const loip_session *s) { return s->kv->bytes; }
LOIP_API int32_t loip_session_kv_block_tokens(const loip_session *s) { return s->kv->kv_block; }
LOIP_API int32_t loip_session_kv_free_tokens(const loip_session *s) { return s->kv->n_free * s->kv->kv_block; }
LOIP_API uint64_t loip_session_kv_charged(const loip_session *s) { return s->kv->charged; }
LOIP_API uint64_t loip_session_kv_group_bytes(const loip_session *s) { return s->kv->group_bytes; }
LOIP_API uint64_t loip_session_kv_chunk_bytes(const loip_session *s) { return s->kv->chunk_bytes; }
LOIP_API int32_t loip_session_kv_window_layers(const loip_session *s) { return s->kv->n_win_layers; }
LOIP_API int32_t loip_session_kv_ring_tokens(const loip_model_config *cfg, int32_t max_ctx, int32_t max_batch) {
    return loip_kv_ring_tokens(cfg, max_ctx, max_batch < max_ctx ? max_batch : max_ctx);
}
LOIP_API uint64_t loip_session_kv_window_bytes(const loip_session *s) { return 2 * (uint64_t)s->kv->win_map_bytes; }
LOIP_API int loip_session_seq_free(loip_session *s, int32_t seq) { return loip_kv_seq_free(s->kv, seq); }
LOIP_API int loip_session_set_kv_growth(loip_session *s, int32_t grows) { return loip_kv_set_growth(s->kv, grows); }
LOIP_API int32_t loip_session_kv_groups_held(const loip_session *s, int32_t seq) {
    return loip_kv_groups_held(s->kv, seq);
}

LOIP_API int loip_session_kv_lend(loip_session *s, int32_t seq, int32_t layer0, int32_t layer1, int32_t g0,
                                  int32_t n, void *buf, uint64_t cap, uint64_t *bytes) {
    return loip_kv_lend(s->kv, seq, layer0, layer1, g0, n, buf, cap, bytes);
}
LOIP_API int loip_session_kv_return(loip_session *s, int32_t seq, int32_t layer0, int32_t layer1, int32_t g0,
                                    int32_t n, const void *buf, uint64_t bytes) {
    return loip_kv_return(s->kv, seq, layer0, layer1, g0, n, buf, bytes);
}
LOIP_API int loip_session_kv_attach(loip_session *s, int32_t seq, int32_t layer0, int32_t layer1, int32_t g0,
                                    int32_t n, const void *buf, uint64_t bytes) {
    return loip_kv_attach(s->kv, seq, layer0, layer1, g0, n, buf, bytes);
}
LOIP_API int loip_session_kv_detach(loip_session *s, int32_t seq, int32_t layer0, int32_t layer1, int32_t g0,
                                    int32_t n) {
    return loip_kv_detach(s->kv, seq, layer0, layer1, g0, n);
}
LOIP_API int loip_session_kv_evict(loip_session *s, int32_t seq, int32_t positions) {
    return loip_kv_evict(s->kv, seq, positions);
}
LOIP_API int32_t loip_session_kv_evicted(const loip_session *s, int32_t seq) { return loip_kv_evicted(s->kv, seq); }

LOIP_API int loip_session_seq_share(loip_session *s, int32_t dst, int32_t src, int32_t n_positions) {
    return loip_kv_share(s->kv, dst, src, n_positions);
}
LOIP_API int loip_session_kv_hold(loip_session *s, int32_t seq, int32_t first, int32_t n, int32_t *ids) {
    return loip_kv_hold(s->kv, seq, first, n, ids);
}
LOIP_API int loip_session_kv_adopt(loip_session *s, int32_t seq, const int32_t *ids, int32_t n) {
    return loip_kv_adopt(s->kv, seq, ids, n);
}
LOIP_API int loip_session_kv_hold_window(loip_session *s, int32_t seq, int32_t i) {
    return loip_kv_hold_window(s->kv, seq, i);
}
LOIP_API int loip_session_kv_window_at(loip_session *s, int32_t seq, int32_t id, int32_t end) {
    return loip_kv_window_at(s->kv, seq, id, end);
}
LOIP_API uint64_t loip_session_kv_window_snapshot_bytes(const loip_session *s) { return s->kv->snap_bytes; }
LOIP_API int loip_session_kv_read_window(loip_session *s, int32_t id, void *buf, uint64_t cap, int32_t *end) {
    return loip_kv_read_window(s->kv, id, buf, cap, end);
}
LOIP_API int loip_session_kv_load_window(loip_session *s, int32_t id, int32_t end, const void *buf, uint64_t bytes) {
    return loip_kv_load_window(s->kv, id, end, buf, bytes);
}
LOIP_API int32_t loip_session_kv_window_end(const loip_session *s, int32_t id) {
    const loip_kv *kv = s->kv;
    return kv->win_snap && id >= 0 && id < kv->n_groups && kv->win_snap[id] ? kv->snap_end[id] : 0;
}
LOIP_API int loip_session_kv_drop(loip_session *s, int32_t id) { return loip_kv_drop(s->kv, id); }
LOIP_API int32_t loip_session_kv_refs(const loip_session *s, int32_t id) { return loip_kv_refs(s->kv, id); }
LOIP_API uint32_t loip_session_kv_gen(const loip_session *s, int32_t id) { return loip_kv_gen(s->kv, id); }
LOIP_API void loip_session_kv_share_stats(const loip_session *s, loip_kv_share_stats *st) {
    loip_kv_stats(s->kv, st);
}
LOIP_API int loip_session_kv_touch(loip_session *s, int32_t id) { return loip_kv_touch(s->kv, id); }
LOIP_API int loip_session_kv_read_group(loip_session *s, int32_t id, void *buf, uint64_t cap) {
    return loip_kv_read_group(s->kv, id, buf, cap);
}
LOIP_API int loip_session_kv_load_group(loip_session *s, const void *buf, uint64_t bytes, int32_t *id) {
    return loip_kv_load_group(s->kv, buf, bytes, id);
}
