-- The disk's figures in a profile (docs/planning.md, "Profiles and calibrations"): its cold read
-- rate through the loader (io_uring, O_DIRECT where the filesystem allows, the files' pages
-- dropped first), a small read's fixed cost, loads queued two at a time with and without overlap,
-- the rate each of several readers gets when they read this disk at once (a local cluster's
-- devices), and a stream of reads to time compute under (the profile's `under_load`).
-- loip.plan.profile measures with these and re-exports disk and disk_shared.
--
--   local disk = require "loip.plan.disk"
--   local d = disk.disk({ "store/layer-000.bin", ... }, 256 * 1024 * 1024, 0, 1)   -- d.read_bps, d.load_ms
local core = require "loip.core"
local files_rt = require "loip.runtime.files"
local median = require("loip.measure.stats").median
local steady = require "loip.plan.steady"
local loader = require "loip.runtime.loader"

local M = {}

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
-- returns what fn returns. fn(keep_busy, load_ms): keep_busy() queues the next loads of the
-- streams whose loads have landed, load_ms is how long one load took (fn should span a few).
function M.while_reading(files, rate, fn, readers)
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

-- The read rate of `n` files read at once, wave after wave (a mixture of experts' layer reads the
-- experts its router picked together, each a file: loip.model.experts), from a cold cache, at
-- rate (bytes/s, 0: as fast as it goes): bytes/s over at least `bytes` (every file once at least).
function M.parallel(files, n, bytes, rate)
  local sizes, biggest = file_sizes(files)
  drop_cache(files)
  n = math.max(1, math.min(n, #files))
  local l, err = loader.new { slots = n, slot_bytes = biggest, mode = "auto", rate = rate or 0, overlap_loads = true }
  if not l then error("profile: " .. err, 0) end
  local got, k, tag = 0, 0, 0
  local t0 = core.now_ms()
  repeat
    local first = tag + 1
    for slot = 1, n do
      k, tag = k % #files + 1, tag + 1
      local ok, serr = l:submit(slot, { { path = files[k], offset = 0, length = sizes[k] } }, tag)
      if not ok then l:close() error("profile: " .. tostring(serr), 0) end
      got = got + sizes[k]
    end
    for t = first, tag do
      local ok, werr = l:wait(t)
      if not ok then l:close() error("profile: " .. tostring(werr), 0) end
    end
  until got >= bytes and k >= #files
  local ms = core.now_ms() - t0
  l:close()
  return got / ms * 1e3
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

-- Loads queued back to back, as a device reads ahead: does letting the next load's reads start
-- before the current one's have landed (overlap_loads) finish the load a stage waits for sooner?
-- (On a disk that serves queued reads in parallel, the first load ends later with overlap.)
-- Pairs of loads of files (their sizes; slots of biggest bytes) up to bytes (at most 256 MiB):
-- the first's median ms and the rate; nil when no such loader can be made.
local function load_pairs(loader, files, sizes, biggest, bytes, rate, overlap)
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

-- With several readers of the disk: out.read_bps_by_readers[k], each reader's rate with k of
-- them reading at once (k = 1 .. readers), and out.read_bps that of all of them.
local function shared_rates(out, files, bytes, rate, readers, warn)
  -- (never more than one reader gets alone: tiny files read back to back may beat the one
  -- reader's figure, which waits for each)
  out.readers, out.read_bps_alone = readers, out.read_bps
  -- each reader's rate with k of them reading at once, k = 1 .. readers (a cluster's devices
  -- do not all read all the time: the cost model prices a read at the rate of as many as
  -- read beside it, loip.plan.problem's disk_shared_bps)
  out.read_bps_by_readers = { out.read_bps }
  for k = 2, readers do
    local shared = steady.steady(function() return 1e12 / M.disk_shared(files, bytes, rate, k) end,
      { reps = 3, rounds = 2, name = string.format("the disk's read rate with %d readers", k), warn = warn })
    out.read_bps_by_readers[k] = math.min(out.read_bps_by_readers[k - 1], 1e12 / shared.ms)
    out.spread, out.steady = math.max(out.spread, shared.spread), out.steady and shared.steady
  end
  out.read_bps = out.read_bps_by_readers[readers]
end

-- Read rate of files through the loader (io_uring, O_DIRECT where the filesystem allows; the
-- files' pages are dropped from the page cache before each sample, so that a buffered read is
-- cold too), as offloading reads them: the blocks a device offloads are read again every step,
-- so the rate is that of reading the same files again and again, after a first pass that is not
-- timed (a physical disk reads them afresh each time; a virtual disk's host may keep them in its
-- memory, 0.7 against 5 GB/s on the machine this was found on, and then does so for the run too):
-- bytes/s and a small read's fixed cost in ms, each measured until steady (loip.plan.steady: a
-- disk shared with other work varies, and a calibration is kept); `steady` is false when one did
-- not settle (warn was told, as loip.plan.steady tells it). bytes: how much to read at most per
-- sample.
-- readers (1): how many read this disk at once (a cluster's local devices): read_bps is then
-- each one's rate with all of them reading (M.disk_shared), read_bps_alone one reader's by itself,
-- read_bps_by_readers[k] each one's with k reading (k = 1 .. readers).
function M.disk(files, bytes, rate, readers, warn)
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
  for _ = 1, #files do read_one() end -- (the first pass)
  local small = steady.steady(function() drop_cache(files) return (read_one(4096)) end, { reps = 8, rounds = 3, tolerance = 0.5, name = "a small read's time", warn = warn })
  -- a sample: reads of at least `bytes` (this system's page cache dropped), as ms per GB
  local read = 0
  local whole = steady.steady(function()
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
  if mode == "uring" then
    local in_order, overlapped = load_pairs(loader, files, sizes, biggest, bytes, rate, false),
      load_pairs(loader, files, sizes, biggest, bytes, rate, true)
    if in_order and overlapped then
      out.in_order, out.overlapped = in_order, overlapped
      -- overlap only when it gets the waited-for load no later and reads faster
      out.overlap_loads = overlapped.first_ms <= in_order.first_ms and overlapped.read_bps > in_order.read_bps * 1.03
    end
  end
  if (readers or 1) > 1 then shared_rates(out, files, bytes, rate, readers, warn) end
  return out
end

return M
