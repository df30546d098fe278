-- The head: a cluster of devices running one model (docs/design.md, sections 2-3). It forms the cluster
-- (spawning local workers, or connecting to running ones), checks every device holds the same
-- slice store, sends each its part of the plan, then runs requests: token ids into device 1,
-- hidden states around the ring in C on the workers, sampled ids back from device N. A device
-- that dies, hangs or disconnects is noticed within 2 s (heartbeats, process checks, ERROR
-- messages); the request stops with an error naming it and the others stay ready.
--
--   local c = cluster.start_local{ store = dir, devices = 3, mem = { "600M", "400M", "400M" } }
--   c:plan{ scheduler = "loip" }              -- or plan = table / file; stages = S
--   for id in c:generate(ids, { max_tokens = 20, sampler = { temperature = 0 } }) do ... end
--   c:batcher():submit{ prompt = ids, ... }   -- requests served together (loip.engine.request.batcher)
--   c:close()
--
-- A Cluster is composed of parts that each own their state (the interface of each at the top of
-- its file):
--   c.rpc       loip.cluster.rpc       the ring's transport: ask, tell, answer, round, await, stats, traces
--   c.registry  loip.cluster.registry  the member registry: spawn, connect, joins, leaves, losses
--               (and idle-loss detection: watch, check_alive), taking devices back, revival
--   c.planner   loip.cluster.planner   the problem, the plan, restage, lend, replan_kv, links
--   c.ring      loip.engine.ring       the ring engine, holding the cluster: start, step, finish, ...
-- and its own configuration, set at birth and read by every part: opts, token, net, store, man,
-- store_id, identity, dead_ms, stage_limit_ms; a local cluster's dir, exe, spawned, local_devices.
-- Its methods below are thin front-ends over the parts, and the parts' state callers read
-- (c.devices, c.losses, c.plan_table, ...) is read from and written to the part that owns it
-- (FIELDS).
local core = require "loip.core"
local store = require "loip.model.store"
local transport = require "loip.runtime.transport"
local process = require "loip.runtime.process"
local worker = require "loip.cluster.device_server"
local join = require "loip.cluster.join"
local proc = require "loip.cluster.proc"
local rpc = require "loip.cluster.rpc"
local ship = require "loip.cluster.ship"
local registry = require "loip.cluster.registry"
local planner = require "loip.cluster.planner"
local ring = require "loip.engine.ring"
local profile = require "loip.plan.profile"
local flags = require "loip.ui.flags"

local M = {}

