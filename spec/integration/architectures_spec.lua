-- Every supported architecture's particulars (Qwen2's q/k/v biases, Qwen3's per-head q/k
-- RMSNorm and explicit head_dim, Llama 3's RoPE scaling, untied heads, Mistral, BF16/F16
-- weights) checked on small synthetic models against a plain-Lua forward pass written from
-- transformers' modeling code (LlamaRMSNorm, rotate_half, apply_rotary_pos_emb,
-- _compute_llama3_parameters, repeat_kv, eager attention), independent of the C kernels.
local ffi = require "ffi"
local bit = require "bit"
local loip = require "loip"
local json = require "loip.text.json"
local safetensors = require "loip.model.safetensors"
local T = require "spec.support"

-- Reads tensor `name` of a safetensors set as a Lua array of numbers (row-major).
local function tensor(set, name)
  local f = set.index[name]
  if not f then return nil end
  local t = f.tensors[name]
  local p = f.data + t.offset
  local out = {}
  if t.dtype == "F32" then
    local a = ffi.cast("const float *", p)
    for i = 0, t.numel - 1 do out[i + 1] = a[i] end
  elseif t.dtype == "BF16" then
    local a, u = ffi.cast("const uint16_t *", p), ffi.new("union { uint32_t u; float f; }")
    for i = 0, t.numel - 1 do u.u = bit.lshift(a[i], 16) out[i + 1] = u.f end
  else -- F16
    local a = ffi.cast("const uint16_t *", p)
    for i = 0, t.numel - 1 do
      local h = a[i]
      local s, e, m = bit.rshift(h, 15), bit.band(bit.rshift(h, 10), 31), bit.band(h, 1023)
      local v = e == 0 and m * 2 ^ -24 or (1 + m / 1024) * 2 ^ (e - 15)
      out[i + 1] = s == 1 and -v or v
    end
  end
  return out
end

local function linear(W, x, rows, cols, b)
  local y = {}
  for r = 0, rows - 1 do
    local s = 0
    for c = 1, cols do s = s + W[r * cols + c] * x[c] end
    y[r + 1] = s + (b and b[r + 1] or 0)
  end
  return y
end

local function rmsnorm(x, w, eps, off, n)
  off, n = off or 0, n or #x
  local ss = 0
  for i = 1, n do ss = ss + x[off + i] ^ 2 end
  local inv = 1 / math.sqrt(ss / n + eps)
  local y = {}
  for i = 1, n do y[i] = x[off + i] * inv * w[i] end
  return y
end

