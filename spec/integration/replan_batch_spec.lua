-- A request loop kept across a new plan (keep_requests: a join, a loss, the online policy's
-- re-plan) takes the new plan's step size. Before the fix the ring kept the first plan's
-- batch as its step budget (Ring:planned refreshed only the logits and sample rows), so a
-- re-plan that carried fewer tokens a step (a tree's reserved rows given way) left the head
-- composing steps the devices refuse: "N tokens in one message, the limit is M".
local cluster = require "loip.cluster"
local json = require "loip.text.json"
local T = require "spec.support"
teardown(function() T.cleanup() end)
teardown(T.drop_stores)

local S260 = T.root .. "/models/stories260K"

describe("a re-plan that keeps the requests", function()
  it("gives the request loop the new plan's tokens a step: a long prompt after it is split to fit", function()
    local st = T.slice_store(S260, "s260-replan-batch")
    local greedy = assert(json.load(S260 .. "/reference/greedy.json"))
    local ids = greedy.cases[1].sequence_ids
    local c = cluster.start_local { store = st, devices = 3, threads = 1 }
    local ok, err = pcall(function()
      c:plan { context = 256, batch = 64 }
      local function run(prompt, n)
        local it, s = c:generate(prompt, { max_tokens = n, sampler = { temperature = 0 } })
        for _ in it do end
        return s.token_ids
      end
      local want = run(ids, 8)
      assert.are.equal(64, c.ring.step_tokens)
      c:plan { context = 256, batch = 8, keep_requests = true } -- (the request loop kept)
      assert.are.equal(8, c.ring.step_tokens, "the step budget after the re-plan")
      -- a prompt longer than the new batch: chunks of 8, the same tokens
      assert.is_true(#ids > 8)
      assert.are.same(want, run(ids, 8))
    end)
    c:close()
    assert(ok, err)
  end)
end)
