-- gpt-oss's chat template (models/chat-templates/gpt-oss-120b.jinja, OpenAI's harmony format)
-- rendered by loip.template: every case of models/chat-templates/reference-gpt-oss.json, whose
-- expected strings jinja2 3.1.6 rendered in transformers' environment (the README says how),
-- then the harmony format itself as OpenAI's renderer writes it (openai/harmony's test-data,
-- three of its files compared byte for byte): the
-- system message with "Reasoning:" and "# Valid channels", the developer message with the
-- tools as a TypeScript-like namespace, the calls on the commentary channel.
local template = require "loip.text.template"
local T = require "spec.support"

local PINNED_NOW = os.time({ year = 2024, month = 7, day = 26, hour = 0, min = 0, sec = 0 })

local function render_case(dir, c, compiled)
  compiled[c.template] = compiled[c.template] or assert(template.compile(T.read(dir .. "/" .. c.template .. ".jinja")))
  local vars = { messages = c.messages, tools = c.tools or template.null, documents = template.null,
    add_generation_prompt = c.add_generation_prompt, bos_token = c.bos_token, eos_token = c.eos_token }
  for _, k in ipairs(c.extra_kwargs.keys) do vars[k] = c.extra_kwargs.vals[k] end
  return compiled[c.template]:render(vars, { now = PINNED_NOW })
end

describe("template: gpt-oss (harmony) reference renderings", function()
  after_each(function() collectgarbage() collectgarbage() end)

  local path, why = T.fixture_path("models/chat-templates/reference-gpt-oss.json")
  if not path then
    it("renders the gpt-oss reference cases", function() pending(why) end)
    return
  end
  local dir = path:match("^(.*)/[^/]*$")
  local cases = assert(template.ordered_decode(T.read(path)))
  local compiled = {}

  it("has all 26 cases", function() assert.equals(26, #cases) end)

  for _, case in ipairs(cases) do
    local c = case.vals
    it(("%s %s add_generation_prompt=%s"):format(c.template, c.case, tostring(c.add_generation_prompt)), function()
      local out, err = render_case(dir, c, compiled)
      if c.expected ~= nil then
        assert.equals(c.expected, out, err)
      else
        assert.is_nil(out)
        assert.equals(c.error, err)
      end
    end)
  end
end)

describe("template: the harmony format", function()
  local dir = T.root .. "/models/chat-templates"
  local compiled = {}
  local function render(messages, tools, extra, agp)
    local c = { template = "gpt-oss-120b", messages = messages, tools = tools, add_generation_prompt = agp ~= false,
      extra_kwargs = { keys = {}, vals = {} }, bos_token = "<|startoftext|>", eos_token = "<|return|>" }
    for k, v in pairs(extra or {}) do
      c.extra_kwargs.keys[#c.extra_kwargs.keys + 1] = k
      c.extra_kwargs.vals[k] = v
    end
    return assert(render_case(dir, c, compiled))
  end
  -- the system message as openai/harmony's test-data writes it (its date and effort given here)
  local function system(effort, with_tools)
    return "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
      .. "Knowledge cutoff: 2024-06\nCurrent date: 2024-07-26\n\nReasoning: " .. effort .. "\n\n"
      .. "# Valid channels: analysis, commentary, final. Channel must be included for every message."
      .. (with_tools and "\nCalls to these tools must go to the commentary channel: 'functions'." or "") .. "<|end|>"
  end

  it("writes the system message, the user turn and the assistant's start", function()
    assert.equals(system("medium") .. "<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant",
      render({ { role = "user", content = "What is 2 + 2?" } }))
    assert.equals(system("high") .. "<|start|>user<|message|>Hi<|end|><|start|>assistant",
      render({ { role = "user", content = "Hi" } }, nil, { reasoning_effort = "high" }))
  end)

  it("puts the system prompt in a developer message under # Instructions", function()
    assert.equals(system("medium") .. "<|start|>developer<|message|># Instructions\n\nAnswer like a robot.\n\n<|end|>"
      .. "<|start|>user<|message|>Hi<|end|><|start|>assistant",
      render({ { role = "system", content = "Answer like a robot." }, { role = "user", content = "Hi" } }))
  end)

  it("renders tools as a TypeScript namespace of functions and calls on the commentary channel", function()
    local tools = template.ordered_decode([[ [
      {"type": "function", "function": {"name": "get_location", "description": "Gets the location of the user."}},
      {"type": "function", "function": {"name": "get_weather", "description": "The weather.", "parameters": {"type": "object",
        "properties": {"city": {"type": "string", "description": "A city"}, "days": {"type": "integer"}}, "required": ["city"]}}}] ]])
    local call = template.ordered_decode([[ {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
      "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]} ]])
    local out = render({ { role = "user", content = "Weather?" }, call, { role = "tool", tool_call_id = "c1", content = "sunny" } }, tools)
    assert.equals(system("medium", true) .. "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n"
      .. "// Gets the location of the user.\ntype get_location = () => any;\n\n"
      .. "// The weather.\ntype get_weather = (_: {\n// A city\ncity: string,\ndays?: number,\n}) => any;\n\n"
      .. "} // namespace functions<|end|><|start|>user<|message|>Weather?<|end|>"
      .. "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>"
      .. "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"sunny\"<|end|><|start|>assistant", out)
  end)

  it("writes the system and developer messages as OpenAI's own renderer does (openai/harmony's test-data)", function()
    -- harmony's render_conversation_for_completion of a system message with a date and its
    -- built-in tools (and a developer message with a function), byte for byte (each file ends
    -- with a newline the renderer does not write)
    local lookup = template.ordered_decode([[ [{"type": "function", "function": {"name": "lookup_weather",
      "description": "Use this tool to lookup the weather in a given location. Call it with the parameter 'location', can be any textual description of a location.",
      "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}}] ]])
    local cases = { { "test_browser_and_function_tool", { "browser" }, lookup }, { "test_browser_and_python_tool", { "browser", "python" } },
      { "test_browser_tool_only", { "browser" } } }
    local june28 = os.time({ year = 2025, month = 6, day = 28, hour = 0, min = 0, sec = 0 })
    local t = assert(template.compile(T.read(dir .. "/gpt-oss-120b.jinja")))
    for _, c in ipairs(cases) do
      local want = T.read(dir .. "/harmony-test-data/" .. c[1] .. ".txt"):gsub("\n$", "")
      local out, err = t:render({ messages = { { role = "developer", content = "" } }, tools = c[3] or template.null,
        documents = template.null, add_generation_prompt = true, builtin_tools = c[2] }, { now = june28 })
      assert.are.equal(want, out, err)
    end
  end)

  it("keeps the analysis of a turn that ends with <|return|> only in training form", function()
    local m = { { role = "user", content = "2+2?" }, { role = "assistant", content = "4", thinking = "Sum." } }
    assert.equals(system("medium") .. "<|start|>user<|message|>2+2?<|end|><|start|>assistant<|channel|>analysis<|message|>Sum.<|end|>"
      .. "<|start|>assistant<|channel|>final<|message|>4<|return|>", render(m, nil, nil, false))
    m[3] = { role = "user", content = "3+3?" }
    assert.equals(system("medium") .. "<|start|>user<|message|>2+2?<|end|><|start|>assistant<|channel|>final<|message|>4<|end|>"
      .. "<|start|>user<|message|>3+3?<|end|><|start|>assistant", render(m))
  end)
end)
