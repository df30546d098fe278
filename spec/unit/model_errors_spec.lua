-- Bad model input: every failure names the file and the field or tensor, and nothing crashes.
local loip = require "loip"
local T = require "spec.support"
local cjson = require "cjson"

local function base_config()
  return { architectures = { "LlamaForCausalLM" }, hidden_size = 8, intermediate_size = 16,
    num_hidden_layers = 1, num_attention_heads = 2, num_key_value_heads = 1, vocab_size = 300,
    max_position_embeddings = 64, rms_norm_eps = 1e-5, tie_word_embeddings = true }
end

local function tensors_for(cfg, dtype)
  local dim, ffn, hd = cfg.hidden_size, cfg.intermediate_size, cfg.hidden_size / cfg.num_attention_heads
  local kv = cfg.num_key_value_heads * hd
  local es = dtype == "F32" and 4 or 2
  local function t(shape)
    local n = 1
    for _, d in ipairs(shape) do n = n * d end
    return { dtype = dtype, shape = shape, data = string.rep("\0", n * es) }
  end
  local ts = {
    ["model.embed_tokens.weight"] = t({ cfg.vocab_size, dim }),
    ["model.norm.weight"] = t({ dim }),
  }
  local p = "model.layers.0."
  ts[p .. "input_layernorm.weight"] = t({ dim })
  ts[p .. "post_attention_layernorm.weight"] = t({ dim })
  ts[p .. "self_attn.q_proj.weight"] = t({ dim, dim })
  ts[p .. "self_attn.k_proj.weight"] = t({ kv, dim })
  ts[p .. "self_attn.v_proj.weight"] = t({ kv, dim })
  ts[p .. "self_attn.o_proj.weight"] = t({ dim, dim })
  ts[p .. "mlp.gate_proj.weight"] = t({ ffn, dim })
  ts[p .. "mlp.up_proj.weight"] = t({ ffn, dim })
  ts[p .. "mlp.down_proj.weight"] = t({ dim, ffn })
  return ts
end

local function make_model(cfg, tensors, opts)
  local dir = T.tmpdir()
  T.write(dir .. "/config.json", type(cfg) == "string" and cfg or cjson.encode(cfg))
  T.safetensors(dir .. "/model.safetensors", tensors, opts)
  T.write(dir .. "/tokenizer.bin", require("loip.model.synth").tokenizer_bin(300))
  return dir
end

local function open_error(dir)
  local ok, err = pcall(loip.model.open, dir, { threads = 1 })
  assert.is_false(ok, "expected an error")
  return err
end

