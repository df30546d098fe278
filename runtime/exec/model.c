/* The model: its configuration, the RoPE frequency table, and the weight views Lua binds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "cpu/kernels.h"
#include "exec/model.h"

static const char *const weight_names[LOIP_W_COUNT] = {
    "embed", "output_norm", "lm_head", "attn_norm", "wq", "wk", "wv", "wo", "bq", "bk", "bv",
    "q_norm", "k_norm", "ffn_norm", "gate", "up", "down", "router", "shared_gate",
    "post_attn_norm", "post_ffn_norm",
    "bo", "sinks", "router_bias", "expert_gate_bias", "expert_up_bias", "expert_down_bias",
};
static const char *const expert_part_names[LOIP_EXPERT_PARTS] = {"gate", "up", "down"};

const char *loip_weight_name(int which) {
    return which >= 0 && which < LOIP_W_COUNT ? weight_names[which] : "?";
}

float loip_tensor_elem(const loip_tensor *t, size_t i) {
    switch (t->dtype) {
    case LOIP_F32: return ((const float *)t->data)[i];
    case LOIP_BF16: return loip_bf16_to_f32(((const uint16_t *)t->data)[i]);
    default: return loip_f16_to_f32(((const uint16_t *)t->data)[i]);
    }
}

int loip_weight_block(int which) {
    switch (which) {
    case LOIP_W_POST_ATTN_NORM: case LOIP_W_BO: case LOIP_W_SINKS: return LOIP_BLOCK_MHA;
    case LOIP_W_POST_FFN_NORM: return LOIP_BLOCK_MLP;
    default: return which >= LOIP_W_FFN_NORM ? LOIP_BLOCK_MLP : LOIP_BLOCK_MHA;
    }
}

/* The pair index at which a frequency turns `turns` times over the original context (YaRN's
 * correction dimension, as transformers' find_correction_dim and ggml's corr_dim). */
static double yarn_dim(const loip_model_config *c, double turns) {
    return c->head_dim * log(c->rope_original_max_pos / (turns * 2.0 * M_PI)) / (2.0 * log(c->rope_theta));
}

/* YaRN's blend of pair i's frequency f: interpolated (f / factor) below the ramp's low end,
 * extrapolated (f) past its high end, linear between (transformers' _compute_yarn_parameters;
 * ggml's rope_yarn is the same blend, always truncated). */
static float yarn_freq(const loip_model_config *c, int i, float f) {
    double low = yarn_dim(c, c->rope_beta_fast), high = yarn_dim(c, c->rope_beta_slow);
    if (c->rope_yarn_truncate) low = floor(low), high = ceil(high);
    if (low < 0) low = 0;
    if (high > c->head_dim - 1) high = c->head_dim - 1;
    if (high == low) high += 0.001;
    float ramp = (float)(((double)i - low) / (high - low));
    ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
    float interp = f / c->rope_factor;
    return interp * ramp + f * (1.0f - ramp);
}

/* Inverse frequencies of base theta, computed in float as llama2.c and transformers do; Llama
 * 3's frequency-dependent rescaling (transformers' _compute_llama3_parameters) or linear
 * scaling (each divided by the factor: _compute_linear_scaling_rope_parameters) or YaRN's when
 * scaled. */
