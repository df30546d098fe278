-- The output head cut across devices (a plan's head_shares, loip.plan.ends; issue 38 item 7):
-- device i computes the logits of its share of the vocabulary's rows, the last device sends the
-- step's normalised rows round the ring (LOGITS) and samples from the gathered logits. Each
-- logit is one row's dot product: the logits must be one device's bit for bit and the greedy
-- tokens the same, tied (stories260K) and untied (a vocabulary that is not a multiple of 16),
-- shares of 0 rows included, in memory or read by chunks; a malformed or stale LOGITS message is
-- refused and logged, not a crash; bad head_shares are refused by name.
local ffi = require "ffi"
local loip = require "loip"
local cluster = require "loip.cluster"
local json = require "loip.text.json"
local plan = require "loip.plan"
local T = require "spec.support"
local core = require "loip.core"
local transport = require "loip.runtime.transport"
local C = core.C
teardown(function() T.cleanup() end)

local S260 = T.root .. "/models/stories260K"
local greedy = assert(json.load(S260 .. "/reference/greedy.json"))
local store_of = T.slice_store
teardown(T.drop_stores)

local CTX, BATCH = 256, 7

-- Logits of ids (a copy) and the greedy continuation on one device, in process.
local function one_device(path, ids, n)
  local m = loip.model.open(path, { threads = 1, context = CTX, batch = BATCH, tokenizer = false })
  local out = m:logits(ids)
  local copy = ffi.new("float[?]", #ids * m.vocab_size)
  ffi.copy(copy, out, ffi.sizeof(copy))
  local it, st = m:generate(ids, { temperature = 0, max_tokens = n, stop = {} })
  for _ in it do end
  local V, sizes = m.vocab_size, m.plan_sizes
  m:close()
  return copy, st.token_ids, V, sizes
end

-- An untied synthetic model whose vocabulary (1001) is not a multiple of 16.
local function untied_store()
  local src = T.tmpdir() .. "/synth-shares"
  local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth --like qwen2.5-7b --dtype bf16 --layers 4 --dim 64 "
    .. "--heads 4 --kv-heads 2 --ffn 96 --std 0.3 --vocab 1001 %s", T.loip, src))
  assert.are.equal(0, rc, err)
  return store_of(src, "synth-shares")
end

-- A plan of every block resident, one stage a device, on N devices, the head cut by shares.
local function cut(n_blocks, N, shares, head_rows)
  local p, at = { slots = 1, devices = {}, head_shares = shares, head_rows = head_rows }, 0
  for i = 1, N do
    local len = math.floor(n_blocks / N) + (i <= n_blocks % N and 1 or 0)
    p.devices[i] = { stages = { { blocks = { at, at + len - 1 }, offloaded = 0 } } }
    at = at + len
  end
  return p
end

