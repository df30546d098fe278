-- The loip command's subcommands. runtime/cli/main.c calls main(argv) and exits with its
-- return value: 0 success, 1 runtime failure, 2 usage error.
local flags = require "loip.tools.flags"
local cp = require "loip.tools.cli_plan"

local M = {}

local function stderr(fmt, ...) io.stderr:write(string.format(fmt, ...)) end

local threads_flag = { "threads", "int", "compute threads (0: all CPUs)", default = 0,
  check = function(v) return v >= 0, "must be >= 0" end }
local kernels_flag = { "kernels", "string", "CPU kernel variant: auto, ref, avx2, avx512", default = "auto" }
local cpu_latency_flag = { "cpu-latency", "int", "hold this machine's CPU wake-up latency at US microseconds while "
  .. "running (Linux PM QoS, /dev/cpu_dma_latency; root): fewer slow wake-ups per hop, more idle power",
  metavar = "US", check = function(v) return v >= 0, "must be >= 0" end }

local function use_kernels(name)
  local core = require "loip.core"
  core.check(core.C.loip_kernels_use(name), "--kernels")
end

local commands = {}

commands.generate = {
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
    { "mem", "string", "memory budget for weights, KV cache and activations, e.g. 1.5G (default: unlimited); "
      .. "with --devices, one per device: 600M,400M,400M", metavar = "BYTES" },
    { "devices", "int", "run on N local devices (worker processes) of a cluster", metavar = "N",
      check = function(v) return v >= 1 and v <= 64, "must be in 1..64" end },
    { "hosts", "string", "run on running workers: host:port,host:port,... (with --token, LOIP_CLUSTER_TOKEN or --curve-keys)", metavar = "LIST" },
    cp.flags.token, cp.flags.curve_keys,
    cp.flags.stages, cp.flags.link_rate, cp.flags.link_delay, cp.flags.slowdown,
    { "plan-context", "int", "slice store: plan memory for this many KV positions (default: the whole --context); "
      .. "past them the KV cache grows inside each budget and the --online policy makes room, offloading blocks live",
      metavar = "N", check = function(v) return v >= 1, "must be >= 1" end },
    { "online", "string", "the online policy run before every step (recipes/policies/online: loip, the default with "
      .. "--plan-context) or a file; none: off",
      default = "loip", metavar = "NAME|FILE.lua" },
    { "on-device-loss", "string", "with --devices/--hosts: when a device dies, hangs or disconnects mid-request: replan (the "
      .. "others take over, the request goes on with the same tokens) or fail", default = "replan",
      check = function(v) return v == "replan" or v == "fail", "must be replan or fail" end },
    { "batch", "int", "tokens a step carries (prompt chunks; with --devices/--hosts also the positions --online recompute "
      .. "recomputes; activations are sized for it; default 64)", check = function(v) return v > 0, "must be > 0" end },
    { "link-schedule", "string", "local devices: the emulated links change while the request runs (recipes/policies/links: switch, "
      .. "random; or a file: at(step) -> a rate, one per link, or nil)", metavar = "NAME|FILE.lua" },
    cpu_latency_flag,
    { "plan", "string", "slice store: the plan to run (a Lua file returning the table; see loip.plan); "
      .. "default: the scheduler's", metavar = "FILE.lua" },
    cp.flags.scheduler, cp.flags.cost, cp.flags.profile,
    { "slots", "int", "slice store: loader slots (default 1, used as a ring; several: one stage's blocks each)",
      check = function(v) return v >= 1 and v <= 64, "must be in 1..64" end },
    { "verify-reads", "bool", "slice store: check every offloaded read against its block file's CRC32C in the manifest "
      .. "(a damaged file is named and the request stops)" },
    { "loader", "string", "slice store: how offloaded blocks are read: auto (io_uring, else buffered), uring, "
      .. "buffered (the conventional path)", default = "auto",
      check = function(v) return v == "auto" or v == "uring" or v == "buffered", "must be auto, uring or buffered" end },
    cp.flags.disk_rate, cp.flags.save_plan,
    { "trace", "string", "write a Chrome trace (Perfetto) of every load, compute and wait", metavar = "OUT.json" },
    { "chat", "bool", "wrap the prompt as a user message in the model's chat template" },
    { "system", "string", "system message (with --chat)", metavar = "TEXT" },
    { "chat-template", "string", "Jinja chat template to use instead of the model's (implies --chat)", metavar = "FILE" },
    threads_flag, kernels_flag,
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
    kernels = require("ffi").string(require("loip.core").C.loip_kernels_name()),
  }
