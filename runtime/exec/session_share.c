/* KV groups shared between sequences and held by the prompt cache: reference counts,
 * copy-on-write, holds outside any sequence and their eviction. See loip.h
 * (loip_session_seq_share, loip_session_kv_hold/_adopt/_drop) and docs/prefix-cache.md.
 *
 * A group's refs count the block tables naming it plus the cache's holds; a group named more
 * than once is read by all and written by none: the first write into it by a sequence copies it
 * (loip_session_own_group), so a shared full group is never written and a shared partial one is
 * copied once per writer. A group only the cache holds is charged to "prompt_cache" (growing
 * sessions) and is the first to go when a sequence needs a group: the least recently held or
 * adopted such group is evicted (its holds forgotten, gen bumped) before a plan's need fails. */
#include <stdio.h>
#include <string.h>

#include "core/core.h"
#include "exec/session.h"
#include "memory/budget.h"

static int cache_only(const loip_session *s, int32_t g) { return s->holds[g] > 0 && s->refs[g] == s->holds[g]; }

/* A group's charge between "kv" (some sequence names it) and "prompt_cache" (only the cache
 * holds it): same bytes, so the budget's total does not change. */
static void charge_to_cache(loip_session *s, int to_cache) {
    if (!s->kv_grows || !s->budget) return;
    uint64_t b = s->group_bytes;
    if (to_cache) {
        if (loip_budget_move(s->budget, "kv", "prompt_cache", b) == 0) s->kv_charged -= b, s->cache_charged += b;
    } else if (loip_budget_move(s->budget, "prompt_cache", "kv", b) == 0) {
        s->cache_charged -= b, s->kv_charged += b;
    }
}

void loip_session_unref_group(loip_session *s, int32_t g) {
    s->refs[g]--;
    if (cache_only(s, g)) charge_to_cache(s, 1);
}

/* The least recently used group only the cache holds back to the free list; 0: none. */
static int evict_one(loip_session *s) {
    int32_t best = -1;
    for (int32_t g = 0; g < s->n_groups; g++)
        if (cache_only(s, g) && (best < 0 || s->tick[g] < s->tick[best])) best = g;
    if (best < 0) return 0;
    s->refs[best] = 0, s->holds[best] = 0, s->gen[best]++;
    s->free_groups[s->n_free++] = best;
    if (s->kv_grows && s->budget) {
        loip_budget_release(s->budget, "prompt_cache", s->group_bytes);
        s->cache_charged -= s->group_bytes;
    }
    s->cache_evictions++;
    return 1;
}

int loip_session_take_group(loip_session *s, int32_t seq, int32_t pos, int32_t *out) {
    char who[64] = "the prompt cache's disk tier"; /* seq < 0: loip_session_kv_load_group */
    if (seq >= 0) snprintf(who, sizeof who, "sequence %d at position %d", seq, pos);
    while (s->n_free == 0)
        if (!evict_one(s))
            return loip_fail(LOIP_ENOMEM, "KV cache full: %s needs a block and all %d (%d tokens) are in use", who,
                             s->n_groups, s->n_groups * s->kv_block);
    int rc;
    while ((rc = loip_session_kv_charge(s, s->group_bytes)) != 0)
        if (!evict_one(s)) {
            char why[400];
            snprintf(why, sizeof why, "%s", loip_last_error());
            return loip_fail(rc, "KV cache: %s: %s", who, why);
        }
    int32_t g = s->free_groups[--s->n_free];
    s->refs[g] = 1, s->holds[g] = 0;
    *out = g;
    return LOIP_OK;
}

int loip_session_own_group(loip_session *s, int32_t seq, int32_t pos) {
    int32_t *slot = &s->block_table[(size_t)seq * s->blocks_per_seq + pos / s->kv_block], old = *slot, g;
    if (old < 0 || s->refs[old] <= 1) return LOIP_OK;
    int rc = loip_session_take_group(s, seq, pos, &g);
    if (rc) return rc;
    size_t rows = (size_t)s->kv_block * s->kv_dim * sizeof(float);
    for (int32_t k = 0; k < s->n_kv_layers; k++) { /* every kept layer's rows, bit for bit */
        memcpy(chunk_at(s, s->k_cache, k, g), chunk_at(s, s->k_cache, k, old), rows);
        memcpy(chunk_at(s, s->v_cache, k, g), chunk_at(s, s->v_cache, k, old), rows);
    }
    *slot = g;
    loip_session_unref_group(s, old);
    s->cow_copies++;
    return LOIP_OK;
}

