-- Constrained decoding for the API: a request's format (response_format json_object or
-- json_schema, llama.cpp's `grammar`, or a tool call's syntax) made into a matcher of the
-- served tokenizer's vocabulary (loip.text.grammar), applied where the request's tokens are
-- sampled (loip.engine.request.head_sample). Compiled grammars are kept by their text (a few dozen, the
-- least recently used dropped), so that repeated schemas cost their compilation once.
local grammar = require "loip.text.grammar"
local json_ordered = require "loip.text.json_ordered"

local M = {}

local Cache = {}
Cache.__index = Cache

-- A server's constraint maker over tokenizer tok (its vocabulary is built on first use).
function M.new(tok, opts)
  return setmetatable({ tok = tok, grammars = {}, order = {}, max = opts and opts.max_grammars or 32 }, Cache)
end

-- The GBNF text of a format (openai.lua's spec.format), and the field its errors name.
function M.gbnf(format)
  if format.type == "grammar" then return format.gbnf, "grammar" end
  if format.type == "json_object" then return grammar.json_object_gbnf(), "response_format" end
  if format.type == "json_schema" then
    return grammar.from_schema(format.schema, "response_format.json_schema.schema"), "response_format.json_schema.schema"
  end
  if format.type == "gbnf" then return format.gbnf, format.param end -- (made by a tool-call parser)
  error("constrain: unknown format " .. tostring(format.type), 2)
end

function Cache:compiled(text, where)
  local g = self.grammars[text]
  if not g then
    g = grammar.compile(text, where)
    self.grammars[text] = g
    self.order[#self.order + 1] = text
    if #self.order > self.max then self.grammars[table.remove(self.order, 1)] = nil end
  end
  return g
end

-- The schemas of a parsed request (spec: openai.parse's or anthropic.parse's) in the order
-- their properties are written in the body's text (cjson's tables lose it; a schema's properties
-- are generated in that order, as OpenAI's strict mode does): the body decoded again with
-- loip.text.json_ordered, its schemas put in spec in place of cjson's. anthropic: the body is
-- Anthropic's (tools[i].input_schema).
function M.keep_order(spec, text, anthropic)
  local wants = spec.format and spec.format.type == "json_schema" or (spec.tools and spec.tool_choice ~= "none")
  if not wants then return end
  local body = json_ordered.decode(text)
  if type(body) ~= "table" then return end
  if spec.format and spec.format.type == "json_schema" then
    local rf = body.response_format
    local js = type(rf) == "table" and rf.json_schema
    if type(js) == "table" and type(js.schema) == "table" then spec.format.schema = js.schema end
  end
  for i, t in ipairs(spec.tools or {}) do
    local o = type(body.tools) == "table" and body.tools[i]
    local schema = type(o) == "table" and (anthropic and o.input_schema or type(o["function"]) == "table" and o["function"].parameters)
    if type(schema) == "table" and type(t["function"]) == "table" then t["function"].parameters = schema end
  end
end

-- A matcher for format (nil: none) allowing the ids of the set `stops` when the grammar may end;
-- or nil, a message and the field it names (a schema or grammar the request got wrong).
function Cache:matcher(format, stops)
  if not format then return nil end
  local ok, text, where = pcall(M.gbnf, format)
  if not ok then return nil, tostring(text), format.param or (format.type == "grammar" and "grammar" or "response_format.json_schema.schema") end
  local okc, g = pcall(self.compiled, self, text, where)
  if not okc then return nil, tostring(g), where end
  self.vocab = self.vocab or grammar.vocab(self.tok)
  local ids = {}
  for id in pairs(stops or {}) do ids[#ids + 1] = id end
  table.sort(ids)
  return g:matcher(self.vocab, { stop_ids = ids })
end

return M
