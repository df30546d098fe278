-- The harmony tools parser (recipes/policies/tools/harmony.lua over loip.serve.harmony): gpt-oss's
-- channels read into reasoning (analysis), calls (to=functions.NAME, the recipient before or after
-- the channel, <|constrain|>json or a bare type) and content (final, a commentary preamble), the
-- same whole and however the text is split, no part of a marker ever shown; the template picks
-- it; an OpenAI request's reasoning_content becomes the template's `thinking` (the render equal to
-- reference-gpt-oss.json's) and its reasoning_effort the template's; its call grammar takes the
-- call syntax and nothing else.
local policy = require "loip.policy"
local openai = require "loip.serve.openai"
local tools = require "loip.serve.tools"
local json = require "loip.text.json"
local template = require "loip.text.template"
local grammar = require "loip.text.grammar"
local T = require "spec.support"
teardown(function() T.cleanup() end)

-- canned outputs (after the prompt's <|start|>assistant): { text, content, reasoning, { { name, arguments } } }
local CASES = {
  { "<|channel|>analysis<|message|>User asks 2+2. Simple.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.",
    "2 + 2 = 4.", "User asks 2+2. Simple.", {} },
  { "<|channel|>final<|message|>Done, with a <b> tag | and <| half a marker.<|return|>", "Done, with a <b> tag | and <| half a marker.", nil, {} },
  { '<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"location": "Tokyo"}',
    nil, "Need the weather.", { { "get_weather", '{"location": "Tokyo"}' } } },
  { ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris", "days": [1, 2]}<|call|>',
    nil, nil, { { "get_weather", '{"city": "Paris", "days": [1, 2]}' } } },
  { '<|channel|>commentary to=functions.get_weather<|constrain|>json<|message|>{"latitude":48.8566,"longitude":2.3522}<|call|>',
    nil, nil, { { "get_weather", '{"latitude":48.8566,"longitude":2.3522}' } } },
  { '<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}',
    "Let me check.", nil, { { "get_time", "{}" } } },
  { "<|channel|>analysis<|message|>First thought. <|end|><|start|>assistant<|channel|>analysis<|message|>Second.<|end|>"
      .. "<|start|>assistant<|channel|>final<|message|>Answer", "Answer", "First thought. Second.", {} },
  -- built-in tools are not answered (llama.cpp's server drops them too)
  { '<|channel|>analysis<|message|>Search.<|end|><|start|>assistant<|channel|>commentary to=browser.search code<|message|>{"query": "x"}<|call|>',
    "", "Search.", {} },
  -- no header: content as it stands; arguments that are not a JSON object: content
  { "Hello there, no channels.", "Hello there, no channels.", nil, {} },
  { '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": ', '{"a":', nil, {} },
  -- cut inside analysis (max_tokens): reasoning so far, no content
  { "<|channel|>analysis<|message|>I am still thin", "", "I am still thin", {} },
}

local function splits(text)
  local out = { { text } }
  local chars = {}
  for i = 1, #text do chars[i] = text:sub(i, i) end
  out[#out + 1] = chars
  for k = 1, #text - 1 do out[#out + 1] = { text:sub(1, k), text:sub(k + 1) } end
  local seed = 11
  for _ = 1, 40 do
    local pieces, i = {}, 1
    while i <= #text do
      seed = (seed * 1103515245 + 12345) % 2147483648
      local n = 1 + seed % 7
      pieces[#pieces + 1] = text:sub(i, i + n - 1)
      i = i + n
    end
    out[#out + 1] = pieces
  end
  return out
end

-- pieces through a stream: content, reasoning, calls { name, arguments }, deltas, and every
-- piece of content and reasoning shown
local function run(p, pieces, opts)
  local st = p.stream(opts or {})
  local text, reasoning, deltas, shown = {}, {}, {}, {}
  local function take(t, d, _, r)
    text[#text + 1], reasoning[#reasoning + 1] = t, r
    if t ~= "" then shown[#shown + 1] = t end
    if r ~= "" then shown[#shown + 1] = r end
    for _, x in ipairs(d) do deltas[#deltas + 1] = x end
  end
  for _, piece in ipairs(pieces) do take(st.put(piece)) end
  take(st.finish())
  local calls = {}
  for i, c in ipairs(st.calls) do calls[i] = { c.name, c.arguments } end
  return table.concat(text), table.concat(reasoning), calls, deltas, shown
end

local MARKERS = { "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>" }

describe("the harmony tools parser", function()
  after_each(function() collectgarbage() collectgarbage() end)
  local p = policy.load("tools", "harmony")

  for _, case in ipairs(CASES) do
    it("reads channels whole and however the text is split: " .. case[1]:sub(1, 50), function()
      local content, calls, reasoning = p.parse(case[1])
      assert.are.equal(case[2], content)
      assert.are.equal(case[3], reasoning)
      assert.are.equal(#case[4], #calls)
      for i, c in ipairs(calls) do
        assert.are.same({ case[4][i][1], case[4][i][2] }, { c["function"].name, c["function"].arguments })
        assert.matches("^call_%x+$", c.id)
      end
      for _, pieces in ipairs(splits(case[1])) do
        local text, r, got, _, shown = run(p, pieces)
        assert.are.equal(case[2] or "", text)
        assert.are.equal(case[3] or "", r)
        assert.are.same(case[4], got)
        for _, s in ipairs(shown) do -- no marker, whole or in part, is ever shown
          for _, m in ipairs(MARKERS) do assert.is_nil(s:find(m, 1, true), s) end
          if not case[1]:find("<b>", 1, true) then assert.is_nil(s:find("<", 1, true), s) end
        end
      end
    end)
  end

  it("streams reasoning and content apart as they come, and a call's deltas when its message ends", function()
    local st = p.stream({})
    local t, d, _, r = st.put("<|channel|>analysis<|message|>Thinking")
    assert.are.same({ "", {}, "Thinking" }, { t, d, r })
    t, d, _, r = st.put(" more<|e")
    assert.are.same({ "", " more" }, { t, r })
    t, d, _, r = st.put("nd|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\":")
    assert.are.same({ "", {}, "" }, { t, d, r })
    t, d, _, r = st.put(" 1}")
    assert.are.same({}, d) -- (the call ends with its message: <|call|> or the end of the output)
    t, d, _, r = st.finish()
    assert.are.equal(2, #d)
    assert.are.same({ index = 0, id = st.calls[1].id, type = "function", ["function"] = { name = "f", arguments = "" } }, d[1])
    assert.are.same({ index = 0, ["function"] = { arguments = '{"a": 1}' } }, d[2])
    assert.are.equal("Hi", (p.stream({}).put("<|channel|>final<|message|>Hi")))
  end)

  it("answers no call when calls are not wanted (tool_choice none), and the first only without parallel calls", function()
    local text = '<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>'
    local c, r, calls = run(p, { text }, { calls = false })
    assert.are.same({ "", "Hm.", {} }, { c, r, calls })
    local two = '<|channel|>commentary to=functions.f json<|message|>{}<|call|><|start|>assistant<|channel|>commentary to=functions.g json<|message|>{}<|call|>'
    local _, _, all = run(p, { two })
    assert.are.same({ { "f", "{}" }, { "g", "{}" } }, all)
    local _, _, one = run(p, { two }, { parallel = false })
    assert.are.same({ { "f", "{}" } }, one)
  end)

  it("is the parser of gpt-oss's template, and of no other shipped template", function()
    local dir = T.root .. "/models/chat-templates/"
    assert.are.equal("harmony", tools.parser(nil, T.read(dir .. "gpt-oss-120b.jinja")).name)
    assert.is_true(tools.parser(nil, T.read(dir .. "gpt-oss-120b.jinja")).channels)
    for _, name in ipairs({ "Llama-3.1-8B-Instruct", "Qwen3-8B", "Mistral-7B-Instruct-v0.3", "gemma-2-2b-it", "Phi-3-mini-4k-instruct" }) do
      assert.are_not.equal("harmony", tools.parser(nil, T.read(dir .. name .. ".jinja")).name, name)
    end
  end)

  it("renders an OpenAI request's reasoning_content as the template's thinking (reference-gpt-oss.json)", function()
    local path, why = T.fixture_path("models/chat-templates/reference-gpt-oss.json")
    if not path then pending(why) return end
    local dir = path:match("^(.*)/[^/]*$")
    local n = require("spec.support.tool_references").check(path, { reasoning = true })
    assert.are.equal(7, n)
    -- a client that sends the analysis beside content in a call's message: the content goes
    local s = assert(openai.parse("chat", json.encode({ model = "m", messages = {
      { role = "user", content = "Weather?" },
      { role = "assistant", content = "Checking.", reasoning_content = "Need it.", tool_calls = {
        { id = "c1", type = "function", ["function"] = { name = "get_weather", arguments = "{}" } } } } } })))
    local m = tools.template_messages(s.messages, T.read(dir .. "/gpt-oss-120b.jinja"))[2]
    assert.are.same({ "", "Need it." }, { m.content, m.thinking })
    -- reasoning_effort is the template's variable of that name
    local e = assert(openai.parse("chat", json.encode({ model = "m", reasoning_effort = "high", messages = { { role = "user", content = "Hi" } } })))
    local mdir = T.tmpdir()
    T.write(mdir .. "/tokenizer_config.json", "{}")
    assert.matches("\nReasoning: high\n", require("loip.text.chat").apply(mdir, e.messages,
      { add_generation_prompt = true, template_file = dir .. "/gpt-oss-120b.jinja", vars = e.template_vars }))
    local _, eerr = openai.parse("chat", json.encode({ model = "m", reasoning_effort = "max", messages = { { role = "user", content = "Hi" } } }))
    assert.are.same({ 400, "reasoning_effort" }, { eerr.status, eerr.param })
    -- reasoning_content must be a string
    local _, err = openai.parse("chat", json.encode({ model = "m", messages = { { role = "assistant", content = "x", reasoning_content = 3 } } }))
    assert.are.same({ 400, "messages[0].reasoning_content" }, { err.status, err.param })
  end)

  it("constrains required and named calls to the harmony call syntax (GBNF), an analysis allowed first", function()
    local F = { { type = "function", ["function"] = { name = "get_weather", parameters = { type = "object",
      properties = { city = { type = "string" } }, required = { "city" } } } },
      { type = "function", ["function"] = { name = "get_time" } } }
    local g = tools.grammar({ tools = F, tool_choice = "required", parallel_tool_calls = true }, p)
    local bytes = {}
    for b = 0, 255 do bytes[b + 1] = string.char(b) end
    local vocab = grammar.vocab_of(bytes, {})
    local compiled = grammar.compile(g, "tools")
    local function accepts(s)
      local m = compiled:matcher(vocab)
      for i = 1, #s do
        if not m:accept(s:byte(i)) then return false end
      end
      return m:can_end()
    end
    assert.is_true(accepts('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'))
    assert.is_true(accepts('<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant'
      .. '<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}'))
    assert.is_false(accepts("<|channel|>final<|message|>Sunny."))
    assert.is_false(accepts('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"town": "Paris"}'))
    local named = tools.grammar({ tools = F, tool_choice = { name = "get_time" } }, p)
    assert.is_nil(named:find("get_weather", 1, true))
    assert.is_nil(tools.grammar({ tools = F, tool_choice = "auto" }, p))
  end)
end)