static int check_seq(const loip_session *s, const char *what, int32_t seq) {
    if (seq < 0 || seq >= s->max_seqs)
        return loip_fail(LOIP_EINVAL, "%s: sequence %d out of range (%d sequences)", what, seq, s->max_seqs);
    return LOIP_OK;
}

/* seq holds no group and evicts nothing: what a sequence taking others' groups must be */
static int check_empty(const loip_session *s, const char *what, int32_t seq) {
    int rc = check_seq(s, what, seq);
    if (rc) return rc;
    if (loip_session_kv_groups_held(s, seq) || s->evicted[seq])
        return loip_fail(LOIP_ESTATE, "%s: sequence %d holds KV already (free it first)", what, seq);
    return LOIP_OK;
}

/* group i of seq exists, is here (not lent) and may be named once more */
static int check_shareable(const loip_session *s, const char *what, int32_t seq, int32_t i) {
    int32_t g = s->block_table[(size_t)seq * s->blocks_per_seq + i];
    if (g < 0)
        return loip_fail(LOIP_EINVAL, "%s: sequence %d holds no group for positions %d..%d", what, seq,
                         i * s->kv_block, (i + 1) * s->kv_block - 1);
    for (int32_t k = 0; k < s->n_kv_layers; k++)
        if (s->lent[(size_t)g * s->n_kv_layers + k])
            return loip_fail(LOIP_ESTATE, "%s: sequence %d's positions %d..%d are lent to another device: lent KV is "
                             "not shared", what, seq, i * s->kv_block, (i + 1) * s->kv_block - 1);
    return LOIP_OK;
}

LOIP_API int loip_session_seq_share(loip_session *s, int32_t dst, int32_t src, int32_t n_positions) {
    int rc = check_empty(s, "KV share", dst);
    if (rc || (rc = check_seq(s, "KV share", src))) return rc;
    if (dst == src) return loip_fail(LOIP_EINVAL, "KV share: sequence %d with itself", src);
    if (n_positions < 0 || n_positions > s->max_ctx)
        return loip_fail(LOIP_EINVAL, "KV share: %d positions (the context holds %d)", n_positions, s->max_ctx);
    int32_t n = (n_positions + s->kv_block - 1) / s->kv_block;
    if (n_positions > 0 && s->evicted[src] > 0)
        return loip_fail(LOIP_ESTATE, "KV share: sequence %d evicted its first %d positions", src, s->evicted[src]);
    for (int32_t i = 0; i < n; i++)
        if ((rc = check_shareable(s, "KV share", src, i))) return rc;
    const int32_t *from = &s->block_table[(size_t)src * s->blocks_per_seq];
    int32_t *to = &s->block_table[(size_t)dst * s->blocks_per_seq];
    for (int32_t i = 0; i < n; i++) to[i] = from[i], s->refs[from[i]]++;
    return LOIP_OK;
}

LOIP_API int loip_session_kv_hold(loip_session *s, int32_t seq, int32_t first, int32_t n, int32_t *ids) {
    int rc = check_seq(s, "KV hold", seq);
    if (rc) return rc;
    if (first < 0 || n < 0 || first + n > s->blocks_per_seq)
        return loip_fail(LOIP_EINVAL, "KV hold: groups [%d, %d) out of range (%d per sequence)", first, first + n,
                         s->blocks_per_seq);
    if (first < s->evicted[seq] / s->kv_block && n > 0)
        return loip_fail(LOIP_ESTATE, "KV hold: sequence %d evicted its first %d positions", seq, s->evicted[seq]);
    for (int32_t i = first; i < first + n; i++)
        if ((rc = check_shareable(s, "KV hold", seq, i))) return rc;
    const int32_t *table = &s->block_table[(size_t)seq * s->blocks_per_seq];
    for (int32_t i = 0; i < n; i++) {
        int32_t g = table[first + i];
        s->refs[g]++, s->holds[g]++, s->tick[g] = ++s->ticks;
        ids[i] = g;
    }
    return LOIP_OK;
}

/* group id exists and the cache holds it */
static int check_held(const loip_session *s, const char *what, int32_t id) {
    if (id < 0 || id >= s->n_groups)
        return loip_fail(LOIP_EINVAL, "%s: group %d out of range (%d groups)", what, id, s->n_groups);
    if (s->holds[id] <= 0) return loip_fail(LOIP_ESTATE, "%s: group %d is not held", what, id);
    return LOIP_OK;
}

