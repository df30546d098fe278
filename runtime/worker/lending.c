/* KV lending between devices (the paper's bandwidth-sensitive KV transfer protocol, Alg. 2),
 * both sides of it, over its own state (lend_state, worker.h): the lender ships each stage's
 * oldest KV groups to its holder after the stage runs and fetches them back before it runs
 * again; the holder keeps the blobs by lender and stage. Failures return a LOIP_E* code with
 * the detail in loip_last_error(); the device loop (device.c) reports them to the head. See
 * loip.h (loip_device_lend) and docs/design.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "exec/model.h"
#include "exec/session.h"
#include "memory/budget.h"
#include "worker/worker.h"

/* ---- KV lending (loip_device_lend): the lender's side ---------------------------------- */

/* The staging buffer's room (memory; its charge follows the live bytes in it: lend_charge). */
static int lend_room(lend_state *L, uint64_t bytes) {
    if (bytes <= L->cap) return LOIP_OK;
    uint8_t *b = realloc(L->buf, bytes);
    if (!b) return loip_fail(LOIP_ENOMEM, "KV lending: cannot hold a staging buffer of %llu bytes", (unsigned long long)bytes);
    L->buf = b;
    L->cap = bytes;
    return LOIP_OK;
}

/* The "kv" account's share for the staging buffer set to bytes (the blob it holds): released
 * before the chunks it held are charged back, charged after the chunks it takes are released,
 * so that no edit of a blob needs both at once. */
static int lend_charge(lend_state *L, uint64_t bytes) {
    if (!L->budget) {
        L->charged = bytes;
        return LOIP_OK;
    }
    if (bytes < L->charged) loip_budget_release(L->budget, "kv", L->charged - bytes);
    else if (bytes > L->charged) {
        int rc = loip_budget_charge(L->budget, "kv", bytes - L->charged);
        if (rc) return loip_fail(rc, "KV lending: the staging buffer: %s", loip_last_error());
    }
    L->charged = bytes;
    return LOIP_OK;
}

int lend_send(lend_state *L, int kind, int32_t stage, uint64_t step, const void *payload, uint64_t bytes) {
    loip_msg_header h = {.kind = (uint16_t)kind, .plan_id = L->plan_id, .hop = stage, .step = step,
                         .dtype = -1, .payload_bytes = bytes};
    uint64_t t0 = loip_now_ns();
    int rc = loip_sock_send(L->peer, NULL, &h, payload, 10000);
    if (bytes) loip_runner_record(L->runner, LOIP_EVENT_SEND, stage, t0, loip_now_ns(), sizeof h + bytes);
    return rc;
}

/* Ask the holder for stage's blob now, if it is away and not asked for yet. */
int lend_ask(lend_state *L, int32_t stage, uint64_t step) {
    lend_stage *ls = &L->stages[stage];
    if (!ls->away || ls->asked) return LOIP_OK;
    int rc = lend_send(L, LOIP_MSG_KV_GET, stage, step, NULL, 0);
    if (rc == 0) ls->asked = 1;
    return rc;
}

/* The blob in the staging buffer: a header, its entries, then each entry's groups in order,
 * each group the K/V chunks of the stage's layers (loip_session_kv_lend of one group), so that
 * an entry grows or shrinks at its end. */
static lend_header blob_header(const lend_state *L) {
    lend_header lh;
    memcpy(&lh, L->buf, sizeof lh);
    return lh;
}
static lend_entry blob_entry(const lend_state *L, int32_t i) {
    lend_entry e;
    memcpy(&e, L->buf + sizeof(lend_header) + (uint64_t)i * sizeof e, sizeof e);
    return e;
}
static int entry_live(const lend_state *L, const lend_entry *e) {
    return e->seq >= 0 && e->seq < L->max_seqs && e->request && L->seqs[e->seq].request == e->request;
}
/* K and V of one group of layers [layer0, layer1) as lent: the paged layers' (a ringed
 * sliding-window layer's KV is never lent: kv_window.c) */
