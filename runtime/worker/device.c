/* A device of a cluster: the worker's per-step path, all in C. See loip.h (loip_device_*).
 *
 *   recv (tokens | hidden, hop h) ─► [embed] ─► runner stage h / N ─► hop h+1 on this device?
 *        ─► send hidden to the next device, or (last hop) head + sample ─► result to the head
 *
 * Everything a message claims is checked against the plan before anything runs: its plan id
 * (a stale plan is refused), that the hop is this device's, the hidden size, the batch limit.
 * A refusal or a failed step is reported to the head as an ERROR naming this device, so the
 * head can stop the request at once rather than wait for a result that will not come. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "exec/model.h"
#include "exec/session.h"
#include "memory/budget.h"
#include "worker/worker.h"

enum { CONTROL_CAP = 64 * 1024 }; /* control messages (JSON plans) are small */

/* A device's buffers for a model with dim and vocab and the given limits: the one computation
 * behind loip_device_new's charge and loip_device_size. */
typedef struct device_sizes {
    int32_t logits_tokens; /* clamped: <= 0: 1, at most max_tokens */
    int32_t out_cap;       /* max(logits_tokens, max_seqs), at most max_tokens */
    uint64_t hidden, result, outputs, payload, ids, total;
} device_sizes;

static int sizes_for(int32_t dim, int32_t vocab, int32_t max_tokens, int32_t logits_tokens,
                     int32_t max_seqs, device_sizes *z) {
    if (dim <= 0 || vocab <= 0 || max_tokens <= 0)
        return loip_fail(LOIP_EINVAL, "device size: dim %d, vocab %d, max_tokens %d (all must be > 0)",
                         dim, vocab, max_tokens);
    if (logits_tokens <= 0) logits_tokens = 1;
    if (logits_tokens > max_tokens) logits_tokens = max_tokens;
    if (max_seqs <= 0) max_seqs = 1;
    z->logits_tokens = logits_tokens;
    z->out_cap = logits_tokens > max_seqs ? logits_tokens : max_seqs;
    if (z->out_cap > max_tokens) z->out_cap = max_tokens;
    uint64_t table = (uint64_t)max_tokens * sizeof(loip_step_token);
    /* the hidden states with the table after them: what a HIDDEN message carries */
    z->hidden = (uint64_t)max_tokens * (uint64_t)dim * sizeof(float) + table;
    /* outputs rounded to 64 bytes so that the logits after them stay aligned */
    z->outputs = ((uint64_t)z->out_cap * sizeof(loip_step_output) + 63) / 64 * 64;
    z->result = z->outputs + (uint64_t)z->out_cap * (uint64_t)vocab * sizeof(float);
    z->payload = z->hidden > CONTROL_CAP ? z->hidden : CONTROL_CAP;
    /* ids four times over: the rows computed, and the head's (loip_head_new) drafts, tokens out
     * and a tree's parents */
    z->ids = (uint64_t)max_tokens * (sizeof(int32_t) * 4 + sizeof(loip_step_token) + sizeof(loip_batch_token));
    z->total = z->hidden + z->result + z->payload + z->ids;
    return LOIP_OK;
}

LOIP_API int loip_device_size(const loip_model_config *cfg, int32_t max_tokens,
                              int32_t logits_tokens, int32_t max_seqs, uint64_t *bytes) {
    if (!cfg || !bytes) return loip_fail(LOIP_EINVAL, "device size: cfg and bytes are required");
    device_sizes z;
    int rc = sizes_for(cfg->dim, cfg->vocab_size, max_tokens, logits_tokens, max_seqs, &z);
    if (rc) return rc;
    *bytes = z.total;
    return LOIP_OK;
}

LOIP_API void loip_device_free(loip_device *d) {
    if (!d) return;
    loip_aligned_free(d->hidden);
    loip_aligned_free(d->result);
    free(d->toks);
    free(d->bt);
    free(d->rows);
    loip_aligned_free(d->payload);
    free(d->seqs);
    loip_head_free(d->head);
    lend_free(&d->lend);
    if (d->budget) {
        loip_budget_release(d->budget, "activations", d->charged);
        loip_budget_free(d->budget);
    }
    free(d);
}

