-- A pairwise (all-pairs) covering array: rows of one value per dimension such that every value of
-- every dimension meets every value of every other dimension in at least one row. Greedy, in the
-- manner of AETG (Cohen et al., 1997): each new row starts from the first pair still uncovered,
-- then fills the other dimensions one by one with the value that covers the most pairs still
-- uncovered; of several candidate rows (dimension orders drawn from a seeded generator) the one
-- covering most is kept. Deterministic for a given seed. Pairs the design cannot serve (refused:
-- a list of { {dim, value}, {dim, value} }) appear in no row; they are listed apart, and count as
-- covered by their refusal.
--
--   local pw = require "spec.support.pairwise"
--   local rows = pw.generate(dims, { seed = 36, refused = refused })   -- dims: { { name=, values={...} } }
--   local missing = pw.uncovered(dims, rows, refused)                  -- {} when every pair is covered
--   print(pw.describe(dims, rows, refused))                            -- which rows cover which pair
local M = {}

local function key(a, va, b, vb)
  if a > b then a, va, b, vb = b, vb, a, va end
  return a .. ":" .. va .. "|" .. b .. ":" .. vb
end
M.key = key

-- Dimension index by name, value index by value: refused pairs given by names as keys.
local function refused_set(dims, refused)
  local dim_of, val_of = {}, {}
  for d, dim in ipairs(dims) do
    dim_of[dim.name] = d
    val_of[d] = {}
    for v, x in ipairs(dim.values) do val_of[d][x] = v end
  end
  local set = {}
  for _, r in ipairs(refused or {}) do
    local a, b = dim_of[r[1][1]], dim_of[r[2][1]]
    assert(a and b and a ~= b, "a refused pair names two dimensions")
    local va, vb = val_of[a][r[1][2]], val_of[b][r[2][2]]
    assert(va and vb, "a refused pair names values of its dimensions")
    set[key(a, va, b, vb)] = true
  end
  return set
end

