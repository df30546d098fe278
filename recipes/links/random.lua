-- A link schedule (loip.policy kind "links"): every `every` steps each link takes a rate drawn
-- uniformly in [low, high] Mbit/s (the paper's Fig. 8: bandwidth changing during generation),
-- the same draws for the same seed.
local M = { name = "random", every = 32, low = 50, high = 250, seed = 7, links = 8 }

local state
local function uniform()
  state = (state * 1103515245 + 12345) % 2147483648
  return state / 2147483648
end

function M.at(step)
  if step == 1 then state = M.seed end
  if (step - 1) % M.every ~= 0 then return nil end
  local rates = {}
  for i = 1, M.links do rates[i] = string.format("%dmbit", math.floor(M.low + (M.high - M.low) * uniform() + 0.5)) end
  return rates
end

return M
