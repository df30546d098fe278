/* The session's KV cache beyond the forward pass: lending (a stage's layers of a sequence's
 * groups given to another device and back, or read in place from a buffer) and eviction (the
 * baselines' evict-and-recompute). See loip.h (loip_session_kv_*) and docs/design.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/core.h"
#include "exec/model.h"
#include "exec/session.h"
#include "memory/budget.h"

/* Group g of seq back to the free list: its charge released, less its chunks lent away (their
 * charge went with them), and their lending forgotten (the borrower's copy is stale now). */
void loip_session_release_group(loip_session *s, int32_t seq, int32_t g) {
    if (s->refs[g] > 1) { /* shared: only this table's reference goes (its chunks are never lent) */
        loip_session_unref_group(s, g);
        return;
    }
    s->refs[g] = 0, s->holds[g] = 0, s->gen[g]++;
    uint64_t bytes = s->group_bytes;
    for (int32_t k = 0; k < s->n_kv_layers; k++) {
        size_t c = (size_t)g * s->n_kv_layers + k;
        if (s->lent[c]) {
            bytes -= s->chunk_bytes;
            if (!s->lent_at[c]) s->seq_lent[(size_t)seq * s->n_kv_layers + k]--;
            s->lent[c] = 0, s->lent_at[c] = NULL;
        }
    }
    s->free_groups[s->n_free++] = g;
    loip_session_kv_release(s, bytes);
}

LOIP_API uint64_t loip_session_kv_chunk_bytes(const loip_session *s) { return s->chunk_bytes; }

/* The pages wholly inside [p, p + bytes) given back to the kernel (their contents read as zero
 * when touched again): a chunk smaller than a page keeps its pages, and only its charge moves. */
static void drop_pages(void *p, size_t bytes) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + page - 1) & ~(page - 1), e = ((uintptr_t)p + bytes) & ~(page - 1);
    if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
}

/* The chunks of seq's groups [g0, g0 + n) of layers [layer0, layer1): checked, each call visiting them in
 * one order (layers, then groups); want_lent: whether each must be lent (return) or home (lend);
 * expect: the bytes a caller's buffer holds for them (UINT64_MAX: not checked). */
static int lend_range(const loip_session *s, const char *what, int32_t seq, int32_t layer0, int32_t layer1,
                      int32_t g0, int32_t n, int want_lent, uint64_t expect, uint64_t *bytes) {
    if (seq < 0 || seq >= s->max_seqs)
        return loip_fail(LOIP_EINVAL, "%s: sequence %d out of range (%d sequences)", what, seq, s->max_seqs);
    if (layer0 < 0 || layer1 > s->m->cfg.n_layers || layer0 >= layer1)
        return loip_fail(LOIP_EINVAL, "%s: layers [%d, %d) out of range (%d layers)", what, layer0, layer1,
                         s->m->cfg.n_layers);
    if (g0 < 0 || n < 0 || g0 + n > s->blocks_per_seq)
        return loip_fail(LOIP_EINVAL, "%s: groups [%d, %d) out of range (%d per sequence)", what, g0, g0 + n,
                         s->blocks_per_seq);
    const int32_t *table = &s->block_table[(size_t)seq * s->blocks_per_seq];
    for (int32_t l = layer0; l < layer1; l++) {
        if (s->layer_slot[l] < 0) return loip_fail(LOIP_EINVAL, "%s: layer %d's KV cache is not kept here", what, l);
        for (int32_t i = g0; i < g0 + n; i++) {
            if (table[i] < 0)
                return loip_fail(LOIP_EINVAL, "%s: sequence %d holds no group for positions %d..%d", what, seq,
                                 i * s->kv_block, (i + 1) * s->kv_block - 1);
            if (!want_lent && s->refs[table[i]] > 1)
                return loip_fail(LOIP_ESTATE, "%s: sequence %d's positions %d..%d are shared (with another sequence or "
                                 "the prompt cache): shared KV is not lent", what, seq, i * s->kv_block,
                                 (i + 1) * s->kv_block - 1);
            if (!!s->lent[(size_t)table[i] * s->n_kv_layers + s->layer_slot[l]] != want_lent)
                return loip_fail(LOIP_ESTATE, "%s: layer %d of sequence %d's positions %d..%d is %s", what, l, seq,
                                 i * s->kv_block, (i + 1) * s->kv_block - 1, want_lent ? "here, not lent" : "lent already");
        }
    }
    *bytes = (uint64_t)(layer1 - layer0) * (uint64_t)n * s->chunk_bytes;
    if (expect != UINT64_MAX && expect != *bytes)
        return loip_fail(LOIP_EINVAL, "%s: %llu bytes for chunks of %llu", what, (unsigned long long)expect,
                         (unsigned long long)*bytes);
    return LOIP_OK;
}

LOIP_API int loip_session_kv_lend(loip_session *s, int32_t seq, int32_t layer0, int32_t layer1, int32_t g0,
                                  int32_t n, void *buf, uint64_t cap, uint64_t *bytes) {
    uint64_t need;
    int rc = lend_range(s, "KV lend", seq, layer0, layer1, g0, n, 0, UINT64_MAX, &need);
    if (rc) return rc;
    if (need > cap)
        return loip_fail(LOIP_EINVAL, "KV lend: %llu bytes into a buffer of %llu", (unsigned long long)need,
                         (unsigned long long)cap);
    const int32_t *table = &s->block_table[(size_t)seq * s->blocks_per_seq];
    size_t half = s->chunk_bytes / 2;
    uint8_t *out = buf;
    for (int32_t l = layer0; l < layer1; l++) {
        int slot = s->layer_slot[l];
        for (int32_t i = g0; i < g0 + n; i++) {
            float *k = chunk_at(s, s->k_cache, slot, table[i]), *v = chunk_at(s, s->v_cache, slot, table[i]);
            memcpy(out, k, half), out += half;
            memcpy(out, v, half), out += half;
            drop_pages(k, half);
            drop_pages(v, half);
            s->lent[(size_t)table[i] * s->n_kv_layers + slot] = 1;
            s->seq_lent[(size_t)seq * s->n_kv_layers + slot]++;
        }
    }
    loip_session_kv_release(s, need);
    *bytes = need;
    return LOIP_OK;
}

