-- What the commands of lua/loip/cmd/ share beyond their flags (those are loip.ui.flags'):
-- usage errors, the kernels chosen, the model a cluster runs (a store, sliced into the cache when
-- needed), the workers of --hosts, the values a flag takes once or once per device, the
-- planning problem `plan` and `simulate` build, and the plan's report.
-- Requires inside functions: every command loads this module, and `loip help` every command;
-- what a function uses loads when it runs (`loip help` loads no FFI).
local errors = require "loip.error"
local flags = require "loip.ui.flags"

local M = {}

-- A usage error of command cmd (the dispatcher prints "loip: cmd: ..." and exits 2).
function M.usage(cmd, fmt, ...) errors.raise("usage", cmd .. ": " .. string.format(fmt, ...)) end
local usage = M.usage

function M.stderr(fmt, ...) io.stderr:write(string.format(fmt, ...)) end

-- Text to stdout as it comes (a prompt, the tokens generated), flushed; M.mid_line says whether it
-- left a line unfinished, so that an error printed after it starts on its own line (loip.cli).
M.mid_line = false
function M.out(text)
  if text == "" then return end
  io.stdout:write(text)
  io.stdout:flush()
  M.mid_line = text:sub(-1) ~= "\n"
end

-- The CPU kernel variant of --kernels.
function M.use_kernels(name)
  require("loip.core").must(require("loip.runtime.exec").kernels_use(name, "--kernels"))
end

-- The runtime config of the model at path (a store, or any model loip opens: n_layers, max_seq,
-- vocab_size ...), read without loading it.
function M.model_config(path)
  local model = require "loip.model"
  if model.locate(path) == "store" then
    local st = require "loip.model.store"
    return st.config(path, st.read_manifest(path))
  end
  local src = require("loip.model.slice").open_source(path)
  local c = src.c
  src.close()
  return c
end

-- The layers of the model at path, read without loading it.
function M.model_layers(path) return M.model_config(path).n_layers end

-- A usage error of cmd when a prompt of n tokens leaves no room in a context of ctx positions
-- (most: the most --context may be, where the command caps it at the model's).
function M.prompt_fits(cmd, n, ctx, most)
  if n < ctx then return end
  local room = n == ctx and ", which leaves no room for a token to generate" or ""
  if most and n >= most then
    usage(cmd, "the prompt has %d tokens; the context is %d%s, and this model takes at most %d: shorten the prompt", n, ctx, room, most)
  end
  usage(cmd, "the prompt has %d tokens; the context is %d%s: raise --context (to at least %d) or shorten the prompt", n, ctx, room, n + 1)
end

-- Refuses a --prompt that leaves no room in the context (--context, else the model's default)
-- before any work (opening the model, slicing, planning, starting workers): counted by the model's
-- tokenizer (--tokenizer's), with its BOS, as generation counts it. A model or tokenizer that cannot
-- be read is left to the command, whose own path says why. (A chat template's tokens are counted
-- where it is applied.)
function M.check_prompt(cmd, o)
  if o.prompt == nil or o.chat or o.chat_template then return end
  -- (no token is shorter than a byte but a BOS, a leading space and a few specials: a prompt of
  -- fewer bytes than the context fits, and nothing need be opened to know it)
  local most = #o.prompt + 8
  if o.context and most < o.context then return end
  local ok, n, ctx = pcall(function()
    local cfg = M.model_config(o.model)
    local c = o.context or require("loip.model").default_context(cfg.max_seq)
    if most < c then return 0, c end
    local tok = require("loip.text.tokenizer").open(o.model, { path = o.tokenizer, vocab_size = cfg.vocab_size })
    local count = #tok:encode(o.prompt, { bos = true })
    tok:close()
    return count, c
  end)
  if ok then M.prompt_fits(cmd, n, ctx) end
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
        memory_bytes = d.memory_bytes, idle_ms = d.idle_ms, ship_bytes = d.ship_bytes }
    end
    local out = { plan = plan.bare(p), estimate_ms_per_token = est and est.ms_per_token, devices = devs,
      scheduler_ms = info and info.scheduler_ms, scheduler = info and info.scheduler, cost_model = info and info.cost,
      stages = #p.devices[1].stages, bound = est and est.bound, bottleneck = est and est.bottleneck,
      comp_ms = est and est.comp_ms, comm_ms = est and est.comm_ms, uncover_ms = est and est.uncover_ms,
      ship_ms = est and est.ship_ms } -- (shipping's one-off cost to empty caches: recipes/policies/cost/loip.lua)
    if sizes.kv_kinds then -- (sliding-window layers: each device's KV by layer kind)
      out.kv_kinds = sizes.kv_kinds
      for i in ipairs(p.devices) do
        local full, win = plan.kv_layer_kinds(p, i, sizes)
        devs[i] = devs[i] or {}
        devs[i].kv_full_layers, devs[i].kv_window_layers = full, win
        devs[i].kv_bytes = plan.memory(p, i, sizes, mopts).kv
      end
    end
    for k, v in pairs(extra or {}) do out[k] = v end
    io.stdout:write(require("loip.text.json").encode(out), "\n")
    return
  end
  io.stderr:write(plan.describe(p, sizes, mopts, est), "\n")
  if info then
    io.stderr:write(string.format("  scheduler %s with cost model %s: %.1f ms to decide%s\n", info.scheduler, info.cost,
      info.scheduler_ms, est and est.layout and (" (" .. est.layout .. ")") or ""))
  end
  if est and est.ship_ms then -- (a one-off cost: loip.cluster.ship)
    local n = 0
    for _, d in ipairs(est.devices or {}) do n = n + (d.ship_bytes or 0) end
    io.stderr:write(string.format("  shipping to empty caches: %s, %.1f s over the links\n", require("loip.ui.progress").human(n),
      est.ship_ms / 1000))
  end
end

-- The planning problem `loip plan` and `loip simulate` (cmd) build from their flags: the model
-- (--model or --like), the profiles (--profile, else a calibration of this machine), budgets,
-- disks, links, slowdowns; o.logits_tokens (not a flag: loip simulate's draft rows, as the cluster's
-- planner reserves them; default 1). Returns problem, sizes.
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
  local sopts = { batch = o.batch, threads = o.threads, logits_tokens = o.logits_tokens or 1, max_seqs = o.max_batch, kv_tokens = o.kv_tokens,
    plan_positions = o.plan_positions }
  -- the context planned for: --context, else loip's default (as generate and serve run), at most the model's
  local function context_of(config)
    local max = config.max_position_embeddings or 2048
    return math.min(o.context or require("loip.model").default_context(max), max)
  end
  local is_store = o.model and require("loip.model").locate(o.model) == "store"
  if o.like then
    local over = { layers = o.layers, dim = o.dim, ffn = o.ffn, heads = o.heads, kv_heads = o.kv_heads, head_dim = o.head_dim, vocab = o.vocab,
      experts = o.experts, experts_per_token = o.experts_per_token, sliding_window = o.sliding_window, layer_types = o.layer_types }
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
    context = sopts.context, batch = sopts.batch, micro_batch = o.max_batch, ends = o.ends }
  return prob, sizes
end


-- The draft policy of --draft (with --draft-model and --draft-mem as its settings): a
-- loip.policy instance, or nil (none). Refuses what does not go together, naming the flags.
function M.draft(cmd, o)
  local name = o.draft
  if name == nil or name == "none" then
    for _, f in ipairs({ "draft_tokens", "draft_model", "draft_mem", "draft_device" }) do
      if o[f] ~= nil then M.usage(cmd, "--%s needs --draft", (f:gsub("_", "-"))) end
    end
    return nil
  end
  local policy = require "loip.policy"
  local base = policy.parse(name)
  local params = {}
  if o.draft_model then
    if base ~= "model" then M.usage(cmd, "--draft-model is the model of --draft model (not --draft %s)", tostring(base)) end
    params.path = o.draft_model
  end
  if o.draft_mem then params.mem = o.draft_mem end
  if o.draft_device then
    if base ~= "model" and base ~= "self" then M.usage(cmd, "--draft-device is for --draft model or self (not --draft %s)", tostring(base)) end
    if not o.devices and not o.hosts then
      M.usage(cmd, "--draft-device is for several devices (--devices or --hosts): one device runs its draft in its own process")
    end
    params.device = o.draft_device
  end
  local ok, p = pcall(policy.load, "draft", name, next(params) and params or nil)
  if not ok then M.usage(cmd, "--draft %s: %s", name, tostring(p)) end
  return p
end

return M
