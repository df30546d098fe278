-- A worker's block cache (`loip worker --cache DIR [--disk-quota BYTES]`): the slice store's
-- files its plans need, shipped by the head over the bulk link (loip.cluster.ship) rather than
-- copied by hand, kept under DIR/<store id>/ (the store id: the sha256 of its manifest) and used
-- again by the next cluster over the same store.
--
-- One SHIP message kind, three uses (the head's side: loip.cluster.ship):
--   { op = "need", store_id, manifest (its text), files }  which of `files` this worker lacks,
--        and from which offset (a partial DIR/<id>/<file>.part resumes); raises when the disk
--        quota cannot hold what is to come. Files of its own --store (the same store) are
--        linked in, not shipped.
--   a chunk (flags CHUNK): hop = the file's index in the manifest's files, step = its offset,
--        the payload its bytes; the last one completes the file, checked against the manifest's
--        size, sha256 and CRC32C before it is renamed into place (a file failing its check is
--        removed and logged, naming it)
--   { op = "check" }  the files refused since the last check and those still lacking
-- Nothing half-written is ever used: a worker loads DIR/<id>/<file> only, never a .part.
local json = require "loip.text.json"
local files_rt = require "loip.runtime.files"
local tfiles = require "loip.runtime.shell"
local memory = require "loip.runtime.memory"
local store_mod = require "loip.model.store"

local M = {}

M.CHUNK = 1 -- a SHIP message's flags: a chunk of a file, not a JSON request

local function log(fmt, ...) io.stderr:write(os.date("%H:%M:%S "), string.format(fmt, ...), "\n") io.stderr:flush() end

local Cache = {}
Cache.__index = Cache

-- dir: the cache directory; quota: bytes (0: no limit); store, store_id: the worker's own
-- --store (optional; its files are used where present).
function M.new(dir, quota, store, store_id)
  local ok, err = tfiles.mkdir_p(dir)
  if not ok then error("--cache: " .. err, 0) end
  return setmetatable({ dir = dir, quota = quota or 0, store = store, store_id = store_id, bad = {} }, Cache)
end

-- Bytes the cache holds (shipped files and partial ones; links to the worker's --store count
-- nothing).
function Cache:used()
  local p = io.popen("du -sb " .. tfiles.quote(self.dir) .. " 2>/dev/null")
  local n = p and tonumber((p:read("*l") or ""):match("^(%d+)")) or 0
  if p then p:close() end
  return n
end

local function sha256_hex(text)
  local h = files_rt.sha256()
  files_rt.sha256_update(h, text)
  local hex = files_rt.sha256_hex(h)
  files_rt.sha256_free(h)
  return hex
end

-- The store of id with its manifest's text: DIR/<id>/ made, the manifest written there
-- (atomically) unless present. Returns its directory and manifest.
function Cache:open_store(id, text)
  if type(id) ~= "string" or not id:match("^%x+$") or #id ~= 64 then error("SHIP: 'store_id' is not a sha256", 0) end
  if type(text) ~= "string" or sha256_hex(text) ~= id then
    error("SHIP: the manifest sent does not hash to its store_id " .. id:sub(1, 16), 0)
  end
  local dir = self.dir .. "/" .. id
  local ok, err = tfiles.mkdir_p(dir)
  if not ok then error("--cache: " .. err, 0) end
  local path = dir .. "/manifest.json"
  if not tfiles.size(path) then
    local f = assert(io.open(path .. ".part", "wb"))
    f:write(text)
    f:close()
    assert(os.rename(path .. ".part", path))
  end
  local man = store_mod.check_manifest(json.decode(text), dir)
  self.man, self.sdir, self.id = man, dir, id
  self.by_name, self.by_index = {}, {}
  for k, f in ipairs(man.files) do self.by_name[f.name], self.by_index[k] = f, f end
  return dir, man
end

-- What this worker lacks of `names` (in order): { { name, offset } ... } and the bytes to come.
function Cache:lacking(names)
  local out, bytes = {}, 0
  for _, name in ipairs(names) do
    local f = self.by_name[name] or error("SHIP: '" .. tostring(name) .. "' is not a file of the store's manifest", 0)
    local path = self.sdir .. "/" .. name
    local have = tfiles.size(path)
    if have ~= f.size and self.store and self.store_id == self.id and tfiles.size(self.store .. "/" .. name) == f.size then
      -- the worker's own copy of the store holds it: linked, not shipped
      os.remove(path)
      os.execute("ln -s " .. tfiles.quote(self.store .. "/" .. name) .. " " .. tfiles.quote(path))
      have = tfiles.size(path)
    end
    if have ~= f.size then
      local part = tfiles.size(path .. ".part") or 0
      if part > f.size then os.remove(path .. ".part") part = 0 end
      out[#out + 1] = { name = name, offset = part }
      bytes = bytes + f.size - part
    end
  end
  return out, bytes
end

-- op "need": the files lacking, after the quota is checked against them.
function Cache:need(body)
  self:open_store(body.store_id, body.manifest)
  local out, bytes = self:lacking(body.files or {})
  if self.quota > 0 then
    local used = self:used()
    if used + bytes > self.quota then
      error(string.format("--disk-quota %s of the cache %s cannot hold the %s its plan needs shipped (%s held already)",
        memory.format_bytes(self.quota), self.dir, memory.format_bytes(bytes), memory.format_bytes(used)), 0)
    end
  end
  self.bad = {}
  return { need = out, bytes = bytes, dir = self.sdir }
end

-- The file at path (a complete .part) checked against its manifest entry f: nil, or why not.
local function check_file(path, f)
  local fh = io.open(path, "rb")
  if not fh then return "cannot be read" end
  local h, crc, n = files_rt.sha256(), 0, 0
  while true do
    local s = fh:read(1024 * 1024)
    if not s then break end
    files_rt.sha256_update(h, s)
    if f.crc32c then crc = files_rt.crc32c(crc, s) end
    n = n + #s
  end
  fh:close()
  local hex = files_rt.sha256_hex(h)
  files_rt.sha256_free(h)
  if n ~= f.size then return string.format("%d bytes, the manifest says %d", n, f.size) end
  if f.crc32c and crc ~= f.crc32c then return string.format("CRC32C %08x, the manifest's is %08x", crc, f.crc32c) end
  if hex ~= f.sha256 then return string.format("sha256 %s, the manifest's is %s", hex:sub(1, 16), f.sha256:sub(1, 16)) end
end

-- A chunk: file index msg.hop (1-based, the manifest's files), offset msg.step, bytes the payload.
function Cache:chunk(msg)
  local f = self.by_index and self.by_index[msg.hop]
  if not f then return log("ship: a chunk of file %s, which no SHIP asked for: dropped", tostring(msg.hop)) end
  local path = self.sdir .. "/" .. f.name
  local part = path .. ".part"
  local have = tfiles.size(part) or 0
  if msg.step ~= have then
    -- (a chunk of an earlier attempt, or one after a lost one: the next "need" resumes from have)
    return log("ship: %s: a chunk at offset %d, the file holds %d: dropped", f.name, msg.step, have)
  end
  local fh = assert(io.open(part, have == 0 and "wb" or "ab"))
  fh:write(msg.payload)
  fh:close()
  if have + #msg.payload < f.size then return end
  local why = check_file(part, f)
  if why then
    os.remove(part)
    self.bad[#self.bad + 1] = f.name
    return log("ship: %s failed its check (%s): removed, to be sent again", f.name, why)
  end
  assert(os.rename(part, path)) -- (atomic: the file is whole or absent)
end

-- op "check": the files refused since the last check, and what is still lacking of `files`.
function Cache:check(body)
  local bad = self.bad
  self.bad = {}
  local out, bytes = self:lacking(body.files or {})
  return { bad = bad, need = out, bytes = bytes }
end

-- The SHIP handler of a worker (loip.cluster.device_server): a chunk has no reply; a request's reply is
-- SHIP with JSON. After "need", the worker runs from the cache's store (its manifest, its id).
function M.handle(w, msg, body)
  local c = w.cache or error("SHIP to a worker without --cache", 0)
  if msg.flags == M.CHUNK then return c:chunk(msg) end
  body = body or error("SHIP: a message without its JSON body", 0)
  if body.op == "need" then
    local r = c:need(body)
    w.man, w.store_id, w.opts.store = c.man, c.id, c.sdir
    return "SHIP", json.encode(r)
  elseif body.op == "check" then
    return "SHIP", json.encode(c:check(body))
  end
  error("SHIP: op '" .. tostring(body.op) .. "' is not need or check", 0)
end

return M
