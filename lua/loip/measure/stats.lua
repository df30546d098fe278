-- Robust statistics of lists of numbers (benchmarks, profiles, load runs): the median, a
-- quantile, the mean. Pure Lua: any layer may use it.
local M = {}

local function sorted(xs)
  local s = {}
  for i, v in ipairs(xs) do s[i] = v end
  table.sort(s)
  return s
end

-- The median of a list of numbers (nil when it is empty).
function M.median(xs)
  local s = sorted(xs)
  local n = #s
  if n == 0 then return nil end
  return n % 2 == 1 and s[(n + 1) / 2] or (s[n / 2] + s[n / 2 + 1]) / 2
end

-- The q-quantile (0..1) of a list of numbers, the nearest rank.
function M.quantile(xs, q)
  local s = sorted(xs)
  return s[math.max(1, math.min(#s, math.floor(q * #s + 0.5)))]
end

-- The mean of a list of numbers (nil when it is empty).
function M.mean(xs)
  if #xs == 0 then return nil end
  local s = 0
  for _, x in ipairs(xs) do s = s + x end
  return s / #xs
end

return M
