/* test_scoredbpe.c — loip_scoredbpe_* against references the project did not compute:
 *   - stories260K/reference/encode.json: run.c's encode() on 18 strings with tok512.bin;
 *   - llama2-tokenizer/reference/sentencepiece_reference.json: SentencePiece on 57 strings,
 *     asserted where the file says run.c agrees with it (runc_encode_matches);
 * and against a plain O(n^2) re-statement of run.c's encode() (sorted vocabulary, bsearch,
 * rescan after every merge) on random strings, which checks the heap merge's tie-breaking.
 * Malformed files are written to a temporary directory.
 *
 * The data (models/stories260K, models/llama2-tokenizer) ships in the repository: <repo> =
 * argv[1], else the repository this source file sits in, else the current directory; else
 * $LOIP_SHARED_DIR, a folder laid out the same way. Without it the synthetic checks still run,
 * then the test exits 77 (skip) saying so.
 * Exit 0 pass, 1 fail, 77 skip. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "loip.h"
#include "check.h"


static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)sz + 1);
    if (fread(b, 1, (size_t)sz, f) != (size_t)sz) sz = 0;
    b[sz] = 0;
    fclose(f);
    if (n) *n = (size_t)sz;
    return b;
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* ---- the naive reference: run.c's encode() restated, O(n^2) -------------------------------- */

typedef struct {
    const char *str;
    int id;
} tokidx;

typedef struct {
    int n, longest;
    char **vocab;   /* C strings, as run.c holds them */
    float *score;
    tokidx *sorted; /* by strcmp, for bsearch */
} naive;

static int cmp_tok(const void *a, const void *b) {
    return strcmp(((const tokidx *)a)->str, ((const tokidx *)b)->str);
}

static int naive_load(const char *path, naive *t) {
    size_t size, off = 4;
    char *d = slurp(path, &size);
    if (!d) return -1;
    t->n = t->longest = 0;
    t->vocab = malloc((size / 8 + 1) * sizeof(char *));
    t->score = malloc((size / 8 + 1) * sizeof(float));
    t->sorted = malloc((size / 8 + 1) * sizeof(tokidx));
    while (off + 8 <= size) {
        int32_t len, i = t->n++;
        memcpy(&t->score[i], d + off, 4);
        memcpy(&len, d + off + 4, 4);
        t->vocab[i] = strndup(d + off + 8, (size_t)len);
        if (len > t->longest) t->longest = len;
        t->sorted[i] = (tokidx){t->vocab[i], i};
        off += 8 + (size_t)len;
    }
    qsort(t->sorted, (size_t)t->n, sizeof(tokidx), cmp_tok);
    free(d);
    return 0;
}

static void naive_free(naive *t) {
    for (int i = 0; i < t->n; i++) free(t->vocab[i]);
    free(t->vocab);
    free(t->score);
    free(t->sorted);
}

static int naive_lookup(const naive *t, const char *s) {
    tokidx key = {s, 0};
    tokidx *r = bsearch(&key, t->sorted, t->n, sizeof(tokidx), cmp_tok);
    return r ? r->id : -1;
}

/* text is NUL-terminated; out has room for strlen(text) + 3. */
static int naive_encode(const naive *t, const char *text, int bos, int eos, int32_t *out) {
    char *buf = malloc(2 * (size_t)t->longest + 8);
    size_t blen = 0;
    int n = 0;
    if (bos) out[n++] = 1;
    if (text[0] != 0) out[n++] = naive_lookup(t, " ");
    for (const char *c = text; *c; c++) {
        if ((*c & 0xC0) != 0x80) blen = 0;
        buf[blen++] = *c;
        buf[blen] = 0;
        if ((c[1] & 0xC0) == 0x80 && blen < 4) continue;
        int id = naive_lookup(t, buf);
        if (id != -1) {
            out[n++] = id;
        } else {
            for (size_t i = 0; i < blen; i++) out[n++] = (unsigned char)buf[i] + 3;
        }
        blen = 0;
    }
    for (;;) {
        float best = -1e10f;
        int best_id = -1, best_i = -1;
        for (int i = 0; i < n - 1; i++) {
            snprintf(buf, 2 * (size_t)t->longest + 8, "%s%s", t->vocab[out[i]], t->vocab[out[i + 1]]);
            int id = naive_lookup(t, buf);
            if (id != -1 && t->score[id] > best) {
                best = t->score[id];
                best_id = id;
                best_i = i;
            }
        }
        if (best_i < 0) break;
        out[best_i] = best_id;
        memmove(out + best_i + 1, out + best_i + 2, (size_t)(n - best_i - 2) * sizeof(int32_t));
        n--;
    }
    if (eos) out[n++] = 2;
    free(buf);
    return n;
}

