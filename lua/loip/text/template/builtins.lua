-- Jinja's tests (jinja2/tests.py) and global functions (range, dict, namespace, cycler,
-- joiner), plus the two globals transformers adds: raise_exception and strftime_now.
local V = require "loip.text.template.values"
local methods = require "loip.text.template.methods"

local M = {}

local kind, raise, null, str = V.kind, V.raise, V.null, V.str
local bind = methods.bind

-- Tests: t(rt, value, args, kwargs) -> boolean ---------------------------------------

local T = {}
M.tests = T

local function arg1(name, args, kwargs) return (bind(name, { "other" }, args, kwargs)) end

function T.defined(_, v) return not V.is_undefined(v) end
function T.undefined(_, v) return V.is_undefined(v) end
function T.none(_, v) return v == null end
function T.boolean(_, v) return type(v) == "boolean" end
T["false"] = function(_, v) return v == false end
T["true"] = function(_, v) return v == true end
function T.integer(_, v) return kind(v) == "int" end
function T.float(_, v) return kind(v) == "float" end
-- Python's bool is a Number, so `true is number` holds, as in Jinja.
function T.number(_, v) return V.NUMERIC[kind(v)] == true end
function T.string(_, v) return type(v) == "string" end
function T.mapping(_, v) return kind(v) == "dict" end
local ITERABLE = { str = true, list = true, tuple = true, dict = true, undefined = true }
function T.iterable(_, v) return ITERABLE[kind(v)] == true or (kind(v) == "object" and v.iterate ~= nil) end
-- len() and __getitem__: Undefined has both in Jinja, so it counts as a sequence.
function T.sequence(_, v) return ITERABLE[kind(v)] == true end
function T.callable(_, v)
  local k = kind(v)
  return k == "callable" or (k == "object" and v.call ~= nil)
end
function T.escaped(_, v) return kind(v) == "markup" end
function T.lower(_, v) return methods.STR.islower(str(v), {}) end
function T.upper(_, v) return methods.STR.isupper(str(v), {}) end

function T.odd(_, v) return V.eq(V.arith("mod", v, 2), 1) end
function T.even(_, v) return V.eq(V.arith("mod", v, 2), 0) end
function T.divisibleby(_, v, args, kwargs)
  local n = bind("divisibleby", { "num" }, args, kwargs)
  return V.eq(V.arith("mod", v, n), 0)
end

function T.sameas(_, v, args, kwargs)
  local other = arg1("sameas", args, kwargs)
  if type(v) == "table" then return rawequal(v, other) end
  return type(v) == type(other) and v == other
end

T["in"] = function(_, v, args, kwargs)
  return methods.contains(bind("in", { "seq" }, args, kwargs), v)
end

function T.filter(rt, v) return type(v) == "string" and rt.filters[v] ~= nil end
function T.test(rt, v) return type(v) == "string" and rt.tests[v] ~= nil end

local function comparison(op)
  return function(_, v, args, kwargs) return V.compare(op, v, arg1(op, args, kwargs)) end
end
T.eq, T.ne, T.lt, T.le, T.gt, T.ge = comparison("eq"), comparison("ne"), comparison("lt"),
  comparison("lteq"), comparison("gt"), comparison("gteq")
T["=="], T.equalto, T["!="] = T.eq, T.eq, T.ne
T["<"], T.lessthan, T["<="] = T.lt, T.lt, T.le
T[">"], T.greaterthan, T[">="] = T.gt, T.gt, T.ge

-- Globals --------------------------------------------------------------------------------

local function callable(name, fn) return setmetatable({ name = name, fn = fn }, V.Callable) end

-- The sandbox refuses ranges longer than this (jinja2.sandbox.MAX_RANGE).
local MAX_RANGE = 100000

local function int_arg(v)
  local k = kind(v)
  if k ~= "int" and k ~= "bool" then
    raise("TypeError", ("'%s' object cannot be interpreted as an integer"):format(V.typename(v)))
  end
  return V.num(v)
end

local function range(_, args, kwargs)
  bind("range", { "start", "stop", "step" }, args, kwargs)
  local start, stop, step = 0, nil, 1
  if #args == 0 then raise("TypeError", "range expected at least 1 argument, got 0") end
  if #args == 1 then stop = int_arg(args[1]) else start, stop = int_arg(args[1]), int_arg(args[2]) end
  if args[3] ~= nil then step = int_arg(args[3]) end
  if step == 0 then raise("ValueError", "range() arg 3 must not be zero") end
  local n = math.max(0, math.ceil((stop - start) / step))
  if n > MAX_RANGE then
    raise("OverflowError", ("Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d)."):format(MAX_RANGE))
  end
  local out = {}
  for i = 1, n do out[i] = start + (i - 1) * step end
  return V.list(out)
