/* The expert cache: a device's routed experts that are not in memory, read on demand (or ahead,
 * by pre-gating) into its loader's slots, one expert a slot, and kept there until the policy
 * evicts them (loip.h, "the expert cache"). The MoE block (moe.c) holds the slots of the experts
 * its batch chose while it computes them, so that no read lands over an expert in use; only the
 * slots of other layers' experts are evicted. Nothing here allocates per step; the loader's
 * submit and wait are the only calls out. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "exec/experts.h"
#include "exec/model.h"

typedef struct xslot {
    int32_t layer, expert; /* held, -1: none */
    int state;             /* XS_* */
    uint64_t tag;
    uint64_t last_use;     /* x->clock at its last acquire (LRU) */
    uint64_t held_run;     /* x->run of the layer run holding it, 0: none */
    int pinned;
    int32_t prefetched_for; /* a prefetched expert's layer until it is chosen or that layer ran, -1 */
    int prefetch_read;      /* its read was a prefetch (for the trace) */
} xslot;

typedef struct xsrc {
    loip_load_extent ext; /* path owned; NULL path and fd -1: no source */
    uint64_t off[LOIP_EXPERT_PARTS];
    int32_t dtype;
} xsrc;

struct loip_experts {
    loip_model *m;
    int32_t n_layers, n_experts; /* the model's, copied: the model may go before the cache */
    loip_loader *l;              /* owned */
    loip_experts_config cfg;
    int32_t n_slots;
    xslot *slots;
    int32_t *where;       /* (n_layers, n_experts) the slot holding it, -1 */
    xsrc *src;            /* (n_layers, n_experts) */
    uint32_t *freq;       /* (n_layers, n_experts) times chosen (LFU) */
    int32_t *has_src;     /* (n_layers) experts of the layer with a source */
    uint32_t *seen;       /* (n_layers, n_experts) LOIP_EXPERTS_ALL: the epoch of the layer it was last read in */
    uint32_t *epoch;      /* (n_layers) LOIP_EXPERTS_ALL: runs of the layer done, + 1 */
    float *accuracy;      /* (n_layers) running share of the layer's predictions the router confirmed */
    uint32_t *unpredicted; /* (n_layers) runs of the layer not predicted since its last probe */
    int32_t run_hits;     /* prefetched experts the layer running now chose */
    const loip_tensor **gate_norm, **gate_router; /* (n_layers) pre-gating views, NULL: none */
    loip_tensor *gate_views; /* (n_layers, 2) copies of those views */
    loip_tensor *gate_bias;  /* (n_layers) the routers' biases for pre-gating, data NULL: none */
    uint64_t clock, run, next_tag;
    loip_runner_event *ev;
    int32_t ev_count;
    loip_experts_stats_t st;
};

static size_t idx(const loip_experts *x, int32_t layer, int32_t e) {
    return (size_t)layer * x->n_experts + (size_t)e;
}

