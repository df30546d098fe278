/* Internal: what the runner (runner.c) needs of a session (forward.c) besides the public API. */
#ifndef LOIP_SESSION_H
#define LOIP_SESSION_H

#include "loip.h"

/* The session's own hidden state, (max_batch, dim) fp32, as loip_session_forward uses it. */
float *loip_session_hidden(loip_session *s);
int32_t loip_session_max_batch(const loip_session *s);
const loip_model *loip_session_model(const loip_session *s);

/* Make n tokens the session's batch: token t is of sequence toks[t].seq at position
 * toks[t].pos, or (toks NULL) of sequence 0 at pos + t. Checks them, maps the KV groups their
 * positions need (LOIP_ENOMEM when the pool has none left) and computes their RoPE angles. */
int loip_session_prepare(loip_session *s, int32_t n, const loip_batch_token *toks, int32_t pos);
/* Blocks [first, last) over hidden [n, dim] of the prepared batch. */
int loip_session_run(loip_session *s, int32_t first, int32_t last, float *hidden);

#endif