/* ---- helpers ------------------------------------------------------------------------------ */

static loip_scoredbpe *open_tok(const char *path, int32_t vocab) {
    loip_scoredbpe *t = NULL;
    int rc = loip_scoredbpe_open(path, vocab, &t);
    if (rc != 0) {
        fprintf(stderr, "loip_scoredbpe_open(%s): %d %s\n", path, rc, loip_last_error());
        return NULL;
    }
    return t;
}

/* Encodes text[0..len) and returns the count (-1 on error); out has room for len + 3. */
static int enc(const loip_scoredbpe *t, const char *text, size_t len, int bos, int eos,
               int32_t *out) {
    int32_t n = -1;
    int rc = loip_scoredbpe_encode(t, text, len, bos, eos, out, (int32_t)len + 3, &n);
    if (rc != 0) {
        fprintf(stderr, "encode: %d %s\n", rc, loip_last_error());
        return -1;
    }
    return n;
}

static int same(const int32_t *a, int na, const int32_t *b, int nb) {
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof(int32_t)) == 0);
}

static void print_ids(const char *what, const int32_t *a, int n) {
    fprintf(stderr, "  %s (%d):", what, n);
    for (int i = 0; i < n; i++) fprintf(stderr, " %d", a[i]);
    fprintf(stderr, "\n");
}

/* Random text from fragments chosen to exercise merges, ties (Llama 2's 16 whitespace pieces
 * all score -1e9, so runs of spaces are decided by the leftmost rule), UTF-8 and broken UTF-8 (stray continuation bytes, a lead byte without its tail, 0xFF). No NUL: run.c
 * would stop there. */
static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static size_t random_text(char *out, size_t max, const char *const *frag, int nfrag) {
    size_t n = 0;
    size_t want = rnd(4) == 0 ? rnd((uint32_t)max) : rnd(60);
    while (n < want) {
        const char *f = frag[rnd((uint32_t)nfrag)];
        size_t l = strlen(f);
        if (n + l >= max) break;
        memcpy(out + n, f, l);
        n += l;
    }
    out[n] = 0;
    return n;
}

static const char *const natural[] = {
    "the", " the", "Once", " upon", " a", " time", "Hello", " world", ",", ".", "!", "?",
    " ", "  ", "   ", "\n", "\n\n", "\t", "0", "1", "23", "456", "7890", "'s", "\"", "Lily",
    " Tom", " park", "é", "ï", "½", "ü", "日本語", "😀", "🦙", "\xe2\x80\x8d", "\xc2\xa0",
    "\x80", "\xbf\xbf", "\xc3", "\xe6\x97", "\xff", "\xf0\x9f\x98\x80\x80\x80", "a", "b", "e",
    "er", "ing", " and", "The", "[INST]", "<s>", "\r\n", "-", "=", "...", "xyz", "qu",
};

static const char *const abc[] = {
    "a", "b", "c", " ", "aa", "ab", "abc", "cab", "  ", "\xc3", "\xf0\x9f\x98\x80\x80",
    "\x80\x80\x80\x80\x80",
};

