-- `loip serve` with tools, through the official clients, unchanged (npm "openai" and
-- "@anthropic-ai/sdk", installed by setup): stories260K served with a shipped chat template
-- (Mistral v0.3's, which renders tools and tool conversations) and a tool-call parser of one's
-- own (--tool-parser FILE.lua) that reads what stories260K writes between "bird" and "." as a
-- call, since stories260K writes no call syntax unless constrained. tool_choice "none" and
-- "auto" are accepted; calls come the same streamed (as OpenAI's deltas, Anthropic's events) and
-- not; a conversation carrying tool calls and their results renders and is answered; bad tool
-- requests get a 400 naming the field; /v1/messages answers in Anthropic's shapes (x-api-key).
local json = require "loip.text.json"
local T = require "spec.support"
teardown(function() T.cleanup() end)
after_each(T.stop_servers)

local S260 = T.root .. "/models/stories260K" -- (T.root may be relative: the links are made absolute)

local PARSER = [[
-- tools "story": what stories260K writes between "bird" and "." is a call of get_weather, that
-- text its city (a parser of one's own, for serve_tools_spec)
local tc = require "loip.serve.tool_calls"
local cjson = require "cjson"
local M = { name = "story" }
M.markers = { { open = "bird", close = "." } }
function M.calls(body)
  if body:match("^%s*$") then return nil end
  return { { name = "get_weather", arguments = cjson.encode({ city = body }) } }
end
function M.serves() return true end
function M.parse(text) return tc.parse(M, text) end
function M.stream(opts) return tc.stream(M, opts) end
function M.grammar(req) return tc.gbnf_calls(req, { open = "bird", sep = ".bird", close = "." }) end
return M
]]

-- stories260K in a directory of its own whose tokenizer_config.json gives Mistral v0.3's
-- template and its special tokens; the server on it with the parser above.
local function start()
  local dir = T.tmpdir()
  local from = S260:sub(1, 1) == "/" and S260 or os.getenv("PWD") .. "/" .. S260
  assert(os.execute(string.format("ln -s %s/stories260K.bin %s/model.bin && ln -s %s/tok512.bin %s/tok512.bin", from, dir, from, dir)) == 0)
  T.write(dir .. "/tokenizer_config.json", json.encode({ bos_token = "<s>", eos_token = "</s>",
    chat_template = T.read(T.root .. "/models/chat-templates/Mistral-7B-Instruct-v0.3.jinja") }))
  T.write(dir .. "/story.lua", PARSER)
  return T.serve(string.format("--model %s --served-name stories260K --api-key spec-key --tool-parser %s/story.lua --max-batch 2", dir, dir))
end

describe("loip serve with tools", function()
  it("works with the official OpenAI client: none and auto, calls streamed and not, tool conversations, 400s naming the field", function()
    local missing = T.npm_missing("openai/node_modules/openai")
    if missing then pending(missing) return end
    local url = start()
    local rc, out, err = T.run(string.format("node %s/tests/openai/tools.mjs %s spec-key stories260K", T.root, url))
    assert.are.equal(0, rc, err)
    local r = assert(json.decode(out), out)
    -- none: the text as it is, no calls
    assert.are.equal("length", r.none.finish)
    assert.matches("bird", r.none.content)
    assert.are.same({}, r.none.calls)
    -- auto: the parser's calls, content what is around them, the same streamed
    assert.are.equal("tool_calls", r.auto.finish)
    assert.is_true(#r.auto.calls >= 1)
    for i, c in ipairs(r.auto.calls) do
      assert.matches("^call_%x+$", c.id)
      assert.are.same({ "function", "get_weather" }, { c.type, c.name })
      assert.is_string(json.decode(c.arguments).city)
      local s = r.auto_stream.calls[i]
      assert.are.same({ c.type, c.name, c.arguments }, { s.type, s.name, s.arguments })
    end
    assert.are.equal(#r.auto.calls, #r.auto_stream.calls)
    assert.are.equal(r.auto.content, r.auto_stream.content)
    for _, c in ipairs(r.auto.calls) do -- each call's text is in the plain text, and out of auto's content
      local said = "bird" .. json.decode(c.arguments).city
      assert.matches(said, r.none.content, 1, true)
      assert.not_matches(said, r.auto.content, 1, true)
    end
    assert.are.equal("tool_calls", r.auto_stream.finish)
    assert.are.same(r.auto.usage, r.auto_stream.usage)
    -- the calls and their result sent back: rendered by the template, answered
    assert.is_true(r.answered.usage.prompt_tokens > r.auto.usage.prompt_tokens)
    assert.are.equal(40, r.answered.usage.completion_tokens)
    assert.are.equal(r.answered.content, r.answered_stream.content)
    -- bad tool requests: 400s naming the field
    local want = { no_name = "tools[0].function.name", bad_name = "tools[1].function.name", unknown_choice = "tool_choice",
      required_without_tools = "tool_choice", arguments_object = "messages[1].tool_calls[0].function.arguments",
      tool_without_id = "messages[1].tool_call_id" }
    for k, param in pairs(want) do
      assert.are.same({ 400, param }, { r.errors[k].status, r.errors[k].param }, k)
    end
  end)

  it("answers Anthropic's Messages API (/v1/messages) with the official client: streamed and not, tool_use, tool_result, errors", function()
    local missing = T.npm_missing("anthropic/node_modules/@anthropic-ai/sdk")
    if missing then pending(missing) return end
    local url = start()
    local rc, out, err = T.run(string.format("node %s/tests/anthropic/client.mjs %s spec-key stories260K", T.root, url:gsub("/v1$", "")))
    assert.are.equal(0, rc, err)
    local r = assert(json.decode(out), out)
    assert.matches("^msg_", r.plain.id)
    assert.are.same({ "message", "assistant", "max_tokens", 40 }, { r.plain.type, r.plain.role, r.plain.stop_reason, r.plain.usage.output_tokens })
    assert.are.equal("text", r.plain.content[1].type)
    assert.are.same(r.plain.content, r.plain_stream.content)
    assert.are.same(r.plain.usage, r.plain_stream.usage)
    assert.are.same({ "message_start", "content_block_start" }, { r.events[1], r.events[2] })
    assert.are.same({ "content_block_stop", "message_delta", "message_stop" }, { r.events[#r.events - 2], r.events[#r.events - 1], r.events[#r.events] })
    -- a stop sequence: which one, and the text before it
    assert.are.equal("stop_sequence", r.stopped.stop_reason)
    assert.is_truthy(r.stopped.stop_sequence == "bird" or r.stopped.stop_sequence == "big")
    assert.are.equal(r.plain.content[1].text:sub(1, #r.stopped.content[1].text), r.stopped.content[1].text)
    -- tools: tool_use blocks with their input, in the order they came, the same streamed
    assert.are.equal("tool_use", r.tools.stop_reason)
    local uses = 0
    for i, b in ipairs(r.tools.content) do
      local s = r.tools_stream.content[i]
      assert.are.equal(b.type, s.type)
      if b.type == "tool_use" then
        uses = uses + 1
        assert.matches("^toolu_", b.id)
        assert.are.equal("get_weather", b.name)
        assert.is_string(b.input.city)
        assert.are.same(b.input, s.input)
      else
        assert.are.equal(b.text, s.text)
      end
    end
    assert.is_true(uses >= 1)
    assert.are.equal(#r.tools.content, #r.tools_stream.content)
    -- the tool_use and its tool_result sent back: answered
    assert.are.equal("max_tokens", r.answered.stop_reason)
    assert.is_true(r.answered.usage.input_tokens > r.plain.usage.input_tokens)
    -- errors in Anthropic's shape
    assert.are.same({ 401, "authentication_error" }, { r.errors.bad_key.status, r.errors.bad_key.type })
    assert.are.same({ 400, "invalid_request_error" }, { r.errors.no_max_tokens.status, r.errors.no_max_tokens.type })
    assert.matches("max_tokens", r.errors.no_max_tokens.message)
    assert.are.equal(400, r.errors.unknown_tool.status)
    assert.matches("tool_choice", r.errors.unknown_tool.message)
    assert.are.equal(400, r.errors.tool_without_name.status)
    assert.matches("tools.0.name", r.errors.tool_without_name.message, 1, true)
    assert.are.same({ 404, "not_found_error" }, { r.errors.unknown_model.status, r.errors.unknown_model.type })
  end)
end)
