-- gpt-oss (GptOssForCausalLM; GGUF gpt-oss, llama.cpp's "openai-moe"): a mixture of experts in
-- every layer with
--   - attention sinks: a learned logit per head in each softmax's denominator (self_attn.sinks,
--     GGUF attn_sinks.weight);
--   - biases on q, k, v and o (attention_bias), on the router and on every expert's projections;
--   - routing: the top 4 router logits, then a softmax over those 4 (not a softmax then top-k);
--   - the experts' clamped SwiGLU: g = min(gate, 7), u = clamp(up, -7, 7),
--     g * sigmoid(1.702 g) * (u + 1) (swiglu_limit; transformers' GptOssExperts, ggml's
--     swiglu_oai);
--   - YaRN RoPE (factor 32 over 4096 positions, rotate-half pairs) with its attention factor, and
--     the correction range not truncated (the config's truncate: false; llama.cpp truncates);
--   - sliding-window (128) and full attention alternating (layer_types), which the window switch
--     of the forward runs (cfg.sliding_window, cfg.layer_types).
-- Hugging Face keeps a layer's experts in fused tensors: gate_up_proj [experts, dim, 2 x ffn]
-- (its columns gate and up interleaved) and down_proj [experts, ffn, dim], both transposed to
-- loip's [rows, cols], with gate_up_proj_bias [experts, 2 x ffn] interleaved the same way: each
-- expert's matrices are derived from them (llama.cpp's converter cuts them the same way into
-- GGUF's ffn_{gate,up,down}_exps). As released they are MXFP4 (quantization_config): *_blocks
-- [experts, rows, cols/32, 16] and *_scales [experts, rows, cols/32], rows being outputs (gate's
-- and up's interleaved), repacked into GGUF's block_mxfp4 and kept MXFP4. GGUF's
-- post_attention_norm is the MLP's norm.
local core = require "loip.core"
local derive = require "loip.model.derive"
local K = core.constants
local gather, mxfp4_rows, ELEM = derive.gather, derive.mxfp4_rows, derive.ELEM

local M = { name = "gpt_oss" }

-- The MXFP4 sources blocks/scales (U8) are of the shapes an expert tensor of rows x cols needs.
local function check_mxfp4(src, bname, sname, E, rows, cols)
  local b, s = src[bname], src[sname]
  local nb = cols / 32
  local function same(t, want)
    if t.dtype ~= "U8" or #t.shape ~= #want then return false end
    for i = 1, #want do if t.shape[i] ~= want[i] then return false end end
    return true
  end
  if cols % 32 ~= 0 then return nil, string.format("%s: tensor '%s': %d columns are not whole MXFP4 blocks of 32", b.path, bname, cols) end
  if not same(b, { E, rows, nb, 16 }) then
    return nil, string.format("%s: tensor '%s' is %s [%s], expected U8 [%d, %d, %d, 16] (MXFP4 blocks)", b.path, bname, b.dtype,
      table.concat(b.shape, ", "), E, rows, nb)
  end
  if not same(s, { E, rows, nb }) then
    return nil, string.format("%s: tensor '%s' is %s [%s], expected U8 [%d, %d, %d] (the scales of '%s')", s.path, sname, s.dtype,
      table.concat(s.shape, ", "), E, rows, nb, bname)
  end
  return true
end

-- The source s is of shape want and a dtype loip computes with; else nil and the message.
local function check(s, name, want)
  local ok = ELEM[s.dtype] and #s.shape == #want
  for i = 1, #want do ok = ok and s.shape[i] == want[i] end
  if ok then return true end
  return nil, string.format("%s: tensor '%s' is %s [%s], expected F32, BF16 or F16 [%s]", s.path, name, s.dtype,
    table.concat(s.shape, ", "), table.concat(want, ", "))
end

-- The weight list's entries of layer l's experts (hf.weight_list: moe.list; a routed expert's
-- part p is weight kind W_EXPERT + p, hf.W_EXPERT): the three bias
-- tensors (a row per expert), then each expert's gate, up and down, derived from the fused tensors.
local function experts_list(c, l, prefix, W_EXPERT)
  local E, D, F = c.n_experts, c.dim, c.expert_dim
  local p = prefix .. "mlp.experts."
  local gu, down, gub = p .. "gate_up_proj", p .. "down_proj", p .. "gate_up_proj_bias"
  local list = {}
  local function add(w) list[#list + 1] = w end
  -- biases: gate's and up's from the interleaved gate_up_proj_bias, down's as it is
  for i, kind in ipairs({ K.W_EXPERT_GATE_BIAS, K.W_EXPERT_UP_BIAS }) do
    add({ l, kind, gub .. (i == 1 and "[gate]" or "[up]"), sources = { { name = gub, shape = { E, 2 * F } } },
      derive = function(src)
        local s = src[gub]
        local ok, err = check(s, gub, { E, 2 * F })
        if not ok then return nil, err end
        return gather(s, i - 1, E, 2 * F, F, 2)
      end })
  end
  add({ l, K.W_EXPERT_DOWN_BIAS, p .. "down_proj_bias" })
  for x = 0, E - 1 do
    for part = 0, K.EXPERT_PARTS - 1 do
      local is_down = part == K.EXPERT_DOWN
      local from = is_down and down or gu
      local shape = is_down and { E, F, D } or { E, D, 2 * F }
      local w = { l, W_EXPERT + part, string.format("%s[%d].%s", from, x, ({ "gate", "up", "down" })[part + 1]),
        expert = x, part = part, sources = { { name = from, shape = shape } },
        derive = function(src)
          local s = src[from]
          local ok, err = check(s, from, shape)
          if not ok then return nil, err end
          if is_down then return gather(s, x * F * D, D, 1, F, D) end -- [dim, ffn]: the transpose
          return gather(s, x * D * 2 * F + part, F, 2, D, 2 * F)     -- gate: even columns, up: odd
        end }
      -- as released (quantization_config.quant_method "mxfp4"): rows are outputs, gate's and
      -- up's interleaved; kept MXFP4
      local bname, sname = from .. "_blocks", from .. "_scales"
      local rows, cols = is_down and D or 2 * F, is_down and F or D
      w.mxfp4 = { sources = { { name = bname, shape = { E, rows, cols / 32, 16 }, dtype = "U8", fill = "mxfp4_blocks" },
          { name = sname, shape = { E, rows, cols / 32 }, dtype = "U8", fill = "mxfp4_scales" } },
        derive = function(src)
          local ok, err = check_mxfp4(src, bname, sname, E, rows, cols)
          if not ok then return nil, err end
          if is_down then return mxfp4_rows(src[bname], src[sname], x, rows, 0, 1, D, F) end
          return mxfp4_rows(src[bname], src[sname], x, rows, part, 2, F, D)
        end }
      add(w)
    end
  end
  return list
end

-- The config's switches beyond the common ones; refuses what the forward does not run.
local function config(cfg, path, field, c)
  local function refuse(name, why, ...) error(string.format("%s: field '%s' " .. why, path, name, ...), 0) end
  c.attn_out_bias = c.qkv_bias
  c.attn_sinks, c.router_bias, c.expert_bias = 1, 1, 1
  c.moe_gating, c.norm_topk_prob = K.GATING_TOPK_SOFTMAX, 0
  c.glu, c.glu_alpha = K.GLU_OAI_CLAMPED, 1.702
  c.glu_limit = field(cfg, path, "swiglu_limit", "number", 7.0)
  if c.glu_limit <= 0 then refuse("swiglu_limit", "is %s: must be positive", c.glu_limit) end
  local types = cfg.layer_types
  if type(types) == "table" then
    if #types ~= c.n_layers then refuse("layer_types", "lists %d layers; the model has %d", #types, c.n_layers) end
    for i, t in ipairs(types) do
      if t ~= "sliding_attention" and t ~= "full_attention" then
        refuse("layer_types", "has '%s' at %d: sliding_attention or full_attention", tostring(t), i)
      end
    end
  end
end

M.classes = {
  GptOssForCausalLM = { qkv_bias = "attention_bias", dense = "Qwen2ForCausalLM",
    -- (the MLP's norm is named as in llama: listed so that the converter finds GGUF's name for it)
    layer = { ["post_attention_layernorm.weight"] = K.W_FFN_NORM },
    experts = { router = "mlp.router.weight", router_bias = "mlp.router.bias", count = "num_local_experts",
      size = "intermediate_size", renormalise = true, list = experts_list },
    config = config },
}

-- llama.cpp's openai-moe: every other layer windowed (attention.sliding_window_pattern, default
-- 2: layers 0, 2, 4, ... slide), YaRN from rope.scaling.* (gguf_model reads them).
M.gguf = {
  ["gpt-oss"] = { class = "GptOssForCausalLM", model_type = "gpt_oss", experts = true,
    keys = { ["attention.sliding_window"] = "sliding_window" },
    layer = { ["post_attention_norm.weight"] = K.W_FFN_NORM, ["attn_output.bias"] = K.W_BO,
      ["attn_sinks.weight"] = K.W_SINKS, ["ffn_gate_inp.bias"] = K.W_ROUTER_BIAS,
      ["ffn_gate_exps.bias"] = K.W_EXPERT_GATE_BIAS, ["ffn_up_exps.bias"] = K.W_EXPERT_UP_BIAS,
      ["ffn_down_exps.bias"] = K.W_EXPERT_DOWN_BIAS },
    config = function(md, cfg, get, path)
      cfg.num_local_experts, cfg.num_experts = cfg.num_experts, nil
      cfg.intermediate_size, cfg.moe_intermediate_size = cfg.moe_intermediate_size, nil
      cfg.norm_topk_prob = nil
      cfg.attention_bias = true
      local scale = get("expert_weights_scale", 0, "number") -- (llama.cpp scales the weights by it)
      if scale ~= 0 and scale ~= 1 then
        error(string.format("%s: metadata gpt-oss.expert_weights_scale is %s: loip runs gpt-oss's experts unscaled", path, scale), 0)
      end
      local w = get("attention.sliding_window", 0)
      if w > 0 then
        cfg.sliding_window = w
        local period = get("attention.sliding_window_pattern", 2)
        cfg.layer_types = {}
        for l = 0, cfg.num_hidden_layers - 1 do
          cfg.layer_types[l + 1] = l % period < period - 1 and "sliding_attention" or "full_attention"
        end
      end
    end },
}

local function layer_types(n)
  local t = {}
  for i = 1, n do t[i] = i % 2 == 1 and "sliding_attention" or "full_attention" end
  return t
end

-- openai/gpt-oss-20b and -120b's config.json (their experts MXFP4: quantization_config)
local function shape(layers, experts)
  return { architectures = { "GptOssForCausalLM" }, model_type = "gpt_oss", hidden_size = 2880, intermediate_size = 2880,
    num_local_experts = experts, num_experts_per_tok = 4, experts_per_token = 4, num_hidden_layers = layers,
    num_attention_heads = 64, num_key_value_heads = 8, head_dim = 64, vocab_size = 201088,
    max_position_embeddings = 131072, initial_context_length = 4096, rms_norm_eps = 1e-5, rope_theta = 150000,
    rope_scaling = { rope_type = "yarn", factor = 32.0, beta_fast = 32.0, beta_slow = 1.0,
      original_max_position_embeddings = 4096, truncate = false },
    attention_bias = true, sliding_window = 128, layer_types = layer_types(layers), swiglu_limit = 7.0,
    quantization_config = { quant_method = "mxfp4",
      modules_to_not_convert = { "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head" } },
    hidden_act = "silu", tie_word_embeddings = false }
end

M.shapes = {
  ["gpt-oss-20b"] = shape(24, 32),
  ["gpt-oss-120b"] = shape(36, 128),
}

return M
