-- JSON with the two properties cjson lacks and chat templates need: objects keep their key
-- order (it shows through `tojson` and `items()`), and numbers keep int-vs-float (1 vs 1.0).
-- decode() gives template values (see loip/template.lua); dumps() is Python's json.dumps,
-- which transformers' `tojson` filter calls.
local errors = require "loip.error"
local V = require "loip.text.template.values"
local text = require "loip.text.template.text"

local M = {}

local byte, sub, find, char, format = string.byte, string.sub, string.find, string.char, string.format
local concat = table.concat

-- Decoder ------------------------------------------------------------------------------

local ESC = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n",
  r = "\r", t = "\t" }

local function decode_error(s, pos, msg)
  local line, col = 1, pos
  for nl in s:sub(1, pos - 1):gmatch("()\n") do line, col = line + 1, pos - nl end
  errors.raise("json", ("%s: line %d column %d (char %d)"):format(msg, line, col, pos - 1))
end

local function skip_ws(s, pos)
  local _, e = find(s, "^[ \t\n\r]*", pos)
  return e + 1
end

local decode_value

local function decode_string(s, pos)
  -- pos is at the opening quote
  local out, i = {}, pos + 1
  while true do
    local a = find(s, '["\\%c]', i)
    if not a then decode_error(s, pos, "Unterminated string starting at") end
    out[#out + 1] = sub(s, i, a - 1)
    local c = sub(s, a, a)
    if c == '"' then return concat(out), a + 1 end
    if c ~= "\\" then decode_error(s, a, "Invalid control character at") end
    local e = sub(s, a + 1, a + 1)
    if ESC[e] then
      out[#out + 1] = ESC[e]
      i = a + 2
    elseif e == "u" then
      local hex = sub(s, a + 2, a + 5)
      if not find(hex, "^%x%x%x%x$") then decode_error(s, a, "Invalid \\uXXXX escape") end
      local cp = tonumber(hex, 16)
      i = a + 6
      -- A surrogate pair encodes one code point above the BMP.
      if cp >= 0xD800 and cp <= 0xDBFF and sub(s, i, i + 1) == "\\u" then
        local lo = tonumber(sub(s, i + 2, i + 5), 16)
        if lo and lo >= 0xDC00 and lo <= 0xDFFF then
          cp = 0x10000 + (cp - 0xD800) * 0x400 + (lo - 0xDC00)
          i = i + 6
        end
      end
      out[#out + 1] = text.from_cp(cp)
    else
      decode_error(s, a, "Invalid \\escape")
    end
  end
end

local function decode_number(s, pos)
  local _, e = find(s, "^-?%d+", pos)
  if not e then decode_error(s, pos, "Expecting value") end
  local is_float = false
  local _, fe = find(s, "^%.%d+", e + 1)
  if fe then e, is_float = fe, true end
  local _, ee = find(s, "^[eE][-+]?%d+", e + 1)
  if ee then e, is_float = ee, true end
  local x = V.decimal(sub(s, pos, e))
  if is_float then return V.float(x), e + 1 end
  return x, e + 1
end

local LITERALS = { { "true", true }, { "false", false }, { "null", V.null },
  { "NaN", 0 / 0 }, { "Infinity", math.huge }, { "-Infinity", -math.huge } }

decode_value = function(s, pos)
  pos = skip_ws(s, pos)
  local c = sub(s, pos, pos)
  if c == "{" then
    local d = V.dict()
    pos = skip_ws(s, pos + 1)
    if sub(s, pos, pos) == "}" then return d, pos + 1 end
    while true do
      if sub(s, pos, pos) ~= '"' then
        decode_error(s, pos, "Expecting property name enclosed in double quotes")
      end
      local key
      key, pos = decode_string(s, pos)
      pos = skip_ws(s, pos)
      if sub(s, pos, pos) ~= ":" then decode_error(s, pos, "Expecting ':' delimiter") end
      local v
      v, pos = decode_value(s, pos + 1)
      V.dict_set(d, key, v)
      pos = skip_ws(s, pos)
      local sep = sub(s, pos, pos)
      if sep == "}" then return d, pos + 1 end
      if sep ~= "," then decode_error(s, pos, "Expecting ',' delimiter") end
      pos = skip_ws(s, pos + 1)
    end
  elseif c == "[" then
    local l = V.list()
    pos = skip_ws(s, pos + 1)
    if sub(s, pos, pos) == "]" then return l, pos + 1 end
    while true do
      local v
      v, pos = decode_value(s, pos)
      l[#l + 1] = v
      pos = skip_ws(s, pos)
      local sep = sub(s, pos, pos)
      if sep == "]" then return l, pos + 1 end
      if sep ~= "," then decode_error(s, pos, "Expecting ',' delimiter") end
      pos = pos + 1
    end
  elseif c == '"' then
    return decode_string(s, pos)
  end
  for _, lit in ipairs(LITERALS) do
    if sub(s, pos, pos + #lit[1] - 1) == lit[1] then return lit[2], pos + #lit[1] end
  end
  return decode_number(s, pos)
end

-- JSON text -> template value, or nil and a message naming the position.
function M.decode(s)
  local ok, v, pos = pcall(function()
    local v, pos = decode_value(s, 1)
    pos = skip_ws(s, pos)
    if pos <= #s then decode_error(s, pos, "Extra data") end
    return v, pos
  end)
  if ok then return v end
  if errors.is(v, "json") then return nil, v.message end
  error(v, 0)
end

-- Encoder ------------------------------------------------------------------------------

local ASCII_ESC = { ['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\r"] = "\\r",
  ["\t"] = "\\t", ["\b"] = "\\b", ["\f"] = "\\f" }

local function encode_string(s, ensure_ascii)
  s = s:gsub('[%c"\\]', function(c)
    return ASCII_ESC[c] or (c == "\127" and c or format("\\u%04x", byte(c)))
  end)
  if ensure_ascii and find(s, "[\128-\255]") then
    s = s:gsub("[\192-\255][\128-\191]*", function(c)
      local cp = text.cp(c)
      if cp < 0x10000 then return format("\\u%04x", cp) end
      cp = cp - 0x10000
      return format("\\u%04x\\u%04x", 0xD800 + math.floor(cp / 0x400), 0xDC00 + cp % 0x400)
    end)
  end
  return '"' .. s .. '"'
end

local function float_json(x)
  if x ~= x then return "NaN" end
  if x == math.huge then return "Infinity" end
  if x == -math.huge then return "-Infinity" end
  return V.float_repr(x)
end

local function not_serializable(v)
  V.raise("TypeError", ("Object of type %s is not JSON serializable"):format(V.typename(v)))
end

-- Python json's key conversion: str as is, numbers, bools and None spelled out.
local function key_string(k)
  k = V.plain(k)
  local kk = V.kind(k)
  if kk == "str" then return k end
  if kk == "int" then return V.int_str(k) end
  if kk == "float" then return float_json(V.num(k)) end
  if kk == "bool" then return k and "true" or "false" end
  if kk == "none" then return "null" end
  V.raise("TypeError", ("keys must be str, int, float, bool or None, not %s"):format(V.typename(k)))
end

-- o: indent (nil, number of spaces or a string), item_sep, key_sep, sort_keys, ensure_ascii
local function encode(v, o, level)
  v = V.plain(v)
  local k = V.kind(v)
  if k == "str" then return encode_string(v, o.ensure_ascii) end
  if k == "int" then return V.int_str(v) end
  if k == "float" then return float_json(V.num(v)) end
  if k == "bool" then return v and "true" or "false" end
  if k == "none" then return "null" end
  local nl, pad, pad_in = "", "", ""
  if o.indent then
    nl = "\n"
    pad = o.indent:rep(level)
    pad_in = o.indent:rep(level + 1)
  end
  if k == "list" or k == "tuple" then
    if #v == 0 then return "[]" end
    local parts = {}
    for i = 1, #v do parts[i] = pad_in .. encode(v[i], o, level + 1) end
    return "[" .. nl .. concat(parts, o.item_sep .. nl) .. nl .. pad .. "]"
  end
  if k == "dict" then
    if #v.keys == 0 then return "{}" end
    local items = {}
    for i, key in ipairs(v.keys) do items[i] = { key_string(key), v.vals[V.dkey(key)] } end
    if o.sort_keys then table.sort(items, function(a, b) return a[1] < b[1] end) end
    local parts = {}
    for i, it in ipairs(items) do
      parts[i] = pad_in .. encode_string(it[1], o.ensure_ascii) .. o.key_sep .. encode(it[2], o, level + 1)
    end
    return "{" .. nl .. concat(parts, o.item_sep .. nl) .. nl .. pad .. "}"
  end
  not_serializable(v)
end

-- json.dumps(v, ensure_ascii=, indent=, separators=, sort_keys=) with Python's defaults
-- except ensure_ascii, which callers pass explicitly.
function M.dumps(v, opts)
  opts = opts or {}
  local indent = opts.indent
  if indent ~= nil and indent ~= V.null then
    if type(indent) ~= "string" then
      local n = V.num(indent)
      if not n then
        -- Python: a TypeError (an int, a str or None only)
        V.raise("TypeError", ("indent must be an int, a str or None, not '%s'"):format(V.typename(indent)))
      end
      indent = (" "):rep(math.max(0, n))
    end
  else
    indent = nil
  end
  local item_sep, key_sep = ", ", ": "
  if indent then item_sep = "," end
  local seps = opts.separators
  if seps ~= nil and seps ~= V.null then
    local k = V.typename(seps)
    if (k ~= "list" and k ~= "tuple") or #seps ~= 2 then
      V.raise("ValueError", ("separators must be a pair (item separator, key separator), not %s"):format(
        (k == "list" or k == "tuple") and (#seps .. " items") or ("'" .. k .. "'")))
    end
    if type(seps[1]) ~= "string" or type(seps[2]) ~= "string" then V.raise("TypeError", "separators must be strings") end
    item_sep, key_sep = seps[1], seps[2]
  end
  return encode(v, { indent = indent, item_sep = item_sep, key_sep = key_sep,
    sort_keys = opts.sort_keys and V.truthy(opts.sort_keys), ensure_ascii = opts.ensure_ascii }, 0)
end

return M
