-- Every JSON loip writes is well-formed UTF-8 (issue 36, item 5): a grammar of multi-byte
-- literals makes stories260K emit a character a byte a token (llama2.c's byte pieces); its
-- completions, whole and streamed, carry whole characters only (a character cut by max_tokens
-- is U+FFFD), stop strings still stop, chat's logprobs keep each token's bytes. A tiny synthetic
-- mixture of experts whose greedy tokens are ill-formed bytes: `loip generate --json` and the
-- Anthropic API (whole and streamed) write U+FFFD for them, with the token ids unchanged.
local json = require "loip.text.json"
local client = require "loip.runtime.http_client"
local valid = require("loip.text.tokenizers.decoder").valid -- (a checker apart from loip.text.utf8's)
local T = require "spec.support"
teardown(function() T.cleanup() end)
after_each(T.stop_servers)

local S260 = T.root .. "/models/stories260K"
local R = "\239\191\189" -- U+FFFD
local WORLD = 'root ::= "世界"'

local function post(cl, url, body, headers)
  local t = cl:post(url, json.encode(body), headers)
  cl:wait(60000)
  assert(valid(t.body), "the body is ill-formed UTF-8: " .. t.body)
  return t.status, assert(json.decode(t.body), t.body)
end

-- A streamed request: its events' JSON, each checked well-formed.
local function stream(cl, url, body, headers)
  body.stream = true
  local t = cl:post(url, json.encode(body), headers)
  local events = {}
  t.on_event = function(_, data)
    assert(valid(data), "an event is ill-formed UTF-8: " .. data)
    if data ~= "[DONE]" then events[#events + 1] = assert(json.decode(data), data) end
  end
  cl:wait(60000)
  assert.are.equal(200, t.status)
  return events
end

-- (bare: the messages' text alone, as a completion's prompt)
local chat_template = T.chat_template

describe("well-formed UTF-8 from loip serve, with a grammar of multi-byte literals", function()
  it("whole characters in completions, streamed and not; U+FFFD for one cut short; stop strings; logprobs' bytes", function()
    local url, stop = T.serve(string.format("--model %s --chat-template %s", S260, chat_template(T.tmpdir())))
    local cl = client.new()
    local base = { model = "stories260K", prompt = "Once", temperature = 0, grammar = WORLD }
    local function with(t) local b = {} for k, v in pairs(base) do b[k] = v end for k, v in pairs(t) do b[k] = v end return b end
    -- one token, two: a character's first bytes, given as one U+FFFD; the ids still counted
    for n = 1, 2 do
      local st, r = post(cl, url .. "/completions", with({ max_tokens = n }))
      assert.are.equal(200, st)
      assert.are.same({ R, "length", n }, { r.choices[1].text, r.choices[1].finish_reason, r.usage.completion_tokens })
    end
    local st, r = post(cl, url .. "/completions", with({ max_tokens = 10 }))
    assert.are.same({ 200, "世界", "stop", 6 }, { st, r.choices[1].text, r.choices[1].finish_reason, r.usage.completion_tokens })
    -- streamed: a chunk a whole character
    local texts = {}
    for _, e in ipairs(stream(cl, url .. "/completions", with({ max_tokens = 10 }))) do
      if e.choices[1] and e.choices[1].text ~= "" then texts[#texts + 1] = e.choices[1].text end
    end
    assert.are.same({ "世", "界" }, texts)
    texts = {}
    for _, e in ipairs(stream(cl, url .. "/completions", with({ max_tokens = 4 }))) do
      if e.choices[1] and e.choices[1].text ~= "" then texts[#texts + 1] = e.choices[1].text end
    end
    assert.are.same({ "世", R }, texts)
    -- a stop string after a character held back over tokens
    st, r = post(cl, url .. "/completions", with({ max_tokens = 10, stop = { "界" } }))
    assert.are.same({ 200, "世", "stop" }, { st, r.choices[1].text, r.choices[1].finish_reason })
    -- chat: logprobs keep each token's bytes, which make the text
    st, r = post(cl, url .. "/chat/completions", { model = "stories260K", messages = { { role = "user", content = "Hi" } },
      temperature = 0, max_tokens = 10, grammar = WORLD, logprobs = true, top_logprobs = 1 })
    assert.are.same({ 200, "世界" }, { st, r.choices[1].message.content })
    local bytes = {}
    for _, lp in ipairs(r.choices[1].logprobs.content) do
      assert.are.equal(1, #lp.bytes)
      assert.matches("^bytes:\\x%x%x$", lp.token)
      bytes[#bytes + 1] = string.char(lp.bytes[1])
    end
    assert.are.equal("世界", table.concat(bytes))
    cl:close()
    stop()
  end)
end)

describe("well-formed UTF-8 from a mixture of experts whose tokens are ill-formed bytes", function()
  local dir, tokens
  setup(function()
    dir = T.tmpdir()
    local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth --like qwen3-30b-a3b --dtype f32 --layers 1 --dim 32 "
      .. "--heads 2 --kv-heads 2 --ffn 16 --experts 4 --experts-per-token 2 --vocab 512 --seed 5 --std 0.3 %s/moe", T.loip, dir))
    assert.are.equal(0, rc, err)
  end)

  it("loip generate --json: U+FFFD in the text, the token ids exact", function()
    local rc, out, err = T.run(string.format("%s generate --model %s/moe --threads 1 --temperature 0 --prompt 'Once upon a time' "
      .. "--max-tokens 24 --json", T.loip, dir))
    assert.are.equal(0, rc, err)
    assert(valid(out), "--json wrote ill-formed UTF-8: " .. out)
    local r = assert(json.decode(out), out)
    tokens = r.token_ids
    assert.are.equal(24, #tokens)
    -- the tokens' own bytes are ill-formed (so this model tests what it means to)
    local tok = require("loip.text.tokenizer").open(dir .. "/moe")
    local prev, raw = r.prompt_ids[#r.prompt_ids], {}
    for i, id in ipairs(tokens) do raw[i] = tok:piece_text(prev, id) prev = id end
    raw = table.concat(raw)
    assert.is_false(valid(raw))
    assert.truthy(r.text:find(R, 1, true))
    assert.are.equal(require("loip.text.utf8").sanitize(raw), r.text)
  end)

  it("Anthropic's Messages API and chat completions, streamed and not", function()
    local url, stop = T.serve(string.format("--model %s/moe --chat-template %s --threads 1", dir, chat_template(T.tmpdir(), true)))
    local cl = client.new()
    local body = { model = "moe", messages = { { role = "user", content = "Once upon a time" } }, max_tokens = 16, temperature = 0 }
    local st, r = post(cl, url .. "/messages", body)
    assert.are.equal(200, st)
    local text = r.content[1].text
    local streamed = {}
    for _, e in ipairs(stream(cl, url .. "/messages", body)) do
      if e.delta and e.delta.text then streamed[#streamed + 1] = e.delta.text end
    end
    assert.are.equal(text, table.concat(streamed))
    body.stream = nil
    st, r = post(cl, url .. "/chat/completions", body)
    assert.are.same({ 200, text }, { st, r.choices[1].message.content })
    streamed = {}
    for _, e in ipairs(stream(cl, url .. "/chat/completions", body)) do
      if e.choices[1] and e.choices[1].delta.content then streamed[#streamed + 1] = e.choices[1].delta.content end
    end
    assert.are.equal(text, table.concat(streamed))
    assert.truthy(text:find(R, 1, true), "the model gave ill-formed bytes: " .. text)
    cl:close()
    stop()
  end)
end)
