-- What loip checks of the policies' work (issue 24, item 5): a scheduler's plan must keep what
-- the problem fixes (its stage count, devices, blocks, budgets) and have no unknown key, at any
-- level, in a policy's plan or a plan file; the loip.plan.space helpers name a nil or bad
-- argument; "no plan fits" speaks of the stage count asked for; a policy gets no FFI; the cost
-- model names what bounds a step. Problems are made here (no weights needed).
local plan = require "loip.plan"
local policy = require "loip.policy"
local space = require "loip.plan.space"
local T = require "spec.support"

local MiB = 1024 * 1024

-- Model sizes as loip.plan.sizes makes them (spec.support.model_sizes).
local sizes_of = T.model_sizes

-- N devices of the same figures (budgets: one per device, 0 unlimited), links of rate_bps.
local function problem_of(N, L, budgets, opts)
  opts = opts or {}
  local m = sizes_of(L, 2 * MiB, 6 * MiB)
  local p = { model = m, devices = {}, links = {}, micro_batch = 1, cluster = N > 1, loader = "uring", context = 256, batch = 16,
    head = { step_ms = 0.1, from_last = { transport_ms = 0.1 } }, stages = opts.stages }
  for i = 1, N do
    p.devices[i] = { budget = budgets[i] or 0, compute = { mha_ms = 0.2, mlp_ms = 0.6, head_ms = 0.4, embed_ms = 0.01,
      stage_ms = 0, under_load = 1.2 }, disk_bps = 1e9, load_ms = 0.05, slowdown = 1 }
    p.links[i] = { rate_bps = opts.rate_bps or 125e6, delay_ms = opts.delay_ms or 0.1, transport_ms = 0.1 }
  end
  p.head.to_first = p.links[N]
  return p
end

-- A scheduler file of one's own: `body` is the inside of schedule(problem, cost).
local function scheduler_file(dir, name, body)
  local path = dir .. "/" .. name
  T.write(path, "local space = require 'loip.plan.space'\nlocal M = { name = 'mine' }\nfunction M.schedule(problem, cost)\n"
    .. body .. "\nend\nreturn M\n")
  return path
end

-- What policy.plan raises for a problem and a scheduler (fails the spec when it does not raise).
local function refusal(problem, scheduler)
  local ok, err = pcall(policy.plan, problem, { scheduler = scheduler })
  assert.is_false(ok, "the plan was accepted")
  return tostring(err)
end

