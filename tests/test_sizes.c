/* test_sizes.c — the size calls a planner uses before anything is allocated say exactly what
 * the objects then charge to their budget: loip_loader_size against the "slots" and "scratch"
 * accounts after loip_loader_new (every mode, unaligned and zero slot sizes, request sizes above
 * the slot), and loip_device_size against "activations" after loip_device_new (a tiny model
 * with no weights bound: a device allocates its buffers at birth and runs nothing), with the
 * clamps of max_tokens and logits_tokens. Exit 0 pass, 1 fail. */
#include <stdio.h>
#include <string.h>

#include "loip.h"
#include "check.h"

static uint64_t account(const loip_budget *b, const char *name) {
    loip_budget_account acc[LOIP_BUDGET_MAX_ACCOUNTS];
    int32_t n = loip_budget_report(b, acc, LOIP_BUDGET_MAX_ACCOUNTS);
    for (int32_t i = 0; i < n && i < LOIP_BUDGET_MAX_ACCOUNTS; i++)
        if (!strcmp(acc[i].name, name)) return acc[i].bytes;
    return 0;
}

static void test_loader_sizes(void) {
    static const struct {
        int32_t mode, n_slots;
        uint64_t slot_bytes, request_bytes;
    } cases[] = {
        {LOIP_LOADER_AUTO, 1, 1 << 20, 0},
        {LOIP_LOADER_AUTO, 3, 100000, 0},           /* slot rounded up; request cut to the slot */
        {LOIP_LOADER_BUFFERED, 2, 1 << 20, 0},      /* 1 MiB bounce buffer */
        {LOIP_LOADER_BUFFERED, 1, 100000, 0},       /* bounce buffer = the rounded slot */
        {LOIP_LOADER_BUFFERED, 4, 8 << 20, 12345},  /* request rounded up to 4 KiB */
        {LOIP_LOADER_BUFFERED, 0, 0, 0},            /* defaults: one slot, a page charged */
        {LOIP_LOADER_URING, 2, 3 << 20, 256 << 10},
        {LOIP_LOADER_URING, 1, 5000, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        loip_budget *b = NULL;
        CHECK(loip_budget_new(0, &b) == 0, "budget");
        loip_loader_config c = {0};
        c.mode = cases[i].mode;
        c.n_slots = cases[i].n_slots;
        c.slot_bytes = cases[i].slot_bytes;
        c.request_bytes = cases[i].request_bytes;
        c.budget = b;
        uint64_t slots = 0, scratch = 0;
        int rc = loip_loader_size(&c, &slots, &scratch);
        CHECK(rc == 0, "case %zu: loader_size: %s", i, loip_last_error());
        loip_loader *l = NULL;
        rc = loip_loader_new(&c, &l);
        if (rc == LOIP_ENOSYS && c.mode == LOIP_LOADER_URING) {
            printf("  case %zu: io_uring unavailable here (%s): not compared\n", i, loip_last_error());
            loip_budget_free(b);
            continue;
        }
        CHECK(rc == 0 && l, "case %zu: loader_new: %s", i, loip_last_error());
        uint64_t held_slots = account(b, "slots"), held_scratch = account(b, "scratch");
        CHECK(slots == held_slots && scratch == held_scratch,
              "case %zu (mode %d, now %d): size says slots %llu scratch %llu, budget holds %llu, %llu",
              i, c.mode, l ? loip_loader_mode(l) : -1, (unsigned long long)slots,
              (unsigned long long)scratch, (unsigned long long)held_slots,
              (unsigned long long)held_scratch);
        CHECK(loip_budget_used(b) == slots + scratch, "case %zu: nothing else charged", i);
        if (l) CHECK((scratch > 0) == (loip_loader_mode(l) == LOIP_LOADER_BUFFERED),
                     "case %zu: scratch only on the buffered path", i);
        loip_loader_free(l);
        CHECK(loip_budget_used(b) == 0, "case %zu: all given back", i);
        loip_budget_free(b);
    }
    /* out-parameters may be NULL; a config loip_loader_new refuses is refused here too */
    loip_loader_config c = {.slot_bytes = 4096, .mode = LOIP_LOADER_BUFFERED};
    CHECK(loip_loader_size(&c, NULL, NULL) == 0, "NULL outs");
    uint64_t s1 = 0, s2 = 0;
    CHECK(loip_loader_size(NULL, &s1, &s2) == 0 && s1 == 4096, "NULL cfg: defaults (%llu)",
          (unsigned long long)s1);
    c.overlap_loads = 2;
    CHECK(loip_loader_size(&c, &s1, &s2) == LOIP_EINVAL, "overlap_loads 2 refused");
    loip_loader *l = NULL;
    CHECK(loip_loader_new(&c, &l) == LOIP_EINVAL && !l, "overlap_loads 2 refused by new");
    c.overlap_loads = 0;
    c.mode = 7;
    CHECK(loip_loader_size(&c, &s1, &s2) == LOIP_EINVAL, "bad mode refused");
}

static void test_device_sizes(void) {
    loip_model_config mc = {.dim = 64, .hidden_dim = 128, .n_layers = 1, .n_heads = 4,
                            .n_kv_heads = 4, .head_dim = 16, .vocab_size = 512, .max_seq = 64,
                            .norm_eps = 1e-5f, .rope_theta = 10000.0f};
    loip_model_config big = mc; /* a hidden state above the 64 KiB control cap at 8 tokens */
    big.dim = 4096, big.n_heads = 32, big.n_kv_heads = 32, big.head_dim = 128, big.vocab_size = 1000;
    loip_pool *pool = NULL;
    loip_net *net = NULL;
    loip_sock *in = NULL, *head = NULL;
    CHECK(loip_pool_new(1, &pool) == 0, "pool");
    int rc = loip_net_new("sizes", NULL, &net);
    if (rc) {
        printf("  no transport here (%s): device sizes not compared\n", loip_last_error());
        loip_pool_free(pool);
        return;
    }
    CHECK(loip_sock_bind(net, "inproc://test-sizes", &in) == 0, "bind: %s", loip_last_error());
    CHECK(loip_sock_connect(net, "inproc://test-sizes", "head", &head) == 0, "connect: %s",
          loip_last_error());
    static const struct {
        int big;
        int32_t max_batch, max_tokens, logits_tokens, max_seqs;
    } cases[] = {
        {0, 16, 16, 1, 1},
        {0, 16, 16, 0, 1},  /* logits_tokens <= 0: 1 */
        {0, 16, 8, 12, 1},  /* logits_tokens > max_tokens: max_tokens */
        {0, 4, 16, 16, 1},  /* max_tokens > the session's batch: the caller passes the smaller */
        {1, 8, 8, 2, 1},    /* hidden 128 KiB: the payload buffer is as large */
        {1, 1, 1, 1, 1},
        {0, 16, 16, 1, 6},  /* six sequences: six rows of logits to sample from */
        {0, 16, 4, 1, 6},   /* more sequences than tokens a message holds: max_tokens rows */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const loip_model_config *cfg = cases[i].big ? &big : &mc;
        loip_model *m = NULL;
        loip_session *s = NULL;
        loip_runner *r = NULL;
        loip_device *d = NULL;
        loip_budget *b = NULL;
        CHECK(loip_model_new(cfg, &m) == 0, "case %zu: model: %s", i, loip_last_error());
        CHECK(loip_session_new_seqs(m, pool, 16, cases[i].max_batch, 0, cases[i].max_seqs, NULL, NULL, 0, &s) == 0,
              "case %zu: session: %s",
              i, loip_last_error());
        loip_stage_desc st = {.first_block = 0, .last_block = 0}; /* no blocks, no weights */
        CHECK(loip_runner_new(s, m, NULL, &st, 1, 0, &r) == 0, "case %zu: runner: %s", i,
              loip_last_error());
        CHECK(loip_budget_new(0, &b) == 0, "budget");
        int32_t max_tokens = cases[i].max_tokens < cases[i].max_batch ? cases[i].max_tokens
                                                                      : cases[i].max_batch;
        uint64_t want = 0;
        CHECK(loip_device_size(cfg, max_tokens, cases[i].logits_tokens, cases[i].max_seqs, &want) == 0,
              "case %zu: device_size: %s", i, loip_last_error());
        loip_device_config dc = {.runner = r, .session = s, .in = in, .head = head, .plan_id = 1,
                                 .device = 0, .n_devices = 1, .n_stages = 1,
                                 .max_tokens = cases[i].max_tokens,
                                 .logits_tokens = cases[i].logits_tokens, .max_seqs = cases[i].max_seqs};
        rc = loip_device_new(&dc, b, &d);
        CHECK(rc == 0 && d, "case %zu: device_new: %s", i, loip_last_error());
        uint64_t held = account(b, "activations");
        CHECK(want == held && loip_budget_used(b) == held,
              "case %zu: device_size says %llu, the budget holds %llu (of %llu)", i,
              (unsigned long long)want, (unsigned long long)held,
              (unsigned long long)loip_budget_used(b));
        loip_device_free(d);
        CHECK(loip_budget_used(b) == 0, "case %zu: given back", i);
        loip_budget_free(b);
        loip_runner_free(r);
        loip_session_free(s);
        loip_model_free(m);
    }
    /* the payload buffer never drops below the control cap; misuse */
    uint64_t n = 0;
    /* hidden and table, outputs (to 64 bytes) and logits, payload, ids (four: a message's, a
     * verified run's drafts, its tokens out, a tree's parents) and tables */
    CHECK(loip_device_size(&mc, 1, 1, 1, &n) == 0 &&
              n == (64 * 4 + sizeof(loip_step_token)) + (64 + 512 * 4) + 64 * 1024 +
                       (4 * 4 + sizeof(loip_step_token) + sizeof(loip_batch_token)),
          "one token of a small model: %llu", (unsigned long long)n);
    CHECK(loip_device_size(&mc, 0, 1, 1, &n) == LOIP_EINVAL, "max_tokens 0 refused");
    loip_model_config none = {0};
    CHECK(loip_device_size(&none, 4, 1, 1, &n) == LOIP_EINVAL, "a config without dim refused");
    loip_sock_free(head);
    loip_sock_free(in);
    loip_net_free(net);
    loip_pool_free(pool);
}

int main(void) {
    test_loader_sizes();
    test_device_sizes();
    printf("test_sizes: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
