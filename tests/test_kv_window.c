/* test_kv_window.c — sliding-window layers (loip_model_config.sliding_window, layer_window;
 * runtime/exec/kv_window.c). A model with layers 0 and 2 windowed (window 5) and layer 1 full:
 * a session whose batch makes a ring shorter than the context keeps those layers' KV in rings
 * (16 positions each, never more) and its pool only layer 1's, and gives, position by position
 * through 70 positions, the logits of a session that keeps every layer's KV whole (the window
 * applied by the mask alone), bit for bit; the window changes the logits (the same model
 * unwindowed differs past the window); the KV charged is what loip_session_kv_size says (growing:
 * the rings at the start, layer 1's groups as they are taken); a
 * sequence sharing another's positions takes its window rows (the same next logits, bit for
 * bit), refused where the rows are gone; the prompt cache's holds are refused; a tree of drafts
 * gives each node the logits of its path run as a chain (the window counted from its depth), and
 * so does a tree of 200 nodes (a chain of 70 and 130 under random parents: masks of 4 words, paths
 * longer than 64 and the window), each row attending exactly to its ancestors; a node past the
 * session's tree reach (its batch rounded up to 64, at most LOIP_TREE_MAX) is refused.
 * Exit 0 pass, 1 fail. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loip.h"
#include "check.h"

enum { DIM = 32, HID = 48, LAYERS = 3, HEADS = 4, KV = 2, HD = 8, VOCAB = 64, CTX = 128, N = 70, WINDOW = 5 };

static uint64_t rng;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static float *weights[128];
static int n_weights;

static void bind(loip_model *m, int l, int w, int64_t rows, int64_t cols, float scale, float base) {
    size_t n = (size_t)rows * (cols ? cols : 1);
    float *p = weights[n_weights++] = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = base + scale * frand();
    loip_tensor t = {.data = p, .dtype = LOIP_F32, .ndim = cols ? 2 : 1, .shape = {rows, cols}};
    if (loip_model_bind(m, l, w, &t)) fprintf(stderr, "bind %d/%d: %s\n", l, w, loip_last_error());
}

/* the same weights every time (the generator restarts); window 0: no layer windowed; positions
 * up to max_seq */
static loip_model *make_model_ctx(int window, int max_seq, loip_model_config *out) {
    loip_model_config c = {.dim = DIM, .hidden_dim = HID, .n_layers = LAYERS, .n_heads = HEADS, .n_kv_heads = KV,
                           .head_dim = HD, .vocab_size = VOCAB, .max_seq = max_seq, .norm_eps = 1e-5f,
                           .rope_theta = 10000.0f, .rope_layout = LOIP_ROPE_HALF, .tied_embeddings = 1};
    c.sliding_window = window, c.layer_window[0] = 1, c.layer_window[2] = 1;
    if (out) *out = c;
    rng = 0x9E3779B97F4A7C15ull;
    loip_model *m = NULL;
    if (loip_model_new(&c, &m)) return NULL;
    bind(m, -1, LOIP_W_EMBED, VOCAB, DIM, 0.5f, 0);
    bind(m, -1, LOIP_W_OUTPUT_NORM, DIM, 0, 0.1f, 1.0f);
    for (int l = 0; l < LAYERS; l++) {
        bind(m, l, LOIP_W_ATTN_NORM, DIM, 0, 0.1f, 1.0f);
        bind(m, l, LOIP_W_FFN_NORM, DIM, 0, 0.1f, 1.0f);
        bind(m, l, LOIP_W_WQ, HEADS * HD, DIM, 0.6f, 0);
        bind(m, l, LOIP_W_WK, KV * HD, DIM, 0.6f, 0);
        bind(m, l, LOIP_W_WV, KV * HD, DIM, 0.6f, 0);
        bind(m, l, LOIP_W_WO, DIM, HEADS * HD, 0.3f, 0);
        bind(m, l, LOIP_W_GATE, HID, DIM, 0.3f, 0);
        bind(m, l, LOIP_W_UP, HID, DIM, 0.3f, 0);
        bind(m, l, LOIP_W_DOWN, DIM, HID, 0.3f, 0);
    }
    return m;
}

static loip_model *make_model(int window, loip_model_config *out) { return make_model_ctx(window, CTX, out); }

