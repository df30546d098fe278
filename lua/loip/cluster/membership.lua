-- A serving cluster's membership changing between steps (docs/serving.md, "Membership"): workers
-- that join (`loip worker --join HEAD:PORT`: a HELLO with its endpoint on the head's join socket,
-- bound by `loip serve --join-listen`), devices drained (`loip cluster drain I`: the server's
-- POST /v1/cluster/drain) or leaving (a worker's SIGTERM: a STOP { leave } on the results
-- socket), and one list of membership events, joins, leaves and losses alike (c.membership:
-- step, device, endpoint, kind, replan_ms, requests). Each change is made between steps: the
-- head plans again over the new set with the same scheduler and options (Cluster:plan), and the
-- caller resumes every running request from its tokens (loip.engine.request.batcher's resume_all), as
-- after a loss: no token changes. Methods of loip.cluster's Cluster.
local core = require "loip.core"
local json = require "loip.text.json"
local proc = require "loip.cluster.proc"
local process = require "loip.runtime.process"
local profile_mod = require "loip.plan.profile"

local Cluster = {}

local function log(fmt, ...) io.stderr:write(os.date("%H:%M:%S "), string.format(fmt, ...), "\n") io.stderr:flush() end

-- Bind the join socket at endpoint (ADDR:PORT or tcp://ADDR:PORT; port 0 or *: any free one),
-- authenticated as every cluster socket (the token or CURVE keys). Returns the endpoint bound.
function Cluster:listen_joins(endpoint)
  local ep = (endpoint:match("://") and endpoint or ("tcp://" .. endpoint)):gsub(":0$", ":*")
  local sock, err = self.net:bind(ep)
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
function Cluster:member_event(kind, i, endpoint, replan_ms, requests, by, why)
  self.membership = self.membership or {}
  local e = { step = self.step_no or 0, device = i, endpoint = endpoint, kind = kind, replan_ms = replan_ms,
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
-- socket; read during a step by Cluster:await, else by between_steps): carried out between steps.
function Cluster:note_leave(r)
  local b = json.decode(r.payload or "") or {}
  local d = b.leave and b.plan_id == self.plan_id and self.devices[b.device]
  if d then d.leaving = true end
end

-- Plan again over the devices now in self.devices (opts: Cluster:plan's); on failure, the
-- change is undone by undo() and the old set planned again (its options old_opts), and the
-- failure raised.
local function replan(self, opts, undo, old_opts)
  self.lending, self.link_now, self.active = nil, nil, 0
  local ok, err = pcall(self.plan, self, opts)
  if ok then self.degraded = nil return end -- (a loss the others could not take over: healed by a join)
  undo()
  local o2 = {}
  for k, v in pairs(old_opts) do o2[k] = v end
  o2.keep_requests = true
  local ok2, err2 = pcall(self.plan, self, o2)
  if not ok2 then self.degraded = "the devices could not take their old plan back: " .. tostring(err2) end
  error(err, 0)
end

-- Device i leaves between steps (by "drain" or "worker"): the others are planned again without
-- it, then it is told to stop (a local worker is waited for). Raises, and keeps it, when it is
-- the only device or the others cannot hold the model. Returns the event (a "loss" when it was
-- found dead).
function Cluster:release_device(i, by, requests)
  local d = self.devices[i]
  if not d then error(string.format("device %s is not one of the cluster's %d", tostring(i), #self.devices), 0) end
  -- a dead device cannot be let go: it is a loss (found within dead_ms; so is any other dead one,
  -- before the set is planned again), and its loss event is the answer
  for _, e in ipairs(self:check_alive() or {}) do
    if d.failed and e.endpoint == d.endpoint then return e end
  end
  for j, x in ipairs(self.devices) do if x == d then i = j end end
  if #self.devices == 1 then error(string.format("device %d is the cluster's only device: nothing could take over", i), 0) end
  local t0, old = core.now_ms(), self.plan_opts
  table.remove(self.devices, i)
  replan(self, self.plan_opts_without(old, { [i] = true }), function() table.insert(self.devices, i, d) end, old)
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

-- Plan options for the set with one more device (appended): a plan given for the old set no
-- longer applies; per-device values given as lists leave the newcomer at the defaults.
local function with_newcomer(opts)
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  o.plan, o.keep_requests = nil, true
  local pr = o.profile
  if type(pr) == "string" then pr = profile_mod.load(pr) end
  if type(pr) == "table" and pr.devices then
    error("the cluster was planned with --profile of one profile per device: a device that joins has none "
      .. "(give one device's profile, used for all, or none, to admit joins)", 0)
  end
  return o
end

-- Admit the worker at endpoint between steps: connected as every device is (HELLO; its slice
-- store checked by Cluster:check_store), then the cluster planned again over the larger set.
-- Raises the refusal's reason (the set and its plan as they were). Returns the event.
function Cluster:admit(endpoint, requests)
  local t0, old = core.now_ms(), self.plan_opts
  local opts = with_newcomer(old)
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
-- key), every device watched (Cluster:watch: one dead while idle is a loss), leaves carried
-- out, joins admitted. requests: how many run now (kept in the events).
-- Returns the events of the changes made; after any, the caller resumes every running request
-- from its tokens.
local function add_loss(events, ok, lost)
  if not ok then log("cluster: %s", tostring(lost)) return end
  for _, e in ipairs(lost or {}) do events[#events + 1] = e end
end

function Cluster:between_steps(requests)
  local events = {}
  for _, line in ipairs(self.net:auth_log()) do log("cluster: %s", line) end
  -- every device watched, idle too: one dead while nothing runs is a loss, planned around at once
  add_loss(events, pcall(self.watch, self, requests == 0))
  local r = self.results:recv(0, self.result_bytes)
  while r do -- (a late result of a step already stopped is dropped here, as await drops it)
    if r.kind == "STOP" then self:note_leave(r) end
    r = self.results:recv(0, self.result_bytes)
  end
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
function Cluster:discovered_worker(c)
  local ep = "tcp://" .. c.endpoint
  for _, d in ipairs(self.devices) do if d.endpoint == ep then return false end end
  self.discovered = self.discovered or {}
  self.discovered[#self.discovered + 1] = ep
  return true
end

return Cluster
