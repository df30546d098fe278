-- combinations_spec's engine room: the models (stories260K's slice store, a tiny synthetic MoE's),
-- a `loip serve` per (engine, model, draft, online) shared by the rows that leave it as they found
-- it, the single device's references, and one row of the covering array run and checked.
local json = require "loip.text.json"
local client = require "loip.runtime.http_client"
local core = require "loip.core"
local T = require "spec.support"
local alive = require("loip.cluster.proc").alive
local A = require "luassert" -- (busted's assert, which a required module does not see)

local M = {}

local TOKEN = "combinations-spec-token"
-- tokens a request generates; with online adaptation more, past what the short budgets hold
-- with drafts' rows (issue 36: the draft must give way before a request fails), and with a
-- fault mid-request
local MAX_TOKENS, ONLINE_TOKENS = 48, 160
-- a literal of 3-byte characters first: byte tokens that split them (stories260K's and the
-- synthetic tokenizer's byte fallbacks), then free lower-case text
local GRAMMAR = 'root ::= "世界 ü" [a-z ]*'
-- budgets (--mem): the one device's, each of three devices'; with online adaptation, short ones
-- (the plan holds 32 positions, the requests take more: the online policy makes room; each row
-- prints how often it adapted)
local MEM1, MEM3 = "4M", { "1500K", "1500K", "1500K" }
local MEM1_ONLINE, MEM3_ONLINE = "1800K", { "790K", "770K", "800K" }
-- (and where a fault leaves two devices for good, budgets two of them can serve the request
-- with: three still adapt, and a device's loss or drain is then a re-plan, not an error)
local MEM3_ONLINE_TWO = { "900K", "880K", "910K" }
local function leaves_two(s)
  return s.fault == "kill-busy" or s.fault == "drain" or (s.fault == "kill-idle" and s.engine == "hosts3")
end

local scratch = {}
local function tmpdir()
  local d = T.tmpdir()
  scratch[#scratch + 1] = d
  return d
end
function M.scratch_dirs() return scratch end

-- The slice store of model "dense" (stories260K) or "moe" (a synthetic Qwen3-MoE: 4 layers of 8
-- experts, top 2).
local stores = {}
function M.store(model)
  if stores[model] then return stores[model] end
  if model == "dense" then
    stores[model] = T.slice_store(T.root .. "/models/stories260K", "s260")
  else
    local dir = tmpdir()
    local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth --like qwen3-30b-a3b --dtype f32 --layers 4 --dim 64 --heads 4 "
      .. "--kv-heads 2 --ffn 32 --experts 8 --experts-per-token 2 --vocab 512 --seed 7 --std 0.3 %s/hf", T.loip, dir))
    assert(rc == 0, err)
    require("loip.model.slice").write(dir .. "/hf", dir .. "/store", { quiet = true })
    stores[model] = dir .. "/store"
  end
  return stores[model]
end

-- Processes this module started (servers' stop functions, workers' pids), stopped at the end.
local stops, workers, private = {}, {}, {}
function M.private_dirs() return private end

local function start_worker(args)
  local dir = tmpdir()
  local p = io.popen(string.format("LOIP_CLUSTER_TOKEN=%s %s worker --listen 127.0.0.1:0 --threads 1 %s > %s/out 2> %s/err & echo $!",
    TOKEN, T.loip, args, dir, dir))
  local pid = tonumber(p:read("*l"))
  p:close()
  workers[pid] = true
  return pid, dir
end

local function wait_until(what, f, ms)
  local deadline = core.now_ms() + (ms or 60000)
  while not f() do
    if core.now_ms() > deadline then error("waited in vain for " .. what, 2) end
    core.sleep_ms(20)
  end
end

local check_utf8
local function get_json(url)
  local cl = client.new()
  local t = cl:get(url)
  cl:wait(30000)
  cl:close()
  check_utf8(url, t.body)
  return json.decode(t.body), t
end

local DRAFTS = { none = "", ngram = "--draft ngram", self2 = "--draft self:layers=2",
  tree = "--draft self:layers=2,tree=on,width=2,levels=2" }
local ONLINE = { none = "", loip = "--online loip --plan-positions 32" }

-- A server for s = { engine, model, draft, online }: { url, base, stop, err, joins, workers = { pid },
-- budget }. Started afresh unless one for the same tuple is as it was started.
local servers = {}
function M.server(s)
  local key = table.concat({ s.engine, s.model, s.draft, s.online, tostring(s.online ~= "none" and leaves_two(s)) }, "/")
  if servers[key] and servers[key].clean then return servers[key] end
  if servers[key] then servers[key].stop() end
  local st = M.store(s.model)
  local args = string.format("--model %s --served-name combo --threads 1 --context 256 --max-batch 4 %s %s", st,
    DRAFTS[s.draft], ONLINE[s.online])
  local srv = { engine = s.engine, model = s.model, store = st, worker_pids = {} }
  local mem1, mem3 = MEM1, MEM3
  if s.online ~= "none" then mem1, mem3 = MEM1_ONLINE, leaves_two(s) and MEM3_ONLINE_TWO or MEM3_ONLINE end
  srv.mem3 = mem3
  if s.engine == "1dev" then
    args = args .. " --mem " .. mem1
  elseif s.engine == "local3" then
    args = args .. string.format(" --devices 3 --mem %s --link-delay 2ms --token %s --join-listen 127.0.0.1:0", table.concat(mem3, ","), TOKEN)
  else
    local hosts = {}
    for i = 1, 3 do
      local pid, dir = start_worker(string.format("--cache %s --mem %s", tmpdir(), mem3[i]))
      wait_until("worker " .. i .. " to listen", function() return T.read_or_empty(dir .. "/out"):match("listening tcp://(%S+)") or not alive(pid) end)
      hosts[i] = assert(T.read_or_empty(dir .. "/out"):match("listening tcp://(%S+)"), "worker " .. i .. ": " .. T.read_or_empty(dir .. "/err"))
      srv.worker_pids[i] = pid
    end
    args = args .. string.format(" --hosts %s --token %s --join-listen 127.0.0.1:0", table.concat(hosts, ","), TOKEN)
  end
  local url, stop, errlog = T.serve(args)
  srv.url, srv.base, srv.err = url, url:gsub("/v1$", ""), errlog
  srv.joins = T.read_or_empty(errlog:gsub("err$", "out")):match("joins tcp://(%S+)")
  srv.stop = function()
    stop()
    -- (--hosts workers are ours: gone with their head, whose leave they would wait for)
    if srv.engine == "hosts3" then for _, pid in ipairs(srv.worker_pids) do os.execute("kill -KILL " .. pid .. " 2>/dev/null") end end
    servers[key] = nil
  end
  stops[srv.stop] = true
  if s.engine == "local3" then -- the workers' pids, and the head's private directory under /tmp
    local h = get_json(srv.base .. "/health")
    for i, d in ipairs(h.devices) do
      srv.worker_pids[i] = d.pid
      local f = io.open("/proc/" .. d.pid .. "/cmdline", "rb")
      local dir = f and f:read("*a"):match("%-%-head%-dir%z([^%z]+)")
      if f then f:close() end
      if dir and i == 1 then private[#private + 1] = dir end
    end
  end
  srv.clean = true
  servers[key] = srv
  return srv
end

function M.stop_all()
  for stop in pairs(stops) do stops[stop] = nil stop() end
  for pid in pairs(workers) do
    if alive(pid) then
      os.execute("kill -TERM " .. pid .. " 2>/dev/null")
      local deadline = core.now_ms() + 10000
      while alive(pid) and core.now_ms() < deadline do core.sleep_ms(20) end
      if alive(pid) then os.execute("kill -KILL " .. pid .. " 2>/dev/null") end
    end
  end
  workers = {}
end

-- Strict UTF-8 (no overlongs, no surrogates, nothing past U+10FFFF): true, or false and the
-- offset of the first bad byte.
function M.valid_utf8(s)
  local i, n = 1, #s
  while i <= n do
    local c = s:byte(i)
    local len, lo, hi = 0, 0x80, 0xBF
    if c < 0x80 then len = 1
    elseif c >= 0xC2 and c <= 0xDF then len = 2
    elseif c >= 0xE0 and c <= 0xEF then
      len = 3
      if c == 0xE0 then lo = 0xA0 elseif c == 0xED then hi = 0x9F end
    elseif c >= 0xF0 and c <= 0xF4 then
      len = 4
      if c == 0xF0 then lo = 0x90 elseif c == 0xF4 then hi = 0x8F end
    else return false, i end
    for k = 1, len - 1 do
      local b = s:byte(i + k)
      if not b or b < (k == 1 and lo or 0x80) or b > (k == 1 and hi or 0xBF) then return false, i end
    end
    i = i + len
  end
  return true
end

function check_utf8(what, s)
  local ok, at = M.valid_utf8(s)
  if not ok then
    local near = s:sub(math.max(1, at - 20), at + 20):gsub("[\128-\255]", function(c) return string.format("\\x%02x", c:byte()) end)
    error(string.format("%s is not valid UTF-8 at byte %d: %s", what, at, near), 3) -- (the log stays text)
  end
end

-- A request body of a row's output kind.
local function body(prompt, output, extra)
  local b = { model = "combo", prompt = prompt, max_tokens = MAX_TOKENS, temperature = 0, ignore_eos = true }
  if output == "grammar" then b.grammar = GRAMMAR elseif output == "logprobs" then b.logprobs = 2 end
  for k, v in pairs(extra or {}) do b[k] = v end
  return b
end

-- The single device's text for (model, prompt, grammar): a plain one-device server's, greedy.
local refs, ref_servers = {}, {}
local function reference(model, prompt, output, max_tokens)
  local key = table.concat({ model, prompt, output == "grammar" and "g" or "", max_tokens }, "\0")
  if refs[key] then return refs[key] end
  if not ref_servers[model] then
    local url, stop = T.serve(string.format("--model %s --served-name combo --threads 1 --context 256 --max-batch 4", M.store(model)))
    ref_servers[model] = url
    stops[stop] = true
  end
  local cl = client.new()
  local t = cl:post(ref_servers[model] .. "/completions", json.encode(body(prompt, output == "grammar" and "grammar" or "text", { max_tokens = max_tokens })))
  cl:wait(60000)
  cl:close()
  assert(t.status == 200, "the reference: " .. t.body)
  check_utf8("the single device's answer", t.body)
  refs[key] = json.decode(t.body).choices[1].text
  return refs[key]
end

local NAMES = { "Tom", "Lily", "Sam", "Mia", "Ben", "Sue", "Max", "Amy", "Tim", "Zoe", "Jack", "Anna" }
local PLACES = { "park", "shop", "sea", "woods", "farm", "zoo", "lake", "hill" }
-- prompt k: its first words its own (a cold prompt shares no KV group with another), long
-- enough for two of the prefix cache's groups
local function prompt(k)
  return string.format("%s and the %s. Once upon a time there was a little girl who liked to play with her ball in the sun",
    NAMES[(k - 1) % #NAMES + 1], PLACES[math.floor((k - 1) / #NAMES) % #PLACES + 1])
end

-- Send the request b on cl: its transfer; a streamed one gathers each choice's pieces and
-- logprobs tokens, checking each chunk's UTF-8.
local function send(cl, url, b)
  local t = cl:post(url .. "/completions", json.encode(b))
  t.req, t.texts, t.lp = b, {}, {}
  if b.stream then
    t.events = 0
    t.on_event = function(tr, data)
      if data == "[DONE]" then tr.done_marker = true return end
      check_utf8("a streamed chunk", data)
      local e = assert(json.decode(data), data)
      if e.error then tr.stream_error = data end
      for _, ch in ipairs(e.choices or {}) do
        local i = ch.index + 1
        tr.events = tr.events + 1
        tr.texts[i] = (tr.texts[i] or "") .. (ch.text or "")
        if ch.finish_reason and ch.finish_reason ~= json.null then tr.finish = ch.finish_reason end
        if type(ch.logprobs) == "table" then
          tr.lp[i] = tr.lp[i] or {}
          for _, tok in ipairs(ch.logprobs.tokens or {}) do tr.lp[i][#tr.lp[i] + 1] = tok end
        end
      end
      if e.usage and e.usage ~= json.null then tr.usage = e.usage end
    end
  end
  return t
end

-- A finished transfer's choices: { { text, logprobs_tokens } }, its usage; errors on a non-200,
-- invalid UTF-8, a stream with no end.
local function answer(t, what)
  if t.status ~= 200 then error(string.format("%s: HTTP %s %s", what, tostring(t.status), t.body), 2) end
  if t.req.stream then
    if t.stream_error then error(string.format("%s: the stream ended in an error: %s", what, t.stream_error), 2) end
    assert(t.done_marker, what .. ": the stream ended with no [DONE]")
    local out = {}
    for i = 1, t.req.n or 1 do out[i] = { text = t.texts[i], lp = t.lp[i] } end
    return out, t.usage
  end
  check_utf8(what .. "'s body", t.body)
  local b = assert(json.decode(t.body), t.body)
  local out = {}
  for _, ch in ipairs(b.choices) do
    out[ch.index + 1] = { text = ch.text, lp = type(ch.logprobs) == "table" and ch.logprobs.tokens or nil }
  end
  return out, b.usage
end

-- Check a finished request: every choice the single device's text (and its logprobs, one a token).
local function check(t, model, output, what)
  local choices, usage = answer(t, what)
  A.are.equal(t.req.n or 1, #choices, what .. ": its choices")
  local want = reference(model, t.req.prompt, output, t.req.max_tokens)
  for i, ch in ipairs(choices) do
    check_utf8(what .. "'s text", ch.text or "")
    A.are.equal(want, ch.text, string.format("%s, choice %d: the single device's text", what, i))
    if output == "logprobs" then
      A.are.equal(t.req.max_tokens, ch.lp and #ch.lp or 0, string.format("%s, choice %d: a logprob per token", what, i))
    end
  end
  return usage
end

-- The row's requests: one streamed, or three at once (streamed, n: 2 not streamed, streamed).
local function requests(cl, srv, r, base, n)
  local out = {}
  out[1] = send(cl, srv.url, body(prompt(base), r.output, { stream = true, stream_options = { include_usage = true }, max_tokens = n }))
  if r.requests == "3n2" then
    out[2] = send(cl, srv.url, body(prompt(base + 1), r.output, { n = 2, max_tokens = n }))
    out[3] = send(cl, srv.url, body(prompt(base + 2), r.output, { stream = true, max_tokens = n }))
  end
  return out
end

-- Three requests at once on the server at url (one with n: 2), n tokens each: each choice the
-- single device's text.
function M.concurrent(url, model, n)
  local cl = client.new()
  local ts = {}
  for k = 1, 3 do ts[k] = send(cl, url, body(prompt(100 + k), "text", { max_tokens = n, n = k == 2 and 2 or nil })) end
  cl:wait(120000)
  cl:close()
  for k, t in ipairs(ts) do check(t, model, "text", "request " .. k) end
end

local function run_until(cl, what, f)
  local deadline = core.now_ms() + 60000
  while not f() do
    cl:run(5)
    if core.now_ms() > deadline then error("waited in vain for " .. what, 2) end
  end
end

local function kill(srv, i)
  local pid = srv.worker_pids[i]
  os.execute("kill -KILL " .. pid)
  wait_until("worker " .. i .. " to die", function() return not alive(pid) end)
end

local function join(srv)
  assert(srv.joins, "the join address is printed")
  local args = (srv.engine == "hosts3" and ("--cache " .. tmpdir()) or ("--store " .. srv.store)) .. " --mem " .. srv.mem3[3]
  return start_worker(args .. " --join " .. srv.joins)
end

-- One row of the covering array, checked. refused(r): nil, or how the design refuses the row's
-- request with n: 2 ({ param, says = { words the message holds } }); where it does, the server
-- keeps no prefix cache either, and says so when it starts.
function M.run_row(r, refused)
  local srv = M.server(r)
  srv.clean = r.fault == "none"
  local base = r.index * 4 -- (prompts no other row sends: a cold prefix)
  -- (a fault mid-request: a request long enough to be running when it comes)
  local n = (r.online == "none" and not r.fault:match("busy") and r.fault ~= "join" and r.fault ~= "drain") and MAX_TOKENS or ONLINE_TOKENS
  local cl = client.new()
  local ok, err = pcall(function()
    -- warm: the first request's prompt sent before (and checked); kill-idle: a request first, so
    -- that the worker dies idle after having served
    if r.prefix == "warm" or r.fault == "kill-idle" then
      local t = send(cl, srv.url, body(r.prefix == "warm" and prompt(base) or prompt(base + 3), r.output, { max_tokens = n }))
      cl:wait(120000)
      check(t, r.model, r.output, "the request before")
    end
    if r.fault == "kill-idle" then
      wait_until("the server idle", function() return get_json(srv.base .. "/health").running == 0 end)
      kill(srv, 2)
      -- (the head watches its devices while idle: the loss is seen before any request asks)
      wait_until("the idle device's loss", function() return get_json(srv.base .. "/health").device_losses == 1 end)
    end
    local ts = requests(cl, srv, r, base, n)
    local joined, jdir
    if r.fault == "kill-busy" or r.fault == "join" or r.fault == "drain" then
      run_until(cl, "the first tokens", function() return ts[1].events >= 2 or ts[1].t_done end)
      assert(not ts[1].t_done, "the request was still running when the fault came")
      if r.fault == "kill-busy" then kill(srv, 2)
      elseif r.fault == "join" then joined, jdir = join(srv)
      else
        local rc, out, derr = T.run(string.format("%s cluster drain 2 --url %s", T.loip, srv.url))
        assert(rc == 0, "loip cluster drain 2: " .. out .. derr)
      end
    end
    cl:wait(180000)
    for k, t in ipairs(ts) do
      local refusal = t.req.n and refused and refused(r)
      if refusal then -- (the design refuses n > 1 here: the answer must say so, naming both)
        A.are.equal(400, t.status, t.body)
        local e = json.decode(t.body).error
        A.are.equal(refusal.param, e.param)
        for _, words in ipairs(refusal.says) do A.matches(words, e.message, 1, true) end
        goto next
      end
      do
      local usage = check(t, r.model, r.output, "request " .. k)
      if k == 1 and r.prefix == "warm" and r.fault == "none" and refused and refused(r) then
        -- (the design keeps no prefix cache here: the server says so when it starts)
        A.matches("no prefix cache: the online policy on a cluster", T.read_or_empty(srv.err), 1, true)
      elseif k == 1 and r.prefix == "warm" and r.fault == "none" then
        A.is_true((((usage or {}).prompt_tokens_details or {}).cached_tokens or 0) > 0, "the warm prompt's prefix was cached")
      end
      end
      ::next::
    end
    -- membership: a loss per killed worker, the joined worker in, the drained one out
    local h = get_json(srv.base .. "/health")
    if r.engine ~= "1dev" then
      -- (local devices: a worker that died idle is started again and taken back at once; one
      -- killed mid-request, when the next request comes)
      local idle_back = r.engine == "local3" and 3 or 2
      local want = ({ ["kill-busy"] = 2, ["kill-idle"] = idle_back, join = 4, drain = 2 })[r.fault] or 3
      if r.fault == "join" then
        wait_until("the joined worker's admission", function()
          h = get_json(srv.base .. "/health")
          return #h.devices == 4 or not alive(joined)
        end)
        assert(#h.devices == 4, "the joined worker was admitted: " .. T.read_or_empty(jdir .. "/err"))
      end
      A.are.equal(want, #h.devices, "devices after the fault")
      A.are.equal(r.fault:match("^kill") and 1 or 0, h.device_losses, "device losses")
      A.are.equal(r.fault == "kill-idle" and r.engine == "local3" and 1 or 0, h.devices_taken_back, "devices taken back")
      A.are.equal("ok", h.status, h.error)
    end
    -- every device's accounted peak within its budget; online: the short budgets made it adapt
    local view = get_json(srv.base .. "/v1/cluster")
    local peaks = {}
    for _, d in ipairs(view.devices) do
      A.is_true((d.budget_bytes or 0) > 0, "device " .. d.device .. " has a budget")
      A.is_true((d.peak_bytes or 0) > 0, "device " .. d.device .. " reports its peak")
      A.is_true(d.peak_bytes <= d.budget_bytes, string.format("device %d: peak %d > budget %d", d.device, d.peak_bytes, d.budget_bytes))
      peaks[#peaks + 1] = string.format("%.0f/%.0fK", d.peak_bytes / 1024, d.budget_bytes / 1024)
    end
    io.stderr:write(string.format("  row %d: %d online adaptations; peak/budget per device %s\n", r.index, #view.adaptations,
      table.concat(peaks, " ")))
  end)
  cl:close()
  if not ok then
    srv.clean = false
    local log = T.read_or_empty(srv.err)
    srv.stop()
    error(tostring(err) .. (log ~= "" and ("\nserver log:\n" .. log:sub(-1500)) or ""), 0)
  end
  if not srv.clean then srv.stop() end
end

return M
