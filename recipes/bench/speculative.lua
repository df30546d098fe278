-- Speculative decoding on a read-bound offloading ring, in one run (issue 26): tokens/s and
-- tokens per step against the draft length k, for each draft policy, the tokens checked equal
-- to no speculation's.
--
--   loip run recipes/bench/speculative.lua [--tokens 200] [--ks 1,2,4,8] [--synthetic] [--out DIR] [--quick]
--
-- The cluster: stories260K's slice store on --devices local devices with budgets --mem (they
-- offload part of their blocks: every step reads them again), each disk held to --disk-rate,
-- links of --link-rate and --link-delay ms; steps of 64 tokens (a cost-model tree's plan: grown to
-- hold its rows), --context positions. Every variant runs the same plan: made for the largest
-- verifying step. Variants:
--   none          no drafts
--   self k=K      the whole model as its own draft, K drafts a step (every draft accepted: the
--                 price of verifying K + 1 rows against one step's)
--   self          the same, the draft length chosen each step
--   ngram         prompt lookup on each of the 7 reference prompts (their texts repeat), the
--                 length chosen each step: against no drafts on the same prompt
--   tree          (when the draft policy offers it) self:layers=L with tree=on against the chain
--   lookahead     lookahead decoding (no second model: the target's own guesses, PEEK, feed an
--                 n-gram pool) on each of the 7 reference prompts against no drafts on the same
--                 prompt, the plan every variant runs (or --lookahead-rows) (target: >= 1.2x overall,
--                 none below 1.0x)
-- With --trees, only the tree comparison of issue 39: the draft --tree as a chain at each fixed
-- k = 1..8 and as a cost-model tree (tree=on, grown best-first, its size B chosen each step),
-- read-bound, then the same made compute-bound (--compute-mem budgets that hold everything, no
-- disk limit, no emulated links); the read-bound tree run's acceptance (its draft report) given to
-- loip simulate, its prediction beside the measurement. Targets: the tree >= 1.5x the best
-- chain's tokens per verifying step and >= 1.3x its tokens/s read-bound; B <= 4 compute-bound
-- (B as chosen: the mean of the sizes the cost model chose, 0 included; beside it the nodes sent
-- per verifying step, which leave the choices of 0 out, and the last choice);
-- the simulator within 15% of the tree's tokens/s.
-- With --two, only two concurrent requests (issue 39 item 2): no draft against the --tree draft's
-- cost-model tree in the head's process and on device --two-device (its budget raised by the
-- draft's bytes, so that its part plans alike), each built together (one draft forward a round
-- for both requests' trees) and one by one, --reps rounds alternated, medians: tokens/s, tokens
-- per ring step and per request step, the draft's forwards per ring step. JSON. (Two requests'
-- KV: --context 256 fits the read-bound budgets, docs/planning.md.)
-- With --synthetic, also a synthetic llama-3.2-1b shape drafting for a synthetic llama-3.2-3b
-- shape (random weights: drafts almost never accepted) on --devices offloading devices: the
-- tokens equal, and drafting turns itself down (target: >= 0.95x of no drafts).
-- Targets: self k=4 >= 3x none's tokens/s; ngram >= 0.95x none's on every prompt. JSON + SVG.
local bench = require "loip.measure.bench"
local cluster = require "loip.cluster"
local core = require "loip.core"
local flags = require "loip.ui.flags"
local json = require "loip.text.json"
local plot = require "loip.measure.plot"
local policy = require "loip.policy"
local store = require "loip.model.store"
local plan = require "loip.plan"
local synth = require "loip.model.synth"
local slice_mod = require "loip.model.slice"
local proc = require "loip.cluster.proc"

