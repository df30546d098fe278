-- The exact prefix cache (issue 28, docs/prefix-cache.md): time to first token of a request
-- whose 400-token prefix an earlier request computed, against the first request's, on
-- offloading clusters; the same after a restart of the cluster, the prefix read back from every
-- device's disk tier; the tokens checked equal to those without the cache.
--
--   loip run recipes/bench/prefix.lua [--prefix 400] [--synthetic] [--out DIR] [--quick]
--
-- Clusters: stories260K's slice store on --devices local devices with budgets --mem (they
-- offload part of their blocks), and with --synthetic a synthetic llama-3.2-1b BF16 store (made
-- on first use; --synthetic-layers of its 16 layers) on --devices devices whose budgets hold
-- --synthetic-budget of its weights. Requests: the prefix and a tail of --tail tokens, --tokens
-- generated, temperature 0, one at a time (each after the one before has ended on every device),
-- each round after a warm-up request of the same length sharing nothing:
--   first      prefix + tail A: nothing cached (its full prefill)
--   second     prefix + tail B: the prefix's full groups from the devices' memory
--   uncached   prefix + tail B again with the cache off for it: the tokens the second must give
--   restarted  the cluster closed and started again over the same --prompt-cache-dir; prefix +
--              tail C: the prefix from every device's disk tier
-- Target: second and restarted TTFT <= 30% of the first's. Prints JSON, draws an SVG bar chart.
local bench = require "loip.measure.bench"
local cluster = require "loip.cluster"
local flags = require "loip.ui.flags"
local json = require "loip.text.json"
local plot = require "loip.measure.plot"
local store = require "loip.model.store"
local core = require "loip.core"
local plan = require "loip.plan"
local slice_mod = require "loip.model.slice"

local S260_STORE = "/tmp/loip-bench/stories260K-store"
local spec = {
  name = "prefix.lua", usage = "loip run recipes/bench/prefix.lua [flags]",
  summary = "The prefix cache: TTFT of a request sharing a 400-token prefix against the first's, and after a restart.",
  flags = {
    { "store", "string", "the slice store run (made from models/stories260K if missing)", default = S260_STORE },
    { "devices", "int", "local devices", default = 3 },
    { "mem", "string", "each device's budget (stories260K)", default = "1000K,1000K,1000K" },
    { "prefix", "int", "tokens the requests share", default = 400 },
    { "tail", "int", "tokens of each request's own after the prefix", default = 16 },
    { "tokens", "int", "tokens generated per request", default = 8 },
    { "context", "int", "positions per request", default = 512 },
    { "synthetic", "bool", "also the synthetic llama-3.2-1b BF16 store (made on first use: minutes)" },
    { "synthetic-layers", "int", "its layers (16: the whole model)", default = 16 },
    { "synthetic-model", "string", "where the synthetic model is made (its store beside it, -store)",
      default = "/tmp/loip-bench/llama-3.2-1b-l{layers}-bf16" },
    { "synthetic-budget", "number", "the devices' budgets together, as a share of its weights", default = 0.8 },
    { "out", "string", "where to write prefix.json, prefix.svg and the disk tier (cache-*/)", default = "bench-out" },
    { "quick", "bool", "a 96-token prefix, 4 tokens: check the recipe works" },
  },
}
local o = flags.parse(spec, arg, 1)
if o.quick then o.prefix, o.tokens, o.synthetic = 96, 4, false end
local log = bench.log

local src = (require("loip.core").build.source_dir or ".") .. "/models/stories260K"
if not store.is_store(o.store) then
  log("slicing %s into %s (once)", src, o.store)
  slice_mod.write(src, o.store, { quiet = true })
end
os.execute("mkdir -p '" .. o.out .. "'")

