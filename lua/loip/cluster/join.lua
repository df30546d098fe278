-- A worker's side of a serving cluster's membership (docs/serving.md, "Membership"): joining a
-- running head (`loip worker --join HEAD:PORT`: a HELLO with our endpoint on the head's join
-- socket, authenticated as every cluster socket; the head answers READY { device } once it
-- admitted us between steps, or ERROR with why) and leaving it on SIGTERM (a STOP { leave } to
-- the head on the results link: the device serves on until the head planned again without it
-- and told it to stop). Worker:run calls M.keep_running every turn of its loop.
local core = require "loip.core"
local json = require "loip.text.json"
local process = require "loip.runtime.process"
local proc = require "loip.cluster.proc"
local transport = require "loip.runtime.transport"

local M = {}

-- How long a silent heartbeat means a device (or, to a worker, its head) is lost, unless a plan
-- says otherwise (loip.cluster's dead_ms).
M.DEAD_MS = 1500

local SIGTERM = 15
local LEAVE_WAIT_MS = 30000  -- a head that does not let us go within this: we stop anyway
local JOIN_WAIT_MS = 120000  -- a head that neither admits nor refuses us within this: we give up

local function log(fmt, ...) io.stderr:write(os.date("%H:%M:%S "), string.format(fmt, ...), "\n") io.stderr:flush() end

-- Ask the head at `head` (HOST:PORT or tcp://HOST:PORT, its --join-listen) to admit worker w.
-- The answer is read by M.keep_running while w serves (the head says HELLO and sends a PLAN
-- before it answers).
function M.announce(w, head)
  local ep = head:match("://") and head or ("tcp://" .. head)
  local h = io.open("/proc/sys/kernel/hostname")
  local id = string.format("join-%s-%d", h and h:read("*l") or "?", process.pid())
  if h then h:close() end
  local sock, err = w.net:connect(ep, id:sub(1, 63))
  if not sock then error("--join " .. head .. ": " .. tostring(err), 0) end
  local ok, serr = sock:send({ kind = "HELLO", payload = json.encode({ endpoint = w:endpoint(), store_id = w.store_id }) }, 5000)
  if not ok then sock:close() error("--join " .. head .. ": " .. tostring(serr), 0) end
  w.join = { sock = sock, head = ep, deadline = core.now_ms() + JOIN_WAIT_MS }
  log("asked the head at %s to admit us", ep)
end

-- The join's answer, when one came: admitted (logged), refused (logged; w.failed: the worker
-- stops and exits 1), or our key refused by the head (a wrong token or keys).
local function join_answer(w)
  local j = w.join
  local r = j.sock:recv(0)
  local why
  if r and r.kind == "READY" then
    local b = json.decode(r.payload) or {}
    log("joined the head at %s: device %s of %s", j.head, tostring(b.device), tostring(b.devices))
  elseif r and r.kind == "ERROR" then why = "the head at " .. j.head .. " refused us: " .. tostring(r.payload)
  elseif j.sock:refused() > 0 then
    why = "the head at " .. j.head .. " refused our key: wrong cluster token? (give the head's --token, LOIP_CLUSTER_TOKEN or --curve-keys)"
  elseif core.now_ms() > j.deadline and not w.owner then
    why = string.format("the head at %s did not answer our join within %d s", j.head, JOIN_WAIT_MS / 1000)
  else return true end
  j.sock:close()
  w.join = nil
  if why then log("%s", why) w.failed = why return false end
  return true
end

-- Whether the worker's loop goes on: no signal; or a SIGTERM while it serves a head's plan: it
-- tells the head it leaves (again after each new plan), serving until told to stop or until
-- LEAVE_WAIT_MS passed; at once when its head is gone (on this host, its process ended; anywhere,
-- it has not pinged our heartbeat for the head's dead_ms, sent with the plan: a head pings its
-- devices every turn, idle or not, and plans without one silent that long).
function M.keep_running(w)
  if w.join and not join_answer(w) then return false end
  local sig = process.signal_received()
  if sig == 0 then return true end
  local d = w.dev
  if sig ~= SIGTERM or not (d and d.head and d.plan_id) or not w.owner then return false end
  -- a head on this host that is gone (a local head's workers get SIGTERM when it dies): no one
  -- to tell, stop at once
  local host, pid = w.owner.id:match("^head%-(.+)%-(%d+)$")
  if host and host == w.hostname and not proc.alive(tonumber(pid)) then return false end
  local now = core.now_ms()
  -- (asked at the signal and on every turn after it: a head that dies while we wait for it to
  -- plan without us will not plan again)
  local last = w.hb and transport.heartbeat_last_ping(w.hb)
  local patience = d.head_dead_ms or M.DEAD_MS -- (a plan that did not say)
  if not last or now - last > patience then
    log("SIGTERM: the head %s has not pinged us for %s: it is gone; leaving at once", w.owner.id,
      last and string.format("%.1f s", (now - last) / 1000) or "ever")
    return false
  end
  if not w.leaving then
    w.leaving = { deadline = now + LEAVE_WAIT_MS }
    log("SIGTERM: leaving the cluster once the head planned without us (at most %d s)", LEAVE_WAIT_MS / 1000)
  end
  if w.leaving.plan_id ~= d.plan_id then
    w.leaving.plan_id = d.plan_id
    d.head:send({ kind = "STOP", payload = json.encode({ leave = true, plan_id = d.plan_id, device = d.part.index }) }, 1000)
  end
  return now < w.leaving.deadline
end

return M
