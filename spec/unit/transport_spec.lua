-- loip.transport: CURVE authentication from a token or a key file, refusals logged, framed
-- messages checked field by field with the socket staying usable, link emulation (never
-- faster than the emulated wire), per-peer statistics.
local ffi = require "ffi"
local core = require "loip.core"
local transport = require "loip.runtime.transport"
local T = require "spec.support"

-- libzmq's own CURVE test vector (a secret key and the public key it gives).
local SECRET = "D:)Q[IlAW!ahhC2ac:9*A}h:p?([4%wOTJ%JR%cs"

local function pair(opts_a, opts_b)
  local a = assert(transport.net(opts_a))
  local srv = assert(a:bind("tcp://127.0.0.1:*"))
  local b = opts_b and assert(transport.net(opts_b)) or a
  local cli = assert(b:connect(srv:endpoint(), "peer"))
  return a, b, srv, cli
end

describe("loip.runtime.transport", function()
  after_each(function() collectgarbage() collectgarbage() end)

  it("needs a token or a key", function()
    local n, err = transport.net {}
    assert.is_nil(n)
    assert.matches("a cluster token or a keys directory is required", err)
    local dir = T.tmpdir()
    T.write(dir .. "/secret.key", "not a key\n")
    n, err = transport.net { keys = dir }
    assert.is_nil(n)
    assert.matches(dir .. "/secret.key: not a CURVE key", err, 1, true)
  end)

  it("carries messages between peers holding the same token or key file, both ways", function()
    local dir = T.tmpdir()
    T.write(dir .. "/secret.key", SECRET .. "\n")
    for _, opts in ipairs({ { token = "t0k3n" }, { keys = dir } }) do
      local a, b, srv, cli = pair(opts, opts)
      assert(cli:send { kind = "HELLO", payload = "hi" })
      local m = assert(srv:recv(3000))
      assert.are.equal("HELLO", m.kind)
      assert.are.equal("peer", m.from)
      assert.are.equal("hi", m.payload)
      assert(srv:send { kind = "PONG", to = "peer", payload = "back" })
      assert.are.equal("back", assert(cli:recv(3000)).payload)
      b:close()
      a:close()
    end
  end)

  it("refuses a peer with another token and logs it", function()
    local a, b, srv, cli = pair({ token = "right" }, { token = "wrong" })
    cli:send({ kind = "HELLO" }, 200)
    local m, err = srv:recv(700)
    assert.is_nil(m)
    assert.are.equal("timeout", err)
    local log = table.concat(a:auth_log(), "\n")
    assert.matches("rejected a peer", log)
    assert.matches("CURVE handshake failed", log)
    b:close()
    a:close()
  end)

  it("refuses malformed messages and keeps the socket in step", function()
    local a, _, srv, cli = pair({ token = "x" })
    local f = ffi.string(ffi.new("float[8]"), 32)
    local cases = {
      { { kind = "HIDDEN", n_tokens = 2, dim = 4, dtype = 0, payload = f:sub(1, 24) }, "payload of 24 bytes but n_tokens 2 x dim 4" },
      { { kind = "HIDDEN", n_tokens = 2, dim = 4, dtype = 3, payload = f }, "dtype 3 not allowed for kind 7" },
      { { kind = "TOKENS", n_tokens = 8, dim = 1, dtype = 0, payload = f }, "dtype 0 not allowed for kind 6" },
      { { kind = "HIDDEN", n_tokens = 0, dim = 4, dtype = 0 }, "n_tokens 0" },
      { { kind = 99, payload = "x" }, "unknown kind 99" },
    }
    for _, c in ipairs(cases) do
      assert(cli:send(c[1]))
      local m, err = srv:recv(3000)
      assert.is_nil(m, c[2])
      assert.matches(c[2], err, 1, true)
      -- the next good message arrives whole
      assert(cli:send { kind = "HIDDEN", n_tokens = 2, dim = 4, dtype = 0, payload = f })
      local ok = assert(srv:recv(3000))
      assert.are.equal("HIDDEN", ok.kind)
      assert.are.equal(32, #ok.payload)
    end
    -- a payload larger than the receiver accepts
    assert(cli:send { kind = "STATS", payload = string.rep("z", 5000) })
    local m, err = srv:recv(3000, 4096)
    assert.is_nil(m)
    assert.matches("payload of 5000 bytes exceeds 4096", err, 1, true)
    a:close()
  end)

  it("emulates a slower link: never faster than the wire and the delay, counted per peer", function()
    local a, _, srv, cli = pair({ token = "x" })
    srv:emulate { rate = "8mbit", delay_ms = 20 }
    local big = string.rep("b", 100000)
    local t0 = core.now_ms()
    for _ = 1, 3 do assert(cli:send { kind = "STATS", payload = big }) end
    for _ = 1, 3 do assert(srv:recv(5000, 200000)) end
    local took = core.now_ms() - t0
    -- 3 x (100000 + 64) bytes at 1 MB/s, then 20 ms
    assert.is_true(took >= 3 * 100064 / 1e6 * 1e3 + 20 - 1, "took " .. took .. " ms")
    local st = srv:stats()
    assert.are.equal(1, #st)
    assert.are.equal("peer", st[1].peer)
    assert.are.equal(3, st[1].messages)
    assert.are.equal(3 * 100064, st[1].bytes)
    assert.is_true(st[1].emulated_ms > 0)
    srv:emulate {}
    assert.has_error(function() srv:emulate { rate = "fast" } end)
    assert.are.equal(12.5e6, transport.parse_rate("100mbit"))
    assert.are.equal(125e6, transport.parse_rate("1gbit"))
    a:close()
  end)

  it("splits each hop into the transport's part, the emulated wire and delay, and the lateness", function()
    local a, _, srv, cli = pair({ token = "x" })
    srv:emulate { rate = "100mbit", delay_ms = 3 }
    local payload = string.rep("h", 8192)
    -- one message at a time: the wire is free when each arrives, so every hop is exactly
    -- transit + bytes / rate + delay + lateness
    for _ = 1, 8 do
      assert(cli:send { kind = "STATS", payload = payload })
      assert(srv:recv(5000, 65536))
    end
    local st = srv:stats()[1]
    local wire = (8192 + 64) / 12.5e6 * 1e3 + 3
    assert.are.equal(8, st.small_messages)
    assert.is_true(st.mean_latency_ms >= wire, st.mean_latency_ms .. " ms < " .. wire)
    assert.is_true(st.mean_transit_ms > 0 and st.mean_transit_ms < st.mean_latency_ms - wire + 1e-6)
    assert.is_true(st.mean_late_ms >= 0)
    assert.is_true(math.abs(st.mean_latency_ms - (st.mean_transit_ms + wire + st.mean_late_ms)) < 1e-3,
      string.format("%.4f vs %.4f + %.4f + %.4f", st.mean_latency_ms, st.mean_transit_ms, wire, st.mean_late_ms))
    a:close()
  end)

  it("holds the CPU wake-up latency (PM QoS) while asked, as root; says why not otherwise", function()
    local ok, err = core.wake_latency(0)
    if not ok then
      assert.matches("/dev/cpu_dma_latency", err)
      pending("not held here: " .. err)
      return
    end
    assert.are.equal(0, core.C.loip_cpu_wake_latency_held())
    assert(core.wake_latency(20))
    assert.are.equal(20, core.C.loip_cpu_wake_latency_held())
    assert(core.wake_latency(nil))
    assert.are.equal(-1, core.C.loip_cpu_wake_latency_held())
    assert.has_error(function() core.wake_latency(-1) end)
    assert.has_error(function() core.wake_latency(1.5) end)
  end)
end)