/* Encodes random strings with both encoders; returns the number that agree. */
static int agree_random(const char *path, const loip_scoredbpe *t, const char *const *frag,
                        int nfrag, int count, size_t max) {
    naive nv;
    if (naive_load(path, &nv) != 0) return 0;
    char *text = malloc(max + 1);
    int32_t *a = malloc((max + 3) * sizeof(int32_t)), *b = malloc((max + 3) * sizeof(int32_t));
    int agree = 0, shown = 0;
    for (int r = 0; r < count; r++) {
        size_t len = random_text(text, max, frag, nfrag);
        int bos = rnd(2), eos = rnd(2);
        int na = enc(t, text, len, bos, eos, a);
        int nb = naive_encode(&nv, text, bos, eos, b);
        if (same(a, na, b, nb)) {
            agree++;
        } else if (shown++ < 3) {
            fprintf(stderr, "  %s: mismatch on \"%s\"\n", path, text);
            print_ids("heap", a, na);
            print_ids("naive", b, nb);
        }
    }
    free(text);
    free(a);
    free(b);
    naive_free(&nv);
    return agree;
}

/* ---- minimal JSON: the strings and integer arrays of the reference files ------------------ */

static const char *jstring(const char *p, char *out, size_t *len) {
    size_t n = 0;
    p++; /* opening quote */
    while (*p && *p != '"') {
        unsigned c = (unsigned char)*p++;
        if (c == '\\') {
            c = (unsigned char)*p++;
            if (c == 'n') c = '\n';
            else if (c == 't') c = '\t';
            else if (c == 'r') c = '\r';
            else if (c == 'u' || c == 'b' || c == 'f') { /* the files hold UTF-8 as is */
                fprintf(stderr, "FAIL: \\%c escape in a reference file, not supported\n", c);
                n_fail++;
            } /* else \" \\ \/ stand for themselves */
        }
        out[n++] = (char)c;
    }
    out[n] = 0;
    *len = n;
    return *p ? p + 1 : p;
}

/* The next case at or after *pos: its text, ids and runc_encode_matches (1, 0, or -1 for
 * null or absent). Returns 0 when there is none. */
static int next_case(const char **pos, char *text, size_t *len, int32_t *ids, int *n_ids,
                     int *matches) {
    const char *p = strstr(*pos, "\"text\":");
    if (!p) return 0;
    p = strchr(p + 7, '"');
    p = jstring(p, text, len);
    const char *end = strstr(p, "\"text\":");
    if (!end) end = p + strlen(p);
    const char *q = strstr(p, "\"ids\":");
    *n_ids = 0;
    if (q && q < end) {
        q = strchr(q, '[') + 1;
        for (;;) {
            while (*q == ' ' || *q == '\n' || *q == ',') q++;
            if (*q == ']' || !*q) break;
            ids[(*n_ids)++] = (int32_t)strtol(q, (char **)&q, 10);
        }
    }
    *matches = -1;
    const char *m = strstr(p, "\"runc_encode_matches\":");
    if (m && m < end) {
        m += 22;
        while (*m == ' ') m++;
        *matches = strncmp(m, "true", 4) == 0 ? 1 : strncmp(m, "false", 5) == 0 ? 0 : -1;
    }
    *pos = end;
    return 1;
}

/* ---- checks against the shared references ----------------------------------------------- */

/* Every case of a reference file must match, except those marked runc_encode_matches
 * false (counted, not asserted). sp: the ids are SentencePiece's, without run.c's BOS. */
static void check_reference(const loip_scoredbpe *t, const char *ref, int sp, int want_cases) {
    char *json = slurp(ref, NULL);
    CHECK(json != NULL, "cannot read %s", ref);
    if (!json) return;
    const char *pos = json;
    char *text = malloc(65536);
    size_t len;
    int32_t want[4097], *got = malloc(sizeof(int32_t) * 65539);
    int nw, m, cases = 0, asserted = 0, ok = 0, equal = 0;
    while (next_case(&pos, text, &len, want + sp, &nw, &m)) {
        cases++;
        want[0] = 1; /* run.c's form: BOS first; the empty string is BOS alone */
        nw += sp;
        int ng = enc(t, text, len, 1, 0, got);
        int eq = same(got, ng, want, nw);
        equal += eq;
        if (m == 0) continue; /* the file says run.c's encode() differs here */
        asserted++;
        ok += eq;
        if (!eq) {
            fprintf(stderr, "  %s case %d \"%s\"\n", ref, cases, text);
            print_ids("got", got, ng);
            print_ids("want", want, nw);
        }
    }
    CHECK(cases == want_cases, "%s: %d cases, expected %d", ref, cases, want_cases);
    CHECK(ok == asserted, "%s: %d of %d asserted cases match", ref, ok, asserted);
    printf("%s: %d/%d cases equal; %d/%d asserted cases pass\n", strrchr(ref, '/') + 1, equal,
           cases, ok, asserted);
    free(text);
    free(got);
    free(json);
}

