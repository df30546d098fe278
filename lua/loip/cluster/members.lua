-- A cluster's members: local workers spawned (and killed), every device connected (HELLO: the
-- same slice store, its heartbeat and bulk sockets), and the set changing while it serves: a
-- device lost mid-request leaves and the others plan again, lost devices are taken back between
-- requests, local workers that died are restarted. Methods of loip.cluster's Cluster.
local core = require "loip.core"
local json = require "loip.text.json"
local proc = require "loip.cluster.proc"
local process = require "loip.runtime.process"
local ship = require "loip.cluster.ship"
local profile = require "loip.plan.profile"

local alive, tail = proc.alive, proc.tail
local function log(fmt, ...) io.stderr:write(os.date("%H:%M:%S "), string.format(fmt, ...), "\n") io.stderr:flush() end

local Cluster = {}

-- A local worker killed (-9), waited for until it is gone (its socket path free again).
local function kill_worker(pid)
  os.execute("kill -KILL " .. pid .. " 2>/dev/null")
  local deadline = core.now_ms() + 3000
  while alive(pid) and core.now_ms() < deadline do core.sleep_ms(10) end
end

-- Spawn one local worker (device i) and wait for its endpoint. Local workers listen on Unix
-- sockets in the cluster's directory (less per-message overhead than loopback TCP; a
-- restarted worker takes the same path, so its neighbours reconnect by themselves).
function Cluster:spawn(i)
  local c = self
  local d = c.devices[i]
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
function Cluster:connect_all(only)
  for i = only or 1, only or #self.devices do
    local d = self.devices[i]
    if d.ctl then d.ctl:close() end
    d.ctl = assert(self.net:connect(d.endpoint, self.identity))
    local t0 = core.now_ns()
    local r = self:ask(i, { kind = "HELLO" }, 10000)
    local t1 = core.now_ns()
    d.last_seen = core.now_ms() -- (heard: its silence, watched by Cluster:watch, counts from now)
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
    if hello.heartbeat then d.hb = assert(self.net:connect(reachable(hello.heartbeat), self.identity)) end
    if d.bulk then d.bulk:close() d.bulk = nil end
    if hello.bulk then d.bulk = assert(self.net:connect(reachable(hello.bulk), self.identity)) end
  end
end

-- Whether device i (d, its HELLO) can serve the head's store: the same slice store (its
-- manifest's sha256). Raises naming the device and both stores. (Every device is checked here:
-- those started with the cluster and those that join.)
function Cluster:check_store(i, d, hello)
  if hello.store_id ~= self.store_id and not hello.cache then -- (a cache: blocks are shipped, loip.cluster.ship)
    error(string.format("device %d (%s) holds a different slice store (%s, manifest sha256 %s...) than the head's %s (%s...): slice the same model on every device",
      i, d.endpoint, tostring(hello.store), tostring(hello.store_id):sub(1, 12), self.store, self.store_id:sub(1, 12)), 0)
  end
end

-- Plan options for the cluster without the devices gone[i]: the options given per device lose
-- those entries; a plan given for the old set no longer applies; running requests are kept.
local function without_devices(plan_opts, gone)
  local function drop(t)
    if type(t) ~= "table" then return t end
    local o = {}
    for i, v in ipairs(t) do if not gone[i] then o[#o + 1] = v end end
    return o
  end
  local opts = {}
  for k, v in pairs(plan_opts or {}) do opts[k] = v end
  opts.slowdown, opts.disk_rate, opts.plan, opts.keep_requests = drop(opts.slowdown), drop(opts.disk_rate), nil, true
  if type(opts.link) == "table" then
    opts.link = { rate = drop(opts.link.rate), delay_ms = drop(opts.link.delay_ms), spin_us = opts.link.spin_us }
  end
  if opts.profile then
    local pr = type(opts.profile) == "string" and profile.load(opts.profile) or opts.profile
    if pr.devices then
      local q = {}
      for k, v in pairs(pr) do q[k] = v end
      q.devices = drop(pr.devices)
      pr = q
    end
    opts.profile = pr
  end
  return opts
end
Cluster.plan_opts_without = without_devices -- (loip.cluster.membership: a device drained or leaving)

-- A device was lost mid-request (died, hangs, unreachable: d.failed): it leaves the cluster (a
-- local worker is killed, its sockets closed) and the others get a new plan from the same
-- scheduler and options (more offloading where memory requires; an error naming the shortfall
-- when they cannot hold the model). The requests keep their slots; their KV is gone and the
-- batcher prefills them again. Kept in c.losses: step, lost devices, why, the re-plan's time.
-- Returns the membership events (one "loss" a device).
function Cluster:replan_after_loss(why)
  local t0 = core.now_ms()
  local keep, lost, gone, lost_at = {}, {}, {}, {}
  -- the options and devices as first planned: a lost device is taken back when nothing runs
  self.full_plan_opts = self.full_plan_opts or self.plan_opts
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
  local opts = without_devices(self.plan_opts, gone)
  -- (the batcher starts its running requests again on the new plan)
  self.devices, self.lending, self.link_now, self.active = keep, nil, nil, 0
  -- the loss counts whether or not the others can take over; why in one line (a worker's last
  -- log lines, when it died, are kept apart)
  local text = tostring(why)
  local first, rest = text:match("^([^\n]*):\n(.*)$")
  local loss = { step = self.step_no, devices = lost, why = first or text, log = rest, devices_left = #keep }
  self.losses = self.losses or {}
  self.losses[#self.losses + 1] = loss
  local ok, err = pcall(self.plan, self, opts)
  loss.replan_ms, loss.replanned = core.now_ms() - t0, ok
  self.degraded = not ok and string.format("the %d devices left cannot take over: %s", #keep, tostring(err)) or nil
  local events = {}
  for k, i in ipairs(lost) do -- (loip.cluster.membership: kept and logged)
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
function Cluster:take_back()
  if not self.lost_devices or #self.lost_devices == 0 then return 0 end
  local back, away = {}, {}
  for _, l in ipairs(self.lost_devices) do
    if l.d.pid or answers_again(self, l, 500) then back[#back + 1] = l else away[#away + 1] = l end
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
    o = without_devices(self.full_plan_opts, gone)
  else
    o = {}
    for k, v in pairs(self.full_plan_opts or self.plan_opts or {}) do o[k] = v end
    o.keep_requests = true
    self.full_plan_opts, self.all_devices = nil, nil
  end
  self:plan(o)
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
function Cluster:revive()
  if not self.spawned then return end
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
    if self.plan_table then
      local o = setmetatable({ plan = self.plan_table, estimate = false, keep_requests = true }, { __index = self.plan_opts })
      self:plan(o)
    end
  end
end


return Cluster
