-- scheduler "brute": every plan of the paper's plan space (loip.plan.space: every stage count,
-- round template, placement of the last round's extra blocks, offloaded count and slot per
-- device) that fits the budgets, each built and estimated with the cost model; the least wins.
-- For small problems: it is the check the DP scheduler ("loip") is tested against, and it
-- refuses a space of more than `limit` plans (a few seconds' work) rather than run for hours.
local plan = require "loip.plan"
local space = require "loip.plan.space"
local problem_mod = require "loip.plan.problem"

local M = { name = "brute" }

-- Its settings (docs/planning.md, "The policy API"), e.g. --scheduler brute:limit=1e7.
M.settings = {
  { "limit", "number", "plans the search estimates at most (a few seconds' work); a larger space is refused", default = 2e6,
    check = function(v) return v > 0, "must be > 0" end },
}

-- Compositions of total into k positive parts, each passed to fn (the table is reused).
local function compositions(total, k, fn)
  local parts = {}
  local function rec(i, left)
    if i == k then parts[i] = left fn(parts) return end
    for v = 1, left - (k - i) do
      parts[i] = v
      rec(i + 1, left - v)
    end
  end
  if total >= k then rec(1, total) end
end

-- Subsets of size m of 1..k as a 0/1 list, each passed to fn.
local function subsets(k, m, fn)
  local pick = {}
  local function rec(i, left)
    if i > k then if left == 0 then fn(pick) end return end
    if k - i + 1 > left then pick[i] = 0 rec(i + 1, left) end
    if left > 0 then pick[i] = 1 rec(i + 1, left - 1) end
  end
  rec(1, m)
end

local function binom(n, k)
  if k < 0 or k > n then return 0 end
  local r = 1
  for j = 1, k do r = r * (n - k + j) / j end
  return r
end

-- How many templates the space holds (before offloaded counts and slots multiply them).
function M.size(problem)
  local N, total = #problem.devices, 0
  for _, sh in ipairs(space.shapes(problem)) do total = total + binom(sh.R - 1, N - 1) * binom(N, math.abs(sh.E)) end
  return total
end

-- Every fitting plan of the space, estimated: the best plan and its estimate, the number of
-- plans estimated; or nil and why. o: the settings (default: M.settings' defaults).
function M.search(problem, cost, o)
  local N = #problem.devices
  local templates = M.size(problem)
  local limit = o and o.limit or M.settings[1].default
  if templates * 4 ^ N > limit * 64 then
    return nil, string.format("brute: %.3g round templates on %d devices (each times every offloaded count and slot): too many for a brute-force search; use --scheduler loip (its DP finds the same optimum)",
      templates, N)
  end
  local budgets = {}
  for i = 1, N do budgets[i] = space.budget(problem, i) end
  local best, best_t, best_est, count = nil, nil, nil, 0
  for _, shape in ipairs(space.shapes(problem)) do
    local sgn = shape.E > 0 and 1 or -1
    compositions(shape.R, N, function(n)
      subsets(N, math.abs(shape.E), function(pick)
        local x = {}
        for i = 1, N do
          x[i] = pick[i] * sgn
          if n[i] + x[i] < 1 then return end
        end
        -- per device, every (offloaded count, slot) that fits its budget, found on the built plan
        local choice = { n = n, x = x, o = {}, k = {} }
        for i = 1, N do choice.o[i], choice.k[i] = 0, 1 end
        local p = space.build(problem, shape, choice)
        local fits = {}
        for i = 1, N do
          fits[i] = {}
          local d = p.devices[i]
          for o = 0, n[i] + math.max(x[i], 0) do
            for k = 1, o > 0 and 2 or 1 do
              choice.o[i], choice.k[i] = o, k
              p.devices[i] = space.build(problem, shape, choice).devices[i]
              if space.total(problem, plan.device_part(p, i, problem.model)) <= budgets[i] then
                fits[i][#fits[i] + 1] = { o = o, k = k, d = p.devices[i] }
              end
            end
          end
          p.devices[i], choice.o[i], choice.k[i] = d, 0, 1
          if #fits[i] == 0 then return end
        end
        -- every combination of the devices' fitting options
        local function rec(i)
          if i > N then
            count = count + 1
            if count > limit then error(string.format("brute: more than %d plans; use --scheduler loip", limit), 0) end
            local est = cost.estimate(p, problem)
            if not best_t or est.ms_per_token < best_t then
              best_t, best_est, best = est.ms_per_token, est, plan.bare(p)
            end
            return
          end
          for _, f in ipairs(fits[i]) do
            p.devices[i] = f.d
            rec(i + 1)
          end
        end
        rec(1)
      end)
    end)
  end
  if not best then return nil, problem_mod.why_none(problem) end
  return best, best_est, count
end

function M.schedule(problem, cost, params)
  local p, est_or_why = M.search(problem, cost, params)
  if not p then return nil, est_or_why end
  return p
end

return M
