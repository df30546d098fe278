-- Sampling at the head (loip.engine.request.head_sample): a request asking for logprobs gets the log of
-- the model's probabilities of its chosen tokens (checked against m:logits, the model's own
-- logits at every position) and its tokens are those it gets without them, greedy or sampled
-- with a seed, in-process and on 3 offloading devices (the last device returns logits rows).
local loip = require "loip"
local cluster = require "loip.cluster"
local json = require "loip.text.json"
local T = require "spec.support"
teardown(function() T.cleanup() end)

local S260 = T.root .. "/models/stories260K"
local greedy = assert(json.load(S260 .. "/reference/greedy.json"))
teardown(T.drop_stores)

local function run_pair(b, prompt, sampler_opts, seed)
  local plain = b:submit { prompt = prompt, max_tokens = 24, sampler = sampler_opts, seed = seed, stop = { [1] = true } }
  local with = b:submit { prompt = prompt, max_tokens = 24, sampler = sampler_opts, seed = seed, stop = { [1] = true },
    logprobs = 3 }
  b:drain()
  return plain, with
end

local function check(m, b, V)
  local case = greedy.cases[2]
  for _, s in ipairs({ { temperature = 0 }, { temperature = 0.9, top_p = 0.95 } }) do
    local plain, with = run_pair(b, case.prompt_ids, s, 1234)
    assert.is_true(#with.token_ids > 5)
    assert.are.same(plain.token_ids, with.token_ids, "logprobs do not change the tokens")
    assert.are.equal(#with.token_ids, #with.token_logprobs)
    local ref = T.reference_logprobs(m, case.prompt_ids, with.token_ids)
    for j, lp in ipairs(with.token_logprobs) do
      assert.are.equal(with.token_ids[j], lp.id)
      assert.is_true(math.abs(lp.logprob - ref[j]) < 1e-4, string.format("token %d: %.6f vs %.6f", j, lp.logprob, ref[j]))
      assert.are.equal(3, #lp.top)
      for k = 2, 3 do assert.is_true(lp.top[k][2] <= lp.top[k - 1][2]) end
      if s.temperature == 0 then assert.are.equal(lp.id, lp.top[1][1], "greedy picks the most likely") end
    end
  end
end

describe("sampling at the head", function()
  after_each(function() collectgarbage() collectgarbage() end)

  it("gives the model's logprobs and the same tokens, in-process", function()
    local m = loip.model.open(S260, { threads = 1, context = 256, max_batch = 2 })
    check(m, m:batcher(), m.vocab_size)
    m:close()
  end)

  it("gives the model's logprobs and the same tokens on 3 offloading devices", function()
    local st = T.slice_store(S260, "s260")
    local m = loip.model.open(S260, { threads = 1, context = 256 })
    local c = cluster.start_local { store = st, devices = 3, threads = 1, mem = { "1000K", "1000K", "1000K" } }
    local ok, err = pcall(function()
      c:plan { context = 256, batch = 32, max_batch = 2, kv_tokens = 2 * 128 }
      check(m, c:batcher(), m.vocab_size)
    end)
    c:close()
    m:close()
    assert(ok, err)
  end)

  it("waits a step when the engine returns fewer rows of logits than requests want", function()
    local m = loip.model.open(S260, { threads = 1, context = 256, max_batch = 3 })
    local b = m:batcher()
    local e = b.engine
    local saved = e.logits_tokens
    e.logits_tokens = 1 -- (as a cluster planned without room for more)
    local case = greedy.cases[2]
    local rs = {}
    for k = 1, 3 do rs[k] = b:submit { prompt = case.prompt_ids, max_tokens = 8, sampler = { temperature = 0 }, logprobs = 0 } end
    b:drain()
    e.logits_tokens = saved
    for k = 1, 3 do
      local n = math.min(8, #case.generated_ids)
      local want = {}
      for i = 1, n do want[i] = case.generated_ids[i] end
      assert.are.same(want, rs[k].token_ids)
    end
    m:close()
  end)
end)
