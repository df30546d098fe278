-- `loip serve`: an OpenAI-compatible HTTP server over the request loop (loip.engine.request.batcher) of a
-- model in-process or of a cluster. One loop takes requests from the HTTP threads, admits them
-- into the running micro-batch, steps it, and streams each request's text as its tokens come
-- (server-sent events) or answers when it ends. A client that hangs up cancels its request.
--
--   local srv = server.new{ model = m (loip.model) | cluster = c (planned), tokenizer = tok,
--     dir = model dir (chat template), name = "stories260K", api_key = nil, port = 8080 }
--   srv:run()              -- until SIGINT/SIGTERM (or srv:run(function() return done end))
--   srv:close()
local http = require "loip.serve.http"
local json = require "loip.text.json"
local metrics = require "loip.serve.metrics"
local openai = require "loip.serve.openai"
local tools = require "loip.serve.tools"
local reply = require "loip.serve.reply"
local constrain = require "loip.engine.request.constrain"
local memory = require "loip.runtime.memory"
local process = require "loip.runtime.process"
local errors = require "loip.error"
local dashboard = require "loip.serve.dashboard"
local membership = require "loip.serve.membership"
local anthropic = require "loip.serve.anthropic"
local chat_mod = require "loip.text.chat"
local prefix_cache_mod = require "loip.engine.request.prefix_cache"
local request_draft = require "loip.serve.request_draft"

local M = {}

local Server = {}
Server.__index = Server

local function log(fmt, ...) io.stderr:write(os.date("%H:%M:%S "), string.format(fmt, ...), "\n") io.stderr:flush() end