LOIP_API int loip_session_kv_return(loip_session *s, int32_t seq, int32_t layer0, int32_t layer1, int32_t g0,
                                    int32_t n, const void *buf, uint64_t bytes) {
    uint64_t need;
    int rc = lend_range(s, "KV return", seq, layer0, layer1, g0, n, 1, bytes, &need);
    if (rc) return rc;
    if ((rc = loip_session_kv_charge(s, need))) {
        char why[400];
        snprintf(why, sizeof why, "%s", loip_last_error());
        return loip_fail(rc, "KV return: sequence %d's lent KV cannot come back: %s", seq, why);
    }
    const int32_t *table = &s->block_table[(size_t)seq * s->blocks_per_seq];
    size_t half = s->chunk_bytes / 2;
    const uint8_t *in = buf;
    for (int32_t l = layer0; l < layer1; l++) {
        int slot = s->layer_slot[l];
        for (int32_t i = g0; i < g0 + n; i++) {
            size_t c = (size_t)table[i] * s->n_kv_layers + slot;
            memcpy(chunk_at(s, s->k_cache, slot, table[i]), in, half), in += half;
            memcpy(chunk_at(s, s->v_cache, slot, table[i]), in, half), in += half;
            if (!s->lent_at[c]) s->seq_lent[(size_t)seq * s->n_kv_layers + slot]--;
            s->lent[c] = 0, s->lent_at[c] = NULL;
        }
    }
    return LOIP_OK;
}

LOIP_API int loip_session_kv_attach(loip_session *s, int32_t seq, int32_t layer0, int32_t layer1, int32_t g0,
                                    int32_t n, const void *buf, uint64_t bytes) {
    uint64_t need;
    int rc = lend_range(s, "KV attach", seq, layer0, layer1, g0, n, 1, bytes, &need);
    if (rc) return rc;
    const int32_t *table = &s->block_table[(size_t)seq * s->blocks_per_seq];
    const uint8_t *in = buf;
    for (int32_t l = layer0; l < layer1; l++)
        for (int32_t i = g0; i < g0 + n; i++, in += s->chunk_bytes) {
            size_t c = (size_t)table[i] * s->n_kv_layers + s->layer_slot[l];
            if (!s->lent_at[c]) s->seq_lent[(size_t)seq * s->n_kv_layers + s->layer_slot[l]]--;
            s->lent_at[c] = in;
        }
    return LOIP_OK;
}

LOIP_API int loip_session_kv_detach(loip_session *s, int32_t seq, int32_t layer0, int32_t layer1, int32_t g0,
                                    int32_t n) {
    uint64_t need;
    int rc = lend_range(s, "KV detach", seq, layer0, layer1, g0, n, 1, UINT64_MAX, &need);
    if (rc) return rc;
    const int32_t *table = &s->block_table[(size_t)seq * s->blocks_per_seq];
    for (int32_t l = layer0; l < layer1; l++)
        for (int32_t i = g0; i < g0 + n; i++) {
            size_t c = (size_t)table[i] * s->n_kv_layers + s->layer_slot[l];
            if (s->lent_at[c]) s->seq_lent[(size_t)seq * s->n_kv_layers + s->layer_slot[l]]++;
            s->lent_at[c] = NULL;
        }
    return LOIP_OK;
}

LOIP_API int32_t loip_session_kv_groups_held(const loip_session *s, int32_t seq) {
    if (seq < 0 || seq >= s->max_seqs) return 0;
    const int32_t *table = &s->block_table[(size_t)seq * s->blocks_per_seq];
    int32_t k = 0;
    for (int32_t i = 0; i < s->blocks_per_seq; i++) k += table[i] >= 0;
    return k;
}

LOIP_API int32_t loip_session_kv_evicted(const loip_session *s, int32_t seq) {
    return seq >= 0 && seq < s->max_seqs ? s->evicted[seq] : 0;
}

LOIP_API int loip_session_kv_evict(loip_session *s, int32_t seq, int32_t positions) {
    if (seq < 0 || seq >= s->max_seqs)
        return loip_fail(LOIP_EINVAL, "KV evict: sequence %d out of range (%d sequences)", seq, s->max_seqs);
    if (positions < 0 || positions % s->kv_block || positions > s->max_ctx)
        return loip_fail(LOIP_EINVAL, "KV evict: %d positions (a multiple of %d, at most the context %d)", positions,
                         s->kv_block, s->max_ctx);
    if (positions < s->evicted[seq])
        return loip_fail(LOIP_EINVAL, "KV evict: sequence %d has evicted %d positions already (%d asked): evicted "
                         "positions stay evicted until the sequence ends", seq, s->evicted[seq], positions);
    int32_t *table = &s->block_table[(size_t)seq * s->blocks_per_seq];
    for (int32_t i = s->evicted[seq] / s->kv_block; i < positions / s->kv_block; i++)
        if (table[i] >= 0) {
            loip_session_release_group(s, seq, table[i]);
            table[i] = -1;
        }
    s->evicted[seq] = positions;
    return LOIP_OK;
}
