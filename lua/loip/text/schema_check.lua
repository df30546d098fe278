-- Validation of a decoded JSON value against a JSON schema, for the subset loip.text.schema
-- turns into grammars (type, enum, const, anyOf, oneOf, allOf, nullable, properties, required,
-- additionalProperties, items, minItems, maxItems, minLength, maxLength, $ref within the
-- schema), with JSON Schema's meaning (additionalProperties absent: extra properties are
-- valid; oneOf: exactly one branch). Checks what a model wrote under a schema's grammar (tool
-- arguments, structured outputs) and the grammar itself in the specs.
--   check(schema, value) -> true | nil, "JSON pointer: why"
-- Values are decoded by loip.text.json (cjson): null is json.null; an empty table is an
-- empty object or array, either.
local json = require "loip.text.json"
local schema_mod = require "loip.text.schema"

local M = {}

local function is_array(v) return type(v) == "table" and v ~= json.null and (#v > 0 or next(v) == nil) end
local function is_object(v) return type(v) == "table" and v ~= json.null and (#v == 0) end

local utf8_len = require("loip.text.template.text").len -- (code points)

local function equal(a, b)
  if type(a) ~= type(b) then return false end
  if type(a) ~= "table" then return a == b end
  for k, v in pairs(a) do if not equal(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end

local type_check = {
  string = function(v) return type(v) == "string" end,
  number = function(v) return type(v) == "number" end,
  integer = function(v) return type(v) == "number" and v == math.floor(v) end,
  boolean = function(v) return type(v) == "boolean" end,
  null = function(v) return v == json.null end,
  object = is_object,
  array = is_array,
}

function M.check(schema, value)
  local root = schema
  local function check(s, v, ptr)
    if s == true then return true end
    local function no(msg) return nil, (ptr == "" and "/" or ptr) .. ": " .. msg end
    if s.nullable == true and v == json.null then return true end
    if s["$ref"] then
      local ref = s["$ref"]
      return check(schema_mod.pointer(root, ref), v, ptr)
    end
    if s.const ~= nil and not equal(s.const, v) then return no("not the const value") end
    if s.enum ~= nil then
      local found = false
      for _, e in ipairs(s.enum) do if equal(e, v) then found = true break end end
      if not found then return no("not one of the enum's values") end
    end
    if s.type ~= nil then
      local list = type(s.type) == "table" and s.type or { s.type }
      local ok = false
      for _, t in ipairs(list) do if type_check[t](v) then ok = true break end end
      if not ok then return no("not of type " .. table.concat(list, " or ")) end
    end
    for _, kw in ipairs({ "anyOf", "oneOf", "allOf" }) do
      if s[kw] then
        local n = 0
        for _, sub in ipairs(s[kw]) do if check(sub, v, ptr) then n = n + 1 end end
        if kw == "anyOf" and n == 0 then return no("matches no branch of anyOf") end
        if kw == "oneOf" and n ~= 1 then return no("matches " .. n .. " branches of oneOf") end
        if kw == "allOf" and n ~= #s[kw] then return no("does not match every branch of allOf") end
      end
    end
    if type(v) == "string" then
      local len = utf8_len(v)
      if s.minLength and len < s.minLength then return no("shorter than minLength") end
      if s.maxLength and len > s.maxLength then return no("longer than maxLength") end
    end
    if is_object(v) and (s.properties or s.required or s.additionalProperties ~= nil) then
      for _, name in ipairs(s.required or {}) do
        if v[name] == nil then return no("required property " .. name .. " is missing") end
      end
      for k, x in pairs(v) do
        local sub = s.properties and s.properties[k]
        if sub ~= nil then
          local ok, err = check(sub, x, ptr .. "/" .. k)
          if not ok then return nil, err end
        elseif s.additionalProperties == false then
          return no("property " .. tostring(k) .. " is not allowed")
        end
      end
    end
    if is_array(v) and (s.items or s.minItems or s.maxItems) then
      if s.minItems and #v < s.minItems then return no("fewer items than minItems") end
      if s.maxItems and #v > s.maxItems then return no("more items than maxItems") end
      if s.items then
        for i, x in ipairs(v) do
          local ok, err = check(s.items, x, ptr .. "/" .. (i - 1))
          if not ok then return nil, err end
        end
      end
    end
    return true
  end
  return check(schema, value, "")
end

return M
