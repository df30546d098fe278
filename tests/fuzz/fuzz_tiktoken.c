/* libFuzzer target: a tiktoken rank file ("base64 rank" lines) as loip reads it: the tokens
 * added, the merges derived from them, and a text encoded. */
#include <stddef.h>
#include <stdint.h>

#include "loip.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    loip_bpe *b = NULL;
    if (loip_bpe_new(LOIP_BPE_BYTELEVEL | LOIP_BPE_IGNORE_MERGES, &b) != 0) return 0;
    if (loip_bpe_add_tiktoken(b, (const char *)data, size) == 0 && loip_bpe_derive_merges(b, LOIP_BPE_MERGES_BY_ID) == 0 &&
        loip_bpe_finish(b) == 0) {
        int32_t ids[64], n;
        static const char sample[] = "Hello, world! 123 naïve café";
        loip_bpe_encode(b, NULL, sample, sizeof sample - 1, ids, 64, &n);
    }
    loip_bpe_free(b);
    return 0;
}
