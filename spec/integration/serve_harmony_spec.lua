-- `loip serve` with gpt-oss's chat template (harmony), through the official OpenAI npm client
-- (tests/openai/harmony.mjs): the harmony parser, picked from the template, answers a tool call
-- and a final answer, streamed and not, with the analysis channel as reasoning_content apart
-- from content, and never a piece of a marker in what it streams. stories260K writes the
-- harmony text under a grammar (llama.cpp's `grammar` field), so the output is known; its
-- tokens are short, so each marker comes in several pieces. (--context 1024: gpt-oss's system
-- message and tools take ~400 of stories260K's tokens; past its 512 positions its answers mean
-- nothing, but the grammar writes them.) Then the same with gpt-oss's own tokenizer: a
-- random-weight gpt-oss-20b shape (`loip synth --tokenizer`) with OpenAI's whole o200k_base as
-- o200k_harmony, where a marker is one token or several, as the model picks, and <|return|> and
-- <|call|> end a generation.
local json = require "loip.text.json"
local T = require "spec.support"
teardown(function() T.cleanup() end)
after_each(T.stop_servers)

local S260 = T.root .. "/models/stories260K"

-- The harmony client's answers from a server started with args (the model named model).
local function ask(args, model)
  local url, stop, errlog = T.serve(string.format("%s --chat-template %s/models/chat-templates/gpt-oss-120b.jinja "
    .. "--context 1024 --max-batch 2 --api-key spec-key", args, T.root))
  local rc, out, err = T.run(string.format("node %s/tests/openai/harmony.mjs %s spec-key %s", T.root, url, model))
  stop()
  assert.are.equal(0, rc, err .. T.read_or_empty(errlog))
  return assert(json.decode(out), out)
end

-- What every model must answer under the grammars harmony.mjs sends.
local function check(r)
  -- the call: its analysis as reasoning_content, no content, the call with its arguments
  for _, c in ipairs({ r.call, r.call_stream }) do
    assert.are.equal("tool_calls", c.finish)
    assert.are.equal("Weather: call it.", c.reasoning)
    assert.is_true(c.content == json.null or c.content == "", tostring(c.content))
    assert.are.equal(1, #c.calls)
    assert.are.same({ "function", "get_weather", '{"city": "Paris"}' }, { c.calls[1].type, c.calls[1].name, c.calls[1].arguments })
    assert.matches("^call_%x+$", c.calls[1].id)
  end
  -- the answer after the call's result (rendered with the call and its reasoning), and a chat
  -- without tools: the final channel as content, the analysis apart
  for _, c in ipairs({ r.final, r.final_stream, r.plain, r.plain_stream, r.high }) do
    assert.are.equal("stop", c.finish)
    assert.are.equal("Sunny in Paris.", c.content)
    assert.are.equal("It said sunny.", c.reasoning)
    assert.are.same({}, c.calls)
  end
  assert.is_true(r.final.usage.prompt_tokens > r.call_usage.prompt_tokens)
  -- streamed: reasoning deltas first, then content (or the call), never a marker or part of one
  for _, s in ipairs({ r.call_stream, r.final_stream, r.plain_stream }) do
    assert.is_true(#s.pieces >= 2)
    assert.are.equal("reasoning", s.kinds[1])
    for _, piece in ipairs(s.pieces) do
      assert.is_nil(piece:find("[<|>]"), piece)
    end
  end
  assert.are.equal("call", r.call_stream.kinds[#r.call_stream.kinds])
  assert.are.equal("content", r.final_stream.kinds[#r.final_stream.kinds])
end

describe("loip serve with the harmony format", function()
  it("answers a tool call and a final answer, reasoning_content apart, streamed and not (official OpenAI client)", function()
    local missing = T.npm_missing("openai/node_modules/openai")
    if missing then pending(missing) return end
    local r = ask("--model " .. S260, "stories260K")
    check(r)
    -- reasoning_effort reaches the template ("Reasoning: high" is not "Reasoning: medium": in
    -- stories260K's tokens they differ in length; in o200k's, " high" and " medium" are one each)
    assert.are_not.equal(r.plain.usage.prompt_tokens, r.high.usage.prompt_tokens)
  end)

  it("does so with gpt-oss's own tokenizer, o200k_harmony (a random-weight gpt-oss-20b shape)", function()
    local missing = T.npm_missing("openai/node_modules/openai")
    if missing then pending(missing) return end
    local dir, why = require("spec.support.o200k").synth_gpt_oss()
    if not dir then pending(why) return end
    local r = ask("--model " .. dir .. "/hf", "hf")
    check(r)
    -- the prompts, counted as o200k_harmony cuts gpt-oss's template rendered here (Reasoning:
    -- medium and high, " medium" and " high" one token each)
    local tok = require("loip.text.tokenizer").open(dir .. "/hf")
    for what, effort in pairs({ plain = "medium", high = "high" }) do
      local text = require("loip.text.chat").apply(dir .. "/hf", { { role = "user", content = "Weather?" } }, { add_generation_prompt = true,
        template_file = T.root .. "/models/chat-templates/gpt-oss-120b.jinja", vars = { reasoning_effort = effort } })
      assert.matches("Reasoning: " .. effort, text)
      assert.are.equal(#tok:encode(text, { bos = false }), r[what].usage.prompt_tokens, what)
    end
    tok:close()
  end)
end)
