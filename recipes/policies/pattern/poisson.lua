-- Open-loop arrivals at rate requests per second (exponential gaps, seeded): requests come
-- whether or not earlier ones finished, so the batch grows and shrinks with the load.
--   loip simulate ... --pattern poisson:rate=4,count=32
local M = {}

local function at_least_1(v) return v >= 1, "must be >= 1" end
M.settings = {
  { "rate", "number", "arrivals per second", default = 1, check = function(v) return v > 0, "must be > 0" end },
  { "count", "int", "how many requests", default = 16, check = at_least_1 },
  { "input_tokens", "int", "prompt tokens of each request", default = 8, check = at_least_1 },
  { "output_tokens", "int", "tokens each request generates", default = 16, check = at_least_1 },
  { "seed", "int", "the arrivals' seed", default = 1 },
}

function M.requests(o)
  local rate, out, t = o.rate, {}, 0
  local state = o.seed
  local function uniform() -- a small LCG: the same arrivals for the same seed, on any Lua
    state = (state * 1103515245 + 12345) % 2147483648
    return (state + 0.5) / 2147483648
  end
  for i = 1, o.count do
    out[i] = { at_ms = t, prompt_tokens = o.input_tokens, max_tokens = o.output_tokens }
    t = t - math.log(uniform()) / rate * 1000
  end
  return out
end

return M
