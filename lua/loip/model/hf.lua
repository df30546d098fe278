-- Hugging Face model directories: config.json -> loip_model_config, tensor names -> weights.
local ffi = require "ffi"
local core = require "loip.core"
local json = require "loip.text.json"
local safetensors = require "loip.model.safetensors"
local exec = require "loip.runtime.exec"
local K = core.constants

local M = {}

-- Per architecture: which optional tensors exist, and for a mixture of experts (moe) how its
-- config and tensors name the experts (M.experts_of). Everything else is shared by the family.
local architectures = {
  LlamaForCausalLM = { qkv_bias = "attention_bias" },
  MistralForCausalLM = { qkv_bias = false },
  Qwen2ForCausalLM = { qkv_bias = true },
  Qwen3ForCausalLM = { qkv_bias = "attention_bias", qk_norm = true },
  Qwen3MoeForCausalLM = { qkv_bias = "attention_bias", qk_norm = true, moe = "qwen" },
  Qwen2MoeForCausalLM = { qkv_bias = true, moe = "qwen", shared = true },
  MixtralForCausalLM = { qkv_bias = false, moe = "mixtral" },
}
M.architectures = architectures

local function field(cfg, path, name, kind, default)
  local v = cfg[name]
  if v == nil or v == json.null then
    if default ~= nil then return default end
    error(string.format("%s: field '%s' is missing", path, name), 0)
  end
  if kind == "int" and (type(v) ~= "number" or v ~= math.floor(v)) then
    error(string.format("%s: field '%s' must be an integer, got %s", path, name, tostring(v)), 0)
  elseif kind == "number" and type(v) ~= "number" then
    error(string.format("%s: field '%s' must be a number, got %s", path, name, tostring(v)), 0)
  elseif kind == "bool" and type(v) ~= "boolean" then
    error(string.format("%s: field '%s' must be true or false, got %s", path, name, tostring(v)), 0)
  end
  return v
end

-- config.json -> (loip_model_config cdata, facts table). Raises "path: field ..." on bad input.
function M.read_config(dir)
  local path = dir .. "/config.json"
  local cfg, err = json.load(path)
  if not cfg then error(err, 0) end
  local c, facts = M.parse_config(cfg, path)
  local gen = json.exists(dir .. "/generation_config.json") and json.load(dir .. "/generation_config.json")
  if type(gen) == "table" and gen.eos_token_id ~= nil then facts.eos_token_id = gen.eos_token_id end
  return c, facts
end

-- A mixture of experts' fields of config cfg (architecture spec) into c: n_experts,
-- n_experts_used, expert_dim, norm_topk_prob, the shared expert and its gate (Qwen2-MoE: its size
-- is hidden_dim; without one hidden_dim is expert_dim, unused). Raises naming the field of what
-- loip does not run: dense layers among the experts' (decoder_sparse_step, mlp_only_layers).
function M.experts_of(cfg, path, spec, c, field)
  local function refuse(name, why, ...) error(string.format("%s: field '%s' " .. why, path, name, ...), 0) end
  local count = "num_experts"
  if spec.moe == "mixtral" then
    count = "num_local_experts"
    c.expert_dim = field(cfg, path, "intermediate_size", "int")
    c.norm_topk_prob = 1 -- (Mixtral renormalises its top-k always)
  else
    c.expert_dim = field(cfg, path, "moe_intermediate_size", "int")
    c.norm_topk_prob = field(cfg, path, "norm_topk_prob", "bool", false) and 1 or 0
    local step = field(cfg, path, "decoder_sparse_step", "int", 1)
    if step ~= 1 then refuse("decoder_sparse_step", "is %d: only a mixture of experts in every layer (1) is supported", step) end
    local dense = cfg.mlp_only_layers
    if dense ~= nil and dense ~= json.null and (type(dense) ~= "table" or next(dense) ~= nil) then
      refuse("mlp_only_layers", "lists dense layers: only a mixture of experts in every layer is supported")
    end
  end
  c.n_experts = field(cfg, path, count, "int")
  c.n_experts_used = field(cfg, path, "num_experts_per_tok", "int")
  if c.n_experts < 1 then refuse(count, "is %d: a mixture of experts needs at least one", c.n_experts) end
  if c.n_experts_used < 1 or c.n_experts_used > c.n_experts then
    refuse("num_experts_per_tok", "is %d: must be 1..%d (%s)", c.n_experts_used, c.n_experts, count)
  end
  if c.expert_dim < 1 then refuse(spec.moe == "mixtral" and "intermediate_size" or "moe_intermediate_size", "must be positive") end
  c.hidden_dim = c.expert_dim
  if spec.shared then
    local size = field(cfg, path, "shared_expert_intermediate_size", "int")
    if size < 1 then refuse("shared_expert_intermediate_size", "is %d: must be positive", size) end
    c.hidden_dim, c.shared_expert, c.shared_expert_gate = size, 1, 1
  end
