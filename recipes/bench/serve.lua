-- Serving under sporadic and bursty load (the paper's Sec. IV), through the HTTP API, in one run:
-- the interleaved pipeline (--scheduler, loip by default) against a conventional pipeline with
-- offloading (pipeline-offload: S = 1, each device reads its offloaded blocks when its turn
-- comes), on the same local devices, budgets, links and disks as recipes/bench/pipeline.lua.
--
--   loip run recipes/bench/serve.lua [--store DIR] [--devices 3] [--budget 0.6] [--burst 4]
--        [--input-tokens 8] [--output-tokens 8] [--sporadic 2] [--poisson-rate R] [--out DIR]
--
-- For each plan, a `loip serve --devices N` process (budgets planned for --burst requests at
-- once) is driven by loip.serve.load over libcurl's multi interface: sporadic (--sporadic
-- requests one after another), bursty (--burst at once). On the interleaved plan, open-loop
-- Poisson arrivals (--poisson-rate) too, once with each way of prefilling newcomers (--prefill:
-- chunked beside the others' decoding, or steps of their own): what a newcomer costs the
-- requests already decoding (their ms/token p99) and itself (its time to first token). Per
-- request: time to first token and ms/token after it (p50/p99); per run: the aggregate
-- tokens/s. Targets: bursty tokens/s >= 3x sporadic (one request at a time) on the interleaved
-- plan, and >= 2x the conventional plan's under the same burst. JSON + SVG.
local bench = require "loip.measure.bench"
local flags = require "loip.ui.flags"
local json = require "loip.text.json"
local load = require "loip.serve.load"
local memory = require "loip.runtime.memory"
local plot = require "loip.measure.plot"
local plan_mod = require "loip.plan"
local store = require "loip.model.store"

local spec = {
  name = "serve.lua", usage = "loip run recipes/bench/serve.lua [flags]",
  summary = "Sporadic vs bursty requests through loip serve: interleaved vs conventional offloading pipeline.",
  flags = bench.store_flags("to serve", {
    { "devices", "int", "local devices", default = 3 },
    { "budget", "number", "all budgets together, as a share of the weights", default = 0.6 },
    { "link-rate", "string", "emulated link rate", default = "100mbit" },
    { "link-delay", "number", "emulated one-way delay, ms", default = 2 },
    { "disk-rate", "bytes", "each device's disk read rate", default = 600 * 1000 * 1000 },
    { "context", "int", "positions per request", default = 256 },
    { "burst", "int", "requests of a burst (and the server's --max-batch)", default = 4 },
    { "sporadic", "int", "requests sent one after another", default = 2 },
    { "input-tokens", "int", "prompt tokens per request", default = 8 },
    { "output-tokens", "int", "tokens generated per request (ignore_eos: the model's end tokens do not cut it short)", default = 8 },
    { "poisson-rate", "number", "open-loop arrivals at this many requests/s on the interleaved plan (0: none)", default = 0.5 },
    { "prefill", "string", "the ways of prefilling newcomers compared under Poisson arrivals", default = "chunked,own" },
    { "schedulers", "string", "the plans compared, comma-separated", default = "loip,pipeline-offload" },
    { "out", "string", "where to write serve.json and serve.svg", default = "bench-out" },
    { "quick", "bool", "2 output tokens, bursts of 2, one sporadic request: check the recipe works" },
  }),
}
local o = flags.parse(spec, arg, 1)
if o.quick then o.output_tokens, o.burst, o.sporadic, o.poisson_rate = 2, 2, 1, 0 end
local log = bench.log

bench.ensure_store(o.store, o.model)
local man = store.read_manifest(o.store)
local cfg = store.config(o.store, man)
local sizes = plan_mod.sizes(man, cfg, { context = o.context, batch = 32, threads = 1, max_seqs = o.burst })
local N = o.devices
local mems = bench.budgets(sizes, N, o.budget)
local total = 0
local mem_list = {}
for i, m in ipairs(mems) do total, mem_list[i] = total + m, tostring(m) end
log("%d devices, budgets %s (%.0f%% of the %.2f GB of weights, with KV for %d requests and buffers), links %s + %g ms, disks %s/s",
  N, table.concat((function() local t = {} for i, m in ipairs(mems) do t[i] = memory.format_bytes(m) end return t end)(), ", "),
  100 * total / sizes.weight_bytes, sizes.weight_bytes / 1e9, o.burst, o.link_rate, o.link_delay, memory.format_bytes(o.disk_rate))

-- A `loip serve` child with the scheduler's plan (loip.measure.bench.serve).
local function start_server(scheduler, prefill)
  return bench.serve(string.format("--model '%s' --devices %d --mem %s --threads 1 --context %d --max-batch %d --step-tokens 32 "
    .. "--link-rate %s --link-delay %gms --disk-rate %d --scheduler %s --prefill %s", o.store, N, table.concat(mem_list, ","),
    o.context, o.burst, o.link_rate, o.link_delay, o.disk_rate, scheduler, prefill), scheduler)
end

local model_name = o.store:gsub("/+$", ""):match("([^/]+)$")
-- the runs: each plan with sporadic and bursty load; the first (interleaved) plan also under
-- Poisson arrivals, with each way of prefilling (one server each)
local scheds, modes = {}, {}
for x in o.schedulers:gmatch("[^,]+") do scheds[#scheds + 1] = x end
for x in o.prefill:gmatch("[^,]+") do
  if x ~= "chunked" and x ~= "own" then error("--prefill: '" .. x .. "' is not chunked or own", 0) end
  modes[#modes + 1] = x
end
local runs_todo = {}
for i, sched in ipairs(scheds) do
  local first_mode = modes[1] or "chunked"
  runs_todo[#runs_todo + 1] = { sched = sched, prefill = first_mode, patterns = i == 1 and o.poisson_rate > 0
    and { "sporadic", "bursty", "poisson" } or { "sporadic", "bursty" } }
  if i == 1 and o.poisson_rate > 0 then
    for k = 2, #modes do runs_todo[#runs_todo + 1] = { sched = sched, prefill = modes[k], patterns = { "poisson" } } end
  end
end
local results, order, prefill_runs = {}, {}, {}
for _, run in ipairs(runs_todo) do
  local sched = run.sched
  log("%s (prefill %s): starting loip serve (planning, loading the resident blocks)", sched, run.prefill)
  local srv = start_server(sched, run.prefill)
  local url = srv.url
  local ok, err = pcall(function()
    local play = function(pattern, opts)
      opts.input_tokens, opts.output_tokens = o.input_tokens, o.output_tokens
      local runs = load.play(url, model_name, load.pattern(pattern, opts), { vocab = cfg.vocab_size, ignore_eos = true })
      local s = load.summary(runs)
      if s.failed > 0 then
        for _, r in ipairs(runs) do if r.status ~= 200 then error(string.format("%s %s: HTTP %s %s", sched, pattern, tostring(r.status), tostring(r.error)), 0) end end
      end
      s.runs = runs
      log("%-17s %-8s %2d requests: %6.2f tokens/s, ttft p50 %.0f ms, %.0f ms/token p50 (p99 %.0f)", sched, pattern, s.requests,
        s.tokens_per_s, s.ttft_ms and s.ttft_ms.p50 or 0, s.ms_per_token and s.ms_per_token.p50 or 0,
        s.ms_per_token and s.ms_per_token.p99 or 0)
      return s
    end
    load.play(url, model_name, load.pattern("sporadic", { count = 1, input_tokens = 4, output_tokens = 2 }), { vocab = cfg.vocab_size }) -- warm-up
    results[sched] = results[sched] or {}
    for _, pat in ipairs(run.patterns) do
      local opts = pat == "sporadic" and { count = o.sporadic } or pat == "bursty" and { burst = o.burst }
        or { rate = o.poisson_rate, count = 2 * o.burst, seed = 1 }
      local s = play(pat, opts)
      if pat == "poisson" then prefill_runs[run.prefill] = s end
      if pat ~= "poisson" or run.prefill == (modes[1] or "chunked") then results[sched][pat] = s end
    end
    if not order[#order] or order[#order] ~= sched then order[#order + 1] = sched end
  end)
  srv.stop()
  if not ok then error(tostring(err) .. "\nthe server's log ends:\n" .. srv.log():sub(-3000), 0) end
end

local inter, conv = results[order[1]], results[order[2]]
local burst_vs_single = inter.bursty.tokens_per_s / inter.sporadic.tokens_per_s
local vs_conventional = conv and inter.bursty.tokens_per_s / conv.bursty.tokens_per_s or nil
log("%s: bursty %.2f tokens/s = %.2fx sporadic; %s", order[1], inter.bursty.tokens_per_s, burst_vs_single,
  vs_conventional and string.format("%.2fx %s under the same burst", vs_conventional, order[2]) or "")

local table_rows = {}
for _, sched in ipairs(order) do
  for _, pat in ipairs({ "sporadic", "bursty", "poisson" }) do
    local s = results[sched][pat]
    if s then
      table_rows[#table_rows + 1] = { scheduler = sched, pattern = pat, requests = s.requests, tokens_per_s = s.tokens_per_s,
        ttft_ms_p50 = s.ttft_ms and s.ttft_ms.p50, ttft_ms_p99 = s.ttft_ms and s.ttft_ms.p99,
        ms_per_token_p50 = s.ms_per_token and s.ms_per_token.p50, ms_per_token_p99 = s.ms_per_token and s.ms_per_token.p99 }
    end
  end
end
local prefill = {}
for mode, s in pairs(prefill_runs) do
  prefill[mode] = { tokens_per_s = s.tokens_per_s, ttft_ms = s.ttft_ms, ms_per_token = s.ms_per_token }
  log("poisson %.2f/s, prefill %-7s: ttft p50 %.0f ms, ms/token p50 %.0f, p99 %.0f", o.poisson_rate, mode,
    s.ttft_ms and s.ttft_ms.p50 or 0, s.ms_per_token and s.ms_per_token.p50 or 0, s.ms_per_token and s.ms_per_token.p99 or 0)
end
local result = {
  prefill = next(prefill) and prefill or nil, poisson_rate = o.poisson_rate > 0 and o.poisson_rate or nil,
  devices = N, budgets = mems, budget_share = total / sizes.weight_bytes, link_rate = o.link_rate, link_delay_ms = o.link_delay,
  disk_rate = o.disk_rate, context = o.context, burst = o.burst, input_tokens = o.input_tokens, output_tokens = o.output_tokens,
  store = o.store, table = table_rows, results = results,
  bursty_vs_sporadic = burst_vs_single, bursty_vs_sporadic_target = 3,
  vs_conventional = vs_conventional, vs_conventional_target = 2,
  meets_target = burst_vs_single >= 3 and (vs_conventional == nil or vs_conventional >= 2),
}
os.execute("mkdir -p '" .. o.out .. "'")
local bars = {}
local colors = { sporadic = "#7f8c8d", bursty = "#27ae60", poisson = "#2980b9" }
for _, row in ipairs(table_rows) do
  bars[#bars + 1] = { string.format("%s, %s (%d)", row.scheduler, row.pattern, row.requests), row.tokens_per_s,
    row.ms_per_token_p50 and string.format("(%.0f ms/token)", row.ms_per_token_p50) or nil, color = colors[row.pattern] }
end
result.plot = plot.bars(o.out .. "/serve.svg", {
  title = string.format("loip serve, llama-3.2-1b BF16, %d devices at %.0f%% of the weights, %s + %g ms links: aggregate tokens/s",
    N, 100 * total / sizes.weight_bytes, o.link_rate, o.link_delay),
  unit = "tokens/s", bars = bars,
})
local f = assert(io.open(o.out .. "/serve.json", "w"))
f:write(json.encode_sorted(result, 2), "\n")
f:close()
for _, r in pairs(results) do for _, s in pairs(r) do s.runs = nil end end
for _, s in pairs(prefill_runs) do s.runs = nil end
print(json.encode_sorted(result))
