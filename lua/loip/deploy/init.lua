-- recipes/deploy: bring a described cluster up and down (docs/deploy.md). `up` copies loip to
-- each host where `PREFIX/bin/loip --version` fails, starts `loip worker` there detached (its pid
-- and log in a state directory on the host), waits until each listens, then starts `loip serve
-- --hosts ...` on this machine (the head). Everything started and every file or directory made is
-- recorded in a state file (STATE_DIR/state.json) as it happens, so `down`, from any process,
-- stops it all and removes it all; a failing `up` does the same before it raises.
local ffi = require "ffi"
local json = require "loip.text.json"
local core = require "loip.core"
local host = require "loip.deploy.host"
local proc = require "loip.cluster.proc"
local describe = require "loip.deploy.describe"

pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")

local M = {}
local q = host.q

-- This loip's path (" (deleted)" dropped: a build that relinked it while it ran).
local function exe() return (proc.exe():gsub(" %(deleted%)$", "")) end
local function say(fmt, ...) io.stderr:write("deploy: ", string.format(fmt, ...), "\n") end
local function sh(cmd) return os.execute(cmd .. " >/dev/null 2>&1") == 0 end
local function capture(cmd)
  local out, rc = host.capture(cmd)
  return rc == 0, out
end

function M.state_file(d) return d.state_dir .. "/state.json" end
function M.state(d)
  local f = M.state_file(d)
  return json.exists(f) and json.load(f) or nil
end
local function save(state)
  local f = state.state_dir .. "/state.json"
  local tmp = f .. ".tmp"
  local out = assert(io.open(tmp, "w"))
  out:write(json.encode(state), "\n")
  out:close()
  assert(os.rename(tmp, f))
end

-- The installed tree of the loip running this (a build directory: `cmake --install` into a
-- staging folder; an installed prefix: its bin, lib, share), packed once into STATE_DIR.
local function pack(state)
  local path = exe()
  local dir = path:match("^(.*)/[^/]+$")
  local root
  if sh("test -f " .. q(dir .. "/CMakeCache.txt")) then
    root = state.state_dir .. "/stage"
    local ok, out = capture(string.format("cmake --install %s --prefix %s", q(dir), q(root)))
    if not ok then error("deploy: staging loip (cmake --install " .. dir .. ") failed: " .. out, 0) end
  elseif sh("test -d " .. q(dir .. "/../share/loip/lua")) then
    root = dir .. "/.."
  else
    error("deploy: " .. path .. " is neither in a build directory nor in an installed prefix (PREFIX/bin, PREFIX/share/loip): nothing to copy", 0)
  end
  local tarball = state.state_dir .. "/loip.tar.gz"
  local ok, out = capture(string.format("tar -czf %s -C %s bin lib share", q(tarball), q(root)))
  if not ok then error("deploy: packing loip failed: " .. out, 0) end
  state.tarball = tarball
  save(state)
  return tarball
end

