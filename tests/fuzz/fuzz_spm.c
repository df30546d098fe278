/* libFuzzer target: a SentencePiece tokenizer.model (protobuf ModelProto) from bytes
 * (loip_spm_parse), then every piece and field read back. Built with -DLOIP_FUZZ=ON (clang). */
#include <stddef.h>
#include <stdint.h>

#include "loip.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    loip_spm *m = NULL;
    if (loip_spm_parse(data, size, "fuzz", &m) != 0) return 0;
    int32_t n = loip_spm_size(m), v;
    for (int32_t f = 0; f < LOIP_SPM_FIELD_COUNT; f++) loip_spm_get(m, f, &v);
    (void)loip_spm_normalizer_name(m);
    for (int32_t id = 0; id < n; id++) {
        const char *piece;
        int32_t len, type;
        float score;
        loip_spm_piece(m, id, &piece, &len, &score, &type);
    }
    loip_spm_free(m);
    return 0;
}