LOIP_API int loip_experts_new(loip_model *m, const loip_loader_config *lc, const loip_experts_config *cfg,
                              loip_experts **out) {
    *out = NULL;
    const loip_model_config *c = &m->cfg;
    if (c->n_experts == 0) return loip_fail(LOIP_EINVAL, "expert cache: the model has no experts");
    if (!lc) return loip_fail(LOIP_EINVAL, "expert cache: needs a loader config");
    if (!cfg || cfg->policy < LOIP_EXPERTS_LRU || cfg->policy > LOIP_EXPERTS_ALL || cfg->prefetch < 0 ||
        cfg->event_capacity < 0 || !(cfg->prefetch_min_accuracy >= 0.0f && cfg->prefetch_min_accuracy <= 1.0f) ||
        cfg->prefetch_probe_every < 0)
        return loip_fail(LOIP_EINVAL, "expert cache: policy %d, prefetch %d, event_capacity %d invalid",
                         cfg ? cfg->policy : -1, cfg ? cfg->prefetch : -1, cfg ? cfg->event_capacity : -1);
    loip_experts *x = calloc(1, sizeof *x);
    if (!x) return loip_fail(LOIP_ENOMEM, "expert cache: out of memory");
    size_t n = (size_t)c->n_layers * c->n_experts;
    x->m = m, x->n_layers = c->n_layers, x->n_experts = c->n_experts, x->cfg = *cfg, x->next_tag = 1, x->run = 1;
    int rc = loip_loader_new(lc, &x->l);
    if (rc) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", loip_last_error());
        free(x);
        return loip_fail(rc, "expert cache: %s", msg);
    }
    x->n_slots = loip_loader_slots(x->l);
    x->slots = calloc((size_t)x->n_slots, sizeof *x->slots);
    x->where = malloc(n * sizeof *x->where);
    x->src = calloc(n, sizeof *x->src);
    x->freq = calloc(n, sizeof *x->freq);
    x->has_src = calloc((size_t)c->n_layers, sizeof *x->has_src);
    x->seen = calloc(n, sizeof *x->seen);
    x->epoch = calloc((size_t)c->n_layers, sizeof *x->epoch);
    x->accuracy = malloc((size_t)c->n_layers * sizeof *x->accuracy);
    x->unpredicted = calloc((size_t)c->n_layers, sizeof *x->unpredicted);
    x->gate_norm = calloc((size_t)c->n_layers, sizeof *x->gate_norm);
    x->gate_router = calloc((size_t)c->n_layers, sizeof *x->gate_router);
    x->gate_bias = calloc((size_t)c->n_layers, sizeof *x->gate_bias);
    x->gate_views = calloc((size_t)c->n_layers * 2, sizeof *x->gate_views);
    if (cfg->event_capacity) x->ev = calloc((size_t)cfg->event_capacity, sizeof *x->ev);
    if (!x->slots || !x->where || !x->src || !x->freq || !x->has_src || !x->seen || !x->epoch || !x->accuracy ||
        !x->unpredicted || !x->gate_norm || !x->gate_router || !x->gate_bias ||
        !x->gate_views || (cfg->event_capacity && !x->ev)) {
        loip_experts_free(x);
        return loip_fail(LOIP_ENOMEM, "expert cache: out of memory");
    }
    for (size_t i = 0; i < n; i++) x->where[i] = -1, x->src[i].ext.fd = -1;
    for (int32_t l = 0; l < c->n_layers; l++) x->accuracy[l] = 1.0f; /* (trusted until shown otherwise) */
    for (int32_t i = 0; i < x->n_slots; i++) x->slots[i] = (xslot){.layer = -1, .expert = -1, .prefetched_for = -1};
    *out = x;
    return LOIP_OK;
}

/* Wait for every read in flight (they write into the slots). */
static void drain(loip_experts *x) {
    for (int32_t i = 0; i < x->n_slots; i++)
        if (x->slots[i].state == XS_LOADING) {
            loip_loader_wait(x->l, x->slots[i].tag, -1, NULL);
            x->slots[i].state = XS_EMPTY;
        }
}

LOIP_API void loip_experts_free(loip_experts *x) {
    if (!x) return;
    if (x->slots && x->l) drain(x);
    loip_loader_free(x->l);
    if (x->src)
        for (size_t i = 0; i < (size_t)x->n_layers * x->n_experts; i++) free((char *)x->src[i].ext.path);
    free(x->slots), free(x->where), free(x->src), free(x->freq), free(x->has_src), free(x->seen), free(x->epoch);
    free(x->accuracy), free(x->unpredicted);
    free(x->gate_norm), free(x->gate_router), free(x->gate_views), free(x->gate_bias), free(x->ev);
    free(x);
}

static int check_le(const loip_experts *x, int32_t layer, int32_t e, const char *what) {
    const loip_model_config *c = &x->m->cfg;
    if (layer < 0 || layer >= c->n_layers || e < 0 || e >= c->n_experts)
        return loip_fail(LOIP_EINVAL, "expert cache %s: layer %d, expert %d out of range (%d layers, %d experts)",
                         what, layer, e, c->n_layers, c->n_experts);
    return LOIP_OK;
}