local S260_STORE = "/tmp/loip-bench/stories260K-store"
local spec = {
  name = "speculative.lua", usage = "loip run recipes/bench/speculative.lua [flags]",
  summary = "Speculative decoding on a read-bound offloading ring: tokens/s and tokens per step vs k, per draft.",
  flags = {
    { "store", "string", "the slice store run (made from models/stories260K if missing)", default = S260_STORE },
    { "devices", "int", "local devices", default = 3 },
    { "mem", "string", "each device's budget", default = "790K,770K,800K" },
    { "disk-rate", "string", "each device's disk at most this fast", default = "20M" },
    { "link-rate", "string", "emulated link rate", default = "100mbit" },
    { "link-delay", "number", "emulated one-way delay, ms", default = 2 },
    { "context", "int", "KV positions (at 512 the verifying step's 9 logits rows do not fit device 3's 800K by 4.6 KiB)",
      default = 480 },
    { "tokens", "int", "tokens generated per run", default = 200 },
    { "ks", "string", "draft lengths of the self draft", default = "1,2,4,8" },
    { "tree", "string", "the tree variant's draft (when the policy offers tree=on), against its chain", default = "self:layers=3" },
    { "trees", "bool", "only the tree comparison: the --tree draft's chains k = 1..8 against its cost-model tree, read-bound "
      .. "and compute-bound" },
    { "reps", "int", "--trees: rounds of the runs, alternated (medians reported)", default = 3 },
    { "two", "bool", "only two concurrent requests: no draft, the --tree draft's cost-model tree in the head's process and on "
      .. "--two-device, built together and one by one (read-bound)" },
    { "two-device", "int", "--two: the device the worker's draft runs on", default = 2 },
    { "compute-mem", "string", "--trees: each device's budget in the compute-bound run (holds everything)", default = "64M,64M,64M" },
    { "synthetic", "bool", "also a synthetic llama-3.2-1b drafting for a synthetic llama-3.2-3b (slow: minutes)" },
    { "synthetic-layers", "string", "the synthetic shapes' layers, draft,target (full depth: 16,28)", default = "4,8" },
    { "synthetic-tokens", "int", "tokens of the synthetic runs", default = 48 },
    { "synthetic-budget", "number", "the synthetic target's budgets together, as a share of its weights (the devices at "
      .. "the ends hold its embedding and tied head on top of an equal share: they offload layers)", default = 1.0 },
    { "out", "string", "where to write speculative.json and speculative.svg", default = "bench-out" },
    { "quick", "bool", "40 tokens, k 1 and 4, two ngram prompts: check the recipe works" },
    { "lookahead", "string", "the lookahead variant's draft, on the 7 reference prompts against no drafts (empty: none)",
      default = "lookahead" },
    { "lookahead-rows", "int", "the logits rows the lookahead variant and its no-drafts runs are planned for (its tree's "
      .. "nodes + 1; 0: every variant's plan)", default = 0 },
    { "only-lookahead", "bool", "run the lookahead variant alone" },
  },
}
local o = flags.parse(spec, arg, 1)
if o.quick then o.tokens, o.ks, o.synthetic_tokens = 40, "1,4", 16 end
local log = bench.log

local src = (require("loip.core").build.source_dir or ".") .. "/models/stories260K"
if not store.is_store(o.store) then
  log("slicing %s into %s (once)", src, o.store)
  slice_mod.write(src, o.store, { quiet = true })
end
local greedy = json.load(src .. "/reference/greedy.json")
local mems = {}
for x in o.mem:gmatch("[^,]+") do mems[#mems + 1] = x end
local disk = assert(flags.parse_bytes(o.disk_rate), "--disk-rate: not a size")
-- every variant is planned for the largest verifying step's logits rows (the last device's
-- buffer, in its activations), so that all of them run the same plan: the comparison is of
-- drafting alone, not of plans offloading more or less
local LOGITS_ROWS = require("loip.engine.request.draft").MAX + 1
for k in o.ks:gmatch("%d+") do LOGITS_ROWS = math.max(LOGITS_ROWS, tonumber(k) + 1) end

-- One generation on cluster c planned with draft d (a name, or nil) and k: tokens/s over the
-- decoding (first token to last), the tokens, and the draft's report.
local function run(c, d, k, prompt, n, extra)
  local popts = { context = o.context, disk_rate = disk, link = { rate = o.link_rate, delay_ms = o.link_delay },
    draft = d and policy.load("draft", d) or nil, draft_tokens = k, logits_tokens = LOGITS_ROWS }
  for key, v in pairs(extra or {}) do popts[key] = v end
  for key, v in pairs(popts) do if v == false then popts[key] = nil end end -- (false: left out)
  c:plan(popts)
  local it, st = c:generate(prompt, { max_tokens = n, sampler = { temperature = 0 }, ignore_eos = true })
  local first, last, got = nil, nil, 0
  for _ in it do
    last = core.now_ms()
    first = first or last
    got = got + 1
  end
  local r = c:batcher().draft and c:batcher().draft:report() or nil
  return { tokens_per_s = (got - 1) / ((last - first) / 1000), tokens = st.token_ids, draft = r,
    tokens_per_step = r and r.steps > 0 and r.tokens_per_step or 1 }
end

