-- Anthropic's Messages API shapes (loip.serve.anthropic): requests into the server's spec (the
-- conversation in OpenAI's shape), the message object, the streamed events and the errors.
local anthropic = require "loip.serve.anthropic"
local json = require "loip.text.json"

local function parse(body)
  local base = { model = "m", max_tokens = 16, messages = { { role = "user", content = "hi" } } }
  for k, v in pairs(body) do base[k] = v end
  return anthropic.parse("messages", json.encode(base))
end

-- the events of a stream: their names and data
local function events(text)
  local out = {}
  for name, data in text:gmatch("event: (%S+)\ndata: ([^\n]*)\n\n") do
    local d = json.decode(data)
    assert.are.equal(name, d.type)
    out[#out + 1] = d
  end
  return out
end

describe("loip.serve.anthropic", function()
  it("turns a Messages request into the server's spec: system, blocks, tool_use and tool_result, tools, tool_choice", function()
    local s = assert(parse({ system = { { type = "text", text = "Be " }, { type = "text", text = "brief." } },
      stop_sequences = { "END" }, temperature = 0.5, top_k = 4, stream = true, metadata = { user_id = "u" },
      tools = { { name = "get_weather", description = "d", input_schema = { type = "object" } } },
      tool_choice = { type = "any", disable_parallel_tool_use = true },
      messages = { { role = "user", content = "weather?" },
        { role = "assistant", content = { { type = "thinking", thinking = "hm", signature = "s" }, { type = "text", text = "Looking." }, { type = "tool_use", id = "toolu_1", name = "get_weather", input = { city = "Paris" } } } },
        { role = "user", content = { { type = "tool_result", tool_use_id = "toolu_1", content = { { type = "text", text = "sunny" } } } } } } }))
    assert.are.equal("chat", s.kind)
    assert.are.same({ role = "system", content = "Be brief." }, s.messages[1])
    assert.are.same({ role = "user", content = "weather?" }, s.messages[2])
    assert.are.equal("Looking.", s.messages[3].content)
    assert.are.same({ name = "get_weather", arguments = '{"city":"Paris"}' }, s.messages[3].tool_calls[1]["function"])
    assert.are.same({ role = "tool", tool_call_id = "toolu_1", content = "sunny" }, s.messages[4])
    assert.are.same({ "END" }, s.stop)
    assert.are.same({ 0.5, 4, 16, true }, { s.sampler.temperature, s.sampler.top_k, s.max_tokens, s.stream })
    assert.are.equal("required", s.tool_choice)
    assert.is_false(s.parallel_tool_calls)
    assert.are.equal("get_weather", s.tools[1]["function"].name)
    assert.are.same({ name = "get_weather" }, assert(parse({ tools = { { name = "get_weather" } }, tool_choice = { type = "tool", name = "get_weather" } })).tool_choice)
    assert.are.equal("none", assert(parse({ tools = { { name = "get_weather" } }, tool_choice = { type = "none" } })).tool_choice)
  end)

  it("refuses bad requests naming the field, in Anthropic's error shape", function()
    local cases = {
      { { max_tokens = json.null }, "max_tokens" },
      { { temperature = 1.5 }, "temperature" },
      { { prompt = "x" }, "prompt" },
      { { messages = { { role = "user", content = { { type = "image", source = {} } } } } }, "messages.0.content.0" },
      { { messages = { { role = "system", content = "x" } } }, "messages.0.role" },
      { { tools = { { description = "no name" } } }, "tools.0.name" },
      { { tools = { { name = "f", input_schema = "x" } } }, "tools.0.input_schema" },
      { { tools = { { name = "f" } }, tool_choice = { type = "tool", name = "g" } }, "tool_choice" },
      { { tool_choice = { type = "sometimes" } }, "tool_choice.type" },
    }
    for _, c in ipairs(cases) do
      local s, e = parse(c[1])
      assert.is_nil(s, c[2])
      assert.are.equal(400, e.status)
      assert.are.equal(c[2], e.param)
      local st, body = anthropic.error(e.status, e.message, nil, e.param)
      assert.are.equal(400, st)
      local b = json.decode(body)
      assert.are.equal("error", b.type)
      assert.are.equal("invalid_request_error", b.error.type)
      assert.matches(c[2], b.error.message, 1, true)
    end
    assert.are.equal("not_found_error", json.decode(select(2, anthropic.error(404, "no such model"))).error.type)
    assert.are.equal("overloaded_error", json.decode(select(2, anthropic.error(503, "stopping"))).error.type)
  end)

  it("answers with the message object: blocks in the order they came, stop reasons, usage", function()
    local calls = { { id = "toolu_a", type = "function", ["function"] = { name = "f", arguments = '{"x": 1}' } } }
    local m = json.decode(anthropic.response("messages", { id = "msg_1", model = "m", text = "Hi then", finish_reason = "tool_calls",
      usage = { prompt_tokens = 5, completion_tokens = 3 }, tool_calls = calls, order = { "Hi", 0, " then" } }))
    assert.are.same({ "message", "assistant", "tool_use", 5, 3 }, { m.type, m.role, m.stop_reason, m.usage.input_tokens, m.usage.output_tokens })
    assert.are.same({ { type = "text", text = "Hi" }, { type = "tool_use", id = "toolu_a", name = "f", input = { x = 1 } },
      { type = "text", text = " then" } }, m.content)
    m = json.decode(anthropic.response("messages", { id = "msg_2", model = "m", text = "a", finish_reason = "stop", stop_sequence = "END",
      usage = { prompt_tokens = 1, completion_tokens = 1 } }))
    assert.are.same({ "stop_sequence", "END" }, { m.stop_reason, m.stop_sequence })
    m = json.decode(anthropic.response("messages", { id = "msg_3", model = "m", text = "", finish_reason = "length",
      usage = { prompt_tokens = 1, completion_tokens = 1 } }))
    assert.are.same({ "max_tokens", {} }, { m.stop_reason, m.content })
    assert.are.equal("end_turn", json.decode(anthropic.response("messages", { id = "x", model = "m", text = "a", finish_reason = "stop",
      usage = { prompt_tokens = 1, completion_tokens = 1 } })).stop_reason)
  end)

  it("streams Anthropic's events: message_start and ping, text and tool_use blocks, message_delta, message_stop", function()
    local a = { id = "msg_1", model = "m", n_prompt = 7, first_chunk = true }
    local ev = events(anthropic.chunk("messages", a, "", nil))
    a.first_chunk = false
    assert.are.same({ "message_start", "ping" }, { ev[1].type, ev[2].type })
    assert.are.same({ 7, "msg_1" }, { ev[1].message.usage.input_tokens, ev[1].message.id })
    local deltas = { { index = 0, id = "toolu_a", type = "function", ["function"] = { name = "f", arguments = "" } },
      { index = 0, ["function"] = { arguments = '{"x": 1}' } } }
    ev = events(anthropic.chunk("messages", a, "Hi then", nil, nil, deltas, { "Hi", 0, " then" }))
    local kinds = {}
    for i, e in ipairs(ev) do kinds[i] = e.type .. ":" .. (e.index or "") end
    assert.are.same({ "content_block_start:0", "content_block_delta:0", "content_block_stop:0", "content_block_start:1",
      "content_block_delta:1", "content_block_stop:1", "content_block_start:2", "content_block_delta:2" }, kinds)
    assert.are.same({ type = "tool_use", id = "toolu_a", name = "f", input = {} }, ev[4].content_block)
    assert.are.same({ type = "input_json_delta", partial_json = '{"x": 1}' }, ev[5].delta)
    assert.are.same({ type = "text_delta", text = " then" }, ev[8].delta)
    a.usage = { completion_tokens = 4 }
    ev = events(anthropic.chunk("messages", a, nil, "tool_calls"))
    assert.are.same({ "content_block_stop", "message_delta", "message_stop" }, { ev[1].type, ev[2].type, ev[3].type })
    assert.are.same({ "tool_use", 4 }, { ev[2].delta.stop_reason, ev[2].usage.output_tokens })
  end)
end)
