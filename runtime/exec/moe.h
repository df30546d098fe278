/* Internal: the mixture-of-experts MLP of the forward pass (moe.c). */
#ifndef LOIP_MOE_H
#define LOIP_MOE_H

#include "loip.h"

/* xb2 = the layer's experts (and shared expert) over the n rows of xb (ffn_norm applied). */
int loip_moe_ffn(loip_session *s, int layer, int n);
/* Pre-gating: the routers of layer and the prefetch depth's next layers over the layer's
 * input hidden [n, dim]; the experts they predict start loading in the expert cache. */
void loip_moe_predict(loip_session *s, int layer, const float *hidden, int n);

#endif
