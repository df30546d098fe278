/* Internal: a session's KV cache, an object of its own: paging and growth (kv_cache.c), lending
 * and eviction (kv_lend.c), copy-on-write sharing and the prompt cache's holds (kv_share.c).
 * The session (session.c) owns one and exports its operations as loip_session_kv_* (loip.h);
 * the forward pass (forward.c) reads and writes its rows. */
#ifndef LOIP_KV_CACHE_H
#define LOIP_KV_CACHE_H

#include <stddef.h>

#include "loip.h"

/* The KV cache is paged and shared by up to max_seqs sequences (requests): a sequence's
 * positions live in groups of kv_block tokens, one group holding those positions of every
 * layer kept here, found through the sequence's block table; a group is taken from the free
 * list when a sequence first writes into it and returned when the sequence ends, so that
 * sequences of any lengths share the pool. The pool is layer-major: a (layer, group) chunk
 * of kv_block rows is contiguous, so that a stage's layers of a group can be lent to
 * another device and their pages given back (loip_kv_lend) without the rest. */
typedef struct loip_kv {
    int n_layers;          /* the model's */
    int max_ctx;
    size_t kv_dim;         /* floats of one position's keys (and of its values) */
    loip_budget *budget;   /* NULL, or charged to "kv" and "prompt_cache" */
    uint64_t bytes;        /* the whole cache: pool and counted tables (loip_kv_size) */
    /* Growth (loip_kv_set_growth): the pool is charged group by group as sequences take groups,
     * not all at once; charged is what "kv" holds of this cache now */
    int grows;
    uint64_t group_bytes, charged;
    size_t pool_bytes;     /* each of k_cache and v_cache: anonymous mappings, zero and not
                              resident until written */
    int kv_block;          /* tokens per group */
    int blocks_per_seq;    /* ceil(max_ctx / kv_block): a sequence's block table */
    int max_seqs;
    int kv_tokens;         /* positions asked for */
    int n_groups;          /* groups in the pool: ceil(kv_tokens / kv_block) */
    int n_kv_layers;       /* layers whose cache is kept here */
    int32_t *layer_slot;   /* (n_layers) index of a layer among the kept ones, -1: not kept */
    int32_t *block_table;  /* (max_seqs, blocks_per_seq) group holding each logical block, -1 */
    int32_t *free_groups;  /* stack of n_free unused groups */
    int n_free;
    float *k_cache;        /* (n_kv_layers, n_groups, kv_block, kv_dim) the pool's keys */
    float *v_cache;        /* (n_kv_layers, n_groups, kv_block, kv_dim) the pool's values */
    /* Lending (kv_lend.c): lent[g * n_kv_layers + slot] marks a chunk whose rows live on
     * another device now; seq_lent[seq * n_kv_layers + slot] counts those away (not attached)
     * per sequence and layer: a stage must not run over a layer with any away. */
    uint8_t *lent;
    int32_t *seq_lent;
    /* a lent chunk's rows while its blob is back for a stage (loip_kv_attach): K then V in the
     * lender's buffer, read in place; NULL: away (seq_lent counts those) */
    const uint8_t **lent_at;
    uint64_t chunk_bytes;  /* K and V of one (layer, group) chunk */
    /* Sharing (kv_share.c): refs[g] counts the block tables and the prompt cache's holds
     * naming group g (0: free), holds[g] the holds alone; a group named more than once is
     * never written (a write copies it first: copy-on-write). A group only the cache holds
     * (refs == holds > 0) is charged to the "prompt_cache" account rather than "kv" (growing
     * caches: cache_charged) and is evicted, least recently held or adopted first (tick),
     * when a sequence needs a group and none is free or the budget refuses one; gen[g] counts
     * g's returns to the free list (a hold is still there while its gen is unchanged). */
    int32_t *refs;
    int32_t *holds;
    uint64_t *tick;
    uint32_t *gen;
    uint64_t ticks, cache_charged, cache_evictions, cow_copies;
    /* Eviction (loip_kv_evict): a sequence's first evicted[seq] positions keep no KV here; a
     * batch recomputes them (the forward pass reads their rows from the batch instead). */
    int32_t *evicted;
    /* Windows (kv_window.c): a layer windowed by the model (loip_model_config.layer_window) whose
     * ring (the window and a batch, win_ring positions) is shorter than max_ctx keeps its KV
     * apart from the pool, position p of a sequence in row p % win_ring of its ring, and never
     * more: a batch's rows never overwrite a row one of its tokens still reads (its positions
     * span at most window - 1 + max_batch). Ringed layers are not paged, lent nor shared by groups
     * (layer_slot -1); the ring is charged to "kv" whole. The prompt cache carries them apart: a
     * held group g may hold a snapshot win_snap[g] of the rows a sequence reads from its end
     * (snap_end[g] positions) on: the window - 1 positions before it, of every ringed layer
     * (loip_kv_hold_window), charged to "prompt_cache" and freed with g's last hold; a sequence
     * adopting groups that end at g starts its rings from it (loip_kv_adopt). */
    int n_win_layers;      /* layers ringed here */
    int32_t *win_slot;     /* (n_layers) index of a layer among the ringed ones, -1: not ringed here */
    int32_t window, win_ring;
    int32_t *win_len;      /* (max_seqs) one past the highest position a sequence wrote in its ring */
    float *win_k, *win_v;  /* (max_seqs, n_win_layers, win_ring, kv_dim) */
    size_t win_map_bytes;  /* each of win_k and win_v */
    float **win_snap;      /* (n_groups) NULL, or (2, n_win_layers, window - 1, kv_dim): K then V of
                              positions snap_end - window + 1 .. snap_end - 1 (those >= 0, first) */
    int32_t *snap_end;     /* (n_groups) positions before the snapshot's end: the group's end */
    int32_t n_snaps;       /* snapshots held */
    uint64_t snap_bytes;   /* one snapshot's */
    /* Snapshots wanted (loip_kv_window_at): when seq's rings pass want_end[seq] (> 0), their
     * snapshot there goes to held group want_id[seq] if it is still the one of gen want_gen[seq] */
    int32_t *want_id, *want_end;
    uint32_t *want_gen;
} loip_kv;

