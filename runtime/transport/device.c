/* A device of a cluster: the worker's per-step path, all in C. See loip.h (loip_device_*).
 *
 *   recv (tokens | hidden, hop h) ─► [embed] ─► runner stage h / N ─► hop h+1 on this device?
 *        ─► send hidden to the next device, or (last hop) head + sample ─► result to the head
 *
 * Everything a message claims is checked against the plan before anything runs: its plan id
 * (a stale plan is refused), that the hop is this device's, the hidden size, the batch limit.
 * A refusal or a failed step is reported to the head as an ERROR naming this device, so the
 * head can stop the request at once rather than wait for a result that will not come. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "exec/model.h"
#include "exec/session.h"
#include "memory/budget.h"

struct loip_device {
    loip_device_config cfg;
    const loip_model *m;
    int32_t dim, vocab;
    loip_budget *budget;
    uint64_t charged;
    float *hidden;      /* (max_tokens, dim) */
    float *logits;      /* (logits_tokens, vocab) */
    int32_t *ids;       /* (max_tokens) */
    uint8_t *payload;   /* incoming payloads: max(hidden, control) bytes */
    uint64_t payload_cap;
    loip_sampler *sampler;
    loip_sampler_params params;
    int32_t *history;   /* prompt and sampled ids, for the repetition penalty */
    int32_t n_history, max_history;
    uint32_t request;   /* the request data messages must belong to (0: none started) */
    loip_device_stats_t st;
    char from[64];
};

enum { CONTROL_CAP = 64 * 1024 }; /* control messages (JSON plans) are small */

/* A device's buffers for a model with dim and vocab and the given limits: the one computation
 * behind loip_device_new's charge and loip_device_size. */
typedef struct device_sizes {
    int32_t logits_tokens; /* clamped: <= 0: 1, at most max_tokens */
    uint64_t hidden, logits, payload, ids, total;
} device_sizes;

static int sizes_for(int32_t dim, int32_t vocab, int32_t max_tokens, int32_t logits_tokens,
                     device_sizes *z) {
    if (dim <= 0 || vocab <= 0 || max_tokens <= 0)
        return loip_fail(LOIP_EINVAL, "device size: dim %d, vocab %d, max_tokens %d (all must be > 0)",
                         dim, vocab, max_tokens);
    if (logits_tokens <= 0) logits_tokens = 1;
    if (logits_tokens > max_tokens) logits_tokens = max_tokens;
    z->logits_tokens = logits_tokens;
    z->hidden = (uint64_t)max_tokens * (uint64_t)dim * sizeof(float);
    z->logits = (uint64_t)logits_tokens * (uint64_t)vocab * sizeof(float);
    z->payload = z->hidden > CONTROL_CAP ? z->hidden : CONTROL_CAP;
    z->ids = (uint64_t)max_tokens * sizeof(int32_t);
    z->total = z->hidden + z->logits + z->payload + z->ids;
    return LOIP_OK;
}

LOIP_API int loip_device_size(const loip_model_config *cfg, int32_t max_tokens,
                              int32_t logits_tokens, uint64_t *bytes) {
    if (!cfg || !bytes) return loip_fail(LOIP_EINVAL, "device size: cfg and bytes are required");
    device_sizes z;
    int rc = sizes_for(cfg->dim, cfg->vocab_size, max_tokens, logits_tokens, &z);
    if (rc) return rc;
    *bytes = z.total;
    return LOIP_OK;
}

LOIP_API void loip_device_free(loip_device *d) {
    if (!d) return;
    loip_aligned_free(d->hidden);
    loip_aligned_free(d->logits);
    free(d->ids);
    free(d->payload);
    free(d->history);
    loip_sampler_free(d->sampler);
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
    d->m = loip_session_model(cfg->session);
    d->dim = d->m->cfg.dim, d->vocab = d->m->cfg.vocab_size;
    device_sizes z;
    int zrc = sizes_for(d->dim, d->vocab, d->cfg.max_tokens, d->cfg.logits_tokens, &z);
    if (zrc) {
        free(d);
        return zrc;
    }
    d->cfg.logits_tokens = z.logits_tokens;
    uint64_t hidden = z.hidden, logits = z.logits;
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
    d->hidden = loip_aligned_alloc(hidden);
    d->logits = loip_aligned_alloc(logits);
    d->ids = malloc((size_t)z.ids);
    d->payload = malloc(d->payload_cap);
    if (!d->hidden || !d->logits || !d->ids || !d->payload) {
        loip_device_free(d);
        return loip_fail(LOIP_ENOMEM, "device: out of memory");
    }
    *out = d;
    return LOIP_OK;
}

