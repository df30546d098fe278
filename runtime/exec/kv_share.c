/* KV groups shared between sequences and held by the prompt cache: reference counts,
 * copy-on-write, holds outside any sequence and their eviction. See loip.h
 * (loip_session_seq_share, loip_session_kv_hold/_adopt/_drop) and docs/prefix-cache.md.
 *
 * A group's refs count the block tables naming it plus the cache's holds; a group named more
 * than once is read by all and written by none: the first write into it by a sequence copies it
 * (loip_kv_own_group), so a shared full group is never written and a shared partial one is
 * copied once per writer. A group only the cache holds is charged to "prompt_cache" (growing
 * caches) and is the first to go when a sequence needs a group: the least recently held or
 * adopted such group is evicted (its holds forgotten, gen bumped) before a plan's need fails. */
#include <stdio.h>
#include <string.h>

#include "core/core.h"
#include "exec/kv_cache.h"
#include "memory/budget.h"

static int cache_only(const loip_kv *kv, int32_t g) { return kv->holds[g] > 0 && kv->refs[g] == kv->holds[g]; }

/* A group's charge between "kv" (some sequence names it) and "prompt_cache" (only the cache
 * holds it): same bytes, so the budget's total does not change. */
static void charge_to_cache(loip_kv *kv, int to_cache) {
    if (!kv->grows || !kv->budget) return;
    uint64_t b = kv->group_bytes;
    if (to_cache) {
        if (loip_budget_move(kv->budget, "kv", "prompt_cache", b) == 0) kv->charged -= b, kv->cache_charged += b;
    } else if (loip_budget_move(kv->budget, "prompt_cache", "kv", b) == 0) {
        kv->cache_charged -= b, kv->charged += b;
    }
}

void loip_kv_unref_group(loip_kv *kv, int32_t g) {
    kv->refs[g]--;
    if (cache_only(kv, g)) charge_to_cache(kv, 1);
}

int loip_kv_evict_held(loip_kv *kv, int with_window) {
    int32_t best = -1;
    for (int32_t g = 0; g < kv->n_groups; g++)
        if (cache_only(kv, g) && (!with_window || kv->win_snap[g]) && (best < 0 || kv->tick[g] < kv->tick[best])) best = g;
    if (best < 0) return 0;
    loip_kv_snap_free(kv, best);
    kv->refs[best] = 0, kv->holds[best] = 0, kv->gen[best]++;
    kv->free_groups[kv->n_free++] = best;
    if (kv->grows && kv->budget) {
        loip_budget_release(kv->budget, "prompt_cache", kv->group_bytes);
        kv->cache_charged -= kv->group_bytes;
    }
    kv->cache_evictions++;
    return 1;
}

int loip_kv_take_group(loip_kv *kv, int32_t seq, int32_t pos, int32_t *out) {
    char who[64] = "the prompt cache's disk tier"; /* seq < 0: loip_kv_load_group */
    if (seq >= 0) snprintf(who, sizeof who, "sequence %d at position %d", seq, pos);
    while (kv->n_free == 0)
        if (!loip_kv_evict_held(kv, 0))
            return loip_fail(LOIP_ENOMEM, "KV cache full: %s needs a block and all %d (%d tokens) are in use", who,
                             kv->n_groups, kv->n_groups * kv->kv_block);
    int rc;
    while ((rc = loip_kv_charge(kv, kv->group_bytes)) != 0)
        if (!loip_kv_evict_held(kv, 0)) {
            char why[400];
            snprintf(why, sizeof why, "%s", loip_last_error());
            return loip_fail(rc, "KV cache: %s: %s", who, why);
        }
    int32_t g = kv->free_groups[--kv->n_free];
    kv->refs[g] = 1, kv->holds[g] = 0;
    *out = g;
    return LOIP_OK;
}

int loip_kv_own_group(loip_kv *kv, int32_t seq, int32_t pos) {
    int32_t *slot = &kv->block_table[(size_t)seq * kv->blocks_per_seq + pos / kv->kv_block], old = *slot, g;
    if (old < 0 || kv->refs[old] <= 1) return LOIP_OK;
    int rc = loip_kv_take_group(kv, seq, pos, &g);
    if (rc) return rc;
    size_t rows = (size_t)kv->kv_block * kv->kv_dim * sizeof(float);
    for (int32_t k = 0; k < kv->n_kv_layers; k++) { /* every kept layer's rows, bit for bit */
        memcpy(chunk_at(kv, kv->k_cache, k, g), chunk_at(kv, kv->k_cache, k, old), rows);
        memcpy(chunk_at(kv, kv->v_cache, k, g), chunk_at(kv, kv->v_cache, k, old), rows);
    }
    *slot = g;
    loip_kv_unref_group(kv, old);
    kv->cow_copies++;
    return LOIP_OK;
}

static int check_seq(const loip_kv *kv, const char *what, int32_t seq) {
    if (seq < 0 || seq >= kv->max_seqs)
        return loip_fail(LOIP_EINVAL, "%s: sequence %d out of range (%d sequences)", what, seq, kv->max_seqs);
    return LOIP_OK;
}

