-- Speculative trees with the draft on a worker (--draft-device, loip.cluster.draft): the device's
-- draft builds the tree (propose_tree, or propose_scored: best-first, sized on the head by the cost
-- model) and the ring verifies it as a tree from a draft in the head's process. Greedy: run.c's
-- tokens on 3 local devices, two requests in the batch, for fixed sizes and sized by the cost
-- model; with a fixed size the very trees a draft in the head's process builds (the same figures).
-- Sampled: a seeded request gives the tokens it gives with no draft.
local cluster = require "loip.cluster"
local json = require "loip.text.json"
local T = require "spec.support"
teardown(function() T.cleanup() end)
teardown(T.drop_stores)

local S260 = T.root .. "/models/stories260K"
local greedy = assert(json.load(S260 .. "/reference/greedy.json"))

local function expected(c, n)
  local out = {}
  for i = 1, math.min(n, #c.generated_ids) do out[i] = c.generated_ids[i] end
  return out
end

-- Two greedy requests through cluster c planned with draft (k: fixed nodes, nil: the cost model's);
-- checked against run.c. Returns the draft's report and the drafter the policy ran.
local function two(c, draft, k)
  c:plan { context = 256, batch = 64, max_batch = 2, draft = draft, draft_tokens = k }
  local b = c:batcher()
  local cases = { greedy.cases[3], greedy.cases[5] }
  local reqs = {}
  for j, cs in ipairs(cases) do
    reqs[j] = b:submit { prompt = cs.prompt_ids, max_tokens = 40, sampler = { temperature = 0 }, stop = { [1] = true } }
  end
  b:drain()
  for j, r in ipairs(reqs) do assert.are.same(expected(cases[j], 40), r.token_ids, draft .. " " .. tostring(k)) end
  local d, drafter = b.draft:report(), b.draft.ctx.drafter
  b.draft:close()
  return d, drafter
end

describe("speculative trees with the draft on a worker", function()
  after_each(function() collectgarbage() collectgarbage() end)

  it("gives run.c's greedy tokens, the trees a draft in the head's process builds, and sized by the cost model", function()
    local c = cluster.start_local { store = T.slice_store(S260, "s260"), devices = 3, threads = 1 }
    local ok, err = pcall(function()
      for _, case in ipairs({ { "self:layers=3,tree=on", 63 }, { "self:layers=3,tree=on", 7 },
          { "self:layers=3,tree=on,build=paths,width=3,levels=2", 6 } }) do
        local draft, k = case[1], case[2]
        local here = two(c, draft, k)
        local there, drafter = two(c, draft .. ",device=2", k)
        assert.are.equal(2, c.draft_device)
        assert.are.equal(2, drafter.i, "the draft ran on device 2") -- (loip.cluster.draft's Remote)
        assert.is_true(there.steps > 0 and there.accepted > 0 and there.tree_size_max > 1, draft .. ": trees verified")
        -- the same trees: the worker's draft is the head's, its probabilities sent bit for bit
        for _, f in ipairs({ "drafted", "accepted", "steps", "tokens", "tree_size_max" }) do
          assert.are.equal(here[f], there[f], string.format("%s %d: %s", draft, k, f))
        end
      end
      -- sized by the cost model (its size follows the measured times: only its tokens are checked)
      local d = two(c, "self:layers=3,tree=on,device=2", nil)
      assert.is_true(d.tree == true)
    end)
    c:close()
    assert(ok, err)
  end)

  it("gives a seeded sampled request the tokens it gives with no draft", function()
    local c = cluster.start_local { store = T.slice_store(S260, "s260"), devices = 3, threads = 1 }
    local ok, err = pcall(function()
      local function sampled(draft, seed)
        c:plan { context = 256, batch = 64, max_batch = 2, draft = draft, draft_tokens = draft and 15 or nil }
        local b = c:batcher()
        local r = b:submit { prompt = greedy.cases[2].prompt_ids, max_tokens = 40, sampler = { temperature = 0.9 }, seed = seed }
        b:drain()
        local rep = b.draft and b.draft:report()
        if b.draft then b.draft:close() end
        return r.token_ids, rep
      end
      local accepted = 0
      for seed = 1, 3 do
        local plain = sampled(nil, seed)
        local got, rep = sampled("self:layers=3,tree=on,device=2", seed)
        assert.are.same(plain, got, "seed " .. seed)
        accepted = accepted + rep.accepted
      end
      assert.is_true(accepted > 0, "sampled trees accepted drafts")
    end)
    c:close()
    assert(ok, err)
  end)
end)
