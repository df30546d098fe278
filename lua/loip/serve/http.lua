-- The HTTP server's Lua side (runtime/http/server.c): requests come out of next(), each is
-- answered whole or streamed, then released.
--
--   local srv = http.start{ host = "127.0.0.1", port = 0, max_body = 4 * 2^20 }
--   local req = srv:next(100)                     -- nil after 100 ms without one
--   req:respond(200, "application/json", '{"ok":true}')
--   srv:close()
local ffi = require "ffi"
local core = require "loip.core"
local C = core.C

local M = {}

local Server, Request = {}, {}
Server.__index, Request.__index = Server, Request

-- opts: host (IPv4, default 127.0.0.1), port (0: any), max_body (bytes, default 4 MiB),
-- max_connections (256), timeout_s (an idle connection is closed after this; 30).
function M.start(opts)
  opts = opts or {}
  local out = ffi.new("loip_http *[1]")
  local rc = C.loip_http_start(opts.host or "127.0.0.1", opts.port or 0, opts.max_body or 4 * 1024 * 1024,
    opts.max_connections or 256, opts.timeout_s or 30, out)
  if rc ~= 0 then return nil, core.last_error() end
  local s = setmetatable({ handle = ffi.gc(out[0], C.loip_http_stop) }, Server)
  s.port = tonumber(C.loip_http_port(s.handle))
  return s
end

-- The next request within timeout_ms, or nil.
function Server:next(timeout_ms)
  local out = ffi.new("loip_http_req *[1]")
  if C.loip_http_next(self.handle, timeout_ms or 0, out) == 0 then return nil end
  local h = out[0]
  local len, big = ffi.new("uint64_t[1]"), ffi.new("int32_t[1]")
  local body = C.loip_http_body(h, len, big)
  return setmetatable({ handle = ffi.gc(h, C.loip_http_release), method = ffi.string(C.loip_http_method(h)),
    url = ffi.string(C.loip_http_url(h)), body = ffi.string(body, tonumber(len[0])), too_large = big[0] ~= 0 }, Request)
end

function Server:close()
  if self.handle then C.loip_http_stop(ffi.gc(self.handle, nil)) self.handle = nil end
end

function Request:header(name)
  local buf = ffi.new("char[4096]")
  if C.loip_http_header(self.handle, name, buf, 4096) == 0 then return nil end
  return ffi.string(buf)
end

function Request:cancelled() return self.handle ~= nil and C.loip_http_cancelled(self.handle) ~= 0 end

-- headers: a table of name = value (optional).
local function header_lines(headers)
  if not headers then return nil end
  local lines = {}
  for k, v in pairs(headers) do lines[#lines + 1] = k .. ": " .. tostring(v) end
  return table.concat(lines, "\n")
end

function Request:respond(status, content_type, body, headers)
  body = body or ""
  local rc = C.loip_http_respond(self.handle, status, content_type, header_lines(headers), body, #body)
  self:release()
  return rc == 0
end

function Request:stream_begin(status, content_type, headers)
  return C.loip_http_stream_begin(self.handle, status, content_type, header_lines(headers)) == 0
end

-- false when the client hung up.
function Request:write(data, last)
  return C.loip_http_stream_write(self.handle, data, #data, last and 1 or 0) == 0
end

function Request:finish(data)
  local ok = self:write(data or "", true)
  self:release()
  return ok
end

function Request:release()
  if self.handle then C.loip_http_release(ffi.gc(self.handle, nil)) self.handle = nil end
end

return M
