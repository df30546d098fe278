-- The interleaved offloading pipeline against a conventional pipeline with offloading, on one
-- cluster of local devices, in one run.
--
--   loip run recipes/bench/pipeline.lua [--store DIR] [--devices 3] [--budget 0.6]
--        [--link-rate 100mbit] [--link-delay 2] [--disk-rate 600M] [--tokens N] [--out DIR]
--        [--scheduler NAME] [--stages S]
--
-- A synthetic llama-3.2-1b BF16 slice store (made on first use) on --devices local workers whose
-- budgets total --budget of the weights (device 1 and N hold the embedding: they get what it
-- needs on top of an equal share), links emulated at --link-rate and --link-delay ms, each
-- worker's disk limited to --disk-rate (so that the workers, sharing this machine's one disk,
-- behave as boards with a disk each). Two plans, alternated for --rounds rounds: the
-- interleaved plan (--scheduler's, loip by default: loads start as soon as the slot has room)
-- and the conventional one (pipeline-offload's: S = 1, each device reads each offloaded block
-- when its turn comes).
-- Reports ms/token of each (median step), the speedup, per-device compute/load/stall/send per
-- token, and the transport's time per hop (send to delivery, the mean over every hidden state a
-- receiver got, from its link stats) against bytes / rate + delay, split into the transport's
-- part (sender stamp to receipt: thread hand-offs and wake-ups) and the emulation's lateness.
-- The measurements hold the machine's CPU wake-up latency at --cpu-latency us (the workers share
-- this machine; see `loip worker --cpu-latency`), and the hop figures are also taken from one
-- more interleaved measurement without it. Targets: speedup >= 1.5, hop time <= 1.1x. JSON + SVG.
local bench = require "loip.measure.bench"
local cluster = require "loip.cluster"
local core = require "loip.core"
local flags = require "loip.ui.flags"
local json = require "loip.text.json"
local memory = require "loip.runtime.memory"
local plot = require "loip.measure.plot"
local plan_mod = require "loip.plan"
local store = require "loip.model.store"
local transport = require "loip.runtime.transport"
local trace_mod = require "loip.engine.trace"

local spec = {
  name = "pipeline.lua", usage = "loip run recipes/bench/pipeline.lua [flags]",
  summary = "Interleaved vs conventional offloading pipeline on local devices with emulated links.",
  flags = bench.store_flags("to run", {
    { "devices", "int", "local devices", default = 3 },
    { "budget", "number", "all budgets together, as a share of the weights", default = 0.6 },
    { "link-rate", "string", "emulated link rate", default = "100mbit" },
    { "link-delay", "number", "emulated one-way delay, ms", default = 2 },
    { "disk-rate", "bytes", "each device's disk read rate", default = 600 * 1000 * 1000 },
    { "tokens", "int", "tokens per measurement (the model's end tokens do not cut it short)", default = 6 },
    { "rounds", "int", "measurements of each plan (alternated)", default = 2 },
    { "context", "int", "KV cache positions", default = 256 },
    { "out", "string", "where to write pipeline.json and pipeline.svg", default = "bench-out" },
    { "cpu-latency", "int", "hold the CPU wake-up latency at US microseconds while measuring (Linux PM QoS, "
      .. "root; -1: do not); then one more interleaved measurement without it, for the hop figures", default = 0,
      metavar = "US" },
    { "scheduler", "string", "the scheduler of the interleaved plan (the conventional one is pipeline-offload's)",
      default = "loip" },
    { "stages", "int", "stages per device of the interleaved plan (default: the scheduler's choice)" },
    { "quick", "bool", "2 tokens, 1 round: check the recipe works" },
  }),
}
local o = flags.parse(spec, arg, 1)
if o.quick then o.tokens, o.rounds = 2, 1 end
local log, median = bench.log, bench.median

bench.ensure_store(o.store, o.model)

