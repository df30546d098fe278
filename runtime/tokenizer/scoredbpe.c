/* scoredbpe.c — llama2.c's tokenizer.bin: a scored BPE vocabulary with byte fallback, and
 * an encoder that gives exactly the ids of llama2.c run.c's encode().
 *
 * File: uint32 max_token_length, then records {float32 score, int32 len, len bytes}, all
 * little-endian (this file assumes a little-endian host, as llama2.c does).
 *
 * run.c's encode(), which this reproduces:
 *   1. BOS (id 1) when asked; then, for non-empty text, the dummy prefix: the id of " ";
 *   2. each UTF-8 code point (a lead byte plus up to 3 continuation bytes; stray
 *      continuation bytes group by up to 4) looked up whole, else one id 3 + byte per byte;
 *   3. repeatedly merge the adjacent pair whose concatenated pieces are a vocabulary piece
 *      with the highest score, the leftmost on ties; BOS and the dummy prefix take part;
 *      pieces scoring <= -1e10 (run.c's starting best_score) or NaN are never merged;
 *   4. EOS (id 2) when asked, after merging.
 * run.c rescans every pair after each merge, O(n^2). Here a max-heap of candidate pairs,
 * keyed by (score desc, left position asc), over a doubly linked list of symbols gives the
 * same merges in O(n log n): see merge_all() for why the order is identical.
 *
 * Differences from run.c, none visible with llama2.c's own files:
 *   - Lookup is a hash map built at open. When a piece occurs twice in the vocabulary, run.c
 *     returns whichever copy bsearch lands on (qsort is not stable); here the lowest id wins.
 *     Neither stories260K/tok512.bin nor the Llama 2 tokenizer.bin has a duplicate piece.
 *   - Pieces are compared as byte strings of their stored length; run.c compares C strings,
 *     so a piece with a NUL byte would be cut short there. Neither file has one.
 *   - Text is (ptr, len): a NUL byte is a code point like any other (no piece matches it, so
 *     it becomes byte-fallback id 3), where run.c would stop at it.
 *   - A vocabulary without " " gets byte-fallback id 35 as the dummy prefix (run.c would
 *     index vocab[-1]); ids a vocabulary lacks (BOS, EOS, byte fallback in a vocabulary of
 *     fewer than 259 tokens) are LOIP_EFORMAT rather than out-of-range ids. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "scoredbpe.c reads little-endian files by memcpy"
#endif

enum {
    MAX_PIECE = 1 << 20,    /* longer pieces (or max_token_length) mark a corrupt file */
    BYTE_FALLBACK_BASE = 3, /* ids 3..258 are the bytes 0x00..0xFF */
};
static const uint64_t MAX_FILE = 1ull << 30; /* 1 GiB: no real vocabulary comes close */
#define NO_MERGE_SCORE (-1e10f)              /* run.c's initial best_score */

struct loip_scoredbpe {
    int32_t n;           /* tokens */
    uint32_t max_len;    /* the header's max_token_length */
    int32_t space_id;    /* lowest id of the piece " ", -1 if none */
    uint32_t table_mask; /* table size - 1 (a power of two, at least 2n) */
    uint64_t *hash;      /* (n) FNV-1a of each piece */
    float *score;        /* (n) */
    int32_t *len;        /* (n) piece lengths in bytes */
    uint32_t *off;       /* (n) piece offsets into text */
    int32_t *table;      /* (table_mask + 1) open addressing, linear probing: id or -1 */
    char *text;          /* every piece, each followed by a NUL so piece() returns C strings */
};

/* ---- hashing ------------------------------------------------------------------------------ */

/* FNV-1a, because it is incremental: the hash of piece a + piece b continues from a's stored
 * hash over b's bytes, so candidate pairs are looked up without concatenating them. */
static uint64_t fnv_more(uint64_t h, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 0x100000001B3ull;
    return h;
}
static const uint64_t FNV_OFFSET = 0xCBF29CE484222325ull;

