-- Gemma 3, text (Gemma3ForCausalLM, model_type gemma3_text; Gemma3ForConditionalGeneration's
-- language model: its text_config, tensors under language_model.; GGUF gemma3). Llama's layer
-- with:
--   - sliding-window layers, five to one global (layer_types, or sliding_window_pattern: layer l
--     is global when (l + 1) % pattern == 0), the windowed ones rotating with their own base
--     (rope_local_base_freq, unscaled), the global ones with rope_theta and rope_scaling (linear
--     for 4b and 27b): cfg.sliding_window and cfg.layer_types or sliding_window_pattern, read
--     into C's layer_window by hf.windows_of (KV kept per layer: runtime/exec/kv_window.c), and
--     rope_local_theta;
--   - q/k RMSNorm; RMSNorms before and after attention and the MLP (input_layernorm,
--     post_attention_layernorm: C's post_norms; pre_feedforward_layernorm is the ffn_norm,
--     post_feedforward_layernorm); every norm scales by (1 + w) (norm_add_one; llama.cpp's
--     converter stores 1 + w, read as it is);
--   - a GELU (tanh) gate (hidden_activation gelu_pytorch_tanh), embeddings scaled by
--     sqrt(hidden_size) in their dtype, tied; scores scaled by query_pre_attn_scalar^-0.5;
--     final_logit_softcapping when the config has one (Gemma 3 has none); attention logit
--     softcapping refused.
-- transformers' Gemma3TextConfig defaults fill what a config.json leaves out (the 4b and 27b
-- text_configs list only a few fields).
local core = require "loip.core"
local json = require "loip.text.json"
local K = core.constants

local M = { name = "gemma3" }

-- Gemma3TextConfig's defaults (transformers), for fields a config.json may leave out.
local defaults = {
  vocab_size = 262208, hidden_size = 2304, intermediate_size = 9216, num_hidden_layers = 26,
  num_attention_heads = 8, num_key_value_heads = 4, head_dim = 256, hidden_activation = "gelu_pytorch_tanh",
  max_position_embeddings = 131072, rms_norm_eps = 1e-6, rope_theta = 1000000.0, rope_local_base_freq = 10000.0,
  query_pre_attn_scalar = 256, sliding_window = 4096, sliding_window_pattern = 6, tie_word_embeddings = true,
  attention_bias = false,
}

local function is_null(v) return v == nil or v == json.null end

-- transformers' newer rope_parameters ({ full_attention = {...}, sliding_attention = {...} })
-- as the flat fields (rope_theta, rope_scaling, rope_local_base_freq).
local function flat_rope(t, path)
  local rp = t.rope_parameters
  if type(rp) ~= "table" or (rp.full_attention == nil and rp.sliding_attention == nil) then return end
  local full, local_ = rp.full_attention or {}, rp.sliding_attention or {}
  if type(full) ~= "table" or type(local_) ~= "table" then
    error(path .. ": field 'rope_parameters' must hold objects full_attention and sliding_attention", 0)
  end
  if full.rope_theta then t.rope_theta = full.rope_theta end
  if local_.rope_theta then t.rope_local_base_freq = local_.rope_theta end
  local kind = full.rope_type or "default"
  t.rope_scaling = kind ~= "default" and full or json.null
  local lkind = local_.rope_type or "default"
  if lkind ~= "default" then
    error(string.format("%s: field 'rope_parameters' sliding_attention rope_type '%s': only default is supported", path, lkind), 0)
  end
end