static void test_stories(const char *shared) {
    char path[4096], ref[4096];
    snprintf(path, sizeof path, "%s/models/stories260K/tok512.bin", shared);
    snprintf(ref, sizeof ref, "%s/models/stories260K/reference/encode.json", shared);
    loip_scoredbpe *t = open_tok(path, 512);
    CHECK(t != NULL, "cannot open %s", path);
    if (!t) return;
    CHECK(loip_scoredbpe_size(t) == 512, "tok512 size %d", loip_scoredbpe_size(t));
    const char *piece;
    int32_t plen;
    float sc;
    CHECK(loip_scoredbpe_piece(t, 1, &piece, &plen, &sc) == 0 && plen == 5 &&
              strcmp(piece, "\n<s>\n") == 0, "piece 1 should be \"\\n<s>\\n\"");
    CHECK(loip_scoredbpe_piece(t, 410, &piece, &plen, &sc) == 0 && strcmp(piece, " ") == 0,
          "piece 410 should be \" \"");
    CHECK(loip_scoredbpe_piece(t, 512, &piece, &plen, &sc) == LOIP_EINVAL, "id 512 accepted");

    check_reference(t, ref, 0, 18);
    int agree = agree_random(path, t, natural, sizeof natural / sizeof *natural, 400, 400);
    CHECK(agree == 400, "tok512: heap merge agrees with the naive run.c loop on %d/400", agree);
    printf("tok512 random strings: %d/400 agree with the naive run.c merge\n", agree);

    /* vocab_size <= 0 reads to the end; a smaller vocab_size reads a prefix. */
    loip_scoredbpe *all = open_tok(path, 0), *part = open_tok(path, 100);
    CHECK(all && loip_scoredbpe_size(all) == 512, "vocab_size 0 should read 512 tokens");
    CHECK(part && loip_scoredbpe_size(part) == 100, "vocab_size 100 should read 100 tokens");
    loip_scoredbpe_free(all);
    loip_scoredbpe_free(part);

    /* Capacity: the exact count fits, one less is ERANGE with the count in *n_out. */
    int32_t ids[64], n = -1;
    const char *s = "Once upon a time";
    CHECK(loip_scoredbpe_encode(t, s, strlen(s), 1, 1, ids, 6, &n) == 0 && n == 6 &&
              ids[0] == 1 && ids[1] == 403 && ids[5] == 2, "bos+eos encode of \"%s\"", s);
    CHECK(loip_scoredbpe_encode(t, s, strlen(s), 1, 1, ids, 5, &n) == LOIP_ERANGE && n == 6 &&
              strstr(loip_last_error(), "6") != NULL, "cap 5 should be ERANGE needing 6");
    CHECK(loip_scoredbpe_encode(t, "", 0, 0, 0, NULL, 0, &n) == 0 && n == 0, "empty, no bos");
    CHECK(loip_scoredbpe_encode(t, NULL, 0, 1, 1, ids, 2, &n) == 0 && n == 2 && ids[0] == 1 &&
              ids[1] == 2, "NULL empty text with bos+eos");
    CHECK(loip_scoredbpe_encode(t, NULL, 3, 1, 0, ids, 8, &n) == LOIP_EINVAL, "NULL text");
    /* A NUL byte is byte-fallback id 3, not the end of the text. */
    n = enc(t, "a\0a", 3, 0, 0, ids);
    CHECK(n == 3 && ids[0] == 261 && ids[1] == 3 &&
              loip_scoredbpe_piece(t, ids[2], &piece, &plen, &sc) == 0 && strcmp(piece, "a") == 0,
          "\"a\\0a\" should be [\" a\" 3 \"a\"]");
    /* The len + 3 bound is reached: bos, prefix, every byte a token, eos. */
    char fb[200];
    for (int i = 0; i < 200; i++) fb[i] = (char)(0x80 + i % 64); /* stray continuation bytes */
    int32_t big[203];
    n = -1;
    CHECK(loip_scoredbpe_encode(t, fb, 200, 1, 1, big, 203, &n) == 0 && n == 203,
          "200 fallback bytes: n %d", n);
    loip_scoredbpe_free(t);
}

