/* Token masks: which tokens of a vocabulary the grammar allows next, and the matcher that
 * advances by the chosen one.
 *
 * The mask of a set of parse stacks is the union of each stack's. A stack's mask depends on
 * all its frames, but most tokens are decided by the top few (a token inside a JSON string
 * never leaves the string rule): as XGrammar's adaptive token mask cache does, each stack's
 * top KEY_FRAMES frames are a key whose entry holds the tokens accepted without leaving those
 * frames (accepted whatever lies below) and the tokens that left them part way (uncertain);
 * the rest are rejected whatever lies below. An entry is made once per grammar and vocabulary,
 * and a mask is then the entries' accepted sets plus the uncertain tokens checked one by one
 * against the whole stack. A stack no deeper than the key has no uncertain tokens: its entry
 * is exact.
 *
 * Entries come in two depths. One of the top WALK_FRAMES frames is made by walking the
 * vocabulary's trie from those frames alone (a subtree pruned as soon as no parse takes its
 * prefix): the cost of a whole walk is paid once for, e.g., the inside of every JSON string,
 * whatever property it is the value of. One of KEY_FRAMES, which a mask uses, refines it: the
 * shallow entry's accepted tokens stay accepted and its refused ones refused, and only its
 * uncertain ones (a few thousand at most) are tried on the deeper key, token by token; so the
 * uncertain tokens left to check at each mask are few. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "grammar/grammar.h"

enum {
    KEY_FRAMES = 5,  /* a mask's entries: a stack's top frames */
    WALK_FRAMES = 3, /* the entries made by walking the trie; deeper ones refine these */
    CACHE_MAX_BYTES = 256 << 20, /* per grammar and vocabulary: past it the entries are dropped */
    WALK_MAX_PARSES = 1 << 25,   /* parses advanced by one entry's walk: a grammar too ambiguous */
};

typedef struct {
    uint32_t hash;
    int32_t used, nk, trunc;
    int32_t key[KEY_FRAMES];
    uint32_t *bits; /* (n_words) the accepted tokens when many, else NULL and: */
    int32_t *acc;   /* (n_acc) the accepted ids */
    int32_t n_acc;
    int32_t *unc; /* (n_unc) the uncertain ids */
    int32_t n_unc;
} gentry;

typedef struct {
    int32_t *d;
    int32_t n, cap;
} ids;

struct gcache {
    gcache *next;
    loip_grammar_vocab *v; /* held (a reference) */
    gentry *tab;
    int32_t cap, used;
    int64_t bytes;
    gstacks *levels;  /* (v->max_len + 1) the walk's parses after each depth */
    gstacks ta, tb;   /* a token's parses (refine) */
    uint8_t *left;    /* (v->max_len + 1) a parse left the key's frames by this depth */
    int32_t *scratch; /* (GRAMMAR_MAX_DEPTH) */
    ids acc, unc;
};

struct loip_grammar_matcher {
    loip_grammar *g;        /* held */
    loip_grammar_vocab *v;  /* held */
    gcache *c;              /* g's cache for v */
    gstacks cur, t1, t2;    /* the parses now; two more for checks */
    int32_t *stop;          /* (n_stop) */
    int32_t n_stop, done;   /* done: a stop id was accepted */
    int32_t scratch[GRAMMAR_MAX_DEPTH];
    uint32_t *bits;         /* apply's mask */
};

/* ---- the cache ------------------------------------------------------------------------- */

static void entry_clear(gentry *e) {
    free(e->bits), free(e->acc), free(e->unc);
    memset(e, 0, sizeof *e);
}

static void cache_drop_entries(gcache *c) {
    for (int32_t i = 0; i < c->cap; i++)
        if (c->tab[i].used) entry_clear(&c->tab[i]);
    c->used = 0, c->bytes = 0;
}

void grammar_caches_free(gcache *c) {
    while (c) {
        gcache *next = c->next;
        if (c->tab) cache_drop_entries(c);
        free(c->tab);
        if (c->levels)
            for (int32_t d = 0; d <= c->v->max_len; d++) gstacks_free(&c->levels[d]);
        gstacks_free(&c->ta), gstacks_free(&c->tb);
        free(c->levels), free(c->left), free(c->scratch), free(c->acc.d), free(c->unc.d);
        grammar_vocab_release(c->v);
        free(c);
        c = next;
    }
}

