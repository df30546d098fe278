-- Speculative decoding's cost-model trees (loip.engine.request.tree's best-first growth and
-- loip.engine.request.draft's sizing): nodes taken best-first by the draft's cumulative
-- probability, numbered for a step with the likeliest path first, the expected tokens per
-- prefix (calibrated per depth), and the size B chosen from the step's price: large where the
-- price is flat in rows (read-bound), a few or none where it rises steeply (compute-bound).
local tree = require "loip.engine.request.tree"
local draft = require "loip.engine.request.draft"

-- a draft's children of each token (its probabilities given the path): 10 (a) .6, 11 (b) .25,
-- 12 (c) .15 after the root; 13 (d) .7, 14 (e) .3 after a; 15 (f) .9 after b; 16 (g) .5 after d
local KIDS = { [0] = { { id = 10, p = 0.6 }, { id = 11, p = 0.25 }, { id = 12, p = 0.15 } },
  [10] = { { id = 13, p = 0.7 }, { id = 14, p = 0.3 } }, [11] = { { id = 15, p = 0.9 } }, [13] = { { id = 16, p = 0.5 } } }

local function expand_table(calls)
  return function(list, nodes)
    calls[#calls + 1] = #list
    local out = {}
    for j, x in ipairs(list) do out[j] = KIDS[x.index == 0 and 0 or nodes[x.index].id] or {} end
    return out
  end
end

local function near(a, b) return math.abs(a - b) < 1e-9 end

describe("cost-model trees of drafts", function()
  it("grows best-first: each round takes the likeliest frontier node", function()
    local calls = {}
    local nodes = tree.best_first(5, expand_table(calls), 1)
    local ids, parents = {}, {}
    for i, x in ipairs(nodes) do ids[i], parents[i] = x.id, x.parent end
    -- a (.6), then d (.42) before b (.25), then f (.225) before g (.21) and e (.18)
    assert.are.same({ 10, 13, 11, 15, 16 }, ids)
    assert.are.same({ 0, 1, 0, 3, 2 }, parents)
    assert.is_true(near(nodes[4].p, 0.225) and nodes[5].depth == 3)
    assert.are.same({ 1, 1, 1, 1, 1 }, calls) -- (the root, then one node a round; the last one taken not expanded)
    -- rounds of 2: fewer draft forwards, every parent still before its children
    calls = {}
    nodes = tree.best_first(5, expand_table(calls), 2)
    assert.are.equal(5, #nodes)
    for i, x in ipairs(nodes) do assert.is_true(x.parent < i) end
    assert.is_true(#calls < 5)
    -- at most 2 deep (a request with 2 tokens left): g, at depth 3, is not grown
    nodes = tree.best_first(6, expand_table({}), 1, 2)
    local got = {}
    for i, x in ipairs(nodes) do got[i] = x.id assert.is_true(x.depth <= 2) end
    assert.are.same({ 10, 13, 11, 15, 14, 12 }, got)
  end)

  it("numbers the likeliest B nodes depth-first, the likeliest child first", function()
    local nodes = tree.best_first(5, expand_table({}), 1)
    local t = tree.from_scored(nodes, 5)
    assert.are.same({ 10, 13, 16, 11, 15 }, t.ids)
    assert.are.same({ 0, 1, 2, 0, 4 }, t.parents)
    assert.are.same({ 1, 2, 3, 1, 2 }, t.depths)
    t = tree.from_scored(nodes, 3) -- (a, d, b: a tree at every B)
    assert.are.same({ 10, 13, 11 }, t.ids)
    assert.are.same({ 0, 1, 0 }, t.parents)
    assert.are.same({}, tree.from_scored(nodes, 0).ids)
  end)

  it("expects per depth the sum of its nodes' chances, each edge scaled by what was measured of edges that sure, at most 1", function()
    local ranked = tree.ranked(tree.best_first(5, expand_table({}), 1))
    local E = tree.expected(ranked)
    for b, want in ipairs({ 0.6, 1.02, 1.27, 1.495, 1.705 }) do assert.is_true(near(E[b], want), b .. ": " .. E[b]) end
    -- edges by tenths of q: a .6 (class 6), d .7 (7), b .25 (2), f .9 (9), g .5 (5); d's edges at
    -- half their q: d .6 x .35, and g below it .21 x .5
    assert.are.same({ 6, 7, 2, 9, 5 }, { tree.class(0.6), tree.class(0.7), tree.class(0.25), tree.class(0.9), tree.class(0.5) })
    E = tree.expected(ranked, { [7] = 0.5 })
    assert.is_true(near(E[5], (0.6 + 0.25) + (0.21 + 0.225) + 0.105), tostring(E[5]))
    E = tree.expected(ranked, { [6] = 3 })
    assert.is_true(near(E[1], 1) and near(E[3], 1 + 0.7)) -- (a's chance 1; depth 1 reached at most once: b adds none)
  end)

  it("tells from a step's tokens which nodes built were on the target's path, sent or not", function()
    -- a (10) .6 > d (13) .42 > b (11) .25 > f (15) .225 > g (16) .21 > e (14) .18; the target said 11, 15, 4
    local ranked = tree.ranked(tree.best_first(6, expand_table({}), 1))
    local ids = {}
    for i, x in ipairs(ranked) do ids[i] = x.id end
    assert.are.same({ 10, 13, 11, 15, 16, 14 }, ids)
    -- a tree of a, d, b sent: b accepted (1 draft), then 15: f (not sent) would have been accepted
    assert.are.same({ false, false, true, true, false, false }, tree.outcomes(ranked, { 11, 15 }, 1))
    -- nothing accepted, the target's token 11: b would have been; f, below it, cannot be told
    local out = tree.outcomes(ranked, { 11 }, 0)
    assert.are.same({ false, false, true }, { out[1], out[2], out[3] })
    assert.is_nil(out[4])
    assert.is_false(out[5]) -- (g, below a: off the target's path whatever follows)
  end)

  it("learns from the nodes it built but did not send: a small tree finds what a larger one would add", function()
    -- a draft sure of its first guess (id 1 at .9) that the target never takes, and whose runner-up
    -- (id 2 at .08) the target always takes; a step's price that makes one node pay, not two, while
    -- the draft's own probabilities are believed
    local t = 0
    local pol = { name = "scored", params = { tree = "on" }, module = { propose_scored = function()
      return { { id = 1, parent = 0, p = 0.9 }, { id = 2, parent = 0, p = 0.08 } }
    end } }
    local engine = { step_price = function(_, rows) return 10 + 2 * rows end, clock = function() return t end }
    local d = draft.new(pol, { vocab = 8 }, { engine = engine })
    local r = { id = 1, seq = 0, prompt = { 1, 2, 3 }, token_ids = {} }
    d.reqs[r] = { memo = {}, quiet = 0 }
    local first = d:for_step(r, 1, 63)
    assert.are.same({ 1 }, { first[1], first[2] }) -- (the likeliest node alone)
    -- each step rejected; the target's own token: 2, the node built and not sent
    d:observe(r, #first, 1, { 2 })
    local sent, steps = {}, 1
    while not sent[2] and steps < 5 do
      local ids = d:for_step(r, 1, 63)
      for _, id in ipairs(ids) do sent[id] = true end
      d:observe(r, #ids, 1 + (sent[2] and 1 or 0), sent[2] and { 2, 2 } or { 2 })
      steps = steps + 1
    end
    assert.is_true(sent[2] == true, "the runner-up sent within 4 steps")
    assert.is_true(d.calib.c[tree.class(0.9)] < 0.5 and d.calib.c[tree.class(0.08)] > 2,
      string.format("sure edges %.2f, unsure %.2f", d.calib.c[tree.class(0.9)] or -1, d.calib.c[tree.class(0.08)] or -1))
  end)

  it("prices a step's rows as measured where the cost model's price is flat in them (compute timed at one row)", function()
    local pol = { name = "scored", params = { tree = "on" }, module = { propose_scored = function() return {} end } }
    local engine = { step_price = function() return 0.5 end, clock = function() return 0 end }
    local d = draft.new(pol, { vocab = 8 }, { engine = engine })
    -- steps of 1 row at 0.52 ms, of 3 and 5 rows (drafts) at 0.95 and 1.35: the model's 0.5 for all
    for _ = 1, 20 do
      d:measured(1, 0.52)
      d:measured(3, 0.95)
      d:measured(5, 1.35)
    end
    local p1, p3, p5 = d:tree_price(1), d:tree_price(3), d:tree_price(5)
    assert.is_true(p1 < 0.7 and p3 > 0.85 and p5 > 1.15 and p1 < p3 and p3 < p5,
      string.format("1 row %.3f, 3 rows %.3f, 5 rows %.3f", p1, p3, p5))
    -- one row count measured alone: the model's shape (flat), at the measured level
    local d2 = draft.new(pol, { vocab = 8 }, { engine = engine })
    for _ = 1, 20 do d2:measured(1, 0.8) end
    assert.is_true(math.abs(d2:tree_price(1) - 0.8) < 1e-9 and math.abs(d2:tree_price(9) - 0.8) < 1e-9)
  end)

  it("rests a request whose tree was sized 0 long enough that its builds stay a small share of the time", function()
    -- a build of 1 ms against steps of 0.5: a tree every 8 steps would be a fifth of the time
    local t = 0
    local pol = { name = "scored", params = { tree = "on" }, module = { propose_scored = function(req)
      t = t + 1 -- (the build takes 1 ms of the engine's clock)
      return { { id = 1, parent = 0, p = 0.01 } }
    end } }
    local engine = { step_price = function() return 0.5 end, clock = function() return t end }
    local d = draft.new(pol, { vocab = 8 }, { engine = engine })
    local r = { id = 1, seq = 0, prompt = { 1, 2, 3 }, token_ids = {} }
    d.reqs[r] = { memo = {}, quiet = 0 }
    for _ = 1, 5 do d:measured(1, 0.5) end
    local builds, steps = 0, 0
    while steps < 200 do
      local before = d.stats.built or 0
      local ids = d:for_step(r, 1, 63)
      if (d.stats.built or 0) > before then builds = builds + 1 end
      d:observe(r, #ids, 1, { 2 })
      steps = steps + 1
    end
    -- builds of 1 ms at most PROBE_SHARE of 200 steps of 0.5 ms: 5 (and the first)
    assert.is_true(builds <= 6, builds .. " builds in 200 steps")
    assert.is_true(builds >= 2, builds .. " builds in 200 steps: it must still probe")
  end)

  it("reports the sizes chosen, the choices of 0 among them, beside the nodes sent per verifying step", function()
    local pol = { name = "scored", params = { tree = "on" }, module = { propose_scored = function(req)
      local nodes = {}
      for i = 1, req.k do nodes[i] = { id = 1, parent = i - 1, p = 0.5 ^ i } end
      return nodes
    end } }
    local engine = { step_price = function() return 1 end, clock = function() return 0 end }
    local d = draft.new(pol, { vocab = 8 }, { engine = engine })
    d:measured(1, 1)
    local script, i = { 6, 0, 0, 2 }, 0
    d.tree_budget = function() i = i + 1 return script[i] end -- (the cost model's choices, as scripted)
    local r = { id = 1, seq = 0, prompt = { 1, 2, 3 }, token_ids = {} }
    local seen = {}
    d.on_chosen = function(who, B) assert.are.equal(r, who) seen[#seen + 1] = B end -- (serve's /metrics watches so)
    while i < #script do
      local ids = d:for_step(r, 1, 63)
      d:observe(r, #ids, 1, { 2 })
    end
    assert.are.same(script, seen)
    local rep = d:report()
    assert.are.equal(4, rep.tree_size) -- (6 and 2 sent: the choices of 0 sent nothing)
    assert.are.equal(2, rep.tree_chosen) -- (6, 0, 0, 2)
    assert.are.equal(2, rep.tree_chosen_last)
  end)

  -- A Draft whose policy grows a tree of `built` nodes from a draft that is sure of its first
  -- token at 0.8 (runner-up 0.15, then 0.05) at every node, on an engine priced by price(rows).
  local function sized(price, built, fixed)
    local t = 0
    local pol = { name = "scored", params = { tree = "on" }, module = { propose_scored = function(req)
      return tree.best_first(req.k, function(list)
        local out = {}
        for j in ipairs(list) do out[j] = { { id = 1, p = 0.8 }, { id = 2, p = 0.15 }, { id = 3, p = 0.05 } } end
        return out
      end, 4)
    end } }
    local engine = { step_price = function(_, rows) return price(rows) end, clock = function() return t end }
    local d = draft.new(pol, { vocab = 8 }, { engine = engine, tokens = fixed })
    assert.is_true(d.best)
    local r = { id = 1, seq = 0, prompt = { 1, 2, 3 }, token_ids = {} }
    d.reqs[r] = { memo = {}, quiet = 0, build = built }
    local ids = d:for_step(r, 1, 63)
    assert.are.equal(#ids, #ids.parents)
    return #ids, ids
  end

  it("sizes the tree by the step's price: large where it is flat in rows, a few where it rises", function()
    local flat = sized(function(rows) return 40 + 0.05 * rows end, 63)
    assert.is_true(flat >= 24, "read-bound: " .. flat .. " nodes")
    local steep = sized(function(rows) return 1 + 2 * rows end, 63)
    assert.is_true(steep <= 4, "compute-bound: " .. steep .. " nodes")
    local moderate = sized(function(rows) return 10 + rows end, 63)
    assert.is_true(moderate > steep and moderate < flat, string.format("%d between %d and %d", moderate, steep, flat))
    -- --draft-tokens fixes it; the tree built is numbered for the step (parents before children)
    local n, ids = sized(function(rows) return 1 + 2 * rows end, 63, 12)
    assert.are.equal(12, n)
    for i, p in ipairs(ids.parents) do assert.is_true(p < i) end
    assert.are.same({ 1, 1, 1 }, { ids[1], ids[2], ids[3] }) -- (the likeliest path first: its KV stays)
  end)

  it("builds FIRST_BUILD nodes first, then draft.builds of the size chosen: past 64 where a step's price is flat", function()
    local t = 0
    local pol = { name = "scored", params = { tree = "on" }, module = { propose_scored = function(req)
      return tree.best_first(req.k, function(list)
        local out = {}
        for j in ipairs(list) do out[j] = { { id = 1, p = 0.6 }, { id = 2, p = 0.3 }, { id = 3, p = 0.1 } } end
        return out
      end, 8)
    end } }
    local engine = { step_price = function() return 40 end, clock = function() return t end }
    local d = draft.new(pol, { vocab = 8 }, { engine = engine })
    local r = { id = 1, seq = 0, prompt = { 1, 2, 3 }, token_ids = {} }
    local builds, sent = {}, {}
    for i = 1, 5 do
      local before = d.stats.built or 0
      sent[i] = #d:for_step(r, 1, 600)
      builds[i] = d.stats.built - before
    end
    assert.are.equal(draft.FIRST_BUILD, builds[1])
    for i = 2, 5 do assert.are.equal(math.min(tree.MAX, math.max(4, math.ceil(1.5 * sent[i - 1]))), builds[i], "step " .. i) end
    assert.is_true(math.max(unpack(sent)) > 64, "trees past 64 nodes: " .. table.concat(sent, ","))
    assert.is_true(math.max(unpack(builds)) <= tree.MAX)
  end)

  it("chooses the size on the mean of the last steps' expected curves: steady where each step's own swings", function()
    -- steps alternate between a draft sure of one token (0.9, then 19 runners-up of 0.001: its
    -- own curve is flat past 1 node) and one spread over 20 tokens of 0.05 (its curve rises to 20)
    local function ranked(first, rest)
      local r = {}
      for i = 1, 20 do r[i] = { index = i, parent = 0, depth = 1, p = i == 1 and first or rest } end
      return r
    end
    local sure, spread = ranked(0.9, 0.001), ranked(0.05, 0.05)
    local engine = { step_price = function(_, rows) return 10 + 0.1 * rows end, clock = function() return 0 end }
    local function choices(decay)
      local keep = draft.EXPECT_DECAY
      draft.EXPECT_DECAY = decay
      local d = draft.new({ name = "scored", params = { tree = "on" }, module = { propose_scored = function() end } },
        { vocab = 8 }, { engine = engine })
      local got = {}
      for i = 1, 30 do got[i] = d:tree_budget(i % 2 == 1 and sure or spread, 1) end
      draft.EXPECT_DECAY = keep
      return got
    end
    local own = choices(0) -- (each step's curve alone: 1 node, then 20, then 1 ...)
    assert.are.same({ 1, 20, 1, 20 }, { own[27], own[28], own[29], own[30] })
    local mean = choices(draft.EXPECT_DECAY)
    for i = 21, 30 do assert.are.equal(mean[20], mean[i], "step " .. i .. ": " .. table.concat(mean, ",")) end
    assert.is_true(mean[20] > 1, "the sure steps' own size: " .. table.concat(mean, ","))
  end)

  it("never prices a step of more rows below one of fewer, whatever the fitted line's slope", function()
    -- steps measured cheaper at more rows (noise, or other requests' rows): the measured over the
    -- modelled falls with the rows, and read as it is a tree of 20 would cost less than one node
    local engine = { step_price = function() return 10 end, clock = function() return 0 end }
    local d = draft.new({ name = "scored", params = { tree = "on" }, module = { propose_scored = function() end } },
      { vocab = 8 }, { engine = engine })
    for _ = 1, 10 do d:measured(2, 12) d:measured(6, 6) end
    assert.is_true(d:tree_price(21) < d:tree_price(2), "the line slopes down")
    local nodes = {}
    for i = 1, 20 do nodes[i] = { index = i, parent = 0, depth = 1, p = i == 1 and 0.9 or 1e-6 } end
    -- (one node is worth 0.9 tokens, the 19 others next to nothing: at a price flat in the rows, 1)
    assert.are.equal(1, d:tree_budget(nodes, 1))
  end)

  it("reserves a best-first tree's rows in a plan, a chain's otherwise", function()
    local policy = require "loip.policy"
    assert.are.equal(tree.MAX, draft.plan_rows(policy.load("draft", "self:layers=3,tree=on")))
    assert.are.equal(draft.MAX, draft.plan_rows(policy.load("draft", "self:layers=3,tree=on,build=paths")))
    assert.are.equal(draft.MAX, draft.plan_rows(policy.load("draft", "self:layers=3")))
    assert.are.equal(5, draft.plan_rows(policy.load("draft", "self:layers=3,tree=on"), 5))
    local ok, err = pcall(policy.load, "draft", "self:tree=on,build=wide")
    assert.is_false(ok)
    assert.matches("build", tostring(err), 1, true)
  end)
end)
