-- The transport (runtime/transport): authenticated ZeroMQ sockets carrying framed messages.
-- Thin wrappers; the per-step traffic never goes through Lua (the device loop is in C).
--
--   local net = transport.net{ token = "secret" }
--   local srv = net:bind("tcp://127.0.0.1:0")        -- srv:endpoint() is the port chosen
--   local cli = net:connect(srv:endpoint(), "head")
--   cli:send{ kind = "HELLO" }                         -- or kind number, payload = string
--   local msg = srv:recv(1000)                         -- { kind=, from=, payload=, ... } or nil, err
--   srv:emulate{ rate = "100mbit", delay_ms = 2 }          -- spin_us: see M.emulate_spin_us
--   transport.stats(srv)                               -- per-peer bandwidth and latency
local ffi = require "ffi"
local core = require "loip.core"
local C = core.C

local M = {}

-- The weight of a new sample in each socket's moving averages of bandwidth and latency
-- (Sock:stats' bandwidth_Bps and latency_ms), applied to every socket Net:bind and Net:connect
-- make, at birth; Sock:smoothing changes one socket's. Lua's default, not a measurement: a
-- policy may change it (C alone uses 1, the last sample).
M.smoothing = 0.2

-- Sock:emulate's default spin_us: how long before an emulated delivery time the receiver stops
-- sleeping and spins, so that the timer's lateness does not add to every emulated hop. 300 us
-- came from measuring the timer lateness of the VM this project was developed on (spinning the
-- last 100 us left deliveries 47 us late on average, the last 300 us 6 us); it is that
-- machine's, not every machine's: a profile should measure it where it runs, and set this.
M.emulate_spin_us = 300

M.kinds = core.constants.msg -- LOIP_MSG_* by name
M.kind_name = {}
for k, v in pairs(M.kinds) do M.kind_name[v] = k end

-- Parses "100mbit", "1gbit", "500kbit", "12.5MB" (bytes) into bytes/s; nil when malformed.
function M.parse_rate(s)
  if type(s) == "number" then return s end
  local num, unit = tostring(s):lower():match("^(%d+%.?%d*)%s*(%a*)$")
  if not num then return nil end
  local bits = { bit = 1, kbit = 1e3, mbit = 1e6, gbit = 1e9, bps = 1 }
  local bytes = { b = 1, kb = 1e3, mb = 1e6, gb = 1e9 }
  if bits[unit] then return tonumber(num) * bits[unit] / 8 end
  if bytes[unit] then return tonumber(num) * bytes[unit] end
  if unit == "" then return tonumber(num) end
  return nil
end

local Net, Sock = {}, {}
Net.__index, Sock.__index = Net, Sock

-- opts: token (cluster secret) or keys (directory with the cluster's secret.key).
function M.net(opts)
  opts = opts or {}
  local h, err = core.new("loip_net *", C.loip_net_new, C.loip_net_free, opts.token, opts.keys)
  if not h then return nil, err end
  return setmetatable({ handle = h, socks = setmetatable({}, { __mode = "k" }) }, Net)
end

-- Refusals the authentication handler logged since the last call (a list of lines).
function Net:auth_log()
  local buf = ffi.new("char[16384]")
  C.loip_net_auth_log(self.handle, buf, 16384)
  local out = {}
  for line in ffi.string(buf):gmatch("[^\n]+") do out[#out + 1] = line end
  return out
end

-- Sockets first, then the context (zmq_ctx_term waits for every socket to close).
function Net:close()
  for s in pairs(self.socks) do s:close() end
  if self.handle ~= nil then core.free(self.handle, C.loip_net_free) self.handle = nil end
end

local function check_weight(w, level)
  if type(w) ~= "number" or not (w > 0 and w <= 1) then
    error("transport: smoothing weight " .. tostring(w) .. " is not a number in (0, 1]", level + 1)
  end
end

local function new_sock(net, h)
  local s = setmetatable({ handle = h, net = net, header = ffi.new("loip_msg_header"), from = ffi.new("char[64]"),
    cap = 0 }, Sock)
  net.socks[s] = true
  core.check(C.loip_sock_smoothing(h, M.smoothing))
  return s
end

function Net:bind(endpoint)
  check_weight(M.smoothing, 2)
  local h, err = core.new("loip_sock *", C.loip_sock_bind, C.loip_sock_free, self.handle, endpoint)
  if not h then return nil, err end
  return new_sock(self, h)
end

function Net:connect(endpoint, identity)
  check_weight(M.smoothing, 2)
  local h, err = core.new("loip_sock *", C.loip_sock_connect, C.loip_sock_free, self.handle, endpoint, identity)
  if not h then return nil, err end
  return new_sock(self, h)
end

function Sock:endpoint()
  local buf = ffi.new("char[256]")
  core.check(C.loip_sock_endpoint(self.handle, buf, 256))
  return ffi.string(buf)
end

-- msg: { kind (name or number), to (server sockets), payload (string or cdata + bytes),
-- plan_id, hop, step, n_tokens, pos, dtype, dim, status, flags }. true, or nil, err.
function Sock:send(msg, timeout_ms)
  local h = ffi.new("loip_msg_header")
  h.kind = type(msg.kind) == "string" and assert(M.kinds[msg.kind], "unknown kind " .. msg.kind) or msg.kind
  h.plan_id, h.hop, h.step = msg.plan_id or 0, msg.hop or -1, msg.step or 0
  h.n_tokens, h.pos, h.dim = msg.n_tokens or 0, msg.pos or 0, msg.dim or 0
  h.dtype = msg.dtype or -1
  h.status, h.flags = msg.status or 0, msg.flags or 0
  local payload = msg.payload
  local n = msg.bytes or (type(payload) == "string" and #payload) or 0
  h.payload_bytes = n
  return core.ok(C.loip_sock_send(self.handle, msg.to, h, payload, timeout_ms or 5000))
end

-- One message within timeout_ms: a table with the header's fields, kind as a name, from (the
-- sender on a server socket) and payload (a string); nil, err (err "timeout" on a timeout).
-- max_bytes (default 1 MiB): the largest payload accepted; the socket keeps a buffer that size.
function Sock:recv(timeout_ms, max_bytes)
  max_bytes = max_bytes or 1024 * 1024
  if self.cap < max_bytes then self.buf, self.cap = ffi.new("uint8_t[?]", max_bytes), max_bytes end
  local rc = C.loip_sock_recv(self.handle, timeout_ms or -1, self.header, self.buf, max_bytes, self.from)
  if rc == C.LOIP_ETIMEDOUT then return nil, "timeout" end
  if rc ~= 0 then return nil, core.failure(rc), rc end
  local h = self.header
  return { kind = M.kind_name[h.kind], kind_id = h.kind, from = ffi.string(self.from), plan_id = h.plan_id,
    hop = h.hop, step = tonumber(h.step), n_tokens = h.n_tokens, pos = h.pos, dtype = h.dtype, dim = h.dim,
    status = h.status, flags = h.flags, t_send_ns = tonumber(h.t_send_ns),
    payload = ffi.string(self.buf, tonumber(h.payload_bytes)) }
end

-- opts: rate ("100mbit", bytes/s as a number, or nil), delay_ms, spin_us (how long before each
-- delivery time the receiver spins rather than sleeps; default M.emulate_spin_us).
function Sock:emulate(opts)
  local rate = opts.rate and M.parse_rate(opts.rate)
  if opts.rate and not rate then error("emulate: rate '" .. tostring(opts.rate) .. "' is not a rate such as 100mbit", 2) end
  local spin = opts.spin_us or M.emulate_spin_us
  if type(spin) ~= "number" or spin < 0 or spin ~= spin then
    error("emulate: spin_us " .. tostring(spin) .. " is not a number of microseconds >= 0", 2)
  end
  core.check(C.loip_sock_emulate_spin(self.handle, math.floor(spin * 1e3)))
  core.check(C.loip_sock_emulate(self.handle, rate or 0, math.floor((opts.delay_ms or 0) * 1e6)))
end

-- The weight w in (0, 1] of a new sample in this socket's moving averages of bandwidth and
-- latency (1: the last sample); sockets start with M.smoothing.
function Sock:smoothing(w)
  check_weight(w, 2)
  core.check(C.loip_sock_smoothing(self.handle, w))
end

-- A client socket: connections the server dropped before the handshake succeeded (> 0: it
-- cannot read our key, so it holds another cluster token or key).
function Sock:refused() return self.handle ~= nil and C.loip_sock_refused(self.handle) or 0 end

function Sock:stats()
  local out = ffi.new("loip_link_stats[32]")
  local k = C.loip_sock_stats(self.handle, out, 32)
  local t = {}
  for i = 0, k - 1 do
    local s = out[i]
    t[#t + 1] = { peer = ffi.string(s.peer), messages = tonumber(s.messages), bytes = tonumber(s.bytes),
      emulated_ms = tonumber(s.emulated_ns) / 1e6, bandwidth_Bps = s.bw_bps, latency_ms = s.latency_ns / 1e6,
      mean_latency_ms = s.latency_count > 0 and tonumber(s.latency_sum_ns) / tonumber(s.latency_count) / 1e6 or nil,
      mean_transit_ms = s.latency_count > 0 and tonumber(s.transit_sum_ns) / tonumber(s.latency_count) / 1e6 or nil,
      mean_late_ms = s.latency_count > 0 and tonumber(s.late_sum_ns) / tonumber(s.latency_count) / 1e6 or nil,
      small_messages = tonumber(s.latency_count) }
  end
  return t
end
M.stats = function(sock) return sock:stats() end

function Sock:close()
  if self.handle ~= nil then core.free(self.handle, C.loip_sock_free) self.handle = nil end
  if self.net then self.net.socks[self] = nil end
end

-- ---- heartbeats: answered on their own thread and socket, even while a long stage computes
-- A heartbeat bound at endpoint on net (a loip_net *); nil, err.
function M.heartbeat_new(net, endpoint)
  return core.new("loip_heartbeat *", C.loip_heartbeat_new, C.loip_heartbeat_free, net, endpoint)
end
-- The endpoint it is bound to (a port chosen for "*").
function M.heartbeat_endpoint(hb)
  local buf = ffi.new("char[256]")
  C.loip_heartbeat_endpoint(hb, buf, 256)
  return ffi.string(buf)
end
-- When the last PING came (ms on core.now_ms's clock), nil when none came yet: a worker whose
-- head pings it no more knows the head is gone.
function M.heartbeat_last_ping(hb)
  local ns = tonumber(C.loip_heartbeat_last_ping(hb))
  return ns > 0 and ns / 1e6 or nil
end
function M.heartbeat_free(hb) core.free(hb, C.loip_heartbeat_free) end

return M
