-- The LOIP paper's experiments (Sec. IV) on the simulator: a case is a model shape, a set of
-- devices from recipes/policies/device with their memory reservations, a link rate (or a schedule of
-- rates), a request pattern and a method: LOIP (the loip scheduler, its online policy), the
-- PP-based baselines as schedulers on the same runtime (pipeline, edgeshard, pipeline-offload),
-- the TP-based ones as models (recipes/policies/baseline: galaxy, tpi-llm, tpi-llm-offload). A method that
-- cannot place the model is OOM; one slower than the paper's limits is OOT (5 s/token sporadic,
-- 2 s/token bursty). recipes/paper/*.lua run the figures' cases through M.run and print them
-- beside the paper's ranges.
local errors = require "loip.error"
local json = require "loip.text.json"
local policy = require "loip.policy"
local sim = require "loip.sim"
local plan_mod = require "loip.plan"
local cp = require "loip.cli.inputs"
local flags = require "loip.ui.flags"
local transport = require "loip.runtime.transport"
local plot = require "loip.measure.plot"
local draft_mod = require "loip.sim.draft"
local request_draft = require "loip.engine.request.draft"
local planner = require "loip.cluster.planner"

local M = {}

M.OOT_MS = { sporadic = 5000, bursty = 2000 }
M.PP = { "pipeline", "edgeshard", "pipeline-offload" }
M.TP = { "galaxy", "tpi-llm", "tpi-llm-offload" }
M.METHODS = { "loip", "pipeline", "edgeshard", "pipeline-offload", "galaxy", "tpi-llm", "tpi-llm-offload" }
M.LABEL = { loip = "LOIP", pipeline = "Pipeline", edgeshard = "EdgeShard", ["pipeline-offload"] = "Pipeline+offloading",
  galaxy = "Galaxy", ["tpi-llm"] = "TPI-LLM", ["tpi-llm-offload"] = "TPI-LLM+offloading" }

local GiB = 1024 ^ 3

-- The budgets of devices (names) less what the OS keeps and the case's reservations (GiB each).
function M.budgets(names, reserve_gib)
  local out = {}
  for i, name in ipairs(names) do
    local d = policy.load("device", name)
    out[i] = math.floor(d.memory_bytes - d.reserve_bytes - (reserve_gib and reserve_gib[i] or 0) * GiB)
  end
  return out
end

-- The plan of case c (o: its flags, prob: its problem) by scheduler sched; with a draft (loip.sim.draft)
-- the plan leaves it room on its device and reserves its rows as the cluster's does (loip
-- simulate: plan_and_sim). Returns plan, estimate, logits rows, draft rows, problem (raises when
-- no plan fits).
local function planned(c, o, prob, draft, sched, max_batch)
  if not draft then
    local p, est = policy.plan(prob, { scheduler = sched })
    return p, est, nil, nil, prob
  end
  local inst = policy.load("draft", c.draft)
  local ch = planner.fit_draft_rows(request_draft.plan_rows(inst, c.draft_tokens), function(rows)
    local b, l = planner.rows_step(o.context, o.batch, rows, max_batch)
    local pr = cp.problem_of("experiment", setmetatable({ logits_tokens = l, batch = b }, { __index = o }))
    local p2, est2 = draft:reserve(pr, function() return policy.plan(pr, { scheduler = sched }) end)
    return { problem = pr, plan = p2, estimate = est2, logits_tokens = l }
  end, request_draft.grows(inst) and not c.draft_tokens and request_draft.MAX or nil)
  return ch.plan, ch.estimate, ch.logits_tokens, ch.draft_rows, ch.problem
end

-- One case: c = { model (a shape: llama-3.3-70b...), devices (names), reserve_gib (per device),
-- link_rate ("100mbit"), link_delay_ms, link_schedule (a "links" policy: rates change between
-- steps), pattern ("sporadic" | "bursty"), burst (4), requests (2), input_tokens, output_tokens,
-- context, plan_positions (KV positions planned: fewer, the KV cache grows inside the budgets), method,
-- and the ablations' overrides: scheduler, online, conventional_loads; no_oot (the table shows
-- the time however long, marked "(OOT)" past the limit); speculative decoding: draft (a draft
-- policy), acceptance (assumed), draft_like, draft_device, draft_tokens, seed, tree_curve ("B:T,..."
-- or a run's JSON), tree_depths (a list or "q1,q2,...") and tree_depths_source; ends ("memory", the
-- default, or "auto": loip.plan.ends) }. Returns
-- { ms_per_token | nil, outcome ("ms" | "OOM" | "OOT"), why, tokens_per_s, draft (its figures),
-- read_bytes_per_step (the plan's weights re-read from disk each step), weight_bytes }
-- (an OOT keeps its ms_per_token).
function M.run(c)
  local n = #c.devices
  local plan_positions = flags.renamed(c, "plan_tokens", "plan_positions", "experiments.run")
  local bursty = c.pattern == "bursty"
  local max_batch = bursty and (c.burst or 4) or 1
  local mem = {}
  for i, b in ipairs(M.budgets(c.devices, c.reserve_gib)) do mem[i] = tostring(b) end
  local o = { like = c.model, dtype = "bf16", devices = n, mem = table.concat(mem, ","), device_profile = table.concat(c.devices, ","),
    link_rate = c.link_rate or "100mbit", link_delay = c.link_delay_ms and (c.link_delay_ms .. "ms") or nil,
    context = c.context or 1024, batch = c.batch or 64, max_batch = max_batch, threads = 1, plan_positions = plan_positions,
    -- (the paper's system kept the embedding and head in memory; c.ends = "auto" lets them go to disk)
    ends = c.ends or "memory" }
  local ok, prob = pcall(cp.problem_of, "experiment", o)
  if not ok then error(errors.message(prob), 0) end
  local io_len = (c.input_tokens or 32) + math.floor((c.output_tokens or 64) / 2)
  local limit = M.OOT_MS[c.pattern] or math.huge
  local function verdict(ms, why)
    if not ms then return { outcome = "OOM", why = why and tostring(why):gsub("^OOM: ", "") or nil } end
    if ms > limit then return { ms_per_token = ms, outcome = "OOT", why = string.format("%.0f ms/token > %.0f", ms, limit) } end
    return { ms_per_token = ms, outcome = "ms" }
  end
  local tp = false
  for _, m in ipairs(M.TP) do tp = tp or m == c.method end
  if tp then
    local base = policy.load("baseline", c.method)
    if not c.link_schedule then
      local r, why = base.run(prob, { batch = max_batch, context = io_len })
      return verdict(r and r.ms_per_token, why)
    end
    -- rates that change between steps: each step at the slowest link's rate then
    local sched = policy.load("links", c.link_schedule)
    local rate, sum, steps = nil, 0, c.output_tokens or 64
    for k = 1, steps do
      local r = sched.at(k)
      if r ~= nil then
        local list = type(r) == "table" and r or { r }
        rate = math.huge
        for i = 1, math.min(#list, n) do rate = math.min(rate, transport.parse_rate(list[i])) end
      end
      local res, why = base.run(prob, { batch = max_batch, context = (c.input_tokens or 32) + k, rate_bps = rate })
      if not res then return verdict(nil, why) end
      sum = sum + res.ms_per_token
    end
    return verdict(sum / steps)
  end
  local sched = c.scheduler or (c.method == "loip" and "loip" or c.method)
  -- speculative decoding (loip.sim.draft): the plan leaves the draft room on its device
  -- (a tree's curve and depth shape: loip.sim.draft's curve and depths, as loip simulate's flags)
  local curve, depths = nil, c.tree_depths
  if c.tree_curve then curve = assert(draft_mod.curve(c.tree_curve)) end
  if type(depths) == "string" then depths = assert(draft_mod.depths(depths)) end
  local draft = c.draft and draft_mod.new(prob, { draft = c.draft, acceptance = c.acceptance, like = c.draft_like,
    dtype = "bf16", device = c.draft_device, seed = c.seed, max_seqs = max_batch, curve = curve, curve_source = c.tree_curve,
    depths = depths, depths_source = c.tree_depths_source })
  local pok, p, est, lt, rows, prob2 = pcall(planned, c, o, prob, draft, sched, max_batch)
  prob = prob2 or prob
  if not pok then return verdict(nil, tostring(p):gsub("^scheduler [%w%-]+: ", "")) end
  local s = sim.new(prob, p, { context = o.context, step_tokens = prob.batch or o.batch, max_seqs = max_batch, estimate = est,
    conventional_loads = c.conventional_loads, plan_positions = plan_positions, draft = draft, logits_tokens = lt })
  local arrivals = policy.load("pattern", c.pattern).requests({ count = c.requests or 2, burst = max_batch, bursts = 1,
    input_tokens = c.input_tokens or 32, output_tokens = c.output_tokens or 64 })
  local online = c.online
  if online == nil and c.method == "loip" then online = "loip" end
  local runs = s:play(arrivals, { links = c.link_schedule, online = online, draft_tokens = c.draft_tokens })
  if s.failure then return verdict(nil, s.failure) end
  local sum, k, tokens, last = 0, 0, 0, 0
  for _, r in ipairs(runs) do
    if r.ms_per_token then sum, k = sum + r.ms_per_token, k + 1 end
    tokens, last = tokens + (r.tokens or 0), math.max(last, r.t_done or 0)
  end
  local v = verdict(k > 0 and sum / k or nil, k == 0 and "no request decoded" or nil)
  v.tokens_per_s = last > 0 and tokens / last * 1e3 or nil
  -- the plan's weights re-read from disk every step (a mixture of experts: its routed experts')
  v.read_bytes_per_step, v.weight_bytes = 0, prob.model.weight_bytes
  for i = 1, #p.devices do v.read_bytes_per_step = v.read_bytes_per_step + plan_mod.memory(p, i, prob.model).offloaded_bytes end
  v.draft = draft and draft:report(s.batcher.draft and s.batcher.draft:report(), c.draft_tokens, rows)
  return v
end

-- LOIP's speedups over a group of methods across rows ({ config, method, ms_per_token }): the
-- least and the most, over the configurations where both ran.
function M.speedups(rows, group)
  local by = {}
  for _, r in ipairs(rows) do
    by[r.config] = by[r.config] or {}
    by[r.config][r.method] = r.ms_per_token
  end
  local lo, hi
  for _, ms in pairs(by) do
    for _, m in ipairs(group) do
      if ms.loip and ms[m] then
        local x = ms[m] / ms.loip
        lo, hi = math.min(lo or x, x), math.max(hi or x, x)
      end
    end
  end
  return lo, hi
end

-- Run every case (a list), write <out>/<name>.json (rows) and <name>.md, print the table.
function M.report(name, out, cases, paper)
  local rows, keep = {}, {} -- keep[i]: row i's time shown however long (no_oot)
  for _, c in ipairs(cases) do
    local r = M.run(c)
    rows[#rows + 1] = { config = c.config, method = c.method, ms_per_token = r.ms_per_token,
      result = r.outcome == "ms" and r.ms_per_token or r.outcome, why = r.why }
    keep[#rows] = c.no_oot
    io.stderr:write(string.format("%-48s %-20s %s\n", c.config, M.LABEL[c.method] or c.method,
      r.outcome == "ms" and string.format("%.0f ms/token", r.ms_per_token) or (r.outcome .. (r.why and (": " .. r.why) or ""))))
  end
  local pp_lo, pp_hi = M.speedups(rows, M.PP)
  local tp_lo, tp_hi = M.speedups(rows, M.TP)
  local result = { name = name, rows = rows, paper = paper,
    ours = { over_pp = pp_lo and { pp_lo, pp_hi } or nil, over_tp = tp_lo and { tp_lo, tp_hi } or nil } }
  os.execute("mkdir -p '" .. out .. "'")
  -- the table: configurations down, methods across
  local methods, configs, cell = {}, {}, {}
  for i, r in ipairs(rows) do
    if not cell[r.method] then methods[#methods + 1] = r.method cell[r.method] = {} end
    if not cell.__seen or not cell.__seen[r.config] then
      cell.__seen = cell.__seen or {}
      cell.__seen[r.config] = true
      configs[#configs + 1] = r.config
    end
    cell[r.method][r.config] = type(r.result) == "number" and string.format("%.0f", r.result)
      or (r.result == "OOT" and keep[i] and string.format("%.0f (OOT)", r.ms_per_token)) or r.result
  end
  local head = { "| configuration |" }
  local rule = { "|---|" }
  for _, m in ipairs(methods) do head[#head + 1] = " " .. (M.LABEL[m] or m) .. " |" rule[#rule + 1] = "---|" end
  local md = { table.concat(head), table.concat(rule) }
  for _, cfg in ipairs(configs) do
    local line = { "| " .. cfg .. " |" }
    for _, m in ipairs(methods) do line[#line + 1] = " " .. (cell[m][cfg] or "") .. " |" end
    md[#md + 1] = table.concat(line)
  end
  md[#md + 1] = ""
  local kept = false
  for i, r in ipairs(rows) do kept = kept or (r.result == "OOT" and keep[i]) end
  md[#md + 1] = "ms/token; OOM: the method cannot place the model; OOT: slower than 5 s/token (sporadic) or 2 s/token (bursty)"
    .. (kept and "; a time marked (OOT) is past that limit, shown to compare the ablations." or ".")
  md[#md + 1] = ""
  local function range(x) return x and string.format("%.1f-%.1fx", x[1], x[2]) or "-" end
  if result.ours.over_pp or result.ours.over_tp then
    md[#md + 1] = string.format("LOIP's speedup over the PP-based baselines: %s (paper: %s); over the TP-based: %s (paper: %s)",
      range(result.ours.over_pp), paper.over_pp or "-", range(result.ours.over_tp), paper.over_tp or "-")
  end
  if paper.ablation then md[#md + 1] = "The paper: " .. paper.ablation .. "." end
  local text = table.concat(md, "\n") .. "\n"
  local f = assert(io.open(out .. "/" .. name .. ".md", "w"))
  f:write(text)
  f:close()
  local bars = {}
  for _, r in ipairs(rows) do
    bars[#bars + 1] = { string.format("%s: %s", r.config, M.LABEL[r.method] or r.method), r.ms_per_token or 0,
      type(r.result) == "string" and r.result or nil, color = r.method == "loip" and "#27ae60" or "#7f8c8d" }
  end
  plot.bars(out .. "/" .. name .. ".svg", { title = paper.title or name, unit = "ms/token", bars = bars })
  result.plot = name .. ".svg" -- (beside the JSON: the same bytes wherever --out is)
  json.write_file(out .. "/" .. name .. ".json", json.encode_sorted(result, 2) .. "\n")
  io.stdout:write(text)
  return result
end

return M
