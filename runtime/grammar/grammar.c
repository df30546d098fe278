/* Grammars over bytes and their pushdown recogniser: a set of rule stacks, as llama.cpp's
 * grammar keeps, advanced one byte at a time. The IR comes from Lua (loip.text.gbnf), which
 * parses GBNF and JSON schemas where errors are easiest to name (line, column, JSON pointer);
 * code points are already bytes there (a class is alternatives of UTF-8 byte sequences), so
 * the recogniser knows nothing of UTF-8 and a token is walked byte by byte.
 *
 * A stack's top is always a byte set: expansion replaces a rule reference on top by each of the
 * rule's alternatives (a call whose caller has nothing left is a tail call: x* as r ::= x r |
 * empty keeps the stack flat), and an ended alternative returns to the frame below. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "grammar/grammar.h"

/* ---- stack sets ------------------------------------------------------------------------- */

void gstacks_reset(gstacks *s) { s->len = 0, s->n = 0; }

void gstacks_free(gstacks *s) {
    free(s->d);
    s->d = NULL, s->len = s->cap = s->n = 0;
}

static int gstacks_reserve(gstacks *s, int32_t more) {
    if (s->len + more <= s->cap) return 0;
    int32_t cap = s->cap ? s->cap : 64;
    while (cap < s->len + more) cap *= 2;
    int32_t *d = realloc(s->d, (size_t)cap * sizeof *d);
    if (!d) return loip_fail(LOIP_ENOMEM, "grammar: out of memory for the parse stacks");
    s->d = d, s->cap = cap;
    return 0;
}

int gstacks_copy(gstacks *dst, const gstacks *src) {
    gstacks_reset(dst);
    int rc = gstacks_reserve(dst, src->len);
    if (rc) return rc;
    if (src->len) memcpy(dst->d, src->d, (size_t)src->len * sizeof *src->d);
    dst->len = src->len, dst->n = src->n;
    return 0;
}

static int32_t hash_frames(const int32_t *f, int32_t depth) {
    uint32_t h = 2166136261u ^ (uint32_t)depth;
    for (int32_t i = 0; i < depth; i++) h = (h ^ (uint32_t)f[i]) * 16777619u;
    return (int32_t)h;
}

int gstacks_add(gstacks *s, const int32_t *frames, int32_t depth) {
    int32_t h = hash_frames(frames, depth);
    for (int32_t o = 0; o < s->len; o += gstack_next(s->d + o)) {
        const int32_t *p = s->d + o;
        if (p[0] == h && p[1] == depth && !memcmp(p + 2, frames, (size_t)depth * sizeof *frames)) return 0;
    }
    if (s->n >= GRAMMAR_MAX_STACKS)
        return loip_fail(LOIP_ERANGE, "grammar: more than %d parses at once (the grammar is too ambiguous)",
                         GRAMMAR_MAX_STACKS);
    int rc = gstacks_reserve(s, depth + 2);
    if (rc) return rc;
    int32_t *p = s->d + s->len;
    p[0] = h, p[1] = depth;
    memcpy(p + 2, frames, (size_t)depth * sizeof *frames);
    s->len += depth + 2, s->n++;
    return 0;
}

/* ---- expansion ------------------------------------------------------------------------- */

typedef struct {
    const loip_grammar *g;
    gstacks *out;
    int32_t work;
} expander;

static const char *rule_name(const loip_grammar *g, int32_t r, char *buf, size_t cap) {
    if (g->names && g->names[r]) return g->names[r];
    snprintf(buf, cap, "rule %d", r);
    return buf;
}

static int expand(expander *x, int32_t *fr, int32_t depth, int32_t level) {
    const loip_grammar *g = x->g;
    if (++x->work > GRAMMAR_MAX_WORK || level > GRAMMAR_MAX_LEVEL)
        return loip_fail(LOIP_ERANGE, "grammar: a byte needs more than %d expansion steps (rules that "
                         "call each other without consuming input?)", GRAMMAR_MAX_WORK);
    if (depth == 0) return gstacks_add(x->out, fr, 0);
    int32_t pos = fr[depth - 1];
    int32_t e = g->elem[pos];
    uint32_t kind = GE_KIND(e);
    if (kind == LOIP_GRAMMAR_SET) return gstacks_add(x->out, fr, depth);
    if (kind == GE_END) return expand(x, fr, depth - 1, level + 1);
    int32_t r = GE_ARG(e), save = fr[depth - 1], d = depth;
    if (GE_KIND(g->elem[pos + 1]) == GE_END) d = depth - 1; /* tail call */
    else fr[depth - 1] = pos + 1;
    if (d + 1 > GRAMMAR_MAX_DEPTH) {
        char buf[32];
        fr[depth - 1] = save;
        return loip_fail(LOIP_ERANGE, "grammar: nesting deeper than %d frames (at %s)", GRAMMAR_MAX_DEPTH,
                         rule_name(g, r, buf, sizeof buf));
    }
    int rc = 0;
    for (int32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1] && !rc; a++) {
        fr[d] = g->alt_start[a];
        rc = expand(x, fr, d + 1, level + 1);
    }
    fr[depth - 1] = save;
    return rc;
}

