-- A link schedule (loip.policy kind "links"): every link switches between two rates every
-- `every` steps (the paper's Fig. 8 setting, as a square wave: 50 and 250 Mbit/s every 32
-- tokens). at(step) returns nil (no change), a rate for every link, or a list of rates (one
-- per link, link i: device i to the next).
--   loip generate ... --link-schedule switch      (or a file of one's own)
local M = { name = "switch", every = 32, rates = { "50mbit", "250mbit" } }

function M.at(step)
  if (step - 1) % M.every ~= 0 then return nil end
  return M.rates[math.floor((step - 1) / M.every) % #M.rates + 1]
end

return M
