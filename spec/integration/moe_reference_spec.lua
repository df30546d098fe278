-- Mixtures of experts against an outside reference: llama.cpp's logits (models/moe-synth-reference)
-- for tiny synthetic Qwen3-MoE, Qwen2-MoE and Mixtral models, which loip synth makes again here
-- (the GGUF must be the one llama.cpp read: its sha256 is checked first). loip's logits, from the
-- GGUF, its Hugging Face twin, the slice store, and the store with every MLP block offloaded (its
-- experts read through a small expert cache), are within 1e-4 of the largest logit at every one
-- of the 64 positions, and the 16 greedy tokens are llama.cpp's; 3 devices with offloaded experts
-- give the same tokens.
local ffi = require "ffi"
local loip = require "loip"
local json = require "loip.text.json"
local T = require "spec.support"

teardown(function() T.cleanup() end)
after_each(function() collectgarbage() collectgarbage() end)

local ref_dir = assert(T.fixture_path("models/moe-synth-reference/reference.json")):match("^(.*)/[^/]*$")
local ref = assert(json.load(ref_dir .. "/reference.json"))

local function sha256_of(path) return require("loip.runtime.files").sha256_file(path) end

-- The reference logits of model r, an array of their own (T.read_f32).
local function reference_logits(r) return (T.read_f32(ref_dir .. "/" .. r.logits)) end
local worst = T.worst_relative

for _, arch in ipairs({ "qwen3moe", "qwen2moe", "mixtral" }) do
  local r = ref.models[arch]
  describe(arch, function()
    local dir
    setup(function() dir = T.reference_model(r) end)

    it("is the model llama.cpp read", function()
      assert.are.equal(r.gguf_sha256, sha256_of(dir .. "/m.gguf"))
    end)

    it("gives llama.cpp's logits within 1e-4 and its greedy tokens (GGUF, Hugging Face, store, offloaded experts)", function()
      local R = reference_logits(r)
      local n_layers = 4
      local stages = {}
      for l = 0, n_layers - 1 do stages[l + 1] = { blocks = { 2 * l, 2 * l + 1 }, offloaded = 2 } end
      for _, case in ipairs({
        { path = dir .. "/m.gguf" }, { path = dir .. "/hf" }, { path = dir .. "/store" },
        { path = dir .. "/store", plan = { slots = 1, devices = { { expert_slots = 3, stages = stages } } } },
      }) do
        local m = loip.model.open(case.path, { threads = 1, context = 128, plan = case.plan, tokenizer = false })
        assert.are.equal(case.plan ~= nil, m.experts ~= nil)
        local out = m:logits(ref.tokens)
        local w = worst(out, R, #ref.tokens, m.vocab_size)
        assert.is_true(w <= 1e-4, string.format("%s%s: %.3g of the largest logit", case.path, case.plan and " (offloaded)" or "", w))
        local it, st = m:generate(ref.tokens, { temperature = 0, max_tokens = #r.greedy, ignore_eos = true })
        for _ in it do end
        assert.are.same(r.greedy, st.token_ids, case.path)
        m:close()
      end
    end)

    it("3 devices with offloaded experts give llama.cpp's logits (the single device's, bit for bit) and greedy tokens", function()
      local m = loip.model.open(dir .. "/store", { threads = 1, context = 128, tokenizer = false })
      local one = m:logits(ref.tokens)
      local V, n = m.vocab_size, #ref.tokens
      local single = ffi.new("float[?]", n * V)
      ffi.copy(single, one, n * V * 4)
      m:close()
      local R = reference_logits(r)
      local cluster = require "loip.cluster"
      local c = cluster.start_local { store = dir .. "/store", devices = 3, threads = 1 }
      local ok, err = pcall(function()
        -- every device offloads an MLP block: layer 0's (device 1), 1's (2), 3's (3), their experts in caches of 3
        c:plan { context = 128, batch = 16, logits_tokens = 16, plan = { slots = 1, devices = {
          { expert_slots = 3, stages = { { blocks = { 0, 2 }, offloaded = 2 } } },
          { expert_slots = 3, stages = { { blocks = { 3, 5 }, offloaded = 1 } } },
          { expert_slots = 3, stages = { { blocks = { 6, 7 }, offloaded = 2 } } } } } }
        local l3 = c:logits(ref.tokens)
        assert.is_true(worst(l3, R, n, V) <= 1e-4)
        assert.are.equal(0, T.bit_diffs(single, l3, n * V))
        local it, st = c:generate(ref.tokens, { max_tokens = #r.greedy, sampler = { temperature = 0 }, stop = {} })
        for _ in it do end
        assert.are.same(r.greedy, st.token_ids)
        for i, d in ipairs(c:stats()) do assert.is_true(d.experts.routed > d.experts.bound, "device " .. i .. " read experts") end
      end)
      c:close()
      assert(ok, err)
    end)
  end)
end
