-- Plans: which blocks each device holds, in which stages, and which of them it re-reads from
-- its disk every step (docs/planning.md). A plan is a plain Lua table, printable and writable
-- as a Lua file (`--plan FILE.lua`, `--save-plan`), for one device or several:
--
--   return {
--     slots = 1,                        -- loader slots per device (default 1: one slot used as a ring)
--     devices = {
--       { slot_bytes = 201326592,       -- optional: the slot's size (default: the largest stage's reads)
--         stages = {                    -- the same number of stages on every device
--           { blocks = { 0, 3 }, offloaded = 2 },   -- blocks 0..3 (inclusive); 0..1 re-read every step
--           { blocks = { 8, 11 }, offloaded = 2 },
--       } },
--       { stages = { { blocks = { 4, 7 }, offloaded = 1 }, { blocks = { 12, 15 }, offloaded = 0 } } },
--     },
--     per_block = true,   -- optional: the slot holds one block; each offloaded block is read when its turn comes
--     prefetch = false,   -- optional: a stage's reads start when the stage starts (the conventional pipeline)
--   }
--
-- Blocks number the model's halves: block 2l is layer l's attention (MHA), block 2l+1 its MLP.
-- The hops go around the ring stage by stage (stage 1 of device 1, stage 1 of device 2, ...,
-- stage 1 of device N, stage 2 of device 1, ...) and cover the blocks in order. Device 1 also
-- holds the embedding, device N the head (and the embedding too when they are tied). Each
-- stage's first `offloaded` blocks are read into the device's slot every step, while the rest of
-- the stage and the other devices compute.
--
-- This module is the mechanism every planner shares: checks, the memory a plan needs on each
-- device (one accounting, used by the schedulers, the head and the workers), a device's part
-- summarised for cost models, descriptions and plan files. Deciding a plan is a policy's job
-- (recipes/policies/, loaded by loip.policy).
local ffi = require "ffi"
local memory = require "loip.runtime.memory"
local exec = require "loip.runtime.exec"
local suggest = require "loip.ui.suggest"
local json = require "loip.text.json"
local loader_mod = require "loip.runtime.loader"

local ends_mod = require "loip.plan.ends"

local M = {}

local fmt = memory.format_bytes

-- Where the embedding and the head stay (loip.plan.ends).
M.ends = ends_mod

-- "layer 3 mlp" for block 7.
function M.block_name(b)
  return string.format("layer %d %s", math.floor(b / 2), b % 2 == 0 and "mha" or "mlp")
end

-- "layer 3 mha .. layer 4 mlp" for blocks 6..9; one name for a single block.
function M.range_name(a, b)
  if a == b then return M.block_name(a) end
  return M.block_name(a) .. " .. " .. M.block_name(b)
end

-- The loader's "scratch" for a slot of slot_bytes read the given way (loip_loader_size): the
-- conventional path's bounce buffer, nothing for io_uring. Remembered: schedulers ask often;
-- "auto" is settled once (the path loip_loader_new would take here, probed by C), then asked
-- as that path.
local scratch_of = { uring = {}, buffered = {} }
local auto_path
local function loader_size(slot_bytes, mode)
  local slots, scratch = loader_mod.size{ slots = 1, slot_bytes = slot_bytes, mode = mode }
  if not slots then error("loader size: " .. scratch, 0) end
  return scratch
end
function M.loader_scratch(slot_bytes, loader)
  if slot_bytes <= 0 then return 0 end
  local path = loader
  if path ~= "uring" and path ~= "buffered" then
    auto_path = auto_path or (loader_size(4096, "auto") > 0 and "buffered" or "uring")
    path = auto_path
  end
  local known = scratch_of[path]
  if not known[slot_bytes] then
    known[slot_bytes] = loader_size(slot_bytes, path)
  end
  return known[slot_bytes]
end

-- Sizes a plan needs (loip.plan.sizes) and, for a mixture of experts, what its expert caches read.
local sizes_mod = require "loip.plan.sizes"
M.sizes, M.experts_per_layer, M.min_expert_slots, M.expert_reads = sizes_mod.sizes, sizes_mod.experts_per_layer,
  sizes_mod.min_expert_slots, sizes_mod.expert_reads
M.attended = sizes_mod.attended

