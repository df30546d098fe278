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
local plan = require "loip.plan"

local M = {}

-- The shapes for S stages on N devices of a model of nb blocks: { {S=, R=, E=}, ... }.
function M.shapes_for(S, N, nb)
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

-- Device i's part (loip.plan.device_part's table, without building the plan) for the choice
-- (n, x, o, k) after L template blocks and X extras of the devices before it in a round. Its
-- stages come in three kinds: full stages starting at an even or an odd block (with R odd
-- their parity alternates), and the last one.
function M.part(problem, shape, i, L, X, n, x, o, k)
  local sz, N = problem.model, #problem.devices
  local S, R = shape.S, shape.R
  local cA, cB = S - 1, 0
  if R % 2 == 1 then cA, cB = math.ceil((S - 1) / 2), math.floor((S - 1) / 2) end
  local offF, lastlen = math.min(o, n), n + x
  local offZ = math.min(o, lastlen)
  local zs = (S - 1) * R + L + X
  local mhaA, omhaA = mha_in(L, n), mha_in(L, offF)
  local mhaB, omhaB = mha_in(L + 1, n), mha_in(L + 1, offF)
  local mhaZ, omhaZ = mha_in(zs, lastlen), mha_in(zs, offZ)
  local p = { S = S, embed = i == 1, head = i == N, first = i == 1, last = i == N, per_block = false, prefetch = true }
  p.n_mha = cA * mhaA + cB * mhaB + mhaZ
  p.n_mlp = (cA + cB) * n + lastlen - p.n_mha
  p.off_mha = cA * omhaA + cB * omhaB + omhaZ
  p.off_mlp = (cA + cB) * offF + offZ - p.off_mha
  local mb, pb = sz.mha_bytes, sz.mlp_bytes
  p.off_bytes = p.off_mha * mb + p.off_mlp * pb
  p.res_bytes = (p.n_mha - p.off_mha) * mb + (p.n_mlp - p.off_mlp) * pb
  local most = omhaZ * mb + (offZ - omhaZ) * pb
  if cA > 0 then most = math.max(most, omhaA * mb + (offF - omhaA) * pb) end
  if cB > 0 then most = math.max(most, omhaB * mb + (offF - omhaB) * pb) end
  p.stage_off_max = most
  p.loads = (S - 1) * (offF > 0 and 1 or 0) + (offZ > 0 and 1 or 0)
  p.layers = p.n_mha
  p.slot_bytes = most > 0 and k * most or 0
  p.slots = most > 0 and 1 or 0
  p.ring = most > 0 and k >= 2
  return p
end

-- M.total(problem, M.part(...)) without making the part (the DP's inner loop).
function M.part_total(problem, shape, i, L, X, n, x, o, k)
  local sz, N = problem.model, #problem.devices
  local S, R = shape.S, shape.R
  local cA, cB = S - 1, 0
  if band(R, 1) == 1 then cA, cB = S - 1 - rshift(S - 1, 1), rshift(S - 1, 1) end
  local offF, lastlen = math.min(o, n), n + x
  local offZ = math.min(o, lastlen)
  local zs = (S - 1) * R + L + X
  local omhaA, omhaB, omhaZ = mha_in(L, offF), mha_in(L + 1, offF), mha_in(zs, offZ)
  local n_mha = cA * mha_in(L, n) + cB * mha_in(L + 1, n) + mha_in(zs, lastlen)
  local blocks = (cA + cB) * n + lastlen
  local off_mha = cA * omhaA + cB * omhaB + omhaZ
  local off = (cA + cB) * offF + offZ
  local mb, pb = sz.mha_bytes, sz.mlp_bytes
  local res = (n_mha - off_mha) * mb + ((blocks - n_mha) - (off - off_mha)) * pb
  -- the largest stage's reads (a kind of stage that does not occur counts 0)
  local most = math.max(omhaZ * mb + (offZ - omhaZ) * pb, math.min(cA, 1) * (omhaA * mb + (offF - omhaA) * pb),
    math.min(cB, 1) * (omhaB * mb + (offF - omhaB) * pb))
  return plan.total_of(sz, problem, i == 1, i == N, res, k * most, n_mha)
end

-- The plan of a shape and a choice { n = {...}, x = {...}, o = {...}, k = {...} } (x and k may
-- be nil: none, 1).
function M.build(problem, shape, choice)
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
  local b = problem.devices[i].budget or 0
  return b > 0 and b or math.huge
end

-- The memory of a part (loip.plan.part_memory) under the problem's accounting, and its total.
function M.memory(problem, part)
  return plan.part_memory(part, problem.model, { cluster = problem.cluster, loader = problem.loader })
end
function M.total(problem, part)
  return plan.part_total(part, problem.model, problem)
end

-- Blocks 0..nb-1 split into #shares contiguous ranges sized in proportion to shares (each at
-- least one block): { {first, last}, ... }.
function M.split(nb, shares)
  local total = 0
  for _, w in ipairs(shares) do total = total + w end
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
  local d, budget = p.devices[i], M.budget(problem, i)
  local longest = 0
  for _, st in ipairs(d.stages) do longest = math.max(longest, st.blocks[2] - st.blocks[1] + 1) end
  for k = 0, longest do
    for _, st in ipairs(d.stages) do st.offloaded = math.min(k, st.blocks[2] - st.blocks[1] + 1) end
    if M.total(problem, plan.device_part(p, i, problem.model)) <= budget then return true end
  end
  return false
end

-- "OOM: device i ..." for a plan that breaks device i's budget even so.
function M.oom(problem, p, i, what)
  local m = M.memory(problem, plan.device_part(p, i, problem.model))
  local fmt = require("loip.runtime.memory").format_bytes
  return string.format("OOM: device %d needs %s%s (weights %s, slot %s, kv %s, activations %s) but its budget is %s: short by %s",
    i, fmt(m.total), what and (" " .. what) or "", fmt(m.weights), fmt(m.slots), fmt(m.kv), fmt(m.activations),
    fmt(problem.devices[i].budget), fmt(m.total - problem.devices[i].budget))
end

-- How fast device i computes a block, relative (1 / ms of an average block, slowed).
function M.speed(problem, i)
  local d = problem.devices[i]
  return 1 / ((d.compute.mha_ms + d.compute.mlp_ms) / 2 * (d.slowdown or 1))
end

-- Keep resident, while device i's memory allows, offloaded blocks of plan p (each the last
-- offloaded one of its stage, so that offloaded blocks stay first), the largest that fits each
-- time (it saves the most reading). A slot the plan sizes (slot_bytes) keeps its size; otherwise
-- it follows the largest stage's reads. Changes p in place; returns how many blocks it kept.
-- once: keep at most one.
function M.fill(problem, p, i, once)
  local d, sizes = p.devices[i], problem.model
  local budget = M.budget(problem, i)
  local kept = 0
  while true do
    local best, best_bytes
    for s, st in ipairs(d.stages) do
      local off = st.offloaded or 0
      if off > 0 then
        local bytes = sizes.block_bytes[st.blocks[1] + off - 1]
        if not best_bytes or bytes > best_bytes then
          st.offloaded = off - 1
          if M.total(problem, plan.device_part(p, i, sizes)) <= budget then best, best_bytes = s, bytes end
          st.offloaded = off
        end
      end
    end
    if not best then return kept end
    d.stages[best].offloaded = d.stages[best].offloaded - 1
    kept = kept + 1
    if once then return kept end
  end
end

return M
