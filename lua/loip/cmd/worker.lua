-- `loip worker`: run one device of a cluster (the head starts them with generate --devices).
local common = require "loip.cmd.common"
local flags = require "loip.tools.flags"

local M = {
  brief = "run one device of a cluster (the head starts them with generate --devices)",
  usage = "loip worker --listen HOST:PORT --store DIR [--mem BYTES] [--threads N] [--token SECRET | --curve-keys DIR]",
  summary = "Run one device of a cluster: wait for a plan from the head, load its part of the slice store,\n"
    .. "run its stages every step. Stops cleanly on SIGINT/SIGTERM or when the head says so. The cluster\n"
    .. "token may also come from LOIP_CLUSTER_TOKEN (kept out of the process list).",
  flags = {
    { "listen", "string", "endpoint to listen at: HOST:PORT, tcp://HOST:PORT (port * or 0: any)", required = true },
    { "store", "string", "this device's copy of the slice store", required = true, metavar = "DIR" },
    { "mem", "bytes", "memory budget of this device (default: unlimited)", default = 0, metavar = "BYTES" },
    flags.shared.threads, flags.shared.kernels,
    { "token", "string", "cluster secret (peers prove they hold it; it never crosses the wire)", metavar = "SECRET" },
    { "curve-keys", "string", "the cluster's CURVE secret key instead of a token: DIR/secret.key (z85, same on every member)", metavar = "DIR" },
    flags.shared.cpu_latency,
    { "head-dir", "string", "a local head's private directory: removed when the head dies before this worker stops (the head sets it)", metavar = "DIR" },
    unpack(require("loip.cmd.discover").worker_flags), -- (--announce: discovery on a LAN)
  },
}

function M.run(o)
  common.use_kernels(o.kernels)
  local token = o.token or os.getenv("LOIP_CLUSTER_TOKEN")
  if not token and not o.curve_keys then
    common.usage("worker", "give --token, --curve-keys or LOIP_CLUSTER_TOKEN: peers must authenticate")
  end
  if o.cpu_latency then
    local ok, err = require("loip.core").wake_latency(o.cpu_latency)
    if not ok then error("worker: --cpu-latency: " .. err, 0) end
  end
  local listen = o.listen:match("://") and o.listen or ("tcp://" .. o.listen)
  local w = require("loip.cluster.worker").new { listen = listen, store = o.store, mem = o.mem, threads = o.threads,
    token = o.curve_keys and nil or token, keys = o.curve_keys, head_dir = o.head_dir }
  io.stdout:write("listening ", w:endpoint(), "\n")
  io.stdout:flush()
  require("loip.cmd.discover").worker_announce(w, o) -- (--announce)
  io.stderr:write(string.format("loip worker: %s, store %s, budget %s%s\n", w:endpoint(), o.store,
    o.mem > 0 and require("loip.runtime.memory").format_bytes(o.mem) or "unlimited",
    o.cpu_latency and string.format(", CPU wake-up latency held at %d us", o.cpu_latency) or ""))
  w:run()
  return 0
end

return M
