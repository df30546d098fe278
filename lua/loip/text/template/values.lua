-- Template values: the Lua representation of the Python objects a Jinja template sees, and
-- the Python semantics over them (truth, equality, ordering, arithmetic, str() and repr()).
-- The value model itself is described at the top of loip/template.lua.
local cjson = require "cjson"
local text = require "loip.text.template.text"

local V = {}

local floor, huge = math.floor, math.huge
local type, getmetatable, setmetatable, tostring = type, getmetatable, setmetatable, tostring
local format, concat = string.format, table.concat

local null = cjson.null
V.null = null

-- One metatable per Python type. Lists and tuples keep their items in the array part; there
-- are no holes because None is the `null` sentinel, never Lua nil.
local List, Tuple, Dict, Float = {}, {}, {}, {}
local Undefined, Callable, Namespace, Object, Err, Markup = {}, {}, {}, {}, {}, {}
V.List, V.Tuple, V.Dict, V.Float = List, Tuple, Dict, Float
V.Undefined, V.Callable, V.Namespace, V.Object, V.Err = Undefined, Callable, Namespace, Object, Err
V.Markup = Markup

local KIND = { [List] = "list", [Tuple] = "tuple", [Dict] = "dict", [Float] = "float",
  [Undefined] = "undefined", [Callable] = "callable", [Namespace] = "namespace",
  [Object] = "object", [Markup] = "markup" }
V.KIND = KIND

-- "none" "bool" "int" "float" "str" "markup" "list" "tuple" "dict" "undefined" "callable"
-- "namespace" "object"
local function kind(v)
  local t = type(v)
  if t == "string" then return "str" end
  if t == "number" then
    if v == floor(v) and v - v == 0 then return "int" end
    return "float"
  end
  if t == "table" then return KIND[getmetatable(v)] or "dict" end
  if t == "boolean" then return "bool" end
  if v == null then return "none" end
  return t
end
V.kind = kind

function V.list(t) return setmetatable(t or {}, List) end
function V.tuple(t) return setmetatable(t or {}, Tuple) end

-- Markup (markupsafe.Markup, a str subclass): what `|safe` and `|escape` return. Autoescape
-- is off, so it only matters where Jinja itself treats it specially: `Markup + str` and
-- `Markup % args` HTML-escape the plain operand. Elsewhere it behaves as its string `s`.
function V.markup(s) return setmetatable({ s = s }, Markup) end

-- The plain string of a Markup, any other value unchanged.
local function plain(v)
  if type(v) == "table" and getmetatable(v) == Markup then return v.s end
  return v
end
V.plain = plain

-- Ordered dict: `keys` in insertion order (original key values), `vals` indexed by the
-- normalised key, so that 1, 1.0 and True are one key as in Python.
function V.dict() return setmetatable({ keys = {}, vals = {} }, Dict) end

local function dkey(k)
  if k == true then return 1 elseif k == false then return 0 end
  if type(k) == "table" then
    local mt = getmetatable(k)
    if mt == Float then return k.v end
    if mt == Markup then return k.s end
  end
  return k
end
V.dkey = dkey