static int32_t prompt[CTX];

/* positions [from, to) of the prompt as sequence seq in batches of `step`; every position's
 * logits into out[(p - from) * VOCAB] */
static int run(loip_session *s, int32_t seq, int32_t from, int32_t to, int32_t step, float *out) {
    for (int32_t at = from; at < to; at += step) {
        int32_t n = to - at < step ? to - at : step, ids[CTX], rows[CTX];
        loip_batch_token bt[CTX];
        for (int32_t i = 0; i < n; i++) ids[i] = prompt[at + i], bt[i] = (loip_batch_token){seq, at + i, 0}, rows[i] = i;
        int rc = loip_session_forward_batch(s, ids, n, bt, rows, n, out + (size_t)(at - from) * VOCAB);
        if (rc) {
            fprintf(stderr, "forward of %d..%d (sequence %d): %s\n", at, at + n - 1, seq, loip_last_error());
            return rc;
        }
    }
    return 0;
}

static uint64_t account(loip_budget *b, const char *name) {
    loip_budget_account a[LOIP_BUDGET_MAX_ACCOUNTS];
    int32_t n = loip_budget_report(b, a, LOIP_BUDGET_MAX_ACCOUNTS);
    for (int32_t i = 0; i < n; i++)
        if (!strcmp(a[i].name, name)) return a[i].bytes;
    return 0;
}

static float max_diff(const float *a, const float *b, size_t n) {
    float d = 0;
    for (size_t i = 0; i < n; i++) d = fmaxf(d, fabsf(a[i] - b[i]));
    return d;
}

enum { BIG_CTX = 1024, BIG_N = 20, BIG_NODES = 200, BIG_CHAIN = 70 };

/* A tree of BIG_NODES nodes after BIG_N prompt positions (node i at BIG_N + i; nodes 1..70 a
 * chain, the rest under random earlier nodes) forwarded in one batch of sequence 0: each node's
 * logits are those of its path (the root, its ancestors, itself) run as a chain in sequence 1;
 * nodes past the tree reach refused. */
