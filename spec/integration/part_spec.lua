-- loip.model.part: a model's part on this device, assembled, changed live and freed in one
-- place for a Model and a worker alike. A cluster device's part of a plan (its layers' KV only,
-- the other devices' blocks not loaded) runs under a budget, restages, and gives every byte back
-- on close, once however often it is closed; a part that fails halfway gives back what it had
-- charged at once and raises the failure as it came.
local T = require "spec.support"
local ffi = require "ffi"
local memory = require "loip.runtime.memory"
local plan = require "loip.plan"
local store = require "loip.model.store"
local part = require "loip.model.part"
teardown(T.drop_stores)

local S260 = T.root .. "/models/stories260K"

-- The options of device i's part of plan p (as a worker makes them from a PLAN), and its sizes.
local function device_opts(dir, p, i, budget, weights)
  local man = store.read_manifest(dir)
  local cfg = store.config(dir, man)
  return { cfg = cfg, threads = 1, budget = budget, dir = dir, man = man,
    layout = function(pt)
      return { plan = p, index = i, sizes = plan.sizes(man, cfg, { context = 64, batch = 8, threads = pt.threads }),
        memory_opts = { cluster = true } }
    end,
    session = function(pt)
      local mask = ffi.new("uint8_t[?]", cfg.n_layers)
      for l in pairs(plan.device_layers(p, i)) do mask[l] = 1 end
      return { context = 64, batch = 8, kv_tokens = pt.sizes.kv_tokens, max_seqs = 1, layers = mask }
    end,
    weights = weights or function(pt)
      local keep = store.load_files(dir, man, "memory", budget.handle, plan.device_files(p, i, pt.sizes),
        store.offloaded_files(p, i, man))
      store.bind_loaded(pt.handle, dir, man, keep)
      return keep
    end }
end

local P = { slots = 1, devices = { { stages = { { blocks = { 0, 4 }, offloaded = 0 } } },
  { stages = { { blocks = { 5, 9 }, offloaded = 2 } } } } }

describe("loip.model.part", function()
  after_each(function() collectgarbage() collectgarbage() end)

  it("assembles a device's part of a plan under its budget, restages it live and frees all of it once", function()
    local dir = T.slice_store(S260, "s260")
    local budget = memory.budget("64M")
    local pt = part.open(device_opts(dir, P, 2, budget))
    assert.is_truthy(pt.runner)
    assert.is_truthy(pt.loader) -- (two blocks read every step)
    assert.is_truthy(pt.session)
    assert.are.equal(2, pt.index)
    local held = budget:used()
    assert.is_true(held > 0)
    local accounts = {}
    for _, a in ipairs(budget:report()) do accounts[a.account] = a.bytes end
    assert.is_true(accounts.weights > 0 and accounts.kv > 0 and accounts.slots > 0)
    -- the offloaded blocks come back into memory: charged to "weights"
    local p2 = pt:restage(1, 0)
    assert.are.equal(0, p2.devices[2].stages[1].offloaded)
    assert.are.equal(p2, pt.plan)
    local weights = 0
    for _, a in ipairs(budget:report()) do if a.account == "weights" then weights = a.bytes end end
    assert.is_true(weights > accounts.weights)
    pt:close()
    assert.are.equal(0, budget:used())
    assert.is_nil(pt.runner)
    assert.is_nil(pt.session)
    pt:close() -- (again: nothing)
    assert.are.equal(0, budget:used())
  end)

  it("gives back at once what a failed assembly charged, and raises its error as it came", function()
    local dir = T.slice_store(S260, "s260")
    local budget = memory.budget("64M")
    local ok, err = pcall(part.open, device_opts(dir, P, 2, budget, function(pt)
      assert.is_truthy(pt.session) -- (the session is charged before the weights load)
      assert.is_true(budget:used() > 0)
      error("the weights could not be read", 0)
    end))
    assert.is_false(ok)
    assert.are.equal("the weights could not be read", err)
    assert.are.equal(0, budget:used())
  end)

  it("refuses a part its budget cannot hold, naming the account, before its weights load", function()
    local dir = T.slice_store(S260, "s260")
    local budget = memory.budget(4096)
    local loaded = false
    local ok, err = pcall(part.open, device_opts(dir, P, 2, budget, function() loaded = true end))
    assert.is_false(ok)
    assert.matches("needs", tostring(err), 1, true)
    assert.is_false(loaded)
    assert.are.equal(0, budget:used())
  end)
end)
