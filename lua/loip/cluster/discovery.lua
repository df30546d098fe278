-- Discovery on a LAN: workers announce themselves with UDP broadcast beacons (CZMQ's zbeacon,
-- loip.runtime.beacon); a head (`serve --discover`) or `loip discover` listens. A beacon is one
-- line of text, at most 255 bytes:
--
--   LOIP1 port=7000 mem=629145600 disk=52428800000 threads=4 cpus=16 ts=1764670000 nonce=9f..e1 mac=<64 hex>
--
-- "LOIP" and the format's version, the worker's control port (its address is the beacon's UDP
-- source), its summary (memory budget in bytes, 0 for none; free disk of its store or cache;
-- threads; online CPUs), the time it was made (seconds since the epoch) and a random nonce, then
-- the proof: HMAC-SHA256 of everything before " mac=" under a key derived from the cluster's
-- secret (SHA-256 of a label and the token, as runtime/transport/auth.c derives the CURVE keys;
-- in keys mode, of another label and the secret.key file). A beacon never carries the secret or
-- anything it can be recovered from; one whose proof does not verify, or older than the window,
-- is ignored (logged once per sender). A verified beacon is a candidate, not a member:
-- admission still goes through the transport's authentication (`--join`'s path).
local beacon = require "loip.runtime.beacon"
local files = require "loip.runtime.files"
local core = require "loip.core"

local M = {}

M.VERSION = 1
M.PREFIX = "LOIP" .. M.VERSION .. " "
M.PORT = 7600          -- the UDP port beacons use unless --beacon-port says otherwise
M.INTERVAL_MS = 1000   -- how often a worker's beacon is sent
M.REFRESH_S = 10       -- how often its timestamp and nonce are renewed (a new proof)
M.WINDOW_S = 60        -- a beacon older (or further in the future) than this is stale
M.FIELDS = { "port", "mem", "disk", "threads", "cpus", "ts" } -- numbers, in this order

local function sha256_raw(s)
  local h = files.sha256()
  files.sha256_update(h, s)
  local _, raw = files.sha256_hex(h, true)
  files.sha256_free(h)
  return raw
end

local function hex(s) return (s:gsub(".", function(c) return string.format("%02x", c:byte()) end)) end

-- The proof's key from the cluster's secret: secret = { token = T } or { keys = DIR } (the
-- directory holding the CURVE secret.key every member shares). Raises when neither is usable.
function M.key(secret)
  if secret.token and secret.token ~= "" then return sha256_raw("loip beacon key v1\0" .. secret.token) end
  if secret.keys then
    local path = secret.keys .. "/secret.key"
    local f = io.open(path, "rb")
    if not f then error("discovery: cannot read " .. path .. " (the cluster's CURVE secret key)", 0) end
    local k = f:read("*a")
    f:close()
    return sha256_raw("loip beacon key (curve) v1\0" .. k:gsub("%s+$", ""))
  end
  error("discovery: a token or CURVE keys are needed to prove (or check) membership", 0)
end

local function random_nonce()
  local f = assert(io.open("/dev/urandom", "rb"))
  local b = f:read(8)
  f:close()
  return hex(b)
end

