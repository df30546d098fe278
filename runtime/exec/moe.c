/* The mixture-of-experts MLP (loip.h, loip_model_config): the router's softmax picks each
 * token's top-k experts; the rows are gathered by expert so that an expert's weights are read
 * once for all the rows that chose it; each expert's outputs land in the row's own place for
 * that rank, and a row's sum is taken in rank order at the end. So the result does not depend on
 * which experts were in memory, in the cache, or read while others computed: every one of them
 * is computed, in whatever order their bytes arrive, and summed the same way. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/pool.h"
#include "core/runtime.h"
#include "cpu/kernels.h"
#include "exec/arrays.h"
#include "exec/experts.h"
#include "exec/model.h"
#include "exec/moe.h"
#include "exec/ops.h"
#include "exec/session.h"

/* A session's scratch for its MoE layers (n_experts E > 0, k = n_experts_used), sized for its
 * batch of max_batch rows. */
struct loip_moe {
    loip_experts *experts; /* unbound experts are read through it; NULL: none */
    float *logits;      /* (max_batch, E) router logits */
    float *w;           /* (max_batch, k) each row's chosen experts' weights, by rank */
    float *x;           /* (max_batch * k, dim) xb rows gathered by expert; the shared expert's output */
    float *y;           /* (max_batch * k, dim) the experts' outputs, in the same places */
    float *h;           /* (max_batch * k, expert_dim) gate, then silu(gate) * up */
    float *h2;          /* (max_batch * k, expert_dim) up */
    float *sgate;       /* (max_batch) the shared expert's gate logits */
    int32_t *sel;       /* (max_batch, k) each row's chosen experts, by rank */
    int32_t *place;     /* (max_batch, k) where (row, rank) was gathered */
    int32_t *count, *start, *fill; /* (E) rows per expert, their first gathered row */
    int32_t *list, *now, *slot, *done; /* (E) the chosen experts and their progress */
    int32_t *range_start, *range_count; /* (E) row ranges computed at once */
    /* outside the budget's sizes, as the session's tables */
    loip_tensor (*views)[LOIP_EXPERT_PARTS]; /* (E) the tensors of experts computed at once */
    loip_linear_job *jobs;                   /* (2E + 1) their linear jobs */
    uint64_t *routed;   /* (n_layers, E) tokens routed to each expert (loip_session_take_routing) */
};

enum { MOE_MAX_ARRAYS = 21 };

/* The scratch's arrays: all but the last three charged to "activations" with the session's. */
static size_t moe_arrays(const loip_model_config *c, uint64_t B, loip_array *t) {
    uint64_t E = (uint64_t)c->n_experts, Bk = B * (uint64_t)c->n_experts_used;
    size_t n = 0;
#define MOE_ARRAY(field, count, flags) \
    t[n++] = (loip_array){offsetof(loip_moe, field), sizeof *((loip_moe *)0)->field, (count), (flags)}
    MOE_ARRAY(logits, B * E, LOIP_ARRAY_COUNTED);
    MOE_ARRAY(w, Bk, LOIP_ARRAY_COUNTED);
    MOE_ARRAY(x, Bk * c->dim, LOIP_ARRAY_COUNTED);
    MOE_ARRAY(y, Bk * c->dim, LOIP_ARRAY_COUNTED);
    MOE_ARRAY(h, Bk * c->expert_dim, LOIP_ARRAY_COUNTED);
    MOE_ARRAY(h2, Bk * c->expert_dim, LOIP_ARRAY_COUNTED);
    MOE_ARRAY(sgate, B, LOIP_ARRAY_COUNTED);
    MOE_ARRAY(sel, Bk, LOIP_ARRAY_COUNTED);
    MOE_ARRAY(place, Bk, LOIP_ARRAY_COUNTED);
    MOE_ARRAY(count, E, LOIP_ARRAY_COUNTED);
    MOE_ARRAY(start, E, LOIP_ARRAY_COUNTED);
    MOE_ARRAY(fill, E, LOIP_ARRAY_COUNTED);
    MOE_ARRAY(list, E, LOIP_ARRAY_COUNTED);
    MOE_ARRAY(now, E, LOIP_ARRAY_COUNTED);
    MOE_ARRAY(slot, E, LOIP_ARRAY_COUNTED);
    MOE_ARRAY(done, E, LOIP_ARRAY_COUNTED);
    MOE_ARRAY(range_start, E, LOIP_ARRAY_COUNTED);
    MOE_ARRAY(range_count, E, LOIP_ARRAY_COUNTED);
    MOE_ARRAY(views, E + 1, LOIP_ARRAY_ZERO);
    MOE_ARRAY(jobs, 2 * E + 1, LOIP_ARRAY_ZERO);
    MOE_ARRAY(routed, (uint64_t)c->n_layers * E + 1, LOIP_ARRAY_ZERO);
#undef MOE_ARRAY
    return n;
}