-- Every pair of values of two dimensions, in order, less the refused: a list of keys and a set.
local function all_pairs(dims, refused)
  local list, set = {}, {}
  for a = 1, #dims do
    for b = a + 1, #dims do
      for va = 1, #dims[a].values do
        for vb = 1, #dims[b].values do
          local k = key(a, va, b, vb)
          if not refused[k] then list[#list + 1] = { a, va, b, vb, k } set[k] = true end
        end
      end
    end
  end
  return list, set
end

-- A small seeded generator (Park-Miller): the same rows on every machine and LuaJIT.
local function rng(seed)
  local s = seed % 2147483647
  if s <= 0 then s = s + 2147483646 end
  return function(n)
    s = (s * 16807) % 2147483647
    return s % n + 1
  end
end

-- rows: a list of value indices per dimension ({ 2, 1, 4, ... }).
function M.generate(dims, opts)
  opts = opts or {}
  local refused = refused_set(dims, opts.refused)
  local list, uncovered = all_pairs(dims, refused)
  local rand, tries = rng(opts.seed or 1), opts.candidates or 30
  local left = #list
  local rows = {}
  -- the pairs a (partial) row newly covers if dimension d takes value v
  local function gain(row, d, v)
    local g = 0
    for e = 1, #dims do
      if e ~= d and row[e] then
        local k = key(d, v, e, row[e])
        if refused[k] then return -1 end
        if uncovered[k] then g = g + 1 end
      end
    end
    return g
  end
  while left > 0 do
    local first
    for _, p in ipairs(list) do if uncovered[p[5]] then first = p break end end
    local best, best_n
    for _ = 1, tries do
      local row = { [first[1]] = first[2], [first[3]] = first[4] }
      local order = {}
      for d = 1, #dims do if not row[d] then order[#order + 1] = d end end
      for i = #order, 2, -1 do local j = rand(i) order[i], order[j] = order[j], order[i] end
      local ok = true
      for _, d in ipairs(order) do
        local pick, pick_g, ties = nil, -1, 0
        for v = 1, #dims[d].values do
          local g = gain(row, d, v)
          if g > pick_g then pick, pick_g, ties = v, g, 1
          elseif g == pick_g and g >= 0 then
            ties = ties + 1
            if rand(ties) == 1 then pick = v end
          end
        end
        if pick_g < 0 then ok = false break end
        row[d] = pick
      end
      if ok then
        local n = 0
        for a = 1, #dims do for b = a + 1, #dims do if uncovered[key(a, row[a], b, row[b])] then n = n + 1 end end end
        if not best or n > best_n then best, best_n = row, n end
      end
    end
    assert(best, "no row holds the pair " .. first[5] .. " without a refused pair")
    for a = 1, #dims do
      for b = a + 1, #dims do
        local k = key(a, best[a], b, best[b])
        if uncovered[k] then uncovered[k] = nil left = left - 1 end
      end
    end
    rows[#rows + 1] = best
  end
  return rows
end

-- The pairs no row covers and no refusal accounts for (as "dim=value & dim=value" strings), and
-- the refused pairs some row holds anyway: both empty for a true covering array. Counted afresh
-- from the rows, independently of generate.
function M.uncovered(dims, rows, refused_list)
  local refused = refused_set(dims, refused_list)
  local seen = {}
  local held = {}
  for _, row in ipairs(rows) do
    for a = 1, #dims do
      for b = a + 1, #dims do
        local k = key(a, row[a], b, row[b])
        seen[k] = true
        if refused[k] then held[#held + 1] = k end
      end
    end
  end
  local missing = {}
  for a = 1, #dims do
    for b = a + 1, #dims do
      for va = 1, #dims[a].values do
        for vb = 1, #dims[b].values do
          local k = key(a, va, b, vb)
          if not seen[k] and not refused[k] then
            missing[#missing + 1] = string.format("%s=%s & %s=%s", dims[a].name, dims[a].values[va], dims[b].name, dims[b].values[vb])
          end
        end
      end
    end
  end
  return missing, held
end

-- The array as text: the rows, then per pair of dimensions each value pair with the rows that
-- cover it ("refused" for a refused pair).
function M.describe(dims, rows, refused_list)
  local refused = refused_set(dims, refused_list)
  local out = { string.format("pairwise covering array: %d rows over %d dimensions", #rows, #dims) }
  local w = {}
  for d, dim in ipairs(dims) do
    w[d] = #dim.name
    for _, v in ipairs(dim.values) do w[d] = math.max(w[d], #v) end
  end
  local head = { "row" }
  for d, dim in ipairs(dims) do head[#head + 1] = string.format("%-" .. w[d] .. "s", dim.name) end
  out[#out + 1] = table.concat(head, " ")
  for r, row in ipairs(rows) do
    local cells = { string.format("%3d", r) }
    for d, dim in ipairs(dims) do cells[#cells + 1] = string.format("%-" .. w[d] .. "s", dim.values[row[d]]) end
    out[#out + 1] = table.concat(cells, " ")
  end
  out[#out + 1] = "pairs covered (value/value: rows):"
  for a = 1, #dims do
    for b = a + 1, #dims do
      local cells = {}
      for va = 1, #dims[a].values do
        for vb = 1, #dims[b].values do
          local k, where = key(a, va, b, vb), {}
          for r, row in ipairs(rows) do if row[a] == va and row[b] == vb then where[#where + 1] = r end end
          cells[#cells + 1] = string.format("%s/%s:%s", dims[a].values[va], dims[b].values[vb],
            refused[k] and "refused" or (#where > 0 and table.concat(where, ",") or "NONE"))
        end
      end
      out[#out + 1] = string.format("  %s x %s: %s", dims[a].name, dims[b].name, table.concat(cells, " "))
    end
  end
  return table.concat(out, "\n")
end

return M