describe("the head cut across devices (head_shares)", function()
  after_each(function() collectgarbage() collectgarbage() end)

  it("gives one device's logits bit for bit and its greedy tokens on 3 devices, tied and untied, zero-row shares, in memory and by chunks", function()
    local s260 = store_of(S260, "s260-shares")
    local synth = untied_store()
    for _, case in ipairs({ { s260, greedy.cases[1].sequence_ids }, { synth, { 1, 17, 400, 45, 100, 7, 1000, 33, 5, 5, 9 } } }) do
      local st, ids = case[1], case[2]
      local ref_l, ref_t, V, sizes = one_device(st, ids, 16)
      local a = math.floor(V / 3)
      for _, how in ipairs({ { { a, a + 5, V - 2 * a - 5 } }, { { 0, V - 37, 37 } }, { { V - 1, 1, 0 }, 32 }, { { 7, 0, V - 7 }, 16 } }) do
        local shares, head_rows = how[1], how[2]
        local what = st .. " " .. json.encode(shares) .. " head_rows " .. tostring(head_rows)
        local c = cluster.start_local { store = st, devices = 3, threads = 1 }
        local ok, err = pcall(function()
          c:plan { plan = cut(sizes.n_blocks, 3, shares, head_rows), context = CTX, batch = BATCH, logits_tokens = #ids }
          assert.are.equal(0, T.bit_diffs(ref_l, c:logits(ids), #ids * V), what)
          local got = {}
          for id in c:generate(ids, { max_tokens = 16, sampler = { temperature = 0 } }) do got[#got + 1] = id end
          assert.are.same(ref_t, got, what)
        end)
        c:close()
        assert(ok, err)
      end
    end
  end)

  it("on one device, head_shares = { vocabulary } is the head in memory: the same logits", function()
    local synth = untied_store()
    local ids = { 1, 17, 400, 45, 100, 7, 1000, 33, 5, 5, 9 }
    local ref_l, _, V, sizes = one_device(synth, ids, 1)
    for _, head_rows in ipairs({ false, 32 }) do
      local m = loip.model.open(synth, { threads = 1, context = CTX, batch = BATCH, tokenizer = false,
        plan = cut(sizes.n_blocks, 1, { V }, head_rows or nil) })
      assert.are.equal(0, T.bit_diffs(ref_l, m:logits(ids), #ids * V))
      m:close()
    end
  end)

  it("refuses a malformed or stale LOGITS message, logged, and serves on", function()
    local s260 = store_of(S260, "s260-shares")
    local ids = greedy.cases[1].sequence_ids
    local ref_l, ref_t, V, sizes = one_device(s260, ids, 8)
    local c = cluster.start_local { store = s260, devices = 3, threads = 1, keep_logs = true }
    local ok, err = pcall(function()
      c:plan { plan = cut(sizes.n_blocks, 3, { 100, 200, V - 300 }), context = CTX, batch = BATCH, logits_tokens = #ids }
      assert.are.equal(0, T.bit_diffs(ref_l, c:logits(ids), #ids * V))
      local function logged(i, lines)
        local deadline = core.now_ms() + 30000
        repeat
          local log, all = T.read_or_empty(c.devices[i].log), true
          for _, l in ipairs(lines) do all = all and log:find(l, 1, true) ~= nil end
          if all then return end
          C.loip_sleep_ms(50)
        until core.now_ms() > deadline
        error("device " .. i .. " did not log " .. table.concat(lines, ", ") .. "; its log:\n" .. T.read_or_empty(c.devices[i].log):sub(-3000))
      end
      local member = assert(transport.net { token = c.token })
      local m = assert(member:connect(c.devices[2].endpoint, "prober"))
      local rows = ffi.new("uint8_t[?]", 4 * (64 + V) + ffi.sizeof("loip_step_token"))
      -- another plan's (stale); a size its rows and vocabulary do not give; a hop that is not the head's
      m:send { kind = "LOGITS", plan_id = c.plan_id + 7, hop = 3, n_tokens = 1, pos = 1, dim = V, dtype = 0, payload = ffi.string(rows, ffi.sizeof(rows)) }
      m:send { kind = "LOGITS", plan_id = c.plan_id, hop = 3, n_tokens = 1, pos = 1, dim = V, dtype = 0, payload = ffi.string(rows, ffi.sizeof(rows) - 4 * V) }
      m:send { kind = "LOGITS", plan_id = c.plan_id, hop = 1, n_tokens = 1, pos = 1, dim = V, dtype = 0, payload = ffi.string(rows, ffi.sizeof(rows)) }
      logged(2, { "logits for plan " .. (c.plan_id + 7) .. ", this device runs plan " .. c.plan_id .. " (stale)",
        "logits of 1 rows of 1 tokens, vocabulary " .. V .. " (dtype 0) in " .. (ffi.sizeof(rows) - 4 * V) .. " bytes",
        "logits message for hop 1 of 1 rows of 1 tokens, vocabulary " .. V })
      -- home on the last device: tokens of a request its slot does not run
      local m3 = assert(member:connect(c.devices[3].endpoint, "prober"))
      local e = ffi.cast("loip_step_token *", rows + 4 * (64 + V))
      e.seq, e.pos, e.request, e.flags = 0, 0, 4242, 1
      m3:send { kind = "LOGITS", plan_id = c.plan_id, hop = 3, n_tokens = 1, pos = 1, dim = V, dtype = 0, payload = ffi.string(rows, ffi.sizeof(rows)) }
      logged(3, { "logits for token 0 of request 4242 in slot 0 (stale" })
      member:close()
      -- the ring serves on: the same logits and tokens
      assert.are.equal(0, T.bit_diffs(ref_l, c:logits(ids), #ids * V))
      local got = {}
      for id in c:generate(ids, { max_tokens = 8, sampler = { temperature = 0 } }) do got[#got + 1] = id end
      assert.are.same(ref_t, got)
    end)
    c:close()
    os.execute("rm -rf '" .. c.dir .. "'") -- kept for its logs
    assert(ok, err)
  end)

  it("is planned under budgets that hold a third of the head but not all of it: the one device's logits and tokens, every peak within its budget", function()
    local synth = untied_store()
    local ids = { 1, 17, 400, 45, 100, 7, 1000, 33, 5, 5, 9 }
    local ref_l, ref_t, V = one_device(synth, ids, 16)
    local store = require "loip.model.store"
    local man = store.read_manifest(synth)
    -- (one logits row a step: a cut head's devices each hold every row of its logits, a whole
    -- head's devices before the last none, loip.plan.device_bytes; with more rows the budgets
    -- below would leave the others room to take device 3's layers and make way for the head)
    local sizes = plan.sizes(man, (store.config(synth, man)), { context = CTX, batch = BATCH, threads = 1, logits_tokens = 1 })
    -- every block resident, the embedding by rows, the head cut in three in memory: each
    -- device's memory with a little room; the head whole on device 3 does not fit
    local N = 3
    local p = cut(sizes.n_blocks, N, plan.ends.shares(V, N))
    p.embed_rows = plan.ends.CACHE_ROWS
    local mem = {}
    for i = 1, N do mem[i] = plan.memory(p, i, sizes, { cluster = true }).total + 16 * 1024 end
    local whole = plan.bare(p)
    whole.head_shares = nil
    assert.is_true(plan.memory(whole, N, sizes, { cluster = true }).total > mem[N], "the head whole fits device 3")
    local c = cluster.start_local { store = synth, devices = 3, mem = mem, threads = 1 }
    local ok, err = pcall(function()
      -- (a slow disk: the head read every step is priced slower than the cut)
      local q = c:plan { context = CTX, batch = BATCH, logits_tokens = 1, disk_rate = 2e6 }
      assert.is_truthy(q.head_shares, "the head cut: " .. plan.describe(q, c.planner.sizes))
      assert.matches("head: cut by vocabulary rows", plan.describe(q, c.planner.sizes), 1, true)
      assert.are.equal(0, T.bit_diffs(ref_l, c:logits(ids), #ids * V))
      local got = {}
      for id in c:generate(ids, { max_tokens = 16, sampler = { temperature = 0 } }) do got[#got + 1] = id end
      assert.are.same(ref_t, got)
      for i, d in ipairs(c:stats()) do
        assert.is_true(d.peak_bytes <= d.budget_bytes, "device " .. i .. ": peak " .. d.peak_bytes .. " of " .. d.budget_bytes)
      end
    end)
    c:close()
    assert(ok, err)
  end)

  it("is priced by the cost model and the simulator: each share's compute on its device, the LOGITS message's hops", function()
    local synth = untied_store()
    local _, _, V, sizes = one_device(synth, { 1, 2 }, 1)
    local c = cluster.start_local { store = synth, devices = 3, threads = 1 }
    local ok, err = pcall(function()
      local p = cut(sizes.n_blocks, 3, { 300, 300, V - 600 })
      c:plan { plan = p, context = CTX, batch = BATCH }
      local whole = plan.bare(p)
      whole.head_shares = nil
      -- slow links (1 MB/s), the head's compute made large: priced apart
      local q = {}
      for k, v in pairs(c.problem_table) do q[k] = v end
      q.links, q.devices = {}, {}
      for i, l in ipairs(c.problem_table.links) do
        q.links[i] = {}
        for k, v in pairs(l) do q.links[i][k] = v end
        q.links[i].rate_bps = 1e6
      end
      for i, d in ipairs(c.problem_table.devices) do
        q.devices[i] = {}
        for k, v in pairs(d) do q.devices[i][k] = v end
        q.devices[i].compute = setmetatable({ head_ms = 30 }, { __index = d.compute })
      end
      local m = q.model
      local hops = 3 * (m.header_bytes + (m.hidden_bytes + 4 * V)) / 1e6 * 1e3
      local cost = require("loip.policy").load("cost", "loip")
      local e1, e0 = cost.estimate(p, q), cost.estimate(whole, q)
      assert.is_true(e1.ms_per_token - e0.ms_per_token >= 0.99 * hops, e1.ms_per_token .. " vs " .. e0.ms_per_token .. " (hops " .. hops .. ")")
      -- (device 1 computes 300 / V of the head, the last device the rest)
      local d1 = cost.closed(p, q).devices
      assert.is_true(math.abs(d1[1].comp_ms - cost.closed(whole, q).devices[1].comp_ms - 30 * 300 / V) < 1e-6)
      local function simulated(x)
        local s = require("loip.sim").new(q, x, { context = CTX })
        return s:play({ { prompt_tokens = 4, max_tokens = 8 } })[1].ms_per_token
      end
      local s1, s0 = simulated(p), simulated(whole)
      assert.is_true(s1 - s0 >= 0.99 * hops, s1 .. " vs " .. s0 .. " (hops " .. hops .. ")")
    end)
    c:close()
    assert(ok, err)
  end)

  it("refuses bad head_shares by name, and loip plan prints each device's share", function()
    local p = cut(10, 3, { 1, 2 })
    assert.matches("head_shares must be a list of 3 counts", plan.check(p, 10))
    p.head_shares = { 1, -2, 3 }
    assert.matches("head_shares%[2%] must be a count >= 0", plan.check(p, 10))
    p.head_shares = { 1, 2, 3 }
    assert.is_nil(plan.check(p, 10))
    assert.matches("head_shares must sum to the vocabulary %(512 rows%), not 6",
      plan.ends.check_vocab(p, 512, function(f, ...) return string.format(f, ...) end))
    local s260 = store_of(S260, "s260-shares")
    local _, _, V, sizes = one_device(s260, { 1, 2 }, 1)
    local text = plan.describe(cut(sizes.n_blocks, 3, { 200, 0, V - 200 }), sizes)
    assert.matches("head: cut by vocabulary rows across the devices", text, 1, true)
    assert.matches("device 1: 200 rows [0, 200), in memory", text, 1, true)
    assert.matches("device 2: 0 rows [200, 200), none", text, 1, true)
    assert.matches("device 3: " .. (V - 200) .. " rows [200, " .. V .. "), in memory", text, 1, true)
  end)
end)