end

-- dict(mapping or pairs, **kwargs), the constructor namespace() shares.
local function make_dict(fname, args, kwargs)
  if #args > 1 then raise("TypeError", fname .. " expected at most 1 argument, got " .. #args) end
  local d = V.dict()
  if args[1] ~= nil then
    local src = args[1]
    if kind(src) == "dict" then
      for _, k in ipairs(src.keys) do V.dict_set(d, k, src.vals[V.dkey(k)]) end
    else
      for _, pair in ipairs(methods.iterate(src)) do
        local kv = methods.iterate(pair)
        if #kv ~= 2 then raise("ValueError", "dictionary update sequence element has length " .. #kv .. "; 2 is required") end
        V.dict_set(d, kv[1], kv[2])
      end
    end
  end
  if kwargs then for _, k in ipairs(kwargs.keys) do V.dict_set(d, k, kwargs.vals[k]) end end
  return d
end

local function namespace(_, args, kwargs)
  return setmetatable({ attrs = make_dict("namespace", args, kwargs) }, V.Namespace)
end

local function cycler(_, args)
  if #args == 0 then raise("RuntimeError", "at least one item has to be provided") end
  local items = {}
  for i = 1, #args do items[i] = args[i] end
  local c = setmetatable({ type_name = "Cycler", pos = 1 }, V.Object)
  local next_fn = callable("next", function()
    local v = items[c.pos]
    c.pos = c.pos % #items + 1
    return v
  end)
  local reset_fn = callable("reset", function() c.pos = 1 return null end)
  function c:attr(name)
    if name == "current" then return items[self.pos] end
    if name == "next" then return next_fn end
    if name == "reset" then return reset_fn end
    if name == "items" then return V.list({ unpack(items) }) end
  end
  return c
end

local function joiner(_, args, kwargs)
  local sep = bind("joiner", { "sep" }, args, kwargs)
  sep = sep == nil and ", " or str(sep)
  local used = false
  return callable("joiner", function()
    if not used then used = true return "" end
    return sep
  end)
end

-- strftime with the C locale's English names whatever the process locale; flags such as
-- %-d (a glibc extension Python passes through) go to os.date.
local DAYS = { "Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday" }
local MONTHS = { "January", "February", "March", "April", "May", "June", "July", "August",
  "September", "October", "November", "December" }

function M.strftime(fmt, t)
  local d = os.date("*t", t)
  local hour12 = (d.hour % 12 == 0) and 12 or d.hour % 12
  local conv = {
    a = DAYS[d.wday]:sub(1, 3), A = DAYS[d.wday], b = MONTHS[d.month]:sub(1, 3),
    h = MONTHS[d.month]:sub(1, 3), B = MONTHS[d.month], d = ("%02d"):format(d.day),
    e = ("%2d"):format(d.day), m = ("%02d"):format(d.month), Y = tostring(d.year),
    y = ("%02d"):format(d.year % 100), H = ("%02d"):format(d.hour), M = ("%02d"):format(d.min),
    S = ("%02d"):format(d.sec), I = ("%02d"):format(hour12), p = d.hour < 12 and "AM" or "PM",
    j = ("%03d"):format(d.yday), ["%"] = "%",
  }
  return (fmt:gsub("%%([-_0^#]?)(.)", function(flag, c)
    if flag == "" and conv[c] then return conv[c] end
    return os.date("%" .. flag .. c, t)
  end))
end

-- The global names every render sees; rt.now() gives the clock for strftime_now.
function M.globals(rt)
  return {
    range = callable("range", range),
    dict = callable("dict", function(_, args, kwargs) return make_dict("dict", args, kwargs) end),
    namespace = callable("namespace", namespace),
    cycler = callable("cycler", cycler),
    joiner = callable("joiner", joiner),
    raise_exception = callable("raise_exception", function(_, args, kwargs)
      local msg = bind("raise_exception", { "message" }, args, kwargs)
      raise("TemplateError", msg == nil and "" or str(msg))
    end),
    strftime_now = callable("strftime_now", function(_, args, kwargs)
      local fmt = bind("strftime_now", { "format" }, args, kwargs)
      if type(fmt) ~= "string" then raise("TypeError", "strftime() argument 1 must be str") end
      return M.strftime(fmt, rt.now())
    end),
  }
end

return M