LOIP_API int loip_device_new(const loip_device_config *cfg, loip_budget *budget, loip_device **out) {
    *out = NULL;
    if (!cfg->runner || !cfg->session || !cfg->in || !cfg->head || cfg->n_devices <= 0 ||
        cfg->n_stages <= 0 || cfg->device < 0 || cfg->device >= cfg->n_devices || cfg->max_tokens <= 0)
        return loip_fail(LOIP_EINVAL, "device: incomplete config (runner, session, sockets, ring position)");
    if (cfg->n_devices > 1 && !cfg->next)
        return loip_fail(LOIP_EINVAL, "device: %d devices but no socket to the next one", cfg->n_devices);
    loip_device *d = calloc(1, sizeof *d);
    if (!d) return loip_fail(LOIP_ENOMEM, "device: out of memory");
    d->cfg = *cfg;
    if (d->cfg.max_tokens > loip_session_max_batch(cfg->session)) d->cfg.max_tokens = loip_session_max_batch(cfg->session);
    if (d->cfg.max_seqs <= 0 || d->cfg.max_seqs > loip_session_max_seqs(cfg->session))
        d->cfg.max_seqs = loip_session_max_seqs(cfg->session);
    d->m = loip_session_model(cfg->session);
    d->dim = d->m->cfg.dim, d->vocab = d->m->cfg.vocab_size;
    d->share_first = 0, d->share_last = d->vocab;
    device_sizes z;
    int zrc = sizes_for(d->dim, d->vocab, d->cfg.max_tokens, d->cfg.logits_tokens, d->cfg.max_seqs, &z);
    if (zrc) {
        free(d);
        return zrc;
    }
    d->cfg.logits_tokens = z.logits_tokens;
    d->out_cap = z.out_cap;
    d->payload_cap = z.payload;
    d->charged = z.total;
    if (budget) {
        int rc = loip_budget_charge(budget, "activations", d->charged);
        if (rc) {
            free(d);
            return rc;
        }
        d->budget = loip_budget_retain(budget);
    }
    size_t T = (size_t)d->cfg.max_tokens;
    d->hidden = loip_aligned_alloc(z.hidden);
    d->result = loip_aligned_alloc(z.result);
    d->toks = malloc(T * sizeof *d->toks);
    d->bt = malloc(T * sizeof *d->bt);
    d->rows = malloc(T * sizeof(int32_t));
    d->payload = loip_aligned_alloc(d->payload_cap);
    d->seqs = calloc((size_t)d->cfg.max_seqs, sizeof *d->seqs);
    if (!d->hidden || !d->result || !d->toks || !d->bt || !d->rows || !d->payload || !d->seqs) {
        loip_device_free(d);
        return loip_fail(LOIP_ENOMEM, "device: out of memory");
    }
    int hrc = loip_head_new(d->cfg.max_seqs, d->cfg.max_tokens, &d->head);
    if (hrc) {
        loip_device_free(d);
        return hrc;
    }
    if (lend_init(&d->lend, d->cfg.session, d->cfg.runner, d->budget, d->seqs, d->cfg.max_seqs, d->cfg.n_stages,
                  d->cfg.plan_id)) {
        loip_device_free(d);
        return loip_fail(LOIP_ENOMEM, "device: out of memory");
    }
    d->logits = (float *)(d->result + z.outputs);
    *out = d;
    return LOIP_OK;
}

LOIP_API int loip_device_start(loip_device *d, int32_t seq, uint32_t request,
                               const loip_sampler_params *p, uint64_t seed, int32_t n_sample,
                               const int32_t *prompt, int32_t n_prompt, int32_t max_history) {
    if (seq < 0 || seq >= d->cfg.max_seqs)
        return loip_fail(LOIP_EINVAL, "device: sequence slot %d out of range (%d slots)", seq, d->cfg.max_seqs);
    if (request == 0) return loip_fail(LOIP_EINVAL, "device: request 0 (requests are numbered from 1)");
    if (n_sample <= 0 || n_sample > d->vocab)
        return loip_fail(LOIP_EINVAL, "device: sampling over %d ids of a %d-token vocabulary", n_sample, d->vocab);
    int rc = loip_head_start(d->head, seq, p, seed, n_sample, prompt, n_prompt, max_history);
    if (rc) return rc;
    loip_session_seq_free(d->cfg.session, seq);
    d->seqs[seq].request = request;
    return LOIP_OK;
}

