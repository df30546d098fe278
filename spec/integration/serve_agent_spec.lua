-- `loip serve` for agents (issue 28): logprobs and top_logprobs equal the log of the model's
-- probabilities (m:logits), on one device and on 3 offloading devices; `seed` makes a sampled
-- request repeatable, and asking for logprobs changes no token; usage reports cached prompt
-- tokens; bad input is a 400 naming the field.
local json = require "loip.text.json"
local client = require "loip.runtime.http_client"
local loip = require "loip"
local T = require "spec.support"
teardown(function() T.cleanup() end)
teardown(T.drop_stores)
after_each(T.stop_servers)

local S260 = T.root .. "/models/stories260K"
local greedy = assert(json.load(S260 .. "/reference/greedy.json"))

local function post(cl, url, body)
  local t = cl:post(url, type(body) == "string" and body or json.encode(body))
  cl:wait(60000)
  return t.status, json.decode(t.body) or t.body
end

-- The model's log-probabilities of tokens after prompt (ids), at each position.
local function reference(prompt, tokens)
  local m = loip.model.open(S260, { threads = 1, context = 256 })
  local out = T.reference_logprobs(m, prompt, tokens)
  m:close()
  return out
end

local function chat_template()
  local dir = T.tmpdir()
  T.write(dir .. "/chat.jinja", "{% for m in messages %}{{ m['content'] }}{% endfor %}")
  return dir .. "/chat.jinja"
end