local sh_quote, exe = proc.sh_quote, proc.exe
local function random_token()
  local f = io.open("/dev/urandom", "rb")
  local b = f:read(24)
  f:close()
  return (b:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

local Cluster = {}

-- What callers read (and a spec sets) of a cluster's state, by the part that owns it.
local FIELDS = {
  registry = { "devices", "losses", "membership", "taken_back", "degraded", "joins" },
  planner = { "plan_id", "plan_table", "plan_opts", "sizes", "problem_table", "estimate", "facts", "context", "batch",
    "vocab", "dim", "draft_device", "draft_reserve", "draft_rows" },
  rpc = { "results", "result_bytes" },
}
local owner = {}
for part, names in pairs(FIELDS) do for _, k in ipairs(names) do owner[k] = part end end
function Cluster.__index(c, k)
  local f = Cluster[k]
  if f ~= nil then return f end
  local part = owner[k]
  if part then return c[part][k] end
end
function Cluster.__newindex(c, k, v)
  local part = owner[k]
  if part then c[part][k] = v else rawset(c, k, v) end
end

-- opts: store (slice store dir, also read by the head for sizes and the tokenizer), token,
-- head_listen (endpoint for results, default tcp://127.0.0.1:*), stage_limit_ms (a device busy
-- with one message longer than this is taken as hung; default 120 s: a heartbeat thread
-- answers meanwhile, so long prefill stages are not mistaken for a dead device), dead_ms (a
-- device whose heartbeat is silent this long, during a request or while idle, is lost; default
-- DEAD_MS).
M.DEAD_MS = join.DEAD_MS
local function new(opts, devices)
  local dead_ms = opts.dead_ms or M.DEAD_MS
  if type(dead_ms) ~= "number" or not (dead_ms > 0) then
    error("cluster: dead_ms (--dead-after) " .. tostring(dead_ms) .. " is not a time in milliseconds > 0", 0)
  end
  local token = opts.token or (not opts.keys and (os.getenv("LOIP_CLUSTER_TOKEN") or (opts.random_token and random_token())))
  if not token and not opts.keys then
    error("cluster: no cluster token: give token (--token), LOIP_CLUSTER_TOKEN or keys (--curve-keys)", 0)
  end
  local net, err = transport.net { token = token, keys = opts.keys }
  if not net then error(err, 0) end
  local c = setmetatable({ opts = opts, token = token, net = net, store = opts.store,
    stage_limit_ms = opts.stage_limit_ms or 120000, dead_ms = dead_ms }, Cluster)
  -- who we are to the workers: a worker serves one head, and names it to any other
  local host = io.open("/proc/sys/kernel/hostname")
  c.identity = string.format("head-%s-%d", host and host:read("*l") or "?", process.pid())
  if host then host:close() end
  c.identity = c.identity:sub(1, 63)
  c.man = store.read_manifest(opts.store)
  c.store_id = worker.store_id(opts.store)
  c.rpc = rpc.new(c, opts.head_listen or (opts.ipc_dir and ("ipc://" .. opts.ipc_dir .. "/head.sock")) or "tcp://127.0.0.1:*")
  c.registry, c.planner, c.ring = registry.new(c, devices), planner.new(c), ring.new(c)
  return c
end

-- A local cluster: opts.devices workers on this machine; opts.mem a list of budgets (sizes or
-- bytes; one value for all), opts.threads per device (default: the CPUs shared out);
-- opts.cpu_latency_us: hold the machine's CPU wake-up latency there until close (core.wake_latency);
-- opts.cache: workers with a block cache each (DIR/device-I, or a list) and no store, their blocks
-- shipped (loip.cluster.ship), opts.disk_quota its bound (once or per device).
function M.start_local(opts)
  local n = opts.devices or 1
  local devices = {}
  -- the workers share this machine's cores: split among them unless told
  local threads = profile.split_threads(n, opts.threads)
  for i = 1, n do
    local m = type(opts.mem) == "table" and opts.mem[i] or opts.mem or 0
    if type(m) == "string" then m = flags.parse_bytes(m) end
    devices[i] = { mem = m or 0, threads = threads }
  end
  local dir = opts.dir
  if dir then os.execute("mkdir -p " .. sh_quote(dir))
  else
    local p = io.popen("mktemp -d /tmp/loip-head-XXXXXX")
    dir = p:read("*l")
    p:close()
    if not dir then error("cluster: cannot make a private directory under /tmp", 0) end
  end
  local o2 = setmetatable({ ipc_dir = not opts.tcp and dir or nil, random_token = true }, { __index = opts })
  local c = new(o2, devices)
  c.exe = opts.exe or exe()
  c.dir = dir
  c.spawned = true
  c.local_devices = n -- (sharing this machine: its calibration's readers, kept after a loss)
  local ok, err = pcall(function()
    if opts.cpu_latency_us then
      c.wake_before = core.wake_latency_held() -- what this process held before, restored at close
      local held, why = core.wake_latency(opts.cpu_latency_us)
      if not held then error("cluster: cpu_latency_us: " .. why, 0) end
    end
    for i = 1, n do c.registry:spawn(i) end
    c.registry:connect_all()
  end)
  if not ok then c:close() error(err, 0) end
  return c
end

-- The address of this machine that host reaches it by (the source of the route to it).
local function local_address_to(host)
  if host == "127.0.0.1" or host == "localhost" then return "127.0.0.1" end
  local p = io.popen("ip route get " .. host:gsub("[^%w%.:%-]", "") .. " 2>/dev/null")
  local out = p and p:read("*a") or ""
  if p then p:close() end
  return out:match("src (%S+)")
end

-- Workers already running: endpoints { "tcp://h1:p1", ... }; their budgets come from HELLO.
-- The head listens for results on the address the first worker reaches it by (opts.head_listen
-- to choose).
function M.connect(endpoints, opts)
  local devices = {}
  for i, ep in ipairs(endpoints) do devices[i] = { endpoint = ep:match("://") and ep or ("tcp://" .. ep) } end
  if not opts.head_listen then
    local host = devices[1].endpoint:match("^tcp://([^:]+):")
    local addr = host and local_address_to(host)
    if not addr then
      error("cannot tell which address of this machine " .. tostring(host) .. " reaches (no route); give head_listen", 0)
    end
    opts = setmetatable({ head_listen = "tcp://" .. addr .. ":*" }, { __index = opts })
  end
  local c = new(opts, devices)
  local ok, err = pcall(function() c.registry:connect_all() end)
  if not ok then c:close() error(err, 0) end
  return c
end

function Cluster:close()
  self.ring:close()
  self.registry:close()
  if self.net then self.net:close() self.net = nil end
  if self.spawned and self.dir and not self.opts.keep_logs then os.execute("rm -rf " .. sh_quote(self.dir)) end
  if self.wake_before then
    core.wake_latency(self.wake_before >= 0 and self.wake_before or nil)
    self.wake_before = nil
  end
end

-- ---- the front-end: what callers use of a cluster, each the method of one part ----------------

-- The plan (loip.cluster.planner): choose or check one and send it; live changes between steps.
function Cluster:plan(opts) return self.planner:plan(opts) end
function Cluster:restage(i, stage, offloaded) return self.planner:restage(i, stage, offloaded) end
function Cluster:lend(i, holder, groups) return self.planner:lend(i, holder, groups) end
function Cluster:replan_kv(positions) return self.planner:replan_kv(positions) end
function Cluster:set_link(i, rate, delay_ms) return self.planner:set_link(i, rate, delay_ms) end

-- Requests (loip.engine.ring): the request loop, generate, logits, the store's tokenizer, the
-- prefix cache's figures per device.
function Cluster:batcher(opts) return self.ring:batcher(opts) end
function Cluster:generate(prompt, gen) return self.ring:generate(prompt, gen) end
function Cluster:logits(ids) return self.ring:logits(ids) end
function Cluster:tokenizer() return self.ring:tokenizer() end
function Cluster:cache_stats() return self.ring:cache_stats() end
function Cluster:front(gen) return self.ring:front(gen) end

-- The devices' figures (loip.cluster.rpc): STATS per device, recorded events, one exchange.
function Cluster:stats() return self.rpc:stats() end
function Cluster:collect_trace(tr) return self.rpc:collect_trace(tr) end
function Cluster:ask(i, msg, timeout_ms, via) return self.rpc:ask(i, msg, timeout_ms, via) end

-- /metrics: the block bytes shipped to each device's cache (loip.cluster.ship).
function Cluster:metrics(m) ship.metrics(m, self) end

-- Membership (loip.cluster.registry): the join socket, the changes between steps, a drain, a
-- worker found on the LAN.
function Cluster:listen_joins(endpoint) return self.registry:listen_joins(endpoint) end
function Cluster:between_steps(requests) return self.registry:between_steps(requests) end
function Cluster:release_device(i, by, requests) return self.registry:release_device(i, by, requests) end
function Cluster:discovered_worker(w) return self.registry:discovered_worker(w) end

return M
