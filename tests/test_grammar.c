/* test_grammar.c — the grammar matcher (runtime/grammar) from hand-written IR: masks over a
 * small vocabulary equal a brute force (every token tried on a clone), accept refuses what the
 * mask refuses (naming the token) and leaves the state as it was, stop ids are allowed exactly
 * when the grammar may end and alone when it must, clones are independent, apply sets the
 * refused logits to -inf, and pathological grammars (left recursion, exponential ambiguity,
 * unbounded nesting) fail with a message instead of hanging. Exit 0 pass, 1 fail. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loip.h"
#include "check.h"

#define SET(i) ((int32_t)((1u << 28) | (uint32_t)(i)))
#define REF(i) ((int32_t)((2u << 28) | (uint32_t)(i)))

static uint8_t sets[8][32];
static int n_sets;

static int32_t set_of(const char *bytes) {
    memset(sets[n_sets], 0, 32);
    for (const unsigned char *p = (const unsigned char *)bytes; *p; p++) sets[n_sets][*p >> 3] |= (uint8_t)(1u << (*p & 7));
    return SET(n_sets++);
}

static const char *toks[] = {"a", "1", "12", "a1", "x", "1x", "b", "", "<eos>", "a12x", "2", "xx", "xxxx", "aaaa", "xxxxxxx"};
enum { NT = sizeof toks / sizeof *toks, EOS = 8 };

static loip_grammar_vocab *make_vocab(void) {
    char bytes[256];
    int64_t off[NT + 1];
    uint8_t excl[NT] = {0};
    size_t o = 0;
    off[0] = 0;
    for (int i = 0; i < NT; i++) {
        if (i == EOS) excl[i] = 1;
        else memcpy(bytes + o, toks[i], strlen(toks[i])), o += strlen(toks[i]);
        off[i + 1] = (int64_t)o;
    }
    loip_grammar_vocab *v = NULL;
    CHECK(loip_grammar_vocab_new(bytes, off, excl, NT, &v) == 0, "vocab: %s", loip_last_error());
    return v;
}

/* the bits of m against accepting each token on a clone */
static void check_brute(loip_grammar_matcher *m, const char *what) {
    uint32_t bits[1];
    CHECK(loip_grammar_matcher_mask(m, bits, 1) == 0, "%s: mask: %s", what, loip_last_error());
    for (int i = 0; i < NT; i++) {
        loip_grammar_matcher *k = NULL;
        CHECK(loip_grammar_matcher_clone(m, &k) == 0, "clone");
        int ok = loip_grammar_matcher_accept(k, i) == 0;
        CHECK(ok == (int)((bits[0] >> i) & 1), "%s: token %d (%s): mask %u, accept %d", what, i, toks[i],
              (bits[0] >> i) & 1, ok);
        loip_grammar_matcher_free(k);
    }
}

