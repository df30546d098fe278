/* pretok.c — pre-tokenization: the text is cut into chunks by a sequence of regex splits,
 * each applied to every chunk of the one before, as Hugging Face's Split pre-tokenizer does
 * (tokenizers' NormalizedString::split with a SplitDelimiterBehavior). The models' own
 * patterns run under PCRE2:
 *   - PCRE2_UTF | PCRE2_UCP: \s, \w, \d and [[:classes:]] are Unicode-aware as they are in
 *     Oniguruma (HF) and Python's regex (tiktoken). One known difference: PCRE2's \s is
 *     \p{Z} plus \t\n\v\f\r and leaves out U+0085 (NEL), which Unicode's White_Space has;
 *   - PCRE2_MATCH_INVALID_UTF: bytes that are not well-formed UTF-8 match nothing, so they
 *     end up in the chunks between matches (byte-level BPE then encodes them byte by byte);
 *   - pcre2_jit_compile when PCRE2 has the JIT (the interpreter otherwise).
 * Each chunk is its own subject, so lookarounds do not see past it (as in HF).
 *
 * Empty matches are skipped (the iteration moves on by one character): HF drops the empty
 * splits they would make, and none of the supported models' patterns can match empty. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

enum { MAX_STEPS = 16 };

typedef struct step {
    pcre2_code *code;
    pcre2_match_data *md;
    int32_t behavior, invert;
} step;

/* A piece of a chunk: [start, end) and whether it counts as a match (after invert). */
typedef struct piece {
    int32_t start, end, match;
} piece;

struct loip_pretok {
    int32_t n;
    step steps[MAX_STEPS];
    piece *pieces; /* scratch for one chunk (cap_pieces) */
    int32_t cap_pieces;
    loip_spans tmp[2]; /* chunks between steps */
};

/* ---- spans -------------------------------------------------------------------------------- */

int loip_spans_push(loip_spans *s, int32_t start, int32_t end) {
    if (s->n == s->cap) {
        int32_t cap = s->cap ? 2 * s->cap : 256;
        int32_t *v = realloc(s->v, (size_t)cap * 2 * sizeof *v);
        if (v == NULL) return loip_fail(LOIP_ENOMEM, "pre-tokenizer: no memory for %d chunks", cap);
        s->v = v, s->cap = cap;
    }
    s->v[2 * s->n] = start;
    s->v[2 * s->n + 1] = end;
    s->n++;
    return 0;
}

void loip_spans_release(loip_spans *s) {
    free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
}

/* ---- new / free --------------------------------------------------------------------------- */

LOIP_API int loip_pretok_new(loip_pretok **out) {
    if (out == NULL) return loip_fail(LOIP_EINVAL, "loip_pretok_new: out is NULL");
    *out = calloc(1, sizeof(loip_pretok));
    if (*out == NULL) return loip_fail(LOIP_ENOMEM, "loip_pretok_new: no memory");
    return 0;
}

LOIP_API void loip_pretok_free(loip_pretok *p) {
    if (p == NULL) return;
    for (int32_t i = 0; i < p->n; i++) {
        pcre2_match_data_free(p->steps[i].md);
        pcre2_code_free(p->steps[i].code);
    }
    free(p->pieces);
    loip_spans_release(&p->tmp[0]);
    loip_spans_release(&p->tmp[1]);
    free(p);
}


