-- Tool calling in the OpenAI API (docs/serving.md, "Tools"): a request's `tools`, `tool_choice`,
-- `parallel_tool_calls` and its messages' `tool_calls` and `tool_call_id` checked field by field;
-- the conversation in the shape Hugging Face chat templates expect; the tool-call parser of the
-- model's family (a policy of kind "tools", recipes/policies/tools/*.lua, detected from the chat
-- template or named by --tool-parser) and the grammar of its call syntax. No I/O here.
local json = require "loip.text.json"
local template = require "loip.text.template"
local policy = require "loip.policy"

local M = {}

local function bad(param, fmt, ...)
  return { status = 400, message = string.format(fmt, ...), param = param, code = "invalid_value" }
end

local function null(v) return v == nil or v == json.null end
local function object(v) return type(v) == "table" and v ~= json.null and (next(v) == nil or #v == 0) end

-- The parsers tried, in this order, when none is named: the first whose serves(template) holds;
-- hermes (the fallback) serves any template.
M.families = { "harmony", "llama3", "qwen", "mistral", "hermes" }

-- Check body's tools, tool_choice and parallel_tool_calls into spec s (s.tools: the functions as
-- given, s.tool_choice: "none" | "auto" | "required" | { name }, s.parallel_tool_calls, and
-- s.template_tools: the tools with their key order, for the template). text: the body's JSON
-- (key order is read from it; nil: keys sorted). Returns nil, or an error { status, message, param, code }.
function M.check(body, s, text)
  local tools = body.tools
  if not null(tools) then
    if type(tools) ~= "table" or (next(tools) ~= nil and #tools == 0) then return bad("tools", "'tools' must be an array of {type: \"function\", function: {...}}") end
    local names = {}
    for i, t in ipairs(tools) do
      local at = string.format("tools[%d]", i - 1)
      if not object(t) then return bad(at, "%s must be an object", at) end
      if t.type ~= "function" then return bad(at .. ".type", "%s.type must be \"function\", not %s", at, json.encode(t.type)) end
      local f = t["function"]
      if not object(f) then return bad(at .. ".function", "%s.function must be an object {name, description, parameters}", at) end
      local name = f.name
      if type(name) ~= "string" or not name:match("^[%w_%-]+$") or #name > 64 then
        return bad(at .. ".function.name", "%s.function.name must be 1 to 64 letters, digits, '_' or '-', not %s", at, json.encode(name))
      end
      if names[name] then return bad(at .. ".function.name", "%s.function.name: '%s' is named twice (tools[%d])", at, name, names[name]) end
      names[name] = i - 1
      if not null(f.description) and type(f.description) ~= "string" then
        return bad(at .. ".function.description", "%s.function.description must be a string", at)
      end
      if not null(f.parameters) and not object(f.parameters) then
        return bad(at .. ".function.parameters", "%s.function.parameters must be a JSON schema object", at)
      end
      if not null(f.strict) and type(f.strict) ~= "boolean" then
        return bad(at .. ".function.strict", "%s.function.strict must be true or false", at)
      end
    end
    if #tools > 0 then
      s.tools = tools
      local ordered = text and template.ordered_decode(text)
      s.template_tools = ordered and ordered.vals.tools or tools
    end
  end
  local choice = body.tool_choice
  if null(choice) then s.tool_choice = s.tools and "auto" or "none"
  elseif choice == "none" or choice == "auto" or choice == "required" then s.tool_choice = choice
  elseif object(choice) then
    local f = choice["function"]
    if choice.type ~= "function" or not object(f) or type(f.name) ~= "string" then
      return bad("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}")
    end
    local known
    for _, t in ipairs(s.tools or {}) do known = known or t["function"].name == f.name end
    if not known then return bad("tool_choice", "'tool_choice' names the function '%s', which is not in 'tools'", f.name) end
    s.tool_choice = { name = f.name }
  else
    return bad("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}, not %s", json.encode(choice))
  end
  if s.tool_choice == "required" and not s.tools then return bad("tool_choice", "'tool_choice' is \"required\" but no 'tools' are given") end
  local par = body.parallel_tool_calls
  if not null(par) and type(par) ~= "boolean" then return bad("parallel_tool_calls", "'parallel_tool_calls' must be true or false") end
  s.parallel_tool_calls = par ~= false
end

-- Copy a request message's tool fields (m: as sent; i: its index, 0-based) into out, checked:
-- an assistant's tool_calls ({id, type "function", function {name, arguments (JSON text)}}) and
-- reasoning_content (its reasoning, as llama.cpp's server and vLLM answer it), a tool message's
-- tool_call_id (and name). Returns nil or an error.
function M.message(out, m, i)
  local at = string.format("messages[%d]", i)
  if out.role == "assistant" and not null(m.reasoning_content) then
    if type(m.reasoning_content) ~= "string" then return bad(at .. ".reasoning_content", "%s.reasoning_content must be a string", at) end
    out.reasoning_content = m.reasoning_content
  end
  if out.role == "assistant" and not null(m.tool_calls) then
    local calls = m.tool_calls
    if type(calls) ~= "table" or (next(calls) ~= nil and #calls == 0) then return bad(at .. ".tool_calls", "%s.tool_calls must be an array", at) end
    out.tool_calls = {}
    for j, c in ipairs(calls) do
      local cat = string.format("%s.tool_calls[%d]", at, j - 1)
      if not object(c) then return bad(cat, "%s must be an object", cat) end
      if type(c.id) ~= "string" or c.id == "" then return bad(cat .. ".id", "%s.id must be a non-empty string", cat) end
      if not null(c.type) and c.type ~= "function" then return bad(cat .. ".type", "%s.type must be \"function\"", cat) end
      local f = c["function"]
      if not object(f) or type(f.name) ~= "string" or f.name == "" then
        return bad(cat .. ".function.name", "%s.function.name must be a non-empty string", cat)
      end
      if type(f.arguments) ~= "string" then
        return bad(cat .. ".function.arguments", "%s.function.arguments must be a string (the arguments' JSON)", cat)
      end
      out.tool_calls[j] = { id = c.id, type = "function", ["function"] = { name = f.name, arguments = f.arguments } }
    end
  end
  if out.role == "tool" then
    if type(m.tool_call_id) ~= "string" or m.tool_call_id == "" then
      return bad(at .. ".tool_call_id", "%s.tool_call_id must name the call this answers (a non-empty string)", at)
    end
    out.tool_call_id = m.tool_call_id
    if type(m.name) == "string" then out.name = m.name end
  end
end

-- Whether a request message's content may be null: an assistant's that carries tool calls.
function M.content_optional(m)
  return m.role == "assistant" and type(m.tool_calls) == "table" and m.tool_calls ~= json.null
end

-- Messages as Hugging Face chat templates expect them: a call's arguments as an object (its keys
-- in the order they were written; text that is not JSON stays text, which Qwen3's template
-- takes), and, for templates that require call ids of 9 letters and digits (Mistral's), ids
-- made of the last 9 of them (the call and its tool message alike). An assistant's
-- reasoning_content is also its `thinking`, which gpt-oss's template reads (and which it refuses
-- beside content in a message with calls: the content goes, as llama.cpp's server does).
function M.template_messages(messages, template_text)
  local nine = template_text and template_text:find("length != 9", 1, true) ~= nil
  local thinking = template_text and template_text:find("message.thinking", 1, true) ~= nil
  local function id_of(id)
    if not nine or id:match("^%w+$") and #id == 9 then return id end
    local a = id:gsub("%W", "")
    return (("0"):rep(9) .. a):sub(-9)
  end
  local out = {}
  for i, m in ipairs(messages) do
    if m.tool_calls or m.tool_call_id or m.reasoning_content then
      local c = {}
      for k, v in pairs(m) do c[k] = v end
      if m.reasoning_content then
        c.thinking = m.reasoning_content
        if thinking and m.tool_calls then c.content = "" end
      end
      if m.tool_calls then
        c.tool_calls = {}
        for j, call in ipairs(m.tool_calls) do
          local f = call["function"]
          local args = template.ordered_decode(f.arguments)
          if args == nil then args = f.arguments end
          -- (in transformers' key order: templates that write a call with tojson show it)
          c.tool_calls[j] = template.dict({ { "id", id_of(call.id) }, { "type", "function" },
            { "function", template.dict({ { "name", f.name }, { "arguments", args } }) } })
        end
      end
      if m.tool_call_id then c.tool_call_id = id_of(m.tool_call_id) end
      out[i] = c
    else
      out[i] = m
    end
  end
  return out
end

-- The parser of a template: name (a shipped name or a file, --tool-parser) or the first of
-- M.families that serves the template's text. Returns the policy instance (loip.policy).
function M.parser(name, template_text)
  if name then return policy.load("tools", name) end
  for _, fam in ipairs(M.families) do
    local p = policy.load("tools", fam)
    if p.serves(template_text or "") then return p end
  end
end

-- Whether a request's output is parsed for calls (tools given, tool_choice not "none").
function M.wanted(spec)
  return spec.tools ~= nil and spec.tool_choice ~= "none"
end

-- The GBNF that constrains a request's output to calls (tool_choice "required" or named), in
-- parser p's syntax; nil for "auto" and "none" (nothing to constrain). The arguments' grammar is
-- loip.text.grammar's from_schema(schema, where) unless schema_gbnf is given.
function M.grammar(spec, p, schema_gbnf)
  if spec.tool_choice ~= "required" and type(spec.tool_choice) ~= "table" then return nil end
  if not schema_gbnf then
    local ok, g = pcall(require, "loip.text.grammar")
    if not ok or type(g) ~= "table" or not g.from_schema then
      error("tool_choice \"required\" or a named function needs loip.text.grammar (JSON schemas to grammars)", 2)
    end
    schema_gbnf = g.from_schema
  end
  return p.grammar({ tools = spec.tools, choice = spec.tool_choice, parallel = spec.parallel_tool_calls, schema_gbnf = schema_gbnf })
end

-- The constraint of a request whose tool_choice is "required" or a named function, as
-- loip.engine.request.constrain takes a format: { type = "gbnf", gbnf, param = "tools" }; nil for "auto"
-- and "none"; or nil, a message and the field it names (a function's parameters the grammar
-- cannot take: "tools[i].function.parameters").
function M.format(spec, p, schema_gbnf)
  local ok, g = pcall(M.grammar, spec, p, schema_gbnf)
  if not ok then return nil, tostring(g), tostring(g):match("tools%[%d+%]%.function%.parameters") or "tools" end
  if g then return { type = "gbnf", gbnf = g, param = "tools" } end
end

return M
