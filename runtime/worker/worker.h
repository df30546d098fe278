/* Internal: a worker's device loop (device.c) and its KV lending (lending.c). Lending keeps its
 * own state (lend_state) and returns 0 or a LOIP_E* code with the detail in loip_last_error();
 * the device loop decides what to tell the head. */
#ifndef LOIP_WORKER_H
#define LOIP_WORKER_H

#include "loip.h"

/* A sequence slot: the request it runs (its sampler and history: the device's head). */
typedef struct seq_state {
    uint32_t request;   /* 0: free */
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

/* One device's lending, both sides. The first block is the device's, fixed at lend_init; the
 * rest is lending's own. */
typedef struct lend_state {
    loip_session *session;
    loip_runner *runner;    /* events recorded there */
    loip_budget *budget;    /* "kv": the staging buffer; "kv_lent": blobs held (NULL: none) */
    const seq_state *seqs;  /* (max_seqs) the device's slots: which request each runs */
    int32_t max_seqs, n_stages;
    uint32_t plan_id;
    /* this device the lender */
    loip_sock *peer;        /* to the holder's in-socket (NULL: not lending) */
    lend_stage *stages;     /* (n_stages) */
    int32_t *groups;        /* (max_seqs) target groups per sequence */
    uint8_t *buf;           /* staging: one stage's blob, shipped or fetched */
    uint64_t cap, charged;
    int32_t *n;             /* (2 max_seqs) a blob's groups per sequence, before and after an edit */
    uint64_t *off;          /* (2 max_seqs) and where they start in it */
    lend_entry *old;        /* (max_seqs) its entries before */
    /* this device the holder (for other devices) */
    held_blob *held;
    int32_t n_held, held_cap;
    /* statistics (loip_device_stats_t's lending fields) */
    uint64_t lent_bytes, fetched_bytes, wait_ns, held_bytes, held_in_bytes;
} lend_state;

/* Allocate L's arrays for a device's slots and stages (LOIP_ENOMEM); free what it holds and
 * release its charges. */
int lend_init(lend_state *L, loip_session *session, loip_runner *runner, loip_budget *budget,
              const seq_state *seqs, int32_t max_seqs, int32_t n_stages, uint32_t plan_id);
void lend_free(lend_state *L);

/* The lender's side: a KV message to the holder; a stage's blob asked back (if away); fetched
 * (waiting) and attached, or dropped (keep 0); after a stage ran, its blob edited and shipped
 * (and the next stage's asked back); everything away brought home; a new peer and targets
 * (loip_device_lend's arguments, checked by the caller); every request ended: what is away
 * forgotten at the holder. */
int lend_send(lend_state *L, int kind, int32_t stage, uint64_t step, const void *payload, uint64_t bytes);
int lend_ask(lend_state *L, int32_t stage, uint64_t step);
int lend_fetch(lend_state *L, int32_t stage, uint64_t step, int keep);
int lend_ship(lend_state *L, int32_t stage, uint64_t step);
int lend_recall(lend_state *L);
int lend_set(lend_state *L, loip_sock *peer, const int32_t *stage_layers, const int32_t *groups);
int lend_forget(lend_state *L);

/* The holder's side: a KV_PUT/GET/DROP from `from` on the in-socket, payload in `payload`
 * (large: the payload when it did not fit there, taken). The send's code when a blob could not
 * go back, LOIP_ENOMEM when one cannot be held. */
int lend_hold(lend_state *L, loip_sock *in, const char *from, const loip_msg_header *h, const void *payload,
              void *large);

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
    loip_step_token *toks; /* (max_tokens) the message's table */
    loip_batch_token *bt;  /* (max_tokens) the same for the session */
    int32_t *rows;         /* (max_tokens) rows whose logits the last device computes */
    uint8_t *payload;   /* incoming payloads: max(hidden + table, control) bytes */
    uint64_t payload_cap;
    seq_state *seqs;    /* (max_seqs) */
    loip_head *head;    /* the slots' samplers: the last hop's outputs (runtime/exec/head.c) */
    loip_device_stats_t st; /* (its lending fields are lend's, copied by loip_device_stats) */
    char from[64];
    lend_state lend;
    /* the head cut across devices (a plan's head_shares; loip_device_head_share): this device's
     * vocabulary rows [share_first, share_last); on the last device, a range short of the whole
     * vocabulary sends its logits round the ring (LOIP_MSG_LOGITS) for the others' rows */
    int32_t share_first, share_last;
    int share_ring;
};

/* device.c, for head_share.c: an ERROR to the head (returns rc), a timed send, and a step's
 * outputs from its n_rows rows of logits in d->logits (a RESULT to the head) */
int device_report(loip_device *d, const loip_msg_header *in, int rc, const char *msg);
int device_send_timed(loip_device *d, loip_sock *s, const loip_msg_header *h, const void *payload);
int device_outputs(loip_device *d, const loip_msg_header *in, int32_t n_rows, int32_t n_logits, uint64_t t0);
/* head_share.c: the last device's step head when the head is cut (after its rows and its own
 * share: sends LOGITS on), and a LOGITS message served (a share added and passed on, or, back on
 * the last device, the step's outputs) */
int head_share_send(loip_device *d, const loip_msg_header *in, int32_t n, int32_t n_rows, int32_t n_logits);
int head_share_serve(loip_device *d, const loip_msg_header *h);

#endif
