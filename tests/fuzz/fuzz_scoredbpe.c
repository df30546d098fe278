/* libFuzzer target: a llama2.c tokenizer.bin (scored BPE records: max length, then score,
 * length and bytes per piece) from a file of the input's bytes, read to its end
 * (loip_scoredbpe_open with no vocabulary size), then every piece read back and a text with
 * merges and byte fallback encoded. Built with -DLOIP_FUZZ=ON (clang). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "loip.h"

static int memfd = -1;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (memfd < 0 && (memfd = memfd_create("loip-fuzz", 0)) < 0) return 0;
    if (ftruncate(memfd, 0) != 0 || (size && pwrite(memfd, data, size, 0) != (ssize_t)size)) return 0;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", memfd);
    loip_scoredbpe *t = NULL;
    if (loip_scoredbpe_open(path, 0, &t) != 0) return 0;
    int32_t n = loip_scoredbpe_size(t);
    for (int32_t id = 0; id < n; id++) {
        const char *piece;
        int32_t len;
        float score;
        loip_scoredbpe_piece(t, id, &piece, &len, &score);
    }
    static const char text[] = "Once upon a time, \xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80 zz\x01";
    int32_t ids[256], got = 0;
    loip_scoredbpe_encode(t, text, sizeof text - 1, 1, 1, ids, 256, &got);
    loip_scoredbpe_free(t);
    return 0;
}
