-- A cluster's member registry: its devices and how the set changes. Local workers spawned
-- (and killed), every device connected (HELLO: the same slice store, its heartbeat and bulk
-- sockets); a device lost (dead mid-request, or found dead while idle by watch and check_alive)
-- leaves and the others plan again; lost devices are taken back between requests, local workers
-- that died are restarted; workers join (`loip worker --join HEAD:PORT`: a HELLO with its
-- endpoint on the join socket, bound by `loip serve --join-listen`, or found by serve
-- --discover), devices are drained (`loip cluster drain I`) or leave (a worker's SIGTERM: a STOP
-- { leave } on the results socket). Each change is made between steps: the head plans again over
-- the new set with the same scheduler and options, and the caller resumes every running request
-- from its tokens (loip.engine.request.batcher's resume_all), as after a loss: no token changes.
-- Joins, leaves and losses are one list of membership events (docs/serving.md, "Membership").
--
--   local reg = registry.new(c, devices)  -- c: loip.cluster's Cluster; devices: { mem, threads | endpoint }
--   reg:spawn(i), reg:connect_all(only), reg:check_store(i, d, hello), reg:close()
--   reg:watch(idle), reg:check_alive()         a device dead while idle is a loss (-> events)
--   reg:recover(err) -> err | { replanned }    a control exchange that found a device lost
--   reg:replan_after_loss(why) -> events       the devices marked failed leave; the others plan
--   reg:take_back() -> n, reg:revive()         lost devices back, dead local workers restarted
--   reg:listen_joins(endpoint), reg:between_steps(requests) -> events, reg:note_leave(r),
--   reg:admit(endpoint, requests), reg:release_device(i, by, requests), reg:discovered_worker(w)
-- Its state, read by the other parts and by callers through the Cluster: devices (by ring
-- order: endpoint, pid, log, ctl, hb, bulk, mem, threads, hello, failed, ...), losses (step,
-- devices, why, log, devices_left, replan_ms, replanned, error), membership (events: step,
-- device, endpoint, kind, replan_ms, requests, by, time), taken_back, degraded (why nothing can
-- be served, after a loss the others could not take over), joins (the join socket). It plans
-- through c.planner, talks through c.rpc and names the ring engine's step (c.ring.step_no).
local core = require "loip.core"
local errors = require "loip.error"
local json = require "loip.text.json"
local proc = require "loip.cluster.proc"
local process = require "loip.runtime.process"
local ship = require "loip.cluster.ship"
local rpc = require "loip.cluster.rpc"

local alive, tail = proc.alive, proc.tail
local function log(fmt, ...) io.stderr:write(os.date("%H:%M:%S "), string.format(fmt, ...), "\n") io.stderr:flush() end

local M = {}

local Registry = {}
Registry.__index = Registry

function M.new(c, devices) return setmetatable({ c = c, devices = devices }, Registry) end

-- A local worker killed (-9), waited for until it is gone (its socket path free again).
local function kill_worker(pid)
  os.execute("kill -KILL " .. pid .. " 2>/dev/null")
  local deadline = core.now_ms() + 3000
  while alive(pid) and core.now_ms() < deadline do core.sleep_ms(10) end
end

-- Spawn one local worker (device i) and wait for its endpoint. Local workers listen on Unix
-- sockets in the cluster's directory (less per-message overhead than loopback TCP; a
-- restarted worker takes the same path, so its neighbours reconnect by themselves).
function Registry:spawn(i)
  local c = self.c
  local d = self.devices[i]
  local out, log = c.dir .. "/worker-" .. i .. ".out", c.dir .. "/worker-" .. i .. ".log"
  os.remove(out)
  local listen = c.opts.tcp and "tcp://127.0.0.1:*" or ("ipc://" .. c.dir .. "/worker-" .. i .. ".sock")
  if d.endpoint then listen = d.endpoint end
  -- a child that dies with the head (however the head ends), and then removes the head's
  -- directory (its sockets, logs and key) unless the logs are to be kept
  -- (with start_local's cache, no store: its blocks are shipped, loip.cluster.ship)
  local args = { c.exe, "worker", "--listen", listen, "--mem", tostring(d.mem), "--threads", tostring(d.threads) }
  for _, a in ipairs(ship.worker_args(c.opts, c.store, i)) do args[#args + 1] = a end
  if not c.opts.keep_logs then args[#args + 1] = "--head-dir" args[#args + 1] = c.dir end
  d.pid = core.must(process.spawn(args, { "LOIP_CLUSTER_TOKEN=" .. c.token }, out, log, "device " .. i))
  d.log = log
  local deadline = core.now_ms() + 30000
  while core.now_ms() < deadline do
    local f = io.open(out)
    local line = f and f:read("*l")
    if f then f:close() end
    local ep = line and line:match("^listening (%S+)")
    if ep then d.endpoint = ep return ep end
    if not alive(d.pid) then
      error(string.format("device %d: the worker exited at start:\n%s", i, tail(log, 8)), 0)
    end
    core.sleep_ms(20)
  end
  error(string.format("device %d: the worker did not start within 30 s:\n%s", i, tail(log, 8)), 0)
end

-- Connect every device (or only device `only`: one that joins) and check what it holds.
function Registry:connect_all(only)
  local c = self.c
  for i = only or 1, only or #self.devices do
    local d = self.devices[i]
    if d.ctl then d.ctl:close() end
    d.ctl = assert(c.net:connect(d.endpoint, c.identity))
    local t0 = core.now_ns()
    local r = c.rpc:ask(i, { kind = "HELLO" }, 10000)
    local t1 = core.now_ns()
    d.last_seen = core.now_ms() -- (heard: its silence, watched by Registry:watch, counts from now)
    local hello = json.decode(r.payload) or {}
    -- the worker's clock against ours (0 on this host): its stamp taken halfway through the
    -- round trip; events it records are moved by this for one timeline
    d.clock_offset_ns = (d.pid and 0) or (hello.now_ns and hello.now_ns - (t0 + t1) / 2) or 0
    self:check_store(i, d, hello)
    d.hello, d.mem = hello, d.mem or hello.mem or 0
    -- a worker listening on every address (0.0.0.0) reports its other sockets so: reach them
    -- at the address we reached it by
    local host = d.endpoint:match("^tcp://([^:]+):")
    local function reachable(ep)
      if host and ep:match("^tcp://0%.0%.0%.0:") then return (ep:gsub("^tcp://0%.0%.0%.0:", "tcp://" .. host .. ":")) end
      return ep
    end
    if d.hb then d.hb:close() d.hb = nil end
    if hello.heartbeat then d.hb = assert(c.net:connect(reachable(hello.heartbeat), c.identity)) end
    if d.bulk then d.bulk:close() d.bulk = nil end
    if hello.bulk then d.bulk = assert(c.net:connect(reachable(hello.bulk), c.identity)) end
  end
end

-- Whether device i (d, its HELLO) can serve the head's store: the same slice store (its
-- manifest's sha256). Raises naming the device and both stores. (Every device is checked here:
-- those started with the cluster and those that join.)
function Registry:check_store(i, d, hello)
  local c = self.c
  if hello.store_id ~= c.store_id and not hello.cache then -- (a cache: blocks are shipped, loip.cluster.ship)
    error(string.format("device %d (%s) holds a different slice store (%s, manifest sha256 %s...) than the head's %s (%s...): slice the same model on every device",
      i, d.endpoint, tostring(hello.store), tostring(hello.store_id):sub(1, 12), c.store, c.store_id:sub(1, 12)), 0)
  end
end

-- A device was lost mid-request (died, hangs, unreachable: d.failed): it leaves the cluster (a
-- local worker is killed, its sockets closed) and the others get a new plan from the same
-- scheduler and options (more offloading where memory requires; an error naming the shortfall
-- when they cannot hold the model). The requests keep their slots; their KV is gone and the
-- batcher prefills them again. Kept in losses: step, lost devices, why, the re-plan's time.
-- Returns the membership events (one "loss" a device).
function Registry:replan_after_loss(why)
  local planner = self.c.planner
  local t0 = core.now_ms()
  local keep, lost, gone, lost_at = {}, {}, {}, {}
  -- the options and devices as first planned: a lost device is taken back when nothing runs
  self.full_plan_opts = self.full_plan_opts or planner.plan_opts
  if not self.all_devices then
    self.all_devices = {}
    for i, d in ipairs(self.devices) do self.all_devices[i] = d end
  end
  self.lost_devices = self.lost_devices or {}
  for i, d in ipairs(self.devices) do
    if d.failed then
      lost[#lost + 1], gone[i] = i, true
      lost_at[#lost] = d.endpoint
      -- taken back later: a local worker started again, a remote one once it answers again
      table.insert(self.lost_devices, { d = d, before = self.devices[i + 1] })
      if d.pid then kill_worker(d.pid) end
      for _, k in ipairs({ "ctl", "hb", "bulk" }) do if d[k] then d[k]:close() d[k] = nil end end
    else
      keep[#keep + 1] = d
    end
  end
  if #keep == 0 then error("every device of the cluster is lost: " .. tostring(why), 0) end
  local opts = planner.opts_without(planner.plan_opts, gone)
  -- (the batcher starts its running requests again on the new plan)
  self.devices = keep
  planner:new_set()
  -- the loss counts whether or not the others can take over; why in one line (a worker's last
  -- log lines, when it died, are kept apart)
  local text = tostring(why)
  local first, rest = text:match("^([^\n]*):\n(.*)$")
  local loss = { step = self.c.ring.step_no, devices = lost, why = first or text, log = rest, devices_left = #keep }
  self.losses = self.losses or {}
  self.losses[#self.losses + 1] = loss
  local ok, err = pcall(planner.plan, planner, opts)
  loss.replan_ms, loss.replanned = core.now_ms() - t0, ok
  self.degraded = not ok and string.format("the %d devices left cannot take over: %s", #keep, tostring(err)) or nil
  local events = {}
  for k, i in ipairs(lost) do -- (kept and logged)
    events[k] = self:member_event("loss", i, lost_at[k], loss.replan_ms, nil, nil,
      ok and loss.why or (loss.why .. "; the others cannot take over"))
  end
  if not ok then
    loss.error = tostring(err)
    error(string.format("lost device%s %s: %s; the %d left cannot take over: %s", #lost > 1 and "s" or "",
      table.concat(lost, ", "), loss.why, #keep, loss.error), 0)
  end
  return events
end

-- Whether a remote device lost earlier answers again (its worker restarted, its network back):
-- a HELLO answered within timeout_ms on a socket of its own. Asked at most every
-- REACH_EVERY_MS per device (a head that is idle often does not wait on one that is away).
local REACH_EVERY_MS = 2000
local function answers_again(c, l, timeout_ms)
  local now = core.now_ms()
  if l.next_probe and now < l.next_probe then return false end
  l.next_probe = now + REACH_EVERY_MS
  local sock = c.net:connect(l.d.endpoint, c.identity)
  if not sock then return false end
  local ok = sock:send({ kind = "HELLO" }, 200)
  local deadline = now + timeout_ms
  local back = false
  while ok and not back and core.now_ms() < deadline do
    local r = sock:recv(50)
    back = r ~= nil and r.kind == "HELLO"
  end
  sock:close()
  return back
end

-- Devices lost earlier (replan_after_loss) taken back, between requests: a local worker is
-- started again, a remote one once it answers again; then a new plan over every device as
-- first planned (when all are back; else over those back). Returns how many came back.
function Registry:take_back()
  local planner = self.c.planner
  if not self.lost_devices or #self.lost_devices == 0 then return 0 end
  local back, away = {}, {}
  for _, l in ipairs(self.lost_devices) do
    if l.d.pid or answers_again(self.c, l, 500) then back[#back + 1] = l else away[#away + 1] = l end
  end
  if #back == 0 then return 0 end
  self.lost_devices = #away > 0 and away or nil
  for _, l in ipairs(back) do
    -- in its place in the ring: before the device it was before, else at the end
    local at = #self.devices + 1
    for j, d in ipairs(self.devices) do if d == l.before then at = j break end end
    table.insert(self.devices, at, l.d)
  end
  for i, d in ipairs(self.devices) do
    if d.pid and (d.failed or not alive(d.pid)) then self:spawn(i) end
    d.failed = nil
  end
  self:connect_all()
  local o
  if self.lost_devices then
    -- some are still away: the options as first given, less the entries of those away
    local present, gone = {}, {}
    for _, d in ipairs(self.devices) do present[d] = true end
    for i, d in ipairs(self.all_devices) do gone[i] = not present[d] end
    o = planner.opts_without(self.full_plan_opts, gone)
  else
    o = {}
    for k, v in pairs(self.full_plan_opts or planner.plan_opts or {}) do o[k] = v end
    o.keep_requests = true
    self.full_plan_opts, self.all_devices = nil, nil
  end
  planner:plan(o)
  self.degraded = nil
  self.taken_back = (self.taken_back or 0) + #back
  for _, l in ipairs(back) do
    local at = 0
    for j, d in ipairs(self.devices) do if d == l.d then at = j end end
    log("cluster: device %d (%s) taken back: %d devices now", at, l.d.endpoint, #self.devices)
  end
  return #back
end

-- Restart local workers that died (same port: their neighbours reconnect by themselves) and
-- give them the current plan again.
function Registry:revive()
  local planner = self.c.planner
  if not self.c.spawned then return end
  local any = false
  for i, d in ipairs(self.devices) do
    if d.pid and (d.failed or not alive(d.pid)) then -- (one that joined is not ours to start)
      -- a device that hung is replaced too; wait until the old process is gone (its port)
      kill_worker(d.pid)
      self:spawn(i)
      log("cluster: device %d (%s) restarted (pid %d)", i, d.endpoint, d.pid)
      d.failed, any = nil, true
    end
  end
  if any then
    self:connect_all()
    -- the same plan again (the figures did not change; a scheduler would choose the same)
    if planner.plan_table then
      local o = setmetatable({ plan = planner.plan_table, estimate = false, keep_requests = true }, { __index = planner.plan_opts })
      planner:plan(o)
    end
  end
end

-- err, met by a request's call to the cluster (a START, a LOOKUP round, an online policy's STATS
-- or CHANGE, ...): when a control exchange found a device lost, it is a loss as a step's is (the
-- others plan again: replan_after_loss) and a `replanned` error is returned (the batcher resumes
-- every request from its tokens); told to fail on a loss, the error as text. Any other error is
-- returned as it is, and so is a re-plan's failure.
function Registry:recover(err)
  local d = errors.is(err, "device_lost") and err.lost
  if not d then return err end
  local here = false
  for _, x in ipairs(self.devices) do here = here or x == d end
  if not here then return err.message end -- (lost and planned without already)
  d.failed = true
  local po = self.c.planner.plan_opts
  if (po and po.on_device_loss or "replan") ~= "replan" then return err.message end
  local ok, rerr = pcall(self.replan_after_loss, self, err.message)
  if not ok then return rerr end
  return errors.new("replanned", err.message)
end

-- The devices found dead now: a local worker whose process is gone, or one silent (silent(i, d):
-- for how many ms) longer than dead_ms; d.failed set. Returns why, in words (nil: none).
local function dead_devices(reg, silent, what)
  local c = reg.c
  -- (told to fail on a loss, the cluster does not plan without a device between requests either:
  -- Registry:revive restarts a local one)
  local po = c.planner.plan_opts
  if po and po.on_device_loss == "fail" then return nil end
  local why
  for i, d in ipairs(reg.devices) do
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
function Registry:watch(idle)
  local now = core.now_ms()
  local beat = rpc.beat_ms(self.c)
  if not self.watch_at or now - self.watch_at > 4 * beat then self.watch_since = now end
  self.watch_at = now
  if self.next_watch_beat and now < self.next_watch_beat then
    for _, d in ipairs(self.devices) do rpc.read_pongs(d) end
    return nil
  end
  self.next_watch_beat = now + beat
  for _, d in ipairs(self.devices) do
    rpc.read_pongs(d)
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
function Registry:check_alive()
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
  while next(waiting) and core.now_ms() - t0 <= self.c.dead_ms do
    for i, d in pairs(waiting) do
      rpc.read_pongs(d)
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

-- Bind the join socket at endpoint (ADDR:PORT or tcp://ADDR:PORT; port 0 or *: any free one),
-- authenticated as every cluster socket (the token or CURVE keys). Returns the endpoint bound.
function Registry:listen_joins(endpoint)
  local ep = (endpoint:match("://") and endpoint or ("tcp://" .. endpoint)):gsub(":0$", ":*")
  local sock, err = self.c.net:bind(ep)
  if not sock then error(string.format("--join-listen %s: %s", endpoint, tostring(err)), 0) end
  self.joins = sock
  return sock:endpoint()
end

-- Record a membership event: kind "join", "leave" or "loss" of device i (its number in the set
-- before the change; a join's in the set after it) at endpoint; replan_ms: the re-plan's time;
-- requests: the requests running, resumed on the new plan; by: what made a device leave ("drain":
-- loip cluster drain; "worker": its SIGTERM); why: a loss's cause (one line). Logged on the
-- head's terminal as /health lists it. Returns the event.
local said = { join = "joined", loss = "lost" }
function Registry:member_event(kind, i, endpoint, replan_ms, requests, by, why)
  self.membership = self.membership or {}
  local e = { step = self.c.ring.step_no or 0, device = i, endpoint = endpoint, kind = kind, replan_ms = replan_ms,
    requests = requests, by = by, time = os.time() }
  self.membership[#self.membership + 1] = e
  local verb = said[kind] or (by == "drain" and "drained" or "left")
  local n = #self.devices
  log("cluster: device %d (%s) %s%s: %d device%s now, %s in %.0f ms%s", i, tostring(endpoint), verb,
    why and (" (" .. why .. ")") or "", n, n == 1 and "" or "s", self.degraded and "no plan found" or "re-planned",
    replan_ms or 0, requests and requests > 0 and string.format(", %d requests resumed", requests) or "")
  return e
end

-- A leave announced by a worker (a STOP { leave, plan_id, device } from "dN" on the results
-- socket; read during a step by loip.cluster.rpc's await, else by between_steps): carried out
-- between steps.
function Registry:note_leave(r)
  local b = json.decode(r.payload or "") or {}
  local d = b.leave and b.plan_id == self.c.planner.plan_id and self.devices[b.device]
  if d then d.leaving = true end
end

-- Plan again over the devices now in self.devices (opts: Planner:plan's); on failure, the
-- change is undone by undo() and the old set planned again (its options old_opts), and the
-- failure raised.
local function replan(self, opts, undo, old_opts)
  local planner = self.c.planner
  planner:new_set()
  local ok, err = pcall(planner.plan, planner, opts)
  if ok then self.degraded = nil return end -- (a loss the others could not take over: healed by a join)
  undo()
  local o2 = {}
  for k, v in pairs(old_opts) do o2[k] = v end
  o2.keep_requests = true
  local ok2, err2 = pcall(planner.plan, planner, o2)
  if not ok2 then self.degraded = "the devices could not take their old plan back: " .. tostring(err2) end
  error(err, 0)
end

-- Device i leaves between steps (by "drain" or "worker"): the others are planned again without
-- it, then it is told to stop (a local worker is waited for). Raises, and keeps it, when it is
-- the only device or the others cannot hold the model. Returns the event (a "loss" when it was
-- found dead).
function Registry:release_device(i, by, requests)
  local d = self.devices[i]
  if not d then error(string.format("device %s is not one of the cluster's %d", tostring(i), #self.devices), 0) end
  -- a dead device cannot be let go: it is a loss (found within dead_ms; so is any other dead one,
  -- before the set is planned again), and its loss event is the answer
  for _, e in ipairs(self:check_alive() or {}) do
    if d.failed and e.endpoint == d.endpoint then return e end
  end
  for j, x in ipairs(self.devices) do if x == d then i = j end end
  if #self.devices == 1 then error(string.format("device %d is the cluster's only device: nothing could take over", i), 0) end
  local planner = self.c.planner
  local t0, old = core.now_ms(), planner.plan_opts
  table.remove(self.devices, i)
  replan(self, planner.opts_without(old, { [i] = true }), function() table.insert(self.devices, i, d) end, old)
  pcall(function() d.ctl:send({ kind = "STOP" }, 500) end)
  for _, k in ipairs({ "ctl", "hb", "bulk" }) do if d[k] then d[k]:close() d[k] = nil end end
  if d.pid then
    local deadline = core.now_ms() + 5000
    while proc.alive(d.pid) and core.now_ms() < deadline do core.sleep_ms(20) end
    if proc.alive(d.pid) then os.execute("kill -KILL " .. d.pid .. " 2>/dev/null") end
    process.reap(d.pid)
  end
  return self:member_event("leave", i, d.endpoint, core.now_ms() - t0, requests, by)
end

-- Admit the worker at endpoint between steps: connected as every device is (HELLO; its slice
-- store checked by Registry:check_store), then the cluster planned again over the larger set.
-- Raises the refusal's reason (the set and its plan as they were). Returns the event.
function Registry:admit(endpoint, requests)
  local planner = self.c.planner
  local t0, old = core.now_ms(), planner.plan_opts
  local opts = planner.opts_with_newcomer(old)
  local i = #self.devices + 1
  local d = { endpoint = endpoint, joined = true }
  self.devices[i] = d
  local function undo()
    for _, k in ipairs({ "ctl", "hb", "bulk" }) do if d[k] then d[k]:close() d[k] = nil end end
    table.remove(self.devices, i)
  end
  local ok, err = pcall(self.connect_all, self, i)
  if not ok then undo() error(err, 0) end
  -- a lost device at this endpoint is not to be taken back: this worker replaces it
  for k = #(self.lost_devices or {}), 1, -1 do
    if self.lost_devices[k].d.endpoint == endpoint then table.remove(self.lost_devices, k) end
  end
  if self.all_devices then self.all_devices[#self.all_devices + 1] = d end
  replan(self, opts, undo, old)
  return self:member_event("join", i, endpoint, core.now_ms() - t0, requests)
end

-- A join request on the join socket (a HELLO, JSON { endpoint }): admitted, answered READY
-- { device } or ERROR with the reason (logged).
local function join_from(self, m, requests)
  local b = m.kind == "HELLO" and json.decode(m.payload or "") or nil
  local ep = type(b) == "table" and b.endpoint
  local ok, e = false, "a join names its endpoint: a HELLO with JSON { endpoint }"
  if type(ep) == "string" and ep:match("^%a+://") then ok, e = pcall(self.admit, self, ep, requests) end
  if not ok then log("cluster: refused the join of %s (%s): %s", tostring(ep), m.from, tostring(e)) end
  self.joins:send({ to = m.from, kind = ok and "READY" or "ERROR", status = ok and 0 or core.constants.EINVAL,
    payload = ok and json.encode({ device = e.device, devices = #self.devices }) or tostring(e) }, 1000)
  return ok and e or nil
end

-- Between steps (no step in flight): peers refused by the transport logged (a wrong token or
-- key), every device watched (Registry:watch: one dead while idle is a loss), leaves carried
-- out, joins admitted. requests: how many run now (kept in the events).
-- Returns the events of the changes made; after any, the caller resumes every running request
-- from its tokens.
local function add_loss(events, ok, lost)
  if not ok then log("cluster: %s", tostring(lost)) return end
  for _, e in ipairs(lost or {}) do events[#events + 1] = e end
end

function Registry:between_steps(requests)
  local events = {}
  for _, line in ipairs(self.c.net:auth_log()) do log("cluster: %s", line) end
  -- every device watched, idle too: one dead while nothing runs is a loss, planned around at once
  add_loss(events, pcall(self.watch, self, requests == 0))
  self.c.rpc:read_late()
  for i = #self.devices, 1, -1 do
    if self.devices[i].leaving then
      local ok, e = pcall(self.release_device, self, i, "worker", requests)
      if ok then events[#events + 1] = e else log("cluster: device %d cannot leave: %s", i, tostring(e)) end
      if self.devices[i] and not ok then self.devices[i].leaving = nil end
    end
  end
  local m = self.joins and self.joins:recv(0)
  -- before a join: every device answers now, or is a loss (a join is admitted whatever the
  -- state of the others)
  if m or (self.discovered and #self.discovered > 0) then add_loss(events, pcall(self.check_alive, self)) end
  while m do
    events[#events + 1] = join_from(self, m, requests)
    m = self.joins:recv(0)
  end
  -- workers discovered on the LAN (serve --discover): admitted as a join is, once each
  local found = self.discovered or {}
  self.discovered = {}
  for _, ep in ipairs(found) do
    local ok, e = pcall(self.admit, self, ep, requests)
    if ok then events[#events + 1] = e else log("cluster: refused the discovered worker at %s: %s", ep, tostring(e)) end
  end
  return events
end

-- A worker heard announcing itself (loip.cluster.discovery's candidate, its proof of the token
-- verified) is admitted between steps, unless it is a device already; the transport's handshake
-- authenticates it again when the head connects.
function Registry:discovered_worker(c)
  local ep = "tcp://" .. c.endpoint
  for _, d in ipairs(self.devices) do if d.endpoint == ep then return false end end
  self.discovered = self.discovered or {}
  self.discovered[#self.discovered + 1] = ep
  return true
end

-- The workers let go when the head closes: local ones told to STOP and waited for (killed when
-- they do not end), running ones (and local ones that joined) told to STOP { release }: they
-- stay up, free for the next head.
function Registry:close()
  local spawned = self.c.spawned
  for _, d in ipairs(self.devices or {}) do
    if d.ctl then
      if spawned and alive(d.pid) then pcall(function() d.ctl:send({ kind = "STOP" }, 500) end)
      elseif not spawned or not d.pid then
        pcall(function() d.ctl:send({ kind = "STOP", payload = json.encode({ release = true }) }, 500) end)
      end
    end
  end
  if spawned then
    for _, d in ipairs(self.devices) do
      if d.pid then
        local deadline = core.now_ms() + 3000
        while alive(d.pid) and core.now_ms() < deadline do core.sleep_ms(20) end
        if alive(d.pid) then os.execute("kill -TERM " .. d.pid .. " 2>/dev/null") end
        deadline = core.now_ms() + 2000
        while alive(d.pid) and core.now_ms() < deadline do core.sleep_ms(20) end
        if alive(d.pid) then os.execute("kill -KILL " .. d.pid .. " 2>/dev/null") end
        process.reap(d.pid)
      end
    end
  end
end

return M
