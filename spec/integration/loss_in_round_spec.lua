-- A device lost in a control round-trip of a request (not in a step) is a loss as a step's is:
-- the others plan again and every request resumes from its tokens, with the single device's
-- tokens. Each case meets the dead device at a chosen point: the START of a request admitted
-- while another runs, the prefix cache's LOOKUP round before it, the START of an n = 2 request's
-- second choice (sharing the first's prompt), the STATS round of an online policy that reads the
-- links (a device stopped: its heartbeat silent, not its process gone, as a remote one's).
local loip = require "loip"
local cluster = require "loip.cluster"
local core = require "loip.core"
local alive = require("loip.cluster.proc").alive
local T = require "spec.support"
teardown(function() T.cleanup() end)

local S260 = T.root .. "/models/stories260K"
teardown(T.drop_stores)

local P1, P2 = { 1, 403, 407, 261, 31 }, { 1, 90, 22, 451, 17, 300, 41, 12, 77, 9, 130, 11, 5, 66, 200, 19, 88, 3 }
local N = 40
local GREEDY = { temperature = 0 }

local refs = {}
local function reference(prompt)
  local key = table.concat(prompt, ",")
  if not refs[key] then
    local m = loip.model.open(S260, { context = 256, threads = 1 })
    local it, s = m:generate(prompt, { max_tokens = N, temperature = 0, stop = {} })
    for _ in it do end
    m:close()
    refs[key] = s.token_ids
  end
  return refs[key]
end

-- A 3-device local cluster planned with popts, its batcher made with bopts; run(c, b), the
-- cluster closed however run ends.
local function with_cluster(popts, bopts, run)
  local c = cluster.start_local { store = T.slice_store(S260, "s260"), devices = 3, threads = 1 }
  local ok, err = pcall(function()
    c:plan(popts)
    run(c, c:batcher(bopts))
  end)
  c:close()
  if not ok then error(err, 0) end
end

local function kill(pid)
  os.execute("kill -KILL " .. pid)
  local deadline = core.now_ms() + 30000
  while alive(pid) do
    assert(core.now_ms() < deadline, "worker " .. pid .. " died")
    core.sleep_ms(5)
  end
end

-- Every request done with the single device's tokens; one loss, device 2's, two devices left.
local function check(c, b, reqs, prompts)
  b:drain()
  for i, r in ipairs(reqs) do
    for _, x in ipairs(r.choices or { r }) do
      assert.are.equal("length", x.finish_reason, tostring(x.error))
      assert.are.same(reference(prompts[i]), x.token_ids)
    end
  end
  assert.are.equal(1, #(c.losses or {}))
  assert.are.same({ 2 }, c.losses[1].devices)
  assert.is_true(c.losses[1].replanned)
  assert.are.equal(2, #c.devices)
end

local POPTS = { context = 256, batch = 32, stages = 2, max_batch = 3, kv_tokens = 768 }

describe("a device lost in a request's control round", function()
  for _, cached in ipairs({ false, true }) do
    it(string.format("is a loss when met by the %s of a request admitted while another runs", cached and "LOOKUP" or "START"),
      function()
      with_cluster(POPTS, { prefix_cache = cached or nil }, function(c, b)
        local r1 = b:submit { prompt = P1, max_tokens = N, sampler = GREEDY, stop = {} }
        for _ = 1, 5 do b:step() end
        local pid = c.devices[2].pid
        kill(pid)
        -- (admitted at once: its round meets the dead device before any step does)
        local r2 = b:submit { prompt = P2, max_tokens = N, sampler = GREEDY, stop = {} }
        assert.matches(" exited", c.losses[1].why)
        check(c, b, { r1, r2 }, { P1, P2 })
        assert.are.equal(1, b.resumes)
      end)
    end)
  end

  it("is a loss when met by the START of an n = 2 request's second choice", function()
    with_cluster(POPTS, nil, function(c, b)
      local r1 = b:submit { prompt = P1, max_tokens = N, sampler = GREEDY, stop = {} }
      for _ = 1, 3 do b:step() end
      -- the dead device met exactly when the second choice starts on the first's prompt
      local start, pid = c.ring.start, c.devices[2].pid
      c.ring.start = function(self, seq, r)
        if r.share and alive(pid) then kill(pid) end
        return start(self, seq, r)
      end
      local r2 = b:submit { prompt = P2, n = 2, max_tokens = N, sampler = GREEDY, stop = {} }
      check(c, b, { r1, r2 }, { P1, P2 })
    end)
  end)

  it("is a loss when an online policy's STATS round meets a device whose heartbeat is silent", function()
    -- (a policy that only reads the links' figures: a STATS round every step)
    local links = { name = "links", on_step = function(state) assert(state.links) end }
    with_cluster({ context = 256, batch = 32, stages = 2, max_batch = 3, kv_tokens = 768, online = links }, nil, function(c, b)
      local r1 = b:submit { prompt = P1, max_tokens = N, sampler = GREEDY, stop = {} }
      for _ = 1, 5 do b:step() end
      -- device 2 stopped (SIGSTOP) just before the next STATS round: not gone, silent, as a
      -- remote device that died is
      local stats, pid, stopped = c.stats, c.devices[2].pid, false
      c.stats = function(self)
        if not stopped then stopped = true os.execute("kill -STOP " .. pid) end
        return stats(self)
      end
      local ok, err = pcall(check, c, b, { r1 }, { P1 })
      os.execute("kill -CONT " .. pid .. " 2>/dev/null")
      assert(ok, err)
      assert.matches("has not answered for", c.losses[1].why)
    end)
  end)
end)
