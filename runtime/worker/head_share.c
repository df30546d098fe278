/* The output head cut across devices (a plan's head_shares; loip.h, loip_device_head_share).
 *
 *   last device: its step's output rows normalised, its own share's logits ─► LOGITS to the
 *   next device (device 1) ─► each adds its share ─► ... ─► device N-1 ─► back to the last
 *   device: the logits whole, sampled as before, the RESULT to the head
 *
 * The message goes the ring's own way (the next device's socket, as the hidden states do), so
 * it visits devices 1..N-1 once each and comes home: N hops of 4 bytes per row per vocabulary
 * row computed so far. Everything it claims is checked first (its plan, that it follows this
 * step's last hop, its rows, the vocabulary, its size; back home, its tokens' slots and
 * requests): a malformed or stale one is refused with an ERROR to the head, as data is. Each
 * share's logits are computed by the same kernels as the whole head's: bit for bit the same. */
#include <stdio.h>
#include <string.h>

#include "core/core.h"
#include "exec/model.h"
#include "exec/session.h"
#include "memory/budget.h"
#include "worker/worker.h"

static uint64_t share_bytes(int32_t dim, int32_t vocab, int32_t n, int32_t n_rows) {
    return (uint64_t)n_rows * ((uint64_t)dim + (uint64_t)vocab) * sizeof(float) + (uint64_t)n * sizeof(loip_step_token);
}

LOIP_API int loip_device_share_size(const loip_model_config *cfg, int32_t max_tokens, int32_t logits_tokens,
                                    int32_t max_seqs, uint64_t *bytes) {
    if (!cfg || !bytes || max_tokens <= 0) return loip_fail(LOIP_EINVAL, "device share size: cfg, max_tokens and bytes are required");
    if (logits_tokens <= 0) logits_tokens = 1;
    if (logits_tokens > max_tokens) logits_tokens = max_tokens;
    if (max_seqs <= 0) max_seqs = 1;
    int32_t out_cap = logits_tokens > max_seqs ? logits_tokens : max_seqs;
    if (out_cap > max_tokens) out_cap = max_tokens;
    *bytes = share_bytes(cfg->dim, cfg->vocab_size, max_tokens, out_cap);
    return LOIP_OK;
}

LOIP_API int loip_device_head_share(loip_device *d, int32_t first, int32_t last) {
    if (first < 0 || last > d->vocab || first > last)
        return loip_fail(LOIP_EINVAL, "head share: vocabulary rows [%d, %d) of %d", first, last, d->vocab);
    int last_device = d->cfg.device == d->cfg.n_devices - 1;
    int ring = last_device && !(first == 0 && last == d->vocab);
    if (ring && d->cfg.n_devices < 2)
        return loip_fail(LOIP_EINVAL, "head share: a device alone computes the whole head (rows [%d, %d) of %d)", first,
                         last, d->vocab);
    uint64_t need = d->cfg.n_devices > 1 ? share_bytes(d->dim, d->vocab, d->cfg.max_tokens, d->out_cap) : 0;
    if (need > d->payload_cap) {
        uint64_t more = need - d->payload_cap;
        if (d->budget) {
            int rc = loip_budget_charge(d->budget, "activations", more);
            if (rc) return rc;
        }
        uint8_t *p = loip_aligned_alloc(need);
        if (!p) {
            if (d->budget) loip_budget_release(d->budget, "activations", more);
            return loip_fail(LOIP_ENOMEM, "head share: out of memory");
        }
        loip_aligned_free(d->payload);
        d->payload = p, d->payload_cap = need, d->charged += more;
    }
    d->share_first = first, d->share_last = last, d->share_ring = ring;
    return LOIP_OK;
}

