-- A pure-Lua reference of a dense Llama-style model's logits at every position of a sequence, in
-- double precision, with Hugging Face's sliding-window mask (written from transformers'
-- modeling files and its masking_utils, not from loip's kernels): in a layer whose layer_types
-- entry is "sliding_attention" the query at position p attends to the keys at positions q with
-- p - sliding_window < q <= p; every other layer to 0..p. Grouped-query attention, q/k/v biases
-- when the checkpoint has them (Qwen2), rotate-half RoPE (theta from the config, no scaling),
-- SwiGLU MLP, RMSNorm, tied or separate head; F32 weights.
-- Gemma 3's text layer (modeling_gemma3, Gemma3ForCausalLM): the layers' kinds from layer_types
-- or sliding_window_pattern (every p-th full); RMSNorms scaling by (1 + w); embeddings times
-- sqrt(hidden_size); q/k RMSNorm per head before RoPE; the sliding layers rotating with
-- rope_local_base_freq, the full ones with rope_theta (linear rope_scaling: positions / factor);
-- scores times query_pre_attn_scalar^-0.5; the attention's and the MLP's outputs normalised
-- (post_attention_layernorm, post_feedforward_layernorm) before the residual, the MLP's input by
-- pre_feedforward_layernorm; a GELU (tanh) gate; final_logit_softcapping when set.
--
--   local logits = require("spec.support.window_reference").logits(dir, ids) -- logits[t][v], 0-based
local json = require "loip.text.json"
local safetensors = require "loip.model.safetensors"
local rm = require "spec.support.reference_math"

local M = {}

local rmsnorm, matvec = rm.rmsnorm, rm.matvec

-- rotate-half RoPE of each head of v (n heads of hd) at position pos
local function rope(v, n, hd, pos, theta)
  local half = hd / 2
  for h = 0, n - 1 do
    for i = 0, half - 1 do
      local a = pos * theta ^ (-2 * i / hd)
      local c, s = math.cos(a), math.sin(a)
      local x0, x1 = v[h * hd + i], v[h * hd + i + half]
      v[h * hd + i], v[h * hd + i + half] = x0 * c - x1 * s, x1 * c + x0 * s
    end
  end
end

-- each head of v (n heads of hd) RMS-normalised by w
local function head_norm(v, n, hd, w, eps, plus_one)
  for h = 0, n - 1 do
    local x = {}
    for i = 0, hd - 1 do x[i] = v[h * hd + i] end
    x = rmsnorm(x, w, hd, eps, plus_one)
    for i = 0, hd - 1 do v[h * hd + i] = x[i] end
  end
end

local function gelu_tanh(x) return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ^ 3))) end
local silu = rm.silu