/* Id of the piece a[0..la) + b[0..lb), with hash h, or -1. */
static int32_t lookup(const loip_scoredbpe *t, uint64_t h, const char *a, size_t la,
                      const char *b, size_t lb) {
    for (uint32_t slot = (uint32_t)h & t->table_mask;; slot = (slot + 1) & t->table_mask) {
        int32_t id = t->table[slot];
        if (id < 0) return -1;
        if (t->hash[id] != h || (size_t)t->len[id] != la + lb) continue;
        const char *p = t->text + t->off[id];
        if (memcmp(p, a, la) == 0 && memcmp(p + la, b, lb) == 0) return id;
    }
}

/* ---- open / free -------------------------------------------------------------------------- */

static uint32_t rd_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Reads the whole file: tokenizers are at most a few MB, and one buffer makes the record
 * checks plain offset arithmetic. */
static int read_file(const char *path, uint8_t **data, uint64_t *size) {
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return loip_fail(LOIP_EIO, "scoredbpe: cannot open %s: %s", path, strerror(errno));
    int rc = 0;
    long end = -1;
    if (fseek(f, 0, SEEK_END) != 0 || (end = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        rc = loip_fail(LOIP_EIO, "scoredbpe: cannot seek in %s: %s", path, strerror(errno));
    } else if ((uint64_t)end > MAX_FILE) {
        rc = loip_fail(LOIP_EFORMAT, "scoredbpe: %s is %ld bytes, more than the 1 GiB a "
                                     "tokenizer.bin could plausibly be", path, end);
    } else if ((*data = malloc((size_t)end + 1)) == NULL) {
        rc = loip_fail(LOIP_ENOMEM, "scoredbpe: cannot allocate %ld bytes to read %s", end, path);
    } else if (fread(*data, 1, (size_t)end, f) != (size_t)end) {
        rc = loip_fail(LOIP_EIO, "scoredbpe: short read of %s", path);
        free(*data);
        *data = NULL;
    }
    *size = end < 0 ? 0 : (uint64_t)end;
    fclose(f);
    return rc;
}

/* Walks the records, checking each; *count tokens, *text_bytes of piece text. */
static int scan_records(const char *path, const uint8_t *d, uint64_t size, uint32_t max_len,
                        int32_t want, int32_t *count, uint64_t *text_bytes) {
    uint64_t off = 4, text = 0;
    int32_t i = 0;
    while (want > 0 ? i < want : off < size) {
        if (off == size)
            return loip_fail(LOIP_EFORMAT, "scoredbpe: %s holds only %d tokens, vocab_size %d "
                                           "was asked for", path, (int)i, (int)want);
        if (size - off < 8)
            return loip_fail(LOIP_EFORMAT, "scoredbpe: %s: truncated record for token %d at "
                                           "offset %llu: 8 header bytes needed, %llu left",
                             path, (int)i, (unsigned long long)off,
                             (unsigned long long)(size - off));
        int32_t len = (int32_t)rd_u32(d + off + 4);
        if (len < 0 || (uint32_t)len > max_len || len > MAX_PIECE)
            return loip_fail(LOIP_EFORMAT, "scoredbpe: %s: token %d at offset %llu has length "
                                           "%d, outside [0, max_token_length %u]%s", path,
                             (int)i, (unsigned long long)off, (int)len, (unsigned)max_len,
                             len > MAX_PIECE ? " and over 1 MiB" : "");
        if (size - off - 8 < (uint64_t)len)
            return loip_fail(LOIP_EFORMAT, "scoredbpe: %s: truncated record for token %d at "
                                           "offset %llu: %d piece bytes needed, %llu left",
                             path, (int)i, (unsigned long long)off, (int)len,
                             (unsigned long long)(size - off - 8));
        off += 8 + (uint64_t)len;
        text += (uint64_t)len + 1;
        if (i == INT32_MAX)
            return loip_fail(LOIP_EFORMAT, "scoredbpe: %s: more than 2^31 tokens", path);
        i++;
    }
    /* With vocab_size given, bytes after the last record are ignored, as run.c does. */
    *count = i;
    *text_bytes = text;
    return 0;
}

LOIP_API int loip_scoredbpe_open(const char *path, int32_t vocab_size, loip_scoredbpe **out) {
    if (out == NULL) return loip_fail(LOIP_EINVAL, "loip_scoredbpe_open: out is NULL");
    *out = NULL;
    if (path == NULL) return loip_fail(LOIP_EINVAL, "loip_scoredbpe_open: path is NULL");
    uint8_t *d = NULL;
    uint64_t size = 0;
    int rc = read_file(path, &d, &size);
    if (rc != 0) return rc;
    if (size < 4) {
        free(d);
        return loip_fail(LOIP_EFORMAT, "scoredbpe: %s is %llu bytes, too short for the 4-byte "
                                       "max_token_length header", path, (unsigned long long)size);
    }
    uint32_t max_len = rd_u32(d);
    if (max_len > MAX_PIECE) {
        free(d);
        return loip_fail(LOIP_EFORMAT, "scoredbpe: %s: max_token_length %u is absurd (over "
                                       "1 MiB); is this a tokenizer.bin?", path, (unsigned)max_len);
    }
    int32_t n = 0;
    uint64_t text_bytes = 0;
    rc = scan_records(path, d, size, max_len, vocab_size, &n, &text_bytes);
    if (rc == 0 && n == 0)
        rc = loip_fail(LOIP_EFORMAT, "scoredbpe: %s holds no tokens", path);
    if (rc != 0) {
        free(d);
        return rc;
    }

    /* One block, widest arrays first so each stays aligned. */
    uint32_t tsize = 16;
    while (tsize < 2u * (uint32_t)n) tsize <<= 1;
    size_t nn = (size_t)n;
    size_t bytes = sizeof(loip_scoredbpe) + nn * 8 + nn * 4 * 3 + (size_t)tsize * 4 + text_bytes;
    loip_scoredbpe *t = malloc(bytes);
    if (t == NULL) {
        free(d);
        return loip_fail(LOIP_ENOMEM, "scoredbpe: cannot allocate %zu bytes for %s", bytes, path);
    }
    t->n = n;
    t->max_len = max_len;
    t->table_mask = tsize - 1;
    t->hash = (uint64_t *)(t + 1);
    t->score = (float *)(t->hash + nn);
    t->len = (int32_t *)(t->score + nn);
    t->off = (uint32_t *)(t->len + nn);
    t->table = (int32_t *)(t->off + nn);
    t->text = (char *)(t->table + tsize);
    memset(t->table, 0xff, (size_t)tsize * 4); /* all -1 */

    uint64_t off = 4, toff = 0;
    for (int32_t i = 0; i < n; i++) {
        memcpy(&t->score[i], d + off, 4);
        int32_t len = (int32_t)rd_u32(d + off + 4);
        t->len[i] = len;
        t->off[i] = (uint32_t)toff;
        memcpy(t->text + toff, d + off + 8, (size_t)len);
        t->text[toff + (uint64_t)len] = '\0';
        off += 8 + (uint64_t)len;
        toff += (uint64_t)len + 1;
        const char *p = t->text + t->off[i];
        uint64_t h = fnv_more(FNV_OFFSET, p, (size_t)len);
        t->hash[i] = h;
        /* Ids are inserted in increasing order and an existing equal piece is kept, so the
         * lowest id of a duplicated piece is the one found. */
        if (lookup(t, h, p, (size_t)len, "", 0) >= 0) continue;
        uint32_t slot = (uint32_t)h & t->table_mask;
        while (t->table[slot] >= 0) slot = (slot + 1) & t->table_mask;
        t->table[slot] = i;
    }
    free(d);
    t->space_id = lookup(t, fnv_more(FNV_OFFSET, " ", 1), " ", 1, "", 0);
    *out = t;
    return 0;
}

LOIP_API void loip_scoredbpe_free(loip_scoredbpe *t) { free(t); }

LOIP_API int32_t loip_scoredbpe_size(const loip_scoredbpe *t) { return t ? t->n : 0; }

LOIP_API int loip_scoredbpe_piece(const loip_scoredbpe *t, int32_t id, const char **piece,
                                  int32_t *len, float *score) {
    if (t == NULL) return loip_fail(LOIP_EINVAL, "loip_scoredbpe_piece: tokenizer is NULL");
    if (id < 0 || id >= t->n)
        return loip_fail(LOIP_EINVAL, "loip_scoredbpe_piece: id %d outside [0, %d)", (int)id,
                         (int)t->n);
    if (piece) *piece = t->text + t->off[id];
    if (len) *len = t->len[id];
    if (score) *score = t->score[id];
    return 0;
}

/* ---- encode ------------------------------------------------------------------------------- */

typedef struct sym {
    int32_t id;
    int32_t prev, next; /* neighbours in the list, -1 at the ends */
    uint32_t gen;       /* bumped whenever the symbol changes (merged into, or removed) */
} sym;

/* A merge candidate: symbols left and its right neighbour, as they were at push time. */
typedef struct pair {
    float score;
    int32_t left, right;
    int32_t id; /* the merged piece */
    uint32_t lgen, rgen;
} pair;

/* Heap order: higher score first, then the leftmost. Scores here are never NaN, and -0.0
 * equals 0.0, as under run.c's `>`. */
static int before(const pair *a, const pair *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
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

static void push_pair(const loip_scoredbpe *t, const sym *s, pair *h, int32_t *nh, int32_t l,
                      int32_t r) {
    int32_t a = s[l].id, b = s[r].id;
    const char *pb = t->text + t->off[b];
    uint64_t hash = fnv_more(t->hash[a], pb, (size_t)t->len[b]);
    int32_t id = lookup(t, hash, t->text + t->off[a], (size_t)t->len[a], pb, (size_t)t->len[b]);
    if (id < 0 || !(t->score[id] > NO_MERGE_SCORE)) return;
    heap_push(h, nh, (pair){t->score[id], l, r, id, s[l].gen, s[r].gen});
}

/* Merges s[0..n) (linked in index order) as run.c's loop does.
 *
 * Why the order is run.c's: every currently adjacent mergeable pair has exactly one valid
 * entry in the heap (all pairs are pushed at the start; a merge invalidates the two pairs
 * that touched the merged symbols, by their gen, and pushes the two new ones), and stale
 * entries are dropped when popped. A symbol keeps the index of its leftmost original symbol
 * and the list only loses symbols, so list order is index order and "leftmost" in run.c's
 * current array is "smallest left index" here. Hence the first valid pop is the pair with
 * the highest score, leftmost among equals: the pair run.c's scan (first strict `>`) picks. */
static void merge_all(const loip_scoredbpe *t, sym *s, int32_t n, pair *h) {
    int32_t nh = 0;
    for (int32_t i = 0; i + 1 < n; i++) push_pair(t, s, h, &nh, i, i + 1);
    while (nh > 0) {
        pair e = heap_pop(h, &nh);
        sym *L = &s[e.left], *R = &s[e.right];
        if (L->gen != e.lgen || R->gen != e.rgen) continue; /* stale */
        L->id = e.id;
        L->gen++;
        R->gen++;
        R->id = -1;
        L->next = R->next;
        if (R->next >= 0) s[R->next].prev = e.left;
        if (L->prev >= 0) push_pair(t, s, h, &nh, L->prev, e.left);
        if (L->next >= 0) push_pair(t, s, h, &nh, e.left, L->next);
    }
}

LOIP_API int loip_scoredbpe_encode(const loip_scoredbpe *t, const char *text, size_t len,
                                   int32_t bos, int32_t eos, int32_t *ids, int32_t cap,
                                   int32_t *n_out) {
    const char *fn = "loip_scoredbpe_encode";
    if (t == NULL || n_out == NULL)
        return loip_fail(LOIP_EINVAL, "%s: %s is NULL", fn, t == NULL ? "tokenizer" : "n_out");
    if (text == NULL && len > 0) return loip_fail(LOIP_EINVAL, "%s: text is NULL", fn);
    if (cap < 0 || (ids == NULL && cap > 0))
        return loip_fail(LOIP_EINVAL, "%s: ids is NULL or cap (%d) is negative", fn, (int)cap);
    *n_out = 0;
    /* Each byte gives at most one symbol; + BOS, prefix, EOS: the len + 3 bound. */
    if (len > (size_t)INT32_MAX - 3)
        return loip_fail(LOIP_EINVAL, "%s: text of %zu bytes is too long", fn, len);
    if ((bos && t->n <= 1) || (eos && t->n <= 2))
        return loip_fail(LOIP_EFORMAT, "%s: the vocabulary has %d tokens, no id %d for %s", fn,
                         (int)t->n, bos && t->n <= 1 ? 1 : 2, bos && t->n <= 1 ? "BOS" : "EOS");

    const int32_t max_syms = (int32_t)len + 2;
    /* Heap entries: n - 1 initial pairs plus at most 2 per merge, under 3 * max_syms. */
    sym *s = malloc((size_t)max_syms * sizeof(sym) + 3 * (size_t)max_syms * sizeof(pair));
    if (s == NULL)
        return loip_fail(LOIP_ENOMEM, "%s: no memory for %zu bytes of text", fn, len);
    pair *heap = (pair *)(s + max_syms);

    int32_t n = 0;
    if (bos) s[n++].id = 1;
    if (len > 0) s[n++].id = t->space_id >= 0 ? t->space_id : BYTE_FALLBACK_BASE + ' ';
    /* Code points as run.c delimits them: a non-continuation byte starts one, continuation
     * bytes extend it while it has fewer than 4 bytes. The bytes are contiguous in text. */
    int32_t cp = 0; /* bytes in the current code point, ending at text[i] */
    int rc = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t c = (uint8_t)text[i];
        if ((c & 0xC0) != 0x80) cp = 0;
        cp++;
        uint8_t next = i + 1 < len ? (uint8_t)text[i + 1] : 0;
        if ((next & 0xC0) == 0x80 && cp < 4) continue;
        const char *p = text + i + 1 - cp;
        int32_t id = lookup(t, fnv_more(FNV_OFFSET, p, (size_t)cp), p, (size_t)cp, "", 0);
        if (id >= 0) {
            s[n++].id = id;
        } else {
            for (int32_t k = 0; k < cp; k++) s[n++].id = BYTE_FALLBACK_BASE + (uint8_t)p[k];
        }
        cp = 0;
    }
    for (int32_t i = 0; i < n; i++) {
        if (s[i].id >= t->n) {
            rc = loip_fail(LOIP_EFORMAT, "%s: byte fallback needs id %d, the vocabulary has "
                                         "only %d tokens", fn, (int)s[i].id, (int)t->n);
            break;
        }
        s[i].prev = i - 1;
        s[i].next = i + 1 < n ? i + 1 : -1;
        s[i].gen = 0;
    }
    if (rc == 0) merge_all(t, s, n, heap);

    int32_t count = 0;
    if (rc == 0) {
        for (int32_t i = 0; i >= 0 && n > 0; i = s[i].next) count++;
        if (eos) count++;
        *n_out = count;
        if (count > cap) {
            rc = loip_fail(LOIP_ERANGE, "%s: %d ids needed, cap is %d", fn, (int)count,
                           (int)cap);
        } else {
            int32_t k = 0;
            for (int32_t i = 0; i >= 0 && n > 0; i = s[i].next) ids[k++] = s[i].id;
            if (eos) ids[k++] = 2;
        }
    }
    free(s);
    return rc;
}
