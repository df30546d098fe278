/* The mixture-of-experts MLP (loip.h, loip_model_config): the router's softmax picks each
 * token's top-k experts; the rows are gathered by expert so that an expert's weights are read
 * once for all the rows that chose it; each expert's outputs land in the row's own place for
 * that rank, and a row's sum is taken in rank order at the end. So the result does not depend on
 * which experts were in memory, in the cache, or read while others computed: every one of them
 * is computed, in whatever order their bytes arrive, and summed the same way. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/core.h"
#include "core/pool.h"
#include "core/runtime.h"
#include "cpu/kernels.h"
#include "exec/experts.h"
#include "exec/model.h"
#include "exec/moe.h"
#include "exec/ops.h"
#include "exec/session.h"

/* Softmax over each row's router logits and its top k (ties: the lower index), as
 * transformers' and llama.cpp's routers choose them; the weights renormalised when asked. */
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
        if (c->norm_topk_prob) {
            float s = 0.0f;
            for (int j = 0; j < k; j++) s += w[j];
            for (int j = 0; j < k; j++) w[j] /= s;
        }
    }
}

/* Experts list[0..m) (their tensors in w[i]) over their gathered rows: gate and up in one
 * dispatch, silu(gate) * up, down in one. */
static void run_experts(loip_session *s, const int32_t *list, int m, const loip_tensor (*w)[LOIP_EXPERT_PARTS]) {
    const loip_model_config *c = &s->m->cfg;
    if (m == 0) return;
    loip_linear_job *jobs = s->moe_jobs;
    int nj = 0;
    for (int i = 0; i < m; i++) {
        int32_t e = list[i], at = s->moe_start[e], rows = s->moe_count[e];
        jobs[nj++] = loip_linear_of(&w[i][LOIP_EXPERT_GATE], s->moe_x + (size_t)at * c->dim, s->moe_h + (size_t)at * c->expert_dim, rows);
        jobs[nj++] = loip_linear_of(&w[i][LOIP_EXPERT_UP], s->moe_x + (size_t)at * c->dim, s->moe_h2 + (size_t)at * c->expert_dim, rows);
        s->moe_range_start[i] = at, s->moe_range_count[i] = rows;
    }
    jobs[nj] = (loip_linear_job){0};
    loip_linear_run(s->pool, jobs);
    loip_swiglu_run(s->pool, s->moe_h, s->moe_h2, s->moe_range_start, s->moe_range_count, m, c->expert_dim);
    nj = 0;
    for (int i = 0; i < m; i++) {
        int32_t e = list[i], at = s->moe_start[e], rows = s->moe_count[e];
        jobs[nj++] = loip_linear_of(&w[i][LOIP_EXPERT_DOWN], s->moe_h + (size_t)at * c->expert_dim, s->moe_y + (size_t)at * c->dim, rows);
    }
    jobs[nj] = (loip_linear_job){0};
    loip_linear_run(s->pool, jobs);
}

/* Routes of the prepared batch's n rows of xb: moe_sel/moe_w, and the rows gathered by expert
 * into moe_x (moe_start/moe_count per expert, moe_place: each (row, rank)'s gathered row);
 * returns how many experts were chosen, listed in moe_list in ascending order. */
