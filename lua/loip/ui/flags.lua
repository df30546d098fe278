-- Command-line flags: a command declares its flags once; parsing, validation and --help text
-- all come from that declaration.
--   spec = { usage = "loip generate [flags]", summary = "...",
--            flags = { { "max-tokens", "int", "tokens to generate", default = 256 }, ... },
--            positional = { "FILE" } }
-- positional names the words a command takes besides its flags, in order (the last may end in
-- "...": any number more); a command without it takes none. More words than it names are refused,
-- naming them (a value with spaces not quoted: `--prompt Once upon a time`).
-- A row { "old-name", "int", alias_of = "new-name" } is a renamed flag's deprecated alias: it
-- sets new-name's option and says once on stderr that it is deprecated and what to use.
local errors = require "loip.error"
local suggest = require "loip.ui.suggest"

local M = {}

local function fail(cmd, msg) errors.raise("usage", cmd .. ": " .. msg) end

-- Says once (per process) on stderr that `old`, a renamed flag or option of `who`, is deprecated
-- and what to use instead; the deprecated name works meanwhile.
local warned = {}
function M.deprecated(who, old, new)
  if warned[who .. old] then return end
  warned[who .. old] = true
  io.stderr:write(string.format("%s: %s is deprecated (it goes in a later release): use %s\n", who, old, new))
end

-- opts[new], else opts[old] (a Lua option renamed: deprecated, said once); who names the
-- function taking the options.
function M.renamed(opts, old, new, who)
  if opts[new] ~= nil or opts[old] == nil then return opts[new] end
  M.deprecated(who, old, new)
  return opts[old]
end

-- Parses "1.5G", "600M", "4096" into bytes.
function M.parse_bytes(s)
  local num, unit = tostring(s):match("^(%d+%.?%d*)%s*([KkMmGgTt]?)[iI]?[bB]?$")
  if not num then return nil end
  local mult = ({ [""] = 1, k = 1024, m = 1024 ^ 2, g = 1024 ^ 3, t = 1024 ^ 4 })[unit:lower()]
  return math.floor(tonumber(num) * mult)
end

local convert = {
  int = function(v) local n = tonumber(v) if n and n == math.floor(n) then return n end end,
  number = function(v) return tonumber(v) end,
  string = function(v) return v end,
  bytes = M.parse_bytes,
}

