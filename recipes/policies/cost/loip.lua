-- cost model "loip": the time of one decoding step of a plan, per device and in all, from the
-- problem's measured figures (docs/planning.md, "The cost model"; the paper's Sec. III-B).
--
--   T        = T_comp + T_comm + T_uncover
--   T_comp   = sum_i comp_i                 compute of every device's blocks (and the ends)
--   T_comm   = the hops of one step          (S*N - 1 hidden states around the ring, the token
--                                             back to the head and into device 1)
--   T_idle_i = (comp_i - overlap-less part)/S + sum_{j != i} comp_j / S + T_comm / S
--   T_uncover= max_i max(0, load_i - S * T_idle_i)
--
-- Device i reads its next stage's offloaded blocks while its own resident blocks, every other
-- device and the links work (its idle window per stage); with one slot it cannot read while it
-- computes the blocks it has just read (they occupy the slot), with a ring of two stages it can.
-- Algebra turns this into the form the DP scheduler relies on:
--
--   T = max( sum_i comp_i + T_comm,  max_i serial_i ),  serial_i = load_i (+ its offloaded compute)
--
-- device() gives comp_i and serial_i of one device's part, comm() T_comm, closed() the whole
-- formula from them: what a scheduler that searches device by device minimises
-- (recipes/policies/scheduler/loip.lua). It takes every stage of a device as the average of its
-- stages. estimate(), which every scheduler and report judges by, plays the same figures out
-- stage by stage, with each read's own window; for plans whose stages are alike the two agree.
-- A plan whose stages read when they start (prefetch = false: the conventional pipeline) hides
-- nothing: its loads add up.
--
-- From the problem (loip.plan.problem): per device compute.{mha_ms, mlp_ms, head_ms, embed_ms,
-- stage_ms, under_load} (ms of one block at the problem's batch and context; under_load: how
-- much slower compute is while the device's disk streams), disk_bps, disk_shared_bps (local
-- devices sharing one disk: each one's rate with k reading, see M.estimate), load_ms (a read's fixed
-- cost), slowdown (stages take that many times as long, as `--slowdown` makes them); per link
-- rate_bps, delay_ms, transport_ms; head.{in_process, step_ms, to_first, from_last}.
local plan = require "loip.plan"
local space = require "loip.plan.space"

local M = { name = "loip" }

