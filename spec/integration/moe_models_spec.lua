-- Mixtures of experts from files: tiny synthetic Qwen3-MoE, Mixtral and Qwen2-MoE models (loip
-- synth, F32) as Hugging Face directories, their GGUF conversions (as llama.cpp's converter
-- writes them: spec/support/to_gguf.lua) and their slice stores give the same logits and
-- greedy tokens, and the logits of a pure-Lua reference of the mixture
-- (spec/support/moe_reference.lua). The stores keep each routed expert in a file of its own.
local loip = require "loip"
local json = require "loip.text.json"
local store = require "loip.model.store"
local slice = require "loip.model.slice"
local T = require "spec.support"
local to_gguf = require "spec.support.to_gguf"
local reference = require "spec.support.moe_reference"

after_each(function() T.cleanup() collectgarbage() collectgarbage() end)

local SHAPE = "--dtype f32 --layers 4 --dim 64 --heads 4 --kv-heads 2 --ffn 32 --experts 8 --vocab 512 --seed 5 --std 0.3"
local IDS = { 1, 17, 290, 45, 100, 7, 260, 33, 12 }

-- A tiny model of shape `like` (with flags) in dir/hf, its GGUF dir/m.gguf and the stores of both.
local function make(like, flags)
  local dir = T.tmpdir()
  local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth --like %s %s %s %s/hf", T.loip, like, SHAPE, flags, dir))
  assert.are.equal(0, rc, err)
  to_gguf.convert(dir .. "/hf", dir .. "/m.gguf")
  slice.write(dir .. "/hf", dir .. "/store", { quiet = true })
  slice.write(dir .. "/m.gguf", dir .. "/gstore", { quiet = true })
  return dir
end

-- Logits of IDS (a Lua list) and 12 greedy tokens after them, for the model at path.
local function run(path)
  local m = loip.model.open(path, { threads = 1 })
  local out = m:logits(IDS)
  local logits = {}
  for i = 0, #IDS * m.vocab_size - 1 do logits[i + 1] = out[i] end
  local it, st = m:generate({ 1, 17, 290 }, { temperature = 0, max_tokens = 12 })
  for _ in it do end
  local arch, cfg = m.architecture, m.cfg
  local facts = { architecture = arch, n_experts = cfg.n_experts, used = cfg.n_experts_used, norm = cfg.norm_topk_prob,
    shared = cfg.shared_expert, tokens = st.token_ids }
  m:close()
  return logits, facts
end

local function max_diff(a, b)
  local d, scale = 0, 0
  for i = 1, #a do
    d = math.max(d, math.abs(a[i] - b[i]))
    scale = math.max(scale, math.abs(a[i]))
  end
  return d, scale
end

local cases = {
  { name = "Qwen3-MoE (q/k norms, top-2 of 8 renormalised)", like = "qwen3-30b-a3b", flags = "--experts-per-token 2",
    arch = "Qwen3MoeForCausalLM", used = 2, norm = 1, shared = 0, gguf_tol = 0 },
  -- (llama.cpp's llama stores q/k in Meta's pairs: the sums over head dimensions go in another order)
  { name = "Mixtral (top-2 of 8, always renormalised; pairs RoPE in GGUF)", like = "mixtral-8x7b", flags = "",
    arch = "MixtralForCausalLM", used = 2, norm = 1, shared = 0, gguf_tol = 1e-5 },
  { name = "Qwen2-MoE (shared expert with its gate, q/k/v biases, top-4 of 8 not renormalised)", like = "qwen1.5-moe-a2.7b",
    flags = "--experts-per-token 4", arch = "Qwen2MoeForCausalLM", used = 4, norm = 0, shared = 1, gguf_tol = 0 },
}

