/* bpe_json.c — the two big sections of a Hugging Face tokenizer.json, model.vocab (an object
 * piece -> id) and model.merges ("a b" strings or ["a", "b"] pairs), read straight from the
 * file's bytes into a loip_bpe. Decoding them into Lua tables cost more than everything else
 * in loading a 128k-token vocabulary (one Lua string per piece and per merge, then copied
 * again into C); here no string is made, and the tables are sized once from the counts.
 *
 * The reader is strict JSON (RFC 8259): no comments, trailing commas, raw control characters
 * in strings or leading zeros; escapes are decoded, \u escapes with their surrogate pairs (a
 * lone surrogate is an error, as in lua-cjson and serde_json). Like lua-cjson it does not
 * check that the bytes of strings are well-formed UTF-8. Every error names the byte offset
 * (from 0) in the whole text, so that it points into the file. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/bpe.h"

enum {
    MAX_DEPTH = 512,      /* deeper nesting is refused rather than overflowing the stack */
    IN_ARENA = 1u << 31,  /* a ref's length bit: its bytes are in the arena, not the text */
};

/* A reader of text[i..end); offsets in errors count from text. */
typedef struct jreader {
    const uint8_t *text;
    size_t i, end;
} jreader;

/* The place of a string's bytes: text + off, or arena + off when len has IN_ARENA. */
typedef struct ref {
    uint32_t off, len;
} ref;

/* What a caller keeps of the entries before adding them: growing arrays. */
typedef struct vec {
    void *v;
    size_t n, cap, elem;
} vec;

static void *vec_push(vec *a) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 4096;
        void *v = realloc(a->v, cap * a->elem);
        if (v == NULL) return NULL;
        a->v = v;
        a->cap = cap;
    }
    return (char *)a->v + a->elem * a->n++;
}

/* Bytes appended to a growing byte array (the decoded strings that had escapes). */
static int arena_put(vec *a, const uint8_t *p, size_t n, uint32_t *off) {
    if (a->n + n > a->cap) {
        size_t cap = a->cap ? a->cap : 1 << 16;
        while (cap < a->n + n) cap *= 2;
        void *v = realloc(a->v, cap);
        if (v == NULL) return -1;
        a->v = v;
        a->cap = cap;
    }
    if (a->n + n > UINT32_MAX / 2) return -1;
    memcpy((uint8_t *)a->v + a->n, p, n);
    *off = (uint32_t)a->n;
    a->n += n;
    return 0;
}

