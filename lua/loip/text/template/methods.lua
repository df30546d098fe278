-- Attribute and item access as Jinja's ImmutableSandboxedEnvironment does it, plus the
-- Python methods templates call on values ("x".strip(), d.items(), l.index(v) …).
--
-- `obj.name` tries the Python attribute first and then the key; `obj[key]` the other way
-- round. Methods that would mutate a list or dict resolve to an undefined value that raises
-- SecurityError when called, which is what the immutable sandbox does.
local V = require "loip.text.template.values"
local text = require "loip.text.template.text"
local seq = require "loip.text.template.seq"

local M = {}

local kind, raise, null, str, plain = V.kind, V.raise, V.null, V.str, V.plain
local floor = math.floor
local sub, find = string.sub, string.find

local S = require "loip.text.template.str" -- (str's methods, and binding arguments)
local bind, want_str, opt_int = S.bind, S.want_str, S.opt_int
M.bind = bind

-- Sequence semantics ---------------------------------------------------------------------

-- Python `item in container`.
function M.contains(container, item)
  container, item = plain(container), plain(item)
  local k = kind(container)
  if k == "str" then
    if type(item) ~= "string" then
      raise("TypeError", ("'in <string>' requires string as left operand, not %s"):format(V.typename(item)))
    end
    return find(container, item, 1, true) ~= nil
  end
  if k == "list" or k == "tuple" then
    for i = 1, #container do if V.eq(container[i], item) then return true end end
    return false
  end
  if k == "dict" then return container.vals[V.dkey(item)] ~= nil end
  if k == "undefined" then return false end
  raise("TypeError", ("argument of type '%s' is not iterable"):format(V.typename(container)))
end

M.iterate, M.slice = seq.iterate, seq.slice -- (loip.text.template.seq)

-- Methods --------------------------------------------------------------------------------

local STR, DICT, LIST, TUPLE = S.STR, {}, {}, {}
M.STR, M.DICT, M.LIST = STR, DICT, LIST

-- Jinja's sandbox (modifies_known_mutable): these resolve to an unsafe undefined.
local MUTATING = {
  list = { append = true, clear = true, extend = true, insert = true, pop = true,
    remove = true, reverse = true, sort = true },
  dict = { clear = true, pop = true, popitem = true, setdefault = true, update = true },
}

function DICT.items(d, args, kwargs)
  bind("items", {}, args, kwargs)
  local out = {}
  for i, k in ipairs(d.keys) do out[i] = V.tuple({ k, d.vals[V.dkey(k)] }) end
  return V.list(out)
end

function DICT.keys(d, args, kwargs)
  bind("keys", {}, args, kwargs)
  local out = {}
  for i, k in ipairs(d.keys) do out[i] = k end
  return V.list(out)
end

function DICT.values(d, args, kwargs)
  bind("values", {}, args, kwargs)
  local out = {}
  for i, k in ipairs(d.keys) do out[i] = d.vals[V.dkey(k)] end
  return V.list(out)
end

function DICT.get(d, args, kwargs)
  local key, default = bind("get", { "key", "default" }, args, kwargs)
  local v = d.vals[V.dkey(key)]
  if v == nil then return default == nil and null or default end
  return v
end

function DICT.copy(d, args, kwargs)
  bind("copy", {}, args, kwargs)
  local c = V.dict()
  for _, k in ipairs(d.keys) do V.dict_set(c, k, d.vals[V.dkey(k)]) end
  return c
end

local function seq_index(l, args, kwargs)
  local x = bind("index", { "value" }, args, kwargs)
  for i = 1, #l do if V.eq(l[i], x) then return i - 1 end end
  raise("ValueError", ("%s is not in %s"):format(V.repr(x), kind(l)))
end
local function seq_count(l, args, kwargs)
  local x = bind("count", { "value" }, args, kwargs)
  local n = 0
  for i = 1, #l do if V.eq(l[i], x) then n = n + 1 end end
  return n
end
LIST.index, LIST.count, TUPLE.index, TUPLE.count = seq_index, seq_count, seq_index, seq_count
function LIST.copy(l, args, kwargs)
  bind("copy", {}, args, kwargs)
  return V.list({ unpack(l) })
end

local METHODS = { str = STR, dict = DICT, list = LIST, tuple = TUPLE }

-- Markup's str methods return Markup (and lists of Markup for split and friends).
local function remark(v)
  if type(v) == "string" then return V.markup(v) end
  local k = kind(v)
  if k == "list" or k == "tuple" then
    local out = {}
    for i = 1, #v do out[i] = type(v[i]) == "string" and V.markup(v[i]) or v[i] end
    return setmetatable(out, getmetatable(v))
  end
  return v
end

-- Method `name` of obj as f(obj, args, kwargs), or nil. The call fast path uses it to
-- avoid allocating a bound method.
function M.method(obj, name)
  local k = kind(obj)
  if k == "markup" then
    local f = STR[name]
    return f and function(o, args, kwargs) return remark(f(o.s, args, kwargs)) end
  end
  local t = METHODS[k]
  return t and t[name]
end

local function bound(obj, name, f)
  return setmetatable({ name = name, fn = function(_, args, kwargs) return f(obj, args, kwargs) end }, V.Callable)
end

local function unsafe(obj, name)
  return V.undefined(name, obj, ("access to attribute %s of %s object is unsafe."):format(
    V.repr(name), V.repr(V.typename(obj))), "SecurityError")
end

-- The Python attribute `name` of obj, or nil when there is none.
local function py_attr(obj, k, name)
  if k == "tuple" and obj.attrs and obj.attrs[name] ~= nil then return obj.attrs[name] end -- groupby
  local t = METHODS[k]
  if t then
    local f = t[name]
    if f then return bound(obj, name, f) end
    local mut = MUTATING[k]
    if mut and mut[name] then return unsafe(obj, name) end
    return nil
  end
  if k == "namespace" then return obj.attrs.vals[name] end
  if k == "object" then return obj:attr(name) end
  if k == "callable" and name == "name" then return obj.name end
  if k == "int" or k == "float" or k == "bool" then
    if name == "real" then return k == "bool" and V.num(obj) or obj end
    if name == "imag" then return k == "float" and V.float(0) or 0 end
  end
  return nil
end

-- obj.name
function M.getattr(obj, name)
  local k = kind(obj)
  if k == "undefined" then V.fail_undefined(obj) end
  if k == "markup" then
    local f = M.method(obj, name)
    if f then return bound(obj, name, f) end
    obj, k = obj.s, "str"
  end
  local v = py_attr(obj, k, name)
  if v ~= nil then return v end
  if k == "dict" then
    v = obj.vals[name]
    if v ~= nil then return v end
  end
  return V.undefined(name, obj)
end

-- obj[key]
function M.getitem(obj, key)
  obj, key = plain(obj), plain(key)
  local k = kind(obj)
  if k == "undefined" then V.fail_undefined(obj) end
  if k == "dict" then
    local v = obj.vals[V.dkey(key)]
    if v ~= nil then return v end
  elseif k == "list" or k == "tuple" or k == "str" then
    local kk = kind(key)
    if kk == "int" or kk == "bool" then
      local i = V.num(key)
      local len = k == "str" and text.len(obj) or #obj
      if i < 0 then i = i + len end
      if i >= 0 and i < len then
        if k ~= "str" then return obj[i + 1] end
        if text.is_ascii(obj) then return sub(obj, i + 1, i + 1) end
        return text.chars(obj)[i + 1]
      end
    end
  elseif k == "namespace" then
    local v = obj.attrs.vals[key]
    if v ~= nil then return v end
  end
  if type(key) == "string" then
    local v = py_attr(obj, k, key)
    if v ~= nil then return v end
  end
  return V.undefined(key, obj)
end

return M
