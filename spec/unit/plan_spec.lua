-- loip.plan: memory of a plan by account, the timeline estimate, the search for one device and
-- its block-level refinement, plan checks and plan files. Sizes are those of a llama-3.2-1b
-- BF16 slice store (MHA 20 MiB + 4 KiB, MLP 96 MiB per layer, 16 layers).
local plan = require "loip.plan"
local T = require "spec.support"

local MiB = 1024 * 1024
local function sizes_1b()
  local s = { n_layers = 16, n_blocks = 32, block_bytes = {}, global_bytes = 501 * MiB, head_bytes = 501 * MiB,
    kv_bytes = 32 * MiB, activation_bytes = 13 * MiB, bounce_bytes = MiB, files = {},
    embed_file_bytes = 501 * MiB - 4096, head_file_bytes = 4096, tied = true, dim = 2048, vocab = 128256 }
  -- 2 MiB of KV cache per layer (what plan.sizes gets from loip_session_size)
  function s.kv_for(k) return k * 2 * MiB end
  s.weight_bytes = s.global_bytes
  for b = 0, 31 do
    s.block_bytes[b] = b % 2 == 0 and 20 * MiB + 4096 or 96 * MiB
    s.files[b] = string.format("layer-%03d-%s.bin", math.floor(b / 2), b % 2 == 0 and "mha" or "mlp")
    s.weight_bytes = s.weight_bytes + s.block_bytes[b]
  end
  return s
end
local rates = { read_bps = 2e9, compute_bps = 30e9 }

local function one(stages, extra)
  local p = { slots = 1, devices = { { stages = stages } } }
  for k, v in pairs(extra or {}) do p[k] = v end
  return p
end

describe("loip.plan", function()
  local sz = sizes_1b()

  it("counts a plan's memory by account: resident blocks, the slot (or ring), KV cache, activations", function()
    local p = one({ { blocks = { 0, 15 }, offloaded = 0 }, { blocks = { 16, 31 }, offloaded = 3 } })
    local m = plan.memory(p, sz)
    local off = 2 * (20 * MiB + 4096) + 96 * MiB -- blocks 16, 17, 18
    assert.are.equal(off, m.offloaded_bytes)
    assert.are.equal(off, m.slot_bytes)
    assert.are.equal(sz.weight_bytes - off, m.weights)
    assert.are.equal(m.weights + m.slots + m.kv + m.activations, m.total)
    p.slot_bytes = 300 * MiB
    assert.are.equal(300 * MiB, plan.memory(p, sz).slots)
    p.slots, p.slot_bytes = 2, nil
    assert.are.equal(2 * off, plan.memory(p, sz).slots)
    assert.are.equal(MiB, plan.memory(p, sz, { loader = "buffered" }).scratch)
  end)

  it("estimates compute alone without offloading, and at least the disk time with it", function()
    local all = one({ { blocks = { 0, 31 }, offloaded = 0 } })
    local ms = plan.estimate(all, sz, rates)
    local compute = (sz.weight_bytes - sz.global_bytes + sz.head_bytes) / rates.compute_bps * 1e3
    assert.is_true(math.abs(ms - compute) < 1, ms .. " vs " .. compute)
    local stages = {}
    for b = 0, 31 do stages[b + 1] = { blocks = { b, b }, offloaded = 1 } end
    local p = one(stages)
    local mem = plan.memory(p, sz)
    local t_small = plan.estimate(p, sz, rates)
    assert.is_true(t_small >= mem.offloaded_bytes / rates.read_bps * 1e3)
    -- a ring that holds the next loads hides compute behind the disk: never slower
    p.slot_bytes = 3 * 96 * MiB
    assert.is_true(plan.estimate(p, sz, rates) <= t_small)
  end)

  it("searches a plan that fits each budget, offloading more as the budget shrinks", function()
    local free = plan.search(sz, 0, { read_bps = 2e9, compute_bps = 30e9 })
    assert.are.equal(1, #free.devices[1].stages)
    assert.are.equal(0, free.devices[1].stages[1].offloaded)
    local last = 0
    for _, share in ipairs({ 0.9, 0.7, 0.5, 0.35 }) do
      local budget = math.floor(share * sz.weight_bytes) + sz.kv_bytes + sz.activation_bytes
      local p = plan.search(sz, budget, { read_bps = 2e9, compute_bps = 30e9 })
      assert.is_nil(plan.check(p, sz.n_blocks))
      local m = plan.memory(p, sz)
      assert.is_true(m.total <= budget, share .. ": " .. m.total .. " > " .. budget)
      assert.is_true(m.offloaded_bytes > last, share)
      -- what is left is less than any offloaded block (the refinement filled the rest)
      for _, st in ipairs(p.devices[1].stages) do
        if st.offloaded > 0 then
          assert.is_true(budget - m.total < sz.block_bytes[st.blocks[1] + st.offloaded - 1], share)
        end
      end
      assert.is_true(p.estimate.ms > 0)
      last = m.offloaded_bytes
    end
    local need = plan.minimum(sz)
    local ok, err = pcall(plan.search, sz, need - 1, {})
    assert.is_false(ok)
    assert.matches("cannot run this model: even with every block offloaded it needs", err, 1, true)
    assert.is_true(pcall(plan.search, sz, need, {}))
  end)

  it("checks plans and names the faulty field", function()
    local cases = {
      { 42, "not a table" },
      { { devices = {} }, "devices must be a non%-empty list" },
      { one({ { blocks = { 0, 31 }, offloaded = 33 } }), "offloaded must be an integer in 0..32" },
      { one({ { blocks = { 1, 31 } } }), "starts at block 1" },
      { one({ { blocks = { 0, 30 } } }), "the stages end at block 30" },
      { one({ { blocks = { 0, 40 } } }), "past the model's last" },
      { one({ { blocks = { 0, 31 } } }, { slot_bytes = -1 }), "slot_bytes must be a byte count" },
      { one({ { blocks = { 0, 31 } } }, { slots = 1.5 }), "slots must be a positive integer" },
    }
    for _, c in ipairs(cases) do
      local why = plan.check(c[1], 32, "p.lua")
      assert.is_truthy(why, c[2])
      assert.matches("^p%.lua: ", why)
      assert.matches(c[2], why)
    end
  end)

  it("writes plans as Lua that reads back the same", function()
    local p = plan.search(sz, 1200 * MiB, rates)
    local path = T.tmpdir() .. "/p.lua"
    T.write(path, plan.to_lua(p))
    local q = plan.load(path)
    assert.are.same(p.devices, q.devices)
    assert.are.equal(p.slots, q.slots)
    assert.are.equal(p.slot_bytes, q.slot_bytes)
    assert.are.same(plan.memory(p, sz), plan.memory(q, sz))
    assert.matches("stage 1: layer 0 mha", plan.describe(q, sz))
  end)
end)
