-- A fleet in the network testbed (real sockets, tbf-shaped 100 Mbit/s links; issue 29's
-- acceptance): `loip serve --hosts` over 3 workers started with empty caches ships each device
-- its blocks and serves the single device's text; a worker killed (-9) mid-request is replaced by
-- a fresh one with an empty cache that joins (its blocks shipped before the plan that has it
-- takes effect): the request completes with the single device's text and the next request runs
-- on all three; a drained worker leaves without a failed request.
local loip = require "loip"
local json = require "loip.text.json"
local client = require "loip.runtime.http_client"
local core = require "loip.core"
local T = require "spec.support"

teardown(function() T.cleanup() T.drop_stores() end)
after_each(T.stop_servers)

local S260 = T.root .. "/models/stories260K"
local PROMPT = { 1, 403, 407, 261, 31 }
local TOKEN = "fleet-spec-token"

local function reference(n)
  local m = loip.model.open(S260, { context = 256, threads = 1 })
  local it = m:generate(PROMPT, { max_tokens = n, temperature = 0, stop = {} })
  local parts = {}
  for _, piece in it do parts[#parts + 1] = piece end
  m:close()
  return table.concat(parts)
end

local function stream(cl, url, model, n)
  return T.stream_completion(cl, url, { model = model, prompt = PROMPT, max_tokens = n, temperature = 0, ignore_eos = true })
end

local function get_json(cl, url)
  local t = cl:get(url)
  cl:wait(30000)
  return json.decode(t.body)
end

describe("a fleet in the testbed", function()
  it("#net ships to empty caches, replaces a killed worker by a fresh one that joins, and drains one: the single device's text", function()
    local testbed = require "loip.cluster.testbed"
    local why = testbed.skip_reason()
    if why then pending("testbed skipped: " .. why) return end
    testbed.state_file = T.tmpdir() .. "/state.json"
    local st = T.slice_store(S260, "s260")
    local model = st:match("([^/]+)$")
    local ref = reference(120)
    local fresh
    local ok, err = pcall(function()
      local state = testbed.up { n = 3, rate = "100mbit", cache = T.tmpdir(), threads = 1, token = TOKEN, exe = T.loip }
      local url, _, errlog = T.serve(string.format("--model %s --hosts %s --threads 1 --context 256 --max-batch 2 --token %s "
        .. "--join-listen %s.1:0", st, table.concat(state.hosts, ","), TOKEN, testbed.SUBNET), { verbose = true })
      local joins = T.read_or_empty(errlog:gsub("err$", "out")):match("joins tcp://(%S+)")
      assert.is_truthy(joins, "the join address is printed")
      local base = url:gsub("/v1$", "")
      local cl = client.new()
      local h = get_json(cl, base .. "/health")
      local first = 0
      for _, d in ipairs(h.devices) do
        assert.is_true((d.shipped_bytes or 0) > 0, "device " .. d.device .. " got its blocks shipped")
        first = first + d.shipped_bytes
      end
      -- device 2's worker killed (-9) mid-request; a fresh one with an empty cache joins
      local t = stream(cl, url, model, 120)
      local deadline = core.now_ms() + 60000
      while t.events < 15 and core.now_ms() < deadline do cl:run(20) end
      assert.is_true(t.events >= 15, "the request runs")
      os.execute("kill -KILL " .. state.pids[2])
      local dir = T.tmpdir()
      fresh = tonumber(io.popen(string.format("ip netns exec %s-2 env LOIP_CLUSTER_TOKEN=%s %s worker --listen tcp://%s:%d "
        .. "--cache %s --threads 1 --join %s > /dev/null 2> %s/err & echo $!", testbed.PREFIX, TOKEN, T.loip,
        testbed.address(2), testbed.PORT + 1, dir .. "/cache", joins, dir)):read("*l"))
      cl:wait(180000)
      assert.are.equal(200, t.status, t.body)
      assert.are.equal(ref, table.concat(t.pieces), "the single device's text through the loss")
      deadline = core.now_ms() + 60000
      repeat
        h = get_json(cl, base .. "/health")
        if #h.devices == 3 then break end
        core.sleep_ms(100)
      until core.now_ms() > deadline
      assert.are.equal(3, #h.devices, "the fresh worker was admitted: " .. T.read_or_empty(dir .. "/err"))
      local kinds = {}
      for _, e in ipairs(h.membership) do kinds[#kinds + 1] = e.kind end
      assert.are.same({ "loss", "join" }, kinds)
      local joined
      for _, d in ipairs(h.devices) do if d.endpoint:find(":" .. (testbed.PORT + 1), 1, true) then joined = d end end
      assert.is_truthy(joined, "the fresh worker is a device")
      assert.is_true((joined.shipped_bytes or 0) > 0, "its empty cache was filled")
      -- the next request on all three; then one drained during a request: none fails
      local t2 = stream(cl, url, model, 40)
      cl:wait(120000)
      assert.are.equal(ref:sub(1, #table.concat(t2.pieces)), table.concat(t2.pieces))
      local m = cl:get(base .. "/metrics")
      cl:wait(30000)
      for i = 1, 3 do
        assert.is_true(tonumber(m.body:match('\nloip_device_compute_ms_total{device="' .. i .. '"} ([%d.]+)') or 0) > 0, "device " .. i)
      end
      local t3 = stream(cl, url, model, 120)
      deadline = core.now_ms() + 60000
      while t3.events < 15 and core.now_ms() < deadline do cl:run(20) end
      local rc, out, derr = T.run(string.format("%s cluster drain 1 --url %s", T.loip, url))
      assert.are.equal(0, rc, out .. derr)
      cl:wait(180000)
      assert.are.equal(200, t3.status, t3.body)
      assert.are.equal(ref, table.concat(t3.pieces), "the single device's text through the drain")
      h = get_json(cl, base .. "/health")
      assert.are.equal(2, #h.devices)
      assert.are.equal("leave", h.membership[#h.membership].kind)
      cl:close()
    end)
    T.stop_servers()
    if fresh then os.execute("kill -KILL " .. fresh .. " 2>/dev/null") end
    testbed.down()
    assert(ok, err)
  end)
end)
