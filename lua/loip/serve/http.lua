-- The HTTP server's Lua side (runtime/http/server.c): requests come out of next(), each is
-- answered whole or streamed, then released.
--
--   local srv = http.start{ host = "127.0.0.1", port = 0, max_body = 4 * 2^20 }
--   local req = srv:next(100)                     -- nil after 100 ms without one
--   req:respond(200, "application/json", '{"ok":true}')
--   srv:close()
local rt = require "loip.runtime.http"

local M = {}

local Server, Request = {}, {}
Server.__index, Request.__index = Server, Request

-- opts: host (IPv4, default 127.0.0.1), port (0: any), max_body (bytes, default 4 MiB),
-- max_connections (256), timeout_s (an idle connection is closed after this; 30).
function M.start(opts)
  opts = opts or {}
  local h, err = rt.start(opts.host or "127.0.0.1", opts.port or 0, opts.max_body or 4 * 1024 * 1024,
    opts.max_connections or 256, opts.timeout_s or 30)
  if not h then return nil, err end
  local s = setmetatable({ handle = h }, Server)
  s.port = rt.port(h)
  return s
end

-- The next request within timeout_ms, or nil.
function Server:next(timeout_ms)
  local h = rt.next(self.handle, timeout_ms or 0)
  if not h then return nil end
  local body, too_large = rt.body(h)
  return setmetatable({ handle = h, method = rt.method(h), url = rt.url(h), body = body, too_large = too_large }, Request)
end

function Server:close()
  if self.handle then rt.stop(self.handle) self.handle = nil end
end

function Request:header(name)
  return rt.header(self.handle, name)
end

function Request:cancelled() return self.handle ~= nil and rt.cancelled(self.handle) end

-- headers: a table of name = value (optional).
local function header_lines(headers)
  if not headers then return nil end
  local lines = {}
  for k, v in pairs(headers) do lines[#lines + 1] = k .. ": " .. tostring(v) end
  return table.concat(lines, "\n")
end

function Request:respond(status, content_type, body, headers)
  body = body or ""
  local ok = rt.respond(self.handle, status, content_type, header_lines(headers), body)
  self:release()
  return ok == true
end

function Request:stream_begin(status, content_type, headers)
  return rt.stream_begin(self.handle, status, content_type, header_lines(headers)) == true
end

-- false when the client hung up.
function Request:write(data, last)
  return rt.stream_write(self.handle, data, last) == true
end

-- The bytes written and not yet taken by the client (0 once released).
function Request:pending()
  return self.handle and rt.stream_pending(self.handle) or 0
end

function Request:finish(data)
  local ok = self:write(data or "", true)
  self:release()
  return ok
end

function Request:release()
  if self.handle then rt.release(self.handle) self.handle = nil end
end

return M
