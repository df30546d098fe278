-- Many rows against the same weights (a prompt's prefill, a verified tree), measured against
-- this machine's own FMA roof, for several CPU kernel variants alternated in one run.
--
--   loip run recipes/bench/prefill.lua [--threads 2] [--kernels amx-auto,avx512] [--prefill 512]
--                                      [--amx-rows N|measured] [--model DIR] [--out DIR] [--quick]
--                                      [--llama-bench BIN --gguf FILE [--llama-commit SHA]]
--
-- In one run: the FMA probe (a tight fp32 FMA loop on every thread: the f32 compute roof), the
-- BF16 matmul of prefill x (rows x cols) for the weight shapes of a layer of the model, and
-- a prefill of --prefill tokens plus decode steps of the model (by default the synthetic llama-3.2-1b BF16, made
-- with `loip synth` on first use). Each measurement runs every variant in turn, repeats that
-- round --repeats times, and reports medians, so that a shared host's drift hits all variants
-- alike; ratios are taken against the first variant listed after the first. Prints one JSON object.
--
-- Where AMX is, also the crossover of amx-auto's threshold: the BF16 matmul of a 2048 x 2048
-- layer at 1..64 tokens on amx and on avx512, alternated; `amx_rows.measured` is the fewest tokens
-- from which amx is faster at every count measured (--amx-rows measured runs the rest with it).
-- And where prefill's time goes (`breakdown`, medians over the prefill runs): the linear layers
-- (every matmul dispatch, the last token's logits included), attention over the prompt, and the
-- rest (norms, RoPE, SiLU, KV writes, the embedding), timed inside the forward pass
-- (loip_phase_ns); beside them the layers' matmuls (q, k, v, o, gate, up, down) as timed alone.
-- And `steps`: one forward of 64 and of 256 rows, a tree's verification step at those sizes.
--
-- With --llama-bench (llama.cpp's llama-bench, built from source) and --gguf (the same model as a
-- GGUF: spec/support/to_gguf.lua), the comparison: each round runs `llama-bench -m FILE -p N -n 0
-- -t THREADS -r 1 -o json [--llama-args]` once, then loip's prefill of N tokens once per variant, --repeats
-- rounds; medians and loip / llama.cpp ratios under `llama_cpp` (docs/benchmarks.md has a run).
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
local shell = require "loip.runtime.shell"

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
    { "amx-rows", "string", "amx-auto's threshold of tokens for this run: a number, or 'measured' (the crossover found here)" },
    { "llama-bench", "string", "llama.cpp's llama-bench binary: alternate its prefill with loip's" },
    { "gguf", "string", "the model as a GGUF, for --llama-bench" },
    { "llama-args", "string", "more llama-bench flags, e.g. '-fa 0' (its flash attention is slower on some CPUs)" },
    { "llama-commit", "string", "the llama.cpp commit llama-bench was built from (recorded in the JSON)" },
    { "quick", "bool", "small sizes, to check the recipe works" },
  },
}
local o = flags.parse(spec, arg, 1)
if o.quick then o.prefill, o.tokens, o.repeats = 16, 2, 1 end
if not o.kernels then
  local have = {}
  for _, k in ipairs({ "amx-auto", "avx512", "avx2", "ref" }) do
    if #have < 2 and exec.kernels_use(k) then have[#have + 1] = k end
  end
  o.kernels = table.concat(have, ",")
