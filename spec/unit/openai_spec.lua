-- The OpenAI request checks and the stop-string filter of loip serve (loip.serve.openai).
local openai = require "loip.serve.openai"
local json = require "loip.text.json"

describe("loip.serve.openai", function()
  it("parses a chat request into what the batcher needs, with OpenAI's defaults", function()
    local s = assert(openai.parse("chat", json.encode({ model = "m", messages = { { role = "developer", content = "be brief" },
      { role = "user", content = { { type = "text", text = "hi " }, { type = "text", text = "there" } } } },
      max_completion_tokens = 7, stop = "\n", stream = true, stream_options = { include_usage = true } })))
    assert.are.same({ { role = "system", content = "be brief" }, { role = "user", content = "hi there" } }, s.messages)
    assert.are.equal(7, s.max_tokens)
    assert.are.same({ "\n" }, s.stop)
    assert.is_true(s.stream and s.include_usage)
    assert.are.equal(1, s.sampler.temperature)
    assert.are.equal(1, s.sampler.top_p)
  end)

  it("takes ignore_eos as llama.cpp's server does (a boolean), and an empty prompt as the start of a document", function()
    local s = assert(openai.parse("completion", json.encode({ model = "m", prompt = "", ignore_eos = true })))
    assert.are.equal("", s.prompt)
    assert.is_true(s.ignore_eos)
    s = assert(openai.parse("chat", json.encode({ model = "m", messages = { { role = "user", content = "hi" } } })))
    assert.is_false(s.ignore_eos)
    assert.are.equal("", assert(openai.parse("completion", json.encode({ model = "m", prompt = { "" } }))).prompt)
    for _, v in ipairs({ "true", 1, { true } }) do
      local _, e = openai.parse("chat", json.encode({ model = "m", messages = { { role = "user", content = "hi" } }, ignore_eos = v }))
      assert.are.equal(400, e.status)
      assert.are.equal("ignore_eos", e.param)
      assert.matches("'ignore_eos' must be true or false", e.message, 1, true)
    end
    local _, e = openai.parse("completion", json.encode({ model = "m", prompt = {} }))
    assert.are.equal("prompt", e.param)
  end)

  it("names the field of a bad request", function()
    local _, e = openai.parse("completion", json.encode({ model = "m", prompt = "x", temperature = -1 }))
    assert.are.equal("temperature", e.param)
    _, e = openai.parse("completion", json.encode({ model = "m", prompt = "x", logit_bias = { ["5"] = 1 } }))
    assert.are.equal("logit_bias", e.param)
    _, e = openai.parse("completion", "{\"model\":\"m\",\"prompt\":\"\xC3\"}")
    assert.are.equal("invalid_encoding", e.code)
    assert.is_false(openai.utf8_valid("\xC3"))
    assert.is_false(openai.utf8_valid("\xED\xA0\x80")) -- a surrogate
    assert.is_true(openai.utf8_valid("caf\xC3\xA9 \xF0\x9F\x98\x80"))
    -- found by fuzz_openai: NaN is no JSON, an overflowing number no value (both raised an
    -- internal error: the server answered 500)
    _, e = openai.parse("chat", '{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":NaN}')
    assert.are.equal("invalid_json", e.code)
    for _, k in ipairs({ "temperature", "seed", "max_tokens" }) do
      _, e = openai.parse("completion", '{"model":"m","prompt":"x","' .. k .. '":1e400}')
      assert.are.equal(400, e.status)
      assert.are.equal(k, e.param)
    end
  end)

  it("stops at a stop string split across pieces, holding back only what could begin one", function()
    local st = openai.stopper({ "The end", "!!" })
    local out = {}
    local function put(p)
      local show, stopped = st.put(p)
      out[#out + 1] = show
      return stopped
    end
    assert.is_false(put("Once upon a time. Th"))
    assert.are.equal("Once upon a time. ", out[1]) -- "Th" could begin "The end"
    assert.is_false(put("ey left. The"))
    assert.is_true(put(" end. More"))
    assert.are.equal("Once upon a time. They left. ", table.concat(out))
    -- never a piece of a UTF-8 character
    local u = openai.stopper({ "\xC3\xA9t\xC3\xA9" })
    local shown = u.put("caf\xC3\xA9 \xC3\xA9")
    assert.are.equal("caf\xC3\xA9 ", shown)
    assert.are.equal("\xC3\xA9", u.rest())
  end)

  it("builds chunks and responses in OpenAI's shapes", function()
    local r = { id = "chatcmpl-1", created = 1, model = "m", first_chunk = true }
    local c = json.decode(openai.chunk("chat", r, "", nil):match("^data: (.*)\n\n$"))
    assert.are.equal("assistant", c.choices[1].delta.role)
    assert.are.equal("chat.completion.chunk", c.object)
    local u = openai.chunk("chat", r, nil, nil, { prompt_tokens = 1, completion_tokens = 2, total_tokens = 3 })
    assert.matches('"choices":[]', u, 1, true)
    local full = json.decode(openai.response("completion", { id = "cmpl-1", created = 1, model = "m",
      choices = { { text = "hi", finish_reason = "stop" }, { text = "ho", finish_reason = "length" } },
      usage = { prompt_tokens = 1, completion_tokens = 1, total_tokens = 2 } }))
    assert.are.equal("text_completion", full.object)
    assert.are.equal("hi", full.choices[1].text)
    assert.are.equal(1, full.choices[2].index)
    assert.are.equal("length", full.choices[2].finish_reason)
    local second = json.decode(openai.chunk("completion", { id = "cmpl-1", created = 1, model = "m", index = 2 }, "x", nil)
      :match("^data: (.*)\n\n$"))
    assert.are.equal(2, second.choices[1].index)
  end)
end)