static uint64_t group_bytes_of(const lend_state *L, int32_t layer0, int32_t layer1) {
    const loip_kv *kv = L->session->kv;
    uint64_t paged = 0;
    for (int32_t l = layer0; l < layer1 && l < kv->n_layers; l++) paged += l >= 0 && kv->layer_slot[l] >= 0;
    return loip_session_kv_chunk_bytes(L->session) * paged;
}

/* Each group of each live entry of the blob in the staging buffer: attached (read there in
 * place), detached, or returned into the session (from its first `keep` groups on). */
enum { BLOB_ATTACH, BLOB_DETACH };
static int blob_each(lend_state *L, int op) {
    lend_header lh = blob_header(L);
    uint64_t gb = group_bytes_of(L, lh.layer0, lh.layer1);
    uint64_t off = sizeof lh + (uint64_t)lh.n_entries * sizeof(lend_entry);
    for (int32_t i = 0; i < lh.n_entries; i++) {
        lend_entry e = blob_entry(L, i);
        for (int32_t g = 0; g < e.n && entry_live(L, &e); g++) {
            int rc = op == BLOB_ATTACH
                         ? loip_session_kv_attach(L->session, e.seq, lh.layer0, lh.layer1, e.g0 + g, 1,
                                                  L->buf + off + (uint64_t)g * gb, gb)
                         : loip_session_kv_detach(L->session, e.seq, lh.layer0, lh.layer1, e.g0 + g, 1);
            if (rc) return rc;
        }
        off += (uint64_t)e.n * gb;
    }
    return LOIP_OK;
}

/* Stage's blob back from the holder (waiting for it) into the staging buffer, its groups read
 * there in place while the stage runs; entries of requests that ended since stay unread.
 * keep 0: dropped whole (its requests are gone). */
int lend_fetch(lend_state *L, int32_t stage, uint64_t step, int keep) {
    lend_stage *ls = &L->stages[stage];
    if (!ls->away) return LOIP_OK;
    int rc = lend_ask(L, stage, step);
    if (rc) return rc;
    loip_msg_header h;
    uint64_t t0 = loip_now_ns();
    rc = loip_sock_recv(L->peer, 30000, &h, L->buf, L->cap, NULL);
    uint64_t t1 = loip_now_ns();
    L->wait_ns += t1 - t0;
    if (rc) return loip_fail(rc, "KV lending: stage %d's KV did not come back from the holder: %s", stage,
                             loip_last_error());
    uint64_t from = h.t_send_ns && h.t_send_ns <= t1 ? h.t_send_ns : t0;
    loip_runner_record(L->runner, LOIP_EVENT_RECV, stage, from, t1, sizeof h + h.payload_bytes);
    if (h.kind != LOIP_MSG_KV_DATA || h.hop != stage)
        return loip_fail(LOIP_EPROTO, "KV lending: kind %u for stage %d came back, KV_DATA for stage %d expected",
                         h.kind, h.hop, stage);
    ls->away = ls->asked = 0;
    if (h.payload_bytes == 0)
        return loip_fail(LOIP_EPROTO, "KV lending: the holder has no KV of stage %d (it was lost)", stage);
    L->fetched_bytes += h.payload_bytes;
    if (!keep) return lend_charge(L, 0);
    /* the blob's chunks were away, not charged here: now they are in the staging buffer */
    if ((rc = lend_charge(L, h.payload_bytes))) return rc;
    lend_header lh = blob_header(L);
    uint64_t need = sizeof lh + (uint64_t)(lh.n_entries > 0 ? lh.n_entries : 0) * sizeof(lend_entry);
    if (h.payload_bytes < sizeof lh || lh.magic != LEND_MAGIC || lh.n_entries < 0 || lh.layer1 <= lh.layer0 ||
        need > h.payload_bytes)
        return loip_fail(LOIP_EPROTO, "KV lending: stage %d's blob is malformed", stage);
    for (int32_t i = 0; i < lh.n_entries; i++) {
        lend_entry e = blob_entry(L, i);
        if (e.n < 0) return loip_fail(LOIP_EPROTO, "KV lending: stage %d's blob is malformed (entry %d)", stage, i);
        need += (uint64_t)e.n * group_bytes_of(L, lh.layer0, lh.layer1);
    }
    if (need != h.payload_bytes)
        return loip_fail(LOIP_EPROTO, "KV lending: stage %d's blob holds %llu bytes, its entries %llu", stage,
                         (unsigned long long)h.payload_bytes, (unsigned long long)need);
    if ((rc = blob_each(L, BLOB_ATTACH))) return rc;
    ls->home = 1;
    return LOIP_OK;
}

