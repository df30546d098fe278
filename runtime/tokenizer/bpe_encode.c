/* bpe_encode.c — the merge loop over one chunk (see bpe.c for the rules and the argument
 * that the heap gives the rescanning loop's result), the chunk cache, and loip_bpe_encode. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/bpe.h"

/* ---- encode ------------------------------------------------------------------------------- */

typedef struct outbuf {
    int32_t *ids;
    int32_t cap, n;
} outbuf;

static inline void emit(outbuf *o, int32_t id) {
    if (o->n < o->cap) o->ids[o->n] = id;
    o->n++;
}

static int before(const pair *a, const pair *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(pair *h, int32_t *n, pair x) {
    int32_t i = (*n)++;
    while (i > 0 && before(&x, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = x;
}

static pair heap_pop(pair *h, int32_t *n) {
    pair top = h[0], x = h[--(*n)];
    int32_t i = 0;
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && before(&h[c + 1], &h[c])) c++;
        if (!before(&h[c], &x)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
    return top;
}

static void push_pair(const loip_bpe *b, const sym *s, pair *h, int32_t *nh, int32_t l,
                      int32_t r) {
    const merge_slot *m = find_merge(b, s[l].id, s[r].id);
    if (m == NULL) return;
    heap_push(h, nh, (pair){m->rank, l, r, m->id, s[l].gen, s[r].gen});
}

static int scratch(loip_bpe *b, size_t n) {
    if (n <= b->cap_syms) return 0;
    size_t cap = b->cap_syms ? b->cap_syms : 256;
    while (cap < n) cap *= 2;
    free(b->syms);
    free(b->heap);
    b->syms = malloc(cap * sizeof *b->syms);
    b->heap = malloc(3 * cap * sizeof *b->heap);
    if (b->syms == NULL || b->heap == NULL) {
        free(b->syms);
        free(b->heap);
        b->syms = NULL, b->heap = NULL, b->cap_syms = 0;
        return loip_fail(LOIP_ENOMEM, "bpe: no memory for a chunk of %zu bytes", n);
    }
    b->cap_syms = cap;
    return 0;
}

/* The starting symbols of chunk p[0..n): bytes or characters, with byte fallback / unk. */
static int32_t initial_symbols(const loip_bpe *b, const uint8_t *p, int32_t n, sym *s) {
    int32_t ns = 0;
    int last_unk = 0;
    for (int32_t i = 0; i < n;) {
        int32_t k = 1, id;
        if (b->flags & LOIP_BPE_BYTELEVEL) {
            id = b->byte_id[p[i]];
        } else {
            uint32_t cp;
            k = loip_utf8_decode(p + i, (size_t)(n - i), &cp);
            if (k == 0) k = 1; /* a stray byte is a character of its own */
            id = find_mergeable(b, p + i, (size_t)k);
            if (id < 0 && (b->flags & LOIP_BPE_BYTE_FALLBACK)) {
                int all = 1;
                for (int32_t j = 0; j < k; j++) all &= b->fallback_id[p[i + j]] >= 0;
                if (all) {
                    for (int32_t j = 0; j < k; j++) s[ns++].id = b->fallback_id[p[i + j]];
                    i += k;
                    last_unk = 0;
                    continue;
                }
            }
        }
        if (id >= 0) {
            s[ns++].id = id;
            last_unk = 0;
        } else if (b->unk_id >= 0 && !(last_unk && (b->flags & LOIP_BPE_FUSE_UNK))) {
            s[ns++].id = b->unk_id;
            last_unk = 1;
        }
        i += k;
    }
    return ns;
}

static void cache_clear(loip_bpe *b) {
    memset(b->cache, 0, CACHE_SLOTS * sizeof *b->cache);
    b->cache_n = 0;
    b->arena_used = 0;
}

static cache_slot *cache_find(loip_bpe *b, const uint8_t *p, int32_t n, uint64_t h) {
    for (uint32_t s = (uint32_t)h & (CACHE_SLOTS - 1);; s = (s + 1) & (CACHE_SLOTS - 1)) {
        cache_slot *c = &b->cache[s];
        if (c->klen == 0) return c;
        if (c->hash == h && c->klen == n && memcmp(b->arena + c->off, p, (size_t)n) == 0) return c;
    }
}

static void cache_put(loip_bpe *b, const uint8_t *p, int32_t n, uint64_t h, const int32_t *ids,
                      int32_t n_ids) {
    size_t bytes = (size_t)n + 4 + 4 * (size_t)n_ids;
    if (2 * (b->cache_n + 1) > CACHE_SLOTS || b->arena_used + bytes > CACHE_ARENA) cache_clear(b);
    cache_slot *c = cache_find(b, p, n, h);
    if (c->klen != 0) return;
    uint32_t off = b->arena_used;
    memcpy(b->arena + off, p, (size_t)n);
    uint32_t ids_off = (off + (uint32_t)n + 3) & ~3u;
    memcpy(b->arena + ids_off, ids, 4 * (size_t)n_ids);
    b->arena_used = ids_off + 4 * (uint32_t)n_ids;
    *c = (cache_slot){h, off, (uint16_t)n, (uint16_t)n_ids};
    b->cache_n++;
}

static int encode_chunk(loip_bpe *b, const uint8_t *p, int32_t n, outbuf *o) {
    uint64_t h = 0;
    if (b->flags & LOIP_BPE_IGNORE_MERGES) {
        int32_t id = find_mergeable(b, p, (size_t)n);
        if (id >= 0) {
            emit(o, id);
            return 0;
        }
    }
    const int cached = n <= CACHE_KEY && b->cache != NULL;
    if (cached) {
        h = hash_bytes(p, (size_t)n);
        cache_slot *c = cache_find(b, p, n, h);
        if (c->klen != 0) {
            const uint8_t *ids = b->arena + ((c->off + c->klen + 3) & ~3u);
            for (int32_t i = 0; i < c->n_ids; i++) {
                int32_t id;
                memcpy(&id, ids + 4 * (size_t)i, 4);
                emit(o, id);
            }
            b->hit_bytes += n;
            return 0;
        }
    }
    int rc = scratch(b, (size_t)n);
    if (rc != 0) return rc;
    sym *s = b->syms;
    int32_t ns = initial_symbols(b, p, n, s);
    for (int32_t i = 0; i < ns; i++) {
        s[i].prev = i - 1;
        s[i].next = i + 1 < ns ? i + 1 : -1;
        s[i].gen = 0;
    }
    pair *heap = b->heap;
    int32_t nh = 0;
    for (int32_t i = 0; i + 1 < ns; i++) push_pair(b, s, heap, &nh, i, i + 1);
    while (nh > 0) {
        pair e = heap_pop(heap, &nh);
        sym *L = &s[e.left], *R = &s[e.right];
        if (L->gen != e.lgen || R->gen != e.rgen) continue; /* stale */
        L->id = e.id;
        L->gen++;
        R->gen++;
        L->next = R->next;
        if (R->next >= 0) s[R->next].prev = e.left;
        if (L->prev >= 0) push_pair(b, s, heap, &nh, L->prev, e.left);
        if (L->next >= 0) push_pair(b, s, heap, &nh, e.left, L->next);
    }
    int32_t first = o->n, count = 0;
    for (int32_t i = ns > 0 ? 0 : -1; i >= 0; i = s[i].next) {
        emit(o, s[i].id);
        count++;
    }
    if (cached && o->n <= o->cap) cache_put(b, p, n, h, o->ids + first, count);
    return 0;
}

LOIP_API int loip_bpe_encode(loip_bpe *b, loip_pretok *p, const char *text, size_t len,
                             int32_t *ids, int32_t cap, int32_t *n_out) {
    const char *fn = "loip_bpe_encode";
    if (b == NULL || n_out == NULL || (text == NULL && len > 0) || (ids == NULL && cap > 0) ||
        cap < 0)
        return loip_fail(LOIP_EINVAL, "%s: NULL argument or negative cap", fn);
    *n_out = 0;
    if (len > (size_t)INT32_MAX - 1)
        return loip_fail(LOIP_EINVAL, "%s: text of %zu bytes is too long", fn, len);
    if (!b->finished) loip_bpe_finish(b);
    if (b->cache == NULL) {
        b->cache = calloc(CACHE_SLOTS, sizeof *b->cache);
        b->arena = malloc(CACHE_ARENA);
        if (b->cache == NULL || b->arena == NULL) {
            free(b->cache);
            free(b->arena);
            b->cache = NULL, b->arena = NULL;
        }
    }
    b->spans.n = 0;
    int rc = loip_pretok_spans(p, text, len, &b->spans);
    outbuf o = {ids, cap, 0};
    const uint8_t *t = (const uint8_t *)text;
    for (int32_t i = 0; i < b->spans.n && rc == 0; i++) {
        int32_t s = b->spans.v[2 * i], e = b->spans.v[2 * i + 1];
        rc = encode_chunk(b, t + s, e - s, &o);
    }
    if (rc != 0) return rc;
    b->total_bytes += (int64_t)len;
    *n_out = o.n;
    if (o.n > cap) return loip_fail(LOIP_ERANGE, "%s: %d ids, cap is %d", fn, (int)o.n, (int)cap);
    return 0;
}

LOIP_API int loip_bpe_cache_stats(const loip_bpe *b, int64_t *entries, int64_t *hit_bytes,
                                  int64_t *total_bytes) {
    if (b == NULL) return loip_fail(LOIP_EINVAL, "loip_bpe_cache_stats: NULL argument");
    if (entries) *entries = b->cache_n;
    if (hit_bytes) *hit_bytes = b->hit_bytes;
    if (total_bytes) *total_bytes = b->total_bytes;
    return 0;
}
