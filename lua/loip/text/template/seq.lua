-- Python's sequence semantics as templates use them: what `for x in v` visits, and slices
-- (loip.text.template.methods re-exports both).
local V = require "loip.text.template.values"
local text = require "loip.text.template.text"
local opt_int = require("loip.text.template.args").opt_int

local M = {}

local kind, raise, plain = V.kind, V.raise, V.plain
local sub = string.sub

-- Lua array of the items `for x in v` visits; raises for values Python cannot iterate.
function M.iterate(v)
  v = plain(v)
  local k = kind(v)
  if k == "list" or k == "tuple" then
    local out = {}
    for i = 1, #v do out[i] = v[i] end
    return out
  end
  if k == "dict" then
    local out = {}
    for i, key in ipairs(v.keys) do out[i] = key end
    return out
  end
  if k == "str" then return text.chars(v) end
  if k == "undefined" then return {} end
  if k == "object" and v.iterate then return v:iterate() end
  raise("TypeError", ("'%s' object is not iterable"):format(V.typename(v)))
end

-- Python slice semantics (PySlice_AdjustIndices): 0-based start, stop and step.
local function slice_bounds(len, start, stop, step)
  step = opt_int(step, 1)
  if step == 0 then raise("ValueError", "slice step cannot be zero") end
  local lo, hi
  if step > 0 then lo, hi = 0, len else lo, hi = -1, len - 1 end
  local function adjust(x, default)
    x = opt_int(x, nil)
    if x == nil then return default end
    if x < 0 then x = x + len end
    if x < lo then return lo end
    if x > hi then return hi end
    return x
  end
  return adjust(start, step > 0 and 0 or len - 1), adjust(stop, step > 0 and len or -1), step
end

-- The items t[a], t[a + step] … before stop (0-based), as a new array.
local function pick(t, a, b, step)
  local out = {}
  for i = a, step > 0 and b - 1 or b + 1, step do out[#out + 1] = t[i + 1] end
  return out
end

function M.slice(obj, start, stop, step)
  obj = plain(obj)
  local k = kind(obj)
  if k == "undefined" then V.fail_undefined(obj) end
  if k == "str" then
    local ascii = text.is_ascii(obj)
    local cs = ascii and obj or text.chars(obj)
    local a, b, st = slice_bounds(#cs, start, stop, step)
    if st == 1 then
      if b <= a then return "" end
      if ascii then return sub(obj, a + 1, b) end
      return table.concat(cs, "", a + 1, b)
    end
    if ascii then cs = text.chars(obj) end
    return table.concat(pick(cs, a, b, st))
  end
  if k == "list" or k == "tuple" then
    return setmetatable(pick(obj, slice_bounds(#obj, start, stop, step)), getmetatable(obj))
  end
  return V.undefined(nil, obj, ("'%s' object is not subscriptable"):format(V.typename(obj)))
end

return M
