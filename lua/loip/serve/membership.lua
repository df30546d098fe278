-- The server's side of a serving cluster's membership (loip.cluster.registry): every turn of
-- its loop, between steps, the cluster admits workers that joined and lets leaving ones go; an
-- operator drains a device with POST /v1/cluster/drain { "device": I } (`loip cluster drain I`,
-- authenticated by --api-key as all of /v1). After any change every running request goes on
-- from its tokens on the new plan (the batcher's resume_all), as after a loss.
local json = require "loip.text.json"
local openai = require "loip.serve.openai"
local safe = require "cjson.safe"

local M = {}

local function log(fmt, ...) io.stderr:write(os.date("%H:%M:%S "), string.format(fmt, ...), "\n") io.stderr:flush() end

-- After a change of the set: the running requests started again on the new plan.
local function resume(srv)
  if srv.batcher:active() > 0 then srv.batcher:resume_all() end
end

-- Between steps (srv: loip.serve.server's Server, serving a cluster).
function M.turn(srv)
  local events = srv.opts.cluster:between_steps(srv.batcher:active())
  if #events > 0 then resume(srv) end
end

local function fail(req, status, message, param, code)
  local st, body = openai.error(status, message, nil, param, code)
  req:respond(st, "application/json", body)
end

-- POST /v1/cluster/drain { "device": I } (1-based): device I finishes the step (no step is in
-- flight while the server reads requests), the others are planned again without it, it stops,
-- and the running requests go on. 200 with the membership event; 400 naming `device`.
function M.drain(srv, req)
  local c = srv.opts.cluster
  if not c then return fail(req, 400, "this server runs one device, not a cluster: there is nothing to drain", "device") end
  local body = json.decode(req.body or "")
  local i = type(body) == "table" and body.device
  local n = #c.devices
  if type(i) ~= "number" or i ~= math.floor(i) or i < 1 or i > n then
    return fail(req, 400, string.format("'device' must be a device number in 1..%d (GET /health lists them), not %s", n,
      type(body) == "table" and json.encode(body.device) or "given"), "device")
  end
  local ok, e = pcall(c.release_device, c, i, "drain", srv.batcher:active())
  if not ok then
    log("drain of device %d refused: %s", i, tostring(e))
    return fail(req, 409, string.format("device %d cannot be drained: %s", i, tostring(e)), "device", "drain_refused")
  end
  resume(srv)
  req:respond(200, "application/json", json.encode({ object = "cluster.membership_event", event = e, devices = #c.devices }))
end

-- /health's membership: joins, leaves and losses in one list (loip.cluster.registry's
-- events), and where workers join (the join socket's endpoint).
function M.health(c, h)
  h.membership = c.membership or setmetatable({}, safe.array_mt)
  h.join_endpoint = c.joins and c.joins:endpoint() or nil
end

return M
