-- The loader (runtime/loader): reads extents of files into slots on its own thread. A thin
-- wrapper: completions are pulled with poll/wait, never pushed. Slots are numbered from 1 here
-- (from 0 in C).
--
--   local l = loader.new{ slots = 1, slot_bytes = 64 << 20, mode = "auto", rate = 0 }
--   l:submit(1, { { path = p, offset = 0, length = n, slot_offset = 0 }, ... }, tag)
--   for _, d in ipairs(l:poll(wait_ms)) do ... d.tag, d.slot, d.ok, d.error, d.bytes ... end
--   local ok, err = l:wait(tag)
--   local slot_bytes, scratch_bytes = loader.size{ slots = 2, slot_bytes = n }  -- what new charges
local ffi = require "ffi"
local core = require "loip.core"
local memory = require "loip.runtime.memory"
local C = core.C

local M = {}

local modes = { auto = C.LOIP_LOADER_AUTO, uring = C.LOIP_LOADER_URING,
  buffered = C.LOIP_LOADER_BUFFERED }
local mode_name = { [tonumber(C.LOIP_LOADER_URING)] = "uring",
  [tonumber(C.LOIP_LOADER_BUFFERED)] = "buffered" }

local Loader = {}
Loader.__index = Loader

-- The C config for opts (see M.new); misuse raises at the caller's caller.
local function config(opts)
  local mode = modes[opts.mode or "auto"]
  if not mode then error("loader: mode must be auto, uring or buffered, not " .. tostring(opts.mode), 3) end
  if type(opts.slot_bytes) ~= "number" or opts.slot_bytes <= 0 then
    error("loader: slot_bytes (a positive number) is required", 3)
  end
  if opts.overlap_loads ~= nil and type(opts.overlap_loads) ~= "boolean" then
    error("loader: overlap_loads must be a boolean, not " .. tostring(opts.overlap_loads), 3)
  end
  local cfg = ffi.new("loip_loader_config")
  cfg.n_slots = opts.slots or 1
  cfg.slot_bytes = opts.slot_bytes
  cfg.mode = mode
  cfg.rate_limit_bps = opts.rate or 0
  cfg.queue_depth = opts.queue_depth or 0
  cfg.request_bytes = opts.request_bytes or 0
  cfg.debug_short_every = opts.debug_short_every or 0
  cfg.overlap_loads = opts.overlap_loads and 1 or 0
  if opts.budget ~= nil then
    if not memory.is_budget(opts.budget) then
      error("loader: budget must come from loip.memory.budget", 3)
    end
    cfg.budget = opts.budget.handle
  end
  return cfg
end

