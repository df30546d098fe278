/* libFuzzer target: the transport's message decoder: a header frame (the input's first 64
 * bytes, zero-padded) checked as loip_sock_recv checks it (loip_msg_check) against a payload of
 * the rest, and for data messages the micro-batch's token table read where the check says it is. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "loip.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    loip_msg_header h;
    memset(&h, 0, sizeof h);
    memcpy(&h, data, size < sizeof h ? size : sizeof h);
    uint64_t payload = size > sizeof h ? size - sizeof h : 0;
    if (loip_msg_check(&h, 1u << 20, "fuzz") != 0) return 0;
    if (h.payload_bytes != payload) return 0; /* loip_sock_recv refuses a frame of another size */
    const uint8_t *p = data + sizeof h;
    volatile uint32_t sum = 0; /* the table read (kept: the compiler may not drop it) */
    if (h.kind == LOIP_MSG_TOKENS || h.kind == LOIP_MSG_HIDDEN) {
        uint64_t table = (uint64_t)h.n_tokens * (uint64_t)h.dim * 4;
        for (int32_t t = 0; t < h.n_tokens; t++) {
            loip_step_token e;
            memcpy(&e, p + table + (uint64_t)t * sizeof e, sizeof e);
            sum += (uint32_t)e.seq + (uint32_t)e.pos + (uint32_t)e.flags;
        }
    } else if (h.kind == LOIP_MSG_RESULT) {
        for (int32_t t = 0; t < h.n_tokens; t++) {
            loip_step_output o;
            memcpy(&o, p + (uint64_t)t * sizeof o, sizeof o);
            sum += (uint32_t)o.seq + (uint32_t)o.id;
        }
    }
    (void)sum;
    return 0;
}