static void test_llama2(const char *shared) {
    char path[4096], ref[4096];
    snprintf(path, sizeof path, "%s/models/llama2-tokenizer/tokenizer.bin", shared);
    snprintf(ref, sizeof ref, "%s/models/llama2-tokenizer/reference/sentencepiece_reference.json",
             shared);
    loip_scoredbpe *t = open_tok(path, 32000);
    CHECK(t != NULL, "cannot open %s", path);
    if (!t) return;
    check_reference(t, ref, 1, 57);
    int agree = agree_random(path, t, natural, sizeof natural / sizeof *natural, 300, 400);
    CHECK(agree == 300, "llama2: heap merge agrees with the naive run.c loop on %d/300", agree);
    printf("llama2 random strings: %d/300 agree with the naive run.c merge\n", agree);
    loip_scoredbpe_free(t);
}

/* ---- synthetic vocabularies and malformed files ------------------------------------------- */

typedef struct {
    const char *piece;
    float score;
} entry;

/* Writes a tokenizer.bin: <unk>, BOS, EOS, the 256 byte tokens, then extra[]. */
static void write_vocab(const char *path, uint32_t max_len, const entry *extra, int n_extra) {
    FILE *f = fopen(path, "wb");
    fwrite(&max_len, 4, 1, f);
    for (int i = 0; i < 259 + n_extra; i++) {
        char b[16];
        const char *p = b;
        float sc = 0.0f;
        if (i == 0) p = "<unk>";
        else if (i == 1) p = "\n<s>\n";
        else if (i == 2) p = "\n</s>\n";
        else if (i < 259) snprintf(b, sizeof b, "<0x%02X>", i - 3);
        else p = extra[i - 259].piece, sc = extra[i - 259].score;
        int32_t len = (int32_t)strlen(p);
        fwrite(&sc, 4, 1, f);
        fwrite(&len, 4, 1, f);
        fwrite(p, 1, (size_t)len, f);
    }
    fclose(f);
}

