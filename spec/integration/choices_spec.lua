-- n > 1 choices of one prompt (loip.engine.request.choices): the prompt prefilled once and its KV shared
-- copy-on-write by the n sequences. At temperature 0 the n choices are equal to each other and to
-- the request alone (run.c's text), in-process and on 3 local devices that offload; at 0.8 each
-- choice draws from its own stream (seed + its index); the shared groups are reserved once and
-- the reservation goes back to 0; the first choice's KV is unchanged by the others' writes (its
-- tokens are the request's alone); n larger than the slots is refused naming n.
local loip = require "loip"
local cluster = require "loip.cluster"
local exec = require "loip.runtime.exec"
local json = require "loip.text.json"
local T = require "spec.support"
teardown(function() T.cleanup() end)

local S260 = T.root .. "/models/stories260K"
local greedy = assert(json.load(S260 .. "/reference/greedy.json"))
teardown(T.drop_stores)

local expected = T.reference_ids -- (run.c's continuation of a case)

-- a prompt of 40 tokens (two full groups and a partial one shared), from the references
local function long_prompt()
  local ids = {}
  for _, c in ipairs(greedy.cases) do
    for _, id in ipairs(c.prompt_ids) do if #ids < 40 then ids[#ids + 1] = id end end
    for _, id in ipairs(c.generated_ids) do if #ids < 40 and id ~= 1 then ids[#ids + 1] = id end end
  end
  return ids
end

local function wait_all(r) for _, c in ipairs(r.choices) do c:wait() end end

describe("n > 1 choices", function()
  after_each(function() collectgarbage() collectgarbage() end)

  it("gives n equal choices at temperature 0, sharing the prompt's KV once (one device)", function()
    local m = loip.model.open(S260, { threads = 1, context = 256, max_batch = 4 })
    local b = m:batcher()
    local case = greedy.cases[2]
    local r = b:submit { prompt = case.prompt_ids, max_tokens = 24, sampler = { temperature = 0 }, stop = { [1] = true }, n = 3 }
    assert.are.equal(3, #r.choices)
    assert.are.equal(r, r.choices[1])
    -- admitted together: 3 slots, the prompt's full groups reserved once
    local kb, P = b.engine.kv_block, #case.prompt_ids
    local shared = math.floor((P - 1) / kb)
    local own = math.ceil((P + 24) / kb) - shared
    assert.are.equal(shared + 3 * own, b.kv_used)
    wait_all(r)
    for i, c in ipairs(r.choices) do
      assert.are.equal(i - 1, c.choice)
      assert.are.same(expected(case, 24), c.token_ids)
    end
    assert.are.equal(0, b.kv_used)
    -- a prompt with full groups shared: 2 full groups named by all three, the partial one copied
    local ids = long_prompt()
    local before = exec.session_kv_share_stats(m:session())
    local r2 = b:submit { prompt = ids, max_tokens = 10, sampler = { temperature = 0 }, n = 3 }
    b:step() -- the first choice prefills 39 positions; the others share them
    local st = exec.session_kv_share_stats(m:session())
    assert.are.equal(2 + 1, st.shared_groups, "two full groups and the partial one named by 3 sequences")
    wait_all(r2)
    local after = exec.session_kv_share_stats(m:session())
    assert.are.equal(before.cow_copies + 2, after.cow_copies, "the partial group copied once by each other choice")
    local alone = b:submit { prompt = ids, max_tokens = 10, sampler = { temperature = 0 } }
    alone:wait()
    for _, c in ipairs(r2.choices) do assert.are.same(alone.token_ids, c.token_ids) end
    assert.are.equal(0, b.kv_used)
    assert.are.equal(after.n_groups, exec.session_kv_share_stats(m:session()).free_groups, "every group back")
    m:close()
  end)

  it("draws each choice from its own stream at temperature 0.8 (seed + index)", function()
    local m = loip.model.open(S260, { threads = 1, context = 256, max_batch = 3 })
    local b = m:batcher()
    local ids = greedy.cases[3].prompt_ids
    local r = b:submit { prompt = ids, max_tokens = 30, sampler = { temperature = 0.8 }, seed = 7, n = 3 }
    wait_all(r)
    local seen = {}
    for i, c in ipairs(r.choices) do
      assert.are.equal(7 + i - 1, c.seed)
      assert.are.equal(30, #c.token_ids)
      -- each as a request alone with its seed
      local one = b:submit { prompt = ids, max_tokens = 30, sampler = { temperature = 0.8 }, seed = 7 + i - 1 }
      one:wait()
      assert.are.same(one.token_ids, c.token_ids)
      seen[table.concat(c.token_ids, ",")] = true
    end
    local k = 0
    for _ in pairs(seen) do k = k + 1 end
    assert.is_true(k > 1, "the streams differ")
    m:close()
  end)

  it("refuses n larger than the slots, naming n, and changes nothing", function()
    local m = loip.model.open(S260, { threads = 1, context = 64, max_batch = 2 })
    local b = m:batcher()
    local ok, e = pcall(b.submit, b, { prompt = greedy.cases[2].prompt_ids, max_tokens = 5, n = 3 })
    assert.is_false(ok)
    assert.are.equal("invalid", e.kind)
    assert.are.equal("n", e.param)
    assert.matches("n = 3", tostring(e))
    assert.are.equal(0, b:queued())
    assert.are.equal(0, b.kv_used)
    ok, e = pcall(b.submit, b, { prompt = greedy.cases[2].prompt_ids, max_tokens = 5, n = 0 })
    assert.are.equal("n", e.param)
    m:close()
  end)

  it("gives n equal choices on 3 offloading devices, as the request alone", function()
    local st = T.slice_store(S260, "s260")
    local c = cluster.start_local { store = st, devices = 3, threads = 1, mem = { "1000K", "1000K", "1000K" } }
    local ok, err = pcall(function()
      c:plan { context = 256, batch = 32, max_batch = 4, kv_tokens = 4 * 128 }
      local b = c:batcher()
      local ids = long_prompt()
      local r = b:submit { prompt = ids, max_tokens = 16, sampler = { temperature = 0 }, n = 3 }
      wait_all(r)
      local alone = b:submit { prompt = ids, max_tokens = 16, sampler = { temperature = 0 } }
      alone:wait()
      for _, x in ipairs(r.choices) do assert.are.same(alone.token_ids, x.token_ids) end
      local case = greedy.cases[2]
      local r2 = b:submit { prompt = case.prompt_ids, max_tokens = 20, sampler = { temperature = 0 }, stop = { [1] = true }, n = 2 }
      wait_all(r2)
      for _, x in ipairs(r2.choices) do assert.are.same(expected(case, 20), x.token_ids) end
      assert.are.equal(0, b.kv_used)
    end)
    c:close()
    assert(ok, err)
  end)
end)
