-- Sliding-window attention against an outside reference: llama.cpp's logits
-- (models/window-reference) for a tiny Qwen3-MoE-shaped model whose layers 0, 1 and 3 attend
-- within 8 positions, which loip synth makes again here and spec.support.to_gguf converts as
-- llama.cpp's `mellum` (Qwen3-MoE's layer with standard windows; its sha256 is checked first).
-- loip's logits from the Hugging Face directory and its slice store, in batches of 64 and of 8
-- (rings of 80 and 16 positions), are within 1e-5 of the largest logit at all 64 positions and
-- the 16 greedy tokens are llama.cpp's; 3 local devices give the same logits bit for bit and the
-- same tokens.
local ffi = require "ffi"
local loip = require "loip"
local json = require "loip.text.json"
local T = require "spec.support"

teardown(function() T.cleanup() end)
after_each(function() collectgarbage() collectgarbage() end)

local ref_dir = assert(T.fixture_path("models/window-reference/reference.json")):match("^(.*)/[^/]*$")
local ref = assert(json.load(ref_dir .. "/reference.json"))
local r = ref.model

describe("sliding windows against llama.cpp", function()
  local dir
  setup(function()
    dir = T.tmpdir()
    local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth --like %s %s %s/hf", T.loip, r.like, r.flags, dir))
    assert(rc == 0, err)
    require("spec.support.to_gguf").convert(dir .. "/hf", dir .. "/m.gguf", r.gguf_arch)
    require("loip.model.slice").write(dir .. "/hf", dir .. "/store", { quiet = true })
  end)

  it("is the model llama.cpp read", function()
    assert.are.equal(r.gguf_sha256, require("loip.runtime.files").sha256_file(dir .. "/m.gguf"))
  end)

  it("gives llama.cpp's logits within 1e-5 and its greedy tokens, ringed in batches of 64 and of 8", function()
    local R = T.read_f32(ref_dir .. "/" .. r.logits)
    for _, case in ipairs({ { dir .. "/hf", 64 }, { dir .. "/store", 64 }, { dir .. "/hf", 8 } }) do
      local m = loip.model.open(case[1], { threads = 1, context = 128, batch = case[2], tokenizer = false })
      assert.are.equal(3, require("loip.runtime.exec").session_kv_window_layers(m:session()))
      local w = T.worst_relative(m:logits(ref.tokens), R, #ref.tokens, m.vocab_size)
      assert.is_true(w <= 1e-5, string.format("%s, batch %d: %.3g of the largest logit", case[1], case[2], w))
      local it, st = m:generate(ref.tokens, { temperature = 0, max_tokens = #r.greedy, ignore_eos = true })
      for _ in it do end
      assert.are.same(r.greedy, st.token_ids, case[1])
      m:close()
    end
  end)

  it("3 local devices give the single device's logits bit for bit and llama.cpp's tokens", function()
    local m = loip.model.open(dir .. "/store", { threads = 1, context = 128, batch = 16, tokenizer = false })
    local V, n = m.vocab_size, #ref.tokens
    local single = ffi.new("float[?]", n * V)
    ffi.copy(single, m:logits(ref.tokens), n * V * 4)
    m:close()
    local c = require("loip.cluster").start_local { store = dir .. "/store", devices = 3, threads = 1 }
    local ok, err = pcall(function()
      c:plan { context = 128, batch = 16, logits_tokens = 16 }
      assert.are.equal(0, T.bit_diffs(single, c:logits(ref.tokens), n * V))
      local it, st = c:generate(ref.tokens, { max_tokens = #r.greedy, sampler = { temperature = 0 }, stop = {} })
      for _ in it do end
      assert.are.same(r.greedy, st.token_ids)
    end)
    c:close()
    assert(ok, err)
  end)
end)
