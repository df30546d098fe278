-- scheduler "pipeline": pipeline parallelism as the paper's baseline runs it. One stage per
-- device, blocks split in proportion to the devices' compute speed and moved off a device
-- whose memory cannot hold its share onto devices with room; nothing is offloaded, so a model
-- that the budgets cannot hold resident is refused (OOM, naming the device and the shortfall).
local plan = require "loip.plan"
local space = require "loip.plan.space"
local memory = require "loip.runtime.memory"

local M = { name = "pipeline" }

-- Contiguous block counts in proportion to shares, each device keeping at most what fits it
-- resident (cap(i, first, n) says whether n blocks from first fit device i): the counts, or nil
-- and the device that cannot take what is left.
function M.partition(problem, shares, fits)
  local N, nb = #problem.devices, problem.model.n_blocks
  local left_share = 0
  for i = 1, N do left_share = left_share + shares[i] end
  local counts, at = {}, 0
  for i = 1, N do
    local left = nb - at
    local want = i == N and left or math.max(1, math.floor(left * shares[i] / left_share + 0.5))
    want = math.min(want, left - (N - i))
    -- the most this device holds, from `at` on
    local n = want
    while n > 1 and not fits(i, at, n) do n = n - 1 end
    if not fits(i, at, n) or (i == N and n < left) then return nil, i, at, want end
    counts[i], at = n, at + n
    left_share = left_share - shares[i]
  end
  return counts
end

function M.schedule(problem, cost)
  if (problem.stages or 1) ~= 1 then
    return nil, string.format("one stage per device (the pipeline baseline's), but %d were asked for (--stages %d)",
      problem.stages, problem.stages)
  end
  local N = #problem.devices
  local shares = {}
  for i = 1, N do shares[i] = space.speed(problem, i) end
  local shape = { S = 1, R = problem.model.n_blocks, E = 0 }
  local function fits(i, first, n)
    return space.total(problem, space.part(problem, shape, i, first, 0, n, 0, 0, 1)) <= space.budget(problem, i)
  end
  local counts, i, at, want = M.partition(problem, shares, fits)
  if not counts then
    local part = space.part(problem, shape, i, at, 0, want, 0, 0, 1)
    local m = space.memory(problem, part)
    return nil, string.format("OOM: device %d cannot hold its share resident (%d blocks from %s): it needs %s but its budget is %s: short by %s",
      i, want, plan.block_name(at), memory.format_bytes(m.total),
      memory.format_bytes(problem.devices[i].budget),
      memory.format_bytes(m.total - problem.devices[i].budget))
  end
  return space.build(problem, shape, { n = counts, o = (function() local o = {} for k = 1, N do o[k] = 0 end return o end)() })
end

return M
