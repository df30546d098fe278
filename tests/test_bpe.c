/* test_bpe.c — the BPE merge loop (a heap over a linked list, with a chunk cache) against a
 * naive restatement of each rule, which rescans every adjacent pair after each merge:
 *   - listed merges (Hugging Face): the pair with the lowest merge rank, leftmost on ties;
 *   - tiktoken: the pair whose concatenation has the lowest rank (= id), leftmost on ties;
 *   - SentencePiece: the pair whose concatenation is a piece with the highest score,
 *     leftmost on ties (scores drawn from a few values, so ties are common).
 * Vocabularies and texts are random over a 4-letter alphabet, so merges chain and compete.
 * Also: NFC quick path and the pre-tokenizer on a few strings. Exit 0 pass, 1 fail. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loip.h"
#include "check.h"


static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

enum { MAXV = 1024, MAXL = 12, MAXM = 2048, MAXT = 64 };

typedef struct vocab {
    char piece[MAXV][MAXL + 1];
    float score[MAXV];
    int n;
    int ml[MAXM], mr[MAXM]; /* listed merges, in rank order */
    int nm;
} vocab;

static int find(const vocab *v, const char *s, size_t n) {
    for (int i = 0; i < v->n; i++)
        if (strlen(v->piece[i]) == n && memcmp(v->piece[i], s, n) == 0) return i;
    return -1;
}

/* Symbols as piece ids; the naive merge by rule (0 listed, 1 by id, 2 by score). */
static int naive(const vocab *v, int rule, const char *text, int *ids) {
    int n = 0;
    for (const char *p = text; *p; p++) ids[n++] = find(v, p, 1);
    for (;;) {
        int best = -1, best_new = -1;
        double best_key = 0;
        for (int i = 0; i + 1 < n; i++) {
            char cat[2 * MAXL + 2];
            snprintf(cat, sizeof cat, "%s%s", v->piece[ids[i]], v->piece[ids[i + 1]]);
            int id = find(v, cat, strlen(cat));
            if (id < 0) continue;
            double key;
            if (rule == 0) {
                int r = -1;
                for (int m = 0; m < v->nm && r < 0; m++)
                    if (v->ml[m] == ids[i] && v->mr[m] == ids[i + 1]) r = m;
                if (r < 0) continue;
                key = r;
            } else if (rule == 1) {
                key = id;
            } else {
                key = -v->score[id];
            }
            if (best < 0 || key < best_key) best = i, best_key = key, best_new = id;
        }
        if (best < 0) return n;
        ids[best] = best_new;
        memmove(ids + best + 1, ids + best + 2, (size_t)(n - best - 2) * sizeof *ids);
        n--;
    }
}

static void random_vocab(vocab *v, int rule) {
    memset(v, 0, sizeof *v);
    for (int c = 0; c < 4; c++) {
        v->piece[v->n][0] = (char)('a' + c);
        v->score[v->n] = -100.0f;
        v->n++;
    }
    while (v->n < 160 && v->nm < MAXM) {
        int a = (int)rnd((uint32_t)v->n), b = (int)rnd((uint32_t)v->n);
        size_t la = strlen(v->piece[a]), lb = strlen(v->piece[b]);
        if (la + lb > MAXL) continue;
        char cat[2 * MAXL + 2];
        snprintf(cat, sizeof cat, "%s%s", v->piece[a], v->piece[b]);
        int id = find(v, cat, la + lb);
        if (id < 0) {
            id = v->n++;
            memcpy(v->piece[id], cat, la + lb + 1);
            v->score[id] = -(float)rnd(6); /* few distinct scores: ties */
        }
        if (rule == 0) {
            int dup = 0;
            for (int m = 0; m < v->nm; m++) dup |= v->ml[m] == a && v->mr[m] == b;
            if (!dup) v->ml[v->nm] = a, v->mr[v->nm] = b, v->nm++;
        }
    }
}

