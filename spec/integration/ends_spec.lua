-- The embedding and the head that need not stay in memory (loip.plan.ends, issue 38 item 7):
-- a plan may keep the embedding on disk (each token's row read, a few cached) and read the
-- head every step a chunk of vocabulary rows at a time. The logits must stay the resident
-- model's bit for bit (a chunk's logits are concatenated, not reduced), tied or not; budgets
-- below what the resident ends need are planned with them on disk, on 1 and 3 devices, every
-- peak within its budget, the unbudgeted tokens; `loip plan` says where the head went.
local ffi = require "ffi"
local loip = require "loip"
local cluster = require "loip.cluster"
local json = require "loip.text.json"
local plan = require "loip.plan"
local policy = require "loip.policy"
local sim = require "loip.sim"
local store = require "loip.model.store"
local T = require "spec.support"
teardown(function() T.cleanup() end)

local S260 = T.root .. "/models/stories260K"
local greedy = assert(json.load(S260 .. "/reference/greedy.json"))
local store_of = T.slice_store
teardown(T.drop_stores)

local CTX, BATCH = 256, 7

-- Logits of ids (a copy), the greedy continuation and what the model held, then closed.
local function run(path, opts, ids, n)
  opts.threads, opts.context, opts.batch, opts.tokenizer = 1, CTX, BATCH, false
  local m = loip.model.open(path, opts)
  local out = m:logits(ids)
  local copy = ffi.new("float[?]", #ids * m.vocab_size)
  ffi.copy(copy, out, ffi.sizeof(copy))
  local it, st = m:generate(ids, { temperature = 0, max_tokens = n, stop = {} })
  for _ in it do end
  local info = { plan = m.plan, sizes = m.plan_sizes, V = m.vocab_size,
    peak = m.budget and m.budget:peak(), limit = m.budget and m.budget:limit() }
  m:close()
  return copy, st.token_ids, info
end

-- A synthetic BF16 model with an untied head whose vocabulary is most of its bytes.
local synth_src
local function untied_store()
  if synth_src then return synth_src, store_of(synth_src, "synth-untied") end
  local src = T.tmpdir() .. "/synth"
  synth_src = src
  local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth --like qwen2.5-7b --dtype bf16 --layers 4 --dim 64 "
    .. "--heads 4 --kv-heads 2 --ffn 96 --std 0.3 --vocab 4096 %s", T.loip, src))
  assert.are.equal(0, rc, err)
  return src, store_of(src, "synth-untied")
end

-- A plan of every block read from disk, one a stage, on N devices (the least a device holds).
local function all_read(n_blocks, N, ends)
  local p, S, at = { slots = 1, devices = {} }, math.floor(n_blocks / N), 0
  for i = 1, N do p.devices[i] = { stages = {} } end
  for h = 0, N * S - 1 do
    local len = 1 + (h == N * S - 1 and n_blocks - N * S or 0)
    p.devices[h % N + 1].stages[math.floor(h / N) + 1] = { blocks = { at, at + len - 1 }, offloaded = len }
    at = at + len
  end
  if ends then p.embed_rows, p.head_rows = ends.embed_rows, ends.head_rows end
  return p
end

-- Budgets for N devices that a plan with the ends in memory cannot meet but one with them on
-- disk can: each device's least with the ends on disk, and a little room.
local function budgets(sizes, N, opts)
  local on_disk = plan.ends.fallbacks(sizes)[2]
  local out = {}
  for i = 1, N do
    local low = plan.memory(all_read(sizes.n_blocks, N, on_disk), i, sizes, opts).total
    local high = plan.memory(all_read(sizes.n_blocks, N), i, sizes, opts).total
    out[i] = low + math.floor(math.min(64 * 1024, (high - low) / 4))
    if i == 1 or i == N then assert.is_true(out[i] < high, "device " .. i .. ": the ends make no difference here") end
  end
  return out
end

local function sizes_of(st, opts)
  local man = store.read_manifest(st)
  return plan.sizes(man, (store.config(st, man)), opts)