/* seq holds no group and evicts nothing: what a sequence taking others' groups must be */
static int check_empty(const loip_kv *kv, const char *what, int32_t seq) {
    int rc = check_seq(kv, what, seq);
    if (rc) return rc;
    if (loip_kv_groups_held(kv, seq) || kv->evicted[seq])
        return loip_fail(LOIP_ESTATE, "%s: sequence %d holds KV already (free it first)", what, seq);
    return LOIP_OK;
}

/* group i of seq exists, is here (not lent) and may be named once more */
static int check_shareable(const loip_kv *kv, const char *what, int32_t seq, int32_t i) {
    int32_t g = kv->block_table[(size_t)seq * kv->blocks_per_seq + i];
    if (g < 0)
        return loip_fail(LOIP_EINVAL, "%s: sequence %d holds no group for positions %d..%d", what, seq,
                         i * kv->kv_block, (i + 1) * kv->kv_block - 1);
    for (int32_t k = 0; k < kv->n_kv_layers; k++)
        if (kv->lent[(size_t)g * kv->n_kv_layers + k])
            return loip_fail(LOIP_ESTATE, "%s: sequence %d's positions %d..%d are lent to another device: lent KV is "
                             "not shared", what, seq, i * kv->kv_block, (i + 1) * kv->kv_block - 1);
    return LOIP_OK;
}

int loip_kv_share(loip_kv *kv, int32_t dst, int32_t src, int32_t n_positions) {
    int rc = check_empty(kv, "KV share", dst);
    if (rc || (rc = check_seq(kv, "KV share", src))) return rc;
    if (dst == src) return loip_fail(LOIP_EINVAL, "KV share: sequence %d with itself", src);
    if (n_positions < 0 || n_positions > kv->max_ctx)
        return loip_fail(LOIP_EINVAL, "KV share: %d positions (the context holds %d)", n_positions, kv->max_ctx);
    int32_t n = (n_positions + kv->kv_block - 1) / kv->kv_block;
    if (n_positions > 0 && kv->evicted[src] > 0)
        return loip_fail(LOIP_ESTATE, "KV share: sequence %d evicted its first %d positions", src, kv->evicted[src]);
    for (int32_t i = 0; i < n; i++)
        if ((rc = check_shareable(kv, "KV share", src, i))) return rc;
    if ((rc = loip_kv_share_rings(kv, dst, src, n_positions))) return rc;
    const int32_t *from = &kv->block_table[(size_t)src * kv->blocks_per_seq];
    int32_t *to = &kv->block_table[(size_t)dst * kv->blocks_per_seq];
    for (int32_t i = 0; i < n; i++) to[i] = from[i], kv->refs[from[i]]++;
    return LOIP_OK;
}

int loip_kv_hold(loip_kv *kv, int32_t seq, int32_t first, int32_t n, int32_t *ids) {
    int rc = check_seq(kv, "KV hold", seq);
    if (rc) return rc;
    if (first < 0 || n < 0 || first + n > kv->blocks_per_seq)
        return loip_fail(LOIP_EINVAL, "KV hold: groups [%d, %d) out of range (%d per sequence)", first, first + n,
                         kv->blocks_per_seq);
    if (first < kv->evicted[seq] / kv->kv_block && n > 0)
        return loip_fail(LOIP_ESTATE, "KV hold: sequence %d evicted its first %d positions", seq, kv->evicted[seq]);
    for (int32_t i = first; i < first + n; i++)
        if ((rc = check_shareable(kv, "KV hold", seq, i))) return rc;
    const int32_t *table = &kv->block_table[(size_t)seq * kv->blocks_per_seq];
    for (int32_t i = 0; i < n; i++) {
        int32_t g = table[first + i];
        kv->refs[g]++, kv->holds[g]++, kv->tick[g] = ++kv->ticks;
        ids[i] = g;
    }
    return LOIP_OK;
}

/* group id exists and the cache holds it */
static int check_held(const loip_kv *kv, const char *what, int32_t id) {
    if (id < 0 || id >= kv->n_groups)
        return loip_fail(LOIP_EINVAL, "%s: group %d out of range (%d groups)", what, id, kv->n_groups);
    if (kv->holds[id] <= 0) return loip_fail(LOIP_ESTATE, "%s: group %d is not held", what, id);
    return LOIP_OK;
}