static int syntax(size_t at, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int syntax(size_t at, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return loip_fail(LOIP_EFORMAT, "invalid JSON at byte %zu: %s", at, msg);
}

/* The first byte from i on that ends a run of plain string bytes: '"', '\\' or a control
 * character (end if none); eight bytes at a time where eight are left. */
static inline size_t plain_run(const uint8_t *s, size_t i, size_t end) {
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    while (i + 8 <= end) {
        uint64_t v;
        memcpy(&v, s + i, 8);
        uint64_t q = v ^ (ones * '"'), e = v ^ (ones * '\\');
        /* The high bit of each byte that is 0 (in q, e) or below 0x20 (in v); bytes after
         * the first such one may be flagged wrongly, which does not matter. */
        uint64_t hit = ((q - ones) & ~q) | ((e - ones) & ~e) | ((v - ones * 0x20) & ~v);
        hit &= highs;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        if (hit) return i + (size_t)(__builtin_clzll(hit) >> 3);
#else
        if (hit) return i + (size_t)(__builtin_ctzll(hit) >> 3);
#endif
        i += 8;
    }
    while (i < end && s[i] >= 0x20 && s[i] != '"' && s[i] != '\\') i++;
    return i;
}

static inline void skip_ws(jreader *r) {
    const uint8_t *s = r->text;
    size_t i = r->i;
    while (i < r->end && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) i++;
    r->i = i;
}

/* The next byte after white space, or -1 at the end. */
static inline int peek(jreader *r) {
    skip_ws(r);
    return r->i < r->end ? r->text[r->i] : -1;
}

static int expect(jreader *r, uint8_t c, const char *where) {
    if (peek(r) == c) {
        r->i++;
        return 0;
    }
    if (r->i >= r->end) return syntax(r->i, "the text ends where '%c' was expected %s", c, where);
    return syntax(r->i, "expected '%c' %s", c, where);
}

static int hex4(const uint8_t *p) {
    int v = 0;
    for (int k = 0; k < 4; k++) {
        uint8_t c = p[k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v << 4 | d;
    }
    return v;
}

/* The string whose opening quote is at r->i, checked; r->i moves past it. *p, *n: its bytes,
 * in the text when it has no escapes, else decoded into buf (cap bytes; NULL: only checked).
 * Returns LOIP_ERANGE, without a message, when the decoded bytes would not fit in buf. */
static int read_string(jreader *r, uint8_t *buf, size_t cap, const uint8_t **p, size_t *n) {
    const uint8_t *s = r->text;
    const size_t open = r->i, end = r->end;
    size_t i = plain_run(s, open + 1, end);
    if (i < end && s[i] == '"') {
        *p = s + open + 1;
        *n = i - open - 1;
        r->i = i + 1;
        return 0;
    }
    /* Escapes: decode from the start. */
    size_t w = 0;
    int overflow = buf == NULL;
    for (i = open + 1;;) {
        if (i >= end) return syntax(open, "the string is not closed");
        uint8_t c = s[i];
        if (c == '"') break;
        if (c < 0x20) return syntax(i, "a control character (0x%02X) in a string", c);
        uint8_t out[4];
        int k = 1;
        if (c != '\\') {
            out[0] = c;
            i++;
        } else {
            if (i + 1 >= end) return syntax(open, "the string is not closed");
            switch (s[i + 1]) {
            case '"': out[0] = '"'; break;
            case '\\': out[0] = '\\'; break;
            case '/': out[0] = '/'; break;
            case 'b': out[0] = '\b'; break;
            case 'f': out[0] = '\f'; break;
            case 'n': out[0] = '\n'; break;
            case 'r': out[0] = '\r'; break;
            case 't': out[0] = '\t'; break;
            case 'u': {
                int cp = i + 6 <= end ? hex4(s + i + 2) : -1;
                if (cp < 0) return syntax(i, "\\u is not followed by 4 hex digits");
                if (cp >= 0xDC00 && cp <= 0xDFFF)
                    return syntax(i, "a lone low surrogate \\u%04X", (unsigned)cp);
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    int lo = i + 12 <= end && s[i + 6] == '\\' && s[i + 7] == 'u'
                           ? hex4(s + i + 8) : -1;
                    if (lo < 0xDC00 || lo > 0xDFFF)
                        return syntax(i, "a high surrogate \\u%04X without a low one after it",
                                      (unsigned)cp);
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    i += 6;
                }
                k = loip_utf8_encode((uint32_t)cp, out);
                i += 4;
                break;
            }
            default:
                return syntax(i, "an unknown escape \\%c",
                              s[i + 1] >= 0x20 && s[i + 1] < 0x7F ? s[i + 1] : '?');
            }
            i += 2;
        }
        if (!overflow && w + (size_t)k > cap) overflow = 1;
        if (!overflow) memcpy(buf + w, out, (size_t)k);
        w += (size_t)k;
    }
    r->i = i + 1;
    if (buf == NULL) return 0;
    if (overflow) return LOIP_ERANGE;
    *p = buf;
    *n = w;
    return 0;
}

/* A number, checked against JSON's grammar. *value: its value when it is an integer (no
 * fraction or exponent) of at most 18 digits, with *integer = 1; else *integer = 0. */
static int read_number(jreader *r, int64_t *value, int *integer) {
    const uint8_t *s = r->text;
    size_t i = r->i, end = r->end;
    const size_t start = i;
    int neg = 0, digits = 0;
    int64_t v = 0;
    if (i < end && s[i] == '-') neg = 1, i++;
    if (i >= end || s[i] < '0' || s[i] > '9') return syntax(start, "a malformed number");
    if (s[i] == '0' && i + 1 < end && s[i + 1] >= '0' && s[i + 1] <= '9')
        return syntax(start, "a number with a leading zero");
    while (i < end && s[i] >= '0' && s[i] <= '9') {
        if (digits++ < 18) v = v * 10 + (s[i] - '0');
        i++;
    }
    int whole = digits <= 18;
    if (i < end && s[i] == '.') {
        whole = 0;
        if (++i >= end || s[i] < '0' || s[i] > '9') return syntax(start, "a malformed number");
        while (i < end && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < end && (s[i] == 'e' || s[i] == 'E')) {
        whole = 0;
        i++;
        if (i < end && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= end || s[i] < '0' || s[i] > '9') return syntax(start, "a malformed number");
        while (i < end && s[i] >= '0' && s[i] <= '9') i++;
    }
    r->i = i;
    *integer = whole;
    *value = neg ? -v : v;
    return 0;
}

static int skip_value(jreader *r, int depth);

/* A key of an object and the ':' after it; key (cap bytes) gets it when it fits, else it is
 * set to "" (no key the readers look for is long). */
static int read_key(jreader *r, char *key, size_t cap) {
    if (peek(r) != '"') {
        if (r->i >= r->end) return syntax(r->i, "the text ends inside an object");
        return syntax(r->i, "expected a string key");
    }
    const uint8_t *p = (const uint8_t *)key;
    size_t n = 0;
    int rc = read_string(r, (uint8_t *)key, cap - 1, &p, &n);
    if (rc == LOIP_ERANGE || (rc == 0 && (n >= cap || memchr(p, '\0', n)))) n = 0, rc = 0;
    if (rc != 0) return rc;
    memmove(key, p, n);
    key[n] = '\0';
    return expect(r, ':', "after an object key");
}

/* After an element of an array or object: 1 for ',' and another element, 0 for close. */
static int next_element(jreader *r, uint8_t close, int *more) {
    int c = peek(r);
    if (c == ',') {
        r->i++;
        *more = 1;
        return 0;
    }
    if (c == close) {
        r->i++;
        *more = 0;
        return 0;
    }
    if (c < 0)
        return syntax(r->i, "the text ends inside %s", close == '}' ? "an object" : "an array");
    return syntax(r->i, "expected ',' or '%c'", close);
}

static int skip_value(jreader *r, int depth) {
    int c = peek(r);
    const size_t at = r->i;
    const uint8_t *p;
    size_t n;
    int rc, more;
    if (depth > MAX_DEPTH) return syntax(at, "nested over %d deep", MAX_DEPTH);
    switch (c) {
    case -1:
        return syntax(at, "the text ends where a value was expected");
    case '"':
        return read_string(r, NULL, 0, &p, &n);
    case '{':
        r->i++;
        if (peek(r) == '}') {
            r->i++;
            return 0;
        }
        do {
            char key[8];
            if ((rc = read_key(r, key, sizeof key)) != 0 || (rc = skip_value(r, depth + 1)) != 0 ||
                (rc = next_element(r, '}', &more)) != 0)
                return rc;
        } while (more);
        return 0;
    case '[':
        r->i++;
        if (peek(r) == ']') {
            r->i++;
            return 0;
        }
        do {
            if ((rc = skip_value(r, depth + 1)) != 0 || (rc = next_element(r, ']', &more)) != 0)
                return rc;
        } while (more);
        return 0;
    case 't': case 'f': case 'n': {
        const char *word = c == 't' ? "true" : c == 'f' ? "false" : "null";
        size_t k = strlen(word);
        if (r->end - at < k || memcmp(r->text + at, word, k) != 0)
            return syntax(at, "expected a value");
        r->i += k;
        return 0;
    }
    default: {
        if (c != '-' && (c < '0' || c > '9')) return syntax(at, "expected a value");
        int64_t v;
        int integer;
        return read_number(r, &v, &integer);
    }
    }
}

/* ---- where the sections are ----------------------------------------------------------------- */

static int model_spans(jreader *r, int64_t *spans) {
    r->i++; /* '{' */
    if (peek(r) == '}') {
        r->i++;
        return 0;
    }
    int more, rc;
    do {
        char key[8];
        size_t key_at = (skip_ws(r), r->i);
        if ((rc = read_key(r, key, sizeof key)) != 0) return rc;
        int which = strcmp(key, "vocab") == 0 ? 0 : strcmp(key, "merges") == 0 ? 2 : -1;
        if (which >= 0 && spans[which] >= 0)
            return loip_fail(LOIP_EFORMAT, "model has \"%s\" twice (the second at byte %zu)", key,
                             key_at);
        size_t start = (skip_ws(r), r->i);
        if ((rc = skip_value(r, 2)) != 0) return rc;
        if (which >= 0) {
            spans[which] = (int64_t)start;
            spans[which + 1] = (int64_t)r->i;
        }
        if ((rc = next_element(r, '}', &more)) != 0) return rc;
    } while (more);
    return 0;
}

LOIP_API int loip_bpe_json_spans(const char *text, size_t len, int64_t *spans) {
    if ((text == NULL && len > 0) || spans == NULL)
        return loip_fail(LOIP_EINVAL, "loip_bpe_json_spans: NULL argument");
    for (int k = 0; k < 4; k++) spans[k] = -1;
    jreader r = {(const uint8_t *)text, 0, len};
    int rc, more, seen_model = 0;
    if (peek(&r) != '{') {
        rc = skip_value(&r, 0);
    } else {
        r.i++;
        if (peek(&r) == '}') {
            r.i++;
            rc = 0;
        } else {
            do {
                char key[8];
                size_t key_at = (skip_ws(&r), r.i);
                if ((rc = read_key(&r, key, sizeof key)) != 0) return rc;
                int model = strcmp(key, "model") == 0;
                if (model && seen_model++)
                    return loip_fail(LOIP_EFORMAT, "the file has \"model\" twice (the second at "
                                                   "byte %zu)", key_at);
                rc = model && peek(&r) == '{' ? model_spans(&r, spans) : skip_value(&r, 1);
                if (rc != 0 || (rc = next_element(&r, '}', &more)) != 0) return rc;
            } while (more);
        }
    }
    if (rc != 0) return rc;
    if (peek(&r) >= 0) return syntax(r.i, "more text after the JSON value");
    return 0;
}

/* ---- the vocabulary ------------------------------------------------------------------------- */

typedef struct vocab_entry {
    ref piece;
    int32_t id;
    uint32_t at; /* byte offset of the key, for errors */
} vocab_entry;

/* A string's bytes p[0..n) as a ref: in the text when read_string left them there, else
 * (decoded into buf) copied to the arena. */
static int keep(const jreader *r, const uint8_t *p, size_t n, const uint8_t *buf, vec *arena,
                ref *out) {
    if (p != buf) {
        *out = (ref){(uint32_t)(p - r->text), (uint32_t)n};
        return 0;
    }
    uint32_t off;
    if (arena_put(arena, p, n, &off) != 0) return loip_fail(LOIP_ENOMEM, "bpe: no memory");
    *out = (ref){off, (uint32_t)n | IN_ARENA};
    return 0;
}

static const char *ref_bytes(const jreader *r, const vec *arena, ref x) {
    return (const char *)((x.len & IN_ARENA) ? (const uint8_t *)arena->v : r->text) + x.off;
}

/* The message of the last failure, as a prefix names the place. */
static int wrap(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int wrap(int rc, const char *fmt, ...) {
    char where[128], msg[512];
    snprintf(msg, sizeof msg, "%s", loip_last_error());
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(where, sizeof where, fmt, ap);
    va_end(ap);
    return loip_fail(rc, "%s: %s", where, msg);
}

static int check_range(const char *text, size_t start, size_t end, const char *what) {
    if (text == NULL || start > end)
        return loip_fail(LOIP_EINVAL, "loip_bpe_add_%s_json: NULL text or start > end", what);
    if (end > UINT32_MAX / 2)
        return loip_fail(LOIP_EFORMAT, "%s: over 2 GiB of JSON", what);
    return 0;
}

static int read_vocab(jreader *r, vec *entries, vec *arena, size_t *bytes, int32_t *max_id) {
    uint8_t *buf = malloc(MAX_PIECE);
    if (buf == NULL) return loip_fail(LOIP_ENOMEM, "bpe: no memory");
    int rc = 0, more = 1;
    if (peek(r) != '{') {
        rc = r->i < r->end ? loip_fail(LOIP_EFORMAT, "vocab at byte %zu: expected an object", r->i)
                           : syntax(r->i, "the text ends where the vocab was expected");
        goto out;
    }
    r->i++;
    if (peek(r) == '}') {
        r->i++;
        more = 0;
    }
    while (more) {
        const size_t at = (skip_ws(r), r->i);
        if (r->i >= r->end || r->text[r->i] != '"') {
            rc = r->i < r->end ? syntax(at, "expected a string key") :
                                 syntax(at, "the text ends inside an object");
            goto out;
        }
        const uint8_t *p;
        size_t n;
        rc = read_string(r, buf, MAX_PIECE, &p, &n);
        if (rc == LOIP_ERANGE || (rc == 0 && n > MAX_PIECE))
            rc = loip_fail(LOIP_EFORMAT, "vocab at byte %zu: a piece of over %d bytes", at,
                           MAX_PIECE);
        if (rc != 0 || (rc = expect(r, ':', "after an object key")) != 0) goto out;
        int c = peek(r);
        const size_t value_at = r->i;
        int64_t id;
        int integer = 0;
        if (c == '-' || (c >= '0' && c <= '9')) {
            if ((rc = read_number(r, &id, &integer)) != 0) goto out;
        }
        if (!integer || id < 0 || id >= MAX_ID) {
            if (c != '-' && (c < '0' || c > '9') && (rc = skip_value(r, 2)) != 0) goto out;
            rc = loip_fail(LOIP_EFORMAT, "vocab at byte %zu: \"%.*s\" has id %.*s, not an integer "
                                         "in [0, %d)", value_at, n > 60 ? 60 : (int)n,
                           (const char *)p, r->i - value_at > 20 ? 20 : (int)(r->i - value_at),
                           (const char *)r->text + value_at, MAX_ID);
            goto out;
        }
        vocab_entry *e = vec_push(entries);
        if (e == NULL) {
            rc = loip_fail(LOIP_ENOMEM, "bpe: no memory");
            goto out;
        }
        if ((rc = keep(r, p, n, buf, arena, &e->piece)) != 0) goto out;
        e->id = (int32_t)id;
        e->at = (uint32_t)at;
        *bytes += n;
        if (id > *max_id) *max_id = (int32_t)id;
        if ((rc = next_element(r, '}', &more)) != 0) goto out;
    }
    if (peek(r) >= 0) rc = syntax(r->i, "more text after the vocab");
out:
    free(buf);
    return rc;
}

LOIP_API int loip_bpe_add_vocab_json(loip_bpe *b, const char *text, size_t start, size_t end) {
    if (b == NULL) return loip_fail(LOIP_EINVAL, "loip_bpe_add_vocab_json: NULL argument");
    int rc = check_range(text, start, end, "vocab");
    if (rc != 0) return rc;
    jreader r = {(const uint8_t *)text, start, end};
    vec entries = {NULL, 0, 0, sizeof(vocab_entry)}, arena = {NULL, 0, 0, 1};
    size_t bytes = 0;
    int32_t max_id = -1;
    rc = read_vocab(&r, &entries, &arena, &bytes, &max_id);
    if (rc == 0) rc = loip_bpe_reserve(b, max_id + 1, (int32_t)entries.n, bytes, 0);
    const vocab_entry *e = entries.v;
    for (size_t at = 0; rc == 0 && at < entries.n; at += 256) {
        bpe_token_in in[256];
        size_t k = entries.n - at < 256 ? entries.n - at : 256, bad = 0;
        for (size_t j = 0; j < k; j++)
            in[j] = (bpe_token_in){ref_bytes(&r, &arena, e[at + j].piece),
                                   e[at + j].piece.len & ~IN_ARENA, e[at + j].id};
        rc = loip_bpe_add_token_list(b, in, k, &bad);
        if (rc != 0) rc = wrap(rc, "vocab at byte %u", (unsigned)e[at + bad].at);
    }
    free(entries.v);
    free(arena.v);
    return rc;
}

/* ---- the merges ----------------------------------------------------------------------------- */

typedef struct merge_entry {
    ref left, right;
    uint32_t at; /* byte offset of the element, for errors */
} merge_entry;

/* One element of the merges: "a b" or ["a", "b"]. */
static int read_merge(jreader *r, int32_t index, uint8_t *buf, vec *arena, merge_entry *e) {
    const size_t at = (skip_ws(r), r->i);
    const uint8_t *p;
    size_t n;
    int rc;
    e->at = (uint32_t)at;
    if (r->i < r->end && r->text[r->i] == '"') {
        rc = read_string(r, buf, MAX_PIECE + 1, &p, &n);
        if (rc == LOIP_ERANGE || (rc == 0 && n > MAX_PIECE + 1))
            return loip_fail(LOIP_EFORMAT, "merges[%d] at byte %zu: over-long pieces", (int)index,
                             at);
        if (rc != 0) return rc;
        const uint8_t *sp = memchr(p, ' ', n);
        if (sp == NULL || sp == p || sp == p + n - 1 ||
            memchr(sp + 1, ' ', n - (size_t)(sp + 1 - p)))
            return loip_fail(LOIP_EFORMAT, "merges[%d] at byte %zu: \"%.*s\" is not two pieces "
                                           "separated by one space", (int)index, at,
                             n > 80 ? 80 : (int)n, (const char *)p);
        if ((rc = keep(r, p, n, buf, arena, &e->left)) != 0) return rc;
        size_t k = (size_t)(sp - p);
        e->right = (ref){e->left.off + (uint32_t)k + 1,
                         (e->left.len & IN_ARENA) | (uint32_t)(n - k - 1)};
        e->left.len = (e->left.len & IN_ARENA) | (uint32_t)k;
        return 0;
    }
    if (r->i < r->end && r->text[r->i] == '[') {
        r->i++;
        ref *side[2] = {&e->left, &e->right};
        for (int s = 0; s < 2; s++) {
            if (s == 1 && peek(r) != ',') goto not_pair;
            if (s == 1) r->i++;
            if (peek(r) != '"') goto not_pair;
            rc = read_string(r, buf, MAX_PIECE, &p, &n);
            if (rc == LOIP_ERANGE)
                return loip_fail(LOIP_EFORMAT, "merges[%d] at byte %zu: over-long pieces",
                                 (int)index, at);
            if (rc != 0 || (rc = keep(r, p, n, buf, arena, side[s])) != 0) return rc;
        }
        if (peek(r) != ']') goto not_pair;
        r->i++;
        return 0;
    not_pair: /* a syntax error first, if the element has one */
        r->i = at;
        if ((rc = skip_value(r, 2)) != 0) return rc;
        return loip_fail(LOIP_EFORMAT, "merges[%d] at byte %zu: not a pair of strings",
                         (int)index, at);
    }
    if ((rc = skip_value(r, 2)) != 0) return rc;
    return loip_fail(LOIP_EFORMAT, "merges[%d] at byte %zu: not a string \"a b\" or a pair [\"a\", "
                                   "\"b\"]", (int)index, at);
}

static int read_merges(jreader *r, vec *entries, vec *arena) {
    uint8_t *buf = malloc(MAX_PIECE + 1);
    if (buf == NULL) return loip_fail(LOIP_ENOMEM, "bpe: no memory");
    int rc = 0, more = 1;
    if (peek(r) != '[') {
        rc = r->i < r->end ? loip_fail(LOIP_EFORMAT, "merges at byte %zu: expected an array", r->i)
                           : syntax(r->i, "the text ends where the merges were expected");
        goto out;
    }
    r->i++;
    if (peek(r) == ']') {
        r->i++;
        more = 0;
    }
    while (more) {
        if (entries->n >= INT32_MAX) {
            rc = loip_fail(LOIP_EFORMAT, "merges: too many");
            goto out;
        }
        merge_entry *e = vec_push(entries);
        if (e == NULL) {
            rc = loip_fail(LOIP_ENOMEM, "bpe: no memory");
            goto out;
        }
        if ((rc = read_merge(r, (int32_t)entries->n, buf, arena, e)) != 0 ||
            (rc = next_element(r, ']', &more)) != 0)
            goto out;
    }
    if (peek(r) >= 0) rc = syntax(r->i, "more text after the merges");
out:
    free(buf);
    return rc;
}

LOIP_API int loip_bpe_add_merges_json(loip_bpe *b, const char *text, size_t start, size_t end) {
    if (b == NULL) return loip_fail(LOIP_EINVAL, "loip_bpe_add_merges_json: NULL argument");
    int rc = check_range(text, start, end, "merges");
    if (rc != 0) return rc;
    jreader r = {(const uint8_t *)text, start, end};
    vec entries = {NULL, 0, 0, sizeof(merge_entry)}, arena = {NULL, 0, 0, 1};
    rc = read_merges(&r, &entries, &arena);
    if (rc == 0) rc = loip_bpe_reserve(b, 0, 0, 0, (int32_t)entries.n);
    const merge_entry *e = entries.v;
    for (size_t at = 0; rc == 0 && at < entries.n; at += 256) {
        bpe_merge_in in[256];
        size_t k = entries.n - at < 256 ? entries.n - at : 256, bad = 0;
        for (size_t j = 0; j < k; j++)
            in[j] = (bpe_merge_in){ref_bytes(&r, &arena, e[at + j].left),
                                   ref_bytes(&r, &arena, e[at + j].right),
                                   e[at + j].left.len & ~IN_ARENA, e[at + j].right.len & ~IN_ARENA};
        rc = loip_bpe_add_merge_list(b, in, k, &bad);
        if (rc != 0)
            rc = wrap(rc, "merges[%d] at byte %u", (int)(at + bad) + 1, (unsigned)e[at + bad].at);
    }
    free(entries.v);
    free(arena.v);
    return rc;
}
