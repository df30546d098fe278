-- Speculative decoding (docs/serving.md, "Speculative decoding"): drafts verified in one step give
-- exactly the model's output. Greedy: the tokens of no speculation (llama2.c's references) for
-- every draft policy, on one device and on three, with other requests in the batch, across a live
-- restage and a device loss. Sampling: a seeded request gives the same tokens with or without
-- drafts (verification draws from the sampler's own stream); the distribution over 2,000 seeds,
-- a chi-square test, is speculative_sampling_spec's.
local loip = require "loip"
local cluster = require "loip.cluster"
local json = require "loip.text.json"
local T = require "spec.support"
teardown(function() T.cleanup() end)
teardown(T.drop_stores)

local S260 = T.root .. "/models/stories260K"
local GGUF = T.root .. "/models/stories260K-gguf/stories260K.gguf"
local greedy = json.load(T.root .. "/models/stories260K/reference/greedy.json")

local function store() return T.slice_store(S260, "s260") end

-- Greedy tokens of prompt ids on model or cluster g (llama2.c stops at BOS).
local function run(g, ids, n, opts)
  local o = { max_tokens = n, sampler = { temperature = 0 }, stop = { [1] = true } }
  for k, v in pairs(opts or {}) do o[k] = v end
  local it, s = g:generate(ids, o)
  for _ in it do end
  return s.token_ids
end

local function prefix(ref, n)
  local out = {}
  for i = 1, math.min(n, #ref) do out[i] = ref[i] end
  return out
end

-- The draft policies a spec runs: with the draft length fixed, and chosen every step.
local DRAFTS = {
  { "ngram", 4 }, { "ngram" }, { "self", 4 }, { "self" }, { "self:layers=2", 3 },
  { "model:path=" .. GGUF, 4 },
}

describe("speculative decoding, greedy", function()
  it("gives llama2.c's tokens on one device for every draft policy and the 7 reference prompts", function()
    for _, d in ipairs(DRAFTS) do
      local m = loip.model.open(store(), { context = 256, threads = 1, draft = d[1], draft_tokens = d[2] })
      local drafted = 0
      for _, case in ipairs(greedy.cases) do
        assert.are.same(prefix(case.generated_ids, 120), run(m, case.prompt_ids, 120), d[1] .. " on " .. json.encode(case.prompt))
      end
      local r = m:batcher().draft:report()
      drafted = r.drafted
      assert.is_true(drafted > 0, d[1] .. " drafted nothing")
      if d[1] == "self" then assert.are.equal(r.drafted, r.accepted) end -- the whole model: every draft accepted
      if d[2] and d[1] == "self" then assert.is_true(r.tokens_per_step > 4, "k = 4, all accepted: " .. r.tokens_per_step) end
      m:close()
    end
  end)

  it("verifies each request's drafts in one step beside other requests and a prompt being prefilled", function()
    local m = loip.model.open(store(), { context = 256, threads = 1, max_batch = 3, batch = 16, draft = "self:layers=3", draft_tokens = 3 })
    local its, states = {}, {}
    for i = 1, 3 do
      its[i], states[i] = m:generate(greedy.cases[i + 1].prompt_ids, { max_tokens = 100, sampler = { temperature = 0 }, stop = { [1] = true } })
    end
    -- interleaved: one token of each at a time, the third joining late (its prompt chunked beside the others' drafts)
    local live = { true, true, false }
    local n = 0
    repeat
      local any = false
      for i = 1, 3 do
        if live[i] ~= nil and (live[i] or n >= 10) then
          live[i] = true
          if its[i]() == nil then live[i] = nil else any = true end
        end
      end
      n = n + 1
    until not any and live[3] == nil
    for i = 1, 3 do assert.are.same(prefix(greedy.cases[i + 1].generated_ids, 100), states[i].token_ids) end
    assert.is_true(m:batcher().draft:report().drafted > 0)
    m:close()
  end)

  it("gives the same tokens on 3 devices, for every draft policy, with another request in the batch", function()
    local c = cluster.start_local { store = store(), devices = 3, threads = 1 }
    local ok, err = pcall(function()
      for _, d in ipairs({ { "ngram", 3 }, { "self" }, { "self:layers=2", 4 }, { "model:path=" .. GGUF } }) do
        c:plan { context = 256, batch = 16, max_batch = 2, stages = 2, draft = loip.policy.load("draft", d[1]), draft_tokens = d[2] }
        local a, sa = c:generate(greedy.cases[2].prompt_ids, { max_tokens = 80, sampler = { temperature = 0 }, stop = { [1] = true } })
        local b, sb = c:generate(greedy.cases[5].prompt_ids, { max_tokens = 80, sampler = { temperature = 0 }, stop = { [1] = true } })
        local more = true
        while more do
          local x, y = a(), b()
          more = x ~= nil or y ~= nil
        end
        assert.are.same(prefix(greedy.cases[2].generated_ids, 80), sa.token_ids, d[1])
        assert.are.same(prefix(greedy.cases[5].generated_ids, 80), sb.token_ids, d[1])
        local r = c:batcher().draft:report()
        assert.is_true(r.drafted > 0, d[1] .. " drafted nothing")
        -- the last device counted what it verified
        local st = c:stats()
        assert.is_true((st[3].drafted or 0) >= r.drafted)
      end
    end)
    c:close()
    assert(ok, err)
  end)

  it("runs the draft on a device of the cluster, charged to its budget, which the scheduler plans with", function()
    local case = greedy.cases[4]
    local c = cluster.start_local { store = store(), devices = 3, threads = 1, mem = { "2M", "2M", "3M" } }
    local ok, err = pcall(function()
      local popts = { context = 256, batch = 16, stages = 2 }
      for _, d in ipairs({ { "self:layers=3,device=2", 2 }, { "model:device=auto,path=" .. GGUF, 3 } }) do
        popts.draft, popts.draft_tokens = d[1], 3
        c:plan(popts)
        assert.are.equal(d[2], c.draft_device, d[1])
        assert.is_true(c.draft_reserve > 0)
        assert.are.same(prefix(case.generated_ids, 60), run(c, case.prompt_ids, 60), d[1])
        assert.is_true(c:batcher().draft:report().drafted > 0)
        -- the device holds the draft's weights and KV cache in its budget, beside its part
        local st = c:stats()
        local part = require("loip.plan").memory(c.plan_table, d[2], c.sizes)
        assert.are.equal(c.draft_reserve, c:batcher().draft.ctx.drafter.bytes, d[1])
        assert.is_true(part.total <= 2 * 1024 * 1024 * (d[2] == 3 and 1.5 or 1) - c.draft_reserve, d[1])
        assert.is_true(st[d[2]].memory >= part.weights + c.draft_reserve, d[1])
        assert.is_true(st[d[2]].memory <= st[d[2]].budget_bytes)
        c:batcher().draft:close()
      end
      -- a budget that cannot hold the draft is refused, naming the device
      popts.draft = "model:device=1,path=" .. GGUF
      c.devices[1].mem = 900 * 1024
      local ok2, e2 = pcall(c.plan, c, popts)
      assert.is_false(ok2)
      assert.matches("--draft-device 1: device 1's budget of 900.0 KiB cannot hold the draft", tostring(e2), 1, true)
    end)
    c:close()
    assert(ok, err)
  end)

  it("adapts online as the KV cache grows, the drafts counted in it: the same tokens", function()
    local function gen(draft)
      local m = loip.model.open(store(), { threads = 1, mem = "1200K", context = 512, plan_positions = 32, online = "loip",
        draft = draft, draft_tokens = draft and 3 or nil })
      local ids = run(m, greedy.cases[2].prompt_ids, 300, { stop = {} })
      local n = #m:batcher().adaptations
      local r = m:batcher().draft and m:batcher().draft:report()
      m:close()
      return ids, n, r
    end
    local plain, n0 = gen(nil)
    local ids, n, r = gen("self:layers=3")
    assert.are.same(plain, ids)
    assert.is_true(n0 > 0 and n > 0, n0 .. " and " .. n .. " adaptations")
    assert.is_true(r.accepted > 0)
  end)

  it("keeps the tokens across a live restage and a lost device", function()
    local case = greedy.cases[3]
    local c = cluster.start_local { store = store(), devices = 3, threads = 1 }
    local ok, err = pcall(function()
      c:plan { context = 256, batch = 16, stages = 2, draft = "self", draft_tokens = 4 }
      local it, s = c:generate(case.prompt_ids, { max_tokens = 120, sampler = { temperature = 0 }, stop = { [1] = true } })
      local restaged, killed = false, false
      for _ in it do
        if #s.token_ids >= 20 and not restaged then c:restage(2, 1, 1) restaged = true end
        if #s.token_ids >= 50 and not killed then os.execute("kill -KILL " .. c.devices[2].pid) killed = true end
      end
      assert.are.same(prefix(case.generated_ids, 120), s.token_ids)
      assert.are.equal(1, #c.losses)
      assert.is_true(c:batcher().draft:report().accepted > 0)
    end)
    c:close()
    assert(ok, err)
  end)
end)

describe("speculative decoding's KV", function()
  it("drops the rejected rows: the groups past a sequence's position go back to the pool at its next step", function()
    local exec = require "loip.runtime.exec"
    local m = loip.model.open(store(), { context = 256, threads = 1 })
    local e = require("loip.engine.local").new(m)
    e:start(0, { id = 1, n_prompt = 0, prompt = {}, max_tokens = 0, sampler = {}, want_logits = true })
    local free0 = exec.session_kv_free_tokens(e.session)
    -- 40 positions (3 groups of 16), as a step verifying drafts up to position 39 leaves them
    local toks = {}
    for p = 0, 39 do toks[#toks + 1] = { seq = 0, pos = p, request = 1, id = 1 + p % 100, flags = 0 } end
    e:step(toks)
    assert.are.equal(free0 - 48, exec.session_kv_free_tokens(e.session))
    -- the drafts past position 20 rejected: the next step runs position 21 (two groups kept)
    e:step { { seq = 0, pos = 21, request = 1, id = 5, flags = 0 } }
    assert.are.equal(free0 - 32, exec.session_kv_free_tokens(e.session))
    -- and they are taken again as the sequence grows
    e:step { { seq = 0, pos = 33, request = 1, id = 5, flags = 0 } }
    assert.are.equal(free0 - 48, exec.session_kv_free_tokens(e.session))
    e:finish(0)
    assert.are.equal(free0, exec.session_kv_free_tokens(e.session))
    m:close()
  end)
end)

describe("speculative decoding, sampling", function()
  -- a prompt that repeats itself, so that ngram has something to propose from the start
  local seq = greedy.cases[2].generated_ids
  local PROMPT = { 1 }
  for i = 1, 30 do PROMPT[#PROMPT + 1] = seq[i] end
  for i = 10, 24 do PROMPT[#PROMPT + 1] = seq[i] end

  it("gives a seeded request the same tokens with and without drafts, run to run", function()
    local function tokens(draft, k)
      local m = loip.model.open(store(), { context = 256, threads = 1, draft = draft, draft_tokens = k })
      local all = {}
      for s = 1, 12 do
        local it, st = m:generate(PROMPT, { max_tokens = 40, sampler = { temperature = 0.9 }, seed = s, stop = {} })
        for _ in it do end
        all[s] = st.token_ids
      end
      m:close()
      return all
    end
    local none = tokens(nil)
    assert.are.same(none, tokens("self", 4))
    assert.are.same(none, tokens("self:layers=2"))
    assert.are.same(none, tokens("ngram", 2))
    assert.are.same(none, tokens("self:layers=3,tree=on")) -- (a best-first tree sized by the cost model)
    assert.are.same(none, tokens("self:layers=3,tree=on", 40))
    assert.are.same(tokens("ngram"), tokens("ngram"))
  end)
end)

describe("speculative decoding's flags", function()
  local function fails(args, want)
    local rc, out, err = T.run(T.loip .. " generate --model " .. store() .. " --max-tokens 4 " .. args)
    assert.are_not.equal(0, rc, out)
    assert.matches(want, err, 1, true)
  end

  it("refuses what does not go together, naming the flag", function()
    fails("--draft-tokens 3", "--draft-tokens needs --draft")
    fails("--draft self --draft-model " .. GGUF, "--draft-model is the model of --draft model (not --draft self)")
    fails("--draft nosuch", "draft 'nosuch': no such policy")
    fails("--draft self:layers=0", "layers")
    fails("--draft model", "draft model: which model? (--draft-model DIR")
    fails("--draft model --draft-model " .. T.root .. "/models/llama2-tiny-random-gguf",
      "its tokenizer is not the target's (32000 tokens against the target's 512)")
    fails("--draft self:layers=9", "layers 9: the model has 5 layers")
    fails("--draft self --draft-device 2", "--draft-device is for several devices (--devices or --hosts)")
    fails("--draft ngram --draft-device 2 --devices 2", "--draft-device is for --draft model or self (not --draft ngram)")
  end)

  it("reports the drafts in --json", function()
    local rc, out = T.run(T.loip .. " generate --model " .. store() .. " --prompt 'Once upon a time' --max-tokens 30 "
      .. "--temperature 0 --draft self --draft-tokens 4 --json")
    assert.are.equal(0, rc, out)
    local r = json.decode(out)
    assert.are.equal("self", r.draft.policy)
    assert.are.equal(r.draft.drafted, r.draft.accepted)
    assert.is_true(r.draft.tokens_per_step > 4)
    assert.are.same(prefix(greedy.cases[2].generated_ids, 30), r.token_ids)
  end)
end)