/* Groups of sequence q a stage lends now: its target, at most all but its newest. */
static int32_t lend_count(const lend_state *L, int32_t q) {
    if (!L->seqs[q].request) return 0;
    int32_t held = loip_session_kv_groups_held(L->session, q);
    int32_t n = L->groups[q] < held - 1 ? L->groups[q] : held - 1;
    return n > 0 ? n : 0;
}

/* One edit of a stage's blob by lend_ship. The per-sequence tables live in lend_state: n
 * (groups, old then new), off (where they start, old then new), old (the old entries). */
typedef struct ship_plan {
    int32_t l0, l1;   /* the stage's layers */
    uint64_t gb;      /* bytes of one group of them */
    uint64_t old_end; /* the old blob's bytes (0 groups when it was not home) */
    int32_t ne;       /* entries of the new blob */
    uint64_t bytes;   /* the new blob's bytes */
} ship_plan;

/* What the blob holds now, by sequence slot (old n, off and entry), its groups detached from
 * the session: entries of ended requests, or of other layers (a plan change), are left out. */
static int ship_index_old(lend_state *L, const lend_stage *ls, ship_plan *p) {
    int32_t n_old_e = 0;
    lend_header oh = {LEND_MAGIC, 0, p->l0, p->l1};
    if (ls->home) {
        oh = blob_header(L);
        n_old_e = oh.n_entries;
        int rc = blob_each(L, BLOB_DETACH);
        if (rc) return rc;
    }
    uint64_t ogb = group_bytes_of(L, oh.layer0, oh.layer1);
    int32_t *old_n = L->n;
    memset(old_n, 0, (size_t)L->max_seqs * sizeof *old_n);
    uint64_t off = sizeof oh + (uint64_t)n_old_e * sizeof(lend_entry);
    for (int32_t i = 0; i < n_old_e; i++) {
        lend_entry e = blob_entry(L, i);
        if (entry_live(L, &e) && oh.layer0 == p->l0 && oh.layer1 == p->l1)
            old_n[e.seq] = e.n, L->off[e.seq] = off, L->old[e.seq] = e;
        off += (uint64_t)e.n * ogb;
    }
    p->old_end = off;
    return LOIP_OK;
}

/* What each sequence lends now (new n, p->ne entries); what leaves the blob goes back into the
 * session, the charge for it leaving the staging buffer first. The blob is not home after. */
static int ship_return(lend_state *L, lend_stage *ls, ship_plan *p) {
    int32_t M = L->max_seqs, *old_n = L->n, *new_n = L->n + M;
    uint64_t keep_bytes = sizeof(lend_header);
    p->ne = 0;
    for (int32_t q = 0; q < M; q++) {
        new_n[q] = L->peer && p->l1 > p->l0 ? lend_count(L, q) : 0;
        int32_t kept = old_n[q] < new_n[q] ? old_n[q] : new_n[q];
        if (new_n[q] > 0) p->ne++, keep_bytes += sizeof(lend_entry);
        keep_bytes += (uint64_t)kept * p->gb;
    }
    int rc = lend_charge(L, ls->home ? keep_bytes : 0);
    for (int32_t q = 0; q < M && !rc && ls->home; q++)
        for (int32_t g = new_n[q]; g < old_n[q] && !rc; g++)
            rc = loip_session_kv_return(L->session, q, p->l0, p->l1, L->old[q].g0 + g, 1,
                                        L->buf + L->off[q] + (uint64_t)g * p->gb, p->gb);
    ls->home = 0;
    return rc;
}

