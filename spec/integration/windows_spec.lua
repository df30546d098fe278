-- Sliding-window attention and KV priced per layer (issue 38, item 4): a synthetic F32 Qwen2
-- model (`loip synth --sliding-window 16 --layer-types sssssf`: five window layers to one full,
-- as Gemma 3 lays them out) gives, at every position of a sequence three windows long, the
-- logits of an independent double-precision reference with Hugging Face's sliding-window mask
-- (spec/support/window_reference.lua), and not those of the same model without windows; `loip
-- plan` prints the KV by layer kind; at a context whose full KV no budget below holds, the
-- windows make room: planned and served on one device and on 3 local devices within budgets,
-- with the tokens of the unbudgeted run, each device's accounted peak within its budget (and in
-- this process at the same budget), where the same weights without windows are refused; KV
-- lending between devices ships the full layers' groups and keeps the rings: the same tokens;
-- loip simulate plays a windowed shape within budgets its windowless twin does not fit; chains
-- and trees of drafts verified give the plain tokens.
local ffi = require "ffi"
local loip = require "loip"
local json = require "loip.text.json"
local hf = require "loip.model.hf"
local exec = require "loip.runtime.exec"
local reference = require "spec.support.window_reference"
local T = require "spec.support"
teardown(function() T.cleanup() end)

local store_of = T.slice_store
teardown(T.drop_stores)

local SHAPE = "--like qwen2.5-7b --dtype f32 --layers 6 --dim 64 --heads 4 --kv-heads 2 --ffn 96 --std 0.3 --vocab 300"
local src

local function synth()
  if src then return src end
  src = os.tmpname()
  os.remove(src)
  local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth %s --sliding-window 16 --layer-types sssssf %s", T.loip,
    SHAPE, src))
  assert.are.equal(0, rc, err)
  return src
end
local made = {} -- synthetic models to remove
teardown(function()
  if src then os.execute("rm -rf '" .. src .. "'") end
  for _, d in ipairs(made) do os.execute("rm -rf '" .. d .. "'") end
end)

