-- Bursty requests (the paper's Sec. IV): K arrive at once; the next burst comes when the whole
-- burst is done (bursts rounds of it). The case the interleaved pipeline wins: one read of an
-- offloaded block serves the whole micro-batch.
--   o: burst (K, 4), bursts (1), input_tokens (8), output_tokens (16)
local M = {}

function M.requests(o)
  local out, K = {}, o.burst or 4
  for b = 1, o.bursts or 1 do
    for k = 1, K do
      out[#out + 1] = { after = (b > 1 and k == 1) and "all" or nil, prompt_tokens = o.input_tokens or 8,
        max_tokens = o.output_tokens or 16 }
    end
  end
  return out
end

return M
