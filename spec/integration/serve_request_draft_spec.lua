-- Drafts per request (docs/serving.md, "Drafts per request"): an API request's `draft` and
-- `draft_tokens` choose its own speculative decoding where `loip serve --draft-per-request`
-- allows it, with the tokens of no draft (greedy, and a seeded sampled stream), its drafts on
-- /metrics by policy; what the server does not allow is refused (400, the field named, what it
-- allows said); /metrics and `loip generate --json` report the tree size chosen, tokens per
-- verifying step and the draft's share of step time.
local json = require "loip.text.json"
local client = require "loip.runtime.http_client"
local T = require "spec.support"
teardown(function() T.cleanup() end)
teardown(T.drop_stores)
after_each(T.stop_servers)

local S260 = T.root .. "/models/stories260K"
local STORY = "Lily went to the park. Lily went to the park. Lily went to the park. Lily went"

local chat_template = T.chat_template

-- POST each body (to path, default /completions) and GET /metrics after them: { status, body
-- (decoded) } each, and the metrics' text.
local function ask(url, bodies)
  local cl = client.new()
  local out = {}
  for i, b in ipairs(bodies) do
    local path = b.path or "/completions"
    b.path = nil
    local t = cl:post(url .. path, json.encode(b), { ["x-api-key"] = "k" })
    cl:wait(120000)
    out[i] = { status = t.status, body = json.decode(t.body) or t.body }
  end
  local m = cl:get(url:gsub("/v1$", "") .. "/metrics")
  cl:wait(10000)
  cl:close()
  return out, m.body
end

local function metric(text, name) return tonumber(text:match("\n" .. name:gsub("[%[%]{}\"+.]", "%%%0") .. " ([%d.e+-]+)")) end

local function completion(extra)
  local b = { model = "M", prompt = STORY, max_tokens = 40, temperature = 0 }
  for k, v in pairs(extra or {}) do b[k] = v end
  return b
end

