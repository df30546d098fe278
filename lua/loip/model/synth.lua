-- Synthetic models for benchmarks: a Hugging Face directory with a real model's shapes and
-- seeded random weights (C fills them; this module plans the files), plus a llama2.c
-- tokenizer.bin with as many tokens as the vocabulary so that text goes in and comes out, or
-- the real tokenizer file o.tokenizer names (gpt-oss's o200k_base.tiktoken, say), copied in.
--
-- The directory is complete only when config.json exists: it is written last, and every file
-- is written under a temporary name and renamed when whole.
local ffi = require "ffi"
local bit = require "bit"
local core = require "loip.core"
local json = require "loip.text.json"
local shapes = require "loip.model.shapes"
local hf = require "loip.model.hf"
local fp8 = require "loip.model.fp8"
local progress = require "loip.ui.progress"
local exec = require "loip.runtime.exec"
local files_rt = require "loip.runtime.files"
local memory = require "loip.runtime.memory"
local shell = require "loip.runtime.shell"

local M = {}

local K = core.constants
local dtypes = { bf16 = { "BF16", K.BF16, 2 }, f16 = { "F16", K.F16, 2 }, f32 = { "F32", K.F32, 4 } }
local STD = 0.02 -- default weight scale (as initializer_range)
local CHUNK = 16 * 1024 * 1024 -- elements per fill

local function mkdir_p(dir)
  local ok, err = shell.mkdir_p(dir)
  if not ok then error(err, 0) end
end

-- Seed of one tensor: the run's seed and the tensor's name, so tensors do not depend on the
-- order or sharding in which they are written.
local function tensor_seed(seed, name)
  local h = 2166136261
  for i = 1, #name do h = bit.tobit((bit.bxor(h, name:byte(i))) * 16777619) end
  return ffi.new("uint64_t", seed) * 4294967296ULL + ffi.new("uint64_t", bit.band(h, 0x7fffffff))
end

-- The config table for the flags (shape name plus overrides). For a mixture of experts'
-- shape, experts and experts_per_token set its expert count and top-k, and ffn an expert's size
-- (a shared expert keeps its ratio to it).
-- --sliding-window and --layer-types into cfg as Hugging Face writes them: sliding_window and
-- layer_types, one per layer (the pattern of s and f repeated; no pattern: every layer windowed,
-- or a shape's own windowed layers, Gemma 3's sliding_window_pattern or gpt-oss's layer_types,
-- with the new window).
local function windows(cfg, o)
  if o.layer_types ~= nil and o.sliding_window == nil then error("synth: --layer-types needs --sliding-window", 0) end
  if o.sliding_window == nil then return end
  if o.sliding_window <= 0 then error("synth: --sliding-window must be positive", 0) end
  if o.layer_types == nil and (cfg.sliding_window_pattern or type(cfg.layer_types) == "table") then
    cfg.sliding_window = o.sliding_window
    return
  end
  cfg.sliding_window_pattern = nil
  local pat = o.layer_types or "s"
  if type(pat) ~= "string" or not pat:match("^[sf]+$") then
    error(string.format("synth: --layer-types '%s' is not a pattern of s (sliding) and f (full), e.g. sssssf", tostring(pat)), 0)
  end
  cfg.sliding_window, cfg.use_sliding_window, cfg.max_window_layers = o.sliding_window, true, nil
  cfg.layer_types = {}
  for l = 1, cfg.num_hidden_layers do
    local ch = pat:sub((l - 1) % #pat + 1, (l - 1) % #pat + 1)
    cfg.layer_types[l] = ch == "s" and "sliding_attention" or "full_attention"
  end
end

function M.config(o)
  local cfg, err = shapes.get(o.like)
  if not cfg then error(err, 0) end
  local over = { layers = "num_hidden_layers", dim = "hidden_size", ffn = "intermediate_size",
    heads = "num_attention_heads", kv_heads = "num_key_value_heads", head_dim = "head_dim", vocab = "vocab_size",
    experts = false, experts_per_token = false }
  local moe = shapes.expert_fields(cfg)
  -- (Gemma's query_pre_attn_scalar is the head dimension, or dim / heads (27b): kept so when they change)
  local qpas = cfg.query_pre_attn_scalar
  local qpas_of = qpas and (qpas == cfg.head_dim and "head_dim" or qpas == cfg.hidden_size / cfg.num_attention_heads and "width")
  local shared_ratio = moe and cfg.shared_expert_intermediate_size and cfg.shared_expert_intermediate_size / cfg[moe.ffn]
  for flag, field in pairs(over) do
    if o[flag] ~= nil then
      local name = "--" .. flag:gsub("_", "-")
      if o[flag] <= 0 then error(string.format("synth: %s must be positive", name), 0) end
      if not field and not moe then error(string.format("synth: %s is for a mixture of experts' shape; %s is dense", name, o.like), 0) end
      cfg[moe and moe[flag] or field] = o[flag]
    end
  end
  if shared_ratio and o.ffn then cfg.shared_expert_intermediate_size = math.floor(o.ffn * shared_ratio + 0.5) end
  if (o.dim or o.heads) and not o.head_dim and cfg.head_dim then
    cfg.head_dim = math.floor(cfg.hidden_size / cfg.num_attention_heads)
  end
  if qpas_of == "head_dim" then cfg.query_pre_attn_scalar = cfg.head_dim
  elseif qpas_of == "width" then cfg.query_pre_attn_scalar = cfg.hidden_size / cfg.num_attention_heads end
  -- (per-layer attention kinds for another layer count: the shape's own list, cut or repeated)
  if type(cfg.layer_types) == "table" and #cfg.layer_types ~= cfg.num_hidden_layers then
    local t = {}
    for i = 1, cfg.num_hidden_layers do t[i] = cfg.layer_types[(i - 1) % #cfg.layer_types + 1] end
    cfg.layer_types = t
  end
  windows(cfg, o)
  if cfg.vocab_size < 259 then error("synth: the vocabulary needs at least 259 tokens (specials and bytes)", 0) end
  cfg.bos_token_id, cfg.eos_token_id = 1, 2
  cfg.torch_dtype = ({ bf16 = "bfloat16", f16 = "float16", f32 = "float32" })[o.dtype]
  cfg.loip_synthetic = { like = o.like, seed = o.seed, std = o.std or STD }
  -- the experts: as the shape is released (gpt-oss: MXFP4, its quantization_config), unless
  -- --experts-dtype says mxfp4 or --dtype's
  local released = type(cfg.quantization_config) == "table" and cfg.quantization_config.quant_method
  if o.experts_dtype == "mxfp4" and released ~= "mxfp4" then
    if not moe then error(string.format("synth: --experts-dtype mxfp4 is for a mixture of experts' shape; %s is dense", o.like), 0) end
    cfg.quantization_config = { quant_method = "mxfp4" }
  elseif o.experts_dtype ~= nil and o.experts_dtype ~= "mxfp4" then
    if o.experts_dtype ~= o.dtype then
      error(string.format("synth: --experts-dtype '%s' is neither mxfp4 nor --dtype's (%s)", tostring(o.experts_dtype), tostring(o.dtype)), 0)
    end
    cfg.quantization_config = nil
  end
  -- the layers' Linear weights as an FP8 checkpoint's (--weights-dtype fp8)
  if o.weights_dtype ~= nil and o.weights_dtype ~= o.dtype then
    if o.weights_dtype ~= "fp8" then
      error(string.format("synth: --weights-dtype '%s' is neither fp8 nor --dtype's (%s)", tostring(o.weights_dtype), tostring(o.dtype)), 0)
    end
    if type(cfg.quantization_config) == "table" then
      error(string.format("synth: --weights-dtype fp8: %s is released with quantization_config '%s' already (pass --experts-dtype %s)",
        o.like, tostring(cfg.quantization_config.quant_method), tostring(o.dtype)), 0)
    end
    cfg.quantization_config = fp8.config()
  end
  return cfg
end

-- "fp8" when a synthesised config's layer weights are FP8 (quantization_config), else nil.
function M.weights_dtype(cfg)
  local q = cfg.quantization_config
  return type(q) == "table" and q.quant_method == "fp8" and "fp8" or nil
end

-- The dtype a synthesised config's experts are written in: "mxfp4" (quantization_config), or nil
-- (the model's).
function M.experts_dtype(cfg)
  local q = cfg.quantization_config
  return type(q) == "table" and q.quant_method == "mxfp4" and "mxfp4" or nil
end

-- Weights written as FP8 (--weights-dtype fp8, a Hugging Face FP8 checkpoint's quantization_config):
-- the decoder layers' Linear weights (*_proj.weight: attention, MLP, experts) as E4M3 with float32
-- weight_scale_inv per 128x128 block; embeddings, norms, the head and a router in --dtype, as
-- DeepSeek-V3 and Qwen3-FP8 publish them.
local function fp8_weight(name, shape) return #shape == 2 and name:match("^model%.layers%.%d+%..*_proj%.weight$") ~= nil end

-- Tensors of the model: { name, shape, mean, std, numel [, dtype, fill (a U8 tensor's)] }. Norms
-- are 1, or drawn around 0 (as random as the rest) for a class whose norms scale by 1 + w (Gemma's).
local function tensor_plan(c, std, arch, experts_dtype, fp8)
  local plan = {}
  local centred = (hf.architectures[arch or ""] or {}).norms_zero_centred
  for _, t in ipairs(hf.tensor_list(c, arch, experts_dtype)) do
    local name, shape = t.name, t.shape
    local numel = 1
    for _, d in ipairs(shape) do numel = numel * d end
    local is_norm = name:match("norm%.weight$")
    plan[#plan + 1] = { name = name, shape = shape, numel = numel, mean = (is_norm and not centred) and 1 or 0,
      std = (is_norm and not centred) and 0 or std, dtype = t.dtype, fill = t.fill }
    if fp8 and fp8_weight(name, shape) then
      plan[#plan].dtype, plan[#plan].fill = "F8_E4M3", "fp8"
      local ss = { math.ceil(shape[1] / 128), math.ceil(shape[2] / 128) }
      plan[#plan + 1] = { name = name .. "_scale_inv", shape = ss, numel = ss[1] * ss[2], std = std, dtype = "F32", fill = "fp8_scales" }
    end
  end
  return plan
end

-- Bytes of plan entry t when the model's dtype has es bytes an element (a U8 tensor: 1).
-- (an FP8 weight's E4M3 bytes: 1; its float32 scales: 4)
local function elem_of(t, es) return t.fill == "fp8_scales" and 4 or (t.dtype == "U8" or t.fill == "fp8") and 1 or es end
local function bytes_of(t, es) return t.numel * elem_of(t, es) end

-- n random bytes at data for a U8 tensor (t.fill): MXFP4 blocks any 4-bit codes (the low byte of
-- each normal float drawn: near uniform); MXFP4 scales exponents that give the E2M1 values (up to
-- 6) about the standard deviation std (within a factor of 2 either way). Seeded as the float
-- tensors, from the stream position first; the floats are drawn into data and read in place.
local function fill_bytes(data, n, t, seed, first, std)
  assert(exec.fill_random(data, n, K.F32, seed, first, 0, 1))
  if t.fill ~= "mxfp4_scales" then -- (byte i from byte 4i: read before it is written)
    assert(exec.gather_elements(data, data, 1, 0, 1, 0, n, 4))
    return
  end
  local f, out = ffi.cast("float *", data), ffi.cast("uint8_t *", data)
  local centre = 127 + math.floor(math.log(math.max(std, 1e-6) / 2.5) / math.log(2) + 0.5)
  for i = 0, n - 1 do -- (in place: byte i is written after float i is read, and i <= 4i)
    local u = f[i] * 0.5 + 0.5 -- (a normal value: its fractional part is near uniform)
    u = u - math.floor(u)
    out[i] = math.max(1, math.min(254, centre - 1 + math.floor(u * 3)))
  end
end

-- E4M3FN's byte nearest x (the largest finite, 448, for what is beyond it; never NaN).
local function e4m3(x)
  local sign = x < 0 and 0x80 or 0
  x = math.abs(x)
  if x < 2 ^ -6 then return sign + math.floor(x * 512 + 0.5) end -- (subnormals: m * 2^-9)
  local m, e = math.frexp(x) -- (x = m * 2^e, m in [0.5, 1))
  local q, E = math.floor((2 * m - 1) * 8 + 0.5), e + 6
  if q == 8 then q, E = 0, E + 1 end
  if E > 15 or (E == 15 and q == 7) then return sign + 0x7E end
  return sign + E * 8 + q
end

-- n values of an FP8 weight at data (t.fill "fp8": E4M3 bytes of normal values of standard
-- deviation 64, within E4M3's +-448) or of its scales ("fp8_scales": float32 t.std / 64 times
-- 2^u, u within +-0.5, with 20 significant bits so that each E4M3 value (4) times its scale is
-- exact in f32: the dequantized model is the same model). Seeded as the float tensors.
local function fill_fp8(data, n, t, seed, first)
  assert(exec.fill_random(data, n, K.F32, seed, first, 0, 1))
  local f = ffi.cast("float *", data)
  if t.fill == "fp8_scales" then
    for i = 0, n - 1 do
      local m, e = math.frexp(t.std / 64 * 2 ^ (math.max(-1, math.min(1, f[i])) * 0.5))
      f[i] = math.ldexp(math.floor(m * 2 ^ 20 + 0.5) / 2 ^ 20, e)
    end
    return
  end
  local out = ffi.cast("uint8_t *", data)
  for i = 0, n - 1 do out[i] = e4m3(f[i] * 64) end -- (in place: byte i after float i is read)
end

-- Group tensors into shards of at most shard_bytes (a larger tensor gets a shard of its own).
local function shard(plan, es, shard_bytes)
  local shards, cur, size = {}, {}, 0
  for _, t in ipairs(plan) do
    local b = bytes_of(t, es)
    if #cur > 0 and size + b > shard_bytes then
      shards[#shards + 1] = cur
      cur, size = {}, 0
    end
    cur[#cur + 1] = t
    size = size + b
  end
  if #cur > 0 then shards[#shards + 1] = cur end
  return shards
end

local function u64le(n)
  local b = {}
  for i = 1, 8 do b[i] = string.char(n % 256) n = math.floor(n / 256) end
  return table.concat(b)
end

local function write_file(path, text)
  local w, err = files_rt.writer(path)
  if not w then error(err, 0) end
  assert(files_rt.write(w, text))
  assert(files_rt.commit(w))
  files_rt.writer_free(w)
end

-- tokenizer.bin in llama2.c's format: <unk>, BOS, EOS, 256 byte tokens, then printable
-- ASCII characters, then letter pairs and triples, until the vocabulary is full.
function M.tokenizer_bin(vocab)
  local pieces = { "<unk>", "\n<s>\n", "\n</s>\n" }
  for b = 0, 255 do pieces[#pieces + 1] = string.format("<0x%02X>", b) end
  local seen = {}
  local function add(p)
    if #pieces < vocab and not seen[p] then seen[p] = true pieces[#pieces + 1] = p end
  end
  for ch = 32, 126 do add(string.char(ch)) end
  local letters = "etaoinshrdlucmfwypvbgkjqxz"
  for i = 1, #letters do add(" " .. letters:sub(i, i)) end
  for i = 1, #letters do for j = 1, #letters do add(letters:sub(i, i) .. letters:sub(j, j)) end end
  for i = 1, #letters do for j = 1, #letters do add(" " .. letters:sub(i, i) .. letters:sub(j, j)) end end
  for i = 1, #letters do for j = 1, #letters do for k = 1, #letters do
    add(letters:sub(i, i) .. letters:sub(j, j) .. letters:sub(k, k))
  end end end
  local n = 0
  while #pieces < vocab do n = n + 1 add(string.format("<synth%d>", n)) end
  local maxlen = 0
  for _, p in ipairs(pieces) do maxlen = math.max(maxlen, #p) end
  local out = { ffi.string(ffi.new("uint32_t[1]", maxlen), 4) }
  for i, p in ipairs(pieces) do
    local score = i > 259 and -(i - 260) or 0
    out[#out + 1] = ffi.string(ffi.new("float[1]", score), 4) .. ffi.string(ffi.new("int32_t[1]", #p), 4) .. p
  end
  return table.concat(out)
end

-- The name a model directory gives each kind of tokenizer file (tokenizer.detect's kinds), and
-- the files read beside it that come along.
local TOKENIZER_FILES = { tiktoken = { "tokenizer.model", "special_tokens.json" },
  sentencepiece = { "tokenizer.model" }, hf = { "tokenizer.json", "tokenizer_config.json" }, llama2c = { "tokenizer.bin" } }

-- The tokenizer file at path, opened (so that a bad one fails before a weight is written):
-- { file = its text, name, side = { name = text }, bos, eos (an id or the list of stop ids) }.
-- Its ids must fit the model's vocabulary of vocab.
function M.tokenizer_file(path, vocab)
  local tokenizer = require "loip.text.tokenizer" -- (here: only --tokenizer needs the tokenizers, which load the model store)
  local ok, kind = pcall(tokenizer.detect, path)
  if not ok then error("synth: --tokenizer " .. tostring(kind), 0) end
  local names = TOKENIZER_FILES[kind]
  if not names then
    error(string.format("synth: --tokenizer %s is a %s tokenizer; synth copies tiktoken ranks, a SentencePiece "
      .. "model, a tokenizer.json or a llama2.c tokenizer.bin", path, kind), 0)
  end
  local tok
  ok, tok = pcall(tokenizer.open_file, path, { vocab_size = vocab })
  if not ok then error("synth: --tokenizer " .. tostring(tok), 0) end
  local n, bos, stops, eos = tok.vocab_size, tok.bos_id, tok.stop_ids, tok.eos_id
  tok:close()
  if n > vocab then
    error(string.format("synth: --tokenizer %s has %d ids, more than the vocabulary's %d (--vocab)", path, n, vocab), 0)
  end
  local out = { file = assert(json.read_file(path)), name = names[1], side = {}, bos = bos,
    eos = (stops and #stops > 1) and stops or eos }
  local dir = path:match("^(.*)/[^/]*$") or "."
  for i = 2, #names do
    if json.exists(dir .. "/" .. names[i]) then out.side[names[i]] = assert(json.read_file(dir .. "/" .. names[i])) end
  end
  return out
end

function M.write(dir, o)
  local dt = dtypes[o.dtype]
  if not dt then error(string.format("synth: --dtype '%s' is not one of bf16, f16, f32", tostring(o.dtype)), 0) end
  local cfg = M.config(o)
  local tf = o.tokenizer and M.tokenizer_file(o.tokenizer, cfg.vocab_size)
  if tf then cfg.bos_token_id, cfg.eos_token_id = tf.bos, tf.eos end
  local c = hf.parse_config(cfg, "synth config") -- validates the shape as the loader will
  local cm, err = exec.model_new(c)
  if not cm then error("synth: " .. err, 0) end
  exec.model_free(cm)
  local plan = tensor_plan(c, o.std or STD, cfg.architectures[1], M.experts_dtype(cfg), M.weights_dtype(cfg) == "fp8")
  local es = dt[3]
  local total = 0
  for _, t in ipairs(plan) do total = total + bytes_of(t, es) end
  mkdir_p(dir)
  if json.exists(dir .. "/config.json") and not o.force then
    error(dir .. ": already holds a model (config.json); pass --force to replace it", 0)
  end
  local free = assert(files_rt.disk_available(dir, dir))
  local need = total + 64 * 1024 * 1024
  if free < need then
    error(string.format("%s: not enough disk space: the model needs %s, %s are free", dir,
      progress.human(need), progress.human(free)), 0)
  end
  os.remove(dir .. "/config.json") -- the directory is not a model until we finish
  local shards = shard(plan, es, o.shard_size or 5 * 1024 ^ 3)
  local bar = progress.new(total, string.format("synth %s %s", o.like, o.dtype))
  local buf = memory.buffer(CHUNK * es)
  local data = memory.buffer_data(buf)
  local written, weight_map = 0, {}
  for si, list in ipairs(shards) do
    local fname = #shards == 1 and "model.safetensors"
      or string.format("model-%05d-of-%05d.safetensors", si, #shards)
    local header, off = { __metadata__ = { format = "pt", loip_synthetic = "1" } }, 0
    for _, t in ipairs(list) do
      header[t.name] = { dtype = t.dtype or dt[1], shape = t.shape, data_offsets = { off, off + bytes_of(t, es) } }
      off = off + bytes_of(t, es)
      weight_map[t.name] = fname
    end
    local h = json.encode_sorted(header)
    h = h .. string.rep(" ", (8 - #h % 8) % 8)
    local w, werr = files_rt.writer(dir .. "/" .. fname)
    if not w then error(werr, 0) end
    assert(files_rt.write(w, u64le(#h) .. h))
    for _, t in ipairs(list) do
      local seed = tensor_seed(o.seed or 1, t.name)
      local first = 0
      while first < t.numel do
        -- (a U8 tensor's bytes are drawn as floats first: a quarter of the buffer at a time)
        local drawn = t.dtype == "U8" or t.fill ~= nil
        local k = math.min(drawn and math.floor(CHUNK * es / 4) or CHUNK, t.numel - first)
        local kb = k * elem_of(t, es)
        if t.fill == "fp8" or t.fill == "fp8_scales" then fill_fp8(data, k, t, seed, first)
        elseif t.dtype == "U8" then fill_bytes(data, k, t, seed, first, o.std or STD)
        else assert(exec.fill_random(data, k, dt[2], seed, first, t.mean, t.std)) end
        assert(files_rt.write(w, data, kb))
        first = first + k
        written = written + kb
        bar:update(written)
      end
    end
    assert(files_rt.commit(w))
    files_rt.writer_free(w)
  end
  memory.buffer_free(buf)
  if #shards > 1 then
    write_file(dir .. "/model.safetensors.index.json",
      json.encode_sorted({ metadata = { total_size = total }, weight_map = weight_map }, 2))
  end
  if tf then
    write_file(dir .. "/" .. tf.name, tf.file)
    for name, text in pairs(tf.side) do write_file(dir .. "/" .. name, text) end
  else
    write_file(dir .. "/tokenizer.bin", M.tokenizer_bin(cfg.vocab_size))
  end
  write_file(dir .. "/generation_config.json", json.encode_sorted({ bos_token_id = cfg.bos_token_id, eos_token_id = cfg.eos_token_id }, 2))
  write_file(dir .. "/config.json", json.encode_sorted(cfg, 2))
  bar:finish(string.format("%s (%d file%s)", dir, #shards, #shards > 1 and "s" or ""))
  return { dir = dir, bytes = total, files = #shards, config = cfg }
end

return M
