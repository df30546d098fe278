/* Thread-local error messages (C returns codes, Lua reads the detail with loip_last_error()),
 * the ABI version and the clock. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/core.h"

static _Thread_local char last_error[1024];

int loip_fail(int code, const char *fmt, ...) {
    /* formatted apart first: a message may quote the one before it (loip_last_error()) */
    char msg[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(last_error, msg, sizeof msg);
    return code;
}

void loip_clear_error(void) { last_error[0] = '\0'; }

LOIP_API const char *loip_last_error(void) { return last_error; }

LOIP_API int loip_abi_version(void) { return LOIP_ABI_VERSION; }


LOIP_API uint64_t loip_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
