/* added.c — added tokens (special tokens and the like): found in the raw text before
 * normalization and pre-tokenization, and never split, as Hugging Face's AddedVocabulary does
 * with its leftmost-longest Aho-Corasick search. Here a byte trie (edges in one hash table) is
 * walked from each position whose byte starts some token; the first position with a match
 * wins, and the longest token there.
 *
 * Differences from HF, none visible with the supported models' special tokens:
 *   - tokens marked "normalized" in tokenizer.json are looked for in the raw text too;
 *   - single_word looks at ASCII word characters (letters, digits, '_') only;
 *   - lstrip/rstrip swallow Unicode white space (ASCII, U+0085, U+00A0, U+1680,
 *     U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000). */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

typedef struct token {
    int32_t id, flags, len;
} token;

struct loip_added {
    token *tokens; /* (n, cap) */
    int32_t n, cap;
    int32_t *node_token; /* (n_nodes) index into tokens of the token ending at a node, or -1 */
    int32_t n_nodes, cap_nodes;
    uint64_t *edge_key;  /* (edge_mask + 1) node << 8 | byte, or UINT64_MAX for a free slot */
    int32_t *edge_child; /* (edge_mask + 1) */
    uint32_t edge_mask;
    int32_t n_edges;
    uint8_t first[256]; /* some token starts with this byte */
};

static uint32_t edge_hash(uint64_t key) { return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32); }

static int32_t child_of(const loip_added *a, int32_t node, uint8_t byte) {
    uint64_t key = (uint64_t)node << 8 | byte;
    for (uint32_t s = edge_hash(key) & a->edge_mask;; s = (s + 1) & a->edge_mask) {
        if (a->edge_key[s] == key) return a->edge_child[s];
        if (a->edge_key[s] == UINT64_MAX) return -1;
    }
}

static int grow_edges(loip_added *a) {
    uint32_t size = a->edge_mask ? 2 * (a->edge_mask + 1) : 256;
    uint64_t *keys = malloc((size_t)size * sizeof *keys);
    int32_t *child = malloc((size_t)size * sizeof *child);
    if (keys == NULL || child == NULL) {
        free(keys);
        free(child);
        return loip_fail(LOIP_ENOMEM, "added tokens: no memory");
    }
    memset(keys, 0xff, (size_t)size * sizeof *keys);
    for (uint32_t i = 0; a->edge_mask && i <= a->edge_mask; i++) {
        if (a->edge_key[i] == UINT64_MAX) continue;
        uint32_t s = edge_hash(a->edge_key[i]) & (size - 1);
        while (keys[s] != UINT64_MAX) s = (s + 1) & (size - 1);
        keys[s] = a->edge_key[i];
        child[s] = a->edge_child[i];
    }
    free(a->edge_key);
    free(a->edge_child);
    a->edge_key = keys, a->edge_child = child, a->edge_mask = size - 1;
    return 0;
}

static int new_node(loip_added *a, int32_t *out) {
    if (a->n_nodes == a->cap_nodes) {
        int32_t cap = a->cap_nodes ? 2 * a->cap_nodes : 64;
        int32_t *v = realloc(a->node_token, (size_t)cap * sizeof *v);
        if (v == NULL) return loip_fail(LOIP_ENOMEM, "added tokens: no memory");
        a->node_token = v, a->cap_nodes = cap;
    }
    a->node_token[a->n_nodes] = -1;
    *out = a->n_nodes++;
    return 0;
}

LOIP_API int loip_added_new(loip_added **out) {
    if (out == NULL) return loip_fail(LOIP_EINVAL, "loip_added_new: out is NULL");
    loip_added *a = calloc(1, sizeof *a);
    int32_t root;
    if (a == NULL || new_node(a, &root) != 0 || grow_edges(a) != 0) {
        loip_added_free(a);
        *out = NULL;
        return loip_fail(LOIP_ENOMEM, "loip_added_new: no memory");
    }
    *out = a;
    return 0;
}

LOIP_API void loip_added_free(loip_added *a) {
    if (a == NULL) return;
    free(a->tokens);
    free(a->node_token);
    free(a->edge_key);
    free(a->edge_child);
    free(a);
}


