-- A pure-Lua reference of a dense Llama-style model's logits at every position of a sequence, in
-- double precision, with Hugging Face's sliding-window mask (written from transformers'
-- modeling files and its masking_utils, not from loip's kernels): in a layer whose layer_types
-- entry is "sliding_attention" the query at position p attends to the keys at positions q with
-- p - sliding_window < q <= p; every other layer to 0..p. Grouped-query attention, q/k/v biases
-- when the checkpoint has them (Qwen2), rotate-half RoPE (theta from the config, no scaling),
-- SwiGLU MLP, RMSNorm, tied or separate head; F32 weights.
--
--   local logits = require("spec.support.window_reference").logits(dir, ids) -- logits[t][v], 0-based
local ffi = require "ffi"
local json = require "loip.text.json"
local safetensors = require "loip.model.safetensors"

local M = {}

local function rmsnorm(x, w, n, eps)
  local ss = 0
  for i = 0, n - 1 do ss = ss + x[i] * x[i] end
  local s = 1 / math.sqrt(ss / n + eps)
  local out = {}
  for i = 0, n - 1 do out[i] = x[i] * s * w[i] end
  return out
end

local function matvec(W, x, rows, cols, bias)
  local out = {}
  for r = 0, rows - 1 do
    local acc, row = bias and bias[r] or 0, r * cols
    for c = 0, cols - 1 do acc = acc + W[row + c] * x[c] end
    out[r] = acc
  end
  return out
end

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

-- The logits of every position of ids (1-based list; returns a 1-based list of 0-based tables)
-- of the F32 model in dir. over: config fields used instead of its own (sliding_window = false:
-- no window, to show what the window changes).
function M.logits(dir, ids, over)
  local cfg = assert(json.load(dir .. "/config.json"))
  for k, v in pairs(over or {}) do cfg[k] = v end
  local set = assert(safetensors.open_dir(dir))
  local views = {}
  local function w(name, optional)
    if views[name] == nil then
      local f = set.index[name]
      if not f and optional then return nil end
      local v = assert(assert(f, name):view(name))
      assert(v.dtype == require("loip.core").constants.F32, name .. ": the reference reads F32 weights")
      views[name] = ffi.cast("const float *", v.data)
    end
    return views[name]
  end
  local dim, eps, theta = cfg.hidden_size, cfg.rms_norm_eps, cfg.rope_theta or 10000
  local heads, kvh, ffn = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size
  local hd = cfg.head_dim or dim / heads
  local window = cfg.sliding_window or nil
  local T = #ids
  local hs = {}
  local embed = w("model.embed_tokens.weight")
  for t = 1, T do
    hs[t] = {}
    for i = 0, dim - 1 do hs[t][i] = embed[ids[t] * dim + i] end
  end
  for l = 0, cfg.num_hidden_layers - 1 do
    local p = string.format("model.layers.%d.", l)
    local sliding = window and (not cfg.layer_types or cfg.layer_types[l + 1] == "sliding_attention")
    local Q, K, V = {}, {}, {}
    for t = 1, T do
      local x = rmsnorm(hs[t], w(p .. "input_layernorm.weight"), dim, eps)
      Q[t] = matvec(w(p .. "self_attn.q_proj.weight"), x, heads * hd, dim, w(p .. "self_attn.q_proj.bias", true))
      K[t] = matvec(w(p .. "self_attn.k_proj.weight"), x, kvh * hd, dim, w(p .. "self_attn.k_proj.bias", true))
      V[t] = matvec(w(p .. "self_attn.v_proj.weight"), x, kvh * hd, dim, w(p .. "self_attn.v_proj.bias", true))
      rope(Q[t], heads, hd, t - 1, theta)
      rope(K[t], kvh, hd, t - 1, theta)
    end
    for t = 1, T do
      local att = {}
      for h = 0, heads - 1 do
        local g = math.floor(h / (heads / kvh))
        local first = sliding and math.max(1, t - window + 1) or 1
        local sc, top = {}, -math.huge
        for u = first, t do
          local d = 0
          for i = 0, hd - 1 do d = d + Q[t][h * hd + i] * K[u][g * hd + i] end
          sc[u] = d / math.sqrt(hd)
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
      for i = 0, dim - 1 do hs[t][i] = hs[t][i] + a[i] end
    end
    for t = 1, T do
      local x = rmsnorm(hs[t], w(p .. "post_attention_layernorm.weight"), dim, eps)
      local gt, up = matvec(w(p .. "mlp.gate_proj.weight"), x, ffn, dim), matvec(w(p .. "mlp.up_proj.weight"), x, ffn, dim)
      for i = 0, ffn - 1 do gt[i] = gt[i] / (1 + math.exp(-gt[i])) * up[i] end
      local y = matvec(w(p .. "mlp.down_proj.weight"), gt, dim, ffn)
      for i = 0, dim - 1 do hs[t][i] = hs[t][i] + y[i] end
    end
  end
  local head = w(cfg.tie_word_embeddings and "model.embed_tokens.weight" or "lm_head.weight")
  local out = {}
  for t = 1, T do out[t] = matvec(head, rmsnorm(hs[t], w("model.norm.weight"), dim, eps), cfg.vocab_size, dim) end
  safetensors.close(set)
  return out
end

return M
