-- A pure-Lua reference of gpt-oss's logits (GptOssForCausalLM) for a short sequence, in double
-- precision, from a Hugging Face directory's F32 weights as transformers' modeling_gpt_oss reads
-- them (written from its description, not from loip's kernels): the fused experts indexed in
-- place (gate_up_proj[e][c][2r] gate row r, [2r + 1] up; down_proj[e][c][r]), YaRN's frequencies
-- as _compute_yarn_parameters computes them (the correction range truncated unless the config's
-- truncate is false; cos and sin scaled by the attention factor), rotate-half RoPE, causal
-- attention with the head's sink in the softmax, the top-k router logits then their softmax, and
-- the clamped SwiGLU (g = min(gate, limit), u = clamp(up, -limit, limit), g sigmoid(1.702 g)(u + 1)).
-- A sliding_attention layer (layer_types) attends to the last sliding_window positions only
-- (Hugging Face's sliding-window mask, the sink still in the softmax); the others to all before.
--
--   local ref = require("spec.support.gpt_oss_reference").logits(dir, { 1, 2, 3 })  -- [t][v], 0-based
local json = require "loip.text.json"
local safetensors = require "loip.model.safetensors"
local rm = require "spec.support.reference_math"

local M = {}

local rmsnorm, matvec = rm.rmsnorm, rm.matvec

-- YaRN's inverse frequencies (0-based, head_dim/2 of them) and attention factor.
local function yarn(cfg, hd)
  local rs, base = cfg.rope_scaling, cfg.rope_theta
  local factor, orig = rs.factor, rs.original_max_position_embeddings
  local function dim_of(turns) return hd * math.log(orig / (turns * 2 * math.pi)) / (2 * math.log(base)) end
  local low, high = dim_of(rs.beta_fast or 32), dim_of(rs.beta_slow or 1)
  if rs.truncate ~= false then low, high = math.floor(low), math.ceil(high) end
  low, high = math.max(low, 0), math.min(high, hd - 1)
  if low == high then high = high + 0.001 end
  local inv = {}
  for i = 0, hd / 2 - 1 do
    local extrap = 1 / base ^ (2 * i / hd)
    local ramp = math.min(1, math.max(0, (i - low) / (high - low)))
    inv[i] = extrap / factor * ramp + extrap * (1 - ramp)
  end
  return inv, rs.attention_factor or (0.1 * math.log(factor) + 1)
end

-- v (a head's hd values from offset at) rotated by position pos, rotate-half pairs (i, i + hd/2).
local function rope(v, at, hd, pos, inv, mscale)
  for i = 0, hd / 2 - 1 do
    local c, s = math.cos(pos * inv[i]) * mscale, math.sin(pos * inv[i]) * mscale
    local a, b = v[at + i], v[at + i + hd / 2]
    v[at + i], v[at + i + hd / 2] = a * c - b * s, b * c + a * s
  end
end

-- The attention of layer prefix p over xs (the normed rows of every position): o_proj's output per
-- position. window: the positions a query sees (nil: all before it).
local function attention(w, p, xs, g, window)
  local dim, heads, kv, hd = g.dim, g.heads, g.kv, g.hd
  local qs, ks, vs, out = {}, {}, {}, {}
  for t = 1, #xs do
    qs[t] = matvec(w(p .. "self_attn.q_proj.weight"), xs[t], heads * hd, dim, w(p .. "self_attn.q_proj.bias"))
    ks[t] = matvec(w(p .. "self_attn.k_proj.weight"), xs[t], kv * hd, dim, w(p .. "self_attn.k_proj.bias"))
    vs[t] = matvec(w(p .. "self_attn.v_proj.weight"), xs[t], kv * hd, dim, w(p .. "self_attn.v_proj.bias"))
    for h = 0, heads - 1 do rope(qs[t], h * hd, hd, t - 1, g.inv, g.mscale) end
    for h = 0, kv - 1 do rope(ks[t], h * hd, hd, t - 1, g.inv, g.mscale) end
  end
  local sinks = w(p .. "self_attn.sinks")
  for t = 1, #xs do
    local att = {}
    for h = 0, heads - 1 do
      local kh = math.floor(h / (heads / kv))
      local sc, top = {}, sinks[h]
      local first = window and math.max(1, t - window + 1) or 1
      for u = first, t do
        local d = 0
        for i = 0, hd - 1 do d = d + qs[t][h * hd + i] * ks[u][kh * hd + i] end
        sc[u] = d / math.sqrt(hd)
        top = math.max(top, sc[u])
      end
      local sum = math.exp(sinks[h] - top)
      for u = first, t do sc[u] = math.exp(sc[u] - top) sum = sum + sc[u] end
      for i = 0, hd - 1 do
        local acc = 0
        for u = first, t do acc = acc + sc[u] / sum * vs[u][kh * hd + i] end
        att[h * hd + i] = acc
      end
    end
    out[t] = matvec(w(p .. "self_attn.o_proj.weight"), att, dim, heads * hd, w(p .. "self_attn.o_proj.bias"))
  end
  return out
end

-- The experts of layer prefix p on x (normed).
local function experts(w, p, x, g)
  local dim, E, k, F, limit = g.dim, g.n_experts, g.k, g.ffn, g.limit
  local logits = matvec(w(p .. "mlp.router.weight"), x, E, dim, w(p .. "mlp.router.bias"))
  local order = {}
  for e = 0, E - 1 do order[e + 1] = e end
  table.sort(order, function(a, b) return logits[a] > logits[b] or (logits[a] == logits[b] and a < b) end)
  local sum, y = 0, {}
  for r = 1, k do sum = sum + math.exp(logits[order[r]] - logits[order[1]]) end
  for i = 0, dim - 1 do y[i] = 0 end
  local gu, gub = w(p .. "mlp.experts.gate_up_proj"), w(p .. "mlp.experts.gate_up_proj_bias")
  local dn, dnb = w(p .. "mlp.experts.down_proj"), w(p .. "mlp.experts.down_proj_bias")
  for r = 1, k do
    local e = order[r]
    local weight = math.exp(logits[e] - logits[order[1]]) / sum
    local h = {}
    for j = 0, F - 1 do
      local gate, up = gub[e * 2 * F + 2 * j], gub[e * 2 * F + 2 * j + 1]
      for c = 0, dim - 1 do
        gate = gate + gu[(e * dim + c) * 2 * F + 2 * j] * x[c]
        up = up + gu[(e * dim + c) * 2 * F + 2 * j + 1] * x[c]
      end
      gate, up = math.min(gate, limit), math.max(-limit, math.min(up, limit))
      h[j] = gate / (1 + math.exp(-1.702 * gate)) * (up + 1)
    end
    for i = 0, dim - 1 do
      local acc = dnb[e * dim + i]
      for j = 0, F - 1 do acc = acc + dn[(e * F + j) * dim + i] * h[j] end
      y[i] = y[i] + weight * acc
    end
  end
  return y
end

-- The logits of every position of ids (a 1-based list) of the F32 model in dir: a 0-based array
-- of #ids * vocab_size numbers. windows false: no layer windowed (what the windows change).
function M.logits(dir, ids, windows)
  local over_window = windows
  local cfg = assert(json.load(dir .. "/config.json"))
  local set = assert(safetensors.open_dir(dir))
  local w = rm.f32_weights(set)
  local dim = cfg.hidden_size
  local g = { dim = dim, heads = cfg.num_attention_heads, kv = cfg.num_key_value_heads, n_experts = cfg.num_local_experts,
    k = cfg.num_experts_per_tok, ffn = cfg.intermediate_size, limit = cfg.swiglu_limit or 7 }
  g.hd = cfg.head_dim or dim / g.heads
  g.inv, g.mscale = yarn(cfg, g.hd)
  local hs = {}
  for t, id in ipairs(ids) do
    hs[t] = {}
    for i = 0, dim - 1 do hs[t][i] = w("model.embed_tokens.weight")[id * dim + i] end
  end
  for l = 0, cfg.num_hidden_layers - 1 do
    local p, xs = string.format("model.layers.%d.", l), {}
    for t = 1, #ids do xs[t] = rmsnorm(hs[t], w(p .. "input_layernorm.weight"), dim, cfg.rms_norm_eps) end
    local sliding = type(cfg.layer_types) == "table" and cfg.layer_types[l + 1] == "sliding_attention"
    local a = attention(w, p, xs, g, sliding and over_window ~= false and cfg.sliding_window or nil)
    for t = 1, #ids do
      for i = 0, dim - 1 do hs[t][i] = hs[t][i] + a[t][i] end
      local y = experts(w, p, rmsnorm(hs[t], w(p .. "post_attention_layernorm.weight"), dim, cfg.rms_norm_eps), g)
      for i = 0, dim - 1 do hs[t][i] = hs[t][i] + y[i] end
    end
  end
  local V, out = cfg.vocab_size, {}
  for t = 1, #ids do
    local row = matvec(w("lm_head.weight"), rmsnorm(hs[t], w("model.norm.weight"), dim, cfg.rms_norm_eps), V, dim)
    for v = 0, V - 1 do out[(t - 1) * V + v] = row[v] end
  end
  safetensors.close(set)
  return out
end

return M
