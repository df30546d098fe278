-- FP8 checkpoints (issue 38 item 3): Hugging Face's quantization_config "fp8" (E4M3 weights,
-- float32 weight_scale_inv per 128x128 block, as DeepSeek-V3 and Qwen3-FP8 publish them) read
-- as released and computed from the FP8 bytes: the logits of the same model dequantized to F32
-- (bit for bit on the reference kernels, within 1e-5 of the largest logit on the SIMD ones), its
-- greedy tokens, from the directory, a slice store with blocks offloaded and 3 devices; what
-- `loip synth --weights-dtype fp8` writes; bad input refused naming the tensor and the field.
local ffi = require "ffi"
local bit = require "bit"
local loip = require "loip"
local json = require "loip.text.json"
local core = require "loip.core"
local safetensors = require "loip.model.safetensors"
local T = require "spec.support"

teardown(function() T.cleanup() end)
after_each(function() collectgarbage() collectgarbage() end)

-- (dim 192 and ffn 320: blocks of 128 that do not divide them, the last row and column groups short)
local SHAPE = "--weights-dtype fp8 --layers 2 --dim 192 --heads 4 --kv-heads 2 --head-dim 48 --ffn 320 --vocab 512 --std 0.25 --seed 3"
local IDS = { 1, 72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100 }

local function synth(like, flags)
  local dir = T.tmpdir()
  local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth --like %s %s %s %s/hf", T.loip, like, SHAPE, flags or "", dir))
  assert(rc == 0, err)
  require("spec.support.fp8_dequantize").write(dir .. "/hf", dir .. "/f32")
  return dir
end

local function open(path, plan) return loip.model.open(path, { threads = 1, context = 64, tokenizer = false, plan = plan }) end

