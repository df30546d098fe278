-- Every link switches between two rates every `every` steps (the paper's Fig. 8 setting, as a
-- square wave: 50 and 250 Mbit/s every 32 tokens). A link schedule (loip.policy kind "links"):
-- at(step, params) returns nil (no change), a rate for every link, or a list of rates
-- (one per link, link i: device i to the next).
--   loip generate ... --link-schedule switch      (or switch:every=16,rates=20mbit/1gbit, or a file)
local M = { name = "switch" }

M.settings = {
  { "every", "int", "steps between two switches", default = 32, check = function(v) return v >= 1, "must be >= 1" end },
  { "rates", "list", "the rates taken in turn (a/b/...)", default = { "50mbit", "250mbit" },
    check = function(v) return #v >= 1, "needs at least one rate" end },
}

function M.at(step, o)
  if (step - 1) % o.every ~= 0 then return nil end
  return o.rates[math.floor((step - 1) / o.every) % #o.rates + 1]
end

return M
