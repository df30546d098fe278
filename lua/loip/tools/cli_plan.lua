-- The planning side of the command line: the flags `generate` and `plan` share (budgets,
-- disks, links, slowdowns, scheduler, cost model, profile), the values given once or once per
-- device, and the commands `loip plan` and `loip profile`.
local flags = require "loip.tools.flags"

local M = {}

local function usage(cmd, fmt, ...) error({ usage_error = true, msg = cmd .. ": " .. string.format(fmt, ...) }, 0) end

-- The flags, as loip.tools.flags declares them.
M.flags = {
  scheduler = { "scheduler", "string", "the scheduler that decides the plan: a name (recipes/policies/scheduler: loip, "
    .. "even, uniform, pipeline, pipeline-offload, edgeshard, brute) or a file of your own", default = "loip",
    metavar = "NAME|FILE.lua" },
  cost = { "cost-model", "string", "the cost model the scheduler minimises: a name (recipes/policies/cost) or a file",
    default = "loip", metavar = "NAME|FILE.lua" },
  profile = { "profile", "string", "measured figures of the devices (loip profile); default: a calibration of this "
    .. "machine (a few seconds, once, kept in ~/.cache/loip)", metavar = "FILE.json" },
  stages = { "stages", "int", "stages per device (default: the scheduler's choice)", metavar = "S",
    check = function(v) return v >= 1, "must be >= 1" end },
  link_rate = { "link-rate", "string", "links between devices of this rate (emulated on local devices), e.g. 100mbit; "
    .. "one, or one per link (link i: device i to the next)", metavar = "RATE[,RATE...]" },
  link_delay = { "link-delay", "string", "this one-way delay per link, e.g. 2ms; one, or one per link", metavar = "TIME[,TIME...]" },
  disk_rate = { "disk-rate", "string", "slice store: each device's disk at most this fast, bytes/s (e.g. 500M; emulated); "
    .. "one, or one per device", metavar = "BYTES[,BYTES...]" },
  slowdown = { "slowdown", "string", "devices whose compute takes this many times as long (emulated on local devices), "
    .. "e.g. 1,1.5,2; one, or one per device", metavar = "F[,F...]" },
  save_plan = { "save-plan", "string", "write the plan as a Lua file (what --plan reads)", metavar = "FILE.lua" },
  token = { "token", "string", "with --hosts: the cluster secret the workers hold (default: LOIP_CLUSTER_TOKEN)", metavar = "SECRET" },
  curve_keys = { "curve-keys", "string", "with --hosts: the cluster's CURVE key directory instead of a token (DIR/secret.key)", metavar = "DIR" },
}

-- The layers of the model at path (a store, or any model loip opens), read without loading it.
function M.model_layers(path)
  local model = require "loip.model"
  if model.locate(path) == "store" then
    local st = require "loip.model.store"
    return st.config(path, st.read_manifest(path)).n_layers
  end
  local src = require("loip.model.slice").open_source(path)
  local layers = src.c.n_layers
  src.close()
  return layers
end

-- The slice store a cluster runs for --model: the store given, or, for --devices, the model
-- sliced into the cache (loip.model.slice.cached; said on stderr); --hosts needs a store (each
-- host holds a copy). Sets o.source_model to what the user named.
function M.store_for(cmd, o)
  local model = require "loip.model"
  local kind = model.locate(o.model)
  if kind == "store" then return o.model end
  if o.hosts then
    usage(cmd, "--hosts needs a slice store that every host holds a copy of: make one with loip slice %s STORE_DIR and copy it to them",
      o.model)
  end
  local dir, made = require("loip.model.slice").cached(o.model, { quiet = o.json or o.quiet })
  if not (o.json or o.quiet) or made then
    io.stderr:write(made and string.format("%s: sliced %s into the slice store %s (kept for the next run)\n", cmd, o.model, dir)
      or string.format("%s: running the slice store of %s in %s (sliced earlier)\n", cmd, o.model, dir))
  end
  o.source_model = o.model
  o.model = dir
  return dir
end