int head_share_send(loip_device *d, const loip_msg_header *in, int32_t n, int32_t n_rows, int32_t n_logits) {
    (void)n_logits; /* (found again from the tokens when the message is back) */
    uint64_t bytes = share_bytes(d->dim, d->vocab, n, n_rows);
    if (bytes > d->payload_cap)
        return device_report(d, in, LOIP_ESTATE, "the head is cut but this device's buffer cannot hold its logits");
    float *normed = (float *)d->payload, *logits = normed + (size_t)n_rows * d->dim;
    int rc = loip_session_head_norm(d->cfg.session, d->hidden, n, d->rows, n_rows, normed);
    if (!rc) rc = loip_session_head_share(d->cfg.session, normed, n_rows, d->share_first, d->share_last, logits);
    if (rc) return device_report(d, in, rc, loip_last_error());
    memcpy(logits + (size_t)n_rows * d->vocab, d->toks, (size_t)n * sizeof *d->toks);
    loip_msg_header h = {.kind = LOIP_MSG_LOGITS, .plan_id = d->cfg.plan_id, .hop = in->hop + 1, .step = in->step,
                         .n_tokens = n, .pos = n_rows, .dim = d->vocab, .dtype = LOIP_F32, .payload_bytes = bytes};
    if ((rc = device_send_timed(d, d->cfg.next, &h, d->payload))) return device_report(d, in, rc, loip_last_error());
    return LOIP_OK;
}

static int refuse(loip_device *d, const loip_msg_header *h, const char *why) {
    d->st.rejected++;
    return device_report(d, h, LOIP_EPROTO, why);
}

int head_share_serve(loip_device *d, const loip_msg_header *h) {
    char why[300];
    int32_t hops = d->cfg.n_devices * d->cfg.n_stages;
    if (h->plan_id != d->cfg.plan_id) {
        snprintf(why, sizeof why, "logits for plan %u, this device runs plan %u (stale)", h->plan_id, d->cfg.plan_id);
        return refuse(d, h, why);
    }
    if (d->cfg.n_devices < 2 || !(d->share_ring || d->cfg.device != d->cfg.n_devices - 1)) {
        snprintf(why, sizeof why, "logits for the head's shares, but this plan does not cut the head");
        return refuse(d, h, why);
    }
    if (h->hop != hops || h->dim != d->vocab || h->n_tokens > d->cfg.max_tokens || h->pos > d->out_cap ||
        h->payload_bytes != share_bytes(d->dim, d->vocab, h->n_tokens, h->pos)) {
        snprintf(why, sizeof why, "logits message for hop %d of %d rows of %d tokens, vocabulary %d, %llu bytes "
                 "(this plan: hop %d, at most %d rows of %d tokens, vocabulary %d, model dim %d)", h->hop, h->pos,
                 h->n_tokens, h->dim, (unsigned long long)h->payload_bytes, hops, d->out_cap, d->cfg.max_tokens,
                 d->vocab, d->dim);
        return refuse(d, h, why);
    }
    int32_t n = h->n_tokens, n_rows = h->pos;
    float *normed = (float *)d->payload, *logits = normed + (size_t)n_rows * d->dim;
    int rc;
    if (d->cfg.device != d->cfg.n_devices - 1) { /* this device's share, then on round the ring */
        uint64_t t0 = loip_now_ns();
        rc = loip_session_head_share(d->cfg.session, normed, n_rows, d->share_first, d->share_last, logits);
        d->st.head_ns += loip_now_ns() - t0;
        if (rc) return device_report(d, h, rc, loip_last_error());
        loip_msg_header o = *h;
        if ((rc = device_send_timed(d, d->cfg.next, &o, d->payload))) return device_report(d, h, rc, loip_last_error());
        return LOIP_OK;
    }
    /* home: the step's tokens back in place, checked as a data message's are, then its outputs */
    uint64_t t0 = loip_now_ns();
    memcpy(d->toks, logits + (size_t)n_rows * d->vocab, (size_t)n * sizeof *d->toks);
    for (int32_t t = 0; t < n; t++) {
        const loip_step_token *e = &d->toks[t];
        if (e->seq < 0 || e->seq >= d->cfg.max_seqs || e->request == 0 || e->request != d->seqs[e->seq].request) {
            snprintf(why, sizeof why, "logits for token %d of request %u in slot %d (stale or not this device's)", t,
                     e->request, e->seq);
            return refuse(d, h, why);
        }
    }
    int32_t rows = 0, n_logits = 0;
    rc = loip_head_rows(d->toks, n, 1, d->rows, &rows, &n_logits);
    if (rc) return device_report(d, h, rc, loip_last_error());
    if (rows != n_rows) {
        snprintf(why, sizeof why, "logits of %d rows, its tokens flag %d", n_rows, rows);
        return refuse(d, h, why);
    }
    memcpy(d->logits, logits, (size_t)n_rows * d->vocab * sizeof(float));
    loip_msg_header in = *h;
    in.hop = hops - 1;
    return device_outputs(d, &in, n_rows, n_logits, t0);
}
