-- JSON decoded as loip.text.json (cjson) decodes it -- null is json.null, arrays are Lua
-- arrays (empty ones carry cjson's array metatable), objects tables -- and, besides, the order
-- of each object's keys in the text, which cjson loses: a JSON schema's properties are
-- generated in that order (OpenAI's strict mode does so). keys(obj) is that order, or nil for
-- a table this module did not decode.
--   decode(text, what) -> value | nil, "what: invalid JSON: why at offset N"
local cjson = require "cjson"
local errors = require "loip.error"
local json = require "loip.text.json"
local from_cp = require("loip.text.template.text").from_cp

local M = {}

local order = setmetatable({}, { __mode = "k" })

function M.keys(obj) return order[obj] end

local escapes = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }

-- A text being decoded: the text, the position i (1-based), what it is (in errors) and the depth
-- of the containers open.
local Decoder = {}
Decoder.__index = Decoder

function Decoder:fail(msg) errors.raise("json", string.format("%s: invalid JSON: %s at offset %d", self.what or "JSON", msg, self.i - 1)) end
function Decoder:ws() self.i = self.text:find("[^ \t\r\n]", self.i) or #self.text + 1 end

function Decoder:str()
  local text = self.text
  self.i = self.i + 1
  local parts = {}
  while true do
    local i = self.i
    local a, b = text:find('^[^"\\%c]+', i)
    if a then parts[#parts + 1] = text:sub(a, b) i = b + 1 self.i = i end
    local c = text:sub(i, i)
    if c == '"' then self.i = i + 1 return table.concat(parts) end
    if c ~= "\\" then self:fail(c == "" and "unterminated string" or "a control character in a string") end
    local e = text:sub(i + 1, i + 1)
    if escapes[e] then parts[#parts + 1] = escapes[e] self.i = i + 2
    elseif e == "u" then
      local h = text:match("^%x%x%x%x", i + 2)
      if not h then self:fail("\\u needs 4 hex digits") end
      local cp = tonumber(h, 16)
      i = i + 6
      self.i = i
      if cp >= 0xD800 and cp <= 0xDBFF then
        local lo = text:match("^\\u(%x%x%x%x)", i)
        local l = lo and tonumber(lo, 16)
        if l and l >= 0xDC00 and l <= 0xDFFF then
          cp = 0x10000 + (cp - 0xD800) * 0x400 + (l - 0xDC00)
          self.i = i + 6
        end
      end
      parts[#parts + 1] = from_cp(cp)
    else self:fail("unknown escape \\" .. e) end
  end
end

-- An object or array opening with c ("{" or "["): its members, the object's keys' order kept.
function Decoder:container(c)
  local text = self.text
  self.depth = self.depth + 1
  if self.depth > 1000 then self:fail("nested deeper than 1000") end
  self.i = self.i + 1
  local t, keys = {}, {}
  local close = c == "{" and "}" or "]"
  self:ws()
  if text:sub(self.i, self.i) == close then
    self.i = self.i + 1
  else
    while true do
      if c == "{" then
        self:ws()
        if text:sub(self.i, self.i) ~= '"' then self:fail("expected a key") end
        local k = self:str()
        self:ws()
        if text:sub(self.i, self.i) ~= ":" then self:fail("expected ':'") end
        self.i = self.i + 1
        if t[k] == nil then keys[#keys + 1] = k end
        t[k] = self:value()
      else
        t[#t + 1] = self:value()
      end
      self:ws()
      local s = text:sub(self.i, self.i)
      self.i = self.i + 1
      if s == close then break end
      if s ~= "," then self.i = self.i - 1 self:fail("expected ',' or '" .. close .. "'") end
    end
  end
  self.depth = self.depth - 1
  if c == "{" then order[t] = keys elseif #t == 0 then setmetatable(t, cjson.array_mt) end
  return t
end

function Decoder:value()
  self:ws()
  local text, i = self.text, self.i
  local c = text:sub(i, i)
  if c == "{" or c == "[" then return self:container(c) end
  if c == '"' then return self:str() end
  for word, v in pairs({ ["true"] = true, ["false"] = false, null = json.null }) do
    if text:sub(i, i + #word - 1) == word then self.i = i + #word return v end
  end
  local a, b = text:find("^-?%d+", i)
  if not a then self:fail("unexpected " .. (c == "" and "end" or "'" .. c .. "'")) end
  local e = b
  local fa, fb = text:find("^%.%d+", e + 1)
  if fa then e = fb end
  local xa, xb = text:find("^[eE][-+]?%d+", e + 1)
  if xa then e = xb end
  local n = tonumber(text:sub(a, e))
  self.i = e + 1
  return n
end

function M.decode(text, what)
  local d = setmetatable({ text = text, i = 1, what = what, depth = 0 }, Decoder)
  local ok, v = pcall(function()
    local r = d:value()
    d:ws()
    if d.i <= #text then d:fail("text after the value") end
    return r
  end)
  if ok then return v end
  if errors.is(v, "json") then return nil, v.message end
  error(v, 0)
end
return M