LOIP_API int loip_session_kv_adopt(loip_session *s, int32_t seq, const int32_t *ids, int32_t n) {
    int rc = check_empty(s, "KV adopt", seq);
    if (rc) return rc;
    if (n < 0 || n > s->blocks_per_seq)
        return loip_fail(LOIP_EINVAL, "KV adopt: %d groups (a sequence has %d)", n, s->blocks_per_seq);
    for (int32_t i = 0; i < n; i++)
        if ((rc = check_held(s, "KV adopt", ids[i]))) return rc;
    int32_t *table = &s->block_table[(size_t)seq * s->blocks_per_seq];
    for (int32_t i = 0; i < n; i++) {
        int32_t g = ids[i];
        if (cache_only(s, g)) charge_to_cache(s, 0);
        table[i] = g, s->refs[g]++, s->tick[g] = ++s->ticks;
    }
    return LOIP_OK;
}

LOIP_API int loip_session_kv_drop(loip_session *s, int32_t id) {
    int rc = check_held(s, "KV drop", id);
    if (rc) return rc;
    if (cache_only(s, id)) { /* the cache alone: one hold less, the group back to the pool at none */
        if (s->holds[id] > 1) {
            s->holds[id]--, s->refs[id]--;
            return LOIP_OK;
        }
        s->holds[id] = 0, s->refs[id] = 0, s->gen[id]++;
        s->free_groups[s->n_free++] = id;
        if (s->kv_grows && s->budget) {
            loip_budget_release(s->budget, "prompt_cache", s->group_bytes);
            s->cache_charged -= s->group_bytes;
        }
        return LOIP_OK;
    }
    s->holds[id]--;
    loip_session_unref_group(s, id);
    return LOIP_OK;
}

LOIP_API int32_t loip_session_kv_refs(const loip_session *s, int32_t id) {
    return id >= 0 && id < s->n_groups ? s->refs[id] : -1;
}

LOIP_API uint32_t loip_session_kv_gen(const loip_session *s, int32_t id) {
    return id >= 0 && id < s->n_groups ? s->gen[id] : 0;
}

LOIP_API void loip_session_kv_share_stats(const loip_session *s, loip_kv_share_stats *st) {
    memset(st, 0, sizeof *st);
    for (int32_t g = 0; g < s->n_groups; g++) {
        if (cache_only(s, g)) st->cache_groups++;
        else if (s->holds[g] > 0) st->cache_shared_groups++;
        if (s->refs[g] > 1 && s->refs[g] > s->holds[g]) st->shared_groups++;
    }
    st->cache_bytes = (uint64_t)st->cache_groups * s->group_bytes;
    st->cache_charged = s->cache_charged;
    st->evictions = s->cache_evictions;
    st->cow_copies = s->cow_copies;
    st->free_groups = s->n_free;
    st->n_groups = s->n_groups;
}

/* ---- the disk tier's copies (loip.engine.request.prefix_disk) ------------------------------------- */

LOIP_API int loip_session_kv_touch(loip_session *s, int32_t id) {
    int rc = check_held(s, "KV touch", id);
    if (rc) return rc;
    s->tick[id] = ++s->ticks;
    return LOIP_OK;
}

/* group g's rows: per kept layer (in order) K then V, chunk_bytes / 2 each */
static void copy_group(loip_session *s, int32_t g, uint8_t *out, const uint8_t *in) {
    size_t half = s->chunk_bytes / 2;
    for (int32_t k = 0; k < s->n_kv_layers; k++) {
        float *kc = chunk_at(s, s->k_cache, k, g), *vc = chunk_at(s, s->v_cache, k, g);
        if (out) memcpy(out, kc, half), memcpy(out + half, vc, half), out += 2 * half;
        else memcpy(kc, in, half), memcpy(vc, in + half, half), in += 2 * half;
    }
}

LOIP_API int loip_session_kv_read_group(loip_session *s, int32_t id, void *buf, uint64_t cap) {
    int rc = check_held(s, "KV read", id);
    if (rc) return rc;
    if (cap < s->group_bytes)
        return loip_fail(LOIP_EINVAL, "KV read: a group is %llu bytes, the buffer %llu", (unsigned long long)s->group_bytes,
                         (unsigned long long)cap);
    copy_group(s, id, buf, NULL);
    return LOIP_OK;
}

LOIP_API int loip_session_kv_load_group(loip_session *s, const void *buf, uint64_t bytes, int32_t *id) {
    if (bytes != s->group_bytes)
        return loip_fail(LOIP_EINVAL, "KV load: %llu bytes for a group of %llu", (unsigned long long)bytes,
                         (unsigned long long)s->group_bytes);
    int32_t g;
    int rc = loip_session_take_group(s, -1, -1, &g);
    if (rc) return rc;
    copy_group(s, g, NULL, buf);
    s->holds[g] = 1, s->tick[g] = ++s->ticks; /* refs 1: the cache's hold alone */
    charge_to_cache(s, 1);
    *id = g;
    return LOIP_OK;
}
