-- Speculative decoding's tree mode (loip.engine.request.tree): a tree of drafts verified in one step
-- gives exactly the tokens of no speculation (greedy), in-process and on 3 local devices, with
-- another request in the batch, and sampling the tokens of no speculation for a seeded request,
-- for trees of up to 500 nodes (the mask's several words) as for small ones;
-- a tree node's logits are those of its path run as a chain.
local loip = require "loip"
local cluster = require "loip.cluster"
local json = require "loip.text.json"
local T = require "spec.support"
teardown(function() T.cleanup() end)

local S260 = T.root .. "/models/stories260K"
local greedy = assert(json.load(S260 .. "/reference/greedy.json"))
teardown(T.drop_stores)

local DRAFT = "self:layers=3,tree=on,width=3,levels=2"

-- run.c's continuation of case c, n tokens of it (run.c stops at BOS, id 1)
local function expected(c, n)
  local out = {}
  for i = 1, math.min(n, #c.generated_ids) do out[i] = c.generated_ids[i] end
  return out
end

-- The requests' tokens, each checked against run.c; the drafts' figures.
local function check(reqs, cases, n, b, chain, sized)
  local refed = 0
  for k, r in ipairs(reqs) do
    assert.are.same(expected(cases[k], n), r.token_ids)
    refed = refed + (r.refed or 0)
  end
  local d = b.draft:report()
  -- (a size the cost model chose may be 0 all along where a step's rows cost: its tokens still checked)
  assert.is_true(sized or (d.steps > 0 and d.accepted > 0), "trees were verified and drafts accepted")
  -- a path through a branch other than the first: its tokens were fed again, and still exact
  assert.is_true(chain or refed > 0, "an accepted path left the first branch")
  return d
end

describe("speculative decoding, tree mode", function()
  after_each(function() collectgarbage() collectgarbage() end)

  it("gives exactly the greedy tokens in-process, two requests in the batch", function()
    local st = T.slice_store(S260, "s260")
    local m = loip.model.open(st, { threads = 1, context = 256, max_batch = 2, draft = DRAFT, draft_tokens = 6 })
    local cases = { greedy.cases[2], greedy.cases[4] }
    local b = m:batcher()
    local reqs = {}
    for k, c in ipairs(cases) do
      reqs[k] = b:submit { prompt = c.prompt_ids, max_tokens = 40, sampler = { temperature = 0 }, stop = { [1] = true } }
    end
    b:drain()
    local d = check(reqs, cases, 40, b)
    assert.is_true(d.tokens_per_step > 1)
    assert.are.equal(0, b.kv_used)
    -- sampling: a seeded request gives the tokens it gives with no drafts (one draw a token)
    local plain = loip.model.open(st, { threads = 1, context = 256, max_batch = 2 })
    local function sampled(model, seed)
      local r = model:batcher():submit { prompt = cases[1].prompt_ids, max_tokens = 40, sampler = { temperature = 0.9 }, seed = seed }
      model:batcher():drain()
      return r
    end
    local accepted = b.draft:report().accepted
    for seed = 1, 3 do
      local r = sampled(m, seed)
      assert.are.same(sampled(plain, seed).token_ids, r.token_ids)
    end
    assert.is_true(b.draft:report().accepted > accepted, "sampled trees accepted drafts")
    plain:close()
    m:close()
  end)

  it("gives exactly the greedy tokens on 3 local devices, two requests in the batch", function()
    local st = T.slice_store(S260, "s260")
    local c = cluster.start_local { store = st, devices = 3, threads = 1 }
    local ok, err = pcall(function()
      c:plan { context = 256, batch = 32, max_batch = 2, draft = DRAFT, draft_tokens = 6 }
      local b = c:batcher()
      local cases = { greedy.cases[3], greedy.cases[5] }
      local reqs = {}
      for k, cs in ipairs(cases) do
        reqs[k] = b:submit { prompt = cs.prompt_ids, max_tokens = 40, sampler = { temperature = 0 }, stop = { [1] = true } }
      end
      b:drain()
      check(reqs, cases, 40, b)
    end)
    c:close()
    assert(ok, err)
  end)

  -- best-first trees (build=best, the default) of every size, and sized by the cost model
  it("gives exactly the greedy tokens with best-first trees of every size and sized by the cost model", function()
    local st = T.slice_store(S260, "s260")
    local cases = { greedy.cases[2], greedy.cases[4] }
    for _, k in ipairs({ 1, 7, 23, 63, false }) do
      local m = loip.model.open(st, { threads = 1, context = 256, max_batch = 2, draft = "self:layers=3,tree=on",
        draft_tokens = k or nil })
      local b = m:batcher()
      local reqs = {}
      for j, c in ipairs(cases) do
        reqs[j] = b:submit { prompt = c.prompt_ids, max_tokens = 40, sampler = { temperature = 0 }, stop = { [1] = true } }
      end
      b:drain()
      local d = check(reqs, cases, 40, b, not k or k == 1, not k) -- (sized by timing: it may not branch)
      -- (a fixed size: that many nodes, where the step's rows, shared by two requests, hold them)
      if k then assert.is_true(d.tree_size_max <= k and d.tree_size_max >= math.min(k, 23), k .. ": " .. d.tree_size_max) end
      if k == 63 then assert.is_true(d.tokens_per_step > 1.5, "63 nodes: " .. d.tokens_per_step .. " tokens a step") end
      m:close()
    end
  end)

  it("gives exactly the greedy tokens on 3 local devices with trees of 63 nodes and sized by the cost model", function()
    local st = T.slice_store(S260, "s260")
    local c = cluster.start_local { store = st, devices = 3, threads = 1 }
    local ok, err = pcall(function()
      for _, k in ipairs({ 63, false }) do
        c:plan { context = 256, batch = 64, max_batch = 2, draft = "self:layers=3,tree=on", draft_tokens = k or nil }
        -- (nothing offloaded, memory to spare: the tree's rows are reserved)
        assert.are.equal(k or 64, c.planner.draft_rows)
        local b = c:batcher()
        local cases = { greedy.cases[3], greedy.cases[5] }
        local reqs = {}
        for j, cs in ipairs(cases) do
          reqs[j] = b:submit { prompt = cs.prompt_ids, max_tokens = 40, sampler = { temperature = 0 }, stop = { [1] = true } }
        end
        b:drain()
        local d = check(reqs, cases, 40, b, not k, not k)
        if k then assert.is_true(d.tree_size_max > 31, "two requests' trees share the step's rows: " .. d.tree_size_max) end
      end
    end)
    c:close()
    assert(ok, err)
  end)

  -- trees past the mask's first word (64 positions past the root): 63, 64, 65, 200 and 500 nodes
  -- in steps of 512 rows, the first step's tree that size (a prompt of 5: 500 nodes fit the context)
  local BIG = { 63, 64, 65, 200, 500 }
  local function one_request(b, cs)
    local r = b:submit { prompt = cs.prompt_ids, max_tokens = 40, sampler = { temperature = 0 }, stop = { [1] = true } }
    b:drain()
    return r
  end

  it("gives exactly the greedy tokens in-process with trees of 63, 64, 65, 200 and 500 nodes, and the seeded stream", function()
    local st = T.slice_store(S260, "s260")
    local cs = greedy.cases[2]
    for _, k in ipairs(BIG) do
      local m = loip.model.open(st, { threads = 1, context = 512, batch = 512, draft = "self:layers=3,tree=on", draft_tokens = k })
      local b = m:batcher()
      local r = one_request(b, cs)
      local d = check({ r }, { cs }, 40, b, true)
      assert.are.equal(k, d.tree_size_max, k .. " nodes sent in a step")
      if k == 200 then
        local plain = loip.model.open(st, { threads = 1, context = 512 })
        for seed = 1, 2 do
          local function sampled(model)
            local x = model:batcher():submit { prompt = cs.prompt_ids, max_tokens = 40, sampler = { temperature = 0.9 }, seed = seed }
            model:batcher():drain()
            return x.token_ids
          end
          assert.are.same(sampled(plain), sampled(m), "seed " .. seed)
        end
        plain:close()
      end
      m:close()
    end
    -- a fixed size past what a tree holds is refused, naming the flag
    local m = loip.model.open(st, { threads = 1, context = 512, batch = 512, draft = "self:layers=3,tree=on", draft_tokens = 513 })
    local ok, err = pcall(m.batcher, m)
    assert.is_false(ok)
    assert.matches("--draft-tokens (draft_tokens): 513 nodes, more than a tree of drafts holds (512", tostring(err), 1, true)
    m:close()
  end)

  it("gives exactly the greedy tokens on 3 local devices with trees of 63, 64, 65, 200 and 500 nodes; sized up to 512", function()
    local st = T.slice_store(S260, "s260")
    local tree = require "loip.engine.request.tree"
    local c = cluster.start_local { store = st, devices = 3, threads = 1 }
    local ok, err = pcall(function()
      local cs = greedy.cases[3]
      for _, k in ipairs(BIG) do
        c:plan { context = 512, batch = 512, draft = "self:layers=3,tree=on", draft_tokens = k }
        local b = c:batcher()
        local d = check({ one_request(b, cs) }, { cs }, 40, b, true)
        assert.are.equal(k, d.tree_size_max, k .. " nodes sent in a step")
      end
      -- sized by the cost model with no --step-tokens: memory to spare, the plan reserves a tree of
      -- 512 rows and its steps grow to hold it (at most the context)
      c:plan { context = 512, draft = "self:layers=3,tree=on" }
      assert.are.equal(tree.MAX, c.planner.draft_rows)
      assert.are.equal(512, c.planner.batch)
      local b = c:batcher()
      check({ one_request(b, cs) }, { cs }, 40, b, true, true)
      -- a --step-tokens given caps the rows reserved
      c:plan { context = 512, batch = 100, draft = "self:layers=3,tree=on" }
      assert.are.equal(100, c.planner.draft_rows)
      assert.are.equal(100, c.planner.batch)
    end)
    c:close()
    assert(ok, err)
  end)

  it("gives a tree node the logits of its path run as a chain", function()
    local LOGITS = require("loip.core").constants.tokf.LOGITS
    local m = loip.model.open(S260, { threads = 1, context = 64, max_batch = 2 })
    local e = require("loip.engine.local").new(m)
    local P = greedy.cases[4].prompt_ids
    local n = #P
    for seq = 0, 1 do
      e:start(seq, { id = seq + 1, n_prompt = 0, prompt = {}, max_tokens = 0, sampler = {}, want_logits = true })
      local toks = {}
      for i, id in ipairs(P) do toks[i] = { seq = seq, pos = i - 1, request = seq + 1, id = id, flags = 0 } end
      e:step(toks)
    end
    -- sequence 0: a tree after the root (token 300 at n): nodes 1 (301) and 2 (302, under 1),
    -- 3 (303, under the root), 4 (304, under 3), 5 (305, under 4)
    local ids, parents = { 301, 302, 303, 304, 305 }, { 0, 1, 0, 3, 4 }
    local toks = { { seq = 0, pos = n, request = 1, id = 300, flags = LOGITS } }
    for i, id in ipairs(ids) do
      toks[#toks + 1] = { seq = 0, pos = n + i, request = 1, id = id, flags = LOGITS, parent = i - parents[i] }
    end
    local V = e.vocab
    local function rows(outs)
      local got = {}
      for i, o in ipairs(outs) do
        got[i] = {}
        for v = 0, V - 1 do got[i][v + 1] = o.logits[v] end
      end
      return got
    end
    local tree = rows(e:step(toks))
    -- sequence 1: the path root, 3, 4, 5 as a chain, then (positions written over) root, 1, 2
    local function chain(path)
      local t = {}
      for j, id in ipairs(path) do t[j] = { seq = 1, pos = n + j - 1, request = 2, id = id, flags = LOGITS } end
      return rows(e:step(t))
    end
    local function near(a, b, what)
      local worst = 0
      for v = 1, V do worst = math.max(worst, math.abs(a[v] - b[v])) end
      assert.is_true(worst <= 1e-5, string.format("%s: logits differ by %g", what, worst))
    end
    local c1 = chain { 300, 303, 304, 305 }
    near(tree[1], c1[1], "the root")
    near(tree[4], c1[2], "node 3")
    near(tree[5], c1[3], "node 4")
    near(tree[6], c1[4], "node 5")
    local c2 = chain { 300, 301, 302 }
    near(tree[2], c2[2], "node 1")
    near(tree[3], c2[3], "node 2")
    -- a parent that is not an earlier row of the sequence is refused, naming the row
    local ok, err = pcall(e.step, e, { { seq = 0, pos = n, request = 1, id = 300, flags = LOGITS, parent = 1 } })
    assert.is_false(ok)
    assert.matches("names as its parent", tostring(err), 1, true)
    m:close()
  end)
end)