int grammar_expand(const loip_grammar *g, int32_t *frames, int32_t depth, gstacks *out) {
    expander x = {g, out, 0};
    return expand(&x, frames, depth, 0);
}

int grammar_start(const loip_grammar *g, gstacks *out) {
    int32_t fr[GRAMMAR_MAX_DEPTH];
    expander x = {g, out, 0};
    gstacks_reset(out);
    int32_t r = g->n_rules; /* the start: a pseudo frame calling root (see loip_grammar_new) */
    fr[0] = g->alt_start[g->rule_alt[r]];
    return expand(&x, fr, 1, 0);
}

int grammar_advance(const loip_grammar *g, const gstacks *in, uint8_t b, gstacks *out, int32_t *scratch) {
    expander x = {g, out, 0};
    gstacks_reset(out);
    for (int32_t o = 0; o < in->len; o += gstack_next(in->d + o)) {
        const int32_t *p = in->d + o;
        int32_t depth = p[1];
        if (depth == 0) continue;
        int32_t top = p[2 + depth - 1];
        if (!grammar_set_has(g, GE_ARG(g->elem[top]), b)) continue;
        memcpy(scratch, p + 2, (size_t)depth * sizeof *scratch);
        scratch[depth - 1] = top + 1;
        x.work = 0;
        int rc = expand(&x, scratch, depth, 0);
        if (rc) return rc;
    }
    return 0;
}

/* ---- construction ---------------------------------------------------------------------- */

static int bad_ir(const char *what) { return loip_fail(LOIP_EINVAL, "grammar: malformed IR (%s)", what); }

/* Left recursion (a rule reaching itself before consuming a byte) would expand forever. */
static int check_left_recursion(const loip_grammar *g) {
    int32_t R = g->n_rules;
    uint8_t *nullable = calloc((size_t)R + 1, 1);
    uint8_t *state = calloc((size_t)R + 1, 1);
    int32_t *stack = malloc(((size_t)R + 1) * 2 * sizeof *stack);
    if (!nullable || !state || !stack) {
        free(nullable), free(state), free(stack);
        return loip_fail(LOIP_ENOMEM, "grammar: out of memory");
    }
    for (int changed = 1; changed;) { /* nullable rules, to a fixpoint */
        changed = 0;
        for (int32_t r = 0; r < R; r++) {
            if (nullable[r]) continue;
            for (int32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
                int32_t p = g->alt_start[a];
                while (GE_KIND(g->elem[p]) == LOIP_GRAMMAR_REF && nullable[GE_ARG(g->elem[p])]) p++;
                if (GE_KIND(g->elem[p]) == GE_END) { nullable[r] = 1, changed = 1; break; }
            }
        }
    }
    /* depth-first over "r may start with a call of s" (iterative: state 1 on the path, 2 done) */
    int rc = 0;
    for (int32_t r0 = 0; r0 < R && !rc; r0++) {
        if (state[r0]) continue;
        int32_t sp = 0;
        stack[sp++] = r0, stack[sp++] = 0; /* rule, next (alternative, element) cursor encoded below */
        state[r0] = 1;
        /* cursor: index over the rule's leading references, enumerated in order */
        while (sp && !rc) {
            int32_t r = stack[sp - 2], k = stack[sp - 1], seen = 0, next = -1;
            for (int32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1] && next < 0; a++) {
                for (int32_t p = g->alt_start[a]; GE_KIND(g->elem[p]) == LOIP_GRAMMAR_REF; p++) {
                    if (seen++ == k) { next = GE_ARG(g->elem[p]); break; }
                    if (!nullable[GE_ARG(g->elem[p])]) break;
                }
            }
            if (next < 0) { state[r] = 2, sp -= 2; continue; }
            stack[sp - 1] = k + 1;
            if (state[next] == 1) {
                char buf[32];
                rc = loip_fail(LOIP_EINVAL, "grammar: rule %s is left-recursive (it can call itself before "
                               "consuming any input)", rule_name(g, next, buf, sizeof buf));
            } else if (state[next] == 0) {
                state[next] = 1;
                stack[sp++] = next, stack[sp++] = 0;
            }
        }
    }
    free(nullable), free(state), free(stack);
    return rc;
}

