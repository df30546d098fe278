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

/* A sequence slot: the request it runs and, on the last device, its sampler and history. */
typedef struct seq_state {
    uint32_t request;   /* 0: free */
    loip_sampler *sampler;
    loip_sampler_params params;
    int32_t *history;   /* prompt and sampled ids, for the repetition penalty */
    int32_t n_history, max_history;
} seq_state;

/* A blob of lent KV (KV_PUT/KV_DATA payloads): a header, its entries, then the chunks of each
 * entry in loip_session_kv_lend's order. */
typedef struct lend_header {
    uint32_t magic;     /* LEND_MAGIC */
    int32_t n_entries;
    int32_t layer0, layer1;
} lend_header;
typedef struct lend_entry {
    int32_t seq;
    uint32_t request;   /* the slot's request when lent: another one's entries are stale */
    int32_t g0, n;      /* groups [g0, g0 + n) of the sequence */
} lend_entry;
enum { LEND_MAGIC = 0x4b564c44 /* "KVLD" */ };

/* The lender's side: per stage, whether its blob is at the holder and whether it was asked
 * back. The holder's: the blobs it keeps, by lender and stage. */
typedef struct lend_stage {
    int32_t layer0, layer1;
    int away, asked;
    int home;   /* its blob is back in the staging buffer, attached */
} lend_stage;
typedef struct held_blob {
    char from[64];
    int32_t stage;
    uint8_t *data;
    uint64_t bytes;
} held_blob;

struct loip_device {
    loip_device_config cfg;
    const loip_model *m;
    int32_t dim, vocab;
    int32_t out_cap;    /* rows of logits one message may need (sampled and returned) */
    loip_budget *budget;
    uint64_t charged;
    float *hidden;      /* (max_tokens, dim), then room for the token table */
    uint8_t *result;    /* out_cap loip_step_output, then logits (out_cap, vocab) */
    float *logits;      /* inside result */
    int32_t *ids;       /* (max_tokens) */
    loip_step_token *toks; /* (max_tokens) the message's table */
    loip_batch_token *bt;  /* (max_tokens) the same for the session */
    int32_t *rows;         /* (max_tokens) rows whose logits the last device computes */
    uint8_t *payload;   /* incoming payloads: max(hidden + table, control) bytes */
    uint64_t payload_cap;
    seq_state *seqs;    /* (max_seqs) */
    loip_device_stats_t st;
    char from[64];
    /* lending (this device the lender) */
    loip_sock *lend_peer;
    lend_stage *lend;       /* (n_stages) */
    int32_t *lend_groups;   /* (max_seqs) target groups per sequence */
    uint8_t *lend_buf;      /* staging: one stage's blob, shipped or fetched */
    uint64_t lend_cap, lend_charged;
    /* holding (for other devices) */
    held_blob *held;
    int32_t n_held, held_cap;
};

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
    z->ids = (uint64_t)max_tokens * (sizeof(int32_t) * 2 + sizeof(loip_step_token) + sizeof(loip_batch_token));
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

static void seq_clear(seq_state *q) {
    loip_sampler_free(q->sampler);
    free(q->history);
    memset(q, 0, sizeof *q);
}