end

local function run_cluster(o)
  local json = require "loip.tools.json"
  local cluster = require "loip.cluster"
  if o.hosts and o.cpu_latency then
    error({ usage_error = true, msg = "generate: --cpu-latency is for local devices; start each `loip worker` with --cpu-latency instead" }, 0)
  end
  local hosts = cp.hosts("generate", o)
  local n = o.devices or #hosts
  local set = cp.settings("generate", o, n)
  -- refuse what cannot work before anything is sliced or any worker starts
  local layers = cp.model_layers(o.model)
  if n > 2 * layers then
    error({ usage_error = true, msg = string.format("generate: %d devices but the model has only %d blocks (%d layers): every device needs at least one block per stage; use at most %d",
      n, 2 * layers, layers, 2 * layers) }, 0)
  end
  cp.store_for("generate", o)
  local st_mod = require "loip.model.store"
  local scfg = st_mod.config(o.model, st_mod.read_manifest(o.model))
  if o.plan and (o.scheduler ~= "loip" or o.stages) then
    error({ usage_error = true, msg = "generate: --plan runs the plan given; --scheduler and --stages choose one (give one or the other)" }, 0)
  end
  -- the tokenizer runs at the head: the store carries the model's tokenizer files
  local tok = require("loip.text.tokenizer").open(o.model, { path = o.tokenizer, vocab_size = scfg.vocab_size })
  local c = o.hosts and cluster.connect(hosts, { store = o.model, token = cp.token(o), keys = o.curve_keys })
    or cluster.start_local { store = o.model, devices = n, mem = set.mem or 0, threads = o.threads > 0 and o.threads or nil,
      cpu_latency_us = o.cpu_latency }
  local ok, err = pcall(function()
    if o.hosts and set.mem then for i, d in ipairs(c.devices) do d.mem = set.mem[i] end end
    local loader = o.loader ~= "auto" and o.loader or nil
    local p, est, info = c:plan { plan = o.plan, scheduler = o.scheduler, cost = o.cost_model, profile = o.profile,
      stages = o.stages, context = o.context, batch = o.batch, loader = loader, verify_reads = o.verify_reads,
      on_device_loss = o.on_device_loss,
      disk_rate = set.disk_rate,
      link = set.link, trace = o.trace ~= nil, slowdown = set.slowdown, kv_plan_tokens = o.plan_context,
      online = (o.plan_context or o.online ~= "loip") and o.online or nil, link_schedule = o.link_schedule }
    if o.save_plan then require("loip.plan").save(o.save_plan, p) end
    if not o.json then cp.report(p, est, info, c.sizes, { cluster = true, loader = loader }) end
    local before = c:stats()
    local it, st = c:generate(o.prompt, { max_tokens = o.max_tokens, seed = o.seed, tokenizer = tok, ignore_eos = o.ignore_eos,
      temperature = o.temperature, top_k = o.top_k, top_p = o.top_p, min_p = o.min_p, repetition_penalty = o.repeat_penalty })
    local ids = st.prompt_ids
    local pieces = {}
    if not o.json then io.stdout:write(o.prompt) io.stdout:flush() end
    for _, text in it do
      pieces[#pieces + 1] = text
      if not o.json then io.stdout:write(text) io.stdout:flush() end
    end
    local rest = ""
    local after = c:stats()
    if o.trace then
      local tr = c:collect_trace(require("loip.tools.trace").new())
      require("loip.serve.online").add_to_trace(tr, c:batcher().adaptations)
      tr:write(o.trace)
      if not o.json then io.stderr:write(string.format("trace: %d events -> %s\n", tr:count(), o.trace)) end
    end
    local steps = math.max(1, st.stats.decode_steps + 1)
    local per_device = {}
    for i = 1, #c.devices do
      local a, b = after[i], before[i]
      local function per(key) return ((a[key] or 0) - (b[key] or 0)) / steps end
      per_device[i] = { compute_ms = per("compute_ms"), load_ms = per("load_ms"), stall_ms = per("stall_ms"),
        send_ms = per("send_ms"), recv_wait_ms = per("recv_wait_ms"), head_ms = per("head_ms"),
        memory = a.memory, budget_bytes = a.budget_bytes, peak_bytes = a.peak_bytes, peak_rss_bytes = a.peak_rss_bytes,
        accounts = a.accounts, links = a.links }
      local e = est and est.devices[i]
      if e then
        per_device[i].estimate = { comp_ms = e.comp_ms, load_ms = e.load_ms, uncover_ms = e.uncover_ms, comm_ms = e.comm_ms,
          memory_bytes = e.memory_bytes }
      end
    end
    local per_token = st.stats.decode_steps > 0 and st.stats.decode_ms / st.stats.decode_steps or 0
    -- the devices' figures are per step over the whole request (the prompt's step and each
    -- token's): compute, stall, send and waiting add up to step_ms, the mean time a step took;
    -- the loader's reads run beside them
    local step_ms = (st.stats.prefill_ms + st.stats.decode_ms) / steps
    if o.json then
      local r = M.generate_report(o, { text = table.concat(pieces), state = st, per_token = per_token,
        threads = o.threads, estimate = est, context = c.context, batch = c.batch })
      r.step_ms, r.devices = step_ms, per_device
      r.scheduler, r.cost_model, r.scheduler_ms = info and info.scheduler, info and info.cost, info and info.scheduler_ms
      r.plan = require("loip.plan").bare(p)
      r.adaptations = #c:batcher().adaptations > 0 and c:batcher().adaptations or nil
      r.device_losses = c.losses
      r.link_changes = #c:batcher().link_changes > 0 and c:batcher().link_changes or nil
      io.stdout:write(json.encode(r), "\n")
    else
      io.stdout:write(rest, "\n")
      io.stdout:flush()
      io.stderr:write(string.format("%d devices: prompt %d tokens in %.1f ms; %d tokens, %.2f ms/token%s; stop: %s\n", #c.devices,
        #ids, st.stats.prefill_ms, #st.token_ids, per_token,
        est and string.format(" (estimated %.2f)", est.ms_per_token) or "", tostring(st.stop_reason)))
      io.stderr:write(string.format("  per step (%d steps: the prompt's and each token's, %.2f ms each):\n", steps, step_ms))
      for i, d in ipairs(per_device) do
        io.stderr:write(string.format("  device %d: compute %.2f ms, load %.2f ms, stall %.2f ms, send %.2f ms, waiting for input %.2f ms\n",
          i, d.compute_ms, d.load_ms, d.stall_ms, d.send_ms, d.recv_wait_ms))
      end
      for _, a in ipairs(c:batcher().adaptations) do
        io.stderr:write("  ", require("loip.serve.online").describe(a), "\n")
      end
      for _, l in ipairs(c.losses or {}) do
        io.stderr:write(string.format("  lost device %s at step %d (%s); re-planned over the %d left in %.0f ms\n",
          table.concat(l.devices, ", "), l.step or 0, l.why, l.devices_left, l.replan_ms))
      end
    end
  end)
  c:close()
  if not ok then error(err, 0) end
  return 0
end

function commands.generate.run(o)
  use_kernels(o.kernels)
  if o.devices or o.hosts then return run_cluster(o) end
  if o.mem and tostring(o.mem):find(",", 1, true) then
    error({ usage_error = true, msg = "generate: several --mem budgets need --devices or --hosts" }, 0)
  end
  o.mem = o.mem and cp.settings("generate", { mem = o.mem }, 1).mem[1]
  for _, f in ipairs({ "link_rate", "link_delay", "slowdown", "link_schedule" }) do
    if o[f] then error({ usage_error = true, msg = "generate: --" .. f:gsub("_", "-") .. " is for several devices (--devices or --hosts)" }, 0) end
  end
  local model = require "loip.model"
  local json = require "loip.tools.json"
  local is_store = model.locate(o.model) == "store"
  for _, f in ipairs({ "plan", "disk_rate", "trace", "save_plan", "stages", "plan_context" }) do
    if o[f] and not is_store then
      error({ usage_error = true, msg = "generate: --" .. f:gsub("_", "-") .. " needs a slice store (make one with loip slice)" }, 0)
    end
  end
  local disk_rate = cp.settings("generate", { disk_rate = o.disk_rate }, 1).disk_rate
  local ok, m = pcall(model.open, o.model, { threads = o.threads, context = o.context, batch = o.batch, tokenizer = o.tokenizer,
    mem = o.mem, plan = o.plan, slots = o.slots, loader = o.loader, verify_reads = o.verify_reads,
    disk_rate = disk_rate and disk_rate[1],
    trace = o.trace ~= nil, scheduler = o.scheduler, cost = o.cost_model, profile = o.profile, stages = o.stages,
    kv_plan_tokens = o.plan_context, online = is_store and (o.plan_context or o.online ~= "loip") and o.online or nil })
  if not ok then
    if o.mem and tostring(m):find("memory budget:", 1, true) and not is_store then
      error(tostring(m) .. "; the model does not fit in --mem " .. require("loip.runtime.memory").format_bytes(o.mem)
        .. ": pass a larger --mem, or slice it (loip slice) and run the store, which offloads what does not fit", 0)
    end
    error(m, 0)
  end
  if o.verbose then stderr("%s\n", tostring(m)) end
  local plan_mod = require "loip.plan"
  local offloads = m.plan and plan_mod.memory(m.plan, 1, m.plan_sizes, m.plan_opts).offloaded_bytes > 0
  if m.plan and (offloads or o.verbose or o.plan) and not o.json then
    stderr("%s\n", plan_mod.describe(m.plan, m.plan_sizes, m.plan_opts, m.estimate))
    if m.loader then stderr("loader: %s\n", m.loader:describe()) end
  end
  if o.save_plan then
    local sok, serr = pcall(plan_mod.save, o.save_plan, m.plan)
    if not sok then m:close() error(serr, 0) end
  end
  if o.verbose and m.budget then stderr("memory:\n%s\n", tostring(m.budget:report())) end
  local gen_opts = { max_tokens = o.max_tokens, temperature = o.temperature, top_k = o.top_k,
    top_p = o.top_p, min_p = o.min_p, repetition_penalty = o.repeat_penalty, seed = o.seed, ignore_eos = o.ignore_eos }
  local input = o.prompt
  if o.chat or o.chat_template then
    local messages = {}
    if o.system then messages[#messages + 1] = { role = "system", content = o.system } end
    messages[#messages + 1] = { role = "user", content = o.prompt }
    local dir = m.dir or o.model
    local text = require("loip.text.chat").apply(dir, messages, { add_generation_prompt = true,
      template_file = o.chat_template })
    -- The template writes the special tokens itself.
    input = m.tokenizer:encode(text, { add_special = false, bos = false })
    if o.verbose then stderr("chat prompt (%d tokens):\n%s\n", #input, text) end
  end
  local it, st = m:generate(input, gen_opts)
  local pieces = {}
  if not o.json then
    io.stdout:write(o.prompt)
    io.stdout:flush()
  end
  for _, text in it do
    pieces[#pieces + 1] = text
    if not o.json then
      io.stdout:write(text)
      io.stdout:flush()
    end
  end
  local s = st.stats
  local per_token = s.decode_steps > 0 and s.decode_ms / s.decode_steps or 0
  if o.json then
    local r = M.generate_report(o, { text = table.concat(pieces), state = st, per_token = per_token, threads = m.threads,
      estimate = m.estimate, context = m.context, batch = m.batch })
    r.plan = m.plan and { slots = m.plan.slots or 1, devices = plan_mod.bare(m.plan).devices,
      memory = plan_mod.memory(m.plan, 1, m.plan_sizes, m.plan_opts) } or nil
    r.loader = m.loader and m.loader:mode() or nil
    r.runner = m.runner and m:runner_stats() or nil
    r.adaptations = #m:batcher().adaptations > 0 and m:batcher().adaptations or nil
    io.stdout:write(json.encode(r), "\n")
  else
    io.stdout:write("\n")
  end
  io.stdout:flush()
  for _, a in ipairs(not o.json and m:batcher().adaptations or {}) do
    stderr("  %s\n", require("loip.serve.online").describe(a))
  end
  if o.verbose then
    stderr("prompt %d tokens in %.1f ms; %d tokens generated, %.2f ms/token (%.1f tokens/s); stop: %s\n",
      s.prompt_tokens, s.prefill_ms, s.generated, per_token, per_token > 0 and 1000 / per_token or 0,
      tostring(st.stop_reason))
  end
  if o.trace then
    require("loip.serve.online").add_to_trace(m.trace, m:batcher().adaptations)
    m.trace:write(o.trace)
    if o.verbose then stderr("trace: %d events -> %s\n", m.trace:count(), o.trace) end
  end
  m:close()
  return 0
end

commands.tokenize = {
  usage = "loip tokenize --model DIR [--json] TEXT",
  summary = "Print the token ids and pieces of TEXT under the model's tokenizer.",
  flags = {
    { "model", "string", "model directory, or a tokenizer file", required = true, metavar = "DIR" },
    { "no-special", "bool", "do not add the tokenizer's special tokens (BOS)" },
    { "json", "bool", "print a JSON object: ids and pieces" },
  },
}

function commands.tokenize.run(o, pos)
  local tokenizer = require "loip.text.tokenizer"
  local text = table.concat(pos, " ")
  local is_dir = os.execute("test -d '" .. o.model:gsub("'", "'\\''") .. "'") == 0
  local tok, m
  if not is_dir then
    tok = tokenizer.open_file(o.model)
  else
    local ok, t = pcall(tokenizer.open, o.model)
    if ok then
      tok = t
    else -- a llama2.c directory names its tokenizer by the model's vocabulary: ask the model
      m = require("loip.model").open(o.model, { load = "mmap", threads = 1, context = 1 })
      tok = m.tokenizer
    end
  end
  local ids = tok:encode(text, { add_special = not o.no_special, bos = not o.no_special })
  -- The token as the vocabulary spells it (byte-level files write bytes as letters like "Ġ")
  -- and, where that differs, the text it decodes to.
  local pieces, texts = {}, {}
  for i, id in ipairs(ids) do
    pieces[i] = tok.id_to_token and tok:id_to_token(id) or tok.pieces[id]
    texts[i] = tok:piece_text(nil, id)
  end
  if o.json then
    print(require("loip.tools.json").encode({ text = text, ids = ids, pieces = pieces, texts = texts }))
  else
    local function show(p)
      return '"' .. p:gsub('[%c"\\]', function(c)
        local named = { ["\n"] = "\\n", ["\t"] = "\\t", ["\r"] = "\\r", ['"'] = '\\"', ["\\"] = "\\\\" }
        return named[c] or string.format("\\x%02x", c:byte())
      end) .. '"'
    end
    for i, id in ipairs(ids) do
      local extra = texts[i] ~= pieces[i] and ("  " .. show(texts[i])) or ""
      print(string.format("%8d  %s%s", id, show(pieces[i]), extra))
    end
    io.stdout:flush()
    stderr("%d tokens\n", #ids)
  end
  if m then m:close() else tok:close() end
  return 0
end

commands.run = {
  usage = "loip run FILE.lua [ARGS...]",
  summary = "Run a Lua script (a recipe) with the `loip` global the REPL has (require \"loip\" works too) and\n"
    .. "`arg` set as luajit sets it.",
  flags = {}, stop_at_positional = true,
}

function commands.run.run(_, pos, argv, at)
  local file = pos[1]
  if not file then error({ usage_error = true, msg = "run: which script? (loip run FILE.lua)" }, 0) end
  local chunk, err = loadfile(file)
  if not chunk then stderr("loip: %s\n", err) return 1 end
  -- arg as luajit sets it: arg[0] the script, arg[1..] its arguments, negatives before.
  local a = { [0] = file }
  for i = 2, #pos do a[i - 1] = pos[i] end
  a[-1], a[-2] = argv[at], argv[0]
  _G.arg = a
  _G.loip = require "loip" -- as in the REPL: one rule for both
  chunk(unpack(pos, 2))
  return 0
end

commands.synth = {
  usage = "loip synth --like NAME [--dtype bf16] [flags] OUT_DIR",
  summary = "Write a random-weight (seeded) Hugging Face model directory with the exact shapes of a named\n"
    .. "model, plus a tokenizer.bin it can be run with. Shapes can be overridden.",
  flags = cp.rows({
    { "like", "string", "shape to copy (see --list)", metavar = "NAME" },
    { "dtype", "string", "weight dtype: bf16, f16, f32", default = "bf16" },
    { "seed", "int", "random seed", default = 1 },
    { "std", "number", "standard deviation of the random weights", default = 0.02,
      check = function(v) return v >= 0, "must be >= 0" end },
  }, cp.shape_flags(""), {
    { "shard-size", "bytes", "largest safetensors shard", default = 5 * 1024 ^ 3 },
    { "force", "bool", "replace OUT_DIR's model files if they exist" },
    { "list", "bool", "list the known shapes" },
  }),
}

function commands.synth.run(o, pos)
  local synth = require "loip.model.synth"
  if o.list then
    for _, name in ipairs(require("loip.model.shapes").names()) do print(name) end
    return 0
  end
  if not o.like then error({ usage_error = true, msg = "synth: --like NAME is required (see --list)" }, 0) end
  if not pos[1] then error({ usage_error = true, msg = "synth: OUT_DIR is required" }, 0) end
  synth.write(pos[1], o)
  return 0
end

commands.worker = {
  usage = "loip worker --listen HOST:PORT --store DIR [--mem BYTES] [--threads N] [--token SECRET | --curve-keys DIR]",
  summary = "Run one device of a cluster: wait for a plan from the head, load its part of the slice store,\n"
    .. "run its stages every step. Stops cleanly on SIGINT/SIGTERM or when the head says so. The cluster\n"
    .. "token may also come from LOIP_CLUSTER_TOKEN (kept out of the process list).",
  flags = {
    { "listen", "string", "endpoint to listen at: HOST:PORT, tcp://HOST:PORT (port * or 0: any)", required = true },
    { "store", "string", "this device's copy of the slice store", required = true, metavar = "DIR" },
    { "mem", "bytes", "memory budget of this device (default: unlimited)", default = 0, metavar = "BYTES" },
    threads_flag, kernels_flag,
    { "token", "string", "cluster secret (peers prove they hold it; it never crosses the wire)", metavar = "SECRET" },
    { "curve-keys", "string", "the cluster's CURVE secret key instead of a token: DIR/secret.key (z85, same on every member)", metavar = "DIR" },
    cpu_latency_flag,
    { "head-dir", "string", "a local head's private directory: removed when the head dies before this worker stops (the head sets it)", metavar = "DIR" },
  },
}

function commands.worker.run(o)
  use_kernels(o.kernels)
  local token = o.token or os.getenv("LOIP_CLUSTER_TOKEN")
  if not token and not o.curve_keys then
    error({ usage_error = true, msg = "worker: give --token, --curve-keys or LOIP_CLUSTER_TOKEN: peers must authenticate" }, 0)
  end
  if o.cpu_latency then
    local ok, err = require("loip.core").wake_latency(o.cpu_latency)
    if not ok then error("worker: --cpu-latency: " .. err, 0) end
  end
  local listen = o.listen:match("://") and o.listen or ("tcp://" .. o.listen)
  local w = require("loip.cluster.worker").new { listen = listen, store = o.store, mem = o.mem, threads = o.threads,
    token = o.curve_keys and nil or token, keys = o.curve_keys, head_dir = o.head_dir }
  io.stdout:write("listening ", w:endpoint(), "\n")
  io.stdout:flush()
  io.stderr:write(string.format("loip worker: %s, store %s, budget %s%s\n", w:endpoint(), o.store,
    o.mem > 0 and require("loip.runtime.memory").format_bytes(o.mem) or "unlimited",
    o.cpu_latency and string.format(", CPU wake-up latency held at %d us", o.cpu_latency) or ""))
  w:run()
  return 0
end

commands.testbed = {
  usage = "loip testbed up N --store DIR [--rate 100mbit] [--mem LIST] [--threads N] | loip testbed shape I RATE | loip testbed down [--keep-logs] | loip testbed status",
  summary = "A network testbed on this machine (root): N network namespaces joined by a bridge, every link shaped\n"
    .. "by tbf (real kernel shaping), one loip worker in each (10.77.0.11:7000, .12, ...), logging to\n"
    .. "/tmp/loip-testbed-I.log. `shape I RATE` re-shapes device I's link live (requests keep running). `down`\n"
    .. "removes every namespace, link, process and log `up` made. The cluster token\n"
    .. "is printed, and kept in the state file.",
  flags = {
    { "store", "string", "slice store the workers serve", metavar = "DIR" },
    { "rate", "string", "link rate (tc syntax: 100mbit, 1gbit)", default = "100mbit" },
    { "mem", "string", "budget per worker: one size, or one per worker (600M,400M,400M)", metavar = "LIST" },
    threads_flag,
    { "token", "string", "cluster token (default: random)", metavar = "SECRET" },
    { "keep-logs", "bool", "down: leave the workers' logs (/tmp/loip-testbed-I.log) in place" },
  },
}

function commands.testbed.run(o, pos)
  local testbed = require "loip.cluster.testbed"
  local what = pos[1]
  if what == "down" then
    local st = testbed.down { keep_logs = o.keep_logs }
    io.stderr:write(st and string.format("testbed down: %d workers stopped, %d namespaces and the bridge removed%s\n",
      #(st.pids or {}), #(st.namespaces or {}), o.keep_logs and ("; logs kept: " .. table.concat(st.logs or {}, ", "))
      or ", their logs deleted") or "testbed: none is up\n")
    return 0
  elseif what == "shape" then
    local i, rate = tonumber(pos[2]), pos[3]
    if not i or not rate then error({ usage_error = true, msg = "testbed: shape I RATE (e.g. shape 2 50mbit)" }, 0) end
    testbed.shape(i, rate)
    io.stderr:write(string.format("testbed: device %d's link now at %s\n", i, rate))
    return 0
  elseif what == "status" then
    local st = testbed.state()
    io.stdout:write(st and require("loip.tools.json").encode(st) .. "\n" or "none\n")
    return 0
  elseif what ~= "up" then
    error({ usage_error = true, msg = "testbed: up N | shape I RATE | down | status (see --help)" }, 0)
  end
  local n = tonumber(pos[2])
  if not n or n < 1 or n > 32 or n ~= math.floor(n) then
    error({ usage_error = true, msg = "testbed: up N: N devices, 1..32" }, 0)
  end
  if not o.store then error({ usage_error = true, msg = "testbed: up needs --store DIR" }, 0) end
  local mems = cp.settings("testbed", { mem = o.mem }, n).mem
  local token = o.token or os.getenv("LOIP_CLUSTER_TOKEN")
  if not token then
    local f = io.open("/dev/urandom", "rb")
    token = f:read(16):gsub(".", function(c) return string.format("%02x", c:byte()) end)
    f:close()
  end
  local pid = io.open("/proc/self/stat"):read("*l"):match("^(%d+)")
  local exe = io.popen("readlink -f /proc/" .. pid .. "/exe"):read("*l")
  local st = testbed.up { n = n, rate = o.rate, store = o.store, mem = mems, threads = o.threads > 0 and o.threads or 1,
    token = token, exe = exe }
  io.stdout:write(string.format("testbed up: %d workers at %s, links shaped to %s\n", n, table.concat(st.hosts, ","), o.rate))
  io.stdout:write(string.format("run: LOIP_CLUSTER_TOKEN=%s loip generate --model %s --hosts %s --prompt ...\n", token, o.store,
    table.concat(st.hosts, ",")))
  return 0
end

commands.trace = {
  usage = "loip trace plot TRACE.json OUT.svg [--from MS] [--to MS]",
  summary = "Draw a trace written by --trace (one device or a cluster) as an SVG timeline: per device,\n"
    .. "lanes for disk, compute, network and waits.",
  flags = {
    { "from", "number", "start of the window, ms from the trace's first event", metavar = "MS" },
    { "to", "number", "end of the window, ms", metavar = "MS" },
    { "width", "int", "drawing width in pixels", default = 1200 },
  },
}

function commands.trace.run(o, pos)
  if pos[1] ~= "plot" or not pos[2] or not pos[3] or pos[4] then
    error({ usage_error = true, msg = "trace: usage: loip trace plot TRACE.json OUT.svg (see --help)" }, 0)
  end
  local n = require("loip.tools.trace").plot(pos[2], pos[3], { from_ms = o.from, to_ms = o.to, width = o.width })
  io.stderr:write(string.format("%d events -> %s\n", n, pos[3]))
  return 0
end

commands.plan = cp.commands.plan
commands.profile = cp.commands.profile
commands.simulate = require("loip.tools.cli_sim").commands.simulate
commands.pull = require("loip.tools.cli_pull").commands.pull
commands.policy = require("loip.tools.cli_policy").commands.policy
for k, v in pairs(require("loip.tools.cli_serve").commands { threads_flag = threads_flag, kernels_flag = kernels_flag,
  use_kernels = use_kernels }) do commands[k] = v end

commands.slice = {
  usage = "loip slice [--force] MODEL_DIR OUT_DIR\n       loip slice --verify STORE [MODEL_DIR]",
  summary = "Convert a Hugging Face model directory (or a GGUF file, or a llama2.c checkpoint) into a slice store: one\n"
    .. "4 KiB-aligned file per layer block (MHA, MLP), embedding and head, the tokenizer files, and a\n"
    .. "manifest with shapes, offsets and sha256s, written last. Weights keep their dtype and bytes.\n"
    .. "--verify re-hashes every file of a store (and, given MODEL_DIR, checks it was sliced from it).",
  flags = {
    { "verify", "bool", "check every file of STORE against its manifest's sha256" },
    { "force", "bool", "replace OUT_DIR's store even when it holds another model" },
  },
}

function commands.slice.run(o, pos)
  local slice = require "loip.model.slice"
  local human = require("loip.tools.progress").human
  if o.verify then
    if not pos[1] or pos[3] then error({ usage_error = true, msg = "slice: --verify STORE [MODEL_DIR]" }, 0) end
    local r = slice.verify(pos[1], { source = pos[2] })
    print(string.format("%s: %d files verified (%s)%s", pos[1], r.files, human(r.bytes),
      pos[2] and (", sliced from " .. pos[2]) or ""))
    return 0
  end
  if not pos[2] or pos[3] then error({ usage_error = true, msg = "slice: MODEL_DIR OUT_DIR (see --help)" }, 0) end
  local man = slice.write(pos[1], pos[2], { force = o.force })
  local function count(n, what) return string.format("%d %s%s", n, what, n == 1 and "" or "s") end
  print(string.format("%s: %s, %s, %s; source sha256 %s", pos[2], count(#man.files, "block file"),
    count(#man.model_files, "other file"), human(man.total_bytes), man.source.sha256))
  return 0
end

commands.test = {
  usage = "loip test [BUSTED ARGS...] [SPEC DIRS...]",
  summary = "Run busted specs under this LuaJIT with the runtime loaded (ctest calls this).",
  flags = {}, passthrough = true,
}

function commands.test.run(_, pos)
  _G.arg = { [0] = "busted" }
  for i, v in ipairs(pos) do _G.arg[i] = v end
  -- busted calls os.exit itself on success; on failure (under Lua 5.1 rules) it raises a nil
  -- error to make the interpreter exit non-zero.
  local ok, err = pcall(require("busted.runner"), { standalone = false })
  if ok then return 0 end
  if err ~= nil then error(err, 0) end
  return 1
end

function M.version()
  local core = require "loip.core"
  local ffi = require "ffi"
  return string.format("loip %s (abi %d, kernels %s, cuda %s)", core.build.version,
    core.C.loip_abi_version(), ffi.string(core.C.loip_kernels_name()),
    core.build.cuda and (core.C.loip_cuda_device_count() .. " device(s)") or "not built")
end

local function usage()
  return [[
usage: loip [COMMAND] [FLAGS]

commands:
  (none)      interactive Lua REPL with the loip module loaded
  generate    generate text from a prompt
  serve       serve the model over HTTP with OpenAI's API (many requests at once)
  chat        chat with a loip serve (or any OpenAI-compatible) server, streaming
  tokenize    show the token ids and pieces of a text
  run         run a Lua script (recipe) with the runtime available
  synth       write a random-weight model with a real model's shapes
  slice       convert a model into a slice store (per-block files), or --verify one
  pull        download a model repository from Hugging Face (or a compatible endpoint), resumable
  plan        print the plan a scheduler chooses for N devices and its predicted time, running nothing
  profile     measure a device (or running workers) for planning: compute, disk, transport
  simulate    play a plan out over time on simulated devices (profiles) for a request pattern
  worker      run one device of a cluster (the head starts them with generate --devices)
  testbed     network namespaces shaped by tbf with a worker in each (root)
  trace       draw a trace written by --trace as an SVG timeline
  test        run busted specs under the runtime
  policy      the policies of each kind and their settings (list, show KIND NAME)
  help CMD    flags of a command (also: loip CMD --help); help policies: every policy and its settings
  version     versions of the runtime and its kernels
]]
end

M.commands, M.usage = commands, usage -- (a spec checks that help lists every command)

function M.main(argv)
  local cmd = argv[1]
  local ok, rc = xpcall(function()
    if cmd == nil then return require("loip.tools.repl").run() end
    if cmd == "--help" or cmd == "-h" then io.stdout:write(usage()) return 0 end
    if cmd == "help" and argv[2] == "policies" then io.stdout:write(require("loip.tools.cli_policy").list_text()) return 0 end
    if cmd == "help" then
      local c = commands[argv[2] or ""]
      io.stdout:write(c and flags.help(c) or usage())
      return 0
    end
    if cmd == "version" or cmd == "--version" then print(M.version()) return 0 end
    local c = commands[cmd]
    if not c then
      stderr("loip: unknown command '%s'\n%s", cmd, usage())
      return 2
    end
    c.name = cmd
    if (argv[2] == "--help" or argv[2] == "-h") then io.stdout:write(flags.help(c)) return 0 end
    local opts, pos = flags.parse(c, argv, 2)
    return c.run(opts, pos, argv, 1)
  end, function(e)
    if type(e) == "table" and e.usage_error then return e end
    if type(e) == "string" and not os.getenv("LOIP_DEBUG") then return { msg = e } end
    return { msg = debug.traceback(tostring(e), 2) }
  end)
  if ok then return rc or 0 end
  stderr("loip: %s\n", rc.msg)
  return rc.usage_error and 2 or 1
end

return M
