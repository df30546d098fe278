-- Offloaded execution on one device: a slice store run through plans that re-read some blocks
-- from disk into a loader slot every step must give the same tokens and bit-identical logits
-- as the all-resident model, through the io_uring and the conventional (buffered) loader, for
-- stories260K and a synthetic BF16 Qwen2 model (q/k/v biases); budgets pick plans that fit or
-- are refused saying what to do; disk damage during a run is an error, never wrong weights.
local ffi = require "ffi"
local loip = require "loip"
local json = require "loip.text.json"
local plan = require "loip.plan"
local T = require "spec.support"
teardown(function() T.cleanup() end) -- the temporary directories made here

local S260 = T.root .. "/models/stories260K"
local greedy = assert(json.load(S260 .. "/reference/greedy.json"))

local function sh(cmd) return T.run("LOIP_QUIET=1 " .. cmd) end

local store_of = T.slice_store
teardown(T.drop_stores)

-- Logits of ids (a copy) and the greedy continuation of a prompt, then the model closed.
local function run(path, opts, ids, prompt)
  opts.threads, opts.context = opts.threads or 1, opts.context or 256
  local m = loip.model.open(path, opts)
  local out = m:logits(ids)
  local copy = ffi.new("float[?]", #ids * m.vocab_size)
  ffi.copy(copy, out, ffi.sizeof(copy))
  local it, st = m:generate(prompt, { temperature = 0, max_tokens = 40, stop = {} })
  for _ in it do end
  local info = { plan = m.plan, sizes = m.plan_sizes, loader = m.loader and m.loader:mode(), stats = m:runner_stats() }
  m:close()
  return copy, st.token_ids, info
end

-- A one-device plan: stages of the given block counts, each offloading its first k blocks.
local function plan_of(counts, k, slots)
  local p, at = { slots = slots or 1, devices = { { stages = {} } } }, 0
  for i, c in ipairs(counts) do
    p.devices[1].stages[i] = { blocks = { at, at + c - 1 }, offloaded = math.min(k, c) }
    at = at + c
  end
  return p
end

local function offloaded_share(info)
  local m = plan.memory(info.plan, 1, info.sizes)
  return m.offloaded_bytes / info.sizes.weight_bytes
end

describe("offloaded execution", function()
  after_each(function() collectgarbage() collectgarbage() end)

  it("gives stories260K's tokens and bit-identical logits with 0%, ~30% and ~70% offloaded, io_uring and buffered", function()
    local st = store_of(S260, "s260")
    local ids = greedy.cases[1].sequence_ids
    local prompt = greedy.cases[1].prompt
    local ref_l, ref_t = run(S260, {}, ids, prompt)
    local n = #ids * 512
    -- stories260K: 5 layers = 10 blocks (MHA 52 KiB, MLP 136 KiB)
    local plans = {
      { "0%", plan_of({ 10 }, 0), 0, 0 },
      { "~30% (S=5, MHA offloaded)", plan_of({ 2, 2, 2, 2, 2 }, 1), 0.2, 0.4 },
      { "~70% (S=2)", plan_of({ 5, 5 }, 4), 0.6, 0.8 },
      { "~70% (S=3, uneven, 2 slots)", plan_of({ 4, 3, 3 }, 3, 2), 0.6, 0.8 },
      { "all (S=10)", plan_of({ 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 }, 1), 0.85, 1 },
      { "~70% block by block (the conventional baseline)", (function()
        local p = plan_of({ 10 }, 8)
        p.per_block = true
        return p
      end)(), 0.6, 0.8 },
    }
    for _, loader in ipairs({ "uring", "buffered" }) do
      for _, c in ipairs(plans) do
        local what = c[1] .. ", " .. loader
        local l, t, info = run(st, { plan = c[2], loader = loader, batch = 7 }, ids, prompt)
        assert.are.equal(0, T.bit_diffs(ref_l, l, n), what)
        assert.are.same(ref_t, t, what)
        local share = offloaded_share(info)
        assert.is_true(share >= c[3] and share <= c[4], what .. ": offloaded " .. share)
        if share > 0 then
          assert.are.equal(loader, info.loader, what)
          assert.is_true(info.stats.loads > 0 and info.stats.bytes_loaded > 0, what)
        else
          assert.is_nil(info.loader, what .. ": no loader without offloading")
        end
      end
    end
  end)

  it("keeps a loader alive while its runner holds it, in whatever order they are freed (a Lua state's exit)", function()
    local m = loip.model.open(store_of(S260, "s260"), { threads = 1, context = 64, plan = { slots = 1, devices = { { stages = {
      { blocks = { 0, 3 }, offloaded = 2 }, { blocks = { 4, 9 }, offloaded = 2 } } } } } })
    local it = m:generate({ 1, 403, 407 }, { temperature = 0, max_tokens = 3, stop = {} })
    it() -- (the next step's loads are in flight now)
    -- lua_close runs finalizers in no set order: the loader's before its runner's (which drains its loads)
    local core = require "loip.core"
    core.C.loip_loader_free(ffi.gc(m.loader.handle, nil))
    m.loader.handle, m.loader = nil, nil
    require("loip.runtime.exec").runner_free(m.runner) -- (under AddressSanitizer: no use after free)
    m.runner = nil
    m:close()
  end)

  it("uses one slot as a ring: the next stage's load starts while the current one computes", function()
    local st = store_of(S260, "s260")
    local ids = greedy.cases[1].sequence_ids
    local ref_l, ref_t = run(S260, {}, ids, ids)
    -- single-block stages, all offloaded; a slot of three MLPs holds two stages' loads at once
    local p = plan_of({ 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 }, 1)
    p.slot_bytes = 3 * 136 * 1024
    for _, loader in ipairs({ "uring", "buffered" }) do
      local m = loip.model.open(st, { plan = p, loader = loader, context = 256, threads = 1, trace = true })
      local l = m:logits(ids)
      assert.are.equal(0, T.bit_diffs(ref_l, l, #ids * 512), loader)
      local it, stt = m:generate(ids, { temperature = 0, max_tokens = 40, stop = {} })
      for _ in it do end
      assert.are.same(ref_t, stt.token_ids, loader)
      -- some load was submitted before the previous stage's offloaded compute had ended
      local ahead = 0
      local last_compute_end = {}
      for _, x in ipairs(m.trace.events) do
        local e = x.e
        if e.kind == "compute" and e.offloaded then last_compute_end[e.stage] = e.t1_ns end
        if e.kind == "load" then
          local prev = e.stage == 1 and 10 or e.stage - 1
          if last_compute_end[prev] and e.t0_ns < last_compute_end[prev] then ahead = ahead + 1 end
        end
      end
      assert.is_true(ahead > 0, loader .. ": no load overlapped the stage before it")
      assert.are.equal(3 * 136 * 1024, tonumber(m.loader:slot_bytes()))
      m:close()
    end
  end)

  it("runs a synthetic BF16 Qwen2 model offloaded as its source runs", function()
    local src = os.tmpname()
    os.remove(src)
    local rc, _, err = sh(string.format("%s synth --like qwen2.5-7b --dtype bf16 --layers 4 --dim 64 --heads 4 --kv-heads 2 --ffn 96 --std 0.3 --vocab 300 %s",
      T.loip, src))
    assert.are.equal(0, rc, err)
    local st = store_of(src, "qwen2")
    local ids = { 1, 17, 290, 45, 100, 7, 260, 33, 5, 5, 9 }
    local ref_l, ref_t = run(src, {}, ids, ids)
    for _, c in ipairs({ { plan_of({ 8 }, 0) }, { plan_of({ 2, 2, 2, 2 }, 1) }, { plan_of({ 3, 3, 2 }, 2, 2) },
      { plan_of({ 4, 4 }, 4) } }) do
      for _, loader in ipairs({ "uring", "buffered" }) do
        local l, t = run(st, { plan = c[1], loader = loader, batch = 4 }, ids, ids)
        assert.are.equal(0, T.bit_diffs(ref_l, l, #ids * 300), loader)
        assert.are.same(ref_t, t, loader)
      end
    end
    os.execute("rm -rf '" .. src .. "'")
  end)

  it("picks a plan that fits the budget, and says what to do when none does", function()
    local st = store_of(S260, "s260")
    local ids = greedy.cases[2].sequence_ids
    local ref_l, ref_t = run(S260, {}, ids, ids)
    local all = run(st, {}, ids, ids)
    assert.are.equal(0, T.bit_diffs(ref_l, all, #ids * 512))
    for _, mem in ipairs({ "1.3M", "1.1M", "1000K" }) do
      local l, t, info = run(st, { mem = mem }, ids, ids)
      assert.are.equal(0, T.bit_diffs(ref_l, l, #ids * 512), mem)
      assert.are.same(ref_t, t, mem)
      assert.is_true(offloaded_share(info) > 0.2, mem .. " forces offloading")
      assert.is_true(plan.memory(info.plan, 1, info.sizes).total <= require("loip.ui.flags").parse_bytes(mem), mem)
    end
    local ok, err = pcall(loip.model.open, st, { mem = "600K", context = 256 })
    assert.is_false(ok)
    assert.matches("memory budget of 600.0 KiB cannot run this model: even with every block offloaded it needs", err, 1, true)
    assert.matches("raise --mem or lower --context", err, 1, true)
    -- a given plan that does not fit: refused before loading, with the shortfall
    ok, err = pcall(loip.model.open, st, { mem = "1M", context = 256, plan = plan_of({ 10 }, 0) })
    assert.is_false(ok)
    assert.matches("plan: the plan needs .* but the memory budget has .*: short by", err)
  end)

  it("reads plans from Lua files and names what is wrong with a bad one", function()
    local st = store_of(S260, "s260")
    local dir = T.tmpdir()
    local good = dir .. "/good.lua"
    T.write(good, plan.to_lua(plan_of({ 4, 6 }, 2)))
    local m = loip.model.open(st, { plan = good, context = 64, threads = 1 })
    assert.are.same({ 0, 3 }, m.plan.devices[1].stages[1].blocks)
    assert.are.equal(2, m.plan.devices[1].stages[2].offloaded)
    m:close()
    local cases = {
      { "return { devices = { { stages = { { blocks = { 0, 4 } }, { blocks = { 6, 9 } } } } } }", "stages%[2%] starts at block 6" },
      { "return { devices = { { stages = { { blocks = { 0, 8 } } } } } }", "the stages end at block 8; the model has 10 blocks" },
      { "return { devices = { { stages = { { blocks = { 0, 9 }, offloaded = 11 } } } } }", "offloaded must be an integer in 0..10" },
      { "return { slots = 0, devices = { { stages = { { blocks = { 0, 9 } } } } } }", "slots must be a positive integer" },
      { "return { devices = { { stages = { { blocks = { 0, 9 } } } }, { stages = {} } } }", "2 devices" },
      { "return {", "bad.lua:1:" },
      { "return 42", "must return the plan table" },
      { "os.exit(3)", "attempt to index global 'os'" },
    }
    for _, c in ipairs(cases) do
      local bad = dir .. "/bad.lua"
      T.write(bad, c[1])
      local ok, err = pcall(loip.model.open, st, { plan = bad, context = 64 })
      assert.is_false(ok, c[1])
      assert.matches(c[2], err, 1, false, c[1])
      assert.matches(bad, err, 1, true)
    end
  end)

  it("fails a step whose block file was truncated while in use, and recovers when it is back", function()
    local st = store_of(S260, "s260")
    local copy = T.tmpdir() .. "/st"
    os.execute(string.format("cp -r '%s' '%s'", st, copy))
    local ids = greedy.cases[3].sequence_ids
    local ref_l = run(S260, {}, ids, ids)
    for _, loader in ipairs({ "uring", "buffered" }) do
      local m = loip.model.open(copy, { plan = plan_of({ 5, 5 }, 3), loader = loader, context = 256, threads = 1 })
      local victim = copy .. "/layer-002-mlp.bin" -- offloaded in stage 2
      local saved = T.read(victim)
      local f = assert(io.open(victim, "wb"))
      f:write(saved:sub(1, 4096))
      f:close()
      local ok, err = pcall(m.logits, m, ids)
      assert.is_false(ok, loader)
      assert.matches("layer%-002%-mlp%.bin", err)
      T.write(victim, saved)
      local l = m:logits(ids)
      assert.are.equal(0, T.bit_diffs(ref_l, l, #ids * 512), loader .. ": after the file is back")
      m:close()
    end
  end)

  it("prints the plan, writes a Chrome trace and reports per-token figures from loip generate", function()
    local st = store_of(S260, "s260")
    local trace = T.tmpdir() .. "/t.json"
    local rc, out, err = sh(string.format("%s generate --model %s --prompt 'Once upon a time' --temperature 0 --max-tokens 20 --mem 1.1M --context 256 --trace %s",
      T.loip, st, trace))
    assert.are.equal(0, rc, err)
    assert.matches("^Once upon a time, there was a little girl named Lily", out)
    assert.matches("plan: 1 device x %d+ stages? %(%d+ hops? around the ring%), 1 slot", err)
    assert.matches("offloaded: .* re%-read every step", err)
    assert.matches("loader: io_uring", err)
    local tr = assert(json.load(trace))
    local lanes, kinds = {}, {}
    for _, e in ipairs(tr.traceEvents) do
      if e.ph == "M" and e.name == "thread_name" then lanes[e.args.name] = e.tid end
      if e.ph == "X" then
        kinds[e.cat] = (kinds[e.cat] or 0) + 1
        assert.is_true(e.dur >= 0 and e.ts >= 0)
      end
    end
    assert.is_truthy(lanes.disk and lanes.compute and lanes.wait)
    assert.is_true(kinds.load > 20 and kinds.compute > 20 and kinds.wait > 20)
    rc, out, err = sh(string.format("%s generate --model %s --prompt 'Once upon a time' --temperature 0 --max-tokens 10 --mem 1.1M --context 256 --loader buffered --json",
      T.loip, st))
    assert.are.equal(0, rc, err)
    local j = json.decode(out)
    assert.are.equal("buffered", j.loader)
    assert.is_true(j.plan.memory.offloaded_bytes > 0)
    assert.is_true(j.runner.loads > 0 and j.runner.compute_ms > 0)
    -- flags that need a store
    rc, _, err = sh(string.format("%s generate --model %s --plan x.lua --prompt hi", T.loip, S260))
    assert.are.equal(2, rc)
    assert.matches("%-%-plan needs a slice store", err)
  end)
end)
