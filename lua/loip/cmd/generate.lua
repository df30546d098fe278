-- `loip generate`: generate text from a prompt.
-- Requires inside functions: `loip help` loads every command, so a command loads the modules
-- it uses when it runs (`loip help` loads no FFI).
local common = require "loip.cli.inputs"
local errors = require "loip.error"
local flags = require "loip.ui.flags"

local M = {
  brief = "generate text from a prompt",
  usage = "loip generate --model DIR --prompt TEXT [flags]",
  summary = "Generate text from a prompt on this machine. Prints the prompt followed by its continuation\n"
    .. "(as llama2.c's run.c does); with --json, one JSON object with the text, ids and timings.",
  flags = {
    { "model", "string", "model directory (Hugging Face layout), GGUF file, slice store or llama2.c checkpoint", required = true, metavar = "DIR" },
    { "prompt", "string", "prompt text (none: generate from the start of a document, the BOS token alone)", default = "" },
    { "max-tokens", "int", "tokens to generate at most", default = 256,
      check = function(v) return v >= 0, "must be >= 0" end },
    { "temperature", "number", "sampling temperature; 0 is greedy", default = 0.8,
      check = function(v) return v >= 0, "must be >= 0" end },
    { "ignore-eos", "bool", "do not stop at the model's end tokens: generate --max-tokens tokens (or to the end of the "
      .. "context), as a benchmark of a fixed length needs" },
    { "top-k", "int", "keep the k most likely tokens (0: off)", default = 0 },
    { "top-p", "number", "nucleus sampling threshold (1: off)", default = 0.95,
      check = function(v) return v > 0 and v <= 1, "must be in (0, 1]" end },
    { "min-p", "number", "drop tokens below min-p times the top probability (0: off)", default = 0 },
    { "repeat-penalty", "number", "repetition penalty (1: off)", default = 1,
      check = function(v) return v > 0, "must be > 0" end },
    { "seed", "int", "random seed (default: from the clock)" },
    { "context", "int", "KV cache positions (default: min(model max, 4096))",
      check = function(v) return v > 0, "must be > 0" end },
    { "tokenizer", "string", "tokenizer file to use instead of the model's", metavar = "FILE" },
    flags.shared.mem, flags.shared.devices, flags.shared.hosts,
    flags.shared.token, flags.shared.curve_keys,
    flags.shared.stages, flags.shared.ends, flags.shared.link_rate, flags.shared.link_delay, flags.shared.slowdown,
    flags.shared.plan_positions, flags.alias("plan-context", flags.shared.plan_positions), flags.shared.online,
    { "on-device-loss", "string", "with --devices/--hosts: when a device dies, hangs or disconnects mid-request: replan (the "
      .. "others take over, the request goes on with the same tokens) or fail", default = "replan",
      check = function(v) return v == "replan" or v == "fail", "must be replan or fail" end },
    { "batch", "int", "tokens a step carries (prompt chunks; with --devices/--hosts also the positions --online recompute "
      .. "recomputes; activations are sized for it; default 64)", check = function(v) return v > 0, "must be > 0" end },
    { "link-schedule", "string", "local devices: the emulated links change while the request runs (recipes/policies/links: switch, "
      .. "random; or a file: at(step) -> a rate, one per link, or nil)", metavar = "NAME|FILE.lua" },
    flags.shared.cpu_latency,
    { "plan", "string", "slice store: the plan to run (a Lua file returning the table; see loip.plan); "
      .. "default: the scheduler's", metavar = "FILE.lua" },
    flags.shared.scheduler, flags.shared.cost_model, flags.shared.profile,
    { "slots", "int", "slice store: loader slots (default 1, used as a ring; several: one stage's blocks each)",
      check = function(v) return v >= 1 and v <= 64, "must be in 1..64" end },
    { "verify-reads", "bool", "slice store: check every offloaded read against its block file's CRC32C in the manifest "
      .. "(a damaged file is named and the request stops)" },
    { "loader", "string", "slice store: how offloaded blocks are read: auto (io_uring, else buffered), uring, "
      .. "buffered (the conventional path)", default = "auto",
      check = function(v) return v == "auto" or v == "uring" or v == "buffered", "must be auto, uring or buffered" end },
    flags.shared.disk_rate, flags.shared.save_plan,
    { "trace", "string", "write a Chrome trace (Perfetto) of every load, compute and wait", metavar = "OUT.json" },
    { "chat", "bool", "wrap the prompt as a user message in the model's chat template" },
    { "system", "string", "system message (with --chat)", metavar = "TEXT" },
    { "chat-template", "string", "Jinja chat template to use instead of the model's (implies --chat)", metavar = "FILE" },
    flags.shared.experts, flags.shared.routing_profile, flags.shared.kernels_policy,
    flags.shared.draft, flags.shared.draft_tokens, flags.shared.draft_model, flags.shared.draft_device, flags.shared.draft_mem,
    flags.shared.threads, flags.shared.kernels,
    { "json", "bool", "print one JSON object instead of the text" },
    { "verbose", "bool", "print the model and timings on stderr" },
  },
}

