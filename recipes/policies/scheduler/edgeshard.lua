-- scheduler "edgeshard": EdgeShard's partition (a baseline). One stage per device, nothing
-- offloaded; a DP over contiguous block ranges in ring order minimises the slowest device's
-- time (its compute and the hop it sends) within every budget. A model the budgets cannot hold
-- resident is refused (OOM, naming the device that falls shortest and by how much).
local space = require "loip.plan.space"
local plan = require "loip.plan"

local M = { name = "edgeshard" }

function M.schedule(problem, cost)
  if (problem.stages or 1) ~= 1 then
    return nil, string.format("one stage per device (the edgeshard baseline's), but %d were asked for (--stages %d)",
      problem.stages, problem.stages)
  end
  local N, nb = #problem.devices, problem.model.n_blocks
  local shape = { S = 1, R = nb, E = 0 }
  local _, hops = cost.comm(problem, 1)
  -- G[i][l]: the least slowest-device time with the first l blocks on devices 1..i
  local G, from = { [0] = { [0] = 0 } }, {}
  for i = 1, N do
    G[i], from[i] = {}, {}
    local budget = space.budget(problem, i)
    for l0, g in pairs(G[i - 1]) do
      local n_to = nb - l0 - (N - i)
      for n = (i == N and nb - l0 or 1), n_to do
        local part = space.part(problem, shape, i, l0, 0, n, 0, 0, 1)
        if space.total(problem, part) > budget then break end
        local t = math.max(g, cost.device(problem, i, part).comp_ms + (hops[i] or 0))
        local l = l0 + n
        if not G[i][l] or t < G[i][l] then G[i][l], from[i][l] = t, n end
      end
    end
  end
  if not G[N][nb] then
    -- the device that falls shortest of holding an even share resident
    local worst
    for i = 1, N do
      local n = math.max(1, math.floor(nb / N))
      local p = space.build(problem, shape, { n = (function() local t = {} for k = 1, N do t[k] = k == N and nb - n * (N - 1) or n end return t end)(),
        o = (function() local t = {} for k = 1, N do t[k] = 0 end return t end)() })
      local m = space.total(problem, plan.device_part(p, i, problem.model))
      local short = m - space.budget(problem, i)
      if short > 0 and (not worst or short > worst.short) then worst = { i = i, p = p, short = short } end
    end
    if worst then return nil, space.oom(problem, worst.p, worst.i, "to hold an even share resident") end
    return nil, "OOM: no partition keeps every block resident within the budgets"
  end
  local counts, l = {}, nb
  for i = N, 1, -1 do counts[i] = from[i][l] l = l - counts[i] end
  local o = {}
  for i = 1, N do o[i] = 0 end
  return space.build(problem, shape, { n = counts, o = o })
end

return M
