-- `loip cluster`: tell a serving cluster's head (loip serve --devices/--hosts) what to do with its
-- members: `drain I` lets device I finish the step, plans again without it and stops it
-- (POST /v1/cluster/drain); `members` prints its devices and membership events (GET /health).
-- Requires inside functions: `loip help` loads every command, so a command loads the modules
-- it uses when it runs (`loip help` loads no FFI).
local common = require "loip.cli.inputs"
local json = require "loip.text.json"

local M = {
  brief = "a serving cluster's members: drain a device, list devices and joins, leaves, losses",
  usage = "loip cluster drain I | members [--url URL] [--api-key KEY]",
  positional = { "drain|members", "I" },
  summary = "Talk to a serving head (loip serve with --devices or --hosts). `drain I`: device I (1-based, as /health\n"
    .. "lists them) finishes the step, the others are planned again without it, its worker stops; requests\n"
    .. "running go on with exactly their tokens. `members`: the devices and the membership events (joins,\n"
    .. "leaves, losses: step, device, endpoint, kind, replan_ms) as JSON.",
  flags = {
    { "url", "string", "the server's API base URL", default = "http://127.0.0.1:8080/v1" },
    { "api-key", "string", "the server's --api-key (default: LOIP_API_KEY)", metavar = "KEY" },
  },
}

function M.run(o, pos)
  local what = pos[1]
  local url = o.url:gsub("/+$", "")
  local key = o.api_key or os.getenv("LOIP_API_KEY")
  local headers = key and key ~= "" and { Authorization = "Bearer " .. key } or {}
  local cl = require("loip.runtime.http_client").new()
  local t
  if what == "drain" and tonumber(pos[2]) and not pos[3] then
    headers["Content-Type"] = "application/json"
    t = cl:post(url .. "/cluster/drain", json.encode({ device = tonumber(pos[2]) }), headers)
  elseif what == "members" and not pos[2] then
    t = cl:get(url:gsub("/v%d+$", "") .. "/health", headers)
  else
    common.usage("cluster", "usage: loip cluster drain I | members (see --help)")
  end
  cl:wait(600000)
  cl:close()
  local body = json.decode(t.body or "")
  if t.status ~= 200 then
    local msg = type(body) == "table" and type(body.error) == "table" and body.error.message or t.error or t.body
    error(string.format("%s: %s%s", url, t.status and t.status > 0 and ("HTTP " .. t.status .. ": ") or "", tostring(msg)), 0)
  end
  if what == "members" then body = { devices = body.devices, membership = body.membership, join_endpoint = body.join_endpoint } end
  io.stdout:write(json.encode(body), "\n")
  if what == "drain" then
    local e = body.event or {}
    -- (a device found dead is not drained: its loss is the answer)
    io.stderr:write(string.format("device %s (%s) %s: %d devices now, re-planned in %.0f ms\n", tostring(e.device),
      tostring(e.endpoint), e.kind == "loss" and "was lost (it did not answer): removed" or "drained", body.devices or 0,
      e.replan_ms or 0))
  end
  return 0
end

return M
