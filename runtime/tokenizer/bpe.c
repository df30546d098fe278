/* bpe.c — the BPE model shared by Hugging Face tokenizer.json / vocab.json + merges.txt,
 * tiktoken and SentencePiece BPE: a vocabulary of pieces (byte strings) with ids, ranked
 * merges (left id, right id) -> (rank, merged id); the merge loop is in bpe_encode.c.
 *
 * The three formats differ only in where the ranks come from (see loip.h, LOIP_BPE_MERGES_*):
 *   - HF: the merges list, lowest rank first; the pair of the best rank is merged, the
 *     leftmost among equal ranks (HF's Word::merge_all pops (rank, position) from a heap);
 *   - tiktoken: the pair whose concatenation has the lowest rank, leftmost among equals
 *     (tiktoken's byte_pair_merge). Every split a + b of a piece into two pieces becomes a
 *     merge ranked by the piece's rank, which is that rule (and is how HF's converter
 *     writes Llama 3's merges);
 *   - SentencePiece BPE: the adjacent pair whose concatenation is a piece with the highest
 *     score, leftmost among equals (bpe_model.cc): the same, ranked by score.
 *
 * Chunks start as bytes (byte-level: GPT-2, Llama 3, Qwen2; pieces are stored as raw bytes)
 * or as UTF-8 characters (SentencePiece style, with byte fallback to <0xXX> pieces or an unk
 * id). The merge loop keeps symbols in a doubly linked list and candidate pairs in a binary
 * heap keyed by (rank, left position); a merge invalidates the pairs that touched the two
 * symbols (a generation count per symbol) and pushes the two new ones: O(n log n) for a chunk
 * of n symbols, with the same result as rescanning all pairs after each merge (see
 * scoredbpe.c for the argument). Chunks up to CACHE_KEY bytes go through a cache.
 *
 * Memory: about 90 bytes of scratch per byte of the longest chunk (SentencePiece merges the
 * whole text as one chunk).
 *
 * Loading: a 150k vocabulary with 280k merges means about a million lookups at random in
 * tables of megabytes. The loaders size the tables once (loip_bpe_reserve) and add in batches
 * (loip_bpe_add_token_list, _merge_list) whose lookups are prefetched together. */
#define _GNU_SOURCE /* qsort_r */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/bpe.h"

/* ---- pieces ------------------------------------------------------------------------------- */

static int resize_merges(loip_bpe *b, uint32_t size);

/* The piece table at size slots (a power of two, over twice the pieces). */
static int resize_table(loip_bpe *b, uint32_t size) {
    piece_slot *t = malloc((size_t)size * sizeof *t);
    if (t == NULL) return loip_fail(LOIP_ENOMEM, "bpe: no memory for the piece table");
    for (uint32_t i = 0; i < size; i++) t[i] = (piece_slot){0, -1, 0, 0};
    for (uint32_t i = 0; b->table && i <= b->table_mask; i++) {
        piece_slot e = b->table[i];
        if (e.id < 0) continue;
        uint32_t s = (uint32_t)b->info[e.id].hash & (size - 1);
        while (t[s].id >= 0) s = (s + 1) & (size - 1);
        t[s] = e;
    }
    free(b->table);
    b->table = t;
    b->table_mask = size - 1;
    return 0;
}

static int grow_ids(loip_bpe *b, int32_t need) {
    if (need <= b->cap_ids) return 0;
    int32_t cap = b->cap_ids ? b->cap_ids : 1024;
    while (cap < need) cap *= 2;
    piece_info *info = realloc(b->info, (size_t)cap * sizeof *info);
    if (info == NULL) return loip_fail(LOIP_ENOMEM, "bpe: no memory for %d tokens", (int)cap);
    for (int32_t i = b->cap_ids; i < cap; i++) info[i] = (piece_info){0, NO_PIECE, 0, 0.0f, 0};
    b->info = info;
    b->cap_ids = cap;
    return 0;
}

void loip_bpe_invalidate(loip_bpe *b) {
    b->finished = 0;
    if (b->cache && b->cache_n > 0) memset(b->cache, 0, CACHE_SLOTS * sizeof *b->cache);
    b->cache_n = 0;
    b->arena_used = 0;
}