/* Bytes of a cache of kv_tokens positions (<= 0: max_ctx) of the layers kv_mask marks (NULL: the
 * first kv_layers layers, < 0 or past the model's: all of them) for max_seqs sequences (<= 0: 1)
 * and batches of max_batch: the pool, the block tables, the free list and the layer slots, and
 * the windowed layers' rings, as loip_kv_new charges them. */
uint64_t loip_kv_size(const loip_model_config *c, int32_t max_ctx, int32_t max_batch, const uint8_t *kv_mask,
                      int32_t kv_layers, int32_t kv_tokens, int32_t max_seqs);
/* A cache of kv_tokens positions (> 0) for max_seqs sequences (> 0) of max_ctx positions each,
 * keeping the layers kv_layers marks (NULL: all); growing (loip_kv_set_growth) from the start
 * when grows. Its tables, charged to budget's "kv" (NULL: none) whole (growing: the tables
 * alone): the budget's code and message when it refuses. */
int loip_kv_new(const loip_model_config *c, int32_t max_ctx, int32_t max_batch, int32_t kv_tokens, int32_t max_seqs,
                const uint8_t *kv_layers, int grows, loip_budget *budget, loip_kv **out);
/* Its pool mapped, once the owner has charged the rest of itself: not resident until written
 * while growing, else resident whole (the first steps pay no page faults). */
int loip_kv_map_pool(loip_kv *kv);
/* Its charges released, its budget reference dropped. NULL-safe. */
void loip_kv_free(loip_kv *kv);

/* The first row of chunk (layer slot, group g) of pool (k_cache or v_cache). */
static inline float *chunk_at(const loip_kv *kv, float *pool, int slot, int32_t g) {
    return pool + ((size_t)slot * kv->n_groups + (size_t)g) * kv->kv_block * kv->kv_dim;
}

/* The "kv" account of a growing cache follows what it holds: bytes charged (the budget may
 * refuse: its code, its message) or released. No-ops otherwise. */
int loip_kv_charge(loip_kv *kv, uint64_t bytes);
void loip_kv_release(loip_kv *kv, uint64_t bytes);
/* loip_session_set_kv_growth: LOIP_ESTATE while any sequence holds KV. */
int loip_kv_set_growth(loip_kv *kv, int32_t grows);

/* ---- paging (kv_cache.c) ---- */
/* seq's KV ready for a token at pos: groups for positions 0..pos (what it attends to), taken
 * where it has none yet past its evicted ones; then the group holding pos made its own
 * (copy-on-write). */
int loip_kv_prepare(loip_kv *kv, int32_t seq, int32_t pos);
/* seq's groups wholly past position last back to the pool (those lent away stay). */
void loip_kv_trim(loip_kv *kv, int32_t seq, int32_t last);
/* Group g of seq back to the free list: its charge released, less its chunks lent away (their
 * charge went with them), and their lending forgotten. */
void loip_kv_release_group(loip_kv *kv, int32_t seq, int32_t g);
/* Every group of seq back (loip_session_seq_free). */
int loip_kv_seq_free(loip_kv *kv, int32_t seq);
int32_t loip_kv_groups_held(const loip_kv *kv, int32_t seq);

/* ---- windows (kv_window.c) ---- */
/* The ring's positions per sequence for cfg's windowed layers at this context and batch; 0 when
 * no layer is windowed or the ring would not be shorter than max_ctx (the pool keeps them). */
int32_t loip_kv_ring_tokens(const loip_model_config *c, int32_t max_ctx, int32_t max_batch);
/* Whether layer l is windowed by the model (whatever the context). */
int loip_kv_layer_windowed(const loip_model_config *c, int32_t l);
/* Map the rings (resident, zero), once the owner has charged them with the rest. */
int loip_kv_map_rings(loip_kv *kv);
/* The first row of ringed layer slot w of seq (keys or values): win_ring rows. */
static inline float *ring_at(const loip_kv *kv, float *ring, int w, int32_t seq) {
    return ring + ((size_t)seq * kv->n_win_layers + (size_t)w) * kv->win_ring * kv->kv_dim;
}
/* Sequence dst's rings take src's rows the positions from n_positions on read (those past
 * n_positions - window): LOIP_ESTATE when src's ring no longer holds them. */
