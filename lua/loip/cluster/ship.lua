-- Blocks shipped, not copied by hand: before a plan takes effect (Cluster:plan, and any re-plan:
-- a loss, a restage's new plan, a join), every device whose worker keeps a block cache
-- (`loip worker --cache DIR`, loip.cluster.cache) is sent the store's files its part of the plan
-- reads (resident and offloaded blocks, the embedding on device 1, the head on device N) that it
-- lacks, over its bulk link (authenticated as every cluster socket), in chunks, resuming a
-- partial file where it stopped. A file that fails its check there is sent once more; a second
-- failure, or a disk quota too small, is an error naming the file and the device. The head sends
-- (peers that hold the blocks do not: the head first). Per device, d.shipped_bytes counts what
-- was sent; progress on stderr.
local json = require "loip.text.json"
local plan = require "loip.plan"
local store = require "loip.model.store"
local cache = require "loip.cluster.cache"
local progress = require "loip.ui.progress"

local M = {}

M.CHUNK_BYTES = 512 * 1024 -- (a worker's bulk receive takes 1 MiB at most)
M.SEND_MS = 120000         -- a chunk not queued within this: the device's link is stuck

-- A test hook (nil in use): function(device, name, offset, bytes) -> the bytes to send instead
-- (a spec flips one to see the worker refuse the file).
M.tamper = nil

-- The store's files device i reads under plan p (sizes: loip.plan.sizes of the store), in the
-- manifest's order: a list of names.
function M.files_of(man, p, i, sizes)
  local want = plan.device_files(p, i, sizes)
  for name in pairs(store.offloaded_files(p, i, man)) do want[name] = true end
  for name in pairs(store.ends_files(p, i, sizes.tied)) do want[name] = true end
  local out = {}
  for _, f in ipairs(man.files) do if want[f.name] then out[#out + 1] = f.name end end
  return out
end

local function read_manifest_text(dir)
  local f = assert(io.open(dir .. "/manifest.json", "rb"))
  local text = f:read("*a")
  f:close()
  return text
end

-- Send device i the parts it lacks (need: { { name, offset } ... }), chunk by chunk.
local function send_files(c, i, need, index, bar, sent)
  local d = c.registry.devices[i]
  for _, n in ipairs(need) do
    local f = assert(io.open(c.store .. "/" .. n.name, "rb"))
    f:seek("set", n.offset)
    local off = n.offset
    while true do
      local bytes = f:read(M.CHUNK_BYTES)
      if not bytes then break end
      if M.tamper then bytes = M.tamper(i, n.name, off, bytes) end
      local ok, err = d.bulk:send({ kind = "SHIP", flags = cache.CHUNK, hop = index[n.name], step = off, payload = bytes },
        M.SEND_MS)
      if not ok then
        f:close()
        error(string.format("device %d (%s): shipping %s: %s", i, d.endpoint, n.name, tostring(err)), 0)
      end
      off = off + #bytes
      sent.bytes = sent.bytes + #bytes
      d.shipped_bytes = (d.shipped_bytes or 0) + #bytes
      if bar then bar:update(sent.bytes) end
    end
    f:close()
  end
end

local function total(need)
  local n = 0
  for _, x in ipairs(need) do n = n + x.size - x.offset end
  return n
end

-- Ship device i what plan p gives it (a no-op for a worker without a cache). Returns the bytes sent.
function M.device(c, p, i, sizes)
  local d = c.registry.devices[i]
  if not (d.hello and d.hello.cache) or not d.bulk then return 0 end
  local names = M.files_of(c.man, p, i, sizes)
  local index, size = {}, {}
  for k, f in ipairs(c.man.files) do index[f.name], size[f.name] = k, f.size end
  c.manifest_text = c.manifest_text or read_manifest_text(c.store)
  local r = json.decode(c.rpc:ask(i, { kind = "SHIP", payload = json.encode({ op = "need", store_id = c.store_id,
    manifest = c.manifest_text, files = names }) }, 60000, d.bulk).payload)
  local need = r.need or {}
  for _, x in ipairs(need) do x.size = size[x.name] end
  local sent = { bytes = 0 }
  local bar = #need > 0 and progress.new(total(need), string.format("shipping to device %d", i)) or nil
  for attempt = 1, 2 do
    if #need == 0 then break end
    send_files(c, i, need, index, bar, sent)
    -- (after the chunks on the same link: the worker has checked every file by then)
    local chk = json.decode(c.rpc:ask(i, { kind = "SHIP", payload = json.encode({ op = "check", files = names }) }, M.SEND_MS,
      d.bulk).payload)
    need = chk.need or {}
    for _, x in ipairs(need) do x.size = size[x.name] end
    for _, name in ipairs(chk.bad or {}) do
      if attempt == 2 then
        error(string.format("device %d (%s): %s failed its checksum twice after shipping (the store's copy or the link is damaged)",
          i, d.endpoint, name), 0)
      end
      io.stderr:write(string.format("loip: device %d: %s failed its checksum after shipping; sending it again\n", i, name))
    end
    if bar and #need > 0 then bar.total = sent.bytes + total(need) end
  end
  if #need > 0 then
    error(string.format("device %d (%s): %s still missing after shipping", i, d.endpoint, need[1].name), 0)
  end
  if bar then bar:finish() end
  return sent.bytes
end

-- Ship every device what plan p gives it, before the plan is sent (the planner's plan calls this;
-- a re-plan goes through it too, and a join may call it for a plan of its own). Returns
-- the bytes sent per device (a list, by the devices' order now).
function M.plan(c, p, sizes)
  local out = {}
  for i in ipairs(c.registry.devices) do out[i] = M.device(c, p, i, sizes) end
  return out
end

-- A local worker's store arguments (loip.cluster.registry spawns it): opts.cache (a directory,
-- device i's cache its device-i folder; or a list, one per device) instead of the store, with
-- opts.disk_quota (once or per device); else --store.
function M.worker_args(opts, dir, i)
  local dir_i = type(opts.cache) == "table" and opts.cache[i] or (opts.cache and (opts.cache .. "/device-" .. i))
  if not dir_i then return { "--store", dir } end
  local args = { "--cache", dir_i }
  local q = type(opts.disk_quota) == "table" and opts.disk_quota[i] or opts.disk_quota
  if q then args[3], args[4] = "--disk-quota", tostring(q) end
  if opts.cache_store then args[#args + 1] = "--store" args[#args + 1] = opts.cache_store end
  return args
end

-- Bytes shipped to each device so far (a list, by the devices' order now).
function M.shipped(c)
  local out = {}
  for i, d in ipairs(c.devices) do out[i] = d.shipped_bytes or 0 end
  return out
end

-- /metrics: loip_shipped_bytes_total{device} (m: loip.serve.metrics).
function M.metrics(m, c)
  for i, d in ipairs(c.devices) do
    m:count("loip_shipped_bytes_total", "block bytes shipped to a device's cache", d.shipped_bytes or 0, { device = i })
  end
end

return M