static gcache *cache_for(loip_grammar *g, loip_grammar_vocab *v) {
    for (gcache *c = g->caches; c; c = c->next)
        if (c->v == v) return c;
    gcache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->v = v, v->refs++;
    c->cap = 64;
    c->tab = calloc((size_t)c->cap, sizeof *c->tab);
    c->levels = calloc((size_t)v->max_len + 1, sizeof *c->levels);
    c->left = calloc((size_t)v->max_len + 1, 1);
    c->scratch = malloc(GRAMMAR_MAX_DEPTH * sizeof *c->scratch);
    if (!c->tab || !c->levels || !c->left || !c->scratch) {
        grammar_caches_free(c);
        return NULL;
    }
    c->next = g->caches, g->caches = c;
    return c;
}

static int ids_push(ids *l, int32_t id) {
    if (l->n == l->cap) {
        int32_t cap = l->cap ? 2 * l->cap : 1024;
        int32_t *d = realloc(l->d, (size_t)cap * sizeof *d);
        if (!d) return loip_fail(LOIP_ENOMEM, "grammar: out of memory for a token mask");
        l->d = d, l->cap = cap;
    }
    l->d[l->n++] = id;
    return 0;
}

static int ids_range(ids *l, const loip_grammar_vocab *v, int32_t lo, int32_t hi) {
    for (int32_t k = lo; k < hi; k++) {
        int rc = ids_push(l, v->sorted[k]);
        if (rc) return rc;
    }
    return 0;
}

/* The entry's tokens: walk the trie from the key's frames alone (see the top of the file). */
static int walk(const loip_grammar *g, gcache *c, const int32_t *frames, int32_t nk, int trunc) {
    const loip_grammar_vocab *v = c->v;
    c->acc.n = c->unc.n = 0;
    gstacks_reset(&c->levels[0]);
    int rc = gstacks_add(&c->levels[0], frames, nk);
    if (rc) return rc;
    c->left[0] = 0;
    int64_t parses = 0;
    for (int32_t i = 0; i < v->n_nodes && !rc;) {
        int32_t d = v->ndepth[i];
        gstacks *out = &c->levels[d];
        if ((parses += c->levels[d - 1].n) > WALK_MAX_PARSES)
            return loip_fail(LOIP_ERANGE, "grammar: a token mask needs more than %d parse steps (the grammar is "
                             "too ambiguous)", WALK_MAX_PARSES);
        rc = grammar_advance(g, &c->levels[d - 1], v->nbyte[i], out, c->scratch);
        if (rc) break;
        int left_before = c->left[d - 1];
        if (out->n == 0) { /* no parse takes this prefix: its subtree is rejected, or needs what lies below */
            if (left_before) rc = ids_range(&c->unc, v, v->ntok[i], v->nsub[i]);
            i = v->nend[i];
            continue;
        }
        int32_t live = 0, ended = 0;
        for (int32_t o = 0; o < out->len; o += gstack_next(out->d + o))
            if (out->d[o + 1]) live++;
            else ended = 1;
        rc = ids_range(&c->acc, v, v->ntok[i], v->ntok[i] + v->nexact[i]);
        c->left[d] = trunc && (left_before || ended);
        if (!live) {
            if (!rc && c->left[d]) rc = ids_range(&c->unc, v, v->ntok[i] + v->nexact[i], v->nsub[i]);
            i = v->nend[i];
            continue;
        }
        i++;
    }
    return rc;
}