/* Slots for n entries at most half full. */
static uint32_t slots_for(size_t n) {
    uint32_t size = 1024;
    while (size < 2 * n && size < (1u << 31)) size *= 2;
    return size;
}

int loip_bpe_reserve(loip_bpe *b, int32_t n_ids, int32_t n_pieces, size_t text_bytes,
                     int32_t n_merges) {
    int rc = grow_ids(b, n_ids);
    if (rc != 0) return rc;
    size_t need = b->text_len + text_bytes + (size_t)(n_pieces > 0 ? n_pieces : 0);
    if (need > b->text_cap) {
        if (need > UINT32_MAX) return loip_fail(LOIP_ENOMEM, "bpe: over 4 GiB of pieces");
        char *t = realloc(b->text, need);
        if (t == NULL) return loip_fail(LOIP_ENOMEM, "bpe: no memory for the pieces");
        b->text = t;
        b->text_cap = need;
    }
    if (n_pieces > 0) {
        uint32_t size = slots_for((size_t)b->n_pieces + (size_t)n_pieces);
        if (size > (b->table ? b->table_mask + 1 : 0) && (rc = resize_table(b, size)) != 0)
            return rc;
    }
    if (n_merges > 0) {
        uint32_t size = slots_for((size_t)b->n_merges + (size_t)n_merges);
        if (size > (b->merges ? b->mmask + 1 : 0) && (rc = resize_merges(b, size)) != 0) return rc;
    }
    return 0;
}

LOIP_API int loip_bpe_new(int32_t flags, loip_bpe **out) {
    if (out == NULL) return loip_fail(LOIP_EINVAL, "loip_bpe_new: out is NULL");
    loip_bpe *b = calloc(1, sizeof *b);
    if (b == NULL) return loip_fail(LOIP_ENOMEM, "loip_bpe_new: no memory");
    b->flags = flags;
    b->unk_id = -1;
    *out = b;
    return 0;
}

LOIP_API void loip_bpe_free(loip_bpe *b) {
    if (b == NULL) return;
    free(b->info);
    free(b->text);
    free(b->table);
    free(b->merges);
    free(b->cache);
    free(b->arena);
    free(b->syms);
    free(b->heap);
    loip_spans_release(&b->spans);
    free(b);
}

/* piece[0..n) as stored: GPT-2 spelling decoded to bytes into buf (at least n bytes). A piece
 * outside GPT-2's alphabet (an added token in the vocabulary, say) is stored as it is. */
static const uint8_t *stored_form(const loip_bpe *b, const char *piece, size_t n, uint8_t *buf,
                                  size_t *n_out) {
    if ((b->flags & LOIP_BPE_GPT2_SPELLING) && loip_gpt2_decode(piece, n, buf, n_out) == 0)
        return buf;
    *n_out = n;
    return (const uint8_t *)piece;
}

static int check_token(const char *piece, size_t len, int32_t id) {
    if (id < 0 || id >= MAX_ID)
        return loip_fail(LOIP_EINVAL, "token id %d is outside [0, %d)", (int)id, MAX_ID);
    if (len == 0 || len > MAX_PIECE)
        return loip_fail(LOIP_EINVAL, "token %d has a piece of %zu bytes", (int)id, len);
    return 0;
}