describe("opening a bad model", function()
  after_each(function() T.cleanup() collectgarbage() collectgarbage() end)

  it("opens the well-formed tiny model (the baseline of these cases)", function()
    for _, dt in ipairs({ "F32", "BF16", "F16" }) do
      local m = loip.model.open(make_model(base_config(), tensors_for(base_config(), dt)), { threads = 1 })
      local it, st = m:generate({ 1, 5, 9 }, { temperature = 0, max_tokens = 3 })
      for _ in it do end
      assert.are.equal(3, #st.token_ids)
      m:close()
    end
  end)

  it("names an unknown architecture", function()
    local cfg = base_config()
    cfg.architectures = { "GPTNeoXForCausalLM" }
    local err = open_error(make_model(cfg, tensors_for(base_config(), "F32")))
    assert.matches("config.json: architecture 'GPTNeoXForCausalLM' is not supported", err, 1, true)
  end)

  it("names a missing config field", function()
    local cfg = base_config()
    cfg.intermediate_size = nil
    local err = open_error(make_model(cfg, tensors_for(base_config(), "F32")))
    assert.matches("config.json: field 'intermediate_size' is missing", err, 1, true)
  end)

  it("names a config field of the wrong type", function()
    local cfg = base_config()
    cfg.hidden_size = "eight"
    assert.matches("field 'hidden_size' must be an integer", open_error(make_model(cfg, tensors_for(base_config(), "F32"))), 1, true)
  end)

  it("rejects an unsupported rope_scaling", function()
    local cfg = base_config()
    cfg.rope_scaling = { type = "dynamic", factor = 4 }
    assert.matches("rope_scaling type 'dynamic' is not supported", open_error(make_model(cfg, tensors_for(base_config(), "F32"))), 1, true)
    -- (YaRN runs: gpt-oss; without its original context it is refused naming the field)
    cfg.rope_scaling = { type = "yarn", factor = 4 }
    assert.matches("rope_scaling: field 'original_max_position_embeddings' is missing",
      open_error(make_model(cfg, tensors_for(base_config(), "F32"))), 1, true)
  end)

  it("rejects invalid JSON in config.json", function()
    assert.matches("config.json: invalid JSON", open_error(make_model("{ nope", tensors_for(base_config(), "F32"))), 1, true)
  end)

  it("rejects a config.json of one JSON value, and JSON with a NUL byte or NaN (found by fuzz_manifest and fuzz_safetensors)", function()
    -- a file of `false` used to raise an error with no message; cjson took the text before a
    -- NUL byte for the whole, and NaN for a number
    assert.matches("config.json: not a JSON object or array", open_error(make_model("false", tensors_for(base_config(), "F32"))), 1, true)
    local cfg = cjson.encode(base_config())
    assert.matches("config.json: invalid JSON: a NUL byte at offset " .. #cfg,
      open_error(make_model(cfg .. "\0garbage", tensors_for(base_config(), "F32"))), 1, true)
    assert.matches("config.json: invalid JSON", open_error(make_model(cfg:gsub('"rms_norm_eps":[^,}]+', '"rms_norm_eps":NaN'),
      tensors_for(base_config(), "F32"))), 1, true)
    -- a safetensors header that is JSON but not an object
    local dir = make_model(base_config(), tensors_for(base_config(), "F32"))
    for _, h in ipairs({ "false", "false\0\0\0{}", "[1, 2]" }) do
      T.write(dir .. "/model.safetensors", T.u64le(#h) .. h)
      local err = open_error(dir)
      assert.is_string(err)
      assert.matches("model.safetensors: ", err, 1, true)
    end
  end)

  it("names a slice manifest's tensor entry that is not an object (found by fuzz_manifest)", function()
    local store = require "loip.model.store"
    local json = require "loip.text.json"
    local man = assert(json.load(T.root .. "/tests/fuzz/corpus/manifest/stories260K.json"))
    assert.are.equal(man, store.check_manifest(man, "st"))
    man.files[1].tensors[1] = false
    local ok, err = pcall(store.check_manifest, man, "st")
    assert.is_false(ok)
    assert.matches("st/manifest.json: files[1] (" .. man.files[1].name .. "): tensors[1] is not an object", err, 1, true)
  end)

  it("names a missing tensor", function()
    local ts = tensors_for(base_config(), "F32")
    ts["model.layers.0.mlp.up_proj.weight"] = nil
    assert.matches("tensor 'model.layers.0.mlp.up_proj.weight' is missing", open_error(make_model(base_config(), ts)), 1, true)
  end)

  it("names a misshapen tensor", function()
    local ts = tensors_for(base_config(), "F32")
    ts["model.layers.0.self_attn.k_proj.weight"] = { dtype = "F32", shape = { 8, 8 }, data = string.rep("\0", 256) }
    local err = open_error(make_model(base_config(), ts))
    assert.matches("model.safetensors: tensor 'model.layers.0.self_attn.k_proj.weight': wk: shape [8, 8], expected [4, 8]", err, 1, true)
  end)

  it("names an unsupported dtype", function()
    local ts = tensors_for(base_config(), "F32")
    ts["model.norm.weight"] = { dtype = "I32", shape = { 8 }, data = string.rep("\0", 32) }
    assert.matches("tensor 'model.norm.weight' has dtype I32, which loip does not compute with", open_error(make_model(base_config(), ts)), 1, true)
  end)

  it("rejects a truncated safetensors file", function()
    local dir = make_model(base_config(), tensors_for(base_config(), "F32"))
    local data = T.read(dir .. "/model.safetensors")
    T.write(dir .. "/model.safetensors", data:sub(1, #data - 100))
    assert.matches("run past the end of the data", open_error(dir), 1, true)
    T.write(dir .. "/model.safetensors", data:sub(1, 5))
    assert.matches("truncated: 5 bytes", open_error(dir), 1, true)
  end)

  it("rejects an absurd header length", function()
    local err = open_error(make_model(base_config(), tensors_for(base_config(), "F32"), { header_len = 2 ^ 40 }))
    assert.matches("header length %d+ is absurd", err)
  end)

  it("rejects a header length past the end of the file", function()
    local err = open_error(make_model(base_config(), tensors_for(base_config(), "F32"), { header_len = 10 ^ 7 }))
    assert.matches("runs past the end of the file", err, 1, true)
  end)

  it("rejects overlapping tensors", function()
    local ts = tensors_for(base_config(), "F32")
    ts["model.norm.weight"].offsets = { 0, 32 } -- overlaps the embedding, which starts at 0 too
    local err = open_error(make_model(base_config(), ts))
    assert.matches("overlap", err, 1, true)
  end)

  it("rejects data_offsets that disagree with the shape", function()
    local ts = tensors_for(base_config(), "F32")
    ts["model.norm.weight"].shape = { 9 }
    assert.matches("tensor 'model.norm.weight': 32 bytes in data_offsets but shape and dtype F32 need 36", open_error(make_model(base_config(), ts)), 1, true)
  end)

  it("names a directory that is not a model", function()
    local dir = T.tmpdir()
    assert.matches("not a model", open_error(dir), 1, true)
  end)

  it("rejects a truncated llama2.c checkpoint", function()
    local dir = T.tmpdir()
    local data = T.read(T.root .. "/models/stories260K/stories260K.bin")
    T.write(dir .. "/model.bin", data:sub(1, 200000))
    T.write(dir .. "/tokenizer.bin", T.read(T.root .. "/models/stories260K/tok512.bin"))
    assert.matches("model.bin: truncated: array wq", open_error(dir), 1, true)
  end)

  it("rejects a token id outside the vocabulary", function()
    local m = loip.model.open(T.root .. "/models/stories260K", { threads = 1 })
    local ok, err = pcall(m.logits, m, { 1, 512 })
    assert.is_false(ok)
    assert.matches("not in [0, 512)", err, 1, true)
    m:close()
  end)
end)
