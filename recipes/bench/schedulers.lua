-- The schedulers on the same runtime, in one run: every shipped scheduler's plan for a few local
-- emulated clusters, each measured (ms/token, per device) beside its cost-model prediction.
--
--   loip run recipes/bench/schedulers.lua [--store DIR] [--clusters pipeline,hetero,gbit]
--        [--schedulers loip,even,uniform,pipeline,pipeline-offload,edgeshard] [--tokens N]
--        [--rounds R] [--out DIR] [--quick] [--decide-only]
--
-- Clusters (a synthetic llama-3.2-1b BF16 slice store, made on first use; context 256):
--   pipeline  the pipeline benchmark's: 3 devices whose budgets total 60% of the weights (with KV
--             and buffers: 653M, 152M, 653M), links 100 Mbit/s + 2 ms, disks 600 MB/s
--   hetero    the same with device 2 twice as slow in compute and a 300 MB/s disk
--   gbit      2 devices at 1 Gbit/s (0.2 ms), budgets of 80% of the weights, disks 600 MB/s
-- Each cluster's workers start once; every scheduler's plan is loaded in turn and decodes
-- --tokens tokens (the median step), for --rounds rounds in alternating order; all plans must
-- give the same tokens. A scheduler that cannot fit (OOM) is reported with its reason. Figures:
-- ms/token measured and predicted (their ratio: the cost model's fidelity), loip's speedup over
-- each other scheduler, per device compute / load / stall ms per token measured and predicted.
-- Targets (docs/planning.md): loip >= 1.15x faster than even on pipeline, >= 1.4x on hetero,
-- >= 2x faster than pipeline-offload on both, within 10% of its prediction. JSON on stdout; an
-- SVG and a Markdown table in --out.
--
-- First, no cluster needed ("decide"; alone with --decide-only): the time loip's scheduler (the
-- DP and its refinement) takes to plan llama-3.3-70b (context 4096) on the paper's 8 boards
-- (Orin 64 GB x2, Orin 32 GB x3, Xavier NX 16 GB x3) with most of their memory for the model
-- (it fits) and with a share of it (it does not: offloading), the best of 5 decisions each.
-- Target: under 50 ms each.
local bench = require "loip.measure.bench"
local cluster = require "loip.cluster"
local core = require "loip.core"
local flags = require "loip.ui.flags"
local json = require "loip.text.json"
local memory = require "loip.runtime.memory"
local plan_mod = require "loip.plan"
local plot = require "loip.measure.plot"
local store = require "loip.model.store"
local policy = require "loip.policy"
local problem = require "loip.plan.problem"

local spec = {
  name = "schedulers.lua", usage = "loip run recipes/bench/schedulers.lua [flags]",
  summary = "Every scheduler's plan on local emulated clusters: measured and predicted ms/token.",
  flags = bench.store_flags("to run", {
    { "clusters", "string", "clusters to run (pipeline, hetero, gbit)", default = "pipeline,hetero,gbit" },
    { "schedulers", "string", "schedulers to run", default = "loip,even,uniform,pipeline,pipeline-offload,edgeshard" },
    { "tokens", "int", "tokens per measurement (the model's end tokens do not cut it short)", default = 6 },
    { "rounds", "int", "measurements of each plan (alternated)", default = 3 },
    { "context", "int", "KV cache positions", default = 256 },
    { "out", "string", "where to write schedulers.json, .svg and .md", default = "bench-out" },
    { "cpu-latency", "int", "hold the CPU wake-up latency at US microseconds while measuring (root; -1: do not)",
      default = 0, metavar = "US" },
    { "quick", "bool", "2 tokens, 1 round: check the recipe works" },
    { "decide-only", "bool", "only the scheduler's decision times (llama-3.3-70b on 8 devices): no store, no cluster" },
  }),
}
local o = flags.parse(spec, arg, 1)
if o.quick then o.tokens, o.rounds = 2, 1 end
local log, median = bench.log, bench.median

