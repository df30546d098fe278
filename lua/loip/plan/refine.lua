-- Refinements of a plan under a cost model, which the "loip" scheduler applies to the DP's best
-- plans (recipes/policies/scheduler/loip.lua, its settings refine and relayout; docs/planning.md,
-- "The plan space and the scheduler"): a scheduler of one's own may call them on its plans too.
--
--   local refine = require "loip.plan.refine"
--   p, est = refine.blocks(problem, cost, p)   -- resident what memory still holds, bottleneck first
--   p, est = refine.rings(problem, cost, p)    -- a ring of two stages' reads where memory holds it
--   p, est = refine.layout(problem, cost, p)   -- single blocks moved across hop boundaries
local space = require "loip.plan.space"
local plan = require "loip.plan"

local M = {}

-- Block-level refinement of p (in place): the device whose loading bounds the step keeps resident
-- the offloaded blocks its memory still holds, largest first (the paper's: one of its offloaded
-- layers after another becomes block-level offloading), then the next device, and so on. A change
-- is kept when the estimate does not grow. Returns p and its estimate.
function M.blocks(problem, cost, p)
  local est = cost.estimate(p, problem)
  -- a change is kept when the estimate does not get worse (a smaller slot, say, can hold fewer
  -- reads ahead)
  local function try(i)
    local keep = p.devices[i]
    local d = { slot_bytes = keep.slot_bytes, stages = {} }
    for s, st in ipairs(keep.stages) do d.stages[s] = { blocks = st.blocks, offloaded = st.offloaded } end
    p.devices[i] = d
    if space.fill(problem, p, i) == 0 then p.devices[i] = keep return false end
    local new = cost.estimate(p, problem)
    if new.ms_per_token > est.ms_per_token * (1 + 1e-9) then p.devices[i] = keep return false end
    est = new
    return true
  end
  -- the bottleneck first, then the others: each keeps what its memory holds (a device's memory
  -- is its own, so the order changes nothing but which change is judged first)
  local order = {}
  for i = 1, #p.devices do order[i] = i end
  table.sort(order, function(x, y) return (est.devices[x].uncover_ms or 0) > (est.devices[y].uncover_ms or 0) end)
  for _, i in ipairs(order) do try(i) end
  return p, est
end

-- Ring refinement of p (in place): a device that reads into a one-stage slot gets a ring of two
-- stages' reads (its next stage's reads run while it computes the blocks it has just read) where
-- its memory holds it and the estimate gets shorter. The DP's closed form prices the two alike
-- where the step is bound by compute on average; stage by stage, a stage whose reads overrun
-- its own window stalls with one slot and not with a ring. est: p's estimate (nil: made here).
-- Returns p and its estimate.
function M.rings(problem, cost, p, est)
  est = est or cost.estimate(p, problem)
  if p.per_block or (p.slots or 1) > 1 then return p, est end
  for i, d in ipairs(p.devices) do
    local part = plan.device_part(p, i, problem.model)
    if part.stage_off_max > 0 and not part.ring then
      local keep = d.slot_bytes
      d.slot_bytes = 2 * part.stage_off_max
      local new = space.total(problem, plan.device_part(p, i, problem.model)) <= space.budget(problem, i) and cost.estimate(p, problem)
      if new and new.ms_per_token < est.ms_per_token * (1 - 1e-9) then est = new else d.slot_bytes = keep end
    end
  end
  return p, est
end

-- Layout refinement of p (in place): the template space gives every round the same split, so
-- which blocks are MHA and which MLP falls the same way on a device round after round; moving
-- one block at a time across a hop boundary (then offloading the fewest blocks that fit on the
-- two devices it touches and keeping resident what else fits) reaches the mixes it cannot. The
-- move that shortens the step most is taken (on a tie, the one that evens out the devices'
-- serial times), until none does. Returns p and its estimate.
function M.layout(problem, cost, p)
  local N, S = #p.devices, #p.devices[1].stages
  local H = N * S
  local lens = {}
  for h = 1, H do
    local st = p.devices[(h - 1) % N + 1].stages[math.floor((h - 1) / N) + 1]
    lens[h] = st.blocks[2] - st.blocks[1] + 1
  end
  -- the step's time, then how evenly the devices wait for their reads
  local function score(q)
    local est = cost.estimate(q, problem)
    local sq = 0
    for _, d in ipairs(est.devices) do sq = sq + (d.uncover_ms or 0) ^ 2 end
    return est.ms_per_token, sq, est
  end
  -- device i's stages from the hop lengths, the fewest reads that fit, then resident what fits
  local function place(q, i)
    local at, d = 0, q.devices[i]
    d.slot_bytes = nil
    for h = 1, H do
      if (h - 1) % N + 1 == i then
        d.stages[math.floor((h - 1) / N) + 1] = { blocks = { at, at + lens[h] - 1 }, offloaded = 0 }
      end
      at = at + lens[h]
    end
    if not space.least_offload(problem, q, i) then return false end
    space.fill(problem, q, i)
    return true
  end
  local t, sq, est = score(p)
  while true do
    local best
    for h = 1, H - 1 do
      for _, dir in ipairs({ 1, -1 }) do
        -- dir 1: hop h's last block to hop h+1; -1: hop h+1's first block to hop h
        local from, to = dir == 1 and h or h + 1, dir == 1 and h + 1 or h
        if lens[from] > 1 then
          lens[from], lens[to] = lens[from] - 1, lens[to] + 1
          local i, j = (h - 1) % N + 1, h % N + 1
          local q = { slots = p.slots, devices = {} }
          for k = 1, N do q.devices[k] = p.devices[k] end
          q.devices[i] = { stages = {} }
          q.devices[j] = i == j and q.devices[i] or { stages = {} }
          if place(q, i) and (i == j or place(q, j)) then
            local nt, nsq, nest = score(q)
            local bt, bsq = best and best.t or t, best and best.sq or sq
            if nt < bt - 1e-9 or (nt <= bt + 1e-9 and nsq < bsq * (1 - 1e-9)) then
              best = { t = nt, sq = nsq, est = nest, h = h, dir = dir, q = q }
            end
          end
          lens[from], lens[to] = lens[from] + 1, lens[to] - 1
        end
      end
    end
    if not best then break end
    local from, to = best.dir == 1 and best.h or best.h + 1, best.dir == 1 and best.h + 1 or best.h
    lens[from], lens[to] = lens[from] - 1, lens[to] + 1
    p.devices, t, sq, est = best.q.devices, best.t, best.sq, best.est
  end
  return p, est
end

return M
