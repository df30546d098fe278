-- Online memory adaptation as the context grows, in one run: a long generation on a
-- heterogeneous 3-device cluster (device 2 computes slower and has memory to spare) whose
-- budgets hold the weights but not, beside a plan made for a short context, the KV cache of the
-- final context. The paper's variants, the same tokens in each (checked):
--   recompute   (a) the baselines' KV handling: no live offloading; KV that overflows a budget
--               is evicted and recomputed in every later step (online policy "recompute")
--   thresholds  (b) the online planner alone: blocks offloaded live at each device's threshold
--   loip        (c) thresholds + the KV transfer protocol: a device at its threshold lends KV to
--               one with room, sized by the link's rate and the idle window
--   static      (optional) the plan made for the final context from the first token
-- Then (b) and (c) again with every link switching between 50 and 250 Mbit/s every 32 tokens
-- (recipes/policies/links/switch.lua). Reports ms/token per window of --window tokens, the adaptations,
-- ratios over the late half; JSON and a plot of ms/token against the token index.
--
--   loip run recipes/bench/online.lua [--tokens 512] [--context 640] [--out DIR] [--quick]
local bench = require "loip.measure.bench"
local cluster = require "loip.cluster"
local core = require "loip.core"
local flags = require "loip.ui.flags"
local json = require "loip.text.json"
local memory = require "loip.runtime.memory"
local plot = require "loip.measure.plot"
local plan_mod = require "loip.plan"
local store = require "loip.model.store"
local synth = require "loip.model.synth"
local progress = require "loip.ui.progress"
local slice_mod = require "loip.model.slice"

local SMALL = "/tmp/loip-bench/online-small"
local spec = {
  name = "online.lua", usage = "loip run recipes/bench/online.lua [flags]",
  summary = "Static plan for the final context vs online adaptation as the KV cache grows.",
  flags = {
    { "store", "string", "slice store to run (made if missing: a small synthetic llama shape)", default = SMALL .. "-store" },
    { "model", "string", "synthetic model the store is sliced from (made if missing)", default = SMALL },
    { "devices", "int", "local devices", default = 3 },
    { "budget", "number", "all budgets together, as a share of the weights (plus the final context's KV cache)", default = 0.7 },
    { "spare", "string", "memory added to each device's budget (device 2: room to hold lent KV)", default = "0,64M,0" },
    { "slowdown", "string", "compute slowdown per device (heterogeneous boards)", default = "1,3,1" },
    { "link-rate", "string", "emulated link rate", default = "1gbit" },
    { "link-delay", "number", "emulated one-way delay, ms", default = 1 },
    { "disk-rate", "bytes", "each device's disk read rate (an SD card / eMMC class board)", default = 300 * 1024 * 1024 },
    { "context", "int", "the run's context (the final KV cache)", default = 640 },
    { "tokens", "int", "tokens generated", default = 512 },
    { "plan-positions", "int", "positions the online variants plan for", default = 64 },
    { "plan-context", "int", alias_of = "plan-positions" },
    { "variants", "string", "variants, in order", default = "recompute,thresholds,loip" },
    { "switch", "string", "also run thresholds and loip with the links switching 50/250 Mbit/s every 32 tokens (no: not)", default = "yes" },
    { "stages", "int", "stages per device (lending keeps one stage's KV home of S)", default = 4 },
    { "window", "int", "tokens per reported window", default = 32 },
    { "out", "string", "where to write online.json and online.svg", default = "bench-out" },
    { "quick", "bool", "64 tokens, context 256: check the recipe works" },
  },
}
local o = flags.parse(spec, arg, 1)
if o.quick then o.tokens, o.context, o.plan_positions, o.window, o.spare = 64, 256, 32, 16, "0,16M,0" end
local log = bench.log

if not store.is_store(o.store) then
  if not json.exists(o.model .. "/config.json") then
    log("making the synthetic model in %s (once)", o.model)
    -- small enough that a long context runs in minutes; layers weigh more than the embedding
    synth.write(o.model, { like = "llama-3.2-1b", dtype = "bf16", seed = 1, layers = 12, dim = 1024,
      ffn = 2816, heads = 16, kv_heads = 8, head_dim = 64, vocab = 8000 })
  end
  log("slicing %s into %s (once)", o.model, o.store)
  slice_mod.write(o.model, o.store)
end
local man = store.read_manifest(o.store)
local cfg = store.config(o.store, man)
local N = o.devices
local sizes = plan_mod.sizes(man, cfg, { context = o.context, batch = 16, threads = 1 })
local mems = bench.budgets(sizes, N, o.budget)
local k = 0
for x in o.spare:gmatch("[^,]+") do
  k = k + 1
  if mems[k] then mems[k] = mems[k] + assert(flags.parse_bytes(x), "--spare: '" .. x .. "' is not a size") end
end
local mem_list = {}
for i, m in ipairs(mems) do mem_list[i] = memory.format_bytes(m) end
log("%d devices, budgets %s (%.0f%% of %.0f MB of weights, with the KV cache of %d positions, plus %s), slowdown %s, links %s + %g ms",
  N, table.concat(mem_list, ", "), 100 * o.budget, sizes.weight_bytes / 1e6, o.context, o.spare, o.slowdown, o.link_rate, o.link_delay)

