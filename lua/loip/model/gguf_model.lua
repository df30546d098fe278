-- GGUF files as models (each family's architectures, lua/loip/model/families/: llama, qwen2,
-- qwen3, phi3; mixtures of experts qwen2moe, qwen3moe and llama with experts, Mixtral): the
-- metadata as a Hugging Face config (so one config path, hf.parse_config, serves every format),
-- GGUF's tensor names as loip's weights, used in place from the file's memory map. A layer's
-- routed experts are one 3-D tensor per part (ffn_gate_exps, ffn_up_exps, ffn_down_exps: expert
-- e's matrix is its e-th slice), each expert bound to a view of its slice; a tensor fused by rows
-- (phi3's attn_qkv) gives each part a view of its rows.
--
-- RoPE: llama.cpp's converter stores a `llama` model's q/k rows in Meta's order, which pairs
-- dimensions (2i, 2i+1) (llama2.c's layout: loip_rope_layout = "interleaved"); qwen2/qwen3 are
-- stored as Hugging Face has them (rotate-half, llama.cpp's NEOX). Llama 3's frequency scaling
-- comes as a tensor of per-frequency factors (rope_freqs.weight): the llama3 parameters that
-- give exactly those factors are found, or the model is refused.
local ffi = require "ffi"
local core = require "loip.core"
local gguf = require "loip.model.gguf"
local hf = require "loip.model.hf"
local exec = require "loip.runtime.exec"
local families = require "loip.model.families"
local bpe = require "loip.text.tokenizers.bpe"
local K = core.constants

local M = {}

-- Per GGUF architecture: the Hugging Face class it reads as and what the file holds
-- (families/init.lua says what each field means).
M.architectures = families.gguf

-- GGUF tensor names (blk.N. prefix for the layers) -> loip weight kinds.
local global_names = {
  ["token_embd.weight"] = K.W_EMBED, ["output_norm.weight"] = K.W_OUTPUT_NORM,
  ["output.weight"] = K.W_LM_HEAD,
}
local layer_names = {
  ["attn_norm.weight"] = K.W_ATTN_NORM, ["attn_q.weight"] = K.W_WQ, ["attn_k.weight"] = K.W_WK,
  ["attn_v.weight"] = K.W_WV, ["attn_output.weight"] = K.W_WO, ["attn_q.bias"] = K.W_BQ,
  ["attn_k.bias"] = K.W_BK, ["attn_v.bias"] = K.W_BV, ["attn_q_norm.weight"] = K.W_Q_NORM,
  ["attn_k_norm.weight"] = K.W_K_NORM, ["ffn_norm.weight"] = K.W_FFN_NORM,
  ["ffn_gate.weight"] = K.W_GATE, ["ffn_up.weight"] = K.W_UP, ["ffn_down.weight"] = K.W_DOWN,
  ["post_attention_norm.weight"] = K.W_POST_ATTN_NORM, ["post_ffw_norm.weight"] = K.W_POST_FFN_NORM,
}
-- A mixture of experts' layers: the same attention, then the router, the shared expert and its
-- gate (Qwen2-MoE) and the routed experts (3-D: M.tensors cuts them into experts).
local moe_layer_names = {
  ["ffn_gate_inp.weight"] = K.W_ROUTER, ["ffn_gate_shexp.weight"] = K.W_GATE, ["ffn_up_shexp.weight"] = K.W_UP,
  ["ffn_down_shexp.weight"] = K.W_DOWN, ["ffn_gate_inp_shexp.weight"] = K.W_SHARED_GATE,
  ["ffn_gate_exps.weight"] = hf.W_EXPERT + K.EXPERT_GATE, ["ffn_up_exps.weight"] = hf.W_EXPERT + K.EXPERT_UP,
  ["ffn_down_exps.weight"] = hf.W_EXPERT + K.EXPERT_DOWN,
}
for n, k in pairs(layer_names) do
  if k ~= K.W_GATE and k ~= K.W_UP and k ~= K.W_DOWN then moe_layer_names[n] = k end
end
M.global_names, M.layer_names, M.moe_layer_names = global_names, layer_names, moe_layer_names

local dtypes = { F32 = K.F32, F16 = K.F16, BF16 = K.BF16, MXFP4 = K.MXFP4 }

-- The llama3 rope_scaling whose per-frequency factors are rope_freqs (a Lua list, head_dim/2
-- values), for head dimension hd and base theta; nil when none of Llama 3.x's fits.
local function llama3_scaling(freqs, hd, theta)
  local factor = 0
  for _, f in ipairs(freqs) do factor = math.max(factor, f) end
  for _, p in ipairs({ { 1, 4, 8192 } }) do
    local low, high, orig = p[1], p[2], p[3]
    local ok = true
    for i, got in ipairs(freqs) do
      local inv = theta ^ (-(2 * (i - 1)) / hd)
      local wavelen = 2 * math.pi / inv
      local want
      if wavelen < orig / high then want = 1
      elseif wavelen > orig / low then want = factor
      else
        local s = (orig / wavelen - low) / (high - low)
        want = 1 / ((1 - s) / factor + s)
      end
      if math.abs(got - want) > 1e-5 * want then ok = false break end
    end
    if ok then
      return { rope_type = "llama3", factor = factor, low_freq_factor = low, high_freq_factor = high,
        original_max_position_embeddings = orig }
    end
  end
  return nil
end

-- A mixture of experts' Hugging Face config fields from g's metadata (architectures, model_type,
-- the expert count, top-k, sizes, norm_topk_prob as llama.cpp runs it), nil for a dense model
-- (llama without experts). get(key, default) reads arch.key; raises naming the key.
function M.experts_of(g, arch, spec, get)
  local md, path = g.metadata, g.path
  if not spec.experts and not spec.moe then return nil end
  if spec.moe and md[arch .. ".expert_count"] == nil then
    -- (llama: experts when the file has them; then their keys must be there)
    local exps = g.tensors["blk.0.ffn_gate_exps.weight"] or g.tensors["blk.0.ffn_up_exps.weight"]
    if not exps and not g.tensors["blk.0.ffn_gate_inp.weight"] then return nil end
    get("expert_count") -- (raises: the key is missing)
  end
  local key = function(k) return arch .. "." .. k end
  local n, used = get("expert_count"), get("expert_used_count")
  if n < 1 then error(string.format("%s: metadata %s is 0: a mixture of experts needs experts", path, key "expert_count"), 0) end
  if used < 1 or used > n then
    error(string.format("%s: metadata %s is %d: must be 1..%d (%s)", path, key "expert_used_count", used, n, key "expert_count"), 0)
  end
  if spec.moe then
    -- Mixtral: feed_forward_length is an expert's size; the top-k renormalised
    return { architectures = { spec.moe.class }, model_type = spec.moe.model_type, num_local_experts = n,
      num_experts_per_tok = used }
  end
  local ffn = md[key "feed_forward_length"]
  -- (llama.cpp: without expert_feed_forward_length an expert has feed_forward_length / top-k)
  local size = get("expert_feed_forward_length", type(ffn) == "number" and math.floor(ffn / used) or nil)
  local out = { num_experts = n, num_experts_per_tok = used, moe_intermediate_size = size,
    norm_topk_prob = spec.norm_topk_prob }
  if spec.shared then
    out.shared_expert_intermediate_size = get("expert_shared_feed_forward_length", type(ffn) == "number" and ffn or nil)
  end
  return out
end

-- The GGUF's end-of-sequence id and every stop id (eos, then eot and eom when they differ and
-- are in the vocabulary).
local function stop_ids(md)
  local tok = md["tokenizer.ggml.tokens"]
  local eos = md["tokenizer.ggml.eos_token_id"]
  local stops = { eos }
  for _, k in ipairs({ "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id" }) do
    local id = md[k]
    if type(id) == "number" and id ~= eos and (not tok or id < #tok) then stops[#stops + 1] = id end
  end
  -- o200k_harmony (gpt-oss): <|return|> and <|call|> end a generation, as llama.cpp has them
  if type(tok) == "table" then
    local want, at = { ["<|return|>"] = true, ["<|call|>"] = true, ["<|endoftext|>"] = true }, {}
    for i, t in ipairs(tok) do if want[t] then at[t] = i - 1 end end
    for _, id in ipairs(bpe.harmony_stops(function(t) return at[t] end)) do
      local seen = false
      for _, s in ipairs(stops) do seen = seen or s == id end
      if not seen then stops[#stops + 1] = id end
    end
  end
  return eos, stops
end

-- The llama3 rope scaling whose frequency factors tensor 'rope_freqs.weight' holds (head dim hd,
-- base theta); raises when none gives them.
local function rope_scaling_of(g, hd, theta)
  local path, rf = g.path, g.tensors["rope_freqs.weight"]
  local p = ffi.cast("const float *", (g:data("rope_freqs.weight")))
  if rf.type ~= "F32" or rf.numel * 2 ~= hd then
    error(string.format("%s: tensor 'rope_freqs.weight' is %s of %d values; expected F32 of %d", path, rf.type, rf.numel, hd / 2), 0)
  end
  local list = {}
  for i = 0, rf.numel - 1 do list[i + 1] = p[i] end
  local scaling = llama3_scaling(list, hd, theta)
  if not scaling then
    error(path .. ": tensor 'rope_freqs.weight' holds frequency factors that no llama3 rope scaling (low 1, high 4, original context 8192) gives: not supported", 0)
  end
  return scaling
end

-- The rope scaling of arch's metadata md as a Hugging Face rope_scaling table: nil (none), linear's
-- (rope.scaling.factor), or YaRN's as llama.cpp runs it (its correction range always truncated: transformers' default;
-- beta_fast and beta_slow 32 and 1 unless the file says otherwise; the attention factor
-- 0.1 ln(factor) + 1 times rope.scaling.attn_factor). Raises on any other kind.
function M.metadata_scaling_of(md, arch, get, path)
  local scaling = md[arch .. ".rope.scaling.type"]
  if scaling == nil or scaling == "none" then return nil end
  if scaling == "linear" then return { rope_type = "linear", factor = get("rope.scaling.factor", nil, "number") } end
  if scaling ~= "yarn" then
    error(string.format("%s: %s.rope.scaling.type '%s' is not supported (linear and yarn are)", path, arch,
      tostring(scaling)), 0)
  end
  local factor = get("rope.scaling.factor", nil, "number")
  local attn = get("rope.scaling.attn_factor", 1, "number")
  return { rope_type = "yarn", factor = factor, original_max_position_embeddings = get("rope.scaling.original_context_length"),
    beta_fast = get("rope.scaling.yarn_beta_fast", 32, "number"), beta_slow = get("rope.scaling.yarn_beta_slow", 1, "number"),
    attention_factor = attn * (factor > 1 and 0.1 * math.log(factor) + 1 or 1) }
end

-- An open GGUF (loip.model.gguf) -> a Hugging Face config table (plus loip_rope_layout and
-- loip_source_format); raises naming the key.
function M.config(g)
  local md, path = g.metadata, g.path
  local arch = md["general.architecture"]
  if type(arch) ~= "string" then error(path .. ": metadata general.architecture is missing", 0) end
  local spec = M.architectures[arch]
  if not spec then
    error(string.format("%s: general.architecture '%s' is not supported (supported: %s)", path, arch,
      table.concat(families.names(M.architectures), ", ")), 0)
  end
  local function get(key, default, kind)
    local full = arch .. "." .. key
    local v = md[full]
    if v == nil then
      if default ~= nil then return default end
      error(string.format("%s: metadata %s is missing", path, full), 0)
    end
    if type(v) ~= "number" or ((kind or "int") == "int" and (v ~= math.floor(v) or v < 0)) then
      error(string.format("%s: metadata %s is %s, not a%s number", path, full, tostring(v),
        (kind or "int") == "int" and " whole" or ""), 0)
    end
    return v
  end
  local embd = g.tensors["token_embd.weight"]
  if not embd then error(path .. ": tensor 'token_embd.weight' is missing", 0) end
  if #embd.dims ~= 2 then error(string.format("%s: tensor 'token_embd.weight' has %d dimensions, not 2", path, #embd.dims), 0) end
  local dim = get("embedding_length")
  local heads = get("attention.head_count")
  if heads == 0 then error(path .. ": metadata " .. arch .. ".attention.head_count is 0", 0) end
  local hd = get("attention.key_length", math.floor(dim / heads))
  local vlen = get("attention.value_length", hd)
  if vlen ~= hd then
    error(string.format("%s: %s.attention.value_length %d differs from key_length %d (not supported)", path, arch, vlen, hd), 0)
  end
  local rope_dims = get("rope.dimension_count", hd)
  if rope_dims ~= hd then
    error(string.format("%s: %s.rope.dimension_count %d is not the head dimension %d (partial rotary embeddings are not supported)",
      path, arch, rope_dims, hd), 0)
  end
  local theta = get("rope.freq_base", 10000, "number")
  local scaling = M.metadata_scaling_of(md, arch, get, path)
  local eos, stops = stop_ids(md)
  local types = {}
  for _, name in ipairs(g.order) do types[g.tensors[name].type] = true end
  local moe = M.experts_of(g, arch, spec, get)
  local cfg = {
    architectures = { spec.class }, model_type = spec.model_type, hidden_act = "silu",
    hidden_size = dim, intermediate_size = get("feed_forward_length", moe and moe.moe_intermediate_size), num_hidden_layers = get("block_count"),
    num_attention_heads = heads, num_key_value_heads = get("attention.head_count_kv", heads), head_dim = hd,
    vocab_size = embd.dims[2], max_position_embeddings = get("context_length", 2048),
    rms_norm_eps = get("attention.layer_norm_rms_epsilon", nil, "number"), rope_theta = theta,
    tie_word_embeddings = g.tensors["output.weight"] == nil,
    bos_token_id = md["tokenizer.ggml.bos_token_id"], eos_token_id = #stops > 1 and stops or eos,
    torch_dtype = types.BF16 and "bfloat16" or types.F16 and "float16" or "float32",
    loip_source_format = "gguf",
  }
  if spec.interleaved then cfg.loip_rope_layout = "interleaved" end
  if scaling then cfg.rope_scaling = scaling end
  for k, v in pairs(moe or {}) do cfg[k] = v end
  if spec.attention_bias ~= false and g.tensors["blk.0.attn_q.bias"] then cfg.attention_bias = true end
  if spec.config then spec.config(md, cfg, get, path) end
  if g.tensors["rope_freqs.weight"] then cfg.rope_scaling = rope_scaling_of(g, hd, theta) end
  return cfg
end

-- A view (loip_tensor) of data: dtype (GGUF's name), shape (rows first).
local function view_of(dtype, shape, data)
  local v = ffi.new("loip_tensor")
  v.dtype, v.ndim, v.data = dtypes[dtype], #shape, data
  for i, d in ipairs(shape) do v.shape[i - 1] = d end
  return v
end

-- The layer names of GGUF architecture arch (experts: of a mixture of experts' layer): the common
-- names with the family's own (spec.layer: a name -> a kind, or a list of kinds fused by rows).
local function layer_names_of(arch, experts)
  local spec = M.architectures[arch] or {}
  local names = experts and moe_layer_names or layer_names
  if not spec.layer then return names end
  local taken = {}
  for _, k in pairs(spec.layer) do
    for _, kk in ipairs(type(k) == "table" and k or { k }) do taken[kk] = true end
  end
  local out = {}
  for n, k in pairs(names) do if not taken[k] then out[n] = k end end
  for n, k in pairs(spec.layer) do out[n] = k end
  return out
end

-- The weights of g as { layer, kind, name (GGUF's), view (a loip_tensor into the map), nbytes,
-- dtype, shape [, expert] }, keyed by hf.weight_key; raises on a tensor loip does not know. A
-- layer's routed experts (3-D, [experts, rows, cols]) give one entry per expert, a view of its
-- slice; they, and the router, must hold the config's expert count. A tensor fused by rows gives
-- one entry per part, a view of its rows (their number from c, the loip_model_config).
function M.tensors(g, cfg, c)
  local out = {}
  local L = cfg.num_hidden_layers
  local arch = g.metadata["general.architecture"]
  local n_experts = cfg.num_experts or cfg.num_local_experts
  local names = layer_names_of(arch, n_experts)
  local function refuse(name, what, n)
    error(string.format("%s: tensor '%s' %s %d experts but metadata %s.expert_count is %d", g.path, name, what, n,
      arch, n_experts), 0)
  end
  for _, name in ipairs(g.order) do
    local x = g.tensors[name]
    local layer, kind = -1, global_names[name]
    if not kind then
      local n, rest = name:match("^blk%.(%d+)%.(.+)$")
      kind = rest and names[rest]
      layer = tonumber(n)
      if kind and layer >= L then
        error(string.format("%s: tensor '%s' is past the model's %d layers", g.path, name, L), 0)
      end
    end
    if not kind and name ~= "rope_freqs.weight" then
      error(string.format("%s: tensor '%s' is not one loip knows for architecture %s", g.path, name, arch), 0)
    end
    if kind then
      local shape = {}
      for i = 1, #x.dims do shape[i] = x.dims[#x.dims + 1 - i] end
      local data = ffi.cast("const uint8_t *", (g:data(name)))
      if type(kind) == "table" then
        local v = view_of(x.type, shape, data)
        local first, total = 0, 0
        for _, k in ipairs(kind) do total = total + hf.shape_of(c, k)[1] end
        for _, k in ipairs(kind) do
          local rows = hf.shape_of(c, k)[1]
          local part, bytes = hf.row_view(v, { first, rows, total })
          if not part then error(string.format("%s: tensor '%s': %s", g.path, name, bytes), 0) end
          local pshape = { rows, shape[2] }
          out[hf.weight_key(layer, k)] = { layer = layer, kind = k, name = name, view = part, nbytes = bytes,
            dtype = x.type, shape = pshape }
          first = first + rows
        end
      elseif hf.expert_part(kind) then
        if #shape ~= 3 then
          error(string.format("%s: tensor '%s' has %d dimensions; a layer's experts are 3 (experts, rows, columns)", g.path,
            name, #shape), 0)
        end
        if shape[1] ~= n_experts then refuse(name, "holds", shape[1]) end
        local each, eshape = x.nbytes / n_experts, { shape[2], shape[3] }
        for e = 0, n_experts - 1 do
          out[hf.weight_key(layer, kind, e)] = { layer = layer, kind = kind, name = name, expert = e, nbytes = each,
            view = view_of(x.type, eshape, data + e * each), dtype = x.type, shape = eshape }
        end
      else
        -- (the shared expert's gate: [1, dim] as Hugging Face has it; GGUF's is [dim] or [dim, 1])
        if kind == K.W_SHARED_GATE and #shape == 1 then shape = { 1, shape[1] } end
        if kind == K.W_ROUTER and shape[1] ~= n_experts then refuse(name, "routes to", shape[1]) end
        out[hf.weight_key(layer, kind)] = { layer = layer, kind = kind, name = name, view = view_of(x.type, shape, data),
          nbytes = x.nbytes, dtype = x.type, shape = shape }
      end
    end
  end
  return out
end

-- (loip_model_config, facts, file, bind(model), by_kind) for a .gguf file: as llama2c.open.
-- The file stays open (its map holds the weights) until gguf_model.close(file).
function M.open(path)
  local g = gguf.open(path)
  local ok, res = pcall(function()
    local cfg = M.config(g)
    local c, facts = hf.parse_config(cfg, path)
    if cfg.loip_rope_layout == "interleaved" then c.rope_layout = K.ROPE_INTERLEAVED end
    facts.format, facts.architecture, facts.gguf_architecture = "gguf", cfg.architectures[1], g.metadata["general.architecture"]
    local by_kind = M.tensors(g, cfg, c)
    return { c = c, facts = facts, cfg = cfg, by_kind = by_kind }
  end)
  if not ok then g:close() error(res, 0) end
  local function bind(m)
    local experts = res.c.n_experts > 0
    for _, w in ipairs(hf.weight_list(res.c)) do
      local t = res.by_kind[hf.weight_key(w[1], w[2], w.expert)]
      if not t then
        error(string.format("%s: tensor '%s' is missing", path, w[1] < 0 and M.gguf_name(w[2]) or
          string.format("blk.%d.%s", w[1], M.gguf_name(w[2], experts, res.facts.gguf_architecture))), 0)
      end
      local bound, err = hf.bind(m, t.layer, t.kind, t.view, t.expert)
      if not bound then error(string.format("%s: tensor '%s': %s", path, t.name, err), 0) end
    end
  end
  res.facts.config = res.cfg
  return res.c, res.facts, g, bind, res.by_kind
end

-- The GGUF name (without blk.N.) of weight kind k (experts: of a mixture of experts' layer; arch:
-- the GGUF architecture, whose family may name it or fuse it with others).
function M.gguf_name(k, experts, arch)
  for n, kk in pairs(global_names) do if kk == k then return n end end
  for n, kk in pairs(layer_names_of(arch, experts)) do
    if kk == k then return n end
    if type(kk) == "table" then for _, x in ipairs(kk) do if x == k then return n end end end
  end
end

return M
