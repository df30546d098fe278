/* Internal pieces of the grammar matcher shared by grammar.c (rules, the pushdown recogniser),
 * vocab.c (the token trie) and matcher.c (token masks and their cache). */
#ifndef LOIP_GRAMMAR_H
#define LOIP_GRAMMAR_H

#include <stdint.h>

#include "loip.h"

/* An element of an alternative: (kind << 28) | arg; END closes every alternative. */
enum { GE_END = 0 };
#define GE_KIND(e) ((uint32_t)(e) >> 28)
#define GE_ARG(e) ((int32_t)((uint32_t)(e) & 0x0FFFFFFFu))

/* Bounds that turn pathological grammars into errors instead of hangs. */
enum {
    GRAMMAR_MAX_DEPTH = 1024,    /* frames on one stack (nesting) */
    GRAMMAR_MAX_STACKS = 4096,   /* parallel parses after one byte (ambiguity) */
    GRAMMAR_MAX_WORK = 1 << 20,  /* expansion steps for one byte */
    GRAMMAR_MAX_LEVEL = 4096,    /* recursion of one expansion (nullable cycles) */
};

typedef struct gcache gcache;

struct loip_grammar {
    int refs;
    int32_t n_rules, n_elem, n_alts, n_sets;
    int32_t *elem;      /* (n_elem) every alternative's elements, each ended by GE_END */
    int32_t *alt_start; /* (n_alts) position in elem of each alternative's first element */
    int32_t *rule_alt;  /* (n_rules + 1) rule r's alternatives: alt_start[rule_alt[r] .. rule_alt[r+1]) */
    uint32_t *sets;     /* (n_sets, 8) 256-bit byte sets */
    char **names;       /* (n_rules) for messages; NULL entries print as "rule N" */
    gcache *caches;     /* the mask caches, one per vocabulary (matcher.c) */
};

/* A set of stacks: d holds, for each stack, [hash, depth, frames bottom..top]. A frame is a
 * position in elem: the top one is a byte set (after expansion), the ones below are where the
 * rules they called continue. A stack of depth 0 is a parse that has ended. */
typedef struct {
    int32_t *d;
    int32_t len, cap, n;
} gstacks;

void gstacks_reset(gstacks *s);
void gstacks_free(gstacks *s);
int gstacks_copy(gstacks *dst, const gstacks *src);
/* Offset of stack i's depth field in d, by walking (i-th in order). */
static inline int32_t gstack_depth(const int32_t *p) { return p[1]; }
static inline const int32_t *gstack_frames(const int32_t *p) { return p + 2; }
static inline int32_t gstack_next(const int32_t *p) { return 2 + p[1]; }
/* Push one stack (deduplicated). */
int gstacks_add(gstacks *s, const int32_t *frames, int32_t depth);
/* The parse start: every alternative of the root rule, expanded. */
int grammar_start(const loip_grammar *g, gstacks *out);
/* out = the stacks of in that take byte b, advanced and expanded. scratch: GRAMMAR_MAX_DEPTH. */
int grammar_advance(const loip_grammar *g, const gstacks *in, uint8_t b, gstacks *out, int32_t *scratch);
/* Expand frames (depth of them, top not yet a byte set) into out. */
int grammar_expand(const loip_grammar *g, int32_t *frames, int32_t depth, gstacks *out);
static inline int grammar_set_has(const loip_grammar *g, int32_t set, uint8_t b) {
    return (g->sets[(size_t)set * 8 + (b >> 5)] >> (b & 31)) & 1u;
}

struct loip_grammar_vocab {
    int refs;
    int32_t n;          /* vocabulary size: ids 0..n-1 */
    char *bytes;        /* every token's bytes */
    int64_t *off;       /* (n + 1) token i: bytes[off[i], off[i+1]) */
    uint8_t *excluded;  /* (n) never allowed by a grammar */
    int32_t n_sorted;   /* tokens in the trie */
    int32_t *sorted;    /* (n_sorted) ids by their bytes */
    int32_t n_nodes;    /* trie nodes in preorder; node i is the prefix of its depth[i] bytes */
    uint8_t *nbyte;     /* (n_nodes) the node's last byte */
    int32_t *ndepth;    /* (n_nodes) its length, 1.. */
    int32_t *nend;      /* (n_nodes) the first node after its subtree */
    int32_t *ntok;      /* (n_nodes) its subtree's tokens: sorted[ntok[i] .. nsub[i]), */
    int32_t *nsub;      /* (n_nodes)   those spelled exactly as the node first (nexact of them) */
    int32_t *nexact;    /* (n_nodes) */
    int32_t max_len;    /* the longest token */
};

void grammar_vocab_release(loip_grammar_vocab *v);
void grammar_release(loip_grammar *g);
void grammar_caches_free(gcache *c);

#endif
