-- FP8 checkpoints as Hugging Face publishes them (DeepSeek-V3's, Qwen3-*-FP8's): config.json's
-- quantization_config { quant_method = "fp8", fmt = "e4m3", activation_scheme = "dynamic",
-- weight_block_size = [128, 128] [, modules_to_not_convert] }; each converted Linear's weight
-- is E4M3FN bytes (safetensors F8_E4M3) beside its float32 weight_scale_inv, one scale per
-- 128x128 block ([ceil(out/128), ceil(in/128)]); the rest (embeddings, norms, the head, a router)
-- stays in the model's float dtype. loip keeps the weights as released and computes from them:
-- an F8 tensor is packed at open (loip_f8_pack: each 128-row group's scales in front of its
-- rows) into memory the set owns, so a store's block holds it packed and reads it in one read.
-- Activations stay f32 (no FP8 activations: "dynamic" quantizes them on the fly, which loip
-- does not do; its results are the dequantized model's).
local ffi = require "ffi"
local bit = require "bit"
local core = require "loip.core"
local json = require "loip.text.json"
local memory = require "loip.runtime.memory"
local exec = require "loip.runtime.exec"
local K = core.constants

local M = {}

M.BLOCK = 128
-- The quantization_config loip writes (loip synth --weights-dtype fp8), as Qwen3-FP8's.
function M.config()
  return { quant_method = "fp8", fmt = "e4m3", activation_scheme = "dynamic", weight_block_size = { M.BLOCK, M.BLOCK } }
end

local function absent(v) return v == nil or v == json.null end

-- The quantization method of config cfg (read from path): nil (none), "fp8" or "mxfp4" (gpt-oss's
-- experts, families/gpt_oss.lua). Raises naming the field for what loip does not read.
function M.method_of(cfg, path)
  local q = cfg.quantization_config
  if absent(q) then return nil end
  if type(q) ~= "table" then error(path .. ": field 'quantization_config' must be an object", 0) end
  local m = q.quant_method
  if m == "mxfp4" then return m end
  if m ~= "fp8" then
    error(string.format("%s: field 'quantization_config.quant_method' is '%s'; loip reads 'fp8' (E4M3 with "
      .. "128x128 block scales) and 'mxfp4' (gpt-oss's experts)", path, tostring(m)), 0)
  end
  if not absent(q.fmt) and q.fmt ~= "e4m3" then
    error(string.format("%s: field 'quantization_config.fmt' is '%s'; only 'e4m3' is supported", path, tostring(q.fmt)), 0)
  end
  local b = q.weight_block_size
  if absent(b) then
    error(path .. ": field 'quantization_config.weight_block_size' is missing; loip reads block scales of [128, 128] "
      .. "(not one scale a tensor)", 0)
  end
  if type(b) ~= "table" or #b ~= 2 or b[1] ~= M.BLOCK or b[2] ~= M.BLOCK then
    local got = type(b) == "table" and ("[" .. table.concat(b, ", ") .. "]") or tostring(b)
    error(string.format("%s: field 'quantization_config.weight_block_size' is %s; only [128, 128] is supported", path, got), 0)
  end
  if not absent(q.activation_scheme) and q.activation_scheme ~= "dynamic" then
    error(string.format("%s: field 'quantization_config.activation_scheme' is '%s'; only 'dynamic' is supported "
      .. "(loip computes activations in f32 and reads no input scales)", path, tostring(q.activation_scheme)), 0)
  end
  local skip = q.modules_to_not_convert
  if not absent(skip) and type(skip) ~= "table" then
    error(path .. ": field 'quantization_config.modules_to_not_convert' must be a list of module names", 0)
  end
  return "fp8"
end

-- The entry of config cfg's modules_to_not_convert that tensor name's module matches (as
-- transformers matches them: the entry a part of the module's name), or nil.
function M.not_converted(cfg, name)
  local q = type(cfg) == "table" and cfg.quantization_config
  local skip = type(q) == "table" and q.modules_to_not_convert
  if type(skip) ~= "table" then return nil end
  local module = name:gsub("%.weight$", "")
  for _, s in ipairs(skip) do
    if type(s) == "string" and module:find(s, 1, true) then return s end
  end
end

-- The scale tensor's float32 values: its own (F32), or a copy of BF16 ones (exact) in a buffer
-- the caller frees. Returns pointer, buffer (or nil), and nil, message when of another dtype.
local function scales_of(sf, s, sname)
  local p = sf.data + s.offset
  if s.dtype == "F32" then return ffi.cast("const float *", p) end
  if s.dtype ~= "BF16" then
    return nil, nil, string.format("%s: tensor '%s' (weight_scale_inv) has dtype %s, expected F32 (or BF16)", sf.path, sname, s.dtype)
  end
  local buf = memory.buffer(s.nbytes * 2)
  local out, src = ffi.cast("uint32_t *", memory.buffer_data(buf)), ffi.cast("const uint16_t *", p)
  for i = 0, s.nbytes / 2 - 1 do out[i] = bit.lshift(src[i], 16) end
  return ffi.cast("const float *", out), buf
end

-- Tensor name of file f (dtype F8_E4M3) of safetensors set (config cfg, checked by M.method_of),
-- packed as LOIP_F8_E4M3 with its weight_scale_inv: (view, bytes, buffer the caller frees), or
-- nil and the message naming the tensor and the field.
function M.pack(set, f, name, cfg)
  local t, s, sf, sname, cerr = M.check(set, f, name, cfg)
  if not t then return nil, cerr end
  local scales, sbuf, serr = scales_of(sf, s, sname)
  if not scales then return nil, serr end
  local R, C = t.shape[1], t.shape[2]
  local bytes = M.bytes(R, C)
  local buf = memory.buffer(bytes)
  local ok, err = exec.f8_pack(memory.buffer_data(buf), f.data + t.offset, scales, R, C, s.shape[1], s.shape[2], name)
  if sbuf then memory.buffer_free(sbuf) end
  if not ok then memory.buffer_free(buf) return nil, f.path .. ": " .. tostring(err) end
  local v = ffi.new("loip_tensor")
  v.data, v.dtype, v.ndim = memory.buffer_data(buf), K.F8_E4M3, 2
  v.shape[0], v.shape[1] = R, C
  return v, bytes, buf
end

-- Bytes of a packed [R, C] F8 matrix (loip_dtype_bytes).
function M.bytes(R, C) return exec.dtype_bytes(K.F8_E4M3, R, C) end

-- What M.pack checks before packing: (tensor, its scale tensor, the scale's file, its name), or
-- nil, nil, nil, nil and the message naming the tensor and the field. The scales' shape against
-- the weight's: here too, so that a lazy pack (M.lazy) is refused before anything is written.
function M.check(set, f, name, cfg)
  local function no(msg) return nil, nil, nil, nil, msg end
  local t = f.tensors[name]
  local q = type(cfg) == "table" and cfg.quantization_config
  if type(q) ~= "table" or q.quant_method ~= "fp8" then
    return no(string.format("%s: tensor '%s' is F8_E4M3 but config.json's quantization_config.quant_method is not 'fp8'", f.path, name))
  end
  local skip = M.not_converted(cfg, name)
  if skip then
    return no(string.format("%s: tensor '%s' is F8_E4M3 but quantization_config.modules_to_not_convert lists '%s'", f.path, name, skip))
  end
  if #t.shape ~= 2 then
    return no(string.format("%s: tensor '%s': F8_E4M3 with shape of %d dimensions; only matrices [out, in] are read", f.path, name, #t.shape))
  end
  local sname = name .. "_scale_inv"
  local sf = set.index[sname]
  if not sf then
    return no(string.format("%s: tensor '%s' is F8_E4M3 but its scales '%s' (weight_scale_inv) are missing", f.path, name, sname))
  end
  local s = sf.tensors[sname]
  if #s.shape ~= 2 then
    return no(string.format("%s: tensor '%s' (weight_scale_inv) has %d dimensions, expected [%d, %d]", sf.path, sname, #s.shape,
      math.ceil(t.shape[1] / M.BLOCK), math.ceil(t.shape[2] / M.BLOCK)))
  end
  local want = { math.ceil(t.shape[1] / M.BLOCK), math.ceil(t.shape[2] / M.BLOCK) }
  if s.shape[1] ~= want[1] or s.shape[2] ~= want[2] then
    return no(string.format("%s: tensor '%s': weight_scale_inv has shape [%d, %d], expected [%d, %d] (one scale per 128x128 "
      .. "block of the weight's [%d, %d])", f.path, name, s.shape[1], s.shape[2], want[1], want[2], t.shape[1], t.shape[2]))
  end
  if s.dtype ~= "F32" and s.dtype ~= "BF16" then
    return no(string.format("%s: tensor '%s' (weight_scale_inv) has dtype %s, expected F32 (or BF16)", sf.path, sname, s.dtype))
  end
  return t, s, sf, sname
end

-- Tensor name of file f, F8_E4M3, checked (M.check) but not packed yet: a view of its shape for
-- binding checks (its data the file's bytes, not to be computed from), the packed bytes, and a
-- function packing it when it is needed (M.pack's view, bytes, buffer): slicing packs a tensor
-- as it writes it, so a checkpoint is never in memory whole. nil and the message on bad input.
function M.lazy(set, f, name, cfg)
  local t, _, _, _, err = M.check(set, f, name, cfg)
  if not t then return nil, err end
  local v = ffi.new("loip_tensor")
  v.data, v.dtype, v.ndim = f.data + t.offset, K.F8_E4M3, 2
  v.shape[0], v.shape[1] = t.shape[1], t.shape[2]
  return v, M.bytes(t.shape[1], t.shape[2]), function() return M.pack(set, f, name, cfg) end
end

-- Rows rows[1] .. rows[1] + rows[2] - 1 of packed F8 view v (a tensor fused by rows, rows[3]
-- in all): a view of their own and its bytes, or nil and why (a part not on a 128-row group).
function M.row_view(v, rows)
  local first, count, C = rows[1], rows[2], tonumber(v.shape[1])
  if tonumber(v.shape[0]) ~= rows[3] then
    return nil, string.format("shape [%d, %d], expected %d rows (its fused parts' together)", tonumber(v.shape[0]), C, rows[3])
  end
  if first % M.BLOCK ~= 0 then
    return nil, string.format("a part fused by rows starts at row %d, not on a 128-row block of its F8 scales", first)
  end
  local out = ffi.new("loip_tensor")
  out.data = ffi.cast("const uint8_t *", v.data) + exec.dtype_bytes(K.F8_E4M3, first, C)
  out.dtype, out.ndim = v.dtype, 2
  out.shape[0], out.shape[1] = count, C
  return out, exec.dtype_bytes(K.F8_E4M3, count, C)
end

return M
