-- What the expert cache policies (recipes/policies/experts/, loip.policy kind "experts") share:
-- the pre-gating settings and the table configure returns. Plain Lua, no FFI: a policy file
-- requires it.
--
--   local shared = require "loip.model.experts_policy"
--   M.settings = shared.settings()
--   function M.configure(ctx, params) return shared.config("lru", params) end
local M = {}

-- The settings of pre-gating, with `extra` declarations after them.
function M.settings(extra)
  local list = {
    { "prefetch", "int", "layers whose experts pre-gating predicts and reads ahead (0: off)", default = 1,
      check = function(v) return v >= 0 and v <= 8, "must be 0..8" end },
    { "min_accuracy", "number", "a layer whose predictions the router confirms less often than this (a running average) "
      .. "is predicted only now and then (0: always): a wrong guess costs a read", default = 0.9,
      check = function(v) return v >= 0 and v <= 1, "must be in [0, 1]" end },
    { "probe_every", "int", "with min_accuracy: predict such a layer at every this many runs of it, to see whether it "
      .. "pays again", default = 8, check = function(v) return v >= 1, "must be >= 1" end },
  }
  for _, s in ipairs(extra or {}) do list[#list + 1] = s end
  return list
end

-- configure's answer: the cache's replacement, pre-gating as params say, pins (default none).
function M.config(replacement, params, pins)
  return { replacement = replacement, prefetch = params.prefetch, min_accuracy = params.min_accuracy,
    probe_every = params.probe_every, pins = pins or {} }
end

return M
