-- The ring's transport (docs/design.md, sections 2-3): a cluster's messages to its devices.
-- Control exchanges with one device (ask, tell, answer) or all at once (round); the wait for a
-- step's result while watching every device (heartbeats, process checks, ERROR messages: a
-- device that dies, hangs or disconnects is noticed once silent for the cluster's dead_ms); what
-- the devices recorded (stats, collect_trace). The head's results socket is its own.
--
--   local rpc = rpc.new(c, endpoint)         -- c: loip.cluster's Cluster; results bound at endpoint
--   rpc:ask(i, msg, timeout_ms, via) -> reply     send to device i, then its answer (via: d.bulk)
--   rpc:tell(i, msg, via)                          send, no answer awaited
--   rpc:answer(i, kind, timeout_ms, via) -> reply  the answer to a `kind` sent before
--   rpc:round(msg, timeout_ms) -> replies by device
--   rpc:await(step, plan_id, timeout_ms) -> the RESULT of step, every device watched
--   rpc:read_late()                                results of stopped steps dropped, leaves noted
--   rpc:expect_results(bytes)                      the largest RESULT a plan sends
--   rpc:stats() -> per device STATS;  rpc:collect_trace(tr) -> tr
--   rpc.results, rpc.result_bytes                  the results socket and its buffer's size
--   M.read_pongs(d), M.beat_ms(c)                  a device's heartbeat read; how often it is pinged
-- A control exchange that finds a device lost raises an error that names it (err.lost: the
-- device's record; loip.cluster.registry's recover makes it a loss). It reads the devices from
-- c.registry, the cluster's dead_ms and stage_limit_ms, and c.planner.plan_table (heartbeats are
-- watched once planned); a worker's STOP { leave } read here is given to c.registry:note_leave.
local ffi = require "ffi"
local core = require "loip.core"
local errors = require "loip.error"
local json = require "loip.text.json"
local proc = require "loip.cluster.proc"

local alive, tail = proc.alive, proc.tail

local M = {}