LOIP_API int loip_experts_set_source(loip_experts *x, int32_t layer, int32_t expert, const loip_load_extent *ext,
                                     const uint64_t *offset, int32_t dtype) {
    int rc = check_le(x, layer, expert, "source");
    if (rc) return rc;
    const loip_model_config *c = &x->m->cfg;
    if (!ext || (!ext->path && ext->fd < 0) || ext->slot_offset != 0)
        return loip_fail(LOIP_EINVAL, "expert cache: expert %d of layer %d: an extent with a file at slot offset 0",
                         expert, layer);
    if (ext->length > loip_loader_slot_bytes(x->l))
        return loip_fail(LOIP_EINVAL, "expert cache: expert %d of layer %d (%s) is %llu bytes, the slots hold %llu",
                         expert, layer, ext->path ? ext->path : "fd", (unsigned long long)ext->length,
                         (unsigned long long)loip_loader_slot_bytes(x->l));
    if (dtype != LOIP_F32 && dtype != LOIP_BF16 && dtype != LOIP_F16 && dtype != LOIP_MXFP4 &&
        dtype != LOIP_F8_E4M3)
        return loip_fail(LOIP_ESHAPE, "expert cache: expert %d of layer %d: dtype %d not supported", expert, layer, dtype);
    for (int p = 0; p < LOIP_EXPERT_PARTS; p++) {
        int64_t rows, cols;
        loip_expert_shape(c, p, &rows, &cols);
        if ((rc = loip_dtype_check(dtype, rows, cols, "expert cache: an expert's part"))) return rc;
        uint64_t bytes = loip_dtype_bytes(dtype, rows, cols);
        if (offset[p] > ext->length || bytes > ext->length - offset[p])
            return loip_fail(LOIP_EINVAL, "expert cache: expert %d of layer %d: part %d ends past its extent (%s)",
                             expert, layer, p, ext->path ? ext->path : "fd");
    }
    xsrc *s = &x->src[idx(x, layer, expert)];
    char *path = ext->path ? strdup(ext->path) : NULL;
    if (ext->path && !path) return loip_fail(LOIP_ENOMEM, "expert cache: out of memory");
    if (s->ext.path || s->ext.fd >= 0) x->has_src[layer]--;
    free((char *)s->ext.path);
    s->ext = *ext, s->ext.path = path, s->dtype = dtype;
    memcpy(s->off, offset, sizeof s->off);
    x->has_src[layer]++;
    return LOIP_OK;
}

LOIP_API int loip_experts_set_gating(loip_experts *x, int32_t layer, const loip_tensor *ffn_norm,
                                     const loip_tensor *router) {
    int rc = check_le(x, layer, 0, "gating");
    if (rc) return rc;
    const loip_model_config *c = &x->m->cfg;
    if (!ffn_norm || !router) {
        x->gate_norm[layer] = x->gate_router[layer] = NULL;
        return LOIP_OK;
    }
    if ((rc = loip_check_tensor("gating ffn_norm", ffn_norm, c->dim, 0)) ||
        (rc = loip_check_tensor("gating router", router, c->n_experts, c->dim)))
        return rc;
    x->gate_views[2 * layer] = *ffn_norm, x->gate_views[2 * layer + 1] = *router;
    x->gate_norm[layer] = &x->gate_views[2 * layer], x->gate_router[layer] = &x->gate_views[2 * layer + 1];
    return LOIP_OK;
}

LOIP_API int loip_experts_set_gating_bias(loip_experts *x, int32_t layer, const loip_tensor *router_bias) {
    int rc = check_le(x, layer, 0, "gating bias");
    if (rc) return rc;
    if (!router_bias || !router_bias->data) {
        memset(&x->gate_bias[layer], 0, sizeof x->gate_bias[layer]);
        return LOIP_OK;
    }
    if ((rc = loip_check_tensor("gating router bias", router_bias, x->m->cfg.n_experts, 0))) return rc;
    x->gate_bias[layer] = *router_bias;
    return LOIP_OK;
}

const loip_tensor *loip_experts_gating_bias(const loip_experts *x, int32_t layer) {
    return x->gate_bias[layer].data ? &x->gate_bias[layer] : NULL;
}

static void record(loip_experts *x, int32_t layer, int32_t e, uint64_t t0, uint64_t t1, uint64_t bytes, int pre) {
    if (!x->cfg.event_capacity) return;
    if (x->ev_count == x->cfg.event_capacity) {
        x->st.events_dropped++;
        return;
    }
    x->ev[x->ev_count++] = (loip_runner_event){LOIP_EVENT_LOAD, layer, e, e + 1, t0, t1, bytes, pre, 0};
}

