-- A cluster's messages to its devices (docs/design.md, sections 2-3): control exchanges with one
-- device (ask, tell, answer), the wait for a step's result while watching every device
-- (heartbeats, process checks, ERROR messages: a device that dies, hangs or disconnects is
-- noticed once silent for the cluster's dead_ms), the same watch between steps and while nothing
-- runs (watch, check_alive: a device dead while idle is a loss too), and what the devices
-- recorded (stats, collect_trace). Methods of loip.cluster's Cluster.
local ffi = require "ffi"
local core = require "loip.core"
local errors = require "loip.error"
local json = require "loip.text.json"
local proc = require "loip.cluster.proc"
local ship = require "loip.cluster.ship"

local alive, tail = proc.alive, proc.tail

-- How often a device is pinged: a quarter of the silence that makes it lost (c.dead_ms, the
-- cluster's option, `--dead-after`), at most every 250 ms.
local function beat_ms(c) return math.min(250, c.dead_ms / 4) end

local Cluster = {}

-- PONGs waiting on device d's heartbeat socket read: when it was last heard (d.last_seen) and
-- the last PING it answered (d.pong_step: a PONG carries its PING's step).
local function read_pongs(d)
  local b = d.hb and d.hb:recv(0)
  while b do
    if b.kind == "PONG" then d.last_seen, d.pong_step = core.now_ms(), b.step end
    b = d.hb:recv(0)
  end
end

-- The error of a control exchange that found device d lost (its process gone, its heartbeat
-- silent for dead_ms, a message it could not take): kind device_lost, naming the device, so
-- that a request's caller treats it as the loss it is (Cluster:recover) and any other reads it
-- as text.
local function lost(d, msg) return errors.new("device_lost", msg, { lost = d }) end

-- A control exchange with device i: send, then the reply within timeout_ms; via: the socket
-- to use (default the control link; d.bulk for large replies).
function Cluster:ask(i, msg, timeout_ms, via)
  self:tell(i, msg, via)
  return self:answer(i, msg.kind, timeout_ms, via)
end

-- Send msg to device i (no answer awaited).
function Cluster:tell(i, msg, via)
  local d = self.devices[i]
  local ok, err = (via or d.ctl):send(msg, 2000)
  if not ok then error(lost(d, string.format("device %d (%s): %s", i, d.endpoint, err)), 0) end
end

-- Device i's answer to a `kind` message sent before, within timeout_ms (PONGs skipped, ERROR
-- raised, its key refused reported at once). A device that is gone meanwhile raises a loss
-- (Cluster:recover): its process exited, or, once the cluster has a plan, its heartbeat (pinged
-- while we wait) is silent for dead_ms (past timeout_ms too: a device whose heartbeat answers
-- but not the message is late, not lost); one without a heartbeat that does not answer in time.
function Cluster:answer(i, kind, timeout_ms, via)
  local d = self.devices[i]
  local sock = via or d.ctl
  local t0 = core.now_ms()
  local limit, beat = timeout_ms or 10000, beat_ms(self)
  -- (its heartbeat watched once planned: before, no request waits on the device, and a worker
  -- counts the head's pings from its plan on)
  local watch = d.hb and self.plan_table
  local deadline, next_beat = t0 + limit, watch and t0 or math.huge
  while true do
    local now = core.now_ms()
    local silent = 0
    if watch then
      read_pongs(d)
      if now >= next_beat then d.hb:send({ kind = "PING" }, 0) next_beat = now + beat end
      silent = now - math.max(d.last_seen or 0, t0) -- (heard before we asked: counts from the asking)
      if silent > self.dead_ms then
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
function Cluster:round(msg, timeout_ms)
  local told, out, first = 0, {}, nil
  for i = 1, #self.devices do
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

-- err, met by a request's call to the cluster (a START, a LOOKUP round, an online policy's STATS
-- or CHANGE, ...): when a control exchange found a device lost, it is a loss as a step's is (the
-- others plan again: replan_after_loss) and a `replanned` error is returned (the batcher resumes
-- every request from its tokens); told to fail on a loss, the error as text. Any other error is
-- returned as it is, and so is a re-plan's failure.
function Cluster:recover(err)
  local d = errors.is(err, "device_lost") and err.lost
  if not d then return err end
  local here = false
  for _, x in ipairs(self.devices) do here = here or x == d end
  if not here then return err.message end -- (lost and planned without already)
  d.failed = true
  if (self.plan_opts and self.plan_opts.on_device_loss or "replan") ~= "replan" then return err.message end
  local ok, rerr = pcall(self.replan_after_loss, self, err.message)
  if not ok then return rerr end
  return errors.new("replanned", err.message)
end

-- /metrics: the block bytes shipped to each device's cache (loip.cluster.ship; the engine
-- interface's metrics hook, loip.engine).
function Cluster:metrics(m) ship.metrics(m, self) end

-- Wait for the result of step, watching every device. Returns the message.
function Cluster:await(step, timeout_ms)
  local deadline = core.now_ms() + (timeout_ms or 600000)
  local next_beat = core.now_ms()
  -- silence counts only while the head listens: a caller busy elsewhere (a STATS exchange with
  -- one device during a request, say) sends no heartbeats meanwhile, and the others' answers to
  -- the next ones are on their way
  local listening = core.now_ms()
  for _, d in ipairs(self.devices) do d.last_seen = d.last_seen or listening end
  while true do
    local now = core.now_ms()
    if now >= next_beat then
      for i, d in ipairs(self.devices) do
        if d.pid and not alive(d.pid) then
          d.failed = true
          error(string.format("device %d (%s, pid %d) died during the request:\n%s", i, d.endpoint, d.pid, tail(d.log, 3)), 0)
        end
        ;(d.hb or d.ctl):send({ kind = "PING" }, 0)
      end
      next_beat = now + beat_ms(self)
    end
    for i, d in ipairs(self.devices) do
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
          if busy > self.stage_limit_ms then
            d.failed = true
            error(string.format("device %d (%s) has been computing one message for %.0f s (limit %.0f s): it hangs",
              i, d.endpoint, busy / 1000, self.stage_limit_ms / 1000), 0)
          end
        end
        b = d.hb:recv(0)
      end
      local silent = core.now_ms() - math.max(d.last_seen, listening)
      if silent > self.dead_ms then
        d.failed = true
        error(string.format("device %d (%s) has not answered for %.1f s: it hangs or is unreachable",
          i, d.endpoint, silent / 1000), 0)
      end
    end
    local r = self.results:recv(50, self.result_bytes)
    if r then
      local i = tonumber(r.from:match("^d(%d+)$"))
      if i and self.devices[i] then self.devices[i].last_seen = core.now_ms() end
      -- an error about this step stops it; one about an older step (a late message of a step
      -- that was stopped) or about a message nobody can attribute (malformed) does not
      if r.kind == "ERROR" then
        if r.step == step then error(errors.from_code(r.status, string.format("device %s: %s", i or r.from, r.payload)), 0) end
        self.warnings = self.warnings or {}
        table.insert(self.warnings, string.format("device %s: %s", i or r.from, r.payload))
      end
      if r.kind == "STOP" then self:note_leave(r) end -- (a worker leaving: loip.cluster.membership)
      if r.kind == "RESULT" and r.step == step and r.plan_id == self.plan_id then return r end
    end
    if core.now_ms() > deadline then error("no result within " .. (timeout_ms or 600000) / 1000 .. " s", 0) end
  end
end

-- The devices found dead now: a local worker whose process is gone, or one silent (silent(i, d):
-- for how many ms) longer than dead_ms; d.failed set. Returns why, in words (nil: none).
local function dead_devices(c, silent, what)
  -- (told to fail on a loss, the cluster does not plan without a device between requests either:
  -- Cluster:revive restarts a local one)
  if c.plan_opts and c.plan_opts.on_device_loss == "fail" then return nil end
  local why
  for i, d in ipairs(c.devices) do
    local ms = d.hb and silent(i, d) or 0
    if d.failed then -- (lost already, its loss raised: every device was lost, nothing to plan on)
    elseif d.pid and not alive(d.pid) then
      d.failed = true
      why = why or string.format("device %d (%s, pid %d) died %s:\n%s", i, d.endpoint, d.pid, what, tail(d.log, 3))
    elseif ms > c.dead_ms then
      d.failed = true
      why = why or string.format("device %d (%s) has not answered for %.1f s %s: it hangs or is unreachable",
        i, d.endpoint, ms / 1000, what)
    end
  end
  return why
end

-- Between steps, every turn of a server's loop: every device pinged (every beat_ms) and its
-- answers read; while nothing runs (idle), one silent for dead_ms, or a local worker whose
-- process is gone, is a loss (replan_after_loss: the others planned again before the next
-- request). Silence counts only while the head watches: a head busy elsewhere (a long step, a
-- plan) starts counting again. Returns the loss's membership events, or nil; a re-plan that
-- failed is raised.
function Cluster:watch(idle)
  local now = core.now_ms()
  local beat = beat_ms(self)
  if not self.watch_at or now - self.watch_at > 4 * beat then self.watch_since = now end
  self.watch_at = now
  if self.next_watch_beat and now < self.next_watch_beat then
    for _, d in ipairs(self.devices) do read_pongs(d) end
    return nil
  end
  self.next_watch_beat = now + beat
  for _, d in ipairs(self.devices) do
    read_pongs(d)
    if d.hb then d.hb:send({ kind = "PING" }, 0) end
  end
  if not idle then return nil end
  local since = self.watch_since
  local why = dead_devices(self, function(_, d) return core.now_ms() - math.max(d.last_seen or 0, since) end, "while idle")
  if not why then return nil end
  self.watch_at = nil -- (the re-plan is time the head did not watch)
  return self:replan_after_loss(why)
end

-- Before a request starts on an idle cluster: every device answers a PING now, or within
-- dead_ms is a loss (as in watch). Costs one round trip when every device lives. Returns the
-- loss's membership events, or nil; a re-plan that failed is raised.
function Cluster:check_alive()
  local t0 = core.now_ms()
  -- (answers to this PING only: one sent before may have been answered by a device dead since)
  self.ping_no = (self.ping_no or 0) + 1
  local waiting = {}
  for i, d in ipairs(self.devices) do
    if d.hb then
      d.hb:send({ kind = "PING", step = self.ping_no }, 0) -- (one that cannot take it now is silent as the dead are)
      waiting[i] = d
    end
  end
  while next(waiting) and core.now_ms() - t0 <= self.dead_ms do
    for i, d in pairs(waiting) do
      read_pongs(d)
      if d.pong_step == self.ping_no or (d.pid and not alive(d.pid)) then waiting[i] = nil end
    end
    if next(waiting) then core.sleep_ms(1) end
  end
  -- dead: a local worker whose process is gone, or one that did not answer this PING
  local why = dead_devices(self, function(i) return waiting[i] and core.now_ms() - t0 or 0 end, "while idle")
  if not why then return nil end
  self.watch_at = nil
  return self:replan_after_loss(why)
end

-- The devices' recorded events (plan with trace = true) since the last call, added to tr (a
-- loip.trace) with one process per device, on the head's clock.
function Cluster:collect_trace(tr)
  for i, d in ipairs(self.devices) do
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
function Cluster:stats()
  local out = {}
  for i = 1, #self.devices do out[i] = json.decode(self:ask(i, { kind = "STATS" }, 5000).payload) or {} end
  return out
end


return Cluster