/* Token id is the stored piece p[0..n) of hash h; piece[0..len) is it as given (for errors). */
static int put_piece(loip_bpe *b, const char *piece, size_t len, const uint8_t *p, size_t n,
                     uint64_t h, int32_t id, float score, int32_t flags) {
    int rc = grow_ids(b, id + 1);
    if (rc != 0) return rc;
    piece_info *in = &b->info[id];
    if (in->off != NO_PIECE)
        return loip_fail(LOIP_EINVAL, "token id %d is given twice (\"%.*s\" and \"%.*s\")",
                         (int)id, in->len > 60 ? 60 : (int)in->len, b->text + in->off,
                         len > 60 ? 60 : (int)len, piece);
    if (b->text_len + n + 1 > b->text_cap) {
        size_t cap = b->text_cap ? b->text_cap : 1 << 16;
        while (cap < b->text_len + n + 1) cap *= 2;
        if (cap > UINT32_MAX) return loip_fail(LOIP_ENOMEM, "bpe: over 4 GiB of pieces");
        char *t = realloc(b->text, cap);
        if (t == NULL) return loip_fail(LOIP_ENOMEM, "bpe: no memory for the pieces");
        b->text = t;
        b->text_cap = cap;
    }
    *in = (piece_info){h, (uint32_t)b->text_len, (int32_t)n, score, flags};
    memcpy(b->text + b->text_len, p, n);
    b->text[b->text_len + n] = '\0';
    b->text_len += n + 1;
    if (id >= b->size) b->size = id + 1;
    b->n_pieces++;
    if (2 * (size_t)b->n_pieces > (size_t)(b->table ? b->table_mask + 1 : 0)) {
        rc = resize_table(b, b->table ? 2 * (b->table_mask + 1) : 1024);
        if (rc != 0) return rc;
    }
    /* A piece given twice keeps its first id. */
    if (find_piece(b, p, n, h) < 0) {
        uint32_t s = (uint32_t)h & b->table_mask;
        while (b->table[s].id >= 0) s = (s + 1) & b->table_mask;
        b->table[s] = (piece_slot){(uint32_t)(h >> 32), id, b->info[id].off, (int32_t)n};
    }
    return 0;
}

LOIP_API int loip_bpe_add_token(loip_bpe *b, const char *piece, size_t len, int32_t id,
                                float score, int32_t flags) {
    if (b == NULL || (piece == NULL && len > 0))
        return loip_fail(LOIP_EINVAL, "loip_bpe_add_token: NULL argument");
    int rc = check_token(piece, len, id);
    if (rc != 0) return rc;
    uint8_t buf[MAX_PIECE];
    size_t n;
    const uint8_t *p = stored_form(b, piece, len, buf, &n);
    rc = put_piece(b, piece, len, p, n, hash_bytes(p, n), id, score, flags);
    loip_bpe_invalidate(b);
    return rc;
}

/* A batch of tokens or merges goes through each step together, the step before prefetching
 * what it reads at random in tables of megabytes, so that the cache misses of a batch
 * overlap instead of following one another. */
enum { BATCH = 32 };

static void prefetch_piece(const loip_bpe *b, uint64_t h) {
    if (b->table) __builtin_prefetch(&b->table[(uint32_t)h & b->table_mask]);
}

/* Room for need bytes at *buf (of *cap). */
static int scratch(uint8_t **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    free(*buf);
    *cap = 2 * need;
    if ((*buf = malloc(*cap)) == NULL) return loip_fail(LOIP_ENOMEM, "bpe: no memory");
    return 0;
}

int loip_bpe_add_token_list(loip_bpe *b, const bpe_token_in *t, size_t n, size_t *failed) {
    if (b == NULL || (t == NULL && n > 0))
        return loip_fail(LOIP_EINVAL, "loip_bpe_add_token_list: NULL argument");
    struct {
        const uint8_t *p; /* stored form, NULL when the token is malformed */
        size_t n;
        uint64_t h;
    } it[BATCH];
    uint8_t *buf = NULL; /* a batch's stored forms */
    size_t cap = 0;
    int rc = 0;
    for (size_t at = 0; at < n && rc == 0; at += BATCH) {
        const size_t k = n - at < BATCH ? n - at : BATCH;
        const bpe_token_in *tt = t + at;
        size_t need = 0, used = 0;
        for (size_t j = 0; j < k; j++) need += tt[j].len;
        if ((rc = scratch(&buf, &cap, need)) != 0) break;
        for (size_t j = 0; j < k; j++) {
            it[j].p = NULL;
            if (tt[j].piece == NULL || check_token(tt[j].piece, tt[j].len, tt[j].id) != 0) continue;
            it[j].p = stored_form(b, tt[j].piece, tt[j].len, buf + used, &it[j].n);
            if (it[j].p == buf + used) used += it[j].n;
            prefetch_piece(b, it[j].h = hash_bytes(it[j].p, it[j].n));
            if (tt[j].id < b->cap_ids) __builtin_prefetch(&b->info[tt[j].id]);
        }
        for (size_t j = 0; j < k && rc == 0; j++) {
            rc = it[j].p == NULL ? loip_bpe_add_token(b, tt[j].piece, tt[j].len, tt[j].id, 0.0f, 0)
                                 : put_piece(b, tt[j].piece, tt[j].len, it[j].p, it[j].n, it[j].h,
                                             tt[j].id, 0.0f, 0);
            if (rc != 0 && failed) *failed = at + j;
        }
    }
    free(buf);
    loip_bpe_invalidate(b);
    return rc;
}