LOIP_API int loip_added_add(loip_added *a, const char *text, size_t len, int32_t id,
                            int32_t flags) {
    if (a == NULL || (text == NULL && len > 0))
        return loip_fail(LOIP_EINVAL, "loip_added_add: NULL argument");
    if (len == 0) return loip_fail(LOIP_EINVAL, "added token %d is the empty string", (int)id);
    if (len > (1u << 16))
        return loip_fail(LOIP_EINVAL, "added token %d is %zu bytes long", (int)id, len);
    int32_t node = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t b = (uint8_t)text[i];
        int32_t c = child_of(a, node, b);
        if (c < 0) {
            int rc = new_node(a, &c);
            if (rc == 0 && 2 * (a->n_edges + 1) > (int32_t)(a->edge_mask + 1)) rc = grow_edges(a);
            if (rc != 0) return rc;
            uint64_t key = (uint64_t)node << 8 | b;
            uint32_t s = edge_hash(key) & a->edge_mask;
            while (a->edge_key[s] != UINT64_MAX) s = (s + 1) & a->edge_mask;
            a->edge_key[s] = key;
            a->edge_child[s] = c;
            a->n_edges++;
        }
        node = c;
    }
    a->first[(uint8_t)text[0]] = 1;
    if (a->node_token[node] >= 0) {
        a->tokens[a->node_token[node]] = (token){id, flags, (int32_t)len};
        return 0;
    }
    if (a->n == a->cap) {
        int32_t cap = a->cap ? 2 * a->cap : 64;
        token *v = realloc(a->tokens, (size_t)cap * sizeof *v);
        if (v == NULL) return loip_fail(LOIP_ENOMEM, "added tokens: no memory");
        a->tokens = v, a->cap = cap;
    }
    a->tokens[a->n] = (token){id, flags, (int32_t)len};
    a->node_token[node] = a->n++;
    return 0;
}

/* ---- split -------------------------------------------------------------------------------- */

/* Bytes of the white-space character that starts at p[0..n), or 0. */
static int space_at(const uint8_t *p, size_t n) {
    uint32_t cp;
    int k = loip_utf8_decode(p, n, &cp);
    if (k == 0) return 0;
    int ws = (cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
             (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
             cp == 0x205F || cp == 0x3000;
    return ws ? k : 0;
}

/* Bytes of the white-space character that ends at p[end], looking no further back than
 * p[lo], or 0. */
static int space_before(const uint8_t *p, size_t lo, size_t end) {
    for (int k = 1; k <= 3 && end >= lo + (size_t)k; k++)
        if (space_at(p + end - k, (size_t)k) == k) return k;
    return 0;
}

static int word_byte(uint8_t c) {
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}

static int push_seg(int32_t *seg, int32_t cap, int32_t *n, size_t s, size_t e, int32_t id) {
    if (*n < cap) {
        seg[3 * *n] = (int32_t)s;
        seg[3 * *n + 1] = (int32_t)e;
        seg[3 * *n + 2] = id;
    }
    (*n)++;
    return 0;
}

LOIP_API int loip_added_split(const loip_added *a, const char *text, size_t len,
                              int32_t skip_special, int32_t *seg, int32_t cap, int32_t *n_out) {
    if (a == NULL || n_out == NULL || (text == NULL && len > 0) || (seg == NULL && cap > 0))
        return loip_fail(LOIP_EINVAL, "loip_added_split: NULL argument");
    if (len > (size_t)INT32_MAX)
        return loip_fail(LOIP_EINVAL, "loip_added_split: text of %zu bytes is too long", len);
    const uint8_t *p = (const uint8_t *)text;
    int32_t n = 0;
    size_t seg_start = 0, i = 0;
    while (i < len) {
        if (!a->first[p[i]]) {
            i++;
            continue;
        }
        int32_t best = -1, node = 0;
        for (size_t j = i; j < len; j++) {
            node = child_of(a, node, p[j]);
            if (node < 0) break;
            int32_t t = a->node_token[node];
            if (t < 0) continue;
            const token *tk = &a->tokens[t];
            if (skip_special && (tk->flags & LOIP_ADDED_SPECIAL)) continue;
            if ((tk->flags & LOIP_ADDED_SINGLE_WORD) &&
                ((i > 0 && word_byte(p[i - 1])) || (j + 1 < len && word_byte(p[j + 1]))))
                continue;
            best = t;
        }
        if (best < 0) {
            i++;
            continue;
        }
        const token *tk = &a->tokens[best];
        size_t ms = i, me = i + (size_t)tk->len;
        if (tk->flags & LOIP_ADDED_LSTRIP) {
            int k;
            while ((k = space_before(p, seg_start, ms)) > 0) ms -= (size_t)k;
        }
        if (tk->flags & LOIP_ADDED_RSTRIP) {
            int k;
            while (me < len && (k = space_at(p + me, len - me)) > 0) me += (size_t)k;
        }
        if (ms > seg_start) push_seg(seg, cap, &n, seg_start, ms, -1);
        push_seg(seg, cap, &n, ms, me, tk->id);
        seg_start = i = me;
    }
    if (len > seg_start) push_seg(seg, cap, &n, seg_start, len, -1);
    *n_out = n;
    if (n > cap)
        return loip_fail(LOIP_ERANGE, "loip_added_split: %d segments, cap is %d", (int)n, (int)cap);
    return 0;
}
