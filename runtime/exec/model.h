/* Internal: the model object shared by model.c and forward.c. */
#ifndef LOIP_MODEL_H
#define LOIP_MODEL_H

#include "loip.h"

struct loip_model {
    loip_model_config cfg;
    loip_tensor global[LOIP_W_LM_HEAD + 1]; /* embed, output_norm, lm_head */
    loip_tensor *layers;                     /* (n_layers, LOIP_W_COUNT) */
    float *inv_freq;                         /* (head_dim/2) RoPE inverse frequencies */
};

static inline const loip_tensor *loip_layer_w(const loip_model *m, int layer, int which) {
    return &m->layers[(size_t)layer * LOIP_W_COUNT + which];
}

const char *loip_weight_name(int which);
/* The weights of blocks [first, last) are bound (block 2l: layer l's MHA, 2l+1: its MLP); the
 * embedding and head are not checked. */
int loip_model_check_blocks(const loip_model *m, int32_t first, int32_t last);

#endif
