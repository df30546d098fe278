-- GGUF files (v2 and v3, the format of llama.cpp, prima.cpp and ollama): the header read strictly
-- from a read-only memory map (every length, count and offset checked against the file; an error
-- names the key or the tensor), the metadata as Lua values, the tensors as views into the map.
-- loip computes with F32, F16 and BF16 tensors; a quantized one is refused, naming it: loip is
-- lossless.
--
--   local g = gguf.open("stories260K.gguf")
--   g.metadata["general.architecture"]      -- "llama"
--   g.tensors["token_embd.weight"]          -- { name, type = "F32", dims = { 64, 512 }, offset, nbytes }
--   g:close()
--
-- Layout: "GGUF", uint32 version, uint64 tensor count, uint64 metadata count; each metadata pair
-- a string key (uint64 length, bytes), a uint32 value type and the value (arrays: uint32 element
-- type, uint64 count, the elements); each tensor a string name, uint32 dimension count (at most
-- 4), uint64 dims (ne0, the fastest axis, first), uint32 ggml type, uint64 offset from the data
-- section, which starts at the next multiple of general.alignment (default 32) after the header.
-- All little-endian.
local ffi = require "ffi"
local bit = require "bit"
local files_rt = require "loip.runtime.files"

local M = {}

M.MAGIC = "GGUF"
M.DEFAULT_ALIGNMENT = 32
local MAX_DIMS = 4
local MAX_DEPTH = 4 -- arrays of arrays nest this deep at most
local TWO53 = 2 ^ 53
local U53, I53 = 0x20000000000000ULL, 0x20000000000000LL

-- Metadata value types: name, bytes (nil: variable).
local VALUE = {
  [0] = { "UINT8", 1 }, [1] = { "INT8", 1 }, [2] = { "UINT16", 2 }, [3] = { "INT16", 2 }, [4] = { "UINT32", 4 },
  [5] = { "INT32", 4 }, [6] = { "FLOAT32", 4 }, [7] = { "BOOL", 1 }, [8] = { "STRING" }, [9] = { "ARRAY" },
  [10] = { "UINT64", 8 }, [11] = { "INT64", 8 }, [12] = { "FLOAT64", 8 },
}