uint64_t loip_moe_scratch_bytes(const loip_model_config *c, int32_t max_batch) {
    if (!c->n_experts) return 0;
    loip_array t[MOE_MAX_ARRAYS];
    return loip_arrays_bytes(t, moe_arrays(c, (uint64_t)max_batch, t));
}

int loip_moe_new(const loip_model_config *c, int32_t max_batch, loip_moe **out) {
    *out = NULL;
    if (!c->n_experts) return LOIP_OK;
    loip_moe *mo = calloc(1, sizeof *mo);
    if (!mo) return loip_fail(LOIP_ENOMEM, "session: out of memory");
    loip_array t[MOE_MAX_ARRAYS];
    uint64_t failed;
    if (loip_arrays_alloc(mo, t, moe_arrays(c, (uint64_t)max_batch, t), &failed)) {
        loip_moe_free(mo);
        return loip_fail(LOIP_ENOMEM, "session: cannot allocate %llu bytes for the experts' scratch (batch %d)",
                         (unsigned long long)failed, max_batch);
    }
    *out = mo;
    return LOIP_OK;
}

void loip_moe_free(loip_moe *mo) {
    if (!mo) return;
    loip_array t[MOE_MAX_ARRAYS];
    const loip_model_config none = {0}; /* (freeing needs only where the pointers are) */
    loip_arrays_free(mo, t, moe_arrays(&none, 0, t));
    free(mo);
}

/* Each row's top k router logits (ties: the lower index), as transformers' and llama.cpp's
 * routers choose them, weighted by the softmax over all logits (renormalised when asked) or,
 * LOIP_GATING_TOPK_SOFTMAX, by the softmax over the k chosen ones (gpt-oss). */
static void route(const loip_model_config *c, const float *logits, int n, int32_t *sel, float *sel_w) {
    int E = c->n_experts, k = c->n_experts_used;
    for (int t = 0; t < n; t++) {
        const float *z = logits + (size_t)t * E;
        float maxv = z[0], sum = 0.0f;
        for (int e = 1; e < E; e++) if (z[e] > maxv) maxv = z[e];
        for (int e = 0; e < E; e++) sum += expf(z[e] - maxv);
        int32_t *ids = sel + (size_t)t * k;
        float *w = sel_w + (size_t)t * k;
        for (int j = 0; j < k; j++) { /* selection: k is small */
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= ids[i] == e;
                if (!taken && (best < 0 || z[e] > z[best])) best = e;
            }
            ids[j] = best;
            w[j] = expf(z[best] - maxv) / sum;
        }
        if (c->moe_gating == LOIP_GATING_TOPK_SOFTMAX) { /* ids[0] holds the largest */
            float s = 0.0f;
            for (int j = 0; j < k; j++) s += w[j] = expf(z[ids[j]] - z[ids[0]]);
            for (int j = 0; j < k; j++) w[j] /= s;
            continue;
        }
        if (c->norm_topk_prob) {
            float s = 0.0f;
            for (int j = 0; j < k; j++) s += w[j];
            for (int j = 0; j < k; j++) w[j] /= s;
        }
    }
}

typedef struct {
    loip_session *s;
    const int32_t *list; /* (m) the experts */
    int m, layer, down;  /* down: the down biases into y, else gate's into h and up's into h2 */
} expert_bias_job;

/* The experts' biases (expert_bias: row e of the layer's LOIP_W_EXPERT_*_BIAS) added to their
 * gathered rows, each thread a share of every expert's rows. */
static void expert_bias_task(void *p, int ith, int nth) {
    expert_bias_job *j = p;
    loip_session *s = j->s;
    loip_moe *mo = s->moe;
    const loip_model_config *c = &s->m->cfg;
    for (int i = 0; i < j->m; i++) {
        int32_t e = j->list[i], at = mo->start[e];
        size_t b, end;
        loip_split((size_t)mo->count[e], 1, ith, nth, &b, &end);
        for (int part = 0; part < (j->down ? 1 : 2); part++) {
            int which = j->down ? LOIP_W_EXPERT_DOWN_BIAS : part ? LOIP_W_EXPERT_UP_BIAS : LOIP_W_EXPERT_GATE_BIAS;
            const loip_tensor *bias = loip_layer_w(s->m, j->layer, which);
            size_t width = j->down ? (size_t)c->dim : (size_t)c->expert_dim;
            float *rows = j->down ? mo->y : part ? mo->h2 : mo->h;
            for (size_t r = b; r < end; r++) {
                float *y = rows + ((size_t)at + r) * width;
                for (size_t x = 0; x < width; x++) y[x] += loip_tensor_elem(bias, (size_t)e * width + x);
            }
        }
    }
}

