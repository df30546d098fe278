-- A device server: one device of a cluster, the process `loip worker` runs. It listens, answers
-- the head's control messages (HELLO, PLAN, START, END, CHANGE, LEND, LINK, STATS, TRACE,
-- PROFILE, PING, STOP, LOOKUP, SHIP: one handler each, in a dispatch table) and, once it holds a
-- plan, runs its stages every step in C (loip_device_serve): Lua sees only control messages.
-- SIGINT/SIGTERM stop it cleanly (sockets closed, buffers freed). A PLAN message (JSON)
-- carries: plan_id, device (1-based), plan (loip.plan tables), next and head (endpoints),
-- context, batch, max_seqs, kv_tokens, plan_positions, kv_grows, loader, overlap_loads,
-- disk_rate (this device's), link = { rate, delay_ms, spin_us } (the link into this device,
-- emulated on receipt), logits_tokens, slowdown. The worker loads its part of its slice store
-- (its own, or its cache's: SHIP, loip.cluster.cache) under its budget (loip.model.part, as one
-- device in a process is), and replies READY with its memory, or ERROR with why.
-- PROFILE makes it measure itself (loip.plan.profile.calibrate on its own store) and reply
-- PROFILE with the profile. A LINK message changes the emulation of the link into it.
local ffi = require "ffi"
local core = require "loip.core"
local json = require "loip.text.json"
local memory = require "loip.runtime.memory"
local plan = require "loip.plan"
local store = require "loip.model.store"
local part = require "loip.model.part"
local kernels = require "loip.model.kernels"
local transport = require "loip.runtime.transport"
local exec = require "loip.runtime.exec"
local prefix_cache = require "loip.engine.request.prefix_cache"
local files = require "loip.runtime.files"
local process = require "loip.runtime.process"
local rw = require "loip.runtime.device"
local engine = require "loip.engine"
local sampler = require "loip.model.sampler"
local profile = require "loip.plan.profile"
local draft = require "loip.cluster.draft"
local join = require "loip.cluster.join"
local cache_mod = require "loip.cluster.cache"
local model_mod = require "loip.model"
local K = core.constants

local M = {}

local function log(fmt, ...) io.stderr:write(os.date("%H:%M:%S "), string.format(fmt, ...), "\n") io.stderr:flush() end

-- sha256 of the store's manifest: two stores are the same when these match.
function M.store_id(dir)
  return (core.must(files.sha256_file(dir .. "/manifest.json", dir)))
end

local Worker = {}
Worker.__index = Worker

-- A budget's accounts as name -> bytes.
local function accounts(budget)
  local t = {}
  for _, a in ipairs(budget:report()) do t[a.account] = a.bytes end return t
end

-- opts: listen (endpoint), store, cache (a block cache: loip.cluster.cache), disk_quota, mem
-- (bytes, 0: unlimited), threads, token | keys. With a cache the store may be partial or absent.
function M.new(opts)
  local man = opts.store and store.read_manifest(opts.store)
  if man and not opts.cache then store.check_files(opts.store, man) end
  local net, err = transport.net { token = opts.token, keys = opts.keys }
  if not net then error(err, 0) end
  local sock, berr = net:bind(opts.listen)
  if not sock then net:close() error(berr, 0) end
  local self = setmetatable({ opts = opts, net = net, sock = sock, man = man, store_id = man and M.store_id(opts.store),
    header = ffi.new("loip_msg_header"), from = ffi.new("char[64]"), cap = 1024 * 1024 }, Worker)
  if opts.cache then self.cache = cache_mod.new(opts.cache, opts.disk_quota, opts.store, self.store_id) end
  self.buf = ffi.new("uint8_t[?]", self.cap)
  -- the heartbeat answers on its own thread and socket, even while a long stage computes
  local ep = sock:endpoint()
  local hb_ep = ep:match("^ipc://") and (ep .. ".hb") or (ep:gsub(":%d+$", ":*"))
  local hb, herr = transport.heartbeat_new(net.handle, hb_ep)
  if not hb then self:close() error(herr, 0) end
  self.hb = hb
  self.hb_endpoint = transport.heartbeat_endpoint(hb)
  -- the bulk link: large transfers (traces now, KV cache blocks later) stay off the control
  -- socket, where they would hold up the per-step messages
  local bulk, bulk_err = net:bind(ep:match("^ipc://") and (ep .. ".bulk") or (ep:gsub(":%d+$", ":*")))
  if not bulk then self:close() error(bulk_err, 0) end
  self.bulk = bulk
  return self
