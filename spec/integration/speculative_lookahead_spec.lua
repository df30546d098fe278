-- Drafts that need no second model (docs/serving.md, "Speculative decoding"): lookahead decoding
-- (the target's own guesses, LOIP_TOKF_PEEK, feeding a per-request n-gram pool) and ngram's pool
-- shared across requests. Exact: greedy tokens those of no drafts (llama2.c's references) on one
-- device and on 3, as trees and chains; a seeded sampled stream unchanged. The engine's PEEK
-- outputs are the argmax of the rows' logits; a second request drafts from a first's text.
local loip = require "loip"
local cluster = require "loip.cluster"
local json = require "loip.text.json"
local pool = require "loip.engine.request.ngram_pool"
local T = require "spec.support"
teardown(function() T.cleanup() end)
teardown(T.drop_stores)

local S260 = T.root .. "/models/stories260K"
local greedy = json.load(S260 .. "/reference/greedy.json")
local function store() return T.slice_store(S260, "s260") end

local function prefix(ref, n)
  local out = {}
  for i = 1, math.min(n, #ref) do out[i] = ref[i] end
  return out
end

local function run(b, ids, n, opts)
  local o = { prompt = ids, max_tokens = n, sampler = { temperature = 0 }, stop = { [1] = true } }
  for k, v in pairs(opts or {}) do o[k] = v end
  local r = b:submit(o)
  r:wait()
  return r.token_ids
end

describe("lookahead and shared n-gram drafts", function()
  after_each(function() collectgarbage() collectgarbage() end)

  it("give llama2.c's tokens on one device, the 7 reference prompts, as trees and chains", function()
    -- (size=auto, the default, and size=0, the draft length rule, are priced from the step times
    -- measured: they may turn themselves down here, where a step of many rows costs many single
    -- ones, the more so on a slow core or under a sanitizer: their tokens are checked, not that
    -- they drafted. The others draft a fixed size, so that they draft and are accepted anywhere.)
    for _, d in ipairs({ { "lookahead", auto = true }, { "lookahead:size=16" }, { "lookahead:tree=off,size=8" }, { "lookahead:size=0", auto = true },
      { "lookahead:n=5,window=3", 12 }, { "ngram:shared=on,tree=on", 4 }, { "ngram:shared=on", 4 } }) do
      pool.drop_shared()
      local m = loip.model.open(store(), { context = 256, threads = 1, draft = d[1], draft_tokens = d[2] })
      for _, case in ipairs(greedy.cases) do
        assert.are.same(prefix(case.generated_ids, 120), run(m:batcher(), case.prompt_ids, 120), d[1] .. " on " .. json.encode(case.prompt))
      end
      local r = m:batcher().draft:report()
      assert.is_true(d.auto or (r.drafted > 0 and r.accepted > 0), string.format("%s: %d of %d accepted", d[1], r.accepted, r.drafted))
      m:close()
    end
    pool.drop_shared()
  end)

  it("give the same tokens on 3 local devices, two requests in the batch", function()
    local c = cluster.start_local { store = store(), devices = 3, threads = 1 }
    local ok, err = pcall(function()
      for _, d in ipairs({ { "lookahead", 12 }, { "lookahead", auto = true }, { "lookahead:tree=off,size=6" }, { "ngram:shared=on,tree=on", 6 } }) do
        pool.drop_shared()
        local pol = loip.policy.load("draft", d[1])
        -- (the guesses the last device sent back: nodes off the accepted path with a token after them)
        local peeked, observe = 0, pol.module.observe
        if observe then
          pol.module.observe = function(req, ctx, o, info)
            local known = 0
            for j = 1, #info.ids do if info.next[j] ~= nil then known = known + 1 end end
            peeked = peeked + known - (#info.tokens - 1) -- (the path's nodes aside)
            return observe(req, ctx, o, info)
          end
        end
        finally(function() pol.module.observe = observe end)
        c:plan { context = 256, batch = 32, max_batch = 2, draft = pol, draft_tokens = d[2] }
        local b = c:batcher()
        local cases = { greedy.cases[3], greedy.cases[5] }
        local reqs = {}
        for k, cs in ipairs(cases) do
          reqs[k] = b:submit { prompt = cs.prompt_ids, max_tokens = 60, sampler = { temperature = 0 }, stop = { [1] = true } }
        end
        b:drain()
        for k, cs in ipairs(cases) do assert.are.same(prefix(cs.generated_ids, 60), reqs[k].token_ids, d[1]) end
        local r = b.draft:report()
        assert.is_true(d.auto or (r.drafted > 0 and r.accepted > 0), d[1])
        if observe and not d.auto then assert.is_true(peeked > 0, d[1] .. ": the last device's guesses came back") end
      end
    end)
    c:close()
    pool.drop_shared()
    assert(ok, err)
  end)

  it("leave a seeded sampled stream unchanged", function()
    local function tokens(draft, k)
      pool.drop_shared()
      local m = loip.model.open(store(), { context = 256, threads = 1, draft = draft, draft_tokens = k })
      local all = {}
      for s = 1, 6 do
        all[s] = run(m:batcher(), greedy.cases[2].prompt_ids, 60, { sampler = { temperature = 0.9 }, seed = s, stop = {} })
      end
      local acc = draft and m:batcher().draft:report().accepted
      m:close()
      return all, acc
    end
    local none = tokens(nil)
    -- (fixed sizes: on one device a step of many rows of this small model costs many, and
    -- size=auto would rarely draft)
    for _, d in ipairs({ "lookahead:size=16", "lookahead:tree=off,size=8", "ngram:shared=on,tree=on" }) do
      local got, acc = tokens(d, d:match("^ngram") and 4 or nil)
      assert.are.same(none, got, d)
      assert.is_true(acc > 0, d .. ": drafts were accepted")
    end
    pool.drop_shared()
  end)

  it("get back each draft row's argmax off the accepted path (PEEK), as the row's own logits say", function()
    local K = require("loip.core").constants.tokf
    local m = loip.model.open(S260, { threads = 1, context = 64, max_batch = 2 })
    local e = require("loip.engine.local").new(m)
    local P = greedy.cases[4].prompt_ids
    local n = #P
    -- sequence 0 samples greedily; sequence 1 returns logits (the same rows as chains)
    e:start(0, { id = 1, n_prompt = n, prompt = P, max_tokens = 8, sampler = { temperature = 0 }, seed = 0, n_sample = m.vocab or 512 })
    e:start(1, { id = 2, n_prompt = 0, prompt = {}, max_tokens = 0, sampler = {}, want_logits = true })
    for seq = 0, 1 do
      local toks = {}
      for i = 1, n - 1 do toks[i] = { seq = seq, pos = i - 1, request = seq + 1, id = P[i], flags = 0 } end
      e:step(toks)
    end
    -- the root (P's last token at n - 1), nodes 1 (301), 2 (302, under 1), 3 (303, under the root)
    local F = K.SAMPLE + K.DRAFT + K.TREE + K.PEEK
    local ids, parents = { 301, 302, 303 }, { 0, 1, 0 }
    local toks = { { seq = 0, pos = n - 1, request = 1, id = P[n], flags = K.SAMPLE } }
    for i, id in ipairs(ids) do toks[#toks + 1] = { seq = 0, pos = n - 1 + i, request = 1, id = id, flags = F, parent = i - parents[i] } end
    local outs = e:step(toks)
    local function argmax_of(path)
      local t = {}
      for j, id in ipairs(path) do t[j] = { seq = 1, pos = n - 2 + j, request = 2, id = id, flags = K.LOGITS } end
      local o = e:step(t)
      local row, best = o[#o].logits, 0
      for v = 1, e.vocab - 1 do if row[v] > row[best] then best = v end end
      return best
    end
    -- the tokens: the root's argmax, no draft accepted (301 is not it, nor 303)
    local first = argmax_of { P[n] }
    assert.are_not.equal(301, first)
    assert.are_not.equal(303, first)
    assert.are.equal(4, #outs)
    assert.are.equal(first, outs[1].id)
    assert.are.equal(0, bit.band(outs[1].flags, K.PEEK))
    for j, path in ipairs({ { P[n], 301 }, { P[n], 301, 302 }, { P[n], 303 } }) do
      assert.are_not.equal(0, bit.band(outs[j + 1].flags, K.PEEK))
      assert.are.equal(argmax_of(path), outs[j + 1].id, "node " .. j)
    end
    m:close()
  end)

  it("share ngram's pool across requests: a second request drafts from the first's text", function()
    local case = greedy.cases[2]
    local text = case.generated_ids
    -- the second request asks again (an agent repeating itself): its text is the first's, which
    -- its own tokens cannot draft until they repeat
    local P2 = case.prompt_ids
    local function second(draft)
      pool.drop_shared()
      local m = loip.model.open(store(), { context = 256, threads = 1, draft = draft, draft_tokens = 4 })
      local b = m:batcher()
      assert.are.same(prefix(text, 80), run(b, case.prompt_ids, 80))
      local before = b.draft:report()
      local plain = loip.model.open(store(), { context = 256, threads = 1 })
      local want = run(plain:batcher(), P2, 40)
      plain:close()
      assert.are.same(want, run(b, P2, 40), draft)
      local after = b.draft:report()
      m:close()
      return after.accepted - before.accepted, after.drafted - before.drafted
    end
    local own = second("ngram")
    local shared, drafted = second("ngram:shared=on")
    assert.is_true(drafted > 0)
    assert.is_true(shared > own + 5, string.format("the second request accepted %d drafts with the shared pool, %d without", shared, own))
    pool.drop_shared()
  end)
end)
