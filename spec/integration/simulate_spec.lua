-- loip simulate: a plan played out over time on devices a profile describes (here a profile of
-- round figures, so that the expected times follow by hand), driven by the request loop the
-- runtime runs: a steady decode takes what the cost model estimates; a burst batches its
-- requests into each step (more tokens per second, each a little slower); later tokens attend
-- more positions; a trace of every device's lanes that loip trace plot draws; the same result
-- twice; a plan over a budget refused, naming the device; speculative decoding at an assumed
-- acceptance (tokens per verifying step, the draft's time and memory on its device).
local json = require "loip.text.json"
local T = require "spec.support"
teardown(function() T.cleanup() end)
teardown(T.drop_stores)

-- One device's figures: 20 GB/s of weights at batch 1 (18 GB/s for a step of 4), attention
-- `attention` ms per position attended, a 2 GB/s disk, 10 us per message.
local function write_profile(dir, attention)
  local path = dir .. "/profile.json"
  T.write(path, json.encode({
    loip_profile = 1,
    shape = { dim = 2048, hidden_dim = 8192, n_heads = 32, n_kv_heads = 8, head_dim = 64, dtype = "BF16",
      mha_bytes = 20 * 1024 * 1024 + 4096, mlp_bytes = 96 * 1024 * 1024 },
    compute = { weight_bps = { ["1"] = 20e9, ["4"] = 18e9 }, mha_fixed_ms = { ["1"] = 0.05, ["4"] = 0.08 },
      attention_ms_per_token = { ["1"] = attention, ["4"] = 3 * attention }, under_load = 1.1,
      blocks = { { kind = "mlp", batch = 1, context = 64, ms = 5.0 } } },
    disk = { read_bps = 2e9, load_ms = 0.05 },
    link = { transport_ms = 0.01 },
    device = { host = "spec", cpus = 4, threads = 1 },
  }))
  return path
end

local function simulate(args)
  local rc, out, err = T.run(string.format("%s simulate --like llama-3.2-1b --devices 3 --mem 700M,300M,700M "
    .. "--link-rate 100mbit --link-delay 2ms --context 256 %s", T.loip, args))
  return rc, out, err
end

describe("devices from published figures (recipes/policies/device)", function()
  it("turn into profiles by a roofline, each number sourced or assumed, and plan the paper's testbed", function()
    local policy = require "loip.policy"
    local problem = require "loip.plan.problem"
    local profile = require "loip.plan.profile"
    assert.are.same({ "jetson-agx-orin-32gb", "jetson-agx-orin-64gb", "jetson-xavier-nx-16gb" }, policy.list("device"))
    local shape = problem.shape_of(require("loip.model.shapes").get("llama-3.3-70b"), "BF16")
    for _, name in ipairs(policy.list("device")) do
      local d = policy.load("device", name)
      assert.is_true(#d.sources >= 1 and #d.assumptions >= 1, name)
      local pr = d.profile(shape)
      assert.is_nil(profile.check(pr, name))
      -- decoding one token: an MLP block's weights read at the bandwidth a matrix-vector product reaches
      local ms = profile.block_ms(pr, "mlp", 1, 256, shape)
      assert.is_true(math.abs(ms - shape.mlp_bytes / (d.memory_bps * d.matvec_efficiency) * 1e3) < 1e-9 * ms, name)
      -- BF16 weights stay bandwidth-bound up to about 90 tokens a step on these GPUs
      local m64 = profile.block_ms(pr, "mlp", 64, 256, shape)
      assert.is_true(math.abs(m64 - ms) < 1e-9 * ms, name)
    end
    local rc, out, err = T.run(string.format("%s plan --like llama-3.3-70b --devices 4 --device-profile "
      .. "jetson-agx-orin-64gb,jetson-agx-orin-64gb,jetson-agx-orin-32gb,jetson-xavier-nx-16gb --link-rate 100mbit --context 1024 --json", T.loip))
    assert.are.equal(0, rc, err)
    local j = json.decode(out)
    assert.is_true(j.estimate_ms_per_token > 500 and j.estimate_ms_per_token < 5000, tostring(j.estimate_ms_per_token))
    local rc2, _, err2 = T.run(string.format("%s plan --like llama-3.3-70b --devices 2 --device-profile jetson-nano", T.loip))
    assert.are.equal(2, rc2)
    assert.matches("--device-profile jetson-nano: device 'jetson-nano': no such policy", err2, 1, true)
    assert.matches("shipped: jetson-agx-orin-32gb, jetson-agx-orin-64gb, jetson-xavier-nx-16gb", err2, 1, true)
  end)
end)

describe("loip simulate", function()
  it("plays a steady decode at the cost model's estimate; a burst batches its requests", function()
    local dir = T.tmpdir()
    local flat = write_profile(dir, 0)
    local rc, out, err = simulate("--profile " .. flat .. " --requests 2 --output-tokens 24 --json")
    assert.are.equal(0, rc, err)
    local j = json.decode(out)
    assert.are.equal(2, j.requests)
    assert.are.equal(0, j.failed)
    assert.is_true(#j.devices == 3 and j.stages >= 1)
    -- (with no attention cost every decoding step is alike: the estimate's steady state)
    assert.is_true(math.abs(j.ms_per_token - j.estimate_ms_per_token) <= 1e-6 * j.estimate_ms_per_token,
      j.ms_per_token .. " vs " .. j.estimate_ms_per_token)
    local rc2, out2 = simulate("--profile " .. flat .. " --requests 2 --output-tokens 24 --json")
    assert.are.equal(0, rc2)
    assert.are.same(j, json.decode(out2), "the same result twice")
    -- four requests at once: each step carries four tokens (one read serves all)
    local rc3, out3, err3 = simulate("--profile " .. flat .. " --pattern bursty --burst 4 --max-batch 4 --output-tokens 24 --json")
    assert.are.equal(0, rc3, err3)
    local b = json.decode(out3)
    assert.are.equal(4, b.requests)
    assert.is_true(b.tokens_per_s > 2.5 * j.tokens_per_s, b.tokens_per_s .. " vs " .. j.tokens_per_s)
    assert.is_true(b.ms_per_token < 1.6 * j.ms_per_token, b.ms_per_token .. " vs " .. j.ms_per_token)
    -- (within 2%: the first decoding steps follow the burst's prefill, whose reads run late)
    assert.is_true(math.abs(b.ms_per_token - b.estimate_ms_per_token) <= 0.02 * b.estimate_ms_per_token)
  end)

  it("takes a loip generate command line as it is: sampling flags and --ignore-eos accepted, ignored, said with --verbose", function()
    local dir = T.tmpdir()
    local flat = write_profile(dir, 0)
    local base = "--profile " .. flat .. " --requests 1 --max-tokens 24 --json"
    local rc, out, err = simulate(base)
    assert.are.equal(0, rc, err)
    local sampling = "--temperature 0.7 --top-k 40 --top-p 0.9 --min-p 0.05 --repeat-penalty 1.1 --ignore-eos --on-device-loss fail"
    local rc2, out2, err2 = simulate(base .. " " .. sampling)
    assert.are.equal(0, rc2, err2)
    assert.are.same(json.decode(out), json.decode(out2), "the same timing")
    assert.are.equal("", err2, "quiet without --verbose")
    local rc3, _, err3 = simulate(base .. " " .. sampling .. " --verbose")
    assert.are.equal(0, rc3, err3)
    for _, f in ipairs({ "temperature", "top-k", "top-p", "min-p", "repeat-penalty", "ignore-eos", "on-device-loss" }) do
      assert.matches("simulate: ignoring --" .. f .. " (does not change the timing)", err3, 1, true)
    end
    -- --tokenizer counts --prompt's tokens, as generate's does
    local st = T.slice_store(T.root .. "/models/stories260K", "s260")
    local rc4, out4, err4 = T.run(string.format("%s simulate --model %s --devices 2 --context 256 --requests 1 --prompt 'Once upon a time' "
      .. "--max-tokens 4 --tokenizer %s/models/stories260K/tok512.bin", T.loip, st, T.root))
    assert.are.equal(0, rc4, err4)
    assert.matches("simulated 1 sporadic request (5 + 4 tokens each)", out4, 1, true)
  end)

  it("simulates a loip generate command line as the one request generate runs, unless --requests says otherwise", function()
    local dir = T.tmpdir()
    local flat = write_profile(dir, 0)
    local function requests(args)
      local rc, out, err = simulate("--profile " .. flat .. " --json " .. args)
      assert.are.equal(0, rc, err)
      return json.decode(out).requests
    end
    assert.are.equal(1, requests("--max-tokens 24"))
    assert.are.equal(1, requests("--output-tokens 24 --temperature 0"))
    assert.are.equal(3, requests("--max-tokens 24 --requests 3"))
    assert.are.equal(4, requests("--output-tokens 24"), "simulate's own line: its pattern's default")
    -- the online case of online_spec as generate runs it: one request, one re-plan (as on the devices)
    local st = T.slice_store(T.root .. "/models/stories260K", "s260")
    local rc, out, err = T.run(string.format("%s simulate --model %s --devices 3 --mem 790K,770K,800K --context 512 "
      .. "--plan-positions 64 --prompt 'A big red ball' --max-tokens 480 --temperature 0", T.loip, st))
    assert.are.equal(0, rc, err)
    assert.matches("simulated 1 sporadic request (", out, 1, true)
    assert.matches("\n  1 live plan change by the online policy loip (1 a new plan for a longer context)\n", out, 1, true)
  end)

  it("grows the KV cache inside the budgets: the runtime's online policy makes room as on devices, or a device runs out", function()
    -- stories260K on 2 devices of 960K, planned for 32 positions (as online_spec runs it on workers:
    -- 9 changes there too, at 49 to 273 positions)
    local st = T.slice_store(T.root .. "/models/stories260K", "s260")
    local args = string.format("%s simulate --model %s --devices 2 --mem 960K,960K --context 512 --stages 3 --requests 1 "
      .. "--input-tokens 4 --output-tokens 380 --plan-positions 32 --json", T.loip, st)
    local rc, out, err = T.run(args)
    assert.are.equal(0, rc, err)
    local j = json.decode(out)
    assert.are.equal("loip", j.online)
    assert.is_true(j.adaptations >= 3, j.adaptations .. " changes")
    for i, d in ipairs(j.devices) do assert.is_true(d.peak_bytes <= d.budget_bytes, "device " .. i) end
    -- the older names (simulate's and serve's --plan-tokens, generate's --plan-context) are
    -- aliases for a release: the same simulation, and said once on stderr
    for _, old in ipairs({ "--plan-tokens", "--plan-context" }) do
      local rc5, out5, err5 = T.run((args:gsub("%-%-plan%-positions 32", old .. " 16 " .. old .. " 32")))
      assert.are.equal(0, rc5, err5)
      local j5 = json.decode(out5)
      assert.are.same({ j.adaptations, j.plan, j.steps }, { j5.adaptations, j5.plan, j5.steps })
      local _, warned = err5:gsub(old:gsub("%-", "%%-") .. " is deprecated %(it goes in a later release%): use %-%-plan%-positions", "")
      assert.are.equal(1, warned, err5)
    end
    local rc2, out2 = T.run(args .. " --online none")
    assert.are.equal(1, rc2)
    assert.matches("^device %d: out of memory at %d+ positions", json.decode(out2).error)
    -- a loip generate command line simulates as it is (its --prompt, --max-tokens, --plan-positions)
    local rc3, out3, err3 = T.run(string.format("%s simulate --model %s --devices 2 --mem 960K,960K --context 512 --stages 3 "
      .. "--prompt 'Once upon a time' --max-tokens 380 --plan-positions 32 --requests 1", T.loip, st))
    assert.are.equal(0, rc3, err3)
    assert.matches("simulated 1 sporadic request (5 + 380 tokens each)", out3, 1, true)
    assert.matches("live plan changes by the online policy loip", out3, 1, true)
    -- budgets that hold the whole context only in a plan made for it: the policy has the
    -- scheduler plan again, as on devices
    local rc4, out4, err4 = T.run(string.format("%s simulate --model %s --devices 3 --mem 790K,770K,800K --context 512 "
      .. "--link-rate 100mbit --prompt 'A big red ball' --max-tokens 480 --plan-positions 64 --requests 1 --json", T.loip, st))
    assert.are.equal(0, rc4, err4)
    local j4 = json.decode(out4)
    assert.are.equal(0, j4.failed)
    assert.are.equal(1, j4.replans)
    for i, d in ipairs(j4.devices) do assert.is_true(d.peak_bytes <= d.budget_bytes, "device " .. i) end
  end)

  it("makes later tokens attend more positions, writes a trace loip trace plot draws, refuses a plan past a budget", function()
    local dir = T.tmpdir()
    local slow = write_profile(dir, 0.02)
    local rc, out, err = simulate("--profile " .. slow .. " --requests 1 --output-tokens 8 --json")
    assert.are.equal(0, rc, err)
    local rc2, out2 = simulate("--profile " .. slow .. " --requests 1 --output-tokens 200 --json")
    assert.are.equal(0, rc2)
    assert.is_true(json.decode(out2).ms_per_token > json.decode(out).ms_per_token)
    -- the human report and the trace
    local rc3, text, err3 = simulate("--profile " .. slow .. " --requests 1 --output-tokens 8 --trace " .. dir .. "/t.json --save-plan "
      .. dir .. "/p.lua")
    assert.are.equal(2, rc3, "--save-plan is loip plan's") -- (a usage error: simulate has --plan, not --save-plan)
    rc3, text, err3 = simulate("--profile " .. slow .. " --requests 1 --output-tokens 8 --trace " .. dir .. "/t.json")
    assert.are.equal(0, rc3, err3)
    assert.matches("simulated 1 sporadic request %(8 %+ 8 tokens each%): [%d.]+ ms/token %(the cost model estimates [%d.]+%)", text)
    assert.matches("device 3 per step: compute [%d.]+ ms, load [%d.]+ ms, stall [%d.]+ ms, send [%d.]+ ms", text)
    local lanes = {}
    for _, e in ipairs(json.load(dir .. "/t.json").traceEvents) do
      if e.ph == "X" then lanes[e.cat] = true end
    end
    assert.is_true(lanes.compute and lanes.load and lanes.send, "compute, load and send lanes")
    local rc4, _, err4 = T.run(string.format("%s trace plot %s/t.json %s/t.svg", T.loip, dir, dir))
    assert.are.equal(0, rc4, err4)
    assert.matches("^<svg", T.read(dir .. "/t.svg"))
    -- a plan that keeps every block of device 2 resident cannot fit its 300M
    local rcp, _, errp = T.run(string.format("%s plan --like llama-3.2-1b --devices 3 --mem 700M,300M,700M --context 256 "
      .. "--profile %s --scheduler even --save-plan %s/even.lua", T.loip, slow, dir))
    assert.are.equal(0, rcp, errp)
    local plan_text = T.read(dir .. "/even.lua"):gsub("offloaded = %d+", "offloaded = 0")
    T.write(dir .. "/resident.lua", plan_text)
    local rc5, _, err5 = simulate("--profile " .. slow .. " --plan " .. dir .. "/resident.lua")
    assert.are.equal(1, rc5)
    assert.matches("simulate: device %d needs .* but its budget is", err5)
  end)
end)

describe("tensor-parallel baselines (recipes/policies/baseline)", function()
  it("model Galaxy and TPI-LLM on the same problem: slices that must fit, or a sliding window read from disk; all-reduces on the links", function()
    local dir = T.tmpdir()
    local pr = write_profile(dir, 0.001)
    local function run(args)
      local rc, out, err = T.run(string.format("%s simulate --like llama-3.2-1b --devices 3 --link-delay 2ms --context 256 --profile %s --json %s",
        T.loip, pr, args))
      assert.is_true(rc == 0 or rc == 1, err)
      return json.decode(out), rc
    end
    -- room for every slice: both run; on links of 2 ms TPI-LLM's star (two latencies an
    -- all-reduce) beats Galaxy's ring (2(N-1)), on links without delay the ring (each byte over
    -- the slowest link 2(N-1)/N times, not 2(N-1)) wins
    local g = run("--mem 2G,2G,2G --link-rate 100mbit --baseline galaxy")
    local t = run("--mem 2G,2G,2G --link-rate 100mbit --baseline tpi-llm")
    assert.is_nil(g.oom)
    assert.is_true(g.ms_per_token > 0 and t.ms_per_token > 0)
    assert.is_true(t.comm_ms < g.comm_ms, t.comm_ms .. " vs " .. g.comm_ms)
    local g0 = run("--mem 2G,2G,2G --link-rate 100mbit --link-delay 0ms --baseline galaxy")
    local t0 = run("--mem 2G,2G,2G --link-rate 100mbit --link-delay 0ms --baseline tpi-llm")
    assert.is_true(g0.comm_ms < t0.comm_ms, g0.comm_ms .. " vs " .. t0.comm_ms)
    -- two all-reduces a layer: at 10x the rate the star's wire time falls tenfold (its latency stays)
    local fast = run("--mem 2G,2G,2G --link-rate 1000mbit --baseline tpi-llm")
    local lat = 2 * 16 * 2 * (2 + 0.01)
    assert.is_true(math.abs((fast.comm_ms - lat) * 10 - (t.comm_ms - lat)) < 1e-6 * t.comm_ms)
    -- a burst of 4: four tokens' activations a step
    local burst = run("--mem 2G,2G,2G --link-rate 100mbit --baseline tpi-llm --pattern bursty --burst 4 --max-batch 4")
    assert.are.equal(4, burst.batch)
    assert.is_true(burst.comm_ms > 3 * t.comm_ms - 4 * lat)
    -- budgets of 800M: the slices do not fit; Galaxy and TPI-LLM are out of memory, naming the
    -- device; TPI-LLM's sliding window reads what does not fit from disk every step
    local go, rc = run("--mem 800M,800M,800M --link-rate 100mbit --baseline galaxy")
    assert.are.equal(1, rc)
    assert.matches("^OOM: device %d cannot hold its %d+%% slice of every layer", go.oom)
    local off = run("--mem 800M,800M,800M --link-rate 100mbit --baseline tpi-llm-offload")
    assert.is_nil(off.oom)
    assert.is_true(off.load_ms > 0 and off.ms_per_token >= off.load_ms)
  end)
end)

describe("speculative decoding on the simulator (--draft, --acceptance)", function()
  local TESTBED = "--like llama-3.3-70b --devices 4 --device-profile jetson-agx-orin-64gb,jetson-agx-orin-64gb,"
    .. "jetson-agx-orin-32gb,jetson-xavier-nx-16gb --link-rate 100mbit --link-delay 1ms --context 1024 --requests 2 "
    .. "--input-tokens 32 --output-tokens 128 --json"
  local function run(args)
    local rc, out, err = T.run(string.format("%s simulate %s", T.loip, args))
    assert.are.equal(0, rc, err)
    local j, why = json.decode(out)
    assert(j, tostring(why) .. ": " .. out)
    return j
  end

  it("prices a best-first tree by its curve: tokens per step by its size, the size chosen from the step's price", function()
    local flat = write_profile(T.tmpdir(), 0)
    local base = "--profile " .. flat .. " --requests 1 --output-tokens 120 --json --draft ngram --acceptance 0.5"
    local function with(args)
      local rc, out, err = simulate(base:gsub("%-%-draft ngram %-%-acceptance 0.5", args))
      assert.are.equal(0, rc, err)
      return json.decode(out)
    end
    local CURVE = "--tree-curve 8:1.6,16:1.9,32:2.1,63:2.4"
    -- a fixed size: the curve's tokens per step (one draw a step: the path reaches depth j with
    -- the chance the curve gains there), its rows priced in the step
    local t8 = with("--draft self:layers=1,tree=on --draft-device head --draft-tokens 8 " .. CURVE)
    local t32 = with("--draft self:layers=1,tree=on --draft-device head --draft-tokens 32 " .. CURVE)
    assert.are.equal(CURVE:match("%S+$"), t8.draft.tree_curve_source)
    assert.is_true(math.abs(t8.draft.tokens_per_step - 1.6) < 0.3, tostring(t8.draft.tokens_per_step))
    assert.is_true(math.abs(t32.draft.tokens_per_step - 2.1) < 0.4, tostring(t32.draft.tokens_per_step))
    assert.is_true(t32.steps < t8.steps and t32.simulated_ms / t32.steps > t8.simulated_ms / t8.steps)
    -- chosen each step from the curve and the step's price (which rises with rows on this profile)
    local chosen = with("--draft self:layers=1,tree=on --draft-device head " .. CURVE)
    assert.is_true(chosen.draft.tree_size >= 1 and chosen.draft.tree_size < 32, tostring(chosen.draft.tree_size))
    assert.are.equal("chosen", chosen.draft.k)
    -- a measured run's curve (loip generate --json: draft.tree_curve), and what is refused
    local dir = T.tmpdir()
    T.write(dir .. "/run.json", json.encode({ draft = { tree_curve = { { size = 8, tokens_per_step = 1.6, steps = 10 },
      { size = 40, tokens_per_step = 2.2, steps = 30 } } } }))
    local measured = with("--draft self:layers=2,tree=on --draft-device head --tree-curve " .. dir .. "/run.json")
    assert.are.equal(dir .. "/run.json", measured.draft.tree_curve_source)
    local rc, _, err = simulate(base:gsub("%-%-draft ngram %-%-acceptance 0.5", "--draft self:tree=on --tree-curve 8:0.5"))
    assert.are_not.equal(0, rc)
    assert.matches("--tree-curve", err, 1, true)
    rc, _, err = simulate(base:gsub("%-%-draft ngram %-%-acceptance 0.5", "--draft ngram --acceptance 0.5 --tree-curve 8:1.5"))
    assert.are_not.equal(0, rc)
    assert.matches("--tree-curve is a tree's", err, 1, true)
  end)

  it("shapes a tree by depth (--tree-depths, a run's per_depth): its paths reach each depth as measured, the mean the curve's", function()
    local flat = write_profile(T.tmpdir(), 0)
    local base = "--profile " .. flat .. " --requests 1 --output-tokens 240 --json --draft self:layers=1,tree=on --draft-device head "
      .. "--draft-tokens 16 --tree-curve 16:1.5"
    local function with(args)
      local rc, out, err = simulate(base .. " " .. args)
      assert.are.equal(0, rc, err)
      return json.decode(out)
    end
    -- the curve's 0.5 tokens past the step's own at 16 nodes, spread over depths 1..3 as stated:
    -- the simulated steps' paths reach them in those shares (a chain's nodes would reach depth 1
    -- with the curve's first gain alone, 0.12, and depth 16 now and then)
    local Q = { 0.35, 0.1, 0.05 }
    local j = with("--tree-depths 0.35,0.1,0.05")
    assert.are.same(Q, j.draft.tree_depths)
    assert.are.equal("--tree-depths", j.draft.tree_depths_source)
    assert.is_true(#j.draft.per_depth <= 3, json.encode(j.draft.per_depth))
    for d, q in ipairs(Q) do
      assert.is_true(math.abs((j.draft.per_depth[d] or 0) - q) < 0.08, string.format("depth %d: %s", d, json.encode(j.draft.per_depth)))
    end
    assert.is_true(math.abs(j.draft.tokens_per_step - 1.5) < 0.12, tostring(j.draft.tokens_per_step))
    local chain = with("")
    assert.is_nil(chain.draft.tree_depths)
    assert.is_true(chain.draft.per_depth[1] < 0.25, json.encode(chain.draft.per_depth))
    -- a measured run's JSON brings its per_depth with its curve; bad shapes are refused by name
    local dir = T.tmpdir()
    T.write(dir .. "/run.json", json.encode({ draft = { tree_curve = { { size = 16, tokens_per_step = 1.5, steps = 10 } },
      per_depth = Q } }))
    local measured = with("--tree-curve " .. dir .. "/run.json")
    assert.are.same(Q, measured.draft.tree_depths)
    assert.are.equal(dir .. "/run.json", measured.draft.tree_depths_source)
    for _, bad in ipairs({ "0.1,0.3", "x", "1.5" }) do
      local rc, _, err = simulate(base .. " --tree-depths " .. bad)
      assert.are.equal(2, rc)
      assert.matches("--tree-depths " .. bad, err, 1, true)
    end
    local rc, _, err = simulate("--profile " .. flat .. " --draft ngram --acceptance 0.5 --tree-depths 0.3")
    assert.are.equal(2, rc)
    assert.matches("--tree-depths needs --tree-curve", err, 1, true)
  end)

  it("plans a tree's rows as the cluster's planner does: the logits rows reserved, the tree within them", function()
    -- stories260K on the read-bound ring of the tree measurement (docs/serving.md): the plan for
    -- a best-first tree reserves 8 to 64 rows a request (fit_draft_rows), its last device's
    -- logits buffer in its budget, and no step's tree is larger
    local st = T.slice_store(T.root .. "/models/stories260K", "s260")
    local args = string.format("%s simulate --model %s --devices 3 --mem 790K,770K,800K --disk-rate 20M --link-rate 100mbit "
      .. "--link-delay 2ms --context 480 --requests 1 --input-tokens 8 --output-tokens 60 --json --draft self:layers=3,tree=on "
      .. "--draft-device head --tree-curve 8:1.56,16:1.84,32:1.99,63:2.21", T.loip, st)
    local rc, out, err = T.run(args)
    assert.are.equal(0, rc, err)
    local j = json.decode(out)
    local rows = j.draft.plan_rows
    assert.is_true(rows == 8 or rows == 16 or rows == 32 or rows == 64, tostring(rows))
    assert.is_true(j.draft.tree_size_max <= rows, j.draft.tree_size_max .. " nodes, " .. rows .. " rows")
    -- fixed at 40 nodes: 40 rows reserved, the last device's budget holding its 41 logits rows
    -- (the others none: loip.plan.device_bytes): beside the plan without them, the same plan
    -- with the rows in device 3's memory, or one offloading more
    local rc2, out2, err2 = T.run(args .. " --draft-tokens 40")
    assert.are.equal(0, rc2, err2)
    local j2 = json.decode(out2)
    assert.are.equal(40, j2.draft.plan_rows)
    local rc3, out3, err3 = T.run((args:gsub("%-%-draft .*$", "")))
    assert.are.equal(0, rc3, err3)
    local function offloaded(x)
      local n = 0
      for _, d in ipairs(x.plan.devices) do for _, s in ipairs(d.stages) do n = n + (s.offloaded or 0) end end
      return n
    end
    local j3 = json.decode(out3)
    if json.encode_sorted(j2.plan) == json.encode_sorted(j3.plan) then
      local more = j2.devices[3].memory_bytes - j3.devices[3].memory_bytes
      assert.is_true(more >= 40 * 512 * 4, "device 3 holds " .. more .. " bytes more for 41 rows of 512 logits") -- (stories260K's vocabulary)
      for i = 1, 2 do assert.are.equal(j3.devices[i].memory_bytes, j2.devices[i].memory_bytes, "device " .. i) end
    else
      assert.is_true(offloaded(j2) > offloaded(j3), offloaded(j2) .. " vs " .. offloaded(j3))
    end
  end)

  it("verifies k drafts in one step: at acceptance 1 five tokens a step, read-bound steps priced as one; at 0 one", function()
    local flat = write_profile(T.tmpdir(), 0)
    local base = "--profile " .. flat .. " --requests 1 --output-tokens 26 --json"
    local rc, out, err = simulate(base)
    assert.are.equal(0, rc, err)
    local none = json.decode(out)
    assert.is_nil(none.draft)
    local function with(args)
      local rc2, out2, err2 = simulate(base .. " " .. args)
      assert.are.equal(0, rc2, err2)
      return json.decode(out2)
    end
    local all = with("--draft ngram --acceptance 1 --draft-tokens 4")
    local d = all.draft
    assert.are.same({ "ngram", 1, 4, 20, 20, 5, 5 }, { d.policy, d.acceptance, d.k, d.drafted, d.accepted, d.steps, d.tokens_per_step })
    assert.are.equal(6, all.steps, "a prefill step, then 5 verifying steps of 5 tokens")
    assert.is_true(all.tokens_per_s > 3 * none.tokens_per_s, all.tokens_per_s .. " vs " .. none.tokens_per_s)
    -- (the plan re-reads offloaded blocks every step: five rows cost little more than one)
    local per_step = function(j) return j.simulated_ms / j.steps end
    assert.is_true(per_step(all) < 1.15 * per_step(none), per_step(all) .. " vs " .. per_step(none))
    -- a model draft on a device of its own choosing costs its forwards before the step
    local self = with("--draft self:layers=2 --draft-device head --acceptance 1 --draft-tokens 4")
    assert.are.same({ 5, "head" }, { self.draft.tokens_per_step, self.draft.device })
    assert.is_true(self.draft.draft_ms_per_step > 0 and self.tokens_per_s < all.tokens_per_s and self.tokens_per_s > none.tokens_per_s)
    local zero = with("--draft ngram --acceptance 0 --draft-tokens 4")
    assert.are.same({ 0, 1 }, { zero.draft.accepted, zero.draft.tokens_per_step })
    assert.are.equal(none.steps, zero.steps)
    -- the same seed, the same acceptances; the text says the acceptance is assumed
    local half = with("--draft ngram --acceptance 0.6 --draft-tokens 3")
    assert.are.same(half.draft, with("--draft ngram --acceptance 0.6 --draft-tokens 3").draft)
    assert.is_true(half.draft.accepted > 0 and half.draft.accepted < half.draft.drafted)
    local rc3, text, err3 = simulate("--profile " .. flat .. " --requests 1 --output-tokens 26 --draft ngram --acceptance 0.6")
    assert.are.equal(0, rc3, err3)
    assert.matches("acceptance 0.60 ASSUMED", text, 1, true)
    assert.matches("draft length chosen each step", text, 1, true)
  end)

  it("prices the paper's testbed with a 1B draft; the chosen draft length turns down to 0 at acceptance 0", function()
    local none = run(TESTBED)
    local d7 = run(TESTBED .. " --draft model --draft-like llama-3.2-1b --acceptance 0.7")
    assert.are.same({ "model", 0.7, "chosen", 1 }, { d7.draft.policy, d7.draft.acceptance, d7.draft.k, d7.draft.device })
    assert.is_true(d7.draft.tokens_per_step > 2 and d7.draft.draft_ms_per_step > 0)
    assert.is_true(d7.tokens_per_s > 1.5 * none.tokens_per_s, d7.tokens_per_s .. " vs " .. none.tokens_per_s)
    -- its weights and KV cache are charged to device 1, which the plan left room for
    assert.is_true(d7.devices[1].draft_bytes > 2e9 and d7.devices[1].memory_bytes + d7.devices[1].draft_bytes <= d7.devices[1].budget_bytes)
    -- (a request whose first drafts are rejected drafts again once a probe finds them accepted)
    local d5 = run(TESTBED .. " --draft model --draft-like llama-3.2-1b --acceptance 0.5 --draft-device auto")
    assert.are.equal(1, d5.draft.device)
    assert.is_true(d5.tokens_per_s > 1.3 * none.tokens_per_s, d5.tokens_per_s .. " vs " .. none.tokens_per_s)
    local d0 = run(TESTBED .. " --draft model --draft-like llama-3.2-1b --acceptance 0")
    assert.are.equal(0, d0.draft.accepted)
    -- (each request drafts a few steps while its measured acceptance falls from the prior's 0.5)
    assert.is_true(d0.draft.steps <= 0.1 * none.steps and d0.draft.probes > 0, d0.draft.steps .. " steps drafted of " .. none.steps)
    assert.are.equal(none.steps, d0.steps)
    assert.is_true(d0.tokens_per_s >= 0.95 * none.tokens_per_s, d0.tokens_per_s .. " vs " .. none.tokens_per_s)
    -- the recipe of docs/paper/speculative.md: the same twice, more tokens/s the more drafts are accepted
    local a, b = T.tmpdir(), T.tmpdir()
    for _, out in ipairs({ a, b }) do
      local rc, _, err = T.run(string.format("%s run %s/recipes/paper/speculative.lua --out %s --output-tokens 48", T.loip, T.root, out))
      assert.are.equal(0, rc, err)
    end
    assert.are.equal(T.read(a .. "/speculative.json"), T.read(b .. "/speculative.json"))
    local by = {}
    for _, r in ipairs(json.load(a .. "/speculative.json").rows) do by[tostring(r.acceptance) .. "/" .. tostring(r.k)] = r.tokens_per_s end
    assert.is_true(by["1/chosen"] > by["0.7/chosen"] and by["0.7/chosen"] > by["none/-"] and by["0/chosen"] >= 0.95 * by["none/-"])
  end)

  it("reads the acceptance from a measured run's JSON, refuses bad ones naming the flag and a draft past its device's budget", function()
    local dir = T.tmpdir()
    local st = T.slice_store(T.root .. "/models/stories260K", "s260")
    local rc, out, err = T.run(string.format("%s generate --model %s --devices 2 --prompt 'Once upon a time' --max-tokens 24 "
      .. "--temperature 0 --draft self --draft-tokens 3 --json", T.loip, st))
    assert.are.equal(0, rc, err)
    T.write(dir .. "/run.json", out)
    local g = json.decode(out).draft
    local j = run(string.format("--model %s --devices 2 --context 256 --requests 1 --output-tokens 8 --draft self --acceptance %s/run.json --json",
      st, dir))
    assert.are.equal(g.per_draft or g.acceptance, j.draft.acceptance)
    T.write(dir .. "/none.json", json.encode({ ms_per_token = 3 }))
    local flat = write_profile(dir, 0)
    for _, bad in ipairs({ "1.5", "-0.1", "often", dir .. "/none.json" }) do
      local rc2, _, err2 = simulate("--profile " .. flat .. " --draft ngram --acceptance " .. bad)
      assert.are.equal(2, rc2, bad)
      assert.matches("--acceptance " .. bad:gsub("%p", "%%%0") .. ": ", err2)
    end
    -- (and a 1B draft does not fit 700M, nor 300M)
    for _, case in ipairs({
      { "--draft ngram", 2, "--draft needs --acceptance" },
      { "--acceptance 0.5", 2, "--acceptance needs --draft" },
      { "--draft model --draft-like llama-3.2-1b --acceptance 0.5", 1,
        "the draft (llama-3.2-1b: 2.30 GiB of weights, 16.0 MiB of KV cache and activations) does not fit device 1's budget" },
      { "--draft model --draft-like llama-3.2-1b --draft-device 2 --acceptance 0.5", 1, "does not fit device 2's budget of 300.0 MiB" },
    }) do
      local rc3, _, err3 = simulate("--profile " .. flat .. " " .. case[1])
      assert.are.equal(case[2], rc3, case[1])
      assert.matches(case[3], err3, 1, true)
    end
    -- a plan made without the draft has no room for it
    local rcp, _, errp = T.run(string.format("%s plan --like llama-3.2-1b --devices 3 --mem 700M,300M,700M --context 256 --profile %s "
      .. "--save-plan %s/p.lua", T.loip, flat, dir))
    assert.are.equal(0, rcp, errp)
    local rc7, _, err7 = simulate("--profile " .. flat .. " --plan " .. dir .. "/p.lua --draft self:layers=1 --draft-device 3 --acceptance 0.5")
    assert.are.equal(1, rc7)
    assert.matches("simulate: device 3 needs [%d.]+ [GM]iB for the plan and the draft %(the target's first 1 layers and head", err7)
  end)
end)
