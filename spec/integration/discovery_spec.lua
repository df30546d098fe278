-- Discovery on a LAN in the network testbed (#net, root): 3 workers announce themselves
-- (loip worker --announce, zbeacon's UDP broadcast over the namespaces' bridge); `loip discover`
-- and `loip serve --discover` in the root namespace find exactly those three with their
-- summaries; a cluster serving with --discover admits the announced workers as workers that
-- join and serves one device's text on them; a 4th announcer proving another token is ignored
-- and logged once, never admitted; no beacon carries the token. Skipped, with the reason, where the testbed cannot run or one is up.
local json = require "loip.text.json"
local testbed = require "loip.cluster.testbed"
local beacon = require "loip.runtime.beacon"
local core = require "loip.core"
local T = require "spec.support"
teardown(function() T.cleanup() T.drop_stores() end)
after_each(T.stop_servers)

local S260 = T.root .. "/models/stories260K"
local TOKEN, OTHER = "discovery-spec-token", "another-cluster-token"
local PORT = 7631 -- (the beacons' UDP port: not the default, so that nothing else on the LAN is heard)
local MEM = { 629145600, 524288000, 419430400 }

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function count(s, plain)
  local n, at = 0, 1
  while true do
    local i = s:find(plain, at, true)
    if not i then return n end
    n, at = n + 1, i + 1
  end
end

describe("discovery in the network testbed #net", function()
  it("finds exactly the three announced workers, ignores a wrong proof, never carries the token", function()
    local why = testbed.unavailable()
    if why then pending("testbed skipped: " .. why) return end
    if os.execute("ip link show " .. testbed.BRIDGE .. " >/dev/null 2>&1") == 0 then
      pending("testbed skipped: one is up already (" .. testbed.BRIDGE .. " exists)")
      return
    end
    local dir = T.tmpdir()
    testbed.state_file = dir .. "/state.json"
    local st = T.slice_store(S260, "s260")
    local fourth
    local ok, err = pcall(function()
      testbed.up { n = 3, rate = "100mbit", store = st, threads = 1, token = TOKEN, exe = T.loip, mem = MEM,
        announce = true, beacon_port = PORT }
      -- a 4th announcer beside worker 1, holding another cluster's token
      fourth = tonumber(io.popen(string.format("ip netns exec %s-1 %s worker --listen tcp://%s:7001 --store %s "
        .. "--token %s --announce --beacon-port %d > /dev/null 2> %s/fourth.log & echo $!", testbed.PREFIX, q(T.loip),
        testbed.address(1), q(st), OTHER, PORT, dir)):read("*l"))

      -- the beacons themselves, as anyone on the LAN hears them: versioned, no token in them
      local b = assert(beacon.new { port = PORT, interface = testbed.BRIDGE })
      assert(b:subscribe(""))
      local heard, from = {}, {}
      local deadline = core.now_ms() + 15000
      while core.now_ms() < deadline and #heard < 24 do
        local addr, payload = b:recv(500)
        if addr then heard[#heard + 1] = payload from[addr] = true end
      end
      b:close()
      assert.is_true(#heard >= 4, #heard .. " beacons heard")
      for i = 1, 3 do assert.is_true(from[testbed.address(i)], testbed.address(i)) end
      for _, p in ipairs(heard) do
        assert.truthy(p:match("^LOIP1 port=%d+ "), p)
        assert.is_nil(p:find(TOKEN, 1, true))
        assert.is_nil(p:find(OTHER, 1, true))
      end

      -- loip discover: exactly the three, with their summaries; the 4th logged once
      local rc, out, errs = T.run(string.format("LOIP_CLUSTER_TOKEN=%s %s discover --seconds 4 --json --beacon-interface %s "
        .. "--beacon-port %d", TOKEN, q(T.loip), testbed.BRIDGE, PORT))
      assert.are.equal(0, rc, errs)
      local found = assert(json.decode(out), out)
      table.sort(found, function(a, c) return a.endpoint < c.endpoint end)
      assert.are.equal(3, #found, out)
      for i, c in ipairs(found) do
        assert.are.equal(string.format("%s:%d", testbed.address(i), testbed.PORT), c.endpoint)
        assert.are.equal(MEM[i], c.mem)
        assert.are.equal(1, c.threads)
        assert.is_true(c.disk > 0 and c.cpus >= 1)
      end
      assert.are.equal(1, count(errs, "beacon from " .. testbed.address(1) .. ": wrong proof, ignored"), errs)

      -- loip serve --discover (one device here; admission is --join's): logged and in /health
      local url, stop, log = T.serve(string.format("--model %s --threads 1 --token %s --discover --beacon-interface %s "
        .. "--beacon-port %d", st, TOKEN, testbed.BRIDGE, PORT))
      -- (until the three are listed and the 4th's beacon, sent every second, was heard too)
      local health
      local wrong = "beacon from " .. testbed.address(1) .. ": wrong proof, ignored"
      for _ = 1, 600 do -- (a minute at least: a busy machine hears them late, not never)
        local _, body = T.run("curl -s " .. url:gsub("/v1$", "") .. "/health")
        health = json.decode(body)
        if health and health.discovered and #health.discovered >= 3 and count(T.read(log), wrong) > 0 then break end
        core.sleep_ms(100)
      end
      local eps = {}
      for _, c in ipairs(health.discovered or {}) do eps[#eps + 1] = c.endpoint end
      table.sort(eps)
      assert.are.same({ testbed.address(1) .. ":7000", testbed.address(2) .. ":7000", testbed.address(3) .. ":7000" }, eps)
      stop()
      local text = T.read(log)
      assert.matches("found worker at " .. testbed.address(2):gsub("%.", "%%.") .. ":7000 %(mem 500%.0 MiB, disk ", text)
      assert.are.equal(1, count(text, wrong), text)

      -- a cluster serving on worker 1 with --discover admits the two others between steps (as
      -- workers that join), never the 4th; a request then runs on all three: one device's text
      local url2, stop2, log2 = T.serve(string.format("--model %s --hosts %s --threads 1 --context 256 --token %s --discover "
        .. "--beacon-interface %s --beacon-port %d", st, testbed.address(1) .. ":7000", TOKEN, testbed.BRIDGE, PORT),
        { verbose = true })
      local h2
      for _ = 1, 600 do -- (a minute at least)
        local _, body = T.run("curl -s " .. url2:gsub("/v1$", "") .. "/health")
        h2 = json.decode(body)
        if h2 and h2.devices and #h2.devices >= 3 then break end
        core.sleep_ms(100)
      end
      assert.are.equal(3, #h2.devices, T.read(log2))
      local joined = {}
      for _, e in ipairs(h2.membership) do if e.kind == "join" then joined[#joined + 1] = e.endpoint end end
      table.sort(joined)
      assert.are.same({ "tcp://" .. testbed.address(2) .. ":7000", "tcp://" .. testbed.address(3) .. ":7000" }, joined,
        "the two others admitted, never the 4th (another token)")
      local m = require("loip").model.open(S260, { context = 256, threads = 1 })
      local it = m:generate({ 1, 403, 407, 261, 31 }, { max_tokens = 30, temperature = 0, stop = {} })
      local parts = {}
      for _, piece in it do parts[#parts + 1] = piece end
      m:close()
      local rc2, body2 = T.run(string.format("curl -s %s/completions -d %s", url2, q(json.encode({ model = st:match("([^/]+)$"),
        prompt = { 1, 403, 407, 261, 31 }, max_tokens = 30, temperature = 0, ignore_eos = true }))))
      assert.are.equal(0, rc2)
      assert.are.equal(table.concat(parts), json.decode(body2).choices[1].text, body2)
      stop2()
    end)
    if fourth then os.execute("kill -TERM " .. fourth .. " 2>/dev/null") end
    testbed.down()
    if not ok then error(err, 0) end
  end)
end)
