-- Hugging Face model directories: config.json -> loip_model_config, tensor names -> weights.
local ffi = require "ffi"
local core = require "loip.core"
local json = require "loip.text.json"
local safetensors = require "loip.model.safetensors"
local exec = require "loip.runtime.exec"
local memory = require "loip.runtime.memory"
local families = require "loip.model.families"
local fp8 = require "loip.model.fp8"
local K = core.constants

local M = {}

-- Per Hugging Face class: its switches (families/init.lua says what each means).
M.architectures = families.classes

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

-- A mixture of experts' fields of config cfg (class spec, its experts: families/init.lua) into
-- c: n_experts, n_experts_used, expert_dim, norm_topk_prob, the shared expert and its gate
-- (Qwen2-MoE: its size is hidden_dim; without one hidden_dim is expert_dim, unused). Raises
-- naming the field of what loip does not run: dense layers among the experts'
-- (decoder_sparse_step, mlp_only_layers).
function M.experts_of(cfg, path, spec, c, field)
  local function refuse(name, why, ...) error(string.format("%s: field '%s' " .. why, path, name, ...), 0) end
  local x = spec.experts
  c.expert_dim = field(cfg, path, x.size, "int")
  if x.renormalise then
    c.norm_topk_prob = 1
  else
    c.norm_topk_prob = field(cfg, path, "norm_topk_prob", "bool", false) and 1 or 0
    local step = field(cfg, path, "decoder_sparse_step", "int", 1)
    if step ~= 1 then refuse("decoder_sparse_step", "is %d: only a mixture of experts in every layer (1) is supported", step) end
    local dense = cfg.mlp_only_layers
    if dense ~= nil and dense ~= json.null and (type(dense) ~= "table" or next(dense) ~= nil) then
      refuse("mlp_only_layers", "lists dense layers: only a mixture of experts in every layer is supported")
    end
  end
  c.n_experts = field(cfg, path, x.count, "int")
  c.n_experts_used = field(cfg, path, "num_experts_per_tok", "int")
  if c.n_experts < 1 then refuse(x.count, "is %d: a mixture of experts needs at least one", c.n_experts) end
  if c.n_experts_used < 1 or c.n_experts_used > c.n_experts then
    refuse("num_experts_per_tok", "is %d: must be 1..%d (%s)", c.n_experts_used, c.n_experts, x.count)
  end
  if c.expert_dim < 1 then refuse(x.size, "must be positive") end
  c.hidden_dim = c.expert_dim
  if spec.shared then
    local size = field(cfg, path, "shared_expert_intermediate_size", "int")
    if size < 1 then refuse("shared_expert_intermediate_size", "is %d: must be positive", size) end
    c.hidden_dim, c.shared_expert, c.shared_expert_gate = size, 1, 1
  end
end

