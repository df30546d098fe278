-- The plan space the paper's scheduler searches (docs/planning.md, "The plan space"), shared by
-- the DP scheduler and the brute-force one so that both search exactly the same plans:
--
-- A *shape* (S, R, E): S stages per device, R blocks per round of the ring, E blocks more (or,
-- negative, fewer) in the last round, S * R + E = the model's blocks, |E| <= N.
-- A *choice* per device i: n_i >= 1 blocks per stage (sum over devices = R: every round has the
-- same template), x_i in {0, sign(E)} blocks more in its last stage (sum = E), o_i blocks
-- offloaded at the start of each stage (min(o_i, stage length)), k_i = 1 (the slot holds one
-- stage's reads) or 2 (a ring of two stages': a stage's reads run while the stage before
-- computes its offloaded blocks).
-- Device i's stage s (0-based) starts at s * R + (n_1 + ... + n_{i-1}), and its last stage at
-- (S - 1) * R + (n_1 + ... + n_{i-1}) + (x_1 + ... + x_{i-1}): what device i holds depends on
-- its own choice and on the blocks and extras before it in a round (L, X) only. That is what
-- lets a DP over devices be exact.
--
-- Layers of a model have the same shapes: blocks count by kind (MHA = even block numbers).
--
-- The helpers a scheduler of one's own calls (shapes_for, shapes, build, budget, speed, split,
-- ring_of, least_offload, fill, oom, memory_opts) check their arguments and raise naming the
-- helper and the argument, at the caller's line; part, part_total, total and memory, the DP's
-- inner loop, do not.
local plan = require "loip.plan"
local memory = require "loip.runtime.memory"

local M = {}

-- Misuse of a helper: raised at the line that called it (the first frame outside this file).
local here = debug.getinfo(1, "S").source
local function misuse(fn, f, ...)
  local level = 2
  while true do
    local info = debug.getinfo(level, "S")
    if not info or info.source ~= here then break end
    level = level + 1
  end
  error(string.format("loip.plan.space.%s: " .. f, fn, ...), level)
end

-- What a bad argument is, in a message: "nil", or "a TYPE".
local function kind_of(v) return v == nil and "nil" or "a " .. type(v) end

local function is_int(v) return type(v) == "number" and v == math.floor(v) and v > -math.huge and v < math.huge end

-- The argument name of fn must be an integer >= least.
local function want_int(fn, name, v, least)
  if not is_int(v) or v < least then
    misuse(fn, "%s is %s, not an integer >= %d", name, type(v) == "number" and tostring(v) or kind_of(v), least)
  end
end

-- problem must be a problem table (loip.plan.problem).
local function want_problem(fn, problem)
  if type(problem) ~= "table" or type(problem.devices) ~= "table" or type(problem.model) ~= "table" then
    misuse(fn, "problem is %s, not a problem (a table with devices and model: loip.plan.problem)",
      kind_of(problem) .. (type(problem) == "table" and " without devices or model" or ""))
  end
end

