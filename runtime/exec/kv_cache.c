/* The KV cache's pool and paging: its tables from one table of arrays (sized for the budget and
 * allocated from it), the pool's two mappings, groups taken as sequences write and given back
 * as they end or move back, and the "kv" account while the cache grows. See kv_cache.h. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/core.h"
#include "exec/arrays.h"
#include "exec/kv_cache.h"
#include "memory/budget.h"

/* The numbers a cache's tables are sized by. */
typedef struct {
    uint64_t n_layers, n_kv_layers, max_seqs, blocks_per_seq, n_groups;
    uint64_t n_win_layers, win_ring; /* ringed layers and their ring's positions (kv_window.c) */
} kv_shape;

/* The layers kept (mask, or NULL: the first count, < 0 or past the model's: all) in the pool
 * and in rings (windowed layers, when ring > 0). */
static void count_layers(const loip_model_config *c, int32_t ring, const uint8_t *mask, int32_t count,
                         uint64_t *pool, uint64_t *win) {
    *pool = *win = 0;
    if (!mask && (count < 0 || count > c->n_layers)) count = c->n_layers;
    for (int32_t l = 0; l < c->n_layers; l++) {
        if (mask ? !mask[l] : l >= count) continue;
        if (ring > 0 && loip_kv_layer_windowed(c, l)) (*win)++;
        else (*pool)++;
    }
}

static kv_shape shape_of(const loip_model_config *c, int32_t max_ctx, int32_t max_batch, const uint8_t *mask,
                         int32_t kv_layers, int32_t kv_tokens, int32_t max_seqs) {
    int32_t kb = LOIP_KV_BLOCK_TOKENS, ring = loip_kv_ring_tokens(c, max_ctx, max_batch);
    kv_shape k = {.n_layers = (uint64_t)c->n_layers, .max_seqs = (uint64_t)max_seqs,
                  .blocks_per_seq = (uint64_t)((max_ctx + kb - 1) / kb), .n_groups = (uint64_t)((kv_tokens + kb - 1) / kb)};
    count_layers(c, ring, mask, kv_layers, &k.n_kv_layers, &k.n_win_layers);
    k.win_ring = k.n_win_layers ? (uint64_t)ring : 0;
    return k;
}

enum { KV_COUNTED = LOIP_ARRAY_COUNTED, KV_TABLE = LOIP_ARRAY_ZERO, KV_MAX_ARRAYS = 18 };

/* The cache's arrays besides its pool: the block tables, the free list and the layer slots are
 * charged with the pool; the lending, sharing and eviction tables are small and outside the
 * budget's sizes (as the object itself). */
static size_t kv_arrays(const kv_shape *k, loip_array *t) {
    uint64_t kept = k->n_kv_layers ? k->n_kv_layers : 1, G = k->n_groups;
    size_t n = 0;
#define KV_ARRAY(field, count, flags) \
    t[n++] = (loip_array){offsetof(loip_kv, field), sizeof *((loip_kv *)0)->field, (count), (flags)}
    KV_ARRAY(block_table, k->max_seqs * k->blocks_per_seq, KV_COUNTED);
    KV_ARRAY(free_groups, G, KV_COUNTED);
    KV_ARRAY(layer_slot, k->n_layers, KV_COUNTED);
    KV_ARRAY(lent, G * kept, KV_TABLE);
    KV_ARRAY(seq_lent, k->max_seqs * kept, KV_TABLE);
    KV_ARRAY(lent_at, G * kept, KV_TABLE);
    KV_ARRAY(refs, G + 1, KV_TABLE);
    KV_ARRAY(holds, G + 1, KV_TABLE);
    KV_ARRAY(tick, G + 1, KV_TABLE);
    KV_ARRAY(gen, G + 1, KV_TABLE);
    KV_ARRAY(evicted, k->max_seqs, KV_TABLE);
    KV_ARRAY(win_slot, k->n_layers, KV_TABLE);
    KV_ARRAY(win_len, k->max_seqs, KV_TABLE);
    KV_ARRAY(win_snap, G + 1, KV_TABLE);
    KV_ARRAY(snap_end, G + 1, KV_TABLE);
    KV_ARRAY(want_id, k->max_seqs, KV_TABLE);
    KV_ARRAY(want_end, k->max_seqs, KV_TABLE);
    KV_ARRAY(want_gen, k->max_seqs, KV_TABLE);
#undef KV_ARRAY
    return n;
}

