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
-- A cluster's profile is { loip_profile = 1, devices = { profile, ... }, links = { ... } }.
local ffi = require "ffi"
local core = require "loip.core"
local exec = require "loip.runtime.exec"
local files_rt = require "loip.runtime.files"
local memory = require "loip.runtime.memory"
local json = require "loip.tools.json"
local median, quantile = require("loip.tools.bench").median, require("loip.tools.bench").quantile

local M = {}

M.VERSION = 1

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

-- One layer (block 0: its MHA, block 1: its MLP) of config cfg with seeded random weights of
-- dtype in memory, bound to a fresh model, and a session over it: { model, pool, session,
-- hidden, bytes = { mha, mlp }, close }.
local function synthetic_layer(cfg, dtype, threads, max_ctx, max_batch)
  local hf = require "loip.model.hf"
  local store = require "loip.model.store"
  local dt = store.dtypes[dtype] or error("profile: dtype must be F32, BF16 or F16, not " .. tostring(dtype), 0)
  local c = ffi.new("loip_model_config", cfg)
  local tensors, total = {}, 0
  for _, w in ipairs(hf.weight_list(c)) do
    if w[1] == 0 then
      local shape = hf.shape_of(c, w[2])
      local n = 1
      for _, d in ipairs(shape) do n = n * d end
      local bytes = store.align_up(n * dt[2])
      tensors[#tensors + 1] = { kind = w[2], shape = shape, n = n, offset = total, norm = w[3]:match("norm%.weight$") ~= nil,
        block = store.block_of[tonumber(w[2])] }
      total = total + bytes
    end
  end
  local buf, berr = memory.buffer(total)
  if not buf then error("profile: " .. berr, 0) end
  local base = ffi.cast("uint8_t *", memory.buffer_data(buf))
  local m = assert(exec.model_new(c))
  local bytes = { mha = 0, mlp = 0 }
  for i, t in ipairs(tensors) do
    assert(exec.fill_random(base + t.offset, t.n, dt[1], 7, i * 1000003, t.norm and 1 or 0, t.norm and 0 or 0.02))
    local v = ffi.new("loip_tensor")
    v.data, v.dtype, v.ndim = base + t.offset, dt[1], #t.shape
    for k, d in ipairs(t.shape) do v.shape[k - 1] = d end
    assert(exec.model_bind(m, 0, t.kind, v, "profile: bind"))
    bytes[t.block] = (bytes[t.block] or 0) + t.n * dt[2]
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

