-- The baselines' KV handling (the paper's pipeline baselines; DESIGN §4): no block is offloaded
-- live; when the KV cache of the running requests would pass a device's budget, the oldest
-- positions of the longest request are evicted (a KV group, state.kv_block positions, at a
-- time, on every device alike) and recomputed in every later step: their rows ride in the micro-batch, their
-- K/V serve one layer at a time and are not kept. Tokens never change; each step costs a prefill
-- of the evicted positions, and the plan's batch must hold them (a clear error says when not).
local M = { name = "recompute" }

function M.on_step(state, control)
  local kb = state.kv_block
  -- groups to give up so that every device fits: the tightest device decides
  local over = 0
  for _, d in ipairs(state.devices) do
    if d.limit > 0 and d.group_bytes > 0 then
      local at_step = d.nonkv + d.kv_base + d.group_bytes * state.groups
      if at_step > d.limit then over = math.max(over, math.ceil((at_step - d.limit) / d.group_bytes)) end
    end
  end
  if over == 0 then return end
  -- from the longest requests first, never their newest group (the step writes it)
  local reqs = {}
  for _, r in ipairs(state.requests) do reqs[#reqs + 1] = r end
  table.sort(reqs, function(a, b) return a.positions - a.evicted > b.positions - b.evicted end)
  local evict = {}
  while over > 0 do
    local done = true
    for _, r in ipairs(reqs) do
      local e = evict[r] or r.evicted
      if over > 0 and e + kb <= math.floor((r.positions - 1) / kb) * kb then
        evict[r], over, done = e + kb, over - 1, false
      end
    end
    if done then
      error(string.format("recompute: the KV cache of %d positions cannot fit even with every older position evicted",
        state.context), 0)
    end
  end
  for r, e in pairs(evict) do control.evict(r.id, e) end
end

return M
