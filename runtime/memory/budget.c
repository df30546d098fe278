/* Memory budgets: a limit and named accounts that every allocation of a device is charged to,
 * so that a plan that does not fit fails with a message naming what did not fit, before the
 * allocation. One mutex per budget: charges happen at allocation time (model open, session
 * creation, slot setup), never per token. Reference counted so that charged objects freed by
 * the Lua GC in any order never touch a freed budget. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "memory/budget.h"

struct loip_budget {
    pthread_mutex_t mu;
    atomic_int refs;
    uint64_t limit; /* 0: unlimited */
    uint64_t used, peak;
    int32_t n;
    loip_budget_account acc[LOIP_BUDGET_MAX_ACCOUNTS];
};

/* bytes in the largest unit under it with `digits` decimals (-1: the usual, 1 below GiB, 2 from it) */
static const char *format_digits(uint64_t bytes, int digits, char *buf, size_t cap) {
    static const char *units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, u++;
    if (digits < 0) digits = u >= 3 ? 2 : 1;
    if (u == 0) snprintf(buf, cap, "%llu bytes", (unsigned long long)bytes);
    else snprintf(buf, cap, "%.*f %s", digits, v, units[u]);
    return buf;
}

const char *loip_format_bytes(uint64_t bytes, char *buf, size_t cap) { return format_digits(bytes, -1, buf, cap); }

/* Two figures of one message (what is asked beside what is left): when they differ but would
 * print the same, both with the digits it takes to differ ("asks 3.02 MiB ... 3.00 MiB left"),
 * as loip.runtime.memory.format_bytes(n, beside) prints them on the Lua side. */
static void format_pair(uint64_t a, char *abuf, uint64_t b, char *bbuf, size_t cap) {
    format_digits(a, -1, abuf, cap);
    format_digits(b, -1, bbuf, cap);
    for (int d = 2; a != b && d <= 9 && strcmp(abuf, bbuf) == 0; d++) {
        format_digits(a, d, abuf, cap);
        format_digits(b, d, bbuf, cap);
    }
}

LOIP_API int loip_budget_new(uint64_t limit, loip_budget **out) {
    *out = NULL;
    loip_budget *b = calloc(1, sizeof *b);
    if (!b) return loip_fail(LOIP_ENOMEM, "budget: out of memory");
    pthread_mutex_init(&b->mu, NULL);
    atomic_init(&b->refs, 1);
    b->limit = limit;
    *out = b;
    return LOIP_OK;
}

loip_budget *loip_budget_retain(loip_budget *b) {
    if (b) atomic_fetch_add(&b->refs, 1);
    return b;
}

LOIP_API void loip_budget_free(loip_budget *b) {
    if (!b || atomic_fetch_sub(&b->refs, 1) != 1) return;
    pthread_mutex_destroy(&b->mu);
    free(b);
}

LOIP_API uint64_t loip_budget_limit(const loip_budget *b) { return b->limit; }

LOIP_API uint64_t loip_budget_used(const loip_budget *b) {
    loip_budget *m = (loip_budget *)b;
    pthread_mutex_lock(&m->mu);
    uint64_t v = m->used;
    pthread_mutex_unlock(&m->mu);
    return v;
}

LOIP_API uint64_t loip_budget_peak(const loip_budget *b) {
    loip_budget *m = (loip_budget *)b;
    pthread_mutex_lock(&m->mu);
    uint64_t v = m->peak;
    pthread_mutex_unlock(&m->mu);
    return v;
}

static loip_budget_account *find(loip_budget *b, const char *name) {
    for (int32_t i = 0; i < b->n; i++)
        if (!strcmp(b->acc[i].name, name)) return &b->acc[i];
    return NULL;
}

