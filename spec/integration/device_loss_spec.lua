-- A lost device costs a re-plan, not the request: a local worker killed (-9) or stopped
-- (SIGSTOP) mid-generation leaves the cluster, the others are planned again and every request
-- in flight goes on from its tokens with exactly the tokens a single device gives; greedy and
-- seeded sampling alike; during a burst of concurrent requests too; the lost local device is
-- started again and taken back for the next request. --on-device-loss fail keeps the old
-- behaviour: a clear error.
local loip = require "loip"
local cluster = require "loip.cluster"
local T = require "spec.support"
teardown(function() T.cleanup() end)

local S260 = T.root .. "/models/stories260K"
local store_of = T.slice_store
teardown(T.drop_stores)

local PROMPTS = { { 1, 403, 407, 261, 31 }, { 1, 90, 22, 451 }, { 1, 320, 77, 9, 130, 11 } }

local function reference(prompt, n, temperature)
  local m = loip.model.open(S260, { context = 256, threads = 1 })
  local it, s = m:generate(prompt, { max_tokens = n, temperature = temperature, seed = 7, stop = {} })
  for _ in it do end
  m:close()
  return s.token_ids
end

-- A 3-device local cluster; run(c) with it, closed however run ends.
local function with_cluster(popts, run)
  local c = cluster.start_local { store = store_of(S260, "s260"), devices = 3, threads = 1 }
  local ok, err = pcall(function()
    c:plan(popts)
    run(c)
  end)
  c:close()
  if not ok then error(err, 0) end
end

