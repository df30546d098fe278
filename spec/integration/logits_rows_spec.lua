-- The logits rows a step returns are the last device's to hold (loip.plan.device_bytes): a step
-- verifying a tree of r rows, or prefilling with every row's logits asked, returns r rows of the
-- vocabulary from the last device only. The devices before it were once sized and charged for
-- them too, which took from each budget what a tree's rows or a block needed; now the planner
-- sends them one row per request, and the plan's memory is what each device's accounts hold.
local cluster = require "loip.cluster"
local plan = require "loip.plan"
local json = require "loip.text.json"
local T = require "spec.support"
teardown(function() T.cleanup() end)
teardown(T.drop_stores)

local S260 = T.root .. "/models/stories260K"
local greedy = json.load(S260 .. "/reference/greedy.json")

describe("the logits rows of a step", function()
  it("are held and charged on the last device only; the plan's memory is each device's accounts", function()
    local st = T.slice_store(S260, "s260")
    local c = cluster.start_local { store = st, devices = 3, threads = 1 }
    local ok, err = pcall(function()
      -- (a tree of 63 drafts and the request's token: 64 rows of logits a step)
      local ROWS = 64
      c:plan { context = 256, batch = ROWS, draft = "self:layers=3,tree=on", draft_tokens = ROWS - 1 }
      assert.are.equal(ROWS, c.sizes.logits_tokens)
      local sz, p = c.sizes, c.plan_table
      local st0 = c:stats()
      for i = 1, 3 do
        local m = plan.memory(p, i, sz, { cluster = true })
        assert.are.equal(m.activations, st0[i].accounts.activations, "device " .. i .. "'s activations, planned and held")
      end
      -- the devices before the last hold none of the tree's rows of logits (one row a request)
      for i = 1, 2 do
        local less = st0[3].accounts.activations - st0[i].accounts.activations
        assert.is_true(less >= (ROWS - 1) * sz.vocab * 4, string.format("device %d holds %d bytes less than the last", i, less))
      end
      -- and steps verifying trees of that many rows are served: llama2.c's tokens
      local case = greedy.cases[3]
      local b = c:batcher()
      local r = b:submit { prompt = case.prompt_ids, max_tokens = 40, sampler = { temperature = 0 }, stop = { [1] = true } }
      b:drain()
      local want = {}
      for k = 1, math.min(40, #case.generated_ids) do want[k] = case.generated_ids[k] end
      assert.are.same(want, r.token_ids)
      assert.are.equal(ROWS - 1, b.draft:report().tree_size_max)
    end)
    c:close()
    assert(ok, err)
  end)
end)
