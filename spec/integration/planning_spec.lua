-- The decision layer end to end: every scheduler's plan runs on a cluster of local workers and
-- gives the single device's tokens and logits; `loip plan` and `loip profile` from the command
-- line (JSON, refusals with the device and the shortfall, --like shapes, --save-plan/--plan,
-- files of one's own as schedulers, a slower device taken into account); generate --devices with
-- --scheduler and its estimate beside the measured time.
local ffi = require "ffi"
local loip = require "loip"
local cluster = require "loip.cluster"
local json = require "loip.text.json"
local plan = require "loip.plan"
local T = require "spec.support"

local S260 = T.root .. "/models/stories260K"
local greedy = assert(json.load(S260 .. "/reference/greedy.json"))
local store_of = T.slice_store
teardown(T.drop_stores)

local function sh(cmd) return T.run(cmd) end

describe("the schedulers on a cluster", function()
  after_each(function() T.cleanup() collectgarbage() collectgarbage() end)

  it("each give a plan that runs losslessly: stories260K's tokens and bit-identical logits", function()
    local st = store_of(S260, "s260")
    local ids = greedy.cases[1].sequence_ids
    local m = loip.model.open(S260, { threads = 1, context = 256, tokenizer = false })
    local out = m:logits(ids)
    local V = m.vocab_size
    local ref_l = ffi.new("float[?]", #ids * V)
    ffi.copy(ref_l, out, ffi.sizeof(ref_l))
    local it, ref_st = m:generate(ids, { temperature = 0, max_tokens = 20, stop = {} })
    for _ in it do end
    m:close()
    local dir = T.tmpdir()
    T.write(dir .. "/mine.lua", T.read(T.root .. "/recipes/policies/examples/greedy.lua"))
    -- budgets that make the offloading schedulers read, and none (the ones that cannot read)
    local tight = { 600 * 1024, 580 * 1024, 610 * 1024 }
    local cases = {
      { "loip", tight }, { "even", tight }, { "uniform", { 1100 * 1024, 1100 * 1024, 1100 * 1024 } },
      { "pipeline-offload", tight }, { "brute", tight }, { dir .. "/mine.lua", tight },
      { "pipeline", { 0, 0, 0 } }, { "edgeshard", { 0, 0, 0 } },
    }
    for _, budgets in ipairs({ tight, { 0, 0, 0 }, { 1100 * 1024, 1100 * 1024, 1100 * 1024 } }) do
      local c = cluster.start_local { store = st, devices = 3, mem = budgets, threads = 1 }
      local ok, err = pcall(function()
        for _, case in ipairs(cases) do
          if case[2] == budgets then
            local p, est, info = c:plan { scheduler = case[1], context = 256, batch = 7, logits_tokens = 4,
              link = { rate = "100mbit", delay_ms = 0.5 } }
            local what = case[1]
            assert.is_truthy(est and est.ms_per_token > 0, what)
            assert.is_truthy(info.scheduler_ms >= 0, what)
            if budgets == tight and (case[1] == "loip" or case[1] == "pipeline-offload") then
              local read = 0
              for i = 1, 3 do read = read + plan.memory(p, i, c.sizes, { cluster = true }).offloaded_bytes end
              assert.is_true(read > 0, what .. " reads blocks under these budgets")
            end
            assert.are.equal(0, T.bit_diffs(ref_l, c:logits(ids), #ids * V), what)
            local git = c:generate(ids, { max_tokens = 20, sampler = { temperature = 0 } })
            local got = {}
            for id in git do got[#got + 1] = id end
            assert.are.same(ref_st.token_ids, got, what)
          end
        end
      end)
      c:close()
      assert(ok, err)
    end
  end)
end)

describe("loip plan", function()
  after_each(T.cleanup)

  it("prints a plan and its predicted breakdown as JSON, and --plan runs what --save-plan wrote", function()
    local st = store_of(S260, "s260")
    local dir = T.tmpdir()
    local rc, out, err = sh(string.format("%s plan --model %s --devices 3 --mem 740K,720K,750K --disk-rate 200M "
      .. "--link-rate 100mbit --link-delay 2ms --context 256 --threads 1 --save-plan %s/p.lua --json", T.loip, st, dir))
    assert.are.equal(0, rc, err)
    local j = json.decode(out)
    assert.is_nil(plan.check(j.plan, 10))
    assert.are.equal(3, #j.plan.devices)
    assert.is_true(j.estimate_ms_per_token > 0 and j.scheduler_ms >= 0)
    assert.are.equal("loip", j.scheduler)
    assert.are.equal(3, #j.devices)
    for _, d in ipairs(j.devices) do
      for _, k in ipairs({ "comp_ms", "load_ms", "uncover_ms", "comm_ms", "memory_bytes" }) do assert.is_number(d[k], k) end
    end
    assert.is_true(j.devices[1].memory_bytes <= 740 * 1024 and j.devices[2].memory_bytes <= 720 * 1024)
    -- the same plan, read back and run: the single device's text
    local gen = "%s generate --model %s --prompt 'Once upon a time' --temperature 0 --max-tokens 24 --threads 1 --context 256"
    local rc1, single = sh(string.format(gen, T.loip, S260) .. " 2>/dev/null")
    assert.are.equal(0, rc1)
    local rc2, out2, err2 = sh(string.format(gen, T.loip, st) .. string.format(" --devices 3 --mem 740K,720K,750K --plan %s/p.lua", dir))
    assert.are.equal(0, rc2, err2)
    assert.are.equal(single, out2)
    -- the human form: per device memory and what it reads, the estimate's parts
    local rc3, _, err3 = sh(string.format("%s plan --model %s --devices 3 --mem 740K,720K,750K --context 256 --threads 1", T.loip, st))
    assert.are.equal(0, rc3, err3)
    assert.matches("plan: 3 devices x %d+ stages", err3)
    assert.matches("estimate: [%d.]+ ms/token = compute [%d.]+ %+ communication [%d.]+ %+ uncovered loading", err3)
  end)

  it("plans a shape with no weights, a model directory, and a scheduler of one's own", function()
    local rc, out, err = sh(string.format("%s plan --like llama-3.3-70b --devices 8 --mem 24G,24G,12G,12G,12G,6G,6G,6G "
      .. "--link-rate 100mbit --link-delay 1ms --json", T.loip))
    assert.are.equal(0, rc, err)
    local j = json.decode(out)
    assert.are.equal(8, #j.plan.devices)
    assert.is_nil(plan.check(j.plan, 160))
    -- (how fast it decides is recipes/bench/schedulers.lua's to measure: a busy machine is slow)
    assert.is_true(type(j.scheduler_ms) == "number" and j.scheduler_ms >= 0)
    rc, out, err = sh(string.format("%s plan --model %s --devices 2 --mem 700K,700K --context 64 --json", T.loip, S260))
    assert.are.equal(0, rc, err)
    assert.are.equal(2, #json.decode(out).plan.devices)
    local dir = T.tmpdir()
    T.write(dir .. "/mine.lua", T.read(T.root .. "/recipes/policies/examples/greedy.lua"))
    rc, out, err = sh(string.format("%s plan --model %s --devices 3 --context 256 --scheduler %s/mine.lua --json", T.loip, S260, dir))
    assert.are.equal(0, rc, err)
    assert.are.equal("greedy", json.decode(out).scheduler)
  end)

  it("plans for several requests at once: their KV caches in the budgets, their micro-batch in the estimate", function()
    local one = json.decode(select(2, sh(string.format("%s plan --model %s --devices 3 --context 256 --batch 32 --json", T.loip, S260))))
    local four = json.decode(select(2, sh(string.format("%s plan --model %s --devices 3 --context 256 --batch 32 --max-batch 4 --json",
      T.loip, S260))))
    for i = 1, 3 do assert.is_true(four.devices[i].memory_bytes > one.devices[i].memory_bytes) end
    local rc, _, err = sh(string.format("%s plan --model %s --devices 3 --batch 8 --max-batch 16", T.loip, S260))
    assert.are.equal(2, rc)
    assert.matches("--max-batch 16 is more than --batch 8", err, 1, true)
  end)

  it("weighs a slower device and a slower disk: it gets less to do", function()
    local st = store_of(S260, "s260")
    local function blocks_of(extra)
      local rc, out, err = sh(string.format("%s plan --model %s --devices 3 --context 256 --threads 1 --link-rate 1gbit "
        .. "--disk-rate 100M --json %s", T.loip, st, extra))
      assert.are.equal(0, rc, err)
      local p = json.decode(out).plan
      local n = 0
      for _, s in ipairs(p.devices[2].stages) do n = n + s.blocks[2] - s.blocks[1] + 1 end
      return n, json.decode(out)
    end
    local even_n = blocks_of("")
    local slow_n, j = blocks_of("--slowdown 1,4,1 --disk-rate 100M,25M,100M")
    assert.is_true(slow_n < even_n, slow_n .. " blocks on the slow device, " .. even_n .. " when it is not")
    assert.is_true(j.estimate_ms_per_token > 0)
  end)

  it("refuses clearly: too many devices, budgets too small, an unknown scheduler", function()
    local st = store_of(S260, "s260")
    local rc, _, err = sh(string.format("%s plan --model %s --devices 11 --context 256", T.loip, st))
    assert.are.equal(1, rc)
    assert.matches("11 devices but the model has only 10 blocks", err)
    -- generate refuses the same before any worker starts (a usage error, exit 2, raised before
    -- the cluster starts; no time limit: a busy machine starts loip slowly too)
    rc, _, err = sh(string.format("%s generate --model %s --devices 11 --prompt hi", T.loip, st))
    assert.are.equal(2, rc)
    assert.matches("11 devices but the model has only 10 blocks", err)
    assert.is_nil(err:find("worker", 1, true), err)
    rc, _, err = sh(string.format("%s plan --model %s --devices 3 --mem 300K,300K,300K --context 256", T.loip, st))
    assert.are.equal(1, rc)
    assert.matches("device %d", err)
    assert.matches("short by [%d.]+ KiB", err)
    assert.is_nil(err:find("?", 1, true))
    assert.is_nil(err:find("by %-"))
    for _, s in ipairs({ "pipeline", "edgeshard" }) do
      rc, _, err = sh(string.format("%s plan --model %s --devices 3 --mem 600K,600K,600K --context 256 --scheduler %s", T.loip, st, s))
      assert.are.equal(1, rc, s)
      assert.matches("OOM: device %d", err)
    end
    rc, _, err = sh(string.format("%s plan --model %s --devices 3 --scheduler nope", T.loip, st))
    assert.are.equal(1, rc)
    assert.matches("scheduler 'nope': no such policy .* shipped: brute, edgeshard, even, loip", err)
    rc, _, err = sh(string.format("%s plan --model %s --devices 3 --mem 1M,1M", T.loip, st))
    assert.are.equal(2, rc)
    assert.matches("gives 2 budgets for 3 devices", err)
    -- budgets the first search refused although a plan fits them ("short by -58496 bytes")
    rc, _, err = sh(string.format("%s plan --model %s --devices 3 --mem 790K,770K,800K", T.loip, st))
    assert.are.equal(0, rc, err)
    -- more stages than each device has blocks for (was: "attempt to perform arithmetic on a nil value")
    rc, _, err = sh(string.format("%s plan --model %s --devices 3 --stages 4 --context 256", T.loip, st))
    assert.are.equal(1, rc)
    assert.matches("stages 4: must be a whole number from 1 to 3 %(10 blocks on 3 devices", err)
  end)

  it("holds a scheduler of one's own and a plan file to what was asked, and says what bounds the step", function()
    local st = store_of(S260, "s260")
    local dir = T.tmpdir()
    local base = string.format("%s plan --model %s --devices 3 --context 256 --threads 1", T.loip, st)
    -- a copy of the example honours --stages
    local greedy = T.read(T.root .. "/recipes/policies/examples/greedy.lua")
    T.write(dir .. "/mine.lua", greedy)
    local rc, out, err = sh(string.format("%s --stages 2 --scheduler %s/mine.lua --json", base, dir))
    assert.are.equal(0, rc, err)
    assert.are.equal(2, json.decode(out).stages)
    -- one that ignores it is refused, naming its file (it was: a 1-stage plan, without a word)
    local ignoring, n = greedy:gsub("for S = [^\n]+ do", "for S = 1, 1 do")
    assert.are.equal(1, n)
    T.write(dir .. "/ignoring.lua", ignoring)
    rc, _, err = sh(string.format("%s --stages 2 --scheduler %s/ignoring.lua", base, dir))
    assert.are.equal(1, rc)
    assert.matches("scheduler greedy (" .. dir .. "/ignoring.lua): a plan of 1 stage per device, but 2 were asked for (--stages 2)",
      err, 1, true)
    -- a plan file with a misspelt key: refused naming the file, the device, the stage and the key
    T.write(dir .. "/p.lua", "return { devices = { { stages = { { blocks = { 0, 9 }, offload = 2 } } } } }")
    rc, _, err = sh(string.format("%s generate --model %s --plan %s/p.lua --prompt hi --max-tokens 2 --threads 1", T.loip, st, dir))
    assert.are.equal(1, rc)
    assert.matches(dir .. "/p.lua: devices[1].stages[1]: unknown key 'offload' (did you mean 'offloaded'?)", err, 1, true)
    -- no plan fits: the diagnosis is about the stage count asked for (it was: "the closest (5 stages ...)")
    rc, _, err = sh(string.format("%s plan --model %s --devices 2 --context 256 --threads 1 --mem 650K --stages 1", T.loip, st))
    assert.are.equal(1, rc)
    assert.matches("even the closest (1 stage as --stages asks", err, 1, true)
    -- a slow link bounds the step, not the devices' compute
    rc, out, err = sh(base .. " --link-rate 1mbit --link-delay 5ms --json")
    assert.are.equal(0, rc, err)
    local j = json.decode(out)
    assert.is_true(j.comm_ms > j.comp_ms + j.uncover_ms)
    assert.are.equal("communication", j.bound)
  end)
end)

describe("loip profile", function()
  after_each(T.cleanup)

  it("measures this machine into a profile that loip plan reads", function()
    local st = store_of(S260, "s260")
    local dir = T.tmpdir()
    local rc, _, err = sh(string.format("%s profile --model %s --threads 1 --batches 1,2 --contexts 16,64 --read 1M "
      .. "--prefetch 0,1024 --prefetch-read 64M --out %s/me.json", T.loip, st, dir))
    assert.are.equal(0, rc, err)
    assert.matches("measuring the quantized kernels' prefetch distance", err, 1, true)
    local pr = assert(json.load(dir .. "/me.json"))
    assert.is_nil(require("loip.plan.profile").check(pr))
    -- the quantized matvec's rate at each distance asked for, and the fastest (none on the
    -- reference kernels, which do not prefetch)
    if require("loip.runtime.exec").kernels_name() ~= "ref" then
      local k = pr.kernels
      assert.is_true(k.prefetch_bps["0"] > 0 and k.prefetch_bps["1024"] > 0)
      local fastest = k.prefetch_bps["0"] > k.prefetch_bps["1024"] and 0 or 1024
      assert.are.equal(fastest, k.prefetch_bytes)
      assert.are.equal(require("loip.runtime.exec").kernels_name(), k.variant)
    end
    local rcb, _, errb = sh(string.format("%s profile --model %s --prefetch 0,-8 --out %s/no.json", T.loip, st, dir))
    assert.are.equal(2, rcb)
    assert.matches("--prefetch: '-8' is not a distance in bytes", errb, 1, true)
    assert.is_true(pr.compute.weight_bps["1"] > 0 and pr.compute.weight_bps["2"] > 0)
    assert.is_true(pr.disk.read_bps > 0 and pr.link.transport_ms > 0)
    local n = 0
    for _, b in ipairs(pr.compute.blocks) do if b.kind == "mha" then n = n + 1 end end
    assert.are.equal(4, n) -- 2 batches x 2 contexts
    local rc2, out2, err2 = sh(string.format("%s plan --model %s --devices 2 --context 64 --profile %s/me.json --json", T.loip, st, dir))
    assert.are.equal(0, rc2, err2)
    assert.is_true(json.decode(out2).estimate_ms_per_token > 0)
    -- a damaged profile is refused naming the file and the field
    T.write(dir .. "/bad.json", '{"loip_profile": 1, "shape": {"n_heads": 1, "head_dim": 1, "mha_bytes": 1, "mlp_bytes": 1}, "compute": {"weight_bps": {"1": -3}}}')
    local rc3, _, err3 = sh(string.format("%s plan --model %s --devices 2 --profile %s/bad.json", T.loip, st, dir))
    assert.are.equal(1, rc3)
    assert.matches("bad.json: compute.weight_bps%[1%] must be a positive number", err3)
  end)
end)

describe("loip profile --hosts", function()
  after_each(T.cleanup)

  it("has running workers measure themselves and their link to the next one", function()
    local st = store_of(S260, "s260")
    local dir = T.tmpdir()
    local pids, eps = {}, {}
    local ok, err = pcall(function()
      for i = 1, 2 do
        local f = io.popen(string.format("LOIP_CLUSTER_TOKEN=spec-profile %s worker --listen 127.0.0.1:0 --store %s --threads 1 > %s/w%d.out 2> %s/w%d.log & echo $!",
          T.loip, st, dir, i, dir, i))
        pids[i] = tonumber(f:read("*l"))
        f:close()
      end
      for i = 1, 2 do
        local deadline = require("loip.core").now_ms() + 60000
        repeat
          local out = T.exists(dir .. "/w" .. i .. ".out") and T.read(dir .. "/w" .. i .. ".out") or ""
          eps[i] = out:match("listening tcp://(%S+)")
          if not eps[i] then require("loip.core").C.loip_sleep_ms(50) end
        until eps[i] or require("loip.core").now_ms() > deadline
        assert(eps[i], "worker " .. i .. " did not start")
      end
      local rc, _, perr = sh(string.format("LOIP_CLUSTER_TOKEN=spec-profile %s profile --model %s --hosts %s,%s --batches 1 --contexts 16 "
        .. "--read 1M --prefetch 512,2048 --prefetch-read 64M --out %s/cluster.json", T.loip, st, eps[1], eps[2], dir))
      assert.are.equal(0, rc, perr)
      local pr = assert(json.load(dir .. "/cluster.json"))
      assert.is_nil(require("loip.plan.profile").check(pr))
      assert.are.equal(2, #pr.devices)
      for i = 1, 2 do
        assert.is_true(pr.devices[i].compute.weight_bps["1"] > 0)
        assert.is_true(pr.devices[i].link.to_next.rate_bps > 0 and pr.devices[i].link.to_next.latency_ms > 0)
        local k = pr.devices[i].kernels -- (each measured its kernels' prefetch distances itself)
        if require("loip.runtime.exec").kernels_name() ~= "ref" then assert.is_true(k.prefetch_bps["512"] > 0 and k.prefetch_bps["2048"] > 0 and k.prefetch_bps["1024"] == nil) end
      end
      -- a plan for them from it
      local rc2, out2, err2 = sh(string.format("%s plan --model %s --devices 2 --profile %s/cluster.json --context 64 --json", T.loip, st, dir))
      assert.are.equal(0, rc2, err2)
      assert.are.equal(2, #json.decode(out2).plan.devices)
    end)
    for _, pid in pairs(pids) do os.execute("kill -TERM " .. pid .. " 2>/dev/null") end
    for _, pid in pairs(pids) do
      local deadline = require("loip.core").now_ms() + 3000
      while os.execute("kill -0 " .. pid .. " 2>/dev/null") == 0 and require("loip.core").now_ms() < deadline do
        require("loip.core").C.loip_sleep_ms(20)
      end
    end
    assert(ok, err)
  end)
end)

describe("generate --devices", function()
  after_each(T.cleanup)

  it("reports the estimate beside the measured time, and the scheduler that chose the plan", function()
    local st = store_of(S260, "s260")
    local dir = T.tmpdir()
    local rc, out, err = sh(string.format("%s generate --model %s --devices 2 --mem 900K,900K --threads 1 --context 256 "
      .. "--prompt 'Once upon a time' --temperature 0 --max-tokens 8 --scheduler even --save-plan %s/p.lua --json", T.loip, st, dir))
    assert.are.equal(0, rc, err)
    local j = json.decode(out)
    assert.is_true(j.estimate_ms_per_token > 0 and j.decode_ms_per_token > 0)
    assert.are.equal("even", j.scheduler)
    assert.are.equal(8, j.generated_tokens)
    assert.is_number(j.seed)
    assert.is_true(T.exists(dir .. "/p.lua"))
    assert.is_table(j.devices[1].estimate)
  end)
end)
