-- "Did you mean": the known name closest to a mistyped one (a plan's keys, a policy's fields, a
-- command's flags; anything a message refuses by name). Closeness is the edit distance with
-- transpositions (optimal string alignment: insertions, deletions, substitutions, and two
-- neighbours swapped, each one edit: `modle` is one from `model`), case-insensitive; a prefix
-- counts as close (`offload` for `offloaded`).
--
--   local suggest = require "loip.ui.suggest"
--   suggest.closest("offload", { "blocks", "offloaded" })   --> "offloaded"
--   suggest.hint("offload", { "blocks", "offloaded" })      --> " (did you mean 'offloaded'?)"
local M = {}

-- The edit distance between strings a and b (optimal string alignment: a swap of two neighbours
-- is one edit).
function M.distance(a, b)
  a, b = a:lower(), b:lower()
  local la, lb = #a, #b
  if la == 0 then return lb end
  if lb == 0 then return la end
  local d = {} -- d[i][j]: the distance between a's first i bytes and b's first j
  for i = 0, la do d[i] = { [0] = i } end
  for j = 1, lb do d[0][j] = j end
  for i = 1, la do
    local ca = a:byte(i)
    for j = 1, lb do
      local cb = b:byte(j)
      local v = math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (ca == cb and 0 or 1))
      if i > 1 and j > 1 and ca == b:byte(j - 1) and a:byte(i - 1) == cb then v = math.min(v, d[i - 2][j - 2] + 1) end
      d[i][j] = v
    end
  end
  return d[la][lb]
end

-- The candidate closest to word, if it is close: within a third of the longer name's length
-- (at least 1, at most 3 edits), or one name a prefix of the other (3 letters or more). nil when
-- none is close (or word is not a string).
function M.closest(word, candidates)
  if type(word) ~= "string" or word == "" then return nil end
  local best, best_d
  for _, c in ipairs(candidates) do
    local d = M.distance(word, c)
    local limit = math.max(1, math.min(3, math.floor(math.max(#word, #c) / 3)))
    local lw, lc = word:lower(), c:lower()
    local prefix = math.min(#lw, #lc) >= 3 and (lc:sub(1, #lw) == lw or lw:sub(1, #lc) == lc)
    if (d <= limit or prefix) and (not best_d or d < best_d) then best, best_d = c, d end
  end
  return best
end

-- " (did you mean 'x'?)" for the closest candidate, or "".
function M.hint(word, candidates)
  local c = M.closest(word, candidates)
  return c and string.format(" (did you mean '%s'?)", c) or ""
end

return M