end

-- A decoded config.json table -> (loip_model_config, facts); path names it in errors.
function M.parse_config(cfg, path)
  if type(cfg) ~= "table" then error(path .. ": not a JSON object", 0) end
  local arch_list = cfg.architectures
  if type(arch_list) ~= "table" or type(arch_list[1]) ~= "string" then
    error(path .. ": field 'architectures' is missing", 0)
  end
  local arch = arch_list[1]
  local spec = architectures[arch]
  if not spec then
    local known = {}
    for k in pairs(architectures) do known[#known + 1] = k end
    table.sort(known)
    error(string.format("%s: architecture '%s' is not supported (supported: %s)", path, arch,
      table.concat(known, ", ")), 0)
  end
  local act = field(cfg, path, "hidden_act", "string", "silu")
  if act ~= "silu" then error(string.format("%s: field 'hidden_act' is '%s'; only silu is supported", path, act), 0) end
  local c = ffi.new("loip_model_config")
  c.dim = field(cfg, path, "hidden_size", "int")
  if spec.moe then
    M.experts_of(cfg, path, spec, c, field)
  else
    c.hidden_dim = field(cfg, path, "intermediate_size", "int")
  end
  c.n_layers = field(cfg, path, "num_hidden_layers", "int")
  c.n_heads = field(cfg, path, "num_attention_heads", "int")
  c.n_kv_heads = field(cfg, path, "num_key_value_heads", "int", c.n_heads)
  c.head_dim = field(cfg, path, "head_dim", "int", c.n_heads > 0 and math.floor(c.dim / c.n_heads) or 0)
  c.vocab_size = field(cfg, path, "vocab_size", "int")
  c.max_seq = field(cfg, path, "max_position_embeddings", "int", 2048)
  c.norm_eps = field(cfg, path, "rms_norm_eps", "number", 1e-6)
  c.rope_theta = field(cfg, path, "rope_theta", "number", 10000)
  c.rope_layout = K.ROPE_HALF
  c.rope_scaling = K.ROPE_SCALING_NONE
  local rs = cfg.rope_scaling
  if type(rs) == "table" then
    local kind = rs.rope_type or rs.type
    if kind == "llama3" then
      c.rope_scaling = K.ROPE_SCALING_LLAMA3
      c.rope_factor = field(rs, path .. " rope_scaling", "factor", "number")
      c.rope_low_freq_factor = field(rs, path .. " rope_scaling", "low_freq_factor", "number")
      c.rope_high_freq_factor = field(rs, path .. " rope_scaling", "high_freq_factor", "number")
      c.rope_original_max_pos = field(rs, path .. " rope_scaling", "original_max_position_embeddings", "int")
    elseif kind ~= "default" then
      error(string.format("%s: rope_scaling type '%s' is not supported (llama3 is)", path, tostring(kind)), 0)
    end
  end
  if spec.qkv_bias == true then
    c.qkv_bias = 1
  elseif spec.qkv_bias then
    c.qkv_bias = field(cfg, path, spec.qkv_bias, "bool", false) and 1 or 0
  end
  c.qk_norm = spec.qk_norm and 1 or 0
  c.tied_embeddings = field(cfg, path, "tie_word_embeddings", "bool", false) and 1 or 0
  local facts = {
    architecture = arch, format = "hf", config = cfg,
    bos_token_id = cfg.bos_token_id, eos_token_id = cfg.eos_token_id,
    sliding_window = (cfg.use_sliding_window ~= false and type(cfg.sliding_window) == "number") and cfg.sliding_window or nil,
  }
  return c, facts
end

local layer_names = {
  { K.W_ATTN_NORM, "input_layernorm.weight" },
  { K.W_WQ, "self_attn.q_proj.weight" },
  { K.W_WK, "self_attn.k_proj.weight" },
  { K.W_WV, "self_attn.v_proj.weight" },
  { K.W_WO, "self_attn.o_proj.weight" },
  { K.W_BQ, "self_attn.q_proj.bias", "qkv_bias" },
  { K.W_BK, "self_attn.k_proj.bias", "qkv_bias" },
  { K.W_BV, "self_attn.v_proj.bias", "qkv_bias" },
  { K.W_Q_NORM, "self_attn.q_norm.weight", "qk_norm" },
  { K.W_K_NORM, "self_attn.k_norm.weight", "qk_norm" },
  { K.W_FFN_NORM, "post_attention_layernorm.weight" },
  { K.W_GATE, "mlp.gate_proj.weight", "dense" },
  { K.W_UP, "mlp.up_proj.weight", "dense" },
  { K.W_DOWN, "mlp.down_proj.weight", "dense" },
}
M.layer_names = layer_names

-- A mixture of experts' MLP, by family (the architecture's moe): the router, a routed expert's
-- parts (K.EXPERT_GATE, _UP, _DOWN in that order) and the shared expert (Qwen2-MoE).
local moe_names = {
  qwen = { router = "mlp.gate.weight", expert = "mlp.experts.%d.%s.weight", parts = { "gate_proj", "up_proj", "down_proj" },
    shared = { { K.W_GATE, "mlp.shared_expert.gate_proj.weight" }, { K.W_UP, "mlp.shared_expert.up_proj.weight" },
      { K.W_DOWN, "mlp.shared_expert.down_proj.weight" } }, shared_gate = "mlp.shared_expert_gate.weight" },
  mixtral = { router = "block_sparse_moe.gate.weight", expert = "block_sparse_moe.experts.%d.%s.weight",
    parts = { "w1", "w3", "w2" } },
}