int main(void) {
    /* root ::= "a" digits ( "x" )?     digits ::= [0-9] digits | ""   (x* as a rule) */
    int32_t a = set_of("a"), d = set_of("0123456789"), x = set_of("x");
    int32_t ir3[] = {3, 1, 3, a, REF(1), REF(2), 2, 2, d, REF(1), 0, 2, 1, x, 0};
    loip_grammar *g = NULL;
    CHECK(loip_grammar_new(ir3, (int32_t)(sizeof ir3 / sizeof *ir3), &sets[0][0], n_sets, 0, "root\ndigits\nopt-x", &g) == 0,
          "grammar: %s", loip_last_error());
    loip_grammar_vocab *v = make_vocab();
    CHECK(loip_grammar_vocab_size(v) == NT, "vocab size");
    int32_t stop = EOS;
    loip_grammar_matcher *m = NULL;
    CHECK(loip_grammar_matcher_new(g, v, &stop, 1, &m) == 0, "matcher: %s", loip_last_error());
    loip_grammar_free(g); /* the matcher holds it */
    loip_grammar_vocab_free(v);

    check_brute(m, "start");
    uint32_t bits[1];
    loip_grammar_matcher_mask(m, bits, 1);
    CHECK(bits[0] == ((1u << 0) | (1u << 3) | (1u << 9)), "start mask %x", bits[0]);
    CHECK(!loip_grammar_matcher_can_end(m), "can_end at the start");
    CHECK(loip_grammar_matcher_accept(m, 1) == LOIP_EINVAL, "'1' refused at the start");
    CHECK(strstr(loip_last_error(), "token 1") != NULL, "the refusal names the token: %s", loip_last_error());
    CHECK(loip_grammar_matcher_accept(m, 6) == LOIP_EINVAL, "'b' refused");
    CHECK(loip_grammar_matcher_accept(m, EOS) == LOIP_EINVAL, "stop refused before the end");
    CHECK(loip_grammar_matcher_accept(m, 7) == LOIP_EINVAL, "an empty token refused");
    CHECK(loip_grammar_matcher_accept(m, 0) == 0, "'a' accepted: %s", loip_last_error());
    check_brute(m, "after a");
    CHECK(loip_grammar_matcher_can_end(m) && !loip_grammar_matcher_must_end(m), "may end after a");
    loip_grammar_matcher_mask(m, bits, 1);
    CHECK((bits[0] >> EOS) & 1, "stop allowed after a");

    loip_grammar_matcher *k = NULL;
    CHECK(loip_grammar_matcher_clone(m, &k) == 0, "clone");
    CHECK(loip_grammar_matcher_accept(k, 5) == 0, "'1x' accepted on the clone");
    CHECK(loip_grammar_matcher_must_end(k), "must end after x");
    loip_grammar_matcher_mask(k, bits, 1);
    CHECK(bits[0] == (1u << EOS), "only the stop id when the grammar must end: %x", bits[0]);
    check_brute(k, "after a1x");
    CHECK(loip_grammar_matcher_accept(k, EOS) == 0, "stop accepted at the end");
    CHECK(loip_grammar_matcher_accept(k, 0) == LOIP_EINVAL, "nothing after the stop");
    loip_grammar_matcher_free(k);
    CHECK(!loip_grammar_matcher_must_end(m), "the original is not moved by its clone");
    CHECK(loip_grammar_matcher_accept(m, 2) == 0 && loip_grammar_matcher_accept(m, 10) == 0, "digits");
    check_brute(m, "after a122");

    float logits[NT + 2];
    for (int i = 0; i < NT + 2; i++) logits[i] = 1.0f;
    CHECK(loip_grammar_matcher_apply(m, logits, NT + 2) == 0, "apply");
    loip_grammar_matcher_mask(m, bits, 1);
    for (int i = 0; i < NT + 2; i++) {
        int allowed = i < NT && ((bits[0] >> i) & 1);
        CHECK(allowed ? logits[i] == 1.0f : isinf(logits[i]) && logits[i] < 0, "apply: logit %d", i);
    }
    CHECK(loip_grammar_matcher_accept_bytes(m, "12y", 3) == LOIP_EINVAL, "bytes refused");
    CHECK(strstr(loip_last_error(), "byte 2") != NULL, "names the offset: %s", loip_last_error());
    CHECK(loip_grammar_matcher_accept_bytes(m, "9x", 2) == 0 && loip_grammar_matcher_must_end(m), "bytes accepted");
    loip_grammar_matcher_free(m);

    /* left recursion: r ::= r "a" | "a" */
    int32_t lr[] = {1, 2, 2, REF(0), a, 1, a};
    g = NULL;
    CHECK(loip_grammar_new(lr, 7, &sets[0][0], n_sets, 0, "r", &g) == LOIP_EINVAL && !g, "left recursion refused");
    CHECK(strstr(loip_last_error(), "rule r is left-recursive") != NULL, "names the rule: %s", loip_last_error());
    /* malformed IR */
    int32_t bad[] = {1, 1, 1, REF(5)};
    CHECK(loip_grammar_new(bad, 4, &sets[0][0], n_sets, 0, NULL, &g) == LOIP_EINVAL, "a reference to no rule");

    /* exponential ambiguity: r ::= "a" r "x" | "a" r "1" | "" -- 2^n parses after n a's */
    int32_t amb[] = {1, 3, 3, a, REF(0), x, 3, a, REF(0), d, 0};
    v = make_vocab();
    CHECK(loip_grammar_new(amb, 11, &sets[0][0], n_sets, 0, "r", &g) == 0, "ambiguous grammar: %s", loip_last_error());
    CHECK(loip_grammar_matcher_new(g, v, &stop, 1, &m) == 0, "matcher");
    int rc = 0, i;
    for (i = 0; i < 40 && !rc; i++) rc = loip_grammar_matcher_accept(m, 0);
    CHECK(rc == LOIP_ERANGE && strstr(loip_last_error(), "parses at once"), "ambiguity bounded (%d after %d): %s", rc, i,
          loip_last_error());
    loip_grammar_matcher_free(m);
    loip_grammar_free(g);
    /* unbounded nesting: r ::= "a" r "x" | "" */
    int32_t nest[] = {1, 2, 3, a, REF(0), x, 0};
    CHECK(loip_grammar_new(nest, 7, &sets[0][0], n_sets, 0, "r", &g) == 0, "nesting grammar");
    CHECK(loip_grammar_matcher_new(g, v, &stop, 1, &m) == 0, "matcher");
    for (i = 0; i < 12; i++) { /* masks of stacks deeper than the cache's keys, against the brute force */
        check_brute(m, "nested");
        CHECK(loip_grammar_matcher_accept(m, 0) == 0, "nested a");
    }
    loip_grammar_matcher *k2 = NULL;
    CHECK(loip_grammar_matcher_clone(m, &k2) == 0, "clone");
    for (i = 0; i < 12; i++) {
        check_brute(k2, "closing");
        CHECK(loip_grammar_matcher_accept(k2, 4) == 0, "closing x %d: %s", i, loip_last_error());
    }
    CHECK(loip_grammar_matcher_must_end(k2), "closed");
    loip_grammar_matcher_free(k2);
    rc = 0;
    for (i = 0; i < 5000 && !rc; i++) rc = loip_grammar_matcher_accept(m, 0);
    CHECK(rc == LOIP_ERANGE && strstr(loip_last_error(), "nesting deeper"), "nesting bounded (%d after %d): %s", rc, i,
          loip_last_error());
    loip_grammar_matcher_free(m);
    loip_grammar_free(g);
    loip_grammar_vocab_free(v);

    printf("test_grammar: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
