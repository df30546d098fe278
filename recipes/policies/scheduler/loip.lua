-- scheduler "loip": the paper's fine-grained allocation scheduler (Alg. 1; docs/planning.md,
-- "The scheduler"). For every stage count S (and round template: loip.plan.space), a dynamic
-- program over the devices in ring order places each device's blocks per stage, keeping as many
-- resident as its memory holds ("retained layers first") and offloading the rest, and finds the
-- placement with the least estimated time; then block-level refinement: while the device whose
-- loading bounds the step has memory for one more block, it keeps one more MHA or MLP block
-- resident. The S with the least time wins.
--
-- The DP is exact for cost models of the form T = max(sum_i comp_i + comm(S), max_i serial_i)
-- whose per-device terms do not shrink when a device holds or reads more (the "loip" cost model
-- is one: its device() and comm() give the terms). State F(i, l, x): the first i devices placed
-- with l blocks of each round's template and x extra blocks of the last round; each state keeps
-- the non-dominated (sum of comp, max of serial) pairs, so the objective's max of a sum and a max
-- is minimised exactly. O(N * R^2) moves per S (R = blocks per round), pruned by what the best
-- plan so far allows.
--
-- Local devices sharing one disk are priced by the estimate at the rate of as many as read beside
-- them, which is not device by device: the DP runs once per set of them allowed to read and again
-- at the rates a plan's estimate found (M.pricings, M.search), and the estimate judges the plans.
local bit = require "bit"
local space = require "loip.plan.space"
local plan_of = require "loip.plan"
local refine = require "loip.plan.refine"
local policy = require "loip.policy"
local problem_mod = require "loip.plan.problem"

local M = { name = "loip" }

-- Its settings (docs/planning.md, "The policy API"), e.g. --scheduler loip:refine=off.
M.settings = {
  { "refine", "bool", "after the DP, block-level refinement and the even-split layouts (off: the DP's best as it is)",
    default = true },
  { "relayout", "bool", "move single blocks between the devices of a round when a plan has a few blocks per hop", default = true },
  { "unit", "int", "blocks the DP places at a time, 1 (a block) or 2 (a layer); 0: 2 for models over 64 blocks, else 1",
    default = 0, check = function(v) return v >= 0 and v <= 2, "must be 0, 1 or 2" end },
}

-- MHA blocks among len blocks from block `start` (the even ones).
local function mha_in(start, len) return math.floor((len + 1 - start % 2) / 2) end

-- The least compute of an MHA block, an MLP block and the head on any device (no contention,
-- no slowdown): the lower bounds the DP prunes with.
local function least_compute(problem)
  local mha, mlp, head = math.huge, math.huge, math.huge
  for _, d in ipairs(problem.devices) do
    mha, mlp = math.min(mha, d.compute.mha_ms), math.min(mlp, d.compute.mlp_ms)
    head = math.min(head, d.compute.head_ms or 0)
  end
  return mha, mlp, head
end