LOIP_API int loip_device_skip_draws(loip_device *d, int32_t seq, uint64_t n) {
    if (seq < 0 || seq >= d->cfg.max_seqs || !d->seqs[seq].request || loip_head_skip(d->head, seq, n))
        return loip_fail(LOIP_EINVAL, "device: no request in sequence slot %d", seq);
    return LOIP_OK;
}

LOIP_API int loip_device_end(loip_device *d, int32_t seq, uint32_t request) {
    if (seq < 0 || seq >= d->cfg.max_seqs)
        return loip_fail(LOIP_EINVAL, "device: sequence slot %d out of range (%d slots)", seq, d->cfg.max_seqs);
    seq_state *q = &d->seqs[seq];
    if (request != 0 && q->request != request)
        return loip_fail(LOIP_ESTATE, "device: slot %d runs request %u, not %u", seq, q->request, request);
    q->request = 0;
    loip_head_end(d->head, seq);
    int rc = loip_session_seq_free(d->cfg.session, seq);
    if (rc || !d->lend.peer) return rc;
    /* no request left: what is away is stale, forget it at the holder */
    for (int32_t i = 0; i < d->cfg.max_seqs; i++)
        if (d->seqs[i].request) return LOIP_OK;
    return lend_forget(&d->lend);
}

LOIP_API int loip_device_recall(loip_device *d) { return lend_recall(&d->lend); }

LOIP_API int loip_device_lend(loip_device *d, loip_sock *peer, const int32_t *stage_layers, const int32_t *groups) {
    if (peer && d->cfg.n_devices < 2) return loip_fail(LOIP_EINVAL, "KV lending: a device alone has no one to lend to");
    int32_t n_layers = d->m->cfg.n_layers;
    if (stage_layers)
        for (int32_t k = 0; k < d->cfg.n_stages; k++) {
            int32_t a = stage_layers[2 * k], b = stage_layers[2 * k + 1];
            if (a < 0 || b > n_layers || a > b)
                return loip_fail(LOIP_EINVAL, "KV lending: stage %d's layers [%d, %d) out of range (%d layers)", k, a,
                                 b, n_layers);
        }
    return lend_set(&d->lend, peer, stage_layers, groups);
}

/* Report a refusal or a failure to the head (best effort) and return rc. The head names the
 * device (1-based, as every message does), so the report is the message alone; the last error
 * (the worker's own log) names it too. */
int device_report(loip_device *d, const loip_msg_header *in, int rc, const char *msg) {
    char text[600];
    int len = snprintf(text, sizeof text, "%s", msg);
    loip_msg_header h = {.kind = LOIP_MSG_ERROR, .plan_id = d->cfg.plan_id, .hop = in ? in->hop : -1,
                         .step = in ? in->step : 0, .dtype = -1, .status = rc,
                         .payload_bytes = (uint64_t)(len < (int)sizeof text ? len : (int)sizeof text - 1)};
    loip_sock_send(d->cfg.head, NULL, &h, text, 1000);
    return loip_fail(rc, "device %d: %s", d->cfg.device + 1, text);
}

int device_send_timed(loip_device *d, loip_sock *s, const loip_msg_header *h, const void *payload) {
    uint64_t t0 = loip_now_ns();
    int rc = loip_sock_send(s, NULL, h, payload, 10000);
    uint64_t t1 = loip_now_ns();
    d->st.send_ns += t1 - t0;
    loip_runner_record(d->cfg.runner, LOIP_EVENT_SEND, h->hop / d->cfg.n_devices, t0, t1,
                       sizeof *h + h->payload_bytes);
    d->st.bytes_sent += sizeof *h + h->payload_bytes;
    return rc;
}

/* The last hop's output: per flagged token a sampled id or its logits, to the head (a result
 * with no outputs when nothing is flagged: the head hears of every step). */
