-- Gemma 3 (lua/loip/model/families/gemma3.lua) beyond llama.cpp's reference
-- (models/family-reference): the same model read as Gemma3ForConditionalGeneration's language
-- model (a text_config, tensors under language_model.) gives the Gemma3ForCausalLM directory's
-- logits bit for bit; a BF16 model gives the same logits from its Hugging Face directory (norms
-- w, 1 added in fp32) and its GGUF (norms stored as 1 + w, F32); the windowed layers' own RoPE
-- base and the post-block norms change the logits; what Gemma 3 does not run is refused,
-- naming the field; its shapes have Google's parameter counts.
local ffi = require "ffi"
local loip = require "loip"
local json = require "loip.text.json"
local hf = require "loip.model.hf"
local T = require "spec.support"

teardown(function() T.cleanup() end)
after_each(function() collectgarbage() collectgarbage() end)

local FLAGS = "--layers 6 --dim 64 --heads 4 --kv-heads 2 --head-dim 16 --ffn 96 --vocab 512 --std 0.25 --seed 5"
local TOKENS = { 1, 110, 140, 272, 16, 443, 95, 126, 455, 466, 439, 295 }

local function synth(dir, dtype)
  local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth --like gemma-3-1b --dtype %s %s %s", T.loip, dtype,
    FLAGS, dir))
  assert(rc == 0, err)
end

-- The logits of TOKENS from path, an array of their own.
local function logits(path)
  local m = loip.model.open(path, { threads = 1, context = 64, tokenizer = false })
  local n, V = #TOKENS, m.vocab_size
  local out = ffi.new("float[?]", n * V)
  ffi.copy(out, m:logits(TOKENS), n * V * 4)
  m:close()
  return out, n * V
end

-- dir's config.json rewritten by edit(cfg) into a copy of dir; the copy.
local function edited(dir, edit)
  local out = T.tmpdir()
  assert.are.equal(0, (T.run(string.format("cp %s/* %s/", dir, out))))
  local cfg = assert(json.load(out .. "/config.json"))
  cfg = edit(cfg) or cfg
  T.write(out .. "/config.json", json.encode_sorted(cfg, 2))
  return out
end