LOIP_API int loip_pretok_add_split(loip_pretok *p, const char *pattern, size_t len,
                                   int32_t behavior, int32_t flags) {
    if (p == NULL || (pattern == NULL && len > 0))
        return loip_fail(LOIP_EINVAL, "loip_pretok_add_split: NULL argument");
    if (behavior < LOIP_SPLIT_REMOVED || behavior > LOIP_SPLIT_CONTIGUOUS)
        return loip_fail(LOIP_EINVAL, "pre-tokenizer: unknown split behavior %d", (int)behavior);
    if (p->n == MAX_STEPS)
        return loip_fail(LOIP_EINVAL, "pre-tokenizer: more than %d split steps", MAX_STEPS);
    if (len == 0) return loip_fail(LOIP_EINVAL, "pre-tokenizer: empty split pattern");
    uint32_t opts = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF;
    /* PCRE2 refuses UCP with LITERAL, where it means nothing anyway. */
    opts |= (flags & LOIP_SPLIT_LITERAL) ? PCRE2_LITERAL : PCRE2_UCP;
    int err = 0;
    PCRE2_SIZE erroff = 0;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)pattern, len, opts, &err, &erroff, NULL);
    if (code == NULL) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return loip_fail(LOIP_EINVAL, "pre-tokenizer regex does not compile: %s at offset %zu "
                                      "of /%.*s/", (const char *)msg, (size_t)erroff,
                         len > 200 ? 200 : (int)len, pattern);
    }
    /* Without JIT support (or where it fails, e.g. no executable memory) the interpreter
     * gives the same matches, slower. */
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, NULL);
    if (md == NULL) {
        pcre2_code_free(code);
        return loip_fail(LOIP_ENOMEM, "pre-tokenizer: no memory for match data");
    }
    p->steps[p->n++] = (step){code, md, behavior, (flags & LOIP_SPLIT_INVERT) ? 1 : 0};
    return 0;
}

/* ---- splitting ---------------------------------------------------------------------------- */

static int push_piece(loip_pretok *p, int32_t *n, int32_t start, int32_t end, int32_t match) {
    if (*n == p->cap_pieces) {
        int32_t cap = p->cap_pieces ? 2 * p->cap_pieces : 256;
        piece *v = realloc(p->pieces, (size_t)cap * sizeof *v);
        if (v == NULL) return loip_fail(LOIP_ENOMEM, "pre-tokenizer: no memory");
        p->pieces = v, p->cap_pieces = cap;
    }
    p->pieces[(*n)++] = (piece){start, end, match};
    return 0;
}

