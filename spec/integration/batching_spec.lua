-- Many requests at once (loip.engine.request.batcher): interleaved generate iterators each get their own
-- tokens (they used to get each other's), and concurrent greedy requests in one micro-batch,
-- in-process or on 3 local devices that offload, each give exactly run.c's text for their
-- prompt; a cancelled request frees its slot and KV; requests that do not fit wait, ones that
-- never can are refused at once.
local loip = require "loip"
local cluster = require "loip.cluster"
local json = require "loip.text.json"
local T = require "spec.support"
teardown(function() T.cleanup() end)

local S260 = T.root .. "/models/stories260K"
local greedy = assert(json.load(S260 .. "/reference/greedy.json"))
local store_of = T.slice_store
teardown(T.drop_stores)

-- run.c's continuation of case c, n tokens of it (run.c stops at BOS, id 1)
local function expected(c, n)
  local out = {}
  for i = 1, math.min(n, #c.generated_ids) do out[i] = c.generated_ids[i] end
  return out
end

describe("serving many requests", function()
  after_each(function() collectgarbage() collectgarbage() end)

  it("gives interleaved iterators their own tokens, in-process, as each prompt alone", function()
    local m = loip.model.open(S260, { threads = 1, context = 256, max_batch = 3 })
    local its, sts = {}, {}
    for k = 1, 5 do -- five requests, three slots: two wait in the queue for a slot
      local c = greedy.cases[k + 1]
      its[k], sts[k] = m:generate(c.prompt_ids, { temperature = 0, max_tokens = 20, stop = { 1 } })
    end
    local live = 5
    while live > 0 do
      live = 0
      for k = 5, 1, -1 do -- pulled in another order than submitted
        if its[k] and its[k]() then live = live + 1 else its[k] = nil end
      end
    end
    for k = 1, 5 do assert.are.same(expected(greedy.cases[k + 1], 20), sts[k].token_ids) end
    local b = m:batcher()
    assert.are.equal(0, b.kv_used)
    assert.is_true(b.stats.batch_sum / b.stats.steps > 2, "requests ran together")
    m:close()
  end)

  it("runs 8 concurrent greedy requests on 3 offloading devices as one batch, each as it runs alone", function()
    local st = store_of(S260, "s260")
    local c = cluster.start_local { store = st, devices = 3, threads = 1, mem = { "1000K", "1000K", "1000K" } }
    local ok, err = pcall(function()
      c:plan { context = 256, batch = 32, max_batch = 8, kv_tokens = 8 * 128 }
      local offloaded = 0
      for _, d in ipairs(c.plan_table.devices) do
        for _, s in ipairs(d.stages) do offloaded = offloaded + s.offloaded end
      end
      assert.is_true(offloaded > 0, "the budgets make the plan offload")
      local b = c:batcher()
      local reqs = {}
      for k = 1, 8 do
        local case = greedy.cases[(k - 1) % #greedy.cases + 1]
        reqs[k] = b:submit { prompt = case.prompt_ids, max_tokens = 24, sampler = { temperature = 0 }, stop = { [1] = true } }
      end
      b:drain()
      for k = 1, 8 do
        local case = greedy.cases[(k - 1) % #greedy.cases + 1]
        assert.are.same(expected(case, 24), reqs[k].token_ids)
      end
      assert.is_true(b.stats.batch_sum / b.stats.steps > 6, "the requests decoded together")
      assert.are.equal(0, b.kv_used)
      -- a request cancelled half-way frees its slot: the next ones still run to the reference
      local r = b:submit { prompt = greedy.cases[2].prompt_ids, max_tokens = 50, sampler = { temperature = 0 } }
      r:next() r:next()
      r:cancel()
      assert.are.equal("cancelled", r.finish_reason)
      -- two c:generate iterators pulled in turn: each its own tokens (B's used to come out of A)
      local ia, sa = c:generate(greedy.cases[3].prompt_ids, { max_tokens = 12, sampler = { temperature = 0 }, stop = { [1] = true } })
      local ib, sb = c:generate(greedy.cases[4].prompt_ids, { max_tokens = 12, sampler = { temperature = 0 }, stop = { [1] = true } })
      local a_live, b_live = true, true
      while a_live or b_live do
        a_live = a_live and ia() ~= nil
        b_live = b_live and ib() ~= nil
      end
      assert.are.same(expected(greedy.cases[3], 12), sa.token_ids)
      assert.are.same(expected(greedy.cases[4], 12), sb.token_ids)
    end)
    c:close()
    assert(ok, err)
  end)

  it("queues what does not fit yet and refuses at once what never can", function()
    local m = loip.model.open(S260, { threads = 1, context = 64, max_batch = 2, kv_tokens = 64 })
    local b = m:batcher({ max_queue = 1 })
    local ids = greedy.cases[2].prompt_ids
    -- 64 KV positions: two requests of 32 fit at once, the third waits for one of them
    local r1 = b:submit { prompt = ids, max_tokens = 32 - #ids, sampler = { temperature = 0 } }
    local r2 = b:submit { prompt = ids, max_tokens = 32 - #ids, sampler = { temperature = 0 } }
    local r3 = b:submit { prompt = ids, max_tokens = 32 - #ids, sampler = { temperature = 0 } }
    assert.are.equal("queued", r3.state)
    assert.are.equal(2, b:active())
    local ok, e = pcall(b.submit, b, { prompt = ids, max_tokens = 4 })
    assert.is_false(ok)
    assert.are.equal("overloaded", e.kind)
    assert.matches("max_queue 1", tostring(e), 1, true)
    b:drain()
    assert.are.same(r1.token_ids, r3.token_ids)
    assert.are.same(r1.token_ids, r2.token_ids)
    -- a prompt as long as the context, or a request needing more KV than the pool: refused
    local long = {}
    for i = 1, 64 do long[i] = ids[(i - 1) % #ids + 1] end
    ok, e = pcall(b.submit, b, { prompt = long })
    assert.is_false(ok)
    assert.are.equal("too_long", e.kind)
    ok, e = pcall(b.submit, b, { prompt = ids, max_tokens = 60, strict = true })
    assert.is_false(ok)
    assert.matches("leave room for", tostring(e), 1, true)
    m:close()
  end)

  it("grows each device's KV account with the context on a cluster (kv_grows), the same tokens", function()
    local st = store_of(S260, "s260")
    local c = cluster.start_local { store = st, devices = 2, threads = 1, mem = { "4M", "4M" } }
    local ok, err = pcall(function()
      c:plan { context = 256, kv_grows = true }
      local before = c:stats()
      local it, s = c:generate(greedy.cases[2].prompt_ids, { max_tokens = 40, sampler = { temperature = 0 }, stop = { [1] = true } })
      local mid
      for _ in it do if #s.token_ids == 20 then mid = c:stats() end end
      assert.are.same(expected(greedy.cases[2], 40), s.token_ids)
      local after = c:stats()
      for i = 1, 2 do
        assert.is_true(mid[i].accounts.kv > before[i].accounts.kv, "device " .. i .. " took KV as the context grew")
        assert.are.equal(before[i].accounts.kv, after[i].accounts.kv, "and gave it back when the request ended")
        assert.is_true(after[i].peak_bytes <= after[i].budget_bytes)
        assert.is_true(after[i].peak_rss_bytes > 0)
      end
    end)
    c:close()
    assert(ok, err)
  end)
end)