describe("loip serve --draft-per-request", function()
  it("lets a request choose its drafts, with the tokens of no draft, and refuses what the server does not allow by name", function()
    local st = T.slice_store(S260, "s260rd")
    local name = st:match("([^/]+)$")
    local function body(extra)
      local b = completion(extra)
      b.model = name
      return b
    end
    local sampled = { temperature = 0.8, seed = 7 }
    -- without drafts (and, by default, no request may choose any: refused naming the field)
    local url, stop = T.serve(string.format("--model %s --max-batch 2", st))
    local base = ask(url, { body(), body(sampled), body({ draft = "ngram" }) })
    stop()
    assert.are.equal(200, base[1].status, json.encode(base[1].body))
    assert.are.equal(400, base[3].status)
    assert.are.equal("draft", base[3].body.error.param)
    assert.matches("lets no request choose its drafts", base[3].body.error.message, 1, true)
    assert.matches("--draft-per-request", base[3].body.error.message, 1, true)
    -- a server with a self draft of 2 layers, letting requests choose none, ngram and self's settings
    local tmpl = chat_template()
    url, stop = T.serve(string.format("--model %s --max-batch 2 --chat-template %s --draft self:layers=2 --draft-tokens 4 "
      .. "--draft-per-request none,ngram,self", st, tmpl))
    local got, metrics = ask(url, {
      body({ draft = "ngram" }), body({ draft = "none" }), body({ draft = "self:tree=on,width=2,levels=2", draft_tokens = 4 }),
      body({ draft = "ngram", seed = 7, temperature = 0.8 }),
      body({ draft = "model" }), body({ draft = "self:layers=3" }), body({ draft = "ngram", draft_tokens = 9 }),
      body({ draft = 3 }),
      { path = "/messages", model = name, max_tokens = 8, messages = { { role = "user", content = "hi" } }, draft = "model" },
    })
    stop()
    for i = 1, 4 do assert.are.equal(200, got[i].status, json.encode(got[i].body)) end
    -- greedy: the tokens of no draft, whatever the request chose; seeded sampling: the same stream
    for i = 1, 3 do assert.are.equal(base[1].body.choices[1].text, got[i].body.choices[1].text, i) end
    assert.are.equal(base[2].body.choices[1].text, got[4].body.choices[1].text)
    -- refused, the field named, what the server allows said
    local function refused(r, param, words)
      assert.are.equal(400, r.status, json.encode(r.body))
      local e = r.body.error
      if e.param ~= nil then assert.are.equal(param, e.param) end
      assert.matches(words, e.message, 1, true)
    end
    refused(got[5], "draft", "model is not allowed; this server (--draft self:layers=2) lets a request choose: none, ngram, self")
    refused(got[6], "draft", "layers=3 needs a draft the server has not loaded (it runs self:layers=2); a request may change build, children, levels, rounds, tree, width")
    refused(got[7], "draft_tokens", "'draft_tokens' is 9; this server verifies at most 4")
    refused(got[8], "draft", "'draft' must be a string")
    refused(got[9], "draft", "model is not allowed")
    -- the ngram requests' drafts, by policy: drafted and accepted (the story repeats)
    assert.is_true(metric(metrics, 'loip_draft_policy_tokens_total{policy="ngram"}') > 0, metrics)
    assert.is_true(metric(metrics, 'loip_draft_policy_accepted_total{policy="ngram"}') > 0, metrics)
    assert.is_true(metric(metrics, 'loip_draft_policy_steps_total{policy="self"}') > 0, metrics)
    assert.is_nil(metric(metrics, 'loip_draft_policy_tokens_total{policy="none"}'))
    -- the tree size chosen, tokens per verifying step, the draft's share of step time
    local steps = metric(metrics, "loip_draft_steps_total")
    assert.are.equal(steps, metric(metrics, "loip_draft_tree_size_count"))
    assert.are.equal(metric(metrics, "loip_draft_tokens_total"), metric(metrics, "loip_draft_tree_size_sum"))
    -- each size chosen for a best-first tree (the request's fixed draft_tokens, 4)
    local chosen = metric(metrics, "loip_draft_tree_chosen_count")
    assert.is_true(chosen > 0, metrics)
    assert.are.equal(4 * chosen, metric(metrics, "loip_draft_tree_chosen_sum"))
    assert.is_true(metric(metrics, "loip_draft_tokens_per_step") > 1)
    local share = metric(metrics, "loip_draft_step_share")
    assert.is_true(share > 0 and share < 1, tostring(share))
    assert.is_true(metric(metrics, "loip_draft_propose_ms_total") > 0)
  end)

  it("refuses at start a list naming a draft the server has not loaded", function()
    local rc, _, err = T.run(string.format("%s serve --model %s --port 0 --draft ngram --draft-per-request ngram,self", T.loip, S260))
    assert.are_not.equal(0, rc)
    assert.matches("--draft-per-request: self loads a draft of its own; the server has loaded ngram", err, 1, true)
    rc, _, err = T.run(string.format("%s serve --model %s --port 0 --draft-per-request ngram", T.loip, S260))
    assert.are_not.equal(0, rc)
    assert.matches("--draft-per-request: needs --draft", err, 1, true)
  end)
end)

describe("loip serve --draft-per-request and the official OpenAI client", function()
  it("sends a request's draft as the client sends any field: the texts of no draft, a refusal it raises with the field", function()
    local missing = T.npm_missing()
    if missing then pending(missing) return end
    local function drive(args, mode)
      local url, stop = T.serve(string.format("--model %s --chat-template %s %s", S260, chat_template(), args))
      local rc, out, err = T.run(string.format("node %s/tests/openai/request_draft.mjs %s key stories260K %s", T.root, url, mode or ""))
      stop()
      assert.are.equal(0, rc, err)
      return assert(json.decode(out), out)
    end
    local base = drive("", "plain")
    local got = drive("--draft ngram:n=2 --draft-tokens 4 --draft-per-request none,ngram")
    assert.are.equal(base.completion, got.completion)
    assert.are.equal(base.chat, got.chat)
    assert.are.equal(base.completion, got.stream)
    assert.is_true(#got.completion > 0)
    -- a server without --draft-per-request refuses the field; this one refuses a draft it has not
    -- loaded: the client's BadRequestError carries the status, the field and the message
    assert.are.equal(400, got.refused.status)
    assert.are.equal("draft", got.refused.param)
    assert.are.equal("draft_not_allowed", got.refused.code)
    assert.matches("model is not allowed; this server (--draft ngram:n=2) lets a request choose: none, ngram", got.refused.message, 1, true)
    assert.are.equal(400, base.refused.status)
    assert.matches("lets no request choose its drafts", base.refused.message, 1, true)
  end)
end)

describe("loip generate --json --draft", function()
  it("reports the tree size chosen, tokens per verifying step and the draft's share of step time", function()
    local rc, out, err = T.run(string.format("%s generate --model %s --prompt '%s' --max-tokens 40 --temperature 0 --threads 1 "
      .. "--draft ngram:tree=on --draft-tokens 6 --json", T.loip, S260, STORY))
    assert.are.equal(0, rc, err)
    local d = json.decode(out).draft
    assert.is_true(d.tree)
    assert.is_true(d.steps > 0)
    assert.is_true(math.abs(d.drafted / d.steps - d.tree_size) < 1e-9)
    assert.is_true(d.tree_size_max >= 1 and d.tree_size_max <= 6)
    assert.is_true(d.tokens_per_step > 1)
    assert.is_true(d.draft_share > 0 and d.draft_share < 1, tostring(d.draft_share))
    assert.is_true(d.step_ms > 0)
  end)
end)
