-- A device that dies while nothing runs (issue 36): the head pings its devices idle too, so a
-- worker killed (-9) between requests is a loss (counted in /health's device_losses, a "loss"
-- membership event, a line on the head's terminal), planned around before the next request,
-- which completes with the single device's text; a worker that joins then is admitted whatever
-- the state of the others; `loip cluster drain` of a dead device answers at once with its loss.
-- A local worker killed idle is a loss and a take-back, as one killed mid-stream. A `--listen`
-- worker whose head is gone (on another host: no PING for the head's --dead-after) leaves at
-- once on SIGTERM.
local loip = require "loip"
local json = require "loip.text.json"
local client = require "loip.runtime.http_client"
local core = require "loip.core"
local T = require "spec.support"
local alive = require("loip.cluster.proc").alive

teardown(function() T.cleanup() T.drop_stores() end)

local S260 = T.root .. "/models/stories260K"
local PROMPT = { 1, 403, 407, 261, 31 }
local TOKEN = "idle-loss-spec-token"

local ref
local function reference()
  if not ref then
    local m = loip.model.open(S260, { context = 256, threads = 1 })
    local it = m:generate(PROMPT, { max_tokens = 30, temperature = 0, stop = {} })
    local parts = {}
    for _, piece in it do parts[#parts + 1] = piece end
    m:close()
    ref = table.concat(parts)
  end
  return ref
end

-- Processes this spec starts, killed at the end whatever happens.
local pids = {}
after_each(function()
  T.stop_servers()
  for pid in pairs(pids) do os.execute("kill -KILL " .. pid .. " 2>/dev/null") end
  pids = {}
  collectgarbage() collectgarbage()
end)

local function wait_until(what, f, ms, logs)
  local deadline = core.now_ms() + (ms or 30000)
  while not f() do
    if core.now_ms() > deadline then
      local text = {}
      for _, p in ipairs(logs or {}) do text[#text + 1] = p .. ":\n" .. T.read_or_empty(p) end
      error("waited in vain for " .. what .. "\n" .. table.concat(text, "\n"), 2)
    end
    core.sleep_ms(50)
  end
end

-- `cmd > DIR/out 2> DIR/err &`: its pid and DIR.
local function start(cmd)
  local dir = T.tmpdir()
  local p = io.popen(string.format("%s > %s/out 2> %s/err & echo $!", cmd, dir, dir))
  local pid = tonumber(p:read("*l"))
  p:close()
  pids[pid] = true
  return pid, dir
end

-- `loip worker --listen` with an empty cache (its blocks shipped); extra: --join HEAD. Its pid,
-- endpoint (once it listens) and log.
local function worker(extra)
  local dir = T.tmpdir()
  local pid, io_dir = start(string.format("LOIP_CLUSTER_TOKEN=%s %s worker --listen 127.0.0.1:0 --cache %s --mem 1500K --threads 1 %s",
    TOKEN, T.loip, dir .. "/cache", extra or ""))
  local ep
  wait_until("the worker to listen", function()
    ep = T.read_or_empty(io_dir .. "/out"):match("listening (%S+)")
    return ep ~= nil or not alive(pid)
  end)
  assert(ep, "the worker started: " .. T.read_or_empty(io_dir .. "/err"))
  return pid, ep, io_dir .. "/err"
end

local function get_json(cl, url)
  local t = cl:get(url)
  cl:wait(30000)
  return json.decode(t.body) or {}
end

-- A greedy completion of PROMPT (30 tokens): its status and text.
local function complete(cl, url, model)
  local t = cl:post(url .. "/completions", json.encode({ model = model, prompt = PROMPT, max_tokens = 30, temperature = 0,
    ignore_eos = true }))
  cl:wait(120000)
  local b = json.decode(t.body or "") or {}
  return t.status, b.choices and b.choices[1].text or t.body
end

local function kinds(h)
  local out = {}
  for _, e in ipairs(h.membership or {}) do out[#out + 1] = e.kind end
  return table.concat(out, ",")
end

-- `loip serve` of store st on the --listen workers at hosts (host:port each), --join-listen on:
-- its API's URL, stderr path, the endpoint workers join, and the URL without /v1.
local function serve_hosts(st, hosts, max_batch, dead_ms)
  local url, _, errlog = T.serve(string.format("--model %s --hosts %s --threads 1 --context 256 --max-batch %d --token %s "
    .. "--join-listen 127.0.0.1:0 --dead-after %d", st, table.concat(hosts, ","), max_batch, TOKEN, dead_ms), { verbose = true })
  local joins = T.read_or_empty(errlog:gsub("err$", "out")):match("joins tcp://(%S+)")
  return url, errlog, joins, url:gsub("/v1$", "")
end

describe("a device dead while nothing runs", function()
  it("--hosts: a worker killed idle is a loss, logged; the next request completes; a join and a drain of a dead device are answered at once", function()
    local st = T.slice_store(S260, "s260")
    local model = st:match("([^/]+)$")
    local eps = {}
    for k = 1, 3 do
      local pid, ep = worker()
      eps[k] = { pid = pid, ep = ep }
    end
    local hosts = {}
    for k, w in ipairs(eps) do hosts[k] = w.ep:gsub("^tcp://", "") end
    local url, errlog, joins, base = serve_hosts(st, hosts, 2, 3000)
    local cl = client.new()
    local status, text = complete(cl, url, model)
    assert.are.equal(200, status, text)
    assert.are.equal(reference(), text)
    -- worker 2 killed while nothing runs: the head finds it silent, a loss it logs
    os.execute("kill -KILL " .. eps[2].pid)
    wait_until("the loss in /health", function() return get_json(cl, base .. "/health").device_losses == 1 end)
    local h = get_json(cl, base .. "/health")
    assert.are.equal("ok", h.status)
    assert.are.equal(2, #h.devices)
    assert.are.equal("loss", kinds(h))
    assert.are.equal(2, h.membership[1].device)
    assert.are.equal(eps[2].ep, h.membership[1].endpoint)
    assert.matches("cluster: device 2 %(" .. eps[2].ep:gsub("%p", "%%%0") .. "%) lost %(", T.read(errlog))
    status, text = complete(cl, url, model)
    assert.are.equal(200, status, text)
    assert.are.equal(reference(), text)
    -- worker 3 killed and, at once, a fresh worker joins: admitted whatever worker 3's state
    os.execute("kill -KILL " .. eps[3].pid)
    local jpid, jep, jlog = worker("--join " .. joins)
    wait_until("the join", function() return kinds(get_json(cl, base .. "/health")):find("join", 1, true) ~= nil end, 60000,
      { errlog, jlog })
    h = get_json(cl, base .. "/health")
    assert.are.equal("loss,loss,join", kinds(h))
    assert.are.equal(2, #h.devices)
    assert.are.equal(jep, h.devices[2].endpoint)
    wait_until("the worker told it joined", function() return T.read_or_empty(jlog):find("joined the head", 1, true) ~= nil end)
    status, text = complete(cl, url, model)
    assert.are.equal(200, status, text)
    assert.are.equal(reference(), text)
    -- the joined worker killed and drained at once: its loss is the drain's answer, promptly
    os.execute("kill -KILL " .. jpid)
    local t0 = core.now_ms()
    local d = cl:post(url .. "/cluster/drain", json.encode({ device = 2 }))
    cl:wait(30000)
    assert.are.equal(200, d.status, d.body .. T.read(errlog))
    local e = json.decode(d.body).event
    assert.are.equal("loss", e.kind)
    assert.are.equal(jep, e.endpoint)
    assert.is_true(core.now_ms() - t0 < 30000)
    h = get_json(cl, base .. "/health")
    assert.are.equal(3, h.device_losses)
    assert.are.equal(1, #h.devices)
    status, text = complete(cl, url, model)
    assert.are.equal(200, status, text)
    assert.are.equal(reference(), text)
    cl:close()
  end)

  it("--hosts: a loss the other cannot take over fails the next request at once, and a join heals it", function()
    local st = T.slice_store(S260, "s260")
    local model = st:match("([^/]+)$")
    local w = {}
    for k = 1, 2 do
      local pid, ep = worker()
      w[k] = { pid = pid, ep = ep:gsub("^tcp://", "") }
    end
    -- 4 requests' KV: two budgets of 1500K hold the model, one does not
    local url, errlog, joins, base = serve_hosts(st, { w[1].ep, w[2].ep }, 4, 1000)
    local cl = client.new()
    os.execute("kill -KILL " .. w[2].pid)
    wait_until("the loss in /health", function() return get_json(cl, base .. "/health").device_losses == 1 end)
    local h = get_json(cl, base .. "/health")
    assert.are.equal("degraded", h.status)
    assert.matches("cluster: device 2 %([^)]+%) lost %(.-the others cannot take over%): 1 device now, no plan found", T.read(errlog))
    local status, text = complete(cl, url, model)
    assert.are.equal(500, status)
    assert.matches("the cluster cannot serve now: the 1 devices left cannot take over: .*short by", text)
    worker("--join " .. joins)
    wait_until("the join", function() return get_json(cl, base .. "/health").status == "ok" end, 60000, { errlog })
    status, text = complete(cl, url, model)
    assert.are.equal(200, status, text)
    assert.are.equal(reference(), text)
    cl:close()
  end)

  it("--devices: a local worker killed idle is a loss and a take-back, both logged", function()
    local st = T.slice_store(S260, "s260")
    local model = st:match("([^/]+)$")
    local url, _, errlog = T.serve(string.format("--model %s --devices 3 --threads 1 --context 256 --max-batch 2", st),
      { verbose = true })
    local base = url:gsub("/v1$", "")
    local cl = client.new()
    local status, text = complete(cl, url, model)
    assert.are.equal(200, status, text)
    local pid = get_json(cl, base .. "/health").devices[2].pid
    os.execute("kill -KILL " .. pid)
    wait_until("the loss in /health", function() return get_json(cl, base .. "/health").device_losses == 1 end)
    assert.matches("cluster: device 2 %([^)]+%) lost %(device 2 %(.-pid " .. pid .. "%) died while idle", T.read(errlog))
    status, text = complete(cl, url, model)
    assert.are.equal(200, status, text)
    assert.are.equal(reference(), text)
    local h = get_json(cl, base .. "/health")
    assert.are.equal(1, h.devices_taken_back)
    assert.are.equal(3, #h.devices)
    assert.are_not.equal(pid, h.devices[2].pid)
    assert.matches("cluster: device 2 %([^)]+%) taken back: 3 devices now", T.read(errlog))
    cl:close()
  end)

  it("a --listen worker whose head (on another host) is gone leaves at once on SIGTERM", function()
    if os.execute("unshare --uts --map-root-user true > /dev/null 2>&1") ~= 0 then
      pending("needs unshare --uts --map-root-user (user namespaces) to run the head as another host") return
    end
    local st = T.slice_store(S260, "s260")
    local w1, e1, log1 = worker()
    local _, e2 = worker()
    local head, dir = start(string.format("unshare --uts --map-root-user sh -c 'hostname elsewhere-head && exec %s serve --model %s "
      .. "--hosts %s,%s --threads 1 --context 256 --port 0 --token %s --dead-after 1000'", T.loip, st, e1:gsub("^tcp://", ""),
      e2:gsub("^tcp://", ""), TOKEN))
    wait_until("the head to serve", function()
      return T.read_or_empty(dir .. "/out"):match("listening http") ~= nil or not alive(head)
    end, 60000)
    assert(alive(head), "the head started: " .. T.read_or_empty(dir .. "/err"))
    wait_until("the head's plan on worker 1", function() return T.read_or_empty(log1):match("device 1 of 2: plan") ~= nil end)
    os.execute("kill -KILL " .. head)
    wait_until("the head to be gone", function() return not alive(head) end)
    os.execute("kill -TERM " .. w1)
    wait_until("worker 1 to exit", function() return not alive(w1) end, 25000)
    assert.matches("SIGTERM: the head head%-elsewhere%-head%-%d+ has not pinged us for .-: it is gone; leaving at once", T.read(log1))
  end)

  it("a --listen worker leaving on SIGTERM leaves as soon as its head goes silent (it will not plan again)", function()
    local st = T.slice_store(S260, "s260")
    local w1, e1, log1 = worker()
    local _, e2 = worker()
    local head, dir = start(string.format("%s serve --model %s --hosts %s,%s --threads 1 --context 256 --port 0 --token %s "
      .. "--dead-after 10000", T.loip, st, e1:gsub("^tcp://", ""), e2:gsub("^tcp://", ""), TOKEN))
    local url
    wait_until("the head to serve", function()
      url = T.read_or_empty(dir .. "/out"):match("listening (http://%S+)")
      return url ~= nil or not alive(head)
    end, 60000)
    assert(alive(head), "the head started: " .. T.read_or_empty(dir .. "/err"))
    -- a request: before it starts, the head pings every device and waits for the answers, so
    -- the worker has been pinged when it is done
    local cl = client.new()
    local status = complete(cl, url, st:match("([^/]+)$"))
    cl:close()
    assert.are.equal(200, status)
    -- then the head stops answering (frozen: alive, but it pings and plans no more); the SIGTERM
    -- comes within --dead-after of its last ping, so the worker first waits to be planned
    -- without, and leaves once the head has been silent that long
    os.execute("kill -STOP " .. head)
    os.execute("kill -TERM " .. w1)
    wait_until("worker 1 to exit (before the 30 s it gives a live head)", function() return not alive(w1) end, 25000, { log1 })
    assert.matches("SIGTERM: leaving the cluster once the head planned without us", T.read(log1), 1, true)
    assert.matches("SIGTERM: the head %S+ has not pinged us for .-: it is gone; leaving at once", T.read(log1))
    os.execute("kill -KILL " .. head)
  end)
end)