static loip_bpe *build(const vocab *v, int rule) {
    loip_bpe *b = NULL;
    int flags = rule == 2 ? 0 : LOIP_BPE_BYTELEVEL;
    if (loip_bpe_new(flags, &b) != 0) return NULL;
    for (int i = 0; i < v->n; i++)
        if (loip_bpe_add_token(b, v->piece[i], strlen(v->piece[i]), i, v->score[i], 0) != 0) {
            fprintf(stderr, "add_token: %s\n", loip_last_error());
            loip_bpe_free(b);
            return NULL;
        }
    int rc = 0;
    if (rule == 0) {
        for (int m = 0; m < v->nm && rc == 0; m++)
            rc = loip_bpe_add_merge(b, v->piece[v->ml[m]], strlen(v->piece[v->ml[m]]),
                                    v->piece[v->mr[m]], strlen(v->piece[v->mr[m]]));
    } else {
        rc = loip_bpe_derive_merges(b, rule == 1 ? LOIP_BPE_MERGES_BY_ID : LOIP_BPE_MERGES_BY_SCORE);
    }
    if (rc != 0) {
        fprintf(stderr, "merges: %s\n", loip_last_error());
        loip_bpe_free(b);
        return NULL;
    }
    return b;
}

static void test_rule(int rule) {
    const char *names[] = {"listed", "by id", "by score"};
    for (int round = 0; round < 6; round++) {
        vocab *v = malloc(sizeof *v);
        random_vocab(v, rule);
        loip_bpe *b = build(v, rule);
        CHECK(b != NULL, "%s: build failed", names[rule]);
        if (b == NULL) {
            free(v);
            continue;
        }
        int mismatches = 0;
        for (int t = 0; t < 150; t++) {
            char text[MAXT + 1];
            int len = 1 + (int)rnd(MAXT);
            for (int i = 0; i < len; i++) text[i] = (char)('a' + rnd(4));
            text[len] = '\0';
            int want[MAXT], got[MAXT + 1], n = 0;
            int nw = naive(v, rule, text, want);
            for (int pass = 0; pass < 2; pass++) { /* the second goes through the cache */
                int rc = loip_bpe_encode(b, NULL, text, (size_t)len, got, MAXT + 1, &n);
                int same = rc == 0 && n == nw && memcmp(got, want, (size_t)n * sizeof *got) == 0;
                if (!same && mismatches++ < 3)
                    fprintf(stderr, "%s: \"%s\" pass %d: %d ids, want %d\n", names[rule], text, pass,
                            n, nw);
            }
        }
        CHECK(mismatches == 0, "%s: %d mismatches with the naive merge", names[rule], mismatches);
        loip_bpe_free(b);
        free(v);
    }
}

static void test_cap(void) {
    vocab *v = malloc(sizeof *v);
    random_vocab(v, 0);
    loip_bpe *b = build(v, 0);
    int ids[4], n = 0;
    int rc = loip_bpe_encode(b, NULL, "dcbadcbadcba", 12, ids, 0, &n);
    CHECK(rc == LOIP_ERANGE && n > 0, "cap 0: rc %d, n %d", rc, n);
    int32_t miss = loip_bpe_lookup(b, "zz", 2);
    CHECK(miss == -1, "lookup of a missing piece gives %d", (int)miss);
    const char *piece = NULL;
    int32_t len = 0;
    CHECK(loip_bpe_piece(b, 999, &piece, &len) == LOIP_EINVAL, "piece of a hole");
    loip_bpe_free(b);
    loip_bpe_free(NULL);
    free(v);
}

static void test_pretok(void) {
    loip_pretok *p = NULL;
    CHECK(loip_pretok_new(&p) == 0, "pretok_new");
    const char *pat = "\\p{L}+|\\p{N}";
    CHECK(loip_pretok_add_split(p, pat, strlen(pat), LOIP_SPLIT_ISOLATED, 0) == 0, "add_split");
    const char *s = "ab12 \xc3\xa9t\xc3\xa9\xff!";
    int32_t b[32], n = 0;
    CHECK(loip_pretok_split(p, s, strlen(s), b, 16, &n) == 0 && n == 6, "split: %d chunks", n);
    /* "ab" "1" "2" " " "été" "\xff!" */
    CHECK(n == 6 && b[8] == 5 && b[9] == 10, "the accented word is one chunk");
    CHECK(n == 6 && b[10] == 10 && b[11] == 12, "the invalid byte is left between matches");
    CHECK(loip_pretok_add_split(p, "(", 1, LOIP_SPLIT_ISOLATED, 0) == LOIP_EINVAL &&
              strstr(loip_last_error(), "offset 1") != NULL,
          "bad regex: %s", loip_last_error());
    loip_pretok_free(p);
}

int main(void) {
    test_rule(0);
    test_rule(1);
    test_rule(2);
    test_cap();
    test_pretok();
    printf("test_bpe: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
