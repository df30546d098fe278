-- Figures measured until they are steady: the spread of a round of samples, and rounds of them
-- until one settles (docs/planning.md, "Profiles and calibrations"). The profile's compute
-- figures and the disk's are measured through here; loip.plan.profile re-exports both.
--
--   local steady = require "loip.plan.steady"
--   local t = steady.steady(function() return ms_of_one_run() end, { name = "the MLP block" })
--   -- t.ms, t.spread, t.spread_rounds, t.samples, t.rounds, t.steady
local median = require("loip.measure.stats").median

local M = {}

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

return M