/* Token id from the key's frames alone: 1 accepted, 2 uncertain (it left them), 0 refused. */
static int classify(const loip_grammar *g, gcache *c, const int32_t *key, int32_t nk, int trunc, int32_t id, int *rc) {
    const loip_grammar_vocab *v = c->v;
    const uint8_t *s = (const uint8_t *)v->bytes + v->off[id];
    int64_t len = v->off[id + 1] - v->off[id];
    gstacks *a = &c->ta, *b = &c->tb;
    gstacks_reset(a);
    if ((*rc = gstacks_add(a, key, nk))) return 0;
    int left = 0;
    for (int64_t i = 0; i < len; i++) {
        for (int32_t o = 0; trunc && !left && o < a->len; o += gstack_next(a->d + o)) left = a->d[o + 1] == 0;
        if ((*rc = grammar_advance(g, a, s[i], b, c->scratch))) return 0;
        if (b->n == 0) return left ? 2 : 0;
        gstacks *t = a;
        a = b, b = t;
    }
    return 1;
}

static gentry *cache_lookup(const loip_grammar *g, gcache *c, const int32_t *frames, int32_t depth, int32_t max_nk,
                            int *rc);

/* c->acc, c->unc of the key's top nk frames (deeper than WALK_FRAMES) from the entry of its
 * top WALK_FRAMES: that entry's accepted tokens stay accepted and its refused ones refused;
 * only its uncertain ones are tried, token by token, on the deeper key. */
static int refine(const loip_grammar *g, gcache *c, const int32_t *frames, int32_t depth, int32_t nk, int trunc) {
    int rc = 0;
    gentry *e = cache_lookup(g, c, frames, depth, WALK_FRAMES, &rc);
    if (!e) return rc;
    const uint32_t *bits = e->bits; /* the entry's arrays stay while no entry is added */
    const int32_t *acc = e->acc, *unc = e->unc;
    int32_t n_acc = e->n_acc, n_unc = e->n_unc, n_words = (c->v->n + 31) / 32;
    c->acc.n = c->unc.n = 0;
    for (int32_t w = 0; bits && w < n_words && !rc; w++)
        for (uint32_t x = bits[w]; x && !rc; x &= x - 1) rc = ids_push(&c->acc, w * 32 + __builtin_ctz(x));
    for (int32_t k = 0; k < n_acc && !rc; k++) rc = ids_push(&c->acc, acc[k]);
    const int32_t *key = frames + depth - nk;
    for (int32_t k = 0; k < n_unc && !rc; k++) {
        int r = classify(g, c, key, nk, trunc, unc[k], &rc);
        if (r == 1) rc = rc ? rc : ids_push(&c->acc, unc[k]);
        else if (r == 2) rc = rc ? rc : ids_push(&c->unc, unc[k]);
    }
    return rc;
}

