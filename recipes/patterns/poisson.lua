-- Open-loop arrivals at rate requests per second (exponential gaps, seeded): requests come
-- whether or not earlier ones finished, so the batch grows and shrinks with the load.
--   o: rate (requests/s, 1), count (16), input_tokens (8), output_tokens (16), seed (1)
local M = {}

function M.requests(o)
  local rate, out, t = o.rate or 1, {}, 0
  local state = o.seed or 1
  local function uniform() -- a small LCG: the same arrivals for the same seed, on any Lua
    state = (state * 1103515245 + 12345) % 2147483648
    return (state + 0.5) / 2147483648
  end
  for i = 1, o.count or 16 do
    out[i] = { at_ms = t, prompt_tokens = o.input_tokens or 8, max_tokens = o.output_tokens or 16 }
    t = t - math.log(uniform()) / rate * 1000
  end
  return out
end

return M
