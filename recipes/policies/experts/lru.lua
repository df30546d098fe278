-- The expert cache's replacement, least recently used: when the router picks an expert that is
-- not in memory and no slot is free, the expert used longest ago gives up its slot (never one the
-- running layer uses). Pre-gating reads ahead the experts that `prefetch` layers' routers predict
-- from the hidden state before their attention runs, for the layers whose predictions the router
-- confirms at least `min_accuracy` of the time (a wrong guess costs a read; the others are
-- probed now and then). Under uniform routing it keeps a random share of the experts; where
-- routing repeats (a conversation, a language, a code base) it keeps the ones in use.
-- An expert cache policy (loip.policy kind "experts"):
--   loip generate --model STORE --mem 1.5G --experts lru:prefetch=2
-- configure(ctx, params) -> { replacement = "lru" | "lfu" | "static" | "all", prefetch = n, min_accuracy, probe_every,
--   pins = { { layer, expert } } }
-- ctx: { slots (the cache's experts), layers (the 0-based layers it serves, sorted), experts
-- (per layer), used (top-k), routing (a routing profile's frequencies[layer][expert], or nil) }.
local M = { name = "lru" }

local shared = require "loip.model.experts_policy"
M.settings = shared.settings()

function M.configure(ctx, params)
  return shared.config("lru", params)
end

return M
