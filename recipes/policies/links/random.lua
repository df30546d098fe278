-- Every `every` steps each link takes a rate drawn uniformly in [low, high] Mbit/s, the same
-- draws for the same seed (the paper's Fig. 8: bandwidth changing during generation). A link
-- schedule (loip.policy kind "links").
--   loip generate ... --link-schedule random:low=20,high=100,seed=3
local M = { name = "random" }

local function at_least(n) return function(v) return v >= n, "must be >= " .. n end end
M.settings = {
  { "every", "int", "steps between two draws", default = 32, check = at_least(1) },
  { "low", "number", "the lowest rate drawn, Mbit/s", default = 50, check = function(v) return v > 0, "must be > 0" end },
  { "high", "number", "the highest rate drawn, Mbit/s", default = 250, check = function(v) return v > 0, "must be > 0" end },
  { "seed", "int", "the draws' seed", default = 7 },
  { "links", "int", "links drawn for (one rate each; a ring uses as many as it has devices)", default = 8, check = at_least(1) },
}

local state
local function uniform()
  state = (state * 1103515245 + 12345) % 2147483648
  return state / 2147483648
end

function M.at(step, o)
  if step == 1 then state = o.seed end
  if (step - 1) % o.every ~= 0 then return nil end
  local rates = {}
  for i = 1, o.links do rates[i] = string.format("%dmbit", math.floor(o.low + (o.high - o.low) * uniform() + 0.5)) end
  return rates
end

return M