for _, c in ipairs(cases) do
  describe(c.name, function()
    it("runs the same from its Hugging Face directory, its GGUF and their slice stores, and as a pure-Lua reference", function()
      local dir = make(c.like, c.flags)
      local hf, f = run(dir .. "/hf")
      assert.are.same({ architecture = c.arch, n_experts = 8, used = c.used, norm = c.norm, shared = c.shared },
        { architecture = f.architecture, n_experts = f.n_experts, used = f.used, norm = f.norm, shared = f.shared })
      local g, gf = run(dir .. "/m.gguf")
      local s, sf = run(dir .. "/store")
      local gs, gsf = run(dir .. "/gstore")
      assert.are.same(hf, s) -- the store holds the directory's bytes: bit for bit
      assert.are.same(g, gs)
      local d, scale = max_diff(hf, g)
      assert.is_true(scale > 1, "logits too small to test anything")
      assert.is_true(d <= c.gguf_tol * scale, string.format("GGUF: max |diff| %.3g of max |logit| %.3g", d, scale))
      assert.are.same(f.tokens, sf.tokens)
      assert.are.same(f.tokens, gf.tokens)
      assert.are.same(f.tokens, gsf.tokens)
      -- position 0 against the reference, and the reference with the other renormalisation is
      -- far from it (the comparison sees the routing)
      local ref = reference.logits(dir .. "/hf", IDS[1])
      local other = reference.logits(dir .. "/hf", IDS[1], { norm_topk_prob = c.norm == 0 })
      local worst, apart = 0, 0
      for i = 0, 511 do
        worst = math.max(worst, math.abs(hf[i + 1] - ref[i]))
        apart = math.max(apart, math.abs(other[i] - ref[i]))
      end
      assert.is_true(worst < 1e-5 * scale, string.format("reference: max |diff| %.3g of max |logit| %.3g", worst, scale))
      assert.is_true(apart > 1e-2 * scale, string.format("the renormalisation changes the logits by %.3g only", apart))
    end)
  end)
end

describe("a BF16 Qwen2-MoE", function()
  it("runs the same from its GGUF, whose routers, norms and biases the converter widened to F32", function()
    local dir = T.tmpdir()
    local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth --like qwen1.5-moe-a2.7b %s --experts-per-token 2 %s/hf", T.loip,
      SHAPE:gsub("f32", "bf16"), dir))
    assert.are.equal(0, rc, err)
    to_gguf.convert(dir .. "/hf", dir .. "/m.gguf")
    local g = require("loip.model.gguf").open(dir .. "/m.gguf")
    assert.are.same({ "F32", "BF16", "F32" }, { g.tensors["blk.0.ffn_gate_inp.weight"].type,
      g.tensors["blk.0.ffn_up_exps.weight"].type, g.tensors["blk.0.ffn_gate_inp_shexp.weight"].type })
    g:close()
    local a, fa = run(dir .. "/hf")
    local b, fb = run(dir .. "/m.gguf")
    local d, scale = max_diff(a, b)
    assert.is_true(scale > 1 and d <= 1e-6 * scale, string.format("max |diff| %.3g of max |logit| %.3g", d, scale))
    assert.are.same(fa.tokens, fb.tokens)
  end)
end)

