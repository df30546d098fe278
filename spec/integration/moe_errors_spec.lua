-- Mixtures of experts loip refuses, each naming the field, key or tensor: Hugging Face configs
-- with dense layers among the experts' or a top-k past the expert count, GGUF files whose
-- tensors contradict their expert count, without a router, with quantized experts or without
-- the expert keys, and slice store manifests whose expert fields disagree.
local ffi = require "ffi"
local loip = require "loip"
local json = require "loip.text.json"
local gguf = require "loip.model.gguf"
local store = require "loip.model.store"
local T = require "spec.support"
local to_gguf = require "spec.support.to_gguf"

after_each(function() T.cleanup() collectgarbage() collectgarbage() end)

-- A tiny F32 model of shape like in dir/hf and its GGUF dir/m.gguf.
local function make(like)
  local dir = T.tmpdir()
  local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth --like %s --dtype f32 --layers 3 --dim 32 --heads 2 "
    .. "--kv-heads 1 --ffn 16 --experts 8 --experts-per-token 2 --vocab 300 --seed 2 %s/hf", T.loip, like, dir))
  assert.are.equal(0, rc, err)
  to_gguf.convert(dir .. "/hf", dir .. "/m.gguf")
  return dir
end

local function open_error(path)
  local ok, err = pcall(loip.model.open, path, { threads = 1, tokenizer = false })
  assert.is_false(ok, "expected an error")
  return err
end

-- dir/hf with its config.json made original (the decoded config) changed by edit(cfg).
local function with_config(dir, original, edit)
  local cfg = json.decode(json.encode(original))
  edit(cfg)
  T.write(dir .. "/hf/config.json", json.encode_sorted(cfg, 2))
  return dir .. "/hf"
end