/* Matches and the text between them, in order, as HF's Pattern::find_matches lists them. */
static int find_pieces(loip_pretok *p, const step *st, const char *text, int32_t start,
                       int32_t end, int32_t *n_pieces) {
    const PCRE2_SPTR subject = (PCRE2_SPTR)(text + start);
    const PCRE2_SIZE len = (PCRE2_SIZE)(end - start);
    PCRE2_SIZE at = 0, prev = 0;
    int32_t n = 0;
    while (at < len) {
        int rc = pcre2_match(st->code, subject, len, at, 0, st->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return loip_fail(LOIP_EINVAL, "pre-tokenizer regex failed at byte %d: %s",
                             (int)(start + (int32_t)at), (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
        PCRE2_SIZE ms = ov[0], me = ov[1];
        if (me <= ms) { /* empty match: move on by one character */
            uint32_t cp;
            int k = loip_utf8_decode(subject + ms, len - ms, &cp);
            at = ms + (k > 0 ? (PCRE2_SIZE)k : 1);
            continue;
        }
        int e = 0;
        if (ms > prev) e = push_piece(p, &n, start + (int32_t)prev, start + (int32_t)ms, 0);
        if (e == 0) e = push_piece(p, &n, start + (int32_t)ms, start + (int32_t)me, 1);
        if (e != 0) return e;
        prev = at = me;
    }
    if (prev < len) {
        int e = push_piece(p, &n, start + (int32_t)prev, end, 0);
        if (e != 0) return e;
    }
    if (st->invert)
        for (int32_t i = 0; i < n; i++) p->pieces[i].match = !p->pieces[i].match;
    *n_pieces = n;
    return 0;
}

/* One step over one chunk: the behavior's folds, as in HF's NormalizedString::split. */
static int split_chunk(loip_pretok *p, const step *st, const char *text, int32_t start,
                       int32_t end, loip_spans *out) {
    int32_t n = 0;
    int rc = find_pieces(p, st, text, start, end, &n);
    if (rc != 0) return rc;
    piece *v = p->pieces;
    int32_t w = 0; /* folded pieces, written over v[0..w) */
    switch (st->behavior) {
    case LOIP_SPLIT_REMOVED:
        for (int32_t i = 0; i < n; i++)
            if (!v[i].match) v[w++] = v[i];
        break;
    case LOIP_SPLIT_ISOLATED:
        w = n;
        break;
    case LOIP_SPLIT_MERGED_WITH_PREVIOUS: {
        int prev_match = 0;
        for (int32_t i = 0; i < n; i++) {
            piece x = v[i];
            if (x.match && !prev_match && w > 0) v[w - 1].end = x.end;
            else v[w++] = x;
            prev_match = x.match;
        }
        break;
    }
    case LOIP_SPLIT_MERGED_WITH_NEXT: {
        /* HF folds from the end: a match joins the piece after it unless that one is a
         * match too. Folded here from the end into v[n-1], v[n-2], ... then moved down. */
        int next_match = 0;
        int32_t r = n; /* folded pieces are v[r..n) */
        for (int32_t i = n - 1; i >= 0; i--) {
            piece x = v[i];
            if (x.match && !next_match && r < n) v[r].start = x.start;
            else v[--r] = x;
            next_match = x.match;
        }
        for (int32_t i = r; i < n; i++) v[w++] = v[i];
        break;
    }
    case LOIP_SPLIT_CONTIGUOUS: {
        int prev_match = 0;
        for (int32_t i = 0; i < n; i++) {
            piece x = v[i];
            if (x.match == prev_match && w > 0) v[w - 1].end = x.end;
            else v[w++] = x;
            prev_match = x.match;
        }
        break;
    }
    }
    for (int32_t i = 0; i < w; i++) {
        if (v[i].end <= v[i].start) continue;
        rc = loip_spans_push(out, v[i].start, v[i].end);
        if (rc != 0) return rc;
    }
    return 0;
}

int loip_pretok_spans(loip_pretok *p, const char *text, size_t len, loip_spans *out) {
    if (len > (size_t)INT32_MAX)
        return loip_fail(LOIP_EINVAL, "pre-tokenizer: text of %zu bytes is too long", len);
    if (len == 0) return 0;
    if (p == NULL || p->n == 0) return loip_spans_push(out, 0, (int32_t)len);
    /* Step 0 reads the whole text; step i reads the chunks of step i-1; the last step writes
     * to out. */
    loip_spans *src = NULL;
    for (int32_t s = 0; s < p->n; s++) {
        loip_spans *dst = s == p->n - 1 ? out : &p->tmp[s & 1];
        if (dst != out) dst->n = 0;
        int rc = 0;
        if (src == NULL) {
            rc = split_chunk(p, &p->steps[s], text, 0, (int32_t)len, dst);
        } else {
            for (int32_t i = 0; i < src->n && rc == 0; i++)
                rc = split_chunk(p, &p->steps[s], text, src->v[2 * i], src->v[2 * i + 1], dst);
        }
        if (rc != 0) return rc;
        src = dst;
    }
    return 0;
}

LOIP_API int loip_pretok_split(loip_pretok *p, const char *text, size_t len, int32_t *bounds,
                               int32_t cap, int32_t *n_out) {
    if (p == NULL || n_out == NULL || (text == NULL && len > 0) || (bounds == NULL && cap > 0))
        return loip_fail(LOIP_EINVAL, "loip_pretok_split: NULL argument");
    *n_out = 0;
    loip_spans s = {0};
    int rc = loip_pretok_spans(p, text, len, &s);
    if (rc == 0) {
        *n_out = s.n;
        if (s.n > cap) rc = loip_fail(LOIP_ERANGE, "loip_pretok_split: %d chunks, cap is %d",
                                      (int)s.n, (int)cap);
        else if (s.n > 0) memcpy(bounds, s.v, (size_t)s.n * 2 * sizeof *bounds);
    }
    loip_spans_release(&s);
    return rc;
}