/* The slot to read into now, or -1: empty first, then the policy's victim among slots neither
 * held by this layer run, pinned, loading, nor prefetched for a layer not yet run; a demand read
 * (for_prefetch 0) outranks a guess: when nothing else is left, it takes a prefetched slot, even
 * one still loading (start_read waits for that read first). */
static int32_t victim(loip_experts *x, int for_prefetch) {
    int32_t best = -1;
    for (int pass = 0; pass < 2 && best < 0; pass++) {
        if (pass == 1 && for_prefetch) break;
        for (int32_t i = 0; i < x->n_slots; i++) {
            xslot *s = &x->slots[i];
            if (s->state == XS_EMPTY) return i;
            if (s->pinned || s->held_run == x->run) continue;
            if (pass == 0 && (s->prefetched_for >= 0 || s->state == XS_LOADING)) continue;
            if (s->state == XS_LOADING && s->prefetched_for < 0 && !s->prefetch_read) continue;
            if (best < 0) { best = i; continue; }
            xslot *b = &x->slots[best];
            if (x->cfg.policy == LOIP_EXPERTS_LFU) {
                uint32_t fs = x->freq[idx(x, s->layer, s->expert)], fb = x->freq[idx(x, b->layer, b->expert)];
                if (fs < fb || (fs == fb && s->last_use < b->last_use)) best = i;
            } else if (s->last_use < b->last_use) {
                best = i;
            }
        }
    }
    return best;
}

/* Read expert e of layer l into slot i (evicting what it held). */
static int start_read(loip_experts *x, int32_t i, int32_t layer, int32_t e, int prefetch) {
    xslot *s = &x->slots[i];
    const xsrc *src = &x->src[idx(x, layer, e)];
    if (!src->ext.path && src->ext.fd < 0)
        return loip_fail(LOIP_ESTATE, "expert %d of layer %d is neither bound nor readable (no source)", e, layer);
    if (s->state == XS_LOADING) { /* a guess still landing: its read must end before another starts */
        loip_load_done done = {0};
        uint64_t t0 = loip_now_ns();
        loip_loader_wait(x->l, s->tag, -1, &done);
        x->st.stall_ns += loip_now_ns() - t0;
        if (done.tag == s->tag) record(x, s->layer, s->expert, done.t_submit_ns, done.t_done_ns, done.bytes, s->prefetch_read);
    }
    if (s->layer >= 0) x->where[idx(x, s->layer, s->expert)] = -1;
    uint64_t tag = x->next_tag++;
    int rc = loip_loader_submit(x->l, i, &src->ext, 1, tag);
    if (rc) {
        *s = (xslot){.layer = -1, .expert = -1, .prefetched_for = -1};
        return rc;
    }
    *s = (xslot){.layer = layer, .expert = e, .state = XS_LOADING, .tag = tag, .last_use = ++x->clock,
                 .prefetched_for = prefetch ? layer : -1, .prefetch_read = prefetch};
    x->where[idx(x, layer, e)] = i;
    x->seen[idx(x, layer, e)] = x->epoch[layer] + 1;
    x->st.bytes_read += src->ext.length;
    if (prefetch) x->st.prefetched++;
    else x->st.read++;
    return LOIP_OK;
}

int loip_experts_acquire(loip_experts *x, int32_t layer, int32_t e, int32_t *slot, int *state) {
    int32_t i = x->where[idx(x, layer, e)];
    *slot = -1;
    if (i >= 0) {
        xslot *s = &x->slots[i];
        if (s->prefetched_for >= 0) x->st.prefetch_hits++, x->run_hits++;
        x->st.cache_hits++;
        s->prefetched_for = -1, s->held_run = x->run, s->last_use = ++x->clock;
        *state = s->state, *slot = i;
        return LOIP_OK;
    }
    if ((i = victim(x, 0)) < 0) return LOIP_OK;
    int rc = start_read(x, i, layer, e, 0);
    if (rc) return rc;
    x->slots[i].held_run = x->run;
    *state = XS_LOADING, *slot = i;
    return LOIP_OK;
}

