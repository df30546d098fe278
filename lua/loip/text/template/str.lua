-- Python's str methods as templates call them ("x".strip(), s.split(",", 1), s.startswith(p) …),
-- and how a method binds its arguments (loip.text.template.args; loip.text.template.methods resolves
-- `obj.name` to them; builtins and filters bind their arguments with the same M.bind).
local V = require "loip.text.template.values"
local text = require "loip.text.template.text"
local args_ = require "loip.text.template.args"
local seq = require "loip.text.template.seq"

local M = {}

local kind, raise, null, str, plain = V.kind, V.raise, V.null, V.str, V.plain
local floor = math.floor
local sub, find = string.sub, string.find

local bind, want_str, opt_int = args_.bind, args_.want_str, args_.opt_int
M.bind, M.want_str, M.opt_int = bind, want_str, opt_int

local STR = {}
M.STR = STR

local function strip_method(left, right, fname)
  return function(s, args, kwargs)
    local chars = bind(fname, { "chars" }, args, kwargs)
    if chars == null then chars = nil end
    if chars ~= nil then want_str(fname, chars) end
    return text.strip(s, chars, left, right)
  end
end
STR.strip = strip_method(true, true, "strip")
STR.lstrip = strip_method(true, false, "lstrip")
STR.rstrip = strip_method(false, true, "rstrip")

local function split_method(fname, right)
  return function(s, args, kwargs)
    local sep, maxsplit = bind(fname, { "sep", "maxsplit" }, args, kwargs)
    maxsplit = opt_int(maxsplit, -1)
    local parts
    if sep == nil or sep == null then
      if right and maxsplit >= 0 then
        -- rsplit() on whitespace with a limit: split the reversed text from the left.
        local function reverse(x)
          local cs, r = text.chars(x), {}
          for i = #cs, 1, -1 do r[#r + 1] = cs[i] end
          return table.concat(r)
        end
        local rparts = text.split_ws(reverse(s), maxsplit)
        parts = {}
        for i = #rparts, 1, -1 do parts[#parts + 1] = reverse(rparts[i]) end
      else
        parts = text.split_ws(s, maxsplit)
      end
    else
      want_str(fname, sep)
      if sep == "" then raise("ValueError", "empty separator") end
      parts = right and text.rsplit(s, sep, maxsplit) or text.split(s, sep, maxsplit)
    end
    return V.list(parts)
  end
end
STR.split = split_method("split", false)
STR.rsplit = split_method("rsplit", true)