-- Routed experts in these lists: one weight kind per part, M.W_EXPERT + part (K.EXPERT_*), past
-- C's kinds (loip_model_bind refuses them). Such an entry also has .expert (0-based) and .part,
-- belongs to its layer's MLP block, and binds with M.bind.
M.W_EXPERT = 1000
assert(K.W_COUNT < M.W_EXPERT)
-- The expert part (K.EXPERT_*) of weight kind k, nil when k is not a routed expert's.
function M.expert_part(k)
  k = tonumber(k)
  if k >= M.W_EXPERT and k < M.W_EXPERT + K.EXPERT_PARTS then return k - M.W_EXPERT end
  return nil
end

-- Bind view to model m as weight kind `kind` of layer (expert: which one, for a routed expert's
-- part). Returns true, or nil and the message.
function M.bind(m, layer, kind, view, expert)
  local part = M.expert_part(kind)
  if part then return exec.model_bind_expert(m, layer, expert, part, view) end
  return exec.model_bind(m, layer, kind, view)
end

-- The key of a weight in tables of weights by kind: "layer:kind", "layer:kind:expert".
function M.weight_key(layer, kind, expert)
  local k = layer .. ":" .. tonumber(kind)
  if expert then k = k .. ":" .. expert end
  return k
end

-- Shape of weight kind in model config c (as loip_model_bind checks it).
function M.shape_of(c, kind)
  local q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
  local shapes = {
    [K.W_EMBED] = { c.vocab_size, c.dim }, [K.W_LM_HEAD] = { c.vocab_size, c.dim },
    [K.W_OUTPUT_NORM] = { c.dim }, [K.W_ATTN_NORM] = { c.dim }, [K.W_FFN_NORM] = { c.dim },
    [K.W_WQ] = { q, c.dim }, [K.W_WK] = { kv, c.dim }, [K.W_WV] = { kv, c.dim },
    [K.W_WO] = { c.dim, q }, [K.W_BQ] = { q }, [K.W_BK] = { kv }, [K.W_BV] = { kv },
    [K.W_Q_NORM] = { c.head_dim }, [K.W_K_NORM] = { c.head_dim },
    [K.W_GATE] = { c.hidden_dim, c.dim }, [K.W_UP] = { c.hidden_dim, c.dim },
    [K.W_DOWN] = { c.dim, c.hidden_dim }, [K.W_ROUTER] = { c.n_experts, c.dim }, [K.W_SHARED_GATE] = { 1, c.dim },
    [M.W_EXPERT + K.EXPERT_GATE] = { c.expert_dim, c.dim }, [M.W_EXPERT + K.EXPERT_UP] = { c.expert_dim, c.dim },
    [M.W_EXPERT + K.EXPERT_DOWN] = { c.dim, c.expert_dim },
  }
  return shapes[tonumber(kind)]
