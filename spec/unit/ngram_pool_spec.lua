-- The n-gram pool of the drafts that need no second model (loip.engine.request.ngram_pool):
-- continuations after short keys, most recent first, the longest key first; its bound on
-- entries (the key fed longest ago goes); bad shapes refused by name; the lookahead and ngram
-- policies' settings checked and their proposals from it.
local pool = require "loip.engine.request.ngram_pool"
local policy = require "loip.policy"

describe("the n-gram pool", function()
  it("gives what followed the sequence's last tokens, the longest key and the most recent first", function()
    local p = pool.new { n = 2, min = 1, span = 2, entries = 100 }
    p:feed { 5, 6, 7, 8, 1, 6, 9, 4 }
    -- key {6}: followed by 7 8, then (more recent) 9 4; key {5, 6}: by 7 8
    assert.are.same({ { 9, 4 }, { 7, 8 } }, strip(p:lookup({ 3, 6 }, 4)))
    assert.are.same({ { 7, 8 }, { 9, 4 } }, strip(p:lookup({ 5, 6 }, 4)))
    assert.are.same({ { 7, 8 } }, strip(p:lookup({ 5, 6 }, 1)))
    assert.are.same({}, p:lookup({ 42 }, 4))
    -- one new token: only the continuations ending there
    local q = pool.new { n = 1, min = 1, span = 1, entries = 100 }
    q:add_ending { 1, 2, 3 }
    assert.are.same({ { 3 } }, strip(q:lookup({ 2 }, 4)))
    assert.are.same({}, q:lookup({ 1 }, 4))
  end)

  it("holds at most `entries` continuations, dropping the key fed longest ago", function()
    local p = pool.new { n = 1, min = 1, span = 1, entries = 50, per_key = 2 }
    local ids = {}
    for i = 1, 5000 do ids[i] = 1000 + i end -- (every key new)
    p:feed(ids)
    local s = p:size()
    assert.is_true(s.entries <= 50 and s.entries >= 40, "entries " .. s.entries)
    assert.are.equal(50, s.bound)
    -- the last token's continuation (fed last) is there; the first's is gone
    assert.are.same({ { ids[5000] } }, strip(p:lookup({ ids[4999] }, 1)))
    assert.are.same({}, p:lookup({ ids[1] }, 1))
    -- the order of keys stays within a few times the bound (stale marks compacted)
    assert.is_true(p.last - p.first < 4 * 50 + 64 + 2, "order " .. (p.last - p.first))
    for _ = 1, 2000 do p:feed({ 1, 2, 3 }) end
    assert.is_true(p.last - p.first < 4 * 50 + 64 + 2, "order after refeeding " .. (p.last - p.first))
    assert.is_true(p:size().entries <= 50)
  end)

  it("refuses a bad shape by name", function()
    for _, c in ipairs({ { { n = 0 }, "n must be" }, { { entries = 0.5 }, "entries must be" }, { { n = 2, min = 3 }, "min (3) is more than n (2)" } }) do
      local ok, err = pcall(pool.new, c[1])
      assert.is_false(ok)
      assert.matches(c[2], tostring(err), 1, true)
    end
  end)

  it("is one per name in the process when shared", function()
    pool.drop_shared()
    local a = pool.shared("m|x", { n = 1, span = 1 })
    assert.are.equal(a, pool.shared("m|x", { n = 1, span = 1 }))
    assert.are_not.equal(a, pool.shared("m|y", { n = 1, span = 1 }))
    pool.drop_shared()
    assert.are_not.equal(a, pool.shared("m|x", { n = 1, span = 1 }))
    pool.drop_shared()
  end)
end)