static void test_synthetic(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/abc.bin", dir);
    /* Singles, then every string over {a, b, c} of length 2..4 with scores from a small set
     * (ties everywhere, -0.0 beside 0.0), a few never-merged scores, and a duplicated piece. */
    entry e[200];
    static char store[200][8];
    int n = 0;
    /* The 4-byte emoji is one code point piece: a continuation byte after it must start a
     * new group, as run.c stops a code point at 4 bytes. */
    const char *singles[] = {" ", "a", "b", "c", "\xf0\x9f\x98\x80"};
    for (int i = 0; i < 5; i++) e[n++] = (entry){singles[i], 0.0f};
    const float scores[] = {-1.0f, -2.0f, -0.0f, 0.0f, -3.0f, -1e10f, NAN, -INFINITY};
    uint64_t r = 7;
    for (int l = 2; l <= 4; l++) {
        int total = 1;
        for (int k = 0; k < l; k++) total *= 3;
        for (int v = 0; v < total; v++) {
            int x = v;
            for (int k = 0; k < l; k++, x /= 3) store[n][k] = "abc"[x % 3];
            store[n][l] = 0;
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            e[n] = (entry){store[n], scores[(r >> 33) % 8]};
            n++;
        }
    }
    e[n++] = (entry){" a", -0.5f};
    int dup_first = 259 + n;
    e[n++] = (entry){"zz", -4.0f};
    e[n++] = (entry){"z", 0.0f};
    e[n++] = (entry){"zz", -0.1f}; /* duplicate, better score: ignored, the lowest id wins */
    write_vocab(path, 8, e, n);
    loip_scoredbpe *t = open_tok(path, 0);
    CHECK(t != NULL, "synthetic vocabulary did not open");
    if (!t) return;
    int32_t ids[16];
    int k = enc(t, "zz", 2, 0, 0, ids);
    CHECK(k == 2 && ids[0] == 259 && ids[1] == dup_first, "duplicate piece: want id %d, got %d",
          dup_first, k == 2 ? ids[1] : -1);
    /* Agreement with the naive loop (the duplicate only matters for "zz", not generated). */
    int agree = agree_random(path, t, abc, sizeof abc / sizeof *abc, 600, 300);
    CHECK(agree == 600, "tie-heavy vocabulary: %d/600 agree with the naive run.c merge", agree);
    printf("tie-heavy synthetic vocabulary: %d/600 agree with the naive run.c merge\n", agree);
    loip_scoredbpe_free(t);

    /* A vocabulary without " ": the dummy prefix falls back to the byte token 35. */
    snprintf(path, sizeof path, "%s/nospace.bin", dir);
    entry ns[] = {{"a", 0.0f}};
    write_vocab(path, 8, ns, 1);
    t = open_tok(path, 0);
    k = t ? enc(t, "a", 1, 0, 0, ids) : -1;
    CHECK(k == 2 && ids[0] == 35 && ids[1] == 259, "no \" \" piece: want [35 259]");
    loip_scoredbpe_free(t);
}

static void expect_fail(const char *dir, const char *name, const void *data, size_t n,
                        int32_t vocab, int code, const char *needle) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, n, f);
    fclose(f);
    loip_scoredbpe *t = (loip_scoredbpe *)1;
    int rc = loip_scoredbpe_open(path, vocab, &t);
    const char *msg = loip_last_error();
    CHECK(rc == code && t == NULL && strstr(msg, path) && strstr(msg, needle),
          "%s: rc %d, message \"%s\" (want %d naming the path and \"%s\")", name, rc, msg, code,
          needle);
}

static void test_malformed(const char *dir, const char *shared) {
    char path[4096];
    snprintf(path, sizeof path, "%s/missing.bin", dir);
    loip_scoredbpe *t = (loip_scoredbpe *)1;
    CHECK(loip_scoredbpe_open(path, 0, &t) == LOIP_EIO && t == NULL &&
              strstr(loip_last_error(), path), "missing file: %s", loip_last_error());

    /* A small valid file to damage: max_len 4, then "ab" (score -1), "c" (score 0). */
    uint8_t good[64];
    const uint32_t hdr[5] = {4, 0xbf800000u /* -1.0f */, 2, 0 /* 0.0f */, 1};
    memcpy(good, hdr, 12);
    memcpy(good + 12, "ab", 2);
    const size_t rec2 = 14; /* offset of token 1's record */
    memcpy(good + rec2, hdr + 3, 8);
    memcpy(good + rec2 + 8, "c", 1);
    const size_t n = rec2 + 9;
    snprintf(path, sizeof path, "%s/good.bin", dir);
    FILE *f = fopen(path, "wb");
    fwrite(good, 1, n, f);
    fclose(f);
    t = open_tok(path, 0);
    CHECK(t && loip_scoredbpe_size(t) == 2, "small valid file should hold 2 tokens");
    loip_scoredbpe_free(t);

    expect_fail(dir, "short.bin", good, 3, 0, LOIP_EFORMAT, "too short");
    expect_fail(dir, "empty_vocab.bin", good, 4, 0, LOIP_EFORMAT, "no tokens");
    expect_fail(dir, "cut_piece.bin", good, n - 1, 0, LOIP_EFORMAT,
                "truncated record for token 1 at offset 14");
    expect_fail(dir, "cut_header.bin", good, rec2 + 5, 0, LOIP_EFORMAT,
                "truncated record for token 1");
    expect_fail(dir, "too_few.bin", good, n, 3, LOIP_EFORMAT, "holds only 2 tokens");
    uint8_t bad[64];
    memcpy(bad, good, n);
    int32_t huge = 0x40000000;
    memcpy(bad + 8, &huge, 4);
    expect_fail(dir, "absurd_len.bin", bad, n, 0, LOIP_EFORMAT, "token 0 at offset 4");
    int32_t neg = -5;
    memcpy(bad + 8, &neg, 4);
    expect_fail(dir, "neg_len.bin", bad, n, 0, LOIP_EFORMAT, "length -5");
    memcpy(bad, good, n);
    int32_t five = 5; /* > max_token_length 4 */
    memcpy(bad + rec2 + 4, &five, 4);
    expect_fail(dir, "over_max.bin", bad, n, 0, LOIP_EFORMAT, "token 1 at offset 14");
    memcpy(bad, good, n);
    uint32_t absurd = 0x7fffffff;
    memcpy(bad, &absurd, 4);
    expect_fail(dir, "absurd_max.bin", bad, n, 0, LOIP_EFORMAT, "max_token_length");

    if (shared) { /* the real file, one byte short, read to the end */
        char real[4096];
        snprintf(real, sizeof real, "%s/models/stories260K/tok512.bin", shared);
        size_t rn;
        char *d = slurp(real, &rn);
        if (d) {
            expect_fail(dir, "tok512_cut.bin", d, rn - 1, 0, LOIP_EFORMAT, "token 511");
            expect_fail(dir, "tok512_513.bin", d, rn, 513, LOIP_EFORMAT, "holds only 512");
            free(d);
        }
    }
}