LOIP_API int loip_budget_charge(loip_budget *b, const char *account, uint64_t bytes) {
    if (!account || !account[0] || strlen(account) >= LOIP_BUDGET_NAME_MAX)
        return loip_fail(LOIP_EINVAL, "memory budget: account name '%s' must have 1 to %d bytes",
                         account ? account : "(null)", LOIP_BUDGET_NAME_MAX - 1);
    pthread_mutex_lock(&b->mu);
    loip_budget_account *a = find(b, account);
    if (!a && b->n == LOIP_BUDGET_MAX_ACCOUNTS) {
        pthread_mutex_unlock(&b->mu);
        return loip_fail(LOIP_EINVAL, "memory budget: more than %d accounts (adding '%s')",
                         LOIP_BUDGET_MAX_ACCOUNTS, account);
    }
    if (b->limit && (bytes > b->limit || b->used > b->limit - bytes)) {
        /* "kv needs 512.0 MiB more but only 120.3 MiB of the 1.50 GiB budget is left
         * (weights 1.20 GiB, slots 200.0 MiB)" */
        char need[32], left[32], lim[32], held[512], one[32];
        uint64_t free_bytes = b->used < b->limit ? b->limit - b->used : 0;
        size_t off = 0;
        held[0] = 0;
        for (int32_t i = 0; i < b->n && off < sizeof held; i++) {
            if (!b->acc[i].bytes) continue;
            int w = snprintf(held + off, sizeof held - off, "%s%s %s", off ? ", " : "",
                             b->acc[i].name, loip_format_bytes(b->acc[i].bytes, one, sizeof one));
            if (w > 0) off += (size_t)w;
        }
        loip_format_bytes(bytes - free_bytes, need, sizeof need);
        loip_format_bytes(b->limit, lim, sizeof lim);
        char total[32];
        format_pair(bytes, total, free_bytes, left, sizeof total);
        pthread_mutex_unlock(&b->mu);
        return loip_fail(LOIP_ENOMEM,
                         "memory budget: %s needs %s more (asks %s) but only %s of the %s budget "
                         "is left (%s)",
                         account, need, total, left, lim, held[0] ? held : "nothing charged yet");
    }
    if (!a) {
        a = &b->acc[b->n++];
        memset(a, 0, sizeof *a);
        strcpy(a->name, account);
    }
    a->bytes += bytes;
    if (a->bytes > a->peak) a->peak = a->bytes;
    b->used += bytes;
    if (b->used > b->peak) b->peak = b->used;
    pthread_mutex_unlock(&b->mu);
    return LOIP_OK;
}

LOIP_API void loip_budget_release(loip_budget *b, const char *account, uint64_t bytes) {
    if (!b || !account) return;
    pthread_mutex_lock(&b->mu);
    loip_budget_account *a = find(b, account);
    if (a) {
        if (bytes > a->bytes) bytes = a->bytes;
        a->bytes -= bytes;
        b->used -= bytes;
    }
    pthread_mutex_unlock(&b->mu);
}

LOIP_API int32_t loip_budget_report(const loip_budget *b, loip_budget_account *out, int32_t cap) {
    loip_budget *m = (loip_budget *)b;
    pthread_mutex_lock(&m->mu);
    int32_t n = m->n;
    for (int32_t i = 0; i < n && i < cap; i++) out[i] = m->acc[i];
    pthread_mutex_unlock(&m->mu);
    return n;
}

struct loip_charge {
    loip_budget *budget;
    char account[LOIP_BUDGET_NAME_MAX];
    uint64_t bytes;
};

LOIP_API int loip_charge_new(loip_budget *budget, const char *account, uint64_t bytes,
                             loip_charge **out) {
    *out = NULL;
    if (budget) {
        int rc = loip_budget_charge(budget, account, bytes);
        if (rc) return rc;
    }
    loip_charge *c = calloc(1, sizeof *c);
    if (!c) {
        if (budget) loip_budget_release(budget, account, bytes);
        return loip_fail(LOIP_ENOMEM, "charge: out of memory");
    }
    c->budget = loip_budget_retain(budget);
    if (budget) snprintf(c->account, sizeof c->account, "%s", account);
    c->bytes = bytes;
    *out = c;
    return LOIP_OK;
}

LOIP_API void loip_charge_free(loip_charge *c) {
    if (!c) return;
    if (c->budget) {
        loip_budget_release(c->budget, c->account, c->bytes);
        loip_budget_free(c->budget);
    }
    free(c);
}

int loip_budget_move(loip_budget *b, const char *from, const char *to, uint64_t bytes) {
    if (!b || !bytes) return LOIP_OK;
    pthread_mutex_lock(&b->mu);
    loip_budget_account *f = find(b, from), *t = find(b, to);
    if (!f || f->bytes < bytes || (!t && b->n == LOIP_BUDGET_MAX_ACCOUNTS) || strlen(to) >= LOIP_BUDGET_NAME_MAX) {
        pthread_mutex_unlock(&b->mu);
        return loip_fail(LOIP_ESTATE, "memory budget: cannot move %llu bytes from '%s' to '%s'",
                         (unsigned long long)bytes, from, to);
    }
    if (!t) {
        t = &b->acc[b->n++];
        memset(t, 0, sizeof *t);
        strcpy(t->name, to);
    }
    f->bytes -= bytes, t->bytes += bytes;
    if (t->bytes > t->peak) t->peak = t->bytes;
    pthread_mutex_unlock(&b->mu);
    return LOIP_OK;
}