-- Budgets: --budget x the weights in all (loip.measure.bench.budgets says how they are shared).
local man = store.read_manifest(o.store)
local cfg = store.config(o.store, man)
local sizes = plan_mod.sizes(man, cfg, { context = o.context, batch = 32, threads = 1 })
local N = o.devices
local mems = bench.budgets(sizes, N, o.budget)
local total = 0
for _, m in ipairs(mems) do total = total + m end
log("%d devices, budgets %s (%.0f%% of the %.2f GB of weights, with KV and buffers), links %s + %g ms, disks %s/s",
  N, table.concat((function() local t = {} for i, m in ipairs(mems) do t[i] = memory.format_bytes(m) end return t end)(), ", "),
  100 * total / sizes.weight_bytes, sizes.weight_bytes / 1e9, o.link_rate, o.link_delay, memory.format_bytes(o.disk_rate))

local held, held_err
if o.cpu_latency >= 0 then
  held, held_err = core.wake_latency(o.cpu_latency)
  if held then log("CPU wake-up latency held at %d us while measuring", o.cpu_latency)
  else log("not holding a CPU wake-up latency (%s): hops measured as the machine is", held_err) end
end
local c = cluster.start_local { store = o.store, devices = N, mem = mems, threads = 1 }
local link = { rate = o.link_rate, delay_ms = o.link_delay }
local common = { context = o.context, batch = 32, disk_rate = o.disk_rate, link = link }
local prompt = bench.prompt(cfg.vocab_size)

local function plan_for(kind)
  local opts = { trace = true }
  for k, v in pairs(common) do opts[k] = v end
  opts.scheduler = kind == "conventional" and "pipeline-offload" or o.scheduler
  if kind ~= "conventional" then opts.stages = o.stages end
  return c:plan(opts)
end