end

-- A tiny Gemma 3 (BF16): a tied table, its rows scaled in their dtype, capped logits when the shape has them.
local function gemma_store()
  local src = T.tmpdir() .. "/gemma"
  local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth --like gemma-3-1b --dtype bf16 --layers 2 --dim 64 --heads 4 "
    .. "--kv-heads 2 --head-dim 16 --ffn 96 --vocab 512 --std 0.25 --seed 5 %s", T.loip, src))
  assert.are.equal(0, rc, err)
  return store_of(src, "gemma-ends")
end

describe("the embedding and head kept on disk", function()
  after_each(function() collectgarbage() collectgarbage() end)

  it("give the resident model's logits bit for bit and its tokens, tied (stories260K) and untied, chunks that do not divide the vocabulary", function()
    local s260 = store_of(S260, "s260")
    local _, synth = untied_store()
    local gemma = gemma_store()
    for _, case in ipairs({ { s260, greedy.cases[1].sequence_ids, true }, { synth, { 1, 17, 4000, 45, 100, 7, 2600, 33, 5, 5, 9 }, false },
      { gemma, { 1, 110, 140, 272, 16, 443, 95, 126, 455, 466, 439, 295 }, true } }) do
      local st, ids = case[1], case[2]
      local ref_l, ref_t, ref = run(st, {}, ids, 24)
      assert.are.equal(case[3], ref.sizes.tied)
      local n = #ids * ref.V
      for _, ends in ipairs({ { embed_rows = 1 }, { head_rows = 48 }, { embed_rows = 5, head_rows = 16 },
        { embed_rows = 64, head_rows = 4096 } }) do
        local p = { slots = 1, devices = { { stages = { { blocks = { 0, ref.sizes.n_blocks - 1 }, offloaded = 2 } } } },
          embed_rows = ends.embed_rows, head_rows = ends.head_rows }
        local what = st .. " " .. json.encode(ends)
        local l, t, info = run(st, { plan = p }, ids, 24)
        assert.are.equal(0, T.bit_diffs(ref_l, l, n), what)
        assert.are.same(ref_t, t, what)
        -- what stays in memory is less by the tables kept on disk
        local m0 = plan.memory({ slots = 1, devices = p.devices }, 1, info.sizes)
        local m1 = plan.memory(p, 1, info.sizes)
        local how = plan.ends.how(plan.ends.of(p), true, true, info.sizes.tied)
        if how.head == "rows" then assert.is_true(m1.weights < m0.weights - info.sizes.head_bytes / 2, what) end
        if how.embed == "rows" and not info.sizes.tied then assert.is_true(m1.weights < m0.weights - info.sizes.embed_file_bytes / 2, what) end
      end
    end
  end)

  it("are planned when a budget is below the resident ends on one device: the same tokens, the peak within the budget", function()
    local _, synth = untied_store()
    local ids = { 1, 17, 4000, 45, 100, 7, 2600, 33, 5, 5, 9 }
    local ref_l, ref_t, ref = run(synth, {}, ids, 24)
    local mem = budgets(ref.sizes, 1, {})[1]
    local l, t, info = run(synth, { mem = mem }, ids, 24)
    assert.is_truthy(info.plan.head_rows, "the head is read from disk")
    assert.is_truthy(info.plan.embed_rows, "the embedding is read from disk")
    assert.are.equal(0, T.bit_diffs(ref_l, l, #ids * ref.V))
    assert.are.same(ref_t, t)
    assert.is_true(info.peak <= info.limit, "peak " .. info.peak .. " of " .. info.limit)
    assert.matches("head: on disk, read every step on device 1", plan.describe(info.plan, info.sizes))
  end)

  it("are planned on 3 devices at budgets the resident ends break: the single device's tokens, every peak within its budget, loip plan shows the head", function()
    local _, synth = untied_store()
    local ids = { 1, 17, 4000, 45, 100, 7, 2600, 33, 5, 5, 9 }
    local ref_l, ref_t, ref = run(synth, {}, ids, 24)
    local sizes = sizes_of(synth, { context = CTX, batch = BATCH, threads = 1, logits_tokens = 4 })
    local mem = budgets(sizes, 3, { cluster = true })
    local c = cluster.start_local { store = synth, devices = 3, mem = mem, threads = 1 }
    local ok, err = pcall(function()
      local p = c:plan { context = CTX, batch = BATCH, logits_tokens = 4 }
      assert.is_truthy(p.head_rows and p.embed_rows, "the ends kept on disk")
      assert.are.equal(0, T.bit_diffs(ref_l, c:logits(ids), #ids * ref.V))
      local it = c:generate(ids, { max_tokens = 24, sampler = { temperature = 0 } })
      local got = {}
      for id in it do got[#got + 1] = id end
      assert.are.same(ref_t, got)
      for i, d in ipairs(c:stats()) do
        assert.is_true(d.peak_bytes <= d.budget_bytes, "device " .. i .. ": peak " .. d.peak_bytes .. " of " .. d.budget_bytes)
      end
      -- the cost model and the simulator price the head's table read every step (and the rows)
      local resident = plan.bare(p)
      resident.embed_rows, resident.head_rows = nil, nil
      local cost = policy.load("cost", "loip")
      local read = c.problem_table.model.head_bytes / c.problem_table.devices[3].disk_bps * 1e3
      local e1, e0 = cost.estimate(p, c.problem_table), cost.estimate(resident, c.problem_table)
      assert.is_true(e1.ms_per_token - e0.ms_per_token >= 0.99 * read, e1.ms_per_token .. " vs " .. e0.ms_per_token)
      -- (the resident plan breaks the budgets: both simulated without them)
      local free = {}
      for k, v in pairs(c.problem_table) do free[k] = v end
      free.devices = {}
      for i, d in ipairs(c.problem_table.devices) do
        free.devices[i] = {}
        for k, v in pairs(d) do free.devices[i][k] = v end
        free.devices[i].budget = 0
      end
      local function simulated(q)
        local s = sim.new(free, q, { context = CTX })
        return s:play({ { prompt_tokens = 4, max_tokens = 8 } })[1].ms_per_token
      end
      local s1, s0 = simulated(p), simulated(resident)
      assert.is_true(s1 - s0 >= 0.99 * read, s1 .. " vs " .. s0)
    end)
    c:close()
    assert(ok, err)
    local kb = {}
    for i, b in ipairs(mem) do kb[i] = math.ceil(b / 1024) .. "K" end
    local rc, _, perr = T.run(string.format("%s plan --model %s --devices 3 --mem %s --context %d --batch %d --threads 1",
      T.loip, synth, table.concat(kb, ","), CTX, BATCH))
    assert.are.equal(0, rc, perr)
    assert.matches("head: on disk, read every step on device 3", perr)
    assert.matches("embedding: on disk, read by token on device 1", perr)
    -- --ends memory keeps them in memory: these budgets hold no plan then
    local rc2, _, err2 = T.run(string.format("%s plan --model %s --devices 3 --mem %s --ends memory --context %d --batch %d --threads 1",
      T.loip, synth, table.concat(kb, ","), CTX, BATCH))
    assert.are.equal(1, rc2, err2)
    assert.matches("device %d", err2)
    local rc3, _, err3 = T.run(string.format("%s plan --model %s --ends disk", T.loip, synth))
    assert.are.equal(2, rc3)
    assert.matches("--ends", err3, 1, true)
  end)

  it("refuses a plan whose ends settings are not counts", function()
    assert.matches("head_rows must be a positive multiple of 16", plan.check({ head_rows = 10, devices = { { stages = { { blocks = { 0, 9 } } } } } }, 10))
    assert.matches("embed_rows must be a positive integer", plan.check({ embed_rows = 0, devices = { { stages = { { blocks = { 0, 9 } } } } } }, 10))
  end)
end)
