-- Problems: the one table a scheduler and a cost model plan from (docs/planning.md, "The
-- problem"). Built here from a model (a slice store's manifest, or a shape with no weights),
-- profiles (measured, or a calibration) and the flags; policies only read it.
--
--   problem = {
--     model   = loip.plan.sizes(...)            block bytes and files, KV bytes per layer count,
--                                               activations, the ends, hidden state and header bytes
--     devices = { { name, budget (bytes, 0: none), compute = { mha_ms, mlp_ms, head_ms, embed_ms,
--                   stage_ms, under_load }, disk_bps, disk_shared_bps (a disk local devices share:
--                   each one's rate with k of them reading, k = 1 .. n), load_ms, slowdown }, ... }
--     links   = { { rate_bps (0: unlimited), delay_ms, transport_ms }, ... }  -- device i -> the next
--     head    = { in_process, step_ms, to_first = link, from_last = link }    -- the token's way around
--     context, batch (prefill tokens per message), micro_batch (tokens per decoding step),
--     position (the context a step attends to, for compute figures), stages (a fixed S, or nil),
--     cluster (devices are workers: their message buffers count), loader ("auto" | "uring" | "buffered"),
--   }
local memory = require "loip.runtime.memory"
local plan = require "loip.plan"
local profile = require "loip.plan.profile"
local space = require "loip.plan.space"
local shape = require "loip.plan.shape"
local store = require "loip.model.store"
local synth = require "loip.model.synth"
local hf = require "loip.model.hf"
local slice = require "loip.model.slice"

local M = {}

local fmt = memory.format_bytes

M.dense_equivalent, M.shape_of = shape.dense_equivalent, shape.shape_of -- (loip.plan.shape)

-- The model side of a problem for a slice store: sizes, the Hugging Face config, the runtime's
-- config, the dtype. opts: context, batch, threads, logits_tokens.
function M.model_of_store(dir, opts)
  local man = store.read_manifest(dir)
  local c = store.config(dir, man)
  return plan.sizes(man, c, opts), man.config, c, store.layer_dtype(man), man
end

-- The same for a named shape with no weights (loip synth's shapes; overrides as its flags:
-- layers, dim, ffn, heads, kv_heads, head_dim, vocab), laid out as `loip slice` would lay out
-- its store. opts as model_of_store, plus dtype ("bf16").
function M.model_of_shape(name, overrides, opts)
  local o = { like = name, dtype = (opts.dtype or "bf16"):lower() }
  for k, v in pairs(overrides or {}) do o[k] = v end
  local cfg = synth.config(o)
  local c = hf.parse_config(cfg, name)
  local dtype = o.dtype:upper()
  local man = { files = slice.layout_of(c, dtype, synth.experts_dtype(cfg) and "MXFP4") }
  return plan.sizes(man, c, opts), cfg, c, dtype, man
end

-- The same for a model directory or llama2.c checkpoint not sliced yet: laid out as `loip
-- slice` will lay it out. on_cfg(config table), when given, is called first (to settle opts).
function M.model_of_source(path, opts, on_cfg)
  local src = slice.open_source(path)
  local ok, files = pcall(slice.plan, src)
  src.close()
  if not ok then error(files, 0) end
  if on_cfg then on_cfg(src.config) end
  local man = { files = files }
  return plan.sizes(man, src.c, opts), src.config, src.c, store.layer_dtype(man)
end

-- A value given once or once per device (nil: none).
local function each(v, i)
  if type(v) == "table" then return v[i] end
  return v
end

-- Build a problem. o: model (sizes), shape (M.shape_of: for compute figures), n (devices),
-- budgets (bytes each; 0 none), profiles (a profile per device, or one for all), disk_rate
-- (bytes/s: once or per device; caps the profile's read rate), slowdown (once or per device),
-- link_rate (bytes/s, once or per link; 0 or nil: unlimited), link_delay_ms (once or per
-- link), link_rate_measured (per link, from a profile), cluster, in_process, stages,
-- micro_batch (1), position (default: half the context), context, batch, loader, ends ("auto",
-- the default: the planner may keep the embedding and head on disk, loip.plan.ends; "memory": not).
function M.new(o)
  local N = o.n
  if o.stages ~= nil then
    local most = math.floor(o.model.n_blocks / N)
    if type(o.stages) ~= "number" or o.stages % 1 ~= 0 or o.stages < 1 or o.stages > most then
      error(string.format("problem: stages %s: must be a whole number from 1 to %d (%d blocks on %d devices: "
        .. "each device needs a block per stage)", tostring(o.stages), most, o.model.n_blocks, N), 0)
    end
  end
  local pos = o.position or math.max(1, math.floor((o.context or o.model.context or 256) / 2))
  local mb = o.micro_batch or 1
  local p = { model = o.model, devices = {}, links = {}, context = o.context or o.model.context, batch = o.batch or o.model.batch,
    micro_batch = mb, position = pos, stages = o.stages, cluster = o.cluster or false, loader = o.loader, shape = o.shape,
    routing = o.routing, ends = o.ends == "memory" and {} or nil }
  -- one profile per device, or one for all
  local function profile_of(i) return type(o.profiles) == "table" and o.profiles[i] or o.profiles end
  for i = 1, N do
    local pr = profile_of(i)
    if type(pr) ~= "table" or not pr.compute then error(string.format("problem: device %d has no profile", i), 0) end
    local sh = o.shape
    local d = { name = "device " .. i, budget = each(o.budgets, i) or 0, slowdown = each(o.slowdown, i) or 1,
      compute = { mha_ms = profile.block_ms(pr, "mha", mb, plan.attended(o.model, pos), sh), mlp_ms = profile.block_ms(pr, "mlp", mb, pos, sh),
        head_ms = profile.block_ms(pr, "head", mb, pos, sh), embed_ms = 0, stage_ms = pr.compute.stage_ms or 0,
        under_load = pr.compute.under_load or 1 },
      load_ms = pr.disk and pr.disk.load_ms or 0, profile_host = pr.device and pr.device.host, profile = pr,
      overlap_loads = pr.disk and pr.disk.overlap_loads or false }
    local flag, measured = each(o.disk_rate, i), pr.disk and pr.disk.read_bps
    d.disk_bps = (flag and measured) and math.min(flag, measured) or flag or measured
    -- (a mixture of experts: the rate of a layer's experts read at once, when the profile measured it)
    local xm = pr.disk and pr.disk.expert_bps
    d.expert_bps = xm and (flag and math.min(flag, xm) or xm) or nil
    -- a disk this machine's local devices share: each one's rate with k reading at once
    -- (disk_bps: with all of them, the price a plan is chosen at; the estimate prices each read at
    -- the rate of as many as read beside it)
    local by = pr.disk and pr.disk.read_bps_by_readers
    if not flag and type(by) == "table" and #by > 1 then d.disk_shared_bps = by end
    if not d.disk_bps then
      error(string.format("problem: device %d: no disk read rate (give --disk-rate, or a profile that measured the disk)", i), 0)
    end
    p.devices[i] = d
  end
  local function transport_of(i)
    local pr = profile_of(i)
    return pr.link and pr.link.transport_ms or 0
  end
  for i = 1, N do
    local rate = each(o.link_rate, i) or (o.link_rate_measured and o.link_rate_measured[i]) or 0
    p.links[i] = { rate_bps = rate, delay_ms = each(o.link_delay_ms, i) or 0, transport_ms = transport_of(i % N + 1) }
  end
  p.head = { in_process = o.in_process or false, step_ms = o.in_process and 0 or transport_of(1),
    from_last = { rate_bps = 0, delay_ms = 0, transport_ms = transport_of(N) }, to_first = p.links[N] }
  return p
end

-- Why no plan fits a problem: too many devices for the model's blocks, or the device furthest
-- from fitting even its least part (one block per stage, read every step: the embedding or
-- head it must hold, a slot for one block, the KV cache of one layer, the activations), or, when
-- every device could fit alone, what the budgets together lack. Only the stage counts the
-- problem allows are considered (problem.stages, when it fixes one).
function M.why_none(problem)
  local N, m = #problem.devices, problem.model
  if N > m.n_blocks then
    return string.format("%d devices but the model has only %d blocks (%d layers): every device needs at least one block per stage; use at most %d devices",
      N, m.n_blocks, m.n_layers, m.n_blocks)
  end
  local fixed = problem.stages
  if N == 1 and (not fixed or fixed == m.n_blocks) then
    -- one device holds every layer: its least is everything read, one block at a time
    local d = problem.devices[1]
    local p = { slots = 1, devices = { { stages = {} } } }
    for b = 0, m.n_blocks - 1 do p.devices[1].stages[b + 1] = { blocks = { b, b }, offloaded = 1 } end
    local mem = plan.memory(p, 1, m, space.memory_opts(problem))
    if d.budget > 0 and mem.total > d.budget then
      return string.format("memory budget of %s cannot run this model: even with every block offloaded it needs %s (embedding and head %s, KV cache %s, activations %s, a slot for the largest block %s%s); short by %s; raise --mem or lower --context",
        fmt(d.budget, mem.total), fmt(mem.total, d.budget), fmt(mem.weights), fmt(mem.kv), fmt(mem.activations), fmt(mem.slots),
        mem.scratch > 0 and (", the conventional loader's bounce buffer " .. fmt(mem.scratch)) or "", fmt(mem.total - d.budget))
    end
  end
  local worst, worst_short, total_need, total_budget = nil, nil, 0, 0
  local small = math.min(m.mha_bytes, m.mlp_bytes)
  for i, d in ipairs(problem.devices) do
    local part = { S = 1, n_mha = 1, n_mlp = 0, off_mha = 1, off_mlp = 0, off_bytes = small, res_bytes = 0, stage_off_max = small,
      slot_bytes = small, slots = 1, loads = 1, layers = m.mha_bytes <= m.mlp_bytes and 1 or 0, first = i == 1, last = i == N }
    local mem = space.memory(problem, part)
    total_need = total_need + mem.total
    total_budget = total_budget + (d.budget > 0 and d.budget or math.huge)
    if d.budget > 0 and mem.total > d.budget and (not worst_short or mem.total - d.budget > worst_short) then
      worst, worst_short = string.format("device %d: its budget %s is short of the %s its least part needs (weights %s, a slot of %s for one block read every step, kv %s, activations %s%s); short by %s",
        i, fmt(d.budget, mem.total), fmt(mem.total, d.budget), fmt(mem.weights), fmt(mem.slots), fmt(mem.kv), fmt(mem.activations),
        mem.scratch > 0 and (", scratch " .. fmt(mem.scratch)) or "", fmt(mem.total - d.budget)), mem.total - d.budget
    end
  end
  if worst then return worst .. "; raise its --mem or lower --context" end
  -- each device fits a least part, but the blocks must go somewhere: the even split of the
  -- blocks over the hops, every block read, for the stage count that comes closest
  local close
  for S = fixed or 1, fixed or math.floor(m.n_blocks / N) do
    local shares = {}
    for h = 1, N * S do shares[h] = 1 end
    local p = space.ring_of(N, space.split(m.n_blocks, shares))
    local over
    for i = 1, N do
      for _, st in ipairs(p.devices[i].stages) do st.offloaded = st.blocks[2] - st.blocks[1] + 1 end
      local need = space.total(problem, plan.device_part(p, i, m))
      local b = problem.devices[i].budget
      if b > 0 and need > b and (not over or need - b > over.short) then over = { i = i, short = need - b, need = need, p = p } end
    end
    if over and (not close or over.short < close.short) then close = over close.S = S end
  end
  if close then
    local mem = space.memory(problem, plan.device_part(close.p, close.i, m))
    return string.format("no plan fits %s: even the closest (%d stage%s%s, every block read from disk) needs %s on device %d (weights %s, slot %s, kv %s, activations %s) but its budget is %s: short by %s; raise --mem or lower --context%s",
      N == 1 and "the budget" or string.format("all %d budgets at once", N), close.S, close.S == 1 and "" or "s",
      fixed and " as --stages asks" or "", fmt(close.need, problem.devices[close.i].budget), close.i, fmt(mem.weights), fmt(mem.slots), fmt(mem.kv),
      fmt(mem.activations), fmt(problem.devices[close.i].budget, close.need), fmt(close.short), fixed and " (or let the scheduler choose the stages)" or "")
  end
  return string.format("no plan of this scheduler fits all %d budgets at once (they total %s)%s; raise --mem or lower --context",
    N, total_budget < math.huge and fmt(total_budget) or "unlimited",
    fixed and string.format(" with %d stage%s per device (--stages)", fixed, fixed == 1 and "" or "s") or "")
end

-- A short description of the problem's devices and links (for reports).
function M.describe(problem)
  local lines = {}
  for i, d in ipairs(problem.devices) do
    local c = d.compute
    lines[#lines + 1] = string.format("  device %d: budget %s, MHA %.2f ms, MLP %.2f ms%s, disk %.0f MB/s%s%s", i,
      d.budget > 0 and fmt(d.budget) or "unlimited", c.mha_ms, c.mlp_ms,
      i == #problem.devices and string.format(", head %.2f ms", c.head_ms) or "", d.disk_bps / 1e6,
      (c.under_load or 1) > 1.001 and string.format(", compute x%.2f while reading", c.under_load) or "",
      (d.slowdown or 1) ~= 1 and string.format(", slowed x%g", d.slowdown) or "")
  end
  if #problem.devices > 1 and not problem.head.in_process then
    for i, l in ipairs(problem.links) do
      lines[#lines + 1] = string.format("  link %d->%d: %s, %.2f ms delay, %.3f ms transport", i, i % #problem.devices + 1,
        (l.rate_bps or 0) > 0 and string.format("%.1f MB/s", l.rate_bps / 1e6) or "unlimited", l.delay_ms or 0, l.transport_ms or 0)
    end
  end
  return table.concat(lines, "\n")
end

return M
