-- The live dashboard of `loip serve` (docs/dashboard.md): the page at / (static files beside
-- this module, in dashboard/: no build step, nothing fetched from elsewhere), the snapshot
-- GET /v1/cluster (loip.serve.cluster_view) and the event stream GET /v1/cluster/events
-- (server-sent events: `plan` when a client connects and when the plan changes, `step` each
-- interval with the figures, `adaptation`, `loss`, `member` (a join, leave or loss), `request` as they happen).
--
-- An event stream never holds the serving loop: an event is appended to the client's buffer
-- (runtime/http/server.c sends it from the connection's thread); a client whose unsent bytes
-- pass MAX_PENDING is dropped (its stream ended), and its page connects again.
--
--   local dash = dashboard.new(srv)       -- srv: a loip.serve.server
--   dash:route(req, path, method)         -- true when it answered (/, /dashboard/*, /v1/cluster*)
--   dash:tick()                           -- once a turn: the events since the last one
--   dash:close()
local json = require "loip.text.json"
local core = require "loip.core"
local view = require "loip.serve.cluster_view"

local M = {}

M.MAX_PENDING = 256 * 1024  -- bytes a client may leave unsent before it is dropped
M.INTERVAL_MS = 500         -- a `step` event at most this often (a STATS round on a cluster)
M.IDLE_MS = 5000            -- and at least this often while nothing runs (a heartbeat)
M.MAX_CLIENTS = 16

local Dash = {}
Dash.__index = Dash

local here = package.searchpath("loip.serve.dashboard", package.path)
M.dir = here and here:gsub("%.lua$", "") or "dashboard"

local TYPES = { html = "text/html; charset=utf-8", js = "text/javascript; charset=utf-8", css = "text/css; charset=utf-8",
  png = "image/png", svg = "image/svg+xml" }

function M.new(srv)
  return setmetatable({ srv = srv, view = view.new(srv), clients = {}, seen = nil, dropped = 0 }, Dash)
end

-- A static file of the page: / is index.html, /dashboard/NAME a file of the folder (a plain
-- name: no folders, no dots first).
function Dash:static(req, name)
  local ext = name:match("^[%w_%-]+%.(%w+)$")
  local body = ext and TYPES[ext] and json.read_file(M.dir .. "/" .. name)
  if not body then
    return req:respond(404, "application/json", json.encode({ error = { message = "no file " .. name .. " in the dashboard",
      type = "invalid_request_error", code = "not_found" } }))
  end
  req:respond(200, TYPES[ext], body, { ["Cache-Control"] = "no-cache" })
end

function Dash:route(req, path, method)
  local is_page = path == "/" or path == "/index.html" or path:match("^/dashboard/")
  if not (is_page or path == "/v1/cluster" or path == "/v1/cluster/events") then return false end
  if method ~= "GET" then
    req:respond(405, "application/json", json.encode({ error = { message = string.format("%s %s: use GET", method, path),
      type = "invalid_request_error", code = "method_not_allowed" } }))
    return true
  end
  if is_page then
    self:static(req, path:match("^/dashboard/(.+)$") or "index.html")
  elseif path == "/v1/cluster" then
    req:respond(200, "application/json", json.encode(self.view:snapshot()), { ["Cache-Control"] = "no-cache" })
  else
    self:subscribe(req)
  end
  return true
end

local function event(kind, data) return "event: " .. kind .. "\ndata: " .. json.encode(data) .. "\n\n" end

-- The ring as a `plan` event: its devices and their stages.
function Dash:plan_event()
  local c = self.srv.opts.cluster
  return event("plan", { plan_id = c and c.plan_id or 1, devices = self.view:ring() })
end

function Dash:subscribe(req)
  if #self.clients >= M.MAX_CLIENTS then
    return req:respond(503, "application/json", json.encode({ error = { message = string.format(
      "%d dashboards are watching already (the most this server streams to)", M.MAX_CLIENTS), type = "server_error",
      code = "too_many_streams" } }), { ["Retry-After"] = 5 })
  end
  req:stream_begin(200, "text/event-stream", { ["Cache-Control"] = "no-cache" })
  table.insert(self.clients, req)
  if not self.seen then self:mark() end
  self:send(req, "retry: 1000\n\n" .. self:plan_event())
end

-- What the events so far covered: adaptations, losses, the plan, the requests in flight.
function Dash:mark()
  local c = self.srv.opts.cluster
  local reqs = {}
  for r in pairs(self.srv.active) do reqs[r] = true end
  self.seen = { adaptations = #self.srv.batcher.adaptations, losses = c and c.losses and #c.losses or 0,
    membership = c and c.membership and #c.membership or 0,
    plan_id = c and c.plan_id, requests = reqs, t_ms = 0 }
end

-- Append text to one client's stream; a client gone, or too slow, is dropped.
function Dash:send(req, text)
  if req:cancelled() or req:pending() + #text > M.MAX_PENDING then
    if req.handle and not req:cancelled() then req:finish("") else req:release() end
    self.dropped = self.dropped + 1
    return false
  end
  if not req:write(text) then req:release() return false end
  return true
end

function Dash:broadcast(text)
  local keep = {}
  for _, req in ipairs(self.clients) do
    if self:send(req, text) then keep[#keep + 1] = req end
  end
  self.clients = keep
end

-- The events since the last turn, to every client (nothing to do when none watches). A failure
-- here is logged and ends the streams: the dashboard never stops the serving.
function Dash:tick()
  if #self.clients == 0 then self.seen = nil return end
  local ok, err = pcall(self.events, self)
  if not ok then
    io.stderr:write(os.date("%H:%M:%S "), "dashboard: ", tostring(err), "; its event streams end\n")
    self:close()
  end
end

function Dash:events()
  local srv, seen = self.srv, self.seen
  local out = {}
  for _, a in ipairs(self.view:adaptations(seen.adaptations + 1)) do out[#out + 1] = event("adaptation", a) end
  seen.adaptations = #srv.batcher.adaptations
  for _, l in ipairs(self.view:losses(seen.losses + 1)) do out[#out + 1] = event("loss", l) end
  local c = srv.opts.cluster
  seen.losses = c and c.losses and #c.losses or 0
  for _, m in ipairs(self.view:membership(seen.membership + 1)) do out[#out + 1] = event("member", m) end
  seen.membership = c and c.membership and #c.membership or 0
  if c and c.plan_id ~= seen.plan_id then
    seen.plan_id = c.plan_id
    out[#out + 1] = self:plan_event()
  end
  -- requests: one event when it starts, one when it ends
  local now_reqs = {}
  for r, ch in pairs(srv.active) do
    now_reqs[r] = ch
    if not seen.requests[r] then
      out[#out + 1] = event("request", { id = ch.reply.id, choice = ch.index, state = "running", prompt_tokens = ch.reply.n_prompt })
    end
  end
  for r, v in pairs(seen.requests) do
    if not now_reqs[r] then
      local n = #r.token_ids
      local tps = r.t_first and r.t_last and n > 1 and (n - 1) / math.max(1e-3, (r.t_last - r.t_first) / 1000) or nil
      out[#out + 1] = event("request", { id = type(v) == "table" and v.reply.id or nil, choice = type(v) == "table" and v.index or nil,
        state = "done", finish = r.finish_reason, tokens = n, tokens_per_s = tps })
    end
  end
  seen.requests = now_reqs
  local now = core.now_ms()
  local b = srv.batcher
  local last = self.view.last
  if now - seen.t_ms >= M.INTERVAL_MS and (not last or b.stats.steps ~= last.step or now - seen.t_ms >= M.IDLE_MS) then
    seen.t_ms = now
    local ok, s = pcall(self.view.sample, self.view)
    if ok then
      out[#out + 1] = event("step", { step = s.step, tokens = s.tokens, step_ms = s.step_ms, running = b:active(),
        queued = b:queued(), interval = s.row, devices = s.devices, links = s.links, requests = self.view:requests() })
    end
  end
  if #out > 0 then self:broadcast(table.concat(out)) end
end

function Dash:close()
  for _, req in ipairs(self.clients) do
    if req.handle and not req:cancelled() then req:finish("") else req:release() end
  end
  self.clients = {}
end

return M
