-- `loip serve`: serve the model over HTTP with OpenAI's API, on one device or a cluster.
-- Requires inside functions: `loip help` loads every command, so a command loads the modules
-- it uses when it runs (`loip help` loads no FFI).
local common = require "loip.cli.inputs"
local flags = require "loip.ui.flags"

local usage = common.usage

local M = {
  brief = "serve the model over HTTP with OpenAI's API (many requests at once)",
  usage = "loip serve --model DIR|STORE [--devices N | --hosts LIST] [--mem ...] [--context N] [--host 127.0.0.1] --port P [--api-key KEY] [--max-batch B] [--draft ngram|self|model ...]",
  summary = "Serve the model over HTTP with OpenAI's API: POST /v1/chat/completions and /v1/completions\n"
    .. "(stream: true for server-sent events), GET /v1/models, /health and /metrics (Prometheus). Up to\n"
    .. "--max-batch requests decode together as one micro-batch; more wait in a queue (--max-queue; past it,\n"
    .. "429). On several devices (--devices, --hosts) the scheduler plans for that batch. Stops on SIGINT/SIGTERM.",
  flags = {
    { "model", "string", "model directory, GGUF file, slice store (needed for --devices/--hosts) or llama2.c checkpoint", required = true, metavar = "DIR" },
    { "port", "int", "TCP port (0: any free one, printed)", default = 8080,
      check = function(v) return v >= 0 and v <= 65535, "must be in 0..65535" end },
    { "host", "string", "IPv4 address to listen at (0.0.0.0: every interface)", default = "127.0.0.1" },
    { "api-key", "string", "require Authorization: Bearer KEY on /v1 (default: LOIP_API_KEY, else none)", metavar = "KEY" },
    { "served-name", "string", "the model id clients name (default: the model directory's name)", metavar = "NAME" },
    { "max-batch", "int", "requests decoding at once (sequence slots, each with its own KV cache)", default = 4,
      check = function(v) return v >= 1 and v <= 256, "must be in 1..256" end },
    { "max-queue", "int", "requests waiting for a slot before the server answers 429", default = 64,
      check = function(v) return v >= 0, "must be >= 0" end },
    { "context", "int", "positions per request (prompt and completion; default: min(model max, 4096))",
      check = function(v) return v > 0, "must be > 0" end },
    { "kv-tokens", "int", "KV cache positions all requests share (default: context x max-batch)",
      check = function(v) return v > 0, "must be > 0" end },
    flags.shared.plan_positions, flags.alias("plan-tokens", flags.shared.plan_positions), flags.shared.online,
    { "link-schedule", "string", "local devices: emulated links that change while serving (recipes/policies/links or a file)",
      metavar = "NAME|FILE.lua" },
    { "step-tokens", "int", "tokens one step carries: the decoding requests' and prompt chunks (default 64)",
      default = 64, check = function(v) return v >= 1, "must be >= 1" end },
    { "prefill", "string", "newcomers' prompts: chunked (in the steps beside the others' decoding) or own (steps of their own)",
      default = "chunked", check = function(v) return v == "chunked" or v == "own", "must be chunked or own" end },
    { "max-body", "bytes", "largest request body", default = 4 * 1024 * 1024, metavar = "BYTES" },
    { "chat-template", "string", "Jinja chat template to use instead of the model's", metavar = "FILE" },
    { "tool-parser", "string", "how the model writes tool calls: llama3, qwen, mistral, hermes (recipes/policies/tools) or a "
      .. "FILE.lua (default: detected from the chat template)", metavar = "NAME" },
    { "no-prompt-cache", "bool", "keep no KV of finished requests for later ones sharing their prefix (the exact prefix cache)" },
    { "prompt-cache-dir", "string", "the prefix cache's disk tier: every cached KV group written here too (per device), "
      .. "read back on a hit, kept across restarts with the same store", metavar = "DIR" },
    { "prompt-cache-disk", "bytes", "the disk tier's bound per device (least recently used files removed first)",
      default = 2 ^ 31, metavar = "BYTES" },
    flags.shared.mem, flags.shared.devices, flags.shared.hosts, flags.shared.dead_after,
    flags.shared.token, flags.shared.curve_keys,
    { "join-listen", "string", "a cluster: admit workers that join while it serves (loip worker --join) at this address "
      .. "(port 0: any, printed)", metavar = "ADDR:PORT" },
    flags.shared.stages, flags.shared.ends, flags.shared.link_rate, flags.shared.link_delay, flags.shared.slowdown, flags.shared.disk_rate,
    flags.shared.scheduler, flags.shared.cost_model, flags.shared.profile,
    flags.shared.experts, flags.shared.routing_profile, flags.shared.kernels_policy,
    flags.shared.draft, flags.shared.draft_tokens, flags.shared.draft_model, flags.shared.draft_device, flags.shared.draft_mem,
    { "draft-per-request", "string", "what an API request's `draft` field may choose (comma-separated): none, ngram (loads "
      .. "nothing) and the --draft policy's name (its settings that keep the loaded draft: tree, width, levels; and "
      .. "draft_tokens up to --draft-tokens); default: any such field is refused", metavar = "LIST" },
    { "trace", "string", "write a Chrome trace (Perfetto) of every load, compute and wait, and of speculative decoding's "
      .. "drafts and verifying steps, when the server stops (a slice store or --devices/--hosts)", metavar = "OUT.json" },
    flags.shared.threads, flags.shared.kernels,
    { "quiet", "bool", "no log line per request" },
    unpack(require("loip.cmd.discover").serve_flags), -- (--discover: discovery on a LAN)
  },
}