LOIP_API int loip_device_start(loip_device *d, uint32_t request, const loip_sampler_params *p,
                               uint64_t seed, int32_t n_sample, const int32_t *prompt,
                               int32_t n_prompt, int32_t max_history) {
    if (n_sample <= 0 || n_sample > d->vocab)
        return loip_fail(LOIP_EINVAL, "device: sampling over %d ids of a %d-token vocabulary", n_sample, d->vocab);
    if (max_history < n_prompt) max_history = n_prompt;
    loip_sampler *smp;
    int rc = loip_sampler_new(n_sample, seed, &smp);
    if (rc) return rc;
    int32_t *h = malloc((size_t)(max_history > 0 ? max_history : 1) * sizeof(int32_t));
    if (!h) {
        loip_sampler_free(smp);
        return loip_fail(LOIP_ENOMEM, "device: out of memory");
    }
    if (n_prompt > 0) memcpy(h, prompt, (size_t)n_prompt * sizeof(int32_t));
    loip_sampler_free(d->sampler);
    free(d->history);
    d->sampler = smp, d->params = *p, d->history = h;
    d->n_history = n_prompt, d->max_history = max_history;
    d->request = request;
    return LOIP_OK;
}

/* Report a refusal or a failure to the head (best effort) and return rc. */
static int report(loip_device *d, const loip_msg_header *in, int rc, const char *msg) {
    char text[600];
    int len = snprintf(text, sizeof text, "device %d: %s", d->cfg.device, msg);
    loip_msg_header h = {.kind = LOIP_MSG_ERROR, .plan_id = d->cfg.plan_id, .hop = in ? in->hop : -1,
                         .step = in ? in->step : 0, .dtype = -1, .status = rc,
                         .payload_bytes = (uint64_t)(len < (int)sizeof text ? len : (int)sizeof text - 1)};
    loip_sock_send(d->cfg.head, NULL, &h, text, 1000);
    return loip_fail(rc, "%s", text);
}

static int send_timed(loip_device *d, loip_sock *s, const loip_msg_header *h, const void *payload) {
    uint64_t t0 = loip_now_ns();
    int rc = loip_sock_send(s, NULL, h, payload, 10000);
    uint64_t t1 = loip_now_ns();
    d->st.send_ns += t1 - t0;
    loip_runner_record(d->cfg.runner, LOIP_EVENT_SEND, h->hop / d->cfg.n_devices, t0, t1,
                       sizeof *h + h->payload_bytes);
    d->st.bytes_sent += sizeof *h + h->payload_bytes;
    return rc;
}

/* The last hop's output: the head and a sample (or the logits, or only an acknowledgement). */
static int finish(loip_device *d, const loip_msg_header *in, int32_t n) {
    loip_msg_header h = {.kind = LOIP_MSG_RESULT, .plan_id = d->cfg.plan_id, .hop = in->hop + 1,
                         .step = in->step, .pos = in->pos, .n_tokens = 1, .dim = 1, .dtype = LOIP_I32,
                         .payload_bytes = 4};
    uint64_t t0 = loip_now_ns();
    int rc = LOIP_OK;
    int32_t id = -1;
    const void *payload = &id;
    if (in->flags & LOIP_MSGF_LOGITS) {
        if (n > d->cfg.logits_tokens)
            return report(d, in, LOIP_EINVAL, "logits asked for a batch larger than the logits buffer");
        if ((rc = loip_session_head(d->cfg.session, d->hidden, n, d->logits, LOIP_LOGITS_ALL)))
            return report(d, in, rc, loip_last_error());
        h.dtype = LOIP_F32, h.n_tokens = n, h.dim = d->vocab;
        h.payload_bytes = (uint64_t)n * d->vocab * sizeof(float);
        payload = d->logits;
    } else if (!(in->flags & LOIP_MSGF_NO_OUTPUT)) {
        if (!d->sampler) return report(d, in, LOIP_ESTATE, "tokens to sample before a request started");
        if ((rc = loip_session_head(d->cfg.session, d->hidden, n, d->logits, LOIP_LOGITS_LAST)))
            return report(d, in, rc, loip_last_error());
        int32_t used = d->n_history;
        if ((rc = loip_sampler_sample(d->sampler, d->logits, &d->params, d->history, used, &id)))
            return report(d, in, rc, loip_last_error());
        if (d->n_history < d->max_history) d->history[d->n_history++] = id;
    }
    d->st.head_ns += loip_now_ns() - t0;
    if ((rc = send_timed(d, d->cfg.head, &h, payload))) return report(d, in, rc, loip_last_error());
    return LOIP_OK;
}

