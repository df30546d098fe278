-- Bursty requests (the paper's Sec. IV): K arrive at once; the next burst comes when the whole
-- burst is done (bursts rounds of it). The case the interleaved pipeline wins: one read of an
-- offloaded block serves the whole micro-batch.
--   loip simulate ... --pattern bursty:burst=8,bursts=2
local M = {}

local function at_least_1(v) return v >= 1, "must be >= 1" end
M.settings = {
  { "burst", "int", "requests that arrive at once (K)", default = 4, check = at_least_1 },
  { "bursts", "int", "bursts, each when the one before is done", default = 1, check = at_least_1 },
  { "input_tokens", "int", "prompt tokens of each request", default = 8, check = at_least_1 },
  { "output_tokens", "int", "tokens each request generates", default = 16, check = at_least_1 },
}

function M.requests(o)
  local out = {}
  for b = 1, o.bursts do
    for k = 1, o.burst do
      out[#out + 1] = { after = (b > 1 and k == 1) and "all" or nil, prompt_tokens = o.input_tokens,
        max_tokens = o.output_tokens }
    end
  end
  return out
end

return M