LOIP_API int32_t loip_bpe_size(const loip_bpe *b) { return b ? b->size : 0; }
LOIP_API int32_t loip_bpe_merge_count(const loip_bpe *b) { return b ? b->n_merges : 0; }

LOIP_API int loip_bpe_piece(const loip_bpe *b, int32_t id, const char **piece, int32_t *len) {
    if (b == NULL) return loip_fail(LOIP_EINVAL, "loip_bpe_piece: NULL argument");
    if (id < 0 || id >= b->size || b->info[id].off == NO_PIECE)
        return loip_fail(LOIP_EINVAL, "token id %d has no piece (the vocabulary has ids below %d)",
                         (int)id, (int)b->size);
    if (piece) *piece = b->text + b->info[id].off;
    if (len) *len = b->info[id].len;
    return 0;
}

LOIP_API int32_t loip_bpe_lookup(const loip_bpe *b, const char *piece, size_t len) {
    if (b == NULL || (piece == NULL && len > 0)) return -1;
    return find_piece(b, (const uint8_t *)piece, len, hash_bytes((const uint8_t *)piece, len));
}

LOIP_API int loip_bpe_set_unk(loip_bpe *b, int32_t id) {
    if (b == NULL) return loip_fail(LOIP_EINVAL, "loip_bpe_set_unk: NULL argument");
    if (id >= 0 && (id >= b->size || b->info[id].off == NO_PIECE))
        return loip_fail(LOIP_EINVAL, "unk id %d is not in the vocabulary", (int)id);
    b->unk_id = id < 0 ? -1 : id;
    loip_bpe_invalidate(b);
    return 0;
}

/* ---- merges ------------------------------------------------------------------------------- */

/* The merge table at size slots (a power of two, over twice the merges). */
static int resize_merges(loip_bpe *b, uint32_t size) {
    merge_slot *m = malloc((size_t)size * sizeof *m);
    if (m == NULL) return loip_fail(LOIP_ENOMEM, "bpe: no memory for %u merges", size / 2);
    for (uint32_t i = 0; i < size; i++) m[i].key = UINT64_MAX;
    for (uint32_t i = 0; b->merges && i <= b->mmask; i++) {
        if (b->merges[i].key == UINT64_MAX) continue;
        uint32_t s = hash_key(b->merges[i].key) & (size - 1);
        while (m[s].key != UINT64_MAX) s = (s + 1) & (size - 1);
        m[s] = b->merges[i];
    }
    free(b->merges);
    b->merges = m;
    b->mmask = size - 1;
    return 0;
}

/* A merge given again takes its new rank, as in HF (its merges go into a hash map). */
static int put_merge(loip_bpe *b, int32_t left, int32_t right, uint32_t rank, int32_t id) {
    merge_slot *m = (merge_slot *)find_merge(b, left, right);
    if (m == NULL) {
        if (2 * ((size_t)b->n_merges + 1) > (size_t)(b->merges ? b->mmask + 1 : 0)) {
            int rc = resize_merges(b, b->merges ? 2 * (b->mmask + 1) : 4096);
            if (rc != 0) return rc;
        }
        uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
        uint32_t s = hash_key(key) & b->mmask;
        while (b->merges[s].key != UINT64_MAX) s = (s + 1) & b->mmask;
        m = &b->merges[s];
        m->key = key;
        b->n_merges++;
    }
    m->rank = rank;
    m->id = id;
    return 0;
}

