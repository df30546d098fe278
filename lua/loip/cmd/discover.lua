-- `loip discover`: list the workers announcing themselves on this LAN (loip worker --announce);
-- and the discovery flags and hooks of `loip worker` (--announce) and `loip serve` (--discover).
-- Requires inside functions: `loip help` loads every command, so a command loads the modules
-- it uses when it runs (`loip help` loads no FFI).
local common = require "loip.cli.inputs"

local PORT = 7600 -- (loip.cluster.discovery.PORT; not required here so that `loip help` loads no FFI)

local beacon_port = { "beacon-port", "int", "UDP port of the discovery beacons", default = PORT, metavar = "N",
  check = function(v) return v >= 1 and v <= 65535, "must be in 1..65535" end }
local beacon_interface = { "beacon-interface", "string", "network interface the beacons use (default: the first one "
  .. "that broadcasts; * for all)", metavar = "NAME" }

local M = {
  brief = "list the workers announcing themselves on this LAN (loip worker --announce)",
  usage = "loip discover [--seconds S] [--json] [--beacon-port N] [--beacon-interface NAME] [--token SECRET | --curve-keys DIR]",
  summary = "Listen for the UDP beacons of workers started with --announce (CZMQ's zbeacon) for S seconds and list\n"
    .. "those whose beacon proves the cluster token (or CURVE keys): address:port, memory budget, free disk,\n"
    .. "threads, CPUs. Beacons that do not prove it, or are stale, are logged once per sender and ignored.\n"
    .. "The token may also come from LOIP_CLUSTER_TOKEN.",
  flags = {
    { "seconds", "number", "how long to listen", default = 3, metavar = "S",
      check = function(v) return v > 0, "must be > 0" end },
    { "json", "bool", "print the workers found as a JSON array" },
    beacon_port, beacon_interface,
    { "token", "string", "the cluster secret the beacons prove", metavar = "SECRET" },
    { "curve-keys", "string", "the cluster's CURVE key directory instead of a token (DIR/secret.key)", metavar = "DIR" },
  },
}

-- The rows `loip worker` and `loip serve` add to their flags.
M.worker_flags = {
  { "announce", "bool", "announce this worker on the LAN (UDP beacons proving the cluster secret, with its port, "
    .. "memory budget, free disk, threads and CPUs) for loip serve --discover and loip discover" },
  beacon_port, beacon_interface,
}
M.serve_flags = {
  { "discover", "bool", "listen for workers announcing themselves (loip worker --announce) that prove the cluster "
    .. "secret; they are listed in /health (discovered)" },
  beacon_port, beacon_interface,
}

local function secret(cmd, o)
  local token = common.token(o)
  if not token and not o.curve_keys then
    common.usage(cmd, "%s the cluster secret beacons prove: --token, --curve-keys or LOIP_CLUSTER_TOKEN",
      cmd == "discover" and "give" or cmd == "worker" and "--announce needs" or "--discover needs")
  end
  return { token = not o.curve_keys and token or nil, keys = o.curve_keys }
end

-- One line about a candidate: "A:P (mem 600.0 MiB, disk 48.8 GiB, 1 threads, 16 CPUs)".
function M.describe(c)
  local fmt = require("loip.runtime.memory").format_bytes
  return string.format("%s (mem %s, disk %s, %d threads, %d CPUs)", c.endpoint, c.mem > 0 and fmt(c.mem) or "unlimited",
    fmt(c.disk), c.threads, c.cpus)
end

-- worker --announce: beacons for worker w (its control port, budget, free disk, threads, CPUs),
-- renewed from its loop and silenced when it closes. Does nothing without --announce.
function M.worker_announce(w, o)
  if not o.announce then return nil end
  local discovery = require "loip.cluster.discovery"
  local port = tonumber(w:endpoint():match(":(%d+)$"))
  local dir = o.store or o.cache or "."
  local disk = require("loip.runtime.files").disk_available(dir) or 0
  local a, err = discovery.announcer { secret = secret("worker", o), port = port, beacon_port = o.beacon_port,
    interface = o.beacon_interface, summary = { mem = o.mem or 0, disk = disk,
      threads = o.threads > 0 and o.threads or require("loip.runtime.exec").cpu_info().cpus,
      cpus = require("loip.runtime.exec").cpu_info().cpus } }
  if not a then error("worker: --announce: " .. err, 0) end
  w.opts.on_tick = function() a:tick() end
  local close = w.close
  w.close = function(self) a:close() return close(self) end
  io.stderr:write(string.format("loip worker: announcing port %d on UDP port %d (%s)\n", port, o.beacon_port,
    a.beacon.host == "*" and "all interfaces" or a.beacon.host))
  return a
end

-- serve --discover: a listener polled between the server's turns; each worker found is handed
-- to on_found (below), and listed in /health's `discovered`.
function M.serve_listen(srv, o)
  if not o.discover then return nil end
  local l, err = require("loip.cluster.discovery").listener { secret = secret("serve", o), beacon_port = o.beacon_port,
    interface = o.beacon_interface, on_found = function(c) M.on_found(c, srv) end }
  if not l then error("serve: --discover: " .. err, 0) end
  srv.discovery = l
  local close = srv.close
  srv.close = function(self) l:close() return close(self) end
  return l
end

-- A verified candidate worker heard by serve --discover: logged, listed, and on a cluster
-- admitted between steps as a worker that joins is (loip.cluster.registry).
function M.on_found(c, srv)
  io.stderr:write(os.date("%H:%M:%S "), "found worker at ", M.describe(c), "\n")
  io.stderr:flush()
  local cl = srv.opts.cluster
  if cl and cl:discovered_worker(c) then
    io.stderr:write(os.date("%H:%M:%S "), "admitting it between steps\n")
    io.stderr:flush()
  end
end

function M.run(o)
  local l, err = require("loip.cluster.discovery").listener { secret = secret("discover", o), beacon_port = o.beacon_port,
    interface = o.beacon_interface }
  if not l then error("discover: " .. err, 0) end
  l:poll(math.floor(o.seconds * 1000))
  local found = l:candidates()
  l:close()
  if o.json then
    io.stdout:write(require("loip.text.json").encode(found), "\n")
  else
    for _, c in ipairs(found) do io.stdout:write(M.describe(c), "\n") end
    io.stderr:write(string.format("discover: %d worker%s in %g s\n", #found, #found == 1 and "" or "s", o.seconds))
  end
  return 0
end

return M