static gentry *cache_lookup(const loip_grammar *g, gcache *c, const int32_t *frames, int32_t depth, int32_t max_nk,
                            int *rc) {
    int32_t nk = depth < max_nk ? depth : max_nk, trunc = depth > max_nk;
    const int32_t *key = frames + depth - nk;
    uint32_t h = 2166136261u ^ (uint32_t)(nk * 2 + trunc);
    for (int32_t k = 0; k < nk; k++) h = (h ^ (uint32_t)key[k]) * 16777619u;
    for (int32_t s = (int32_t)(h & (uint32_t)(c->cap - 1));; s = (s + 1) & (c->cap - 1)) {
        gentry *e = &c->tab[s];
        if (!e->used) break;
        if (e->hash == h && e->nk == nk && e->trunc == trunc && !memcmp(e->key, key, (size_t)nk * 4)) return e;
    }
    /* not there: make it */
    *rc = nk > WALK_FRAMES ? refine(g, c, frames, depth, nk, trunc) : walk(g, c, key, nk, trunc);
    if (*rc) return NULL;
    const loip_grammar_vocab *v = c->v;
    int32_t n_words = (v->n + 31) / 32;
    if (c->bytes > CACHE_MAX_BYTES) cache_drop_entries(c);
    if (2 * (c->used + 1) > c->cap) { /* grow, rehash */
        int32_t cap = 2 * c->cap;
        gentry *tab = calloc((size_t)(uint32_t)cap, sizeof *tab);
        if (!tab) {
            *rc = loip_fail(LOIP_ENOMEM, "grammar: out of memory for the mask cache");
            return NULL;
        }
        for (int32_t i = 0; i < c->cap; i++) {
            if (!c->tab[i].used) continue;
            int32_t s = (int32_t)(c->tab[i].hash & (uint32_t)(cap - 1));
            while (tab[s].used) s = (s + 1) & (cap - 1);
            tab[s] = c->tab[i];
        }
        free(c->tab);
        c->tab = tab, c->cap = cap;
    }
    int32_t s = (int32_t)(h & (uint32_t)(c->cap - 1));
    while (c->tab[s].used) s = (s + 1) & (c->cap - 1);
    gentry *e = &c->tab[s];
    e->hash = h, e->nk = nk, e->trunc = trunc;
    memcpy(e->key, key, (size_t)nk * 4);
    if (c->acc.n > n_words) { /* many: as bits */
        e->bits = calloc((size_t)n_words, 4);
        if (e->bits)
            for (int32_t k = 0; k < c->acc.n; k++) e->bits[c->acc.d[k] >> 5] |= 1u << (c->acc.d[k] & 31);
        c->bytes += (int64_t)n_words * 4;
    } else if (c->acc.n) {
        e->acc = malloc((size_t)c->acc.n * 4);
        if (e->acc) memcpy(e->acc, c->acc.d, (size_t)c->acc.n * 4);
        e->n_acc = c->acc.n;
        c->bytes += (int64_t)c->acc.n * 4;
    }
    if (c->unc.n) {
        e->unc = malloc((size_t)c->unc.n * 4);
        if (e->unc) memcpy(e->unc, c->unc.d, (size_t)c->unc.n * 4);
        e->n_unc = c->unc.n;
        c->bytes += (int64_t)c->unc.n * 4;
    }
    if ((c->acc.n > n_words && !e->bits) || (c->acc.n && c->acc.n <= n_words && !e->acc) || (c->unc.n && !e->unc)) {
        entry_clear(e);
        *rc = loip_fail(LOIP_ENOMEM, "grammar: out of memory for the mask cache");
        return NULL;
    }
    e->used = 1;
    c->used++;
    return e;
}

/* ---- the matcher ----------------------------------------------------------------------- */