static void big_tree(loip_pool *pool) {
    loip_model *m = make_model_ctx(WINDOW, BIG_CTX, NULL);
    loip_session *s = NULL, *small = NULL, *capped = NULL;
    int rc = m ? loip_session_new_seqs(m, pool, BIG_CTX, 256, 0, 2, NULL, NULL, 0, &s) : -1;
    rc |= m ? loip_session_new_seqs(m, pool, BIG_CTX, 8, 0, 1, NULL, NULL, 0, &small) : -1;
    rc |= m ? loip_session_new_seqs(m, pool, BIG_CTX, 600, 0, 1, NULL, NULL, 0, &capped) : -1;
    CHECK(rc == 0, "big tree sessions: %s", loip_last_error());
    if (rc) return;
    enum { ROWS = BIG_NODES + 1 };
    int32_t ids[ROWS], parent[ROWS], depth[ROWS], rows[ROWS];
    loip_batch_token bt[ROWS];
    float *pre = malloc(sizeof(float) * BIG_N * VOCAB), *tout = malloc(sizeof(float) * ROWS * VOCAB),
          *cout = malloc(sizeof(float) * ROWS * VOCAB);
    CHECK(run(s, 0, 0, BIG_N, 8, pre) == 0 && run(s, 1, 0, BIG_N, 8, pre) == 0, "the prompts");
    rng = 0x1234567ull;
    parent[0] = -1, depth[0] = 0;
    for (int i = 0; i < ROWS; i++) {
        if (i > 0) {
            parent[i] = i <= BIG_CHAIN ? i - 1 : (int32_t)((frand() * 0.5f + 0.5f) * (float)i) % i;
            depth[i] = depth[parent[i]] + 1;
        }
        ids[i] = (i * 29 + 3) % VOCAB, rows[i] = i;
        bt[i] = (loip_batch_token){0, BIG_N + i, i > 0 ? i - parent[i] : 0};
    }
    int deepest = 0, branched = 0;
    for (int i = 1; i < ROWS; i++) deepest = depth[i] > deepest ? depth[i] : deepest, branched += parent[i] != i - 1;
    CHECK(deepest > 64 && branched > 100, "the tree: %d deep, %d nodes off their predecessor", deepest, branched);
    rc = loip_session_forward_batch(s, ids, ROWS, bt, rows, ROWS, tout);
    CHECK(rc == 0, "a tree of %d nodes: %s", BIG_NODES, loip_last_error());
    float worst = 0;
    int bad = -1;
    for (int i = 0; i < ROWS && rc == 0; i++) {
        int32_t path[ROWS], cids[ROWS], crow[1];
        loip_batch_token cbt[ROWS];
        int d = depth[i];
        for (int a = i, k = d; k >= 0; a = parent[a], k--) path[k] = a;
        for (int k = 0; k <= d; k++) cids[k] = ids[path[k]], cbt[k] = (loip_batch_token){1, BIG_N + k, 0};
        crow[0] = d;
        if (loip_session_forward_batch(s, cids, d + 1, cbt, crow, 1, cout + (size_t)i * VOCAB)) {
            bad = i;
            break;
        }
        float diff = max_diff(tout + (size_t)i * VOCAB, cout + (size_t)i * VOCAB, VOCAB);
        if (diff > worst) worst = diff, bad = diff > 1e-4f ? i : bad;
    }
    CHECK(worst <= 1e-4f && (rc != 0 || bad < 0), "every node's logits are its path's as a chain: worst %g (node %d)", worst,
          bad);
    /* the same rows as a plain causal batch (every earlier row seen) differ where a node branched */
    for (int i = 0; i < ROWS; i++) bt[i] = (loip_batch_token){1, BIG_N + i, 0};
    CHECK(loip_session_forward_batch(s, ids, ROWS, bt, rows, ROWS, cout) == 0, "the causal batch: %s", loip_last_error());
    float other = max_diff(tout + (size_t)BIG_NODES * VOCAB, cout + (size_t)BIG_NODES * VOCAB, VOCAB);
    CHECK(parent[BIG_NODES] != BIG_NODES - 1 && other > 1e-3f, "the mask matters: the causal row differs by %g", other);
    /* the tree reach: 64 for a batch of 8 (a node 65 past the root refused, naming the parent and
     * the reach), 512 (LOIP_TREE_MAX) for a batch of 600 */
    loip_batch_token far[2] = {{0, BIG_N, 0}, {0, BIG_N + 65, 1}};
    int32_t two[2] = {3, 4}, r1[1] = {1};
    rc = loip_session_forward_batch(small, two, 2, far, r1, 1, tout);
    CHECK(rc == LOIP_EINVAL && strstr(loip_last_error(), "parent") && strstr(loip_last_error(), "at most 64"),
          "65 past the root in a batch of 8: %d %s", rc, loip_last_error());
    far[1].pos = BIG_N + 64;
    CHECK(run(small, 0, 0, BIG_N, 8, pre) == 0 && loip_session_forward_batch(small, two, 2, far, r1, 1, tout) == 0,
          "64 past the root in a batch of 8: %s", loip_last_error());
    far[1].pos = BIG_N + 513;
    rc = loip_session_forward_batch(capped, two, 2, far, r1, 1, tout);
    CHECK(rc == LOIP_EINVAL && strstr(loip_last_error(), "at most 512"), "513 past the root: %d %s", rc, loip_last_error());
    far[1].pos = BIG_N + 512;
    CHECK(run(capped, 0, 0, BIG_N, 8, pre) == 0 && loip_session_forward_batch(capped, two, 2, far, r1, 1, tout) == 0,
          "512 past the root: %s", loip_last_error());
    free(pre), free(tout), free(cout);
    loip_session_free(s), loip_session_free(small), loip_session_free(capped);
    loip_model_free(m);
}