int loip_kv_share_rings(loip_kv *kv, int32_t dst, int32_t src, int32_t n_positions);
/* Held group i of seq (its positions end at (i + 1) * kv_block) given a snapshot of seq's rings
 * at its end (as loip_session_kv_hold_window); seq's rings from a held group's snapshot ending at
 * n_positions (its own LOIP_ESTATE when g carries none ending there). */
int loip_kv_hold_window(loip_kv *kv, int32_t seq, int32_t i);
int loip_kv_adopt_window(loip_kv *kv, int32_t seq, int32_t g, int32_t n_positions);
/* Held group id (ending at end) to get seq's rings at end once seq has written them (as
 * loip_session_kv_window_at); the snapshots wanted whose sequences' rings passed their end taken
 * (before a batch writes the rings: loip_session_prepare) or, for seq, dropped (seq freed). */
int loip_kv_window_at(loip_kv *kv, int32_t seq, int32_t id, int32_t end);
void loip_kv_take_wants(loip_kv *kv);
void loip_kv_drop_want(loip_kv *kv, int32_t seq);
/* Group g's snapshot freed and its charge released (none: nothing); every snapshot freed, their
 * charges left to the caller (loip_kv_free releases "prompt_cache" whole). */
void loip_kv_snap_free(loip_kv *kv, int32_t g);
/* The disk tier's copies: held group id's snapshot (snap_bytes) and where it ends; one loaded
 * into held group id (as loip_session_kv_read_window / _load_window). */
int loip_kv_read_window(loip_kv *kv, int32_t id, void *buf, uint64_t cap, int32_t *end);
int loip_kv_load_window(loip_kv *kv, int32_t id, int32_t end, const void *buf, uint64_t bytes);
void loip_kv_snaps_free_all(loip_kv *kv);
/* The least recently used group only the prompt cache holds (with_window: of those carrying a
 * snapshot) evicted, its snapshot freed; 0: none was. */
int loip_kv_evict_held(loip_kv *kv, int with_window);

/* ---- lending and eviction (kv_lend.c): as loip_session_kv_* in loip.h ---- */
int loip_kv_lend(loip_kv *kv, int32_t seq, int32_t layer0, int32_t layer1, int32_t g0, int32_t n, void *buf,
                 uint64_t cap, uint64_t *bytes);
int loip_kv_return(loip_kv *kv, int32_t seq, int32_t layer0, int32_t layer1, int32_t g0, int32_t n,
                   const void *buf, uint64_t bytes);
int loip_kv_attach(loip_kv *kv, int32_t seq, int32_t layer0, int32_t layer1, int32_t g0, int32_t n,
                   const void *buf, uint64_t bytes);
int loip_kv_detach(loip_kv *kv, int32_t seq, int32_t layer0, int32_t layer1, int32_t g0, int32_t n);
int loip_kv_evict(loip_kv *kv, int32_t seq, int32_t positions);
int32_t loip_kv_evicted(const loip_kv *kv, int32_t seq);

/* ---- sharing and the prompt cache (kv_share.c): as loip_session_* in loip.h ---- */
/* A group for sequence seq at position pos (seq < 0: the prompt cache's disk tier): a free one,
 * else the prompt cache's least recent evicted for it; charged to "kv". LOIP_ENOMEM naming them
 * when none can be had. */
int loip_kv_take_group(loip_kv *kv, int32_t seq, int32_t pos, int32_t *out);
/* Sequence seq's group holding pos made its own before it is written: a shared one is copied
 * (every kept layer's rows) into a fresh group (copy-on-write). */
int loip_kv_own_group(loip_kv *kv, int32_t seq, int32_t pos);
/* One reference to shared group g (refs > 1) gone: left to the cache alone, its charge moves
 * from "kv" to "prompt_cache". */
void loip_kv_unref_group(loip_kv *kv, int32_t g);
int loip_kv_share(loip_kv *kv, int32_t dst, int32_t src, int32_t n_positions);
int loip_kv_hold(loip_kv *kv, int32_t seq, int32_t first, int32_t n, int32_t *ids);
int loip_kv_adopt(loip_kv *kv, int32_t seq, const int32_t *ids, int32_t n);
int loip_kv_drop(loip_kv *kv, int32_t id);
int32_t loip_kv_refs(const loip_kv *kv, int32_t id);
uint32_t loip_kv_gen(const loip_kv *kv, int32_t id);
void loip_kv_stats(const loip_kv *kv, loip_kv_share_stats *st);
int loip_kv_touch(loip_kv *kv, int32_t id);
int loip_kv_read_group(loip_kv *kv, int32_t id, void *buf, uint64_t cap);
int loip_kv_load_group(loip_kv *kv, const void *buf, uint64_t bytes, int32_t *id);

#endif
