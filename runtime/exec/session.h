/* Internal: what the runner (runner.c) needs of a session (forward.c) besides the public API. */
#ifndef LOIP_SESSION_H
#define LOIP_SESSION_H

#include "loip.h"

/* The session's own hidden state, (max_batch, dim) fp32, as loip_session_forward uses it. */
float *loip_session_hidden(loip_session *s);
int32_t loip_session_max_batch(const loip_session *s);
const loip_model *loip_session_model(const loip_session *s);

#endif