function V.dict_set(d, k, v)
  local nk = dkey(k)
  if d.vals[nk] == nil then d.keys[#d.keys + 1] = k end
  d.vals[nk] = v
end


-- Floats with an integral value are boxed, so that 2.0 prints as "2.0"; every other number
-- is a plain Lua number, an int when integral.
local function mkfloat(x)
  if x == floor(x) and x - x == 0 then return setmetatable({ v = x }, Float) end
  return x
end
V.float = mkfloat

-- The number a decimal numeral s stands for ([-+] digits [. digits] [e [-+] digits]), as
-- Python's float() reads it, or nil when s is not one. LuaJIT's tonumber gives nil when the
-- exponent has more than about seven digits ("9E99999999"), where Python saturates: inf, or
-- 0.0 when the mantissa is zero or the exponent negative (a mantissa of more digits than
-- such an exponent is beyond any template).
function V.decimal(s)
  local x = tonumber(s)
  if x then return x end
  local sign, mant, esign = s:match("^([-+]?)(%d*%.?%d*)[eE]([-+]?)%d+$")
  if not mant or not mant:find("%d") then return nil end
  x = (esign == "-" or tonumber(mant) == 0) and 0 or huge
  return sign == "-" and -x or x
end

-- Numeric value of int, float and bool (Python's bool is an int subclass).
local function num(v)
  local t = type(v)
  if t == "number" then return v end
  if t == "boolean" then return v and 1 or 0 end
  return v.v
end
V.num = num

local NUMERIC = { int = true, float = true, bool = true }
V.NUMERIC = NUMERIC

-- Errors are tables so that the renderer can tell a template's exception (with its exact
-- message) from a bug in the interpreter.
function V.raise(etype, msg, line, col)
  error(setmetatable({ type = etype, message = msg, line = line, column = col }, Err), 0)
end
local raise = V.raise

-- Undefined: `name` is the missing name or key, `obj` the object it was looked up on (nil for
-- a plain variable), `hint` a full message, `exc` the error type raised on misuse.
function V.undefined(name, obj, hint, exc)
  return setmetatable({ name = name, obj = obj, hint = hint, exc = exc }, Undefined)
end

function V.is_undefined(v) return type(v) == "table" and getmetatable(v) == Undefined end

-- Python type name, as used in error messages.
local TYPENAME = { none = "NoneType", bool = "bool", int = "int", float = "float", str = "str",
  markup = "Markup", list = "list", tuple = "tuple", dict = "dict", undefined = "Undefined",
  callable = "builtin_function_or_method", namespace = "Namespace" }
function V.typename(v)
  local k = kind(v)
  if k == "object" then return v.type_name end
  return TYPENAME[k] or k
end

local repr -- forward

-- Jinja's object_type_repr: "None" for None, "<type> object" otherwise.
local function object_type_repr(obj)
  if obj == null then return "None" end
  return V.typename(obj) .. " object"
end

local function undefined_message(u)
  if u.hint then return u.hint end
  if u.obj == nil then return repr(u.name) .. " is undefined" end
  if type(u.name) ~= "string" then
    return object_type_repr(u.obj) .. " has no element " .. repr(u.name)
  end
  return repr(object_type_repr(u.obj)) .. " has no attribute " .. repr(u.name)
end

-- Any use of an undefined value beyond printing, testing and iterating raises.
function V.fail_undefined(u)
  raise(u.exc or "UndefinedError", undefined_message(u))
end

-- Truth value, as Python's bool().
function V.truthy(v)
  local t = type(v)
  if t == "boolean" then return v end
  if t == "string" then return v ~= "" end
  if t == "number" then return v ~= 0 end
  if t == "table" then
    local mt = getmetatable(v)
    if mt == List or mt == Tuple then return v[1] ~= nil end
    if mt == Dict then return v.keys[1] ~= nil end
    if mt == Float then return v.v ~= 0 end
    if mt == Undefined then return false end
    if mt == Markup then return v.s ~= "" end
    return true
  end
  return v ~= null and v ~= nil
end
-- Python repr of floats, ints and strs (loip.text.template.pyrepr).
local R = require "loip.text.template.pyrepr"
local float_repr, int_str, str_repr = R.float_repr, R.int_str, R.str_repr
V.float_repr, V.int_str, V.str_repr = float_repr, int_str, str_repr

local tostr

local function seq_repr(v, open, close)
  local parts = {}
  for i = 1, #v do parts[i] = repr(v[i]) end
  if close == ")" and #v == 1 then return "(" .. parts[1] .. ",)" end
  return open .. concat(parts, ", ") .. close
end

repr = function(v)
  local k = kind(v)
  if k == "str" then return str_repr(v) end
  if k == "list" then return seq_repr(v, "[", "]") end
  if k == "tuple" then return seq_repr(v, "(", ")") end
  if k == "dict" then
    local parts = {}
    for i, key in ipairs(v.keys) do parts[i] = repr(key) .. ": " .. repr(v.vals[dkey(key)]) end
    return "{" .. concat(parts, ", ") .. "}"
  end
  if k == "undefined" then return "Undefined" end
  if k == "markup" then return "Markup(" .. str_repr(v.s) .. ")" end
  return tostr(v)
end
V.repr = repr

-- Python str(): what `{{ v }}` prints.
tostr = function(v)
  local t = type(v)
  if t == "string" then return v end
  local k = kind(v)
  if k == "int" then return int_str(v) end
  if k == "float" then return float_repr(num(v)) end
  if k == "bool" then return v and "True" or "False" end
  if k == "none" then return "None" end
  if k == "undefined" then return "" end
  if k == "markup" then return v.s end
  if k == "namespace" then
    local parts = {}
    for i, key in ipairs(v.attrs.keys) do parts[i] = repr(key) .. ": " .. repr(v.attrs.vals[key]) end
    return "<Namespace {" .. concat(parts, ", ") .. "}>"
  end
  if k == "callable" then return "<function " .. (v.name or "?") .. ">" end
  if k == "object" then return v.str and v:str() or ("<" .. v.type_name .. " object>") end
  if k == "list" or k == "tuple" or k == "dict" then return repr(v) end
  return tostring(v)
end
V.str = tostr

-- Python ==, deep for containers.
local function eq(a, b)
  a, b = plain(a), plain(b)
  if rawequal(a, b) then return a == a end -- NaN is the one value not equal to itself
  local ka, kb = kind(a), kind(b)
  if NUMERIC[ka] and NUMERIC[kb] then return num(a) == num(b) end
  if ka ~= kb then return false end
  if ka == "list" or ka == "tuple" then
    if #a ~= #b then return false end
    for i = 1, #a do if not eq(a[i], b[i]) then return false end end
    return true
  end
  if ka == "dict" then
    if #a.keys ~= #b.keys then return false end
    for nk, va in pairs(a.vals) do
      local vb = b.vals[nk]
      if vb == nil or not eq(va, vb) then return false end
    end
    return true
  end
  if ka == "undefined" then return true end
  if ka == "namespace" then return false end
  return a == b
end
V.eq = eq

local OPSYM = { lt = "<", lteq = "<=", gt = ">", gteq = ">=" }

-- Three-way comparison for ordering; raises TypeError as Python does for unordered types.
local function cmp(a, b, op)
  a, b = plain(a), plain(b)
  local ka, kb = kind(a), kind(b)
  if ka == "undefined" then V.fail_undefined(a) end
  if kb == "undefined" then V.fail_undefined(b) end
  if NUMERIC[ka] and NUMERIC[kb] then
    local x, y = num(a), num(b)
    return x < y and -1 or (x > y and 1 or 0)
  end
  if ka == "str" and kb == "str" then return a < b and -1 or (a > b and 1 or 0) end
  if ka == kb and (ka == "list" or ka == "tuple") then
    for i = 1, math.min(#a, #b) do
      if not eq(a[i], b[i]) then return cmp(a[i], b[i], op) end
    end
    return #a < #b and -1 or (#a > #b and 1 or 0)
  end
  raise("TypeError", format("'%s' not supported between instances of '%s' and '%s'",
    OPSYM[op] or "<", V.typename(a), V.typename(b)))
end
V.cmp = cmp

function V.compare(op, a, b)
  if op == "eq" then return eq(a, b) end
  if op == "ne" then return not eq(a, b) end
  local c = cmp(a, b, op)
  if op == "lt" then return c < 0 elseif op == "lteq" then return c <= 0
  elseif op == "gt" then return c > 0 else return c >= 0 end
end

-- Python arithmetic. ints stay ints (except true division), a float operand makes a float.
local ARSYM = { add = "+", sub = "-", mul = "*", div = "/", floordiv = "//", mod = "%", pow = "**" }

local function unsupported(op, a, b)
  raise("TypeError", format("unsupported operand type(s) for %s: '%s' and '%s'",
    ARSYM[op], V.typename(a), V.typename(b)))
end

local function repeat_seq(seq, n, mk)
  local out = {}
  for _ = 1, math.max(0, num(n)) do for i = 1, #seq do out[#out + 1] = seq[i] end end
  return mk(out)
end

local HTML_ESC = { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&#34;", ["'"] = "&#39;" }

-- markupsafe.escape: Markup stays as is, anything else is str()-ed and escaped.
function V.escape(v)
  if kind(v) == "markup" then return v end
  return V.markup((tostr(v):gsub("[&<>\"']", HTML_ESC)))
end

-- The escaped form of `%` arguments to a Markup format string.
local function escape_args(args)
  local k = kind(args)
  local function esc(x)
    local kx = kind(x)
    if kx == "str" or kx == "markup" then return V.escape(x) end
    return x
  end
  if k == "tuple" then
    local out = {}
    for i = 1, #args do out[i] = esc(args[i]) end
    return V.tuple(out)
  end
  if k == "dict" then
    local d = V.dict()
    for _, key in ipairs(args.keys) do V.dict_set(d, key, esc(args.vals[dkey(key)])) end
    return d
  end
  return esc(args)
end

local function markup_arith(op, a, b, ka, kb)
  if op == "add" then
    if (ka == "str" or ka == "markup") and (kb == "str" or kb == "markup") then
      return V.markup(V.escape(a).s .. V.escape(b).s)
    end
    unsupported(op, a, b)
  end
  if op == "mod" and ka == "markup" then return V.markup(V.percent(a.s, escape_args(b))) end
  local r = V.arith(op, plain(a), plain(b))
  if op == "mul" and type(r) == "string" then return V.markup(r) end
  return r
end

function V.arith(op, a, b)
  local ka, kb = kind(a), kind(b)
  if ka == "undefined" then V.fail_undefined(a) end
  if kb == "undefined" then V.fail_undefined(b) end
  if ka == "markup" or kb == "markup" then return markup_arith(op, a, b, ka, kb) end
  if NUMERIC[ka] and NUMERIC[kb] then
    local x, y = num(a), num(b)
    local is_float = ka == "float" or kb == "float"
    local r
    if op == "add" then r = x + y
    elseif op == "sub" then r = x - y
    elseif op == "mul" then r = x * y
    elseif op == "div" then
      if y == 0 then raise("ZeroDivisionError", "division by zero") end
      return mkfloat(x / y)
    elseif op == "floordiv" or op == "mod" then
      if y == 0 then
        raise("ZeroDivisionError", is_float and "float divmod()" or
          (op == "mod" and "integer modulo by zero" or "integer division or modulo by zero"))
      end
      if op == "floordiv" then
        r = floor(x / y)
      else
        -- CPython's float_rem: fmod, then moved to the sign of the divisor.
        r = math.fmod(x, y)
        if r ~= 0 and (r < 0) ~= (y < 0) then r = r + y end
      end
    elseif op == "pow" then
      if x == 0 and y < 0 then
        raise("ZeroDivisionError", "0.0 cannot be raised to a negative power")
      end
      if not is_float and y < 0 then return mkfloat(x ^ y) end
      r = x ^ y
    end
    if is_float then return mkfloat(r) end
    return r
  end
  if op == "add" then
    if ka == "str" then
      if kb ~= "str" then
        raise("TypeError", format('can only concatenate str (not "%s") to str', V.typename(b)))
      end
      return a .. b
    end
    if (ka == "list" or ka == "tuple") then
      if kb ~= ka then
        raise("TypeError", format('can only concatenate %s (not "%s") to %s', ka, V.typename(b), ka))
      end
      local out = {}
      for i = 1, #a do out[i] = a[i] end
      for i = 1, #b do out[#a + i] = b[i] end
      return setmetatable(out, getmetatable(a))
    end
  elseif op == "mul" then
    local s, n = a, b
    if ka == "int" or ka == "bool" then s, n = b, a end
    local ks, kn = kind(s), kind(n)
    if kn == "int" or kn == "bool" then
      if ks == "str" then return s:rep(math.max(0, num(n))) end
      if ks == "list" then return repeat_seq(s, n, V.list) end
      if ks == "tuple" then return repeat_seq(s, n, V.tuple) end
    end
  elseif op == "mod" and ka == "str" then
    -- Required here: format.lua builds on this module.
    return V.percent(a, b)
  end
  unsupported(op, a, b)
end

function V.neg(a)
  local k = kind(a)
  if k == "undefined" then V.fail_undefined(a) end
  if k == "int" or k == "bool" then return -num(a) end
  if k == "float" then return mkfloat(-num(a)) end
  raise("TypeError", "bad operand type for unary -: '" .. V.typename(a) .. "'")
end

-- Python round(x, ndigits) for a float: correctly rounded, ties to even. LuaJIT's own
-- "%.Nf" is exact but breaks ties away from zero, so exact ties are detected on the full
-- expansion ("%.99f" is exact for every double above 2^-47; smaller ones cannot tie).
-- The result is the double nearest to the rounded decimal, so "%.Nf" of it prints the
-- digits Python's "%.Nf" would.
function V.round(x, ndigits)
  if x ~= x or x == huge or x == -huge then return x end
  local scale = 1
  if ndigits < 0 then
    scale = 10 ^ -ndigits
    x, ndigits = x / scale, 0
  end
  local s = format("%." .. ndigits .. "f", x)
  if ndigits <= 90 then
    local full = format("%.99f", x)
    local dot = full:find(".", 1, true)
    local tail = full:sub(dot + ndigits + 1)
    if tail:match("^50*$") then
      local truncated = full:sub(1, ndigits == 0 and dot - 1 or dot + ndigits)
      if tonumber(truncated:sub(-1)) % 2 == 0 then s = truncated end
    end
  end
  return tonumber(s) * scale
end

-- Python int(): from numbers (truncating) and numeric strings.
function V.to_int(v)
  local k = kind(v)
  if k == "int" then return v end
  if k == "bool" or k == "float" then
    local x = num(v)
    return x >= 0 and floor(x) or -floor(-x)
  end
  return nil
end


-- Python's `str % args`, for `%` above: loip.text.template.format's percent, which sets it (that
-- module requires this one).
V.percent = nil

return V
