/* libFuzzer target: a Hugging Face tokenizer.json as loip reads it in C: the spans of
 * model.vocab and model.merges (loip_bpe_json_spans, which checks the whole text is JSON), the
 * vocabulary and the merges added from them, the setup finished, and a text encoded. */
#include <stddef.h>
#include <stdint.h>

#include "loip.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    int64_t spans[4];
    if (loip_bpe_json_spans(text, size, spans) != 0) return 0;
    loip_bpe *b = NULL;
    if (loip_bpe_new(LOIP_BPE_BYTELEVEL | LOIP_BPE_GPT2_SPELLING, &b) != 0) return 0;
    int ok = 1;
    if (spans[0] >= 0) ok = loip_bpe_add_vocab_json(b, text, (size_t)spans[0], (size_t)spans[1]) == 0;
    if (ok && spans[2] >= 0) ok = loip_bpe_add_merges_json(b, text, (size_t)spans[2], (size_t)spans[3]) == 0;
    if (ok && loip_bpe_finish(b) == 0) {
        int32_t ids[64], n;
        static const char sample[] = "Hello, world! 123 naïve café";
        loip_bpe_encode(b, NULL, sample, sizeof sample - 1, ids, 64, &n);
    }
    loip_bpe_free(b);
    return 0;
}
