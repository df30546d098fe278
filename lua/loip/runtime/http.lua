-- The HTTP server and client (runtime/http/server.c, client.c) seen from Lua: one thin function
-- per C call of loip.h; loip.serve.http and loip.runtime.http_client are the Lua side over them and
-- what the rest of Lua uses. Owning handles (a server, a request, a client) are cdata under
-- ffi.gc from birth; stop/release/fetch_free are the explicit, idempotent close. A runtime
-- failure returns nil, err (context, when given, first, as core.ok).
--
--   local http = require "loip.runtime.http"
--   local srv = assert(http.start("127.0.0.1", 0, 4 * 2^20, 256, 30))   -- http.port(srv)
--   local req = http.next(srv, 100)            -- nil after 100 ms without one
--   http.respond(req, 200, "application/json", nil, "{}") ; http.release(req)
local ffi = require "ffi"
local core = require "loip.core"
local C = core.C

local M = {}

-- ---- server
-- Listening at host:port (0: any), max_body bytes, max_connections, idle timeout_s; nil, err.
function M.start(host, port, max_body, max_connections, timeout_s)
  return core.new("loip_http *", C.loip_http_start, C.loip_http_stop, host, port, max_body, max_connections, timeout_s)
end
function M.port(s) return tonumber(C.loip_http_port(s)) end
function M.stop(s) core.free(s, C.loip_http_stop) end

local req_out = ffi.new("loip_http_req *[1]")
-- The next request within timeout_ms (owned: release it), or nil.
function M.next(s, timeout_ms)
  if C.loip_http_next(s, timeout_ms, req_out) == 0 then return nil end
  return ffi.gc(req_out[0], C.loip_http_release)
end
function M.method(r) return ffi.string(C.loip_http_method(r)) end
function M.url(r) return ffi.string(C.loip_http_url(r)) end
-- The body (a string) and whether it passed max_body (then it was dropped).
function M.body(r)
  local len, big = ffi.new("uint64_t[1]"), ffi.new("int32_t[1]")
  local body = C.loip_http_body(r, len, big)
  return ffi.string(body, tonumber(len[0])), big[0] ~= 0
end
-- A header's value, or nil when the request has none.
function M.header(r, name)
  local buf = ffi.new("char[4096]")
  if C.loip_http_header(r, name, buf, 4096) == 0 then return nil end
  return ffi.string(buf)
end
-- The client hung up (or the server stops).
function M.cancelled(r) return C.loip_http_cancelled(r) ~= 0 end
-- headers: "Name: value" lines or nil. true, or nil, err.
function M.respond(r, status, content_type, headers, body, context)
  return core.ok(C.loip_http_respond(r, status, content_type, headers, body, #body), context)
end
function M.stream_begin(r, status, content_type, headers, context)
  return core.ok(C.loip_http_stream_begin(r, status, content_type, headers), context)
end
-- nil, err when the client hung up.
function M.stream_write(r, data, last, context)
  return core.ok(C.loip_http_stream_write(r, data, #data, last and 1 or 0), context)
end
-- The bytes written to r's stream that its client has not taken yet.
function M.stream_pending(r) return tonumber(C.loip_http_stream_pending(r)) end
function M.release(r) core.free(r, C.loip_http_release) end

-- ---- client (libcurl's multi interface)
function M.fetch_new() return core.new("loip_fetch *", C.loip_fetch_new, C.loip_fetch_free) end
function M.fetch_free(f) core.free(f, C.loip_fetch_free) end
-- Start method url; headers: "Name: value" lines; body nil: none. The transfer's id, or nil, err.
function M.fetch_add(f, url, method, headers, body, timeout_ms, context)
  local id = ffi.new("int32_t[1]")
  local ok, err = core.ok(C.loip_fetch_add(f, url, method, headers, body, body and #body or 0, timeout_ms, id), context)
  if not ok then return nil, err end
  return id[0]
end
-- Every transfer moved along, waiting up to timeout_ms; how many still run.
function M.fetch_run(f, timeout_ms) return tonumber(C.loip_fetch_run(f, timeout_ms)) end
-- Up to cap bytes of id into buf (a char[cap]): how many, when they came into arrived[0].
function M.fetch_take(f, id, buf, cap, arrived) return tonumber(C.loip_fetch_take(f, id, buf, cap, arrived)) end
-- The response's header lines so far, into buf (a char[cap]), as a string.
function M.fetch_headers(f, id, buf, cap) return ffi.string(buf, tonumber(C.loip_fetch_headers(f, id, buf, cap))) end
-- When id is done: its HTTP status (0: none) and the transport's error ("" for none); nil before.
function M.fetch_state(f, id, status, err, cap)
  if C.loip_fetch_state(f, id, status, err, cap) ~= 1 then return nil end
  return status[0], ffi.string(err)
end
-- Drop id (hang up if it still runs).
function M.fetch_close(f, id) C.loip_fetch_close(f, id) end

return M
