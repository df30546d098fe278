-- loip.plan: memory of a plan by account, the cost model's estimate of one device's plans, the
-- scheduler on one device under shrinking budgets, plan checks and plan files. Sizes are those of a llama-3.2-1b
-- BF16 slice store (MHA 20 MiB + 4 KiB, MLP 96 MiB per layer, 16 layers).
local plan = require "loip.plan"
local T = require "spec.support"

local MiB = 1024 * 1024
local function sizes_1b()
  local s = { n_layers = 16, n_blocks = 32, block_bytes = {}, global_bytes = 501 * MiB, head_bytes = 501 * MiB,
    activation_bytes = 13 * MiB, files = {}, mha_bytes = 20 * MiB + 4096, mlp_bytes = 96 * MiB, device_bytes = MiB,
    embed_file_bytes = 501 * MiB - 4096, head_file_bytes = 4096, tied = true, dim = 2048, vocab = 128256,
    hidden_bytes = 8192, header_bytes = 64, kv_bytes = {} }
  -- 2 MiB of KV cache per layer (what plan.sizes gets from loip_session_size)
  for k = 0, 16 do s.kv_bytes[k] = k * 2 * MiB end
  s.weight_bytes = s.global_bytes
  for b = 0, 31 do
    s.block_bytes[b] = b % 2 == 0 and 20 * MiB + 4096 or 96 * MiB
    s.files[b] = string.format("layer-%03d-%s.bin", math.floor(b / 2), b % 2 == 0 and "mha" or "mlp")
    s.weight_bytes = s.weight_bytes + s.block_bytes[b]
  end
  return s
end

-- One device of this machine-like figures: 30 GB/s of weights, a 2 GB/s disk, compute 1.3x
-- slower while it reads.
local function problem_1b(sz, budget)
  return { model = sz, devices = { { budget = budget, compute = { mha_ms = sz.mha_bytes / 30e9 * 1e3,
    mlp_ms = sz.mlp_bytes / 30e9 * 1e3, head_ms = sz.head_bytes / 30e9 * 1e3, under_load = 1.3 }, disk_bps = 2e9, load_ms = 0.05 } },
    links = { {} }, head = { in_process = true }, micro_batch = 1, loader = "uring" }
end

local function one(stages, extra)
  local p = { slots = 1, devices = { { stages = stages } } }
  for k, v in pairs(extra or {}) do p[k] = v end
  return p
end

local cost = require("loip.policy").load("cost", "loip")

