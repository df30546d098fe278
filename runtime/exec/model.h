/* Internal: the model object shared by model.c and forward.c. */
#ifndef LOIP_MODEL_H
#define LOIP_MODEL_H

#include "loip.h"

struct loip_model {
    loip_model_config cfg;
    loip_tensor global[LOIP_W_LM_HEAD + 1]; /* embed, output_norm, lm_head */
    loip_tensor *layers;                     /* (n_layers, LOIP_W_COUNT) */
    loip_tensor *experts;                    /* (n_layers, n_experts, LOIP_EXPERT_PARTS): data NULL
                                                when not in memory (the expert cache reads it) */
    float *ones;                             /* (max(dim, head_dim)) 1.0f: norm_add_one's unit weight */
    float *inv_freq;                         /* (head_dim/2) RoPE inverse frequencies, then (head_dim/2)
                                                the windowed layers' (rope_local_theta > 0) */
    loip_rows *rows[LOIP_W_LM_HEAD + 1];     /* the embedding or head read from its file instead
                                                (loip_model_bind_rows; NULL: in memory, global[]) */
    float rope_mscale;                       /* cos and sin scaled by it (YaRN's attention factor; else 1) */
};

static inline const loip_tensor *loip_layer_w(const loip_model *m, int layer, int which) {
    return &m->layers[(size_t)layer * LOIP_W_COUNT + which];
}

static inline const loip_tensor *loip_expert_w(const loip_model *m, int layer, int expert, int part) {
    return &m->experts[((size_t)layer * m->cfg.n_experts + (size_t)expert) * LOIP_EXPERT_PARTS + part];
}

/* Element i of a bound F32/BF16/F16 tensor, as a float (biases, sinks). */
float loip_tensor_elem(const loip_tensor *t, size_t i);
const char *loip_weight_name(int which);
/* The block (LOIP_BLOCK_MHA or _MLP) a layer's weight kind belongs to. */
int loip_weight_block(int which);
/* Expected [rows, cols] of an expert's part (LOIP_EXPERT_*). */
void loip_expert_shape(const loip_model_config *c, int part, int64_t *rows, int64_t *cols);
/* Moves up to cap of the count events buffered at ev, oldest first, into out; returns how many
 * (the runner's and the expert cache's event buffers: loip_runner_events, loip_experts_events). */
int loip_events_take(loip_runner_event *ev, int32_t *count, loip_runner_event *out, int32_t cap);
/* The weights and the tensor check shared by loip_model_bind and loip_model_bind_expert. */
int loip_check_tensor(const char *name, const loip_tensor *t, int64_t rows, int64_t cols);
/* The weights of blocks [first, last) are bound (block 2l: layer l's MHA, 2l+1: its MLP); the
 * embedding and head are not checked. */
int loip_model_check_blocks(const loip_model *m, int32_t first, int32_t last);
/* (rows.c) The head's logits of n tokens (x: their normed states, [n, cols]) into logits
 * ([n, rows]), the table read chunk by chunk; whether r is a [rows, cols] table. */
int loip_rows_head(loip_rows *r, loip_pool *pool, const float *x, int32_t n, float *logits);
/* The same for the table's rows [first, last) alone (logits: the whole [n, rows] buffer). */
int loip_rows_head_range(loip_rows *r, loip_pool *pool, const float *x, int32_t n, int64_t first, int64_t last,
                         float *logits);
int loip_rows_fits(const loip_rows *r, int64_t rows, int64_t cols);
int32_t loip_rows_dtype(const loip_rows *r);

#endif
