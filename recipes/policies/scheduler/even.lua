-- scheduler "even": the simple search loip started with (a baseline). For every stage count
-- S, the blocks are split evenly over the N*S hops, each device offloads the fewest blocks per
-- stage that fit its budget and keeps resident what else fits; the S with the least estimated
-- time wins. Nothing weighs a device's budget, disk or compute when splitting.
local space = require "loip.plan.space"
local problem_mod = require "loip.plan.problem"

local M = { name = "even" }

-- The even split over the N*S hops with the fewest reads each device needs (before filling):
-- a plan, or nil, why and the shortfall.
function M.layout(problem, S)
  local N, nb = #problem.devices, problem.model.n_blocks
  local shares = {}
  for h = 1, N * S do shares[h] = 1 end
  local p = space.ring_of(N, space.split(nb, shares))
  for i = 1, N do
    if not space.least_offload(problem, p, i) then
      local msg, short = space.oom(problem, p, i, string.format("with every block offloaded (%d stage%s)", S, S == 1 and "" or "s"))
      return nil, msg, short
    end
  end
  return p
end

function M.schedule(problem, cost)
  local N, nb = #problem.devices, problem.model.n_blocks
  local best, best_t, why, short
  for S = problem.stages or 1, problem.stages or math.floor(nb / N) do
    local p, err, by = M.layout(problem, S)
    -- the stage count that comes closest says why none fits
    if err and (not short or by < short) then why, short = err, by end
    if p then
      for i = 1, N do space.fill(problem, p, i) end
      local t = cost.estimate(p, problem).ms_per_token
      if not best_t or t < best_t * 0.999 then best, best_t = p, t end
    end
  end
  if not best then return nil, why or problem_mod.why_none(problem) end
  return best
end

return M
