/* The KV of sliding-window layers (loip_model_config.sliding_window, layer_window): a ring per
 * sequence and layer of the window and a batch, outside the paged pool, so that such a layer's
 * KV stops growing at its window. See kv_cache.h ("Windows") and forward.c (the mask). */
#include <string.h>
#include <sys/mman.h>

#include "core/core.h"
#include "exec/kv_cache.h"

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

int loip_kv_no_rings(const loip_kv *kv, const char *what) {
    if (!kv->n_win_layers) return LOIP_OK;
    return loip_fail(LOIP_ESTATE, "%s: %d sliding-window layers keep their KV in rings of %d positions, which the "
                     "prompt cache's groups do not carry", what, kv->n_win_layers, kv->win_ring);
}
