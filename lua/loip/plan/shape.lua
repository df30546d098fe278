-- A model's shape as planning prices it: the dense model a mixture of experts' token works like,
-- and the weight bytes of each kind of block (loip.plan.problem, profiles and calibrations).
local hf = require "loip.model.hf"
local store = require "loip.model.store"
local families = require "loip.model.families"

local M = {}

-- (mixture of experts) The dense model whose MLP does a token's work of this one's: its top-k
-- experts side by side (and the shared expert), one SwiGLU of k x expert size. What compute is
-- measured and priced on: a token reads the weights of its chosen experts, not all of them. A
-- dense config table comes back as it is.
function M.dense_equivalent(cfg)
  local arch = type(cfg.architectures) == "table" and cfg.architectures[1]
  local spec = families.classes[arch]
  if not (spec and spec.dense) then return cfg end
  local d = {}
  for k, v in pairs(cfg) do d[k] = v end
  local k = cfg.num_experts_per_tok or 1
  local each = cfg[spec.experts.size] or cfg.intermediate_size
  d.intermediate_size = k * each + (spec.shared and (cfg.shared_expert_intermediate_size or 0) or 0)
  d.architectures = { spec.dense }
  d.model_type = spec.dense:match("^(.-)ForCausalLM$"):lower()
  for _, f in ipairs({ "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
    "shared_expert_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef",
    "output_router_logits" }) do d[f] = nil end
  return d
end

-- Weight bytes of one block of each kind and of the head, for a Hugging Face config table and
-- a dtype: what compute figures scale with (a mixture of experts: a token's, M.dense_equivalent).
function M.shape_of(cfg, dtype)
  local moe = M.dense_equivalent(cfg) ~= cfg and cfg or nil
  cfg = M.dense_equivalent(cfg)
  local c = hf.parse_config(cfg, "shape")
  local es = (store.dtypes[(dtype or "BF16"):upper()] or store.dtypes.BF16)[2]
  local sh = { dim = c.dim, hidden_dim = c.hidden_dim, n_heads = c.n_heads, n_kv_heads = c.n_kv_heads, head_dim = c.head_dim,
    mha_bytes = 0, mlp_bytes = 0, head_bytes = c.vocab_size * c.dim * es, dtype = (dtype or "BF16"):upper() }
  for _, w in ipairs(hf.weight_list(c)) do
    if w[1] == 0 then
      local n = 1
      for _, d in ipairs(hf.shape_of(c, w[2])) do n = n * d end
      local block = store.block_of[tonumber(w[2])]
      sh[block .. "_bytes"] = sh[block .. "_bytes"] + n * es
    end
  end
  -- experts released as MXFP4 (gpt-oss: quantization_config): a token reads its routed experts'
  -- gate, up and down in 17 bytes per 32 values, not in dtype's (the shared expert stays dtype)
  local q = moe and moe.quantization_config
  if type(q) == "table" and q.quant_method == "mxfp4" then
    local spec = families.classes[moe.architectures[1]]
    local routed = (moe.num_experts_per_tok or 1) * (moe[spec.experts.size] or moe.intermediate_size)
    sh.mlp_bytes = sh.mlp_bytes - 3 * c.dim * routed * (es - store.dtypes.MXFP4[2])
  end
  return sh
end

return M