/* The kept groups moved to their new places (entries in slot order both times): new off, and
 * the new blob's size. */
static int ship_move_kept(lend_state *L, ship_plan *p) {
    int32_t M = L->max_seqs, *old_n = L->n, *new_n = L->n + M;
    uint64_t *old_off = L->off, *new_off = L->off + M;
    p->bytes = sizeof(lend_header) + (uint64_t)p->ne * sizeof(lend_entry);
    for (int32_t q = 0; q < M; q++) {
        new_off[q] = p->bytes;
        p->bytes += (uint64_t)new_n[q] * p->gb;
    }
    int rc = lend_room(L, p->bytes > p->old_end ? p->bytes : p->old_end);
    for (int32_t pass = 0; pass < 2 && !rc; pass++)
        for (int32_t k = 0; k < M; k++) {
            int32_t q = pass == 0 ? M - 1 - k : k; /* right-movers last first, then left-movers */
            int32_t kept = old_n[q] < new_n[q] ? old_n[q] : new_n[q];
            if (kept <= 0 || (pass == 0) != (new_off[q] > old_off[q])) continue;
            memmove(L->buf + new_off[q], L->buf + old_off[q], (size_t)kept * p->gb);
        }
    return rc;
}

/* The groups that join are lent (released from the session) into their places. */
static int ship_lend_new(lend_state *L, const ship_plan *p) {
    int32_t M = L->max_seqs, *old_n = L->n, *new_n = L->n + M;
    const uint64_t *new_off = L->off + M;
    int rc = LOIP_OK;
    for (int32_t q = 0; q < M && !rc; q++) {
        int32_t g0 = loip_session_kv_evicted(L->session, q) / LOIP_KV_BLOCK_TOKENS;
        for (int32_t g = old_n[q] < new_n[q] ? old_n[q] : new_n[q]; g < new_n[q] && !rc; g++) {
            uint64_t got;
            rc = loip_session_kv_lend(L->session, q, p->l0, p->l1, g0 + g, 1,
                                      L->buf + new_off[q] + (uint64_t)g * p->gb, p->gb, &got);
        }
    }
    return rc;
}

/* The new blob's header and entries written, and the blob sent to the holder. */
static int ship_send(lend_state *L, lend_stage *ls, int32_t stage, uint64_t step, const ship_plan *p) {
    const int32_t *new_n = L->n + L->max_seqs;
    lend_header lh = {LEND_MAGIC, p->ne, p->l0, p->l1};
    memcpy(L->buf, &lh, sizeof lh);
    int32_t i = 0;
    for (int32_t q = 0; q < L->max_seqs; q++) {
        if (new_n[q] <= 0) continue;
        lend_entry e = {q, L->seqs[q].request, loip_session_kv_evicted(L->session, q) / LOIP_KV_BLOCK_TOKENS,
                        new_n[q]};
        memcpy(L->buf + sizeof lh + (uint64_t)i++ * sizeof e, &e, sizeof e);
    }
    int rc = lend_send(L, LOIP_MSG_KV_PUT, stage, step, L->buf, p->bytes);
    if (rc) return loip_fail(rc, "KV lending: stage %d's KV could not be shipped: %s", stage, loip_last_error());
    L->lent_bytes += p->bytes;
    ls->away = 1;
    return LOIP_OK;
}

/* After stage ran (its blob, if any, attached in the staging buffer): the blob edited in place
 * to what each running sequence lends now (entries of ended requests dropped, shrunk ones'
 * last groups returned into the session, grown ones' next groups lent, new ones added; the
 * staging charge following the live bytes), then shipped to the holder. No peer: everything
 * goes back into the session. */