/* Floats of each of the pool's two halves (keys, values). */
static uint64_t pool_floats(const kv_shape *k, uint64_t kv_dim) {
    return k->n_groups * k->n_kv_layers * LOIP_KV_BLOCK_TOKENS * kv_dim;
}

/* Floats of each of the rings' two halves (keys, values). */
static uint64_t ring_floats(const kv_shape *k, uint64_t kv_dim) {
    return k->max_seqs * k->n_win_layers * k->win_ring * kv_dim;
}

static uint64_t shape_bytes(const kv_shape *k, uint64_t kv_dim) {
    loip_array t[KV_MAX_ARRAYS];
    size_t n = kv_arrays(k, t);
    return 2 * (pool_floats(k, kv_dim) + ring_floats(k, kv_dim)) * sizeof(float) + loip_arrays_bytes(t, n);
}

uint64_t loip_kv_size(const loip_model_config *c, int32_t max_ctx, int32_t max_batch, const uint8_t *kv_mask,
                      int32_t kv_layers, int32_t kv_tokens, int32_t max_seqs) {
    if (kv_tokens <= 0) kv_tokens = max_ctx;
    if (max_seqs <= 0) max_seqs = 1;
    if (max_batch > max_ctx) max_batch = max_ctx;
    kv_shape k = shape_of(c, max_ctx, max_batch, kv_mask, kv_layers, kv_tokens, max_seqs);
    return shape_bytes(&k, (uint64_t)c->n_kv_heads * c->head_dim);
}

