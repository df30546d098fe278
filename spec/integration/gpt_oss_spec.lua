-- gpt-oss's model side (lua/loip/model/families/gpt_oss.lua) beyond the llama.cpp reference
-- (family_reference_spec): its fused Hugging Face experts bound as each expert's matrices, the
-- shapes `loip synth --like` knows, and its bad input refused naming the tensor or field.
local ffi = require "ffi"
local loip = require "loip"
local json = require "loip.text.json"
local T = require "spec.support"

teardown(function() T.cleanup() end)
after_each(function() collectgarbage() collectgarbage() end)

local FLAGS = "--dtype f32 --experts-dtype f32 --layers 2 --dim 64 --heads 4 --kv-heads 2 --head-dim 16 --ffn 32 --experts 4 --vocab 512 --std 0.25 --seed 5"

local function synth(like, flags)
  local dir = T.tmpdir()
  local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth --like %s %s %s/hf", T.loip, like, flags or FLAGS, dir))
  assert(rc == 0, err)
  return dir
end

-- A copy of dir/hf with its config.json changed by fix(cfg).
local function with_config(dir, fix)
  local bad = T.tmpdir()
  assert.are.equal(0, (T.run(string.format("cp %s/hf/* %s/", dir, bad))))
  local cfg = assert(json.load(bad .. "/config.json"))
  fix(cfg)
  T.write(bad .. "/config.json", json.encode_sorted(cfg, 2))
  return bad
end

local function open(path) return loip.model.open(path, { threads = 1, context = 64, tokenizer = false }) end