/* ---- main --------------------------------------------------------------------------------- */

static int has_models(const char *root) {
    static const char *need[] = {"models/stories260K/tok512.bin",
                                 "models/stories260K/reference/encode.json",
                                 "models/llama2-tokenizer/tokenizer.bin",
                                 "models/llama2-tokenizer/reference/sentencepiece_reference.json"};
    char probe[4200];
    for (size_t i = 0; i < sizeof need / sizeof *need; i++) {
        snprintf(probe, sizeof probe, "%s/%s", root, need[i]);
        if (!exists(probe)) return 0;
    }
    return 1;
}

/* The folder holding models/ into buf, or NULL with the reason in why. */
static const char *find_shared(int argc, char **argv, char *buf, size_t cap, char *why,
                               size_t wcap) {
    /* __FILE__ is <repo>/tests/test_scoredbpe.c when CMake compiles it (absolute path), so
     * the test also finds the models when ctest runs it from a build folder without argv. */
    char src_repo[4096] = "";
    const char *cut = strstr(__FILE__, "tests/test_scoredbpe.c");
    if (cut && __FILE__[0] == '/')
        snprintf(src_repo, sizeof src_repo, "%.*s", (int)(cut - __FILE__), __FILE__);
    const char *env = getenv("LOIP_SHARED_DIR");
    const char *roots[4] = {argc > 1 ? argv[1] : NULL, src_repo[0] ? src_repo : NULL, ".",
                            env && *env ? env : NULL};
    for (int i = 0; i < 4; i++) {
        if (!roots[i]) continue;
        snprintf(buf, cap, "%s", roots[i]);
        if (has_models(buf)) return buf;
    }
    snprintf(why, wcap, "no models/stories260K/tok512.bin and models/llama2-tokenizer (with "
                        "their reference/) in the repository (argv[1], this source's, or the "
                        "current directory) nor in LOIP_SHARED_DIR");
    return NULL;
}

int main(int argc, char **argv) {
    char shared_buf[3072], why[4400];
    const char *shared = find_shared(argc, argv, shared_buf, sizeof shared_buf, why, sizeof why);
    char dir[] = "/tmp/test_scoredbpe.XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_synthetic(dir);
    test_malformed(dir, shared);
    if (shared) {
        test_stories(shared);
        test_llama2(shared);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    printf("test_scoredbpe: %d passed, %d failed\n", n_pass, n_fail);
    if (n_fail) return 1;
    if (!shared) {
        printf("SKIP: reference checks not run: %s\n", why);
        return 77;
    }
    return 0;
}
