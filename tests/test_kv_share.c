/* test_kv_share.c — KV groups shared between sequences and held by the prompt cache
 * (runtime/exec/kv_share.c). A sequence sharing another's prompt (loip_session_seq_share)
 * and computing the next token gives the logits the owner gives for it, bit for bit; its first
 * write copies the shared partial group (copy-on-write) and leaves the owner's rows unchanged
 * bit for bit; full shared groups are not copied; held groups adopted by a new sequence serve it
 * as the original's; reference counts go back to 0 and the budget's "kv" and "prompt_cache"
 * accounts hold exactly what the session says at every turn; a sequence that needs a group
 * evicts the cache's least recent first (a full pool, then a budget that refuses); lending a
 * shared group is refused. Exit 0 pass, 1 fail. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loip.h"
#include "check.h"
#include "exec/session.h"

enum { DIM = 32, HID = 48, LAYERS = 2, HEADS = 4, KV = 2, HD = 8, VOCAB = 64, CTX = 128, KB = LOIP_KV_BLOCK_TOKENS };

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}
static float *arr(size_t n, float scale, float base) {
    float *a = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) a[i] = base + scale * frand();
    return a;
}

static float *weights[LAYERS + 1][LOIP_W_COUNT];

static void bind(loip_model *m, int l, int w, int64_t rows, int64_t cols, float scale, float base) {
    float *p = weights[l < 0 ? LAYERS : l][w] = arr((size_t)rows * (cols ? cols : 1), scale, base);
    loip_tensor t = {.data = p, .dtype = LOIP_F32, .ndim = cols ? 2 : 1, .shape = {rows, cols}};
    if (loip_model_bind(m, l, w, &t)) fprintf(stderr, "bind %d/%d: %s\n", l, w, loip_last_error());
}

static loip_model *make_model(void) {
    loip_model_config c = {.dim = DIM, .hidden_dim = HID, .n_layers = LAYERS, .n_heads = HEADS, .n_kv_heads = KV,
                           .head_dim = HD, .vocab_size = VOCAB, .max_seq = CTX, .norm_eps = 1e-5f,
                           .rope_theta = 10000.0f, .rope_layout = LOIP_ROPE_HALF, .tied_embeddings = 1};
    loip_model *m = NULL;
    if (loip_model_new(&c, &m)) return NULL;
    bind(m, -1, LOIP_W_EMBED, VOCAB, DIM, 0.5f, 0);
    bind(m, -1, LOIP_W_OUTPUT_NORM, DIM, 0, 0.1f, 1.0f);
    for (int l = 0; l < LAYERS; l++) {
        bind(m, l, LOIP_W_ATTN_NORM, DIM, 0, 0.1f, 1.0f);
        bind(m, l, LOIP_W_FFN_NORM, DIM, 0, 0.1f, 1.0f);
        bind(m, l, LOIP_W_WQ, HEADS * HD, DIM, 0.3f, 0);
        bind(m, l, LOIP_W_WK, KV * HD, DIM, 0.3f, 0);
        bind(m, l, LOIP_W_WV, KV * HD, DIM, 0.3f, 0);
        bind(m, l, LOIP_W_WO, DIM, HEADS * HD, 0.3f, 0);
        bind(m, l, LOIP_W_GATE, HID, DIM, 0.3f, 0);
        bind(m, l, LOIP_W_UP, HID, DIM, 0.3f, 0);
        bind(m, l, LOIP_W_DOWN, DIM, HID, 0.3f, 0);
    }
    return m;
}

static int32_t prompt[CTX];

/* tokens [from, to) of the prompt through sequence seq; the last row's logits into out (or not) */
static int run(loip_session *s, int32_t seq, int32_t from, int32_t to, float *out) {
    int32_t ids[CTX], rows[1] = {to - from - 1};
    loip_batch_token bt[CTX];
    for (int32_t p = from; p < to; p++) ids[p - from] = prompt[p], bt[p - from] = (loip_batch_token){seq, p, 0};
    float scratch[VOCAB];
    int rc = loip_session_forward_batch(s, ids, to - from, bt, rows, 1, out ? out : scratch);
    if (rc) fprintf(stderr, "forward of %d..%d (sequence %d): %s\n", from, to - 1, seq, loip_last_error());
    return rc;
}

static uint64_t account(loip_budget *b, const char *name) {
    loip_budget_account a[LOIP_BUDGET_MAX_ACCOUNTS];
    int32_t n = loip_budget_report(b, a, LOIP_BUDGET_MAX_ACCOUNTS);
    for (int32_t i = 0; i < n; i++)
        if (!strcmp(a[i].name, name)) return a[i].bytes;
    return 0;
}