describe("loip.plan", function()
  local sz = sizes_1b()

  it("counts a plan's memory by account: resident blocks, the slot (or ring), KV cache, activations", function()
    local p = one({ { blocks = { 0, 15 }, offloaded = 0 }, { blocks = { 16, 31 }, offloaded = 3 } })
    local m = plan.memory(p, 1, sz)
    local off = 2 * (20 * MiB + 4096) + 96 * MiB -- blocks 16, 17, 18
    assert.are.equal(off, m.offloaded_bytes)
    assert.are.equal(off, m.slot_bytes)
    assert.are.equal(sz.weight_bytes - off, m.weights)
    assert.are.equal(m.weights + m.slots + m.kv + m.activations, m.total)
    assert.are.equal(m.total, plan.part_total(plan.device_part(p, 1, sz), sz, {}))
    p.slot_bytes = 300 * MiB
    assert.are.equal(300 * MiB, plan.memory(p, 1, sz).slots)
    p.slots, p.slot_bytes = 2, nil
    assert.are.equal(2 * off, plan.memory(p, 1, sz).slots)
    assert.are.equal(MiB, plan.memory(p, 1, sz, { loader = "buffered" }).scratch)
    -- a worker's message buffers count as activations
    assert.are.equal(sz.device_bytes, plan.memory(p, 1, sz, { cluster = true }).activations - m.activations)
  end)

  it("charges a worker's logits rows to the device that returns them: the last, or every one of a cut head", function()
    local s2 = sizes_1b()
    s2.device_bytes_mid, s2.logits_tokens = MiB / 4, 64
    local p = { slots = 1, devices = { { stages = { { blocks = { 0, 15 }, offloaded = 0 } } },
      { stages = { { blocks = { 16, 31 }, offloaded = 0 } } } } }
    local o = { cluster = true }
    assert.are.equal(s2.activation_bytes + s2.device_bytes_mid, plan.memory(p, 1, s2, o).activations)
    assert.are.equal(s2.activation_bytes + s2.device_bytes, plan.memory(p, 2, s2, o).activations)
    for i = 1, 2 do
      assert.are.equal(plan.memory(p, i, s2, o).total, plan.part_total(plan.device_part(p, i, s2), s2, o), "device " .. i)
    end
    -- what the planner sends each device to allocate
    assert.are.same({ 1, 64 }, { plan.logits_tokens_of(p, s2, 1, 2), plan.logits_tokens_of(p, s2, 2, 2) })
    p.head_shares = { 64128, 64128 }
    assert.are.same({ 64, 64 }, { plan.logits_tokens_of(p, s2, 1, 2), plan.logits_tokens_of(p, s2, 2, 2) })
    -- (sizes made before device_bytes_mid: every device charged alike)
    s2.device_bytes_mid = nil
    assert.are.equal(s2.activation_bytes + s2.device_bytes, plan.memory(p, 1, s2, o).activations)
  end)

  it("estimates compute alone without offloading, and at least the disk time with it", function()
    local all = one({ { blocks = { 0, 31 }, offloaded = 0 } })
    local pr = problem_1b(sz, 0)
    local est = cost.estimate(all, pr)
    local c = pr.devices[1].compute
    local compute = 16 * (c.mha_ms + c.mlp_ms) + c.head_ms
    assert.is_true(math.abs(est.ms_per_token - compute) < 1e-6, est.ms_per_token .. " vs " .. compute)
    assert.are.equal("compute", est.bound)
    local stages = {}
    for b = 0, 31 do stages[b + 1] = { blocks = { b, b }, offloaded = 1 } end
    local p = one(stages)
    local mem = plan.memory(p, 1, sz)
    local t_small = cost.estimate(p, pr)
    assert.is_true(t_small.ms_per_token >= mem.offloaded_bytes / 2e9 * 1e3)
    assert.are.equal("load", t_small.bound)
    -- the breakdown adds up: compute + communication + uncovered loading
    assert.is_true(math.abs(t_small.comp_ms + t_small.comm_ms + t_small.uncover_ms - t_small.ms_per_token) < 1e-6)
    -- a ring that holds the next loads hides compute behind the disk: never slower
    p.slot_bytes = 3 * 96 * MiB
    assert.is_true(cost.estimate(p, pr).ms_per_token <= t_small.ms_per_token)
    -- the conventional way (each block read when its turn comes, nothing ahead) hides nothing
    p.slot_bytes, p.per_block, p.prefetch = nil, true, false
    local conv = cost.estimate(p, pr)
    assert.is_true(math.abs(conv.ms_per_token - (compute * 1.3 - c.head_ms * 0.3 + mem.offloaded_bytes / 2e9 * 1e3 + 32 * 0.05)) < 1e-6)
  end)

  it("schedules one device under each budget, offloading more as the budget shrinks", function()
    local policy = require "loip.policy"
    local free = policy.plan(problem_1b(sz, 0))
    assert.are.equal(1, #free.devices[1].stages)
    assert.are.equal(0, free.devices[1].stages[1].offloaded)
    local last = 0
    for _, share in ipairs({ 0.9, 0.7, 0.5, 0.35 }) do
      local budget = math.floor(share * sz.weight_bytes) + sz.kv_bytes[16] + sz.activation_bytes
      local p = policy.plan(problem_1b(sz, budget))
      assert.is_nil(plan.check(p, sz.n_blocks))
      local m = plan.memory(p, 1, sz)
      assert.is_true(m.total <= budget, share .. ": " .. m.total .. " > " .. budget)
      assert.is_true(m.offloaded_bytes > last, share)
      -- what is left is less than any offloaded block (the refinement filled the rest)
      for _, st in ipairs(p.devices[1].stages) do
        if st.offloaded > 0 then
          assert.is_true(budget - m.total < sz.block_bytes[st.blocks[1] + st.offloaded - 1], share)
        end
      end
      last = m.offloaded_bytes
    end
    -- (600 MiB held no plan while the embedding and head stayed in memory; on disk it does)
    local p600 = policy.plan(problem_1b(sz, 600 * MiB))
    assert.is_truthy(p600.head_rows or p600.embed_rows)
    assert.is_true(plan.memory(p600, 1, sz).total <= 600 * MiB)
    local ok, err = pcall(policy.plan, problem_1b(sz, 100 * MiB))
    assert.is_false(ok)
    assert.matches("memory budget of 100.0 MiB cannot run this model: even with every block offloaded it needs .*; short by", err)
  end)

  it("writes plans as Lua that reads back the same", function()
    local p = require("loip.policy").plan(problem_1b(sz, 1200 * MiB))
    local path = T.tmpdir() .. "/p.lua"
    plan.save(path, p)
    local q = plan.load(path)
    assert.are.same(plan.bare(p), plan.bare(q))
    assert.are.same(plan.memory(p, 1, sz), plan.memory(q, 1, sz))
    assert.matches("stage 1: layer 0 mha", plan.describe(q, sz))
    T.cleanup()
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

  it("times a block past the largest batch a profile measured as it grew between the two largest", function()
    local profile = require "loip.plan.profile"
    local sh = { mlp_bytes = 10, mha_bytes = 10, n_heads = 1, head_dim = 1 }
    local pr = { shape = { n_heads = 1, head_dim = 1 }, compute = { weight_bps = { ["1"] = 10, ["4"] = 5 },
      mha_fixed_ms = { ["1"] = 0 }, attention_ms_per_token = { ["1"] = 0 } } }
    assert.are.equal(1000, profile.block_ms(pr, "mlp", 1, 1, sh))
    assert.are.equal(2000, profile.block_ms(pr, "mlp", 4, 1, sh))
    assert.is_true(math.abs(profile.block_ms(pr, "mlp", 16, 1, sh) - 6000) < 1e-6) -- 1000/3 ms more per token
    -- one batch measured (a calibration): past it, as it was
    pr.compute.weight_bps = { ["1"] = 10 }
    assert.are.equal(1000, profile.block_ms(pr, "mlp", 8, 1, sh))
  end)
end)