function STR.splitlines(s, args, kwargs)
  local keepends = bind("splitlines", { "keepends" }, args, kwargs)
  local out, cur = {}, {}
  local cs = text.chars(s)
  local i = 1
  while i <= #cs do
    local c = cs[i]
    local cp = text.cp(c)
    local brk = cp == 10 or cp == 13 or cp == 11 or cp == 12 or (cp >= 0x1C and cp <= 0x1E)
      or cp == 0x85 or cp == 0x2028 or cp == 0x2029
    if brk then
      local ending = c
      if cp == 13 and cs[i + 1] == "\n" then ending, i = "\r\n", i + 1 end
      out[#out + 1] = table.concat(cur) .. (V.truthy(keepends or false) and ending or "")
      cur = {}
    else
      cur[#cur + 1] = c
    end
    i = i + 1
  end
  if #cur > 0 then out[#out + 1] = table.concat(cur) end
  return V.list(out)
end

-- Substring of s by Python start/end (code points) for startswith/find and friends:
-- returns the substring and its code-point offset.
local function window(s, start, stop)
  if (start == nil or start == null) and (stop == nil or stop == null) then return s, 0 end
  local len = text.len(s)
  local a = opt_int(start, 0)
  local b = opt_int(stop, len)
  if a < 0 then a = math.max(0, a + len) end
  if b < 0 then b = math.max(0, b + len) end
  if a > len then return nil, a end
  local w = seq.slice(s, a, b, nil)
  return w, a
end

local function affix_method(fname, at_end)
  return function(s, args, kwargs)
    local what, start, stop = bind(fname, { "prefix", "start", "end" }, args, kwargs)
    local w = window(s, start, stop)
    if w == nil then return false end
    local cands = what
    if kind(what) ~= "tuple" then
      if type(what) ~= "string" then
        raise("TypeError", ("%s first arg must be str or a tuple of str, not %s"):format(fname, V.typename(what)))
      end
      cands = { what }
    end
    for _, c in ipairs(cands) do
      want_str(fname, c)
      if at_end then
        if c == "" or sub(w, -#c) == c then return true end
      elseif sub(w, 1, #c) == c then
        return true
      end
    end
    return false
  end
end
STR.startswith = affix_method("startswith", false)
STR.endswith = affix_method("endswith", true)

local function find_method(fname, from_right, must)
  return function(s, args, kwargs)
    local needle, start, stop = bind(fname, { "sub", "start", "end" }, args, kwargs)
    want_str(fname, needle)
    local w, off = window(s, start, stop)
    local pos
    if w then
      if from_right then
        local p = 1
        while true do
          local a = find(w, needle, p, true)
          if not a or a > #w then break end
          pos, p = a, a + 1
          if needle == "" then pos = #w + 1 break end
        end
      else
        pos = find(w, needle, 1, true)
      end
    end
    if not pos then
      if must then raise("ValueError", "substring not found") end
      return -1
    end
    return off + text.cp_index(w, pos)
  end
end
STR.find = find_method("find", false, false)
STR.rfind = find_method("rfind", true, false)
STR.index = find_method("index", false, true)
STR.rindex = find_method("rindex", true, true)

function STR.count(s, args, kwargs)
  local needle, start, stop = bind("count", { "sub", "start", "end" }, args, kwargs)
  want_str("count", needle)
  local w = window(s, start, stop)
  if not w then return 0 end
  return text.count(w, needle)
end

function STR.replace(s, args, kwargs)
  local old, new, count = bind("replace", { "old", "new", "count" }, args, kwargs)
  want_str("replace", old, "1")
  want_str("replace", new, "2")
  count = opt_int(count, -1)
  if old == "" then
    local cs, out, n = text.chars(s), {}, 0
    for i = 1, #cs + 1 do
      if count < 0 or n < count then out[#out + 1] = new n = n + 1 end
      out[#out + 1] = cs[i]
    end
    return table.concat(out)
  end
  local out, pos, n = {}, 1, 0
  while count < 0 or n < count do
    local a, b = find(s, old, pos, true)
    if not a then break end
    out[#out + 1] = sub(s, pos, a - 1)
    out[#out + 1] = new
    pos, n = b + 1, n + 1
  end
  out[#out + 1] = sub(s, pos)
  return table.concat(out)
end

local function no_args(fname, f)
  return function(s, args, kwargs)
    bind(fname, {}, args, kwargs)
    return f(s)
  end
end
STR.upper = no_args("upper", text.upper)
STR.lower = no_args("lower", text.lower)
STR.casefold = no_args("casefold", text.lower)
STR.title = no_args("title", text.title)
STR.capitalize = no_args("capitalize", text.capitalize)
STR.swapcase = no_args("swapcase", function(s)
  return (s:gsub("[^\128-\191][\128-\191]*", function(c)
    local up = text.upper_char(c)
    if up ~= c then return up end
    return text.lower_char(c)
  end))
end)

local function all_chars(fname, pred)
  return no_args(fname, function(s)
    if s == "" then return false end
    for _, c in ipairs(text.chars(s)) do if not pred(text.cp(c)) then return false end end
    return true
  end)
end
local function is_digit(cp) return cp >= 48 and cp <= 57 end
STR.isdigit = all_chars("isdigit", is_digit)
STR.isdecimal = all_chars("isdecimal", is_digit)
STR.isnumeric = all_chars("isnumeric", is_digit)
STR.isalpha = all_chars("isalpha", text.is_alpha_cp)
STR.isalnum = all_chars("isalnum", function(cp) return is_digit(cp) or text.is_alpha_cp(cp) end)
STR.isspace = all_chars("isspace", text.is_space)

local function case_test(fname, want_upper)
  return no_args(fname, function(s)
    local cased = false
    for _, c in ipairs(text.chars(s)) do
      local cp = text.cp(c)
      if text.is_upper_cp(cp) then
        if not want_upper then return false end
        cased = true
      elseif text.is_lower_cp(cp) then
        if want_upper then return false end
        cased = true
      end
    end
    return cased
  end)
end
STR.isupper = case_test("isupper", true)
STR.islower = case_test("islower", false)

function STR.join(s, args, kwargs)
  local iterable = bind("join", { "iterable" }, args, kwargs)
  local items = seq.iterate(iterable)
  for i, it in ipairs(items) do
    it = plain(it)
    items[i] = it
    if type(it) ~= "string" then
      raise("TypeError", ("sequence item %d: expected str instance, %s found"):format(i - 1, V.typename(it)))
    end
  end
  return table.concat(items, s)
end

local function pad_method(fname, where)
  return function(s, args, kwargs)
    local width, fill = bind(fname, { "width", "fillchar" }, args, kwargs)
    width = opt_int(width, 0)
    fill = fill or " "
    local len = text.len(s)
    if width <= len then return s end
    local total = width - len
    if where == "left" then return s .. fill:rep(total) end
    if where == "right" then return fill:rep(total) .. s end
    -- CPython: the odd character of padding goes left when the width is odd too.
    local left = floor(total / 2) + ((total % 2 == 1 and width % 2 == 1) and 1 or 0)
    return fill:rep(left) .. s .. fill:rep(total - left)
  end
end
STR.ljust = pad_method("ljust", "left")
STR.rjust = pad_method("rjust", "right")
STR.center = pad_method("center", "center")

function STR.zfill(s, args, kwargs)
  local width = opt_int(bind("zfill", { "width" }, args, kwargs), 0)
  local len = text.len(s)
  if width <= len then return s end
  local sign = ""
  if sub(s, 1, 1) == "-" or sub(s, 1, 1) == "+" then sign, s = sub(s, 1, 1), sub(s, 2) end
  return sign .. ("0"):rep(width - len) .. s
end

local function partition_method(fname, from_right)
  return function(s, args, kwargs)
    local sep = want_str(fname, bind(fname, { "sep" }, args, kwargs))
    if sep == "" then raise("ValueError", "empty separator") end
    local a, b
    if from_right then
      local p = 1
      while true do
        local x, y = find(s, sep, p, true)
        if not x then break end
        a, b, p = x, y, x + 1
      end
    else
      a, b = find(s, sep, 1, true)
    end
    if not a then
      if from_right then return V.tuple({ "", "", s }) end
      return V.tuple({ s, "", "" })
    end
    return V.tuple({ sub(s, 1, a - 1), sep, sub(s, b + 1) })
  end
end
STR.partition = partition_method("partition", false)
STR.rpartition = partition_method("rpartition", true)

function STR.removeprefix(s, args, kwargs)
  local p = want_str("removeprefix", bind("removeprefix", { "prefix" }, args, kwargs))
  if p ~= "" and sub(s, 1, #p) == p then return sub(s, #p + 1) end
  return s
end

function STR.removesuffix(s, args, kwargs)
  local p = want_str("removesuffix", bind("removesuffix", { "suffix" }, args, kwargs))
  if p ~= "" and sub(s, -#p) == p then return sub(s, 1, #s - #p) end
  return s
end

-- (STR.format: str.format, with the other Python formatting code in loip.text.template.format,
-- which sets it)

return M