describe("a mixture of experts' slice store", function()
  it("keeps each expert in layer-LLL-exp-EEE.bin, the router and shared expert in the layer's MLP block", function()
    local dir = make("qwen1.5-moe-a2.7b", "--experts-per-token 2")
    local man = store.read_manifest(dir .. "/store")
    local files = store.expert_files(man, 2)
    assert.are.equal(8, #files)
    for e, f in ipairs(files) do
      assert.are.equal(store.expert_file(2, e - 1), f.name)
      assert.are.equal(string.format("layer-002-exp-%03d.bin", e - 1), f.name)
      assert.are.same({ 2, e - 1, "mlp" }, { f.layer, f.expert, f.block })
      local kinds = {}
      for i, t in ipairs(f.tensors) do
        kinds[i] = t.kind
        assert.are.equal(e - 1, t.expert)
        assert.are.equal(0, t.offset % 4096)
      end
      assert.are.same({ "expert_gate", "expert_up", "expert_down" }, kinds)
      assert.are.equal(string.format("model.layers.2.mlp.experts.%d.down_proj.weight", e - 1), f.tensors[3].name)
    end
    local mlp
    for _, f in ipairs(man.files) do if f.name == "layer-002-mlp.bin" then mlp = f end end
    local kinds = {}
    for i, t in ipairs(mlp.tensors) do kinds[i] = t.kind end
    assert.are.same({ "ffn_norm", "router", "gate", "up", "down", "shared_gate" }, kinds)
    assert.is_nil(mlp.expert)
    -- a store of the GGUF holds the same files, by the same names
    local gman = store.read_manifest(dir .. "/gstore")
    assert.are.equal(#man.files, #gman.files)
    for i, f in ipairs(man.files) do assert.are.same({ f.name, f.size }, { gman.files[i].name, gman.files[i].size }) end
  end)

  it("loads and binds only the experts store.open's opts.experts chooses", function()
    local exec = require "loip.runtime.exec"
    local dir = make("qwen3-30b-a3b", "--experts-per-token 2")
    local function bound(choose)
      local c, facts, bind = store.open(dir .. "/store", { experts = choose })
      local m = assert(exec.model_new(c))
      local keep = bind(m)
      local loaded = {}
      for _, f in ipairs(store.expert_files(facts.manifest, 1)) do loaded[#loaded + 1] = keep.base[f.name] ~= nil end
      local bytes = exec.model_weight_bytes(m)
      exec.model_free(m)
      store.close(keep)
      return bytes, loaded, store.expert_files(facts.manifest, 1)[1]
    end
    local all, every, f = bound(nil)
    local some, chosen = bound(function(l, e) return l ~= 1 or e < 4 end)
    assert.are.same({ true, true, true, true, true, true, true, true }, every)
    assert.are.same({ true, true, true, true, false, false, false, false }, chosen)
    assert.are.equal(all - 4 * (f.tensors[1].nbytes * 3), some)
    local ok, err = pcall(store.open, dir .. "/store", { experts = true })
    assert.is_false(ok)
    assert.matches("experts must be a function%(layer, expert%)", err)
  end)
end)

describe("loip synth's mixture-of-experts shapes", function()
  it("take --experts, --experts-per-token and --ffn (an expert's size); a dense shape refuses them", function()
    local dir = T.tmpdir()
    local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth --like olmoe-1b-7b --dtype f32 --layers 1 --dim 32 --heads 2 "
      .. "--kv-heads 2 --ffn 16 --experts 4 --experts-per-token 3 --vocab 300 %s/m", T.loip, dir))
    assert.are.equal(0, rc, err)
    local cfg = assert(json.load(dir .. "/m/config.json"))
    assert.are.same({ "Qwen3MoeForCausalLM", 4, 3, 16, false },
      { cfg.architectures[1], cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.norm_topk_prob })
    local m = loip.model.open(dir .. "/m", { threads = 1 })
    assert.are.same({ 4, 3, 16, 0 }, { m.cfg.n_experts, m.cfg.n_experts_used, m.cfg.expert_dim, m.cfg.norm_topk_prob })
    assert.matches("4 experts of 16 %(top 3%)", tostring(m))
    m:close()
    rc, _, err = T.run(string.format("%s synth --like llama-2-7b --experts 4 %s/d", T.loip, dir))
    assert.are_not.equal(0, rc)
    assert.matches("--experts is for a mixture of experts' shape; llama%-2%-7b is dense", err)
    rc, _, err = T.run(string.format("%s synth --like mixtral-8x7b --experts-per-token 9 --layers 1 --dim 32 --heads 2 --kv-heads 2 %s/x",
      T.loip, dir))
    assert.are_not.equal(0, rc)
    assert.matches("field 'num_experts_per_tok' is 9: must be 1..8 %(num_local_experts%)", err)
  end)

  it("are planned by loip plan --like with the same flags", function()
    local rc, out, err = T.run(string.format("%s plan --like qwen3-30b-a3b --experts 16 --experts-per-token 4 --layers 4 --devices 1 "
      .. "--device-profile jetson-agx-orin-32gb --json", T.loip))
    assert.are.equal(0, rc, err)
    assert.are.equal("qwen3-30b-a3b", json.decode(out).model)
  end)
end)
