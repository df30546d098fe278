-- Speculative decoding's tree mode, its Lua side (loip.engine.request.tree): trees from candidate paths
-- (the first path's nodes first), ngram's tree of earlier matches, the KV a request keeps after
-- a tree step and the tokens it feeds again, and a policy's tree checked.
local tree = require "loip.engine.request.tree"
local policy = require "loip.policy"

describe("tree mode of speculative decoding", function()
  it("merges paths into a tree, level by level, the first path numbered first", function()
    local t = tree.from_paths({ { 1, 2, 3, 4 }, { 1, 5, 6 }, { 7, 8 } }, 7)
    assert.are.same({ 1, 2, 3, 5, 6, 7, 8 }, t.ids)
    assert.are.same({ 0, 1, 2, 1, 4, 0, 6 }, t.parents)
    -- k cuts it by levels: every path's first token before any path's third
    t = tree.from_paths({ { 1, 2, 3, 4 }, { 9 }, { 8 } }, 4)
    assert.are.same({ 1, 2, 9, 8 }, t.ids)
    assert.are.same({ 0, 1, 0, 0 }, t.parents)
  end)

  it("gives ngram's earlier matches as branches (tree=on)", function()
    local p = policy.load("draft", "ngram:n=2,tree=on,branches=3")
    -- "5 6" occurred twice before, followed by 7 8 and by 9 4
    local ids = { 5, 6, 7, 8, 1, 5, 6, 9, 4, 2, 5, 6 }
    local t = p.module.propose_tree({ ids = ids, n = #ids, k = 4 }, {}, p.params)
    assert.are.same({ 9, 4, 7, 8 }, t.ids)
    assert.are.same({ 0, 1, 0, 3 }, t.parents)
    local ok, err = pcall(policy.load, "draft", "ngram:tree=maybe")
    assert.is_false(ok)
    assert.matches("tree", tostring(err), 1, true)
  end)

  it("keeps the KV of the path's first children and feeds the rest again", function()
    -- root at n, nodes 1 (10, under the root), 2 (11, under 1), 3 (12, under the root), 4 (13, under 3)
    local ids = { 10, 11, 12, 13, parents = { 0, 1, 0, 3 } }
    local r = { seq = 0, id = 5, pos = 20, token_ids = { 3, 10, 11, 99 }, refeed_sent = 0 }
    local outs = { { seq = 0, request = 5, id = 10 }, { seq = 0, request = 5, id = 11 }, { seq = 0, request = 5, id = 99 } }
    assert.are.equal(3, tree.kept(r, ids, 3, outs)) -- the root, nodes 1 and 2 at n + 1, n + 2
    assert.is_nil(r.refeed)
    r.token_ids = { 3, 12, 13, 7 }
    outs = { { seq = 0, request = 5, id = 12 }, { seq = 0, request = 5, id = 13 }, { seq = 1, request = 6, id = 12 },
      { seq = 0, request = 5, id = 7 } }
    assert.are.equal(1, tree.kept(r, ids, 3, outs)) -- nodes 3 and 4 sit at n + 3, n + 4: fed again
    assert.are.equal(2, r.refeed)
    local toks, owners = {}, {}
    assert.are.equal(22, tree.refeed_rows(r, toks, owners))
    assert.are.same({ { seq = 0, pos = 20, request = 5, id = 12, flags = 0 }, { seq = 0, pos = 21, request = 5, id = 13, flags = 0 } }, toks)
    assert.are.equal(2, r.refeed_sent)
    assert.is_nil(r.refeed)
    -- a tree node's row names its parent, rows back; a chain's none
    local row = tree.draft_row(r, 22, 4, ids)
    assert.are.same({ 26, 13, 1 }, { row.pos, row.id, row.parent })
    assert.is_nil(tree.draft_row(r, 22, 1, { 10 }).parent)
  end)

  it("checks a policy's tree: parents before their nodes, ids in the vocabulary", function()
    local bad = { name = "bad", params = { tree = true }, module = { propose_tree = function() return { ids = { 1, 2 }, parents = { 0, 2 } } end } }
    assert.is_true(tree.wanted(bad))
    local ok, err = pcall(tree.propose, bad, { k = 4 }, {}, 100)
    assert.is_false(ok)
    assert.matches("node 2's parent is 2", tostring(err), 1, true)
    bad.module.propose_tree = function() return { ids = { 100 }, parents = { 0 } } end
    ok, err = pcall(tree.propose, bad, { k = 4 }, {}, 100)
    assert.matches("node 1 is 100", tostring(err), 1, true)
    local none = { name = "none", params = { tree = true }, module = {} }
    ok, err = pcall(tree.wanted, none)
    assert.matches("no propose_tree", tostring(err), 1, true)
  end)
end)