-- The fields of `loip generate --json` that one device and a cluster both report (README, "The
-- --json report"): r.text the generated text, r.state generate's state, r.per_token the decode
-- ms per token, r.threads, r.estimate (the cost model's, or nil), r.context and r.batch (the KV
-- positions and the tokens a step carries).
function M.generate_report(o, r)
  local st = r.state
  return {
    prompt = o.prompt, text = r.text, prompt_ids = st.prompt_ids, token_ids = st.token_ids,
    prompt_tokens = #st.prompt_ids, generated_tokens = #st.token_ids, stop_reason = st.stop_reason,
    prefill_ms = st.stats.prefill_ms, decode_ms_per_token = r.per_token,
    estimate_ms_per_token = r.estimate and r.estimate.ms_per_token or nil,
    model = o.source_model or o.model, seed = st.seed, temperature = o.temperature, threads = r.threads, context = r.context, batch = r.batch,
    kernels = require("loip.runtime.exec").kernels_name(),
  }
end

-- speculative decoding's figures (--json's draft: policy, drafted, accepted, steps, tokens,
-- tokens_per_step, acceptance), or nil without --draft
function M.draft_report(b)
  return b.draft and b.draft:report() or nil
end

-- The --json object of a run that failed after it started: what it generated so far (r as
-- generate_report takes it: state, pieces, threads, context, batch), stop_reason "error" and
-- the error in words; b: the run's request loop (its adaptations and drafts so far), or nil.
function M.failure_report(o, r, err, b)
  local s = r.state.stats
  r.text, r.per_token = table.concat(r.pieces), s.decode_steps > 0 and s.decode_ms / s.decode_steps or 0
  local out = M.generate_report(o, r)
  out.stop_reason, out.error = "error", tostring(err)
  if b then
    out.adaptations = #b.adaptations > 0 and b.adaptations or nil
    out.draft = M.draft_report(b)
  end
  return out
end

