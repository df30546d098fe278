-- A baseline, not a policy to run: offloading a mixture of experts without routing. Every
-- expert of an offloaded layer is read at each run of the layer (as if the layer's experts were
-- one dense block read into the slot), and none is kept for the next step; the router still
-- decides what is computed, so the tokens are the same. What `recipes/bench/moe.lua` measures
-- routed reads against. The cache needs a slot per expert of a layer (expert_slots >= experts).
-- An expert cache policy (loip.policy kind "experts"):
--   loip generate --model STORE --mem 1.5G --experts all
-- configure(ctx, params): see lru.lua.
local M = { name = "all" }

function M.configure(ctx, params)
  if ctx.slots < ctx.experts then
    error(string.format("the read-everything baseline needs a slot per expert of a layer (%d), the cache has %d: "
      .. "give the device expert_slots >= %d in the plan, or more memory", ctx.experts, ctx.slots, ctx.experts), 0)
  end
  return { replacement = "all", prefetch = 1, pins = {} }
end

return M