-- The hops of p in ring order: { device, stage, blocks = {a, b}, offloaded, hop (0-based) }.
function M.hops(p)
  local out = {}
  local S = #p.devices[1].stages
  for s = 1, S do
    for i, d in ipairs(p.devices) do
      local st = d.stages[s]
      out[#out + 1] = { device = i, stage = s, blocks = st.blocks, offloaded = st.offloaded or 0, hop = #out }
    end
  end
  return out
end

local function is_count(v) return type(v) == "number" and v >= 0 and v == math.floor(v) end

-- The keys a plan may have at each level (M.check refuses any other: a misspelt `offload` would
-- otherwise be read as "nothing offloaded").
M.keys = {
  plan = { "slots", "slot_bytes", "devices", "per_block", "prefetch", "embed_rows", "head_rows", "head_shares" },
  device = { "slot_bytes", "stages", "expert_slots" },
  stage = { "blocks", "offloaded" },
}

local function key_name(k) return type(k) == "string" and ("'" .. k .. "'") or tostring(k) end

-- The first key of table t (in sorted order, for a stable message) that is not one of the names
-- M.keys[kind] or, with list = n, not an index 1..n: a message naming it and `what` (the field
-- path), or nil.
local function unknown_key(t, kind, list, what)
  local known = M.keys[kind]
  local allowed = {}
  for _, k in ipairs(known or {}) do allowed[k] = true end
  local odd = {}
  for k in pairs(t) do
    local index = type(k) == "number" and k >= 1 and k <= (list or 0) and k == math.floor(k)
    if not allowed[k] and not index then odd[#odd + 1] = k end
  end
  if #odd == 0 then return nil end
  table.sort(odd, function(a, b) return tostring(a) < tostring(b) end)
  local k = odd[1]
  if list then
    return string.format("%s: the key %s in a list (it holds entries 1..%d only)", what, key_name(k), list)
  end
  return string.format("%s: unknown key %s%s; a %s has only %s", what, key_name(k),
    suggest.hint(k, known), kind, table.concat(known, ", "))
end

-- A plan's problems as a message naming the field (nil when it is well formed for a model of
-- n_blocks blocks): devices, each with the same number of stages, whose hops in ring order
-- cover blocks 0..n_blocks-1 in order; no key at any level that a plan does not have (M.keys).
function M.check(p, n_blocks, where)
  where = where or "plan"
  local function bad(f, ...) return where .. ": " .. string.format(f, ...) end
  if type(p) ~= "table" then return bad("not a table") end
  local odd = unknown_key(p, "plan", nil, "the plan")
  if odd then return bad("%s", odd) end
  if p.slots ~= nil and (not is_count(p.slots) or p.slots < 1) then return bad("slots must be a positive integer") end
  if p.slot_bytes ~= nil and not is_count(p.slot_bytes) then return bad("slot_bytes must be a byte count") end
  for _, f in ipairs({ "per_block", "prefetch" }) do
    if p[f] ~= nil and type(p[f]) ~= "boolean" then return bad("%s must be true or false", f) end
  end
  local odd_ends = ends_mod.check(p, bad)
  if odd_ends then return odd_ends end
  if type(p.devices) ~= "table" or #p.devices == 0 then return bad("devices must be a non-empty list") end
  odd = unknown_key(p.devices, nil, #p.devices, "devices")
  if odd then return bad("%s", odd) end
  local S
  for i, d in ipairs(p.devices) do
    if type(d) ~= "table" then return bad("devices[%d] must be a table { stages = {...} }", i) end
    odd = unknown_key(d, "device", nil, string.format("devices[%d]", i))
    if odd then return bad("%s", odd) end
    if type(d.stages) ~= "table" or #d.stages == 0 then
      return bad("devices[%d].stages must be a non-empty list", i)
    end
    odd = unknown_key(d.stages, nil, #d.stages, string.format("devices[%d].stages", i))
    if odd then return bad("%s", odd) end
    S = S or #d.stages
    if #d.stages ~= S then
      return bad("devices[%d] has %d stages, devices[1] has %d: every device holds the same number", i, #d.stages, S)
    end
    if d.slot_bytes ~= nil and not is_count(d.slot_bytes) then return bad("devices[%d].slot_bytes must be a byte count", i) end
    if d.expert_slots ~= nil and (not is_count(d.expert_slots) or d.expert_slots < 1 or d.expert_slots > 1024) then
      return bad("devices[%d].expert_slots must be an integer in 1..1024 (experts its cache holds)", i)
    end
    for s, st in ipairs(d.stages) do
      local sw = string.format("devices[%d].stages[%d]", i, s)
      if type(st) ~= "table" then return bad("%s must be a table { blocks = { first, last }, offloaded = n }", sw) end
      odd = unknown_key(st, "stage", nil, sw)
      if odd then return bad("%s", odd) end
      if type(st.blocks) ~= "table" or #st.blocks ~= 2 or unknown_key(st.blocks, nil, 2, "") then
        return bad("%s.blocks must be { first, last }", sw)
      end
      local a, b = st.blocks[1], st.blocks[2]
      if type(a) ~= "number" or type(b) ~= "number" or a ~= math.floor(a) or b ~= math.floor(b) or b < a then
        return bad("%s.blocks must be two block numbers, first <= last", sw)
      end
      local off = st.offloaded or 0
      if not is_count(off) or off > b - a + 1 then return bad("%s.offloaded must be an integer in 0..%d", sw, b - a + 1) end
    end
  end
  local next_block = 0
  for _, h in ipairs(M.hops(p)) do
    local sw = string.format("devices[%d].stages[%d]", h.device, h.stage)
    if h.blocks[1] ~= next_block then
      return bad("%s starts at block %d (%s) but block %d comes next around the ring (stage by stage, device by device)",
        sw, h.blocks[1], M.block_name(h.blocks[1]), next_block)
    end
    if h.blocks[2] >= n_blocks then return bad("%s.blocks: block %d past the model's last (%d)", sw, h.blocks[2], n_blocks - 1) end
    next_block = h.blocks[2] + 1
  end
  if next_block ~= n_blocks then
    return bad("the stages end at block %d; the model has %d blocks (0..%d)", next_block - 1, n_blocks, n_blocks - 1)
  end
  return nil
end

-- The files device i of an N-device plan reads at start (resident blocks, the embedding, the
-- head), by name.
function M.device_files(p, i, sizes)
  local resident, N = {}, #p.devices
  local _, _, how = ends_mod.memory(sizes, ends_mod.of(p), i == 1, i == N, p.head_shares and p.head_shares[i])
  if how.cut then
    -- (a cut head: its share's rows are read into memory alone, loip.model.store.bind_ends; a
    -- tied model's head.bin is the final norm)
    if how.embed == "memory" then resident["embed.bin"] = true end
    if how.norm and sizes.tied then resident["head.bin"] = true end
  elseif how.embed == "memory" or (how.head == "memory" and sizes.tied) then resident["embed.bin"] = true end
  -- (an untied head read from disk keeps its final norm alone: loip.model.store.bind_ends)
  if not how.cut and (how.head == "memory" or (how.head and sizes.tied)) then resident["head.bin"] = true end
  for _, st in ipairs(p.devices[i].stages) do
    for b = st.blocks[1] + (st.offloaded or 0), st.blocks[2] do
      resident[sizes.files[b]] = true
      -- (a resident MLP block of a mixture of experts holds its experts)
      for _, name in ipairs(b % 2 == 1 and sizes.expert_files and sizes.expert_files[(b - 1) / 2] or {}) do
        resident[name] = true
      end
    end
  end
  return resident
end

-- Layers whose attention device i computes (it keeps their KV cache): a set and a count.
function M.device_layers(p, i)
  local set, n = {}, 0
  for _, st in ipairs(p.devices[i].stages) do
    for b = st.blocks[1], st.blocks[2] do
      if b % 2 == 0 and not set[b / 2] then set[b / 2], n = true, n + 1 end
    end
  end
  return set, n
end

-- Device i's part of plan p, summarised for the cost model and the memory accounting:
-- { S, n_mha, n_mlp (blocks it computes), off_mha, off_mlp (blocks it reads every step),
--   off_bytes, res_bytes, stage_off_max (the most one stage reads), slot_bytes (the slot the
--   loader allocates), ring (the slot holds more than one stage's reads: a load runs while the
--   blocks of the stage before compute), loads (reads started per step), layers (KV cache),
--   embed (computes the embedding), head (computes the head), first, last (holds the
--   embedding / head files), per_block, prefetch }.
-- The layers whose attention is in a stage (blocks {first, last}): they keep their KV cache with it
-- (given sizes with ringed sliding-window layers: those whose KV grows, in groups, alone).
function M.stage_kv_layers(st, sizes)
  local a, b = math.ceil(st.blocks[1] / 2), math.floor(st.blocks[2] / 2)
  if not (sizes and sizes.ringed) then return b - a + 1 end
  local n = 0
  for l = a, b do if not sizes.ringed[l] then n = n + 1 end end
  return n
end

-- The KV of a set of layers (0-based) where the model has ringed sliding-window layers (nil
-- otherwise: sizes.kv_bytes by count is exact): the tables, and each layer's by its kind.
function M.kv_of_layers(sizes, set)
  local k = sizes.kv_kinds
  if not (k and sizes.ringed) then return nil end
  local kv = sizes.kv_bytes[0]
  for l in pairs(set) do kv = kv + (sizes.ringed[l] and k.window_bytes or k.full_bytes or 0) end
  return kv
end

-- The bytes of the rings of a stage's ringed sliding-window layers (0: none): KV that never grows.
function M.stage_ring_bytes(st, sizes)
  if not (sizes and sizes.ringed) then return 0 end
  local n = 0
  for l = math.ceil(st.blocks[1] / 2), math.floor(st.blocks[2] / 2) do if sizes.ringed[l] then n = n + 1 end end
  return n * sizes.kv_kinds.window_bytes
end

function M.device_part(p, i, sizes)
  local d, N = p.devices[i], #p.devices
  local part = { S = #d.stages, n_mha = 0, n_mlp = 0, off_mha = 0, off_mlp = 0, off_bytes = 0, res_bytes = 0,
    stage_off_max = 0, loads = 0, embed = i == 1, head = i == N, first = i == 1, last = i == N,
    per_block = p.per_block or false, prefetch = p.prefetch ~= false, ends = ends_mod.of(p),
    share = p.head_shares and p.head_shares[i] or nil }
  local biggest = 0
  for _, st in ipairs(d.stages) do
    local off = 0
    for b = st.blocks[1], st.blocks[2] do
      local mha = b % 2 == 0
      if mha then part.n_mha = part.n_mha + 1 else part.n_mlp = part.n_mlp + 1 end
      if b - st.blocks[1] < (st.offloaded or 0) then
        off = off + sizes.block_bytes[b]
        biggest = math.max(biggest, sizes.block_bytes[b])
        if mha then part.off_mha = part.off_mha + 1 else part.off_mlp = part.off_mlp + 1 end
        if p.per_block then part.loads = part.loads + 1 end
      else
        part.res_bytes = part.res_bytes + (sizes.res_bytes and sizes.res_bytes[b] or sizes.block_bytes[b])
      end
    end
    if off > 0 and not p.per_block then part.loads = part.loads + 1 end
    part.off_bytes = part.off_bytes + off
    part.stage_off_max = math.max(part.stage_off_max, off)
  end
  local set, layers = M.device_layers(p, i)
  part.layers = layers
  part.kv = M.kv_of_layers(sizes, set)
  local need = p.per_block and biggest or part.stage_off_max
  local given = d.slot_bytes or (N == 1 and p.slot_bytes) or nil
  part.slot_bytes = need > 0 and math.max(need, given or 0) or 0
  part.slots = need > 0 and (p.slots or 1) or 0
  part.ring = not p.per_block and need > 0 and ((p.slots or 1) > 1 or part.slot_bytes >= 2 * need)
  if sizes.moe then -- its offloaded MLP blocks' experts come through its expert cache; their routers stay
    part.off_moe = part.off_mlp
    part.res_bytes = part.res_bytes + part.off_moe * sizes.moe.gating_bytes
    part.expert_slots = part.off_moe > 0 and math.max(d.expert_slots or 0, M.min_expert_slots(sizes)) or 0
  end
  return part
end

-- Bytes of part's expert cache.
function M.expert_cache_bytes(part, sizes)
  return sizes.moe and (part.expert_slots or 0) * sizes.moe.expert_bytes or 0
end

-- The expert cache's loader's bounce buffer (the buffered path's; 0 on io_uring), when part has one.
function M.expert_scratch(part, sizes, opts)
  if not sizes.moe or (part.off_moe or 0) == 0 then return 0 end
  return M.loader_scratch(sizes.moe.expert_bytes, (opts or {}).loader)
end

-- The memory of a device's part by account: { weights, slots, kv, activations, scratch, total,
-- slot_bytes, offloaded_bytes }. opts: cluster (the device is a worker: its message buffers
-- count as activations), loader ("uring" | "buffered" | "auto": the bounce buffer of the
-- conventional path counts as scratch).
function M.part_memory(part, sizes, opts)
  opts = opts or {}
  local ends = part.ends or opts.ends
  local ew, eb, how, ea = ends_mod.memory(sizes, ends, part.first, part.last,
    part.share)
  local weights = part.res_bytes + ew
  local m = { weights = weights, slots = part.slots * part.slot_bytes + M.expert_cache_bytes(part, sizes) + eb,
    experts = M.expert_cache_bytes(part, sizes), kv = part.kv or sizes.kv_bytes[part.layers],
    activations = sizes.activation_bytes + (opts.cluster and M.device_bytes(sizes, part.last or how.cut) + ea or 0),
    scratch = (part.slot_bytes > 0 and M.loader_scratch(part.slot_bytes, opts.loader) or 0) + M.expert_scratch(part, sizes, opts),
    slot_bytes = part.slot_bytes, offloaded_bytes = part.off_bytes }
  m.total = m.weights + m.slots + m.kv + m.activations + m.scratch
  return m
end

-- part_memory(...).total without the table (schedulers call this in their inner loops).
function M.part_total(part, sizes, opts)
  if part.ends then opts = setmetatable({ ends = part.ends }, { __index = opts }) end
  return M.total_of(sizes, opts, part.first, part.last, part.res_bytes + M.expert_scratch(part, sizes, opts),
    part.slots * part.slot_bytes + M.expert_cache_bytes(part, sizes), part.layers, part.kv, part.share)
end

-- The same from its figures: whether the device holds the first / last end, its resident
-- bytes, the bytes of its slots, its layers with a KV cache (kv: their KV's bytes where known:
-- M.kv_of_layers; else the most any as many layers keep).
function M.total_of(sizes, opts, first, last, res_bytes, slot_bytes, layers, kv, share)
  kv = kv or sizes.kv_bytes[layers]
  if not kv then return math.huge end -- more layers than the model has: no such part
  local ew, eb, how, ea = ends_mod.memory(sizes, opts.ends, first, last, share)
  local w = res_bytes + slot_bytes + kv + sizes.activation_bytes + ew + eb
  if opts.cluster then w = w + M.device_bytes(sizes, last or how.cut) + ea end
  if slot_bytes > 0 then w = w + M.loader_scratch(slot_bytes, opts.loader) end
  return w
end

-- A cluster device's message buffers (loip_device_size): the device that returns the step's
-- logits rows (the last; every device when the head is cut across them, ends.head_shares) holds
-- sizes.logits_tokens rows of the vocabulary; the others one per request (sizes.device_bytes_mid).
-- The planner sends each device the rows it is charged for (M.logits_tokens_of).
function M.device_bytes(sizes, holds_logits)
  if holds_logits then return sizes.device_bytes end
  return sizes.device_bytes_mid or sizes.device_bytes
end

-- The logits rows device i of N allocates under plan p (see M.device_bytes).
function M.logits_tokens_of(p, sizes, i, N)
  if i == N or (p and p.head_shares) then return sizes.logits_tokens end
  return 1
end

-- Device i's memory under plan p, by account (see part_memory).
function M.memory(p, i, sizes, opts)
  return M.part_memory(M.device_part(p, i, sizes), sizes, opts)
end

-- The first device whose budget p breaks, as a message naming it and the shortfall; nil when
-- every device fits. budgets: bytes per device (0: unlimited).
function M.over_budget(p, sizes, budgets, opts, where)
  for i = 1, #p.devices do
    local b = budgets[i] or 0
    local m = M.memory(p, i, sizes, opts)
    if b > 0 and m.total > b then
      return string.format("%sdevice %d needs %s (weights %s, slots %s, kv %s, activations %s%s) but its budget is %s: short by %s",
        where and (where .. ": ") or "", i, fmt(m.total, b), fmt(m.weights), fmt(m.slots), fmt(m.kv), fmt(m.activations),
        m.scratch > 0 and (", scratch " .. fmt(m.scratch)) or "", fmt(b, m.total), fmt(m.total - b)), m
    end
  end
end

-- Device i's KV by layer kind (a model with sliding-window layers, sizes.kv_kinds): how many
-- full layers (KV growing with the context) and window layers (a ring each, that stops growing)
-- it keeps (kv_layer_kinds), and a line saying so (kv_kinds_line).
function M.kv_layer_kinds(p, i, sizes)
  local full, win = 0, 0
  for l in pairs((M.device_layers(p, i))) do
    if sizes.ringed[l] then win = win + 1 else full = full + 1 end
  end
  return full, win
end

function M.kv_kinds_line(p, i, sizes)
  local k = sizes.kv_kinds
  local full, win = M.kv_layer_kinds(p, i, sizes)
  return string.format("    kv by layer kind: %d full x %s (%d positions) + %d window x %s (a ring of %d positions "
    .. "for a window of %d)", full, fmt(k.full_bytes or 0), sizes.plan_positions, win, fmt(k.window_bytes or 0),
    k.ring_tokens, k.window)
end

-- A readable description: per device its memory by account and what it reads, per stage its
-- blocks and which are offloaded; est (a cost model's estimate) adds the predicted figures.
function M.describe(p, sizes, opts, est)
  local N, S = #p.devices, #p.devices[1].stages
  local lines = { string.format("plan: %d device%s x %d stage%s (%d hop%s around the ring), %d slot%s", N, N == 1 and "" or "s",
    S, S == 1 and "" or "s", N * S, N * S == 1 and "" or "s", p.slots or 1, (p.slots or 1) == 1 and "" or "s")
    .. (p.per_block and ", each offloaded block read when its turn comes" or "")
    .. (p.prefetch == false and ", no reads ahead" or "") }
  local read = 0
  for i, d in ipairs(p.devices) do
    local m = M.memory(p, i, sizes, opts)
    read = read + m.offloaded_bytes
    local e = est and est.devices and est.devices[i]
    lines[#lines + 1] = string.format("  device %d: weights %s + slot %s + kv %s + activations %s%s = %s; %s read per step%s",
      i, fmt(m.weights), fmt(m.slots), fmt(m.kv), fmt(m.activations), m.scratch > 0 and (" + scratch " .. fmt(m.scratch)) or "",
      fmt(m.total), fmt(m.offloaded_bytes),
      e and string.format("; compute %.1f ms, load %.1f ms, uncovered %.1f ms per token", e.comp_ms, e.load_ms, e.uncover_ms) or "")
    if sizes.kv_kinds then lines[#lines + 1] = M.kv_kinds_line(p, i, sizes) end
    for s, st in ipairs(d.stages) do
      local a, b, off = st.blocks[1], st.blocks[2], st.offloaded or 0
      lines[#lines + 1] = string.format("    stage %d: %s%s", s, M.range_name(a, b),
        off == 0 and "" or (off == b - a + 1 and " (all offloaded)" or string.format(" (offloaded: %s)", M.range_name(a, a + off - 1))))
    end
  end
  for _, l in ipairs(ends_mod.describe(p, sizes, fmt)) do lines[#lines + 1] = l end
  lines[#lines + 1] = string.format("  offloaded: %s of %s of weights re-read every step (%.0f%%)", fmt(read),
    fmt(sizes.weight_bytes), 100 * read / sizes.weight_bytes)
  if est then
    lines[#lines + 1] = string.format("  estimate: %.1f ms/token = compute %.1f + communication %.1f + uncovered loading %.1f ms%s",
      est.ms_per_token, est.comp_ms, est.comm_ms, est.uncover_ms,
      est.bound and string.format(" (bound by %s%s)", est.bound, est.bottleneck and string.format(": device %d", est.bottleneck) or "")
      or est.bottleneck and string.format(" (bottleneck: device %d)", est.bottleneck) or "")
  end
  return table.concat(lines, "\n")
end

-- Lua source for a plan (what M.load and --plan read back).
function M.to_lua(p)
  local out = { "return {", string.format("  slots = %d,", p.slots or 1) }
  if p.slot_bytes then out[#out + 1] = string.format("  slot_bytes = %d, -- one slot used as a ring of this size", p.slot_bytes) end
  if p.per_block then out[#out + 1] = "  per_block = true, -- the slot holds one block: each offloaded block read when its turn comes" end
  if p.prefetch == false then out[#out + 1] = "  prefetch = false, -- a stage's reads start when the stage starts" end
  if p.embed_rows then out[#out + 1] = string.format("  embed_rows = %d, -- the embedding stays on disk, these rows cached", p.embed_rows) end
  if p.head_rows then out[#out + 1] = string.format("  head_rows = %d, -- the head read every step, these vocabulary rows at a time", p.head_rows) end
  if p.head_shares then
    local xs = {}
    for k, v in ipairs(p.head_shares) do xs[k] = tostring(v) end
    out[#out + 1] = string.format("  head_shares = { %s }, -- the head's vocabulary rows per device", table.concat(xs, ", "))
  end
  out[#out + 1] = "  devices = {"
  for _, d in ipairs(p.devices) do
    out[#out + 1] = "    { " .. (d.slot_bytes and string.format("slot_bytes = %d, ", d.slot_bytes) or "")
      .. (d.expert_slots and string.format("expert_slots = %d, ", d.expert_slots) or "") .. "stages = {"
    for _, st in ipairs(d.stages) do
      out[#out + 1] = string.format("      { blocks = { %d, %d }, offloaded = %d },", st.blocks[1], st.blocks[2], st.offloaded or 0)
    end
    out[#out + 1] = "    } },"
  end
  out[#out + 1] = "  },"
  out[#out + 1] = "}"
  return table.concat(out, "\n") .. "\n"
end

-- The plan's tables alone (no estimate or other annotations): what workers receive and files hold.
function M.bare(p)
  local q = { slots = p.slots, slot_bytes = p.slot_bytes, per_block = p.per_block, prefetch = p.prefetch,
    embed_rows = p.embed_rows, head_rows = p.head_rows, devices = {} }
  if p.head_shares then
    q.head_shares = {}
    for k, v in ipairs(p.head_shares) do q.head_shares[k] = v end
  end
  for i, d in ipairs(p.devices) do
    local stages = {}
    for s, st in ipairs(d.stages) do stages[s] = { blocks = { st.blocks[1], st.blocks[2] }, offloaded = st.offloaded or 0 } end
    q.devices[i] = { slot_bytes = d.slot_bytes, expert_slots = d.expert_slots, stages = stages }
  end
  return q
end

-- Write p to path as Lua, whole or not at all.
function M.save(path, p)
  local ok, err = json.write_file(path, M.to_lua(p))
  if not ok then error("--save-plan: " .. tostring(err), 0) end
end

-- What a plan file may use: data, and the pure standard functions (math without its random
-- numbers, string without dump, table; the basic functions that touch no state or files).
local function plan_env()
  local env = { ipairs = ipairs, pairs = pairs, next = next, select = select, tonumber = tonumber, tostring = tostring,
    type = type, unpack = unpack, error = error, assert = assert, math = {}, string = {}, table = {} }
  for k, v in pairs(math) do if k ~= "random" and k ~= "randomseed" then env.math[k] = v end end
  for k, v in pairs(string) do if k ~= "dump" then env.string[k] = v end end
  for k, v in pairs(table) do env.table[k] = v end
  return env
end

-- Read a plan from a Lua file (it returns the table; it runs with the pure functions above and
-- no other globals). Raises naming the file.
function M.load(path)
  local f, err = io.open(path, "rb")
  if not f then error("--plan: " .. tostring(err), 0) end
  local src = f:read("*a")
  f:close()
  if src:byte(1) == 27 then error(path .. ": a plan is Lua source, not bytecode", 0) end
  local chunk, perr = loadstring(src, "@" .. path)
  if not chunk then error(path .. ": " .. perr, 0) end
  setfenv(chunk, plan_env())
  local ok, p = pcall(chunk)
  if not ok then error(path .. ": " .. tostring(p), 0) end
  if type(p) ~= "table" then error(path .. ": the file must return the plan table", 0) end
  return p
end

-- The plan p with device i's stage k reading its first `offloaded` blocks every step (a bare
-- copy; p itself when nothing changes). Raises naming the stage or the count.
function M.restaged(p, i, k, offloaded)
  local d = p.devices[i]
  if not d then error(string.format("restage: device %s is not one of %d", tostring(i), #p.devices), 0) end
  local st = d.stages[k]
  if not st then error(string.format("restage: stage %s is not one of the plan's %d", tostring(k), #d.stages), 0) end
  local n = st.blocks[2] - st.blocks[1] + 1
  if type(offloaded) ~= "number" or offloaded < 0 or offloaded > n or offloaded ~= math.floor(offloaded) then
    error(string.format("restage: stage %d has %d blocks; offloaded %s is not in 0..%d", k, n, tostring(offloaded), n), 0)
  end
  if offloaded == (st.offloaded or 0) then return p end
  local p2 = M.bare(p)
  p2.devices[i].stages[k].offloaded = offloaded
  return p2
end

return M
