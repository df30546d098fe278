-- The benchmarks (recipes/bench/*.lua) are recipes a user runs by hand on a big model; each has
-- --quick to check that it works. Run every one that takes a store on stories260K's (a model of
-- 512 tokens and 10 blocks: the benchmarks' prompt must fit its vocabulary, their plans its
-- blocks), and check that it ends well and prints its JSON report. (Their figures are not checked
-- here: a busy machine's timings mean nothing; the benchmarks are for measuring. soak.lua is
-- left out: it checks that /tmp is as it found it, which specs running beside it upset.)
local loip = require "loip"
local json = require "loip.text.json"
local T = require "spec.support"
teardown(function() T.cleanup() end)
teardown(T.drop_stores)

local S260 = T.root .. "/models/stories260K"

-- recipe, its extra flags, fields its report must have
local RECIPES = {
  { "pipeline", "", { "interleaved_ms", "conventional_ms", "same_tokens" } },
  { "local", "--tokens 3", { "estimated_ms", "measured_ms", "per_device", "runs", "ratios", "median_ratio" } },
  { "schedulers", "", { "clusters", "decide" } },
  { "offload", "", { "budgets", "same_tokens" } },
  { "online", "--stages 3", { "variants" } },
  { "fidelity", "", { "rows", "worst_error" } },
  { "serve", "", {} },
  { "loader", "", {} },
  { "speculative", "", { "variants", "self_k4_speedup", "ngram_worst_speedup", "same_tokens" } },
  { "speculative", "--two --context 256 --reps 1", { "none", "head", "head_one_by_one", "worker", "worker_one_by_one", "same_tokens" } },
  { "prefix", "", { "stories260K", "same_tokens" } },
  { "head", "--head-rows 64 --threads 1", { "variants", "ahead_page_cache", "ahead_direct", "same_tokens" } },
}

-- moe.lua needs a mixture of experts: --quick makes a small one (in a scratch folder here)
it("moe.lua --quick makes a small mixture of experts, runs it and prints its report", function()
  local dir = T.tmpdir()
  local rc, stdout, stderr = T.run(string.format("LOIP_QUIET=1 %s run %s/recipes/bench/moe.lua --store %s/store --model %s/model "
    .. "--quick --out %s", T.loip, T.root, dir, dir, dir))
  assert.are.equal(0, rc, "moe.lua failed:\n" .. stderr)
  local report = json.decode(stdout:match("([^\n]+)\n?$"))
  for _, f in ipairs({ "one_device", "ring", "simulate", "met" }) do assert.is_not_nil(report[f], "no " .. f) end
  assert.is_true(report.one_device.routed.hit_rate ~= nil and report.one_device.peaks_within_budget)
  assert.are.same(report.one_device.routed.tokens, report.one_device.all.tokens)
end)

-- gpt_oss.lua needs gpt-oss's shape: --quick makes a tiny one (MXFP4 experts, in a scratch folder here)
it("gpt_oss.lua --quick runs a tiny gpt-oss from disk on one device and on 3, and prints its report", function()
  local dir = T.tmpdir()
  local rc, stdout, stderr = T.run(string.format("LOIP_QUIET=1 %s run %s/recipes/bench/gpt_oss.lua --store %s/store "
    .. "--model %s/model --quick --threads 1 --out %s", T.loip, T.root, dir, dir, dir))
  assert.are.equal(0, rc, "gpt_oss.lua failed:\n" .. stderr)
  local report = json.decode(stdout:match("([^\n]+)\n?$"))
  local one, ring = report.one_device, report.ring
  -- a budget of a third of the weights: it reads from disk, each peak within its budget
  assert.is_true(one.peak_within_budget and one.peak_bytes > 0 and one.bytes_read_per_token > 0)
  assert.is_true(one.expert_bytes_per_token > 0) -- (routed experts of offloaded layers, MXFP4: 17 bytes per 32 values)
  -- an expert kept as released: MXFP4 gate, up and down (17 bytes per 32 values; BF16 would be 384 KiB) and its biases
  local mx = 3 * 256 * 256 * 17 / 32
  assert.is_true(report.model.expert_bytes >= mx and report.model.expert_bytes < mx + 8192, tostring(report.model.expert_bytes))
  assert.are.equal(3, #ring.devices)
  assert.is_true(ring.peaks_within_budget and ring.same_tokens)
  for _, d in ipairs(ring.devices) do assert.is_true(d.peak_bytes <= d.budget_bytes) end
  assert.is_true(report.kernels_vs_probe.mxfp4 > 0 and report.kernels_vs_probe.probe_gbps > 0)
  assert.is_true(json.exists(dir .. "/gpt_oss.svg") and json.exists(dir .. "/quant/quant.json"))
end)

-- grammar.lua needs no store: Llama 3's tokenizer from models/, three documents
it("grammar.lua --quick draws documents from token masks and prints its report", function()
  local out = T.tmpdir()
  local rc, stdout, stderr = T.run(string.format("%s run %s/recipes/bench/grammar.lua --quick --out %s", T.loip, T.root, out))
  assert.are.equal(0, rc, "grammar.lua failed:\n" .. stderr)
  local report = json.decode(stdout:match("([^\n]+)\n?$"))
  for _, f in ipairs({ "mask", "mask_cold", "mask_warm", "tokens_per_doc", "vocab_build_ms" }) do
    assert.is_not_nil(report[f], "no " .. f)
  end
  assert.are.equal(3, report.valid_docs)
end)

-- quant.lua needs no store: it measures the MXFP4 and F8 kernels on matrices of its own
it("quant.lua --quick measures the MXFP4 and F8 kernels against the read probe and prints its report", function()
  local out = T.tmpdir()
  local rc, stdout, stderr = T.run(string.format("%s run %s/recipes/bench/quant.lua --quick --threads 1,2 --out %s",
    T.loip, T.root, out))
  assert.are.equal(0, rc, "quant.lua failed:\n" .. stderr)
  local report = json.decode(stdout:match("([^\n]+)\n?$"))
  assert.is_true(report.probe["1"] > 0 and report.probe["2"] > 0)
  -- every dtype, every variant the kernels offer here (ref always), every thread count
  for _, dt in ipairs({ "mxfp4", "f8" }) do
    assert.is_true(report.fractions[dt]["ref/1"] > 0 and report.fractions[dt]["ref/2"] > 0, dt)
    local r = report.kernels[dt .. " 2880x2880 ref 2T"]
    assert.is_table(r, dt)
    -- the core's own rate, from L2, beside the rate from memory
    assert.is_true(r.gbps_l2 > 0 and math.abs(r.l2_ratio - r.gbps_l2 / report.probe["2"]) < 1e-9, dt)
  end
  assert.are.equal(0.8, report.target)
  assert.is_boolean(report.met)
  assert.is_true(json.exists(out .. "/quant.svg") and json.exists(out .. "/quant.json"))
end)

-- --prefetch: the quantized kernels at each distance given (the machine's best is a parameter)
it("quant.lua --prefetch measures each distance and reports the best; a bad distance is refused", function()
  local out = T.tmpdir()
  local rc, stdout, stderr = T.run(string.format("%s run %s/recipes/bench/quant.lua --quick --threads 1 --kernels ref "
    .. "--prefetch 0,2048 --out %s", T.loip, T.root, out))
  assert.are.equal(0, rc, "quant.lua failed:\n" .. stderr)
  local report = json.decode(stdout:match("([^\n]+)\n?$"))
  assert.are.same({ 0, 2048 }, report.prefetch)
  for _, dt in ipairs({ "mxfp4", "f8" }) do
    for _, d in ipairs({ 0, 2048 }) do
      local r = report.kernels[dt .. " 2880x2880 ref 1T pf" .. d]
      assert.is_table(r, dt .. " pf" .. d)
      assert.are.equal(d, r.prefetch)
    end
    local best = report.prefetch_best[dt]["ref/1 2880x2880"]
    assert.is_true(best == 0 or best == 2048, dt)
  end
  assert.is_table(report.kernels["bf16 2880x2880 ref 1T"]) -- (bf16 has no such parameter: once)
  rc, _, stderr = T.run(string.format("%s run %s/recipes/bench/quant.lua --quick --prefetch 12x --out %s",
    T.loip, T.root, out))
  assert.are_not.equal(0, rc)
  assert.truthy(stderr:find("--prefetch: '12x'", 1, true), stderr)
end)

-- prefill.lua needs a BF16 model: a small synthetic llama (in a scratch folder here)
it("prefill.lua --quick alternates the kernel variants and prints its report", function()
  local dir = T.tmpdir()
  local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth --like llama-3.2-1b --dtype bf16 --layers 2 --dim 64 "
    .. "--heads 4 --kv-heads 2 --ffn 96 --vocab 300 --seed 3 %s/m", T.loip, dir))
  assert.are.equal(0, rc, err)
  local stdout, stderr
  rc, stdout, stderr = T.run(string.format("LOIP_QUIET=1 %s run %s/recipes/bench/prefill.lua --model %s/m --quick --out %s",
    T.loip, T.root, dir, dir))
  assert.are.equal(0, rc, "prefill.lua failed:\n" .. stderr)
  local report = json.decode(stdout:match("([^\n]+)\n?$"))
  assert.is_true(#report.variants >= 1)
  for _, v in ipairs(report.variants) do
    assert.is_true(report.fma[v].gflops > 0, v) -- (each variant against its own vectors' roof)
    assert.is_true(report.model[v].prefill_tokens_per_s > 0, v)
    assert.is_true(report.matmul["64x96"][v].gflops > 0, v)
    -- where the prefill's time went (one run with --quick: its parts add up to it, within the
    -- timer reads around it), and the
    -- layers' matmuls (q, k, v, o, gate, up, down) timed alone
    local b = report.breakdown[v]
    assert.is_true(b.linear_s > 0 and b.attention_s > 0 and b.prefill_s > b.linear_s + b.attention_s, v)
    assert.is_true(math.abs(b.linear_s + b.attention_s + b.rest_s - b.prefill_s) < 1e-3, v)
    assert.is_true(b.matmuls_alone_s > 0, v)
    assert.is_nil(report.steps[v], v) -- (--quick prefills 16 rows: no step of 64 or 256 fits)
    for _, key in ipairs({ "64x64", "32x64", "96x64" }) do assert.is_table(report.matmul[key], key) end
  end
  if loip.C.loip_kernels_use("amx") == 0 then -- amx-auto's crossover, measured
    loip.C.loip_kernels_use("auto")
    assert.are.equal(7, #report.amx_rows.sweep)
    assert.are.equal(32, report.amx_rows.in_force)
  end
end)

describe("the benchmark recipes", function()
  for _, r in ipairs(RECIPES) do
    local name, extra, fields = r[1], r[2], r[3]
    it(name .. ".lua --quick" .. (extra ~= "" and " " .. extra or "") .. " runs on a small model and prints its report", function()
      local store = T.slice_store(S260, "s260-bench")
      local out = T.tmpdir()
      local rc, stdout, stderr = T.run(string.format("%s run %s/recipes/bench/%s.lua --store %s --quick --out %s %s",
        T.loip, T.root, name, store, out, extra))
      assert.are.equal(0, rc, name .. ".lua failed:\n" .. stderr)
      local last = stdout:match("([^\n]+)\n?$")
      local report = last and json.decode(last)
      assert.is_table(report, name .. ".lua printed no JSON report:\n" .. stdout)
      for _, f in ipairs(fields) do
        assert.is_not_nil(report[f], name .. ".lua's report has no " .. f)
      end
      if report.same_tokens ~= nil then assert.is_true(report.same_tokens, name .. ": the plans' tokens differ") end
      if name == "local" then
        -- three runs, each with a fresh calibration, and the target judged on the median one
        assert.are.equal(3, #report.runs)
        local sorted = { unpack(report.ratios) }
        table.sort(sorted)
        assert.are.equal(sorted[2], report.median_ratio)
        assert.are.equal(report.runs[report.median_run].ratio, report.median_ratio)
        assert.are.equal(1.2, report.target)
        assert.are.equal(report.median_ratio <= 1.2 and 1 / report.median_ratio <= 1.2, report.within_target)
      end
    end)
  end
end)
