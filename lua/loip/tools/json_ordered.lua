-- JSON decoded as loip.tools.json (cjson) decodes it -- null is json.null, arrays are Lua
-- arrays (empty ones carry cjson's array metatable), objects tables -- and, besides, the order
-- of each object's keys in the text, which cjson loses: a JSON schema's properties are
-- generated in that order (OpenAI's strict mode does so). keys(obj) is that order, or nil for
-- a table this module did not decode.
--   decode(text, what) -> value | nil, "what: invalid JSON: why at offset N"
local cjson = require "cjson"
local errors = require "loip.error"
local json = require "loip.tools.json"
local from_cp = require("loip.text.template.text").from_cp

local M = {}

local order = setmetatable({}, { __mode = "k" })

function M.keys(obj) return order[obj] end

local escapes = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }

function M.decode(text, what)
  local i = 1
  local function fail(msg) errors.raise("json", string.format("%s: invalid JSON: %s at offset %d", what or "JSON", msg, i - 1)) end
  local function ws() i = text:find("[^ \t\r\n]", i) or #text + 1 end
  local value
  local function str()
    i = i + 1
    local parts = {}
    while true do
      local a, b = text:find('^[^"\\%c]+', i)
      if a then parts[#parts + 1] = text:sub(a, b) i = b + 1 end
      local c = text:sub(i, i)
      if c == '"' then i = i + 1 return table.concat(parts) end
      if c ~= "\\" then fail(c == "" and "unterminated string" or "a control character in a string") end
      local e = text:sub(i + 1, i + 1)
      if escapes[e] then parts[#parts + 1] = escapes[e] i = i + 2
      elseif e == "u" then
        local h = text:match("^%x%x%x%x", i + 2)
        if not h then fail("\\u needs 4 hex digits") end
        local cp = tonumber(h, 16)
        i = i + 6
        if cp >= 0xD800 and cp <= 0xDBFF then
          local lo = text:match("^\\u(%x%x%x%x)", i)
          local l = lo and tonumber(lo, 16)
          if l and l >= 0xDC00 and l <= 0xDFFF then
            cp = 0x10000 + (cp - 0xD800) * 0x400 + (l - 0xDC00)
            i = i + 6
          end
        end
        parts[#parts + 1] = from_cp(cp)
      else fail("unknown escape \\" .. e) end
    end
  end
  local depth = 0
  function value()
    ws()
    local c = text:sub(i, i)
    if c == "{" or c == "[" then
      depth = depth + 1
      if depth > 1000 then fail("nested deeper than 1000") end
      i = i + 1
      local t, keys = {}, {}
      local close = c == "{" and "}" or "]"
      ws()
      if text:sub(i, i) == close then
        i = i + 1
      else
        while true do
          if c == "{" then
            ws()
            if text:sub(i, i) ~= '"' then fail("expected a key") end
            local k = str()
            ws()
            if text:sub(i, i) ~= ":" then fail("expected ':'") end
            i = i + 1
            if t[k] == nil then keys[#keys + 1] = k end
            t[k] = value()
          else
            t[#t + 1] = value()
          end
          ws()
          local s = text:sub(i, i)
          i = i + 1
          if s == close then break end
          if s ~= "," then i = i - 1 fail("expected ',' or '" .. close .. "'") end
        end
      end
      depth = depth - 1
      if c == "{" then order[t] = keys elseif #t == 0 then setmetatable(t, cjson.array_mt) end
      return t
    end
    if c == '"' then return str() end
    for word, v in pairs({ ["true"] = true, ["false"] = false, null = json.null }) do
      if text:sub(i, i + #word - 1) == word then i = i + #word return v end
    end
    local a, b = text:find("^-?%d+", i)
    if not a then fail("unexpected " .. (c == "" and "end" or "'" .. c .. "'")) end
    local e = b
    local fa, fb = text:find("^%.%d+", e + 1)
    if fa then e = fb end
    local xa, xb = text:find("^[eE][-+]?%d+", e + 1)
    if xa then e = xb end
    local n = tonumber(text:sub(a, e))
    i = e + 1
    return n
  end
  local ok, v = pcall(function()
    local r = value()
    ws()
    if i <= #text then fail("text after the value") end
    return r
  end)
  if ok then return v end
  if errors.is(v, "json") then return nil, v.message end
  error(v, 0)
end

return M