-- A device's options for n blocks per stage and x extra in its last stage, after L template
-- blocks and X extras: the least offloaded count that fits with a one-stage slot (reading more
-- only adds time) and, while it could be faster, a ring of two stages: { a, b, o, k [, a, b, o,
-- k], lb = load_ms } (a: comp_ms, b: serial_ms, lb: the reading alone), or false when nothing
-- fits. The ring option is worked out only when asked for (with_ring: once the slot's bounds
-- have not ruled the move out; the ring reads at least as much). Only the parities of L and
-- L + X matter (which blocks are MHA), so a family (device, parities, x) is worked out once, as
-- the DP asks: memory does not shrink as n grows (so past its largest n nothing fits, and the
-- least offloaded count never falls with n), nor grow as a one-stage slot takes more of each
-- stage (so that count is found by a search from the last n's).
local function family(problem, cost, shape, i, L, X, x, budget, cap)
  local fam = {}
  local function fits(n, o, k) return space.part_total(problem, shape, i, L, X, n, x, o, k) <= budget end
  -- the ring option, added to opt when the DP first looks past the one-stage slot's bounds
  local function add_ring(n, opt)
    opt.ringed = true
    local o = opt[3]
    if o == 0 then return end
    for r = o, n + math.max(x, 0) do
      local u = cost.device(problem, i, space.part(problem, shape, i, L, X, n, x, r, 2))
      if u.serial_ms >= opt[2] then return end -- reading more on a ring no longer beats the slot
      if fits(n, r, 2) then
        opt[5], opt[6], opt[7], opt[8] = u.comp_ms, u.serial_ms, r, 2
        return
      end
    end
  end
  return function(n, with_ring)
    if n > cap or n + x < 1 then return false end
    local opt = fam[n]
    if not opt then
      local maxlen = n + math.max(x, 0)
      -- gallop from the count the largest n asked below this one needed (or 0), then bisect
      local lo = (fam.hint_n and fam.hint_n < n) and fam.hint_o or 0
      local step, hi = 1, lo
      while not fits(n, hi, 1) do
        lo, hi = hi + 1, math.min(maxlen, hi + step)
        step = step * 2
      end
      while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        if fits(n, mid, 1) then hi = mid else lo = mid + 1 end
      end
      local o = lo
      local t = cost.device(problem, i, space.part(problem, shape, i, L, X, n, x, o, 1))
      opt = { t.comp_ms, t.serial_ms, o, 1, lb = t.load_ms }
      fam[n] = opt
      if not fam.hint_n or n > fam.hint_n then fam.hint_n, fam.hint_o = n, o end
    end
    if with_ring and not opt.ringed then add_ring(n, opt) end
    return opt
  end
end

-- The largest n (0..R) for which device i can hold n blocks per stage, x extra, everything read
-- (its least memory, which grows with n).
-- n counts units of u blocks (the blocks of the shape: shape.R / u units per round).
local function largest(problem, shape, i, L, X, x, budget, u)
  local lo, hi = 0, shape.R / u
  while lo < hi do
    local n = math.floor((lo + hi + 1) / 2)
    -- (n + x < 1 is no part at all, not a part too large: it does not stop the search)
    if n * u + x < 1 or space.part_total(problem, shape, i, L, X, n * u, x, n * u + math.max(x, 0), 1) <= budget then lo = n
    else hi = n - 1 end
  end
  return lo
end

-- Everything the DP of one shape needs: its options, bounds, and whether it can fit at all
-- (nil when the most each device can take per stage, summed, is less than a round). The DP
-- counts in units of u blocks (u = 2: whole layers, for large models); ushape is the shape in
-- those units, c.shape in blocks.
local function prepare(problem, cost, ushape, u)
  local N, S = #problem.devices, ushape.S
  local R, E = ushape.R * u, ushape.E * u -- in blocks
  local shape = { S = S, R = R, E = E }
  local nb = problem.model.n_blocks
  local c = { problem = problem, shape = shape, N = N, R = ushape.R, E = ushape.E, S = S, u = u, comm = cost.comm(problem, S) }
  local mha_ms, mlp_ms, head = least_compute(problem)
  local cA, cB = S - 1, 0
  if R % 2 == 1 then cA, cB = math.ceil((S - 1) / 2), math.floor((S - 1) / 2) end
  -- the least compute of the blocks no device has yet, with the first L of every round's
  -- template and X extras placed, and the head's unless the last device is placed
  function c.rest(L, X, placed_all)
    L, X = L * u, X * u
    local len, zs = R - L, (S - 1) * R + L + X
    local mha = cA * mha_in(L, len) + cB * mha_in(L + 1, len) + mha_in(zs, nb - zs)
    local blocks = (cA + cB) * len + nb - zs
    return mha * mha_ms + (blocks - mha) * mlp_ms + (placed_all and 0 or head)
  end
  local sgn = ushape.E > 0 and 1 or (ushape.E < 0 and -1 or 0)
  c.xs = sgn == 0 and { 0 } or { 0, sgn }
  c.lowX, c.nX = math.min(ushape.E, 0), math.abs(ushape.E) + 1
  local memo = {}
  -- (in units) the family of device i after L, X with x extra: fam(n * u) gives its options
  function c.family(i, L, X, x)
    local Lb, Xb, xb = L * u, X * u, x * u
    -- one stage has no full stages: only the last one's start matters
    local key = ((i * 2 + (S > 1 and Lb % 2 or 0)) * 2 + (Lb + Xb) % 2) * 3 + (x + 1)
    local fam = memo[key]
    if not fam then
      local budget = space.budget(problem, i)
      fam = family(problem, cost, shape, i, Lb, Xb, xb, budget, u * largest(problem, shape, i, Lb, Xb, xb, budget, u))
      memo[key] = fam
    end
    return fam
  end
  function c.options(i, L, X, n, x) return c.family(i, L, X, x)(n * u) end
  -- the most units per stage each device can hold at all
  c.cap = {}
  local most = 0
  for i = 1, N do
    local top, budget = 0, space.budget(problem, i)
    for pL = 0, (S > 1 and u == 1) and 1 or 0 do
      for pX = 0, u == 1 and 1 or 0 do
        for _, x in ipairs(c.xs) do top = math.max(top, largest(problem, shape, i, pL, pX, x * u, budget, u)) end
      end
    end
    c.cap[i] = top
    most = most + top
  end
  if most < ushape.R then return nil end
  c.cap_after = { [N] = 0 }
  for i = N - 1, 1, -1 do c.cap_after[i] = c.cap_after[i + 1] + c.cap[i + 1] end
  return c
end

-- A quick plan of the shape to start from: templates in proportion to what each device can
-- hold, extras on the last devices that can take them, the least offloading. Returns the choice
-- and its T (max of compute + comm and serial), or nil when it does not fit.
local function greedy(c)
  local N, R, E = c.N, c.R, c.E
  local n, left, cap_left = {}, R, 0
  for i = 1, N do cap_left = cap_left + c.cap[i] end
  for i = 1, N do
    local want = i == N and left or math.floor(left * c.cap[i] / cap_left + 0.5)
    n[i] = math.max(1, math.min(want, c.cap[i], left - (N - i)))
    left, cap_left = left - n[i], cap_left - c.cap[i]
  end
  if left ~= 0 then return nil end
  local x, need = {}, E
  for i = N, 1, -1 do
    local s = need > 0 and 1 or (need < 0 and -1 or 0)
    x[i] = (s ~= 0 and n[i] + s >= 1) and s or 0
    need = need - x[i]
  end
  if need ~= 0 then return nil end
  local choice, L, X, A, B = { n = n, x = x, o = {}, k = {} }, 0, 0, 0, 0
  for i = 1, N do
    local op = c.options(i, L, X, n[i], x[i])
    if not op then return nil end
    choice.o[i], choice.k[i] = op[3], op[4]
    A, B = A + op[1], math.max(B, op[2])
    L, X = L + n[i], X + x[i]
  end
  return choice, math.max(A + c.comm, B)
end

-- The DP's pairs are nodes in flat arrays (S.NA: compute so far, NB: the largest serial time,
-- NV: the b a pair is compared by, and the move that made it: NP the node before, NN blocks per
-- stage, NXs extras, NO offloaded, NK slots; S.nodes of them). Node (a, b, v) made from node e by
-- the move (n, x, o, k) goes into front f (node ids sorted by v with a falling) unless a pair
-- there dominates it; the pairs it dominates leave.
local function add_node(S, f, a, b, v, e, n, x, o, k)
  local NA, NV = S.NA, S.NV
  local pos, m = nil, #f
  for z = 1, m do
    local w = f[z]
    if NV[w] <= v and NA[w] <= a then return end
    if NV[w] > v or (NV[w] == v and NA[w] > a) then pos = z break end
  end
  local id = S.nodes + 1
  S.nodes = id
  NA[id], S.NB[id], NV[id], S.NP[id] = a, b, v, e
  S.NN[id], S.NXs[id], S.NO[id], S.NK[id] = n, x, o, k
  pos = pos or m + 1
  table.insert(f, pos, id)
  -- drop what it dominates
  local z = pos + 1
  while z <= #f do
    local w = f[z]
    if NA[w] >= a and NV[w] >= v then table.remove(f, z) else z = z + 1 end
  end