-- The model's switches from its config: { gemma, window, hd, sliding(l), theta(l) (base, position divisor), scale }.
local function shape_of(cfg)
  local gemma = cfg.model_type == "gemma3_text" or (cfg.architectures or {})[1] == "Gemma3ForCausalLM"
  local hd = cfg.head_dim or cfg.hidden_size / cfg.num_attention_heads
  local s = { gemma = gemma, window = cfg.sliding_window or nil, hd = hd }
  local every = cfg.sliding_window_pattern
  function s.sliding(l) -- (the layer's kind; its mask only with a window)
    if type(cfg.layer_types) == "table" then return cfg.layer_types[l + 1] == "sliding_attention" end
    if every then return (l + 1) % every ~= 0 end
    return true
  end
  local rs = cfg.rope_scaling
  local factor = type(rs) == "table" and (rs.rope_type or rs.type) == "linear" and rs.factor or 1
  function s.theta(l)
    if gemma and s.sliding(l) then return cfg.rope_local_base_freq or 10000, 1 end
    return cfg.rope_theta or 10000, factor
  end
  s.scale = gemma and cfg.query_pre_attn_scalar ^ -0.5 or 1 / math.sqrt(hd)
  return s
end

-- Attention of layer l over hs (in place: hs[t] += the block's output).
local function attention(w, cfg, s, l, hs)
  local p, dim, eps, g1 = string.format("model.layers.%d.", l), cfg.hidden_size, cfg.rms_norm_eps, s.gemma
  local heads, kvh, hd = cfg.num_attention_heads, cfg.num_key_value_heads, s.hd
  local theta, factor = s.theta(l)
  local window = s.window and s.sliding(l) and s.window
  local Q, K, V = {}, {}, {}
  for t = 1, #hs do
    local x = rmsnorm(hs[t], w(p .. "input_layernorm.weight"), dim, eps, g1)
    Q[t] = matvec(w(p .. "self_attn.q_proj.weight"), x, heads * hd, dim, w(p .. "self_attn.q_proj.bias", true))
    K[t] = matvec(w(p .. "self_attn.k_proj.weight"), x, kvh * hd, dim, w(p .. "self_attn.k_proj.bias", true))
    V[t] = matvec(w(p .. "self_attn.v_proj.weight"), x, kvh * hd, dim, w(p .. "self_attn.v_proj.bias", true))
    if g1 then
      head_norm(Q[t], heads, hd, w(p .. "self_attn.q_norm.weight"), eps, true)
      head_norm(K[t], kvh, hd, w(p .. "self_attn.k_norm.weight"), eps, true)
    end
    rope(Q[t], heads, hd, (t - 1) / factor, theta)
    rope(K[t], kvh, hd, (t - 1) / factor, theta)
  end
  for t = 1, #hs do
    local att = {}
    for h = 0, heads - 1 do
      local g = math.floor(h / (heads / kvh))
      local first = window and math.max(1, t - window + 1) or 1
      local sc, top = {}, -math.huge
      for u = first, t do
        local d = 0
        for i = 0, hd - 1 do d = d + Q[t][h * hd + i] * K[u][g * hd + i] end
        sc[u] = d * s.scale
        top = math.max(top, sc[u])
      end
      local sum = 0
      for u = first, t do sc[u] = math.exp(sc[u] - top) sum = sum + sc[u] end
      for i = 0, hd - 1 do
        local acc = 0
        for u = first, t do acc = acc + sc[u] / sum * V[u][g * hd + i] end
        att[h * hd + i] = acc
      end
    end
    local a = matvec(w(p .. "self_attn.o_proj.weight"), att, dim, heads * hd)
    if g1 then a = rmsnorm(a, w(p .. "post_attention_layernorm.weight"), dim, eps, true) end
    for i = 0, dim - 1 do hs[t][i] = hs[t][i] + a[i] end
  end
end

-- The MLP of layer l over hs (in place).
local function mlp(w, cfg, s, l, hs)
  local p, dim, eps, ffn = string.format("model.layers.%d.", l), cfg.hidden_size, cfg.rms_norm_eps, cfg.intermediate_size
  local act = s.gemma and gelu_tanh or silu
  for t = 1, #hs do
    local x = s.gemma and rmsnorm(hs[t], w(p .. "pre_feedforward_layernorm.weight"), dim, eps, true)
      or rmsnorm(hs[t], w(p .. "post_attention_layernorm.weight"), dim, eps)
    local gt, up = matvec(w(p .. "mlp.gate_proj.weight"), x, ffn, dim), matvec(w(p .. "mlp.up_proj.weight"), x, ffn, dim)
    for i = 0, ffn - 1 do gt[i] = act(gt[i]) * up[i] end
    local y = matvec(w(p .. "mlp.down_proj.weight"), gt, dim, ffn)
    if s.gemma then y = rmsnorm(y, w(p .. "post_feedforward_layernorm.weight"), dim, eps, true) end
    for i = 0, dim - 1 do hs[t][i] = hs[t][i] + y[i] end
  end
end

-- The logits of every position of ids (1-based list; returns a 1-based list of 0-based tables)
-- of the F32 model in dir. over: config fields used instead of its own (sliding_window = false:
-- no window, to show what the window changes; Gemma's sliding layers keep their RoPE base).
function M.logits(dir, ids, over)
  local cfg = assert(json.load(dir .. "/config.json"))
  for k, v in pairs(over or {}) do cfg[k] = v end
  local set = assert(safetensors.open_dir(dir))
  local w = rm.f32_weights(set)
  local s = shape_of(cfg)
  local dim = cfg.hidden_size
  local hs = {}
  local embed = w("model.embed_tokens.weight")
  for t = 1, #ids do
    hs[t] = {}
    for i = 0, dim - 1 do hs[t][i] = embed[ids[t] * dim + i] * (s.gemma and math.sqrt(dim) or 1) end
  end
  for l = 0, cfg.num_hidden_layers - 1 do
    attention(w, cfg, s, l, hs)
    mlp(w, cfg, s, l, hs)
  end
  local head = w(cfg.tie_word_embeddings and "model.embed_tokens.weight" or "lm_head.weight")
  local cap = type(cfg.final_logit_softcapping) == "number" and cfg.final_logit_softcapping or nil
  local out = {}
  for t = 1, #ids do
    out[t] = matvec(head, rmsnorm(hs[t], w("model.norm.weight"), dim, cfg.rms_norm_eps, s.gemma), cfg.vocab_size, dim)
    if cap then for v = 0, cfg.vocab_size - 1 do out[t][v] = math.tanh(out[t][v] / cap) * cap end end
  end
  safetensors.close(set)
  return out
end

return M
