-- Live plan changes (issue 12's mechanism): between two steps of a running request a stage's
-- offloaded prefix grows (its blocks' memory goes back; they are read every step from then on)
-- or shrinks (they are read back into memory, charged first), in-process and on a worker,
-- without restarting anything or losing KV: the tokens are those of a run without changes.
local loip = require "loip"
local cluster = require "loip.cluster"
local json = require "loip.text.json"
local memory = require "loip.runtime.memory"
local T = require "spec.support"
teardown(function() T.cleanup() end)

local S260 = T.root .. "/models/stories260K"
local greedy = assert(json.load(S260 .. "/reference/greedy.json"))
local store_of = T.slice_store
teardown(T.drop_stores)

local function account(m, name)
  for _, a in ipairs(memory.report(m)) do if a.account == name then return a.bytes end end
  return 0
end

describe("live plan changes", function()
  it("move blocks between resident and offloaded in-process mid-request, the tokens unchanged", function()
    local st = store_of(S260, "s260")
    local case = greedy.cases[2]
    local plan = { slots = 1, devices = { { stages = { { blocks = { 0, 4 }, offloaded = 2 }, { blocks = { 5, 9 }, offloaded = 1 } } } } }
    local m = loip.model.open(st, { context = 256, plan = plan, mem = "8M", threads = 1 })
    local block = json.load(st .. "/manifest.json").files
    local size = {}
    for _, f in ipairs(block) do size[f.name] = f.size end
    local w0 = account(m, "weights")
    local out, loaded = {}, {}
    for id in m:generate(case.prompt_ids, { temperature = 0, max_tokens = 40, stop = { 1 } }) do
      if id then out[#out + 1] = id end
      if #out == 10 then
        loaded[1] = m:runner_stats().bytes_loaded
        m:restage(1, 0) -- layer 0's attention and MLP resident again
        assert.are.equal(w0 + size["layer-000-mha.bin"] + size["layer-000-mlp.bin"], account(m, "weights"))
      elseif #out == 20 then
        loaded[2] = m:runner_stats().bytes_loaded
        m:restage(1, 1) -- layer 0's attention read every step again
        assert.are.equal(w0 + size["layer-000-mlp.bin"], account(m, "weights"))
      elseif #out == 30 then
        m:restage(1, 2)
        m:restage(2, 0)
      elseif #out == 35 then
        -- all of stage 2 read every step: more than the slot held, so the slot grows (the
        -- stage's blocks leave memory first)
        local slots = account(m, "slots")
        m:restage(2, 5)
        assert.is_true(account(m, "slots") > slots)
        assert.are.equal(w0 - size["layer-002-mlp.bin"] - size["layer-003-mha.bin"] - size["layer-003-mlp.bin"]
          - size["layer-004-mha.bin"] - size["layer-004-mlp.bin"] + size["layer-002-mlp.bin"], account(m, "weights"))
      end
    end
    for i, id in ipairs(out) do assert.are.equal(case.generated_ids[i], id) end
    assert.are.equal(40, #out)
    assert.are.equal(5, m.plan.devices[1].stages[2].offloaded)
    -- steps 10-20 read only stage 2's block: less per step than steps 1-10
    assert.is_true((loaded[2] - loaded[1]) / 10 < loaded[1] / 10)
    -- a stage has only so many blocks
    local ok, err = pcall(m.restage, m, 2, 6)
    assert.is_false(ok)
    assert.matches("restage: stage 2 has 5 blocks; offloaded 6 is not in 0..5", err, 1, true)
    m:close()
  end)

  it("changes a worker's plan between steps (CHANGE), its memory following, the tokens unchanged", function()
    local st = store_of(S260, "s260")
    local case = greedy.cases[3]
    local c = cluster.start_local { store = st, devices = 2, threads = 1, mem = { "4M", "4M" } }
    local ok, err = pcall(function()
      local plan = { slots = 1, devices = { { stages = { { blocks = { 0, 4 }, offloaded = 0 } } },
        { stages = { { blocks = { 5, 9 }, offloaded = 3 } } } } }
      c:plan { plan = plan, context = 256 }
      local it, s = c:generate(case.prompt_ids, { max_tokens = 30, sampler = { temperature = 0 }, stop = { [1] = true } })
      local mem = {}
      for _ in it do
        if #s.token_ids == 8 then mem[1] = c:restage(2, 1, 1).accounts.weights end -- two blocks back in memory
        if #s.token_ids == 16 then mem[2] = c:restage(2, 1, 3).accounts.weights end -- read every step again
      end
      for i, id in ipairs(s.token_ids) do assert.are.equal(case.generated_ids[i], id) end
      assert.is_true(#s.token_ids >= 20)
      assert.is_true(mem[2] < mem[1], "offloading more gave memory back")
      assert.are.equal(3, c.plan_table.devices[2].stages[1].offloaded)
      -- more than the slot holds: the device's slot grows
      local r5 = c:restage(2, 1, 5)
      assert.is_true(r5.accounts.weights < mem[2])
      local it2, s2 = c:generate(case.prompt_ids, { max_tokens = 12, sampler = { temperature = 0 }, stop = { [1] = true } })
      for _ in it2 do end
      for i, id in ipairs(s2.token_ids) do assert.are.equal(case.generated_ids[i], id) end
      -- a stale change (another plan) is refused
      c.plan_id = c.plan_id + 1
      local ok2, e2 = pcall(c.restage, c, 2, 1, 2)
      c.plan_id = c.plan_id - 1
      assert.is_false(ok2)
      assert.matches("(stale)", e2, 1, true)
    end)
    c:close()
    assert(ok, err)
  end)
end)