end

function Worker:endpoint() return self.sock:endpoint() end

-- Free the device: what runs on its part first (the draft beside it, the C device serving its
-- stages, the sockets), then the part (loip.model.part's one order).
function Worker:drop_device()
  local d = self.dev
  if not d then return end
  if d.drafter then d.drafter:close() end
  if d.device ~= nil then rw.device_free(d.device) end
  if d.lend_sock then d.lend_sock:close() end
  if d.next then d.next:close() end
  if d.head then d.head:close() end
  if d.part then d.part:close() end
  self.dev = nil
  collectgarbage()
end

-- Build the device a PLAN message describes: d.part (loip.model.part) is this device's part of
-- the plan. Raises with a message for the head.
function Worker:build(msg)
  self:drop_device()
  local dir, man = self.opts.store, self.man
  if not man then error("no slice store: its blocks were not shipped to this worker's --cache", 0) end
  if msg.store_id and msg.store_id ~= self.store_id then
    error(string.format("store %s differs from the head's (manifest sha256 %s, head has %s)", dir,
      self.store_id:sub(1, 16), tostring(msg.store_id):sub(1, 16)), 0)
  end
  local cfg = store.config(dir, man)
  local p, i = msg.plan, msg.device
  local d = {}
  self.dev = d
  local budget = memory.budget(self.opts.mem or 0)
  local defaults = model_mod -- (the head sends both)
  local ctx, batch = msg.context or defaults.default_context(cfg.max_seq), msg.batch or defaults.DEFAULT_BATCH
  local N, S
  d.part = part.open { cfg = cfg, threads = self.opts.threads, budget = budget, dir = dir, man = man,
    loader = msg.loader, disk_rate = msg.disk_rate, verify_reads = msg.verify_reads, trace = msg.trace,
    experts = msg.experts, routing = msg.routing,
    -- (this device's figures from the head's problem: its own profile's kernels section)
    kernels = function() return { profile = { kernels = msg.kernels }, policy = msg.kernels_policy } end,
    layout = function(pt)
      local sizes = plan.sizes(man, cfg, { context = ctx, batch = math.min(batch, ctx), threads = pt.threads,
        logits_tokens = msg.logits_tokens, max_seqs = msg.max_seqs, kv_tokens = msg.kv_tokens,
        plan_positions = msg.plan_positions or msg.kv_plan_tokens }) -- (kv_plan_tokens: plan_positions' deprecated name, which a head may send)
      -- the plan as every plan is checked, against this device's budget only
      local devices = {}
      for k = 1, type(p) == "table" and type(p.devices) == "table" and #p.devices or 0 do devices[k] = {} end
      if type(i) == "number" and devices[i] then devices[i].budget = budget:limit() end
      engine.check_plan(p, { model = sizes, devices = devices, cluster = true, loader = msg.loader }, "plan")
      N, S = #p.devices, #p.devices[1].stages
      if type(i) ~= "number" or i < 1 or i > N then error("plan: device " .. tostring(i) .. " is not in 1.." .. N, 0) end
      return { plan = p, index = i, sizes = sizes, memory_opts = { cluster = true, loader = msg.loader },
        overlap_loads = msg.overlap_loads, prefetch = not (p.prefetch == false or msg.prefetch == false) }
    end,
    session = function(pt)
      local mask = ffi.new("uint8_t[?]", cfg.n_layers)
      for l in pairs(plan.device_layers(p, i)) do mask[l] = 1 end
      return { context = ctx, batch = math.min(batch, ctx), kv_tokens = pt.sizes.kv_tokens, max_seqs = pt.sizes.max_seqs,
        grows = msg.kv_grows, layers = mask }
    end,
    -- (room kept for the offloaded blocks: a live change may make them resident)
    weights = function(pt)
      local keep = store.load_files(dir, man, "memory", budget.handle, plan.device_files(p, i, pt.sizes),
        store.offloaded_files(p, i, man))
      local ok, err = pcall(function()
        store.bind_loaded(pt.handle, dir, man, keep)
        -- (the embedding or head its plan keeps on disk: loip.plan.ends)
        keep.ends = store.bind_ends(pt.handle, dir, man, p, i, cfg.tied_embeddings ~= 0, budget.handle)
      end)
      if not ok then store.close(keep) error(err, 0) end
      return keep
    end }
  d.head_dead_ms = msg.dead_ms -- (the head pings us that often while it lives: loip.cluster.join)
  local ident = "d" .. i
  d.head = assert(self.net:connect(msg.head, ident))
  if N > 1 then d.next = assert(self.net:connect(msg.next, ident)) end
  local link = msg.link or {}
  self.link = { rate = link.rate, delay_ms = link.delay_ms or 0, spin_us = link.spin_us }
  self.sock:emulate { rate = link.rate, delay_ms = link.delay_ms or 0, spin_us = link.spin_us }
  self.bulk:emulate { rate = link.rate, delay_ms = link.delay_ms or 0, spin_us = link.spin_us }
  return d, budget, N, S, i, math.min(batch, ctx)
end

-- The device a between-steps message (CHANGE, LEND) applies to: it must name the plan it runs.
local function current_device(self, body, what)
  local d = self.dev
  if not d or not d.device then error(what .. " before a plan", 0) end
  if body.plan_id ~= d.plan_id then
    error(string.format("%s of plan %s, this device runs plan %s (stale)", what, tostring(body.plan_id), tostring(d.plan_id)), 0)
  end
  return d
end

local function reply(self, to, kind, payload, status, sock)
  (sock or self.sock):send { to = to, kind = kind, payload = payload, status = status or 0, dtype = -1 }
end

-- A worker serves one head: the first to say HELLO, until it releases us (STOP) or is gone (a
-- head on this host whose process ended, or one silent for OWNER_SILENCE_MS). Another head is
-- refused at once, naming the one served. Its identity: head-HOST-PID.
local OWNER_SILENCE_MS = 30000
local function head_gone(self)
  local o = self.owner
  if not o then return true end
  local host, pid = o.id:match("^head%-(.+)%-(%d+)$")
  if host and host == self.hostname and not io.open("/proc/" .. pid .. "/stat") then return true end
  return core.now_ms() - o.seen > OWNER_SILENCE_MS
end

function Worker:owned_by_other(msg)
  if not msg.from or not msg.from:match("^head%-") then return false end -- neighbours, probes
  if self.owner and self.owner.id == msg.from then
    self.owner.seen = core.now_ms()
    return false
  end
  if self.owner and not head_gone(self) then return true end
  if msg.kind ~= "HELLO" then return true end -- a new head starts with HELLO
  if self.owner then log("head %s is gone; serving %s", self.owner.id, msg.from) self:drop_device() end
  self.owner = { id = msg.from, seen = core.now_ms(), since = os.date("%Y-%m-%d %H:%M:%S") }
  return false
end

-- One function per message kind (self, msg, body: its JSON payload decoded, or nil): it returns
-- the reply's kind and payload (nil: no reply), answered on the socket the message came by.
local handlers = {}

function handlers.HELLO(self)
  return "HELLO", json.encode({ now_ns = core.now_ns(), heartbeat = self.hb_endpoint, bulk = self.bulk:endpoint(),
    store = self.opts.store, store_id = self.store_id, cache = self.cache ~= nil,
    mem = self.opts.mem or 0, threads = self.opts.threads or 0, pid = self.pid, version = core.build.version })
end

function handlers.PING() return "PONG", "" end
function handlers.SHIP(self, msg, body) return require("loip.cluster.cache").handle(self, msg, body) end -- (blocks shipped)

function handlers.PLAN(self, _, body)
  body = assert(body, "a message without its JSON body")
  local d, budget, N, S, i, batch = self:build(body)
  local cfg = ffi.new("loip_device_config")
  cfg.runner, cfg.session = d.part.runner, d.part.session
  cfg["in"], cfg.next, cfg.head = self.sock.handle, d.next and d.next.handle or nil, d.head.handle
  cfg.plan_id, cfg.device, cfg.n_devices, cfg.n_stages = body.plan_id, i - 1, N, S
  cfg.max_tokens, cfg.logits_tokens, cfg.max_seqs = batch, body.logits_tokens or 1, body.max_seqs or 1
  cfg.slowdown = body.slowdown or 1
  cfg.heartbeat = self.hb
  local dev, derr = rw.device_new(cfg, budget.handle)
  if not dev then error(derr, 0) end
  if body.plan.head_shares then -- the head cut across devices: this device's rows (loip.plan.ends)
    local first, count = plan.ends.share_of(body.plan.head_shares, i)
    local ok, serr = rw.device_head_share(dev, first, first + count)
    if not ok then rw.device_free(dev) error(serr, 0) end
  end
  d.device, d.plan_id = dev, body.plan_id
  log("device %d of %d: plan %d, %d stages, %s used of %s", i, N, body.plan_id, S,
    memory.format_bytes(budget:used()), budget:limit() > 0 and memory.format_bytes(budget:limit()) or "unlimited")
  return "READY", json.encode({ memory = budget:used(), limit = budget:limit(), accounts = accounts(budget),
    kv_group_bytes = exec.session_kv_group_bytes(d.part.session),
    loader = d.part.loader and d.part.loader:mode() or "none" })
end

-- which of a prompt's leading KV group keys this device holds for its layers (the prefix cache)
function handlers.LOOKUP(self, _, body) return "READY", prefix_cache.device_lookup(self.dev, body) end
function handlers.START(self, _, body)
  if not self.dev then error("START before a plan", 0) end
  body = assert(body, "a message without its JSON body")
  local p = ffi.new("loip_sampler_params")
  for k, v in pairs(sampler.defaults) do p[k] = body.sampler[k] == nil and v or body.sampler[k] end
  local prompt = body.prompt or {}
  local ids = ffi.new("int32_t[?]", math.max(#prompt, 1))
  for k, id in ipairs(prompt) do ids[k - 1] = id end
  core.must(rw.device_start(self.dev.device, body.seq or 0, body.request, p, body.seed or 0, body.n_sample, ids,
    #prompt, #prompt + (body.max_tokens or 0) + 1))
  -- a request resumed on a new plan: its sampler goes on where it was
  if (body.draws or 0) > 0 then core.must(rw.device_skip_draws(self.dev.device, body.seq or 0, body.draws)) end
  prefix_cache.device_start(self.dev, body) -- (KV its prompt starts with: cached, or another choice's)
  return "READY", ""
end

-- a live plan change between steps: a stage's offloaded prefix grows or shrinks
function handlers.CHANGE(self, _, body)
  body = assert(body, "a message without its JSON body")
  local d = current_device(self, body, "a change")
  local pt = d.part
  pt:restage(body.stage, body.offloaded)
  log("change %s: stage %d now reads %d blocks every step; %s used", tostring(body.change), body.stage, body.offloaded,
    memory.format_bytes(pt.budget:used()))
  return "READY", json.encode({ memory = pt.budget:used(), limit = pt.budget:limit(),
    slot_bytes = pt.loader and pt.loader:slot_bytes() or 0, accounts = accounts(pt.budget) })
end

-- KV lending (the paper's transfer protocol): from now on this device ships the oldest groups
-- of each running sequence's KV (body.groups: per sequence slot, 0-based keys as strings, or one
-- count for all) to the holder at body.peer after each stage, and fetches them back before the
-- stage runs again; no peer: everything comes home and lending stops
function handlers.LEND(self, _, body)
  body = assert(body, "a message without its JSON body")
  local d = current_device(self, body, "lending")
  local pt = d.part
  local S = #pt.plan.devices[pt.index].stages
  local layers = ffi.new("int32_t[?]", 2 * S)
  for s, st in ipairs(pt.plan.devices[pt.index].stages) do
    -- the layers whose attention (even block) is in the stage keep their KV with it
    layers[2 * (s - 1)], layers[2 * (s - 1) + 1] = math.ceil(st.blocks[1] / 2), math.floor(st.blocks[2] / 2) + 1
  end
  local n_seqs = exec.session_max_seqs(pt.session)
  local groups = ffi.new("int32_t[?]", n_seqs)
  for q = 0, n_seqs - 1 do
    local g = type(body.groups) == "table" and body.groups[tostring(q)] or body.groups
    groups[q] = tonumber(g) or 0
  end
  local old = d.lend_sock
  if body.peer and body.peer ~= d.lend_peer then
    d.lend_sock = assert(self.net:connect(body.peer, "d" .. pt.index .. "-lend"))
    d.lend_sock:emulate(self.link or {})
  elseif not body.peer then
    core.must(rw.device_recall(d.device))
    d.lend_sock = nil
  end
  core.must(rw.device_lend(d.device, d.lend_sock and d.lend_sock.handle or nil, layers, groups))
  if old and old ~= d.lend_sock then old:close() end
  d.lend_peer = body.peer
  return "READY", json.encode({ memory = pt.budget:used(), limit = pt.budget:limit(), accounts = accounts(pt.budget) })
end

-- the emulated link into this device changes (a link schedule): rate and delay, no reply
function handlers.LINK(self, _, body)
  body = body or {}
  local o = { rate = body.rate, delay_ms = body.delay_ms or (self.link and self.link.delay_ms) or 0,
    spin_us = self.link and self.link.spin_us }
  self.sock:emulate(o)
  self.bulk:emulate(o)
  -- lent KV comes back into this device too
  if self.dev and self.dev.lend_sock then self.dev.lend_sock:emulate(o) end
  self.link = o
end

-- a request is done: its slot's KV goes back (no reply; a failure is only logged)
function handlers.END(self, _, body)
  body = body or {}
  if self.dev and self.dev.device and type(body.seq) == "number" then
    prefix_cache.device_keep(self.dev, body, log) -- (its full groups held by the prefix cache first)
    local ok, err = rw.device_end(self.dev.device, body.seq, body.request or 0)
    if not ok then log("END: %s", err) end
  end
end

function handlers.STATS(self)
  local st = {}
  if self.dev then
    local pt = self.dev.part
    local ds = rw.device_stats(self.dev.device, ffi.new("loip_device_stats_t"))
    local rs = pt:runner_stats()
    st = { hops = tonumber(ds.hops), recv_wait_ms = tonumber(ds.recv_wait_ns) / 1e6, send_ms = tonumber(ds.send_ns) / 1e6,
      bytes_sent = tonumber(ds.bytes_sent), rejected = tonumber(ds.rejected), head_ms = tonumber(ds.head_ns) / 1e6,
      drafted = tonumber(ds.drafted), accepted = tonumber(ds.accepted),
      compute_ms = rs.compute_ms, stall_ms = rs.stall_ms, load_ms = rs.load_ms,
      bytes_loaded = rs.bytes_loaded, memory = pt.budget:used(), links = self.sock:stats(),
      lent_bytes = tonumber(ds.lent_bytes), fetched_bytes = tonumber(ds.fetched_bytes),
      lend_wait_ms = tonumber(ds.lend_wait_ns) / 1e6, held_bytes = tonumber(ds.held_bytes),
      held_in_bytes = tonumber(ds.held_in_bytes) }
    -- the budget's accounts (weights, slots, kv, activations)
    st.kv_free_tokens = exec.session_kv_free_tokens(pt.session)
    st.experts = pt.experts and pt.experts:stats() or nil
    -- the budget's limit and peak, and this process's peak resident memory
    st.budget_bytes, st.peak_bytes = pt.budget:limit(), pt.budget:peak()
    st.peak_rss_bytes = process.peak_rss_bytes()
    st.accounts = accounts(pt.budget)
    st.prompt_cache = prefix_cache.device_store(self.dev):stats()
    st.kernels = kernels.state(pt)
  end
  return "STATS", json.encode(st)
end

-- the events recorded since the last TRACE (with the plan's trace on), on this host's clock
function handlers.TRACE(self)
  return "TRACE", json.encode({ now_ns = core.now_ns(), events = self.dev and self.dev.part:events() or {} })
end

function handlers.PROFILE(self, _, o)
  o = o or {}
  local pr
  if o.full then
    pr = profile.of_store(self.opts.store, { threads = self.opts.threads, batches = o.batches, contexts = o.contexts,
      read = o.read, disk_rate = o.disk_rate, prefetch = o.prefetch })
  else
    -- (a cache's store is partial: the model's shape the head sent, a scratch file for the disk)
    pr = profile.calibrate { store = not self.cache and self.opts.store or nil, cfg = o.cfg, dtype = o.dtype,
      threads = self.opts.threads, context = o.context, quiet = true }
  end
  if o.link_to then pr.link.to_next = profile.link_to(self.net, o.link_to, "profile-" .. (self.pid or 0)) end
  return "PROFILE", json.encode(pr)
end

-- speculative decoding's draft run here, charged to this device's budget (loip.cluster.draft)
function handlers.DRAFT(self, _, body)
  body = assert(body, "a message without its JSON body")
  return "DRAFT", json.encode(draft.handle(current_device(self, body, "DRAFT"), self.opts.store, body))
end

function handlers.STOP(self, _, body)
  if body and body.release then -- the head is done with us: free for the next one
    log("released by head %s", tostring(self.owner and self.owner.id))
    self:drop_device()
    self.owner = nil
    return
  end
  self.stopping = true
  return "READY", ""
end

-- A message that failed: what is logged (the kind's word: "plan refused: why"), whether the
-- device is dropped (a plan half built), and whether it is answered ERROR (LINK has no reply).
local failure = { PLAN = { log = "plan", drop = true }, CHANGE = { log = "change" }, LEND = { log = "lending" },
  LINK = { log = "LINK", quiet = true } }

function Worker:handle(msg)
  local kind = msg.kind
  if kind ~= "PING" and self:owned_by_other(msg) then
    local why = self.owner and string.format("this worker serves head %s (since %s); stop that head first, or start another worker",
      self.owner.id, self.owner.since) or "say HELLO first"
    log("refused %s from %s: %s", tostring(kind), msg.from, why)
    reply(self, msg.from, "ERROR", why, K.ESTATE, msg.via)
    return
  end
  local h = handlers[kind]
  if not h then return log("ignored a %s message from %s", tostring(kind), msg.from) end
  local ok, rkind, payload = pcall(function()
    local body = msg.payload and msg.payload ~= "" and msg.flags ~= 1 and json.decode(msg.payload) or nil -- (1: a SHIP chunk)
    return h(self, msg, type(body) == "table" and body or nil)
  end)
  if ok then
    if rkind then reply(self, msg.from, rkind, payload, 0, msg.via) end return
  end
  local f = failure[kind] or {}
  if f.drop then self:drop_device() end
  if f.log then log("%s refused: %s", f.log, tostring(rkind)) end
  if not f.quiet then reply(self, msg.from, "ERROR", tostring(rkind), K.EINVAL, msg.via) end
end

-- One receive: through the device (data handled in C) when it exists, else the socket.
function Worker:poll(timeout_ms)
  if self.dev and self.dev.device then
    local got, err = rw.device_serve(self.dev.device, timeout_ms, self.header, self.buf, self.cap, self.from)
    if got == false then return nil end
    if not got then
      log("refused or failed: %s", err)
      return nil
    end
    local h = self.header
    return { kind = transport.kind_name[h.kind], from = ffi.string(self.from), plan_id = h.plan_id,
      payload = ffi.string(self.buf, tonumber(h.payload_bytes)) }
  end
  local msg, err = self.sock:recv(timeout_ms, self.cap)
  if not msg then
    if err ~= "timeout" then log("refused: %s", err) end
    return nil
  end
  return msg
end

local function parent_pid()
  local f = io.open("/proc/self/stat")
  local st = f:read("*l") f:close() return tonumber(st:match("^%d+ %b() %a (%d+)"))
end

function Worker:run()
  process.signal_watch()
  local h = json.read_file("/proc/sys/kernel/hostname")
  self.hostname = h and h:match("^[^\n]*")
  self.pid = process.pid()
  self.parent = parent_pid()
  while not self.stopping and join.keep_running(self) do -- (a join's answer; SIGTERM: leave)
    local msg = self:poll(200)
    if msg then self:handle(msg) end
    if self.opts.on_tick then self.opts.on_tick() end -- (e.g. worker --announce's beacon renewed)
    -- the bulk link (answered on it)
    local bmsg = self.bulk:recv(0, self.cap)
    while bmsg do
      bmsg.via = self.bulk
      self:handle(bmsg)
      bmsg = self.bulk:recv(0, self.cap)
    end
    for _, line in ipairs(self.net:auth_log()) do log("%s", line) end
  end
  log("stopping (%s)", self.stopping and "asked by the head" or self.failed or ("signal " .. process.signal_received()))
  self:close()
  -- a local head that died (kill -9, a crash) could not remove its directory: its last worker does
  if self.opts.head_dir and not self.stopping and parent_pid() ~= self.parent then
    os.execute("rm -rf '" .. self.opts.head_dir:gsub("'", "'\\''") .. "'")
  end
end

function Worker:close()
  self:drop_device()
  if self.bulk then self.bulk:close() self.bulk = nil end
  if self.hb then transport.heartbeat_free(self.hb) self.hb = nil end
  if self.sock then self.sock:close() self.sock = nil end
  if self.net then self.net:close() self.net = nil end
end

return M
