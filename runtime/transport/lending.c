/* KV lending between devices (the paper's bandwidth-sensitive KV transfer protocol, Alg. 2),
 * both sides of it, in the device loop (device.c calls in): the lender ships each stage's oldest
 * KV groups to its holder after the stage runs and fetches them back before it runs again; the
 * holder keeps the blobs by lender and stage. See loip.h (loip_device_lend) and docs/design.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "exec/model.h"
#include "exec/session.h"
#include "memory/budget.h"
#include "transport/device_internal.h"

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

int loip_lend_send(loip_device *d, int kind, int32_t stage, uint64_t step, const void *payload, uint64_t bytes) {
    loip_msg_header h = {.kind = (uint16_t)kind, .plan_id = d->cfg.plan_id, .hop = stage, .step = step,
                         .dtype = -1, .payload_bytes = bytes};
    uint64_t t0 = loip_now_ns();
    int rc = loip_sock_send(d->lend_peer, NULL, &h, payload, 10000);
    if (bytes) loip_runner_record(d->cfg.runner, LOIP_EVENT_SEND, stage, t0, loip_now_ns(), sizeof h + bytes);
    return rc;
}

/* Ask the holder for stage's blob now, if it is away and not asked for yet. */
int loip_lend_ask(loip_device *d, int32_t stage, uint64_t step) {
    lend_stage *ls = &d->lend[stage];
    if (!ls->away || ls->asked) return LOIP_OK;
    int rc = loip_lend_send(d, LOIP_MSG_KV_GET, stage, step, NULL, 0);
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
int loip_lend_fetch(loip_device *d, int32_t stage, uint64_t step, int keep) {
    lend_stage *ls = &d->lend[stage];
    if (!ls->away) return LOIP_OK;
    int rc = loip_lend_ask(d, stage, step);
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
int loip_lend_ship(loip_device *d, int32_t stage, uint64_t step) {
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
    int32_t *old_n = d->lend_n, *new_n = old_n + M;
    uint64_t *old_off = d->lend_off, *new_off = old_off + M;
    lend_entry *old_e = d->lend_old;
    memset(old_n, 0, (size_t)M * sizeof *old_n);
    uint64_t off = sizeof oh + (uint64_t)n_old_e * sizeof(lend_entry);
    for (int32_t i = 0; i < n_old_e; i++) {
        lend_entry e = blob_entry(d, i);
        if (entry_live(d, &e) && oh.layer0 == l0 && oh.layer1 == l1)
            old_n[e.seq] = e.n, old_off[e.seq] = off, old_e[e.seq] = e;
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
        if ((rc = loip_lend_send(d, LOIP_MSG_KV_PUT, stage, step, d->lend_buf, bytes)))
            rc = loip_fail(rc, "KV lending: stage %d's KV could not be shipped: %s", stage, loip_last_error());
        else {
            d->st.lent_bytes += bytes;
            ls->away = 1;
        }
    }
    if (rc) return rc;
    return d->lend_peer ? loip_lend_ask(d, (stage + 1) % d->cfg.n_stages, step) : LOIP_OK;
}

/* Stage's blob, back and attached, into the session for good. */
static int lend_settle(loip_device *d, int32_t stage) {
    if (!d->lend[stage].home) return LOIP_OK;
    loip_sock *peer = d->lend_peer;
    int32_t *groups = d->lend_groups;
    d->lend_peer = NULL; /* lend_ship with no peer: everything returns */
    int rc = loip_lend_ship(d, stage, 0);
    d->lend_peer = peer, d->lend_groups = groups;
    return rc;
}

LOIP_API int loip_device_recall(loip_device *d) {
    for (int32_t k = 0; k < d->cfg.n_stages; k++) {
        int rc = loip_lend_fetch(d, k, 0, 1);
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
int loip_hold(loip_device *d, const loip_msg_header *h, void *large) {
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
            return loip_device_report(d, h, rc, why);
        }
        return LOIP_OK;
    }
    /* KV_PUT */
    held_drop(d, held_find(d, d->from, h->hop));
    if (d->budget && loip_budget_charge(d->budget, "kv_lent", h->payload_bytes)) {
        free(large);
        snprintf(why, sizeof why, "cannot hold %llu bytes of KV lent by %s (stage %d): %s",
                 (unsigned long long)h->payload_bytes, d->from, h->hop, loip_last_error());
        return loip_device_report(d, h, LOIP_ENOMEM, why);
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
        return loip_device_report(d, h, LOIP_ENOMEM, "out of memory holding lent KV");
    }
    held_blob *b = &d->held[d->n_held++];
    snprintf(b->from, sizeof b->from, "%s", d->from);
    b->stage = h->hop, b->data = data, b->bytes = h->payload_bytes;
    d->st.held_bytes += b->bytes;
    return LOIP_OK;
}

