-- Helpers the benchmark recipes share: robust statistics and progress lines on stderr (stdout
-- carries the recipe's one JSON object).
local M = {}

function M.median(xs)
  local s = {}
  for i, v in ipairs(xs) do s[i] = v end
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) / 2] or (s[n / 2] + s[n / 2 + 1]) / 2
end

function M.log(fmt, ...) io.stderr:write(string.format(fmt, ...), "\n") end

return M
