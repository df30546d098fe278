-- Jinja's built-in filters (jinja2/filters.py) with transformers' `tojson` override. Each
-- filter is f(rt, value, args, kwargs): args a Lua array, kwargs an ordered dict or nil;
-- rt is the running renderer (for filters that apply tests, other filters or attributes).
local V = require "loip.text.template.values"
local text = require "loip.text.template.text"
local methods = require "loip.text.template.methods"
local json = require "loip.text.template.json"
local fmt = require "loip.text.template.format"

local F = {}

local kind, raise, null, str, truthy = V.kind, V.raise, V.null, V.str, V.truthy
local bind, iterate = methods.bind, methods.iterate
local floor = math.floor

local function is_absent(v) return v == nil or v == null end

-- Jinja's make_attrgetter: "a.b.0" looks up items (digits as integer indices) in turn; a
-- default replaces an undefined result at any step.
local function attrgetter(attribute, default, lower)
  local parts = {}
  if type(attribute) == "string" then
    for p in attribute:gmatch("[^.]+") do parts[#parts + 1] = p:match("^%d+$") and tonumber(p) or p end
  else
    parts[1] = attribute
  end
  if is_absent(default) then default = nil end
  return function(item)
    for _, p in ipairs(parts) do
      item = methods.getitem(item, p)
      if default ~= nil and V.is_undefined(item) then item = default end
    end
    if lower and type(item) == "string" then item = text.lower(item) end
    return item
  end
end

local function identity(x) return x end
local function lowered(x) if type(x) == "string" then return text.lower(x) end return x end

-- Stable sort (Python's sort is stable; table.sort is not) with a key function.
local function stable_sort(items, key, reverse)
  local dec = {}
  for i, it in ipairs(items) do dec[i] = { key(it), i, it } end
  table.sort(dec, function(a, b)
    local c = V.cmp(a[1], b[1], "lt")
    if c ~= 0 then if reverse then return c > 0 end return c < 0 end
    return a[2] < b[2]
  end)
  local out = {}
  for i, d in ipairs(dec) do out[i] = d[3] end
  return out
end

local function str_arg(v) if V.is_undefined(v) then return "" end return str(v) end

-- int(), float() and `s + "\n"` (indent) fail on Undefined in Jinja, unlike str().
local function defined(v)
  if V.is_undefined(v) then V.fail_undefined(v) end
  return v
end

-- Strings --------------------------------------------------------------------------------

function F.trim(_, v, args, kwargs)
  local chars = bind("trim", { "chars" }, args, kwargs)
  if is_absent(chars) then chars = nil end
  return text.strip(str_arg(v), chars, true, true)
end

function F.upper(_, v) return text.upper(str_arg(v)) end
function F.lower(_, v) return text.lower(str_arg(v)) end
function F.capitalize(_, v) return text.capitalize(str_arg(v)) end

-- Jinja's title: a word starts after '-', whitespace or an opening bracket (not after any
-- non-letter, as str.title() would have it).
local TITLE_SEP = { [45] = true, [40] = true, [123] = true, [91] = true, [60] = true }
function F.title(_, v)
  local out, at_start = {}, true
  for i, c in ipairs(text.chars(str_arg(v))) do
    local cp = text.cp(c)
    if TITLE_SEP[cp] or text.is_space(cp) then
      out[i], at_start = c, true
    elseif at_start then
      out[i], at_start = text.upper_char(c), false
    else
      out[i] = text.lower_char(c)
    end
  end
  return table.concat(out)
end

function F.replace(_, v, args, kwargs)
  local old, new, count = bind("replace", { "old", "new", "count" }, args, kwargs)
  local cargs = { str(old), str(new) }
  if not is_absent(count) then cargs[3] = count end
  return methods.STR.replace(str_arg(v), cargs)
end

-- Markup in, Markup out for `string`; see runtime.lua for the other filters that keep it.
function F.string(_, v) if kind(v) == "markup" then return v end return str(v) end
function F.safe(_, v) if kind(v) == "markup" then return v end return V.markup(str(v)) end
F.pprint = function(_, v) return V.repr(v) end

function F.escape(_, v) return V.escape(v) end
F.e = F.escape
function F.forceescape(_, v) return V.escape(str(v)) end

function F.striptags(_, v)
  local s = str_arg(v):gsub("<!%-%-.-%-%->", ""):gsub("<[^>]*>", "")
  return table.concat(text.split_ws(s), " ")
end

function F.indent(_, v, args, kwargs)
  local width, first, blank = bind("indent", { "width", "first", "blank" }, args, kwargs)
  local pad = type(width) == "string" and width or (" "):rep(is_absent(width) and 4 or V.num(width))
  -- Jinja appends a newline before splitlines(), so a trailing newline yields an empty line.
  local lines = methods.STR.splitlines(str(defined(v)) .. "\n", {})
  local rv
  if truthy(blank or false) then
    rv = table.concat(lines, "\n" .. pad)
  else
    local rest = {}
    for i = 2, #lines do rest[#rest + 1] = lines[i] ~= "" and pad .. lines[i] or "" end
    rv = lines[1] or ""
    if #rest > 0 then rv = rv .. "\n" .. table.concat(rest, "\n") end
  end
  if truthy(first or false) then rv = pad .. rv end
  return rv
end

function F.center(_, v, args, kwargs)
  local width = bind("center", { "width" }, args, kwargs)
  return methods.STR.center(str_arg(v), { is_absent(width) and 80 or width })
end

function F.truncate(_, v, args, kwargs)
  local length, killwords, ending, leeway = bind("truncate", { "length", "killwords", "end", "leeway" }, args, kwargs)
  length = is_absent(length) and 255 or V.num(length)
  ending = is_absent(ending) and "..." or ending
  leeway = is_absent(leeway) and 5 or V.num(leeway)
  local s = str_arg(v)
  if text.len(s) <= length + leeway then return s end
  local cut = methods.slice(s, 0, length - text.len(ending), nil)
  if truthy(killwords or false) then return cut .. ending end
  return methods.STR.rsplit(cut, { " ", 1 })[1] .. ending
end

function F.wordcount(_, v)
  local n = 0
  for _ in str_arg(v):gmatch("[%w_\128-\255]+") do n = n + 1 end
  return n
end

function F.format(_, v, args, kwargs)
  if kwargs and kwargs.keys[1] then
    if #args > 0 then raise("FilterArgumentError", "can't handle positional and keyword arguments at the same time") end
    return fmt.percent(str(v), kwargs)
  end
  if #args == 1 then return fmt.percent(str(v), args[1]) end
  return fmt.percent(str(v), V.tuple(args))
end

-- tojson, as transformers overrides it: json.dumps(x, ensure_ascii=False, indent=None,
-- separators=None, sort_keys=False), no HTML escaping.
function F.tojson(_, v, args, kwargs)
  local ensure_ascii, indent, separators, sort_keys = bind("tojson",
    { "ensure_ascii", "indent", "separators", "sort_keys" }, args, kwargs)
  return json.dumps(v, { ensure_ascii = ensure_ascii ~= nil and truthy(ensure_ascii),
    indent = indent, separators = separators, sort_keys = sort_keys })
end

-- Numbers --------------------------------------------------------------------------------

function F.int(_, v, args, kwargs)
  defined(v)
  local default, base = bind("int", { "default", "base" }, args, kwargs)
  default = default == nil and 0 or default
  base = is_absent(base) and 10 or V.num(base)
  local k = kind(v)
  if k == "str" then
    local s = text.strip(v):gsub("_", "")
    local n
    if base == 10 then
      n = tonumber(s:match("^[-+]?%d+$") and s or "")
      if not n then
        -- Jinja falls back to int(float(value)).
        local f = s:match("^[-+]?%d*%.?%d+[eE]?[-+]?%d*$") and V.decimal(s)
        -- (int(float('1e400')) is an OverflowError in Python: the default)
        if f and f - f == 0 then n = f >= 0 and floor(f) or -floor(-f) end
      end
    else
      local sign = 1
      if s:sub(1, 1) == "-" then sign, s = -1, s:sub(2) end
      s = s:gsub("^0[xXoObB]", "")
      n = tonumber(s, base)
      if n then n = sign * n end
    end
    if n then return n end
    return default
  end
  return V.to_int(v) or default
end

function F.float(_, v, args, kwargs)
  defined(v)
  local default = bind("float", { "default" }, args, kwargs)
  default = default == nil and V.float(0) or default
  local k = kind(v)
  if V.NUMERIC[k] then return V.float(V.num(v)) end
  if k == "str" then
    local s = text.strip(v):lower()
    local n = s:match("^[-+]?%d*%.?%d*e?[-+]?%d*$") and s:find("%d") and V.decimal(s) or nil
    if s == "inf" or s == "infinity" or s == "+inf" then n = math.huge end
    if s == "-inf" or s == "-infinity" then n = -math.huge end
    if s == "nan" then n = 0 / 0 end
    if n then return V.float(n) end
  end
  return default
end

function F.abs(_, v)
  local k = kind(v)
  if k == "int" or k == "bool" then return math.abs(V.num(v)) end
  if k == "float" then return V.float(math.abs(V.num(v))) end
  raise("TypeError", ("bad operand type for abs(): '%s'"):format(V.typename(v)))
end

-- round(value, precision=0, method='common'): 'common' is Python's round(), ties to even
-- on the exact binary value (2.5 -> 2.0, 2.675 -> 2.67); it always returns a float.
function F.round(_, v, args, kwargs)
  local precision, method = bind("round", { "precision", "method" }, args, kwargs)
  precision = is_absent(precision) and 0 or V.num(precision)
  method = is_absent(method) and "common" or method
  if not V.NUMERIC[kind(v)] then raise("TypeError", "type " .. V.typename(v) .. " doesn't define __round__ method") end
  local x = V.num(v)
  local r
  if method == "common" then
    if kind(v) ~= "float" then return x end
    r = V.round(x, precision)
  elseif method == "ceil" or method == "floor" then
    local m = 10 ^ precision
    r = (method == "ceil" and math.ceil or floor)(x * m) / m
  else
    raise("FilterArgumentError", "method must be common, ceil or floor")
  end
  return V.float(r)
end

function F.sum(_, v, args, kwargs)
  local attribute, start = bind("sum", { "attribute", "start" }, args, kwargs)
  local total = start == nil and 0 or start
  local get = is_absent(attribute) and identity or attrgetter(attribute)
  for _, it in ipairs(iterate(v)) do total = V.arith("add", total, get(it)) end
  return total
end

-- Sequences ------------------------------------------------------------------------------

function F.length(_, v)
  local k = kind(v)
  if k == "str" then return text.len(v) end
  if k == "list" or k == "tuple" then return #v end
  if k == "dict" then return #v.keys end
  if k == "undefined" then return 0 end
  if k == "namespace" then return #v.attrs.keys end
  raise("TypeError", ("object of type '%s' has no len()"):format(V.typename(v)))
end
F.count = F.length

function F.list(_, v) return V.list(iterate(v)) end

function F.first(_, v)
  local items = iterate(v)
  if #items == 0 then return V.undefined(nil, nil, "No first item, sequence was empty.") end
  return items[1]
end

function F.last(_, v)
  local items = iterate(v)
  if #items == 0 then return V.undefined(nil, nil, "No last item, sequence was empty.") end
  return items[#items]
end

function F.reverse(_, v)
  if type(v) == "string" then
    local cs, out = text.chars(v), {}
    for i = #cs, 1, -1 do out[#out + 1] = cs[i] end
    return table.concat(out)
  end
  local items, out = iterate(v), {}
  for i = #items, 1, -1 do out[#out + 1] = items[i] end
  return V.list(out)
end

function F.join(_, v, args, kwargs)
  local sep, attribute = bind("join", { "d", "attribute" }, args, kwargs)
  sep = sep == nil and "" or str(sep)
  local get = is_absent(attribute) and identity or attrgetter(attribute)
  local parts = {}
  for i, it in ipairs(iterate(v)) do parts[i] = str(get(it)) end
  return table.concat(parts, sep)
end

function F.sort(_, v, args, kwargs)
  local reverse, case_sensitive, attribute = bind("sort", { "reverse", "case_sensitive", "attribute" }, args, kwargs)
  local lower = not truthy(case_sensitive or false)
  local key = is_absent(attribute) and (lower and lowered or identity) or attrgetter(attribute, nil, lower)
  return V.list(stable_sort(iterate(v), key, truthy(reverse or false)))
end

function F.dictsort(_, v, args, kwargs)
  local case_sensitive, by, reverse = bind("dictsort", { "case_sensitive", "by", "reverse" }, args, kwargs)
  if kind(defined(v)) ~= "dict" then raise("TypeError", "dictsort expects a mapping") end
  local pos = 1
  if by == "value" then pos = 2 elseif by ~= nil and by ~= "key" then
    raise("FilterArgumentError", "You can only sort by either \"key\" or \"value\"")
  end
  local lower = not truthy(case_sensitive or false)
  local items = methods.DICT.items(v, {})
  return V.list(stable_sort(items, function(it)
    local x = it[pos]
    return lower and lowered(x) or x
  end, truthy(reverse or false)))
end

function F.unique(_, v, args, kwargs)
  local case_sensitive, attribute = bind("unique", { "case_sensitive", "attribute" }, args, kwargs)
  local lower = not truthy(case_sensitive or false)
  local key = is_absent(attribute) and (lower and lowered or identity) or attrgetter(attribute, nil, lower)
  local seen, out = {}, {}
  for _, it in ipairs(iterate(v)) do
    local kv = key(it)
    local dup = false
    for _, s in ipairs(seen) do if V.eq(s, kv) then dup = true break end end
    if not dup then
      seen[#seen + 1] = kv
      out[#out + 1] = it
    end
  end
  return V.list(out)
end

local function min_max(name, want)
  return function(_, v, args, kwargs)
    local case_sensitive, attribute = bind(name, { "case_sensitive", "attribute" }, args, kwargs)
    local lower = not truthy(case_sensitive or false)
    local key = is_absent(attribute) and (lower and lowered or identity) or attrgetter(attribute, nil, lower)
    local best, bk
    for _, it in ipairs(iterate(v)) do
      local k = key(it)
      if best == nil or V.cmp(k, bk, "lt") == want then best, bk = it, k end
    end
    if best == nil then return V.undefined(nil, nil, "No aggregated item, sequence was empty.") end
    return best
  end
end
F.min = min_max("min", -1)
F.max = min_max("max", 1)

function F.items(_, v)
  if V.is_undefined(v) then return V.list() end
  if kind(v) ~= "dict" then raise("TypeError", "Can only get item pairs from a mapping.") end
  return methods.DICT.items(v, {})
end

function F.batch(_, v, args, kwargs)
  local linecount, fill_with = bind("batch", { "linecount", "fill_with" }, args, kwargs)
  local n = V.num(linecount)
  local out, cur = {}, {}
  for _, it in ipairs(iterate(v)) do
    cur[#cur + 1] = it
    if #cur == n then out[#out + 1] = V.list(cur) cur = {} end
  end
  if #cur > 0 then
    if fill_with ~= nil then while #cur < n do cur[#cur + 1] = fill_with end end
    out[#out + 1] = V.list(cur)
  end
  return V.list(out)
end

function F.slice(_, v, args, kwargs)
  local slices, fill_with = bind("slice", { "slices", "fill_with" }, args, kwargs)
  local items = iterate(v)
  local n = V.num(slices)
  local per, extra = floor(#items / n), #items % n
  local out, offset = {}, 0
  for i = 0, n - 1 do
    local start = offset + i * per
    if i < extra then offset = offset + 1 end
    local stop = offset + (i + 1) * per
    local tmp = {}
    for j = start + 1, stop do tmp[#tmp + 1] = items[j] end
    if fill_with ~= nil and i >= extra then tmp[#tmp + 1] = fill_with end
    out[#out + 1] = V.list(tmp)
  end
  return V.list(out)
end

function F.default(_, v, args, kwargs)
  local default_value, boolean = bind("default", { "default_value", "boolean" }, args, kwargs)
  if default_value == nil then default_value = "" end
  if V.is_undefined(v) or (truthy(boolean or false) and not truthy(v)) then return default_value end
  return v
end
F.d = F.default

function F.attr(_, v, args, kwargs)
  local name = bind("attr", { "name" }, args, kwargs)
  return methods.getattr(v, name)
end

-- select/reject/selectattr/rejectattr: keep the items (or the items whose attribute) pass
-- the named test, or are true when no test is named.
local function select_like(want, with_attr)
  return function(rt, v, args, kwargs)
    local get, test_name, first = identity, nil, 1
    if with_attr then
      if #args < 1 then raise("FilterArgumentError", "Missing parameter for attribute name") end
      get = attrgetter(args[1])
      first = 2
    end
    test_name = args[first]
    local targs = {}
    for i = first + 1, #args do targs[#targs + 1] = args[i] end
    local test
    if test_name == nil then
      test = function(x) return truthy(x) end
    else
      local t = rt.tests[test_name]
      if not t then raise("TemplateRuntimeError", ("No test named %s."):format(V.repr(test_name))) end
      test = function(x) return t(rt, V.plain(x), targs, kwargs) end
    end
    local out = {}
    for _, it in ipairs(iterate(v)) do
      if test(get(it)) == want then out[#out + 1] = it end
    end
    return V.list(out)
  end
end
F.select = select_like(true, false)
F.reject = select_like(false, false)
F.selectattr = select_like(true, true)
F.rejectattr = select_like(false, true)

function F.map(rt, v, args, kwargs)
  local items = iterate(v)
  local fn
  if kwargs and kwargs.vals.attribute ~= nil then
    fn = attrgetter(kwargs.vals.attribute, kwargs.vals.default)
  elseif #args == 0 then
    raise("FilterArgumentError", "map requires a filter argument")
  else
    local f = rt.filters[args[1]]
    if not f then raise("TemplateRuntimeError", ("No filter named %s."):format(V.repr(args[1]))) end
    local fargs = {}
    for i = 2, #args do fargs[#fargs + 1] = args[i] end
    fn = function(x) return f(rt, V.plain(x), fargs, kwargs) end
  end
  local out = {}
  for i, it in ipairs(items) do out[i] = fn(it) end
  return V.list(out)
end

function F.groupby(_, v, args, kwargs)
  local attribute, default, case_sensitive = bind("groupby", { "attribute", "default", "case_sensitive" }, args, kwargs)
  local lower = not truthy(case_sensitive or false)
  local get = attrgetter(attribute, default, lower)
  local raw = attrgetter(attribute, default, false)
  local sorted = stable_sort(iterate(v), get)
  local out = {}
  for _, it in ipairs(sorted) do
    local g = out[#out]
    if g and V.eq(g.key, get(it)) then
      g.list[#g.list + 1] = it
    else
      out[#out + 1] = { key = get(it), grouper = raw(it), list = { it } }
    end
  end
  -- Jinja's _GroupTuple: a (grouper, list) pair that also has those two attributes.
  local res = {}
  for i, g in ipairs(out) do
    local t = V.tuple({ g.grouper, V.list(g.list) })
    t.attrs = { grouper = t[1], list = t[2] }
    res[i] = t
  end
  return V.list(res)
end

return F