/* Check a data message against the plan; on success its tokens/hidden are in place. */
static int accept(loip_device *d, const loip_msg_header *h, int32_t *n) {
    char why[300];
    int32_t hops = d->cfg.n_devices * d->cfg.n_stages;
    if (h->plan_id != d->cfg.plan_id) {
        snprintf(why, sizeof why, "message for plan %u, this device runs plan %u (stale)", h->plan_id, d->cfg.plan_id);
        return report(d, h, LOIP_EPROTO, why);
    }
    if ((uint32_t)(h->step >> 32) != d->request || d->request == 0) {
        snprintf(why, sizeof why, "message of request %u, this device runs request %u (stale)",
                 (unsigned)(h->step >> 32), d->request);
        return report(d, h, LOIP_EPROTO, why);
    }
    if (h->hop < 0 || h->hop >= hops || h->hop % d->cfg.n_devices != d->cfg.device) {
        snprintf(why, sizeof why, "message for hop %d, not one of this device's (device %d of %d, %d stages)",
                 h->hop, d->cfg.device, d->cfg.n_devices, d->cfg.n_stages);
        return report(d, h, LOIP_EPROTO, why);
    }
    if (h->n_tokens > d->cfg.max_tokens) {
        snprintf(why, sizeof why, "%d tokens in one message, the limit is %d", h->n_tokens, d->cfg.max_tokens);
        return report(d, h, LOIP_EPROTO, why);
    }
    if (h->kind == LOIP_MSG_TOKENS) {
        if (h->hop != 0 || h->dim != 1) {
            snprintf(why, sizeof why, "token ids for hop %d (dim %d): tokens enter at hop 0, one id each", h->hop, h->dim);
            return report(d, h, LOIP_EPROTO, why);
        }
        memcpy(d->ids, d->payload, (size_t)h->n_tokens * sizeof(int32_t));
        uint64_t t0 = loip_now_ns();
        int rc = loip_session_embed(d->cfg.session, d->ids, h->n_tokens, d->hidden);
        d->st.head_ns += loip_now_ns() - t0;
        if (rc) return report(d, h, rc, loip_last_error());
    } else {
        if (h->hop == 0 || h->dim != d->dim) {
            snprintf(why, sizeof why, "hidden states of dim %d for hop %d (model dim %d; hop 0 takes token ids)",
                     h->dim, h->hop, d->dim);
            return report(d, h, LOIP_EPROTO, why);
        }
        memcpy(d->hidden, d->payload, h->payload_bytes);
    }
    *n = h->n_tokens;
    return LOIP_OK;
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
        if ((rc = loip_runner_stage(d->cfg.runner, stage, d->hidden, n, h.pos)))
            return report(d, &h, rc, loip_last_error());
        if (d->cfg.slowdown > 1.0f) { /* a slower board: its compute takes slowdown x as long */
            loip_runner_stats_t after;
            loip_runner_stats(d->cfg.runner, &after);
            double extra = (double)(after.compute_ns - before.compute_ns) * (d->cfg.slowdown - 1.0f);
            uint64_t until = loip_now_ns() + (uint64_t)extra;
            while (loip_now_ns() < until) loip_sleep_ms((int32_t)((until - loip_now_ns()) / 1000000));
        }
        d->st.hops++;
        if (h.hop + 1 == d->cfg.n_devices * d->cfg.n_stages) return finish(d, &h, n);
        h.hop++;
        if (d->cfg.n_devices == 1) continue;
        loip_msg_header o = h;
        o.kind = LOIP_MSG_HIDDEN, o.dtype = LOIP_F32, o.dim = d->dim;
        o.payload_bytes = (uint64_t)n * d->dim * sizeof(float);
        if ((rc = send_timed(d, d->cfg.next, &o, d->hidden))) return report(d, &h, rc, loip_last_error());
        return LOIP_OK;
    }
}

LOIP_API int loip_device_serve(loip_device *d, int32_t timeout_ms, loip_msg_header *out,
                               void *out_payload, uint64_t cap, char *from) {
    for (;;) {
        loip_msg_header h;
        uint64_t t0 = loip_now_ns();
        int rc = loip_sock_recv(d->cfg.in, timeout_ms, &h, d->payload, d->payload_cap, d->from);
        uint64_t waited = loip_now_ns() - t0;
        if (rc == LOIP_ETIMEDOUT) return 0;
        if (rc) {
            d->st.rejected++;
            return report(d, NULL, rc, loip_last_error());
        }
        if (h.kind != LOIP_MSG_TOKENS && h.kind != LOIP_MSG_HIDDEN) {
            if (h.payload_bytes > cap) {
                d->st.rejected++;
                return report(d, &h, LOIP_EPROTO, "control message larger than the caller's buffer");
            }
            *out = h;
            memcpy(out_payload, d->payload, h.payload_bytes);
            if (from) snprintf(from, 64, "%s", d->from);
            return 1;
        }
        d->st.recv_wait_ns += waited;
        loip_heartbeat_busy(d->cfg.heartbeat, 1);
        rc = serve_data(d, h, waited);
        loip_heartbeat_busy(d->cfg.heartbeat, 0);
        if (rc) return rc;
    }
}

LOIP_API int loip_device_stats(loip_device *d, loip_device_stats_t *out) {
    *out = d->st;
    return LOIP_OK;
}
