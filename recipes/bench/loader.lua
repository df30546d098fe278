-- Loader throughput against this disk's own raw read speed, measured in the same run.
--
--   loip run recipes/bench/loader.lua [--store DIR] [--repeats N] [--out DIR]
--                                     [--queue-depth N] [--request-mb N] [--quick]
--
-- Every block file of a synthetic llama-3.2-1b BF16 slice store (made on first use) is read once
-- per method: (1) raw buffered: loip_file_read of each whole file into one buffer; (2) raw
-- O_DIRECT: the same with LOIP_READ_DIRECT; (3) the loader, io_uring, one slot, each file one
-- load, waited for before the next (how a stage's blocks are loaded); (4) the same with two
-- slots, file k+1 submitted before waiting for file k; (5) the loader's buffered (conventional)
-- path, as (3). The page cache is dropped before each method (root only; otherwise the run is
-- warm and says so). Target: loader io_uring >= 90% of the faster raw method, per repeat.
-- Prints one JSON object and draws an SVG bar chart.
local ffi = require "ffi"
local core = require "loip.core"
local bench = require "loip.measure.bench"
local flags = require "loip.ui.flags"
local json = require "loip.text.json"
local plot = require "loip.measure.plot"
local loader = require "loip.runtime.loader"
local store = require "loip.model.store"
local exec = require "loip.runtime.exec"
local files_rt = require "loip.runtime.files"
local memory = require "loip.runtime.memory"

local spec = {
  name = "loader.lua", usage = "loip run recipes/bench/loader.lua [flags]",
  summary = "Slot loader (io_uring and buffered) vs raw buffered and O_DIRECT reads of a slice store.",
  flags = bench.store_flags("to read", {
    { "repeats", "int", "rounds of all methods (medians are reported)", default = 3 },
    { "out", "string", "where to write loader.json and loader.svg", default = "bench-out" },
    { "queue-depth", "int", "loader io_uring reads in flight (0: the loader's default, 32)", default = 0 },
    { "request-mb", "int", "loader read size in MiB (0: the loader's default, 1)", default = 0 },
    { "quick", "bool", "only the first 3 layers' files and 2 repeats, to check the recipe works" },
  }),
}
local o = flags.parse(spec, arg, 1)
if o.quick then o.repeats = math.min(o.repeats, 2) end

local TARGET = 0.9
local log = bench.log
local median = bench.median
local sh = bench.sh

bench.ensure_store(o.store, o.model)
local man = store.read_manifest(o.store)
local files, total, largest = {}, 0, 0
for _, f in ipairs(man.files) do
  if not o.quick or (f.layer and f.layer >= 0 and f.layer < 3) then
    files[#files + 1] = { path = o.store .. "/" .. f.name, size = f.size }
    total, largest = total + f.size, math.max(largest, f.size)
  end
end

-- Cold runs need the page cache dropped before every method; that takes root (and a writable
-- /proc/sys). Without it the run is warm: flagged in the JSON, the ratios mean little then.
local root = sh("id -u") == "0"
local function drop_caches()
  return os.execute("sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null") == 0
end
local cold = root and drop_caches()
local why_warm = not root and "not root: the page cache cannot be dropped"
  or not cold and "root, but writing /proc/sys/vm/drop_caches failed" or nil
if why_warm then log("WARM RUN: %s", why_warm) end

-- Memory every method reads into, touched once now so that no method pays first-touch faults.
local buf = assert(memory.buffer(largest))
local base = ffi.cast("uint8_t *", memory.buffer_data(buf))
ffi.fill(base, largest, 1)
local function new_loader(mode, slots)
  local l, err = loader.new { mode = mode, slots = slots, slot_bytes = largest,
    queue_depth = o.queue_depth, request_bytes = o.request_mb * 1024 * 1024 }
  if not l then return nil, err end
  for s = 1, slots do local p, n = l:slot(s) ffi.fill(p, n, 1) end
  return l
end
local uring1, uring_err = new_loader("uring", 1)
local uring2 = uring1 and new_loader("uring", 2)
local buffered = assert(new_loader("buffered", 1))
if not uring1 then log("SKIP loader io_uring: %s", uring_err) end

-- The methods: each reads every file of the list once (total bytes).
local direct_files, raw_files = 0, 0
local function raw(direct)
  return function()
    for _, f in ipairs(files) do
      local used = select(2, core.must(files_rt.read(f.path, 0, f.size, base, direct)))
      if direct then direct_files, raw_files = direct_files + used, raw_files + 1 end
    end
  end
end
local function one_at_a_time(l) -- submit a file, wait for it, then the next
  return function()
    for k, f in ipairs(files) do
      assert(l:submit(1, { { path = f.path, offset = 0, length = f.size } }, k))
      assert(l:wait(k))
    end
  end
end
local function double_buffered(l) -- file k+1 goes to the other slot while file k is read
  return function()
    assert(l:submit(1, { { path = files[1].path, offset = 0, length = files[1].size } }, 1))
    for k = 1, #files do
      local n = files[k + 1]
      if n then assert(l:submit(k % 2 + 1, { { path = n.path, offset = 0, length = n.size } }, k + 1)) end
      assert(l:wait(k))
    end
  end
end
local methods = {
  { key = "raw_buffered", label = "raw buffered read", run = raw(false), color = "#7f8c8d" },
  { key = "raw_direct", label = "raw O_DIRECT read", run = raw(true), color = "#95a5a6" },
  uring1 and { key = "loader_uring", label = "loader io_uring, 1 slot", run = one_at_a_time(uring1), color = "#27ae60" },
  uring2 and { key = "loader_uring_2slots", label = "loader io_uring, 2 slots", run = double_buffered(uring2), color = "#2ecc71" },
  { key = "loader_buffered", label = "loader buffered (conventional)", run = one_at_a_time(buffered) },
}
local list = {}
for i = 1, 5 do if methods[i] then list[#list + 1] = methods[i] end end
methods = list

-- The rounds: every method once per round, the order rotated each round, so that the host's
-- drift over seconds lands on all methods alike; ratios are taken within a round.
log("%d files, %.2f GB per method, %d repeats, %s", #files, total / 1e9, o.repeats, cold and "cold" or "WARM")
-- One unmeasured pass first: without it the first measured pass (raw buffered, round 1) ran at
-- 0.35-0.5 GB/s against ~1.6 later, in 3 runs of 3 on a 2-CPU VM, skewing round 1.
methods[1].run()
direct_files, raw_files = 0, 0
local samples, ratios = {}, { loader_uring = {}, loader_uring_2slots = {}, loader_buffered = {} }
for _, m in ipairs(methods) do samples[m.key] = {} end
for r = 1, o.repeats do
  local got = {}
  for i = 0, #methods - 1 do
    local m = methods[(i + r - 1) % #methods + 1]
    if cold then assert(drop_caches(), "drop_caches failed mid-run") end
    local t0 = core.now_ns()
    m.run()
    local gbs = total / ((core.now_ns() - t0) / 1e9) / 1e9
    got[m.key] = gbs
    table.insert(samples[m.key], gbs)
    log("round %d: %-32s %6.3f GB/s", r, m.label, gbs)
  end
  local raw_best = math.max(got.raw_buffered, got.raw_direct)
  for key, list_ in pairs(ratios) do
    if got[key] then list_[#list_ + 1] = got[key] / raw_best end
  end
end

-- Report.
local info = exec.cpu_info()
local result = {
  machine = { cpus = info.cpus, kernel = sh("uname -r"), store_device = sh("findmnt -no SOURCE,FSTYPE -T '" .. o.store .. "'"),
    mem_total = sh("grep MemTotal /proc/meminfo"):match("%d+ kB"), root = root },
  cache = cold and "cold (page cache dropped before every method)" or "warm", warm_reason = why_warm,
  store = o.store, store_bytes = man.total_bytes, files = #files, bytes_per_method = total, largest_file = largest,
  quick = o.quick or false, repeats = o.repeats,
  raw_direct_files_direct = string.format("%d of %d", direct_files, raw_files),
  loader = { uring = uring1 and uring1:describe() or ("skipped: " .. tostring(uring_err)),
    uring_2slots = uring2 and uring2:describe() or nil, buffered = buffered:describe(),
    queue_depth = o.queue_depth, request_mb = o.request_mb },
  gbps = {}, samples = samples, target = TARGET, ratios = {},
}
for _, m in ipairs(methods) do result.gbps[m.key] = median(samples[m.key]) end
for key, list_ in pairs(ratios) do
  if #list_ > 0 then
    result.ratios[key] = { median = median(list_), min = math.min(unpack(list_)), max = math.max(unpack(list_)), samples = list_ }
  end
end
result.loader_ratio = result.ratios.loader_uring and result.ratios.loader_uring.median or nil
result.meets_target = result.loader_ratio and result.loader_ratio >= TARGET or false
if direct_files < raw_files then log("NOTE: only %s raw O_DIRECT reads were direct", result.raw_direct_files_direct) end
for _, l in ipairs({ uring1, uring2, buffered }) do l:close() end
memory.buffer_free(buf)

os.execute("mkdir -p '" .. o.out .. "'")
local raw_best = math.max(result.gbps.raw_buffered, result.gbps.raw_direct)
local bars = {}
for _, m in ipairs(methods) do
  local g = result.gbps[m.key]
  local rr = result.ratios[m.key]
  bars[#bars + 1] = { m.label, g, rr and string.format("(%.0f%% of raw)", 100 * rr.median)
    or nil, color = m.color }
end
result.plot = plot.bars(o.out .. "/loader.svg", {
  -- "% of raw": the median over rounds of the method / the faster raw read in that round
  title = string.format("loip loader vs raw reads, %.2f GB of a llama-3.2-1b BF16 store, %s (medians of %d)",
    total / 1e9, cold and "cold" or "WARM", o.repeats),
  unit = "GB/s", bars = bars, refs = { { "target (90%)", TARGET * raw_best } } })
local text = json.encode(result)
local f = assert(io.open(o.out .. "/loader.json", "w"))
f:write(text, "\n")
f:close()
print(text)
