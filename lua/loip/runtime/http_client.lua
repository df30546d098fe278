-- An HTTP client of many requests at once (runtime/http/client.c, libcurl's multi interface):
-- the load driver of recipes/bench/serve.lua, the specs' and `loip chat`'s client. Server-sent
-- events are split as they arrive, each with its arrival time.
--
--   local cl = client.new()
--   local t = cl:post(url .. "/completions", body, { ["Authorization"] = "Bearer k" })
--   t.on_event = function(t, data, at_ms) ... end        -- each "data: ..." of a stream
--   cl:wait()                                             -- until every transfer is done
--   print(t.status, t.body)                               -- the whole body (non-streamed)
--
-- A download sets t.on_data = function(t, bytes, at_ms) ... end: the bytes go there as they
-- arrive and are not kept (t.body is ""); t:response() tells its status and headers meanwhile.
-- Redirects are followed (runtime/http/client.c); status and headers are the last response's.
local ffi = require "ffi"
local core = require "loip.core"
local rt = require "loip.runtime.http"

local M = {}

local Client, Transfer = {}, {}
Client.__index, Transfer.__index = Client, Transfer

function M.new()
  local h, err = rt.fetch_new()
  if not h then error("http client: " .. err, 0) end
  return setmetatable({ handle = h, live = {}, buf = ffi.new("char[65536]"),
    hbuf = ffi.new("char[65536]"), when = ffi.new("uint64_t[1]") }, Client)
end

-- Start a request; headers: a table name = value. opts: timeout_ms, method.
function Client:request(method, url, body, headers, opts)
  local lines = {}
  for k, v in pairs(headers or {}) do lines[#lines + 1] = k .. ": " .. tostring(v) end
  local id, err = rt.fetch_add(self.handle, url, method, table.concat(lines, "\n"), body, opts and opts.timeout_ms or 0, url)
  if not id then error(err, 0) end
  local t = setmetatable({ client = self, id = id, url = url, parts = {}, pending = "", t_start = core.now_ms() }, Transfer)
  self.live[t] = true
  return t
end

function Client:post(url, body, headers, opts)
  headers = headers or {}
  if headers["Content-Type"] == nil then headers["Content-Type"] = "application/json" end
  return self:request("POST", url, body, headers, opts)
end
function Client:get(url, headers, opts) return self:request("GET", url, nil, headers, opts) end

-- Take what arrived for t: bytes into t.parts, events to t.on_event(t, data, at_ms).
function Transfer:drain()
  local c = self.client
  while true do
    local n = rt.fetch_take(c.handle, self.id, c.buf, 65536, c.when)
    if n <= 0 then break end
    local s = ffi.string(c.buf, n)
    local at = tonumber(c.when[0]) / 1e6
    if not self.t_first_byte then self.t_first_byte = at end
    if self.on_data then
      self.on_data(self, s, at)
    else
      self.parts[#self.parts + 1] = s
    end
    if self.on_event then
      self.pending = self.pending .. s
      while true do
        local i, j = self.pending:find("\r?\n\r?\n")
        if not i then break end
        local event = self.pending:sub(1, i - 1)
        self.pending = self.pending:sub(j + 1)
        local data = {}
        for line in event:gmatch("[^\r\n]+") do
          local d = line:match("^data: ?(.*)$")
          if d then data[#data + 1] = d end
        end
        if #data > 0 then self.on_event(self, table.concat(data, "\n"), at) end
      end
    end
  end
end

-- The status and headers (names in lower case) of the last response in raw header text: a
-- followed redirect's come first.
local function parse_head(raw)
  local status, headers = 0, {}
  for line in raw:gmatch("[^\r\n]+") do
    local code = line:match("^HTTP/%S+%s+(%d%d%d)")
    if code then
      status, headers = tonumber(code), {}
    else
      local name, value = line:match("^([%w%-]+):%s*(.-)%s*$")
      if name then headers[name:lower()] = value end
    end
  end
  return status, headers
end

-- While t runs: the status and headers of its response so far (0 and {} before any came).
function Transfer:response()
  local c = self.client
  if not c.live[self] then return self.status or 0, self.headers or {} end
  return parse_head(rt.fetch_headers(c.handle, self.id, c.hbuf, 65536))
end

-- Move every transfer along for up to timeout_ms; the transfers that finished now.
function Client:run(timeout_ms)
  rt.fetch_run(self.handle, timeout_ms or 10)
  local finished = {}
  local st, err = ffi.new("int32_t[1]"), ffi.new("char[512]")
  for t in pairs(self.live) do
    t:drain()
    local status, terr = rt.fetch_state(self.handle, t.id, st, err, 512)
    if status then
      t:drain()
      t.status, t.error = status, terr
      local _, headers = t:response()
      t.headers = headers
      if t.error == "" then t.error = nil end
      t.body, t.t_done = table.concat(t.parts), core.now_ms()
      self.live[t] = nil
      rt.fetch_close(self.handle, t.id)
      finished[#finished + 1] = t
      if t.on_done then t.on_done(t) end
    end
  end
  return finished
end

function Client:busy() return next(self.live) ~= nil end

-- Run until every transfer is done (or timeout_ms passes: an error).
function Client:wait(timeout_ms)
  local deadline = core.now_ms() + (timeout_ms or 600000)
  while self:busy() do
    self:run(20)
    if core.now_ms() > deadline then error("http client: transfers still running after " .. (timeout_ms or 600000) .. " ms", 2) end
  end
end

-- Hang up t (the server sees its client go).
function Transfer:close()
  local c = self.client
  if c.live[self] then
    c.live[self] = nil
    rt.fetch_close(c.handle, self.id)
    self.closed = true
  end
end

function Client:close()
  if self.handle then rt.fetch_free(self.handle) self.handle = nil end
end

return M