-- n token ids of a vocabulary of V from a seed (BOS first): a deterministic text of random ids
local function ids_of(n, V, seed)
  local out, x = { 1 }, seed
  while #out < n do
    x = (x * 1103515245 + 12345) % 2147483648
    out[#out + 1] = 3 + x % (V - 3)
  end
  return out
end

local function with_tail(prefix, tail)
  local out = { unpack(prefix) }
  for _, id in ipairs(tail) do out[#out + 1] = id end
  return out
end

-- a STATS round: every device has handled what came before (the last request's END: its groups
-- held and written to the disk tier), as when requests come apart
local settle

-- one request on batcher b: its TTFT (ms), tokens, cached tokens; then settled
local function ask(b, ids)
  local steps, step_ms, t0 = b.stats.steps, b.stats.step_ms, core.now_ms()
  local r = b:submit { prompt = ids, max_tokens = o.tokens, sampler = { temperature = 0 }, ignore_eos = true }
  local t_admit = core.now_ms() - t0
  r:next()
  local pre_steps, pre_ms = b.stats.steps - steps, b.stats.step_ms - step_ms
  r:wait()
  settle()
  return { ttft_ms = r:timings().ttft_ms, tokens = r.token_ids, cached_tokens = r.cached_tokens, admit_ms = t_admit,
    prefill_steps = pre_steps, prefill_step_ms = pre_ms }
end

local function same(a, b) return table.concat(a, ",") == table.concat(b, ",") end

-- The four requests on one store: a cluster of --devices with budgets mem, then again.
local function measure(name, st, mem, context)
  local dir = o.out .. "/cache-" .. name
  os.execute("rm -rf '" .. dir .. "'")
  local V = store.config(st, store.read_manifest(st)).vocab_size
  local prefix = ids_of(o.prefix, V, 7)
  local tails = { ids_of(o.tail + 1, V, 11), ids_of(o.tail + 1, V, 13), ids_of(o.tail + 1, V, 17) }
  for _, t in ipairs(tails) do table.remove(t, 1) end -- (no BOS mid-prompt)
  local res = { store = st, mem = mem, prefix = o.prefix, tail = o.tail, tokens = o.tokens }
  local function round(k, f)
    local c = cluster.start_local { store = st, devices = o.devices, mem = mem, threads = 1 }
    local ok, err = pcall(function()
      c:plan { context = context, batch = 64, max_batch = 1, kv_tokens = context }
      local b = c:batcher({ prefix_cache = { dir = dir } })
      settle = function() c:stats() end
      -- warm: a prompt of the same length sharing nothing (a fresh cluster's first steps pay
      -- page faults and first reads: measured, they would flatter the cache)
      ask(b, ids_of(o.prefix + o.tail, V, 99 + k))
      f(c, b)
      local peaks = {}
      for i, d in ipairs(c:stats()) do peaks[i] = { peak = d.peak_bytes, budget = d.budget_bytes, within = d.peak_bytes <= d.budget_bytes } end
      res["peaks_" .. k] = peaks
    end)
    c:close()
    if not ok then error(err, 0) end
  end
  round(1, function(_, b)
    res.first = ask(b, with_tail(prefix, tails[1]))
    res.second = ask(b, with_tail(prefix, tails[2]))
    local pc = b.prefix
    b.prefix = nil -- (the cache off for one request: what it gives without it)
    res.uncached = ask(b, with_tail(prefix, tails[2]))
    b.prefix = pc
  end)
  round(2, function(c, b)
    res.restarted = ask(b, with_tail(prefix, tails[3]))
    res.disk = c:cache_stats()
  end)
  round(3, function(_, b) -- the restarted request's tokens without the cache
    b.prefix = nil
    res.restarted_uncached = ask(b, with_tail(prefix, tails[3]))
  end)
  res.second_ratio = res.second.ttft_ms / res.first.ttft_ms
  res.restarted_ratio = res.restarted.ttft_ms / res.first.ttft_ms
  res.same_tokens = same(res.second.tokens, res.uncached.tokens) and same(res.restarted.tokens, res.restarted_uncached.tokens)
  res.within_budgets = true
  for _, k in ipairs({ "peaks_1", "peaks_2", "peaks_3" }) do
    for _, p in ipairs(res[k]) do res.within_budgets = res.within_budgets and p.within end
  end
  log("%s: TTFT first %.1f ms, second %.1f ms (%.0f%%, %d cached), restarted %.1f ms (%.0f%%, %d cached from disk); "
    .. "same tokens: %s; peaks within budgets: %s", name, res.first.ttft_ms, res.second.ttft_ms, 100 * res.second_ratio,
    res.second.cached_tokens, res.restarted.ttft_ms, 100 * res.restarted_ratio, res.restarted.cached_tokens,
    tostring(res.same_tokens), tostring(res.within_budgets))
  return res
end

local result = { devices = o.devices, target_ratio = 0.3 }
local mems = {}
for x in o.mem:gmatch("[^,]+") do mems[#mems + 1] = x end
result.stories260K = measure("stories260K", o.store, mems, o.context)
if o.synthetic then
  local model = o.synthetic_model:gsub("{layers}", tostring(o.synthetic_layers))
  local st = bench.ensure_store(model .. "-store", model, { like = "llama-3.2-1b", dtype = "bf16", seed = 1,
    layers = o.synthetic_layers })
  local man = store.read_manifest(st)
  local sizes = plan.sizes(man, store.config(st, man), { context = o.context, batch = 64, threads = 1,
    max_seqs = 1, kv_tokens = o.context })
  result.synthetic = measure("synthetic-1b", st, bench.budgets(sizes, o.devices, o.synthetic_budget), o.context)
end
result.same_tokens = result.stories260K.same_tokens and (not result.synthetic or result.synthetic.same_tokens)
result.met = result.stories260K.second_ratio <= 0.3 and result.stories260K.restarted_ratio <= 0.3
  and (not result.synthetic or (result.synthetic.second_ratio <= 0.3 and result.synthetic.restarted_ratio <= 0.3))

local bars = {}
for _, k in ipairs({ "stories260K", "synthetic" }) do
  local r = result[k]
  if r then
    bars[#bars + 1] = { k .. ": first (nothing cached)", r.first.ttft_ms }
    bars[#bars + 1] = { k .. ": second (prefix in memory)", r.second.ttft_ms, string.format("%.0f%%", 100 * r.second_ratio) }
    bars[#bars + 1] = { k .. ": after a restart (disk)", r.restarted.ttft_ms, string.format("%.0f%%", 100 * r.restarted_ratio) }
  end
end
result.plot = plot.bars(o.out .. "/prefix.svg", { title = string.format("time to first token with a %d-token shared prefix, "
  .. "%d offloading devices", o.prefix, o.devices), unit = "ms", bars = bars })
local f = assert(io.open(o.out .. "/prefix.json", "w"))
f:write(json.encode(result), "\n")
f:close()
print(json.encode(result))
