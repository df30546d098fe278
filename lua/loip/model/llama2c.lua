-- llama2.c checkpoints (run.c's "legacy" version 0 .bin): a 7 x int32 header and float32
-- arrays in a fixed order; interleaved RoPE; classifier tied unless vocab_size < 0.
local ffi = require "ffi"
local core = require "loip.core"
local exec = require "loip.runtime.exec"
local files_rt = require "loip.runtime.files"
local K = core.constants

local M = {}

local HEADER = 28
-- run.c's constants: the format stores neither the norm epsilon nor the RoPE base.
M.NORM_EPS, M.ROPE_THETA = 1e-5, 10000
M.BOS, M.EOS = 1, { 1, 2 } -- run.c stops on BOS (it starts every story) as well as EOS

local NAMES = { "dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len" }

-- The header's fields by name (h: its int32s), checked (fail(msg) raises).
local function header(h, fail)
  local hv = {}
  for i, n in ipairs(NAMES) do hv[n] = h[i - 1] end
  for _, n in ipairs(NAMES) do
    if n ~= "vocab_size" and (hv[n] <= 0 or hv[n] > 1e7) then
      fail(string.format("header field %s = %d is not a plausible size (is this a llama2.c checkpoint?)", n, hv[n]))
    end
  end
  if hv.vocab_size == 0 then fail("header field vocab_size is 0") end
  if hv.dim % hv.n_heads ~= 0 then
    fail(string.format("header: dim %d is not a multiple of n_heads %d", hv.dim, hv.n_heads))
  end
  if hv.n_heads % hv.n_kv_heads ~= 0 then
    fail(string.format("header: n_heads %d is not a multiple of n_kv_heads %d", hv.n_heads, hv.n_kv_heads))
  end
  return hv
end

-- The model config of header hv (shared: the classifier is the embedding).
local function config_of(hv, vocab, shared)
  local c = ffi.new("loip_model_config")
  c.dim, c.hidden_dim, c.n_layers = hv.dim, hv.hidden_dim, hv.n_layers
  c.n_heads, c.n_kv_heads = hv.n_heads, hv.n_kv_heads
  c.head_dim = hv.dim / hv.n_heads
  c.vocab_size, c.max_seq = vocab, hv.seq_len
  c.norm_eps, c.rope_theta = M.NORM_EPS, M.ROPE_THETA
  c.rope_layout = K.ROPE_INTERLEAVED
  c.tied_embeddings = shared and 1 or 0
  return c
end

-- The arrays of run.c's memory_map_weights, in file order: { name, floats, per-layer kind
-- (-1: one array, then its kind), shape } (nil kind: RoPE tables loip computes itself).
local function arrays_of(hv, vocab, shared)
  local L, dim, hid, hd = hv.n_layers, hv.dim, hv.hidden_dim, hv.dim / hv.n_heads
  local kv = hv.n_kv_heads * hd
  local arrays = {
    { "token_embedding", vocab * dim, -1, K.W_EMBED, { vocab, dim } },
    { "rms_att", L * dim, K.W_ATTN_NORM, { dim } },
    { "wq", L * dim * dim, K.W_WQ, { dim, dim } },
    { "wk", L * kv * dim, K.W_WK, { kv, dim } },
    { "wv", L * kv * dim, K.W_WV, { kv, dim } },
    { "wo", L * dim * dim, K.W_WO, { dim, dim } },
    { "rms_ffn", L * dim, K.W_FFN_NORM, { dim } },
    { "w1", L * hid * dim, K.W_GATE, { hid, dim } },
    { "w2", L * dim * hid, K.W_DOWN, { dim, hid } },
    { "w3", L * hid * dim, K.W_UP, { hid, dim } },
    { "rms_final", dim, -1, K.W_OUTPUT_NORM, { dim } },
    { "freq_cis_real", hv.seq_len * hd / 2 },
    { "freq_cis_imag", hv.seq_len * hd / 2 },
  }
  if not shared then arrays[#arrays + 1] = { "wcls", vocab * dim, -1, K.W_LM_HEAD, { vocab, dim } } end
  return arrays
end

-- Every weight of the arrays at their offsets (bindings) in the mapping at base, as { layer,
-- kind, view, array name, shape, nbytes } (the slicer copies them).
local function tensors_of(bindings, base, L)
  local tensors = {}
  for _, b in ipairs(bindings) do
    local a = b.a
    if a[3] then
      local per_layer = a[3] ~= -1
      local kind = per_layer and a[3] or a[4]
      local shape = per_layer and a[4] or a[5]
      local n = 1
      for _, d in ipairs(shape) do n = n * d end
      for l = 0, per_layer and L - 1 or 0 do
        local v = ffi.new("loip_tensor")
        v.dtype, v.ndim = K.F32, #shape
        for i, d in ipairs(shape) do v.shape[i - 1] = d end
        v.data = base + b.offset + l * n * 4
        tensors[#tensors + 1] = { layer = per_layer and l or -1, kind = kind, view = v, array = a[1],
          shape = shape, nbytes = n * 4 }
      end
    end
  end
  return tensors
end

-- (loip_model_config, facts, mapping, bind(model), tensors) for a .bin file; raises "path: reason".
function M.open(path)
  local map, size, base, fail = files_rt.map_checked(path)
  if size < HEADER then fail(string.format("truncated: %d bytes, shorter than the 28-byte header", size)) end
  local hv = header(ffi.cast("const int32_t *", base), fail)
  local shared = hv.vocab_size > 0
  local vocab = math.abs(hv.vocab_size)
  local c = config_of(hv, vocab, shared)
  local offset = HEADER
  local bindings = {}
  for _, a in ipairs(arrays_of(hv, vocab, shared)) do
    local bytes = a[2] * 4
    if offset + bytes > size then
      fail(string.format("truncated: array %s needs bytes %d..%d but the file has %d", a[1], offset, offset + bytes, size))
    end
    bindings[#bindings + 1] = { a = a, offset = offset }
    offset = offset + bytes
  end
  if offset ~= size then
    fail(string.format("%d unexpected bytes after the last array (expected a file of %d bytes)", size - offset, offset))
  end
  local facts = { architecture = "llama2.c", format = "llama2c", bos_token_id = M.BOS, eos_token_id = M.EOS }
  local tensors = tensors_of(bindings, base, hv.n_layers)
  -- Binding needs the model object: hand back a function that binds into it.
  local function bind(m)
    for _, t in ipairs(tensors) do
      assert(exec.model_bind(m, t.layer, t.kind, t.view, path .. ": " .. t.array))
    end
  end
  return c, facts, map, bind, tensors
end
return M