-- transformers' default and llama3 inverse frequencies.
local function inv_freq(cfg, hd)
  local out = {}
  for i = 0, hd / 2 - 1 do
    local f = 1 / cfg.rope_theta ^ (2 * i / hd)
    local rs = cfg.rope_scaling
    if type(rs) == "table" and rs.rope_type == "llama3" then
      local low, high = rs.original_max_position_embeddings / rs.low_freq_factor,
        rs.original_max_position_embeddings / rs.high_freq_factor
      local wl = 2 * math.pi / f
      if wl > low then
        f = f / rs.factor
      elseif wl >= high then
        local sm = (rs.original_max_position_embeddings / wl - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
        f = (1 - sm) * f / rs.factor + sm * f
      end
    end
    out[i + 1] = f
  end
  return out
end

-- Logits of the last position of ids, the whole sequence at once (no KV cache).
local function reference_logits(dir, ids)
  local cfg = assert(json.load(dir .. "/config.json"))
  local set = assert(safetensors.open_dir(dir))
  local D, H, KV = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
  local hd = cfg.head_dim or D / H
  local F, eps = cfg.intermediate_size, cfg.rms_norm_eps
  local arch = cfg.architectures[1]
  local bias = arch == "Qwen2ForCausalLM" or cfg.attention_bias
  local freqs = inv_freq(cfg, hd)
  local E = tensor(set, "model.embed_tokens.weight")
  local xs = {}
  for t, id in ipairs(ids) do
    xs[t] = {}
    for i = 1, D do xs[t][i] = E[id * D + i] end
  end
  local function rope(v, pos)
    local half, out = hd / 2, {}
    for i = 1, hd do out[i] = v[i] end
    for i = 1, half do
      local a = pos * freqs[i]
      local c, s = math.cos(a), math.sin(a)
      out[i] = v[i] * c - v[i + half] * s
      out[i + half] = v[i + half] * c + v[i] * s
    end
    return out
  end
  for l = 0, cfg.num_hidden_layers - 1 do
    local p = "model.layers." .. l .. "."
    local g = function(n) return tensor(set, p .. n) end
    local wq, wk, wv, wo = g("self_attn.q_proj.weight"), g("self_attn.k_proj.weight"), g("self_attn.v_proj.weight"), g("self_attn.o_proj.weight")
    local bq, bk, bv = bias and g("self_attn.q_proj.bias"), bias and g("self_attn.k_proj.bias"), bias and g("self_attn.v_proj.bias")
    local qn, kn = g("self_attn.q_norm.weight"), g("self_attn.k_norm.weight")
    local Q, K, V = {}, {}, {}
    for t = 1, #ids do
      local h = rmsnorm(xs[t], g("input_layernorm.weight"), eps)
      local q, k, v = linear(wq, h, H * hd, D, bq), linear(wk, h, KV * hd, D, bk), linear(wv, h, KV * hd, D, bv)
      Q[t], K[t], V[t] = {}, {}, {}
      for hh = 0, H - 1 do
        local head = {}
        for i = 1, hd do head[i] = q[hh * hd + i] end
        if qn then head = rmsnorm(head, qn, eps) end
        Q[t][hh] = rope(head, t - 1)
      end
      for hh = 0, KV - 1 do
        local head, vh = {}, {}
        for i = 1, hd do head[i] = k[hh * hd + i] vh[i] = v[hh * hd + i] end
        if kn then head = rmsnorm(head, kn, eps) end
        K[t][hh], V[t][hh] = rope(head, t - 1), vh
      end
    end
    for t = 1, #ids do
      local att = {}
      for hh = 0, H - 1 do
        local kvh = math.floor(hh / (H / KV))
        local sc, mx = {}, -math.huge
        for s = 1, t do
          local d = 0
          for i = 1, hd do d = d + Q[t][hh][i] * K[s][kvh][i] end
          sc[s] = d / math.sqrt(hd)
          mx = math.max(mx, sc[s])
        end
        local sum = 0
        for s = 1, t do sc[s] = math.exp(sc[s] - mx) sum = sum + sc[s] end
        for i = 1, hd do
          local o = 0
          for s = 1, t do o = o + sc[s] / sum * V[s][kvh][i] end
          att[hh * hd + i] = o
        end
      end
      local o = linear(wo, att, D, H * hd)
      for i = 1, D do xs[t][i] = xs[t][i] + o[i] end
      local h = rmsnorm(xs[t], g("post_attention_layernorm.weight"), eps)
      local gt, up = linear(g("mlp.gate_proj.weight"), h, F, D), linear(g("mlp.up_proj.weight"), h, F, D)
      local a = {}
      for i = 1, F do a[i] = gt[i] / (1 + math.exp(-gt[i])) * up[i] end
      local dn = linear(g("mlp.down_proj.weight"), a, D, F)
      for i = 1, D do xs[t][i] = xs[t][i] + dn[i] end
    end
  end
  local h = rmsnorm(xs[#ids], tensor(set, "model.norm.weight"), eps)
  local head = tensor(set, "lm_head.weight") or E
  local logits = linear(head, h, cfg.vocab_size, D)
  safetensors.close(set)
  return logits
end

local cases = {
  { "Llama 3 (llama3 RoPE scaling, tied, BF16)", "llama-3.2-1b", "bf16", {} },
  { "Llama 3.1 (untied head, F32)", "llama-3.1-8b", "f32", {} },
  { "Llama 2 (no GQA, F16)", "llama-2-7b", "f16", { "--kv-heads", "4" } },
  { "Mistral (F32)", "mistral-7b", "f32", {} },
  { "Qwen2 (q/k/v biases, F32)", "qwen2.5-0.5b", "f32", {} },
  { "Qwen3 (q/k norm, head_dim != dim/heads, BF16)", "qwen3-0.6b", "bf16", { "--head-dim", "24" } },
}

describe("architectures against a plain-Lua transformers-style forward", function()
  after_each(function() T.cleanup() collectgarbage() collectgarbage() end)
  for _, c in ipairs(cases) do
    it(c[1], function()
      local dir = T.tmpdir() .. "/m"
      local extra = table.concat(c[4], " ")
      local heads = extra:find("kv%-heads") and "" or "--kv-heads 2"
      local cmd = string.format("LOIP_QUIET=1 %s synth --like %s --dtype %s --layers 2 --dim 64 --heads 4 %s --ffn 96 --vocab 300 --seed 3 --std 0.3 %s %s",
        T.loip, c[2], c[3], heads, extra, dir)
      local rc, _, err = T.run(cmd)
      assert.are.equal(0, rc, err)
      local ids = { 1, 17, 290, 45, 100, 7, 260 }
      local m = loip.model.open(dir, { threads = 2 })
      local out = m:logits(ids)
      local ref = reference_logits(dir, ids)
      local last = out + (#ids - 1) * m.vocab_size
      local worst, scale = 0, 0
      for i = 0, m.vocab_size - 1 do
        worst = math.max(worst, math.abs(last[i] - ref[i + 1]))
        scale = math.max(scale, math.abs(ref[i + 1]))
      end
      -- fp32 against double: relative to the largest logit (the weights make logits of order 1-10)
      assert.is_true(scale > 1, string.format("logits too small to test anything (max %.3g)", scale))
      assert.is_true(worst < 1e-5 * scale, string.format("max |diff| %.3g, max |logit| %.3g", worst, scale))
      m:close()
    end)
  end
end)