-- Returns options table (flag names with '-' turned into '_') and positional array.
function M.parse(spec, argv, first)
  local opts, pos, at = {}, {}, {} -- (at[k]: the index in argv of positional word k)
  local byname = {}
  for _, f in ipairs(spec.flags) do
    byname[f[1]] = f
    if f.default ~= nil then opts[f[1]:gsub("-", "_")] = f.default end
  end
  local i = first or 1
  if spec.passthrough then -- every argument belongs to what the command runs
    for j = i, #argv do pos[#pos + 1] = argv[j] end
    return opts, pos
  end
  while i <= #argv do
    local a = argv[i]
    if (a == "--help" or a == "-h") and spec.usage then -- recipes get --help for free
      io.stdout:write(M.help(spec))
      os.exit(0)
    elseif a == "--" then
      for j = i + 1, #argv do pos[#pos + 1] = argv[j] end
      break
    elseif a:sub(1, 2) == "--" then
      local name, value = a:match("^%-%-([^=]+)=(.*)$")
      name = name or a:sub(3)
      local f = byname[name]
      if not f then
        local names = {}
        for _, x in ipairs(spec.flags) do if not x.alias_of then names[#names + 1] = x[1] end end
        local near = suggest.closest(name, names)
        fail(spec.name, "unknown flag --" .. name .. (near and ("; did you mean --" .. near .. "?") or " (see --help)"))
      end
      local typed = name -- (errors name the flag as typed; an alias sets its new name's option)
      if f.alias_of then
        M.deprecated(spec.name or "loip", "--" .. name, "--" .. f.alias_of)
        name, f = f.alias_of, byname[f.alias_of]
      end
      local key = name:gsub("-", "_")
      name = typed
      if f[2] == "bool" then
        if value ~= nil then fail(spec.name, "--" .. name .. " takes no value") end
        opts[key] = true
      else
        if value == nil then
          i = i + 1
          value = argv[i]
          if value == nil then fail(spec.name, "--" .. name .. " needs a value") end
        end
        local v = convert[f[2]](value)
        if v == nil then fail(spec.name, string.format("--%s: '%s' is not a valid %s", name, value, f[2])) end
        if f.check then
          local ok, why = f.check(v)
          if not ok then fail(spec.name, string.format("--%s: %s", name, why)) end
        end
        opts[key] = v
      end
    elseif spec.stop_at_positional then
      for j = i, #argv do pos[#pos + 1] = argv[j] end
      break
    else
      pos[#pos + 1] = a
      at[#pos] = i
    end
    i = i + 1
  end
  M.check_positional(spec, pos, argv, at)
  for _, f in ipairs(spec.flags) do
    if f.required and opts[f[1]:gsub("-", "_")] == nil then fail(spec.name, "--" .. f[1] .. " is required") end
  end
  return opts, pos
end

-- Refuses the words past those spec.positional names (see above), naming them. at[k] is the
-- index in argv of positional word k: when the first word refused follows a flag's value (given
-- as `--flag value`), the message shows that flag with the words quoted, as probably meant.
function M.check_positional(spec, pos, argv, at)
  local names = spec.positional or {}
  local last = names[#names]
  if (last and last:sub(-3) == "...") or #pos <= #names then return end
  local extra = {}
  for k = #names + 1, #pos do extra[#extra + 1] = "'" .. pos[k] .. "'" end
  local what = #names == 0 and "it takes no words besides its flags"
    or string.format("it takes %d besides its flags (%s)", #names, table.concat(names, " "))
  local hint = ""
  local j = at and at[#names + 1]
  local flag = j and j > 2 and argv[j - 2]:match("^%-%-([^=]+)$")
  local row
  for _, f in ipairs(spec.flags) do if f[1] == flag then row = f end end
  if row and row[2] ~= "bool" then
    local words = { argv[j - 1] }
    for k = #names + 1, #pos do
      if at[k] ~= j + (k - #names - 1) then break end -- (the words right after the value)
      words[#words + 1] = pos[k]
    end
    hint = string.format(" (if %s --%s's value, quote it: --%s \"%s\")", #words == 2 and "it belongs to" or "they belong to",
      flag, flag, table.concat(words, " "))
  end
  fail(spec.name or "loip", string.format("unexpected word%s %s: %s%s", #extra == 1 and "" or "s", table.concat(extra, " "),
    what, hint))
end

function M.help(spec)
  local out = { "usage: " .. spec.usage, "", spec.summary, "" }
  if #spec.flags > 0 then out[#out + 1] = "flags:" end
  for _, f in ipairs(spec.flags) do
    local left = "  --" .. f[1] .. (f[2] ~= "bool" and (" " .. (f.metavar or f[2]:upper())) or "")
    local right = f[3] or ("deprecated: use --" .. f.alias_of)
    if f.default ~= nil and f.default ~= "" and f[2] ~= "bool" then right = right .. " (default " .. tostring(f.default) .. ")" end
    if f.required then right = right .. " (required)" end
    out[#out + 1] = string.format("%-30s %s", left, right)
  end
  if spec.epilog then out[#out + 1] = "" out[#out + 1] = spec.epilog end
  return table.concat(out, "\n") .. "\n"
end

-- The flag rows several commands take, defined once here (a command lists them in its flags).
M.shared = {
  threads = { "threads", "int", "compute threads (0: all CPUs)", default = 0,
    check = function(v) return v >= 0, "must be >= 0" end },
  kernels = { "kernels", "string", "CPU kernel variant: auto, ref, avx2, avx512", default = "auto" },
  cpu_latency = { "cpu-latency", "int", "hold this machine's CPU wake-up latency at US microseconds while "
    .. "running (Linux PM QoS, /dev/cpu_dma_latency; root): fewer slow wake-ups per hop, more idle power",
    metavar = "US", check = function(v) return v >= 0, "must be >= 0" end },
  scheduler = { "scheduler", "string", "the scheduler that decides the plan: a name (recipes/policies/scheduler: loip, "
    .. "even, uniform, pipeline, pipeline-offload, edgeshard, brute) or a file of your own", default = "loip",
    metavar = "NAME|FILE.lua" },
  cost_model = { "cost-model", "string", "the cost model the scheduler minimises: a name (recipes/policies/cost) or a file",
    default = "loip", metavar = "NAME|FILE.lua" },
  profile = { "profile", "string", "measured figures of the devices (loip profile); default: a calibration of this "
    .. "machine (a few seconds, once, kept in ~/.cache/loip)", metavar = "FILE.json" },
  stages = { "stages", "int", "stages per device (default: the scheduler's choice)", metavar = "S",
    check = function(v) return v >= 1, "must be >= 1" end },
  ends = { "ends", "string", "where the embedding and head stay under --mem: auto (in memory, or on disk when that "
    .. "plans faster or alone fits) or memory", default = "auto", metavar = "auto|memory",
    check = function(v) return v == "auto" or v == "memory", "must be auto or memory" end },
  link_rate = { "link-rate", "string", "links between devices of this rate (emulated on local devices), e.g. 100mbit; "
    .. "one, or one per link (link i: device i to the next)", metavar = "RATE[,RATE...]" },
  dead_after = { "dead-after", "int", "with --devices/--hosts: a device whose heartbeat is silent this long, during a "
    .. "request or idle, is lost and the others plan without it (default 1500)", metavar = "MS",
    check = function(v) return v > 0, "must be > 0" end },
  link_delay = { "link-delay", "string", "this one-way delay per link, e.g. 2ms; one, or one per link", metavar = "TIME[,TIME...]" },
  disk_rate = { "disk-rate", "string", "slice store: each device's disk at most this fast, bytes/s (e.g. 500M; emulated); "
    .. "one, or one per device", metavar = "BYTES[,BYTES...]" },
  slowdown = { "slowdown", "string", "devices whose compute takes this many times as long (emulated on local devices), "
    .. "e.g. 1,1.5,2; one, or one per device", metavar = "F[,F...]" },
  save_plan = { "save-plan", "string", "write the plan as a Lua file (what --plan reads)", metavar = "FILE.lua" },
  token = { "token", "string", "with --hosts: the cluster secret the workers hold (default: LOIP_CLUSTER_TOKEN)", metavar = "SECRET" },
  mem = { "mem", "string", "memory budget for weights, KV cache and activations, e.g. 1.5G (default: unlimited); "
    .. "with --devices, one per device: 600M,400M,400M", metavar = "BYTES" },
  devices = { "devices", "int", "run on N local devices (worker processes) of a cluster", metavar = "N",
    check = function(v) return v >= 1 and v <= 64, "must be in 1..64" end },
  hosts = { "hosts", "string", "run on running workers: host:port,host:port,... (with --token, LOIP_CLUSTER_TOKEN or --curve-keys)", metavar = "LIST" },
  plan_positions = { "plan-positions", "int", "slice store: KV positions the plan's memory holds, all requests together (default: "
    .. "all the run takes); past them the KV cache grows inside each budget and the --online policy makes room live "
    .. "(restaging, lending, offloading blocks)", metavar = "N", check = function(v) return v >= 1, "must be >= 1" end },
  online = { "online", "string", "the online policy run before every step: a name (recipes/policies/online: loip, "
    .. "thresholds, recompute), a file, or none (default: loip with --plan-positions, else none)", metavar = "NAME|FILE.lua" },
  curve_keys = { "curve-keys", "string", "with --hosts: the cluster's CURVE key directory instead of a token (DIR/secret.key)", metavar = "DIR" },
  -- mixture of experts (loip.model.experts)
  experts = { "experts", "string", "a mixture of experts' expert cache: which experts stay in memory and how far pre-gating "
    .. "reads ahead (recipes/policies/experts: lru, lfu, static; or a file; default lru:prefetch=1)", metavar = "NAME[:SETTINGS]|FILE.lua" },
  kernels_policy = { "kernels-policy", "string", "the kernels' settings each device opens with, chosen from its profile "
    .. "(recipes/policies/kernels: loip, the quantized matvecs' fastest prefetch distance measured; or a file; "
    .. "LOIP_KERNELS_PREFETCH overrides; default loip)", metavar = "NAME[:SETTINGS]|FILE.lua" },
  routing_profile = { "routing-profile", "string", "a routing profile (loip profile --routing) for --experts static",
    metavar = "FILE" },
  -- speculative decoding (loip.engine.request.draft)
  draft = { "draft", "string", "speculative decoding: a draft policy proposes tokens that one step verifies, exactly the "
    .. "model's output (recipes/policies/draft: ngram, lookahead, self[:layers=L|all], model; or a file); none: off", metavar = "NAME[:SETTINGS]|FILE.lua" },
  draft_tokens = { "draft-tokens", "int", "with --draft: draft K tokens every step (default: chosen each step from the measured "
    .. "acceptance and the price of a step)", metavar = "K", check = function(v) return v >= 0 and v <= 64, "must be in 0..64" end },
  draft_model = { "draft-model", "string", "with --draft model: the draft model (it must share the target's tokenizer)", metavar = "DIR" },
  draft_device = { "draft-device", "string", "with --draft model or self and several devices: where the draft runs: head (the "
    .. "head's process, the default), a device number, or auto (the fastest device whose budget holds it twice over); its "
    .. "memory is charged to that device's budget, which the scheduler plans with", metavar = "N|auto|head" },
  draft_mem = { "draft-mem", "string", "with --draft model or self: a memory budget for the draft's weights and KV cache, e.g. 256M",
    metavar = "BYTES" },
}


-- A deprecated alias `old` of the flag row `row` (a renamed flag's name, which still works).
function M.alias(old, row) return { old, row[2], metavar = row.metavar, alias_of = row[1] } end

-- The overrides of a named shape's config that `synth` and `plan --like` take (loip.model.synth
-- reads them from the parsed options: layers, dim, ffn, heads, kv_heads, head_dim, vocab), their
-- help starting with `lead`.
function M.shape_flags(lead)
  local rows = {}
  for _, r in ipairs({ { "layers", "num_hidden_layers" }, { "dim", "hidden_size" }, { "ffn", "intermediate_size" },
    { "heads", "num_attention_heads" }, { "kv-heads", "num_key_value_heads" }, { "head-dim", "head_dim" },
    { "vocab", "vocab_size" } }) do
    rows[#rows + 1] = { r[1], "int", lead .. "override " .. r[2] .. (r[1] == "ffn" and " (a mixture of experts: an expert's)" or "") }
  end
  rows[#rows + 1] = { "experts", "int", lead .. "a mixture of experts' shape: override its expert count" }
  rows[#rows + 1] = { "experts-per-token", "int", lead .. "a mixture of experts' shape: override num_experts_per_tok" }
  rows[#rows + 1] = { "sliding-window", "int", lead .. "attention windows of N positions (config.json sliding_window): "
    .. "every layer's, or those --layer-types names", metavar = "N" }
  rows[#rows + 1] = { "layer-types", "string", lead .. "with --sliding-window: which layers are windowed, a pattern of s "
    .. "(sliding_attention) and f (full_attention) repeated over the layers, e.g. sssssf", metavar = "PATTERN" }
  return rows
end

-- Lists of flag rows, one after the other.
function M.rows(...)
  local out = {}
  for _, list in ipairs({ ... }) do for _, r in ipairs(list) do out[#out + 1] = r end end
  return out
end

return M
