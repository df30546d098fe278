-- Tool calling (loip.serve.tools, loip.serve.tool_calls and the parsers of
-- recipes/policies/tools): each family's canned outputs parse into calls whole and streamed
-- (every way of splitting them gives the same content and calls), malformed calls stay content,
-- the shipped templates pick their family, requests are checked field by field, tool
-- conversations render as transformers renders them (models/chat-templates/reference.json), and
-- each family's call grammar is well-formed GBNF.
local policy = require "loip.policy"
local openai = require "loip.serve.openai"
local tools = require "loip.serve.tools"
local tc = require "loip.serve.tool_calls"
local json = require "loip.text.json"
local template = require "loip.text.template"
local T = require "spec.support"
teardown(function() T.cleanup() end)

-- canned outputs: { family, text, content (nil: none), { { name, arguments } } }
local CALLS = {
  { "hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>',
    "Let me check.", { { "get_weather", '{"city": "Paris", "unit": "c"}' } } },
  { "hermes", '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>', nil, { { "f", '{"x": 1}' } } },
  { "qwen", '<think>\nThe user wants <tool_call> weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>',
    "<think>\nThe user wants <tool_call> weather.\n</think>", { { "get_weather", '{"city": "Paris"}' }, { "get_time", '{"zone": "CET"}' } } },
  { "qwen", 'Sure.\n<tool_call>\n{"name": "get_time", "arguments": {}}', "Sure.", { { "get_time", "{}" } } }, -- cut before its closing tag
  { "llama3", '{"name": "get_weather", "parameters": {"city": "Paris", "days": [1, 2]}}', nil, { { "get_weather", '{"city": "Paris", "days": [1, 2]}' } } },
  { "llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}', nil,
    { { "get_weather", '{"city": "Paris"}' }, { "get_time", "{}" } } },
  { "mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Par}is"}}, {"name": "get_time", "arguments": {"zone": "CET"}, "id": "abcdefghi"}]',
    nil, { { "get_weather", '{"city": "Par}is"}' }, { "get_time", '{"zone": "CET"}' } } },
  { "mistral", 'Here: [TOOL_CALLS][{"name": "f", "arguments": {}}] done', "Here:  done", { { "f", "{}" } } },
  { "mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"q": "say \\"hi]\\" {\\\\"}}]', nil, { { "f", '{"q": "say \\"hi]\\" {\\\\"}' } } },
}

-- malformed or absent calls: the whole text stays content
local CONTENT = {
  { "hermes", 'A <tool_call>{"name": "f", "arguments": [1]}</tool_call> b' },
  { "hermes", "no calls here, < tool_call > nor <tool_" },
  { "qwen", '<tool_call>\n{"name": "f", "arguments": {"x": 1}\n</tool_call>' },
  { "qwen", '<think>only <tool_call>{"name": "f", "arguments": {}}</tool_call> thoughts' },
  { "llama3", 'Sure: {"name": "f", "parameters": {}}' },
  { "llama3", '{"name": "f", "parameters": {"x": }' },
  { "llama3", "<|python_tag|>brave_search.call(query=\"x\")" },
  { "mistral", '[TOOL_CALLS] [{"name": "f"' },
  { "mistral", "[TOOL_CALLS] hello" },
}

-- Feed pieces to a family's stream: content, calls ({ name, arguments }) and the deltas.
local function run(p, pieces)
  local st = p.stream({})
  local text, deltas = {}, {}
  local function take(t, d)
    text[#text + 1] = t
    for _, x in ipairs(d) do deltas[#deltas + 1] = x end
  end
  for _, piece in ipairs(pieces) do take(st.put(piece)) end
  take(st.finish())
  local calls = {}
  for i, c in ipairs(st.calls) do calls[i] = { c.name, c.arguments } end
  return table.concat(text), calls, deltas
end

local function splits(text)
  local out = { { text } }
  local chars = {}
  for i = 1, #text do chars[i] = text:sub(i, i) end
  out[#out + 1] = chars
  for k = 1, #text - 1 do out[#out + 1] = { text:sub(1, k), text:sub(k + 1) } end
  local seed = 7
  for _ = 1, 40 do -- pieces of 1 to 6 bytes, as tokens come
    local pieces, i = {}, 1
    while i <= #text do
      seed = (seed * 1103515245 + 12345) % 2147483648
      local n = 1 + seed % 6
      pieces[#pieces + 1] = text:sub(i, i + n - 1)
      i = i + n
    end
    out[#out + 1] = pieces
  end
  return out
end

describe("tool-call parsers", function()
  after_each(function() collectgarbage() collectgarbage() end)

  for _, case in ipairs(CALLS) do
    it(case[1] .. " parses calls, whole and however the text is split: " .. case[2]:sub(1, 40), function()
      local p = policy.load("tools", case[1])
      local content, calls = p.parse(case[2])
      assert.are.equal(case[3], content)
      assert.are.equal(#case[4], #calls)
      local ids = {}
      for i, c in ipairs(calls) do
        assert.are.same({ case[4][i][1], case[4][i][2] }, { c["function"].name, c["function"].arguments })
        assert.are.equal("function", c.type)
        assert.matches("^call_%x+$", c.id)
        assert.is_nil(ids[c.id])
        ids[c.id] = true
      end
      for _, pieces in ipairs(splits(case[2])) do
        local text, got = run(p, pieces)
        assert.are.equal(case[3] or "", text)
        assert.are.same(case[4], got)
      end
    end)
  end

  for _, case in ipairs(CONTENT) do
    it(case[1] .. " leaves what is not a well-formed call as content: " .. case[2]:sub(1, 40), function()
      local p = policy.load("tools", case[1])
      local content, calls = p.parse(case[2])
      assert.are.equal(case[2], content)
      assert.are.same({}, calls)
      for _, pieces in ipairs(splits(case[2])) do
        local text, got = run(p, pieces)
        assert.are.equal(case[2], text)
        assert.are.same({}, got)
      end
    end)
  end

  it("streams OpenAI's deltas: a call's id, type and name first, then its arguments; text that may start a call is held", function()
    local p = policy.load("tools", "qwen")
    local st = p.stream({})
    local text, d = st.put("Hi <tool")
    assert.are.equal("Hi", text) -- (spaces wait for what follows them: none before calls)
    assert.are.same({}, d)
    text, d = st.put('_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n<tool_call>{"name": "g", "arguments": {}}</tool_call>')
    assert.are.equal("", text)
    assert.are.equal(4, #d)
    assert.are.same({ index = 0, id = st.calls[1].id, type = "function", ["function"] = { name = "f", arguments = "" } }, d[1])
    assert.are.same({ index = 0, ["function"] = { arguments = '{"a": 1}' } }, d[2])
    assert.are.equal(1, d[3].index)
    assert.are.equal("g", d[3]["function"].name)
    assert.are.same({ "", {}, {} }, { st.finish() })
    -- text and calls in the order they came (Anthropic's blocks keep it)
    local mixed = p.stream({})
    local t, _, parts = mixed.put('x <tool_call>{"name": "f", "arguments": {}}</tool_call> y')
    assert.are.equal("x  y", t)
    assert.are.same({ "x", 0, "  y" }, parts) -- (the space before the call waited for what followed it)
    assert.are.same({}, select(3, mixed.finish()))
    -- parallel_tool_calls false: the first call only
    local _, _, deltas = run(policy.load("tools", "mistral"), { '[TOOL_CALLS][{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]' })
    assert.are.equal(4, #deltas)
    local one = p.stream({ parallel = false })
    one.put('<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{"name": "g", "arguments": {}}</tool_call>')
    one.finish()
    assert.are.equal(1, #one.calls)
  end)

  it("each shipped template picks its family; --tool-parser names one or a file", function()
    local dir = T.root .. "/models/chat-templates/"
    local want = { ["Llama-3.1-8B-Instruct"] = "llama3", ["Llama-3.2-3B-Instruct"] = "llama3", ["Qwen2.5-7B-Instruct"] = "qwen",
      ["Qwen3-8B"] = "qwen", ["Mistral-7B-Instruct-v0.3"] = "mistral", ["gemma-2-2b-it"] = "hermes", ["Phi-3.5-mini-instruct"] = "hermes" }
    for name, fam in pairs(want) do
      assert.are.equal(fam, tools.parser(nil, T.read(dir .. name .. ".jinja")).name, name)
    end
    assert.are.equal("mistral", tools.parser("mistral", T.read(dir .. "Qwen3-8B.jinja")).name)
    local own = T.tmpdir() .. "/mine.lua"
    T.write(own, T.read(T.root .. "/recipes/policies/tools/hermes.lua"):gsub('name = "hermes"', 'name = "mine"'))
    assert.are.equal("mine", tools.parser(own).name)
    assert.has_error(function() tools.parser("no-such-parser") end)
  end)

  it("finds where JSON values end, keeping the model's own text", function()
    assert.are.equal(10, tc.scan_value('{"a": [1]} x', 1))
    assert.is_nil(tc.scan_value('{"a": "}', 1))
    assert.is_false(tc.scan_value("hello", 1))
    assert.are.equal(7, tc.scan_value('  "\\"a"', 1))
    assert.are.same({ { "name", '"f"' }, { "arguments", '{"b": 1,  "a": 2}' } },
      (tc.members('{"name": "f", "arguments": {"b": 1,  "a": 2}}')))
  end)
end)

describe("tool requests", function()
  local function chat(extra)
    local body = { model = "m", messages = { { role = "user", content = "hi" } } }
    for k, v in pairs(extra) do body[k] = v end
    return openai.parse("chat", json.encode(body))
  end
  local F = { type = "function", ["function"] = { name = "get_weather", parameters = { type = "object" } } }

  it("takes tools, tool_choice and parallel_tool_calls, and tool conversations", function()
    local s = assert(chat({ tools = { F } }))
    assert.are.equal("auto", s.tool_choice)
    assert.is_true(s.parallel_tool_calls)
    assert.are.equal("get_weather", s.tools[1]["function"].name)
    assert.are.equal("none", assert(chat({})).tool_choice)
    assert.are.same({ name = "get_weather" }, assert(chat({ tools = { F }, tool_choice = { type = "function", ["function"] = { name = "get_weather" } },
      parallel_tool_calls = false })).tool_choice)
    s = assert(chat({ tools = { F }, messages = { { role = "user", content = "hi" },
      { role = "assistant", content = json.null, tool_calls = { { id = "call_1", type = "function", ["function"] = { name = "get_weather", arguments = '{"city": "Paris"}' } } } },
      { role = "tool", tool_call_id = "call_1", content = "sunny" } } }))
    assert.are.equal("", s.messages[2].content)
    assert.are.equal('{"city": "Paris"}', s.messages[2].tool_calls[1]["function"].arguments)
    assert.are.equal("call_1", s.messages[3].tool_call_id)
    -- the template sees the arguments as an object, keys in the order written
    local m = tools.template_messages(s.messages)
    assert.are.equal('{"city": "Paris"}', template.tojson(m[2].tool_calls[1].vals["function"].vals.arguments))
  end)

  it("refuses bad tool requests with a 400 naming the field", function()
    local cases = {
      { { tools = { { type = "function", ["function"] = { description = "no name" } } } }, "tools[0].function.name" },
      { { tools = { F, { type = "function", ["function"] = { name = "bad name!" } } } }, "tools[1].function.name" },
      { { tools = { F, F } }, "tools[1].function.name" },
      { { tools = { { type = "retrieval" } } }, "tools[0].type" },
      { { tools = { { type = "function", ["function"] = { name = "f", parameters = "x" } } } }, "tools[0].function.parameters" },
      { { tools = { F }, tool_choice = { type = "function", ["function"] = { name = "nope" } } }, "tool_choice" },
      { { tool_choice = "required" }, "tool_choice" },
      { { tools = { F }, tool_choice = "sometimes" }, "tool_choice" },
      { { tools = { F }, parallel_tool_calls = "yes" }, "parallel_tool_calls" },
      { { messages = { { role = "assistant", content = json.null, tool_calls = { { id = "c", type = "function", ["function"] = { name = "f", arguments = { x = 1 } } } } } } },
        "messages[0].tool_calls[0].function.arguments" },
      { { messages = { { role = "tool", content = "x" } } }, "messages[0].tool_call_id" },
      { { messages = { { role = "assistant", content = json.null } } }, "messages" },
    }
    for _, c in ipairs(cases) do
      local s, e = chat(c[1])
      assert.is_nil(s, c[2])
      assert.are.equal(400, e.status)
      assert.are.equal(c[2], e.param)
    end
  end)

  it("renders tool conversations as transformers does (reference.json), from OpenAI's request shape", function()
    local path, why = T.fixture_path("models/chat-templates/reference.json")
    if not path then pending(why) return end
    local n = require("spec.support.tool_references").check(path)
    assert.is_true(n >= 12, "reference cases with tools: " .. n)
  end)

  it("gives Mistral's template the 9-character call ids it requires, the call and its answer alike", function()
    local s = assert(chat({ tools = { F }, messages = { { role = "user", content = "hi" },
      { role = "assistant", content = json.null, tool_calls = { { id = "call_0123456789abcdef", type = "function", ["function"] = { name = "get_weather", arguments = "{}" } } } },
      { role = "tool", tool_call_id = "call_0123456789abcdef", content = "sunny" } } }))
    local tfile = T.root .. "/models/chat-templates/Mistral-7B-Instruct-v0.3.jinja"
    local mdir = T.tmpdir()
    T.write(mdir .. "/tokenizer_config.json", json.encode({ bos_token = "<s>", eos_token = "</s>" }))
    local out = require("loip.text.chat").apply(mdir, tools.template_messages(s.messages, T.read(tfile)),
      { add_generation_prompt = true, template_file = tfile, tools = s.template_tools })
    assert.matches('"id": "789abcdef"', out, 1, true)
    assert.matches('"call_id": "789abcdef"', out, 1, true)
  end)
end)

-- A small JSON-value grammar in the shape loip.text.grammar's from_schema gives (a start rule
-- `root` and rules of its own), enough to check how a family's grammar is put together.
local function schema_gbnf(schema)
  assert.are.equal("object", schema.type)
  return table.concat({
    'root ::= "{" ws ( pair ( "," ws pair )* )? "}"',
    'pair ::= string ":" ws value',
    'value ::= string | [0-9]+ | root # "root" in a comment stays',
    'string ::= "\\"" [^"\\\\]* "\\"" ws',
    "ws ::= [ \\t\\n]*" }, "\n")
end

-- GBNF's rules: name -> right side; raises on a rule defined twice or used and not defined.
local function rules_of(text)
  local rules = {}
  for line in text:gmatch("[^\n]+") do
    local name, rhs = line:match("^([%w_%-]+) ::= (.*)$")
    assert.is_truthy(name, "a rule per line: " .. line)
    assert.is_nil(rules[name], "defined twice: " .. name)
    rules[name] = rhs
  end
  for name, rhs in pairs(rules) do
    -- literals, classes and comments out (a backslash escapes the next character in the first two)
    local bare, i = {}, 1
    while i <= #rhs do
      local c = rhs:sub(i, i)
      if c == "#" then break end
      if c == '"' or c == "[" then
        local close = c == '"' and '"' or "]"
        i = i + 1
        while rhs:sub(i, i) ~= close do i = i + (rhs:sub(i, i) == "\\" and 2 or 1) end
        bare[#bare + 1] = " "
      else bare[#bare + 1] = c end
      i = i + 1
    end
    bare = table.concat(bare)
    for ref in bare:gmatch("[%a][%w_%-]*") do assert.is_truthy(rules[ref], name .. " uses " .. ref .. ", not defined") end
  end
  return rules
end

describe("tool-call grammars", function()
  local TOOLS = { { type = "function", ["function"] = { name = "get_weather", parameters = { type = "object" } } },
    { type = "function", ["function"] = { name = "get_time" } } }

  it("each family's grammar is GBNF of its own call syntax, one rule set per function", function()
    local starts = { hermes = '"<tool_call>\\n"', qwen = '"<tool_call>\\n"', mistral = '"[TOOL_CALLS]["', llama3 = '""' }
    for fam, open in pairs(starts) do
      local p = policy.load("tools", fam)
      local g = p.grammar({ tools = TOOLS, choice = "required", parallel = true, schema_gbnf = schema_gbnf })
      local rules = rules_of(g)
      assert.are.equal(open, rules.root:match('^"[^"]*"'), fam)
      assert.matches("%)%*", rules.root) -- several calls
      assert.are.equal("tool0-call | tool1-call", rules.call)
      assert.matches('"name\\": \\"get_weather\\", \\"' .. (fam == "llama3" and "parameters" or "arguments"), rules["tool0-call"], 1, true)
      assert.is_truthy(rules["tool0-root"] and rules["tool1-pair"])
      assert.matches('# "root" in a comment stays', rules["tool0-value"], 1, true)
      -- a named function: its rules alone; no parallel calls: one
      g = p.grammar({ tools = TOOLS, choice = { name = "get_time" }, parallel = false, schema_gbnf = schema_gbnf })
      rules = rules_of(g)
      assert.are.equal("tool1-call", rules.call)
      assert.is_nil(rules["tool0-root"])
      assert.not_matches("%)%*", rules.root)
    end
  end)

  it("constrains only required and named choices", function()
    local p = policy.load("tools", "hermes")
    assert.is_nil(tools.grammar({ tools = TOOLS, tool_choice = "auto" }, p, schema_gbnf))
    assert.is_nil(tools.grammar({ tools = TOOLS, tool_choice = "none" }, p, schema_gbnf))
    assert.matches("^root ::=", tools.grammar({ tools = TOOLS, tool_choice = "required", parallel_tool_calls = true }, p, schema_gbnf))
    -- as loip.engine.request.constrain takes a format; a schema the grammar cannot take names its function
    local f = tools.format({ tools = TOOLS, tool_choice = { name = "get_time" }, parallel_tool_calls = false }, p, schema_gbnf)
    assert.are.same({ "gbnf", "tools" }, { f.type, f.param })
    assert.matches("tool1%-call", f.gbnf)
    assert.is_nil(tools.format({ tools = TOOLS, tool_choice = "auto" }, p, schema_gbnf))
    local bad = function(_, where) error(where .. ": 'patternProperties' is not supported", 0) end
    local none, msg, param = tools.format({ tools = TOOLS, tool_choice = "required" }, p, bad)
    assert.is_nil(none)
    assert.are.equal("tools[0].function.parameters", param)
    assert.matches("patternProperties", msg)
  end)
end)
