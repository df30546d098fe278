/* CRC32C pieces, for checking a file read in pieces that complete out of order (the loader). */
#ifndef LOIP_CRC32C_H
#define LOIP_CRC32C_H

#include <stdint.h>

/* The raw CRC of n bytes continuing c (no inversions), and a raw CRC followed by n zero bytes.
 * loip_crc32c(0, whole) == ~(shift(~0, len) ^ XOR over pieces of shift(raw(0, piece), bytes
 * after it)). */
uint32_t loip_crc32c_raw(uint32_t c, const void *data, uint64_t n);
uint32_t loip_crc32c_shift(uint32_t crc, uint64_t n);

#endif
