-- `loip serve` (an OpenAI-compatible HTTP server on one device or a cluster) and `loip chat`
-- (an interactive streaming client of such a server).
local cp = require "loip.tools.cli_plan"

local M = {}

local function usage(cmd, fmt, ...) error({ usage_error = true, msg = cmd .. ": " .. string.format(fmt, ...) }, 0) end

-- shared: the flag rows `generate` has too (threads, kernels) and use_kernels(name).
function M.commands(shared)
  local commands = {}

  commands.serve = {
    usage = "loip serve --model DIR|STORE [--devices N | --hosts LIST] [--mem ...] [--context N] [--host 127.0.0.1] --port P [--api-key KEY] [--max-batch B]",
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
      { "plan-tokens", "int", "slice store: KV positions the plan's memory holds for all requests together "
        .. "(default: --kv-tokens); past them the KV cache grows inside each budget and the online policy makes room live",
        metavar = "N", check = function(v) return v >= 1, "must be >= 1" end },
      { "online", "string", "the online policy (recipes/policies/online: loip, the default with --plan-tokens) or a file; none: off",
        default = "loip", metavar = "NAME|FILE.lua" },
      { "link-schedule", "string", "local devices: emulated links that change while serving (recipes/policies/links or a file)",
        metavar = "NAME|FILE.lua" },
      { "step-tokens", "int", "tokens one step carries: the decoding requests' and prompt chunks (default 64)",
        default = 64, check = function(v) return v >= 1, "must be >= 1" end },
      { "prefill", "string", "newcomers' prompts: chunked (in the steps beside the others' decoding) or own (steps of their own)",
        default = "chunked", check = function(v) return v == "chunked" or v == "own", "must be chunked or own" end },
      { "max-body", "bytes", "largest request body", default = 4 * 1024 * 1024, metavar = "BYTES" },
      { "chat-template", "string", "Jinja chat template to use instead of the model's", metavar = "FILE" },
      { "mem", "string", "memory budget, e.g. 1.5G; with --devices, one per device: 600M,400M,400M", metavar = "BYTES" },
      { "devices", "int", "run on N local devices (worker processes)", metavar = "N",
        check = function(v) return v >= 1 and v <= 64, "must be in 1..64" end },
      { "hosts", "string", "run on running workers: host:port,... (with --token, LOIP_CLUSTER_TOKEN or --curve-keys)", metavar = "LIST" },
      cp.flags.token, cp.flags.curve_keys,
      cp.flags.stages, cp.flags.link_rate, cp.flags.link_delay, cp.flags.slowdown, cp.flags.disk_rate,
      cp.flags.scheduler, cp.flags.cost, cp.flags.profile,
      shared.threads_flag, shared.kernels_flag,
      { "quiet", "bool", "no log line per request" },
    },
  }

  function commands.serve.run(o)
    shared.use_kernels(o.kernels)
    local model = require "loip.model"
    local server = require "loip.serve.server"
    local hosts = cp.hosts("serve", o)
    local n = o.devices or #hosts
    local cluster_run = n > 0
    local name = o.served_name or (o.model:gsub("/+$", ""):match("([^/]+)$"))
    if cluster_run then
      local layers = cp.model_layers(o.model)
      if n > 2 * layers then
        usage("serve", "%d devices but the model has only %d blocks (%d layers): use at most %d", n, 2 * layers, layers, 2 * layers)
      end
      cp.store_for("serve", o)
    end
    local _, _, tokdir = model.locate(o.model)
    if o.max_batch > o.step_tokens then
      usage("serve", "--max-batch %d is more than --step-tokens %d: every decoding request needs a token in each step", o.max_batch, o.step_tokens)
    end
    local api_key = o.api_key or os.getenv("LOIP_API_KEY")
    if api_key == "" then api_key = nil end
    local m, c, tok
    local set = cp.settings("serve", o, math.max(n, 1))
    local ok, err = pcall(function()
      if cluster_run then
        local cluster = require "loip.cluster"
        local st = require "loip.model.store"
        local cfg = st.config(o.model, st.read_manifest(o.model))
        tok = require("loip.text.tokenizer").open(o.model, { vocab_size = cfg.vocab_size })
        c = o.hosts and cluster.connect(hosts, { store = o.model, token = cp.token(o), keys = o.curve_keys })
          or cluster.start_local { store = o.model, devices = n, mem = set.mem or 0, threads = o.threads > 0 and o.threads or nil }
        if o.hosts and set.mem then for i, d in ipairs(c.devices) do d.mem = set.mem[i] end end
        local p, est, info = c:plan { scheduler = o.scheduler, cost = o.cost_model, profile = o.profile, stages = o.stages,
          context = o.context or require("loip.model").default_context(cfg.max_seq), batch = o.step_tokens, max_batch = o.max_batch, kv_tokens = o.kv_tokens,
          kv_plan_tokens = o.plan_tokens, online = (o.plan_tokens or o.online ~= "loip") and o.online or nil,
          link_schedule = o.link_schedule,
          disk_rate = set.disk_rate, link = set.link, slowdown = set.slowdown }
        if not o.quiet then cp.report(p, est, info, c.sizes, { cluster = true }) end
      else
        if set.mem and #set.mem > 1 then usage("serve", "several --mem budgets need --devices or --hosts") end
        if o.link_schedule then usage("serve", "--link-schedule is for several devices (--devices or --hosts)") end
        local is_store = model.locate(o.model) == "store"
        if o.plan_tokens and not is_store then usage("serve", "--plan-tokens needs a slice store (make one with loip slice)") end
        m = model.open(o.model, { threads = o.threads, context = o.context, mem = set.mem and set.mem[1], max_batch = o.max_batch,
          kv_tokens = o.kv_tokens, batch = o.step_tokens, scheduler = o.scheduler, cost = o.cost_model, profile = o.profile,
          stages = o.stages, disk_rate = set.disk_rate and set.disk_rate[1],
          kv_plan_tokens = o.plan_tokens, online = is_store and (o.plan_tokens or o.online ~= "loip") and o.online or nil })
        tok = m.tokenizer
        if m.plan and not o.quiet then cp.report(m.plan, m.estimate, nil, m.plan_sizes, {}) end
      end
      local srv = server.new { model = m, cluster = c, tokenizer = tok, dir = tokdir or o.model, chat_template = o.chat_template,
        name = name, api_key = api_key, host = o.host, port = o.port, max_queue = o.max_queue, max_body = o.max_body,
        prefill = o.prefill,
        quiet = o.quiet }
      -- the address first, on stdout (port 0: the one chosen), for scripts that start us
      io.stdout:write(string.format("listening http://%s:%d/v1\n", o.host, srv.port))
      io.stdout:flush()
      if srv.chat_error and not o.quiet then
        io.stderr:write("serve: no chat template (", srv.chat_error, "): /v1/chat/completions answers 400; /v1/completions works\n")
      end
      local rok, rerr = pcall(srv.run, srv)
      srv:close()
      if not rok then error(rerr, 0) end
    end)
    if c then c:close() end
    if m then m:close() end
    if not ok then error(err, 0) end
    return 0
  end

  commands.chat = {
    usage = "loip chat --url URL [--api-key KEY] [--model NAME] [--system TEXT]",
    summary = "Chat with an OpenAI-compatible server (loip serve, or another): each line you type is a user\n"
      .. "message, the reply streams as it is generated, and the conversation is kept (/reset clears it,\n"
      .. "/exit or end of input leaves, /help lists the commands). Without a terminal, reads one message per\n"
      .. "line from stdin.",
    flags = {
      { "url", "string", "the API's base URL, e.g. http://127.0.0.1:8080/v1", required = true },
      { "api-key", "string", "sent as Authorization: Bearer KEY (default: LOIP_API_KEY, else OPENAI_API_KEY)", metavar = "KEY" },
      { "model", "string", "the model to ask (default: the server's first, from /models)", metavar = "NAME" },
      { "system", "string", "a system message first", metavar = "TEXT" },
      { "max-tokens", "int", "tokens per reply at most", check = function(v) return v >= 1, "must be >= 1" end },
      { "temperature", "number", "sampling temperature (server default if not given)",
        check = function(v) return v >= 0 and v <= 2, "must be in [0, 2]" end },
    },
  }

  function commands.chat.run(o)
    local client = require "loip.serve.client"
    local json = require "loip.tools.json"
    local url = o.url:gsub("/+$", "")
    local key = o.api_key or os.getenv("LOIP_API_KEY") or os.getenv("OPENAI_API_KEY")
    local headers = key and key ~= "" and { Authorization = "Bearer " .. key } or {}
    local cl = client.new()
    local function fail_of(t)
      local e = json.decode(t.body or "")
      local msg = type(e) == "table" and type(e.error) == "table" and e.error.message or t.error or (t.body or ""):sub(1, 200)
      -- a bare 404 from a URL without the API's version: the usual mistake, said
      local hint = t.status == 404 and not url:match("/v%d+$")
        and string.format(" (the API's base URL ends in /v1 on loip serve and OpenAI-compatible servers: try --url %s/v1)", url) or ""
      return string.format("%s: %s%s%s", url, t.status and t.status > 0 and ("HTTP " .. t.status .. ": ") or "", tostring(msg), hint)
    end
    local model = o.model
    if not model then
      local t = cl:get(url .. "/models", headers)
      cl:wait(30000)
      local list = t.status == 200 and json.decode(t.body)
      if not (list and type(list.data) == "table" and list.data[1]) then error("chat: cannot list the models: " .. fail_of(t), 0) end
      model = list.data[1].id
    end
    local interactive = LOIP_INTERACTIVE
    local history = {}
    if o.system then history[1] = { role = "system", content = o.system } end
    if interactive then io.stderr:write(string.format("chatting with %s at %s (/help, /reset, /exit)\n", model, url)) end
    while true do
      local line
      if interactive then line = loip_readline("you> ") else line = io.read("*l") end
      if line == nil or line == "/exit" then break end
      if line == "/reset" then
        history = o.system and { { role = "system", content = o.system } } or {}
        io.stderr:write("(history cleared)\n")
      elseif line == "/help" then
        io.stderr:write("/reset clears the conversation, /exit (or end of input) leaves, /help shows this; "
          .. "a line that starts with // is sent as a message with one / less\n")
      elseif line:match("^/[%w_-]*$") then -- a command, never a message to the model
        io.stderr:write(string.format("chat: no command %s (/help lists them; //%s sends it as a message)\n", line, line:sub(2)))
      elseif line:match("%S") then
        if line:sub(1, 2) == "//" then line = line:sub(2) end
        if interactive then loip_history("add", line) end
        history[#history + 1] = { role = "user", content = line }
        local body = { model = model, messages = history, stream = true, max_tokens = o.max_tokens, temperature = o.temperature }
        local t = cl:post(url .. "/chat/completions", json.encode(body), headers)
        local reply = {}
        t.on_event = function(_, data)
          if data == "[DONE]" then return end
          local e = json.decode(data)
          local c = e and type(e.choices) == "table" and e.choices[1]
          local piece = c and type(c.delta) == "table" and c.delta.content
          if type(piece) == "string" then
            reply[#reply + 1] = piece
            io.stdout:write(piece)
            io.stdout:flush()
          end
        end
        cl:wait(3600 * 1000)
        io.stdout:write("\n") -- each reply ends its line now, also into a pipe (the next waits for input)
        io.stdout:flush()
        if t.status ~= 200 then
          history[#history] = nil
          io.stderr:write("chat: ", fail_of(t), "\n")
          if not interactive then cl:close() return 1 end
        else
          history[#history + 1] = { role = "assistant", content = table.concat(reply) }
        end
      end
    end
    cl:close()
    return 0
  end

  return commands
end

return M
