-- Python's string formatting: `str % args` (printf style), str.format() and its format
-- specs, with Python's rounding (ties to even) where LuaJIT's string.format differs.
local V = require "loip.text.template.values"
local text = require "loip.text.template.text"
local methods = require "loip.text.template.methods"
local S = require "loip.text.template.str"

local M = {}

local kind, raise, num, tostr, repr = V.kind, V.raise, V.num, V.str, V.repr
local str = V.str
local NUMERIC = V.NUMERIC
local floor = math.floor
local format, concat = string.format, table.concat

-- printf-style `str % args`: %s %r %a %d %i %u %f %F %e %E %g %G %x %X %o %c %%, with
-- flags, width (or *), precision, and %(key)s with a dict argument.
local CONV = "[sradiufFeEgGxXoc%%]"

function M.percent(fmt, args)
  local ka = kind(args)
  local list = ka == "tuple" and args or { args }
  local i = 0
  local function nextarg()
    i = i + 1
    if list[i] == nil then raise("TypeError", "not enough arguments for format string") end
    return list[i]
  end
  local out, pos, used_key = {}, 1, false
  while true do
    local p = fmt:find("%", pos, true)
    if not p then out[#out + 1] = fmt:sub(pos) break end
    out[#out + 1] = fmt:sub(pos, p - 1)
    local q = p + 1
    local key
    if fmt:sub(q, q) == "(" then
      local close = fmt:find(")", q, true)
      if not close then raise("ValueError", "incomplete format key") end
      key, q = fmt:sub(q + 1, close - 1), close + 1
    end
    local _, e, flags, width, prec, conv = fmt:find("^([-+ #0]*)(%*?%d*)%.?(%d*)(" .. CONV .. ")", q)
    if not e then raise("ValueError", ("unsupported format character at index %d"):format(p)) end
    q = e + 1
    if conv == "%" then
      out[#out + 1] = "%"
    else
      if width == "*" then width = tostring(num(nextarg())) end
      local v
      if key then
        if ka ~= "dict" then raise("TypeError", "format requires a mapping") end
        v = args.vals[key]
        if v == nil then raise("KeyError", repr(key)) end
        used_key = true
      else
        v = nextarg()
      end
      local spec = "%" .. flags .. width .. (prec ~= "" and ("." .. prec) or "")
      if conv == "s" then out[#out + 1] = format(spec .. "s", str(v))
      elseif conv == "r" or conv == "a" then out[#out + 1] = format(spec .. "s", repr(v))
      elseif conv == "c" then
        out[#out + 1] = format(spec .. "s", type(v) == "string" and v or text.from_cp(num(v)))
      else
        if not NUMERIC[kind(v)] then
          raise("TypeError", format("%%%s format: a real number is required, not %s", conv, V.typename(v)))
        end
        local x = num(v)
        if conv == "d" or conv == "i" or conv == "u" or conv == "x" or conv == "X" or conv == "o" then
          x = x >= 0 and floor(x) or -floor(-x)
          conv = (conv == "i" or conv == "u") and "d" or conv
        elseif conv == "f" or conv == "F" then
          x = V.round(x, tonumber(prec) or 6)
        end
        out[#out + 1] = format(spec .. conv, x)
      end
    end
    pos = q
  end
  if not used_key and ka == "tuple" and i < #list then
    raise("TypeError", "not all arguments converted during string formatting")
  end
  return concat(out)
end

-- str.format: "{}", "{0}", "{name}", "{0[key]}", "{0.attr}", "!r"/"!s", and a format spec
-- ([[fill]align][sign][0][width][,][.precision][type]).
local function format_spec(v, spec)
  if spec == "" then return str(v) end
  local fill, align, rest = spec:match("^(.)([<>=^])(.*)$")
  if not fill then
    align, rest = spec:match("^([<>=^]?)(.*)$")
    fill = " "
  end
  local sign, zero, width, comma, prec, ty = rest:match("^([-+ ]?)(0?)(%d*)(,?)%.?(%d*)([bcdeEfFgGnosxX%%]?)$")
  if not sign then raise("ValueError", "Invalid format specifier") end
  local out
  if ty == "" and type(v) == "string" then ty = "s" end
  if ty == "s" then
    out = str(v)
    if prec ~= "" then
      local cs = text.chars(out)
      out = concat(cs, "", 1, math.min(#cs, tonumber(prec)))
    end
  elseif ty == "" and not V.NUMERIC[kind(v)] then
    out = str(v)
  else
    if not V.NUMERIC[kind(v)] then
      raise("ValueError", ("Unknown format code '%s' for object of type '%s'"):format(ty, V.typename(v)))
    end
    local x = V.num(v)
    if ty == "" then
      out = prec ~= "" and ("%." .. prec .. "g"):format(x) or str(v)
    elseif ty == "d" or ty == "n" then out = ("%d"):format(x)
    elseif ty == "%" then out = ("%." .. (prec ~= "" and prec or "6") .. "f%%"):format(x * 100)
    elseif ty == "x" or ty == "X" or ty == "o" then out = ("%" .. ty):format(x)
    elseif ty == "b" then
      local n, bits = math.abs(floor(x)), {}
      repeat bits[#bits + 1] = n % 2 n = floor(n / 2) until n == 0
      out = (x < 0 and "-" or "") .. concat(bits):reverse()
    else
      local p = tonumber(prec) or 6
      if ty == "f" or ty == "F" then x = V.round(x, p) end
      out = ("%." .. p .. ty):format(x)
    end
    if comma == "," then
      local int, frac = out:match("^(-?%d+)(.*)$")
      if int then
        int = int:reverse():gsub("(%d%d%d)", "%1,"):reverse():gsub("^(-?),", "%1")
        out = int .. frac
      end
    end
    if sign == "+" and x >= 0 then out = "+" .. out
    elseif sign == " " and x >= 0 then out = " " .. out end
    if zero == "0" and align == "" then fill, align = "0", "=" end
  end
  width = tonumber(width) or 0
  local len = text.len(out)
  if len >= width then return out end
  local pad = width - len
  if align == "" then align = (type(v) == "string" or ty == "s") and "<" or ">" end
  if align == "<" then return out .. fill:rep(pad) end
  if align == ">" then return fill:rep(pad) .. out end
  if align == "^" then
    local l = floor(pad / 2)
    return fill:rep(l) .. out .. fill:rep(pad - l)
  end
  local sgn, body = out:match("^([-+ ]?)(.*)$")
  return sgn .. fill:rep(pad) .. body
end
M.spec = format_spec

function M.str_format(s, args, kwargs)
  local auto = 0
  local out = s:gsub("{{", "\1"):gsub("}}", "\2"):gsub("{([^{}]*)}", function(field)
    local name, conv, spec = field:match("^([^!:]*)!?([rsa]?):?(.*)$")
    local first, tail = name:match("^([^.%[]*)(.*)$")
    local v
    if first == "" then
      v = args[auto + 1]
      auto = auto + 1
    elseif first:match("^%d+$") then
      v = args[tonumber(first) + 1]
    else
      v = kwargs and kwargs.vals[first]
    end
    if v == nil then raise(first == "" and "IndexError" or "KeyError",
      first == "" and "Replacement index out of range" or V.repr(first)) end
    for dot, attr, key in tail:gmatch("(%.?)([%w_]*)%[?([^%]]*)%]?") do
      if dot == "." and attr ~= "" then
        if attr:sub(1, 1) == "_" then
          raise("SecurityError", ("access to attribute %s of %s object is unsafe."):format(V.repr(attr), V.repr(V.typename(v))))
        end
        v = methods.getattr(v, attr)
      elseif key ~= "" then
        v = methods.getitem(v, tonumber(key) or key)
      end
    end
    if conv == "r" or conv == "a" then v = V.repr(v) elseif conv == "s" then v = str(v) end
    return format_spec(v, spec)
  end)
  return (out:gsub("\1", "{"):gsub("\2", "}"))
end

-- Python's `str % args` for values' `%` operator, and str.format among str's methods: set here,
-- where they are written, for the modules below this one to call (they cannot require it).
V.percent = M.percent
S.STR.format = M.str_format

return M
