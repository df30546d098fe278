-- Decoding speed on one device, measured against this machine's own memory bandwidth.
--
--   loip run recipes/bench/decode.lua [--threads 1,2] [--model DIR] [--out DIR] [--quick]
--
-- In one run: a streaming read probe (the machine's memory read bandwidth), the BF16
-- matrix-vector kernel on 4096x4096 and 8192x2048 weights cycled through more memory than the
-- caches hold, and decoding plus a 128-token prefill of a synthetic llama-3.2-1b BF16 model
-- (made with `loip synth` on first use). Prints one JSON object and draws an SVG bar chart.
local ffi = require "ffi"
local loip = require "loip"
local core = require "loip.core"
local bench = require "loip.measure.bench"
local flags = require "loip.ui.flags"
local json = require "loip.text.json"
local plot = require "loip.measure.plot"
local exec = require "loip.runtime.exec"
local memory = require "loip.runtime.memory"
local K = require "loip.constants"
local synth = require "loip.model.synth"

local spec = {
  name = "decode.lua", usage = "loip run recipes/bench/decode.lua [flags]",
  summary = "Memory-bandwidth probe, BF16 matvec and synthetic llama-3.2-1b decode/prefill.",
  flags = {
    { "threads", "string", "thread counts to measure, comma-separated", default = "1,2" },
    { "model", "string", "synthetic model directory (made if missing)", default = bench.MODEL },
    { "out", "string", "where to write decode.json and decode.svg", default = "bench-out" },
    { "weights-mb", "int", "MB of weights cycled by the matvec benchmark (> caches)", default = 2048 },
    { "tokens", "int", "decode steps per measurement", default = 16 },
    { "prefill", "int", "prefill length", default = 128 },
    { "repeats", "int", "repetitions of each measurement (the median is reported)", default = 5 },
    { "quick", "bool", "small sizes, to check the recipe works" },
  },
}
local o = flags.parse(spec, arg, 1)
if o.quick then
  o.weights_mb, o.tokens, o.prefill, o.repeats = 256, 4, 16, 2
end
local thread_counts = {}
for t in o.threads:gmatch("%d+") do thread_counts[#thread_counts + 1] = tonumber(t) end

local median = bench.median

local function timed(fn, reps)
  local ts = {}
  for r = 1, reps do
    local t0 = core.now_ns()
    fn()
    ts[r] = (core.now_ns() - t0) / 1e9
  end
  return median(ts), ts
end

local log = bench.log

local result = { machine = {}, probe = {}, matvec = {}, decode = {}, prefill = {} }
local info = exec.cpu_info()
result.machine = { cpus = info.cpus, avx512 = info.avx512, avx512_bf16 = info.avx512_bf16, kernels = exec.kernels_name() }

-- One buffer serves the probe and the matvec weights: the same bytes, read the same way.
local bytes = o.weights_mb * 1024 * 1024
local buf = assert(memory.buffer(bytes))
local base = ffi.cast("uint8_t *", memory.buffer_data(buf))
core.must(exec.fill_random(base, bytes / 2, K.BF16, 7, 0, 0, 0.02))

local pools = {}
for _, t in ipairs(thread_counts) do
  pools[t] = assert(exec.pool_new(t))
end

-- Each measurement is paired with a probe pass run right before it, and the ratio is taken per
-- pair: the host is shared, and its bandwidth drifts by 10-20% over seconds, which pairing
-- cancels. Reported: the median of the pair ratios, and the medians of each side.
local sum = ffi.new("double[1]")
local function probe_pass(t)
  local t0 = core.now_ns()
  core.must(exec.op_read_probe(pools[t], base, bytes, 1, sum))
  return bytes / ((core.now_ns() - t0) / 1e9) / 1e9
end

-- run() does one measured unit of work and returns the bytes of weights it streamed.
local function paired(t, run, reps)
  local ratios, gbs, probes, secs = {}, {}, {}, {}
  for r = 1, reps do
    local p = probe_pass(t)
    local t0 = core.now_ns()
    local nbytes = run()
    local sec = (core.now_ns() - t0) / 1e9
    probes[r], secs[r], gbs[r] = p, sec, nbytes / sec / 1e9
    ratios[r] = gbs[r] / p
  end
  return { ratio = median(ratios), gbps = median(gbs), probe_gbps = median(probes), seconds = median(secs),
    ratio_min = math.min(unpack(ratios)), ratio_max = math.max(unpack(ratios)) }
end

for _, t in ipairs(thread_counts) do
  probe_pass(t) -- warm (page faults, TLB)
  local ps = {}
  for r = 1, o.repeats do ps[r] = probe_pass(t) end
  result.probe[tostring(t)] = median(ps)
  log("probe, %d thread(s): %.2f GB/s (median of %d passes over %d MB)", t, median(ps), o.repeats, o.weights_mb)
end

-- 2. BF16 matvec, weights cycled through the whole buffer so that none stays in cache
local x = ffi.new("float[8192]")
local y = ffi.new("float[8192]")
for i = 0, 8191 do x[i] = (i % 7) * 0.1 - 0.3 end
for _, shape in ipairs({ { 4096, 4096 }, { 8192, 2048 } }) do
  local rows, cols = shape[1], shape[2]
  local mbytes = rows * cols * 2
  local count = math.floor(bytes / mbytes)
  for _, t in ipairs(thread_counts) do
    local function pass()
      for i = 0, count - 1 do
        core.must(exec.op_matvec(pools[t], K.BF16, base + i * mbytes, x, y, rows, cols))
      end
      return count * mbytes
    end
    pass()
    local r = paired(t, pass, o.repeats)
    r.us_per_matvec = r.seconds / count * 1e6
    result.matvec[string.format("%dx%d/%d", rows, cols, t)] = r
    log("matvec bf16 %dx%d, %d thread(s): %.2f GB/s, %.1f%% of the probe (pairs: %.0f-%.0f%%)", rows, cols, t,
      r.gbps, 100 * r.ratio, 100 * r.ratio_min, 100 * r.ratio_max)
  end
end

-- 3. decode and prefill of a synthetic llama-3.2-1b
if not json.exists(o.model .. "/config.json") then
  log("making the synthetic model in %s (once)", o.model)
  synth.write(o.model, { like = "llama-3.2-1b", dtype = "bf16", seed = 1 })
end
for _, t in ipairs(thread_counts) do
  local m = loip.model.open(o.model, { threads = t, context = 1024, batch = o.prefill })
  local model_bytes = m.weight_bytes
  local s = m:session()
  local ids = ffi.new("int32_t[?]", o.prefill)
  for i = 1, o.prefill do ids[i - 1] = 259 + (i * 37) % 1000 end
  local logits = ffi.new("float[?]", m.vocab_size)
  -- prefill: the whole prompt in one batch
  local pre = timed(function()
    core.must(exec.session_forward(s, ids, o.prefill, 0, logits, K.LOGITS_LAST))
  end, math.max(2, math.floor(o.repeats / 2)))
  -- decode: o.tokens single-token steps after the prompt per measurement
  local d = paired(t, function()
    for k = 0, o.tokens - 1 do
      core.must(exec.session_forward(s, ids + (k % o.prefill), 1, o.prefill + k, logits, K.LOGITS_LAST))
    end
    return model_bytes * o.tokens
  end, o.repeats)
  d.ms_per_token = d.seconds * 1e3 / o.tokens
  d.model_bytes = model_bytes
  result.decode[tostring(t)] = d
  result.prefill[tostring(t)] = { tokens = o.prefill, seconds = pre, tokens_per_s = o.prefill / pre }
  log("decode, %d thread(s): %.1f ms/token, %.2f GB/s, %.1f%% of the probe (pairs: %.0f-%.0f%%); prefill %d tokens: %.1f tokens/s",
    t, d.ms_per_token, d.gbps, 100 * d.ratio, 100 * d.ratio_min, 100 * d.ratio_max, o.prefill, o.prefill / pre)
  m:close()
end
memory.buffer_free(buf)

-- report
os.execute("mkdir -p '" .. o.out .. "'")
local bars, refs = {}, {}
for _, t in ipairs(thread_counts) do
  local k = tostring(t)
  bars[#bars + 1] = { "read probe, " .. k .. "T", result.probe[k], color = "#7f8c8d" }
  for _, shape in ipairs({ "4096x4096", "8192x2048" }) do
    local r = result.matvec[shape .. "/" .. k]
    bars[#bars + 1] = { "bf16 matvec " .. shape .. ", " .. k .. "T", r.gbps, string.format("(%.0f%% of probe)", 100 * r.ratio) }
  end
  local d = result.decode[k]
  bars[#bars + 1] = { "llama-3.2-1b decode, " .. k .. "T", d.gbps,
    string.format("(%.0f%%, %.1f ms/token)", 100 * d.ratio, d.ms_per_token), color = "#27ae60" }
end
result.plot = plot.bars(o.out .. "/decode.svg", { title = "loip decode: effective weight bandwidth vs the read probe (medians)",
  unit = "GB/s", bars = bars, refs = refs })
local text = json.encode(result)
local f = assert(io.open(o.out .. "/decode.json", "w"))
f:write(text, "\n")
f:close()
print(text)
