-- KV priced per layer (sliding windows): a Qwen2 shape cut small with five window layers of 16
-- to one full (loip synth's --sliding-window 16 --layer-types sssssf) at 4096 positions. The
-- plan's sizes price a window layer's KV as its ring (the window and a batch: 80 positions) and
-- a full layer's as the context, both as loip_session_kv_size says; kv_bytes[k] holds the most
-- any k consecutive layers keep; a concrete part is priced by the kinds of its layers; the cost
-- model attends min(position, window) positions in window layers; a stage grows (and lends) the
-- full layers' groups alone, its rings held from the start (what the simulator and the online
-- policy count).
local problem = require "loip.plan.problem"
local plan = require "loip.plan"
local exec = require "loip.runtime.exec"

local OVER = { layers = 6, dim = 64, heads = 4, kv_heads = 2, ffn = 96, vocab = 300, sliding_window = 16, layer_types = "sssssf" }

local function sizes_of(over)
  local sz, _, c = problem.model_of_shape("qwen2.5-7b", over, { context = 4096, batch = 64, threads = 1, dtype = "F32" })
  return sz, c
end

describe("KV priced per layer", function()
  it("prices a window layer's ring and a full layer's context as the session does", function()
    local sz, c = sizes_of(OVER)
    local k = sz.kv_kinds
    assert.are.equal(1, k.full_layers)
    assert.are.equal(5, k.window_layers)
    assert.are.equal(80, k.ring_tokens) -- 16 - 1 + 64, rounded up to a block
    local row = 2 * 16 * 4 -- K or V of one position: 2 kv heads x 16 x f32
    assert.are.equal(2 * 80 * row, k.window_bytes)
    assert.are.equal(2 * 4096 * row, k.full_bytes)
    for l = 0, 5 do assert.are.equal(l < 5, sz.ringed[l] == true) end
    -- the whole model's KV as a session would charge it; a part's layers by their kinds
    assert.are.equal(exec.kv_size(c, 4096, 64, nil, 4096, 1), sz.kv_bytes[6])
    assert.are.equal(exec.kv_size(c, 4096, 64, { [0] = true, [1] = true }, 4096, 1),
      plan.kv_of_layers(sz, { [0] = true, [1] = true }))
    assert.are.equal(exec.kv_size(c, 4096, 64, { [4] = true, [5] = true }, 4096, 1),
      plan.kv_of_layers(sz, { [4] = true, [5] = true }))
    -- any two consecutive layers: at most one full one
    assert.are.equal(sz.kv_bytes[0] + k.full_bytes + k.window_bytes, sz.kv_bytes[2])
    -- without windows: six full layers, every count as before
    local full = sizes_of({ layers = 6, dim = 64, heads = 4, kv_heads = 2, ffn = 96, vocab = 300 })
    assert.is_nil(full.kv_kinds)
    assert.are.equal(full.kv_bytes[0] + 6 * k.full_bytes, full.kv_bytes[6])
    assert.is_true(sz.kv_bytes[6] < full.kv_bytes[6] / 5)
  end)

  it("prices each device's layers by kind in the scheduler's inner loop as in the plan it builds", function()
    local space = require "loip.plan.space"
    local sz = sizes_of(OVER)
    local prob = { model = sz, devices = { { budget = 0 }, { budget = 0 }, { budget = 0 } }, links = { {}, {}, {} },
      loader = "uring" }
    for _, S in ipairs({ 1, 2 }) do
      for _, shape in ipairs(space.shapes_for(S, 3, 12)) do
        local choice = S == 1 and { n = { 4, 4, 4 }, o = { 0, 1, 0 } } or { n = { 2, 2, 2 }, o = { 0, 0, 1 } }
        local p = space.build(prob, shape, choice)
        local L = 0
        for i = 1, 3 do
          local want = plan.part_total(plan.device_part(p, i, sz), sz, space.memory_opts(prob))
          local got = space.part_total(prob, shape, i, L, 0, choice.n[i], 0, choice.o[i], 1)
          assert.are.equal(want, got, string.format("S %d, device %d", S, i))
          L = L + choice.n[i]
        end
        -- device 3 of one stage: layers 4 (window) and 5 (full); the others' windows alone
        if S == 1 then
          assert.are.equal(sz.kv_bytes[0] + sz.kv_kinds.full_bytes + sz.kv_kinds.window_bytes,
            plan.part_memory(plan.device_part(p, 3, sz), sz).kv)
          assert.are.equal(sz.kv_bytes[0] + 2 * sz.kv_kinds.window_bytes, plan.part_memory(plan.device_part(p, 1, sz), sz).kv)
        end
      end
    end
  end)

  it("attends min(position, window) in window layers in the cost model", function()
    local sz = sizes_of(OVER)
    assert.are.equal((1000 + 5 * 16) / 6, plan.attended(sz, 1000))
    assert.are.equal(10, plan.attended(sz, 10))
    assert.are.equal(1000, plan.attended(sizes_of({ layers = 6, dim = 64, heads = 4, kv_heads = 2, ffn = 96, vocab = 300 }), 1000))
  end)

  it("grows only the full layers' groups, a stage's rings held from the start", function()
    local sz = sizes_of(OVER)
    local st = { blocks = { 6, 11 }, offloaded = 0 } -- layers 3, 4 (window) and 5 (full)
    assert.are.equal(1, plan.stage_kv_layers(st, sz))
    assert.are.equal(3, plan.stage_kv_layers(st))
    assert.are.equal(2 * sz.kv_kinds.window_bytes, plan.stage_ring_bytes(st, sz))
    assert.are.equal(0, plan.stage_ring_bytes({ blocks = { 10, 11 } }, sz))
  end)
end)
