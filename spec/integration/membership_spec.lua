-- A serving cluster whose members change while it serves (docs/serving.md, "Membership"): a worker
-- started with --join is admitted between steps and the cluster plans again over the larger set;
-- a worker killed (-9) mid-request is a loss, a fresh one joins; `loip cluster drain I` and a
-- worker's SIGTERM let a device go; every request in flight goes on with exactly the tokens one
-- device gives, and /health lists joins, leaves and losses in one list. A worker with the wrong
-- token is refused, and both sides log it; so is one holding another slice store.
local loip = require "loip"
local json = require "loip.text.json"
local client = require "loip.runtime.http_client"
local core = require "loip.core"
local T = require "spec.support"
local alive = require("loip.cluster.proc").alive

teardown(function() T.cleanup() T.drop_stores() end)
after_each(function() T.stop_servers() collectgarbage() collectgarbage() end)

local S260 = T.root .. "/models/stories260K"
local PROMPTS = { { 1, 403, 407, 261, 31 }, { 1, 90, 22, 451 }, { 1, 320, 77, 9, 130, 11 } }
local TOKEN = "membership-spec-token"

-- The text one device gives for prompt (greedy, n tokens, no stop).
local refs = {}
local function reference(k, n)
  local key = k .. ":" .. n
  if not refs[key] then
    local m = loip.model.open(S260, { context = 256, threads = 1 })
    local it = m:generate(PROMPTS[k], { max_tokens = n, temperature = 0, stop = {} })
    local parts = {}
    for _, piece in it do parts[#parts + 1] = piece end
    m:close()
    refs[key] = table.concat(parts)
  end
  return refs[key]
end

-- Workers this spec starts, killed at the end whatever happens.
local workers = {}
after_each(function()
  for pid in pairs(workers) do os.execute("kill -KILL " .. pid .. " 2>/dev/null") end
  workers = {}
end)

-- `loip worker --join` (token: the cluster's unless given); returns its pid and its log's path.
local function join(joins, store, token)
  local dir = T.tmpdir()
  local p = io.popen(string.format("LOIP_CLUSTER_TOKEN=%s %s worker --listen 127.0.0.1:0 --store %s --threads 1 --join %s "
    .. "> %s/out 2> %s/err & echo $!", token or TOKEN, T.loip, store, joins, dir, dir))
  local pid = tonumber(p:read("*l"))
  p:close()
  workers[pid] = true
  return pid, dir .. "/err"
end

local function wait_until(what, f, ms)
  local deadline = core.now_ms() + (ms or 30000)
  while not f() do
    if core.now_ms() > deadline then error("waited in vain for " .. what, 2) end
    core.sleep_ms(50)
  end
end

local function get_json(cl, url, headers)
  local t = cl:get(url, headers)
  cl:wait(30000)
  return json.decode(t.body), t
end

-- A streamed completion of prompt k (n tokens, greedy, no stop): its transfer, whose .events
-- counts the chunks come so far and .text gathers them.
local function stream(cl, url, model, k, n, headers)
  return T.stream_completion(cl, url, { model = model, prompt = PROMPTS[k], max_tokens = n, temperature = 0, ignore_eos = true },
    headers)
end

-- Run the client until f() holds (transfers move meanwhile).
local function run_until(cl, what, f)
  local deadline = core.now_ms() + 60000
  while not f() do
    cl:run(20)
    if core.now_ms() > deadline then error("waited in vain for " .. what, 2) end
  end
end

local function events_of(h, kind)
  local out = {}
  for _, e in ipairs(h.membership) do if e.kind == kind then out[#out + 1] = e end end
  return out
end

-- `loip serve` on n local devices (5 ms links: a request lasts long enough to change the set
-- under it) admitting joins; returns the store, the model's name, the URL, the log's path and
-- the join address.
local function serve(n, extra)
  local st = T.slice_store(S260, "s260")
  local url, _, errlog = T.serve(string.format("--model %s --devices %d --threads 1 --context 256 --max-batch 2 --link-delay 5ms "
    .. "--token %s --join-listen 127.0.0.1:0 %s", st, n, TOKEN, extra or ""), { verbose = true })
  local joins = T.read_or_empty(errlog:gsub("err$", "out")):match("joins tcp://(%S+)")
  assert.is_truthy(joins, "the join address is printed")
  return st, st:match("([^/]+)$"), url, errlog, joins
end

describe("a serving cluster's membership", function()
  it("--join-listen needs a cluster, and on --devices the token workers that join prove", function()
    local dir = T.tmpdir()
    for _, case in ipairs({ { "", "give --devices or --hosts" }, { "--devices 2", "needs the token" } }) do
      local rc = os.execute(string.format("env -u LOIP_CLUSTER_TOKEN %s serve --model %s %s --join-listen 127.0.0.1:0 --port 0 > %s/out 2> %s/err",
        T.loip, T.slice_store(S260, "s260"), case[1], dir, dir))
      assert.are_not.equal(0, rc)
      assert.matches("--join-listen", T.read(dir .. "/err"), 1, true)
      assert.matches(case[2], T.read(dir .. "/err"), 1, true)
    end
  end)

  it("admits a worker that joins mid-request and one that replaces a worker killed (-9): the same tokens, then all three serve", function()
    local st, model, url, errlog, joins = serve(2)
    local base = url:gsub("/v1$", "")
    local cl = client.new()
    -- a third worker joins while a request decodes
    local t = stream(cl, url, model, 1, 200)
    run_until(cl, "the first tokens", function() return t.events >= 20 end)
    local pid3 = join(joins, st)
    cl:wait(120000)
    assert.are.equal(200, t.status, t.body)
    assert.are.equal(reference(1, 200), table.concat(t.pieces))
    local h = get_json(cl, base .. "/health")
    assert.are.equal(3, #h.devices)
    local j = events_of(h, "join")
    assert.are.equal(1, #j)
    assert.are.equal(3, j[1].device)
    assert.are.equal(1, j[1].requests, "the join was admitted while the request ran")
    assert.is_true(j[1].step > 0 and j[1].replan_ms > 0)
    assert.is_truthy(j[1].endpoint:match("^tcp://127%.0%.0%.1:%d+$"))
    -- the next request runs on all three: the same text, and device 3 computes
    local t2 = stream(cl, url, model, 2, 40)
    cl:wait(60000)
    assert.are.equal(reference(2, 40), table.concat(t2.pieces))
    local metrics = cl:get(base .. "/metrics")
    cl:wait(30000)
    assert.is_true(tonumber(metrics.body:match('\nloip_device_compute_ms_total{device="3"} ([%d.]+)')) > 0)
    -- the joined worker killed mid-request, a fresh one joins: the same text, three devices again
    local t3 = stream(cl, url, model, 3, 200)
    run_until(cl, "the first tokens", function() return t3.events >= 20 end)
    os.execute("kill -KILL " .. pid3)
    join(joins, st)
    cl:wait(120000)
    assert.are.equal(200, t3.status, t3.body)
    assert.are.equal(reference(3, 200), table.concat(t3.pieces))
    wait_until("the fresh worker's admission", function() return #get_json(cl, base .. "/health").devices == 3 end)
    h = get_json(cl, base .. "/health")
    local kinds = {}
    for _, e in ipairs(h.membership) do kinds[#kinds + 1] = e.kind end
    assert.are.same({ "join", "loss", "join" }, kinds)
    assert.are.equal(h.membership[1].endpoint, h.membership[2].endpoint, "the loss is the joined worker's")
    assert.are.equal(1, h.device_losses)
    -- the head's terminal tells every membership event /health lists, the loss mid-stream too
    local said = T.read(errlog)
    assert.matches("cluster: device 3 %(" .. h.membership[2].endpoint:gsub("%p", "%%%0") .. "%) lost %(device 3 .-%): 2 devices now", said)
    local logged = {}
    for verb in said:gmatch("cluster: device %d+ %([^)]+%) (%a+)") do logged[#logged + 1] = verb end
    assert.are.same({ "joined", "lost", "joined" }, logged)
    local t4 = stream(cl, url, model, 1, 30)
    cl:wait(60000)
    assert.are.equal(reference(1, 30), table.concat(t4.pieces))
    cl:close()
  end)

  it("drains a device (loip cluster drain) and lets a worker go on SIGTERM during bursts: no request fails, each exits; a wrong token is refused and logged", function()
    local st, model, url, errlog, joins = serve(3, "--api-key k")
    local base, auth = url:gsub("/v1$", ""), { Authorization = "Bearer k" }
    local cl = client.new()
    -- the drain endpoint is /v1's: the API key, and a device number named in `param`
    local d = cl:post(url .. "/cluster/drain", json.encode({ device = 2 }))
    local bad = cl:post(url .. "/cluster/drain", json.encode({ device = 7 }), auth)
    cl:wait(30000)
    assert.are.equal(401, d.status)
    assert.are.equal(400, bad.status)
    assert.are.equal("device", json.decode(bad.body).error.param)
    for _, how in ipairs({ "drain", "SIGTERM" }) do
      local h = get_json(cl, base .. "/health")
      local n = #h.devices
      local pid = h.devices[2].pid
      local burst = {}
      for k = 1, 5 do burst[k] = stream(cl, url, model, (k - 1) % 3 + 1, 60, auth) end
      run_until(cl, "the first tokens", function() return burst[1].events >= 10 end)
      if how == "drain" then
        local out = T.tmpdir() .. "/drain"
        assert.are.equal(0, os.execute(string.format("%s cluster drain 2 --url %s --api-key k > %s 2>&1", T.loip, url, out)),
          T.read_or_empty(out))
      else
        os.execute("kill -TERM " .. pid)
      end
      cl:wait(120000)
      for k, t in ipairs(burst) do
        assert.are.equal(200, t.status, t.body)
        assert.are.equal(reference((k - 1) % 3 + 1, 60), table.concat(t.pieces))
      end
      wait_until("device 2's worker to exit", function() return not alive(pid) end)
      wait_until("the leave", function() return #get_json(cl, base .. "/health").devices == n - 1 end)
      h = get_json(cl, base .. "/health")
      local e = h.membership[#h.membership]
      assert.are.equal("leave", e.kind)
      assert.are.equal(how == "drain" and "drain" or "worker", e.by)
      assert.are.equal(2, e.device)
      assert.is_true(e.replan_ms > 0)
      assert.are.equal(0, h.device_losses)
    end
    -- loip cluster members: the devices and the events, as JSON
    local out = T.tmpdir() .. "/members"
    assert.are.equal(0, os.execute(string.format("%s cluster members --url %s --api-key k > %s", T.loip, url, out)))
    local m = json.decode(T.read(out))
    assert.are.equal(1, #m.devices)
    assert.are.same({ "leave", "leave" }, { m.membership[1].kind, m.membership[2].kind })
    -- a worker with another token: refused by the head's transport, logged by both
    local pid, wlog = join(joins, st, "not-the-token")
    wait_until("the refused worker to exit", function() return not alive(pid) end)
    assert.matches("refused our key: wrong cluster token", T.read_or_empty(wlog), 1, true)
    wait_until("the head's log of it", function() return T.read_or_empty(errlog):find("rejected a peer", 1, true) ~= nil end)
    -- a worker holding another slice store: refused by the head, naming it; the set stays
    local other = T.tmpdir() .. "/other"
    os.execute(string.format("cp -r %s %s && printf ' ' >> %s/manifest.json", st, other, other))
    local pid2, wlog2 = join(joins, other)
    wait_until("the other store's worker to exit", function() return not alive(pid2) end)
    assert.matches("refused us: device 2 %(tcp://[%d.:]+%) holds a different slice store", T.read_or_empty(wlog2))
    assert.matches("refused the join of", T.read_or_empty(errlog), 1, true)
    assert.are.equal(1, #get_json(cl, base .. "/health").devices)
    local t = stream(cl, url, model, 2, 20, auth)
    cl:wait(60000)
    assert.are.equal(reference(2, 20), table.concat(t.pieces))
    cl:close()
  end)
end)