-- The config as one flat table (Gemma3ForConditionalGeneration: its text_config, with the top
-- level's architectures and token ids), Gemma3TextConfig's defaults filled in.
local function prepare(cfg, path)
  local t = {}
  local text = cfg.text_config
  if cfg.architectures[1] == "Gemma3ForConditionalGeneration" then
    if type(text) ~= "table" then error(path .. ": field 'text_config' is missing", 0) end
    for k, v in pairs(text) do t[k] = v end
    for _, k in ipairs({ "architectures", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "loip_synthetic",
      "loip_source_format", "loip_norms_shifted" }) do
      if t[k] == nil then t[k] = cfg[k] end
    end
    t.architectures = cfg.architectures
  else
    for k, v in pairs(cfg) do t[k] = v end
  end
  flat_rope(t, path)
  for k, v in pairs(defaults) do if is_null(t[k]) then t[k] = v end end
  return t
end

-- The switches into c (the loip_model_config). The windows (layer_types, or
-- sliding_window_pattern, and sliding_window: prepare fills the defaults) are read by
-- hf.windows_of, as every family's are.
local function config(cfg, path, field, c)
  for _, name in ipairs({ "attn_logit_softcapping" }) do
    if not is_null(cfg[name]) then
      error(string.format("%s: field '%s' is %s: attention logit softcapping is not supported", path, name, tostring(cfg[name])), 0)
    end
  end
  local pattern = field(cfg, path, "sliding_window_pattern", "int", 6)
  if pattern < 1 then error(string.format("%s: field 'sliding_window_pattern' is %d: must be positive", path, pattern), 0) end
  c.rope_local_theta = field(cfg, path, "rope_local_base_freq", "number")
  if not (c.rope_local_theta > 0) then error(path .. ": field 'rope_local_base_freq' must be positive", 0) end
  local scalar = field(cfg, path, "query_pre_attn_scalar", "number")
  if not (scalar > 0) then error(path .. ": field 'query_pre_attn_scalar' must be positive", 0) end
  c.attn_scale = scalar ^ -0.5
  c.embed_scale = math.sqrt(c.dim)
  local cap = cfg.final_logit_softcapping
  if not is_null(cap) then
    if type(cap) ~= "number" or not (cap > 0) then
      error(string.format("%s: field 'final_logit_softcapping' is %s: must be a positive number or null", path, tostring(cap)), 0)
    end
    c.final_softcap = cap
  end
  c.norm_add_one = cfg.loip_norms_shifted and 0 or 1
  c.post_norms = 1
end

local layer = { ["post_attention_layernorm.weight"] = K.W_POST_ATTN_NORM,
  ["pre_feedforward_layernorm.weight"] = K.W_FFN_NORM }

M.classes = {
  Gemma3ForCausalLM = { qkv_bias = "attention_bias", qk_norm = true, layer = layer, prepare = prepare, config = config,
    norms_zero_centred = true },
  -- (the checkpoints Google published: language_model.model.*; saved by transformers 4.52 to 4.57:
  -- model.language_model.*, the head lm_head.*)
  Gemma3ForConditionalGeneration = { qkv_bias = "attention_bias", qk_norm = true, layer = layer, prefix = "language_model.",
    alias = function(name)
      local rest = name:match("^language_model%.model%.(.*)$")
      if rest then return "model.language_model." .. rest end
      return (name:gsub("^language_model%.lm_head%.", "lm_head."))
    end,
    prepare = prepare, config = config, norms_zero_centred = true },
}

M.gguf = {
  gemma3 = { class = "Gemma3ForCausalLM", model_type = "gemma3_text",
    keys = { ["attention.sliding_window"] = "sliding_window", ["rope.freq_base_swa"] = { "rope_local_base_freq", "FLOAT32" } },
    layer = { ["post_attention_norm.weight"] = K.W_POST_ATTN_NORM, ["ffn_norm.weight"] = K.W_FFN_NORM },
    -- As llama.cpp reads it: the windows when attention.sliding_window > 0 (every sixth layer
    -- global, or attention.sliding_window_pattern), the windowed layers' base rope.freq_base_swa
    -- (10000 when absent); the attention scale 1/sqrt(head_dim), 1/sqrt(dim / heads) for the
    -- 62-layer model (27b), as llama.cpp sets it; norms stored as 1 + w.
    config = function(md, cfg, get)
      local a = function(k) return md["gemma3." .. k] end
      cfg.hidden_activation, cfg.hidden_act = "gelu_pytorch_tanh", nil
      cfg.loip_norms_shifted = true
      cfg.attention_bias = false
      local w = a "attention.sliding_window"
      local n = cfg.num_hidden_layers
      if type(w) == "number" and w > 0 then
        cfg.sliding_window = w
        local p = a "attention.sliding_window_pattern"
        local types = {}
        for l = 0, n - 1 do
          local swa
          if type(p) == "table" then swa = p[l + 1] == true
          else swa = (l % (type(p) == "number" and p or 6)) < ((type(p) == "number" and p or 6) - 1) end
          types[l + 1] = swa and "sliding_attention" or "full_attention"
        end
        cfg.layer_types = types
      else
        cfg.layer_types = {} -- (no window: every layer global)
        for l = 1, n do cfg.layer_types[l] = "full_attention" end
      end
      cfg.rope_local_base_freq = get("rope.freq_base_swa", 10000, "number")
      cfg.query_pre_attn_scalar = n == 62 and cfg.hidden_size / cfg.num_attention_heads or cfg.head_dim
      local cap = a "final_logit_softcapping"
      cfg.final_logit_softcapping = type(cap) == "number" and cap > 0 and cap or nil
    end },
}

M.shapes = {
  ["gemma-3-1b"] = { architectures = { "Gemma3ForCausalLM" }, model_type = "gemma3_text", hidden_size = 1152,
    intermediate_size = 6912, num_hidden_layers = 26, num_attention_heads = 4, num_key_value_heads = 1, head_dim = 256,
    vocab_size = 262144, max_position_embeddings = 32768, rms_norm_eps = 1e-6, rope_theta = 1000000.0,
    rope_local_base_freq = 10000.0, query_pre_attn_scalar = 256, sliding_window = 512, sliding_window_pattern = 6,
    hidden_activation = "gelu_pytorch_tanh", tie_word_embeddings = true },
  -- (4b and 27b: the language models of Gemma3ForConditionalGeneration, as a causal LM)
  ["gemma-3-4b"] = { architectures = { "Gemma3ForCausalLM" }, model_type = "gemma3_text", hidden_size = 2560,
    intermediate_size = 10240, num_hidden_layers = 34, num_attention_heads = 8, num_key_value_heads = 4, head_dim = 256,
    vocab_size = 262208, max_position_embeddings = 131072, rms_norm_eps = 1e-6, rope_theta = 1000000.0,
    rope_local_base_freq = 10000.0, rope_scaling = { rope_type = "linear", factor = 8.0 }, query_pre_attn_scalar = 256,
    sliding_window = 1024, sliding_window_pattern = 6, hidden_activation = "gelu_pytorch_tanh", tie_word_embeddings = true },
  ["gemma-3-27b"] = { architectures = { "Gemma3ForCausalLM" }, model_type = "gemma3_text", hidden_size = 5376,
    intermediate_size = 21504, num_hidden_layers = 62, num_attention_heads = 32, num_key_value_heads = 16, head_dim = 128,
    vocab_size = 262208, max_position_embeddings = 131072, rms_norm_eps = 1e-6, rope_theta = 1000000.0,
    rope_local_base_freq = 10000.0, rope_scaling = { rope_type = "linear", factor = 8.0 }, query_pre_attn_scalar = 168,
    sliding_window = 1024, sliding_window_pattern = 6, hidden_activation = "gelu_pytorch_tanh", tie_word_embeddings = true },
}

return M