-- opts: model or cluster (one of them), tokenizer, dir (chat template's model directory),
-- chat_template (a file instead), tool_parser (a tools policy's name or file; default: the
-- template's family), name (the model id clients name), api_key, host, port,
-- max_queue, prefill ("chunked" or "own", see loip.engine.request.batcher), prefix_cache (false: off;
-- { dir, bytes }: with a disk tier; loip.engine.request.prefix_cache), max_body, quiet,
-- draft_per_request (what a request's `draft` may choose: a comma-separated list,
-- loip.serve.request_draft; nil: nothing).
function M.new(opts)
  local self = setmetatable({ opts = opts, name = opts.name, tok = opts.tokenizer, active = {}, seq = 0,
    metrics = metrics.new(), created = os.time(), quiet = opts.quiet }, Server)
  local eng = opts.model or opts.cluster
  if not eng then error("serve: a model or a cluster", 2) end
  self.engine_owner = eng
  self.batcher = eng:batcher({ max_queue = opts.max_queue or 64, prefill = opts.prefill, prefix_cache = opts.prefix_cache == nil or opts.prefix_cache })
  self.context = eng.context
  -- speculative decoding (the batcher's loip.engine.request.draft): each verifying step counted as it is seen
  local d = self.batcher.draft
  if d then
    d.on_observe = function(r, k, accepted) self:on_draft(r, k, accepted) end
    d.on_chosen = function(_, B) self:on_tree_chosen(B) end
  end
  self.draft_allowed = request_draft.allowance(opts.draft_per_request, d)
  -- the vocabulary and the model's stop ids, on one device or a cluster alike (loip.engine's
  -- front-end: the cluster's with this tokenizer)
  local front = eng:front({ tokenizer = self.tok })
  self.vocab = front.vocab
  self.n_sample = math.min(self.tok.vocab_size, self.vocab)
  self.stop_ids = {}
  for _, id in ipairs(opts.stop_ids or front.stop_ids) do self.stop_ids[id] = true end
  local h, err = http.start { host = opts.host or "127.0.0.1", port = opts.port or 0, max_body = opts.max_body or 4 * 1024 * 1024,
    timeout_s = opts.timeout_s or 30 }
  if not h then error("serve: " .. err, 0) end
  self.http, self.port = h, h.port
  self.dashboard = dashboard.new(self) -- (the page at /, /v1/cluster and its events)
  -- the chat template is read now: a model without one is told at start, not per request
  local ok, terr = pcall(chat_mod.load, opts.dir, { template_file = opts.chat_template })
  self.chat_error = not ok and terr or nil
  self.template = ok and terr or nil
  -- the tool-call parser: --tool-parser's, else the template's family's
  if opts.tool_parser or self.template then
    local pok, p = pcall(tools.parser, opts.tool_parser, self.template)
    if not pok then h:close() error("serve: --tool-parser: " .. tostring(p), 0) end
    self.tool_parser = p
  end
  return self
end

local function answer(req, status, body, headers)
  req:respond(status, "application/json", body, headers)
end
local function fail(req, status, message, kind, param, code, headers)
  local st, body = (req.api or openai).error(status, message, kind, param, code)
  answer(req, st, body, headers)
end

-- The token ids of a parsed request, or nil, status, message.
function Server:prompt_ids(spec)
  local tok = self.tok
  if spec.kind == "chat" then
    if self.chat_error then return nil, 400, "this model has no chat template (" .. self.chat_error .. "); use /v1/completions" end
    local ok, text = pcall(chat_mod.apply, self.opts.dir, tools.template_messages(spec.messages, self.template),
      { add_generation_prompt = true, template_file = self.opts.chat_template, tools = spec.template_tools, vars = spec.template_vars })
    if not ok then return nil, 400, tostring(text) end
    return tok:encode(text, { add_special = false, bos = false })
  end
  if spec.prompt_ids then
    for i, id in ipairs(spec.prompt_ids) do
      if id >= self.vocab then return nil, 400, string.format("'prompt' token %d (%d) is not below the vocabulary size %d", i - 1, id, self.vocab) end
    end
    return spec.prompt_ids
  end
  return tok:encode(spec.prompt, { bos = true })
end

-- A generation endpoint (kind "chat" or "completion").
function Server:generate(req, kind)
  if req.too_large then
    return fail(req, 413, string.format("the request body is larger than %d bytes", self.opts.max_body or 4 * 1024 * 1024), nil, nil, "body_too_large")
  end
  local api = req.api or openai -- (loip.serve.anthropic for /v1/messages)
  local spec, e = api.parse(kind, req.body)
  if not spec then return fail(req, e.status, e.message, nil, e.param, e.code) end
  if spec.model ~= self.name then
    return fail(req, 404, string.format("The model '%s' does not exist; this server serves '%s'", spec.model, self.name),
      "invalid_request_error", "model", "model_not_found")
  end
  local prompt_param = kind ~= "completion" and "messages" or "prompt" -- (the field that holds the prompt)
  local ids, st, msg = self:prompt_ids(spec)
  if not ids then return fail(req, st, msg, nil, prompt_param) end
  if #ids == 0 then
    return fail(req, 400, spec.prompt == "" and "'prompt' is empty and this model's tokenizer adds no BOS token to start "
      .. "a document from: give a prompt (text or token ids)" or "the prompt is empty after tokenization", nil, prompt_param)
  end
  local n = #ids
  if spec.max_tokens and n + spec.max_tokens > self.context or n >= self.context then
    return fail(req, 400, string.format("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the %s, %d in the completion). Please reduce the length of the %s or completion.",
      self.context, n + (spec.max_tokens or 1), n, prompt_param, spec.max_tokens or 1, prompt_param), nil,
      -- (the field to blame: the prompt when it fills the context alone, else max_tokens)
      n >= self.context and prompt_param or "max_tokens", "context_length_exceeded")
  end
  if spec.n > self.batcher.max_batch then
    return fail(req, 400, string.format("'n' is %d; this server runs %d requests at once (--max-batch)", spec.n, self.batcher.max_batch),
      nil, "n")
  end
  local constraint, cmsg, cparam = self:constraint(spec, req.body, api)
  if cmsg then return fail(req, 400, cmsg, nil, cparam) end
  local draft, derr = request_draft.resolve(spec, self.draft_allowed, self.batcher.draft)
  if derr then return fail(req, 400, derr.message, nil, derr.param, "draft_not_allowed") end
  local seed = spec.seed or (os.time() * 1000 + self.seq)
  local ok, r = pcall(self.submit, self, spec, ids, seed, { constraint = constraint, draft = draft })
  if not ok then
    if errors.is(r, "overloaded") then
      self.metrics:add("loip_requests_refused_total", "requests refused", 1, { reason = "overloaded" })
      return fail(req, 429, "the server is busy: " .. tostring(r), "rate_limit_exceeded", nil, "overloaded", { ["Retry-After"] = 1 })
    end
    if errors.is(r, "too_long") then
      return fail(req, 400, tostring(r), nil, r.param == "prompt" and prompt_param or r.param or "max_tokens", "context_length_exceeded")
    end
    if errors.is(r, "invalid") then return fail(req, 400, tostring(r), nil, r.param) end
    error(r, 0)
  end
  self.seq = self.seq + 1
  self.metrics:add("loip_requests_total", "requests admitted or queued", 1, { endpoint = kind })
  reply.new(self, { http = req, spec = spec, kind = kind, ids = ids, requests = r, seq = self.seq, api = api })
end

-- The grammar a request's tokens are sampled under (loip.engine.request.constrain): its response_format
-- or `grammar`, else the call syntax of its tools when tool_choice is "required" or names one;
-- nil when none; or nil, a message and the field it names.
function Server:constraint(spec, text, api)
  local fmt = spec.format
  if not fmt and not spec.tools then return nil end
  constrain.keep_order(spec, text, api ~= openai)
  if not fmt then
    local msg, param
    fmt, msg, param = tools.format(spec, self.tool_parser)
    if msg then return nil, msg, param end
    if not fmt then return nil end
  end
  self.constrain = self.constrain or constrain.new(self.tok)
  return self.constrain:matcher(fmt, not spec.ignore_eos and self.stop_ids or {})
end

-- The batcher's requests of spec's n choices of prompt ids (loip.engine.request.choices: the prompt
-- prefilled once, its KV shared copy-on-write; choice i sampled with seed + i - 1).
function Server:submit(spec, ids, seed, extra)
  local r = self.batcher:submit { prompt = ids, max_tokens = spec.max_tokens, strict = spec.max_tokens ~= nil,
    sampler = spec.sampler, seed = seed % 2^53, n_sample = self.n_sample, stop = not spec.ignore_eos and self.stop_ids or {},
    logprobs = spec.logprobs, n = spec.n, constraint = extra and extra.constraint, draft = extra and extra.draft }
  return r.choices or { r }
end

-- Histogram buckets: accepted drafts per verifying step (0 .. 8, more: +Inf), and a request's
-- acceptance (its accepted drafts over its drafted ones).
local STEP_BUCKETS = { 0, 1, 2, 3, 4, 5, 6, 7, 8 }
local RATE_BUCKETS = { 0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1 }
-- the drafts (a tree's nodes) a verifying step verified for a request
local SIZE_BUCKETS = { 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64 }

-- A step verified request r's k drafts, `accepted` of them (loip.engine.request.draft's on_observe).
function Server:on_draft(r, k, accepted)
  if k == 0 then return end
  local m = self.metrics
  m:add("loip_draft_tokens_total", "tokens drafted (speculative decoding) and verified", k)
  m:add("loip_draft_accepted_total", "drafted tokens accepted", accepted)
  m:add("loip_draft_steps_total", "verifying steps, one per request that drafted in a step", 1)
  m:observe("loip_draft_accepted_per_step", "drafts accepted per verifying step (of a request)", accepted, STEP_BUCKETS)
  m:observe("loip_draft_tree_size", "drafts (a tree's nodes) verified per verifying step (of a request): the size chosen", k, SIZE_BUCKETS)
  -- by the policy that drafted them (a request's own, --draft-per-request, or the server's)
  local d = self.batcher:draft_of(r)
  local l = { policy = d and d:name() or "none" }
  m:add("loip_draft_policy_tokens_total", "tokens drafted, by draft policy", k, l)
  m:add("loip_draft_policy_accepted_total", "drafted tokens accepted, by draft policy", accepted, l)
  m:add("loip_draft_policy_steps_total", "verifying steps, by draft policy", 1, l)
  local a = self.active[r]
  if a then a.drafted, a.accepted = (a.drafted or 0) + k, (a.accepted or 0) + accepted end
end

-- A best-first tree's size chosen for a request's next step: B nodes (0: none, the request rests).
local CHOSEN_BUCKETS = { 0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64 }
function Server:on_tree_chosen(B)
  self.metrics:observe("loip_draft_tree_chosen", "best-first tree sizes chosen, each choice once (0: none, the request "
    .. "rests; loip_draft_tree_size counts the trees sent)", B, CHOSEN_BUCKETS)
end

-- Request r (choice c of a reply) ended with finish ("stop", "length"): the metrics count it.
function Server:count_done(r, finish, n_prompt, c)
  local t = r:timings()
  local m = self.metrics
  m:add("loip_tokens_generated_total", "tokens generated", #r.token_ids)
  m:add("loip_prompt_tokens_total", "prompt tokens processed", n_prompt)
  m:add("loip_requests_finished_total", "requests finished", 1, { finish_reason = finish })
  if t.ttft_ms then m:observe("loip_time_to_first_token_ms", "time from arrival to the first token", t.ttft_ms) end
  if t.decode_ms_per_token then m:observe("loip_ms_per_token", "decoding time per token after the first", t.decode_ms_per_token) end
  m:observe("loip_queue_ms", "time waiting for a slot and KV", t.queue_ms)
  if c and (c.drafted or 0) > 0 then
    m:observe("loip_draft_request_acceptance", "a request's accepted drafts over its drafted ones, at its end (requests that drafted)",
      c.accepted / c.drafted, RATE_BUCKETS)
  end
end

-- What /health answers: the model, requests running and queued and, when a cluster serves,
-- its devices (endpoint, process id of a local worker), how many were lost (and `losses`, each
-- with the step, the devices, why (one line; a worker's last log lines in `log`), how many were
-- left, whether the others could take over (`replanned`, else `error`) and the re-plan's time)
-- and taken back; status "degraded" while the last loss left devices that could not; with
-- speculative decoding, `draft`: its figures (loip.engine.request.draft's report).
function Server:health()
  local h = { status = "ok", model = self.name, running = self.batcher:active(), queued = self.batcher:queued(),
    draft = self.batcher.draft and self.batcher.draft:report() or nil }
  if self.discovery then h.discovered = self.discovery:candidates() end -- (serve --discover)
  local c = self.opts.cluster
  if c then
    h.devices = {}
    for i, d in ipairs(c.devices) do
      h.devices[i] = { device = i, endpoint = d.endpoint, pid = d.pid, shipped_bytes = d.shipped_bytes or 0 } -- (loip.cluster.ship)
    end
    h.device_losses = c.losses and #c.losses or 0
    if h.device_losses > 0 then h.losses = c.losses end
    -- a loss left devices that could not take over: nothing is served until the lost device is
    -- back (taken back when nothing runs)
    if c.degraded then h.status, h.error = "degraded", c.degraded end
    h.devices_taken_back = c.taken_back or 0
    membership.health(c, h) -- (joins, leaves and losses: `membership`)
  end
  return h
end

function Server:metrics_text()
  local m, b = self.metrics, self.batcher
  m:set("loip_queue_depth", "requests waiting for a slot", b:queued())
  m:set("loip_batch_size", "requests in the running micro-batch", b:active())
  m:set("loip_kv_tokens_reserved", "KV positions reserved by running requests", b.kv_used * b.engine.kv_block)
  m:set("loip_kv_tokens", "KV positions the devices hold", b.kv_groups * b.engine.kv_block)
  m:set("loip_steps_total", "micro-batch steps run", b.stats.steps)
  m:set("loip_adaptations_total", "live plan changes the online policy made", #b.adaptations)
  m:set("loip_step_ms_total", "time in steps", b.stats.step_ms)
  m:set("loip_lua_heap_bytes", "the serving process's Lua heap", math.floor(collectgarbage("count") * 1024))
  m:set("loip_c_heap_bytes", "the serving process's C heap in use (malloc)", memory.heap_in_use())
  if b.draft then -- (there from the start, at 0)
    m:add("loip_draft_tokens_total", "tokens drafted (speculative decoding) and verified", 0)
    m:add("loip_draft_accepted_total", "drafted tokens accepted", 0)
    m:add("loip_draft_steps_total", "verifying steps, one per request that drafted in a step", 0)
    local rep = b.draft:report()
    m:set("loip_draft_tokens_per_step", "tokens a verifying step gave a request (its accepted drafts and one more), on average",
      rep.tokens_per_step)
    m:set("loip_draft_propose_ms_total", "time proposing drafts (the head's share of speculative decoding)", rep.propose_ms)
    m:set("loip_draft_step_share", "the draft's share of step time: time proposing over time proposing and stepping", rep.draft_share)
  end
  local e = b.engine
  local dev = e:device_stats()
  prefix_cache_mod.metrics(m, b, dev)
  if e.metrics then e:metrics(m) end -- (a ring: loip_shipped_bytes_total{device})
  for i, d in ipairs(dev) do
    local l = { device = i }
    if d.compute_ms then
      m:set("loip_device_compute_ms_total", "compute time per device", d.compute_ms, l)
      m:set("loip_device_load_ms_total", "offloaded-block read time per device", d.load_ms, l)
      m:set("loip_device_stall_ms_total", "time a device waited for its loads", d.stall_ms, l)
    end
    m:set("loip_device_kv_free_tokens", "KV positions a device's pool has free", d.kv_free_tokens or 0, l)
    if d.kernels then
      m:set("loip_kernels_prefetch_bytes", "the quantized matvecs' software prefetch distance a device runs with (its kernels policy's)",
        d.kernels.prefetch, l)
    end
    for account, bytes in pairs(d.accounts or {}) do
      m:set("loip_memory_bytes", "memory charged per device and account", bytes, { device = i, account = account })
    end
  end
  return m:text()
end

function Server:dispatch(req)
  local path = req.url:gsub("%?.*$", "")
  local method = req.method
  if path:match("^/v1/") and self.opts.api_key then
    local auth, xkey = req:header("Authorization") or "", req:header("x-api-key") or "" -- (x-api-key: Anthropic's)
    if auth ~= "Bearer " .. self.opts.api_key and xkey ~= self.opts.api_key then
      local messages = path == "/v1/messages"
      if messages then req.api = anthropic end
      -- a key given but wrong is incorrect (naming the header it came in), none given is missing
      local given = {}
      if xkey ~= "" then given[#given + 1] = "x-api-key" end
      if auth ~= "" then given[#given + 1] = "Authorization" end
      return fail(req, 401, #given > 0 and string.format("Incorrect API key provided (in the %s header%s)",
          table.concat(given, " and "), #given > 1 and "s" or "")
        or string.format("You didn't provide an API key (%s)", messages and "x-api-key: KEY, or Authorization: Bearer KEY"
          or "Authorization: Bearer KEY"),
        "invalid_request_error", nil, "invalid_api_key")
    end
  end
  if self.dashboard:route(req, path, method) then return end
  local function only(m)
    if method ~= m then fail(req, 405, string.format("%s %s: use %s", method, path, m), nil, nil, "method_not_allowed") return false end
    return true
  end
  if path == "/v1/chat/completions" then
    if only("POST") then self:generate(req, "chat") end
  elseif path == "/v1/messages" then
    req.api = anthropic
    if only("POST") then self:generate(req, "messages") end
  elseif path == "/v1/completions" then
    if only("POST") then self:generate(req, "completion") end
  elseif path == "/v1/models" then
    if only("GET") then
      answer(req, 200, openai.encode({ object = "list", data = { { id = self.name, object = "model", created = self.created, owned_by = "loip" } } }))
    end
  elseif path:match("^/v1/models/") then
    local id = path:sub(#"/v1/models/" + 1)
    if id ~= self.name then return fail(req, 404, string.format("The model '%s' does not exist", id), nil, "model", "model_not_found") end
    answer(req, 200, openai.encode({ id = self.name, object = "model", created = self.created, owned_by = "loip" }))
  elseif path == "/v1/cluster/drain" then
    if only("POST") then membership.drain(self, req) end
  elseif path == "/health" then
    answer(req, 200, json.encode(self:health()))
  elseif path == "/metrics" then
    req:respond(200, "text/plain; version=0.0.4", self:metrics_text())
  else
    fail(req, 404, string.format("no route %s %s", method, path), nil, nil, "not_found")
  end
end

-- One turn of the loop: take requests, notice hang-ups, step the batch. wait_ms: how long to
-- wait for a request when nothing runs.
function Server:turn(wait_ms)
  if self.discovery then self.discovery:poll(0) end -- (serve --discover: beacons heard meanwhile)
  local req = self.http:next(self.batcher:busy() and 0 or wait_ms)
  while req do
    local ok, err = pcall(self.dispatch, self, req)
    if not ok then
      log("%s %s: %s", req.method, req.url, tostring(err))
      if req.handle then pcall(fail, req, 500, tostring(err), "server_error", nil, "internal_error") end
    end
    req = self.http:next(0)
  end
  for r, c in pairs(self.active) do
    if c.reply.http:cancelled() then c.reply.client_gone = true r:cancel() end
  end
  if self.opts.cluster then membership.turn(self) end -- (between steps: joins, leaves)
  if self.batcher:busy() then
    local ok, err = pcall(self.batcher.step, self.batcher)
    if not ok then log("step failed: %s", tostring(err)) end
  end
  self.dashboard:tick()
end

-- Serve until a signal (SIGINT/SIGTERM) or done() returns true.
function Server:run(done)
  process.signal_watch()
  if not self.quiet then
    log("serving %s at http://%s:%d/v1 (context %d, %d requests at once)%s", self.name, self.opts.host or "127.0.0.1",
      self.port, self.context, self.batcher.max_batch, self.opts.api_key and ", API key required" or "")
  end
  while process.signal_received() == 0 and not (done and done()) do self:turn(50) end
  if not self.quiet then log("stopping (%s)", process.signal_received() ~= 0 and "signal " .. process.signal_received() or "done") end
end

function Server:close()
  for r, c in pairs(self.active) do
    c.reply.shutdown = true
    r:cancel()
  end
  if self.dashboard then self.dashboard:close() end
  if self.http then self.http:close() self.http = nil end
end

return M
