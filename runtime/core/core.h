/* The runtime's ground floor, under every other part of runtime/ (not part of the public
 * header): the error channel every failure goes through and aligned allocation. Beside it in
 * runtime/core/: the clock and the ABI version (error.c), read-only mappings
 * (memory.c), the CPU's facts and the kernel variant in use (cpu.c, runtime.h), the thread pool
 * (pool.c), float dtypes over whole arrays (dtype.c), the block-quantized ones' shapes and
 * conversions (quant.c), seeded synthetic weights (random.c) and the struct layouts the FFI
 * checks (layout.c). */
#ifndef LOIP_CORE_H
#define LOIP_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "loip.h"

/* Record the message of a failure for loip_last_error() and return code (printf-style). */
int loip_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Clear the message (successful calls need not). */
void loip_clear_error(void);

/* Aligned allocation for large arrays; free with loip_aligned_free. NULL on failure. */
void *loip_aligned_alloc(size_t bytes);
void loip_aligned_free(void *p);

#endif