LOIP_API int loip_grammar_new(const int32_t *ir, int32_t n_ir, const uint8_t *sets, int32_t n_sets,
                              int32_t root, const char *names, loip_grammar **out) {
    *out = NULL;
    if (!ir || n_ir < 1 || n_sets < 0 || (n_sets && !sets)) return bad_ir("no rules");
    int32_t R = ir[0];
    if (R < 1 || root < 0 || root >= R) return bad_ir("rule count or root");
    /* first pass: sizes and bounds */
    int64_t i = 1, n_alts = 0, n_elem = 0;
    for (int32_t r = 0; r < R; r++) {
        if (i >= n_ir) return bad_ir("truncated");
        int32_t na = ir[i++];
        if (na < 1) return bad_ir("a rule without alternatives");
        for (int32_t a = 0; a < na; a++) {
            if (i >= n_ir) return bad_ir("truncated");
            int32_t ne = ir[i++];
            if (ne < 0 || i + ne > n_ir) return bad_ir("truncated");
            for (int32_t k = 0; k < ne; k++) {
                int32_t e = ir[i + k];
                uint32_t kind = GE_KIND(e);
                if (!((kind == LOIP_GRAMMAR_SET && GE_ARG(e) < n_sets) || (kind == LOIP_GRAMMAR_REF && GE_ARG(e) < R)))
                    return bad_ir("an element names no byte set or rule");
            }
            i += ne, n_alts++, n_elem += ne + 1;
        }
    }
    if (i != n_ir) return bad_ir("trailing words");
    loip_grammar *g = calloc(1, sizeof *g);
    if (!g) return loip_fail(LOIP_ENOMEM, "grammar: out of memory");
    g->refs = 1;
    g->n_rules = R, g->n_sets = n_sets;
    /* one more rule and alternative: the start, root then end (a frame that calls root) */
    g->n_alts = (int32_t)n_alts + 1, g->n_elem = (int32_t)n_elem + 2;
    g->elem = malloc((size_t)g->n_elem * sizeof *g->elem);
    g->alt_start = malloc((size_t)g->n_alts * sizeof *g->alt_start);
    g->rule_alt = malloc(((size_t)R + 2) * sizeof *g->rule_alt);
    g->sets = malloc((size_t)(n_sets ? n_sets : 1) * 32);
    g->names = calloc((size_t)R, sizeof *g->names);
    if (!g->elem || !g->alt_start || !g->rule_alt || !g->sets || !g->names) {
        grammar_release(g);
        return loip_fail(LOIP_ENOMEM, "grammar: out of memory");
    }
    if (n_sets) memcpy(g->sets, sets, (size_t)n_sets * 32);
    int32_t pe = 0, pa = 0;
    i = 1;
    for (int32_t r = 0; r < R; r++) {
        int32_t na = ir[i++];
        g->rule_alt[r] = pa;
        for (int32_t a = 0; a < na; a++) {
            int32_t ne = ir[i++];
            g->alt_start[pa++] = pe;
            for (int32_t k = 0; k < ne; k++) g->elem[pe++] = ir[i++];
            g->elem[pe++] = GE_END;
        }
    }
    g->rule_alt[R] = pa;
    g->alt_start[pa++] = pe;
    g->elem[pe++] = (int32_t)(((uint32_t)LOIP_GRAMMAR_REF << 28) | (uint32_t)root);
    g->elem[pe++] = GE_END;
    g->rule_alt[R + 1] = pa;
    if (names) {
        const char *s = names;
        for (int32_t r = 0; r < R && *s; r++) {
            const char *e = strchr(s, '\n');
            size_t len = e ? (size_t)(e - s) : strlen(s);
            g->names[r] = strndup(s, len);
            s += len + (e ? 1 : 0);
        }
    }
    int rc = check_left_recursion(g);
    if (rc) {
        grammar_release(g);
        return rc;
    }
    *out = g;
    return 0;
}

void grammar_release(loip_grammar *g) {
    if (!g || --g->refs > 0) return;
    grammar_caches_free(g->caches);
    if (g->names)
        for (int32_t r = 0; r < g->n_rules; r++) free(g->names[r]);
    free(g->names), free(g->elem), free(g->alt_start), free(g->rule_alt), free(g->sets);
    free(g);
}

LOIP_API void loip_grammar_free(loip_grammar *g) { grammar_release(g); }
