-- The decision layer: the plan space (loip.plan.space) against the plans it builds, the DP
-- scheduler against brute force on random small problems, the refinement, the baselines and the
-- policy loader. Problems are made here with random but plausible figures (no weights needed).
local plan = require "loip.plan"
local policy = require "loip.policy"
local space = require "loip.plan.space"
local T = require "spec.support"

local MiB = 1024 * 1024

-- A seeded generator (xorshift), so a failure can be replayed from its seed.
local function rng(seed)
  local x = seed * 2654435761 % 4294967296 + 1
  local function nxt()
    x = bit.bxor(x, bit.lshift(x, 13)) x = bit.bxor(x, bit.rshift(x, 17)) x = bit.bxor(x, bit.lshift(x, 5))
    return (x % 4294967296 + 4294967296) % 4294967296 / 4294967296
  end
  return {
    float = function(a, b) return a + (b - a) * nxt() end,
    int = function(a, b) return a + math.floor((b - a + 1) * nxt()) end,
    pick = function(t) return t[1 + math.floor(#t * nxt())] end,
  }
end

-- Model sizes as loip.plan.sizes makes them (spec.support.model_sizes).
local sizes_of = T.model_sizes

-- A random problem: 2-4 devices, 4-12 layers, budgets from "everything offloaded barely fits"
-- to "everything resident fits", disks, slowdowns, links.
local function random_problem(r, opts)
  opts = opts or {}
  local N = opts.N or r.int(2, 4)
  local L = opts.L or r.int(4, 12)
  local mha = r.int(1, 6) * MiB
  local mlp = r.int(2, 16) * MiB
  local m = sizes_of(L, mha, mlp, r.int(0, 1) == 1)
  local p = { model = m, devices = {}, links = {}, micro_batch = 1, cluster = true, loader = "uring", context = 256, batch = 16,
    head = { step_ms = 0.1, from_last = { transport_ms = 0.1 } } }
  local all = (m.weight_bytes + m.kv_bytes[L]) / N
  for i = 1, N do
    local speed = r.float(5e9, 30e9) -- bytes of weights per second
    local least = m.activation_bytes + m.device_bytes + math.max(mha, mlp) + m.kv_bytes[1]
      + (i == 1 and m.embed_file_bytes or 0) + (i == N and (m.head_file_bytes + (m.tied and m.embed_file_bytes or 0)) or 0)
    p.devices[i] = {
      budget = r.int(0, 9) == 0 and 0 or math.floor(math.max(0.8 * least, least + r.float(-0.15, 1.3) * all)),
      compute = { mha_ms = mha / speed * 1e3, mlp_ms = mlp / speed * 1e3, head_ms = m.head_bytes / speed * 1e3, embed_ms = 0.01,
        stage_ms = r.float(0, 0.05), under_load = r.float(1, 1.6) },
      disk_bps = r.float(2e8, 2e9), load_ms = r.float(0, 0.3), slowdown = r.pick({ 1, 1, 1.5, 2, 4 }),
    }
    p.links[i] = { rate_bps = r.pick({ 12.5e6, 25e6, 125e6 }), delay_ms = r.float(0, 3), transport_ms = r.float(0.05, 0.3) }
  end
  p.head.to_first = p.links[N]
  return p
end

local cost = policy.load("cost", "loip")
local loip_s = policy.load("scheduler", "loip")
local brute = policy.load("scheduler", "brute")
-- what the DP minimises: the cost model's closed form (its estimate runs a timeline instead)
local closed = { name = "loip (closed form)", estimate = cost.closed, device = cost.device, comm = cost.comm }

local function close(a, b) return math.abs(a - b) <= 1e-9 * math.max(1, math.abs(a), math.abs(b)) end

describe("the plan space", function()
  it("describes each device's part as the plan it builds does", function()
    local r = rng(11)
    local checked = 0
    for _ = 1, 60 do
      local p = random_problem(r)
      local shapes = space.shapes(p)
      local sh = r.pick(shapes)
      local N = #p.devices
      -- a random template and extras for this shape
      local n, x, o, k = {}, {}, {}, {}
      local left = sh.R
      for i = 1, N do
        n[i] = i == N and left or r.int(1, left - (N - i))
        left = left - n[i]
      end
      local E = sh.E
      for i = 1, N do x[i] = 0 end
      local j = 0
      while E ~= 0 and j < 100 do
        j = j + 1
        local i = r.int(1, N)
        local s = E > 0 and 1 or -1
        if x[i] == 0 and n[i] + s >= 1 then x[i], E = s, E - s end
      end
      if E == 0 then
        for i = 1, N do o[i], k[i] = r.int(0, n[i] + math.max(x[i], 0)), r.int(1, 2) end
        local built = space.build(p, sh, { n = n, x = x, o = o, k = k })
        assert.is_nil(plan.check(built, p.model.n_blocks))
        local L, X = 0, 0
        for i = 1, N do
          local want = plan.device_part(built, i, p.model)
          local got = space.part(p, sh, i, L, X, n[i], x[i], o[i], k[i])
          for _, f in ipairs({ "S", "n_mha", "n_mlp", "off_mha", "off_mlp", "off_bytes", "res_bytes", "stage_off_max",
            "slot_bytes", "slots", "ring", "loads", "layers", "embed", "head", "first", "last" }) do
            assert.are.equal(want[f], got[f], string.format("%s of device %d (S=%d R=%d E=%d n=%d x=%d o=%d k=%d)", f, i,
              sh.S, sh.R, sh.E, n[i], x[i], o[i], k[i]))
          end
          L, X = L + n[i], X + x[i]
        end
        checked = checked + 1
      end
    end
    assert.is_true(checked >= 40, checked)
  end)
end)

describe("the loip scheduler (DP)", function()
  it("finds brute force's optimum on 200 random small problems, and no plan only where brute force finds none", function()
    local r = rng(7)
    local n, none, refined_better = 0, 0, 0
    local seed = 0
    while n < 200 do
      seed = seed + 1
      local p = random_problem(rng(seed))
      if brute.size(p) <= 400 then
        n = n + 1
        local bp, best = brute.search(p, closed)
        local dp, est = loip_s.search(p, cost, { refine = false })
        if dp then est = cost.closed(dp, p) end
        local what = string.format("seed %d: %d devices, %d layers", seed, #p.devices, p.model.n_layers)
        if not bp then
          none = none + 1
          assert.is_nil(dp, what .. ": the DP found a plan brute force did not")
          assert.is_string(est, what)
        else
          assert.is_not_nil(dp, what .. ": brute force found a plan, the DP said: " .. tostring(est))
          assert.is_true(close(best.ms_per_token, est.ms_per_token),
            string.format("%s: DP %.6f ms, brute force %.6f ms", what, est.ms_per_token, best.ms_per_token))
          -- the DP's plan is a real plan of the problem: well formed, within every budget
          assert.is_nil(plan.check(dp, p.model.n_blocks), what)
          for i, d in ipairs(p.devices) do
            assert.is_true(d.budget == 0 or space.total(p, plan.device_part(dp, i, p.model)) <= d.budget, what)
          end
          -- the refinements never make it slower (by the cost model's estimate)
          local rp, rest = loip_s.search(p, cost)
          local unrefined = cost.estimate(dp, p).ms_per_token
          assert.is_true(rest.ms_per_token <= unrefined * (1 + 1e-9), what)
          if rest.ms_per_token < unrefined * 0.999 then refined_better = refined_better + 1 end
          assert.is_nil(plan.check(rp, p.model.n_blocks), what)
        end
      end
      local _ = r
    end
    -- the sample has both kinds, and the refinement matters in some
    assert.is_true(none >= 5 and none <= 150, "problems without a plan: " .. none)
    assert.is_true(refined_better >= 5, "refinement helped in " .. refined_better)
  end)

  -- (how long the decision takes is measured by recipes/bench/schedulers.lua, in its "decide"
  -- figures on these same problems: a timing assertion here failed on a busy machine)
  it("plans llama-3.3-70b on 8 devices, memory to spare or short", function()
    local problem = require "loip.plan.problem"
    local r = rng(3)
    local ok, m = pcall(problem.model_of_shape, "llama-3.3-70b", {}, { context = 4096, batch = 64, threads = 1 })
    assert(ok, m)
    local GiB = 1024 ^ 3
    -- the paper's boards (Orin 64 GB x2, Orin 32 GB x3, Xavier NX 16 GB x3): with most of their
    -- memory for the model (the model fits), and with a share of it (it does not: offloading)
    for _, budgets in ipairs({ { 60, 60, 28, 28, 28, 14, 14, 14 }, { 24, 24, 12, 12, 12, 6, 6, 6 } }) do
      local p = { model = m, devices = {}, links = {}, micro_batch = 1, cluster = true, loader = "uring", context = 4096,
        head = { step_ms = 0.2, from_last = { transport_ms = 0.2 } } }
      for i = 1, 8 do
        local speed = i <= 2 and 150e9 or (i <= 5 and 100e9 or 50e9)
        p.devices[i] = { budget = budgets[i] * GiB, compute = { mha_ms = m.mha_bytes / speed * 1e3, mlp_ms = m.mlp_bytes / speed * 1e3,
          head_ms = m.head_bytes / speed * 1e3, under_load = 1.1 }, disk_bps = r.float(1e9, 3e9), load_ms = 0.1 }
        p.links[i] = { rate_bps = 12.5e6, delay_ms = 1, transport_ms = 0.2 }
      end
      p.head.to_first = p.links[8]
      local what = string.format("budgets %s GiB", table.concat(budgets, ","))
      local q, est, info = policy.plan(p, { scheduler = "loip", cost = "loip" })
      assert.is_not_nil(q, what .. ": " .. tostring(est))
      assert.is_nil(plan.check(q, m.n_blocks), what)
      local offloaded = 0
      for i, d in ipairs(p.devices) do
        assert.is_true(space.total(p, plan.device_part(q, i, m)) <= d.budget, what .. ": device " .. i .. " over its budget")
        for _, st in ipairs(q.devices[i].stages) do offloaded = offloaded + (st.offloaded or 0) end
      end
      -- the model (about 131 GiB in BF16) fits the first budgets (250 GiB) whole, and not the second (102 GiB)
      if budgets[1] == 60 then assert.equals(0, offloaded, what) else assert.is_true(offloaded > 0, what) end
      assert.is_true(est.ms_per_token > 0 and est.ms_per_token < math.huge, what)
      assert.is_number(info.scheduler_ms, what)
    end
  end)
end)

describe("the baselines", function()
  it("each give a plan within the budgets, or refuse naming the device and the shortfall", function()
    local seen = {}
    for seed = 1, 40 do
      local p = random_problem(rng(1000 + seed), { N = 3, L = 8 })
      for _, name in ipairs({ "even", "uniform", "pipeline", "pipeline-offload", "edgeshard", "loip" }) do
        local ok, q, est = pcall(policy.plan, p, { scheduler = name })
        if ok then
          seen[name .. " ok"] = true
          assert.is_true(est.ms_per_token > 0, name)
          if name == "pipeline" or name == "edgeshard" then
            for i = 1, #q.devices do assert.are.equal(0, plan.device_part(q, i, p.model).off_bytes, name) end
          end
          if name == "pipeline-offload" then assert.is_true(q.per_block and q.prefetch == false, name) end
        else
          seen[name .. " refused"] = true
          assert.matches("device %d", q, 1, false)
          assert.is_nil(q:find("?", 1, true), q)
          assert.is_nil(q:find("by %-"), q)
        end
      end
    end
    for _, k in ipairs({ "even ok", "loip ok", "pipeline ok", "pipeline refused", "edgeshard ok", "edgeshard refused",
      "pipeline-offload ok", "uniform ok" }) do
      assert.is_true(seen[k], k)
    end
  end)

  it("loip is never slower than a baseline by the cost model", function()
    for seed = 1, 30 do
      local p = random_problem(rng(2000 + seed), { N = 3, L = 10 })
      local ok, _, best = pcall(policy.plan, p, { scheduler = "loip" })
      if ok then
        for _, name in ipairs({ "even", "uniform", "pipeline", "edgeshard", "pipeline-offload" }) do
          local bok, _, est = pcall(policy.plan, p, { scheduler = name })
          if bok then
            assert.is_true(best.ms_per_token <= est.ms_per_token * 1.0001,
              string.format("seed %d: loip %.2f ms, %s %.2f ms", seed, best.ms_per_token, name, est.ms_per_token))
          end
        end
      end
    end
  end)
end)

describe("loip.policy", function()
  after_each(T.cleanup)

  it("loads shipped policies by name and a researcher's by path, and names what is wrong", function()
    assert.are.equal("loip", policy.load("scheduler", "loip").name)
    local names = policy.list("scheduler")
    for _, n in ipairs({ "brute", "edgeshard", "even", "loip", "pipeline", "pipeline-offload", "uniform" }) do
      assert.is_truthy(table.concat(names, " "):find(n, 1, true), n)
    end
    local ok, err = pcall(policy.load, "scheduler", "nope")
    assert.is_false(ok)
    assert.matches("scheduler 'nope': no such policy .* shipped: brute", err)
    local dir = T.tmpdir()
    T.write(dir .. "/bad.lua", "return { name = 'x' }")
    ok, err = pcall(policy.load, "scheduler", dir .. "/bad.lua")
    assert.is_false(ok)
    assert.matches("needs a function schedule", err)
    T.write(dir .. "/global.lua", "counter = 1 return { schedule = function() end }")
    ok, err = pcall(policy.load, "scheduler", dir .. "/global.lua")
    assert.is_false(ok)
    assert.matches("assigns the global 'counter'", err)
    ok, err = pcall(policy.load, "cost", dir .. "/syntax.lua")
    assert.is_false(ok)
    assert.matches("no such policy", err)
    T.write(dir .. "/syntax.lua", "return {")
    ok, err = pcall(policy.load, "cost", dir .. "/syntax.lua")
    assert.is_false(ok)
    assert.matches("syntax.lua", err)
  end)

  it("runs the example scheduler (copied from recipes/policies/examples) on a problem", function()
    local src = T.read(policy.recipes_dir() .. "/policies/examples/greedy.lua")
    local lines = select(2, src:gsub("\n", "\n"))
    assert.is_true(lines <= 30, lines .. " lines")
    local dir = T.tmpdir()
    T.write(dir .. "/mine.lua", src)
    local p = random_problem(rng(5), { N = 3, L = 8 })
    p.devices[1].budget, p.devices[2].budget, p.devices[3].budget = 0, 0, 0
    local q, est = policy.plan(p, { scheduler = dir .. "/mine.lua" })
    assert.is_nil(plan.check(q, p.model.n_blocks))
    assert.is_true(est.ms_per_token > 0)
  end)
end)

describe("the cost model's shared disk", function()
  -- three local devices sharing one disk (disk_shared_bps: each one's rate with 1, 2, 3 reading)
  local function problem3(shared)
    local m = sizes_of(12, 4 * MiB, 8 * MiB, false)
    local p = { model = m, devices = {}, links = {}, micro_batch = 1, cluster = true, loader = "uring", context = 256, batch = 16,
      head = { step_ms = 0.1, from_last = { transport_ms = 0.1 } } }
    for i = 1, 3 do
      p.devices[i] = { budget = 0, compute = { mha_ms = 15, mlp_ms = 30, head_ms = 1, embed_ms = 0.01, stage_ms = 0, under_load = 1 },
        disk_bps = 1e8, disk_shared_bps = shared and shared[i], load_ms = 0, slowdown = 1 }
      p.links[i] = { rate_bps = 125e6, delay_ms = 0, transport_ms = 0.05 }
    end
    p.head.to_first = p.links[3]
    return p
  end
  -- 3 devices x 2 stages of 4 blocks, each stage's first block (an MHA) read every step
  local p = { slots = 1, devices = {} }
  for i = 1, 3 do
    p.devices[i] = { stages = {} }
    for s = 1, 2 do
      local first = ((s - 1) * 3 + i - 1) * 4
      p.devices[i].stages[s] = { blocks = { first, first + 3 }, offloaded = 1 }
    end
  end

  it("prices each device's reads at the rate of as many as read beside it, between all reading and one alone", function()
    local by = { 3e8, 1.5e8, 1e8 }
    local all = cost.estimate(p, problem3(nil))                 -- every read at the all-reading rate
    local shared = cost.estimate(p, problem3({ by, by, by }))
    for i = 1, 3 do
      local a, s = all.devices[i].load_ms, shared.devices[i].load_ms
      assert.is_true(s < a, string.format("device %d: %.1f ms, not less than %.1f", i, s, a))
      assert.is_true(s >= a / 3 - 1e-9, string.format("device %d reads faster than alone", i))
    end
    assert.is_true(shared.ms_per_token <= all.ms_per_token)
    -- only one device of this machine: nobody shares its disk, its reads priced as they were
    local one = cost.estimate(p, problem3({ by }))
    assert.is_true(close(all.devices[1].load_ms, one.devices[1].load_ms))
  end)
end)

describe("the loip scheduler on local devices sharing one disk", function()
  -- A llama-3.2-1b shape cut small (`loip plan --like llama-3.2-1b --layers L --dim 256 --ffn 768
  -- --heads 4 --kv-heads 2 --head-dim 64 --vocab 1000 --context 256`) on n local devices whose
  -- figures are a calibration's (made up here, seeded): each device's reads priced by the
  -- estimate at the rate of as many as read beside it (disk_shared_bps). (The loader is named: with
  -- "auto" the memory a plan needs would depend on whether this machine's io_uring answers.)
  local problem = require "loip.plan.problem"
  -- (fig: the figures instead of random ones: { by = rates by readers, weight_bps, mha_fixed_ms,
  -- under_load, load_ms, transport_ms })
  local function shared_problem(r, L, n, mem, fig)
    local over = { layers = L, dim = 256, ffn = 768, heads = 4, kv_heads = 2, head_dim = 64, vocab = 1000 }
    local sizes, cfg, _, dtype = problem.model_of_shape("llama-3.2-1b", over,
      { context = 256, batch = 64, threads = 1, logits_tokens = 1, max_seqs = 1, dtype = "bf16" })
    local by = fig and fig.by or { r.float(0.2e9, 2.5e9) }
    for k = #by + 1, n do by[k] = by[k - 1] * r.float(0.3, 1) end
    fig = fig or { weight_bps = r.float(15e9, 60e9), mha_fixed_ms = r.float(0.002, 0.02), under_load = r.float(1, 1.3),
      load_ms = r.float(0.02, 0.2), transport_ms = r.float(0.01, 0.1) }
    local pr = { shape = { n_heads = 4, head_dim = 64 },
      compute = { weight_bps = { ["1"] = fig.weight_bps }, mha_fixed_ms = { ["1"] = fig.mha_fixed_ms },
        attention_ms_per_token = { ["1"] = 0 }, under_load = fig.under_load },
      disk = { read_bps = by[n], read_bps_by_readers = by, read_bps_alone = by[1], readers = n, load_ms = fig.load_ms },
      link = { transport_ms = fig.transport_ms } }
    if not mem then
      mem = {}
      for i = 1, n do mem[i] = math.floor(2e6 + r.float(0, 1.2) * sizes.weight_bytes / n) end
    end
    return problem.new { model = sizes, shape = problem.shape_of(cfg, dtype), n = n, budgets = mem, profiles = pr,
      cluster = true, context = 256, batch = 64, micro_batch = 1, loader = "uring" }, by, mem
  end

  it("plans no slower than brute force by the estimate on 30 random small problems", function()
    local r = rng(36)
    local n, tried = 0, 0
    local issue = false
    while n < 30 and tried < 200 do
      tried = tried + 1
      local p, by, mem
      if tried == 1 then
        -- issue 36's case: 8 layers, 2 devices, --mem 3558244,8018876, on a disk whose rate falls
        -- by three quarters when both devices read (the DP, pricing every read at that, planned
        -- 19.4 ms/token where brute force found 16.6)
        p, by, mem = shared_problem(r, 8, 2, { 3558244, 8018876 }, { by = { 834e6, 188e6 }, weight_bps = 15.9e9,
          mha_fixed_ms = 0.011, under_load = 1.28, load_ms = 0.049, transport_ms = 0.094 })
      else
        p, by, mem = shared_problem(r, r.int(4, 10), r.int(2, 3))
      end
      local bp, best = brute.search(p, cost)
      if bp then
        n = n + 1
        if tried == 1 then issue = true end
        local what = string.format("problem %d: %d layers, %d devices, --mem %s, disk %s MB/s by readers", tried,
          p.model.n_layers, #p.devices, table.concat(mem, ","),
          table.concat((function() local t = {} for k, v in ipairs(by) do t[k] = string.format("%.0f", v / 1e6) end return t end)(), "/"))
        local q, est = loip_s.search(p, cost)
        assert.is_not_nil(q, what .. ": brute force found a plan, the DP said: " .. tostring(est))
        assert.is_true(est.ms_per_token <= best.ms_per_token * (1 + 1e-9),
          string.format("%s: loip %.4f ms/token, brute force %.4f", what, est.ms_per_token, best.ms_per_token))
        -- (what it reports is what the estimate charges its plan)
        assert.is_true(close(cost.estimate(q, p).ms_per_token, est.ms_per_token), what)
        assert.is_nil(plan.check(q, p.model.n_blocks), what)
        for i, d in ipairs(p.devices) do
          assert.is_true(space.total(p, plan.device_part(q, i, p.model)) <= d.budget, what .. ": device " .. i .. " over its budget")
        end
      end
    end
    assert.are.equal(30, n, "problems with a plan among " .. tried)
    assert.is_true(issue, "the issue's case has no plan")
  end)
end)
