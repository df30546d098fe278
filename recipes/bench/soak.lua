-- Soak: many requests of mixed lengths in bursts through `loip serve` on local devices, a
-- worker killed (-9) every --kill-every requests while a request of its burst is generating.
-- Every request must come back, with the text a single device gives it alone (greedy and
-- seeded sampling alike); the head's and the workers' memory must stay flat, and nothing may
-- leak: file descriptors, processes, files in /tmp.
--
--   loip run recipes/bench/soak.lua [--requests 1000] [--devices 3] [--kill-every 100]
--        [--max-burst 8] [--max-prompt 48] [--max-tokens 160] [--mem 1000K,1000K,1000K]
--        [--model models/stories260K] [--store DIR] [--out DIR] [--quick]
--
-- First the reference: a single-device `loip serve` answers every request alone, one after
-- another. Then the soak: a `loip serve --devices N` server takes the same requests in bursts
-- (each burst sent at once, the next when it is done); the bursts holding request k * kill-every
-- kill one worker (device 1, 2, ..., in turn) once that request has streamed a few tokens: the
-- head plans again over the others, the requests in flight go on, and the lost worker is
-- started again and taken back when the next burst arrives. The head's and each worker's RSS
-- and open file descriptors are sampled after every kill and at the end. JSON (soak.json) and
-- a plot of the RSS (soak.svg); exit 1 when a request was lost or wrong or something leaked.
local bench = require "loip.measure.bench"
local core = require "loip.core"
local client = require "loip.runtime.http_client"
local flags = require "loip.ui.flags"
local json = require "loip.text.json"
local leak = require "loip.measure.leak"
local load = require "loip.serve.load"
local plot = require "loip.measure.plot"
local proc = require "loip.cluster.proc"
local store = require "loip.model.store"
local slice_mod = require "loip.model.slice"
local plan_mod = require "loip.plan"

local spec = {
  name = "soak.lua", usage = "loip run recipes/bench/soak.lua [flags]",
  summary = "Requests in bursts through loip serve on local devices, a worker killed every so often: none lost or wrong, nothing leaked.",
  flags = {
    { "model", "string", "model to serve (sliced into a temporary store unless --store is given)",
      default = core.build.source_dir .. "/models/stories260K" },
    { "store", "string", "slice store to serve (instead of slicing --model)" },
    { "requests", "int", "requests in all", default = 1000 },
    { "devices", "int", "local devices of the soaked server", default = 3 },
    { "kill-every", "int", "a worker is killed (-9) in the burst holding every so many requests (0: never)", default = 100 },
    { "max-burst", "int", "largest burst (bursts are 1 to this many requests; the server's --max-batch)", default = 8 },
    { "max-prompt", "int", "longest prompt, tokens (prompts are 1 to this long)", default = 48 },
    { "max-tokens", "int", "most tokens a request asks for (1 to this many; one a kill waits for: what --context leaves after --max-prompt)", default = 160 },
    { "sample-every", "int", "the processes' memory and descriptors are sampled every so many requests", default = 50 },
    { "context", "int", "positions per request", default = 256 },
    { "mem", "string", "per-device memory budgets of the soaked server (default: what one device fewer needs, with offloading)" },
    { "seed", "int", "seed of the requests' lengths, bursts and sampling", default = 1 },
    { "timeout", "int", "seconds a request may take", default = 120 },
    { "out", "string", "where to write soak.json and soak.svg", default = "bench-out" },
    { "quick", "bool", "by default 60 requests, a kill every 20, bursts of up to 4, 64 tokens at most: check the recipe works" },
  },
}
-- --quick changes the defaults (flags given still win)
for _, a in ipairs(arg) do
  if a == "--quick" then
    local quick = { requests = 60, ["kill-every"] = 20, ["max-burst"] = 4, ["max-tokens"] = 64 }
    for _, f in ipairs(spec.flags) do if quick[f[1]] then f.default = quick[f[1]] end end
  end
