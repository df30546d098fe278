/* bpe.h — the loip_bpe object, shared by bpe.c (vocabulary and merges) and bpe_encode.c
 * (the merge loop and the chunk cache). Internal: not part of the public header. */
#ifndef LOIP_BPE_H
#define LOIP_BPE_H

#include <string.h>

#include "tokenizer/tokenizer.h"

enum {
    MAX_ID = 1 << 24,        /* larger ids mark a corrupt file */
    MAX_PIECE = 1 << 16,     /* longer pieces too */
    CACHE_SLOTS = 1 << 15,   /* cleared when half full */
    CACHE_KEY = 128,         /* longer chunks are not cached */
    CACHE_ARENA = 4u << 20,  /* bytes of keys and ids; cleared when full */
};
#define NO_PIECE UINT32_MAX

typedef struct sym {
    int32_t id;
    int32_t prev, next; /* neighbours in the list, -1 at the ends */
    uint32_t gen;       /* bumped whenever the symbol changes (merged into, or removed) */
} sym;

/* A merge candidate: symbol left and its right neighbour, as they were at push time. */
typedef struct pair {
    uint32_t rank;
    int32_t left, right;
    int32_t id; /* the merged piece */
    uint32_t lgen, rgen;
} pair;

typedef struct cache_slot {
    uint64_t hash;
    uint32_t off;  /* key bytes then n_ids int32 ids, in arena */
    uint16_t klen; /* 0: free */
    uint16_t n_ids;
} cache_slot;

/* What a lookup needs of a piece, together: one cache line. */
typedef struct piece_info {
    uint64_t hash;
    uint32_t off;  /* offset of the piece in text, NO_PIECE for a hole */
    int32_t len;
    float score;
    int32_t flags; /* LOIP_BPE_PIECE_* */
} piece_info;

/* A piece by hash, with what a lookup compares: one cache miss for the slot and one for the
 * piece's bytes (loading the merges looks up about a million pieces at random). */
typedef struct piece_slot {
    uint32_t tag; /* the hash's high half, checked before the piece is read */
    int32_t id;   /* -1: free */
    uint32_t off; /* the piece, text + off */
    int32_t len;
} piece_slot;

typedef struct merge_slot {
    uint64_t key; /* left << 32 | right, UINT64_MAX for a free slot */
    uint32_t rank;
    int32_t id;   /* the merged piece */
} merge_slot;

struct loip_bpe {
    int32_t flags;
    int32_t size;       /* highest id + 1 */
    int32_t cap_ids;    /* capacity of info */
    int32_t n_pieces;
    piece_info *info;   /* (cap_ids) */
    char *text;         /* pieces, each followed by a NUL */
    size_t text_len, text_cap;
    piece_slot *table;  /* (table_mask + 1) pieces by hash, open addressing */
    uint32_t table_mask;
    merge_slot *merges; /* (mmask + 1) open addressing */
    uint32_t mmask;
    int32_t n_merges;
    uint32_t next_rank;
    int32_t unk_id;
    int32_t byte_id[256];     /* the single-byte piece (byte-level), or -1 */
    int32_t fallback_id[256]; /* the piece <0xXX>, or -1 */
    int finished;
    cache_slot *cache; /* (CACHE_SLOTS), allocated at the first encode */
    uint8_t *arena;    /* (CACHE_ARENA) */
    uint32_t arena_used;
    int32_t cache_n;
    int64_t hit_bytes, total_bytes;
    sym *syms;         /* (cap_syms) scratch */
    pair *heap;        /* (3 * cap_syms) scratch */
    size_t cap_syms;
    loip_spans spans;  /* scratch */
};

/* ---- hashing ------------------------------------------------------------------------------ */

static inline uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ ((uint64_t)n * 0xFF51AFD7ED558CCDull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        p += 8;
        n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, p, n);
    h = (h ^ v) * 0x94D049BB133111EBull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 32);
}

static inline uint32_t hash_key(uint64_t k) {
    k *= 0x9E3779B97F4A7C15ull;
    return (uint32_t)(k >> 32) ^ (uint32_t)k;
}

/* ---- lookups ------------------------------------------------------------------------------ */

static inline const piece_slot *find_slot(const loip_bpe *b, const uint8_t *p, size_t n,
                                           uint64_t h) {
    if (b->table == NULL) return NULL;
    const uint32_t tag = (uint32_t)(h >> 32);
    for (uint32_t s = (uint32_t)h & b->table_mask;; s = (s + 1) & b->table_mask) {
        const piece_slot *e = &b->table[s];
        if (e->id < 0) return NULL;
        if (e->tag == tag && (size_t)e->len == n && memcmp(b->text + e->off, p, n) == 0) return e;
    }
}

static inline int32_t find_piece(const loip_bpe *b, const uint8_t *p, size_t n, uint64_t h) {
    const piece_slot *e = find_slot(b, p, n, h);
    return e ? e->id : -1;
}

/* A piece that text can produce (not LOIP_BPE_PIECE_UNMATCHED), or -1; h: hash_bytes(p, n). */
static inline int32_t find_mergeable_hashed(const loip_bpe *b, const uint8_t *p, size_t n,
                                            uint64_t h) {
    int32_t id = find_piece(b, p, n, h);
    return id >= 0 && !(b->info[id].flags & LOIP_BPE_PIECE_UNMATCHED) ? id : -1;
}

static inline int32_t find_mergeable(const loip_bpe *b, const uint8_t *p, size_t n) {
    return find_mergeable_hashed(b, p, n, hash_bytes(p, n));
}

/* The merge (left, right), or NULL. */
static inline const merge_slot *find_merge(const loip_bpe *b, int32_t left, int32_t right) {
    if (b->merges == NULL) return NULL;
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (uint32_t s = hash_key(key) & b->mmask;; s = (s + 1) & b->mmask) {
        if (b->merges[s].key == key) return &b->merges[s];
        if (b->merges[s].key == UINT64_MAX) return NULL;
    }
}

/* Sizes the tables for n_pieces more pieces of text_bytes bytes in all (stored form, NULs not
 * counted), ids below n_ids and n_merges more merges, so that adding them grows nothing. */
int loip_bpe_reserve(loip_bpe *b, int32_t n_ids, int32_t n_pieces, size_t text_bytes,
                     int32_t n_merges);

/* A token as loip_bpe_add_token takes it (score 0, flags 0). */
typedef struct bpe_token_in {
    const char *piece;
    uint32_t len;
    int32_t id;
} bpe_token_in;

/* Adds the tokens t[0..n) in order, as loip_bpe_add_token would, a batch at a time with the
 * table lookups of each batch prefetched. On failure *failed is the index of the token at
 * fault (those before it are added) and the message is loip_bpe_add_token's. */
int loip_bpe_add_token_list(loip_bpe *b, const bpe_token_in *t, size_t n, size_t *failed);

/* A merge as loip_bpe_add_merge takes it. */
typedef struct bpe_merge_in {
    const char *left, *right;
    uint32_t llen, rlen;
} bpe_merge_in;

/* Adds the merges m[0..n) in order, as loip_bpe_add_merge would, a batch at a time with the
 * table lookups of each batch prefetched. On failure *failed is the index of the merge at
 * fault (those before it are added) and the message is loip_bpe_add_merge's. */
int loip_bpe_add_merge_list(loip_bpe *b, const bpe_merge_in *m, size_t n, size_t *failed);

/* Drops the cache and marks the setup unfinished (after any change of pieces or merges). */
void loip_bpe_invalidate(loip_bpe *b);

#endif
