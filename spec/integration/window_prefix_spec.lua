-- The exact prefix cache on models with sliding-window layers (issue 38 item 4; docs/prefix-cache.md,
-- "Sliding windows"): Gemma 3 and gpt-oss shapes (`loip synth --like gemma-3-1b|gpt-oss-20b
-- --sliding-window 16`, prompts of several windows, so that the rings wrap) keep a request's full
-- groups and, on the last, a snapshot of the rings at its end; a second request extending the
-- first's prompt and tokens reuses them (a hit, its cached tokens counted) and gives the tokens
-- of a cold run, its logits after the adopted groups bit for bit a full prefill's; a prompt that
-- matches only part of a kept run (no rings kept at that end) is a miss and still exact; the
-- snapshots are charged to "prompt_cache" and freed with their groups when evicted, every peak
-- within its budget; a restart reads the run back from the disk tier, groups and rings, the logits
-- after it bit for bit; a request recomputing a held run (prompts sharing a system prompt) leaves
-- the rings at its end, and the next one sharing as much hits, exactly; 3 local devices reuse the
-- prefix with one device's tokens, the system prompt too.
local loip = require "loip"
local exec = require "loip.runtime.exec"
local prefix_cache = require "loip.engine.request.prefix_cache"
local T = require "spec.support"
teardown(function() T.cleanup() end)
teardown(T.drop_stores)

local GEMMA = "--like gemma-3-1b --dtype f32 --layers 6 --dim 64 --heads 4 --kv-heads 2 --head-dim 16 --ffn 96 "
  .. "--vocab 512 --std 0.25 --seed 5 --sliding-window 16"
local GPT_OSS = "--like gpt-oss-20b --dtype f32 --experts-dtype f32 --layers 2 --dim 64 --heads 4 --kv-heads 2 "
  .. "--head-dim 16 --ffn 32 --experts 4 --vocab 512 --std 0.25 --seed 5 --sliding-window 16"

local dirs = {}
local function synth(flags)
  if dirs[flags] then return dirs[flags] end
  local dir = T.tmpdir() .. "/hf"
  local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth %s %s", T.loip, flags, dir))
  assert(rc == 0, err)
  dirs[flags] = dir
  return dir
end

local function ids(n, seed)
  local out = {}
  for i = 1, n do out[i] = 1 + (i * 53 + seed * 31) % 500 end
  return out
end

local function run(b, prompt, max_tokens)
  local r = b:submit { prompt = prompt, max_tokens = max_tokens or 20, sampler = { temperature = 0 }, stop = {} }
  r:wait()
  return r
end

