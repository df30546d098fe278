-- A baseline, not a policy to run: offloading a mixture of experts without routing. Every
-- expert of an offloaded layer is read at each run of the layer (as if the layer's experts were
-- one dense block read into the slot), and none is kept for the next step; the router still
-- decides what is computed, so the tokens are the same. What `recipes/bench/moe.lua` measures
-- routed reads against. With fewer slots than a layer has experts, those that do not fit are
-- read one after another once the layer has computed (read and dropped: the bytes of a dense
-- block, through the memory the plan gives the cache).
-- An expert cache policy (loip.policy kind "experts"):
--   loip generate --model STORE --mem 1.5G --experts all
-- configure(ctx, params): see lru.lua.
local M = { name = "all" }

function M.configure(ctx, params)
  return { replacement = "all", prefetch = 1, pins = {} }
end

return M
