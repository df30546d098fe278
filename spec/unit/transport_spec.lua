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
  after_each(function() T.cleanup() collectgarbage() collectgarbage() end)

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
    -- two tokens of dim 4 and their two table entries
    local E = ffi.sizeof("loip_step_token")
    local f = ffi.string(ffi.new("uint8_t[?]", 2 * (16 + E)), 2 * (16 + E))
    local cases = {
      { { kind = "HIDDEN", n_tokens = 2, dim = 4, dtype = 0, payload = f:sub(1, 56) },
        "payload of 56 bytes but n_tokens 2 x (dim 4 x 4 + " .. E .. ")" },
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
      assert.are.equal(#f, #ok.payload)
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

  it("smooths bandwidth and latency with the weight Lua gives each socket; 1: the last sample", function()
    local a, _, srv, cli = pair({ token = "x" })
    -- two small messages: latency_ms is the weighted average of the two samples, whose sum is
    -- in mean_latency_ms x 2 and whose first is the first latency (taken as it is)
    local function two(w)
      if w then srv:smoothing(w) end
      local l = {}
      for i = 1, 2 do
        assert(cli:send { kind = "STATS", payload = "s" })
        assert(srv:recv(3000))
        local st = srv:stats()[1]
        l[i] = i == 1 and st.latency_ms or st.mean_latency_ms * st.small_messages - l[1] * (st.small_messages - 1)
        if i == 2 then return st, l end
      end
    end
    local st, l = two(nil) -- the module's default, given at birth
    assert.are.equal(0.2, transport.smoothing)
    assert.is_true(math.abs(st.latency_ms - (0.8 * l[1] + 0.2 * l[2])) < 1e-6,
      string.format("%.6f vs 0.8 x %.6f + 0.2 x %.6f", st.latency_ms, l[1], l[2]))
    a:close()
    a, _, srv, cli = pair({ token = "x" })
    st, l = two(1)
    assert.is_true(math.abs(st.latency_ms - l[2]) < 1e-6, st.latency_ms .. " vs the last " .. l[2])
    assert.has_error(function() srv:smoothing(0) end)
    assert.has_error(function() srv:smoothing(1.5) end)
    assert.has_error(function() srv:smoothing(0 / 0) end)
    local ffi_rc = core.C.loip_sock_smoothing(srv.handle, 2)
    assert.are.equal(core.C.LOIP_EINVAL, ffi_rc)
    local saved = transport.smoothing
    transport.smoothing = 0 -- a policy's mistake is refused at the next socket's birth
    local made = pcall(a.bind, a, "tcp://127.0.0.1:*")
    transport.smoothing = saved
    assert.is_false(made)
    a:close()
  end)

  it("spins the last spin_us of an emulated delivery (Lua's default from M.emulate_spin_us)", function()
    local a, _, srv, cli = pair({ token = "x" })
    assert.are.equal(300, transport.emulate_spin_us)
    for _, spin in ipairs { 0, 5000, nil } do
      srv:emulate { rate = "100mbit", delay_ms = 2, spin_us = spin }
      local t0 = core.now_ms()
      assert(cli:send { kind = "STATS", payload = "s" })
      assert(srv:recv(3000))
      assert.is_true(core.now_ms() - t0 >= 2, "never earlier than the delay")
    end
    assert.has_error(function() srv:emulate { spin_us = -1 } end)
    assert.has_error(function() srv:emulate { spin_us = "fast" } end)
    srv:emulate {}
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

  it("takes lent KV larger than the buffer in a buffer of its own, and times its wire from the send", function()
    local a, _, srv, cli = pair({ token = "t" })
    local big = string.rep("k", 3 * 1024 * 1024)
    local h = ffi.new("loip_msg_header")
    local small = ffi.new("uint8_t[?]", 4096)
    local from = ffi.new("char[64]")
    local large = ffi.new("void *[1]")
    -- any other kind that large is refused whole, and the socket stays in step
    assert(cli:send { kind = "TRACE", payload = big })
    assert.are_not.equal(0, core.C.loip_sock_recv_large(srv.handle, 3000, h, small, 4096, from, large))
    assert.matches("exceeds 4096", core.last_error(), 1, true)
    -- KV_PUT: in *large, the payload whole; emulated at 2.5 MB/s its 3 MiB take ~1260 ms from
    -- the send: taken 1500 ms later it is there (timed from the take, it would wait ~1260 ms
    -- more; the margin, ~1 s, is for a busy machine's copy of 3 MiB)
    srv:emulate { rate = 2.5 * 1000 * 1000 }
    assert(cli:send { kind = "KV_PUT", payload = big, hop = 2 })
    core.C.loip_sleep_ms(1500) -- the receiver busy meanwhile: the blob was on the wire already
    local t0 = core.now_ms()
    assert.are.equal(0, core.C.loip_sock_recv_large(srv.handle, 5000, h, small, 4096, from, large))
    assert.is_true(core.now_ms() - t0 < 1000, "waited " .. (core.now_ms() - t0) .. " ms for a blob sent 1500 ms ago")
    assert.are.equal(#big, tonumber(h.payload_bytes))
    assert.is_true(large[0] ~= nil)
    assert.are.equal(big, ffi.string(large[0], #big))
    pcall(ffi.cdef, "void free(void *);")
    ffi.C.free(large[0])
    -- small enough: in the caller's buffer, *large NULL
    assert(cli:send { kind = "KV_GET", hop = 2 })
    assert.are.equal(0, core.C.loip_sock_recv_large(srv.handle, 3000, h, small, 4096, from, large))
    assert.is_true(large[0] == nil)
    assert.are.equal(core.C.LOIP_MSG_KV_GET, h.kind)
    assert.is_not_nil(a)
  end)
end)