-- --trace: the devices' events (one device's m.trace, a cluster's collected), the online
-- policy's adaptations and speculative decoding's spans, written to path.
function M.write_trace(path, m, c, b, quiet)
  local tr = c and c:collect_trace(require("loip.engine.trace").new()) or m.trace or require("loip.engine.trace").new()
  require("loip.engine.request.online").add_to_trace(tr, b.adaptations)
  require("loip.engine.request.draft_trace").add_to_trace(tr, b.draft)
  tr:write(path)
  if not quiet then io.stderr:write(string.format("trace: %d events -> %s\n", tr:count(), path)) end
end

-- The cluster of --devices or --hosts started and planned (run.c: it, as soon as it exists, to
-- be closed whatever happens next); run.tok: the store's tokenizer.
local function start_cluster(o, run, hosts, n, set, draft)
  local cluster = require "loip.cluster"
  local st = require "loip.model.store"
  local cfg = st.config(o.model, st.read_manifest(o.model))
  run.tok = require("loip.text.tokenizer").open(o.model, { vocab_size = cfg.vocab_size })
  local c = o.hosts and cluster.connect(hosts, { store = o.model, token = common.token(o), keys = o.curve_keys, dead_ms = o.dead_after })
    or cluster.start_local { store = o.model, devices = n, mem = set.mem or 0, threads = o.threads > 0 and o.threads or nil,
      token = o.join_listen and common.token(o), tcp = o.join_listen ~= nil, -- (joiners know the token, reach TCP)
      dead_ms = o.dead_after }
  run.c = c
  if o.hosts and set.mem then for i, d in ipairs(c.devices) do d.mem = set.mem[i] end end
  local p, est, info = c:plan { scheduler = o.scheduler, cost = o.cost_model, profile = o.profile, stages = o.stages, ends = o.ends,
    context = o.context or require("loip.model").default_context(cfg.max_seq), batch = o.step_tokens, max_batch = o.max_batch, kv_tokens = o.kv_tokens,
    -- a row of logits back per request (logprobs and grammars sample at the head: loip.engine.request.head_sample)
    logits_tokens = o.max_batch,
    plan_positions = o.plan_positions, online = require("loip.engine.request.online").choose(o.online, o.plan_positions),
    link_schedule = o.link_schedule, trace = o.trace ~= nil, draft = draft, draft_tokens = o.draft_tokens,
  experts = o.experts, kernels_policy = o.kernels_policy, routing = require("loip.model.experts").load_routing(o.routing_profile),
    disk_rate = set.disk_rate, link = set.link, slowdown = set.slowdown }
  if not o.quiet then common.report(p, est, info, c.sizes, { cluster = true }) end
  if o.join_listen then io.stdout:write("joins ", c:listen_joins(o.join_listen), "\n") end
end

-- The model opened on this device (run.m), its tokenizer (run.tok).
local function open_local(o, run, set, draft)
  local model = require "loip.model"
  if set.mem and #set.mem > 1 then usage("serve", "several --mem budgets need --devices or --hosts") end
  if o.link_schedule then usage("serve", "--link-schedule is for several devices (--devices or --hosts)") end
  local is_store = model.locate(o.model) == "store"
  if o.plan_positions and not is_store then usage("serve", "--plan-positions needs a slice store (make one with loip slice)") end
  if o.trace and not is_store then usage("serve", "--trace needs a slice store (make one with loip slice) or --devices/--hosts") end
  local m = model.open(o.model, { threads = o.threads, context = o.context, mem = set.mem and set.mem[1], max_batch = o.max_batch,
    kv_tokens = o.kv_tokens, batch = o.step_tokens, scheduler = o.scheduler, cost = o.cost_model, profile = o.profile,
    stages = o.stages, ends = o.ends, disk_rate = set.disk_rate and set.disk_rate[1], plan_positions = o.plan_positions,
    trace = o.trace ~= nil, draft = draft, draft_tokens = o.draft_tokens,
  experts = o.experts, kernels_policy = o.kernels_policy, routing = require("loip.model.experts").load_routing(o.routing_profile),
    online = is_store and require("loip.engine.request.online").choose(o.online, o.plan_positions) or nil })
  run.m, run.tok = m, m.tokenizer
  if m.plan and not o.quiet then common.report(m.plan, m.estimate, nil, m.plan_sizes, {}) end
