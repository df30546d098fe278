-- The expert cache's replacement, least recently used: when the router picks an expert that is
-- not in memory and no slot is free, the expert used longest ago gives up its slot (never one the
-- running layer uses). Pre-gating reads ahead the experts that `prefetch` layers' routers predict
-- from the hidden state before their attention runs, for the layers whose predictions the router
-- confirms at least `min_accuracy` of the time (a wrong guess costs a read; the others are
-- probed now and then). Under uniform routing it keeps a random
-- share of the experts; where routing repeats (a conversation, a language, a code base) it keeps
-- the ones in use.
-- An expert cache policy (loip.policy kind "experts"):
--   loip generate --model STORE --mem 1.5G --experts lru:prefetch=2
-- configure(ctx, params) -> { replacement = "lru" | "lfu" | "static" | "all", prefetch = n, min_accuracy, probe_every,
--   pins = { { layer, expert } } }
-- ctx: { slots (the cache's experts), layers (the 0-based layers it serves, sorted), experts
-- (per layer), used (top-k), routing (a routing profile's frequencies[layer][expert], or nil) }.
local M = { name = "lru" }

M.settings = {
  { "prefetch", "int", "layers whose experts pre-gating predicts and reads ahead (0: off)", default = 1,
    check = function(v) return v >= 0 and v <= 8, "must be 0..8" end },
  { "min_accuracy", "number", "a layer whose predictions the router confirms less often than this (a running average) "
    .. "is predicted only now and then (0: always): a wrong guess costs a read", default = 0.9,
    check = function(v) return v >= 0 and v <= 1, "must be in [0, 1]" end },
  { "probe_every", "int", "with min_accuracy: predict such a layer at every this many runs of it, to see whether it "
    .. "pays again", default = 8, check = function(v) return v >= 1, "must be >= 1" end },
}

function M.configure(ctx, params)
  return { replacement = "lru", prefetch = params.prefetch, min_accuracy = params.min_accuracy,
    probe_every = params.probe_every, pins = {} }
end

return M
