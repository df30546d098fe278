-- The expert cache's replacement, least frequently used: the expert the router has picked
-- fewest times so far (ties: used longest ago) gives up its slot. Routing that favours some
-- experts keeps them in memory even when a burst of others passes through. Pre-gating as lru.
-- An expert cache policy (loip.policy kind "experts"):
--   loip generate --model STORE --mem 1.5G --experts lfu
-- configure(ctx, params): see lru.lua.
local M = { name = "lfu" }

local shared = require "loip.model.experts_policy"
M.settings = shared.settings()

function M.configure(ctx, params)
  return shared.config("lfu", params)
end

return M