local slow = {}
for x in o.slowdown:gmatch("[^,]+") do slow[#slow + 1] = tonumber(x) end
local prompt = bench.prompt(cfg.vocab_size)

-- recompute's steps carry the evicted positions: its batch holds the context
local function run(variant, schedule)
  local c = cluster.start_local { store = o.store, devices = N, mem = mems, threads = 1 }
  local res
  local ok, err = pcall(function()
    local popts = { context = o.context, batch = 16, stages = o.stages, disk_rate = o.disk_rate, slowdown = slow,
      link = { rate = o.link_rate, delay_ms = o.link_delay }, link_schedule = schedule }
    if variant ~= "static" then popts.plan_positions, popts.online = o.plan_positions, variant end
    if variant == "recompute" then popts.batch = o.context end
    c:plan(popts)
    local it, st = c:generate(prompt, { max_tokens = o.tokens, sampler = { temperature = 0 }, ignore_eos = true })
    local times, last = {}, nil
    local bar = progress.new(o.tokens, variant .. (schedule and " (links switching)" or "") .. " (tokens)",
      { bytes = false })
    for _ in it do
      local now = core.now_ms()
      if last then times[#times + 1] = now - last end
      last = now
      bar:update(#st.token_ids)
    end
    bar:finish()
    local stats = c:stats()
    local peaks = {}
    for i, s in ipairs(stats) do
      peaks[i] = { peak_bytes = s.peak_bytes, budget_bytes = s.budget_bytes, peak_rss_bytes = s.peak_rss_bytes,
        lent_bytes = s.lent_bytes, fetched_bytes = s.fetched_bytes, lend_wait_ms = s.lend_wait_ms }
    end
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

local results, order = {}, {}
local function summarize(key, r)
  r.windows = {}
  for a = 1, #r.times, o.window do
    local b = math.min(#r.times, a + o.window - 1)
    r.windows[#r.windows + 1] = { first_token = a + 1, ms_per_token = mean(r.times, a, b) }
  end
  local half = math.floor(#r.times / 2)
  r.ms_per_token, r.early_ms, r.late_ms = mean(r.times), mean(r.times, 1, half), mean(r.times, half + 1)
  log("%-22s %.1f ms/token (early half %.1f, late half %.1f), %d live changes", key, r.ms_per_token, r.early_ms, r.late_ms,
    #r.adaptations)
end
for v in o.variants:gmatch("[^,]+") do
  log("%s: planning, loading, generating %d tokens", v, o.tokens)
  results[v] = run(v)
  order[#order + 1] = v
  summarize(v, results[v])
end
if o.switch ~= "no" then
  for _, v in ipairs({ "thresholds", "loip" }) do
    local key = v .. "+switching"
    log("%s: as %s with the links switching between 50 and 250 Mbit/s every 32 tokens", key, v)
    results[key] = run(v, "switch")
    order[#order + 1] = key
    summarize(key, results[key])
  end
end
local first = results[order[1]]
local same = true
for _, v in ipairs(order) do same = same and table.concat(results[v].tokens, ",") == table.concat(first.tokens, ",") end
local function late_ratio(a, b) return results[a] and results[b] and results[a].late_ms / results[b].late_ms or nil end
local result = {
  devices = N, budgets = mems, slowdown = slow, context = o.context, tokens = o.tokens, plan_positions = o.plan_positions,
  link_rate = o.link_rate, link_delay_ms = o.link_delay, disk_rate = o.disk_rate, store = o.store, same_tokens = same,
  late_thresholds_over_recompute = late_ratio("recompute", "thresholds"),
  late_loip_over_thresholds = late_ratio("thresholds", "loip"),
  late_static_over_thresholds = late_ratio("static", "thresholds"),
  variants = {},
}
-- with the links switching: (c)'s slowest window against (b)'s, window by window
local tb, lp = results["thresholds+switching"], results["loip+switching"]
if tb and lp then
  local worst
  for i, w in ipairs(lp.windows) do
    local b = tb.windows[i]
    if b then
      local r = w.ms_per_token / b.ms_per_token
      if not worst or r > worst.ratio then worst = { ratio = r, first_token = w.first_token } end
    end
  end
  result.switching_worst_window = worst
  result.switching_loip_over_thresholds = tb.ms_per_token / lp.ms_per_token
end
for _, v in ipairs(order) do
  local r = results[v]
  result.variants[v] = { ms_per_token = r.ms_per_token, early_ms = r.early_ms, late_ms = r.late_ms, windows = r.windows,
    adaptations = r.adaptations, devices = r.devices }
end
log("late half: thresholds %.2fx recompute, loip %.2fx thresholds; links switching: loip %.2fx thresholds overall, worst window %.3f of thresholds'; same tokens: %s",
  result.late_thresholds_over_recompute or 0, result.late_loip_over_thresholds or 0, result.switching_loip_over_thresholds or 0,
  result.switching_worst_window and result.switching_worst_window.ratio or 0, tostring(same))
os.execute("mkdir -p '" .. o.out .. "'")
local series = {}
local labels = { recompute = "(a) evict and recompute", thresholds = "(b) thresholds", loip = "(c) thresholds + KV lending",
  static = "static (planned for the final context)", ["thresholds+switching"] = "(b) links 50/250 Mbit/s",
  ["loip+switching"] = "(c) links 50/250 Mbit/s" }
for _, v in ipairs(order) do
  local pts = {}
  for _, w in ipairs(results[v].windows) do pts[#pts + 1] = { w.first_token, w.ms_per_token } end
  series[#series + 1] = { label = labels[v] or v, points = pts }
end
result.plot = plot.lines(o.out .. "/online.svg", {
  title = string.format("loip online adaptation: ms/token as the context grows (%d devices, %s links)", N, o.link_rate),
  xlabel = "token index", ylabel = "ms/token (window of " .. o.window .. ")", series = series })
local f = assert(io.open(o.out .. "/online.json", "w"))
f:write(json.encode_sorted(result, 2), "\n")
f:close()
print(json.encode_sorted(result))