describe("a scheduler's plan", function()
  after_each(function() T.cleanup() collectgarbage() collectgarbage() end)

  it("must have the stage count the problem fixes (--stages): refused naming the policy file", function()
    local dir = T.tmpdir()
    -- the even split over 3 stages whatever was asked (what a copy of the example did before)
    local mine = scheduler_file(dir, "three.lua", [[
  local N = #problem.devices
  local shares = {}
  for h = 1, 3 * N do shares[h] = 1 end
  return space.ring_of(N, space.split(problem.model.n_blocks, shares))]])
    local err = refusal(problem_of(2, 8, {}, { stages = 2 }), mine)
    assert.matches("scheduler mine (" .. dir .. "/three.lua)", err, 1, true)
    assert.matches("a plan of 3 stages per device, but 2 were asked for (--stages 2)", err, 1, true)
    -- with no stage count fixed, the same plan is taken
    local p = policy.plan(problem_of(2, 8, {}), { scheduler = mine })
    assert.are.equal(3, #p.devices[1].stages)
  end)

  it("keeps the problem's devices, blocks and budgets, or is refused naming the file and what it breaks", function()
    local dir = T.tmpdir()
    local one_device = scheduler_file(dir, "one.lua", "return space.ring_of(1, { { 0, problem.model.n_blocks - 1 } })")
    assert.matches("one.lua): a plan for 1 device, the problem has 2", refusal(problem_of(2, 8, {}), one_device), 1, true)
    local short = scheduler_file(dir, "short.lua", "return space.ring_of(2, { { 0, 3 }, { 4, 9 } })")
    assert.matches("short.lua): the stages end at block 9; the model has 16 blocks", refusal(problem_of(2, 8, {}), short), 1, true)
    local resident = scheduler_file(dir, "resident.lua", "return space.ring_of(2, { { 0, 7 }, { 8, 15 } })")
    assert.matches("resident.lua): its plan breaks a budget: device 2 needs",
      refusal(problem_of(2, 8, { 0, 20 * MiB }), resident), 1, true)
    -- a cost model whose estimate is no number
    local cost = dir .. "/cost.lua"
    T.write(cost, "return { name = 'nan', estimate = function() return { ms_per_token = 0 / 0 } end }")
    local ok, err = pcall(policy.plan, problem_of(2, 8, {}), { scheduler = "even", cost = cost })
    assert.is_false(ok)
    assert.matches("cost model nan (" .. cost .. "): estimate's ms_per_token is nan", err, 1, true)
  end)

  it("has no unknown key: `offload` for `offloaded` is refused with a hint, naming the device and stage", function()
    local dir = T.tmpdir()
    local typo = scheduler_file(dir, "typo.lua", [[
  local p = space.ring_of(2, { { 0, 7 }, { 8, 15 } })
  p.devices[2].stages[1].offload = 2
  return p]])
    local err = refusal(problem_of(2, 8, {}), typo)
    assert.matches("typo.lua): devices[2].stages[1]: unknown key 'offload' (did you mean 'offloaded'?)", err, 1, true)
  end)

  it("is what the example scheduler (recipes/policies/examples/greedy.lua) returns for each stage count asked", function()
    local greedy = policy.recipes_dir() .. "/policies/examples/greedy.lua"
    for _, S in ipairs({ 1, 2, 3 }) do
      local p = policy.plan(problem_of(2, 8, {}, { stages = S }), { scheduler = greedy })
      assert.are.equal(S, #p.devices[1].stages)
    end
  end)
end)

describe("plan files and plan.check", function()
  after_each(T.cleanup)

  local function one(stage)
    return { slots = 1, devices = { { stages = { stage } } } }
  end

  it("refuse an unknown key at every level, naming it and where", function()
    local cases = {
      { { slots = 1, slot = 4, devices = { { stages = { { blocks = { 0, 15 } } } } } },
        "the plan: unknown key 'slot' (did you mean 'slots'?); a plan has only slots, slot_bytes, devices, per_block, prefetch" },
      { { devices = { { stages = { { blocks = { 0, 15 } } } } }, x = 1 }, "the plan: unknown key 'x'" },
      { { devices = { { stages = { { blocks = { 0, 15 } } }, slotbytes = 8 } } },
        "devices[1]: unknown key 'slotbytes' (did you mean 'slot_bytes'?); a device has only slot_bytes, stages" },
      { one({ blocks = { 0, 15 }, offload = 2 }), "devices[1].stages[1]: unknown key 'offload' (did you mean 'offloaded'?)" },
      { one({ blocks = { 0, 15 }, offloaded = 1, first = 0 }), "devices[1].stages[1]: unknown key 'first'; a stage has only blocks, offloaded" },
      { one({ blocks = { 0, 15, 3 } }), "devices[1].stages[1].blocks must be { first, last }" },
      { one({ blocks = { 0, 15, last = 3 } }), "devices[1].stages[1].blocks must be { first, last }" },
      { { devices = { { stages = { { blocks = { 0, 15 } } } }, [0] = { stages = {} } } },
        "devices: the key 0 in a list (it holds entries 1..1 only)" },
      { { devices = { { stages = { { blocks = { 0, 15 } }, s2 = {} } } } },
        "devices[1].stages: the key 's2' in a list (it holds entries 1..1 only)" },
    }
    for _, c in ipairs(cases) do
      local why = plan.check(c[1], 16, "p.lua")
      assert.is_truthy(why, c[2])
      assert.are.equal("p.lua: " .. c[2], why:sub(1, #c[2] + 7))
    end
    assert.is_nil(plan.check(one({ blocks = { 0, 15 }, offloaded = 2 }), 16, "p.lua"))
  end)

  it("a --plan file with a misspelt key is refused by what reads it, naming the file", function()
    local dir = T.tmpdir()
    local path = dir .. "/p.lua"
    T.write(path, "return { slots = 1, devices = { { stages = { { blocks = { 0, 15 }, offload = 2 } } } } }")
    local problem = problem_of(1, 8, {})
    local ok, err = pcall(require("loip.sim").new, problem, plan.load(path))
    assert.is_false(ok)
    assert.matches("plan: devices[1].stages[1]: unknown key 'offload' (did you mean 'offloaded'?)", err, 1, true)
    assert.are.equal(path .. ": devices[1].stages[1]: unknown key 'offload' (did you mean 'offloaded'?); a stage has only blocks, offloaded",
      plan.check(plan.load(path), 16, path))
  end)
end)

describe("the loip.plan.space helpers", function()
  after_each(T.cleanup)

  it("name a nil or bad argument, at the caller's line", function()
    local dir = T.tmpdir()
    -- the example scheduler with a misspelt field: disk_rate for disk_bps (nil for every device)
    local src = T.read(policy.recipes_dir() .. "/policies/examples/greedy.lua")
    local typo, n = src:gsub("shares%[h%] = [^\n]+", "shares[h] = problem.devices[i].disk_rate")
    assert.are.equal(1, n)
    T.write(dir .. "/typo.lua", typo)
    local err = refusal(problem_of(2, 8, {}), dir .. "/typo.lua")
    assert.matches("scheduler greedy (" .. dir .. "/typo.lua): " .. dir .. "/typo.lua:", err, 1, true)
    assert.matches("typo.lua:%d+: loip%.plan%.space%.split: shares is empty", err)
    assert.is_nil(err:find("stages must be a non-empty list", 1, true))
    local cases = {
      { function() space.split(16, { 1, nil, 3 }) end, "loip.plan.space.split: shares[2] is nil" },
      { function() space.split(16, { 1, math.huge }) end, "loip.plan.space.split: shares[2] is inf" },
      { function() space.split(16, { 0, 0 }) end, "loip.plan.space.split: shares are all 0" },
      { function() space.split(2, { 1, 1, 1 }) end, "loip.plan.space.split: 3 shares but only 2 blocks" },
      { function() space.split(nil, { 1 }) end, "loip.plan.space.split: nb (blocks) is nil" },
      { function() space.split(16) end, "loip.plan.space.split: shares is nil" },
      { function() space.ring_of(3, { { 0, 7 }, { 8, 15 } }) end, "loip.plan.space.ring_of: 2 ranges for 3 devices" },
      { function() space.ring_of(2, nil) end, "loip.plan.space.ring_of: ranges is nil" },
      { function() space.budget(problem_of(2, 8, {})) end, "loip.plan.space.budget: device i is nil, not a device of the problem (1..2)" },
      { function() space.speed(problem_of(2, 8, {}), 3) end, "loip.plan.space.speed: device i is 3" },
      { function() space.least_offload(problem_of(2, 8, {}), nil, 1) end, "loip.plan.space.least_offload: p is nil" },
      { function() space.fill(nil, {}, 1) end, "loip.plan.space.fill: problem is nil" },
      { function() space.shapes_for(2, nil, 16) end, "loip.plan.space.shapes_for: N (devices) is nil" },
    }
    for _, c in ipairs(cases) do
      local ok, why = pcall(c[1])
      assert.is_false(ok, c[2])
      -- raised at this spec's line, not inside space.lua
      assert.matches("policy_checks_spec.lua:%d+: ", why)
      assert.matches(c[2], why, 1, true)
    end
    -- and still split as before
    assert.are.same({ { 0, 1 }, { 2, 4 }, { 5, 9 } }, space.split(10, { 1, 2, 3 }))
  end)
end)

describe("when no plan fits", function()
  it("the diagnosis speaks of the stage count asked for", function()
    -- budgets that each device's least part fits (14.25 MiB) but no plan of any stage count;
    -- of them, one stage (every block in the slot) comes furthest
    local problem = problem_of(2, 8, { 15 * MiB, 15 * MiB }, { stages = 1 })
    problem.ends = {} -- (the embedding and head in memory, as these figures count them: loip.plan.ends)
    local err = refusal(problem, "loip")
    assert.matches("even the closest (1 stage as --stages asks", err, 1, true)
    assert.is_nil(err:find("%(%d+ stages"))
    -- with the stage count left to the scheduler, the closest is another
    problem.stages = nil
    local S = tonumber(refusal(problem, "loip"):match("even the closest %((%d+) stages, every block read"))
    assert.is_true(S and S > 1)
  end)
end)

describe("a policy's environment", function()
  after_each(T.cleanup)

  it("gives no FFI and nothing that reaches around it, naming the file and line", function()
    local dir = T.tmpdir()
    local cases = {
      { "local ffi = require 'ffi'", "requires 'ffi': a policy is given no FFI" },
      { "local C = require('loip.core').C", "requires 'loip.core': a policy is given no FFI" },
      { "local ffi = _G.require 'ffi'", "requires 'ffi'" },
      { "local g = getfenv(0)", "uses 'getfenv', which a policy is not given" },
      { "local ffi = package.loaded.ffi", "uses 'package', which a policy is not given" },
      { "local r = debug.getregistry()", "uses 'debug', which a policy is not given" },
      { "local f = loadstring('return 1')", "uses 'loadstring', which a policy is not given" },
      { "counter = 1", "assigns the global 'counter'" },
    }
    for k, c in ipairs(cases) do
      local path = string.format("%s/p%d.lua", dir, k)
      T.write(path, c[1] .. "\nreturn { schedule = function() end }\n")
      local ok, err = pcall(policy.load, "scheduler", path)
      assert.is_false(ok, c[1])
      assert.matches(path .. ":1: ", err, 1, true)
      assert.matches(c[2], err, 1, true)
    end
    -- what it is given: the standard library and the loip modules a policy uses
    local path = dir .. "/ok.lua"
    T.write(path, "local space, plan = require 'loip.plan.space', require 'loip.plan'\n"
      .. "local t = { math.floor(2.5), string.rep('a', 2), table.concat({ 'x' }), os.clock() >= 0, type(io.write) }\n"
      .. "return { schedule = function() return t end }\n")
    local s = policy.load("scheduler", path)
    assert.are.same({ 2, "aa", "x", true, "function" }, s.schedule())
  end)
end)

describe("the cost model's bound", function()
  local cost = policy.load("cost", "loip")

  it("names communication when the hops take longer than the compute, compute when not, load when reads wait", function()
    local p = space.ring_of(2, { { 0, 7 }, { 8, 15 } })
    -- 1 Mbit/s links and 5 ms delays: a step's hops far outlast its 2 x 4 x 0.8 ms of blocks
    local slow = problem_of(2, 8, {}, { rate_bps = 125e3, delay_ms = 5 })
    for _, f in ipairs({ cost.estimate, cost.closed }) do
      local est = f(p, slow)
      assert.is_true(est.comm_ms > est.comp_ms)
      assert.are.equal("communication", est.bound)
      assert.is_nil(est.bottleneck)
    end
    local fast = problem_of(2, 8, {}, { rate_bps = 0, delay_ms = 0 })
    for _, f in ipairs({ cost.estimate, cost.closed }) do
      local est = f(p, fast)
      assert.is_true(est.comp_ms > est.comm_ms)
      assert.are.equal("compute", est.bound)
    end
    -- everything read every step from a slow disk
    for _, d in ipairs(p.devices) do d.stages[1].offloaded = 8 end
    fast.devices[1].disk_bps, fast.devices[2].disk_bps = 1e7, 1e7
    for _, f in ipairs({ cost.estimate, cost.closed }) do
      local est = f(p, fast)
      assert.are.equal("load", est.bound)
      assert.is_number(est.bottleneck)
    end
  end)
end)