end
local o = flags.parse(spec, arg, 1)
local function usage(msg) io.stderr:write("soak.lua: ", msg, "\n") os.exit(2) end
if o.requests < 1 then usage("--requests must be at least 1") end
if o.devices < 2 then usage("--devices must be at least 2 (a worker is killed and the others take over)") end
if o.kill_every < 0 then usage("--kill-every must be 0 or more") end
if o.kill_every > 0 and o.kill_every < o.max_burst then
  usage("--kill-every must be at least --max-burst (a lost worker is taken back when the next burst comes)")
end
if o.sample_every < 1 then usage("--sample-every must be at least 1") end
if o.max_burst < 1 or o.max_prompt < 1 or o.max_tokens < 1 then usage("--max-burst, --max-prompt and --max-tokens must be at least 1") end
if o.max_prompt + o.max_tokens > o.context then
  usage(string.format("--max-prompt %d + --max-tokens %d do not fit --context %d", o.max_prompt, o.max_tokens, o.context))
end
local log = function(fmt, ...) io.stderr:write(string.format(fmt, ...), "\n") end
local alive = proc.alive

-- ---- what /proc says about a process --------------------------------------------------------
local function rss_kib(pid)
  local f = io.open("/proc/" .. pid .. "/status")
  if not f then return nil end
  local kib = f:read("*a"):match("VmRSS:%s*(%d+)")
  f:close()
  return tonumber(kib)
end
-- Open file descriptors: how many, and by kind (socket, pipe, anon_inode, file).
local function fds(pid)
  local p = io.popen("ls -l /proc/" .. pid .. "/fd 2>/dev/null")
  local n, kinds = 0, {}
  for line in p:lines() do
    local target = line:match("%-> (.*)$")
    if target then
      local kind = target:match("^(%w+):%[") or target:match("^anon_inode:") and "anon_inode" or "file"
      n, kinds[kind] = n + 1, (kinds[kind] or 0) + 1
    end
  end
  p:close()
  return n, kinds