/* Experts list[0..m) (their tensors in w[i]) over their gathered rows: gate and up in one
 * dispatch, (their biases,) the gated unit, down in one (, its bias). */
static void run_experts(loip_session *s, int l, const int32_t *list, int m, const loip_tensor (*w)[LOIP_EXPERT_PARTS]) {
    loip_moe *mo = s->moe;
    const loip_model_config *c = &s->m->cfg;
    if (m == 0) return;
    loip_linear_job *jobs = mo->jobs;
    int nj = 0;
    for (int i = 0; i < m; i++) {
        int32_t e = list[i], at = mo->start[e], rows = mo->count[e];
        jobs[nj++] = loip_linear_of(&w[i][LOIP_EXPERT_GATE], mo->x + (size_t)at * c->dim, mo->h + (size_t)at * c->expert_dim, rows);
        jobs[nj++] = loip_linear_of(&w[i][LOIP_EXPERT_UP], mo->x + (size_t)at * c->dim, mo->h2 + (size_t)at * c->expert_dim, rows);
        mo->range_start[i] = at, mo->range_count[i] = rows;
    }
    jobs[nj] = (loip_linear_job){0};
    loip_linear_run(s->pool, jobs);
    expert_bias_job bj = {.s = s, .list = list, .m = m, .layer = l, .down = 0};
    if (c->expert_bias) loip_pool_run(s->pool, expert_bias_task, &bj);
    loip_glu_run(s->pool, c, mo->h, mo->h2, mo->range_start, mo->range_count, m, c->expert_dim);
    nj = 0;
    for (int i = 0; i < m; i++) {
        int32_t e = list[i], at = mo->start[e], rows = mo->count[e];
        jobs[nj++] = loip_linear_of(&w[i][LOIP_EXPERT_DOWN], mo->h + (size_t)at * c->expert_dim, mo->y + (size_t)at * c->dim, rows);
    }
    jobs[nj] = (loip_linear_job){0};
    loip_linear_run(s->pool, jobs);
    bj.down = 1;
    if (c->expert_bias) loip_pool_run(s->pool, expert_bias_task, &bj);
}

/* Routes of the prepared batch's n rows of xb: sel/w, and the rows gathered by expert
 * into x (start/count per expert, place: each (row, rank)'s gathered row);
 * returns how many experts were chosen, listed in list in ascending order. */
static int gather(loip_session *s, int l, int n) {
    loip_moe *mo = s->moe;
    const loip_model_config *c = &s->m->cfg;
    int E = c->n_experts, k = c->n_experts_used, m = 0;
    route(c, mo->logits, n, mo->sel, mo->w);
    memset(mo->count, 0, (size_t)E * sizeof(int32_t));
    for (int i = 0; i < n * k; i++) mo->count[mo->sel[i]]++;
    for (int e = 0; e < E; e++) mo->routed[(size_t)l * E + e] += (uint64_t)mo->count[e];
    for (int e = 0, at = 0; e < E; e++) {
        mo->start[e] = at;
        at += mo->count[e];
        if (mo->count[e]) mo->list[m++] = e;
    }
    memset(mo->fill, 0, (size_t)E * sizeof(int32_t));
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            int32_t e = mo->sel[t * k + j], row = mo->start[e] + mo->fill[e]++;
            mo->place[t * k + j] = row;
            memcpy(mo->x + (size_t)row * c->dim, s->xb + (size_t)t * c->dim, (size_t)c->dim * sizeof(float));
        }
    return m;
}

static int expert_bound(const loip_model *m, int l, int e) {
    for (int p = 0; p < LOIP_EXPERT_PARTS; p++)
        if (!loip_expert_w(m, l, e, p)->data) return 0;
    return 1;
}

/* A layer run that failed part way: the reads it started are waited for (their status
 * dropped: a failed one empties its slot) and its slots released, so that nothing is left
 * loading or held for a later run to trip on; then the error. */
