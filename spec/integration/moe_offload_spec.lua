-- A mixture of experts with offloaded MLP blocks: their routed experts come from disk through the
-- device's expert cache (loip.model.experts), exactly: the logits equal the all-resident run's bit
-- for bit and the greedy tokens are the same, under every policy (lru, lfu, static from a routing
-- profile, the read-everything baseline), with and without pre-gating, caches of a few experts or
-- of all; only routed experts are read (the bytes of a step are the offloaded blocks' files and
-- one expert file per expert the cache lacked); 3 devices give the single device's tokens and
-- report their caches; the simulator plays the cache.
local loip = require "loip"
local json = require "loip.text.json"
local slice = require "loip.model.slice"
local T = require "spec.support"

after_each(function() collectgarbage() collectgarbage() end)
teardown(function() T.cleanup() end)

local SHAPE = "--dtype f32 --layers 4 --dim 64 --heads 4 --kv-heads 2 --ffn 32 --experts 8 --experts-per-token 2 "
  .. "--vocab 512 --seed 7 --std 0.3"
local IDS = { 1, 17, 290, 45, 100, 7, 260, 33, 12, 99, 4, 300 }

local dir
local function store()
  if dir then return dir .. "/store" end
  dir = T.tmpdir()
  local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth --like qwen3-30b-a3b %s %s/hf", T.loip, SHAPE, dir))
  assert.are.equal(0, rc, err)
  slice.write(dir .. "/hf", dir .. "/store", { quiet = true })
  return dir .. "/store"
end