end

-- Every { layer, kind, tensor name } the model needs, in the order layers run (embedding
-- first, then layer by layer, then the final norm and the head); a routed expert's entry also
-- has expert and part (M.W_EXPERT). A mixture of experts' layer lists its attention, ffn_norm,
-- router, shared expert and gate (when it has them), then expert 0's gate, up and down, expert
-- 1's... arch (a Hugging Face architecture) names the experts' tensors (default: Qwen's).
function M.weight_list(c, arch)
  local spec = architectures[arch or ""] or {}
  local moe = c.n_experts > 0 and moe_names[spec.moe or "qwen"]
  local list = { { -1, K.W_EMBED, "model.embed_tokens.weight" } }
  for l = 0, c.n_layers - 1 do
    local prefix = string.format("model.layers.%d.", l)
    for _, e in ipairs(layer_names) do
      local want = not e[3] or (e[3] == "dense" and not moe) or (e[3] ~= "dense" and c[e[3]] ~= 0)
      if want then list[#list + 1] = { l, e[1], prefix .. e[2] } end
    end
    if moe then
      list[#list + 1] = { l, K.W_ROUTER, prefix .. moe.router }
      if c.shared_expert ~= 0 then
        for _, e in ipairs(moe.shared) do list[#list + 1] = { l, e[1], prefix .. e[2] } end
        if c.shared_expert_gate ~= 0 then list[#list + 1] = { l, K.W_SHARED_GATE, prefix .. moe.shared_gate } end
      end
      for x = 0, c.n_experts - 1 do
        for p = 0, K.EXPERT_PARTS - 1 do
          list[#list + 1] = { l, M.W_EXPERT + p, prefix .. moe.expert:format(x, moe.parts[p + 1]), expert = x, part = p }
        end
      end
    end
  end
  list[#list + 1] = { -1, K.W_OUTPUT_NORM, "model.norm.weight" }
  if c.tied_embeddings == 0 then list[#list + 1] = { -1, K.W_LM_HEAD, "lm_head.weight" } end
  return list
end

-- Open the weights of dir and bind them to model m. Returns the safetensors set (keep it
-- alive as long as m) or raises with the file and tensor named. opts: safetensors.open_dir's,
-- and architecture (the config's: names the experts' tensors).
function M.bind_weights(dir, c, m, opts)
  local set, err = safetensors.open_dir(dir, opts)
  if not set then error(err, 0) end
  for _, w in ipairs(M.weight_list(c, opts and opts.architecture)) do
    local layer, kind, name = w[1], w[2], w[3]
    local f = set.index[name]
    if not f then
      safetensors.close(set)
      error(string.format("%s: tensor '%s' is missing", dir, name), 0)
    end
    local view, verr = f:view(name)
    if not view then safetensors.close(set) error(verr, 0) end
    local ok, berr = M.bind(m, layer, kind, view, w.expert)
    if not ok then
      safetensors.close(set)
      error(string.format("%s: tensor '%s': %s", f.path, name, berr), 0)
    end
  end
  return set
end

return M
