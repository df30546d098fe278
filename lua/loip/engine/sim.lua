-- The simulator's engine (loip.engine's interface; loip.sim plays requests through it): a plan
-- played out over time on devices described by profiles, with no weights and no workers. It is
-- an engine of loip.engine.request.batcher (the request loop the runtime runs), so requests are admitted,
-- prefilled in chunks beside the others' decoding, batched and retired exactly as on devices, by
-- the same code; only the time a step takes is simulated.
--
-- A step is a timeline over each device's lanes, as the runtime runs it: its token batch
-- crosses the ring hop by hop (device i's stage s when its input has arrived over the link, a
-- serial wire of the link's rate plus its delay and the transport's per-message time); each
-- device reads its stages' offloaded blocks in order into its slot, a read starting when its
-- disk is free and the slot has room (a one-stage slot frees when the stage's offloaded blocks
-- are computed, a ring of two stages' holds the next read meanwhile), across steps; a stage
-- computes when its input and its reads are there, its blocks timed by the device's profile at
-- the step's batch and context (compute while the disk streams slowed by the profile's
-- under_load); the last device's sampled ids go to the head and the next tokens into device 1.
-- The memory the plan charges each device is checked against its budget as the devices check it
-- when they load the plan. With plan_positions (fewer KV positions planned than the requests
-- take) the KV cache is charged as the contexts grow, after every step, and an online policy
-- (loip.engine.request.online, the runtime's: restage, lend, evict) makes room as on devices; a device
-- past its budget stops the step with an error naming it, as a device's charge fails. KV lent
-- to a holder travels: a stage's blob goes to the holder after the stage runs, over the wire into
-- it, and is asked back when the lender's stage before it ends, over the wire into the lender; the
-- stage waits for it. Speculative decoding (loip.sim.draft): a step's draft rows are priced with
-- its other rows and verified against the filler id the simulated target samples (the accepted
-- drafts, then one more); step_price(rows) is the cost model's price of a step of that many rows.
local plan = require "loip.plan"
local profile = require "loip.plan.profile"
local space = require "loip.plan.space"
local engine = require "loip.engine"
local online = require "loip.engine.request.online"
local transport = require "loip.runtime.transport"
local memory_mod = require "loip.runtime.memory"
local flags_mod = require "loip.ui.flags"
local experts_mod = require "loip.sim.experts"

local M = {}

M.KV_BLOCK = require("loip.constants").KV_BLOCK_TOKENS -- positions per KV group
local SAMPLE, DRAFT = require("loip.constants").tokf.SAMPLE, require("loip.constants").tokf.DRAFT
local bit = require "bit"
M.FILLER = 3 -- the id every sampled row gives (the simulator computes no text)

local Sim = {}
Sim.__index = Sim

-- ms of one message of bytes on link l whose wire is free at `free` (ms), ready at t: the time
-- it arrives and when the wire is free again.
local function send(l, t, bytes)
  if not l then return t, t end
  local start = math.max(t, l.free or 0)
  local wire = (l.rate_bps or 0) > 0 and bytes / l.rate_bps * 1e3 or 0
  l.free = start + wire
  return l.free + (l.delay_ms or 0) + (l.transport_ms or 0), l.free
end

-- problem: loip.plan.problem (its devices carry their profiles: problem.new keeps them); p: a
-- plan; opts: context, step_tokens (tokens a step carries), max_seqs (requests at once), kv_tokens
-- (default context x max_seqs), plan_positions (KV positions the plan's memory holds, as
-- problem.model was sized; fewer than kv_tokens: the KV cache grows inside the budgets), trace
-- (true: keep every device's events), replanner (function(plan_positions) -> problem, plan,
-- estimate: how the plan was made, for a longer context; an online policy's control.replan
-- needs it; a fourth value, the plan's logits rows), cost (the cost model step_price asks; default
-- loip), draft (loip.sim.draft: a draft whose memory its device's budget holds beside the plan's),
-- logits_tokens (the plan's logits rows: a draft's reserved, Sim:set_rows; without it 1, and a
-- step's drafts bounded by its tokens alone).
function M.new(problem, p, opts)
  opts = opts or {}
  -- the memory each device's part needs, against its budget (as a device refuses a plan)
  engine.check_plan(p, problem, "plan", "simulate")
  local dr = opts.draft
  for i, d in ipairs(problem.devices) do
    local extra = dr and dr:bytes_on(i) or 0
    if extra > 0 and (d.budget or 0) > 0 then
      local need = plan.memory(p, i, problem.model, space.memory_opts(problem)).total + extra
      if need > d.budget then
        local fmt = memory_mod.format_bytes
        error(string.format("simulate: device %d needs %s for the plan and the draft (%s: %s) but its budget is %s", i, fmt(need, d.budget),
          dr.what, fmt(extra), fmt(d.budget, need)), 0)
      end
    end
  end
  for i, d in ipairs(problem.devices) do
    if not d.profile then error(string.format("simulate: device %d has no profile (loip.plan.problem keeps them)", i), 0) end
  end
  local self = setmetatable({ problem = problem, plan = p, now_ms = 0, trace = opts.trace, steps = 0, cost = opts.cost, draft = dr }, Sim)
  self.clock = function() return self.now_ms end
  self.context = opts.context or problem.context or problem.model.context
  self.step_tokens = opts.step_tokens or problem.batch or 64
  self.max_seqs = opts.max_seqs or 1
  self.kv_block = M.KV_BLOCK
  self.kv_tokens = opts.kv_tokens or self.context * self.max_seqs
  self.logits_tokens = 1
  if opts.logits_tokens then self:set_rows(opts.logits_tokens) end
  self.vocab = problem.model.vocab or 32000
  self.plan_positions = math.min(flags_mod.renamed(opts, "kv_plan_tokens", "plan_positions", "sim.new")
    or self.kv_tokens, self.kv_tokens)
  self.kv_grows = self.plan_positions < self.kv_tokens
  self.replanner = opts.replanner
  self.estimate = opts.estimate -- the cost model's (an online policy reads each device's idle window)
  self.conventional_loads = opts.conventional_loads -- (the ablation of the paper's UMA-aware loading)
  -- one 16-position group of one layer's keys and values (F32), per request
  local sh = problem.shape
  self.chunk_bytes = 2 * sh.n_kv_heads * sh.head_dim * 4 * M.KV_BLOCK
  self.lending = {}
  self.links = {}
  for i, l in ipairs(problem.links) do
    self.links[i] = { rate_bps = l.rate_bps, delay_ms = l.delay_ms, transport_ms = l.transport_ms, free = 0 }
  end
  local h = problem.head or {}
  self.head = { in_process = h.in_process, step_ms = h.step_ms or 0,
    from_last = h.from_last and { rate_bps = h.from_last.rate_bps, delay_ms = h.from_last.delay_ms, transport_ms = h.from_last.transport_ms, free = 0 } }
  self.devices = {}
  for i in ipairs(p.devices) do self.devices[i] = { disk = 0, live = {}, events = {}, comp_ms = 0, load_ms = 0, stall_ms = 0, send_ms = 0 } end
  self:restaged()
  return self
end

-- The rows of a step the plan holds, as the ring's (loip.engine.ring): logits_tokens (rows whose
-- logits come back: a plan made for a draft reserves its rows, loip.cluster.planner's
-- fit_draft_rows) and sample_rows (rows the last device samples in one step: its out_cap).
function Sim:set_rows(logits_tokens)
  self.logits_tokens = logits_tokens
  self.sample_rows = math.min(self.step_tokens, math.max(logits_tokens, self.max_seqs))
end

-- Device i's figures that follow from the plan (its part, its stages' blocks and reads).
function Sim:restaged()
  local sizes = self.problem.model
  self.prices = nil -- (step_price's, of the plan before)
  for i, d in ipairs(self.plan.devices) do
    local x = self.devices[i]
    x.part = plan.device_part(self.plan, i, sizes)
    x.stages = {}
    x.kv_layers = 0
    for s, st in ipairs(d.stages) do
      local y = { first = st.blocks[1], last = st.blocks[2], off = st.offloaded or 0, bytes = 0,
        kv_layers = plan.stage_kv_layers(st, sizes) }
      for b = y.first, y.first + y.off - 1 do y.bytes = y.bytes + sizes.block_bytes[b] end
      -- (a mixture of experts: the offloaded MLP blocks' layers, whose routed experts it reads)
      y.moe_layers = {}
      for b = y.first + 1 - y.first % 2, y.first + y.off - 1, 2 do
        if sizes.moe then y.moe_layers[#y.moe_layers + 1] = (b - 1) / 2 end
      end
      x.stages[s] = y
      x.kv_layers = x.kv_layers + y.kv_layers
    end
    -- memory outside the KV cache (the plan's charge less its KV), and a group's bytes
    local m = plan.memory(self.plan, i, sizes, space.memory_opts(self.problem))
    x.nonkv, x.slot_bytes = m.total - m.kv + (self.draft and self.draft:bytes_on(i) or 0), m.slot_bytes
    -- (sliding-window layers' rings: KV that does not grow, held from the start)
    for _, st in ipairs(d.stages) do x.nonkv = x.nonkv + plan.stage_ring_bytes(st, sizes) end
    x.group_bytes = x.kv_layers * self.chunk_bytes
    if sizes.moe and (x.part.off_moe or 0) > 0 then
      -- (a cache of the same size keeps what it holds through a restage, as the runtime's does)
      if not (x.experts and x.experts.slots == x.part.expert_slots) then
        x.experts = experts_mod.new { experts = sizes.moe.experts, used = sizes.moe.used,
          slots = x.part.expert_slots, routing = self.problem.routing, seed = i }
      end
    else
      x.experts = nil
    end
  end
end

-- ms of block kind on device i for a batch of n tokens at context ctx (its profile, slowdown,
-- and compute slowed while its disk streams).
function Sim:block_ms(i, kind, n, ctx)
  local d = self.problem.devices[i]
  local f = (d.slowdown or 1) * ((self.devices[i].part.off_bytes > 0) and (d.compute.under_load or 1) or 1)
  return profile.block_ms(d.profile, kind, n, ctx, self.problem.shape) * f
end

local function event(x, on, kind, stage, first, last, t0, t1)
  if on and t1 > t0 then
    x.events[#x.events + 1] = { kind = kind, stage = stage, first_block = first, last_block = last + 1,
      t0_ns = math.floor(t0 * 1e6), t1_ns = math.floor(t1 * 1e6) }
  end
end

-- ---- the engine the batcher drives -----------------------------------------------------------

function Sim:start() end
function Sim:finish() end

-- The ms device i's stage s (y) computes at a batch of n tokens and context ctx: its offloaded
-- blocks' and its resident ones' (with the embedding on the first stage of device 1).
function Sim:stage_ms(i, s, y, n, ctx)
  local off_ms, res_ms = 0, 0
  for b = y.first, y.last do
    local ms = self:block_ms(i, b % 2 == 0 and "mha" or "mlp", n, ctx)
    if b - y.first < y.off then off_ms = off_ms + ms else res_ms = res_ms + ms end
  end
  if i == 1 and s == 1 then
    -- (an embedding kept on disk: the step's rows read first, loip.plan.ends)
    local rows_ms = plan.ends.read_ms(self.problem, i, self.devices[i].part, space.read_ms, n)
    res_ms = res_ms + (self.problem.devices[1].compute.embed_ms or 0) + rows_ms
  end
  return off_ms, res_ms
end

-- Device i's stage s (y), its input here at `arrive`: its offloaded blocks read into the slot
-- (and xread ms of experts after them), on the device's disk lane. When it starts, and when its
-- offloaded blocks are computed (release).
function Sim:stage_reads(i, s, y, arrive, off_ms, xread)
  if y.bytes == 0 then return arrive, arrive end
  local x, tr = self.devices[i], self.trace
  local d = self.problem.devices[i]
  local read = space.read_ms(d, y.bytes, 1)
  if self.conventional_loads then
    -- the conventional path (read into a buffer, parse, copy to where the kernels read):
    -- the bytes cross memory twice more, at the rate its matrix-vector products stream it
    read = read + 2 * y.bytes * profile.block_ms(d.profile, "mlp", 1, 1, { mlp_bytes = 1 })
  end
  -- (a plan that does not read ahead, or reads block by block when each block's turn
  -- comes, the conventional pipeline's: nothing before the stage starts)
  local ahead = self.plan.prefetch ~= false and not self.plan.per_block
  local go = math.max(x.disk, ahead and 0 or arrive)
  -- the slot: one stage's reads (freed as the stage computes them), or a ring that holds
  -- the next read beside the one being computed
  local j = #x.live
  if x.part.slots > 1 then
    j = j - x.part.slots + 1
  else
    local live = y.bytes
    while j >= 1 and live + x.live[j].bytes <= x.part.slot_bytes do live, j = live + x.live[j].bytes, j - 1 end
  end
  if j >= 1 then go = math.max(go, x.live[j].release) end
  x.disk = go + read
  event(x, tr, "load", s, y.first, y.first + y.off - 1, go, x.disk)
  x.load_ms = x.load_ms + read
  local start = math.max(arrive, x.disk)
  local release = start + off_ms
  if xread > 0 then -- the experts' reads, after the block's; the stage computes what it has meanwhile
    local go2 = math.max(x.disk, arrive)
    event(x, tr, "load", s, y.first, y.first + y.off - 1, go2, go2 + xread)
    x.disk, x.load_ms = go2 + xread, x.load_ms + xread
    release = math.max(release, x.disk)
  end
  x.live[#x.live + 1] = { bytes = y.bytes, release = release }
  while #x.live > 8 do table.remove(x.live, 1) end
  x.stall_ms = x.stall_ms + (start - arrive)
  event(x, tr, "wait", s, y.first, y.last, arrive, start)
  return start, release
end

-- Device i's stage s with its input here at t, in a step of n tokens (samples sampled) at
-- context ctx: its reads, waits for lent KV, compute and the send of its hidden state (hidden
-- bytes) on. The time its output leaves.
function Sim:run_stage(i, s, t, n, ctx, samples, hidden)
  local N, S = #self.plan.devices, #self.plan.devices[1].stages
  local tr = self.trace
  local x, y = self.devices[i], self.devices[i].stages[s]
  local arrive = t
  local off_ms, res_ms = self:stage_ms(i, s, y, n, ctx)
  -- (a mixture of experts: the experts the router picks that the cache lacks are read once the
  -- stage's input is here, pre-gating's time, after what the disk reads before them)
  local xread = 0
  if x.experts and #y.moe_layers > 0 then
    local reads = x.experts:step(y.moe_layers, n)
    xread = space.expert_read_ms(self.problem.devices[i], reads * self.problem.model.moe.expert_bytes, reads, #y.moe_layers)
  end
  local start, release = self:stage_reads(i, s, y, arrive, off_ms, xread)
  -- lent KV: the stage's blob must be back before it runs
  local blob = self:blob_bytes(i, s)
  if blob > 0 and x.back and x.back[s] and x.back[s] > start then
    event(x, tr, "wait", s, y.first, y.last, start, x.back[s])
    x.lend_wait_ms = (x.lend_wait_ms or 0) + (x.back[s] - start)
    release, start = release + (x.back[s] - start), x.back[s]
  end
  local finish = release + res_ms
  if i == N and s == S then
    local ends = plan.ends.of(self.plan) or self.problem.ends
    if ends and ends.head_shares and N > 1 then
      -- (a head cut across devices: each share in ring order, its read and compute, the LOGITS
      -- message over each link; loip.plan.ends)
      local sizes = self.problem.model
      local bytes = sizes.header_bytes + math.max(samples, 1) * (sizes.hidden_bytes + 4 * sizes.vocab)
      local t = finish
      for k = 0, N - 1 do
        local j = (N - 1 + k) % N + 1
        local _, head_read, chunks = plan.ends.read_ms(self.problem, j, self.devices[j].part, space.read_ms)
        local head_ms = self:block_ms(j, "head", math.max(samples, 1), ctx) * plan.ends.head_fraction(sizes, ends, j, N)
        t = t + plan.ends.pipelined(head_ms, head_read, chunks)
        t = send(self.links[j], t, bytes)
      end
      finish = t
    else
      -- (a head kept on disk: its table read chunk by chunk, each chunk's logits computed while
      -- the next is read, loip.plan.ends.pipelined)
      local _, head_read, chunks = plan.ends.read_ms(self.problem, i, x.part, space.read_ms)
      local head_ms = self:block_ms(N, "head", math.max(samples, 1), ctx)
      if head_read > 0 then
        local go = math.max(finish, x.disk)
        event(x, tr, "load", s, self.problem.model.n_blocks, self.problem.model.n_blocks, go, go + head_read)
        x.disk, x.load_ms = go + head_read, x.load_ms + head_read
        finish = go + plan.ends.pipelined(head_ms, head_read, chunks)
      else
        finish = finish + head_ms
      end
    end
  end
  event(x, tr, "compute", s, y.first, y.last, start, finish)
  x.comp_ms = x.comp_ms + (finish - start)
  if blob > 0 then
    -- the blob goes to the holder, and the next stage's is asked back now: it travels
    -- while the hops in between run
    local h = self.lending[i].holder
    send(self.links[(h - 2) % N + 1], finish, blob)
    local nxt = s % S + 1
    local back_bytes = self:blob_bytes(i, nxt)
    x.back = x.back or {}
    x.back[nxt] = back_bytes > 0 and (send(self.links[(i - 2) % N + 1], finish + (self.links[(h - 2) % N + 1].delay_ms or 0), back_bytes)) or nil
  end
  t = finish
  if s < S or i < N then
    local sent
    t, sent = send(self.links[i], t, hidden)
    x.send_ms = x.send_ms + (sent - finish)
    event(x, tr, "send", s, y.first, y.last, finish, t)
  end
  return t
end

-- A step's outputs: every sampled row gives the filler id; drafts after a row of their sequence
-- are verified as a greedy sampler verifies them: from the row, the first child that is the
-- filler, and on from it (a chain's child is the next row; a tree row's, one whose `parent`, the
-- rows back to its parent, points at it), then one more.
local function filler_outputs(toks)
  local n = #toks
  local outs, i = {}, 1
  while i <= n do
    local tok = toks[i]
    i = i + 1
    if tok.flags % 2 == 1 then
      local first = i -- (draft j sits at row first + j - 1; 0 is the sampled row)
      while i <= n and toks[i].seq == tok.seq and bit.band(toks[i].flags, DRAFT) ~= 0 do i = i + 1 end
      local got, node = 1, 0
      for j = 1, i - first do
        local t = toks[first + j - 1]
        if j - (t.parent or 1) == node and t.id == M.FILLER then got, node = got + 1, j end
      end
      for j = 1, got do
        outs[#outs + 1] = { seq = tok.seq, request = tok.request, id = M.FILLER, flags = j < got and SAMPLE + DRAFT or nil }
      end
    end
  end
  return outs
end

-- One step of toks (the batcher's list): its time on the lanes; returns the outputs (a filler
-- id for each sampled token: the simulator computes no text).
function Sim:step(toks)
  self.steps = self.steps + 1
  local sizes = self.problem.model
  local N, S = #self.plan.devices, #self.plan.devices[1].stages
  local n, ctx, samples = #toks, 0, 0
  for _, t in ipairs(toks) do
    ctx = ctx + t.pos + 1
    if t.flags % 2 == 1 then samples = samples + 1 end
  end
  ctx = ctx / n
  local hidden = sizes.header_bytes + n * sizes.hidden_bytes
  local tokens_bytes = sizes.header_bytes + n * ((sizes.token_bytes or 4) + 16)
  local t = self.now_ms
  -- the tokens into device 1 (from the head process)
  if not self.head.in_process then t = send(self.links[N], t, tokens_bytes) end
  for s = 1, S do
    for i = 1, N do t = self:run_stage(i, s, t, n, ctx, samples, hidden) end
  end
  -- the sampled ids to the head
  if not self.head.in_process then
    t = send(self.head.from_last, t, sizes.header_bytes + samples * (sizes.output_bytes or 16)) + self.head.step_ms
  end
  self.now_ms = t
  if self.kv_grows then self:check_memory(toks) end
  return filler_outputs(toks)
end

-- The problem at `rows` tokens a step (loip.engine.at_rows), and the cost model's price (ms)
-- of a decoding step of that many rows on the plan: what loip.engine.request.draft chooses a draft
-- length from.
M.at_rows = engine.at_rows
function Sim:step_price(rows)
  self.prices = self.prices or {}
  return engine.step_price(self.plan, self.problem, self.cost, rows, self.prices)
end

-- KV groups each running request holds after the step of toks (its newest position's), and the
-- longest context.
function Sim:held(toks)
  local per, ctx = {}, 0
  for _, h in ipairs(online.held(self.batcher and self.batcher.running or {}, toks, M.KV_BLOCK)) do
    if h.pos >= 0 then
      per[#per + 1] = h.groups
      ctx = math.max(ctx, h.pos + 1)
    end
  end
  return per, ctx
end

-- Bytes of device i's stage s that are lent (what travels each time the stage runs).
function Sim:blob_bytes(i, s)
  local l = self.lending[i]
  if not l or not l.holder then return 0 end
  local n = 0
  for _, g in ipairs(self.held_now or {}) do n = n + math.max(0, math.min(l.groups, g - 1)) end
  return n * self.devices[i].stages[s].kv_layers * self.chunk_bytes
end

-- Each device's memory after a step (outside its KV cache, its KV less what it lends plus one
-- stage's blob, what it holds for others) against its budget: a device past it stops the step.
function Sim:check_memory(toks)
  local per, ctx = self:held(toks)
  self.held_now = per
  local G = 0
  for _, g in ipairs(per) do G = G + g end
  local mem = {}
  for i, x in ipairs(self.devices) do mem[i] = x.nonkv + x.group_bytes * G end
  for i, l in pairs(self.lending) do
    if l.holder then
      local x, lent, staging = self.devices[i], 0, 0
      for _, g in ipairs(per) do lent = lent + math.max(0, math.min(l.groups, g - 1)) end
      for s in ipairs(x.stages) do staging = math.max(staging, self:blob_bytes(i, s)) end
      mem[i] = mem[i] - lent * x.group_bytes + staging
      mem[l.holder] = mem[l.holder] + lent * x.group_bytes
    end
  end
  for i, x in ipairs(self.devices) do
    x.peak_bytes = math.max(x.peak_bytes or 0, mem[i])
    local b = self.problem.devices[i].budget or 0
    if b > 0 and mem[i] > b then
      error(string.format("device %d: out of memory at %d positions: its KV cache and plan need %.0f bytes, its budget is %.0f",
        i, ctx, mem[i], b), 0)
    end
  end
end

-- ---- what an online policy sees and changes (loip.engine.request.online) ------------------------------

function Sim:online_devices()
  local out = {}
  local est = self.estimate
  for i, x in ipairs(self.devices) do
    out[i] = engine.device_state { stages = self.plan.devices[i].stages, limit = self.problem.devices[i].budget, nonkv = x.nonkv,
      group_bytes = x.group_bytes, slot_bytes = x.slot_bytes, block_bytes = self.problem.model.block_bytes, sizes = self.problem.model,
      chunk_bytes = self.chunk_bytes, lend = self.lending[i] and self.lending[i].holder and self.lending[i],
      idle_ms = est and est.devices and est.devices[i] and est.devices[i].idle_ms }
  end
  return out
end

-- The rate of each link now (bytes/s; nil: unlimited).
function Sim:link_rates()
  local out = {}
  for i, l in ipairs(self.links) do out[i] = (l.rate_bps or 0) > 0 and l.rate_bps or nil end
  return out
end

-- Device i's stage s offloads its first n blocks from the next step on (a restage).
function Sim:restage(i, s, n)
  engine.restaged(self.plan, i, s, n) -- (checks the stage and the count)
  self.plan.devices[i].stages[s].offloaded = n -- (in place: the plan played is the plan reported)
  self:restaged()
end

-- Plan again for `positions` KV positions (an online policy's control.replan), as the cluster
-- does: the same scheduler and options (opts.replanner), the links as they are now; the
-- batcher then prefills every running request again on the new plan. (The devices' loading of
-- their new parts, before the next step, is not simulated.)
function Sim:replan_kv(positions)
  if not self.replanner then error("this simulation plays the plan it was given: it does not plan again", 0) end
  local prob, p, est, rows = self.replanner(positions)
  if rows then self:set_rows(rows) end
  self.problem, self.plan, self.estimate = prob, p, est
  self.plan_positions = positions
  self.kv_grows = positions < self.kv_tokens
  self.lending = {}
  self:restaged()
  self.replans = (self.replans or 0) + 1
end

-- Device i lends the oldest `groups` groups of every running request's KV to holder (nil: stops).
function Sim:lend(i, holder, groups)
  self.lending[i] = holder and { holder = holder, groups = type(groups) == "number" and groups or 0 } or nil
end

-- Change an emulated link as a link schedule does (rate: "100mbit" or bytes/s).
function Sim:set_link(i, rate)
  local bps = type(rate) == "number" and rate or transport.parse_rate(rate)
  if not bps then error("simulate: '" .. tostring(rate) .. "' is not a rate such as 100mbit", 0) end
  self.links[i].rate_bps = bps
end

M.Sim = Sim -- (loip.sim plays requests through it)

return M