-- `mkdir -p -v` on h; the directories it made.
local function mkdirs(h, path)
  local out = host.must(h, "mkdir -p -v " .. q(path), "mkdir " .. path)
  local made = {}
  for d in out:gmatch("created directory '([^']+)'") do made[#made + 1] = d end
  return made
end

local function env_lines(prefix)
  return string.format("IFS= read -r t; export LOIP_CLUSTER_TOKEN=\"$t\"; P=%s; "
    .. "[ -d \"$P/share/loip/lua\" ] && export LOIP_LUA_DIR=\"$P/share/loip/lua\"; "
    .. "[ -d \"$P/lib\" ] && export LD_LIBRARY_PATH=\"$P/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}\"; ", q(prefix))
end

-- Copy loip to host h unless it runs there already; start its worker; record both.
local function start_host(d, state, h, hs)
  local loip = h.prefix .. "/bin/loip"
  local ok = host.run(h, env_lines(h.prefix) .. q(loip) .. " --version", { input = "\n" })
  if not ok then
    local tarball = state.tarball or pack(state)
    local fresh = not host.run(h, "test -e " .. q(h.prefix))
    say("host %d (%s): copying loip into %s", h.i, host.name(h), h.prefix)
    hs.made = mkdirs(h, h.prefix)
    save(state)
    local list = host.must(h, "tar -xzvf - -C " .. q(h.prefix), "unpacking loip into " .. h.prefix, { from = tarball })
    if not fresh then -- (an existing prefix: what the tarball put there; directories only when left empty)
      hs.files = {}
      for name in list:gmatch("[^\n]+") do
        name = name:gsub("^%./", "")
        if name ~= "" and name ~= "." then hs.files[#hs.files + 1] = h.prefix .. "/" .. name end
      end
    end
    save(state)
    local ok2, out = host.run(h, env_lines(h.prefix) .. q(loip) .. " --version", { input = "\n" })
    if not ok2 then error(string.format("deploy: host %d (%s): the copied loip does not run: %s", h.i, host.name(h), out), 0) end
  end
  hs.dir = h.prefix .. "/var/loip-deploy/" .. d.name
  for _, m in ipairs(mkdirs(h, hs.dir)) do hs.made[#hs.made + 1] = m end
  if h.cache then for _, m in ipairs(mkdirs(h, h.cache)) do hs.made[#hs.made + 1] = m end end
  save(state)
  local args = { "worker", "--listen", "tcp://0.0.0.0:" .. h.listen, "--threads", tostring(h.threads) }
  local function add(...) for _, a in ipairs({ ... }) do args[#args + 1] = a end end
  if h.store then add("--store", h.store) else add("--cache", h.cache) end
  if h.disk_quota then add("--disk-quota", tostring(h.disk_quota)) end
  if h.mem then add("--mem", tostring(h.mem)) end
  if d.curve_keys then add("--curve-keys", d.curve_keys) end
  for i, a in ipairs(args) do args[i] = q(a) end
  local cmd = env_lines(h.prefix) .. string.format("setsid nohup %s %s > %s 2>&1 < /dev/null & echo $! > %s; echo $!",
    q(loip), table.concat(args, " "), q(hs.dir .. "/worker.log"), q(hs.dir .. "/worker.pid"))
  hs.log = hs.dir .. "/worker.log"
  hs.pid = tonumber(host.must(h, cmd, "starting the worker", { input = (d.token or "") .. "\n" }):match("(%d+)%s*$"))
  save(state)
  say("host %d (%s): worker started, pid %s, log %s", h.i, host.name(h), tostring(hs.pid), hs.log)
end

-- Wait until h's worker listens (its port in /proc/net/tcp*, LISTEN), or raise with its log.
local function wait_listening(h, hs, timeout_ms)
  local cmd = string.format("kill -0 %d && grep -qiE ':%04X [0-9A-F]+:0000 0A ' /proc/net/tcp /proc/net/tcp6", hs.pid, h.listen)
  local deadline = core.now_ms() + timeout_ms
  while true do
    if host.run(h, cmd) then return end
    local alive = host.run(h, "kill -0 " .. hs.pid)
    if not alive or core.now_ms() > deadline then
      local _, log = host.run(h, "tail -n 5 " .. q(hs.log))
      error(string.format("deploy: host %d (%s): the worker %s: %s", h.i, host.name(h),
        alive and "did not listen in time" or "exited", log), 0)
    end
    core.sleep_ms(100)
  end
end

-- Bring the described cluster up; returns the state (serve.url: the API's base URL).
function M.up(d)
  if M.state(d) then error("deploy: " .. d.name .. " is up already (" .. M.state_file(d) .. "); run down.lua first", 0) end
  local okd, why = capture("mkdir -p " .. q(d.state_dir))
  if not okd then error("deploy: state_dir " .. d.state_dir .. ": " .. why, 0) end
  local state = { name = d.name, file = d.file, state_dir = d.state_dir, hosts = {} }
  save(state)
  local ok, err = pcall(function()
    for _, h in ipairs(d.hosts) do
      local hs = { i = h.i, ssh = h.ssh, port = h.port, key = h.key, known_hosts = h.known_hosts, netns = h.netns, prefix = h.prefix, made = {} }
      state.hosts[h.i] = hs
      start_host(d, state, h, hs)
    end
    local list = {}
    for _, h in ipairs(d.hosts) do
      wait_listening(h, state.hosts[h.i], 30000)
      say("host %d: worker listening at %s:%d", h.i, h.address, h.listen)
      list[#list + 1] = h.address .. ":" .. h.listen
    end
    if d.token then ffi.C.setenv("LOIP_CLUSTER_TOKEN", d.token, 1) end
    local args = { "serve", "--model", d.model, "--hosts", table.concat(list, ",") }
    if d.curve_keys then args[#args + 1] = "--curve-keys" args[#args + 1] = d.curve_keys end
    for _, a in ipairs(d.serve.args) do args[#args + 1] = a end
    for i, a in ipairs(args) do args[i] = q(a) end
    local out, log = d.state_dir .. "/serve.out", d.state_dir .. "/serve.log"
    local p = io.popen(string.format("setsid nohup %s %s > %s 2> %s < /dev/null & echo $!", q(exe()),
      table.concat(args, " "), q(out), q(log)))
    state.serve = { pid = tonumber(p:read("*l")), out = out, log = log }
    p:close()
    save(state)
    say("head: loip serve started, pid %d, log %s (profiling and planning over %d hosts)", state.serve.pid, log, #list)
    local deadline = core.now_ms() + 300000
    while true do
      local text = json.read_file(out) or ""
      local url = text:match("listening (http://%S+)")
      if url then state.serve.url = url break end
      if not proc.alive(state.serve.pid) or core.now_ms() > deadline then
        error("deploy: loip serve " .. (proc.alive(state.serve.pid) and "did not listen in time" or "exited") .. ": "
          .. proc.tail(log, 8), 0)
      end
      core.sleep_ms(100)
    end
    save(state)
    say("serving at %s (down: loip run recipes/deploy/down.lua %s)", state.serve.url, d.file)
  end)
  if not ok then
    say("up failed; removing what it started")
    pcall(M.down, d)
    error(err, 0)
  end
  return state
end

-- Stop a process on h (TERM, then KILL after 5 s), if it is still a loip.
local function stop_remote(h, pid)
  host.run(h, string.format("p=%d; grep -q loip /proc/$p/cmdline 2>/dev/null || exit 0; kill -TERM $p; i=0; "
    .. "while kill -0 $p 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; kill -KILL $p 2>/dev/null; true", pid))
end

-- Stop everything up started and remove what it made, as its state file records; idempotent.
-- Returns the state it undid, or nil when nothing was up; raises when a host could not be cleaned
-- (its state is kept, so down may run again).
function M.down(d)
  local state = M.state(d)
  if not state then return nil end
  if state.serve and state.serve.pid and proc.alive(state.serve.pid) then
    sh("kill -TERM " .. state.serve.pid)
    local deadline = core.now_ms() + 10000
    while proc.alive(state.serve.pid) and core.now_ms() < deadline do core.sleep_ms(50) end
    if proc.alive(state.serve.pid) then sh("kill -KILL " .. state.serve.pid) end
    say("head: loip serve (pid %d) stopped", state.serve.pid)
  end
  local failed = {}
  for i, hs in pairs(state.hosts or {}) do
    local h = { i = tonumber(i) or hs.i, ssh = hs.ssh, port = hs.port, key = hs.key, known_hosts = hs.known_hosts, netns = hs.netns }
    if hs.pid then stop_remote(h, hs.pid) end
    local paths = {}
    for _, m in ipairs(hs.made or {}) do paths[#paths + 1] = m end
    table.sort(paths, function(a, b) return #a > #b end) -- (deepest first: files, then their directories)
    local cmd = { "true" }
    local files = {}
    for _, f in ipairs(hs.files or {}) do files[#files + 1] = f end
    table.sort(files, function(a, b) return #a > #b end)
    for _, f in ipairs(files) do
      cmd[#cmd + 1] = f:match("/$") and string.format("rmdir %s 2>/dev/null || true", q(f)) or string.format("rm -f %s", q(f))
    end
    for _, p in ipairs(paths) do
      cmd[#cmd + 1] = string.format("if [ -d %s ] && [ ! -L %s ]; then rm -rf %s; else rm -f %s; fi", q(p), q(p), q(p), q(p))
    end
    local ok, out = host.run(h, table.concat(cmd, "; "))
    if ok then
      say("host %s (%s): worker stopped, %d paths removed", tostring(h.i), host.name(h), #paths + #files)
    else
      failed[#failed + 1] = string.format("host %s (%s): %s", tostring(h.i), host.name(h), out)
    end
  end
  if #failed > 0 then error("deploy: down could not clean " .. table.concat(failed, "; ") .. " (state kept: " .. M.state_file(d) .. ")", 0) end
  sh("rm -rf " .. q(state.state_dir))
  return state
end

-- The recipes' body (recipes/deploy/up.lua, down.lua): what = "up" or "down", file = the
-- description; progress on stderr, the outcome on stdout; returns the exit status (2: usage).
function M.recipe(what, file)
  if not file then
    io.stderr:write("usage: loip run recipes/deploy/", what, ".lua CLUSTER.lua (a cluster description: docs/deploy.md)\n")
    return 2
  end
  local ok, err = pcall(function()
    local d = describe.load(file)
    if what == "up" then
      local state = M.up(d)
      io.stdout:write(string.format("up: %s serving at %s on %d hosts\n", d.name, state.serve.url, #d.hosts))
    else
      io.stdout:write(M.down(d) and string.format("down: %s stopped, everything up made removed\n", d.name)
        or string.format("down: %s is not up (no %s)\n", d.name, M.state_file(d)))
    end
  end)
  if not ok then io.stderr:write(tostring(err), "\n") return 1 end
  return 0
end

return M
