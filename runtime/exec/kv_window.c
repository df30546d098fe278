/* The KV of sliding-window layers (loip_model_config.sliding_window, layer_window): a ring per
 * sequence and layer of the window and a batch, outside the paged pool, so that such a layer's
 * KV stops growing at its window. See kv_cache.h ("Windows") and forward.c (the mask). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/core.h"
#include "exec/kv_cache.h"
#include "memory/budget.h"

int loip_kv_layer_windowed(const loip_model_config *c, int32_t l) {
    return c->sliding_window > 0 && l >= 0 && l < c->n_layers && l < LOIP_MAX_LAYERS && c->layer_window[l];
}

int32_t loip_kv_ring_tokens(const loip_model_config *c, int32_t max_ctx, int32_t max_batch) {
    int any = 0;
    for (int32_t l = 0; l < c->n_layers && !any; l++) any = loip_kv_layer_windowed(c, l);
    if (!any || max_batch <= 0) return 0;
    /* a batch's tokens read back to (first position - window + 1) and write up to (first
     * position + batch - 1): window - 1 + batch positions, none two in one row */
    int64_t kb = LOIP_KV_BLOCK_TOKENS, ring = (int64_t)c->sliding_window - 1 + max_batch;
    ring = (ring + kb - 1) / kb * kb;
    return ring < max_ctx ? (int32_t)ring : 0;
}