end

-- Serve run.m or run.c until a signal; then the trace written (--trace).
local function serve_on(o, run, tokdir, name, api_key)
  local m, c = run.m, run.c
  local srv = require("loip.serve.server").new { model = m, cluster = c, tokenizer = run.tok, dir = tokdir or o.model,
    chat_template = o.chat_template, tool_parser = o.tool_parser,
    name = name, api_key = api_key, host = o.host, port = o.port, max_queue = o.max_queue, max_body = o.max_body,
    prefill = o.prefill, prefix_cache = not o.no_prompt_cache and (o.prompt_cache_dir and { dir = o.prompt_cache_dir,
      bytes = o.prompt_cache_disk } or true),
    quiet = o.quiet, draft_per_request = o.draft_per_request }
  if not o.no_prompt_cache and not srv.batcher.shares_kv then -- (a cluster's online policy may lend KV: loip.engine.request.batcher)
    if o.prompt_cache_dir then
      usage("serve", "--prompt-cache-dir: the prefix cache is off beside the online policy on a cluster (--online %s "
        .. "may lend KV between devices, which moves no shared group)", o.online or "loip")
    end
    io.stderr:write(string.format("serve: no prefix cache: the online policy on a cluster (--online %s) may lend KV between "
      .. "devices, which moves no shared group (requests with n > 1 are refused too)\n", o.online or "loip"))
  end
  require("loip.cmd.discover").serve_listen(srv, o) -- (--discover)
  -- the address first, on stdout (port 0: the one chosen), for scripts that start us
  io.stdout:write(string.format("listening http://%s:%d/v1\n", o.host, srv.port))
  io.stdout:flush()
  if srv.chat_error and not o.quiet then
    io.stderr:write("serve: no chat template (", srv.chat_error, "): /v1/chat/completions answers 400; /v1/completions works\n")
  end
  if o.trace then require("loip.engine.request.draft_trace").record(srv.batcher.draft) end
  local rok, rerr = pcall(srv.run, srv)
  srv:close()
  if c and srv.batcher.draft then srv.batcher.draft:close() end -- (a model's batcher closes its own)
  if o.trace then M.write_trace(o.trace, m, c, srv.batcher, o.quiet) end
  if not rok then error(rerr, 0) end
end

function M.run(o)
  common.use_kernels(o.kernels)
  local hosts = common.hosts("serve", o)
  local n = o.devices or #hosts
  local cluster_run = n > 0
  local name = o.served_name or (o.model:gsub("/+$", ""):match("([^/]+)$"))
  if cluster_run then
    local layers = common.model_layers(o.model)
    if n > 2 * layers then
      usage("serve", "%d devices but the model has only %d blocks (%d layers): use at most %d", n, 2 * layers, layers, 2 * layers)
    end
    common.store_for("serve", o)
  end
  local _, _, tokdir = require("loip.model").locate(o.model)
  if o.max_batch > o.step_tokens then
    usage("serve", "--max-batch %d is more than --step-tokens %d: every decoding request needs a token in each step", o.max_batch, o.step_tokens)
  end
  if o.join_listen and not cluster_run then usage("serve", "--join-listen admits workers into a cluster: give --devices or --hosts") end
  if o.join_listen and o.devices and not common.token(o) then
    usage("serve", "--join-listen on --devices needs the token workers that join prove: --token SECRET or LOIP_CLUSTER_TOKEN")
  end
  local draft = common.draft("serve", o)
  if o.no_prompt_cache and o.prompt_cache_dir then usage("serve", "--prompt-cache-dir is the prefix cache's disk tier, which --no-prompt-cache turns off") end
  local api_key = o.api_key or os.getenv("LOIP_API_KEY")
  if api_key == "" then api_key = nil end
  local set = common.settings("serve", o, math.max(n, 1))
  local run = {}
  local ok, err = pcall(function()
    if cluster_run then start_cluster(o, run, hosts, n, set, draft) else open_local(o, run, set, draft) end
    serve_on(o, run, tokdir, name, api_key)
  end)
  if run.c then run.c:close() end
  if run.m then run.m:close() end
  if not ok then error(err, 0) end
  return 0
end

return M