LOIP_API int loip_bpe_add_merge(loip_bpe *b, const char *left, size_t llen, const char *right,
                                size_t rlen) {
    if (b == NULL || (left == NULL && llen > 0) || (right == NULL && rlen > 0))
        return loip_fail(LOIP_EINVAL, "loip_bpe_add_merge: NULL argument");
    if (llen == 0 || rlen == 0 || llen + rlen > MAX_PIECE)
        return loip_fail(LOIP_EFORMAT, "merge of an empty or over-long piece");
    uint8_t buf[MAX_PIECE]; /* each piece's stored form, then the two end to end */
    size_t nl, nr;
    const uint8_t *l = stored_form(b, left, llen, buf, &nl);
    int32_t a = find_piece(b, l, nl, hash_bytes(l, nl));
    if (a < 0)
        return loip_fail(LOIP_EFORMAT, "merge \"%.*s %.*s\": \"%.*s\" is not in the vocabulary",
                         (int)llen, left, (int)rlen, right, (int)llen, left);
    const uint8_t *r = stored_form(b, right, rlen, buf, &nr);
    int32_t c = find_piece(b, r, nr, hash_bytes(r, nr));
    if (c < 0)
        return loip_fail(LOIP_EFORMAT, "merge \"%.*s %.*s\": \"%.*s\" is not in the vocabulary",
                         (int)llen, left, (int)rlen, right, (int)rlen, right);
    const piece_info *pa = &b->info[a], *pc = &b->info[c];
    size_t n = (size_t)pa->len + (size_t)pc->len;
    if (n > sizeof buf) return loip_fail(LOIP_EFORMAT, "merge of over-long pieces");
    memcpy(buf, b->text + pa->off, (size_t)pa->len);
    memcpy(buf + pa->len, b->text + pc->off, (size_t)pc->len);
    int32_t id = find_piece(b, buf, n, hash_bytes(buf, n));
    if (id < 0)
        return loip_fail(LOIP_EFORMAT, "merge \"%.*s %.*s\": the merged piece \"%.*s%.*s\" is not "
                                       "in the vocabulary", (int)llen, left, (int)rlen, right,
                         (int)llen, left, (int)rlen, right);
    if (b->next_rank == UINT32_MAX) return loip_fail(LOIP_EFORMAT, "bpe: too many merges");
    int rc = put_merge(b, a, c, b->next_rank++, id);
    loip_bpe_invalidate(b);
    return rc;
}

/* ---- many merges ---------------------------------------------------------------------------- */

typedef struct batch_item {
    const uint8_t *l, *r;    /* stored forms; l NULL: the merge is malformed */
    size_t nl, nr;
    uint64_t hl, hr, hm;     /* hashes of the two pieces and of the merged one */
    const piece_slot *a, *c; /* the two pieces, NULL when not found */
    int32_t id;              /* the merged piece, -1 when not found */
} batch_item;

/* Bytes of pieces a and c end to end into out (MAX_PIECE bytes). */
static size_t concat(const loip_bpe *b, const piece_slot *a, const piece_slot *c, uint8_t *out) {
    memcpy(out, b->text + a->off, (size_t)a->len);
    memcpy(out + a->len, b->text + c->off, (size_t)c->len);
    return (size_t)a->len + (size_t)c->len;
}

