-- A head never hangs and leaves nothing behind: local workers die with it however it ends
-- (kill -9 of the head used to leave them running and its directory, key included, in /tmp),
-- a Lua error with a cluster open exits at once (it used to hang in zmq_ctx_term), a worker
-- serves one head and refuses another at once naming it (the second used to take it over), a
-- head with the wrong token is told so at once (it used to wait 10 s for HELLO), and --hosts
-- without a secret is a usage error (it used to pick a random token).
local core = require "loip.core"
local cluster = require "loip.cluster"
local T = require "spec.support"
teardown(function() T.cleanup() end)
local C = core.C

local S260 = T.root .. "/models/stories260K"
local store_of = T.slice_store
teardown(T.drop_stores)

local alive = require("loip.cluster.proc").alive
local function exists(p) return os.execute("test -e '" .. p .. "'") == 0 end
local function read(p) return require("loip.text.json").read_file(p) or "" end -- "" until it exists

-- A head script run as its own process: it prints its directory and workers' pids, then runs
-- `tail` (Lua source).
local function start_head(store, tail)
  local dir = T.tmpdir()
  T.write(dir .. "/head.lua", string.format([[
local cluster = require "loip.cluster"
local C = require("loip.core").C
local c = cluster.start_local { store = %q, devices = 3, threads = 1 }
c:plan { context = 64, plan = { slots = 1, devices = { { stages = { { blocks = { 0, 3 }, offloaded = 0 } } },
  { stages = { { blocks = { 4, 6 }, offloaded = 0 } } }, { stages = { { blocks = { 7, 9 }, offloaded = 0 } } } } } }
local pids = {}
for _, d in ipairs(c.devices) do pids[#pids + 1] = d.pid end
io.stdout:write("head ", c.dir, " ", table.concat(pids, " "), "\n")
io.stdout:flush()
%s
]], store, tail))
  local p = io.popen(string.format("%s run %s/head.lua > %s/out 2> %s/err & echo $!", T.loip, dir, dir, dir))
  local pid = tonumber(p:read("*l"))
  p:close()
  local line
  for _ = 1, 2400 do -- (up to 2 minutes on a busy machine; a head that died ends the wait)
    line = read(dir .. "/out"):match("head [^\n]+")
    if line or not alive(pid) then break end
    C.loip_sleep_ms(50)
  end
  if not line then os.execute("kill -9 " .. pid) end
  assert.is_truthy(line, "the head started its cluster: " .. read(dir .. "/err"))
  local words = {}
  for w in line:gmatch("%S+") do words[#words + 1] = w end
  return pid, words[2], { tonumber(words[3]), tonumber(words[4]), tonumber(words[5]) }, dir
end

-- Wait up to ms for check() to hold; the ms it took, or nil.
local function within(ms, check)
  local t0 = core.now_ms()
  repeat
    if check() then return core.now_ms() - t0 end
    C.loip_sleep_ms(20)
  until core.now_ms() - t0 > ms
  return nil
end

local function gone(pids, dir)
  return function()
    for _, p in ipairs(pids) do if alive(p) then return false end end
    return not exists(dir)
  end
end

describe("a head's lifecycle", function()
  -- (what follows a head's end is waited for up to 30 s: on an idle machine it takes well under
  -- 2 s, a busy one may be slower, and what fails is a worker or directory never gone)
  it("kill -9 of the head leaves no worker and no directory", function()
    local st = store_of(S260, "s260")
    -- (SIGINT from a terminal ends a head as SIGTERM does; a background job of a script, as
    -- here, ignores it, so it is not sent)
    for _, sig in ipairs({ "KILL", "TERM" }) do
      local pid, dir, workers = start_head(st, "C.loip_sleep_ms(60000)")
      assert.is_true(exists(dir .. "/secret.key") or exists(dir), "the head's directory exists while it runs")
      os.execute("kill -" .. sig .. " " .. pid)
      local took = within(30000, gone(workers, dir))
      assert.is_truthy(took, "the workers and " .. dir .. " are gone (" .. sig .. "; waited 30 s)")
    end
  end)

  it("a Lua error with a cluster open exits, leaving nothing", function()
    local st = store_of(S260, "s260")
    local pid, dir, workers, sdir = start_head(st, "error('boom')")
    local took = within(30000, function() return not alive(pid) end)
    assert.is_truthy(took, "the head exited after its error (waited 30 s)")
    assert.matches("boom", T.read(sdir .. "/err"))
    assert.is_truthy(within(30000, gone(workers, dir)), "its workers and directory went with it (waited 30 s)")
  end)

  it("a worker serves one head: another is refused at once, naming it; a released worker serves the next", function()
    local st = store_of(S260, "s260")
    local token = "spec-lifecycle-" .. os.time()
    local out = T.tmpdir() .. "/worker.out"
    local p = io.popen(string.format("LOIP_CLUSTER_TOKEN=%s %s worker --listen 'tcp://127.0.0.1:*' --store %s --threads 1 > %s 2>/dev/null & echo $!",
      token, T.loip, st, out))
    local wpid = tonumber(p:read("*l"))
    p:close()
    local ep
    within(60000, function()
      ep = (read(out):match("listening (%S+)"))
      return ep ~= nil or not alive(wpid)
    end)
    local ok, err = pcall(function()
      assert.is_truthy(ep, "the worker printed its endpoint")
      local c1 = cluster.connect({ ep }, { store = st, token = token })
      c1:plan { context = 64 }
      -- (refused, not timed out: the message names the head it serves; a wait would say that
      -- the device did not answer)
      local rc, _, e2 = T.run(string.format("%s generate --model %s --hosts %s --token %s --prompt hi --max-tokens 2",
        T.loip, st, ep:gsub("^tcp://", ""), token))
      assert.are.equal(1, rc)
      assert.matches("this worker serves head " .. c1.identity, e2, 1, true)
      -- the first head is undisturbed
      local it, s = c1:generate({ 1, 403, 407 }, { max_tokens = 3, sampler = { temperature = 0 } })
      for _ in it do end
      assert.are.equal(3, #s.token_ids)
      c1:close()
      rc = T.run(string.format("%s generate --model %s --hosts %s --token %s --prompt hi --max-tokens 2",
        T.loip, st, ep:gsub("^tcp://", ""), token))
      assert.are.equal(0, rc)
      -- a head with another token is told so (in words: not a device that did not answer)
      local ok2, e3 = pcall(cluster.connect, { ep }, { store = st, token = "another-token" })
      assert.is_false(ok2)
      assert.matches("device 1 (" .. ep .. ") refused our key: wrong cluster token?", e3, 1, true)
    end)
    os.execute("kill " .. wpid)
    within(30000, function() return not alive(wpid) end)
    assert(ok, err)
  end)

  it("--hosts without a token or key is a usage error", function()
    local rc, _, err = T.run(string.format("env -u LOIP_CLUSTER_TOKEN %s generate --model %s --hosts 127.0.0.1:1 --prompt hi",
      T.loip, store_of(S260, "s260")))
    assert.are.equal(2, rc)
    assert.matches("--hosts needs the cluster's secret", err, 1, true)
  end)
end)