static int abandon(loip_experts *x, int l, const int32_t *list, const int32_t *slot, int m, int routed, int rc) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", loip_last_error());
    if (x) {
        for (int i = 0; i < m; i++)
            if (slot[i] >= 0) {
                loip_experts_wait(x, slot[i], -1);
                loip_experts_release(x, slot[i]);
            }
        if (!routed) loip_experts_routed(x, l, list, m, 0);
    }
    return loip_fail(rc, "%s", msg);
}

/* The start of a layer run: the bound experts (*n_now of them in now and views), and every other
 * chosen one's slot asked for (reads start), the experts already in a slot first, so that a read
 * for another never takes their slot; *routed once the cache has been told the layer's choice. */
static int start_chosen(loip_session *s, int l, int m, int *n_now, int *routed) {
    const loip_model *mod = s->m;
    loip_moe *mo = s->moe;
    loip_experts *x = mo->experts;
    int32_t *list = mo->list, *slot = mo->slot, *retried = mo->fill;
    int n_bound = 0, rc;
    *n_now = 0, *routed = 0;
    for (int i = 0; i < m; i++) {
        int32_t e = list[i];
        slot[i] = -1, retried[i] = 0;
        if (expert_bound(mod, l, e)) {
            for (int p = 0; p < LOIP_EXPERT_PARTS; p++) mo->views[*n_now][p] = *loip_expert_w(mod, l, e, p);
            mo->now[(*n_now)++] = e, n_bound++;
            slot[i] = -3; /* done */
            continue;
        }
        if (!x)
            return loip_fail(LOIP_ESTATE, "expert %d of layer %d is not in memory and the session has no expert cache "
                             "to read it", e, l);
    }
    if (!x) return LOIP_OK;
    loip_experts_next_run(x);
    for (int pass = 0; pass < 2; pass++) /* those in a slot, then the others */
        for (int i = 0; i < m; i++) {
            if (slot[i] != -1 || loip_experts_holds(x, l, list[i]) != (pass == 0)) continue;
            int state;
            if ((rc = loip_experts_acquire(x, l, list[i], &slot[i], &state)))
                return abandon(x, l, list, slot, m, *routed, rc);
        }
    loip_experts_routed(x, l, list, m, n_bound);
    *routed = 1;
    return LOIP_OK;
}

/* The chosen experts whose reads have landed (*n_now of them in now and views, their indices in
 * done); *left: those not computed yet. A slot refused before is asked for again; a prefetched
 * read that failed is read again once, on demand. */
static int take_landed(loip_session *s, int l, int m, int routed, int *n_now, int *left) {
    loip_moe *mo = s->moe;
    loip_experts *x = mo->experts;
    int32_t *list = mo->list, *slot = mo->slot, *retried = mo->fill;
    int rc;
    *n_now = 0, *left = 0;
    for (int i = 0; i < m; i++) {
        if (slot[i] == -3) continue;
        (*left)++;
        if (slot[i] == -1) { /* no slot was free: ask again now that some are released */
            int state;
            if ((rc = loip_experts_acquire(x, l, list[i], &slot[i], &state)))
                return abandon(x, l, list, slot, m, routed, rc);
            if (slot[i] < 0) continue;
        }
        int guess = loip_experts_was_prefetch(x, slot[i]);
        rc = loip_experts_wait(x, slot[i], 0);
        if (rc == LOIP_ETIMEDOUT) continue;
        if (rc && guess && !retried[i]) { /* (its slot is empty again: read it on demand) */
            slot[i] = -1, retried[i] = 1;
            continue;
        }
        if (rc) {
            slot[i] = -1; /* (emptied by the wait) */
            return abandon(x, l, list, slot, m, routed, rc);
        }
        loip_experts_tensors(x, slot[i], mo->views[*n_now]);
        mo->now[*n_now] = list[i], mo->done[(*n_now)++] = i;
    }
    return LOIP_OK;
}

/* Nothing has landed: block on the first chosen expert still loading (a failed guess is read
 * again on demand; every slot pinned is an error naming the expert). */
