-- Policies with settings (issue 25): a policy declares its settings (M.settings) and reads them
-- from the params the loader resolves and hands it; a name carries them (NAME:KEY=VALUE,...) on
-- every flag that names a policy; an unknown setting or a bad value is refused naming it; `loip
-- help policies` lists every kind's policies with their settings; every kind lives under
-- recipes/policies/<kind>/; state.kv_block is the KV group the policies count in.
local json = require "loip.text.json"
local policy = require "loip.policy"
local T = require "spec.support"
teardown(T.drop_stores)

local function refused(...)
  local ok, err = pcall(policy.load, ...)
  assert.is_false(ok, "accepted")
  return tostring(err)
end

-- One device of 4 blocks of 100 bytes, all resident, one stage, a slot of 200 bytes, 10 bytes a
-- KV group, a budget of 445 bytes; one request at 20 positions (2 groups: 420 bytes after the
-- step) that may go to 1000. Within 32 positions it takes 2 more groups (440: fits), within 64,
-- 4 (460: one block offloaded makes room).
local function one_device_state(kv_block)
  return {
    step = 5, context = 20, groups = 2, memo = {}, kv_block = kv_block or 16,
    requests = { { id = 1, positions = 20, max_positions = 1000, evicted = 0, prompt_positions = 4 } },
    devices = { { limit = 445, nonkv = 400, kv_base = 0, group_bytes = 10, chunk_bytes = 5, slot_bytes = 200,
      block_bytes = { [0] = 100, 100, 100, 100 }, stages = { { first = 0, last = 3, offloaded = 0, kv_layers = 2 } } } },
  }
end