void loip_experts_routed(loip_experts *x, int32_t layer, const int32_t *experts, int32_t n, int32_t n_bound) {
    for (int32_t k = 0; k < n; k++) x->freq[idx(x, layer, experts[k])]++;
    x->st.routed += (uint64_t)n;
    x->st.bound += (uint64_t)n_bound;
    /* the layer has run: what was prefetched for it and not chosen is an ordinary cached expert
     * now; the share of its predictions the router confirmed goes into its running average */
    int32_t wrong = 0;
    for (int32_t i = 0; i < x->n_slots; i++)
        if (x->slots[i].prefetched_for == layer) x->slots[i].prefetched_for = -1, wrong++;
    if (x->run_hits + wrong > 0)
        x->accuracy[layer] = 0.75f * x->accuracy[layer] + 0.25f * (float)x->run_hits / (float)(x->run_hits + wrong);
    x->run_hits = 0;
}

int loip_experts_wait(loip_experts *x, int32_t slot, int32_t timeout_ms) {
    xslot *s = &x->slots[slot];
    if (s->state != XS_LOADING) return LOIP_OK;
    loip_load_done done = {0};
    int rc = loip_loader_wait(x->l, s->tag, timeout_ms, &done);
    if (rc == LOIP_ETIMEDOUT) return rc;
    if (done.tag == s->tag) record(x, s->layer, s->expert, done.t_submit_ns, done.t_done_ns, done.bytes, s->prefetch_read);
    if (rc) {
        int32_t layer = s->layer, e = s->expert;
        x->where[idx(x, layer, e)] = -1;
        *s = (xslot){.layer = -1, .expert = -1, .prefetched_for = -1};
        return loip_fail(rc, "expert %d of layer %d: %s", e, layer, done.message[0] ? done.message : "read failed");
    }
    s->state = XS_READY;
    return LOIP_OK;
}

void loip_experts_tensors(loip_experts *x, int32_t slot, loip_tensor out[LOIP_EXPERT_PARTS]) {
    const xslot *s = &x->slots[slot];
    const xsrc *src = &x->src[idx(x, s->layer, s->expert)];
    const uint8_t *base = loip_loader_slot_data(x->l, slot);
    for (int p = 0; p < LOIP_EXPERT_PARTS; p++) {
        int64_t rows, cols;
        loip_expert_shape(&x->m->cfg, p, &rows, &cols);
        out[p] = (loip_tensor){.data = base + src->off[p], .dtype = src->dtype, .ndim = 2, .shape = {rows, cols}};
    }
}

void loip_experts_release(loip_experts *x, int32_t slot) { x->slots[slot].held_run = 0; }

int loip_experts_holds(const loip_experts *x, int32_t layer, int32_t e) { return x->where[idx(x, layer, e)] >= 0; }

int loip_experts_was_prefetch(const loip_experts *x, int32_t slot) { return x->slots[slot].prefetch_read; }

void loip_experts_layer_done(loip_experts *x, int32_t layer) {
    if (x->cfg.policy != LOIP_EXPERTS_ALL || !x->has_src[layer]) return;
    /* the baseline reads every expert of the layer: those neither routed nor prefetched now,
     * one at a time through the slots no one holds (read, then dropped) */
    for (int32_t e = 0; e < x->n_experts; e++) {
        if (x->seen[idx(x, layer, e)] == x->epoch[layer] + 1 || x->where[idx(x, layer, e)] >= 0 ||
            loip_expert_w(x->m, layer, e, LOIP_EXPERT_GATE)->data)
            continue; /* (read now, in a slot, or bound: in memory) */
        int32_t i = victim(x, 0);
        if (i < 0 || start_read(x, i, layer, e, 1)) break; /* (a read that fails here costs the baseline nothing) */
        uint64_t t0 = loip_now_ns();
        loip_experts_wait(x, i, -1);
        x->st.stall_ns += loip_now_ns() - t0;
    }
    for (int32_t i = 0; i < x->n_slots; i++) { /* the baseline keeps nothing for the next run */
        xslot *s = &x->slots[i];
        if (s->layer != layer || s->held_run == x->run || s->pinned) continue;
        if (s->state == XS_LOADING) { /* (as a dense block: read whole before the layer is done) */
            uint64_t t0 = loip_now_ns();
            loip_experts_wait(x, i, -1);
            x->st.stall_ns += loip_now_ns() - t0;
        }
        x->where[idx(x, s->layer, s->expert)] = -1;
        *s = (xslot){.layer = -1, .expert = -1, .prefetched_for = -1};
    }
    x->epoch[layer]++;
}