-- The layers' attention windows (Hugging Face's names) into c: sliding_window (positions; null
-- or absent, or use_sliding_window false: none) and layer_types ("sliding_attention" or
-- "full_attention" per layer); without layer_types every layer is windowed, or (Qwen2's
-- max_window_layers) those from max_window_layers on, or (Gemma 3's sliding_window_pattern p)
-- all but every p-th, as transformers' configs default them.
-- Returns the window (nil: none, or no layer windowed).
function M.windows_of(cfg, path, c)
  if cfg.use_sliding_window == false then return nil end
  local w = field(cfg, path, "sliding_window", "int", false)
  if not w or w == 0 then return nil end
  if w < 0 then error(string.format("%s: field 'sliding_window' must be positive, got %d", path, w), 0) end
  local n, types = c.n_layers, cfg.layer_types
  if n > K.MAX_LAYERS then
    error(string.format("%s: %d layers with a sliding window (at most %d)", path, n, K.MAX_LAYERS), 0)
  end
  if types ~= nil and types ~= json.null then
    if type(types) ~= "table" or #types ~= n then
      error(string.format("%s: field 'layer_types' must list one type per layer (%d), got %s", path, n,
        type(types) == "table" and #types .. " entries" or tostring(types)), 0)
    end
  end
  local from = field(cfg, path, "max_window_layers", "int", 0)
  local every = field(cfg, path, "sliding_window_pattern", "int", 0)
  if every < 0 then error(string.format("%s: field 'sliding_window_pattern' must be positive, got %d", path, every), 0) end
  c.sliding_window = w
  local any = false
  for l = 0, n - 1 do
    local t = types and types ~= json.null and types[l + 1]
    if t and t ~= "sliding_attention" and t ~= "full_attention" then
      error(string.format("%s: field 'layer_types' entry %d is '%s' (sliding_attention or full_attention)", path,
        l + 1, tostring(t)), 0)
    end
    local windowed = t == "sliding_attention"
    if not t then
      if every > 0 then windowed = (l + 1) % every ~= 0
      else windowed = cfg.max_window_layers == nil or l >= from end
    end
    c.layer_window[l] = windowed and 1 or 0
    any = any or windowed
  end
  if not any then c.sliding_window = 0 end -- (every layer full: no window)
  return any and w or nil
end

-- YaRN's fields of rope_scaling table rs into c, as transformers' _compute_yarn_parameters reads
-- them: beta_fast 32 and beta_slow 1 by default, the attention factor given or 0.1 ln(factor) + 1,
-- the correction range truncated to whole pairs unless truncate is false (gpt-oss). DeepSeek's
-- mscale/mscale_all_dim are refused.
local function yarn_of(rs, path, c)
  local at = path .. " rope_scaling"
  c.rope_scaling = K.ROPE_SCALING_YARN
  c.rope_factor = field(rs, at, "factor", "number")
  c.rope_original_max_pos = field(rs, at, "original_max_position_embeddings", "int")
  c.rope_beta_fast = field(rs, at, "beta_fast", "number", 32)
  c.rope_beta_slow = field(rs, at, "beta_slow", "number", 1)
  for _, f in ipairs({ "mscale", "mscale_all_dim" }) do
    if rs[f] ~= nil and rs[f] ~= json.null then
      error(string.format("%s: field '%s' is not supported (YaRN's attention factor from it: DeepSeek's)", at, f), 0)
    end
  end
  local factor = c.rope_factor
  c.rope_attn_factor = field(rs, at, "attention_factor", "number", factor > 1 and 0.1 * math.log(factor) + 1 or 1)
  c.rope_yarn_truncate = field(rs, at, "truncate", "bool", true) and 1 or 0
end

-- The config's rope_scaling into c (none, llama3, linear or yarn); raises naming what is not
-- supported.
function M.rope_scaling_of(cfg, path, c)
  c.rope_scaling = K.ROPE_SCALING_NONE
  local rs = cfg.rope_scaling
  if type(rs) ~= "table" then return end
  local kind = rs.rope_type or rs.type
  if kind == "llama3" then
    c.rope_scaling = K.ROPE_SCALING_LLAMA3
    c.rope_factor = field(rs, path .. " rope_scaling", "factor", "number")
    c.rope_low_freq_factor = field(rs, path .. " rope_scaling", "low_freq_factor", "number")
    c.rope_high_freq_factor = field(rs, path .. " rope_scaling", "high_freq_factor", "number")
    c.rope_original_max_pos = field(rs, path .. " rope_scaling", "original_max_position_embeddings", "int")
  elseif kind == "linear" then
    c.rope_scaling = K.ROPE_SCALING_LINEAR
    c.rope_factor = field(rs, path .. " rope_scaling", "factor", "number")
    if not (c.rope_factor > 0) then error(path .. ": rope_scaling factor must be positive", 0) end
  elseif kind == "yarn" then
    yarn_of(rs, path, c)
  elseif kind ~= "default" then
    error(string.format("%s: rope_scaling type '%s' is not supported (llama3, linear and yarn are)", path,
      tostring(kind)), 0)
  end
end

-- The MLP gate's activations loip runs (config.json's names -> K.ACT_*).
local activations = { silu = K.ACT_SILU, gelu_pytorch_tanh = K.ACT_GELU_TANH }

-- A decoded config.json table -> (loip_model_config, facts); path names it in errors. A class
-- with a prepare function reads the table it returns (families/init.lua).
function M.parse_config(cfg, path)
  if type(cfg) ~= "table" then error(path .. ": not a JSON object", 0) end
  local arch_list = cfg.architectures
  if type(arch_list) ~= "table" or type(arch_list[1]) ~= "string" then
    error(path .. ": field 'architectures' is missing", 0)
  end
  local arch = arch_list[1]
  local spec = M.architectures[arch]
  if not spec then
    error(string.format("%s: architecture '%s' is not supported (supported: %s)", path, arch,
      table.concat(families.names(M.architectures), ", ")), 0)
  end
  if spec.prepare then cfg = spec.prepare(cfg, path) end
  fp8.method_of(cfg, path) -- (quantization_config: what loip reads of it, else an error naming the field)
  -- (the MLP gate's activation: hidden_activation where a config has it, as Gemma's, else hidden_act)
  local act_field = cfg.hidden_activation ~= nil and "hidden_activation" or "hidden_act"
  local act = field(cfg, path, act_field, "string", "silu")
  local act_kind = activations[act]
  if not act_kind or (act_kind ~= K.ACT_SILU and spec.experts) then
    error(string.format("%s: field '%s' is '%s'; only %s supported", path, act_field, act,
      spec.experts and "silu is" or "silu and gelu_pytorch_tanh are"), 0)
  end
  local c = ffi.new("loip_model_config")
  c.ffn_act = act_kind
  c.dim = field(cfg, path, "hidden_size", "int")
  if spec.experts then
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
  M.rope_scaling_of(cfg, path, c)
  if spec.qkv_bias == true then
    c.qkv_bias = 1
  elseif spec.qkv_bias then
    c.qkv_bias = field(cfg, path, spec.qkv_bias, "bool", false) and 1 or 0
  end
  c.qk_norm = spec.qk_norm and 1 or 0
  c.tied_embeddings = field(cfg, path, "tie_word_embeddings", "bool", false) and 1 or 0
  if spec.config then spec.config(cfg, path, field, c) end
  local facts = {
    architecture = arch, format = "hf", config = cfg,
    bos_token_id = cfg.bos_token_id, eos_token_id = cfg.eos_token_id,
    sliding_window = M.windows_of(cfg, path, c),
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
  { K.W_BO, "self_attn.o_proj.bias", "attn_out_bias" },
  { K.W_SINKS, "self_attn.sinks", "attn_sinks" },
  { K.W_K_NORM, "self_attn.k_norm.weight", "qk_norm" },
  { K.W_POST_ATTN_NORM, "post_attention_norm.weight", "post_norms" }, -- (Gemma's: post_attention_layernorm)
  { K.W_FFN_NORM, "post_attention_layernorm.weight" },
  { K.W_GATE, "mlp.gate_proj.weight", "dense" },
  { K.W_UP, "mlp.up_proj.weight", "dense" },
  { K.W_DOWN, "mlp.down_proj.weight", "dense" },
  { K.W_POST_FFN_NORM, "post_feedforward_layernorm.weight", "post_norms" },
}
M.layer_names = layer_names

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
    [K.W_POST_ATTN_NORM] = { c.dim }, [K.W_POST_FFN_NORM] = { c.dim },
    [K.W_GATE] = { c.hidden_dim, c.dim }, [K.W_UP] = { c.hidden_dim, c.dim },
    [K.W_DOWN] = { c.dim, c.hidden_dim }, [K.W_ROUTER] = { c.n_experts, c.dim }, [K.W_SHARED_GATE] = { 1, c.dim },
    [M.W_EXPERT + K.EXPERT_GATE] = { c.expert_dim, c.dim }, [M.W_EXPERT + K.EXPERT_UP] = { c.expert_dim, c.dim },
    [M.W_EXPERT + K.EXPERT_DOWN] = { c.dim, c.expert_dim },
    [K.W_BO] = { c.dim }, [K.W_SINKS] = { c.n_heads }, [K.W_ROUTER_BIAS] = { c.n_experts },
    [K.W_EXPERT_GATE_BIAS] = { c.n_experts, c.expert_dim }, [K.W_EXPERT_UP_BIAS] = { c.n_experts, c.expert_dim },
    [K.W_EXPERT_DOWN_BIAS] = { c.n_experts, c.dim },
  }
  return shapes[tonumber(kind)]
end

-- Each weight kind's tensor name in a layer for class spec: the common names (M.layer_names)
-- with the family's own (spec.layer); a kind that is one part of a tensor fused by rows maps to
-- { name, kinds (the tensor's parts, in row order), index (this kind's) }.
local function layer_names_of(spec)
  local out = {}
  for _, e in ipairs(layer_names) do out[e[1]] = { e[2] } end
  for name, kinds in pairs(spec.layer or {}) do
    if type(kinds) ~= "table" then kinds = { kinds } end
    for i, k in ipairs(kinds) do out[k] = #kinds > 1 and { name, kinds = kinds, index = i } or { name } end
  end
  return out
end

-- The rows { first, count, total } that kind takes of a tensor fused by rows (n: its names entry).
local function fused_rows(c, n)
  local first, total = 0, 0
  for i, k in ipairs(n.kinds) do
    local rows = M.shape_of(c, k)[1]
    if i < n.index then first = first + rows end
    total = total + rows
  end
  return { first, M.shape_of(c, n.kinds[n.index])[1], total }
end

-- Every { layer, kind, tensor name } the model needs, in the order layers run (embedding
-- first, then layer by layer, then the final norm and the head); a routed expert's entry also
-- has expert and part (M.W_EXPERT), a part of a tensor fused by rows has rows ({ first, count,
-- total }: M.row_view). A mixture of experts' layer lists its attention, ffn_norm, router, shared
-- expert and gate (when it has them), then expert 0's gate, up and down, expert 1's... arch (a
-- Hugging Face class) names the tensors (default: the common names, Qwen's experts).
function M.weight_list(c, arch)
  local spec = M.architectures[arch or ""] or {}
  local moe = c.n_experts > 0 and (spec.experts or families.default_experts)
  local names = layer_names_of(spec)
  local top = spec.prefix or "" -- (Gemma3ForConditionalGeneration's language model: language_model.)
  local list = { { -1, K.W_EMBED, top .. "model.embed_tokens.weight" } }
  for l = 0, c.n_layers - 1 do
    local prefix = string.format("%smodel.layers.%d.", top, l)
    for _, e in ipairs(layer_names) do
      local want = not e[3] or (e[3] == "dense" and not moe) or (e[3] ~= "dense" and c[e[3]] ~= 0)
      if want then
        local n = names[e[1]]
        list[#list + 1] = { l, e[1], prefix .. n[1], rows = n.kinds and fused_rows(c, n) }
      end
    end
    if moe then
      list[#list + 1] = { l, K.W_ROUTER, prefix .. moe.router }
      if c.router_bias ~= 0 then list[#list + 1] = { l, K.W_ROUTER_BIAS, prefix .. (moe.router_bias or "mlp.gate.bias") } end
      if c.shared_expert ~= 0 then
        for _, e in ipairs(moe.shared) do list[#list + 1] = { l, e[1], prefix .. e[2] } end
        if c.shared_expert_gate ~= 0 then list[#list + 1] = { l, K.W_SHARED_GATE, prefix .. moe.shared_gate } end
      end
      -- (experts stored otherwise than one tensor per expert and part: the family lists them)
      if moe.list then for _, w in ipairs(moe.list(c, l, prefix, M.W_EXPERT)) do list[#list + 1] = w end
      elseif c.expert_bias ~= 0 then
        for i, k in ipairs({ K.W_EXPERT_GATE_BIAS, K.W_EXPERT_UP_BIAS, K.W_EXPERT_DOWN_BIAS }) do
          list[#list + 1] = { l, k, prefix .. "mlp.experts." .. moe.parts[i] .. "_bias" }
        end
      end
      for x = 0, moe.list and -1 or c.n_experts - 1 do
        for p = 0, K.EXPERT_PARTS - 1 do
          list[#list + 1] = { l, M.W_EXPERT + p, prefix .. moe.expert:format(x, moe.parts[p + 1]), expert = x, part = p }
        end
      end
    end
  end
  list[#list + 1] = { -1, K.W_OUTPUT_NORM, top .. "model.norm.weight" }
  if c.tied_embeddings == 0 then list[#list + 1] = { -1, K.W_LM_HEAD, top .. "lm_head.weight" } end
  return list
end

-- The tensors of M.weight_list as the files hold them, each once: { name, shape } in the order
-- of their first part (a tensor fused by rows has the rows of all its parts; a weight derived
-- from others, its sources: { name, shape, dtype (a fixed one, else the model's), fill }).
-- experts_dtype "mxfp4": the experts as a family releases them in MXFP4 (blocks and scales).
function M.tensor_list(c, arch, experts_dtype)
  local out, seen = {}, {}
  for _, w in ipairs(M.weight_list(c, arch)) do
    local sources = (experts_dtype == "mxfp4" and w.mxfp4 or w).sources
    if experts_dtype == "mxfp4" and M.expert_part(w[2]) and not w.mxfp4 then
      error(string.format("%s's experts are not released as MXFP4 (no blocks and scales to write)", arch or "the model"), 0)
    end
    for _, src in ipairs(sources or {}) do
      if not seen[src.name] then
        seen[src.name] = true
        out[#out + 1] = { name = src.name, shape = src.shape, dtype = src.dtype, fill = src.fill }
      end
    end
    if not sources and not seen[w[3]] then
      local shape = M.shape_of(c, w[2])
      if w.rows then shape = { w.rows[3], shape[2] } end
      seen[w[3]] = true
      out[#out + 1] = { name = w[3], shape = shape }
    end
  end
  return out
end

local elem_bytes = { [tonumber(K.F32)] = 4, [tonumber(K.BF16)] = 2, [tonumber(K.F16)] = 2 }

-- Rows rows[1] .. rows[1] + rows[2] - 1 of view v (a 2-D loip_tensor of rows[3] rows: a
-- tensor fused by rows) as a view of their own, and its bytes; nil and the message when v is
-- not of that shape.
function M.row_view(v, rows)
  local first, count, total = rows[1], rows[2], rows[3]
  local es = elem_bytes[tonumber(v.dtype)]
  if v.ndim ~= 2 or v.shape[0] ~= total or not es then
    local got = {}
    for i = 0, v.ndim - 1 do got[#got + 1] = tostring(tonumber(v.shape[i])) end
    return nil, string.format("shape [%s], expected %d rows (its fused parts' together)", table.concat(got, ", "), total)
  end
  local out = ffi.new("loip_tensor")
  local row = tonumber(v.shape[1]) * es
  out.data, out.dtype, out.ndim = ffi.cast("const uint8_t *", v.data) + first * row, v.dtype, 2
  out.shape[0], out.shape[1] = count, v.shape[1]
  return out, count * row
end

-- The file of safetensors set holding weight w (a M.weight_list entry of class arch) and the
-- name it is held under: w's own, or the class's other layout of it (its alias function:
-- Gemma3ForConditionalGeneration saved by transformers 4.52 to 4.57, model.language_model.*);
-- nil when neither is there.
function M.find(set, w, arch)
  if set.index[w[3]] then return set.index[w[3]], w[3] end
  local alias = (M.architectures[arch or ""] or {}).alias
  local other = alias and alias(w[3])
  if other and set.index[other] then return set.index[other], other end
end

-- A weight made in memory (view, its bytes, its buffer) kept by safetensors set (freed by
-- safetensors.close) and charged to budget's "weights" when given: (view, bytes), or nil and why.
local function keep_derived(set, view, bytes, buf, budget, what)
  set.derived = set.derived or {}
  set.derived[#set.derived + 1] = buf
  if budget then
    local ok, err = memory.charge(budget, "weights", bytes, what)
    if not ok then return nil, err end
    set.derived_budget, set.derived_charged = budget, (set.derived_charged or 0) + bytes
  end
  return view, bytes
end

-- The view of weight w (a M.weight_list entry of class arch) in the safetensors set (found by
-- M.find), and its bytes; nil and the message when it cannot be had. A derived weight (w.derive:
-- a family's, from the tensors w.sources names) is made in memory the set owns (freed by safetensors.close), charged to
-- budget's "weights" (a loip_budget *, when given) until then.
-- lazy: an FP8 weight not packed yet (loip.model.fp8.lazy: a view for binding checks only, its
-- packed bytes, and a third result that packs it when called).
function M.weight_view(set, w, dir, budget, arch, lazy)
  -- (a weight a family can also derive from other sources: MXFP4 blocks and scales as released)
  if w.mxfp4 and w.sources and not set.index[w.sources[1].name] and set.index[w.mxfp4.sources[1].name] then
    w = { w[1], w[2], w[3], expert = w.expert, part = w.part, sources = w.mxfp4.sources, derive = w.mxfp4.derive }
  end
  if w.derive then
    local src = {}
    for _, s in ipairs(w.sources) do
      local f = set.index[s.name]
      if not f then return nil, string.format("%s: tensor '%s' is missing", dir, s.name) end
      local t = f.tensors[s.name]
      src[s.name] = { data = f.data + t.offset, dtype = t.dtype, shape = t.shape, nbytes = t.nbytes, path = f.path }
    end
    local view, bytes, buf = w.derive(src, w)
    if not view then return nil, bytes end
    return keep_derived(set, view, bytes, buf, budget, dir .. ": " .. w[3])
  end
  local f, name = M.find(set, w, arch)
  if not f then return nil, string.format("%s: tensor '%s' is missing", dir, w[3]) end
  if f.tensors[name].dtype == "F8_E4M3" then return M.f8_view(set, f, w, name, dir, budget, lazy) end
  return M.view_of(f, w, name)
end

-- Weight w held as FP8 (tensor name of file f: E4M3 bytes beside its weight_scale_inv), packed
-- as LOIP_F8_E4M3 in memory the set owns (loip.model.fp8), charged as a derived weight.
function M.f8_view(set, f, w, name, dir, budget, lazy)
  if not set.config then set.config = json.load(dir .. "/config.json") or {} end
  if lazy and not w.rows then return fp8.lazy(set, f, name, set.config) end
  local view, bytes, buf = fp8.pack(set, f, name, set.config)
  if not view then return nil, bytes end
  local kept, kerr = keep_derived(set, view, bytes, buf, budget, dir .. ": " .. name)
  if not kept or not w.rows then return kept, kerr end
  local part, perr = fp8.row_view(view, w.rows)
  if not part then return nil, string.format("%s: tensor '%s': %s", f.path, name, perr) end
  return part, perr
end

-- The view of weight w (a M.weight_list entry) in safetensors file f (under name: default w's),
-- and its bytes; nil and the message when it cannot be had.
function M.view_of(f, w, name)
  name = name or w[3]
  local view, err = f:view(name)
  if not view or not w.rows then return view, err or f.tensors[name].nbytes end
  local part, perr = M.row_view(view, w.rows)
  if not part then return nil, string.format("%s: tensor '%s': %s", f.path, name, perr) end
  return part, perr
end

-- Open the weights of dir and bind them to model m. Returns the safetensors set (keep it
-- alive as long as m) or raises with the file and tensor named. opts: safetensors.open_dir's,
-- and architecture (the config's: names the tensors).
function M.bind_weights(dir, c, m, opts)
  local set, err = safetensors.open_dir(dir, opts)
  if not set then error(err, 0) end
  for _, w in ipairs(M.weight_list(c, opts and opts.architecture)) do
    local layer, kind = w[1], w[2]
    local view, verr = M.weight_view(set, w, dir, opts and opts.budget, opts and opts.architecture)
    if not view then safetensors.close(set) error(verr, 0) end
    local ok, berr = M.bind(m, layer, kind, view, w.expert)
    if not ok then
      safetensors.close(set)
      local f, name = M.find(set, w, opts and opts.architecture)
      error(string.format("%s: tensor '%s': %s", f and f.path or dir, name or w[3], berr), 0)
    end
  end
  return set
end

return M