-- a's prompt, its tokens, then more: what an agent's next turn sends
local function extend(prompt, r, more)
  local out = { unpack(prompt) }
  for _, id in ipairs(r.token_ids) do out[#out + 1] = id end
  for _, id in ipairs(more) do out[#out + 1] = id end
  return out
end

local last_logits = T.last_logits

-- The 32-bit words that differ between the last logits of prompt after its first k groups adopted
-- from batcher b's cache and after a full prefill, in sequence 1 of m's session (its rings first
-- written over with other positions: only the adopted snapshot can make them right).
local function adopted_vs_full(m, b, prompt, k)
  local s, V, kb = m:session(), m.vocab_size, b.engine.kv_block
  last_logits(s, ids(100, 9), 0, 1, 7, V)
  assert(exec.session_seq_free(s, 1))
  local keys = prefix_cache.chain(b.prefix.identity, prompt, kb, k)
  assert.are.equal(k, (b.engine:cache_lookup(keys)))
  b.engine:cache():adopt(1, keys)
  local cached = last_logits(s, prompt, k * kb, 1, 7, V)
  assert(exec.session_seq_free(s, 1))
  local full = last_logits(s, prompt, 0, 1, 7, V)
  assert(exec.session_seq_free(s, 1))
  return T.bit_diffs(full, cached, V)
end

describe("the prefix cache over sliding windows", function()
  after_each(function() collectgarbage() collectgarbage() end)

  for _, family in ipairs({ { "gemma3", GEMMA }, { "gpt-oss", GPT_OSS } }) do
    it("reuses a " .. family[1] .. " prefix whose rings wrapped: a hit, a cold run's tokens, logits bit for bit", function()
      local dir = synth(family[2])
      local m = loip.model.open(dir, { threads = 1, context = 256, max_batch = 2, prefix_cache = true, tokenizer = false })
      local m0 = loip.model.open(dir, { threads = 1, context = 256, max_batch = 2, tokenizer = false })
      local b, b0 = m:batcher(), m0:batcher()
      assert.is_true(b.engine.kv_windows, "the window layers keep rings")
      assert.is_not_nil(b.prefix, "the prefix cache is on")
      local kb = b.engine.kv_block
      local a = ids(70, 1)
      local r1 = run(b, a)
      assert.are.equal(0, r1.cached_tokens)
      assert.are.same(run(b0, a).token_ids, r1.token_ids)
      -- r1 wrote 89 positions: 5 full groups kept, the rings at 80 with the last
      local held = b.engine:cache_stats()[1]
      assert.are.equal(1, held.window_snapshots)
      -- a prompt sharing only r1's first 40 tokens: groups held to 32, but no rings kept there: a miss
      -- (and the slot's rings written over with other positions before r2 reuses it)
      local pc = { unpack(a, 1, 40) }
      for _, id in ipairs(ids(50, 3)) do pc[#pc + 1] = id end
      local r3 = run(b, pc)
      assert.are.equal(0, r3.cached_tokens, "no run ends at 32 with its rings")
      assert.are.same(run(b0, pc).token_ids, r3.token_ids)
      -- (r3 left its rings at 32 to r1's held group there, and kept its own run with its rings)
      assert.are.equal(3, b.engine:cache_stats()[1].window_snapshots)
      local pb = extend(a, r1, ids(10, 2))
      local r2 = run(b, pb)
      assert.are.equal(5 * kb, r2.cached_tokens, "the kept run reused")
      assert.is_true(r2.cached_tokens > 4 * 16, "past several windows")
      assert.are.same(run(b0, pb).token_ids, r2.token_ids, "a cold run's tokens")
      local st = b.prefix.stats
      assert.are.same({ 3, 1, 2, 5 * kb }, { st.lookups, st.hits, st.misses, st.cached_tokens })
      -- reused KV against recomputed: the logits after the adopted groups equal a full prefill's
      assert.are.equal(0, adopted_vs_full(m, b, pb, 5), "bit-identical")
      -- a run without its rings is refused by name
      local ok, err = pcall(function() b.engine:cache():adopt(1, prefix_cache.chain(b.prefix.identity, pb, kb, 1)) end)
      assert.is_false(ok)
      assert.matches("carries no sliding%-window rings at position 16", tostring(err))
      m:close() m0:close()
    end)
  end

  it("leaves the rings at a held run's end to the next request sharing as much (a system prompt): a hit, exact", function()
    local dir = synth(GEMMA)
    local m = loip.model.open(dir, { threads = 1, context = 256, max_batch = 2, prefix_cache = true, tokenizer = false })
    local m0 = loip.model.open(dir, { threads = 1, context = 256, max_batch = 2, tokenizer = false })
    local b, b0 = m:batcher(), m0:batcher()
    local kb = b.engine.kv_block
    local system = ids(52, 7) -- 3 full groups of a shared prefix, then each request's own question
    local function ask(seed)
      local p = { unpack(system) }
      for _, id in ipairs(ids(30, seed)) do p[#p + 1] = id end
      return p
    end
    local q1, q2, q3 = ask(11), ask(12), ask(13)
    local r1 = run(b, q1)
    assert.are.equal(0, r1.cached_tokens)
    -- the second holds 3 groups of the first's run but no rings at 48: recomputed, the rings left there
    local r2 = run(b, q2)
    assert.are.equal(0, r2.cached_tokens)
    local r3 = run(b, q3)
    assert.are.equal(3 * kb, r3.cached_tokens, "the shared prefix reused")
    assert.are.same(run(b0, q3).token_ids, r3.token_ids)
    assert.are.same(run(b0, q2).token_ids, r2.token_ids)
    -- the logits after the shared prefix adopted (into rings another prompt wrote) against a full prefill's
    assert.are.equal(0, adopted_vs_full(m, b, ask(14), 3), "bit-identical")
    m:close() m0:close()
  end)

  it("charges the rings' snapshots to prompt_cache and frees them with their groups; peaks within the budget", function()
    local st = T.slice_store(synth(GEMMA), "gemma3-windows")
    local m = loip.model.open(st, { threads = 1, mem = "3M", context = 256, max_batch = 1, kv_tokens = 128, kv_grows = true,
      prefix_cache = true, tokenizer = false })
    local m0 = loip.model.open(st, { threads = 1, context = 256, tokenizer = false })
    local b, b0 = m:batcher(), m0:batcher()
    local function account(name)
      for _, x in ipairs(m.budget:report()) do if x.account == name then return x.bytes end end
      return 0
    end
    local a = ids(70, 1)
    local r1 = run(b, a)
    local held = b.engine:cache_stats()[1]
    local s = m:session()
    local sh = exec.session_kv_share_stats(s)
    assert.are.equal(1, held.window_snapshots)
    -- the snapshot: 15 positions (window - 1) of 5 window layers' K and V, 2 heads of 16
    local snap = 2 * 5 * 15 * 2 * 16 * 4
    assert.are.equal(sh.cache_groups * exec.session_kv_group_bytes(s) + snap, held.bytes)
    assert.are.equal(held.bytes, account("prompt_cache"), "held groups and the snapshot charged to prompt_cache")
    local pb = extend(a, r1, ids(10, 2))
    local r2 = run(b, pb)
    assert.are.equal(80, r2.cached_tokens)
    assert.are.same(run(b0, pb).token_ids, r2.token_ids)
    -- a prompt needing the whole pool: the held groups go, their snapshots with them
    local big = ids(120, 4)
    local r3 = run(b, big, 7)
    local after = b.engine:cache_stats()[1]
    assert.is_true(after.evictions > 0, "evicted for the request")
    assert.are.same(run(b0, big, 7).token_ids, r3.token_ids)
    assert.are.equal(after.bytes, account("prompt_cache"), "what is charged is what is held")
    local n_snaps = exec.session_kv_share_stats(s).window_snapshots
    assert.are.equal(after.bytes, exec.session_kv_share_stats(s).cache_groups * exec.session_kv_group_bytes(s) + n_snaps * snap)
    assert.is_true(m.budget:peak() <= m.budget:limit(), "the peak within the budget")
    m:close() m0:close()
  end)

  it("reads a window model's prefix back from the disk tier after a restart, its rings with it: logits bit for bit", function()
    local dir = synth(GEMMA)
    local cache = T.tmpdir() .. "/cache"
    local function open(on)
      return loip.model.open(dir, { threads = 1, context = 256, max_batch = 2, tokenizer = false, prefix_cache = on,
        prompt_cache_dir = on and cache or nil })
    end
    local m = open(true)
    local b = m:batcher()
    local a = ids(70, 1)
    local r1 = run(b, a)
    local names = require("loip.runtime.shell").list(cache) or {}
    local kinds = {}
    for _, name in ipairs(names) do
      local kind = name:match("%.d1%.(%a+)$")
      if kind then kinds[kind] = (kinds[kind] or 0) + 1 end
    end
    assert.are.same({ kv = 5, win = 1 }, kinds, "the 5 kept groups and the rings at their end written through")
    m:close()
    -- restarted: the run read back, groups and rings
    m = open(true)
    b = m:batcher()
    local pb = extend(a, r1, ids(10, 2))
    local r2 = run(b, pb)
    assert.are.equal(80, r2.cached_tokens, "the run from disk")
    local st = b.engine:cache_stats()[1]
    assert.are.equal(6, st.disk_reads, "5 groups and a snapshot read back")
    local m0 = open(false)
    assert.are.same(run(m0:batcher(), pb).token_ids, r2.token_ids, "a cold run's tokens")
    m:close()
    -- restarted again: the logits after the run adopted from disk against a full prefill's
    m = open(true)
    b = m:batcher()
    assert.are.equal(0, adopted_vs_full(m, b, pb, 5), "bit-identical")
    m:close() m0:close()
  end)

  it("reuses a window model's prefix on 3 local devices: one device's tokens", function()
    local st = T.slice_store(synth(GEMMA), "gemma3-windows")
    local m0 = loip.model.open(st, { threads = 1, context = 256, max_batch = 2, tokenizer = false })
    local cluster = require "loip.cluster"
    local c = cluster.start_local { store = st, devices = 3, threads = 1 }
    local ok, err = pcall(function()
      c:plan { context = 256, batch = 16, max_batch = 2, stages = 2 }
      local b = c:batcher({ prefix_cache = true })
      assert.is_not_nil(b.prefix)
      local a = ids(70, 1)
      local r1 = run(b, a)
      assert.are.equal(0, r1.cached_tokens)
      run(b, ids(90, 3)) -- (other rows in the rings)
      local pb = extend(a, r1, ids(10, 2))
      local r2 = run(b, pb)
      assert.are.equal(80, r2.cached_tokens)
      local b0 = m0:batcher()
      assert.are.same(run(b0, a).token_ids, r1.token_ids)
      assert.are.same(run(b0, pb).token_ids, r2.token_ids)
      for i, x in ipairs(c:cache_stats()) do
        assert.is_true(x.groups > 0 or x.shared_groups > 0, "device " .. i .. " holds its layers' groups")
      end
      -- a shared system prompt: the second recomputes it and leaves the rings at its end on every device
      local system = ids(52, 7)
      local function ask(seed)
        local p = { unpack(system) }
        for _, id in ipairs(ids(30, seed)) do p[#p + 1] = id end
        return p
      end
      assert.are.equal(0, run(b, ask(11)).cached_tokens)
      assert.are.equal(0, run(b, ask(12)).cached_tokens)
      local r3 = run(b, ask(13))
      assert.are.equal(48, r3.cached_tokens, "the system prompt reused on every device")
      assert.are.same(run(b0, ask(13)).token_ids, r3.token_ids)
    end)
    c:close()
    m0:close()
    assert(ok, err)
  end)
end)