static void rope_table(const loip_model_config *c, float theta, int scaled, float *inv_freq) {
    int half = c->head_dim / 2;
    for (int i = 0; i < half; i++) {
        float f = 1.0f / powf(theta, (float)(2 * i) / (float)c->head_dim);
        if (scaled && c->rope_scaling == LOIP_ROPE_SCALING_YARN) f = yarn_freq(c, i, f);
        if (scaled && c->rope_scaling == LOIP_ROPE_SCALING_LINEAR) f = f / c->rope_factor;
        if (scaled && c->rope_scaling == LOIP_ROPE_SCALING_LLAMA3) {
            double old_ctx = c->rope_original_max_pos;
            double low_wavelen = old_ctx / c->rope_low_freq_factor;
            double high_wavelen = old_ctx / c->rope_high_freq_factor;
            double wavelen = 2.0 * M_PI / f;
            if (wavelen > low_wavelen) {
                f = (float)(f / c->rope_factor);
            } else if (wavelen >= high_wavelen) {
                double smooth = (old_ctx / wavelen - c->rope_low_freq_factor) /
                                (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (float)((1.0 - smooth) * f / c->rope_factor + smooth * f);
            }
        }
        inv_freq[i] = f;
    }
}

/* The Gemma-style switches (loip.h): known values, scales positive or 0. */
static int check_switches(const loip_model_config *c) {
    if (c->ffn_act != LOIP_ACT_SILU && c->ffn_act != LOIP_ACT_GELU_TANH)
        return loip_fail(LOIP_EINVAL, "model config: unknown ffn_act %d", c->ffn_act);
    if (c->ffn_act != LOIP_ACT_SILU && c->n_experts)
        return loip_fail(LOIP_EINVAL, "model config: ffn_act %d with experts (only SwiGLU experts are run)",
                         c->ffn_act);
    if (!(c->embed_scale >= 0) || !(c->attn_scale >= 0) || !(c->rope_local_theta >= 0) || !(c->final_softcap >= 0))
        return loip_fail(LOIP_EINVAL, "model config: embed_scale, attn_scale, rope_local_theta and final_softcap must "
                         "be positive or 0 (not used)");
    return LOIP_OK;
}

static int check_config(const loip_model_config *c) {
#define POS(field)                                                                             \
    if (c->field <= 0) return loip_fail(LOIP_EINVAL, "model config: " #field " must be positive, got %d", (int)c->field)
    POS(dim);
    POS(hidden_dim);
    POS(n_layers);
    POS(n_heads);
    POS(n_kv_heads);
    POS(head_dim);
    POS(vocab_size);
    POS(max_seq);
#undef POS
    if (c->n_heads % c->n_kv_heads)
        return loip_fail(LOIP_EINVAL, "model config: n_heads (%d) is not a multiple of n_kv_heads (%d)",
                         c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2)
        return loip_fail(LOIP_EINVAL, "model config: head_dim (%d) must be even for RoPE", c->head_dim);
    if (!(c->norm_eps > 0) || !(c->rope_theta > 0))
        return loip_fail(LOIP_EINVAL, "model config: norm_eps and rope_theta must be positive");
    if (c->rope_layout != LOIP_ROPE_INTERLEAVED && c->rope_layout != LOIP_ROPE_HALF)
        return loip_fail(LOIP_EINVAL, "model config: unknown rope_layout %d", c->rope_layout);
    if (c->rope_scaling == LOIP_ROPE_SCALING_LLAMA3) {
        if (!(c->rope_factor > 0) || !(c->rope_low_freq_factor > 0) ||
            !(c->rope_high_freq_factor > c->rope_low_freq_factor) || c->rope_original_max_pos <= 0)
            return loip_fail(LOIP_EINVAL, "model config: llama3 rope scaling needs factor > 0, "
                                          "high_freq_factor > low_freq_factor > 0 and "
                                          "original_max_position_embeddings > 0");
    } else if (c->rope_scaling == LOIP_ROPE_SCALING_YARN) {
        if (!(c->rope_factor > 0) || c->rope_original_max_pos <= 0 || !(c->rope_beta_fast > c->rope_beta_slow) ||
            !(c->rope_beta_slow > 0) || !(c->rope_attn_factor > 0))
            return loip_fail(LOIP_EINVAL, "model config: yarn rope scaling needs factor > 0, "
                                          "original_max_position_embeddings > 0, beta_fast > beta_slow > 0 "
                                          "and an attention factor > 0");
    } else if (c->rope_scaling == LOIP_ROPE_SCALING_LINEAR) {
        if (!(c->rope_factor > 0)) return loip_fail(LOIP_EINVAL, "model config: linear rope scaling needs factor > 0");
    } else if (c->rope_scaling != LOIP_ROPE_SCALING_NONE) {
        return loip_fail(LOIP_EINVAL, "model config: unknown rope_scaling %d", c->rope_scaling);
    }
    if (c->sliding_window < 0)
        return loip_fail(LOIP_EINVAL, "model config: sliding_window must not be negative, got %d", c->sliding_window);
    if (c->n_experts < 0) return loip_fail(LOIP_EINVAL, "model config: n_experts must not be negative, got %d", c->n_experts);
    if (c->n_experts > 0) {
        if (c->n_experts_used <= 0 || c->n_experts_used > c->n_experts)
            return loip_fail(LOIP_EINVAL, "model config: n_experts_used (%d) must be in 1..n_experts (%d)",
                             c->n_experts_used, c->n_experts);
        if (c->expert_dim <= 0)
            return loip_fail(LOIP_EINVAL, "model config: expert_dim must be positive, got %d", c->expert_dim);
        if (c->shared_expert_gate && !c->shared_expert)
            return loip_fail(LOIP_EINVAL, "model config: shared_expert_gate without a shared_expert");
    } else if (c->n_experts_used || c->expert_dim || c->shared_expert || c->shared_expert_gate || c->router_bias ||
               c->expert_bias || c->moe_gating || c->glu) {
        return loip_fail(LOIP_EINVAL, "model config: n_experts_used, expert_dim, shared_expert, router_bias, expert_bias, "
                         "moe_gating and glu need n_experts > 0");
    }
    if (c->moe_gating != LOIP_GATING_SOFTMAX && c->moe_gating != LOIP_GATING_TOPK_SOFTMAX)
        return loip_fail(LOIP_EINVAL, "model config: unknown moe_gating %d", c->moe_gating);
    if (c->glu == LOIP_GLU_OAI_CLAMPED) {
        if (!(c->glu_alpha > 0) || !(c->glu_limit > 0))
            return loip_fail(LOIP_EINVAL, "model config: the clamped gated unit needs glu_alpha > 0 and glu_limit > 0");
    } else if (c->glu != LOIP_GLU_SILU) {
        return loip_fail(LOIP_EINVAL, "model config: unknown glu %d", c->glu);
    }
    return check_switches(c);
}

LOIP_API int loip_model_new(const loip_model_config *cfg, loip_model **out) {
    *out = NULL;
    int rc = check_config(cfg);
    if (rc) return rc;
    loip_model *m = calloc(1, sizeof *m);
    if (!m) return loip_fail(LOIP_ENOMEM, "model: out of memory");
    m->cfg = *cfg;
    m->layers = calloc((size_t)cfg->n_layers * LOIP_W_COUNT, sizeof(loip_tensor));
    m->inv_freq = calloc((size_t)cfg->head_dim, sizeof(float)); /* global, then local (rope_local_theta) */
    if (cfg->n_experts)
        m->experts = calloc((size_t)cfg->n_layers * cfg->n_experts * LOIP_EXPERT_PARTS, sizeof(loip_tensor));
    if (cfg->norm_add_one) {
        int n = cfg->dim > cfg->head_dim ? cfg->dim : cfg->head_dim;
        if ((m->ones = malloc((size_t)n * sizeof(float))))
            for (int i = 0; i < n; i++) m->ones[i] = 1.0f;
    }
    if (!m->layers || !m->inv_freq || (cfg->n_experts && !m->experts) || (cfg->norm_add_one && !m->ones)) {
        loip_model_free(m);
        return loip_fail(LOIP_ENOMEM, "model: out of memory");
    }
    rope_table(cfg, cfg->rope_theta, 1, m->inv_freq);
    if (cfg->rope_local_theta > 0) rope_table(cfg, cfg->rope_local_theta, 0, m->inv_freq + cfg->head_dim / 2);
    m->rope_mscale = cfg->rope_scaling == LOIP_ROPE_SCALING_YARN ? cfg->rope_attn_factor : 1.0f;
    *out = m;
    return LOIP_OK;
}

LOIP_API void loip_model_free(loip_model *m) {
    if (!m) return;
    free(m->layers);
    free(m->experts);
    free(m->inv_freq);
    free(m->ones);
    free(m);
}

/* Expected shape of a weight: rows, cols (cols = 0 for a vector). */
static void expected_shape(const loip_model_config *c, int which, int64_t *rows, int64_t *cols) {
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    *cols = 0;
    switch (which) {
    case LOIP_W_EMBED: case LOIP_W_LM_HEAD: *rows = c->vocab_size; *cols = c->dim; break;
    case LOIP_W_OUTPUT_NORM: case LOIP_W_ATTN_NORM: case LOIP_W_FFN_NORM: *rows = c->dim; break;
    case LOIP_W_POST_ATTN_NORM: case LOIP_W_POST_FFN_NORM: *rows = c->dim; break;
    case LOIP_W_WQ: *rows = q; *cols = c->dim; break;
    case LOIP_W_WK: case LOIP_W_WV: *rows = kv; *cols = c->dim; break;
    case LOIP_W_WO: *rows = c->dim; *cols = q; break;
    case LOIP_W_BQ: *rows = q; break;
    case LOIP_W_BK: case LOIP_W_BV: *rows = kv; break;
    case LOIP_W_Q_NORM: case LOIP_W_K_NORM: *rows = c->head_dim; break;
    case LOIP_W_GATE: case LOIP_W_UP: *rows = c->hidden_dim; *cols = c->dim; break;
    case LOIP_W_DOWN: *rows = c->dim; *cols = c->hidden_dim; break;
    case LOIP_W_ROUTER: *rows = c->n_experts; *cols = c->dim; break;
    case LOIP_W_SHARED_GATE: *rows = 1; *cols = c->dim; break;
    case LOIP_W_BO: *rows = c->dim; break;
    case LOIP_W_SINKS: *rows = c->n_heads; break;
    case LOIP_W_ROUTER_BIAS: *rows = c->n_experts; break;
    case LOIP_W_EXPERT_GATE_BIAS: case LOIP_W_EXPERT_UP_BIAS: *rows = c->n_experts; *cols = c->expert_dim; break;
    case LOIP_W_EXPERT_DOWN_BIAS: *rows = c->n_experts; *cols = c->dim; break;
    default: *rows = 0; break;
    }
}

void loip_expert_shape(const loip_model_config *c, int part, int64_t *rows, int64_t *cols) {
    *rows = part == LOIP_EXPERT_DOWN ? c->dim : c->expert_dim;
    *cols = part == LOIP_EXPERT_DOWN ? c->expert_dim : c->dim;
}

int loip_check_tensor(const char *name, const loip_tensor *t, int64_t rows, int64_t cols) {
    if (!t->data) return loip_fail(LOIP_EINVAL, "bind %s: no data", name);
    /* the block-quantized dtypes are matrices' (the linear kernels'), never a vector's */
    int quant = t->dtype == LOIP_MXFP4 || t->dtype == LOIP_F8_E4M3;
    if (t->dtype != LOIP_F32 && t->dtype != LOIP_BF16 && t->dtype != LOIP_F16 && !(quant && cols))
        return loip_fail(LOIP_ESHAPE, "%s: dtype %d not supported (F32, BF16, F16%s)", name, t->dtype,
                         quant ? "; MXFP4 and F8_E4M3 for matrices only" : "");
    int want_ndim = cols ? 2 : 1;
    if (t->ndim != want_ndim || t->shape[0] != rows || (cols && t->shape[1] != cols)) {
        char got[96];
        int k = snprintf(got, sizeof got, "[");
        for (int i = 0; i < t->ndim && i < 4 && k < 80; i++)
            k += snprintf(got + k, sizeof got - (size_t)k, i ? ", %lld" : "%lld", (long long)t->shape[i]);
        snprintf(got + k, sizeof got - (size_t)k, "]");
        if (cols)
            return loip_fail(LOIP_ESHAPE, "%s: shape %s, expected [%lld, %lld]", name, got,
                             (long long)rows, (long long)cols);
        return loip_fail(LOIP_ESHAPE, "%s: shape %s, expected [%lld]", name, got, (long long)rows);
    }
    return quant ? loip_dtype_check(t->dtype, rows, cols, name) : LOIP_OK;
}

static int required(const loip_model_config *c, int which) {
    switch (which) {
    case LOIP_W_GATE: case LOIP_W_UP: case LOIP_W_DOWN: return !c->n_experts || c->shared_expert;
    case LOIP_W_ROUTER: return c->n_experts > 0;
    case LOIP_W_SHARED_GATE: return c->shared_expert_gate;
    case LOIP_W_BQ: case LOIP_W_BK: case LOIP_W_BV: return c->qkv_bias;
    case LOIP_W_Q_NORM: case LOIP_W_K_NORM: return c->qk_norm;
    case LOIP_W_LM_HEAD: return !c->tied_embeddings;
    case LOIP_W_POST_ATTN_NORM: case LOIP_W_POST_FFN_NORM: return c->post_norms;
    case LOIP_W_BO: return c->attn_out_bias;
    case LOIP_W_SINKS: return c->attn_sinks;
    case LOIP_W_ROUTER_BIAS: return c->n_experts > 0 && c->router_bias;
    case LOIP_W_EXPERT_GATE_BIAS: case LOIP_W_EXPERT_UP_BIAS: case LOIP_W_EXPERT_DOWN_BIAS:
        return c->n_experts > 0 && c->expert_bias;
    default: return 1;
    }
}

/* The switch a weight kind that only some configs have needs (for messages). */
static const char *switch_of(int which) {
    switch (which) {
    case LOIP_W_BO: return "attn_out_bias is 0";
    case LOIP_W_SINKS: return "attn_sinks is 0";
    case LOIP_W_ROUTER_BIAS: return "router_bias is 0 or no experts";
    case LOIP_W_EXPERT_GATE_BIAS: case LOIP_W_EXPERT_UP_BIAS: case LOIP_W_EXPERT_DOWN_BIAS:
        return "expert_bias is 0 or no experts";
    default: return "not used";
    }
}

static int is_global(int which) { return which <= LOIP_W_LM_HEAD; }

LOIP_API int loip_model_bind(loip_model *m, int32_t layer, int32_t which, const loip_tensor *t) {
    if (which < 0 || which >= LOIP_W_COUNT)
        return loip_fail(LOIP_EINVAL, "bind: unknown weight kind %d", which);
    const char *name = loip_weight_name(which);
    if (is_global(which) ? layer != -1 : (layer < 0 || layer >= m->cfg.n_layers))
        return loip_fail(LOIP_EINVAL, "bind %s: layer %d out of range", name, layer);
    if (which >= LOIP_W_BO && !required(&m->cfg, which)) /* (the bias and sink kinds: only with their switch) */
        return loip_fail(LOIP_EINVAL, "bind %s: the model's config has no such weight (%s)", name, switch_of(which));
    if ((which == LOIP_W_ROUTER || which == LOIP_W_SHARED_GATE) && !m->cfg.n_experts)
        return loip_fail(LOIP_EINVAL, "bind %s: the model has no experts (n_experts 0)", name);
    if (which >= LOIP_W_GATE && which <= LOIP_W_DOWN && m->cfg.n_experts && !m->cfg.shared_expert)
        return loip_fail(LOIP_EINVAL, "bind %s: a mixture of experts without a shared expert has no dense MLP "
                         "(bind its experts with loip_model_bind_expert)", name);
    if (which == LOIP_W_SHARED_GATE && !m->cfg.shared_expert_gate)
        return loip_fail(LOIP_EINVAL, "bind shared_gate: the model's shared expert has no gate");
    int64_t rows, cols;
    expected_shape(&m->cfg, which, &rows, &cols);
    int rc = loip_check_tensor(name, t, rows, cols);
    if (rc) return rc;
    if (which == LOIP_W_EMBED && loip_dtype_size(t->dtype) == 0) /* rows are read one at a time */
        return loip_fail(LOIP_ESHAPE, "%s: dtype %d not supported for the embedding (F32, BF16, F16)", name,
                         t->dtype);
    loip_tensor *slot = is_global(which) ? &m->global[which] : &m->layers[(size_t)layer * LOIP_W_COUNT + which];
    *slot = *t;
    if (is_global(which)) m->rows[which] = NULL; /* (in memory now: loip_model_bind_rows' table no longer used) */
    return LOIP_OK;
}

LOIP_API int loip_model_bind_rows(loip_model *m, int32_t which, loip_rows *r) {
    if (!m || (which != LOIP_W_EMBED && which != LOIP_W_LM_HEAD))
        return loip_fail(LOIP_EINVAL, "bind rows: only the embedding (%d) or the head (%d) is read from its file, not "
                         "kind %d", LOIP_W_EMBED, LOIP_W_LM_HEAD, which);
    if (r && !loip_rows_fits(r, m->cfg.vocab_size, m->cfg.dim))
        return loip_fail(LOIP_ESHAPE, "bind rows %s: the table is not [%d, %d] (vocab_size, dim)",
                         loip_weight_name(which), m->cfg.vocab_size, m->cfg.dim);
    m->rows[which] = r;
    if (r) memset(&m->global[which], 0, sizeof m->global[which]); /* (one or the other) */
    return LOIP_OK;
}

LOIP_API int loip_model_bind_expert(loip_model *m, int32_t layer, int32_t expert, int32_t part,
                                    const loip_tensor *t) {
    const loip_model_config *c = &m->cfg;
    if (c->n_experts == 0) return loip_fail(LOIP_EINVAL, "bind expert: the model has no experts (n_experts 0)");
    if (layer < 0 || layer >= c->n_layers || expert < 0 || expert >= c->n_experts || part < 0 ||
        part >= LOIP_EXPERT_PARTS)
        return loip_fail(LOIP_EINVAL, "bind expert: layer %d, expert %d, part %d out of range (%d layers, %d experts, "
                         "%d parts)", layer, expert, part, c->n_layers, c->n_experts, LOIP_EXPERT_PARTS);
    loip_tensor *slot = &m->experts[((size_t)layer * c->n_experts + (size_t)expert) * LOIP_EXPERT_PARTS + part];
    if (!t || !t->data) {
        memset(slot, 0, sizeof *slot);
        return LOIP_OK;
    }
    char name[64];
    snprintf(name, sizeof name, "expert %d's %s of layer %d", expert, expert_part_names[part], layer);
    int64_t rows, cols;
    loip_expert_shape(c, part, &rows, &cols);
    int rc = loip_check_tensor(name, t, rows, cols);
    if (rc) return rc;
    *slot = *t;
    return LOIP_OK;
}


LOIP_API int loip_model_check(const loip_model *m, int32_t first, int32_t last) {
    if (first < 0 || last > m->cfg.n_layers || first > last)
        return loip_fail(LOIP_EINVAL, "model check: layer range [%d, %d) invalid for %d layers",
                         first, last, m->cfg.n_layers);
    for (int w = 0; w <= LOIP_W_LM_HEAD; w++)
        if (required(&m->cfg, w) && !m->global[w].data && !m->rows[w])
            return loip_fail(LOIP_ESTATE, "weight %s is not bound", loip_weight_name(w));
    for (int l = first; l < last; l++)
        for (int w = LOIP_W_ATTN_NORM; w < LOIP_W_COUNT; w++)
            if (required(&m->cfg, w) && !m->layers[(size_t)l * LOIP_W_COUNT + w].data)
                return loip_fail(LOIP_ESTATE, "weight %s of layer %d is not bound",
                                 loip_weight_name(w), l);
    return LOIP_OK;
}

int loip_model_check_blocks(const loip_model *m, int32_t first, int32_t last) {
    if (first < 0 || last > 2 * m->cfg.n_layers || first > last)
        return loip_fail(LOIP_EINVAL, "model check: block range [%d, %d) invalid for %d blocks",
                         first, last, 2 * m->cfg.n_layers);
    /* (the embedding and head are checked where they are used: a device of a cluster may hold
     * neither) */
    for (int b = first; b < last; b++) {
        int l = b / 2, mlp = b % 2;
        for (int w = LOIP_W_ATTN_NORM; w < LOIP_W_COUNT; w++)
            if ((loip_weight_block(w) == LOIP_BLOCK_MLP) == mlp && required(&m->cfg, w) &&
                !m->layers[(size_t)l * LOIP_W_COUNT + w].data)
                return loip_fail(LOIP_ESTATE, "weight %s of layer %d is not bound",
                                 loip_weight_name(w), l);
    }
    return LOIP_OK;
}

static uint64_t tensor_bytes(const loip_tensor *t) {
    if (!t->data || t->ndim < 1) return 0;
    int64_t rows = 1; /* the leading dimensions as rows of the last: the block dtypes' bytes too */
    for (int i = 0; i + 1 < t->ndim; i++) rows *= t->shape[i];
    return loip_dtype_bytes(t->dtype, rows, t->shape[t->ndim - 1]);
}

LOIP_API uint64_t loip_model_weight_bytes(const loip_model *m) {
    uint64_t total = 0;
    for (int w = 0; w <= LOIP_W_LM_HEAD; w++) total += tensor_bytes(&m->global[w]);
    for (size_t i = 0; i < (size_t)m->cfg.n_layers * LOIP_W_COUNT; i++)
        total += tensor_bytes(&m->layers[i]);
    for (size_t i = 0; i < (size_t)m->cfg.n_layers * m->cfg.n_experts * LOIP_EXPERT_PARTS; i++)
        total += tensor_bytes(&m->experts[i]);
    return total;
}
