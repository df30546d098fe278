/* Internal: a device of a cluster (device.c) and its KV lending (lending.c). */
#ifndef LOIP_DEVICE_INTERNAL_H
#define LOIP_DEVICE_INTERNAL_H

#include "loip.h"

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
    int32_t *lend_n;        /* (2 max_seqs) a blob's groups per sequence, before and after an edit */
    uint64_t *lend_off;     /* (2 max_seqs) and where they start in it */
    lend_entry *lend_old;   /* (max_seqs) its entries before */
    /* holding (for other devices) */
    held_blob *held;
    int32_t n_held, held_cap;
};

/* An ERROR naming this device to the head (best effort); returns rc. */
int loip_device_report(loip_device *d, const loip_msg_header *in, int rc, const char *msg);

/* Lending, the lender's side: a KV message to the holder; a stage's blob asked back (if away);
 * fetched (waiting) and attached, or dropped (keep 0); after a stage ran, its blob edited and
 * shipped. The holder's side: a KV_PUT/GET/DROP on the in-socket (large: its payload when it
 * did not fit the device's buffer, taken). */
int loip_lend_send(loip_device *d, int kind, int32_t stage, uint64_t step, const void *payload, uint64_t bytes);
int loip_lend_ask(loip_device *d, int32_t stage, uint64_t step);
int loip_lend_fetch(loip_device *d, int32_t stage, uint64_t step, int keep);
int loip_lend_ship(loip_device *d, int32_t stage, uint64_t step);
int loip_hold(loip_device *d, const loip_msg_header *h, void *large);

#endif
