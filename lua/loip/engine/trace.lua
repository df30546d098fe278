-- Timelines: the runner's load, compute and wait events (loip.model's m:events()) as a Chrome
-- trace-event file (opens in Perfetto, ui.perfetto.dev, or chrome://tracing): one process per
-- device, one thread lane each for disk, compute, network, waits and live plan changes (kind
-- "adapt": stage, from, to, context), times in microseconds
-- from the first event.
--
--   local tr = loip.trace.new()
--   tr:add(m:events(), 1)            -- events of device 1 (repeat as they come)
--   tr:write("out.json")
local json = require "loip.text.json"
local plan = require "loip.plan"

local M = {}

M.lanes = { disk = 1, compute = 2, network = 3, wait = 4, plan = 5 }
local lane_of = { load = "disk", compute = "compute", wait = "wait", send = "network", recv = "network", adapt = "plan" }
-- Device 0 is the head, the process that runs the request loop: its lanes hold events named by
-- their `name`, with their `args` (speculative decoding's "draft" and "verify" spans,
-- loip.engine.request.draft_trace).
M.head_lanes = { draft = 1, verify = 2 }

local Trace = {}
Trace.__index = Trace

function M.new() return setmetatable({ events = {}, devices = {}, t0 = nil }, Trace) end

local function blocks(e)
  if e.kind == "adapt" then return nil end
  if e.kind == "send" or e.kind == "recv" then return "hidden state" end
  if e.first_block == nil then return nil end
  if e.expert then return string.format("%s expert %d", plan.block_name(e.first_block), e.expert) end -- (a mixture of experts' read)
  if e.first_block < 0 then return "embedding" end
  if e.stage == 0 then return "head" end
  if e.last_block - e.first_block == 1 then return plan.block_name(e.first_block) end
  return plan.block_name(e.first_block) .. " .. " .. plan.block_name(e.last_block - 1)
end

local function name(e)
  if e.name then return e.name end
  if e.kind == "load" then return string.format("load stage %d", e.stage) end
  if e.kind == "send" then return string.format("send (stage %d)", e.stage) end
  if e.kind == "recv" then return string.format("transit into stage %d", e.stage) end
  if e.kind == "wait" then return string.format("wait for stage %d", e.stage) end
  if e.kind == "adapt" then
    return e.text or string.format("stage %d: %d -> %d blocks offloaded (at %d positions)", e.stage, e.from or 0, e.to or 0,
      e.context or 0)
  end
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
    out[#out + 1] = { ph = "M", name = "process_name", pid = d, tid = 0, args = { name = d == 0 and "head" or "device " .. d } }
    for lane, tid in pairs(d == 0 and M.head_lanes or M.lanes) do
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
    for k, v in pairs(e.args or {}) do args[k] = v end
    local tid = x.device == 0 and (M.head_lanes[e.kind] or 1) or M.lanes[lane_of[e.kind] or "compute"]
    out[#out + 1] = { ph = "X", name = name(e), cat = e.kind, pid = x.device, tid = tid,
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

-- The colours of the events' kinds on a timeline (M.plot).
local colors = { load = "#27ae60", compute = "#2c7fb8", wait = "#c0392b", send = "#e67e22", recv = "#f5b041", draft = "#8e44ad",
  verify = "#16a085" }

-- The complete events ("X") of a Chrome trace t in the window opts.from_ms .. opts.to_ms, the
-- processes they are on (a set), the processes' names, and the window's ends (ms).
local function plot_events(t, trace_path, opts)
  local evs, pids, names, lo, hi = {}, {}, {}, math.huge, -math.huge
  for _, e in ipairs(t.traceEvents) do
    if e.ph == "M" and e.name == "process_name" then names[e.pid] = e.args and e.args.name end
    if e.ph == "X" and type(e.ts) == "number" and type(e.dur) == "number" then
      local a, b = e.ts / 1e3, (e.ts + e.dur) / 1e3
      if (not opts.from_ms or b >= opts.from_ms) and (not opts.to_ms or a <= opts.to_ms) then
        evs[#evs + 1] = e
        pids[e.pid] = true
        lo, hi = math.min(lo, a), math.max(hi, b)
      end
    end
  end
  if #evs == 0 then error(trace_path .. ": no events" .. ((opts.from_ms or opts.to_ms) and " in that window" or ""), 0) end
  return evs, pids, names, opts.from_ms or lo, opts.to_ms or hi
end

local function esc(x) return (tostring(x):gsub("&", "&amp;"):gsub("<", "&lt;"):gsub(">", "&gt;")) end

-- The time axis under the rows (at y), from lo to hi ms over span, its ticks at round steps.
local function plot_axis(add, x, left, width, y, lo, hi, span)
  local step = 10 ^ math.floor(math.log10(span / 5))
  if span / step > 12 then step = step * 5 elseif span / step > 6 then step = step * 2 end
  local ay = y + 5
  add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>', left, ay, left + width, ay)
  local tick = math.ceil(lo / step) * step
  while tick <= hi do
    add('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black"/>', x(tick), ay, x(tick), ay + 4)
    add('<text x="%.1f" y="%d" text-anchor="middle">%s</text>', x(tick), ay + 16,
      step >= 1 and string.format("%.0f", tick) or string.format("%g", tick))
    tick = tick + step
  end
  add('<text x="%d" y="%d">ms</text>', left + width + 4, ay + 30)
end

-- An SVG timeline of a Chrome trace file (as Trace:write makes them): per device, one row per
-- lane (disk, compute, network, wait; the head's: draft, verify), events as bars, a time axis
-- in ms. opts: from_ms, to_ms (a window of the trace), width (px), title.
function M.plot(trace_path, svg_path, opts)
  opts = opts or {}
  local t, err = json.load(trace_path)
  if not t then error(err, 0) end
  if type(t) ~= "table" or type(t.traceEvents) ~= "table" then
    error(trace_path .. ": not a Chrome trace (no traceEvents)", 0)
  end
  local evs, pids, names, lo, hi = plot_events(t, trace_path, opts)
  local plist = {}
  for p in pairs(pids) do plist[#plist + 1] = p end
  table.sort(plist)
  local device_lanes, head_lanes = { "disk", "compute", "network", "wait" }, { "draft", "verify" }
  local function lanes_of(p) return p == 0 and head_lanes or device_lanes end
  local left, width, lane_h, top = 150, opts.width or 1200, 14, 40
  local row_of = {}
  local y = top
  local out = {}
  local function add(...) out[#out + 1] = string.format(...) end
  for _, p in ipairs(plist) do
    row_of[p] = y
    y = y + #lanes_of(p) * lane_h + 14
  end
  local height = y + 40
  add('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">', left + width + 20, height)
  add('<rect width="100%%" height="100%%" fill="white"/>')
  add('<text x="10" y="20" font-size="14" font-weight="bold">%s</text>', esc(opts.title or ("loip timeline: " .. trace_path)))
  local span = math.max(hi - lo, 1e-6)
  local function x(ms) return left + (ms - lo) / span * width end
  for _, p in ipairs(plist) do
    local y0 = row_of[p]
    add('<text x="8" y="%d" font-weight="bold">%s</text>', y0 + 10, esc(names[p] or ("device " .. p)))
    for li, lane in ipairs(lanes_of(p)) do
      local ly = y0 + (li - 1) * lane_h
      add('<text x="%d" y="%d" fill="#555">%s</text>', left - 50, ly + 11, lane)
      add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#eee"/>', left, ly + lane_h, left + width, ly + lane_h)
    end
  end
  local tid_lane = { [M.lanes.disk] = 1, [M.lanes.compute] = 2, [M.lanes.network] = 3, [M.lanes.wait] = 4 }
  for _, e in ipairs(evs) do
    local li = tid_lane[e.tid] or 2
    local a, b = math.max(e.ts / 1e3, lo), math.min((e.ts + e.dur) / 1e3, hi)
    local ly = row_of[e.pid] + (li - 1) * lane_h
    add('<rect x="%.2f" y="%d" width="%.2f" height="%d" fill="%s"><title>%s %.3f ms</title></rect>', x(a), ly + 2,
      math.max(x(b) - x(a), 0.5), lane_h - 3, colors[e.cat] or "#888", esc(e.name), e.dur / 1e3)
  end
  plot_axis(add, x, left, width, y, lo, hi, span)
  add("</svg>")
  local tmp = svg_path .. ".tmp"
  local f, ferr = io.open(tmp, "w")
  if not f then error(tostring(ferr), 0) end
  f:write(table.concat(out, "\n"), "\n")
  f:close()
  assert(os.rename(tmp, svg_path))
  return #evs
end
return M