static int32_t group_of(const loip_session *s, int32_t seq, int32_t i) {
    return s->kv->block_table[(size_t)seq * s->kv->blocks_per_seq + i];
}

/* the rows of group g (every kept layer's K and V) equal to a copy saved before */
static void save_group(const loip_session *s, int32_t g, float *out) {
    const loip_kv *kv = s->kv;
    size_t rows = (size_t)kv->kv_block * kv->kv_dim;
    for (int k = 0; k < kv->n_kv_layers; k++) {
        memcpy(out + (2 * k) * rows, chunk_at(kv, kv->k_cache, k, g), rows * sizeof(float));
        memcpy(out + (2 * k + 1) * rows, chunk_at(kv, kv->v_cache, k, g), rows * sizeof(float));
    }
}

static void sharing(loip_model *m, loip_pool *pool) {
    loip_budget *b = NULL;
    loip_budget_new(0, &b);
    loip_session *s = NULL;
    int rc = loip_session_new_seqs(m, pool, CTX, CTX, 6 * KB, 4, b, NULL, LOIP_SESSION_KV_GROWS, &s);
    CHECK(rc == 0, "session: %s", loip_last_error());
    if (rc) return;
    uint64_t gb = loip_session_kv_group_bytes(s), base = loip_session_kv_charged(s);
    size_t grow = 2 * (size_t)LAYERS * KB * KV * HD;
    float *before = malloc(grow * sizeof(float)), *after = malloc(grow * sizeof(float));
    float own[VOCAB], shared[VOCAB], again[VOCAB];

    /* sequence 0: a prompt of 39 positions, then position 39 (its logits the reference) */
    CHECK(run(s, 0, 0, 39, NULL) == 0, "prefill");
    CHECK(loip_session_kv_groups_held(s, 0) == 3, "3 groups for 39 positions: %d", loip_session_kv_groups_held(s, 0));
    /* sequence 1 shares them and computes position 39 itself */
    CHECK(loip_session_seq_share(s, 1, 0, 39) == 0, "share: %s", loip_last_error());
    for (int i = 0; i < 3; i++) CHECK(loip_session_kv_refs(s, group_of(s, 0, i)) == 2, "group %d named twice", i);
    CHECK(account(b, "kv") == base + 3 * gb, "shared groups are charged once");
    int32_t g2 = group_of(s, 0, 2);
    save_group(s, g2, before);
    CHECK(run(s, 1, 39, 40, shared) == 0, "the sharer's first token");
    CHECK(group_of(s, 1, 2) != g2 && group_of(s, 1, 0) == group_of(s, 0, 0) && group_of(s, 1, 1) == group_of(s, 0, 1),
          "the partial group copied on the write, the full ones still shared");
    save_group(s, g2, after);
    CHECK(!memcmp(before, after, grow * sizeof(float)), "the owner's rows unchanged by the sharer's write");
    CHECK(loip_session_kv_refs(s, g2) == 1 && loip_session_kv_refs(s, group_of(s, 1, 2)) == 1, "refs after the copy");
    CHECK(account(b, "kv") == base + 4 * gb, "the copy charged as a group");
    CHECK(run(s, 0, 39, 40, own) == 0, "the owner's own token");
    CHECK(!memcmp(own, shared, sizeof own), "logits through shared KV equal the owner's bit for bit");
    /* the copy holds the owner's rows 0..38 bit for bit (row 39 is each one's own write) */
    save_group(s, group_of(s, 1, 2), after);
    size_t rows = (size_t)KB * KV * HD, kept = (size_t)(39 - 2 * KB) * KV * HD;
    int same = 1;
    for (int k = 0; k < 2 * LAYERS; k++) same &= !memcmp(before + k * rows, after + k * rows, kept * sizeof(float));
    CHECK(same, "copy-on-write copies every kept layer's rows bit for bit");

    /* the prompt cache: sequence 0's two full groups held, then sequence 0 ends */
    int32_t ids[2];
    CHECK(loip_session_kv_hold(s, 0, 0, 2, ids) == 0, "hold: %s", loip_last_error());
    CHECK(loip_session_kv_refs(s, ids[0]) == 3, "held: refs 3 (two tables, one hold)");
    CHECK(loip_session_seq_free(s, 0) == 0 && loip_session_seq_free(s, 1) == 0, "free");
    CHECK(loip_session_kv_refs(s, ids[0]) == 1 && loip_session_kv_refs(s, g2) == 0, "only the hold is left");
    loip_kv_share_stats st;
    loip_session_kv_share_stats(s, &st);
    CHECK(st.cache_groups == 2 && st.cache_bytes == 2 * gb, "2 groups in the cache: %d", st.cache_groups);
    CHECK(account(b, "prompt_cache") == 2 * gb && account(b, "kv") == base, "held alone: charged to prompt_cache");
    CHECK(loip_session_kv_charged(s) == base && st.cache_charged == 2 * gb, "the session's own figures agree");
    /* adopted by sequence 2, which computes 32..39: the same logits as the original */
    CHECK(loip_session_kv_adopt(s, 2, ids, 2) == 0, "adopt: %s", loip_last_error());
    CHECK(account(b, "prompt_cache") == 0 && account(b, "kv") == base + 2 * gb, "adopted: back on kv");
    CHECK(run(s, 2, 2 * KB, 40, again) == 0, "the adopter's prefill after the cached groups");
    CHECK(!memcmp(own, again, sizeof own), "logits through adopted groups equal a full prefill's bit for bit");
    CHECK(loip_session_kv_adopt(s, 2, ids, 2) != 0, "adopt into a sequence holding KV refused");
    CHECK(loip_session_seq_free(s, 2) == 0, "free 2");
    CHECK(account(b, "prompt_cache") == 2 * gb, "back in the cache alone");

    /* lending a shared group is refused */
    CHECK(loip_session_kv_adopt(s, 3, ids, 2) == 0, "adopt 3");
    uint8_t buf[1 << 16];
    uint64_t bytes;
    rc = loip_session_kv_lend(s, 3, 0, LAYERS, 0, 1, buf, sizeof buf, &bytes);
    CHECK(rc == LOIP_ESTATE && strstr(loip_last_error(), "sequence 3"), "lend of a shared group: %d %s", rc,
          loip_last_error());
    CHECK(loip_session_seq_free(s, 3) == 0, "free 3");

    /* a sequence needing the whole pool (6 groups) evicts the cache's groups, least recent first */
    uint32_t gen0 = loip_session_kv_gen(s, ids[0]), gen1 = loip_session_kv_gen(s, ids[1]);
    CHECK(run(s, 0, 0, 4 * KB + 1, NULL) == 0, "5 groups: one cache group evicted");
    loip_session_kv_share_stats(s, &st);
    CHECK(st.evictions == 1 && st.cache_groups == 1, "one eviction: %llu, %d left", (unsigned long long)st.evictions,
          st.cache_groups);
    CHECK(run(s, 0, 4 * KB + 1, 5 * KB + 1, NULL) == 0, "6 groups: the other evicted");
    loip_session_kv_share_stats(s, &st);
    CHECK(st.evictions == 2 && st.cache_groups == 0 && st.free_groups == 0, "both evicted");
    CHECK(loip_session_kv_gen(s, ids[0]) != gen0 && loip_session_kv_gen(s, ids[1]) != gen1, "gens moved");
    CHECK(account(b, "prompt_cache") == 0 && account(b, "kv") == base + 6 * gb, "accounts after eviction");
    CHECK(loip_session_kv_drop(s, ids[0]) != 0, "drop of an evicted hold refused");
    CHECK(loip_session_seq_free(s, 0) == 0, "free");
    for (int32_t g = 0; g < 6; g++) CHECK(loip_session_kv_refs(s, g) == 0, "group %d free", g);
    CHECK(account(b, "kv") == base && account(b, "prompt_cache") == 0, "accounts back to the tables");

    /* drop: held, dropped, back to the pool */
    CHECK(run(s, 0, 0, KB, NULL) == 0 && loip_session_kv_hold(s, 0, 0, 1, ids) == 0, "hold one");
    CHECK(loip_session_kv_drop(s, ids[0]) == 0 && loip_session_kv_refs(s, ids[0]) == 1, "dropped: the table's ref");
    CHECK(loip_session_seq_free(s, 0) == 0 && loip_session_kv_refs(s, ids[0]) == 0, "then free");
    CHECK(loip_session_kv_free_tokens(s) == 6 * KB, "every group free");

    /* the disk tier's copies: two groups read out and dropped, loaded back into fresh groups and
     * adopted: the logits of position 39 as before, bit for bit */
    uint8_t *copy = malloc(2 * gb);
    CHECK(run(s, 0, 0, 2 * KB, NULL) == 0 && loip_session_kv_hold(s, 0, 0, 2, ids) == 0, "hold two");
    CHECK(loip_session_kv_read_group(s, ids[0], copy, gb) == 0 && loip_session_kv_read_group(s, ids[1], copy + gb, gb) == 0,
          "read: %s", loip_last_error());
    CHECK(loip_session_kv_read_group(s, ids[0], copy, gb - 1) != 0, "a short buffer refused");
    CHECK(loip_session_seq_free(s, 0) == 0 && loip_session_kv_drop(s, ids[0]) == 0 && loip_session_kv_drop(s, ids[1]) == 0,
          "dropped");
    CHECK(run(s, 3, 0, 2 * KB, NULL) == 0, "another sequence writes over the pool");
    int32_t back[2];
    CHECK(loip_session_kv_load_group(s, copy, gb, &back[0]) == 0 && loip_session_kv_load_group(s, copy + gb, gb, &back[1]) == 0,
          "load: %s", loip_last_error());
    CHECK(loip_session_kv_load_group(s, copy, gb - 4, &back[0]) != 0, "a wrong size refused");
    CHECK(loip_session_kv_refs(s, back[0]) == 1 && account(b, "prompt_cache") == 2 * gb, "loaded: held by the cache alone");
    CHECK(loip_session_kv_touch(s, back[0]) == 0 && loip_session_kv_touch(s, 99) != 0,
          "touch a held group; not a missing one");
    CHECK(loip_session_kv_adopt(s, 2, back, 2) == 0 && run(s, 2, 2 * KB, 40, again) == 0, "adopted: %s", loip_last_error());
    CHECK(!memcmp(own, again, sizeof own), "logits through groups loaded back equal the original's bit for bit");
    CHECK(loip_session_seq_free(s, 2) == 0 && loip_session_seq_free(s, 3) == 0, "free");
    CHECK(loip_session_kv_drop(s, back[0]) == 0 && loip_session_kv_drop(s, back[1]) == 0, "drop");
    CHECK(loip_session_kv_free_tokens(s) == 6 * KB && account(b, "prompt_cache") == 0, "all back");
    free(copy);
    loip_session_free(s);
    CHECK(loip_budget_used(b) == 0, "the session gave everything back: %llu", (unsigned long long)loip_budget_used(b));
    loip_budget_free(b);
    free(before), free(after);
}