-- comp_ms, load_ms, serial_ms, offloaded_ms of device i's part (loip.plan.device_part).
function M.device(problem, i, part)
  local d = problem.devices[i]
  local c = d.compute
  local reads = part.off_mha + part.off_mlp > 0
  local f = (reads and (c.under_load or 1) or 1) * (d.slowdown or 1)
  local offloaded = (part.off_mha * c.mha_ms + part.off_mlp * c.mlp_ms) * f
  local comp = (part.n_mha * c.mha_ms + part.n_mlp * c.mlp_ms) * f + part.S * (c.stage_ms or 0)
    + (part.embed and (c.embed_ms or 0) or 0)
  -- (the embedding's rows and the head's table read from disk, when the plan keeps them there:
  -- on the step's path, the head's chunks each read while the one before computes)
  local embed_read, head_read, chunks = plan.ends.read_ms(problem, i, part, space.read_ms)
  local head_ms = (c.head_ms or 0) * plan.ends.head_fraction(problem.model, part.ends or problem.ends, i, #problem.devices)
  comp = comp + embed_read + plan.ends.pipelined(head_ms, head_read, chunks)
  -- (a mixture of experts: its offloaded MLP blocks' routed experts are read too, one by one)
  local xbytes, xreads = plan.expert_reads(problem.model, part, problem.micro_batch, problem.routing)
  local load = reads and (space.read_ms(d, part.off_bytes, part.loads) + space.expert_read_ms(d, xbytes, xreads, part.off_moe))
    or 0
  if part.prefetch == false then
    -- nothing is read ahead: every read is waited for, and the step waits for every device
    return { comp_ms = comp + load, load_ms = load, serial_ms = 0, offloaded_ms = offloaded, exposed_ms = load }
  end
  return { comp_ms = comp, load_ms = load, serial_ms = part.ring and load or load + offloaded, offloaded_ms = offloaded,
    exposed_ms = 0 }
end

-- ms of one message of bytes over link l (rate 0: unlimited).
local function hop(l, bytes)
  if not l then return 0 end
  return (l.transport_ms or 0) + ((l.rate_bps or 0) > 0 and bytes / l.rate_bps * 1e3 or 0) + (l.delay_ms or 0)
end

-- T_comm of a step with S stages per device, and each device's share (the hops it sends).
function M.comm(problem, S, p)
  local N, m = #problem.devices, problem.model
  local per = {}
  for i = 1, N do per[i] = 0 end
  if problem.head and problem.head.in_process then return 0, per end
  local batch = problem.micro_batch or 1
  local hidden = m.header_bytes + batch * m.hidden_bytes
  local total = 0
  if N > 1 then
    for i = 1, N do
      -- device i sends to the next one once a stage; the last device's last stage goes to the head
      per[i] = (i < N and S or S - 1) * hop(problem.links[i], hidden)
      total = total + per[i]
    end
  end
  local h = problem.head or {}
  local token = m.header_bytes + (m.token_bytes or 4) * batch
  local back = hop(h.from_last, m.header_bytes + (m.output_bytes or 4) * batch) -- the sampled ids to the head
  per[N] = per[N] + back
  total = total + back + hop(h.to_first or problem.links[N], token) + (h.step_ms or 0)
  -- (a head cut across devices: its LOGITS message once round the ring, loip.plan.ends)
  local ends = p and plan.ends.of(p) or problem.ends
  if ends and ends.head_shares and N > 1 then
    local logits = m.header_bytes + batch * ((m.hidden_bytes or 0) + 4 * (m.vocab or 0))
    for i = 1, N do
      per[i] = per[i] + hop(problem.links[i], logits)
      total = total + hop(problem.links[i], logits)
    end
  end
  return total, per
end

-- What bounds a step that no device's loading holds up (that is "load", with its bottleneck
-- device): the largest part of its time, "compute" (the devices' blocks and the ends),
-- "communication" (the hops: a slow link, not the devices' work) or "load" (reads waited for
-- as they come: plans that read nothing ahead).
function M.bound(comp_ms, comm_ms, uncover_ms)
  if uncover_ms > comp_ms and uncover_ms > comm_ms then return "load" end
  return comm_ms > comp_ms and "communication" or "compute"
end

-- The closed form of plan p (what the DP scheduler minimises): { ms_per_token, comp_ms,
-- comm_ms, uncover_ms, bound ("compute" | "communication" | "load": M.bound), bottleneck (the
-- device whose loading bounds the step, if any), devices = { { comp_ms, load_ms, uncover_ms,
-- comm_ms, idle_ms, serial_ms, memory_bytes }, ... } }. Every stage of a device is taken as the average of its stages: exact
-- when they are alike (the DP's templates), a lower bound otherwise.
function M.closed(p, problem)
  local N, S = #p.devices, #p.devices[1].stages
  local comm, per = M.comm(problem, S, p)
  local devs, comp, exposed = {}, 0, 0
  for i = 1, N do
    local part = plan.device_part(p, i, problem.model)
    local t = M.device(problem, i, part)
    t.memory_bytes = space.memory(problem, part).total
    t.comm_ms = per[i]
    devs[i] = t
    comp = comp + t.comp_ms
    exposed = exposed + t.exposed_ms
  end
  local A = comp + comm
  local T, bottleneck = A, nil
  for i, t in ipairs(devs) do
    -- the window per stage in which device i's reads are hidden, and what they overrun it by
    local own = t.comp_ms - (t.serial_ms - t.load_ms) - t.exposed_ms
    t.idle_ms = (own + (comp - t.comp_ms) + comm) / S
    t.uncover_ms = math.max(0, t.serial_ms - A) + t.exposed_ms
    t.comp_ms = t.comp_ms - t.exposed_ms
    if t.serial_ms > T then T, bottleneck = t.serial_ms, i end
  end
  return { ms_per_token = T, comp_ms = comp - exposed, comm_ms = comm, uncover_ms = T - A + exposed,
    bound = bottleneck and "load" or M.bound(comp - exposed, comm, T - A + exposed), bottleneck = bottleneck, devices = devs, stages = S }
end

-- Device i of plan p (d) as the timeline plays it: per stage its offloaded compute, resident
-- compute and each offloaded block's read (at rate bytes/s: rates[i], else its disk_bps), and
-- its lanes' state (disk, the slot's live reads) and totals.
local function timeline_device(p, problem, rates, i, d)
  local sizes = problem.model
  local part = plan.device_part(p, i, sizes)
  local c = problem.devices[i].compute
  local reads = part.off_mha + part.off_mlp > 0
  local f = (reads and (c.under_load or 1) or 1) * (problem.devices[i].slowdown or 1)
  local rate, fixed = rates and rates[i] or problem.devices[i].disk_bps, problem.devices[i].load_ms or 0
  local embed_read, head_read, head_chunks = plan.ends.read_ms(problem, i, part, space.read_ms)
  local x = { part = part, stages = {}, disk = 0, live = {}, cap = part.slot_bytes, slots = part.slots,
    embed_read = embed_read, head_read = head_read, head_chunks = head_chunks,
    comp = 0, load = 0, stall = 0, windows = 0, last_release = nil, per_block = p.per_block, prefetch = p.prefetch ~= false }
  -- (a mixture of experts: an offloaded MLP block's expected expert reads, with the block)
  local xbytes, xreads = plan.expert_reads(sizes, part, problem.micro_batch, problem.routing)
  -- (as the block's read time: its experts' at their own rate, folded into its bytes at the disk's)
  local xms = space.expert_read_ms(problem.devices[i], xbytes, xreads, part.off_moe)
  x.expert_bytes = (part.off_moe or 0) > 0 and xms / 1e3 * rate / part.off_moe or 0
  for s, st in ipairs(d.stages) do
    local y = { off = 0, res = c.stage_ms or 0, bytes = 0, blocks = {} }
    for b = st.blocks[1], st.blocks[2] do
      local ms = (b % 2 == 0 and c.mha_ms or c.mlp_ms) * f
      if b - st.blocks[1] < (st.offloaded or 0) then
        local bytes = sizes.block_bytes[b] + (b % 2 == 1 and x.expert_bytes or 0)
        y.off, y.bytes = y.off + ms, y.bytes + bytes
        y.blocks[#y.blocks + 1] = { read = bytes / rate * 1e3 + fixed, ms = ms }
      else
        y.res = y.res + ms
      end
    end
    y.read = y.bytes > 0 and (y.bytes / rate * 1e3 + fixed) or 0
    x.stages[s] = y
  end
  return x
end

-- A stage (y) of device x with its input here at `arrive`: when it starts computing, and when
-- its offloaded blocks are computed (release); its reads on the device's disk lane. last: the
-- step whose figures are kept.
local function stage_reads(x, y, arrive, last)
  if y.bytes == 0 then return arrive, arrive end
  if x.per_block then
    -- each offloaded block read when its turn comes, then computed (a one-block slot)
    local at = arrive
    for _, blk in ipairs(y.blocks) do
      local go = math.max(at, x.disk)
      x.disk = go + blk.read
      at = x.disk + blk.ms
    end
    if last then x.stall, x.load = x.stall + (at - arrive - y.off), x.load + y.read end
    return arrive, at
  end
  -- the read: when the disk is free, the slot has room, and (without reading ahead) the
  -- stage has started
  local go = math.max(x.disk, x.prefetch and 0 or arrive)
  local j = #x.live
  if x.slots > 1 then
    -- several slots, a stage's reads each: the read x.slots back must be released
    j = j - x.slots + 1
  else
    -- one slot used as a ring, freed in read order: what is still held must fit beside it
    local live = y.bytes
    while j >= 1 and live + x.live[j].bytes <= x.cap do live, j = live + x.live[j].bytes, j - 1 end
  end
  if j >= 1 then go = math.max(go, x.live[j].release) end
  x.disk = go + y.read
  local start = math.max(arrive, x.disk)
  local release = start + y.off
  x.live[#x.live + 1] = { bytes = y.bytes, release = release }
  if last then
    x.stall, x.load = x.stall + (start - arrive), x.load + y.read
    if x.last_release then x.windows = x.windows + (arrive - x.last_release) end
  end
  x.last_release = release
  return start, release
end

-- The estimate of plan p, stage by stage: the same figures as M.closed, from a timeline of a few
-- decoding steps in which the token crosses the ring hop by hop, each device reads its stages'
-- offloaded blocks in order into its slot (a read starts when the disk is free and the slot has
-- room: a one-stage slot frees when the stage's offloaded blocks are computed, a ring of more
-- holds the next reads meanwhile), and a stage computes when its input has arrived and its
-- reads have landed. The window each read has is then the stage's own, not an average: plans
-- whose stages differ (a split that is not the same every round) are estimated as they run.
-- The last step's figures are reported (the first ones start with every read ahead). (play:
-- the timeline, each device i reading at rates[i] bytes/s when given, else at its disk_bps.)
local function play(p, problem, rates)
  local N, S = #p.devices, #p.devices[1].stages
  local sizes = problem.model
  local comm, per = M.comm(problem, S, p)
  local head = problem.head or {}
  local batch = problem.micro_batch or 1
  local hidden = sizes.header_bytes + batch * sizes.hidden_bytes
  local token = sizes.header_bytes + (sizes.token_bytes or 4) * batch
  local dev = {}
  for i, d in ipairs(p.devices) do dev[i] = timeline_device(p, problem, rates, i, d) end
  local steps, t, ends = 4, 0, {}
  for step = 1, steps do
    local last = step == steps
    for s = 1, S do
      for i = 1, N do
        local x, y = dev[i], dev[i].stages[s]
        local arrive = t
        local start, release = stage_reads(x, y, arrive, last)
        local finish = release + y.res + ((i == 1 and s == 1) and (problem.devices[1].compute.embed_ms or 0) + x.embed_read or 0)
        if last then x.comp = x.comp + (finish - start) end
        t = finish
        if s < S or i < N then t = t + (N > 1 and hop(problem.links[i], hidden) or 0) end
      end
    end
    -- the head, the sampled id to the head process, the next token into device 1
    -- (cut across devices: each share in ring order and the LOGITS hops, loip.plan.ends.step_ms)
    t = t + plan.ends.step_ms(problem, p, batch, function(i) return problem.devices[i].compute.head_ms or 0 end,
      function(i, bytes) return N > 1 and hop(problem.links[i], bytes) or 0 end, space.read_ms)
    if not head.in_process then t = t + hop(head.from_last, token) + (head.step_ms or 0) + hop(head.to_first or problem.links[N], token) end
    ends[step] = t
  end
  local T = ends[steps] - ends[steps - 1]
  local devs, comp, bottleneck, most = {}, 0, nil, 0
  for i, x in ipairs(dev) do
    local c = x.comp - (x.per_block and x.load or 0)
      + (i == N and plan.ends.pipelined(problem.devices[N].compute.head_ms or 0, x.head_read, x.head_chunks) or 0)
    devs[i] = { comp_ms = c, load_ms = x.load, uncover_ms = x.stall, comm_ms = per[i], idle_ms = x.windows / S,
      memory_bytes = space.memory(problem, x.part).total }
    comp = comp + c
    if x.stall > most then most, bottleneck = x.stall, i end
  end
  local uncover = math.max(0, T - comp - comm)
  return { ms_per_token = T, comp_ms = comp, comm_ms = comm, uncover_ms = uncover,
    bound = (bottleneck and most > 0.01 * T) and "load" or M.bound(comp, comm, uncover), bottleneck = (most > 0.01 * T) and bottleneck or nil,
    devices = devs, stages = S }
end

-- Each reader's rate of a shared disk (rates by how many read at once, 1 .. n) with k reading,
-- k fractional: between the two counts either side.
local function rate_with(by, k)
  k = math.max(1, math.min(#by, k))
  local lo = math.floor(k)
  return lo >= #by and by[#by] or by[lo] + (by[lo + 1] - by[lo]) * (k - lo)
end

-- Shipping's one-off cost (blocks sent to workers that keep a cache instead of a store,
-- loip.cluster.ship): the bytes of the files device i's part reads (every block of its stages,
-- resident or offloaded, a mixture of experts' MLP with its experts; the embedding on device 1,
-- and on device N with a tied head; the head on device N), as an empty cache lacks them, less
-- problem.devices[i].held_bytes when known; sent one device after another, each over the link
-- into it (problem.ship_rate_bps instead when given; a link of rate 0 is not priced).
-- Returns bytes per device and the milliseconds of it all.
function M.ship(p, problem)
  local m, N, bytes, ms = problem.model, #p.devices, {}, 0
  for i, dev in ipairs(p.devices) do
    local n = 0
    for _, st in ipairs(dev.stages) do
      for b = st.blocks[1], st.blocks[2] do n = n + (m.res_bytes and m.res_bytes[b] or m.block_bytes[b] or 0) end
    end
    if i == 1 or (i == N and m.tied) then n = n + (m.embed_file_bytes or 0) end
    if i == N then n = n + (m.head_file_bytes or 0) end
    n = math.max(0, n - ((problem.devices[i] or {}).held_bytes or 0))
    bytes[i] = n
    local link = problem.links and problem.links[(i - 2) % N + 1]
    local rate = problem.ship_rate_bps or (link and link.rate_bps) or 0
    if rate > 0 then ms = ms + n / rate * 1000 end
  end
  return bytes, ms
end

-- The estimate of plan p: ms_per_token and its parts, per device, and shipping's one-off cost
-- beside them (ship_bytes per device, ship_ms: M.ship).
function M.estimate(p, problem)
  local est = M.step_estimate(p, problem)
  local bytes, ms = M.ship(p, problem)
  for i, d in ipairs(est.devices) do d.ship_bytes = bytes[i] end
  est.ship_ms = ms
  return est
end

function M.step_estimate(p, problem)
  local est = play(p, problem)
  -- Local devices sharing one disk (disk_shared_bps): disk_bps is each one's rate with all of
  -- them reading at once; each read is rather at the rate of itself and the others' share of the
  -- step they spend reading (a fixed point, a few rounds from there). The rates it ends at are
  -- est.read_bps[i] (every device's; the DP scheduler plans again at them).
  local shared = {}
  for i, d in ipairs(problem.devices) do if d.disk_shared_bps then shared[#shared + 1] = i end end
  if #shared < 2 or not (est.ms_per_token > 0) then return est end
  local rates
  for _ = 1, 3 do
    rates = {}
    for _, i in ipairs(shared) do
      local k = 1
      for _, j in ipairs(shared) do
        if j ~= i then k = k + math.min(1, est.devices[j].load_ms / est.ms_per_token) end
      end
      rates[i] = rate_with(problem.devices[i].disk_shared_bps, k)
    end
    est = play(p, problem, rates)
  end
  est.read_bps = {}
  for i, d in ipairs(problem.devices) do est.read_bps[i] = rates[i] or d.disk_bps end
  return est
end

return M
