-- Profiles: what a device measures of itself so that planning uses figures, not constants
-- (docs/planning.md, "Profiles"). `loip profile` writes one as JSON; planning reads it with
-- --profile, or measures a short one (a calibration of a few seconds) when none is given.
--
--   local profile = require "loip.plan.profile"
--   local pr = profile.measure{ cfg = c, dtype = "BF16", threads = 1, disk = { files = {...} } }
--   profile.save("me.json", pr)
--   local ms = profile.block_ms(pr, "mlp", 1, 256, shape)   -- one MLP block, batch 1, 256 positions
--
-- A profile (version 1):
--   device   cpus, threads, kernels, mem_total_bytes, mem_available_bytes, host
--   shape    the block shape measured: dim, hidden_dim, n_heads, n_kv_heads, head_dim, dtype,
--            mha_bytes, mlp_bytes (weights of one block)
--   compute  blocks: [{ kind, batch, context, ms, spread, spread_rounds, samples, steady }]
--            measured on that shape (ms: the median of the steadiest round of samples; spread:
--            that round's interquartile range / median; spread_rounds: how far the rounds'
--            medians were apart, max/min - 1; steady: false when no round settled, see
--            M.steady); weight_bps[batch] (weight bytes computed per second, from the MLP);
--            attention_ms_per_token[batch] (per position attended, for the shape's heads);
--            mha_fixed_ms[batch]; under_load (compute time while the loader streams / alone);
--            spread (the largest of the figures'); unsteady (the figures that did not settle,
--            named; absent when all did: a busy machine, the figures may be far off)
--   disk     read_bps (O_DIRECT through the loader, cold: the files' pages dropped first), load_ms
--            (a small read's fixed cost), bytes, path; readers (how many read the disk at once,
--            as the local devices of a cluster on this machine do: read_bps is then each one's
--            rate while all read, read_bps_alone one reader's by itself; absent: one); in_order
--            and overlapped ({ first_ms, read_bps } of loads queued two at a time, without and
--            with overlap_loads) and overlap_loads (whether to overlap them)
--   link     transport_ms (one way through ZeroMQ, send to receipt, between two sockets of one
--            process), timer_late_us (how late a 1 ms sleep wakes, median and p90)
--   kernels  (optional: a full profile on SIMD kernels) prefetch_bytes (the quantized matvec's
--            fastest software prefetch distance measured), prefetch_bps (its rate at each distance
--            tried, bytes/s by distance), variant (the kernels measured), matrix, bytes, rounds
--            (loip.plan.prefetch); a kernels policy chooses the distance from it when a device
--            opens (loip.model.kernels); absent: the kernels' default
-- A cluster's profile is { loip_profile = 1, devices = { profile, ... }, links = { ... } }.
local ffi = require "ffi"
local bit = require "bit"
local core = require "loip.core"
local exec = require "loip.runtime.exec"
local memory = require "loip.runtime.memory"
local json = require "loip.text.json"
local median, quantile = require("loip.measure.stats").median, require("loip.measure.stats").quantile
local steady = require "loip.plan.steady"
local disk = require "loip.plan.disk"
local calibration = require "loip.plan.calibration"
local plan_shape = require "loip.plan.shape"
local hf = require "loip.model.hf"
local store = require "loip.model.store"
local transport = require "loip.runtime.transport"
local prefetch = require "loip.plan.prefetch"

local M = {}

M.VERSION = 1

-- Measured in modules of their own, re-exported here: figures until steady (loip.plan.steady),
-- the disk (loip.plan.disk), the calibration cache (loip.plan.calibration).
M.spread, M.steady = steady.spread, steady.steady
M.disk, M.disk_shared = disk.disk, disk.disk_shared
M.cache_dir = calibration.cache_dir

local function meminfo()
  local f = io.open("/proc/meminfo")
  local t = {}
  if f then
    for l in f:lines() do
      local k, v = l:match("^(%w+):%s+(%d+) kB")
      if k then t[k] = tonumber(v) * 1024 end
    end
    f:close()
  end
  return t.MemTotal, t.MemAvailable
end

local function hostname()
  local f = io.open("/proc/sys/kernel/hostname")
  local h = f and f:read("*l") or "?"
  if f then f:close() end
  return h
end

-- A [R, C] F8_E4M3 matrix of seeded random E4M3 values (no NaN) and scales of 1/64 at dst
-- (store.tensor_bytes' bytes, loip_f8_pack's layout): an FP8 checkpoint's layer, for timing.
local function fill_f8(dst, R, C, seed)
  local buf = memory.buffer(R * C * 4)
  local w = memory.buffer_data(buf)
  assert(exec.fill_random(w, R * C, core.constants.F32, 7, seed, 0, 1))
  assert(exec.gather_elements(w, w, 1, 0, 1, 0, R * C, 4)) -- (byte i from float i's low byte)
  local b = ffi.cast("uint8_t *", w)
  for i = 0, R * C - 1 do b[i] = bit.band(b[i], 0x77) end -- (exponent <= 14: never NaN)
  local sr, sc = math.ceil(R / 128), math.ceil(C / 128)
  local scales = ffi.new("float[?]", sr * sc)
  for i = 0, sr * sc - 1 do scales[i] = 1 / 64 end
  assert(exec.f8_pack(dst, b, scales, R, C, sr, sc, "profile"))
  memory.buffer_free(buf)
end

-- One layer (block 0: its MHA, block 1: its MLP) of config cfg with seeded random weights of
-- dtype (F8_E4M3: its matrices, its vectors BF16 as FP8 checkpoints keep them) in memory, bound to a fresh model, and a session over it: { model, pool, session,
-- hidden, bytes = { mha, mlp }, close }.
local function synthetic_layer(cfg, dtype, threads, max_ctx, max_batch)
  local dt = store.dtypes[dtype] or error("profile: dtype must be F32, BF16 or F16, not " .. tostring(dtype), 0)
  local c = ffi.new("loip_model_config", cfg)
  local tensors, total = {}, 0
  for _, w in ipairs(hf.weight_list(c)) do
    if w[1] == 0 then
      local shape = hf.shape_of(c, w[2])
      local n = 1
      for _, d in ipairs(shape) do n = n * d end
      local tdt = (dtype == "F8_E4M3" and #shape < 2) and "BF16" or dtype
      local nb = store.tensor_bytes(tdt, shape)
      local bytes = store.align_up(nb)
      tensors[#tensors + 1] = { kind = w[2], shape = shape, n = n, offset = total, norm = w[3]:match("norm%.weight$") ~= nil,
        block = store.block_of[tonumber(w[2])], dt = store.dtypes[tdt], nbytes = nb }
      total = total + bytes
    end
  end
  local buf, berr = memory.buffer(total)
  if not buf then error("profile: " .. berr, 0) end
  local base = ffi.cast("uint8_t *", memory.buffer_data(buf))
  local m = assert(exec.model_new(c))
  local bytes = { mha = 0, mlp = 0 }
  for i, t in ipairs(tensors) do
    if t.dt[1] == core.constants.F8_E4M3 then fill_f8(base + t.offset, t.shape[1], t.shape[2], i * 1000003)
    else assert(exec.fill_random(base + t.offset, t.n, t.dt[1], 7, i * 1000003, t.norm and 1 or 0, t.norm and 0 or 0.02)) end
    local v = ffi.new("loip_tensor")
    v.data, v.dtype, v.ndim = base + t.offset, t.dt[1], #t.shape
    for k, d in ipairs(t.shape) do v.shape[k - 1] = d end
    assert(exec.model_bind(m, 0, t.kind, v, "profile: bind"))
    bytes[t.block] = (bytes[t.block] or 0) + t.nbytes
  end
  local pool = assert(exec.pool_new(threads or 0))
  local mask = ffi.new("uint8_t[?]", c.n_layers)
  mask[0] = 1
  local s, err = exec.session_new_layers(m, pool, max_ctx, max_batch, nil, mask)
  if not s then error("profile: " .. err, 0) end
  local hidden = ffi.new("float[?]", max_batch * c.dim)
  for k = 0, max_batch * c.dim - 1 do hidden[k] = ((k * 7919) % 1000) / 1000 - 0.5 end
  return { model = m, pool = pool, session = s, hidden = hidden, bytes = bytes, dim = c.dim, buffer = buf,
    threads = exec.pool_size(pool) }
end

-- fn timed until steady (M.steady, after one warm-up): its result; name says what it is.
local function timed(fn, reps, min_ms, name, warn, pooled)
  fn()
  return M.steady(function()
    local t0 = core.now_ms()
    fn()
    return core.now_ms() - t0
  end, { reps = reps, min_ms = min_ms, name = name, warn = warn, pooled = pooled })
end

-- Least-squares line through (x, y): intercept, slope.
local function fit(xs, ys)
  local n, sx, sy, sxx, sxy = #xs, 0, 0, 0, 0
  for i = 1, n do sx, sy, sxx, sxy = sx + xs[i], sy + ys[i], sxx + xs[i] ^ 2, sxy + xs[i] * ys[i] end
  local d = n * sxx - sx * sx
  if n < 2 or d == 0 then return sy / math.max(n, 1), 0 end
  local slope = (n * sxy - sx * sy) / d
  return (sy - slope * sx) / n, math.max(0, slope)
end

-- One-way time through the transport between two sockets of this process (ipc), ms; and how
-- late a 1 ms sleep wakes, us (median, p90).
function M.transport(rounds)
  local dir = os.tmpname()
  os.remove(dir)
  os.execute("mkdir -p '" .. dir .. "'")
  local net = assert(transport.net { token = "loip-profile" })
  local ok, res = pcall(function()
    local srv = assert(net:bind("ipc://" .. dir .. "/p.sock"))
    local cli = assert(net:connect(srv:endpoint(), "profile"))
    local rtts = {}
    for j = 1, (rounds or 100) + 5 do
      local t0 = core.now_ms()
      assert(cli:send({ kind = "PING" }, 1000))
      local m = srv:recv(1000)
      assert(m, "profile: no ping through the transport")
      assert(srv:send({ to = m.from, kind = "PONG" }, 1000))
      assert(cli:recv(1000), "profile: no pong through the transport")
      if j > 5 then rtts[#rtts + 1] = core.now_ms() - t0 end
    end
    srv:close()
    cli:close()
    return median(rtts) / 2
  end)
  net:close()
  os.execute("rm -rf '" .. dir .. "'")
  if not ok then error(res, 0) end
  local late = {}
  for j = 1, 40 do
    local t0 = core.now_ns()
    core.sleep_ms(1)
    late[j] = (core.now_ns() - t0) / 1e3 - 1000
  end
  return { transport_ms = res, timer_late_us = { median = median(late), p90 = quantile(late, 0.9) } }
end

-- The compute figures of profile pr: per batch, the MLP block's time (and so the weights' rate)
-- and the MHA block's at each context (a line: fixed ms and ms per token of context). block(first,
-- n, pos): a function running two blocks; record(t, name) keeps a figure's spread.
local function measure_compute(pr, lay, batches, ctxs, reps, block, record, say, warn)
  for _, b in ipairs(batches) do
    say(string.format("compute, batch %d", b))
    local name = string.format("the MLP block (batch %d)", b)
    local t = record(timed(block(1, b, 0), reps, 20, name, warn), name)
    local mlp = t.ms
    pr.compute.blocks[#pr.compute.blocks + 1] = { kind = "mlp", batch = b, context = ctxs[1], ms = mlp, spread = t.spread,
      spread_rounds = t.spread_rounds, samples = t.samples, steady = t.steady }
    pr.compute.weight_bps[tostring(b)] = lay.bytes.mlp / mlp * 1e3
    local xs, ys = {}, {}
    for _, x in ipairs(ctxs) do
      name = string.format("the MHA block (batch %d, context %d)", b, x)
      t = record(timed(block(0, b, x - b), reps, 20, name, warn), name)
      local ms = t.ms
      pr.compute.blocks[#pr.compute.blocks + 1] = { kind = "mha", batch = b, context = x, ms = ms, spread = t.spread,
        spread_rounds = t.spread_rounds, samples = t.samples, steady = t.steady }
      xs[#xs + 1], ys[#ys + 1] = x, ms
    end
    local fixed, per = fit(xs, ys)
    pr.compute.attention_ms_per_token[tostring(b)] = per
    pr.compute.mha_fixed_ms[tostring(b)] = math.max(0, fixed - lay.bytes.mha / pr.compute.weight_bps[tostring(b)] * 1e3)
  end
end

-- The disk figures of profile pr (opts.disk: M.measure's), the experts' parallel reads, and
-- compute while the disk streams against compute before and after (pr.compute.under_load).
local function measure_disk(opts, pr, reps, block, record, say)
  say("disk")
  local readers = opts.disk.readers or 1
  pr.disk = M.disk(opts.disk.files, opts.disk.bytes or 256 * 1024 * 1024, opts.disk.rate, readers, opts.warn)
  pr.disk.path = opts.disk.files[1]:match("^(.*)/[^/]*$") or "."
  if opts.disk.experts and #opts.disk.experts > 0 then -- (a mixture of experts: a layer's picks read at once)
    say("the experts' reads")
    pr.disk.expert_bps = disk.parallel(opts.disk.experts, opts.disk.parallel or 8,
      math.min(opts.disk.bytes or 256 * 1024 * 1024, 256 * 1024 * 1024), opts.disk.rate)
    pr.disk.expert_reads_at_once = opts.disk.parallel or 8
  end
  say("compute while the disk streams")
  -- quiet before and after, each figure the median of every sample (a machine whose load
  -- drifts moves both alike), so that the ratio compares like with like
  local function quiet_ms(name) return record(timed(block(1, 1, 0), reps * 2, 60, name, opts.warn, true), name).ms end
  local before = quiet_ms("the MLP block (batch 1) before the disk streams")
  local name = readers > 1 and string.format("the MLP block while %d readers stream", readers) or "the MLP block while the disk streams"
  local loaded = record(disk.while_reading(opts.disk.files, opts.disk.rate, function(keep_busy, load_ms)
    -- (each round spans a load at least: the samples see the streams as they run)
    return timed(function() keep_busy() block(1, 1, 0)() end, reps * 2, math.max(60, load_ms), name, opts.warn, true)
  end, readers), name).ms
  local after = quiet_ms("the MLP block (batch 1) after the disk streamed")
  pr.compute.under_load = math.max(1, loaded / ((before + after) / 2))
end

-- Measure this machine. opts: cfg (a Hugging Face config table: the shape whose blocks are
-- timed; layers beyond the first are not made), dtype ("BF16"), threads, batches ({1,2,4,8}),
-- contexts ({64, 256, 1024} up to the shape's positions), reps, disk = { files = {...}, bytes,
-- rate, readers (1: how many read this disk at once, see M.disk; the compute under load is then
-- timed while as many stream) } (nil: not measured), warn (told of a figure that did not
-- settle, see M.steady; default: stderr), quick (batch 1 and one context: a calibration), progress (a
-- function(text) told what is being measured), prefetch (false: the kernels' prefetch distance is
-- not measured; else loip.plan.prefetch.measure's opts: bytes, distances, rounds; a quick
-- calibration never measures it).
function M.measure(opts)
  -- (a mixture of experts is timed as the dense MLP that does a token's work: loip.plan.shape)
  local c = hf.parse_config(plan_shape.dense_equivalent(opts.cfg), "profile shape")
  local say = opts.progress or function() end
  local batches = opts.quick and { 1 } or (opts.batches or { 1, 2, 4, 8 })
  local max_pos = math.min(c.max_seq, 4096)
  local contexts = opts.contexts or (opts.quick and { math.min(opts.context or 256, max_pos) } or { 64, 256, 1024 })
  local ctxs = {}
  for _, x in ipairs(contexts) do if x <= max_pos then ctxs[#ctxs + 1] = x end end
  if #ctxs == 0 then ctxs = { math.min(64, max_pos) } end
  local max_batch, max_ctx = 1, 0
  for _, b in ipairs(batches) do max_batch = math.max(max_batch, b) end
  for _, x in ipairs(ctxs) do max_ctx = math.max(max_ctx, x) end
  local dtype = (opts.dtype or "BF16"):upper()
  local lay = synthetic_layer(c, dtype, opts.threads, max_ctx + max_batch, max_batch)
  local reps = opts.reps or (opts.quick and 5 or 9)
  local pr = { loip_profile = M.VERSION, created = os.date("!%Y-%m-%dT%H:%M:%SZ"),
    device = { host = hostname(), cpus = M.cpus(), threads = lay.threads,
      kernels = exec.kernels_name() },
    shape = { dim = c.dim, hidden_dim = c.hidden_dim, n_heads = c.n_heads, n_kv_heads = c.n_kv_heads, head_dim = c.head_dim,
      dtype = dtype, mha_bytes = lay.bytes.mha, mlp_bytes = lay.bytes.mlp },
    compute = { blocks = {}, weight_bps = {}, attention_ms_per_token = {}, mha_fixed_ms = {} } }
  pr.device.mem_total_bytes, pr.device.mem_available_bytes = meminfo()
  local s, h = lay.session, lay.hidden
  local function block(first, n, pos)
    return function() assert(exec.session_blocks(s, first, first + 1, h, n, pos)) end
  end
  -- each figure with its spread (M.steady): the profile's compute.spread is the largest, and
  -- compute.unsteady names the figures that did not settle (a busy machine)
  local worst, unsteady = 0, {}
  local function record(t, name)
    worst = math.max(worst, t.spread)
    if not t.steady then unsteady[#unsteady + 1] = name end
    return t
  end
  measure_compute(pr, lay, batches, ctxs, reps, block, record, say, opts.warn)
  if opts.disk and opts.disk.files and #opts.disk.files > 0 then measure_disk(opts, pr, reps, block, record, say) end
  pr.compute.spread = worst
  pr.compute.unsteady = #unsteady > 0 and unsteady or nil
  if not opts.quick and opts.prefetch ~= false then
    say("the quantized kernels' prefetch distance")
    local po = opts.prefetch or {}
    pr.kernels = prefetch.measure { pool = lay.pool, bytes = po.bytes, distances = po.distances, rounds = po.rounds }
  end
  say("transport")
  pr.link = M.transport(opts.quick and 40 or 100)
  exec.session_free(lay.session)
  exec.pool_free(lay.pool)
  exec.model_free(lay.model)
  memory.buffer_free(lay.buffer)
  return pr
end

-- This machine's CPUs (nproc: those this process may run on).
function M.cpus()
  local p = io.popen("nproc")
  local n = p and tonumber(p:read("*l"))
  if p then p:close() end
  return n or 1
end

-- Compute threads of each of n local devices sharing this machine's cpus (default M.cpus()):
-- threads when given (> 0), else the cores split among them, at least one each. One rule for
-- the local cluster's workers (loip.cluster.start_local) and for `loip plan --devices n`, which
-- plans what they run from the same calibration.
function M.split_threads(n, threads, cpus)
  if threads and threads > 0 then return threads end
  return math.max(1, math.floor((cpus or M.cpus()) / math.max(1, n)))
end

-- A calibration of this machine, kept in the cache (loip.plan.calibration.calibrate: opts there),
-- measured with this module's M.measure and kept where M.cache_dir says: pr, its path.
function M.calibrate(opts) return calibration.calibrate(opts, M) end

-- A store's block files a device reads into its slot (paths), and its experts' files (a mixture
-- of experts: the first 64; none otherwise).
function M.store_files(dir, man)
  local files, experts = {}, {}
  for _, f in ipairs(man.files) do
    if f.expert ~= nil then
      if #experts < 64 then experts[#experts + 1] = dir .. "/" .. f.name end
    elseif f.name:match("^layer%-") then
      files[#files + 1] = dir .. "/" .. f.name
    end
  end
  return files, experts
end

-- A full profile of this machine for a slice store's shape: compute at opts.batches and
-- opts.contexts, the disk on its block files (opts.read bytes, through the loader at
-- opts.disk_rate when given), the transport, the kernels' prefetch distance. opts: threads,
-- batches, contexts, read, disk_rate, readers (local devices reading this disk at once, see
-- M.disk), prefetch (M.measure's), progress.
function M.of_store(dir, opts)
  local man = store.read_manifest(dir)
  local files, experts = M.store_files(dir, man)
  local pr = M.measure { cfg = man.config, dtype = store.layer_dtype(man), threads = opts.threads, batches = opts.batches, contexts = opts.contexts,
    disk = { files = files, bytes = opts.read or 512 * 1024 * 1024, rate = opts.disk_rate, readers = opts.readers,
      experts = experts, parallel = man.config.num_experts_per_tok },
    prefetch = opts.prefetch, progress = opts.progress }
  pr.store = dir
  return pr
end

-- The link to the worker at endpoint, measured from this process through net (a transport
-- context holding the cluster's key): pings with no payload and with 512 KiB, one way each.
-- { rate_bps, latency_ms }.
function M.link_to(net, endpoint, identity)
  local sock = assert(net:connect(endpoint, identity))
  local function rtt(bytes, n)
    local payload = string.rep("x", bytes)
    local xs = {}
    for j = 1, n + 1 do
      local t0 = core.now_ms()
      assert(sock:send({ kind = "PING", payload = payload }, 5000))
      local r
      repeat r = sock:recv(5000) until not r or r.kind == "PONG"
      if not r then sock:close() error("profile: no answer from " .. endpoint, 0) end
      if j > 1 then xs[#xs + 1] = core.now_ms() - t0 end
    end
    return median(xs)
  end
  local small = rtt(0, 20)
  local big = rtt(512 * 1024, 5)
  sock:close()
  return { rate_bps = 512 * 1024 / math.max(1e-6, (big - small) / 1e3), latency_ms = small / 2 }
end

-- ms of one block (kind "mha" | "mlp" | "head") of a model of shape `shape` (dim, hidden_dim,
-- n_heads, head_dim, mha_bytes, mlp_bytes, head_bytes) at batch and context, from profile pr:
-- the measured times when the shape is the one measured, else from its rates.
function M.block_ms(pr, kind, batch, context, shape)
  local cp = pr.compute
  local function at(tbl, b)
    -- per-batch figures, linear between the batches measured
    local keys = {}
    for k in pairs(tbl) do keys[#keys + 1] = tonumber(k) end
    table.sort(keys)
    if #keys == 0 then error("profile: no compute figures", 0) end
    if b <= keys[1] then return tbl[tostring(keys[1])] end
    for j = 2, #keys do
      if b <= keys[j] then
        local a, z = keys[j - 1], keys[j]
        local w = (b - a) / (z - a)
        return tbl[tostring(a)] * (1 - w) + tbl[tostring(z)] * w
      end
    end
    return tbl[tostring(keys[#keys])]
  end
  -- past the largest batch measured, a block's time goes on growing as it grew between the two
  -- largest batches measured (with one batch measured: it stays as it was)
  local ks = {}
  for k in pairs(cp.weight_bps) do ks[#ks + 1] = tonumber(k) end
  table.sort(ks)
  local scale = 1
  local most, prev = ks[#ks], ks[#ks - 1]
  if prev and batch > most then
    local t1, t0 = 1 / cp.weight_bps[tostring(most)], 1 / cp.weight_bps[tostring(prev)]
    scale = 1 + math.max(0, (t1 - t0) / (most - prev)) * (batch - most) / t1
  end
  local bps = at(cp.weight_bps, batch)
  if kind == "head" then return shape.head_bytes / at(cp.weight_bps, 1) * 1e3 end
  if kind == "mlp" then return shape.mlp_bytes / bps * 1e3 * scale end
  local ps = pr.shape
  local heads = (shape.n_heads * shape.head_dim) / (ps.n_heads * ps.head_dim)
  return (shape.mha_bytes / bps * 1e3 + at(cp.mha_fixed_ms, batch) + at(cp.attention_ms_per_token, batch) * context * heads) * scale
end

-- A profile's problems as a message naming the field (nil when it is usable).
function M.check(pr, where)
  where = where or "profile"
  local function bad(f, ...) return where .. ": " .. string.format(f, ...) end
  if type(pr) ~= "table" then return bad("not a JSON object") end
  if pr.loip_profile ~= M.VERSION then
    return bad("loip_profile is %s; this loip reads version %d (make one with loip profile)", tostring(pr.loip_profile), M.VERSION)
  end
  if pr.devices then
    if type(pr.devices) ~= "table" or #pr.devices == 0 then return bad("devices must be a non-empty list") end
    for i, d in ipairs(pr.devices) do
      local why = M.check(setmetatable({ loip_profile = M.VERSION }, { __index = d }), where .. " devices[" .. i .. "]")
      if why then return why end
    end
    return nil
  end
  if type(pr.shape) ~= "table" then return bad("shape is missing") end
  for _, k in ipairs({ "n_heads", "head_dim", "mha_bytes", "mlp_bytes" }) do
    if type(pr.shape[k]) ~= "number" or pr.shape[k] <= 0 then return bad("shape.%s must be a positive number", k) end
  end
  local cp = pr.compute
  if type(cp) ~= "table" or type(cp.weight_bps) ~= "table" or next(cp.weight_bps) == nil then
    return bad("compute.weight_bps must give bytes/s per batch, e.g. {\"1\": 2.5e10}")
  end
  for k, v in pairs(cp.weight_bps) do
    if not tonumber(k) or type(v) ~= "number" or v <= 0 then return bad("compute.weight_bps[%s] must be a positive number", tostring(k)) end
  end
  for _, t in ipairs({ "attention_ms_per_token", "mha_fixed_ms" }) do
    if type(cp[t]) ~= "table" then return bad("compute.%s must be a table per batch", t) end
  end
  if cp.under_load ~= nil and (type(cp.under_load) ~= "number" or cp.under_load < 1) then
    return bad("compute.under_load must be a number >= 1")
  end
  if pr.disk ~= nil and (type(pr.disk) ~= "table" or type(pr.disk.read_bps) ~= "number" or pr.disk.read_bps <= 0) then
    return bad("disk.read_bps must be a positive number (bytes/s)")
  end
  local r = pr.disk and pr.disk.readers
  if r ~= nil and (type(r) ~= "number" or r < 1 or r % 1 ~= 0) then
    return bad("disk.readers must be a whole number >= 1 (how many read the disk at once)")
  end
  if cp.spread ~= nil and (type(cp.spread) ~= "number" or cp.spread < 0) then
    return bad("compute.spread must be a number >= 0")
  end
  if pr.kernels ~= nil then return prefetch.check(pr.kernels, where) end
  return nil
end

-- Read a profile (one device's or a cluster's) from a JSON file; raises naming the file.
function M.load(path)
  local pr, err = json.load(path)
  if not pr then error("--profile: " .. tostring(err), 0) end
  local why = M.check(pr, path)
  if why then error(why, 0) end
  return pr
end

-- Write a profile, whole or not at all.
function M.save(path, pr)
  local ok, err = json.write_file(path, json.encode_sorted(pr, 2) .. "\n")
  if not ok then error("profile: " .. tostring(err), 0) end
end

return M
