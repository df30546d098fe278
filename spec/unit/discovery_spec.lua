-- loip.cluster.discovery: a beacon's payload (fields in order, versioned, at most 255 bytes),
-- its proof (HMAC-SHA256 under a key derived from the cluster's secret: any tampered field, a
-- wrong token, a stale timestamp fail), no trace of the secret in it; a listener's candidates
-- and its refusals logged once per sender; beacons heard over UDP (zbeacon, all interfaces).
local discovery = require "loip.cluster.discovery"
local beacon = require "loip.runtime.beacon"
local T = require "spec.support"

local S260 = T.root .. "/models/stories260K"
local TOKEN = "s3cret-token-of-the-cluster"
local SUMMARY = { port = 7000, mem = 629145600, disk = 52428800000, threads = 4, cpus = 16 }

describe("loip.cluster.discovery", function()
  after_each(function() T.cleanup() collectgarbage() collectgarbage() end)

  it("encodes a versioned one-line beacon that decodes to its fields", function()
    local key = discovery.key { token = TOKEN }
    local p = discovery.encode(SUMMARY, key, 1764670000, "0123456789abcdef")
    assert.truthy(p:match("^LOIP1 port=7000 mem=629145600 disk=52428800000 threads=4 cpus=16 ts=1764670000 nonce=0123456789abcdef mac=%x+$"), p)
    assert.is_true(#p <= beacon.MAX)
    local f = assert(discovery.decode(p))
    for k, v in pairs(SUMMARY) do assert.are.equal(v, f[k], k) end
    assert.are.equal(1764670000, f.ts)
    assert.truthy(discovery.verify(p, key, 1764670000 + 5))
    -- fresh nonces: two beacons of one second differ
    assert.are_not.equal(discovery.encode(SUMMARY, key, 1), discovery.encode(SUMMARY, key, 1))
    -- the largest figures still fit
    local big = discovery.encode({ port = 65535, mem = 2 ^ 50, disk = 2 ^ 50, threads = 1024, cpus = 1024 }, key)
    assert.is_true(#big <= beacon.MAX, #big)
  end)

  it("the proof is RFC 4231's HMAC-SHA256", function()
    local mac = beacon.hmac_sha256("Jefe", "what do ya want for nothing?")
    assert.are.equal("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
      (mac:gsub(".", function(c) return string.format("%02x", c:byte()) end)))
  end)

  it("refuses a tampered field, a wrong token, a stale or future timestamp, other versions", function()
    local key = discovery.key { token = TOKEN }
    local now = 1764670000
    local p = discovery.encode(SUMMARY, key, now, "00aa00aa00aa00aa")
    for _, t in ipairs({ { "port=7000", "port=7001" }, { "mem=629145600", "mem=929145600" },
                         { "disk=52428800000", "disk=52428800001" }, { "threads=4", "threads=8" },
                         { "cpus=16", "cpus=64" }, { "ts=1764670000", "ts=1764670001" },
                         { "nonce=00aa00aa00aa00aa", "nonce=00aa00aa00aa00ab" } }) do
      local bad = p:gsub(t[1], t[2], 1)
      assert.are_not.equal(p, bad)
      local ok, why = discovery.verify(bad, key, now)
      assert.is_nil(ok, t[2])
      assert.are.equal("wrong proof", why, t[2])
    end
    local flipped = p:sub(1, -2) .. (p:sub(-1) == "0" and "1" or "0")
    assert.are.equal("wrong proof", select(2, discovery.verify(flipped, key, now)))
    local ok, why = discovery.verify(p, discovery.key { token = "another token" }, now)
    assert.is_nil(ok)
    assert.are.equal("wrong proof", why)
    ok, why = discovery.verify(p, key, now + discovery.WINDOW_S + 1)
    assert.is_nil(ok)
    assert.truthy(why:match("^stale timestamp %(61 s old%)"), why)
    assert.is_nil((discovery.verify(p, key, now - discovery.WINDOW_S - 1)))
    assert.truthy(discovery.verify(p, key, now + discovery.WINDOW_S))
    assert.truthy(select(2, discovery.verify(p:gsub("^LOIP1", "LOIP2"), key, now)):match("^version 2"))
    assert.truthy(select(2, discovery.verify("hello", key, now)):match("not a loip beacon"))
    assert.truthy(select(2, discovery.verify(p:gsub(" threads=4", ""), key, now)):match("^malformed"))
  end)

  it("never carries the secret nor its key", function()
    local key = discovery.key { token = TOKEN }
    local hex = key:gsub(".", function(c) return string.format("%02x", c:byte()) end)
    for _ = 1, 20 do
      local p = discovery.encode(SUMMARY, key)
      assert.is_nil(p:find(TOKEN, 1, true))
      assert.is_nil(p:find(key, 1, true))
      assert.is_nil(p:find(hex, 1, true))
    end
    -- a token and a CURVE key file give different keys; neither mode works without its secret
    local dir = T.tmpdir()
    local f = assert(io.open(dir .. "/secret.key", "w"))
    f:write(TOKEN, "\n")
    f:close()
    assert.are_not.equal(key, discovery.key { keys = dir })
    assert.has_error(function() discovery.key {} end, "discovery: a token or CURVE keys are needed to prove (or check) membership")
    assert.has_error(function() discovery.key { keys = dir .. "/none" } end)
  end)

  it("a listener keeps verified candidates and logs a refusal once per sender", function()
    local lines, found = {}, {}
    local l = assert(discovery.listener { secret = { token = TOKEN }, beacon_port = 7613, interface = "*",
      log = function(s) lines[#lines + 1] = s end, on_found = function(c) found[#found + 1] = c end })
    local key = discovery.key { token = TOKEN }
    local now = os.time()
    assert.truthy(l:hear("10.0.0.5", discovery.encode(SUMMARY, key, now), now))
    assert.truthy(l:hear("10.0.0.5", discovery.encode(SUMMARY, key, now), now)) -- seen again: not found twice
    local other = discovery.key { token = "wrong" }
    for _ = 1, 3 do assert.is_nil(l:hear("10.0.0.9", discovery.encode(SUMMARY, other, now), now)) end
    assert.is_nil(l:hear("10.0.0.8", discovery.encode(SUMMARY, key, now - 3600), now))
    assert.are.equal(1, #found)
    assert.are.equal("10.0.0.5:7000", found[1].endpoint)
    assert.are.equal(629145600, found[1].mem)
    assert.are.same({ "beacon from 10.0.0.9: wrong proof, ignored",
      "beacon from 10.0.0.8: stale timestamp (3600 s old), ignored" }, lines)
    assert.are.equal(1, #l:candidates())
    l:close()
  end)

  it("loip discover and serve --discover need the cluster secret, naming the flags", function()
    local rc, _, err = T.run("env -u LOIP_CLUSTER_TOKEN " .. T.loip .. " discover --seconds 0.1")
    assert.are.equal(2, rc)
    assert.matches("discover: give the cluster secret beacons prove: --token, --curve-keys or LOIP_CLUSTER_TOKEN", err, 1, true)
    rc, _, err = T.run("env -u LOIP_CLUSTER_TOKEN " .. T.loip .. " discover --seconds 0")
    assert.are.equal(2, rc)
    assert.matches("--seconds", err, 1, true)
    rc, _, err = T.run("env -u LOIP_CLUSTER_TOKEN " .. T.loip .. " serve --model " .. S260
      .. " --threads 1 --port 0 --quiet --discover")
    assert.are.equal(2, rc)
    assert.matches("serve: --discover needs the cluster secret beacons prove: --token, --curve-keys or LOIP_CLUSTER_TOKEN", err, 1, true)
  end)

  it("hears an announcer over UDP broadcast", function()
    local found = {}
    local l = assert(discovery.listener { secret = { token = TOKEN }, beacon_port = 7614, interface = "*",
      on_found = function(c) found[#found + 1] = c end, log = function() end })
    local a = assert(discovery.announcer { secret = { token = TOKEN }, port = 7123, beacon_port = 7614,
      interface = "*", summary = SUMMARY, interval_ms = 100 })
    for _ = 1, 300 do -- (30 s at most: a busy machine hears it late, not never)
      l:poll(100)
      if #found > 0 then break end
    end
    a:close()
    l:close()
    assert.are.equal(1, #found)
    assert.are.equal(7123, found[1].port)
    assert.are.equal(16, found[1].cpus)
  end)
end)
