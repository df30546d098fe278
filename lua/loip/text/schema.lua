-- JSON schemas to GBNF (loip.text.gbnf), for structured outputs: the document a model writes
-- under the grammar is valid against the schema.
--
-- Supported: type (string, number, integer, boolean, null, object, array, and lists of them),
-- enum, const, anyOf, oneOf (as anyOf: see docs/structured-outputs.md), allOf of one schema,
-- nullable (OpenAPI's: the schema or null; the OpenAI client's zod helper writes it),
-- properties + required + additionalProperties (false or absent: the document holds only the
-- listed properties, in the schema's order (M.gbnf); absent is read as false, which documents valid
-- against the schema satisfy, as OpenAI's strict mode requires), items, minItems, maxItems,
-- minLength, maxLength, $defs / definitions and $ref within the schema ("#", "#/$defs/x",
-- "#/definitions/x", any JSON pointer into the schema such as "#/properties/a"). Annotations (title, description, default, examples, $schema, $id,
-- $comment, deprecated, readOnly, writeOnly) are ignored. Any other keyword is refused naming
-- it and its JSON pointer.
--
-- Whitespace is bounded so that a model cannot loop on it: between tokens of the document at
-- most one space, or one newline and up to 24 spaces of indentation; none before or after the
-- document. Numbers have at most 16 integer digits, 16 fraction digits and 3 exponent digits.
local json = require "loip.text.json"
local ordered = require "loip.text.json_ordered"

local M = {}

-- The JSON rules every schema grammar includes (the json_object grammar is these and
-- root ::= object).
M.base = [[
ws ::= ( " " | "\n" " "{0,24} )?
string ::= "\"" char* "\""
char ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
number ::= integer ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
integer ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
boolean ::= "true" | "false"
null ::= "null"
value ::= object | array | string | number | boolean | null
object ::= "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"
array ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
]]

local annotations = { title = true, description = true, default = true, examples = true, ["$schema"] = true,
  ["$id"] = true, ["$comment"] = true, deprecated = true, readOnly = true, writeOnly = true }
local supported = { type = true, enum = true, const = true, anyOf = true, oneOf = true, allOf = true,
  properties = true, required = true, additionalProperties = true, items = true, minItems = true,
  maxItems = true, minLength = true, maxLength = true, ["$ref"] = true, ["$defs"] = true, definitions = true,
  nullable = true }
local types = { string = "string", number = "number", integer = "integer", boolean = "boolean", null = "null",
  object = true, array = true }

-- A GBNF literal of bytes s.
function M.literal(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    if c == '"' then return '\\"' elseif c == "\\" then return "\\\\" end
    return string.format("\\x%02X", c:byte())
  end) .. '"'
end

local function ptr_token(k) return (tostring(k):gsub("~", "~0"):gsub("/", "~1")) end

local function is_array(t) return type(t) == "table" and t ~= json.null and (#t > 0 or next(t) == nil) end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  return keys
end

-- The value at a reference within doc ("#", "#/$defs/x", "#/properties/a/items"; JSON
-- pointer escapes ~0 ~1 and percent-encoding undone), or nil.
function M.pointer(doc, ref)
  if type(ref) ~= "string" or ref:sub(1, 1) ~= "#" then return nil end
  local path = ref:sub(2):gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end)
  if path == "" then return doc end
  if path:sub(1, 1) ~= "/" then return nil end
  local v = doc
  for tok in (path:sub(2) .. "/"):gmatch("([^/]*)/") do
    tok = tok:gsub("~1", "/"):gsub("~0", "~")
    if type(v) ~= "table" or v == json.null then return nil end
    local nxt = v[tok]
    if nxt == nil and tok:match("^%d+$") then nxt = v[tonumber(tok) + 1] end
    v = nxt
  end
  return v
end

local function nonneg_int(v) return type(v) == "number" and v >= 0 and v == math.floor(v) and v <= 10000 end

-- A schema's rules as they are written (M.rules): the schema, where (its name in errors), the
-- rules' prefix, the rules so far and the names given, and the rule of each $ref made.
local Rules = {}
Rules.__index = Rules

function Rules:fail(ptr, msg) error(string.format("%s: %s: %s", self.where, ptr == "" and "/" or ptr, msg), 0) end

function Rules:new_name(kind)
  self.n = self.n + 1
  return self.prefix .. kind .. "-" .. self.n
end

function Rules:rule(name, body) self.rules[#self.rules + 1] = name .. " ::= " .. body end

function Rules:resolve(ref, ptr)
  if type(ref) ~= "string" then self:fail(ptr, "'$ref' must be a string") end
  if ref == "#" then return self.prefix .. "schema-root" end
  local target = M.pointer(self.schema, ref)
  if target == nil then
    if ref:sub(1, 2) ~= "#/" then self:fail(ptr, "'$ref' " .. ref .. " is not supported (only references within the schema: #, #/$defs/NAME, #/...)") end
    self:fail(ptr, "'$ref' " .. ref .. " names nothing in the schema")
  end
  if not self.defs_done[ref] then
    self.defs_done[ref] = self:new_name("ref")
    self:rule(self.defs_done[ref], self:gen(target, ref:sub(2)))
  end
  return self.defs_done[ref]
end

-- An object's properties in the order they are written: `required`'s, then the others by name
-- (the text's order when decoded by loip.text.json_ordered); and the set of required ones.
function Rules:property_order(s, props, ptr)
  local req, order, listed = {}, {}, {}
  if s.required ~= nil then
    if not is_array(s.required) then self:fail(ptr .. "/required", "'required' must be an array of names") end
    for i, name in ipairs(s.required) do
      if type(name) ~= "string" then self:fail(ptr .. "/required/" .. (i - 1), "'required' must be an array of names") end
      if props[name] == nil then self:fail(ptr .. "/required/" .. (i - 1), "'" .. name .. "' is not in 'properties'") end
      if not listed[name] then order[#order + 1], listed[name] = name, true end
      req[name] = true
    end
  end
  if ordered.keys(props) then order, listed = {}, {} end -- decoded by json_ordered: the text's order
  for _, name in ipairs(ordered.keys(props) or sorted_keys(props)) do
    if not listed[name] then order[#order + 1], listed[name] = name, true end
  end
  return order, req
end

function Rules:object(s, ptr)
  local props = s.properties
  local ap = s.additionalProperties
  if ap ~= nil and ap ~= false and ap ~= true then
    self:fail(ptr .. "/additionalProperties", "'additionalProperties' as a schema is not supported (only false)")
  end
  if props == nil then
    if s.required ~= nil and #s.required > 0 then self:fail(ptr .. "/required", "'required' without 'properties'") end
    if ap == false then return '"{" ws "}"' end
    return "object"
  end
  if type(props) ~= "table" or props == json.null or (#props > 0) then self:fail(ptr .. "/properties", "'properties' must be an object") end
  if ap == true then self:fail(ptr .. "/additionalProperties", "'additionalProperties': true with 'properties' is not supported") end
  local order, req = self:property_order(s, props, ptr)
  local base = self:new_name("object")
  local kv = {}
  for i, name in ipairs(order) do
    kv[i] = M.literal(json.encode(tostring(name))) .. ' ws ":" ws ' .. self:gen(props[name], ptr .. "/properties/" .. ptr_token(name)) .. " ws"
  end
  -- first-i: members i.. with none before; rest-i: with one before (a comma first)
  local k = #order
  for i = k, 1, -1 do
    local nxt_rest = i < k and (base .. "-rest-" .. (i + 1)) or ""
    local nxt_first = i < k and (base .. "-first-" .. (i + 1)) or ""
    local first = kv[i] .. " " .. nxt_rest
    local rest = '"," ws ' .. kv[i] .. " " .. nxt_rest
    if not req[order[i]] then
      first = first .. " | " .. nxt_first
      rest = rest .. " | " .. nxt_rest
    end
    self:rule(base .. "-first-" .. i, first)
    self:rule(base .. "-rest-" .. i, rest)
  end
  self:rule(base, '"{" ws ' .. (k > 0 and base .. "-first-1 " or "") .. '"}"')
  return base
end

function Rules:array(s, ptr)
  if s.items ~= nil and is_array(s.items) and #s.items > 0 then self:fail(ptr .. "/items", "'items' as an array (tuples) is not supported") end
  local item = s.items == nil and "value" or self:gen(s.items, ptr .. "/items")
  local min, max = s.minItems or 0, s.maxItems
  if not nonneg_int(min) then self:fail(ptr .. "/minItems", "'minItems' must be a whole number 0..10000") end
  if max ~= nil and not nonneg_int(max) then self:fail(ptr .. "/maxItems", "'maxItems' must be a whole number 0..10000") end
  if max and max < min then self:fail(ptr .. "/maxItems", "'maxItems' is below 'minItems'") end
  if max == 0 then return '( "[" ws "]" )' end
  local name = self:new_name("array")
  local first, rest = item .. " ws", '( "," ws ' .. item .. " ws )"
  local reps
  local lo = math.max(min - 1, 0)
  if max == nil then reps = "{" .. lo .. ",}" else reps = "{" .. lo .. "," .. (max - 1) .. "}" end
  if min == 0 then self:rule(name, '"[" ws ( ' .. first .. " " .. rest .. reps .. ' )? "]"')
  else self:rule(name, '"[" ws ' .. first .. " " .. rest .. reps .. ' "]"') end
  return name
end

function Rules:string_of(s, ptr)
  local min, max = s.minLength, s.maxLength
  if min == nil and max == nil then return "string" end
  min = min or 0
  if not nonneg_int(min) then self:fail(ptr .. "/minLength", "'minLength' must be a whole number 0..10000") end
  if max ~= nil and not nonneg_int(max) then self:fail(ptr .. "/maxLength", "'maxLength' must be a whole number 0..10000") end
  if max and max < min then self:fail(ptr .. "/maxLength", "'maxLength' is below 'minLength'") end
  return '( "\\"" char{' .. min .. "," .. (max or "") .. '} "\\"" )'
end

function Rules:of_type(s, t, ptr)
  if t == "object" then return self:object(s, ptr) end
  if t == "array" then return self:array(s, ptr) end
  if t == "string" then return self:string_of(s, ptr) end
  return types[t]
end

local function literal_value(v) return M.literal(json.encode(v)) end

-- The rule of a schema of alternatives or one value ($ref, const, enum, anyOf, oneOf, allOf), or
-- nil when s is none of them.
function Rules:choice(s, ptr)
  local function only(kw)
    for _, k in ipairs(sorted_keys(s)) do
      if k ~= kw and supported[k] and k ~= "$defs" and k ~= "definitions" then
        self:fail(ptr, "'" .. kw .. "' together with '" .. k .. "' is not supported")
      end
    end
  end
  if s["$ref"] ~= nil then
    only("$ref")
    return self:resolve(s["$ref"], ptr .. "/$ref")
  end
  if s.const ~= nil then return literal_value(s.const) end
  if s.enum ~= nil then
    if not is_array(s.enum) or #s.enum == 0 then self:fail(ptr .. "/enum", "'enum' must be a non-empty array") end
    local alts = {}
    for i, v in ipairs(s.enum) do alts[i] = literal_value(v) end
    return "( " .. table.concat(alts, " | ") .. " )"
  end
  for _, kw in ipairs({ "anyOf", "oneOf", "allOf" }) do
    local list = s[kw]
    if list ~= nil then
      only(kw)
      if not is_array(list) or #list == 0 then self:fail(ptr .. "/" .. kw, "'" .. kw .. "' must be a non-empty array") end
      if kw == "allOf" and #list > 1 then self:fail(ptr .. "/allOf", "'allOf' of more than one schema is not supported") end
      local alts = {}
      for i, sub in ipairs(list) do alts[i] = self:gen(sub, ptr .. "/" .. kw .. "/" .. (i - 1)) end
      return "( " .. table.concat(alts, " | ") .. " )"
    end
  end
end

-- The rule (a name or an expression) of a document valid against schema s at pointer ptr.
function Rules:gen(s, ptr)
  if s == true then return "value" end
  if type(s) ~= "table" or s == json.null or (#s > 0) then self:fail(ptr, "a schema must be an object or true") end
  for _, k in ipairs(sorted_keys(s)) do
    if not supported[k] and not annotations[k] then self:fail(ptr, "'" .. tostring(k) .. "' is not supported") end
  end
  if s.nullable ~= nil and type(s.nullable) ~= "boolean" then self:fail(ptr .. "/nullable", "'nullable' must be true or false") end
  if s.nullable == true then -- (OpenAPI's, as the OpenAI client's zod helper writes .nullable())
    local rest = {}
    for k, v in pairs(s) do if k ~= "nullable" then rest[k] = v end end
    return "( " .. self:gen(rest, ptr) .. " | null )"
  end
  local chosen = self:choice(s, ptr)
  if chosen then return chosen end
  local t = s.type
  if t == nil then
    if s.properties ~= nil or s.additionalProperties ~= nil or s.required ~= nil then return self:object(s, ptr) end
    if s.items ~= nil or s.minItems ~= nil or s.maxItems ~= nil then return self:array(s, ptr) end
    if s.minLength ~= nil or s.maxLength ~= nil then return self:string_of(s, ptr) end
    return "value"
  end
  local list = type(t) == "table" and t or { t }
  if type(t) == "table" and (not is_array(t) or #t == 0) then self:fail(ptr .. "/type", "'type' must be a name or a non-empty array of names") end
  local alts = {}
  for i, name in ipairs(list) do
    if not types[name] then self:fail(ptr .. "/type", "type '" .. tostring(name) .. "' is not a JSON schema type") end
    alts[i] = self:of_type(s, name, ptr)
  end
  if #alts == 1 then return alts[1] end
  return "( " .. table.concat(alts, " | ") .. " )"
end

-- The rules of schema (a decoded JSON value, or JSON text) as GBNF text, and the name of the
-- rule of a document valid against it; the rules' names start with prefix (default ""), and
-- they call M.base's rules, which the text does not hold (M.gbnf adds them; a grammar made of
-- several schemas, e.g. one per tool, adds them once). where: the field's name in errors.
-- Properties come in the text's order when the schema was decoded by loip.text.json_ordered
-- (or given as text); in a table cjson decoded, that order is lost, and they come in
-- `required`'s order, then the others by name (OpenAI's strict mode requires every property,
-- and clients list them in `required` in the schema's order).
function M.rules(schema, where, prefix)
  where = where or "schema"
  prefix = prefix or ""
  if prefix ~= "" and not prefix:match("^[%w_%-]+$") then error("schema rules: prefix " .. prefix .. " is not a GBNF name", 2) end
  if type(schema) == "string" then
    local v, err = ordered.decode(schema, where)
    if v == nil then error(err, 0) end
    schema = v
  end
  local b = setmetatable({ schema = schema, where = where, prefix = prefix, rules = {}, n = 0, defs_done = {} }, Rules)
  b:rule(prefix .. "schema-root", b:gen(schema, ""))
  return prefix .. "schema-root", table.concat(b.rules, "\n") .. "\n"
end

-- The GBNF text of schema: root ::= a document valid against it (see M.rules).
function M.gbnf(schema, where)
  local name, rules = M.rules(schema, where)
  return "root ::= " .. name .. "\n" .. rules .. M.base
end

return M