-- ... and i one of its devices.
local function want_device(fn, problem, i)
  want_problem(fn, problem)
  if not is_int(i) or i < 1 or i > #problem.devices then
    misuse(fn, "device i is %s, not a device of the problem (1..%d)", tostring(i), #problem.devices)
  end
end

-- p must be a plan with a device i that has stages.
local function want_plan(fn, p, i)
  if type(p) ~= "table" or type(p.devices) ~= "table" or type(p.devices[i]) ~= "table" or type(p.devices[i].stages) ~= "table"
    or #p.devices[i].stages == 0 then
    misuse(fn, "p is %s, not a plan whose devices[%d] has stages", kind_of(p) .. (type(p) == "table"
      and " without devices[" .. tostring(i) .. "].stages" or ""), i)
  end
end

-- The shapes for S stages on N devices of a model of nb blocks: { {S=, R=, E=}, ... }.
function M.shapes_for(S, N, nb)
  want_int("shapes_for", "S (stages)", S, 1)
  want_int("shapes_for", "N (devices)", N, 1)
  want_int("shapes_for", "nb (blocks)", nb, 1)
  local out = {}
  if S == 1 then
    if nb >= N then out[1] = { S = 1, R = nb, E = 0 } end
    return out
  end
  local R0 = math.floor(nb / S)
  local E0 = nb - S * R0
  if R0 >= N and E0 <= N then out[#out + 1] = { S = S, R = R0, E = E0 } end
  if E0 > 0 then
    local R1, E1 = R0 + 1, E0 - S -- one block fewer in some last stages
    if -E1 <= N and R1 >= N - E1 then out[#out + 1] = { S = S, R = R1, E = E1 } end
  end
  return out
end

-- Every shape of a problem: S from 1 up (or problem.stages alone).
function M.shapes(problem)
  want_problem("shapes", problem)
  local N, nb = #problem.devices, problem.model.n_blocks
  local out = {}
  local from, to = problem.stages or 1, problem.stages or math.floor(nb / N)
  for S = from, to do
    for _, sh in ipairs(M.shapes_for(S, N, nb)) do out[#out + 1] = sh end
  end
  return out
end

-- MHA blocks are the even ones: a run of len blocks from `start` holds floor((len + e) / 2) of
-- them, e = 1 when start is even.
local band, rshift = bit.band, bit.rshift
local function mha_in(start, len) return rshift(len + 1 - band(start, 1), 1) end

-- What a device holds for the choice (n, x, o) after L template blocks and X extras of the
-- devices before it in a round: its MHA and MLP blocks, those of them offloaded, the most one
-- stage reads (bytes), and the stages that read. Its stages come in three kinds: full stages
-- starting at an even or an odd block (with R odd their parity alternates), and the last one.
local function holds(sz, shape, L, X, n, x, o)
  local S, R = shape.S, shape.R
  local cA, cB = S - 1, 0
  if band(R, 1) == 1 then cA, cB = S - 1 - rshift(S - 1, 1), rshift(S - 1, 1) end
  local offF, lastlen = math.min(o, n), n + x
  local offZ = math.min(o, lastlen)
  local zs = (S - 1) * R + L + X
  local omhaA, omhaB, omhaZ = mha_in(L, offF), mha_in(L + 1, offF), mha_in(zs, offZ)
  local n_mha = cA * mha_in(L, n) + cB * mha_in(L + 1, n) + mha_in(zs, lastlen)
  local off_mha = cA * omhaA + cB * omhaB + omhaZ
  local mb, pb = sz.mha_bytes, sz.mlp_bytes
  -- (a kind of stage that does not occur reads 0)
  local most = math.max(omhaZ * mb + (offZ - omhaZ) * pb, math.min(cA, 1) * (omhaA * mb + (offF - omhaA) * pb),
    math.min(cB, 1) * (omhaB * mb + (offF - omhaB) * pb))
  local reading = (S - 1) * (offF > 0 and 1 or 0) + (offZ > 0 and 1 or 0)
  return n_mha, (cA + cB) * n + lastlen - n_mha, off_mha, (cA + cB) * offF + offZ - off_mha, most, reading
end

-- (sliding windows: sz.ringed) The KV of device i's layers for the choice (n, x) after L template
-- blocks and X extras: its stages' full and window layers counted from sz.kv_full_before (full
-- layers' attention blocks before each block), as M.build lays the stages out. nil otherwise.
local function ringed_kv(sz, shape, L, X, n, x, n_mha)
  local pre = sz.kv_full_before
  if not pre then return nil end
  local full, S, R, nb = 0, shape.S, shape.R, sz.n_blocks
  for s = 0, S - 1 do
    local start = s * R + L + (s == S - 1 and X or 0)
    local stop = math.min(nb, start + n + (s == S - 1 and x or 0))
    if stop > start then full = full + pre[stop] - pre[start] end
  end
  local k = sz.kv_kinds
  return sz.kv_bytes[0] + full * (k.full_bytes or 0) + (n_mha - full) * k.window_bytes
end

-- Device i's part (loip.plan.device_part's table, without building the plan) for the choice
-- (n, x, o, k) after L template blocks and X extras of the devices before it in a round.
function M.part(problem, shape, i, L, X, n, x, o, k)
  local sz, N = problem.model, #problem.devices
  local n_mha, n_mlp, off_mha, off_mlp, most, loads = holds(sz, shape, L, X, n, x, o)
  local mb, pb = sz.mha_bytes, sz.mlp_bytes
  return { S = shape.S, n_mha = n_mha, n_mlp = n_mlp, off_mha = off_mha, off_mlp = off_mlp,
    off_bytes = off_mha * mb + off_mlp * pb,
    res_bytes = (n_mha - off_mha) * mb + (n_mlp - off_mlp) * (sz.mlp_res_bytes or pb) + (sz.moe and off_mlp * sz.moe.gating_bytes or 0),
    stage_off_max = most, loads = loads, layers = n_mha, kv = ringed_kv(sz, shape, L, X, n, x, n_mha), slot_bytes = k * most, slots = most > 0 and 1 or 0,
    ring = most > 0 and k >= 2, embed = i == 1, head = i == N, first = i == 1, last = i == N, per_block = false,
    prefetch = true, ends = problem.ends, off_moe = sz.moe and off_mlp or nil,
    share = problem.ends and problem.ends.head_shares and problem.ends.head_shares[i] or nil,
    expert_slots = sz.moe and off_mlp > 0 and plan.min_expert_slots(sz) or nil }
end

-- What device i of a problem holds whatever its part (the ends, activations, message buffers),
-- and whether its loader needs a bounce buffer: kept per problem, for the inner loops.
local fixed_of = setmetatable({}, { __mode = "k" })
local function fixed(problem, i)
  local f = fixed_of[problem]
  if not f then
    f = {}
    fixed_of[problem] = f
  end
  local v = f[i]
  if not v then
    local sz, N = problem.model, #problem.devices
    local ends = problem.ends
    local ew, eb, how, ea = plan.ends.memory(sz, ends, i == 1, i == N, ends and ends.head_shares and ends.head_shares[i])
    v = sz.activation_bytes + ew + eb + (problem.cluster and plan.device_bytes(sz, i == N or how.cut) + ea or 0)
    f[i] = v
    f.bounce = plan.loader_scratch(4096, problem.loader) > 0
  end
  return v, f.bounce
end

-- M.total(problem, M.part(...)) without making the part (the DP's inner loop).
function M.part_total(problem, shape, i, L, X, n, x, o, k)
  local sz = problem.model
  local n_mha, n_mlp, off_mha, off_mlp, most = holds(sz, shape, L, X, n, x, o)
  local kv = sz.kv_bytes[n_mha]
  if not kv then return math.huge end -- more layers than the model has: no such part
  kv = ringed_kv(sz, shape, L, X, n, x, n_mha) or kv
  local res = (n_mha - off_mha) * sz.mha_bytes + (n_mlp - off_mlp) * (sz.mlp_res_bytes or sz.mlp_bytes)
  local base, bounce = fixed(problem, i)
  local slot = k * most
  if sz.moe and off_mlp > 0 then
    slot = slot + plan.min_expert_slots(sz) * sz.moe.expert_bytes
    res = res + off_mlp * sz.moe.gating_bytes + plan.loader_scratch(sz.moe.expert_bytes, problem.loader)
  end
  if bounce and slot > 0 then
    local ends = problem.ends
    return plan.total_of(sz, problem, i == 1, i == #problem.devices, res, slot, n_mha, kv, ends and ends.head_shares and ends.head_shares[i])
  end
  return res + slot + kv + base
end

-- The plan of a shape and a choice { n = {...}, x = {...}, o = {...}, k = {...} } (x and k may
-- be nil: none, 1).
function M.build(problem, shape, choice)
  want_problem("build", problem)
  if type(shape) ~= "table" or not is_int(shape.S) or not is_int(shape.R) then
    misuse("build", "shape is %s, not a shape { S, R, E } (M.shapes)", kind_of(shape))
  end
  if type(choice) ~= "table" or type(choice.n) ~= "table" or type(choice.o) ~= "table" then
    misuse("build", "choice is %s, not a choice { n = {...}, o = {...} [, x, k] }", kind_of(choice))
  end
  for i = 1, #problem.devices do
    if not is_int(choice.n[i]) or choice.n[i] < 1 then misuse("build", "choice.n[%d] is %s, not a block count >= 1", i, tostring(choice.n[i])) end
    if not is_int(choice.o[i]) or choice.o[i] < 0 then misuse("build", "choice.o[%d] is %s, not a block count >= 0", i, tostring(choice.o[i])) end
  end
  local N, S, R = #problem.devices, shape.S, shape.R
  local p = { slots = 1, devices = {} }
  local L, X = 0, 0
  for i = 1, N do
    local n, x, o, k = choice.n[i], choice.x and choice.x[i] or 0, choice.o[i], choice.k and choice.k[i] or 1
    local d = { stages = {} }
    local most = 0
    for s = 0, S - 1 do
      local start = s * R + L + (s == S - 1 and X or 0)
      local len = n + (s == S - 1 and x or 0)
      local off = math.min(o, len)
      d.stages[s + 1] = { blocks = { start, start + len - 1 }, offloaded = off }
      local bytes = 0
      for b = start, start + off - 1 do bytes = bytes + problem.model.block_bytes[b] end
      most = math.max(most, bytes)
    end
    if k >= 2 and most > 0 then d.slot_bytes = k * most end
    p.devices[i] = d
    L, X = L + n, X + x
  end
  return p
end

-- Bytes device i of problem has for its part: its budget (0: unlimited -> math.huge).
function M.budget(problem, i)
  want_device("budget", problem, i)
  local b = problem.devices[i].budget or 0
  return b > 0 and b or math.huge
end

-- The memory accounting options a problem implies (loip.plan.memory, part_memory, over_budget).
function M.memory_opts(problem)
  want_problem("memory_opts", problem)
  return { cluster = problem.cluster, loader = problem.loader, ends = problem.ends }
end

-- ms to read `bytes` in `loads` reads on device d of a problem (its disk rate and the time a read
-- takes besides): what the cost model and the simulator price a read at.
function M.read_ms(d, bytes, loads)
  return bytes / d.disk_bps * 1e3 + (loads or 1) * (d.load_ms or 0)
end

-- ms to read a mixture of experts' `reads` experts (`bytes`) on device d: at the rate of a
-- layer's experts read at once (d.expert_bps, when its profile measured it), each layer's reads
-- together paying one read's time besides, over `layers` layer runs.
function M.expert_read_ms(d, bytes, reads, layers)
  if reads <= 0 then return 0 end
  return bytes / (d.expert_bps or d.disk_bps) * 1e3 + math.min(reads, layers or reads) * (d.load_ms or 0)
end

-- The memory of a part (loip.plan.part_memory) under the problem's accounting, and its total.
function M.memory(problem, part)
  return plan.part_memory(part, problem.model, M.memory_opts(problem))
end
function M.total(problem, part)
  return plan.part_total(part, problem.model, problem)
end

-- Blocks 0..nb-1 split into #shares contiguous ranges sized in proportion to shares (each at
-- least one block): { {first, last}, ... }. shares: a list of finite numbers >= 0, not all 0,
-- at most nb of them.
function M.split(nb, shares)
  want_int("split", "nb (blocks)", nb, 1)
  if type(shares) ~= "table" then
    misuse("split", "shares is %s, not a list of numbers (one per range)", kind_of(shares))
  end
  local last = 0
  for k in pairs(shares) do
    if not is_int(k) or k < 1 then misuse("split", "shares has the key %s: it is a list (1..n) of numbers", tostring(k)) end
    last = math.max(last, k)
  end
  if last == 0 then
    misuse("split", "shares is empty: a list of numbers, one per range, is needed (were its values nil? a misspelt field "
      .. "of the problem, e.g. disk_rate for disk_bps, is nil)")
  end
  local total = 0
  for k = 1, last do
    local w = shares[k]
    if w == nil then
      misuse("split", "shares[%d] is nil (shares has %d entries: a misspelt field of the problem, e.g. disk_rate for disk_bps, is nil)",
        k, last)
    end
    if type(w) ~= "number" or w ~= w or w < 0 or w == math.huge then
      misuse("split", "shares[%d] is %s, not a finite number >= 0%s", k, type(w) == "number" and tostring(w) or "a " .. type(w),
        w == math.huge and " (an unlimited budget is math.huge: cap it, e.g. math.min(space.budget(problem, i), 2^40))" or "")
    end
    total = total + w
  end
  if total <= 0 then misuse("split", "shares are all 0: nothing to split %d blocks by", nb) end
  if last > nb then misuse("split", "%d shares but only %d blocks: every range needs a block", last, nb) end
  local out, at, acc = {}, 0, 0
  for k, w in ipairs(shares) do
    acc = acc + w / total
    local to = k == #shares and nb or math.max(at + 1, math.floor(acc * nb + 0.5))
    to = math.min(to, nb - (#shares - k)) -- leave a block for every later range
    out[k] = { at, to - 1 }
    at = to
  end
  return out
end

-- A plan whose hops, in ring order (stage by stage, device by device), hold `ranges`
-- (#ranges = N * S), nothing offloaded yet.
function M.ring_of(N, ranges)
  want_int("ring_of", "N (devices)", N, 1)
  if type(ranges) ~= "table" or #ranges == 0 then
    misuse("ring_of", "ranges is %s, not a non-empty list of { first, last } (space.split makes one)",
      type(ranges) == "table" and "empty" or kind_of(ranges))
  end
  if #ranges % N ~= 0 then
    misuse("ring_of", "%d ranges for %d devices: one per hop, N x S of them (S stages per device)", #ranges, N)
  end
  for k, r in ipairs(ranges) do
    if type(r) ~= "table" or not is_int(r[1]) or not is_int(r[2]) or r[2] < r[1] then
      misuse("ring_of", "ranges[%d] is not { first, last } (two block numbers, first <= last)", k)
    end
  end
  local p = { slots = 1, devices = {} }
  for i = 1, N do p.devices[i] = { stages = {} } end
  for k, r in ipairs(ranges) do
    local i, s = (k - 1) % N + 1, math.floor((k - 1) / N) + 1
    p.devices[i].stages[s] = { blocks = { r[1], r[2] }, offloaded = 0 }
  end
  return p
end

-- Device i offloads the fewest blocks per stage (the same count in every stage, at most its
-- length) that fit its budget. Returns true, or false leaving every block offloaded.
function M.least_offload(problem, p, i)
  want_device("least_offload", problem, i)
  want_plan("least_offload", p, i)
  local d, budget = p.devices[i], M.budget(problem, i)
  local longest = 0
  for _, st in ipairs(d.stages) do longest = math.max(longest, st.blocks[2] - st.blocks[1] + 1) end
  local function fits(k)
    for _, st in ipairs(d.stages) do st.offloaded = math.min(k, st.blocks[2] - st.blocks[1] + 1) end
    return M.total(problem, plan.device_part(p, i, problem.model)) <= budget
  end
  -- reading one more block of every stage frees at least as much as the slot grows (with two
  -- stages or more; with one, the slot takes what the blocks free): bisect
  if not fits(longest) then return false end
  local lo, hi = 0, longest
  while lo < hi do
    local k = math.floor((lo + hi) / 2)
    if fits(k) then hi = k else lo = k + 1 end
  end
  fits(lo)
  return true
end

-- "OOM: device i ..." for a plan that breaks device i's budget even so, and the shortfall.
function M.oom(problem, p, i, what)
  want_device("oom", problem, i)
  want_plan("oom", p, i)
  local m = M.memory(problem, plan.device_part(p, i, problem.model))
  local fmt = memory.format_bytes
  return string.format("OOM: device %d needs %s%s (weights %s, slot %s, kv %s, activations %s) but its budget is %s: short by %s",
    i, fmt(m.total, problem.devices[i].budget), what and (" " .. what) or "", fmt(m.weights), fmt(m.slots), fmt(m.kv), fmt(m.activations),
    fmt(problem.devices[i].budget, m.total), fmt(m.total - problem.devices[i].budget)), m.total - problem.devices[i].budget
end

-- How fast device i computes a block, relative (1 / ms of an average block, slowed).
function M.speed(problem, i)
  want_device("speed", problem, i)
  local d = problem.devices[i]
  if type(d.compute) ~= "table" or type(d.compute.mha_ms) ~= "number" or type(d.compute.mlp_ms) ~= "number" then
    misuse("speed", "problem.devices[%d].compute has no mha_ms and mlp_ms (a problem from loip.plan.problem has them)", i)
  end
  return 1 / ((d.compute.mha_ms + d.compute.mlp_ms) / 2 * (d.slowdown or 1))
end

-- Keep resident, while device i's memory allows, offloaded blocks of plan p (each the last
-- offloaded one of its stage, so that offloaded blocks stay first), the largest that fits each
-- time (it saves the most reading). A slot the plan sizes (slot_bytes) keeps its size; otherwise
-- it follows the largest stage's reads. Changes p in place; returns how many blocks it kept.
function M.fill(problem, p, i)
  want_device("fill", problem, i)
  want_plan("fill", p, i)
  local d, sizes = p.devices[i], problem.model
  local budget = M.budget(problem, i)
  local part = plan.device_part(p, i, sizes)
  local given = d.slot_bytes or (#p.devices == 1 and p.slot_bytes) or 0
  local per_block = p.per_block
  -- what each stage reads (per block: its biggest block), so that a change costs O(S)
  local read, S = {}, #d.stages
  for s, st in ipairs(d.stages) do
    local sum, big = 0, 0
    for b = st.blocks[1], st.blocks[1] + (st.offloaded or 0) - 1 do
      sum, big = sum + sizes.block_bytes[b], math.max(big, sizes.block_bytes[b])
    end
    read[s] = per_block and big or sum
  end
  local function slot()
    local most = 0
    for s = 1, S do if read[s] > most then most = read[s] end end
    return most > 0 and math.max(most, given) or 0
  end
  local slots = p.slots or 1
  -- (a mixture of experts: while MLP blocks stay offloaded, their routers for pre-gating and the
  -- smallest expert cache come with them)
  local moe, off_mlp = sizes.moe, part.off_mlp
  local function moe_bytes()
    if not moe or off_mlp == 0 then return 0 end
    return off_mlp * moe.gating_bytes + plan.min_expert_slots(sizes) * moe.expert_bytes
      + plan.loader_scratch(moe.expert_bytes, problem.loader)
  end
  local function total(res, sl)
    return plan.total_of(sizes, problem, part.first, part.last, res + moe_bytes(), slots * sl, part.layers, nil, part.share)
  end
  local res = part.res_bytes - (moe and part.off_mlp * moe.gating_bytes or 0)
  local kept = 0
  while true do
    local best, best_bytes, best_read
    for s, st in ipairs(d.stages) do
      local off = st.offloaded or 0
      if off > 0 then
        local b = st.blocks[1] + off - 1
        local bytes = (sizes.res_bytes or sizes.block_bytes)[b] -- resident, it holds this much and reads none of block_bytes[b]
        if not best_bytes or bytes > best_bytes then
          local before = read[s]
          if per_block then
            read[s] = 0
            for b = st.blocks[1], st.blocks[1] + off - 2 do read[s] = math.max(read[s], sizes.block_bytes[b]) end
          else
            read[s] = before - sizes.block_bytes[b]
          end
          if b % 2 == 1 then off_mlp = off_mlp - 1 end
          if total(res + bytes, slot()) <= budget then best, best_bytes, best_read = s, bytes, read[s] end
          if b % 2 == 1 then off_mlp = off_mlp + 1 end
          read[s] = before
        end
      end
    end
    if not best then return kept end
    local st = d.stages[best]
    if (st.blocks[1] + st.offloaded - 1) % 2 == 1 then off_mlp = off_mlp - 1 end
    st.offloaded = st.offloaded - 1
    read[best], res, kept = best_read, res + best_bytes, kept + 1
  end
end

-- The most experts a cache holds (its loader's slots: runtime/loader/loader.c takes 1024 at most).
M.MAX_EXPERT_SLOTS = 1024

-- Give device i's expert cache the memory plan p leaves it of avail bytes (at most every expert
-- it serves, and M.MAX_EXPERT_SLOTS; at least the top-k, which the plan's memory already counts), less
-- what a KV cache growing online past the plan's positions will take; without a budget (avail
-- 0), a layer's experts. Changes p in place.
function M.size_expert_cache(p, i, sizes, avail, opts)
  if not sizes.moe then return end
  local d = p.devices[i]
  local part = plan.device_part(p, i, sizes)
  if (part.off_moe or 0) == 0 or d.expert_slots then return end
  local m = plan.memory(p, i, sizes, opts)
  -- (a KV cache that grows online past the plan's positions keeps its room: the cache does not take it)
  local grows = sizes.plan_positions < sizes.kv_tokens
    and math.ceil(m.kv / math.max(1, sizes.plan_positions) * (sizes.kv_tokens - sizes.plan_positions)) or 0
  local most = math.min(part.off_moe * sizes.moe.experts, M.MAX_EXPERT_SLOTS)
  if avail <= 0 then -- (no budget: the memory a layer's experts read as one dense block would take)
    d.expert_slots = math.min(most, math.max(part.expert_slots, sizes.moe.experts))
    return
  end
  local room = avail - m.total - grows
  d.expert_slots = math.min(most, part.expert_slots + math.max(0, math.floor(room / sizes.moe.expert_bytes)))
end

return M