LOIP_API void loip_device_free(loip_device *d) {
    if (!d) return;
    loip_aligned_free(d->hidden);
    loip_aligned_free(d->result);
    free(d->ids);
    free(d->toks);
    free(d->bt);
    free(d->rows);
    free(d->payload);
    if (d->seqs)
        for (int32_t i = 0; i < d->cfg.max_seqs; i++) seq_clear(&d->seqs[i]);
    free(d->seqs);
    free(d->lend);
    free(d->lend_groups);
    free(d->lend_buf);
    for (int32_t i = 0; i < d->n_held; i++) free(d->held[i].data);
    free(d->held);
    if (d->budget) {
        loip_budget_release(d->budget, "kv", d->lend_charged);
        loip_budget_release(d->budget, "kv_lent", d->st.held_bytes);
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
    d->ids = malloc(T * sizeof(int32_t));
    d->toks = malloc(T * sizeof *d->toks);
    d->bt = malloc(T * sizeof *d->bt);
    d->rows = malloc(T * sizeof(int32_t));
    d->payload = malloc(d->payload_cap);
    d->seqs = calloc((size_t)d->cfg.max_seqs, sizeof *d->seqs);
    d->lend = calloc((size_t)d->cfg.n_stages, sizeof *d->lend);
    d->lend_groups = calloc((size_t)d->cfg.max_seqs, sizeof *d->lend_groups);
    if (!d->hidden || !d->result || !d->ids || !d->toks || !d->bt || !d->rows || !d->payload || !d->seqs ||
        !d->lend || !d->lend_groups) {
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
    seq_state *q = &d->seqs[seq];
    seq_clear(q);
    loip_session_seq_free(d->cfg.session, seq);
    q->sampler = smp, q->params = *p, q->history = h;
    q->n_history = n_prompt, q->max_history = max_history;
    q->request = request;
    return LOIP_OK;
}

static int lend_fetch(loip_device *d, int32_t stage, uint64_t step, int keep);
static int lend_send(loip_device *d, int kind, int32_t stage, uint64_t step, const void *payload, uint64_t bytes);

LOIP_API int loip_device_end(loip_device *d, int32_t seq, uint32_t request) {
    if (seq < 0 || seq >= d->cfg.max_seqs)
        return loip_fail(LOIP_EINVAL, "device: sequence slot %d out of range (%d slots)", seq, d->cfg.max_seqs);
    seq_state *q = &d->seqs[seq];
    if (request != 0 && q->request != request)
        return loip_fail(LOIP_ESTATE, "device: slot %d runs request %u, not %u", seq, q->request, request);
    seq_clear(q);
    int rc = loip_session_seq_free(d->cfg.session, seq);
    if (rc || !d->lend_peer) return rc;
    /* no request left: what is away is stale, forget it at the holder */
    for (int32_t i = 0; i < d->cfg.max_seqs; i++)
        if (d->seqs[i].request) return LOIP_OK;
    for (int32_t k = 0; k < d->cfg.n_stages; k++) {
        lend_stage *ls = &d->lend[k];
        if (ls->asked) rc = lend_fetch(d, k, 0, 0);
        else if (ls->away) rc = lend_send(d, LOIP_MSG_KV_DROP, k, 0, NULL, 0);
        ls->away = ls->asked = ls->home = 0;
        if (rc) return rc;
    }
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

/* ---- KV lending (loip_device_lend): the lender's side ---------------------------------- */

/* The staging buffer's room (memory; its charge follows the live bytes in it: lend_charge). */
static int lend_room(loip_device *d, uint64_t bytes) {
    if (bytes <= d->lend_cap) return LOIP_OK;
    uint8_t *b = realloc(d->lend_buf, bytes);
    if (!b) return loip_fail(LOIP_ENOMEM, "KV lending: cannot hold a staging buffer of %llu bytes", (unsigned long long)bytes);
    d->lend_buf = b;
    d->lend_cap = bytes;
    return LOIP_OK;
}

/* The "kv" account's share for the staging buffer set to bytes (the blob it holds): released
 * before the chunks it held are charged back, charged after the chunks it takes are released,
 * so that no edit of a blob needs both at once. */
static int lend_charge(loip_device *d, uint64_t bytes) {
    if (!d->budget) {
        d->lend_charged = bytes;
        return LOIP_OK;
    }
    if (bytes < d->lend_charged) loip_budget_release(d->budget, "kv", d->lend_charged - bytes);
    else if (bytes > d->lend_charged) {
        int rc = loip_budget_charge(d->budget, "kv", bytes - d->lend_charged);
        if (rc) return loip_fail(rc, "KV lending: the staging buffer: %s", loip_last_error());
    }
    d->lend_charged = bytes;
    return LOIP_OK;
}

static int lend_send(loip_device *d, int kind, int32_t stage, uint64_t step, const void *payload, uint64_t bytes) {
    loip_msg_header h = {.kind = (uint16_t)kind, .plan_id = d->cfg.plan_id, .hop = stage, .step = step,
                         .dtype = -1, .payload_bytes = bytes};
    uint64_t t0 = loip_now_ns();
    int rc = loip_sock_send(d->lend_peer, NULL, &h, payload, 10000);
    if (bytes) loip_runner_record(d->cfg.runner, LOIP_EVENT_SEND, stage, t0, loip_now_ns(), sizeof h + bytes);
    return rc;
}

/* Ask the holder for stage's blob now, if it is away and not asked for yet. */
static int lend_ask(loip_device *d, int32_t stage, uint64_t step) {
    lend_stage *ls = &d->lend[stage];
    if (!ls->away || ls->asked) return LOIP_OK;
    int rc = lend_send(d, LOIP_MSG_KV_GET, stage, step, NULL, 0);
    if (rc == 0) ls->asked = 1;
    return rc;
}

/* The blob in the staging buffer: a header, its entries, then each entry's groups in order,
 * each group the K/V chunks of the stage's layers (loip_session_kv_lend of one group), so that
 * an entry grows or shrinks at its end. */
static lend_header blob_header(const loip_device *d) {
    lend_header lh;
    memcpy(&lh, d->lend_buf, sizeof lh);
    return lh;
}
static lend_entry blob_entry(const loip_device *d, int32_t i) {
    lend_entry e;
    memcpy(&e, d->lend_buf + sizeof(lend_header) + (uint64_t)i * sizeof e, sizeof e);
    return e;
}
static int entry_live(const loip_device *d, const lend_entry *e) {
    return e->seq >= 0 && e->seq < d->cfg.max_seqs && e->request && d->seqs[e->seq].request == e->request;
}
static uint64_t group_bytes_of(const loip_device *d, int32_t layer0, int32_t layer1) {
    return loip_session_kv_chunk_bytes(d->cfg.session) * (uint64_t)(layer1 - layer0);
}

/* Each group of each live entry of the blob in the staging buffer: attached (read there in
 * place), detached, or returned into the session (from its first `keep` groups on). */
enum { BLOB_ATTACH, BLOB_DETACH };
static int blob_each(loip_device *d, int op) {
    lend_header lh = blob_header(d);
    uint64_t gb = group_bytes_of(d, lh.layer0, lh.layer1);
    uint64_t off = sizeof lh + (uint64_t)lh.n_entries * sizeof(lend_entry);
    for (int32_t i = 0; i < lh.n_entries; i++) {
        lend_entry e = blob_entry(d, i);
        for (int32_t g = 0; g < e.n && entry_live(d, &e); g++) {
            int rc = op == BLOB_ATTACH
                         ? loip_session_kv_attach(d->cfg.session, e.seq, lh.layer0, lh.layer1, e.g0 + g, 1,
                                                  d->lend_buf + off + (uint64_t)g * gb, gb)
                         : loip_session_kv_detach(d->cfg.session, e.seq, lh.layer0, lh.layer1, e.g0 + g, 1);
            if (rc) return rc;
        }
        off += (uint64_t)e.n * gb;
    }
    return LOIP_OK;
}

/* Stage's blob back from the holder (waiting for it) into the staging buffer, its groups read
 * there in place while the stage runs; entries of requests that ended since stay unread.
 * keep 0: dropped whole (its requests are gone). */
static int lend_fetch(loip_device *d, int32_t stage, uint64_t step, int keep) {
    lend_stage *ls = &d->lend[stage];
    if (!ls->away) return LOIP_OK;
    int rc = lend_ask(d, stage, step);
    if (rc) return rc;
    loip_msg_header h;
    uint64_t t0 = loip_now_ns();
    rc = loip_sock_recv(d->lend_peer, 30000, &h, d->lend_buf, d->lend_cap, NULL);
    uint64_t t1 = loip_now_ns();
    d->st.lend_wait_ns += t1 - t0;
    if (rc) return loip_fail(rc, "KV lending: stage %d's KV did not come back from the holder: %s", stage,
                             loip_last_error());
    uint64_t from = h.t_send_ns && h.t_send_ns <= t1 ? h.t_send_ns : t0;
    loip_runner_record(d->cfg.runner, LOIP_EVENT_RECV, stage, from, t1, sizeof h + h.payload_bytes);
    if (h.kind != LOIP_MSG_KV_DATA || h.hop != stage)
        return loip_fail(LOIP_EPROTO, "KV lending: kind %u for stage %d came back, KV_DATA for stage %d expected",
                         h.kind, h.hop, stage);
    ls->away = ls->asked = 0;
    if (h.payload_bytes == 0)
        return loip_fail(LOIP_EPROTO, "KV lending: the holder has no KV of stage %d (it was lost)", stage);
    d->st.fetched_bytes += h.payload_bytes;
    if (!keep) return lend_charge(d, 0);
    /* the blob's chunks were away, not charged here: now they are in the staging buffer */
    if ((rc = lend_charge(d, h.payload_bytes))) return rc;
    lend_header lh = blob_header(d);
    uint64_t need = sizeof lh + (uint64_t)(lh.n_entries > 0 ? lh.n_entries : 0) * sizeof(lend_entry);
    if (h.payload_bytes < sizeof lh || lh.magic != LEND_MAGIC || lh.n_entries < 0 || lh.layer1 <= lh.layer0 ||
        need > h.payload_bytes)
        return loip_fail(LOIP_EPROTO, "KV lending: stage %d's blob is malformed", stage);
    for (int32_t i = 0; i < lh.n_entries; i++) {
        lend_entry e = blob_entry(d, i);
        if (e.n < 0) return loip_fail(LOIP_EPROTO, "KV lending: stage %d's blob is malformed (entry %d)", stage, i);
        need += (uint64_t)e.n * group_bytes_of(d, lh.layer0, lh.layer1);
    }
    if (need != h.payload_bytes)
        return loip_fail(LOIP_EPROTO, "KV lending: stage %d's blob holds %llu bytes, its entries %llu", stage,
                         (unsigned long long)h.payload_bytes, (unsigned long long)need);
    if ((rc = blob_each(d, BLOB_ATTACH))) return rc;
    ls->home = 1;
    return LOIP_OK;
}

/* Groups of sequence q a stage lends now: its target, at most all but its newest. */
static int32_t lend_count(const loip_device *d, int32_t q) {
    if (!d->seqs[q].request) return 0;
    int32_t held = loip_session_kv_groups_held(d->cfg.session, q);
    int32_t n = d->lend_groups[q] < held - 1 ? d->lend_groups[q] : held - 1;
    return n > 0 ? n : 0;
}

/* After stage ran (its blob, if any, attached in the staging buffer): the blob edited in place
 * to what each running sequence lends now (entries of ended requests dropped, shrunk ones'
 * last groups returned into the session, grown ones' next groups lent, new ones added; the
 * staging charge following the live bytes), then shipped to the holder. No peer: everything
 * goes back into the session. */
static int lend_ship(loip_device *d, int32_t stage, uint64_t step) {
    lend_stage *ls = &d->lend[stage];
    int rc;
    int32_t l0 = ls->layer0, l1 = ls->layer1;
    uint64_t gb = group_bytes_of(d, l0, l1);
    /* what the blob holds now (old) and what it will (new), by sequence slot */
    int32_t n_old_e = 0;
    lend_header oh = {LEND_MAGIC, 0, l0, l1};
    if (ls->home) {
        oh = blob_header(d);
        n_old_e = oh.n_entries;
        if ((rc = blob_each(d, BLOB_DETACH))) return rc;
    }
    uint64_t ogb = group_bytes_of(d, oh.layer0, oh.layer1);
    int32_t M = d->cfg.max_seqs;
    int32_t *old_n = calloc((size_t)M * 2, sizeof(int32_t)), *new_n = old_n + M;
    uint64_t *old_off = calloc((size_t)M * 2, sizeof(uint64_t)), *new_off = old_off + M;
    lend_entry *old_e = calloc((size_t)M, sizeof(lend_entry));
    if (!old_n || !old_off || !old_e) {
        free(old_n), free(old_off), free(old_e);
        return loip_fail(LOIP_ENOMEM, "KV lending: out of memory");
    }
    uint64_t off = sizeof oh + (uint64_t)n_old_e * sizeof(lend_entry), live = sizeof oh;
    for (int32_t i = 0; i < n_old_e; i++) {
        lend_entry e = blob_entry(d, i);
        if (entry_live(d, &e) && oh.layer0 == l0 && oh.layer1 == l1) {
            old_n[e.seq] = e.n, old_off[e.seq] = off, old_e[e.seq] = e;
            live += sizeof e + (uint64_t)e.n * gb;
        }
        off += (uint64_t)e.n * ogb;
    }
    /* 1. what leaves the blob goes back into the session: the charge for it leaves the
     * staging buffer first */
    int32_t ne = 0;
    uint64_t keep_bytes = sizeof oh;
    for (int32_t q = 0; q < M; q++) {
        new_n[q] = d->lend_peer && l1 > l0 ? lend_count(d, q) : 0;
        int32_t kept = old_n[q] < new_n[q] ? old_n[q] : new_n[q];
        if (new_n[q] > 0) ne++, keep_bytes += sizeof(lend_entry);
        keep_bytes += (uint64_t)kept * gb;
    }
    rc = lend_charge(d, ls->home ? keep_bytes : 0);
    for (int32_t q = 0; q < M && !rc && ls->home; q++)
        for (int32_t g = new_n[q]; g < old_n[q] && !rc; g++)
            rc = loip_session_kv_return(d->cfg.session, q, l0, l1, old_e[q].g0 + g, 1,
                                        d->lend_buf + old_off[q] + (uint64_t)g * gb, gb);
    /* entries of ended requests, or of other layers (a plan change), are stale: dropped */
    ls->home = 0;
    /* 2. the kept groups moved to their new places (entries in slot order both times) */
    uint64_t bytes = sizeof oh + (uint64_t)ne * sizeof(lend_entry);
    for (int32_t q = 0; q < M; q++) {
        new_off[q] = bytes;
        bytes += (uint64_t)new_n[q] * gb;
    }
    if (!rc && ne > 0) rc = lend_room(d, bytes > off ? bytes : off);
    for (int32_t pass = 0; pass < 2 && !rc && ne > 0; pass++)
        for (int32_t k = 0; k < M; k++) {
            int32_t q = pass == 0 ? M - 1 - k : k; /* right-movers last first, then left-movers */
            int32_t kept = old_n[q] < new_n[q] ? old_n[q] : new_n[q];
            if (kept <= 0 || (pass == 0) != (new_off[q] > old_off[q])) continue;
            memmove(d->lend_buf + new_off[q], d->lend_buf + old_off[q], (size_t)kept * gb);
        }
    /* 3. the groups that join are lent (released from the session), then charged here */
    for (int32_t q = 0; q < M && !rc && ne > 0; q++) {
        int32_t g0 = loip_session_kv_evicted(d->cfg.session, q) / LOIP_KV_BLOCK_TOKENS;
        for (int32_t g = old_n[q] < new_n[q] ? old_n[q] : new_n[q]; g < new_n[q] && !rc; g++) {
            uint64_t got;
            rc = loip_session_kv_lend(d->cfg.session, q, l0, l1, g0 + g, 1, d->lend_buf + new_off[q] + (uint64_t)g * gb,
                                      gb, &got);
        }
    }
    if (!rc) rc = lend_charge(d, ne > 0 ? bytes : 0);
    if (!rc && ne > 0) {
        lend_header lh = {LEND_MAGIC, ne, l0, l1};
        memcpy(d->lend_buf, &lh, sizeof lh);
        int32_t i = 0;
        for (int32_t q = 0; q < M; q++) {
            if (new_n[q] <= 0) continue;
            lend_entry e = {q, d->seqs[q].request, loip_session_kv_evicted(d->cfg.session, q) / LOIP_KV_BLOCK_TOKENS,
                            new_n[q]};
            memcpy(d->lend_buf + sizeof lh + (uint64_t)i++ * sizeof e, &e, sizeof e);
        }
        if ((rc = lend_send(d, LOIP_MSG_KV_PUT, stage, step, d->lend_buf, bytes)))
            rc = loip_fail(rc, "KV lending: stage %d's KV could not be shipped: %s", stage, loip_last_error());
        else {
            d->st.lent_bytes += bytes;
            ls->away = 1;
        }
    }
    (void)live;
    free(old_n), free(old_off), free(old_e);
    if (rc) return rc;
    return d->lend_peer ? lend_ask(d, (stage + 1) % d->cfg.n_stages, step) : LOIP_OK;
}

/* Stage's blob, back and attached, into the session for good. */
static int lend_settle(loip_device *d, int32_t stage) {
    if (!d->lend[stage].home) return LOIP_OK;
    loip_sock *peer = d->lend_peer;
    int32_t *groups = d->lend_groups;
    d->lend_peer = NULL; /* lend_ship with no peer: everything returns */
    int rc = lend_ship(d, stage, 0);
    d->lend_peer = peer, d->lend_groups = groups;
    return rc;
}

LOIP_API int loip_device_recall(loip_device *d) {
    for (int32_t k = 0; k < d->cfg.n_stages; k++) {
        int rc = lend_fetch(d, k, 0, 1);
        if (rc == 0) rc = lend_settle(d, k);
        if (rc) return rc;
    }
    return LOIP_OK;
}

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
    int moved = peer != d->lend_peer;
    for (int32_t k = 0; stage_layers && k < d->cfg.n_stages; k++)
        moved |= d->lend[k].away && (d->lend[k].layer0 != stage_layers[2 * k] || d->lend[k].layer1 != stage_layers[2 * k + 1]);
    if (moved && d->lend_peer) {
        int rc = loip_device_recall(d);
        if (rc) return rc;
    }
    d->lend_peer = peer;
    if (!peer) { /* nothing is away (recalled above): the staging buffer goes */
        free(d->lend_buf);
        d->lend_buf = NULL;
        if (d->budget) loip_budget_release(d->budget, "kv", d->lend_charged);
        d->lend_charged = d->lend_cap = 0;
    }
    for (int32_t k = 0; stage_layers && k < d->cfg.n_stages; k++)
        d->lend[k].layer0 = stage_layers[2 * k], d->lend[k].layer1 = stage_layers[2 * k + 1];
    for (int32_t q = 0; q < d->cfg.max_seqs; q++) d->lend_groups[q] = groups && groups[q] > 0 ? groups[q] : 0;
    return LOIP_OK;
}

/* ---- KV lending: the holder's side --------------------------------------------------------- */

static held_blob *held_find(loip_device *d, const char *from, int32_t stage) {
    for (int32_t i = 0; i < d->n_held; i++)
        if (d->held[i].stage == stage && !strcmp(d->held[i].from, from)) return &d->held[i];
    return NULL;
}

static void held_drop(loip_device *d, held_blob *b) {
    if (!b) return;
    if (d->budget) loip_budget_release(d->budget, "kv_lent", b->bytes);
    d->st.held_bytes -= b->bytes;
    free(b->data);
    *b = d->held[--d->n_held];
}

/* A lending message on the in-socket: keep, give back or forget a blob. large: the payload
 * when it did not fit the device's buffer (ours to keep or free). */
static int hold(loip_device *d, const loip_msg_header *h, void *large) {
    char why[300];
    if (h->kind == LOIP_MSG_KV_DROP) {
        held_drop(d, held_find(d, d->from, h->hop));
        return LOIP_OK;
    }
    if (h->kind == LOIP_MSG_KV_GET) {
        held_blob *b = held_find(d, d->from, h->hop);
        loip_msg_header o = {.kind = LOIP_MSG_KV_DATA, .plan_id = h->plan_id, .hop = h->hop, .step = h->step,
                             .dtype = -1, .payload_bytes = b ? b->bytes : 0};
        uint64_t t0 = loip_now_ns();
        int rc = loip_sock_send(d->cfg.in, d->from, &o, b ? b->data : NULL, 10000);
        if (b) loip_runner_record(d->cfg.runner, LOIP_EVENT_SEND, -1, t0, loip_now_ns(), sizeof o + b->bytes);
        held_drop(d, b);
        if (rc) {
            snprintf(why, sizeof why, "KV lent by %s (stage %d) could not go back: %s", d->from, h->hop, loip_last_error());
            return report(d, h, rc, why);
        }
        return LOIP_OK;
    }
    /* KV_PUT */
    held_drop(d, held_find(d, d->from, h->hop));
    if (d->budget && loip_budget_charge(d->budget, "kv_lent", h->payload_bytes)) {
        free(large);
        snprintf(why, sizeof why, "cannot hold %llu bytes of KV lent by %s (stage %d): %s",
                 (unsigned long long)h->payload_bytes, d->from, h->hop, loip_last_error());
        return report(d, h, LOIP_ENOMEM, why);
    }
    uint8_t *data = large;
    if (!data && (data = malloc(h->payload_bytes ? h->payload_bytes : 1))) memcpy(data, d->payload, h->payload_bytes);
    if (d->n_held == d->held_cap) {
        int32_t cap = d->held_cap ? 2 * d->held_cap : 8;
        held_blob *nb = realloc(d->held, (size_t)cap * sizeof *nb);
        if (nb) d->held = nb, d->held_cap = cap;
    }
    if (!data || d->n_held == d->held_cap) {
        free(data);
        if (d->budget) loip_budget_release(d->budget, "kv_lent", h->payload_bytes);
        return report(d, h, LOIP_ENOMEM, "out of memory holding lent KV");
    }
    held_blob *b = &d->held[d->n_held++];
    snprintf(b->from, sizeof b->from, "%s", d->from);
    b->stage = h->hop, b->data = data, b->bytes = h->payload_bytes;
    d->st.held_bytes += b->bytes;
    return LOIP_OK;
}

/* The last hop's output: per flagged token a sampled id or its logits, to the head (a result
 * with no outputs when nothing is flagged: the head hears of every step). */
static int finish(loip_device *d, const loip_msg_header *in, int32_t n) {
    loip_step_output *outs = (loip_step_output *)d->result;
    int32_t n_rows = 0, n_logits = 0;
    /* rows returned as logits first, in order, then the rows only sampled */
    for (int pass = 0; pass < 2; pass++)
        for (int32_t t = 0; t < n; t++) {
            int32_t f = d->toks[t].flags;
            if (!(f & (LOIP_TOKF_SAMPLE | LOIP_TOKF_LOGITS)) || !!(f & LOIP_TOKF_LOGITS) != (pass == 0)) continue;
            if (n_rows == d->out_cap)
                return report(d, in, LOIP_EINVAL, "more tokens flagged for output than one result holds");
            if (pass == 0 && ++n_logits > d->cfg.logits_tokens)
                return report(d, in, LOIP_EINVAL, "logits asked for more tokens than the logits buffer holds");
            outs[n_rows] = (loip_step_output){d->toks[t].seq, d->toks[t].request, -1, f};
            d->rows[n_rows++] = t;
        }
    uint64_t t0 = loip_now_ns();
    int rc;
    if (n_rows > 0 && (rc = loip_session_head_rows(d->cfg.session, d->hidden, n, d->rows, n_rows, d->logits)))
        return report(d, in, rc, loip_last_error());
    for (int32_t i = 0; i < n_rows; i++) {
        if (!(outs[i].flags & LOIP_TOKF_SAMPLE)) continue;
        seq_state *q = &d->seqs[outs[i].seq];
        if (!q->sampler) return report(d, in, LOIP_ESTATE, "a token to sample in a slot without a sampler");
        if ((rc = loip_sampler_sample(q->sampler, d->logits + (size_t)i * d->vocab, &q->params, q->history,
                                      q->n_history, &outs[i].id)))
            return report(d, in, rc, loip_last_error());
        if (q->n_history < q->max_history) q->history[q->n_history++] = outs[i].id;
    }
    d->st.head_ns += loip_now_ns() - t0;
    /* the outputs, then the returned logits rows right after them */
    uint64_t out_bytes = (uint64_t)n_rows * sizeof *outs, logit_bytes = (uint64_t)n_logits * d->vocab * sizeof(float);
    if (n_logits > 0 && (uint8_t *)d->logits != d->result + out_bytes)
        memmove(d->result + out_bytes, d->logits, logit_bytes);
    loip_msg_header h = {.kind = LOIP_MSG_RESULT, .plan_id = d->cfg.plan_id, .hop = in->hop + 1,
                         .step = in->step, .n_tokens = n_rows, .dim = d->vocab, .dtype = -1,
                         .payload_bytes = out_bytes + logit_bytes};
    if ((rc = send_timed(d, d->cfg.head, &h, d->result))) return report(d, in, rc, loip_last_error());
    return LOIP_OK;
}

/* Check a data message against the plan; on success its tokens/hidden and table are in place. */
static int accept(loip_device *d, const loip_msg_header *h, int32_t *n) {
    char why[300];
    int32_t hops = d->cfg.n_devices * d->cfg.n_stages;
    if (h->plan_id != d->cfg.plan_id) {
        snprintf(why, sizeof why, "message for plan %u, this device runs plan %u (stale)", h->plan_id, d->cfg.plan_id);
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
    int32_t k = h->n_tokens;
    if (h->kind == LOIP_MSG_TOKENS) {
        if (h->hop != 0 || h->dim != 1) {
            snprintf(why, sizeof why, "token ids for hop %d (dim %d): tokens enter at hop 0, one id each", h->hop, h->dim);
            return report(d, h, LOIP_EPROTO, why);
        }
    } else if (h->hop == 0 || h->dim != d->dim) {
        snprintf(why, sizeof why, "hidden states of dim %d for hop %d (model dim %d; hop 0 takes token ids)",
                 h->dim, h->hop, d->dim);
        return report(d, h, LOIP_EPROTO, why);
    }
    uint64_t data = (uint64_t)k * (uint64_t)h->dim * 4;
    memcpy(d->toks, d->payload + data, (size_t)k * sizeof *d->toks);
    for (int32_t t = 0; t < k; t++) {
        const loip_step_token *e = &d->toks[t];
        if (e->seq < 0 || e->seq >= d->cfg.max_seqs) {
            snprintf(why, sizeof why, "token %d of the batch in sequence slot %d (this device has %d)", t, e->seq,
                     d->cfg.max_seqs);
            return report(d, h, LOIP_EPROTO, why);
        }
        if (e->request == 0 || e->request != d->seqs[e->seq].request) {
            snprintf(why, sizeof why, "token %d of the batch is of request %u, slot %d runs request %u (stale)", t,
                     e->request, e->seq, d->seqs[e->seq].request);
            return report(d, h, LOIP_EPROTO, why);
        }
        d->bt[t] = (loip_batch_token){e->seq, e->pos};
    }
    /* a sequence recomputing positions 0..E-1 (rows so flagged) has evicted them: from now on */
    for (int32_t t = 0; t < k; t++) {
        if (!(d->toks[t].flags & LOIP_TOKF_RECOMPUTE) || d->toks[t].pos != 0) continue;
        int32_t q = d->toks[t].seq, e = 0;
        while (t + e < k && d->toks[t + e].seq == q && (d->toks[t + e].flags & LOIP_TOKF_RECOMPUTE)) e++;
        if (e > loip_session_kv_evicted(d->cfg.session, q)) {
            int rc = loip_session_kv_evict(d->cfg.session, q, e);
            if (rc) return report(d, h, rc, loip_last_error());
        }
    }
    if (h->kind == LOIP_MSG_TOKENS) {
        memcpy(d->ids, d->payload, (size_t)k * sizeof(int32_t));
        uint64_t t0 = loip_now_ns();
        int rc = loip_session_embed(d->cfg.session, d->ids, k, d->hidden);
        d->st.head_ns += loip_now_ns() - t0;
        if (rc) return report(d, h, rc, loip_last_error());
    } else {
        memcpy(d->hidden, d->payload, data);
    }
    *n = k;
    return LOIP_OK;
}

/* After a stage's output left: its KV lent out, the next stage's asked back. */
static int lend_after(loip_device *d, const loip_msg_header *h, int32_t stage) {
    int rc = lend_ship(d, stage, h->step);
    return rc ? report(d, h, rc, loip_last_error()) : LOIP_OK;
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
        if ((rc = lend_fetch(d, stage, h.step, 1))) return report(d, &h, rc, loip_last_error());
        if ((rc = loip_runner_stage_batch(d->cfg.runner, stage, d->hidden, n, d->bt)))
            return report(d, &h, rc, loip_last_error());
        if (d->cfg.slowdown > 1.0f) { /* a slower board: its compute takes slowdown x as long */
            loip_runner_stats_t after;
            loip_runner_stats(d->cfg.runner, &after);
            double extra = (double)(after.compute_ns - before.compute_ns) * (d->cfg.slowdown - 1.0f);
            uint64_t until = loip_now_ns() + (uint64_t)extra;
            while (loip_now_ns() < until) loip_sleep_ms((int32_t)((until - loip_now_ns()) / 1000000));
        }
        d->st.hops++;
        /* the next stage's lent KV asked back now, before the output goes on: the holder, idle
         * until that output reaches it, answers first, and the blob travels during the hops
         * in between */
        if (d->lend_peer && (rc = lend_ask(d, (stage + 1) % d->cfg.n_stages, h.step)))
            return report(d, &h, rc, loip_last_error());
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
        if ((rc = send_timed(d, d->cfg.next, &o, d->hidden))) return report(d, &h, rc, loip_last_error());
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
            return report(d, NULL, rc, loip_last_error());
        }
        if (h.kind == LOIP_MSG_KV_PUT || h.kind == LOIP_MSG_KV_GET || h.kind == LOIP_MSG_KV_DROP) {
            if ((rc = hold(d, &h, large))) return rc;
            continue;
        }
        if (large) { /* only lent KV may exceed the device's buffer */
            free(large);
            d->st.rejected++;
            return report(d, &h, LOIP_EPROTO, "a message larger than the device's buffer");
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