local function logits_of(path, plan)
  local m = open(path, plan)
  local V = m.vocab_size
  local out = ffi.new("float[?]", #IDS * V)
  ffi.copy(out, m:logits(IDS), #IDS * V * 4)
  local it, st = m:generate(IDS, { temperature = 0, max_tokens = 8, ignore_eos = true })
  for _ in it do end
  local loader = m.loader ~= nil and m:runner_stats().loads
  m:close()
  return out, V, st.token_ids, loader
end

-- E4M3FN's value of byte b (NaN never written).
local function e4m3_value(b)
  local s = bit.band(b, 0x80) ~= 0 and -1 or 1
  local e, m = bit.band(bit.rshift(b, 3), 15), bit.band(b, 7)
  if e == 0 then return s * m * 2 ^ -9 end
  return s * (1 + m / 8) * 2 ^ (e - 7)
end

-- A copy of dir/hf with fix(cfg, tensors) applied to its config and its single file's tensors
-- ({ name = { dtype, shape, data } }).
local function broken(dir, fix)
  local bad = T.tmpdir()
  local cfg = assert(json.load(dir .. "/hf/config.json"))
  local set = assert(safetensors.open_dir(dir .. "/hf"))
  local tensors = {}
  for _, f in ipairs(set.files) do
    for name, t in pairs(f.tensors) do
      tensors[name] = { dtype = t.dtype, shape = t.shape, data = ffi.string(f.data + t.offset, t.nbytes) }
    end
  end
  safetensors.close(set)
  fix(cfg, tensors)
  T.safetensors(bad .. "/model.safetensors", tensors)
  T.write(bad .. "/config.json", json.encode_sorted(cfg, 2))
  return bad
end

-- (linears: the FP8 tensors a layer has; a mixture of experts': its experts' too, its router BF16)
for _, case in ipairs({ { like = "qwen3-0.6b", linears = 7 }, { like = "llama-3.2-1b", linears = 7 },
  { like = "qwen3-30b-a3b", flags = "--experts 4 --experts-per-token 2", linears = 4 + 4 * 3 } }) do
  local like = case.like
  describe("FP8 " .. like, function()
    local dir
    setup(function() dir = synth(like, case.flags) end)

    it("is written as the FP8 checkpoints are: E4M3 Linear weights with block scales, the rest BF16", function()
      local cfg = assert(json.load(dir .. "/hf/config.json"))
      assert.are.same({ quant_method = "fp8", fmt = "e4m3", activation_scheme = "dynamic", weight_block_size = { 128, 128 } },
        cfg.quantization_config)
      local set = assert(safetensors.open_dir(dir .. "/hf"))
      local function t(name) return set.index[name].tensors[name] end
      assert.are.equal("F8_E4M3", t("model.layers.1.self_attn.q_proj.weight").dtype)
      assert.are.same({ 2, 2 }, t("model.layers.1.self_attn.q_proj.weight_scale_inv").shape) -- ([192, 192])
      local mlp = case.flags and "model.layers.0.mlp.experts.3." or "model.layers.0.mlp."
      assert.are.equal("F8_E4M3", t(mlp .. "down_proj.weight").dtype)
      assert.are.same({ 3, 2 }, t(mlp .. "up_proj.weight_scale_inv").shape) -- ([320, 192])
      assert.are.same({ 2, 3 }, t(mlp .. "down_proj.weight_scale_inv").shape) -- ([192, 320])
      assert.are.equal("F32", t(mlp .. "down_proj.weight_scale_inv").dtype)
      if case.flags then assert.are.equal("BF16", t("model.layers.0.mlp.gate.weight").dtype) end -- (the router)
      assert.are.equal("BF16", t("model.embed_tokens.weight").dtype)
      assert.are.equal("BF16", t("model.layers.0.input_layernorm.weight").dtype)
      assert.are.equal("BF16", t("model.norm.weight").dtype)
      safetensors.close(set)
    end)

    it("dequantizes exactly: every E4M3 value times its block's scale is the F32 model's weight", function()
      local set = assert(safetensors.open_dir(dir .. "/hf"))
      local f32 = assert(safetensors.open_dir(dir .. "/f32"))
      local name = (case.flags and "model.layers.0.mlp.experts.1." or "model.layers.0.mlp.") .. "down_proj.weight" -- ([192, 320]: short last groups both ways)
      local f, g = set.index[name], f32.index[name]
      local w = ffi.cast("const uint8_t *", f.data + f.tensors[name].offset)
      local s = ffi.cast("const float *", set.index[name .. "_scale_inv"].data + set.index[name .. "_scale_inv"].tensors[name .. "_scale_inv"].offset)
      local d = ffi.cast("const float *", g.data + g.tensors[name].offset)
      for r = 0, 191 do
        for c = 0, 319 do
          local exact = e4m3_value(w[r * 320 + c]) * s[math.floor(r / 128) * 3 + math.floor(c / 128)] -- (in double)
          assert(d[r * 320 + c] == exact, string.format("[%d, %d]", r, c))
        end
      end
      safetensors.close(set)
      safetensors.close(f32)
    end)

    it("gives the dequantized F32 model's logits (reference kernels bit for bit, SIMD within 1e-5) and tokens", function()
      local was = ffi.string(core.C.loip_kernels_name())
      assert.are.equal(0, core.C.loip_kernels_use("ref"))
      local ok, err = pcall(function()
        local a, V, ta = logits_of(dir .. "/hf")
        local b, _, tb = logits_of(dir .. "/f32")
        assert.are.equal(0, T.bit_diffs(a, b, #IDS * V))
        assert.are.same(tb, ta)
      end)
      assert(ok, err)
      -- (each SIMD kernel set this machine runs: AVX2 and AVX-512 where it has them)
      for _, kernels in ipairs({ "avx2", "avx512" }) do
        if core.C.loip_kernels_use(kernels) == 0 then
          ok, err = pcall(function()
            local a, V, ta = logits_of(dir .. "/hf")
            local b, _, tb = logits_of(dir .. "/f32")
            local w = T.worst_relative(a, b, #IDS, V)
            assert.is_true(w <= 1e-5, string.format("%s kernels: %.3g of the largest logit", kernels, w))
            assert.are.same(tb, ta)
          end)
          if not ok then break end
        end
      end
      assert.are.equal(0, core.C.loip_kernels_use(was))
      assert(ok, err)
    end)

    it("slices into a store of packed F8 blocks: the same logits offloaded and on 3 devices", function()
      local single, V, tokens = logits_of(dir .. "/hf")
      -- (slicing packs each F8 weight as its block is written, not the whole checkpoint first)
      local src = require("loip.model.slice").open_source(dir .. "/hf")
      local lazy = 0
      for _, t in ipairs(src.tensors) do if t.pack then lazy = lazy + 1 end end
      src.close()
      assert.are.equal(2 * case.linears, lazy)
      require("loip.model.slice").write(dir .. "/hf", dir .. "/store", { quiet = true })
      local man = assert(json.load(dir .. "/store/manifest.json"))
      local packed = 0
      for _, f in ipairs(man.files) do
        for _, t in ipairs(f.tensors) do
          if t.dtype == "F8_E4M3" then
            packed = packed + 1
            assert.are.equal(tonumber(core.C.loip_dtype_bytes(5, t.shape[1], t.shape[2])), t.nbytes, t.name)
          end
        end
      end
      assert.are.equal(2 * case.linears, packed)
      local stages = { { blocks = { 0, 1 }, offloaded = 2 }, { blocks = { 2, 3 }, offloaded = 2 } }
      local out, _, toks, loads = logits_of(dir .. "/store", { slots = 1, devices = { { stages = stages } } })
      assert.is_true(loads and loads > 0, "blocks read from the store")
      assert.are.equal(0, T.bit_diffs(single, out, #IDS * V))
      assert.are.same(tokens, toks)
      local c = require("loip.cluster").start_local { store = dir .. "/store", devices = 3, threads = 1 }
      local ok, err = pcall(function()
        c:plan { context = 64, batch = 16, logits_tokens = 16, plan = { slots = 1, devices = {
          { stages = { { blocks = { 0, 0 }, offloaded = 0 } } }, { stages = { { blocks = { 1, 2 }, offloaded = 0 } } },
          { stages = { { blocks = { 3, 3 }, offloaded = 1 } } } } } }
        assert.are.equal(0, T.bit_diffs(single, c:logits(IDS), #IDS * V))
        local it, st = c:generate(IDS, { max_tokens = 8, sampler = { temperature = 0 }, stop = {} })
        for _ in it do end
        assert.are.same(tokens, st.token_ids)
      end)
      c:close()
      assert(ok, err)
    end)
  end)
end

describe("FP8 bad input", function()
  local dir
  setup(function() dir = synth("qwen3-0.6b") end)
  local W = "model.layers.1.self_attn.o_proj.weight"

  local function refused(bad, ...)
    local ok, err = pcall(open, bad)
    assert.is_false(ok)
    for _, want in ipairs({ ... }) do assert.is_truthy(tostring(err):find(want, 1, true), tostring(err)) end
  end

  it("names the tensor and weight_scale_inv when the scales have the wrong shape", function()
    refused(broken(dir, function(_, t)
      local s = t[W .. "_scale_inv"]
      s.shape, s.data = { 4 }, s.data
    end), W .. "_scale_inv", "dimensions")
    refused(broken(dir, function(_, t)
      local s = t[W .. "_scale_inv"]
      s.shape, s.data = { 1, 2 }, s.data:sub(1, 8)
    end), W, "weight_scale_inv has shape [1, 2], expected [2, 2]")
  end)

  it("reads BF16 scales as their float32 values", function()
    -- every scale rounded to BF16's 8 bits: once stored as BF16, once as F32
    local function scales(as_bf16)
      return broken(dir, function(_, t)
        for name, x in pairs(t) do
          if name:match("_scale_inv$") then
            local n = #x.data / 4
            local f = ffi.cast("const uint32_t *", x.data)
            local b, g = ffi.new("uint16_t[?]", n), ffi.new("uint32_t[?]", n)
            for i = 0, n - 1 do b[i] = bit.rshift(f[i], 16) g[i] = bit.lshift(b[i], 16) end
            x.dtype, x.data = as_bf16 and "BF16" or "F32", as_bf16 and ffi.string(b, n * 2) or ffi.string(g, n * 4)
          end
        end
      end)
    end
    local a, V = logits_of(scales(true))
    local b = logits_of(scales(false))
    assert.are.equal(0, T.bit_diffs(a, b, #IDS * V))
  end)

  it("synth refuses --weights-dtype it does not write, and FP8 over a shape released otherwise", function()
    local out = T.tmpdir()
    local rc, _, err = T.run(string.format("%s synth --like qwen3-0.6b --weights-dtype q4 %s/m", T.loip, out))
    assert.are_not.equal(0, rc)
    assert.is_truthy(err:find("--weights-dtype 'q4' is neither fp8", 1, true), err)
    rc, _, err = T.run(string.format("%s synth --like gpt-oss-20b --weights-dtype fp8 %s/m", T.loip, out))
    assert.are_not.equal(0, rc)
    assert.is_truthy(err:find("quantization_config 'mxfp4' already", 1, true), err)
    assert.is_false(T.exists(out .. "/m/config.json"))
  end)

  it("names the tensor whose weight_scale_inv is missing", function()
    refused(broken(dir, function(_, t) t[W .. "_scale_inv"] = nil end), W, "weight_scale_inv", "missing")
  end)

  it("names the field: an unknown quant_method, an unsupported block size or activation scheme", function()
    refused(broken(dir, function(c) c.quantization_config.quant_method = "gptq" end), "quantization_config.quant_method", "gptq")
    refused(broken(dir, function(c) c.quantization_config.weight_block_size = { 64, 64 } end),
      "quantization_config.weight_block_size", "[64, 64]")
    refused(broken(dir, function(c) c.quantization_config.weight_block_size = nil end), "quantization_config.weight_block_size")
    refused(broken(dir, function(c) c.quantization_config.activation_scheme = "static" end), "quantization_config.activation_scheme")
  end)

  it("respects modules_to_not_convert: an FP8 tensor of a module listed there is refused by name", function()
    refused(broken(dir, function(c) c.quantization_config.modules_to_not_convert = { "lm_head", "layers.1.self_attn.o_proj" } end),
      W, "modules_to_not_convert", "layers.1.self_attn.o_proj")
    -- (a listed module kept in BF16, as checkpoints keep them: read as such)
    local m = open(broken(dir, function(c, t)
      c.quantization_config.modules_to_not_convert = { "lm_head", "layers.1.self_attn.o_proj" }
      local raw = ffi.new("uint16_t[?]", 192 * 192)
      for i = 0, 192 * 192 - 1 do raw[i] = 0x3c00 + i % 7 end
      t[W] = { dtype = "BF16", shape = { 192, 192 }, data = ffi.string(raw, 192 * 192 * 2) }
      t[W .. "_scale_inv"] = nil
    end))
    local out = m:logits({ 1, 2, 3 })
    for i = 0, 3 * m.vocab_size - 1 do assert(out[i] == out[i], "logit " .. i) end
    m:close()
  end)
end)

-- Against llama.cpp (models/fp8-reference): it keeps no FP8 in GGUF, so it ran the same model
-- dequantized to F32 (spec/support/fp8_dequantize.lua, then spec/support/to_gguf.lua); loip's
-- FP8 directory and that GGUF in loip give its logits within 1e-4 of the largest and its tokens.
local ref_dir = assert(T.fixture_path("models/fp8-reference/reference.json")):match("^(.*)/[^/]*$")
local ref = assert(json.load(ref_dir .. "/reference.json"))
for _, family in ipairs({ "qwen3", "llama" }) do
  local r = ref.models[family]
  it("FP8 " .. family .. " gives llama.cpp's logits of its dequantized F32 model within 1e-4 and its tokens", function()
    local dir = T.tmpdir()
    local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth --like %s %s %s/hf", T.loip, r.like, r.flags, dir))
    assert(rc == 0, err)
    require("spec.support.fp8_dequantize").write(dir .. "/hf", dir .. "/f32")
    require("spec.support.to_gguf").convert(dir .. "/f32", dir .. "/m.gguf")
    assert.are.equal(r.gguf_sha256, require("loip.runtime.files").sha256_file(dir .. "/m.gguf"))
    local R = T.read_f32(ref_dir .. "/" .. r.logits)
    for _, path in ipairs({ dir .. "/hf", dir .. "/m.gguf" }) do
      local m = loip.model.open(path, { threads = 1, context = 128, tokenizer = false })
      assert.are.equal(r.class, m.architecture)
      local w = T.worst_relative(m:logits(ref.tokens), R, #ref.tokens, m.vocab_size)
      assert.is_true(w <= 1e-4, string.format("%s: %.3g of the largest logit", path, w))
      local it, st = m:generate(ref.tokens, { temperature = 0, max_tokens = #r.greedy, ignore_eos = true })
      for _ in it do end
      assert.are.same(r.greedy, st.token_ids, path)
      m:close()
    end
  end)
end