int loip_experts_reads_all(const loip_experts *x) { return x->cfg.policy == LOIP_EXPERTS_ALL; }

void loip_experts_next_run(loip_experts *x) { x->run++; }

void loip_experts_add_stall(loip_experts *x, uint64_t ns) { x->st.stall_ns += ns; }

int32_t loip_experts_prefetch_depth(const loip_experts *x) { return x->cfg.prefetch; }

int loip_experts_predicts(loip_experts *x, int32_t layer, const loip_tensor **ffn_norm,
                          const loip_tensor **router) {
    *ffn_norm = x->gate_norm[layer], *router = x->gate_router[layer];
    if (x->cfg.policy == LOIP_EXPERTS_ALL) return x->has_src[layer] > 0; /* (no router needed) */
    if (!x->has_src[layer] || !x->gate_router[layer]) return 0;
    if (x->cfg.prefetch_min_accuracy > 0.0f && x->accuracy[layer] < x->cfg.prefetch_min_accuracy) {
        /* its predictions do not pay: a probe now and then tells when they would again */
        int32_t every = x->cfg.prefetch_probe_every > 0 ? x->cfg.prefetch_probe_every : 8;
        if (++x->unpredicted[layer] % (uint32_t)every != 0) {
            x->st.prefetch_skipped++;
            return 0;
        }
    }
    return 1;
}

void loip_experts_prefetch(loip_experts *x, int32_t layer, const int32_t *experts, int32_t n) {
    for (int32_t k = 0; k < n; k++) {
        int32_t e = experts[k];
        if (loip_expert_w(x->m, layer, e, LOIP_EXPERT_GATE)->data || x->where[idx(x, layer, e)] >= 0) continue;
        const xsrc *src = &x->src[idx(x, layer, e)];
        if (!src->ext.path && src->ext.fd < 0) continue;
        int32_t i = victim(x, 1);
        if (i < 0) return;
        if (start_read(x, i, layer, e, 1)) return; /* a guess that cannot be read is dropped: the demand read says why */
    }
}

LOIP_API int loip_experts_pin(loip_experts *x, int32_t layer, int32_t expert) {
    int rc = check_le(x, layer, expert, "pin");
    if (rc) return rc;
    int32_t i = x->where[idx(x, layer, expert)];
    if (i < 0) {
        int32_t best = -1;
        for (int32_t k = 0; k < x->n_slots && best < 0; k++)
            if (x->slots[k].state == XS_EMPTY) best = k;
        for (int32_t k = 0; k < x->n_slots && best < 0; k++)
            if (!x->slots[k].pinned && x->slots[k].state != XS_LOADING) best = k;
        if (best < 0)
            return loip_fail(LOIP_ENOMEM, "expert cache: every one of its %d slots is pinned: expert %d of layer %d "
                             "cannot be", x->n_slots, expert, layer);
        if ((rc = start_read(x, best, layer, expert, 0))) return rc;
        x->st.read--, x->st.bytes_read -= x->src[idx(x, layer, expert)].ext.length; /* a pin is no routed read */
        i = best;
    }
    if ((rc = loip_experts_wait(x, i, -1))) return rc;
    x->slots[i].pinned = 1;
    return LOIP_OK;
}

LOIP_API int loip_experts_clear(loip_experts *x) {
    drain(x);
    for (int32_t i = 0; i < x->n_slots; i++) {
        xslot *s = &x->slots[i];
        if (s->layer >= 0) x->where[idx(x, s->layer, s->expert)] = -1;
        *s = (xslot){.layer = -1, .expert = -1, .prefetched_for = -1};
    }
    return LOIP_OK;
}

LOIP_API loip_loader *loip_experts_loader(loip_experts *x) { return x->l; }

LOIP_API int loip_experts_stats(loip_experts *x, loip_experts_stats_t *out) {
    *out = x->st;
    return LOIP_OK;
}

LOIP_API int loip_experts_events(loip_experts *x, loip_runner_event *out, int32_t cap) {
    return loip_events_take(x->ev, &x->ev_count, out, cap);
}