int main(void) {
    for (int i = 0; i < CTX; i++) prompt[i] = (i * 37 + 11) % VOCAB;
    loip_pool *pool = NULL;
    loip_pool_new(2, &pool);
    loip_model_config cfg;
    loip_model *m = make_model(WINDOW, &cfg), *plain = make_model(0, NULL);
    CHECK(m && plain, "models: %s", loip_last_error());
    if (!m || !plain) return 1;
    size_t row = (size_t)KV * HD * sizeof(float);

    /* ringed: batches of 8 -> a ring of 16 (window 5 - 1 + 8, rounded up to 16) < 128 */
    CHECK(loip_session_kv_ring_tokens(&cfg, CTX, 8) == 16, "ring of %d", loip_session_kv_ring_tokens(&cfg, CTX, 8));
    CHECK(loip_session_kv_ring_tokens(&cfg, 64, 64) == 0, "no ring where it would hold the whole context");
    loip_budget *b = NULL;
    loip_budget_new(0, &b);
    loip_session *ring = NULL, *whole = NULL, *unwindowed = NULL;
    int rc = loip_session_new_seqs(m, pool, CTX, 8, 0, 2, b, NULL, 0, &ring);
    CHECK(rc == 0, "ringed session: %s", loip_last_error());
    /* the whole cache: batches up to 128 make no ring; run in the same batches of 8 */
    rc |= loip_session_new_seqs(m, pool, CTX, CTX, 0, 1, NULL, NULL, 0, &whole);
    rc |= loip_session_new_seqs(plain, pool, CTX, 8, 0, 1, NULL, NULL, 0, &unwindowed);
    CHECK(rc == 0, "sessions: %s", loip_last_error());
    if (rc) return 1;
    CHECK(loip_session_kv_window_layers(ring) == 2 && loip_session_kv_window_layers(whole) == 0, "layers ringed: %d, %d",
          loip_session_kv_window_layers(ring), loip_session_kv_window_layers(whole));
    CHECK(loip_session_kv_window_bytes(ring) == 2 * 2 * 2 * 16 * row, "rings: 2 sequences x 2 layers x 16 rows, K and V: %llu",
          (unsigned long long)loip_session_kv_window_bytes(ring));
    CHECK(loip_session_kv_group_bytes(ring) == 2 * 1 * LOIP_KV_BLOCK_TOKENS * row, "the pool keeps layer 1 alone");
    CHECK(loip_session_kv_group_bytes(whole) == 2 * 3 * LOIP_KV_BLOCK_TOKENS * row, "the whole cache keeps 3 layers");
    CHECK(loip_session_kv_bytes(ring) == loip_session_kv_size(&cfg, CTX, 8, NULL, 0, 2), "kv size as planned");
    CHECK(account(b, "kv") == loip_session_kv_bytes(ring), "kv charged %llu, size %llu", (unsigned long long)account(b, "kv"),
          (unsigned long long)loip_session_kv_bytes(ring));
    uint8_t first_two[LAYERS] = {1, 1, 0};
    uint64_t one_pool = loip_session_kv_size(&cfg, CTX, 8, first_two, 0, 2);
    CHECK(one_pool < loip_session_kv_size(&cfg, CTX, CTX, first_two, 0, 2), "a ringed layer costs less than a whole one");

    float *a = malloc(sizeof(float) * N * VOCAB), *w = malloc(sizeof(float) * N * VOCAB), *p = malloc(sizeof(float) * N * VOCAB);
    CHECK(run(ring, 0, 0, N, 8, a) == 0 && run(whole, 0, 0, N, 8, w) == 0 && run(unwindowed, 0, 0, N, 8, p) == 0, "runs");
    CHECK(!memcmp(a, w, sizeof(float) * N * VOCAB), "ringed and whole KV give the same logits bit for bit (max diff %g)",
          max_diff(a, w, (size_t)N * VOCAB));
    CHECK(!memcmp(a, p, sizeof(float) * WINDOW * VOCAB), "within the window the window changes nothing");
    CHECK(max_diff(a + (size_t)(N - 1) * VOCAB, p + (size_t)(N - 1) * VOCAB, VOCAB) > 1e-3f,
          "past the window the logits differ from the unwindowed model's: %g",
          max_diff(a + (size_t)(N - 1) * VOCAB, p + (size_t)(N - 1) * VOCAB, VOCAB));
    CHECK(account(b, "kv") == loip_session_kv_bytes(ring), "the rings never grow");

    /* one token at a time gives the same rows as batches of 8 (the ring wraps every 16) */
    float *one = malloc(sizeof(float) * N * VOCAB);
    CHECK(loip_session_seq_free(ring, 0) == 0 && run(ring, 0, 0, N, 1, one) == 0, "token by token");
    CHECK(max_diff(one, a, (size_t)N * VOCAB) < 1e-5f, "token by token as in batches: %g", max_diff(one, a, (size_t)N * VOCAB));

    /* sharing: sequence 1 takes sequence 0's 70 positions and computes position 70 as 0 does */
    float mine[VOCAB], theirs[VOCAB];
    CHECK(loip_session_seq_share(ring, 1, 0, N) == 0, "share: %s", loip_last_error());
    CHECK(run(ring, 1, N, N + 1, 1, theirs) == 0 && run(ring, 0, N, N + 1, 1, mine) == 0, "the next position");
    CHECK(!memcmp(mine, theirs, sizeof mine), "the sharer's next logits are the owner's bit for bit");
    CHECK(loip_session_seq_free(ring, 1) == 0, "free 1");
    rc = loip_session_seq_share(ring, 1, 0, 20);
    CHECK(rc == LOIP_ESTATE && strstr(loip_last_error(), "sliding-window"), "a window gone refused: %d %s", rc,
          loip_last_error());
    /* the prompt cache: sequence 0's first 4 groups held, the last with its rings at 64 (the ring
     * holds 55..70 now: at 32 they are gone); sequence 1 adopting them computes 64..69 as 0 did */
    int32_t ids[4];
    uint64_t cached = account(b, "prompt_cache");
    CHECK(loip_session_kv_hold(ring, 0, 0, 4, ids) == 0, "hold: %s", loip_last_error());
    CHECK(loip_session_kv_window_end(ring, ids[1]) == 0, "no snapshot yet");
    rc = loip_session_kv_hold_window(ring, 0, 1);
    CHECK(rc == LOIP_ESTATE && strstr(loip_last_error(), "rings hold positions 55..70"), "rings gone refused: %d %s", rc,
          loip_last_error());
    CHECK(loip_session_kv_hold_window(ring, 0, 3) == 0, "hold window: %s", loip_last_error());
    CHECK(loip_session_kv_window_end(ring, ids[3]) == 64 && loip_session_kv_window_end(ring, ids[1]) == 0, "ends");
    CHECK(account(b, "prompt_cache") - cached == 2 * 2 * (WINDOW - 1) * row, "the snapshot charged: %llu",
          (unsigned long long)(account(b, "prompt_cache") - cached));
    CHECK(loip_session_seq_free(ring, 1) == 0, "free 1");
    rc = loip_session_kv_adopt(ring, 1, ids, 3);
    CHECK(rc == LOIP_ESTATE && strstr(loip_last_error(), "no sliding-window rings at position 48"), "no rings at 48: %s",
          loip_last_error());
    CHECK(loip_session_kv_adopt(ring, 1, ids, 4) == 0, "adopt: %s", loip_last_error());
    float *adopted = malloc(sizeof(float) * 6 * VOCAB);
    CHECK(run(ring, 1, 64, N, 8, adopted) == 0, "after the adopted groups");
    CHECK(!memcmp(adopted, a + (size_t)64 * VOCAB, sizeof(float) * 6 * VOCAB), "positions 64..69 bit for bit: %g",
          max_diff(adopted, a + (size_t)64 * VOCAB, (size_t)6 * VOCAB));
    free(adopted);
    /* group 1 (ending at 32) wants the rings there: sequence 1 recomputing 0..39 leaves them (taken
     * before the batch after 31 writes), and a sequence adopting groups 0..1 computes 32..69 as 0 did */
    CHECK(loip_session_seq_free(ring, 1) == 0, "free 1");
    CHECK(loip_session_kv_window_at(ring, 1, ids[1], 32) == 0, "window at: %s", loip_last_error());
    float *again = malloc(sizeof(float) * (N - 32) * VOCAB);
    CHECK(run(ring, 1, 0, 32, 8, again) == 0 && loip_session_kv_window_end(ring, ids[1]) == 0, "not yet: 24..31 written last");
    CHECK(run(ring, 1, 32, 40, 8, again) == 0 && loip_session_kv_window_end(ring, ids[1]) == 32, "taken before 32..39");
    CHECK(loip_session_seq_free(ring, 1) == 0 && loip_session_kv_adopt(ring, 1, ids, 2) == 0, "adopt 2: %s", loip_last_error());
    CHECK(run(ring, 1, 32, N, 8, again) == 0, "after the 2 adopted groups");
    CHECK(!memcmp(again, a + (size_t)32 * VOCAB, sizeof(float) * (N - 32) * VOCAB), "positions 32..69 bit for bit: %g",
          max_diff(again, a + (size_t)32 * VOCAB, (size_t)(N - 32) * VOCAB));
    free(again);
    loip_kv_share_stats sh;
    loip_session_kv_share_stats(ring, &sh);
    CHECK(sh.window_snapshots == 2, "two snapshots held");
    CHECK(loip_session_seq_free(ring, 1) == 0, "free 1");
    for (int i = 0; i < 4; i++) CHECK(loip_session_kv_drop(ring, ids[i]) == 0, "drop %d", i);
    loip_session_kv_share_stats(ring, &sh);
    CHECK(sh.window_snapshots == 0 && account(b, "prompt_cache") == cached, "the snapshots freed with their groups");
    /* a tree of drafts after position N: root r at N, its children a (N + 1) and b (N + 2), b's child
     * c (N + 3, depth 2): b's and c's logits are those of the chain r, b, c at N, N + 1, N + 2, bit
     * for bit (the window counted from each node's depth, not its KV position) */
    CHECK(loip_session_seq_free(ring, 0) == 0 && run(ring, 0, 0, N, 8, a) == 0, "the prompt again");
    loip_batch_token tree[4] = {{0, N, 0}, {0, N + 1, 1}, {0, N + 2, 2}, {0, N + 3, 1}};
    int32_t tids[4] = {5, 9, 13, 17}, trows[2] = {2, 3}, chain[3] = {5, 13, 17};
    float tout[2 * VOCAB], cout[3 * VOCAB];
    CHECK(loip_session_forward_batch(ring, tids, 4, tree, trows, 2, tout) == 0, "tree: %s", loip_last_error());
    CHECK(loip_session_seq_free(ring, 1) == 0, "free 1");
    CHECK(loip_session_seq_share(ring, 1, 0, N) == 0, "sequence 1 shares the prompt");
    for (int i = 0; i < 3; i++) {
        loip_batch_token bt = {1, N + i, 0};
        int32_t r0[1] = {0};
        CHECK(loip_session_forward_batch(ring, &chain[i], 1, &bt, r0, 1, cout + (size_t)i * VOCAB) == 0, "chain %d", i);
    }
    CHECK(!memcmp(tout, cout + VOCAB, sizeof(float) * VOCAB), "node b as the chain's position N + 1: %g",
          max_diff(tout, cout + VOCAB, VOCAB));
    CHECK(!memcmp(tout + VOCAB, cout + 2 * VOCAB, sizeof(float) * VOCAB), "node c as the chain's position N + 2: %g",
          max_diff(tout + VOCAB, cout + 2 * VOCAB, VOCAB));

    /* growing: the rings charged whole from the start, the pool (layer 1 alone) group by group */
    loip_session *grows = NULL;
    rc = loip_session_new_seqs(m, pool, CTX, 8, 0, 1, b, NULL, LOIP_SESSION_KV_GROWS, &grows);
    CHECK(rc == 0, "growing session: %s", loip_last_error());
    if (!rc) {
        uint64_t gb = loip_session_kv_group_bytes(grows), start = loip_session_kv_charged(grows);
        CHECK(start == loip_session_kv_bytes(grows) - (uint64_t)(CTX / LOIP_KV_BLOCK_TOKENS) * gb,
              "the tables and the rings at the start: %llu", (unsigned long long)start);
        CHECK(start >= loip_session_kv_window_bytes(grows), "the rings among them");
        CHECK(run(grows, 0, 0, N, 8, w) == 0, "growing run");
        CHECK(!memcmp(a, w, sizeof(float) * N * VOCAB), "growing: the same logits bit for bit");
        CHECK(loip_session_kv_charged(grows) == start + 5 * gb, "70 positions: 5 groups of layer 1 charged, the rings no more: %llu",
              (unsigned long long)(loip_session_kv_charged(grows) - start));
        loip_session_free(grows);
    }

    big_tree(pool);

    loip_session_free(ring), loip_session_free(whole), loip_session_free(unwindowed);
    CHECK(account(b, "kv") == 0, "all released");
    loip_budget_free(b);
    loip_model_free(m), loip_model_free(plain);
    for (int i = 0; i < n_weights; i++) free(weights[i]);
    free(a), free(w), free(p), free(one);
    loip_pool_free(pool);
    printf("test_kv_window: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
