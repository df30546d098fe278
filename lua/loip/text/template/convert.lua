-- Values crossing between Lua and a template: what the caller hands in (import: plain arrays
-- become lists, other tables dicts, functions callables) and what a callback gets back (export).
local cjson = require "cjson"
local V = require "loip.text.template.values"

local M = {}

local floor = math.floor
local null = cjson.null
local List, Tuple, Dict, Callable, KIND = V.List, V.Tuple, V.Dict, V.Callable, V.KIND
local kind, dkey, num = V.kind, V.dkey, V.num

-- Values handed in by the caller become template values: plain arrays become lists, other
-- tables dicts (keys sorted, for a deterministic order), functions callables that receive
-- their positional arguments and, when there are keyword arguments, a trailing Lua table.
-- Ordered values from template.ordered_decode keep their order. nil entries are skipped.
local import

local function import_fn(fn, name)
  return setmetatable({ name = name, fn = function(_, args, kwargs)
    local a = {}
    for i = 1, #args do a[i] = M.export(args[i]) end
    local n = #args
    if kwargs and kwargs.keys[1] then
      n = n + 1
      a[n] = M.export(kwargs)
    end
    return import(fn(unpack(a, 1, n)))
  end }, Callable)
end

import = function(v, name)
  local t = type(v)
  if t == "nil" then return null end
  if t == "function" then return import_fn(v, name) end
  if t ~= "table" then return v end
  local mt = getmetatable(v)
  if mt == List or mt == Tuple then
    local out = {}
    for i = 1, #v do out[i] = import(v[i]) end
    return setmetatable(out, mt)
  end
  if mt == Dict then
    local d = V.dict()
    for _, k in ipairs(v.keys) do V.dict_set(d, k, import(v.vals[dkey(k)])) end
    return d
  end
  if mt and KIND[mt] then return v end
  local n = #v
  local is_list = n > 0 or (next(v) == nil and mt ~= nil and
    (mt == cjson.array_mt or mt == cjson.empty_array_mt))
  if is_list then
    for k in pairs(v) do
      if type(k) ~= "number" or k < 1 or k > n or k ~= floor(k) then is_list = false break end
    end
  end
  if is_list then
    local out = {}
    for i = 1, n do out[i] = import(v[i]) end
    return setmetatable(out, List)
  end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = k end
  table.sort(keys, function(x, y)
    local tx, ty = type(x), type(y)
    if tx == ty and (tx == "number" or tx == "string") then return x < y end
    if tx ~= ty then return tx < ty end -- numbers before strings
    return tostring(x) < tostring(y)
  end)
  local d = V.dict()
  for _, k in ipairs(keys) do V.dict_set(d, k, import(v[k], k)) end
  return d
end
M.import = import

-- Template values back to plain Lua (for callbacks): lists become arrays, dicts tables,
-- None stays `null`, floats numbers.
function M.export(v)
  local k = kind(v)
  if k == "list" or k == "tuple" then
    local out = {}
    for i = 1, #v do out[i] = M.export(v[i]) end
    return out
  end
  if k == "dict" then
    local out = {}
    for _, key in ipairs(v.keys) do out[M.export(key)] = M.export(v.vals[dkey(key)]) end
    return out
  end
  if k == "float" then return num(v) end
  if k == "markup" then return v.s end
  if k == "undefined" then return nil end
  return v
end

return M