static int finish(loip_device *d, const loip_msg_header *in, int32_t n) {
    int32_t n_rows = 0, n_logits = 0;
    int rc = loip_head_rows(d->toks, n, 1, d->rows, &n_rows, &n_logits);
    if (rc) return device_report(d, in, rc, loip_last_error());
    /* (a result's rows are the first limit a step meets when it is also the logits buffer's) */
    if (n_logits > d->cfg.logits_tokens && d->cfg.logits_tokens < d->out_cap)
        return device_report(d, in, LOIP_EINVAL, "logits asked for more tokens than the logits buffer holds");
    if (n_rows > d->out_cap) return device_report(d, in, LOIP_EINVAL, "more tokens flagged for output than one result holds");
    uint64_t t0 = loip_now_ns();
    if (d->share_ring && n_rows > 0) { /* the head cut across devices: its logits go round the ring */
        if ((rc = head_share_send(d, in, n, n_rows, n_logits))) return rc;
        d->st.head_ns += loip_now_ns() - t0;
        return LOIP_OK;
    }
    if (n_rows > 0 && (rc = loip_session_head_rows(d->cfg.session, d->hidden, n, d->rows, n_rows, d->logits)))
        return device_report(d, in, rc, loip_last_error());
    return device_outputs(d, in, n_rows, n_logits, t0);
}

int device_outputs(loip_device *d, const loip_msg_header *in, int32_t n_rows, int32_t n_logits, uint64_t t0) {
    loip_step_output *outs = (loip_step_output *)d->result;
    int32_t n_outs = 0, drafted = 0, accepted = 0;
    int rc = loip_head_outputs(d->head, d->toks, d->rows, n_rows, d->logits, d->vocab, outs, NULL, &n_outs, &drafted,
                               &accepted);
    if (rc) return device_report(d, in, rc, loip_last_error());
    d->st.drafted += (uint64_t)drafted, d->st.accepted += (uint64_t)accepted;
    d->st.head_ns += loip_now_ns() - t0;
    /* the outputs (those of the logits rows first), then the returned logits rows right after them */
    uint64_t out_bytes = (uint64_t)n_outs * sizeof *outs, logit_bytes = (uint64_t)n_logits * d->vocab * sizeof(float);
    if (n_logits > 0 && (uint8_t *)d->logits != d->result + out_bytes)
        memmove(d->result + out_bytes, d->logits, logit_bytes);
    loip_msg_header h = {.kind = LOIP_MSG_RESULT, .plan_id = d->cfg.plan_id, .hop = in->hop + 1,
                         .step = in->step, .n_tokens = n_outs, .dim = d->vocab, .dtype = -1,
                         .payload_bytes = out_bytes + logit_bytes};
    if ((rc = device_send_timed(d, d->cfg.head, &h, d->result))) return device_report(d, in, rc, loip_last_error());
    return LOIP_OK;
}

