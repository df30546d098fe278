-- `loip serve --draft` (speculative decoding, docs/serving.md): the official OpenAI client's
-- greedy texts, streamed and not, equal those of a server without drafts, on one device and on a
-- cluster, with drafts accepted; a stream sends every token as its own chunk, as the step that
-- accepted it delivers it (several a step, none held back to the end); /metrics counts the drafts
-- and their acceptance (per verifying step, per request) and /health reports them; the Perfetto
-- trace (`loip generate --trace`, `loip serve --trace`) has a span per proposal and per
-- verifying step on its head process.
local json = require "loip.text.json"
local core = require "loip.core"
local client = require "loip.runtime.http_client"
local loip = require "loip"
local T = require "spec.support"
teardown(function() T.cleanup() end)
teardown(T.drop_stores)
after_each(T.stop_servers)

local S260 = T.root .. "/models/stories260K"
local STORY = "Lily went to the park. Lily went to the park. Lily went to the park. Lily went"

local chat_template = T.chat_template

-- tests/openai/draft.mjs against a server started with args: its answers, /metrics, /health.
local function drive(args, name)
  local url, stop = T.serve(args)
  local ok, r = pcall(function()
    local rc, out, err = T.run(string.format("node %s/tests/openai/draft.mjs %s key %s", T.root, url, name))
    assert.are.equal(0, rc, err)
    local cl = client.new()
    local m = cl:get(url:gsub("/v1$", "") .. "/metrics")
    local h = cl:get(url:gsub("/v1$", "") .. "/health")
    cl:wait(10000)
    cl:close()
    return { answers = assert(json.decode(out), out), metrics = m.body, health = json.decode(h.body) }
  end)
  stop()
  assert(ok, r)
  return r
end

local function metric(text, name) return tonumber(text:match("\n" .. name:gsub("[%[%]{}\"+.]", "%%%0") .. " ([%d.e+-]+)")) end

