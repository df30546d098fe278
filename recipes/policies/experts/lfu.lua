-- The expert cache's replacement, least frequently used: the expert the router has picked
-- fewest times so far (ties: used longest ago) gives up its slot. Routing that favours some
-- experts keeps them in memory even when a burst of others passes through. Pre-gating as lru.
-- An expert cache policy (loip.policy kind "experts"):
--   loip generate --model STORE --mem 1.5G --experts lfu
-- configure(ctx, params): see lru.lua.
local M = { name = "lfu" }

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
  return { replacement = "lfu", prefetch = params.prefetch, min_accuracy = params.min_accuracy,
    probe_every = params.probe_every, pins = {} }
end

return M
