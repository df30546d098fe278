-- UDP broadcast beacons (runtime/transport/beacon.c, over CZMQ's zbeacon) and HMAC-SHA256 seen
-- from Lua. What a payload says is discovery's (loip.cluster.discovery), not this module's.
--
--   local b = beacon.new{ port = 7600, interface = "eth0" }   -- interface: nil = zbeacon's default
--   b:publish("LOIP1 ...", 1000)                              -- every second until silence/close
--   b:subscribe("LOIP")                                        -- then b:recv(500) -> addr, payload
local ffi = require "ffi"
local core = require "loip.core"
local C = core.C

local M = {}
M.MAX = tonumber(core.constants.BEACON_MAX) -- a payload's bytes at most (zbeacon's limit)

local Beacon = {}
Beacon.__index = Beacon

-- opts: port (UDP), interface (a name, "*" for all, nil for zbeacon's default).
-- Returns a beacon, or nil, err.
function M.new(opts)
  if type(opts) ~= "table" or type(opts.port) ~= "number" then error("beacon.new: opts.port (a number) is required", 2) end
  local h, err = core.new("loip_beacon *", C.loip_beacon_new, C.loip_beacon_free, opts.port, opts.interface)
  if not h then return nil, err end
  local host = ffi.new("char[64]")
  C.loip_beacon_host(h, host, 64)
  return setmetatable({ handle = h, host = ffi.string(host), port = opts.port,
    addr = ffi.new("char[64]"), buf = ffi.new("uint8_t[?]", M.MAX), len = ffi.new("int32_t[1]") }, Beacon)
end

-- Send payload now and every interval_ms (replacing what was published before).
function Beacon:publish(payload, interval_ms)
  if #payload > M.MAX then error(string.format("beacon: a payload of %d bytes (at most %d)", #payload, M.MAX), 2) end
  return core.ok(C.loip_beacon_publish(self.handle, payload, #payload, interval_ms or 1000), "beacon")
end

function Beacon:silence() return core.ok(C.loip_beacon_silence(self.handle), "beacon") end

-- Hear only payloads that start with prefix ("" for all).
function Beacon:subscribe(prefix)
  prefix = prefix or ""
  return core.ok(C.loip_beacon_subscribe(self.handle, prefix, #prefix), "beacon")
end

-- One beacon heard within timeout_ms: sender address, payload; nil, "timeout" when none.
function Beacon:recv(timeout_ms)
  local rc = C.loip_beacon_recv(self.handle, timeout_ms or 0, self.addr, 64, self.buf, self.len)
  if rc == 0 then return nil, "timeout" end
  if rc < 0 then return nil, core.failure(rc) end
  return ffi.string(self.addr), ffi.string(self.buf, self.len[0])
end

function Beacon:close()
  core.free(self.handle, C.loip_beacon_free)
  self.handle = nil
end

-- HMAC-SHA256 of msg under key (strings): the raw 32 bytes.
function M.hmac_sha256(key, msg)
  local mac = ffi.new("uint8_t[32]")
  core.check(C.loip_hmac_sha256(key, #key, msg, #msg, mac), "hmac_sha256")
  return ffi.string(mac, 32)
end

return M