describe("gemma3", function()
  local f32
  setup(function()
    f32 = T.tmpdir() .. "/hf"
    synth(f32, "f32")
  end)

  -- f32 as Gemma3ForConditionalGeneration: its config as text_config, its tensors renamed by rename
  -- (the header alone is rewritten: the offsets stay)
  local function conditional(rename)
    local cg = edited(f32, function(cfg)
      local text = {}
      for k, v in pairs(cfg) do
        if k ~= "architectures" and k ~= "bos_token_id" and k ~= "eos_token_id" then text[k] = v end
      end
      text.model_type = "gemma3_text"
      return { architectures = { "Gemma3ForConditionalGeneration" }, model_type = "gemma3", text_config = text,
        bos_token_id = cfg.bos_token_id, eos_token_id = cfg.eos_token_id, vision_config = { hidden_size = 8 } }
    end)
    local bytes = T.read(cg .. "/model.safetensors")
    local hlen = 0
    for i = 8, 1, -1 do hlen = hlen * 256 + bytes:byte(i) end
    local header = assert(json.decode(bytes:sub(9, 8 + hlen)))
    local renamed = {}
    for k, v in pairs(header) do renamed[k == "__metadata__" and k or rename(k)] = v end
    local h = json.encode_sorted(renamed)
    h = h .. string.rep(" ", (8 - #h % 8) % 8)
    T.write(cg .. "/model.safetensors", T.u64le(#h) .. h .. bytes:sub(9 + hlen))
    return cg
  end

  it("reads Gemma3ForConditionalGeneration's language model as the causal LM, bit for bit (both layouts)", function()
    local want, count = logits(f32)
    for _, rename in ipairs({
      function(k) return "language_model." .. k end, -- (Google's checkpoints)
      function(k) return (k:gsub("^model%.", "model.language_model.")) end, -- (transformers 4.52 to 4.57)
    }) do
      local cg = conditional(rename)
      assert.are.equal(0, T.bit_diffs(want, (logits(cg)), count))
      local m = loip.model.open(cg, { threads = 1, context = 64, tokenizer = false })
      assert.are.equal("Gemma3ForConditionalGeneration", m.architecture)
      m:close()
      -- its slice store too
      local st = T.tmpdir() .. "/store"
      require("loip.model.slice").write(cg, st, { quiet = true })
      assert.are.equal(0, T.bit_diffs(want, (logits(st)), count))
    end
  end)

  it("gives a BF16 model's logits bit for bit from its Hugging Face directory, its GGUF and the GGUF's store", function()
    local dir = T.tmpdir()
    synth(dir .. "/hf", "bf16")
    require("spec.support.to_gguf").convert(dir .. "/hf", dir .. "/m.gguf")
    local a, count = logits(dir .. "/hf")
    local b = logits(dir .. "/m.gguf")
    assert.are.equal(0, T.bit_diffs(a, b, count))
    -- a store sliced from the GGUF keeps its norms as stored (1 + w) and reads them so
    require("loip.model.slice").write(dir .. "/m.gguf", dir .. "/store", { quiet = true })
    assert.are.equal(0, T.bit_diffs(a, (logits(dir .. "/store")), count))
  end)

  it("runs the windowed layers with their own RoPE base and normalises the blocks' outputs", function()
    local want, count = logits(f32)
    -- every layer global: the windowed layers' base (rope_local_base_freq) no longer applies
    local global = edited(f32, function(cfg) cfg.sliding_window_pattern = 1 end)
    assert.is_true(T.bit_diffs(want, (logits(global)), count) > 0)
    local same = edited(f32, function(cfg) cfg.rope_local_base_freq = cfg.rope_theta end)
    assert.are.equal(0, T.bit_diffs((logits(same)), (logits(global)), count))
    -- layer_types as the pattern gives them: the same logits
    local typed = edited(f32, function(cfg)
      cfg.layer_types = { "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
        "sliding_attention", "full_attention" }
      cfg.sliding_window_pattern = nil
    end)
    assert.are.equal(0, T.bit_diffs(want, (logits(typed)), count))
  end)

  it("fills what a config leaves out with Gemma3TextConfig's defaults", function()
    local c = hf.parse_config({ architectures = { "Gemma3ForConditionalGeneration" },
      text_config = { hidden_size = 2560, intermediate_size = 10240, model_type = "gemma3_text", num_hidden_layers = 34,
        rope_scaling = { factor = 8.0, rope_type = "linear" }, sliding_window = 1024 } }, "4b config.json")
    assert.are.same({ 8, 4, 256, 262208, 1024 }, { c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size, c.sliding_window })
    assert.are.equal(1, c.tied_embeddings)
    assert.are.equal(8, c.rope_factor)
    assert.are.equal(10000, c.rope_local_theta)
    assert.is_true(math.abs(c.attn_scale - 1 / 16) < 1e-9)
    assert.are.same({ 1, 1, 1, 1, 1, 0 }, { c.layer_window[0], c.layer_window[1], c.layer_window[2], c.layer_window[3],
      c.layer_window[4], c.layer_window[5] })
  end)

  it("refuses what Gemma 3 does not run, naming the field", function()
    local base = assert(json.load(f32 .. "/config.json"))
    local function refused(edit, pattern)
      local cfg = {}
      for k, v in pairs(base) do cfg[k] = v end
      edit(cfg)
      local ok, err = pcall(hf.parse_config, cfg, "x/config.json")
      assert.is_false(ok)
      assert.matches(pattern, err)
    end
    refused(function(c) c.attn_logit_softcapping = 50 end, "x/config.json: field 'attn_logit_softcapping' is 50")
    refused(function(c) c.layer_types = { "sliding_attention" } end, "field 'layer_types' must list one type per layer %(6%)")
    refused(function(c) c.layer_types = { "a", "b", "c", "d", "e", "f" } end, "field 'layer_types' entry 1 is 'a'")
    refused(function(c) c.hidden_activation = "relu" end, "field 'hidden_activation' is 'relu'")
    refused(function(c) c.final_logit_softcapping = -1 end, "field 'final_logit_softcapping' is %-1")
    refused(function(c) c.architectures = { "Gemma3ForConditionalGeneration" } end, "field 'text_config' is missing")
  end)

  it("scales the embedding rows in their dtype (BF16: the scale and the product rounded to BF16)", function()
    local exec, core = require "loip.runtime.exec", require "loip.core"
    local K = core.constants
    local c = hf.parse_config(assert(json.load(f32 .. "/config.json")), "config.json")
    assert.are.equal(8, c.embed_scale) -- sqrt(64)
    c.embed_scale = math.sqrt(1152) -- (gemma-3-1b's: 33.94..., 34 in BF16)
    local dim, vocab = c.dim, c.vocab_size
    local row = { 0.3, -1.7, 2.5e-3, 7.0 }
    local function to_bf16(v) -- (loip_convert: round to nearest even)
      local dst = ffi.new("uint16_t[1]")
      assert.are.equal(0, core.C.loip_convert(dst, K.BF16, ffi.new("float[1]", v), K.F32, 1))
      return dst[0]
    end
    local function from_bf16(h)
      local dst = ffi.new("float[1]")
      assert.are.equal(0, core.C.loip_convert(dst, K.F32, ffi.new("uint16_t[1]", h), K.BF16, 1))
      return dst[0]
    end
    for _, dt in ipairs({ "F32", "BF16" }) do
      local E = ffi.new(dt == "F32" and "float[?]" or "uint16_t[?]", vocab * dim)
      for i = 0, dim - 1 do
        local v = row[i % #row + 1] * (1 + i / 64)
        E[5 * dim + i] = dt == "F32" and v or to_bf16(v)
      end
      local m = assert(exec.model_new(c))
      local t = ffi.new("loip_tensor")
      t.data, t.dtype, t.ndim, t.shape[0], t.shape[1] = E, dt == "F32" and K.F32 or K.BF16, 2, vocab, dim
      assert(exec.model_bind(m, -1, K.W_EMBED, t))
      local pool = assert(exec.pool_new(1))
      local sess = assert(exec.session_new_layers(m, pool, 16, 1, nil, nil))
      local out = ffi.new("float[?]", dim)
      assert.are.equal(0, core.C.loip_session_embed(sess, ffi.new("int32_t[1]", 5), 1, out))
      local f = ffi.new("float[2]")
      for i = 0, dim - 1 do
        local want
        if dt == "F32" then
          f[0] = E[5 * dim + i]
          f[1] = f[0] * c.embed_scale -- (exact in double, one rounding to float: the float product)
          want = f[1]
        else
          local sc = from_bf16(to_bf16(c.embed_scale))
          assert.are.equal(34, sc)
          f[0] = from_bf16(E[5 * dim + i]) * sc
          want = from_bf16(to_bf16(f[0]))
        end
        assert.are.equal(want, out[i], dt .. " " .. i .. ": " .. tostring(out[i]) .. " want " .. tostring(want))
      end
      exec.session_free(sess)
      exec.pool_free(pool)
      exec.model_free(m)
    end
  end)

  it("the runtime refuses a switch out of range, naming it", function()
    local exec = require "loip.runtime.exec"
    local base = assert(json.load(f32 .. "/config.json"))
    for _, case in ipairs({ { "ffn_act", 7, "unknown ffn_act 7" }, { "attn_scale", -1, "attn_scale" },
      { "embed_scale", 0 / 0, "embed_scale" }, { "rope_scaling", 9, "unknown rope_scaling 9" } }) do
      local c = hf.parse_config(base, "config.json")
      c[case[1]] = case[2]
      local m, err = exec.model_new(c)
      assert.is_nil(m)
      assert.matches(case[3], err, 1, true)
    end
    local c = hf.parse_config(base, "config.json")
    c.rope_scaling, c.rope_factor = 2, 0 -- (linear, without its factor)
    local m, err = exec.model_new(c)
    assert.is_nil(m)
    assert.matches("linear rope scaling needs factor > 0", err, 1, true)
  end)

  it("caps the logits when the config has final_logit_softcapping", function()
    local want, count = logits(f32)
    local capped = logits(edited(f32, function(cfg) cfg.final_logit_softcapping = 2.0 end))
    local worst = 0
    for i = 0, count - 1 do
      worst = math.max(worst, math.abs(capped[i] - 2.0 * math.tanh(want[i] / 2.0)))
      assert.is_true(math.abs(capped[i]) <= 2.0)
    end
    assert.is_true(worst < 1e-6, tostring(worst))
  end)

  it("has Google's parameter counts in its shapes (gemma-3-1b; gemma-3-4b's text model)", function()
    local synth_cfg = require("loip.model.synth").config
    local function count(o)
      local cfg = synth_cfg(o)
      local c = hf.parse_config(cfg, o.like)
      local n = 0
      for _, t in ipairs(hf.tensor_list(c, cfg.architectures[1])) do n = n + t.shape[1] * (t.shape[2] or 1) end
      return n
    end
    assert.are.equal(999885952, count { like = "gemma-3-1b", dtype = "bf16" })
    -- (Keras Hub's gemma3_4b_text: 3,880,099,328 with a vocabulary of 262144; Hugging Face's has 262208)
    assert.are.equal(3880099328, count { like = "gemma-3-4b", dtype = "bf16", vocab = 262144 })
  end)
end)
