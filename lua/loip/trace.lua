-- Timelines: the runner's load, compute and wait events (loip.model's m:events()) as a Chrome
-- trace-event file (opens in Perfetto, ui.perfetto.dev, or chrome://tracing): one process per
-- device, one thread lane each for disk, compute, network and waits, times in microseconds
-- from the first event.
--
--   local tr = loip.trace.new()
--   tr:add(m:events(), 1)            -- events of device 1 (repeat as they come)
--   tr:write("out.json")
local json = require "loip.json"
local plan = require "loip.plan"

local M = {}

M.lanes = { disk = 1, compute = 2, network = 3, wait = 4 }
local lane_of = { load = "disk", compute = "compute", wait = "wait", send = "network", recv = "network" }

local Trace = {}
Trace.__index = Trace

function M.new() return setmetatable({ events = {}, devices = {}, t0 = nil }, Trace) end

local function blocks(e)
  if e.first_block < 0 then return "embedding" end
  if e.stage == 0 then return "head" end
  if e.last_block - e.first_block == 1 then return plan.block_name(e.first_block) end
  return plan.block_name(e.first_block) .. " .. " .. plan.block_name(e.last_block - 1)
end

local function name(e)
  if e.kind == "load" then return string.format("load stage %d", e.stage) end
  if e.kind == "wait" then return string.format("wait for stage %d", e.stage) end
  if e.kind == "compute" then
    if e.stage == 0 then return blocks(e) end
    return string.format("stage %d %s", e.stage, e.offloaded and "offloaded" or "resident")
  end
  return e.kind
end

-- Append events (as m:events() returns them) of device (default 1).
function Trace:add(events, device)
  device = device or 1
  self.devices[device] = true
  for _, e in ipairs(events) do
    if not self.t0 or e.t0_ns < self.t0 then self.t0 = e.t0_ns end
    self.events[#self.events + 1] = { e = e, device = device }
  end
end

function Trace:count() return #self.events end

-- The trace as a table ready for JSON: { traceEvents = {...}, displayTimeUnit = "ms" }.
function Trace:chrome()
  local out = {}
  for d in pairs(self.devices) do
    out[#out + 1] = { ph = "M", name = "process_name", pid = d, tid = 0, args = { name = "device " .. d } }
    for lane, tid in pairs(M.lanes) do
      out[#out + 1] = { ph = "M", name = "thread_name", pid = d, tid = tid, args = { name = lane } }
      out[#out + 1] = { ph = "M", name = "thread_sort_index", pid = d, tid = tid, args = { sort_index = tid } }
    end
  end
  local t0 = self.t0 or 0
  for _, x in ipairs(self.events) do
    local e = x.e
    local args = { blocks = blocks(e) }
    if e.bytes and e.bytes > 0 then
      args.bytes = e.bytes
      local s = (e.t1_ns - e.t0_ns) / 1e9
      if s > 0 then args.GBps = math.floor(e.bytes / s / 1e7 + 0.5) / 100 end
    end
    if e.tokens and e.tokens > 0 then args.tokens = e.tokens end
    out[#out + 1] = { ph = "X", name = name(e), cat = e.kind, pid = x.device, tid = M.lanes[lane_of[e.kind] or "compute"],
      ts = (e.t0_ns - t0) / 1e3, dur = math.max(0, e.t1_ns - e.t0_ns) / 1e3, args = args }
  end
  return { traceEvents = out, displayTimeUnit = "ms" }
end

-- Write the trace to path (a temporary name, renamed when complete).
function Trace:write(path)
  local tmp = path .. ".tmp"
  local f, err = io.open(tmp, "wb")
  if not f then error("--trace: " .. tostring(err), 0) end
  local ok, werr = f:write(json.encode(self:chrome()), "\n")
  f:close()
  if not ok then os.remove(tmp) error("--trace: " .. path .. ": " .. tostring(werr), 0) end
  local rok, rerr = os.rename(tmp, path)
  if not rok then os.remove(tmp) error("--trace: " .. tostring(rerr), 0) end
  return path
end

return M
