/* The KV cache beyond the forward pass: lending (a stage's layers of a sequence's groups given
 * to another device and back, or read in place from a buffer) and eviction (the baselines'
 * evict-and-recompute). See loip.h (loip_session_kv_*) and docs/design.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/core.h"
#include "exec/kv_cache.h"
#include "memory/budget.h"

/* The pages wholly inside [p, p + bytes) given back to the kernel (their contents read as zero
 * when touched again): a chunk smaller than a page keeps its pages, and only its charge moves. */
static void drop_pages(void *p, size_t bytes) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + page - 1) & ~(page - 1), e = ((uintptr_t)p + bytes) & ~(page - 1);
    if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
}

/* The chunks of seq's groups [g0, g0 + n) of layers [layer0, layer1): checked, each call visiting them in
 * one order (layers, then groups); want_lent: whether each must be lent (return) or home (lend);
 * expect: the bytes a caller's buffer holds for them (UINT64_MAX: not checked). */
static int lend_range(const loip_kv *kv, const char *what, int32_t seq, int32_t layer0, int32_t layer1,
                      int32_t g0, int32_t n, int want_lent, uint64_t expect, uint64_t *bytes) {
    if (seq < 0 || seq >= kv->max_seqs)
        return loip_fail(LOIP_EINVAL, "%s: sequence %d out of range (%d sequences)", what, seq, kv->max_seqs);
    if (layer0 < 0 || layer1 > kv->n_layers || layer0 >= layer1)
        return loip_fail(LOIP_EINVAL, "%s: layers [%d, %d) out of range (%d layers)", what, layer0, layer1,
                         kv->n_layers);
    if (g0 < 0 || n < 0 || g0 + n > kv->blocks_per_seq)
        return loip_fail(LOIP_EINVAL, "%s: groups [%d, %d) out of range (%d per sequence)", what, g0, g0 + n,
                         kv->blocks_per_seq);
    const int32_t *table = &kv->block_table[(size_t)seq * kv->blocks_per_seq];
    uint64_t paged = 0; /* the range's layers in the pool: a ringed layer's window stays (kv_window.c) */
    for (int32_t l = layer0; l < layer1; l++) {
        if (kv->layer_slot[l] < 0 && kv->win_slot[l] >= 0) continue;
        if (kv->layer_slot[l] < 0) return loip_fail(LOIP_EINVAL, "%s: layer %d's KV cache is not kept here", what, l);
        paged++;
        for (int32_t i = g0; i < g0 + n; i++) {
            if (table[i] < 0)
                return loip_fail(LOIP_EINVAL, "%s: sequence %d holds no group for positions %d..%d", what, seq,
                                 i * kv->kv_block, (i + 1) * kv->kv_block - 1);
            if (!want_lent && kv->refs[table[i]] > 1)
                return loip_fail(LOIP_ESTATE, "%s: sequence %d's positions %d..%d are shared (with another sequence or "
                                 "the prompt cache): shared KV is not lent", what, seq, i * kv->kv_block,
                                 (i + 1) * kv->kv_block - 1);
            if (!!kv->lent[(size_t)table[i] * kv->n_kv_layers + kv->layer_slot[l]] != want_lent)
                return loip_fail(LOIP_ESTATE, "%s: layer %d of sequence %d's positions %d..%d is %s", what, l, seq,
                                 i * kv->kv_block, (i + 1) * kv->kv_block - 1, want_lent ? "here, not lent" : "lent already");
        }
    }
    *bytes = paged * (uint64_t)n * kv->chunk_bytes;
    if (expect != UINT64_MAX && expect != *bytes)
        return loip_fail(LOIP_EINVAL, "%s: %llu bytes for chunks of %llu", what, (unsigned long long)expect,
                         (unsigned long long)*bytes);
    return LOIP_OK;
}

int loip_kv_lend(loip_kv *kv, int32_t seq, int32_t layer0, int32_t layer1, int32_t g0,
                 int32_t n, void *buf, uint64_t cap, uint64_t *bytes) {
    uint64_t need;
    int rc = lend_range(kv, "KV lend", seq, layer0, layer1, g0, n, 0, UINT64_MAX, &need);
    if (rc) return rc;
    if (need > cap)
        return loip_fail(LOIP_EINVAL, "KV lend: %llu bytes into a buffer of %llu", (unsigned long long)need,
                         (unsigned long long)cap);
    const int32_t *table = &kv->block_table[(size_t)seq * kv->blocks_per_seq];
    size_t half = kv->chunk_bytes / 2;
    uint8_t *out = buf;
    for (int32_t l = layer0; l < layer1; l++) {
        int slot = kv->layer_slot[l];
        if (slot < 0) continue; /* ringed */
        for (int32_t i = g0; i < g0 + n; i++) {
            float *k = chunk_at(kv, kv->k_cache, slot, table[i]), *v = chunk_at(kv, kv->v_cache, slot, table[i]);
            memcpy(out, k, half), out += half;
            memcpy(out, v, half), out += half;
            drop_pages(k, half);
            drop_pages(v, half);
            kv->lent[(size_t)table[i] * kv->n_kv_layers + slot] = 1;
            kv->seq_lent[(size_t)seq * kv->n_kv_layers + slot]++;
        }
    }
    loip_kv_release(kv, need);
    *bytes = need;
    return LOIP_OK;
}

