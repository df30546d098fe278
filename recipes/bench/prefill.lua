-- Many rows against the same weights (a prompt's prefill, a verified tree), measured against
-- this machine's own FMA roof, for several CPU kernel variants alternated in one run.
--
--   loip run recipes/bench/prefill.lua [--threads 2] [--kernels amx,avx512] [--prefill 512]
--                                      [--model DIR] [--out DIR] [--quick]
--
-- In one run: the FMA probe (a tight fp32 FMA loop on every thread: the f32 compute roof), the
-- BF16 matmul of prefill x (rows x cols) for the four weight shapes of a llama-3.2-1b layer, and
-- a prefill of --prefill tokens plus decode steps of the synthetic llama-3.2-1b BF16 model (made
-- with `loip synth` on first use). Each measurement runs every variant in turn, repeats that
-- round --repeats times, and reports medians, so that a shared host's drift hits all variants
-- alike; ratios are taken against the first variant listed after the first. Prints one JSON object.
local ffi = require "ffi"
local loip = require "loip"
local core = require "loip.core"
local bench = require "loip.measure.bench"
local flags = require "loip.ui.flags"
local json = require "loip.text.json"
local exec = require "loip.runtime.exec"
local memory = require "loip.runtime.memory"
local K = require "loip.constants"
local synth = require "loip.model.synth"

local spec = {
  name = "prefill.lua", usage = "loip run recipes/bench/prefill.lua [flags]",
  summary = "FMA roof probe, BF16 many-row matmul and synthetic llama-3.2-1b prefill, per kernel variant.",
  flags = {
    { "threads", "int", "threads", default = 2 },
    { "kernels", "string", "CPU kernel variants to alternate, comma-separated (default: the two best this CPU has, e.g. amx,avx512)" },
    { "model", "string", "synthetic model directory (made if missing)", default = bench.MODEL },
    { "out", "string", "where to write prefill.json", default = "bench-out" },
    { "prefill", "int", "prefill length (tokens; also the matmul's rows of activations)", default = 512 },
    { "tokens", "int", "decode steps per decode measurement", default = 8 },
    { "repeats", "int", "rounds of each measurement (medians reported)", default = 5 },
    { "quick", "bool", "small sizes, to check the recipe works" },
  },
}
local o = flags.parse(spec, arg, 1)
if o.quick then o.prefill, o.tokens, o.repeats = 16, 2, 1 end
if not o.kernels then
  local have = {}
  for _, k in ipairs({ "amx", "avx512", "avx2", "ref" }) do
    if #have < 2 and exec.kernels_use(k) then have[#have + 1] = k end
  end
  o.kernels = table.concat(have, ",")
end
local variants = {}
for name in o.kernels:gmatch("[%w_]+") do
  core.must(exec.kernels_use(name, "--kernels " .. name))
  variants[#variants + 1] = name
end
local log, median = bench.log, bench.median
local pool = assert(exec.pool_new(o.threads))
local result = { threads = o.threads, prefill = o.prefill, variants = variants, machine = exec.cpu_info(),
  fma = {}, matmul = {}, model = {} }

-- 1. the FMA roof
local function fma_pass()
  local iters = o.quick and 1e5 or 3e6
  local t0 = core.now_ns()
  local flops = assert(exec.op_fma_probe(pool, iters))
  return flops / ((core.now_ns() - t0) / 1e9) / 1e9
end
fma_pass()
local fs = {}
for r = 1, math.max(3, o.repeats) do fs[r] = fma_pass() end
result.fma.gflops = median(fs)
log("FMA probe, %d thread(s): %.1f GFLOP/s (median of %d)", o.threads, result.fma.gflops, #fs)

-- Runs fn(variant) for every variant per round, o.repeats rounds, each run paired with an FMA
-- probe pass right before it (the host is shared: its speed drifts, which pairing cancels).
-- Per variant: the median seconds, and the median of (work / seconds) / probe when `work`
-- (floating-point operations per run) is given.
local function alternated(fn, work)
  local secs, fracs = {}, {}
  for _, v in ipairs(variants) do secs[v], fracs[v] = {}, {} end
  for r = 1, o.repeats do
    for _, v in ipairs(variants) do
      core.must(exec.kernels_use(v))
      local probe = work and fma_pass()
      local t0 = core.now_ns()
      fn(v)
      secs[v][r] = (core.now_ns() - t0) / 1e9
      if work then fracs[v][r] = work / secs[v][r] / 1e9 / probe end
    end
  end
  local out, frac = {}, {}
  for _, v in ipairs(variants) do out[v], frac[v] = median(secs[v]), work and median(fracs[v]) end
  return out, frac
end

-- 2. the BF16 matmul on a llama-3.2-1b layer's shapes (q/o, k/v, gate/up, down)
local n = o.prefill
local shapes = o.quick and { { 64, 96 } } or { { 2048, 2048 }, { 512, 2048 }, { 8192, 2048 }, { 2048, 8192 } }
for _, shape in ipairs(shapes) do
  local rows, cols = shape[1], shape[2]
  local wbuf = assert(memory.buffer(rows * cols * 2))
  local W = memory.buffer_data(wbuf)
  core.must(exec.fill_random(W, rows * cols, K.BF16, 3, 0, 0, 0.02))
  local X = ffi.new("float[?]", n * cols)
  core.must(exec.fill_random(X, n * cols, K.F32, 4, 0, 0, 1))
  local Y = ffi.new("float[?]", n * rows)
  local function run() core.must(exec.op_matmul(pool, K.BF16, W, X, Y, n, rows, cols)) end
  for _, v in ipairs(variants) do core.must(exec.kernels_use(v)); run() end -- warm
  local secs, frac = alternated(run, 2 * n * rows * cols)
  local key = string.format("%dx%d", rows, cols)
  result.matmul[key] = {}
  for _, v in ipairs(variants) do
    local gf = 2 * n * rows * cols / secs[v] / 1e9
    result.matmul[key][v] = { seconds = secs[v], gflops = gf, of_fma = frac[v] }
    log("matmul bf16 %d x %s, %s: %.1f GFLOP/s, %.2f of the FMA probe run before it (median of pairs)",
      n, key, v, gf, frac[v])
  end
  memory.buffer_free(wbuf)
end

-- 3. prefill and decode of the synthetic llama-3.2-1b
if not json.exists(o.model .. "/config.json") then
  log("making the synthetic model in %s (once)", o.model)
  synth.write(o.model, { like = "llama-3.2-1b", dtype = "bf16", seed = 1 })
end
local m = loip.model.open(o.model, { threads = o.threads, context = n + o.tokens + 8, batch = n })
local s = m:session()
local ids = ffi.new("int32_t[?]", n)
local span = math.min(1000, m.vocab_size - 259) -- past the specials and bytes, within the vocabulary
for i = 1, n do ids[i - 1] = 259 + (i * 37) % span end
local logits = ffi.new("float[?]", m.vocab_size)
local pre = alternated(function()
  core.must(exec.session_forward(s, ids, n, 0, logits, K.LOGITS_LAST))
end)
local dec = alternated(function()
  for k = 0, o.tokens - 1 do
    core.must(exec.session_forward(s, ids + (k % n), 1, n + k, logits, K.LOGITS_LAST))
  end
end)
for _, v in ipairs(variants) do
  result.model[v] = { prefill_tokens_per_s = n / pre[v], decode_ms_per_token = dec[v] * 1e3 / o.tokens }
  log("%s: prefill %d tokens %.1f tokens/s; decode %.1f ms/token", v, n, n / pre[v], dec[v] * 1e3 / o.tokens)
end
if #variants > 1 then
  local a, b = variants[1], variants[2]
  result.ratio = { prefill = result.model[a].prefill_tokens_per_s / result.model[b].prefill_tokens_per_s,
    decode = result.model[b].decode_ms_per_token / result.model[a].decode_ms_per_token }
  log("%s / %s: prefill %.2fx, decode %.2fx (speed ratios)", a, b, result.ratio.prefill, result.ratio.decode)
end
m:close()

os.execute("mkdir -p '" .. o.out .. "'")
local text = json.encode(result)
local f = assert(io.open(o.out .. "/prefill.json", "w"))
f:write(text, "\n")
f:close()
print(text)
