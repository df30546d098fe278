-- The cost model's estimate against the measured time of a local cluster: devices that share
-- this machine's disk and cores, priced from the calibration loip makes for them (no emulation
-- flags beyond the links), as `loip generate --devices N --mem ...` plans and runs it.
--
--   loip run recipes/bench/local.lua [--store DIR] [--devices 3] [--mem 4G,4G,4G]
--        [--link-rate 1gbit] [--tokens 8] [--context 256] [--out DIR] [--quick]
--
-- The store is a synthetic llama-3.2-1b BF16 one by default (made on first use); the issue's
-- case is an 8B one (`loip synth --like llama-3.1-8b --dtype bf16 SRC`, `loip slice SRC STORE`,
-- then --store STORE --mem 4G,4G,4G). --mem defaults to half the weights shared out. The
-- calibration comes from loip's cache (~/.cache/loip, or $LOIP_CACHE_DIR: point it at an empty
-- directory to measure afresh). Decodes --tokens tokens greedily from a fixed prompt; ms/token
-- is the median step. Prints one JSON object: estimated and measured ms/token and their ratio
-- (target: within 1.15), per device the estimated and measured compute and load per token, the
-- figures the devices were priced at (disk read rate with every local device reading, compute
-- slowdown while they read, MLP ms) and each device's budget, accounted peak and peak RSS.
local bench = require "loip.tools.bench"
local cluster = require "loip.cluster"
local flags = require "loip.tools.flags"
local json = require "loip.tools.json"
local memory = require "loip.runtime.memory"
local plan_mod = require "loip.plan"
local store = require "loip.model.store"

local spec = {
  name = "local.lua", usage = "loip run recipes/bench/local.lua [flags]",
  summary = "Estimated against measured ms/token of a local cluster (devices sharing this machine).",
  flags = bench.store_flags("to run", {
    { "devices", "int", "local devices", default = 3 },
    { "mem", "string", "budgets: one size, or one per device (default: half the weights shared out)" },
    { "link-rate", "string", "emulated link rate", default = "1gbit" },
    { "tokens", "int", "tokens decoded (the model's end tokens do not cut it short)", default = 8, check = function(v) return v >= 2, "must be >= 2" end },
    { "context", "int", "KV cache positions", default = 256 },
    { "out", "string", "where to write local.json", default = "bench-out" },
    { "alone", "bool", "also run the plan priced as if each device had the machine to itself (a calibration with one "
      .. "reader of the disk: how loip priced local devices before), and report its estimate against its measured time" },
    { "quick", "bool", "3 tokens: check the recipe works" },
  }),
}
local o = flags.parse(spec, arg, 1)
if o.quick then o.tokens = 3 end
local log, median = bench.log, bench.median
local TARGET = 1.15

bench.ensure_store(o.store, o.model)
local man = store.read_manifest(o.store)
local cfg = store.config(o.store, man)
local N = o.devices
local mems
if o.mem then
  mems = require("loip.cmd.common").settings("local.lua", { mem = o.mem }, N).mem -- (one, or one per device)
else
  local sizes = plan_mod.sizes(man, cfg, { context = o.context, batch = 64, threads = 1 })
  mems = bench.budgets(sizes, N, 0.5)
end
log("%d local devices, budgets %s, links %s", N,
  table.concat((function() local t = {} for i, m in ipairs(mems) do t[i] = memory.format_bytes(m) end return t end)(), ", "), o.link_rate)

local prompt = bench.prompt(cfg.vocab_size)
local c = cluster.start_local { store = o.store, devices = N, mem = mems }
local result
-- one plan, priced from the calibration `pr` (nil: the local cluster's own), decoded and measured
local function run(pr)
  local p, est = c:plan { context = o.context, link = { rate = o.link_rate }, profile = pr }
  local it, st = c:generate(prompt, { max_tokens = o.tokens + 3, sampler = { temperature = 0 }, ignore_eos = true })
  local steps, per, after = bench.decode_figures(c, it)
  local measured = median(steps)
  local prob = c.problem_table
  local devices = {}
  for i = 1, N do
    local e, d, a = est.devices[i], prob.devices[i], after[i]
    devices[i] = { compute_ms = per[i].compute_ms, estimated_compute_ms = e.comp_ms, load_ms = per[i].load_ms,
      estimated_load_ms = e.load_ms, stall_ms = per[i].stall_ms, estimated_uncover_ms = e.uncover_ms,
      disk_bps = d.disk_bps, under_load = d.compute.under_load, mlp_ms = d.compute.mlp_ms, mha_ms = d.compute.mha_ms,
      budget_bytes = a.budget_bytes, peak_bytes = a.peak_bytes, peak_rss_bytes = a.peak_rss_bytes,
      rss_over_budget_bytes = a.peak_rss_bytes and a.budget_bytes and a.peak_rss_bytes - a.budget_bytes or nil }
    log("device %d: compute %.0f ms (estimated %.0f), load %.0f ms (estimated %.0f); priced at %.0f MB/s, x%.2f while reading; RSS %s of %s",
      i, per[i].compute_ms, e.comp_ms, per[i].load_ms, e.load_ms, d.disk_bps / 1e6, d.compute.under_load or 1,
      a.peak_rss_bytes and memory.format_bytes(a.peak_rss_bytes) or "?", memory.format_bytes(a.budget_bytes or 0))
  end
  pr = prob.devices[1].profile or {}
  return { store = o.store, devices = N, budgets = mems, link_rate = o.link_rate, tokens = o.tokens, context = o.context,
    threads = c.devices[1].threads, cpus = pr.device and pr.device.cpus,
    calibration = { disk_readers = pr.disk and pr.disk.readers or 1, read_bps = pr.disk and pr.disk.read_bps,
      read_bps_alone = pr.disk and pr.disk.read_bps_alone, under_load = pr.compute and pr.compute.under_load,
      weight_bps = pr.compute and pr.compute.weight_bps["1"], spread = pr.compute and pr.compute.spread,
      unsteady = pr.compute and pr.compute.unsteady, disk_spread = pr.disk and pr.disk.spread,
      disk_steady = pr.disk and pr.disk.steady },
    estimated_ms = est.ms_per_token, measured_ms = measured, ratio = measured / est.ms_per_token, target = TARGET,
    within_target = measured / est.ms_per_token <= TARGET and est.ms_per_token / measured <= TARGET,
    steps = steps, token_ids = st.token_ids, per_device = devices, plan = plan_mod.bare(p) }
end
local ok, err = pcall(function()
  result = run(nil)
  log("estimated %.0f ms/token, measured %.0f: ratio %.2f (target within %.2f)", result.estimated_ms, result.measured_ms,
    result.ratio, TARGET)
  if o.alone then
    local alone = require("loip.plan.profile").calibrate { store = o.store, threads = c.devices[1].threads, context = o.context }
    local r = run(alone)
    log("priced as if alone: estimated %.0f ms/token, measured %.0f: ratio %.2f", r.estimated_ms, r.measured_ms, r.ratio)
    r.same_tokens = table.concat(r.token_ids, ",") == table.concat(result.token_ids, ",")
    result.alone = r
  end
end)
c:close()
if not ok then error(err, 0) end
os.execute("mkdir -p '" .. o.out:gsub("'", "") .. "'")
json.write_file(o.out .. "/local.json", json.encode(result) .. "\n")
io.stdout:write(json.encode(result), "\n")