-- Decode o.tokens tokens: ms per step (median) and per-device per-token figures.
local function measure(kind, no_trace)
  local p = plan_for(kind)
  local it, st = c:generate(prompt, { max_tokens = o.tokens + 3, sampler = { temperature = 0 }, ignore_eos = true })
  local steps, per, after, last = bench.decode_figures(c, it)
  -- the timeline of this measurement: one trace per kind (the last round's), drawn over two
  -- tokens from the middle of the decode
  if no_trace then
    return { ms = median(steps), steps = steps, tokens = st.token_ids, stages = #p.devices[1].stages }
  end
  local tr = c:collect_trace(trace_mod.new())
  local tpath = string.format("%s/pipeline-%s-trace.json", o.out, kind)
  os.execute("mkdir -p '" .. o.out .. "'")
  tr:write(tpath)
  local first = math.huge
  for _, x in ipairs(tr.events) do first = math.min(first, x.e.t0_ns) end
  local mid = (last - core.now_ms()) -- (last step's end, relative to now: negative)
  local t_end_ms = (core.now_ns() - first) / 1e6 + mid
  local span = 2 * median(steps)
  trace_mod.plot(tpath, (tpath:gsub("%.json$", ".svg")), { from_ms = math.max(0, t_end_ms - span - median(steps)),
    to_ms = t_end_ms - median(steps),
    title = string.format("%s pipeline (S=%d), two decoding steps: %d devices, %s + %g ms links", kind, #p.devices[1].stages,
      N, o.link_rate, o.link_delay) })
  for i = 1, N do per[i].links = after[i].links end
  return { ms = median(steps), steps = steps, tokens = st.token_ids, devices = per, stages = #p.devices[1].stages,
    plan = plan_mod.to_lua(p) }
end

local hop_expected = (sizes.dim * 4 + 64) / transport.parse_rate(o.link_rate) * 1e3 + o.link_delay
-- Time per hop between two c:stats() snapshots, from every receiver's link stats (hidden states
-- are small messages; the stats keep sums since the worker started).
local function link_sums(stats)
  local t = {}
  for i, st in ipairs(stats) do
    for _, l in ipairs(st.links or {}) do
      if l.peer:match("^d%d+$") and l.mean_latency_ms then
        local n = l.small_messages
        t[l.peer .. ">d" .. i] = { from = l.peer, to = "d" .. i, n = n, ms = l.mean_latency_ms * n,
          transit = l.mean_transit_ms * n, late = l.mean_late_ms * n }
      end
    end
  end
  return t
end
local function hops_between(before, after)
  local b, hops = link_sums(before), {}
  for key, a in pairs(link_sums(after)) do
    local z = b[key] or { n = 0, ms = 0, transit = 0, late = 0 }
    local n = a.n - z.n
    if n > 0 then
      local ms = (a.ms - z.ms) / n
      hops[#hops + 1] = { from = a.from, to = a.to, messages = n, ms = ms, ratio = ms / hop_expected,
        transit_ms = (a.transit - z.transit) / n, late_ms = (a.late - z.late) / n }
    end
  end
  table.sort(hops, function(x, y) return x.from < y.from end)
  return hops
end

local results = { interleaved = {}, conventional = {} }
local hops, hops_free
local ok, err = pcall(function()
  local s0 = c:stats()
  for r = 1, o.rounds do
    for _, kind in ipairs(r % 2 == 1 and { "interleaved", "conventional" } or { "conventional", "interleaved" }) do
      local m = measure(kind)
      results[kind][#results[kind] + 1] = m
      log("round %d: %-12s S=%d: %.1f ms/token", r, kind, m.stages, m.ms)
    end
  end
  local s1 = c:stats()
  hops = hops_between(s0, s1)
  if held then
    -- the same hops with the CPUs free to sleep deeply: what the wake-ups cost on this machine
    core.wake_latency(nil)
    local m = measure("interleaved", true)
    hops_free = hops_between(s1, c:stats())
    log("without the held CPU wake-up latency: interleaved %.1f ms/token", m.ms)
    results.interleaved_free = m
  end
end)
c:close()
if held then core.wake_latency(nil) end
if not ok then error(err, 0) end

local function med(kind) local xs = {} for _, m in ipairs(results[kind]) do xs[#xs + 1] = m.ms end return median(xs) end
local inter, conv = med("interleaved"), med("conventional")
local worst_hop = 0
for _, h in ipairs(hops) do worst_hop = math.max(worst_hop, h.ratio) end
local same = table.concat(results.interleaved[1].tokens, ",") == table.concat(results.conventional[1].tokens, ",")
  and (not results.interleaved_free
    or table.concat(results.interleaved_free.tokens, ",") == table.concat(results.interleaved[1].tokens, ","))
local result = {
  devices = N, budgets = mems, budget_share = total / sizes.weight_bytes, link_rate = o.link_rate, link_delay_ms = o.link_delay,
  disk_rate = o.disk_rate, tokens = o.tokens, rounds = o.rounds, store = o.store,
  interleaved_ms = inter, conventional_ms = conv, speedup = conv / inter, speedup_target = 1.5,
  hop_expected_ms = hop_expected, hops = hops, worst_hop_ratio = worst_hop, hop_target = 1.1,
  cpu_latency_us = held and o.cpu_latency or nil, cpu_latency_error = held_err,
  hops_without_cpu_latency = hops_free,
  same_tokens = same, runs = results,
  meets_target = conv / inter >= 1.5 and worst_hop <= 1.1 and same,
}
os.execute("mkdir -p '" .. o.out .. "'")
local bars = {
  { string.format("interleaved (S=%d)", results.interleaved[1].stages), inter, nil, color = "#27ae60" },
  { "conventional (S=1, load then compute)", conv, string.format("(%.2fx)", conv / inter), color = "#7f8c8d" },
}
for i, d in ipairs(results.interleaved[#results.interleaved].devices) do
  bars[#bars + 1] = { string.format("interleaved device %d: compute", i), d.compute_ms, nil, color = "#2980b9" }
  bars[#bars + 1] = { string.format("interleaved device %d: stall", i), d.stall_ms, nil, color = "#c0392b" }
end
result.plot = plot.bars(o.out .. "/pipeline.svg", {
  title = string.format("loip pipeline, llama-3.2-1b BF16, %d devices at %.0f%% of the weights, %s + %g ms links, ms/token",
    N, 100 * total / sizes.weight_bytes, o.link_rate, o.link_delay),
  unit = "ms", bars = bars,
})
local f = assert(io.open(o.out .. "/pipeline.json", "w"))
f:write(json.encode_sorted(result, 2), "\n")
f:close()
for _, kind in ipairs({ "interleaved", "conventional" }) do for _, m in ipairs(results[kind]) do m.plan = nil end end
print(json.encode_sorted(result))