int loip_bpe_add_merge_list(loip_bpe *b, const bpe_merge_in *m, size_t n, size_t *failed) {
    if (b == NULL || (m == NULL && n > 0))
        return loip_fail(LOIP_EINVAL, "loip_bpe_add_merge_list: NULL argument");
    batch_item it[BATCH];
    uint8_t *buf = NULL; /* the merged piece (MAX_PIECE bytes), then a batch's stored forms */
    size_t cap = 0;
    int rc = 0;
    for (size_t at = 0; at < n && rc == 0; at += BATCH) {
        const size_t k = n - at < BATCH ? n - at : BATCH;
        const bpe_merge_in *mm = m + at;
        size_t need = MAX_PIECE;
        for (size_t j = 0; j < k; j++) need += (size_t)mm[j].llen + mm[j].rlen;
        if ((rc = scratch(&buf, &cap, need)) != 0) break;
        size_t used = MAX_PIECE;
        for (size_t j = 0; j < k; j++) { /* stored forms, their slots prefetched */
            batch_item *e = &it[j];
            e->a = e->c = NULL;
            e->id = -1;
            e->l = NULL;
            if (mm[j].llen == 0 || mm[j].rlen == 0 || (size_t)mm[j].llen + mm[j].rlen > MAX_PIECE ||
                (mm[j].left == NULL || mm[j].right == NULL))
                continue;
            e->l = stored_form(b, mm[j].left, mm[j].llen, buf + used, &e->nl);
            if (e->l == buf + used) used += e->nl;
            e->r = stored_form(b, mm[j].right, mm[j].rlen, buf + used, &e->nr);
            if (e->r == buf + used) used += e->nr;
            prefetch_piece(b, e->hl = hash_bytes(e->l, e->nl));
            prefetch_piece(b, e->hr = hash_bytes(e->r, e->nr));
        }
        for (size_t j = 0; j < k && b->table; j++) { /* the pieces' bytes (if theirs is the
                                                          first slot tried, as it mostly is) */
            const batch_item *e = &it[j];
            if (e->l == NULL) continue;
            __builtin_prefetch(b->text + b->table[(uint32_t)e->hl & b->table_mask].off);
            __builtin_prefetch(b->text + b->table[(uint32_t)e->hr & b->table_mask].off);
        }
        for (size_t j = 0; j < k; j++) { /* the two pieces; the merged one's slot prefetched */
            batch_item *e = &it[j];
            if (e->l == NULL) continue;
            e->a = find_slot(b, e->l, e->nl, e->hl);
            e->c = find_slot(b, e->r, e->nr, e->hr);
            if (e->a == NULL || e->c == NULL) continue;
            e->hm = hash_bytes(buf, concat(b, e->a, e->c, buf));
            prefetch_piece(b, e->hm);
        }
        for (size_t j = 0; j < k; j++) { /* the merged piece; its merge slot prefetched */
            batch_item *e = &it[j];
            if (e->a == NULL || e->c == NULL) continue;
            e->id = find_piece(b, buf, concat(b, e->a, e->c, buf), e->hm);
            if (e->id >= 0 && b->merges) {
                uint64_t key = (uint64_t)(uint32_t)e->a->id << 32 | (uint32_t)e->c->id;
                __builtin_prefetch(&b->merges[hash_key(key) & b->mmask]);
            }
        }
        for (size_t j = 0; j < k && rc == 0; j++) { /* in order */
            const batch_item *e = &it[j];
            if (e->id < 0 || b->next_rank == UINT32_MAX) {
                /* loip_bpe_add_merge says what is wrong (and adds the merge if nothing is). */
                rc = loip_bpe_add_merge(b, mm[j].left, mm[j].llen, mm[j].right, mm[j].rlen);
                if (rc != 0 && failed) *failed = at + j;
                continue;
            }
            rc = put_merge(b, e->a->id, e->c->id, b->next_rank++, e->id);
            if (rc != 0 && failed) *failed = at + j;
        }
    }
    free(buf);
    loip_bpe_invalidate(b);
    return rc;
}

static int cmp_score_desc(const void *x, const void *y, void *ctx) {
    const piece_info *info = ctx;
    int32_t a = *(const int32_t *)x, c = *(const int32_t *)y;
    if (info[a].score > info[c].score) return -1;
    if (info[a].score < info[c].score) return 1;
    return a < c ? -1 : a > c;
}

/* Every split of a piece into two pieces is a merge: the splits a batch at a time (BATCH, as
 * the lists above), so that their lookups' cache misses overlap (o200k_base's 199,998 pieces
 * have ~1.2M splits, each looked up in a table of megabytes). Merges are added in the order
 * the splits come. */
typedef struct split_at {
    int32_t id, k, l, r; /* the piece, where it is split, the parts' ids (or -1) */
    uint64_t hl, hr;     /* the parts' hashes */
} split_at;

static void prefetch_text(const loip_bpe *b, uint64_t h) { /* the first slot's bytes */
    if (b->table) __builtin_prefetch(b->text + b->table[(uint32_t)h & b->table_mask].off);
}