-- ggml tensor types: those loip computes with (bytes per element), and the names of the rest.
M.TYPES = { [0] = { "F32", 4 }, [1] = { "F16", 2 }, [30] = { "BF16", 2 } }
-- MXFP4 (gpt-oss's experts as released: blocks of 32 values in 17 bytes, loip.h's LOIP_MXFP4): its
-- bytes an element on average (a tensor's rows are whole blocks)
M.TYPES[39] = { "MXFP4", 17 / 32 }
M.OTHER_TYPES = { [2] = "Q4_0", [3] = "Q4_1", [6] = "Q5_0", [7] = "Q5_1", [8] = "Q8_0", [9] = "Q8_1", [10] = "Q2_K",
  [11] = "Q3_K", [12] = "Q4_K", [13] = "Q5_K", [14] = "Q6_K", [15] = "Q8_K", [16] = "IQ2_XXS", [17] = "IQ2_XS",
  [18] = "IQ3_XXS", [19] = "IQ1_S", [20] = "IQ4_NL", [21] = "IQ3_S", [22] = "IQ2_S", [23] = "IQ4_XS", [24] = "I8",
  [25] = "I16", [26] = "I32", [27] = "I64", [28] = "F64", [29] = "IQ1_M", [34] = "TQ1_0", [35] = "TQ2_0" }

local File = {}
File.__index = File

-- A cursor over the mapped bytes; every read is checked against the end.
local function reader(base, size, fail)
  local r = { pos = 0 }
  local u8 = ffi.cast("const uint8_t *", base)
  local tmp = ffi.new("uint8_t[8]")
  local function need(n, what)
    if n > size - r.pos then
      fail(string.format("truncated: %s needs %d bytes at offset %d but the file has %d", what, n, r.pos, size))
    end
  end
  local function raw(n, what)
    need(n, what)
    ffi.copy(tmp, u8 + r.pos, n)
    r.pos = r.pos + n
    return tmp
  end
  function r.u8(what) return raw(1, what)[0] end
  function r.u32(what) return tonumber(ffi.cast("uint32_t *", raw(4, what))[0]) end
  function r.u64(what)
    local v = ffi.cast("uint64_t *", raw(8, what))[0]
    if v >= U53 then fail(string.format("%s is %s: absurd", what, (tostring(v):gsub("ULL$", "")))) end
    return tonumber(v)
  end
  function r.scalar(t, what)
    local p = raw(VALUE[t][2], what)
    if t == 0 then return p[0] end
    if t == 1 then return tonumber(ffi.cast("int8_t *", p)[0]) end
    if t == 2 then return tonumber(ffi.cast("uint16_t *", p)[0]) end
    if t == 3 then return tonumber(ffi.cast("int16_t *", p)[0]) end
    if t == 4 then return tonumber(ffi.cast("uint32_t *", p)[0]) end
    if t == 5 then return tonumber(ffi.cast("int32_t *", p)[0]) end
    -- (a NaN read from a file is made the canonical one first: LuaJIT keeps its own values in
    -- NaNs' payloads, and some NaN bit patterns converted as they are would be taken for one)
    if t == 6 then
      local bits = ffi.cast("uint32_t *", p)[0]
      if bit.band(bits, 0x7f800000) == 0x7f800000 and bit.band(bits, 0x007fffff) ~= 0 then return 0 / 0 end
      return tonumber(ffi.cast("float *", p)[0])
    end
    if t == 7 then
      if p[0] > 1 then fail(string.format("%s: a BOOL of %d (0 or 1)", what, p[0])) end
      return p[0] == 1
    end
    if t == 10 then
      local v = ffi.cast("uint64_t *", p)[0]
      if v >= U53 then return v end -- (kept as uint64 cdata: exact)
      return tonumber(v)
    end
    if t == 11 then
      local v = ffi.cast("int64_t *", p)[0]
      if v >= I53 or v <= -I53 then return v end
      return tonumber(v)
    end
    local bits = ffi.cast("uint64_t *", p)[0]
    if bit.band(bits, 0x7ff0000000000000ULL) == 0x7ff0000000000000ULL and bit.band(bits, 0x000fffffffffffffULL) ~= 0ULL then
      return 0 / 0
    end
    return tonumber(ffi.cast("double *", p)[0])
  end
  function r.string(what)
    local n = r.u64(what .. "'s length")
    need(n, what)
    local s = ffi.string(u8 + r.pos, n)
    r.pos = r.pos + n
    return s
  end
  return r
end

-- The value of type t at the cursor (arrays: a Lua list; its element type in types[key]).
local function value(r, t, what, depth, fail)
  local vt = VALUE[t]
  if not vt then fail(string.format("%s: unknown value type %d", what, t)) end
  if t == 8 then return r.string(what) end
  if t ~= 9 then return r.scalar(t, what) end
  if depth >= MAX_DEPTH then fail(string.format("%s: arrays nested more than %d deep", what, MAX_DEPTH)) end
  local et = r.u32(what .. "'s element type")
  if not VALUE[et] then fail(string.format("%s: unknown element type %d", what, et)) end
  local n = r.u64(what .. "'s element count")
  -- each element takes a byte at least: a count past the file is absurd before any is read
  if n > r.size - r.pos then
    fail(string.format("%s: %d elements cannot fit in the %d bytes left", what, n, r.size - r.pos))
  end
  local out = {}
  for i = 1, n do out[i] = value(r, et, what, depth + 1, fail) end
  return out, VALUE[et][1]
end

-- The tensor infos after the metadata (r at them): by name { name, type, type_id, dims, numel,
-- rel (offset in the data section), nbytes }, and their names in file order.
local function tensor_infos(r, n_tensors, alignment, fail)
  local tensors, order = {}, {}
  for i = 1, n_tensors do
    local name = r.string(string.format("tensor %d's name", i))
    local where = string.format("tensor '%s'", name)
    if tensors[name] then fail(where .. " appears twice") end
    local nd = r.u32(where .. "'s dimension count")
    if nd < 1 or nd > MAX_DIMS then fail(string.format("%s: %d dimensions (1 to %d)", where, nd, MAX_DIMS)) end
    local dims, numel = {}, 1
    for d = 1, nd do
      dims[d] = r.u64(string.format("%s's dimension %d", where, d))
      numel = numel * dims[d]
      if numel >= TWO53 then fail(where .. ": its dimensions multiply past 2^53 elements") end
    end
    local t = r.u32(where .. "'s type")
    local ty = M.TYPES[t]
    if not ty then
      if M.OTHER_TYPES[t] then
        fail(string.format("%s has type %s: quantized and integer tensors are refused (loip is lossless; convert the model to F32, F16 or BF16)",
          where, M.OTHER_TYPES[t]))
      end
      fail(string.format("%s: unknown ggml type %d", where, t))
    end
    local off = r.u64(where .. "'s offset")
    if off % alignment ~= 0 then fail(string.format("%s: offset %d is not a multiple of the alignment %d", where, off, alignment)) end
    tensors[name] = { name = name, type = ty[1], type_id = t, dims = dims, numel = numel, rel = off, nbytes = numel * ty[2] }
    order[#order + 1] = name
  end
  return tensors, order
end

-- Each tensor's offset in the file (the data section at data), checked: inside the file, and
-- no two overlapping.
local function place_tensors(tensors, order, data, size, n_tensors, fail)
  -- (a file of metadata only, a vocabulary, may end right after its header, unpadded)
  if data > size and n_tensors > 0 then fail(string.format("the data section would start at %d, past the end of the file (%d bytes)", data, size)) end
  local spans = {}
  for _, name in ipairs(order) do
    local x = tensors[name]
    x.offset = data + x.rel
    if x.offset + x.nbytes > size then
      fail(string.format("tensor '%s': its %d bytes at offset %d run past the end of the file (%d bytes)", name, x.nbytes, x.offset, size))
    end
    spans[#spans + 1] = x
  end
  table.sort(spans, function(a, b) return a.offset < b.offset or (a.offset == b.offset and a.name < b.name) end)
  for i = 2, #spans do
    local p, q = spans[i - 1], spans[i]
    if q.offset < p.offset + p.nbytes and p.nbytes > 0 and q.nbytes > 0 then
      fail(string.format("tensors '%s' and '%s' overlap", p.name, q.name))
    end
  end
end

-- Open and check path. Returns a File, or raises "path: reason".
function M.open(path)
  local map, size, base, fail = files_rt.map_checked(path)
  local r = reader(base, size, fail)
  r.size = size
  if size < 4 or ffi.string(base, 4) ~= M.MAGIC then fail("not a GGUF file (no \"GGUF\" magic)") end
  r.pos = 4
  local version = r.u32("the version")
  if version ~= 2 and version ~= 3 then
    fail(string.format("GGUF version %d; loip reads versions 2 and 3%s", version, version == 1 and " (re-convert the model)" or ""))
  end
  local n_tensors = r.u64("the tensor count")
  local n_kv = r.u64("the metadata count")
  -- a metadata pair takes 8 + 4 + 1 bytes at least, a tensor 8 + 4 + 8 + 4 + 8
  if n_kv * 13 > size - r.pos then fail(string.format("%d metadata pairs cannot fit in a file of %d bytes", n_kv, size)) end
  if n_tensors * 32 > size - r.pos then fail(string.format("%d tensors cannot fit in a file of %d bytes", n_tensors, size)) end
  local meta, types = {}, {}
  for i = 1, n_kv do
    local key = r.string(string.format("metadata key %d", i))
    if meta[key] ~= nil then fail(string.format("metadata key '%s' appears twice", key)) end
    local t = r.u32(string.format("the type of '%s'", key))
    local v, et = value(r, t, string.format("metadata '%s'", key), 0, fail)
    meta[key], types[key] = v, VALUE[t] and (VALUE[t][1] .. (et and ("[" .. et .. "]") or "")) or nil
  end
  local meta_end = r.pos -- (the metadata pairs are bytes 24..meta_end; the tensor infos follow)
  local alignment = meta["general.alignment"]
  if alignment == nil then
    alignment = M.DEFAULT_ALIGNMENT
  elseif types["general.alignment"] ~= "UINT32" or alignment < 1 or alignment > 65536 or alignment % 8 ~= 0 then
    fail(string.format("general.alignment %s is not a UINT32 multiple of 8", tostring(alignment)))
  end
  local tensors, order = tensor_infos(r, n_tensors, alignment, fail)
  local data = math.ceil(r.pos / alignment) * alignment
  place_tensors(tensors, order, data, size, n_tensors, fail)
  return setmetatable({ path = path, map = map, base = base, size = size, version = version, alignment = alignment,
    data_offset = data, metadata = meta, types = types, tensors = tensors, order = order, n_kv = n_kv,
    meta_start = 24, meta_end = meta_end }, File)
end

-- A tensor's bytes (a pointer into the map; valid until close).
function File:data(name)
  local x = self.tensors[name]
  if not x then error(self.path .. ": no tensor '" .. tostring(name) .. "'", 2) end
  return ffi.cast("const uint8_t *", self.base) + x.offset, x.nbytes
end

-- The file's metadata as a GGUF of its own, without tensors (the bytes of its pairs as they are:
-- a slice store keeps the vocabulary and chat template this way).
function File:metadata_file()
  local head = ffi.new("uint8_t[24]")
  ffi.copy(head, self.base, 8)
  ffi.cast("uint64_t *", head + 8)[0] = 0
  ffi.cast("uint64_t *", head + 16)[0] = self.n_kv
  return ffi.string(head, 24) .. ffi.string(ffi.cast("const uint8_t *", self.base) + self.meta_start,
    self.meta_end - self.meta_start)
end

-- ---- writing (small files: tests, vocabularies) ---------------------------------------------

local TYPE_ID = {}
for id, v in pairs(VALUE) do TYPE_ID[v[1]] = id end
local TENSOR_ID = {}
for id, v in pairs(M.TYPES) do TENSOR_ID[v[1]] = id end

local function pack(ctype, v)
  local b = ffi.new(ctype .. "[1]", v)
  return ffi.string(b, ffi.sizeof(ctype))
end
local function gstring(s) return pack("uint64_t", #s) .. s end

local scalar_ctype = { UINT8 = "uint8_t", INT8 = "int8_t", UINT16 = "uint16_t", INT16 = "int16_t", UINT32 = "uint32_t",
  INT32 = "int32_t", FLOAT32 = "float", UINT64 = "uint64_t", INT64 = "int64_t", FLOAT64 = "double" }

local function encode_value(t, v, out)
  if t == "STRING" then out[#out + 1] = gstring(v)
  elseif t == "BOOL" then out[#out + 1] = pack("uint8_t", v and 1 or 0)
  else out[#out + 1] = pack(scalar_ctype[t] or error("gguf.encode: unknown value type " .. tostring(t), 3), v) end
end

-- A GGUF v3 file as a string. metadata: a list of { key, type, value } (type: "UINT32", "STRING",
-- ..., or "ARRAY[STRING]" with a Lua list as value); tensors: a list of { name, type = "F32" |
-- "F16" | "BF16", dims (ne0 first), data = the bytes as a string }.
-- The file as a list of strings in order (the header, then each tensor's data and padding):
-- a model past LuaJIT's 2 GB string limit is written piece by piece (spec/support/to_gguf.lua).
function M.encode_parts(metadata, tensors)
  tensors = tensors or {}
  local out = { M.MAGIC, pack("uint32_t", 3), pack("uint64_t", #tensors), pack("uint64_t", #metadata) }
  local align = M.DEFAULT_ALIGNMENT
  for _, kv in ipairs(metadata) do
    local key, t, v = kv[1], kv[2], kv[3]
    if key == "general.alignment" then align = v end
    out[#out + 1] = gstring(key)
    local et = t:match("^ARRAY%[(%w+)%]$")
    if et then
      out[#out + 1] = pack("uint32_t", TYPE_ID.ARRAY) .. pack("uint32_t", TYPE_ID[et]) .. pack("uint64_t", #v)
      for _, x in ipairs(v) do encode_value(et, x, out) end
    else
      out[#out + 1] = pack("uint32_t", TYPE_ID[t] or error("gguf.encode: unknown value type " .. tostring(t), 2))
      encode_value(t, v, out)
    end
  end
  local off = 0
  for _, x in ipairs(tensors) do
    out[#out + 1] = gstring(x.name) .. pack("uint32_t", #x.dims)
    for _, d in ipairs(x.dims) do out[#out + 1] = pack("uint64_t", d) end
    out[#out + 1] = pack("uint32_t", TENSOR_ID[x.type] or error("gguf.encode: tensor type " .. tostring(x.type), 2))
      .. pack("uint64_t", off)
    x._off = off
    off = math.ceil((off + #x.data) / align) * align
  end
  local head = table.concat(out)
  if #tensors == 0 then return { head } end
  local parts = { head, string.rep("\0", math.ceil(#head / align) * align - #head) }
  for _, x in ipairs(tensors) do
    parts[#parts + 1] = x.data
    parts[#parts + 1] = string.rep("\0", math.ceil(#x.data / align) * align - #x.data)
  end
  return parts
end

function M.encode(metadata, tensors)
  return table.concat(M.encode_parts(metadata, tensors))
end

function File:close()
  if self.map then files_rt.map_free(self.map) end
  self.map, self.base = nil, nil
end

return M