-- The loip_loader_config for opts (as M.new takes them): for a loader another object owns (the
-- expert cache's).
function M.config(opts) return config(opts or {}) end

-- opts: slots (1), slot_bytes (required), mode ("auto" | "uring" | "buffered"), rate (bytes/s,
-- 0 = off), queue_depth (32), request_bytes (1 MiB), debug_short_every (tests), budget (from
-- loip.memory.budget: the slots are charged to its "slots" account before they are allocated),
-- overlap_loads (false, the default: a load's reads start once those of the load before it have
-- all landed, so loads complete in order and the stage waiting on the first gets it sooner on a
-- disk that serves queued reads in parallel; true: a load's reads start as soon as the queue
-- has room, overlapping the previous load's tail. Which is faster is the disk's: a profile
-- measures it, a policy chooses).
-- Returns the loader, or nil, err when it cannot be made (e.g. mode "uring" without io_uring).
function M.new(opts)
  local cfg = config(opts or {})
  local h, err = core.new("loip_loader *", C.loip_loader_new, C.loip_loader_free, cfg)
  if not h then return nil, err end
  return setmetatable({ handle = h, done = ffi.new("loip_load_done[16]"), one = ffi.new("loip_load_done[1]") }, Loader)
end

-- What M.new(opts) would charge to a budget, from C (loip_loader_size), before anything is
-- allocated: slot_bytes ("slots"), scratch_bytes ("scratch": the buffered path's bounce buffer;
-- mode "auto" counts it where io_uring is unavailable here). nil, err for opts C refuses.
function M.size(opts)
  local cfg = config(opts or {})
  local slots, scratch = ffi.new("uint64_t[1]"), ffi.new("uint64_t[1]")
  local ok, err = core.ok(C.loip_loader_size(cfg, slots, scratch))
  if not ok then return nil, err end
  return tonumber(slots[0]), tonumber(scratch[0])
end

local function handle(self)
  if self.handle == nil then error("loader: used after close", 3) end
  return self.handle
end

-- "uring" or "buffered": the path in use.
function Loader:mode()
  return mode_name[tonumber(C.loip_loader_mode(handle(self)))]
end

function Loader:describe()
  local buf = ffi.new("char[1024]")
  C.loip_loader_describe(handle(self), buf, 1024)
  return ffi.string(buf)
end

function Loader:slots() return tonumber(C.loip_loader_slots(handle(self))) end
function Loader:slot_bytes() return tonumber(C.loip_loader_slot_bytes(handle(self))) end

-- The slot's memory (uint8_t *) and its size; the pointer lives as long as the loader.
function Loader:slot(i)
  local h = handle(self)
  local n = tonumber(C.loip_loader_slots(h))
  if type(i) ~= "number" or i < 1 or i > n then error("loader: slot " .. tostring(i) .. " out of 1.." .. n, 2) end
  return ffi.cast("uint8_t *", C.loip_loader_slot_data(h, i - 1)), tonumber(C.loip_loader_slot_bytes(h))
end

-- extents: list of { path = , fd = , offset = , length = , slot_offset = } (or positional
-- { path, offset, length, slot_offset }). A missing file is nil, err at once.
function Loader:submit(slot, extents, tag)
  local h = handle(self)
  if type(extents) ~= "table" then error("loader: extents must be a list", 2) end
  if type(tag) ~= "number" then error("loader: tag must be a number", 2) end
  local n = #extents
  local ext = ffi.new("loip_load_extent[?]", math.max(n, 1))
  local keep = {} -- path strings stay alive through the call
  for i, e in ipairs(extents) do
    local x = ext[i - 1]
    local path = e.path or e[1]
    if path then keep[i] = path; x.path = path else x.path = nil end
    x.fd = e.fd or -1
    x.file_offset = e.offset or e[2] or 0
    x.length = e.length or e[3] or error("loader: extent " .. i .. " has no length", 2)
    x.slot_offset = e.slot_offset or e[4] or 0
  end
  local ok, err = core.ok(C.loip_loader_submit(h, slot - 1, ext, n, tag))
  return ok, err
end

local function record(d)
  return { tag = tonumber(d.tag), slot = d.slot + 1, ok = d.status == 0, status = d.status,
    error = d.status ~= 0 and ffi.string(d.message) or nil, bytes = tonumber(d.bytes),
    ms = tonumber(d.t_done_ns - d.t_submit_ns) / 1e6 }
end

-- Finished loads (a list, maybe empty), waiting up to wait_ms (0: not at all; < 0: until one
-- finishes) when none is ready.
function Loader:poll(wait_ms)
  local h = handle(self)
  local out = {}
  local k = C.loip_loader_poll(h, self.done, 16, wait_ms or 0)
  while k > 0 do
    for i = 0, k - 1 do out[#out + 1] = record(self.done[i]) end
    if k < 16 then break end
    k = C.loip_loader_poll(h, self.done, 16, 0)
  end
  return out
end

-- true, record; or nil, err, record (record is nil on timeout or an unknown tag).
function Loader:wait(tag, timeout_ms)
  local rc = C.loip_loader_wait(handle(self), tag, timeout_ms or -1, self.one)
  if rc == 0 then return true, record(self.one[0]) end
  if rc == C.LOIP_ETIMEDOUT or rc == C.LOIP_EINVAL then return nil, core.failure(rc) end
  return nil, core.failure(rc), record(self.one[0])
end

function Loader:pending() return tonumber(C.loip_loader_pending(handle(self))) end

function Loader:stats()
  local st = ffi.new("loip_loader_stats_t")
  C.loip_loader_stats(handle(self), st)
  local t = {}
  for _, k in ipairs { "bytes_read", "reads", "short_reads", "loads_done", "loads_failed",
    "busy_ns", "throttle_ns" } do
    t[k] = tonumber(st[k])
  end
  return t
end

-- Waits for reads in flight; idempotent.
function Loader:close()
  if self.handle ~= nil then core.free(self.handle, C.loip_loader_free) end
  self.handle = nil
end

return M
