-- recipes/deploy (#net, root): a real sshd (Debian's openssh-server) on a loopback port with a
-- throwaway host key and client key; a 3-host description all reached over ssh to 127.0.0.1
-- (distinct listen ports and prefixes); up.lua copies loip into each prefix, starts the workers
-- and serves; the official OpenAI client's completion is the single device's text (run.c's);
-- down.lua leaves no process and no file; a second down is a no-op. A description's error names
-- the file and the field. Hosts that are network namespaces (netns =, as the testbed's) serve the
-- same text through raw HTTP. Skipped, with the reason, without root, sshd, ssh-keygen or ip.
local json = require "loip.text.json"
local core = require "loip.core"
local alive = require("loip.cluster.proc").alive
local T = require "spec.support"
teardown(function() T.cleanup() T.drop_stores() end)

local S260 = T.root .. "/models/stories260K"
local greedy = assert(json.load(S260 .. "/reference/greedy.json"))
local UP, DOWN = T.root .. "/recipes/deploy/up.lua", T.root .. "/recipes/deploy/down.lua"

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local function listening(port)
  return os.execute(string.format("grep -qiE ':%04X [0-9A-F]+:0000 0A ' /proc/net/tcp /proc/net/tcp6", port)) == 0
end
-- A free TCP port at or above from.
local function free_port(from)
  local p = from
  while listening(p) do p = p + 1 end
  return p
end

local function write_description(path, d)
  local lines = { "return {" }
  local function emit(v, indent)
    if type(v) == "table" then
      local parts = {}
      for k, x in pairs(v) do
        parts[#parts + 1] = (type(k) == "number" and "" or ("[" .. string.format("%q", k) .. "] = ")) .. emit(x, indent)
      end
      return "{ " .. table.concat(parts, ", ") .. " }"
    end
    return type(v) == "string" and string.format("%q", v) or tostring(v)
  end
  for k, v in pairs(d) do lines[#lines + 1] = string.format("  %s = %s,", k, emit(v)) end
  lines[#lines + 1] = "}"
  T.write(path, table.concat(lines, "\n") .. "\n")
end

-- A description of hosts (name, token, store as the model, state in dir/state, serve on any
-- port) written to dir/NAME.lua and brought up: its path, up's exit code, stdout, stderr, and the
-- state it recorded (nil when none).
local function up(dir, name, store, token, hosts)
  local desc = dir .. "/" .. name .. ".lua"
  write_description(desc, { name = name, model = store, token = token, hosts = hosts, state_dir = dir .. "/state",
    serve = { port = 0, max_batch = 2, context = 256, quiet = true } })
  local rc, out, e = T.run(string.format("%s run %s %s", T.loip, UP, desc))
  local f = dir .. "/state/state.json"
  return desc, rc, out, e, json.exists(f) and json.load(f) or nil
end

-- sshd -D on 127.0.0.1 with its own config, keys and authorized_keys in dir; returns its port,
-- the client key, a stop function; or nil, why.
local function start_sshd(dir)
  if io.popen("id -u"):read("*l") ~= "0" then return nil, "needs root (sshd as root on a loopback port)" end
  if not T.exists("/usr/sbin/sshd") then return nil, "needs sshd (Debian package openssh-server)" end
  if os.execute("command -v ssh-keygen >/dev/null && command -v ssh >/dev/null") ~= 0 then return nil, "needs ssh and ssh-keygen (openssh-client)" end
  for _, k in ipairs({ "host_key", "client_key" }) do
    assert(os.execute(string.format("ssh-keygen -q -t ed25519 -N '' -f %s/%s", q(dir), k)) == 0)
  end
  assert(os.execute(string.format("cp %s/client_key.pub %s/authorized_keys", q(dir), q(dir))) == 0)
  local made_run = not T.exists("/run/sshd")
  if made_run then os.execute("mkdir -p /run/sshd") end -- (its privilege separation directory)
  local port = free_port(22220)
  T.write(dir .. "/sshd_config", table.concat({ "Port " .. port, "ListenAddress 127.0.0.1", "HostKey " .. dir .. "/host_key",
    "PidFile " .. dir .. "/sshd.pid", "AuthorizedKeysFile " .. dir .. "/authorized_keys", "StrictModes no", "UsePAM no",
    "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PubkeyAuthentication yes",
    "PermitRootLogin prohibit-password", "LogLevel ERROR", "" }, "\n"))
  local pid = tonumber(io.popen(string.format("/usr/sbin/sshd -D -e -f %s/sshd_config 2> %s/sshd.log & echo $!", q(dir), q(dir))):read("*l"))
  local function stop()
    os.execute("kill -TERM " .. pid .. " 2>/dev/null")
    for _ = 1, 100 do if not alive(pid) then break end core.sleep_ms(20) end
    if made_run then os.execute("rmdir /run/sshd 2>/dev/null") end
  end
  for _ = 1, 2400 do -- (up to a minute on a busy machine; an sshd that died ends the wait)
    if listening(port) or not alive(pid) then break end
    core.sleep_ms(25)
  end
  if not listening(port) then
    stop()
    error("sshd did not start: " .. T.read_or_empty(dir .. "/sshd.log"))
  end
  return port, dir .. "/client_key", stop
end

describe("recipes/deploy #net", function()
  it("a 3-host description over ssh: up serves the single device's text, down leaves nothing", function()
    local missing = T.npm_missing()
    if missing then pending(missing) return end
    local dir = T.tmpdir()
    local port, key, stop_sshd = start_sshd(dir)
    if not port then pending("deploy skipped: " .. key) return end
    local ok, err = pcall(function()
      local store = T.slice_store(S260, "s260")
      local hosts, p = {}, 17310
      for i = 1, 3 do
        p = free_port(p + 1)
        -- (each worker with an empty block cache: the head ships it its blocks, loip.cluster.ship)
        hosts[i] = { ssh = "root@127.0.0.1", port = port, key = key, known_hosts = dir .. "/known_hosts", listen = p,
          cache = dir .. "/host" .. i .. "/cache", threads = 1, prefix = dir .. "/host" .. i .. "/opt/loip" }
      end
      local desc, rc, out, e, state = up(dir, "spec3", store, "deploy-spec", hosts)
      local pids = {}
      if state then
        for _, hs in ipairs(state.hosts) do pids[#pids + 1] = hs.pid end
        pids[#pids + 1] = state.serve and state.serve.pid
      end
      local okc, errc = pcall(function()
        assert.are.equal(0, rc, e)
        assert.matches("copying loip into " .. dir:gsub("%p", "%%%0") .. "/host2/opt/loip", e)
        local url = assert(out:match("serving at (http://%S+)"), out)
        assert.are.equal(4, #pids)
        for _, pid in ipairs(pids) do assert.is_true(alive(pid), "pid " .. pid .. " runs") end
        for i = 1, 3 do assert.is_true(T.exists(hosts[i].prefix .. "/bin/loip"), "loip copied to host " .. i) end
        local rc2, out2, e2 = T.run(string.format("node %s/tests/openai/completion.mjs %s %s %s 40", T.root, url,
          q(store:match("([^/]+)$")), q("Once upon a time")))
        assert.are.equal(0, rc2, e2)
        local r = assert(json.decode(out2), out2)
        local ref = greedy.cases[2]
        assert.are.equal("Once upon a time", ref.prompt)
        assert.are.equal(40, r.usage.completion_tokens)
        assert.are.equal(ref.output_text:sub(#"Once upon a time" + 1, #"Once upon a time" + #r.text), r.text)
        assert.is_true(#r.text > 100, r.text)
      end)
      local rc3, out3, e3 = T.run(string.format("%s run %s %s", T.loip, DOWN, desc))
      assert(okc, errc)
      assert.are.equal(0, rc3, e3)
      assert.matches("down: spec3 stopped", out3)
      for _, pid in ipairs(pids) do assert.is_false(alive(pid), "pid " .. pid .. " stopped") end
      for i = 1, 3 do assert.is_false(T.exists(dir .. "/host" .. i), "host " .. i .. "'s prefix removed") end
      assert.is_false(T.exists(dir .. "/state"), "the state directory removed")
      -- idempotent
      local rc4, out4 = T.run(string.format("%s run %s %s", T.loip, DOWN, desc))
      assert.are.equal(0, rc4)
      assert.matches("is not up", out4)
    end)
    stop_sshd()
    assert(ok, err)
  end)

  it("hosts in network namespaces: up serves the single device's text, down leaves nothing", function()
    if io.popen("id -u"):read("*l") ~= "0" then pending("netns hosts skipped: needs root") return end
    local tag = tostring(math.random(10000, 99999))
    local ns, veth, net = "loip-dep-" .. tag, "vldep" .. tag, "10.79." .. (tag % 250 + 1)
    if os.execute("ip netns add " .. ns .. " >/dev/null 2>&1") ~= 0 then pending("netns hosts skipped: no `ip` or namespaces refused") return end
    local ok, err = pcall(function()
      for _, c in ipairs({ "ip link add %s type veth peer name eth0 netns %s", "ip addr add %s.1/24 dev %s", "ip link set %s up",
        "ip netns exec %s ip addr add %s.2/24 dev eth0", "ip netns exec %s ip link set eth0 up", "ip netns exec %s ip link set lo up" }) do
        local a, b = veth, ns
        if c:match("^ip addr add") then a, b = net, veth elseif c:match("^ip netns exec %%s ip addr") then a, b = ns, net
        elseif c:match("^ip netns exec") then a = ns end
        assert(os.execute(string.format(c, a, b)) == 0, string.format(c, a, b))
      end
      local dir = T.tmpdir()
      local store = T.slice_store(S260, "s260")
      local hosts = {}
      for i = 1, 3 do
        hosts[i] = { netns = ns, address = net .. ".2", listen = 7100 + i, store = store, threads = 1, prefix = dir .. "/host" .. i }
      end
      local desc, rc, out, e, state = up(dir, "ns3", store, "deploy-ns", hosts)
      local okc, errc = pcall(function()
        assert.are.equal(0, rc, e)
        local url = assert(out:match("serving at (http://%S+)"), out)
        local cl = require("loip.runtime.http_client").new()
        local t = cl:post(url .. "/completions", json.encode({ model = store:match("([^/]+)$"), prompt = "Once upon a time",
          max_tokens = 40, temperature = 0 }))
        cl:wait(60000)
        assert.are.equal(200, t.status, t.body)
        local text = json.decode(t.body).choices[1].text
        assert.are.equal(greedy.cases[2].output_text:sub(#"Once upon a time" + 1, #"Once upon a time" + #text), text)
        assert.is_true(#text > 100, text)
      end)
      local rc3, _, e3 = T.run(string.format("%s run %s %s", T.loip, DOWN, desc))
      assert(okc, errc)
      assert.are.equal(0, rc3, e3)
      for _, hs in ipairs(state.hosts) do assert.is_false(alive(hs.pid), "worker " .. hs.pid .. " stopped") end
      assert.is_false(alive(state.serve.pid), "serve stopped")
      for i = 1, 3 do assert.is_false(T.exists(hosts[i].prefix), "host " .. i .. "'s prefix removed") end
      assert.is_false(T.exists(dir .. "/state"), "the state directory removed")
    end)
    os.execute("ip netns del " .. ns .. " >/dev/null 2>&1") -- (its veth end goes with it)
    assert(ok, err)
  end)

  it("names the file and the field of a description's error", function()
    local dir = T.tmpdir()
    local store = T.slice_store(S260, "s260")
    local desc = dir .. "/bad.lua"
    local function fails(d, field, why)
      write_description(desc, d)
      local rc, _, e = T.run(string.format("%s run %s %s", T.loip, UP, desc))
      assert.are.equal(1, rc)
      assert.matches(desc:gsub("%p", "%%%0") .. ": " .. field:gsub("%p", "%%%0") .. ": " .. why, e)
    end
    local good = { ssh = "root@127.0.0.1", listen = 7001, store = store, prefix = "/opt/loip" }
    local bad_listen = { ssh = "root@127.0.0.1", listen = "x", store = store, prefix = "/opt/loip" }
    fails({ name = "bad", model = store, token = "t", hosts = { good, bad_listen } }, "hosts[2].listen", "a TCP port")
    fails({ name = "bad", model = store, token = "t", hosts = { { netns = "n1", listen = 7001, store = store, prefix = "/x" } } },
      "hosts[1].address", "a string is needed")
    fails({ name = "bad", model = store, token = "t", hosts = { { ssh = "root@127.0.0.1", listen = 7001, prefix = "/x" } } },
      "hosts[1]", "give the worker cache")
    fails({ name = "bad", model = store, token = "t", hosts = { good }, serve = { max_batchh = 2 } }, "serve.max_batchh", "not a flag")
    fails({ name = "bad", model = dir, token = "t", hosts = { good } }, "model", "%S+ is not a slice store")
    fails({ name = "bad", model = store, hosts = { good } }, "token", "give one of")
    assert.is_false(T.exists(os.getenv("HOME") .. "/.local/state/loip/deploy/bad"), "nothing made")
  end)
end)
