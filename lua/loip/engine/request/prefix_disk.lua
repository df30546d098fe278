-- The prefix cache's disk tier (`loip serve --prompt-cache-dir DIR`, docs/prefix-cache.md): a
-- device's held KV groups, each a file of its own in DIR, so that the cache outlives what memory
-- holds and a restart of the server with the same store.
--
-- Write-through: a group the cache takes (loip.engine.request.prefix_cache's Store:keep) is written at
-- once, every layer the device keeps of it, atomically (a temporary file renamed into place; not
-- fsynced: a torn file fails its CRC), so that an eviction from memory loses nothing and a file
-- is whole or absent. A file is named KEY.dDEVICE.kv (KEY: the group's hash-chain key) and holds a header
-- of HEADER bytes (JSON: format, version, the store identity, the key, device, layers, kv_block,
-- dtype, bytes, the CRC-32C of the rows) then the group's rows as loip_session_kv_read_group
-- gives them. A lookup that misses memory reads the file with the loader (loip.runtime.loader:
-- io_uring where the kernel has it), checks its CRC and loads it into a group the cache holds
-- (loip_session_kv_load_group). The files are bounded by `bytes` (least recently used removed
-- first). At start the index is rebuilt from DIR: files of another store, device, layer split or
-- group shape are ignored with a log line, and a file that does not parse is removed.
--
-- A session whose sliding-window layers keep their KV in rings (docs/prefix-cache.md) writes, with
-- a kept run's last group, the snapshot of its rings at the run's end as KEY.dDEVICE.win (the same
-- header, kind "win" and the position it ends at; bounded with the groups): a lookup that finds
-- a group without its window in memory reads it back (loip_session_kv_load_window).
local ffi = require "ffi"
local exec = require "loip.runtime.exec"
local files = require "loip.runtime.files"
local fs = require "loip.runtime.shell"
local json = require "loip.text.json"
local loader = require "loip.runtime.loader"

local M = {}

M.HEADER = 4096          -- the rows start here (a page: direct reads stay aligned)
M.DEFAULT_BYTES = 2 ^ 31 -- --prompt-cache-disk's default: 2 GiB per device
local FORMAT, VERSION = "loip-prompt-cache", 1

local Disk = {}
Disk.__index = Disk

local function log(fmt, ...) io.stderr:write(os.date("%H:%M:%S "), string.format(fmt, ...), "\n") io.stderr:flush() end

-- The layers whose KV a device's stages keep (their attention blocks': even block b is layer b/2).
function M.stage_layers(stages)
  local out = {}
  for _, st in ipairs(stages) do
    for b = st.blocks[1], st.blocks[2] do if b % 2 == 0 then out[#out + 1] = b / 2 end end
  end
  return out
end

-- o: dir, bytes (the bound; default M.DEFAULT_BYTES), identity (the store's: the chain's h_0),
-- device (1-based), layers (the layers the session keeps, a list), kv_block, group_bytes, log
-- (fmt, ...; default stderr), budget (the device's: the staging buffer files are read into is
-- charged to its "slots" account while it exists), window_bytes (a ringed session's snapshot: its
-- bytes; 0 or nil: none). Raises naming the directory when it cannot be made.
function M.new(o)
  assert(o.dir and o.identity and o.device and o.layers and o.kv_block and o.group_bytes, "prefix_disk.new: incomplete")
  local ok, err = fs.mkdir_p(o.dir)
  if not ok then error("--prompt-cache-dir " .. err, 0) end
  local d = setmetatable({ dir = o.dir:gsub("/+$", ""), limit = o.bytes or M.DEFAULT_BYTES, identity = o.identity,
    device = o.device, layers = table.concat(o.layers, ","), kv_block = o.kv_block, group_bytes = o.group_bytes, budget = o.budget,
    file_bytes = M.HEADER + math.ceil(o.group_bytes / 4096) * 4096, log = o.log or log, index = {}, n = 0, total = 0,
    window_bytes = o.window_bytes or 0, wins = {}, win_file_bytes = M.HEADER + math.ceil((o.window_bytes or 0) / 4096) * 4096,
    ticks = 0, stats = { writes = 0, reads = 0, ignored = 0, removed = 0 } }, Disk)
  d:scan()
  return d
end

-- kind: "kv" (a group, the default) or "win" (a snapshot of the rings)
function Disk:path(key, kind) return string.format("%s/%s.d%d.%s", self.dir, key, self.device, kind or "kv") end
function Disk:table_of(kind) return kind == "win" and self.wins or self.index end
function Disk:bytes_of(kind) return kind == "win" and self.window_bytes or self.group_bytes end
function Disk:file_of(kind) return kind == "win" and self.win_file_bytes or self.file_bytes end

function Disk:header(key, crc, kind, at)
  local h = json.encode({ format = FORMAT, version = VERSION, identity = self.identity, key = key, device = self.device,
    layers = self.layers, kv_block = self.kv_block, dtype = "f32", bytes = self:bytes_of(kind), crc32c = crc,
    kind = kind == "win" and "win" or nil, ends = at })
  return h .. "\n" .. string.rep("\0", M.HEADER - #h - 1)
end

-- Why header h (decoded) is not one of this device's files for key (kind: "kv" or "win"), or nil.
function Disk:mismatch(h, key, kind)
  if type(h) ~= "table" or h.format ~= FORMAT then return "not a prompt cache file" end
  if (h.kind or "kv") ~= (kind or "kv") then return "its kind is " .. tostring(h.kind or "kv") end
  for _, f in ipairs({ { "version", VERSION }, { "identity", self.identity }, { "key", key }, { "device", self.device },
    { "layers", self.layers }, { "kv_block", self.kv_block }, { "dtype", "f32" }, { "bytes", self:bytes_of(kind) } }) do
    if h[f[1]] ~= f[2] then
      return string.format("its %s is %s, this server's %s", f[1], tostring(h[f[1]]):sub(1, 24), tostring(f[2]):sub(1, 24))
    end
  end
  return nil
end

-- The index from the directory's files of this device, oldest first (ls -tr).
function Disk:scan()
  local p = io.popen("ls -1tr " .. fs.quote(self.dir) .. " 2>/dev/null")
  local names = {}
  for name in p:lines() do names[#names + 1] = name end
  p:close()
  for _, name in ipairs(names) do
    for _, kind in ipairs({ "kv", "win" }) do self:scan_one(name, kind) end
  end
  self:trim() -- (a bound lowered since)
end

-- (Disk:scan: file name, if it is one of this device's files of kind)
function Disk:scan_one(name, kind)
  local suffix = string.format(".d%d.%s", self.device, kind)
  if name:sub(-#suffix - 4) == suffix .. ".tmp" then os.remove(self.dir .. "/" .. name) end -- (a write a crash cut short)
  local key = name:sub(-#suffix) == suffix and name:sub(1, -#suffix - 1) or nil
  if key and key:match("^%x+$") then
    local path = self.dir .. "/" .. name
    local f = io.open(path, "rb")
    local head = f and f:read(M.HEADER) or ""
    if f then f:close() end
    local h = json.decode((head:match("^([^\n]*)\n")) or "")
    local why = "its header does not parse"
    if h then why = self:mismatch(h, key, kind) end
    if why and not h then
      os.remove(path) -- (a torn or foreign file under our name: gone)
      self.stats.removed = self.stats.removed + 1
    end
    if why then
      self.stats.ignored = self.stats.ignored + 1
      self.log("prompt cache: %s ignored: %s", path, why)
    else
      self:add(key, h.crc32c, kind, h.ends)
    end
  end
end

function Disk:add(key, crc, kind, at)
  self.ticks = self.ticks + 1
  local t = self:table_of(kind)
  if not t[key] then self.n, self.total = self.n + 1, self.total + self:file_of(kind) end
  t[key] = { crc = crc, tick = self.ticks, ends = at }
end

function Disk:has(key, kind) return self:table_of(kind)[key] ~= nil end

-- Held group id of session s, keyed key, written (atomically) unless there already.
function Disk:write(key, s, id)
  if self.index[key] then return true end
  self.buf = self.buf or ffi.new("uint8_t[?]", self.group_bytes)
  local ok, err = exec.session_kv_read_group(s, id, self.buf, self.group_bytes)
  if not ok then return nil, err end
  return self:write_file(key, "kv", self.buf)
end

-- Held group id's snapshot of the rings (session s), keyed key, written unless there already.
function Disk:write_window(key, s, id)
  if self.wins[key] then return true end
  self.wbuf = self.wbuf or ffi.new("uint8_t[?]", self.window_bytes)
  local ok, at = exec.session_kv_read_window(s, id, self.wbuf, self.window_bytes)
  if not ok then return nil, at end
  return self:write_file(key, "win", self.wbuf, at)
end

-- The file of kind keyed key from buf (its kind's bytes; at: where a snapshot ends).
function Disk:write_file(key, kind, buf, at)
  local bytes = self:bytes_of(kind)
  local crc = files.crc32c(0, buf, bytes)
  -- a temporary name renamed into place: the file is whole or absent. Not fsynced (a cache: a
  -- file a crash tore fails its CRC and is removed when read), so that a request's end is not
  -- held up by the disk.
  local path = self:path(key, kind)
  local tmp = path .. ".tmp"
  local f, ferr = io.open(tmp, "wb")
  if not f then return nil, ferr end
  local ok, err = f:write(self:header(key, crc, kind, at), ffi.string(buf, bytes),
    string.rep("\0", self:file_of(kind) - M.HEADER - bytes))
  f:close()
  if ok then ok, err = os.rename(tmp, path) end
  if not ok then
    os.remove(tmp)
    return nil, string.format("%s: %s", path, tostring(err))
  end
  self.stats.writes = self.stats.writes + 1
  self:add(key, crc, kind, at)
  self:trim()
  return true
end

-- The snapshot keyed key (on disk) given to held group id of session s: true, else nil and why
-- (a file failing its CRC or its read is removed).
function Disk:load_window(key, s, id)
  local e, path = self.wins[key], self:path(key, "win")
  local f = io.open(path, "rb")
  local data = f and f:read(M.HEADER + self.window_bytes)
  if f then f:close() end
  local why
  if not data or #data < M.HEADER + self.window_bytes then why = "cannot be read whole"
  else
    local rows = ffi.cast("const uint8_t *", data) + M.HEADER
    if files.crc32c(0, rows, self.window_bytes) ~= e.crc then why = "its rows fail their CRC-32C"
    else
      local ok, err = exec.session_kv_load_window(s, id, e.ends, rows, self.window_bytes)
      if not ok then return nil, err end
      self.stats.reads = self.stats.reads + 1
      self.ticks = self.ticks + 1
      e.tick = self.ticks
      return true
    end
  end
  self.log("prompt cache: %s: %s; removed", path, why)
  self:remove(key, "win")
  return nil, why
end

-- Least recently used files removed until the bound holds.
function Disk:trim()
  while self.total > self.limit and self.n > 0 do
    local old, kind, t = nil, nil, math.huge
    for _, k in ipairs({ "kv", "win" }) do
      for key, e in pairs(self:table_of(k)) do if e.tick < t then old, kind, t = key, k, e.tick end end
    end
    self:remove(old, kind)
  end
end

function Disk:remove(key, kind)
  local t = self:table_of(kind)
  if not t[key] then return end
  os.remove(self:path(key, kind))
  t[key], self.n, self.total = nil, self.n - 1, self.total - self:file_of(kind)
  self.stats.removed = self.stats.removed + 1
end

M.BATCH = 16 -- groups read at once (the staging slot: BATCH x a group, charged to the device's budget)

-- The groups keyed keys (in order, all on disk) read back into groups of session s the cache
-- holds, BATCH files in flight at a time (one loader submission each): their ids, as many as
-- were read before the first that failed (a file failing its CRC or its read is removed).
function Disk:load(keys, s)
  local stride = self.file_bytes - M.HEADER
  local ids, id = {}, ffi.new("int32_t[1]")
  if stride == 0 then -- a device that keeps no layer's KV (its stages: MLP blocks, the head): groups of no rows
    for _, key in ipairs(keys) do
      if not exec.session_kv_load_group(s, id, 0, id) then break end
      ids[#ids + 1] = id[0]
      self:add(key, self.index[key].crc)
    end
    return ids
  end
  -- the staging buffer, charged while it is here: BATCH groups, else one when the budget has no
  -- room for more (else nothing is read: the prefix is computed again)
  local batch = math.min(M.BATCH, #keys)
  local l, err = loader.new { slots = 1, slot_bytes = batch * stride, mode = "auto", budget = self.budget }
  if not l and batch > 1 then
    batch = 1
    l, err = loader.new { slots = 1, slot_bytes = stride, mode = "auto", budget = self.budget }
  end
  if not l then
    self.log("prompt cache: the disk tier's staging buffer: %s", tostring(err))
    return {}
  end
  self.loader = l
  local got = self:read_into(keys, s, batch, stride, ids, id)
  l:close()
  self.loader = nil
  return got
end

-- (Disk:load's reads, batch groups a submission through self.loader)
function Disk:read_into(keys, s, batch, stride, ids, id)
  for first = 1, #keys, batch do
    local ext = {}
    for i = first, math.min(#keys, first + batch - 1) do
      ext[#ext + 1] = { path = self:path(keys[i]), offset = M.HEADER, length = self.group_bytes, slot_offset = (i - first) * stride }
    end
    self.reads = (self.reads or 0) + 1
    local ok, err = self.loader:submit(1, ext, self.reads)
    if ok then ok, err = self.loader:wait(self.reads) end
    local buf = self.loader:slot(1)
    for j = 1, #ext do
      local key, at = keys[first + j - 1], buf + (j - 1) * stride
      local e = self.index[key]
      if ok and files.crc32c(0, at, self.group_bytes) ~= e.crc then ok, err = nil, "its rows fail their CRC-32C" end
      if not ok then
        self.log("prompt cache: %s: %s; removed", self:path(key), tostring(err))
        self:remove(key)
        return ids
      end
      ok, err = exec.session_kv_load_group(s, at, self.group_bytes, id)
      if not ok then return ids end -- (no group to be had: the plan's needs hold them)
      ids[#ids + 1] = id[0]
      self.stats.reads = self.stats.reads + 1
      self.ticks = self.ticks + 1
      e.tick = self.ticks
    end
  end
  return ids
end

function Disk:close()
  if self.loader then self.loader:close() self.loader = nil end
end

return M
