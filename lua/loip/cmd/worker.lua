-- `loip worker`: run one device of a cluster (the head starts them with generate --devices).
-- Requires inside functions: `loip help` loads every command, so a command loads the modules
-- it uses when it runs (`loip help` loads no FFI).
local common = require "loip.cli.inputs"
local flags = require "loip.ui.flags"

local M = {
  brief = "run one device of a cluster (the head starts them with generate --devices)",
  usage = "loip worker --listen HOST:PORT (--store DIR | --cache DIR [--disk-quota BYTES]) [--mem BYTES] [--threads N] [--token SECRET | --curve-keys DIR] [--join HEAD:PORT]",
  summary = "Run one device of a cluster: wait for a plan from the head, load its part of the slice store,\n"
    .. "run its stages every step. Stops cleanly on SIGINT/SIGTERM or when the head says so; SIGTERM while it\n"
    .. "serves: it tells the head it leaves and stops once the head planned without it. --join: it asks a\n"
    .. "serving head (loip serve --join-listen) to admit it. The cluster token may also come from\n"
    .. "LOIP_CLUSTER_TOKEN (kept out of the process list).",
  flags = {
    { "listen", "string", "endpoint to listen at: HOST:PORT, tcp://HOST:PORT (port * or 0: any)", required = true },
    { "store", "string", "this device's copy of the slice store (with --cache: its files are used where present)", metavar = "DIR" },
    { "cache", "string", "a block cache: the head ships the store's files this device's plans need into DIR/<store id>/, kept for the next run", metavar = "DIR" },
    { "disk-quota", "bytes", "the most the cache may hold on disk (default: no limit)", default = 0, metavar = "BYTES" },
    { "mem", "bytes", "memory budget of this device (default: unlimited)", default = 0, metavar = "BYTES" },
    flags.shared.threads, flags.shared.kernels,
    { "token", "string", "cluster secret (peers prove they hold it; it never crosses the wire)", metavar = "SECRET" },
    { "curve-keys", "string", "the cluster's CURVE secret key instead of a token: DIR/secret.key (z85, same on every member)", metavar = "DIR" },
    flags.shared.cpu_latency,
    { "join", "string", "join a serving cluster: the head's --join-listen address (admitted between steps)", metavar = "HEAD:PORT" },
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
  if not o.store and not o.cache then common.usage("worker", "give --store DIR or --cache DIR (blocks shipped by the head)") end
  if o.disk_quota > 0 and not o.cache then common.usage("worker", "--disk-quota limits --cache: give --cache DIR") end
  if o.cpu_latency then
    local ok, err = require("loip.core").wake_latency(o.cpu_latency)
    if not ok then error("worker: --cpu-latency: " .. err, 0) end
  end
  local listen = o.listen:match("://") and o.listen or ("tcp://" .. o.listen)
  local w = require("loip.cluster.device_server").new { listen = listen, store = o.store, cache = o.cache, disk_quota = o.disk_quota,
    mem = o.mem, threads = o.threads,
    token = o.curve_keys and nil or token, keys = o.curve_keys, head_dir = o.head_dir }
  io.stdout:write("listening ", w:endpoint(), "\n")
  io.stdout:flush()
  require("loip.cmd.discover").worker_announce(w, o) -- (--announce)
  io.stderr:write(string.format("loip worker: %s, %s, budget %s%s\n", w:endpoint(),
    o.cache and ("cache " .. o.cache .. (o.store and (", store " .. o.store) or "")) or ("store " .. o.store),
    o.mem > 0 and require("loip.runtime.memory").format_bytes(o.mem) or "unlimited",
    o.cpu_latency and string.format(", CPU wake-up latency held at %d us", o.cpu_latency) or ""))
  if o.join then require("loip.cluster.join").announce(w, o.join) end
  w:run()
  return w.failed and 1 or 0
end

return M