static int derive_splits(loip_bpe *b, split_at *s, int n, const uint32_t *rank) {
    for (int j = 0; j < n; j++) prefetch_text(b, s[j].hl);
    for (int j = 0; j < n; j++) { /* the left parts; the right parts' slots prefetched */
        const piece_info *in = &b->info[s[j].id];
        const uint8_t *p = (const uint8_t *)b->text + in->off;
        s[j].l = find_mergeable_hashed(b, p, (size_t)s[j].k, s[j].hl);
        if (s[j].l >= 0)
            prefetch_piece(b, s[j].hr = hash_bytes(p + s[j].k, (size_t)(in->len - s[j].k)));
    }
    for (int j = 0; j < n; j++)
        if (s[j].l >= 0) prefetch_text(b, s[j].hr);
    for (int j = 0; j < n; j++) { /* the right parts; the merges' slots prefetched */
        s[j].r = -1;
        if (s[j].l < 0) continue;
        const piece_info *in = &b->info[s[j].id];
        const uint8_t *p = (const uint8_t *)b->text + in->off;
        s[j].r = find_mergeable_hashed(b, p + s[j].k, (size_t)(in->len - s[j].k), s[j].hr);
        if (s[j].r >= 0 && b->merges) {
            uint64_t key = (uint64_t)(uint32_t)s[j].l << 32 | (uint32_t)s[j].r;
            __builtin_prefetch(&b->merges[hash_key(key) & b->mmask]);
        }
    }
    for (int j = 0; j < n; j++) {
        if (s[j].r < 0) continue;
        int rc = put_merge(b, s[j].l, s[j].r, rank[s[j].id], s[j].id);
        if (rc != 0) return rc;
    }
    return 0;
}

LOIP_API int loip_bpe_derive_merges(loip_bpe *b, int32_t how) {
    if (b == NULL) return loip_fail(LOIP_EINVAL, "loip_bpe_derive_merges: NULL argument");
    if (how != LOIP_BPE_MERGES_BY_ID && how != LOIP_BPE_MERGES_BY_SCORE)
        return loip_fail(LOIP_EINVAL, "loip_bpe_derive_merges: unknown rule %d", (int)how);
    uint32_t *rank = malloc((size_t)(b->size > 0 ? b->size : 1) * sizeof *rank);
    int32_t *order = malloc((size_t)(b->size > 0 ? b->size : 1) * sizeof *order);
    if (rank == NULL || order == NULL) {
        free(rank);
        free(order);
        return loip_fail(LOIP_ENOMEM, "bpe: no memory");
    }
    if (how == LOIP_BPE_MERGES_BY_ID) {
        for (int32_t id = 0; id < b->size; id++) rank[id] = (uint32_t)id;
    } else {
        /* Equal scores share a rank, so that the leftmost pair wins among them. */
        int32_t n = 0;
        for (int32_t id = 0; id < b->size; id++)
            if (b->info[id].off != NO_PIECE) order[n++] = id;
        qsort_r(order, (size_t)n, sizeof *order, cmp_score_desc, b->info);
        uint32_t r = 0;
        for (int32_t i = 0; i < n; i++) {
            if (i > 0 && b->info[order[i]].score != b->info[order[i - 1]].score) r++;
            rank[order[i]] = r;
        }
    }
    int rc = 0;
    const int bytes = (b->flags & LOIP_BPE_BYTELEVEL) != 0;
    split_at s[BATCH];
    int ns = 0;
    for (int32_t id = 0; id < b->size && rc == 0; id++) {
        const piece_info *in = &b->info[id];
        if (in->off == NO_PIECE || (in->flags & LOIP_BPE_PIECE_UNMATCHED)) continue;
        const uint8_t *p = (const uint8_t *)b->text + in->off;
        for (int32_t k = 1; k < in->len && rc == 0; k++) {
            if (!bytes && (p[k] & 0xC0) == 0x80) continue; /* characters are not split */
            s[ns].id = id;
            s[ns].k = k;
            prefetch_piece(b, s[ns].hl = hash_bytes(p, (size_t)k));
            if (++ns == BATCH) {
                rc = derive_splits(b, s, ns, rank);
                ns = 0;
            }
        }
    }
    if (rc == 0) rc = derive_splits(b, s, ns, rank);
    free(rank);
    free(order);
    loip_bpe_invalidate(b);
    return rc;
}

LOIP_API int loip_bpe_finish(loip_bpe *b) {
    if (b == NULL) return loip_fail(LOIP_EINVAL, "loip_bpe_finish: NULL argument");
    for (int i = 0; i < 256; i++) {
        uint8_t c = (uint8_t)i;
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", i);
        b->byte_id[i] = find_mergeable(b, &c, 1);
        b->fallback_id[i] = find_piece(b, (const uint8_t *)name, 6, hash_bytes((const uint8_t *)name, 6));
    }
    b->finished = 1;
    return 0;
}