int lend_ship(lend_state *L, int32_t stage, uint64_t step) {
    lend_stage *ls = &L->stages[stage];
    ship_plan p = {.l0 = ls->layer0, .l1 = ls->layer1};
    p.gb = group_bytes_of(L, p.l0, p.l1);
    int rc = ship_index_old(L, ls, &p);
    if (rc) return rc;
    rc = ship_return(L, ls, &p);
    if (!rc && p.ne > 0) rc = ship_move_kept(L, &p);
    if (!rc && p.ne > 0) rc = ship_lend_new(L, &p);
    /* the lent groups charged here */
    if (!rc) rc = lend_charge(L, p.ne > 0 ? p.bytes : 0);
    if (!rc && p.ne > 0) rc = ship_send(L, ls, stage, step, &p);
    if (rc) return rc;
    return L->peer ? lend_ask(L, (stage + 1) % L->n_stages, step) : LOIP_OK;
}

/* Stage's blob, back and attached, into the session for good. */
static int lend_settle(lend_state *L, int32_t stage) {
    if (!L->stages[stage].home) return LOIP_OK;
    loip_sock *peer = L->peer;
    L->peer = NULL; /* lend_ship with no peer: everything returns */
    int rc = lend_ship(L, stage, 0);
    L->peer = peer;
    return rc;
}

int lend_recall(lend_state *L) {
    for (int32_t k = 0; k < L->n_stages; k++) {
        int rc = lend_fetch(L, k, 0, 1);
        if (rc == 0) rc = lend_settle(L, k);
        if (rc) return rc;
    }
    return LOIP_OK;
}

int lend_set(lend_state *L, loip_sock *peer, const int32_t *stage_layers, const int32_t *groups) {
    int moved = peer != L->peer;
    for (int32_t k = 0; stage_layers && k < L->n_stages; k++)
        moved |= L->stages[k].away &&
                 (L->stages[k].layer0 != stage_layers[2 * k] || L->stages[k].layer1 != stage_layers[2 * k + 1]);
    if (moved && L->peer) {
        int rc = lend_recall(L);
        if (rc) return rc;
    }
    L->peer = peer;
    if (!peer) { /* nothing is away (recalled above): the staging buffer goes */
        free(L->buf);
        L->buf = NULL;
        if (L->budget) loip_budget_release(L->budget, "kv", L->charged);
        L->charged = L->cap = 0;
    }
    for (int32_t k = 0; stage_layers && k < L->n_stages; k++)
        L->stages[k].layer0 = stage_layers[2 * k], L->stages[k].layer1 = stage_layers[2 * k + 1];
    for (int32_t q = 0; q < L->max_seqs; q++) L->groups[q] = groups && groups[q] > 0 ? groups[q] : 0;
    return LOIP_OK;
}

/* No request left: what is away is stale, forgotten at the holder. */
int lend_forget(lend_state *L) {
    for (int32_t k = 0; k < L->n_stages; k++) {
        lend_stage *ls = &L->stages[k];
        int rc = LOIP_OK;
        if (ls->asked) rc = lend_fetch(L, k, 0, 0);
        else if (ls->away) rc = lend_send(L, LOIP_MSG_KV_DROP, k, 0, NULL, 0);
        ls->away = ls->asked = ls->home = 0;
        if (rc) return rc;
    }
    return LOIP_OK;
}

/* ---- KV lending: the holder's side --------------------------------------------------------- */

static held_blob *held_find(lend_state *L, const char *from, int32_t stage) {
    for (int32_t i = 0; i < L->n_held; i++)
        if (L->held[i].stage == stage && !strcmp(L->held[i].from, from)) return &L->held[i];
    return NULL;
}

static void held_drop(lend_state *L, held_blob *b) {
    if (!b) return;
    if (L->budget) loip_budget_release(L->budget, "kv_lent", b->bytes);
    L->held_bytes -= b->bytes;
    free(b->data);
    *b = L->held[--L->n_held];
}

/* A lending message on the in-socket: keep, give back or forget a blob. large: the payload
 * when it did not fit the device's buffer (ours to keep or free). */
