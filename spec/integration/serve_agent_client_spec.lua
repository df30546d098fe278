-- The official OpenAI npm client against `loip serve` for what agents use (tests/openai/agent.mjs):
-- chat.completions.parse with a zod schema returns an object valid against it for every request,
-- greedy and sampled; tool calls under tool_choice "required" and a named function have arguments
-- valid against their function's schema, streamed (the client's stream helper assembles the
-- deltas) and not; n = 3 gives three equal choices at temperature 0 and three valid ones at 0.8.
-- stories260K obeys any schema: its tokens are sampled under the schema's grammar.
local json = require "loip.text.json"
local T = require "spec.support"
teardown(function() T.cleanup() end)
after_each(T.stop_servers)

local S260 = T.root .. "/models/stories260K"

describe("the OpenAI client's structured outputs and tool calls", function()
  it("parses every answer with its zod schema, calls tools with valid arguments, and gives n choices", function()
    local node_modules = T.root .. "/tests/openai/node_modules"
    assert(os.execute("node --version > /dev/null 2>&1") == 0, "node is installed (recipes/setup-debian.sh)")
    assert(T.exists(node_modules .. "/openai/package.json") and T.exists(node_modules .. "/zod/package.json"),
      "the openai and zod npm packages are installed (recipes/setup-debian.sh)")
    -- a compact template in Qwen2.5's tool-calling convention, parsed by the qwen tools parser
    local url, stop, errlog = T.serve(string.format("--model %s --chat-template %s/tests/openai/tools-compact.jinja "
      .. "--tool-parser qwen --context 512 --max-batch 3 --api-key spec-key", S260, T.root))
    local rc, out, err = T.run(string.format("node %s/tests/openai/agent.mjs %s spec-key stories260K", T.root, url))
    stop()
    assert.are.equal(0, rc, err)
    local r = assert(json.decode(out), out)
    assert.are.same({}, r.errors, T.read_or_empty(errlog))
    assert.are.equal(6, #r.parsed)
    for i, p in ipairs(r.parsed) do
      assert.is_true(p.valid, string.format("answer %d: %s", i, p.content))
      assert.are.equal("stop", p.finish)
    end
    for _, set in ipairs({ r.tools, r.tools_stream, { r.named } }) do
      for _, t in ipairs(set) do
        assert.are.equal("tool_calls", t.finish)
        assert.is_true(#t.calls >= 1)
        for _, c in ipairs(t.calls) do
          assert.is_true(c.valid, json.encode(c))
          assert.matches("^call_", c.id)
        end
      end
    end
    assert.are.equal(3, #r.tools)
    assert.are.equal(2, #r.tools_stream)
    for _, c in ipairs(r.named.calls) do assert.are.equal("set_alarm", c.name) end
    assert.are.equal(3, #r.n_greedy)
    for i, c in ipairs(r.n_greedy) do
      assert.are.equal(i - 1, c.index)
      assert.is_true(c.valid)
      assert.are.equal(r.n_greedy[1].content, c.content)
    end
    assert.are.equal(3, #r.n_sampled)
    for _, c in ipairs(r.n_sampled) do assert.is_true(c.valid, c.content) end
  end)
end)