static int wait_first(loip_session *s, int l, int m, int routed) {
    loip_moe *mo = s->moe;
    loip_experts *x = mo->experts;
    int32_t *list = mo->list, *slot = mo->slot, *retried = mo->fill;
    int first = -1, stuck = -1;
    for (int i = 0; i < m && first < 0; i++)
        if (slot[i] >= 0) first = i;
        else if (slot[i] == -1 && stuck < 0) stuck = i;
    if (first < 0) {
        if (stuck >= 0 && retried[stuck] == 1) { /* (a failed guess: its slot is free, asked for again) */
            retried[stuck] = 2;
            return LOIP_OK;
        }
        return abandon(x, l, list, slot, m, routed,
                       loip_fail(LOIP_ESTATE, "layer %d: no slot of the expert cache can take expert %d "
                                 "(every slot is pinned)", l, list[stuck]));
    }
    uint64_t t0 = loip_now_ns();
    int guess = loip_experts_was_prefetch(x, slot[first]);
    int rc = loip_experts_wait(x, slot[first], -1);
    loip_experts_add_stall(x, loip_now_ns() - t0);
    if (rc && guess && !retried[first]) {
        slot[first] = -1, retried[first] = 1;
        return LOIP_OK;
    }
    if (rc) {
        slot[first] = -1;
        return abandon(x, l, list, slot, m, routed, rc);
    }
    return LOIP_OK;
}

/* Every chosen expert computed: the bound ones and those cached at once, the rest as their reads
 * land (several at a time when several have), slots held only while their expert computes.
 * (retried, in start_chosen and after: gather's fill, free once the rows are gathered) */
static int compute_chosen(loip_session *s, int l, int m) {
    loip_moe *mo = s->moe;
    const loip_tensor (*w)[LOIP_EXPERT_PARTS] = (const loip_tensor(*)[LOIP_EXPERT_PARTS])mo->views;
    int n_now, routed, left, rc = start_chosen(s, l, m, &n_now, &routed);
    if (rc) return rc;
    run_experts(s, l, mo->now, n_now, w);
    /* the rest: what has landed, computed together; wait only when nothing has */
    for (;;) {
        if ((rc = take_landed(s, l, m, routed, &n_now, &left))) return rc;
        if (left == 0) {
            if (mo->experts) loip_experts_layer_done(mo->experts, l);
            return LOIP_OK;
        }
        if (n_now == 0) {
            if ((rc = wait_first(s, l, m, routed))) return rc;
            continue;
        }
        run_experts(s, l, mo->now, n_now, w);
        for (int i = 0; i < n_now; i++) {
            int k = mo->done[i];
            loip_experts_release(mo->experts, mo->slot[k]);
            mo->slot[k] = -3;
        }
    }
}

typedef struct {
    loip_session *s;
    int n;
    const float *shared;  /* (n, dim) the shared expert's output, NULL: none */
    const float *sgate;   /* (n) its gate logits, NULL: ungated */
} combine_job;

/* xb2[t] = sum over ranks j of w[t, j] * y[place(t, j)] (+ the shared expert's, gated). */
static void combine_task(void *p, int ith, int nth) {
    combine_job *j = p;
    loip_session *s = j->s;
    loip_moe *mo = s->moe;
    const loip_model_config *c = &s->m->cfg;
    int k = c->n_experts_used, dim = c->dim;
    size_t b, e;
    loip_split((size_t)j->n, 1, ith, nth, &b, &e);
    for (size_t t = b; t < e; t++) {
        float *o = s->xb2 + t * dim;
        memset(o, 0, (size_t)dim * sizeof(float));
        for (int r = 0; r < k; r++) {
            float w = mo->w[t * k + r];
            const float *y = mo->y + (size_t)mo->place[t * k + r] * dim;
            for (int i = 0; i < dim; i++) o[i] += w * y[i];
        }
        if (j->shared) {
            float g = j->sgate ? 1.0f / (1.0f + expf(-j->sgate[t])) : 1.0f;
            const float *y = j->shared + t * dim;
            for (int i = 0; i < dim; i++) o[i] += g * y[i];
        }
    }
}

/* logits (n rows of n_experts) += the layer's router bias (router_bias): the bound one, or for
 * pre-gating (x) the expert cache's copy, as its router is (the block's own views may be stale
 * while it is offloaded), else none. */
static void add_router_bias(const loip_model *m, const loip_experts *x, int l, float *logits, int n) {
    const loip_tensor *b = x ? loip_experts_gating_bias(x, l) : loip_layer_w(m, l, LOIP_W_ROUTER_BIAS);
    int E = m->cfg.n_experts;
    if (!m->cfg.router_bias || !b || !b->data) return;
    for (int t = 0; t < n; t++)
        for (int e = 0; e < E; e++) logits[(size_t)t * E + e] += loip_tensor_elem(b, (size_t)e);
}

