-- The exact prefix cache (loip.engine.request.prefix_cache, docs/prefix-cache.md): a second request
-- sharing a prefix with an earlier one adopts the KV groups the devices hold and computes only
-- the rest, and gives the tokens it gives without the cache (temperature 0), on one device and
-- on 3 local devices that offload; the logits computed after adopted groups are bit-identical to a
-- full prefill's (the kernels compute each row alone: no batch-size-dependent reduction); held
-- groups are charged to "prompt_cache", evicted before a request's KV fails, and every budget's
-- peak stays within it; n = 3 over a cached prefix gives three equal choices; `loip serve` reports
-- usage.prompt_tokens_details.cached_tokens and the cache's /metrics, and --no-prompt-cache
-- (prefix_cache = false) keeps nothing.
local loip = require "loip"
local cluster = require "loip.cluster"
local client = require "loip.runtime.http_client"
local exec = require "loip.runtime.exec"
local json = require "loip.text.json"
local prefix_cache = require "loip.engine.request.prefix_cache"
local T = require "spec.support"
teardown(function() T.cleanup() end)
teardown(T.drop_stores)

local S260 = T.root .. "/models/stories260K"
local STORY = ("Once upon a time there was a little girl named Lily. She liked to play in the park with her dog. "):rep(3)

local function prompts(tok)
  local base = tok:encode(STORY, { bos = true })
  local a, b = { unpack(base) }, { unpack(base) }
  for _, id in ipairs(tok:encode(" One day she saw a big red ball.", { bos = false })) do a[#a + 1] = id end
  for _, id in ipairs(tok:encode(" Her mom said it was time to go home.", { bos = false })) do b[#b + 1] = id end
  return base, a, b
end

local function run(b, ids, n)
  local r = b:submit { prompt = ids, max_tokens = 24, sampler = { temperature = 0 }, n = n }
  for _, c in ipairs(r.choices or { r }) do c:wait() end
  return r
end

local last_logits = T.last_logits

describe("the prefix cache", function()
  after_each(function() collectgarbage() collectgarbage() end)

  it("reuses a cached prefix on one device: the tokens without the cache, logits bit for bit", function()
    local m = loip.model.open(S260, { threads = 1, context = 512, max_batch = 2, prefix_cache = true })
    local m0 = loip.model.open(S260, { threads = 1, context = 512, max_batch = 2 })
    local base, pa, pb = prompts(m.tokenizer)
    local b, b0 = m:batcher(), m0:batcher()
    assert.is_nil(b0.prefix, "off unless asked")
    local r1 = run(b, pa)
    assert.are.equal(0, r1.cached_tokens)
    local r2 = run(b, pb)
    local kb = b.engine.kv_block
    assert.are.equal(math.floor(#base / kb) * kb, r2.cached_tokens, "the shared prompt's full groups")
    assert.are.same(run(b0, pa).token_ids, r1.token_ids)
    assert.are.same(run(b0, pb).token_ids, r2.token_ids)
    -- the same prompt again: everything but its last token cached
    local r3 = run(b, pb)
    assert.are.equal(math.floor((#pb - 1) / kb) * kb, r3.cached_tokens)
    assert.are.same(r2.token_ids, r3.token_ids)
    local st = b.prefix.stats
    assert.are.same({ 3, 2, 1 }, { st.lookups, st.hits, st.misses })
    assert.are.equal(r2.cached_tokens + r3.cached_tokens, st.cached_tokens)
    assert.is_true(b.engine:cache_stats()[1].groups > 0)
    -- reused KV against recomputed: the logits after the adopted groups equal a full prefill's
    local s, V = m:session(), m.vocab_size
    local full = last_logits(s, pb, 0, 1, 64, V)
    assert(exec.session_seq_free(s, 1))
    local k = b.engine:cache():lookup(prefix_cache.chain(b.prefix.identity, pb, kb, math.floor((#pb - 1) / kb)))
    assert.is_true(k > 0)
    b.engine:cache():adopt(1, prefix_cache.chain(b.prefix.identity, pb, kb, k))
    local cached = last_logits(s, pb, k * kb, 1, 64, V)
    assert(exec.session_seq_free(s, 1))
    assert.are.equal(0, T.bit_diffs(full, cached, V), "bit-identical")
    m:close() m0:close()
  end)

  it("gives n choices of a prompt whose every position but the last is cached (nothing left to prefill first)", function()
    local m = loip.model.open(S260, { threads = 1, context = 512, max_batch = 3, prefix_cache = true })
    local b = m:batcher()
    local kb = b.engine.kv_block
    local base = prompts(m.tokenizer)
    local ids = {}
    for i = 1, 4 * kb + 1 do ids[i] = base[i] end -- 4 full groups and the last token
    local one = run(b, ids)
    local r = b:submit { prompt = ids, max_tokens = 24, sampler = { temperature = 0 }, n = 3 }
    for _ = 1, 200 do if not b:busy() then break end b:step() end
    assert.is_false(b:busy(), "the choices ran")
    assert.are.equal(4 * kb, r.cached_tokens)
    for _, c in ipairs(r.choices) do assert.are.same(one.token_ids, c.token_ids) end
    assert.are.equal(0, b.kv_used)
    m:close()
  end)

  it("evicts held groups before a request's KV fails; every peak within its budget", function()
    local st = T.slice_store(S260, "s260")
    local m = loip.model.open(st, { threads = 1, mem = "1000K", context = 256, max_batch = 1, kv_tokens = 128, kv_grows = true,
      prefix_cache = true })
    local m0 = loip.model.open(S260, { threads = 1, context = 256 })
    local _, pa, pb = prompts(m.tokenizer)
    local b = m:batcher()
    local r1 = run(b, pa)
    local function account(name)
      for _, a in ipairs(m.budget:report()) do if a.account == name then return a.bytes end end
      return 0
    end
    local held = b.engine:cache_stats()[1]
    assert.is_true(held.groups > 0)
    assert.are.equal(held.bytes, account("prompt_cache"), "held groups charged to prompt_cache")
    -- another prompt needing the whole pool: the cache gives its groups back
    local other = m.tokenizer:encode(("The cat sat on the mat and looked at the sun. "):rep(5), { bos = true })
    local r2 = run(b, other)
    local after = b.engine:cache_stats()[1]
    assert.is_true(after.evictions > 0, "evicted for the request")
    assert.are.same(run(m0:batcher(), other).token_ids, r2.token_ids)
    assert.are.same(run(m0:batcher(), pa).token_ids, r1.token_ids)
    assert.is_true(m.budget:peak() <= m.budget:limit(), "the peak within the budget")
    local r3 = run(b, pb)
    assert.are.same(run(m0:batcher(), pb).token_ids, r3.token_ids)
    m:close() m0:close()
  end)

  it("reuses a cached prefix on 3 offloading devices: one device's tokens; n = 3 over it", function()
    local st = T.slice_store(S260, "s260")
    local m0 = loip.model.open(S260, { threads = 1, context = 512, max_batch = 3 })
    local _, pa, pb = prompts(m0.tokenizer)
    local c = cluster.start_local { store = st, devices = 3, threads = 1, mem = { "1000K", "1000K", "1000K" } }
    local ok, err = pcall(function()
      c:plan { context = 512, batch = 32, max_batch = 3, kv_tokens = 3 * 256 }
      local b = c:batcher({ prefix_cache = true })
      assert.are.equal(0, run(b, pa).cached_tokens)
      local r2 = run(b, pb)
      assert.is_true(r2.cached_tokens >= 64, "cached " .. r2.cached_tokens)
      assert.are.same(run(m0:batcher(), pb).token_ids, r2.token_ids)
      for i, x in ipairs(c:cache_stats()) do assert.is_true(x.groups > 0, "device " .. i .. " holds its layers' groups") end
      local r = run(b, pa, 3)
      assert.is_true(r.cached_tokens > 0)
      local want = run(m0:batcher(), pa).token_ids
      for _, x in ipairs(r.choices) do assert.are.same(want, x.token_ids) end
      for i, d in ipairs(c:stats()) do
        assert.is_true(d.peak_bytes <= d.budget_bytes, "device " .. i .. "'s peak within its budget")
      end
    end)
    c:close()
    m0:close()
    assert(ok, err)
  end)

  it("reports cached tokens in usage and on /metrics through loip serve; off with prefix_cache = false", function()
    local server = require "loip.serve.server"
    for _, on in ipairs({ true, false }) do
      local m = loip.model.open(S260, { threads = 1, context = 512 })
      local srv = server.new { model = m, tokenizer = m.tokenizer, dir = S260, name = "stories260K", port = 0, quiet = true,
        prefix_cache = on }
      local cl = client.new()
      local function go(t)
        while cl:busy() do srv:turn(5) cl:run(5) end
        return t
      end
      local ok, err = pcall(function()
        local url = string.format("http://127.0.0.1:%d", srv.port)
        local body = json.encode({ model = "stories260K", prompt = STORY, max_tokens = 8, temperature = 0 })
        local a = json.decode(go(cl:post(url .. "/v1/completions", body)).body)
        local b = json.decode(go(cl:post(url .. "/v1/completions", body)).body)
        assert.are.equal(a.choices[1].text, b.choices[1].text)
        assert.are.equal(0, a.usage.prompt_tokens_details.cached_tokens)
        local metrics = go(cl:get(url .. "/metrics")).body
        if on then
          assert.is_true(b.usage.prompt_tokens_details.cached_tokens >= 64)
          assert.matches("\nloip_prompt_cache_hits_total 1\n", metrics, 1, true)
          assert.matches("\nloip_prompt_cache_tokens_total " .. b.usage.prompt_tokens_details.cached_tokens .. "\n", metrics, 1, true)
          assert.matches('loip_prompt_cache_bytes{device="1",tier="memory"} %d+', metrics)
        else
          assert.are.equal(0, b.usage.prompt_tokens_details.cached_tokens)
          assert.is_nil(metrics:find("loip_prompt_cache", 1, true))
        end
      end)
      cl:close() srv:close() m:close()
      assert(ok, err)
    end
  end)
end)

describe("the prefix cache's disk tier", function()
  after_each(function() collectgarbage() collectgarbage() end)

  local function kv_files(dir, device)
    local n = 0
    for _, name in ipairs(require("loip.runtime.shell").list(dir) or {}) do
      if name:match("%.d" .. device .. "%.kv$") then n = n + 1 end
    end
    return n
  end

  it("serves a prefix again after a restart, ignores files of another store, and keeps within its bound", function()
    local dir = T.tmpdir() .. "/cache"
    local m0 = loip.model.open(S260, { threads = 1, context = 512 })
    local _, pa, pb = prompts(m0.tokenizer)
    local want = run(m0:batcher(), pb).token_ids
    local m = loip.model.open(S260, { threads = 1, context = 512, prefix_cache = true, prompt_cache_dir = dir })
    assert.are.equal(0, run(m:batcher(), pa).cached_tokens)
    local written = kv_files(dir, 1)
    assert.is_true(written >= 6, "every held group written through: " .. written)
    m:close()
    -- a file of another store under a key's name, and one that is not a cache file at all
    local names = require("loip.runtime.shell").list(dir)
    local some = dir .. "/" .. names[1]
    local foreign = T.read(some):gsub('"identity":"[^"]*"', '"identity":"store:0000"')
    T.write(dir .. "/" .. string.rep("ab", 32) .. ".d1.kv", foreign)
    T.write(dir .. "/" .. string.rep("cd", 32) .. ".d1.kv", "not a cache file")
    -- restarted: the index from the directory; the shared prefix read back with the loader
    m = loip.model.open(S260, { threads = 1, context = 512, prefix_cache = true, prompt_cache_dir = dir })
    local b = m:batcher()
    local r = run(b, pb)
    assert.are.equal(80, r.cached_tokens)
    assert.are.same(want, r.token_ids)
    local st = b.engine:cache_stats()[1]
    assert.are.equal(5, st.disk_reads, "the prompt's 5 full groups from disk")
    assert.is_nil(io.open(dir .. "/" .. string.rep("cd", 32) .. ".d1.kv"), "a file that does not parse is removed")
    assert.is_truthy(io.open(dir .. "/" .. string.rep("ab", 32) .. ".d1.kv"), "another store's file is left alone")
    m:close()
    -- under a budget: the buffer files are read into is charged to it (slots) while they are read
    m = loip.model.open(S260, { threads = 1, context = 512, prefix_cache = true, prompt_cache_dir = dir, mem = "4M" })
    b = m:batcher()
    local slots0
    for _, a in ipairs(m.budget:report()) do if a.account == "slots" then slots0 = a.peak end end
    r = run(b, pb)
    local kb = b.engine.kv_block
    assert.are.equal(math.floor((#pb - 1) / kb) * kb, r.cached_tokens, "pb's own groups, written through before")
    local rep = m.budget:report()
    local group = exec.session_kv_group_bytes(m:session())
    for _, a in ipairs(rep) do
      if a.account == "slots" then
        assert.is_true(a.peak >= (slots0 or 0) + r.cached_tokens / kb * group, "the staging buffer was charged")
        assert.are.equal(slots0 and a.bytes or 0, a.bytes, "and given back")
      end
    end
    assert.is_true(rep.peak <= rep.limit)
    m:close()
    -- a bound of 3 files: the least recently used go
    m = loip.model.open(S260, { threads = 1, context = 512, prefix_cache = true, prompt_cache_dir = dir,
      prompt_cache_disk = 3 * require("loip.engine.request.prefix_disk").HEADER * 6 })
    b = m:batcher()
    run(b, pa)
    assert.is_true(b.engine:cache_stats()[1].disk_bytes <= 3 * 4096 * 6)
    assert.is_true(kv_files(dir, 1) <= 4, "the bound holds (and the foreign file stays)")
    m:close() m0:close()
  end)

  it("is a usage error beside --no-prompt-cache", function()
    local rc, _, err = T.run(string.format("%s serve --model %s --no-prompt-cache --prompt-cache-dir %s/c --port 0", T.loip, S260,
      T.tmpdir()))
    assert.are.equal(2, rc)
    assert.matches("--prompt-cache-dir", err, 1, true)
  end)

  it("serves a prefix from every device's disk after a restart of a 3-device cluster", function()
    local st = T.slice_store(S260, "s260")
    local dir = T.tmpdir() .. "/cache"
    local m0 = loip.model.open(S260, { threads = 1, context = 512 })
    local _, pa, pb = prompts(m0.tokenizer)
    local want = run(m0:batcher(), pb).token_ids
    for round = 1, 2 do
      local c = cluster.start_local { store = st, devices = 3, threads = 1, mem = { "1000K", "1000K", "1000K" } }
      local ok, err = pcall(function()
        c:plan { context = 512, batch = 32, max_batch = 2, kv_tokens = 2 * 256 }
        local b = c:batcher({ prefix_cache = { dir = dir } })
        if round == 1 then
          assert.are.equal(0, run(b, pa).cached_tokens)
          for i, x in ipairs(c:cache_stats()) do -- (a STATS round: after each device's END)
            assert.are.equal(x.disk_files, kv_files(dir, i), "device " .. i)
            assert.is_true(x.disk_writes >= 6, "device " .. i .. " wrote its layers' groups")
          end
        else
          local r = run(b, pb)
          assert.are.equal(80, r.cached_tokens)
          assert.are.same(want, r.token_ids)
          for i, x in ipairs(c:cache_stats()) do assert.are.equal(5, x.disk_reads, "device " .. i) end
        end
      end)
      c:close()
      assert(ok, err)
    end
    m0:close()
  end)
end)