-- A beacon's payload: fields = { port, mem, disk, threads, cpus } (numbers), ts and nonce given
-- or now and random.
function M.encode(fields, key, ts, nonce)
  local parts = { "LOIP" .. M.VERSION }
  for _, name in ipairs(M.FIELDS) do
    local v = name == "ts" and (ts or os.time()) or fields[name] or 0
    if type(v) ~= "number" or v < 0 or v ~= math.floor(v) then
      error(string.format("discovery: field %s = %s is not a whole number >= 0", name, tostring(v)), 2)
    end
    parts[#parts + 1] = string.format("%s=%.0f", name, v)
  end
  nonce = nonce or random_nonce()
  if not nonce:match("^%x+$") then error("discovery: nonce must be hex digits", 2) end
  parts[#parts + 1] = "nonce=" .. nonce
  local body = table.concat(parts, " ")
  local payload = body .. " mac=" .. hex(beacon.hmac_sha256(key, body))
  if #payload > beacon.MAX then error(string.format("discovery: a beacon of %d bytes (at most %d)", #payload, beacon.MAX), 2) end
  return payload
end

-- The fields of a payload (numbers, plus nonce, mac and body: what the mac covers), or nil, why.
function M.decode(payload)
  local version, rest = payload:match("^LOIP(%d+) (.*)$")
  if not version then return nil, "not a loip beacon" end
  if tonumber(version) ~= M.VERSION then return nil, "version " .. version .. " (this loip speaks " .. M.VERSION .. ")" end
  local body, mac = payload:match("^(.-) mac=(%x+)$")
  if not body or #mac ~= 64 then return nil, "malformed (no mac)" end
  local out = { mac = mac, body = body }
  local i = 0
  for name, value in rest:gmatch("(%w+)=(%w+)") do
    i = i + 1
    local want = M.FIELDS[i] or (i == #M.FIELDS + 1 and "nonce") or (i == #M.FIELDS + 2 and "mac")
    if name ~= want then return nil, "malformed (field " .. name .. " where " .. tostring(want) .. " belongs)" end
    out[name] = name == "nonce" and value or name == "mac" and value or tonumber(value)
    if out[name] == nil then return nil, "malformed (" .. name .. ")" end
  end
  if i ~= #M.FIELDS + 2 then return nil, "malformed (" .. i .. " fields)" end
  if out.port < 1 or out.port > 65535 then return nil, "malformed (port " .. out.port .. ")" end
  return out
end

-- Constant time: a mismatch's position does not change how long the comparison takes.
local function same(a, b)
  if #a ~= #b then return false end
  local diff = 0
  for i = 1, #a do diff = bit.bor(diff, bit.bxor(a:byte(i), b:byte(i))) end
  return diff == 0
end

-- The fields of a payload whose proof verifies under key and whose timestamp is within
-- window_s of now; else nil, why ("wrong proof", "stale timestamp (N s old)", "malformed ...").
function M.verify(payload, key, now, window_s)
  local f, why = M.decode(payload)
  if not f then return nil, why end
  if not same(hex(beacon.hmac_sha256(key, f.body)), f.mac:lower()) then return nil, "wrong proof" end
  local age = (now or os.time()) - f.ts
  if math.abs(age) > (window_s or M.WINDOW_S) then return nil, string.format("stale timestamp (%d s old)", age) end
  return f
end

-- The key and a beacon on opts' port and interface (both sides), or nil, err.
local function open(opts)
  local key = M.key(opts.secret)
  local b, err = beacon.new { port = opts.beacon_port or M.PORT, interface = opts.interface }
  return b and key, b or err
end

-- ---- a worker's announcer

local Announcer = {}
Announcer.__index = Announcer

-- opts: secret ({ token } or { keys }), port (the worker's control port), summary ({ mem, disk,
-- threads, cpus }), beacon_port, interface, interval_ms, refresh_s. Raises on misuse; nil, err
-- when the beacon cannot start.
function M.announcer(opts)
  local key, b = open(opts)
  if not key then return nil, b end
  local a = setmetatable({ key = key, beacon = b, port = opts.port, summary = opts.summary or {},
    interval_ms = opts.interval_ms or M.INTERVAL_MS, refresh_s = opts.refresh_s or M.REFRESH_S, at = nil }, Announcer)
  a:tick()
  return a
end

-- Renews the beacon (a new timestamp, nonce and proof) when refresh_s has passed; cheap
-- otherwise: call it from the worker's loop.
function Announcer:tick(now)
  now = now or os.time()
  if self.at and now - self.at < self.refresh_s then return end
  local s = self.summary
  self.payload = M.encode({ port = self.port, mem = s.mem, disk = s.disk, threads = s.threads, cpus = s.cpus }, self.key, now)
  self.at = now
  assert(self.beacon:publish(self.payload, self.interval_ms))
end

function Announcer:close()
  if self.beacon then self.beacon:silence() self.beacon:close() self.beacon = nil end
end

-- ---- a listener (serve --discover, loip discover)

local Listener = {}
Listener.__index = Listener

-- opts: secret, beacon_port, interface, window_s, on_found(candidate) (called once per new
-- worker), log(line) (default: stderr). A candidate: { address, port, endpoint ("A:P"), mem,
-- disk, threads, cpus, ts, seen (os.time()) }.
function M.listener(opts)
  local key, b = open(opts)
  if not key then return nil, b end
  assert(b:subscribe("LOIP"))
  return setmetatable({ key = key, beacon = b, window_s = opts.window_s or M.WINDOW_S, on_found = opts.on_found,
    log = opts.log or function(line) io.stderr:write(os.date("%H:%M:%S "), line, "\n") io.stderr:flush() end,
    found = {}, order = {}, refused = {} }, Listener)
end

-- Handles one heard beacon (address, payload): a new candidate, a known one seen again, or a
-- refusal logged once per sender and reason.
function Listener:hear(addr, payload, now)
  local f, why = M.verify(payload, self.key, now, self.window_s)
  if not f then
    local reason = why:match("^stale") and "stale timestamp" or why
    local k = addr .. "\0" .. reason
    if not self.refused[k] then
      self.refused[k] = true
      self.log(string.format("beacon from %s: %s, ignored", addr, why))
    end
    return nil, why
  end
  local endpoint = addr .. ":" .. f.port
  local c = self.found[endpoint]
  if c then
    c.seen, c.mem, c.disk, c.threads, c.cpus, c.ts = now or os.time(), f.mem, f.disk, f.threads, f.cpus, f.ts
    return c
  end
  c = { address = addr, port = f.port, endpoint = endpoint, mem = f.mem, disk = f.disk, threads = f.threads,
    cpus = f.cpus, ts = f.ts, seen = now or os.time() }
  self.found[endpoint] = c
  self.order[#self.order + 1] = endpoint
  if self.on_found then self.on_found(c) end
  return c
end

-- Hears beacons for up to timeout_ms (0: only those already received).
function Listener:poll(timeout_ms)
  local deadline = core.now_ms() + (timeout_ms or 0)
  while true do
    local addr, payload = self.beacon:recv(math.max(0, deadline - core.now_ms()))
    if not addr then
      if payload ~= "timeout" then self.log("beacon: " .. tostring(payload)) end
      return
    end
    self:hear(addr, payload)
  end
end

-- The candidates heard so far, in the order they were first heard.
function Listener:candidates()
  local out = {}
  for i, e in ipairs(self.order) do out[i] = self.found[e] end
  return out
end

function Listener:close()
  if self.beacon then self.beacon:close() self.beacon = nil end
end

return M