end
-- What loip and Lua leave in /tmp when they leak (the suite's tests/tmp_watch.sh looks at the same).
local function tmp_list()
  local p = io.popen("ls -1 /tmp 2>/dev/null")
  local set = {}
  for name in p:lines() do if name:match("^lua_") or name:match("^loip%-") then set[name] = true end end
  p:close()
  return set
end

-- ---- the requests ----------------------------------------------------------------------------
local tmp_before = tmp_list()
local tmp_store
if not o.store then
  tmp_store = os.tmpname()
  os.remove(tmp_store)
  log("slicing %s into %s (removed at the end)", o.model, tmp_store)
  slice_mod.write(o.model, tmp_store)
  o.store = tmp_store
end
local man = store.read_manifest(o.store)
local cfg = store.config(o.store, man)
local model_name = o.store:gsub("/+$", ""):match("([^/]+)$")
if not o.mem then
  -- Budgets with which the devices left after a loss still hold the model (one device fewer,
  -- each with its share of the layers' KV for --max-burst requests, activations, a slot for a
  -- layer's two blocks read from disk, and the embedding and head), plus 10%: the whole
  -- cluster holds it all, one device short it offloads.
  local sz = plan_mod.sizes(man, cfg, { context = o.context, batch = 32, threads = 1, max_seqs = o.max_burst })
  local need = sz.kv_bytes[math.ceil(sz.n_layers / (o.devices - 1))] + sz.activation_bytes + sz.device_bytes
    + sz.mha_bytes + sz.mlp_bytes + sz.embed_file_bytes + sz.head_file_bytes + (sz.tied and sz.embed_file_bytes or 0)
  local each = {}
  for i = 1, o.devices do each[i] = tostring(math.ceil(need * 1.1 / 1024)) .. "K" end
  o.mem = table.concat(each, ",")
  log("budgets %s (one device fewer holds the model)", o.mem)
end

math.randomseed(o.seed)
local requests, bursts = {}, {}
-- The request a kill waits for asks for as many tokens as the context holds: still generating
-- when its client has read 6 pieces, however late a busy machine lets the client read them (a
-- worker killed after the request ended would be a loss between requests, not during one).
local MIN_KILL_TOKENS = o.context - o.max_prompt
for k = 1, o.requests do
  local kill = o.kill_every > 0 and k % o.kill_every == 0
  local max_tokens = math.random(1, o.max_tokens)
  if kill then max_tokens = math.max(max_tokens, MIN_KILL_TOKENS) end
  requests[k] = {
    prompt = load.prompt(math.random(1, o.max_prompt), k, cfg.vocab_size), max_tokens = max_tokens,
    temperature = math.random() < 0.5 and 0 or 0.8, seed = k, stream = kill or math.random() < 0.5, kill = kill,
  }
end
do
  local k = 1
  while k <= o.requests do
    local n = math.min(math.random(1, o.max_burst), o.requests - k + 1)
    bursts[#bursts + 1] = { first = k, last = k + n - 1 }
    k = k + n
  end
end

-- ---- a server --------------------------------------------------------------------------------
local cleanup = {}
local function start_server(args, what)
  local ok, srv = pcall(bench.serve, string.format("--model %s %s", proc.sh_quote(o.store), args), what)
  if not ok then error(srv, 0) end
  cleanup[#cleanup + 1] = srv.stop
  return srv
end

local function get_json(url)
  local cl = client.new()
  local t = cl:get(url)
  cl:wait(30000)
  cl:close()
  return t.status == 200 and json.decode(t.body) or nil
end

-- Send requests first..last at once; on_event(k, n_events) after each streamed piece. Returns
-- per request { status, text, tokens, finish, error, ms }.
local function play(url, first, last, on_event)
  local cl = client.new()
  local res = {}
  for k = first, last do
    local q = requests[k]
    local r = { text = {}, events = 0, t0 = core.now_ms() }
    res[k] = r
    local body = json.encode({ model = model_name, prompt = q.prompt, max_tokens = q.max_tokens, temperature = q.temperature,
      seed = q.seed, stream = q.stream, stream_options = q.stream and { include_usage = true } or nil })
    local t = cl:post(url .. "/completions", body, nil, { timeout_ms = o.timeout * 1000 })
    if q.stream then
      t.on_event = function(_, data)
        if data == "[DONE]" then return end
        local e = json.decode(data)
        if not e then return end
        if e.error and e.error ~= json.null then r.stream_error = e.error.message or json.encode(e.error) end
        if e.usage and e.usage ~= json.null then r.tokens = e.usage.completion_tokens end
        local c = e.choices and e.choices[1]
        if c and c ~= json.null then
          if c.text and c.text ~= "" then
            r.text[#r.text + 1] = c.text
            r.events = r.events + 1
            if on_event then on_event(k, r.events) end
          end
          if c.finish_reason and c.finish_reason ~= json.null then r.finish = c.finish_reason end
        end
      end
    end
    t.on_done = function(tt)
      r.status, r.ms = tt.status, core.now_ms() - r.t0
      if tt.status ~= 200 then
        local b = json.decode(tt.body)
        r.error = tt.error or (b and b.error and b.error.message) or tt.body
      elseif r.stream_error then
        r.status, r.error = "error in the stream", r.stream_error
      elseif not q.stream then
        local b = json.decode(tt.body)
        local c = b and b.choices and b.choices[1]
        if c then
          r.text, r.finish, r.tokens = { c.text }, c.finish_reason, b.usage and b.usage.completion_tokens
        else
          r.status, r.error = "bad body", tt.body:sub(1, 300)
        end
      end
      r.text = table.concat(r.text)
    end
  end
  cl:wait(o.timeout * 1000 * (last - first + 1))
  cl:close()
  for k = first, last do
    if not res[k].status then res[k].status, res[k].error = "no answer", "no answer within the timeout" end
  end
  return res
end

local result = {
  requests = o.requests, devices = o.devices, kill_every = o.kill_every, max_burst = o.max_burst, max_prompt = o.max_prompt,
  max_tokens = o.max_tokens, context = o.context, mem = o.mem, seed = o.seed, model = o.model, bursts = #bursts,
}
local problems = {}
local function problem(fmt, ...)
  local s = string.format(fmt, ...)
  problems[#problems + 1] = s
  log("PROBLEM: %s", s)
end

-- The reference: one device, each request alone. The answers by request.
local function run_reference()
  local t0 = core.now_ms()
  log("reference: %d requests one at a time on a single device", o.requests)
  local ref_srv = start_server(string.format("--threads 1 --context %d --max-batch 1", o.context), "the reference server")
  local reference = {}
  for k = 1, o.requests do
    local r = play(ref_srv.url, k, k)[k]
    if r.status ~= 200 then error(string.format("the reference server failed request %d: %s %s\n%s", k, tostring(r.status),
      tostring(r.error), ref_srv.log():sub(-2000)), 0) end
    reference[k] = r
  end
  ref_srv.stop()
  result.reference_s = (core.now_ms() - t0) / 1000
  log("reference: %.1f s", result.reference_s)
  return reference
end

-- A sampler of the soaked server srv: sample(at) keeps, after `at` requests, the head's and each
-- worker's RSS and descriptors (and the head's heaps) in samples, and returns the sample and
-- /health; worker_seen: the workers' pids seen.
local function sampler(srv, samples, worker_seen)
  local base = srv.url:gsub("/v1$", "")
  return function(at)
    local h = get_json(base .. "/health")
    if not h then error("/health did not answer\n" .. srv.log():sub(-2000), 0) end
    local m = client.new()
    local mt = m:get(base .. "/metrics")
    m:wait(30000)
    m:close()
    local head_fds, head_fd_kinds = fds(srv.pid)
    local s = { requests_done = at, head_rss_kib = rss_kib(srv.pid), head_fds = head_fds, head_fd_kinds = head_fd_kinds,
      devices = #h.devices,
      head_lua_heap_kib = tonumber((mt.body or ""):match("\nloip_lua_heap_bytes (%d+)") or 0) / 1024,
      head_c_heap_kib = tonumber((mt.body or ""):match("\nloip_c_heap_bytes (%d+)") or 0) / 1024, workers = {} }
    for i, d in ipairs(h.devices) do
      local n, kinds = fds(d.pid)
      s.workers[i] = { device = i, pid = d.pid, rss_kib = rss_kib(d.pid), fds = n, fd_kinds = kinds }
      worker_seen[d.pid] = true
    end
    samples[#samples + 1] = s
    return s, h
  end
end

-- One burst's requests against srv (a worker killed mid-request when one of them is marked),
-- each checked against the reference: lost, wrong and kills grow; the tokens of those right.
local function soak_burst(srv, burst, reference, sample, lost, wrong, kills)
  local victim
  for k = burst.first, burst.last do
    if requests[k].kill then
      local _, h = sample(burst.first - 1)
      if #h.devices ~= o.devices then
        problem("before the burst of request %d the server had %d devices, not %d (a lost worker not taken back)", k, #h.devices, o.devices)
      end
      local dev = #kills % #h.devices + 1
      victim = { request = k, device = dev, pid = h.devices[dev].pid }
    end
  end
  local res = play(srv.url, burst.first, burst.last, victim and function(k, n)
    if k == victim.request and n == 6 and not victim.at then
      os.execute("kill -KILL " .. victim.pid)
      victim.at = core.now_ms()
      kills[#kills + 1] = victim
      log("request %d: killed device %d's worker (pid %d) after %d tokens", k, victim.device, victim.pid, n)
    end
  end)
  if victim and not victim.at then
    problem("request %d finished before its worker could be killed (%d pieces)", victim.request, res[victim.request].events)
  end
  local tokens = 0
  for k = burst.first, burst.last do
    local r, ref = res[k], reference[k]
    if r.status ~= 200 then
      lost[#lost + 1] = { request = k, status = r.status, error = r.error }
      problem("request %d lost: %s %s", k, tostring(r.status), tostring(r.error))
    elseif r.text ~= ref.text or r.tokens ~= ref.tokens then
      wrong[#wrong + 1] = { request = k, text = r.text, reference = ref.text, tokens = r.tokens, reference_tokens = ref.tokens }
      problem("request %d wrong: %s tokens %q, a single device gives %s tokens %q", k, tostring(r.tokens), r.text:sub(1, 80),
        tostring(ref.tokens), ref.text:sub(1, 80))
    else
      tokens = tokens + (r.tokens or 0)
    end
  end
  return tokens
end

-- The soak: every burst against srv, sampled every --sample-every requests; then one more
-- request (the last lost worker taken back) and the last sample, the losses checked. The last
-- sample.
local function soak(srv, reference, sample)
  local t1 = core.now_ms()
  local lost, wrong, kills, tokens = {}, {}, {}, 0
  for b, burst in ipairs(bursts) do
    tokens = tokens + soak_burst(srv, burst, reference, sample, lost, wrong, kills)
    if b < #bursts and math.floor(burst.last / o.sample_every) > math.floor((burst.first - 1) / o.sample_every) then
      sample(burst.last)
    end
    if b % 25 == 0 or b == #bursts then
      log("%d/%d requests, %d killed workers, %d lost, %d wrong, %.0f s", burst.last, o.requests, #kills, #lost, #wrong,
        (core.now_ms() - t1) / 1000)
    end
  end
  result.soak_s = (core.now_ms() - t1) / 1000
  result.tokens = tokens
  -- one more request: the last lost worker is taken back, the cluster whole again for the last sample
  local last = play(srv.url, 1, 1)[1]
  if last.status ~= 200 then problem("the request after the soak failed: %s", tostring(last.error)) end
  local final, h = sample(o.requests)
  if #h.devices ~= o.devices then problem("after the soak the server has %d devices, not %d", #h.devices, o.devices) end
  result.lost, result.wrong = lost, wrong
  result.kills = kills
  result.device_losses = h.device_losses
  result.devices_taken_back = h.devices_taken_back
  result.losses = h.losses
  if h.device_losses ~= #kills then problem("%d workers killed but the server counts %d losses", #kills, h.device_losses) end
  if (h.devices_taken_back or 0) ~= #kills then problem("%d workers killed, %d taken back", #kills, h.devices_taken_back or 0) end
  local replan = {}
  for _, l in ipairs(h.losses or {}) do replan[#replan + 1] = l.replan_ms end
  table.sort(replan)
  result.replan_ms = #replan > 0 and { min = replan[1], median = replan[math.ceil(#replan / 2)], max = replan[#replan] } or nil
  return final
end

-- The peaks of get(sample)'s values in the samples of the soak's first half and of its second.
local function peaks(samples, get)
  local half = o.requests / 2
  local p1, p2 = 0, 0
  for _, smp in ipairs(samples) do
    for _, v in ipairs(get(smp)) do
      if smp.requests_done <= half then p1 = math.max(p1, v) else p2 = math.max(p2, v) end
    end
  end
  return p1, p2
end

-- Each worker's life in the samples (by pid): its device, samples, first and last figures, its
-- RSS series and its descriptors' kinds while the cluster was whole.
local function worker_lives(samples)
  local life = {}
  for _, smp in ipairs(samples) do
    for _, w in ipairs(smp.workers) do
      if w.rss_kib then
        local l = life[w.pid] or { pid = w.pid, device = w.device, first = w, samples = 0, rss = {}, fd_kinds = {} }
        l.last, l.samples = w, l.samples + 1
        l.rss[#l.rss + 1] = w.rss_kib
        if smp.devices == o.devices then
          l.fds_whole = l.fds_whole or w.fds
          l.fd_kinds[#l.fd_kinds + 1] = w.fd_kinds
        end
        life[w.pid] = l
      end
    end
  end
  local workers = {}
  for _, l in pairs(life) do
    workers[#workers + 1] = { pid = l.pid, device = l.device, samples = l.samples, rss_kib_start = l.first.rss_kib,
      rss_kib_end = l.last.rss_kib, fds = l.fds_whole, fds_end = l.last.fds, rss_series = l.rss, fd_kinds = l.fd_kinds }
  end
  table.sort(workers, function(a, b) return a.pid < b.pid end)
  return workers
end

-- Memory and descriptors. A leak keeps what it took: per process, the floor of its samples'
-- second half above the peak of their first half by more than a stated bound (loip.measure.leak:
-- RSS the larger of 4 MiB and 10%; each kind of descriptor the larger of 4 and 25%). The first
-- half holds the warm-up (KV pages first touched, the Lua heap's collector finding its pace); a
-- count that goes down, or one sample caught high (a connection closing, a burst batched
-- otherwise on a busy machine), is no leak. Descriptors are counted with the whole cluster up (a
-- cluster short of a device has other connections).
local function check_leaks(samples, final)
  local first = samples[1]
  local h1, h2 = peaks(samples, function(smp) return { smp.head_rss_kib } end)
  local w1, w2 = peaks(samples, function(smp)
    local t = {}
    for _, w in ipairs(smp.workers) do t[#t + 1] = w.rss_kib end
    return t
  end)
  result.head = { rss_kib_start = first.head_rss_kib, rss_kib_end = final.head_rss_kib, rss_kib_peak_first_half = h1,
    rss_kib_peak_second_half = h2, rss_growth_kib = h2 - h1, fds_start = first.head_fds, fds_end = final.head_fds,
    fd_kinds_end = final.head_fd_kinds }
  result.worker_rss = { rss_kib_peak_first_half = w1, rss_kib_peak_second_half = w2, rss_growth_kib = w2 - w1 }
  local workers = worker_lives(samples)
  log("head: RSS %.1f MiB after the warm-up, peaks %.1f / %.1f MiB in the soak's halves, %.1f at the end; %d -> %d descriptors",
    first.head_rss_kib / 1024, h1 / 1024, h2 / 1024, final.head_rss_kib / 1024, first.head_fds, final.head_fds)
  log("workers: RSS peaks %.1f / %.1f MiB in the soak's halves", w1 / 1024, w2 / 1024)
  local head_rss, head_fds = {}, {}
  for _, smp in ipairs(samples) do
    head_rss[#head_rss + 1] = smp.head_rss_kib
    if smp.devices == o.devices then head_fds[#head_fds + 1] = smp.head_fd_kinds end
  end
  local long = o.requests >= 2 * o.sample_every -- the RSS and the head's descriptors: each half sampled every --sample-every
  if long then
    local p = leak.rss(head_rss, "the head")
    if p then problem("%s", p) end
    for _, p in ipairs(leak.fds(head_fds, "the head")) do problem("%s", p) end
  end
  for _, w in ipairs(workers) do
    local what = string.format("worker %d (device %d)", w.pid, w.device)
    local p = long and leak.rss(w.rss_series, what)
    if p then problem("%s", p) end
    for _, p in ipairs(leak.fds(w.fd_kinds, what)) do problem("%s", p) end
    w.rss_series, w.fd_kinds = nil, nil
  end
  result.workers = workers
  result.samples = samples
  result.leak_bounds = { fd_min = leak.FD_MIN, fd_share = leak.FD_SHARE, rss_min_kib = leak.RSS_MIN_KIB, rss_share = leak.RSS_SHARE }
end

-- Leaks once stopped: the server stops on SIGTERM, and every worker seen ends with it (each
-- waited for, 15 s at most, before it counts as left).
local function check_stopped(srv, worker_seen)
  srv.stop()
  if srv.killed then problem("the soaked server did not stop on SIGTERM within 15 s") end
  local left = {}
  for pid in pairs(worker_seen) do if alive(pid) then left[#left + 1] = pid end end
  local deadline = core.now_ms() + 15000
  repeat
    for i = #left, 1, -1 do if not alive(left[i]) then table.remove(left, i) end end
    if #left > 0 then core.sleep_ms(50) end
  until #left == 0 or core.now_ms() > deadline
  if #left > 0 then problem("workers still running after the server stopped: %s", table.concat(left, ", ")) end
  result.workers_left = #left
end

local ok, err = pcall(function()
  local reference = run_reference()
  local srv = start_server(string.format("--devices %d --mem %s --threads 1 --context %d --max-batch %d --step-tokens 32",
    o.devices, o.mem, o.context, o.max_burst), "the soaked server")
  local samples, worker_seen = {}, {}
  local sample = sampler(srv, samples, worker_seen)
  -- a warm-up request, so that the first sample sees a server that has run a step
  local warm = play(srv.url, 1, 1)[1]
  if warm.status ~= 200 then error("the soaked server failed its warm-up request: " .. tostring(warm.error), 0) end
  sample(0)
  local final = soak(srv, reference, sample)
  check_leaks(samples, final)
  check_stopped(srv, worker_seen)
end)
for i = #cleanup, 1, -1 do cleanup[i]() end
if tmp_store then os.execute("rm -rf " .. proc.sh_quote(tmp_store)) end
if not ok then
  io.stderr:write("soak.lua: ", tostring(err), "\n")
  os.exit(1)
end
local tmp_new = {}
for name in pairs(tmp_list()) do if not tmp_before[name] then tmp_new[#tmp_new + 1] = "/tmp/" .. name end end
table.sort(tmp_new)
if #tmp_new > 0 then problem("left in /tmp: %s", table.concat(tmp_new, ", ")) end
result.tmp_left = tmp_new

result.problems = problems
result.ok = #problems == 0
os.execute("mkdir -p " .. proc.sh_quote(o.out))
local series = { { label = "head", points = {}, color = "#c0392b" } }
local by_device = {}
for _, s in ipairs(result.samples) do
  series[1].points[#series[1].points + 1] = { s.requests_done, s.head_rss_kib / 1024 }
  for _, w in ipairs(s.workers) do
    if w.rss_kib then
      by_device[w.device] = by_device[w.device] or { label = "worker of device " .. w.device, points = {} }
      local pts = by_device[w.device].points
      pts[#pts + 1] = { s.requests_done, w.rss_kib / 1024 }
    end
  end
end
for i = 1, o.devices do if by_device[i] then series[#series + 1] = by_device[i] end end
result.plot = plot.lines(o.out .. "/soak.svg", {
  title = string.format("soak: %d requests, %d devices, a worker killed every %d requests: RSS", o.requests, o.devices, o.kill_every),
  xlabel = "requests done", ylabel = "RSS, MiB", series = series,
})
json.write_file(o.out .. "/soak.json", json.encode_sorted(result, 2) .. "\n")
local summary = {}
for k, v in pairs(result) do if k ~= "samples" then summary[k] = v end end
print(json.encode_sorted(summary))
log("%d requests in %.0f s (%d tokens), %d workers killed, %d lost, %d wrong, re-plan %s ms median; %s", o.requests,
  result.soak_s or 0, result.tokens or 0, #(result.kills or {}), #(result.lost or {}), #(result.wrong or {}),
  result.replan_ms and string.format("%.0f", result.replan_ms.median) or "-", result.ok and "ok" or (#problems .. " problems"))
os.exit(result.ok and 0 or 1)
