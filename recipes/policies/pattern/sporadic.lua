-- Sporadic requests (the paper's Sec. IV): one at a time, each sent when the one before has
-- finished, so every step carries a micro-batch of 1. Fixed input and output lengths, as in
-- EdgeShard's setup. A pattern (loip.policy kind "pattern") has requests(opts): the list of arrivals
-- loip.serve.load plays: { after = "previous" | "all" | nil, at_ms = offset when open-loop,
-- prompt_tokens, max_tokens }; its settings arrive in opts.
--   loip simulate ... --pattern sporadic:count=8
local M = {}

local function at_least_1(v) return v >= 1, "must be >= 1" end
M.settings = {
  { "count", "int", "how many requests", default = 4, check = at_least_1 },
  { "input_tokens", "int", "prompt tokens of each request", default = 8, check = at_least_1 },
  { "output_tokens", "int", "tokens each request generates", default = 16, check = at_least_1 },
}

function M.requests(o)
  local out = {}
  for i = 1, o.count do
    out[i] = { after = i > 1 and "previous" or nil, prompt_tokens = o.input_tokens, max_tokens = o.output_tokens }
  end
  return out
end

return M
