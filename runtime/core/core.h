/* Internal helpers shared by the runtime's parts (not part of the public header). */
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

/* CRC32C pieces (crc32c.c): the raw CRC of n bytes continuing c (no inversions), and a raw CRC
 * followed by n zero bytes. loip_crc32c(0, whole) == ~(shift(~0, len) ^ XOR over pieces of
 * shift(raw(0, piece), bytes after it)). */
uint32_t loip_crc32c_raw(uint32_t c, const void *data, uint64_t n);
uint32_t loip_crc32c_shift(uint32_t crc, uint64_t n);

#endif