int loip_kv_map_pool(loip_kv *kv) {
    float **halves[2] = {&kv->k_cache, &kv->v_cache};
    for (int i = 0; i < 2; i++) {
        void *p = mmap(NULL, kv->pool_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return loip_fail(LOIP_ENOMEM, "session: cannot map a KV pool of %zu bytes (%d KV tokens)", kv->pool_bytes,
                             kv->kv_tokens);
        /* huge pages only for a pool resident whole: growing, one would make a layer's whole
         * region resident at its first position */
        if (!kv->grows && kv->pool_bytes >= (2u << 20)) madvise(p, kv->pool_bytes, MADV_HUGEPAGE);
        /* charged whole, resident whole (the first steps pay no page faults); growing: as written */
        if (!kv->grows) memset(p, 0, kv->pool_bytes);
        *halves[i] = p;
    }
    return LOIP_OK;
}

/* The tables' starting contents: layer slots, empty block tables, every group free. */
static void init_tables(loip_kv *kv, const loip_model_config *c, const uint8_t *kv_layers) {
    for (int32_t l = 0, k = 0, w = 0; l < kv->n_layers; l++) {
        int kept = !kv_layers || kv_layers[l], ringed = kept && kv->win_ring > 0 && loip_kv_layer_windowed(c, l);
        kv->layer_slot[l] = kept && !ringed ? k++ : -1;
        kv->win_slot[l] = ringed ? w++ : -1;
    }
    for (size_t i = 0; i < (size_t)kv->max_seqs * kv->blocks_per_seq; i++) kv->block_table[i] = -1;
    /* groups are handed out lowest first: a lone sequence's cache is contiguous */
    for (int32_t g = kv->n_groups - 1; g >= 0; g--) kv->free_groups[kv->n_free++] = g;
}

int loip_kv_new(const loip_model_config *c, int32_t max_ctx, int32_t max_batch, int32_t kv_tokens, int32_t max_seqs,
                const uint8_t *kv_layers, int grows, loip_budget *budget, loip_kv **out) {
    *out = NULL;
    loip_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return loip_fail(LOIP_ENOMEM, "session: out of memory");
    kv_shape k = shape_of(c, max_ctx, max_batch, kv_layers, -1, kv_tokens, max_seqs);
    int32_t n_kv = (int32_t)k.n_kv_layers;
    kv->n_win_layers = (int)k.n_win_layers, kv->win_ring = (int32_t)k.win_ring, kv->window = c->sliding_window;
    kv->n_layers = c->n_layers, kv->max_ctx = max_ctx, kv->kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    kv->kv_block = LOIP_KV_BLOCK_TOKENS, kv->blocks_per_seq = (int)k.blocks_per_seq, kv->max_seqs = max_seqs;
    kv->n_groups = (int)k.n_groups, kv->n_kv_layers = n_kv, kv->kv_tokens = kv_tokens;
    kv->bytes = shape_bytes(&k, kv->kv_dim);
    kv->group_bytes = 2 * (uint64_t)n_kv * kv->kv_block * kv->kv_dim * sizeof(float);
    kv->chunk_bytes = 2 * (uint64_t)kv->kv_block * kv->kv_dim * sizeof(float);
    kv->grows = grows != 0;
    loip_array t[KV_MAX_ARRAYS];
    size_t n = kv_arrays(&k, t);
    uint64_t failed;
    int rc = loip_arrays_alloc(kv, t, n, &failed);
    if (rc) {
        rc = loip_fail(rc, "session: out of memory");
        goto fail;
    }
    /* charged before the pool is mapped; growing: the tables now, the groups as sequences take them */
    uint64_t now = kv->grows ? kv->bytes - (uint64_t)kv->n_groups * kv->group_bytes : kv->bytes;
    if (budget) {
        if ((rc = loip_budget_charge(budget, "kv", now))) goto fail;
        kv->budget = loip_budget_retain(budget), kv->charged = now;
    }
    uint64_t floats = pool_floats(&k, kv->kv_dim);
    kv->pool_bytes = (floats ? floats : 1) * sizeof(float);
    kv->win_map_bytes = (size_t)ring_floats(&k, kv->kv_dim) * sizeof(float);
    if (kv->n_win_layers) /* window - 1 rows of each ringed layer (one at least: a window of 1 reads none) */
        kv->snap_bytes = 2 * (uint64_t)kv->n_win_layers * (uint64_t)(kv->window > 1 ? kv->window - 1 : 1) * kv->kv_dim *
                         sizeof(float);
    init_tables(kv, c, kv_layers);
    *out = kv;
    return LOIP_OK;
fail:
    loip_kv_free(kv);
    return rc;
}

void loip_kv_free(loip_kv *kv) {
    if (!kv) return;
    if (kv->k_cache) munmap(kv->k_cache, kv->pool_bytes);
    if (kv->v_cache) munmap(kv->v_cache, kv->pool_bytes);
    if (kv->win_k) munmap(kv->win_k, kv->win_map_bytes);
    if (kv->win_v) munmap(kv->win_v, kv->win_map_bytes);
    if (kv->win_snap) loip_kv_snaps_free_all(kv);
    kv_shape k = {.n_layers = (uint64_t)kv->n_layers, .n_kv_layers = (uint64_t)kv->n_kv_layers,
                  .max_seqs = (uint64_t)kv->max_seqs, .blocks_per_seq = (uint64_t)kv->blocks_per_seq,
                  .n_groups = (uint64_t)kv->n_groups};
    loip_array t[KV_MAX_ARRAYS];
    loip_arrays_free(kv, t, kv_arrays(&k, t));
    if (kv->budget) {
        loip_budget_release(kv->budget, "kv", kv->charged);
        if (kv->cache_charged) loip_budget_release(kv->budget, "prompt_cache", kv->cache_charged);
        loip_budget_free(kv->budget);
    }
    free(kv);
}

int loip_kv_charge(loip_kv *kv, uint64_t bytes) {
    if (!kv->grows || !kv->budget) return LOIP_OK;
    int rc = loip_budget_charge(kv->budget, "kv", bytes);
    if (rc == 0) kv->charged += bytes;
    return rc;
}

void loip_kv_release(loip_kv *kv, uint64_t bytes) {
    if (!kv->grows || !kv->budget) return;
    loip_budget_release(kv->budget, "kv", bytes);
    kv->charged -= bytes;
}

int loip_kv_set_growth(loip_kv *kv, int32_t grows) {
    grows = grows != 0;
    if (grows == kv->grows) return LOIP_OK;
    if (kv->n_free != kv->n_groups)
        return loip_fail(LOIP_ESTATE, "session: KV growth changes only while no sequence holds KV (%d of %d groups held)",
                         kv->n_groups - kv->n_free, kv->n_groups);
    uint64_t pool = (uint64_t)kv->n_groups * kv->group_bytes;
    if (kv->budget) {
        if (grows) {
            loip_budget_release(kv->budget, "kv", pool);
            kv->charged -= pool;
        } else {
            int rc = loip_budget_charge(kv->budget, "kv", pool);
            if (rc) return rc;
            kv->charged += pool;
        }
    }
    kv->grows = grows;
    return LOIP_OK;
}

/* ---- paging ------------------------------------------------------------------------------- */

int loip_kv_prepare(loip_kv *kv, int32_t seq, int32_t pos) {
    int32_t *table = &kv->block_table[(size_t)seq * kv->blocks_per_seq];
    for (int32_t g = kv->evicted[seq] / kv->kv_block; g <= pos / kv->kv_block; g++) {
        if (table[g] >= 0) continue;
        int rc = loip_kv_take_group(kv, seq, pos, &table[g]);
        if (rc) return rc;
    }
    return loip_kv_own_group(kv, seq, pos);
}

void loip_kv_trim(loip_kv *kv, int32_t seq, int32_t last) {
    int32_t *table = &kv->block_table[(size_t)seq * kv->blocks_per_seq];
    for (int32_t g = last / kv->kv_block + 1; g < kv->blocks_per_seq; g++) {
        if (table[g] < 0) continue;
        int lent = 0;
        for (int32_t k = 0; k < kv->n_kv_layers; k++) lent |= kv->lent[(size_t)table[g] * kv->n_kv_layers + k];
        if (lent) continue;
        loip_kv_release_group(kv, seq, table[g]);
        table[g] = -1;
    }
}

void loip_kv_release_group(loip_kv *kv, int32_t seq, int32_t g) {
    if (kv->refs[g] > 1) { /* shared: only this table's reference goes (its chunks are never lent) */
        loip_kv_unref_group(kv, g);
        return;
    }
    kv->refs[g] = 0, kv->holds[g] = 0, kv->gen[g]++;
    uint64_t bytes = kv->group_bytes;
    for (int32_t k = 0; k < kv->n_kv_layers; k++) {
        size_t c = (size_t)g * kv->n_kv_layers + k;
        if (kv->lent[c]) { /* the borrower's copy is stale now */
            bytes -= kv->chunk_bytes;
            if (!kv->lent_at[c]) kv->seq_lent[(size_t)seq * kv->n_kv_layers + k]--;
            kv->lent[c] = 0, kv->lent_at[c] = NULL;
        }
    }
    kv->free_groups[kv->n_free++] = g;
    loip_kv_release(kv, bytes);
}

int loip_kv_seq_free(loip_kv *kv, int32_t seq) {
    if (seq < 0 || seq >= kv->max_seqs)
        return loip_fail(LOIP_EINVAL, "session: sequence %d out of range (%d sequences)", seq, kv->max_seqs);
    int32_t *t = kv->block_table + (size_t)seq * kv->blocks_per_seq;
    loip_kv_drop_want(kv, seq); /* (a snapshot its rings owe a held group, taken first) */
    for (int32_t i = 0; i < kv->blocks_per_seq; i++)
        if (t[i] >= 0) loip_kv_release_group(kv, seq, t[i]);
    for (int32_t i = 0; i < kv->blocks_per_seq; i++) t[i] = -1;
    kv->evicted[seq] = 0, kv->win_len[seq] = 0;
    return LOIP_OK;
}

int32_t loip_kv_groups_held(const loip_kv *kv, int32_t seq) {
    if (seq < 0 || seq >= kv->max_seqs) return 0;
    const int32_t *table = &kv->block_table[(size_t)seq * kv->blocks_per_seq];
    int32_t k = 0;
    for (int32_t i = 0; i < kv->blocks_per_seq; i++) k += table[i] >= 0;
    return k;
}
