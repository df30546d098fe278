-- The MXFP4 and F8 (E4M3, 128x128 block scales) matrix-vector kernels at decode, measured
-- against this machine's own memory read bandwidth.
--
--   loip run recipes/bench/quant.lua [--threads 2] [--kernels avx512,avx2,ref] [--prefetch 512,1024,2048]
--                                    [--out DIR] [--quick]
--
-- For each kernel variant this CPU has and each thread count: the streaming read probe
-- (loip_op_read_probe, as decode.lua measures it), then matvecs over MXFP4 and F8 matrices of a
-- gpt-oss expert's shape (2880x2880) and of 4096x4096, cycled through more memory than the
-- caches hold; and BF16 matrices of the same shapes, the existing kernels as a yardstick. Each kernel's rate is the bytes it reads (the packed weights, scales included)
-- per second, paired with a probe pass right before it; the report's fractions are the medians
-- of those ratios (the target is >= 0.8). Beside each, the same kernel's rate over the rows that
-- fill half of each thread's L2 (gbps_l2, and l2_ratio against the probe): what the core decodes at with
-- memory out of the way, so a figure under the target tells a kernel paced by its instructions
-- from one paced by memory. --prefetch measures the quantized kernels at each
-- software prefetch distance given (loip_kernels_set_prefetch; a machine's best is a parameter,
-- not a constant in the kernels) and reports each, and the best. Prints one JSON object and
-- draws an SVG bar chart.
local ffi = require "ffi"
local core = require "loip.core"
local bench = require "loip.measure.bench"
local flags = require "loip.ui.flags"
local json = require "loip.text.json"
local plot = require "loip.measure.plot"
local exec = require "loip.runtime.exec"
local memory = require "loip.runtime.memory"
local store = require "loip.model.store"
local K = require "loip.constants"

