-- `loip testbed`: network namespaces shaped by tbf with a worker in each (root).
-- Requires inside functions: `loip help` loads every command, so a command loads the modules
-- it uses when it runs (`loip help` loads no FFI).
local common = require "loip.cli.inputs"
local flags = require "loip.ui.flags"

local M = {
  brief = "network namespaces shaped by tbf with a worker in each (root)",
  usage = "loip testbed up N --store DIR [--cache DIR] [--rate 100mbit] [--mem LIST] [--threads N] | loip testbed shape I RATE | loip testbed down [--keep-logs] | loip testbed status",
  positional = { "up|shape|down|status", "N|I", "RATE" },
  summary = "A network testbed on this machine (root): N network namespaces joined by a bridge, every link shaped\n"
    .. "by tbf (real kernel shaping), one loip worker in each (10.77.0.11:7000, .12, ...), logging to\n"
    .. "/tmp/loip-testbed-I.log. `shape I RATE` re-shapes device I's link live (requests keep running). `down`\n"
    .. "removes every namespace, link, process and log `up` made. The cluster token\n"
    .. "is printed, and kept in the state file.",
  flags = {
    { "store", "string", "slice store the workers serve", metavar = "DIR" },
    { "cache", "string", "the workers hold no store: each an empty cache DIR/device-I the head ships its blocks into (the store stays the head's)", metavar = "DIR" },
    { "rate", "string", "link rate (tc syntax: 100mbit, 1gbit)", default = "100mbit" },
    { "mem", "string", "budget per worker: one size, or one per worker (600M,400M,400M)", metavar = "LIST" },
    flags.shared.threads,
    { "token", "string", "cluster token (default: random)", metavar = "SECRET" },
    { "keep-logs", "bool", "down: leave the workers' logs (/tmp/loip-testbed-I.log) in place" },
  },
}

function M.run(o, pos)
  local testbed = require "loip.cluster.testbed"
  local what = pos[1]
  if what == "down" then
    local st = testbed.down { keep_logs = o.keep_logs }
    io.stderr:write(st and string.format("testbed down: %d workers stopped, %d namespaces and the bridge removed%s\n",
      #(st.pids or {}), #(st.namespaces or {}), o.keep_logs and ("; logs kept: " .. table.concat(st.logs or {}, ", "))
      or ", their logs deleted") or "testbed: none is up\n")
    return 0
  elseif what == "shape" then
    local i, rate = tonumber(pos[2]), pos[3]
    if not i or not rate then common.usage("testbed", "shape I RATE (e.g. shape 2 50mbit)") end
    testbed.shape(i, rate)
    io.stderr:write(string.format("testbed: device %d's link now at %s\n", i, rate))
    return 0
  elseif what == "status" then
    local st = testbed.state()
    io.stdout:write(st and require("loip.text.json").encode(st) .. "\n" or "none\n")
    return 0
  elseif what ~= "up" then
    common.usage("testbed", "up N | shape I RATE | down | status (see --help)")
  end
  local n = tonumber(pos[2])
  if not n or n < 1 or n > 32 or n ~= math.floor(n) then
    common.usage("testbed", "up N: N devices, 1..32")
  end
  if not o.store then common.usage("testbed", "up needs --store DIR") end
  local mems = common.settings("testbed", { mem = o.mem }, n).mem
  local token = o.token or os.getenv("LOIP_CLUSTER_TOKEN")
  if not token then
    local f = io.open("/dev/urandom", "rb")
    token = f:read(16):gsub(".", function(c) return string.format("%02x", c:byte()) end)
    f:close()
  end
  local exe = require("loip.cluster.proc").exe()
  local st = testbed.up { n = n, rate = o.rate, store = o.store, cache = o.cache, mem = mems, threads = o.threads > 0 and o.threads or 1,
    token = token, exe = exe }
  io.stdout:write(string.format("testbed up: %d workers at %s, links shaped to %s\n", n, table.concat(st.hosts, ","), o.rate))
  io.stdout:write(string.format("run: LOIP_CLUSTER_TOKEN=%s loip generate --model %s --hosts %s --prompt ...\n", token, o.store,
    table.concat(st.hosts, ",")))
  return 0
end

return M