-- The GGUF at path rewritten as edit(md, tensors) leaves its metadata ({ key, type, value }) and
-- tensors ({ name, type, dims, data }).
local function rewrite(path, edit)
  local g = gguf.open(path)
  local md, tensors = {}, {}
  local keys = {}
  for k in pairs(g.metadata) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do md[#md + 1] = { k, g.types[k], g.metadata[k] } end
  for _, name in ipairs(g.order) do
    local x = g.tensors[name]
    local dims = {}
    for i, d in ipairs(x.dims) do dims[i] = d end
    tensors[#tensors + 1] = { name = name, type = x.type, dims = dims, data = ffi.string(g:data(name)) }
  end
  g:close()
  edit(md, tensors)
  local out = path:gsub("%.gguf$", "") .. "-bad.gguf"
  T.write(out, gguf.encode(md, tensors))
  return out
end

local function set_key(md, key, value)
  for i, kv in ipairs(md) do
    if kv[1] == key then
      if value == nil then table.remove(md, i) else kv[3] = value end
      return
    end
  end
  error("no key " .. key)
end

local function find(tensors, name)
  for i, t in ipairs(tensors) do if t.name == name then return t, i end end
  error("no tensor " .. name)
end

describe("Hugging Face mixtures of experts loip refuses", function()
  it("names the field: dense layers among the experts', a top-k past the experts, a missing shared expert size", function()
    local dir = make("qwen1.5-moe-a2.7b")
    local original = assert(json.load(dir .. "/hf/config.json"))
    local function err_of(edit) return open_error(with_config(dir, original, edit)) end
    assert.matches("config.json: field 'decoder_sparse_step' is 2: only a mixture of experts in every layer",
      err_of(function(c) c.decoder_sparse_step = 2 end))
    assert.matches("field 'mlp_only_layers' lists dense layers", err_of(function(c) c.mlp_only_layers = { 1 } end))
    assert.matches("field 'num_experts_per_tok' is 9: must be 1..8 %(num_experts%)", err_of(function(c) c.num_experts_per_tok = 9 end))
    assert.matches("field 'num_experts' is 0: a mixture of experts needs at least one", err_of(function(c) c.num_experts = 0 end))
    assert.matches("field 'shared_expert_intermediate_size' is missing", err_of(function(c) c.shared_expert_intermediate_size = nil end))
    -- more experts than the weights hold: the router's shape names it
    assert.matches("model.safetensors: tensor 'model.layers.0.mlp.gate.weight': router: shape %[8, 32%], expected %[9, 32%]",
      err_of(function(c) c.num_experts = 9 end))
    -- (the well-formed config opens)
    loip.model.open(with_config(dir, original, function() end), { threads = 1 }):close()
  end)
end)

describe("GGUF mixtures of experts loip refuses", function()
  -- (a model of its own for each case: the temporary directories go after each)
  local path
  before_each(function() path = nil end)
  local function base()
    path = path or make("qwen3-30b-a3b") .. "/m.gguf"
    return path
  end

  it("names the tensor whose experts contradict expert_count, or the router that does", function()
    assert.matches("tensor 'blk.1.ffn_gate_exps.weight' holds 6 experts but metadata qwen3moe.expert_count is 8",
      open_error(rewrite(base(), function(_, ts)
        local t = find(ts, "blk.1.ffn_gate_exps.weight")
        t.dims[3], t.data = 6, t.data:sub(1, #t.data * 6 / 8)
      end)))
    assert.matches("tensor 'blk.0.ffn_gate_inp.weight' routes to 7 experts but metadata qwen3moe.expert_count is 8",
      open_error(rewrite(base(), function(_, ts)
        local t = find(ts, "blk.0.ffn_gate_inp.weight")
        t.dims[2], t.data = 7, t.data:sub(1, #t.data * 7 / 8)
      end)))
    assert.matches("metadata qwen3moe.expert_used_count is 9: must be 1..8 %(qwen3moe.expert_count%)",
      open_error(rewrite(base(), function(md) set_key(md, "qwen3moe.expert_used_count", 9) end)))
  end)

  it("names a missing router, a missing expert key and a quantized expert tensor with its type", function()
    assert.matches("tensor 'blk.2.ffn_gate_inp.weight' is missing", open_error(rewrite(base(), function(_, ts)
      local _, i = find(ts, "blk.2.ffn_gate_inp.weight")
      table.remove(ts, i)
    end)))
    assert.matches("metadata qwen3moe.expert_count is missing",
      open_error(rewrite(base(), function(md) set_key(md, "qwen3moe.expert_count", nil) end)))
    assert.matches("metadata qwen3moe.expert_used_count is missing",
      open_error(rewrite(base(), function(md) set_key(md, "qwen3moe.expert_used_count", nil) end)))
    -- (gguf.encode writes float types only: the type field of the tensor's entry made Q8_0 after)
    local q = rewrite(base(), function() end)
    local bytes = T.read(q)
    local name = "blk.1.ffn_up_exps.weight"
    local at = bytes:find(name, 1, true) + #name + 4 + 3 * 8 -- past the name, dimension count and dims
    T.write(q, bytes:sub(1, at - 1) .. ffi.string(ffi.new("uint32_t[1]", 8), 4) .. bytes:sub(at + 4))
    assert.matches("tensor 'blk.1.ffn_up_exps.weight' has type Q8_0: quantized and integer tensors are refused", open_error(q))
  end)

  it("takes an expert's size as llama.cpp does without expert_feed_forward_length: feed_forward_length / top-k", function()
    local m = loip.model.open(rewrite(base(), function(md)
      set_key(md, "qwen3moe.expert_feed_forward_length", nil)
      set_key(md, "qwen3moe.feed_forward_length", 33)
    end), { threads = 1, tokenizer = false })
    assert.are.same({ 16, 1 }, { m.cfg.expert_dim, m.cfg.norm_topk_prob }) -- (floor(33 / 2); renormalised, as llama.cpp's qwen3moe)
    m:close()
  end)

  it("names llama.expert_count when a llama file has experts but not the key", function()
    local d = make("mixtral-8x7b")
    assert.matches("metadata llama.expert_count is missing",
      open_error(rewrite(d .. "/m.gguf", function(md) set_key(md, "llama.expert_count", nil) end)))
    local m = loip.model.open(d .. "/m.gguf", { threads = 1, tokenizer = false })
    assert.are.same({ "MixtralForCausalLM", 8, 2, 16 }, { m.architecture, m.cfg.n_experts, m.cfg.n_experts_used, m.cfg.expert_dim })
    m:close()
  end)
end)

describe("slice store manifests with experts", function()
  it("are refused when their expert fields disagree, naming the file and tensor", function()
    local dir = make("qwen3-30b-a3b")
    require("loip.model.slice").write(dir .. "/hf", dir .. "/st", { quiet = true })
    local man = store.read_manifest(dir .. "/st")
    local function check_err(edit)
      local copy = json.decode(json.encode(man))
      local f
      for _, x in ipairs(copy.files) do if x.name == "layer-001-exp-003.bin" then f = x end end
      edit(copy, f)
      local ok, err = pcall(store.check_manifest, copy, dir .. "/st")
      assert.is_false(ok)
      return err
    end
    assert.matches("layer%-001%-exp%-003.bin%): tensor 'model.layers.1.mlp.experts.3.up_proj.weight': expert 4 of layer 1 in the file of expert 3",
      check_err(function(_, f) f.tensors[2].expert = 4 end))
    assert.matches("the file of expert 5 of layer 1 is named layer%-001%-exp%-005.bin", check_err(function(_, f)
      f.expert = 5
      for _, t in ipairs(f.tensors) do t.expert = 5 end
    end))
    assert.matches("layer%-001%-exp%-003.bin%): has no tensor of kind 'expert_down'", check_err(function(_, f) f.tensors[3] = nil end))
    assert.matches("tensor 'model.layers.1.mlp.gate.weight': 'expert' on a tensor of kind 'router'", check_err(function(m)
      for _, x in ipairs(m.files) do
        if x.name == "layer-001-mlp.bin" then x.tensors[2].expert = 0 end
      end
    end))
    assert.matches("'expert' is not an expert's index", check_err(function(_, f) f.tensors[1].expert = "three" end))
  end)
end)