-- A stage a layer; the layers in offloaded_layers read both their blocks every step (a stage
-- offloads its first blocks), their experts through a cache of `slots`.
local function layer_plan(slots, offloaded_layers)
  local stages = {}
  for l = 0, 3 do stages[#stages + 1] = { blocks = { 2 * l, 2 * l + 1 }, offloaded = offloaded_layers[l] and 2 or 0 } end
  return { slots = 1, devices = { { expert_slots = slots, stages = stages } } }
end

local function logits_of(m)
  local out = m:logits(IDS)
  local t = {}
  for i = 0, #IDS * m.vocab_size - 1 do t[i + 1] = out[i] end
  return t
end

local function greedy(m, n)
  local it, st = m:generate("Once upon a time", { temperature = 0, max_tokens = n or 10, ignore_eos = true })
  for _ in it do end
  return st.token_ids
end

describe("offloaded experts", function()
  local want_logits, want_tokens
  setup(function()
    local m = loip.model.open(store(), { threads = 1, context = 64 })
    want_logits, want_tokens = logits_of(m), greedy(m)
    assert.is_nil(m.experts) -- (everything resident: no cache)
    m:close()
  end)

  it("give the resident run's logits bit for bit and its tokens, under every policy and cache size", function()
    local all_off = { [0] = true, true, true, true }
    for _, case in ipairs({
      { slots = 2, experts = "lru:prefetch=0" }, { slots = 2, experts = "lru" }, { slots = 5, experts = "lfu:prefetch=2" },
      { slots = 32, experts = "lru" }, { slots = 8, experts = "all" }, { slots = 3, experts = "lfu" },
    }) do
      local m = loip.model.open(store(), { threads = 1, context = 64, plan = layer_plan(case.slots, all_off),
        experts = case.experts })
      assert.is_truthy(m.experts, case.experts)
      local got, differ = logits_of(m), 0
      for i = 1, #want_logits do if got[i] ~= want_logits[i] then differ = differ + 1 end end
      assert.are.equal(0, differ, case.experts .. " " .. case.slots)
      assert.are.same(want_tokens, greedy(m), case.experts)
      local st = m.experts:stats()
      assert.is_true(st.routed > 0 and st.bound == 0, case.experts)
      assert.are.equal(case.slots, st.slots)
      m:close()
    end
  end)

  it("read only the routed experts the cache lacks (without pre-gating: exactly those, and the blocks' files)", function()
    local m = loip.model.open(store(), { threads = 1, context = 64, plan = layer_plan(3, { [1] = true, [2] = true }),
      experts = "lru:prefetch=0" })
    local man = m.facts_manifest
    local size = {}
    for _, f in ipairs(man.files) do size[f.name] = f.size end
    local blocks = size["layer-001-mha.bin"] + size["layer-001-mlp.bin"] + size["layer-002-mha.bin"] + size["layer-002-mlp.bin"]
    local expert_bytes = size["layer-001-exp-000.bin"]
    local it = m:generate({ 1, 17, 290 }, { temperature = 0, max_tokens = 8, ignore_eos = true })
    it() -- (the prompt's step)
    for _ = 1, 6 do
      local r0, x0 = m:runner_stats(), m.experts:stats()
      it()
      local r1, x1 = m:runner_stats(), m.experts:stats()
      local misses = x1.read - x0.read
      -- a token picks 2 of 8 experts in each layer; of the 2 offloaded ones', at most 4 reads, hits for the rest
      assert.are.equal(8, x1.routed - x0.routed)
      assert.are.equal(4, x1.bound - x0.bound) -- (the resident layers')
      assert.is_true(misses <= 4, "misses " .. misses)
      assert.are.equal(4 - misses, x1.cache_hits - x0.cache_hits)
      assert.are.equal(blocks, r1.bytes_loaded - r0.bytes_loaded)
      assert.are.equal(misses * expert_bytes, x1.bytes_read - x0.bytes_read)
    end
    m:close()
    -- the baseline reads all 8 experts of each offloaded layer every step, a slot for each or not
    for _, slots in ipairs({ 8, 3 }) do
      m = loip.model.open(store(), { threads = 1, context = 64, plan = layer_plan(slots, { [1] = true, [2] = true }),
        experts = "all" })
      local it2 = m:generate({ 1, 17, 290 }, { temperature = 0, max_tokens = 4, ignore_eos = true })
      it2()
      local x0 = m.experts:stats()
      it2()
      local x1 = m.experts:stats()
      assert.are.equal(2 * 8 * expert_bytes, x1.bytes_read - x0.bytes_read, slots .. " slots")
      m:close()
    end
  end)

  it("serves several requests in one batch and grows its KV online, the tokens unchanged", function()
    local m = loip.model.open(store(), { threads = 1, context = 64, max_batch = 2,
      plan = layer_plan(3, { [1] = true, [3] = true }), experts = "lfu" })
    local a_it, a = m:generate("Once upon a time", { temperature = 0, max_tokens = 10, ignore_eos = true })
    local b_it, b = m:generate("the cat", { temperature = 0, max_tokens = 10, ignore_eos = true })
    local a_done, b_done = false, false
    while not (a_done and b_done) do -- (interleaved: both in every step)
      if not a_done then a_done = a_it() == nil end
      if not b_done then b_done = b_it() == nil end
    end
    m:close()
    assert.are.same(want_tokens, a.token_ids)
    local alone = loip.model.open(store(), { threads = 1, context = 64 })
    local it, st = alone:generate("the cat", { temperature = 0, max_tokens = 10, ignore_eos = true })
    for _ in it do end
    alone:close()
    assert.are.same(st.token_ids, b.token_ids)
    -- a plan for 16 positions whose KV grows online (the caches leave it its room)
    local rc, r, err = T.generate_json(store(), "--mem 1100K --context 64 --plan-positions 16 --max-tokens 40 --ignore-eos")
    assert.are.equal(0, rc, err)
    local rc2, r2, err2 = T.generate_json(store(), "--context 64 --max-tokens 40 --ignore-eos")
    assert.are.equal(0, rc2, err2)
    assert.are.same(r2.token_ids, r.token_ids)
    assert.is_truthy(r.experts, "experts offloaded")
  end)

  it("moves an MLP block's experts with it in a live restage, both ways, the tokens unchanged", function()
    local m = loip.model.open(store(), { threads = 1, context = 64, mem = "4M", plan = layer_plan(nil, {}) })
    assert.is_nil(m.experts) -- (everything resident: no cache yet)
    local used0 = m.budget:used()
    m:restage(3, 2) -- layer 2's attention and MLP blocks offloaded: its experts leave memory for a new cache
    assert.is_truthy(m.experts)
    assert.is_true(m.budget:used() < used0, "the experts' memory went back")
    assert.are.same(want_tokens, greedy(m))
    local st = m.experts:stats()
    assert.is_true(st.routed > st.bound, "layer 2's experts read through the cache")
    m:restage(2, 2) -- and layer 1's: the same cache serves it too
    assert.are.same(want_tokens, greedy(m))
    m:restage(3, 0) -- layer 2 back: its experts read into memory and bound again
    m:restage(2, 0)
    local before = m.experts:stats()
    assert.are.same(want_tokens, greedy(m))
    local after = m.experts:stats()
    assert.are.equal(after.routed - before.routed, after.bound - before.bound) -- (every layer's experts resident again)
    local logits = logits_of(m)
    local differ = 0
    for i = 1, #want_logits do if logits[i] ~= want_logits[i] then differ = differ + 1 end end
    assert.are.equal(0, differ)
    m:close()
  end)

  it("the trace shows expert reads on the disk lane", function()
    local trace = dir .. "/trace.json"
    local rc, _, err = T.generate_json(store(), "--mem 900K --context 64 --max-tokens 4 --trace " .. trace)
    assert.are.equal(0, rc, err)
    local t = json.load(trace)
    local reads = 0
    for _, e in ipairs(t.traceEvents or t) do
      if e.cat == "load" and (e.name or ""):match("^read expert %d+ of layer %d+$") then
        reads = reads + 1
        assert.matches("^layer %d+ mlp expert %d+$", e.args.blocks)
      end
    end
    assert.is_true(reads > 0, "no expert read in the trace")
  end)

  it("a routing profile pins the experts it saw most (static), and the tokens stay", function()
    local m = loip.model.open(store(), { threads = 1, context = 64 })
    local r = require("loip.model.experts").profile_routing(m, { "Once upon a time", "a b c d e f g" })
    m:close()
    assert.are.equal("loip-routing", r.format)
    assert.are.equal(4, #r.frequencies)
    for _, f in ipairs(r.frequencies) do
      local sum = 0
      for _, v in ipairs(f) do sum = sum + v end
      assert.is_true(math.abs(sum - 2) < 1e-9, "a layer's frequencies sum to top-k: " .. sum)
    end
    local path = dir .. "/routing.json"
    assert(json.write_file(path, json.encode(r)))
    local routing = require("loip.model.experts").load_routing(path)
    m = loip.model.open(store(), { threads = 1, context = 64, plan = layer_plan(6, { [0] = true, [3] = true }),
      experts = "static", routing = routing })
    assert.are.same(want_tokens, greedy(m))
    local st = m.experts:stats()
    assert.is_true(st.cache_hits > 0)
    m:close()
    local ok, err = pcall(loip.model.open, store(), { threads = 1, context = 64, plan = layer_plan(6, { [0] = true }),
      experts = "static" })
    assert.is_false(ok)
    assert.matches("routing%-profile", err)

  end)

  it("loip profile --routing writes a profile; a damaged one is refused naming the field", function()
    local prompts = dir .. "/prompts.txt"
    T.write(prompts, "Once upon a time\nthe cat sat\n")
    local out = dir .. "/r.json"
    local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s profile --model %s --routing %s --out %s", T.loip, store(), prompts, out))
    assert.are.equal(0, rc, err)
    local r = json.load(out)
    assert.are.equal(2, r.prompts)
    assert.are.equal(8, #r.frequencies[1])
    r.frequencies[2] = { 1 }
    T.write(out, json.encode(r))
    local ok, lerr = pcall(require("loip.model.experts").load_routing, out)
    assert.is_false(ok)
    assert.matches("frequencies%[2%] must list 8 experts", lerr)
    -- a profile of another model is refused where it is used, naming it
    r.frequencies[2], r.layers, r.frequencies[4] = r.frequencies[1], 3, nil
    T.write(out, json.encode(r))
    local routing = require("loip.model.experts").load_routing(out)
    ok, lerr = pcall(loip.model.open, store(), { threads = 1, context = 64, plan = layer_plan(4, { [1] = true }),
      experts = "static", routing = routing })
    assert.is_false(ok)
    assert.matches("r%.json: a routing profile of 3 layers of 8 experts, the model has 4 of 8", lerr)
  end)

  it("3 devices with offloaded experts give the single device's tokens and report their caches", function()
    local rc, r, err = T.generate_json(store(), "--devices 3 --mem 650K --context 64 --max-tokens 10 "
      .. "--ignore-eos --experts lru")
    assert.are.equal(0, rc, err)
    assert.are.same(want_tokens, r.token_ids)
    local cached = 0
    for _, d in ipairs(r.devices) do if d.experts then cached = cached + 1 assert.is_true(d.experts.routed > 0) end end
    assert.is_true(cached > 0, "some device offloads experts")
  end)

  it("the scheduler's plans hold their budgets (routers kept for pre-gating and the smallest cache counted)", function()
    for _, mem in ipairs({ "520K", "560K", "600K", "650K", "700K", "800K" }) do
      local rc, out, err = T.run(string.format("LOIP_QUIET=1 %s plan --model %s --devices 3 --mem %s --context 64 --json",
        T.loip, store(), mem))
      assert.is_falsy(err:find("breaks a budget", 1, true), mem .. ": " .. err)
      if rc == 0 then
        local r = json.decode(out:match("([^\n]+)%s*$"))
        for i, d in ipairs(r.devices) do
          assert.is_true(d.memory_bytes <= tonumber(mem:sub(1, -2)) * 1024, mem .. " device " .. i)
        end
      else
        assert.matches("no plan fits", err)
      end
      -- the buffered loader's bounce buffers (the runner's and the expert cache's) are counted too
      local brc, _, berr = T.generate_json(store(), "--loader buffered --mem " .. mem .. " --context 64 --max-tokens 3")
      assert.is_true(brc == 0 or berr:find("no plan fits", 1, true) ~= nil or berr:find("cannot run this model", 1, true) ~= nil,
        mem .. " buffered: " .. berr)
    end
    -- no budget: a plan that offloads MLP blocks gets a cache of a layer's experts
    local m = loip.model.open(store(), { threads = 1, context = 64, plan = layer_plan(nil, { [1] = true, [2] = true }) })
    assert.are.equal(8, m.plan.devices[1].expert_slots)
    m:close()
    local ok, err = pcall(loip.model.open, store(), { threads = 1, context = 64, plan = layer_plan(2000, { [1] = true }) })
    assert.is_false(ok)
    assert.matches("expert_slots must be an integer in 1..1024", err)
  end)

  it("loses a device mid-generation and re-plans over the others, experts still offloaded: the same tokens", function()
    local cluster = require "loip.cluster"
    local c = cluster.start_local { store = store(), devices = 3, threads = 1, mem = 650 * 1024 }
    local ok, err = pcall(function()
      local p = c:plan { context = 64, batch = 64, experts = "lru" }
      local offloading = 0
      for _, d in ipairs(p.devices) do if d.expert_slots then offloading = offloading + 1 end end
      assert.is_true(offloading > 0, "a device reads experts")
      local it, st = c:generate("Once upon a time", { max_tokens = 10, sampler = { temperature = 0 }, stop = {} })
      local n, pid = 0, c.devices[2].pid
      for _ in it do
        n = n + 1
        if n == 4 then os.execute("kill -KILL " .. pid) end
      end
      assert.are.same(want_tokens, st.token_ids)
      assert.are.equal(1, #c.losses)
      assert.are.equal(2, #c.devices)
    end)
    c:close()
    assert(ok, err)
  end)

  it("the simulator plays the expert cache of a plan", function()
    local rc, out, err = T.run(string.format("LOIP_QUIET=1 %s simulate --model %s --devices 3 --mem 650K --context 64 "
      .. "--input-tokens 8 --output-tokens 8 --json", T.loip, store()))
    assert.are.equal(0, rc, err)
    local r = json.decode(out:match("([^\n]+)%s*$"))
    assert.is_true(r.ms_per_token > 0)
    local played = 0
    for _, d in ipairs(r.devices) do
      if d.experts then
        played = played + 1
        assert.is_true(d.experts.read + d.experts.cache_hits > 0 and d.experts.slots >= 2)
      end
    end
    assert.is_true(played > 0, "a device's expert cache was played")
    -- routes drawn from a routing profile instead
    T.write(dir .. "/p.txt", "Once upon a time\n")
    rc, out, err = T.run(string.format("LOIP_QUIET=1 %s profile --model %s --routing %s/p.txt --out %s/rp.json", T.loip, store(),
      dir, dir))
    assert.are.equal(0, rc, err)
    rc, out, err = T.run(string.format("LOIP_QUIET=1 %s simulate --model %s --devices 3 --mem 650K --context 64 "
      .. "--routing-profile %s/rp.json --json", T.loip, store(), dir))
    assert.are.equal(0, rc, err)
    r = json.decode(out:match("([^\n]+)%s*$"))
    assert.is_true(r.ms_per_token > 0)
  end)
end)
