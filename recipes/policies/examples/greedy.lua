-- scheduler "greedy" (to copy; its API: docs/planning.md, "The policy API"): blocks by each device's
-- speed and free memory, fewest reads that fit, then the S (problem.stages when fixed) estimated fastest.
local space = require "loip.plan.space"
local M = { name = "greedy" }

function M.schedule(problem, cost)
  local N, nb, best, best_ms = #problem.devices, problem.model.n_blocks, nil, nil
  for S = problem.stages or 1, problem.stages or math.floor(nb / N) do
    local shares = {}
    for h = 1, N * S do
      local i = (h - 1) % N + 1
      shares[h] = space.speed(problem, i) * math.min(space.budget(problem, i), 2 ^ 40)
    end
    local p, fits = space.ring_of(N, space.split(nb, shares)), true
    for i = 1, N do
      fits = fits and space.least_offload(problem, p, i)
      if fits then space.fill(problem, p, i) end
    end
    local ms = fits and cost.estimate(p, problem).ms_per_token
    if ms and (not best_ms or ms < best_ms) then best, best_ms = p, ms end
  end
  return best, "greedy: no stage count fits every budget"
end

return M
