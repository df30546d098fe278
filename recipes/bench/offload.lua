-- Decoding with offloaded blocks: ms/token at budgets below the model's size, io_uring loader
-- against the conventional (buffered) one, beside the lower bound
-- max(compute time, offloaded bytes / raw read speed) measured in the same run.
--
--   loip run recipes/bench/offload.lua [--store DIR] [--budgets 1,0.7,0.5,0.3,1.2G]
--                                      [--tokens N] [--threads N] [--out DIR] [--quick]
--
-- A synthetic llama-3.2-1b BF16 slice store (made on first use). A budget is a share of the
-- model's weights (plus what the KV cache and activations need) or a size such as 1.2G. Per
-- budget, --rounds times: the store's block files are read with O_DIRECT and buffered from a
-- cold cache (the raw read speed: the faster, averaged with an O_DIRECT read after the runs),
-- then the plan loip picks for that budget runs with the io_uring loader and with the
-- conventional one (the same plan), each decoding --tokens tokens greedily; ms/token is the
-- median step, ratios are taken within a round and their median reported. Compute time is the
-- all-resident (100%) run's ms/token. As root, each run is a child process in a memory cgroup
-- limited to its budget (plus --slack for the process itself), as a device of that size would
-- be: otherwise the conventional path's buffered reads would be served from this machine's
-- page cache after the first step. Target: io_uring within 1.15x of the bound. Prints one JSON
-- object and draws an SVG bar chart.
local ffi = require "ffi"
local core = require "loip.core"
local bench = require "loip.measure.bench"
local flags = require "loip.ui.flags"
local json = require "loip.text.json"
local plot = require "loip.measure.plot"
local plan = require "loip.plan"
local model = require "loip.model"
local memory = require "loip.runtime.memory"
local store = require "loip.model.store"
local exec = require "loip.runtime.exec"
local files_rt = require "loip.runtime.files"
local memory = require "loip.runtime.memory"
local policy = require "loip.policy"

local spec = {
  name = "offload.lua", usage = "loip run recipes/bench/offload.lua [flags]",
  summary = "ms/token with offloaded blocks (io_uring and conventional loaders) against the disk/compute bound.",
  flags = bench.store_flags("to run", {
    { "budgets", "string", "comma-separated shares of the weights (<= 1) or sizes (1.2G)", default = "1,0.7,0.5,0.3,1.2G" },
    { "tokens", "int", "tokens decoded per run", default = 10, check = function(v) return v >= 2, "must be >= 2" end },
    { "threads", "int", "compute threads (0: all CPUs)", default = 0 },
    { "context", "int", "KV cache positions", default = 512 },
    { "rounds", "int", "measurements per budget (medians are reported)", default = 3 },
    { "slack", "bytes", "memory cgroup limit above the budget, for the process itself", default = 96 * 1024 * 1024 },
    { "out", "string", "where to write offload.json and offload.svg", default = "bench-out" },
    { "child", "string", "(internal) run once: budget,loader,plan file; prints one JSON line" },
    { "quick", "bool", "3 tokens, budgets 1 and 0.5 only: to check the recipe works" },
  }),
}
local o = flags.parse(spec, arg, 1)
if o.quick then o.tokens, o.budgets, o.rounds = 3, "1,0.5", 1 end

local TARGET = 1.15
local log, median = bench.log, bench.median
local sh = bench.sh

bench.ensure_store(o.store, o.model)
local man = store.read_manifest(o.store)

local prompt = bench.prompt(store.config(o.store, man).vocab_size)
-- One run in this process: open the store under mem with plan p (nil: all resident), decode;
-- ms per step.
local function run_here(mem, p, loader)
  local m = model.open(o.store, { mem = mem, plan = p, loader = loader, threads = o.threads, context = o.context,
    tokenizer = false })
  local it, st = m:generate(prompt, { temperature = 0, max_tokens = o.tokens + 2, ignore_eos = true })
  local steps = bench.token_steps(it)
  local out = { ms = median(steps), steps = steps, tokens = st.token_ids, loader = m.loader and m.loader:mode() or "none",
    stats = m:runner_stats() }
  m:close()
  collectgarbage()
  return out
end

if o.child then
  local mem, loader, plan_file = o.child:match("^(%d+),(%a+),(.+)$")
  local out = run_here(tonumber(mem), plan.load(plan_file), loader)
  io.stdout:write(json.encode(out), "\n")
  os.exit(0)
end


local root = sh("id -u") == "0"
local function drop_caches()
  return root and os.execute("sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null") == 0
end
local cold = drop_caches()
if not cold then log("WARM RUN: %s", root and "drop_caches failed" or "not root: the page cache cannot be dropped") end