describe("gpt-oss", function()
  local dir
  setup(function() dir = synth("gpt-oss-20b") end)

  it("synthesises the fused Hugging Face tensors of the 20b shape, alternating windows", function()
    local cfg = assert(json.load(dir .. "/hf/config.json"))
    assert.are.equal("GptOssForCausalLM", cfg.architectures[1])
    assert.are.equal("gpt_oss", cfg.model_type)
    assert.are.same({ "sliding_attention", "full_attention" }, cfg.layer_types)
    assert.are.equal(false, cfg.rope_scaling.truncate)
    local set = assert(require("loip.model.safetensors").open_dir(dir .. "/hf"))
    local f = set.index["model.layers.1.mlp.experts.gate_up_proj"]
    assert.are.same({ 4, 64, 64 }, f.tensors["model.layers.1.mlp.experts.gate_up_proj"].shape)
    assert.are.same({ 4, 32, 64 }, set.index["model.layers.1.mlp.experts.down_proj"].tensors["model.layers.1.mlp.experts.down_proj"].shape)
    assert.is_truthy(set.index["model.layers.0.self_attn.sinks"])
    assert.is_truthy(set.index["model.layers.0.mlp.router.bias"])
    require("loip.model.safetensors").close(set)
  end)

  it("binds each expert's gate, up and down from the fused tensors and runs", function()
    local m = open(dir .. "/hf")
    assert.are.equal("GptOssForCausalLM", m.architecture)
    local out = m:logits({ 1, 2, 3, 4 })
    for i = 0, 4 * m.vocab_size - 1 do assert(out[i] == out[i] and math.abs(out[i]) < 1e4, "logit " .. i) end
    m:close()
  end)

  it("reads its GGUF as llama.cpp does: every other layer windowed, YaRN truncated, the same logits", function()
    require("spec.support.to_gguf").convert(dir .. "/hf", dir .. "/m.gguf")
    local g = open(dir .. "/m.gguf")
    local cfg = g.facts.config
    assert.are.equal(128, cfg.sliding_window)
    assert.are.same({ "sliding_attention", "full_attention" }, cfg.layer_types)
    assert.are.equal("yarn", cfg.rope_scaling.rope_type)
    assert.are.equal(32, cfg.rope_scaling.factor)
    assert.is_nil(cfg.rope_scaling.truncate) -- (transformers' default: truncated)
    -- the directory with truncate set as the GGUF runs it gives the GGUF's logits
    local h = open(with_config(dir, function(c) c.rope_scaling.truncate = true end))
    local ids = { 1, 2, 3, 4, 5, 6, 7, 8 }
    local a = ffi.new("float[?]", 8 * g.vocab_size)
    ffi.copy(a, g:logits(ids), 8 * g.vocab_size * 4)
    assert.is_true(T.worst_relative(h:logits(ids), a, 8, g.vocab_size) < 1e-5)
    g:close()
    h:close()
  end)

  it("charges the experts it derives to the budget's weights, and gives them back at close", function()
    local budget = require("loip.runtime.memory").budget(0) -- (unlimited: counts)
    local m = loip.model.open(dir .. "/hf", { threads = 1, context = 64, tokenizer = false, budget = budget })
    local weights
    for _, a in ipairs(budget:report()) do if a.account == "weights" then weights = a.bytes end end
    -- the file's tensors (read into memory; its header is under 64 KiB) and each expert's gate, up
    -- and down (F32: 2 layers x 4 experts x 3 x 32 x 64 x 4 bytes) and the split gate/up biases
    -- (2 x 2 x 4 x 32 x 4)
    local derived = 2 * 4 * 3 * 32 * 64 * 4 + 2 * 2 * 4 * 32 * 4
    local size = require("loip.model.store").file_size(dir .. "/hf/model.safetensors")
    assert.is_true(weights >= size - 65536 + derived, string.format("weights %d, file %d + derived %d", weights, size, derived))
    m:close()
    for _, a in ipairs(budget:report()) do
      if a.account == "weights" then assert.are.equal(0, a.bytes) end
    end
  end)

  it("refuses a GGUF whose experts llama.cpp would scale, naming the key", function()
    local path = T.tmpdir() .. "/scaled.gguf"
    require("spec.support.to_gguf").convert(dir .. "/hf", path, nil, { { "gpt-oss.expert_weights_scale", "FLOAT32", 2.5 } })
    local ok, err = pcall(open, path)
    assert.is_false(ok)
    assert.matches("scaled%.gguf: metadata gpt%-oss%.expert_weights_scale is 2%.5", err)
  end)

  it("refuses a fused expert tensor of another shape, naming it", function()
    local bad = with_config(dir, function(cfg) cfg.intermediate_size = 16 end)
    local ok, err = pcall(open, bad)
    assert.is_false(ok)
    assert.matches("tensor 'model%.layers%.0%.mlp%.experts%.gate_up_proj_bias' is F32 %[4, 64%], expected F32, BF16 or F16 %[4, 32%]", err)
  end)

  it("refuses layer_types that do not list every layer, naming the field", function()
    local bad = with_config(dir, function(cfg) cfg.layer_types = { "sliding_attention" } end)
    local ok, err = pcall(open, bad)
    assert.is_false(ok)
    assert.matches("field 'layer_types' lists 1 layers; the model has 2", err)
  end)

  it("refuses DeepSeek's YaRN attention factor fields, naming them", function()
    local bad = with_config(dir, function(cfg) cfg.rope_scaling.mscale = 1 end)
    local ok, err = pcall(open, bad)
    assert.is_false(ok)
    assert.matches("rope_scaling: field 'mscale' is not supported", err)
  end)

  it("gives transformers' logits (a pure-Lua reference), YaRN's range untruncated as its config says", function()
    local reference = require "spec.support.gpt_oss_reference"
    local ids = { 1, 5, 9, 200, 7, 3, 300, 11 }
    local truncated = with_config(dir, function(c) c.rope_scaling.truncate = true end)
    local R = { [false] = reference.logits(dir .. "/hf", ids), [true] = reference.logits(truncated, ids) }
    for trunc, path in pairs({ [false] = dir .. "/hf", [true] = truncated }) do
      local m = open(path)
      local out = m:logits(ids)
      local w = T.worst_relative(out, R[trunc], #ids, m.vocab_size)
      assert.is_true(w < 1e-5, string.format("truncate %s: %.3g of the largest logit", tostring(trunc), w))
      -- (and the other YaRN is told apart)
      assert.is_true(T.worst_relative(out, R[not trunc], #ids, m.vocab_size) > 1e-4)
      m:close()
    end
  end)

  it("rings its sliding layers' KV (window 4 here, 128 released): transformers' logits past the window", function()
    local reference = require "spec.support.gpt_oss_reference"
    local wdir = synth("gpt-oss-20b", FLAGS .. " --sliding-window 4")
    local cfg = assert(json.load(wdir .. "/hf/config.json"))
    assert.are.same({ 4, { "sliding_attention", "full_attention" } }, { cfg.sliding_window, cfg.layer_types })
    local ids = { 1, 5, 9, 200, 7, 3, 300, 11, 42, 17, 99, 250 }
    local m = loip.model.open(wdir .. "/hf", { threads = 1, context = 64, batch = 4, tokenizer = false })
    assert.are.equal(1, require("loip.runtime.exec").session_kv_window_layers(m:session()))
    local out = m:logits(ids)
    local w = T.worst_relative(out, reference.logits(wdir .. "/hf", ids), #ids, m.vocab_size)
    assert.is_true(w < 1e-5, string.format("%.3g of the largest logit", w))
    assert.is_true(T.worst_relative(out, reference.logits(wdir .. "/hf", ids, false), #ids, m.vocab_size) > 1e-3)
    m:close()
  end)

  it("honours YaRN's truncate: the logits move when the correction range is truncated", function()
    local a = open(dir .. "/hf")
    local la = a:logits({ 1, 2, 3, 4, 5, 6, 7, 8 })
    local V = a.vocab_size
    local moved = with_config(dir, function(cfg) cfg.rope_scaling.truncate = true end)
    local b = open(moved)
    local lb = b:logits({ 1, 2, 3, 4, 5, 6, 7, 8 })
    assert.are.equal(0, T.bit_diffs(la, lb, V)) -- position 0 does not rotate
    assert.is_true(T.bit_diffs(la, lb, 8 * V) > 0)
    a:close()
    b:close()
  end)

  it("synthesises with gpt-oss's own tokenizer (--tokenizer o200k_base.tiktoken): its ids, its end tokens", function()
    local d, why = require("spec.support.o200k").synth_gpt_oss()
    if not d then pending(why) return end
    local ranks = T.fixture_path("models/o200k-harmony/o200k_base.tiktoken")
    local gen = assert(json.load(d .. "/hf/generation_config.json"))
    assert.are.same({ 199998, { 200002, 200012, 199999 } }, { gen.bos_token_id, gen.eos_token_id })
    assert.is_false(T.exists(d .. "/hf/tokenizer.bin"))
    local m = loip.model.open(d .. "/hf", { threads = 1, context = 64 })
    assert.are.equal(201088, m.vocab_size)
    assert.are.same({ "tiktoken", "o200k_harmony" }, { m.tokenizer.kind, m.tokenizer.encoding })
    assert.are.same({ 200002, 200012, 199999 }, m.stop_ids)
    m:close()
    local rc, out, err = T.run(string.format("%s generate --model %s/hf --threads 1 --temperature 0 --max-tokens 4 --json "
      .. "--prompt '<|start|>user<|message|>Hello, world!<|end|><|start|>assistant'", T.loip, d))
    assert.are.equal(0, rc, err)
    local r = assert(json.decode(out))
    assert.are.same({ 200006, 1428, 200008, 13225, 11, 2375, 0, 200007, 200006, 173781 }, r.prompt_ids)
    assert.are.equal(4, #r.token_ids)
    -- a tokenizer with more ids than the vocabulary, or one synth cannot copy, is refused naming it
    local bad = T.tmpdir()
    rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth --like gpt-oss-20b %s --tokenizer %s %s/hf", T.loip, FLAGS, ranks, bad))
    assert.are_not.equal(0, rc)
    assert.matches("--tokenizer " .. ranks:gsub("%p", "%%%0") .. " has 201088 ids, more than the vocabulary's 512 %(%-%-vocab%)", err)
    assert.is_false(T.exists(bad .. "/hf/config.json"))
    rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth --like gpt-oss-20b %s --tokenizer %s/models/stories260K-gguf/stories260K.gguf %s/hf",
      T.loip, FLAGS, T.root, bad))
    assert.are_not.equal(0, rc)
    assert.matches("is a gguf tokenizer; synth copies tiktoken ranks", err, 1, true)
  end)

  it("prices the 120b and 20b shapes as released: experts MXFP4, the rest BF16 (~61 GiB, ~13 GiB)", function()
    local problem = require "loip.plan.problem"
    for name, want in pairs({ ["gpt-oss-120b"] = { 60, 62 }, ["gpt-oss-20b"] = { 12.5, 13.5 } }) do
      local _, cfg, _, _, man = problem.model_of_shape(name, {}, { context = 128, batch = 16, threads = 1, logits_tokens = 1 })
      assert.are.equal("mxfp4", cfg.quantization_config.quant_method)
      local total, expert = 0, 0
      for _, f in ipairs(man.files) do
        total = total + f.size
        for _, t in ipairs(f.tensors) do
          if t.expert then assert.are.equal("MXFP4", t.dtype) expert = expert + 1 end
        end
      end
      assert.is_true(expert > 0)
      local gib = total / 2 ^ 30
      assert.is_true(gib > want[1] and gib < want[2], name .. ": " .. gib .. " GiB")
    end
  end)

  it("predicts offloaded layers' experts with their router's bias (pre-gating)", function()
    -- 8 experts, top 4; layer 0's router bias +50 on experts 4..7 and -50 on 0..3, layer 1's the
    -- other way round: the router picks those four whatever the token, and so does a prediction
    -- that adds the layer's own bias (layer 1 is predicted at layer 0, before its MLP block is
    -- read: from the expert cache's copy of the bias, not the block's views)
    local d = synth("gpt-oss-20b", (FLAGS:gsub("%-%-experts 4", "--experts 8")))
    local f = assert(io.open(d .. "/hf/model.safetensors", "r+b"))
    local hlen = 0
    for i, b in ipairs({ f:read(8):byte(1, 8) }) do hlen = hlen + b * 256 ^ (i - 1) end
    local header = assert(json.decode(f:read(hlen)))
    for l = 0, 1 do
      local t = header[string.format("model.layers.%d.mlp.router.bias", l)]
      local bias = ffi.new("float[8]", l == 0 and { -50, -50, -50, -50, 50, 50, 50, 50 } or { 50, 50, 50, 50, -50, -50, -50, -50 })
      f:seek("set", 8 + hlen + t.data_offsets[1])
      f:write(ffi.string(bias, 32))
    end
    f:close()
    require("loip.model.slice").write(d .. "/hf", d .. "/store", { quiet = true })
    local resident = open(d .. "/store")
    local ids = { 1, 2, 3, 4, 5, 6 }
    local want = ffi.new("float[?]", 6 * resident.vocab_size)
    ffi.copy(want, resident:logits(ids), 6 * resident.vocab_size * 4)
    resident:close()
    local plan = { slots = 1, devices = { { expert_slots = 8, stages = {
      { blocks = { 0, 1 }, offloaded = 2 }, { blocks = { 2, 3 }, offloaded = 2 } } } } }
    local m = loip.model.open(d .. "/store", { threads = 1, context = 64, tokenizer = false, plan = plan, experts = "lru:prefetch=2" })
    assert.are.equal(0, T.bit_diffs(want, m:logits(ids), 6 * m.vocab_size))
    local st = m.experts:stats()
    assert.is_true(st.prefetched > 0, "pre-gating predicted")
    assert.are.equal(st.prefetched, st.prefetch_hits, "every prediction confirmed by the router")
    m:close()
  end)

  describe("with MXFP4 experts as released", function()
    local mx
    setup(function() mx = synth("gpt-oss-20b", (FLAGS:gsub("%-%-experts%-dtype f32", "--experts-dtype mxfp4"))) end)

    it("keeps them MXFP4: blocks and scales in, GGUF's block_mxfp4 in the store, 17 bytes per 32 values", function()
      local cfg = assert(json.load(mx .. "/hf/config.json"))
      assert.are.equal("mxfp4", cfg.quantization_config.quant_method)
      local set = assert(require("loip.model.safetensors").open_dir(mx .. "/hf"))
      local name = "model.layers.0.mlp.experts.gate_up_proj_blocks"
      assert.are.same({ 4, 64, 2, 16 }, set.index[name].tensors[name].shape)
      assert.are.equal("U8", set.index[name].tensors[name].dtype)
      require("loip.model.safetensors").close(set)
      require("loip.model.slice").write(mx .. "/hf", mx .. "/store", { quiet = true })
      local man = assert(json.load(mx .. "/store/manifest.json"))
      local seen = 0
      for _, f in ipairs(man.files) do
        for _, t in ipairs(f.tensors) do
          if t.expert then
            seen = seen + 1
            assert.are.equal("MXFP4", t.dtype, t.name)
            assert.are.equal(t.shape[1] * t.shape[2] / 32 * 17, t.nbytes, t.name)
          end
        end
      end
      assert.are.equal(2 * 4 * 3, seen)
      -- the directory and its store give the same logits, bit for bit
      local a, b = open(mx .. "/hf"), open(mx .. "/store")
      assert.are.equal(0, T.bit_diffs(a:logits({ 1, 2, 3 }), b:logits({ 1, 2, 3 }), 3 * a.vocab_size))
      a:close()
      b:close()
    end)

    it("refuses MXFP4 blocks or scales of another shape, naming the tensor", function()
      -- (the same bytes, another shape: each file's header says so)
      local function reshaped(name, from, to)
        local bad = T.tmpdir()
        assert.are.equal(0, (T.run(string.format("cp %s/hf/* %s/", mx, bad))))
        local f = assert(io.open(bad .. "/model.safetensors", "rb"))
        local data = f:read("*a")
        f:close()
        local at = assert(data:find('"' .. name .. '":', 1, true))
        local s, e = data:find(from, at, true)
        assert(s and #to == #from)
        T.write(bad .. "/model.safetensors", data:sub(1, s - 1) .. to .. data:sub(e + 1))
        return bad
      end
      local p = "model.layers.0.mlp.experts."
      local ok, err = pcall(open, reshaped(p .. "gate_up_proj_blocks", '"shape":[4,64,2,16]', '"shape":[4,64,1,32]'))
      assert.is_false(ok)
      assert.matches("tensor '" .. p:gsub("%.", "%%.") .. "gate_up_proj_blocks' is U8 %[4, 64, 1, 32%], expected U8 %[4, 64, 2, 16%] %(MXFP4 blocks%)", err)
      ok, err = pcall(open, reshaped(p .. "down_proj_scales", '"shape":[4,64,1]', '"shape":[4,32,2]'))
      assert.is_false(ok)
      assert.matches("tensor '" .. p:gsub("%.", "%%.") .. "down_proj_scales' is U8 %[4, 32, 2%], expected U8 %[4, 64, 1%] %(the scales of '"
        .. p:gsub("%.", "%%.") .. "down_proj_blocks'%)", err)
    end)
  end)
end)
