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
--   c:batcher():submit{ prompt = ids, ... }   -- requests served together (loip.serve.batcher)
--   c:close()
local ffi = require "ffi"
local core = require "loip.core"
local json = require "loip.tools.json"
local plan = require "loip.plan"
local policy = require "loip.policy"
local store = require "loip.model.store"
local transport = require "loip.runtime.transport"
local worker = require "loip.cluster.worker"
local proc = require "loip.cluster.proc"
local C = core.C

local M = {}

local HEARTBEAT_MS, DEAD_MS = 250, 1500 -- a device silent for 1.5 s is lost: noticed within 2 s

local sh_quote, exe, alive, tail = proc.sh_quote, proc.exe, proc.alive, proc.tail
local function random_token()
  local f = io.open("/dev/urandom", "rb")
  local b = f:read(24)
  f:close()
  return (b:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end
local Cluster = {}
Cluster.__index = Cluster
-- requests through the ring: c:start, c:step, c:finish, c:batcher, c:generate, c:logits
require("loip.cluster.requests").install(Cluster)

-- A local worker killed (-9), waited for until it is gone (its socket path free again).
local function kill_worker(pid)
  os.execute("kill -KILL " .. pid .. " 2>/dev/null")
  local deadline = core.now_ms() + 3000
  while alive(pid) and core.now_ms() < deadline do C.loip_sleep_ms(10) end
end

-- Spawn one local worker (device i) and wait for its endpoint. Local workers listen on Unix
-- sockets in the cluster's directory (less per-message overhead than loopback TCP; a
-- restarted worker takes the same path, so its neighbours reconnect by themselves).
local function spawn(c, i)
  local d = c.devices[i]
  local out, log = c.dir .. "/worker-" .. i .. ".out", c.dir .. "/worker-" .. i .. ".log"
  os.remove(out)
  local listen = c.opts.tcp and "tcp://127.0.0.1:*" or ("ipc://" .. c.dir .. "/worker-" .. i .. ".sock")
  if d.endpoint then listen = d.endpoint end
  -- a child that dies with the head (however the head ends), and then removes the head's
  -- directory (its sockets, logs and key) unless the logs are to be kept
  local args = { c.exe, "worker", "--listen", listen, "--store", c.store, "--mem", tostring(d.mem),
    "--threads", tostring(d.threads) }
  if not c.opts.keep_logs then args[#args + 1] = "--head-dir" args[#args + 1] = c.dir end
  local argv = ffi.new("const char *[?]", #args + 1) -- (NULL-ended; the strings anchored by args)
  for k, a in ipairs(args) do argv[k - 1] = a end
  local token_var = "LOIP_CLUSTER_TOKEN=" .. c.token
  local env = ffi.new("const char *[2]")
  env[0] = token_var
  local pid = ffi.new("int32_t[1]")
  core.check(C.loip_spawn(argv, env, out, log, pid), "device " .. i)
  local _ = { args, token_var }
  d.pid = pid[0]
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
    C.loip_sleep_ms(20)
  end
  error(string.format("device %d: the worker did not start within 30 s:\n%s", i, tail(log, 8)), 0)
end

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
  if not ok then error(string.format("device %d (%s): %s", i, d.endpoint, err), 0) end
end

-- Device i's answer to a `kind` message sent before, within timeout_ms (PONGs skipped, ERROR
-- raised, its key refused or its process gone reported at once).
function Cluster:answer(i, kind, timeout_ms, via)
  local d = self.devices[i]
  local sock = via or d.ctl
  local deadline = core.now_ms() + (timeout_ms or 10000)
  while true do
    local left = deadline - core.now_ms()
    if left <= 0 then
      error(string.format("device %d (%s) did not answer %s within %.0f s", i, d.endpoint, kind, (timeout_ms or 10000) / 1000), 0)
    end
    local r = sock:recv(math.min(left, 200), via and 64 * 1024 * 1024 or 1024 * 1024)
    if not r and sock:refused() > 0 then
      error(string.format("device %d (%s) refused our key: wrong cluster token? (give every member the same --token, LOIP_CLUSTER_TOKEN or --curve-keys)",
        i, d.endpoint), 0)
    end
    if r and r.kind ~= "PONG" then
      if r.kind == "ERROR" then error(string.format("device %d (%s): %s", i, d.endpoint, r.payload), 0) end
      return r
    end
    if d.pid and not alive(d.pid) then
      error(string.format("device %d (%s, pid %d) exited:\n%s", i, d.endpoint, d.pid, tail(d.log, 5)), 0)
    end
  end
end

-- opts: store (slice store dir, also read by the head for sizes and the tokenizer), token,
-- head_listen (endpoint for results, default tcp://127.0.0.1:*), stage_limit_ms (a device busy
-- with one message longer than this is taken as hung; default 120 s: a heartbeat thread
-- answers meanwhile, so long prefill stages are not mistaken for a dead device).
local function new(opts, devices)
  local token = opts.token or (not opts.keys and (os.getenv("LOIP_CLUSTER_TOKEN") or (opts.random_token and random_token())))
  if not token and not opts.keys then
    error("cluster: no cluster token: give token (--token), LOIP_CLUSTER_TOKEN or keys (--curve-keys)", 0)
  end
  local net, err = transport.net { token = token, keys = opts.keys }
  if not net then error(err, 0) end
  local c = setmetatable({ opts = opts, token = token, net = net, store = opts.store, devices = devices,
    plan_id = 0, stage_limit_ms = opts.stage_limit_ms or 120000 }, Cluster)
  -- who we are to the workers: a worker serves one head, and names it to any other
  local host = io.open("/proc/sys/kernel/hostname")
  c.identity = string.format("head-%s-%d", host and host:read("*l") or "?", tonumber(io.open("/proc/self/stat"):read("*l"):match("^(%d+)")))
  if host then host:close() end
  c.identity = c.identity:sub(1, 63)
  c.man = store.read_manifest(opts.store)
  c.store_id = worker.store_id(opts.store)
  c.results = assert(net:bind(opts.head_listen or (opts.ipc_dir and ("ipc://" .. opts.ipc_dir .. "/head.sock"))
    or "tcp://127.0.0.1:*"))
  return c
end

function Cluster:connect_all()
  for i, d in ipairs(self.devices) do
    if d.ctl then d.ctl:close() end
    d.ctl = assert(self.net:connect(d.endpoint, self.identity))
    local t0 = tonumber(C.loip_now_ns())
    local r = self:ask(i, { kind = "HELLO" }, 10000)
    local t1 = tonumber(C.loip_now_ns())
    local hello = json.decode(r.payload) or {}
    -- the worker's clock against ours (0 on this host): its stamp taken halfway through the
    -- round trip; events it records are moved by this for one timeline
    d.clock_offset_ns = (d.pid and 0) or (hello.now_ns and hello.now_ns - (t0 + t1) / 2) or 0
    if hello.store_id ~= self.store_id then
      error(string.format("device %d (%s) holds a different slice store (%s, manifest sha256 %s...) than the head's %s (%s...): slice the same model on every device",
        i, d.endpoint, tostring(hello.store), tostring(hello.store_id):sub(1, 12), self.store, self.store_id:sub(1, 12)), 0)
    end
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

-- A local cluster: opts.devices workers on this machine; opts.mem a list of budgets (sizes or
-- bytes; one value for all), opts.threads per device (default: the CPUs shared out);
-- opts.cpu_latency_us: hold the machine's CPU wake-up latency there until close (core.wake_latency).
function M.start_local(opts)
  local n = opts.devices or 1
  local devices = {}
  -- the workers share this machine's cores: split among them unless told
  local threads = require("loip.plan.profile").split_threads(n, opts.threads)
  for i = 1, n do
    local m = type(opts.mem) == "table" and opts.mem[i] or opts.mem or 0
    if type(m) == "string" then m = require("loip.tools.flags").parse_bytes(m) end
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
      c.wake_before = C.loip_cpu_wake_latency_held() -- what this process held before, restored at close
      local held, why = core.wake_latency(opts.cpu_latency_us)
      if not held then error("cluster: cpu_latency_us: " .. why, 0) end
    end
    for i = 1, n do spawn(c, i) end
    c:connect_all()
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
  local ok, err = pcall(function() c:connect_all() end)
  if not ok then c:close() error(err, 0) end
  return c
end

-- A value given once or once per device.
local function each(v, i)
  if type(v) == "table" then return v[i] end
  return v
end

-- The figures of each device: opts.profile (a file or table: one device's, used for all, or a
-- cluster's, one per device), else calibrations: local workers share this machine (measured
-- here, once, kept in the cache); running workers each measure themselves (PROFILE).
function Cluster:profiles(opts)
  local profile = require "loip.plan.profile"
  local pr = opts.profile
  if type(pr) == "string" then pr = profile.load(pr) end
  local N, out = #self.devices, {}
  if pr then
    if pr.devices and #pr.devices ~= N then
      error(string.format("--profile: it profiles %d devices, the cluster has %d", #pr.devices, N), 0)
    end
    for i = 1, N do out[i] = pr.devices and pr.devices[i] or pr end
    return out
  end
  if self.spawned then
    -- local devices share this machine: its disk read by all of them at once (each device's
    -- rate is its share), its cores split among them (each device's threads, start_local), and
    -- compute timed while as many readers stream. (As many as were started: a re-plan after a
    -- loss reuses the calibration rather than measure again while requests wait.)
    local here = profile.calibrate { store = self.store, threads = self.devices[1].threads, context = self.context,
      readers = self.local_devices or N }
    for i = 1, N do out[i] = here end
    return out
  end
  for i, d in ipairs(self.devices) do
    local r = self:ask(i, { kind = "PROFILE", payload = json.encode({ context = self.context }) }, 120000, d.bulk)
    out[i] = json.decode(r.payload) or error(string.format("device %d (%s): an unreadable profile", i, d.endpoint), 0)
  end
  return out
end

-- The planning problem of this cluster (loip.plan.problem) for the options of c:plan.
function Cluster:problem(opts, sizes)
  local problem = require "loip.plan.problem"
  local N = #self.devices
  local budgets, rates, delays = {}, {}, {}
  for i, d in ipairs(self.devices) do budgets[i] = d.mem or 0 end
  local profiles = self:profiles(opts)
  local link = opts.link or {}
  for i = 1, N do
    -- a link's figures: as given (emulated on local devices), else as its device measured it
    local r, measured = each(link.rate, i), profiles[i].link and profiles[i].link.to_next
    rates[i] = r and transport.parse_rate(r) or (measured and measured.rate_bps) or 0
    delays[i] = each(link.delay_ms, i) or 0
  end
  return problem.new { model = sizes, shape = problem.shape_of(self.man.config, store.layer_dtype(self.man)), n = N,
    budgets = budgets, profiles = profiles, disk_rate = opts.disk_rate, slowdown = opts.slowdown,
    link_rate = rates, link_delay_ms = delays, cluster = true, stages = opts.stages, context = self.context,
    batch = self.batch, loader = opts.loader, micro_batch = sizes.max_seqs or 1 }
end

-- A device's memory outside its KV cache (what it reported: used, less its kv account) and its
-- slot, into m (Cluster:online_devices reads them).
local function mem_update(m, rep)
  -- outside the KV cache: neither this device's KV ("kv", with its lending staging buffer) nor
  -- what it holds for others ("kv_lent"), which move every step
  local a = rep.accounts or {}
  if rep.memory then m.nonkv = rep.memory - (a.kv or 0) - (a.kv_lent or 0) end
  m.slot_bytes = rep.slot_bytes or m.slot_bytes
end

-- Choose (or check) the plan and send each device its part; waits until all are READY.
-- opts: plan (table or Lua file), else scheduler and cost (loip.policy names or paths; default
-- "loip"), stages (a fixed stage count), profile (see Cluster:profiles); context, batch (tokens
-- a step carries: prompt chunks and decoding requests), max_batch (requests served at once,
-- each with its own KV cache; default 1), kv_tokens (the KV pool they share, in positions;
-- default context x max_batch), kv_grows (the KV pool charged as contexts take it:
-- loip_session_set_kv_growth), plan_positions (KV positions the plan's memory holds, default
-- kv_tokens; fewer: the pool grows inside the budget and the online policy, opts.online, makes
-- room as it does: loip.serve.online), link_schedule (a "links" policy name or path: the
-- emulated links change between steps),
-- loader, overlap_loads, disk_rate (bytes/s, once or per device), link = { rate, delay_ms }
-- (each once or per link: link i runs from device i to the next, emulated where it arrives),
-- slowdown (once or per device: compute that takes that many times as long, to mimic slower
-- boards), logits_tokens, trace (record events for collect_trace), prefetch (false: stages read
-- when they start, for a given plan). Returns the plan, the cost model's estimate of it and the
-- scheduler's facts ({ scheduler_ms, scheduler, cost }, when one chose it).
function Cluster:plan(opts)
  opts = opts or {}
  self.plan_opts = opts
  local cfg, facts = store.config(self.store, self.man)
  self.facts = facts
  local defaults = require "loip.model"
  local ctx, batch = opts.context or defaults.default_context(cfg.max_seq), opts.batch or defaults.DEFAULT_BATCH
  batch = math.min(batch, ctx)
  self.context, self.batch, self.vocab, self.dim = ctx, batch, cfg.vocab_size, cfg.dim
  local threads = self.devices[1].threads or 1
  local max_seqs = opts.max_batch or 1
  if type(max_seqs) ~= "number" or max_seqs < 1 or max_seqs ~= math.floor(max_seqs) or max_seqs > batch then
    error(string.format("cluster: max_batch %s is not a whole number in 1..%d (the tokens a step carries)", tostring(max_seqs), batch), 0)
  end
  if self._batcher and self._batcher:busy() and not opts.keep_requests then
    error(string.format("cluster: %d requests are running or waiting; a new plan would drop their KV caches",
      self._batcher:active() + self._batcher:queued()), 0)
  end
  if not opts.keep_requests then self._batcher = nil end
  local sizes = plan.sizes(self.man, cfg, { context = ctx, batch = batch, threads = threads, logits_tokens = opts.logits_tokens,
    max_seqs = max_seqs, kv_tokens = opts.kv_tokens,
    plan_positions = require("loip.tools.flags").renamed(opts, "kv_plan_tokens", "plan_positions", "cluster:plan") })
  self.sizes = sizes
  -- the largest RESULT the last device sends: an output per token of a step and the logits
  -- rows asked for (the results socket's buffer is this big, not a fixed ceiling)
  self.result_bytes = batch * ffi.sizeof("loip_step_output") + sizes.logits_tokens * cfg.vocab_size * 4
  local p, where = opts.plan, "plan"
  if type(p) == "string" then p, where = plan.load(p), p end
  local mopts = { cluster = true, loader = opts.loader }
  local est, info
  if p == nil and opts.plan_chosen then
    -- (chosen already, on this problem: Cluster:replan_kv)
    local c = opts.plan_chosen
    self.problem_table, p, est, info = c.problem, c.plan, c.estimate, c.info
  elseif p == nil then
    self.problem_table = self:problem(opts, sizes)
    p, est, info = policy.plan(self.problem_table, { scheduler = opts.scheduler, cost = opts.cost })
  else
    local bad = plan.check(p, sizes.n_blocks, where)
    if bad then error(bad, 0) end
    if #p.devices ~= #self.devices then
      error(string.format("%s: %d devices in the plan, %d in the cluster", where, #p.devices, #self.devices), 0)
    end
    local budgets = {}
    for i, d in ipairs(self.devices) do budgets[i] = d.mem or 0 end
    local over = plan.over_budget(p, sizes, budgets, mopts, where)
    if over then error(over, 0) end
    if opts.estimate ~= false then
      self.problem_table = self:problem(opts, sizes)
      est = policy.load("cost", opts.cost or "loip").estimate(p, self.problem_table)
    end
  end
  self.plan_table = p
  if opts.estimate ~= false then self.estimate = est end
  self.plan_id = self.plan_id + 1
  local N = #self.devices
  local link = opts.link or {}
  for i, d in ipairs(self.devices) do
    local from = (i - 2) % N + 1 -- the link into device i
    local body = { plan_id = self.plan_id, device = i, plan = plan.bare(p),
      next = self.devices[i % N + 1].endpoint, head = self.results:endpoint(), store_id = self.store_id,
      context = ctx, batch = batch, max_seqs = max_seqs, kv_tokens = sizes.kv_tokens, plan_positions = sizes.plan_positions,
      kv_grows = opts.kv_grows or sizes.plan_positions < sizes.kv_tokens, loader = opts.loader, verify_reads = opts.verify_reads,
      disk_rate = each(opts.disk_rate, i),
      -- the read order the device's profile found faster, unless told
      overlap_loads = opts.overlap_loads == nil and self.problem_table and self.problem_table.devices[i].overlap_loads
        or opts.overlap_loads or false,
      link = { rate = each(link.rate, from), delay_ms = each(link.delay_ms, from), spin_us = link.spin_us },
      logits_tokens = opts.logits_tokens or 1, prefetch = opts.prefetch, trace = opts.trace, slowdown = each(opts.slowdown, i) }
    d.ctl:send({ kind = "PLAN", payload = json.encode(body) }, 2000)
  end
  for i, d in ipairs(self.devices) do
    local r
    local deadline = core.now_ms() + 300000
    repeat
      r = d.ctl:recv(200)
      if r and r.kind == "ERROR" then error(string.format("device %d (%s): %s", i, d.endpoint, r.payload), 0) end
      if d.pid and not alive(d.pid) then
        error(string.format("device %d (%s) exited while loading its plan:\n%s", i, d.endpoint, tail(d.log, 5)), 0)
      end
      if core.now_ms() > deadline then error(string.format("device %d (%s) did not load its plan within 300 s", i, d.endpoint), 0) end
    until r and r.kind == "READY"
    d.ready = json.decode(r.payload)
    -- the memory the online policy reasons with: outside the KV cache (none held yet: its
    -- account is the tables alone), and a KV group's bytes
    d.mem_state = { limit = d.ready.limit or d.mem or 0, kv_base = (d.ready.accounts or {}).kv or 0,
      group_bytes = d.ready.kv_group_bytes or 0, slot_bytes = plan.memory(p, i, sizes, mopts).slot_bytes }
    mem_update(d.mem_state, d.ready)
  end
  return p, est, info
end

-- A live plan change between steps (no request's KV is lost, no token changes): stage `stage`
-- of device i now reads its first `offloaded` blocks every step (more: memory freed on that
-- device; fewer: read back into it, charged to its budget). Returns the device's memory.
function Cluster:restage(i, stage, offloaded)
  if not self.plan_table then error("cluster: no plan yet (call c:plan first)", 2) end
  if not self.devices[i] then error(string.format("restage: device %s is not one of %d", tostring(i), #self.devices), 2) end
  self.change = (self.change or 0) + 1
  local r = self:ask(i, { kind = "CHANGE", payload = json.encode({ plan_id = self.plan_id, change = self.change, stage = stage,
    offloaded = offloaded }) }, 60000)
  local p2 = plan.bare(self.plan_table)
  p2.devices[i].stages[stage].offloaded = offloaded
  self.plan_table = p2
  local rep = json.decode(r.payload) or {}
  if self.devices[i].mem_state then mem_update(self.devices[i].mem_state, rep) end
  return rep
end

-- KV lending between steps (the paper's KV transfer protocol): device i ships the oldest
-- `groups` KV groups (16 positions each) of every running request (a number, or a table by
-- sequence slot) to device `holder` after each of its stages runs, and fetches them back before
-- the stage runs again; holder nil (or groups 0): everything comes back and lending stops.
-- Tokens never change. Returns device i's memory.
function Cluster:lend(i, holder, groups)
  if not self.plan_table then error("cluster: no plan yet (call c:plan first)", 2) end
  local N = #self.devices
  if not self.devices[i] then error(string.format("lend: device %s is not one of %d", tostring(i), N), 2) end
  if holder ~= nil and (not self.devices[holder] or holder == i) then
    error(string.format("lend: holder %s is not another of the %d devices", tostring(holder), N), 2)
  end
  local g = groups
  if type(groups) == "table" then
    g = {}
    for q, n in pairs(groups) do g[tostring(q)] = n end
  end
  if holder == nil or (type(g) == "number" and g <= 0) then holder, g = nil, 0 end
  local r = self:ask(i, { kind = "LEND", payload = json.encode({ plan_id = self.plan_id,
    peer = holder and self.devices[holder].endpoint or nil, groups = g }) }, 60000)
  self.lending = self.lending or {}
  self.lending[i] = holder and { holder = holder, groups = groups } or nil
  local rep = json.decode(r.payload) or {}
  if self.devices[i].mem_state then mem_update(self.devices[i].mem_state, rep) end
  return rep
end

-- Plan again for `positions` KV positions, the requests kept (an online policy's last resort,
-- loip.serve.online's control.replan: the KV cache outgrew the plan and neither restaging nor
-- lending makes room): the same scheduler and options; every device loads its new part, the
-- running requests' KV is gone and the batcher prefills them again, as after a device loss, so
-- no token changes. A plan that was given (opts.plan) is not replaced. Raises naming the
-- shortfall when no plan holds that many positions; the cluster keeps its plan then.
function Cluster:replan_kv(positions)
  if not self.plan_table then error("cluster: no plan yet (call c:plan first)", 2) end
  local o = self.plan_opts or {}
  if o.plan then
    error(string.format("the plan given cannot hold %d KV positions, and a given plan is not replaced (leave out --plan, "
      .. "or give one for a longer --plan-positions)", positions), 0)
  end
  local opts = {}
  for k, v in pairs(o) do opts[k] = v end
  opts.plan_positions, opts.keep_requests = positions, true
  -- the scheduler decides first: a failure there leaves every device on its plan
  local chosen = {}
  local ok, err = pcall(function()
    local sizes = plan.sizes(self.man, store.config(self.store, self.man), { context = self.context, batch = self.batch,
      threads = self.devices[1].threads or 1, logits_tokens = o.logits_tokens, max_seqs = self.sizes.max_seqs,
      kv_tokens = o.kv_tokens, plan_positions = positions })
    chosen.problem = self:problem(opts, sizes)
    chosen.plan, chosen.estimate, chosen.info = policy.plan(chosen.problem, { scheduler = opts.scheduler, cost = opts.cost })
  end)
  if not ok then error(string.format("no plan holds %d KV positions: %s", positions, tostring(err)), 0) end
  opts.plan_chosen = chosen
  self.lending, self.active = nil, 0
  self:plan(opts)
  opts.plan_chosen = nil
end

-- Change the emulated link i (from device i to the next; emulated where it arrives) while
-- requests run: rate ("100mbit", bytes/s) and delay_ms (nil: as it was). No reply.
function Cluster:set_link(i, rate, delay_ms)
  local N = #self.devices
  if not self.devices[i] then error(string.format("set_link: link %s is not one of %d", tostring(i), N), 2) end
  if rate ~= nil and not transport.parse_rate(rate) then error("set_link: '" .. tostring(rate) .. "' is not a rate such as 100mbit", 2) end
  self:tell(i % N + 1, { kind = "LINK", payload = json.encode({ rate = rate, delay_ms = delay_ms }) })
  self.link_now = self.link_now or {}
  self.link_now[i] = { rate = rate, delay_ms = delay_ms }
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
    local pr = type(opts.profile) == "string" and require("loip.plan.profile").load(opts.profile) or opts.profile
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

-- A device was lost mid-request (died, hangs, unreachable: d.failed): it leaves the cluster (a
-- local worker is killed, its sockets closed) and the others get a new plan from the same
-- scheduler and options (more offloading where memory requires; an error naming the shortfall
-- when they cannot hold the model). The requests keep their slots; their KV is gone and the
-- batcher prefills them again. Kept in c.losses: step, lost devices, why, the re-plan's time.
function Cluster:replan_after_loss(why)
  local t0 = core.now_ms()
  local keep, lost, gone = {}, {}, {}
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
  if not ok then
    loss.error = tostring(err)
    error(string.format("lost device%s %s: %s; the %d left cannot take over: %s", #lost > 1 and "s" or "",
      table.concat(lost, ", "), loss.why, #keep, loss.error), 0)
  end
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
    if d.pid and (d.failed or not alive(d.pid)) then spawn(self, i) end
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
  return #back
end

-- Restart local workers that died (same port: their neighbours reconnect by themselves) and
-- give them the current plan again.
function Cluster:revive()
  if not self.spawned then return end
  local any = false
  for i, d in ipairs(self.devices) do
    if d.failed or not alive(d.pid) then
      -- a device that hung is replaced too; wait until the old process is gone (its port)
      kill_worker(d.pid)
      spawn(self, i)
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
      next_beat = now + HEARTBEAT_MS
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
      if silent > DEAD_MS then
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
        if r.step == step then error(string.format("device %s: %s", i or r.from, r.payload), 0) end
        self.warnings = self.warnings or {}
        table.insert(self.warnings, string.format("device %s: %s", i or r.from, r.payload))
      end
      if r.kind == "RESULT" and r.step == step and r.plan_id == self.plan_id then return r end
    end
    if core.now_ms() > deadline then error("no result within " .. (timeout_ms or 600000) / 1000 .. " s", 0) end
  end
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

function Cluster:close()
  if self._tokenizer then self._tokenizer:close() end
  self._tokenizer = nil
  for _, d in ipairs(self.devices or {}) do
    if d.ctl then
      if self.spawned and alive(d.pid) then pcall(function() d.ctl:send({ kind = "STOP" }, 500) end)
      elseif not self.spawned then
        -- a running worker stays up, free for the next head
        pcall(function() d.ctl:send({ kind = "STOP", payload = json.encode({ release = true }) }, 500) end)
      end
    end
  end
  if self.spawned then
    for _, d in ipairs(self.devices) do
      if d.pid then
        local deadline = core.now_ms() + 3000
        while alive(d.pid) and core.now_ms() < deadline do C.loip_sleep_ms(20) end
        if alive(d.pid) then os.execute("kill -TERM " .. d.pid .. " 2>/dev/null") end
        deadline = core.now_ms() + 2000
        while alive(d.pid) and core.now_ms() < deadline do C.loip_sleep_ms(20) end
        if alive(d.pid) then os.execute("kill -KILL " .. d.pid .. " 2>/dev/null") end
        C.loip_reap(d.pid)
      end
    end
  end
  if self.net then self.net:close() self.net = nil end
  if self.spawned and self.dir and not self.opts.keep_logs then os.execute("rm -rf " .. sh_quote(self.dir)) end
  if self.wake_before then
    core.wake_latency(self.wake_before >= 0 and self.wake_before or nil)
    self.wake_before = nil
  end
end

return M