describe("sliding-window attention", function()
  it("writes the windows as Hugging Face does and reads them back per layer", function()
    local cfg = assert(json.load(synth() .. "/config.json"))
    assert.are.equal(16, cfg.sliding_window)
    assert.are.same({ "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
      "sliding_attention", "full_attention" }, cfg.layer_types)
    local c = hf.parse_config(cfg, "config.json")
    assert.are.equal(16, c.sliding_window)
    for l = 0, 5 do assert.are.equal(l == 5 and 0 or 1, c.layer_window[l]) end
    -- Qwen2's default: layers from max_window_layers on, when layer_types is absent
    local q = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 64, intermediate_size = 96, num_hidden_layers = 4,
      num_attention_heads = 4, num_key_value_heads = 2, vocab_size = 300, max_position_embeddings = 256,
      rms_norm_eps = 1e-6, use_sliding_window = true, sliding_window = 8, max_window_layers = 2 }
    c = hf.parse_config(q, "q")
    assert.are.same({ 0, 0, 1, 1 }, { c.layer_window[0], c.layer_window[1], c.layer_window[2], c.layer_window[3] })
    -- Gemma 3's older configs: sliding_window_pattern p (6 there, 3 here), every p-th layer full
    q.max_window_layers, q.sliding_window_pattern, q.num_hidden_layers = nil, 3, 6
    c = hf.parse_config(q, "q")
    for l = 0, 5 do assert.are.equal((l + 1) % 3 == 0 and 0 or 1, c.layer_window[l], "layer " .. l) end
    q.sliding_window_pattern, q.num_hidden_layers, q.max_window_layers = nil, 4, 2
    q.use_sliding_window = false
    assert.are.equal(0, hf.parse_config(q, "q").sliding_window)
    q.use_sliding_window, q.layer_types = true, { "sliding_attention", "local" }
    local ok, err = pcall(hf.parse_config, q, "q.json")
    assert.is_false(ok)
    assert.matches("q.json: field 'layer_types' must list one type per layer (4), got 2 entries", err, 1, true)
    local out = os.tmpname()
    os.remove(out)
    local rc, _, serr = T.run(string.format("LOIP_QUIET=1 %s synth %s --layer-types sf %s", T.loip, SHAPE, out))
    assert.are_not.equal(0, rc)
    assert.matches("--layer-types needs --sliding-window", serr, 1, true)
    assert.is_nil(io.open(out), "nothing written")
  end)

  it("gives the reference's logits at every position, three windows long, and not the unwindowed model's", function()
    local dir = synth()
    local ids = {}
    for i = 1, 48 do ids[i] = (i * 37 + 11) % 300 end
    local m = loip.model.open(dir, { threads = 1, context = 256, batch = 8, tokenizer = false })
    assert.are.equal(5, exec.session_kv_window_layers(m:session()))
    local got = m:logits(ids)
    local V = m.vocab_size
    local want = reference.logits(dir, ids)
    local plain = reference.logits(dir, ids, { sliding_window = false })
    local worst, differs = 0, 0
    for t = 1, #ids do
      local top = 0
      for v = 0, V - 1 do top = math.max(top, math.abs(want[t][v])) end
      for v = 0, V - 1 do
        worst = math.max(worst, math.abs(got[(t - 1) * V + v] - want[t][v]) / top)
        if t > 16 then differs = math.max(differs, math.abs(plain[t][v] - want[t][v]) / top) end
      end
    end
    m:close()
    assert.is_true(worst < 1e-4, "largest difference " .. worst .. " of the largest logit")
    assert.is_true(differs > 1e-2, "the window changes the logits past it: " .. differs)
  end)

  it("prints the KV per layer kind, and serves a context whose full KV does not fit where the windows make room", function()
    local st = store_of(synth(), "windows")
    local rc, out, err = T.run(string.format("%s plan --model %s --context 4096 --devices 3", T.loip, st))
    assert.are.equal(0, rc, err)
    assert.matches("kv by layer kind: 1 full x 1.0 MiB %(4096 positions%) %+ 1 window x [%d.]+ KiB %(a ring of 80 "
      .. "positions for a window of 16%)", out .. err)
    local rcj, j, errj = T.run(string.format("%s plan --model %s --context 4096 --devices 3 --json", T.loip, st))
    assert.are.equal(0, rcj, errj)
    j = json.decode(j)
    assert.are.same({ 1, 5, 80 }, { j.kv_kinds.full_layers, j.kv_kinds.window_layers, j.kv_kinds.ring_tokens })
    local full, win = 0, 0
    for _, d in ipairs(j.devices) do
      full, win = full + d.kv_full_layers, win + d.kv_window_layers
      assert.is_true(d.kv_bytes >= d.kv_full_layers * j.kv_kinds.full_bytes + d.kv_window_layers * j.kv_kinds.window_bytes)
    end
    assert.are.same({ 1, 5 }, { full, win })
    -- the same weights without windows: 6 layers x 1 MiB of KV at 4096 positions, which these
    -- budgets cannot hold (one device: 6 MiB; three: 2 MiB each)
    local plain = os.tmpname()
    os.remove(plain)
    made[#made + 1] = plain
    local rcp, _, errp = T.run(string.format("LOIP_QUIET=1 %s synth %s %s", T.loip, SHAPE, plain))
    assert.are.equal(0, rcp, errp)
    local plain_st = store_of(plain, "no windows")
    local rc0, ref, err0 = T.generate_json(st, "--context 4096 --max-tokens 60 --devices 1")
    assert.are.equal(0, rc0, err0)
    assert.is_true(#ref.token_ids >= 40, "long enough to pass the window: " .. #ref.token_ids)
    for _, set in ipairs({ { "1", "3M" }, { "3", "1800K,1800K,1800K" } }) do
      local flags = string.format("--context 4096 --max-tokens 60 --devices %s --mem %s", set[1], set[2])
      local rcf, _, errf = T.generate_json(plain_st, flags)
      assert.are_not.equal(0, rcf, set[1] .. " devices: the full KV does not fit")
      assert.matches("raise --mem or lower --context", errf, 1, true)
      local rc1, j, err1 = T.generate_json(st, flags)
      assert.are.equal(0, rc1, err1)
      assert.are.same(ref.token_ids, j.token_ids, set[1] .. " devices")
      for i, d in ipairs(j.devices) do
        assert.is_true(d.peak_bytes <= d.budget_bytes, "device " .. i .. ": peak " .. d.peak_bytes .. " of " .. d.budget_bytes)
      end
    end
    -- one device in this process: the same tokens, the budget's peak within it
    local m = loip.model.open(st, { threads = 1, context = 4096, mem = "3M" })
    local it, gs = m:generate(ref.prompt_ids, { temperature = 0, max_tokens = #ref.token_ids, stop = {} })
    for _ in it do end
    assert.are.same(ref.token_ids, gs.token_ids, "in process")
    assert.is_true(m.budget:peak() <= m.budget:limit(), "peak " .. m.budget:peak() .. " of " .. m.budget:limit())
    m:close()
  end)

  it("is simulated where the windows make room: a 8192 context on 3 devices of 60M that the same shape without windows cannot hold", function()
    local shape = "--like qwen2.5-7b --layers 12 --dim 512 --heads 8 --kv-heads 4 --ffn 1024 --vocab 4000 --context 8192 "
      .. "--devices 3 --mem 60M --device-profile jetson-agx-orin-64gb --json"
    local rc0, _, err0 = T.run(string.format("%s simulate %s", T.loip, shape))
    assert.are_not.equal(0, rc0)
    assert.matches("kv 64.0 MiB", err0, 1, true) -- four full layers of 16 MiB on a device
    local rc, out, err = T.run(string.format("%s simulate %s --sliding-window 64 --layer-types sssssf", T.loip, shape))
    assert.are.equal(0, rc, err)
    local j = json.decode(out)
    assert.are.equal(0, j.failed)
    for i, d in ipairs(j.devices) do
      assert.is_true(d.memory_bytes <= d.budget_bytes, "device " .. i .. ": " .. d.memory_bytes .. " of " .. d.budget_bytes)
    end
  end)

  it("verifies chains and trees of drafts: the same tokens", function()
    local st = store_of(synth(), "windows")
    local ids = { 1, 17, 290, 45, 100, 7 }
    local function tokens(draft)
      local m = loip.model.open(st, { threads = 1, context = 256, draft = draft, tokenizer = false })
      local ok, it, g = pcall(m.generate, m, ids, { temperature = 0, max_tokens = 60, stop = {} })
      local err
      if ok then ok, err = pcall(function() for _ in it do end end) else err = it end
      m:close()
      assert(ok, err)
      return g.token_ids
    end
    local plain = tokens(nil)
    assert.are.same(plain, tokens("self:layers=3"))
    assert.are.same(plain, tokens("self:layers=3,tree=on,width=3,levels=2"))
  end)

  it("shares a prompt with its windows between n choices (the prefix cache: spec/integration/window_prefix_spec.lua)", function()
    local st = store_of(synth(), "windows")
    local m = loip.model.open(st, { threads = 1, context = 256, max_batch = 3, tokenizer = false })
    local b = m:batcher()
    -- n = 3 choices of a prompt of 40 (window 16): the prompt's KV shared, its windows copied exactly
    local ids = {}
    for i = 1, 40 do ids[i] = (i * 53 + 7) % 300 end
    local one = b:submit { prompt = ids, max_tokens = 30, sampler = { temperature = 0 }, stop = {} }
    one:wait()
    local r = b:submit { prompt = ids, max_tokens = 30, sampler = { temperature = 0 }, stop = {}, n = 3 }
    for _, c in ipairs(r.choices) do c:wait() end
    for _, c in ipairs(r.choices) do assert.are.same(one.token_ids, c.token_ids) end
    m:close()
  end)

  it("lends the full layers' KV between devices and keeps the windows' rings: the same tokens", function()
    local st = store_of(synth(), "windows")
    local cluster = require "loip.cluster"
    local function run(each)
      local c = cluster.start_local { store = st, devices = 3, threads = 1 }
      local out
      local ok, err = pcall(function()
        -- 2 stages a device, a layer a stage: device 3's are layer 2 (a window) and layer 5 (full)
        c:plan { context = 256, batch = 16, stages = 2, kv_grows = true }
        local it, g = c:generate({ 1, 17, 290, 45, 100, 7 }, { max_tokens = 120, sampler = { temperature = 0 }, stop = {} })
        local k = 0
        for _ in it do
          k = k + 1
          if each then each(c, k) end
        end
        out = g.token_ids
      end)
      c:close()
      assert(ok, err)
      return out
    end
    local ref = run()
    local seen = {}
    local got = run(function(c, k)
      if k == 3 then c:lend(3, 1, 4) c:lend(1, 2, 4) end
      if k == 60 then
        local s = c:stats()
        seen.full, seen.windows = s[3].lent_bytes, s[1].lent_bytes
      end
      if k == 100 then c:lend(3, nil) c:lend(1, nil) end
    end)
    assert.are.same(ref, got)
    -- device 3 ships layer 5's groups (4 KiB a group: 2 x 16 positions x 32 floats x 4 bytes);
    -- device 1, whose layers 0 and 3 are windows, ships no group, only its blobs' headers
    assert.is_true(seen.full >= 10 * 4096, "device 3 lent " .. tostring(seen.full))
    assert.is_true(seen.windows < 4096, "device 1 lent " .. tostring(seen.windows))
  end)
end)

-- Issue 38's acceptance names a Gemma-3-shaped model: `loip synth --like gemma-3-1b` (tiny
-- dims, F32) with a window of 8, five window layers to one full as Gemma 3 lays them out (its
-- sliding_window_pattern), each window layer rotating with its own RoPE base.
local GEMMA = "--like gemma-3-1b --dtype f32 --layers 6 --dim 64 --heads 4 --kv-heads 2 --head-dim 16 --ffn 96 --vocab 300 "
  .. "--std 0.02 --seed 5"
local gemma
local function gemma_dir()
  if gemma then return gemma end
  gemma = T.tmpdir() .. "/hf"
  local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth %s --sliding-window 8 %s", T.loip, GEMMA, gemma))
  assert.are.equal(0, rc, err)
  return gemma
end

describe("a Gemma-3-shaped model's windows", function()
  it("gives the reference's logits three windows long, and 3 devices the single device's bit for bit", function()
    local dir = gemma_dir()
    local cfg = assert(json.load(dir .. "/config.json"))
    assert.are.same({ 8, 6 }, { cfg.sliding_window, cfg.sliding_window_pattern })
    local c = hf.parse_config(cfg, "config.json")
    assert.are.same({ 8, 1, 1, 1, 1, 1, 0 }, { c.sliding_window, c.layer_window[0], c.layer_window[1], c.layer_window[2],
      c.layer_window[3], c.layer_window[4], c.layer_window[5] })
    local ids = {}
    for i = 1, 24 do ids[i] = (i * 37 + 11) % 300 end
    local want, plain = reference.logits(dir, ids), reference.logits(dir, ids, { sliding_window = false })
    local st = store_of(dir, "gemma windows")
    local m = loip.model.open(st, { threads = 1, context = 64, batch = 8, tokenizer = false })
    assert.are.equal(5, exec.session_kv_window_layers(m:session()))
    local V = m.vocab_size
    local single = ffi.new("float[?]", #ids * V)
    ffi.copy(single, m:logits(ids), #ids * V * 4)
    m:close()
    local worst, differs = 0, 0
    for t = 1, #ids do
      local top = 0
      for v = 0, V - 1 do top = math.max(top, math.abs(want[t][v])) end
      for v = 0, V - 1 do
        worst = math.max(worst, math.abs(single[(t - 1) * V + v] - want[t][v]) / top)
        if t > 8 then differs = math.max(differs, math.abs(plain[t][v] - want[t][v]) / top) end
      end
    end
    assert.is_true(worst < 1e-4, "largest difference " .. worst .. " of the largest logit")
    assert.is_true(differs > 1e-2, "the window changes the logits past it: " .. differs)
    local cl = require("loip.cluster").start_local { store = st, devices = 3, threads = 1 }
    local ok, err = pcall(function()
      cl:plan { context = 64, batch = 8, logits_tokens = 8 }
      assert.are.equal(0, T.bit_diffs(single, cl:logits(ids), #ids * V))
    end)
    cl:close()
    assert(ok, err)
  end)

  it("serves a context whose full KV does not fit a budget where the windows do, with the unbudgeted tokens", function()
    local st = store_of(gemma_dir(), "gemma windows")
    local rc, out, err = T.run(string.format("%s plan --model %s --context 4096 --devices 1", T.loip, st))
    assert.are.equal(0, rc, err)
    assert.matches("kv by layer kind: 1 full x 1.0 MiB %(4096 positions%) %+ 5 window x [%d.]+ KiB %(a ring of %d+ "
      .. "positions for a window of 8%)", out .. err)
    -- the same weights with every layer full (sliding_window_pattern 1): 6 MiB of KV at 4096
    local full = T.tmpdir() .. "/hf"
    assert.are.equal(0, (T.run(string.format("mkdir -p %s && cp %s/* %s/", full, gemma_dir(), full))))
    local fc = assert(json.load(full .. "/config.json"))
    fc.sliding_window_pattern = 1
    T.write(full .. "/config.json", json.encode_sorted(fc, 2))
    local full_st = store_of(full, "gemma full")
    local rc0, ref, err0 = T.generate_json(st, "--context 4096 --max-tokens 60 --devices 1")
    assert.are.equal(0, rc0, err0)
    assert.is_true(#ref.token_ids >= 40, "long enough to pass the window: " .. #ref.token_ids)
    local distinct, n = {}, 0
    for _, id in ipairs(ref.token_ids) do
      if not distinct[id] then distinct[id], n = true, n + 1 end
    end
    assert.is_true(n >= 5, "tokens that tell runs apart: " .. n .. " distinct")
    for _, set in ipairs({ { "1", "3M" }, { "3", "1800K,1800K,1800K" } }) do
      local flags = string.format("--context 4096 --max-tokens 60 --devices %s --mem %s", set[1], set[2])
      local rcf, _, errf = T.generate_json(full_st, flags)
      assert.are_not.equal(0, rcf, set[1] .. " devices: the full KV does not fit")
      assert.matches("raise --mem or lower --context", errf, 1, true)
      local rc1, j, err1 = T.generate_json(st, flags)
      assert.are.equal(0, rc1, err1)
      assert.are.same(ref.token_ids, j.token_ids, set[1] .. " devices")
      for i, d in ipairs(j.devices) do
        assert.is_true(d.peak_bytes <= d.budget_bytes, "device " .. i .. ": peak " .. d.peak_bytes .. " of " .. d.budget_bytes)
      end
    end
  end)
end)