-- The workers of --hosts as a list; without a way to authenticate to them, a usage error (a
-- random token could never work).
function M.hosts(cmd, o)
  local hosts = {}
  if not o.hosts then return hosts end
  for h in o.hosts:gmatch("[^,]+") do hosts[#hosts + 1] = h end
  if #hosts == 0 then usage(cmd, "--hosts: no host:port in '%s'", o.hosts) end
  if not M.token(o) and not o.curve_keys then
    usage(cmd, "--hosts needs the cluster's secret: --token SECRET, LOIP_CLUSTER_TOKEN, or --curve-keys DIR (as the workers were started with)")
  end
  return hosts
end
function M.token(o) return o.token or os.getenv("LOIP_CLUSTER_TOKEN") end

-- The overrides of a named shape's config that `synth` and `plan --like` take (loip.model.synth
-- reads them from the parsed options: layers, dim, ffn, heads, kv_heads, head_dim, vocab), their
-- help starting with `lead`.
function M.shape_flags(lead)
  local rows = {}
  for _, r in ipairs({ { "layers", "num_hidden_layers" }, { "dim", "hidden_size" }, { "ffn", "intermediate_size" },
    { "heads", "num_attention_heads" }, { "kv-heads", "num_key_value_heads" }, { "head-dim", "head_dim" },
    { "vocab", "vocab_size" } }) do
    rows[#rows + 1] = { r[1], "int", lead .. "override " .. r[2] }
  end
  return rows
end

-- Lists of flag rows, one after the other.
function M.rows(...)
  local out = {}
  for _, list in ipairs({ ... }) do for _, r in ipairs(list) do out[#out + 1] = r end end
  return out
end

-- A comma-separated list of n values (one value: the same for all) through parse(item) ->
-- value or nil; nil when text is nil. Usage errors name the flag.
function M.each(cmd, flag, text, n, parse, what, noun)
  if text == nil then return nil end
  local out = {}
  for item in tostring(text):gmatch("[^,]+") do
    local v = parse(item)
    if v == nil then usage(cmd, "--%s: '%s' is not %s", flag, item, what) end
    out[#out + 1] = v
  end
  if #out == 0 then usage(cmd, "--%s: no value", flag) end
  if #out == 1 then for i = 2, n do out[i] = out[1] end end
  if #out ~= n then usage(cmd, "--%s gives %d %s for %d devices (give one, or one per device)", flag, #out, noun or "values", n) end
  return out
end

local function time_ms(s)
  local num, unit = tostring(s):match("^(%d+%.?%d*)%s*(%a*)$")
  local mult = ({ [""] = 1, ms = 1, us = 1e-3, s = 1e3 })[unit or ""]
  return num and mult and tonumber(num) * mult or nil
end

-- The per-device settings of options o for n devices: { mem, disk_rate, slowdown, link = { rate,
-- delay_ms } } (each nil when not given).
function M.settings(cmd, o, n)
  local transport = require "loip.runtime.transport"
  local r = {}
  r.mem = M.each(cmd, "mem", o.mem, n, flags.parse_bytes, "a size (e.g. 1.5G, 600M)", "budgets")
  r.disk_rate = M.each(cmd, "disk-rate", o.disk_rate, n, function(v) local b = flags.parse_bytes(v) return b and b > 0 and b or nil end,
    "a rate in bytes/s (e.g. 500M)")
  r.slowdown = M.each(cmd, "slowdown", o.slowdown, n, function(v) local f = tonumber(v) return f and f >= 1 and f or nil end,
    "a factor >= 1", "factors")
  local rates = M.each(cmd, "link-rate", o.link_rate, n, function(v) return transport.parse_rate(v) and v or nil end,
    "a rate such as 100mbit")
  local delays = M.each(cmd, "link-delay", o.link_delay, n, time_ms, "a time such as 2ms")
  if rates or delays then r.link = { rate = rates, delay_ms = delays } end
  return r
end

-- Print a plan, its estimate and the scheduler's facts (human), or the JSON `loip plan` gives.
function M.report(p, est, info, sizes, mopts, as_json, extra)
  local plan = require "loip.plan"
  if as_json then
    local devs = {}
    for i, d in ipairs(est and est.devices or {}) do
      devs[i] = { comp_ms = d.comp_ms, load_ms = d.load_ms, uncover_ms = d.uncover_ms, comm_ms = d.comm_ms,
        memory_bytes = d.memory_bytes, idle_ms = d.idle_ms }
    end
    local out = { plan = plan.bare(p), estimate_ms_per_token = est and est.ms_per_token, devices = devs,
      scheduler_ms = info and info.scheduler_ms, scheduler = info and info.scheduler, cost_model = info and info.cost,
      stages = #p.devices[1].stages, bound = est and est.bound, bottleneck = est and est.bottleneck,
      comp_ms = est and est.comp_ms, comm_ms = est and est.comm_ms, uncover_ms = est and est.uncover_ms }
    for k, v in pairs(extra or {}) do out[k] = v end
    io.stdout:write(require("loip.tools.json").encode(out), "\n")
    return
  end
  io.stderr:write(plan.describe(p, sizes, mopts, est), "\n")
  if info then
    io.stderr:write(string.format("  scheduler %s with cost model %s: %.1f ms to decide%s\n", info.scheduler, info.cost,
      info.scheduler_ms, est and est.layout and (" (" .. est.layout .. ")") or ""))
  end
end

M.commands = {}

M.commands.plan = {
  usage = "loip plan (--model STORE|DIR | --like NAME [shape flags]) --devices N [--mem a,b,...] [flags]",
  summary = "Print the plan a scheduler chooses for a model on N devices, and its predicted time per token by\n"
    .. "device (compute, loading, uncovered loading, communication, memory), without running anything.\n"
    .. "--like plans a model's shape with no weights (loip synth --list names them).",
  flags = M.rows({
    { "model", "string", "a slice store or a model directory", metavar = "STORE|DIR" },
    { "like", "string", "plan a named shape with no weights instead (e.g. llama-3.3-70b)", metavar = "NAME" },
    { "dtype", "string", "with --like: the weights' dtype (bf16, f16, f32)", default = "bf16" },
  }, M.shape_flags("with --like: "), {
    { "devices", "int", "devices", default = 1, metavar = "N", check = function(v) return v >= 1 and v <= 64, "must be in 1..64" end },
    { "mem", "string", "each device's memory budget, e.g. 600M,400M,400M (one: the same for all; default unlimited)",
      metavar = "BYTES[,BYTES...]" },
    M.flags.disk_rate, M.flags.slowdown, M.flags.link_rate, M.flags.link_delay, M.flags.profile,
    { "device-profile", "string", "devices one does not own, from published figures: recipes/policies/device names, one or one per "
      .. "device (e.g. jetson-agx-orin-64gb,jetson-xavier-nx-16gb); budgets default to their memory less what the OS keeps",
      metavar = "NAME[,NAME...]" },
    { "context", "int", "KV cache positions planned for (default: min(model max, 4096), as generate and serve run)", check = function(v) return v > 0, "must be > 0" end },
    { "batch", "int", "tokens per message: prefill chunks and decoding requests (activations are sized for it)", default = 64,
      check = function(v) return v > 0, "must be > 0" end },
    { "max-batch", "int", "requests decoding at once (loip serve's --max-batch): the KV cache of each, a micro-batch of them per step",
      default = 1, check = function(v) return v >= 1, "must be >= 1" end },
    { "kv-tokens", "int", "KV cache positions the requests share (default: context x max-batch)",
      check = function(v) return v > 0, "must be > 0" end },
    { "threads", "int", "compute threads per device (for a calibration; 0: this machine's CPUs split among --devices, "
      .. "as loip generate --devices N gives its local devices)", default = 0, check = function(v) return v >= 0, "must be >= 0" end },
    M.flags.stages, M.flags.scheduler, M.flags.cost, M.flags.save_plan,
    { "json", "bool", "print one JSON object: plan, estimate_ms_per_token, devices, scheduler_ms" },
  }),
}

-- The planning problem `loip plan` and `loip simulate` (cmd) build from their flags: the model
-- (--model or --like), the profiles (--profile, else a calibration of this machine), budgets,
-- disks, links, slowdowns. Returns problem, sizes.
function M.problem_of(cmd, o)
  local problem = require "loip.plan.problem"
  local profile = require "loip.plan.profile"
  if (o.model == nil) == (o.like == nil) then usage(cmd, "give --model STORE|DIR or --like NAME (one of them)") end
  local n = o.devices
  local set = M.settings(cmd, o, n)
  -- (the threads a local device gets: the calibration and the sizes as the cluster's)
  o.threads = profile.split_threads(n, o.threads)
  local sizes, cfg, dtype, _
  if o.max_batch > o.batch then usage(cmd, "--max-batch %d is more than --batch %d: each decoding request takes a token of every step", o.max_batch, o.batch) end
  local sopts = { batch = o.batch, threads = o.threads, logits_tokens = 1, max_seqs = o.max_batch, kv_tokens = o.kv_tokens,
    kv_plan_tokens = o.plan_tokens }
  -- the context planned for: --context, else loip's default (as generate and serve run), at most the model's
  local function context_of(config)
    local max = config.max_position_embeddings or 2048
    return math.min(o.context or require("loip.model").default_context(max), max)
  end
  local is_store = o.model and require("loip.model").locate(o.model) == "store"
  if o.like then
    local over = { layers = o.layers, dim = o.dim, ffn = o.ffn, heads = o.heads, kv_heads = o.kv_heads, head_dim = o.head_dim, vocab = o.vocab }
    sopts.context = context_of(require("loip.model.synth").config(setmetatable({ like = o.like, dtype = o.dtype:lower() }, { __index = over })))
    sizes, cfg, _, dtype = problem.model_of_shape(o.like, over, setmetatable({ dtype = o.dtype }, { __index = sopts }))
  elseif is_store then
    sopts.context = context_of(require("loip.model.store").read_manifest(o.model).config)
    sizes, cfg, _, dtype = problem.model_of_store(o.model, sopts)
  else
    sizes, cfg, _, dtype = problem.model_of_source(o.model, sopts, function(config) sopts.context = context_of(config) end)
  end
  if sopts.batch > sopts.context then sopts.batch = sopts.context end
  if o.profile and o.device_profile then usage(cmd, "give --profile or --device-profile, not both") end
  local profiles = {}
  local budgets = set.mem
  if o.device_profile then
    -- devices one does not own, from their published figures (recipes/policies/device), for this shape
    local names = {}
    for x in o.device_profile:gmatch("[^,]+") do names[#names + 1] = x end
    if #names ~= 1 and #names ~= n then usage(cmd, "--device-profile names %d devices, --devices is %d", #names, n) end
    local shape = problem.shape_of(cfg, dtype)
    local devs = {}
    for i = 1, n do
      local name = names[#names == 1 and 1 or i]
      local ok, dev = pcall(require("loip.policy").load, "device", name)
      if not ok then usage(cmd, "--device-profile %s: %s", name, tostring(dev)) end
      devs[i], profiles[i] = dev, dev.profile(shape)
    end
    if not budgets then
      budgets = {}
      for i, dev in ipairs(devs) do budgets[i] = dev.memory_bytes - dev.reserve_bytes end
    end
  end
  local pr = o.profile and profile.load(o.profile)
  if pr and pr.devices and #pr.devices ~= n then
    usage(cmd, "--profile %s profiles %d devices, --devices is %d", o.profile, #pr.devices, n)
  end
  if not pr and not o.device_profile then
    -- (this machine's figures for every device: its local devices, as `loip generate --devices N`
    -- starts them, sharing its disk; the same calibration, from the same cache file, as theirs)
    pr = profile.calibrate { store = is_store and o.model or nil, cfg = cfg, dtype = dtype, threads = o.threads, context = sopts.context,
      readers = n }
  end
  if pr then
    for i = 1, n do profiles[i] = pr.devices and pr.devices[i] or pr end
  end
  local link_rate -- bytes/s per link
  if set.link and set.link.rate then
    link_rate = {}
    for i, v in ipairs(set.link.rate) do link_rate[i] = require("loip.runtime.transport").parse_rate(v) end
  end
  local prob = problem.new { model = sizes, shape = problem.shape_of(cfg, dtype), n = n, budgets = budgets or 0,
    profiles = profiles, disk_rate = set.disk_rate, slowdown = set.slowdown, link_rate = link_rate,
    link_delay_ms = set.link and set.link.delay_ms, cluster = n > 1, in_process = n == 1, stages = o.stages,
    context = sopts.context, batch = sopts.batch, micro_batch = o.max_batch }
  return prob, sizes
end

function M.commands.plan.run(o)
  local policy = require "loip.policy"
  local plan = require "loip.plan"
  local prob, sizes = M.problem_of("plan", o)
  local n = o.devices
  local p, est, info = policy.plan(prob, { scheduler = o.scheduler, cost = o.cost_model })
  if o.save_plan then plan.save(o.save_plan, p) end
  M.report(p, est, info, sizes, require("loip.plan.space").memory_opts(prob), o.json, { model = o.model or o.like, devices_count = n })
  return 0
end

M.commands.profile = {
  usage = "loip profile --model STORE [--out FILE] [flags]\n       loip profile --hosts h1:p,h2:p,... --out FILE",
  summary = "Measure a device for planning and write a JSON profile (for --profile): compute time of an MHA and an\n"
    .. "MLP block of the store's shape for batches and context lengths, compute while the disk streams, the\n"
    .. "loader's cold read rate (O_DIRECT), the transport's time per message, memory available. With --hosts,\n"
    .. "every running worker measures itself on its own store, and the link to its ring neighbour.",
  flags = {
    { "model", "string", "the slice store whose blocks are timed and read", metavar = "STORE" },
    { "hosts", "string", "running workers to profile instead (with --token, LOIP_CLUSTER_TOKEN or --curve-keys)", metavar = "LIST" },
    M.flags.token, M.flags.curve_keys,
    { "out", "string", "the profile file to write (default: print it)", metavar = "FILE.json" },
    { "threads", "int", "compute threads (0: all CPUs)", default = 0 },
    { "batches", "string", "batch sizes to time", default = "1,2,4,8" },
    { "contexts", "string", "context lengths to time attention at", default = "64,256,1024" },
    { "read", "bytes", "bytes to read for the disk rate", default = 512 * 1024 * 1024 },
    { "disk-rate", "bytes", "read through the loader held to this rate (emulating a slower disk)" },
    { "readers", "int", "local devices that will read this disk at once (a cluster of N local workers): the disk and "
      .. "compute while it streams are measured with as many readers, each device priced at its share", default = 1,
      check = function(v) return v >= 1, "must be >= 1" end },
  },
}

local function numbers(cmd, flag, text)
  local out = {}
  for item in tostring(text):gmatch("[^,]+") do
    local v = tonumber(item)
    if not v or v < 1 or v ~= math.floor(v) then usage(cmd, "--%s: '%s' is not a positive integer", flag, item) end
    out[#out + 1] = v
  end
  return out
end

function M.commands.profile.run(o)
  local profile = require "loip.plan.profile"
  local json = require "loip.tools.json"
  local pr
  if o.hosts then
    local cluster = require "loip.cluster"
    local hosts = M.hosts("profile", o)
    if not o.model then usage("profile", "--hosts needs --model STORE: the head's copy of the store the workers hold") end
    local c = cluster.connect(hosts, { store = o.model, token = M.token(o), keys = o.curve_keys })
    local ok, err = pcall(function()
      pr = { loip_profile = profile.VERSION, created = os.date("!%Y-%m-%dT%H:%M:%SZ"), devices = {} }
      for i, d in ipairs(c.devices) do
        io.stderr:write(string.format("device %d (%s): measuring\n", i, d.endpoint))
        local nxt = c.devices[i % #c.devices + 1].endpoint
        local r = c:ask(i, { kind = "PROFILE", payload = json.encode({ full = true, batches = numbers("profile", "batches", o.batches),
          contexts = numbers("profile", "contexts", o.contexts), read = o.read, disk_rate = o.disk_rate,
          link_to = #c.devices > 1 and nxt or nil }) }, 600000, d.bulk)
        pr.devices[i] = json.decode(r.payload)
      end
    end)
    c:close()
    if not ok then error(err, 0) end
  else
    if not o.model then usage("profile", "--model STORE is required (or --hosts)") end
    pr = profile.of_store(o.model, { threads = o.threads, batches = numbers("profile", "batches", o.batches),
      contexts = numbers("profile", "contexts", o.contexts), read = o.read, disk_rate = o.disk_rate, readers = o.readers,
      progress = function(what) io.stderr:write("measuring ", what, "\n") end })
  end
  if o.out then
    profile.save(o.out, pr)
    io.stderr:write("profile -> ", o.out, "\n")
  else
    io.stdout:write(json.encode_sorted(pr, 2), "\n")
  end
  return 0
end

return M
