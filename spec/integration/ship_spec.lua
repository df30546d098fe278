-- Blocks shipped, not copied by hand (loip.cluster.ship, loip.cluster.cache): local workers
-- started with a --cache directory and no store get the files their plan reads from the head,
-- each device at most its planned bytes (plus 5%), and give the single device's tokens; a second
-- cluster over the same caches ships nothing; a block damaged on its way (or a partial file with
-- wrong bytes left in the cache) is refused by its checksum, named and sent again; a disk quota
-- too small is an error naming the device, and nothing half-written is used.
local loip = require "loip"
local cluster = require "loip.cluster"
local ship = require "loip.cluster.ship"
local json = require "loip.text.json"
local files = require "loip.runtime.shell"
local T = require "spec.support"
teardown(function() T.cleanup() end)
teardown(T.drop_stores)

local S260 = T.root .. "/models/stories260K"
local greedy = assert(json.load(S260 .. "/reference/greedy.json"))
local ids = greedy.cases[1].sequence_ids

-- 3 devices, one stage each, the first block of each stage offloaded (read from disk every
-- step: it must be shipped too)
local PLAN = { slots = 1, devices = {
  { stages = { { blocks = { 0, 3 }, offloaded = 1 } } },
  { stages = { { blocks = { 4, 6 }, offloaded = 1 } } },
  { stages = { { blocks = { 7, 9 }, offloaded = 0 } } } } }

local function reference(n)
  local m = loip.model.open(S260, { threads = 1, context = 256, tokenizer = false })
  local it, st = m:generate(ids, { temperature = 0, max_tokens = n, stop = {} })
  for _ in it do end
  m:close()
  return st.token_ids
end

local function greedy_ids(c, n)
  local it, st = c:generate(ids, { max_tokens = n, sampler = { temperature = 0 } })
  for _ in it do end
  return st.token_ids
end

