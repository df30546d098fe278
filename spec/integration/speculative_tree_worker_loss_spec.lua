-- A lost device with speculative trees whose draft runs on a worker (--draft-device): the ring
-- re-plans over the others as with no draft (loip.cluster.registry's replan_after_loss), the
-- draft opened again on a device of the new plan (the one it was on gone: where the new plan
-- puts it), and every request in flight goes on with run.c's greedy tokens. The loss is waited
-- for by its event (the worker's exit, the ring's re-plan), never a time.
local cluster = require "loip.cluster"
local json = require "loip.text.json"
local policy = require "loip.policy"
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

-- Two greedy requests through cluster c (draft: a policy's text, k its nodes: nil, the cost
-- model's), device `victim` killed (-9) once the first has `at` tokens. Returns the draft's report
-- and the drafter that ran after the loss.
local function two_with_loss(c, draft, k, victim, at)
  c:plan { context = 256, batch = 64, max_batch = 2, stages = 2, draft = policy.load("draft", draft), draft_tokens = k }
  local cases = { greedy.cases[3], greedy.cases[5] }
  local its, sts = {}, {}
  for j, cs in ipairs(cases) do
    its[j], sts[j] = c:generate(cs.prompt_ids, { max_tokens = 60, sampler = { temperature = 0 }, stop = { [1] = true } })
  end
  local pid, killed = c.devices[victim].pid, false
  local more = true
  while more do
    more = false
    for j = 1, 2 do
      if its[j] and its[j]() ~= nil then more = true else its[j] = nil end
    end
    if not killed and #sts[1].token_ids >= at then
      os.execute("kill -KILL " .. pid)
      killed = true
    end
  end
  assert.is_true(killed, "the device was killed mid-generation")
  for j, cs in ipairs(cases) do assert.are.same(expected(cs, 60), sts[j].token_ids, string.format("%s, device %d lost: request %d", draft, victim, j)) end
  assert.is_false(require("loip.cluster.proc").alive(pid))
  local b = c:batcher()
  local rep, drafter = b.draft:report(), b.draft.ctx.drafter
  b.draft:close()
  return rep, drafter
end

describe("speculative trees with the draft on a worker, a device lost", function()
  for _, case in ipairs({
    { "self:layers=3,tree=on,device=2", 15, 2, "the draft's device" },
    { "self:layers=3,tree=on,device=2", nil, 3, "another device" },
    { "self:layers=3,tree=on,device=3", 15, 3, "the draft's device, the last of the ring" },
  }) do
    local draft, k, victim, what = case[1], case[2], case[3], case[4]
    it(string.format("re-plans when %s (%d) dies mid-generation (%s, %s nodes): run.c's tokens, the draft on a device left",
      what, victim, draft, tostring(k or "the cost model's")), function()
      local c = cluster.start_local { store = T.slice_store(S260, "s260"), devices = 3, threads = 1 }
      local ok, err = pcall(function()
        local rep, drafter = two_with_loss(c, draft, k, victim, 12)
        assert.are.equal(1, #c.losses)
        assert.are.same({ victim }, c.losses[1].devices)
        assert.is_true(c.losses[1].replanned)
        assert.are.equal(2, #c.devices)
        -- the draft went on, on a device of the new plan (the planner's, the drafter's)
        assert.is_not_nil(c.draft_device)
        assert.is_true(c.draft_device >= 1 and c.draft_device <= 2)
        assert.are.equal(c.draft_device, drafter.i)
        assert.is_true((drafter.reopens or 0) >= 1, "the draft opened again on the new plan")
        assert.is_true(rep.accepted > 0 and rep.tree_size_max > 1, "trees verified")
      end)
      c:close()
      assert(ok, err)
    end)
  end
end)
