-- A cluster's planner: the planning problem of its devices (their profiles, links, budgets), the
-- plan chosen through loip.policy (or one given, checked as loip.engine checks every plan) and
-- sent to every device (PLAN, READY), and the changes between steps: a stage restaged (CHANGE),
-- KV lent (LEND), a plan for more KV positions (replan_kv), an emulated link's rate (LINK).
--
--   local pl = planner.new(c)                  -- c: loip.cluster's Cluster
--   pl:plan(opts) -> plan, estimate, facts     choose (or check) a plan and send it (Cluster:plan)
--   pl:restage(i, stage, offloaded), pl:lend(i, holder, groups), pl:replan_kv(positions),
--   pl:set_link(i, rate, delay_ms)             live changes between steps
--   pl:problem(opts, sizes), pl:profiles(opts), pl:budget_of(i), pl:plan_sizes(opts, k)
--   pl.opts_without(opts, gone), pl.opts_with_newcomer(opts)   plan options for a changed set
--   pl:new_set()                               the set changed: lending and live links forgotten
--   pl:online_devices(), pl:link_rates()       what an online policy sees (the ring engine's)
-- Its state, read by the other parts and by callers through the Cluster: plan_opts, plan_table,
-- plan_id, sizes, problem_table, estimate, facts, context, batch, vocab, dim, draft_device,
-- draft_reserve, draft_rows, lending, link_now. It reads the devices from c.registry, talks to
-- them through c.rpc, and tells the ring engine (c.ring) when a plan replaces its request loop.
local ffi = require "ffi"
local core = require "loip.core"
local json = require "loip.text.json"
local plan = require "loip.plan"
local policy = require "loip.policy"
local engine = require "loip.engine"
local store = require "loip.model.store"
local transport = require "loip.runtime.transport"
local memory = require "loip.runtime.memory"
local proc = require "loip.cluster.proc"
local ship = require "loip.cluster.ship"
local draft = require "loip.cluster.draft"
local profile = require "loip.plan.profile"
local problem = require "loip.plan.problem"
local flags = require "loip.ui.flags"
local model = require "loip.model"
local request_draft = require "loip.engine.request.draft"

local alive, tail = proc.alive, proc.tail

local M = {}

local Planner = {}
Planner.__index = Planner

function M.new(c) return setmetatable({ c = c, plan_id = 0 }, Planner) end

-- A value given once or once per device.
local function each(v, i)
  if type(v) == "table" then return v[i] end
  return v
end

-- The figures of each device: opts.profile (a file or table: one device's, used for all, or a
-- cluster's, one per device), else calibrations: local workers share this machine (measured
-- here, once, kept in the cache); running workers each measure themselves (PROFILE), once.
function Planner:profiles(opts)
  local c, devices = self.c, self.c.registry.devices
  local pr = opts.profile
  if type(pr) == "string" then pr = profile.load(pr) end
  local N, out = #devices, {}
  if pr then
    if pr.devices and #pr.devices ~= N then
      error(string.format("--profile: it profiles %d devices, the cluster has %d", #pr.devices, N), 0)
    end
    for i = 1, N do out[i] = pr.devices and pr.devices[i] or pr end
    return out
  end
  if c.spawned then
    -- local devices share this machine: its disk read by all of them at once (each device's
    -- rate is its share), its cores split among them (each device's threads, start_local), and
    -- compute timed while as many readers stream. (As many as were started: a re-plan after a
    -- loss reuses the calibration rather than measure again while requests wait.)
    local here = profile.calibrate { store = c.store, threads = devices[1].threads, context = self.context,
      readers = c.local_devices or N }
    for i = 1, N do out[i] = here end
    return out
  end
  for i, d in ipairs(devices) do
    -- (measured once per device and context: a re-plan after a join, a leave or a loss reuses
    -- it rather than measure every device again while requests wait; the model's shape: a worker
    -- whose blocks are shipped may hold none yet)
    if not (d.measured and d.measured.context == self.context) then
      local r = c.rpc:ask(i, { kind = "PROFILE", payload = json.encode({ context = self.context, cfg = c.man.config,
        dtype = store.layer_dtype(c.man) }) }, 120000, d.bulk)
      d.measured = { context = self.context,
        profile = json.decode(r.payload) or error(string.format("device %d (%s): an unreadable profile", i, d.endpoint), 0) }
    end
    out[i] = d.measured.profile
  end
  return out
end

-- The planning problem of this cluster (loip.plan.problem) for the options of c:plan.
function Planner:problem(opts, sizes)
  local man = self.c.man
  local N = #self.c.registry.devices
  local budgets, rates, delays = {}, {}, {}
  for i = 1, N do budgets[i] = self:budget_of(i) end
  local profiles = self:profiles(opts)
  local link = opts.link or {}
  for i = 1, N do
    -- a link's figures: as given (emulated on local devices), else as its device measured it
    local r, measured = each(link.rate, i), profiles[i].link and profiles[i].link.to_next
    rates[i] = r and transport.parse_rate(r) or (measured and measured.rate_bps) or 0
    delays[i] = each(link.delay_ms, i) or 0
  end
  return problem.new { model = sizes, shape = problem.shape_of(man.config, store.layer_dtype(man)), n = N,
    routing = opts.routing and opts.routing.frequencies,
    budgets = budgets, profiles = profiles, disk_rate = opts.disk_rate, slowdown = opts.slowdown,
    link_rate = rates, link_delay_ms = delays, cluster = true, stages = opts.stages, context = self.context,
    batch = sizes.batch or self.batch, loader = opts.loader, micro_batch = sizes.max_seqs or 1, ends = opts.ends }
end

-- Device i's budget for its part of the plan (bytes; 0: unlimited): less what a draft run
-- there takes (Planner:reserve_draft).
function Planner:budget_of(i)
  local b = self.c.registry.devices[i].mem or 0
  if b > 0 and self.draft_device == i then b = b - self.draft_reserve end
  return b
end

-- Speculative decoding's draft on a device (its policy's `device` setting, --draft-device): the
-- device (auto: the largest budget) and the bytes its draft takes there, kept out of the
-- budget the scheduler plans that device with. Raises when the budget cannot hold the draft.
function Planner:reserve_draft(opts, ctx, max_seqs)
  local inst = policy.load("draft", opts.draft)
  local where = inst.params and inst.params.device
  if not where or where == "head" or not inst.module.memory then return end
  local devices, man = self.c.registry.devices, self.c.man
  local budgets = {}
  for i, d in ipairs(devices) do budgets[i] = d.mem or 0 end
  -- (after a device loss a device number past the others left: the draft goes where auto puts it)
  if tonumber(where) and tonumber(where) > #budgets and #(self.c.registry.losses or {}) > 0 then where = "auto" end
  local bytes = inst.module.memory({ path = self.c.store, context = ctx, max_seqs = max_seqs }, inst.params)
  local ms
  if where == "auto" then
    -- each device's time for a block of the target, by its profile (and emulated slowdown)
    local profiles, shape = self:profiles(opts), problem.shape_of(man.config, store.layer_dtype(man))
    ms = {}
    for i in ipairs(devices) do
      ms[i] = profile.block_ms(profiles[i], "mlp", 1, ctx, shape) * (each(opts.slowdown, i) or 1)
    end
  end
  local i = draft.device_of(where, budgets, bytes, ms)
  local b = budgets[i]
  if b > 0 and bytes >= b then
    error(string.format("--draft-device %s: device %d's budget of %s cannot hold the draft (%s: weights, KV cache and scratch)",
      tostring(where), i, memory.format_bytes(b), memory.format_bytes(bytes)), 0)
  end
  self.draft_device, self.draft_reserve = i, bytes
end

-- A device's memory outside its KV cache (what it reported: used, less its kv account) and its
-- slot, into m (Planner:online_devices reads them).
local function mem_update(m, rep)
  -- outside the KV cache: neither this device's KV ("kv", with its lending staging buffer) nor
  -- what it holds for others ("kv_lent"), which move every step
  local a = rep.accounts or {}
  if rep.memory then m.nonkv = rep.memory - (a.kv or 0) - (a.kv_lent or 0) end
  m.slot_bytes = rep.slot_bytes or m.slot_bytes
end

-- Speculative decoding's rows are an optimisation, never the reason a plan fails: the last
-- device computes the logits of every row it verifies, each decoding request's last token and
-- its k drafts (its result buffer, in the plan's activations, is sized for them). A plan is
-- made for the k asked (--draft-tokens, else the most loip.engine.request.draft drafts); when none holds
-- them, for fewer (the most that fit, by halving), then for none. choose(k) returns the plan
-- for k draft rows a request (a table) or raises; returns it with draft_rows = k. Raises
-- choose(0)'s error when no plan fits even without draft rows. floor (a tree's: more rows than
-- a chain's, loip.engine.request.draft.plan_rows): the rows give way first when memory is
-- short, in price as in fit: of k, k/2, ... floor rows, the plan with the most expected tokens
-- per ms, a tree's tokens per step taken to grow by request_draft.TREE_GAIN of the chain's per
-- doubling of its rows (a read-bound ring's rows cost little, but rows that push weights off a
-- device make every step read them).
local function fit_draft_rows(k, choose, floor)
  if floor and floor < k then
    local okf, base = pcall(choose, floor)
    local at = okf and base.estimate and base.estimate.ms_per_token
    if at then
      local best, best_v = base, 1 / at
      base.draft_rows = floor
      while k > floor do
        local okk, ck = pcall(choose, k)
        local ms = okk and ck.estimate and ck.estimate.ms_per_token
        local v = ms and (1 + request_draft.TREE_GAIN * math.log(k / floor, 2)) / ms
        if v and v > best_v then best, best_v, ck.draft_rows = ck, v, k end
        k = math.max(floor, math.floor(k / 2))
      end
      return best
    end
  end
  local ok, c = pcall(choose, k)
  if not ok then
    if k == 0 then error(c, 0) end
    c = choose(0) -- (raises when no plan holds even none)
    local lo, hi = 0, k -- (lo fits, hi does not)
    while hi - lo > 1 do
      local mid = math.floor((lo + hi) / 2)
      local okm, cm = pcall(choose, mid)
      if okm then lo, c = mid, cm else hi = mid end
    end
    k = lo
  end
  c.draft_rows = k
  return c
end

M.fit_draft_rows = fit_draft_rows -- (loip simulate reserves a draft's rows as the cluster does)

-- A plan reserving `rows` draft rows a request, max_batch requests: the step's tokens (batch
-- raised to hold a request's rows beside every request's token, at most the context; batch as
-- it is when fixed, --step-tokens) and the logits rows the last device returns (every request's
-- token and drafts, at most the step). Planner:step_rows, loip simulate and loip.sim.experiments.
function M.rows_step(context, batch, rows, max_batch, fixed)
  local b = fixed and batch or math.min(context, math.max(batch, rows + max_batch))
  return b, math.min(b, max_batch * (rows + 1))
end

-- The tokens a step carries for k draft rows a request: the batch asked for (--step-tokens),
-- else the default raised to hold a request's k drafts beside every request's token (a tree past
-- 64 nodes: its rows planned as any others, given way when memory is short: fit_draft_rows);
-- and the logits rows the last device returns (M.rows_step).
function Planner:step_rows(opts, k)
  return M.rows_step(self.context, self.batch_asked, k or 0, opts.max_batch or 1, opts.batch ~= nil)
end

-- The draft rows a request asks of a plan (k: loip.engine.request.draft.plan_rows), at most a
-- step's tokens where they are fixed (--step-tokens).
function Planner:draft_rows_asked(opts, k)
  return opts.batch and math.min(k, self.batch_asked) or k
end

-- The sizes of a plan for this cluster's context and batch (Planner:plan sets them) and opts
-- (max_batch, kv_tokens, plan_positions, logits_tokens, draft) with k draft rows a request.
function Planner:plan_sizes(opts, k)
  local max_seqs = opts.max_batch or 1
  local lt = opts.logits_tokens or 1
  local batch, draft_lt = self:step_rows(opts, k)
  if opts.draft ~= nil and opts.draft ~= "none" then lt = math.max(lt, draft_lt) end
  return plan.sizes(self.c.man, store.config(self.c.store, self.c.man), { context = self.context, batch = batch,
    threads = self.c.registry.devices[1].threads or 1, logits_tokens = lt, max_seqs = max_seqs, kv_tokens = opts.kv_tokens,
    plan_positions = flags.renamed(opts, "kv_plan_tokens", "plan_positions", "cluster:plan") })
end

-- Choose (or check) the plan and send each device its part; waits until all are READY.
-- opts: plan (table or Lua file), else scheduler and cost (loip.policy names or paths; default
-- "loip"), stages (a fixed stage count), profile (see Planner:profiles); context, batch (tokens
-- a step carries: prompt chunks and decoding requests), max_batch (requests served at once,
-- each with its own KV cache; default 1), kv_tokens (the KV pool they share, in positions;
-- default context x max_batch), kv_grows (the KV pool charged as contexts take it:
-- loip_session_set_kv_growth), plan_positions (KV positions the plan's memory holds, default
-- kv_tokens; fewer: the pool grows inside the budget and the online policy, opts.online, makes
-- room as it does: loip.engine.request.online), link_schedule (a "links" policy name or path: the
-- emulated links change between steps),
-- loader, overlap_loads, disk_rate (bytes/s, once or per device), link = { rate, delay_ms }
-- (each once or per link: link i runs from device i to the next, emulated where it arrives),
-- slowdown (once or per device: compute that takes that many times as long, to mimic slower
-- boards), logits_tokens, trace (record events for collect_trace), prefetch (false: stages read
-- when they start, for a given plan). Returns the plan, the cost model's estimate of it and the
-- scheduler's facts ({ scheduler_ms, scheduler, cost }, when one chose it).
function Planner:plan(opts)
  opts = opts or {}
  self.plan_opts = opts
  local cfg, facts = store.config(self.c.store, self.c.man)
  self.facts = facts
  local ctx, batch = opts.context or model.default_context(cfg.max_seq), opts.batch or model.DEFAULT_BATCH
  batch = math.min(batch, ctx)
  self.context, self.batch, self.vocab, self.dim = ctx, batch, cfg.vocab_size, cfg.dim
  self.batch_asked = batch -- (the step's tokens before a tree's rows raise them: Planner:step_rows)
  local max_seqs = opts.max_batch or 1
  if type(max_seqs) ~= "number" or max_seqs < 1 or max_seqs ~= math.floor(max_seqs) or max_seqs > batch then
    error(string.format("cluster: max_batch %s is not a whole number in 1..%d (the tokens a step carries)", tostring(max_seqs), batch), 0)
  end
  self.c.ring:replacing_plan(opts.keep_requests) -- (raises while requests run, unless they are kept)
  self.draft_device, self.draft_reserve = nil, nil
  local drafting = opts.draft ~= nil and opts.draft ~= "none"
  if drafting then self:reserve_draft(opts, ctx, max_seqs) end
  local p, where = opts.plan, "plan"
  if type(p) == "string" then p, where = plan.load(p), p end
  local mopts = { cluster = true, loader = opts.loader }
  -- the plan for k draft rows a request (raises when none fits): { sizes, problem, plan,
  -- estimate, info }
  local function choose(k)
    local c = { sizes = self:plan_sizes(opts, k) }
    if p == nil then
      c.problem = self:problem(opts, c.sizes)
      c.plan, c.estimate, c.info = policy.plan(c.problem, { scheduler = opts.scheduler, cost = opts.cost })
    else
      local devices = {}
      for i in ipairs(self.c.registry.devices) do devices[i] = { budget = self:budget_of(i) } end
      engine.check_plan(p, { model = c.sizes, devices = devices, cluster = true, loader = opts.loader }, where)
      c.plan = p
      if opts.estimate ~= false then
        c.problem = self:problem(opts, c.sizes)
        c.estimate = policy.load("cost", opts.cost or "loip").estimate(p, c.problem)
      end
    end
    return c
  end
  -- (chosen already, on this problem: Planner:replan_kv)
  local c = opts.plan_chosen
  if not c then
    local k = drafting and request_draft.plan_rows(policy.load("draft", opts.draft), opts.draft_tokens) or 0
    c = fit_draft_rows(self:draft_rows_asked(opts, k), choose, drafting and not opts.draft_tokens and request_draft.MAX or nil)
  end
  local sizes, est, info = c.sizes, c.estimate, c.info
  batch = sizes.batch -- (raised for a tree's rows: Planner:step_rows)
  self.batch = batch
  p = c.plan
  self.sizes, self.draft_rows = sizes, drafting and c.draft_rows or nil
  if c.problem then self.problem_table = c.problem end
  -- the largest RESULT the last device sends: an output per token of a step and the logits
  -- rows asked for (the results socket's buffer is this big, not a fixed ceiling)
  self.c.rpc:expect_results(batch * ffi.sizeof("loip_step_output") + sizes.logits_tokens * cfg.vocab_size * 4)
  -- the blocks each device lacks, shipped to its cache before the plan takes effect (a failure
  -- leaves the cluster its plan)
  ship.plan(self.c, p, sizes)
  self.plan_table = p
  if opts.estimate ~= false then self.estimate = est end
  self.plan_id = self.plan_id + 1
  self:send_plans(p, sizes, opts, ctx, batch, max_seqs)
  self:await_ready(p, sizes, mopts)
  self.c.ring:planned() -- (a request loop kept across the new plan: the rows of a step it holds)
  return p, est, info
end

-- Plan p sent to every device (PLAN: its part, the ring's endpoints, the sizes and settings of
-- opts); Planner:await_ready waits for their answers.
function Planner:send_plans(p, sizes, opts, ctx, batch, max_seqs)
  local devices = self.c.registry.devices
  local N = #devices
  local link = opts.link or {}
  for i, d in ipairs(devices) do
    local from = (i - 2) % N + 1 -- the link into device i
    local body = { plan_id = self.plan_id, device = i, plan = plan.bare(p),
      next = devices[i % N + 1].endpoint, head = self.c.rpc.results:endpoint(), store_id = self.c.store_id,
      context = ctx, batch = batch, max_seqs = max_seqs, kv_tokens = sizes.kv_tokens, plan_positions = sizes.plan_positions,
      kv_plan_tokens = sizes.plan_positions, -- (plan_positions' deprecated name, which a worker may read)
      kv_grows = opts.kv_grows or sizes.plan_positions < sizes.kv_tokens, loader = opts.loader, verify_reads = opts.verify_reads,
      disk_rate = each(opts.disk_rate, i), experts = opts.experts, routing = opts.routing,
      -- the read order the device's profile found faster, unless told
      overlap_loads = opts.overlap_loads == nil and self.problem_table and self.problem_table.devices[i].overlap_loads
        or opts.overlap_loads or false,
      -- the device's own profile's kernel figures, from which its kernels policy chooses
      kernels = self.problem_table and self.problem_table.devices[i].profile and self.problem_table.devices[i].profile.kernels
        or nil, kernels_policy = opts.kernels_policy,
      link = { rate = each(link.rate, from), delay_ms = each(link.delay_ms, from), spin_us = link.spin_us },
      logits_tokens = plan.logits_tokens_of(p, sizes, i, N), prefetch = opts.prefetch, trace = opts.trace, slowdown = each(opts.slowdown, i),
      dead_ms = self.c.dead_ms } -- (silent this long, the head is gone to a worker: loip.cluster.join)
    d.ctl:send({ kind = "PLAN", payload = json.encode(body) }, 2000)
  end
end

-- Every device's READY to plan p (an ERROR, an exit or 300 s without one raises, naming the
-- device), and the memory each reports, kept for the online policy.
function Planner:await_ready(p, sizes, mopts)
  local devices = self.c.registry.devices
  for i, d in ipairs(devices) do
    local r
    local deadline = core.now_ms() + 300000
    repeat
      r = d.ctl:recv(200)
      if r and r.kind == "ERROR" then error(string.format("device %d (%s): %s", i, d.endpoint, r.payload), 0) end
      if d.pid and not alive(d.pid) then
        error(string.format("device %d (%s) exited while loading its plan:\n%s", i, d.endpoint, tail(d.log, 5)), 0)
      end
      if core.now_ms() > deadline then error(string.format("device %d (%s) did not load its plan within 300 s", i, d.endpoint), 0) end
    until r and r.kind == "READY" and r.payload ~= "" -- (an empty READY answered a STOP, not this plan)
    d.ready = json.decode(r.payload) or {}
    -- the memory the online policy reasons with: outside the KV cache (none held yet: its
    -- account is the tables alone), and a KV group's bytes
    d.mem_state = { limit = d.ready.limit or d.mem or 0, kv_base = (d.ready.accounts or {}).kv or 0,
      group_bytes = d.ready.kv_group_bytes or 0, slot_bytes = plan.memory(p, i, sizes, mopts).slot_bytes }
    mem_update(d.mem_state, d.ready)
  end
end

-- A live plan change between steps (no request's KV is lost, no token changes): stage `stage`
-- of device i now reads its first `offloaded` blocks every step (more: memory freed on that
-- device; fewer: read back into it, charged to its budget). Returns the device's memory.
function Planner:restage(i, stage, offloaded)
  if not self.plan_table then error("cluster: no plan yet (call c:plan first)", 2) end
  local devices = self.c.registry.devices
  if not devices[i] then error(string.format("restage: device %s is not one of %d", tostring(i), #devices), 2) end
  local p2 = engine.restaged(self.plan_table, i, stage, offloaded) -- (checked here before the device is asked)
  self.change = (self.change or 0) + 1
  local r = self.c.rpc:ask(i, { kind = "CHANGE", payload = json.encode({ plan_id = self.plan_id, change = self.change, stage = stage,
    offloaded = offloaded }) }, 60000)
  self.plan_table = p2
  local rep = json.decode(r.payload) or {}
  if devices[i].mem_state then mem_update(devices[i].mem_state, rep) end
  return rep
end

-- KV lending between steps (the paper's KV transfer protocol): device i ships the oldest
-- `groups` KV groups (16 positions each) of every running request (a number, or a table by
-- sequence slot) to device `holder` after each of its stages runs, and fetches them back before
-- the stage runs again; holder nil (or groups 0): everything comes back and lending stops.
-- Tokens never change. Returns device i's memory.
function Planner:lend(i, holder, groups)
  if not self.plan_table then error("cluster: no plan yet (call c:plan first)", 2) end
  local devices = self.c.registry.devices
  local N = #devices
  if not devices[i] then error(string.format("lend: device %s is not one of %d", tostring(i), N), 2) end
  if holder ~= nil and (not devices[holder] or holder == i) then
    error(string.format("lend: holder %s is not another of the %d devices", tostring(holder), N), 2)
  end
  local g = groups
  if type(groups) == "table" then
    g = {}
    for q, n in pairs(groups) do g[tostring(q)] = n end
  end
  if holder == nil or (type(g) == "number" and g <= 0) then holder, g = nil, 0 end
  local r = self.c.rpc:ask(i, { kind = "LEND", payload = json.encode({ plan_id = self.plan_id,
    peer = holder and devices[holder].endpoint or nil, groups = g }) }, 60000)
  self.lending = self.lending or {}
  self.lending[i] = holder and { holder = holder, groups = groups } or nil
  local rep = json.decode(r.payload) or {}
  if devices[i].mem_state then mem_update(devices[i].mem_state, rep) end
  return rep
end

-- Plan again for `positions` KV positions, the requests kept (an online policy's last resort,
-- loip.engine.request.online's control.replan: the KV cache outgrew the plan and neither restaging nor
-- lending makes room): the same scheduler and options; every device loads its new part, the
-- running requests' KV is gone and the batcher prefills them again, as after a device loss, so
-- no token changes. A plan that was given (opts.plan) is not replaced. Raises naming the
-- shortfall when no plan holds that many positions; the cluster keeps its plan then.
function Planner:replan_kv(positions)
  if not self.plan_table then error("cluster: no plan yet (call c:plan first)", 2) end
  local o = self.plan_opts or {}
  if o.plan then
    error(string.format("the plan given cannot hold %d KV positions, and a given plan is not replaced (leave out --plan, "
      .. "or give one for a longer --plan-positions)", positions), 0)
  end
  local opts = {}
  for k, v in pairs(o) do opts[k] = v end
  opts.plan_positions, opts.keep_requests = positions, true
  -- the scheduler decides first: a failure there leaves every device on its plan (the draft's
  -- rows give way before it fails: fit_draft_rows)
  local k = opts.draft ~= nil and opts.draft ~= "none" and request_draft.plan_rows(policy.load("draft", opts.draft), opts.draft_tokens) or 0
  k = self:draft_rows_asked(opts, k)
  local floor = k > 0 and not opts.draft_tokens and request_draft.MAX or nil
  local ok, chosen = pcall(fit_draft_rows, k, function(rows)
    local c = { sizes = self:plan_sizes(opts, rows) }
    c.problem = self:problem(opts, c.sizes)
    c.plan, c.estimate, c.info = policy.plan(c.problem, { scheduler = opts.scheduler, cost = opts.cost })
    return c
  end, floor)
  if not ok then error(string.format("no plan holds %d KV positions: %s", positions, tostring(chosen)), 0) end
  opts.plan_chosen = chosen
  self.lending = nil
  self:plan(opts)
  opts.plan_chosen = nil
end

-- Change the emulated link i (from device i to the next; emulated where it arrives) while
-- requests run: rate ("100mbit", bytes/s) and delay_ms (nil: as it was). No reply.
function Planner:set_link(i, rate, delay_ms)
  local devices = self.c.registry.devices
  local N = #devices
  if not devices[i] then error(string.format("set_link: link %s is not one of %d", tostring(i), N), 2) end
  if rate ~= nil and not transport.parse_rate(rate) then error("set_link: '" .. tostring(rate) .. "' is not a rate such as 100mbit", 2) end
  self.c.rpc:tell(i % N + 1, { kind = "LINK", payload = json.encode({ rate = rate, delay_ms = delay_ms }) })
  self.link_now = self.link_now or {}
  self.link_now[i] = { rate = rate, delay_ms = delay_ms }
end

-- The set of devices changed (a loss, a join, a leave): what was lent and the links set live
-- are forgotten (the new plan sends every device its part and its planned link).
function Planner:new_set() self.lending, self.link_now = nil, nil end

-- What loip.engine.request.online needs of each device (loip.engine.device_state): its memory
-- outside the KV cache, from the last PLAN or CHANGE reply; its stages and block sizes.
function Planner:online_devices()
  local out = {}
  for i, d in ipairs(self.c.registry.devices) do
    local m = d.mem_state or {}
    local e = self.estimate and self.estimate.devices and self.estimate.devices[i]
    out[i] = engine.device_state { stages = self.plan_table.devices[i].stages, limit = m.limit or d.mem or 0, nonkv = m.nonkv,
      kv_base = m.kv_base, group_bytes = m.group_bytes, slot_bytes = m.slot_bytes, block_bytes = self.sizes.block_bytes, sizes = self.sizes,
      -- KV lending: what device i lends (holder, groups per request) and the staging buffer it
      -- keeps (the largest stage blob so far)
      lend = self.lending and self.lending[i], staging_bytes = d.lend_staging, idle_ms = e and e.idle_ms }
  end
  return out
end

-- The rate each link is emulated at now (bytes/s; nil: not emulated), known at the head
-- without asking.
function Planner:link_rates()
  local out = {}
  local planned = self.plan_opts and self.plan_opts.link and self.plan_opts.link.rate
  for i = 1, #self.c.registry.devices do
    local now = (self.link_now or {})[i]
    local rate = now and now.rate or (type(planned) == "table" and planned[i] or planned)
    out[i] = rate and transport.parse_rate(rate) or nil
  end
  return out
end

-- Plan options opts for the set without the devices gone[i]: the options given per device lose
-- those entries; a plan given for the old set no longer applies; running requests are kept.
function Planner.opts_without(opts, gone)
  local function drop(t)
    if type(t) ~= "table" then return t end
    local o = {}
    for i, v in ipairs(t) do if not gone[i] then o[#o + 1] = v end end
    return o
  end
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  o.slowdown, o.disk_rate, o.plan, o.keep_requests = drop(o.slowdown), drop(o.disk_rate), nil, true
  if type(o.link) == "table" then
    o.link = { rate = drop(o.link.rate), delay_ms = drop(o.link.delay_ms), spin_us = o.link.spin_us }
  end
  if o.profile then
    local pr = type(o.profile) == "string" and profile.load(o.profile) or o.profile
    if pr.devices then
      local q = {}
      for k, v in pairs(pr) do q[k] = v end
      q.devices = drop(pr.devices)
      pr = q
    end
    o.profile = pr
  end
  return o
end

-- Plan options opts for the set with one more device (appended): a plan given for the old set
-- no longer applies; per-device values given as lists leave the newcomer at the defaults.
function Planner.opts_with_newcomer(opts)
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  o.plan, o.keep_requests = nil, true
  local pr = o.profile
  if type(pr) == "string" then pr = profile.load(pr) end
  if type(pr) == "table" and pr.devices then
    error("the cluster was planned with --profile of one profile per device: a device that joins has none "
      .. "(give one device's profile, used for all, or none, to admit joins)", 0)
  end
  return o
end

return M
