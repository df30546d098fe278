-- `loip serve`: the official OpenAI client (npm "openai", installed by setup) works unchanged,
-- streamed text equals the non-streamed text; 8 concurrent greedy requests through HTTP on 3
-- local devices that offload each give what their prompt gives alone (run.c's text); malformed
-- requests each get a clear 4xx while the server keeps serving; a client that hangs up frees
-- its request's KV; past the queue the server answers 429 with Retry-After.
local json = require "loip.text.json"
local core = require "loip.core"
local client = require "loip.runtime.http_client"
local loip = require "loip"
local T = require "spec.support"
teardown(function() T.cleanup() end)
local C = core.C

local S260 = T.root .. "/models/stories260K"
local greedy = assert(json.load(S260 .. "/reference/greedy.json"))
local store_of = T.slice_store
teardown(T.drop_stores)

local read = T.read_or_empty
local alive = require("loip.cluster.proc").alive
local serve = T.serve
after_each(T.stop_servers)

local function post(cl, url, body, headers)
  local t = cl:post(url, type(body) == "string" and body or json.encode(body), headers)
  cl:wait(60000)
  return t.status, json.decode(t.body) or t.body, t
end

describe("loip serve", function()
  it("works with the official OpenAI client, unchanged: stream and not, the same text", function()
    local missing = T.npm_missing()
    if missing then pending(missing) return end
    local dir = T.tmpdir()
    T.chat_template(dir)
    local url, stop = serve(string.format("--model %s --api-key spec-key --chat-template %s/chat.jinja --max-batch 2", S260, dir))
    local rc, out, err = T.run(string.format("node %s/tests/openai/client.mjs %s spec-key stories260K", T.root, url))
    stop()
    assert.are.equal(0, rc, err)
    local r = assert(json.decode(out), out)
    assert.are.equal("chat.completion", r.chat.object)
    assert.are.equal(24, r.chat.usage.completion_tokens)
    assert.are.equal(r.chat.text, r.chat_stream.text)
    assert.are.equal(r.chat.finish, r.chat_stream.finish)
    -- (the same prompt twice: the stream's may come from the prefix cache, counted as cached)
    local u, us = r.chat.usage, r.chat_stream.usage
    assert.are.same({ u.prompt_tokens, u.completion_tokens, u.total_tokens }, { us.prompt_tokens, us.completion_tokens, us.total_tokens })
    assert.is_true(r.chat_stream.chunks > 10, "streamed as it was generated")
    -- completions continue the prompt: run.c's text for "Once upon a time"
    local ref = greedy.cases[2]
    assert.are.equal("Once upon a time", ref.prompt)
    assert.are.equal(ref.output_text:sub(#"Once upon a time" + 1, #"Once upon a time" + #r.completion.text), r.completion.text)
    assert.are.equal(r.completion.text, r.completion_stream.text)
    assert.are.equal("length", r.completion_stream.finish)
    assert.are.same({ text = ", there was a little ", finish = "stop" }, r.completion_stop)
    assert.are.same({ finish = "length", tokens = 240 }, r.ignore_eos)
    assert.are.same({ prompt_tokens = 1, tokens = 8 }, r.empty_prompt)
    assert.are.same({ "stories260K" }, r.models)
    assert.are.equal(401, r.errors.bad_key.status)
    assert.are.equal("invalid_api_key", r.errors.bad_key.code)
    assert.are.equal(404, r.errors.unknown_model.status)
    assert.are.equal(400, r.errors.n_over_slots.status) -- (--max-batch 2)
    assert.are.equal(400, r.errors.too_long.status)
    assert.are.equal("context_length_exceeded", r.errors.too_long.code)
  end)

  -- in this process: a server over a model (or one whose tokenizer adds no BOS), driven by turns
  local function in_process(tok)
    local server = require "loip.serve.server"
    local m = loip.model.open(S260, { threads = 1, context = 512 })
    local srv = server.new { model = m, tokenizer = tok or m.tokenizer, dir = S260, name = "stories260K", port = 0, quiet = true }
    local cl = client.new()
    local function ask(body)
      local t = cl:post(string.format("http://127.0.0.1:%d/v1/completions", srv.port), json.encode(body))
      while cl:busy() do srv:turn(5) cl:run(5) end
      return t.status, json.decode(t.body) or t.body
    end
    local function close() cl:close() srv:close() m:close() end
    return ask, m, close
  end

  -- in this process: a server with --api-key and a chat template (srv), one whose devices hold 64 KV positions
  -- (srv2: a prompt that fits the context but not the KV cache), and ask(server, path, body, headers)
  local function key_servers()
    local server = require "loip.serve.server"
    local dir = T.tmpdir()
    T.chat_template(dir)
    local m = loip.model.open(S260, { threads = 1, context = 512 })
    local m2 = loip.model.open(S260, { threads = 1, context = 512, kv_tokens = 64 })
    local srv = server.new { model = m, tokenizer = m.tokenizer, dir = S260, name = "stories260K", port = 0, quiet = true,
      api_key = "spec-key", chat_template = dir .. "/chat.jinja" }
    local srv2 = server.new { model = m2, tokenizer = m2.tokenizer, dir = S260, name = "stories260K", port = 0, quiet = true }
    local cl = client.new()
    local function ask(s, path, body, headers)
      local t = cl:post(string.format("http://127.0.0.1:%d/v1/%s", s.port, path), json.encode(body), headers)
      while cl:busy() do srv:turn(5) srv2:turn(5) cl:run(5) end
      return t.status, json.decode(t.body) or t.body
    end
    return srv, srv2, ask, function() cl:close() srv:close() srv2:close() m:close() m2:close() end
  end
  local long = string.rep("Once upon a time ", 250) -- (1002 tokens with the BOS; the context is 512)

  it("says an API key given but wrong is incorrect, naming its header, and one not given missing", function()
    local srv, _, ask, close = key_servers()
    local ok, err = pcall(function()
      local chat = { model = "stories260K", max_tokens = 4, messages = { { role = "user", content = "Hi" } } }
      for _, case in ipairs({
        { "completions", nil, "You didn't provide an API key (Authorization: Bearer KEY)" },
        { "completions", { ["x-api-key"] = "wrong" }, "Incorrect API key provided (in the x-api-key header)" },
        { "completions", { Authorization = "Bearer wrong" }, "Incorrect API key provided (in the Authorization header)" },
        { "completions", { Authorization = "Bearer wrong", ["x-api-key"] = "wrong" },
          "Incorrect API key provided (in the x-api-key and Authorization headers)" },
        { "messages", nil, "You didn't provide an API key (x-api-key: KEY, or Authorization: Bearer KEY)" },
        { "messages", { ["x-api-key"] = "wrong" }, "Incorrect API key provided (in the x-api-key header)" },
        { "messages", { Authorization = "Bearer wrong" }, "Incorrect API key provided (in the Authorization header)" },
      }) do
        local status, body = ask(srv, case[1], case[1] == "messages" and chat or { model = "stories260K", prompt = "Hi" }, case[2])
        local what = case[1] .. " " .. json.encode(case[2] or {})
        assert.are.equal(401, status, what)
        assert.are.equal(case[3], body.error.message, what)
        if case[1] == "messages" then -- (Anthropic's shape)
          assert.are.equal("authentication_error", body.error.type, what)
        else
          assert.are.equal("invalid_api_key", body.error.code, what)
        end
      end
    end)
    close()
    assert(ok, err)
  end)

  it("blames the prompt's field (prompt, messages) for a prompt too long, max_tokens for a completion too long", function()
    local srv, srv2, ask, close = key_servers()
    local ok, err = pcall(function()
      local key = { Authorization = "Bearer spec-key" }
      -- context_length_exceeded: the prompt's field when the prompt alone fills the context, else max_tokens
      for _, case in ipairs({
        { "completions", { prompt = long, max_tokens = 4 }, "prompt" },
        { "completions", { prompt = long }, "prompt" },
        { "completions", { prompt = "Once", max_tokens = 600 }, "max_tokens" },
        { "chat/completions", { messages = { { role = "user", content = long } }, max_tokens = 4 }, "messages" },
      }) do
        case[2].model = "stories260K"
        local status, body = ask(srv, case[1], case[2], key)
        assert.are.equal(400, status, json.encode(body))
        assert.are.equal("context_length_exceeded", body.error.code, case[1])
        assert.are.equal(case[3], body.error.param, case[1] .. " " .. case[3])
      end
      local status, body = ask(srv, "messages", { model = "stories260K", max_tokens = 4,
        messages = { { role = "user", content = long } } }, { ["x-api-key"] = "spec-key" })
      assert.are.equal(400, status)
      assert.is_nil(body.error.message:find("^max_tokens"), body.error.message)
      assert.matches("in the messages", body.error.message, 1, true)
      -- past the KV cache the devices hold (64 positions): the prompt's when it alone is too long
      status, body = ask(srv2, "completions", { model = "stories260K", prompt = string.rep("Once upon a time ", 20), max_tokens = 4 })
      assert.are.equal(400, status, json.encode(body))
      assert.are.equal("prompt", body.error.param, body.error.message)
      status, body = ask(srv2, "completions", { model = "stories260K", prompt = "Once upon a time", max_tokens = 100 })
      assert.are.equal(400, status, json.encode(body))
      assert.are.equal("max_tokens", body.error.param, body.error.message)
    end)
    close()
    assert(ok, err)
  end)

  it("completes an empty prompt from the start of a document (the BOS alone), as loip generate does", function()
    local m = loip.model.open(S260, { threads = 1, context = 512 })
    local it, st = m:generate("", { temperature = 0, max_tokens = 16 })
    local parts = {}
    for _, piece in it do parts[#parts + 1] = piece end
    m:close()
    assert.are.same({ 1 }, st.prompt_ids)
    local ask, _, close = in_process()
    local ok, err = pcall(function()
      for _, prompt in ipairs({ "", { "" } }) do
        local status, body = ask({ model = "stories260K", prompt = prompt, max_tokens = 16, temperature = 0 })
        assert.are.equal(200, status, json.encode(body))
        assert.are.equal(table.concat(parts), body.choices[1].text)
        assert.are.equal(1, body.usage.prompt_tokens)
        assert.are.equal(16, body.usage.completion_tokens)
      end
    end)
    close()
    assert(ok, err)
    -- a tokenizer that adds no BOS (Qwen2's) leaves nothing to start from: a clear 400
    local qwen = T.root .. "/models/qwen2-tokenizer"
    if not T.exists(qwen .. "/vocab.json") then pending("needs models/qwen2-tokenizer") return end
    local tok = require("loip.text.tokenizer").open(qwen)
    assert.are.same({}, tok:encode("", { bos = true }))
    local ask2, _, close2 = in_process(tok)
    local ok2, err2 = pcall(function()
      local status, body = ask2({ model = "stories260K", prompt = "", max_tokens = 4 })
      assert.are.equal(400, status)
      assert.are.equal("prompt", body.error.param)
      assert.matches("'prompt' is empty and this model's tokenizer adds no BOS token", body.error.message, 1, true)
    end)
    close2()
    tok:close()
    assert(ok2, err2)
  end)

  -- "Lily" greedily: 223 tokens, then llama2.c's end token
  it("ignore_eos (as llama.cpp's server takes it) runs to max_tokens past the end token; a stop string still stops", function()
    local ask, _, close = in_process()
    local ok, err = pcall(function()
      local base = { model = "stories260K", prompt = "Lily", max_tokens = 240, temperature = 0 }
      local function with(extra)
        local b = {}
        for k, v in pairs(base) do b[k] = v end
        for k, v in pairs(extra) do b[k] = v end
        local status, body = ask(b)
        assert.are.equal(200, status, json.encode(body))
        return body.choices[1], body.usage
      end
      local plain, pu = with({})
      assert.are.equal("stop", plain.finish_reason)
      assert.are.equal(223, pu.completion_tokens)
      local long, lu = with({ ignore_eos = true })
      assert.are.equal("length", long.finish_reason)
      assert.are.equal(240, lu.completion_tokens)
      assert.are.equal(plain.text, long.text:sub(1, #plain.text))
      local _, fu = with({ ignore_eos = false })
      assert.are.equal(223, fu.completion_tokens)
      -- a stop string past where the end token was still ends it
      local rest = long.text:sub(#plain.text + 1)
      local word
      for w in rest:gmatch("%a%a%a%a+") do
        if not plain.text:find(w, 1, true) then word = w break end
      end
      assert.is_string(word, rest)
      local cut = with({ ignore_eos = true, stop = { word } })
      assert.are.equal("stop", cut.finish_reason)
      assert.are.equal(long.text:sub(1, long.text:find(word, 1, true) - 1), cut.text)
    end)
    close()
    assert(ok, err)
  end)

  it("loip chat streams each reply and keeps the conversation", function()
    local dir = T.tmpdir()
    T.chat_template(dir)
    local url, stop, errlog = serve(string.format("--model %s --chat-template %s/chat.jinja --api-key k2", S260, dir), { verbose = true })
    T.write(dir .. "/in", "Once upon a time\nAnd then?\n")
    local rc, out, err = T.run(string.format("LOIP_API_KEY=k2 %s chat --url %s --max-tokens 12 --temperature 0 < %s/in", T.loip, url, dir))
    local rc2, _, err2 = T.run(string.format("%s chat --url %s --model stories260K --api-key wrong < %s/in", T.loip, url, dir))
    stop()
    assert.are.equal(0, rc, err)
    local lines = {}
    for l in (out .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
    assert.is_true(#lines >= 2 and lines[1] ~= "" and lines[2] ~= "", out)
    -- the second request carried the first exchange: more prompt tokens
    local prompts = {}
    for n in read(errlog):gmatch("chatcmpl%-%x+: (%d+)%+%d+ tokens") do prompts[#prompts + 1] = tonumber(n) end
    assert.are.equal(2, #prompts)
    assert.is_true(prompts[2] > prompts[1] + 12, "the history went with the second message")
    assert.are.equal(1, rc2)
    assert.matches("HTTP 401: Incorrect API key provided", err2, 1, true)
  end)

  it("loip chat: /help and other commands never reach the model, a URL without /v1 is hinted, a piped reply ends its line at once", function()
    local dir = T.tmpdir()
    T.chat_template(dir)
    local url, stop, errlog = serve(string.format("--model %s --chat-template %s/chat.jinja", S260, dir), { verbose = true })
    local ok, err = pcall(function()
      T.write(dir .. "/in", "/help\n/frobnicate\nOnce upon a time\n//help\n")
      local rc, out, e = T.run(string.format("%s chat --url %s --max-tokens 4 --temperature 0 < %s/in", T.loip, url, dir))
      assert.are.equal(0, rc, e)
      assert.matches("/reset clears the conversation", e, 1, true)
      assert.matches("chat: no command /frobnicate (/help lists them; //frobnicate sends it as a message)", e, 1, true)
      assert.are_not.equal("", out)
      local sent = {} -- two requests: "Once upon a time" and "/help" sent as text
      for n_prompt in read(errlog):gmatch("chatcmpl%-%x+: (%d+)%+%d+ tokens") do sent[#sent + 1] = tonumber(n_prompt) end
      assert.are.equal(2, #sent)
      -- the server's root instead of its API: the 404 says where the API is
      local base = url:gsub("/v1$", "")
      local rc2, _, e2 = T.run(string.format("%s chat --url %s < /dev/null", T.loip, base))
      assert.are.equal(1, rc2)
      assert.matches("HTTP 404", e2, 1, true)
      assert.matches("try --url " .. base .. "/v1", e2, 1, true)
      -- into a pipe, a reply's newline comes with the reply, not when the next message does
      local p = io.popen(string.format("%s chat --url %s --max-tokens 4 --temperature 0 > %s/piped 2> %s/piped.err", T.loip, url,
        dir, dir), "w")
      p:write("Once upon a time\n")
      p:flush()
      local got = ""
      for _ = 1, 1200 do
        got = read(dir .. "/piped")
        if got:sub(-1) == "\n" then break end
        C.loip_sleep_ms(50)
      end
      p:close()
      assert.is_true(#got > 1 and got:sub(-1) == "\n", "the reply's line ended while chat waited for input: " .. json.encode(got)
        .. " " .. read(dir .. "/piped.err"))
    end)
    stop()
    assert(ok, tostring(err) .. "\n" .. read(errlog))
  end)

  it("serves 8 concurrent greedy requests on 3 offloading devices, each as its prompt alone", function()
    local st = store_of(S260, "s260")
    -- each prompt alone, in-process: its text (and run.c's ids)
    local m = loip.model.open(S260, { threads = 1, context = 256 })
    local alone = {}
    for k = 1, 8 do
      local c = greedy.cases[(k - 1) % #greedy.cases + 1]
      local it, s = m:generate(c.prompt_ids, { temperature = 0, max_tokens = 24, stop = { 1, 2 } })
      local parts = {}
      for _, piece in it do parts[#parts + 1] = piece end
      for i, id in ipairs(s.token_ids) do assert.are.equal(c.generated_ids[i], id) end
      alone[k] = table.concat(parts)
    end
    m:close()
    local url, stop = serve(string.format("--model %s --devices 3 --mem 1000K,1000K,1000K --threads 1 --context 256 "
      .. "--max-batch 8 --step-tokens 32 --kv-tokens 1024", st))
    local ok, err = pcall(function()
      local cl = client.new()
      local ts = {}
      for k = 1, 8 do
        local c = greedy.cases[(k - 1) % #greedy.cases + 1]
        ts[k] = cl:post(url .. "/completions", json.encode({ model = st:match("([^/]+)$"), prompt = c.prompt_ids,
          max_tokens = 24, temperature = 0, stream = k % 2 == 0 }))
        if k % 2 == 0 then
          ts[k].text = {}
          ts[k].on_event = function(t, data)
            local e = json.decode(data)
            if e and e.choices and e.choices[1] then t.text[#t.text + 1] = e.choices[1].text end
          end
        end
      end
      cl:wait(120000)
      for k = 1, 8 do
        assert.are.equal(200, ts[k].status, ts[k].body)
        local text = k % 2 == 0 and table.concat(ts[k].text) or json.decode(ts[k].body).choices[1].text
        assert.are.equal(alone[k], text)
      end
      -- they ran as one batch: the steps carried 8 requests at a time
      local t = cl:get(url:gsub("/v1$", "") .. "/metrics")
      cl:wait(10000)
      local steps = tonumber(t.body:match("\nloip_steps_total (%d+)"))
      assert.is_true(steps < 8 * 24 / 2, steps .. " steps for 8 x 24 tokens")
      -- per device: compute, loads, and memory by account
      -- (which devices read blocks is the scheduler's choice, by this machine's calibration)
      local load_ms = 0
      for d = 1, 3 do load_ms = load_ms + tonumber(t.body:match('\nloip_device_load_ms_total{device="' .. d .. '"} ([%d.]+)')) end
      assert.is_true(load_ms > 0)
      assert.is_true(tonumber(t.body:match('\nloip_memory_bytes{account="kv",device="2"} (%d+)')) > 0)
      assert.matches('loip_time_to_first_token_ms_bucket{le="+Inf"} 8', t.body, 1, true)
      -- /health names the cluster's devices (a local worker's process id) and its losses
      local h = cl:get(url:gsub("/v1$", "") .. "/health")
      cl:wait(10000)
      h = json.decode(h.body)
      assert.are.equal(3, #h.devices)
      for i, d in ipairs(h.devices) do
        assert.are.equal(i, d.device)
        assert.is_true(alive(d.pid), "device " .. i .. "'s worker runs")
      end
      assert.are.equal(0, h.device_losses)
      assert.are.equal(0, h.devices_taken_back)
      cl:close()
    end)
    stop()
    assert(ok, err)
  end)

  it("stops a request on a cluster where one device stops: at the model's own stop ids (llama2.c's: BOS too)", function()
    -- found by recipes/bench/soak.lua: this prompt, seed and temperature end the story with BOS
    -- after 25 tokens on one device; the cluster's server stopped on the tokenizer's EOS only
    local prompt = { 1, 363, 279, 225, 106, 415, 490, 52, 236, 363, 218, 188, 258, 470, 495, 18, 286, 481, 211, 509, 34, 490,
      498, 243, 364, 118, 8, 324, 119, 316, 499, 309, 402, 34, 404, 271, 461, 388, 301, 280, 296, 277 }
    local st = store_of(S260, "s260")
    local texts = {}
    for _, devices in ipairs({ "", "--devices 2" }) do
      local url, stop = serve(string.format("--model %s %s --threads 1 --context 256", st, devices))
      local ok, err = pcall(function()
        local cl = client.new()
        local status, body = post(cl, url .. "/completions", { model = st:match("([^/]+)$"), prompt = prompt, max_tokens = 48,
          temperature = 0.8, seed = 351 })
        assert.are.equal(200, status)
        assert.are.equal(25, body.usage.completion_tokens)
        assert.are.equal("stop", body.choices[1].finish_reason)
        texts[#texts + 1] = body.choices[1].text
        cl:close()
      end)
      stop()
      assert(ok, err)
    end
    assert.are.equal(texts[1], texts[2])
  end)

  it("answers malformed requests with a clear 4xx and keeps serving", function()
    local url, stop, errlog = serve(string.format("--model %s --context 128 --max-batch 2 --max-body 1M", S260))
    local ok, err = pcall(function()
      local cl = client.new()
      local base = url:gsub("/v1$", "")
      local good = { model = "stories260K", prompt = "Once upon a time", max_tokens = 4, temperature = 0 }
      local function with(k, v)
        local b = {}
        for x, y in pairs(good) do b[x] = y end
        b[k] = v
        return json.encode(b)
      end
      local cases = {
        { "/v1/completions", "{", 400, "not valid JSON" },
        { "/v1/completions", "[1,2]", 400, "must be a JSON object" },
        { "/v1/completions", "\"text\"", 400, "must be a JSON object" },
        { "/v1/completions", json.encode({ prompt = "hi" }), 400, "'model' is required" },
        { "/v1/completions", with("model", 7), 400, "'model' is required" },
        { "/v1/completions", with("model", "gpt-4"), 404, "does not exist" },
        { "/v1/completions", with("prompt", json.null), 400, "'prompt' must be" },
        { "/v1/completions", with("ignore_eos", "yes"), 400, "'ignore_eos' must be true or false, not \"yes\"" },
        { "/v1/completions", with("ignore_eos", 1), 400, "'ignore_eos' must be true or false, not 1" },
        { "/v1/completions", with("prompt", { 1, -5 }), 400, "is not a token id" },
        { "/v1/completions", with("prompt", { 1, 99999 }), 400, "below the vocabulary size" },
        { "/v1/completions", with("max_tokens", "ten"), 400, "'max_tokens' must be a number" },
        { "/v1/completions", with("max_tokens", 2.5), 400, "'max_tokens' must be an integer" },
        { "/v1/completions", with("max_tokens", 0), 400, "'max_tokens' is 0" },
        { "/v1/completions", with("max_tokens", 1000000000), 400, "maximum context length is 128 tokens" },
        { "/v1/completions", with("temperature", 7), 400, "'temperature' is 7" },
        { "/v1/completions", with("top_p", "high"), 400, "'top_p' must be a number" },
        { "/v1/completions", with("n", 3), 400, "'n' is 3; this server runs 2 requests at once" },
        { "/v1/completions", with("stop", { 1, 2 }), 400, "'stop' item 0" },
        { "/v1/completions", with("stop", { "a", "b", "c", "d", "e" }), 400, "at most 4" },
        { "/v1/completions", with("stream", "yes"), 400, "'stream' must be true or false" },
        { "/v1/completions", with("frobnicate", 1), 400, "Unrecognized request argument supplied: frobnicate" },
        { "/v1/completions", "{\"model\":\"stories260K\",\"prompt\":\"caf\255\"}", 400, "not valid UTF-8" },
        { "/v1/chat/completions", json.encode({ model = "stories260K", messages = {} }), 400, "'messages' must be a non-empty array" },
        { "/v1/chat/completions", json.encode({ model = "stories260K", messages = { { role = "wizard", content = "hi" } } }), 400, "messages[0].role" },
        { "/v1/chat/completions", json.encode({ model = "stories260K", messages = { { role = "user", content = 5 } } }), 400, "messages[0].content" },
        { "/v1/chat/completions", json.encode({ model = "stories260K", messages = { { role = "user", content = "hi" } } }), 400, "no chat template" },
        { "/v1/completions", string.rep(" ", 10 * 1024 * 1024), 413, "larger than" },
        { "/v1/nothing", "{}", 404, "no route" },
      }
      local ts = {}
      for i, c in ipairs(cases) do ts[i] = cl:post(url:gsub("/v1$", "") .. c[1], c[2]) end
      -- a client that stops sending mid-body (the connection's idle timeout ends it)
      os.execute(string.format("timeout 5 bash -c 'exec 3<>/dev/tcp/%s; printf \"POST /v1/completions HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: 500\\r\\n\\r\\n{\\\"mo\" >&3; sleep 1' &",
        base:gsub("^http://", ""):gsub(":", "/")))
      cl:wait(60000)
      assert.is_true(#cases >= 20)
      for i, c in ipairs(cases) do
        assert.are.equal(c[3], ts[i].status, c[1] .. " " .. c[2]:sub(1, 80) .. " -> " .. ts[i].body:sub(1, 300))
        local e = json.decode(ts[i].body)
        assert.is_table(e and e.error, ts[i].body)
        assert.matches(c[4], e.error.message, 1, true)
      end
      local mt = cl:get(url .. "/completions") -- the wrong method
      cl:wait(10000)
      assert.are.equal(405, mt.status)
      -- and it still serves
      local status, body = post(cl, url .. "/completions", good)
      assert.are.equal(200, status)
      assert.are.equal(", there was a", body.choices[1].text)
      cl:close()
    end)
    stop()
    assert(ok, tostring(err) .. "\n" .. read(errlog))
  end)

  it("plays the request patterns against it and times every request", function()
    local load = require "loip.serve.load"
    local url, stop = serve(string.format("--model %s --max-batch 4", S260))
    local ok, err = pcall(function()
      local arrivals = load.pattern("bursty", { burst = 4, bursts = 2, input_tokens = 6, output_tokens = 10 })
      assert.are.equal(8, #arrivals)
      assert.are.equal("all", arrivals[5].after)
      local runs = load.play(url, "stories260K", arrivals, { vocab = 512 })
      local s = load.summary(runs)
      assert.are.equal(0, s.failed)
      assert.are.equal(80, s.tokens)
      assert.is_true(s.tokens_per_s > 0 and s.ttft_ms.p50 > 0 and s.ms_per_token.p99 >= s.ms_per_token.p50)
      -- a second burst starts when the first is done
      local first_done = 0
      for k = 1, 4 do first_done = math.max(first_done, runs[k].t_done) end
      for k = 5, 8 do assert.is_true(runs[k].t_sent >= first_done) end
      local sp = load.pattern("sporadic", { count = 3 })
      local sr = load.play(url, "stories260K", sp, { vocab = 512 })
      assert.is_true(sr[2].t_sent >= sr[1].t_done and sr[3].t_sent >= sr[2].t_done)
      -- open-loop arrivals: the same for the same seed, spread at the rate
      local a1 = load.pattern("poisson", { rate = 50, count = 20, seed = 3 })
      local a2 = load.pattern("poisson", { rate = 50, count = 20, seed = 3 })
      assert.are.same(a1, a2)
      assert.is_true(a1[20].at_ms > 100 and a1[20].at_ms < 1500, "20 arrivals at 50/s: about 0.4 s")
    end)
    stop()
    assert(ok, err)
  end)

  it("frees a request's KV when its client hangs up, and answers 429 past its queue", function()
    -- one device behind a link of 10 ms a hop: a long request takes seconds
    local url, stop = serve(string.format("--model %s --devices 1 --threads 1 --link-delay 10ms --context 512 --max-batch 1 --max-queue 1",
      store_of(S260, "s260")))
    local ok, err = pcall(function()
      local cl = client.new()
      local base = url:gsub("/v1$", "")
      local function metric(name) -- (the streams keep running meanwhile)
        local t = cl:get(base .. "/metrics")
        while not t.status do cl:run(10) end
        return tonumber(t.body:match("\n" .. name .. " (%d+)"))
      end
      local long = json.encode({ model = store_of(S260, "s260"):match("([^/]+)$"), prompt = "Once upon a time", max_tokens = 400, temperature = 0,
        stream = true }) -- (greedy: it runs its 400 tokens, some seconds)
      local a = cl:post(url .. "/completions", long)
      local got = 0
      a.on_event = function() got = got + 1 end
      while got < 3 do cl:run(10) end
      assert.is_true(metric("loip_kv_tokens_reserved") > 0)
      -- the slot is taken: one waits in the queue, the next is refused
      local b = cl:post(url .. "/completions", long)
      -- (b is sent while the client runs: waited for until the server counts it queued)
      local deadline = core.now_ms() + 60000
      while metric("loip_queue_depth") ~= 1 and core.now_ms() < deadline do cl:run(10) end
      assert.are.equal(1, metric("loip_queue_depth"), "b waits in the queue")
      assert.is_nil(b.status, "b waits in the queue")
      local c = cl:post(url .. "/completions", long)
      while not c.status do cl:run(10) end
      assert.are.equal(429, c.status)
      assert.are.equal("1", c.headers["retry-after"])
      assert.matches("overloaded", c.body, 1, true)
      a:close()
      b:close()
      local freed = false
      deadline = core.now_ms() + 60000
      while core.now_ms() < deadline do
        if metric("loip_kv_tokens_reserved") == 0 and metric("loip_batch_size") == 0 and metric("loip_queue_depth") == 0 then
          freed = true
          break
        end
        C.loip_sleep_ms(50)
      end
      assert.is_true(freed, "the hung-up requests' slots and KV came back")
      -- on the device too: its pool is whole again (512 positions, 32 groups of 16)
      local t = cl:get(base .. "/metrics")
      while not t.status do cl:run(10) end
      assert.matches('loip_device_kv_free_tokens{device="1"} 512', t.body, 1, true)
      -- the kernels' prefetch distance the device opened with (no profile: the kernels' default)
      assert.matches('loip_kernels_prefetch_bytes{device="1"} 1024', t.body, 1, true)
      assert.is_true((metric("loip_requests_cancelled_total") or 0) >= 1)
      cl:close()
    end)
    stop()
    assert(ok, err)
  end)

  it("answers 503 to the requests still running when it stops (SIGTERM), and exits", function()
    local st = store_of(S260, "s260")
    local url, stop = serve(string.format("--model %s --devices 1 --threads 1 --link-delay 10ms --context 512 --max-batch 1", st))
    local cl = client.new()
    local t = cl:post(url .. "/completions", json.encode({ model = st:match("([^/]+)$"), prompt = "Once upon a time",
      max_tokens = 400, temperature = 0 }))
    -- (SIGTERM once the request runs: the server's batch holds it)
    local base = url:gsub("/v1$", "")
    local deadline, running = core.now_ms() + 60000, false
    while not running and core.now_ms() < deadline do
      local m = cl:get(base .. "/metrics")
      while cl.live[m] do cl:run(10) end
      running = (m.body or ""):match("\nloip_batch_size 1") ~= nil
    end
    assert.is_true(running, "the request runs")
    assert.is_nil(t.status, "still generating")
    stop()
    cl:wait(10000)
    cl:close()
    assert.are.equal(503, t.status)
    assert.matches("the server is stopping", t.body, 1, true)
  end)

  it("serves with a plan for fewer KV positions than its requests take, the online policy making room live", function()
    local st = store_of(S260, "s260")
    local m = loip.model.open(st, { threads = 1, context = 512 })
    local it = m:generate("Once upon a time", { temperature = 0, max_tokens = 200, stop = {} })
    local parts = {}
    for _, piece in it do parts[#parts + 1] = piece end
    local alone = table.concat(parts)
    m:close()
    local url, stop = serve(string.format("--model %s --devices 2 --mem 1000K,1000K --threads 1 --context 512 --max-batch 2 "
      .. "--step-tokens 16 --stages 3 --plan-positions 64", st))
    local ok, err = pcall(function()
      local cl = client.new()
      local name = st:match("([^/]+)$")
      local ts = {}
      for k = 1, 2 do
        ts[k] = cl:post(url .. "/completions", json.encode({ model = name, prompt = "Once upon a time", max_tokens = 200,
          temperature = 0 }))
      end
      cl:wait(120000)
      for k = 1, 2 do
        assert.are.equal(200, ts[k].status, ts[k].body)
        assert.are.equal(alone, json.decode(ts[k].body).choices[1].text)
      end
      local t = cl:get(url:gsub("/v1$", "") .. "/metrics")
      cl:wait(10000)
      assert.is_true(tonumber(t.body:match("\nloip_adaptations_total (%d+)")) >= 1)
      cl:close()
    end)
    stop()
    assert(ok, err)
  end)
end)