LOIP_API int loip_grammar_matcher_new(loip_grammar *g, loip_grammar_vocab *v, const int32_t *stop_ids,
                                      int32_t n_stop, loip_grammar_matcher **out) {
    *out = NULL;
    if (!g || !v || n_stop < 0 || (n_stop && !stop_ids)) return loip_fail(LOIP_EINVAL, "grammar matcher: no grammar or vocabulary");
    for (int32_t i = 0; i < n_stop; i++)
        if (stop_ids[i] < 0 || stop_ids[i] >= v->n)
            return loip_fail(LOIP_EINVAL, "grammar matcher: stop id %d is not in the vocabulary (size %d)", stop_ids[i], v->n);
    loip_grammar_matcher *m = calloc(1, sizeof *m);
    if (!m) return loip_fail(LOIP_ENOMEM, "grammar matcher: out of memory");
    m->g = g, m->v = v;
    g->refs++, v->refs++;
    m->c = cache_for(g, v);
    m->stop = malloc((size_t)(n_stop ? n_stop : 1) * sizeof *m->stop);
    if (!m->c || !m->stop) {
        loip_grammar_matcher_free(m);
        return loip_fail(LOIP_ENOMEM, "grammar matcher: out of memory");
    }
    if (n_stop) memcpy(m->stop, stop_ids, (size_t)n_stop * sizeof *m->stop);
    m->n_stop = n_stop;
    int rc = grammar_start(g, &m->cur);
    if (rc) {
        loip_grammar_matcher_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

LOIP_API int loip_grammar_matcher_clone(const loip_grammar_matcher *m, loip_grammar_matcher **out) {
    *out = NULL;
    loip_grammar_matcher *k = calloc(1, sizeof *k);
    if (!k) return loip_fail(LOIP_ENOMEM, "grammar matcher: out of memory");
    k->g = m->g, k->v = m->v, k->c = m->c;
    k->g->refs++, k->v->refs++;
    k->stop = malloc((size_t)(m->n_stop ? m->n_stop : 1) * sizeof *k->stop);
    if (!k->stop || gstacks_copy(&k->cur, &m->cur)) {
        loip_grammar_matcher_free(k);
        return loip_fail(LOIP_ENOMEM, "grammar matcher: out of memory");
    }
    if (m->n_stop) memcpy(k->stop, m->stop, (size_t)m->n_stop * sizeof *k->stop);
    k->n_stop = m->n_stop, k->done = m->done;
    *out = k;
    return 0;
}

LOIP_API void loip_grammar_matcher_free(loip_grammar_matcher *m) {
    if (!m) return;
    gstacks_free(&m->cur), gstacks_free(&m->t1), gstacks_free(&m->t2);
    free(m->stop), free(m->bits);
    grammar_release(m->g);
    grammar_vocab_release(m->v);
    free(m);
}

static int has_ended(const gstacks *s) {
    for (int32_t o = 0; o < s->len; o += gstack_next(s->d + o))
        if (s->d[o + 1] == 0) return 1;
    return 0;
}

LOIP_API int loip_grammar_matcher_can_end(const loip_grammar_matcher *m) { return !m->done && has_ended(&m->cur); }

LOIP_API int loip_grammar_matcher_must_end(const loip_grammar_matcher *m) {
    if (m->done) return 0;
    for (int32_t o = 0; o < m->cur.len; o += gstack_next(m->cur.d + o))
        if (m->cur.d[o + 1]) return 0;
    return m->cur.n > 0;
}

/* in advanced by bytes s into out (t2 the other buffer); 0 and out->n == 0 when refused at
 * some byte (*at: its offset). */
static int advance_bytes(loip_grammar_matcher *m, const gstacks *in, const char *s, size_t len, gstacks **res,
                         size_t *at) {
    const gstacks *a = in;
    gstacks *b = &m->t1, *other = &m->t2;
    for (size_t i = 0; i < len; i++) {
        int rc = grammar_advance(m->g, a, (uint8_t)s[i], b, m->scratch);
        if (rc) return rc;
        *res = b;
        if (b->n == 0) {
            *at = i;
            return 0;
        }
        a = b;
        gstacks *t = b;
        b = other, other = t;
    }
    return 0;
}

static int is_stop(const loip_grammar_matcher *m, int32_t id) {
    for (int32_t i = 0; i < m->n_stop; i++)
        if (m->stop[i] == id) return 1;
    return 0;
}

static void quote(const char *s, size_t len, char *buf, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < len && o + 8 < cap; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 32 && ch < 127 && ch != '"' && ch != '\\') buf[o++] = (char)ch;
        else o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", ch);
    }
    buf[o] = 0;
}

LOIP_API int loip_grammar_matcher_accept(loip_grammar_matcher *m, int32_t id) {
    const loip_grammar_vocab *v = m->v;
    if (id < 0 || id >= v->n) return loip_fail(LOIP_EINVAL, "grammar: token %d is not in the vocabulary (size %d)", id, v->n);
    if (m->done) return loip_fail(LOIP_EINVAL, "grammar: token %d after the document ended (a stop token was accepted)", id);
    if (is_stop(m, id)) {
        if (!has_ended(&m->cur))
            return loip_fail(LOIP_EINVAL, "grammar: token %d (a stop token) is not allowed: the document is not complete", id);
        m->done = 1;
        return 0;
    }
    if (v->excluded[id])
        return loip_fail(LOIP_EINVAL, "grammar: token %d is a special token, never allowed by a grammar", id);
    const char *s = v->bytes + v->off[id];
    size_t len = (size_t)(v->off[id + 1] - v->off[id]), at = 0;
    gstacks *res = NULL;
    int rc = advance_bytes(m, &m->cur, s, len, &res, &at);
    if (rc) return rc;
    if (res->n == 0) {
        char buf[160];
        quote(s, len, buf, sizeof buf);
        return loip_fail(LOIP_EINVAL, "grammar: token %d (\"%s\") is not allowed here", id, buf);
    }
    gstacks t = m->cur;
    m->cur = *res, *res = t;
    return 0;
}

