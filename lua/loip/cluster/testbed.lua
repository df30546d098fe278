-- A network testbed on one machine (root): N network namespaces joined by a bridge, each link
-- shaped by the kernel (tbf on both ends of every veth pair, as the paper's `tc`), one
-- `loip worker` in each namespace. The head runs in the root namespace and reaches the workers
-- at 10.77.0.11, .12, ... (port 7000), each logging to /tmp/loip-testbed-I.log. `down` removes
-- every namespace, link, process and log `up` made; what it made is recorded in a state file, so
-- `down` works from another process.
--
--   loip testbed up 3 --rate 100mbit --store STORE [--mem 600M,400M,400M]
--   LOIP_CLUSTER_TOKEN=... loip generate --model STORE --hosts 10.77.0.11:7000,10.77.0.12:7000,10.77.0.13:7000 ...
--   loip testbed down
local json = require "loip.text.json"
local core = require "loip.core"

local M = {}

M.BRIDGE, M.PREFIX, M.SUBNET, M.PORT = "loipbr0", "loip-dev", "10.77.0", 7000
M.state_file = os.getenv("LOIP_TESTBED_STATE") or "/run/loip-testbed.json"

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- Run a command; raise with its output when it fails.
local function run(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("*a")
  local ok = p:close()
  if not ok then error(string.format("testbed: `%s` failed: %s", cmd, out:gsub("%s+$", "")), 0) end
  return out
end
local function try(cmd) return os.execute(cmd .. " >/dev/null 2>&1") == 0 end

-- nil, or why the testbed cannot run here.
function M.unavailable()
  local id = io.popen("id -u"):read("*l")
  if id ~= "0" then return "needs root (network namespaces, bridges and tc)" end
  for _, tool in ipairs({ "ip", "tc" }) do
    if not try("command -v " .. tool) then return "needs `" .. tool .. "` (Debian package iproute2)" end
  end
  if not try("ip netns add loip-probe") then return "this machine refuses network namespaces" end
  try("ip netns del loip-probe")
  return nil
end

-- nil, or why a spec cannot bring a testbed up here now: unavailable, or one is up (its bridge).
function M.skip_reason()
  local why = M.unavailable()
  if why then return why end
  if try("ip link show " .. M.BRIDGE) then return "one is up already (" .. M.BRIDGE .. " exists)" end
end

function M.address(i) return string.format("%s.%d", M.SUBNET, 10 + i) end

local function save(state)
  local tmp = M.state_file .. ".tmp"
  local f = assert(io.open(tmp, "w"))
  f:write(json.encode(state), "\n")
  f:close()
  assert(os.rename(tmp, M.state_file))
end

function M.state()
  return json.exists(M.state_file) and json.load(M.state_file) or nil
end

-- opts: n, rate ("100mbit"), store (or cache: a directory, the workers' caches in it), mem (list
-- of sizes or one), threads, token, exe (loip), announce (true: each worker announces itself on
-- the bridge, loip worker --announce, on UDP port beacon_port or discovery's default).
-- Returns the state (hosts, pids, token). Everything made so far is removed when a step fails.
function M.up(opts)
  local why = M.unavailable()
  if why then error("testbed: " .. why, 0) end
  if M.state() then error("testbed: one is up already (" .. M.state_file .. "); `loip testbed down` first", 0) end
  local n = opts.n
  local state = { bridge = M.BRIDGE, namespaces = {}, links = {}, pids = {}, hosts = {}, rate = opts.rate,
    token = opts.token, logs = {} }
  local ok, err = pcall(function()
    save(state)
    run(string.format("ip link add %s type bridge", M.BRIDGE))
    run(string.format("ip addr add %s.1/24 dev %s", M.SUBNET, M.BRIDGE))
    run(string.format("ip link set %s up", M.BRIDGE))
    for i = 1, n do
      local ns, veth = string.format("%s-%d", M.PREFIX, i), string.format("veth-loip-%d", i)
      run("ip netns add " .. ns)
      state.namespaces[#state.namespaces + 1] = ns
      save(state)
      run(string.format("ip link add %s type veth peer name eth0 netns %s", veth, ns))
      state.links[#state.links + 1] = veth
      save(state)
      run(string.format("ip link set %s master %s up", veth, M.BRIDGE))
      run(string.format("ip netns exec %s ip addr add %s/24 dev eth0", ns, M.address(i)))
      run(string.format("ip netns exec %s ip link set eth0 up", ns))
      run(string.format("ip netns exec %s ip link set lo up", ns))
      -- real kernel shaping on both directions of the device's link
      local tbf = string.format("tbf rate %s burst 64kb latency 200ms", opts.rate)
      run(string.format("ip netns exec %s tc qdisc add dev eth0 root %s", ns, tbf))
      run(string.format("tc qdisc add dev %s root %s", veth, tbf))
    end
    for i = 1, n do
      local ns = string.format("%s-%d", M.PREFIX, i)
      local mem = type(opts.mem) == "table" and (opts.mem[i] or opts.mem[1]) or opts.mem or 0
      local log = string.format("/tmp/loip-testbed-%d.log", i)
      -- (opts.cache: workers with an empty cache each, DIR/device-I, their blocks shipped: loip.cluster.ship)
      local src = opts.cache and ("--cache " .. q(opts.cache .. "/device-" .. i)) or ("--store " .. q(opts.store))
      local announce = opts.announce and string.format(" --announce --beacon-port %d", opts.beacon_port or 7600) or ""
      local cmd = string.format("ip netns exec %s env LOIP_CLUSTER_TOKEN=%s %s worker --listen tcp://%s:%d %s --mem %d --threads %d%s > /dev/null 2> %s & echo $!",
        ns, q(opts.token), q(opts.exe), M.address(i), M.PORT, src, mem, opts.threads or 1, announce, log)
      local pid = tonumber(io.popen(cmd):read("*l"))
      state.pids[#state.pids + 1] = pid
      state.hosts[#state.hosts + 1] = string.format("%s:%d", M.address(i), M.PORT)
      state.logs[#state.logs + 1] = log
      save(state)
    end
    -- wait until every worker listens
    for i, host in ipairs(state.hosts) do
      local deadline = core.now_ms() + 20000
      while not try(string.format("ip netns exec %s-%d ss -ltn | grep -q '%s'", M.PREFIX, i, host)) do
        if core.now_ms() > deadline then error("testbed: the worker in " .. M.PREFIX .. "-" .. i .. " did not start; see " .. state.logs[i], 0) end
        core.sleep_ms(50)
      end
    end
  end)
  if not ok then
    pcall(M.down, { keep_logs = true }) -- (the error may point at a worker's log)
    error(err, 0)
  end
  return state
end

-- Re-shape device i's link live (both directions of its interface, tbf's rate changed in
-- place): requests running across it keep running. rate: "50mbit" and the like.
function M.shape(i, rate)
  local state = M.state()
  if not state then error("testbed: none is up (`loip testbed up` first)", 0) end
  if not state.links[i] then error(string.format("testbed: device %s is not one of %d", tostring(i), #state.links), 0) end
  if not tostring(rate):match("^%d+%.?%d*[kmg]?bit$") then error("testbed: '" .. tostring(rate) .. "' is not a rate such as 50mbit", 0) end
  local tbf = string.format("tbf rate %s burst 64kb latency 200ms", rate)
  run(string.format("ip netns exec %s tc qdisc change dev eth0 root %s", state.namespaces[i], tbf))
  run(string.format("tc qdisc change dev %s root %s", state.links[i], tbf))
  state.rates = state.rates or {}
  state.rates[i] = rate
  save(state)
end

-- Remove what `up` made (as recorded): workers, namespaces (their veth ends go with them),
-- the bridge, the workers' logs (unless opts.keep_logs), the state file. Returns what it
-- removed.
function M.down(opts)
  local state = M.state()
  if not state then return nil end
  for _, pid in ipairs(state.pids or {}) do try("kill -TERM " .. pid) end
  local deadline = core.now_ms() + 3000
  for _, pid in ipairs(state.pids or {}) do
    while try("kill -0 " .. pid) and core.now_ms() < deadline do core.sleep_ms(20) end
    try("kill -KILL " .. pid)
  end
  for _, veth in ipairs(state.links or {}) do try("ip link del " .. veth) end
  for _, ns in ipairs(state.namespaces or {}) do try("ip netns del " .. ns) end
  try("ip link del " .. (state.bridge or M.BRIDGE))
  if not (opts and opts.keep_logs) then
    for _, log in ipairs(state.logs or {}) do os.remove(log) end
  end
  os.remove(M.state_file)
  return state
end

return M
