-- Plans: which blocks each device holds, in which stages, and which of them it re-reads from
-- its disk every step (DESIGN section 3). A plan is a plain Lua table, printable and writable
-- as a Lua file (`--plan FILE.lua`):
--
--   return {
--     slots = 1,                       -- loader slots per device (each holds one stage's reads)
--     devices = {
--       { stages = {                   -- stage k of device i; stage-major around the ring
--           { blocks = { 0, 11 }, offloaded = 5 },   -- blocks 0..11 (inclusive); 0..4 re-read
--           { blocks = { 12, 23 }, offloaded = 5 },
--           ... } },
--     },
--   }
--
-- Blocks number the model's halves: block 2l is layer l's attention (MHA), block 2l+1 its MLP.
-- The offloaded blocks are the first `offloaded` of each stage, the resident ones the rest: while
-- the resident tail computes, the loader reads the next stage's offloaded blocks.
--
-- This file knows the sizes (from a slice store's manifest), the memory a plan needs on a
-- device, and a simple search for one device (the least estimated exposed loading that fits a
-- budget); the cost model and scheduler of DESIGN section 4 build on the same tables.
local ffi = require "ffi"
local core = require "loip.core"
local memory = require "loip.runtime.memory"
local C = core.C

local M = {}

local fmt_bytes = memory.format_bytes

-- "layer 3 mlp" for block 7.
function M.block_name(b)
  return string.format("layer %d %s", math.floor(b / 2), b % 2 == 0 and "mha" or "mlp")
end

-- "layer 3 mha .. layer 4 mlp" for blocks 6..9; one name for a single block.
function M.range_name(a, b)
  if a == b then return M.block_name(a) end
  return M.block_name(a) .. " .. " .. M.block_name(b)
end

-- Sizes a plan needs, from a store's manifest and the run's settings:
-- { n_layers, n_blocks, block_bytes[b] (b from 0), global_bytes, kv_bytes, activation_bytes,
--   files = { [b] = file name }, global_files = { names } }.
-- opts: context, batch, threads (as the session will be made).
function M.sizes(man, cfg, opts)
  local s = { n_layers = cfg.n_layers, n_blocks = 2 * cfg.n_layers, block_bytes = {}, files = {},
    global_bytes = 0, global_files = {} }
  for _, f in ipairs(man.files) do
    local layer, kind = f.name:match("^layer%-(%d+)%-(%a+)%.bin$")
    if layer then
      local b = 2 * tonumber(layer) + (kind == "mlp" and 1 or 0)
      s.block_bytes[b], s.files[b] = f.size, f.name
    else
      s.global_bytes = s.global_bytes + f.size
      s.global_files[#s.global_files + 1] = f.name
    end
  end
  for b = 0, s.n_blocks - 1 do
    if not s.block_bytes[b] then
      error(string.format("manifest: no file for %s (expected %s)", M.block_name(b),
        string.format("layer-%03d-%s.bin", math.floor(b / 2), b % 2 == 0 and "mha" or "mlp")), 0)
    end
  end
  local kv, act = ffi.new("uint64_t[1]"), ffi.new("uint64_t[1]")
  core.check(C.loip_session_size(cfg, opts.context, opts.batch, opts.threads, -1, kv, act))
  s.kv_bytes, s.activation_bytes = tonumber(kv[0]), tonumber(act[0])
  -- the head reads lm_head, or the embedding when they are tied; the embedding itself is one
  -- row per token
  for _, f in ipairs(man.files) do
    for _, t in ipairs(f.tensors) do
      if t.kind == "lm_head" or (t.kind == "embed" and not s.head_bytes) then s.head_bytes = t.nbytes end
    end
  end
  s.head_bytes = s.head_bytes or 0
  -- per file, for devices that hold only one end of the model (loip.ring)
  for _, f in ipairs(man.files) do
    if f.name == "embed.bin" then s.embed_file_bytes = f.size end
    if f.name == "head.bin" then s.head_file_bytes = f.size end
  end
  s.tied = cfg.tied_embeddings ~= 0
  s.dim, s.vocab = cfg.dim, cfg.vocab_size
  -- the KV cache of k layers (a device keeps its own layers')
  local kv_cache = {}
  function s.kv_for(k)
    if not kv_cache[k] then
      core.check(C.loip_session_size(cfg, opts.context, opts.batch, opts.threads, k, kv, act))
      kv_cache[k] = tonumber(kv[0])
    end
    return kv_cache[k]
  end
  s.bounce_bytes = 1024 * 1024 -- the conventional loader's bounce buffer (a read, at most a slot)
  s.weight_bytes = s.global_bytes
  for b = 0, s.n_blocks - 1 do s.weight_bytes = s.weight_bytes + s.block_bytes[b] end
  return s
end

-- A plan's problems as a message naming the field, or nil when it is well formed for a model
-- of n_blocks blocks on one device holding every block (several devices: loip.ring.check).
function M.check(p, n_blocks, where)
  where = where or "plan"
  if type(p) == "table" and type(p.devices) == "table" and #p.devices > 1 then
    return string.format("%s: %d devices: this runs on one device (several devices: loip generate --devices)",
      where, #p.devices)
  end
  -- one device is the ring's N = 1 case: the same checks (loip.ring)
  return require("loip.plan.ring").check(p, n_blocks, where)
end

-- Bytes of a device's stages: resident blocks, the slot (largest stage's offloaded blocks),
-- offloaded per step.
-- per_block (the conventional baseline, loip.plan's per_block field): the slot holds one
-- block at a time, the largest offloaded one.
function M.stage_bytes(stages, sizes, per_block)
  local resident, slot, offloaded = 0, 0, 0
  for _, st in ipairs(stages) do
    local off = 0
    for b = st.blocks[1], st.blocks[2] do
      if b - st.blocks[1] < (st.offloaded or 0) then
        off = off + sizes.block_bytes[b]
        if per_block then slot = math.max(slot, sizes.block_bytes[b]) end
      else
        resident = resident + sizes.block_bytes[b]
      end
    end
    if not per_block then slot = math.max(slot, off) end
    offloaded = offloaded + off
  end
  return resident, slot, offloaded
end

-- The memory a one-device plan needs, by account, and its total:
-- { weights, slots, kv, activations, scratch, total, slot_bytes, offloaded_bytes }.
function M.memory(p, sizes, opts)
  -- one device is the ring's N = 1 case: the same accounting (loip.ring)
  return require("loip.plan.ring").memory(p, 1, sizes, opts)
end

-- Estimated ms per decoding step of a one-device plan, by simulating the runner's timeline
-- for a few steps: compute (at compute_bps) runs the stages in order, each stage's offloaded
-- blocks waiting for their load; loads (at read_bps) go in stage order, one after another,
-- each starting when the disk is free and its bytes have room: a free slot (several slots) or
-- free bytes of the ring (one slot of slot_bytes, freed in load order as stages finish their
-- offloaded blocks). Returns ms per step and the ms of it spent waiting for loads.
--
-- rates.contention (default 0.5) scales compute speed while loads stream into memory: on the
-- 2-vCPU VM this was tuned on, blocks computed at 11-13 GB/s with the disk busy against 25-31
-- GB/s alone (the host's I/O work competes for the same cores), and ignoring it made the search
-- pick slots too small to keep the disk busy.
function M.estimate(p, sizes, rates)
  local stages = p.devices[1].stages
  local S = #stages
  local any_offload = false
  for _, st in ipairs(stages) do any_offload = any_offload or (st.offloaded or 0) > 0 end
  local speed = rates.compute_bps * (any_offload and (rates.contention or 0.5) or 1)
  local function comp(bytes) return bytes / speed * 1e3 end
  local function load(bytes) return bytes / rates.read_bps * 1e3 end
  local overhead = rates.stage_overhead_ms or 0.05
  local off, res = {}, {}
  for k, st in ipairs(stages) do
    off[k], res[k] = 0, 0
    for b = st.blocks[1], st.blocks[2] do
      if b - st.blocks[1] < (st.offloaded or 0) then off[k] = off[k] + sizes.block_bytes[b]
      else res[k] = res[k] + sizes.block_bytes[b] end
    end
  end
  local _, biggest = M.stage_bytes(stages, sizes)
  local n_slots = p.slots or 1
  local cap = math.max(biggest, p.slot_bytes or 0)
  local head = comp(sizes.head_bytes or 0)
  local loads = {} -- in order: { bytes, release time }
  local disk_free, t, wait = 0, 0, 0
  local step_end = {}
  local steps = 4
  for step = 1, steps do
    local step_wait = 0
    for k = 1, S do
      local ready = t
      if off[k] > 0 then
        local j = #loads + 1
        local room = 0
        if n_slots > 1 then
          if j > n_slots then room = loads[j - n_slots].release end
        else
          local live, i = off[k], j - 1
          while i >= 1 and live + loads[i].bytes <= cap do live, i = live + loads[i].bytes, i - 1 end
          if i >= 1 then room = loads[i].release end
        end
        local start = math.max(disk_free, room)
        disk_free = start + load(off[k])
        ready = math.max(t, disk_free)
        step_wait = step_wait + (ready - t)
        loads[j] = { bytes = off[k], release = ready + comp(off[k]) + overhead }
      end
      t = ready + comp(off[k] + res[k]) + overhead
    end
    t = t + head
    step_end[step], wait = t, step_wait
  end
  return step_end[steps] - step_end[steps - 1], wait
end

-- Fill what a fitting one-device plan leaves of budget with resident blocks (the paper's
-- block-level refinement): repeatedly keep resident the largest offloaded block that still
-- fits (the last offloaded one of its stage, so that offloaded blocks stay first). The slot
-- keeps its size (written into p.slot_bytes): it can only shrink. Changes p in place.
function M.refine(p, sizes, budget, opts)
  local mem = M.memory(p, sizes, opts)
  if mem.slot_bytes > 0 then p.slot_bytes = mem.slot_bytes end
  M.fill(p.devices[1].stages, sizes, budget - mem.total)
  return p
end

-- Keep resident, largest first, the offloaded blocks that fit in left bytes (each the last
-- offloaded one of its stage, so that offloaded blocks stay first). Changes stages in place;
-- returns the bytes still left.
function M.fill(stages, sizes, left)
  while true do
    local best, best_bytes
    for k, st in ipairs(stages) do
      local off = st.offloaded or 0
      if off > 0 then
        local b = sizes.block_bytes[st.blocks[1] + off - 1]
        if b <= left and (not best_bytes or b > best_bytes) then best, best_bytes = k, b end
      end
    end
    if not best then return left end
    stages[best].offloaded = stages[best].offloaded - 1
    left = left - best_bytes
  end
end

-- Split blocks 0..n-1 into s contiguous stages as evenly as possible (earlier stages get the
-- extra block); returns { {first, last}, ... }.
local function split(n, s)
  local out, at = {}, 0
  for k = 1, s do
    local len = math.floor(n / s) + (k <= n % s and 1 or 0)
    out[k] = { at, at + len - 1 }
    at = at + len
  end
  return out
end

-- The least memory any plan of this search needs (every block offloaded, one block per stage).
function M.minimum(sizes, opts)
  local biggest = 0
  for b = 0, sizes.n_blocks - 1 do biggest = math.max(biggest, sizes.block_bytes[b]) end
  local n_slots = opts and opts.slots or 1
  return sizes.global_bytes + n_slots * biggest + sizes.kv_bytes + sizes.activation_bytes +
    ((opts and opts.loader == "buffered") and math.min(sizes.bounce_bytes, biggest) or 0), biggest
end

-- The one-device plan that fits budget (bytes; 0: unlimited) with the least estimated time:
-- every stage count S from 1 to the number of blocks, stages split evenly, every number of
-- offloaded blocks per stage. opts: slots (1), loader ("uring" | "buffered"), read_bps,
-- compute_bps (rates for the estimate). Returns the plan, with .estimate = { ms, exposed_ms,
-- memory }; raises when nothing fits, saying what the least plan needs.
function M.search(sizes, budget, opts)
  opts = opts or {}
  local rates = { read_bps = opts.read_bps or 1.5e9, compute_bps = opts.compute_bps or 10e9 }
  local best, best_ms
  local n = sizes.n_blocks
  for s = 1, n do
    local ranges = split(n, s)
    local shortest = math.floor(n / s)
    local first_fit
    for k = 0, shortest do
      local p = { slots = opts.slots or 1, devices = { { stages = {} } } }
      for i, r in ipairs(ranges) do p.devices[1].stages[i] = { blocks = r, offloaded = k } end
      -- one slot: as a ring of the largest stage's bytes, or of the largest run of two, three
      -- or four consecutive stages' (so that loads go on while earlier stages compute)
      local rings = { false }
      if k > 0 and p.slots == 1 and s > 1 then
        local st = p.devices[1].stages
        local off = {}
        for i = 1, s do off[i] = select(2, M.stage_bytes({ st[i] }, sizes)) end
        local last = select(2, M.stage_bytes(st, sizes))
        for run = 2, math.min(4, s) do
          local most = 0
          for i = 1, s do
            local sum = 0
            for j = 0, run - 1 do sum = sum + off[(i + j - 1) % s + 1] end
            most = math.max(most, sum)
          end
          if most > last then rings[#rings + 1], last = most, most end
        end
      end
      local fits = false
      for _, ring in ipairs(rings) do
        local q = { slots = p.slots, slot_bytes = ring or nil, devices = { { stages = {} } } }
        for i, r in ipairs(ranges) do q.devices[1].stages[i] = { blocks = r, offloaded = k } end
        local mem = M.memory(q, sizes, opts)
        if budget == 0 or mem.total <= budget then
          fits = true
          if budget > 0 and k > 0 then
            M.refine(q, sizes, budget, opts)
            mem = M.memory(q, sizes, opts)
          end
          local ms, exposed = M.estimate(q, sizes, rates)
          -- ties (within 0.1%) go to fewer stages, then fewer offloaded blocks
          if not best or ms < best_ms * 0.999 then
            best, best_ms = q, ms
            q.estimate = { ms = ms, exposed_ms = exposed, memory = mem, read_bps = rates.read_bps,
              compute_bps = rates.compute_bps }
          end
        end
      end
      -- with S fixed, offloading more only adds reading, unless it frees room for a larger
      -- ring: two more counts after the first that fits are enough
      if fits then first_fit = first_fit or k end
      if first_fit and k >= first_fit + 2 then break end
    end
    if budget == 0 and best then break end
  end
  if not best then
    local need, biggest = M.minimum(sizes, opts)
    error(string.format("memory budget of %s cannot run this model: even with every block offloaded it needs %s "
      .. "(embedding and head %s, KV cache %s, activations %s, a slot for the largest block %s%s); "
      .. "raise --mem or lower --context", fmt_bytes(budget), fmt_bytes(need), fmt_bytes(sizes.global_bytes),
      fmt_bytes(sizes.kv_bytes), fmt_bytes(sizes.activation_bytes), fmt_bytes(biggest),
      opts.loader == "buffered" and (", the conventional loader's bounce buffer " ..
        fmt_bytes(math.min(sizes.bounce_bytes, biggest))) or ""), 0)
  end
  return best
end

-- A plan as Lua source that M.load reads back.
function M.to_lua(p) return require("loip.plan.ring").to_lua(p) end

-- A readable description: per stage its blocks, what is offloaded, and the memory by account.
function M.describe(p, sizes, opts)
  local lines = {}
  local stages = p.devices[1].stages
  local mem = sizes and M.memory(p, sizes, opts)
  lines[#lines + 1] = string.format("plan: %d stage%s on 1 device, %d slot%s%s", #stages, #stages == 1 and "" or "s",
    p.slots or 1, (p.slots or 1) == 1 and "" or "s", mem and mem.slot_bytes > 0 and
    string.format(" of %s", fmt_bytes(mem.slot_bytes)) or "")
  for k, st in ipairs(stages) do
    local a, b, off = st.blocks[1], st.blocks[2], st.offloaded or 0
    local what
    if off == 0 then what = "all resident"
    elseif off == b - a + 1 then what = "all offloaded"
    else what = string.format("offloaded %s, resident %s", M.range_name(a, a + off - 1), M.range_name(a + off, b)) end
    local bytes = ""
    if sizes then
      local o, r = 0, 0
      for x = a, b do if x - a < off then o = o + sizes.block_bytes[x] else r = r + sizes.block_bytes[x] end end
      bytes = string.format(" [%s read per step, %s resident]", fmt_bytes(o), fmt_bytes(r))
    end
    lines[#lines + 1] = string.format("  stage %d: %s: %s%s", k, M.range_name(a, b), what, bytes)
  end
  if mem then
    lines[#lines + 1] = string.format("  memory: weights %s + slots %s + kv %s + activations %s%s = %s",
      fmt_bytes(mem.weights), fmt_bytes(mem.slots), fmt_bytes(mem.kv), fmt_bytes(mem.activations),
      mem.scratch > 0 and (" + scratch " .. fmt_bytes(mem.scratch)) or "", fmt_bytes(mem.total))
    lines[#lines + 1] = string.format("  offloaded: %s of %s of weights re-read every step (%.0f%%)",
      fmt_bytes(mem.offloaded_bytes), fmt_bytes(sizes.weight_bytes), 100 * mem.offloaded_bytes / sizes.weight_bytes)
  end
  if p.estimate then
    lines[#lines + 1] = string.format("  estimate: %.1f ms/token, %.1f ms of it exposed loading (disk %.2f GB/s, compute %.1f GB/s assumed)",
      p.estimate.ms, p.estimate.exposed_ms, p.estimate.read_bps / 1e9, p.estimate.compute_bps / 1e9)
  end
  return table.concat(lines, "\n")
end

-- Read a plan from a Lua file (it returns the table; it runs with no globals but what a plain
-- table needs). Raises naming the file.
function M.load(path)
  local f, err = io.open(path, "rb")
  if not f then error("--plan: " .. tostring(err), 0) end
  local src = f:read("*a")
  f:close()
  if src:byte(1) == 27 then error(path .. ": a plan is Lua source, not bytecode", 0) end
  local chunk, perr = loadstring(src, "@" .. path)
  if not chunk then error(path .. ": " .. perr, 0) end
  setfenv(chunk, {})
  local ok, p = pcall(chunk)
  if not ok then error(path .. ": " .. tostring(p), 0) end
  if type(p) ~= "table" then error(path .. ": the file must return the plan table", 0) end
  return p
end

return M