describe("drafts from n-gram pools", function()
  it("refuses bad settings of lookahead and ngram by name", function()
    for _, c in ipairs({ { "lookahead:n=1", "'n'" }, { "lookahead:window=65", "'window'" }, { "lookahead:entries=2", "'entries'" },
      { "lookahead:size=100", "'size'" }, { "lookahead:nope=1", "no setting 'nope'" }, { "ngram:entries=1", "'entries'" },
      { "ngram:shared=perhaps", "shared" }, { "ngram:span=0", "'span'" } }) do
      local ok, err = pcall(policy.load, "draft", c[1])
      assert.is_false(ok, c[1])
      assert.matches(c[2], tostring(err), 1, true)
    end
    -- ngram opens nothing (a server lets a request choose it): its shared pool is found at first use
    assert.is_nil(policy.load("draft", "ngram:shared=on").module.open)
  end)

  it("proposes a tree of the pool's candidates and the lookahead branch, and learns from a step's guesses", function()
    local p = policy.load("draft", "lookahead:n=3,match=1,window=3,candidates=2,size=16")
    local o = p.params
    local memo = {}
    -- "4" was followed by 5 6 and (later) by 7 8: both candidates, the most recent first
    local ids = { 1, 4, 5, 6, 2, 4, 7, 8, 3, 4 }
    local t = p.module.propose_tree({ ids = ids, n = #ids, k = 16, memo = memo }, {}, o)
    -- candidates 7 8 and 5 6; the guesses start from the pool's best (7 8, merged with it) and
    -- go on with one of the sequence's own ids: 7, 8, g, then 5, 6 (depth first)
    assert.are.same({ 7, 8 }, { t.ids[1], t.ids[2] })
    assert.are.same({ 0, 1, 2 }, { t.parents[1], t.parents[2], t.parents[3] })
    assert.are.same({ 5, 6 }, { t.ids[4], t.ids[5] })
    assert.are.same({ 0, 4 }, { t.parents[4], t.parents[5] })
    assert.are.equal(5, #t.ids)
    -- the step: node 1 (7) accepted, then 9; every other node's guess came back
    local nxt = {}
    for j = 1, #t.ids do nxt[j] = 50 + j end
    nxt[1] = 9
    p.module.observe({ ids = ids, n = #ids, memo = memo }, {}, o, { ids = t.ids, parents = t.parents, next = nxt, tokens = { 7, 9 } })
    -- node 4 (5, under the root) guessed 54 after "4 5": the n-gram 4 5 54 is in the pool
    local found = false
    for _, c in ipairs(memo.pool:lookup({ 4 }, 8)) do found = found or (c[1] == 5 and c[2] == 54) end
    assert.is_true(found, "a peeked guess became an n-gram")
    -- the next guesses: the lookahead branch's outputs (9, 52, 53 after its nodes 1, 2, 3)
    -- shifted by the 2 tokens the step gave
    assert.are.equal(#ids + 2, memo.guess_for)
    assert.are.same({ 52, 53 }, memo.guess)
    -- and the next proposal starts its lookahead branch with them
    local ids2 = { 1, 4, 5, 6, 2, 4, 7, 8, 3, 4, 7, 9 }
    t = p.module.propose_tree({ ids = ids2, n = #ids2, k = 16, memo = memo }, {}, o)
    local last = {}
    for j = #t.ids - 2, #t.ids do last[#last + 1] = t.ids[j] end
    assert.are.same({ 52, 53 }, { last[1], last[2] })
  end)

  it("sizes its tree by the step's price (size=auto), a count, or leaves it to the rule (0)", function()
    local p = policy.load("draft", "lookahead:n=4,window=6,candidates=4")
    local full = 6 + 4 * 3
    local L = p.module.length
    -- no price known: a full tree
    assert.are.equal(full, L({ memo = {}, rows = 1 }, {}, p.params))
    -- read-bound: rows cost almost nothing, a full tree
    local flat = function(r) return 100 + 0.01 * r end
    assert.are.equal(full, L({ memo = {}, rows = 1 }, { price = flat }, p.params))
    -- compute-bound: each row costs a step; none, but a full tree once in a while (at most 5 % of the time)
    local steep = function(r) return 10 * r end
    local memo, sent, n = {}, 0, 400
    for _ = 1, n do
      local k = L({ memo = memo, rows = 1 }, { price = steep }, p.params)
      assert.is_true(k == 0 or k == full, "k " .. k)
      if k > 0 then sent = sent + 1 end
    end
    assert.is_true(sent >= 1 and sent * full * 10 <= 0.06 * n * 10 + full * 10, "full trees sent: " .. sent)
    -- a count; 0: the draft's rule (nil)
    assert.are.equal(5, L({ memo = {}, rows = 1 }, {}, policy.load("draft", "lookahead:size=5").params))
    assert.is_nil(L({ memo = {}, rows = 1 }, {}, policy.load("draft", "lookahead:size=0").params))
    local ok, err = pcall(policy.load, "draft", "lookahead:size=big")
    assert.is_false(ok)
    assert.matches("'size'", tostring(err), 1, true)
  end)
end)

-- (continuations without their pool marks)
function strip(list)
  local out = {}
  for i, c in ipairs(list) do
    out[i] = {}
    for j, id in ipairs(c) do out[i][j] = id end
  end
  return out
end