end
local variants = {}
for name in o.kernels:gmatch("[%w_%-]+") do
  core.must(exec.kernels_use(name, "--kernels " .. name))
  variants[#variants + 1] = name
end
local log, median = bench.log, bench.median
local pool = assert(exec.pool_new(o.threads))
local amx_rows = o.amx_rows
if amx_rows and amx_rows ~= "measured" then
  local r = tonumber(amx_rows)
  if not r or r < 1 or r ~= math.floor(r) then error("--amx-rows: '" .. amx_rows .. "' is neither a whole number >= 1 nor 'measured'", 0) end
  exec.kernels_amx_rows(r)
end
local result = { threads = o.threads, prefill = o.prefill, variants = variants, machine = exec.cpu_info(),
  fma = {}, matmul = {}, model = {}, breakdown = {} }
do
  local f = io.open("/proc/cpuinfo")
  local text = f and f:read("*a") or ""
  if f then f:close() end
  result.machine.model_name = text:match("model name%s*:%s*([^\n]*)")
  local flags = text:match("\nflags%s*:%s*([^\n]*)") or ""
  result.machine.flags = {}
  for _, fl in ipairs({ "avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile" }) do
    if (" " .. flags .. " "):find(" " .. fl .. " ", 1, true) then result.machine.flags[#result.machine.flags + 1] = fl end
  end
end

-- 1. the FMA roof
local function fma_pass()
  local iters = o.quick and 1e5 or 3e6
  local t0 = core.now_ns()
  local flops = assert(exec.op_fma_probe(pool, iters))
  return flops / ((core.now_ns() - t0) / 1e9) / 1e9
end
-- (its vector width follows the variant in use: 256 bits for avx2, as on a CPU without AVX-512)
for _, v in ipairs(variants) do
  core.must(exec.kernels_use(v))
  fma_pass()
  local fs = {}
  for r = 1, math.max(3, o.repeats) do fs[r] = fma_pass() end
  result.fma[v] = { gflops = median(fs) }
  log("FMA probe for %s, %d thread(s): %.1f GFLOP/s (median of %d)", v, o.threads, result.fma[v].gflops, #fs)
end

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

-- 2. the BF16 matmul on the model's layer shapes (q, k/v, o, gate/up, down: llama-3.2-1b's
-- 2048x2048 twice, 512x2048 twice, 8192x2048 twice, 2048x8192), each with its count per layer
local n = o.prefill
if not json.exists(o.model .. "/config.json") then
  log("making the synthetic model in %s (once)", o.model)
  synth.write(o.model, { like = "llama-3.2-1b", dtype = "bf16", seed = 1 })
end
local m = loip.model.open(o.model, { threads = o.threads, context = n + o.tokens + 8, batch = n })
local shapes, per_layer = {}, {}
do
  local c = m.cfg
  local qd, kvd = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
  for _, sh in ipairs({ { qd, c.dim }, { kvd, c.dim }, { kvd, c.dim }, { c.dim, qd }, { c.hidden_dim, c.dim },
      { c.hidden_dim, c.dim }, { c.dim, c.hidden_dim } }) do
    local key = string.format("%dx%d", sh[1], sh[2])
    if not per_layer[key] then shapes[#shapes + 1] = sh end
    per_layer[key] = (per_layer[key] or 0) + 1
  end
end
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

-- 2b. amx-auto's crossover: fewest tokens from which amx's matmul beats avx512's
local function crossover()
  local sweep, dims = {}, o.quick and 64 or 2048
  local wbuf = assert(memory.buffer(dims * dims * 2))
  local W = memory.buffer_data(wbuf)
  core.must(exec.fill_random(W, dims * dims, K.BF16, 5, 0, 0, 0.02))
  local X = ffi.new("float[?]", 64 * dims)
  core.must(exec.fill_random(X, 64 * dims, K.F32, 6, 0, 0, 1))
  local Y = ffi.new("float[?]", 64 * dims)
  local pair = { "amx", "avx512" }
  for _, t in ipairs({ 1, 2, 4, 8, 16, 32, 64 }) do
    local s = { amx = {}, avx512 = {} }
    for r = 1, math.max(3, o.repeats) do
      for _, v in ipairs(pair) do
        core.must(exec.kernels_use(v))
        local t0 = core.now_ns()
        for _ = 1, 4 do core.must(exec.op_matmul(pool, K.BF16, W, X, Y, t, dims, dims)) end
        s[v][r] = (core.now_ns() - t0) / 4e9
      end
    end
    sweep[#sweep + 1] = { tokens = t, amx_s = median(s.amx), avx512_s = median(s.avx512) }
  end
  memory.buffer_free(wbuf)
  local measured
  for i = #sweep, 1, -1 do
    if sweep[i].amx_s < sweep[i].avx512_s then measured = sweep[i].tokens else break end
  end
  return { sweep = sweep, measured = measured, shape = string.format("%dx%d", dims, dims) }
end
if exec.kernels_use("amx") then
  result.amx_rows = crossover()
  if amx_rows == "measured" and result.amx_rows.measured then exec.kernels_amx_rows(result.amx_rows.measured) end
  result.amx_rows.in_force = exec.kernels_amx_rows()
  log("amx-auto: amx beats avx512 from %s tokens on (%s); threshold in force %d",
    tostring(result.amx_rows.measured), result.amx_rows.shape, result.amx_rows.in_force)
end

-- 3. prefill and decode of the synthetic llama-3.2-1b
local s = m:session()
local ids = ffi.new("int32_t[?]", n)
local span = math.min(1000, m.vocab_size - 259) -- past the specials and bytes, within the vocabulary
for i = 1, n do ids[i - 1] = 259 + (i * 37) % span end
local logits = ffi.new("float[?]", m.vocab_size)
local phases = {} -- per variant, per run: seconds in the linear layers, attention, the whole prefill
local pre = alternated(function(v)
  local p0, t0 = exec.phase_seconds(), core.now_ns()
  core.must(exec.session_forward(s, ids, n, 0, logits, K.LOGITS_LAST))
  local p1, secs = exec.phase_seconds(), (core.now_ns() - t0) / 1e9
  phases[v] = phases[v] or { linear = {}, attention = {}, rest = {} }
  local lin, att = p1.linear - p0.linear, p1.attention - p0.attention
  table.insert(phases[v].linear, lin)
  table.insert(phases[v].attention, att)
  table.insert(phases[v].rest, secs - lin - att)
end)
local dec = alternated(function()
  for k = 0, o.tokens - 1 do
    core.must(exec.session_forward(s, ids + (k % n), 1, n + k, logits, K.LOGITS_LAST))
  end
end)
-- a step of r rows against the same weights (a tree of r nodes verified, a chunk of a prompt):
-- its time at 64 and 256 rows (within the prefill's length), for pricing such steps
result.steps = {}
for _, r in ipairs({ 64, 256 }) do
  if r <= n then
    local st = alternated(function() core.must(exec.session_forward(s, ids, r, 0, logits, K.LOGITS_LAST)) end)
    for _, v in ipairs(variants) do
      result.steps[v] = result.steps[v] or {}
      result.steps[v][tostring(r)] = { seconds = st[v], rows_per_s = r / st[v] }
      log("%s: a step of %d rows %.1f ms (%.1f rows/s)", v, r, st[v] * 1e3, r / st[v])
    end
  end
end
for _, v in ipairs(variants) do
  result.model[v] = { prefill_tokens_per_s = n / pre[v], decode_ms_per_token = dec[v] * 1e3 / o.tokens }
  log("%s: prefill %d tokens %.1f tokens/s; decode %.1f ms/token", v, n, n / pre[v], dec[v] * 1e3 / o.tokens)
  -- where the prefill's time went, timed inside it (exec.phase_seconds), and the layers' seven
  -- matmuls at n tokens as timed alone above (on a shared host, another moment's speed)
  local layer = 0
  for key, count in pairs(per_layer) do layer = layer + count * result.matmul[key][v].seconds end
  local ph = phases[v]
  local b = { prefill_s = pre[v], linear_s = median(ph.linear), attention_s = median(ph.attention),
    rest_s = median(ph.rest), matmuls_alone_s = layer * m.n_layers }
  b.linear_share, b.attention_share, b.rest_share = b.linear_s / pre[v], b.attention_s / pre[v], b.rest_s / pre[v]
  result.breakdown[v] = b
  log("%s: of %.2f s, linear layers %.2f s (%.0f%%), attention %.2f s (%.0f%%), the rest (norms, RoPE, SiLU, KV, embedding) %.2f s; "
    .. "the matmuls timed alone %.2f s", v, pre[v], b.linear_s, 100 * b.linear_share, b.attention_s, 100 * b.attention_share,
    b.rest_s, b.matmuls_alone_s)
end

-- 4. llama.cpp's llama-bench on the same model as GGUF, alternated with loip's prefill
local function llama_prefill()
  local extra = {}
  for a in (o.llama_args or ""):gmatch("%S+") do extra[#extra + 1] = shell.quote(a) end
  local cmd = string.format("%s -m %s -p %d -n 0 -t %d -r 1 -o json %s 2>/dev/null", shell.quote(o.llama_bench),
    shell.quote(o.gguf), n, o.threads, table.concat(extra, " "))
  local h = assert(io.popen(cmd))
  local text = h:read("*a")
  h:close()
  local ok, rows = pcall(json.decode, text, "llama-bench's output")
  if not ok or type(rows) ~= "table" or not rows[1] or not rows[1].avg_ts then
    error("--llama-bench: no tokens/s in the output of " .. cmd .. ":\n" .. text:sub(1, 2000), 0)
  end
  return rows[1]
end
if o.llama_bench then
  if not o.gguf then error("--llama-bench needs --gguf (the same model as a GGUF file)", 0) end
  local lc, ours, info = {}, {}, nil
  for _, v in ipairs(variants) do ours[v] = {} end
  for r = 1, o.repeats do
    info = llama_prefill()
    lc[r] = info.avg_ts
    for _, v in ipairs(variants) do
      core.must(exec.kernels_use(v))
      local t0 = core.now_ns()
      core.must(exec.session_forward(s, ids, n, 0, logits, K.LOGITS_LAST))
      ours[v][r] = n / ((core.now_ns() - t0) / 1e9)
    end
    log("round %d: llama.cpp %.1f tokens/s; %s", r, lc[r], table.concat((function()
      local t = {}
      for _, v in ipairs(variants) do t[#t + 1] = string.format("%s %.1f", v, ours[v][r]) end
      return t
    end)(), ", "))
  end
  result.llama_cpp = { gguf = o.gguf, commit = o.llama_commit or info.build_commit, cpu_info = info.cpu_info,
    args = o.llama_args, flash_attn = info.flash_attn,
    type_k = info.type_k, model_type = info.model_type, n_threads = info.n_threads, samples = lc,
    tokens_per_s = median(lc), loip = {}, ratio = {} }
  for _, v in ipairs(variants) do
    result.llama_cpp.loip[v] = { samples = ours[v], tokens_per_s = median(ours[v]) }
    result.llama_cpp.ratio[v] = median(ours[v]) / median(lc)
    log("prefill %d tokens, %d threads: loip %s %.1f tokens/s, llama.cpp %.1f: %.2fx (medians of %d, alternated)",
      n, o.threads, v, median(ours[v]), median(lc), median(ours[v]) / median(lc), o.repeats)
  end
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