-- The relative spread of samples: their interquartile range over their median (0: all alike).
-- Robust to one stray sample at either end of five; a busy machine that slows a quarter of
-- them or more shows.
function M.spread(xs)
  local m = median(xs)
  if not m or m <= 0 then return 0 end
  local s = {}
  for i, v in ipairs(xs) do s[i] = v end
  table.sort(s)
  -- quartiles between ranks (of five samples: the 2nd and the 4th)
  local function q(p)
    local at = 1 + p * (#s - 1)
    local lo = math.floor(at)
    return s[lo] + (s[math.min(#s, lo + 1)] - s[lo]) * (at - lo)
  end
  return (q(0.75) - q(0.25)) / m
end

-- A figure measured until it is steady. sample() returns one measurement (ms). A round takes
-- opts.reps samples (5), and goes on until opts.min_ms of them in all (0; at most 200); the round
-- is steady when its spread (M.spread) is at most opts.tolerance (0.25) and its median is within
-- opts.tolerance of the round before (there is none before the first). Rounds go on until one
-- is steady, at most opts.rounds (4); the figure is the median of the steadiest round (least
-- spread). opts.pooled: a figure whose samples vary by nature (compute while the disk streams):
-- a round is steady when its median is within opts.tolerance of the round before, whatever its
-- spread, and the figure is the median of every sample (its spread theirs). When none is
-- steady, opts.warn (default: a line on stderr) is told, naming opts.name and the spread.
-- Returns { ms, spread (of that round), spread_rounds (max/min of the rounds' medians, less 1),
-- samples (in all), rounds, steady }.
function M.steady(sample, opts)
  opts = opts or {}
  local reps, min_ms, tol, most = opts.reps or 5, opts.min_ms or 0, opts.tolerance or 0.25, opts.rounds or 4
  local best, prev, n, meds, out, all = nil, nil, 0, {}, nil, {}
  for r = 1, most do
    local xs, spent = {}, 0
    while #xs < reps or spent < min_ms do
      local dt = sample()
      xs[#xs + 1], spent = dt, spent + dt
      if #xs >= 200 then break end
    end
    n = n + #xs
    for _, x in ipairs(xs) do all[#all + 1] = x end
    local m, s = median(xs), M.spread(xs)
    if opts.pooled then s = prev and 0 or math.huge end
    meds[r] = m
    if not best or s < best.spread then best = { ms = m, spread = s } end
    local agrees = not prev or math.abs(m - prev) <= tol * math.min(m, prev)
    if s <= tol and agrees then
      out = { ms = m, spread = s, steady = true, rounds = r }
      break
    end
    prev = m
  end
  out = out or { ms = best.ms, spread = best.spread, steady = false, rounds = #meds }
  if opts.pooled then out.ms, out.spread = median(all), M.spread(all) end
  local lo, hi = math.huge, 0
  for _, m in ipairs(meds) do lo, hi = math.min(lo, m), math.max(hi, m) end
  out.spread_rounds = lo > 0 and hi / lo - 1 or 0
  out.samples = n
  if not out.steady then
    local msg = string.format("profile: %s did not settle: its samples spread by %.0f%% of their median (tolerance %.0f%%) "
      .. "and its rounds' medians by %.0f%%, over %d rounds of %d samples; the figure kept (%.3f ms) may be far off: "
      .. "measure on a quieter machine", opts.name or "a measurement", 100 * out.spread, 100 * tol, 100 * out.spread_rounds,
      out.rounds, reps, out.ms)
    if opts.warn then opts.warn(msg) else io.stderr:write(msg, "\n") end
  end
  return out
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

-- The sizes of files (a list of paths) and the largest; raises naming one that cannot be opened.
local function file_sizes(files)
  local sizes, biggest = {}, 0
  for i, p in ipairs(files) do
    local f, err = io.open(p, "rb")
    if not f then error("profile: " .. tostring(err), 0) end
    sizes[i] = f:seek("end")
    f:close()
    biggest = math.max(biggest, sizes[i])
  end
  return sizes, biggest
end

-- n io_uring loaders of slots slots of `biggest` bytes each, reading at rate (bytes/s, 0: as fast
-- as it goes): the list, and a function that closes them all; raises (every one closed) when
-- one cannot be made.
local function open_loaders(n, slots, biggest, rate)
  local loader = require "loip.runtime.loader"
  local ls = {}
  local function close_all() for _, l in ipairs(ls) do l:close() end end
  for r = 1, n do
    local l, err = loader.new { slots = slots, slot_bytes = biggest, mode = "auto", rate = rate or 0 }
    if not l then close_all() error("profile: " .. err, 0) end
    ls[r] = l
  end
  return ls, close_all
end

-- Streams reads of files (a list of paths, each read whole, round after round) through
-- `readers` io_uring loaders (1; each its own files of the list, as a cluster's local devices
-- read their blocks at once), each at rate (bytes/s, 0: as fast as it goes), while fn runs;
-- returns what fn returns.
local function while_reading(files, rate, fn, readers)
  local sizes, biggest = file_sizes(files)
  local loaders, close_all = open_loaders(readers or 1, 2, biggest, rate)
  local ls = {}
  for r, l in ipairs(loaders) do ls[r] = { l = l, tag = 0, k = r - 1 } end
  local function submit(x)
    x.k = x.k % #files + 1
    x.tag = x.tag + 1
    assert(x.l:submit((x.tag - 1) % 2 + 1, { { path = files[x.k], offset = 0, length = sizes[x.k] } }, x.tag))
  end
  for _, x in ipairs(ls) do submit(x) submit(x) end
  -- each stream's load `tag` waited for, and its next one submitted
  local function next_loads(tag)
    for _, x in ipairs(ls) do
      local ok, err = x.l:wait(tag)
      if not ok then close_all() error("profile: " .. tostring(err), 0) end
      submit(x)
    end
  end
  -- the streams running before fn starts (a loader's first load waits for its slots to be set
  -- up: pinned, registered), and how long a load takes then: fn should span a few
  next_loads(1)
  local t1 = core.now_ms()
  next_loads(2)
  local load_ms = core.now_ms() - t1
  local out = { pcall(fn, function()
    for _, x in ipairs(ls) do
      for _ in ipairs(x.l:poll(0)) do submit(x) end
    end
  end, load_ms) }
  for _, x in ipairs(ls) do
    while x.l:pending() > 0 do x.l:poll(-1) end
  end
  close_all()
  if not out[1] then error(out[2], 0) end
  return unpack(out, 2)
end

-- The files' pages out of the page cache: a store just sliced (or read) would otherwise be
-- read from memory wherever the loader reads buffered (no io_uring, or O_DIRECT refused).
local function drop_cache(files)
  for _, p in ipairs(files) do files_rt.drop_cache(p) end
end

-- Per reader, the read rate of `readers` loaders reading at once, each its own files of the
-- list (as the local devices of a cluster read their blocks from this machine's one disk):
-- each reads at least `bytes` (whole files, from a cold cache), its loads queued back to back as
-- a device reading ahead queues them, all starting together; bytes/s each, over the time until
-- the last is done (waited for in C: no polling in between).
function M.disk_shared(files, bytes, rate, readers)
  local sizes, biggest = file_sizes(files)
  drop_cache(files)
  local ls, close_all = open_loaders(readers, 1, biggest, rate)
  -- reader r reads files r, r + readers, ... (wrapping) until it has its bytes
  local plans, total = {}, 0
  for r = 1, readers do
    local list, got, k = {}, 0, r
    while got < bytes do
      local j = (k - 1) % #files + 1
      list[#list + 1], got, k = j, got + sizes[j], k + readers
    end
    plans[r], total = list, total + got
  end
  local t0 = core.now_ms()
  for r = 1, readers do
    for n, j in ipairs(plans[r]) do
      local ok, err = ls[r]:submit(1, { { path = files[j], offset = 0, length = sizes[j] } }, n)
      if not ok then close_all() error("profile: " .. tostring(err), 0) end
    end
  end
  for r = 1, readers do
    for n = 1, #plans[r] do
      local ok, err = ls[r]:wait(n)
      if not ok then close_all() error("profile: " .. tostring(err), 0) end
    end
  end
  local ms = core.now_ms() - t0
  close_all()
  return total / readers / ms * 1e3
end

-- Read rate of files through the loader (io_uring, O_DIRECT where the filesystem allows; the
-- files' pages are dropped from the page cache first, so that a buffered read is cold too):
-- bytes/s and a small read's fixed cost in ms, each measured until steady (M.steady: a disk
-- shared with other work varies, and a calibration is kept); `steady` is false when one did not
-- settle (warn was told, as M.steady tells it). bytes: how much to read at most per sample.
-- readers (1): how many read this disk at once (a cluster's local devices): read_bps is then
-- each one's rate with all of them reading (M.disk_shared), read_bps_alone one reader's by itself.
function M.disk(files, bytes, rate, readers, warn)
  local loader = require "loip.runtime.loader"
  local sizes, biggest = file_sizes(files)
  drop_cache(files)
  local l, err = loader.new { slots = 1, slot_bytes = biggest, mode = "auto", rate = rate or 0 }
  if not l then error("profile: " .. err, 0) end
  local tag, k = 0, 0
  -- one read of `length` bytes of the next file (whole when nil), waited for: ms
  local function read_one(length)
    k, tag = k % #files + 1, tag + 1
    local t0 = core.now_ms()
    assert(l:submit(1, { { path = files[k], offset = 0, length = length or sizes[k] } }, tag))
    local ok, werr = l:wait(tag)
    if not ok then l:close() error("profile: " .. tostring(werr), 0) end
    return core.now_ms() - t0, length or sizes[k]
  end
  local small = M.steady(function() drop_cache(files) return (read_one(4096)) end, { reps = 8, rounds = 3, tolerance = 0.5, name = "a small read's time", warn = warn })
  -- a sample: reads of at least `bytes` from a cold cache, as ms per GB
  local read = 0
  local whole = M.steady(function()
    drop_cache(files)
    local ms, got = 0, 0
    repeat
      local dt, n = read_one()
      ms, got = ms + dt, got + n
    until got >= bytes
    read = read + got
    return ms / got * 1e9
  end, { reps = 3, rounds = 3, name = "the disk's read rate", warn = warn })
  local mode = l:mode()
  l:close()
  local out = { read_bps = 1e12 / whole.ms, load_ms = small.ms, bytes = read, loader = mode,
    spread = math.max(small.spread, whole.spread), steady = small.steady and whole.steady }
  -- Loads queued back to back, as a device reads ahead: does letting the next load's reads start
  -- before the current one's have landed (overlap_loads) finish the load a stage waits for sooner?
  -- (On a disk that serves queued reads in parallel, the first load ends later with overlap.)
  local function pairs_of(overlap)
    local lp = loader.new { slots = 2, slot_bytes = biggest, mode = "auto", rate = rate or 0, overlap_loads = overlap }
    if not lp then return nil end
    local firsts, t_all, done = {}, core.now_ms(), 0
    local j = 0
    while done < math.min(bytes, 256 * 1024 * 1024) do
      local a, b = files[j % #files + 1], files[(j + 1) % #files + 1]
      j = j + 2
      local t1 = core.now_ms()
      assert(lp:submit(1, { { path = a, offset = 0, length = sizes[(j - 2) % #files + 1] } }, 2 * j))
      assert(lp:submit(2, { { path = b, offset = 0, length = sizes[(j - 1) % #files + 1] } }, 2 * j + 1))
      assert(lp:wait(2 * j))
      firsts[#firsts + 1] = core.now_ms() - t1
      assert(lp:wait(2 * j + 1))
      done = done + sizes[(j - 2) % #files + 1] + sizes[(j - 1) % #files + 1]
    end
    local total = core.now_ms() - t_all
    lp:close()
    return { first_ms = median(firsts), read_bps = done / total * 1e3 }
  end
  if mode == "uring" then
    local in_order, overlapped = pairs_of(false), pairs_of(true)
    if in_order and overlapped then
      out.in_order, out.overlapped = in_order, overlapped
      -- overlap only when it gets the waited-for load no later and reads faster
      out.overlap_loads = overlapped.first_ms <= in_order.first_ms and overlapped.read_bps > in_order.read_bps * 1.03
    end
  end
  if (readers or 1) > 1 then
    -- (never more than one reader gets alone: tiny files read back to back may beat the one
    -- reader's figure, which waits for each)
    out.readers, out.read_bps_alone = readers, out.read_bps
    local shared = M.steady(function() return 1e12 / M.disk_shared(files, bytes, rate, readers) end,
      { reps = 3, rounds = 2, name = string.format("the disk's read rate with %d readers", readers), warn = warn })
    out.read_bps = math.min(out.read_bps, 1e12 / shared.ms)
    out.spread, out.steady = math.max(out.spread, shared.spread), out.steady and shared.steady
  end
  return out
end

-- One-way time through the transport between two sockets of this process (ipc), ms; and how
-- late a 1 ms sleep wakes, us (median, p90).
function M.transport(rounds)
  local transport = require "loip.runtime.transport"
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

-- Measure this machine. opts: cfg (a Hugging Face config table: the shape whose blocks are
-- timed; layers beyond the first are not made), dtype ("BF16"), threads, batches ({1,2,4,8}),
-- contexts ({64, 256, 1024} up to the shape's positions), reps, disk = { files = {...}, bytes,
-- rate, readers (1: how many read this disk at once, see M.disk; the compute under load is then
-- timed while as many stream) } (nil: not measured), warn (told of a figure that did not
-- settle, see M.steady; default: stderr), quick (batch 1 and one context: a calibration), progress (a
-- function(text) told what is being measured).
function M.measure(opts)
  local hf = require "loip.model.hf"
  local c = hf.parse_config(opts.cfg, "profile shape")
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
  for _, b in ipairs(batches) do
    say(string.format("compute, batch %d", b))
    local name = string.format("the MLP block (batch %d)", b)
    local t = record(timed(block(1, b, 0), reps, 20, name, opts.warn), name)
    local mlp = t.ms
    pr.compute.blocks[#pr.compute.blocks + 1] = { kind = "mlp", batch = b, context = ctxs[1], ms = mlp, spread = t.spread,
      spread_rounds = t.spread_rounds, samples = t.samples, steady = t.steady }
    pr.compute.weight_bps[tostring(b)] = lay.bytes.mlp / mlp * 1e3
    local xs, ys = {}, {}
    for _, x in ipairs(ctxs) do
      name = string.format("the MHA block (batch %d, context %d)", b, x)
      t = record(timed(block(0, b, x - b), reps, 20, name, opts.warn), name)
      local ms = t.ms
      pr.compute.blocks[#pr.compute.blocks + 1] = { kind = "mha", batch = b, context = x, ms = ms, spread = t.spread,
        spread_rounds = t.spread_rounds, samples = t.samples, steady = t.steady }
      xs[#xs + 1], ys[#ys + 1] = x, ms
    end
    local fixed, per = fit(xs, ys)
    pr.compute.attention_ms_per_token[tostring(b)] = per
    pr.compute.mha_fixed_ms[tostring(b)] = math.max(0, fixed - lay.bytes.mha / pr.compute.weight_bps[tostring(b)] * 1e3)
  end
  if opts.disk and opts.disk.files and #opts.disk.files > 0 then
    say("disk")
    local readers = opts.disk.readers or 1
    pr.disk = M.disk(opts.disk.files, opts.disk.bytes or 256 * 1024 * 1024, opts.disk.rate, readers, opts.warn)
    pr.disk.path = opts.disk.files[1]:match("^(.*)/[^/]*$") or "."
    say("compute while the disk streams")
    -- quiet before and after, each figure the median of every sample (a machine whose load
    -- drifts moves both alike), so that the ratio compares like with like
    local function quiet_ms(name) return record(timed(block(1, 1, 0), reps * 2, 60, name, opts.warn, true), name).ms end
    local before = quiet_ms("the MLP block (batch 1) before the disk streams")
    local name = readers > 1 and string.format("the MLP block while %d readers stream", readers) or "the MLP block while the disk streams"
    local loaded = record(while_reading(opts.disk.files, opts.disk.rate, function(keep_busy, load_ms)
      -- (each round spans a load at least: the samples see the streams as they run)
      return timed(function() keep_busy() block(1, 1, 0)() end, reps * 2, math.max(60, load_ms), name, opts.warn, true)
    end, readers), name).ms
    local after = quiet_ms("the MLP block (batch 1) after the disk streamed")
    pr.compute.under_load = math.max(1, loaded / ((before + after) / 2))
  end
  pr.compute.spread = worst
  pr.compute.unsteady = #unsteady > 0 and unsteady or nil
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

-- Where calibrations are kept: $LOIP_CACHE_DIR, else $XDG_CACHE_HOME/loip, else ~/.cache/loip.
function M.cache_dir()
  local d = os.getenv("LOIP_CACHE_DIR")
  if d and d ~= "" then return d end
  local x = os.getenv("XDG_CACHE_HOME")
  if x and x ~= "" then return x .. "/loip" end
  return (os.getenv("HOME") or "/tmp") .. "/.cache/loip"
end

local function sha_hex(s)
  local h = files_rt.sha256()
  files_rt.sha256_update(h, s)
  return (files_rt.sha256_hex(h))
end

-- A calibration: a short profile of this machine for the model a run plans (compute at batch 1
-- and the planned context, the disk through the loader, the transport), measured once and kept
-- in the cache (a few seconds the first time). opts: store (a slice store: its shape, and its
-- block files for the disk) or cfg + dtype (a shape with no weights: the disk is measured on a
-- scratch file in the cache directory), threads, context, fresh (measure again), quiet,
-- readers (1: how many devices of this machine read its disk at once, a local cluster's count:
-- the disk and the compute under load are measured with as many readers, see M.disk).
function M.calibrate(opts)
  local hf = require "loip.model.hf"
  local cfg, dtype, files = opts.cfg, opts.dtype, nil
  if opts.store then
    local store = require "loip.model.store"
    local man = store.read_manifest(opts.store)
    cfg, dtype = man.config, dtype or store.layer_dtype(man)
    local sized = {}
    for _, f in ipairs(man.files) do
      if f.name:match("^layer%-") then sized[#sized + 1] = f end
    end
    table.sort(sized, function(a, b) return a.size > b.size end)
    files = {}
    for j = 1, math.min(#sized, 8) do files[j] = opts.store .. "/" .. sized[j].name end
  end
  local c = hf.parse_config(cfg, "calibration shape")
  local threads = tonumber(opts.threads) or 0
  local pool = exec.pool_new(threads)
  threads = exec.pool_size(pool)
  exec.pool_free(pool)
  local context = math.min(opts.context or 256, c.max_seq)
  -- blocks larger than this are timed on a narrower layer of the same model (rates carry over)
  local cap = 256 * 1024 * 1024
  local shape = require("loip.plan.problem").shape_of(cfg, dtype)
  local measured_cfg = cfg
  if shape.mlp_bytes > cap then
    local f = math.sqrt(shape.mlp_bytes / cap)
    measured_cfg = {}
    for k, v in pairs(cfg) do measured_cfg[k] = v end
    measured_cfg.hidden_size = math.floor(c.dim / f / 64) * 64
    measured_cfg.intermediate_size = math.floor(c.hidden_dim / f / 64) * 64
    measured_cfg.head_dim = c.head_dim
    measured_cfg.num_attention_heads = math.max(1, math.floor(c.n_heads / f))
    measured_cfg.num_key_value_heads = math.max(1, math.min(measured_cfg.num_attention_heads, c.n_kv_heads))
    while measured_cfg.num_attention_heads % measured_cfg.num_key_value_heads ~= 0 do
      measured_cfg.num_key_value_heads = measured_cfg.num_key_value_heads - 1
    end
  end
  local readers = math.max(1, math.floor(tonumber(opts.readers) or 1))
  local key = table.concat({ "v1", io.popen("hostname"):read("*l") or "?", exec.kernels_name(), threads,
    c.dim, c.hidden_dim, c.n_heads, c.n_kv_heads, c.head_dim, tostring(dtype), context,
    opts.store and (io.popen("df -P '" .. opts.store:gsub("'", "") .. "' 2>/dev/null | tail -1 | cut -d' ' -f1"):read("*l") or "?") or "scratch" }, "|")
    .. (readers > 1 and ("|readers " .. readers) or "")
  local dir = M.cache_dir()
  local path = string.format("%s/calibration-%s.json", dir, sha_hex(key):sub(1, 16))
  if not opts.fresh then
    local old = json.exists(path) and json.load(path)
    if old and not M.check(old) then return old, path end
  end
  os.execute("mkdir -p '" .. dir:gsub("'", "") .. "'")
  if not opts.quiet then
    io.stderr:write(string.format("calibrating this machine for %s (a few seconds, once; kept in %s; `loip profile` measures more)\n",
      opts.store or "the shape", path))
  end
  local scratch
  if not files then
    -- a scratch file of 64 MiB for the disk, removed after
    scratch = dir .. "/calibration-disk.tmp"
    local w = files_rt.writer(scratch)
    if w then
      local chunk = ffi.new("uint8_t[?]", 1024 * 1024)
      for _ = 1, 64 do files_rt.write(w, chunk, 1024 * 1024) end
      files_rt.commit(w)
      files_rt.writer_free(w)
      files = { scratch }
    end
  end
  local ok, pr = pcall(M.measure, { cfg = measured_cfg, dtype = dtype, threads = threads, quick = true, context = context,
    disk = files and { files = files, bytes = 64 * 1024 * 1024, readers = readers } or nil })
  if scratch then os.remove(scratch) end
  if not ok then error(pr, 0) end
  pr.calibration = { key = key, context = context }
  M.save(path, pr)
  -- the figures as the cache holds them (JSON keeps 14 significant digits), not as measured: a
  -- plan made now and one made later from the cache, by another process, start from the same
  -- numbers (plans nearly tied went apart on the last digits)
  return json.decode(json.encode_sorted(pr), path) or pr, path
end

-- A full profile of this machine for a slice store's shape: compute at opts.batches and
-- opts.contexts, the disk on its block files (opts.read bytes, through the loader at
-- opts.disk_rate when given), the transport. opts: threads, batches, contexts, read, disk_rate,
-- readers (local devices reading this disk at once, see M.disk), progress.
function M.of_store(dir, opts)
  local store = require "loip.model.store"
  local man = store.read_manifest(dir)
  local files = {}
  for _, f in ipairs(man.files) do
    if f.name:match("^layer%-") then files[#files + 1] = dir .. "/" .. f.name end
  end
  local pr = M.measure { cfg = man.config, dtype = store.layer_dtype(man), threads = opts.threads, batches = opts.batches, contexts = opts.contexts,
    disk = { files = files, bytes = opts.read or 512 * 1024 * 1024, rate = opts.disk_rate, readers = opts.readers },
    progress = opts.progress }
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