int loip_kv_return(loip_kv *kv, int32_t seq, int32_t layer0, int32_t layer1, int32_t g0,
                   int32_t n, const void *buf, uint64_t bytes) {
    uint64_t need;
    int rc = lend_range(kv, "KV return", seq, layer0, layer1, g0, n, 1, bytes, &need);
    if (rc) return rc;
    if ((rc = loip_kv_charge(kv, need))) {
        char why[400];
        snprintf(why, sizeof why, "%s", loip_last_error());
        return loip_fail(rc, "KV return: sequence %d's lent KV cannot come back: %s", seq, why);
    }
    const int32_t *table = &kv->block_table[(size_t)seq * kv->blocks_per_seq];
    size_t half = kv->chunk_bytes / 2;
    const uint8_t *in = buf;
    for (int32_t l = layer0; l < layer1; l++) {
        int slot = kv->layer_slot[l];
        if (slot < 0) continue; /* ringed */
        for (int32_t i = g0; i < g0 + n; i++) {
            size_t c = (size_t)table[i] * kv->n_kv_layers + slot;
            memcpy(chunk_at(kv, kv->k_cache, slot, table[i]), in, half), in += half;
            memcpy(chunk_at(kv, kv->v_cache, slot, table[i]), in, half), in += half;
            if (!kv->lent_at[c]) kv->seq_lent[(size_t)seq * kv->n_kv_layers + slot]--;
            kv->lent[c] = 0, kv->lent_at[c] = NULL;
        }
    }
    return LOIP_OK;
}

int loip_kv_attach(loip_kv *kv, int32_t seq, int32_t layer0, int32_t layer1, int32_t g0,
                   int32_t n, const void *buf, uint64_t bytes) {
    uint64_t need;
    int rc = lend_range(kv, "KV attach", seq, layer0, layer1, g0, n, 1, bytes, &need);
    if (rc) return rc;
    const int32_t *table = &kv->block_table[(size_t)seq * kv->blocks_per_seq];
    const uint8_t *in = buf;
    for (int32_t l = layer0; l < layer1; l++)
        for (int32_t i = g0; i < g0 + n && kv->layer_slot[l] >= 0; i++, in += kv->chunk_bytes) {
            size_t c = (size_t)table[i] * kv->n_kv_layers + kv->layer_slot[l];
            if (!kv->lent_at[c]) kv->seq_lent[(size_t)seq * kv->n_kv_layers + kv->layer_slot[l]]--;
            kv->lent_at[c] = in;
        }
    return LOIP_OK;
}

int loip_kv_detach(loip_kv *kv, int32_t seq, int32_t layer0, int32_t layer1, int32_t g0,
                   int32_t n) {
    uint64_t need;
    int rc = lend_range(kv, "KV detach", seq, layer0, layer1, g0, n, 1, UINT64_MAX, &need);
    if (rc) return rc;
    const int32_t *table = &kv->block_table[(size_t)seq * kv->blocks_per_seq];
    for (int32_t l = layer0; l < layer1; l++)
        for (int32_t i = g0; i < g0 + n && kv->layer_slot[l] >= 0; i++) {
            size_t c = (size_t)table[i] * kv->n_kv_layers + kv->layer_slot[l];
            if (kv->lent_at[c]) kv->seq_lent[(size_t)seq * kv->n_kv_layers + kv->layer_slot[l]]++;
            kv->lent_at[c] = NULL;
        }
    return LOIP_OK;
}

int32_t loip_kv_evicted(const loip_kv *kv, int32_t seq) {
    return seq >= 0 && seq < kv->max_seqs ? kv->evicted[seq] : 0;
}

int loip_kv_evict(loip_kv *kv, int32_t seq, int32_t positions) {
    if (seq < 0 || seq >= kv->max_seqs)
        return loip_fail(LOIP_EINVAL, "KV evict: sequence %d out of range (%d sequences)", seq, kv->max_seqs);
    if (positions < 0 || positions % kv->kv_block || positions > kv->max_ctx)
        return loip_fail(LOIP_EINVAL, "KV evict: %d positions (a multiple of %d, at most the context %d)", positions,
                         kv->kv_block, kv->max_ctx);
    if (positions < kv->evicted[seq])
        return loip_fail(LOIP_EINVAL, "KV evict: sequence %d has evicted %d positions already (%d asked): evicted "
                         "positions stay evicted until the sequence ends", seq, kv->evicted[seq], positions);
    int32_t *table = &kv->block_table[(size_t)seq * kv->blocks_per_seq];
    for (int32_t i = kv->evicted[seq] / kv->kv_block; i < positions / kv->kv_block; i++)
        if (table[i] >= 0) {
            loip_kv_release_group(kv, seq, table[i]);
            table[i] = -1;
        }
    kv->evicted[seq] = positions;
    return LOIP_OK;
}
