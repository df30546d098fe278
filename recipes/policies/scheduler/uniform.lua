-- scheduler "uniform": the paper's ablation without the allocation scheduler. Whole layers are
-- split evenly and in order over the N*S hops of the interleaved pipeline (equal consecutive
-- layers per device and stage), each device offloading the fewest blocks per stage its memory
-- needs; no block-level refinement. The S with the least estimated time wins.
local space = require "loip.plan.space"
local problem_mod = require "loip.plan.problem"

local M = { name = "uniform" }

function M.schedule(problem, cost)
  local N, L = #problem.devices, problem.model.n_layers
  if problem.stages and problem.stages * N > L then
    return nil, string.format("whole layers for every hop: %d stages on %d devices need %d layers, the model has %d",
      problem.stages, N, problem.stages * N, L)
  end
  local best, best_t, why, short
  for S = problem.stages or 1, problem.stages or math.floor(L / N) do
    local shares = {}
    for h = 1, N * S do shares[h] = 1 end
    local ranges = space.split(L, shares) -- layers; a hop's blocks are its layers' MHA and MLP
    for h, r in ipairs(ranges) do ranges[h] = { 2 * r[1], 2 * r[2] + 1 } end
    local p = space.ring_of(N, ranges)
    local fits = true
    for i = 1, N do
      if not space.least_offload(problem, p, i) then
        -- the stage count that comes closest says why none fits
        local msg, by = space.oom(problem, p, i, string.format("with every block offloaded (%d stage%s)", S, S == 1 and "" or "s"))
        if not short or by < short then why, short = msg, by end
        fits = false
        break
      end
    end
    if fits then
      local t = cost.estimate(p, problem).ms_per_token
      if not best_t or t < best_t * 0.999 then best, best_t = p, t end
    end
  end
  if not best then
    if N > L then return nil, string.format("%d devices but the model has %d layers: uniform gives each device whole layers", N, L) end
    return nil, why or problem_mod.why_none(problem)
  end
  return best
end

return M
