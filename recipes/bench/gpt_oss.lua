-- gpt-oss-20b's shape as released (issue 38's acceptance): its experts MXFP4 (17 bytes per 32
-- values), the rest BF16, about 13 GB, decoded from a slice store on one device at --mem (4 GiB:
-- most of it is re-read from disk, only each token's routed experts of an offloaded layer) and on
-- --devices local devices sharing that memory (--ring-mem each to say otherwise): ms/token, the
-- bytes read a token (offloaded blocks' files and routed experts), each device's accounted peak
-- against its budget, the same greedy tokens on both; and the MXFP4 kernel's fraction of the
-- memory read probe, measured by recipes/bench/quant.lua (run as it is, for this CPU's kernels)
-- at the thread count decoding uses.
--
--   loip run recipes/bench/gpt_oss.lua [--mem 4G] [--devices 3] [--ring-mem BYTES] [--tokens 8] [--out DIR] [--quick]
--
-- The model (made on first use, then sliced; delete it after): `loip synth --like gpt-oss-20b`
-- (24 layers, 32 experts of 2880, top-4, vocabulary 201088). --quick: a tiny gpt-oss shape (2
-- layers, dim 256, 8 experts of 256, top-4, vocabulary 512), 3 tokens, the probe at --quick.
-- Prints one JSON object and draws an SVG bar chart of ms/token.
local bench = require "loip.measure.bench"
local cluster = require "loip.cluster"
local flags = require "loip.ui.flags"
local json = require "loip.text.json"
local memory = require "loip.runtime.memory"
local plot = require "loip.measure.plot"
local plan = require "loip.plan"
local model = require "loip.model"
local store = require "loip.model.store"
local core = require "loip.core"
local proc = require "loip.cluster.proc"
local exec = require "loip.runtime.exec"
local experts_mod = require "loip.model.experts"

local spec = {
  name = "gpt_oss.lua", usage = "loip run recipes/bench/gpt_oss.lua [flags]",
  summary = "gpt-oss-20b's shape (MXFP4 experts) from disk on one device and on a local ring; the MXFP4 kernel against the probe.",
  flags = {
    { "store", "string", "the slice store run (made if missing)", default = "/tmp/loip-bench/gpt-oss-20b-store" },
    { "model", "string", "the synthetic model it is sliced from (made if missing)", default = "/tmp/loip-bench/gpt-oss-20b" },
    { "mem", "string", "the one device's memory budget", default = "4G" },
    { "devices", "int", "local devices of the ring (0 or 1: skip the ring)", default = 3 },
    { "ring-mem", "string", "each ring device's budget (default: --mem shared out: the same memory in all)" },
    { "tokens", "int", "decoding steps measured per run (their median)", default = 8 },
    { "context", "int", "KV positions (at most gpt-oss's sliding window of 128 until windows are served)", default = 128 },
    { "threads", "int", "compute threads per device (0: all CPUs)", default = 0 },
    { "probe", "bool", "measure the kernels against the memory probe (recipes/bench/quant.lua)", default = true },
    { "out", "string", "where to write gpt_oss.json and gpt_oss.svg", default = "bench-out" },
    { "quick", "bool", "a tiny gpt-oss shape, 3 tokens: check the recipe works" },
  },
}
local o = flags.parse(spec, arg, 1)
local shape = { like = "gpt-oss-20b", dtype = "bf16", seed = 1 }
if o.quick then
  shape = { like = "gpt-oss-20b", dtype = "bf16", seed = 1, layers = 2, dim = 256, heads = 4, kv_heads = 2, head_dim = 64,
    ffn = 256, experts = 8, experts_per_token = 4, vocab = 512 }
  o.tokens = 3
  if o.store == spec.flags[1].default then o.store, o.model = "/tmp/loip-bench/gpt-oss-quick-store", "/tmp/loip-bench/gpt-oss-quick" end
end
local log, median = bench.log, bench.median

bench.ensure_store(o.store, o.model, shape)
local man = store.read_manifest(o.store)
local cfg = store.config(o.store, man)
local sizes = plan.sizes(man, cfg, { context = o.context, batch = 64 })
local function bytes_flag(name, v) return flags.parse_bytes(v) or error("--" .. name .. ": not a size: " .. tostring(v), 0) end
local mem = bytes_flag("mem", o.mem)
if o.quick and o.mem == "4G" then -- (a tiny model: a budget that still makes it read from disk: a third of its weights, its KV, activations)
  mem = math.floor(sizes.weight_bytes / 3 + sizes.kv_bytes[cfg.n_layers] + sizes.activation_bytes)
end
local ring_mem = o.ring_mem and bytes_flag("ring-mem", o.ring_mem)
  or (o.quick and mem or math.floor(mem / math.max(1, o.devices))) -- (quick: a tiny model's KV and activations need more)
local threads = o.threads > 0 and o.threads or nil
local prompt = bench.prompt(cfg.vocab_size)
log("model: %s, %d layers, %d experts of %s each (top-%d), budget %s", memory.format_bytes(sizes.weight_bytes), cfg.n_layers,
  cfg.n_experts, memory.format_bytes(sizes.moe.expert_bytes), cfg.n_experts_used, memory.format_bytes(mem))

local function one_device()
  local m = model.open(o.store, { mem = mem, threads = threads, context = o.context, tokenizer = false })
  local it, st = m:generate(prompt, { temperature = 0, max_tokens = o.tokens + 2, ignore_eos = true })
  local x0, r0, steps, last = nil, nil, {}, nil
  for _ in it do
    local now = core.now_ms()
    if not r0 then x0, r0 = m.experts and m.experts:stats(), m:runner_stats() end
    if last then steps[#steps + 1] = now - last end
    last = now
  end
  steps[#steps] = nil
  local n = #steps + 1 -- (decoded tokens since the snapshot)
  local rs, x1 = m:runner_stats(), m.experts and m.experts:stats()
  local blocks = (rs.bytes_loaded - r0.bytes_loaded) / n
  local routed = x1 and experts_mod.report(x1, n, x0).bytes_read_per_token or 0
  local ms = median(steps)
  local out = { ms_per_token = ms, tokens_per_s = 1e3 / ms, tokens = st.token_ids, peak_bytes = m.budget:peak(), budget_bytes = mem,
    bytes_read_per_token = blocks + routed, block_bytes_per_token = blocks, expert_bytes_per_token = routed,
    plan = plan.bare(m.plan), weight_bytes = sizes.weight_bytes }
  m:close()
  collectgarbage()
  return out
end

local function ring()
  local c = cluster.start_local { store = o.store, devices = o.devices, mem = ring_mem, threads = threads }
  local out
  local ok, err = pcall(function()
    local used = c:plan { context = o.context, batch = 64 }
    local it = c:generate(prompt, { max_tokens = o.tokens + 2, sampler = { temperature = 0 }, stop = {} })
    local got, before = {}, nil
    local wrapped = function()
      local t = it()
      if t then
        got[#got + 1] = t
        if #got == 1 then before = c:stats() end -- (as decode_figures snapshots: at the first token)
      end
      return t
    end
    local steps, per, after = bench.decode_figures(c, wrapped)
    local n = math.max(1, #got - 1)
    local read = 0
    for i, d in ipairs(after) do
      local b0 = before[i] or {}
      local blocks = ((d.bytes_loaded or 0) - (b0.bytes_loaded or 0)) / n
      local routed = d.experts and ((d.experts.bytes_read or 0) - (b0.experts and b0.experts.bytes_read or 0)) / n or 0
      per[i].peak_bytes, per[i].budget_bytes, per[i].bytes_read_per_token = d.peak_bytes, d.budget_bytes, blocks + routed
      read = read + blocks + routed
    end
    local ms = median(steps)
    out = { ms_per_token = ms, tokens_per_s = 1e3 / ms, devices = per, bytes_read_per_token = read, plan = plan.bare(used),
      tokens = got }
  end)
  c:close()
  if not ok then error(err, 0) end
  return out
end

local result = { model = { bytes = sizes.weight_bytes, layers = cfg.n_layers, experts = cfg.n_experts, top_k = cfg.n_experts_used,
  expert_bytes = sizes.moe.expert_bytes, like = shape.like }, tokens = o.tokens, kernels = exec.kernels_name(),
  note = "a shared machine: compare the figures of one run with each other rather than across runs" }

log("one device at %s", memory.format_bytes(mem))
local one = one_device()
log("  %.1f ms/token, %s read a token, peak %s of %s", one.ms_per_token, memory.format_bytes(one.bytes_read_per_token),
  memory.format_bytes(one.peak_bytes), memory.format_bytes(mem))
result.one_device = one
result.one_device.peak_within_budget = one.peak_bytes <= mem

if o.devices > 1 then
  log("%d devices at %s each", o.devices, memory.format_bytes(ring_mem))
  local r = ring()
  local within = true
  for i, d in ipairs(r.devices) do
    within = within and (d.peak_bytes or 0) <= (d.budget_bytes or math.huge)
    log("  device %d: peak %s of %s, %s read a token", i, memory.format_bytes(d.peak_bytes or 0),
      memory.format_bytes(d.budget_bytes or 0), memory.format_bytes(d.bytes_read_per_token))
  end
  log("  %.1f ms/token, %s read a token", r.ms_per_token, memory.format_bytes(r.bytes_read_per_token))
  r.peaks_within_budget = within
  r.same_tokens = table.concat(r.tokens, ",") == table.concat(one.tokens, ",") -- (greedy: the one device's tokens)
  r.budget_bytes = ring_mem
  result.ring = r
end

-- the kernels against the memory probe: recipes/bench/quant.lua as it is, for this CPU's kernels
-- at the thread count decoding used
if o.probe then
  local t = threads or exec.cpu_info().cpus
  local qout = o.out .. "/quant"
  local here = (arg[0] or ""):match("^(.*)/[^/]*$") or "."
  local cmd = string.format("%s run '%s/quant.lua' --kernels %s --threads %d --out '%s'%s", proc.exe(),
    here, result.kernels, t, qout, o.quick and " --quick" or "")
  log("probe: %s", cmd)
  bench.sh(cmd)
  local text = json.read_file(qout .. "/quant.json")
  local q = text and json.decode(text)
  if type(q) == "table" then
    local key = result.kernels .. "/" .. t
    result.kernels_vs_probe = { probe_gbps = q.probe[tostring(t)], threads = t, kernels = result.kernels,
      mxfp4 = q.fractions.mxfp4 and q.fractions.mxfp4[key], bf16 = q.fractions.bf16 and q.fractions.bf16[key],
      f8 = q.fractions.f8 and q.fractions.f8[key], target = q.target, from = "recipes/bench/quant.lua" }
  else
    result.kernels_vs_probe = { error_message = "recipes/bench/quant.lua failed: " .. cmd }
  end
end

os.execute("mkdir -p '" .. o.out:gsub("'", "") .. "'")
local bars = { { "1 device, " .. memory.format_bytes(mem), one.ms_per_token,
  string.format("(%s read a token)", memory.format_bytes(one.bytes_read_per_token)) } }
if result.ring then
  bars[#bars + 1] = { string.format("%d devices, %s each", o.devices, memory.format_bytes(ring_mem)), result.ring.ms_per_token,
    string.format("(%s read a token)", memory.format_bytes(result.ring.bytes_read_per_token)) }
end
result.plot = plot.bars(o.out .. "/gpt_oss.svg", { title = string.format("gpt-oss-20b's shape (%s, MXFP4 experts) from disk: ms/token",
  memory.format_bytes(sizes.weight_bytes)), bars = bars, unit = "ms/token" })
local f = assert(io.open(o.out .. "/gpt_oss.json", "w"))
f:write(json.encode_sorted(result, 2), "\n")
f:close()
print(json.encode_sorted(result))