-- The refusals of a cluster run that need nothing started (the flags and the model's blocks):
-- the hosts, the device count, the per-device settings and the draft.
local function check_cluster(o)
  if o.hosts and o.cpu_latency then
    common.usage("generate", "--cpu-latency is for local devices; start each `loip worker` with --cpu-latency instead")
  end
  local hosts = common.hosts("generate", o)
  local n = o.devices or #hosts
  local set = common.settings("generate", o, n)
  -- refuse what cannot work before anything is sliced or any worker starts
  local layers = common.model_layers(o.model)
  if n > 2 * layers then
    common.usage("generate", "%d devices but the model has only %d blocks (%d layers): every device needs at least one block per stage; use at most %d",
      n, 2 * layers, layers, 2 * layers)
  end
  return hosts, n, set, common.draft("generate", o)
end

-- The cluster's plan as the flags choose it (saved, and reported unless --json): the plan, its
-- estimate and how it was chosen.
local function plan_cluster(o, c, set, draft)
  if o.hosts and set.mem then for i, d in ipairs(c.devices) do d.mem = set.mem[i] end end
  local loader = o.loader ~= "auto" and o.loader or nil
  local p, est, info = c:plan { plan = o.plan, scheduler = o.scheduler, cost = o.cost_model, profile = o.profile,
    stages = o.stages, ends = o.ends, context = o.context, batch = o.batch, loader = loader, verify_reads = o.verify_reads,
    on_device_loss = o.on_device_loss,
    disk_rate = set.disk_rate,
    link = set.link, trace = o.trace ~= nil, slowdown = set.slowdown, plan_positions = o.plan_positions,
    online = require("loip.engine.request.online").choose(o.online, o.plan_positions), link_schedule = o.link_schedule,
    draft = draft, draft_tokens = o.draft_tokens,
    experts = o.experts, kernels_policy = o.kernels_policy, routing = require("loip.model.experts").load_routing(o.routing_profile) }
  if o.save_plan then require("loip.plan").save(o.save_plan, p) end
  if not o.json then common.report(p, est, info, c.sizes, { cluster = true, loader = loader }) end
  return p, est, info
end

-- The trace of the run (--trace): the devices' events, the online policy's changes and the drafts.
local function write_trace(o, c)
  local tr = c:collect_trace(require("loip.engine.trace").new())
  require("loip.engine.request.online").add_to_trace(tr, c:batcher().adaptations)
  require("loip.engine.request.draft_trace").add_to_trace(tr, c:batcher().draft)
  tr:write(o.trace)
  if not o.json then io.stderr:write(string.format("trace: %d events -> %s\n", tr:count(), o.trace)) end
end

-- Each device's figures per step (their STATS before and after the run, over steps), with the
-- plan's estimate of it (est).
local function per_device_report(c, st, before, after, steps, est)
  local per_device = {}
  for i = 1, #c.devices do
    local a, b = after[i], before[i]
    local function per(key) return ((a[key] or 0) - (b[key] or 0)) / steps end
    per_device[i] = { compute_ms = per("compute_ms"), load_ms = per("load_ms"), stall_ms = per("stall_ms"),
      send_ms = per("send_ms"), recv_wait_ms = per("recv_wait_ms"), head_ms = per("head_ms"),
      memory = a.memory, budget_bytes = a.budget_bytes, peak_bytes = a.peak_bytes, peak_rss_bytes = a.peak_rss_bytes,
      accounts = a.accounts, links = a.links, shipped_bytes = c.devices[i].shipped_bytes or 0, -- (loip.cluster.ship)
      experts = a.experts and require("loip.model.experts").report(a.experts, st.stats.decode_steps + 1, b.experts) or nil }
    local e = est and est.devices[i]
    if e then
      per_device[i].estimate = { comp_ms = e.comp_ms, load_ms = e.load_ms, uncover_ms = e.uncover_ms, comm_ms = e.comm_ms,
        memory_bytes = e.memory_bytes, ship_bytes = e.ship_bytes }
    end
  end
  return per_device
end

-- The run's report: --json's object on stdout, else its lines on stderr. run: p, est, info (the
-- plan's), st (the generation's state), ids (its prompt's), pieces (its text), steps, step_ms,
-- per_token, per_device.
local function report_cluster_run(o, c, run)
  local json = require "loip.text.json"
  local st, est = run.st, run.est
  if o.json then
    local r = M.generate_report(o, { text = table.concat(run.pieces), state = st, per_token = run.per_token,
      threads = o.threads, estimate = est, context = c.context, batch = c.batch })
    r.step_ms, r.devices = run.step_ms, run.per_device
    r.scheduler, r.cost_model, r.scheduler_ms = run.info and run.info.scheduler, run.info and run.info.cost, run.info and run.info.scheduler_ms
    r.plan = require("loip.plan").bare(run.p)
    r.adaptations = #c:batcher().adaptations > 0 and c:batcher().adaptations or nil
    r.device_losses, r.membership = c.losses, c.membership -- (membership: joins, leaves and losses in one list)
    r.link_changes = #c:batcher().link_changes > 0 and c:batcher().link_changes or nil
    r.draft = M.draft_report(c:batcher())
    -- (the drafts a request may verify in a step on the last plan: fewer than asked where memory was short)
    if r.draft then r.draft.plan_rows = c.draft_rows end
    io.stdout:write(json.encode(r), "\n")
    return
  end
  common.out("\n")
  io.stderr:write(string.format("%d devices: prompt %d tokens in %.1f ms; %d tokens, %.2f ms/token%s; stop: %s\n", #c.devices,
    #run.ids, st.stats.prefill_ms, #st.token_ids, run.per_token,
    est and string.format(" (estimated %.2f)", est.ms_per_token) or "", tostring(st.stop_reason)))
  io.stderr:write(string.format("  per step (%d steps: the prompt's and each token's, %.2f ms each):\n", run.steps, run.step_ms))
  for i, d in ipairs(run.per_device) do
    io.stderr:write(string.format("  device %d: compute %.2f ms, load %.2f ms, stall %.2f ms, send %.2f ms, waiting for input %.2f ms\n",
      i, d.compute_ms, d.load_ms, d.stall_ms, d.send_ms, d.recv_wait_ms))
  end
  for _, a in ipairs(c:batcher().adaptations) do
    io.stderr:write("  ", require("loip.engine.request.online").describe(a), "\n")
  end
  for _, l in ipairs(c.losses or {}) do
    io.stderr:write(string.format("  lost device %s at step %d (%s); re-planned over the %d left in %.0f ms\n",
      table.concat(l.devices, ", "), l.step or 0, l.why, l.devices_left, l.replan_ms))
  end
end

-- Plan the cluster, generate, report. run.started: the run once its request is in (a failure
-- after it still prints --json's object).
local function generate_on_cluster(o, c, set, draft, tok, run)
  local p, est, info = plan_cluster(o, c, set, draft)
  local before = c:stats()
  local steps0 = c:batcher().stats.steps
  if o.trace then require("loip.engine.request.draft_trace").record(c:batcher().draft) end
  local it, st = c:generate(o.prompt, { max_tokens = o.max_tokens, seed = o.seed, tokenizer = tok, ignore_eos = o.ignore_eos,
    temperature = o.temperature, top_k = o.top_k, top_p = o.top_p, min_p = o.min_p, repetition_penalty = o.repeat_penalty })
  local ids, pieces = st.prompt_ids, {}
  run.started = { state = st, pieces = pieces, threads = o.threads, context = c.context, batch = c.batch, batcher = c:batcher() }
  if not o.json then common.out(o.prompt) end
  for _, text in it do
    pieces[#pieces + 1] = text
    if not o.json then common.out(text) end
  end
  local after = c:stats()
  if o.trace then write_trace(o, c) end
  local steps = math.max(1, st.stats.decode_steps + 1)
  -- (with drafts a step gives several tokens: the steps the ring ran)
  if draft then steps = math.max(1, c:batcher().stats.steps - steps0) end
  -- the devices' figures are per step over the whole request (the prompt's step and each
  -- token's): compute, stall, send and waiting add up to step_ms, the mean time a step took;
  -- the loader's reads run beside them
  report_cluster_run(o, c, { p = p, est = est, info = info, st = st, ids = ids, pieces = pieces, steps = steps,
    per_token = st.stats.decode_steps > 0 and st.stats.decode_ms / st.stats.decode_steps or 0,
    step_ms = (st.stats.prefill_ms + st.stats.decode_ms) / steps, per_device = per_device_report(c, st, before, after, steps, est) })
end

local function run_cluster(o)
  local json = require "loip.text.json"
  local cluster = require "loip.cluster"
  local hosts, n, set, draft = check_cluster(o)
  common.store_for("generate", o)
  local st_mod = require "loip.model.store"
  local scfg = st_mod.config(o.model, st_mod.read_manifest(o.model))
  if o.plan and (o.scheduler ~= "loip" or o.stages) then
    common.usage("generate", "--plan runs the plan given; --scheduler and --stages choose one (give one or the other)")
  end
  -- the tokenizer runs at the head: the store carries the model's tokenizer files
  local tok = require("loip.text.tokenizer").open(o.model, { path = o.tokenizer, vocab_size = scfg.vocab_size })
  local c = o.hosts and cluster.connect(hosts, { store = o.model, token = common.token(o), keys = o.curve_keys })
    or cluster.start_local { store = o.model, devices = n, mem = set.mem or 0, threads = o.threads > 0 and o.threads or nil,
      cpu_latency_us = o.cpu_latency }
  local run = {}
  local ok, err = pcall(generate_on_cluster, o, c, set, draft, tok, run)
  if not ok and o.json and run.started then
    local r = M.failure_report(o, run.started, err, run.started.batcher)
    r.device_losses, r.membership = c.losses, c.membership
    io.stdout:write(json.encode(r), "\n")
    io.stdout:flush()
  end
  c:close()
  if not ok then error(err, 0) end
  return 0
end

-- The refusals of a run on this device that need nothing opened (the flags several devices or
-- a slice store take); o.mem made one budget. Whether the model is a slice store.
local function check_local(o)
  if o.mem and tostring(o.mem):find(",", 1, true) then
    common.usage("generate", "several --mem budgets need --devices or --hosts")
  end
  o.mem = o.mem and common.settings("generate", { mem = o.mem }, 1).mem[1]
  for _, f in ipairs({ "link_rate", "link_delay", "slowdown", "link_schedule" }) do
    if o[f] then common.usage("generate", "--%s is for several devices (--devices or --hosts)", (f:gsub("_", "-"))) end
  end
  local is_store = require("loip.model").locate(o.model) == "store"
  for _, f in ipairs({ "plan", "disk_rate", "trace", "save_plan", "stages", "plan_positions" }) do
    if o[f] and not is_store then
      common.usage("generate", "--%s needs a slice store (make one with loip slice)", (f:gsub("_", "-")))
    end
  end
  return is_store
end

-- The model opened as the flags say; a model (not a store) that does not fit --mem is told how
-- to run it.
local function open_model(o, is_store)
  local draft = common.draft("generate", o)
  local disk_rate = common.settings("generate", { disk_rate = o.disk_rate }, 1).disk_rate
  local ok, m = pcall(require("loip.model").open, o.model, { threads = o.threads, context = o.context, batch = o.batch, tokenizer = o.tokenizer,
    mem = o.mem, plan = o.plan, slots = o.slots, loader = o.loader, verify_reads = o.verify_reads,
    disk_rate = disk_rate and disk_rate[1],
    trace = o.trace ~= nil, scheduler = o.scheduler, cost = o.cost_model, profile = o.profile, stages = o.stages, ends = o.ends,
    plan_positions = o.plan_positions, draft = draft, draft_tokens = o.draft_tokens,
      experts = o.experts, kernels_policy = o.kernels_policy, routing = require("loip.model.experts").load_routing(o.routing_profile),
    online = is_store and require("loip.engine.request.online").choose(o.online, o.plan_positions) or nil })
  if not ok then
    if o.mem and errors.is(m, "out_of_memory") and not is_store then
      error(m .. "; the model does not fit in --mem " .. require("loip.runtime.memory").format_bytes(o.mem)
        .. ": pass a larger --mem, or slice it (loip slice) and run the store, which offloads what does not fit", 0)
    end
    error(m, 0)
  end
  return m
end

-- The model's plan told on stderr (when it offloads, or asked), saved (--save-plan), and its
-- memory (--verbose).
local function show_plan(o, m)
  local plan_mod = require "loip.plan"
  if o.verbose then common.stderr("%s\n", tostring(m)) end
  local offloads = m.plan and plan_mod.memory(m.plan, 1, m.plan_sizes, m.plan_opts).offloaded_bytes > 0
  if m.plan and (offloads or o.verbose or o.plan) and not o.json then
    common.stderr("%s\n", plan_mod.describe(m.plan, m.plan_sizes, m.plan_opts, m.estimate))
    if m.loader then common.stderr("loader: %s\n", m.loader:describe()) end
  end
  if o.save_plan then
    local sok, serr = pcall(plan_mod.save, o.save_plan, m.plan)
    if not sok then m:close() error(serr, 0) end
  end
  if o.verbose and m.budget then common.stderr("memory:\n%s\n", tostring(m.budget:report())) end
end

-- The prompt's ids, or its text: with --chat or --chat-template, the chat template applied to
-- the system and user messages (the template writes the special tokens itself).
local function chat_input(o, m)
  if not (o.chat or o.chat_template) then return o.prompt end
  local messages = {}
  if o.system then messages[#messages + 1] = { role = "system", content = o.system } end
  messages[#messages + 1] = { role = "user", content = o.prompt }
  local dir = m.dir or o.model
  local text = require("loip.text.chat").apply(dir, messages, { add_generation_prompt = true,
    template_file = o.chat_template })
  local input = m.tokenizer:encode(text, { add_special = false, bos = false })
  if o.verbose then common.stderr("chat prompt (%d tokens):\n%s\n", #input, text) end
  if #input >= m.context then m:close() common.prompt_fits("generate", #input, m.context) end
  return input
end

-- The run's report: --json's object on stdout, else a line end; then on stderr the online
-- policy's changes, the drafts, the timings (--verbose); the trace written (--trace).
local function report_local_run(o, m, st, pieces, experts0)
  local json = require "loip.text.json"
  local plan_mod = require "loip.plan"
  local s = st.stats
  local per_token = s.decode_steps > 0 and s.decode_ms / s.decode_steps or 0
  if o.json then
    local r = M.generate_report(o, { text = table.concat(pieces), state = st, per_token = per_token, threads = m.threads,
      estimate = m.estimate, context = m.context, batch = m.batch })
    r.plan = m.plan and { slots = m.plan.slots or 1, devices = plan_mod.bare(m.plan).devices,
      memory = plan_mod.memory(m.plan, 1, m.plan_sizes, m.plan_opts) } or nil
    r.loader = m.loader and m.loader:mode() or nil
    r.runner = m.runner and m:runner_stats() or nil
    r.experts = m.experts and require("loip.model.experts").report(m.experts:stats(), st.stats.decode_steps, experts0) or nil
    r.adaptations = #m:batcher().adaptations > 0 and m:batcher().adaptations or nil
    r.draft = M.draft_report(m:batcher())
    io.stdout:write(json.encode(r), "\n")
  else
    common.out("\n")
  end
  io.stdout:flush()
  for _, a in ipairs(not o.json and m:batcher().adaptations or {}) do
    common.stderr("  %s\n", require("loip.engine.request.online").describe(a))
  end
  local dr = not o.json and M.draft_report(m:batcher())
  if dr then
    common.stderr("draft %s: %d of %d drafts accepted (%.0f%%), %.2f tokens per verifying step\n", dr.policy, dr.accepted,
      dr.drafted, 100 * dr.acceptance, dr.tokens_per_step)
  end
  if o.verbose then
    common.stderr("prompt %d tokens in %.1f ms; %d tokens generated, %.2f ms/token (%.1f tokens/s); stop: %s\n",
      s.prompt_tokens, s.prefill_ms, s.generated, per_token, per_token > 0 and 1000 / per_token or 0,
      tostring(st.stop_reason))
  end
  if o.trace then
    require("loip.engine.request.online").add_to_trace(m.trace, m:batcher().adaptations)
    require("loip.engine.request.draft_trace").add_to_trace(m.trace, m:batcher().draft)
    m.trace:write(o.trace)
    if o.verbose then common.stderr("trace: %d events -> %s\n", m.trace:count(), o.trace) end
  end
end

function M.run(o)
  local json = require "loip.text.json"
  common.use_kernels(o.kernels)
  common.check_prompt("generate", o) -- (before anything is opened, sliced, planned or started)
  if o.devices or o.hosts then return run_cluster(o) end
  local m = open_model(o, check_local(o))
  show_plan(o, m)
  local gen_opts = { max_tokens = o.max_tokens, temperature = o.temperature, top_k = o.top_k,
    top_p = o.top_p, min_p = o.min_p, repetition_penalty = o.repeat_penalty, seed = o.seed, ignore_eos = o.ignore_eos }
  local input = chat_input(o, m)
  if o.trace then require("loip.engine.request.draft_trace").record(m:batcher().draft) end
  local it, st = m:generate(input, gen_opts)
  local pieces = {}
  if not o.json then common.out(o.prompt) end
  local experts0 -- (a mixture of experts: the expert cache's figures after the prompt's step)
  local run_ok, run_err = pcall(function()
    for _, text in it do
      pieces[#pieces + 1] = text
      if m.experts and not experts0 then experts0 = m.experts:stats() end
      if not o.json then common.out(text) end
    end
  end)
  if not run_ok then
    -- (a failure after the run started: --json still prints what it generated, with the error)
    if o.json then
      io.stdout:write(json.encode(M.failure_report(o, { state = st, pieces = pieces, threads = m.threads, context = m.context,
        batch = m.batch }, run_err, m:batcher())), "\n")
      io.stdout:flush()
    end
    m:close()
    error(run_err, 0)
  end
  report_local_run(o, m, st, pieces, experts0)
  m:close()
  return 0
end

return M
