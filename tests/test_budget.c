/* test_budget.c — loip_budget: charges and releases per account, peaks, the refusal (before
 * anything is charged, naming the account and the shortfall), account limits, charged buffers
 * and loader slots that give their bytes back when freed (in either order with the budget),
 * and charging from several threads at once. Exit 0 pass, 1 fail. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "loip.h"
#include "check.h"

#define MiB (1024ull * 1024ull)

static uint64_t account(loip_budget *b, const char *name, uint64_t *peak) {
    loip_budget_account acc[LOIP_BUDGET_MAX_ACCOUNTS];
    int32_t n = loip_budget_report(b, acc, LOIP_BUDGET_MAX_ACCOUNTS);
    for (int32_t i = 0; i < n; i++)
        if (!strcmp(acc[i].name, name)) {
            if (peak) *peak = acc[i].peak;
            return acc[i].bytes;
        }
    if (peak) *peak = 0;
    return (uint64_t)-1;
}

/* Pages of [p, p + bytes) resident now. */
static size_t resident_pages(const uint8_t *p, size_t bytes) {
    unsigned char vec[512];
    size_t n = bytes / 4096, k = 0;
    if (n > sizeof vec || mincore((void *)p, bytes, vec) != 0) return (size_t)-1;
    for (size_t i = 0; i < n; i++) k += vec[i] & 1;
    return k;
}

/* A reserved buffer's huge pages stop at a taken range's ends: a range that covers part of a
 * 2 MiB window makes resident its own pages, not the whole window (what it is charged for).
 * Where transparent huge pages are off this holds anyway. */
static void reserved_edges(void) {
    loip_budget *b;
    loip_buffer *rb;
    CHECK(loip_budget_new(0, &b) == 0, "new");
    CHECK(loip_buffer_new_reserved(b, "weights", 16 * MiB, &rb) == 0, "reserved");
    uint8_t *d = loip_buffer_data(rb);
    uintptr_t w = ((uintptr_t)d + 4 * MiB - 1) & ~(uintptr_t)(2 * MiB - 1); /* a window 2-4 MiB in */
    uint64_t off = (uint64_t)(w - (uintptr_t)d);
    /* a range that ends 16 KiB into the window, and one that starts 1 MiB into the next */
    CHECK(loip_buffer_take_range(rb, off - 64 * 1024, 80 * 1024) == 0, "take: %s", loip_last_error());
    CHECK(loip_buffer_take_range(rb, off + 3 * MiB, 64 * 1024) == 0, "take: %s", loip_last_error());
    CHECK(account(b, "weights", NULL) == 144 * 1024, "charged to the byte");
    size_t k1 = resident_pages((uint8_t *)w, 2 * MiB), k2 = resident_pages((uint8_t *)w + 2 * MiB, 2 * MiB);
    CHECK(k1 == 4, "window 1: %zu pages resident for a range of 4 there (a huge page would be 512)", k1);
    CHECK(k2 == 16, "window 2: %zu pages resident for a range of 16 there (a huge page would be 512)", k2);
    /* a range wholly covering a window may still be huge: taken and dropped whole */
    CHECK(loip_buffer_take_range(rb, off + 6 * MiB, 4 * MiB) == 0, "take: %s", loip_last_error());
    CHECK(loip_buffer_drop_range(rb, off + 6 * MiB, 4 * MiB) == 0, "drop: %s", loip_last_error());
    CHECK(resident_pages((uint8_t *)w + 6 * MiB, 2 * MiB) == 0, "dropped range given back");
    loip_buffer_free(rb);
    CHECK(account(b, "weights", NULL) == 0, "released");
    loip_budget_free(b);
}

typedef struct {
    loip_budget *b;
    const char *name;
    int refused;
} worker;

static void *charge_loop(void *p) {
    worker *w = p;
    for (int i = 0; i < 20000; i++) {
        if (loip_budget_charge(w->b, w->name, 100) != 0) {
            w->refused++;
            continue;
        }
        loip_budget_release(w->b, w->name, 100);
    }
    for (int i = 0; i < 1000; i++)
        if (loip_budget_charge(w->b, w->name, 1) != 0) w->refused++;
    return NULL;
}

