-- The quantized kernels' software prefetch distance in a profile (docs/planning.md, "Profiles"):
-- the MXFP4 matrix-vector kernel's rate at a few distances (loip_kernels_set_prefetch), on
-- matrices of a gpt-oss expert's shape cycled through more memory than the last cache holds.
-- The distances are alternated round by round (a drifting machine moves them alike) and each
-- rate is the median of its rounds; the profile keeps every rate and the fastest distance, and a
-- kernels policy (recipes/policies/kernels/) chooses from them when a device opens.
--
--   local prefetch = require "loip.plan.prefetch"
--   local k = prefetch.measure { pool = pool }   -- { prefetch_bytes, prefetch_bps = { ["1024"] = ... }, variant, ... }
local ffi = require "ffi"
local core = require "loip.core"
local exec = require "loip.runtime.exec"
local memory = require "loip.runtime.memory"
local median = require("loip.measure.stats").median
local K = require "loip.constants"

local M = {}

-- What the profile tries unless told: none, and from 8 cache lines to a page (4 KiB) ahead in
-- each row stream.
M.DISTANCES = { 0, 512, 1024, 2048, 4096 }
M.ROWS, M.COLS = 2880, 2880 -- (a gpt-oss expert's matrix: 4.4 MB in MXFP4)

-- The largest cache of this CPU in bytes (sysfs; nil where it is not told).
function M.last_cache_bytes()
  local most
  for i = 0, 9 do
    local f = io.open(string.format("/sys/devices/system/cpu/cpu0/cache/index%d/size", i))
    if not f then break end
    local s = f:read("*l") or ""
    f:close()
    local n, unit = s:match("^(%d+)([KMG]?)")
    if n then
      local b = tonumber(n) * ({ [""] = 1, K = 1024, M = 1024 ^ 2, G = 1024 ^ 3 })[unit]
      most = math.max(most or 0, b)
    end
  end
  return most
end

-- Bytes to cycle through by default: twice the last cache (a VM's share of a host's cache is
-- less), from 64 MiB to 512 MiB (a pass at memory speed: ~0.05 s; the profile's time kept short).
function M.default_bytes()
  local c = M.last_cache_bytes() or 32 * 1024 * 1024
  return math.max(64 * 1024 * 1024, math.min(512 * 1024 * 1024, 2 * c))
end

-- Measure. opts: pool (the device's thread pool), bytes (M.default_bytes()), distances
-- (M.DISTANCES), rounds (3). Returns nil, why where the kernels do not prefetch (the reference
-- variant); else { prefetch_bytes (the fastest distance), prefetch_bps = { [distance] = bytes
-- read per second }, variant (the kernels measured), matrix, bytes, rounds }. The distance in
-- force before is in force after.
function M.measure(opts)
  local variant = exec.kernels_name()
  if variant == "ref" then return nil, "the reference kernels do not prefetch" end
  local distances = opts.distances or M.DISTANCES
  local rounds = opts.rounds or 3
  local mbytes = M.ROWS * M.COLS / 32 * 17
  local count = math.max(1, math.floor((opts.bytes or M.default_bytes()) / mbytes))
  local total = count * mbytes
  local buf, err = memory.buffer(total)
  if not buf then error("profile: the prefetch distance's matrices: " .. err, 0) end
  local was = exec.kernels_prefetch()
  local ok, res = pcall(function()
    local base = ffi.cast("uint8_t *", memory.buffer_data(buf))
    -- random nibbles under scales around 2^-4 (no product subnormal or infinite), one matrix's
    -- copied to the others (the values do not change the time)
    assert(exec.fill_random(base, math.floor(mbytes / 4), K.F32, 11, 0, 0, 1))
    for b = 0, mbytes / 17 - 1 do base[b * 17] = 119 + b % 8 end
    for i = 1, count - 1 do ffi.copy(base + i * mbytes, base, mbytes) end
    local x, y = ffi.new("float[?]", M.COLS), ffi.new("float[?]", M.ROWS)
    for i = 0, M.COLS - 1 do x[i] = (i % 7) * 0.1 - 0.3 end
    local function pass()
      local t0 = core.now_ns()
      for i = 0, count - 1 do assert(exec.op_matvec(opts.pool, K.MXFP4, base + i * mbytes, x, y, M.ROWS, M.COLS)) end
      return total / ((core.now_ns() - t0) / 1e9)
    end
    pass() -- (page faults, TLB)
    local samples = {}
    for _, d in ipairs(distances) do samples[d] = {} end
    for r = 1, rounds do
      for j = 1, #distances do -- (each round starts one distance later: none is always first)
        local d = distances[(j + r - 2) % #distances + 1]
        assert(exec.kernels_set_prefetch(d, "profile: prefetch"))
        local s = samples[d]
        s[#s + 1] = pass()
      end
    end
    local bps, best = {}, nil
    for _, d in ipairs(distances) do
      bps[tostring(d)] = median(samples[d])
      if not best or bps[tostring(d)] > bps[tostring(best)] then best = d end
    end
    return { prefetch_bytes = best, prefetch_bps = bps, variant = variant, bytes = total, rounds = rounds,
      matrix = string.format("MXFP4 %dx%d", M.ROWS, M.COLS) }
  end)
  exec.kernels_set_prefetch(was)
  memory.buffer_free(buf)
  if not ok then error(res, 0) end
  return res
end

-- The largest distance the kernels take (loip.h's LOIP_KERNELS_PREFETCH_MAX), and whether v is
-- a distance: a whole number of bytes from 0 to it.
M.MAX = tonumber(K.KERNELS_PREFETCH_MAX)
function M.is_distance(v) return type(v) == "number" and v >= 0 and v % 1 == 0 and v <= M.MAX end

-- A profile's `kernels` section's problems as a message naming the field (nil: usable).
function M.check(k, where)
  local function bad(f, ...) return where .. ": " .. string.format(f, ...) end
  if type(k) ~= "table" then return bad("kernels must be an object") end
  local max, distance = M.MAX, M.is_distance
  if k.prefetch_bytes ~= nil and not distance(k.prefetch_bytes) then
    return bad("kernels.prefetch_bytes must be a whole number of bytes from 0 to %d, not %s", max, tostring(k.prefetch_bytes))
  end
  if k.prefetch_bps ~= nil then
    if type(k.prefetch_bps) ~= "table" then return bad("kernels.prefetch_bps must be an object of rates by distance") end
    for d, v in pairs(k.prefetch_bps) do
      if not distance(tonumber(d)) then return bad("kernels.prefetch_bps[%s]: the distance must be a whole number of bytes", tostring(d)) end
      if type(v) ~= "number" or v <= 0 then return bad("kernels.prefetch_bps[%s] must be a positive number (bytes/s)", tostring(d)) end
    end
  end
  if k.variant ~= nil and type(k.variant) ~= "string" then return bad("kernels.variant must be a string") end
  return nil
end

return M
