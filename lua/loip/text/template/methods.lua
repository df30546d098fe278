-- Attribute and item access as Jinja's ImmutableSandboxedEnvironment does it, plus the
-- Python methods templates call on values ("x".strip(), d.items(), l.index(v) …).
--
-- `obj.name` tries the Python attribute first and then the key; `obj[key]` the other way
-- round. Methods that would mutate a list or dict resolve to an undefined value that raises
-- SecurityError when called, which is what the immutable sandbox does.
local V = require "loip.text.template.values"
local text = require "loip.text.template.text"

local M = {}

local kind, raise, null, str, plain = V.kind, V.raise, V.null, V.str, V.plain
local floor = math.floor
local sub, find = string.sub, string.find

-- Arguments bound the Python way: positional first, then keywords by name. Returns the
-- values in `names` order, nil where not given; Markup arguments arrive as plain strings.
local function bind(fname, names, args, kwargs)
  local out = {}
  local n = #names
  if #args > n then
    raise("TypeError", ("%s() takes at most %d argument%s (%d given)"):format(fname, n, n == 1 and "" or "s", #args))
  end
  for i = 1, #args do out[i] = plain(args[i]) end
  if kwargs then
    for _, k in ipairs(kwargs.keys) do
      local idx
      for i, nm in ipairs(names) do if nm == k then idx = i break end end
      if not idx then
        raise("TypeError", ("%s() got an unexpected keyword argument %s"):format(fname, V.repr(k)))
      end
      if out[idx] ~= nil then
        raise("TypeError", ("%s() got multiple values for argument %s"):format(fname, V.repr(k)))
      end
      out[idx] = plain(kwargs.vals[k])
    end
  end
  return unpack(out, 1, n)
end
M.bind = bind

local function want_str(fname, v, what)
  if type(v) ~= "string" then
    raise("TypeError", ("%s() argument %s must be str, not %s"):format(fname, what or "1", V.typename(v)))
  end
  return v
end

-- Optional integer argument (None counts as absent).
local function opt_int(v, default)
  if v == nil or v == null then return default end
  local i = V.to_int(v)
  if not i or kind(v) == "float" then
    raise("TypeError", ("'%s' object cannot be interpreted as an integer"):format(V.typename(v)))
  end
  return i
end

-- Sequence semantics ---------------------------------------------------------------------

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

-- Methods --------------------------------------------------------------------------------

local STR, DICT, LIST, TUPLE = {}, {}, {}, {}
M.STR, M.DICT, M.LIST = STR, DICT, LIST

-- Jinja's sandbox (modifies_known_mutable): these resolve to an unsafe undefined.
local MUTATING = {
  list = { append = true, clear = true, extend = true, insert = true, pop = true,
    remove = true, reverse = true, sort = true },
  dict = { clear = true, pop = true, popitem = true, setdefault = true, update = true },
}

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
  local w = M.slice(s, a, b, nil)
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
  local items = M.iterate(iterable)
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

-- str.format lives with the other Python formatting code.
function STR.format(s, args, kwargs) return require("loip.text.template.format").str_format(s, args, kwargs) end

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