local function same(a, b) return table.concat(a, ",") == table.concat(b, ",") end

-- The report res written to --out/name and printed (the last line: its JSON).
local function report(name, res)
  os.execute("mkdir -p '" .. o.out .. "'")
  local f = assert(io.open(o.out .. "/" .. name, "w"))
  f:write(json.encode_sorted(res, 2), "\n")
  f:close()
  print(json.encode_sorted(res))
end

-- The tree comparison (--trees) on cluster c, the runs planned with `extra`: none, the chain of
-- draft o.tree at k = 1..8, the cost-model tree (its plan's rows its own: plan_rows), --reps
-- rounds of them alternated, medians. Its figures, logged under `label`.
local function median(xs)
  table.sort(xs)
  local n = #xs
  return n % 2 == 1 and xs[(n + 1) / 2] or (xs[n / 2] + xs[n / 2 + 1]) / 2
end
-- The simulator's prediction of the read-bound tree run (issue 39: within 15% of it): the run
-- of median tokens/s, its draft report (tree_curve and per_depth: the measured acceptance)
-- written to --out and given to loip simulate with the ring's flags (docs/planning.md,
-- "Speculative decoding on the simulator"). { tokens_per_s, measured_tokens_per_s, ratio,
-- tokens_per_step, tree_size, plan_rows, run }, or nil when simulate fails (logged).
local function simulated(rt, prompt)
  local sorted = {}
  for i, x in ipairs(rt) do sorted[i] = x end
  table.sort(sorted, function(a, b) return a.tokens_per_s < b.tokens_per_s end)
  local r = sorted[math.ceil(#sorted / 2)]
  os.execute("mkdir -p '" .. o.out .. "'")
  local path = o.out .. "/speculative-tree-run.json"
  local f = assert(io.open(path, "w"))
  f:write(json.encode({ draft = r.draft, tokens_per_s = r.tokens_per_s }), "\n")
  f:close()
  local sep = o.tree:find(":", 1, true) and "," or ":"
  local cmd = string.format("%s simulate --model '%s' --devices %d --mem %s --disk-rate %s --link-rate %s --link-delay %sms "
    .. "--context %d --threads 1 --requests 1 --input-tokens %d --output-tokens %d --draft '%s' --draft-device head "
    .. "--tree-curve '%s' --json 2>&1", proc.exe(), o.store, o.devices, o.mem, o.disk_rate, o.link_rate,
    tostring(o.link_delay), o.context, #prompt, o.tokens, o.tree .. sep .. "tree=on", path)
  local h = assert(io.popen(cmd))
  local text = h:read("*a")
  h:close()
  local ok, j = pcall(json.decode, text)
  if not ok or type(j) ~= "table" or not j.tokens_per_s then
    log("simulate of the tree run failed: %s", text)
    return nil
  end
  return { tokens_per_s = j.tokens_per_s, measured_tokens_per_s = r.tokens_per_s, ratio = j.tokens_per_s / r.tokens_per_s,
    tokens_per_step = j.draft.tokens_per_step, tree_size = j.draft.tree_size, plan_rows = j.draft.plan_rows, run = path }
end

local function trees(c, label, extra, prompt)
  local te = {}
  for key, v in pairs(extra or {}) do te[key] = v end
  te.logits_tokens = false -- (the plan reserves the tree's rows: loip.engine.request.draft.plan_rows)
  local sep = o.tree:find(":", 1, true) and "," or ":"
  local runs = { none = {}, tree = {} }
  for k = 1, 8 do runs[k] = {} end
  local same_all = true
  for rep = 1, o.reps do
    local none = run(c, nil, nil, prompt, o.tokens, extra)
    table.insert(runs.none, none)
    for k = 1, 8 do
      local r = run(c, o.tree, k, prompt, o.tokens, extra)
      same_all = same_all and same(r.tokens, none.tokens)
      table.insert(runs[k], r)
    end
    local t = run(c, o.tree .. sep .. "tree=on", nil, prompt, o.tokens, te)
    t.draft_rows, t.step_rows = c.planner.draft_rows, c.planner.batch -- (a tree's plan: its steps grow to hold its rows)
    same_all = same_all and same(t.tokens, none.tokens)
    table.insert(runs.tree, t)
    log("%s, round %d: none %.1f, tree %.1f tokens/s (%.2f a step, B chosen %.1f, sent %.1f)", label, rep, none.tokens_per_s,
      t.tokens_per_s, t.tokens_per_step, t.draft.tree_chosen or 0, t.draft.tree_size)
  end
  local function med(list, f)
    local xs = {}
    for i, x in ipairs(list) do xs[i] = f(x) end
    return median(xs)
  end
  local tps = function(x) return x.tokens_per_s end
  local tpst = function(x) return x.tokens_per_step end
  local out = { none_tokens_per_s = med(runs.none, tps), chains = {}, reps = o.reps }
  local best
  for k = 1, 8 do
    local x = { k = k, tokens_per_s = med(runs[k], tps), tokens_per_step = med(runs[k], tpst) }
    out.chains[k] = x
    if not best or x.tokens_per_s > best.tokens_per_s then best = x end
    log("%s: chain k=%d: %.1f tokens/s, %.2f tokens per step (medians)", label, k, x.tokens_per_s, x.tokens_per_step)
  end
  local rt = runs.tree
  out.tree = { tokens_per_s = med(rt, tps), tokens_per_step = med(rt, tpst), tree_size = med(rt, function(x) return x.draft.tree_size end),
    tree_size_max = med(rt, function(x) return x.draft.tree_size_max end),
    tree_chosen = med(rt, function(x) return x.draft.tree_chosen or 0 end),
    tree_chosen_last = med(rt, function(x) return x.draft.tree_chosen_last or 0 end),
    tree_built = med(rt, function(x) return x.draft.tree_built or 0 end),
    draft_share = med(rt, function(x) return x.draft.draft_share end), plan_rows = rt[1].draft_rows, step_rows = rt[1].step_rows }
  out.best_chain, out.same_tokens = best, same_all
  out.best_chain_steps = 0
  for k = 1, 8 do out.best_chain_steps = math.max(out.best_chain_steps, out.chains[k].tokens_per_step) end
  out.steps_ratio = out.tree.tokens_per_step / out.best_chain_steps
  out.speed_ratio = out.tree.tokens_per_s / best.tokens_per_s
  local t = out.tree
  log("%s: tree: %.1f tokens/s, %.2f tokens per step, B chosen %.1f (last %d), sent %.1f a verifying step (largest %d, built %.1f, "
    .. "plan rows %d, steps of %d), draft share %.2f; "
    .. "vs the chains: %.2fx the most tokens per step, %.2fx the best tokens/s (k=%d); none %.1f tokens/s; same tokens: %s",
    label, t.tokens_per_s, t.tokens_per_step, t.tree_chosen, t.tree_chosen_last, t.tree_size, t.tree_size_max, t.tree_built,
    t.plan_rows or -1, t.step_rows or -1, t.draft_share,
    out.steps_ratio, out.speed_ratio, best.k, out.none_tokens_per_s, tostring(same_all))
  if not extra then -- (read-bound: the simulator given this run's measured acceptance)
    local sim = simulated(rt, prompt)
    out.simulated = sim
    if sim then
      log("%s: simulated from the tree run's acceptance (%s): %.1f tokens/s against %.1f measured (%.2fx), %.2f tokens per step, "
        .. "B %.1f, plan rows %s", label, sim.run, sim.tokens_per_s, sim.measured_tokens_per_s, sim.ratio, sim.tokens_per_step,
        sim.tree_size or 0, tostring(sim.plan_rows))
    end
  end
  return out
end

-- --two: one run of two concurrent greedy requests (o.tokens each) on cluster c planned with
-- draft d (a name, or nil; one_by_one: the policy without propose_scored_many, each request's
-- tree in forwards of its own). Timed from the step that gave both their first token to the
-- last: { tokens_per_s, tokens_per_ring_step, tokens_per_step (a request's verifying step),
-- forwards_per_step (the draft's), tree_size, tokens }.
local function run_two(c, d, one_by_one)
  local p = d and policy.load("draft", d) or nil
  if one_by_one then p.module = setmetatable({ propose_scored_many = false }, { __index = p.module }) end
  c:plan { context = o.context, disk_rate = disk, link = { rate = o.link_rate, delay_ms = o.link_delay }, max_batch = 2, draft = p }
  local b = c:batcher()
  local rs = {}
  for j, case in ipairs({ greedy.cases[2], greedy.cases[3] }) do
    rs[j] = b:submit { prompt = case.prompt_ids, max_tokens = o.tokens, sampler = { temperature = 0 }, stop = {} }
  end
  local drafter = b.draft and b.draft.ctx.drafter
  local function got() return #rs[1].token_ids + #rs[2].token_ids end
  local t0, n0, f0, steps, last = nil, 0, 0, 0, nil
  while b:step() do
    last = core.now_ms()
    if t0 then steps = steps + 1
    elseif #rs[1].token_ids > 0 and #rs[2].token_ids > 0 then t0, n0, f0 = last, got(), drafter and drafter.forwards or 0 end
  end
  local n = got() - n0
  local r = b.draft and b.draft:report()
  local out = { tokens_per_s = n / ((last - t0) / 1000), tokens_per_ring_step = n / steps, tokens = { rs[1].token_ids, rs[2].token_ids },
    tokens_per_step = r and r.tokens_per_step or 1, tree_size = r and r.tree_size or 0,
    forwards_per_step = drafter and (drafter.forwards - f0) / steps or 0, draft_device = d and c.draft_device or nil }
  if b.draft then b.draft:close() end
  return out
end

if o.two then
  local sep = o.tree:find(":", 1, true) and "," or ":"
  local here, there = o.tree .. sep .. "tree=on", o.tree .. sep .. "tree=on,device=" .. o.two_device
  -- device --two-device's budget raised by what the draft takes there (the planner's reserve)
  local inst = policy.load("draft", there)
  local bytes = inst.module.memory({ path = o.store, context = o.context, max_seqs = 2 }, inst.params)
  local wmems = {}
  for i, m in ipairs(mems) do
    wmems[i] = i == o.two_device and tostring(assert(flags.parse_bytes(m), "--mem: not a size") + bytes) or m
  end
  local res = { tokens = o.tokens, requests = 2, draft = o.tree, mem = mems, worker_mem = wmems, draft_bytes = bytes,
    disk_rate = disk, link_rate = o.link_rate, link_delay_ms = o.link_delay, reps = o.reps }
  local c = cluster.start_local { store = o.store, devices = o.devices, mem = mems, threads = 1 }
  local cw = cluster.start_local { store = o.store, devices = o.devices, mem = wmems, threads = 1 }
  local names = { "none", "head", "head_one_by_one", "worker", "worker_one_by_one" }
  local runs = {}
  for _, k in ipairs(names) do runs[k] = {} end
  local ok, err = pcall(function()
    for rep = 1, o.reps do
      local r = {
        none = run_two(c, nil), head = run_two(c, here), head_one_by_one = run_two(c, here, true),
        worker = run_two(cw, there), worker_one_by_one = run_two(cw, there, true) }
      for _, k in ipairs(names) do
        table.insert(runs[k], r[k])
        if k ~= "none" then
          res.same_tokens = (res.same_tokens ~= false) and same(r[k].tokens[1], r.none.tokens[1]) and same(r[k].tokens[2], r.none.tokens[2])
        end
      end
      log("two requests, round %d: none %.1f, head %.1f (one by one %.1f), worker %.1f (one by one %.1f) tokens/s", rep,
        r.none.tokens_per_s, r.head.tokens_per_s, r.head_one_by_one.tokens_per_s, r.worker.tokens_per_s, r.worker_one_by_one.tokens_per_s)
    end
  end)
  c:close()
  cw:close()
  if not ok then error(err, 0) end
  local function med(k, f)
    local xs = {}
    for i, rr in ipairs(runs[k]) do xs[i] = rr[f] end
    return median(xs)
  end
  for _, k in ipairs(names) do
    local x = { draft_device = runs[k][1].draft_device }
    for _, f in ipairs({ "tokens_per_s", "tokens_per_ring_step", "tokens_per_step", "forwards_per_step", "tree_size" }) do x[f] = med(k, f) end
    if k ~= "none" then x.speedup = x.tokens_per_s / med("none", "tokens_per_s") end
    res[k] = x
    log("%s: %.1f tokens/s%s, %.2f tokens per ring step, %.2f per request step, B %.1f, %.2f draft forwards a step", k, x.tokens_per_s,
      x.speedup and string.format(" (%.2fx none)", x.speedup) or "", x.tokens_per_ring_step, x.tokens_per_step, x.tree_size,
      x.forwards_per_step)
  end
  log("same tokens: %s", tostring(res.same_tokens))
  report("speculative-two.json", res)
  return
end

if o.trees then
  local prompt = greedy.cases[2].prompt_ids
  local res = { tokens = o.tokens, draft = o.tree, mem = mems, disk_rate = disk, link_rate = o.link_rate, link_delay_ms = o.link_delay }
  local c = cluster.start_local { store = o.store, devices = o.devices, mem = mems, threads = 1 }
  local ok, err = pcall(function() res.read_bound = trees(c, "read-bound", nil, prompt) end)
  c:close()
  if not ok then error(err, 0) end
  local cm = {}
  for x in o.compute_mem:gmatch("[^,]+") do cm[#cm + 1] = x end
  c = cluster.start_local { store = o.store, devices = o.devices, mem = cm, threads = 1 }
  ok, err = pcall(function()
    res.compute_bound = trees(c, "compute-bound", { disk_rate = false, link = false }, prompt)
  end)
  c:close()
  if not ok then error(err, 0) end
  report("speculative-trees.json", res)
  return
end

local result = { devices = o.devices, mem = mems, disk_rate = disk, link_rate = o.link_rate, link_delay_ms = o.link_delay,
  tokens = o.tokens, store = o.store, variants = {} }
local c = cluster.start_local { store = o.store, devices = o.devices, mem = mems, threads = 1 }
-- lookahead on the reference prompts, each against no drafts on the same prompt and plan
local function lookahead_rows()
  local extra = { logits_tokens = math.max(LOGITS_ROWS, o.lookahead_rows) }
  local rows, sum_none, sum_la, worst = {}, 0, 0, nil
  for i, case in ipairs(greedy.cases) do
    if not o.quick or i <= 2 then
      local base = run(c, nil, nil, case.prompt_ids, o.tokens, extra)
      local r = run(c, o.lookahead, nil, case.prompt_ids, o.tokens, extra)
      result.same_tokens = (result.same_tokens ~= false) and same(r.tokens, base.tokens)
      local x = { prompt = case.prompt, speedup = r.tokens_per_s / base.tokens_per_s, tokens_per_s = r.tokens_per_s,
        none_tokens_per_s = base.tokens_per_s, tokens_per_step = r.tokens_per_step, drafted = r.draft.drafted,
        accepted = r.draft.accepted, tree_size = r.draft.tree_size, same = same(r.tokens, base.tokens) }
      rows[#rows + 1] = x
      sum_none, sum_la = sum_none + (#base.tokens - 1) / base.tokens_per_s, sum_la + (#r.tokens - 1) / r.tokens_per_s
      worst = (not worst or x.speedup < worst) and x.speedup or worst
      log("%s on %q: %.2fx none (%.1f vs %.1f tokens/s), %.2f tokens per step, tree %.1f nodes, same tokens: %s", o.lookahead,
        case.prompt, x.speedup, r.tokens_per_s, base.tokens_per_s, r.tokens_per_step, r.draft.tree_size, tostring(x.same))
    end
  end
  -- overall: the tokens of all prompts over the time of all of them
  result.variants.lookahead = { draft = o.lookahead, logits_rows = extra.logits_tokens, runs = rows,
    speedup = sum_none / sum_la, worst_speedup = worst }
  result.lookahead_speedup, result.lookahead_worst_speedup = sum_none / sum_la, worst
  log("%s: %.2fx no drafts over the %d prompts (target >= 1.2), worst %.2fx (target >= 1.0)", o.lookahead, sum_none / sum_la,
    #rows, worst)
end

local ok, err = pcall(function()
  if o.only_lookahead then return lookahead_rows() end
  local prompt = greedy.cases[2].prompt_ids
  log("none: %d tokens, no drafts", o.tokens)
  local none = run(c, nil, nil, prompt, o.tokens)
  -- what each device reads every step (the plan under its budget)
  result.offloaded_bytes = {}
  for i = 1, #c.devices do
    result.offloaded_bytes[i] = plan.memory(c.plan_table, i, c.sizes).offloaded_bytes
  end
  log("  %.1f tokens/s; offloaded (read every step) per device: %s bytes", none.tokens_per_s,
    table.concat(result.offloaded_bytes, ", "))
  result.variants.none = { tokens_per_s = none.tokens_per_s, tokens_per_step = 1 }
  local all_same = true
  local self_k = {}
  for k in o.ks:gmatch("%d+") do
    k = tonumber(k)
    local r = run(c, "self", k, prompt, o.tokens)
    all_same = all_same and same(r.tokens, none.tokens)
    self_k[#self_k + 1] = { k = k, tokens_per_s = r.tokens_per_s, tokens_per_step = r.tokens_per_step,
      speedup = r.tokens_per_s / none.tokens_per_s, acceptance = r.draft.acceptance }
    log("self k=%d: %.1f tokens/s (%.2fx none), %.2f tokens per step, acceptance %.2f", k, r.tokens_per_s,
      r.tokens_per_s / none.tokens_per_s, r.tokens_per_step, r.draft.acceptance)
  end
  result.variants.self = self_k
  -- ngram at each k too, on the reference prompt whose text repeats most
  local rep = greedy.cases[4]
  local rep_none = run(c, nil, nil, rep.prompt_ids, o.tokens)
  local ngram_k = {}
  for k in o.ks:gmatch("%d+") do
    k = tonumber(k)
    local r = run(c, "ngram", k, rep.prompt_ids, o.tokens)
    all_same = all_same and same(r.tokens, rep_none.tokens)
    ngram_k[#ngram_k + 1] = { k = k, tokens_per_s = r.tokens_per_s, tokens_per_step = r.tokens_per_step,
      speedup = r.tokens_per_s / rep_none.tokens_per_s, acceptance = r.draft.acceptance }
    log("ngram k=%d on %q: %.1f tokens/s (%.2fx none's %.1f), %.2f tokens per step", k, rep.prompt, r.tokens_per_s,
      r.tokens_per_s / rep_none.tokens_per_s, rep_none.tokens_per_s, r.tokens_per_step)
  end
  result.variants.ngram_k = { prompt = rep.prompt, none_tokens_per_s = rep_none.tokens_per_s, runs = ngram_k }
  local chosen = run(c, "self", nil, prompt, o.tokens)
  all_same = all_same and same(chosen.tokens, none.tokens)
  result.variants.self_chosen = { tokens_per_s = chosen.tokens_per_s, tokens_per_step = chosen.tokens_per_step,
    speedup = chosen.tokens_per_s / none.tokens_per_s }
  log("self (k chosen): %.1f tokens/s (%.2fx), %.2f tokens per step", chosen.tokens_per_s, chosen.tokens_per_s / none.tokens_per_s,
    chosen.tokens_per_step)
  for _, x in ipairs(self_k) do if x.k == 4 then result.self_k4_speedup = x.speedup end end
  -- ngram on the reference prompts, each against no drafts on the same prompt
  local ng, worst = {}, nil
  for i, case in ipairs(greedy.cases) do
    if not o.quick or i <= 2 then
      local base = run(c, nil, nil, case.prompt_ids, o.tokens)
      local r = run(c, "ngram", nil, case.prompt_ids, o.tokens)
      all_same = all_same and same(r.tokens, base.tokens)
      local x = { prompt = case.prompt, speedup = r.tokens_per_s / base.tokens_per_s, tokens_per_s = r.tokens_per_s,
        none_tokens_per_s = base.tokens_per_s, acceptance = r.draft.acceptance, drafted = r.draft.drafted,
        accepted = r.draft.accepted, tokens_per_step = r.tokens_per_step }
      ng[#ng + 1] = x
      worst = (not worst or x.speedup < worst) and x.speedup or worst
      log("ngram on %q: %.2fx none (%.1f vs %.1f tokens/s), %d of %d drafts accepted", case.prompt, x.speedup, r.tokens_per_s,
        base.tokens_per_s, r.draft.accepted, r.draft.drafted)
    end
  end
  result.variants.ngram, result.ngram_worst_speedup = ng, worst
  -- tree against chain, where the draft policy has a tree mode
  local mod = policy.load("draft", (o.tree:match("^[^:]+"))).module
  local has_tree = false
  for _, s in ipairs(mod.settings or {}) do has_tree = has_tree or s[1] == "tree" end
  if has_tree then
    local sep = o.tree:find(":", 1, true) and "," or ":"
    local chain = run(c, o.tree, 4, prompt, o.tokens)
    local tree = run(c, o.tree .. sep .. "tree=on", 4, prompt, o.tokens)
    all_same = all_same and same(tree.tokens, none.tokens) and same(chain.tokens, none.tokens)
    result.variants.tree = { draft = o.tree, chain_tokens_per_step = chain.tokens_per_step, tree_tokens_per_step = tree.tokens_per_step,
      chain_tokens_per_s = chain.tokens_per_s, tree_tokens_per_s = tree.tokens_per_s }
    log("tree (%s): %.2f tokens per step against the chain's %.2f; %.1f vs %.1f tokens/s", o.tree, tree.tokens_per_step,
      chain.tokens_per_step, tree.tokens_per_s, chain.tokens_per_s)
  end
  result.same_tokens = all_same
  if o.lookahead ~= "" then lookahead_rows() end
end)
c:close()
if not ok then error(err, 0) end

if o.synthetic then
  -- a draft of random weights: acceptance near 0; drafting must turn itself down
  local L = {}
  for x in o.synthetic_layers:gmatch("%d+") do L[#L + 1] = tonumber(x) end
  local function synthetic(like, layers)
    local dir = string.format("/tmp/loip-bench/%s-l%d-bf16", like, layers)
    if not store.is_store(dir .. "-store") then
      if not json.exists(dir .. "/config.json") then
        log("making the synthetic %s (%d layers) in %s (once)", like, layers, dir)
        synth.write(dir, { like = like, dtype = "bf16", seed = 2, layers = layers })
      end
      slice_mod.write(dir, dir .. "-store", { quiet = true })
    end
    return dir .. "-store"
  end
  local draft_store, target = synthetic("llama-3.2-1b", L[1]), synthetic("llama-3.2-3b", L[2])
  local man = store.read_manifest(target)
  local sizes = plan.sizes(man, store.config(target, man), { context = 256, batch = 16, threads = 1 })
  local budgets = bench.budgets(sizes, o.devices, o.synthetic_budget)
  local sc = cluster.start_local { store = target, devices = o.devices, mem = budgets, threads = 1 }
  local sok, serr = pcall(function()
    local prompt = bench.prompt(sizes.vocab or 128256)
    local extra = { context = 256, disk_rate = nil, link = { rate = "1gbit", delay_ms = 1 } }
    log("synthetic: llama-3.2-3b (%d layers) on %d offloading devices, no drafts", L[2], o.devices)
    local base = run(sc, nil, nil, prompt, o.synthetic_tokens, extra)
    log("synthetic: drafted by llama-3.2-1b (%d layers), the draft length chosen", L[1])
    local r = run(sc, "model:path=" .. draft_store, nil, prompt, o.synthetic_tokens, extra)
    result.synthetic = { same_tokens = same(base.tokens, r.tokens), speedup = r.tokens_per_s / base.tokens_per_s,
      none_tokens_per_s = base.tokens_per_s, tokens_per_s = r.tokens_per_s, acceptance = r.draft.acceptance,
      drafted = r.draft.drafted, accepted = r.draft.accepted, probes = r.draft.probes, layers = L }
    log("synthetic: %.2fx no drafts (%.2f vs %.2f tokens/s), %d of %d drafts accepted, same tokens: %s", result.synthetic.speedup,
      r.tokens_per_s, base.tokens_per_s, r.draft.accepted, r.draft.drafted, tostring(result.synthetic.same_tokens))
  end)
  sc:close()
  if not sok then error(serr, 0) end
end

log("self k=4: %.2fx no drafts (target >= 3); ngram: worst %.2fx (target >= 0.95); lookahead %.2fx, worst %.2fx; same tokens: %s",
  result.self_k4_speedup or 0, result.ngram_worst_speedup or 0, result.lookahead_speedup or 0, result.lookahead_worst_speedup or 0,
  tostring(result.same_tokens))
os.execute("mkdir -p '" .. o.out .. "'")
if o.only_lookahead then return report("speculative-lookahead.json", result) end
local function series(runs, key)
  local pts = {}
  for _, x in ipairs(runs) do pts[#pts + 1] = { x.k, x[key] } end
  return pts
end
local none_line = {}
for _, x in ipairs(result.variants.self) do none_line[#none_line + 1] = { x.k, result.variants.none.tokens_per_s } end
local ng = result.variants.ngram_k
result.plot = plot.lines(o.out .. "/speculative.svg", {
  title = string.format("speculative decoding on %d offloading devices (disks %s/s, %s links): tokens/s vs k", o.devices,
    o.disk_rate, o.link_rate),
  xlabel = "draft tokens k", ylabel = "tokens/s",
  series = { { label = "self (every draft accepted)", points = series(result.variants.self, "tokens_per_s") },
    { label = "ngram (" .. ng.prompt .. ")", points = series(ng.runs, "tokens_per_s") },
    { label = "no drafts", points = none_line } } })
result.plot_steps = plot.lines(o.out .. "/speculative-steps.svg", {
  title = "tokens per verifying step vs k", xlabel = "draft tokens k", ylabel = "tokens per step",
  series = { { label = "self", points = series(result.variants.self, "tokens_per_step") },
    { label = "ngram", points = series(ng.runs, "tokens_per_step") } } })
report("speculative.json", result)