/* Check a data message against the plan; on success its tokens/hidden and table are in place. */
static int accept(loip_device *d, const loip_msg_header *h, int32_t *n) {
    char why[300];
    int32_t hops = d->cfg.n_devices * d->cfg.n_stages;
    if (h->plan_id != d->cfg.plan_id) {
        snprintf(why, sizeof why, "message for plan %u, this device runs plan %u (stale)", h->plan_id, d->cfg.plan_id);
        return device_report(d, h, LOIP_EPROTO, why);
    }
    if (h->hop < 0 || h->hop >= hops || h->hop % d->cfg.n_devices != d->cfg.device) {
        snprintf(why, sizeof why, "message for hop %d, not one of this device's (device %d of %d, %d stages)",
                 h->hop, d->cfg.device + 1, d->cfg.n_devices, d->cfg.n_stages);
        return device_report(d, h, LOIP_EPROTO, why);
    }
    if (h->n_tokens > d->cfg.max_tokens) {
        snprintf(why, sizeof why, "%d tokens in one message, the limit is %d", h->n_tokens, d->cfg.max_tokens);
        return device_report(d, h, LOIP_EPROTO, why);
    }
    int32_t k = h->n_tokens;
    if (h->kind == LOIP_MSG_TOKENS) {
        if (h->hop != 0 || h->dim != 1) {
            snprintf(why, sizeof why, "token ids for hop %d (dim %d): tokens enter at hop 0, one id each", h->hop, h->dim);
            return device_report(d, h, LOIP_EPROTO, why);
        }
    } else if (h->hop == 0 || h->dim != d->dim) {
        snprintf(why, sizeof why, "hidden states of dim %d for hop %d (model dim %d; hop 0 takes token ids)",
                 h->dim, h->hop, d->dim);
        return device_report(d, h, LOIP_EPROTO, why);
    }
    uint64_t data = (uint64_t)k * (uint64_t)h->dim * 4;
    memcpy(d->toks, d->payload + data, (size_t)k * sizeof *d->toks);
    for (int32_t t = 0; t < k; t++) {
        const loip_step_token *e = &d->toks[t];
        if (e->seq < 0 || e->seq >= d->cfg.max_seqs) {
            snprintf(why, sizeof why, "token %d of the batch in sequence slot %d (this device has %d)", t, e->seq,
                     d->cfg.max_seqs);
            return device_report(d, h, LOIP_EPROTO, why);
        }
        if (e->request == 0 || e->request != d->seqs[e->seq].request) {
            snprintf(why, sizeof why, "token %d of the batch is of request %u, slot %d runs request %u (stale)", t,
                     e->request, e->seq, d->seqs[e->seq].request);
            return device_report(d, h, LOIP_EPROTO, why);
        }
        d->bt[t] = (loip_batch_token){e->seq, e->pos, e->parent};
    }
    /* a sequence recomputing positions 0..E-1 (rows so flagged) has evicted them: from now on */
    for (int32_t t = 0; t < k; t++) {
        if (!(d->toks[t].flags & LOIP_TOKF_RECOMPUTE) || d->toks[t].pos != 0) continue;
        int32_t q = d->toks[t].seq, e = 0;
        while (t + e < k && d->toks[t + e].seq == q && (d->toks[t + e].flags & LOIP_TOKF_RECOMPUTE)) e++;
        if (e > loip_session_kv_evicted(d->cfg.session, q)) {
            int rc = loip_session_kv_evict(d->cfg.session, q, e);
            if (rc) return device_report(d, h, rc, loip_last_error());
        }
    }
    if (h->kind == LOIP_MSG_TOKENS) {
        uint64_t t0 = loip_now_ns();
        int rc = loip_session_embed(d->cfg.session, (const int32_t *)d->payload, k, d->hidden);
        d->st.head_ns += loip_now_ns() - t0;
        if (rc) return device_report(d, h, rc, loip_last_error());
    } else {
        memcpy(d->hidden, d->payload, data);
    }
    *n = k;
    return LOIP_OK;
}

/* After a stage's output left: its KV lent out, the next stage's asked back. */
static int lend_after(loip_device *d, const loip_msg_header *h, int32_t stage) {
    int rc = lend_ship(&d->lend, stage, h->step);
    return rc ? device_report(d, h, rc, loip_last_error()) : LOIP_OK;
}

/* A slower board: the stage's compute (its time since before) takes slowdown x as long, the
 * extra spent asleep until a deadline on loip_now_ns's clock (CLOCK_MONOTONIC), so the emulated
 * board's wait leaves the CPU to the others. */
static void emulate_slowdown(loip_device *d, const loip_runner_stats_t *before) {
    loip_runner_stats_t after;
    loip_runner_stats(d->cfg.runner, &after);
    double extra = (double)(after.compute_ns - before->compute_ns) * (d->cfg.slowdown - 1.0f);
    uint64_t until = loip_now_ns() + (uint64_t)extra;
    struct timespec at = {(time_t)(until / 1000000000u), (long)(until % 1000000000u)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL) == EINTR) {}
}

/* One data message, in full: checks, this device's hops, the output. waited: how long the
 * receive took (the transit's start when the sender's clock is not ours). */