int lend_hold(lend_state *L, loip_sock *in, const char *from, const loip_msg_header *h, const void *payload,
              void *large) {
    if (h->kind == LOIP_MSG_KV_DROP) {
        held_drop(L, held_find(L, from, h->hop));
        return LOIP_OK;
    }
    if (h->kind == LOIP_MSG_KV_GET) {
        held_blob *b = held_find(L, from, h->hop);
        loip_msg_header o = {.kind = LOIP_MSG_KV_DATA, .plan_id = h->plan_id, .hop = h->hop, .step = h->step,
                             .dtype = -1, .payload_bytes = b ? b->bytes : 0};
        uint64_t t0 = loip_now_ns();
        int rc = loip_sock_send(in, from, &o, b ? b->data : NULL, 10000);
        if (b) loip_runner_record(L->runner, LOIP_EVENT_SEND, -1, t0, loip_now_ns(), sizeof o + b->bytes);
        held_drop(L, b);
        if (rc) return loip_fail(rc, "KV lent by %s (stage %d) could not go back: %s", from, h->hop, loip_last_error());
        return LOIP_OK;
    }
    /* KV_PUT */
    held_drop(L, held_find(L, from, h->hop));
    if (L->budget && loip_budget_charge(L->budget, "kv_lent", h->payload_bytes)) {
        free(large);
        return loip_fail(LOIP_ENOMEM, "cannot hold %llu bytes of KV lent by %s (stage %d): %s",
                         (unsigned long long)h->payload_bytes, from, h->hop, loip_last_error());
    }
    uint8_t *data = large;
    if (!data && (data = malloc(h->payload_bytes ? h->payload_bytes : 1))) memcpy(data, payload, h->payload_bytes);
    if (L->n_held == L->held_cap) {
        int32_t cap = L->held_cap ? 2 * L->held_cap : 8;
        held_blob *nb = realloc(L->held, (size_t)cap * sizeof *nb);
        if (nb) L->held = nb, L->held_cap = cap;
    }
    if (!data || L->n_held == L->held_cap) {
        free(data);
        if (L->budget) loip_budget_release(L->budget, "kv_lent", h->payload_bytes);
        return loip_fail(LOIP_ENOMEM, "out of memory holding lent KV");
    }
    held_blob *b = &L->held[L->n_held++];
    snprintf(b->from, sizeof b->from, "%s", from);
    b->stage = h->hop, b->data = data, b->bytes = h->payload_bytes;
    L->held_bytes += b->bytes;
    L->held_in_bytes += b->bytes;
    return LOIP_OK;
}

/* ---- its state ------------------------------------------------------------------------------ */

int lend_init(lend_state *L, loip_session *session, loip_runner *runner, loip_budget *budget,
              const seq_state *seqs, int32_t max_seqs, int32_t n_stages, uint32_t plan_id) {
    memset(L, 0, sizeof *L);
    L->session = session, L->runner = runner, L->budget = budget, L->seqs = seqs;
    L->max_seqs = max_seqs, L->n_stages = n_stages, L->plan_id = plan_id;
    L->stages = calloc((size_t)n_stages, sizeof *L->stages);
    L->groups = calloc((size_t)max_seqs, sizeof *L->groups);
    L->n = calloc((size_t)max_seqs * 2, sizeof *L->n);
    L->off = calloc((size_t)max_seqs * 2, sizeof *L->off);
    L->old = calloc((size_t)max_seqs, sizeof *L->old);
    if (!L->stages || !L->groups || !L->n || !L->off || !L->old) {
        lend_free(L);
        return loip_fail(LOIP_ENOMEM, "KV lending: out of memory");
    }
    return LOIP_OK;
}

void lend_free(lend_state *L) {
    free(L->stages);
    free(L->groups);
    free(L->n);
    free(L->off);
    free(L->old);
    free(L->buf);
    for (int32_t i = 0; i < L->n_held; i++) free(L->held[i].data);
    free(L->held);
    if (L->budget) {
        loip_budget_release(L->budget, "kv", L->charged);
        loip_budget_release(L->budget, "kv_lent", L->held_bytes);
    }
    memset(L, 0, sizeof *L);
}
