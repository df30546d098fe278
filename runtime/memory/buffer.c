/* Buffers (aligned and zeroed, or a reserved mapping) whose bytes are charged to a budget's
 * account, and the ranges of a reserved one given back and taken again. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/core.h"
#include "memory/budget.h"

struct loip_buffer {
    void *data;
    uint64_t size;
    loip_budget *budget; /* NULL, or charged `charged` bytes to account (a reference held) */
    uint64_t charged;    /* size, less the ranges given back (loip_buffer_drop_range) */
    int mapped;          /* an anonymous mapping (loip_buffer_new_reserved), else aligned heap */
    char account[LOIP_BUDGET_NAME_MAX];
};

LOIP_API int loip_buffer_new_charged(loip_budget *budget, const char *account, uint64_t bytes,
                                     loip_buffer **out) {
    *out = NULL;
    if (budget) {
        int rc = loip_budget_charge(budget, account, bytes);
        if (rc) return rc;
    }
    loip_buffer *b = calloc(1, sizeof *b);
    void *p = b ? loip_aligned_alloc(bytes) : NULL;
    if (!p) {
        free(b);
        if (budget) loip_budget_release(budget, account, bytes);
        return loip_fail(LOIP_ENOMEM, "buffer: cannot allocate %llu bytes",
                         (unsigned long long)bytes);
    }
    memset(p, 0, bytes);
    b->data = p;
    b->size = b->charged = bytes;
    if (budget) {
        b->budget = loip_budget_retain(budget);
        snprintf(b->account, sizeof b->account, "%s", account);
    }
    *out = b;
    return LOIP_OK;
}

LOIP_API int loip_buffer_new(uint64_t bytes, loip_buffer **out) {
    return loip_buffer_new_charged(NULL, NULL, bytes, out);
}

LOIP_API int loip_buffer_new_reserved(loip_budget *budget, const char *account, uint64_t bytes,
                                      loip_buffer **out) {
    *out = NULL;
    if (bytes == 0) bytes = 4096;
    bytes = (bytes + 4095) / 4096 * 4096;
    loip_buffer *b = calloc(1, sizeof *b);
    if (!b) return loip_fail(LOIP_ENOMEM, "buffer: out of memory");
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        free(b);
        return loip_fail(LOIP_ENOMEM, "buffer: cannot reserve %llu bytes", (unsigned long long)bytes);
    }
    if (bytes >= (2u << 20)) madvise(p, bytes, MADV_HUGEPAGE);
    b->data = p, b->size = bytes, b->charged = 0, b->mapped = 1;
    if (budget) {
        b->budget = loip_budget_retain(budget);
        snprintf(b->account, sizeof b->account, "%s", account);
    }
    *out = b;
    return LOIP_OK;
}

LOIP_API void loip_buffer_free(loip_buffer *b) {
    if (!b) return;
    if (b->mapped) munmap(b->data, b->size);
    else loip_aligned_free(b->data);
    if (b->budget) {
        loip_budget_release(b->budget, b->account, b->charged);
        loip_budget_free(b->budget);
    }
    free(b);
}

static int range_ok(const loip_buffer *b, uint64_t offset, uint64_t bytes) {
    if (offset % 4096 || bytes % 4096 || offset > b->size || bytes > b->size - offset)
        return loip_fail(LOIP_EINVAL, "buffer: range [%llu, +%llu) is not whole pages inside %llu bytes",
                         (unsigned long long)offset, (unsigned long long)bytes, (unsigned long long)b->size);
    return LOIP_OK;
}

LOIP_API int loip_buffer_drop_range(loip_buffer *b, uint64_t offset, uint64_t bytes) {
    int rc = range_ok(b, offset, bytes);
    if (rc) return rc;
    if (bytes > b->charged) return loip_fail(LOIP_ESTATE, "buffer: dropping more than it holds");
    madvise((uint8_t *)b->data + offset, bytes, MADV_DONTNEED);
    if (b->budget) loip_budget_release(b->budget, b->account, bytes);
    b->charged -= bytes;
    return LOIP_OK;
}

/* A reserved buffer asks for huge pages, but a range is charged to the byte: a huge page that
 * straddles one of its ends would make resident up to 2 MiB beside it that no account holds
 * (the room of a neighbouring block left on disk; one device with alternating offloaded blocks
 * held ~100 MB so). The huge-page windows a range only partly covers are backed by small pages;
 * only those wholly inside a range are huge. */
static void small_page_edges(loip_buffer *b, uint64_t offset, uint64_t bytes) {
    const uintptr_t huge = 2u << 20;
    uintptr_t lo = (uintptr_t)b->data, hi = lo + b->size;
    uintptr_t a = lo + offset, e = a + bytes;
    uintptr_t w[2] = { a & ~(huge - 1), e & ~(huge - 1) };
    for (int k = 0; k < 2; k++) {
        uintptr_t w0 = w[k], w1 = w[k] + huge;
        if (k == 1 && (w0 == w[0] || w0 == e)) continue; /* the same window, or e on a boundary */
        if (w0 >= a && w1 <= e) continue;                 /* wholly inside the range */
        if (w0 < lo) w0 = lo;
        if (w1 > hi) w1 = hi;
        if (w1 > w0) madvise((void *)w0, w1 - w0, MADV_NOHUGEPAGE);
    }
}

LOIP_API int loip_buffer_take_range(loip_buffer *b, uint64_t offset, uint64_t bytes) {
    int rc = range_ok(b, offset, bytes);
    if (rc) return rc;
    if (b->charged + bytes > b->size) return loip_fail(LOIP_ESTATE, "buffer: taking back more than it dropped");
    if (b->budget && (rc = loip_budget_charge(b->budget, b->account, bytes))) return rc;
    b->charged += bytes;
    if (b->mapped && bytes > 0) small_page_edges(b, offset, bytes);
    /* made resident now, by the CPU: pages first populated by an O_DIRECT read into the mapping
     * cost the first computation over them a page walk each (1.6 ms for stories260K's first step) */
    memset((uint8_t *)b->data + offset, 0, bytes);
    return LOIP_OK;
}

LOIP_API void *loip_buffer_data(loip_buffer *b) { return b->data; }
LOIP_API uint64_t loip_buffer_size(const loip_buffer *b) { return b->size; }