int loip_kv_map_rings(loip_kv *kv) {
    if (!kv->n_win_layers) return LOIP_OK;
    float **halves[2] = {&kv->win_k, &kv->win_v};
    for (int i = 0; i < 2; i++) {
        void *p = mmap(NULL, kv->win_map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return loip_fail(LOIP_ENOMEM, "session: cannot map the KV windows' rings of %zu bytes (%d layers, %d "
                             "positions)", kv->win_map_bytes, kv->n_win_layers, kv->win_ring);
        memset(p, 0, kv->win_map_bytes); /* charged whole, resident whole */
        *halves[i] = p;
    }
    return LOIP_OK;
}

int loip_kv_share_rings(loip_kv *kv, int32_t dst, int32_t src, int32_t n_positions) {
    if (!kv->n_win_layers || n_positions <= 0) return LOIP_OK;
    /* dst's positions from n_positions on read those past n_positions - window */
    int32_t lo = n_positions - kv->window + 1;
    if (lo < 0) lo = 0;
    if (kv->win_len[src] < n_positions || kv->win_len[src] - kv->win_ring > lo)
        return loip_fail(LOIP_ESTATE, "KV share: sequence %d's sliding-window layers hold positions %d..%d, not the "
                         "%d..%d that sequence %d reads from position %d on", src,
                         kv->win_len[src] - kv->win_ring > 0 ? kv->win_len[src] - kv->win_ring : 0,
                         kv->win_len[src] - 1, lo, n_positions - 1, dst, n_positions);
    size_t row = kv->kv_dim * sizeof(float);
    for (int w = 0; w < kv->n_win_layers; w++)
        for (int32_t p = lo; p < n_positions; p++) {
            size_t at = (size_t)(p % kv->win_ring) * kv->kv_dim;
            memcpy(ring_at(kv, kv->win_k, w, dst) + at, ring_at(kv, kv->win_k, w, src) + at, row);
            memcpy(ring_at(kv, kv->win_v, w, dst) + at, ring_at(kv, kv->win_v, w, src) + at, row);
        }
    kv->win_len[dst] = n_positions;
    return LOIP_OK;
}

/* ---- the prompt cache's snapshots of the rings --------------------------------------------- */

/* Rows of positions [lo, end) of seq's rings to (out) or from (in) snapshot buf: per ringed
 * layer the window - 1 rows of keys from lo on, then as many of values. */
static void copy_snapshot(loip_kv *kv, int32_t seq, float *buf, int out, int32_t lo, int32_t end) {
    size_t row = kv->kv_dim * sizeof(float), per = (size_t)(kv->window > 1 ? kv->window - 1 : 1) * kv->kv_dim;
    float *halves[2][2] = {{kv->win_k, buf}, {kv->win_v, buf + (size_t)kv->n_win_layers * per}};
    for (int h = 0; h < 2; h++)
        for (int w = 0; w < kv->n_win_layers; w++) {
            float *ring = ring_at(kv, halves[h][0], w, seq), *snap = halves[h][1] + (size_t)w * per;
            for (int32_t p = lo; p < end; p++) {
                float *r = ring + (size_t)(p % kv->win_ring) * kv->kv_dim, *x = snap + (size_t)(p - lo) * kv->kv_dim;
                memcpy(out ? x : r, out ? r : x, row);
            }
        }
}

static int32_t snap_lo(const loip_kv *kv, int32_t end) { return end - kv->window + 1 > 0 ? end - kv->window + 1 : 0; }

/* A snapshot for held group g ending at end (its rows to be written), charged to "prompt_cache":
 * the least recent held groups evicted for it where the budget refuses (those whose eviction frees
 * bytes of the budget: a session charged whole frees none by a group alone). */
static int snap_new(loip_kv *kv, int32_t g, int32_t end, float **out, const char *what) {
    if (kv->budget) {
        int rc;
        while ((rc = loip_budget_charge(kv->budget, "prompt_cache", kv->snap_bytes)) != 0)
            if (!loip_kv_evict_held(kv, !kv->grows)) {
                char why[400];
                snprintf(why, sizeof why, "%s", loip_last_error());
                return loip_fail(rc, "%s: %s", what, why);
            }
    }
    float *buf = malloc(kv->snap_bytes);
    if (!buf) {
        if (kv->budget) loip_budget_release(kv->budget, "prompt_cache", kv->snap_bytes);
        return loip_fail(LOIP_ENOMEM, "%s: out of memory for a snapshot of %llu bytes", what,
                         (unsigned long long)kv->snap_bytes);
    }
    if (kv->budget) kv->cache_charged += kv->snap_bytes;
    kv->win_snap[g] = buf, kv->snap_end[g] = end, kv->n_snaps++;
    *out = buf;
    return LOIP_OK;
}

int loip_kv_hold_window(loip_kv *kv, int32_t seq, int32_t i) {
    if (seq < 0 || seq >= kv->max_seqs)
        return loip_fail(LOIP_EINVAL, "KV hold window: sequence %d out of range (%d sequences)", seq, kv->max_seqs);
    if (i < 0 || i >= kv->blocks_per_seq)
        return loip_fail(LOIP_EINVAL, "KV hold window: group %d out of range (%d per sequence)", i, kv->blocks_per_seq);
    if (!kv->n_win_layers) return LOIP_OK; /* nothing ringed: the groups carry every layer */
    int32_t g = kv->block_table[(size_t)seq * kv->blocks_per_seq + i], end = (i + 1) * kv->kv_block, lo = snap_lo(kv, end);
    if (g < 0 || kv->holds[g] <= 0)
        return loip_fail(LOIP_ESTATE, "KV hold window: sequence %d's group %d (positions %d..%d) is not held", seq, i,
                         end - kv->kv_block, end - 1);
    if (kv->win_snap[g]) return LOIP_OK; /* held with its window already (a group's end never changes) */
    /* a ring keeps positions win_len - win_ring .. win_len - 1 */
    if (kv->win_len[seq] < end || kv->win_len[seq] - kv->win_ring > lo)
        return loip_fail(LOIP_ESTATE, "KV hold window: sequence %d's sliding-window rings hold positions %d..%d, not the "
                         "%d..%d read from position %d on", seq,
                         kv->win_len[seq] - kv->win_ring > 0 ? kv->win_len[seq] - kv->win_ring : 0, kv->win_len[seq] - 1,
                         lo, end - 1, end);
    float *buf;
    int rc = snap_new(kv, g, end, &buf, "KV hold window");
    if (rc) return rc;
    copy_snapshot(kv, seq, buf, 1, lo, end);
    return LOIP_OK;
}

/* ---- the disk tier's copies of a snapshot -------------------------------------------------- */

int loip_kv_read_window(loip_kv *kv, int32_t id, void *buf, uint64_t cap, int32_t *end) {
    if (id < 0 || id >= kv->n_groups || !kv->win_snap[id])
        return loip_fail(LOIP_ESTATE, "KV read window: group %d carries no sliding-window rings", id);
    if (cap < kv->snap_bytes)
        return loip_fail(LOIP_EINVAL, "KV read window: a snapshot is %llu bytes, the buffer %llu",
                         (unsigned long long)kv->snap_bytes, (unsigned long long)cap);
    memcpy(buf, kv->win_snap[id], kv->snap_bytes);
    *end = kv->snap_end[id];
    return LOIP_OK;
}

int loip_kv_load_window(loip_kv *kv, int32_t id, int32_t end, const void *buf, uint64_t bytes) {
    if (!kv->n_win_layers) return loip_fail(LOIP_ESTATE, "KV load window: no layer keeps its KV in a ring here");
    if (id < 0 || id >= kv->n_groups || kv->holds[id] <= 0)
        return loip_fail(LOIP_ESTATE, "KV load window: group %d is not held", id);
    if (bytes != kv->snap_bytes || end <= 0 || end % kv->kv_block)
        return loip_fail(LOIP_EINVAL, "KV load window: %llu bytes ending at %d for a snapshot of %llu bytes ending at a "
                         "group's end", (unsigned long long)bytes, end, (unsigned long long)kv->snap_bytes);
    if (kv->win_snap[id]) return kv->snap_end[id] == end ? LOIP_OK
                                  : loip_fail(LOIP_ESTATE, "KV load window: group %d's snapshot ends at %d, not %d", id,
                                              kv->snap_end[id], end);
    float *snap;
    kv->refs[id]++; /* (not evicted for its own snapshot) */
    int rc = snap_new(kv, id, end, &snap, "KV load window");
    kv->refs[id]--;
    if (rc) return rc;
    memcpy(snap, buf, bytes);
    return LOIP_OK;
}

int loip_kv_adopt_window(loip_kv *kv, int32_t seq, int32_t g, int32_t n_positions) {
    if (!kv->n_win_layers || n_positions <= 0) return LOIP_OK;
    if (!kv->win_snap[g] || kv->snap_end[g] != n_positions)
        return loip_fail(LOIP_ESTATE, "KV adopt: group %d carries no sliding-window rings at position %d (the prompt "
                         "cache keeps them only where a request's kept groups ended)", g, n_positions);
    copy_snapshot(kv, seq, kv->win_snap[g], 0, snap_lo(kv, n_positions), n_positions);
    kv->win_len[seq] = n_positions;
    return LOIP_OK;
}

void loip_kv_snap_free(loip_kv *kv, int32_t g) {
    if (!kv->win_snap || !kv->win_snap[g]) return;
    free(kv->win_snap[g]);
    kv->win_snap[g] = NULL, kv->snap_end[g] = 0, kv->n_snaps--;
    if (kv->budget) {
        loip_budget_release(kv->budget, "prompt_cache", kv->snap_bytes);
        kv->cache_charged -= kv->snap_bytes;
    }
}

void loip_kv_snaps_free_all(loip_kv *kv) {
    for (int32_t g = 0; g < kv->n_groups; g++) free(kv->win_snap[g]), kv->win_snap[g] = NULL;
    kv->n_snaps = 0;
}

/* ---- snapshots wanted: a held group whose run a sequence recomputes ------------------------- */

int loip_kv_window_at(loip_kv *kv, int32_t seq, int32_t id, int32_t end) {
    if (seq < 0 || seq >= kv->max_seqs)
        return loip_fail(LOIP_EINVAL, "KV window at: sequence %d out of range (%d sequences)", seq, kv->max_seqs);
    if (!kv->n_win_layers) return LOIP_OK;
    if (id < 0 || id >= kv->n_groups || kv->holds[id] <= 0)
        return loip_fail(LOIP_ESTATE, "KV window at: group %d is not held", id);
    if (end <= 0 || end % kv->kv_block || end > kv->max_ctx)
        return loip_fail(LOIP_EINVAL, "KV window at: a snapshot ends at a group's end, not %d", end);
    if (kv->win_snap[id]) return LOIP_OK;
    kv->want_id[seq] = id, kv->want_end[seq] = end, kv->want_gen[seq] = kv->gen[id];
    return LOIP_OK;
}

/* seq's wanted snapshot taken if its rings hold it and its group is still held without one */
static void take_want(loip_kv *kv, int32_t seq) {
    int32_t id = kv->want_id[seq], end = kv->want_end[seq], lo = snap_lo(kv, end);
    kv->want_end[seq] = 0;
    if (kv->holds[id] <= 0 || kv->gen[id] != kv->want_gen[seq] || kv->win_snap[id]) return;
    if (kv->win_len[seq] < end || kv->win_len[seq] - kv->win_ring > lo) return; /* (moved past: none) */
    float *buf;
    kv->refs[id]++; /* (not evicted for its own snapshot) */
    int rc = snap_new(kv, id, end, &buf, "KV window at");
    kv->refs[id]--;
    if (!rc) copy_snapshot(kv, seq, buf, 1, lo, end); /* (refused by the budget: a cache, none kept) */
}

void loip_kv_take_wants(loip_kv *kv) {
    if (!kv->n_win_layers) return;
    for (int32_t seq = 0; seq < kv->max_seqs; seq++)
        if (kv->want_end[seq] > 0 && kv->win_len[seq] >= kv->want_end[seq]) take_want(kv, seq);
}

void loip_kv_drop_want(loip_kv *kv, int32_t seq) {
    if (kv->want_end[seq] > 0) take_want(kv, seq);
}