-- The changes an online policy makes for a state.
local function changes(p, st)
  local out = {}
  local control = {
    restage = function(i, s, n) out[#out + 1] = string.format("restage %d.%d -> %d", i, s, n) end,
    evict = function(id, positions) out[#out + 1] = string.format("evict %d: %d", id, positions) end,
    lend = function() error("no lending on one device") end,
    log = function() end,
  }
  p.on_step(st, control)
  return out
end

describe("a policy's settings", function()
  after_each(function() T.cleanup() collectgarbage() collectgarbage() end)

  it("change what the online policy does (lookahead was a module constant an override never reached)", function()
    assert.are.same({}, changes(policy.load("online", "loip"), one_device_state()))
    assert.are.same({}, changes(policy.load("online", "loip:lookahead=32"), one_device_state()))
    assert.are.same({ "restage 1.1 -> 1" }, changes(policy.load("online", "loip:lookahead=64"), one_device_state()))
    assert.are.same({ "restage 1.1 -> 1" }, changes(policy.load("online", "loip", { lookahead = 64 }), one_device_state()))
    -- thresholds is loip without lending: the same settings, less lend
    assert.are.same({ "restage 1.1 -> 1" }, changes(policy.load("online", "thresholds:lookahead=64"), one_device_state()))
    assert.matches("no setting 'lend'", refused("online", "thresholds:lend=on"), 1, true)
    local p = policy.load("online", "loip:lookahead=64,lend=off")
    assert.are.same({ lookahead = 64, lend = false, window_share = 0.7, min_change = 2, rate_horizon = 96 }, p.params)
    assert.are.same({ lookahead = "64", lend = "off" }, p.given)
  end)

  it("count KV groups of state.kv_block positions", function()
    -- a request at 20 positions holds 2 groups of 16, 1 of 32; the budget below holds 1 group:
    -- recompute evicts whole groups of the engine's size
    local function st(kb)
      local s = one_device_state(kb)
      s.requests[1].positions, s.groups = 70, kb == 16 and 5 or 3
      s.devices[1].limit = 400 + 10 * 2
      return s
    end
    assert.are.same({ "evict 1: 48" }, changes(policy.load("online", "recompute"), st(16)))
    assert.are.same({ "evict 1: 32" }, changes(policy.load("online", "recompute"), st(32)))
  end)

  it("are refused when unknown, naming the setting, the policy and the ones it has; bad values name the type", function()
    local err = refused("online", "loip:lookahed=64")
    assert.matches("online loip: no setting 'lookahed' (did you mean 'lookahead'?) (its settings: lookahead, lend, "
      .. "window_share, min_change, rate_horizon)", err, 1, true)
    assert.matches("online recompute: no setting 'lookahead' (it has no settings)", refused("online", "recompute:lookahead=1"), 1, true)
    assert.matches("online loip: setting 'lookahead' must be a whole number (int), not 'lots'",
      refused("online", "loip:lookahead=lots"), 1, true)
    assert.matches("online loip: setting 'lookahead' = 0: must be >= 1", refused("online", "loip", { lookahead = 0 }), 1, true)
    assert.matches("online loip: setting 'lend' must be on or off", refused("online", "loip:lend=maybe"), 1, true)
    assert.matches("setting 'refine' must be on or off", refused("scheduler", "loip", { refine = "perhaps" }), 1, true)
    assert.matches("'lookahead' is not KEY=VALUE", refused("online", "loip:lend=on,lookahead"), 1, true)
    assert.matches("the setting 'lend' is given twice", refused("online", "loip:lend=on,lend=off"), 1, true)
    -- a file of one's own: its settings, and a declaration that is not one, naming the file
    local dir = T.tmpdir()
    T.write(dir .. "/mine.lua", "local M = { name = 'mine', settings = { { 'spread', 'number', 'how far', default = 1 } } }\n"
      .. "function M.at(step, o) return o.spread * step end\nreturn M\n")
    assert.are.equal(2.5 * 4, policy.load("links", dir .. "/mine.lua:spread=2.5").at(4))
    assert.are.equal(4, policy.load("links", dir .. "/mine.lua").at(4))
    assert.matches("links mine (" .. dir .. "/mine.lua): no setting 'sprad'", refused("links", dir .. "/mine.lua:sprad=2"), 1, true)
    T.write(dir .. "/bad.lua", "return { settings = { { 'x', 'integer', 'what' } }, at = function() end }\n")
    assert.matches(dir .. "/bad.lua: settings[1] is not { NAME, TYPE, HELP, default = ... } with TYPE one of bool, int, list, "
      .. "number, string", refused("links", dir .. "/bad.lua"), 1, true)
  end)

  it("reach the scheduler (its opts were unreachable) and the patterns", function()
    -- 3 devices of 20, 10 and 20 MiB for 4 layers of 2 + 6 MiB: the refinements move blocks
    local MiB = 1024 * 1024
    local prob = { model = T.model_sizes(4, 2 * MiB, 6 * MiB), devices = {}, links = {}, micro_batch = 1, cluster = true,
      loader = "uring", context = 256, batch = 16, head = { step_ms = 0.1, from_last = { transport_ms = 0.1 } } }
    for i, b in ipairs({ 20 * MiB, 10 * MiB, 20 * MiB }) do
      prob.devices[i] = { budget = b, compute = { mha_ms = 0.2 * i, mlp_ms = 0.6, head_ms = 0.4, embed_ms = 0.01, stage_ms = 0,
        under_load = 1.2 }, disk_bps = 1e9, load_ms = 0.05, slowdown = 1 }
      prob.links[i] = { rate_bps = 125e6, delay_ms = 0.1, transport_ms = 0.1 }
    end
    prob.head.to_first = prob.links[3]
    prob.ends = {} -- (the embedding and head in memory: the plan compared is the scheduler's own; loip.plan.ends)
    local cost = policy.load("cost", "loip")
    local _, on = policy.load("scheduler", "loip").schedule(prob, cost)
    local _, off = policy.load("scheduler", "loip:refine=off").schedule(prob, cost)
    assert.are.equal("template (DP), relaid out", on.layout)
    assert.are.equal("template (DP)", off.layout)
    assert.is_true(off.ms_per_token > on.ms_per_token)
    local q, est = policy.plan(prob, { scheduler = "loip:refine=off" })
    assert.are.same(q, (policy.load("scheduler", "loip").module.search(prob, cost, { refine = false })))
    assert.near(off.ms_per_token, est.ms_per_token, 1e-9)
    -- a pattern's settings win over the caller's opts, which win over its defaults
    local function bursts(name, opts)
      local n = 0
      for _, a in ipairs(policy.load("pattern", name).requests(opts)) do if a.after == nil then n = n + 1 end end
      return n
    end
    assert.are.equal(4, bursts("bursty", {}))
    assert.are.equal(2, bursts("bursty", { burst = 2 }))
    assert.are.equal(8, bursts("bursty:burst=8", { burst = 2 }))
    local sw = policy.load("links", "switch:every=2,rates=1mbit/2mbit/3mbit")
    assert.are.same({ "1mbit", "2mbit", "3mbit", "1mbit" }, { sw.at(1), sw.at(3), sw.at(5), sw.at(7) })
    assert.is_nil(sw.at(2))
  end)

  it("keep every kind under recipes/policies/<kind>/, and a path into a folder that moved still loads", function()
    for _, kind in ipairs(policy.kind_names()) do
      local names = policy.list(kind)
      assert.is_true(#names > 0, kind)
      assert.are.equal(policy.recipes_dir() .. "/policies/" .. kind .. "/" .. names[1] .. ".lua", policy.load(kind, names[1]).path)
    end
    local p = policy.load("pattern", policy.recipes_dir() .. "/patterns/bursty.lua:burst=3")
    assert.are.equal(policy.recipes_dir() .. "/policies/pattern/bursty.lua", p.path)
    assert.are.equal(3, #p.requests({}))
    -- the notice once, however often the old path is loaded
    local dir = T.tmpdir()
    T.write(dir .. "/twice.lua", string.format([[
      local policy = require "loip.policy"
      policy.load("links", %q)
      policy.load("links", %q)]], policy.recipes_dir() .. "/links/switch.lua", policy.recipes_dir() .. "/links/switch.lua"))
    local rc, _, err = T.run(T.loip .. " run " .. dir .. "/twice.lua")
    assert.are.equal(0, rc, err)
    local _, notices = err:gsub("moved to recipes/policies/links/", "")
    assert.are.equal(1, notices, err)
  end)

  it("takes a setting's value from Lua as the command line writes it: a bool as 1/0 too", function()
    assert.is_false(policy.load("online", "loip", { lend = 0 }).params.lend)
    assert.is_true(policy.load("online", "loip", { lend = 1 }).params.lend)
    assert.is_false(policy.load("online", "loip", { lend = false }).params.lend)
  end)
end)

describe("the command line", function()
  after_each(function() T.cleanup() collectgarbage() collectgarbage() end)

  it("passes settings with a policy's name: --online loip:lookahead=128 offloads earlier than the default", function()
    local st = T.slice_store(T.root .. "/models/stories260K", "s260")
    local args = string.format("%s simulate --model %s --devices 2 --mem 960K,960K --context 512 --stages 3 --requests 1 "
      .. "--input-tokens 4 --output-tokens 380 --plan-tokens 32 --json --online ", T.loip, st)
    local function loads(online)
      local rc, out, err = T.run(args .. online)
      assert.are.equal(0, rc, err)
      local j = json.decode(out)
      assert.are.equal(online, j.online)
      local ms = {}
      for i, d in ipairs(j.devices) do ms[i] = d.load_ms end
      return ms
    end
    local default, same, early = loads("loip"), loads("loip:lookahead=32"), loads("loip:lookahead=128")
    assert.are.same(default, same)
    for i = 1, 2 do assert.is_true(early[i] > default[i], "device " .. i .. " reads more from the start") end
    local rc, _, err = T.run(args .. "loip:lookahed=128")
    assert.are.equal(1, rc)
    assert.matches("online loip: no setting 'lookahed'", err, 1, true)
  end)

  it("loip help policies lists every kind's policies and their settings; loip policy show one", function()
    local rc, out, err = T.run(T.loip .. " help policies")
    assert.are.equal(0, rc, err)
    for _, kind in ipairs(policy.kind_names()) do
      assert.truthy(out:find("\n" .. kind .. " (", 1, true), kind)
      for _, name in ipairs(policy.list(kind)) do
        assert.truthy(out:find("\n  " .. name .. " ", 1, true), kind .. " " .. name)
      end
    end
    for _, line in ipairs({ "lookahead=32", "lend=on", "refine=on", "burst=4", "rates=50mbit/250mbit" }) do
      assert.truthy(out:find("\n      " .. line .. " ", 1, true), line)
    end
    rc, out, err = T.run(T.loip .. " policy show online loip")
    assert.are.equal(0, rc, err)
    assert.matches("online loip (", out, 1, true)
    assert.matches("lookahead=32 +int +KV positions of headroom", out)
    rc, out = T.run(T.loip .. " policy show scheduler even")
    assert.are.equal(0, rc)
    assert.matches("settings: none", out, 1, true)
    rc, _, err = T.run(T.loip .. " policy show nokind loip")
    assert.are.equal(2, rc)
    assert.matches("no kind 'nokind'", err, 1, true)
  end)
end)