end

-- The best pair of the last state's front (its T: the larger of compute and comm, and the
-- largest serial time) and the choice its moves make, device by device; or nil.
local function best_of(S, last, comm, N)
  if not last or #last == 0 then return nil end
  local best, best_t
  for _, e in ipairs(last) do
    local t = math.max(S.NA[e] + comm, S.NB[e])
    if not best_t or t < best_t then best, best_t = e, t end
  end
  local choice = { n = {}, x = {}, o = {}, k = {} }
  local e = best
  for i = N, 1, -1 do
    choice.n[i], choice.x[i], choice.o[i], choice.k[i] = S.NN[e], S.NXs[e], S.NO[e], S.NK[e]
    e = S.NP[e]
  end
  return choice, best_t
end

-- The DP of a prepared shape: the best choice whose T is below bound, and its T; or nil.
local function dp(c, bound)
  local N, R, E = c.N, c.R, c.E
  local lowX, nX, xs, comm = c.lowX, c.nX, c.xs, c.comm
  -- Pairs are nodes in flat arrays (a: compute so far, b: the largest serial time, v: the b a
  -- pair is compared by, and the move that made it); each state keeps the ids of its
  -- non-dominated nodes, sorted by v with a falling. Rows: F[i][L * nX + (X - lowX)].
  local S = { NA = { [0] = 0 }, NB = { [0] = 0 }, NV = { [0] = 0 }, NP = {}, NN = {}, NXs = {}, NO = {}, NK = {}, nodes = 0 }
  local NA, NB = S.NA, S.NB
  local F, keys = { [0] = { [0 - lowX] = { 0 } } }, { [0] = { 0 - lowX } }
  for i = 1, N do
    local row, row_keys, rests = {}, {}, {}
    F[i], keys[i] = row, row_keys
    local left = N - i -- devices after this one, each needing a block per stage
    local prev = F[i - 1]
    for _, key in ipairs(keys[i - 1]) do
      local front = prev[key]
      local L, X = math.floor(key / nX), key % nX + lowX
      for xj = 1, #xs do
        local x = xs[xj]
        local X2 = X + x
        -- the extras must still be placeable on the devices after this one
        if math.abs(X2) <= math.abs(E) and math.abs(E - X2) <= left then
          -- (the devices after this one take at most their cap each: this one takes the rest)
          local n_from, n_to = math.max(1, R - L - c.cap_after[i]), math.min(R - L - left, c.cap[i])
          if i == N then n_from = R - L if X2 ~= E then n_to = 0 end end
          local fam, u = c.family(i, L, X, x), c.u
          for n = n_from, n_to do
            if n + x >= 1 then
              local opts = fam(n * u)
              if not opts then break end -- more blocks per stage only need more memory
              local k2 = (L + n) * nX + (X2 - lowX)
              -- what every completion adds at least: a pair whose serial time is below its
              -- compute line (a + that + comm) is as good as that line, which is how pairs are
              -- compared (exactly: the step is the larger of the two)
              local line = rests[k2]
              if not line then line = c.rest(L + n, X2, i == N) + comm rests[k2] = line end
              -- the compute line and what this device reads (its least serial time) only grow
              -- with n: once no pair can get under the bound with them, no larger n can
              local oa, ob = opts[1], opts.lb
              local least_v = math.huge
              for j = 1, #front do
                local e = front[j]
                local v = NA[e] + oa + line
                if NB[e] > v then v = NB[e] end
                if ob > v then v = ob end
                if v < least_v then least_v = v end
              end
              if least_v >= bound then break end
              fam(n * u, true)
              local f = row[k2]
              for q = 1, #opts, 4 do
                local qa, qb = opts[q], opts[q + 1]
                for j = 1, #front do
                  local e = front[j]
                  local a, b = NA[e] + qa, NB[e] > qb and NB[e] or qb
                  local v = a + line > b and a + line or b
                  if v < bound then
                    if not f then f = {} row[k2] = f row_keys[#row_keys + 1] = k2 end
                    add_node(S, f, a, b, v, e, n, x, opts[q + 2], opts[q + 3])
                  end
                end
              end
            end
          end
        end
      end
    end
  end
  return best_of(S, F[N][R * nX + (E - lowX)], comm, N)
end

-- A choice in units as the plan space's (blocks).
local function in_blocks(c, choice)
  local out = { n = {}, x = {}, o = choice.o, k = choice.k }
  for i = 1, c.N do out.n[i], out.x[i] = choice.n[i] * c.u, choice.x[i] * c.u end
  return out
end

-- The DP's best plan of each stage count for problem, each device's reads priced as in `priced`
-- (a problem with the same devices, their disk rates as a pricing of M.pricings sets them; the
-- problem itself when its devices do not share a disk); only_S: that stage count alone. Returns
-- the plans ({ p, S }, built on problem) and whether any was found.
local function dp_plans(problem, priced, cost, u, least, only_S)
  local ushapes = {}
  local N, nb = #problem.devices, problem.model.n_blocks
  for S = only_S or problem.stages or 1, only_S or problem.stages or math.floor(nb / u / N) do
    for _, sh in ipairs(space.shapes_for(S, N, nb / u)) do ushapes[#ushapes + 1] = sh end
  end
  -- every shape that can fit, with a quick plan: the best quick plan bounds every DP, and a DP
  -- looks only for what beats the best plan so far (a stage count whose best cannot is not
  -- refined either)
  local todo, bound = {}, math.huge
  for _, shape in ipairs(ushapes) do
    local c = prepare(priced, cost, shape, u)
    if c then
      c.quick, c.quick_t = greedy(c)
      if c.quick_t then bound = math.min(bound, c.quick_t) end
      todo[#todo + 1] = c
    end
  end
  -- the most promising first: their DP results tighten the bound for the others
  table.sort(todo, function(a, b) return (a.quick_t or math.huge) < (b.quick_t or math.huge) end)
  local found = {}
  for _, c in ipairs(todo) do
    -- no plan of this S can beat the bound: its communication alone is too much
    if least + c.comm < bound then
      local choice, t = dp(c, bound)
      if choice then
        bound = t
        found[#found + 1] = { c = c, choice = choice, t = t }
      end
    end
  end
  -- the quick plan that set the bound, when no DP got below it
  for _, c in ipairs(todo) do
    if c.quick_t and c.quick_t <= bound then found[#found + 1] = { c = c, choice = c.quick, t = c.quick_t } end
  end
  -- the best unrefined plan of each stage count goes on
  local best_of = {}
  for _, f in ipairs(found) do
    if not best_of[f.c.S] or f.t < best_of[f.c.S].t then best_of[f.c.S] = f end
  end
  local plans = {}
  for _, c in ipairs(todo) do
    local f = best_of[c.S]
    if f and f.c == c then plans[#plans + 1] = { p = space.build(problem, c.shape, in_blocks(c, f.choice)), S = c.S } end
  end
  return plans, #found > 0
end

-- (a rate no plan reads at if it can help it: a device priced so reads nothing)
local NO_READS = 1 -- bytes/s

-- Local devices that share one disk (problem.devices[i].disk_shared_bps: each one's rate with k
-- of them reading, k = 1 .. n) read it at a rate that depends on how much the others read: the
-- estimate prices each read at the rate of itself and the others' share of the step they spend
-- reading (recipes/policies/cost/loip.lua). The DP prices reads device by device, so it runs
-- once per pricing: every set R of the sharing devices allowed to read, R's devices at the rate
-- of |R| reading at once (what a plan in which they all read all the time gets; less reading
-- gets more), the others at a rate that keeps them from reading. Each pricing's plans are then
-- judged by the estimate itself. Returns the list of pricings: { [i] = bytes/s } per device
-- priced apart from its disk_bps ({} first: the problem as it is, every device at the rate of
-- all reading), and the sharing devices (fewer than 2: the problem's own pricing only). With
-- more than 4 sharing devices only the problem's own pricing and the re-pricing at a plan's
-- rates (M.search) are tried: the sets would be too many.
function M.pricings(problem)
  local shared = {}
  for i, d in ipairs(problem.devices) do
    if type(d.disk_shared_bps) == "table" and #d.disk_shared_bps > 1 then shared[#shared + 1] = i end
  end
  local list = { {} }
  if #shared < 2 or #shared > 4 then return list, shared end
  for mask = 1, 2 ^ #shared - 2 do
    local m = 0
    for j = 1, #shared do if bit.band(mask, 2 ^ (j - 1)) ~= 0 then m = m + 1 end end
    local rates = {}
    for j, i in ipairs(shared) do
      local by = problem.devices[i].disk_shared_bps
      rates[i] = bit.band(mask, 2 ^ (j - 1)) ~= 0 and by[math.min(m, #by)] or NO_READS
    end
    list[#list + 1] = rates
  end
  return list, shared
end

-- problem with devices' disk rates as `rates` gives them ({ [i] = bytes/s }; a mixture of
-- experts' expert reads scaled alike); what the DP plans from (its plans are built on problem).
local function priced(problem, rates)
  if next(rates) == nil then return problem end
  local q = setmetatable({ devices = {} }, { __index = problem })
  for i, d in ipairs(problem.devices) do
    local r = rates[i]
    if r then
      q.devices[i] = setmetatable({ disk_bps = r, expert_bps = d.expert_bps and d.expert_bps * r / d.disk_bps or nil },
        { __index = d })
    else
      q.devices[i] = d
    end
  end
  return q
end

-- A key of a plan's placement (its stages, offloaded counts and slots): the same plan from two
-- pricings is refined once.
local function key_of(p)
  local t = {}
  for i, d in ipairs(p.devices) do
    t[#t + 1] = i .. ":" .. tostring(d.slot_bytes or 0)
    for _, st in ipairs(d.stages) do t[#t + 1] = st.blocks[1] .. "-" .. st.blocks[2] .. "/" .. (st.offloaded or 0) end
  end
  return table.concat(t, ",")
end

-- The search. Returns plan, estimate (with opts.refine = false: the DP's best, unrefined: what
-- the brute-force spec compares), or nil and why. opts: the settings (M.settings), any left out
-- at its default.
function M.search(problem, cost, opts)
  opts = opts or {}
  if type(cost.device) ~= "function" or type(cost.comm) ~= "function" then
    return nil, string.format("cost model %s has no device() and comm(): this DP needs a cost of the form "
      .. "max(sum of device compute + comm, max of device serial time) (see recipes/policies/cost/loip.lua); "
      .. "use --scheduler brute or even with it", tostring(cost.name))
  end
  local mha_ms, mlp_ms, head = least_compute(problem)
  local least = problem.model.n_layers * (mha_ms + mlp_ms) + head
  -- large models are placed whole layers at a time (the paper's DP), their blocks by the refinements
  local u = (opts.unit or 0) > 0 and opts.unit or (problem.model.n_blocks > 64 and 2 or 1)
  local pricings, shared = M.pricings(problem)
  local plans, any = {}, false
  for _, rates in ipairs(pricings) do
    local ps, found = dp_plans(problem, priced(problem, rates), cost, u, least)
    any = any or found
    for _, f in ipairs(ps) do plans[#plans + 1] = f end
  end
  if not any and opts.refine == false then return nil, M.why_none(problem) end
  -- The template space keeps each device's blocks per stage the same in every round (the extras
  -- in the last); an even split over the hops spreads them instead, which sometimes suits the
  -- mix of MHA and MLP blocks better. Those layouts, with the same least offloading and
  -- refinement, are candidates too: the result is never worse than the even split's.
  if opts.refine ~= false and u == 1 then
    local even = policy.load("scheduler", "even")
    for S = problem.stages or 1, problem.stages or math.floor(problem.model.n_blocks / #problem.devices) do
      local p = even.layout(problem, S)
      if p then plans[#plans + 1] = { p = p, S = S, even = true } end
    end
  end
  if #plans == 0 then return nil, M.why_none(problem) end
  local by_s = M.choose(problem, cost, opts, plans, u)
  -- Devices sharing a disk: a plan's reads run at the rates its estimate found. For each stage
  -- count the DP plans again at the rates of that count's best plan (a count the DP found no plan
  -- of that beat the others: at the best plan's rates), until that no longer finds a better
  -- plan (a few rounds: the rates a plan reads at depend on the plan).
  if opts.refine ~= false and #shared >= 2 then
    local first
    for S = 1, problem.model.n_blocks do
      if by_s[S] and (not first or by_s[S].est.ms_per_token < first.est.ms_per_token) then first = by_s[S] end
    end
    for S = problem.stages or 1, problem.stages or math.floor(problem.model.n_blocks / u / #problem.devices) do
      local f = by_s[S]
      for _ = 1, 3 do
        local rates = (f or first).est.read_bps
        if not rates then break end
        local again = dp_plans(problem, priced(problem, rates), cost, u, least, S)
        if #again == 0 then break end
        local g = M.choose(problem, cost, opts, again, u)[S]
        if not g or (f and g.est.ms_per_token >= f.est.ms_per_token * (1 - 1e-9)) then break end
        f = g
        by_s[S] = g
      end
    end
  end
  -- the least time wins (ties within 0.1% go to fewer stages)
  local best, best_est
  for S = 1, problem.model.n_blocks do
    local f = by_s[S]
    if f then
      local t = f.est.ms_per_token
      if not best or t < best_est.ms_per_token * 0.999 then best, best_est = f.p, f.est end
    end
  end
  return best, best_est
end

-- The best of candidate plans ({ p, S [, even] }, p built on problem) of each stage count by the
-- cost model's estimate: each refined, the best of each stage count relaid out. Returns
-- { [S] = { p, est, S } }.
function M.choose(problem, cost, opts, plans, u)
  -- each candidate refined (the same plan from two pricings once)
  local by_s, seen_plan = {}, {}
  for _, f in ipairs(plans) do
    local key = key_of(f.p)
    if not seen_plan[key] then
      seen_plan[key] = true
      local p, est = f.p, nil
      -- (the DP alone is judged by what it minimises)
      if opts.refine ~= false then
        -- (a ring takes memory that resident blocks would: both orders, the better kept)
        local q, qe = refine.rings(problem, cost, plan_of.bare(p))
        q, qe = refine.blocks(problem, cost, q)
        p, est = refine.blocks(problem, cost, p)
        p, est = refine.rings(problem, cost, p, est)
        if qe.ms_per_token < est.ms_per_token * (1 - 1e-9) then p, est = q, qe end
      else
        est = (cost.closed or cost.estimate)(p, problem)
      end
      est.layout = f.even and "even split" or "template (DP)"
      local cur = by_s[f.S]
      if not cur or est.ms_per_token < cur.est.ms_per_token then by_s[f.S] = { p = p, est = est, S = f.S } end
    end
  end
  local seen = {}
  for _, g in ipairs(plans) do
    local f, S = by_s[g.S], g.S
    if not seen[S] then
      seen[S] = true
      -- with a few blocks per hop the kinds a device gets follow the template's pattern round after
      -- round; with many, every device gets a mix anyway and moving single blocks gains little
      if opts.refine ~= false and opts.relayout ~= false and u == 1 and problem.model.n_blocks <= 3 * #problem.devices * S then
        local layout = f.est.layout
        f.p, f.est = refine.layout(problem, cost, f.p)
        f.est.layout = layout .. ", relaid out"
      end
    end
  end
  return by_s
end

function M.schedule(problem, cost, params)
  return M.search(problem, cost, params)
end

-- Why no plan fits (loip.plan.problem.why_none).
function M.why_none(problem)
  return problem_mod.why_none(problem)
end

return M
