-- safetensors files: the JSON header is parsed and checked here; the bytes stay in a read-only
-- memory map and tensors are views into it (no copy, stored dtype).
local ffi = require "ffi"
local core = require "loip.core"
local json = require "loip.text.json"
local memory = require "loip.runtime.memory"
local files_rt = require "loip.runtime.files"
local progress = require "loip.ui.progress"
local dtype = core.constants.dtype

local M = {}

local MAX_HEADER = 100 * 1024 * 1024 -- the format's own limit

local dtypes = {
  F32 = { id = dtype.F32, size = 4 }, BF16 = { id = dtype.BF16, size = 2 },
  F16 = { id = dtype.F16, size = 2 },
}
-- Types a file may legally hold that loip cannot compute with: named in the error.
local known_other = { F64 = 8, I64 = 8, I32 = 4, I16 = 2, I8 = 1, U8 = 1, BOOL = 1,
  F8_E4M3 = 1, F8_E5M2 = 1, U16 = 2, U32 = 4, U64 = 8 }

local File = {}
File.__index = File

local function u64le(p)
  local v = 0
  for i = 7, 0, -1 do v = v * 256 + p[i] end
  return v
end

-- Open and validate one .safetensors file. Returns a File, or nil and "path: reason".
function M.open(path)
  local map, err = files_rt.map(path)
  if not map then return nil, err end
  local size = files_rt.map_size(map)
  local fail = function(msg) files_rt.map_free(map) return nil, path .. ": " .. msg end
  if size < 8 then return fail(string.format("truncated: %d bytes, not even the 8-byte header length", size)) end
  local base = files_rt.map_data(map)
  local hlen = u64le(base)
  if hlen > MAX_HEADER then
    return fail(string.format("header length %.0f is absurd (limit %d bytes)", hlen, MAX_HEADER))
  end
  if 8 + hlen > size then
    return fail(string.format("header length %d runs past the end of the file (%d bytes)", hlen, size))
  end
  local header, jerr = json.decode(ffi.string(base + 8, hlen), "header")
  if header == nil then return fail(jerr) end
  if type(header) ~= "table" then return fail("header is not a JSON object") end
  local data_size = size - 8 - hlen
  local tensors, spans = {}, {}
  for name, info in pairs(header) do
    if name ~= "__metadata__" then
      local where = string.format("tensor '%s'", name)
      if type(info) ~= "table" then return fail(where .. ": entry is not an object") end
      local dt = info.dtype
      if type(dt) ~= "string" then return fail(where .. ": missing field 'dtype'") end
      local elsize = dtypes[dt] and dtypes[dt].size or known_other[dt]
      if not elsize then return fail(where .. ": unknown dtype '" .. dt .. "'") end
      if type(info.shape) ~= "table" then return fail(where .. ": missing field 'shape'") end
      local numel = 1
      for i, d in ipairs(info.shape) do
        if type(d) ~= "number" or d < 0 or d ~= math.floor(d) then
          return fail(string.format("%s: shape[%d] is not a non-negative integer", where, i))
        end
        numel = numel * d
      end
      local off = info.data_offsets
      if type(off) ~= "table" or type(off[1]) ~= "number" or type(off[2]) ~= "number" then
        return fail(where .. ": missing field 'data_offsets'")
      end
      local b, e = off[1], off[2]
      if b < 0 or e < b then
        return fail(string.format("%s: data_offsets [%d, %d] are reversed or negative", where, b, e))
      end
      if e > data_size then
        return fail(string.format("%s: data_offsets [%d, %d] run past the end of the data (%d bytes)",
          where, b, e, data_size))
      end
      if e - b ~= numel * elsize then
        return fail(string.format("%s: %d bytes in data_offsets but shape and dtype %s need %d",
          where, e - b, dt, numel * elsize))
      end
      tensors[name] = { name = name, dtype = dt, shape = info.shape, offset = b, nbytes = e - b, numel = numel }
      spans[#spans + 1] = tensors[name]
    end
  end
  table.sort(spans, function(a, b) return a.offset < b.offset or (a.offset == b.offset and a.nbytes < b.nbytes) end)
  for i = 2, #spans do
    local p, q = spans[i - 1], spans[i]
    if q.offset < p.offset + p.nbytes and q.nbytes > 0 and p.nbytes > 0 then
      return fail(string.format("tensors '%s' and '%s' overlap (data_offsets %d..%d and %d..%d)",
        p.name, q.name, p.offset, p.offset + p.nbytes, q.offset, q.offset + q.nbytes))
    end
  end
  local file = setmetatable({ path = path, map = map, data = base + 8 + hlen, tensors = tensors,
    metadata = header.__metadata__, data_size = data_size }, File)
  return file
end

-- Move the tensor bytes from the file mapping into anonymous memory (huge pages where the
-- kernel gives them): decoding streams every weight once per token, and 4 KiB page-cache
-- pages cost TLB misses that 2 MiB pages do not. bar: optional progress bar (bytes).
-- budget: optional loip_budget * whose "weights" account is charged before the allocation.
function File:load(bar, done, budget)
  if self.buffer then return done end
  local buf, err = memory.buffer_charged(budget, "weights", math.max(self.data_size, 1))
  if not buf then return nil, self.path .. ": " .. err end
  local dst = ffi.cast("uint8_t *", memory.buffer_data(buf))
  local step = 64 * 1024 * 1024
  for off = 0, self.data_size - 1, step do
    local n = math.min(step, self.data_size - off)
    ffi.copy(dst + off, self.data + off, n)
    done = (done or 0) + n
    if bar then bar:update(done) end
  end
  self.buffer, self.data = buf, dst
  files_rt.map_free(self.map)
  self.map = nil
  return done
end

-- A loip_tensor view of a named tensor, or nil and a reason naming the file and tensor.
function File:view(name)
  local t = self.tensors[name]
  if not t then return nil, string.format("%s: tensor '%s' is missing", self.path, name) end
  local d = dtypes[t.dtype]
  if not d then
    return nil, string.format("%s: tensor '%s' has dtype %s, which loip does not compute with (F32, BF16, F16)",
      self.path, name, t.dtype)
  end
  if #t.shape > 4 then return nil, string.format("%s: tensor '%s' has %d dimensions", self.path, name, #t.shape) end
  local v = ffi.new("loip_tensor")
  v.data = self.data + t.offset
  v.dtype = d.id
  v.ndim = #t.shape
  for i, s in ipairs(t.shape) do v.shape[i - 1] = s end
  return v
end

function File:close()
  files_rt.map_free(self.map)
  memory.buffer_free(self.buffer)
  self.map, self.buffer = nil, nil
end

-- All tensors of a model directory: model.safetensors, or the shards listed by
-- model.safetensors.index.json. Returns { files = {...}, index = name -> File }.
-- opts.load: "memory" copies the tensor bytes into anonymous memory (with a progress bar),
-- "mmap" (default here) leaves them in the file mapping; opts.budget (loip_budget *) is charged
-- for what "memory" allocates.
function M.open_dir(dir, opts)
  local index_path = dir .. "/model.safetensors.index.json"
  local single = dir .. "/model.safetensors"
  local set = { files = {}, index = {} }
  if json.exists(index_path) then
    local idx, err = json.load(index_path)
    if not idx then return nil, err end
    if type(idx.weight_map) ~= "table" then return nil, index_path .. ": missing field 'weight_map'" end
    local opened = {}
    for name, file in pairs(idx.weight_map) do
      if type(file) ~= "string" or file:find("/", 1, true) then
        return nil, string.format("%s: weight_map['%s'] is not a file name", index_path, name)
      end
      local f = opened[file]
      if not f then
        local ferr
        f, ferr = M.open(dir .. "/" .. file)
        if not f then M.close(set) return nil, ferr end
        opened[file] = f
        set.files[#set.files + 1] = f
      end
      if not f.tensors[name] then
        M.close(set)
        return nil, string.format("%s: tensor '%s' is listed in %s but missing from %s",
          dir .. "/" .. file, name, index_path, file)
      end
      set.index[name] = f
    end
  elseif json.exists(single) then
    local f, err = M.open(single)
    if not f then return nil, err end
    set.files[1] = f
    for name in pairs(f.tensors) do set.index[name] = f end
  else
    return nil, dir .. ": no model.safetensors or model.safetensors.index.json"
  end
  if opts and opts.load == "memory" then
    local total = 0
    for _, f in ipairs(set.files) do total = total + math.max(f.data_size, 1) end
    -- opts.budget (loip_budget *): all shards must fit before the first is read.
    if opts.budget then
      local ok, err = memory.charge(opts.budget, "weights", total, dir)
      if not ok then M.close(set) return nil, err end
      memory.release(opts.budget, "weights", total)
    end
    local bar = total >= 256 * 1024 * 1024 and progress.new(total, "loading " .. dir) or nil
    local done = 0
    for _, f in ipairs(set.files) do
      local err
      done, err = f:load(bar, done, opts.budget)
      if not done then M.close(set) return nil, err end
    end
    if bar then bar:finish() end
  end
  return set
end

function M.close(set)
  for _, f in ipairs(set.files) do f:close() end
  for _, buf in ipairs(set.derived or {}) do memory.buffer_free(buf) end
  if set.derived_budget then memory.release(set.derived_budget, "weights", set.derived_charged) end
  set.derived, set.derived_budget, set.derived_charged = nil, nil, nil
end

return M