/* a budget that holds the tables and 3 groups: a sequence's third group evicts a held one */
static void budget_eviction(loip_model *m, loip_pool *pool) {
    uint64_t kv, scratch;
    loip_model_config c = {.dim = DIM, .hidden_dim = HID, .n_layers = LAYERS, .n_heads = HEADS, .n_kv_heads = KV,
                           .head_dim = HD, .vocab_size = VOCAB, .max_seq = CTX};
    loip_session_size(&c, CTX, CTX, loip_pool_size(pool), -1, 8 * KB, 2, &kv, &scratch);
    uint64_t gb = 2ull * LAYERS * KB * KV * HD * sizeof(float), tables = kv - 8 * gb;
    loip_budget *b = NULL;
    loip_budget_new(tables + scratch + 3 * gb, &b);
    loip_session *s = NULL;
    int rc = loip_session_new_seqs(m, pool, CTX, CTX, 8 * KB, 2, b, NULL, LOIP_SESSION_KV_GROWS, &s);
    CHECK(rc == 0, "session: %s", loip_last_error());
    if (rc) return;
    int32_t ids[2];
    CHECK(run(s, 0, 0, 2 * KB, NULL) == 0 && loip_session_kv_hold(s, 0, 0, 2, ids) == 0, "two held");
    CHECK(loip_session_seq_free(s, 0) == 0, "free");
    CHECK(run(s, 1, 0, 2 * KB + 1, NULL) == 0, "3 groups under a budget of 3 with 2 held: %s", loip_last_error());
    loip_kv_share_stats st;
    loip_session_kv_share_stats(s, &st);
    CHECK(st.evictions == 2 && st.cache_groups == 0, "the budget's refusals evicted both held groups: %llu",
          (unsigned long long)st.evictions);
    CHECK(loip_budget_peak(b) <= loip_budget_limit(b), "the peak within the budget");
    CHECK(run(s, 1, 2 * KB + 1, 3 * KB + 1, NULL) != 0, "a fourth group fails with nothing left to evict");
    loip_session_free(s);
    CHECK(loip_budget_used(b) == 0, "everything back");
    loip_budget_free(b);
}

int main(void) {
    for (int i = 0; i < CTX; i++) prompt[i] = (int32_t)((i * 37 + 11) % VOCAB);
    loip_pool *pool = NULL;
    loip_pool_new(2, &pool);
    loip_model *m = make_model();
    CHECK(m != NULL, "model");
    if (m) {
        sharing(m, pool);
        budget_eviction(m, pool);
    }
    loip_model_free(m);
    loip_pool_free(pool);
    for (int l = 0; l <= LAYERS; l++)
        for (int w = 0; w < LOIP_W_COUNT; w++) free(weights[l][w]);
    printf("test_kv_share: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