LOIP_API int loip_grammar_matcher_accept_bytes(loip_grammar_matcher *m, const char *s, size_t len) {
    if (m->done) return loip_fail(LOIP_EINVAL, "grammar: bytes after the document ended");
    if (len == 0) return 0;
    gstacks *res = NULL;
    size_t at = 0;
    int rc = advance_bytes(m, &m->cur, s, len, &res, &at);
    if (rc) return rc;
    if (res->n == 0) {
        char buf[64];
        quote(s + at, len - at < 16 ? len - at : 16, buf, sizeof buf);
        return loip_fail(LOIP_EINVAL, "grammar: byte %zu (at \"%s\") is not allowed", at, buf);
    }
    gstacks t = m->cur;
    m->cur = *res, *res = t;
    return 0;
}

/* Whether stack (frames, depth) takes token id whole. */
static int takes(loip_grammar_matcher *m, const int32_t *frames, int32_t depth, int32_t id, int *rc) {
    gstacks_reset(&m->t1);
    *rc = gstacks_add(&m->t1, frames, depth);
    if (*rc) return 0;
    const loip_grammar_vocab *v = m->v;
    const uint8_t *s = (const uint8_t *)v->bytes + v->off[id];
    int64_t len = v->off[id + 1] - v->off[id];
    gstacks *a = &m->t1, *b = &m->t2;
    for (int64_t i = 0; i < len; i++) {
        *rc = grammar_advance(m->g, a, s[i], b, m->scratch);
        if (*rc || b->n == 0) return 0;
        gstacks *t = a;
        a = b, b = t;
    }
    return 1;
}

LOIP_API int loip_grammar_matcher_mask(loip_grammar_matcher *m, uint32_t *bits, int32_t n_words) {
    const loip_grammar_vocab *v = m->v;
    int32_t need = (v->n + 31) / 32;
    if (n_words < need) return loip_fail(LOIP_EINVAL, "grammar: the mask has %d words, the vocabulary needs %d", n_words, need);
    memset(bits, 0, (size_t)n_words * 4);
    if (m->done) return 0;
    int rc = 0;
    for (int32_t o = 0; o < m->cur.len; o += gstack_next(m->cur.d + o)) {
        const int32_t *frames = m->cur.d + o + 2;
        int32_t depth = m->cur.d[o + 1];
        if (!depth) continue;
        gentry *e = cache_lookup(m->g, m->c, frames, depth, KEY_FRAMES, &rc);
        if (!e) return rc;
        if (e->bits)
            for (int32_t w = 0; w < need; w++) bits[w] |= e->bits[w];
        else
            for (int32_t k = 0; k < e->n_acc; k++) bits[e->acc[k] >> 5] |= 1u << (e->acc[k] & 31);
        for (int32_t k = 0; k < e->n_unc; k++) {
            int32_t id = e->unc[k];
            if ((bits[id >> 5] >> (id & 31)) & 1u) continue;
            if (takes(m, frames, depth, id, &rc)) bits[id >> 5] |= 1u << (id & 31);
            if (rc) return rc;
        }
    }
    int end = has_ended(&m->cur);
    for (int32_t i = 0; i < m->n_stop; i++) {
        int32_t id = m->stop[i];
        if (end) bits[id >> 5] |= 1u << (id & 31);
        else bits[id >> 5] &= ~(1u << (id & 31));
    }
    return 0;
}

LOIP_API int loip_grammar_matcher_apply(loip_grammar_matcher *m, float *logits, int32_t n) {
    int32_t need = (m->v->n + 31) / 32;
    if (!m->bits) {
        m->bits = malloc((size_t)need * 4);
        if (!m->bits) return loip_fail(LOIP_ENOMEM, "grammar: out of memory");
    }
    int rc = loip_grammar_matcher_mask(m, m->bits, need);
    if (rc) return rc;
    for (int32_t i = 0; i < n; i++)
        if (i >= m->v->n || !((m->bits[i >> 5] >> (i & 31)) & 1u)) logits[i] = -INFINITY;
    return 0;
}

LOIP_API void loip_grammar_matcher_cache_stats(const loip_grammar_matcher *m, int64_t *entries, int64_t *bytes) {
    *entries = m->c ? m->c->used : 0;
    *bytes = m->c ? m->c->bytes : 0;
}
