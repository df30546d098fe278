/* Internal: the mixture-of-experts MLP of the forward pass and its scratch (moe.c). */
#ifndef LOIP_MOE_H
#define LOIP_MOE_H

#include "loip.h"

typedef struct loip_moe loip_moe;

/* Bytes of the scratch loip_moe_new allocates for a batch of max_batch rows (charged with the
 * session's to "activations"); 0 for a model without experts. */
uint64_t loip_moe_scratch_bytes(const loip_model_config *c, int32_t max_batch);
/* The scratch of a model's MoE layers (*out NULL for a model without experts). */
int loip_moe_new(const loip_model_config *c, int32_t max_batch, loip_moe **out);
void loip_moe_free(loip_moe *mo);

/* xb2 = the layer's experts (and shared expert) over the n rows of xb (ffn_norm applied). */
int loip_moe_ffn(loip_session *s, int layer, int n);
/* Pre-gating: the routers of layer and the prefetch depth's next layers over the layer's
 * input hidden [n, dim]; the experts they predict start loading in the expert cache. */
void loip_moe_predict(loip_session *s, int layer, const float *hidden, int n);

#endif