static int gather(loip_session *s, int l, int n) {
    const loip_model_config *c = &s->m->cfg;
    int E = c->n_experts, k = c->n_experts_used, m = 0;
    route(c, s->moe_logits, n, s->moe_sel, s->moe_w);
    memset(s->moe_count, 0, (size_t)E * sizeof(int32_t));
    for (int i = 0; i < n * k; i++) s->moe_count[s->moe_sel[i]]++;
    for (int e = 0; e < E; e++) s->moe_routed[(size_t)l * E + e] += (uint64_t)s->moe_count[e];
    for (int e = 0, at = 0; e < E; e++) {
        s->moe_start[e] = at;
        at += s->moe_count[e];
        if (s->moe_count[e]) s->moe_list[m++] = e;
    }
    memset(s->moe_fill, 0, (size_t)E * sizeof(int32_t));
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            int32_t e = s->moe_sel[t * k + j], row = s->moe_start[e] + s->moe_fill[e]++;
            s->moe_place[t * k + j] = row;
            memcpy(s->moe_x + (size_t)row * c->dim, s->xb + (size_t)t * c->dim, (size_t)c->dim * sizeof(float));
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

/* Every chosen expert computed: the bound ones and those cached at once, the rest as their reads
 * land (several at a time when several have), slots held only while their expert computes. The
 * experts already in a slot are asked for first, so that a read for another never takes their
 * slot; a prefetched read that failed is read again once, on demand. */
static int compute_chosen(loip_session *s, int l, int m) {
    const loip_model *mod = s->m;
    loip_experts *x = s->experts;
    /* (retried: gather's moe_fill, free once the rows are gathered) */
    int32_t *list = s->moe_list, *now = s->moe_now, *slot = s->moe_slot, *retried = s->moe_fill;
    loip_tensor (*w)[LOIP_EXPERT_PARTS] = s->moe_views;
    int n_now = 0, n_bound = 0, rc, routed = 0;
    /* pass 1: bound experts, and every other one's slot asked for (reads start) */
    for (int i = 0; i < m; i++) {
        int32_t e = list[i];
        slot[i] = -1, retried[i] = 0;
        if (expert_bound(mod, l, e)) {
            for (int p = 0; p < LOIP_EXPERT_PARTS; p++) w[n_now][p] = *loip_expert_w(mod, l, e, p);
            now[n_now++] = e, n_bound++;
            slot[i] = -3; /* done */
            continue;
        }
        if (!x)
            return loip_fail(LOIP_ESTATE, "expert %d of layer %d is not in memory and the session has no expert cache "
                             "to read it", e, l);
    }
    if (x) {
        loip_experts_next_run(x);
        for (int pass = 0; pass < 2; pass++) /* those in a slot, then the others */
            for (int i = 0; i < m; i++) {
                if (slot[i] != -1 || loip_experts_holds(x, l, list[i]) != (pass == 0)) continue;
                int state;
                if ((rc = loip_experts_acquire(x, l, list[i], &slot[i], &state)))
                    return abandon(x, l, list, slot, m, routed, rc);
            }
        loip_experts_routed(x, l, list, m, n_bound);
        routed = 1;
    }
    run_experts(s, now, n_now, (const loip_tensor(*)[LOIP_EXPERT_PARTS])w);
    /* the rest: what has landed, computed together; wait only when nothing has */
    for (;;) {
        int left = 0;
        n_now = 0;
        for (int i = 0; i < m; i++) {
            if (slot[i] == -3) continue;
            left++;
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
            loip_experts_tensors(x, slot[i], w[n_now]);
            now[n_now] = list[i], s->moe_done[n_now++] = i;
        }
        if (left == 0) {
            if (x) loip_experts_layer_done(x, l);
            return LOIP_OK;
        }
        if (n_now == 0) { /* block on the first one still loading */
            int first = -1, stuck = -1;
            for (int i = 0; i < m && first < 0; i++)
                if (slot[i] >= 0) first = i;
                else if (slot[i] == -1 && stuck < 0) stuck = i;
            if (first < 0) {
                if (stuck >= 0 && retried[stuck] == 1) { /* (a failed guess: its slot is free, asked for again above) */
                    retried[stuck] = 2;
                    continue;
                }
                return abandon(x, l, list, slot, m, routed,
                               loip_fail(LOIP_ESTATE, "layer %d: no slot of the expert cache can take expert %d "
                                         "(every slot is pinned)", l, list[stuck]));
            }
            uint64_t t0 = loip_now_ns();
            int guess = loip_experts_was_prefetch(x, slot[first]);
            rc = loip_experts_wait(x, slot[first], -1);
            loip_experts_add_stall(x, loip_now_ns() - t0);
            if (rc && guess && !retried[first]) {
                slot[first] = -1, retried[first] = 1;
                continue;
            }
            if (rc) {
                slot[first] = -1;
                return abandon(x, l, list, slot, m, routed, rc);
            }
            continue;
        }
        run_experts(s, now, n_now, (const loip_tensor(*)[LOIP_EXPERT_PARTS])w);
        for (int i = 0; i < n_now; i++) {
            int k = s->moe_done[i];
            loip_experts_release(x, slot[k]);
            slot[k] = -3;
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
    const loip_model_config *c = &s->m->cfg;
    int k = c->n_experts_used, dim = c->dim;
    size_t b, e;
    loip_split((size_t)j->n, 1, ith, nth, &b, &e);
    for (size_t t = b; t < e; t++) {
        float *o = s->xb2 + t * dim;
        memset(o, 0, (size_t)dim * sizeof(float));
        for (int r = 0; r < k; r++) {
            float w = s->moe_w[t * k + r];
            const float *y = s->moe_y + (size_t)s->moe_place[t * k + r] * dim;
            for (int i = 0; i < dim; i++) o[i] += w * y[i];
        }
        if (j->shared) {
            float g = j->sgate ? 1.0f / (1.0f + expf(-j->sgate[t])) : 1.0f;
            const float *y = j->shared + t * dim;
            for (int i = 0; i < dim; i++) o[i] += g * y[i];
        }
    }
}

int loip_moe_ffn(loip_session *s, int l, int n) {
    const loip_model *m = s->m;
    const loip_model_config *c = &m->cfg;
    loip_linear_job r[2] = {loip_linear_of(loip_layer_w(m, l, LOIP_W_ROUTER), s->xb, s->moe_logits, n), {0}};
    loip_linear_run(s->pool, r);
    int chosen = gather(s, l, n);
    int rc = compute_chosen(s, l, chosen);
    if (rc) return rc;
    combine_job cj = {.s = s, .n = n};
    if (c->shared_expert) { /* a dense SwiGLU of hidden_dim over every row; its output in moe_x (free now) */
        loip_linear_job gu[4] = {loip_linear_of(loip_layer_w(m, l, LOIP_W_GATE), s->xb, s->hb, n),
                                 loip_linear_of(loip_layer_w(m, l, LOIP_W_UP), s->xb, s->hb2, n), {0}, {0}};
        if (c->shared_expert_gate) gu[2] = loip_linear_of(loip_layer_w(m, l, LOIP_W_SHARED_GATE), s->xb, s->moe_sgate, n);
        loip_linear_run(s->pool, gu);
        int32_t start = 0, count = n;
        loip_swiglu_run(s->pool, s->hb, s->hb2, &start, &count, 1, c->hidden_dim);
        loip_linear_job down[2] = {loip_linear_of(loip_layer_w(m, l, LOIP_W_DOWN), s->hb, s->moe_x, n), {0}};
        loip_linear_run(s->pool, down);
        cj.shared = s->moe_x, cj.sgate = c->shared_expert_gate ? s->moe_sgate : NULL;
    }
    loip_pool_run(s->pool, combine_task, &cj);
    return LOIP_OK;
}

void loip_moe_predict(loip_session *s, int l, const float *hidden, int n) {
    loip_experts *x = s->experts;
    const loip_model_config *c = &s->m->cfg;
    if (!x) return;
    int depth = loip_experts_prefetch_depth(x);
    const loip_kernels *k = loip_kernels_current();
    for (int d = 0; d < depth && l + d < c->n_layers; d++) {
        const loip_tensor *norm, *router;
        if (!loip_experts_predicts(x, l + d, &norm, &router)) continue;
        if (loip_experts_reads_all(x)) { /* the baseline: every expert, no prediction */
            for (int e = 0; e < c->n_experts; e++) s->moe_list[e] = e;
            loip_experts_prefetch(x, l + d, s->moe_list, c->n_experts);
            continue;
        }
        /* the layer's ffn_norm and router over this layer's input: moe_x and moe_logits are free
         * until the MLP block runs */
        for (int t = 0; t < n; t++)
            k->rmsnorm(s->moe_x + (size_t)t * c->dim, hidden + (size_t)t * c->dim, norm->data, norm->dtype,
                       (size_t)c->dim, c->norm_eps);
        loip_linear_job r[2] = {loip_linear_of(router, s->moe_x, s->moe_logits, n), {0}};
        loip_linear_run(s->pool, r);
        route(c, s->moe_logits, n, s->moe_sel, s->moe_w);
        int m = 0;
        memset(s->moe_count, 0, (size_t)c->n_experts * sizeof(int32_t));
        for (int i = 0; i < n * c->n_experts_used; i++)
            if (s->moe_count[s->moe_sel[i]]++ == 0) s->moe_list[m++] = s->moe_sel[i];
        loip_experts_prefetch(x, l + d, s->moe_list, m);
    }
}

LOIP_API int loip_session_take_routing(loip_session *s, uint64_t *out, int64_t cap) {
    const loip_model_config *c = &s->m->cfg;
    int64_t n = (int64_t)c->n_layers * c->n_experts;
    if (n == 0) return loip_fail(LOIP_EINVAL, "session: the model has no experts to count the routing of");
    if (cap < n) return loip_fail(LOIP_EINVAL, "session: the routing needs %lld entries, got %lld", (long long)n, (long long)cap);
    for (int64_t i = 0; i < n; i++) out[i] += s->moe_routed[i];
    memset(s->moe_routed, 0, (size_t)n * sizeof *s->moe_routed);
    return LOIP_OK;
}

LOIP_API int loip_session_set_experts(loip_session *s, loip_experts *x) {
    if (x && !s->m->cfg.n_experts) return loip_fail(LOIP_EINVAL, "session: an expert cache for a model without experts");
    s->experts = x;
    return LOIP_OK;
}
