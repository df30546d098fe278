/* head_share.c — the output head's logits for a range of vocabulary rows (loip.h,
 * loip_session_head_share): the whole head (loip_session_head_rows) is the range [0, vocab);
 * a plan's head_shares cut it across devices, each computing its rows' logits from the rows
 * normalised by the last device (runtime/worker/head_share.c carries them round the ring).
 *
 * Exactness: each logit is one row's dot product with a normalised hidden row, computed by the
 * same kernel whatever range holds it, so a share's logits are the whole head's bit for bit. */
#include <math.h>
#include <string.h>

#include "core/core.h"
#include "core/pool.h"
#include "exec/model.h"
#include "exec/ops.h"
#include "exec/session.h"

LOIP_API int loip_session_head_share(loip_session *s, const float *normed, int32_t n_rows, int32_t first,
                                     int32_t last, float *logits) {
    const loip_model_config *c = &s->m->cfg;
    int32_t V = c->vocab_size;
    if (first < 0 || last > V || first > last)
        return loip_fail(LOIP_EINVAL, "head: vocabulary rows [%d, %d) of %d", first, last, V);
    if (n_rows > s->max_batch)
        return loip_fail(LOIP_EINVAL, "head: %d rows at once (batch limit %d)", n_rows, s->max_batch);
    if (n_rows <= 0 || first == last) return LOIP_OK;
    int which = c->tied_embeddings ? LOIP_W_EMBED : LOIP_W_LM_HEAD;
    const loip_tensor *W = &s->m->global[which];
    loip_rows *R = W->data ? NULL : s->m->rows[which];
    if (!W->data && !R)
        return loip_fail(LOIP_ESTATE, "weight %s is not bound (the head's rows [%d, %d))",
                         c->tied_embeddings ? "embed" : "lm_head", first, last);
    if (R) {
        int rc = loip_rows_head_range(R, s->pool, normed, n_rows, first, last, logits);
        if (rc) return rc;
    } else {
        uint64_t row = loip_dtype_bytes(W->dtype, 1, c->dim);
        loip_linear_job job[2] = {{.W = (const uint8_t *)W->data + (uint64_t)first * row, .dtype = W->dtype,
                                   .x = normed, .y = logits + first, .n = (size_t)n_rows,
                                   .rows = (size_t)(last - first), .cols = (size_t)c->dim, .ldy = (size_t)V},
                                  {0}};
        loip_linear_run(s->pool, job);
    }
    /* final_softcap: as loip_session_head caps its logits (tanh(l / cap) * cap in fp32) */
    if (c->final_softcap > 0)
        for (int32_t t = 0; t < n_rows; t++)
            for (int32_t i = first; i < last; i++) {
                float *l = logits + (size_t)t * V + i;
                *l = tanhf(*l / c->final_softcap) * c->final_softcap;
            }
    return LOIP_OK;
}