-- The same texts, finish reasons, usage and streamed pieces as the server without drafts.
local function same_answers(base, got)
  for _, k in ipairs({ "chat", "chat_stream", "repeat", "repeat_stream", "once", "once_stream" }) do
    assert.are.equal(base[k].text, got[k].text, k)
    assert.are.equal(base[k].finish, got[k].finish, k)
    assert.are.same(base[k].usage, got[k].usage, k)
    if k:match("_stream$") then
      -- every token its own chunk: drafting merges none (one piece a token, as without drafts)
      assert.are.same(base[k].pieces, got[k].pieces, k)
      assert.are.equal(got[k].usage.completion_tokens, #got[k].pieces, k)
    end
  end
end

-- The draft figures on /metrics agree with each other and with /health's.
local function check_metrics(text, health)
  local drafted, accepted, steps = metric(text, "loip_draft_tokens_total"), metric(text, "loip_draft_accepted_total"),
    metric(text, "loip_draft_steps_total")
  assert.is_true(accepted > 0, "drafts were accepted:\n" .. text)
  assert.is_true(drafted > accepted)
  -- accepted drafts per verifying step: buckets 0..8 and +Inf, as many as steps, summing to the accepted
  local last = -1
  for b = 0, 8 do
    local n = metric(text, string.format('loip_draft_accepted_per_step_bucket{le="%d"}', b))
    assert.is_true(n >= last, "cumulative buckets")
    last = n
  end
  assert.are.equal(steps, metric(text, 'loip_draft_accepted_per_step_bucket{le="+Inf"}'))
  assert.are.equal(steps, metric(text, "loip_draft_accepted_per_step_count"))
  assert.are.equal(accepted, metric(text, "loip_draft_accepted_per_step_sum"))
  -- per request at its end: the 6 requests drafted, each accepting some fraction
  assert.are.equal(6, metric(text, 'loip_draft_request_acceptance_bucket{le="+Inf"}'))
  assert.are.equal(metric(text, 'loip_draft_request_acceptance_bucket{le="1"}'), 6)
  assert.is_true(metric(text, "loip_draft_request_acceptance_sum") > 0)
  assert.are.equal("ngram", health.draft.policy)
  assert.are.equal(drafted, health.draft.drafted)
  assert.are.equal(accepted, health.draft.accepted)
end

-- The head's draft and verify spans of a Chrome trace file: { draft = {...}, verify = {...} }.
local function head_spans(path)
  local t = assert(json.load(path))
  local out, named = { draft = {}, verify = {} }, false
  for _, e in ipairs(t.traceEvents) do
    if e.ph == "M" and e.pid == 0 and e.name == "process_name" then named = e.args.name == "head" end
    if e.ph == "X" and e.pid == 0 then table.insert(out[e.cat], e) end
  end
  assert.is_true(named, "the head process is named")
  return out
end

describe("loip serve --draft", function()
  it("gives the OpenAI client the texts it gives without drafts, token by token, and counts the drafts on /metrics", function()
    local missing = T.npm_missing()
    if missing then pending(missing) return end
    local tmpl = chat_template()
    local base = drive(string.format("--model %s --chat-template %s --max-batch 2", S260, tmpl), "stories260K")
    assert.is_nil(base.health.draft)
    assert.is_nil(metric(base.metrics, "loip_draft_tokens_total"))
    local got = drive(string.format("--model %s --chat-template %s --max-batch 2 --draft ngram --draft-tokens 4", S260, tmpl),
      "stories260K")
    same_answers(base.answers, got.answers)
    check_metrics(got.metrics, got.health)
    -- on 2 devices (3 drafts a step: the length chosen from measured times may turn drafting
    -- down on a busy machine), a trace written when it stops
    local st = T.slice_store(S260, "s260")
    local trace = T.tmpdir() .. "/serve.json"
    local c = drive(string.format("--model %s --devices 2 --threads 1 --context 256 --chat-template %s --max-batch 2 "
      .. "--draft ngram --draft-tokens 3 --trace %s", st, tmpl, trace), st:match("([^/]+)$"))
    same_answers(base.answers, c.answers)
    assert.is_true(metric(c.metrics, "loip_draft_accepted_total") > 0)
    local spans = head_spans(trace)
    local accepted = 0
    for _, e in ipairs(spans.verify) do accepted = accepted + e.args.accepted end
    assert.are.equal(metric(c.metrics, "loip_draft_accepted_total"), accepted)
  end)

  it("streams the tokens a verifying step accepts as it delivers them, before the request ends", function()
    local m = loip.model.open(S260, { threads = 1, context = 256, draft = require("loip.policy").load("draft", "ngram"),
      draft_tokens = 4 })
    local srv = require("loip.serve.server").new { model = m, tokenizer = m.tokenizer, dir = S260, name = "s", port = 0, quiet = true }
    local cl = client.new()
    local ok, err = pcall(function()
      local t = cl:post(string.format("http://127.0.0.1:%d/v1/completions", srv.port),
        json.encode({ model = "s", prompt = STORY, max_tokens = 60, temperature = 0, stream = true }))
      local events, before_end = 0, 0
      t.on_event = function(_, data) if data ~= "[DONE]" then events = events + 1 end end
      local steps_with_drafts = 0
      local last_accepted = 0
      while cl:busy() do
        srv:turn(5)
        local accepted = srv.batcher.draft:report().accepted
        if accepted > last_accepted then steps_with_drafts, last_accepted = steps_with_drafts + 1, accepted end
        local _, a = next(srv.active)
        if a then
          -- while it runs (no turn meanwhile): the client gets every chunk sent so far
          local t0 = core.now_ms()
          while events < #a.parts and core.now_ms() - t0 < 10000 do cl:run(5) end
          assert.are.equal(#a.parts, events)
          before_end = events
        else
          cl:run(5)
        end
      end
      assert.are.equal(200, t.status)
      assert.is_true(steps_with_drafts > 0, "some step accepted drafts")
      -- 60 tokens, a chunk each (and the last chunk); all but the last step's while it ran
      assert.are.equal(61, events)
      assert.is_true(before_end >= 50, before_end .. " chunks before the end")
    end)
    cl:close()
    srv:close()
    m:close()
    assert(ok, err)
  end)

  it("draws the drafts and the verifying steps on the trace's head process (loip generate --trace)", function()
    local st = T.slice_store(S260, "s260")
    for _, devices in ipairs({ "", "--devices 2 --threads 1" }) do
      local path = T.tmpdir() .. "/trace.json"
      local rc, out, err = T.run(string.format("%s generate --model %s %s --prompt '%s' --max-tokens 60 --temperature 0 "
        .. "--draft ngram --draft-tokens 4 --trace %s --json", T.loip, st, devices, STORY, path))
      assert.are.equal(0, rc, err)
      local d = json.decode(out).draft
      assert.is_true(d.accepted > 0)
      local spans = head_spans(path)
      assert.are.equal(d.steps, #spans.verify)
      local drafted, accepted = 0, 0
      for _, e in ipairs(spans.verify) do
        assert.are.equal(e.args.rows, 1 + e.args.drafted) -- (one request: its token and its drafts)
        drafted, accepted = drafted + e.args.drafted, accepted + e.args.accepted
      end
      assert.are.equal(d.drafted, drafted)
      assert.are.equal(d.accepted, accepted)
      -- a proposal a step (k fixed: no probes); those that found nothing sent nothing
      local proposed = 0
      for _, e in ipairs(spans.draft) do
        assert.is_true(e.args.k >= 1 and e.args.k <= 4)
        assert.is_nil(e.args.probe)
        if e.args.proposed > 0 then proposed = proposed + 1 end
      end
      assert.are.equal(d.steps, proposed)
      -- `loip trace plot` draws the head's lanes
      local svg = path:gsub("json$", "svg")
      require("loip.engine.trace").plot(path, svg)
      local drawn = T.read(svg)
      assert.matches(">head<", drawn, 1, true)
      assert.matches(">verify<", drawn, 1, true)
    end
  end)
end)