int main(void) {
    loip_budget *b;
    CHECK(loip_budget_new(1536 * MiB, &b) == 0, "new");
    CHECK(loip_budget_limit(b) == 1536 * MiB, "limit");
    CHECK(loip_budget_used(b) == 0, "used 0");

    /* charges, releases, peaks */
    CHECK(loip_budget_charge(b, "weights", 1200 * MiB) == 0, "weights");
    CHECK(loip_budget_charge(b, "slots", 200 * MiB) == 0, "slots");
    CHECK(loip_budget_charge(b, "kv", 10 * MiB) == 0, "kv");
    CHECK(loip_budget_used(b) == 1410 * MiB, "used %llu", (unsigned long long)loip_budget_used(b));
    loip_budget_release(b, "kv", 4 * MiB);
    uint64_t peak;
    CHECK(account(b, "kv", &peak) == 6 * MiB && peak == 10 * MiB, "kv account and peak");
    CHECK(loip_budget_peak(b) == 1410 * MiB, "budget peak");
    CHECK(loip_budget_used(b) == 1406 * MiB, "used after release");
    loip_budget_release(b, "kv", 100 * MiB); /* clamped at what it holds */
    CHECK(account(b, "kv", NULL) == 0 && loip_budget_used(b) == 1400 * MiB, "release clamps");
    loip_budget_release(b, "nobody", 5); /* unknown account: nothing happens */
    CHECK(loip_budget_used(b) == 1400 * MiB, "unknown release");

    /* the refusal: nothing charged, message names the account and the shortfall */
    CHECK(loip_budget_charge(b, "kv", 512 * MiB) == LOIP_ENOMEM, "refused");
    const char *msg = loip_last_error();
    CHECK(strstr(msg, "kv needs 376.0 MiB more") != NULL, "shortfall in: %s", msg);
    CHECK(strstr(msg, "136.0 MiB of the 1.50 GiB budget is left") != NULL, "left in: %s", msg);
    CHECK(strstr(msg, "weights 1.17 GiB") && strstr(msg, "slots 200.0 MiB"), "holders in: %s", msg);
    CHECK(loip_budget_used(b) == 1400 * MiB && account(b, "kv", NULL) == 0, "nothing charged");
    CHECK(loip_budget_charge(b, "kv", 136 * MiB) == 0, "exactly the rest fits");
    CHECK(loip_budget_charge(b, "kv", 1) == LOIP_ENOMEM, "one byte more does not");
    CHECK(loip_budget_charge(b, "x", UINT64_MAX) == LOIP_ENOMEM, "no overflow");
    loip_budget_free(b);

    /* what is asked beside what is left: with the digits it takes to differ */
    CHECK(loip_budget_new(3 * MiB, &b) == 0, "3 MiB");
    CHECK(loip_budget_charge(b, "kv", 3 * MiB + 18227) == LOIP_ENOMEM, "refused");
    msg = loip_last_error();
    CHECK(strstr(msg, "(asks 3.02 MiB) but only 3.00 MiB of the 3.0 MiB budget is left") != NULL, "figures in: %s", msg);

    /* names */
    CHECK(loip_budget_charge(b, "", 1) == LOIP_EINVAL, "empty name");
    char longname[64];
    memset(longname, 'a', 40), longname[40] = 0;
    CHECK(loip_budget_charge(b, longname, 1) == LOIP_EINVAL, "long name");
    loip_budget_free(b);

    /* an unlimited budget, and the account limit */
    CHECK(loip_budget_new(0, &b) == 0, "unlimited");
    char name[16];
    for (int i = 0; i < LOIP_BUDGET_MAX_ACCOUNTS; i++) {
        snprintf(name, sizeof name, "a%d", i);
        CHECK(loip_budget_charge(b, name, 1ull << 40) == 0, "charge %s", name);
    }
    CHECK(loip_budget_charge(b, "one-more", 1) == LOIP_EINVAL, "account limit");
    CHECK(loip_budget_charge(b, "a0", 1) == 0, "existing account still fine");
    loip_budget_account acc[4];
    CHECK(loip_budget_report(b, acc, 4) == LOIP_BUDGET_MAX_ACCOUNTS, "report count");
    CHECK(!strcmp(acc[0].name, "a0") && acc[0].bytes == (1ull << 40) + 1, "report order");
    loip_budget_free(b);

    /* charged buffers and slots, freed before and after the budget */
    CHECK(loip_budget_new(64 * MiB, &b) == 0, "new");
    loip_buffer *buf, *buf2;
    CHECK(loip_buffer_new_charged(b, "weights", 40 * MiB, &buf) == 0, "charged buffer");
    CHECK(account(b, "weights", NULL) == 40 * MiB, "buffer charged");
    CHECK(loip_buffer_new_charged(b, "weights", 30 * MiB, &buf2) == LOIP_ENOMEM && !buf2,
          "second buffer refused");
    CHECK(strstr(loip_last_error(), "weights needs 6.0 MiB more") != NULL, "%s", loip_last_error());
    loip_loader_config c = {0};
    c.slot_bytes = 10 * MiB + 1; /* rounded up to 4 KiB */
    c.n_slots = 2;
    c.mode = LOIP_LOADER_BUFFERED;
    c.budget = b;
    loip_loader *l;
    CHECK(loip_loader_new(&c, &l) == 0, "loader: %s", loip_last_error());
    CHECK(account(b, "slots", NULL) == 2 * (10 * MiB + 4096), "slots charged");
    CHECK(account(b, "scratch", NULL) == 1 * MiB, "bounce buffer charged");
    c.n_slots = 1;
    loip_loader *l2;
    CHECK(loip_loader_new(&c, &l2) == LOIP_ENOMEM && !l2, "second loader refused");
    CHECK(strstr(loip_last_error(), "slots needs") != NULL, "%s", loip_last_error());
    loip_loader_free(l);
    CHECK(account(b, "slots", NULL) == 0 && account(b, "scratch", NULL) == 0, "slots released");
    loip_charge *ch;
    CHECK(loip_charge_new(b, "mapped", 1 * MiB, &ch) == 0, "charge");
    CHECK(account(b, "mapped", NULL) == 1 * MiB, "charge held");
    loip_charge_free(ch);
    CHECK(account(b, "mapped", NULL) == 0, "charge released");
    loip_buffer_free(NULL);
    loip_charge_free(NULL);
    loip_budget_free(b); /* the buffer still holds a reference */
    CHECK(loip_buffer_size(buf) == 40 * MiB, "buffer outlives the caller's budget handle");
    loip_buffer_free(buf);
    CHECK(loip_buffer_new_charged(NULL, NULL, 100, &buf) == 0, "uncharged");
    loip_buffer_free(buf);

    /* several threads charging one budget */
    CHECK(loip_budget_new(1000 * 100 + 4 * 1000, &b) == 0, "new");
    pthread_t th[4];
    worker w[4] = {{b, "kv", 0}, {b, "kv", 0}, {b, "activations", 0}, {b, "slots", 0}};
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, charge_loop, &w[i]);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) CHECK(w[i].refused == 0, "thread %d refused %d", i, w[i].refused);
    CHECK(account(b, "kv", NULL) == 2000 && account(b, "activations", NULL) == 1000 &&
          account(b, "slots", NULL) == 1000, "per-account totals");
    CHECK(loip_budget_used(b) == 4000, "used %llu", (unsigned long long)loip_budget_used(b));
    CHECK(loip_budget_peak(b) <= 4000 + 4 * 100, "peak %llu", (unsigned long long)loip_budget_peak(b));
    loip_budget_free(b);

    reserved_edges();

    printf("test_budget: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