describe("loip serve for agents", function()
  for _, where in ipairs({ "one device", "3 offloading devices" }) do
    it("returns the model's logprobs (" .. where .. "): completions and chat, streamed and not", function()
      local args = string.format("--model %s --context 256 --max-batch 2 --chat-template %s", S260, chat_template())
      local name = "stories260K"
      if where ~= "one device" then
        local st = T.slice_store(S260, "s260")
        name = st:match("([^/]+)$")
        args = string.format("--model %s --devices 3 --mem 1000K,1000K,1000K --threads 1 --context 256 --max-batch 2 "
          .. "--step-tokens 32 --kv-tokens 512 --chat-template %s", st, chat_template())
      end
      local url, stop, errlog = T.serve(args)
      local ok, err = pcall(function()
        local cl = client.new()
        local case = greedy.cases[2]
        local st, body = post(cl, url .. "/completions", { model = name, prompt = case.prompt_ids, max_tokens = 12,
          temperature = 0, logprobs = 2 })
        assert.are.equal(200, st, json.encode(body))
        local lp = body.choices[1].logprobs
        assert.are.equal(12, #lp.tokens)
        assert.are.equal(body.choices[1].text, table.concat(lp.tokens))
        local tokens = {}
        for i = 1, 12 do tokens[i] = case.generated_ids[i] end
        local ref = reference(case.prompt_ids, tokens)
        for i = 1, 12 do
          assert.is_true(math.abs(lp.token_logprobs[i] - ref[i]) < 1e-4, string.format("%d: %f vs %f", i, lp.token_logprobs[i], ref[i]))
          local n = 0
          for _, v in pairs(lp.top_logprobs[i]) do n = n + 1 assert.is_true(v <= lp.token_logprobs[i] + 1e-6) end
          assert.are.equal(2, n)
          if i > 1 then assert.are.equal(lp.text_offset[i - 1] + #lp.tokens[i - 1], lp.text_offset[i]) end
        end
        -- chat: the same prompt text through a template that passes it as is; streamed, the same entries
        local msg = { { role = "user", content = case.prompt } }
        local st2, c = post(cl, url .. "/chat/completions", { model = name, messages = msg, max_tokens = 12, temperature = 0,
          logprobs = true, top_logprobs = 3 })
        assert.are.equal(200, st2, json.encode(c))
        local entries = c.choices[1].logprobs.content
        assert.are.equal(12, #entries)
        local text = {}
        for i, e in ipairs(entries) do
          text[i] = e.token
          assert.are.equal(3, #e.top_logprobs)
          assert.are.equal(e.token, e.top_logprobs[1].token, "greedy: the most likely")
          assert.is_true(math.abs(e.logprob - e.top_logprobs[1].logprob) < 1e-6)
          assert.are.equal(#e.token, #e.bytes)
        end
        assert.are.equal(c.choices[1].message.content, table.concat(text))
        local t = cl:post(url .. "/chat/completions", json.encode({ model = name, messages = msg, max_tokens = 12, temperature = 0,
          logprobs = true, stream = true }))
        local streamed = {}
        t.on_event = function(_, data)
          local e = json.decode(data)
          if e and e.choices and e.choices[1] and e.choices[1].logprobs ~= json.null and e.choices[1].logprobs then
            for _, x in ipairs(e.choices[1].logprobs.content) do streamed[#streamed + 1] = x.logprob end
          end
        end
        cl:wait(60000)
        assert.are.equal(12, #streamed)
        for i = 1, 12 do assert.is_true(math.abs(streamed[i] - entries[i].logprob) < 1e-6) end
        assert.are.equal(0, c.usage.prompt_tokens_details.cached_tokens)
        cl:close()
      end)
      stop()
      assert(ok, tostring(err) .. "\n" .. T.read_or_empty(errlog))
    end)
  end

  it("gives n choices: equal when greedy, each its own when sampled, streamed by index", function()
    local url, stop, errlog = T.serve(string.format("--model %s --context 256 --max-batch 4 --chat-template %s", S260, chat_template()))
    local ok, err = pcall(function()
      local cl = client.new()
      local req = { model = "stories260K", prompt = "Once upon a time", max_tokens = 20, temperature = 0, n = 3 }
      local st, g = post(cl, url .. "/completions", req)
      assert.are.equal(200, st, json.encode(g))
      assert.are.equal(3, #g.choices)
      for i = 1, 3 do
        assert.are.equal(i - 1, g.choices[i].index)
        assert.are.equal(greedy.cases[2].output_text:sub(#"Once upon a time" + 1, #"Once upon a time" + #g.choices[1].text), g.choices[i].text)
      end
      assert.are.equal(60, g.usage.completion_tokens)
      req.temperature, req.seed = 0.8, 7
      local _, s1 = post(cl, url .. "/completions", req)
      local texts = {}
      for i = 1, 3 do
        assert.is_true(#s1.choices[i].text > 0)
        texts[s1.choices[i].text] = true
      end
      assert.is_true(next(texts, next(texts)) ~= nil, "sampled choices differ")
      -- streamed: each index's text is the non-streamed choice's
      req.stream = true
      local t = cl:post(url .. "/completions", json.encode(req))
      local parts, finished = { {}, {}, {} }, 0
      t.on_event = function(_, data)
        local e = json.decode(data)
        if e and e.choices and e.choices[1] then
          local ch = e.choices[1]
          table.insert(parts[ch.index + 1], ch.text)
          if ch.finish_reason ~= json.null then finished = finished + 1 end
        end
      end
      cl:wait(60000)
      assert.are.equal(3, finished)
      for i = 1, 3 do assert.are.equal(s1.choices[i].text, table.concat(parts[i])) end
      -- more choices than slots: a 400 naming n
      req.n, req.stream = 5, nil
      local st5, e5 = post(cl, url .. "/completions", req)
      assert.are.equal(400, st5)
      assert.are.equal("n", e5.error.param)
      cl:close()
    end)
    stop()
    assert(ok, tostring(err) .. "\n" .. T.read_or_empty(errlog))
  end)

  it("samples under a grammar: GBNF and JSON on one device and on 3 offloading devices", function()
    local st = T.slice_store(S260, "s260")
    for _, where in ipairs({ "one", "three" }) do
      local args = where == "one" and string.format("--model %s --context 256 --max-batch 2 --chat-template %s", S260, chat_template())
        or string.format("--model %s --devices 3 --mem 1000K,1000K,1000K --threads 1 --context 256 --max-batch 2 --step-tokens 32 "
          .. "--kv-tokens 512 --chat-template %s", st, chat_template())
      local name = where == "one" and "stories260K" or st:match("([^/]+)$")
      local url, stop, errlog = T.serve(args)
      local ok, err = pcall(function()
        local cl = client.new()
        for seed = 1, 4 do
          local s1, g = post(cl, url .. "/completions", { model = name, prompt = "Once upon a time", max_tokens = 20,
            temperature = 1, seed = seed, grammar = 'root ::= " " ("yes" | "no") "!"' })
          assert.are.equal(200, s1, json.encode(g))
          assert.is_truthy(({ [" yes!"] = true, [" no!"] = true })[g.choices[1].text], g.choices[1].text)
          assert.are.equal("stop", g.choices[1].finish_reason)
        end
        -- (as text: the properties' order is the text's)
        local s2, j = post(cl, url .. "/chat/completions", '{"model": "' .. name .. '", "messages": [{"role": "user", '
          .. '"content": "Once"}], "max_tokens": 200, "temperature": 0.7, "seed": 3, "logprobs": true, "response_format": '
          .. '{"type": "json_schema", "json_schema": {"name": "pet", "strict": true, "schema": {"type": "object", '
          .. '"properties": {"kind": {"enum": ["cat", "dog"]}, "legs": {"type": "integer"}}, "required": ["legs", "kind"], '
          .. '"additionalProperties": false}}}}')
        assert.are.equal(200, s2, json.encode(j))
        local doc = json.decode(j.choices[1].message.content)
        assert.is_table(doc, j.choices[1].message.content)
        assert.is_truthy(({ cat = true, dog = true })[doc.kind])
        assert.are.equal("number", type(doc.legs))
        assert.matches('^{%s*"kind"', j.choices[1].message.content, "the schema's order: kind, then legs")
        cl:close()
      end)
      stop()
      assert(ok, tostring(err) .. "\n" .. T.read_or_empty(errlog))
    end
  end)

  it("repeats a sampled request with its seed, logprobs or not; refuses bad fields naming them", function()
    local url, stop, errlog = T.serve(string.format("--model %s --context 256 --max-batch 2 --chat-template %s", S260, chat_template()))
    local ok, err = pcall(function()
      local cl = client.new()
      local req = { model = "stories260K", prompt = "Once upon a time", max_tokens = 30, temperature = 1, seed = 42 }
      local _, a = post(cl, url .. "/completions", req)
      local _, b = post(cl, url .. "/completions", req)
      req.logprobs = 0
      local _, c = post(cl, url .. "/completions", req)
      req.seed, req.logprobs = 43, nil
      local _, d = post(cl, url .. "/completions", req)
      assert.are.equal(a.choices[1].text, b.choices[1].text)
      assert.are.equal(a.choices[1].text, c.choices[1].text)
      assert.are_not.equal(a.choices[1].text, d.choices[1].text)
      local chat = { model = "stories260K", messages = { { role = "user", content = "Hi" } }, max_tokens = 4 }
      local function with(base, k, v)
        local x = {}
        for kk, vv in pairs(base) do x[kk] = vv end
        x[k] = v
        return x
      end
      local cases = {
        { "/completions", with(req, "logprobs", 6), "logprobs" },
        { "/completions", with(req, "logprobs", true), "logprobs" },
        { "/completions", with(req, "top_logprobs", 2), "top_logprobs" },
        { "/chat/completions", with(chat, "top_logprobs", 2), "top_logprobs" },
        { "/chat/completions", with(with(chat, "logprobs", true), "top_logprobs", 21), "top_logprobs" },
        { "/chat/completions", with(chat, "logprobs", 2), "logprobs" },
        { "/chat/completions", with(chat, "response_format", { type = "xml" }), "response_format.type" },
        { "/chat/completions", with(chat, "response_format", { type = "json_schema", json_schema = { name = "a b" } }),
          "response_format.json_schema.name" },
        { "/chat/completions", with(with(chat, "response_format", { type = "json_object" }), "grammar", "root ::= \"a\""), "grammar" },
        { "/completions", with(req, "grammar", 5), "grammar" },
        { "/completions", with(req, "grammar", "root ::= \"a\" foo"), "grammar" },
        { "/chat/completions", with(chat, "response_format", { type = "json_schema", json_schema = { name = "x",
          schema = { type = "object", properties = { a = { type = "string", pattern = "^a+$" } } } } }),
          "response_format.json_schema.schema" },
        { "/chat/completions", with(with(chat, "tools", { { type = "function", ["function"] = { name = "f",
          parameters = { type = "object", properties = { a = { type = "string", format = "email" } } } } } }), "tool_choice",
          "required"), "tools[0].function.parameters" },
      }
      for _, k in ipairs(cases) do
        local st, e = post(cl, url .. k[1], k[2])
        assert.are.equal(400, st, json.encode(k[2]) .. " -> " .. json.encode(e))
        assert.are.equal(k[3], e.error.param, json.encode(e))
      end
      local _, e1 = post(cl, url .. "/chat/completions", cases[#cases - 1][2])
      assert.matches("/properties/a: 'pattern' is not supported", e1.error.message, 1, true)
      cl:close()
    end)
    stop()
    assert(ok, tostring(err) .. "\n" .. T.read_or_empty(errlog))
  end)
end)
