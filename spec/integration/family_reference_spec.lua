-- Model families against an outside reference: llama.cpp's logits (models/family-reference) for a
-- tiny random-weight model of each family listed there, which loip synth makes again here and
-- spec/support/to_gguf.lua converts (the GGUF must be the one llama.cpp read: its sha256 is
-- checked first). loip's logits from the GGUF, the Hugging Face directory, the slice store and
-- the store with every layer's blocks offloaded are within 1e-4 of the largest logit at every one
-- of the 64 positions and the 16 greedy tokens are llama.cpp's; the store with blocks offloaded,
-- 2 and 3 devices give the single device's logits bit for bit. A family whose tensors are fused
-- by rows refuses such a tensor of the wrong size, naming it.
local ffi = require "ffi"
local loip = require "loip"
local json = require "loip.text.json"
local families = require "loip.model.families"
local T = require "spec.support"

teardown(function() T.cleanup() end)
after_each(function() collectgarbage() collectgarbage() end)

local ref_dir = assert(T.fixture_path("models/family-reference/reference.json")):match("^(.*)/[^/]*$")
local ref = assert(json.load(ref_dir .. "/reference.json"))

-- The reference logits of model r, an array of their own (T.read_f32).
local function reference_logits(r) return (T.read_f32(ref_dir .. "/" .. r.logits)) end
local worst = T.worst_relative

-- A plan of n_blocks blocks in thirds over 3 devices, the last device's last block offloaded.
local function thirds(n_blocks)
  local p = { slots = 1, devices = {} }
  for i = 0, 2 do
    local a, b = math.floor(i * n_blocks / 3), math.floor((i + 1) * n_blocks / 3) - 1
    p.devices[i + 1] = { stages = { { blocks = { a, b }, offloaded = i == 2 and 1 or 0 } } }
  end
  return p
end

for _, family in ipairs(families.names(ref.models)) do
  local r = ref.models[family]
  describe(family, function()
    local dir
    setup(function() dir = T.reference_model(r) end)

    it("is the model llama.cpp read", function()
      assert.are.equal(r.gguf_sha256, require("loip.runtime.files").sha256_file(dir .. "/m.gguf"))
    end)

    it("gives llama.cpp's logits within 1e-4 and its greedy tokens (GGUF, Hugging Face, store, offloaded)", function()
      local R = reference_logits(r)
      -- (every layer a stage of its own, both its blocks offloaded: read from the store as they run)
      local stages = {}
      for l = 0, assert(json.load(dir .. "/hf/config.json")).num_hidden_layers - 1 do
        stages[l + 1] = { blocks = { 2 * l, 2 * l + 1 }, offloaded = 2 }
      end
      for _, case in ipairs({ { path = dir .. "/m.gguf" }, { path = dir .. "/hf" }, { path = dir .. "/store" },
        { path = dir .. "/store", plan = { slots = 1, devices = { { stages = stages } } } } }) do
        local path = case.path .. (case.plan and " (offloaded)" or "")
        local m = loip.model.open(case.path, { threads = 1, context = 128, plan = case.plan, tokenizer = false })
        assert.are.equal(r.class, m.architecture)
        assert.are.equal(case.plan ~= nil, m.loader ~= nil, path) -- (offloaded blocks: read by a loader)
        local out = m:logits(ref.tokens)
        if case.plan then assert.is_true(m:runner_stats().loads > 0, path) end
        local w = worst(out, R, #ref.tokens, m.vocab_size)
        assert.is_true(w <= 1e-4, string.format("%s: %.3g of the largest logit", path, w))
        local it, st = m:generate(ref.tokens, { temperature = 0, max_tokens = #r.greedy, ignore_eos = true })
        for _ in it do end
        assert.are.same(r.greedy, st.token_ids, path)
        m:close()
      end
    end)

    it("gives the single device's logits bit for bit from its store with blocks offloaded", function()
      local m = loip.model.open(dir .. "/store", { threads = 1, context = 128, tokenizer = false })
      local V, n, blocks = m.vocab_size, #ref.tokens, 2 * m.n_layers
      local single = ffi.new("float[?]", n * V)
      ffi.copy(single, m:logits(ref.tokens), n * V * 4)
      m:close()
      -- two stages, each offloading all but its last block (read from the store every step)
      local half = blocks / 2
      local plan = { slots = 1, devices = { { stages = { { blocks = { 0, half - 1 }, offloaded = half - 1 },
        { blocks = { half, blocks - 1 }, offloaded = half - 1 } } } } }
      m = loip.model.open(dir .. "/store", { threads = 1, context = 128, tokenizer = false, plan = plan })
      assert.is_true(m.runner ~= nil and m.loader ~= nil, "offloading runs through the runner and its loader")
      assert.are.equal(0, T.bit_diffs(single, m:logits(ref.tokens), n * V))
      local it, st = m:generate(ref.tokens, { temperature = 0, max_tokens = #r.greedy, ignore_eos = true })
      for _ in it do end
      assert.are.same(r.greedy, st.token_ids)
      assert.is_true(m:runner_stats().loads > 0)
      m:close()
    end)

    for _, devices in ipairs({ 2, 3 }) do
      it(devices .. " devices give the single device's logits bit for bit and llama.cpp's greedy tokens", function()
        local m = loip.model.open(dir .. "/store", { threads = 1, context = 128, tokenizer = false })
        local V, n = m.vocab_size, #ref.tokens
        local single = ffi.new("float[?]", n * V)
        ffi.copy(single, m:logits(ref.tokens), n * V * 4)
        m:close()
        local c = require("loip.cluster").start_local { store = dir .. "/store", devices = devices, threads = 1 }
        local ok, err = pcall(function()
          -- (3 devices: the blocks in thirds, the last device's last block offloaded; 2: as planned)
          c:plan { context = 128, batch = 16, logits_tokens = 16,
            plan = devices == 3 and thirds(2 * assert(json.load(dir .. "/hf/config.json")).num_hidden_layers) or nil }
          assert.are.equal(0, T.bit_diffs(single, c:logits(ref.tokens), n * V))
          local it, st = c:generate(ref.tokens, { max_tokens = #r.greedy, sampler = { temperature = 0 }, stop = {} })
          for _ in it do end
          assert.are.same(r.greedy, st.token_ids)
        end)
        c:close()
        assert(ok, err)
      end)
    end

    local fused = {}
    for name, kinds in pairs(families.classes[r.class].layer or {}) do
      if type(kinds) == "table" and #kinds > 1 then fused[#fused + 1] = name end
    end
    if #fused > 0 then
      it("refuses a tensor fused by rows that does not hold its parts' rows, naming it", function()
        -- (one key/value head: q, k and v take fewer rows than the file's qkv tensor has)
        local bad = T.tmpdir()
        assert.are.equal(0, (T.run(string.format("cp %s/hf/* %s/", dir, bad))))
        local cfg = assert(json.load(bad .. "/config.json"))
        assert.is_true(cfg.num_key_value_heads > 1)
        cfg.num_key_value_heads = 1
        T.write(bad .. "/config.json", json.encode_sorted(cfg, 2))
        local ok, err = pcall(loip.model.open, bad, { threads = 1, context = 128, tokenizer = false })
        assert.is_false(ok)
        assert.matches("tensor 'model.layers.0.[%w_.]+': shape %[%d+, %d+%], expected %d+ rows", err)
      end)
    end
  end)
end
