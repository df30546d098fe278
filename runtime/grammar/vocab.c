/* A tokenizer's vocabulary as a trie for token masks, built once per tokenizer: the tokens
 * sorted by their bytes, and the trie's nodes laid out in preorder, so that a mask walks every
 * shared prefix once, skips a rejected prefix's whole subtree by one index (nend), and finds a
 * subtree's tokens as one range of the sorted ids (XGrammar and llguidance keep their tries
 * this way: flat, in preorder). Special and control tokens are not in the trie. */
#define _GNU_SOURCE /* qsort_r */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "grammar/grammar.h"

static int by_bytes(const void *a, const void *b, void *ctx) {
    const loip_grammar_vocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    int64_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], (size_t)(lx < ly ? lx : ly));
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

void grammar_vocab_release(loip_grammar_vocab *v) {
    if (!v || --v->refs > 0) return;
    free(v->bytes), free(v->off), free(v->excluded), free(v->sorted);
    free(v->nbyte), free(v->ndepth), free(v->nend), free(v->ntok), free(v->nsub), free(v->nexact);
    free(v);
}

LOIP_API void loip_grammar_vocab_free(loip_grammar_vocab *v) { grammar_vocab_release(v); }
LOIP_API int32_t loip_grammar_vocab_size(const loip_grammar_vocab *v) { return v ? v->n : 0; }
LOIP_API int64_t loip_grammar_vocab_nodes(const loip_grammar_vocab *v) { return v ? v->n_nodes : 0; }

LOIP_API int loip_grammar_vocab_new(const char *bytes, const int64_t *offsets, const uint8_t *excluded,
                                    int32_t n, loip_grammar_vocab **out) {
    *out = NULL;
    if (n < 1 || !offsets || offsets[0] != 0) return loip_fail(LOIP_EINVAL, "grammar vocabulary: no tokens");
    for (int32_t i = 0; i < n; i++)
        if (offsets[i + 1] < offsets[i]) return loip_fail(LOIP_EINVAL, "grammar vocabulary: offsets of token %d decrease", i);
    int64_t total = offsets[n];
    loip_grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) return loip_fail(LOIP_ENOMEM, "grammar vocabulary: out of memory");
    v->refs = 1, v->n = n;
    v->bytes = malloc((size_t)(total ? total : 1));
    v->off = malloc(((size_t)n + 1) * sizeof *v->off);
    v->excluded = calloc((size_t)n, 1);
    v->sorted = malloc((size_t)n * sizeof *v->sorted);
    if (!v->bytes || !v->off || !v->excluded || !v->sorted) goto oom;
    if (total) memcpy(v->bytes, bytes, (size_t)total);
    memcpy(v->off, offsets, ((size_t)n + 1) * sizeof *v->off);
    int64_t nodes_max = 0;
    for (int32_t i = 0; i < n; i++) {
        int64_t len = offsets[i + 1] - offsets[i];
        v->excluded[i] = (excluded && excluded[i]) || len == 0;
        if (v->excluded[i]) continue;
        v->sorted[v->n_sorted++] = i;
        nodes_max += len;
        if (len > v->max_len) v->max_len = (int32_t)len;
    }
    qsort_r(v->sorted, (size_t)v->n_sorted, sizeof *v->sorted, by_bytes, v);
    size_t nm = (size_t)(nodes_max ? nodes_max : 1);
    v->nbyte = malloc(nm), v->ndepth = malloc(nm * 4), v->nend = malloc(nm * 4);
    v->ntok = malloc(nm * 4), v->nsub = malloc(nm * 4), v->nexact = calloc(nm, 4);
    int32_t *path = malloc(((size_t)v->max_len + 1) * sizeof *path); /* open nodes by depth - 1 */
    if (!v->nbyte || !v->ndepth || !v->nend || !v->ntok || !v->nsub || !v->nexact || !path) {
        free(path);
        goto oom;
    }
    /* tokens in order: close the open nodes past the common prefix with the previous token,
     * open one node per further byte */
    int32_t open = 0, nn = 0;
    const char *prev = NULL;
    int64_t prev_len = 0;
    for (int32_t k = 0; k < v->n_sorted; k++) {
        int32_t id = v->sorted[k];
        const char *s = v->bytes + v->off[id];
        int64_t len = v->off[id + 1] - v->off[id], lcp = 0;
        while (prev && lcp < len && lcp < prev_len && s[lcp] == prev[lcp]) lcp++;
        while (open > lcp) {
            int32_t node = path[--open];
            v->nend[node] = nn, v->nsub[node] = k;
        }
        for (int64_t d = lcp; d < len; d++) {
            v->nbyte[nn] = (uint8_t)s[d];
            v->ndepth[nn] = (int32_t)d + 1;
            v->ntok[nn] = k;
            path[open++] = nn++;
        }
        v->nexact[path[len - 1]]++; /* sorted: the exact spellings come first in the subtree */
        prev = s, prev_len = len;
    }
    while (open > 0) {
        int32_t node = path[--open];
        v->nend[node] = nn, v->nsub[node] = v->n_sorted;
    }
    free(path);
    v->n_nodes = nn;
    *out = v;
    return 0;
oom:
    grammar_vocab_release(v);
    return loip_fail(LOIP_ENOMEM, "grammar vocabulary: out of memory");
}