-- Raw read speed of the block files (GB/s): O_DIRECT and buffered, each from a cold cache;
-- the faster counts.
local files, largest, total = {}, 0, 0
for _, f in ipairs(man.files) do
  if f.name:match("^layer%-") then
    files[#files + 1] = { path = o.store .. "/" .. f.name, size = f.size }
    largest, total = math.max(largest, f.size), total + f.size
  end
end
local buf = assert(memory.buffer(largest))
local base = ffi.cast("uint8_t *", memory.buffer_data(buf))
ffi.fill(base, largest, 1)
local function raw_speed()
  local best = {}
  for _, direct in ipairs({ true, false }) do
    drop_caches()
    local t0 = core.now_ns()
    for _, f in ipairs(files) do core.must(files_rt.read(f.path, 0, f.size, base, direct)) end
    best[#best + 1] = total / ((core.now_ns() - t0) / 1e9)
  end
  return math.max(best[1], best[2]), best[1], best[2]
end

-- One run in a child process, in a memory cgroup of mem + slack bytes when root.
local self_pid = io.open("/proc/self/stat"):read("*l"):match("^(%d+)")
local exe = sh("readlink -f /proc/" .. self_pid .. "/exe")
local recipe = arg[0]
local cgroup = "/sys/fs/cgroup/memory/loip-offload-bench"
local use_cgroup = root and os.execute("mkdir -p " .. cgroup .. " 2>/dev/null") == 0
  and os.execute("test -w " .. cgroup .. "/memory.limit_in_bytes") == 0
if not use_cgroup then log("NOTE: no memory cgroup (needs root and cgroup v1 memory): buffered reads may hit the page cache") end
local plan_file = os.tmpname()
local err_file = plan_file .. ".err" -- the child's stderr
local function run(mem, p, loader)
  drop_caches()
  local f = assert(io.open(plan_file, "w"))
  f:write(plan.to_lua(p))
  f:close()
  local cmd = string.format("'%s' run '%s' --store '%s' --threads %d --context %d --tokens %d --child %d,%s,%s",
    exe, recipe, o.store, o.threads, o.context, o.tokens, mem, loader, plan_file)
  if use_cgroup then
    local lf = assert(io.open(cgroup .. "/memory.limit_in_bytes", "w"))
    lf:write(tostring(mem + o.slack))
    lf:close()
    cmd = string.format("sh -c 'echo $$ > %s/cgroup.procs && exec %s'", cgroup, cmd:gsub("'", "'\\''"))
  end
  local p_ = assert(io.popen(cmd .. " 2>'" .. err_file .. "'"))
  local line = p_:read("*a")
  p_:close()
  local out = json.decode(line:match("([^\n]+)%s*$") or "")
  if type(out) ~= "table" then
    local ef = io.open(err_file)
    error("offload run failed (" .. loader .. ", " .. memory.format_bytes(mem) .. "): " .. (ef and ef:read("*a") or "?"), 0)
  end
  return out
end

-- The all-resident run: compute time per token.
local sizes0
do
  local m = model.open(o.store, { threads = o.threads, context = o.context, tokenizer = false })
  sizes0 = m.plan_sizes
  m:close()
end
local weight_bytes = sizes0.weight_bytes
local session_bytes = sizes0.kv_bytes[sizes0.n_layers] + sizes0.activation_bytes
-- the figures the scheduler plans with: this machine's calibration, the disk as measured below
local problem_mod = require "loip.plan.problem"
local calibration = require("loip.plan.profile").calibrate { store = o.store, threads = o.threads, context = o.context }
log("store %s: %.2f GB of weights, %d blocks; %s", o.store, weight_bytes / 1e9, sizes0.n_blocks, cold and "cold" or "WARM")
local full = run_here(0, nil, "auto")
local compute_ms = full.ms
log("all resident: %.1f ms/token (compute time)", compute_ms)

local results = {}
for item in o.budgets:gmatch("[^,]+") do
  local share = tonumber(item)
  local mem = share and math.floor(share * weight_bytes + session_bytes) or flags.parse_bytes(item)
  if not mem then error("--budgets: '" .. item .. "' is neither a share nor a size", 0) end
  local read_bps = raw_speed()
  -- the plan for this budget, as the conventional loader needs it (its bounce buffer too),
  -- so that both loaders run the same plan
  local p, est = policy.plan(problem_mod.new { model = sizes0,
    shape = problem_mod.shape_of(man.config, store.layer_dtype(man)), n = 1, budgets = { mem },
    profiles = { calibration }, disk_rate = read_bps, in_process = true, loader = "buffered", context = o.context })
  p.estimate = est
  local pm = plan.memory(p, 1, sizes0, { loader = "buffered" })
  local r = { budget = item, mem_bytes = mem, share_of_weights = (mem - session_bytes) / weight_bytes,
    plan = { stages = #p.devices[1].stages, slot_bytes = pm.slot_bytes, offloaded_bytes = pm.offloaded_bytes,
      offloaded_share = pm.offloaded_bytes / weight_bytes, memory_total = pm.total, lua = plan.to_lua(p) },
    compute_ms = compute_ms, estimate_ms = est.ms_per_token, rounds = {} }
  local same = true
  for round = 1, pm.offloaded_bytes == 0 and 1 or o.rounds do
    local rr = {}
    if round > 1 then read_bps = raw_speed() end
    local _, direct_before, buffered_before = raw_speed()
    if pm.offloaded_bytes == 0 then
      rr.uring, rr.buffered = full, full
    else
      rr.uring = run(mem, p, "uring")
      rr.buffered = run(mem, p, "buffered")
    end
    local _, direct_after = raw_speed()
    rr.raw_direct_gbps, rr.raw_buffered_gbps = (direct_before + direct_after) / 2e9, buffered_before / 1e9
    rr.raw_read_gbps = math.max(rr.raw_direct_gbps, rr.raw_buffered_gbps)
    rr.bound_ms = math.max(compute_ms, pm.offloaded_bytes / (rr.raw_read_gbps * 1e9) * 1e3)
    rr.uring_vs_bound = rr.uring.ms / rr.bound_ms
    rr.buffered_vs_bound = rr.buffered.ms / rr.bound_ms
    same = same and table.concat(rr.uring.tokens, ",") == table.concat(full.tokens, ",")
      and table.concat(rr.buffered.tokens, ",") == table.concat(full.tokens, ",")
    log("  round %d: io_uring %.1f ms, conventional %.1f ms, raw read %.2f GB/s, bound %.1f ms",
      round, rr.uring.ms, rr.buffered.ms, rr.raw_read_gbps, rr.bound_ms)
    r.rounds[round] = rr
  end
  local function med(key, sub)
    local xs = {}
    for _, rr in ipairs(r.rounds) do xs[#xs + 1] = sub and rr[key][sub] or rr[key] end
    return median(xs)
  end
  r.uring = { ms = med("uring", "ms") }
  r.buffered = { ms = med("buffered", "ms") }
  r.bound_ms, r.raw_read_gbps = med("bound_ms"), med("raw_read_gbps")
  r.uring_vs_bound, r.buffered_vs_bound = med("uring_vs_bound"), med("buffered_vs_bound")
  r.buffered_slowdown = r.buffered.ms / r.uring.ms
  r.same_tokens = same
  local bound = r.bound_ms
  log("budget %-5s (%s, %.0f%% offloaded, %d stages): io_uring %.1f ms, conventional %.1f ms, bound %.1f ms (%.2fx, %.2fx)%s",
    item, memory.format_bytes(mem), 100 * r.plan.offloaded_share, r.plan.stages, r.uring.ms, r.buffered.ms, bound,
    r.uring_vs_bound, r.buffered_vs_bound, r.same_tokens and "" or " TOKENS DIFFER")
  results[#results + 1] = r
end
memory.buffer_free(buf)
os.remove(plan_file)
os.remove(err_file)
if use_cgroup then os.execute("rmdir " .. cgroup .. " 2>/dev/null") end

local info = exec.cpu_info()
local worst = 0
local same = true
for _, r in ipairs(results) do
  worst = math.max(worst, r.uring_vs_bound)
  same = same and r.same_tokens
end
local result = {
  machine = { cpus = info.cpus, kernel = sh("uname -r"), store_device = sh("findmnt -no SOURCE,FSTYPE -T '" .. o.store .. "'"),
    root = root },
  cache = cold and "cold (page cache dropped before every read measurement and run)" or "warm",
  memory_cgroup = use_cgroup and string.format("each run limited to its budget + %s", memory.format_bytes(o.slack)) or false,
  store = o.store, weight_bytes = weight_bytes, tokens = o.tokens, threads = o.threads, context = o.context,
  compute_ms = compute_ms, budgets = results, target = TARGET, worst_uring_vs_bound = worst,
  meets_target = worst <= TARGET, same_tokens = same,
}
os.execute("mkdir -p '" .. o.out .. "'")
local bars = {}
for _, r in ipairs(results) do
  local label = r.budget .. (tonumber(r.budget) and " of weights" or "")
  bars[#bars + 1] = { label .. ": io_uring", r.uring.ms, string.format("(%.2fx bound)", r.uring_vs_bound), color = "#27ae60" }
  bars[#bars + 1] = { label .. ": conventional", r.buffered.ms, string.format("(%.2fx bound)", r.buffered_vs_bound), color = "#7f8c8d" }
  bars[#bars + 1] = { label .. ": bound", r.bound_ms, nil, color = "#c0392b" }
end
result.plot = plot.bars(o.out .. "/offload.svg", {
  title = string.format("loip offloaded decoding, llama-3.2-1b BF16 (%.2f GB), %s, ms/token (median of %d)",
    weight_bytes / 1e9, cold and "cold" or "warm", o.tokens),
  unit = "ms", bars = bars,
  refs = { { "llama.cpp at 1.2 GB (issue)", 1485 } },
})
local f = assert(io.open(o.out .. "/offload.json", "w"))
f:write(json.encode_sorted(result, 2), "\n")
f:close()
for _, r in ipairs(results) do r.plan.lua = nil end
print(json.encode_sorted(result))
