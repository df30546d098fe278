-- loip.memory: budgets and their accounts from Lua; a model under a budget charges its
-- weights, KV cache and activations (adding up to the budget's total, given back on close);
-- a budget too small is refused before anything loads, naming the account and the shortfall,
-- from loip.model.open and from `loip generate --mem`; loader slots charge "slots".
local T = require "spec.support"
local loip = require "loip"
local memory = require "loip.runtime.memory"

local S260 = T.root .. "/models/stories260K"
local S260HF = T.root .. "/models/stories260K-hf"
local TOK = S260 .. "/tok512.bin"

local function by_name(report)
  local t = {}
  for _, a in ipairs(report) do t[a.account] = a end
  return t
end

local function sum(report)
  local n = 0
  for _, a in ipairs(report) do n = n + a.bytes end
  return n
end

describe("loip.runtime.memory", function()
  after_each(function() collectgarbage() collectgarbage() T.cleanup() end)

  it("charges, releases and reports accounts with peaks and totals", function()
    local b = memory.budget("1M")
    assert.are.equal(1024 * 1024, b:limit())
    assert.is_true(b:charge("weights", 600 * 1024))
    assert.is_true(b:charge("kv", 100 * 1024))
    b:release("kv", 40 * 1024)
    local r = b:report()
    assert.are.same({ account = "weights", bytes = 600 * 1024, peak = 600 * 1024 }, r[1])
    assert.are.same({ account = "kv", bytes = 60 * 1024, peak = 100 * 1024 }, r[2])
    assert.are.equal(660 * 1024, r.used)
    assert.are.equal(700 * 1024, r.peak)
    assert.are.equal(1024 * 1024 - 660 * 1024, r.free)
    local text = tostring(r)
    assert.matches("weights%s+600.0 KiB", text)
    assert.matches("total%s+660.0 KiB%s+700.0 KiB", text)
    local ok, err = b:charge("kv", 400 * 1024)
    assert.is_nil(ok)
    assert.matches("kv needs 36.0 KiB more", err, 1, true)
    assert.matches("weights 600.0 KiB", err, 1, true)
    assert.are.equal(660 * 1024, b:used())
  end)

  it("rejects misuse", function()
    assert.has_error(function() memory.budget("lots") end)
    assert.has_error(function() memory.budget(-1) end)
    assert.has_error(function() memory.report({}) end)
    assert.has_error(function() loip.model.open(S260, { budget = 5 }) end)
    assert.are.equal("unlimited", tostring(memory.budget(0):report()):match("budget%s+(%a+)"))
  end)

  for _, f in ipairs({ { "llama2.c checkpoint (mapped)", S260, {} },
                       { "Hugging Face copy (loaded)", S260HF, { tokenizer = TOK } } }) do
    it("charges a model's weights, KV cache and activations: " .. f[1], function()
      local opts = { mem = "64M", context = 256 }
      for k, v in pairs(f[3]) do opts[k] = v end
      local m = loip.model.open(f[2], opts)
      local r = memory.report(m)
      local acc = by_name(r)
      assert.is_truthy(acc.weights and acc.kv and acc.activations)
      assert.is_true(acc.weights.bytes >= m.weight_bytes)
      assert.are.equal(tonumber(loip.C.loip_session_kv_bytes(m:session())), acc.kv.bytes)
      assert.are.equal(tonumber(loip.C.loip_session_scratch_bytes(m:session())), acc.activations.bytes)
      assert.are.equal(r.used, sum(r))
      assert.are.equal(64 * 1024 * 1024, r.limit)
      -- the same tokens as without a budget
      local plain = loip.model.open(f[2], { context = 256, tokenizer = f[3].tokenizer })
      local a, b = {}, {}
      for id in m:generate("Once upon a time", { max_tokens = 8, temperature = 0 }) do a[#a + 1] = id end
      for id in plain:generate("Once upon a time", { max_tokens = 8, temperature = 0 }) do b[#b + 1] = id end
      assert.are.same(b, a)
      plain:close()
      local budget = m.budget
      m:close()
      assert.are.equal(0, budget:used())
      assert.is_true(budget:peak() >= r.used)
    end)
  end

  it("shares one budget between models and refuses the one that does not fit", function()
    local b = memory.budget("3M")
    -- (a step of 128 tokens: the activations the arithmetic below is made for)
    local m1 = loip.model.open(S260, { budget = b, context = 256, batch = 128 })
    local used = b:used()
    assert.is_true(used > 1024 * 1024 and used < 2 * 1024 * 1024)
    local ok, err = pcall(loip.model.open, S260, { budget = b, context = 256, batch = 128 })
    assert.is_false(ok)
    assert.matches("memory budget: %a+ needs", err)
    assert.are.equal(used, b:used()) -- the refused model gave back what it had charged, at once
    m1:close()
    assert.are.equal(0, b:used())
  end)

  it("refuses a model that does not fit before loading it, naming the account", function()
    -- weights: 2 MiB of KV cache and activations fit, a megabyte of weights does not
    local ok, err = pcall(loip.model.open, S260HF, { mem = "1.5M", context = 256, batch = 128, tokenizer = TOK })
    assert.is_false(ok)
    assert.matches("memory budget: weights needs [%d.]+ KiB more", err)
    assert.matches("kv ", err, 1, true)
    -- kv: charged first, before any weight is read
    ok, err = pcall(loip.model.open, S260, { mem = "100K", context = 256 })
    assert.is_false(ok)
    assert.matches("memory budget: kv needs [%d.]+ KiB more", err)
    assert.matches("of the 100.0 KiB budget", err, 1, true)
  end)

  it("loip generate --mem: runs within the budget, exits 1 naming the account when too small", function()
    local rc, out, err = T.run(string.format("%s generate --model %s --prompt Once --temperature 0 --max-tokens 5 --mem 16M --verbose",
      T.loip, S260))
    assert.are.equal(0, rc, err)
    assert.matches("^Once", out)
    assert.matches("weights", err, 1, true)
    assert.matches("kv", err, 1, true)
    rc, out, err = T.run(string.format("%s generate --model %s --prompt Once --mem 100K", T.loip, S260))
    assert.are.equal(1, rc)
    assert.matches("memory budget: kv needs", err, 1, true)
    assert.matches("pass a larger --mem", err, 1, true)
    rc, _, err = T.run(string.format("%s generate --model %s --mem lots", T.loip, S260))
    assert.are.equal(2, rc)
    assert.matches("--mem", err, 1, true)
  end)

  it("pages the KV cache: whole blocks charged, results independent of the context's rounding", function()
    local a = loip.model.open(S260, { mem = "64M", context = 100, batch = 7 })
    local b = loip.model.open(S260, { context = 256 })
    local s = a:session()
    local bt = loip.C.loip_session_kv_block_tokens(s)
    assert.are.equal(tonumber(loip.C.LOIP_KV_BLOCK_TOKENS), bt)
    local c = a.cfg
    -- one sequence: groups of bt positions of every layer, its block table, the free list and
    -- the layers' slots
    local groups = math.ceil(100 / bt)
    assert.are.equal(groups * c.n_layers * bt * c.n_kv_heads * c.head_dim * 4 * 2 + (groups + groups + c.n_layers) * 4,
      tonumber(loip.C.loip_session_kv_bytes(s)))
    assert.are.equal(tonumber(loip.C.loip_session_kv_bytes(s)), by_name(memory.report(a)).kv.bytes)
    -- 100 positions cross six block boundaries, prefilled 7 at a time (batches straddle them)
    local ids = {}
    for i = 1, 100 do ids[i] = (i * 37) % 512 end
    local la = a:logits(ids)
    local lb = b:logits(ids)
    local differ = 0
    for i = 0, 100 * 512 - 1 do if la[i] ~= lb[i] then differ = differ + 1 end end
    assert.are.equal(0, differ)
    a:close()
    b:close()
  end)

  it("charges loader slots", function()
    local b = memory.budget("1M")
    local l = assert(loip.loader.new({ slot_bytes = 256 * 1024, slots = 2, mode = "buffered", budget = b,
      request_bytes = 64 * 1024 }))
    assert.are.equal(512 * 1024, by_name(b:report()).slots.bytes)
    assert.are.equal(64 * 1024, by_name(b:report()).scratch.bytes) -- the bounce buffer
    local l2, err = loip.loader.new({ slot_bytes = 256 * 1024, slots = 3, mode = "buffered", budget = b })
    assert.is_nil(l2)
    assert.matches("slots needs 320.0 KiB more", err, 1, true)
    l:close()
    assert.are.equal(0, b:used())
  end)

  it("grows the KV account with the contexts held, never past the pool, back when requests end", function()
    local m = loip.model.open(S260, { mem = "64M", context = 256, max_batch = 2, kv_grows = true })
    local C = loip.C
    local s = m:session()
    local pool = tonumber(C.loip_session_kv_bytes(s))
    local kv = function() return by_name(memory.report(m)).kv.bytes end
    local idle = kv()
    assert.is_true(idle < pool / 100, "only the tables while no request holds KV")
    local group = m.cfg.n_layers * 16 * m.cfg.n_kv_heads * m.cfg.head_dim * 4 * 2
    local seen = {}
    local it = m:generate({ 1, 403, 407 }, { temperature = 0, max_tokens = 60, stop = {} })
    for id in it do if id then seen[#seen + 1] = kv() end end -- (a last (false, text) may follow)
    -- 3 + 60 positions: 4 groups of 16, taken as the context reached them (the last token comes
    -- when its request has ended, its groups back)
    assert.are.equal(idle + group, seen[1])
    assert.are.equal(idle + 4 * group, math.max(unpack(seen)))
    for k = 2, #seen - 1 do assert.is_true(seen[k] >= seen[k - 1]) end
    assert.is_true(m.budget:peak() <= m.budget:limit())
    assert.are.equal(idle, kv(), "the request's groups went back when it ended")
    -- the same tokens as with the pool charged at once
    local m2 = loip.model.open(S260, { context = 256 })
    local a, b = {}, {}
    for id in m:generate({ 1, 403, 407 }, { temperature = 0, max_tokens = 40, stop = {} }) do a[#a + 1] = id end
    for id in m2:generate({ 1, 403, 407 }, { temperature = 0, max_tokens = 40, stop = {} }) do b[#b + 1] = id end
    assert.are.same(b, a)
    -- a budget that cannot pay for the next group: a clear error naming the account
    local small = memory.budget(m.budget:used() + group + 1000)
    local m3 = loip.model.open(S260, { budget = small, context = 256, kv_grows = true })
    local ok, err = pcall(function() for _ in m3:generate({ 1, 403, 407 }, { temperature = 0, max_tokens = 60, stop = {} }) do end end)
    assert.is_false(ok)
    assert.matches("KV cache: sequence 0 at position", err, 1, true)
    assert.matches("kv", err, 1, true)
    m3:close()
    m2:close()
    m:close()
  end)
end)
