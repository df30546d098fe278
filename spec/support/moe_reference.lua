-- A pure-Lua reference of a mixture-of-experts model's logits for one token at position 0, in
-- double precision, from a Hugging Face directory's F32 weights (written from the papers and
-- Hugging Face's modeling files, not from loip's kernels). At position 0 attention attends to
-- the token alone: its output is Wo . (Wv . x + bv), each query head taking its kv head's
-- values, whatever q, k, their norms and RoPE are. The MLP of every layer is the mixture:
-- softmax of the router over all experts, the top k (ties: the lower index), their weights
-- renormalised to sum 1 when norm_topk_prob, each expert down(silu(gate . x) * (up . x)), plus
-- the shared expert scaled by sigmoid(shared_gate . x) (Qwen2-MoE).
--
--   local ref = require("spec.support.moe_reference").logits(dir, id, { norm_topk_prob = true })
local json = require "loip.text.json"
local safetensors = require "loip.model.safetensors"
local rm = require "spec.support.reference_math"

local M = {}

local rmsnorm, matvec, silu = rm.rmsnorm, rm.matvec, rm.silu

-- down(silu(gate . x) * (up . x)) of one SwiGLU MLP of inner size n.
local function swiglu(gate, up, down, x, dim, n)
  local g, u = matvec(gate, x, n, dim), matvec(up, x, n, dim)
  for i = 0, n - 1 do g[i] = silu(g[i]) * u[i] end
  return matvec(down, g, dim, n)
end

-- The mixture of experts of layer prefix p on x; o: the config fields, names: its family's.
local function moe(w, p, x, o)
  local dim, n, k = o.hidden_size, o.n_experts, o.num_experts_per_tok
  local logits = matvec(w(p .. o.router), x, n, dim)
  local top, probs, sum = -math.huge, {}, 0
  for e = 0, n - 1 do top = math.max(top, logits[e]) end
  for e = 0, n - 1 do probs[e] = math.exp(logits[e] - top) sum = sum + probs[e] end
  local order = {}
  for e = 0, n - 1 do probs[e] = probs[e] / sum order[e + 1] = e end
  table.sort(order, function(a, b) return probs[a] > probs[b] or (probs[a] == probs[b] and a < b) end)
  local total = 0
  for r = 1, k do total = total + probs[order[r]] end
  local y = {}
  for i = 0, dim - 1 do y[i] = 0 end
  for r = 1, k do
    local e = order[r]
    local weight = o.norm_topk_prob and probs[e] / total or probs[e]
    local part = function(name) return w(p .. o.expert:format(e, name)) end
    local out = swiglu(part(o.parts[1]), part(o.parts[2]), part(o.parts[3]), x, dim, o.expert_dim)
    for i = 0, dim - 1 do y[i] = y[i] + weight * out[i] end
  end
  if o.shared then
    local out = swiglu(w(p .. "mlp.shared_expert.gate_proj.weight"), w(p .. "mlp.shared_expert.up_proj.weight"),
      w(p .. "mlp.shared_expert.down_proj.weight"), x, dim, o.shared)
    local s = matvec(w(p .. "mlp.shared_expert_gate.weight"), x, 1, dim)[0]
    local g = 1 / (1 + math.exp(-s))
    for i = 0, dim - 1 do y[i] = y[i] + g * out[i] end
  end
  return y
end

-- The logits (a 0-based table of vocab_size numbers) of token id at position 0 of the F32
-- model in dir. over: config fields to use instead of its own (norm_topk_prob, to show what
-- another choice gives).
function M.logits(dir, id, over)
  local cfg = assert(json.load(dir .. "/config.json"))
  for k, v in pairs(over or {}) do cfg[k] = v end
  local mixtral = cfg.architectures[1] == "MixtralForCausalLM"
  local o = {
    hidden_size = cfg.hidden_size, n_experts = cfg.num_local_experts or cfg.num_experts,
    num_experts_per_tok = cfg.num_experts_per_tok, norm_topk_prob = mixtral or cfg.norm_topk_prob == true,
    expert_dim = mixtral and cfg.intermediate_size or cfg.moe_intermediate_size,
    shared = cfg.shared_expert_intermediate_size,
    router = mixtral and "block_sparse_moe.gate.weight" or "mlp.gate.weight",
    expert = mixtral and "block_sparse_moe.experts.%d.%s.weight" or "mlp.experts.%d.%s.weight",
    parts = mixtral and { "w1", "w3", "w2" } or { "gate_proj", "up_proj", "down_proj" },
  }
  if over and over.norm_topk_prob ~= nil then o.norm_topk_prob = over.norm_topk_prob end
  local set = assert(safetensors.open_dir(dir))
  local w = rm.f32_weights(set)
  local dim, eps = cfg.hidden_size, cfg.rms_norm_eps
  local heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
  local hd = cfg.head_dim or dim / heads
  local h = {}
  local embed = w("model.embed_tokens.weight")
  for i = 0, dim - 1 do h[i] = embed[id * dim + i] end
  local bias = cfg.architectures[1] == "Qwen2MoeForCausalLM" or cfg.attention_bias
  for l = 0, cfg.num_hidden_layers - 1 do
    local p = string.format("model.layers.%d.", l)
    local x = rmsnorm(h, w(p .. "input_layernorm.weight"), dim, eps)
    local v = matvec(w(p .. "self_attn.v_proj.weight"), x, kv * hd, dim, bias and w(p .. "self_attn.v_proj.bias"))
    local att = {}
    for q = 0, heads - 1 do
      local g = math.floor(q / (heads / kv))
      for i = 0, hd - 1 do att[q * hd + i] = v[g * hd + i] end
    end
    local a = matvec(w(p .. "self_attn.o_proj.weight"), att, dim, heads * hd)
    for i = 0, dim - 1 do h[i] = h[i] + a[i] end
    local y = moe(w, p, rmsnorm(h, w(p .. "post_attention_layernorm.weight"), dim, eps), o)
    for i = 0, dim - 1 do h[i] = h[i] + y[i] end
  end
  local x = rmsnorm(h, w("model.norm.weight"), dim, eps)
  local out = matvec(w(cfg.tie_word_embeddings and "model.embed_tokens.weight" or "lm_head.weight"), x, cfg.vocab_size, dim)
  safetensors.close(set)
  return out
end

return M
