-- Hugging Face -> GGUF for the specs, as llama.cpp's convert_hf_to_gguf.py writes it (its
-- mixtures of experts: docs/models.md, "Mixture of experts"): q/k rows of
-- `llama` (Mixtral too) permuted to Meta's pairs, qwen2/qwen3 and their MoE as they are; Llama
-- 3's RoPE scaling as rope_freqs; a layer's routed experts stacked into one 3-D tensor per part
-- (ffn_{gate,up,down}_exps: expert e's matrix is the e-th slice), the router as ffn_gate_inp,
-- Qwen2-MoE's shared expert as ffn_*_shexp and its gate as ffn_gate_inp_shexp ([dim, 1]); 1-D
-- tensors, norms, biases and routers in F32 (the converter forces them), every other matrix
-- in the source's dtype; the vocabulary from the directory's tokenizer.bin (loip synth's; or
-- o200k_harmony's, as gpt-oss's GGUF has it, from `synth --tokenizer o200k_base.tiktoken`). A
-- family's own tensors (fused by rows: Phi-3's qkv_proj -> attn_qkv) and metadata keys come from
-- its description (lua/loip/model/families/); a class whose norms scale by 1 + w (Gemma 3) has
-- its norms stored as 1 + w in F32 (the converter's norm_shift), its config read through its
-- prepare function (Gemma3ForConditionalGeneration: text_config, tensors under its prefix); a
-- linear RoPE scaling is written as rope.scaling.type/factor.
--
--   require("spec.support.to_gguf").convert("synth-dir", "out.gguf")   -- arch from config.json
local ffi = require "ffi"
local bit = require "bit"
local json = require "loip.text.json"
local gguf = require "loip.model.gguf"
local core = require "loip.core"
local T = require "spec.support"
local families = require "loip.model.families"

local M = {}

-- The GGUF architecture of a Hugging Face class: the one that reads as that class (or as it
-- with experts), else its family's.
M.arch_of = {}
for arch, spec in pairs(families.gguf) do
  M.arch_of[spec.class] = arch
  if spec.moe then M.arch_of[spec.moe.class] = arch end
end
for class, f in pairs(families.family_of_class) do
  if not M.arch_of[class] and f.gguf then M.arch_of[class] = next(f.gguf) end
end

local hf_to_gguf = {
  ["model.embed_tokens.weight"] = "token_embd.weight", ["model.norm.weight"] = "output_norm.weight",
  ["lm_head.weight"] = "output.weight",
}
local layer_to_gguf = {
  ["input_layernorm.weight"] = "attn_norm.weight", ["self_attn.q_proj.weight"] = "attn_q.weight",
  ["self_attn.k_proj.weight"] = "attn_k.weight", ["self_attn.v_proj.weight"] = "attn_v.weight",
  ["self_attn.o_proj.weight"] = "attn_output.weight", ["self_attn.q_proj.bias"] = "attn_q.bias",
  ["self_attn.k_proj.bias"] = "attn_k.bias", ["self_attn.v_proj.bias"] = "attn_v.bias",
  ["self_attn.q_norm.weight"] = "attn_q_norm.weight", ["self_attn.k_norm.weight"] = "attn_k_norm.weight",
  ["post_attention_layernorm.weight"] = "ffn_norm.weight", ["mlp.gate_proj.weight"] = "ffn_gate.weight",
  ["mlp.up_proj.weight"] = "ffn_up.weight", ["mlp.down_proj.weight"] = "ffn_down.weight",
  ["mlp.gate.weight"] = "ffn_gate_inp.weight", ["block_sparse_moe.gate.weight"] = "ffn_gate_inp.weight",
  ["mlp.shared_expert.gate_proj.weight"] = "ffn_gate_shexp.weight", ["mlp.shared_expert.up_proj.weight"] = "ffn_up_shexp.weight",
  ["mlp.shared_expert.down_proj.weight"] = "ffn_down_shexp.weight",
  ["mlp.shared_expert_gate.weight"] = "ffn_gate_inp_shexp.weight",
  -- gpt-oss's
  ["self_attn.o_proj.bias"] = "attn_output.bias", ["self_attn.sinks"] = "attn_sinks.weight",
  ["mlp.router.weight"] = "ffn_gate_inp.weight", ["mlp.router.bias"] = "ffn_gate_inp.bias",
  ["post_feedforward_layernorm.weight"] = "post_ffw_norm.weight",
}

-- gpt-oss's fused experts as GptOssModel.modify_tensors cuts them (MXFP4 blocks and scales as
-- its repack_mxfp4 does: rows de-interleaved the same way, each block the scale byte then
-- element j in the low nibble of byte j and j+16 in its high): gate_up_proj [E, dim, 2f]
-- transposed to [E, 2f, dim] and its even rows the gates, odd rows the ups (ffn_gate_exps,
-- ffn_up_exps); down_proj [E, f, dim] transposed (ffn_down_exps); gate_up_proj_bias [E, 2f]
-- split the same way (ffn_{gate,up}_exps.bias), down_proj_bias as it is. Returns the GGUF
-- tensors of HF tensor `rest` of layer l (t: its safetensors entry, data: its bytes), or nil
-- when rest is not one of them.
local function gpt_oss_experts(set, l, rest, t, data)
  local es = t.dtype == "F32" and 4 or 2
  local function pick(E, R, C, base, rs, cs) -- out[e][r][c] = in[e*plane + base + r*rs + c*cs] (elements)
    local plane = t.nbytes / es / E
    local out = {}
    for e = 0, E - 1 do
      for r = 0, R - 1 do
        for c = 0, C - 1 do
          local at = (e * plane + base + r * rs + c * cs) * es
          out[#out + 1] = data:sub(at + 1, at + es)
        end
      end
    end
    return table.concat(out)
  end
  local b = "blk." .. l .. "."
  if rest:match("_scales$") then return {} end -- (with its blocks)
  if rest:match("_blocks$") then -- MXFP4 as released: repacked (GptOssModel.repack_mxfp4)
    local sname = "model.layers." .. l .. "." .. rest:gsub("_blocks$", "_scales")
    local f = set.index[sname]
    local st = f.tensors[sname]
    local scales = ffi.string(f.data + st.offset, st.nbytes)
    local E, R, NB = t.shape[1], t.shape[2], t.shape[3]
    local function repack(first, step, rows)
      local out = {}
      for e = 0, E - 1 do
        for r = 0, rows - 1 do
          local row = e * R + first + r * step
          for k = 0, NB - 1 do
            local i = (row * NB + k) * 16
            local blk = { scales:sub(row * NB + k + 1, row * NB + k + 1) }
            for j = 0, 15 do
              local lo = bit.band(bit.rshift(data:byte(i + bit.rshift(j, 1) + 1), 4 * bit.band(j, 1)), 15)
              local hi = bit.band(bit.rshift(data:byte(i + 8 + bit.rshift(j, 1) + 1), 4 * bit.band(j, 1)), 15)
              blk[#blk + 1] = string.char(bit.bor(lo, bit.lshift(hi, 4)))
            end
            out[#out + 1] = table.concat(blk)
          end
        end
      end
      return table.concat(out)
    end
    if rest == "mlp.experts.down_proj_blocks" then
      return { { name = b .. "ffn_down_exps.weight", type = "MXFP4", dims = { NB * 32, R, E }, data = repack(0, 1, R) } }
    end
    return { { name = b .. "ffn_gate_exps.weight", type = "MXFP4", dims = { NB * 32, R / 2, E }, data = repack(0, 2, R / 2) },
      { name = b .. "ffn_up_exps.weight", type = "MXFP4", dims = { NB * 32, R / 2, E }, data = repack(1, 2, R / 2) } }
  end
  if rest == "mlp.experts.gate_up_proj" then
    local E, D, F2 = t.shape[1], t.shape[2], t.shape[3]
    return { { name = b .. "ffn_gate_exps.weight", type = t.dtype, dims = { D, F2 / 2, E }, data = pick(E, F2 / 2, D, 0, 2, F2) },
      { name = b .. "ffn_up_exps.weight", type = t.dtype, dims = { D, F2 / 2, E }, data = pick(E, F2 / 2, D, 1, 2, F2) } }
  elseif rest == "mlp.experts.down_proj" then
    local E, F, D = t.shape[1], t.shape[2], t.shape[3]
    return { { name = b .. "ffn_down_exps.weight", type = t.dtype, dims = { F, D, E }, data = pick(E, D, F, 0, 1, D) } }
  elseif rest == "mlp.experts.gate_up_proj_bias" then
    local E, F2 = t.shape[1], t.shape[2]
    return { { name = b .. "ffn_gate_exps.bias", type = t.dtype, dims = { F2 / 2, E }, data = pick(E, 1, F2 / 2, 0, 0, 2) },
      { name = b .. "ffn_up_exps.bias", type = t.dtype, dims = { F2 / 2, E }, data = pick(E, 1, F2 / 2, 1, 0, 2) } }
  elseif rest == "mlp.experts.down_proj_bias" then
    return { { name = b .. "ffn_down_exps.bias", type = t.dtype, dims = { t.shape[2], t.shape[1] }, data = data } }
  end
end
-- A family's own tensors (its classes' and GGUF architecture's `layer`: fused by rows or renamed)
-- matched by the weight kinds they hold.
local function family_names(class, arch)
  local out = {}
  local hl, gl = (families.classes[class] or {}).layer or {}, (families.gguf[arch] or {}).layer or {}
  local function key(k) return type(k) == "table" and table.concat(k, ",") or tostring(k) end
  for hname, hk in pairs(hl) do
    for gname, gk in pairs(gl) do if key(hk) == key(gk) then out[hname] = gname end end
  end
  return out
end

-- A routed expert's part -> its stacked tensor (Mixtral: w1 gate, w3 up, w2 down).
local expert_to_gguf = { gate_proj = "ffn_gate_exps.weight", up_proj = "ffn_up_exps.weight", down_proj = "ffn_down_exps.weight",
  w1 = "ffn_gate_exps.weight", w3 = "ffn_up_exps.weight", w2 = "ffn_down_exps.weight" }

-- Rows of a q/k matrix from rotate-half order back to Meta's pairs, per head of hd rows
-- (llama.cpp's LlamaModel.permute): Meta's row 2k+e is Hugging Face's row e*hd/2 + k.
local function to_pairs(data, rows, row_bytes, hd)
  local out = {}
  for r = 0, rows - 1 do
    local h, i = math.floor(r / hd), r % hd
    local src = h * hd + (i % 2) * hd / 2 + math.floor(i / 2)
    out[r + 1] = data:sub(src * row_bytes + 1, (src + 1) * row_bytes)
  end
  return table.concat(out)
end

-- The bytes of a BF16/F16 tensor as F32 (exact).
local function widen(data, dtype)
  local K = core.constants
  local n = #data / 2
  local out = ffi.new("float[?]", n)
  assert(core.C.loip_convert(out, K.F32, data, dtype == "BF16" and K.BF16 or K.F16, n) == 0)
  return ffi.string(out, n * 4)
end

-- F32 bytes w as 1 + w (the converter's norm_shift of Gemma 3's norms, added in F32).
local function plus_one(data)
  local n = #data / 4
  local src, out = ffi.cast("const float *", data), ffi.new("float[?]", n)
  for i = 0, n - 1 do out[i] = src[i] + 1 end
  return ffi.string(out, n * 4)
end

local function llama3_freqs(cfg, hd)
  local rs, f = cfg.rope_scaling, {}
  for i = 0, hd / 2 - 1 do
    local wavelen = 2 * math.pi / (cfg.rope_theta ^ (-(2 * i) / hd))
    local orig = rs.original_max_position_embeddings
    if wavelen < orig / rs.high_freq_factor then f[i + 1] = 1
    elseif wavelen > orig / rs.low_freq_factor then f[i + 1] = rs.factor
    else
      local s = (orig / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
      f[i + 1] = 1 / ((1 - s) / rs.factor + s)
    end
  end
  return { name = "rope_freqs.weight", type = "F32", dims = { hd / 2 }, data = T.f32_bytes(f) }
end

-- The vocabulary of tokenizer.bin as tokenizer.ggml.* metadata (SentencePiece-style "llama"),
-- or of o200k_harmony's ranks as tokenizer.model (`loip synth --tokenizer`) as gpt-oss's GGUF
-- has it (spec/support/o200k.lua).
local function vocab(dir)
  if not T.exists(dir .. "/tokenizer.bin") and T.exists(dir .. "/tokenizer.model") then
    local tok = require("loip").tokenizer.open_file(dir .. "/tokenizer.model")
    assert(tok.encoding == "o200k_harmony", dir .. "/tokenizer.model: not o200k_harmony's ranks, the one tokenizer.model written here")
    local o200k = require "spec.support.o200k"
    local md = o200k.gguf_metadata(o200k.hf_vocab(tok))
    tok:close()
    return md
  end
  local tok = require("loip").tokenizer.open_file(dir .. "/tokenizer.bin")
  local tokens, scores, types = {}, {}, {}
  for id = 0, tok.vocab_size - 1 do
    local p = tok.pieces[id]
    tokens[id + 1], scores[id + 1] = p:gsub(" ", "\226\150\129"), 0
    types[id + 1] = p:match("^<0x%x%x>$") and 6 or (id <= 2 and (id == 0 and 2 or 3) or 1)
    if not p:match("^<0x%x%x>$") and id > 2 then scores[id + 1] = -id end
  end
  tok:close()
  return {
    { "tokenizer.ggml.model", "STRING", "llama" }, { "tokenizer.ggml.tokens", "ARRAY[STRING]", tokens },
    { "tokenizer.ggml.scores", "ARRAY[FLOAT32]", scores }, { "tokenizer.ggml.token_type", "ARRAY[INT32]", types },
    { "tokenizer.ggml.bos_token_id", "UINT32", 1 }, { "tokenizer.ggml.eos_token_id", "UINT32", 2 },
  }
end

-- The metadata keys of config cfg for architecture arch.
local function keys(cfg, arch, hd, spec)
  local a = function(k) return arch .. "." .. k end
  local md = {
    { "general.architecture", "STRING", arch },
    { a "context_length", "UINT32", cfg.max_position_embeddings }, { a "embedding_length", "UINT32", cfg.hidden_size },
    { a "block_count", "UINT32", cfg.num_hidden_layers }, { a "feed_forward_length", "UINT32", cfg.intermediate_size },
    { a "attention.head_count", "UINT32", cfg.num_attention_heads },
    { a "attention.head_count_kv", "UINT32", cfg.num_key_value_heads },
    { a "attention.key_length", "UINT32", hd }, { a "attention.value_length", "UINT32", hd },
    { a "rope.dimension_count", "UINT32", hd }, { a "rope.freq_base", "FLOAT32", cfg.rope_theta },
    { a "attention.layer_norm_rms_epsilon", "FLOAT32", cfg.rms_norm_eps },
  }
  local n = cfg.num_local_experts or cfg.num_experts
  if n then
    md[#md + 1] = { a "expert_count", "UINT32", n }
    md[#md + 1] = { a "expert_used_count", "UINT32", cfg.num_experts_per_tok }
  end
  if cfg.moe_intermediate_size then md[#md + 1] = { a "expert_feed_forward_length", "UINT32", cfg.moe_intermediate_size } end
  if arch == "gpt-oss" then md[#md + 1] = { a "expert_feed_forward_length", "UINT32", cfg.intermediate_size } end
  local rs = cfg.rope_scaling
  if type(rs) == "table" and rs.rope_type == "yarn" then -- (as TextModel.set_gguf_parameters writes YaRN)
    md[#md + 1] = { a "rope.scaling.type", "STRING", "yarn" }
    md[#md + 1] = { a "rope.scaling.factor", "FLOAT32", rs.factor }
    md[#md + 1] = { a "rope.scaling.original_context_length", "UINT32", rs.original_max_position_embeddings }
    if rs.beta_fast then md[#md + 1] = { a "rope.scaling.yarn_beta_fast", "FLOAT32", rs.beta_fast } end
    if rs.beta_slow then md[#md + 1] = { a "rope.scaling.yarn_beta_slow", "FLOAT32", rs.beta_slow } end
  end
  if cfg.shared_expert_intermediate_size then
    md[#md + 1] = { a "expert_shared_feed_forward_length", "UINT32", cfg.shared_expert_intermediate_size }
  end
  -- sliding windows (layer_types), as the converter writes a per-layer pattern: a bool a layer
  -- (a family whose keys name the window, Gemma 3's and gpt-oss's, writes it alone, as their
  -- converters do: llama.cpp knows their patterns)
  local keys_of = spec.keys or {}
  if type(cfg.sliding_window) == "number" and type(cfg.layer_types) == "table" and not keys_of["attention.sliding_window"] then
    local pattern = {}
    for i, t in ipairs(cfg.layer_types) do pattern[i] = t == "sliding_attention" end
    md[#md + 1] = { a "attention.sliding_window", "UINT32", cfg.sliding_window }
    md[#md + 1] = { a "attention.sliding_window_pattern", "ARRAY[BOOL]", pattern }
  end
  for _, k in ipairs(families.names(keys_of)) do
    local field, kind = keys_of[k], "UINT32"
    if type(field) == "table" then field, kind = field[1], field[2] end
    local v = cfg[field]
    md[#md + 1] = { a(k), kind, type(v) == "number" and v or 0 }
  end
  -- (the converter's linear RoPE scaling: TextModel.set_gguf_parameters)
  local rs = cfg.rope_scaling
  if type(rs) == "table" and (rs.rope_type or rs.type) == "linear" then
    md[#md + 1] = { a "rope.scaling.type", "STRING", "linear" }
    md[#md + 1] = { a "rope.scaling.factor", "FLOAT32", rs.factor }
  end
  return md
end

-- The GGUF of the Hugging Face directory dir (loip synth's output), written to path. arch: the
-- GGUF architecture (default: the config's class's); extra: metadata { key, type, value } to add
-- (bad input for the specs).
function M.convert(dir, path, arch, extra)
  local cfg = assert(json.load(dir .. "/config.json"))
  local class = families.classes[cfg.architectures[1]] or {}
  if class.prepare then cfg = class.prepare(cfg, dir .. "/config.json") end
  arch = arch or M.arch_of[cfg.architectures[1]]
  local set = assert(require("loip.model.safetensors").open_dir(dir))
  local hd = cfg.head_dim or cfg.hidden_size / cfg.num_attention_heads
  local spec = families.gguf[arch] or {}
  local own = family_names(cfg.architectures[1], arch)
  local tensors, experts = {}, {}
  local names = {}
  for name in pairs(set.index) do names[#names + 1] = name end
  table.sort(names)
  for _, full in ipairs(names) do
    local f = set.index[full]
    local t = f.tensors[full]
    local data = ffi.string(f.data + t.offset, t.nbytes)
    local name = class.prefix and full:sub(1, #class.prefix) == class.prefix and full:sub(#class.prefix + 1) or full
    local l, rest = name:match("^model%.layers%.(%d+)%.(.+)$")
    local e, part = (rest or ""):match("experts%.(%d+)%.([%w_]+)%.weight$")
    local fused = arch == "gpt-oss" and l and gpt_oss_experts(set, l, rest, t, data)
    if fused then
      for _, x in ipairs(fused) do
        if x.type ~= "F32" and (#x.dims == 2) then x.data, x.type = widen(x.data, x.type), "F32" end -- (biases)
        tensors[#tensors + 1] = x
      end
    elseif e then
      -- stacked below, in expert order: [experts, rows, cols] is GGUF's { cols, rows, experts }
      local key = "blk." .. l .. "." .. expert_to_gguf[part]
      experts[key] = experts[key] or { name = key, type = t.dtype, dims = { t.shape[2], t.shape[1], 0 }, parts = {} }
      experts[key].parts[tonumber(e) + 1] = data
    else
      local gname = l and ("blk." .. l .. "." .. (own[rest] or layer_to_gguf[rest])) or hf_to_gguf[name]
      assert(gname, name)
      if spec.interleaved and (rest == "self_attn.q_proj.weight" or rest == "self_attn.k_proj.weight") then
        data = to_pairs(data, t.shape[1], t.nbytes / t.shape[1], hd)
      end
      local dims = {}
      for i = #t.shape, 1, -1 do dims[#dims + 1] = t.shape[i] end
      local dtype = t.dtype
      local f32 = #dims == 1 or gname:match("_norm%.weight$") or gname:match("ffn_gate_inp") or not gname:match("%.weight$")
      if f32 and dtype ~= "F32" then data, dtype = widen(data, dtype), "F32" end
      if class.norms_zero_centred and name:match("norm%.weight$") then data = plus_one(data) end
      tensors[#tensors + 1] = { name = gname, type = dtype, dims = dims, data = data }
    end
  end
  require("loip.model.safetensors").close(set)
  local stacked = {}
  for key in pairs(experts) do stacked[#stacked + 1] = key end
  table.sort(stacked)
  for _, key in ipairs(stacked) do
    local x = experts[key]
    x.dims[3], x.data, x.parts = #x.parts, table.concat(x.parts), nil
    tensors[#tensors + 1] = x
  end
  if type(cfg.rope_scaling) == "table" and cfg.rope_scaling.rope_type == "llama3" then tensors[#tensors + 1] = llama3_freqs(cfg, hd) end
  local md = keys(cfg, arch, hd, spec)
  for _, kv in ipairs(vocab(dir)) do md[#md + 1] = kv end
  for _, kv in ipairs(extra or {}) do md[#md + 1] = kv end
  -- piece by piece: a 1B model's file is past LuaJIT's 2 GB string limit
  local f = assert(io.open(path, "wb"))
  for _, part in ipairs(gguf.encode_parts(md, tensors)) do assert(f:write(part)) end
  assert(f:close())
end

return M