local spec = {
  name = "quant.lua", usage = "loip run recipes/bench/quant.lua [flags]",
  summary = "MXFP4 and F8 matvec kernels against the memory read probe.",
  flags = {
    { "threads", "string", "thread counts to measure, comma-separated", default = "2" },
    { "kernels", "string", "kernel variants, comma-separated (those this CPU lacks are skipped)",
      default = "avx512,avx2,ref" },
    { "prefetch", "string", "the quantized kernels' prefetch distances to measure (bytes, comma-separated; "
      .. "default: the kernels' own)" },
    { "out", "string", "where to write quant.json and quant.svg", default = "bench-out" },
    { "weights-mb", "int", "MB of weights cycled by each measurement (> caches)", default = 1024 },
    { "repeats", "int", "repetitions of each measurement (the median is reported)", default = 5 },
    { "quick", "bool", "small sizes, to check the recipe works" },
  },
}
local o = flags.parse(spec, arg, 1)
if o.quick then o.weights_mb, o.repeats = 48, 2 end
local function list(s)
  local out = {}
  for w in s:gmatch("[^,%s]+") do out[#out + 1] = w end
  return out
end
local thread_counts = {}
for _, t in ipairs(list(o.threads)) do
  local n = tonumber(t)
  if not n or n < 1 or n ~= math.floor(n) then error("quant.lua: --threads: '" .. t .. "' is not a thread count", 0) end
  thread_counts[#thread_counts + 1] = n
end
local distances = {}
for _, d in ipairs(list(o.prefetch or "")) do
  local n = tonumber(d)
  if not n or n < 0 or n ~= math.floor(n) then error("quant.lua: --prefetch: '" .. d .. "' is not a distance in bytes", 0) end
  distances[#distances + 1] = n
end
local default_prefetch = exec.kernels_prefetch()
if #distances == 0 then distances = { default_prefetch } end
local median, log = bench.median, bench.log
local TARGET = 0.8
local SHAPES = { { 2880, 2880 }, { 4096, 4096 } }
-- (bf16: the existing kernel under the same conditions, the yardstick of a busy host's figures)
local DTYPES = { { "mxfp4", "MXFP4", K.MXFP4 }, { "f8", "F8_E4M3", K.F8_E4M3 }, { "bf16", "BF16", K.BF16 } }

local info = exec.cpu_info()
local chosen = exec.kernels_name()
local result = { machine = { cpus = info.cpus, avx2 = info.avx2, avx512 = info.avx512, kernels = chosen },
  target = TARGET, weights_mb = o.weights_mb, prefetch = distances, probe = {}, kernels = {}, fractions = {},
  prefetch_best = {} }

-- One buffer: the probe reads it, and each dtype's matrices are laid in it back to back.
local bytes = o.weights_mb * 1024 * 1024
local buf = assert(memory.buffer(bytes))
local base = ffi.cast("uint8_t *", memory.buffer_data(buf))
local pools = {}
for _, t in ipairs(thread_counts) do pools[t] = assert(exec.pool_new(t)) end
local x, y = ffi.new("float[4096]"), ffi.new("float[4096]")
for i = 0, 4095 do x[i] = (i % 7) * 0.1 - 0.3 end

-- Weights as a model's look to the kernel: codes from the bytes of normal floats (mostly
-- uniform: E4M3 subnormals included) under moderate scales (MXFP4's E8M0 around 2^-4, F8's 2^-8),
-- so that no scale makes every product subnormal or infinite. F8's NaN codes (S.1111.111), which
-- random bytes hold at 2 in 256 (one in nearly every block) and released checkpoints never, are
-- made the largest finite code but for one a matrix (its row's result is NaN, as it must be).
local function fill(dtype, rows, cols, count, mbytes)
  if dtype == "BF16" then return core.must(exec.fill_random(base, bytes / 2, K.BF16, 11, 0, 0, 0.02)) end
  core.must(exec.fill_random(base, bytes / 4, K.F32, 11, 0, 0, 1))
  for m = 0, count - 1 do
    local w = base + m * mbytes
    if dtype == "MXFP4" then
      for b = 0, rows * cols / 32 - 1 do w[b * 17] = 119 + b % 8 end
    else
      local ns, group = math.ceil(cols / 128), 4 * math.ceil(cols / 128) + 128 * cols
      for g = 0, math.ceil(rows / 128) - 1 do
        local s = ffi.cast("float *", w + g * group)
        for k = 0, ns - 1 do s[k] = 2 ^ -8 * (1 + (g + k) % 5 / 8) end
        local q = w + g * group + 4 * ns
        for i = 0, math.min(128, rows - g * 128) * cols - 1 do
          if bit.band(q[i], 0x7F) == 0x7F then q[i] = q[i] - 1 end
        end
      end
      w[4 * ns + cols + 5] = 0x7F -- (the one NaN code: row 1)
    end
  end
end

-- This core's L2 (Linux's sysfs; 1 MiB where it does not say), for the rates from L2.
local function l2_size()
  local f = io.open("/sys/devices/system/cpu/cpu0/cache/index2/size")
  local text = f and f:read("*l")
  if f then f:close() end
  local n, unit = (text or ""):match("^(%d+)([KM]?)")
  if not n then return 1048576 end
  return tonumber(n) * (unit == "K" and 1024 or unit == "M" and 1048576 or 1)
end
local l2_bytes = l2_size()
result.l2_bytes = l2_bytes

local sum = ffi.new("double[1]")
local function probe_pass(t)
  local t0 = core.now_ns()
  core.must(exec.op_read_probe(pools[t], base, bytes, 1, sum))
  return bytes / ((core.now_ns() - t0) / 1e9) / 1e9
end

-- GB/s of run(), which returns the bytes it read.
local function rate(run)
  local t0 = core.now_ns()
  local nbytes = run()
  return nbytes / ((core.now_ns() - t0) / 1e9) / 1e9
end

-- Each run paired with a probe pass right before it (the host's bandwidth drifts; pairing
-- cancels it): the median of the ratios, and the medians of each side.
local function paired(t, run, reps)
  local ratios, gbs, probes = {}, {}, {}
  for r = 1, reps do
    local p = probe_pass(t)
    local g = rate(run)
    probes[r], gbs[r], ratios[r] = p, g, g / p
  end
  return { ratio = median(ratios), gbps = median(gbs), probe_gbps = median(probes),
    ratio_min = math.min(unpack(ratios)), ratio_max = math.max(unpack(ratios)) }
end

for _, t in ipairs(thread_counts) do
  probe_pass(t) -- warm (page faults, TLB)
  local ps = {}
  for r = 1, o.repeats do ps[r] = probe_pass(t) end
  result.probe[tostring(t)] = median(ps)
  log("probe, %d thread(s): %.2f GB/s", t, median(ps))
end

local variants = {}
for _, name in ipairs(list(o.kernels)) do
  if exec.kernels_use(name) then variants[#variants + 1] = name
  else log("kernels %s: not on this CPU, skipped", name) end
end
for _, d in ipairs(DTYPES) do
  local key, dtype, id = d[1], d[2], d[3]
  for _, shape in ipairs(SHAPES) do
    local rows, cols = shape[1], shape[2]
    local mbytes = assert(store.tensor_bytes(dtype, { rows, cols }))
    mbytes = math.ceil(mbytes / 64) * 64 -- each matrix 64-byte aligned, as the stores align them
    local count = math.floor(bytes / mbytes)
    fill(dtype, rows, cols, count, mbytes)
    for _, v in ipairs(variants) do
      core.must(exec.kernels_use(v))
      for _, t in ipairs(thread_counts) do
        local function pass()
          for i = 0, count - 1 do core.must(exec.op_matvec(pools[t], id, base + i * mbytes, x, y, rows, cols)) end
          return count * mbytes
        end
        -- The same kernel on the rows that fill half of each thread's L2, passed over again and
        -- again: the rate the core decodes at with memory out of the way. Where it is below the
        -- target, no prefetching or memory can bring the kernel there on this CPU. (Rows in
        -- F8's groups of 128; each call long enough that the pool's start and join do not count.)
        local row_bytes = mbytes / rows
        local rows_l2 = math.min(rows, math.max(128, math.floor(t * l2_bytes / 2 / row_bytes / 128) * 128))
        local l2_reps = math.max(1, math.ceil((o.quick and 8 or 64) * 1048576 / (rows_l2 * row_bytes)))
        local function pass_l2()
          for _ = 1, l2_reps do core.must(exec.op_matvec(pools[t], id, base, x, y, rows_l2, cols)) end
          return l2_reps * rows_l2 * row_bytes
        end
        pass_l2()
        local l2 = {}
        for r = 1, o.repeats do l2[r] = rate(pass_l2) end
        local gbps_l2 = median(l2)
        local best
        -- (bf16's kernels have no such parameter: measured once)
        for di, dist in ipairs(dtype == "BF16" and { default_prefetch } or distances) do
          core.must(exec.kernels_set_prefetch(dist))
          pass()
          local r = paired(t, pass, o.repeats)
          r.us_per_matvec = 1e6 * count * mbytes / (r.gbps * 1e9) / count
          r.prefetch = dist
          r.gbps_l2, r.l2_ratio = gbps_l2, gbps_l2 / result.probe[tostring(t)]
          local name = string.format("%s %dx%d %s %dT", key, rows, cols, v, t)
          if #distances > 1 and dtype ~= "BF16" then name = name .. " pf" .. dist end
          result.kernels[name] = r
          log("%s: %.2f GB/s, %.1f%% of the probe (pairs %.0f-%.0f%%); from L2 %.2f GB/s, %.0f%%",
            name, r.gbps, 100 * r.ratio, 100 * r.ratio_min, 100 * r.ratio_max, r.gbps_l2, 100 * r.l2_ratio)
          if not best or r.ratio > best.ratio then best = r end
        end
        core.must(exec.kernels_set_prefetch(default_prefetch))
        local f = result.fractions
        f[key] = f[key] or {}
        local k = v .. "/" .. t
        f[key][k] = math.min(f[key][k] or math.huge, best.ratio) -- the worse shape, at its best distance
        if dtype ~= "BF16" then
          local pb = result.prefetch_best
          pb[key] = pb[key] or {}
          pb[key][k .. " " .. rows .. "x" .. cols] = best.prefetch
        end
      end
    end
  end
end
core.must(exec.kernels_use(chosen))
memory.buffer_free(buf)
for _, t in ipairs(thread_counts) do exec.pool_free(pools[t]) end

-- met: every SIMD variant of the quantized kernels at the target on every shape (the reference
-- is for correctness; bf16 is the yardstick)
local met = true
for dt, per in pairs(result.fractions) do
  for k, f in pairs(per) do if dt ~= "bf16" and not k:match("^ref/") and f < TARGET then met = false end end
end
result.met = met

os.execute("mkdir -p '" .. o.out .. "'")
local bars = {}
for _, t in ipairs(thread_counts) do
  bars[#bars + 1] = { "read probe, " .. t .. "T", result.probe[tostring(t)], color = "#7f8c8d" }
  for _, d in ipairs(DTYPES) do
    for _, shape in ipairs(SHAPES) do
      for _, v in ipairs(variants) do
        local name = string.format("%s %dx%d %s %dT", d[1], shape[1], shape[2], v, t)
        for _, dist in ipairs(d[2] == "BF16" and { false } or distances) do
          local n = name .. ((dist and #distances > 1) and (" pf" .. dist) or "")
          local r = result.kernels[n]
          bars[#bars + 1] = { n, r.gbps, string.format("(%.0f%% of probe)", 100 * r.ratio),
            color = v == "ref" and "#bdc3c7" or nil }
        end
      end
    end
  end
end
result.plot = plot.bars(o.out .. "/quant.svg", { title = "MXFP4 and F8 matvec: bytes read per second vs the read probe (medians)",
  unit = "GB/s", bars = bars })
local text = json.encode(result)
local f = assert(io.open(o.out .. "/quant.json", "w"))
f:write(text, "\n")
f:close()
print(text)
