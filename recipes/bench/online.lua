-- Online memory adaptation as the context grows, in one run: a long generation on a
-- heterogeneous 3-device cluster whose budgets hold the weights but not, beside a resident
-- plan, the KV cache of the final context. Variants (the same tokens, checked):
--   static      the plan made for the final context from the first token (offloading what the
--               last token needs all along)
--   thresholds  the plan made for a short context (--plan-context), the KV cache growing inside
--               each budget, the online policy (--online, the paper's by default) offloading
--               blocks live as each device reaches its threshold
-- Reports ms/token per window of --window tokens for each, the adaptations, and the ratios over
-- the whole generation and over its early and late halves; JSON and a plot of ms/token against
-- the token index. (KV lending and the evict-and-recompute baseline are the variants to come.)
--
--   loip run recipes/bench/online.lua [--tokens 512] [--context 1024] [--budget 0.7] [--out DIR]
local bench = require "loip.tools.bench"
local cluster = require "loip.cluster"
local core = require "loip.core"
local flags = require "loip.tools.flags"
local json = require "loip.tools.json"
local memory = require "loip.runtime.memory"
local plot = require "loip.tools.plot"
local plan_mod = require "loip.plan"
local store = require "loip.model.store"

local SMALL = "/tmp/loip-bench/online-small"
local spec = {
  name = "online.lua", usage = "loip run recipes/bench/online.lua [flags]",
  summary = "Static plan for the final context vs online adaptation as the KV cache grows.",
  flags = {
    { "store", "string", "slice store to run (made if missing: a small synthetic llama shape)", default = SMALL .. "-store" },
    { "model", "string", "synthetic model the store is sliced from (made if missing)", default = SMALL },
    { "devices", "int", "local devices", default = 3 },
    { "budget", "number", "all budgets together, as a share of the weights (plus the final context's KV cache)", default = 0.7 },
    { "slowdown", "string", "compute slowdown per device (heterogeneous boards)", default = "1,1.5,1" },
    { "link-rate", "string", "emulated link rate", default = "100mbit" },
    { "link-delay", "number", "emulated one-way delay, ms", default = 2 },
    { "disk-rate", "bytes", "each device's disk read rate", default = 600 * 1000 * 1000 },
    { "context", "int", "the run's context (the final KV cache)", default = 1024 },
    { "tokens", "int", "tokens generated", default = 512 },
    { "plan-context", "int", "positions the thresholds variant plans for", default = 64 },
    { "online", "string", "its online policy", default = "loip" },
    { "stages", "int", "stages per device (the online policy needs several)", default = 3 },
    { "window", "int", "tokens per reported window", default = 32 },
    { "out", "string", "where to write online.json and online.svg", default = "bench-out" },
    { "quick", "bool", "64 tokens, context 256: check the recipe works" },
  },
}
local o = flags.parse(spec, arg, 1)
if o.quick then o.tokens, o.context, o.plan_context, o.window = 64, 256, 32, 16 end
local log = bench.log

if not store.is_store(o.store) then
  if not json.exists(o.model .. "/config.json") then
    log("making the synthetic model in %s (once)", o.model)
    -- small enough that a long context runs in minutes; layers weigh more than the embedding
    require("loip.model.synth").write(o.model, { like = "llama-3.2-1b", dtype = "bf16", seed = 1, layers = 12, dim = 1024,
      ffn = 2816, heads = 16, kv_heads = 8, head_dim = 64, vocab = 8000 })
  end
  log("slicing %s into %s (once)", o.model, o.store)
  require("loip.model.slice").write(o.model, o.store)
end
local man = store.read_manifest(o.store)
local cfg = store.config(o.store, man)
local N = o.devices
local sizes = plan_mod.sizes(man, cfg, { context = o.context, batch = 16, threads = 1 })
local mems = bench.budgets(sizes, N, o.budget)
local mem_list = {}
for i, m in ipairs(mems) do mem_list[i] = memory.format_bytes(m) end
log("%d devices, budgets %s (%.0f%% of %.0f MB of weights, with the KV cache of %d positions), slowdown %s, links %s + %g ms",
  N, table.concat(mem_list, ", "), 100 * o.budget, sizes.weight_bytes / 1e6, o.context, o.slowdown, o.link_rate, o.link_delay)

local slow = {}
for x in o.slowdown:gmatch("[^,]+") do slow[#slow + 1] = tonumber(x) end
local prompt = bench.PROMPT

local function run(variant)
  local c = cluster.start_local { store = o.store, devices = N, mem = mems, threads = 1 }
  local res
  local ok, err = pcall(function()
    local popts = { context = o.context, batch = 16, stages = o.stages, disk_rate = o.disk_rate, slowdown = slow,
      link = { rate = o.link_rate, delay_ms = o.link_delay } }
    if variant == "thresholds" then popts.kv_plan_tokens, popts.online = o.plan_context, o.online end
    c:plan(popts)
    local it, st = c:generate(prompt, { max_tokens = o.tokens, sampler = { temperature = 0 }, stop = {} })
    local times, last = {}, nil
    local bar = require("loip.tools.progress").new(o.tokens, variant .. " (tokens)", { bytes = false })
    for _ in it do
      local now = core.now_ms()
      if last then times[#times + 1] = now - last end
      last = now
      bar:update(#st.token_ids)
    end
    bar:finish()
    local stats = c:stats()
    local peaks = {}
    for i, s in ipairs(stats) do peaks[i] = { peak_bytes = s.peak_bytes, budget_bytes = s.budget_bytes, peak_rss_bytes = s.peak_rss_bytes } end
    res = { tokens = st.token_ids, times = times, adaptations = c:batcher().adaptations, devices = peaks }
  end)
  c:close()
  if not ok then error(variant .. ": " .. tostring(err), 0) end
  return res
end

local function mean(xs, a, b)
  local s, n = 0, 0
  for i = a or 1, b or #xs do s, n = s + xs[i], n + 1 end
  return n > 0 and s / n or 0
end

local results, order = {}, { "static", "thresholds" }
for _, v in ipairs(order) do
  log("%s: planning, loading, generating %d tokens", v, o.tokens)
  results[v] = run(v)
  local r = results[v]
  r.windows = {}
  for a = 1, #r.times, o.window do
    local b = math.min(#r.times, a + o.window - 1)
    r.windows[#r.windows + 1] = { first_token = a + 1, ms_per_token = mean(r.times, a, b) }
  end
  local half = math.floor(#r.times / 2)
  r.ms_per_token, r.early_ms, r.late_ms = mean(r.times), mean(r.times, 1, half), mean(r.times, half + 1)
  log("%-10s %.1f ms/token (early half %.1f, late half %.1f), %d live changes", v, r.ms_per_token, r.early_ms, r.late_ms,
    #r.adaptations)
end
local same = table.concat(results.static.tokens, ",") == table.concat(results.thresholds.tokens, ",")
local result = {
  devices = N, budgets = mems, slowdown = slow, context = o.context, tokens = o.tokens, plan_context = o.plan_context,
  link_rate = o.link_rate, link_delay_ms = o.link_delay, disk_rate = o.disk_rate, store = o.store, same_tokens = same,
  speedup = results.static.ms_per_token / results.thresholds.ms_per_token,
  speedup_early = results.static.early_ms / results.thresholds.early_ms,
  speedup_late = results.static.late_ms / results.thresholds.late_ms,
  variants = {},
}
for _, v in ipairs(order) do
  local r = results[v]
  result.variants[v] = { ms_per_token = r.ms_per_token, early_ms = r.early_ms, late_ms = r.late_ms, windows = r.windows,
    adaptations = r.adaptations, devices = r.devices }
end
log("thresholds vs static: %.2fx overall, %.2fx early, %.2fx late; same tokens: %s", result.speedup, result.speedup_early,
  result.speedup_late, tostring(same))
os.execute("mkdir -p '" .. o.out .. "'")
local series = {}
for _, v in ipairs(order) do
  local pts = {}
  for _, w in ipairs(results[v].windows) do pts[#pts + 1] = { w.first_token, w.ms_per_token } end
  series[#series + 1] = { label = v == "static" and "static (planned for the final context)" or "thresholds (online " .. o.online .. ")",
    points = pts }
end
result.plot = plot.lines(o.out .. "/online.svg", {
  title = string.format("loip online adaptation: ms/token as the context grows (%d devices, budgets %.0f%% of the weights)",
    N, 100 * o.budget),
  xlabel = "token index", ylabel = "ms/token (window of " .. o.window .. ")", series = series })
local f = assert(io.open(o.out .. "/online.json", "w"))
f:write(json.encode_sorted(result, 2), "\n")
f:close()
print(json.encode_sorted(result))
