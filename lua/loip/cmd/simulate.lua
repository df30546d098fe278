-- `loip simulate`: the plan a scheduler chooses, played out over time by the simulator
-- (loip.sim) on devices described by profiles, for a request pattern. The same flags as
-- `loip plan` (the model or a shape, devices, budgets, profiles, links, disks), plus the
-- requests; it prints the plan, then the simulated time per token beside the cost model's
-- estimate, per device and per request, or one JSON object (--json).
-- Requires inside functions: `loip help` loads every command, so a command loads the modules
-- it uses when it runs (`loip help` loads no FFI).
local common = require "loip.cli.inputs"
local flags = require "loip.ui.flags"

local function usage(fmt, ...) common.usage("simulate", fmt, ...) end

local rows = {}
for _, f in ipairs(require("loip.cmd.plan").flags) do
  if f[1] ~= "json" and f[1] ~= "save-plan" then rows[#rows + 1] = f end
end
for _, f in ipairs({
  { "plan", "string", "simulate this plan (a file --save-plan wrote) instead of the scheduler's", metavar = "FILE" },
  { "pattern", "string", "request pattern: sporadic, bursty, poisson (recipes/policies/pattern) or a file", default = "sporadic" },
  { "requests", "int", "sporadic and poisson: how many requests (default 4; a loip generate command line, one with --prompt, "
    .. "--max-tokens or another of generate's flags: 1, as generate runs)", check = function(v) return v >= 1, "must be >= 1" end },
  { "burst", "int", "bursty: requests of a burst (default --max-batch)", check = function(v) return v >= 1, "must be >= 1" end },
  { "bursts", "int", "bursty: how many bursts, one after the other", default = 1, check = function(v) return v >= 1, "must be >= 1" end },
  { "rate", "number", "poisson: arrivals per second", default = 1, check = function(v) return v > 0, "must be > 0" end },
  { "input-tokens", "int", "prompt tokens of each request", default = 8, check = function(v) return v >= 1, "must be >= 1" end },
  { "output-tokens", "int", "tokens each request generates", default = 32, check = function(v) return v >= 1, "must be >= 1" end },
  { "seed", "int", "the seed of poisson's arrivals and of --draft's acceptance draws", default = 1 },
  -- loip generate's names, so that a generate command line simulates as it is
  { "prompt", "string", "as loip generate takes it: its token count (the model's tokenizer) is --input-tokens", metavar = "TEXT" },
  { "max-tokens", "int", "as --output-tokens (loip generate's name)", check = function(v) return v >= 1, "must be >= 1" end },
  { "tokenizer", "string", "as loip generate takes it: the tokenizer file that counts --prompt's tokens", metavar = "FILE" },
  { "prefill", "string", "newcomers' prompts: chunked (beside the others' decoding) or own (steps of their own)", default = "chunked",
    check = function(v) return v == "chunked" or v == "own", "must be chunked or own" end },
  flags.shared.plan_positions, flags.alias("plan-tokens", flags.shared.plan_positions),
  flags.alias("plan-context", flags.shared.plan_positions), flags.shared.online,
  { "link-schedule", "string", "the emulated links change between steps (recipes/policies/links: a name or a file)", metavar = "NAME|FILE" },
  { "baseline", "string", "instead of a plan: a tensor-parallel system we do not build (recipes/policies/baseline: galaxy, "
    .. "tpi-llm, tpi-llm-offload), its step time for the pattern's batch", metavar = "NAME|FILE" },
  flags.shared.routing_profile,
  flags.shared.draft, flags.shared.draft_tokens,
  { "acceptance", "string", "with --draft: the per-draft acceptance assumed (the chance a draft is accepted given the ones "
    .. "before it were), in [0, 1], or a measured run's JSON (loip generate --json --draft: its draft.acceptance)", metavar = "A|FILE.json" },
  { "tree-curve", "string", "with --draft ...:tree=on (grown best-first, sized by the cost model): the tree's tokens per "
    .. "verifying step by its nodes, B:T,B:T... (a stated curve), or a measured run's JSON (loip generate --json: its "
    .. "draft.tree_curve); without it a chain's at --acceptance", metavar = "B:T,...|FILE.json" },
  { "tree-depths", "string", "with a tree's --tree-curve: its depth shape, the share of tree steps whose accepted path "
    .. "reached depth 1, 2, ... (a measured run's draft.per_depth, which a JSON --tree-curve brings; without either the "
    .. "curve's nodes are a chain)", metavar = "Q1,Q2,..." },
  { "draft-like", "string", "with --draft model: the draft's shape (loip synth's: llama-3.2-1b ...), priced by its device's profile",
    metavar = "NAME" },
  { "draft-device", "string", "with --draft model or self: the device the draft runs on (1-based), head (device 1's machine, "
    .. "its own memory), or auto (the default: the fastest for the draft by the profiles)", metavar = "N|auto|head" },
  { "trace", "string", "write every device's simulated timeline as a Chrome trace (loip trace plot draws it)", metavar = "FILE.json" },
  { "json", "bool", "print one JSON object: ms_per_token, estimate_ms_per_token, devices, requests, plan" },
  { "verbose", "bool", "say which of loip generate's flags were ignored" },
}) do rows[#rows + 1] = f end

-- loip generate's flags that do not change the timing, taken so that its command line simulates
-- as it is, and ignored (--verbose says so): the sampler's (every token costs the same, whichever
-- is drawn), --ignore-eos (a simulated request always generates --max-tokens), --on-device-loss
-- (no simulated device is lost). (--seed is simulate's own: the Poisson arrivals'.)
local IGNORED = {
  { "temperature", "number" }, { "top-k", "int" }, { "top-p", "number" }, { "min-p", "number" },
  { "repeat-penalty", "number" }, { "ignore-eos", "bool" }, { "on-device-loss", "string" },
}
for _, f in ipairs(IGNORED) do
  rows[#rows + 1] = { f[1], f[2], "as loip generate takes it; ignored: it does not change the timing" }
end

local M = {
  brief = "play a plan out over time on simulated devices (profiles) for a request pattern",
  usage = "loip simulate (--model STORE|DIR | --like NAME [shape flags]) --devices N [--mem a,b,...] [--profile FILE] [flags]",
  summary = "Play the plan a scheduler chooses (or --plan) out over time on simulated devices: requests of a pattern\n"
    .. "arrive, are batched and prefilled as loip serve does them, and each step crosses the devices' disk,\n"
    .. "compute and network lanes as their profiles say. Prints the simulated time per token beside the cost\n"
    .. "model's estimate, per device and per request; nothing runs and no weights are read. With --draft, speculative\n"
    .. "decoding at an acceptance assumed (--acceptance), the draft priced on its device (docs/planning.md).",
  flags = rows,
}

local mean = require("loip.measure.stats").mean

-- Whether o is a loip generate command line: one of generate's own flags given (--prompt,
-- --max-tokens, --tokenizer, or one simulate ignores). It simulates as generate runs: one request.
function M.generate_line(o)
  if o.prompt ~= nil or o.max_tokens ~= nil or o.tokenizer ~= nil then return true end
  for _, f in ipairs(IGNORED) do
    if o[(f[1]:gsub("-", "_"))] ~= nil then return true end
  end
  return false
end

-- --prompt's tokens counted as o.input_tokens (with --model's tokenizer), refused before any
-- work when they do not fit the context planned for.
local function prompt_tokens(o)
  if not o.model then usage("--prompt needs --model (a shape has no tokenizer): give --input-tokens") end
  local st = require "loip.model.store"
  local vocab
  if require("loip.model").locate(o.model) == "store" then vocab = st.config(o.model, st.read_manifest(o.model)).vocab_size end
  local tok = require("loip.text.tokenizer").open(o.model, { vocab_size = vocab, path = o.tokenizer })
  o.input_tokens = #tok:encode(o.prompt, { bos = true })
  -- (before any work: the context planned for is --context, else the default, at most the model's)
  local max = common.model_config(o.model).max_seq
  common.prompt_fits("simulate", o.input_tokens, math.min(o.context or require("loip.model").default_context(max), max), max)
end

-- --baseline: a system we do not build, its model's step time at the pattern's batch,
-- mid-generation. The exit status.
local function run_baseline(o, prob)
  local json = require "loip.text.json"
  local policy = require "loip.policy"
  local base = policy.load("baseline", o.baseline)
  local pat = policy.load("pattern", o.pattern) -- (its name may carry settings: bursty:burst=8)
  local batch = pat.name == "bursty" and (pat.given.burst and pat.params.burst or o.burst or o.max_batch) or 1
  local r, why = base.run(prob, { batch = batch, context = o.input_tokens + math.floor(o.output_tokens / 2) })
  local out = { baseline = base.name or o.baseline, pattern = o.pattern, batch = batch, ms_per_token = r and r.ms_per_token,
    comp_ms = r and r.comp_ms, comm_ms = r and r.comm_ms, load_ms = r and r.load_ms, oom = why, devices = r and r.devices,
    model = o.model or o.like, devices_count = o.devices }
  if o.json then
    io.stdout:write(json.encode(out), "\n")
  elseif r then
    io.stdout:write(string.format("%s, %d token%s a step: %.2f ms/token = compute %.2f + all-reduces %.2f ms (disk %.2f ms, overlapped)\n",
      out.baseline, batch, batch == 1 and "" or "s", r.ms_per_token, r.comp_ms, r.comm_ms, r.load_ms))
  else
    io.stdout:write(out.baseline, ": ", why, "\n")
  end
  return r and 0 or 1
end

-- Speculative decoding (--draft): the draft's time and memory on its device, its acceptance
-- assumed (loip.sim.draft); nil without --draft.
local function sim_draft(o, prob)
  if o.draft == nil or o.draft == "none" then
    for _, f in ipairs({ "draft_tokens", "acceptance", "draft_like", "draft_device", "tree_curve", "tree_depths" }) do
      if o[f] ~= nil then usage("--%s needs --draft", (f:gsub("_", "-"))) end
    end
    return nil
  end
  local sd = require "loip.sim.draft"
  local curve, csource, depths = sd.curve(o.tree_curve)
  if o.tree_curve and not curve then usage("%s", csource) end
  if o.tree_depths then
    local why
    depths, why = sd.depths(o.tree_depths)
    if not depths then usage("%s", why) end
  end
  if depths and not curve then usage("--tree-depths needs --tree-curve (the tree's tokens per step by its nodes)") end
  local a, why = sd.acceptance(o.acceptance)
  if not a and not curve then usage("%s", why) end
  local ok, d = pcall(sd.new, prob, { draft = o.draft, acceptance = a, like = o.draft_like, dtype = o.dtype, device = o.draft_device,
    seed = o.seed, max_seqs = o.max_batch, curve = curve, curve_source = o.tree_curve, depths = depths,
    depths_source = o.tree_depths and "--tree-depths" or (depths and o.tree_curve) })
  if not ok then usage("%s", tostring(d)) end
  return d
end

-- The runs' figures: per request, per device (per step too) and overall, as --json prints them.
local function summary(o, s, runs, p, est, info, online, draft)
  local plan = require "loip.plan"
  local mpt, ttft, failed, tokens, last = {}, {}, 0, 0, 0
  for _, r in ipairs(runs) do
    if r.status ~= 200 then failed = failed + 1 end
    if r.ms_per_token then mpt[#mpt + 1] = r.ms_per_token end
    if r.ttft_ms then ttft[#ttft + 1] = r.ttft_ms end
    tokens = tokens + (r.tokens or 0)
    last = math.max(last, r.t_done or 0)
  end
  local steps = math.max(s.steps, 1)
  local devs = s:device_figures()
  for _, d in ipairs(devs) do
    for _, k in ipairs({ "comp_ms", "load_ms", "stall_ms", "send_ms" }) do d[k .. "_per_step"] = d[k] / steps end
  end
  -- (decode_ms_per_token and estimate_ms_per_token as loip generate --json names them)
  return { ms_per_token = mean(mpt), decode_ms_per_token = mean(mpt), estimate_ms_per_token = est and est.ms_per_token,
    ttft_ms = mean(ttft),
    tokens_per_s = last > 0 and tokens / last * 1e3 or nil, simulated_ms = last, steps = s.steps, requests = #runs,
    failed = failed, pattern = o.pattern, devices = devs, plan = plan.bare(p), stages = #p.devices[1].stages,
    scheduler = info and info.scheduler, cost_model = info and info.cost, model = o.model or o.like, devices_count = o.devices,
    online = online, error = s.failure, adaptations = s.batcher and #s.batcher.adaptations or 0, replans = s.replans,
    draft = draft and draft:report(s.batcher.draft and s.batcher.draft:report(), o.draft_tokens, s.draft_rows) }, failed, last
end

-- The figures told as lines on stdout.
local function print_summary(o, s, out, runs, last, online)
  io.stdout:write(string.format("simulated %d %s request%s (%d + %d tokens each): %.2f ms/token (the cost model estimates %.2f), "
    .. "first token after %.1f ms, %.1f tokens/s over %.1f s, %d steps\n", #runs, o.pattern, #runs == 1 and "" or "s",
    o.input_tokens, o.output_tokens, out.ms_per_token or 0, out.estimate_ms_per_token or 0, out.ttft_ms or 0,
    out.tokens_per_s or 0, last / 1e3, s.steps))
  for i, d in ipairs(out.devices) do
    io.stdout:write(string.format("  device %d per step: compute %.2f ms, load %.2f ms, stall %.2f ms, send %.2f ms\n", i,
      d.comp_ms_per_step, d.load_ms_per_step, d.stall_ms_per_step, d.send_ms_per_step))
  end
  if out.draft then require("loip.sim.draft").describe(out.draft, io.stdout) end
  if out.adaptations > 0 then
    io.stdout:write(string.format("  %d live plan change%s by the online policy %s%s\n", out.adaptations,
      out.adaptations == 1 and "" or "s", tostring(online),
      s.replans and string.format(" (%d a new plan for a longer context)", s.replans) or ""))
  end
  if s.failure then io.stdout:write("the step failed: ", s.failure, "\n") end
  if out.failed > 0 then io.stdout:write(string.format("%d request(s) failed\n", out.failed)) end
end

-- The plan simulated (--plan's, else the scheduler's, planning with the draft's device's budget
-- less what the draft takes), its estimate and how it was chosen; and the simulator over it.
-- With a draft the plan reserves its rows as the cluster's planner does (loip.cluster.planner's
-- fit_draft_rows): the last device's logits rows for each request's token and its drafts
-- (loip.engine.request.draft.plan_rows: 512 for a best-first tree, 8 for a chain, --draft-tokens
-- when fixed), fewer when memory is short, the step raised to carry them (Planner:step_rows);
-- the simulated step then carries at most those rows.
local function plan_and_sim(o, prob, sizes, draft)
  local plan = require "loip.plan"
  local policy = require "loip.policy"
  local sim = require "loip.sim"
  local function reserving(pr, fn) if draft then return draft:reserve(pr, fn) end return fn() end
  local function planned(pr) return reserving(pr, function() return policy.plan(pr, { scheduler = o.scheduler, cost = o.cost_model }) end) end
  -- the plan on the problem of o2 (o's flags, or a replan's), its draft rows reserved: problem,
  -- plan, estimate, info, logits rows. make(problem): the plan, its estimate and info (raises
  -- when it does not fit)
  local function fitted(o2, make, base)
    if not draft then
      local pr = base or common.problem_of("simulate", o2)
      pr.routing = prob.routing
      local p, est, info = make(pr)
      return pr, p, est, info, 1
    end
    local request_draft = require "loip.engine.request.draft"
    local inst = policy.load("draft", o.draft)
    local k = request_draft.plan_rows(inst, o.draft_tokens)
    local floor = request_draft.grows(inst) and not o.draft_tokens and request_draft.MAX or nil
    local c = require("loip.cluster.planner").fit_draft_rows(k, function(rows)
      local b, lt = require("loip.cluster.planner").rows_step(prob.context, o.batch, rows, o.max_batch)
      local pr = common.problem_of("simulate", setmetatable({ logits_tokens = lt, batch = b }, { __index = o2 }))
      pr.routing = prob.routing
      local p, est, info = make(pr)
      return { problem = pr, plan = p, estimate = est, info = info, logits_tokens = lt }
    end, floor)
    return c.problem, c.plan, c.estimate, c.info, c.logits_tokens, c.draft_rows
  end
  local p, est, info, lt, rows
  if o.plan then
    local given = plan.load(o.plan)
    local bad = plan.check(given, sizes.n_blocks, o.plan)
    if bad then usage("%s", bad) end
    local engine = require "loip.engine"
    prob, p, est, info, lt, rows = fitted(o, function(pr)
      if draft then engine.check_plan(given, pr, "plan", "simulate") end -- (raises: fewer rows)
      return given, policy.load("cost", o.cost_model or "loip").estimate(given, pr)
    end, prob)
  else
    prob, p, est, info, lt, rows = fitted(o, planned, prob)
  end
  local mopts = require("loip.plan.space").memory_opts(prob)
  if not o.json then common.report(p, est, info, sizes, mopts) end
  -- (an online policy may have the scheduler plan again for a longer context, as on devices)
  local function replanner(positions)
    local prob2, p2, est2, _, lt2 = fitted(setmetatable({ plan_positions = positions }, { __index = o }), planned)
    return prob2, p2, est2, lt2
  end
  local s = sim.new(prob, p, { context = prob.context, step_tokens = prob.batch, max_seqs = o.max_batch,
    kv_tokens = o.kv_tokens, plan_positions = o.plan_positions, estimate = est, trace = o.trace ~= nil,
    replanner = not o.plan and replanner or nil, cost = o.cost_model, draft = draft, logits_tokens = lt })
  s.draft_rows = rows -- (the draft rows the plan reserves a request: the JSON's draft.plan_rows)
  return s, p, est, info, prob
end

function M.run(o)
  local json = require "loip.text.json"
  local policy = require "loip.policy"
  for _, f in ipairs(IGNORED) do
    if o.verbose and o[(f[1]:gsub("-", "_"))] ~= nil then
      io.stderr:write(string.format("simulate: ignoring --%s (does not change the timing)\n", f[1]))
    end
  end
  if o.requests == nil then o.requests = M.generate_line(o) and 1 or 4 end
  if o.max_tokens then o.output_tokens = o.max_tokens end
  if o.prompt then prompt_tokens(o) end
  local prob, sizes = common.problem_of("simulate", o)
  if o.input_tokens >= prob.context then
    usage("--input-tokens %d leave no room in the context of %d: raise --context (to at least %d) or lower --input-tokens",
      o.input_tokens, prob.context, o.input_tokens + 1)
  end
  -- (a mixture of experts: the expert caches draw their routes from a routing profile, else uniformly)
  local routing = require("loip.model.experts").load_routing(o.routing_profile)
  if routing and not sizes.moe then common.usage("simulate", "--routing-profile: the model is not a mixture of experts") end
  if routing then require("loip.model.experts").check_routing(routing, sizes.n_layers, sizes.moe.experts, o.routing_profile) end
  prob.routing = routing and routing.frequencies
  if o.baseline then return run_baseline(o, prob) end
  local draft = sim_draft(o, prob)
  local s, p, est, info
  s, p, est, info, prob = plan_and_sim(o, prob, sizes, draft)
  local online = require("loip.engine.request.online").choose(o.online, o.plan_positions)
  local arrivals = policy.load("pattern", o.pattern).requests({ count = o.requests, burst = o.burst or o.max_batch,
    bursts = o.bursts, rate = o.rate, seed = o.seed, input_tokens = o.input_tokens, output_tokens = o.output_tokens })
  local runs = s:play(arrivals, { prefill = o.prefill, links = o.link_schedule, online = online, draft_tokens = o.draft_tokens })
  local out, failed, last = summary(o, s, runs, p, est, info, online, draft)
  if o.trace then
    local tr = require("loip.engine.trace").new()
    for i = 1, #p.devices do tr:add(s:events(i), i) end
    tr:write(o.trace)
  end
  if o.json then
    io.stdout:write(json.encode(out), "\n")
    return failed > 0 and 1 or 0
  end
  print_summary(o, s, out, runs, last, online)
  return failed > 0 and 1 or 0
end

return M
