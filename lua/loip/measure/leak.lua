-- Whether a process leaked, judged from samples taken over a long run (recipes/bench/soak.lua):
-- its open file descriptors by kind, its RSS. A leak keeps what it took, so it shows as a floor
-- that rose: the lowest value of the samples' second half above the median of their first half
-- (past the warm-up, whatever one sample caught) by more than a bound the judgement states. A
-- count that goes down is no leak, nor is one sample caught high or low (a connection being
-- closed, a collector not yet run, a busy machine batching requests otherwise): it is neither
-- the first half's median nor the second half's floor. A steady leak shows a quarter of what it
-- took over the run, at least.
--
--   leak.judge(series, bound)  -> nil, or { from =, to =, growth =, bound = }
--   leak.fds(samples, what)    -> list of sentences, one per kind of descriptor that leaked
--   leak.rss(samples_kib, what)-> a sentence, or nil
local M = {}

-- A kind of descriptor may grow by the larger of this many and this share of its first-half
-- count before it is called a leak: a leak of one per request passes it within a soak, a
-- connection or two being replaced (a worker's peers after a re-plan) does not.
M.FD_MIN, M.FD_SHARE = 4, 0.25
-- The RSS may rise by the larger of 4 MiB and 10% of the first half's median.
M.RSS_MIN_KIB, M.RSS_SHARE = 4096, 0.10

function M.fd_bound(count) return math.max(M.FD_MIN, math.ceil(count * M.FD_SHARE)) end
function M.rss_bound(kib) return math.max(M.RSS_MIN_KIB, math.ceil(kib * M.RSS_SHARE)) end

-- series: numbers in the order sampled (at least 2 for a judgement); bound(first_half_median)
-- gives the growth allowed. A leak when the second half's floor is above the first half's
-- median (the upper one of an even count) by more than that.
function M.judge(series, bound)
  local n = #series
  if n < 2 then return nil end
  local half = math.ceil(n / 2)
  local early, floor = {}, math.huge
  for i = 1, n do
    if i <= half then early[#early + 1] = series[i] else floor = math.min(floor, series[i]) end
  end
  table.sort(early)
  local base = early[math.floor(#early / 2) + 1]
  local allowed = bound(base)
  if floor - base > allowed then return { from = base, to = floor, growth = floor - base, bound = allowed } end
  return nil
end

-- samples: tables kind -> count (socket, pipe, anon_inode, file), in the order taken, of one
-- process. A kind absent from a sample counts 0 there.
function M.fds(samples, what)
  local kinds, out = {}, {}
  for _, s in ipairs(samples) do for k in pairs(s) do kinds[k] = true end end
  local names = {}
  for k in pairs(kinds) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do
    local series = {}
    for i, s in ipairs(samples) do series[i] = s[k] or 0 end
    local l = M.judge(series, M.fd_bound)
    if l then
      out[#out + 1] = string.format("%s: its %s descriptors grew from %d (the first half's median) to at least %d in every "
        .. "later sample, +%d where a leak is more than +%d (the larger of %d and %.0f%% of %d)", what, k, l.from, l.to,
        l.growth, l.bound, M.FD_MIN, M.FD_SHARE * 100, l.from)
    end
  end
  return out
end

function M.rss(samples_kib, what)
  local l = M.judge(samples_kib, M.rss_bound)
  if not l then return nil end
  return string.format("%s: the RSS grew from %d KiB (the first half's median) to at least %d KiB in every later "
    .. "sample, +%d KiB where a leak is more than +%d KiB (the larger of %d KiB and %.0f%% of the median)", what, l.from, l.to,
    l.growth, l.bound, M.RSS_MIN_KIB, M.RSS_SHARE * 100)
end

return M
