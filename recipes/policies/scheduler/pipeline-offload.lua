-- scheduler "pipeline-offload": the paper's "pipeline + offloading" baseline, the conventional
-- pipeline. One stage per device, blocks split in proportion to the devices' compute speed;
-- each device offloads the fewest blocks its memory needs, and reads each offloaded block into
-- a one-block slot just before it computes it (nothing read ahead, nothing overlapped).
local space = require "loip.plan.space"

local M = { name = "pipeline-offload" }

function M.schedule(problem, cost)
  if (problem.stages or 1) ~= 1 then
    return nil, string.format("one stage per device (the pipeline-offload baseline's), but %d were asked for (--stages %d)",
      problem.stages, problem.stages)
  end
  local N, nb = #problem.devices, problem.model.n_blocks
  local shares = {}
  for i = 1, N do shares[i] = space.speed(problem, i) end
  local p = space.ring_of(N, space.split(nb, shares))
  p.per_block, p.prefetch = true, false
  for i = 1, N do
    if not space.least_offload(problem, p, i) then
      return nil, space.oom(problem, p, i, "with every block offloaded")
    end
    space.fill(problem, p, i)
  end
  return p
end

return M