int loip_kv_adopt(loip_kv *kv, int32_t seq, const int32_t *ids, int32_t n) {
    int rc = check_empty(kv, "KV adopt", seq);
    if (rc) return rc;
    if (n < 0 || n > kv->blocks_per_seq)
        return loip_fail(LOIP_EINVAL, "KV adopt: %d groups (a sequence has %d)", n, kv->blocks_per_seq);
    for (int32_t i = 0; i < n; i++)
        if ((rc = check_held(kv, "KV adopt", ids[i]))) return rc;
    /* ringed layers: seq's rings from the last group's snapshot (refused before a group is named) */
    if (n > 0 && (rc = loip_kv_adopt_window(kv, seq, ids[n - 1], n * kv->kv_block))) return rc;
    int32_t *table = &kv->block_table[(size_t)seq * kv->blocks_per_seq];
    for (int32_t i = 0; i < n; i++) {
        int32_t g = ids[i];
        if (cache_only(kv, g)) charge_to_cache(kv, 0);
        table[i] = g, kv->refs[g]++, kv->tick[g] = ++kv->ticks;
    }
    return LOIP_OK;
}

int loip_kv_drop(loip_kv *kv, int32_t id) {
    int rc = check_held(kv, "KV drop", id);
    if (rc) return rc;
    if (cache_only(kv, id)) { /* the cache alone: one hold less, the group back to the pool at none */
        if (kv->holds[id] > 1) {
            kv->holds[id]--, kv->refs[id]--;
            return LOIP_OK;
        }
        loip_kv_snap_free(kv, id);
        kv->holds[id] = 0, kv->refs[id] = 0, kv->gen[id]++;
        kv->free_groups[kv->n_free++] = id;
        if (kv->grows && kv->budget) {
            loip_budget_release(kv->budget, "prompt_cache", kv->group_bytes);
            kv->cache_charged -= kv->group_bytes;
        }
        return LOIP_OK;
    }
    if (--kv->holds[id] == 0) loip_kv_snap_free(kv, id); /* (a sequence's alone now: no window carried) */
    loip_kv_unref_group(kv, id);
    return LOIP_OK;
}

int32_t loip_kv_refs(const loip_kv *kv, int32_t id) {
    return id >= 0 && id < kv->n_groups ? kv->refs[id] : -1;
}

uint32_t loip_kv_gen(const loip_kv *kv, int32_t id) {
    return id >= 0 && id < kv->n_groups ? kv->gen[id] : 0;
}

void loip_kv_stats(const loip_kv *kv, loip_kv_share_stats *st) {
    memset(st, 0, sizeof *st);
    for (int32_t g = 0; g < kv->n_groups; g++) {
        if (cache_only(kv, g)) st->cache_groups++;
        else if (kv->holds[g] > 0) st->cache_shared_groups++;
        if (kv->refs[g] > 1 && kv->refs[g] > kv->holds[g]) st->shared_groups++;
    }
    st->window_snapshots = kv->n_snaps;
    st->cache_bytes = (uint64_t)st->cache_groups * kv->group_bytes + (uint64_t)kv->n_snaps * kv->snap_bytes;
    st->cache_charged = kv->cache_charged;
    st->evictions = kv->cache_evictions;
    st->cow_copies = kv->cow_copies;
    st->free_groups = kv->n_free;
    st->n_groups = kv->n_groups;
}

/* ---- the disk tier's copies (loip.engine.request.prefix_disk) ------------------------------------- */

int loip_kv_touch(loip_kv *kv, int32_t id) {
    int rc = check_held(kv, "KV touch", id);
    if (rc) return rc;
    kv->tick[id] = ++kv->ticks;
    return LOIP_OK;
}

/* group g's rows: per kept layer (in order) K then V, chunk_bytes / 2 each */
static void copy_group(loip_kv *kv, int32_t g, uint8_t *out, const uint8_t *in) {
    size_t half = kv->chunk_bytes / 2;
    for (int32_t k = 0; k < kv->n_kv_layers; k++) {
        float *kc = chunk_at(kv, kv->k_cache, k, g), *vc = chunk_at(kv, kv->v_cache, k, g);
        if (out) memcpy(out, kc, half), memcpy(out + half, vc, half), out += 2 * half;
        else memcpy(kc, in, half), memcpy(vc, in + half, half), in += 2 * half;
    }
}

int loip_kv_read_group(loip_kv *kv, int32_t id, void *buf, uint64_t cap) {
    int rc = check_held(kv, "KV read", id);
    if (rc) return rc;
    if (cap < kv->group_bytes)
        return loip_fail(LOIP_EINVAL, "KV read: a group is %llu bytes, the buffer %llu", (unsigned long long)kv->group_bytes,
                         (unsigned long long)cap);
    copy_group(kv, id, buf, NULL);
    return LOIP_OK;
}

int loip_kv_load_group(loip_kv *kv, const void *buf, uint64_t bytes, int32_t *id) {
    if (bytes != kv->group_bytes)
        return loip_fail(LOIP_EINVAL, "KV load: %llu bytes for a group of %llu", (unsigned long long)bytes,
                         (unsigned long long)kv->group_bytes);
    int32_t g;
    int rc = loip_kv_take_group(kv, -1, -1, &g);
    if (rc) return rc;
    copy_group(kv, g, NULL, buf);
    kv->holds[g] = 1, kv->tick[g] = ++kv->ticks; /* refs 1: the cache's hold alone */
    charge_to_cache(kv, 1);
    *id = g;
    return LOIP_OK;
}
