-- Python's repr of the scalars a template prints: floats (the shortest digits that read back),
-- ints and strs (quoted and escaped as Python quotes them). loip.text.template.values builds
-- str() and repr() of every value on them.
local text = require "loip.text.template.text"

local M = {}

local huge = math.huge
local format, concat = string.format, table.concat

-- Python float repr: the shortest digit string that reads back to the same double, in fixed
-- notation when the decimal exponent is in [-4, 16), in scientific notation otherwise.
local function float_repr(x)
  if x ~= x then return "nan" end
  if x == huge then return "inf" end
  if x == -huge then return "-inf" end
  if x == 0 then return 1 / x < 0 and "-0.0" or "0.0" end
  local s
  for p = 1, 17 do
    s = format("%." .. (p - 1) .. "e", x)
    if tonumber(s) == x then break end
  end
  local sign, d1, rest, exp = s:match("^(-?)(%d)%.?(%d*)e([-+]%d+)$")
  local digits = (d1 .. rest):gsub("0+$", "")
  if digits == "" then digits = "0" end
  local e = tonumber(exp)
  if e >= -4 and e < 16 then
    if e < 0 then return sign .. "0." .. ("0"):rep(-e - 1) .. digits end
    if #digits <= e + 1 then return sign .. digits .. ("0"):rep(e + 1 - #digits) .. ".0" end
    return sign .. digits:sub(1, e + 1) .. "." .. digits:sub(e + 2)
  end
  local mant = digits:sub(1, 1)
  if #digits > 1 then mant = mant .. "." .. digits:sub(2) end
  return format("%s%se%s%02d", sign, mant, e < 0 and "-" or "+", math.abs(e))
end
M.float_repr = float_repr

local function int_str(x)
  if x == 0 then return "0" end
  return format("%.0f", x)
end
M.int_str = int_str

-- Python repr of a str: single quotes unless the text has a ' and no ".
local function str_repr(s)
  local q = "'"
  if s:find("'", 1, true) and not s:find('"', 1, true) then q = '"' end
  local ascii = text.is_ascii(s)
  local out = {}
  for _, c in ipairs(ascii and { s } or text.chars(s)) do
    if ascii or #c == 1 then
      out[#out + 1] = c:gsub("[%c\\'\"\127]", function(ch)
        if ch == q or ch == "\\" then return "\\" .. ch end
        if ch == "\n" then return "\\n" elseif ch == "\r" then return "\\r"
        elseif ch == "\t" then return "\\t" end
        if ch == "'" or ch == '"' then return ch end
        return format("\\x%02x", ch:byte())
      end)
    else
      local cp = text.cp(c)
      if text.is_printable(cp) then out[#out + 1] = c
      elseif cp <= 0xFF then out[#out + 1] = format("\\x%02x", cp)
      elseif cp <= 0xFFFF then out[#out + 1] = format("\\u%04x", cp)
      else out[#out + 1] = format("\\U%08x", cp) end
    end
  end
  return q .. concat(out) .. q
end
M.str_repr = str_repr

return M