-- How often a device is pinged: a quarter of the silence that makes it lost (c.dead_ms, the
-- cluster's option, `--dead-after`), at most every 250 ms.
local function beat_ms(c) return math.min(250, c.dead_ms / 4) end
M.beat_ms = beat_ms

local Rpc = {}
Rpc.__index = Rpc

-- The transport of cluster c: its results socket bound at endpoint (through c.net).
function M.new(c, endpoint)
  return setmetatable({ c = c, results = assert(c.net:bind(endpoint)) }, Rpc)
end

-- PONGs waiting on device d's heartbeat socket read: when it was last heard (d.last_seen) and
-- the last PING it answered (d.pong_step: a PONG carries its PING's step).
local function read_pongs(d)
  local b = d.hb and d.hb:recv(0)
  while b do
    if b.kind == "PONG" then d.last_seen, d.pong_step = core.now_ms(), b.step end
    b = d.hb:recv(0)
  end
end
M.read_pongs = read_pongs

-- The error of a control exchange that found device d lost (its process gone, its heartbeat
-- silent for dead_ms, a message it could not take): kind device_lost, naming the device, so
-- that a request's caller treats it as the loss it is (loip.cluster.registry's recover) and any
-- other reads it as text.
local function lost(d, msg) return errors.new("device_lost", msg, { lost = d }) end

-- A control exchange with device i: send, then the reply within timeout_ms; via: the socket
-- to use (default the control link; d.bulk for large replies).
function Rpc:ask(i, msg, timeout_ms, via)
  self:tell(i, msg, via)
  return self:answer(i, msg.kind, timeout_ms, via)
end

-- Send msg to device i (no answer awaited).
function Rpc:tell(i, msg, via)
  local d = self.c.registry.devices[i]
  local ok, err = (via or d.ctl):send(msg, 2000)
  if not ok then error(lost(d, string.format("device %d (%s): %s", i, d.endpoint, err)), 0) end
end

-- Device i's answer to a `kind` message sent before, within timeout_ms (PONGs skipped, ERROR
-- raised, its key refused reported at once). A device that is gone meanwhile raises a loss
-- (loip.cluster.registry's recover): its process exited, or, once the cluster has a plan, its heartbeat (pinged
-- while we wait) is silent for dead_ms (past timeout_ms too: a device whose heartbeat answers
-- but not the message is late, not lost); one without a heartbeat that does not answer in time.
function Rpc:answer(i, kind, timeout_ms, via)
  local c = self.c
  local d = c.registry.devices[i]
  local sock = via or d.ctl
  local t0 = core.now_ms()
  local limit, beat = timeout_ms or 10000, beat_ms(c)
  -- (its heartbeat watched once planned: before, no request waits on the device, and a worker
  -- counts the head's pings from its plan on)
  local watch = d.hb and c.planner.plan_table
  local deadline, next_beat = t0 + limit, watch and t0 or math.huge
  while true do
    local now = core.now_ms()
    local silent = 0
    if watch then
      read_pongs(d)
      if now >= next_beat then d.hb:send({ kind = "PING" }, 0) next_beat = now + beat end
      silent = now - math.max(d.last_seen or 0, t0) -- (heard before we asked: counts from the asking)
      if silent > c.dead_ms then
        error(lost(d, string.format("device %d (%s) has not answered for %.1f s: it hangs or is unreachable", i, d.endpoint,
          silent / 1000)), 0)
      end
    end
    if now >= deadline and (not watch or silent <= 2 * beat) then
      local msg = string.format("device %d (%s) did not answer %s within %.0f s", i, d.endpoint, kind, limit / 1000)
      error(d.hb and msg or lost(d, msg), 0)
    end
    local r = sock:recv(math.max(1, math.min(deadline - now, next_beat - now, 200)), via and 64 * 1024 * 1024 or 1024 * 1024)
    if not r and sock:refused() > 0 then
      error(string.format("device %d (%s) refused our key: wrong cluster token? (give every member the same --token, LOIP_CLUSTER_TOKEN or --curve-keys)",
        i, d.endpoint), 0)
    end
    if r and r.kind ~= "PONG" then
      if r.kind == "ERROR" then error(string.format("device %d (%s): %s", i, d.endpoint, r.payload), 0) end
      return r
    end
    if d.pid and not alive(d.pid) then
      error(lost(d, string.format("device %d (%s, pid %d) exited:\n%s", i, d.endpoint, d.pid, tail(d.log, 5))), 0)
    end
  end
end

-- A round: msg to every device at once, then their answers (by device) within timeout_ms. One
-- device's failure leaves no other's answer unread (it would be taken for the answer to that
-- device's next exchange): every device told is answered before the first failure is raised.
function Rpc:round(msg, timeout_ms)
  local told, out, first = 0, {}, nil
  for i = 1, #self.c.registry.devices do
    local ok, err = pcall(self.tell, self, i, msg)
    if not ok then first = err break end
    told = i
  end
  for i = 1, told do
    local ok, r = pcall(self.answer, self, i, msg.kind, timeout_ms)
    if ok then out[i] = r else first = first or r end
  end
  if first then error(first, 0) end
  return out
end

-- Wait for the result of step (of plan plan_id), watching every device. Returns the message.
function Rpc:await(step, plan_id, timeout_ms)
  local c = self.c
  local devices = c.registry.devices
  local deadline = core.now_ms() + (timeout_ms or 600000)
  local next_beat = core.now_ms()
  -- silence counts only while the head listens: a caller busy elsewhere (a STATS exchange with
  -- one device during a request, say) sends no heartbeats meanwhile, and the others' answers to
  -- the next ones are on their way
  local listening = core.now_ms()
  for _, d in ipairs(devices) do d.last_seen = d.last_seen or listening end
  while true do
    local now = core.now_ms()
    if now >= next_beat then
      for i, d in ipairs(devices) do
        if d.pid and not alive(d.pid) then
          d.failed = true
          error(string.format("device %d (%s, pid %d) died during the request:\n%s", i, d.endpoint, d.pid, tail(d.log, 3)), 0)
        end
        ;(d.hb or d.ctl):send({ kind = "PING" }, 0)
      end
      next_beat = now + beat_ms(c)
    end
    for i, d in ipairs(devices) do
      local r = d.ctl:recv(0)
      while r do
        if not d.hb then d.last_seen = core.now_ms() end
        if r.kind == "ERROR" then error(string.format("device %d (%s): %s", i, d.endpoint, r.payload), 0) end
        r = d.ctl:recv(0)
      end
      -- the heartbeat thread answers even during a long stage; it says how long the device has
      -- been busy with one message, which must stay under the stage limit
      local b = d.hb and d.hb:recv(0)
      while b do
        if b.kind == "PONG" then
          d.last_seen = core.now_ms()
          local busy = #b.payload >= 8 and tonumber(ffi.cast("const uint64_t *", b.payload)[0]) / 1e6 or 0
          if busy > c.stage_limit_ms then
            d.failed = true
            error(string.format("device %d (%s) has been computing one message for %.0f s (limit %.0f s): it hangs",
              i, d.endpoint, busy / 1000, c.stage_limit_ms / 1000), 0)
          end
        end
        b = d.hb:recv(0)
      end
      local silent = core.now_ms() - math.max(d.last_seen, listening)
      if silent > c.dead_ms then
        d.failed = true
        error(string.format("device %d (%s) has not answered for %.1f s: it hangs or is unreachable",
          i, d.endpoint, silent / 1000), 0)
      end
    end
    local r = self.results:recv(50, self.result_bytes)
    if r then
      local i = tonumber(r.from:match("^d(%d+)$"))
      if i and devices[i] then devices[i].last_seen = core.now_ms() end
      -- an error about this step stops it; one about an older step (a late message of a step
      -- that was stopped) or about a message nobody can attribute (malformed) does not
      if r.kind == "ERROR" then
        if r.step == step then error(errors.from_code(r.status, string.format("device %s: %s", i or r.from, r.payload)), 0) end
        self.warnings = self.warnings or {}
        table.insert(self.warnings, string.format("device %s: %s", i or r.from, r.payload))
      end
      if r.kind == "STOP" then c.registry:note_leave(r) end -- (a worker leaving)
      if r.kind == "RESULT" and r.step == step and r.plan_id == plan_id then return r end
    end
    if core.now_ms() > deadline then error("no result within " .. (timeout_ms or 600000) / 1000 .. " s", 0) end
  end
end

-- Between steps: results of a step already stopped dropped (as await drops them), a worker's
-- STOP { leave } given to the registry.
function Rpc:read_late()
  local r = self.results:recv(0, self.result_bytes)
  while r do
    if r.kind == "STOP" then self.c.registry:note_leave(r) end
    r = self.results:recv(0, self.result_bytes)
  end
end

-- A plan's largest RESULT (bytes): an output per token of a step and the logits rows asked for
-- (the results socket's buffer is this big, not a fixed ceiling).
function Rpc:expect_results(bytes) self.result_bytes = bytes end

-- The devices' recorded events (plan with trace = true) since the last call, added to tr (a
-- loip.trace) with one process per device, on the head's clock.
function Rpc:collect_trace(tr)
  for i, d in ipairs(self.c.registry.devices) do
    local body = json.decode(self:ask(i, { kind = "TRACE" }, 30000, d.bulk).payload) or {}
    local evs = body.events or {}
    local off = d.clock_offset_ns or 0
    if off ~= 0 then
      for _, e in ipairs(evs) do e.t0_ns, e.t1_ns = e.t0_ns - off, e.t1_ns - off end
    end
    tr:add(evs, i)
  end
  return tr
end

-- Per-device statistics (STATS), as tables.
function Rpc:stats()
  local out = {}
  for i = 1, #self.c.registry.devices do out[i] = json.decode(self:ask(i, { kind = "STATS" }, 5000).payload) or {} end
  return out
end

return M
