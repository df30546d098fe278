-- Sporadic requests (the paper's Sec. IV): one at a time, each sent when the one before has
-- finished, so every step carries a micro-batch of 1. Fixed input and output lengths, as in
-- EdgeShard's setup. A pattern (loip.policy kind "pattern") has requests(opts): the list of arrivals
-- loip.serve.load plays: { after = "previous" | "all" | nil, at_ms = offset when open-loop,
-- prompt_tokens, max_tokens }.
--   o: count (requests, 4), input_tokens (8), output_tokens (16)
local M = {}

function M.requests(o)
  local out = {}
  for i = 1, o.count or 4 do
    out[i] = { after = i > 1 and "previous" or nil, prompt_tokens = o.input_tokens or 8, max_tokens = o.output_tokens or 16 }
  end
  return out
end

return M