-- "decide": the scheduler's own time on llama-3.3-70b over 8 boards (the problem
-- spec/unit/scheduler_spec.lua checks the plans of), no weights, no devices.
local function decide_70b()
  local m = problem.model_of_shape("llama-3.3-70b", {}, { context = 4096, batch = 64, threads = 1 })
  local GiB = 1024 ^ 3
  local disks = { 2.5e9, 2.5e9, 2e9, 2e9, 2e9, 1.2e9, 1.2e9, 1.2e9 } -- bytes/s: NVMe on the Orins, slower on the NX
  local out = {}
  for _, budgets in ipairs({ { 60, 60, 28, 28, 28, 14, 14, 14 }, { 24, 24, 12, 12, 12, 6, 6, 6 } }) do
    local p = { model = m, devices = {}, links = {}, micro_batch = 1, cluster = true, loader = "uring", context = 4096,
      head = { step_ms = 0.2, from_last = { transport_ms = 0.2 } } }
    for i = 1, 8 do
      local speed = i <= 2 and 150e9 or (i <= 5 and 100e9 or 50e9) -- bytes/s of weights streamed through compute
      p.devices[i] = { budget = budgets[i] * GiB, compute = { mha_ms = m.mha_bytes / speed * 1e3, mlp_ms = m.mlp_bytes / speed * 1e3,
        head_ms = m.head_bytes / speed * 1e3, under_load = 1.1 }, disk_bps = disks[i], load_ms = 0.1 }
      p.links[i] = { rate_bps = 12.5e6, delay_ms = 1, transport_ms = 0.2 }
    end
    p.head.to_first = p.links[8]
    local times, q, est = {}, nil, nil
    for k = 1, 5 do
      collectgarbage()
      local info
      q, est, info = policy.plan(p, { scheduler = "loip", cost = "loip" })
      if not q then error("decide: no plan for budgets " .. table.concat(budgets, ",") .. " GiB: " .. tostring(est), 0) end
      times[k] = info.scheduler_ms
    end
    local best = math.min(unpack(times))
    out[#out + 1] = { model = "llama-3.3-70b", devices = 8, budgets_gib = budgets, best_ms = best, median_ms = median(times),
      runs_ms = times, stages = #q.devices[1].stages, predicted_ms_per_token = est.ms_per_token }
    log("decide: llama-3.3-70b on 8 devices, budgets %s GiB: %.1f ms (best of 5; median %.1f), S = %d, %.0f ms/token predicted",
      table.concat(budgets, ","), best, median(times), #q.devices[1].stages, est.ms_per_token)
  end
  return out
end
local decide = decide_70b()
local function decide_target()
  for _, d in ipairs(decide) do if d.best_ms >= 50 then return false end end
  return true
end
if o.decide_only then
  print(json.encode_sorted({ decide = decide, targets = { decide_70b_8_under_50ms = decide_target() } }))
  return
end

bench.ensure_store(o.store, o.model)
local man = store.read_manifest(o.store)
local cfg = store.config(o.store, man)
local sizes = plan_mod.sizes(man, cfg, { context = o.context, batch = 32, threads = 1 })
local MB = 1000 * 1000

local function budgets(n, share) return bench.budgets(sizes, n, share) end

local clusters = {
  pipeline = { devices = 3, mem = budgets(3, 0.6), link = { rate = "100mbit", delay_ms = 2 }, disk_rate = 600 * MB,
    about = "3 devices, 60% of the weights, 100 Mbit/s + 2 ms, disks 600 MB/s" },
  hetero = { devices = 3, mem = budgets(3, 0.6), link = { rate = "100mbit", delay_ms = 2 },
    disk_rate = { 600 * MB, 300 * MB, 600 * MB }, slowdown = { 1, 2, 1 },
    about = "as pipeline, device 2 twice as slow with a 300 MB/s disk" },
  gbit = { devices = 2, mem = budgets(2, 0.8), link = { rate = "1gbit", delay_ms = 0.2 }, disk_rate = 600 * MB,
    about = "2 devices, 80% of the weights, 1 Gbit/s + 0.2 ms, disks 600 MB/s" },
}

local held
if o.cpu_latency >= 0 then
  local ok, err = core.wake_latency(o.cpu_latency)
  held = ok
  log(ok and ("CPU wake-up latency held at " .. o.cpu_latency .. " us while measuring") or ("not holding a CPU wake-up latency: " .. tostring(err)))
end

local prompt = bench.prompt(cfg.vocab_size)
local names = {}
for s in o.schedulers:gmatch("[^,]+") do names[#names + 1] = s end

-- One cluster: every scheduler planned (or refused), then measured round by round.
local function run_cluster(name)
  local cl = clusters[name] or error("--clusters: unknown cluster '" .. name .. "' (pipeline, hetero, gbit)", 0)
  local mems = {}
  for i, m in ipairs(cl.mem) do mems[i] = memory.format_bytes(m) end
  log("cluster %s: %s; budgets %s", name, cl.about, table.concat(mems, ", "))
  local c = cluster.start_local { store = o.store, devices = cl.devices, mem = cl.mem, threads = 1 }
  local out = { name = name, about = cl.about, budgets = cl.mem, schedulers = {} }
  local ok, err = pcall(function()
    local common = { context = o.context, batch = 32, disk_rate = cl.disk_rate, link = cl.link, slowdown = cl.slowdown, trace = false }
    local plans = {}
    for _, s in ipairs(names) do
      local opts = setmetatable({ scheduler = s }, { __index = common })
      local pok, p, est, info = pcall(c.plan, c, opts)
      if pok then
        plans[s] = { p = p, est = est }
        out.schedulers[s] = { predicted_ms = est.ms_per_token, scheduler_ms = info.scheduler_ms, stages = #p.devices[1].stages,
          plan = plan_mod.to_lua(p), predicted_devices = est.devices, layout = est.layout, runs = {} }
        log("  %-16s plan: S=%d, predicted %.1f ms/token (decided in %.1f ms)", s, #p.devices[1].stages, est.ms_per_token, info.scheduler_ms)
      else
        out.schedulers[s] = { refused = tostring(p) }
        log("  %-16s %s", s, tostring(p))
      end
    end
    for r = 1, o.rounds do
      local order = {}
      for _, s in ipairs(names) do if plans[s] then order[#order + 1] = s end end
      if r % 2 == 0 then for k = 1, math.floor(#order / 2) do order[k], order[#order + 1 - k] = order[#order + 1 - k], order[k] end end
      for _, s in ipairs(order) do
        c:plan(setmetatable({ plan = plans[s].p, estimate = false }, { __index = common }))
        -- the devices' figures over decoding steps only (the prefill left out)
        local it, st = c:generate(prompt, { max_tokens = o.tokens + 3, sampler = { temperature = 0 }, ignore_eos = true })
        local steps, devices = bench.decode_figures(c, it)
        local run = { ms = median(steps), steps = steps, tokens = st.token_ids, devices = devices }
        local rs = out.schedulers[s].runs
        rs[#rs + 1] = run
        log("  round %d: %-16s %.1f ms/token (predicted %.1f)", r, s, run.ms, plans[s].est.ms_per_token)
      end
    end
  end)
  c:close()
  if not ok then error(err, 0) end
  -- the figures: medians over rounds, ratios, the same tokens everywhere
  local ref
  for _, s in ipairs(names) do
    local x = out.schedulers[s]
    if x.runs and #x.runs > 0 then
      local ms = {}
      for k, run in ipairs(x.runs) do ms[k] = run.ms end
      x.measured_ms = median(ms)
      x.measured_vs_predicted = x.measured_ms / x.predicted_ms
      x.devices = x.runs[#x.runs].devices
      local toks = table.concat(x.runs[1].tokens, ",")
      ref = ref or toks
      x.same_tokens = toks == ref
      for _, run in ipairs(x.runs) do x.same_tokens = x.same_tokens and table.concat(run.tokens, ",") == ref end
    end
  end
  local lo = out.schedulers.loip
  out.speedup = {}
  if lo and lo.measured_ms then
    for _, s in ipairs(names) do
      local x = out.schedulers[s]
      if s ~= "loip" and x.measured_ms then out.speedup[s] = x.measured_ms / lo.measured_ms end
    end
    out.loip_fidelity = lo.measured_vs_predicted
  end
  return out
end

local results = { store = o.store, tokens = o.tokens, rounds = o.rounds, context = o.context, clusters = {}, decide = decide }
local ok, err = pcall(function()
  for name in o.clusters:gmatch("[^,]+") do results.clusters[#results.clusters + 1] = run_cluster(name) end
end)
if held then core.wake_latency(nil) end
if not ok then error(err, 0) end

-- targets
local t = {}
for _, cl in ipairs(results.clusters) do
  local sp = cl.speedup
  if cl.name == "pipeline" then t.pipeline_vs_even = sp.even and sp.even >= 1.15 end
  if cl.name == "hetero" then t.hetero_vs_even = sp.even and sp.even >= 1.4 end
  if cl.name == "pipeline" or cl.name == "hetero" then
    t[cl.name .. "_vs_pipeline_offload"] = sp["pipeline-offload"] and sp["pipeline-offload"] >= 2
  end
  t[cl.name .. "_fidelity"] = cl.loip_fidelity and math.abs(cl.loip_fidelity - 1) <= 0.1
end
t.decide_70b_8_under_50ms = decide_target()
results.targets = t

-- the plot, the table
os.execute("mkdir -p '" .. o.out .. "'")
local bars = {}
local colors = { loip = "#27ae60", even = "#2980b9", uniform = "#8e44ad", ["pipeline-offload"] = "#7f8c8d", pipeline = "#d35400", edgeshard = "#c0392b" }
local md = { "| cluster | scheduler | stages | predicted ms/token | measured ms/token | measured / predicted | loip's speedup |",
  "|---|---|---|---|---|---|---|" }
for _, cl in ipairs(results.clusters) do
  for _, s in ipairs(names) do
    local x = cl.schedulers[s]
    if x.measured_ms then
      bars[#bars + 1] = { string.format("%s: %s (S=%d)", cl.name, s, x.stages), x.measured_ms,
        string.format("predicted %.0f%s", x.predicted_ms, cl.speedup[s] and string.format(", loip %.2fx faster", cl.speedup[s]) or ""),
        color = colors[s] }
      md[#md + 1] = string.format("| %s | %s | %d | %.1f | %.1f | %.3f | %s |", cl.name, s, x.stages, x.predicted_ms, x.measured_ms,
        x.measured_vs_predicted, cl.speedup[s] and string.format("%.2fx", cl.speedup[s]) or "")
    else
      md[#md + 1] = string.format("| %s | %s | | | %s | | |", cl.name, s, (x.refused or "?"):gsub("|", "/"))
    end
  end
end
md[#md + 1] = ""
md[#md + 1] = "| cluster | scheduler | device | compute ms (pred.) | load ms (pred.) | stall ms | uncovered ms (pred.) |"
md[#md + 1] = "|---|---|---|---|---|---|---|"
for _, cl in ipairs(results.clusters) do
  for _, s in ipairs(names) do
    local x = cl.schedulers[s]
    if x.measured_ms then
      for i, d in ipairs(x.devices) do
        local e = x.predicted_devices[i]
        md[#md + 1] = string.format("| %s | %s | %d | %.1f (%.1f) | %.1f (%.1f) | %.1f | (%.1f) |", cl.name, s, i, d.compute_ms, e.comp_ms,
          d.load_ms, e.load_ms, d.stall_ms, e.uncover_ms)
      end
    end
  end
end
local f = assert(io.open(o.out .. "/schedulers.md", "w"))
f:write(table.concat(md, "\n"), "\n")
f:close()
results.plot = plot.bars(o.out .. "/schedulers.svg", {
  title = "loip schedulers on one runtime: llama-3.2-1b BF16 on local emulated clusters, ms/token (measured)",
  unit = "ms", bars = bars })
f = assert(io.open(o.out .. "/schedulers.json", "w"))
f:write(json.encode_sorted(results, 2), "\n")
f:close()
for _, cl in ipairs(results.clusters) do
  for _, x in pairs(cl.schedulers) do x.runs, x.plan = nil, nil end
end
print(json.encode_sorted(results))