describe("losing a device", function()
  for _, case in ipairs({ { "KILL", 0 }, { "KILL", 0.9 }, { "STOP", 0 } }) do
    local sig, temp = case[1], case[2]
    it(string.format("re-plans over the others when one is %s mid-generation (temperature %g): the same tokens",
      sig == "KILL" and "killed (-9)" or "stopped (SIGSTOP, resumed later)", temp), function()
      local ref = reference(PROMPTS[1], 120, temp)
      with_cluster({ context = 256, batch = 16, stages = 2 }, function(c)
        local it, st = c:generate(PROMPTS[1], { max_tokens = 120, sampler = { temperature = temp }, seed = 7, stop = {} })
        local n, pid = 0, c.devices[2].pid
        local t_lost
        for _ in it do
          n = n + 1
          if n == 40 then
            os.execute("kill -" .. sig .. " " .. pid)
            t_lost = require("loip.core").now_ms()
          end
        end
        if sig == "STOP" then os.execute("kill -CONT " .. pid .. " 2>/dev/null") end
        assert.are.same(ref, st.token_ids)
        assert.are.equal(1, #c.losses)
        local l = c.losses[1]
        assert.are.same({ 2 }, l.devices)
        assert.are.equal(2, l.devices_left)
        assert.are.equal(2, #c.devices)
        assert.matches(sig == "KILL" and "died during the request" or "has not answered for", l.why)
        -- (a re-plan takes well under a second here; the bound only catches one that hangs)
        assert.is_true(l.replan_ms < 60000, "re-planned in " .. l.replan_ms .. " ms")
        assert.is_false(require("loip.cluster.proc").alive(pid))
        assert.is_not_nil(t_lost)
      end)
    end)
  end

  it("takes a lost local device back for the next request: a new plan over all three, the same tokens", function()
    local ref = reference(PROMPTS[1], 60, 0)
    with_cluster({ context = 256, batch = 16, stages = 2 }, function(c)
      local it, st = c:generate(PROMPTS[1], { max_tokens = 60, sampler = { temperature = 0 }, stop = {} })
      local n = 0
      for _ in it do
        n = n + 1
        if n == 20 then os.execute("kill -KILL " .. c.devices[3].pid) end
      end
      assert.are.same(ref, st.token_ids)
      assert.are.equal(2, #c.devices)
      local it2, st2 = c:generate(PROMPTS[1], { max_tokens = 60, sampler = { temperature = 0 }, stop = {} })
      for _ in it2 do end
      assert.are.equal(3, #c.devices)
      assert.are.equal(1, c.taken_back)
      assert.are.equal(3, #c.plan_table.devices)
      assert.are.same(ref, st2.token_ids)
      for _, d in ipairs(c.devices) do assert.is_true(require("loip.cluster.proc").alive(d.pid)) end
    end)
  end)

  it("takes back a --hosts worker that answers again (restarted on its port) for the next request", function()
    local ref = reference(PROMPTS[1], 60, 0)
    local st = store_of(S260, "s260")
    local token = "spec-device-loss-" .. os.time()
    local dir = T.tmpdir()
    local pids = {}
    -- a worker on endpoint ep ("tcp://127.0.0.1:*": any port); its pid and the endpoint it took
    local function worker(k, ep)
      local out = string.format("%s/worker-%d-%d.out", dir, k, #pids)
      local p = io.popen(string.format("LOIP_CLUSTER_TOKEN=%s %s worker --listen '%s' --store %s --threads 1 > %s 2>/dev/null & echo $!",
        token, T.loip, ep, st, out))
      local pid = tonumber(p:read("*l"))
      p:close()
      pids[#pids + 1] = pid
      local got
      for _ = 1, 2400 do -- (up to a minute on a busy machine; a worker that died ends the wait)
        local f = io.open(out) -- (made when the shell starts it)
        got = f and f:read("*a"):match("listening (%S+)")
        if f then f:close() end
        if got or not require("loip.cluster.proc").alive(pid) then break end
        require("loip.core").C.loip_sleep_ms(25)
      end
      assert(got, "worker " .. k .. " started")
      return pid, got
    end
    local ok, err = pcall(function()
      local eps, wp = {}, {}
      for k = 1, 3 do wp[k], eps[k] = worker(k, "tcp://127.0.0.1:*") end
      local c = cluster.connect(eps, { store = st, token = token })
      local cok, cerr = pcall(function()
        c:plan { context = 256, batch = 16, stages = 2 }
        local it, s1 = c:generate(PROMPTS[1], { max_tokens = 60, sampler = { temperature = 0 }, stop = {} })
        local n = 0
        for _ in it do
          n = n + 1
          if n == 20 then os.execute("kill -KILL " .. wp[2]) end
        end
        assert.are.same(ref, s1.token_ids)
        assert.are.equal(2, #c.devices)
        -- while it is away, requests run on the other two
        local it2, s2 = c:generate(PROMPTS[1], { max_tokens = 60, sampler = { temperature = 0 }, stop = {} })
        for _ in it2 do end
        assert.are.same(ref, s2.token_ids)
        assert.are.equal(2, #c.devices)
        -- back on its port: the next request finds it
        worker(2, eps[2])
        require("loip.core").C.loip_sleep_ms(2100) -- (a device away is asked again every 2 s)
        local it3, s3 = c:generate(PROMPTS[1], { max_tokens = 60, sampler = { temperature = 0 }, stop = {} })
        for _ in it3 do end
        assert.are.same(ref, s3.token_ids)
        assert.are.equal(3, #c.devices)
        assert.are.equal(eps[2], c.devices[2].endpoint)
        assert.are.equal(1, c.taken_back)
        assert.are.equal(3, #c.plan_table.devices)
      end)
      c:close()
      assert(cok, cerr)
    end)
    for _, pid in ipairs(pids) do os.execute("kill " .. pid .. " 2>/dev/null") end
    assert(ok, err)
  end)

  it("goes on with every request of a burst, each with its own tokens", function()
    local refs = {}
    for i, p in ipairs(PROMPTS) do refs[i] = reference(p, 60, 0) end
    with_cluster({ context = 256, batch = 32, stages = 2, max_batch = 3, kv_tokens = 768 }, function(c)
      local b = c:batcher()
      local reqs = {}
      for i, p in ipairs(PROMPTS) do
        reqs[i] = b:submit { prompt = p, max_tokens = 60, sampler = { temperature = 0 }, stop = {} }
      end
      local pid = c.devices[3].pid
      for _ = 1, 25 do b:step() end
      os.execute("kill -KILL " .. pid)
      b:drain()
      for i, r in ipairs(reqs) do
        assert.are.equal("length", r.finish_reason, tostring(r.error))
        assert.are.same(refs[i], r.token_ids)
      end
      assert.are.equal(1, #c.losses)
      assert.are.equal(1, b.resumes)
    end)
  end)

  it("counts a loss the others cannot take over: /health says so, the error is one line", function()
    -- budgets three devices can share the model under and two cannot
    local c = cluster.start_local { store = store_of(S260, "s260"), devices = 3, threads = 1, mem = 900 * 1024 }
    local ok, err = pcall(function()
      c:plan { context = 512, batch = 64, ends = "memory" } -- (the budgets count the embedding and head in memory)
      local srv = require("loip.serve.server").new { cluster = c, tokenizer = c:tokenizer(), quiet = true }
      local okh, herr = pcall(function()
        local it = c:generate(PROMPTS[1], { max_tokens = 100, sampler = { temperature = 0 }, stop = {} })
        local n = 0
        local okg, gerr = pcall(function()
          for _ in it do
            n = n + 1
            if n == 10 then os.execute("kill -KILL " .. c.devices[2].pid) end
          end
        end)
        assert.is_false(okg)
        local msg = tostring(gerr)
        assert.matches("^lost device 2: device 2 %(.-, pid %d+%) died during the request; the 2 left cannot take over: ", msg)
        assert.is_nil(msg:find("\n", 1, true), msg)           -- no worker log lines in it
        assert.matches("short", msg)                          -- the scheduler's shortfall
        local h = srv:health()
        assert.are.equal(1, h.device_losses)
        assert.are.equal("degraded", h.status)
        assert.is_false(h.losses[1].replanned)
        assert.are.same({ 2 }, h.losses[1].devices)
      end)
      srv:close()
      if not okh then error(herr, 0) end
    end)
    c:close()
    if not ok then error(err, 0) end
  end)

  it("stops the request with a clear error under on_device_loss = fail", function()
    with_cluster({ context = 256, batch = 16, stages = 2, on_device_loss = "fail" }, function(c)
      local it = c:generate(PROMPTS[1], { max_tokens = 120, sampler = { temperature = 0 }, stop = {} })
      local n = 0
      local ok, err = pcall(function()
        for _ in it do
          n = n + 1
          if n == 20 then os.execute("kill -KILL " .. c.devices[2].pid) end
        end
      end)
      assert.is_false(ok)
      assert.matches("device 2 .* died during the request", tostring(err))
      assert.is_nil(c.losses)
    end)
  end)
end)
