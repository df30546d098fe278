/* Thread-local error messages: C returns codes, Lua reads the detail with loip_last_error(). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "core/core.h"

static _Thread_local char last_error[1024];

int loip_fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return code;
}

void loip_clear_error(void) { last_error[0] = '\0'; }

LOIP_API const char *loip_last_error(void) { return last_error; }

LOIP_API int loip_abi_version(void) { return LOIP_ABI_VERSION; }

LOIP_API const char *loip_version_string(void) { return "0.1.0"; }

LOIP_API uint64_t loip_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void *loip_aligned_alloc(size_t bytes) {
    void *p = NULL;
    const size_t huge = 2u << 20;
    if (bytes == 0) bytes = 64;
    /* Large arrays (weights, KV cache) stream through the TLB: align them to a huge page and
     * ask for huge pages. */
    size_t align = bytes >= huge ? huge : 64;
    if (posix_memalign(&p, align, bytes) != 0) return NULL;
    if (align == huge) madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

void loip_aligned_free(void *p) { free(p); }