static int serve_data(loip_device *d, loip_msg_header h, uint64_t waited) {
    int rc;
    {   /* the transit, on the sender's clock (meaningful when both share a host) */
        uint64_t now = loip_now_ns();
        uint64_t from = h.t_send_ns && h.t_send_ns <= now ? h.t_send_ns : now - waited;
        loip_runner_record(d->cfg.runner, LOIP_EVENT_RECV, h.hop / d->cfg.n_devices, from, now,
                           sizeof h + h.payload_bytes);
    }
    int32_t n = 0;
    if ((rc = accept(d, &h, &n))) {
        d->st.rejected++;
        return rc;
    }
    /* run this device's hops: one, or (one device) every hop of the ring */
    for (;;) {
        int32_t stage = h.hop / d->cfg.n_devices;
        loip_runner_stats_t before;
        if (d->cfg.slowdown > 1.0f) loip_runner_stats(d->cfg.runner, &before);
        if ((rc = lend_fetch(&d->lend, stage, h.step, 1))) return device_report(d, &h, rc, loip_last_error());
        if ((rc = loip_runner_stage_batch(d->cfg.runner, stage, d->hidden, n, d->bt)))
            return device_report(d, &h, rc, loip_last_error());
        if (d->cfg.slowdown > 1.0f) emulate_slowdown(d, &before);
        d->st.hops++;
        /* the next stage's lent KV asked back now, before the output goes on: the holder, idle
         * until that output reaches it, answers first, and the blob travels during the hops
         * in between */
        if (d->lend.peer && (rc = lend_ask(&d->lend, (stage + 1) % d->cfg.n_stages, h.step)))
            return device_report(d, &h, rc, loip_last_error());
        if (h.hop + 1 == d->cfg.n_devices * d->cfg.n_stages) {
            if ((rc = finish(d, &h, n))) return rc;
            return lend_after(d, &h, stage);
        }
        h.hop++;
        if (d->cfg.n_devices == 1) continue;
        /* the hidden states and the table after them, as one payload */
        uint64_t data = (uint64_t)n * d->dim * sizeof(float);
        memcpy((uint8_t *)d->hidden + data, d->toks, (size_t)n * sizeof *d->toks);
        loip_msg_header o = h;
        o.kind = LOIP_MSG_HIDDEN, o.dtype = LOIP_F32, o.dim = d->dim;
        o.payload_bytes = data + (uint64_t)n * sizeof *d->toks;
        if ((rc = device_send_timed(d, d->cfg.next, &o, d->hidden))) return device_report(d, &h, rc, loip_last_error());
        return lend_after(d, &h, stage);
    }
}

LOIP_API int loip_device_serve(loip_device *d, int32_t timeout_ms, loip_msg_header *out,
                               void *out_payload, uint64_t cap, char *from) {
    for (;;) {
        loip_msg_header h;
        uint64_t t0 = loip_now_ns();
        void *large = NULL;
        int rc = loip_sock_recv_large(d->cfg.in, timeout_ms, &h, d->payload, d->payload_cap, d->from, &large);
        uint64_t waited = loip_now_ns() - t0;
        if (rc == LOIP_ETIMEDOUT) return 0;
        if (rc) {
            d->st.rejected++;
            return device_report(d, NULL, rc, loip_last_error());
        }
        if (h.kind == LOIP_MSG_KV_PUT || h.kind == LOIP_MSG_KV_GET || h.kind == LOIP_MSG_KV_DROP) {
            if ((rc = lend_hold(&d->lend, d->cfg.in, d->from, &h, d->payload, large)))
                return device_report(d, &h, rc, loip_last_error());
            continue;
        }
        if (large) { /* only lent KV may exceed the device's buffer */
            free(large);
            d->st.rejected++;
            return device_report(d, &h, LOIP_EPROTO, "a message larger than the device's buffer");
        }
        if (h.kind != LOIP_MSG_TOKENS && h.kind != LOIP_MSG_HIDDEN && h.kind != LOIP_MSG_LOGITS) {
            if (h.payload_bytes > cap) {
                d->st.rejected++;
                return device_report(d, &h, LOIP_EPROTO, "control message larger than the caller's buffer");
            }
            *out = h;
            memcpy(out_payload, d->payload, h.payload_bytes);
            if (from) snprintf(from, 64, "%s", d->from);
            return 1;
        }
        d->st.recv_wait_ns += waited;
        loip_heartbeat_busy(d->cfg.heartbeat, 1);
        rc = h.kind == LOIP_MSG_LOGITS ? head_share_serve(d, &h) : serve_data(d, h, waited);
        loip_heartbeat_busy(d->cfg.heartbeat, 0);
        if (rc) return rc;
    }
}

LOIP_API int loip_device_stats(loip_device *d, loip_device_stats_t *out) {
    *out = d->st;
    out->lent_bytes = d->lend.lent_bytes, out->fetched_bytes = d->lend.fetched_bytes;
    out->lend_wait_ns = d->lend.wait_ns, out->held_bytes = d->lend.held_bytes;
    out->held_in_bytes = d->lend.held_in_bytes;
    return LOIP_OK;
}