-- The bytes of the files device i reads under plan p (default PLAN; the manifest's sizes).
local function planned_bytes(st, c, i, p)
  local man, size = c.man, {}
  for _, f in ipairs(man.files) do size[f.name] = f.size end
  local n = 0
  for _, name in ipairs(ship.files_of(man, p or PLAN, i, c.sizes)) do n = n + size[name] end
  return n
end

-- The block files (not the manifest) a device's cache holds, and their bytes.
local function cached(dir, id)
  local n, names = 0, {}
  for _, name in ipairs(files.list(dir .. "/" .. id) or {}) do
    if name:match("%.bin$") then n, names[#names + 1] = n + files.size(dir .. "/" .. id .. "/" .. name), name end
  end
  table.sort(names)
  return n, names
end

local function with_cluster(opts, f)
  local c = cluster.start_local(setmetatable({ devices = 3, threads = 1, keep_logs = true, dir = T.tmpdir() }, { __index = opts }))
  local ok, err = pcall(f, c)
  c:close()
  assert(ok, err)
end

describe("blocks shipped to workers' caches", function()
  after_each(function() collectgarbage() collectgarbage() end)

  it("ships each device its planned blocks once, checked, and gives the single device's tokens", function()
    local st = T.slice_store(S260, "s260")
    local caches = T.tmpdir()
    local ref = reference(20)
    local first = {}
    with_cluster({ store = st, cache = caches }, function(c)
      c:plan { plan = PLAN, context = 256, batch = 7 }
      assert.are.same(ref, greedy_ids(c, 20))
      for i = 1, 3 do
        local want = planned_bytes(st, c, i)
        local sent = c.devices[i].shipped_bytes
        assert.is_true(sent > 0 and sent <= want * 1.05, string.format("device %d: %d shipped, %d planned", i, sent, want))
        -- on disk: the planned files and no others, whole
        local on_disk, names = cached(caches .. "/device-" .. i, c.store_id)
        assert.is_true(on_disk <= want * 1.05, string.format("device %d: %d cached, %d planned", i, on_disk, want))
        local want_names = ship.files_of(c.man, PLAN, i, c.sizes)
        table.sort(want_names)
        assert.are.same(want_names, names)
        first[i] = sent
      end
      assert.are.same(ship.shipped(c), first)
      -- /metrics: a counter per device
      local m = require("loip.serve.metrics").new()
      ship.metrics(m, c)
      assert.matches('\nloip_shipped_bytes_total{device="2"} ' .. first[2] .. "\n", m:text(), 1, true)
      assert.matches("# TYPE loip_shipped_bytes_total counter", m:text(), 1, true)
    end)
    -- a second cluster over the same caches ships nothing
    with_cluster({ store = st, cache = caches }, function(c)
      c:plan { plan = PLAN, context = 256, batch = 7 }
      assert.are.same({ 0, 0, 0 }, ship.shipped(c))
      assert.are.same(ref, greedy_ids(c, 20))
    end)
  end)

  it("a re-plan after a loss ships what the devices left lack before it takes effect: the same tokens", function()
    local st = T.slice_store(S260, "s260")
    local ref = reference(60)
    with_cluster({ store = st, cache = T.tmpdir() }, function(c)
      c:plan { plan = PLAN, context = 256, batch = 7 }
      local before = ship.shipped(c)
      local d1, d3 = c.devices[1], c.devices[3]
      local it, s = c:generate(ids, { max_tokens = 60, sampler = { temperature = 0 }, stop = {} })
      local n = 0
      for _ in it do
        n = n + 1
        if n == 20 then os.execute("kill -KILL " .. c.devices[2].pid) end
      end
      assert.are.same(ref, s.token_ids)
      assert.are.equal(1, #c.losses)
      -- device 2's blocks went to the two left, shipped to them for the new plan
      local more = (d1.shipped_bytes - before[1]) + (d3.shipped_bytes - before[3])
      assert.is_true(more > 0, "shipped after the loss")
      -- each no more than its new part: what it held already is not sent again
      for i, b in ipairs({ before[1], before[3] }) do
        local want, sent = planned_bytes(st, c, i, c.plan_table), c.devices[i].shipped_bytes - b
        assert.is_true(sent <= want * 1.05, string.format("device %d: %d shipped after the loss, %d planned", i, sent, want))
      end
    end)
  end)

  it("refuses a block damaged on its way or left half-written with wrong bytes, names it and sends it again", function()
    local st = T.slice_store(S260, "s260")
    local caches = T.tmpdir()
    local ref = reference(12)
    local id = require("loip.cluster.device_server").store_id(st)
    -- a partial file of device 2's first block with wrong bytes, left in its cache
    local dir2 = caches .. "/device-2/" .. id
    assert(files.mkdir_p(dir2))
    local f = assert(io.open(dir2 .. "/layer-002-mha.bin.part", "wb"))
    f:write(string.rep("\1", 100))
    f:close()
    -- device 3's first block: one byte flipped on its first way
    local flipped = 0
    ship.tamper = function(i, name, off, bytes)
      if i == 3 and name == "layer-003-mlp.bin" and off == 0 and flipped == 0 then
        flipped = 1
        return string.char((bytes:byte(1) + 1) % 256) .. bytes:sub(2)
      end
      return bytes
    end
    local ok, err = pcall(with_cluster, { store = st, cache = caches }, function(c)
      c:plan { plan = PLAN, context = 256, batch = 7 }
      assert.are.equal(1, flipped)
      assert.are.same(ref, greedy_ids(c, 12))
      local log2, log3 = T.read_or_empty(c.devices[2].log), T.read_or_empty(c.devices[3].log)
      assert.matches("layer%-002%-mha%.bin failed its check", log2)
      assert.matches("layer%-003%-mlp%.bin failed its check", log3)
      -- sent twice: the damaged file counts again (a resumed one: its rest, then all of it)
      local size = {}
      for _, e in ipairs(c.man.files) do size[e.name] = e.size end
      assert.are.equal(planned_bytes(st, c, 3) + size["layer-003-mlp.bin"], c.devices[3].shipped_bytes)
      assert.are.equal(planned_bytes(st, c, 2) + size["layer-002-mha.bin"] - 100, c.devices[2].shipped_bytes)
      -- nothing half-written is left
      for i = 1, 3 do
        for _, name in ipairs(files.list(caches .. "/device-" .. i .. "/" .. id) or {}) do
          assert.is_nil(name:match("%.part$"), name)
        end
      end
    end)
    ship.tamper = nil
    assert(ok, err)
    -- damaged every time: an error naming the file and the device
    ship.tamper = function(i, name, _, bytes)
      if i == 1 and name == "embed.bin" then return string.char((bytes:byte(1) + 1) % 256) .. bytes:sub(2) end
      return bytes
    end
    ok, err = pcall(with_cluster, { store = st, cache = T.tmpdir() }, function(c)
      c:plan { plan = PLAN, context = 256, batch = 7 }
    end)
    ship.tamper = nil
    assert.is_false(ok)
    assert.matches("device 1 %(.-%): embed%.bin failed its checksum twice", err)
  end)

  it("loip worker --cache: running workers with no store get their blocks from loip generate --hosts; --json reports shipped_bytes", function()
    local st = T.slice_store(S260, "s260")
    local token = "spec-ship-" .. os.time()
    local dir = T.tmpdir()
    local pids, eps = {}, {}
    for i = 1, 3 do
      local p = io.popen(string.format("LOIP_CLUSTER_TOKEN=%s %s worker --listen 'tcp://127.0.0.1:*' --cache %s/cache-%d --threads 1 > %s/w%d.out 2> %s/w%d.log & echo $!",
        token, T.loip, dir, i, dir, i, dir, i))
      pids[i] = tonumber(p:read("*l"))
      p:close()
    end
    local ok, err = pcall(function()
      local core = require "loip.core"
      local deadline = core.now_ms() + 60000 -- (a busy machine starts them slowly)
      for i = 1, 3 do
        repeat
          eps[i] = T.read_or_empty(dir .. "/w" .. i .. ".out"):match("listening tcp://(%S+)")
          if not eps[i] then core.sleep_ms(50) end
        until eps[i] or core.now_ms() > deadline
        assert.is_truthy(eps[i], "worker " .. i .. " started")
      end
      local cmd = string.format("LOIP_QUIET=1 %s generate --model %s --hosts %s --token %s --prompt 'Once upon a time' --max-tokens 12 --temperature 0 --context 256 --json",
        T.loip, st, table.concat(eps, ","), token)
      local rc, out, e = T.run(cmd)
      assert.are.equal(0, rc, e)
      local r = assert(json.decode(out:match("{.*}")))
      local alone
      rc, alone, e = T.run(string.format("LOIP_QUIET=1 %s generate --model %s --prompt 'Once upon a time' --max-tokens 12 --temperature 0 --context 256 --json",
        T.loip, st))
      assert.are.equal(0, rc, e)
      assert.are.equal(json.decode(alone:match("{.*}")).text, r.text)
      for i = 1, 3 do
        assert.is_true(r.devices[i].shipped_bytes > 0, "device " .. i)
        assert.are.equal(r.devices[i].shipped_bytes, r.devices[i].estimate.ship_bytes, "device " .. i .. ": as priced")
      end
      -- the workers keep their caches for the next head: nothing shipped again
      rc, out, e = T.run(cmd)
      assert.are.equal(0, rc, e)
      r = assert(json.decode(out:match("{.*}")))
      for i = 1, 3 do assert.are.equal(0, r.devices[i].shipped_bytes, "device " .. i) end
    end)
    for i = 1, 3 do os.execute("kill " .. pids[i] .. " 2>/dev/null") end
    assert(ok, err)
  end)

  it("#net in the testbed (tbf 100 Mbit/s links): empty caches filled once, the single device's tokens; nothing shipped again", function()
    local testbed = require "loip.cluster.testbed"
    local why = testbed.skip_reason()
    if why then pending("testbed skipped: " .. why) return end
    testbed.state_file = T.tmpdir() .. "/state.json"
    local st = T.slice_store(S260, "s260")
    local ref = reference(20)
    local token = "ship-testbed-spec"
    local shipped = {}
    local ok, err = pcall(function()
      local state = testbed.up { n = 3, rate = "100mbit", cache = T.tmpdir(), threads = 1, token = token, exe = T.loip }
      for run = 1, 2 do
        local c = cluster.connect(state.hosts, { store = st, token = token })
        local ok2, err2 = pcall(function()
          -- (the scheduler's plan, over the profiles the workers measure: a cache worker has no store to read)
          c:plan { context = 256, batch = 8 }
          assert.are.same(ref, greedy_ids(c, 20))
          for i = 1, 3 do
            local want = planned_bytes(st, c, i, c.plan_table)
            local sent = c.devices[i].shipped_bytes or 0
            if run == 1 then
              assert.is_true(sent <= want * 1.05, string.format("device %d: %d shipped, %d planned", i, sent, want))
              shipped[i] = sent
            else
              assert.are.equal(0, sent, "device " .. i .. " again")
            end
          end
        end)
        c:close()
        assert(ok2, err2)
      end
      local total = 0
      for i = 1, 3 do total = total + shipped[i] end
      assert.is_true(total > 0)
    end)
    testbed.down()
    assert(ok, err)
  end)

  it("the cost model prices shipping: loip plan --json reports each device's ship_bytes and the ship time", function()
    local st = T.slice_store(S260, "s260")
    local man = assert(json.load(st .. "/manifest.json"))
    local rc, out, err = T.run(string.format("LOIP_QUIET=1 %s plan --model %s --devices 3 --link-rate 1mbit --json", T.loip, st))
    assert.are.equal(0, rc, err)
    local r = assert(json.decode(out:match("{.*}")))
    -- every block once, the embedding twice (device 1, and the tied head on device 3), the head
    local want, sum = 0, 0
    for _, f in ipairs(man.files) do want = want + f.size * (f.name == "embed.bin" and 2 or 1) end
    for i = 1, 3 do
      assert.is_true(r.devices[i].ship_bytes > 0)
      sum = sum + r.devices[i].ship_bytes
    end
    assert.are.equal(want, sum)
    -- one device after another, each over its link (1 Mbit/s: 125000 bytes/s)
    assert.is_true(math.abs(r.ship_ms - sum / 125000 * 1000) < 1e-6 * r.ship_ms)
  end)

  it("a disk quota too small is an error naming the device, before anything is shipped there", function()
    local st = T.slice_store(S260, "s260")
    local caches = T.tmpdir()
    local ok, err = pcall(with_cluster, { store = st, cache = caches, disk_quota = { 0, 4096, 0 } }, function(c)
      c:plan { plan = PLAN, context = 256, batch = 7 }
    end)
    assert.is_false(ok)
    assert.matches("device 2 %(.-%): %-%-disk%-quota 4%.0 KiB of the cache .- cannot hold", err)
    local id = require("loip.cluster.device_server").store_id(st)
    assert.are.same({}, select(2, cached(caches .. "/device-2", id)))
  end)
end)