int loip_moe_ffn(loip_session *s, int l, int n) {
    loip_moe *mo = s->moe;
    const loip_model *m = s->m;
    const loip_model_config *c = &m->cfg;
    loip_linear_job r[2] = {loip_linear_of(loip_layer_w(m, l, LOIP_W_ROUTER), s->xb, mo->logits, n), {0}};
    loip_linear_run(s->pool, r);
    add_router_bias(m, NULL, l, mo->logits, n);
    int chosen = gather(s, l, n);
    int rc = compute_chosen(s, l, chosen);
    if (rc) return rc;
    combine_job cj = {.s = s, .n = n};
    if (c->shared_expert) { /* a dense SwiGLU of hidden_dim over every row; its output in x (free now) */
        loip_linear_job gu[4] = {loip_linear_of(loip_layer_w(m, l, LOIP_W_GATE), s->xb, s->hb, n),
                                 loip_linear_of(loip_layer_w(m, l, LOIP_W_UP), s->xb, s->hb2, n), {0}, {0}};
        if (c->shared_expert_gate) gu[2] = loip_linear_of(loip_layer_w(m, l, LOIP_W_SHARED_GATE), s->xb, mo->sgate, n);
        loip_linear_run(s->pool, gu);
        int32_t start = 0, count = n;
        loip_swiglu_run(s->pool, s->hb, s->hb2, &start, &count, 1, c->hidden_dim);
        loip_linear_job down[2] = {loip_linear_of(loip_layer_w(m, l, LOIP_W_DOWN), s->hb, mo->x, n), {0}};
        loip_linear_run(s->pool, down);
        cj.shared = mo->x, cj.sgate = c->shared_expert_gate ? mo->sgate : NULL;
    }
    loip_pool_run(s->pool, combine_task, &cj);
    return LOIP_OK;
}

void loip_moe_predict(loip_session *s, int l, const float *hidden, int n) {
    loip_moe *mo = s->moe;
    loip_experts *x = mo ? mo->experts : NULL;
    const loip_model_config *c = &s->m->cfg;
    if (!x) return;
    int depth = loip_experts_prefetch_depth(x);
    const loip_kernels *k = loip_kernels_current();
    for (int d = 0; d < depth && l + d < c->n_layers; d++) {
        const loip_tensor *norm, *router;
        if (!loip_experts_predicts(x, l + d, &norm, &router)) continue;
        if (loip_experts_reads_all(x)) { /* the baseline: every expert, no prediction */
            for (int e = 0; e < c->n_experts; e++) mo->list[e] = e;
            loip_experts_prefetch(x, l + d, mo->list, c->n_experts);
            continue;
        }
        /* the layer's ffn_norm and router over this layer's input: its x and logits are free
         * until the MLP block runs */
        for (int t = 0; t < n; t++)
            k->rmsnorm(mo->x + (size_t)t * c->dim, hidden + (size_t)t * c->dim, norm->data, norm->dtype,
                       (size_t)c->dim, c->norm_eps);
        loip_linear_job r[2] = {loip_linear_of(router, mo->x, mo->logits, n), {0}};
        loip_linear_run(s->pool, r);
        add_router_bias(s->m, x, l + d, mo->logits, n);
        route(c, mo->logits, n, mo->sel, mo->w);
        int m = 0;
        memset(mo->count, 0, (size_t)c->n_experts * sizeof(int32_t));
        for (int i = 0; i < n * c->n_experts_used; i++)
            if (mo->count[mo->sel[i]]++ == 0) mo->list[m++] = mo->sel[i];
        loip_experts_prefetch(x, l + d, mo->list, m);
    }
}

LOIP_API int loip_session_take_routing(loip_session *s, uint64_t *out, int64_t cap) {
    loip_moe *mo = s->moe;
    const loip_model_config *c = &s->m->cfg;
    int64_t n = (int64_t)c->n_layers * c->n_experts;
    if (n == 0) return loip_fail(LOIP_EINVAL, "session: the model has no experts to count the routing of");
    if (cap < n) return loip_fail(LOIP_EINVAL, "session: the routing needs %lld entries, got %lld", (long long)n, (long long)cap);
    for (int64_t i = 0; i < n; i++) out[i] += mo->routed[i];
    memset(mo->routed, 0, (size_t)n * sizeof *mo->routed);
    return LOIP_OK;
}

LOIP_API int loip_session_set_experts(loip_session *s, loip_experts *x) {
    if (x && !s->m->cfg.n_experts) return loip_fail(LOIP_EINVAL, "session: an expert cache for a model without experts");
    if (s->moe) s->moe->experts = x;
    return LOIP_OK;
}
